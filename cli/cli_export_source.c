/*
 * cli/cli_export_source.c - what `wlbtrain export` takes from the model a run started from
 * (cli_export.h): bos and eos ids, the dtype, generation_config.json and the tokenizer files.
 *
 * Why: without bos_token_id and eos_token_id transformers takes LlamaConfig's 1 and 2 (in Llama 3's
 * vocabulary 2 is "#", and generation never stops); without the tokenizer files AutoTokenizer cannot
 * load the folder; a model that came in bfloat16 should go back in bfloat16.
 */
#include "cli/cli_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/fileio.h"
#include "util/jsonfile.h"

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *join(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    if (p)
        sprintf(p, "%s/%s", dir, name);
    return p;
}

/* The folder of a path ("." for a bare name). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    char *d = strndup(path, (size_t)(slash - path));
    if (d && !*d) {
        free(d);
        d = strdup("/");
    }
    return d;
}

static json_t *load_json(const char *path, Error *err)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        error_set(err, path, "not JSON: line %d: %s", je.line, je.text);
    else if (!json_is_object(j)) {
        json_decref(j);
        j = NULL;
        error_set(err, path, "not a JSON object");
    }
    return j;
}

/* An id of the tokenizer's added tokens whose content is one of names (in order of preference). */
static json_t *added_token(json_t *tok, const char *const *names)
{
    json_t *added = json_object_get(tok, "added_tokens");
    for (const char *const *n = names; *n; n++) {
        size_t i;
        json_t *t;
        json_array_foreach(added, i, t)
        {
            json_t *c = json_object_get(t, "content"), *id = json_object_get(t, "id");
            if (json_is_string(c) && !strcmp(json_string_value(c), *n) && json_is_integer(id))
                return json_integer(json_integer_value(id));
        }
    }
    return NULL;
}

/* The content of the added token with this id ("" when none). */
static const char *token_text(json_t *tok, json_int_t id)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, t)
    {
        json_t *c = json_object_get(t, "content"), *tid = json_object_get(t, "id");
        if (json_is_string(c) && json_is_integer(tid) && json_integer_value(tid) == id)
            return json_string_value(c);
    }
    return "";
}

static int is_token_id(json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0;
    if (!json_is_array(v) || !json_array_size(v))
        return 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) if (!json_is_integer(e) || json_integer_value(e) < 0) return 0;
    return 1;
}

int export_source_open(ExportSource *s, const Config *cfg, const char *init_from, Error *err)
{
    memset(s, 0, sizeof *s);
    s->dtype = cfg->train.precision == PRECISION_BF16 ? "bfloat16" : "float32";
    struct stat st;
    json_t *conf = NULL, *tok = NULL;
    int rc = 0;
    if (init_from && stat(init_from, &st) == 0 && S_ISDIR(st.st_mode)) {
        s->folder = strdup(init_from);
        char *path = join(init_from, "config.json");
        rc = s->folder && path ? 0 : error_runtime(err, "export", "out of memory");
        if (rc == 0 && is_file(path) && !(conf = load_json(path, err)))
            rc = -1;
        free(path);
        /* data.tokenizer, when set, names the tokenizer the data was made with: it wins. */
        char *tj = rc == 0 && !cfg->data.tokenizer ? join(init_from, "tokenizer.json") : NULL;
        if (tj && is_file(tj))
            s->tokenizer = tj;
        else
            free(tj);
    }
    if (rc == 0 && cfg->data.tokenizer) {
        if (!is_file(cfg->data.tokenizer))
            rc = error_set(err, cfg->data.tokenizer, "data.tokenizer: no such file (the tokenizer.json to export)");
        else if (!(s->tokenizer = strdup(cfg->data.tokenizer)))
            rc = error_runtime(err, "export", "out of memory");
    }
    if (rc == 0 && s->tokenizer && !(tok = load_json(s->tokenizer, err)))
        rc = -1;
    if (rc == 0 && conf) {
        json_t *b = json_object_get(conf, "bos_token_id"), *e = json_object_get(conf, "eos_token_id");
        if (is_token_id(b)) {
            s->bos = json_deep_copy(b);
            s->bos_from = "the model folder's config.json";
        }
        if (is_token_id(e)) {
            s->eos = json_deep_copy(e);
            s->eos_from = "the model folder's config.json";
        }
        json_t *d = json_object_get(conf, "torch_dtype");
        if (!json_is_string(d))
            d = json_object_get(conf, "dtype");
        if (json_is_string(d) && !strcmp(json_string_value(d), "float32"))
            s->dtype = "float32";
        else if (json_is_string(d) && (!strcmp(json_string_value(d), "bfloat16") ||
                                       !strcmp(json_string_value(d), "float16")))
            s->dtype = "bfloat16"; /* float16 has no exponent range for training's weights: bfloat16 */
    }
    if (rc == 0 && tok) {
        static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>", NULL};
        static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", NULL};
        if (!s->bos && (s->bos = added_token(tok, bos_names)))
            s->bos_from = "the tokenizer";
        if (!s->eos && (s->eos = added_token(tok, eos_names)))
            s->eos_from = "the tokenizer";
    }
    if (rc == 0 && cfg->model.vocab_size == 128256) { /* Llama 3's vocabulary: its special tokens */
        if (!s->bos && (s->bos = json_integer(128000)))
            s->bos_from = "Llama 3's vocabulary";
        if (!s->eos && (s->eos = json_integer(128001)))
            s->eos_from = "Llama 3's vocabulary";
    }
    /* A special token outside the model's vocabulary: the tokenizer (or config.json) of another model. */
    json_t *ids[2] = {s->bos, s->eos};
    const char *names[2] = {"bos", "eos"}, *from[2] = {s->bos_from, s->eos_from};
    for (int i = 0; rc == 0 && i < 2; i++) {
        json_t *one = ids[i];
        for (size_t k = 0; rc == 0 && one && k < (json_is_array(one) ? json_array_size(one) : 1); k++) {
            json_int_t id = json_integer_value(json_is_array(one) ? json_array_get(one, k) : one);
            if (id >= cfg->model.vocab_size)
                rc = error_set(err, !strcmp(from[i], "the tokenizer") ? s->tokenizer
                                    : s->folder && strstr(from[i], "config.json") ? s->folder : "export",
                               "the %s token id %lld (from %s) is outside the model's vocabulary of %lld: the "
                               "tokenizer or config.json of another model?", names[i], (long long)id, from[i],
                               (long long)cfg->model.vocab_size);
        }
    }
    json_decref(conf);
    json_decref(tok);
    if (rc != 0)
        export_source_free(s);
    return rc;
}

void export_source_free(ExportSource *s)
{
    free(s->folder);
    free(s->tokenizer);
    json_decref(s->bos);
    json_decref(s->eos);
    memset(s, 0, sizeof *s);
}

/* Copies src to dst byte for byte, atomically. */
static int copy_file(const char *src, const char *dst, Error *err)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        return error_errno(err, src, "cannot open");
    AtomicFile a;
    if (atomic_open(&a, dst, err) != 0) {
        fclose(in);
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    int bad = 0;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0)
        bad = fwrite(buf, 1, n, a.f) != n;
    int read_failed = ferror(in);
    fclose(in);
    if (bad || read_failed) {
        atomic_abort(&a);
        return error_runtime(err, bad ? dst : src, bad ? "cannot write" : "cannot read");
    }
    return atomic_commit(&a, err);
}

static void note(char *written, size_t size, const char *name)
{
    size_t n = strlen(written);
    snprintf(written + n, size - n, "%s%s", n ? ", " : "", name);
}

/* A tokenizer_config.json for a folder that has only tokenizer.json: the fast tokenizer over it,
 * with the bos and eos tokens' text. */
static int write_tokenizer_config(const ExportSource *s, const Config *cfg, const char *path, Error *err)
{
    json_t *tok = load_json(s->tokenizer, err);
    if (!tok)
        return -1;
    json_t *j = json_pack("{s:s, s:I, s:b}", "tokenizer_class", "PreTrainedTokenizerFast", "model_max_length",
                          (json_int_t)cfg->model.max_seq_len, "clean_up_tokenization_spaces", 0);
    json_t *ids[2] = {s->bos, s->eos};
    const char *keys[2] = {"bos_token", "eos_token"};
    for (int i = 0; j && i < 2; i++) {
        json_t *id = json_is_array(ids[i]) ? json_array_get(ids[i], 0) : ids[i];
        const char *text = id ? token_text(tok, json_integer_value(id)) : "";
        if (*text)
            json_object_set_new(j, keys[i], json_string(text));
    }
    int rc = j ? json_file_write(path, j, JSON_INDENT(2) | JSON_SORT_KEYS, err)
               : error_runtime(err, path, "out of memory");
    json_decref(j);
    json_decref(tok);
    return rc;
}

int export_write_source_files(const ExportSource *s, const Config *cfg, const char *out, char *written,
                              size_t size, Error *err)
{
    written[0] = '\0';
    char src[4400], dst[4400];
    int rc = 0;
    snprintf(src, sizeof src, "%s/generation_config.json", s->folder ? s->folder : "");
    snprintf(dst, sizeof dst, "%s/generation_config.json", out);
    if (s->folder && is_file(src)) {
        rc = copy_file(src, dst, err);
        note(written, size, "generation_config.json (the model folder's)");
    } else if (s->eos) {
        json_t *g = json_pack("{s:b}", "_from_model_config", 1);
        if (g && s->bos)
            json_object_set(g, "bos_token_id", s->bos);
        if (g)
            json_object_set(g, "eos_token_id", s->eos);
        rc = g ? json_file_write(dst, g, JSON_INDENT(2) | JSON_SORT_KEYS, err)
               : error_runtime(err, dst, "out of memory");
        json_decref(g);
        note(written, size, "generation_config.json");
    }
    if (rc != 0 || !s->tokenizer)
        return rc;
    char *dir = dir_of(s->tokenizer);
    if (!dir)
        return error_runtime(err, "export", "out of memory");
    snprintf(dst, sizeof dst, "%s/tokenizer.json", out);
    rc = copy_file(s->tokenizer, dst, err);
    note(written, size, "tokenizer.json");
    const char *beside[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (int i = 0; rc == 0 && i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", dir, beside[i]);
        snprintf(dst, sizeof dst, "%s/%s", out, beside[i]);
        if (is_file(src)) {
            rc = copy_file(src, dst, err);
            note(written, size, beside[i]);
        } else if (i == 0) {
            rc = write_tokenizer_config(s, cfg, dst, err);
            note(written, size, "tokenizer_config.json (made)");
        }
    }
    free(dir);
    return rc;
}
