/*
 * cuda/cuda_ops.h - the CUDA backend: every operation of engine/ops.h on one GPU.
 *
 * Memory is device memory (cudaMalloc, zeroed). Activations, gradients, the fp32 master weights
 * and AdamW's moments are float32; with bf16 the matrix products run on the tensor cores in
 * bfloat16 with float32 accumulation (cuBLASLt): the operands are rounded to bf16 into scratch
 * buffers right before each product (the weights' bf16 copies are these roundings of the fp32
 * master weights), the results are float32. Element-wise work (norms, RoPE, SwiGLU, softmax, the
 * cross-entropy, AdamW) runs in float32, reductions in float32 or float64 as the CPU backend does.
 * Attention is a tiled online-softmax kernel (no score matrix in memory) over the plan's segments,
 * in float32 (cuda_attention.cu).
 *
 * Everything runs on the default stream, in order; copies to and from the host synchronize. A CUDA
 * error is fatal: "wlbtrain: error: cuda: WHERE: WHAT" and exit status 1 (a rank of an MPI job that
 * exits ends the job).
 */
#ifndef WLB_CUDA_CUDA_OPS_H
#define WLB_CUDA_CUDA_OPS_H

#include "engine/backend.h"
#include "engine/ops.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's table for backends.c (train.device: cuda). */
extern const Backend cuda_backend;

/* Picks GPU local_rank mod the GPUs visible and returns its ops, bf16 matrix products or fp32 ones
 * (opening again switches the precision: one backend per process); NULL and an Error (status 2,
 * "train.device: ...") when there is no GPU. */
const Ops *cuda_ops_open(int local_rank, int bf16, Error *err);
/* GPUs visible to this process (0 without a driver). */
int cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
