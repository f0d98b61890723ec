/*
 * engine/train/train_calibrate.c - `wlbtrain calibrate` (see calibrate.h): time the layer's work on
 * the device, fit the cost model's rates, write the profile.
 */
#include "engine/train/calibrate.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "engine/plan/cost.h"
#include "engine/train/train.h"
#include "util/clock.h"
#include "util/fileio.h"
#include "util/jsonfile.h"

enum { CAL_SIZES = 4, CAL_MIXES = 8, CAL_REPS = 5 };

/* The shapes of one layer on one rank, and buffers for a micro-batch of up to W tokens. */
typedef struct Cal {
    const Ops *o;
    CostModel cm; /* the cost model of the config (its profile, no calibration file): FLOP and byte counts */
    int64_t W;
    int64_t d, hq, hkv, dh, f, q_width; /* q_width: q + k + v columns */
    int64_t n_in[4], n_out[4];          /* the layer's four products */
    Act *x, *w, *y, *dy, *qkv, *att, *gu, *s, *dgu, *q, *k, *v, *o_att, *d_att, *a_norm;
    float *dx, *dw, *xf, *gf, *rstd, *norm_w, *dnorm_w, *dq, *dk, *dv, *lse, *inv_freq;
    int32_t *positions;
    AttnSegment *segs; /* host */
    int64_t n_segs;
    uint64_t rng;      /* the inputs' values and the mixes' lengths */
} Cal;

/* ---------------------------------------------------------------------------------------------- */
/* Buffers                                                                                         */

/* Uniform in [-0.5, 0.5): a 64-bit LCG (Knuth's constants), its top 24 bits. */
static float cal_uniform(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) - 0.5f;
}

/* n elements of small random values (float32, or the compute dtype when act), in the backend's
 * memory. On a device, the compute dtype is cast from a float32 array there (stage): ops_cast
 * converts between arrays of the backend's memory. */
static void *cal_alloc(Cal *c, int64_t n, int act, float *host, float *stage, int *failed)
{
    if (*failed)
        return NULL;
    void *p = c->o->alloc((size_t)n * (act ? c->o->act_bytes : sizeof(float)));
    if (!p) {
        *failed = 1;
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        host[i] = 0.1f * cal_uniform(&c->rng);
    if (act && c->o->host_memory) {
        ops_cast(c->o, p, DT_ACT, host, DT_F32, n);
    } else if (act) {
        c->o->to_device(stage, host, (size_t)n * sizeof(float));
        ops_cast(c->o, p, DT_ACT, stage, DT_F32, n);
    } else {
        c->o->to_device(p, host, (size_t)n * sizeof(float));
    }
    return p;
}

static int cal_buffers(Cal *c, Error *err)
{
    int64_t W = c->W, max_in = 0, max_out = 0;
    for (int i = 0; i < 4; i++) {
        max_in = c->n_in[i] > max_in ? c->n_in[i] : max_in;
        max_out = c->n_out[i] > max_out ? c->n_out[i] : max_out;
    }
    int64_t big = W * (max_in > max_out ? max_in : max_out);
    big = big > max_in * max_out ? big : max_in * max_out;
    big = big > W * 2 * c->f ? big : W * 2 * c->f;
    big = big > W * c->q_width ? big : W * c->q_width;
    float *host = malloc((size_t)big * sizeof *host);
    int32_t *pos = malloc((size_t)W * sizeof *pos);
    c->segs = malloc((size_t)W * sizeof *c->segs);
    if (!host || !pos || !c->segs) {
        free(host);
        free(pos);
        return error_runtime(err, "calibrate", "out of memory");
    }
    int failed = 0;
    /* A staged Act copy goes through a float buffer of the backend on a device (ops_cast converts
     * between arrays of the backend's memory): fill a float array there first. */
    float *stage = c->o->host_memory ? NULL : c->o->alloc((size_t)big * sizeof(float));
    if (!c->o->host_memory && !stage)
        failed = 1;
#define ACT(n) ((Act *)cal_alloc(c, (n), 1, host, stage, &failed))
#define F32(n) ((float *)cal_alloc(c, (n), 0, host, stage, &failed))
    c->x = ACT(W * max_in);
    c->w = ACT(max_in * max_out);
    c->y = ACT(W * max_out);
    c->dy = ACT(W * max_out);
    c->dx = F32(W * max_in);
    c->dw = F32(max_in * max_out);
    c->xf = F32(W * c->d);
    c->gf = F32(W * (c->q_width > c->d ? (c->q_width > c->f ? c->q_width : c->f) : (c->d > c->f ? c->d : c->f)));
    c->rstd = F32(W);
    c->norm_w = F32(c->d);
    c->dnorm_w = F32(c->d);
    c->a_norm = ACT(W * c->d);
    c->qkv = ACT(W * c->q_width);
    c->gu = ACT(W * 2 * c->f);
    c->dgu = ACT(W * 2 * c->f);
    c->s = ACT(W * c->f);
    c->q = ACT(W * c->hq * c->dh);
    c->k = ACT(W * c->hkv * c->dh);
    c->v = ACT(W * c->hkv * c->dh);
    c->o_att = ACT(W * c->hq * c->dh);
    c->d_att = ACT(W * c->hq * c->dh);
    c->dq = F32(W * c->hq * c->dh);
    c->dk = F32(W * c->hkv * c->dh);
    c->dv = F32(W * c->hkv * c->dh);
    c->lse = F32(W * c->hq);
    c->inv_freq = F32(c->dh / 2);
#undef ACT
#undef F32
    if (!failed) {
        for (int64_t t = 0; t < W; t++)
            pos[t] = (int32_t)t;
        c->positions = c->o->alloc((size_t)W * sizeof *pos);
        if (c->positions)
            c->o->to_device(c->positions, pos, (size_t)W * sizeof *pos);
        else
            failed = 1;
    }
    c->o->free(stage);
    free(host);
    free(pos);
    return failed ? error_runtime(err, "calibrate", "out of device memory for a window of %lld tokens "
                                  "(set data.context_window lower)", (long long)W) : 0;
}

static void cal_free(Cal *c)
{
    void *ps[] = {c->x, c->w, c->y, c->dy, c->dx, c->dw, c->xf, c->gf, c->rstd, c->norm_w, c->dnorm_w, c->a_norm,
                  c->qkv, c->gu, c->dgu, c->s, c->q, c->k, c->v, c->o_att, c->d_att, c->dq, c->dk, c->dv, c->lse,
                  c->inv_freq, c->positions};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i])
            c->o->free(ps[i]);
    free(c->segs);
}

/* ---------------------------------------------------------------------------------------------- */
/* What is timed                                                                                   */

typedef enum CalJob { JOB_PRODUCTS, JOB_ELEMENTWISE, JOB_ATTN_FWD, JOB_ATTN_BWD } CalJob;

static AttnShape cal_attn_shape(const Cal *c)
{
    AttnShape sh = {(int)c->hq, (int)c->hkv, (int)c->dh, c->hq * c->dh, c->hkv * c->dh, c->hq * c->dh};
    return sh;
}

/* One run of a job over T tokens (attention: over the segments in c->segs). */
static void cal_run(Cal *c, CalJob job, int64_t T)
{
    const Ops *o = c->o;
    switch (job) {
    case JOB_PRODUCTS: /* the layer's products, forward and backward (dx and dw), as model_pass.c runs them */
        for (int i = 0; i < 4; i++) {
            o->matmul_fwd(mat_act(c->y), c->x, c->w, T, c->n_in[i], c->n_out[i]);
            o->matmul_bwd_dx(mat_f32(c->dx), c->dy, c->w, T, c->n_in[i], c->n_out[i]);
            o->matmul_bwd_dw(c->dw, c->dy, c->x, T, c->n_in[i], c->n_out[i]);
        }
        break;
    case JOB_ELEMENTWISE: /* two RMSNorms, RoPE on q and k, SwiGLU; forward and backward */
        for (int i = 0; i < 2; i++)
            o->rmsnorm_fwd(c->a_norm, c->rstd, c->xf, c->norm_w, T, c->d, 1e-5f);
        o->rope_fwd(c->qkv, c->q_width, c->positions, T, (int)(c->hq + c->hkv), (int)c->dh, c->inv_freq, 1.0f);
        o->swiglu_fwd(c->s, c->gu, T, c->f);
        o->swiglu_bwd(c->dgu, c->gf, c->gu, T, c->f);
        o->zero(c->gf, T * c->q_width);
        o->rope_bwd(c->qkv, c->q_width, c->gf, c->q_width, c->q_width, c->positions, T, (int)(c->hq + c->hkv),
                    (int)c->dh, c->inv_freq, 1.0f);
        for (int i = 0; i < 2; i++)
            o->rmsnorm_bwd(c->dx, c->a_norm, c->dnorm_w, c->xf, c->xf, c->norm_w, c->rstd, T, c->d);
        break;
    case JOB_ATTN_FWD:
        o->attention_fwd(c->o_att, c->lse, c->q, c->k, c->v, c->segs, c->n_segs, cal_attn_shape(c));
        break;
    case JOB_ATTN_BWD:
        o->zero(c->dq, T * c->hq * c->dh);
        o->zero(c->dk, T * c->hkv * c->dh);
        o->zero(c->dv, T * c->hkv * c->dh);
        o->attention_bwd(c->dq, c->dk, c->dv, c->d_att, c->o_att, c->lse, c->q, c->k, c->v, c->segs, c->n_segs,
                         cal_attn_shape(c));
        break;
    }
}

static int cal_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds of one run: the median of CAL_REPS timings, each of `inner` runs between two syncs - as
 * many as make about 2 ms, so a device's sync and launch latency are spread over them. The median,
 * not the fastest: training measures its micro-batches once each, under whatever else the machine
 * runs, and the profile is to predict those times (on a shared CPU the fastest of five runs is
 * 20-40% under the typical one). */
static double cal_time(Cal *c, CalJob job, int64_t T)
{
    const Ops *o = c->o;
    cal_run(c, job, T); /* warm-up: caches, scratch allocations, first-launch costs */
    o->sync();
    double t0 = clock_seconds();
    cal_run(c, job, T);
    o->sync();
    double first = clock_seconds() - t0, t[CAL_REPS];
    int inner = first > 0 ? (int)ceil(2e-3 / first) : 100;
    inner = inner < 1 ? 1 : inner > 100 ? 100 : inner;
    for (int r = 0; r < CAL_REPS; r++) {
        o->sync();
        t0 = clock_seconds();
        for (int i = 0; i < inner; i++)
            cal_run(c, job, T);
        o->sync();
        t[r] = (clock_seconds() - t0) / inner;
    }
    qsort(t, CAL_REPS, sizeof t[0], cal_cmp);
    return t[CAL_REPS / 2];
}

/* A window of documents (lens[0..n), summing to at most W) as attention segments, one per document. */
static int64_t cal_segments(Cal *c, const int64_t *lens, int n)
{
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        c->segs[i] = (AttnSegment){row, lens[i], row, lens[i], 0};
        row += lens[i];
    }
    c->n_segs = n;
    return row;
}

/* ---------------------------------------------------------------------------------------------- */
/* The fit                                                                                         */

/* Least squares of y = a + b x over n points, with a >= 0: the unconstrained line
 *     b = sum (x - mx)(y - my) / sum (x - mx)^2,  a = my - b mx,
 * and when a comes out negative (noise at small sizes) the line through the origin, b = sum xy / sum x^2.
 * b is seconds per FLOP (or byte): the rate is 1 / b; a is the fixed seconds per call of the job. */
static void cal_fit(const double *x, const double *y, int n, double *a, double *b)
{
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        mx += x[i] / n;
        my += y[i] / n;
    }
    for (int i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
    }
    *b = sxx > 0 ? sxy / sxx : 0;
    *a = my - *b * mx;
    if (*a < 0 || *b <= 0) {
        double xx = 0, xy = 0;
        for (int i = 0; i < n; i++) {
            xx += x[i] * x[i];
            xy += x[i] * y[i];
        }
        *a = 0;
        *b = xy / xx;
    }
}

/* The coefficient of determination of predictions p against measurements y, R^2 = 1 - SS_res / SS_tot,
 * and the worst relative error max |p - y| / y. */
static void cal_agreement(const double *p, const double *y, int n, double *r2, double *worst)
{
    double my = 0, ss_res = 0, ss_tot = 0;
    *worst = 0;
    for (int i = 0; i < n; i++)
        my += y[i] / n;
    for (int i = 0; i < n; i++) {
        ss_res += (p[i] - y[i]) * (p[i] - y[i]);
        ss_tot += (y[i] - my) * (y[i] - my);
        double e = fabs(p[i] - y[i]) / y[i];
        *worst = e > *worst ? e : *worst;
    }
    *r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* The measurement                                                                                 */

typedef struct CalResult {
    double gemm_tflops, a_gemm, elem_gbps, a_elem; /* the fits */
    int n_attn;
    double attn_q[COST_TABLE_MAX], attn_fwd[COST_TABLE_MAX], attn_bwd[COST_TABLE_MAX];
    double mix_r2, mix_worst;                       /* attention mixes, predicted against measured */
    int n_mix;
} CalResult;

static void cal_linear(Cal *c, CalResult *r)
{
    double tok[CAL_SIZES], flops[CAL_SIZES], bytes[CAL_SIZES], tg[CAL_SIZES], te[CAL_SIZES];
    printf("calibrate: products and element-wise work of one layer\n"
           "      tokens    products ms   TFLOP/s   element-wise ms   GB/s\n");
    for (int i = 0; i < CAL_SIZES; i++) {
        int64_t T = c->W >> (CAL_SIZES - 1 - i);
        T = T < 16 ? 16 : T;
        tok[i] = (double)T;
        /* The cost model's counts: 2 gemm_flops_fwd per token per product pass... forward 1x, backward
         * 2x (dx and dw); element-wise bytes elem_bytes per token, forward and backward. */
        flops[i] = 3 * c->cm.gemm_flops_fwd * tok[i];
        bytes[i] = c->cm.elem_bytes * tok[i];
        tg[i] = cal_time(c, JOB_PRODUCTS, T);
        te[i] = cal_time(c, JOB_ELEMENTWISE, T);
        printf("  %10lld  %13.3f  %8.3g  %16.3f  %6.3g\n", (long long)T, tg[i] * 1e3, flops[i] / tg[i] / 1e12,
               te[i] * 1e3, bytes[i] / te[i] / 1e9);
    }
    double b;
    cal_fit(flops, tg, CAL_SIZES, &r->a_gemm, &b);
    r->gemm_tflops = 1 / b / 1e12;
    cal_fit(bytes, te, CAL_SIZES, &r->a_elem, &b);
    r->elem_gbps = 1 / b / 1e9;
    printf("  fit: products %.4g TFLOP/s + %.1f us, element-wise %.4g GB/s + %.1f us per layer\n", r->gemm_tflops,
           r->a_gemm * 1e6, r->elem_gbps, r->a_elem * 1e6);
}

/* Attention over windows of documents of one length: the rate table. Rates count the FLOPs the cost
 * model counts (tile-padded causal pairs, 4 head_dim FLOPs a pair and head forward, 2.5x backward),
 * so the table gives back the measured seconds at each length. */
static void cal_attention(Cal *c, CalResult *r)
{
    int64_t tile = c->cm.hw.attn_tile > 16 ? c->cm.hw.attn_tile : 16, lens[4096];
    printf("calibrate: attention, windows of %lld tokens of documents of one length\n"
           "      length   docs    forward ms  TFLOP/s    backward ms  TFLOP/s\n", (long long)c->W);
    r->n_attn = 0;
    for (int64_t L = tile; r->n_attn < COST_TABLE_MAX; L = L * 2 > c->W && L < c->W ? c->W : L * 2) {
        if (L > c->W)
            break;
        int64_t n = c->W / L;
        n = n > 4096 ? 4096 : n;
        for (int64_t i = 0; i < n; i++)
            lens[i] = L;
        int64_t T = cal_segments(c, lens, (int)n);
        double fl = 4.0 * c->dh * c->hq * cost_attn_pairs(&c->cm, L, L) * (double)n;
        cal_run(c, JOB_ATTN_FWD, T); /* out and lse for the backward */
        double tf = cal_time(c, JOB_ATTN_FWD, T), tb = cal_time(c, JOB_ATTN_BWD, T);
        int i = r->n_attn++;
        r->attn_q[i] = (double)((L + c->cm.hw.attn_tile - 1) / c->cm.hw.attn_tile * c->cm.hw.attn_tile);
        r->attn_fwd[i] = fl / tf / 1e12;
        r->attn_bwd[i] = 2.5 * fl / tb / 1e12;
        printf("  %10lld  %5lld  %12.3f  %7.3g  %13.3f  %7.3g\n", (long long)L, (long long)n, tf * 1e3, r->attn_fwd[i],
               tb * 1e3, r->attn_bwd[i]);
        if (L == c->W)
            break;
    }
}

/* Mixes of document lengths in one window (log-uniform between 16 and W, the last one cut to what is
 * left): the table's predictions against the measured forward + backward. */
static void cal_mixes(Cal *c, CalResult *r, const CostModel *fitted)
{
    double pred[CAL_MIXES], meas[CAL_MIXES];
    int64_t lens[4096];
    printf("calibrate: attention, mixes of lengths in one window: predicted / measured ms\n ");
    for (int m = 0; m < CAL_MIXES; m++) {
        int n = 0;
        int64_t left = c->W;
        pred[m] = 0;
        while (left > 0 && n < 4096) {
            double u = cal_uniform(&c->rng) + 0.5; /* [0, 1) */
            int64_t L = (int64_t)exp(log(16.0) + u * (log((double)c->W) - log(16.0)));
            L = L < 1 ? 1 : L > left ? left : L;
            lens[n++] = L;
            left -= L;
            pred[m] += cost_attn_fwd_s(fitted, L, L) + cost_attn_bwd_s(fitted, L, L);
        }
        int64_t T = cal_segments(c, lens, n);
        cal_run(c, JOB_ATTN_FWD, T);
        meas[m] = cal_time(c, JOB_ATTN_FWD, T) + cal_time(c, JOB_ATTN_BWD, T);
        printf(" %.3g/%.3g", pred[m] * 1e3, meas[m] * 1e3);
    }
    r->n_mix = CAL_MIXES;
    cal_agreement(pred, meas, CAL_MIXES, &r->mix_r2, &r->mix_worst);
    printf("\n  R^2 %.4f, worst relative error %.1f%%\n", r->mix_r2, r->mix_worst * 100);
}

/* ---------------------------------------------------------------------------------------------- */
/* The profile                                                                                     */

static int cal_write(const Cal *c, const Config *cfg, const Backend *b, const CalResult *r, const CostHardware *hw,
                     const char *path, Error *err)
{
    char device[512];
    b->describe(device, sizeof device);
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    const ConfigModel *md = &cfg->model;
    json_t *q = json_array(), *fw = json_array(), *bw = json_array();
    for (int i = 0; i < r->n_attn; i++) {
        json_array_append_new(q, json_integer((json_int_t)r->attn_q[i]));
        json_array_append_new(fw, json_real(r->attn_fwd[i]));
        json_array_append_new(bw, json_real(r->attn_bwd[i]));
    }
    json_t *root = json_pack(
        "{s:s, s:i, s:s, s:s, s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:f, s:f, s:f, s:f, s:f, s:f, "
        "s:f, s:i, s:{s:i, s:i, s:o, s:o, s:o}, s:{s:i, s:f, s:f, s:f, s:f}}",
        "format", "wlbtrain-calibration", "version", CALIBRATION_VERSION, "device", device, "backend", b->name,
        "precision", cfg->train.precision == PRECISION_BF16 ? "bf16" : "fp32", "measured", when,
        "model", "d_model", (json_int_t)md->d_model, "n_heads", (json_int_t)md->n_heads, "n_kv_heads",
        (json_int_t)md->n_kv_heads, "d_ffn", (json_int_t)md->d_ffn, "vocab_size", (json_int_t)md->vocab_size, "tp",
        (json_int_t)cfg->parallel.tp, "window", (json_int_t)c->W, "n_layers", (json_int_t)md->n_layers,
        "peak_tflops", hw->peak_tflops, "gemm_efficiency", hw->gemm_efficiency, "hbm_gbps", hw->hbm_gbps,
        "launch_us", hw->launch_us, "intra_node_gbps", hw->intra_node_gbps, "inter_node_gbps", hw->inter_node_gbps,
        "link_latency_us", hw->link_latency_us, "gpus_per_node", hw->gpus_per_node,
        "attention", "tile", hw->attn_tile, "head_dim", (int)c->dh, "q", q, "fwd_tflops", fw, "bwd_tflops", bw,
        "check", "mixes", r->n_mix, "attn_r2", r->mix_r2, "attn_max_rel_err", r->mix_worst,
        "gemm_fixed_us", r->a_gemm * 1e6, "elementwise_fixed_us", r->a_elem * 1e6);
    if (!root)
        return error_runtime(err, path, "cannot build the profile (a measurement was not a number)");
    int rc = file_make_parents(path, err);
    if (rc == 0)
        rc = json_file_write(path, root, JSON_INDENT(1) | JSON_REAL_PRECISION(6), err);
    json_decref(root);
    return rc;
}

static int cal_measure(Cal *c, const Config *cfg, const Backend *b, const char *out_path, Error *err)
{
    CalResult r;
    memset(&r, 0, sizeof r);
    cal_linear(c, &r);
    cal_attention(c, &r);
    /* The profile: the config's own (its network figures kept), with the measured rates. A GEMM rate
     * above the profile's peak (a CPU faster than the default's guess) raises the peak to it. */
    CostHardware hw = c->cm.hw;
    if (r.gemm_tflops > hw.peak_tflops)
        hw.peak_tflops = r.gemm_tflops;
    hw.gemm_efficiency = r.gemm_tflops / hw.peak_tflops;
    hw.hbm_gbps = r.elem_gbps;
    hw.launch_us = (r.a_gemm + r.a_elem) * 1e6;
    CostModel fitted = c->cm;
    fitted.hw = hw;
    fitted.table.n = r.n_attn;
    for (int i = 0; i < r.n_attn; i++) {
        fitted.table.q[i] = r.attn_q[i];
        fitted.table.log2_q[i] = log2(r.attn_q[i]);
        fitted.table.fwd_tflops[i] = r.attn_fwd[i];
        fitted.table.bwd_tflops[i] = r.attn_bwd[i];
    }
    cal_mixes(c, &r, &fitted);
    if (!(r.gemm_tflops > 0) || !(r.elem_gbps > 0) || !isfinite(hw.launch_us) || r.n_attn < 1)
        return error_runtime(err, "calibrate", "the measurements gave no usable rate (GEMM %g TFLOP/s, element-wise "
                             "%g GB/s)", r.gemm_tflops, r.elem_gbps);
    if (cal_write(c, cfg, b, &r, &hw, out_path, err) != 0)
        return -1;
    printf("calibrate: wrote %s: peak %.4g TFLOP/s x gemm_efficiency %.3f, hbm_gbps %.4g, launch_us %.1f, "
           "attention table of %d lengths; use it with --set balance.calibration=%s\n", out_path, hw.peak_tflops,
           hw.gemm_efficiency, hw.hbm_gbps, hw.launch_us, r.n_attn, out_path);
    return 0;
}

int calibrate_run(const Config *cfg, const char *out_path, Error *err)
{
    /* The kernels training runs: the config's precision and determinism (the attention backward of
     * train.deterministic: false is another kernel). */
    const Backend *b = NULL;
    Cal c;
    memset(&c, 0, sizeof c);
    c.rng = 0x9e3779b97f4a7c15ull;
    if (!(c.o = trainer_open_backend(cfg, 0, &b, err)))
        return -1;
    /* The cost model of the config without its calibration file: its counts and the profile the
     * rates replace. */
    Config plain = *cfg;
    plain.balance.calibration = NULL;
    /* The jobs run the kernels as they are timed here: norms on all T rows (no sequence
     * parallelism) and no recomputation, so the counts must be those. */
    plain.parallel.sequence_parallel = false;
    plain.train.recompute = RECOMPUTE_NONE;
    if (cost_model_init(&c.cm, &plain, err) != 0)
        return -1;
    const ConfigModel *md = &cfg->model;
    c.W = cfg->data.context_window;
    c.d = md->d_model;
    c.hq = c.cm.local_heads;
    c.hkv = c.cm.local_kv_heads;
    c.dh = c.cm.head_dim;
    c.f = md->d_ffn / cfg->parallel.tp;
    c.q_width = (c.hq + 2 * c.hkv) * c.dh;
    const int64_t n_in[4] = {c.d, c.hq * c.dh, c.d, c.f}, n_out[4] = {c.q_width, c.d, 2 * c.f, c.d};
    memcpy(c.n_in, n_in, sizeof n_in);
    memcpy(c.n_out, n_out, sizeof n_out);
    printf("calibrate: %s, backend %s (%s), one layer of d_model %lld, %lld + %lld local heads of %lld, d_ffn %lld "
           "on this rank (tp %lld), windows of %lld tokens\n", cfg->model.preset ? cfg->model.preset : "custom model",
           b->name, c.o->name, (long long)c.d, (long long)c.hq, (long long)c.hkv, (long long)c.dh, (long long)c.f,
           (long long)cfg->parallel.tp, (long long)c.W);
    fflush(stdout);
    int rc = cal_buffers(&c, err);
    if (rc == 0)
        rc = cal_measure(&c, cfg, b, out_path, err);
    cal_free(&c);
    if (b->close)
        b->close();
    return rc;
}
