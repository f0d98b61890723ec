/*
 * cuda/cuda_nccl.h - NCCL communicators for engine/comm/comm_mpi.c (parallel.comm: nccl).
 *
 * One world communicator from a unique id that rank 0 makes and the caller broadcasts over MPI,
 * then one communicator per group by ncclCommSplit (color: the group's lowest member, key: the
 * rank in the group), and for the pipeline group two more, one for messages to higher ranks and
 * one for messages to lower ranks: a send that waits for its receiver never holds up a receive in
 * the other direction. Each communicator has its own non-blocking stream; every operation waits
 * (cudaStreamWaitEvent) for the work already queued on the compute stream (the default stream),
 * and the compute stream waits for the operation, so buffers are ordered without host syncs.
 * Buffers are device memory. Errors are Errors (status 1), "nccl: WHAT".
 */
#ifndef WLB_CUDA_CUDA_NCCL_H
#define WLB_CUDA_CUDA_NCCL_H

#include <stdint.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaNccl CudaNccl;

enum { CUDA_NCCL_ID_BYTES = 128, CUDA_NCCL_SLOTS = 16 };

int cuda_nccl_unique_id(void *id, Error *err);
/* The world communicator (collective over the job). */
CudaNccl *cuda_nccl_open(const void *id, int world, int rank, Error *err);
void cuda_nccl_close(CudaNccl *n);
/* Splits the world into slot's communicator (collective: every rank, same slots in the same order). */
int cuda_nccl_split(CudaNccl *n, int slot, int color, int key, Error *err);

int cuda_nccl_allreduce(CudaNccl *n, int slot, float *buf, int64_t count, Error *err);
/* counts[r] floats from every rank r, one after the other; send NULL: this rank's part is in place. */
int cuda_nccl_allgatherv(CudaNccl *n, int slot, const float *send, float *recv, const int64_t *counts, int size,
                         int me, Error *err);
int cuda_nccl_reduce_scatterv(CudaNccl *n, int slot, const float *send, float *recv, const int64_t *counts,
                              int size, int me, Error *err);
/* A send that returns at once; *event completes with it (cuda_nccl_wait). */
int cuda_nccl_send(CudaNccl *n, int slot, int peer, const float *buf, int64_t count, void **event, Error *err);
int cuda_nccl_wait(void *event, Error *err);
/* A receive the compute stream waits for. */
int cuda_nccl_recv(CudaNccl *n, int slot, int peer, float *buf, int64_t count, Error *err);

#ifdef __cplusplus
}
#endif

#endif
