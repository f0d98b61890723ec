/*
 * test/dump_ops.c - runs every operation of the CPU backend (cpu_ops()) on seeded inputs and
 * writes the inputs and the results, for test/test_ops_ref.py to recompute each from its
 * mathematical definition in float64 numpy (engine/ops.h states the contracts).
 *
 *   dump_ops OUT.safetensors
 *
 * Tensor names are CASE.NAME: the inputs (x, w, dout, ...), what an op accumulates into as it was
 * before (NAME_before) and the results. Scalar arguments are metadata (CASE.eps, ...). Cases:
 *   embedding      a vocabulary slice [row0, row0 + rows): tokens inside, outside and repeated;
 *                  forward, and the backward accumulated into a table that holds values already
 *   rmsnorm_*      forward (out, rstd) and backward (dx and dw accumulated) with eps small, eps
 *                  large, and rows so small that eps dominates
 *   matmul         y = x W^T, and c + x W^T; backward with dx overwritten and accumulated, dW
 *                  accumulated
 *   rope           rotate_half rotation of the first heads of strided rows at positions up to
 *                  65,000 (the last head untouched, as v in a fused q|k|v row), and the backward
 *   attention_*    document-causal attention over segments: q, k, v as columns of one fused
 *                  array (row strides), grouped-query heads, several documents; and queries whose
 *                  keys start before them (a context-parallel rank's segment); forward (out, lse),
 *                  backward (dq, dk, dv)
 *   swiglu         silu(gate) * up over fused gate|up rows, forward and backward, with gates far
 *                  into both tails
 *   ce             the cross-entropy statistics on a vocabulary slice in one pass: row max, sum of
 *                  exponentials, target logit (targets inside, outside the slice and none); gradient
 *   rows           copy_rows: gather and scatter of rows
 *   vec            add, copy, zero, sum of squares
 *   adamw          one AdamW step with weight decay by spans, a gradient scale (clipping) and bias
 *                  correction, some elements with gradients so small that eps is as large as sqrt(v)
 * Every op is called in exactly one function below (run_*): the place to change when the ops
 * interface changes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "engine/ops.h"
#include "util/rng.h"
#include "util/safetensors.h"

static StWriter out;
static Rng rng;
static Error err;

static void die(void)
{
    fprintf(stderr, "dump_ops: %s\n", err.msg);
    exit(1);
}

/* Arrays live until the program ends: the writer keeps pointers to them. */
static void *take(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fputs("dump_ops: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

static float *uniform(int64_t n, float lo, float hi)
{
    float *x = take((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)rng_uniform(&rng);
    return x;
}

static float *copy_of(const float *x, int64_t n)
{
    float *y = take((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* Adds a tensor of rows x cols (rows 0: a vector of cols). */
static void put(const char *c, const char *name, StDtype dt, const void *data, int64_t rows, int64_t cols)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c, name);
    int64_t shape[2] = {rows, cols};
    if (st_writer_add(&out, key, dt, rows ? shape : shape + 1, rows ? 2 : 1, data, &err) != 0)
        die();
}

static void meta(const char *c, const char *name, double v)
{
    char key[128], val[64];
    snprintf(key, sizeof key, "%s.%s", c, name);
    snprintf(val, sizeof val, "%.17g", v);
    if (st_writer_meta(&out, key, val, &err) != 0)
        die();
}

static void run_embedding(const Ops *o)
{
    const char *c = "embedding";
    int64_t T = 9, d = 6, row0 = 3, rows = 7;
    int32_t *tokens = take((size_t)T * sizeof *tokens);
    const int32_t ids[9] = {3, 9, 0, 5, 5, 12, 4, 2, 9}; /* 0, 2, 12 outside [3, 10); 5 and 9 twice */
    memcpy(tokens, ids, sizeof ids);
    float *table = uniform(rows * d, -1, 1), *y = take((size_t)(T * d) * sizeof *y);
    float *dout = uniform(T * d, -1, 1), *dtable = uniform(rows * d, -1, 1);
    put(c, "dtable_before", ST_F32, copy_of(dtable, rows * d), rows, d);
    o->embedding_fwd(y, tokens, T, table, row0, rows, d);
    o->embedding_bwd(dtable, tokens, dout, T, row0, rows, d);
    put(c, "tokens", ST_I32, tokens, 0, T);
    put(c, "table", ST_F32, table, rows, d);
    put(c, "out", ST_F32, y, T, d);
    put(c, "dout", ST_F32, dout, T, d);
    put(c, "dtable", ST_F32, dtable, rows, d);
    meta(c, "row0", (double)row0);
}

static void run_rmsnorm(const Ops *o, const char *c, int64_t T, int64_t d, float eps, float scale)
{
    float *x = uniform(T * d, -scale, scale), *w = uniform(d, 0.5f, 1.5f);
    float *y = take((size_t)(T * d) * sizeof *y), *rstd = take((size_t)T * sizeof *rstd);
    float *dout = uniform(T * d, -1, 1), *dx = uniform(T * d, -1, 1), *dw = uniform(d, -1, 1);
    float *dx_act = take((size_t)(T * d) * sizeof *dx_act);
    put(c, "dx_before", ST_F32, copy_of(dx, T * d), T, d);
    put(c, "dw_before", ST_F32, copy_of(dw, d), 0, d);
    o->rmsnorm_fwd((Act *)y, rstd, x, w, T, d, eps);
    o->rmsnorm_bwd(dx, (Act *)dx_act, dw, dout, x, w, rstd, T, d);
    put(c, "dx_act", ST_F32, dx_act, T, d);
    put(c, "x", ST_F32, x, T, d);
    put(c, "w", ST_F32, w, 0, d);
    put(c, "out", ST_F32, y, T, d);
    put(c, "rstd", ST_F32, rstd, 0, T);
    put(c, "dout", ST_F32, dout, T, d);
    put(c, "dx", ST_F32, dx, T, d);
    put(c, "dw", ST_F32, dw, 0, d);
    meta(c, "eps", eps);
}

static void run_matmul(const Ops *o)
{
    const char *c = "matmul";
    int64_t T = 7, n_in = 12, n_out = 5;
    float *x = uniform(T * n_in, -1, 1), *w = uniform(n_out * n_in, -1, 1), *y = take((size_t)(T * n_out) * 4);
    float *dout = uniform(T * n_out, -1, 1), *dw = uniform(n_out * n_in, -1, 1);
    float *dx = uniform(T * n_in, -1, 1), *dx_acc = uniform(T * n_in, -1, 1);
    float *addend = uniform(T * n_out, -1, 1), *y_plus = take((size_t)(T * n_out) * 4);
    put(c, "dw_before", ST_F32, copy_of(dw, n_out * n_in), n_out, n_in);
    put(c, "dx_acc_before", ST_F32, copy_of(dx_acc, T * n_in), T, n_in);
    const Act *xa = (const Act *)x, *wa = (const Act *)w, *da = (const Act *)dout;
    o->matmul_fwd(mat_f32(y), xa, wa, T, n_in, n_out);
    o->matmul_fwd(mat_f32_plus(y_plus, addend), xa, wa, T, n_in, n_out);  /* c + x W^T */
    o->matmul_bwd_dx(mat_f32(dx), da, wa, T, n_in, n_out);                 /* dx overwritten */
    o->matmul_bwd_dx(mat_f32_plus(dx_acc, dx_acc), da, wa, T, n_in, n_out); /* dx += */
    o->matmul_bwd_dw(dw, da, xa, T, n_in, n_out);                         /* dw += */
    o->matmul_bwd_dw(dw, da, xa, T, n_in, n_out);                         /* dw += again */
    put(c, "addend", ST_F32, addend, T, n_out);
    put(c, "out_plus", ST_F32, y_plus, T, n_out);
    put(c, "x", ST_F32, x, T, n_in);
    put(c, "w", ST_F32, w, n_out, n_in);
    put(c, "out", ST_F32, y, T, n_out);
    put(c, "dout", ST_F32, dout, T, n_out);
    put(c, "dx", ST_F32, dx, T, n_in);
    put(c, "dx_acc", ST_F32, dx_acc, T, n_in);
    put(c, "dw", ST_F32, dw, n_out, n_in);
}

static void run_rope(const Ops *o)
{
    const char *c = "rope";
    int64_t T = 7;
    int heads = 3, hd = 8;
    int32_t *pos = take((size_t)T * sizeof *pos);
    const int32_t p[7] = {0, 1, 2, 17, 511, 4095, 65000};
    memcpy(pos, p, sizeof p);
    float *inv_freq = take((size_t)(hd / 2) * sizeof *inv_freq);
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = (float)pow(10000.0, -2.0 * i / hd);
    /* rows of heads + 1 heads, the first `heads` rotated (q|k of a fused row; the last is v) */
    int64_t W = (int64_t)(heads + 1) * hd;
    float *x = uniform(T * W, -1, 1), *y = copy_of(x, T * W), *back = take((size_t)(T * W) * 4);
    o->rope_fwd((Act *)y, W, pos, T, heads, hd, inv_freq, 1.0f);
    o->rope_bwd((Act *)back, W, x, W, W, pos, T, heads, hd, inv_freq, 1.0f); /* back = x rotated back */
    put(c, "positions", ST_I32, pos, 0, T);
    put(c, "inv_freq", ST_F32, inv_freq, 0, hd / 2);
    put(c, "x", ST_F32, x, T, W);
    put(c, "out", ST_F32, y, T, W);
    put(c, "inverse", ST_F32, back, T, W);
    meta(c, "n_heads", heads);
}

/* q, k, v (and their gradients) at the given row strides and column offsets; segments as
 * (q_row, q_len, kv_row, kv_len) quadruples. */
static void run_attention(const Ops *o, const char *c, int64_t Tq, int64_t Tkv, int fused, const int64_t *seg,
                          int n_segs)
{
    int H = 4, Hkv = 2, hd = 8;
    int64_t wq = (int64_t)H * hd, wkv = (int64_t)Hkv * hd;
    /* fused: one [T, q | k | v] array, as a fused QKV product makes; else three arrays. */
    int64_t qs = fused ? wq + 2 * wkv : wq, kvs = fused ? wq + 2 * wkv : wkv;
    float *qkv = uniform(Tq * qs + (fused ? 0 : 2 * Tkv * kvs), -1.5f, 1.5f);
    float *q = qkv, *k = fused ? qkv + wq : qkv + Tq * qs, *v = fused ? qkv + wq + wkv : k + Tkv * kvs;
    float *y = take((size_t)(Tq * wq) * 4), *lse = take((size_t)(Tq * H) * 4), *dout = uniform(Tq * wq, -1, 1);
    int64_t n_all = Tq * qs + (fused ? 0 : 2 * Tkv * kvs);
    float *dqkv = take((size_t)n_all * 4);
    float *dq = dqkv, *dk = fused ? dqkv + wq : dqkv + Tq * qs, *dv = fused ? dqkv + wq + wkv : dk + Tkv * kvs;
    AttnSegment *segs = take((size_t)n_segs * sizeof *segs);
    int64_t *seg_copy = take((size_t)(4 * n_segs) * sizeof *seg_copy);
    for (int i = 0; i < n_segs; i++) {
        segs[i] = (AttnSegment){seg[4 * i], seg[4 * i + 1], seg[4 * i + 2], seg[4 * i + 3], 0};
        memcpy(seg_copy + 4 * i, seg + 4 * i, 4 * sizeof *seg);
    }
    AttnShape shape = {H, Hkv, hd, qs, kvs, wq};
    const Act *qa = (const Act *)q, *ka = (const Act *)k, *va = (const Act *)v;
    o->attention_fwd((Act *)y, lse, qa, ka, va, segs, n_segs, shape);
    o->attention_bwd(dq, dk, dv, (const Act *)dout, (const Act *)y, lse, qa, ka, va, segs, n_segs, shape);
    /* Written back as plain [rows, heads * head_dim] arrays. */
    float *arr[6] = {take((size_t)(Tq * wq) * 4), take((size_t)(Tkv * wkv) * 4), take((size_t)(Tkv * wkv) * 4),
                     take((size_t)(Tq * wq) * 4), take((size_t)(Tkv * wkv) * 4), take((size_t)(Tkv * wkv) * 4)};
    const float *src[6] = {q, k, v, dq, dk, dv};
    const char *names[6] = {"q", "k", "v", "dq", "dk", "dv"};
    for (int a = 0; a < 6; a++) {
        int is_q = a % 3 == 0;
        int64_t rows = is_q ? Tq : Tkv, width = is_q ? wq : wkv, stride = is_q ? qs : kvs;
        for (int64_t r = 0; r < rows; r++)
            memcpy(arr[a] + r * width, src[a] + r * stride, (size_t)width * 4);
        put(c, names[a], ST_F32, arr[a], rows, width);
    }
    put(c, "out", ST_F32, y, Tq, wq);
    put(c, "lse", ST_F32, lse, Tq, H);
    put(c, "dout", ST_F32, dout, Tq, wq);
    put(c, "segments", ST_I64, seg_copy, n_segs, 4);
    meta(c, "n_heads", H);
    meta(c, "n_kv_heads", Hkv);
}

static void run_swiglu(const Ops *o)
{
    const char *c = "swiglu";
    int64_t T = 4, F = 6, n = T * F;
    float *g = uniform(n, -4, 4), *u = uniform(n, -2, 2), *dout = uniform(n, -1, 1);
    g[0] = -30, g[1] = 30, g[2] = -90, g[3] = 0; /* the tails of the sigmoid */
    /* row t of gu: the gates, then the ups (the fused gate|up product's layout) */
    float *gu = take((size_t)(2 * n) * 4), *y = take((size_t)n * 4), *dgu = take((size_t)(2 * n) * 4);
    for (int64_t t = 0; t < T; t++) {
        memcpy(gu + t * 2 * F, g + t * F, (size_t)F * 4);
        memcpy(gu + t * 2 * F + F, u + t * F, (size_t)F * 4);
    }
    o->swiglu_fwd((Act *)y, (const Act *)gu, T, F);
    o->swiglu_bwd((Act *)dgu, dout, (const Act *)gu, T, F);
    float *dg = take((size_t)n * 4), *du = take((size_t)n * 4);
    for (int64_t t = 0; t < T; t++) {
        memcpy(dg + t * F, dgu + t * 2 * F, (size_t)F * 4);
        memcpy(du + t * F, dgu + t * 2 * F + F, (size_t)F * 4);
    }
    put(c, "gate", ST_F32, g, T, F);
    put(c, "up", ST_F32, u, T, F);
    put(c, "dout", ST_F32, dout, T, F);
    put(c, "out", ST_F32, y, T, F);
    put(c, "dgate", ST_F32, dg, T, F);
    put(c, "dup", ST_F32, du, T, F);
}

static void run_cross_entropy(const Ops *o)
{
    const char *c = "ce";
    int64_t T = 6, V = 7, vocab0 = 3;
    float *z = uniform(T * V, -4, 4), dloss = 0.37f;
    z[2 * V + 4] = 25; /* a confident row: p near 1 at its target */
    int32_t *targets = take((size_t)T * sizeof *targets);
    const int32_t tg[6] = {3, 9, 7, 1, -1, 12}; /* inside [3, 10), outside below and above, none */
    memcpy(targets, tg, sizeof tg);
    double *mx = take((size_t)T * 8), *sum = take((size_t)T * 8), *zt = take((size_t)T * 8), *lse = take((size_t)T * 8);
    double *stats = take((size_t)(3 * T) * 8);
    o->ce_stats(stats, z, targets, T, V, vocab0, 1); /* max, sum exp(z - max), z_target of each row */
    for (int64_t t = 0; t < T; t++)
        mx[t] = stats[3 * t], sum[t] = stats[3 * t + 1], zt[t] = stats[3 * t + 2];
    /* The gradient against a given lse (as if the other ranks' columns added to the sum). */
    for (int64_t t = 0; t < T; t++)
        lse[t] = mx[t] + log(sum[t]) + 0.25 * (double)t;
    float *dz = take((size_t)(T * V) * 4);
    o->ce_grad((Act *)dz, z, lse, targets, T, V, vocab0, dloss);
    put(c, "logits", ST_F32, z, T, V);
    put(c, "targets", ST_I32, targets, 0, T);
    put(c, "row_max", ST_F64, mx, 0, T);
    put(c, "row_sumexp", ST_F64, sum, 0, T);
    put(c, "target_logit", ST_F64, zt, 0, T);
    put(c, "lse", ST_F64, lse, 0, T);
    put(c, "dlogits", ST_F32, dz, T, V);
    meta(c, "vocab0", (double)vocab0);
    meta(c, "dloss", dloss);
}

static void run_rows(const Ops *o)
{
    const char *c = "rows";
    int64_t n = 5, width = 3, src_rows = 8;
    int64_t *rows = take((size_t)n * sizeof *rows);
    const int64_t r[5] = {6, 0, 3, 7, 2};
    memcpy(rows, r, sizeof r);
    float *src = uniform(src_rows * width, -1, 1), *gathered = take((size_t)(n * width) * 4);
    float *dst = uniform(src_rows * width, -1, 1);
    put(c, "dst_before", ST_F32, copy_of(dst, src_rows * width), src_rows, width);
    o->copy_rows(gathered, DT_F32, width, NULL, src, DT_F32, width, rows, n, width); /* gather */
    o->copy_rows(dst, DT_F32, width, rows, gathered, DT_F32, width, NULL, n, width); /* scatter */
    put(c, "rows", ST_I64, rows, 0, n);
    put(c, "src", ST_F32, src, src_rows, width);
    put(c, "gathered", ST_F32, gathered, n, width);
    put(c, "scattered", ST_F32, dst, src_rows, width);
}

static void run_vec(const Ops *o)
{
    const char *c = "vec";
    int64_t n = 37;
    float *a = uniform(n, -2, 2), *b = uniform(n, -2, 2), *sum = take((size_t)n * 4), *inplace = copy_of(a, n);
    float *copied = take((size_t)n * 4), *zeroed = uniform(n, -1, 1);
    o->add(sum, a, b, n);
    o->add(inplace, inplace, b, n); /* out may be a */
    o->copy(copied, b, n);
    o->zero(zeroed, n);
    double *ss = take(sizeof *ss);
    *ss = o->sum_squares(a, n);
    put(c, "a", ST_F32, a, 0, n);
    put(c, "b", ST_F32, b, 0, n);
    put(c, "add", ST_F32, sum, 0, n);
    put(c, "add_inplace", ST_F32, inplace, 0, n);
    put(c, "copy", ST_F32, copied, 0, n);
    put(c, "zero", ST_F32, zeroed, 0, n);
    put(c, "sum_squares", ST_F64, ss, 0, 1);
}

static void run_adamw(const Ops *o)
{
    const char *c = "adamw";
    int64_t n = 25;
    float *p = uniform(n, -1, 1), *g = uniform(n, -0.1f, 0.1f), *m = uniform(n, -0.05f, 0.05f);
    float *v = uniform(n, 0, 0.01f);
    g[0] = 0;
    /* Fresh moments and tiny gradients: sqrt(v) of the order of eps, where eps's place matters. */
    for (int i = 1; i < 5; i++)
        g[i] = 1e-7f * (float)i, m[i] = 0, v[i] = 0;
    put(c, "p_before", ST_F32, copy_of(p, n), 0, n);
    put(c, "m_before", ST_F32, copy_of(m, n), 0, n);
    put(c, "v_before", ST_F32, copy_of(v, n), 0, n);
    AdamWStep s = {0.01f, 0.9f, 0.95f, 1e-8f, 1 - 0.9f * 0.9f * 0.9f, 1 - 0.95f * 0.95f * 0.95f, 0.5f};
    /* weight decay on [0, 9) and [16, 25) (matrices), none on [9, 16) (a norm's weights) */
    AdamWSpan spans[3] = {{0, 9, 0.1f}, {9, 16, 0}, {16, 25, 0.1f}};
    float *wd = take((size_t)n * 4), *p_act = take((size_t)n * 4);
    for (int i = 0; i < 3; i++)
        for (int64_t j = spans[i].begin; j < spans[i].end; j++)
            wd[j] = spans[i].weight_decay;
    o->adamw(p, g, m, v, (Act *)p_act, n, spans, 3, s);
    put(c, "weight_decay", ST_F32, wd, 0, n);
    put(c, "p_act", ST_F32, p_act, 0, n);
    put(c, "g", ST_F32, g, 0, n);
    put(c, "p", ST_F32, p, 0, n);
    put(c, "m", ST_F32, m, 0, n);
    put(c, "v", ST_F32, v, 0, n);
    meta(c, "lr", s.lr);
    meta(c, "beta1", s.beta1);
    meta(c, "beta2", s.beta2);
    meta(c, "eps", s.eps);
    meta(c, "grad_scale", s.grad_scale);
    meta(c, "bias1", s.bias1);
    meta(c, "bias2", s.bias2);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: dump_ops OUT.safetensors\n", stderr);
        return 2;
    }
    const Ops *o = cpu_ops();
    rng_seed(&rng, 20261122);
    run_embedding(o);
    run_rmsnorm(o, "rmsnorm_small_eps", 5, 16, 1e-5f, 1.0f);
    run_rmsnorm(o, "rmsnorm_large_eps", 4, 16, 0.25f, 0.5f);
    run_rmsnorm(o, "rmsnorm_tiny_rows", 4, 16, 1e-5f, 3e-3f);
    run_matmul(o);
    run_rope(o);
    /* Three documents of 5, 1 and 6 tokens, self-attention. */
    const int64_t docs[] = {0, 5, 0, 5, 5, 1, 5, 1, 6, 6, 6, 6};
    run_attention(o, "attention_docs", 12, 12, 1, docs, 3);
    /* A CP rank's view: its 7 query rows against 16 gathered key rows; a document whose first chunk
     * (rows 0-2, keys 0-2) and last chunk (rows 3-5, keys 0-12, the 10 before them elsewhere) are
     * both here, and a short whole document (row 6, key 15). */
    const int64_t cp[] = {0, 3, 0, 3, 3, 3, 0, 13, 6, 1, 15, 1};
    run_attention(o, "attention_cp", 7, 16, 0, cp, 3);
    run_swiglu(o);
    run_cross_entropy(o);
    run_rows(o);
    run_vec(o);
    run_adamw(o);
    if (st_write(&out, argv[1], &err) != 0)
        die();
    st_writer_free(&out);
    return 0;
}
