/* util/safetensors.c - reading and writing safetensors files (see safetensors.h). */
#include "util/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/bf16.h"

static const struct {
    const char *name;
    int size;
} dtypes[] = {[ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
              [ST_F64] = {"F64", 8}, [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8}};

const char *st_dtype_name(StDtype d) { return dtypes[d].name; }

static uint64_t load_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* One tensor's entry; its bytes [*begin, *end) of the data section are checked to lie inside it. */
static int parse_entry(StTensor *t, const char *name, json_t *e, uint64_t data_size, const unsigned char *data,
                       uint64_t *begin, uint64_t *end, const char *path, Error *err)
{
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
           *off = json_object_get(e, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(off) || json_array_size(off) != 2)
        return error_set(err, path, "tensor %s: needs dtype, shape and data_offsets", name);
    int d = -1;
    for (int i = 0; i < (int)(sizeof dtypes / sizeof dtypes[0]); i++)
        if (!strcmp(json_string_value(dt), dtypes[i].name))
            d = i;
    if (d < 0)
        return error_set(err, path, "tensor %s: dtype %s is not one wlbtrain reads (F32, F16, BF16, F64, I32, I64)",
                         name, json_string_value(dt));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return error_set(err, path, "tensor %s: more than %d dimensions", name, ST_MAX_DIMS);
    t->dtype = (StDtype)d;
    t->n_dims = (int)json_array_size(shape);
    t->numel = 1;
    for (int i = 0; i < t->n_dims; i++) {
        json_t *v = json_array_get(shape, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (INT64_C(1) << 40))
            return error_set(err, path, "tensor %s: bad shape", name);
        t->shape[i] = json_integer_value(v);
        if (t->shape[i] && t->numel > (INT64_C(1) << 46) / t->shape[i])
            return error_set(err, path, "tensor %s: too large", name);
        t->numel *= t->shape[i];
    }
    json_t *b = json_array_get(off, 0), *e2 = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(e2) || json_integer_value(b) < 0 ||
        json_integer_value(e2) < json_integer_value(b) || (uint64_t)json_integer_value(e2) > data_size)
        return error_set(err, path, "tensor %s: data_offsets outside the file's %llu data bytes (after its 8-byte "
                         "length and JSON header)", name, (unsigned long long)data_size);
    *begin = (uint64_t)json_integer_value(b);
    *end = (uint64_t)json_integer_value(e2);
    if (*end - *begin != (uint64_t)t->numel * (uint64_t)dtypes[d].size)
        return error_set(err, path, "tensor %s: %llu bytes for %lld elements of %s", name,
                         (unsigned long long)(*end - *begin), (long long)t->numel, dtypes[d].name);
    t->data = data + *begin;
    t->name = strdup(name);
    return t->name ? 0 : error_runtime(err, path, "out of memory");
}

int st_sniff(const unsigned char *p, uint64_t size, char *why, size_t why_size)
{
    uint64_t n = size >= 8 ? load_le(p, 8) : 0;
    if (size < 10)
        snprintf(why, why_size, "%llu bytes, too few for a length and a JSON header", (unsigned long long)size);
    else if (n > size - 8)
        snprintf(why, why_size, "its first 8 bytes, read as the length of a JSON header, point past the end of the "
                 "file (%llu bytes)", (unsigned long long)size);
    else if (n < 2)
        snprintf(why, why_size, "its first 8 bytes give a JSON header of %llu bytes, too short for one",
                 (unsigned long long)n);
    else if (p[8] != '{')
        snprintf(why, why_size, "its JSON header does not start with '{' (byte 8 is 0x%02x)", p[8]);
    else
        return 1;
    return 0;
}

/* The bytes [begin, end) of the data section that tensor `tensor` holds. */
typedef struct StSpan {
    uint64_t begin, end;
    int tensor;
} StSpan;

static int by_begin(const void *a, const void *b)
{
    const StSpan *x = a, *y = b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1) : (x->end > y->end) - (x->end < y->end);
}

/* The format's rule (Hugging Face's reader refuses any other file): the tensors' bytes, in the
 * order of their offsets, follow one another from the start of the data section to its end - no
 * tensor shares a byte with another, no byte belongs to none. */
static int check_tiling(const StFile *f, StSpan *spans, uint64_t data_size, const char *path, Error *err)
{
    qsort(spans, (size_t)f->n_tensors, sizeof *spans, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const StSpan *s = &spans[i];
        if (s->begin < at)
            return error_set(err, path, "tensor %s: bytes [%llu, %llu) overlap tensor %s's [%llu, %llu)",
                             f->tensors[s->tensor].name, (unsigned long long)s->begin, (unsigned long long)s->end,
                             f->tensors[spans[i - 1].tensor].name, (unsigned long long)spans[i - 1].begin,
                             (unsigned long long)spans[i - 1].end);
        if (s->begin > at)
            return error_set(err, path, "data bytes [%llu, %llu) belong to no tensor (before %s)",
                             (unsigned long long)at, (unsigned long long)s->begin, f->tensors[s->tensor].name);
        at = s->end;
    }
    if (at != data_size)
        return error_set(err, path, "the tensors hold %llu of the file's %llu data bytes (truncated, or extended?)",
                         (unsigned long long)at, (unsigned long long)data_size);
    return 0;
}

int st_open(StFile *f, const char *path, Error *err)
{
    memset(f, 0, sizeof *f);
    if (file_map(path, &f->map, err) != 0)
        return -1;
    char why[160];
    if (!st_sniff(f->map.data, f->map.size, why, sizeof why)) {
        st_close(f);
        return error_set(err, path, "not a safetensors file: %s", why);
    }
    uint64_t n = load_le(f->map.data, 8);
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map.data + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        st_close(f);
        return error_set(err, path, "safetensors header is not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
    }
    size_t count = json_object_size(root);
    StSpan *spans = calloc(count + 1, sizeof *spans);
    f->tensors = calloc(count + 1, sizeof *f->tensors);
    f->meta_keys = calloc(count + 1, sizeof *f->meta_keys);
    f->meta_values = calloc(count + 1, sizeof *f->meta_values);
    int rc = spans && f->tensors && f->meta_keys && f->meta_values ? 0 : error_runtime(err, path, "out of memory");
    const char *key;
    json_t *val;
    const unsigned char *data = f->map.data + 8 + n;
    uint64_t data_size = f->map.size - 8 - n;
    json_object_foreach(root, key, val)
    {
        if (rc != 0)
            break;
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            size_t nm = json_object_size(val);
            char **keys = realloc(f->meta_keys, (nm + 1) * sizeof *keys);
            if (keys)
                f->meta_keys = keys;
            char **vals = keys ? realloc(f->meta_values, (nm + 1) * sizeof *vals) : NULL;
            if (!vals) {
                rc = error_runtime(err, path, "out of memory");
                break;
            }
            f->meta_values = vals;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = error_set(err, path, "__metadata__.%s: values must be strings", mk);
                    break;
                }
                f->meta_keys[f->n_meta] = strdup(mk);
                f->meta_values[f->n_meta] = strdup(json_string_value(mv));
                if (!f->meta_keys[f->n_meta++] || !f->meta_values[f->n_meta - 1])
                    rc = error_runtime(err, path, "out of memory");
            }
            continue;
        }
        StSpan *sp = &spans[f->n_tensors];
        rc = parse_entry(&f->tensors[f->n_tensors], key, val, data_size, data, &sp->begin, &sp->end, path, err);
        sp->tensor = f->n_tensors;
        if (rc == 0)
            f->n_tensors++;
    }
    json_decref(root);
    if (rc == 0)
        rc = check_tiling(f, spans, data_size, path, err);
    free(spans);
    if (rc != 0)
        st_close(f);
    return rc;
}

void st_close(StFile *f)
{
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    file_unmap(&f->map);
    memset(f, 0, sizeof *f);
}

const StTensor *st_find(const StFile *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

const char *st_meta(const StFile *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_values[i];
    return NULL;
}

/* IEEE half and bfloat16 to float. */
static float half_to_float(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return sign ? -v : v;
}

void st_read_f32(const StTensor *t, float *out)
{
    for (int64_t i = 0; i < t->numel; i++) {
        const unsigned char *p = t->data + (size_t)i * (size_t)dtypes[t->dtype].size;
        switch (t->dtype) {
        case ST_F32: {
            uint32_t u = (uint32_t)load_le(p, 4);
            memcpy(&out[i], &u, 4);
            break;
        }
        case ST_F64: {
            uint64_t u = load_le(p, 8);
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
            break;
        }
        case ST_F16:
            out[i] = half_to_float((uint16_t)load_le(p, 2));
            break;
        case ST_BF16:
            out[i] = bf16_to_float((uint16_t)load_le(p, 2));
            break;
        default:
            out[i] = 0;
        }
    }
}

void st_read_i32(const StTensor *t, int32_t *out)
{
    for (int64_t i = 0; i < t->numel; i++)
        out[i] = t->dtype == ST_I64 ? (int32_t)(int64_t)load_le(t->data + 8 * i, 8)
                                    : (int32_t)(uint32_t)load_le(t->data + 4 * i, 4);
}

/* ---------------------------------------------------------------------------------------------- */

typedef struct StWriterItem {
    char *name;
    StDtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    size_t bytes;
    unsigned char *data;
} StWriterItem;

int st_writer_add(StWriter *w, const char *name, StDtype dtype, const int64_t *shape, int n_dims, const void *data,
                  Error *err)
{
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        StWriterItem *items = realloc(w->items, (size_t)cap * sizeof *items);
        if (!items)
            return error_runtime(err, name, "out of memory");
        w->items = items;
        w->cap = cap;
    }
    StWriterItem *it = &w->items[w->n];
    memset(it, 0, sizeof *it);
    it->dtype = dtype;
    it->n_dims = n_dims;
    size_t numel = 1;
    for (int i = 0; i < n_dims; i++) {
        it->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    it->bytes = numel * (size_t)dtypes[dtype].size;
    it->name = strdup(name);
    it->data = data ? malloc(it->bytes + 1) : NULL;
    if (!it->name || (data && !it->data)) {
        free(it->name);
        free(it->data);
        return error_runtime(err, name, "out of memory");
    }
    if (data)
        memcpy(it->data, data, it->bytes); /* host byte order: wlbtrain runs on little-endian machines */
    w->n++;
    return 0;
}

int st_writer_meta(StWriter *w, const char *key, const char *value, Error *err)
{
    char **k = realloc(w->meta_keys, (size_t)(w->n_meta + 1) * sizeof *k);
    if (k)
        w->meta_keys = k;
    char **v = k ? realloc(w->meta_values, (size_t)(w->n_meta + 1) * sizeof *v) : NULL;
    if (!v)
        return error_runtime(err, key, "out of memory");
    w->meta_values = v;
    w->meta_keys[w->n_meta] = strdup(key);
    w->meta_values[w->n_meta] = strdup(value);
    if (!w->meta_keys[w->n_meta] || !w->meta_values[w->n_meta])
        return error_runtime(err, key, "out of memory");
    w->n_meta++;
    return 0;
}

int st_write_stream(const StWriter *w, const char *path, StGet get, void *ctx, Error *err)
{
    json_t *root = json_object(), *meta = json_object();
    size_t offset = 0;
    int rc = root && meta ? 0 : error_runtime(err, path, "out of memory");
    for (int i = 0; rc == 0 && i < w->n_meta; i++)
        json_object_set_new(meta, w->meta_keys[i], json_string(w->meta_values[i]));
    if (rc == 0 && w->n_meta)
        json_object_set(root, "__metadata__", meta);
    for (int i = 0; rc == 0 && i < w->n; i++) {
        const StWriterItem *it = &w->items[i];
        json_t *shape = json_array();
        for (int d = 0; d < it->n_dims; d++)
            json_array_append_new(shape, json_integer(it->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[it->dtype].name, "shape", shape, "data_offsets",
                              (json_int_t)offset, (json_int_t)(offset + it->bytes));
        if (!e || json_object_set_new(root, it->name, e) != 0)
            rc = error_runtime(err, path, "out of memory");
        offset += it->bytes;
    }
    char *header = rc == 0 ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(meta);
    json_decref(root);
    if (rc == 0 && !header)
        rc = error_runtime(err, path, "out of memory");
    AtomicFile a;
    if (rc == 0 && atomic_open(&a, path, err) == 0) {
        size_t n = strlen(header), padded = (n + 7) / 8 * 8;
        unsigned char len[8];
        for (int i = 0; i < 8; i++)
            len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        int bad = fwrite(len, 1, 8, a.f) != 8 || fwrite(header, 1, n, a.f) != n;
        for (size_t i = n; i < padded && !bad; i++)
            bad = fputc(' ', a.f) == EOF;
        int failed = 0; /* get's Error, already in err */
        for (int i = 0; i < w->n && !bad && !failed; i++) {
            const void *data = get ? get(ctx, i, err) : w->items[i].data;
            failed = !data;
            if (failed && !get)
                error_runtime(err, path, "%s: added without data, written without a get", w->items[i].name);
            bad = !failed && fwrite(data, 1, w->items[i].bytes, a.f) != w->items[i].bytes;
        }
        if (bad || failed) {
            atomic_abort(&a);
            rc = failed ? -1 : error_runtime(err, path, "cannot write");
        } else {
            rc = atomic_commit(&a, err);
        }
    } else if (rc == 0) {
        rc = -1;
    }
    free(header);
    return rc;
}

int st_write(const StWriter *w, const char *path, Error *err) { return st_write_stream(w, path, NULL, NULL, err); }

void st_writer_free(StWriter *w)
{
    for (int i = 0; i < w->n; i++) {
        free(w->items[i].name);
        free(w->items[i].data);
    }
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->items);
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}
