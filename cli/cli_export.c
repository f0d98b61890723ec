/*
 * cli/cli_export.c - `wlbtrain export --checkpoint PATH --out DIR [--dtype float32|bfloat16]`: a
 * checkpoint as a Hugging Face model folder that transformers' LlamaForCausalLM.from_pretrained
 * loads: config.json (LlamaConfig, from the checkpoint's config.yaml) and model.safetensors (the
 * checkpoint's weights under the same Hugging Face names, in float32 or rounded to bfloat16,
 * nearest even). PATH is a step folder or a checkpoint folder (then its latest). Everything is read
 * and checked before anything is written; both files are written atomically.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h"
#include "util/bf16.h"
#include "util/fileio.h"
#include "util/safetensors.h"

/* The step folder PATH names: itself, or PATH/<latest>. malloc'd. */
static char *step_folder(const char *path, Error *err)
{
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", path);
    struct stat st;
    if (stat(latest, &st) != 0)
        return strdup(path);
    char *text;
    size_t len;
    if (file_read_text(latest, "checkpoint pointer", &text, &len, err) != 0)
        return NULL;
    text[strcspn(text, "\n")] = '\0';
    char *out = malloc(strlen(path) + strlen(text) + 2);
    if (out)
        sprintf(out, "%s/%s", path, text);
    free(text);
    return out;
}

static json_t *llama_config(const ConfigModel *m, const char *dtype)
{
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(j, "model_type", json_string("llama"));
    json_object_set_new(j, "hidden_size", json_integer(m->d_model));
    json_object_set_new(j, "intermediate_size", json_integer(m->d_ffn));
    json_object_set_new(j, "num_hidden_layers", json_integer(m->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(m->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(m->n_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(m->d_model / m->n_heads));
    json_object_set_new(j, "vocab_size", json_integer(m->vocab_size));
    json_object_set_new(j, "max_position_embeddings", json_integer(m->max_seq_len));
    json_object_set_new(j, "rms_norm_eps", json_real(m->norm_eps));
    json_object_set_new(j, "rope_theta", json_real(m->rope_theta));
    if (m->rope_scaling == ROPE_SCALING_LLAMA3)
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor",
                                      m->rope_scaling_factor, "low_freq_factor", m->rope_low_freq_factor,
                                      "high_freq_factor", m->rope_high_freq_factor, "original_max_position_embeddings",
                                      (json_int_t)m->rope_original_max_seq_len));
    else
        json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "tie_word_embeddings", json_boolean(m->tie_embeddings));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "torch_dtype", json_string(dtype));
    return j;
}

/* The weights of the checkpoint into a writer, as float32 or bfloat16. */
static int add_weights(const StFile *in, StWriter *w, int bf16, Error *err)
{
    for (int i = 0; i < in->n_tensors; i++) {
        const StTensor *t = &in->tensors[i];
        if (t->dtype == ST_I32 || t->dtype == ST_I64)
            return error_set(err, t->name, "is %s, not a weight", st_dtype_name(t->dtype));
        float *f = malloc((size_t)(t->numel + 1) * sizeof *f);
        uint16_t *h = bf16 ? malloc((size_t)(t->numel + 1) * sizeof *h) : NULL;
        int rc = f && (h || !bf16) ? 0 : error_runtime(err, t->name, "out of memory");
        if (rc == 0) {
            st_read_f32(t, f);
            for (int64_t k = 0; bf16 && k < t->numel; k++)
                h[k] = bf16_from_float(f[k]);
            rc = st_writer_add(w, t->name, bf16 ? ST_BF16 : ST_F32, t->shape, t->n_dims, bf16 ? (void *)h : (void *)f,
                               err);
        }
        free(f);
        free(h);
        if (rc != 0)
            return -1;
    }
    return st_writer_meta(w, "format", "pt", err);
}

int cli_export(const CliExport *x, Error *err)
{
    char *dir = step_folder(x->checkpoint, err);
    if (!dir)
        return err->msg[0] ? -1 : error_runtime(err, "export", "out of memory");
    char path[4200];
    Config cfg;
    config_init(&cfg);
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    int rc = config_load_file(&cfg, path, err);
    if (rc == 0)
        rc = config_resolve(&cfg, 0, err);
    StFile in;
    int opened = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0)
        rc = st_open(&in, path, err);
    opened = rc == 0;
    int bf16 = !strcmp(x->dtype, "bfloat16");
    StWriter w = {0};
    if (rc == 0)
        rc = add_weights(&in, &w, bf16, err);
    json_t *conf = rc == 0 ? llama_config(&cfg.model, x->dtype) : NULL;
    char *text = conf ? json_dumps(conf, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12)) : NULL;
    if (rc == 0 && !text)
        rc = error_runtime(err, "export", "out of memory");
    snprintf(path, sizeof path, "%s/config.json", x->out);
    if (rc == 0)
        rc = file_make_parents(path, err);
    AtomicFile a;
    if (rc == 0 && (rc = atomic_open(&a, path, err)) == 0) {
        fprintf(a.f, "%s\n", text);
        rc = atomic_commit(&a, err);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", x->out);
    if (rc == 0)
        rc = st_write(&w, path, err);
    if (rc == 0)
        printf("export: %s -> %s (config.json, model.safetensors: %d tensors, %s)\n", dir, x->out, in.n_tensors,
               x->dtype);
    free(text);
    json_decref(conf);
    st_writer_free(&w);
    if (opened)
        st_close(&in);
    config_free(&cfg);
    free(dir);
    return rc;
}
