/*
 * util/safetensors.h - the safetensors format: Hugging Face's weight files, also our dumps.
 *
 * Layout: u64 little-endian N, then N bytes of JSON {name: {"dtype": D, "shape": [...],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {key: string}}, then the tensor bytes;
 * offsets count from the byte after the JSON: the data section is the file's last size - 8 - N
 * bytes. The reader maps the file and checks every entry before use: N inside the file, the header
 * one JSON object without repeated names, each tensor's dtype known, its size the product of its
 * shape (each side at most 2^40, the product at most 2^46) x the dtype's size, its [begin, end)
 * inside the data section; and, as the format requires (Hugging Face's reader refuses anything
 * else), the tensors in the order of their offsets fill the data section exactly, one after the
 * other - no overlap, no gap, nothing after the last.
 */
#ifndef WLB_UTIL_SAFETENSORS_H
#define WLB_UTIL_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "util/error.h"
#include "util/fileio.h"

typedef enum StDtype { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I32, ST_I64 } StDtype;

enum { ST_MAX_DIMS = 8 };

typedef struct StTensor {
    char *name;
    StDtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const unsigned char *data; /* into the mapping (may be unaligned) */
} StTensor;

typedef struct StFile {
    MappedFile map;
    StTensor *tensors;
    int n_tensors;
    char **meta_keys, **meta_values; /* __metadata__ */
    int n_meta;
} StFile;

int st_open(StFile *f, const char *path, Error *err);
/* 1 when the first bytes of a file of `size` bytes at p are a safetensors file's: an 8-byte length
 * N of at least 2 that fits in the file, then '{'. Else 0, and why (one phrase) in why. */
int st_sniff(const unsigned char *p, uint64_t size, char *why, size_t why_size);
void st_close(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);
/* Copies tensor t into out as float32 (from F32, F16, BF16 or F64). */
void st_read_f32(const StTensor *t, float *out);
/* Copies an I32 or I64 tensor into out as int32 (values must fit; checked by the caller). */
void st_read_i32(const StTensor *t, int32_t *out);
const char *st_dtype_name(StDtype d);

/* Writing: add tensors (the data is copied when added; NULL: given at write time by
 * st_write_stream's get), then st_write or st_write_stream. */
typedef struct StWriter {
    int n, cap;
    struct StWriterItem *items;
    int n_meta;
    char **meta_keys, **meta_values;
} StWriter;

int st_writer_add(StWriter *w, const char *name, StDtype dtype, const int64_t *shape, int n_dims, const void *data,
                  Error *err);
int st_writer_meta(StWriter *w, const char *key, const char *value, Error *err);
/* Writes the file atomically (temporary name, fsync, rename). */
int st_write(const StWriter *w, const char *path, Error *err);
/* The same with tensor i's bytes from get(ctx, i, err), called in order as the file is written (one
 * tensor in memory at a time); NULL from get is an Error (in err) and nothing is written. */
typedef const void *(*StGet)(void *ctx, int i, Error *err);
int st_write_stream(const StWriter *w, const char *path, StGet get, void *ctx, Error *err);
void st_writer_free(StWriter *w);

#endif
