/*
 * cuda/cuda_nccl.h - NCCL's data path for the float collectives and the pipeline's messages
 * (parallel.comm: nccl), a CommImpl of engine/comm/comm.h that backends.c registers.
 *
 * Opening it (collective over the job): rank 0 makes a unique id, broadcast over MPI; one world
 * communicator from it; then by ncclCommSplit one communicator per group of the layout (color: the
 * group's lowest member, key: the rank in the group) and for the pipeline group two more, one for
 * messages to higher ranks and one for messages to lower ranks: a send that waits for its receiver
 * never holds up a receive in the other direction. Each communicator has its own non-blocking
 * stream; every operation waits (cudaStreamWaitEvent) for the work already queued on the compute
 * stream (the default stream), and the compute stream waits for the operation, so buffers are
 * ordered without host syncs. A started collective (comm_istart) is queued the same way, and its
 * wait makes the compute stream wait for its end: the products queued between the start and the
 * wait run beside it. Buffers are device memory. Errors are Errors (status 1), "nccl: WHAT".
 * Messages go in the pipeline group only.
 */
#ifndef WLB_CUDA_CUDA_NCCL_H
#define WLB_CUDA_CUDA_NCCL_H

#include "engine/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const CommImpl cuda_nccl_comm;

#ifdef __cplusplus
}
#endif

#endif
