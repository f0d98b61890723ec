/*
 * cpu/cpu_ops.c - the element-wise and row-wise operations of the reference backend, and its Ops
 * table (see engine/ops.h for each operation's contract, cpu_ops.h for determinism).
 */
#include "cpu/cpu_info.h"
#include "cpu/cpu_ops.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes) { return calloc(bytes ? bytes : 1, 1); }
static void cpu_free(void *p) { free(p); }
static void cpu_memcpy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

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

static void rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps)
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
static void rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
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

static void rope(float *x, const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                 int inverse)
{
    int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            /* The angle in double: positions reach 10^5 and more. */
            double angle = (double)positions[t] * inv_freq[i];
            float c = (float)cos(angle), s = (float)(inverse ? -sin(angle) : sin(angle));
            for (int h = 0; h < n_heads; h++) {
                float *p = x + t * (int64_t)n_heads * head_dim + (int64_t)h * head_dim;
                float a = p[i], b = p[i + half];
                p[i] = a * c - b * s;
                p[i + half] = b * c + a * s;
            }
        }
}

static void swiglu_fwd(float *out, const float *gate, const float *up, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* silu(g) = g s(g), s = sigmoid: d silu / dg = s (1 + g (1 - s)). */
static void swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-gate[i]));
        dgate[i] = dout[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        dup[i] = dout[i] * gate[i] * s;
    }
}

static void ce_row_max(double *mx, const float *logits, int64_t T, int64_t V)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *z = logits + t * V;
        float m = z[0];
        for (int64_t i = 1; i < V; i++)
            m = z[i] > m ? z[i] : m;
        mx[t] = m;
    }
}

static void ce_row_sumexp(double *sum, const float *logits, const double *mx, int64_t T, int64_t V)
{
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *z = logits + t * V;
        double s = 0;
        for (int64_t i = 0; i < V; i++)
            s += exp((double)z[i] - mx[t]);
        sum[t] = s;
    }
}

static void ce_target_logit(double *z, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                            int64_t vocab0)
{
    for (int64_t t = 0; t < T; t++) {
        int64_t c = (int64_t)targets[t] - vocab0;
        z[t] = targets[t] >= 0 && c >= 0 && c < V ? logits[t * V + c] : 0.0;
    }
}

static void ce_grad(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
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

static void gather_rows(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * width, src + rows[i] * width, (size_t)width * sizeof *dst);
}

static void scatter_rows(float *dst, const int64_t *rows, const float *src, int64_t n, int64_t width)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + rows[i] * width, src + i * width, (size_t)width * sizeof *dst);
}

static void add(float *out, const float *a, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] += a[i];
}

static void copy(float *dst, const float *src, int64_t n) { memcpy(dst, src, (size_t)n * sizeof *dst); }

static void scale(float *x, float s, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

static void zero(float *x, int64_t n) { memset(x, 0, (size_t)n * sizeof *x); }

static double sum_squares(const float *x, int64_t n)
{
    /* Fixed blocks summed in order: the same result for any thread count. */
    enum { BLOCK = 4096 };
    int64_t nb = (n + BLOCK - 1) / BLOCK;
    double *part = malloc((size_t)(nb ? nb : 1) * sizeof *part);
    if (!part)
        wlb_fatal("cpu backend: out of memory");
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

/* PyTorch's AdamW: p -= lr wd p; m, v moments; p -= lr (m / bias1) / (sqrt(v / bias2) + eps). */
static void adamw(float *p, const float *g, float *m, float *v, int64_t n, AdamWStep s)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        m[i] = s.beta1 * m[i] + (1 - s.beta1) * g[i];
        v[i] = s.beta2 * v[i] + (1 - s.beta2) * g[i] * g[i];
        p[i] -= s.lr * s.weight_decay * p[i];
        p[i] -= s.lr * (m[i] / s.bias1) / (sqrtf(v[i] / s.bias2) + s.eps);
    }
}

static const Ops ops = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .embedding_fwd = embedding_fwd,
    .embedding_bwd = embedding_bwd,
    .rmsnorm_fwd = rmsnorm_fwd,
    .rmsnorm_bwd = rmsnorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .rope = rope,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .ce_row_max = ce_row_max,
    .ce_row_sumexp = ce_row_sumexp,
    .ce_target_logit = ce_target_logit,
    .ce_grad = ce_grad,
    .gather_rows = gather_rows,
    .scatter_rows = scatter_rows,
    .add = add,
    .copy = copy,
    .scale = scale,
    .zero = zero,
    .sum_squares = sum_squares,
    .adamw = adamw,
};

const Ops *cpu_ops(void)
{
    return &ops;
}

static const Ops *cpu_open(const BackendOpen *opt, Error *err)
{
    (void)opt;
    (void)err;
    return &ops;
}

static int cpu_device_count(void) { return 0; }

static void cpu_share_node(int ranks_here) { cpu_share_cores(ranks_here); }

const Backend cpu_backend = {"cpu", cpu_describe, cpu_open, cpu_device_count, cpu_share_node};
