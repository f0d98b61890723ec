/*
 * test/test_ops.c - every op of a backend under test against a reference backend, on the same
 * random inputs, by ||test - ref|| / ||ref|| per output (and exact equality where an op only moves
 * data):
 *   cpu bf16 (emulated) against cpu fp32     always: the emulation's roundings are where the GPU's
 *                                            are, so its errors are bf16-sized and no larger;
 *   cuda fp32 against cpu fp32               on a GPU: the same arithmetic, other sum orders;
 *   cuda bf16 against cpu bf16               on a GPU: the same roundings, other sum orders;
 *   cuda determinism                         on a GPU: attention (the tensor-core kernels and the
 *                                            float32 reference, fp32 and bf16) and the embedding's
 *                                            backward twice give the same bits;
 *   cuda products of 700 token counts        on a GPU: more shapes than the product plan cache holds;
 *   cuda flash against the fp32 reference    on a GPU: the tensor-core attention (deterministic and
 *                                            atomic backward) at its tile edges, CP chunks, GQA;
 *   cuda cudnn against the fp32 reference    on a GPU with cuDNN (train.attention: cudnn): whole,
 *     and against the own kernels            sharded and full segments, 1..3-token and long
 *                                            documents, GQA up to 32/8, head sizes 64 and 128,
 *                                            cuDNN's deterministic and fastest backward.
 * Outputs the op overwrites are poisoned with NaN on the test side first, so an element never
 * written fails. Inputs of the compute dtype are made from the same float32 values on both sides
 * (the bf16 side rounds them). Skips, saying why, the GPU parts without a CUDA build or a GPU.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "engine/backend.h"
#include "util/rng.h"

static Rng rng;

/* Tolerances of one comparison: float32 outputs of element-wise work, outputs in the compute
 * dtype, products, attention forward and backward. */
typedef struct Tol {
    double f32, act, matmul, attn_fwd, attn_bwd;
} Tol;

/* The two backends of a comparison. */
typedef struct Pair {
    const char *name;
    const Ops *ref, *test;
    Tol tol;
} Pair;

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

/* Backend arrays from host data: bytes as they are, float32, or the compute dtype (from floats;
 * NULL src: NaN poison). */
static void *up(const Ops *o, const void *src, size_t bytes)
{
    void *d = o->alloc(bytes);
    assert_non_null(d);
    if (src) {
        o->to_device(d, src, bytes);
    } else {
        unsigned char *nan = malloc(bytes ? bytes : 1);
        memset(nan, 0xff, bytes); /* all ones: a NaN as float and as bfloat16 */
        o->to_device(d, nan, bytes);
        free(nan);
    }
    return d;
}

static float *up_f32(const Ops *o, const float *h, int64_t n) { return up(o, h, (size_t)n * sizeof(float)); }

static Act *up_act(const Ops *o, const float *h, int64_t n)
{
    Act *a = up(o, NULL, (size_t)n * o->act_bytes);
    if (h) {
        float *f = up_f32(o, h, n);
        ops_cast(o, a, DT_ACT, f, DT_F32, n);
        o->free(f);
    }
    return a;
}

/* Host float32 copies of backend arrays. */
static float *down_f32(const Ops *o, const float *d, int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    o->to_host(h, d, (size_t)n * sizeof *h);
    return h;
}

static float *down_act(const Ops *o, const Act *d, int64_t n)
{
    float *f = up_f32(o, NULL, n);
    ops_cast(o, f, DT_F32, d, DT_ACT, n);
    float *h = down_f32(o, f, n);
    o->free(f);
    return h;
}

/* ||t - r|| / ||r|| over n host floats; fails over tol (or on NaN). */
static void expect_close(const Pair *p, const char *what, const float *t, const float *r, int64_t n, double tol)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)t[i] - r[i]) * ((double)t[i] - r[i]);
        den += (double)r[i] * r[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("# %-22s %-36s rel %.2e (tolerance %.0e)\n", p->name, what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: %s: relative error %g over %g", p->name, what, e, tol);
}

/* The two sides' outputs, fetched and compared (and freed). */
static void cmp_f32(const Pair *p, const char *what, const float *r, const float *t, int64_t n, double tol)
{
    float *hr = down_f32(p->ref, r, n), *ht = down_f32(p->test, t, n);
    expect_close(p, what, ht, hr, n, tol);
    free(hr);
    free(ht);
}

static void cmp_act(const Pair *p, const char *what, const Act *r, const Act *t, int64_t n, double tol)
{
    float *hr = down_act(p->ref, r, n), *ht = down_act(p->test, t, n);
    expect_close(p, what, ht, hr, n, tol);
    free(hr);
    free(ht);
}

/* An input on both sides: f32 (act 0) or the compute dtype (act 1). */
typedef struct Both {
    void *r, *t;
} Both;

static Both both(const Pair *p, const float *h, int64_t n, int act)
{
    Both b;
    b.r = act ? (void *)up_act(p->ref, h, n) : (void *)up_f32(p->ref, h, n);
    b.t = act ? (void *)up_act(p->test, h, n) : (void *)up_f32(p->test, h, n);
    return b;
}

static Both both_raw(const Pair *p, const void *h, size_t bytes)
{
    return (Both){up(p->ref, h, bytes), up(p->test, h, bytes)};
}

static void both_free(const Pair *p, Both *b)
{
    p->ref->free(b->r);
    p->test->free(b->t);
}

/* ---------------------------------------------------------------------------------------------- */
/* The checks                                                                                      */

static void check_rows_and_vectors(const Pair *p)
{
    int64_t T = 300, d = 96;
    float *x = randn(T * d, 1);
    /* rows between dtypes, gathered and scattered, with strides */
    int64_t rows[40];
    for (int i = 0; i < 40; i++)
        rows[i] = i * 7 % T; /* distinct */
    Both idx = both_raw(p, rows, sizeof rows), xf = both(p, x, T * d, 0), xa = both(p, x, T * d, 1);
    Both o1 = both(p, NULL, 40 * d, 1), o2 = both(p, NULL, 40 * 64, 0);
    p->ref->copy_rows(o1.r, DT_ACT, d, NULL, xf.r, DT_F32, d, idx.r, 40, d);
    p->test->copy_rows(o1.t, DT_ACT, d, NULL, xf.t, DT_F32, d, idx.t, 40, d);
    cmp_act(p, "copy_rows f32 -> act, gather", o1.r, o1.t, 40 * d, p->tol.act);
    p->ref->copy_rows(o2.r, DT_F32, 64, NULL, xa.r, DT_ACT, d, idx.r, 40, 64);
    p->test->copy_rows(o2.t, DT_F32, 64, NULL, xa.t, DT_ACT, d, idx.t, 40, 64);
    cmp_f32(p, "copy_rows act -> f32, columns", o2.r, o2.t, 40 * 64, p->tol.act);
    p->ref->copy_rows(xf.r, DT_F32, d, idx.r, o2.r, DT_F32, 64, NULL, 40, 64);
    p->test->copy_rows(xf.t, DT_F32, d, idx.t, o2.t, DT_F32, 64, NULL, 40, 64);
    cmp_f32(p, "copy_rows scatter", xf.r, xf.t, T * d, p->tol.act);
    /* add, copy, zero, sum of squares */
    float *y = randn(T * d, 1);
    Both yf = both(p, y, T * d, 0), s = both(p, NULL, T * d, 0);
    p->ref->add(s.r, xf.r, yf.r, T * d);
    p->test->add(s.t, xf.t, yf.t, T * d);
    p->ref->copy(yf.r, s.r, T * d);
    p->test->copy(yf.t, s.t, T * d);
    cmp_f32(p, "add, copy", yf.r, yf.t, T * d, p->tol.act);
    double sr = p->ref->sum_squares(s.r, T * d), st = p->test->sum_squares(s.t, T * d);
    printf("# %-22s %-36s rel %.2e (tolerance %.0e)\n", p->name, "sum_squares", fabs(st - sr) / sr, p->tol.act);
    assert_true(fabs(st - sr) <= p->tol.act * sr);
    p->ref->zero(s.r, T * d);
    p->test->zero(s.t, T * d);
    float *z = down_f32(p->test, s.t, T * d);
    for (int64_t i = 0; i < T * d; i++)
        assert_true(z[i] == 0.0f);
    free(x), free(y), free(z);
    Both *all[] = {&idx, &xf, &xa, &o1, &o2, &yf, &s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(p, all[i]);
}

static void check_embedding_norm_rope_swiglu(const Pair *p)
{
    int64_t T = 300, d = 96, V = 50, F = 80;
    /* embedding: some tokens outside the slice [10, 10 + V), many repeats */
    int32_t tok[300];
    for (int i = 0; i < T; i++)
        tok[i] = (int32_t)rng_below(&rng, 2 * V) - 10;
    float *table = randn(V * d, 1), *g = randn(T * d, 1);
    Both tk = both_raw(p, tok, sizeof tok), tb = both(p, table, V * d, 0), out = both(p, NULL, T * d, 0);
    Both gg = both(p, g, T * d, 0), dtab = both(p, table, V * d, 0);
    p->ref->embedding_fwd(out.r, tk.r, T, tb.r, 10, V, d);
    p->test->embedding_fwd(out.t, tk.t, T, tb.t, 10, V, d);
    cmp_f32(p, "embedding_fwd", out.r, out.t, T * d, 0);
    p->ref->embedding_bwd(dtab.r, tk.r, gg.r, T, 10, V, d);
    p->test->embedding_bwd(dtab.t, tk.t, gg.t, T, 10, V, d);
    cmp_f32(p, "embedding_bwd", dtab.r, dtab.t, V * d, p->tol.f32);
    /* RMSNorm forward (into the compute dtype) and backward (dx accumulated, dx_act, dw) */
    float *x = randn(T * d, 2), *w = randn(d, 1), *gx = randn(T * d, 1), *gw = randn(d, 1);
    Both xx = both(p, x, T * d, 0), ww = both(p, w, d, 0), na = both(p, NULL, T * d, 1), rs = both(p, NULL, T, 0);
    p->ref->rmsnorm_fwd(na.r, rs.r, xx.r, ww.r, T, d, 1e-5f);
    p->test->rmsnorm_fwd(na.t, rs.t, xx.t, ww.t, T, d, 1e-5f);
    cmp_act(p, "rmsnorm_fwd out", na.r, na.t, T * d, p->tol.act);
    cmp_f32(p, "rmsnorm_fwd rstd", rs.r, rs.t, T, p->tol.f32);
    Both dx = both(p, gx, T * d, 0), dxa = both(p, NULL, T * d, 1), dw = both(p, gw, d, 0);
    p->ref->rmsnorm_bwd(dx.r, dxa.r, dw.r, gg.r, xx.r, ww.r, rs.r, T, d);
    p->test->rmsnorm_bwd(dx.t, dxa.t, dw.t, gg.t, xx.t, ww.t, rs.t, T, d);
    cmp_f32(p, "rmsnorm_bwd dx", dx.r, dx.t, T * d, p->tol.f32);
    cmp_act(p, "rmsnorm_bwd dx_act", dxa.r, dxa.t, T * d, p->tol.act);
    cmp_f32(p, "rmsnorm_bwd dw", dw.r, dw.t, d, p->tol.f32);
    /* RoPE on 3 heads of 32 of rows 96 + 16 apart (a fused row), positions up to 10^5; back */
    int32_t pos[300];
    for (int i = 0; i < T; i++)
        pos[i] = (int32_t)rng_below(&rng, 100000);
    float inv[16];
    for (int i = 0; i < 16; i++)
        inv[i] = (float)pow(500000.0, -2.0 * i / 32);
    int64_t S = d + 16;
    float *q = randn(T * S, 1);
    Both ps = both_raw(p, pos, sizeof pos), iv = both(p, inv, 16, 0), qa = both(p, q, T * S, 1);
    p->ref->rope_fwd(qa.r, S, ps.r, T, 3, 32, iv.r, 1.25f); /* yarn-like scale */
    p->test->rope_fwd(qa.t, S, ps.t, T, 3, 32, iv.t, 1.25f);
    cmp_act(p, "rope_fwd", qa.r, qa.t, T * S, p->tol.act);
    Both qf = both(p, q, T * S, 0), back = both(p, NULL, T * S, 1);
    p->ref->rope_bwd(back.r, S, qf.r, S, S, ps.r, T, 3, 32, iv.r, 1.25f);
    p->test->rope_bwd(back.t, S, qf.t, S, S, ps.t, T, 3, 32, iv.t, 1.25f);
    cmp_act(p, "rope_bwd (cast, v columns too)", back.r, back.t, T * S, p->tol.act);
    /* SwiGLU on gate | up rows */
    float *gu = randn(T * 2 * F, 1), *dy = randn(T * F, 1);
    Both ga = both(p, gu, T * 2 * F, 1), so = both(p, NULL, T * F, 1), dyf = both(p, dy, T * F, 0);
    Both dgu = both(p, NULL, T * 2 * F, 1);
    p->ref->swiglu_fwd(so.r, ga.r, T, F);
    p->test->swiglu_fwd(so.t, ga.t, T, F);
    cmp_act(p, "swiglu_fwd", so.r, so.t, T * F, p->tol.act);
    p->ref->swiglu_bwd(dgu.r, dyf.r, ga.r, T, F);
    p->test->swiglu_bwd(dgu.t, dyf.t, ga.t, T, F);
    cmp_act(p, "swiglu_bwd", dgu.r, dgu.t, T * 2 * F, p->tol.act);
    free(table), free(g), free(x), free(w), free(gx), free(gw), free(q), free(gu), free(dy);
    Both *all[] = {&tk, &tb, &out, &gg, &dtab, &xx, &ww, &na, &rs, &dx, &dxa, &dw, &ps, &iv, &qa, &qf, &back,
                   &ga, &so, &dyf, &dgu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(p, all[i]);
}

/* The head's vocabulary tiles (engine/model/model_head.c) on one backend: the [T, V] logits z (host)
 * cut into tiles of 1700 columns (the last 1600), each tile's statistics merged into the running ones
 * (ce_stats with first = 0), give the one call's statistics `whole` (host): max and target logit
 * exactly, the sum within tol (the same exponentials summed in another order: in double on the CPU,
 * 1e-12; a GPU thread sums its columns in float, 1e-6); and each
 * tile's ce_grad (its vocab0) is the same bits as those columns of the whole rows' gradient. */
static void check_cross_entropy_tiles(const Ops *o, const float *z, const int32_t *tgt, int64_t T, int64_t V,
                                      int64_t vocab0, const double *whole, const double *lse_h, const Act *grad,
                                      double tol)
{
    enum { COLS = 1700 };
    float *tile = malloc((size_t)(T * COLS) * sizeof *tile), *g_whole = down_act(o, grad, T * V);
    float *d_tile = up_f32(o, NULL, T * COLS);
    int32_t *d_tgt = up(o, tgt, (size_t)T * sizeof *tgt);
    double *st = up(o, NULL, (size_t)(3 * T) * sizeof(double)), *lse = up(o, lse_h, (size_t)T * sizeof(double));
    Act *g = up_act(o, NULL, T * COLS);
    int64_t bad = 0;
    for (int64_t c = 0; c < V; c += COLS) {
        int64_t nc = V - c < COLS ? V - c : COLS;
        for (int64_t t = 0; t < T; t++)
            memcpy(tile + t * nc, z + t * V + c, (size_t)nc * sizeof *tile);
        o->to_device(d_tile, tile, (size_t)(T * nc) * sizeof *tile);
        o->ce_stats(st, d_tile, d_tgt, T, nc, vocab0 + c, c == 0);
        o->ce_grad(g, d_tile, lse, d_tgt, T, nc, vocab0 + c, 0.01f);
        float *gh = down_act(o, g, T * nc);
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < nc; j++)
                bad += memcmp(&gh[t * nc + j], &g_whole[t * V + c + j], sizeof(float)) != 0;
        free(gh);
    }
    double h[3 * 64], worst = 0;
    o->to_host(h, st, (size_t)(3 * T) * sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        assert_true(h[3 * t] == whole[3 * t] && h[3 * t + 2] == whole[3 * t + 2]);
        double e = fabs(h[3 * t + 1] - whole[3 * t + 1]) / whole[3 * t + 1];
        worst = e > worst ? e : worst;
    }
    printf("# %-22s %-36s sum rel %.1e, gradient %lld of %lld differ\n", o->name, "ce over 3 vocabulary tiles",
           worst, (long long)bad, (long long)(T * V));
    assert_true(worst <= tol);
    assert_int_equal(bad, 0);
    free(tile), free(g_whole);
    o->free(d_tile), o->free(d_tgt), o->free(st), o->free(lse), o->free(g);
}

static void check_cross_entropy_and_adamw(const Pair *p)
{
    int64_t T = 64, V = 5000, vocab0 = 1000;
    float *z = randn(T * V, 3);
    int32_t tgt[64];
    for (int t = 0; t < T; t++)
        tgt[t] = t % 9 == 0 ? -1 : (int32_t)rng_below(&rng, 7000); /* some outside this slice */
    Both zz = both(p, z, T * V, 0), tg = both_raw(p, tgt, sizeof tgt), st = both_raw(p, NULL, 3 * T * sizeof(double));
    p->ref->ce_stats(st.r, zz.r, tg.r, T, V, vocab0, 1);
    p->test->ce_stats(st.t, zz.t, tg.t, T, V, vocab0, 1);
    double hr[3 * 64], ht[3 * 64], lse[64];
    p->ref->to_host(hr, st.r, sizeof hr);
    p->test->to_host(ht, st.t, sizeof ht);
    for (int t = 0; t < T; t++) {
        /* max and target logit are read, not computed: exactly equal; the sum within 1e-6 */
        assert_true(ht[3 * t] == hr[3 * t] && ht[3 * t + 2] == hr[3 * t + 2]);
        assert_true(fabs(ht[3 * t + 1] - hr[3 * t + 1]) <= 1e-6 * hr[3 * t + 1]);
        lse[t] = hr[3 * t] + log(hr[3 * t + 1]);
    }
    printf("# %-22s %-36s agree\n", p->name, "ce_stats (max, sum exp, target)");
    Both ls = both_raw(p, lse, sizeof lse), gr = both(p, NULL, T * V, 1);
    p->ref->ce_grad(gr.r, zz.r, ls.r, tg.r, T, V, vocab0, 0.01f);
    p->test->ce_grad(gr.t, zz.t, ls.t, tg.t, T, V, vocab0, 0.01f);
    cmp_act(p, "ce_grad", gr.r, gr.t, T * V, p->tol.act);
    check_cross_entropy_tiles(p->ref, z, tgt, T, V, vocab0, hr, lse, gr.r, 1e-12);
    check_cross_entropy_tiles(p->test, z, tgt, T, V, vocab0, ht, lse, gr.t, p->test->host_memory ? 1e-12 : 1e-6);
    /* AdamW over three spans of different decay, three steps, clipped in the second */
    int64_t n = 10000;
    AdamWSpan spans[3] = {{0, 3000, 0.1f}, {3000, 3100, 0.0f}, {3100, n, 0.1f}};
    float *pr = randn(n, 0.1f), *g = randn(n, 0.01f), *zero = calloc((size_t)n, sizeof *zero);
    Both pp = both(p, pr, n, 0), g2 = both(p, g, n, 0), m = both(p, zero, n, 0), v = both(p, zero, n, 0);
    Both pa = both(p, NULL, n, 1);
    for (int s = 1; s <= 3; s++) {
        AdamWStep as = {1e-3f, 0.9f, 0.95f, 1e-8f, (float)(1 - pow(0.9, s)), (float)(1 - pow(0.95, s)),
                        s == 2 ? 0.25f : 1.0f};
        p->ref->adamw(pp.r, g2.r, m.r, v.r, pa.r, n, spans, 3, as);
        p->test->adamw(pp.t, g2.t, m.t, v.t, pa.t, n, spans, 3, as);
    }
    cmp_f32(p, "adamw params", pp.r, pp.t, n, p->tol.f32);
    cmp_f32(p, "adamw moments", v.r, v.t, n, p->tol.f32);
    cmp_act(p, "adamw compute copy of the params", pa.r, pa.t, n, p->tol.act);
    free(z), free(pr), free(g), free(zero);
    Both *all[] = {&zz, &tg, &st, &ls, &gr, &pp, &g2, &m, &v, &pa};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(p, all[i]);
}

static void check_matmul(const Pair *p)
{
    int64_t shapes[3][3] = {{1, 64, 48}, {257, 96, 200}, {1000, 128, 384}}; /* T, n_in, n_out */
    for (int s = 0; s < 3; s++) {
        int64_t T = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
        float *x = randn(T * I, 1), *w = randn(O * I, 0.1f), *c = randn(T * O, 1), *dy = randn(T * O, 1);
        float *dx0 = randn(T * I, 1), *dw0 = randn(O * I, 1);
        Both xa = both(p, x, T * I, 1), wa = both(p, w, O * I, 1), cf = both(p, c, T * O, 0), dya = both(p, dy, T * O, 1);
        Both o_act = both(p, NULL, T * O, 1), o_f32 = both(p, NULL, T * O, 0), o_plus = both(p, NULL, T * O, 0);
        Both dx = both(p, dx0, T * I, 0), dw = both(p, dw0, O * I, 0);
        char what[80];
        snprintf(what, sizeof what, "matmul [%lld, %lld] x [%lld, %lld]^T", (long long)T, (long long)I, (long long)O,
                 (long long)I);
        p->ref->matmul_fwd(mat_act(o_act.r), xa.r, wa.r, T, I, O);
        p->test->matmul_fwd(mat_act(o_act.t), xa.t, wa.t, T, I, O);
        cmp_act(p, what, o_act.r, o_act.t, T * O, p->tol.matmul);
        p->ref->matmul_fwd(mat_f32(o_f32.r), xa.r, wa.r, T, I, O);
        p->test->matmul_fwd(mat_f32(o_f32.t), xa.t, wa.t, T, I, O);
        cmp_f32(p, "matmul_fwd into f32", o_f32.r, o_f32.t, T * O, p->tol.matmul);
        p->ref->matmul_fwd(mat_f32_plus(o_plus.r, cf.r), xa.r, wa.r, T, I, O);
        p->test->matmul_fwd(mat_f32_plus(o_plus.t, cf.t), xa.t, wa.t, T, I, O);
        cmp_f32(p, "matmul_fwd c + product", o_plus.r, o_plus.t, T * O, p->tol.matmul);
        p->ref->matmul_bwd_dx(mat_f32_plus(dx.r, dx.r), dya.r, wa.r, T, I, O);
        p->test->matmul_bwd_dx(mat_f32_plus(dx.t, dx.t), dya.t, wa.t, T, I, O);
        cmp_f32(p, "matmul_bwd_dx accumulated", dx.r, dx.t, T * I, p->tol.matmul);
        p->ref->matmul_bwd_dw(dw.r, dya.r, xa.r, T, I, O);
        p->test->matmul_bwd_dw(dw.t, dya.t, xa.t, T, I, O);
        cmp_f32(p, "matmul_bwd_dw accumulated", dw.r, dw.t, O * I, p->tol.matmul);
        free(x), free(w), free(c), free(dy), free(dx0), free(dw0);
        Both *all[] = {&xa, &wa, &cf, &dya, &o_act, &o_f32, &o_plus, &dx, &dw};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            both_free(p, all[i]);
    }
}

/* Attention forward and backward over segments of T rows, q, k, v as columns of one fused array. */
static void check_attention_on(const Pair *p, const char *label, const AttnSegment *segs, int64_t n, int64_t T,
                               int n_heads, int n_kv, int D)
{
    int64_t H = (int64_t)n_heads * D, Hkv = (int64_t)n_kv * D, Q = H + 2 * Hkv;
    AttnShape a = {n_heads, n_kv, D, Q, Q, H};
    float *qkv = randn(T * Q, 1), *dout = randn(T * H, 1), *zero = calloc((size_t)(T * Q), sizeof *zero);
    /* out and lse of rows no segment holds are left as they were: zero on both sides */
    Both in = both(p, qkv, T * Q, 1), out = both(p, zero, T * H, 1), lse = both(p, zero, T * n_heads, 0);
    const Act *q[2] = {in.r, in.t};
    const Act *k[2] = {ops_act(p->ref, in.r, H), ops_act(p->test, in.t, H)};
    const Act *v[2] = {ops_act(p->ref, in.r, H + Hkv), ops_act(p->test, in.t, H + Hkv)};
    p->ref->attention_fwd(out.r, lse.r, q[0], k[0], v[0], segs, n, a);
    p->test->attention_fwd(out.t, lse.t, q[1], k[1], v[1], segs, n, a);
    char what[120];
    snprintf(what, sizeof what, "attention_fwd %s H %d Hkv %d D %d", label, n_heads, n_kv, D);
    cmp_act(p, what, out.r, out.t, T * H, p->tol.attn_fwd);
    cmp_f32(p, "attention_fwd lse", lse.r, lse.t, T * n_heads, p->tol.attn_fwd);
    Both dO = both(p, dout, T * H, 1), g = both(p, zero, T * Q, 0);
    float *gq[2] = {g.r, g.t};
    p->ref->attention_bwd(gq[0], gq[0] + H, gq[0] + H + Hkv, dO.r, out.r, lse.r, q[0], k[0], v[0], segs, n, a);
    p->test->attention_bwd(gq[1], gq[1] + H, gq[1] + H + Hkv, dO.t, out.t, lse.t, q[1], k[1], v[1], segs, n, a);
    cmp_f32(p, "attention_bwd dq | dk | dv", g.r, g.t, T * Q, p->tol.attn_bwd);
    free(qkv), free(dout), free(zero);
    Both *all[] = {&in, &out, &lse, &dO, &g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(p, all[i]);
}

/* Attention on a layout like the CP planner's: documents as single segments (1, 37, 300 and 64
 * tokens), one document of 200 keys split into two query chunks whose keys overlap (per_doc CP), a
 * chunk whose keys start before its queries (kv_len > q_len). */
static void check_attention(const Pair *p, int n_heads, int n_kv, int D)
{
    AttnSegment segs[8];
    int64_t rows = 0, n = 0;
    int lens[4] = {1, 37, 300, 64};
    for (int i = 0; i < 4; i++, n++) {
        segs[n] = (AttnSegment){rows, lens[i], rows, lens[i], 0};
        rows += lens[i];
    }
    segs[n++] = (AttnSegment){rows + 20, 40, rows, 60, 0};
    segs[n++] = (AttnSegment){rows + 150, 50, rows, 200, 0};
    check_attention_on(p, "cp layout", segs, n, rows + 200, n_heads, n_kv, D);
}

/* Context parallelism's attention key block by key block (engine/model/model_cp.c): two query
 * chunks of a 260-key document - [150, 200), which sees keys [0, 150) before it and its own diagonal,
 * and [230, 260) - plus a whole document, computed as a diagonal call (first), then a call per
 * block of keys before the queries (full segments), merged by log-sum-exp and stored; and its
 * backward, a call per block, from the merged out and lse. On each side against that side's one
 * call over all the keys (the blocks sum to it), and the two sides against each other. */
static void check_attention_blocks(const Pair *p, int n_heads, int n_kv, int D)
{
    enum { T = 300 };
    int64_t H = (int64_t)n_heads * D, Hkv = (int64_t)n_kv * D, Q = H + 2 * Hkv;
    AttnShape a = {n_heads, n_kv, D, Q, Q, H};
    AttnSegment whole[3] = {{150, 50, 0, 200, 0}, {230, 30, 0, 260, 0}, {260, 40, 260, 40, 0}};
    AttnSegment diag[3] = {{150, 50, 150, 50, 0}, {230, 30, 200, 60, 0}, {260, 40, 260, 40, 0}};
    AttnSegment before1[2] = {{150, 50, 0, 90, 1}, {230, 30, 0, 90, 1}};
    AttnSegment before2[2] = {{150, 50, 90, 60, 1}, {230, 30, 90, 110, 1}};
    const AttnSegment *calls[3] = {diag, before1, before2};
    int64_t n_calls[3] = {3, 2, 2};
    float *qkv = randn(T * Q, 1), *dout = randn(T * H, 1), *zero = calloc((size_t)(T * Q), sizeof *zero);
    Both in = both(p, qkv, T * Q, 1), dO = both(p, dout, T * H, 1);
    const Ops *side[2] = {p->ref, p->test};
    void *ins[2] = {in.r, in.t}, *dos[2] = {dO.r, dO.t};
    Act *out[2];
    float *lse[2], *g[2];
    for (int i = 0; i < 2; i++) {
        const Ops *o = side[i];
        const Act *q = ins[i], *k = ops_act(o, ins[i], H), *v = ops_act(o, ins[i], H + Hkv);
        /* one call over all the keys */
        Act *out1 = up_act(o, zero, T * H);
        float *lse1 = up_f32(o, zero, T * n_heads), *g1 = up_f32(o, zero, T * Q);
        o->attention_fwd(out1, lse1, q, k, v, whole, 3, a);
        o->attention_bwd(g1, g1 + H, g1 + H + Hkv, dos[i], out1, lse1, q, k, v, whole, 3, a);
        /* block by block */
        Act *part = up_act(o, NULL, T * H);
        float *part_lse = up_f32(o, NULL, T * n_heads), *acc = up_f32(o, NULL, T * H);
        float *acc_lse = up_f32(o, NULL, T * n_heads);
        out[i] = up_act(o, zero, T * H);
        lse[i] = up_f32(o, zero, T * n_heads);
        g[i] = up_f32(o, zero, T * Q);
        for (int c = 0; c < 3; c++) {
            o->attention_fwd(part, part_lse, q, k, v, calls[c], n_calls[c], a);
            o->attention_merge(acc, acc_lse, part, part_lse, calls[c], n_calls[c], a, c == 0);
        }
        o->attention_merge_store(out[i], lse[i], acc, acc_lse, whole, 3, a);
        for (int c = 0; c < 3; c++)
            o->attention_bwd(g[i], g[i] + H, g[i] + H + Hkv, dos[i], out[i], lse[i], q, k, v, calls[c], n_calls[c], a);
        Pair self = {i ? "test: blocks / one call" : "ref: blocks / one call", o, o, p->tol};
        cmp_act(&self, "attention by blocks, merged", out1, out[i], T * H, p->tol.attn_fwd);
        cmp_f32(&self, "attention by blocks, merged lse", lse1, lse[i], T * n_heads, 1e-5);
        cmp_f32(&self, "attention_bwd by blocks", g1, g[i], T * Q, p->tol.attn_bwd);
        o->free(out1), o->free(lse1), o->free(g1), o->free(part), o->free(part_lse), o->free(acc), o->free(acc_lse);
    }
    char what[120];
    snprintf(what, sizeof what, "attention by blocks H %d Hkv %d D %d", n_heads, n_kv, D);
    cmp_act(p, what, out[0], out[1], T * H, p->tol.attn_fwd);
    cmp_f32(p, "attention by blocks lse", lse[0], lse[1], T * n_heads, p->tol.attn_fwd);
    cmp_f32(p, "attention_bwd by blocks", g[0], g[1], T * Q, p->tol.attn_bwd);
    for (int i = 0; i < 2; i++)
        side[i]->free(out[i]), side[i]->free(lse[i]), side[i]->free(g[i]);
    free(qkv), free(dout), free(zero);
    both_free(p, &in);
    both_free(p, &dO);
}

static void check_all(const Pair *p)
{
    check_rows_and_vectors(p);
    check_embedding_norm_rope_swiglu(p);
    check_cross_entropy_and_adamw(p);
    check_matmul(p);
    check_attention(p, 4, 2, 16);
    check_attention(p, 8, 8, 64);
    check_attention(p, 4, 1, 128);
    check_attention_blocks(p, 4, 2, 16);
    check_attention_blocks(p, 8, 2, 64);
}

/* ---------------------------------------------------------------------------------------------- */

static const Ops *cuda_f32, *cuda_bf16;

static int group_setup(void **state)
{
    (void)state;
    rng_seed(&rng, 20261122);
    const Backend *b = backend_find("cuda");
    Error err = {0};
    BackendOpen f32 = {0, 0, 1, BACKEND_ATTN_OWN}, bf16 = {0, 1, 1, BACKEND_ATTN_OWN};
    if (b && (cuda_f32 = b->open(&f32, &err)) != NULL)
        cuda_bf16 = b->open(&bf16, &err);
    if (!cuda_f32)
        printf("# skip: %s\n", err.msg);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    const Backend *b = backend_find("cuda");
    if (cuda_f32 && b->close)
        b->close();
    return 0;
}

/* bf16 against fp32: every compute-dtype value carries a rounding of 2^-9 relative, and errors
 * grow through the products (sums of 64..384 rounded terms) and attention's softmax. */
static void test_cpu_bf16_against_fp32(void **state)
{
    (void)state;
    Pair p = {"cpu bf16 / cpu fp32", cpu_ops(), cpu_ops_bf16(), {1e-2, 1e-2, 1e-2, 1e-2, 1e-2}};
    check_all(&p);
}

static void test_cuda_fp32_against_cpu(void **state)
{
    (void)state;
    if (!cuda_f32) {
        skip();
        return;
    }
    Pair p = {"cuda fp32 / cpu fp32", cpu_ops(), cuda_f32, {1e-5, 1e-6, 1e-5, 1e-5, 1e-4}};
    check_all(&p);
}

/* The same roundings on both sides: a compute-dtype output differs by at most one bf16 step where
 * the float32 value before rounding differs in its last bits (a sum in another order). */
static void test_cuda_bf16_against_cpu_bf16(void **state)
{
    (void)state;
    if (!cuda_bf16) {
        skip();
        return;
    }
    Pair p = {"cuda bf16 / cpu bf16", cpu_ops_bf16(), cuda_bf16, {1e-5, 4e-3, 4e-3, 1e-2, 2e-2}};
    check_all(&p);
}

/* Products of 700 different token counts, as the packers make micro-batches of any length: more
 * shapes than cuda_matmul.cu's plan cache holds (512; it empties itself when three quarters full),
 * every one against the CPU. */
static void test_cuda_many_product_shapes(void **state)
{
    (void)state;
    if (!cuda_f32) {
        skip();
        return;
    }
    Pair p = {"cuda fp32 / cpu fp32, 700 token counts", cpu_ops(), cuda_f32, {1e-5, 1e-6, 1e-5, 1e-5, 1e-4}};
    const int64_t T_MAX = 700, I = 24, O = 40;
    float *x = randn(T_MAX * I, 1), *w = randn(O * I, 1);
    Both xa = both(&p, x, T_MAX * I, 1), wa = both(&p, w, O * I, 1), out = both(&p, NULL, T_MAX * O, 0);
    for (int64_t T = 1; T <= T_MAX; T++) {
        p.ref->matmul_fwd(mat_f32(out.r), xa.r, wa.r, T, I, O);
        p.test->matmul_fwd(mat_f32(out.t), xa.t, wa.t, T, I, O);
        if (T % 100 == 0)
            cmp_f32(&p, "matmul_fwd", out.r, out.t, T * O, p.tol.matmul);
    }
    free(x), free(w);
    Both *all[] = {&xa, &wa, &out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(&p, all[i]);
}

/* Attention forward and backward of backend o twice over 4 long documents and CP chunks sharing
 * keys: the same bits (at head size 64 the bf16 table runs the tensor-core kernels, the fp32 table
 * and head size 16 the float32 reference). */
static void attention_twice(const Ops *o, const char *name, int D)
{
    Pair p = {name, o, o, {0, 0, 0, 0, 0}};
    int64_t T = 4096;
    int n_heads = 8, n_kv = 2;
    int64_t H = (int64_t)n_heads * D, Hkv = (int64_t)n_kv * D, Q = H + 2 * Hkv;
    AttnSegment segs[6] = {{0, 1000, 0, 1000, 0}, {1000, 700, 1000, 700, 0}, {1700, 300, 1700, 600, 0}, {2000, 300, 1700, 900, 0},
                           {2300, 1000, 2300, 1000, 0}, {3300, 796, 3300, 796, 0}};
    AttnShape a = {n_heads, n_kv, D, Q, Q, H};
    float *qkv = randn(T * Q, 1), *dout = randn(T * H, 1), *zq = calloc((size_t)(T * Q), sizeof *zq);
    Both in = both(&p, qkv, T * Q, 1), out = both(&p, NULL, T * H, 1), lse = both(&p, NULL, T * n_heads, 0);
    Both dO = both(&p, dout, T * H, 1), gr = both(&p, zq, T * Q, 0);
    o->attention_fwd(out.r, lse.r, in.r, ops_act(o, in.r, H), ops_act(o, in.r, H + Hkv), segs, 6, a);
    o->attention_fwd(out.t, lse.t, in.t, ops_act(o, in.t, H), ops_act(o, in.t, H + Hkv), segs, 6, a);
    cmp_act(&p, "attention_fwd twice", out.r, out.t, T * H, 0);
    float *r = gr.r, *t = gr.t;
    o->attention_bwd(r, r + H, r + H + Hkv, dO.r, out.r, lse.r, in.r, ops_act(o, in.r, H), ops_act(o, in.r, H + Hkv),
                     segs, 6, a);
    o->attention_bwd(t, t + H, t + H + Hkv, dO.t, out.t, lse.t, in.t, ops_act(o, in.t, H), ops_act(o, in.t, H + Hkv),
                     segs, 6, a);
    cmp_f32(&p, "attention_bwd twice", gr.r, gr.t, T * Q, 0);
    free(qkv), free(dout), free(zq);
    Both *all[] = {&in, &out, &lse, &dO, &gr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(&p, all[i]);
}

/* Two runs of the GPU's non-trivial reductions give the same bits (train.deterministic: true). */
static void test_cuda_deterministic(void **state)
{
    (void)state;
    if (!cuda_bf16) {
        skip();
        return;
    }
    const Ops *o = cuda_bf16;
    Pair p = {"cuda bf16 twice", o, o, {0, 0, 0, 0, 0}};
    int64_t T = 4096, d = 256, V = 64;
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    for (int64_t i = 0; i < T; i++)
        tok[i] = (int32_t)rng_below(&rng, V); /* every token many times */
    float *g = randn(T * d, 1);
    Both tk = both_raw(&p, tok, (size_t)T * sizeof *tok), gg = both(&p, g, T * d, 0);
    float *zero = calloc((size_t)(V * d), sizeof *zero);
    Both dt = both(&p, zero, V * d, 0);
    o->embedding_bwd(dt.r, tk.r, gg.r, T, 0, V, d);
    o->embedding_bwd(dt.t, tk.t, gg.t, T, 0, V, d);
    cmp_f32(&p, "embedding_bwd twice", dt.r, dt.t, V * d, 0);
    free(tok), free(g), free(zero);
    Both *all[] = {&tk, &gg, &dt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        both_free(&p, all[i]);
    attention_twice(cuda_bf16, "cuda bf16 twice, tensor cores (D 64)", 64);
    attention_twice(cuda_bf16, "cuda bf16 twice, reference (D 16)", 16);
    attention_twice(cuda_f32, "cuda fp32 twice, reference (D 64)", 64);
    attention_twice(cuda_f32, "cuda fp32 twice, reference (D 16)", 16);
}

/* The tensor-core attention (the bf16 table's attention at head sizes 64 and 128) against the
 * float32 reference on the same bf16 inputs, on segments at its tile edges: documents of 1, 63, 64,
 * 65, 127, 128, 129 tokens, a document as long as the window, CP chunks (kv_len > q_len, chunks
 * sharing keys), GQA ratios 1, 4 and 8; the deterministic and the atomic backward. */
static void check_flash_edges(const Pair *p)
{
    AttnSegment segs[16];
    int64_t rows = 0, n = 0;
    int lens[7] = {1, 63, 64, 65, 127, 128, 129};
    for (int i = 0; i < 7; i++, n++) {
        segs[n] = (AttnSegment){rows, lens[i], rows, lens[i], 0};
        rows += lens[i];
    }
    /* one document of 700 keys in three CP chunks: the middle and the last share its first keys */
    segs[n++] = (AttnSegment){rows, 130, rows, 130, 0};
    segs[n++] = (AttnSegment){rows + 300, 65, rows, 365, 0};
    segs[n++] = (AttnSegment){rows + 637, 63, rows, 700, 0};
    rows += 700;
    int ratio[3][2] = {{4, 4}, {8, 2}, {8, 1}}; /* GQA 1, 4, 8 */
    for (int r = 0; r < 3; r++) {
        check_attention_on(p, "edges", segs, n, rows, ratio[r][0], ratio[r][1], 64);
        check_attention_on(p, "edges", segs, n, rows, ratio[r][0], ratio[r][1], 128);
    }
    if (getenv("WLB_TEST_SMALL")) /* under compute-sanitizer (scripts/device/gpu_check.sh sanitize) */
        return;
    AttnSegment window = {0, 2048, 0, 2048, 0};
    check_attention_on(p, "window", &window, 1, 2048, 8, 2, 128);
    check_attention_on(p, "window", &window, 1, 2048, 8, 1, 64);
}

static void test_cuda_flash_edges(void **state)
{
    (void)state;
    if (!cuda_bf16) {
        skip();
        return;
    }
    Pair p = {"cuda flash / cpu fp32", cpu_ops_bf16(), cuda_bf16, {1e-5, 1e-2, 1e-2, 1e-2, 2e-2}};
    check_flash_edges(&p);
    /* the atomic backward (train.deterministic: false), then the deterministic table again */
    const Backend *b = backend_find("cuda");
    Error err = {0};
    BackendOpen atomic = {0, 1, 0, BACKEND_ATTN_OWN}, det = {0, 1, 1, BACKEND_ATTN_OWN};
    const Ops *o = b->open(&atomic, &err);
    assert_non_null(o);
    Pair pa = {"cuda flash atomic / cpu", cpu_ops_bf16(), o, {1e-5, 1e-2, 1e-2, 1e-2, 2e-2}};
    check_flash_edges(&pa);
    cuda_bf16 = b->open(&det, &err);
    assert_non_null(cuda_bf16);
}

/* cuDNN's fused attention (train.attention: cudnn). The backend's attention choice is one per
 * process, so the tables compared here are copies of the bf16 table whose attention ops open the
 * backend with their choice first (opening again only changes the flags). */
static const Backend *cuda_backend_table;
static int cudnn_deterministic = 1;

static const Ops *cuda_open_attention(BackendAttention impl)
{
    Error err = {0};
    BackendOpen o = {0, 1, cudnn_deterministic, impl};
    const Ops *ops = cuda_backend_table->open(&o, &err);
    if (!ops)
        fail_msg("%s", err.msg);
    return ops;
}

#define ATTENTION_AS(NAME, IMPL)                                                                   \
    static void NAME##_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs, \
                           int64_t n, AttnShape a)                                                 \
    {                                                                                              \
        cuda_open_attention(IMPL)->attention_fwd(out, lse, q, k, v, segs, n, a);                  \
    }                                                                                              \
    static void NAME##_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse, \
                           const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n, AttnShape a) \
    {                                                                                              \
        cuda_open_attention(IMPL)->attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n, a); \
    }
ATTENTION_AS(own, BACKEND_ATTN_OWN)
ATTENTION_AS(cudnn, BACKEND_ATTN_CUDNN)

/* The segment shapes the planner makes, at one head layout: whole documents long and very short (1, 2,
 * 3 tokens, and at cuDNN's tile edges 63, 64, 65, 129), one document of 700 keys in three CP chunks
 * (queries at the end of their keys; the last two share the first keys), and a full segment (a query
 * chunk against a block of keys wholly before it, as CP's key blocks are). */
static void check_cudnn_layout(const Pair *p, int n_heads, int n_kv, int D)
{
    AttnSegment segs[16];
    int64_t rows = 0, n = 0;
    int lens[8] = {1, 2, 3, 63, 64, 65, 129, 300};
    for (int i = 0; i < 8; i++, n++) {
        segs[n] = (AttnSegment){rows, lens[i], rows, lens[i], 0};
        rows += lens[i];
    }
    segs[n++] = (AttnSegment){rows, 130, rows, 130, 0};
    segs[n++] = (AttnSegment){rows + 300, 65, rows, 365, 0};
    segs[n++] = (AttnSegment){rows + 637, 63, rows, 700, 0};
    segs[n++] = (AttnSegment){rows + 800, 100, rows + 700, 100, 1};
    rows += 900;
    check_attention_on(p, "cudnn layout", segs, n, rows, n_heads, n_kv, D);
}

static void check_cudnn_all(const Pair *p)
{
    int shapes[5][3] = {{4, 4, 64}, {8, 2, 64}, {4, 4, 128}, {8, 1, 128}, {32, 8, 128}}; /* 32/8 at 128: llama3-8b */
    for (int i = 0; i < 5; i++)
        check_cudnn_layout(p, shapes[i][0], shapes[i][1], shapes[i][2]);
    AttnSegment full_only[2] = {{0, 200, 300, 500, 1}, {200, 100, 800, 64, 1}};
    check_attention_on(p, "full segments", full_only, 2, 900, 8, 2, 128);
    if (getenv("WLB_TEST_SMALL"))
        return;
    AttnSegment window = {0, 2048, 0, 2048, 0};
    check_attention_on(p, "long document", &window, 1, 2048, 8, 2, 128);
    check_attention_on(p, "long document", &window, 1, 2048, 8, 1, 64);
}

/* cuDNN's outputs and gradients against the float32 reference (the CPU's, on the same bf16 inputs) and
 * against the engine's own tensor-core kernels, with cuDNN's deterministic backward and its fastest;
 * twice with the deterministic one: the same bits. Skips, saying why, where the build or the machine
 * has no cuDNN attention. */
static void test_cuda_cudnn_attention(void **state)
{
    (void)state;
    if (!cuda_bf16) {
        skip();
        return;
    }
    cuda_backend_table = backend_find("cuda");
    Error err = {0};
    BackendOpen with_cudnn = {0, 1, 1, BACKEND_ATTN_CUDNN};
    if (!cuda_backend_table->open(&with_cudnn, &err)) {
        printf("# skip: %s\n", err.msg);
        BackendOpen own = {0, 1, 1, BACKEND_ATTN_OWN};
        cuda_bf16 = cuda_backend_table->open(&own, &err);
        skip();
        return;
    }
    static Ops own_table, cudnn_table;
    own_table = *cuda_bf16, cudnn_table = *cuda_bf16;
    own_table.attention_fwd = own_fwd, own_table.attention_bwd = own_bwd;
    cudnn_table.attention_fwd = cudnn_fwd, cudnn_table.attention_bwd = cudnn_bwd;
    /* cuDNN rounds its gradients to bf16 once before they are added: 2^-9 relative more than the own
     * kernels' float32 sums */
    for (cudnn_deterministic = 1; cudnn_deterministic >= 0; cudnn_deterministic--) {
        Pair ref = {cudnn_deterministic ? "cudnn deterministic / cpu fp32" : "cudnn / cpu fp32", cpu_ops_bf16(),
                    &cudnn_table, {1e-5, 1e-2, 1e-2, 1e-2, 3e-2}};
        check_cudnn_all(&ref);
        Pair own = {cudnn_deterministic ? "cudnn deterministic / own" : "cudnn / own", &own_table, &cudnn_table,
                    {1e-5, 1e-2, 1e-2, 1e-2, 3e-2}};
        check_cudnn_all(&own);
    }
    cudnn_deterministic = 1;
    attention_twice(&cudnn_table, "cudnn deterministic twice (D 128)", 128);
    BackendOpen own = {0, 1, 1, BACKEND_ATTN_OWN};
    cuda_bf16 = cuda_backend_table->open(&own, &err);
    assert_non_null(cuda_bf16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_bf16_against_fp32),
        cmocka_unit_test(test_cuda_fp32_against_cpu),
        cmocka_unit_test(test_cuda_bf16_against_cpu_bf16),
        cmocka_unit_test(test_cuda_deterministic),
        cmocka_unit_test(test_cuda_many_product_shapes),
        cmocka_unit_test(test_cuda_flash_edges),
        cmocka_unit_test(test_cuda_cudnn_attention),
    };
    return cmocka_run_group_tests_name("ops", tests, group_setup, group_teardown);
}
