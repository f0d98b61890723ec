/*
 * cpu/cpu_bf16.c - the bfloat16 table of the CPU backend (see cpu_bf16.h): the GPU's rounding
 * points, emulated. An Act array holds bfloat16 bits (uint16_t); every op widens what it reads to
 * float32 scratch, runs the float32 kernel of cpu_ops.c / cpu_matmul.c / cpu_attention.c, and
 * rounds what it writes in the compute dtype to nearest even (util/bf16.h). Slow (every weight is
 * widened at every product) and meant for tests: the model's bf16 path runs here without a GPU,
 * and the CUDA backend's bf16 ops are checked against these.
 */
#include "cpu/cpu_bf16.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "util/bf16.h"

/* n elements of a bfloat16 array, widened into new float32 scratch. */
static float *widen(const Act *a, int64_t n)
{
    float *f = cpu_scratch((size_t)(n > 0 ? n : 1) * sizeof *f);
    const uint16_t *b = (const uint16_t *)a;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        f[i] = bf16_to_float(b[i]);
    return f;
}

static void narrow(Act *a, const float *f, int64_t n)
{
    uint16_t *b = (uint16_t *)a;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        b[i] = bf16_from_float(f[i]);
}

/* The elements a strided array of `rows` rows of `width` spans. */
static int64_t extent(int64_t rows, int64_t stride, int64_t width)
{
    return rows > 0 ? (rows - 1) * stride + width : 0;
}

void cpu_bf16_copy_rows(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src,
                        Dt src_dt, int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width)
{
    cpu_copy_rows(1, dst, dst_dt, dst_stride, dst_rows, src, src_dt, src_stride, src_rows, n, width);
}

void cpu_bf16_rmsnorm_fwd(Act *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps)
{
    float *o = cpu_scratch((size_t)(T * d + 1) * sizeof *o);
    cpu_k_rmsnorm_fwd(o, rstd, x, w, T, d, eps);
    narrow(out, o, T * d);
    free(o);
}

void cpu_bf16_rmsnorm_bwd(float *dx, Act *dx_act, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int64_t T, int64_t d)
{
    cpu_k_rmsnorm_bwd(dx, dw, dout, x, w, rstd, T, d);
    if (dx_act)
        narrow(dx_act, dx, T * d);
}

/* A product's result: into out.p directly when it is float32, else through scratch rounded after. */
static float *product_target(MatOut out, int64_t n, const float **c)
{
    *c = out.kind == MAT_F32_PLUS ? out.c : NULL;
    return out.kind == MAT_ACT ? cpu_scratch((size_t)(n > 0 ? n : 1) * sizeof(float)) : (float *)out.p;
}

static void product_done(MatOut out, float *r, int64_t n)
{
    if (out.kind == MAT_ACT) {
        narrow((Act *)out.p, r, n);
        free(r);
    }
}

void cpu_bf16_matmul_fwd(MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_in, int64_t n_out)
{
    float *xf = widen(x, T * n_in), *wf = widen(w, n_out * n_in);
    const float *c;
    float *r = product_target(out, T * n_out, &c);
    cpu_k_matmul(r, c, xf, wf, T, n_in, n_out);
    product_done(out, r, T * n_out);
    free(xf);
    free(wf);
}

void cpu_bf16_matmul_bwd_dx(MatOut dx, const Act *dout, const Act *w, int64_t T, int64_t n_in, int64_t n_out)
{
    float *df = widen(dout, T * n_out), *wf = widen(w, n_out * n_in);
    const float *c;
    float *r = product_target(dx, T * n_in, &c);
    cpu_k_matmul_dx(r, c, df, wf, T, n_in, n_out);
    product_done(dx, r, T * n_in);
    free(df);
    free(wf);
}

void cpu_bf16_matmul_bwd_dw(float *dw, const Act *dout, const Act *x, int64_t T, int64_t n_in, int64_t n_out)
{
    float *df = widen(dout, T * n_out), *xf = widen(x, T * n_in);
    cpu_k_matmul_dw(dw, df, xf, T, n_in, n_out);
    free(df);
    free(xf);
}

void cpu_bf16_rope_fwd(Act *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                       const float *inv_freq, float scale)
{
    /* Widen every row's span (other columns round-trip unchanged: bf16 -> f32 -> bf16 is exact). */
    int64_t n = extent(T, stride, (int64_t)n_heads * head_dim);
    float *f = widen(x, n);
    cpu_k_rope(f, stride, positions, T, n_heads, head_dim, inv_freq, scale, 0);
    narrow(x, f, n);
    free(f);
}

void cpu_bf16_rope_bwd(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                       const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                       float scale)
{
    float *f = cpu_scratch((size_t)(T * width + 1) * sizeof *f);
    cpu_copy_rows(0, f, DT_F32, width, NULL, g, DT_F32, g_stride, NULL, T, width);
    cpu_k_rope(f, width, positions, T, n_heads, head_dim, inv_freq, scale, 1);
    cpu_copy_rows(1, dx, DT_ACT, dx_stride, NULL, f, DT_F32, width, NULL, T, width);
    free(f);
}

/* The rows the segments read: of queries (and outputs), and of keys and values. */
static void segment_rows(const AttnSegment *segs, int64_t n, int64_t *q_rows, int64_t *kv_rows)
{
    *q_rows = *kv_rows = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t q = segs[i].q_row + segs[i].q_len, kv = segs[i].kv_row + segs[i].kv_len;
        *q_rows = q > *q_rows ? q : *q_rows;
        *kv_rows = kv > *kv_rows ? kv : *kv_rows;
    }
}

void cpu_bf16_attention_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                            int64_t n_segs, AttnShape a)
{
    int64_t qr, kvr;
    segment_rows(segs, n_segs, &qr, &kvr);
    int64_t nq = extent(qr, a.q_stride, (int64_t)a.n_heads * a.head_dim);
    int64_t nkv = extent(kvr, a.kv_stride, (int64_t)a.n_kv_heads * a.head_dim);
    int64_t no = extent(qr, a.o_stride, (int64_t)a.n_heads * a.head_dim);
    /* out is widened too: rows the segments do not hold must come back as they were. */
    float *qf = widen(q, nq), *kf = widen(k, nkv), *vf = widen(v, nkv), *of = widen(out, no);
    cpu_attention_fwd(of, lse, qf, kf, vf, segs, n_segs, a);
    narrow(out, of, no);
    free(qf);
    free(kf);
    free(vf);
    free(of);
}

void cpu_bf16_attention_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                            const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                            AttnShape a)
{
    int64_t qr, kvr;
    segment_rows(segs, n_segs, &qr, &kvr);
    int64_t nq = extent(qr, a.q_stride, (int64_t)a.n_heads * a.head_dim);
    int64_t nkv = extent(kvr, a.kv_stride, (int64_t)a.n_kv_heads * a.head_dim);
    int64_t no = extent(qr, a.o_stride, (int64_t)a.n_heads * a.head_dim);
    float *qf = widen(q, nq), *kf = widen(k, nkv), *vf = widen(v, nkv), *of = widen(out, no), *df = widen(dout, no);
    cpu_attention_bwd(dq, dk, dv, df, of, lse, qf, kf, vf, segs, n_segs, a);
    free(qf);
    free(kf);
    free(vf);
    free(of);
    free(df);
}

void cpu_bf16_attention_merge(float *acc, float *acc_lse, const Act *part, const float *part_lse,
                              const AttnSegment *segs, int64_t n_segs, AttnShape a, int first)
{
    int64_t qr, kvr;
    segment_rows(segs, n_segs, &qr, &kvr);
    float *pf = widen(part, extent(qr, a.o_stride, (int64_t)a.n_heads * a.head_dim));
    cpu_attention_merge(acc, acc_lse, pf, part_lse, segs, n_segs, a, first);
    free(pf);
}

void cpu_bf16_attention_merge_store(Act *out, float *lse, const float *acc, const float *acc_lse,
                                    const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
    cpu_attention_merge_store(1, out, lse, acc, acc_lse, segs, n_segs, a);
}

void cpu_bf16_swiglu_fwd(Act *out, const Act *gu, int64_t T, int64_t F)
{
    float *g = widen(gu, T * 2 * F), *o = cpu_scratch((size_t)(T * F + 1) * sizeof *o);
    cpu_k_swiglu_fwd(o, g, T, F);
    narrow(out, o, T * F);
    free(g);
    free(o);
}

void cpu_bf16_swiglu_bwd(Act *dgu, const float *dout, const Act *gu, int64_t T, int64_t F)
{
    float *g = widen(gu, T * 2 * F), *d = cpu_scratch((size_t)(T * 2 * F + 1) * sizeof *d);
    cpu_k_swiglu_bwd(d, dout, g, T, F);
    narrow(dgu, d, T * 2 * F);
    free(g);
    free(d);
}

void cpu_bf16_ce_grad(Act *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                      int64_t V, int64_t vocab0, float dloss)
{
    float *d = cpu_scratch((size_t)(T * V + 1) * sizeof *d);
    cpu_k_ce_grad(d, logits, lse, targets, T, V, vocab0, dloss);
    narrow(dlogits, d, T * V);
    free(d);
}

void cpu_bf16_adamw(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n, const AdamWSpan *spans,
                    int n_spans, AdamWStep s)
{
    cpu_k_adamw(p, g, m, v, n, spans, n_spans, s);
    if (p_act)
        narrow(p_act, p, n);
}
