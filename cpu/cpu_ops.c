/*
 * cpu/cpu_ops.c - the element-wise and row-wise kernels of the reference backend, and its two Ops
 * tables (see engine/ops.h for each operation's contract, cpu_ops.h for the tables and
 * determinism). The float32 table calls the kernels directly (its Act arrays are float arrays); the
 * bfloat16 table's ops are in cpu_bf16.c.
 */
#include "cpu/cpu_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_bf16.h"
#include "cpu/cpu_info.h"
#include "util/bf16.h"
#include "util/error.h"

/* Every block carries its size in front (16 bytes keep the block aligned as malloc's), so that the
 * bytes held and their peak are known (ops->peak_bytes; allocation is single-threaded). */
enum { CPU_ALLOC_HEADER = 16 };
static size_t cpu_held, cpu_peak;

static int64_t cpu_alloc_count;

static int64_t cpu_alloc_calls(void) { return cpu_alloc_count; }

static void *cpu_alloc(size_t bytes)
{
    cpu_alloc_count++;
    char *p = calloc(bytes + CPU_ALLOC_HEADER, 1);
    if (!p)
        return NULL;
    memcpy(p, &bytes, sizeof bytes);
    cpu_held += bytes;
    cpu_peak = cpu_held > cpu_peak ? cpu_held : cpu_peak;
    return p + CPU_ALLOC_HEADER;
}

static void cpu_free(void *p)
{
    if (!p)
        return;
    cpu_alloc_count++;
    char *base = (char *)p - CPU_ALLOC_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    cpu_held -= bytes;
    free(base);
}

static size_t cpu_peak_bytes(void) { return cpu_peak; }
static void cpu_memcpy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
}
static void cpu_sync(void) {}

static void cpu_memory(size_t *free_bytes, size_t *total_bytes)
{
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), phys = sysconf(_SC_PHYS_PAGES);
    *free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    *total_bytes = page > 0 && phys > 0 ? (size_t)page * (size_t)phys : 0;
}

void *cpu_scratch(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        wlb_fatal("cpu backend: out of memory for %zu bytes of scratch", bytes);
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* Rows between dtypes                                                                             */

void cpu_copy_rows(int act_bf16, void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src,
                   Dt src_dt, int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width)
{
    int d16 = act_bf16 && dst_dt == DT_ACT, s16 = act_bf16 && src_dt == DT_ACT;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int64_t dr = dst_rows ? dst_rows[i] : i, sr = src_rows ? src_rows[i] : i;
        if (!d16 && !s16) {
            memmove((float *)dst + dr * dst_stride, (const float *)src + sr * src_stride, (size_t)width * 4);
        } else if (d16 && s16) {
            memmove((uint16_t *)dst + dr * dst_stride, (const uint16_t *)src + sr * src_stride, (size_t)width * 2);
        } else if (d16) {
            uint16_t *o = (uint16_t *)dst + dr * dst_stride;
            const float *x = (const float *)src + sr * src_stride;
            for (int64_t j = 0; j < width; j++)
                o[j] = bf16_from_float(x[j]);
        } else {
            float *o = (float *)dst + dr * dst_stride;
            const uint16_t *x = (const uint16_t *)src + sr * src_stride;
            for (int64_t j = 0; j < width; j++)
                o[j] = bf16_to_float(x[j]);
        }
    }
}

static void f32_copy_rows(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src,
                          Dt src_dt, int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width)
{
    cpu_copy_rows(0, dst, dst_dt, dst_stride, dst_rows, src, src_dt, src_stride, src_rows, n, width);
}

/* ---------------------------------------------------------------------------------------------- */
/* Embedding                                                                                       */

static void embedding_fwd(float *out, const int32_t *tokens, int64_t T, const float *table, int64_t row0,
                          int64_t rows, int64_t d)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        int64_t r = (int64_t)tokens[t] - row0;
        if (r >= 0 && r < rows)
            memcpy(out + t * d, table + r * d, (size_t)d * sizeof *out);
        else
            memset(out + t * d, 0, (size_t)d * sizeof *out);
    }
}

static void embedding_bwd(float *dtable, const int32_t *tokens, const float *dout, int64_t T, int64_t row0,
                          int64_t rows, int64_t d)
{
    /* Tokens repeat: sequential over t keeps the sum order fixed; parallel over the columns. */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < d; c++)
        for (int64_t t = 0; t < T; t++) {
            int64_t r = (int64_t)tokens[t] - row0;
            if (r >= 0 && r < rows)
                dtable[r * d + c] += dout[t * d + c];
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* RMSNorm                                                                                         */

void cpu_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)xt[i] * xt[i];
        float r = (float)(1.0 / sqrt(ss / (double)d + eps));
        rstd[t] = r;
        for (int64_t i = 0; i < d; i++)
            out[t * d + i] = xt[i] * r * w[i];
    }
}

/* y = x r w, r = (mean(x^2) + eps)^-1/2: dx = r (dy w) - x r^3 mean(dy w x); dw = sum_t dy x r. */
void cpu_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                       int64_t T, int64_t d)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * d, *dy = dout + t * d;
        double dot = 0;
        for (int64_t i = 0; i < d; i++)
            dot += (double)dy[i] * w[i] * xt[i];
        float r = rstd[t], c = (float)(dot / (double)d) * r * r * r;
        for (int64_t i = 0; i < d; i++)
            dx[t * d + i] += dy[i] * w[i] * r - xt[i] * c;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d; i++) {
        float s = 0;
        for (int64_t t = 0; t < T; t++)
            s += dout[t * d + i] * x[t * d + i] * rstd[t];
        dw[i] += s;
    }
}

static void f32_rmsnorm_fwd(Act *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps)
{
    cpu_k_rmsnorm_fwd((float *)out, rstd, x, w, T, d, eps);
}

static void f32_rmsnorm_bwd(float *dx, Act *dx_act, float *dw, const float *dout, const float *x, const float *w,
                            const float *rstd, int64_t T, int64_t d)
{
    cpu_k_rmsnorm_bwd(dx, dw, dout, x, w, rstd, T, d);
    if (dx_act && (float *)dx_act != dx)
        memcpy(dx_act, dx, (size_t)(T * d) * sizeof *dx);
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE                                                                                            */

void cpu_k_rope(float *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                const float *inv_freq, float scale, int inverse)
{
    int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            /* The angle in double: positions reach 10^5 and more. */
            double angle = (double)positions[t] * inv_freq[i];
            float c = (float)(cos(angle) * scale), s = (float)((inverse ? -sin(angle) : sin(angle)) * scale);
            for (int h = 0; h < n_heads; h++) {
                float *p = x + t * stride + (int64_t)h * head_dim;
                float a = p[i], b = p[i + half];
                p[i] = a * c - b * s;
                p[i + half] = b * c + a * s;
            }
        }
}

static void f32_rope_fwd(Act *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                         const float *inv_freq, float scale)
{
    cpu_k_rope((float *)x, stride, positions, T, n_heads, head_dim, inv_freq, scale, 0);
}

static void f32_rope_bwd(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                         const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                         float scale)
{
    if ((const float *)dx != g || dx_stride != g_stride)
        cpu_copy_rows(0, dx, DT_ACT, dx_stride, NULL, g, DT_F32, g_stride, NULL, T, width);
    cpu_k_rope((float *)dx, dx_stride, positions, T, n_heads, head_dim, inv_freq, scale, 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* SwiGLU: row t of gu is g (F columns) then u (F columns)                                         */

void cpu_k_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t F)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * F, *u = g + F;
        for (int64_t i = 0; i < F; i++)
            out[t * F + i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* silu(g) = g s(g), s = sigmoid: d silu / dg = s (1 + g (1 - s)). */
void cpu_k_swiglu_bwd(float *dgu, const float *dout, const float *gu, int64_t T, int64_t F)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * F, *u = g + F, *dy = dout + t * F;
        float *dg = dgu + t * 2 * F, *du = dg + F;
        for (int64_t i = 0; i < F; i++) {
            float s = 1.0f / (1.0f + expf(-g[i]));
            dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] = dy[i] * g[i] * s;
        }
    }
}

static void f32_swiglu_fwd(Act *out, const Act *gu, int64_t T, int64_t F)
{
    cpu_k_swiglu_fwd((float *)out, (const float *)gu, T, F);
}

static void f32_swiglu_bwd(Act *dgu, const float *dout, const Act *gu, int64_t T, int64_t F)
{
    cpu_k_swiglu_bwd((float *)dgu, dout, (const float *)gu, T, F);
}

/* ---------------------------------------------------------------------------------------------- */
/* Cross-entropy                                                                                   */

/* A tile's (max, sum of exponentials from it, target logit) of each row; with !first merged into
 * the running statistics of the tiles before it (engine/ops.h), in double. */
static void ce_stats(double *stats, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                     int64_t vocab0, int first)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *z = logits + t * V;
        float m = z[0];
        for (int64_t i = 1; i < V; i++)
            m = z[i] > m ? z[i] : m;
        double s = 0;
        for (int64_t i = 0; i < V; i++)
            s += exp((double)z[i] - m);
        int64_t c = (int64_t)targets[t] - vocab0;
        double zt = targets[t] >= 0 && c >= 0 && c < V ? z[c] : 0.0;
        double *st = stats + 3 * t;
        if (first) {
            st[0] = m, st[1] = s, st[2] = zt;
            continue;
        }
        double M = st[0] > m ? st[0] : m;
        st[1] = st[1] * exp(st[0] - M) + s * exp(m - M);
        st[0] = M;
        st[2] += zt;
    }
}

void cpu_k_ce_grad(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                   int64_t V, int64_t vocab0, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] < 0) {
            memset(dlogits + t * V, 0, (size_t)V * sizeof *dlogits);
            continue;
        }
        int64_t c = (int64_t)targets[t] - vocab0;
        /* p - 1 at the target in double: when p is near 1 the float difference would lose bits. */
        for (int64_t i = 0; i < V; i++)
            dlogits[t * V + i] = (float)((double)dloss * (exp((double)logits[t * V + i] - lse[t]) - (i == c)));
    }
}

static void f32_ce_grad(Act *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                        int64_t V, int64_t vocab0, float dloss)
{
    cpu_k_ce_grad((float *)dlogits, logits, lse, targets, T, V, vocab0, dloss);
}

/* ---------------------------------------------------------------------------------------------- */
/* Element-wise, sums                                                                              */

static void add(float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void copy(float *dst, const float *src, int64_t n)
{
    if (n > 0 && dst != src)
        memmove(dst, src, (size_t)n * sizeof *dst);
}

static void zero(float *x, int64_t n)
{
    if (n > 0)
        memset(x, 0, (size_t)n * sizeof *x);
}

static double sum_squares(const float *x, int64_t n)
{
    /* Fixed blocks summed in order: the same result for any thread count. */
    enum { BLOCK = 4096 };
    int64_t nb = (n + BLOCK - 1) / BLOCK;
    double *part = cpu_scratch((size_t)(nb ? nb : 1) * sizeof *part);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        double s = 0;
        for (int64_t i = b * BLOCK; i < n && i < (b + 1) * BLOCK; i++)
            s += (double)x[i] * x[i];
        part[b] = s;
    }
    double total = 0;
    for (int64_t b = 0; b < nb; b++)
        total += part[b];
    free(part);
    return total;
}

/* PyTorch's AdamW, span by span: g *= grad_scale; p -= lr wd p; m, v moments;
 * p -= lr (m / bias1) / (sqrt(v / bias2) + eps). */
void cpu_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, const AdamWSpan *spans, int n_spans,
                 AdamWStep s)
{
    for (int k = 0; k < n_spans; k++) {
        int64_t a = spans[k].begin > 0 ? spans[k].begin : 0, b = spans[k].end < n ? spans[k].end : n;
        float wd = spans[k].weight_decay;
#pragma omp parallel for schedule(static)
        for (int64_t i = a; i < b; i++) {
            float gi = g[i] * s.grad_scale;
            m[i] = s.beta1 * m[i] + (1 - s.beta1) * gi;
            v[i] = s.beta2 * v[i] + (1 - s.beta2) * gi * gi;
            p[i] -= s.lr * wd * p[i];
            p[i] -= s.lr * (m[i] / s.bias1) / (sqrtf(v[i] / s.bias2) + s.eps);
        }
    }
}

static void f32_adamw(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n, const AdamWSpan *spans,
                      int n_spans, AdamWStep s)
{
    cpu_k_adamw(p, g, m, v, n, spans, n_spans, s);
    if (p_act && (float *)p_act != p)
        memcpy(p_act, p, (size_t)n * sizeof *p);
}

/* ---------------------------------------------------------------------------------------------- */
/* Products and attention of the float32 table                                                     */

static void f32_matmul_fwd(MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_in, int64_t n_out)
{
    cpu_k_matmul((float *)out.p, out.kind == MAT_F32_PLUS ? out.c : NULL, (const float *)x, (const float *)w, T,
                 n_in, n_out);
}

static void f32_matmul_bwd_dx(MatOut dx, const Act *dout, const Act *w, int64_t T, int64_t n_in, int64_t n_out)
{
    cpu_k_matmul_dx((float *)dx.p, dx.kind == MAT_F32_PLUS ? dx.c : NULL, (const float *)dout, (const float *)w, T,
                    n_in, n_out);
}

static void f32_matmul_bwd_dw(float *dw, const Act *dout, const Act *x, int64_t T, int64_t n_in, int64_t n_out)
{
    cpu_k_matmul_dw(dw, (const float *)dout, (const float *)x, T, n_in, n_out);
}

static void f32_attention_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                              int64_t n_segs, AttnShape shape)
{
    cpu_attention_fwd((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, segs, n_segs, shape);
}

static void f32_attention_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                              const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                              AttnShape shape)
{
    cpu_attention_bwd(dq, dk, dv, (const float *)dout, (const float *)out, lse, (const float *)q, (const float *)k,
                      (const float *)v, segs, n_segs, shape);
}

static void f32_attention_merge(float *acc, float *acc_lse, const Act *part, const float *part_lse,
                                const AttnSegment *segs, int64_t n_segs, AttnShape shape, int first)
{
    cpu_attention_merge(acc, acc_lse, (const float *)part, part_lse, segs, n_segs, shape, first);
}

void cpu_attention_merge_store(int act_bf16, Act *out, float *lse, const float *acc, const float *acc_lse,
                               const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
    size_t elem = act_bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t si = 0; si < n_segs; si++) {
        const AttnSegment *g = &segs[si];
        cpu_copy_rows(act_bf16, (char *)out + (size_t)(g->q_row * a.o_stride) * elem, DT_ACT, a.o_stride, NULL,
                      acc + g->q_row * a.o_stride, DT_F32, a.o_stride, NULL, g->q_len, (int64_t)a.n_heads * a.head_dim);
        memcpy(lse + g->q_row * a.n_heads, acc_lse + g->q_row * a.n_heads, (size_t)(g->q_len * a.n_heads) * sizeof *lse);
    }
}

static void f32_attention_merge_store(Act *out, float *lse, const float *acc, const float *acc_lse,
                                      const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
    cpu_attention_merge_store(0, out, lse, acc, acc_lse, segs, n_segs, a);
}

/* ---------------------------------------------------------------------------------------------- */
/* The tables                                                                                      */

/* The fields both tables share: memory and the ops without an Act argument. */
#define CPU_COMMON_OPS                                                                             \
    .host_memory = 1, .logits_floats = OPS_LOGITS_FLOATS_CPU, .alloc = cpu_alloc, .free = cpu_free, \
    .to_device = cpu_memcpy, .to_host = cpu_memcpy, .memory = cpu_memory, .peak_bytes = cpu_peak_bytes,     \
    .alloc_calls = cpu_alloc_calls, .sync = cpu_sync,                                              \
    .embedding_fwd = embedding_fwd, .embedding_bwd = embedding_bwd, .ce_stats = ce_stats, .add = add, \
    .copy = copy, .zero = zero, .sum_squares = sum_squares

static const Ops ops_f32 = {
    CPU_COMMON_OPS,
    .name = "cpu",
    .act_bytes = 4,
    .act_is_f32 = 1,
    .copy_rows = f32_copy_rows,
    .rmsnorm_fwd = f32_rmsnorm_fwd,
    .rmsnorm_bwd = f32_rmsnorm_bwd,
    .matmul_fwd = f32_matmul_fwd,
    .matmul_bwd_dx = f32_matmul_bwd_dx,
    .matmul_bwd_dw = f32_matmul_bwd_dw,
    .rope_fwd = f32_rope_fwd,
    .rope_bwd = f32_rope_bwd,
    .attention_fwd = f32_attention_fwd,
    .attention_bwd = f32_attention_bwd,
    .attention_merge = f32_attention_merge,
    .attention_merge_store = f32_attention_merge_store,
    .swiglu_fwd = f32_swiglu_fwd,
    .swiglu_bwd = f32_swiglu_bwd,
    .ce_grad = f32_ce_grad,
    .adamw = f32_adamw,
};

static const Ops ops_bf16 = {
    CPU_COMMON_OPS,
    .name = "cpu (bf16 emulated)",
    .act_bytes = 2,
    .act_is_f32 = 0,
    .copy_rows = cpu_bf16_copy_rows,
    .rmsnorm_fwd = cpu_bf16_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_bf16_rmsnorm_bwd,
    .matmul_fwd = cpu_bf16_matmul_fwd,
    .matmul_bwd_dx = cpu_bf16_matmul_bwd_dx,
    .matmul_bwd_dw = cpu_bf16_matmul_bwd_dw,
    .rope_fwd = cpu_bf16_rope_fwd,
    .rope_bwd = cpu_bf16_rope_bwd,
    .attention_fwd = cpu_bf16_attention_fwd,
    .attention_bwd = cpu_bf16_attention_bwd,
    .attention_merge = cpu_bf16_attention_merge,
    .attention_merge_store = cpu_bf16_attention_merge_store,
    .swiglu_fwd = cpu_bf16_swiglu_fwd,
    .swiglu_bwd = cpu_bf16_swiglu_bwd,
    .ce_grad = cpu_bf16_ce_grad,
    .adamw = cpu_bf16_adamw,
};

const Ops *cpu_ops(void) { return &ops_f32; }
const Ops *cpu_ops_bf16(void) { return &ops_bf16; }

/* The CPU has one attention (its reference): train.attention auto and own take it; cudnn is refused. */
static const Ops *cpu_open(const BackendOpen *opt, Error *err)
{
    if (opt->attention == BACKEND_ATTN_CUDNN) {
        error_set(err, "train.attention", "cudnn needs train.device: cuda");
        return NULL;
    }
    return opt->bf16 ? &ops_bf16 : &ops_f32;
}

static int64_t cpu_device_id(void) { return -1; }

static void cpu_share_node(int ranks_here) { cpu_share_cores(ranks_here); }

const Backend cpu_backend = {"cpu", cpu_describe, cpu_open, cpu_device_id, cpu_share_node, NULL};
