/*
 * cli/cli_convert.c - `wlbtrain convert`: text files or JSON lines -> a Megatron data set
 * (PREFIX.idx + PREFIX.bin), the format training reads.
 *
 * Each text input is one document; each non-blank line of a JSON-lines input is one document (the
 * string field --json-key). Documents are tokenized (data_tokenizer.h), the begin-of-text token
 * is put first when the tokenizer has one (Llama 3) unless --bos none, the end-of-document token is
 * appended unless --eod none, and each document becomes one sequence of the data set (data_idx.h
 * writer). A document whose text already starts with the BOS token's text gets that as its BOS:
 * one BOS, never two (the double BOS of a chat template's "<|begin_of_text|>" plus the
 * tokenizer's). Inputs are read whole through zlib, so .gz files work as they are.
 *
 * Everything is checked before it can do harm: the token dtype is chosen (or checked) against the
 * vocabulary and the EOD id before anything is written; a bad input (unreadable, empty, malformed
 * JSON, a missing field, a token that does not fit the dtype) stops the conversion with one error
 * naming the file (and line), and the writer is aborted, so a failed convert leaves no PREFIX.idx
 * or PREFIX.bin behind and an existing data set under that prefix untouched. Documents whose text
 * is empty (a JSON "" field) are skipped and counted: a zero-token sequence helps no one.
 *
 * Progress goes to stderr at most once a second (unless --quiet); the summary line to stdout.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/data_idx.h"
#include "data/data_tokenizer.h"
#include "util/fileio.h"

typedef struct Convert {
    const CliConvert *c;
    DataTokenizer *tok;
    DataIdxWriter w;
    DataTokens ids;
    int64_t eod;            /* appended id, or -1 for none */
    int64_t bos;            /* id put first, or -1 for none */
    const char *bos_text;   /* the BOS token's text, NULL when unknown */
    size_t bos_len;
    int dtype;              /* DATA_DTYPE_UINT16 or DATA_DTYPE_INT32 */
    int64_t limit;          /* largest id the dtype holds */
    int check_ids;          /* the vocabulary exceeds the dtype: check every id */
    uint64_t docs, tokens, bytes, empty;
    double t0, last_report;
} Convert;

static double now_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0.0; /* only progress and speed figures use it */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A progress line on stderr, at most one a second. */
static void report(Convert *cv)
{
    if (cv->c->quiet)
        return;
    double t = now_s();
    if (t - cv->last_report < 1.0)
        return;
    cv->last_report = t;
    double mb = (double)cv->bytes / 1e6, dt = t - cv->t0;
    fprintf(stderr, "convert: %llu documents, %llu tokens, %.1f MB of text in %.1f s (%.1f MB/s)\n",
            (unsigned long long)cv->docs, (unsigned long long)cv->tokens, mb, dt, dt > 0 ? mb / dt : 0.0);
}

/* Tokenizes one document's text and adds it; where names it in errors (path or path:line). */
static int add_document(Convert *cv, const char *where, const char *text, size_t len, Error *err)
{
    if (len == 0) {
        cv->empty++;
        return 0;
    }
    cv->ids.n = 0;
    size_t skip = 0;
    if (cv->bos >= 0) {
        if (cv->bos_text && len >= cv->bos_len && !memcmp(text, cv->bos_text, cv->bos_len))
            skip = cv->bos_len; /* the text's own BOS is the BOS */
        DataTokens *o = &cv->ids;
        if (o->cap == 0) {
            if (!(o->ids = malloc(16 * sizeof *o->ids)))
                return error_runtime(err, where, "out of memory");
            o->cap = 16;
        }
        o->ids[o->n++] = (int32_t)cv->bos;
    }
    if (data_tokenizer_encode(cv->tok, text + skip, len - skip, &cv->ids, err) != 0)
        return -1;
    if (cv->check_ids)
        for (size_t i = 0; i < cv->ids.n; i++)
            if (cv->ids.ids[i] > cv->limit)
                return error_set(err, where, "token id %d does not fit --dtype %s (0..%lld); use --dtype int32 "
                                 "or auto", cv->ids.ids[i], cv->c->dtype, (long long)cv->limit);
    if (cv->eod >= 0) {
        /* Room for one more: encode reserved in blocks, but the text may have been one byte. */
        if (cv->ids.n == cv->ids.cap) {
            size_t cap = cv->ids.cap ? 2 * cv->ids.cap : 16;
            int32_t *p = realloc(cv->ids.ids, cap * sizeof *p);
            if (!p)
                return error_runtime(err, where, "out of memory");
            cv->ids.ids = p;
            cv->ids.cap = cap;
        }
        cv->ids.ids[cv->ids.n++] = (int32_t)cv->eod;
    }
    if (data_idx_writer_add(&cv->w, cv->ids.ids, cv->ids.n, err) != 0)
        return -1;
    cv->docs++;
    cv->tokens += cv->ids.n;
    cv->bytes += len;
    report(cv);
    return 0;
}

static int is_jsonl(const CliConvert *c, const char *path)
{
    if (c->format)
        return !strcmp(c->format, "jsonl");
    size_t n = strlen(path);
    return (n >= 6 && !strcmp(path + n - 6, ".jsonl")) || (n >= 9 && !strcmp(path + n - 9, ".jsonl.gz"));
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* One document per non-blank line: the string field c->json_key of a JSON object. */
static int convert_jsonl(Convert *cv, const char *path, const char *data, size_t len, Error *err)
{
    const char *key = cv->c->json_key;
    char where[4200];
    long line = 0, docs = 0;
    for (size_t pos = 0; pos < len;) {
        const char *s = data + pos;
        const char *eol = memchr(s, '\n', len - pos);
        size_t n = eol ? (size_t)(eol - s) : len - pos;
        pos += n + (eol != NULL);
        line++;
        if (blank(s, n))
            continue;
        docs++;
        json_error_t je;
        json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!j) {
            snprintf(where, sizeof where, "%s:%ld:%d", path, line, je.column > 0 ? je.column : 1);
            return error_set(err, where, "bad JSON: %s", je.text);
        }
        snprintf(where, sizeof where, "%s:%ld", path, line);
        int rc;
        json_t *v = json_is_object(j) ? json_object_get(j, key) : NULL;
        if (!json_is_object(j))
            rc = error_set(err, where, "expected a JSON object with a \"%s\" field", key);
        else if (!v)
            rc = error_set(err, where, "no \"%s\" field (choose the field with --json-key)", key);
        else if (!json_is_string(v))
            rc = error_set(err, where, "field \"%s\" is not a string", key);
        else
            rc = add_document(cv, where, json_string_value(v), json_string_length(v), err);
        json_decref(j);
        if (rc != 0)
            return -1;
    }
    if (docs == 0)
        return error_set(err, path, "empty input: no JSON lines");
    return 0;
}

static int convert_input(Convert *cv, const char *path, Error *err)
{
    char *data;
    size_t len;
    if (file_read_all(path, &data, &len, err) != 0)
        return -1;
    int rc;
    if (is_jsonl(cv->c, path))
        rc = convert_jsonl(cv, path, data, len, err);
    else if (len == 0)
        rc = error_set(err, path, "empty input: no text");
    else
        rc = add_document(cv, path, data, len, err);
    free(data);
    return rc;
}

/* Reads all of standard input into a malloc'd NUL-terminated buffer. */
static int read_stdin(char **data, size_t *len, Error *err)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (cap - n < 2) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger)
                break;
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) {
            if (ferror(stdin)) {
                free(buf);
                return error_runtime(err, "--files-from -", "cannot read standard input");
            }
            buf[n] = '\0';
            *data = buf;
            *len = n;
            return 0;
        }
    }
    free(buf);
    return error_runtime(err, "--files-from -", "out of memory");
}

/* The input paths: the positional ones, then the lines of --files-from (blank lines skipped; paths
 * are relative to the current directory). list_buf keeps the strings the array points into. */
static int collect_inputs(const CliConvert *c, char ***paths, size_t *n_paths, char **list_buf, Error *err)
{
    size_t len = 0;
    *list_buf = NULL;
    if (c->files_from) {
        int rc = !strcmp(c->files_from, "-") ? read_stdin(list_buf, &len, err)
                                              : file_read_all(c->files_from, list_buf, &len, err);
        if (rc != 0)
            return -1;
    }
    size_t cap = (size_t)c->n_inputs + 1;
    for (size_t i = 0; i < len; i++)
        cap += (*list_buf)[i] == '\n';
    *paths = malloc(cap * sizeof **paths);
    if (!*paths)
        return error_runtime(err, "convert", "out of memory");
    size_t n = 0;
    for (int i = 0; i < c->n_inputs; i++)
        (*paths)[n++] = c->inputs[i];
    for (char *s = *list_buf, *end = s ? s + len : NULL; s && s < end;) {
        char *eol = memchr(s, '\n', (size_t)(end - s));
        char *next = eol ? eol + 1 : end;
        if (!eol)
            eol = end;
        *eol = '\0';
        if (eol > s && eol[-1] == '\r')
            eol[-1] = '\0';
        if (*s)
            (*paths)[n++] = s;
        s = next;
    }
    if (n == 0)
        return error_set(err, "--files-from", "%s: no input paths in it", c->files_from);
    *n_paths = n;
    return 0;
}

/* Picks the token dtype and the EOD id; checks both against each other before anything is written. */
static int choose_dtype(Convert *cv, Error *err)
{
    const CliConvert *c = cv->c;
    cv->eod = c->eod == -1 ? data_tokenizer_eod(cv->tok) : c->eod == -2 ? -1 : c->eod;
    if (c->eod == -1 && cv->eod < 0)
        return error_set(err, "--eod", "%s names no end-of-text token (no tokenizer_config.json eos_token beside it, "
                         "none in its post_processor, no <|end_of_text|>, <|endoftext|>, </s> or <eos>): give --eod "
                         "ID or --eod none", c->tokenizer);
    cv->bos = c->bos == -1 ? data_tokenizer_bos(cv->tok) : c->bos == -2 ? -1 : c->bos;
    if (cv->bos >= 0)
        cv->bos_text = data_tokenizer_special_text(cv->tok, (int32_t)cv->bos, &cv->bos_len);
    int64_t bound = data_tokenizer_vocab_size(cv->tok); /* ids are below this */
    if (cv->eod >= bound)
        bound = cv->eod + 1;
    if (cv->bos >= bound)
        bound = cv->bos + 1;
    if (!strcmp(c->dtype, "uint16") || (!strcmp(c->dtype, "auto") && bound <= 65536)) {
        cv->dtype = DATA_DTYPE_UINT16;
        cv->limit = 65535;
    } else {
        cv->dtype = DATA_DTYPE_INT32;
        cv->limit = INT32_MAX;
    }
    if (cv->eod > cv->limit)
        return error_set(err, "--eod", "id %lld does not fit --dtype %s (0..%lld)", (long long)cv->eod, c->dtype,
                         (long long)cv->limit);
    if (cv->bos > cv->limit)
        return error_set(err, "--bos", "id %lld does not fit --dtype %s (0..%lld)", (long long)cv->bos, c->dtype,
                         (long long)cv->limit);
    cv->check_ids = data_tokenizer_vocab_size(cv->tok) - 1 > cv->limit;
    return 0;
}

static int run(Convert *cv, char **paths, size_t n_paths, Error *err)
{
    const CliConvert *c = cv->c;
    if (c->pattern && !c->tokenizer)
        return error_set(err, "--pattern", "only with --tokenizer (byte-level tokens are not pre-tokenized)");
    cv->tok = data_tokenizer_open(c->tokenizer, c->pattern, err);
    if (!cv->tok)
        return -1;
    if (!strcmp(c->special_tokens, "match") && data_tokenizer_match_specials(cv->tok, err) != 0)
        return -1;
    if (choose_dtype(cv, err) != 0)
        return -1;
    if (data_idx_writer_open(&cv->w, c->out, cv->dtype, err) != 0)
        return -1;
    cv->t0 = cv->last_report = now_s();
    for (size_t i = 0; i < n_paths; i++)
        if (convert_input(cv, paths[i], err) != 0) {
            data_idx_writer_abort(&cv->w);
            return -1;
        }
    if (cv->docs == 0) {
        data_idx_writer_abort(&cv->w);
        return error_set(err, "convert", "no documents: every input text is empty");
    }
    if (data_idx_writer_finish(&cv->w, err) != 0)
        return -1;
    double dt = now_s() - cv->t0, mb = (double)cv->bytes / 1e6;
    char eod[32] = "none", bos[32] = "none";
    if (cv->eod >= 0)
        snprintf(eod, sizeof eod, "%lld", (long long)cv->eod);
    if (cv->bos >= 0)
        snprintf(bos, sizeof bos, "%lld", (long long)cv->bos);
    printf("convert: %llu documents, %llu tokens, dtype %s, vocabulary %lld (%s), bos %s, eod %s -> %s.idx + %s.bin "
           "(%.1f MB of text in %.1f s, %.1f MB/s)",
           (unsigned long long)cv->docs, (unsigned long long)cv->tokens,
           cv->dtype == DATA_DTYPE_UINT16 ? "uint16" : "int32", (long long)data_tokenizer_vocab_size(cv->tok),
           data_tokenizer_pattern(cv->tok), bos, eod, c->out, c->out, mb, dt, dt > 0 ? mb / dt : 0.0);
    if (cv->empty)
        printf("; %llu empty documents skipped", (unsigned long long)cv->empty);
    printf("\n");
    return 0;
}

int cli_convert(const CliConvert *c, Error *err)
{
    Convert cv;
    memset(&cv, 0, sizeof cv);
    cv.c = c;
    char **paths = NULL, *list_buf = NULL;
    size_t n_paths = 0;
    int rc = collect_inputs(c, &paths, &n_paths, &list_buf, err);
    if (rc == 0)
        rc = run(&cv, paths, n_paths, err);
    data_tokens_free(&cv.ids);
    data_tokenizer_close(cv.tok);
    free(paths);
    free(list_buf);
    return rc == 0 ? 0 : (err->status ? err->status : ERROR_RUNTIME);
}
