/*
 * test/test_data_idx_corrupt.c - every way data_idx_open rejects a damaged data set.
 *
 * Each case writes a valid small set with the writer, damages one thing (a header field, an array
 * entry, the size of a file, a missing file) and asserts that data_idx_open fails with status 2,
 * a message that starts with the path of the file at fault and says what is wrong with its numbers,
 * and leaves the DataIdx closed. Under ASan+UBSan this also shows no out-of-bounds read or
 * arithmetic overflow happens on the way.
 *
 * The base set: uint16 (or int32) documents of 3, 0, 5 and 2 tokens, so S = 4 and D = 5:
 *   .idx  122 bytes: header 0..33 | lengths 34 + 4i | pointers 50 + 8i (0, 6, 6, 16) | doc_index 82 + 8k
 *   .bin  20 bytes (40 for int32)
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_idx.h"

enum Op { PATCH, TRUNCATE, APPEND, REMOVE, EMPTY, MAKE_DIR };
enum { LEN = 34, PTR = 50, DOC = 82 };

typedef struct Case {
    const char *name;
    char file;      /* 'i': damage the .idx, 'b': the .bin */
    enum Op op;
    int offset, width; /* PATCH: little-endian value of width bytes at offset */
    uint64_t value;    /* PATCH: the value; TRUNCATE/APPEND: how many bytes */
    char at;           /* the message starts with the path of this file ('i' or 'b') */
    const char *expect;
    int int32;         /* base set of int32 tokens instead of uint16 */
} Case;

static const Case cases[] = {
    {"bad_magic", 'i', PATCH, 0, 1, 'X', 'i',
     "not a Megatron index: bad magic (the file starts with bytes 58 4d 49 44", 0},
    {"version_2", 'i', PATCH, 9, 8, 2, 'i', "MMIDIDX version 2; wlbtrain reads version 1", 0},
    {"dtype_7", 'i', PATCH, 17, 1, 7, 'i',
     "dtype code 7 (float32) is not a token type wlbtrain reads; wlbtrain reads 4 = int32 and 8 = uint16", 0},
    {"dtype_1", 'i', PATCH, 17, 1, 1, 'i', "dtype code 1 (uint8) is not a token type", 0},
    {"dtype_200", 'i', PATCH, 17, 1, 200, 'i', "dtype code 200 is not a Megatron dtype (1..8)", 0},
    {"idx_truncated", 'i', TRUNCATE, 0, 0, 8, 'i',
     "truncated: the header promises 4 sequences and 5 document entries (122 bytes), the file has 114 bytes", 0},
    {"idx_extra_bytes", 'i', APPEND, 0, 0, 3, 'i',
     "3 unexpected bytes at the end: 4 sequences and 5 document entries take 122 bytes (or 126 with multimodal "
     "modes), the file has 125 bytes", 0},
    {"idx_extra_bytes_s_plus_1", 'i', APPEND, 0, 0, 5, 'i', "5 unexpected bytes at the end", 0},
    {"s_one_too_many", 'i', PATCH, 18, 8, 5, 'i',
     "truncated: the header promises 5 sequences and 5 document entries (134 bytes), the file has 122 bytes", 0},
    {"s_huge", 'i', PATCH, 18, 8, (uint64_t)1 << 62, 'i',
     "truncated: the header promises 4611686018427387904 sequences and 5 document entries (more than 2^64 bytes)", 0},
    {"d_huge", 'i', PATCH, 26, 8, UINT64_MAX, 'i', "18446744073709551615 document entries (more than 2^64 bytes)", 0},
    {"d_too_small", 'i', PATCH, 26, 8, 4, 'i', "8 unexpected bytes at the end", 0},
    {"doc_index_not_at_0", 'i', PATCH, DOC, 8, 1, 'i', "document index entry 0 is 1, expected 0", 0},
    {"doc_index_decreasing", 'i', PATCH, DOC + 16, 8, 0, 'i', "document index decreases at entry 2: 0 after 1", 0},
    {"doc_index_negative", 'i', PATCH, DOC + 8, 8, UINT64_MAX, 'i',
     "document index decreases at entry 1: -1 after 0", 0},
    {"doc_index_past_s", 'i', PATCH, DOC + 16, 8, 9, 'i', "document index entry 2 is 9, past the 4 sequences", 0},
    {"doc_index_not_ending_at_s", 'i', PATCH, DOC + 32, 8, 3, 'i',
     "document index ends at 3, expected the sequence count 4", 0},
    {"negative_length", 'i', PATCH, LEN + 4, 4, 0xffffffffu, 'i', "sequence 1 has a negative length -1", 0},
    {"negative_pointer", 'i', PATCH, PTR + 16, 8, (uint64_t)-8, 'i',
     "sequence 2 has a negative byte offset -8 into", 0},
    {"pointer_past_bin", 'i', PATCH, PTR + 24, 8, 1000, 'i', "sequence 3 starts at byte 1000, past the end of", 0},
    {"pointer_plus_length_overflows", 'i', PATCH, PTR + 16, 8, INT64_MAX - 2, 'i',
     "sequence 2 starts at byte 9223372036854775805, past the end of", 0},
    {"length_huge", 'i', PATCH, LEN + 8, 4, INT32_MAX, 'i',
     "sequence 2 (byte offset 6, 2147483647 tokens of 2 bytes) ends at byte 4294967300, past the end of", 0},
    {"length_past_bin", 'i', PATCH, LEN + 12, 4, 3, 'i',
     "sequence 3 (byte offset 16, 3 tokens of 2 bytes) ends at byte 22, past the end of", 0},
    {"bin_truncated", 'b', TRUNCATE, 0, 0, 2, 'i',
     "sequence 3 (byte offset 16, 2 tokens of 2 bytes) ends at byte 20, past the end of", 0},
    {"bin_half_token", 'b', TRUNCATE, 0, 0, 1, 'b',
     "19 bytes is not a whole number of uint16 tokens (2 bytes each)", 0},
    {"bin_int32_partial_token", 'b', TRUNCATE, 0, 0, 2, 'b',
     "38 bytes is not a whole number of int32 tokens (4 bytes each)", 1},
    {"bin_missing", 'b', REMOVE, 0, 0, 0, 'b', "cannot open: No such file or directory", 0},
    {"idx_missing", 'i', REMOVE, 0, 0, 0, 'i', "cannot open: No such file or directory", 0},
    {"idx_empty", 'i', EMPTY, 0, 0, 0, 'i', "empty file (0 bytes)", 0},
    {"bin_empty", 'b', EMPTY, 0, 0, 0, 'i',
     "sequence 0 (byte offset 0, 3 tokens of 2 bytes) ends at byte 6, past the end of", 0},
    {"idx_shorter_than_header", 'i', TRUNCATE, 0, 0, 122 - 20, 'i',
     "truncated: 20 bytes, shorter than the 34-byte MMIDIDX header", 0},
    {"idx_shorter_than_magic", 'i', TRUNCATE, 0, 0, 122 - 5, 'i',
     "bad magic (the file starts with bytes 4d 4d 49 44 49, expected", 0},
    {"idx_is_a_directory", 'i', MAKE_DIR, 0, 0, 0, 'i', "not a regular file", 0},
    {"pointer_misaligned", 'i', PATCH, PTR + 16, 8, 7, 'i',
     "document 2 (sequence 2) starts at byte 7 of", 0},
    {"pointer_misaligned_int32", 'i', PATCH, PTR + 16, 8, 14, 'i',
     ".bin, not a multiple of its 4-byte int32 tokens: the index is corrupt or belongs to another .bin", 1},
};

static void rewrite(const char *path, const unsigned char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void damage(const Case *c, const char *path)
{
    size_t n;
    char *data;
    switch (c->op) {
    case PATCH:
    case TRUNCATE:
    case APPEND:
        data = test_read_file(path, &n);
        assert_non_null(data);
        if (c->op == APPEND) {
            data = realloc(data, n + c->value);
            assert_non_null(data);
        }
        if (c->op == PATCH)
            for (int i = 0; i < c->width; i++)
                data[c->offset + i] = (char)(c->value >> (8 * i));
        else if (c->op == TRUNCATE)
            n -= c->value;
        else
            memset(data + n, 0, c->value), n += c->value;
        rewrite(path, (unsigned char *)data, n);
        free(data);
        break;
    case REMOVE:
        assert_int_equal(unlink(path), 0);
        break;
    case EMPTY:
        rewrite(path, (const unsigned char *)"", 0);
        break;
    case MAKE_DIR:
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkdir(path, 0755), 0);
        break;
    }
}

/* Writes the base set at prefix and checks that it opens. */
static void write_base_set(const char *prefix, int int32)
{
    const int32_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const uint64_t lens[4] = {3, 0, 5, 2};
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, int32 ? DATA_DTYPE_INT32 : DATA_DTYPE_UINT16, &err), 0);
    for (int i = 0, o = 0; i < 4; o += (int)lens[i], i++)
        assert_int_equal(data_idx_writer_add(&w, tokens + o, lens[i], &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    DataIdx d;
    assert_int_equal(data_idx_open(&d, prefix, &err), 0); /* valid before the damage */
    data_idx_close(&d);
}

static void run_case(void **state)
{
    const Case *c = *state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
    char *ip = test_format("%s.idx", prefix), *bp = test_format("%s.bin", prefix);
    write_base_set(prefix, c->int32);
    DataIdx d;
    Error err = {0};
    damage(c, c->file == 'i' ? ip : bp);
    memset(&d, 0x5a, sizeof d);
    int rc = data_idx_open(&d, prefix, &err);
    const char *at = c->at == 'i' ? ip : bp;
    if (rc != -1 || err.status != 2 || strncmp(err.msg, at, strlen(at)) || err.msg[strlen(at)] != ':' ||
        !strstr(err.msg, c->expect)) {
        print_error("case %s: expected status 2 and '%s: ...%s...'\ngot rc %d, status %d, '%s'\n", c->name, at,
                    c->expect, rc, err.status, err.msg);
        fail();
    }
    /* Closed on failure: nothing mapped, nothing to free. */
    assert_null(d.idx.data);
    assert_null(d.bin.data);
    assert_null(d.prefix);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(dir), free(prefix), free(ip), free(bp);
}

/* A misaligned pointer in a document of two sequences: the error names the document. The base set
 * with doc_index 0 1 3 3 4 (document 1 = sequences 1 and 2, document 2 empty) and sequence 2 at
 * byte 9. */
static void test_misaligned_pointer_names_its_document(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir), *ip = test_format("%s.idx", prefix);
    write_base_set(prefix, 0);
    const Case two_seq_doc = {"", 'i', PATCH, DOC + 16, 8, 3, 'i', "", 0};
    const Case odd_pointer = {"", 'i', PATCH, PTR + 16, 8, 9, 'i', "", 0};
    DataIdx d;
    Error err = {0};
    damage(&two_seq_doc, ip);
    assert_int_equal(data_idx_open(&d, prefix, &err), 0); /* a valid set of four documents */
    assert_int_equal(d.n_docs, 4);
    assert_int_equal(data_idx_doc_len(&d, 1), 5);
    data_idx_close(&d);
    damage(&odd_pointer, ip);
    assert_int_equal(data_idx_open(&d, prefix, &err), -1);
    assert_int_equal(err.status, 2);
    char *expect = test_format("%s: document 1 (sequence 2) starts at byte 9 of %s/set.bin, not a multiple of "
                               "its 2-byte uint16 tokens: the index is corrupt or belongs to another .bin", ip, dir);
    assert_string_equal(err.msg, expect);
    test_rm_rf(dir);
    free(dir), free(prefix), free(ip), free(expect);
}

/* D = 0 with a file of exactly the size it implies (34 + 12 S, here S = 0). */
static void test_empty_document_index(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
    unsigned char h[34] = "MMIDIDX\0\0\1";
    h[17] = DATA_DTYPE_UINT16;
    free(test_write_file(dir, "set.idx", (const char *)h, sizeof h));
    free(test_write_file(dir, "set.bin", "", 0));
    DataIdx d;
    Error err = {0};
    assert_int_equal(data_idx_open(&d, prefix, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "set.idx: the document index is empty (0 entries)"));
    test_rm_rf(dir);
    free(dir), free(prefix);
}

/* A prefix given with its .idx: the error says what to give instead. */
static void test_prefix_with_extension(void **state)
{
    (void)state;
    DataIdx d;
    Error err = {0};
    assert_int_equal(data_idx_open(&d, "/nonexistent/set.idx", &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "/nonexistent/set.idx.idx: cannot open"));
    assert_non_null(strstr(err.msg, "give the data set's PREFIX, without .idx or .bin"));
}

int main(void)
{
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[N_CASES + 3];
    for (size_t i = 0; i < N_CASES; i++)
        tests[i] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    tests[N_CASES] = (struct CMUnitTest)cmocka_unit_test(test_empty_document_index);
    tests[N_CASES + 1] = (struct CMUnitTest)cmocka_unit_test(test_prefix_with_extension);
    tests[N_CASES + 2] = (struct CMUnitTest)cmocka_unit_test(test_misaligned_pointer_names_its_document);
    return _cmocka_run_group_tests("data_idx_corrupt", tests, N_CASES + 3, NULL, NULL);
}
