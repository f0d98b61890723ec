/*
 * cuda/cuda_flash.h - document-causal attention on the tensor cores: bfloat16 inputs, float32
 * accumulation, online softmax, no mask and no score matrix in memory (FlashAttention-2's
 * algorithm over the plan's segments). The float32 kernels of cuda_attention.cu stay as the
 * reference these are tested against.
 *
 * Semantics are those of engine/ops.h (AttnSegment, AttnShape): query rows [q_row, q_row + q_len)
 * of a segment see the key/value rows [kv_row, kv_row + kv_len), aligned at the end (query i sees
 * keys up to kv_row + kv_len - q_len + i; kv_len >= q_len; a segment with q_len 0 does nothing);
 * query head h reads key/value head h / (n_heads / n_kv_heads); scale 1 / sqrt(head_dim). Strides
 * are in elements: q (and dq) q_stride, k, v (and dk, dv) kv_stride, out (and dout) o_stride.
 * lse[row * n_heads + h] is the float32 log-sum-exp of each query row and head.
 *
 * bf16 arrays are passed as void * (device memory holding __nv_bfloat16), so that C callers need
 * no CUDA header; segs is host memory (the kernels copy what they need). Everything runs on the
 * default stream, in order.
 */
#ifndef WLB_CUDA_CUDA_FLASH_H
#define WLB_CUDA_CUDA_FLASH_H

#include <stdint.h>

#include "engine/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels are built for this head size (64 and 128 at least). */
int cuda_flash_supports(int head_dim);

/* out (bf16) and lse (float32) of every query row the segments hold. */
void cuda_flash_fwd(void *out, float *lse, const void *q, const void *k, const void *v, const AttnSegment *segs,
                    int64_t n_segs, AttnShape shape);

/* Adds the gradients to dq, dk, dv (float32; the caller zeroes them first). Segments may share
 * keys (two chunks of one document under context parallelism): their dk, dv contributions add up.
 * deterministic 1: the same inputs give the same bits on every run (no floating-point atomics, a
 * fixed order of every sum); 0: the fastest kernel, which may add with atomics. */
void cuda_flash_bwd(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse,
                    const void *q, const void *k, const void *v, const AttnSegment *segs, int64_t n_segs,
                    AttnShape shape, int deterministic);

/* Frees the kernels' scratch memory (at backend close; compute-sanitizer's leak check). */
void cuda_flash_release(void);

#ifdef __cplusplus
}
#endif

#endif
