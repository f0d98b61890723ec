/*
 * engine/train/train_memory.c - the memory model (see train_memory.h).
 *
 * For the rank of pipeline stage s (its v model chunks g = k pp + s, each with its own layers under
 * the split, parallel.chunk_layers), in bytes, with n_g the chunk's parameters on this rank (its TP
 * block), e the compute dtype's size (2 for bf16, 4 for
 * float32) and Z the ranks of DP x CP:
 *   weights      4 n_g                  float32 master weights
 *   weights_act  e n_g                  the copy the products read (none when e = 4: it aliases)
 *   grads        4 n_g
 *   optimizer    8 n_g, or with ZeRO-1  8 ceil(n_g / Z) + 4 (ceil(n_g / Z) + 1)  (moments + grad shard)
 *   activations  slots_g x slot(T, T_mb) + scratch(T, T_mb)   (model_memory, for the largest
 *                micro-batch: T rows on this CP rank, T_mb in the micro-batch; slots_g = the most
 *                micro-batches the schedule of stage s has in flight on chunk g)
 *   other        the stage input received (R d floats, when there is more than one chunk; R = T, or
 *                ceil(T / tp) with sequence parallelism; 3 R d with the receives posted ahead), the batch
 *                inputs of the replica's M micro-batches (tokens, targets, positions, and with CP
 *                the row indices of the K/V exchange), the largest transient buffer of a step (the
 *                tied embedding's gradient exchange, the kv replicas' gradient sum; a checkpoint
 *                allocates no device memory: each rank streams its own shards through a host
 *                buffer), cuDNN's attention buffers where it may run, and on a GPU the runtime
 *                allowance.
 * cuDNN's attention (train.attention: cudnn, or auto with train.deterministic false: it may be
 * chosen): what the CUDA backend reserves for it at setup, held beside the rest, one set for all the
 * chunks, for calls over the most query or key rows of a micro-batch at the rank's heads
 * (engine/ops.h's ops_cudnn_buffers: the backward's bf16 gradients and an estimate of cuDNN's
 * workspace).
 * The sums run over the rank's chunks. TP ranks of a stage hold equal blocks, CP ranks of a stage
 * equal activation slots (sized for the largest share a CP rank can get), DP ranks the same: the
 * stage's rank stands for all of them.
 */
#include "engine/train/train_memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/ops.h"
#include "engine/plan/cost.h"
#include "engine/plan/plan.h"
#include "engine/plan/sched.h"

/* Most micro-batches chunk k (local) holds activations for at once over a stage's passes. */
int trainer_slots_in_flight(const SchedOp *ops, int n, int k)
{
    int now = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i].chunk != k)
            continue;
        now += ops[i].backward ? -1 : 1;
        most = now > most ? now : most;
    }
    return most > 0 ? most : 1;
}

/* The largest micro-batch and one CP rank's rows of it, as the trainer reserves them. */
static void largest_micro_batch(const Config *cfg, int64_t *mb_tokens, int64_t *rank_rows)
{
    Planner pl;
    Error ignored = {0};
    /* plan_init only reads the config here: no cost model, no stream. */
    if (plan_init(&pl, cfg, NULL, NULL, cfg->balance.packer, cfg->balance.cp_sharding, &ignored) != 0) {
        *mb_tokens = *rank_rows = cfg->data.context_window;
        return;
    }
    plan_largest(&pl, mb_tokens, rank_rows);
    plan_destroy(&pl);
}

/* NCCL's buffers on one rank (parallel.comm: nccl, or auto on GPUs), from NCCL's default sizes and the
 * communicators' config (cuda_nccl.cu): a connection's receive side holds a buffer per protocol -
 * Simple NCCL_BUFFSIZE 4 MiB, LL128 4.7 MiB (120 elements x 640 threads x 8 steps x 8 bytes), LL
 * 0.5 MiB (8 lines x 512 threads x 8 steps x 16 bytes) - and a collective runs on at most maxCTAs = 16
 * channels, each with a ring connection (and a tree one for an all-reduce). Counted for the groups
 * whose collectives go through NCCL when they have several ranks: TP (its sums and gathers), CP and
 * the CP blocks of balance.cp_sharding: groups (the K/V exchange), DP x CP (the gradients: an
 * all-reduce, rings and trees; with ZeRO-1 reduces and broadcasts, rings). The pipeline's lanes and the
 * tied embeddings' exchange are messages: 2 channels of a 4 MiB Simple buffer per peer (NCCL's
 * NCCL_NCHANNELS_PER_NET_PEER). NCCL takes a buffer at the first operation that needs it, in the
 * middle of a step: counted up front, as an upper bound. */
static double nccl_buffer_bytes(const Config *cfg)
{
    const ConfigParallel *p = &cfg->parallel;
    const double mib = 1024.0 * 1024.0, ring = 16 * (4.0 + 4.6875 + 0.5) * mib;
    double bytes = (p->tp > 1 ? ring : 0) + (p->cp > 1 ? ring : 0);
    if (p->dp * p->cp > 1)
        bytes += p->zero ? ring : 2 * ring;
    if (cfg->balance.cp_sharding == CP_GROUPS)
        for (int64_t b = 2; b < p->cp; b *= 2)
            bytes += ring;
    /* Message peers: the next and previous stage on each lane (the ends too when interleaved), and
     * the tied embeddings' pair. */
    int peers = p->pp > 1 ? 2 + (cfg->model.tie_embeddings ? 1 : 0) : 0;
    return bytes + peers * 2 * 4.0 * mib;
}

static int stage_memory(const Config *cfg, const int64_t *chunk_layers, int s, const SchedOp *sched, int n_sched,
                        int64_t T, int64_t T_mb, DryRunMemory *out, Error *err)
{
    const ConfigParallel *p = &cfg->parallel;
    int pp = (int)p->pp, v = (int)p->virtual_stages, chunks = pp * v;
    int gpu = cfg->train.device == DEVICE_CUDA;
    size_t e = cfg->train.precision == PRECISION_BF16 ? 2 : 4;
    int64_t logits = cfg->train.logits_block > 0 ? cfg->train.logits_block
                     : gpu                       ? OPS_LOGITS_FLOATS_GPU
                                                 : OPS_LOGITS_FLOATS_CPU;
    int64_t z = p->dp * p->cp, m = config_micro_batches(cfg);
    int64_t mb = p->cp > 1 ? T_mb : 0;
    double transient = 0, cudnn_bytes = 0;
    int64_t rows = T; /* of the stream on a TP rank: T / tp with sequence parallelism */
    memset(out, 0, sizeof *out);
    for (int k = 0; k < v; k++) {
        int g = k * pp + s, begin = 0;
        for (int i = 0; i < g; i++)
            begin += (int)chunk_layers[i];
        WLB_ASSERT(chunk_layers[g] >= 1 && begin + chunk_layers[g] <= cfg->model.n_layers);
        ModelParallel par = {(int)p->tp, 0, (int)p->cp, g, chunks, begin, begin + (int)chunk_layers[g], NULL,
                             p->sequence_parallel};
        ModelDims d;
        model_dims(&d, &cfg->model, &par);
        rows = model_rows(&d, T);
        int64_t n = model_param_count(&cfg->model, &par);
        if (n < 0)
            return error_runtime(err, "memory model", "out of memory");
        out->weights += 4.0 * (double)n;
        out->weights_act += e == 4 ? 0 : (double)e * (double)n;
        out->grads += 4.0 * (double)n;
        if (p->zero) {
            double shard = ceil((double)n / (double)z);
            out->optimizer += 8 * shard + 4 * (shard + 1);
        } else {
            out->optimizer += 8.0 * (double)n;
        }
        int slots = trainer_slots_in_flight(sched, n_sched, k);
        ModelMemory mm = model_memory(&d, T, mb, cfg->train.recompute, e, logits);
        out->activations += (double)slots * (double)mm.slot_bytes + (double)mm.scratch_bytes;
        out->slots += slots;
        out->other += 4.0 * (d.head_dim / 2); /* RoPE frequencies */
        /* The tied embeddings' exchange buffer (train_setup.c), on the chunks that hold a copy. */
        int64_t embed = (int64_t)d.local_vocab * d.d;
        if (d.tied && chunks > 1 && (d.has_embed || d.has_head))
            out->other += 4.0 * (double)embed;
        /* Transient buffers, the largest of which is added once. */
        if (d.kv_replicas > 1)
            transient = fmax(transient, 4.0 * (double)(d.layer_end - d.layer_begin) * 2 * d.n_kv_heads * d.head_dim *
                                            d.d);
        int cudnn = cfg->train.attention == ATTENTION_CUDNN ||
                    (cfg->train.attention == ATTENTION_AUTO && !cfg->train.deterministic);
        if (gpu && e == 2 && cudnn && (d.head_dim == 64 || d.head_dim == 128)) {
            int64_t grads, workspace;
            ops_cudnn_buffers(T > T_mb ? T : T_mb, d.local_heads, d.local_kv_heads, d.head_dim, cfg->train.deterministic,
                              &grads, &workspace);
            cudnn_bytes = fmax(cudnn_bytes, (double)(grads + workspace)); /* one set, shared by the chunks */
        }
    }
    int64_t d_model = cfg->model.d_model;
    /* parallel.reduce_dtype: compute in bf16: the bfloat16 sums' buffers, to send and to receive, as
     * large as the largest sum (train_setup.c: a TP sum of the stage's rows, or CP's K/V gradients). */
    if (p->reduce_dtype == REDUCE_COMPUTE && e == 2) {
        ModelDims d0;
        ModelParallel par0 = {(int)p->tp, 0, (int)p->cp, 0, chunks, 0, 1, NULL, p->sequence_parallel};
        model_dims(&d0, &cfg->model, &par0);
        out->other += 2 * 2.0 * (double)model_largest_sum(&d0, T, T_mb);
    }
    /* With parallel.overlap the next passes' receives are posted ahead into two more buffers of the
     * same size (train_pipeline.c), on either path. */
    int ahead = p->overlap ? 2 : 0;
    if (chunks > 1)
        out->other += (1.0 + ahead) * 4.0 * (double)rows * (double)d_model;
    /* Batch inputs: 3 int32 per row, and with CP the int64 row indices (own rows, sent rows,
     * received rows). */
    double per_batch = 12.0 * (double)(T > 0 ? T : 1) + (p->cp > 1 ? 8.0 * (double)(2 * T + T_mb + 1) : 0);
    out->other += (double)m * per_batch + transient + cudnn_bytes;
    if (gpu)
        out->other += TRAINER_GPU_RUNTIME_BYTES + (p->comm != COMM_MPI ? nccl_buffer_bytes(cfg) : 0);
    out->peak = out->weights + out->weights_act + out->grads + out->optimizer + out->activations + out->other;
    return 0;
}

int trainer_micro_batches(const Config *cfg, int64_t *m, Error *err)
{
    const ConfigParallel *p = &cfg->parallel;
    *m = config_micro_batches(cfg);
    if (p->dp <= 0 || *m <= 0)
        return error_set(err, "parallel.dp", "the memory model needs a number for dp (auto is resolved by a launch)");
    if (p->virtual_stages > 1 && *m % p->pp)
        return error_set(err, "parallel.virtual_stages", "interleaved 1F1B needs the micro-batches per replica "
                         "(%lld) to be a multiple of parallel.pp (%lld)", (long long)*m, (long long)p->pp);
    return 0;
}

int trainer_stage_memory(const Config *cfg, const int64_t *chunk_layers, int s, DryRunMemory *out, Error *err)
{
    int64_t m, mb_tokens, rank_rows;
    int v = (int)cfg->parallel.virtual_stages;
    if (trainer_micro_batches(cfg, &m, err) != 0)
        return -1;
    largest_micro_batch(cfg, &mb_tokens, &rank_rows);
    SchedOp *sched = malloc((size_t)2 * (size_t)m * (size_t)v * sizeof *sched);
    if (!sched)
        return error_runtime(err, "memory model", "out of memory");
    int n = sched_stage_ops(s, (int)cfg->parallel.pp, v, (int)m, sched);
    int rc = stage_memory(cfg, chunk_layers, s, sched, n, rank_rows, mb_tokens, out, err);
    free(sched);
    return rc;
}

int trainer_memory_plan(const Config *cfg, DryRunMemoryPlan *out, Error *err)
{
    memset(out, 0, sizeof *out);
    const ConfigParallel *p = &cfg->parallel;
    int pp = (int)p->pp, v = (int)p->virtual_stages;
    int64_t m;
    if (trainer_micro_batches(cfg, &m, err) != 0)
        return -1;
    WLB_ASSERT(p->chunk_layers.n == pp * v); /* the split is resolved (auto: trainer_stage_layers) */
    largest_micro_batch(cfg, &out->mb_tokens, &out->rank_rows);
    out->budget = trainer_memory_budget(cfg);
    out->n_stages = pp;
    out->stages = calloc((size_t)pp, sizeof *out->stages);
    SchedOp *sched = malloc((size_t)2 * (size_t)m * (size_t)v * sizeof *sched);
    if (!out->stages || !sched) {
        free(sched);
        trainer_memory_free(out);
        return error_runtime(err, "memory model", "out of memory");
    }
    int rc = 0;
    for (int s = 0; s < pp && rc == 0; s++) {
        int n = sched_stage_ops(s, pp, v, (int)m, sched);
        rc = stage_memory(cfg, p->chunk_layers.v, s, sched, n, out->rank_rows, out->mb_tokens, &out->stages[s], err);
        if (rc == 0 && out->stages[s].peak > out->stages[out->worst].peak)
            out->worst = s;
    }
    free(sched);
    if (rc != 0)
        trainer_memory_free(out);
    return rc;
}

void trainer_memory_free(DryRunMemoryPlan *mp)
{
    free(mp->stages);
    memset(mp, 0, sizeof *mp);
}

double trainer_memory_budget(const Config *cfg)
{
    if (cfg->train.gpu_memory_gb > 0)
        return cfg->train.gpu_memory_gb * 1e9;
    return cost_hardware_profile(cfg->balance.hardware)->memory_gb * 1e9;
}

/* The worst rank's peak under cfg with one change, or -1 when the change does not apply. */
static double peak_with(const Config *cfg)
{
    DryRunMemoryPlan mp;
    Error ignored = {0};
    if (trainer_memory_plan(cfg, &mp, &ignored) != 0)
        return -1;
    double peak = mp.stages[mp.worst].peak;
    trainer_memory_free(&mp);
    return peak;
}

static int divides_model(const ConfigModel *c, int64_t tp)
{
    return c->n_heads % tp == 0 && c->d_ffn % tp == 0 && c->vocab_size % tp == 0 &&
           (c->n_kv_heads % tp == 0 || tp % c->n_kv_heads == 0);
}

/* Appends "KEY: VALUE (P GB)" to buf when the changed config fits the budget. */
static void suggest(char *buf, size_t size, const Config *alt, double budget, const char *change)
{
    double peak = peak_with(alt);
    if (peak < 0 || peak > budget)
        return;
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%s (%.1f GB)", len ? ", " : "", change, peak / 1e9);
}

int trainer_memory_check(const Config *cfg, const DryRunMemoryPlan *mp, Error *err)
{
    double budget = mp->budget;
    const DryRunMemory *w = &mp->stages[mp->worst];
    if (budget <= 0 || w->peak <= budget)
        return 0;
    char fits[768] = "", change[96];
    for (int r = cfg->train.recompute + 1; r <= RECOMPUTE_FULL; r++) {
        Config alt = *cfg;
        alt.train.recompute = (Recompute)r;
        snprintf(change, sizeof change, "train.recompute: %s", config_recompute_name(r));
        suggest(fits, sizeof fits, &alt, budget, change);
    }
    if (!cfg->parallel.sequence_parallel && cfg->parallel.tp > 1) {
        Config alt = *cfg;
        alt.parallel.sequence_parallel = true;
        suggest(fits, sizeof fits, &alt, budget, "parallel.sequence_parallel: true");
    }
    if (!cfg->parallel.zero && cfg->parallel.dp * cfg->parallel.cp > 1) {
        Config alt = *cfg;
        alt.parallel.zero = 1;
        suggest(fits, sizeof fits, &alt, budget, "parallel.zero: 1");
    }
    if (cfg->balance.packer == PACKER_WLB) {
        Config alt = *cfg;
        alt.balance.max_tokens_per_micro_batch = cfg->balance.max_tokens_per_micro_batch / 2;
        snprintf(change, sizeof change, "balance.max_tokens_per_micro_batch: %lld",
                 (long long)alt.balance.max_tokens_per_micro_batch);
        if (alt.balance.max_tokens_per_micro_batch >= cfg->data.context_window)
            suggest(fits, sizeof fits, &alt, budget, change);
    }
    if (divides_model(&cfg->model, 2 * cfg->parallel.tp)) {
        Config alt = *cfg;
        alt.parallel.tp *= 2;
        snprintf(change, sizeof change, "parallel.tp: %lld", (long long)alt.parallel.tp);
        suggest(fits, sizeof fits, &alt, budget, change);
    }
    /* Twice the stages, with the layers split evenly over them (a list of counts is the user's to
     * write again). */
    int chunks = (int)(2 * cfg->parallel.pp * cfg->parallel.virtual_stages);
    int64_t *even = cfg->parallel.stage_layers.choice != STAGE_LAYERS_LIST && chunks <= cfg->model.n_layers
                        ? malloc((size_t)chunks * sizeof *even) : NULL;
    if (even) {
        Config alt = *cfg;
        alt.parallel.pp *= 2;
        config_even_layers(cfg->model.n_layers, chunks, even);
        alt.parallel.chunk_layers = (ConfigIntList){chunks, even};
        snprintf(change, sizeof change, "parallel.pp: %lld", (long long)alt.parallel.pp);
        suggest(fits, sizeof fits, &alt, budget, change);
        free(even);
    }
    {
        Config alt = *cfg;
        alt.parallel.cp *= 2;
        snprintf(change, sizeof change, "parallel.cp: %lld", (long long)alt.parallel.cp);
        suggest(fits, sizeof fits, &alt, budget, change);
    }
    int64_t layers = 0;
    for (int g = mp->worst; g < cfg->parallel.chunk_layers.n; g += mp->n_stages)
        layers += cfg->parallel.chunk_layers.v[g];
    return error_set(err, "train.gpu_memory_gb", "the layout needs %.1f GB on a rank of pipeline stage %d (%lld "
                     "layers; weights "
                     "%.1f, their bf16 copy %.1f, gradients %.1f, optimizer %.1f, activations %.1f for %d "
                     "micro-batches of up to %lld tokens in flight, other %.1f), %.1f GB more than the %.1f GB "
                     "budget; %s%s",
                     w->peak / 1e9, mp->worst, (long long)layers, w->weights / 1e9, w->weights_act / 1e9, w->grads / 1e9,
                     w->optimizer / 1e9, w->activations / 1e9, w->slots, (long long)mp->mb_tokens, w->other / 1e9,
                     (w->peak - budget) / 1e9, budget / 1e9,
                     fits[0] ? "each of these alone would fit: " : "no single change of train.recompute, "
                     "parallel.sequence_parallel, parallel.zero, balance.max_tokens_per_micro_batch or twice parallel.tp, "
                     "pp or cp fits; combine them or use more GPUs",
                     fits);
}

int trainer_memory_admit(const Config *cfg, double *predicted, Error *err)
{
    DryRunMemoryPlan mp;
    if (trainer_memory_plan(cfg, &mp, err) != 0)
        return -1;
    *predicted = mp.stages[mp.worst].peak;
    int check = cfg->train.device == DEVICE_CUDA || cfg->train.gpu_memory_gb > 0;
    int rc = check ? trainer_memory_check(cfg, &mp, err) : 0;
    trainer_memory_free(&mp);
    return rc;
}
