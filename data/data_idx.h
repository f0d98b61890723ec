/*
 * data/data_idx.h - Megatron indexed data sets: PREFIX.idx + PREFIX.bin (MMIDIDX version 1).
 *
 * Layout (../shared/reference/codebases.md §2.6), all little-endian:
 *   .idx  "MMIDIDX\0\0" | u64 version = 1 | u8 dtype | u64 S | u64 D
 *         | i32 lengths[S] | i64 pointers[S] (byte offsets into .bin) | i64 doc_index[D]
 *         (| i8 modes[S] in multimodal sets, ignored)
 *   .bin  the tokens of all sequences, concatenated, no header
 * Document d is sequences [doc_index[d], doc_index[d+1]); there are D-1 documents. Token dtype codes
 * read here: 4 = int32, 8 = uint16.
 *
 * data_idx_open maps both files and checks every count, size and offset against the file sizes
 * before anything is used, so a truncated or corrupted set is one clear Error (status 2), never a
 * crash or an out-of-bounds read. The arrays start at byte 34 and are misaligned: they are read
 * with memcpy, never through a cast pointer. Files over 4 GiB work (64-bit offsets, mmap).
 */
#ifndef WLB_DATA_DATA_IDX_H
#define WLB_DATA_DATA_IDX_H

#include <stdint.h>

#include "util/error.h"
#include "util/fileio.h"

enum { DATA_DTYPE_INT32 = 4, DATA_DTYPE_UINT16 = 8 };

typedef struct DataIdx {
    char *prefix;
    MappedFile idx, bin;
    int dtype;           /* DATA_DTYPE_INT32 or DATA_DTYPE_UINT16 */
    int itemsize;        /* 4 or 2 */
    uint64_t n_seqs;     /* S */
    uint64_t n_docs;     /* D - 1 */
    uint64_t n_tokens;   /* sum of all sequence lengths */
    int one_seq_per_doc; /* doc_index is 0, 1, ..., S: the common case, O(1) lookups */
    const unsigned char *lengths, *pointers, *doc_index; /* into idx.data (misaligned) */
} DataIdx;

int data_idx_open(DataIdx *d, const char *prefix, Error *err);
/* PREFIX + ext (".idx" or ".bin"), malloc'd; NULL when memory runs out. */
char *data_idx_path(const char *prefix, const char *ext);
void data_idx_close(DataIdx *d);

/* Tokens in document doc (< n_docs): the sum of its sequences' lengths. */
uint64_t data_idx_doc_len(const DataIdx *d, uint64_t doc);
/* Copies tokens [offset, offset + n) of document doc into out (widened to int32). The range must
 * lie inside the document (checked: an Error otherwise). */
int data_idx_read_tokens(const DataIdx *d, uint64_t doc, uint64_t offset, uint64_t n, int32_t *out, Error *err);

/* Writes a data set. Documents are added one at a time (one sequence each); finish writes the .bin
 * and .idx under temporary names, fsyncs and renames them into place, so an existing data set with
 * the same prefix is replaced only by a complete one. */
typedef struct DataIdxWriter {
    char *prefix;
    int dtype, itemsize;
    AtomicFile bin;
    uint64_t n_docs, cap, bin_bytes;
    int32_t *lengths;
    int64_t *pointers;
    int64_t max_token;   /* largest id written, -1 if none */
} DataIdxWriter;

int data_idx_writer_open(DataIdxWriter *w, const char *prefix, int dtype, Error *err);
/* Appends one document; every token must fit the dtype (checked). */
int data_idx_writer_add(DataIdxWriter *w, const int32_t *tokens, uint64_t n, Error *err);
int data_idx_writer_finish(DataIdxWriter *w, Error *err);
/* Abandons the write: temporary files removed, nothing replaced. */
void data_idx_writer_abort(DataIdxWriter *w);

#endif
