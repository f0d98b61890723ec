/* data/data_lengths.c - reading document length lists (see data_lengths.h). */
#include "data/data_lengths.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/fileio.h"
#include "util/parse.h"

/* Appends one entry, the at-th (its line, or its entry of a JSON array); lengths <= 0 are counted
 * as skipped. */
static int push(DataLengths *l, int64_t *cap, int64_t v, uint64_t at, const char *where, Error *err)
{
    if (v <= 0) {
        if (l->skipped++ == 0) {
            l->first_skipped = v;
            l->first_skipped_at = at;
        }
        l->skipped_negative += v < 0;
        return 0;
    }
    if (v > UINT32_MAX)
        return error_set(err, where, "document length %lld is too large (at most %u)", (long long)v, UINT32_MAX);
    uint32_t *bigger = array_grow(l->len, cap, (int64_t)l->n + 1, sizeof *bigger);
    if (!bigger)
        return error_runtime(err, where, "out of memory");
    l->len = bigger;
    l->len[l->n++] = (uint32_t)v;
    l->n_tokens += (uint64_t)v;
    return 0;
}

static int load_json(DataLengths *l, const char *path, const char *text, size_t len, Error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return error_set(err, path, "line %d, column %d: not a valid JSON array: %s", je.line, je.column, je.text);
    int rc = 0;
    int64_t cap = 0;
    if (!json_is_array(root)) {
        rc = error_set(err, path, "expected a JSON array of document lengths");
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(root, i, v)
        {
            if (!json_is_integer(v)) {
                rc = error_set(err, path, "entry %zu of the JSON array is not an integer", i);
                break;
            }
            if ((rc = push(l, &cap, json_integer_value(v), i, path, err)) != 0)
                break;
        }
    }
    json_decref(root);
    return rc;
}

/* Splits one CSV line (no embedded newlines) into fields in place: commas separate, a field may be
 * "quoted" with "" for a literal quote. Returns the number of fields, or -1 for a broken quote. */
static int csv_split(char *line, char **fields, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max)
            return n;
        if (*p == '"') {
            char *out = ++p;
            fields[n++] = out;
            for (;;) {
                if (*p == '\0')
                    return -1;
                if (*p == '"' && p[1] == '"') {
                    *out++ = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    *out++ = *p++;
                }
            }
            *out = '\0';
            if (*p != ',' && *p != '\0')
                return -1;
        } else {
            fields[n++] = p;
            while (*p && *p != ',')
                p++;
        }
        if (*p == '\0')
            return n;
        *p++ = '\0';
    }
}

enum { CSV_MAX_FIELDS = 256 };

/* text is modified (lines are split in place). */
static int load_lines(DataLengths *l, const char *path, char *text, const char *column, Error *err)
{
    int64_t cap = 0;
    int csv_col = -1, n_cols = 0, lineno = 0;
    char where[1200];
    char *fields[CSV_MAX_FIELDS];
    for (char *line = text, *next; line; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r')
            line[--n] = '\0';
        if (n == 0)
            continue;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        int64_t v;
        if (csv_col < 0 && l->n == 0 && l->skipped == 0 && parse_int64(line, &v) != 0) {
            /* The first line is not a number: a CSV header. */
            n_cols = csv_split(line, fields, CSV_MAX_FIELDS);
            if (n_cols <= 0)
                return error_set(err, where, "cannot read the CSV header");
            csv_col = n_cols - 1;
            if (column) {
                csv_col = -1;
                for (int i = 0; i < n_cols; i++)
                    if (!strcmp(fields[i], column))
                        csv_col = i;
                if (csv_col < 0)
                    return error_set(err, where, "no column '%s' in the CSV header", column);
            }
            continue;
        }
        if (csv_col >= 0) {
            int got = csv_split(line, fields, CSV_MAX_FIELDS);
            if (got < n_cols)
                return error_set(err, where, "expected %d CSV fields as in the header, got %d", n_cols, got);
            /* More fields than the header: unquoted commas inside a text column (a file path, say).
             * Count from the end, where the numeric columns of such lists are. */
            const char *field = fields[got - (n_cols - csv_col)];
            if (parse_int64(field, &v) != 0)
                return error_set(err, where, "column %d: expected an integer length, got '%s'", csv_col + 1, field);
        } else if (parse_int64(line, &v) != 0) {
            return error_set(err, where, "expected an integer length, got '%.40s'", line);
        }
        if (push(l, &cap, v, (uint64_t)lineno, where, err) != 0)
            return -1;
    }
    return 0;
}

int data_lengths_load(DataLengths *l, const char *path, const char *column, Error *err)
{
    memset(l, 0, sizeof *l);
    char *text;
    size_t len;
    if (file_read_text(path, "text file", &text, &len, err) != 0)
        return -1;
    const char *p = text;
    if (!strncmp(p, "\xef\xbb\xbf", 3)) /* a UTF-8 byte-order mark */
        p += 3;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    l->json = *p == '[' || *p == '{';
    int rc = l->json ? load_json(l, path, p, len - (size_t)(p - text), err) : load_lines(l, path, (char *)p, column, err);
    free(text);
    if (rc == 0 && l->n == 0)
        rc = error_set(err, path, "no document lengths (%llu entries <= 0 skipped)", (unsigned long long)l->skipped);
    if (rc != 0)
        data_lengths_free(l);
    return rc;
}

void data_lengths_skipped_note(const DataLengths *l, const char *path, char *buf, size_t size)
{
    char at[64];
    snprintf(at, sizeof at, l->json ? "entry %llu of the JSON array" : "line %llu",
             (unsigned long long)l->first_skipped_at);
    snprintf(buf, size, "%s: %llu of %llu entries skipped, lengths <= 0 (%llu negative, %llu zero; the first, %lld, "
             "at %s)", path, (unsigned long long)l->skipped, (unsigned long long)(l->n + l->skipped),
             (unsigned long long)l->skipped_negative, (unsigned long long)(l->skipped - l->skipped_negative),
             (long long)l->first_skipped, at);
}

void data_lengths_free(DataLengths *l)
{
    free(l->len);
    memset(l, 0, sizeof *l);
}
