/*
 * cli/cli_inspect.c - `wlbtrain inspect PREFIX`: describe a Megatron indexed data set; `wlbtrain
 * inspect DIR` of a folder of flight recorder files: the collective a hung job's ranks disagree on.
 *
 * Opening the set runs every check of data_idx_open, so inspect is also the way to validate a data
 * set before a long job. It then reads every token of every sequence once, for the vocabulary bound
 * (largest id + 1: the model's vocabulary must be at least this), and sorts the document lengths for
 * nearest-rank percentiles: p-th percentile = the ceil(p/100 * N)-th smallest length, an actual
 * document length, as the WLB-LLM and FlexSP papers report their distributions.
 */
#include "cli/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <sys/stat.h>

#include "data/data_idx.h"
#include "util/flight.h"

/* v with thousands separators: 1361845 -> "1,361,845". buf holds at least 27 bytes. */
static const char *thousands(char *buf, uint64_t v)
{
    char digits[21];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v), o = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

/* num / den to one decimal, rounded, with separators: 1361845 / 1000 -> "1,361.8". buf: 32 bytes. */
static const char *ratio(char *buf, uint64_t num, uint64_t den)
{
    uint64_t tenths = (uint64_t)((long double)num * 10 / den + 0.5L);
    char whole[32];
    snprintf(buf, 32, "%s.%u", thousands(whole, tenths / 10), (unsigned)(tenths % 10));
    return buf;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest length with at least p percent of the documents at or below it. */
static uint64_t percentile(const uint64_t *sorted, uint64_t n, unsigned p)
{
    uint64_t rank = (n / 100) * p + ((n % 100) * p + 99) / 100; /* ceil(p * n / 100), no overflow */
    return sorted[rank > 0 ? rank - 1 : 0];
}

/* printf that remembers a failed write in *bad. */
static void out(int *bad, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(int *bad, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vprintf(fmt, ap) < 0)
        *bad = 1;
    va_end(ap);
}

/* Largest token id over every document; a negative id in an int32 set is an error. */
static int scan_vocab(const DataIdx *d, int64_t *max_id, Error *err)
{
    enum { CHUNK = 1 << 16 };
    int32_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf)
        return error_runtime(err, d->prefix, "out of memory");
    int64_t hi = -1;
    for (uint64_t doc = 0; doc < d->n_docs; doc++) {
        uint64_t len = data_idx_doc_len(d, doc);
        for (uint64_t off = 0; off < len; off += CHUNK) {
            uint64_t n = len - off < CHUNK ? len - off : CHUNK;
            if (data_idx_read_tokens(d, doc, off, n, buf, err) != 0) {
                free(buf);
                return -1;
            }
            for (uint64_t i = 0; i < n; i++) {
                if (buf[i] < 0) {
                    error_set(err, d->prefix, "document %llu, token %llu: negative token id %d",
                              (unsigned long long)doc, (unsigned long long)(off + i), (int)buf[i]);
                    free(buf);
                    return -1;
                }
                if (buf[i] > hi)
                    hi = buf[i];
            }
        }
    }
    free(buf);
    *max_id = hi;
    return 0;
}

/* A folder of flight recorder files (util/flight.h): the comparison's line. */
static int inspect_flight(const char *dir, Error *err)
{
    char line[2048];
    if (flight_compare(dir, 0, NULL, line, sizeof line, err) != 0)
        return -1;
    printf("%s\n", line);
    return 0;
}

int cli_inspect(const char *prefix, Error *err)
{
    struct stat st;
    if (stat(prefix, &st) == 0 && S_ISDIR(st.st_mode))
        return inspect_flight(prefix, err);
    DataIdx d;
    if (data_idx_open(&d, prefix, err) != 0)
        return -1;
    int64_t max_id = -1;
    uint64_t *lens = malloc((d.n_docs ? d.n_docs : 1) * sizeof *lens);
    if (!lens) {
        data_idx_close(&d);
        return error_runtime(err, prefix, "out of memory for %llu document lengths", (unsigned long long)d.n_docs);
    }
    if (scan_vocab(&d, &max_id, err) != 0) {
        free(lens);
        data_idx_close(&d);
        return -1;
    }
    for (uint64_t i = 0; i < d.n_docs; i++)
        lens[i] = data_idx_doc_len(&d, i);
    qsort(lens, (size_t)d.n_docs, sizeof *lens, cmp_u64);

    char a[32], b[32], c[32], e[32], f[32], g[32];
    int bad = 0;
    out(&bad, "data set       %s (Megatron MMIDIDX version 1)\n", prefix);
    out(&bad, "documents      %s\n", thousands(a, d.n_docs));
    out(&bad, "sequences      %s%s\n", thousands(a, d.n_seqs),
        d.one_seq_per_doc ? " (one per document)" : "");
    out(&bad, "tokens         %s\n", thousands(a, d.n_tokens));
    out(&bad, "token dtype    %s (code %d, %d bytes)\n", d.dtype == DATA_DTYPE_UINT16 ? "uint16" : "int32",
        d.dtype, d.itemsize);
    if (max_id >= 0)
        out(&bad, "vocab bound    %s (largest token id %s + 1)\n", thousands(a, (uint64_t)max_id + 1),
            thousands(b, (uint64_t)max_id));
    else
        out(&bad, "vocab bound    0 (no tokens)\n");
    if (d.n_docs > 0) {
        uint64_t n = d.n_docs;
        out(&bad, "doc length     min %s  mean %s  p50 %s  p90 %s  p99 %s  max %s\n", thousands(a, lens[0]),
            ratio(g, d.n_tokens, n), thousands(b, percentile(lens, n, 50)), thousands(c, percentile(lens, n, 90)),
            thousands(e, percentile(lens, n, 99)), thousands(f, lens[n - 1]));
    } else {
        out(&bad, "doc length     (no documents)\n");
    }
    out(&bad, "index file     %s.idx (%s bytes)\n", prefix, thousands(a, d.idx.size));
    out(&bad, "token file     %s.bin (%s bytes)\n", prefix, thousands(a, d.bin.size));
    free(lens);
    data_idx_close(&d);
    if (bad)
        return error_runtime(err, "stdout", "cannot write the output");
    return 0;
}
