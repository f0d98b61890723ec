/* cuda/cuda_nccl.cu - NCCL's data path (see cuda_nccl.h). */
#include "cuda/cuda_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One communicator per group (slot = the LayoutGroup), and the pipeline group's lane slots
 * (comm_lane_slot: a lane's messages by the colour of their sender). */
enum { SLOT_LANE = GROUP_COUNT, CUDA_NCCL_SLOTS = GROUP_COUNT + COMM_LANE_SLOTS };

/* At most this many CTAs (thread blocks, each on one SM) per NCCL kernel: the SMs a collective takes
 * from the products beside it. The cost model prices the same share (cost.c, comm_sm_share). */
enum { NCCL_MAX_CTAS = 16 };

struct CudaNccl {
    ncclComm_t world;
    ncclComm_t comm[CUDA_NCCL_SLOTS];
    cudaStream_t stream[CUDA_NCCL_SLOTS];
    /* The compute stream's waits of this step, timed (comm_wait_mark): a pair of timing events around
     * each cudaStreamWaitEvent, reused step after step; n_waits of them recorded, cap made. */
    cudaEvent_t *wait_events;
    int64_t n_waits, cap_waits;
};

static int nccl_error(ncclResult_t r, const char *what, Error *err)
{
    return error_runtime(err, "nccl", "%s: %s", what, ncclGetErrorString(r));
}

static int cuda_error(cudaError_t e, const char *what, Error *err)
{
    return error_runtime(err, "nccl", "%s: %s", what, cudaGetErrorString(e));
}

#define NCCL_TRY(call, what)                                                                       \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return nccl_error(r_, what, err);                                                      \
    } while (0)

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_error(e_, what, err);                                                      \
    } while (0)

static void nccl_close(Comm *c)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    c->impl_state = nullptr;
    if (!n)
        return;
    for (int s = 0; s < CUDA_NCCL_SLOTS; s++) {
        if (n->comm[s])
            ncclCommDestroy(n->comm[s]);
        if (n->stream[s])
            cudaStreamDestroy(n->stream[s]);
    }
    if (n->world)
        ncclCommDestroy(n->world);
    for (int64_t i = 0; i < 2 * n->cap_waits; i++)
        cudaEventDestroy(n->wait_events[i]);
    free(n->wait_events);
    free(n);
}

/* What every communicator is made with: blocking calls, and at most NCCL_MAX_CTAS blocks a kernel. */
static ncclConfig_t comm_config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    cfg.maxCTAs = NCCL_MAX_CTAS;
    return cfg;
}

/* The communicator of a slot, and its stream at the device's highest priority: a collective's kernel
 * is scheduled ahead of the products queued beside it, so it starts when its data is ready. */
static int split(CudaNccl *n, int slot, int color, int key, Error *err)
{
    ncclConfig_t cfg = comm_config();
    int least = 0, greatest = 0;
    NCCL_TRY(ncclCommSplit(n->world, color, key, &n->comm[slot], &cfg), "ncclCommSplit");
    CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    CUDA_TRY(cudaStreamCreateWithPriority(&n->stream[slot], cudaStreamNonBlocking, greatest), "cudaStreamCreate");
    return 0;
}

/* Tests only (Comm.shared_gpu_test, parallel.comm's test mode): NCCL refuses two ranks on one GPU of
 * one host, judged by a host hash that NCCL_HOSTID replaces. A host id per rank, and the socket
 * transport on the loopback with peer-to-peer and shared memory off, make the ranks of one GPU talk
 * through NCCL's network path. Set here, for this process only, before NCCL reads them. */
static int shared_gpu_test_env(const Comm *c, Error *err)
{
    char host[64];
    snprintf(host, sizeof host, "wlbtrain-test-rank-%d", c->rank[GROUP_WORLD]);
    const char *vars[][2] = {{"NCCL_HOSTID", host},      {"NCCL_NET", "Socket"},     {"NCCL_SOCKET_IFNAME", "lo"},
                             {"NCCL_P2P_DISABLE", "1"},  {"NCCL_SHM_DISABLE", "1"},  {"NCCL_IB_DISABLE", "1"}};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (setenv(vars[i][0], vars[i][1], 1) != 0)
            return error_runtime(err, "nccl", "setenv %s failed", vars[i][0]);
    return 0;
}

/* The world communicator from rank 0's unique id, then every slot's by splitting it. */
static int nccl_open(Comm *c, Error *err)
{
    CudaNccl *n = (CudaNccl *)calloc(1, sizeof *n);
    if (!n)
        return error_runtime(err, "nccl", "out of memory");
    c->impl_state = n;
    if (c->shared_gpu_test && shared_gpu_test_env(c, err) != 0)
        return -1;
    ncclUniqueId id;
    if (c->rank[GROUP_WORLD] == 0)
        NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (comm_broadcast(c, GROUP_WORLD, 0, &id, (int64_t)sizeof id, err) != 0)
        return -1;
    ncclConfig_t cfg = comm_config();
    NCCL_TRY(ncclCommInitRankConfig(&n->world, c->size[GROUP_WORLD], id, c->rank[GROUP_WORLD], &cfg),
             "ncclCommInitRankConfig");
    if (c->size[GROUP_WORLD] > 4096)
        return error_runtime(err, "nccl", "at most 4096 ranks");
    int members[4096], pp = c->size[GROUP_PP];
    for (int slot = 0; slot < CUDA_NCCL_SLOTS; slot++) {
        LayoutGroup g = slot < GROUP_COUNT ? (LayoutGroup)slot : GROUP_PP;
        if (!comm_group_made(c, g))
            continue; /* CP blocks only for sharding groups, once per block size, as MPI's */
        int color_of_lane = (slot - SLOT_LANE) % COMM_LANE_COLORS;
        if (slot >= SLOT_LANE && (pp == 1 || color_of_lane >= (pp % 2 ? 3 : 2)))
            continue; /* the lanes' colours a ring of pp stages uses (the same on every rank) */
        int size = layout_group(&c->layout, g, members), color = members[0];
        for (int i = 1; i < size; i++)
            color = members[i] < color ? members[i] : color;
        if (split(n, slot, color, layout_group_rank(&c->layout, g), err) != 0)
            return -1;
    }
    return 0;
}

/* The communicator's stream waits for the compute stream's work so far. */
static int after_compute(CudaNccl *n, int slot, Error *err)
{
    cudaEvent_t e;
    CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    CUDA_TRY(cudaEventRecord(e, 0), "cudaEventRecord");
    CUDA_TRY(cudaStreamWaitEvent(n->stream[slot], e, 0), "cudaStreamWaitEvent");
    CUDA_TRY(cudaEventDestroy(e), "cudaEventDestroy"); /* released once it completes */
    return 0;
}

/* A pair of timing events for the next wait (created as the step first needs them; events are no
 * device memory). NULL when none could be made: that wait goes untimed. */
static cudaEvent_t *wait_pair(CudaNccl *n)
{
    if (n->n_waits == n->cap_waits) {
        int64_t cap = n->cap_waits ? 2 * n->cap_waits : 64;
        cudaEvent_t *grown = (cudaEvent_t *)realloc(n->wait_events, (size_t)(2 * cap) * sizeof *grown);
        if (!grown)
            return nullptr;
        n->wait_events = grown;
        for (int64_t i = 2 * n->cap_waits; i < 2 * cap; i++)
            if (cudaEventCreate(&grown[i]) != cudaSuccess) {
                n->cap_waits = i / 2; /* the pairs made so far */
                return nullptr;
            }
        n->cap_waits = cap;
    }
    return &n->wait_events[2 * n->n_waits++];
}

/* The compute stream waits for event e, between two timing events when a pair can be had
 * (comm_wait_mark: how long the wait held the stream). */
static cudaError_t stream_wait_timed(CudaNccl *n, cudaEvent_t e)
{
    cudaEvent_t *timed = n ? wait_pair(n) : nullptr;
    if (timed && cudaEventRecord(timed[0], 0) != cudaSuccess)
        timed = nullptr;
    cudaError_t w = cudaStreamWaitEvent(0, e, 0);
    if (timed && w == cudaSuccess)
        w = cudaEventRecord(timed[1], 0);
    return w;
}

/* The compute stream waits for the communicator's work so far; *out keeps the event if asked. */
static int compute_after(CudaNccl *n, int slot, void **out, Error *err)
{
    cudaEvent_t e;
    CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    CUDA_TRY(cudaEventRecord(e, n->stream[slot]), "cudaEventRecord");
    if (out) {
        *out = e;
        return 0;
    }
    cudaError_t w = stream_wait_timed(n, e);
    CUDA_TRY(cudaEventDestroy(e), "cudaEventDestroy");
    CUDA_TRY(w, "cudaStreamWaitEvent");
    return 0;
}

static int check_slot(const CudaNccl *n, int slot, Error *err)
{
    if (!n || slot < 0 || slot >= CUDA_NCCL_SLOTS || !n->comm[slot])
        return error_runtime(err, "nccl", "no communicator in slot %d", slot);
    return 0;
}

/* Each collective comes in one form that ends with compute_after(n, slot, done): done NULL, the
 * compute stream waits for it now (the blocking form); else *done gets the event of its end, which
 * the wait of a started collective makes the compute stream wait for (nccl_istart, nccl_wait). */
static int allreduce_on(Comm *c, LayoutGroup slot, float *buf, int64_t count, void **done, Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)count, ncclFloat, ncclSum, n->comm[slot], n->stream[slot]),
             "ncclAllReduce");
    return compute_after(n, slot, done, err);
}

static int nccl_allreduce(Comm *c, LayoutGroup slot, float *buf, int64_t count, Error *err)
{
    return allreduce_on(c, slot, buf, count, NULL, err);
}

/* 1 when every rank of the group gets as many elements (ZeRO-1's shards when the group divides the
 * parameters): the v-collective is then NCCL's equal-count one, a single ring instead of a broadcast
 * or reduce per rank. */
static int equal_counts(const Comm *c, LayoutGroup g, const int64_t *counts)
{
    for (int r = 1; r < c->size[g]; r++)
        if (counts[r] != counts[0])
            return 0;
    return 1;
}

static int allgather_on(Comm *c, LayoutGroup slot, const void *send, void *recv, int64_t count, Dt dt, void **done,
                        Error *err);
static int reduce_scatter_on(Comm *c, LayoutGroup slot, const float *send, float *recv, int64_t count, void **done,
                             Error *err);

/* NCCL has no v-collectives: a broadcast from every rank (gather: bytes, any dtype) or a reduce to
 * every rank (scatter), fused in one group, unless the counts are equal. */
static int allgatherv_on(Comm *c, LayoutGroup slot, const void *send, void *recv, const int64_t *counts, Dt dt,
                         void **done, Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    if (equal_counts(c, slot, counts))
        return allgather_on(c, slot, send, recv, counts[0], dt, done, err);
    int size = c->size[slot], me = c->rank[slot];
    size_t e = comm_elem_bytes(c, dt);
    char *to = (char *)recv;
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    size_t at = 0;
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size; r++) {
        const void *from = r == me && send ? send : (const void *)(to + at);
        ncclResult_t res = ncclBroadcast(from, to + at, (size_t)counts[r] * e, ncclUint8, r, n->comm[slot],
                                         n->stream[slot]);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return nccl_error(res, "ncclBroadcast", err);
        }
        at += (size_t)counts[r] * e;
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return compute_after(n, slot, done, err);
}

static int nccl_allgatherv(Comm *c, LayoutGroup slot, const void *send, void *recv, const int64_t *counts, Dt dt,
                           Error *err)
{
    return allgatherv_on(c, slot, send, recv, counts, dt, NULL, err);
}

static int reduce_scatterv_on(Comm *c, LayoutGroup slot, const float *send, float *recv, const int64_t *counts,
                              void **done, Error *err)
{
    if (equal_counts(c, slot, counts))
        return reduce_scatter_on(c, slot, send, recv, counts[0], done, err);
    CudaNccl *n = (CudaNccl *)c->impl_state;
    int size = c->size[slot], me = c->rank[slot];
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    int64_t at = 0;
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size; r++) {
        ncclResult_t res = ncclReduce(send + at, r == me ? recv : nullptr, (size_t)counts[r], ncclFloat, ncclSum, r,
                                      n->comm[slot], n->stream[slot]);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return nccl_error(res, "ncclReduce", err);
        }
        at += counts[r];
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return compute_after(n, slot, done, err);
}

static int nccl_reduce_scatterv(Comm *c, LayoutGroup slot, const float *send, float *recv, const int64_t *counts,
                                Error *err)
{
    return reduce_scatterv_on(c, slot, send, recv, counts, NULL, err);
}

/* The equal-count collectives: one NCCL call each. The gather copies bytes (a bf16 compute dtype
 * travels as it is); the reduce-scatter sums float32. */
static int allgather_on(Comm *c, LayoutGroup slot, const void *send, void *recv, int64_t count, Dt dt, void **done,
                        Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    size_t part = (size_t)count * comm_elem_bytes(c, dt);
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    const void *from = send ? send : (const void *)((const char *)recv + part * (size_t)c->rank[slot]);
    NCCL_TRY(ncclAllGather(from, recv, part, ncclUint8, n->comm[slot], n->stream[slot]), "ncclAllGather");
    return compute_after(n, slot, done, err);
}

static int nccl_allgather(Comm *c, LayoutGroup slot, const void *send, void *recv, int64_t count, Dt dt, Error *err)
{
    return allgather_on(c, slot, send, recv, count, dt, NULL, err);
}

static int reduce_scatter_on(Comm *c, LayoutGroup slot, const float *send, float *recv, int64_t count, void **done,
                             Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    NCCL_TRY(ncclReduceScatter(send, recv, (size_t)count, ncclFloat, ncclSum, n->comm[slot], n->stream[slot]),
             "ncclReduceScatter");
    return compute_after(n, slot, done, err);
}

static int nccl_reduce_scatter(Comm *c, LayoutGroup slot, const float *send, float *recv, int64_t count, Error *err)
{
    return reduce_scatter_on(c, slot, send, recv, count, NULL, err);
}

/* A started collective: queued on its group's stream after the compute stream's work so far; its
 * end's event in req->event, which nccl_wait makes the compute stream wait for (no host sync). The
 * buffers are the caller's until then, as comm.h says. */
static int nccl_istart(Comm *c, const CommOp *op, CommRequest *req, Error *err)
{
    LayoutGroup g = op->group;
    void *done = nullptr;
    int rc = -1;
    switch (op->kind) {
    case COMM_OP_ALLREDUCE_SUM:
        rc = allreduce_on(c, g, (float *)op->recv, op->n, &done, err);
        break;
    case COMM_OP_ALLGATHERV:
        rc = allgatherv_on(c, g, op->send, op->recv, op->counts, op->dt, &done, err);
        break;
    case COMM_OP_REDUCE_SCATTERV:
        rc = reduce_scatterv_on(c, g, (const float *)op->send, (float *)op->recv, op->counts, &done, err);
        break;
    case COMM_OP_ALLGATHER:
        rc = allgather_on(c, g, op->send, op->recv, op->n, op->dt, &done, err);
        break;
    case COMM_OP_REDUCE_SCATTER:
        rc = reduce_scatter_on(c, g, (const float *)op->send, (float *)op->recv, op->n, &done, err);
        break;
    }
    if (rc != 0)
        return -1;
    req->staged = nullptr;
    req->op = nullptr;
    req->event = done;
    req->collective = 1;
    req->active = 1;
    return 0;
}

/* The slot of a message on lane sent by PP rank sender. */
static int lane_slot(const Comm *c, LayoutGroup g, CommLane lane, int sender, Error *err)
{
    if (g != GROUP_PP)
        return error_runtime(err, "nccl", "messages are for the pipeline group only");
    return SLOT_LANE + comm_lane_slot(lane, sender, c->size[GROUP_PP]);
}

/* A send, or a receive posted ahead: queued on its lane slot's stream after the compute stream's
 * work so far; its end's event in req, which comm_wait makes the compute stream wait for. Only the
 * compute stream writes a message's buffers (the activations and gradients of the passes), so the
 * host never waits for a message. */
static int p2p_start(const Comm *c, int slot, int send, int peer, float *buf, int64_t count, CommRequest *req,
                     Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    if (send)
        NCCL_TRY(ncclSend(buf, (size_t)count, ncclFloat, peer, n->comm[slot], n->stream[slot]), "ncclSend");
    else
        NCCL_TRY(ncclRecv(buf, (size_t)count, ncclFloat, peer, n->comm[slot], n->stream[slot]), "ncclRecv");
    req->staged = nullptr;
    req->op = nullptr;
    if (compute_after(n, slot, &req->event, err) != 0)
        return -1;
    req->collective = 1;
    req->active = 1;
    return 0;
}

static int nccl_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t count,
                      CommRequest *req, Error *err)
{
    (void)tag; /* a lane slot's messages arrive in the order they were sent */
    int slot = lane_slot(c, g, lane, c->rank[g], err);
    return slot < 0 ? -1 : p2p_start(c, slot, 1, peer, (float *)buf, count, req, err);
}

static int nccl_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t count,
                      CommRequest *req, Error *err)
{
    (void)tag;
    int slot = lane_slot(c, g, lane, peer, err);
    return slot < 0 ? -1 : p2p_start(c, slot, 0, peer, buf, count, req, err);
}

/* The compute stream waits for the request's end, between two timing events (comm_wait_mark); the
 * host goes on. */
static int nccl_wait(const Comm *c, CommRequest *req, Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    cudaEvent_t e = (cudaEvent_t)req->event;
    req->event = nullptr;
    req->active = 0;
    req->collective = 0;
    /* The event is destroyed whether the wait worked or not. */
    cudaError_t w = stream_wait_timed(n, e);
    cudaError_t d = cudaEventDestroy(e);
    if (w != cudaSuccess)
        return cuda_error(w, "cudaStreamWaitEvent", err);
    if (d != cudaSuccess)
        return cuda_error(d, "cudaEventDestroy", err);
    return 0;
}

static int64_t nccl_wait_mark(Comm *c) { return ((CudaNccl *)c->impl_state)->n_waits; }

/* The seconds between each timed wait's two events: how long the wait held the compute stream (the
 * first event passes when the work before the wait is done, the second when what it waited for is). */
static double nccl_waited_s(Comm *c, int64_t from, int64_t to)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    double s = 0;
    for (int64_t i = from; i < to && i < n->n_waits; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, n->wait_events[2 * i], n->wait_events[2 * i + 1]) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        s += ms * 1e-3;
    }
    return s;
}

static void nccl_wait_reset(Comm *c) { ((CudaNccl *)c->impl_state)->n_waits = 0; }

/* Every communicator this rank made: the world's, then the slots' (NULL past the last). */
static ncclComm_t comm_at(const CudaNccl *n, int i)
{
    return i == 0 ? n->world : i <= CUDA_NCCL_SLOTS ? n->comm[i - 1] : nullptr;
}

/* ncclCommGetAsyncError on each communicator (safe beside a call in progress on another thread). */
static int nccl_async_error(const Comm *c, char *msg, size_t size)
{
    const CudaNccl *n = (const CudaNccl *)c->impl_state;
    for (int i = 0; n && i <= CUDA_NCCL_SLOTS; i++) {
        ncclComm_t comm = comm_at(n, i);
        ncclResult_t state = ncclSuccess;
        if (!comm || ncclCommGetAsyncError(comm, &state) != ncclSuccess)
            continue;
        if (state != ncclSuccess && state != ncclInProgress) {
            snprintf(msg, size, "nccl: communicator %s%d reports an asynchronous error: %s",
                     i == 0 ? "world" : "slot ", i == 0 ? 0 : i - 1, ncclGetErrorString(state));
            return 1;
        }
    }
    return 0;
}

/* ncclCommAbort on each communicator: the kernels waiting in them end, the process can exit. */
static void nccl_abort(const Comm *c)
{
    const CudaNccl *n = (const CudaNccl *)c->impl_state;
    for (int i = 0; n && i <= CUDA_NCCL_SLOTS; i++)
        if (comm_at(n, i))
            ncclCommAbort(comm_at(n, i));
}

static int nccl_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t count, Error *err)
{
    CommRequest req = {};
    if (nccl_irecv(c, g, peer, lane, tag, buf, count, &req, err) != 0)
        return -1;
    return nccl_wait(c, &req, err);
}

/* A send to peer and a receive from it in one group on g's communicator: NCCL runs them together. */
static int nccl_exchange(Comm *c, LayoutGroup g, int peer, const float *send, float *recv, int64_t count, Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    if (check_slot(n, g, err) != 0 || after_compute(n, g, err) != 0)
        return -1;
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSend(send, (size_t)count, ncclFloat, peer, n->comm[g], n->stream[g]);
    if (r == ncclSuccess)
        r = ncclRecv(recv, (size_t)count, ncclFloat, peer, n->comm[g], n->stream[g]);
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess)
        return nccl_error(r, "ncclSend/ncclRecv", err);
    if (end != ncclSuccess)
        return nccl_error(end, "ncclGroupEnd", err);
    return compute_after(n, g, NULL, err);
}

/* One float to and from each lane peer, all in one group: NCCL connects every pair of the group
 * together, so no first message of the pipeline waits inside its call for a peer still elsewhere. */
static int nccl_connect(Comm *c, const int *to, const int *from, Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    float *dummy = nullptr;
    int me = c->rank[GROUP_PP], pp = c->size[GROUP_PP];
    CUDA_TRY(cudaMalloc(&dummy, 2 * COMM_LANES * sizeof *dummy), "cudaMalloc");
    CUDA_TRY(cudaMemset(dummy, 0, 2 * COMM_LANES * sizeof *dummy), "cudaMemset");
    int rc = 0;
    ncclResult_t r = ncclGroupStart();
    for (int l = 0; r == ncclSuccess && l < COMM_LANES; l++) {
        if (to[l] >= 0) {
            int slot = SLOT_LANE + comm_lane_slot((CommLane)l, me, pp);
            r = check_slot(n, slot, err) != 0 ? ncclInvalidUsage
                                               : ncclSend(dummy + 2 * l, 1, ncclFloat, to[l], n->comm[slot], n->stream[slot]);
        }
        if (r == ncclSuccess && from[l] >= 0) {
            int slot = SLOT_LANE + comm_lane_slot((CommLane)l, from[l], pp);
            r = check_slot(n, slot, err) != 0 ? ncclInvalidUsage
                                               : ncclRecv(dummy + 2 * l + 1, 1, ncclFloat, from[l], n->comm[slot],
                                                          n->stream[slot]);
        }
    }
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess)
        rc = nccl_error(r, "connecting the pipeline's lanes", err);
    else if (end != ncclSuccess)
        rc = nccl_error(end, "ncclGroupEnd", err);
    for (int slot = SLOT_LANE; rc == 0 && slot < CUDA_NCCL_SLOTS; slot++)
        if (n->stream[slot] && cudaStreamSynchronize(n->stream[slot]) != cudaSuccess)
            rc = error_runtime(err, "nccl", "cudaStreamSynchronize failed after connecting the lanes");
    cudaError_t f = cudaFree(dummy);
    if (rc == 0 && f != cudaSuccess)
        return cuda_error(f, "cudaFree", err);
    return rc;
}

/* parallel.reduce_dtype: compute - the partial sums in bfloat16 (ncclBfloat16: each step's sum
 * rounded to bfloat16): one all-reduce, or one reduce-scatter when every rank gets as many, else a
 * reduce to each rank in turn, grouped (as nccl_reduce_scatterv). */
static int nccl_sum_bf16(Comm *c, LayoutGroup slot, const void *send, void *recv, int64_t count, const int64_t *counts,
                         Error *err)
{
    CudaNccl *n = (CudaNccl *)c->impl_state;
    int size = c->size[slot], me = c->rank[slot], equal = 1;
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    if (!counts) {
        NCCL_TRY(ncclAllReduce(send, recv, (size_t)count, ncclBfloat16, ncclSum, n->comm[slot], n->stream[slot]),
                 "ncclAllReduce");
        return compute_after(n, slot, NULL, err);
    }
    for (int r = 1; r < size; r++)
        equal &= counts[r] == counts[0];
    if (equal) {
        NCCL_TRY(ncclReduceScatter(send, recv, (size_t)counts[0], ncclBfloat16, ncclSum, n->comm[slot],
                                   n->stream[slot]), "ncclReduceScatter");
        return compute_after(n, slot, NULL, err);
    }
    const char *from = (const char *)send;
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size; r++) {
        ncclResult_t res = ncclReduce(from, r == me ? recv : nullptr, (size_t)counts[r], ncclBfloat16, ncclSum, r,
                                      n->comm[slot], n->stream[slot]);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return nccl_error(res, "ncclReduce", err);
        }
        from += (size_t)counts[r] * 2;
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return compute_after(n, slot, NULL, err);
}

extern "C" const CommImpl cuda_nccl_comm = {
    "nccl",         nccl_open,     nccl_close,   nccl_allreduce, nccl_allgatherv, nccl_reduce_scatterv,
    nccl_allgather, nccl_reduce_scatter, nccl_isend, nccl_wait, nccl_recv,  nccl_exchange,
    nccl_connect,   nccl_sum_bf16, nccl_istart,  nccl_irecv,      nccl_wait_mark,  nccl_waited_s,
    nccl_wait_reset, nccl_async_error, nccl_abort,
};
