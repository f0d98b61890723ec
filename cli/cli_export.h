/*
 * cli/cli_export.h - what `wlbtrain export` knows of the model a run started from (cli_export_source.c):
 * the model folder of train.init_from when it is still there, the tokenizer (data.tokenizer when
 * set, else that folder's), the bos and eos ids, the dtype the weights came in; and the files it writes from
 * them besides config.json and the weights: generation_config.json and the tokenizer files.
 */
#ifndef WLB_CLI_CLI_EXPORT_H
#define WLB_CLI_CLI_EXPORT_H

#include <jansson.h>

#include "config/config.h"
#include "util/error.h"

typedef struct ExportSource {
    char *folder;        /* train.init_from when a model folder that is still there; else NULL */
    char *tokenizer;     /* the tokenizer.json to copy, or NULL */
    json_t *bos, *eos;   /* the token ids (an integer, or for eos a list), or NULL when unknown */
    const char *bos_from, *eos_from; /* where they came from, for the summary line */
    const char *dtype;   /* "bfloat16" or "float32": what the weights came in (for --dtype auto) */
} ExportSource;

/* Reads what cfg's run started from: bos and eos from the folder's config.json, else the
 * tokenizer's added tokens (<|begin_of_text|> / <|end_of_text|>, <s> / </s>, <|endoftext|>), else
 * Llama 3's 128000 / 128001 for its vocabulary of 128256; the dtype from the folder's config.json
 * (torch_dtype or dtype), else bfloat16 for train.precision bf16 and float32 for fp32. An id at or
 * above the model's vocabulary size is an error (the tokenizer of another model).
 * init_from: the checkpoint's train.init_from (the config itself has none: export resolves it
 * without reading the folder). */
int export_source_open(ExportSource *s, const Config *cfg, const char *init_from, Error *err);
void export_source_free(ExportSource *s);

/* generation_config.json (the folder's, else one with the bos and eos ids) and the tokenizer files
 * (tokenizer.json, and tokenizer_config.json, special_tokens_map.json from beside it; a
 * tokenizer_config.json for PreTrainedTokenizerFast when there is none) into out, each atomically.
 * *written gets the names written, comma-separated, for the summary line. */
int export_write_source_files(const ExportSource *s, const Config *cfg, const char *out, char *written,
                              size_t size, Error *err);

#endif
