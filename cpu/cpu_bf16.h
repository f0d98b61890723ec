/*
 * cpu/cpu_bf16.h - the ops of the CPU backend's bfloat16 table (cpu_ops_bf16, see cpu_ops.h): each
 * widens its bfloat16 (Act) inputs to float32, runs the float32 kernel, and rounds its Act outputs
 * to nearest even. Internal to cpu/.
 */
#ifndef WLB_CPU_CPU_BF16_H
#define WLB_CPU_CPU_BF16_H

#include "engine/ops.h"

void cpu_bf16_copy_rows(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src,
                        Dt src_dt, int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width);
void cpu_bf16_rmsnorm_fwd(Act *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
void cpu_bf16_rmsnorm_bwd(float *dx, Act *dx_act, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int64_t T, int64_t d);
void cpu_bf16_matmul_fwd(MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_in, int64_t n_out);
void cpu_bf16_matmul_bwd_dx(MatOut dx, const Act *dout, const Act *w, int64_t T, int64_t n_in, int64_t n_out);
void cpu_bf16_matmul_bwd_dw(float *dw, const Act *dout, const Act *x, int64_t T, int64_t n_in, int64_t n_out);
void cpu_bf16_rope_fwd(Act *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                       const float *inv_freq, float scale);
void cpu_bf16_rope_bwd(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                       const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                       float scale);
void cpu_bf16_attention_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                            int64_t n_segs, AttnShape shape);
void cpu_bf16_attention_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                            const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                            AttnShape shape);
void cpu_bf16_attention_merge(float *acc, float *acc_lse, const Act *part, const float *part_lse,
                              const AttnSegment *segs, int64_t n_segs, AttnShape shape, int first);
void cpu_bf16_attention_merge_store(Act *out, float *lse, const float *acc, const float *acc_lse,
                                    const AttnSegment *segs, int64_t n_segs, AttnShape shape);
void cpu_bf16_swiglu_fwd(Act *out, const Act *gu, int64_t T, int64_t F);
void cpu_bf16_swiglu_bwd(Act *dgu, const float *dout, const Act *gu, int64_t T, int64_t F);
void cpu_bf16_ce_grad(Act *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                      int64_t V, int64_t vocab0, float dloss);
void cpu_bf16_adamw(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n, const AdamWSpan *spans,
                    int n_spans, AdamWStep s);

#endif
