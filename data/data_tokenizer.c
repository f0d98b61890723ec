/*
 * data/data_tokenizer.c - opening a tokenizer: the tiktoken ranks file, the lookup tables, the
 * special tokens; token bytes and decoding. Encoding is in data_tokenizer_encode.c.
 *
 * A ranks file has one line "BASE64TOKEN RANK" per token, in rank order. It is checked strictly,
 * so a damaged file is one clear error instead of silently different token ids: the base64 must be
 * well-formed, ranks must run 0, 1, 2, ... in order (a repeated rank or a gap is an error), no two
 * ranks may have the same bytes, and every single byte must be a token (the merge starts from
 * single bytes, as tiktoken's does). Empty lines are skipped, as tiktoken's loader skips them.
 */
#include "data/data_tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fileio.h"
#include "util/parse.h"

enum { LLAMA3_RANKS = 128000, LLAMA3_VOCAB = 128256, LLAMA3_BOS = 128000, LLAMA3_EOD = 128001, GPT2_RANKS = 50256 };

void data_tokens_free(DataTokens *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

/* A 64-bit hash of a short byte string: 8 bytes at a time through a multiply-xorshift, then the
 * murmur3 finalizer so that the low bits (the slot) depend on every input bit. */
uint64_t data_tok_hash(const unsigned char *s, size_t n)
{
    uint64_t h = 0x243F6A8885A308D3ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ h >> 33;
}

uint32_t data_tok_lookup(const DataTokenizer *t, const unsigned char *s, size_t n)
{
    uint64_t h = data_tok_hash(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_mask;; i = (i + 1) & t->tok_mask) {
        DataTokSlot slot = t->tok_slots[i];
        if (slot.rank == DATA_TOK_NONE)
            return DATA_TOK_NONE;
        if (slot.tag == tag && t->offsets[slot.rank + 1] - t->offsets[slot.rank] == n &&
            !memcmp(t->bytes + t->offsets[slot.rank], s, n))
            return slot.rank;
    }
}

/* Smallest power of two >= 2 * n (and >= 1024): the tables stay at most half full. */
static uint64_t table_capacity(uint64_t n, int *log2)
{
    uint64_t cap = 1024;
    int bits = 10;
    while (cap < 2 * n) {
        cap *= 2;
        bits++;
    }
    if (log2)
        *log2 = bits;
    return cap;
}

static int base64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decodes standard padded base64 s[0..n) into out (room for 3 * n / 4 bytes); returns the number of
 * bytes, or -1 when s is not base64. */
static long base64_decode(const unsigned char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4 != 0)
        return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long m = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            int d = 0;
            if (i + k >= n - pad) {
                if (s[i + k] != '=')
                    return -1;
            } else if ((d = base64_value(s[i + k])) < 0) {
                return -1;
            }
            v = v << 6 | (uint32_t)d;
        }
        out[m++] = (unsigned char)(v >> 16);
        if (i + 4 < n || pad < 2)
            out[m++] = (unsigned char)(v >> 8);
        if (i + 4 < n || pad < 1)
            out[m++] = (unsigned char)v;
    }
    return m;
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Inserts rank r into the bytes table; returns the rank that already has the same bytes, or
 * DATA_TOK_NONE after inserting. */
static uint32_t tok_insert(DataTokenizer *t, uint32_t r)
{
    const unsigned char *s = t->bytes + t->offsets[r];
    size_t n = t->offsets[r + 1] - t->offsets[r];
    uint32_t q = data_tok_lookup(t, s, n);
    if (q != DATA_TOK_NONE)
        return q;
    uint64_t h = data_tok_hash(s, n);
    uint64_t i = h & t->tok_mask;
    while (t->tok_slots[i].rank != DATA_TOK_NONE)
        i = (i + 1) & t->tok_mask;
    t->tok_slots[i] = (DataTokSlot){r, (uint32_t)(h >> 32)};
    return DATA_TOK_NONE;
}

/* "path:line" for an error message. */
static const char *at_line(char *buf, size_t size, const char *path, long line)
{
    snprintf(buf, size, "%s:%ld", path, line);
    return buf;
}

/* Parses the ranks file text into t->bytes / t->offsets / t->n_ranks. */
static int parse_ranks(DataTokenizer *t, const char *path, const char *text, size_t len, Error *err)
{
    char buf[4200];
#define WHERE at_line(buf, sizeof buf, path, line)
    size_t bytes_cap = 0, off_cap = 0;
    uint64_t n = 0, used = 0;
    long line = 0;
    for (size_t pos = 0; pos < len;) {
        const char *s = text + pos;
        const char *eol = memchr(s, '\n', len - pos);
        size_t ll = eol ? (size_t)(eol - s) : len - pos;
        pos += ll + (eol != NULL);
        line++;
        if (ll > 0 && s[ll - 1] == '\r')
            ll--;
        if (ll == 0)
            continue;
        size_t a = 0;
        while (a < ll && s[a] != ' ' && s[a] != '\t')
            a++;
        size_t b = a;
        while (b < ll && (s[b] == ' ' || s[b] == '\t'))
            b++;
        size_t c = b;
        while (c < ll && s[c] != ' ' && s[c] != '\t')
            c++;
        size_t d = c;
        while (d < ll && (s[d] == ' ' || s[d] == '\t'))
            d++;
        if (a == 0 || b == a || c == b || d != ll)
            return error_set(err, WHERE, "expected 'BASE64TOKEN RANK', got '%.*s'", (int)(ll > 80 ? 80 : ll), s);
        int64_t rank;
        if (parse_int64_n(s + b, c - b, &rank) != 0 || rank < 0)
            return error_set(err, WHERE, "bad rank '%.*s' (expected an integer >= 0)", (int)(c - b), s + b);
        if (rank < (int64_t)n)
            return error_set(err, WHERE, "duplicate rank %lld (ranks must be 0, 1, 2, ... in order)", (long long)rank);
        if (rank > (int64_t)n)
            return error_set(err, WHERE, "rank %lld is out of order: expected %llu (ranks must be 0, 1, 2, ... "
                             "with no gap)", (long long)rank, (unsigned long long)n);
        if (n >= (uint64_t)INT32_MAX - 1024)
            return error_set(err, WHERE, "too many ranks");
        if (grow((void **)&t->bytes, &bytes_cap, used + a, 1) != 0 ||
            grow((void **)&t->offsets, &off_cap, n + 2, sizeof *t->offsets) != 0)
            return error_runtime(err, path, "out of memory");
        long m = base64_decode((const unsigned char *)s, a, t->bytes + used);
        if (m <= 0)
            return error_set(err, WHERE, "bad base64 token '%.*s'", (int)(a > 80 ? 80 : a), s);
        t->offsets[n] = used;
        used += (uint64_t)m;
        t->offsets[++n] = used;
    }
    if (n == 0)
        return error_set(err, path, "no ranks (expected lines 'BASE64TOKEN RANK')");
    t->n_ranks = (uint32_t)n;
    return 0;
#undef WHERE
}

int data_tok_build_token_table(DataTokenizer *t, const char *path, Error *err)
{
    uint32_t n = t->n_ranks;
    uint64_t cap = table_capacity(n, NULL);
    t->tok_slots = malloc(cap * sizeof *t->tok_slots);
    if (!t->tok_slots)
        return error_runtime(err, path, "out of memory");
    memset(t->tok_slots, 0xFF, cap * sizeof *t->tok_slots);
    t->tok_mask = cap - 1;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t q = tok_insert(t, r);
        if (q != DATA_TOK_NONE)
            return error_set(err, path, "ranks %u and %u have the same token bytes", q, r);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if ((t->byte_rank[b] = data_tok_lookup(t, &c, 1)) == DATA_TOK_NONE)
            return error_set(err, path, "byte 0x%02x has no rank (every single byte must be a token)", b);
    }
    return 0;
}

/* Builds both hash tables and byte_rank; checks for repeated tokens and missing single bytes. */
static int build_tables(DataTokenizer *t, const char *path, Error *err)
{
    uint32_t n = t->n_ranks;
    if (data_tok_build_token_table(t, path, err) != 0)
        return -1;
    uint64_t n_pairs = 0;
    for (uint32_t r = 0; r < n; r++)
        n_pairs += t->offsets[r + 1] - t->offsets[r] - 1;

    /* Every split of every token into two tokens: (left, right) -> token. */
    int bits;
    uint64_t cap = table_capacity(n_pairs, &bits);
    t->pair_slots = malloc(cap * sizeof *t->pair_slots);
    if (!t->pair_slots)
        return error_runtime(err, path, "out of memory");
    memset(t->pair_slots, 0xFF, cap * sizeof *t->pair_slots);
    t->pair_mask = cap - 1;
    t->pair_shift = 64 - bits;
    for (uint32_t r = 0; r < n; r++) {
        const unsigned char *s = t->bytes + t->offsets[r];
        size_t len = t->offsets[r + 1] - t->offsets[r];
        for (size_t k = 1; k < len; k++) {
            uint32_t a = data_tok_lookup(t, s, k), b = data_tok_lookup(t, s + k, len - k);
            if (a == DATA_TOK_NONE || b == DATA_TOK_NONE)
                continue;
            uint64_t i = data_tok_pair_slot(t, a, b);
            while (t->pair_slots[i].a != DATA_TOK_NONE)
                i = (i + 1) & t->pair_mask;
            /* (a, b) is new: one pair has one concatenation, which only one rank can have. */
            t->pair_slots[i] = (DataTokPairSlot){a, b, r};
        }
    }
    return 0;
}

static int open_byte_level(DataTokenizer *t, Error *err)
{
    t->byte_level = 1;
    t->pattern = "bytes";
    t->n_ranks = 256;
    t->eod = 256;
    t->bos = -1;
    t->vocab = 257;
    t->bytes = malloc(256);
    t->offsets = malloc(257 * sizeof *t->offsets);
    if (!t->bytes || !t->offsets)
        return error_runtime(err, "tokenizer", "out of memory");
    for (int b = 0; b < 256; b++) {
        t->bytes[b] = (unsigned char)b;
        t->offsets[b] = (uint64_t)b;
        t->byte_rank[b] = (uint32_t)b;
    }
    t->offsets[256] = 256;
    return 0;
}

DataTokenizer *data_tokenizer_open(const char *ranks_path, const char *pattern, Error *err)
{
    DataTokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        error_runtime(err, "tokenizer", "out of memory");
        return NULL;
    }
    if (!ranks_path) {
        if (pattern) {
            error_set(err, pattern, "a pre-tokenizer pattern needs a BPE ranks file (byte-level tokens are "
                      "not pre-tokenized)");
            data_tokenizer_close(t);
            return NULL;
        }
        if (open_byte_level(t, err) != 0) {
            data_tokenizer_close(t);
            return NULL;
        }
        return t;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(ranks_path, &text, &len, err);
    size_t first = 0;
    while (rc == 0 && first < len && (text[first] == ' ' || text[first] == '\t' || text[first] == '\r' ||
                                      text[first] == '\n'))
        first++;
    if (rc == 0 && first < len && text[first] == '{') { /* JSON: a Hugging Face tokenizer.json */
        if (pattern)
            rc = error_set(err, "--pattern", "not with a tokenizer.json (its pre_tokenizer gives the pattern)");
        else
            rc = data_tok_open_hf(t, ranks_path, text, len, err);
        free(text);
        if (rc != 0) {
            data_tokenizer_close(t);
            return NULL;
        }
        return t;
    }
    if (rc == 0)
        rc = parse_ranks(t, ranks_path, text, len, err);
    free(text);
    t->whole_piece_lookup = 1;
    t->bos = -1;
    if (rc == 0)
        rc = build_tables(t, ranks_path, err);
    if (rc == 0) {
        if (t->n_ranks == LLAMA3_RANKS) {
            /* Meta's tokenizer.py names these; they are what the HF files' added tokens say too. */
            static const char *const names[] = {"<|begin_of_text|>", "<|end_of_text|>"};
            t->bos = LLAMA3_BOS;
            t->eod = LLAMA3_EOD;
            t->vocab = LLAMA3_VOCAB;
            t->added = calloc(2, sizeof *t->added);
            if (!t->added)
                rc = error_runtime(err, ranks_path, "out of memory");
            for (int k = 0; rc == 0 && k < 2; k++) {
                t->added[k] = (DataTokAdded){.text = strdup(names[k]), .len = strlen(names[k]),
                                             .id = LLAMA3_BOS + k, .special = 1};
                t->n_added++;
                if (!t->added[k].text)
                    rc = error_runtime(err, ranks_path, "out of memory");
            }
        } else {
            t->eod = (int32_t)t->n_ranks; /* GPT-2's <|endoftext|> = 50256 is this rule too */
            t->vocab = (int64_t)t->n_ranks + 1;
        }
        if (!pattern)
            pattern = t->n_ranks == GPT2_RANKS ? "gpt2" : "llama3";
        rc = data_tok_compile_pattern(t, pattern, err);
    }
    if (rc != 0) {
        data_tokenizer_close(t);
        return NULL;
    }
    return t;
}

void data_tokenizer_close(DataTokenizer *t)
{
    if (!t)
        return;
    free(t->bytes);
    free(t->offsets);
    free(t->tok_slots);
    free(t->pair_slots);
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    pcre2_code_free(t->re);
    free(t->tok);
    free(t->pr);
    free(t->nxt);
    free(t->prv);
    free(t->heap);
    free(t->merge_result);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].text);
    free(t->added);
    free(t);
}

int32_t data_tokenizer_eod(const DataTokenizer *t) { return t->eod; }
int32_t data_tokenizer_bos(const DataTokenizer *t) { return t->bos; }

const char *data_tokenizer_special_text(const DataTokenizer *t, int32_t id, size_t *len)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) {
            *len = t->added[i].len;
            return t->added[i].text;
        }
    *len = 0;
    return NULL;
}

int data_tokenizer_match_specials(DataTokenizer *t, Error *err)
{
    if (t->byte_level || !t->merge_result)
        return error_set(err, "--special-tokens", "match needs a tokenizer.json (it names the special tokens; "
                         "a tiktoken ranks file does not)");
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].strips) {
            char shown[64]; /* the token's text on one line */
            size_t n = 0;
            for (; n + 1 < sizeof shown && t->added[i].text[n]; n++)
                shown[n] = (unsigned char)t->added[i].text[n] < 0x20 ? '?' : t->added[i].text[n];
            shown[n] = '\0';
            return error_set(err, "--special-tokens", "added token '%s' has lstrip, rstrip or single_word set, "
                             "which matching it in text does not support", shown);
        }
    t->match_specials = 1;
    t->scan_added = t->n_added > 0;
    return 0;
}
int64_t data_tokenizer_vocab_size(const DataTokenizer *t) { return t->vocab; }
int64_t data_tokenizer_n_ranks(const DataTokenizer *t) { return t->n_ranks; }
const char *data_tokenizer_pattern(const DataTokenizer *t) { return t->pattern; }

const unsigned char *data_tokenizer_token_bytes(const DataTokenizer *t, int32_t id, size_t *len)
{
    if (id >= 0 && (uint32_t)id >= t->n_ranks)
        for (size_t i = 0; i < t->n_added; i++)
            if (t->added[i].id == id && !t->added[i].special) {
                *len = t->added[i].len;
                return (const unsigned char *)t->added[i].text;
            }
    if (id < 0 || (uint32_t)id >= t->n_ranks) {
        *len = 0;
        return NULL;
    }
    *len = (size_t)(t->offsets[id + 1] - t->offsets[id]);
    return t->bytes + t->offsets[id];
}

int64_t data_tokenizer_rank(const DataTokenizer *t, const void *s, size_t len)
{
    if (len == 0)
        return -1;
    if (t->byte_level)
        return len == 1 ? *(const unsigned char *)s : -1;
    uint32_t r = data_tok_lookup(t, s, len);
    return r == DATA_TOK_NONE ? -1 : (int64_t)r;
}

char *data_tokenizer_decode(const DataTokenizer *t, const int32_t *ids, size_t n, size_t *len, Error *err)
{
    size_t total = 0, blen;
    for (size_t i = 0; i < n; i++) {
        if (!data_tokenizer_token_bytes(t, ids[i], &blen)) {
            error_set(err, "decode", "token %zu: id %d has no bytes (a special token, or out of range)", i, ids[i]);
            return NULL;
        }
        total += blen;
    }
    char *out = malloc(total + 1);
    if (!out) {
        error_runtime(err, "decode", "out of memory (%zu bytes)", total + 1);
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *b = data_tokenizer_token_bytes(t, ids[i], &blen);
        memcpy(out + at, b, blen);
        at += blen;
    }
    out[at] = '\0';
    *len = at;
    return out;
}
