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
 *
 * A tokenizer.json (Hugging Face's BPE, models/bpe/word.rs merge_all) is the same procedure with the
 * merge's index in its merges list as the rank and only the listed pairs as candidates: its heap is
 * ordered by (merge index, start) too, so the same code gives its ids. Its whole-piece lookup is
 * its model's ignore_merges, and its added tokens are split off first (encode_pass).
 */
#include "data/data_tokenizer_impl.h"

#include <stdio.h>
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

/* Compiles the PCRE2 pattern src into t; name says where in errors. A compile error is a runtime
 * error for the built-in patterns and bad input (status 2) for one read from a file (user). */
static int compile_source(DataTokenizer *t, const char *src, const char *name, int user, Error *err)
{
    int code;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &code, &at, NULL);
    if (!t->re && user) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(code, msg, sizeof msg) < 0)
            strcpy((char *)msg, "unknown error");
        return error_set(err, name, "cannot compile the pre-tokenizer regex (PCRE2, at offset %zu of '%s'): %s",
                         (size_t)at, src, (const char *)msg);
    }
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
    return compile_source(t, src, name, 0, err);
}

/* Appends s to the growing string *out (length *n, capacity *cap); -1 when out of memory. */
static int append(char **out, size_t *n, size_t *cap, const char *s, size_t len)
{
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (*n + len + 1 > c)
            c *= 2;
        char *p = realloc(*out, c);
        if (!p)
            return -1;
        *out = p;
        *cap = c;
    }
    memcpy(*out + *n, s, len);
    *n += len;
    (*out)[*n] = '\0';
    return 0;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Oniguruma (the tokenizers library's regex engine) -> PCRE2, for the escapes whose meaning
 * differs: \s is Unicode White_Space in Oniguruma, written out as WS (see the top); \d is \p{Nd};
 * \v is the vertical tab; \uHHHH is \x{HHHH}. Escapes with no exact PCRE2 equivalent here are
 * refused rather than guessed: \S and \D inside a character class, \h (a hex digit in
 * Oniguruma), \b, nested classes, and \w / \W, whose Oniguruma set is neither PCRE2's nor a
 * general category (below U+0100 it has the Latin-1 table's digits such as \u00bd, above only
 * decimal digits: \u2460 is not in it). */
static char *translate_regex(const char *re, const char *where, Error *err)
{
    char *out = NULL;
    size_t n = 0, cap = 0;
    int in_class = 0;
    int rc = 0;
    for (size_t i = 0; re[i] && rc == 0;) {
        char c = re[i];
        if (c == '[') {
            if (in_class && re[i + 1] != ':') {
                free(out);
                error_set(err, where, "nested character classes are not supported in the pre-tokenizer regex");
                return NULL;
            }
            if (in_class) { /* a POSIX class [:name:] inside a class: copied whole */
                const char *end = strstr(re + i + 2, ":]");
                size_t len = end ? (size_t)(end - (re + i)) + 2 : strlen(re + i);
                rc = append(&out, &n, &cap, re + i, len);
                i += len;
                continue;
            }
            in_class = 1;
            size_t len = 1;
            if (re[i + len] == '^')
                len++;
            if (re[i + len] == ']') /* a ']' first in a class is literal */
                len++;
            rc = append(&out, &n, &cap, re + i, len);
            i += len;
            continue;
        }
        if (c == ']' && in_class) {
            in_class = 0;
            rc = append(&out, &n, &cap, "]", 1);
            i++;
            continue;
        }
        if (c != '\\') {
            rc = append(&out, &n, &cap, re + i, 1);
            i++;
            continue;
        }
        char e = re[i + 1];
        const char *rep = NULL;
        char buf[32];
        size_t used = 2;
        switch (e) {
        case 's': rep = in_class ? WS : "[" WS "]"; break;
        case 'S': rep = in_class ? NULL : "[^" WS "]"; break;
        case 'd': rep = "\\p{Nd}"; break;
        case 'D': rep = in_class ? NULL : "\\P{Nd}"; break;
        case 'v': rep = "\\x{0B}"; break;
        case 'u': {
            int k = 0;
            while (k < 4 && is_hex(re[i + 2 + k]))
                k++;
            if (k == 4) {
                snprintf(buf, sizeof buf, "\\x{%.4s}", re + i + 2);
                rep = buf;
                used = 6;
            }
            break;
        }
        case 'p': case 'P': case 'x': case 'r': case 'n': case 't': case 'f': case 'e': case 'a': case 'A': case 'z':
            /* the same in PCRE2 (\p{..} and \x{..} are copied with their braces as they come) */
            buf[0] = '\\';
            buf[1] = e;
            buf[2] = '\0';
            rep = buf;
            break;
        default:
            if (e && !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))) {
                buf[0] = '\\';
                buf[1] = e;
                buf[2] = '\0';
                rep = buf; /* an escaped symbol: itself */
            }
            break;
        }
        if (!rep) {
            free(out);
            if (!e)
                error_set(err, where, "the pre-tokenizer regex ends with a lone backslash");
            else
                error_set(err, where, "the escape \\%c%s is not supported in the pre-tokenizer regex", e,
                          in_class ? " inside a character class" : "");
            return NULL;
        }
        rc = append(&out, &n, &cap, rep, strlen(rep));
        i += used;
    }
    if (rc == 0 && !out)
        rc = append(&out, &n, &cap, "", 0);
    if (rc != 0) {
        free(out);
        error_runtime(err, where, "out of memory");
        return NULL;
    }
    return out;
}

int data_tok_compile_regex(DataTokenizer *t, const char *regex, const char *where, Error *err)
{
    char *src = translate_regex(regex, where, err);
    if (!src)
        return -1;
    /* The two patterns wlbtrain knows by name, reported as such. */
    t->pattern = !strcmp(src, pattern_llama3) ? "llama3" : !strcmp(src, pattern_gpt2) ? "gpt2" : "tokenizer.json";
    int rc = compile_source(t, src, where, 1, err);
    free(src);
    return rc;
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
        tok[bi] = data_tok_merged(t, best);
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
        tok[l] = data_tok_merged(t, it.rank);
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
    uint32_t whole = t->whole_piece_lookup ? data_tok_lookup(t, p, n) : DATA_TOK_NONE;
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

/* Text with no added token in it: pre-tokenizer pieces, each byte-pair merged. */
static int encode_text(DataTokenizer *t, const unsigned char *s, size_t len, DataTokens *out, Error *err)
{
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
        {
            if (!strcmp(t->pattern, "tokenizer.json")) /* a regex from the user's file */
                return error_set(err, "tokenizer", "the tokenizer.json pre-tokenizer regex matched empty text at byte "
                                 "%zu (regexes that can match nothing are not supported)", start);
            return error_runtime(err, "tokenizer", "pre-tokenizer matched empty text at byte %zu", start);
        }
        if (end > start && encode_piece(t, s + start, end - start, out, err) != 0)
            return -1;
        pos = end;
    }
    return 0;
}

/* The added token of the given pass (normalized 0 or 1) at s[pos..): the longest one there, or -1. */
static long added_at(const DataTokenizer *t, const unsigned char *s, size_t len, size_t pos, int normalized)
{
    long best = -1;
    size_t best_len = 0;
    for (size_t k = 0; k < t->n_added; k++) {
        const DataTokAdded *a = &t->added[k];
        if (a->normalized == normalized && a->len > best_len && a->len <= len - pos &&
            !memcmp(s + pos, a->text, a->len)) {
            best = (long)k;
            best_len = a->len;
        }
    }
    return best;
}

/* Added tokens, as the tokenizers library's AddedVocabulary finds them: pass 0 finds the tokens
 * with normalized false in the text, leftmost-longest and without overlap; pass 1 finds those with
 * normalized true in the text between (the normalizer is none, so that text is as it came); pass 2
 * encodes what is left (encode_text). A special token found while specials are not matched is
 * skipped, not split on: its text stays ordinary text, and the search goes on after it (as the
 * library's encode_special_tokens does). */
static int encode_pass(DataTokenizer *t, const unsigned char *s, size_t len, int pass, DataTokens *out, Error *err)
{
    if (pass == 2)
        return encode_text(t, s, len, out, err);
    size_t seg = 0;
    for (size_t pos = 0; pos < len;) {
        long k = t->added_first[s[pos]] ? added_at(t, s, len, pos, pass) : -1;
        if (k < 0) {
            pos++;
            continue;
        }
        const DataTokAdded *a = &t->added[k];
        if (a->special && !t->match_specials) {
            pos += a->len;
            continue;
        }
        if (encode_pass(t, s + seg, pos - seg, pass + 1, out, err) != 0 || tokens_reserve(out, 1, err) != 0)
            return -1;
        out->ids[out->n++] = a->id;
        pos += a->len;
        seg = pos;
    }
    return encode_pass(t, s + seg, len - seg, pass + 1, out, err);
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
    return t->scan_added ? encode_pass(t, s, len, 0, out, err) : encode_text(t, s, len, out, err);
}
