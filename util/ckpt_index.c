/* util/ckpt_index.c - reading the index of a sharded checkpoint, and checking its files against it
 * (see ckpt_index.h; the files' and folders' names: ckpt_folder.c). */
#include "util/ckpt_index.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- reading ---------------------------------------------------------------------------------- */

/* The largest side of a tensor and the largest parameter vector an index may describe. */
#define SIDE ((int64_t)1 << 31)
#define BIG ((int64_t)1 << 50)

static int file_index(const CkptIndex *ix, const char *name)
{
    for (int i = 0; i < ix->n_files; i++)
        if (!strcmp(ix->files[i], name))
            return i;
    return -1;
}

const CkptChunk *ckpt_index_chunk(const CkptIndex *ix, int tp, int chunk)
{
    for (int i = 0; i < ix->n_chunks; i++)
        if (ix->chunks[i].tp == tp && ix->chunks[i].chunk == chunk)
            return &ix->chunks[i];
    return NULL;
}

const CkptTensor *ckpt_index_tensor(const CkptIndex *ix, const char *name)
{
    for (int i = 0; i < ix->n_tensors; i++)
        if (!strcmp(ix->tensors[i].name, name))
            return &ix->tensors[i];
    return NULL;
}

static int bad(Error *err, const char *path, const char *what, const char *detail)
{
    return error_set(err, path, "%s%s%s", what, detail && detail[0] ? ": " : "", detail ? detail : "");
}

static int read_files(CkptIndex *ix, json_t *files, const char *path, Error *err)
{
    ix->n_files = (int)json_array_size(files);
    ix->files = calloc((size_t)ix->n_files + 1, sizeof *ix->files);
    ix->sf = calloc((size_t)ix->n_files + 1, sizeof *ix->sf);
    ix->opened = calloc((size_t)ix->n_files + 1, 1);
    if (!ix->files || !ix->sf || !ix->opened)
        return error_runtime(err, path, "out of memory");
    for (int i = 0; i < ix->n_files; i++) {
        const char *f = json_string_value(json_array_get(files, (size_t)i));
        if (!f || !f[0] || strlen(f) >= sizeof ix->files[0] || strchr(f, '/') || f[0] == '.')
            return error_set(err, path, "files[%d] is not a file name of the checkpoint folder", i);
        snprintf(ix->files[i], sizeof ix->files[0], "%s", f);
    }
    return 0;
}

/* layout.stage_layers: absent, or a count of at least 1 per model chunk. */
static int read_stage_layers(CkptIndex *ix, json_t *list, const char *path, Error *err)
{
    if (!list)
        return 0;
    size_t chunks = (size_t)ix->pp * (size_t)ix->virtual_stages;
    if (!json_is_array(list) || json_array_size(list) != chunks)
        return error_set(err, path, "layout.stage_layers is not a list of %zu layer counts (pp x virtual_stages)",
                         chunks);
    if (!(ix->stage_layers = malloc(chunks * sizeof *ix->stage_layers)))
        return error_runtime(err, path, "out of memory");
    for (size_t g = 0; g < chunks; g++) {
        json_t *n = json_array_get(list, g);
        ix->stage_layers[g] = json_is_integer(n) ? (int64_t)json_integer_value(n) : 0;
        if (ix->stage_layers[g] < 1 || ix->stage_layers[g] > 65536)
            return error_set(err, path, "layout.stage_layers[%zu] is not a layer count", g);
    }
    return 0;
}

static int section_name(char *dst, const char *s, const char *path, const char *where, Error *err)
{
    if (!s || !s[0] || strlen(s) >= STATE_NAME_LEN)
        return error_set(err, path, "%s: not a section name", where);
    snprintf(dst, STATE_NAME_LEN, "%s", s);
    return 0;
}

static int read_chunks(CkptIndex *ix, json_t *chunks, const char *path, Error *err)
{
    ix->n_chunks = (int)json_array_size(chunks);
    ix->chunks = calloc((size_t)ix->n_chunks + 1, sizeof *ix->chunks);
    if (!ix->chunks)
        return error_runtime(err, path, "out of memory");
    for (int i = 0; i < ix->n_chunks; i++) {
        CkptChunk *c = &ix->chunks[i];
        json_error_t je;
        json_t *shards;
        const char *file, *section;
        json_int_t n;
        char where[64];
        snprintf(where, sizeof where, "chunks[%d]", i);
        if (json_unpack_ex(json_array_get(chunks, (size_t)i), &je, 0, "{s:i, s:i, s:I, s:s, s:s, s:o}", "tp", &c->tp,
                           "chunk", &c->chunk, "params", &n, "file", &file, "section", &section, "moments", &shards) != 0)
            return bad(err, path, where, je.text);
        c->n = n;
        if ((c->file = file_index(ix, file)) < 0)
            return error_set(err, path, "%s names file %.64s, not in files", where, file);
        if (section_name(c->section, section, path, where, err) != 0)
            return -1;
        if (c->tp < 0 || c->tp >= ix->tp || c->chunk < 0 || c->chunk >= ix->pp * ix->virtual_stages || c->n <= 0 || c->n > BIG ||
            ckpt_index_chunk(ix, c->tp, c->chunk) != c)
            return error_set(err, path, "%s: tp %d, chunk %d, %lld parameters do not fit the layout", where, c->tp,
                             c->chunk, (long long)c->n);
        c->n_shards = (int)json_array_size(shards);
        c->shards = calloc((size_t)c->n_shards + 1, sizeof *c->shards);
        if (!c->shards)
            return error_runtime(err, path, "out of memory");
        int64_t at = 0;
        for (int k = 0; k < c->n_shards; k++) {
            CkptShard *s = &c->shards[k];
            const char *sf, *m, *v;
            json_int_t b, e;
            if (json_unpack_ex(json_array_get(shards, (size_t)k), &je, 0, "{s:s, s:I, s:I, s:s, s:s}", "file", &sf,
                               "begin", &b, "end", &e, "m", &m, "v", &v) != 0)
                return bad(err, path, where, je.text);
            s->begin = b, s->end = e;
            if ((s->file = file_index(ix, sf)) < 0)
                return error_set(err, path, "%s names file %.64s, not in files", where, sf);
            if (section_name(s->m, m, path, where, err) != 0 || section_name(s->v, v, path, where, err) != 0)
                return -1;
            /* The shards, in order, partition [0, n). */
            if (s->begin != at || s->end < s->begin || s->end > c->n)
                return error_set(err, path, "%s: moment shard %d is [%lld, %lld), expected to start at %lld", where,
                                 k, (long long)s->begin, (long long)s->end, (long long)at);
            at = s->end;
        }
        if (at != c->n)
            return error_set(err, path, "%s: the moment shards cover %lld of %lld parameters", where, (long long)at,
                             (long long)c->n);
    }
    return 0;
}

static int blocks_overlap(const CkptBlock *a, const CkptBlock *b)
{
    return a->row0 < b->row0 + b->rows && b->row0 < a->row0 + a->rows && a->col0 < b->col0 + b->cols &&
           b->col0 < a->col0 + a->cols;
}

static int read_tensors(CkptIndex *ix, json_t *tensors, const char *path, Error *err)
{
    ix->n_tensors = (int)json_object_size(tensors);
    ix->tensors = calloc((size_t)ix->n_tensors + 1, sizeof *ix->tensors);
    if (!ix->tensors)
        return error_runtime(err, path, "out of memory");
    const char *name;
    json_t *e;
    int i = 0;
    json_object_foreach(tensors, name, e) {
        CkptTensor *t = &ix->tensors[i++];
        json_error_t je;
        json_t *shape, *blocks;
        if (strlen(name) >= sizeof t->name)
            return error_set(err, path, "tensor name of %zu characters", strlen(name));
        snprintf(t->name, sizeof t->name, "%s", name);
        if (json_unpack_ex(e, &je, 0, "{s:o, s:o}", "shape", &shape, "blocks", &blocks) != 0 ||
            !json_is_array(blocks))
            return bad(err, path, name, je.text);
        json_int_t r = 1, c = 0;
        t->is_vector = json_array_size(shape) == 1;
        if ((t->is_vector ? json_unpack(shape, "[I]", &c) : json_unpack(shape, "[I, I]", &r, &c)) != 0 || r <= 0 ||
            r > SIDE || c > SIDE ||
            c <= 0)
            return error_set(err, path, "%s: the shape is not [rows, cols] or [cols]", name);
        t->rows = r, t->cols = c;
        t->n_blocks = (int)json_array_size(blocks);
        t->blocks = calloc((size_t)t->n_blocks + 1, sizeof *t->blocks);
        if (!t->blocks)
            return error_runtime(err, path, "out of memory");
        int64_t area = 0;
        for (int k = 0; k < t->n_blocks; k++) {
            CkptBlock *b = &t->blocks[k];
            const char *file, *section;
            json_int_t off, r0, rs, c0, cs;
            int tp, chunk;
            if (json_unpack_ex(json_array_get(blocks, (size_t)k), &je, 0, "{s:s, s:s, s:I, s:i, s:i, s:I, s:I, s:I, s:I}",
                               "file", &file, "section", &section, "offset", &off, "tp", &tp, "chunk", &chunk, "row0",
                               &r0, "rows", &rs, "col0", &c0, "cols", &cs) != 0)
                return bad(err, path, name, je.text);
            const CkptChunk *ch = ckpt_index_chunk(ix, tp, chunk);
            b->offset = off, b->row0 = r0, b->rows = rs, b->col0 = c0, b->cols = cs;
            b->chunk = ch ? (int)(ch - ix->chunks) : -1;
            if ((b->file = file_index(ix, file)) < 0 || !ch)
                return error_set(err, path, "%s: block %d names file %.64s or chunk (tp %d, chunk %d), not in the "
                                 "index", name, k, file, tp, chunk);
            if (section_name(b->section, section, path, name, err) != 0)
                return -1;
            if (b->file != ch->file || strcmp(b->section, ch->section) != 0)
                return error_set(err, path, "%s: block %d names %.64s:%s, not the weights of its chunk (%s:%s)", name,
                                 k, file, b->section, ix->files[ch->file], ch->section);
            /* Each value is bounded before any sum or product of them (SIDE^2 + BIG < 2^63). */
            if (r0 < 0 || rs <= 0 || r0 > SIDE || rs > SIDE || r0 + rs > r || c0 < 0 || cs <= 0 || c0 > SIDE ||
                cs > SIDE || c0 + cs > c || off < 0 || off > BIG || off + rs * cs > ch->n)
                return error_set(err, path, "%s: block %d [%lld + %lld, %lld + %lld] at %lld is outside the tensor "
                                 "or its chunk", name, k, (long long)r0, (long long)rs, (long long)c0, (long long)cs,
                                 (long long)off);
            area += rs * cs;
            if (area > r * c)
                break; /* reported below, before the sum could overflow */
        }
        if (area != r * c)
            return error_set(err, path, "%s: the blocks hold %lld of its %lld values", name, (long long)area,
                             (long long)(r * c));
        /* Disjoint blocks whose areas add up to the tensor's cover every value exactly once. */
        for (int k = 0; k < t->n_blocks; k++)
            for (int j = k + 1; j < t->n_blocks; j++)
                if (blocks_overlap(&t->blocks[k], &t->blocks[j]))
                    return error_set(err, path, "%s: blocks %d and %d overlap", name, k, j);
    }
    return 0;
}

/* A {"bytes": N, "crc32": "8 hex digits"} entry of contents. */
static int read_sum(json_t *e, StateSum *sum, const char *path, const char *name, Error *err)
{
    json_int_t bytes;
    const char *hex;
    unsigned crc;
    if (json_unpack(e, "{s:I, s:s}", "bytes", &bytes, "crc32", &hex) != 0 || json_object_size(e) != 2 || bytes < 0 ||
        strlen(hex) != 8 || strspn(hex, "0123456789abcdef") != 8 || sscanf(hex, "%8x", &crc) != 1)
        return error_set(err, path, "contents: %.64s is not {\"bytes\": N, \"crc32\": 8 hex digits}", name);
    sum->bytes = (uint64_t)bytes;
    sum->crc = crc;
    return 0;
}

/* Version 3's binding: the run id, model (checked by its caller), and contents: every shard file,
 * state.bin and config.yaml, each with its size and CRC-32; each shard's place from its name. */
static int read_bound(CkptIndex *ix, json_t *root, const char *path, Error *err)
{
    json_t *run = json_object_get(root, "run"), *contents = json_object_get(root, "contents");
    json_t *parent = json_object_get(run, "parent");
    if (!json_is_object(run) || ckpt_run_parse(json_string_value(json_object_get(run, "id")), &ix->run) != 0 ||
        json_object_size(run) != (size_t)(parent ? 2 : 1))
        return error_set(err, path, "run is not {\"id\": 16 hex digits} (with a continued run's parent)");
    if (parent && (json_object_size(parent) != 2 ||
                   ckpt_run_parse(json_string_value(json_object_get(parent, "id")), &ix->parent_run) != 0 ||
                   !json_is_integer(json_object_get(parent, "step")) ||
                   json_integer_value(json_object_get(parent, "step")) < 0))
        return error_set(err, path, "run.parent is not {\"id\": 16 hex digits, \"step\": N}");
    ix->parent_step = parent ? (int64_t)json_integer_value(json_object_get(parent, "step")) : 0;
    if (!json_is_object(json_object_get(root, "model")))
        return error_set(err, path, "no model (config.yaml's model keys), which index version %d carries",
                         ix->version);
    if (!json_is_object(contents) || json_object_size(contents) != (size_t)ix->n_files + 2)
        return error_set(err, path, "contents does not list the %d shard files, state.bin and config.yaml (%zu "
                         "entries)", ix->n_files, json_object_size(contents));
    ix->sums = calloc((size_t)ix->n_files + 1, sizeof *ix->sums);
    ix->place = calloc((size_t)ix->n_files + 1, sizeof *ix->place);
    if (!ix->sums || !ix->place)
        return error_runtime(err, path, "out of memory");
    for (int i = 0; i < ix->n_files; i++) {
        json_t *e = json_object_get(contents, ix->files[i]);
        int *pl = ix->place[i], end = 0;
        if (!e)
            return error_set(err, path, "contents does not list %.64s", ix->files[i]);
        if (read_sum(e, &ix->sums[i], path, ix->files[i], err) != 0)
            return -1;
        char again[64];
        if (sscanf(ix->files[i], "shard-tp%d-pp%d-dpcp%d.bin%n", &pl[0], &pl[1], &pl[2], &end) != 3 ||
            (size_t)end != strlen(ix->files[i]) || pl[0] < 0 || pl[1] < 0 || pl[2] < 0)
            return error_set(err, path, "files: %.64s is not a shard file name (shard-tpT-ppP-dpcpZ.bin)",
                             ix->files[i]);
        ckpt_shard_file(again, sizeof again, pl[0], pl[1], pl[2]);
        if (strcmp(again, ix->files[i]) != 0)
            return error_set(err, path, "files: %.64s is not a shard file name (shard-tpT-ppP-dpcpZ.bin)",
                             ix->files[i]);
    }
    json_t *st = json_object_get(contents, "state.bin"), *cy = json_object_get(contents, "config.yaml");
    if (!st || !cy)
        return error_set(err, path, "contents does not list state.bin and config.yaml");
    if (read_sum(st, &ix->state_sum, path, "state.bin", err) != 0 ||
        read_sum(cy, &ix->config_sum, path, "config.yaml", err) != 0)
        return -1;
    return 0;
}

int ckpt_index_crc(const json_t *root, uint32_t *crc)
{
    json_t *copy = json_copy((json_t *)root); /* shallow: only the top-level key is dropped */
    if (!copy)
        return -1;
    json_object_del(copy, "crc32");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    json_decref(copy);
    if (!text)
        return -1;
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n = strlen(text);
    for (size_t at = 0; at < n;) { /* pieces small enough for zlib's uInt */
        size_t k = n - at < ((size_t)1 << 30) ? n - at : ((size_t)1 << 30);
        c = crc32(c, (const Bytef *)text + at, (uInt)k);
        at += k;
    }
    free(text);
    *crc = (uint32_t)c;
    return 0;
}

int ckpt_index_load(const char *path, json_t **out, Error *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    *out = NULL;
    if (!root)
        return je.line > 0 ? error_set(err, path, "line %d: %s", je.line, je.text) : bad(err, path, je.text, NULL);
    json_t *v = json_object_get(root, "version"), *sum = json_object_get(root, "crc32");
    json_int_t version = json_is_integer(v) ? json_integer_value(v) : 0;
    int rc = 0;
    /* Version 1 carries no checksum; a version this reader does not know is refused by its caller. */
    if (version >= 2 && version <= CKPT_INDEX_VERSION) {
        const char *text = json_string_value(sum);
        uint32_t have = 0;
        char hex[16];
        if (!text || strlen(text) != 8 || strspn(text, "0123456789abcdef") != 8)
            rc = error_set(err, path, "no checksum (\"crc32\": 8 hex digits), which index version %d carries: edited "
                           "or damaged (resume or export an intact checkpoint)", (int)version);
        else if (ckpt_index_crc(root, &have) != 0)
            rc = error_runtime(err, path, "out of memory");
        snprintf(hex, sizeof hex, "%08x", have);
        if (rc == 0 && strcmp(hex, text) != 0)
            rc = error_set(err, path, "checksum %s, the content's is %s: the index was edited or damaged after it "
                           "was written (resume or export an intact checkpoint)", text, hex);
    } else if (version == 1 && sum) {
        rc = error_set(err, path, "a checksum in an index of version 1, which carries none: edited or damaged");
    }
    if (rc == 0 && sum)
        json_object_del(root, "crc32");
    if (rc != 0) {
        json_decref(root);
        return -1;
    }
    *out = root;
    return 0;
}

int ckpt_index_open(CkptIndex *ix, const char *dir, Error *err)
{
    memset(ix, 0, sizeof *ix);
    snprintf(ix->dir, sizeof ix->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/index.json", dir);
    json_error_t je;
    json_t *root, *files, *chunks, *tensors;
    if (ckpt_index_load(path, &root, err) != 0)
        return -1;
    int version = 0, rc = 0;
    json_int_t step = 0;
    if (json_unpack_ex(root, &je, 0, "{s:i, s:I, s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:o, s:o, s:o}", "version", &version,
                       "step", &step, "layout", "tp", &ix->tp, "cp", &ix->cp, "pp", &ix->pp, "dp", &ix->dp, "virtual_stages",
                       &ix->virtual_stages, "zero", &ix->zero, "files", &files, "chunks", &chunks, "tensors",
                       &tensors) != 0)
        rc = bad(err, path, "not a wlbtrain checkpoint index", je.text);
    else if (version < 1 || version > CKPT_INDEX_VERSION)
        rc = error_set(err, path, "index version %d; this wlbtrain reads versions 1 to %d", version, CKPT_INDEX_VERSION);
    else if (version < CKPT_INDEX_BOUND && (json_object_get(root, "run") || json_object_get(root, "contents")))
        rc = error_set(err, path, "run or contents in an index of version %d, which carries neither: edited or "
                       "damaged", version);
    else if (ix->tp <= 0 || ix->cp <= 0 || ix->pp <= 0 || ix->dp <= 0 || ix->virtual_stages <= 0 || ix->tp > 65536 ||
             ix->cp > 65536 || ix->pp > 65536 || ix->dp > 65536 || ix->virtual_stages > 65536 ||
             !json_is_array(files) || !json_is_array(chunks) || !json_is_object(tensors))
        rc = error_set(err, path, "not a wlbtrain checkpoint index (layout, files, chunks, tensors)");
    ix->step = step;
    ix->version = version;
    if (rc == 0)
        rc = read_stage_layers(ix, json_object_get(json_object_get(root, "layout"), "stage_layers"), path, err);
    if (rc == 0)
        rc = read_files(ix, files, path, err);
    if (rc == 0)
        rc = read_chunks(ix, chunks, path, err);
    if (rc == 0)
        rc = read_tensors(ix, tensors, path, err);
    if (rc == 0 && version >= CKPT_INDEX_BOUND)
        rc = read_bound(ix, root, path, err);
    json_decref(root);
    if (rc != 0)
        ckpt_index_close(ix);
    return rc;
}

void ckpt_index_close(CkptIndex *ix)
{
    for (int i = 0; i < ix->n_files; i++)
        if (ix->opened && ix->opened[i])
            statefile_close(&ix->sf[i]);
    for (int i = 0; ix->chunks && i < ix->n_chunks; i++)
        free(ix->chunks[i].shards);
    for (int i = 0; ix->tensors && i < ix->n_tensors; i++)
        free(ix->tensors[i].blocks);
    free(ix->stage_layers);
    free(ix->sums);
    free(ix->place);
    free(ix->files);
    free(ix->sf);
    free(ix->opened);
    free(ix->chunks);
    free(ix->tensors);
    memset(ix, 0, sizeof *ix);
}

void ckpt_index_state_ident(const CkptIndex *ix, CkptIdent *id)
{
    *id = (CkptIdent){ix->run, ix->step, CKPT_ROLE_STATE, -1, -1, -1, ix->tp, ix->cp, ix->pp, ix->dp,
                      ix->virtual_stages, ix->zero};
}

int ckpt_index_check_sum(const StateSum *have, const StateSum *want, const char *path, Error *err)
{
    if (have->bytes != want->bytes || have->crc != want->crc)
        return error_set(err, path, "%llu bytes, CRC-32 %08x; index.json lists %llu bytes, %08x: replaced or changed "
                         "after the checkpoint was written", (unsigned long long)have->bytes, have->crc,
                         (unsigned long long)want->bytes, want->crc);
    return 0;
}

/* What the index lists of shard file i: its ident. */
static CkptIdent shard_ident(const CkptIndex *ix, int i)
{
    return (CkptIdent){ix->run, ix->step, CKPT_ROLE_SHARD, ix->place[i][0], ix->place[i][1], ix->place[i][2],
                       ix->tp, ix->cp, ix->pp, ix->dp, ix->virtual_stages, ix->zero};
}

static int no_ident(const CkptIndex *ix, const char *path, Error *err)
{
    return error_set(err, path, "no ident section: a shard file written before checkpoints were bound to their run "
                     "(index.json, version %d, lists one that is), so not this checkpoint's", ix->version);
}

int ckpt_index_check_files(CkptIndex *ix, Error *err)
{
    for (int i = 0; ix->version >= CKPT_INDEX_BOUND && i < ix->n_files; i++) {
        char path[4200];
        uint64_t w[CKPT_IDENT_WORDS], bytes;
        snprintf(path, sizeof path, "%s/%s", ix->dir, ix->files[i]);
        CkptIdent have, want = shard_ident(ix, i);
        int found = statefile_peek(path, CKPT_IDENT_SECTION, w, sizeof w, &bytes, err);
        if (found < 0 || (found == 1 && no_ident(ix, path, err)) || ckpt_ident_parse(w, path, &have, err) != 0 ||
            ckpt_ident_check(&have, &want, path, err) != 0)
            return -1;
        if (bytes != ix->sums[i].bytes)
            return error_set(err, path, "%llu bytes; index.json lists %llu: replaced or changed after the checkpoint "
                             "was written", (unsigned long long)bytes, (unsigned long long)ix->sums[i].bytes);
    }
    return 0;
}

int ckpt_index_open_file(CkptIndex *ix, int i, Error *err)
{
    if (ix->opened[i])
        return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ix->dir, ix->files[i]);
    if (statefile_open(&ix->sf[i], path, err) != 0)
        return -1;
    /* Bound (version 3): what the file says it is first - a swapped, stale or foreign file is named
     * as such -, then its size and checksum. */
    int rc = 0;
    if (ix->version >= CKPT_INDEX_BOUND) {
        CkptIdent have, want = shard_ident(ix, i);
        int found = ckpt_ident_read(&ix->sf[i], path, &have, err);
        if (found == 0)
            rc = no_ident(ix, path, err);
        else if (found < 0 || ckpt_ident_check(&have, &want, path, err) != 0)
            rc = -1;
        if (rc == 0)
            rc = ckpt_index_check_sum(&ix->sf[i].sum, &ix->sums[i], path, err);
    }
    if (rc != 0) {
        statefile_close(&ix->sf[i]);
        return -1;
    }
    ix->opened[i] = 1;
    ix->files_opened++;
    return 0;
}

/* Section `section` of file i, which must hold n floats (the file opened, CRCs checked, on first use). */
static int section(CkptIndex *ix, int i, const char *name, int64_t n, const float **data, Error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ix->dir, ix->files[i]);
    if (ckpt_index_open_file(ix, i, err) != 0)
        return -1;
    const StateSection *s = statefile_find(&ix->sf[i], name);
    if (!s)
        return error_set(err, path, "no section %s (index.json names it)", name);
    if (s->size != (uint64_t)n * sizeof(float))
        return error_set(err, path, "section %s has %llu bytes, index.json says %lld floats", name,
                         (unsigned long long)s->size, (long long)n);
    *data = s->data; /* sections start at multiples of 8 of a page-aligned mapping */
    return 0;
}

int ckpt_index_range(CkptIndex *ix, const CkptChunk *c, int what, int64_t begin, int64_t end, CkptPut put, void *ctx,
                     float *dst, Error *err)
{
    const float *data;
    if (what == 0) {
        if (section(ix, c->file, c->section, c->n, &data, err) != 0)
            return -1;
        if (!ix->verify_only)
            put(ctx, dst, data + begin, end - begin);
        return 0;
    }
    for (int k = 0; k < c->n_shards; k++) {
        const CkptShard *s = &c->shards[k];
        int64_t lo = s->begin > begin ? s->begin : begin, hi = s->end < end ? s->end : end;
        if (lo >= hi)
            continue; /* a shard this range does not need is not opened */
        if (section(ix, s->file, what == 1 ? s->m : s->v, s->end - s->begin, &data, err) != 0)
            return -1;
        if (!ix->verify_only)
            put(ctx, dst + (lo - begin), data + (lo - s->begin), hi - lo);
    }
    return 0;
}

static void put_host(void *ctx, float *dst, const float *src, int64_t n)
{
    (void)ctx;
    memcpy(dst, src, (size_t)n * sizeof *dst);
}

int ckpt_index_full(CkptIndex *ix, const CkptTensor *t, int what, float *full, float *tmp, Error *err)
{
    for (int k = 0; k < t->n_blocks; k++) {
        const CkptBlock *b = &t->blocks[k];
        const CkptChunk *c = &ix->chunks[b->chunk];
        const float *src = tmp;
        if (what == 0) { /* the block's own file and section */
            const float *data;
            if (section(ix, b->file, b->section, c->n, &data, err) != 0)
                return -1;
            src = data + b->offset;
        } else if (ckpt_index_range(ix, c, what, b->offset, b->offset + b->rows * b->cols, put_host, NULL, tmp, err) != 0) {
            return -1;
        }
        for (int64_t r = 0; !ix->verify_only && r < b->rows; r++)
            memcpy(full + (b->row0 + r) * t->cols + b->col0, src + r * b->cols, (size_t)b->cols * sizeof *full);
    }
    return 0;
}
