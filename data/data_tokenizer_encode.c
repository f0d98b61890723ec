/*
 * data/data_tokenizer_encode.c - text -> token ids: the tiktoken pre-tokenizer (PCRE2) and the
 * byte-pair merge, so that the ids equal tiktoken's encode_ordinary.
 *
 * Pre-tokenizer. tiktoken matches its pattern with Rust's fancy-regex, where \s is the Unicode
 * White_Space property. PCRE2's \s (with PCRE2_UCP) differs from that by one character: it also
 * matches U+180E MONGOLIAN VOWEL SEPARATOR, which Unicode stopped calling white space in 6.3 (and
 * tiktoken then treats as punctuation). So the patterns below are tiktoken's with \s written out
 * as the White_Space set, [^\s...] as [^WS...] and (?!\S) as (?![^WS]); everything else is
 * verbatim. The subject is matched as UTF-8 with PCRE2_MATCH_INVALID_UTF: invalid bytes are never
 * part of a match, and whatever lies between two matches (only invalid UTF-8 can) is encoded as a
 * piece of its own, so no byte is ever dropped and decoding gives the input back.
 *
 * Byte-pair merge (tiktoken's byte_pair_merge): a piece that is itself a token is that token.
 * Otherwise the piece starts as single bytes, and repeatedly the adjacent pair of parts whose
 * concatenation has the lowest rank is merged, the leftmost one on ties, until no adjacent pair is
 * a token. Short pieces use tiktoken's own method (a linear scan for the minimum after every merge,
 * O(n^2)); pieces longer than MERGE_LINEAR_MAX bytes (long runs of letters, digits, symbols or
 * spaces) use a binary heap keyed by (rank, position) over a linked list of parts, O(n log n), so
 * pathological text stays fast. Both pick the same pair at every step: the minimum of (rank, start)
 * over the current adjacent pairs. Every new adjacent pair is pushed when it appears; an entry whose
 * pair no longer makes its token when it is popped is stale and dropped.
 */
#include "data/data_tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

enum { MERGE_LINEAR_MAX = 64 };

/* Unicode White_Space, as Rust's regex \s (Unicode 6.3 and later). */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
           "\\x{205F}\\x{3000}"

/* tiktoken's llama3 pattern:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+ */
static const char pattern_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|"
    "[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

/* tiktoken's gpt2 (r50k_base) pattern:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static const char pattern_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

static int pcre2_error(Error *err, const char *where, const char *what, int code)
{
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(code, msg, sizeof msg) < 0)
        strcpy((char *)msg, "unknown error");
    return error_runtime(err, where, "%s: PCRE2 error %d: %s", what, code, (const char *)msg);
}

int data_tok_compile_pattern(DataTokenizer *t, const char *name, Error *err)
{
    const char *src;
    if (!strcmp(name, "llama3"))
        src = pattern_llama3;
    else if (!strcmp(name, "gpt2"))
        src = pattern_gpt2;
    else
        return error_set(err, name, "unknown pre-tokenizer pattern (expected llama3 or gpt2)");
    t->pattern = !strcmp(name, "llama3") ? "llama3" : "gpt2";
    int code;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &code, &at, NULL);
    if (!t->re)
        return pcre2_error(err, name, "cannot compile the pre-tokenizer pattern", code);
    /* The match limit counts backtracking steps; the default (10 million) stops a match over a run
     * of tens of millions of spaces (\s*[\r\n]+ backtracks through it once, linearly), so it is
     * raised to the maximum: the patterns backtrack at most linearly, they cannot run away. */
    t->mctx = pcre2_match_context_create(NULL);
    if (!t->mctx || pcre2_set_match_limit(t->mctx, UINT32_MAX) != 0 || pcre2_set_depth_limit(t->mctx, UINT32_MAX) != 0)
        return error_runtime(err, name, "out of memory");
    /* JIT is several times faster; without it (a build lacking JIT) the interpreter gives the same
     * matches, so a JIT failure is not an error. A JIT stack larger than the default 32 KiB lets a
     * long run of spaces backtrack through (?!\S) without running out. */
    if (pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0) {
        t->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!t->jit_stack)
            return error_runtime(err, name, "out of memory");
        pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    }
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md)
        return error_runtime(err, name, "out of memory");
    return 0;
}

static int tokens_reserve(DataTokens *o, size_t extra, Error *err)
{
    if (o->cap - o->n >= extra)
        return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap - o->n < extra) {
        if (cap > SIZE_MAX / 2 / sizeof *o->ids)
            return error_runtime(err, "tokenizer", "too many tokens");
        cap *= 2;
    }
    int32_t *ids = realloc(o->ids, cap * sizeof *ids);
    if (!ids)
        return error_runtime(err, "tokenizer", "out of memory (%zu tokens)", cap);
    o->ids = ids;
    o->cap = cap;
    return 0;
}

static int scratch_reserve(DataTokenizer *t, size_t n, Error *err)
{
    if (n <= t->scratch_cap)
        return 0;
    size_t cap = t->scratch_cap ? t->scratch_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *a = realloc(t->tok, cap * sizeof *a);
    if (a)
        t->tok = a;
    uint32_t *b = a ? realloc(t->pr, cap * sizeof *b) : NULL;
    if (b)
        t->pr = b;
    uint32_t *c = b ? realloc(t->nxt, cap * sizeof *c) : NULL;
    if (c)
        t->nxt = c;
    uint32_t *d = c ? realloc(t->prv, cap * sizeof *d) : NULL;
    if (d)
        t->prv = d;
    DataTokHeapItem *h = d ? realloc(t->heap, 3 * cap * sizeof *h) : NULL;
    if (h)
        t->heap = h;
    if (!h)
        return error_runtime(err, "tokenizer", "out of memory (piece of %zu bytes)", n);
    t->scratch_cap = cap;
    return 0;
}

/* tiktoken's method: parts tok[0..m), pr[i] = rank of tok[i] + tok[i+1] (DATA_TOK_NONE if none). */
static void merge_linear(DataTokenizer *t, const unsigned char *p, size_t n, DataTokens *out)
{
    uint32_t *tok = t->tok, *pr = t->pr;
    for (size_t i = 0; i < n; i++)
        tok[i] = t->byte_rank[p[i]];
    for (size_t i = 0; i + 1 < n; i++)
        pr[i] = data_tok_pair(t, tok[i], tok[i + 1]);
    size_t m = n;
    for (;;) {
        uint32_t best = DATA_TOK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (pr[i] < best) {
                best = pr[i];
                bi = i;
            }
        if (best == DATA_TOK_NONE)
            break;
        /* tok[bi] and tok[bi + 1] become one part; pairs to their right shift left by one. */
        tok[bi] = best;
        memmove(tok + bi + 1, tok + bi + 2, (m - bi - 2) * sizeof *tok);
        if (m > bi + 3)
            memmove(pr + bi + 1, pr + bi + 2, (m - bi - 3) * sizeof *pr);
        m--;
        if (bi > 0)
            pr[bi - 1] = data_tok_pair(t, tok[bi - 1], tok[bi]);
        if (bi + 1 < m)
            pr[bi] = data_tok_pair(t, tok[bi], tok[bi + 1]);
    }
    for (size_t i = 0; i < m; i++)
        out->ids[out->n++] = (int32_t)tok[i];
}

static int heap_less(const DataTokHeapItem *a, const DataTokHeapItem *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(DataTokHeapItem *h, size_t *n, DataTokHeapItem it)
{
    size_t i = (*n)++;
    while (i > 0 && heap_less(&it, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = it;
}

static DataTokHeapItem heap_pop(DataTokHeapItem *h, size_t *n)
{
    DataTokHeapItem top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Pushes the pair (part at l, part at r) when its concatenation is a token. */
static void push_pair(DataTokenizer *t, size_t *hn, uint32_t l, uint32_t r)
{
    uint32_t rank = data_tok_pair(t, t->tok[l], t->tok[r]);
    if (rank != DATA_TOK_NONE)
        heap_push(t->heap, hn, (DataTokHeapItem){rank, l});
}

/* The same merges with a heap: parts are a linked list over their start offsets (nxt, prv); tok[i]
 * is the token of the part starting at i, DATA_TOK_NONE once that part was merged into its left. */
static void merge_heap(DataTokenizer *t, const unsigned char *p, size_t n, DataTokens *out)
{
    uint32_t *tok = t->tok, *nxt = t->nxt, *prv = t->prv;
    uint32_t end = (uint32_t)n;
    size_t hn = 0;
    for (uint32_t i = 0; i < end; i++) {
        tok[i] = t->byte_rank[p[i]];
        nxt[i] = i + 1;
        prv[i] = i == 0 ? DATA_TOK_NONE : i - 1;
    }
    for (uint32_t i = 0; i + 1 < end; i++)
        push_pair(t, &hn, i, i + 1);
    while (hn > 0) {
        DataTokHeapItem it = heap_pop(t->heap, &hn);
        uint32_t l = it.left, r = nxt[l];
        /* Stale unless a part still starts at l, has a right neighbour, and the two still make
         * token it.rank. An entry that passes describes the current pair exactly (the merge is a
         * function of (rank, left) alone), so acting on it is right even if it was pushed for an
         * earlier pair; the pair's own entry is then stale when it comes up. */
        if (tok[l] == DATA_TOK_NONE || r >= end || data_tok_pair(t, tok[l], tok[r]) != it.rank)
            continue;
        tok[l] = it.rank;
        tok[r] = DATA_TOK_NONE;
        nxt[l] = nxt[r];
        if (nxt[l] < end)
            prv[nxt[l]] = l;
        if (prv[l] != DATA_TOK_NONE)
            push_pair(t, &hn, prv[l], l);
        if (nxt[l] < end)
            push_pair(t, &hn, l, nxt[l]);
    }
    for (uint32_t i = 0; i < end; i = nxt[i])
        out->ids[out->n++] = (int32_t)tok[i];
}

static int encode_piece(DataTokenizer *t, const unsigned char *p, size_t n, DataTokens *out, Error *err)
{
    if (tokens_reserve(out, n, err) != 0)
        return -1;
    if (n == 1) {
        out->ids[out->n++] = (int32_t)t->byte_rank[p[0]];
        return 0;
    }
    uint32_t whole = data_tok_lookup(t, p, n);
    if (whole != DATA_TOK_NONE) {
        out->ids[out->n++] = (int32_t)whole;
        return 0;
    }
    if (n >= UINT32_MAX / 4)
        return error_runtime(err, "tokenizer", "a piece of %zu bytes is too long", n);
    if (scratch_reserve(t, n, err) != 0)
        return -1;
    if (n <= MERGE_LINEAR_MAX)
        merge_linear(t, p, n, out);
    else
        merge_heap(t, p, n, out);
    return 0;
}

int data_tokenizer_encode(DataTokenizer *t, const char *text, size_t len, DataTokens *out, Error *err)
{
    const unsigned char *s = (const unsigned char *)text;
    if (t->byte_level) {
        if (tokens_reserve(out, len, err) != 0)
            return -1;
        for (size_t i = 0; i < len; i++)
            out->ids[out->n++] = s[i];
        return 0;
    }
    size_t pos = 0;
    while (pos < len) {
        int rc = pcre2_match(t->re, s, len, pos, 0, t->md, t->mctx);
        size_t start = len, end = len;
        if (rc >= 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
            start = ov[0];
            end = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return pcre2_error(err, "tokenizer", "pre-tokenizer match failed", rc);
        }
        /* Bytes no match covers (invalid UTF-8): a piece of their own. */
        if (start > pos && encode_piece(t, s + pos, start - pos, out, err) != 0)
            return -1;
        if (end == start && start < len) /* the patterns cannot match empty text */
            return error_runtime(err, "tokenizer", "pre-tokenizer matched empty text at byte %zu", start);
        if (end > start && encode_piece(t, s + start, end - start, out, err) != 0)
            return -1;
        pos = end;
    }
    return 0;
}
