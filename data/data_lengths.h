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
 * Lengths <= 0 are skipped and counted, negative and zero apart, with the first one's place: real
 * lists have them (the Linux list marks its 3 binary files -1 and has 30 empty ones), and no
 * document is 0 tokens long. Whoever loads a list for a user says what was skipped
 * (data_lengths_skipped_note; the dry run prints it as a warning). A malformed entry is an Error
 * naming the file, line and column.
 */
#ifndef WLB_DATA_DATA_LENGTHS_H
#define WLB_DATA_DATA_LENGTHS_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct DataLengths {
    uint64_t n;                /* documents kept */
    uint32_t *len;             /* their lengths, in file order */
    uint64_t n_tokens;         /* sum of len */
    uint64_t skipped;          /* entries <= 0 */
    uint64_t skipped_negative; /* of them, entries < 0 */
    int64_t first_skipped;     /* the first entry <= 0 ... */
    uint64_t first_skipped_at; /* ... at this line (text, CSV) or entry of the JSON array (from 0) */
    int json;                  /* the list was a JSON array */
} DataLengths;

/* column: CSV column name, or NULL for the last column (ignored for the other formats). */
int data_lengths_load(DataLengths *l, const char *path, const char *column, Error *err);
void data_lengths_free(DataLengths *l);
/* "PATH: K of N entries skipped, lengths <= 0 (a negative, b zero; the first, V, at line L)", for a
 * list that skipped some (l->skipped > 0). */
void data_lengths_skipped_note(const DataLengths *l, const char *path, char *buf, size_t size);

#endif
