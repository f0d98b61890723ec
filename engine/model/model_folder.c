/*
 * engine/model/model_folder.c - the weights of a Hugging Face model folder (train.init_from naming a
 * directory; its config.json was read into the config by config/config_folder.c).
 *
 * The folder holds model.safetensors (taken first, as transformers does, when both are there), or
 * model.safetensors.index.json - {"metadata": {...},
 * "weight_map": {tensor name: shard file name}} - and the shards it names (the Hub's layout:
 * model-00001-of-00004.safetensors, ...). Before a weight is read, the index and the shards' headers
 * must agree: every shard the index names is there, every tensor the model needs is in the index,
 * every tensor of a shard is one the index puts in that shard and every tensor the index puts in a
 * shard is in it; anything else is one error naming the file and the tensor. Then each shard is
 * read once, tensor by tensor (each into one full-tensor buffer, its rank's block copied out):
 * nothing of the model is held in host memory beyond the rank's own parameters and one tensor.
 * Tensors the model does not need (lm_head when the embeddings are tied, rotary_emb.inv_freq of old
 * exports) are not read.
 *
 * Which files: a shard name of weight_map must be a plain file name of the folder - not empty, no
 * '/' (so no "../other/x", "sub/x" or absolute path), not "." or "..". The index is a file anyone
 * can edit or download, and the folder is what the user gave: a name that is a path would load
 * weights from elsewhere. A name that is a symlink of the folder is followed wherever it points:
 * the folder's own entries are the user's, and Hugging Face's cache makes every file of a snapshot
 * a symlink into its blobs/ folder (snapshots/REV/model-00001-of-00004.safetensors ->
 * ../../blobs/HASH), which must load. What the name leads to must be a regular file (file_map: a
 * folder, a device or a FIFO is refused, a FIFO without blocking on it).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/model_impl.h"

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

typedef struct Shards {
    const char **names; /* distinct shard file names of the index (into its JSON), sorted */
    int n;
    StFile *files;      /* opened, n of them */
    int opened;
} Shards;

static void shards_free(Shards *s)
{
    for (int i = 0; i < s->opened; i++)
        st_close(&s->files[i]);
    free(s->files);
    free(s->names);
}

/* The distinct file names of weight_map, checked to be plain file names in the folder. */
static int shard_names(json_t *map, Shards *s, const char *index, Error *err)
{
    size_t n = json_object_size(map);
    s->names = malloc((n + 1) * sizeof *s->names);
    if (!s->names)
        return error_runtime(err, index, "out of memory");
    const char *tensor;
    json_t *file;
    json_object_foreach(map, tensor, file)
    {
        const char *f = json_is_string(file) ? json_string_value(file) : NULL;
        if (!f || !*f || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, ".."))
            return error_set(err, index, "weight_map: %s: not a file name of the folder", tensor);
        s->names[s->n++] = f;
    }
    qsort(s->names, (size_t)s->n, sizeof *s->names, by_name);
    int distinct = 0;
    for (int i = 0; i < s->n; i++)
        if (distinct == 0 || strcmp(s->names[i], s->names[distinct - 1]))
            s->names[distinct++] = s->names[i];
    s->n = distinct;
    return 0;
}

/* A tensor the index puts in shard f (for the error). */
static const char *first_in(json_t *map, const char *f)
{
    const char *tensor;
    json_t *file;
    json_object_foreach(map, tensor, file) if (!strcmp(json_string_value(file), f)) return tensor;
    return "";
}

/* The index and the shards agree (see the top); the shards are left open in s->files. */
static int check_shards(const Model *m, const char *dir, json_t *map, Shards *s, const char *index, Error *err)
{
    char path[4400];
    for (int i = 0; i < s->n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->names[i]);
        if (!exists(path))
            return error_set(err, index, "shard %s is missing from the folder (the index puts %s in it)", s->names[i],
                             first_in(map, s->names[i]));
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (!json_object_get(map, m->tensors[i].name))
            return error_set(err, index, "no tensor %s in weight_map (it names %zu tensors; wlbtrain reads Hugging "
                             "Face Llama names)", m->tensors[i].name, json_object_size(map));
    s->files = calloc((size_t)s->n + 1, sizeof *s->files);
    if (!s->files)
        return error_runtime(err, index, "out of memory");
    for (int i = 0; i < s->n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->names[i]);
        if (st_open(&s->files[i], path, err) != 0)
            return -1;
        s->opened++;
        const StFile *f = &s->files[i];
        for (int t = 0; t < f->n_tensors; t++) {
            json_t *at = json_object_get(map, f->tensors[t].name);
            if (!at)
                return error_set(err, path, "holds tensor %s, which the index's weight_map does not name",
                                 f->tensors[t].name);
            if (strcmp(json_string_value(at), s->names[i]))
                return error_set(err, path, "holds tensor %s, which the index puts in %s", f->tensors[t].name,
                                 json_string_value(at));
        }
        const char *tensor;
        json_t *file;
        json_object_foreach(map, tensor, file)
        {
            if (!strcmp(json_string_value(file), s->names[i]) && !st_find(f, tensor))
                return error_set(err, index, "puts tensor %s in %s, which does not hold it", tensor, s->names[i]);
        }
    }
    return 0;
}

/* Each shard once: its tensors that the rank holds a block of, into host. */
static int read_shards(Model *m, const char *dir, json_t *map, const Shards *s, Error *err)
{
    char path[4400];
    float *host = malloc((size_t)m->n_params * sizeof *host), *full = model_full_buffer(m);
    int rc = host && full ? 0 : error_runtime(err, "init_from", "out of memory");
    for (int i = 0; rc == 0 && i < s->n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->names[i]);
        for (int t = 0; rc == 0 && t < m->n_tensors; t++) {
            const ModelTensor *mt = &m->tensors[t];
            if (strcmp(json_string_value(json_object_get(map, mt->name)), s->names[i]))
                continue;
            rc = model_load_tensor(m, mt, st_find(&s->files[i], mt->name), path, full, host, err);
        }
    }
    if (rc == 0) {
        m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
        model_weights_changed(m);
    }
    free(host);
    free(full);
    return rc;
}

int model_load_folder(Model *m, const char *dir, Error *err)
{
    char index[4200], single[4200];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    /* model.safetensors first, as transformers takes it (an index beside it is not read). */
    if (exists(single))
        return model_load(m, single, err);
    if (!exists(index))
        return error_set(err, dir, "a model folder without model.safetensors or model.safetensors.index.json");
    struct stat st;
    if (stat(index, &st) != 0 || !S_ISREG(st.st_mode)) /* a FIFO would block the read */
        return error_set(err, index, "not a regular file");
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return error_set(err, index, "not JSON: line %d: %s", je.line, je.text);
    json_t *map = json_object_get(root, "weight_map");
    Shards s = {0};
    int rc = json_is_object(map) ? 0 : error_set(err, index, "no weight_map object (tensor name: shard file)");
    if (rc == 0)
        rc = shard_names(map, &s, index, err);
    if (rc == 0)
        rc = check_shards(m, dir, map, &s, index, err);
    if (rc == 0)
        rc = read_shards(m, dir, map, &s, err);
    shards_free(&s);
    json_decref(root);
    return rc;
}
