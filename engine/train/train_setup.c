/*
 * engine/train/train_setup.c - a rank's trainer: data, planner, its model chunks, optimizer, and the
 * buffers of its pipeline schedule (see train.h).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/comm/runtime.h"
#include "engine/train/train.h"
#include "engine/train/train_memory.h"
#include "engine/train/train_stages.h"

static int init_chunk(Trainer *tr, int c, Error *err)
{
    const Config *cfg = tr->cfg;
    TrainChunk *ch = &tr->chunks[c];
    ModelParallel par = trainer_chunk_parallel(cfg, tr->lay.tp_rank, c * tr->pp + tr->lay.pp_rank, tr->comm);
    if (model_init(&ch->model, &cfg->model, tr->ops, &par, cfg->train.recompute, err) != 0)
        return -1;
    Model *m = &ch->model;
    m->sum_dt = cfg->parallel.reduce_dtype == REDUCE_COMPUTE ? DT_ACT : DT_F32;
    m->tp_chunks = tr->cost.tp_chunks; /* parallel.tp_chunks, auto resolved by the cost model */
    if (model_set_slots(m, trainer_slots_in_flight(tr->sched, tr->n_sched, c), err) != 0)
        return -1;
    /* The activations of the largest micro-batch the planner can make, now: a layout that does not
     * fit stops here, before the first step. */
    int64_t mb_tokens, rank_rows;
    plan_largest(&tr->planner, &mb_tokens, &rank_rows);
    for (int s = 0; s < m->n_slots; s++)
        if (model_reserve(m, s, rank_rows, mb_tokens, err) != 0)
            return -1;
    ch->slot_of = malloc((size_t)tr->m * sizeof *ch->slot_of);
    ch->slot_busy = calloc((size_t)m->n_slots, sizeof *ch->slot_busy);
    ch->send_h = calloc((size_t)m->n_slots, sizeof *ch->send_h);
    ch->send_dx = calloc((size_t)m->n_slots, sizeof *ch->send_dx);
    int buckets = trainer_bucket_count(m);
    ch->grad_req = calloc((size_t)buckets, sizeof *ch->grad_req);
    ch->bucket_started = calloc((size_t)buckets, sizeof *ch->bucket_started);
    ch->param_req = calloc((size_t)buckets, sizeof *ch->param_req);
    ch->param_pending = calloc((size_t)buckets, sizeof *ch->param_pending);
    m->weights_needed = trainer_weights_needed;
    m->weights_needed_ctx = tr;
    if (!ch->slot_of || !ch->slot_busy || !ch->send_h || !ch->send_dx || !ch->grad_req || !ch->bucket_started ||
        !ch->param_req || !ch->param_pending)
        return error_runtime(err, "train", "out of memory");
    for (int k = 0; k < tr->m; k++)
        ch->slot_of[k] = -1;
    if (cfg->train.init_from) {
        if (model_load(m, cfg->train.init_from, err) != 0)
            return -1;
    } else if (model_init_weights(m, (uint64_t)cfg->train.seed, err) != 0) {
        return -1;
    }
    if (tr->eval_only)
        return 0;
    int64_t begin, end;
    trainer_optim_range(tr, m, &begin, &end);
    if (cfg->parallel.zero && !(ch->shard_grads = m->ops->alloc((size_t)(end - begin + 1) * sizeof(float))))
        return error_runtime(err, "train", "out of memory");
    const ModelDims *d = &m->dims;
    if (d->kv_replicas > 1 &&
        !(ch->kv_scratch = m->ops->alloc((size_t)(2 * (int64_t)d->n_kv_heads * d->head_dim * d->d) * sizeof(float))))
        return error_runtime(err, "train", "out of memory");
    return optim_init(&ch->optim, &cfg->train, m, begin, end, err);
}

/* The backend of train.device (backends.c has the table of those this build knows). */
const Ops *trainer_open_backend(const Config *cfg, int local_rank, const Backend **backend, Error *err)
{
    const char *name = cfg->train.device == DEVICE_CUDA ? "cuda" : "cpu";
    const Backend *b = backend_find(name);
    if (!b) {
        error_set(err, "train.device", "no backend %s in this build", name);
        return NULL;
    }
    BackendOpen opt = {local_rank, cfg->train.precision == PRECISION_BF16, cfg->train.deterministic};
    const Ops *ops = b->open(&opt, err);
    if (ops)
        *backend = b;
    return ops;
}

static int open_backend(Trainer *tr, Error *err)
{
    RuntimeLaunch launch = runtime_launch_from_env();
    const Backend *b = NULL;
    if (!(tr->ops = trainer_open_backend(tr->cfg, launch.local_rank, &b, err)))
        return -1;
    tr->backend = b;
    if (b->share_node)
        b->share_node(tr->comm->node_ranks);
    return 0;
}

/* parallel.comm: mpi (host-staged on a GPU), or nccl; auto is nccl when every rank of this machine
 * has a GPU of its own (NCCL cannot put two ranks of one communicator on one GPU). */
static int choose_comm(Trainer *tr, Error *err)
{
    const ConfigParallel *p = &tr->cfg->parallel;
    if (tr->cfg->train.device != DEVICE_CUDA || p->comm == COMM_MPI)
        return 0;
    const CommImpl *nccl = backend_comm("nccl");
    if (!nccl)
        return p->comm == COMM_AUTO ? 0 : error_set(err, "parallel.comm", "nccl needs the CUDA backend, which this "
                                                     "wlbtrain was built without");
    int gpus = tr->backend->device_count(), ranks = tr->comm->node_ranks;
    if (p->comm == COMM_AUTO && ranks > gpus)
        return 0;
    if (ranks > gpus)
        return error_set(err, "parallel.comm", "nccl cannot put two ranks on one GPU (%d ranks on this machine, %d "
                         "GPU(s)); use parallel.comm: mpi", ranks, gpus);
    if (p->virtual_stages > 1) {
        if (p->comm == COMM_AUTO)
            return 0;
        return error_set(err, "parallel.comm", "nccl carries the pipeline's messages in order, which interleaved "
                         "stages do not keep; use parallel.comm: mpi with parallel.virtual_stages > 1");
    }
    return comm_use(tr->comm, nccl, err);
}

int trainer_check_data(const Config *cfg, Error *err)
{
    if (cfg->data.path.n == 0)
        return error_set(err, "data.path", "training reads tokens: set data.path (a Megatron PREFIX)");
    return 0;
}

static int check_layout(const Trainer *tr, Error *err)
{
    const ConfigParallel *p = &tr->cfg->parallel;
    if (trainer_check_data(tr->cfg, err) != 0)
        return -1;
    if (p->virtual_stages > 1 && p->pp == 1)
        return error_set(err, "parallel.virtual_stages", "interleaving splits pipeline stages: it needs parallel.pp "
                         "> 1 (got virtual_stages %lld with pp 1)", (long long)p->virtual_stages);
    if (p->virtual_stages > 1 && tr->m % tr->pp)
        return error_set(err, "parallel.virtual_stages", "interleaved 1F1B takes micro-batches in groups of pp: the "
                         "%d micro-batches per replica must be a multiple of parallel.pp = %d", tr->m, tr->pp);
    if (tr->comm->size[GROUP_WORLD] > 4096)
        return error_set(err, "parallel", "the CPU engine runs at most 4096 ranks");
    int64_t tags = (int64_t)tr->m * tr->n_chunks * 2;
    if (tr->comm->mpi && tags - 1 > tr->comm->tag_limit)
        return error_set(err, "data.global_batch_tokens", "%d micro-batches x %d chunks need %lld message tags, "
                         "MPI allows %d", tr->m, tr->n_chunks, (long long)tags, tr->comm->tag_limit);
    return 0;
}

/* Every rank placed the layers itself (parallel.stage_layers: auto reads the data, the cost model
 * and the memory budget on each); they must agree, or the stages would not fit together. */
static int check_split(const Trainer *tr, Error *err)
{
    const ConfigIntList *split = &tr->cfg->parallel.chunk_layers;
    uint32_t h = 2166136261u; /* FNV-1a over the counts */
    for (int g = 0; g < split->n; g++)
        h = (h ^ (uint32_t)split->v[g]) * 16777619u;
    double d[2] = {(double)h, -(double)h};
    if (comm_allreduce_max_f64(tr->comm, GROUP_WORLD, d, 2, err) != 0)
        return -1;
    if (d[0] != -d[1])
        return error_runtime(err, "parallel.stage_layers", "the ranks split the layers differently (digests %08x .. "
                             "%08x); with auto every rank must read the same data, calibration file and memory budget",
                             (unsigned)-d[1], (unsigned)d[0]);
    return 0;
}

static int setup(Trainer *tr, const Config *cfg, Comm *comm, int eval_only, Error *err)
{
    memset(tr, 0, sizeof *tr);
    tr->eval_only = eval_only;
    tr->cfg = cfg;
    tr->comm = comm;
    tr->lay = comm->layout;
    tr->pp = (int)cfg->parallel.pp;
    tr->v = (int)cfg->parallel.virtual_stages;
    tr->n_chunks = tr->pp * tr->v;
    tr->m = (int)config_micro_batches(cfg);
    if (check_layout(tr, err) != 0 || check_split(tr, err) != 0 || open_backend(tr, err) != 0)
        return -1;
    const char *stage = getenv("WLBTRAIN_COMM_STAGE");
    comm_set_backend(comm, tr->ops, stage && !strcmp(stage, "1"));
    comm_set_overlap(comm, cfg->parallel.overlap);
    if (choose_comm(tr, err) != 0)
        return -1;
    const ConfigData *d = &cfg->data;
    if (cost_model_init(&tr->cost, cfg, err) != 0 ||
        data_sources_open(&tr->data, d->path.v, d->weights.n ? d->weights.v : NULL, d->path.n, NULL, NULL, err) != 0)
        return -1;
    /* The training stream skips the documents data.valid_fraction holds out. */
    if (data_stream_init(&tr->stream, tr->data.src, tr->data.weights, tr->data.n, (uint64_t)d->seed,
                         (uint64_t)d->context_window, err) != 0 ||
        data_stream_set_split(&tr->stream, DATA_SPLIT_TRAIN, d->valid_fraction, err) != 0 ||
        plan_init(&tr->planner, cfg, &tr->cost, &tr->stream, cfg->balance.packer, cfg->balance.cp_sharding, err) != 0 ||
        trainer_valid_init(tr, err) != 0)
        return -1;
    int world = comm->size[GROUP_WORLD];
    tr->sched = malloc((size_t)2 * tr->m * tr->v * sizeof *tr->sched);
    tr->chunks = calloc((size_t)tr->v, sizeof *tr->chunks);
    tr->batches = calloc((size_t)tr->m, sizeof *tr->batches);
    tr->inputs = calloc((size_t)tr->m, sizeof *tr->inputs);
    tr->mb_index = malloc((size_t)tr->m * sizeof *tr->mb_index);
    tr->mb_compute = calloc((size_t)tr->m, sizeof *tr->mb_compute);
    tr->all_compute = calloc((size_t)tr->m * world, sizeof *tr->all_compute);
    tr->pass_timed = calloc((size_t)2 * tr->m * tr->v, sizeof *tr->pass_timed);
    tr->pass_comm = calloc((size_t)2 * tr->m * tr->v, sizeof *tr->pass_comm);
    tr->mb_s_measured = calloc((size_t)tr->m, sizeof *tr->mb_s_measured);
    tr->mb_s_predicted = calloc((size_t)tr->m, sizeof *tr->mb_s_predicted);
    if (!tr->sched || !tr->chunks || !tr->batches || !tr->inputs || !tr->mb_index || !tr->mb_compute ||
        !tr->all_compute || !tr->pass_timed || !tr->pass_comm || !tr->mb_s_measured || !tr->mb_s_predicted)
        return error_runtime(err, "train", "out of memory");
    tr->n_sched = sched_stage_ops(tr->lay.pp_rank, tr->pp, tr->v, tr->m, tr->sched);
    for (int k = 0; k < tr->m; k++)
        tr->batches[k].ops = tr->ops;
    for (int c = 0; c < tr->v; c++)
        if (init_chunk(tr, c, err) != 0)
            return -1;
    /* A stage's input (or its output's gradient) for the largest micro-batch. */
    int64_t mb_tokens, rank_rows;
    plan_largest(&tr->planner, &mb_tokens, &rank_rows);
    int64_t rows = model_rows(&tr->chunks[0].model.dims, rank_rows);
    if (tr->n_chunks > 1 && trainer_reserve_recv(tr, rows * cfg->model.d_model, err) != 0)
        return -1;
    return 0;
}

int trainer_init(Trainer *tr, const Config *cfg, Comm *comm, Error *err)
{
    return setup(tr, cfg, comm, 0, err);
}

int trainer_init_eval(Trainer *tr, const Config *cfg, Comm *comm, Error *err)
{
    return setup(tr, cfg, comm, 1, err);
}

void trainer_free(Trainer *tr)
{
    for (int c = 0; tr->chunks && c < tr->v; c++) {
        TrainChunk *ch = &tr->chunks[c];
        optim_free(&ch->optim, &ch->model);
        if (ch->model.ops) {
            ch->model.ops->free(ch->shard_grads);
            ch->model.ops->free(ch->kv_scratch);
        }
        model_free(&ch->model);
        free(ch->slot_of);
        free(ch->slot_busy);
        free(ch->send_h);
        free(ch->send_dx);
        free(ch->grad_req);
        free(ch->bucket_started);
        free(ch->param_req);
        free(ch->param_pending);
    }
    for (int k = 0; tr->batches && k < tr->m; k++)
        batch_free(&tr->batches[k]);
    free(tr->chunks);
    free(tr->batches);
    free(tr->inputs);
    free(tr->mb_index);
    free(tr->mb_compute);
    free(tr->all_compute);
    free(tr->pass_timed);
    free(tr->pass_comm);
    free(tr->mb_s_measured);
    free(tr->mb_s_predicted);
    free(tr->sched);
    if (tr->ops) {
        tr->ops->free(tr->recv);
        tr->ops->free(tr->recv_ahead[0]);
        tr->ops->free(tr->recv_ahead[1]);
    }
    const Backend *backend = tr->backend;
    trainer_valid_free(tr);
    plan_free(&tr->plan);
    plan_destroy(&tr->planner);
    data_stream_free(&tr->stream);
    data_sources_close(&tr->data);
    memset(tr, 0, sizeof *tr);
    if (backend && backend->close)
        backend->close();
}
