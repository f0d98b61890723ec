/*
 * bench/kept_bf16.c - what keeping the float32 tensors a layer keeps for its backward in bf16 would
 * change in the gradients, measured with the CPU backend's bf16 emulation (no GPU needed: the CPU
 * bf16 table rounds where the GPU's kernels round).
 *
 * Under train.recompute: full a layer keeps only its input x (a row of the residual stream,
 * float32); under selective and none also y, the stream after the attention block (float32); the
 * rest of what is kept is already in the compute dtype. The stream itself must stay float32 (every
 * layer adds to it), but the copy kept for the backward could be rounded to bf16, halving those
 * bytes. This program runs one forward and backward of a small Llama on a mix of documents with
 * train.precision: bf16 and measures, per weight tensor, the relative error of the gradient
 * ||g - g_ref|| / ||g_ref|| (the worst tensor and the median), for:
 *   fp32 vs bf16 compute     the difference bf16 training already makes (the yardstick)
 *   full, x kept in bf16     every kept layer input (and the final norm's input) rounded to bf16
 *                            after the forward, before the backward recomputes from it
 *   selective, x and y bf16  the same with y rounded too
 * against the same run with them kept in float32. The loss does not change (the forward is done).
 *
 * Usage: kept_bf16 [--seeds N] [--tokens T]. Prints a table; run by hand (README/docs say where the
 * figures are used).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "engine/model/model.h"
#include "util/bf16.h"
#include "util/parse.h"
#include "util/rng.h"

static void die(const char *msg)
{
    fprintf(stderr, "wlbtrain: error: kept_bf16: %s\n", msg);
    exit(2);
}

/* A flag's whole-number value in [lo, hi]. */
static int64_t arg_int(const char *name, const char *text, int64_t lo, int64_t hi)
{
    int64_t v;
    if (parse_int64(text, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "wlbtrain: error: kept_bf16: %s: '%s' is not a whole number in [%lld, %lld]\n", name, text,
                (long long)lo, (long long)hi);
        exit(2);
    }
    return v;
}

enum { VOCAB = 512 };
static const char model_yaml[] = "model: {n_layers: 4, d_model: 256, n_heads: 8, n_kv_heads: 4, d_ffn: 688, "
                                 "vocab_size: 512, rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, "
                                 "max_seq_len: 4096}\nparallel: {dp: 1}\ntrain: {device: cpu}\n";

/* A micro-batch of documents of random lengths (16 .. 400 tokens) filling T rows. */
typedef struct Batch {
    int32_t *tokens, *targets, *positions;
    AttnSegment *segs;
    ModelBatch b;
} Batch;

static void make_batch(Batch *bt, int64_t T, uint64_t seed)
{
    Rng rng;
    rng_seed(&rng, seed);
    bt->tokens = malloc((size_t)T * sizeof *bt->tokens);
    bt->targets = malloc((size_t)T * sizeof *bt->targets);
    bt->positions = malloc((size_t)T * sizeof *bt->positions);
    bt->segs = malloc((size_t)T * sizeof *bt->segs);
    if (!bt->tokens || !bt->targets || !bt->positions || !bt->segs)
        die("out of memory");
    int64_t at = 0, n = 0;
    while (at < T) {
        int64_t len = 16 + (int64_t)rng_below(&rng, 385);
        len = len < T - at ? len : T - at;
        for (int64_t j = 0; j < len; j++) {
            bt->tokens[at + j] = (int32_t)rng_below(&rng, VOCAB);
            bt->positions[at + j] = (int32_t)j;
        }
        for (int64_t j = 0; j < len; j++)
            bt->targets[at + j] = j + 1 < len ? bt->tokens[at + j + 1] : -1;
        bt->segs[n++] = (AttnSegment){at, len, at, len, 0};
        at += len;
    }
    bt->b = (ModelBatch){.T = T, .tokens = bt->tokens, .targets = bt->targets, .positions = bt->positions,
                         .segs = bt->segs, .n_segs = n, .T_mb = T};
}

static void free_batch(Batch *bt)
{
    free(bt->tokens);
    free(bt->targets);
    free(bt->positions);
    free(bt->segs);
}

static void round_bf16(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = bf16_to_float(bf16_from_float(x[i]));
}

enum { KEEP_F32, KEEP_X, KEEP_XY };

/* One forward and backward; the kept tensors rounded to bf16 in between as `keep` says. Returns the
 * gradients (malloc'd). */
static float *grads_of(const Ops *ops, Recompute r, int keep, const Batch *bt, int64_t *n_params, Model *out_model)
{
    Config cfg;
    Error err = {0};
    config_init(&cfg);
    if (config_load_string(&cfg, model_yaml, "kept_bf16", &err) != 0 || config_resolve(&cfg, 0, &err) != 0)
        die(err.msg);
    Model *m = out_model;
    double loss;
    if (model_init(m, &cfg.model, ops, NULL, r, &err) != 0 || model_init_weights(m, 11, &err) != 0 ||
        model_forward(m, 0, &bt->b, NULL, 1, 1.0f / (float)bt->b.T, &loss, &err) != 0)
        die(err.msg);
    ModelSlot *s = &m->slots[0];
    int layers = m->dims.layer_end - m->dims.layer_begin;
    for (int i = 0; keep != KEEP_F32 && i <= layers; i++) /* the host is the CPU backend's memory */
        round_bf16(s->h[i], bt->b.T * m->dims.d);
    for (int i = 0; keep == KEEP_XY && i < layers; i++)
        round_bf16(s->layers[i].y, bt->b.T * m->dims.d);
    if (model_backward(m, 0, &bt->b, NULL, &err) != 0)
        die(err.msg);
    float *g = malloc((size_t)m->n_params * sizeof *g);
    if (!g)
        die("out of memory");
    memcpy(g, m->grads, (size_t)m->n_params * sizeof *g);
    *n_params = m->n_params;
    config_free(&cfg);
    return g;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per weight tensor ||g - ref|| / ||ref||: the worst and the median. */
static void compare(const Model *m, const float *g, const float *ref, double *worst, double *median)
{
    double e[64];
    int n = 0;
    for (int i = 0; i < m->n_tensors && n < 64; i++) {
        const ModelTensor *t = &m->tensors[i];
        double num = 0, den = 0;
        for (int64_t k = t->offset; k < t->offset + t->rows * t->cols; k++) {
            num += ((double)g[k] - ref[k]) * ((double)g[k] - ref[k]);
            den += (double)ref[k] * ref[k];
        }
        e[n++] = den > 0 ? sqrt(num / den) : 0;
    }
    qsort(e, (size_t)n, sizeof *e, by_value);
    *worst = e[n - 1];
    *median = e[n / 2];
}

int main(int argc, char **argv)
{
    int seeds = 3;
    int64_t T = 2048;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            seeds = (int)arg_int("--seeds", argv[++i], 1, 100);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            T = arg_int("--tokens", argv[++i], 16, 1 << 16);
        else
            die("usage: kept_bf16 [--seeds N] [--tokens T]");
    }
    printf("kept tensors in bf16: gradient error per weight tensor, ||g - g_ref|| / ||g_ref||, worst / median\n");
    printf("(CPU backend, bf16 emulated; 4 layers, d_model 256, documents of 16-400 tokens, %lld tokens)\n",
           (long long)T);
    printf("%-6s %-26s %-26s %-26s\n", "seed", "fp32 vs bf16 compute", "full: x kept in bf16",
           "selective: x, y in bf16");
    for (int seed = 1; seed <= seeds; seed++) {
        Batch bt;
        make_batch(&bt, T, (uint64_t)seed);
        Model m32, m16, mx, mxy, sel;
        int64_t n;
        float *g32 = grads_of(cpu_ops(), RECOMPUTE_FULL, KEEP_F32, &bt, &n, &m32);
        float *g16 = grads_of(cpu_ops_bf16(), RECOMPUTE_FULL, KEEP_F32, &bt, &n, &m16);
        float *gx = grads_of(cpu_ops_bf16(), RECOMPUTE_FULL, KEEP_X, &bt, &n, &mx);
        float *gs = grads_of(cpu_ops_bf16(), RECOMPUTE_SELECTIVE, KEEP_F32, &bt, &n, &sel);
        float *gxy = grads_of(cpu_ops_bf16(), RECOMPUTE_SELECTIVE, KEEP_XY, &bt, &n, &mxy);
        double w[3], md[3];
        compare(&m32, g16, g32, &w[0], &md[0]);
        compare(&m16, gx, g16, &w[1], &md[1]);
        compare(&sel, gxy, gs, &w[2], &md[2]);
        printf("%-6d %.2e / %.2e        %.2e / %.2e        %.2e / %.2e\n", seed, w[0], md[0], w[1], md[1], w[2],
               md[2]);
        free(g32);
        free(g16);
        free(gx);
        free(gs);
        free(gxy);
        model_free(&m32);
        model_free(&m16);
        model_free(&mx);
        model_free(&sel);
        model_free(&mxy);
        free_batch(&bt);
    }
    return 0;
}
