/*
 * bench/attn_kernels.c - times one backend's attention over a document mix: forward, and forward +
 * backward, in TFLOP/s counted on the causal pairs within documents (forward 4 D H per pair, the
 * backward 2.5 times the forward), the count bench/attn_torch.py uses for the PyTorch kernels.
 *
 * Usage: attn_kernels SEGMENTS [--device cuda|cpu] [--heads H] [--kv-heads HKV] [--dim D]
 *                    [--iters N] [--deterministic 0|1] [--attention own|cudnn]
 * SEGMENTS: one segment a line, "q_row q_len kv_row kv_len" (a document alone: q_row = kv_row,
 * q_len = kv_len). --attention: the CUDA backend's bf16 kernels (train.attention; own by default),
 * cudnn = cuDNN's fused attention (an error where the build or the machine has none). Prints one JSON
 * line per measurement. Run by bench/attention_kernels.sh.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "util/clock.h"

static void die(const char *msg)
{
    fprintf(stderr, "wlbtrain: error: attn_kernels: %s\n", msg);
    exit(2);
}

static long arg_long(const char *name, const char *text, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: '%s' is not a whole number in [%ld, %ld]", name, text, lo, hi);
        die(msg);
    }
    return v;
}

/* The segments of the file, and the rows they span. */
static AttnSegment *read_segments(const char *path, int64_t *n_out, int64_t *rows_out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot open the segment file");
    AttnSegment *s = NULL;
    int64_t n = 0, cap = 0, rows = 0;
    long long a, b, c, d;
    int got;
    while ((got = fscanf(f, "%lld %lld %lld %lld", &a, &b, &c, &d)) == 4) {
        if (a < 0 || b < 0 || c < 0 || d < b)
            die("a segment needs q_row, q_len, kv_row >= 0 and kv_len >= q_len");
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            AttnSegment *g = realloc(s, (size_t)cap * sizeof *s);
            if (!g)
                die("out of memory");
            s = g;
        }
        s[n++] = (AttnSegment){a, b, c, d, 0};
        rows = a + b > rows ? a + b : rows;
        rows = c + d > rows ? c + d : rows;
    }
    if (got != EOF || ferror(f) || n == 0)
        die("the segment file holds lines of four whole numbers, one segment a line");
    fclose(f);
    *n_out = n;
    *rows_out = rows;
    return s;
}

/* A backend array of n elements of the compute dtype, filled with small pseudo-random values. */
static Act *random_act(const Ops *o, int64_t n, unsigned seed)
{
    float *h = malloc((size_t)n * sizeof *h);
    float *d = o->alloc((size_t)n * sizeof *d);
    Act *a = o->alloc((size_t)n * o->act_bytes);
    if (!h || !d || !a)
        die("out of memory for the inputs");
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    o->to_device(d, h, (size_t)n * sizeof *d);
    ops_cast(o, a, DT_ACT, d, DT_F32, n);
    o->free(d);
    free(h);
    return a;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: attn_kernels SEGMENTS [--device cuda|cpu] [--heads H] [--kv-heads HKV] [--dim D] [--iters N] "
            "[--deterministic 0|1] [--attention own|cudnn]");
    const char *device = "cuda";
    int H = 32, Hkv = 8, D = 64, iters = 10, det = 1;
    BackendAttention attention = BACKEND_ATTN_OWN;
    for (int i = 2; i < argc; i += 2) {
        if (i + 1 >= argc)
            die("an option without its value");
        if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--heads"))
            H = (int)arg_long("--heads", argv[i + 1], 1, 1024);
        else if (!strcmp(argv[i], "--kv-heads"))
            Hkv = (int)arg_long("--kv-heads", argv[i + 1], 1, 1024);
        else if (!strcmp(argv[i], "--dim"))
            D = (int)arg_long("--dim", argv[i + 1], 8, 512);
        else if (!strcmp(argv[i], "--iters"))
            iters = (int)arg_long("--iters", argv[i + 1], 1, 100000);
        else if (!strcmp(argv[i], "--deterministic"))
            det = (int)arg_long("--deterministic", argv[i + 1], 0, 1);
        else if (!strcmp(argv[i], "--attention") && !strcmp(argv[i + 1], "own"))
            attention = BACKEND_ATTN_OWN;
        else if (!strcmp(argv[i], "--attention") && !strcmp(argv[i + 1], "cudnn"))
            attention = BACKEND_ATTN_CUDNN;
        else if (!strcmp(argv[i], "--attention"))
            die("--attention takes own or cudnn");
        else
            die("unknown option");
    }
    if (H % Hkv)
        die("--heads is not a multiple of --kv-heads");
    int64_t n, T;
    AttnSegment *segs = read_segments(argv[1], &n, &T);
    const Backend *b = backend_find(device);
    if (!b)
        die("no such backend in this build");
    Error err = {0};
    BackendOpen how = {0, 1, det, attention};
    const Ops *o = b->open(&how, &err);
    if (!o && attention == BACKEND_ATTN_CUDNN) { /* a row of the table that says why */
        printf("{\"kernel\": \"wlbtrain %s cudnn\", \"skipped\": \"", device);
        for (const char *c = err.msg; *c; c++)
            putchar(*c == '"' ? '\'' : *c == '\\' ? '/' : (unsigned char)*c < 32 ? ' ' : *c);
        printf("\"}\n");
        free(segs);
        return 0;
    }
    if (!o)
        die(err.msg);

    /* q, k, v as columns of one fused [T, (H + 2 Hkv) D] array, as the model lays them out */
    const int64_t Qw = (int64_t)(H + 2 * Hkv) * D, Ow = (int64_t)H * D;
    AttnShape shape = {H, Hkv, D, Qw, Qw, Ow};
    Act *qkv = random_act(o, T * Qw, 1), *dout = random_act(o, T * Ow, 2), *out = random_act(o, T * Ow, 3);
    const Act *q = qkv, *k = ops_act(o, qkv, (int64_t)H * D), *v = ops_act(o, qkv, (int64_t)(H + Hkv) * D);
    float *lse = o->alloc((size_t)(T * H) * sizeof(float)), *g = o->alloc((size_t)(T * Qw) * sizeof(float));
    if (!lse || !g)
        die("out of memory for the outputs");

    double pairs = 0;
    for (int64_t i = 0; i < n; i++) /* query j of a segment sees kv_len - q_len + j + 1 keys */
        pairs += (double)segs[i].q_len * (double)(segs[i].kv_len - segs[i].q_len) +
                 (double)segs[i].q_len * (double)(segs[i].q_len + 1) / 2;
    const double fwd_flop = 4.0 * D * H * pairs, bwd_flop = 2.5 * fwd_flop;

    double t_fwd = 0, t_all = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0 warms up (plans, caches, clocks) */
        int reps = pass ? iters : 2;
        o->sync();
        double t0 = clock_seconds();
        for (int r = 0; r < reps; r++)
            o->attention_fwd(out, lse, q, k, v, segs, n, shape);
        o->sync();
        double t1 = clock_seconds();
        for (int r = 0; r < reps; r++) {
            o->attention_fwd(out, lse, q, k, v, segs, n, shape);
            o->zero(g, T * Qw);
            o->attention_bwd(g, g + (int64_t)H * D, g + (int64_t)(H + Hkv) * D, dout, out, lse, q, k, v, segs, n,
                             shape);
        }
        o->sync();
        double t2 = clock_seconds();
        t_fwd = (t1 - t0) / reps;
        t_all = (t2 - t1) / reps;
    }
    /* cuDNN's deterministic backward, or the own one where cuDNN declines it (a line on stderr says) */
    const char *bwd = !det ? " (atomic backward)" : attention == BACKEND_ATTN_CUDNN ? " (deterministic backward)" : "";
    printf("{\"kernel\": \"wlbtrain %s%s%s\", \"rows\": %lld, \"segments\": %lld, \"pairs\": %.0f, "
           "\"fwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"fwdbwd_ms\": %.4f, \"fwdbwd_tflops\": %.2f}\n",
           device, attention == BACKEND_ATTN_CUDNN ? " cudnn" : "", bwd, (long long)T, (long long)n, pairs, t_fwd * 1e3,
           fwd_flop / t_fwd / 1e12, t_all * 1e3, (fwd_flop + bwd_flop) / t_all / 1e12);
    o->free(qkv), o->free(dout), o->free(out), o->free(lse), o->free(g);
    if (b->close)
        b->close();
    free(segs);
    return 0;
}
