/*
 * test/test_cuda_ops.c - every op of the CUDA backend against the CPU backend (the reference) on
 * fresh random inputs, by ||gpu - cpu|| / ||cpu|| per output, with the tolerance of each op:
 *   element-wise and reductions in float32 (embedding, RMSNorm, RoPE, SwiGLU, cross-entropy parts,
 *   rows, AdamW)                                             1e-5 (the sum of squares 1e-9)
 *   matrix products, fp32 mode                               1e-5
 *   matrix products, bf16 mode (operands rounded to bf16)    1e-2
 *   attention forward and backward (float32, other sum orders; segments with GQA, documents of 1 to
 *   300 tokens, CP key ranges longer than the queries, two segments sharing keys)   1e-4
 * Every output is poisoned with NaN first where the op overwrites, so an element never written
 * fails. Skipped when the build has no CUDA backend or no GPU is visible (CI); scripts/device/
 * runs it on a GPU machine.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "util/error.h"
#include "util/rng.h"
#ifdef WLB_CUDA
#include "cuda/cuda_ops.h"
#endif

static const Ops *gpu;
static Rng rng;

static int group_setup(void **state)
{
    (void)state;
    rng_seed(&rng, 20261122);
#ifdef WLB_CUDA
    Error err = {0};
    gpu = cuda_ops_open(0, 0, &err);
    if (!gpu)
        printf("# skip: %s\n", err.msg);
#else
    printf("# skip: this build has no CUDA backend\n");
#endif
    return 0;
}

#define NEED_GPU()                                                                                  \
    if (!gpu) {                                                                                     \
        skip();                                                                                     \
        return;                                                                                     \
    }

static float *randn(int64_t n, float scale)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - rng_uniform(&rng), u2 = rng_uniform(&rng), r = sqrt(-2 * log(u1));
        x[i] = (float)(scale * r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(scale * r * sin(2 * M_PI * u2));
    }
    return x;
}

/* A device copy of host data (or n NaNs when src is NULL: poison). */
static void *dev(const void *src, size_t bytes)
{
    void *d = gpu->alloc(bytes);
    assert_non_null(d);
    if (src) {
        gpu->to_device(d, src, bytes);
    } else {
        unsigned char *nan = malloc(bytes ? bytes : 1);
        memset(nan, 0xff, bytes); /* 0xffffffff is a NaN as a float */
        gpu->to_device(d, nan, bytes);
        free(nan);
    }
    return d;
}

static float *back(const float *d, int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    gpu->to_host(h, d, (size_t)n * sizeof *h);
    return h;
}

/* ||g - c|| / ||c|| of n floats of device d against host c; fails over tol (or on NaN). */
static void expect_close(const char *what, const float *d, const float *c, int64_t n, double tol)
{
    float *g = back(d, n);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        den += (double)c[i] * c[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("# %-36s rel %.2e (tolerance %.0e)\n", what, e, tol);
    free(g);
    if (!(e <= tol))
        fail_msg("%s: relative error %g over %g", what, e, tol);
}

static void test_elementwise(void **state)
{
    (void)state;
    NEED_GPU();
    const Ops *cpu = cpu_ops();
    int64_t T = 300, d = 96, V = 50;
    /* embedding */
    int32_t tok[300];
    for (int i = 0; i < T; i++)
        tok[i] = (int32_t)rng_below(&rng, 2 * V) - 10; /* some outside the slice [10, 10 + V) */
    float *table = randn(V * d, 1), *out = malloc((size_t)(T * d) * 4);
    cpu->embedding_fwd(out, tok, T, table, 10, V, d);
    int32_t *dtok = dev(tok, sizeof tok);
    float *dtable = dev(table, (size_t)(V * d) * 4), *dout = dev(NULL, (size_t)(T * d) * 4);
    gpu->embedding_fwd(dout, dtok, T, dtable, 10, V, d);
    expect_close("embedding_fwd", dout, out, T * d, 1e-6);
    float *g = randn(T * d, 1), *dtab_c = calloc((size_t)(V * d), 4), *dg = dev(g, (size_t)(T * d) * 4);
    float *dtab_g = dev(dtab_c, (size_t)(V * d) * 4);
    cpu->embedding_bwd(dtab_c, tok, g, T, 10, V, d);
    gpu->embedding_bwd(dtab_g, dtok, dg, T, 10, V, d);
    expect_close("embedding_bwd", dtab_g, dtab_c, V * d, 1e-5);
    /* RMSNorm */
    float *x = randn(T * d, 2), *w = randn(d, 1), *rstd = malloc((size_t)T * 4);
    float *dx = dev(x, (size_t)(T * d) * 4), *dw = dev(w, (size_t)d * 4), *drstd = dev(NULL, (size_t)T * 4);
    cpu->rmsnorm_fwd(out, rstd, x, w, T, d, 1e-5f);
    gpu->rmsnorm_fwd(dout, drstd, dx, dw, T, d, 1e-5f);
    expect_close("rmsnorm_fwd out", dout, out, T * d, 1e-6);
    expect_close("rmsnorm_fwd rstd", drstd, rstd, T, 1e-6);
    float *gx = randn(T * d, 1), *gw = randn(d, 1), *dgx = dev(gx, (size_t)(T * d) * 4), *dgw = dev(gw, (size_t)d * 4);
    cpu->rmsnorm_bwd(gx, gw, g, x, w, rstd, T, d);
    gpu->rmsnorm_bwd(dgx, dgw, dg, dx, dw, drstd, T, d);
    expect_close("rmsnorm_bwd dx", dgx, gx, T * d, 1e-5);
    expect_close("rmsnorm_bwd dw", dgw, gw, d, 1e-5);
    /* RoPE, both directions, positions up to 10^5 */
    int32_t pos[300];
    for (int i = 0; i < T; i++)
        pos[i] = (int32_t)rng_below(&rng, 100000);
    float inv[24];
    for (int i = 0; i < 24; i++)
        inv[i] = (float)pow(500000.0, -2.0 * i / 48);
    int32_t *dpos = dev(pos, sizeof pos);
    float *dinv = dev(inv, sizeof inv);
    for (int inverse = 0; inverse < 2; inverse++) {
        memcpy(out, x, (size_t)(T * d) * 4); /* 2 heads of 48 */
        gpu->to_device(dout, x, (size_t)(T * d) * 4);
        cpu->rope(out, pos, T, 2, 48, inv, inverse);
        gpu->rope(dout, dpos, T, 2, 48, dinv, inverse);
        expect_close(inverse ? "rope inverse" : "rope", dout, out, T * d, 1e-6);
    }
    /* SwiGLU */
    float *u = randn(T * d, 1), *du_ = dev(u, (size_t)(T * d) * 4), *o2 = malloc((size_t)(T * d) * 4);
    float *d2 = dev(NULL, (size_t)(T * d) * 4);
    cpu->swiglu_fwd(out, x, u, T * d);
    gpu->swiglu_fwd(dout, dx, du_, T * d);
    expect_close("swiglu_fwd", dout, out, T * d, 1e-6);
    cpu->swiglu_bwd(out, o2, g, x, u, T * d);
    gpu->swiglu_bwd(dout, d2, dg, dx, du_, T * d);
    expect_close("swiglu_bwd dgate", dout, out, T * d, 1e-6);
    expect_close("swiglu_bwd dup", d2, o2, T * d, 1e-6);
    /* rows, add, scale, sum of squares */
    int64_t rows[40];
    for (int i = 0; i < 40; i++)
        rows[i] = (int64_t)rng_below(&rng, (uint64_t)T);
    int64_t *drows = dev(rows, sizeof rows);
    cpu->gather_rows(out, x, rows, 40, d);
    gpu->gather_rows(dout, dx, drows, 40, d);
    expect_close("gather_rows", dout, out, 40 * d, 0);
    memcpy(out, x, (size_t)(T * d) * 4);
    gpu->to_device(dout, x, (size_t)(T * d) * 4);
    for (int i = 0; i < 40; i++)
        rows[i] = i * 7 % T; /* distinct */
    gpu->to_device(drows, rows, sizeof rows);
    cpu->scatter_rows(out, rows, g, 40, d);
    gpu->scatter_rows(dout, drows, dg, 40, d);
    expect_close("scatter_rows", dout, out, T * d, 0);
    cpu->add(out, g, T * d);
    gpu->add(dout, dg, T * d);
    cpu->scale(out, 0.37f, T * d);
    gpu->scale(dout, 0.37f, T * d);
    expect_close("add, scale", dout, out, T * d, 1e-7);
    double sc = cpu->sum_squares(x, T * d), sg = gpu->sum_squares(dx, T * d);
    printf("# sum_squares                          rel %.2e (tolerance 1e-09)\n", fabs(sg - sc) / sc);
    assert_true(fabs(sg - sc) <= 1e-9 * sc);
    free(table), free(out), free(g), free(dtab_c), free(x), free(w), free(rstd), free(gx), free(gw), free(u), free(o2);
    void *ds[] = {dtok, dtable, dout, dg, dtab_g, dx, dw, drstd, dgx, dgw, dpos, dinv, du_, d2, drows};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        gpu->free(ds[i]);
}

static void test_cross_entropy_and_adamw(void **state)
{
    (void)state;
    NEED_GPU();
    const Ops *cpu = cpu_ops();
    int64_t T = 64, V = 5000, vocab0 = 1000;
    float *z = randn(T * V, 3);
    int32_t tgt[64];
    for (int t = 0; t < T; t++)
        tgt[t] = t % 9 == 0 ? -1 : (int32_t)rng_below(&rng, 7000); /* some outside this slice */
    double mx[64], sum[64], zt[64], lse[64];
    cpu->ce_row_max(mx, z, T, V);
    cpu->ce_row_sumexp(sum, z, mx, T, V);
    cpu->ce_target_logit(zt, z, tgt, T, V, vocab0);
    float *dz = dev(z, (size_t)(T * V) * 4);
    int32_t *dtgt = dev(tgt, sizeof tgt);
    double *dmx = dev(NULL, sizeof mx), *dsum = dev(NULL, sizeof sum), *dzt = dev(NULL, sizeof zt), h[64];
    gpu->ce_row_max(dmx, dz, T, V);
    gpu->to_host(h, dmx, sizeof h);
    for (int t = 0; t < T; t++)
        assert_true(h[t] == mx[t]);
    gpu->ce_row_sumexp(dsum, dz, dmx, T, V);
    gpu->to_host(h, dsum, sizeof h);
    for (int t = 0; t < T; t++)
        assert_true(fabs(h[t] - sum[t]) <= 1e-6 * sum[t]);
    gpu->ce_target_logit(dzt, dz, dtgt, T, V, vocab0);
    gpu->to_host(h, dzt, sizeof h);
    for (int t = 0; t < T; t++) {
        assert_true(h[t] == zt[t]);
        lse[t] = mx[t] + log(sum[t]);
    }
    printf("# ce_row_max, ce_row_sumexp, ce_target_logit agree\n");
    double *dlse = dev(lse, sizeof lse);
    float *grad = malloc((size_t)(T * V) * 4), *dgrad = dev(NULL, (size_t)(T * V) * 4);
    cpu->ce_grad(grad, z, lse, tgt, T, V, vocab0, 0.01f);
    gpu->ce_grad(dgrad, dz, dlse, dtgt, T, V, vocab0, 0.01f);
    expect_close("ce_grad", dgrad, grad, T * V, 1e-6);
    /* AdamW, three steps */
    int64_t n = 10000;
    float *p = randn(n, 0.1f), *gr = randn(n, 0.01f), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    float *dp = dev(p, (size_t)n * 4), *dgr = dev(gr, (size_t)n * 4), *dm = dev(m, (size_t)n * 4), *dv = dev(v, (size_t)n * 4);
    for (int s = 1; s <= 3; s++) {
        AdamWStep st = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, (float)(1 - pow(0.9, s)), (float)(1 - pow(0.95, s))};
        cpu->adamw(p, gr, m, v, n, st);
        gpu->adamw(dp, dgr, dm, dv, n, st);
    }
    expect_close("adamw params", dp, p, n, 1e-6);
    expect_close("adamw moments", dv, v, n, 1e-6);
    free(z), free(grad), free(p), free(gr), free(m), free(v);
    void *ds[] = {dz, dtgt, dmx, dsum, dzt, dlse, dgrad, dp, dgr, dm, dv};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        gpu->free(ds[i]);
}

static void check_matmul(int bf16, double tol)
{
#ifdef WLB_CUDA
    Error err = {0};
    gpu = cuda_ops_open(0, bf16, &err);
#else
    (void)bf16;
#endif
    assert_non_null(gpu);
    const Ops *cpu = cpu_ops();
    int64_t shapes[3][3] = {{1, 64, 48}, {257, 96, 200}, {1000, 128, 384}}; /* T, n_in, n_out */
    for (int s = 0; s < 3; s++) {
        int64_t T = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
        float *x = randn(T * I, 1), *w = randn(O * I, 0.1f), *out = malloc((size_t)(T * O) * 4);
        float *dy = randn(T * O, 1), *dx = randn(T * I, 1), *dw = randn(O * I, 1);
        float *gx = dev(x, (size_t)(T * I) * 4), *gw = dev(w, (size_t)(O * I) * 4), *gout = dev(NULL, (size_t)(T * O) * 4);
        float *gdy = dev(dy, (size_t)(T * O) * 4), *gdx = dev(dx, (size_t)(T * I) * 4), *gdw = dev(dw, (size_t)(O * I) * 4);
        char what[64];
        cpu->matmul_fwd(out, x, w, T, I, O);
        gpu->matmul_fwd(gout, gx, gw, T, I, O);
        snprintf(what, sizeof what, "matmul_fwd %s [%lld, %lld, %lld]", bf16 ? "bf16" : "fp32", (long long)T,
                 (long long)I, (long long)O);
        expect_close(what, gout, out, T * O, tol);
        cpu->matmul_bwd(dx, dw, dy, x, w, T, I, O, 1); /* accumulated */
        gpu->matmul_bwd(gdx, gdw, gdy, gx, gw, T, I, O, 1);
        snprintf(what, sizeof what, "matmul_bwd dx %s", bf16 ? "bf16" : "fp32");
        expect_close(what, gdx, dx, T * I, tol);
        snprintf(what, sizeof what, "matmul_bwd dw %s", bf16 ? "bf16" : "fp32");
        expect_close(what, gdw, dw, O * I, tol);
        free(x), free(w), free(out), free(dy), free(dx), free(dw);
        void *ds[] = {gx, gw, gout, gdy, gdx, gdw};
        for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
            gpu->free(ds[i]);
    }
#ifdef WLB_CUDA
    gpu = cuda_ops_open(0, 0, &err);
#endif
}

static void test_matmul_fp32(void **state)
{
    (void)state;
    NEED_GPU();
    check_matmul(0, 1e-5);
}

static void test_matmul_bf16(void **state)
{
    (void)state;
    NEED_GPU();
    check_matmul(1, 1e-2);
}

/* Attention on a layout like the CP planner's: documents as single segments, one document split
 * into two query chunks whose keys overlap (per_doc CP), and a chunk whose keys start before its
 * queries (kv_len > q_len). */
static void check_attention(int n_heads, int n_kv, int D)
{
    const Ops *cpu = cpu_ops();
    AttnSegment segs[8];
    int64_t rows = 0, n = 0, kv_rows;
    int lens[4] = {1, 37, 300, 64};
    for (int i = 0; i < 4; i++, n++) {
        segs[n] = (AttnSegment){rows, lens[i], rows, lens[i]};
        rows += lens[i];
    }
    /* a document of 200 keys at [rows, rows + 200): queries [20, 60) and [150, 200) */
    kv_rows = rows + 200;
    segs[n++] = (AttnSegment){rows + 20, 40, rows, 60};
    segs[n++] = (AttnSegment){rows + 150, 50, rows, 200};
    int64_t T = kv_rows, qs = (int64_t)n_heads * D, ks = (int64_t)n_kv * D;
    AttnShape a = {n_heads, n_kv, D, qs, ks, qs};
    float *q = randn(T * qs, 1), *k = randn(T * ks, 1), *v = randn(T * ks, 1);
    float *out = calloc((size_t)(T * qs), 4), *lse = calloc((size_t)(T * n_heads), 4);
    float *gq = dev(q, (size_t)(T * qs) * 4), *gk = dev(k, (size_t)(T * ks) * 4), *gv = dev(v, (size_t)(T * ks) * 4);
    float *gout = dev(out, (size_t)(T * qs) * 4), *glse = dev(lse, (size_t)(T * n_heads) * 4);
    cpu->attention_fwd(out, lse, q, k, v, segs, n, a);
    gpu->attention_fwd(gout, glse, gq, gk, gv, segs, n, a);
    char what[80];
    snprintf(what, sizeof what, "attention_fwd H %d Hkv %d D %d", n_heads, n_kv, D);
    expect_close(what, gout, out, T * qs, 1e-5);
    expect_close("attention_fwd lse", glse, lse, T * n_heads, 1e-5);
    float *dout = randn(T * qs, 1), *dq = calloc((size_t)(T * qs), 4), *dk = calloc((size_t)(T * ks), 4);
    float *dv = calloc((size_t)(T * ks), 4);
    float *gdout = dev(dout, (size_t)(T * qs) * 4), *gdq = dev(dq, (size_t)(T * qs) * 4);
    float *gdk = dev(dk, (size_t)(T * ks) * 4), *gdv = dev(dv, (size_t)(T * ks) * 4);
    cpu->attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n, a);
    gpu->attention_bwd(gdq, gdk, gdv, gdout, gout, glse, gq, gk, gv, segs, n, a);
    expect_close("attention_bwd dq", gdq, dq, T * qs, 1e-4);
    expect_close("attention_bwd dk", gdk, dk, T * ks, 1e-4);
    expect_close("attention_bwd dv", gdv, dv, T * ks, 1e-4);
    free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
    void *ds[] = {gq, gk, gv, gout, glse, gdout, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        gpu->free(ds[i]);
}

static void test_attention(void **state)
{
    (void)state;
    NEED_GPU();
    check_attention(4, 2, 16);
    check_attention(8, 8, 64);
    check_attention(4, 1, 128);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_cross_entropy_and_adamw),
        cmocka_unit_test(test_matmul_fp32), cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests_name("cuda_ops", tests, group_setup, NULL);
}
