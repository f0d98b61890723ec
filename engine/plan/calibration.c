/*
 * engine/plan/calibration.c - the cost-model calibration file (balance.calibration): a hardware
 * profile measured on the device, JSON; read and checked here, into the cost model (cost.h).
 *
 * Version 2 is what `wlbtrain calibrate` writes (engine/train/train_calibrate.c); version 1 is the
 * older hand-written subset (no launch_us, no backend: everything optional). Fields:
 *   {
 *     "format": "wlbtrain-calibration", "version": 2,          (both required)
 *     "device": "NVIDIA H100 80GB HBM3",  "backend": "cuda",   (backend cpu|cuda: required in v2)
 *     "precision": "bf16", "measured": "2026-11-23T15:00:00Z", (informational)
 *     "model": {"d_model": 4096, ...},                         (the shapes it was measured at; informational)
 *     "peak_tflops": 989, "gemm_efficiency": 0.78,             (GEMM rate = peak x efficiency)
 *     "hbm_gbps": 3350,            (the element-wise rate: the cost model's bytes per token / this)
 *     "launch_us": 40,             (fixed microseconds per layer per micro-batch, forward + backward)
 *     "intra_node_gbps": 370, "inter_node_gbps": 45, "link_latency_us": 15, "gpus_per_node": 8,
 *     "attention": {               (required in v2)
 *       "tile": 128,
 *       "q":          [128, 256, 512, 1024, 2048, 4096, 8192, 16384],
 *       "fwd_tflops": [...],  "bwd_tflops": [...]     (measured at each query length, causal;
 *                                                     bwd counts 2.5x the forward's FLOPs)
 *     },
 *     "check": {"mixes": 8, "attn_r2": 0.99, "attn_max_rel_err": 0.03}  (the fit's own check; informational)
 *     "loss_gbps": 1836, "optimizer_gbps": 3380,   (optional: the cross-entropy's and the optimizer's
 *                                                   bandwidth; absent: hbm_gbps)
 *     "profile": "h200", "source": "...", "commit": "f280010",  (informational strings: the dry run
 *                                                   prints the profile and its source)
 *     "sources": {"gemm_efficiency": "...", ...}   (informational: where each rate came from)
 *   }
 * "attention" may also be an array of such tables, each with its "head_dim" (the head size it was
 * measured at): the cost model takes the table of its model's head size, else the nearest (in
 * log2); a single table without head_dim serves every head size.
 * Each number replaces the hardware profile's (explicit balance.* keys still win). The attention
 * table replaces the efficiency curve: the rate at a query length is interpolated linearly in
 * log2(length) and clamped at the ends. Checked on load: the format and version, no unknown key,
 * every number in its range (rates, bandwidths and the efficiency at least COST_MIN_RATE, 1e-6, the
 * efficiency at most 1, tile and gpus_per_node whole numbers, launch_us >= 0, q increasing, the three arrays of one length); any fault is one error
 * (status 2) naming the file.
 */
#include "engine/plan/cost.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const char *const known_keys[] = {
    "format", "version", "device", "backend", "precision", "measured", "model", "peak_tflops",
    "gemm_efficiency", "hbm_gbps", "launch_us", "intra_node_gbps", "inter_node_gbps", "link_latency_us",
    "gpus_per_node", "attention", "check", "profile", "source", "sources", "commit", "loss_gbps",
    "optimizer_gbps",
};

/* A number field in (lo, hi] (lo_open) or [lo, hi]; whole: an integer value. Absent: left as it is,
 * unless required. */
typedef struct NumberRule {
    const char *key;
    double lo, hi;
    int lo_open, whole, required_v2;
} NumberRule;

static int read_number(json_t *root, const NumberRule *r, int version, double *out, const char *path, Error *err)
{
    json_t *v = json_object_get(root, r->key);
    if (!v)
        return version >= 2 && r->required_v2 ? error_set(err, path, "%s: missing (required in version %d)", r->key,
                                                          version)
                                              : 0;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    int low_ok = r->lo_open ? x > r->lo : x >= r->lo;
    if (!json_is_number(v) || !isfinite(x) || !low_ok || x > r->hi || (r->whole && x != floor(x)))
        return error_set(err, path, "%s: expected a%s number in %s%g, %g], got %s", r->key,
                         r->whole ? " whole" : "", r->lo_open ? "(" : "[", r->lo, r->hi,
                         json_is_number(v) ? "an out-of-range value" : "another type");
    *out = x;
    return 0;
}

/* An array of 1 to COST_TABLE_MAX finite numbers, each above 0 (rate 0) or at least COST_MIN_RATE
 * (rate 1). */
static int read_array(json_t *att, const char *key, int rate, double *out, int *n, const char *path, Error *err)
{
    json_t *a = json_object_get(att, key);
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > COST_TABLE_MAX)
        return error_set(err, path, "attention.%s: expected an array of 1 to %d positive numbers", key,
                         COST_TABLE_MAX);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        double x = json_is_number(v) ? json_number_value(v) : NAN;
        if (!isfinite(x) || !(rate ? x >= COST_MIN_RATE : x > 0))
            return error_set(err, path, "attention.%s[%d]: expected a %s", key, i,
                             rate ? "rate of at least 1e-06 TFLOP/s" : "positive number");
        out[i] = json_number_value(v);
    }
    return 0;
}

static int read_attention(json_t *att, CostHardware *hw, CostAttnTable *t, const char *path, Error *err)
{
    if (!json_is_object(att))
        return error_set(err, path, "attention: expected an object");
    const char *key;
    json_t *value;
    json_object_foreach(att, key, value) {
        if (strcmp(key, "tile") && strcmp(key, "q") && strcmp(key, "fwd_tflops") && strcmp(key, "bwd_tflops") &&
            strcmp(key, "head_dim"))
            return error_set(err, path, "attention: unknown key '%s' (tile, head_dim, q, fwd_tflops, bwd_tflops)",
                             key);
    }
    double tile = hw->attn_tile, head_dim = 0;
    const NumberRule tile_rule = {"tile", 1, 4096, 0, 1, 0}, head_rule = {"head_dim", 1, 4096, 0, 1, 0};
    if (read_number(att, &tile_rule, 1, &tile, path, err) != 0 ||
        read_number(att, &head_rule, 1, &head_dim, path, err) != 0)
        return -1;
    hw->attn_tile = (int)tile;
    t->head_dim = (int)head_dim;
    int nq, nf, nb;
    if (read_array(att, "q", 0, t->q, &nq, path, err) != 0 ||
        read_array(att, "fwd_tflops", 1, t->fwd_tflops, &nf, path, err) != 0 ||
        read_array(att, "bwd_tflops", 1, t->bwd_tflops, &nb, path, err) != 0)
        return -1;
    if (nq != nf || nq != nb)
        return error_set(err, path, "attention: q, fwd_tflops and bwd_tflops must have the same length (%d, %d, %d)",
                         nq, nf, nb);
    for (int i = 1; i < nq; i++)
        if (t->q[i] <= t->q[i - 1])
            return error_set(err, path, "attention.q must be increasing");
    for (int i = 0; i < nq; i++)
        t->log2_q[i] = log2(t->q[i]);
    t->n = nq;
    return 0;
}

/* How far a table's head size is from the one wanted: 0 for its own or a table for any head size,
 * else |log2 of their ratio| (64 is as far from 128 as 128 from 256). */
static double head_distance(int table_head, int want)
{
    return table_head == 0 || want == 0 || table_head == want ? 0 : fabs(log2((double)table_head / want));
}

/* "attention": one table, or an array of tables (each with its head_dim): the one for head_dim
 * (cost.h), every one checked. */
static int read_attention_tables(json_t *att, int head_dim, CostHardware *hw, CostAttnTable *t, const char *path,
                                 Error *err)
{
    if (!json_is_array(att))
        return read_attention(att, hw, t, path, err);
    if (json_array_size(att) < 1)
        return error_set(err, path, "attention: expected a table or a non-empty array of tables");
    double best = INFINITY;
    for (size_t i = 0; i < json_array_size(att); i++) {
        CostHardware h = *hw;
        CostAttnTable one = {0};
        if (read_attention(json_array_get(att, i), &h, &one, path, err) != 0)
            return -1;
        if (json_array_size(att) > 1 && one.head_dim == 0)
            return error_set(err, path, "attention[%zu]: head_dim: missing (required with several tables)", i);
        double dist = head_distance(one.head_dim, head_dim);
        if (dist < best) {
            best = dist;
            *hw = h;
            *t = one;
        }
    }
    return 0;
}

/* The informational strings: "profile" and "source" strings, "sources" an object of strings. */
static int read_source(json_t *root, const char *path, CostSource *src, Error *err)
{
    json_t *profile = json_object_get(root, "profile"), *source = json_object_get(root, "source");
    json_t *sources = json_object_get(root, "sources"), *device = json_object_get(root, "device");
    json_t *measured = json_object_get(root, "measured"), *commit = json_object_get(root, "commit");
    const char *key;
    json_t *value;
    if ((profile && !json_is_string(profile)) || (source && !json_is_string(source)) ||
        (commit && !json_is_string(commit)))
        return error_set(err, path, "profile, source and commit: expected strings");
    if (sources && !json_is_object(sources))
        return error_set(err, path, "sources: expected an object of strings (a rate's key: where it came from)");
    json_object_foreach(sources, key, value) {
        if (!json_is_string(value))
            return error_set(err, path, "sources.%s: expected a string", key);
    }
    if (!src)
        return 0;
    snprintf(src->profile, sizeof src->profile, "%s", profile ? json_string_value(profile) : path);
    if (source)
        snprintf(src->text, sizeof src->text, "%s (%s)", json_string_value(source), path);
    else /* what `wlbtrain calibrate` writes: the device, when and at which commit */
        snprintf(src->text, sizeof src->text, "calibrated by wlbtrain calibrate on %s at %s%s%s",
                 json_is_string(device) ? json_string_value(device) : "an unnamed device",
                 json_is_string(measured) ? json_string_value(measured) : "an unknown time",
                 commit ? ", commit " : "", commit ? json_string_value(commit) : "");
    return 0;
}

static int check_keys(json_t *root, const char *path, Error *err)
{
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        size_t i = 0, n = sizeof known_keys / sizeof known_keys[0];
        while (i < n && strcmp(key, known_keys[i]))
            i++;
        if (i == n)
            return error_set(err, path, "unknown key '%s'", key);
    }
    json_t *backend = json_object_get(root, "backend");
    if (backend && (!json_is_string(backend) ||
                    (strcmp(json_string_value(backend), "cpu") && strcmp(json_string_value(backend), "cuda"))))
        return error_set(err, path, "backend: expected \"cpu\" or \"cuda\"");
    return 0;
}

/* Everything but the header, into copies: the profile changes only when the whole file is good. */
static int read_body(json_t *root, int version, int head_dim, CostHardware *hw, CostAttnTable *table,
                     CostSource *src, const char *path, Error *err)
{
    CostHardware h = *hw;
    CostAttnTable t = *table;
    double gpus = h.gpus_per_node;
    const struct {
        NumberRule rule;
        double *out;
    } fields[] = {
        {{"peak_tflops", COST_MIN_RATE, 1e5, 0, 0, 1}, &h.peak_tflops},
        {{"gemm_efficiency", COST_MIN_RATE, 1, 0, 0, 1}, &h.gemm_efficiency},
        {{"hbm_gbps", COST_MIN_RATE, 1e6, 0, 0, 1}, &h.hbm_gbps},
        {{"launch_us", 0, 1e6, 0, 0, 1}, &h.launch_us},
        {{"intra_node_gbps", COST_MIN_RATE, 1e6, 0, 0, 0}, &h.intra_node_gbps},
        {{"inter_node_gbps", COST_MIN_RATE, 1e6, 0, 0, 0}, &h.inter_node_gbps},
        {{"link_latency_us", 0, 1e6, 1, 0, 0}, &h.link_latency_us},
        {{"gpus_per_node", 1, 1 << 16, 0, 1, 0}, &gpus},
        {{"loss_gbps", COST_MIN_RATE, 1e6, 0, 0, 0}, &h.loss_gbps},
        {{"optimizer_gbps", COST_MIN_RATE, 1e6, 0, 0, 0}, &h.optimizer_gbps},
    };
    /* Without their own rates the loss and the optimizer run at the file's memory bandwidth. */
    if (json_object_get(root, "hbm_gbps") && json_is_number(json_object_get(root, "hbm_gbps")))
        h.loss_gbps = h.optimizer_gbps = json_number_value(json_object_get(root, "hbm_gbps"));
    if (check_keys(root, path, err) != 0)
        return -1;
    if (version >= 2 && !json_object_get(root, "backend"))
        return error_set(err, path, "backend: missing (required in version %d)", version);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (read_number(root, &fields[i].rule, version, fields[i].out, path, err) != 0)
            return -1;
    h.gpus_per_node = (int)gpus;
    json_t *att = json_object_get(root, "attention");
    if (!att && version >= 2)
        return error_set(err, path, "attention: missing (required in version %d)", version);
    if (att && read_attention_tables(att, head_dim, &h, &t, path, err) != 0)
        return -1;
    CostSource sc;
    if (read_source(root, path, src ? &sc : NULL, err) != 0)
        return -1;
    *hw = h;
    *table = t;
    if (src)
        *src = sc;
    return 0;
}

static int load_root(json_t *root, const char *path, int head_dim, CostHardware *hw, CostAttnTable *table,
                     CostSource *src, Error *err);

int calibration_load(const char *path, int head_dim, CostHardware *hw, CostAttnTable *table, CostSource *src,
                     Error *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return error_set(err, path, "line %d, column %d: %s", je.line, je.column, je.text);
    return load_root(root, path, head_dim, hw, table, src, err);
}

int calibration_load_text(const char *text, const char *where, int head_dim, CostHardware *hw, CostAttnTable *table,
                          CostSource *src, Error *err)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root)
        return error_set(err, where, "line %d, column %d: %s", je.line, je.column, je.text);
    return load_root(root, where, head_dim, hw, table, src, err);
}

/* Checks the header, reads the body; frees root. */
static int load_root(json_t *root, const char *path, int head_dim, CostHardware *hw, CostAttnTable *table,
                     CostSource *src, Error *err)
{
    int rc = 0;
    json_t *format = json_object_get(root, "format"), *version = json_object_get(root, "version");
    if (!json_is_object(root) || !json_is_string(format) || strcmp(json_string_value(format), "wlbtrain-calibration"))
        rc = error_set(err, path, "not a wlbtrain calibration file (no \"format\": \"wlbtrain-calibration\")");
    else if (!json_is_integer(version) || json_integer_value(version) < 1 ||
             json_integer_value(version) > CALIBRATION_VERSION)
        rc = error_set(err, path, "calibration version must be 1 to %d (this wlbtrain's); rerun wlbtrain calibrate",
                       CALIBRATION_VERSION);
    else
        rc = read_body(root, (int)json_integer_value(version), head_dim, hw, table, src, path, err);
    json_decref(root);
    return rc;
}
