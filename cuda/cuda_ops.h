/*
 * cuda/cuda_ops.h - the CUDA backend: every operation of engine/ops.h on one GPU.
 *
 * Memory is device memory (cudaMalloc, zeroed). The compute dtype (an Act array, engine/ops.h) is
 * bfloat16 with train.precision: bf16, float32 otherwise. With bf16: the products read bf16
 * operands (activations, and the bf16 copy of the weights the optimizer writes in its own kernel)
 * and run on the tensor cores with float32 accumulation (cuBLASLt); attention runs on the tensor
 * cores (cuda_flash.h) at head sizes 64 and 128; norms, RoPE, SwiGLU, the cross-entropy and AdamW
 * compute in float32 and round what they store in the compute dtype. Gradients, the fp32 master
 * weights and AdamW's moments are float32. Reductions run in a fixed order with
 * train.deterministic: true (no floating-point atomics), so a run repeats bit for bit.
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

/* Picks GPU local_rank mod the GPUs visible and returns its ops with compute dtype bf16 or fp32;
 * deterministic: no floating-point atomics anywhere (train.deterministic); attention: the bf16
 * attention's kernels (BackendAttention, train.attention: cuda_attention.cu; NULL and an Error,
 * train.attention, status 2, when cudnn is asked for and cuDNN's attention is not there). NULL and an Error (status
 * 2, "train.device: ...") when there is no GPU. Opening again may change both (one GPU per process).
 * cuda_ops_close frees the backend's own scratch (the arrays the ops allocated are the caller's). */
const Ops *cuda_ops_open(int local_rank, int bf16, int deterministic, int attention, Error *err);
void cuda_ops_close(void);
/* The ops' timer (engine/ops.h, cuda_timer.cu): CUDA events on the default stream, created as
 * marks are first used; cuda_timer_release destroys them. */
void cuda_timer_mark(int i);
double cuda_timer_seconds(int a, int b);
void cuda_timer_release(void);

#ifdef __cplusplus
}
#endif

#endif
