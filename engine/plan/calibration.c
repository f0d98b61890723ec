/* engine/plan/calibration.c - reading the calibration file (see calibration.h). */
#include "engine/plan/calibration.h"

#include <jansson.h>
#include <string.h>

/* A positive number field, if present. */
static int read_number(json_t *root, const char *key, double *out, const char *path, Error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return 0;
    if (!json_is_number(v) || json_number_value(v) <= 0)
        return error_set(err, path, "%s: expected a positive number", key);
    *out = json_number_value(v);
    return 0;
}

static int read_array(json_t *att, const char *key, double *out, int *n, const char *path, Error *err)
{
    json_t *a = json_object_get(att, key);
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > COST_TABLE_MAX)
        return error_set(err, path, "attention.%s: expected an array of 1 to %d positive numbers", key,
                         COST_TABLE_MAX);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_number(v) || json_number_value(v) <= 0)
            return error_set(err, path, "attention.%s[%d]: expected a positive number", key, i);
        out[i] = json_number_value(v);
    }
    return 0;
}

static int read_attention(json_t *att, CostHardware *hw, CostAttnTable *t, const char *path, Error *err)
{
    if (!json_is_object(att))
        return error_set(err, path, "attention: expected an object");
    double tile = hw->attn_tile;
    if (read_number(att, "tile", &tile, path, err) != 0)
        return -1;
    hw->attn_tile = (int)tile;
    int nq, nf, nb;
    if (read_array(att, "q", t->q, &nq, path, err) != 0 || read_array(att, "fwd_tflops", t->fwd_tflops, &nf, path, err) ||
        read_array(att, "bwd_tflops", t->bwd_tflops, &nb, path, err))
        return -1;
    if (nq != nf || nq != nb)
        return error_set(err, path, "attention: q, fwd_tflops and bwd_tflops must have the same length (%d, %d, %d)",
                         nq, nf, nb);
    for (int i = 1; i < nq; i++)
        if (t->q[i] <= t->q[i - 1])
            return error_set(err, path, "attention.q must be increasing");
    t->n = nq;
    return 0;
}

int calibration_load(const char *path, CostHardware *hw, CostAttnTable *table, Error *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return error_set(err, path, "line %d, column %d: %s", je.line, je.column, je.text);
    int rc = 0;
    json_t *format = json_object_get(root, "format"), *version = json_object_get(root, "version");
    double gpus = hw->gpus_per_node;
    if (!json_is_object(root) || !json_is_string(format) || strcmp(json_string_value(format), "wlbtrain-calibration"))
        rc = error_set(err, path, "not a wlbtrain calibration file (no \"format\": \"wlbtrain-calibration\")");
    else if (!json_is_integer(version) || json_integer_value(version) != 1)
        rc = error_set(err, path, "calibration version must be 1");
    else if (read_number(root, "peak_tflops", &hw->peak_tflops, path, err) ||
             read_number(root, "gemm_efficiency", &hw->gemm_efficiency, path, err) ||
             read_number(root, "hbm_gbps", &hw->hbm_gbps, path, err) ||
             read_number(root, "intra_node_gbps", &hw->intra_node_gbps, path, err) ||
             read_number(root, "inter_node_gbps", &hw->inter_node_gbps, path, err) ||
             read_number(root, "link_latency_us", &hw->link_latency_us, path, err) ||
             read_number(root, "gpus_per_node", &gpus, path, err))
        rc = -1;
    else if (json_object_get(root, "attention"))
        rc = read_attention(json_object_get(root, "attention"), hw, table, path, err);
    hw->gpus_per_node = (int)gpus;
    json_decref(root);
    return rc;
}
