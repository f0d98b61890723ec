/*
 * cli/cli_export.c - `wlbtrain export --checkpoint PATH --out DIR [--dtype float32|bfloat16]`: a
 * checkpoint as a Hugging Face model folder that transformers' LlamaForCausalLM.from_pretrained
 * loads: config.json (LlamaConfig, from the checkpoint's config.yaml) and model.safetensors (the
 * checkpoint's weights under the same Hugging Face names, in float32 or rounded to bfloat16,
 * nearest even). PATH is a step folder, a checkpoint folder (then its latest) or that latest file
 * (util/ckpt_index.h's ckpt_step_folder, as a resume takes it). The weights are
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
#include "util/jsonfile.h"
#include "util/safetensors.h"

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

/* Tensor i of the checkpoint, rebuilt from the shards the index names (full), as float32 or
 * bfloat16 (h): what model.safetensors holds, one tensor at a time. */
typedef struct ExportTensors {
    CkptIndex *ix;
    int bf16;
    float *full, *tmp;
    uint16_t *h;
} ExportTensors;

static const void *export_tensor(void *ctx, int i, Error *err)
{
    ExportTensors *x = ctx;
    const CkptTensor *t = &x->ix->tensors[i];
    if (ckpt_index_full(x->ix, t, 0, x->full, x->tmp, err) != 0)
        return NULL;
    if (!x->bf16)
        return x->full;
    for (int64_t k = 0; k < t->rows * t->cols; k++)
        x->h[k] = bf16_from_float(x->full[k]); /* little-endian host: the file's byte order */
    return x->h;
}

/* model.safetensors, in the index's order, written only after every tensor was read and checked
 * (CRCs, sections) once. */
static int write_safetensors(CkptIndex *ix, const char *path, int bf16, Error *err)
{
    StWriter w = {0};
    int64_t most = 1;
    int rc = st_writer_meta(&w, "format", "pt", err);
    for (int i = 0; rc == 0 && i < ix->n_tensors; i++) {
        const CkptTensor *t = &ix->tensors[i];
        int64_t shape[2] = {t->rows, t->cols};
        rc = st_writer_add(&w, t->name, bf16 ? ST_BF16 : ST_F32, t->is_vector ? shape + 1 : shape, t->is_vector ? 1 : 2,
                           NULL, err);
        most = t->rows * t->cols > most ? t->rows * t->cols : most;
    }
    ExportTensors x = {ix, bf16, malloc((size_t)most * sizeof(float)), malloc((size_t)most * sizeof(float)),
                       bf16 ? malloc((size_t)most * sizeof(uint16_t)) : NULL};
    if (rc == 0 && (!x.full || !x.tmp || (bf16 && !x.h)))
        rc = error_runtime(err, path, "out of memory");
    for (int i = 0; rc == 0 && i < ix->n_tensors; i++)
        rc = export_tensor(&x, i, err) ? 0 : -1;
    if (rc == 0)
        rc = file_make_parents(path, err);
    if (rc == 0)
        rc = st_write_stream(&w, path, export_tensor, &x, err);
    st_writer_free(&w);
    free(x.full);
    free(x.tmp);
    free(x.h);
    return rc;
}

int cli_export(const CliExport *x, Error *err)
{
    char *dir;
    if (ckpt_step_folder(x->checkpoint, &dir, err) < 0)
        return -1;
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
    if (rc == 0 && !conf)
        rc = error_runtime(err, "export", "out of memory");
    snprintf(path, sizeof path, "%s/model.safetensors", x->out);
    if (rc == 0)
        rc = write_safetensors(&ix, path, bf16, err);
    snprintf(path, sizeof path, "%s/config.json", x->out);
    if (rc == 0)
        rc = json_file_write(path, conf, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12), err);
    if (rc == 0)
        printf("export: %s -> %s (config.json, model.safetensors: %d tensors from %d shard file%s, %s)\n", dir, x->out,
               ix.n_tensors, ix.files_opened, ix.files_opened == 1 ? "" : "s", x->dtype);
    json_decref(conf);
    if (opened)
        ckpt_index_close(&ix);
    config_free(&cfg);
    free(dir);
    return rc;
}
