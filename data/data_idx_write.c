/*
 * data/data_idx_write.c - writing a Megatron indexed data set (PREFIX.idx + PREFIX.bin, MMIDIDX v1).
 *
 * The output is byte for byte what Megatron's IndexedDatasetBuilder + _IndexWriter write for
 * documents of one sequence each: the .bin is the tokens, little-endian, concatenated; the .idx is
 *   "MMIDIDX\0\0" | u64 1 | u8 dtype | u64 S | u64 S + 1 | i32 lengths[S] | i64 pointers[S]
 *   | i64 doc_index[S + 1] = 0, 1, ..., S
 * where pointers[i] = (lengths[0] + ... + lengths[i-1]) * itemsize, the byte offset of sequence i.
 *
 * Tokens stream to PREFIX.bin through an AtomicFile as documents arrive; only the lengths and
 * offsets are kept in memory (12 bytes a document). finish writes PREFIX.idx under a temporary name
 * too and renames the .bin and then the .idx into place, so a reader never finds a half-written
 * file, and an existing data set is only replaced once both new files are complete on disk.
 */
#include "data/data_idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const unsigned char idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { CHUNK_TOKENS = 1 << 13 }; /* tokens encoded per fwrite (32 KiB of stack at most) */

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}


int data_idx_writer_open(DataIdxWriter *w, const char *prefix, int dtype, Error *err)
{
    memset(w, 0, sizeof *w);
    w->max_token = -1;
    if (dtype != DATA_DTYPE_INT32 && dtype != DATA_DTYPE_UINT16)
        return error_set(err, prefix, "dtype code %d cannot be written; wlbtrain writes 4 = int32 and 8 = uint16",
                         dtype);
    w->dtype = dtype;
    w->itemsize = dtype == DATA_DTYPE_UINT16 ? 2 : 4;
    w->prefix = strdup(prefix);
    char *bp = data_idx_path(prefix, ".bin");
    if (!w->prefix || !bp) {
        free(bp);
        free(w->prefix);
        w->prefix = NULL;
        return error_runtime(err, prefix, "out of memory");
    }
    int rc = atomic_open(&w->bin, bp, err);
    free(bp);
    if (rc != 0) {
        free(w->prefix);
        w->prefix = NULL;
    }
    return rc;
}

/* Makes room for one more document's length and offset. */
static int grow(DataIdxWriter *w, Error *err)
{
    if (w->n_docs < w->cap)
        return 0;
    uint64_t cap = w->cap ? 2 * w->cap : 1024;
    if (cap > SIZE_MAX / sizeof(int64_t))
        return error_runtime(err, w->prefix, "too many documents (%llu)", (unsigned long long)w->n_docs);
    int32_t *lengths = realloc(w->lengths, (size_t)cap * sizeof *lengths);
    if (lengths)
        w->lengths = lengths;
    int64_t *pointers = lengths ? realloc(w->pointers, (size_t)cap * sizeof *pointers) : NULL;
    if (!pointers)
        return error_runtime(err, w->prefix, "out of memory for %llu documents", (unsigned long long)cap);
    w->pointers = pointers;
    w->cap = cap;
    return 0;
}

int data_idx_writer_add(DataIdxWriter *w, const int32_t *tokens, uint64_t n, Error *err)
{
    if (!w->bin.f)
        return error_runtime(err, w->prefix ? w->prefix : "data_idx_writer_add", "the writer is not open");
    /* Check the whole document first: a rejected document leaves the writer as it was. */
    if (n > INT32_MAX)
        return error_set(err, w->prefix, "document %llu has %llu tokens; a Megatron sequence holds at most %d",
                         (unsigned long long)w->n_docs, (unsigned long long)n, INT32_MAX);
    if (w->bin_bytes > (uint64_t)INT64_MAX - n * (uint64_t)w->itemsize)
        return error_set(err, w->prefix, "the .bin would exceed 2^63 bytes");
    int32_t hi = INT32_MIN;
    int32_t limit = w->dtype == DATA_DTYPE_UINT16 ? 65535 : INT32_MAX;
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] > limit) {
            int wider = w->dtype == DATA_DTYPE_UINT16 && tokens[i] > limit;
            return error_set(err, w->prefix, "document %llu, token %llu: id %d does not fit %s (0..%d)%s",
                             (unsigned long long)w->n_docs, (unsigned long long)i, (int)tokens[i],
                             w->dtype == DATA_DTYPE_UINT16 ? "uint16" : "int32", (int)limit,
                             wider ? "; write int32 tokens (dtype 4)" : "");
        }
        if (tokens[i] > hi)
            hi = tokens[i];
    }
    if (grow(w, err) != 0)
        return -1;
    unsigned char buf[CHUNK_TOKENS * 4];
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < CHUNK_TOKENS ? n - done : CHUNK_TOKENS;
        for (uint64_t i = 0; i < k; i++)
            put_le(buf + i * (uint64_t)w->itemsize, (uint32_t)tokens[done + i], w->itemsize);
        size_t bytes = (size_t)k * (size_t)w->itemsize;
        if (fwrite(buf, 1, bytes, w->bin.f) != bytes) {
            error_errno(err, w->bin.path, "cannot write");
            if (err)
                err->status = ERROR_RUNTIME; /* a failed write is never the input's fault */
            atomic_abort(&w->bin); /* part of a document is in the .bin: this set can never be finished */
            return -1;
        }
        done += k;
    }
    w->lengths[w->n_docs] = (int32_t)n;
    w->pointers[w->n_docs] = (int64_t)w->bin_bytes;
    w->n_docs++;
    w->bin_bytes += n * (uint64_t)w->itemsize;
    if (hi > w->max_token)
        w->max_token = hi;
    return 0;
}

/* Writes the whole .idx to a (temporary) stream. */
static int write_index(const DataIdxWriter *w, FILE *f)
{
    uint64_t S = w->n_docs;
    unsigned char head[34], buf[8 * 1024];
    memcpy(head, idx_magic, sizeof idx_magic);
    put_le(head + 9, 1, 8);
    head[17] = (unsigned char)w->dtype;
    put_le(head + 18, S, 8);
    put_le(head + 26, S + 1, 8);
    if (fwrite(head, 1, sizeof head, f) != sizeof head)
        return -1;
    /* Three arrays, each encoded a buffer at a time: lengths (4 bytes), pointers, doc_index (8). */
    for (int array = 0; array < 3; array++) {
        int es = array == 0 ? 4 : 8;
        uint64_t count = array == 2 ? S + 1 : S;
        for (uint64_t i = 0; i < count;) {
            size_t k = 0;
            for (; i < count && (k + 1) * (size_t)es <= sizeof buf; i++, k++) {
                uint64_t v = array == 0 ? (uint64_t)(uint32_t)w->lengths[i]
                           : array == 1 ? (uint64_t)w->pointers[i] : i;
                put_le(buf + k * (size_t)es, v, es);
            }
            if (fwrite(buf, (size_t)es, k, f) != k)
                return -1;
        }
    }
    return 0;
}

int data_idx_writer_finish(DataIdxWriter *w, Error *err)
{
    if (!w->bin.f)
        return error_runtime(err, w->prefix ? w->prefix : "data_idx_writer_finish", "the writer is not open");
    char *ip = data_idx_path(w->prefix, ".idx");
    if (!ip) {
        error_runtime(err, w->prefix, "out of memory");
        data_idx_writer_abort(w);
        return -1;
    }
    AtomicFile idx;
    int rc = atomic_open(&idx, ip, err);
    if (rc == 0 && write_index(w, idx.f) != 0) {
        error_errno(err, ip, "cannot write");
        if (err)
            err->status = ERROR_RUNTIME;
        rc = -1;
    }
    /* The .bin is renamed first, then the .idx: whoever finds the new .idx finds the new .bin beside
     * it. (Between the two renames an old .idx may meet the new .bin; data_idx_open's offset checks
     * catch such a pair unless the new .bin happens to be long enough.) */
    if (rc == 0 && atomic_commit(&w->bin, err) != 0)
        rc = -1;
    if (rc == 0 && atomic_commit(&idx, err) != 0)
        rc = -1;
    if (rc != 0 && idx.path)
        atomic_abort(&idx);
    free(ip);
    data_idx_writer_abort(w); /* frees the arrays; on success the .bin is committed, nothing to remove */
    return rc;
}

/* Also the release step of finish; n_docs, bin_bytes and max_token stay readable for a summary. */
void data_idx_writer_abort(DataIdxWriter *w)
{
    atomic_abort(&w->bin);
    free(w->lengths);
    free(w->pointers);
    free(w->prefix);
    w->lengths = NULL;
    w->pointers = NULL;
    w->prefix = NULL;
    w->cap = 0;
}
