/*
 * test/test_tokenizer.c - the tokenizer (data/data_tokenizer*.c).
 *
 * What is checked:
 *   - byte-level tokens: id = byte, EOD 256, vocabulary 257;
 *   - the exact merge rule on tiny hand-written rank files (whole-piece shortcut, lowest rank
 *     first, leftmost on ties), and long pieces (the heap path) against a naive reference
 *     implementation of tiktoken's byte_pair_merge written here;
 *   - Llama 3 and GPT-2 ids of a few strings, as tiktoken 0.14's encode_ordinary gives them with the
 *     rank files of ../shared/real-data (tiktoken.Encoding(pat_str=..., mergeable_ranks=
 *     load_tiktoken_bpe(file))); the full comparison over a large corpus is test_tokenizer.py;
 *   - the round trip: concatenating the bytes of the ids gives the input back exactly, for random
 *     text with invalid UTF-8 in it, and invalid bytes split the text the way the end of the
 *     input would;
 *   - every way a rank file can be malformed is an Error naming path:line (status 2).
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_tokenizer.h"
#include "util/rng.h"

#define LLAMA3 "tokenizers/llama3_tokenizer.model"
#define GPT2 "tokenizers/gpt2_r50k_base.tiktoken"

static DataTokenizer *open_ok(const char *path, const char *pattern)
{
    Error err = {0};
    DataTokenizer *t = data_tokenizer_open(path, pattern, &err);
    if (!t) {
        print_error("data_tokenizer_open(%s): %s\n", path ? path : "NULL", err.msg);
        fail();
    }
    return t;
}

/* Opens a real rank file, or returns NULL (the caller skips) when the real data is absent. */
static DataTokenizer *open_real(const char *rel, const char *pattern)
{
    const char *path = test_real_data(rel);
    return path ? open_ok(path, pattern) : NULL;
}

static void encode_ok(DataTokenizer *t, const void *s, size_t n, DataTokens *out)
{
    Error err = {0};
    out->n = 0;
    if (data_tokenizer_encode(t, s, n, out, &err) != 0) {
        print_error("encode: %s\n", err.msg);
        fail();
    }
}

static void assert_ids(const DataTokens *got, const int32_t *want, size_t n, const char *what)
{
    int same = got->n == n;
    for (size_t i = 0; same && i < n; i++)
        same = got->ids[i] == want[i];
    if (!same) {
        print_error("%s: got %zu ids:", what, got->n);
        for (size_t i = 0; i < got->n && i < 40; i++)
            print_error(" %d", got->ids[i]);
        print_error("\nwant %zu:", n);
        for (size_t i = 0; i < n; i++)
            print_error(" %d", want[i]);
        print_error("\n");
        fail();
    }
}

static void assert_encodes(DataTokenizer *t, const char *s, const int32_t *want, size_t n)
{
    DataTokens ids = {0};
    encode_ok(t, s, strlen(s), &ids);
    assert_ids(&ids, want, n, s);
    data_tokens_free(&ids);
}
#define ENCODES(t, s, ...)                                                    \
    do {                                                                      \
        const int32_t want_[] = {__VA_ARGS__};                                \
        assert_encodes(t, s, want_, sizeof want_ / sizeof want_[0]);          \
    } while (0)

/* decode(encode(s)) == s, and every id is an ordinary token. */
static void assert_round_trip(DataTokenizer *t, const unsigned char *s, size_t n)
{
    DataTokens ids = {0};
    Error err = {0};
    encode_ok(t, s, n, &ids);
    size_t len = 0;
    char *back = data_tokenizer_decode(t, ids.ids, ids.n, &len, &err);
    if (!back) {
        print_error("decode: %s\n", err.msg);
        fail();
    }
    if (len != n || memcmp(back, s, n) != 0) {
        print_error("round trip of %zu bytes gave %zu bytes back\n", n, len);
        fail();
    }
    for (size_t i = 0; i < ids.n; i++)
        assert_true(ids.ids[i] >= 0 && ids.ids[i] < data_tokenizer_n_ranks(t));
    free(back);
    data_tokens_free(&ids);
}

/* A rank file from (bytes, rank) lines, base64-encoded here. */
static void b64(const unsigned char *s, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = '\0';
}

/* Writes a rank file: the 256 single bytes (ranks 0..255, in byte order) and then `extra`, a
 * NULL-terminated list of tokens given as strings (ranks 256, 257, ...). */
static char *write_ranks(const char *dir, const char *name, const char *const *extra)
{
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    char enc[256];
    int rank = 0;
    for (int b = 0; b < 256; b++, rank++) {
        unsigned char c = (unsigned char)b;
        b64(&c, 1, enc);
        n += (size_t)snprintf(text + n, cap - n, "%s %d\n", enc, rank);
    }
    for (int i = 0; extra && extra[i]; i++, rank++) {
        b64((const unsigned char *)extra[i], strlen(extra[i]), enc);
        n += (size_t)snprintf(text + n, cap - n, "%s %d\n", enc, rank);
    }
    char *path = test_write_file(dir, name, text, n);
    free(text);
    return path;
}

/* tiktoken's byte_pair_merge, written the slow obvious way over byte strings: parts are byte ranges,
 * each round merges the adjacent pair whose concatenation has the lowest rank (leftmost on ties). */
static size_t reference_bpe(const DataTokenizer *t, const unsigned char *p, size_t n, int32_t *out)
{
    int64_t whole = data_tokenizer_rank(t, p, n);
    if (whole >= 0) {
        out[0] = (int32_t)whole;
        return 1;
    }
    size_t *start = malloc((n + 1) * sizeof *start), m = n;
    assert_non_null(start);
    for (size_t i = 0; i <= n; i++)
        start[i] = i;
    for (;;) {
        int64_t best = -1;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int64_t r = data_tokenizer_rank(t, p + start[i], start[i + 2] - start[i]);
            if (r >= 0 && (best < 0 || r < best)) {
                best = r;
                bi = i;
            }
        }
        if (best < 0)
            break;
        memmove(start + bi + 1, start + bi + 2, (m - bi - 1) * sizeof *start);
        m--;
    }
    for (size_t i = 0; i < m; i++) {
        int64_t r = data_tokenizer_rank(t, p + start[i], start[i + 1] - start[i]);
        assert_true(r >= 0);
        out[i] = (int32_t)r;
    }
    free(start);
    return m;
}

static void test_byte_level(void **state)
{
    (void)state;
    DataTokenizer *t = open_ok(NULL, NULL);
    assert_int_equal(data_tokenizer_eod(t), 256);
    assert_int_equal(data_tokenizer_vocab_size(t), 257);
    assert_int_equal(data_tokenizer_n_ranks(t), 256);
    assert_string_equal(data_tokenizer_pattern(t), "bytes");
    unsigned char all[512];
    for (int i = 0; i < 512; i++)
        all[i] = (unsigned char)(255 - i % 256);
    DataTokens ids = {0};
    encode_ok(t, all, sizeof all, &ids);
    assert_int_equal(ids.n, 512);
    for (int i = 0; i < 512; i++)
        assert_int_equal(ids.ids[i], 255 - i % 256);
    assert_round_trip(t, all, sizeof all);
    size_t len = 1;
    assert_null(data_tokenizer_token_bytes(t, 256, &len));
    assert_int_equal(len, 0);
    assert_int_equal(data_tokenizer_rank(t, "A", 1), 65);
    assert_int_equal(data_tokenizer_rank(t, "AB", 2), -1);
    /* Decoding the EOD (it has no bytes) is an error, not garbage. */
    Error err = {0};
    int32_t eod = 256;
    assert_null(data_tokenizer_decode(t, &eod, 1, &len, &err));
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "id 256"));
    data_tokens_free(&ids);
    data_tokenizer_close(t);
}

/* The merge rule on hand-made ranks, where every expected id follows from the rule by hand. */
static void test_merge_rule(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    /* 256 ab, 257 abc, 258 aa, 259 bc, 260 aaaa, 261 xyz (never reachable by merges: no xy, yz) */
    const char *extra[] = {"ab", "abc", "aa", "bc", "aaaa", "xyz", NULL};
    char *path = write_ranks(dir, "tiny.tiktoken", extra);
    DataTokenizer *t = open_ok(path, NULL);
    assert_int_equal(data_tokenizer_n_ranks(t), 262);
    assert_int_equal(data_tokenizer_eod(t), 262);
    assert_int_equal(data_tokenizer_vocab_size(t), 263);
    assert_string_equal(data_tokenizer_pattern(t), "llama3");
    ENCODES(t, "abc", 257);                /* the whole piece is a token */
    ENCODES(t, "abcd", 257, 'd');          /* ab (256) before bc (259), then ab+c = abc */
    ENCODES(t, "aaa", 258, 'a');           /* aa at 0 and at 1 tie: the leftmost wins */
    ENCODES(t, "aaaaa", 260, 'a');         /* aa, aa, then aa+aa = aaaa */
    ENCODES(t, "xyz", 261);                /* whole piece, though no merge could reach it */
    ENCODES(t, "xyzw", 'x', 'y', 'z', 'w');
    ENCODES(t, "bca", 259, 'a');
    ENCODES(t, "ab ab", 256, ' ', 256);     /* pieces "ab", " ab": " ab" has no pair ' '+'a' */
    /* The same rule on long pieces (heap path), against the reference. */
    Rng rng;
    rng_seed(&rng, 7);
    for (int round = 0; round < 40; round++) {
        size_t n = 2 + rng_below(&rng, round < 20 ? 64 : 600);
        unsigned char s[700];
        for (size_t i = 0; i < n; i++)
            s[i] = (unsigned char)"abcxyz"[rng_below(&rng, round % 2 ? 2 : 6)];
        int32_t want[700];
        size_t nw = 0;
        /* The pattern splits letters only at non-letters: each maximal letter run is one piece. */
        nw = reference_bpe(t, s, n, want);
        DataTokens ids = {0};
        encode_ok(t, s, n, &ids);
        assert_ids(&ids, want, nw, "random letters (tiny ranks)");
        data_tokens_free(&ids);
    }
    data_tokenizer_close(t);
    test_rm_rf(dir);
    free(path);
    free(dir);
}

static void test_llama3_known(void **state)
{
    (void)state;
    DataTokenizer *t = open_real(LLAMA3, NULL);
    if (!t) {
        skip();
        return;
    }
    assert_int_equal(data_tokenizer_n_ranks(t), 128000);
    assert_int_equal(data_tokenizer_eod(t), 128001);
    assert_int_equal(data_tokenizer_vocab_size(t), 128256);
    assert_string_equal(data_tokenizer_pattern(t), "llama3");
    /* Expected ids: tiktoken 0.14 encode_ordinary with the llama3 pattern and this rank file. */
    ENCODES(t, "hello world", 15339, 1917);
    ENCODES(t, "Hello, world! 12345", 9906, 11, 1917, 0, 220, 4513, 1774);
    ENCODES(t, "I'm here", 40, 2846, 1618);
    ENCODES(t, "They'll've DON'T", 7009, 3358, 3077, 45373, 17773);
    ENCODES(t, "  leading\r\n\r\nCRLF\ttab", 220, 6522, 881, 34, 81758, 59249);
    ENCODES(t, "na\xc3\xafve caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80", 3458, 38672, 588, 53050, 119109, 91416);
    ENCODES(t, "1234567", 4513, 10961, 22);
    ENCODES(t, "<|end_of_text|>", 27, 91, 408, 3659, 4424, 91, 29); /* special text is ordinary text */
    ENCODES(t, "x \xc2\xa0\xc2\xa0y", 87, 17529, 4194, 88);
    /* U+180E is white space to PCRE2's \s but not to tiktoken (Unicode >= 6.3): punctuation here,
     * so " \u180e" is one piece; U+0085 is white space to tiktoken, so " \u0085" is one piece. */
    ENCODES(t, "\xe1\xa0\x8e", 157, 254, 236);
    ENCODES(t, "a  \xe1\xa0\x8e", 64, 220, 87189, 254, 236);
    ENCODES(t, " \xc2\x85x", 220, 116360, 87);
    /* U+0085 and U+2028 are white space to tiktoken; U+3000 too. */
    ENCODES(t, "a\xc2\x85 \xc2\x85", 64, 116360, 2188, 227);
    ENCODES(t, "a \xc2\x85\xc2\x85 b", 64, 2188, 227, 116360, 293);
    ENCODES(t, "x \xe2\x80\xa8\xe2\x80\xa8", 87, 639, 101, 378, 101);
    ENCODES(t, "\xe3\x80\x80\xe3\x80\x80x", 23249, 23249, 87);
    ENCODES(t, "\xc3\x9c" "berm\xc3\xa4\xc3\x9f" "ig gr\xc3\xb6\xc3\x9f" "er\n\n\n", 53591, 655, 76, 70047, 343, 60509,
            53762, 1432);
    data_tokenizer_close(t);
}

static void test_gpt2_known(void **state)
{
    (void)state;
    DataTokenizer *t = open_real(GPT2, NULL);
    if (!t) {
        skip();
        return;
    }
    assert_int_equal(data_tokenizer_n_ranks(t), 50256);
    assert_int_equal(data_tokenizer_eod(t), 50256);
    assert_int_equal(data_tokenizer_vocab_size(t), 50257);
    assert_string_equal(data_tokenizer_pattern(t), "gpt2"); /* the default for 50,256 ranks */
    ENCODES(t, "hello world", 31373, 995);
    ENCODES(t, "Hello, world! 12345", 15496, 11, 995, 0, 17031, 2231);
    ENCODES(t, "They'll've DON'T", 2990, 1183, 1053, 23917, 6, 51);
    ENCODES(t, "  leading\r\n\r\nCRLF\ttab", 220, 3756, 201, 198, 201, 198, 34, 7836, 37, 197, 8658);
    ENCODES(t, "1234567", 10163, 2231, 3134);
    ENCODES(t, "x \xc2\xa0\xc2\xa0y", 87, 5624, 1849, 88);
    ENCODES(t, "a\xc2\x85 \xc2\x85", 64, 126, 227, 1587, 227);
    ENCODES(t, "a \xc2\x85\xc2\x85 b", 64, 1587, 227, 126, 227, 275);
    ENCODES(t, "x\xe1\xa0\x8e\xe1\xa0\x8e y", 87, 157, 254, 236, 157, 254, 236, 331);
    ENCODES(t, "a  \xe1\xa0\x8e", 64, 220, 28053, 254, 236);
    ENCODES(t, " \xc2\x85x", 220, 126, 227, 87);
    data_tokenizer_close(t);
}

/* --pattern forces the pre-tokenizer: Llama 3 ranks split the GPT-2 way. */
static void test_forced_pattern(void **state)
{
    (void)state;
    DataTokenizer *t = open_real(LLAMA3, "gpt2");
    if (!t) {
        skip();
        return;
    }
    assert_string_equal(data_tokenizer_pattern(t), "gpt2");
    assert_int_equal(data_tokenizer_eod(t), 128001); /* specials follow the rank count, not the pattern */
    ENCODES(t, "They'll've DON'T", 7009, 3358, 3077, 45373, 6, 51);
    ENCODES(t, "  leading\r\n\r\nCRLF\ttab", 220, 6522, 319, 201, 198, 34, 81758, 197, 6323);
    ENCODES(t, "1234567", 4513, 1774, 3080);
    data_tokenizer_close(t);
}

/* Long single pieces (letters only, so one regex match) take the heap path; the reference is the
 * O(n^2) rule. Real ranks make the merge order non-trivial. */
static void test_long_pieces(void **state)
{
    (void)state;
    const char *names[] = {LLAMA3, GPT2};
    int ran = 0;
    for (int k = 0; k < 2; k++) {
        DataTokenizer *t = open_real(names[k], NULL);
        if (!t)
            continue;
        ran++;
        Rng rng;
        rng_seed(&rng, 11 + (uint64_t)k);
        enum { MAXN = 600 };
        unsigned char s[MAXN];
        int32_t want[MAXN];
        for (int round = 0; round < 30; round++) {
            size_t n = 2 + rng_below(&rng, round < 10 ? 70 : MAXN - 2);
            const char *alpha = round % 3 == 0 ? "etaoinshrdlu" : round % 3 == 1 ? "ab" : "abcdefghijklmnopqrstuvwxyz";
            size_t na = strlen(alpha);
            for (size_t i = 0; i < n; i++)
                s[i] = (unsigned char)alpha[rng_below(&rng, na)];
            size_t nw = reference_bpe(t, s, n, want);
            DataTokens ids = {0};
            encode_ok(t, s, n, &ids);
            assert_ids(&ids, want, nw, names[k]);
            data_tokens_free(&ids);
        }
        data_tokenizer_close(t);
    }
    if (!ran)
        skip();
}

/* Random text from fragments: ASCII words, digits, whitespace runs, CRLF, apostrophes, several
 * scripts, emoji, and invalid UTF-8. */
static size_t random_text(Rng *rng, unsigned char *s, size_t cap, int invalid)
{
    static const char *const frags[] = {
        "the", " cat", "'s", "'LL", " ", "  ", "\t", "\n", "\r\n", "\n\n", "123", "4567890", ",", ".", "!?",
        "==", "->", "{", "}", "\xc3\xa9", "\xce\xb1\xce\xb2", "\xd0\xbf\xd1\x80\xd0\xb8", "\xe6\x97\xa5\xe6\x9c\xac",
        "\xe0\xa4\xb9\xe0\xa4\xbf", "\xd8\xb9\xd8\xb1", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
        "\xc2\xa0", "\xe3\x80\x80", "\xe1\xa0\x8e", "\xc2\x85", "\xe2\x80\xa8", "\xd9\xa3", "\xef\xbc\x91",
    };
    static const unsigned char bad[] = {0x80, 0xbf, 0xc0, 0xc1, 0xf5, 0xfe, 0xff, 0xe2, 0xf0, 0xc3};
    size_t n = 0, nf = sizeof frags / sizeof frags[0];
    while (n + 16 < cap && rng_below(rng, 60) != 0) {
        if (invalid && rng_below(rng, 6) == 0) {
            s[n++] = bad[rng_below(rng, sizeof bad)];
            continue;
        }
        const char *f = frags[rng_below(rng, nf)];
        memcpy(s + n, f, strlen(f));
        n += strlen(f);
    }
    return n;
}

static void test_round_trip(void **state)
{
    (void)state;
    const char *names[] = {NULL, LLAMA3, GPT2};
    Rng rng;
    rng_seed(&rng, 3);
    for (int k = 0; k < 3; k++) {
        DataTokenizer *t = k == 0 ? open_ok(NULL, NULL) : open_real(names[k], NULL);
        if (!t)
            continue;
        unsigned char s[2048];
        for (int round = 0; round < 400; round++) {
            size_t n = random_text(&rng, s, sizeof s, round % 2);
            assert_round_trip(t, s, n);
        }
        for (int round = 0; round < 100; round++) { /* raw random bytes */
            size_t n = rng_below(&rng, sizeof s);
            for (size_t i = 0; i < n; i++)
                s[i] = (unsigned char)rng_next_u64(&rng);
            assert_round_trip(t, s, n);
        }
        data_tokenizer_close(t);
    }
}

/* A run of invalid bytes X between valid texts A and B splits the text as the input's end and start
 * would: encode(A X B) = encode(A) encode(X) encode(B). */
static void test_invalid_utf8_boundary(void **state)
{
    (void)state;
    DataTokenizer *t = open_real(LLAMA3, NULL);
    if (!t) {
        skip();
        return;
    }
    /* Bytes that never start or continue a valid sequence on their own next to valid text. */
    static const unsigned char bad[] = {0x80, 0x9f, 0xbf, 0xc0, 0xc1, 0xf5, 0xf8, 0xfe, 0xff};
    Rng rng;
    rng_seed(&rng, 5);
    unsigned char a[1024], b[1024], x[8], all[2100];
    DataTokens ids_all = {0}, part = {0}, want = {0};
    for (int round = 0; round < 300; round++) {
        size_t na = random_text(&rng, a, sizeof a, 0), nb = random_text(&rng, b, sizeof b, 0);
        size_t nx = 1 + rng_below(&rng, sizeof x);
        for (size_t i = 0; i < nx; i++)
            x[i] = bad[rng_below(&rng, sizeof bad)];
        memcpy(all, a, na);
        memcpy(all + na, x, nx);
        memcpy(all + na + nx, b, nb);
        encode_ok(t, all, na + nx + nb, &ids_all);
        want.n = 0;
        const unsigned char *parts[] = {a, x, b};
        size_t lens[] = {na, nx, nb};
        for (int p = 0; p < 3; p++) {
            encode_ok(t, parts[p], lens[p], &part);
            for (size_t i = 0; i < part.n; i++) {
                if (want.n == want.cap) {
                    want.cap = want.cap ? 2 * want.cap : 256;
                    want.ids = realloc(want.ids, want.cap * sizeof *want.ids);
                    assert_non_null(want.ids);
                }
                want.ids[want.n++] = part.ids[i];
            }
        }
        assert_ids(&ids_all, want.ids, want.n, "A + invalid + B");
    }
    /* Lone invalid bytes are single-byte tokens: their ranks are the byte tokens. */
    ENCODES(t, "\xff", 187);
    ENCODES(t, "\xc0\xc1", 124, 125);
    data_tokens_free(&ids_all);
    data_tokens_free(&part);
    data_tokens_free(&want);
    data_tokenizer_close(t);
}

/* Megabyte runs of one character class: the regex (JIT stack) and the merge must cope. */
static void test_long_runs(void **state)
{
    (void)state;
    DataTokenizer *t = open_real(LLAMA3, NULL);
    if (!t) {
        skip();
        return;
    }
    size_t n = 1 << 20;
    unsigned char *s = malloc(n);
    assert_non_null(s);
    const char fill[] = {' ', 'a', '=', '7', '\n'};
    for (int k = 0; k < 5; k++) {
        memset(s, fill[k], n);
        s[n - 1] = 'x';
        assert_round_trip(t, s, n);
    }
    free(s);
    data_tokenizer_close(t);
}

/* Expects data_tokenizer_open(content as a file) to fail with status 2 and msg containing want. */
static void assert_bad_ranks(const char *content, const char *want_where, const char *want)
{
    char *dir = test_tmpdir();
    char *path = test_write_file(dir, "r.tiktoken", content, strlen(content));
    Error err = {0};
    DataTokenizer *t = data_tokenizer_open(path, NULL, &err);
    if (t || err.status != 2 || !strstr(err.msg, want) || strncmp(err.msg, path, strlen(path)) ||
        strncmp(err.msg + strlen(path), want_where, strlen(want_where))) {
        print_error("want '%s%s: ...%s...' (status 2), got status %d '%s'\n", path, want_where, want, err.status,
                    err.msg);
        fail();
    }
    test_rm_rf(dir);
    free(path);
    free(dir);
}

static void test_rank_file_errors(void **state)
{
    (void)state;
    assert_bad_ranks("IQ== 0\nIg== 1\n!!!! 2\n", ":3", "bad base64");
    assert_bad_ranks("IQ== 0\nIg=A 1\n", ":2", "bad base64");
    assert_bad_ranks("IQ== 0\nIgx 1\n", ":2", "bad base64");
    assert_bad_ranks("IQ== 0\nIg== 0\n", ":2", "duplicate rank 0");
    assert_bad_ranks("IQ== 0\nIg== 2\n", ":2", "expected 1");
    assert_bad_ranks("IQ== 0\n\nIg== 1\nIw==\n", ":4", "expected 'BASE64TOKEN RANK'");
    assert_bad_ranks("IQ== 0 7\n", ":1", "expected 'BASE64TOKEN RANK'");
    assert_bad_ranks("IQ== x1\n", ":1", "bad rank 'x1'");
    assert_bad_ranks("IQ== -1\n", ":1", "bad rank '-1'");
    assert_bad_ranks("", "", "no ranks");
    assert_bad_ranks("\n\n", "", "no ranks");
    /* Two ranks with the same bytes ("!" twice), and a file without every single byte. */
    assert_bad_ranks("IQ== 0\nIQ== 1\n", "", "ranks 0 and 1 have the same token bytes");
    assert_bad_ranks("IQ== 0\nIg== 1\n", "", "byte 0x00 has no rank");

    Error err = {0};
    assert_null(data_tokenizer_open("/nonexistent/ranks.tiktoken", NULL, &err));
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "/nonexistent/ranks.tiktoken"));

    /* Pattern names: unknown ones, and a pattern without ranks. */
    char *dir = test_tmpdir();
    char *path = write_ranks(dir, "ok.tiktoken", NULL);
    memset(&err, 0, sizeof err);
    assert_null(data_tokenizer_open(path, "gpt4", &err));
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "gpt4: unknown pre-tokenizer pattern"));
    memset(&err, 0, sizeof err);
    assert_null(data_tokenizer_open(NULL, "llama3", &err));
    assert_int_equal(err.status, 2);
    DataTokenizer *t = open_ok(path, "gpt2");
    assert_int_equal(data_tokenizer_vocab_size(t), 257);
    data_tokenizer_close(t);
    test_rm_rf(dir);
    free(path);
    free(dir);
}

static void test_rank_file_crlf(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    size_t cap = 1 << 14, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        char enc[8];
        b64(&c, 1, enc);
        n += (size_t)snprintf(text + n, cap - n, "%s\t%d \r\n", enc, b);
    }
    n += (size_t)snprintf(text + n, cap - n, "YWI= 256"); /* "ab", no final newline */
    char *path = test_write_file(dir, "crlf.tiktoken", text, n);
    DataTokenizer *t = open_ok(path, NULL);
    assert_int_equal(data_tokenizer_n_ranks(t), 257);
    ENCODES(t, "abab", 256, 256);
    data_tokenizer_close(t);
    test_rm_rf(dir);
    free(text);
    free(path);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_merge_rule),
        cmocka_unit_test(test_llama3_known),
        cmocka_unit_test(test_gpt2_known),
        cmocka_unit_test(test_forced_pattern),
        cmocka_unit_test(test_long_pieces),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_invalid_utf8_boundary),
        cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_rank_file_errors),
        cmocka_unit_test(test_rank_file_crlf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
