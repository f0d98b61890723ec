/*
 * data/data_tokenizer_hf.c - a Hugging Face tokenizer.json (byte-level BPE) read into the tables of
 * data_tokenizer_impl.h, so that data_tokenizer_encode gives the tokenizers library's ids.
 *
 * What is read, and how it maps onto the tiktoken-style tokenizer:
 *   model.vocab    {"token": id}: the ordinary tokens. Keys are byte-level strings (GPT-2's
 *                  bytes_to_unicode: every byte is one printable character, so "Ġthe" is " the");
 *                  they are decoded to bytes and must use ids 0..n-1, each once, and every single
 *                  byte must be a token. Token id = rank.
 *   model.merges   ["a b", ...] or [["a", "b"], ...]: the pairs that merge, the earlier first. The
 *                  library merges the adjacent pair with the lowest index in this list (leftmost on
 *                  ties), not the pair whose result has the lowest id as tiktoken does, so the pair
 *                  table holds the index as the priority and merge_result the token made (the two
 *                  orders agree on Llama 3's and GPT-2's files, but nothing needs them to). A later
 *                  duplicate of a pair replaces the earlier one, as in the library's hash map.
 *   model.ignore_merges  true: a piece that is a token is that token (tiktoken's whole-piece rule).
 *   pre_tokenizer  ByteLevel (GPT-2's regex when use_regex), or a Sequence of a Split (a Regex or a
 *                  String, behavior Isolated) and a ByteLevel with use_regex false (Llama 3). The
 *                  regex is Oniguruma's syntax; data_tok_compile_regex translates it to PCRE2.
 *   added_tokens   text that stands for one id, split off before the pre-tokenizer
 *                  (data_tokenizer_encode.c encode_pass). Special ones only when specials are matched.
 *                  Their ids must be the ones the library gives them: a token in model.vocab its
 *                  vocab id, any other the next id after the vocabulary and the added tokens before.
 * Anything else the library would apply (a normalizer, add_prefix_space, a Split behavior other than
 * Isolated, dropout, subword prefixes) is refused with an error naming the key, never ignored.
 *
 * Special tokens for convert:
 *   BOS  on by default when the library's encode would add one: the post_processor's template
 *        starts with a special token (Llama 3: <|begin_of_text|>; unless a tokenizer_config.json
 *        beside the file says add_bos_token: false), or that tokenizer_config.json says
 *        add_bos_token: true (its bos_token is the token then).
 *   EOS  tokenizer_config.json's eos_token when it is there; else the template's last special token;
 *        else the special added token <|end_of_text|>, <|endoftext|>, </s> or <eos>; else none.
 */
#include "data/data_tokenizer_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/fileio.h"

/* GPT-2's pattern, which the ByteLevel pre-tokenizer uses when use_regex is true. */
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* End-of-text tokens known by name, for a file with no tokenizer_config.json beside it. */
static const char *const eos_names[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};

enum { BYTE_LEVEL_CHARS = 324 }; /* bytes_to_unicode's characters are below U+0144 */

typedef struct HfRead {
    DataTokenizer *t;
    const char *path;
    const char **keys;      /* keys[id]: the vocab key of ordinary token id (strings of the JSON) */
    int16_t byte_of[BYTE_LEVEL_CHARS]; /* byte-level character -> byte, -1 for none */
    unsigned char *scratch; /* decoded bytes of one or two keys */
    size_t scratch_cap;
} HfRead;

/* s shown in an error message: at most 60 bytes, control characters as '?', so the message stays
 * one line. */
static const char *shown(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (; s[n] && n + 4 < size && n < 60; n++)
        buf[n] = (unsigned char)s[n] < 0x20 || s[n] == 0x7f ? '?' : s[n];
    if (s[n])
        buf[n++] = '.', buf[n++] = '.', buf[n++] = '.';
    buf[n] = '\0';
    return buf;
}

/* GPT-2's bytes_to_unicode, inverted: the printable bytes ('!'..'~', U+00A1..U+00AC,
 * U+00AE..U+00FF) are their own character; the other 68 bytes, in order, are U+0100, U+0101, ... */
static void byte_level_inverse(int16_t *byte_of)
{
    for (int c = 0; c < BYTE_LEVEL_CHARS; c++)
        byte_of[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_of[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* Decodes the byte-level string s (UTF-8, len bytes) into out (room for len bytes); returns the
 * number of bytes, or -1 when a character is not one of the 256 byte-level characters. */
static long byte_level_decode(const HfRead *r, const char *s, size_t len, unsigned char *out)
{
    long m = 0;
    for (size_t i = 0; i < len;) {
        unsigned c = (unsigned char)s[i], cp;
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < len) {
            cp = (c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= BYTE_LEVEL_CHARS || r->byte_of[cp] < 0)
            return -1;
        out[m++] = (unsigned char)r->byte_of[cp];
    }
    return m;
}

static int scratch_reserve(HfRead *r, size_t n, Error *err)
{
    if (n <= r->scratch_cap)
        return 0;
    unsigned char *p = realloc(r->scratch, n);
    if (!p)
        return error_runtime(err, r->path, "out of memory");
    r->scratch = p;
    r->scratch_cap = n;
    return 0;
}

/* The id of the vocab key s, DATA_TOK_NONE when it is not one. */
static uint32_t key_id(HfRead *r, const char *s, Error *err, int *failed)
{
    size_t len = strlen(s);
    *failed = 0;
    if (scratch_reserve(r, len + 1, err) != 0) {
        *failed = 1;
        return DATA_TOK_NONE;
    }
    long m = byte_level_decode(r, s, len, r->scratch);
    if (m <= 0)
        return DATA_TOK_NONE;
    return data_tok_lookup(r->t, r->scratch, (size_t)m);
}

/* A JSON key that must be null or absent, or false / 0 / "" (the setting is off). */
static int off(const json_t *v)
{
    return !v || json_is_null(v) || json_is_false(v) || (json_is_number(v) && json_number_value(v) == 0.0) ||
           (json_is_string(v) && json_string_length(v) == 0);
}

static int read_model_options(HfRead *r, const json_t *model, Error *err)
{
    const json_t *type = json_object_get(model, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0)
        return error_set(err, r->path, "model.type: expected \"BPE\" (a byte-level BPE tokenizer), got %s",
                         json_is_string(type) ? json_string_value(type) : "no string");
    static const char *const must_be_off[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < sizeof must_be_off / sizeof *must_be_off; k++)
        if (!off(json_object_get(model, must_be_off[k])))
            return error_set(err, r->path, "model.%s is set: not supported (only null)", must_be_off[k]);
    const json_t *im = json_object_get(model, "ignore_merges");
    if (im && !json_is_boolean(im))
        return error_set(err, r->path, "model.ignore_merges: expected true or false");
    r->t->whole_piece_lookup = json_is_true(im);
    return 0;
}

/* model.vocab -> t->bytes, offsets, n_ranks and the bytes table. */
static int read_vocab(HfRead *r, const json_t *model, Error *err)
{
    DataTokenizer *t = r->t;
    const json_t *vocab = json_object_get(model, "vocab");
    char b1[80];
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return error_set(err, r->path, "model.vocab: expected an object {\"token\": id, ...}");
    size_t n = json_object_size(vocab);
    if (n >= (size_t)INT32_MAX - 1024)
        return error_set(err, r->path, "model.vocab: too many tokens");
    r->keys = calloc(n, sizeof *r->keys);
    if (!r->keys)
        return error_runtime(err, r->path, "out of memory");
    size_t total = 0;
    const char *key;
    const json_t *v;
    json_object_foreach ((json_t *)vocab, key, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || (size_t)id >= n)
            return error_set(err, r->path, "model.vocab: \"%s\": expected an id in 0..%zu (ids are 0, 1, 2, ... with "
                             "no gap)", shown(key, b1, sizeof b1), n - 1);
        if (r->keys[id])
            return error_set(err, r->path, "model.vocab: id %lld is given twice", (long long)id);
        r->keys[id] = key;
        total += strlen(key);
    }
    t->bytes = malloc(total ? total : 1);
    t->offsets = malloc((n + 1) * sizeof *t->offsets);
    if (!t->bytes || !t->offsets)
        return error_runtime(err, r->path, "out of memory");
    uint64_t used = 0;
    for (size_t id = 0; id < n; id++) {
        long m = byte_level_decode(r, r->keys[id], strlen(r->keys[id]), t->bytes + used);
        if (m <= 0)
            return error_set(err, r->path, "model.vocab: \"%s\" (id %zu) is not a byte-level token (GPT-2's "
                             "byte-to-character map)", shown(r->keys[id], b1, sizeof b1), id);
        t->offsets[id] = used;
        used += (uint64_t)m;
    }
    t->offsets[n] = used;
    t->n_ranks = (uint32_t)n;
    return data_tok_build_token_table(t, r->path, err);
}

/* One merge: the two token strings of entry i. */
static int merge_parts(HfRead *r, const json_t *m, size_t i, const char **a, const char **b, char *buf,
                       size_t size, Error *err)
{
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        return 0;
    }
    const char *s = json_is_string(m) ? json_string_value(m) : NULL;
    const char *sp = s ? strchr(s, ' ') : NULL;
    if (!sp || strchr(sp + 1, ' ') || (size_t)(sp - s) + 1 >= size)
        return error_set(err, r->path, "model.merges[%zu]: expected \"A B\" (one space) or [\"A\", \"B\"]", i);
    memcpy(buf, s, (size_t)(sp - s));
    buf[sp - s] = '\0';
    *a = buf;
    *b = sp + 1;
    return 0;
}

/* model.merges -> the pair table (priority = index) and merge_result. */
static int read_merges(HfRead *r, const json_t *model, Error *err)
{
    DataTokenizer *t = r->t;
    const json_t *merges = json_object_get(model, "merges");
    char b1[80], b2[80];
    if (!json_is_array(merges))
        return error_set(err, r->path, "model.merges: expected an array");
    size_t n = json_array_size(merges);
    if (n >= UINT32_MAX / 4)
        return error_set(err, r->path, "model.merges: too many merges");
    uint64_t cap = 1024;
    int bits = 10;
    while (cap < 2 * (uint64_t)n)
        cap *= 2, bits++;
    t->pair_slots = malloc(cap * sizeof *t->pair_slots);
    t->merge_result = malloc((n ? n : 1) * sizeof *t->merge_result);
    if (!t->pair_slots || !t->merge_result)
        return error_runtime(err, r->path, "out of memory");
    memset(t->pair_slots, 0xFF, cap * sizeof *t->pair_slots);
    t->pair_mask = cap - 1;
    t->pair_shift = 64 - bits;
    char *left = NULL;
    size_t left_cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const json_t *m = json_array_get(merges, i);
        size_t need = json_is_string(m) ? json_string_length(m) + 1 : 1;
        if (need > left_cap) {
            char *p = realloc(left, need);
            if (!p) {
                rc = error_runtime(err, r->path, "out of memory");
                break;
            }
            left = p;
            left_cap = need;
        }
        const char *a = NULL, *b = NULL;
        if ((rc = merge_parts(r, m, i, &a, &b, left, left_cap, err)) != 0)
            break;
        int failed;
        uint32_t ia = key_id(r, a, err, &failed);
        uint32_t ib = failed ? DATA_TOK_NONE : key_id(r, b, err, &failed);
        if (failed) {
            rc = -1;
            break;
        }
        if (ia == DATA_TOK_NONE || ib == DATA_TOK_NONE) {
            rc = error_set(err, r->path, "model.merges[%zu]: \"%s\" is not in model.vocab", i,
                           shown(ia == DATA_TOK_NONE ? a : b, b1, sizeof b1));
            break;
        }
        /* The token made: the bytes of a, then of b. */
        size_t la = t->offsets[ia + 1] - t->offsets[ia], lb = t->offsets[ib + 1] - t->offsets[ib];
        if ((rc = scratch_reserve(r, la + lb, err)) != 0)
            break;
        memcpy(r->scratch, t->bytes + t->offsets[ia], la);
        memcpy(r->scratch + la, t->bytes + t->offsets[ib], lb);
        uint32_t made = data_tok_lookup(t, r->scratch, la + lb);
        if (made == DATA_TOK_NONE) {
            rc = error_set(err, r->path, "model.merges[%zu]: \"%s\" + \"%s\" is not in model.vocab", i,
                           shown(a, b1, sizeof b1), shown(b, b2, sizeof b2));
            break;
        }
        t->merge_result[i] = made;
        uint64_t k = data_tok_pair_slot(t, ia, ib);
        while (t->pair_slots[k].a != DATA_TOK_NONE && !(t->pair_slots[k].a == ia && t->pair_slots[k].b == ib))
            k = (k + 1) & t->pair_mask;
        t->pair_slots[k] = (DataTokPairSlot){ia, ib, (uint32_t)i};
    }
    free(left);
    return rc;
}

/* The pre_tokenizer -> *regex (Oniguruma syntax, malloc'd). */
static int read_pre_tokenizer(HfRead *r, const json_t *root, char **regex, Error *err)
{
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    const json_t *one[1] = {pt};
    const json_t *const *list = one;
    size_t n = 1;
    const json_t *type = json_object_get(pt, "type");
    if (!json_is_object(pt) || !json_is_string(type))
        return error_set(err, r->path, "pre_tokenizer: expected an object with a \"type\" (ByteLevel, or a Sequence "
                         "of a Split and a ByteLevel)");
    const json_t *seq = NULL;
    if (!strcmp(json_string_value(type), "Sequence")) {
        seq = json_object_get(pt, "pretokenizers");
        if (!json_is_array(seq) || json_array_size(seq) == 0)
            return error_set(err, r->path, "pre_tokenizer.pretokenizers: expected a non-empty array");
        n = json_array_size(seq);
    }
    int byte_level = 0;
    *regex = NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = seq ? json_array_get(seq, i) : list[i];
        const json_t *ty = json_object_get(p, "type");
        const char *name = json_is_string(ty) ? json_string_value(ty) : "";
        char where[64];
        snprintf(where, sizeof where, seq ? "pre_tokenizer.pretokenizers[%zu]" : "pre_tokenizer", i);
        if (!strcmp(name, "ByteLevel")) {
            const json_t *use_regex = json_object_get(p, "use_regex");
            if (!off(json_object_get(p, "add_prefix_space")))
                return error_set(err, r->path, "%s: add_prefix_space true is not supported", where);
            if (byte_level)
                return error_set(err, r->path, "%s: a second ByteLevel is not supported", where);
            byte_level = 1;
            if (!use_regex || json_is_true(use_regex)) {
                if (*regex)
                    return error_set(err, r->path, "%s: a second split (ByteLevel's regex after a Split) is not "
                                     "supported", where);
                if (!(*regex = strdup(gpt2_regex)))
                    return error_runtime(err, r->path, "out of memory");
            }
        } else if (!strcmp(name, "Split")) {
            const json_t *pat = json_object_get(p, "pattern");
            const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
            const json_t *behavior = json_object_get(p, "behavior");
            if (*regex || byte_level)
                return error_set(err, r->path, "%s: only one Split, before the ByteLevel, is supported", where);
            if (!json_is_string(behavior) || strcmp(json_string_value(behavior), "Isolated") != 0)
                return error_set(err, r->path, "%s.behavior: only \"Isolated\" is supported", where);
            if (!off(json_object_get(p, "invert")))
                return error_set(err, r->path, "%s.invert: only false is supported", where);
            if (json_is_string(re) && json_string_length(re) > 0) {
                if (!(*regex = strdup(json_string_value(re))))
                    return error_runtime(err, r->path, "out of memory");
            } else if (json_is_string(str) && json_string_length(str) > 0) {
                /* A literal: every character that is not a letter or digit escaped. */
                const char *s = json_string_value(str);
                char *q = malloc(2 * strlen(s) + 1);
                if (!(*regex = q))
                    return error_runtime(err, r->path, "out of memory");
                for (; *s; s++) {
                    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                          (unsigned char)*s >= 0x80))
                        *q++ = '\\';
                    *q++ = *s;
                }
                *q = '\0';
            } else {
                return error_set(err, r->path, "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}",
                                 where);
            }
        } else {
            return error_set(err, r->path, "%s: type \"%s\" is not supported (ByteLevel, or a Sequence of a Split "
                             "and a ByteLevel)", where, name);
        }
    }
    if (!byte_level)
        return error_set(err, r->path, "pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)");
    if (!*regex)
        return error_set(err, r->path, "pre_tokenizer: no regex (a ByteLevel with use_regex false needs a Split "
                         "before it)");
    return 0;
}

/* The id of token text s: an added token's, else a vocab key's; -1 when neither. */
static int64_t token_id(HfRead *r, const char *s, Error *err, int *failed)
{
    for (size_t i = 0; i < r->t->n_added; i++)
        if (!strcmp(r->t->added[i].text, s)) {
            *failed = 0;
            return r->t->added[i].id;
        }
    uint32_t id = key_id(r, s, err, failed);
    return id == DATA_TOK_NONE ? -1 : (int64_t)id;
}

static int read_added(HfRead *r, const json_t *root, Error *err)
{
    DataTokenizer *t = r->t;
    const json_t *added = json_object_get(root, "added_tokens");
    char b1[80];
    t->vocab = t->n_ranks;
    if (!added || json_is_null(added))
        return 0;
    if (!json_is_array(added))
        return error_set(err, r->path, "added_tokens: expected an array");
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return error_runtime(err, r->path, "out of memory");
    int64_t next_id = t->n_ranks; /* the id the library gives the next added token not in the vocab */
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX - 1 ||
            !json_is_string(content) || json_string_length(content) == 0 ||
            strlen(json_string_value(content)) != json_string_length(content))
            return error_set(err, r->path, "added_tokens[%zu]: expected {\"id\": ID >= 0, \"content\": \"TEXT\", ...} "
                             "(text not empty, no NUL)", i);
        const char *text = json_string_value(content);
        int32_t tid = (int32_t)json_integer_value(id);
        for (size_t k = 0; k < t->n_added; k++)
            if (t->added[k].id == tid || !strcmp(t->added[k].text, text))
                return error_set(err, r->path, "added_tokens[%zu]: \"%s\" or id %d is given twice", i,
                                 shown(text, b1, sizeof b1), tid);
        int failed;
        uint32_t in_vocab = key_id(r, text, err, &failed);
        if (failed)
            return -1;
        if ((in_vocab != DATA_TOK_NONE && in_vocab != (uint32_t)tid) ||
            (in_vocab == DATA_TOK_NONE && (uint32_t)tid < t->n_ranks))
            return error_set(err, r->path, "added_tokens[%zu]: \"%s\" has id %d, but model.vocab %s", i,
                             shown(text, b1, sizeof b1), tid,
                             in_vocab != DATA_TOK_NONE ? "gives it another id" : "has another token at that id");
        /* The library does not take the id of a token that is not in model.vocab from the file: it
         * gives it the next one (the vocabulary's size, then one past the largest added id so far),
         * in the file's order. A file whose ids differ would encode with other ids than it says. */
        if (in_vocab == DATA_TOK_NONE && tid != next_id)
            return error_set(err, r->path, "added_tokens[%zu]: \"%s\" has id %d, but the tokenizers library gives "
                             "it %lld (an added token not in model.vocab takes the next id, in the file's order)", i,
                             shown(text, b1, sizeof b1), tid, (long long)next_id);
        const json_t *special = json_object_get(a, "special"), *normalized = json_object_get(a, "normalized");
        DataTokAdded *d = &t->added[t->n_added];
        d->id = tid;
        d->len = strlen(text);
        d->special = json_is_true(special);
        /* The library's default: special tokens are matched in the raw text, others normalized. */
        d->normalized = normalized ? json_is_true(normalized) : !d->special;
        d->strips = !off(json_object_get(a, "lstrip")) || !off(json_object_get(a, "rstrip")) ||
                    !off(json_object_get(a, "single_word"));
        if (!(d->text = strdup(text)))
            return error_runtime(err, r->path, "out of memory");
        t->n_added++;
        if (!d->special && d->strips)
            return error_set(err, r->path, "added_tokens[%zu]: \"%s\": lstrip, rstrip or single_word is not "
                             "supported", i, shown(text, b1, sizeof b1));
        t->added_first[(unsigned char)text[0]] = 1;
        t->scan_added |= !d->special;
        if (tid >= t->vocab)
            t->vocab = (int64_t)tid + 1;
        if ((int64_t)tid + 1 > next_id)
            next_id = (int64_t)tid + 1;
    }
    return 0;
}

/* A token named in a template item {"SpecialToken": {"id": NAME}}: its id, -1 when the item is not
 * one; -2 on error. */
static int64_t template_token(HfRead *r, const json_t *proc, const json_t *item, Error *err)
{
    const json_t *name = json_object_get(json_object_get(item, "SpecialToken"), "id");
    if (!json_is_string(name))
        return -1;
    const json_t *ids = json_object_get(json_object_get(json_object_get(proc, "special_tokens"),
                                                        json_string_value(name)), "ids");
    if (json_is_array(ids) && json_array_size(ids) == 1 && json_is_integer(json_array_get(ids, 0)))
        return json_integer_value(json_array_get(ids, 0));
    int failed;
    int64_t id = token_id(r, json_string_value(name), err, &failed);
    if (failed)
        return -2;
    if (id < 0) {
        char b1[80];
        error_set(err, r->path, "post_processor: special token \"%s\" is not a token",
                  shown(json_string_value(name), b1, sizeof b1));
        return -2;
    }
    return id;
}

/* The post_processor's TemplateProcessing (alone or in a Sequence): the special token it puts
 * first and last around a single text, -1 for none. */
static int read_template(HfRead *r, const json_t *root, int64_t *bos, int64_t *eos, Error *err)
{
    const json_t *pp = json_object_get(root, "post_processor");
    const json_t *procs = json_object_get(pp, "processors");
    size_t n = json_is_array(procs) ? json_array_size(procs) : 1;
    *bos = *eos = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_is_array(procs) ? json_array_get(procs, i) : pp;
        const json_t *type = json_object_get(p, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "TemplateProcessing") != 0)
            continue;
        const json_t *single = json_object_get(p, "single");
        size_t m = json_is_array(single) ? json_array_size(single) : 0;
        if (m < 2)
            continue;
        *bos = template_token(r, p, json_array_get(single, 0), err);
        *eos = template_token(r, p, json_array_get(single, m - 1), err);
        if (*bos == -2 || *eos == -2)
            return -1;
    }
    return 0;
}

/* A token of tokenizer_config.json: "bos_token": "TEXT" or {"content": "TEXT", ...}; -1 when
 * absent or null; -2 on error. */
static int64_t config_token(HfRead *r, const char *cfg_path, const json_t *cfg, const char *key, Error *err)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!v || json_is_null(v))
        return -1;
    char b1[80];
    if (!json_is_string(v)) {
        error_set(err, cfg_path, "%s: expected a string or {\"content\": \"...\"}", key);
        return -2;
    }
    int failed;
    int64_t id = token_id(r, json_string_value(v), err, &failed);
    if (failed)
        return -2;
    if (id < 0) {
        error_set(err, cfg_path, "%s: \"%s\" is not a token of %s", key, shown(json_string_value(v), b1, sizeof b1),
                  r->path);
        return -2;
    }
    return id;
}

/* BOS and EOS from the template, tokenizer_config.json beside the file, or the known names. */
static int read_specials(HfRead *r, const json_t *root, Error *err)
{
    DataTokenizer *t = r->t;
    int64_t tbos, teos;
    if (read_template(r, root, &tbos, &teos, err) != 0)
        return -1;
    int64_t cbos = -1, ceos = -1;
    int add_bos = -1; /* tokenizer_config.json's add_bos_token: -1 absent */
    const char *slash = strrchr(r->path, '/');
    size_t dir_len = slash ? (size_t)(slash - r->path) + 1 : 0;
    char *cfg_path = malloc(dir_len + sizeof "tokenizer_config.json");
    if (!cfg_path)
        return error_runtime(err, r->path, "out of memory");
    memcpy(cfg_path, r->path, dir_len);
    strcpy(cfg_path + dir_len, "tokenizer_config.json");
    int rc = 0;
    if (access(cfg_path, F_OK) == 0) {
        char *text = NULL;
        size_t len = 0;
        json_error_t je;
        json_t *cfg = NULL;
        if ((rc = file_read_all(cfg_path, &text, &len, err)) == 0 && !(cfg = json_loadb(text, len, 0, &je))) {
            char where[4200];
            snprintf(where, sizeof where, "%s:%d:%d", cfg_path, je.line, je.column);
            rc = error_set(err, where, "bad JSON: %s", je.text);
        } else if (rc == 0 && !json_is_object(cfg)) {
            rc = error_set(err, cfg_path, "expected a JSON object");
        }
        if (rc == 0) {
            const json_t *ab = json_object_get(cfg, "add_bos_token");
            add_bos = json_is_boolean(ab) ? json_is_true(ab) : -1;
            if ((cbos = config_token(r, cfg_path, cfg, "bos_token", err)) == -2 ||
                (ceos = config_token(r, cfg_path, cfg, "eos_token", err)) == -2)
                rc = -1;
        }
        json_decref(cfg);
        free(text);
    }
    free(cfg_path);
    if (rc != 0)
        return -1;
    t->bos = -1;
    if (add_bos != 0 && tbos >= 0)
        t->bos = (int32_t)tbos;
    else if (add_bos == 1 && cbos >= 0)
        t->bos = (int32_t)cbos;
    t->eod = (int32_t)(ceos >= 0 ? ceos : teos);
    for (size_t k = 0; t->eod < 0 && k < sizeof eos_names / sizeof *eos_names; k++)
        for (size_t i = 0; i < t->n_added; i++)
            if (t->added[i].special && !strcmp(t->added[i].text, eos_names[k]))
                t->eod = t->added[i].id;
    return 0;
}

static int read_hf(HfRead *r, const json_t *root, Error *err)
{
    if (!json_is_object(root))
        return error_set(err, r->path, "expected a JSON object (a tokenizer.json)");
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return error_set(err, r->path, "model: expected an object (a tokenizer.json has \"model\": {\"type\": \"BPE\", "
                         "\"vocab\": ..., \"merges\": ...})");
    const json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return error_set(err, r->path, "normalizer: not supported (only null, as in Llama 3's and GPT-2's files)");
    char *regex = NULL;
    int rc = read_model_options(r, model, err);
    if (rc == 0)
        rc = read_pre_tokenizer(r, root, &regex, err);
    if (rc == 0)
        rc = read_vocab(r, model, err);
    if (rc == 0)
        rc = read_merges(r, model, err);
    if (rc == 0)
        rc = read_added(r, root, err);
    if (rc == 0)
        rc = read_specials(r, root, err);
    if (rc == 0) {
        char where[4200];
        snprintf(where, sizeof where, "%s: pre_tokenizer", r->path);
        rc = data_tok_compile_regex(r->t, regex, where, err);
    }
    free(regex);
    return rc;
}

int data_tok_open_hf(DataTokenizer *t, const char *path, const char *text, size_t len, Error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char where[4200];
        snprintf(where, sizeof where, "%s:%d:%d", path, je.line, je.column);
        return error_set(err, where, "bad JSON: %s", je.text);
    }
    HfRead r = {.t = t, .path = path};
    byte_level_inverse(r.byte_of);
    t->bos = t->eod = -1;
    int rc = read_hf(&r, root, err);
    free(r.keys);
    free(r.scratch);
    json_decref(root);
    return rc;
}
