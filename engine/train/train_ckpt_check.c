/*
 * engine/train/train_ckpt_check.c - a checkpoint's files checked against each other before any weight
 * is read from it (a resume, a continued run, `wlbtrain eval`, `wlbtrain export`; see train.h):
 *   index.json   no key twice and its checksum (ckpt_index_load), then equal, key for key, to the index
 *                that the model and layout of the checkpoint's config.yaml give (trainer_index_json,
 *                what the saving run wrote): every layout field, shard file, chunk, tensor name and
 *                shape, and every block's file, section, offset, rows and columns. So an index edited
 *                and given a matching checksum again (by hand, or a tool that rewrites JSON) is still
 *                refused, with the first thing that differs named.
 *   config.yaml  its model shape and layout equal state.bin's meta section (CRC-checked), so a
 *                config.yaml edited to another shape (which export writes into config.json) is refused.
 *   the binding  (index version 3, util/ckpt_ident.h) config.yaml's model keys equal the index's
 *                "model" (the first that differs named: an edited RoPE base or norm epsilon too) and
 *                its size and CRC-32 the index's; state.bin's ident names the index's run and step,
 *                and its size and CRC-32 are the index's; every shard's ident (header and ident
 *                section only) its run, step and place, and its size the index's
 *                (ckpt_index_check_files; the whole CRC-32 as a reader opens it).
 * Any difference is one Error (exit 2). An older index (versions 1 and 2) gets the checks its format
 * allows and, with warn, one warning line saying which were not possible. `wlbtrain inspect` of a
 * checkpoint (trainer_checkpoint_inspect) runs all of it and reads every shard whole.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "engine/train/train.h"
#include "util/ckpt_ident.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"

/* The keys of a bound index (version 3) that the model and layout do not give: checked on their own. */
static const char *const bound_keys[] = {"run", "model", "contents"};

/* The block fields in the order a message names the first that differs. */
static const char *const block_keys[] = {"file", "section", "offset", "tp", "chunk", "row0", "rows", "col0", "cols"};

static void value_text(const json_t *v, char *buf, size_t size)
{
    if (json_is_integer(v))
        snprintf(buf, size, "%lld", (long long)json_integer_value(v));
    else if (json_is_string(v))
        snprintf(buf, size, "%.60s", json_string_value(v));
    else
        snprintf(buf, size, "%s", v ? "(not a number or name)" : "(none)");
}

/* One tensor's entry against the expected one. */
static int check_tensor(const char *name, const json_t *have, const json_t *want, const char *path, Error *err)
{
    char a[80], b[80];
    if (!json_equal(json_object_get(have, "shape"), json_object_get(want, "shape"))) {
        char *hs = json_dumps(json_object_get(have, "shape"), JSON_COMPACT | JSON_ENCODE_ANY);
        char *ws = json_dumps(json_object_get(want, "shape"), JSON_COMPACT | JSON_ENCODE_ANY);
        int rc = error_set(err, path, "%s: shape %.40s, the model of config.yaml has %.40s", name, hs ? hs : "?",
                           ws ? ws : "?");
        free(hs);
        free(ws);
        return rc;
    }
    const json_t *hb = json_object_get(have, "blocks"), *wb = json_object_get(want, "blocks");
    if (json_array_size(hb) != json_array_size(wb) || !json_is_array(hb))
        return error_set(err, path, "%s: %zu blocks, the model and layout of config.yaml give %zu", name,
                         json_array_size(hb), json_array_size(wb));
    for (size_t k = 0; k < json_array_size(wb); k++) {
        const json_t *h = json_array_get(hb, k), *w = json_array_get(wb, k);
        for (size_t f = 0; f < sizeof block_keys / sizeof block_keys[0]; f++)
            if (!json_equal(json_object_get(h, block_keys[f]), json_object_get(w, block_keys[f]))) {
                value_text(json_object_get(h, block_keys[f]), a, sizeof a);
                value_text(json_object_get(w, block_keys[f]), b, sizeof b);
                return error_set(err, path, "%s: block %zu has %s %s, the model and layout of config.yaml give %s",
                                 name, k, block_keys[f], a, b);
            }
        if (json_object_size(h) != json_object_size(w))
            return error_set(err, path, "%s: block %zu has %zu fields, not %zu", name, k, json_object_size(h),
                             json_object_size(w));
    }
    return 0;
}

/* The loaded index (checksum removed) against the expected one. */
static int check_index(json_t *have, json_t *want, const char *path, Error *err)
{
    /* An older index is compared as its version wrote it: the same entries (version 2 added only
     * the checksum, version 3 the binding, checked by the caller); version 1 may lack stage_layers
     * (the layers were split evenly). */
    json_t *hl = json_object_get(have, "layout"), *wl = json_object_get(want, "layout");
    json_int_t version = json_integer_value(json_object_get(have, "version"));
    if (version >= 1 && version < CKPT_INDEX_VERSION)
        json_object_set(want, "version", json_object_get(have, "version"));
    if (version == 1 && !json_object_get(hl, "stage_layers"))
        json_object_del(wl, "stage_layers");
    for (size_t i = 0; i < sizeof bound_keys / sizeof bound_keys[0]; i++)
        json_object_del(have, bound_keys[i]);
    static const char *const top[] = {"format", "version", "step", "layout", "files"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!json_equal(json_object_get(have, top[i]), json_object_get(want, top[i]))) {
            char *h = json_dumps(json_object_get(have, top[i]), JSON_COMPACT | JSON_ENCODE_ANY);
            char *w = json_dumps(json_object_get(want, top[i]), JSON_COMPACT | JSON_ENCODE_ANY);
            int rc = error_set(err, path, "%s %.200s, config.yaml and state.bin give %.200s", top[i], h ? h : "(none)",
                               w ? w : "?");
            free(h);
            free(w);
            return rc;
        }
    const json_t *hc = json_object_get(have, "chunks"), *wc = json_object_get(want, "chunks");
    if (json_array_size(hc) != json_array_size(wc))
        return error_set(err, path, "%zu chunks, the model and layout of config.yaml give %zu", json_array_size(hc),
                         json_array_size(wc));
    for (size_t i = 0; i < json_array_size(wc); i++)
        if (!json_equal(json_array_get(hc, i), json_array_get(wc, i)))
            return error_set(err, path, "chunks[%zu] (parameter count, file, section or moment shards) is not what "
                             "the model and layout of config.yaml give", i);
    const json_t *ht = json_object_get(have, "tensors"), *wt = json_object_get(want, "tensors");
    const char *name;
    json_t *e;
    json_object_foreach((json_t *)wt, name, e) {
        const json_t *h = json_object_get(ht, name);
        if (!h)
            return error_set(err, path, "no tensor %s (the model of config.yaml has it)", name);
        if (check_tensor(name, h, e, path, err) != 0)
            return -1;
    }
    json_object_foreach((json_t *)ht, name, e)
        if (!json_object_get(wt, name))
            return error_set(err, path, "a tensor %.96s, which the model of config.yaml has not", name);
    if (json_object_size(have) != json_object_size(want))
        return error_set(err, path, "%zu top-level keys, an index has %zu", json_object_size(have),
                         json_object_size(want));
    return 0;
}

/* config.yaml's model keys against those index.json recorded: the first that differs named. */
static int check_model(const Config *saved, const json_t *recorded, const char *path, Error *err)
{
    json_t *mine;
    if (trainer_model_keys(saved, &mine, err) != 0)
        return -1;
    const char *key;
    json_t *v;
    int rc = 0;
    /* A key missing on one side has its default there. */
    json_object_foreach(mine, key, v) {
        const char *was = json_string_value(json_object_get(recorded, key));
        if (!was || strcmp(was, json_string_value(v)) != 0) {
            rc = error_set(err, path, "%s is %.60s, the checkpoint was saved with %.60s (index.json): config.yaml was "
                           "edited after it was written (restore it; a changed model is a new run)", key,
                           json_string_value(v), was ? was : "the default");
            break;
        }
    }
    json_object_foreach((json_t *)recorded, key, v)
        if (rc == 0 && !json_object_get(mine, key))
            rc = error_set(err, path, "%s is the default, the checkpoint was saved with %.60s (index.json): "
                           "config.yaml was edited after it was written (restore it; a changed model is a new run)",
                           key, json_is_string(v) ? json_string_value(v) : "(not text)");
    json_decref(mine);
    return rc;
}

/* Version 3: config.yaml's model keys, its size and CRC-32 against what index.json lists. */
static int check_bound_config(CkptIndex *ix, const json_t *have, const Config *saved, const char *dir, Error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    if (check_model(saved, json_object_get(have, "model"), path, err) != 0)
        return -1;
    char *text;
    size_t n;
    if (file_read_text(path, "config", &text, &n, err) != 0)
        return -1;
    StateSum sum = {n, (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)n)};
    free(text);
    return ckpt_index_check_sum(&sum, &ix->config_sum, path, err);
}

/* Version 3: state.bin's ident (sum 0: a foreign or stale file named as such), or its size and CRC-32
 * (sum 1) against what index.json lists. */
static int check_bound_state(CkptIndex *ix, const char *dir, int sum, Error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.bin", dir);
    StateFile sf;
    if (statefile_open(&sf, path, err) != 0)
        return -1;
    CkptIdent id, want;
    ckpt_index_state_ident(ix, &want);
    int found = sum ? 1 : ckpt_ident_read(&sf, path, &id, err), rc = 0;
    if (found == 0)
        rc = error_set(err, path, "no ident section: a training state written before checkpoints were bound to their "
                       "run, so not this checkpoint's (index.json is of version %d)", ix->version);
    else if (found < 0 || (!sum && ckpt_ident_check(&id, &want, path, err) != 0))
        rc = -1;
    if (rc == 0 && sum)
        rc = ckpt_index_check_sum(&sf.sum, &ix->state_sum, path, err);
    statefile_close(&sf);
    return rc;
}

int trainer_checkpoint_check(const char *dir, int warn, Error *err)
{
    char path[4200], index[4200];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    snprintf(index, sizeof index, "%s/index.json", dir);
    Config saved;
    config_init(&saved);
    json_t *have = NULL, *want = NULL;
    int64_t step = 0;
    /* The reader's own checks first (they name what is malformed), then the comparison. */
    CkptIndex ix;
    int rc = ckpt_index_open(&ix, dir, err), opened = rc == 0;
    if (rc == 0)
        rc = ckpt_index_load(index, &have, err);
    if (rc == 0 && config_load_file(&saved, path, err) != 0)
        rc = -1;
    if (rc == 0 && config_resolve(&saved, 0, err) != 0)
        rc = -1;
    /* Bound (version 3): config.yaml's model keys (an edit is named by its key) and checksum, then
     * state.bin's ident (a foreign or stale one named so), its format and shape (the meta section: the
     * gathered format named) and its checksum, then every shard's ident and size; an older index: the
     * meta section only. */
    int bound = ix.version >= CKPT_INDEX_BOUND;
    if (rc == 0 && bound)
        rc = check_bound_config(&ix, have, &saved, dir, err);
    if (rc == 0 && bound)
        rc = check_bound_state(&ix, dir, 0, err);
    if (rc == 0)
        rc = trainer_meta_check(&saved, dir, &step, err);
    if (rc == 0 && bound)
        rc = check_bound_state(&ix, dir, 1, err);
    if (rc == 0)
        rc = ckpt_index_check_files(&ix, err);
    int version = ix.version;
    if (opened)
        ckpt_index_close(&ix);
    /* parallel.stage_layers auto: the split the saving run placed is the index's (checked above by
     * its checksum; its sum against the model's layers by trainer_index_json's table). */
    const json_t *split = json_object_get(json_object_get(have, "layout"), "stage_layers");
    int chunks = (int)(saved.parallel.pp * saved.parallel.virtual_stages);
    if (rc == 0 && saved.parallel.chunk_layers.n == 0) {
        int64_t *v = calloc((size_t)chunks, sizeof *v), sum = 0;
        if (!v)
            rc = error_runtime(err, dir, "out of memory");
        for (int g = 0; rc == 0 && g < chunks; g++) {
            v[g] = split ? (int64_t)json_integer_value(json_array_get(split, (size_t)g)) : 0;
            sum += v[g];
        }
        if (!split)
            config_even_layers(saved.model.n_layers, chunks, v);
        else if (rc == 0 && (json_array_size(split) != (size_t)chunks || sum != saved.model.n_layers))
            rc = error_set(err, index, "layout.stage_layers does not split config.yaml's %lld layers over %d chunks",
                           (long long)saved.model.n_layers, chunks);
        for (int g = 0; rc == 0 && g < chunks; g++)
            if (v[g] < 1)
                rc = error_set(err, index, "layout.stage_layers[%d] is not a layer count", g);
        if (rc == 0)
            saved.parallel.chunk_layers = (ConfigIntList){chunks, v};
        else
            free(v);
    }
    if (rc == 0)
        rc = trainer_index_json(&saved, step, &want, err);
    if (rc == 0)
        rc = check_index(have, want, index, err);
    /* An older checkpoint that passed what its format allows: one line on what could not be checked. */
    if (rc == 0 && version < CKPT_INDEX_BOUND && warn) {
        fprintf(stderr, "wlbtrain: warning: %s: a checkpoint of index version %d (an older wlbtrain): its files are "
                "not bound to their run, step and place and the index lists no sizes or checksums of them%s, so a "
                "swapped, stale or foreign shard or state.bin, or an edited model key of config.yaml, cannot be "
                "told; loaded with the checks its format allows (a save from it writes a bound checkpoint)\n",
                index, version, version < 2 ? " (nor of itself)" : "");
        fflush(stderr);
    }
    json_decref(have);
    json_decref(want);
    config_free(&saved);
    return rc;
}

int trainer_checkpoint_precheck(const Config *cfg, int lead, Error *err)
{
    char *path = NULL;
    Error quiet = {0};
    /* A checkpoint that cannot be found is left to the resume and the continuation to report, in
     * their words. */
    if (trainer_checkpoint_path(cfg, &path, &quiet) != 0)
        return 0;
    if (!path && cfg->checkpoint.continue_from && ckpt_step_folder(cfg->checkpoint.continue_from, &path, &quiet) != 0)
        return 0;
    int rc = path ? trainer_checkpoint_check(path, lead, err) : 0;
    free(path);
    return rc;
}

/* 1 when path is a folder that a user inspects as a checkpoint: a step folder (index.json), or a
 * checkpoint folder (latest) holding no flight recorder files (those are inspected as a hang's). */
static int is_checkpoint_folder(const char *path)
{
    char file[4200];
    struct stat st;
    snprintf(file, sizeof file, "%s/index.json", path);
    if (stat(file, &st) == 0)
        return 1;
    snprintf(file, sizeof file, "%s/latest", path);
    if (stat(file, &st) != 0)
        return 0;
    DIR *d = opendir(path);
    struct dirent *e;
    int flight = 0;
    while (d && !flight && (e = readdir(d)))
        flight = !strncmp(e->d_name, "flight-rank-", 12);
    if (d)
        closedir(d);
    return !flight;
}

int trainer_checkpoint_inspect(const char *path, int *handled, Error *err)
{
    *handled = is_checkpoint_folder(path);
    if (!*handled)
        return 0;
    char *dir;
    if (ckpt_step_folder(path, &dir, err) != 0)
        return -1;
    CkptIndex ix;
    int rc = trainer_checkpoint_check(dir, 1, err), opened = 0;
    if (rc == 0)
        rc = ckpt_index_open(&ix, dir, err);
    opened = rc == 0;
    /* Every shard read whole: its CRCs, and with a bound index its CRC-32 against the index's. */
    uint64_t bytes = 0;
    for (int i = 0; rc == 0 && i < ix.n_files; i++) {
        rc = ckpt_index_open_file(&ix, i, err);
        bytes += rc == 0 ? ix.sf[i].sum.bytes : 0;
    }
    if (rc == 0) {
        char run[40] = "none (an older checkpoint)", parent[80] = "";
        if (ix.run)
            ckpt_run_text(ix.run, run);
        if (ix.parent_run) {
            char p[CKPT_RUN_HEX];
            ckpt_run_text(ix.parent_run, p);
            snprintf(parent, sizeof parent, ", continued from run %s after step %lld", p, (long long)ix.parent_step);
        }
        printf("checkpoint: %s: after step %lld, run %s%s; index version %d; layout tp %d, cp %d, pp %d, dp %d, "
               "virtual_stages %d, zero %d; %d shard file%s, %llu bytes\n", dir, (long long)ix.step, run, parent,
               ix.version, ix.tp, ix.cp, ix.pp, ix.dp, ix.virtual_stages, ix.zero, ix.n_files,
               ix.n_files == 1 ? "" : "s", (unsigned long long)bytes);
        printf("checkpoint: %s\n", ix.version >= CKPT_INDEX_BOUND
                                        ? "every file is this checkpoint's: index.json's checksum and entries, "
                                          "config.yaml's model keys and checksum, state.bin's and every shard's "
                                          "ident, size, CRC-32 and sections' CRCs"
                                        : "index.json's entries, config.yaml against state.bin, every section's "
                                          "CRC: the files' run, step and place cannot be checked (older format)");
    }
    if (opened)
        ckpt_index_close(&ix);
    free(dir);
    return rc;
}
