/*
 * test/test_data_idx.c - the Megatron indexed data set reader and writer (data/data_idx_*.c).
 *
 * Real fixtures (read where ../shared/real-data is present): the BigScience OpenWebText set
 * (uint16) and Megatron-LM's two CI sets (int32), checked against values computed independently
 * (numpy-free Python over the raw bytes) and against the per-document token counts of
 * lengths/openwebtext1000_lengths.csv. The writer must reproduce those fixtures byte for byte.
 * Then: random round trips, documents made of several sequences, multimodal indexes, a .bin over
 * 4 GiB (sparse), and range errors of read_tokens. Corrupted files: test_data_idx_corrupt.c.
 */
#include "test/testlib.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_idx.h"
#include "util/parse.h"
#include "util/rng.h"

#define OWT "megatron_fixtures/bigscience_owt1000/meg-gpt2-openwebtext_text_document"
#define CI_TRAIN "megatron_fixtures/megatron_lm_ci/assets_datasets_train_test_text_document"
#define CI_FIM "megatron_fixtures/megatron_lm_ci/assets_datasets_fim_fim_text_document"

/* test_real_data checks one file; the prefix itself is not a file. Returns a malloc'd prefix. */
static char *real_prefix(const char *rel)
{
    char *idx = test_format("%s.idx", rel);
    const char *path = test_real_data(idx);
    free(idx);
    if (!path)
        return NULL;
    char *prefix = strdup(path);
    assert_non_null(prefix);
    prefix[strlen(prefix) - 4] = '\0';
    return prefix;
}
#define SKIP_WITHOUT_SET(var, rel)  \
    char *var = real_prefix(rel);   \
    if (!var) {                     \
        skip();                     \
        return;                     \
    }

static void open_ok(DataIdx *d, const char *prefix)
{
    Error err = {0};
    if (data_idx_open(d, prefix, &err) != 0) {
        print_error("data_idx_open(%s): %s\n", prefix, err.msg);
        fail();
    }
}

/* Tokens of document doc, malloc'd (at least one element). */
static int32_t *read_doc(const DataIdx *d, uint64_t doc, uint64_t *len)
{
    Error err = {0};
    *len = data_idx_doc_len(d, doc);
    int32_t *t = malloc((*len + 1) * sizeof *t);
    assert_non_null(t);
    if (data_idx_read_tokens(d, doc, 0, *len, t, &err) != 0) {
        print_error("read_tokens(doc %llu): %s\n", (unsigned long long)doc, err.msg);
        fail();
    }
    return t;
}

static void assert_tokens(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            print_error("token %zu: got %d, want %d\n", i, got[i], want[i]);
            fail();
        }
}

static void test_owt_fixture(void **state)
{
    (void)state;
    SKIP_WITHOUT_SET(prefix, OWT);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.dtype, DATA_DTYPE_UINT16);
    assert_int_equal(d.itemsize, 2);
    assert_int_equal(d.n_docs, 1000);
    assert_int_equal(d.n_seqs, 1000);
    assert_int_equal(d.n_tokens, 1361845);
    assert_true(d.one_seq_per_doc);
    assert_int_equal(d.idx.size, 20042);
    assert_int_equal(d.bin.size, 2 * 1361845);
    assert_int_equal(data_idx_doc_len(&d, 0), 1411);
    assert_int_equal(data_idx_doc_len(&d, 1), 918);
    assert_int_equal(data_idx_doc_len(&d, 2), 1046);
    assert_int_equal(data_idx_doc_len(&d, 999), 758);
    assert_int_equal(data_idx_doc_len(&d, 1000), 0); /* out of range: 0, not a crash */

    uint64_t len;
    int32_t *t = read_doc(&d, 0, &len);
    assert_tokens(t, (const int32_t[]){32, 2153, 4994, 802, 1732}, 5);
    assert_tokens(t + len - 3, (const int32_t[]){447, 251, 4999}, 3);
    free(t);
    t = read_doc(&d, 999, &len);
    assert_tokens(t, (const int32_t[]){44, 272, 508, 336, 397}, 5);
    assert_tokens(t + len - 3, (const int32_t[]){667, 4481, 4999}, 3);
    free(t);

    /* Every document ends with EOD 4999, the only place it occurs; every id is below 5000. */
    uint64_t total = 0, eods = 0;
    for (uint64_t doc = 0; doc < d.n_docs; doc++) {
        t = read_doc(&d, doc, &len);
        assert_true(len > 0);
        assert_int_equal(t[len - 1], 4999);
        for (uint64_t i = 0; i < len; i++) {
            assert_true(t[i] >= 0 && t[i] < 5000);
            eods += t[i] == 4999;
        }
        total += len;
        free(t);
    }
    assert_int_equal(total, d.n_tokens);
    assert_int_equal(eods, 1000);
    data_idx_close(&d);
    free(prefix);
}

/* The CSV's gpt2_tiny_tokens column is the fixture's own per-document count, EOD included. */
static void test_owt_lengths_match_csv(void **state)
{
    (void)state;
    char *prefix = real_prefix(OWT);
    const char *csv_path = prefix ? test_real_data("lengths/openwebtext1000_lengths.csv") : NULL;
    if (!csv_path) {
        free(prefix);
        skip();
        return;
    }
    char *csv = test_read_file(csv_path, NULL);
    assert_non_null(csv);
    DataIdx d;
    open_ok(&d, prefix);
    char *line = strchr(csv, '\n');
    assert_non_null(line);
    assert_int_equal(strncmp(csv, "doc,bytes,gpt2_tiny_tokens,", 27), 0);
    uint64_t rows = 0;
    for (line++; *line; rows++) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        const char *f[3];
        size_t n[3];
        const char *p = line;
        for (int k = 0; k < 3; k++) {
            const char *c = memchr(p, ',', (size_t)(end - p));
            assert_non_null(c);
            f[k] = p;
            n[k] = (size_t)(c - p);
            p = c + 1;
        }
        int64_t doc, tokens;
        assert_int_equal(parse_int64_n(f[0], n[0], &doc), 0);
        assert_int_equal(parse_int64_n(f[2], n[2], &tokens), 0);
        assert_int_equal(doc, (int64_t)rows);
        if ((uint64_t)tokens != data_idx_doc_len(&d, (uint64_t)doc)) {
            print_error("document %lld: CSV says %lld tokens, the .idx %llu\n", (long long)doc, (long long)tokens,
                        (unsigned long long)data_idx_doc_len(&d, (uint64_t)doc));
            fail();
        }
        line = end + 1;
    }
    assert_int_equal(rows, 1000);
    data_idx_close(&d);
    free(csv);
    free(prefix);
}

static void test_ci_train_test_fixture(void **state)
{
    (void)state;
    SKIP_WITHOUT_SET(prefix, CI_TRAIN);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.dtype, DATA_DTYPE_INT32);
    assert_int_equal(d.itemsize, 4);
    assert_int_equal(d.n_docs, 1000);
    assert_int_equal(d.n_tokens, 5000);
    assert_true(d.one_seq_per_doc);
    const int32_t want[] = {111214, 343, 54365900, 77, 131072};
    for (uint64_t doc = 0; doc < d.n_docs; doc++) {
        uint64_t len;
        int32_t *t = read_doc(&d, doc, &len);
        assert_int_equal(len, 5);
        assert_tokens(t, want, 5);
        free(t);
    }
    data_idx_close(&d);
    free(prefix);
}

static void test_ci_fim_fixture(void **state)
{
    (void)state;
    SKIP_WITHOUT_SET(prefix, CI_FIM);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.dtype, DATA_DTYPE_INT32);
    assert_int_equal(d.n_docs, 1000);
    assert_int_equal(d.n_tokens, 7600);
    uint64_t len, sevens = 0;
    int32_t *t = read_doc(&d, 0, &len);
    assert_int_equal(len, 8);
    assert_tokens(t, (const int32_t[]){128000, 1820, 4062, 14198, 39935, 35308, 927, 128001}, 8);
    free(t);
    t = read_doc(&d, 999, &len);
    assert_int_equal(len, 7);
    assert_tokens(t, (const int32_t[]){128000, 33156, 6975, 13736, 1690, 8522, 128001}, 7);
    free(t);
    /* Llama-3 ids: each document is <|begin_of_text|> ... <|end_of_text|>. */
    for (uint64_t doc = 0; doc < d.n_docs; doc++) {
        t = read_doc(&d, doc, &len);
        assert_true(len == 7 || len == 8);
        sevens += len == 7;
        assert_int_equal(t[0], 128000);
        assert_int_equal(t[len - 1], 128001);
        free(t);
    }
    assert_int_equal(sevens, 400);
    data_idx_close(&d);
    free(prefix);
}

/* Rewrites every document of a fixture with the writer; both files must come out identical. */
static void rewrite_identical(const char *rel)
{
    char *prefix = real_prefix(rel);
    if (!prefix) {
        skip();
        return;
    }
    DataIdx d;
    open_ok(&d, prefix);
    char *dir = test_tmpdir(), *out = test_format("%s/copy", dir);
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, out, d.dtype, &err), 0);
    for (uint64_t doc = 0; doc < d.n_docs; doc++) {
        uint64_t len;
        int32_t *t = read_doc(&d, doc, &len);
        assert_int_equal(data_idx_writer_add(&w, t, len, &err), 0);
        free(t);
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    for (int k = 0; k < 2; k++) {
        const char *ext = k ? ".bin" : ".idx";
        char *a = test_format("%s%s", prefix, ext), *b = test_format("%s%s", out, ext);
        size_t na, nb;
        char *ca = test_read_file(a, &na), *cb = test_read_file(b, &nb);
        assert_non_null(ca);
        assert_non_null(cb);
        assert_int_equal(na, nb);
        if (memcmp(ca, cb, na) != 0) {
            print_error("%s differs from %s\n", b, a);
            fail();
        }
        free(a), free(b), free(ca), free(cb);
    }
    data_idx_close(&d);
    test_rm_rf(dir);
    free(dir), free(out), free(prefix);
}

static void test_writer_reproduces_owt(void **state) { (void)state; rewrite_identical(OWT); }
static void test_writer_reproduces_ci_sets(void **state)
{
    (void)state;
    rewrite_identical(CI_TRAIN);
    rewrite_identical(CI_FIM);
}

/* Random documents (a tenth of them empty, the dtype's extreme ids included) round trip exactly. */
static void round_trip(int dtype, uint64_t seed)
{
    enum { N = 300 };
    Rng rng;
    rng_seed(&rng, seed);
    int32_t *docs[N];
    uint64_t lens[N], total = 0;
    int64_t hi = -1;
    uint64_t limit = dtype == DATA_DTYPE_UINT16 ? 65536 : (uint64_t)INT32_MAX + 1;
    for (int i = 0; i < N; i++) {
        lens[i] = rng_below(&rng, 10) == 0 ? 0 : 1 + rng_below(&rng, 3000);
        if (i == 0)
            lens[i] = 2; /* holds the extreme ids */
        if (i == 1 || i == N - 1)
            lens[i] = 0;
        docs[i] = malloc((lens[i] + 1) * sizeof(int32_t));
        assert_non_null(docs[i]);
        for (uint64_t j = 0; j < lens[i]; j++)
            docs[i][j] = (int32_t)rng_below(&rng, limit);
        if (i == 0)
            docs[0][0] = 0, docs[0][1] = (int32_t)(limit - 1);
        for (uint64_t j = 0; j < lens[i]; j++)
            hi = docs[i][j] > hi ? docs[i][j] : hi;
        total += lens[i];
    }

    char *dir = test_tmpdir(), *prefix = test_format("%s/rt", dir);
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, dtype, &err), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(data_idx_writer_add(&w, docs[i], lens[i], &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    assert_int_equal(w.n_docs, N);
    assert_int_equal(w.max_token, hi);
    int item = dtype == DATA_DTYPE_UINT16 ? 2 : 4;
    assert_int_equal(w.bin_bytes, total * (uint64_t)item);

    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.dtype, dtype);
    assert_int_equal(d.n_docs, N);
    assert_int_equal(d.n_seqs, N);
    assert_int_equal(d.n_tokens, total);
    assert_true(d.one_seq_per_doc);
    assert_int_equal(d.idx.size, 34 + 12 * N + 8 * (N + 1));
    assert_int_equal(d.bin.size, total * (uint64_t)item);
    for (int i = 0; i < N; i++) {
        uint64_t len;
        int32_t *t = read_doc(&d, (uint64_t)i, &len);
        assert_int_equal(len, lens[i]);
        assert_tokens(t, docs[i], len);
        free(t);
        if (lens[i] > 10) { /* a piece from the middle */
            int32_t piece[7];
            assert_int_equal(data_idx_read_tokens(&d, (uint64_t)i, 3, 7, piece, &err), 0);
            assert_tokens(piece, docs[i] + 3, 7);
        }
        free(docs[i]);
    }
    data_idx_close(&d);
    test_rm_rf(dir);
    free(dir), free(prefix);
}

static void test_round_trip_uint16(void **state) { (void)state; round_trip(DATA_DTYPE_UINT16, 1); }
static void test_round_trip_int32(void **state) { (void)state; round_trip(DATA_DTYPE_INT32, 2); }

static void test_writer_empty_set(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/empty", dir);
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.n_docs, 0);
    assert_int_equal(d.n_seqs, 0);
    assert_int_equal(d.n_tokens, 0);
    assert_int_equal(d.idx.size, 34 + 8);
    assert_int_equal(d.bin.size, 0);
    int32_t t;
    assert_int_equal(data_idx_read_tokens(&d, 0, 0, 0, &t, &err), -1);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(dir), free(prefix);
}

/* Names in dir containing ".tmp.": temporaries a writer left behind. */
static int count_temporaries(const char *dir)
{
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(dp);
    return n;
}

static void write_set(const char *prefix, int dtype, const int32_t *tokens, const uint64_t *lens, int n)
{
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, dtype, &err), 0);
    for (int i = 0; i < n; i++) {
        assert_int_equal(data_idx_writer_add(&w, tokens, lens[i], &err), 0);
        tokens += lens[i];
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
}

static void test_writer_rejects_tokens_that_do_not_fit(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/bad", dir);
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){1, 2}, 2, &err), 0);
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){5, 65536, 7}, 3, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "document 1, token 1: id 65536 does not fit uint16 (0..65535)"));
    err = (Error){0};
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){-1}, 1, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "id -1 does not fit uint16"));
    /* A document longer than an int32 length is refused before any token is read. */
    err = (Error){0};
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){1}, (uint64_t)INT32_MAX + 1, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "2147483648 tokens"));
    /* The rejected documents left nothing behind: the set holds documents 0 and 1 only. */
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){65535}, 1, &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.n_docs, 2);
    assert_int_equal(d.n_tokens, 3);
    uint64_t len;
    int32_t *t = read_doc(&d, 1, &len);
    assert_int_equal(len, 1);
    assert_int_equal(t[0], 65535);
    free(t);
    data_idx_close(&d);

    err = (Error){0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_INT32, &err), 0);
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){INT32_MAX, -5}, 2, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "document 0, token 1: id -5 does not fit int32"));
    data_idx_writer_abort(&w);
    assert_int_equal(count_temporaries(dir), 0);

    err = (Error){0};
    assert_int_equal(data_idx_writer_open(&w, prefix, 7, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "dtype code 7 cannot be written"));
    data_idx_writer_abort(&w); /* safe after a failed open */
    err = (Error){0};
    assert_int_equal(data_idx_writer_open(&w, "/nonexistent-dir/set", DATA_DTYPE_UINT16, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/set.bin: cannot create: No such file or directory"));
    data_idx_writer_abort(&w);
    test_rm_rf(dir);
    free(dir), free(prefix);
}

/* An abandoned write leaves the old set untouched and no temporary files; a finished one replaces it. */
static void test_writer_abort_keeps_old_set(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
    write_set(prefix, DATA_DTYPE_UINT16, (const int32_t[]){1, 2, 3}, (const uint64_t[]){3}, 1);
    char *ip = test_format("%s.idx", prefix), *bp = test_format("%s.bin", prefix);
    size_t ni, nb;
    char *old_idx = test_read_file(ip, &ni), *old_bin = test_read_file(bp, &nb);
    assert_non_null(old_idx);
    assert_non_null(old_bin);

    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_INT32, &err), 0);
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){9, 9, 9, 9, 9}, 5, &err), 0);
    assert_int_equal(count_temporaries(dir), 1); /* the .bin is being written aside */
    data_idx_writer_abort(&w);
    data_idx_writer_abort(&w); /* twice is harmless */
    assert_int_equal(count_temporaries(dir), 0);
    size_t n2;
    char *now = test_read_file(ip, &n2);
    assert_true(n2 == ni && !memcmp(now, old_idx, ni));
    free(now);
    now = test_read_file(bp, &n2);
    assert_true(n2 == nb && !memcmp(now, old_bin, nb));
    free(now);

    write_set(prefix, DATA_DTYPE_INT32, (const int32_t[]){9, 9, 9, 9, 9}, (const uint64_t[]){5}, 1);
    assert_int_equal(count_temporaries(dir), 0);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.dtype, DATA_DTYPE_INT32);
    assert_int_equal(d.n_tokens, 5);
    data_idx_close(&d);
    /* A finished writer refuses more work with an error instead of touching freed memory. */
    err = (Error){0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_INT32, &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    assert_int_equal(data_idx_writer_add(&w, (const int32_t[]){1}, 1, &err), -1);
    assert_int_equal(data_idx_writer_finish(&w, &err), -1);
    data_idx_writer_abort(&w);
    test_rm_rf(dir);
    free(dir), free(prefix), free(ip), free(bp), free(old_idx), free(old_bin);
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* An .idx built by hand: header, lengths, pointers, doc_index, then `extra` mode bytes. */
static void write_raw_idx(const char *path, int dtype, uint64_t S, const int32_t *len, const int64_t *ptr,
                          uint64_t D, const int64_t *doc, uint64_t extra)
{
    size_t size = 34 + 12 * S + 8 * D + extra;
    unsigned char *b = calloc(1, size);
    assert_non_null(b);
    memcpy(b, "MMIDIDX\0\0", 9);
    put_le(b + 9, 1, 8);
    b[17] = (unsigned char)dtype;
    put_le(b + 18, S, 8);
    put_le(b + 26, D, 8);
    for (uint64_t i = 0; i < S; i++) {
        put_le(b + 34 + 4 * i, (uint32_t)len[i], 4);
        put_le(b + 34 + 4 * S + 8 * i, (uint64_t)ptr[i], 8);
    }
    for (uint64_t k = 0; k < D; k++)
        put_le(b + 34 + 12 * S + 8 * k, (uint64_t)doc[k], 8);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    free(b);
}

/* Documents of several sequences (as Megatron writes with sentence splitting), an empty document,
 * sequences stored out of order in the .bin, and a multimodal index's trailing mode bytes. */
static void test_documents_of_several_sequences(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/multi", dir);
    char *ip = test_format("%s.idx", prefix);
    /* .bin: uint16 tokens 100..111. Sequence i = [ptr, ptr + 2 len) bytes. */
    unsigned char bin[24];
    for (int i = 0; i < 12; i++)
        put_le(bin + 2 * i, 100 + (uint64_t)i, 2);
    free(test_write_file(dir, "multi.bin", (const char *)bin, sizeof bin));
    const int32_t len[] = {3, 2, 0, 4, 3};
    const int64_t ptr[] = {0, 18, 6, 6, 14}; /* sequence 1 lies after sequence 4 */
    const int64_t doc[] = {0, 2, 2, 5};      /* documents: {0,1}, {}, {2,3,4} */
    for (uint64_t modes = 0; modes <= 5; modes += 5) {
        write_raw_idx(ip, DATA_DTYPE_UINT16, 5, len, ptr, 4, doc, modes);
        DataIdx d;
        open_ok(&d, prefix);
        assert_false(d.one_seq_per_doc);
        assert_int_equal(d.n_docs, 3);
        assert_int_equal(d.n_seqs, 5);
        assert_int_equal(d.n_tokens, 12);
        assert_int_equal(data_idx_doc_len(&d, 0), 5);
        assert_int_equal(data_idx_doc_len(&d, 1), 0);
        assert_int_equal(data_idx_doc_len(&d, 2), 7);
        uint64_t n;
        int32_t *t = read_doc(&d, 0, &n);
        assert_tokens(t, (const int32_t[]){100, 101, 102, 109, 110}, 5);
        free(t);
        t = read_doc(&d, 2, &n);
        assert_tokens(t, (const int32_t[]){103, 104, 105, 106, 107, 108, 109}, 7);
        free(t);
        int32_t piece[4];
        Error err = {0};
        /* Starting inside sequence 3, across the empty sequence boundary into sequence 4. */
        assert_int_equal(data_idx_read_tokens(&d, 2, 2, 4, piece, &err), 0);
        assert_tokens(piece, (const int32_t[]){105, 106, 107, 108}, 4);
        assert_int_equal(data_idx_read_tokens(&d, 0, 2, 2, piece, &err), 0);
        assert_tokens(piece, (const int32_t[]){102, 109}, 2);
        data_idx_close(&d);
    }
    test_rm_rf(dir);
    free(dir), free(prefix), free(ip);
}

/* A .bin over 4 GiB (sparse): the last sequence starts past 2^32 bytes and reads correctly. */
static void test_bin_over_4gib(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/big", dir);
    char *ip = test_format("%s.idx", prefix), *bp = test_format("%s.bin", prefix);
    const uint64_t far = ((uint64_t)1 << 32) + 10, size = far + 2 * 5;
    int fd = open(bp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    if (ftruncate(fd, (off_t)size) != 0) {
        fprintf(stderr, "# skip: this file system refuses a %llu-byte sparse file: %s\n", (unsigned long long)size,
                strerror(errno));
        close(fd);
        test_rm_rf(dir);
        free(dir), free(prefix), free(ip), free(bp);
        skip();
        return;
    }
    unsigned char head[6], tail[10];
    for (int i = 0; i < 3; i++)
        put_le(head + 2 * i, 1 + (uint64_t)i, 2);
    for (int i = 0; i < 5; i++)
        put_le(tail + 2 * i, 60000 + (uint64_t)i, 2);
    assert_int_equal(pwrite(fd, head, sizeof head, 0), (ssize_t)sizeof head);
    assert_int_equal(pwrite(fd, tail, sizeof tail, (off_t)far), (ssize_t)sizeof tail);
    assert_int_equal(close(fd), 0);
    /* Three documents: 3 tokens at 0, 0 tokens at 6, 5 tokens at 2^32 + 10. */
    write_raw_idx(ip, DATA_DTYPE_UINT16, 3, (const int32_t[]){3, 0, 5}, (const int64_t[]){0, 6, (int64_t)far}, 4,
                  (const int64_t[]){0, 1, 2, 3}, 0);
    DataIdx d;
    open_ok(&d, prefix);
    assert_int_equal(d.bin.size, size);
    assert_int_equal(d.n_tokens, 8);
    assert_int_equal(data_idx_doc_len(&d, 2), 5);
    int32_t t[5];
    Error err = {0};
    assert_int_equal(data_idx_read_tokens(&d, 2, 0, 5, t, &err), 0);
    assert_tokens(t, (const int32_t[]){60000, 60001, 60002, 60003, 60004}, 5);
    assert_int_equal(data_idx_read_tokens(&d, 0, 1, 2, t, &err), 0);
    assert_tokens(t, (const int32_t[]){2, 3}, 2);
    data_idx_close(&d);

    /* One token short of the end: the check must use 64-bit offsets, not wrap at 4 GiB. */
    write_raw_idx(ip, DATA_DTYPE_UINT16, 3, (const int32_t[]){3, 0, 6}, (const int64_t[]){0, 6, (int64_t)far}, 4,
                  (const int64_t[]){0, 1, 2, 3}, 0);
    assert_int_equal(data_idx_open(&d, prefix, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(
        strstr(err.msg, "sequence 2 (byte offset 4294967306, 6 tokens of 2 bytes) ends at byte 4294967318"));

    /* inspect reads it too (only the 8 tokens the index points at). */
    write_raw_idx(ip, DATA_DTYPE_UINT16, 3, (const int32_t[]){3, 0, 5}, (const int64_t[]){0, 6, (int64_t)far}, 4,
                  (const int64_t[]){0, 1, 2, 3}, 0);
    CmdResult r;
    test_run_wlbtrain(&r, (const char *[]){"inspect", prefix, NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "vocab bound    60,005"));
    assert_non_null(strstr(r.out, "(4,294,967,316 bytes)"));
    test_cmd_free(&r);
    test_rm_rf(dir);
    free(dir), free(prefix), free(ip), free(bp);
}

static void expect_range_error(const DataIdx *d, uint64_t doc, uint64_t off, uint64_t n, const char *words)
{
    int32_t t[8] = {0};
    Error err = {0};
    assert_int_equal(data_idx_read_tokens(d, doc, off, n, t, &err), -1);
    assert_int_equal(err.status, 1); /* a caller's bug, not bad input */
    assert_int_equal(strncmp(err.msg, d->prefix, strlen(d->prefix)), 0);
    if (!strstr(err.msg, words)) {
        print_error("expected '%s' in '%s'\n", words, err.msg);
        fail();
    }
}

static void test_read_tokens_range(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/r", dir);
    write_set(prefix, DATA_DTYPE_UINT16, (const int32_t[]){1, 2, 3, 4, 5, 6}, (const uint64_t[]){4, 0, 2}, 3);
    DataIdx d;
    open_ok(&d, prefix);
    int32_t t[8];
    Error err = {0};
    assert_int_equal(data_idx_read_tokens(&d, 0, 4, 0, t, &err), 0); /* empty range at the end */
    assert_int_equal(data_idx_read_tokens(&d, 1, 0, 0, t, &err), 0);
    assert_int_equal(data_idx_read_tokens(&d, 2, 1, 1, t, &err), 0);
    assert_int_equal(t[0], 6);
    expect_range_error(&d, 3, 0, 1, "document 3 does not exist (the data set has 3 documents)");
    expect_range_error(&d, UINT64_MAX, 0, 0, "does not exist");
    expect_range_error(&d, 0, 5, 0, "tokens [5, 5) are outside document 0, which has 4 tokens");
    expect_range_error(&d, 0, 2, 3, "tokens [2, 5) are outside document 0, which has 4 tokens");
    expect_range_error(&d, 1, 0, 1, "outside document 1, which has 0 tokens");
    expect_range_error(&d, 2, 1, UINT64_MAX, "(overflows)");
    data_idx_close(&d);
    data_idx_close(&d); /* closing twice is harmless */
    test_rm_rf(dir);
    free(dir), free(prefix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owt_fixture),
        cmocka_unit_test(test_owt_lengths_match_csv),
        cmocka_unit_test(test_ci_train_test_fixture),
        cmocka_unit_test(test_ci_fim_fixture),
        cmocka_unit_test(test_writer_reproduces_owt),
        cmocka_unit_test(test_writer_reproduces_ci_sets),
        cmocka_unit_test(test_round_trip_uint16),
        cmocka_unit_test(test_round_trip_int32),
        cmocka_unit_test(test_writer_empty_set),
        cmocka_unit_test(test_writer_rejects_tokens_that_do_not_fit),
        cmocka_unit_test(test_writer_abort_keeps_old_set),
        cmocka_unit_test(test_documents_of_several_sequences),
        cmocka_unit_test(test_bin_over_4gib),
        cmocka_unit_test(test_read_tokens_range),
    };
    return cmocka_run_group_tests_name("data_idx", tests, NULL, NULL);
}
