/*
 * data/data_idx_read.c - reading a Megatron indexed data set (PREFIX.idx + PREFIX.bin, MMIDIDX v1).
 *
 * Both files are memory-mapped. The .idx comes from outside, so data_idx_open checks every header
 * field, array size, document index entry, sequence length and byte offset against the real file
 * sizes before anything is used; afterwards doc_len and read_tokens can index the arrays without
 * further bounds checks on the file contents (they still check the caller's document and range).
 * Every check is written so that it cannot overflow: sizes are compared by dividing the file size,
 * never by multiplying an untrusted count.
 *
 * The arrays start at byte 34 (9 magic + 8 version + 1 dtype + 8 S + 8 D), so none is aligned to
 * its element size: every element is assembled from little-endian bytes (the compiler turns this
 * into one unaligned load), never read through a cast pointer.
 */
#include "data/data_idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IDX_HEADER 34u
#define DTYPES_READ "wlbtrain reads 4 = int32 and 8 = uint16"
static const unsigned char idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | (unsigned)p[1] << 8); }
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static int32_t seq_len(const DataIdx *d, uint64_t i) { return (int32_t)le32(d->lengths + 4 * i); }
static int64_t seq_ptr(const DataIdx *d, uint64_t i) { return (int64_t)le64(d->pointers + 8 * i); }
static int64_t doc_entry(const DataIdx *d, uint64_t i) { return (int64_t)le64(d->doc_index + 8 * i); }

/* Megatron's DType codes (indexed_dataset.py); only 4 and 8 are token types read here. */
static const char *dtype_name(uint64_t code)
{
    static const char *const names[] = {NULL,    "uint8",   "int8",    "int16", "int32",
                                        "int64", "float64", "float32", "uint16"};
    return code < sizeof names / sizeof names[0] ? names[code] : NULL;
}

char *data_idx_path(const char *prefix, const char *ext)
{
    size_t n = strlen(prefix) + strlen(ext) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", prefix, ext);
    return p;
}

static int check_header(const DataIdx *d, const char *ip, uint64_t *n_entries, Error *err)
{
    const unsigned char *h = d->idx.data;
    uint64_t size = d->idx.size;
    if (size == 0)
        return error_set(err, ip, "empty file (0 bytes); a Megatron index starts with a 34-byte header");
    if (size < IDX_HEADER || memcmp(h, idx_magic, sizeof idx_magic) != 0) {
        if (size >= sizeof idx_magic && memcmp(h, idx_magic, sizeof idx_magic) == 0)
            return error_set(err, ip, "truncated: %llu bytes, shorter than the 34-byte MMIDIDX header",
                             (unsigned long long)size);
        char hex[3 * sizeof idx_magic + 1] = "";
        size_t shown = size < sizeof idx_magic ? (size_t)size : sizeof idx_magic;
        for (size_t i = 0, o = 0; i < shown; i++, o = strlen(hex)) /* "xx xx xx", fits hex exactly */
            snprintf(hex + o, sizeof hex - o, "%s%02x", i ? " " : "", h[i]);
        return error_set(err, ip,
                         "not a Megatron index: bad magic (the file starts with bytes %s, expected "
                         "4d 4d 49 44 49 44 58 00 00 = \"MMIDIDX\\0\\0\")%s",
                         hex, size < IDX_HEADER ? "; and it is shorter than the 34-byte header" : "");
    }
    uint64_t version = le64(h + 9);
    if (version != 1)
        return error_set(err, ip, "MMIDIDX version %llu; wlbtrain reads version 1", (unsigned long long)version);
    unsigned code = h[17];
    const char *name = dtype_name(code);
    if (code != DATA_DTYPE_INT32 && code != DATA_DTYPE_UINT16) {
        if (!name)
            return error_set(err, ip, "dtype code %u is not a Megatron dtype (1..8); %s", code, DTYPES_READ);
        return error_set(err, ip, "dtype code %u (%s) is not a token type wlbtrain reads; %s", code, name, DTYPES_READ);
    }
    uint64_t S = le64(h + 18), D = le64(h + 26);
    /* Expected size 34 + 12 S + 8 D (+ S multimodal mode bytes), computed only where it fits. */
    uint64_t body = size - IDX_HEADER;
    if (S > body / 12 || D > (body - 12 * S) / 8) { /* 12 S + 8 D > body, tested without overflow */
        if (S > (UINT64_MAX - IDX_HEADER) / 12 || D > (UINT64_MAX - IDX_HEADER - 12 * S) / 8)
            return error_set(err, ip,
                             "truncated: the header promises %llu sequences and %llu document entries "
                             "(more than 2^64 bytes), the file has %llu bytes",
                             (unsigned long long)S, (unsigned long long)D, (unsigned long long)size);
        return error_set(err, ip,
                         "truncated: the header promises %llu sequences and %llu document entries (%llu bytes), "
                         "the file has %llu bytes",
                         (unsigned long long)S, (unsigned long long)D,
                         (unsigned long long)(IDX_HEADER + 12 * S + 8 * D), (unsigned long long)size);
    }
    uint64_t arrays = 12 * S + 8 * D;
    if (arrays != body && body - arrays != S) /* body - arrays == S: multimodal modes, ignored */
        return error_set(err, ip,
                         "%llu unexpected bytes at the end: %llu sequences and %llu document entries take "
                         "%llu bytes (or %llu with multimodal modes), the file has %llu bytes",
                         (unsigned long long)(body - arrays), (unsigned long long)S, (unsigned long long)D,
                         (unsigned long long)(IDX_HEADER + arrays), (unsigned long long)(IDX_HEADER + arrays + S),
                         (unsigned long long)size);
    if (D == 0)
        return error_set(err, ip, "the document index is empty (0 entries); it needs at least the entry 0");
    *n_entries = D;
    return 0;
}

/* doc_index must be 0 = e[0] <= e[1] <= ... <= e[D-1] = S: document k is sequences [e[k], e[k+1]). */
static int check_doc_index(DataIdx *d, const char *ip, uint64_t D, Error *err)
{
    int64_t first = doc_entry(d, 0);
    if (first != 0)
        return error_set(err, ip,
                         "document index entry 0 is %lld, expected 0 (the first document starts at sequence 0)",
                         (long long)first);
    int one = 1; /* stays 1 while e[k] == k; with e[D-1] == S checked below, that is D = S + 1 */
    for (uint64_t k = 1; k < D; k++) {
        int64_t prev = doc_entry(d, k - 1), cur = doc_entry(d, k);
        if (cur < prev)
            return error_set(err, ip, "document index decreases at entry %llu: %lld after %lld",
                             (unsigned long long)k, (long long)cur, (long long)prev);
        if ((uint64_t)cur > d->n_seqs)
            return error_set(err, ip, "document index entry %llu is %lld, past the %llu sequences",
                             (unsigned long long)k, (long long)cur, (unsigned long long)d->n_seqs);
        one &= (uint64_t)cur == k;
    }
    int64_t last = doc_entry(d, D - 1);
    if ((uint64_t)last != d->n_seqs)
        return error_set(err, ip,
                         "document index ends at %lld, expected the sequence count %llu (the last entry "
                         "closes the last document)",
                         (long long)last, (unsigned long long)d->n_seqs);
    d->one_seq_per_doc = one;
    return 0;
}

/* The document that sequence i belongs to: the last k < D - 1 with doc_index[k] <= i (documents
 * before it that are empty share its start). check_doc_index has run: the entries are sorted. */
static uint64_t seq_doc(const DataIdx *d, uint64_t i)
{
    if (d->one_seq_per_doc)
        return i;
    uint64_t lo = 0, hi = d->n_docs; /* doc_index[lo] <= i < doc_index[hi] */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)doc_entry(d, mid) <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Every sequence [ptr, ptr + len * itemsize) must lie inside the .bin and start at a whole token
 * (Megatron's builder writes each pointer as the sum of the byte sizes before it, so a pointer
 * that is not a multiple of the token size means a corrupt index or another .bin: its tokens
 * would be read from the middle of others); also sums the tokens. */
static int check_sequences(DataIdx *d, const char *ip, const char *bp, Error *err)
{
    uint64_t bin = d->bin.size, total = 0;
    for (uint64_t i = 0; i < d->n_seqs; i++) {
        int32_t len = seq_len(d, i);
        int64_t ptr = seq_ptr(d, i);
        if (len < 0)
            return error_set(err, ip, "sequence %llu has a negative length %d", (unsigned long long)i, (int)len);
        if (ptr < 0)
            return error_set(err, ip, "sequence %llu has a negative byte offset %lld into %s",
                             (unsigned long long)i, (long long)ptr, bp);
        uint64_t bytes = (uint64_t)len * (uint64_t)d->itemsize; /* < 2^33: no overflow */
        if ((uint64_t)ptr > bin || bytes > bin - (uint64_t)ptr) {
            if ((uint64_t)ptr > bin)
                return error_set(err, ip,
                                 "sequence %llu starts at byte %lld, past the end of %s (%llu bytes): the .bin "
                                 "is truncated or the index is corrupt",
                                 (unsigned long long)i, (long long)ptr, bp, (unsigned long long)bin);
            return error_set(err, ip,
                             "sequence %llu (byte offset %lld, %d tokens of %d bytes) ends at byte %llu, past the "
                             "end of %s (%llu bytes): the .bin is truncated or the index is corrupt",
                             (unsigned long long)i, (long long)ptr, (int)len, d->itemsize,
                             (unsigned long long)((uint64_t)ptr + bytes), bp, (unsigned long long)bin);
        }
        if ((uint64_t)ptr % (uint64_t)d->itemsize != 0)
            return error_set(err, ip,
                             "document %llu (sequence %llu) starts at byte %lld of %s, not a multiple of its "
                             "%d-byte %s tokens: the index is corrupt or belongs to another .bin",
                             (unsigned long long)seq_doc(d, i), (unsigned long long)i, (long long)ptr, bp,
                             d->itemsize, d->dtype == DATA_DTYPE_UINT16 ? "uint16" : "int32");
        /* Sequences may overlap, so the sum is not bounded by the .bin size: check it. */
        if (total > UINT64_MAX - (uint64_t)len)
            return error_set(err, ip, "the sequence lengths add up to more than 2^64 tokens");
        total += (uint64_t)len;
    }
    d->n_tokens = total;
    return 0;
}

int data_idx_open(DataIdx *d, const char *prefix, Error *err)
{
    memset(d, 0, sizeof *d);
    char *ip = data_idx_path(prefix, ".idx"), *bp = data_idx_path(prefix, ".bin");
    d->prefix = strdup(prefix);
    if (!ip || !bp || !d->prefix) {
        free(ip);
        free(bp);
        free(d->prefix);
        d->prefix = NULL;
        return error_runtime(err, prefix, "out of memory");
    }
    uint64_t D = 0;
    int rc = -1;
    if (file_map(ip, &d->idx, err) != 0) {
        size_t n = strlen(prefix);
        if (err && err->status == ERROR_INPUT && n > 4 &&
            (!strcmp(prefix + n - 4, ".idx") || !strcmp(prefix + n - 4, ".bin")))
            error_append(err, " (give the data set's PREFIX, without .idx or .bin)");
        goto out;
    }
    if (check_header(d, ip, &D, err) != 0)
        goto out;
    d->dtype = d->idx.data[17];
    d->itemsize = d->dtype == DATA_DTYPE_UINT16 ? 2 : 4;
    d->n_seqs = le64(d->idx.data + 18);
    d->n_docs = D - 1;
    d->lengths = d->idx.data + IDX_HEADER;
    d->pointers = d->lengths + 4 * d->n_seqs;
    d->doc_index = d->pointers + 8 * d->n_seqs;
    if (check_doc_index(d, ip, D, err) != 0)
        goto out;
    if (file_map(bp, &d->bin, err) != 0)
        goto out;
    if (d->bin.size % (uint64_t)d->itemsize != 0) {
        error_set(err, bp,
                  "%llu bytes is not a whole number of %s tokens (%d bytes each): truncated or not this index's .bin",
                  (unsigned long long)d->bin.size, d->dtype == DATA_DTYPE_UINT16 ? "uint16" : "int32", d->itemsize);
        goto out;
    }
    if (check_sequences(d, ip, bp, err) != 0)
        goto out;
    rc = 0;
out:
    free(ip);
    free(bp);
    if (rc != 0)
        data_idx_close(d);
    return rc;
}

void data_idx_close(DataIdx *d)
{
    file_unmap(&d->idx);
    file_unmap(&d->bin);
    free(d->prefix);
    memset(d, 0, sizeof *d);
}

/* First and one-past-last sequence of document doc (doc < n_docs). */
static void doc_seqs(const DataIdx *d, uint64_t doc, uint64_t *first, uint64_t *end)
{
    if (d->one_seq_per_doc) {
        *first = doc;
        *end = doc + 1;
    } else {
        *first = (uint64_t)doc_entry(d, doc);
        *end = (uint64_t)doc_entry(d, doc + 1);
    }
}

uint64_t data_idx_doc_len(const DataIdx *d, uint64_t doc)
{
    if (doc >= d->n_docs)
        return 0;
    uint64_t first, end, n = 0;
    doc_seqs(d, doc, &first, &end);
    for (uint64_t i = first; i < end; i++)
        n += (uint64_t)seq_len(d, i);
    return n;
}

/* Widens n tokens at byte p of the .bin into out. */
static void copy_tokens(const DataIdx *d, const unsigned char *p, uint64_t n, int32_t *out)
{
    if (d->dtype == DATA_DTYPE_UINT16)
        for (uint64_t i = 0; i < n; i++)
            out[i] = le16(p + 2 * i);
    else
        for (uint64_t i = 0; i < n; i++)
            out[i] = (int32_t)le32(p + 4 * i);
}

/* A range outside the document is a bug in the caller, not bad input: status 1. */
int data_idx_read_tokens(const DataIdx *d, uint64_t doc, uint64_t offset, uint64_t n, int32_t *out, Error *err)
{
    if (doc >= d->n_docs)
        return error_runtime(err, d->prefix, "document %llu does not exist (the data set has %llu documents)",
                             (unsigned long long)doc, (unsigned long long)d->n_docs);
    uint64_t len = data_idx_doc_len(d, doc);
    if (offset > len || n > len - offset)
        return error_runtime(err, d->prefix,
                             "tokens [%llu, %llu%s) are outside document %llu, which has %llu tokens",
                             (unsigned long long)offset, (unsigned long long)(offset + n),
                             offset + n < offset ? " (overflows)" : "", (unsigned long long)doc,
                             (unsigned long long)len);
    uint64_t first, end;
    doc_seqs(d, doc, &first, &end);
    for (uint64_t i = first; i < end && n > 0; i++) {
        uint64_t sl = (uint64_t)seq_len(d, i);
        if (offset >= sl) {
            offset -= sl;
            continue;
        }
        uint64_t take = sl - offset < n ? sl - offset : n;
        copy_tokens(d, d->bin.data + (uint64_t)seq_ptr(d, i) + offset * (uint64_t)d->itemsize, take, out);
        out += take;
        n -= take;
        offset = 0;
    }
    return 0;
}
