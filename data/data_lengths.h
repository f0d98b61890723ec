/*
 * data/data_lengths.h - document length lists, the input of a dry run (data.lengths_file).
 *
 * Three formats, told apart by content (a .gz file is gunzipped first, through zlib):
 *   a JSON array of integers            [2792, 4238, 642, ...]
 *   one integer per line                347\n1203\n...
 *   CSV with a header row               path,bytes,llama3_tokens\n...  (column data.lengths_column,
 *                                       default the last; fields may be "quoted"; a row with extra
 *                                       unquoted commas, in a file path say, is read counting columns
 *                                       from the end)
 * Lengths <= 0 (such as -1 for a binary file) are skipped and counted. A malformed entry is an
 * Error naming the file, line and column.
 */
#ifndef WLB_DATA_DATA_LENGTHS_H
#define WLB_DATA_DATA_LENGTHS_H

#include <stdint.h>

#include "util/error.h"

typedef struct DataLengths {
    uint64_t n;        /* documents kept */
    uint32_t *len;     /* their lengths, in file order */
    uint64_t n_tokens; /* sum of len */
    uint64_t skipped;  /* entries <= 0 */
} DataLengths;

/* column: CSV column name, or NULL for the last column (ignored for the other formats). */
int data_lengths_load(DataLengths *l, const char *path, const char *column, Error *err);
void data_lengths_free(DataLengths *l);

#endif
