/*
 * data/data_tokenizer.h - text -> token ids, as `wlbtrain convert` needs them.
 *
 * Two kinds of tokenizer:
 *   byte-level  (no ranks file): token id = byte value 0..255, end-of-text 256, vocabulary 257.
 *   tiktoken BPE (a ranks file, each line "BASE64TOKEN RANK"): the text is split into pieces by the
 *               tiktoken pre-tokenizer regex (llama3 or gpt2) and every piece is byte-pair merged
 *               exactly as tiktoken's byte_pair_merge does, so the ids equal tiktoken's
 *               encode_ordinary (special-token text such as "<|end_of_text|>" is ordinary text).
 *   Hugging Face tokenizer.json (a file whose first non-blank byte is '{'; data_tokenizer_hf.c): a
 *               byte-level BPE model (vocab and merges), its pre_tokenizer's regex, its added tokens.
 *               The ids equal the tokenizers library's Tokenizer.encode(text, add_special_tokens=False)
 *               with encode_special_tokens = True (special-token text is ordinary text), or, after
 *               data_tokenizer_match_specials, with encode_special_tokens = False (the library's
 *               default: special-token text is the special token).
 * Special tokens of a ranks file follow from the number of ranks: 128,000 ranks = Llama 3 (specials
 * 128000..128255, begin-of-text <|begin_of_text|> = 128000, end-of-text <|end_of_text|> = 128001,
 * vocabulary 128256); 50,256 ranks = GPT-2 (<|endoftext|> = 50256, vocabulary 50257, no BOS); any
 * other count n: end-of-text n, vocabulary n + 1, no BOS. A tokenizer.json's come from its added
 * tokens, its post_processor and a tokenizer_config.json beside it (data_tokenizer_hf.c).
 *
 * Any byte string is accepted, invalid UTF-8 included: bytes the regex cannot match (only invalid
 * UTF-8) become pieces of their own, so decoding the ids always gives the input back exactly.
 *
 * A DataTokenizer is immutable after open except for its scratch buffers: one tokenizer per thread.
 */
#ifndef WLB_DATA_DATA_TOKENIZER_H
#define WLB_DATA_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct DataTokenizer DataTokenizer;

/* A growable array of token ids; zero-initialize, free with data_tokens_free. */
typedef struct DataTokens {
    int32_t *ids;
    size_t n, cap;
} DataTokens;

void data_tokens_free(DataTokens *t);

/* Opens a tokenizer. ranks_path NULL = byte-level; else a tiktoken ranks file or a tokenizer.json.
 * pattern NULL = by the file (gpt2 for 50,256 ranks, else llama3; a tokenizer.json's own), or
 * "llama3" / "gpt2" to force one (ranks files only). A malformed file is an Error naming it (and
 * the line, or the JSON key) with status 2. Returns NULL on error. */
DataTokenizer *data_tokenizer_open(const char *ranks_path, const char *pattern, Error *err);
void data_tokenizer_close(DataTokenizer *t);

/* Appends the ids of text[0..len) to out (no end-of-text token). Errors only at run time (memory,
 * a regex engine failure). */
int data_tokenizer_encode(DataTokenizer *t, const char *text, size_t len, DataTokens *out, Error *err);

/* The end-of-text token, -1 when the tokenizer names none (a tokenizer.json may not). */
int32_t data_tokenizer_eod(const DataTokenizer *t);
/* The begin-of-text token put first in every document by default: Llama 3's 128000 (ranks file or
 * tokenizer.json), a tokenizer.json's when its post_processor or tokenizer_config.json adds one;
 * -1 for none (byte-level, GPT-2). */
int32_t data_tokenizer_bos(const DataTokenizer *t);
/* The text of special or added token id (such as "<|begin_of_text|>"), NULL when unknown. */
const char *data_tokenizer_special_text(const DataTokenizer *t, int32_t id, size_t *len);
/* From now on special-token text in the input is the special token (tokenizer.json only; an Error
 * with status 2 otherwise, or when an added token has lstrip / rstrip / single_word set). */
int data_tokenizer_match_specials(DataTokenizer *t, Error *err);
int64_t data_tokenizer_vocab_size(const DataTokenizer *t);
/* Number of ordinary (byte-string) tokens: 256 byte-level, else the number of ranks. */
int64_t data_tokenizer_n_ranks(const DataTokenizer *t);
/* "bytes" (byte-level), "llama3", "gpt2" or "tokenizer.json" (another tokenizer.json regex). */
const char *data_tokenizer_pattern(const DataTokenizer *t);

/* The bytes of ordinary token id (length in *len; a non-special added token's text), or NULL for a
 * special token or an id out of range. */
const unsigned char *data_tokenizer_token_bytes(const DataTokenizer *t, int32_t id, size_t *len);
/* The id of the token whose bytes are exactly s[0..len), or -1 when there is none. */
int64_t data_tokenizer_rank(const DataTokenizer *t, const void *s, size_t len);
/* Concatenates the bytes of ids[0..n) into a malloc'd, NUL-terminated buffer (length in *len).
 * A special or out-of-range id is an Error (status 2). */
char *data_tokenizer_decode(const DataTokenizer *t, const int32_t *ids, size_t n, size_t *len, Error *err);

#endif
