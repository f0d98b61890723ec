/*
 * test/test_cli_inspect.c - `wlbtrain inspect PREFIX`, run as a user runs it.
 *
 * The real OWT and Megatron CI sets (counts, dtype, vocabulary bound, nearest-rank percentiles
 * computed independently over the .idx lengths), hand-made sets whose statistics are known in
 * closed form, and the error paths: flags, missing or corrupted files, a negative token id.
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_idx.h"

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

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

static void assert_has(const CmdResult *r, const char *const *want)
{
    for (; *want; want++)
        if (!strstr(r->out, *want)) {
            print_error("output lacks '%s':\n%s\nstderr:\n%s\n", *want, r->out, r->err);
            fail();
        }
}

static void test_inspect_owt(void **state)
{
    (void)state;
    char *prefix = real_prefix("megatron_fixtures/bigscience_owt1000/meg-gpt2-openwebtext_text_document");
    if (!prefix) {
        skip();
        return;
    }
    CmdResult r;
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    char *first = test_format("data set       %s ", prefix);
    assert_has(&r, (const char *[]){first, "documents      1,000\n", "sequences      1,000 (one per document)\n",
                                    "tokens         1,361,845\n", "token dtype    uint16 (code 8, 2 bytes)\n",
                                    "vocab bound    5,000 (largest token id 4,999 + 1)\n",
                                    "doc length     min 193  mean 1,361.8  p50 935  p90 2,701  p99 7,390  max 21,809\n",
                                    ".idx (20,042 bytes)\n", ".bin (2,723,690 bytes)\n", NULL});
    free(first);
    test_cmd_free(&r);
    free(prefix);
}

static void test_inspect_ci_sets(void **state)
{
    (void)state;
    char *prefix = real_prefix("megatron_fixtures/megatron_lm_ci/assets_datasets_train_test_text_document");
    if (!prefix) {
        skip();
        return;
    }
    CmdResult r;
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    assert_has(&r, (const char *[]){"documents      1,000\n", "tokens         5,000\n", "int32 (code 4, 4 bytes)",
                                    "vocab bound    54,365,901 (largest token id 54,365,900 + 1)",
                                    "min 5  mean 5.0  p50 5  p90 5  p99 5  max 5\n", NULL});
    test_cmd_free(&r);
    free(prefix);
    prefix = real_prefix("megatron_fixtures/megatron_lm_ci/assets_datasets_fim_fim_text_document");
    assert_non_null(prefix);
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    /* 400 documents of 7 tokens, 600 of 8: the 400th smallest is 7, p50 (500th) is 8. */
    assert_has(&r, (const char *[]){"tokens         7,600\n", "vocab bound    128,002 (largest token id 128,001 + 1)",
                                    "min 7  mean 7.6  p50 8  p90 8  p99 8  max 8\n", NULL});
    test_cmd_free(&r);
    free(prefix);
}

static void write_set(const char *prefix, int dtype, const int32_t *tokens, const uint64_t *lens, uint64_t n)
{
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, dtype, &err), 0);
    for (uint64_t i = 0; i < n; i++) {
        assert_int_equal(data_idx_writer_add(&w, tokens, lens[i], &err), 0);
        tokens += lens[i];
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
}

/* Documents of 1, 2, ..., 100 tokens in shuffled order: nearest-rank p-th percentile is exactly p. */
static void test_inspect_percentiles(void **state)
{
    (void)state;
    enum { N = 100 };
    uint64_t lens[N];
    for (uint64_t i = 0; i < N; i++)
        lens[i] = 1 + (i * 37) % N; /* 37 is coprime with 100: a permutation of 1..100 */
    int32_t *tokens = calloc(N * (N + 1) / 2, sizeof *tokens);
    assert_non_null(tokens);
    tokens[17] = 65535;
    char *dir = test_tmpdir(), *prefix = test_format("%s/p", dir);
    write_set(prefix, DATA_DTYPE_UINT16, tokens, lens, N);
    CmdResult r;
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    assert_has(&r, (const char *[]){"documents      100\n", "tokens         5,050\n",
                                    "vocab bound    65,536 (largest token id 65,535 + 1)\n",
                                    "min 1  mean 50.5  p50 50  p90 90  p99 99  max 100\n", NULL});
    test_cmd_free(&r);

    /* Three documents 10, 20, 30: p50 = the 2nd smallest (ceil 1.5), p90 = p99 = the 3rd. */
    write_set(prefix, DATA_DTYPE_INT32, tokens + 18, (const uint64_t[]){30, 10, 20}, 3); /* all zeros */
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    assert_has(&r, (const char *[]){"int32 (code 4, 4 bytes)", "vocab bound    1 (largest token id 0 + 1)\n",
                                    "min 10  mean 20.0  p50 20  p90 30  p99 30  max 30\n", NULL});
    test_cmd_free(&r);

    write_set(prefix, DATA_DTYPE_UINT16, tokens, NULL, 0);
    RUN(&r, "inspect", prefix);
    assert_int_equal(r.status, 0);
    assert_has(&r, (const char *[]){"documents      0\n", "tokens         0\n", "vocab bound    0 (no tokens)\n",
                                    "doc length     (no documents)\n", NULL});
    test_cmd_free(&r);
    test_rm_rf(dir);
    free(dir), free(prefix), free(tokens);
}

/* The writer refuses negative ids, so the .bin is patched after writing. */
static void test_inspect_negative_token(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/neg", dir), *bp = test_format("%s.bin", prefix);
    write_set(prefix, DATA_DTYPE_INT32, (const int32_t[]){1, 2, 3, 4, 5}, (const uint64_t[]){2, 3}, 2);
    size_t n;
    char *bin = test_read_file(bp, &n);
    assert_non_null(bin);
    assert_int_equal(n, 20);
    memcpy(bin + 12, "\xfb\xff\xff\xff", 4); /* document 1, token 1 = -5 */
    free(test_write_file(dir, "neg.bin", bin, n));
    CmdResult r;
    RUN(&r, "inspect", prefix);
    char *want = test_format("%s: document 1, token 1: negative token id -5", prefix);
    test_assert_error(&r, want);
    assert_string_equal(r.out, "");
    test_cmd_free(&r);
    test_rm_rf(dir);
    free(dir), free(prefix), free(bp), free(bin), free(want);
}

static void test_inspect_arguments(void **state)
{
    (void)state;
    CmdResult r;
    RUN(&r, "inspect");
    test_assert_error(&r, "inspect: needs a PREFIX");
    test_cmd_free(&r);
    RUN(&r, "inspect", "a", "b");
    test_assert_error(&r, "inspect: takes one PREFIX, got 'a' and 'b'");
    test_cmd_free(&r);
    RUN(&r, "inspect", "--frobnicate", "a");
    test_assert_error(&r, "--frobnicate: unknown flag");
    test_cmd_free(&r);
    RUN(&r, "inspect", "/nonexistent/dir/set");
    test_assert_error(&r, "/nonexistent/dir/set.idx: cannot open: No such file or directory");
    test_cmd_free(&r);
}

/* A few corruptions through the binary: one error line naming the file, exit 2, nothing on stdout. */
static void test_inspect_corrupt_sets(void **state)
{
    (void)state;
    static const struct {
        const char *ext;
        size_t offset, keep; /* write byte 0xff at offset (if < keep), keep that many bytes */
        const char *expect;
    } cases[] = {
        {".idx", 0, 122, ".idx: not a Megatron index: bad magic"},
        {".idx", 17, 122, ".idx: dtype code 255 is not a Megatron dtype"},
        {".idx", 200, 100,
         ".idx: truncated: the header promises 4 sequences and 5 document entries (122 bytes), the file has 100 bytes"},
        {".bin", 200, 18, ".idx: sequence 3 (byte offset 16, 2 tokens of 2 bytes) ends at byte 20, past the end of"},
        {".idx", 38 + 3, 122, ".idx: sequence 1 has a negative length -16777216"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
        char *path = test_format("%s%s", prefix, cases[i].ext);
        write_set(prefix, DATA_DTYPE_UINT16, (const int32_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                  (const uint64_t[]){3, 0, 5, 2}, 4);
        size_t n;
        char *data = test_read_file(path, &n);
        assert_non_null(data);
        assert_true(cases[i].keep <= n);
        if (cases[i].offset < cases[i].keep)
            data[cases[i].offset] = (char)0xff;
        free(test_write_file(dir, strrchr(path, '/') + 1, data, cases[i].keep));
        CmdResult r;
        RUN(&r, "inspect", prefix);
        test_assert_error(&r, cases[i].expect);
        assert_string_equal(r.out, "");
        test_cmd_free(&r);
        test_rm_rf(dir);
        free(dir), free(prefix), free(path), free(data);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_owt),
        cmocka_unit_test(test_inspect_ci_sets),
        cmocka_unit_test(test_inspect_percentiles),
        cmocka_unit_test(test_inspect_negative_token),
        cmocka_unit_test(test_inspect_arguments),
        cmocka_unit_test(test_inspect_corrupt_sets),
    };
    return cmocka_run_group_tests_name("cli_inspect", tests, NULL, NULL);
}
