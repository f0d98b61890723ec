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

/* A slot of the pair table: a = DATA_TOK_NONE marks an empty slot. */
typedef struct DataTokPairSlot {
    uint32_t a, b, rank;
} DataTokPairSlot;

/* One entry of the merge heap for long pieces: "the part starting at left and the part after it
 * concatenate to token rank", true when pushed, stale once either part has changed. */
typedef struct DataTokHeapItem {
    uint32_t rank, left;
} DataTokHeapItem;

struct DataTokenizer {
    int byte_level;
    const char *pattern;       /* "bytes", "llama3", "gpt2" */
    uint32_t n_ranks;
    int32_t eod;
    int64_t vocab;

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

/* Compiles the named pre-tokenizer regex into t (data_tokenizer_encode.c). */
int data_tok_compile_pattern(DataTokenizer *t, const char *name, Error *err);

#endif
