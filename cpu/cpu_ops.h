/*
 * cpu/cpu_ops.h - the reference backend: every operation of engine/ops.h in plain C, fp32,
 * parallel over the cores with OpenMP.
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

/* The backend's table for backends.c (train.device: cpu), and its ops. */
extern const Backend cpu_backend;
const Ops *cpu_ops(void);

/* The kernels, for the table in cpu_ops.c and for tests. */
void cpu_matmul_fwd(float *out, const float *x, const float *w, int64_t T, int64_t n_in, int64_t n_out);
void cpu_matmul_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, int64_t T,
                    int64_t n_in, int64_t n_out, int accumulate_dx);
void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       const AttnSegment *segs, int64_t n_segs, AttnShape shape);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                       AttnShape shape);

/* Hot loops are built for AVX2+FMA and for the baseline x86-64, chosen when the program loads. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_HOT
#endif

#endif
