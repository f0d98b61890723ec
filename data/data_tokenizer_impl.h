/*
 * data/data_tokenizer_impl.h - the inside of DataTokenizer, shared by data_tokenizer.c (ranks file,
 * lookup tables) and data_tokenizer_encode.c (pre-tokenizer and byte-pair merge). Not for other
 * modules: they use data_tokenizer.h.
 *
 * Two open-addressing hash tables (linear probing, power-of-two capacity, load <= 1/2):
 *   bytes -> rank   the token whose bytes are a given string (whole-piece lookup, data_tokenizer_rank);
 *   (a, b) -> rank  the token whose bytes are bytes(a) + bytes(b), for every token that splits into
 *                   two tokens. During a merge every part is a token (parts start as single bytes,
 *                   and two parts merge only into a token), so "does the concatenation of these two
 *                   parts have a rank" is one integer-keyed lookup instead of hashing byte strings.
 *
 * A Hugging Face tokenizer.json (data_tokenizer_hf.c) fills the same tables, with one difference:
 * its merges list, not the ranks, orders the merges. The pair table then holds (a, b) -> the
 * merge's index in that list (its priority: the lower merges first), and merge_result maps the
 * index to the token made. For a tiktoken file merge_result is NULL: the priority is the token.
 */
#ifndef WLB_DATA_DATA_TOKENIZER_IMPL_H
#define WLB_DATA_DATA_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/data_tokenizer.h"

#define DATA_TOK_NONE UINT32_MAX /* "no rank" in the tables and in the merge */

/* A slot of the bytes table: a rank (DATA_TOK_NONE = empty) and the high half of its bytes' hash,
 * compared before the bytes themselves are looked at (one cache miss per probe, mostly). */
typedef struct DataTokSlot {
    uint32_t rank, tag;
} DataTokSlot;

/* A slot of the pair table: a = DATA_TOK_NONE marks an empty slot; rank is the merge's priority. */
typedef struct DataTokPairSlot {
    uint32_t a, b, rank;
} DataTokPairSlot;

/* One entry of the merge heap for long pieces: "the part starting at left and the part after it
 * concatenate to token rank", true when pushed, stale once either part has changed. */
typedef struct DataTokHeapItem {
    uint32_t rank, left;
} DataTokHeapItem;

/* An added token of a tokenizer.json (or a tiktoken file's known special): text that stands for one
 * id. special: a special token (matched in text only with data_tokenizer_match_specials);
 * normalized: matched after the normalizer (a second pass over the text between the others). */
typedef struct DataTokAdded {
    char *text;
    size_t len;
    int32_t id;
    int special, normalized, strips; /* strips: lstrip, rstrip or single_word set (not supported) */
} DataTokAdded;

struct DataTokenizer {
    int byte_level;
    const char *pattern;       /* "bytes", "llama3", "gpt2" or "tokenizer.json" (another regex) */
    uint32_t n_ranks;
    int32_t eod;               /* -1: none known */
    int32_t bos;               /* -1: none; the BOS put first by default */
    int64_t vocab;
    int whole_piece_lookup;    /* a piece that is a token is that token (tiktoken; HF ignore_merges) */
    uint32_t *merge_result;    /* tokenizer.json: merge priority -> token; NULL = the priority is it */

    DataTokAdded *added;       /* added tokens, matched in text by leftmost-longest */
    size_t n_added;
    int match_specials;        /* special added tokens are matched in text too */
    int scan_added;            /* some added token is matched in text (the scan runs at all) */
    uint8_t added_first[256];  /* 1 for a byte that starts some added token */

    unsigned char *bytes;      /* every token's bytes, concatenated in rank order */
    uint64_t *offsets;         /* token r is bytes[offsets[r] .. offsets[r + 1]) */
    uint32_t byte_rank[256];   /* the rank of each single byte */

    DataTokSlot *tok_slots;    /* bytes -> rank table */
    uint64_t tok_mask;

    DataTokPairSlot *pair_slots; /* (a, b) -> rank table */
    uint64_t pair_mask;
    int pair_shift;            /* 64 - log2(capacity): slot = high bits of key * golden ratio */

    pcre2_code *re;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;

    /* Scratch of the merge, grown on demand (hence one tokenizer per thread). */
    uint32_t *tok, *pr, *nxt, *prv;
    size_t scratch_cap;
    DataTokHeapItem *heap;     /* 3 * scratch_cap entries: n - 1 pairs, then 2 per merge */
};

uint64_t data_tok_hash(const unsigned char *s, size_t n);
/* Rank of the token with bytes s[0..n), DATA_TOK_NONE if none. */
uint32_t data_tok_lookup(const DataTokenizer *t, const unsigned char *s, size_t n);
/* Home slot of the pair (a, b). Fibonacci hashing: the high bits of the product depend on every
 * bit of the key. */
static inline uint64_t data_tok_pair_slot(const DataTokenizer *t, uint32_t a, uint32_t b)
{
    return (((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull) >> t->pair_shift;
}

/* Rank of the token bytes(a) + bytes(b), DATA_TOK_NONE if none. */
static inline uint32_t data_tok_pair(const DataTokenizer *t, uint32_t a, uint32_t b)
{
    for (uint64_t i = data_tok_pair_slot(t, a, b);; i = (i + 1) & t->pair_mask) {
        const DataTokPairSlot *s = &t->pair_slots[i];
        if (s->a == a && s->b == b)
            return s->rank;
        if (s->a == DATA_TOK_NONE)
            return DATA_TOK_NONE;
    }
}

/* The token a merge of priority prio makes. */
static inline uint32_t data_tok_merged(const DataTokenizer *t, uint32_t prio)
{
    return t->merge_result ? t->merge_result[prio] : prio;
}

/* Compiles the named pre-tokenizer regex into t (data_tokenizer_encode.c). */
int data_tok_compile_pattern(DataTokenizer *t, const char *name, Error *err);
/* Compiles a tokenizer.json pre-tokenizer regex (Oniguruma syntax, as the tokenizers library
 * matches it) into t, translated to PCRE2; where names it in errors (status 2 for a pattern this
 * cannot translate or compile). */
int data_tok_compile_regex(DataTokenizer *t, const char *regex, const char *where, Error *err);
/* Builds the bytes -> rank table and byte_rank from bytes/offsets/n_ranks; a repeated token or a
 * single byte that is no token is an Error naming path (data_tokenizer.c). */
int data_tok_build_token_table(DataTokenizer *t, const char *path, Error *err);
/* Reads a Hugging Face tokenizer.json (text[0..len), from path) into t (data_tokenizer_hf.c). */
int data_tok_open_hf(DataTokenizer *t, const char *path, const char *text, size_t len, Error *err);

#endif
