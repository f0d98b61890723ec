/*
 * config/config_folder.c - the model keys of a Hugging Face model folder (train.init_from naming a
 * directory): its config.json fills the model keys the config leaves unset (origin
 * ORIGIN_MODEL_FOLDER) and must agree with the ones it sets (in the file, by --set or by the
 * preset); a key that differs is one error naming both values.
 *
 * config.json (LlamaConfig) -> model keys:
 *   hidden_size -> d_model, intermediate_size -> d_ffn, num_hidden_layers -> n_layers,
 *   num_attention_heads -> n_heads, num_key_value_heads (default: the heads) -> n_kv_heads,
 *   vocab_size, rms_norm_eps (default 1e-6, LlamaConfig's) -> norm_eps, tie_word_embeddings
 *   (default false) -> tie_embeddings: checked; max_position_embeddings (default 2048) -> max_seq_len:
 *   filled only (a longer context is what continued pretraining is for).
 *   RoPE in either form transformers writes:
 *     transformers 4 (the Hub's Llama 3.1 files): rope_theta, and rope_scaling null or
 *       {rope_type (or type), factor, ...};
 *     transformers 5: rope_parameters {rope_type, rope_theta, factor, ...}.
 *   rope_type default (or none) -> rope_scaling none; llama3 -> factor, low_freq_factor,
 *   high_freq_factor, original_max_position_embeddings; linear -> factor; yarn -> factor (null:
 *   max_position_embeddings / original), original_max_position_embeddings (default
 *   max_position_embeddings), beta_fast (32), beta_slow (1), truncate (true), attention_factor (else
 *   from mscale / mscale_all_dim as transformers does, else 0 = 0.1 ln factor + 1). rope_theta
 *   defaults to 10000 (LlamaConfig's). Only the scaling keys of the folder's rope type are read.
 * Refused: model_type other than llama, hidden_act other than silu, attention or MLP biases,
 * head_dim other than hidden_size / num_attention_heads, partial rotary embeddings, per-layer RoPE,
 * another rope_type.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_keys.h"

/* A model key read from config.json: its value as YAML text for config_key_assign, and the
 * config.json name it came from (for the error). */
typedef struct FolderKey {
    const char *key, *json_name;
    char text[64];
    int check; /* 1: must equal the config's value when that is set; 0: fills only */
} FolderKey;

enum { MAX_FOLDER_KEYS = 24 };

typedef struct FolderKeys {
    FolderKey k[MAX_FOLDER_KEYS];
    int n;
    const char *path;
} FolderKeys;

static void add(FolderKeys *f, const char *key, const char *json_name, int check, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add(FolderKeys *f, const char *key, const char *json_name, int check, const char *fmt, ...)
{
    FolderKey *k = &f->k[f->n++];
    k->key = key;
    k->json_name = json_name;
    k->check = check;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->text, sizeof k->text, fmt, ap);
    va_end(ap);
}

/* The number at name in obj: 1 found (in *v), 0 absent or null, -1 not a number (err set). */
static int get_number(const FolderKeys *f, json_t *obj, const char *name, double *v, Error *err)
{
    json_t *j = json_object_get(obj, name);
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_number(j))
        return error_set(err, f->path, "%s: expected a number", name);
    *v = json_number_value(j);
    return 1;
}

static int get_int(const FolderKeys *f, json_t *obj, const char *name, int required, long long *v, Error *err)
{
    double d;
    int rc = get_number(f, obj, name, &d, err);
    if (rc < 0)
        return -1;
    if (rc == 0)
        return required ? error_set(err, f->path, "no %s (a Llama config.json has it)", name) : 0;
    if (d != floor(d) || fabs(d) > 9e15)
        return error_set(err, f->path, "%s: expected an integer, got %g", name, d);
    *v = (long long)d;
    return 1;
}

static int int_key(FolderKeys *f, json_t *obj, const char *name, const char *key, int check, int required,
                   long long dflt, Error *err)
{
    long long v = dflt;
    if (get_int(f, obj, name, required, &v, err) < 0)
        return -1;
    add(f, key, name, check, "%lld", v);
    return 0;
}

static int float_key(FolderKeys *f, json_t *obj, const char *name, const char *key, int required, double dflt,
                     Error *err)
{
    double v = dflt;
    int rc = get_number(f, obj, name, &v, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && required)
        return error_set(err, f->path, "no %s (a Llama config.json has it)", name);
    char text[40];
    config_format_double(v, text, sizeof text);
    add(f, key, name, 1, "%s", text);
    return 0;
}

static int bool_at(const FolderKeys *f, json_t *obj, const char *name, int dflt, int *v, Error *err)
{
    json_t *j = json_object_get(obj, name);
    *v = dflt;
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_boolean(j))
        return error_set(err, f->path, "%s: expected true or false", name);
    *v = json_is_true(j);
    return 0;
}

/* What wlbtrain's Llama is not: refused rather than trained as something else. */
static int check_architecture(const FolderKeys *f, json_t *root, Error *err)
{
    json_t *j = json_object_get(root, "model_type");
    if (j && !(json_is_string(j) && !strcmp(json_string_value(j), "llama")))
        return error_set(err, f->path, "model_type %s: wlbtrain trains Llama models (model_type llama)",
                         json_is_string(j) ? json_string_value(j) : "(not a string)");
    j = json_object_get(root, "hidden_act");
    if (j && !(json_is_string(j) && !strcmp(json_string_value(j), "silu")))
        return error_set(err, f->path, "hidden_act %s: wlbtrain's MLP is SwiGLU (hidden_act silu)",
                         json_is_string(j) ? json_string_value(j) : "(not a string)");
    const char *biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int on;
        if (bool_at(f, root, biases[i], 0, &on, err) != 0)
            return -1;
        if (on)
            return error_set(err, f->path, "%s true: wlbtrain's Llama has no biases", biases[i]);
    }
    return 0;
}

/* rope_theta and the scaling of whichever form the file has (see the top). */
static int read_rope(FolderKeys *f, json_t *root, long long max_pos, Error *err)
{
    json_t *params = json_object_get(root, "rope_parameters"), *scaling = json_object_get(root, "rope_scaling");
    json_t *rope = json_is_object(params) ? params : json_is_object(scaling) ? scaling : NULL;
    const char *form = rope == params ? "rope_parameters" : "rope_scaling";
    double theta = 10000;
    if (get_number(f, root, "rope_theta", &theta, err) < 0)
        return -1;
    const char *type = "default";
    if (rope) {
        json_t *t = json_object_get(rope, "rope_type");
        if (!t || json_is_null(t))
            t = json_object_get(rope, "type");
        if (t && !json_is_string(t)) {
            /* transformers 5 nests a dict per layer type for models that mix attention kinds */
            return error_set(err, f->path, "%s: a RoPE per layer type (or a rope_type that is not a string); "
                             "wlbtrain's Llama has one", form);
        }
        if (t)
            type = json_string_value(t);
        if (get_number(f, rope, "rope_theta", &theta, err) < 0)
            return -1;
        double partial = 1;
        if (get_number(f, rope, "partial_rotary_factor", &partial, err) < 0)
            return -1;
        if (partial != 1)
            return error_set(err, f->path, "%s.partial_rotary_factor %g: wlbtrain rotates whole heads", form, partial);
    }
    char text[40];
    config_format_double(theta, text, sizeof text);
    add(f, "model.rope_theta", "rope_theta", 1, "%s", text);
    if (!strcmp(type, "default") || !strcmp(type, "none")) {
        add(f, "model.rope_scaling", "rope_type", 1, "none");
        return 0;
    }
    if (strcmp(type, "llama3") && strcmp(type, "linear") && strcmp(type, "yarn"))
        return error_set(err, f->path, "%s.rope_type %s: wlbtrain has RoPE scaling llama3, linear and yarn", form,
                         type);
    add(f, "model.rope_scaling", "rope_type", 1, "%s", type);
    if (!strcmp(type, "linear"))
        return float_key(f, rope, "factor", "model.rope_scaling_factor", 1, 1, err);
    if (!strcmp(type, "llama3")) {
        if (float_key(f, rope, "factor", "model.rope_scaling_factor", 1, 1, err) != 0 ||
            float_key(f, rope, "low_freq_factor", "model.rope_low_freq_factor", 1, 1, err) != 0 ||
            float_key(f, rope, "high_freq_factor", "model.rope_high_freq_factor", 1, 4, err) != 0)
            return -1;
        return int_key(f, rope, "original_max_position_embeddings", "model.rope_original_max_seq_len", 1, 1, 0, err);
    }
    long long original = max_pos; /* yarn */
    if (get_int(f, rope, "original_max_position_embeddings", 0, &original, err) < 0)
        return -1;
    add(f, "model.rope_original_max_seq_len", "original_max_position_embeddings", 1, "%lld", original);
    double factor = (double)max_pos / (double)original, beta_fast = 32, beta_slow = 1, attention = 0, ms = 0,
           ms_all = 0;
    if (get_number(f, rope, "factor", &factor, err) < 0 || get_number(f, rope, "beta_fast", &beta_fast, err) < 0 ||
        get_number(f, rope, "beta_slow", &beta_slow, err) < 0 ||
        get_number(f, rope, "attention_factor", &attention, err) < 0 || get_number(f, rope, "mscale", &ms, err) < 0 ||
        get_number(f, rope, "mscale_all_dim", &ms_all, err) < 0)
        return -1;
    /* transformers: "beta_fast or 32" - a 0 is the default too; attention factor from DeepSeek's
     * mscale pair when it is not given. */
    beta_fast = beta_fast ? beta_fast : 32;
    beta_slow = beta_slow ? beta_slow : 1;
    if (attention == 0 && ms != 0 && ms_all != 0) {
        double num = factor <= 1 ? 1 : 0.1 * ms * log(factor) + 1, den = factor <= 1 ? 1 : 0.1 * ms_all * log(factor) + 1;
        attention = num / den;
    }
    int truncate;
    if (bool_at(f, rope, "truncate", 1, &truncate, err) != 0)
        return -1;
    const struct { const char *key, *name; double v; } floats[] = {
        {"model.rope_scaling_factor", "factor", factor}, {"model.rope_yarn_beta_fast", "beta_fast", beta_fast},
        {"model.rope_yarn_beta_slow", "beta_slow", beta_slow},
        {"model.rope_attention_factor", "attention_factor", attention}};
    for (int i = 0; i < 4; i++) {
        config_format_double(floats[i].v, text, sizeof text);
        add(f, floats[i].key, floats[i].name, 1, "%s", text);
    }
    add(f, "model.rope_yarn_truncate", "truncate", 1, "%s", truncate ? "true" : "false");
    return 0;
}

static int read_folder_keys(FolderKeys *f, json_t *root, Error *err)
{
    if (check_architecture(f, root, err) != 0)
        return -1;
    long long heads = 0, hidden = 0, max_pos = 2048, head_dim = 0;
    if (get_int(f, root, "num_attention_heads", 1, &heads, err) < 0 || get_int(f, root, "hidden_size", 1, &hidden, err) < 0 ||
        get_int(f, root, "max_position_embeddings", 0, &max_pos, err) < 0 ||
        get_int(f, root, "head_dim", 0, &head_dim, err) < 0)
        return -1;
    if (head_dim && heads > 0 && head_dim * heads != hidden)
        return error_set(err, f->path, "head_dim %lld: wlbtrain's heads are hidden_size / num_attention_heads = %lld / "
                         "%lld wide", head_dim, hidden, heads);
    int tied;
    if (int_key(f, root, "hidden_size", "model.d_model", 1, 1, 0, err) != 0 ||
        int_key(f, root, "intermediate_size", "model.d_ffn", 1, 1, 0, err) != 0 ||
        int_key(f, root, "num_hidden_layers", "model.n_layers", 1, 1, 0, err) != 0 ||
        int_key(f, root, "num_attention_heads", "model.n_heads", 1, 1, 0, err) != 0 ||
        int_key(f, root, "num_key_value_heads", "model.n_kv_heads", 1, 0, heads, err) != 0 ||
        int_key(f, root, "vocab_size", "model.vocab_size", 1, 1, 0, err) != 0 ||
        float_key(f, root, "rms_norm_eps", "model.norm_eps", 0, 1e-6, err) != 0 ||
        bool_at(f, root, "tie_word_embeddings", 0, &tied, err) != 0)
        return -1;
    add(f, "model.tie_embeddings", "tie_word_embeddings", 1, "%s", tied ? "true" : "false");
    add(f, "model.max_seq_len", "max_position_embeddings", 0, "%lld", max_pos);
    return read_rope(f, root, max_pos, err);
}

int config_apply_model_folder(Config *cfg, Error *err)
{
    const char *dir = cfg->train.init_from;
    struct stat st;
    if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0; /* a file (or nothing there, which loading reports) */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) /* a FIFO would block the read */
        return error_set(err, path, "not a regular file");
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (stat(path, &st) != 0)
            return error_set(err, path, "no config.json in the model folder train.init_from names (a Hugging Face "
                             "model folder has config.json and its safetensors)");
        return error_set(err, path, "not JSON: line %d: %s", je.line, je.text);
    }
    FolderKeys f = {.n = 0, .path = path};
    int rc = json_is_object(root) ? read_folder_keys(&f, root, err) : error_set(err, path, "not a JSON object");
    json_decref(root);
    Config hf;
    config_init(&hf);
    for (int i = 0; rc == 0 && i < f.n; i++) {
        const FolderKey *fk = &f.k[i];
        int k = config_key_find(fk->key);
        const char *items[1] = {fk->text};
        int plain[1] = {1};
        ConfigValue v = {0, 1, items, plain};
        char where[4300];
        snprintf(where, sizeof where, "%s: %s", path, fk->json_name);
        if ((rc = config_key_assign(&hf, k, &v, where, err)) != 0)
            break;
        if (cfg->origin[k].kind == ORIGIN_DEFAULT) {
            rc = config_key_copy(cfg, &hf, k, err);
            cfg->origin[k].kind = ORIGIN_MODEL_FOLDER;
        } else if (fk->check && !config_key_equal(cfg, &hf, k)) {
            char value[128], at[1200];
            int quote;
            config_key_format(cfg, k, 0, value, sizeof value, &quote);
            config_where(cfg, k, at, sizeof at);
            if (cfg->origin[k].kind == ORIGIN_PRESET)
                snprintf(value + strlen(value), sizeof value - strlen(value), " (model.preset %.60s)", cfg->model.preset);
            rc = error_set(err, at, "%s: %s, but train.init_from's %s has %s %s: unset the key to take the "
                           "model folder's value, or start from another model", fk->key, value, path, fk->json_name,
                           fk->text);
        }
    }
    config_free(&hf);
    return rc;
}
