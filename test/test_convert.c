/*
 * test/test_convert.c - `wlbtrain convert`, run as a user runs it (the binary in $WLBTRAIN), its
 * output read back with the data set reader (data/data_idx.h).
 *
 * Inputs: text files, JSON lines (blank lines, \u0000, another key, empty texts), .gz of both,
 * --files-from (a file, CRLF, blank lines; '-' = standard input), --format overriding the name.
 * Options: --eod none / ID, --dtype auto / uint16 / int32, the Llama 3 and GPT-2 rank files.
 * Errors: every one is exit status 2 and one line "wlbtrain: error: WHERE: ...", and a failed
 * convert leaves nothing behind: no PREFIX.idx / PREFIX.bin / temporary file, and an existing data
 * set under the same prefix byte for byte as it was.
 */
#include "test/testlib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/data_idx.h"
#include "data/data_tokenizer.h"

#define WRITE(dir, name, text) test_write_file(dir, name, text, strlen(text))

#define RUN(r, ...)                                       \
    do {                                                  \
        const char *args_[] = {__VA_ARGS__, NULL};        \
        test_run_wlbtrain(r, args_);                      \
    } while (0)

/* Runs convert and expects success: status 0, the summary line on stdout, nothing on stderr
 * (every call here passes --quiet). */
#define CONVERT_OK(...)                                                       \
    do {                                                                      \
        CmdResult r_;                                                         \
        RUN(&r_, "convert", "--quiet", __VA_ARGS__);                          \
        if (r_.status != 0 || r_.err[0] || strncmp(r_.out, "convert: ", 9)) { \
            print_error("convert: exit %d\nstdout: %s\nstderr: %s\n",       \
                        r_.status, r_.out, r_.err);                           \
            fail();                                                           \
        }                                                                     \
        test_cmd_free(&r_);                                                   \
    } while (0)

static void open_set(DataIdx *d, const char *prefix)
{
    Error err = {0};
    if (data_idx_open(d, prefix, &err) != 0) {
        print_error("data_idx_open(%s): %s\n", prefix, err.msg);
        fail();
    }
}

/* Asserts document doc of d is exactly the n tokens want. */
static void assert_doc(const DataIdx *d, uint64_t doc, const int32_t *want, size_t n)
{
    Error err = {0};
    uint64_t len = data_idx_doc_len(d, doc);
    if (len != n) {
        print_error("document %llu: %llu tokens, want %zu\n", (unsigned long long)doc, (unsigned long long)len, n);
        fail();
    }
    int32_t *got = malloc((n + 1) * sizeof *got);
    assert_non_null(got);
    assert_int_equal(data_idx_read_tokens(d, doc, 0, n, got, &err), 0);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            print_error("document %llu, token %zu: %d, want %d\n", (unsigned long long)doc, i, got[i], want[i]);
            fail();
        }
    free(got);
}

/* Byte-level document: the bytes of s, then eod (unless eod < 0). */
static void assert_bytes_doc(const DataIdx *d, uint64_t doc, const char *s, size_t n, int32_t eod)
{
    int32_t *want = malloc((n + 1) * sizeof *want);
    assert_non_null(want);
    for (size_t i = 0; i < n; i++)
        want[i] = (unsigned char)s[i];
    if (eod >= 0)
        want[n] = eod;
    assert_doc(d, doc, want, n + (eod >= 0));
    free(want);
}

static char *write_gz(const char *dir, const char *name, const char *content)
{
    char *path = test_format("%s/%s", dir, name);
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, content, (unsigned)strlen(content)), (int)strlen(content));
    assert_int_equal(gzclose(gz), Z_OK);
    return path;
}

/* Number of entries of dir (not . and ..) whose name starts with prefix. */
static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !strncmp(e->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

static void test_text_inputs(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *a = test_write_file(dir, "a.txt", "hello", 5);
    char *b = test_write_file(dir, "b.txt", "w\xc3\xb6rld\n\0x", 9);
    char *out = test_format("%s/out", dir);
    CmdResult r;
    RUN(&r, "convert", "--out", out, a, b);
    assert_int_equal(r.status, 0);
    /* One summary line: documents, tokens, dtype and where it went. */
    char *want = test_format("convert: 2 documents, 16 tokens, dtype uint16, vocabulary 257 (bytes), bos none, eod 256 -> "
                             "%s.idx + %s.bin", out, out);
    assert_true(!strncmp(r.out, want, strlen(want)));
    assert_ptr_equal(strchr(r.out, '\n'), r.out + strlen(r.out) - 1);
    test_cmd_free(&r);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.n_docs, 2);
    assert_int_equal(d.dtype, DATA_DTYPE_UINT16);
    assert_bytes_doc(&d, 0, "hello", 5, 256);
    assert_bytes_doc(&d, 1, "w\xc3\xb6rld\n\0x", 9, 256); /* NUL and all: a text file is bytes */
    data_idx_close(&d);
    test_rm_rf(dir);
    free(want), free(a), free(b), free(out), free(dir);
}

static void test_jsonl(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    const char jl[] = "{\"text\": \"ab\", \"id\": 1}\n"
                      "\n"
                      "{\"id\": 2, \"text\": \"c\\u0000d\\n\"}\n"
                      "   \t\n"
                      "{\"text\": \"\\u00e9\\ud83d\\ude00\", \"content\": \"other\"}\r\n"
                      "{\"text\": \"\"}\n"
                      "{\"text\": \"last\"}"; /* no final newline */
    char *in = test_write_file(dir, "docs.jsonl", jl, strlen(jl));
    char *out = test_format("%s/j", dir);
    CmdResult r;
    RUN(&r, "convert", "--quiet", "--out", out, in);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "convert: 4 documents,"));
    assert_non_null(strstr(r.out, "; 1 empty documents skipped"));
    test_cmd_free(&r);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.n_docs, 4);
    assert_bytes_doc(&d, 0, "ab", 2, 256);
    assert_bytes_doc(&d, 1, "c\0d\n", 4, 256);
    assert_bytes_doc(&d, 2, "\xc3\xa9\xf0\x9f\x98\x80", 6, 256);
    assert_bytes_doc(&d, 3, "last", 4, 256);
    data_idx_close(&d);

    /* --json-key picks another field; lines without it are then an error (below), so a file of its own. */
    const char jl2[] = "{\"content\": \"xy\", \"text\": \"no\"}\n{\"content\": \"z\"}\n";
    char *in2 = test_write_file(dir, "c.jsonl", jl2, strlen(jl2));
    CONVERT_OK("--out", out, "--json-key", "content", in2);
    open_set(&d, out);
    assert_int_equal(d.n_docs, 2);
    assert_bytes_doc(&d, 0, "xy", 2, 256);
    assert_bytes_doc(&d, 1, "z", 1, 256);
    data_idx_close(&d);

    /* --format overrides the file name both ways. */
    char *txt = WRITE(dir, "lines.txt", "{\"text\": \"q\"}\n");
    CONVERT_OK("--out", out, "--format", "jsonl", txt);
    open_set(&d, out);
    assert_int_equal(d.n_docs, 1);
    assert_bytes_doc(&d, 0, "q", 1, 256);
    data_idx_close(&d);
    CONVERT_OK("--out", out, "--format", "text", in2);
    open_set(&d, out);
    assert_int_equal(d.n_docs, 1);
    assert_bytes_doc(&d, 0, jl2, strlen(jl2), 256);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(in), free(in2), free(txt), free(out), free(dir);
}

static void test_gzip_inputs(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *t = write_gz(dir, "doc.txt.gz", "gzipped text\n");
    char *j = write_gz(dir, "docs.jsonl.gz", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
    char *out = test_format("%s/gz", dir);
    CONVERT_OK("--out", out, t, j);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.n_docs, 3);
    assert_bytes_doc(&d, 0, "gzipped text\n", 13, 256);
    assert_bytes_doc(&d, 1, "one", 3, 256);
    assert_bytes_doc(&d, 2, "two", 3, 256);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(t), free(j), free(out), free(dir);
}

static void test_files_from(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *a = test_write_file(dir, "a", "A", 1);
    char *b = test_write_file(dir, "b", "BB", 2);
    char *c = test_write_file(dir, "c", "CCC", 3);
    char *list_text = test_format("%s\r\n\n%s\n", b, c); /* CRLF, a blank line */
    char *list = test_write_file(dir, "list", list_text, strlen(list_text));
    char *out = test_format("%s/ff", dir);
    /* Positional inputs first, then the list, in order. */
    CONVERT_OK("--out", out, "--files-from", list, a);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.n_docs, 3);
    assert_bytes_doc(&d, 0, "A", 1, 256);
    assert_bytes_doc(&d, 1, "BB", 2, 256);
    assert_bytes_doc(&d, 2, "CCC", 3, 256);
    data_idx_close(&d);

    /* '-' reads the list from standard input. */
    const char *bin = getenv("WLBTRAIN");
    char *cmd = test_format("'%s' convert --quiet --out '%s' --files-from - < '%s'", bin && *bin ? bin : "./wlbtrain",
                            out, list);
    const char *argv[] = {"sh", "-c", cmd, NULL};
    CmdResult r;
    test_run(&r, argv);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    test_cmd_free(&r);
    open_set(&d, out);
    assert_int_equal(d.n_docs, 2);
    assert_bytes_doc(&d, 0, "BB", 2, 256);
    assert_bytes_doc(&d, 1, "CCC", 3, 256);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(a), free(b), free(c), free(list_text), free(list), free(out), free(cmd), free(dir);
}

static void test_eod_and_dtype(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *in = test_write_file(dir, "in.txt", "xyz", 3);
    char *out = test_format("%s/e", dir);
    DataIdx d;
    CONVERT_OK("--out", out, "--eod", "none", in);
    open_set(&d, out);
    assert_int_equal(d.dtype, DATA_DTYPE_UINT16);
    assert_bytes_doc(&d, 0, "xyz", 3, -1);
    data_idx_close(&d);

    CONVERT_OK("--out", out, "--eod", "7", "--dtype", "int32", in);
    open_set(&d, out);
    assert_int_equal(d.dtype, DATA_DTYPE_INT32);
    assert_bytes_doc(&d, 0, "xyz", 3, 7);
    data_idx_close(&d);

    /* An EOD id above 65535 makes auto choose int32. */
    CONVERT_OK("--out", out, "--eod", "70000", in);
    open_set(&d, out);
    assert_int_equal(d.dtype, DATA_DTYPE_INT32);
    assert_bytes_doc(&d, 0, "xyz", 3, 70000);
    data_idx_close(&d);

    CmdResult r;
    RUN(&r, "convert", "--quiet", "--out", out, "--eod", "70000", "--dtype", "uint16", in);
    test_assert_error(&r, "--eod: id 70000 does not fit --dtype uint16");
    test_cmd_free(&r);
    RUN(&r, "convert", "--quiet", "--out", out, "--eod", "-3", in);
    test_assert_error(&r, "--eod: expected a token id or 'none'");
    test_cmd_free(&r);
    test_rm_rf(dir);
    free(in), free(out), free(dir);
}

/* The path of a file of the real data into buf ("" when absent: test_real_data's buffer is reused). */
static void real_copy(char *buf, size_t size, const char *rel)
{
    const char *p = test_real_data(rel);
    snprintf(buf, size, "%s", p ? p : "");
}

/* Real rank files: ids equal the library's encode (itself checked against tiktoken in
 * test_tokenizer.c / .py), Llama 3's with its BOS first and GPT-2's without, the same as the
 * tokenizer.json files give (checked against the tokenizers library in test_tokenizer_json.py),
 * the dtype follows the vocabulary, and a forced uint16 fails cleanly when an id does not fit. */
static void test_real_tokenizers(void **state)
{
    (void)state;
    /* Every lookup before anything is allocated (a skip, or a fail under CI, leaves by longjmp). */
    char l3[4096], g2[4096], l3json[4096], g2json[4096];
    real_copy(l3, sizeof l3, "tokenizers/llama3_tokenizer.model");
    real_copy(g2, sizeof g2, "tokenizers/gpt2_r50k_base.tiktoken");
    real_copy(l3json, sizeof l3json, "tokenizers/llama3_tokenizer.json");
    real_copy(g2json, sizeof g2json, "tokenizers/gpt2_tokenizer.json");
    if (!*l3 || !*g2) {
        skip();
        return;
    }
    char *dir = test_tmpdir();
    const char text[] = "Hello, world! They'll've 12345 na\xc3\xafve \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80\r\n";
    char *in = test_write_file(dir, "in.txt", text, strlen(text));
    char *out = test_format("%s/r", dir);
    const char *paths[] = {l3, g2, *l3json ? l3json : NULL, *g2json ? g2json : NULL};
    const int want_dtype[] = {DATA_DTYPE_INT32, DATA_DTYPE_UINT16, DATA_DTYPE_INT32, DATA_DTYPE_UINT16};
    for (int k = 0; k < 4; k++) {
        if (!paths[k])
            continue;
        CONVERT_OK("--out", out, "--tokenizer", paths[k], in);
        Error err = {0};
        DataTokenizer *t = data_tokenizer_open(paths[k % 2], NULL, &err); /* the ranks file's ids */
        assert_non_null(t);
        DataTokens ids = {0};
        int llama = k % 2 == 0;
        ids.ids = malloc(sizeof *ids.ids);
        assert_non_null(ids.ids);
        ids.cap = 1;
        if (llama)
            ids.ids[ids.n++] = 128000;
        assert_int_equal(data_tokenizer_encode(t, text, strlen(text), &ids, &err), 0);
        ids.ids = realloc(ids.ids, (ids.n + 1) * sizeof *ids.ids);
        assert_non_null(ids.ids);
        ids.ids[ids.n++] = llama ? 128001 : 50256;
        DataIdx d;
        open_set(&d, out);
        assert_int_equal(d.dtype, want_dtype[k]);
        assert_doc(&d, 0, ids.ids, ids.n);
        data_idx_close(&d);
        data_tokens_free(&ids);
        data_tokenizer_close(t);
    }
    /* Llama 3 ids in uint16: the EOD 128001 cannot fit; without an EOD, " They" (95980) cannot. */
    CmdResult r;
    RUN(&r, "convert", "--quiet", "--out", out, "--tokenizer", l3, "--dtype", "uint16", in);
    test_assert_error(&r, "--eod: id 128001 does not fit --dtype uint16");
    test_cmd_free(&r);
    RUN(&r, "convert", "--quiet", "--out", out, "--tokenizer", l3, "--dtype", "uint16", "--eod", "none", in);
    test_assert_error(&r, "--bos: id 128000 does not fit --dtype uint16");
    test_cmd_free(&r);
    RUN(&r, "convert", "--quiet", "--out", out, "--tokenizer", l3, "--dtype", "uint16", "--eod", "none", "--bos",
        "none", in);
    char *want = test_format("%s: token id 95980 does not fit --dtype uint16", in);
    test_assert_error(&r, want);
    test_cmd_free(&r);
    free(want);
    /* ... while text whose ids all fit converts. */
    char *small = test_write_file(dir, "small.txt", "hello world", 11);
    CONVERT_OK("--out", out, "--tokenizer", l3, "--dtype", "uint16", "--eod", "none", "--bos", "none", small);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.dtype, DATA_DTYPE_UINT16);
    const int32_t hw[] = {15339, 1917};
    assert_doc(&d, 0, hw, 2);
    data_idx_close(&d);
    /* --pattern gpt2 with the Llama 3 ranks: "They'll've DON'T" splits the GPT-2 way. */
    char *c = test_write_file(dir, "c.txt", "They'll've DON'T", 16);
    CONVERT_OK("--out", out, "--tokenizer", l3, "--pattern", "gpt2", "--eod", "none", "--bos", "none", c);
    open_set(&d, out);
    const int32_t contr[] = {7009, 3358, 3077, 45373, 6, 51};
    assert_doc(&d, 0, contr, 6);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(in), free(out), free(small), free(c), free(dir);
}

/* Runs convert with args (after "convert --quiet --out DIR/fail") and expects one error line
 * containing want, and no fail.* file left in dir. */
static void expect_fail(const char *dir, const char *want, const char *const *args)
{
    char *out = test_format("%s/fail", dir);
    const char *argv[40] = {"convert", "--quiet", "--out", out};
    int n = 4;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    CmdResult r;
    test_run_wlbtrain(&r, argv);
    test_assert_error(&r, want);
    test_cmd_free(&r);
    if (count_entries(dir, "fail") != 0) {
        print_error("a failed convert (%s) left files fail* in %s\n", want, dir);
        fail();
    }
    free(out);
}
#define EXPECT_FAIL(dir, want, ...)                 \
    do {                                            \
        const char *a_[] = {__VA_ARGS__, NULL};     \
        expect_fail(dir, want, a_);                 \
    } while (0)

static void test_errors(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *good = WRITE(dir, "good.txt", "fine");
    char *empty = WRITE(dir, "empty.txt", "");
    char *empty_jl = WRITE(dir, "empty.jsonl", "\n \n");
    char *empty_texts = WRITE(dir, "empty-texts.jsonl", "{\"text\": \"\"}\n");
    char *bad_json = WRITE(dir, "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unclosed}\n");
    char *no_key = WRITE(dir, "nokey.jsonl", "{\"body\": \"x\"}\n");
    char *not_str = WRITE(dir, "num.jsonl", "{\"text\": 5}\n");
    char *not_obj = WRITE(dir, "arr.jsonl", "[\"text\"]\n");
    char *bad_utf8 = WRITE(dir, "utf8.jsonl", "{\"text\": \"\xff\"}\n");
    char *bad_ranks = WRITE(dir, "bad.tiktoken", "IQ== 0\nnot! 1\n");
    char *empty_list = WRITE(dir, "empty.list", "\n\n");
    char *missing = test_format("%s/missing.txt", dir);
    char *w;

    CmdResult r;
    RUN(&r, "convert", good);
    test_assert_error(&r, "convert: needs --out PREFIX");
    test_cmd_free(&r);
    EXPECT_FAIL(dir, "convert: needs input files", "--quiet");
    EXPECT_FAIL(dir, "--bogus: unknown flag for convert", "--bogus", good);
    EXPECT_FAIL(dir, "--pattern: expected one of llama3|gpt2, got 'gpt4'", "--pattern", "gpt4", good);
    EXPECT_FAIL(dir, "--pattern: only with --tokenizer", "--pattern", "gpt2", good);
    EXPECT_FAIL(dir, "--dtype: expected one of auto|uint16|int32", "--dtype", "int8", good);
    w = test_format("%s: cannot open", missing);
    EXPECT_FAIL(dir, w, good, missing);
    free(w);
    w = test_format("%s: not a regular file", dir);
    EXPECT_FAIL(dir, w, dir);
    free(w);
    w = test_format("%s: empty input: no text", empty);
    EXPECT_FAIL(dir, w, good, empty);
    free(w);
    w = test_format("%s: empty input: no JSON lines", empty_jl);
    EXPECT_FAIL(dir, w, empty_jl);
    free(w);
    w = test_format("%s:2:", bad_json); /* path:line:column, after one good document was written */
    EXPECT_FAIL(dir, w, good, bad_json);
    EXPECT_FAIL(dir, "bad JSON", good, bad_json);
    free(w);
    w = test_format("%s:1: no \"text\" field", no_key);
    EXPECT_FAIL(dir, w, no_key);
    free(w);
    w = test_format("%s:1: field \"text\" is not a string", not_str);
    EXPECT_FAIL(dir, w, not_str);
    free(w);
    w = test_format("%s:1: expected a JSON object", not_obj);
    EXPECT_FAIL(dir, w, not_obj);
    free(w);
    w = test_format("%s:1:", bad_utf8);
    EXPECT_FAIL(dir, w, bad_utf8);
    free(w);
    w = test_format("%s:2: bad base64", bad_ranks);
    EXPECT_FAIL(dir, w, "--tokenizer", bad_ranks, good);
    free(w);
    w = test_format("%s: cannot open", missing);
    EXPECT_FAIL(dir, w, "--files-from", missing);
    free(w);
    EXPECT_FAIL(dir, "--files-from: ", "--files-from", empty_list);
    EXPECT_FAIL(dir, "no documents: every input text is empty", empty_texts);
    test_rm_rf(dir);
    free(good), free(empty), free(empty_jl), free(empty_texts), free(bad_json), free(no_key), free(not_str), free(not_obj);
    free(bad_utf8), free(bad_ranks), free(empty_list), free(missing), free(dir);
}

/* A failed convert leaves an existing data set under the prefix exactly as it was; a successful
 * one replaces it. */
static void test_existing_set(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char *a = test_write_file(dir, "a.txt", "first", 5);
    char *b = test_write_file(dir, "b.txt", "second!", 7);
    char *bad = test_write_file(dir, "bad.jsonl", "{\n", 2);
    char *out = test_format("%s/set", dir);
    char *idx = test_format("%s.idx", out), *bin = test_format("%s.bin", out);
    CONVERT_OK("--out", out, a);
    size_t idx_len, bin_len, len;
    char *idx0 = test_read_file(idx, &idx_len), *bin0 = test_read_file(bin, &bin_len);
    assert_non_null(idx0);
    assert_non_null(bin0);
    CmdResult r;
    RUN(&r, "convert", "--quiet", "--out", out, b, bad);
    test_assert_error(&r, "bad JSON");
    test_cmd_free(&r);
    char *s = test_read_file(idx, &len);
    assert_true(s && len == idx_len && !memcmp(s, idx0, len));
    free(s);
    s = test_read_file(bin, &len);
    assert_true(s && len == bin_len && !memcmp(s, bin0, len));
    free(s);
    assert_int_equal(count_entries(dir, "set"), 2); /* no temporary files either */
    CONVERT_OK("--out", out, b);
    DataIdx d;
    open_set(&d, out);
    assert_int_equal(d.n_docs, 1);
    assert_bytes_doc(&d, 0, "second!", 7, 256);
    data_idx_close(&d);
    test_rm_rf(dir);
    free(a), free(b), free(bad), free(out), free(idx), free(bin), free(idx0), free(bin0), free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_inputs),
        cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_gzip_inputs),
        cmocka_unit_test(test_files_from),
        cmocka_unit_test(test_eod_and_dtype),
        cmocka_unit_test(test_real_tokenizers),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_existing_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
