/*
 * cli/cli_export.c - `wlbtrain export --checkpoint PATH --out DIR [--dtype float32|bfloat16]`: a
 * checkpoint as a Hugging Face model folder that transformers' LlamaForCausalLM.from_pretrained
 * loads: config.json (LlamaConfig, from the checkpoint's config.yaml) and model.safetensors (the
 * checkpoint's weights under the same Hugging Face names, in float32 or rounded to bfloat16,
 * nearest even). PATH is a step folder or a checkpoint folder (then its latest). The weights are
 * the full tensors rebuilt from the shard files that the checkpoint's index.json names, one tensor
 * in memory at a time (the file is streamed). Everything is read and checked (index, CRCs) before
 * anything is written; both files are written atomically.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h"
#include "util/bf16.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"

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

/* The checkpoint's full tensors (rebuilt from the shards the index names, one at a time: full), as
 * float32 or bfloat16, into f (NULL: a pass that only reads and checks them). */
static int write_weights(CkptIndex *ix, FILE *f, int bf16, float *full, float *tmp, uint16_t *h, const char *path,
                         Error *err)
{
    for (int i = 0; i < ix->n_tensors; i++) {
        const CkptTensor *t = &ix->tensors[i];
        int64_t n = t->rows * t->cols;
        if (ckpt_index_full(ix, t, 0, full, tmp, err) != 0)
            return -1;
        if (!f)
            continue;
        for (int64_t k = 0; bf16 && k < n; k++)
            h[k] = bf16_from_float(full[k]); /* little-endian host: the file's byte order */
        if (fwrite(bf16 ? (void *)h : (void *)full, bf16 ? 2 : 4, (size_t)n, f) != (size_t)n)
            return error_errno(err, path, "cannot write");
    }
    return 0;
}

/* model.safetensors: the header (every tensor's dtype, shape and place, padded to 8 bytes), then the
 * tensors in the index's order. */
static int write_safetensors(CkptIndex *ix, const char *path, int bf16, Error *err)
{
    json_t *head = json_object();
    int64_t at = 0, most = 1;
    for (int i = 0; i < ix->n_tensors; i++) {
        const CkptTensor *t = &ix->tensors[i];
        int64_t n = t->rows * t->cols, bytes = n * (bf16 ? 2 : 4);
        json_t *shape = t->is_vector ? json_pack("[I]", (json_int_t)t->cols)
                                     : json_pack("[I, I]", (json_int_t)t->rows, (json_int_t)t->cols);
        json_object_set_new(head, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", bf16 ? "BF16" : "F32", "shape",
                                                     shape, "data_offsets", (json_int_t)at, (json_int_t)(at + bytes)));
        at += bytes;
        most = n > most ? n : most;
    }
    json_object_set_new(head, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *text = json_dumps(head, JSON_COMPACT);
    json_decref(head);
    float *full = malloc((size_t)most * sizeof *full), *tmp = malloc((size_t)most * sizeof *tmp);
    uint16_t *h = bf16 ? malloc((size_t)most * sizeof *h) : NULL;
    int rc = text && full && tmp && (h || !bf16) ? 0 : error_runtime(err, path, "out of memory");
    /* Everything read and checked (CRCs, sections) before the file is begun. */
    if (rc == 0)
        rc = write_weights(ix, NULL, bf16, full, tmp, h, path, err);
    if (rc == 0)
        rc = file_make_parents(path, err);
    AtomicFile a;
    if (rc == 0 && (rc = atomic_open(&a, path, err)) == 0) {
        size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
        unsigned char n8[8];
        for (int i = 0; i < 8; i++)
            n8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        int bad = fwrite(n8, 1, 8, a.f) != 8 || fwrite(text, 1, len, a.f) != len;
        for (size_t i = len; i < padded && !bad; i++)
            bad = fputc(' ', a.f) == EOF;
        rc = bad ? error_errno(err, path, "cannot write") : write_weights(ix, a.f, bf16, full, tmp, h, path, err);
        if (rc == 0)
            rc = atomic_commit(&a, err);
        else
            atomic_abort(&a);
    }
    free(text);
    free(full);
    free(tmp);
    free(h);
    return rc;
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
    CkptIndex ix;
    int opened = rc == 0 && ckpt_index_open(&ix, dir, err) == 0;
    if (rc == 0 && !opened)
        rc = -1;
    int bf16 = !strcmp(x->dtype, "bfloat16");
    json_t *conf = rc == 0 ? llama_config(&cfg.model, x->dtype) : NULL;
    char *text = conf ? json_dumps(conf, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12)) : NULL;
    if (rc == 0 && !text)
        rc = error_runtime(err, "export", "out of memory");
    snprintf(path, sizeof path, "%s/model.safetensors", x->out);
    if (rc == 0)
        rc = write_safetensors(&ix, path, bf16, err);
    snprintf(path, sizeof path, "%s/config.json", x->out);
    AtomicFile a;
    if (rc == 0 && (rc = atomic_open(&a, path, err)) == 0) {
        fprintf(a.f, "%s\n", text);
        rc = atomic_commit(&a, err);
    }
    if (rc == 0)
        printf("export: %s -> %s (config.json, model.safetensors: %d tensors from %d shard file%s, %s)\n", dir, x->out,
               ix.n_tensors, ix.files_opened, ix.files_opened == 1 ? "" : "s", x->dtype);
    free(text);
    json_decref(conf);
    if (opened)
        ckpt_index_close(&ix);
    config_free(&cfg);
    free(dir);
    return rc;
}
