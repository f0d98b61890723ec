/*
 * engine/train/train_setup.c - a rank's trainer: data, planner, its model chunks, optimizer, and the
 * buffers of its pipeline schedule (see train.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    if (cfg->train.logits_block > 0)
        m->logits_floats = cfg->train.logits_block;
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
    /* Tied embeddings on two stages: room for the other stage's copy of the gradient. */
    int holds_copy = (c == 0 && tr->lay.pp_rank == 0) || (c == tr->v - 1 && tr->lay.pp_rank == tr->pp - 1);
    if (cfg->model.tie_embeddings && tr->n_chunks > 1 && holds_copy) {
        const ModelTensor *t = model_tensor(m, T_EMBED, -1);
        if (!(ch->tied_scratch = m->ops->alloc((size_t)(t->rows * t->cols) * sizeof(float))))
            return error_runtime(err, "train", "out of memory");
    }
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
    BackendOpen opt = {local_rank, cfg->train.precision == PRECISION_BF16, cfg->train.deterministic,
                       (BackendAttention)cfg->train.attention};
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

/* The first two ranks of the job that share a device on one machine (*a < *b), or *a = -1: each
 * rank's machine (a hash of its host name) and device (Backend.device_id), gathered over the world,
 * so that every rank decides the same from the same list. */
static int shared_device(Trainer *tr, int *a, int *b, int64_t *device, Error *err)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        return error_runtime(err, "parallel.comm", "gethostname: %s", strerror(errno));
    uint64_t h = 1469598103934665603ull; /* FNV-1a, cut to 52 bits: exact in a double */
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int n = tr->comm->size[GROUP_WORLD];
    double mine[2] = {(double)(h & ((1ull << 52) - 1)), (double)tr->backend->device_id()};
    double *all = malloc((size_t)n * sizeof mine);
    if (!all)
        return error_runtime(err, "train", "out of memory");
    int rc = comm_allgather_f64(tr->comm, GROUP_WORLD, mine, all, 2, err);
    if (rc == 0)
        *device = trainer_shared_device(all, n, a, b);
    free(all);
    return rc;
}

int64_t trainer_shared_device(const double *ranks, int n, int *a, int *b)
{
    *a = *b = -1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (ranks[2 * i] == ranks[2 * j] && ranks[2 * i + 1] >= 0 && ranks[2 * i + 1] == ranks[2 * j + 1]) {
                *a = i;
                *b = j;
                return (int64_t)ranks[2 * i + 1];
            }
    return -1;
}

/* parallel.comm: mpi (host-staged on a GPU), or nccl; auto is nccl unless two ranks of the job share
 * a GPU (NCCL cannot put two ranks of one communicator on one GPU). The GPUs are compared by their
 * PCI place, as NCCL's own check does: with one GPU visible per rank (srun --gpus-per-task=1, or
 * CUDA_VISIBLE_DEVICES per rank) every rank sees device 0, yet each has a GPU of its own. Every rank
 * takes the same decision (shared_device's list is the world's), so no two machines issue different
 * collectives. WLB_TEST_NCCL_SHARED_GPU=1 (tests only) takes NCCL between ranks of one GPU anyway,
 * over sockets on the loopback (cuda_nccl.cu); a real job never gets there by itself. */
static int choose_comm(Trainer *tr, Error *err)
{
    const ConfigParallel *p = &tr->cfg->parallel;
    if (tr->cfg->train.device != DEVICE_CUDA || p->comm == COMM_MPI)
        return 0;
    const CommImpl *nccl = backend_comm("nccl");
    if (!nccl)
        return p->comm == COMM_AUTO ? 0 : error_set(err, "parallel.comm", "nccl needs the CUDA backend, which this "
                                                     "wlbtrain was built without");
    int a, b;
    int64_t dev = 0;
    if (shared_device(tr, &a, &b, &dev, err) != 0)
        return -1;
    const char *test = getenv("WLB_TEST_NCCL_SHARED_GPU");
    int test_mode = test && !strcmp(test, "1");
    char where[64];
    snprintf(where, sizeof where, "%04llx:%02llx:%02llx.0", (unsigned long long)(dev >> 16),
             (unsigned long long)(dev >> 8 & 0xff), (unsigned long long)(dev & 0xff));
    if (a >= 0 && !test_mode) {
        if (p->comm == COMM_NCCL)
            return error_set(err, "parallel.comm", "nccl needs a GPU per rank, but ranks %d and %d share the GPU at "
                             "PCI %s of one machine; launch one rank per GPU, or set parallel.comm: mpi", a, b, where);
        if (tr->comm->rank[GROUP_WORLD] == 0)
            fprintf(stderr, "wlbtrain: warning: parallel.comm: auto chose mpi, because ranks %d and %d share the GPU at "
                    "PCI %s of one machine: every collective and message goes through host memory (slow); launch one "
                    "rank per GPU for NCCL\n", a, b, where);
        return 0;
    }
    if (a >= 0 && tr->comm->rank[GROUP_WORLD] == 0)
        fprintf(stderr, "wlbtrain: note: WLB_TEST_NCCL_SHARED_GPU=1: NCCL between ranks that share a GPU, over "
                "sockets on the loopback (a test mode, never for a real job)\n");
    tr->comm->shared_gpu_test = a >= 0;
    return comm_use(tr->comm, nccl, err);
}

/* Each file of a training data set opens (it is read in full later, by data_idx_open). */
static int check_data_files(char *const *prefixes, int n, Error *err)
{
    for (int i = 0; i < n; i++)
        for (int e = 0; e < 2; e++) {
            char *path = data_idx_path(prefixes[i], e ? ".bin" : ".idx");
            if (!path)
                return error_runtime(err, prefixes[i], "out of memory");
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                error_errno(err, path, "cannot open");
                free(path);
                size_t len = strlen(prefixes[i]);
                if (err->status != ERROR_INPUT)
                    return -1;
                if (len > 4 && (!strcmp(prefixes[i] + len - 4, ".idx") || !strcmp(prefixes[i] + len - 4, ".bin")))
                    error_append(err, " (give the data set's PREFIX, without .idx or .bin)");
                else
                    error_append(err, " (training reads the tokens, PREFIX.idx and PREFIX.bin of each data set; "
                                 "wlbtrain convert makes a data set from text)");
                return -1;
            }
            close(fd);
            free(path);
        }
    return 0;
}

int trainer_check_data(const Config *cfg, Error *err)
{
    const ConfigData *d = &cfg->data;
    if (d->path.n == 0)
        return error_set(err, "data.path", "training reads tokens: set data.path (a Megatron PREFIX)");
    /* Here, before anything opens the sets for the layer placement (whose error says what a dry run
     * needs instead), a missing file gets training's own message. */
    if (data_sources_check_count(d->path.n + d->valid_path.n, err) != 0)
        return -1;
    return check_data_files(d->path.v, d->path.n, err) != 0 ? -1 : check_data_files(d->valid_path.v, d->valid_path.n, err);
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

/* Everything a step could grow into, taken now for the largest micro-batch the planner can make
 * (plan_largest): each micro-batch's inputs, the receives posted ahead, the bfloat16 sums' buffers. On
 * a GPU cudaMalloc and cudaFree wait for the whole device, communication streams included: no step
 * after the first allocates (test_parallel checks Ops.alloc_calls through dump_train). rows: a
 * stage's message rows on this TP rank. */
static int reserve_step_buffers(Trainer *tr, int64_t mb_tokens, int64_t rank_rows, int64_t rows, Error *err)
{
    const Config *cfg = tr->cfg;
    for (int k = 0; k < tr->m; k++)
        if (batch_reserve(&tr->batches[k], mb_tokens, rank_rows, (int)cfg->parallel.cp, err) != 0)
            return -1;
    if (tr->n_chunks > 1 && comm_can_post_receives(tr->comm))
        for (int a = 0; a < 2; a++)
            if (trainer_reserve_ahead(tr, a, rows * cfg->model.d_model, err) != 0)
                return -1;
    if (cfg->parallel.reduce_dtype != REDUCE_COMPUTE || tr->ops->act_bytes != 2)
        return 0; /* sums in float32 (comm_sums_in_bf16) */
    return comm_reserve_sum16(tr->comm, model_largest_sum(&tr->chunks[0].model.dims, rank_rows, mb_tokens), err);
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
    /* The pipeline's lanes connected before any message: with interleaving its ends talk too. */
    if (choose_comm(tr, err) != 0 || comm_connect_pipeline(comm, tr->v > 1, err) != 0)
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
    tr->pass_waits = calloc((size_t)4 * tr->m * tr->v, sizeof *tr->pass_waits);
    tr->mb_s_measured = calloc((size_t)tr->m, sizeof *tr->mb_s_measured);
    tr->mb_s_predicted = calloc((size_t)tr->m, sizeof *tr->mb_s_predicted);
    if (!tr->sched || !tr->chunks || !tr->batches || !tr->inputs || !tr->mb_index || !tr->mb_compute ||
        !tr->all_compute || !tr->pass_timed || !tr->pass_comm || !tr->pass_waits || !tr->mb_s_measured ||
        !tr->mb_s_predicted)
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
    return reserve_step_buffers(tr, mb_tokens, rank_rows, rows, err);
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
    trainer_straggler_stop(tr);
    for (int c = 0; tr->chunks && c < tr->v; c++) {
        TrainChunk *ch = &tr->chunks[c];
        optim_free(&ch->optim, &ch->model);
        if (ch->model.ops) {
            ch->model.ops->free(ch->shard_grads);
            ch->model.ops->free(ch->kv_scratch);
            ch->model.ops->free(ch->tied_scratch);
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
    free(tr->pass_waits);
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
