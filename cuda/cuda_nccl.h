/*
 * cuda/cuda_nccl.h - NCCL's data path for the float collectives and the pipeline's messages
 * (parallel.comm: nccl), a CommImpl of engine/comm/comm.h that backends.c registers.
 *
 * Opening it (collective over the job): rank 0 makes a unique id, broadcast over MPI; one world
 * communicator from it; then by ncclCommSplit one communicator per group of the layout (color: the
 * group's lowest member, key: the rank in the group) and, with pp > 1, one per lane slot of the
 * pipeline's messages (comm_lane_slot: a lane's messages by the colour of their sender, so a rank
 * sends in one slot and receives in another, each a queue with one peer); every communicator at most
 * 16 CTAs a kernel. Each has its own non-blocking stream of the highest priority; every operation
 * waits (cudaStreamWaitEvent) for the work already queued on the compute stream (the default
 * stream), and the compute stream waits for the operation - never the host - so buffers are ordered
 * without host syncs, each such wait timed by two events (comm_wait_mark). A started collective
 * (comm_istart), a send and a receive posted ahead are queued the same way, and their wait makes the
 * compute stream wait for their end. comm_connect_pipeline connects the lanes' pairs in one group;
 * comm_exchange is a send and a receive in one group. The watchdog polls ncclCommGetAsyncError and
 * aborts the communicators (async_error, abort). WLB_TEST_NCCL_SHARED_GPU's test mode (Comm's
 * shared_gpu_test) gives each rank a host id and NCCL's sockets on the loopback. Buffers are device
 * memory. Errors are Errors (status 1), "nccl: WHAT". Messages go in the pipeline group only.
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
