/* cuda/cuda_nccl.cu - NCCL communicators (see cuda_nccl.h). */
#include "cuda/cuda_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

struct CudaNccl {
    ncclComm_t world;
    ncclComm_t comm[CUDA_NCCL_SLOTS];
    cudaStream_t stream[CUDA_NCCL_SLOTS];
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

int cuda_nccl_unique_id(void *id, Error *err)
{
    ncclUniqueId u;
    NCCL_TRY(ncclGetUniqueId(&u), "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return 0;
}

CudaNccl *cuda_nccl_open(const void *id, int world, int rank, Error *err)
{
    CudaNccl *n = (CudaNccl *)calloc(1, sizeof *n);
    if (!n) {
        error_runtime(err, "nccl", "out of memory");
        return nullptr;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&n->world, world, u, rank);
    if (r != ncclSuccess) {
        nccl_error(r, "ncclCommInitRank", err);
        free(n);
        return nullptr;
    }
    return n;
}

void cuda_nccl_close(CudaNccl *n)
{
    if (!n)
        return;
    for (int s = 0; s < CUDA_NCCL_SLOTS; s++) {
        if (n->comm[s])
            ncclCommDestroy(n->comm[s]);
        if (n->stream[s])
            cudaStreamDestroy(n->stream[s]);
    }
    ncclCommDestroy(n->world);
    free(n);
}

int cuda_nccl_split(CudaNccl *n, int slot, int color, int key, Error *err)
{
    if (slot < 0 || slot >= CUDA_NCCL_SLOTS)
        return error_runtime(err, "nccl", "no communicator slot %d", slot);
    NCCL_TRY(ncclCommSplit(n->world, color, key, &n->comm[slot], NULL), "ncclCommSplit");
    CUDA_TRY(cudaStreamCreateWithFlags(&n->stream[slot], cudaStreamNonBlocking), "cudaStreamCreate");
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
    CUDA_TRY(cudaStreamWaitEvent(0, e, 0), "cudaStreamWaitEvent");
    CUDA_TRY(cudaEventDestroy(e), "cudaEventDestroy");
    return 0;
}

static int check_slot(const CudaNccl *n, int slot, Error *err)
{
    if (!n || slot < 0 || slot >= CUDA_NCCL_SLOTS || !n->comm[slot])
        return error_runtime(err, "nccl", "no communicator in slot %d", slot);
    return 0;
}

int cuda_nccl_allreduce(CudaNccl *n, int slot, float *buf, int64_t count, Error *err)
{
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)count, ncclFloat, ncclSum, n->comm[slot], n->stream[slot]),
             "ncclAllReduce");
    return compute_after(n, slot, NULL, err);
}

/* NCCL has no v-collectives: a broadcast from every rank (gather) or a reduce to every rank
 * (scatter), fused in one group. */
int cuda_nccl_allgatherv(CudaNccl *n, int slot, const float *send, float *recv, const int64_t *counts, int size,
                         int me, Error *err)
{
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    int64_t at = 0;
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size; r++) {
        const float *from = r == me ? (send ? send : recv + at) : recv + at;
        ncclResult_t res = ncclBroadcast(from, recv + at, (size_t)counts[r], ncclFloat, r, n->comm[slot],
                                         n->stream[slot]);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return nccl_error(res, "ncclBroadcast", err);
        }
        at += counts[r];
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return compute_after(n, slot, NULL, err);
}

int cuda_nccl_reduce_scatterv(CudaNccl *n, int slot, const float *send, float *recv, const int64_t *counts,
                              int size, int me, Error *err)
{
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
    return compute_after(n, slot, NULL, err);
}

int cuda_nccl_send(CudaNccl *n, int slot, int peer, const float *buf, int64_t count, void **event, Error *err)
{
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    NCCL_TRY(ncclSend(buf, (size_t)count, ncclFloat, peer, n->comm[slot], n->stream[slot]), "ncclSend");
    return compute_after(n, slot, event, err);
}

int cuda_nccl_wait(void *event, Error *err)
{
    cudaEvent_t e = (cudaEvent_t)event;
    CUDA_TRY(cudaEventSynchronize(e), "cudaEventSynchronize");
    CUDA_TRY(cudaEventDestroy(e), "cudaEventDestroy");
    return 0;
}

int cuda_nccl_recv(CudaNccl *n, int slot, int peer, float *buf, int64_t count, Error *err)
{
    if (check_slot(n, slot, err) != 0 || after_compute(n, slot, err) != 0)
        return -1;
    NCCL_TRY(ncclRecv(buf, (size_t)count, ncclFloat, peer, n->comm[slot], n->stream[slot]), "ncclRecv");
    return compute_after(n, slot, NULL, err);
}
