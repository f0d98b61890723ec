/*
 * test/test_data_stream.c - length lists (three formats, gzip, errors, the real lists), the
 * shuffle permutation, and the document stream (epochs, window pieces, blending, exact restore).
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zlib.h>

#include "data/data_lengths.h"
#include "data/data_sources.h"
#include "data/data_shuffle.h"
#include "data/data_stream.h"

static void load_ok(DataLengths *l, const char *dir, const char *name, const char *text, const char *column)
{
    char *path = test_write_file(dir, name, text, strlen(text));
    Error err = {0};
    if (data_lengths_load(l, path, column, &err) != 0) {
        print_error("%s: %s\n", name, err.msg);
        fail();
    }
    free(path);
}

static void load_fails(const char *dir, const char *name, const char *text, const char *column, const char *msg)
{
    char *path = test_write_file(dir, name, text, strlen(text));
    DataLengths l;
    Error err = {0};
    assert_int_equal(data_lengths_load(&l, path, column, &err), -1);
    assert_int_equal(err.status, 2);
    char *expect = test_format("%s%s", path, msg);
    if (strcmp(err.msg, expect)) {
        print_error("expected: %s\ngot:      %s\n", expect, err.msg);
        fail();
    }
    free(expect);
    free(path);
}

static void test_length_formats(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    DataLengths l;
    load_ok(&l, dir, "a.json", " [3, 0, 5, -1, 7]\n", NULL);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.len[2], 7);
    assert_int_equal(l.skipped, 2);
    assert_int_equal(l.n_tokens, 15);
    /* What was skipped is said: how many, negative and zero, and the first. */
    char note[512];
    data_lengths_skipped_note(&l, "a.json", note, sizeof note);
    assert_string_equal(note, "a.json: 2 of 5 entries skipped, lengths <= 0 (1 negative, 1 zero; the first, 0, at entry 1 "
                              "of the JSON array)");
    data_lengths_free(&l);
    load_ok(&l, dir, "g.txt", "12\n-3\n40\n0\n7\n", NULL);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.skipped, 2);
    data_lengths_skipped_note(&l, "g.txt", note, sizeof note);
    assert_string_equal(note, "g.txt: 2 of 5 entries skipped, lengths <= 0 (1 negative, 1 zero; the first, -3, at line 2)");
    data_lengths_free(&l);
    load_ok(&l, dir, "b.txt", "10\r\n20\n\n30\n", NULL);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.n_tokens, 60);
    data_lengths_free(&l);
    load_ok(&l, dir, "c.csv", "path,bytes,tokens\na.c,100,40\n\"b,c.h\",200,-1\n\"say \"\"hi\"\"\",5,9\n", NULL);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.len[0], 40);
    assert_int_equal(l.len[1], 9);
    assert_int_equal(l.skipped, 1);
    data_lengths_free(&l);
    load_ok(&l, dir, "d.csv", "path,bytes,tokens\na.c,100,40\n", "bytes");
    assert_int_equal(l.len[0], 100);
    data_lengths_free(&l);
    /* An unquoted comma in a path, as in the real Linux list: the columns are counted from the end. */
    load_ok(&l, dir, "f.csv", "path,bytes,tokens\ndt-bindings/mediatek,mt8188.h,68720,27502\n", "bytes");
    assert_int_equal(l.len[0], 68720);
    data_lengths_free(&l);

    /* gzip, told apart by content, not by name. */
    char *gz_path = test_format("%s/e.txt.gz", dir);
    gzFile gz = gzopen(gz_path, "wb");
    assert_non_null(gz);
    assert_true(gzputs(gz, "[1, 2, 3]") > 0);
    assert_int_equal(gzclose(gz), Z_OK);
    Error err = {0};
    assert_int_equal(data_lengths_load(&l, gz_path, NULL, &err), 0);
    assert_int_equal(l.n_tokens, 6);
    data_lengths_free(&l);
    free(gz_path);

    load_fails(dir, "e1.json", "[1, 2.5]", NULL, ": entry 1 of the JSON array is not an integer");
    load_fails(dir, "e2.json", "[1, 2", NULL, ": line 1, column 5: not a valid JSON array: ']' expected near end of file");
    load_fails(dir, "e3.txt", "10\nten\n", NULL, ":2: expected an integer length, got 'ten'");
    load_fails(dir, "e4.csv", "a,b\n1,2\n3\n", NULL, ":3: expected 2 CSV fields as in the header, got 1");
    load_fails(dir, "e5.csv", "a,b\n1,x\n", NULL, ":2: column 2: expected an integer length, got 'x'");
    load_fails(dir, "e6.csv", "a,b\n1,2\n", "c", ":1: no column 'c' in the CSV header");
    load_fails(dir, "e7.txt", "0\n-3\n", NULL, ": no document lengths (2 entries <= 0 skipped)");
    load_fails(dir, "e8.txt", "99999999999\n", NULL, ":1: document length 99999999999 is too large (at most 4294967295)");
    load_fails(dir, "e9.json", "{\"a\": 1}", NULL, ": expected a JSON array of document lengths");
    assert_int_equal(data_lengths_load(&l, "/nonexistent/l.txt", NULL, &err), -1);
    assert_string_equal(err.msg, "/nonexistent/l.txt: cannot open: No such file or directory");
    test_rm_rf(dir);
    free(dir);
}

/* The real lists, with the figures ../shared/real-data/README.md gives for them. */
static void test_real_length_lists(void **state)
{
    (void)state;
    SKIP_WITHOUT_REAL_DATA(dir, "lengths");
    char *path = test_format("%s/distca_wlbllm_lengths.json", dir);
    DataLengths l;
    Error err = {0};
    assert_int_equal(data_lengths_load(&l, path, NULL, &err), 0);
    assert_int_equal(l.n, 99519);
    uint32_t mx = 0;
    for (uint64_t i = 0; i < l.n; i++)
        mx = l.len[i] > mx ? l.len[i] : mx;
    assert_int_equal(mx, 124913);
    assert_int_equal(l.len[0], 2792); /* the first entries of the file */
    assert_int_equal(l.len[1], 4238);
    data_lengths_free(&l);
    free(path);

    path = test_format("%s/flexsp_wikipedia_lengths.txt", dir);
    assert_int_equal(data_lengths_load(&l, path, NULL, &err), 0);
    assert_int_equal(l.n + l.skipped, 1000000);
    data_lengths_free(&l);
    free(path);

    /* 78,579 files: 3 binary (-1) and 30 empty (0) are skipped; 396,300,859 tokens (checked with awk). */
    path = test_format("%s/linux61_files_llama3_tokens.csv.gz", dir);
    assert_int_equal(data_lengths_load(&l, path, "llama3_tokens", &err), 0);
    assert_int_equal(l.n, 78546);
    assert_int_equal(l.skipped, 33);
    assert_int_equal(l.skipped_negative, 3);
    assert_int_equal(l.first_skipped, -1);
    assert_int_equal(l.first_skipped_at, 591); /* tools/perf/tests/pe-file.exe.debug (zcat | grep -n) */
    assert_int_equal(l.len[0], 260062);
    assert_int_equal(l.n_tokens, 396300859ull);
    data_lengths_free(&l);
    free(path);
}

static void test_shuffle_is_a_permutation(void **state)
{
    (void)state;
    const uint64_t sizes[] = {1, 2, 3, 7, 64, 65, 1000, 4097, 100003};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        uint64_t n = sizes[t];
        unsigned char *seen = calloc(n, 1);
        DataShuffle s;
        data_shuffle_init(&s, n, 1234 + t);
        uint64_t fixed = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t x = data_shuffle_at(&s, i);
            assert_true(x < n);
            assert_false(seen[x]);
            seen[x] = 1;
            fixed += x == i;
        }
        /* A random permutation has one fixed point on average; identity-like output would not. */
        if (n >= 64)
            assert_true(fixed < 8);
        free(seen);
    }
    /* Different seeds give different orders. */
    DataShuffle a, b;
    data_shuffle_init(&a, 1000, 1);
    data_shuffle_init(&b, 1000, 2);
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++)
        same += data_shuffle_at(&a, i) == data_shuffle_at(&b, i);
    assert_true(same < 10);
}

static void test_shuffle_is_uniform(void **state)
{
    (void)state;
    /* Where element 0 lands over 20,000 seeds for n = 10: each position should get about 2,000. */
    int count[10] = {0};
    for (uint64_t seed = 0; seed < 20000; seed++) {
        DataShuffle s;
        data_shuffle_init(&s, 10, seed);
        for (uint64_t i = 0; i < 10; i++)
            if (data_shuffle_at(&s, i) == 0)
                count[i]++;
    }
    double chi2 = 0;
    for (int i = 0; i < 10; i++)
        chi2 += (count[i] - 2000.0) * (count[i] - 2000.0) / 2000.0;
    /* 9 degrees of freedom: 27.9 is the 0.1% critical value. The seeds are fixed, so this is exact. */
    assert_true(chi2 < 27.9);
}

static const uint32_t doc_lens[] = {5, 0, 12, 3, 30, 1, 9, 0, 17, 8};

static DataSource small_source(void)
{
    uint64_t total = 0;
    for (size_t i = 0; i < 10; i++)
        total += doc_lens[i];
    return data_source_from_lengths(doc_lens, 10, total);
}

static void test_stream_epochs_and_pieces(void **state)
{
    (void)state;
    DataSource src = small_source();
    DataStream s;
    Error err = {0};
    assert_int_equal(data_stream_init(&s, &src, NULL, 1, 7, 8, &err), 0);
    /* One epoch: every non-empty document once, cut into pieces of at most 8, offsets consecutive. */
    uint64_t covered[10] = {0}, tokens = 0;
    int order1[10], n_docs = 0;
    while (tokens < src.n_tokens) {
        DataPiece p;
        data_stream_next(&s, &p);
        assert_true(p.len >= 1 && p.len <= 8);
        assert_int_equal(p.doc_len, doc_lens[p.doc]);
        assert_int_equal(p.offset, covered[p.doc]);
        if (p.offset == 0)
            order1[n_docs++] = (int)p.doc;
        covered[p.doc] += p.len;
        tokens += p.len;
    }
    assert_int_equal(n_docs, 8);
    for (int d = 0; d < 10; d++)
        assert_int_equal(covered[d], doc_lens[d]);
    /* The second epoch visits the documents in another order. */
    int order2[10], n2 = 0;
    for (uint64_t t = 0; t < src.n_tokens;) {
        DataPiece p;
        data_stream_next(&s, &p);
        if (p.offset == 0)
            order2[n2++] = (int)p.doc;
        t += p.len;
    }
    assert_int_equal(n2, 8);
    assert_memory_not_equal(order1, order2, sizeof(int) * 8);
    /* The epoch count moves when an epoch's order is used up: one epoch done, maybe a second. */
    assert_true(s.sources[0].epoch >= 1 && s.sources[0].epoch <= 2);
    data_stream_free(&s);
}

/* cut_at_windows: pieces end at every multiple of the window of the stream's tokens, as well as at
 * the ends of documents: piece by piece the same tokens as the uncut stream, in the same order, and a
 * stream restored mid-window goes on cutting at the same places. */
static void test_stream_cut_at_windows(void **state)
{
    (void)state;
    DataSource src = small_source();
    DataStream keep, cut;
    Error err = {0};
    assert_int_equal(data_stream_init(&keep, &src, NULL, 1, 7, 8, &err), 0);
    assert_int_equal(data_stream_init(&cut, &src, NULL, 1, 7, 8, &err), 0);
    cut.cut_at_windows = 1;
    /* The model: the uncut stream's documents in its order, each cut at multiples of 8 of the
     * position (pieces of the same document are consecutive in both). */
    DataPiece k = {0}, c;
    uint64_t left = 0, pos = 0;
    int straddled = 0;
    for (int i = 0; i < 200; i++) {
        data_stream_next(&cut, &c);
        if (left == 0) {
            do
                data_stream_next(&keep, &k);
            while (k.offset != 0);
            left = k.doc_len;
        }
        uint64_t room = 8 - pos % 8;
        assert_int_equal(c.doc, k.doc);
        assert_int_equal(c.offset, k.doc_len - left);
        assert_int_equal(c.len, left < room ? left : room);
        straddled += c.len < left && left <= 8;
        left -= c.len;
        pos += c.len;
        assert_int_equal(cut.tokens, pos);
    }
    assert_true(straddled > 0);
    for (int stop = 1; stop < 30; stop += 7) {
        DataStream a, b;
        assert_int_equal(data_stream_init(&a, &src, NULL, 1, 3, 8, &err), 0);
        assert_int_equal(data_stream_init(&b, &src, NULL, 1, 3, 8, &err), 0);
        a.cut_at_windows = b.cut_at_windows = 1;
        DataPiece p, q;
        for (int i = 0; i < stop; i++)
            data_stream_next(&a, &p);
        uint64_t words[64];
        data_stream_save(&a, words);
        assert_int_equal(data_stream_restore(&b, words, data_stream_state_words(&a), &err), 0);
        for (int i = 0; i < 40; i++) {
            data_stream_next(&a, &p);
            data_stream_next(&b, &q);
            assert_memory_equal(&p, &q, sizeof p);
        }
        data_stream_free(&a);
        data_stream_free(&b);
    }
    data_stream_free(&keep);
    data_stream_free(&cut);
}

static void test_stream_restore_is_exact(void **state)
{
    (void)state;
    DataSource src[2] = {small_source(), small_source()};
    double w[2] = {2, 1};
    for (int k = 0; k < 40; k += 3) { /* stop at many points, mid-document ones included */
        DataStream a, b;
        Error err = {0};
        assert_int_equal(data_stream_init(&a, src, w, 2, 99, 4, &err), 0);
        assert_int_equal(data_stream_init(&b, src, w, 2, 99, 4, &err), 0);
        DataPiece p, q;
        for (int i = 0; i < k; i++)
            data_stream_next(&a, &p);
        uint64_t words[64];
        assert_true(data_stream_state_words(&a) <= 64);
        data_stream_save(&a, words);
        assert_int_equal(data_stream_restore(&b, words, data_stream_state_words(&a), &err), 0);
        for (int i = 0; i < 50; i++) {
            data_stream_next(&a, &p);
            data_stream_next(&b, &q);
            assert_memory_equal(&p, &q, sizeof p);
        }
        data_stream_free(&a);
        data_stream_free(&b);
    }
    /* A position from other sources is refused. */
    DataStream one, two;
    Error err = {0};
    assert_int_equal(data_stream_init(&one, src, NULL, 1, 1, 4, &err), 0);
    assert_int_equal(data_stream_init(&two, src, NULL, 2, 1, 4, &err), 0);
    uint64_t words[64];
    data_stream_save(&one, words);
    assert_int_equal(data_stream_restore(&two, words, data_stream_state_words(&one), &err), -1);
    assert_int_equal(err.status, 2);
    data_stream_free(&one);
    data_stream_free(&two);
}

static void test_stream_blends_by_tokens(void **state)
{
    (void)state;
    /* Source 0 has long documents, source 1 short ones; weights 3:1 are shares of tokens. */
    static uint32_t longs[50], shorts[500];
    for (int i = 0; i < 50; i++)
        longs[i] = 200 + (uint32_t)i;
    for (int i = 0; i < 500; i++)
        shorts[i] = 5 + (uint32_t)(i % 7);
    DataSource src[2] = {data_source_from_lengths(longs, 50, 0), data_source_from_lengths(shorts, 500, 0)};
    for (int i = 0; i < 50; i++)
        src[0].n_tokens += longs[i];
    for (int i = 0; i < 500; i++)
        src[1].n_tokens += shorts[i];
    double w[2] = {3, 1};
    DataStream s;
    Error err = {0};
    assert_int_equal(data_stream_init(&s, src, w, 2, 5, 64, &err), 0);
    uint64_t by_source[2] = {0, 0};
    for (int i = 0; i < 20000; i++) {
        DataPiece p;
        data_stream_next(&s, &p);
        by_source[p.source] += p.len;
    }
    double share = (double)by_source[0] / (double)(by_source[0] + by_source[1]);
    assert_true(share > 0.74 && share < 0.76);
    data_stream_free(&s);

    uint32_t empty[3] = {0, 0, 0};
    DataSource none = data_source_from_lengths(empty, 3, 0);
    assert_int_equal(data_stream_init(&s, &none, NULL, 1, 5, 64, &err), -1);
    assert_string_equal(err.msg, "data: data source 1 has no tokens");
}

/* The first number of a /proc file, or -1. */
static long long proc_number(const char *path)
{
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* Many data sets: each is two memory mappings and no open descriptor. 100,000 sets (or, where
 * vm.max_map_count allows that many, more than it allows) are refused up front with the limit and
 * what to do, where the mmap past the limit used to end the run with "Cannot allocate memory"
 * (status 1); 3,000 sets open under a descriptor limit of 64. */
static void test_many_sources(void **state)
{
    (void)state;
    long long limit = proc_number("/proc/sys/vm/max_map_count");
    if (limit < 0 || limit > 10000000) {
        printf("# vm.max_map_count %lld: no /proc, or more than this test may map\n", limit);
        skip();
        return;
    }
    char *dir = test_tmpdir(), *prefix = test_write_docs(dir, "set", 7, 3, 0, 100);
    int n = limit / 2 + 1 > 100000 ? (int)(limit / 2 + 1) : 100000;
    char **paths = malloc((size_t)n * sizeof *paths);
    assert_non_null(paths);
    for (int i = 0; i < n; i++)
        paths[i] = prefix;
    DataSources s;
    Error err = {0};
    assert_int_equal(data_sources_open(&s, paths, NULL, n, NULL, NULL, &err), -1);
    assert_int_equal(err.status, 2);
    char *head = test_format("data: %d data sets need %lld memory mappings (an .idx and a .bin each), more than this "
                             "process may add: Linux allows %lld (vm.max_map_count), ", n, 2LL * n, limit);
    if (strncmp(err.msg, head, strlen(head)) != 0 || !strstr(err.msg, "merge the sets into fewer") ||
        !strstr(err.msg, "sysctl -w vm.max_map_count="))
        print_error("expected '%s...', got '%s'\n", head, err.msg), fail();
    free(head);
    assert_int_equal(data_sources_check_count(n, &err), -1);
    assert_int_equal(data_sources_check_count(3000, &err), 0);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 64;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = data_sources_open(&s, paths, NULL, 3000, NULL, NULL, &err);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(s.n, 3000);
    assert_int_equal(s.src[2999].n_docs, 3);
    data_sources_close(&s);
    free(paths);
    test_rm_rf(dir);
    free(dir), free(prefix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_length_formats),
        cmocka_unit_test(test_real_length_lists),
        cmocka_unit_test(test_shuffle_is_a_permutation),
        cmocka_unit_test(test_shuffle_is_uniform),
        cmocka_unit_test(test_stream_epochs_and_pieces),
        cmocka_unit_test(test_stream_cut_at_windows),
        cmocka_unit_test(test_stream_restore_is_exact),
        cmocka_unit_test(test_stream_blends_by_tokens),
        cmocka_unit_test(test_many_sources),
    };
    return cmocka_run_group_tests_name("data_stream", tests, NULL, NULL);
}
