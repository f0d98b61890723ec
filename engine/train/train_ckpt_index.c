/* engine/train/train_ckpt_index.c - the index.json of a sharded checkpoint, written by rank 0 from the
 * config alone: every rank's tensor table follows from the model and the layout (model_tensor_table),
 * so nothing is gathered (the format: train_ckpt.c; the reader: util/ckpt_index.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"
#include "util/ckpt_ident.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"
#include "util/jsonfile.h"

/* One chunk's entry, and its counted blocks added to the tensors they belong to. */
static int index_chunk(const Config *cfg, int tp_rank, int g, json_t *chunks, json_t *tensors, Error *err)
{
    const ConfigParallel *p = &cfg->parallel;
    int pp = (int)p->pp, z = p->zero ? (int)(p->dp * p->cp) : 1;
    ModelParallel par = trainer_chunk_parallel(cfg, tp_rank, g, NULL);
    ModelTensor *t;
    int n;
    int64_t n_params;
    if (model_tensor_table(&cfg->model, &par, &t, &n, &n_params, err) != 0)
        return -1;
    char file[64], section[STATE_NAME_LEN], ms[STATE_NAME_LEN], vs[STATE_NAME_LEN];
    ckpt_shard_file(file, sizeof file, tp_rank, g % pp, 0);
    snprintf(section, sizeof section, "params.c%d", g);
    snprintf(ms, sizeof ms, "m.c%d", g);
    snprintf(vs, sizeof vs, "v.c%d", g);
    json_t *shards = json_array();
    for (int r = 0; r < z; r++) {
        char f[64];
        int64_t b = 0, e = n_params;
        if (p->zero)
            trainer_shard_range(n_params, z, r, &b, &e);
        ckpt_shard_file(f, sizeof f, tp_rank, g % pp, r);
        json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:s, s:s}", "file", f, "begin", (json_int_t)b, "end",
                                                (json_int_t)e, "m", ms, "v", vs));
    }
    json_array_append_new(chunks, json_pack("{s:i, s:i, s:I, s:s, s:s, s:o}", "tp", tp_rank, "chunk", g, "params",
                                            (json_int_t)n_params, "file", file, "section", section, "moments", shards));
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!t[i].counts)
            continue; /* a replica: the counted copy stands for it */
        json_t *e = json_object_get(tensors, t[i].name), *blocks = e ? json_object_get(e, "blocks") : NULL;
        if (!blocks) {
            rc = error_runtime(err, "checkpoint index", "no tensor %s in the model", t[i].name);
            break;
        }
        json_array_append_new(blocks, json_pack("{s:s, s:s, s:I, s:i, s:i, s:I, s:I, s:I, s:I}", "file", file,
                                                "section", section, "offset", (json_int_t)t[i].offset, "tp", tp_rank,
                                                "chunk", g, "row0", (json_int_t)t[i].row0, "rows",
                                                (json_int_t)t[i].rows, "col0", (json_int_t)t[i].col0, "cols",
                                                (json_int_t)t[i].cols));
    }
    free(t);
    return rc;
}

int trainer_index_json(const Config *cfg, int64_t step, json_t **out, Error *err)
{
    const ConfigParallel *p = &cfg->parallel;
    int pp = (int)p->pp, n_chunks = pp * (int)p->virtual_stages, z = p->zero ? (int)(p->dp * p->cp) : 1;
    json_t *root = json_pack("{s:s, s:i, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:i}}", "format", "wlbtrain sharded checkpoint",
                             "version", CKPT_INDEX_VERSION, "step", (json_int_t)step, "layout", "tp",
                             (json_int_t)p->tp, "cp", (json_int_t)p->cp, "pp", (json_int_t)p->pp, "dp",
                             (json_int_t)p->dp, "virtual_stages", (json_int_t)p->virtual_stages, "zero", (int)p->zero);
    json_t *split = json_array(), *files = json_array(), *chunks = json_array(), *tensors = json_object();
    for (int g = 0; g < n_chunks; g++)
        json_array_append_new(split, json_integer((json_int_t)p->chunk_layers.v[g]));
    json_object_set_new(json_object_get(root, "layout"), "stage_layers", split);
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "chunks", chunks);
    json_object_set_new(root, "tensors", tensors);
    for (int t = 0; t < p->tp; t++)
        for (int s = 0; s < pp; s++)
            for (int r = 0; r < z; r++) {
                char f[64];
                ckpt_shard_file(f, sizeof f, t, s, r);
                json_array_append_new(files, json_string(f));
            }
    /* The tensors in Hugging Face order, then each chunk's blocks. */
    ModelDims d;
    model_dims(&d, &cfg->model, NULL);
    for (int i = 0; i < model_full_tensor_count(&d); i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(&d, i, name, sizeof name, &rows, &cols, &vec);
        json_t *shape = vec ? json_pack("[I]", (json_int_t)cols) : json_pack("[I, I]", (json_int_t)rows, (json_int_t)cols);
        json_object_set_new(tensors, name, json_pack("{s:o, s:[]}", "shape", shape, "blocks"));
    }
    int rc = 0;
    for (int t = 0; t < p->tp && rc == 0; t++)
        for (int g = 0; g < n_chunks && rc == 0; g++)
            rc = index_chunk(cfg, t, g, chunks, tensors, err);
    if (rc != 0) {
        json_decref(root);
        return -1;
    }
    *out = root;
    return 0;
}

int trainer_model_keys(const Config *cfg, json_t **out, Error *err)
{
    Config defaults;
    config_init(&defaults);
    ConfigChange *ch = malloc(CONFIG_MAX_KEYS * sizeof *ch);
    json_t *keys = json_object();
    int rc = ch && keys ? 0 : error_runtime(err, "checkpoint", "out of memory");
    int n = rc == 0 ? config_changes(&defaults, cfg, ch, CONFIG_MAX_KEYS) : 0;
    for (int i = 0; rc == 0 && i < n && i < CONFIG_MAX_KEYS; i++)
        if (!strncmp(ch[i].key, "model.", 6) && strcmp(ch[i].key, "model.preset") != 0 &&
            json_object_set_new(keys, ch[i].key, json_string(ch[i].after)) != 0)
            rc = error_runtime(err, "checkpoint", "out of memory");
    free(ch);
    config_free(&defaults);
    if (rc != 0) {
        json_decref(keys);
        return -1;
    }
    *out = keys;
    return 0;
}

static json_t *sum_json(const StateSum *s)
{
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", s->crc);
    return json_pack("{s:I, s:s}", "bytes", (json_int_t)s->bytes, "crc32", hex);
}

/* Version 3's binding added to root: run, model, contents. */
static int add_binding(json_t *root, const Config *cfg, const CkptBinding *b, Error *err)
{
    char id[CKPT_RUN_HEX], parent[CKPT_RUN_HEX];
    json_t *model, *files = json_object_get(root, "files");
    if (trainer_model_keys(cfg, &model, err) != 0)
        return -1;
    ckpt_run_text(b->run, id);
    ckpt_run_text(b->parent_run, parent);
    json_t *run = json_pack("{s:s}", "id", id), *contents = json_object();
    if (b->parent_run)
        json_object_set_new(run, "parent", json_pack("{s:s, s:I}", "id", parent, "step", (json_int_t)b->parent_step));
    for (size_t i = 0; i < json_array_size(files) && (int)i < b->n_sums; i++)
        json_object_set_new(contents, json_string_value(json_array_get(files, i)), sum_json(&b->sums[i]));
    json_object_set_new(contents, "state.bin", sum_json(&b->state_sum));
    json_object_set_new(contents, "config.yaml", sum_json(&b->config_sum));
    if (json_array_size(files) != (size_t)b->n_sums || !run ||
        json_object_size(contents) != (size_t)b->n_sums + 2 || json_object_set_new(root, "run", run) != 0 ||
        json_object_set_new(root, "model", model) != 0 || json_object_set_new(root, "contents", contents) != 0)
        return error_runtime(err, "checkpoint index", "out of memory, or %zu files for %d sums",
                             json_array_size(files), b->n_sums);
    return 0;
}

int trainer_index_write(const Config *cfg, int64_t step, const CkptBinding *bound, const char *path, Error *err)
{
    json_t *root;
    uint32_t crc;
    char hex[16];
    if (trainer_index_json(cfg, step, &root, err) != 0)
        return -1;
    if (add_binding(root, cfg, bound, err) != 0) {
        json_decref(root);
        return -1;
    }
    int rc = ckpt_index_crc(root, &crc) == 0 ? 0 : error_runtime(err, path, "out of memory");
    /* The checksum last, over everything above it (util/ckpt_index.h says how it is computed). */
    snprintf(hex, sizeof hex, "%08x", crc);
    if (rc == 0 && json_object_set_new(root, "crc32", json_string(hex)) != 0)
        rc = error_runtime(err, path, "out of memory");
    if (rc == 0)
        rc = json_file_write(path, root, JSON_INDENT(1) | JSON_PRESERVE_ORDER, err);
    json_decref(root);
    return rc;
}

