/*
 * cpu/cpu_ops.h - the reference backend: every operation of engine/ops.h in plain C, float32,
 * parallel over the cores with OpenMP.
 *
 * Two tables share the kernels below: cpu_ops(), whose compute dtype is float32 (the reference
 * everything else is checked against: an Act array is a float array), and cpu_ops_bf16(), whose
 * compute dtype is bfloat16 (train.precision: bf16 on the CPU): each op widens its bfloat16 inputs
 * to float32, runs the same kernel, and rounds its bfloat16 outputs to nearest even - the rounding
 * points of the GPU's mixed precision, emulated, so that the model's bf16 path is tested without a
 * GPU and the CUDA backend has a reference with the same roundings.
 *
 * Determinism: every output element is computed by one thread, summing in a fixed order, so the
 * results do not depend on the number of threads (OMP_NUM_THREADS) or on scheduling; the same
 * inputs give the same bits on the same machine. (The hot loops are compiled twice, for AVX2+FMA
 * and for the baseline, and picked at load time: two machines of different kinds may differ in
 * the last bits.)
 */
#ifndef WLB_CPU_CPU_OPS_H
#define WLB_CPU_CPU_OPS_H

#include "engine/backend.h"
#include "engine/ops.h"

/* The backend's table for backends.c (train.device: cpu), and its two op tables. */
extern const Backend cpu_backend;
const Ops *cpu_ops(void);
const Ops *cpu_ops_bf16(void);

/* The float32 kernels both tables run (see engine/ops.h for each contract). */
void cpu_k_matmul(float *out, const float *c, const float *x, const float *w, int64_t T, int64_t n_in,
                  int64_t n_out);                       /* out = c + x W^T (c NULL: 0; c may be out) */
void cpu_k_matmul_dx(float *dx, const float *c, const float *dout, const float *w, int64_t T, int64_t n_in,
                     int64_t n_out);                    /* dx = c + dout W */
void cpu_k_matmul_dw(float *dw, const float *dout, const float *x, int64_t T, int64_t n_in, int64_t n_out);
void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       const AttnSegment *segs, int64_t n_segs, AttnShape shape);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                       AttnShape shape);
/* (acc, acc_lse) takes in (part, part_lse) on the segments' query rows (engine/ops.h:
 * attention_merge); all float32, out's layout. */
void cpu_attention_merge(float *acc, float *acc_lse, const float *part, const float *part_lse,
                         const AttnSegment *segs, int64_t n_segs, AttnShape a, int first);
/* out, lse = acc, acc_lse on the segments' query rows (engine/ops.h: attention_merge_store); out in
 * the compute dtype, bfloat16 with act_bf16. */
void cpu_attention_merge_store(int act_bf16, Act *out, float *lse, const float *acc, const float *acc_lse,
                               const AttnSegment *segs, int64_t n_segs, AttnShape a);
void cpu_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
void cpu_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                       int64_t T, int64_t d);
/* Rotates the first n_heads heads of T rows `stride` apart, forward or back (inverse), cos and sin
 * times scale. */
void cpu_k_rope(float *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                const float *inv_freq, float scale, int inverse);
void cpu_k_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t F);
void cpu_k_swiglu_bwd(float *dgu, const float *dout, const float *gu, int64_t T, int64_t F);
void cpu_k_ce_grad(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                   int64_t V, int64_t vocab0, float dloss);
void cpu_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, const AdamWSpan *spans, int n_spans,
                 AdamWStep s);
/* copy_rows of either table: act_bf16 says what DT_ACT is. */
void cpu_copy_rows(int act_bf16, void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src,
                   Dt src_dt, int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width);
/* Scratch for the kernels: memory or the fatal path (the ops have no error path). */
void *cpu_scratch(size_t bytes);

/* Hot loops are built for AVX2+FMA and for the baseline x86-64, chosen when the program loads. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_HOT
#endif

#endif
