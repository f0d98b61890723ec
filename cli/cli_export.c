/*
 * cli/cli_export.c - `wlbtrain export --checkpoint PATH --out DIR [--dtype D] [--max-shard-size S]`: a
 * checkpoint as a Hugging Face model folder that transformers (4 and 5: AutoConfig, AutoTokenizer,
 * AutoModelForCausalLM.from_pretrained) and vLLM load:
 *   config.json   LlamaConfig from the checkpoint's config.yaml, in the form all of them read:
 *                 rope_theta and rope_scaling (rope_type llama3, linear or yarn with its parameters,
 *                 or null), bos_token_id and eos_token_id (cli_export_source.c says whence), torch_dtype
 *   weights       the checkpoint's weights under the same Hugging Face names, in float32 or rounded to
 *                 bfloat16 (nearest even); --dtype auto takes the dtype the model came in (the model
 *                 folder's, else bfloat16 for bf16 training). One model.safetensors when they fit in
 *                 --max-shard-size (default 5GB, Hugging Face's default), else shards of at most that
 *                 many tensor bytes - model-00001-of-0000N.safetensors, ... in the index's tensor order
 *                 (a tensor larger than the limit alone in its shard) - and
 *                 model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
 *                 Weight files of an earlier export in DIR that this one does not write are removed
 *                 (transformers would take a stale model.safetensors before the index).
 *   generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json when the run
 *                 knows them (cli_export_source.c).
 * PATH is a step folder, a checkpoint folder (then its latest) or that latest file (util/ckpt_index.h's
 * ckpt_step_folder, as a resume takes it). The weights are the full tensors rebuilt from the shard
 * files that the checkpoint's index.json names, one tensor in memory at a time (the files are
 * streamed). Everything is read and checked (index, CRCs) before anything is written; every file is
 * written atomically.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <dirent.h>
#include <unistd.h>

#include "cli/cli_export.h"
#include "config/config.h"
#include "util/bf16.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"
#include "util/jsonfile.h"
#include "util/safetensors.h"

/* rope_scaling as transformers 4 and 5 and vLLM read it (null for none). */
static json_t *rope_scaling(const ConfigModel *m)
{
    switch (m->rope_scaling) {
    case ROPE_SCALING_LLAMA3:
        return json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor", m->rope_scaling_factor,
                         "low_freq_factor", m->rope_low_freq_factor, "high_freq_factor", m->rope_high_freq_factor,
                         "original_max_position_embeddings", (json_int_t)m->rope_original_max_seq_len);
    case ROPE_SCALING_LINEAR:
        return json_pack("{s:s, s:f}", "rope_type", "linear", "factor", m->rope_scaling_factor);
    case ROPE_SCALING_YARN: {
        json_t *j = json_pack("{s:s, s:f, s:I, s:f, s:f}", "rope_type", "yarn", "factor", m->rope_scaling_factor,
                              "original_max_position_embeddings", (json_int_t)m->rope_original_max_seq_len,
                              "beta_fast", m->rope_yarn_beta_fast, "beta_slow", m->rope_yarn_beta_slow);
        /* Only what differs from the defaults: transformers 4 warns on keys it does not know (truncate). */
        if (j && m->rope_attention_factor > 0)
            json_object_set_new(j, "attention_factor", json_real(m->rope_attention_factor));
        if (j && !m->rope_yarn_truncate)
            json_object_set_new(j, "truncate", json_false());
        return j;
    }
    case ROPE_SCALING_NONE:
        break;
    }
    return json_null();
}

static json_t *llama_config(const ConfigModel *m, const char *dtype, const ExportSource *src)
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
    json_object_set_new(j, "rope_scaling", rope_scaling(m));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(m->tie_embeddings));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "use_cache", json_true());
    json_object_set_new(j, "torch_dtype", json_string(dtype));
    json_object_set(j, "bos_token_id", src->bos ? src->bos : json_null());
    json_object_set(j, "eos_token_id", src->eos ? src->eos : json_null());
    return j;
}

/* Tensor first + i of the checkpoint, rebuilt from the shards the index names (full), as float32 or
 * bfloat16 (h): what a safetensors file holding tensors [first, ...) holds, one tensor at a time. */
typedef struct ExportTensors {
    CkptIndex *ix;
    int bf16, first;
    float *full, *tmp;
    uint16_t *h;
} ExportTensors;

static const void *export_tensor(void *ctx, int i, Error *err)
{
    ExportTensors *x = ctx;
    const CkptTensor *t = &x->ix->tensors[x->first + i];
    if (ckpt_index_full(x->ix, t, 0, x->full, x->tmp, err) != 0)
        return NULL;
    if (!x->bf16)
        return x->full;
    for (int64_t k = 0; k < t->rows * t->cols; k++)
        x->h[k] = bf16_from_float(x->full[k]); /* little-endian host: the file's byte order */
    return x->h;
}

/* The weight files: shard s holds the index's tensors [first[s], first[s + 1]). */
typedef struct ShardPlan {
    int n, *first;
    int64_t total_bytes;
} ShardPlan;

/* Tensors in the index's order, a new shard when the next would take the current one past max
 * bytes (a tensor larger than max alone in its shard). */
static int plan_shards(const CkptIndex *ix, int64_t elem_bytes, int64_t max, ShardPlan *p, Error *err)
{
    p->first = malloc((size_t)(ix->n_tensors + 2) * sizeof *p->first);
    if (!p->first)
        return error_runtime(err, "export", "out of memory");
    p->n = 0;
    p->total_bytes = 0;
    int64_t in_shard = 0;
    for (int i = 0; i < ix->n_tensors; i++) {
        int64_t bytes = ix->tensors[i].rows * ix->tensors[i].cols * elem_bytes;
        if (p->n == 0 || (in_shard > 0 && in_shard + bytes > max)) {
            p->first[p->n++] = i;
            in_shard = 0;
        }
        in_shard += bytes;
        p->total_bytes += bytes;
    }
    p->first[p->n] = ix->n_tensors;
    return 0;
}

static void shard_name(const ShardPlan *p, int s, char *buf, size_t size)
{
    if (p->n == 1)
        snprintf(buf, size, "model.safetensors");
    else
        snprintf(buf, size, "model-%05d-of-%05d.safetensors", s + 1, p->n);
}

/* Shard s of the plan at path, tensors streamed (written only after every tensor was read and
 * checked once by the caller). */
static int write_shard(ExportTensors *x, const ShardPlan *p, int s, const char *path, Error *err)
{
    StWriter w = {0};
    int rc = st_writer_meta(&w, "format", "pt", err);
    for (int i = p->first[s]; rc == 0 && i < p->first[s + 1]; i++) {
        const CkptTensor *t = &x->ix->tensors[i];
        int64_t shape[2] = {t->rows, t->cols};
        rc = st_writer_add(&w, t->name, x->bf16 ? ST_BF16 : ST_F32, t->is_vector ? shape + 1 : shape,
                           t->is_vector ? 1 : 2, NULL, err);
    }
    x->first = p->first[s];
    if (rc == 0)
        rc = st_write_stream(&w, path, export_tensor, x, err);
    st_writer_free(&w);
    return rc;
}

static int write_index(const CkptIndex *ix, const ShardPlan *p, const char *path, Error *err)
{
    json_t *map = json_object(), *root = json_pack("{s:{s:I}}", "metadata", "total_size", (json_int_t)p->total_bytes);
    int rc = map && root ? 0 : error_runtime(err, path, "out of memory");
    char name[64];
    for (int s = 0; rc == 0 && s < p->n; s++) {
        shard_name(p, s, name, sizeof name);
        for (int i = p->first[s]; i < p->first[s + 1]; i++)
            json_object_set_new(map, ix->tensors[i].name, json_string(name));
    }
    if (rc == 0)
        json_object_set(root, "weight_map", map);
    if (rc == 0)
        rc = json_file_write(path, root, JSON_INDENT(2) | JSON_SORT_KEYS, err);
    json_decref(map);
    json_decref(root);
    return rc;
}

/* The weight files: every tensor read and checked (CRCs, sections) once, then the shards and (for
 * more than one) the index written. */
static int write_weights(CkptIndex *ix, const char *out, int bf16, int64_t max_bytes, ShardPlan *p, Error *err)
{
    int64_t most = 1;
    for (int i = 0; i < ix->n_tensors; i++)
        most = ix->tensors[i].rows * ix->tensors[i].cols > most ? ix->tensors[i].rows * ix->tensors[i].cols : most;
    ExportTensors x = {ix, bf16, 0, malloc((size_t)most * sizeof(float)), malloc((size_t)most * sizeof(float)),
                       bf16 ? malloc((size_t)most * sizeof(uint16_t)) : NULL};
    int rc = x.full && x.tmp && (!bf16 || x.h) ? 0 : error_runtime(err, out, "out of memory");
    for (int i = 0; rc == 0 && i < ix->n_tensors; i++)
        rc = export_tensor(&x, i, err) ? 0 : -1;
    if (rc == 0)
        rc = plan_shards(ix, bf16 ? 2 : 4, max_bytes, p, err);
    char path[4400], name[64];
    snprintf(path, sizeof path, "%s/config.json", out);
    if (rc == 0)
        rc = file_make_parents(path, err);
    for (int s = 0; rc == 0 && s < p->n; s++) {
        shard_name(p, s, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", out, name);
        rc = write_shard(&x, p, s, path, err);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    if (rc == 0 && p->n > 1)
        rc = write_index(ix, p, path, err);
    free(x.full);
    free(x.tmp);
    free(x.h);
    return rc;
}

/* 1 when name is a weight file of an export: model.safetensors, model.safetensors.index.json or
 * model-NNNNN-of-NNNNN.safetensors. */
static int is_weight_file(const char *name)
{
    int a, b, n = -1;
    if (!strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json"))
        return 1;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &n) == 2 && n == (int)strlen(name);
}

/* Removes the weight files of an earlier export that this one did not write. */
static int remove_stale(const char *out, const ShardPlan *p, Error *err)
{
    DIR *d = opendir(out);
    if (!d)
        return error_errno(err, out, "cannot list");
    struct dirent *e;
    int rc = 0;
    char path[4400], name[64];
    while (rc == 0 && (e = readdir(d))) {
        if (!is_weight_file(e->d_name))
            continue;
        int ours = p->n > 1 && !strcmp(e->d_name, "model.safetensors.index.json");
        for (int s = 0; s < p->n && !ours; s++) {
            shard_name(p, s, name, sizeof name);
            ours = !strcmp(e->d_name, name);
        }
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        if (!ours && unlink(path) != 0)
            rc = error_errno(err, path, "cannot remove the weight file of an earlier export");
    }
    closedir(d);
    return rc;
}

/* A later stage (train.init_from none, checkpoint.continue_from set): the model folder and
 * data.tokenizer of the stage that started from one, followed back through the continue_from chain
 * by each checkpoint's config.yaml. An earlier checkpoint that is gone ends the search (the export
 * then knows no folder, as before); data.tokenizer is taken only when cfg has none. */
static int earlier_source(Config *cfg, char **init_from, Error *err)
{
    char *from = cfg->checkpoint.continue_from ? strdup(cfg->checkpoint.continue_from) : NULL;
    if (cfg->checkpoint.continue_from && !from)
        return error_runtime(err, "export", "out of memory");
    int rc = 0;
    for (int hop = 0; rc == 0 && from && !*init_from && hop < 64; hop++) {
        Error lookup = {0};
        char *step = NULL, path[4400];
        Config old;
        config_init(&old);
        int found = ckpt_step_folder(from, &step, &lookup) == 0;
        free(from);
        from = NULL;
        if (found)
            snprintf(path, sizeof path, "%s/config.yaml", step);
        if (found && config_load_file(&old, path, &lookup) == 0) {
            if (old.train.init_from && !(*init_from = strdup(old.train.init_from)))
                rc = error_runtime(err, "export", "out of memory");
            if (rc == 0 && !cfg->data.tokenizer && old.data.tokenizer &&
                !(cfg->data.tokenizer = strdup(old.data.tokenizer)))
                rc = error_runtime(err, "export", "out of memory");
            if (rc == 0 && old.checkpoint.continue_from && !(from = strdup(old.checkpoint.continue_from)))
                rc = error_runtime(err, "export", "out of memory");
        }
        config_free(&old);
        free(step);
    }
    free(from);
    return rc;
}

int cli_export(const CliExport *x, Error *err)
{
    char *dir;
    if (ckpt_step_folder(x->checkpoint, &dir, err) < 0)
        return -1;
    char path[4400], *init_from = NULL;
    Config cfg;
    config_init(&cfg);
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    int rc = config_load_file(&cfg, path, err);
    /* The model keys are the checkpoint's (all written in its config.yaml); the model folder it
     * started from is read for what export takes from it, not checked again (it may be gone, and a
     * later stage may have changed the RoPE keys). */
    if (rc == 0 && cfg.train.init_from && !(init_from = strdup(cfg.train.init_from)))
        rc = error_runtime(err, "export", "out of memory");
    if (rc == 0 && !init_from)
        rc = earlier_source(&cfg, &init_from, err);
    if (rc == 0)
        rc = config_apply_set(&cfg, "train.init_from=none", err);
    if (rc == 0)
        rc = config_resolve(&cfg, 0, err);
    ExportSource src;
    int have_src = rc == 0 && export_source_open(&src, &cfg, init_from, err) == 0;
    if (rc == 0 && !have_src)
        rc = -1;
    CkptIndex ix;
    int opened = rc == 0 && ckpt_index_open(&ix, dir, err) == 0;
    if (rc == 0 && !opened)
        rc = -1;
    const char *dtype = rc == 0 && !strcmp(x->dtype, "auto") ? src.dtype : x->dtype;
    int bf16 = !strcmp(dtype, "bfloat16");
    json_t *conf = rc == 0 ? llama_config(&cfg.model, dtype, &src) : NULL;
    if (rc == 0 && !conf)
        rc = error_runtime(err, "export", "out of memory");
    ShardPlan plan = {0};
    if (rc == 0)
        rc = write_weights(&ix, x->out, bf16, x->max_shard_bytes, &plan, err);
    snprintf(path, sizeof path, "%s/config.json", x->out);
    if (rc == 0)
        rc = json_file_write(path, conf, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12), err);
    char others[512] = "";
    if (rc == 0)
        rc = export_write_source_files(&src, &cfg, x->out, others, sizeof others, err);
    if (rc == 0)
        rc = remove_stale(x->out, &plan, err);
    if (rc == 0) {
        char bos[32] = "none", eos[64] = "none";
        if (json_is_integer(src.bos))
            snprintf(bos, sizeof bos, "%lld", (long long)json_integer_value(src.bos));
        if (json_is_integer(src.eos))
            snprintf(eos, sizeof eos, "%lld", (long long)json_integer_value(src.eos));
        else if (json_is_array(src.eos))
            snprintf(eos, sizeof eos, "%lld and %zu more", (long long)json_integer_value(json_array_get(src.eos, 0)),
                     json_array_size(src.eos) - 1);
        printf("export: %s -> %s (config.json, %s: %d tensors from %d checkpoint file%s, %s; bos %s, eos %s%s%s%s%s)\n",
               dir, x->out, plan.n == 1 ? "model.safetensors" : "model.safetensors.index.json", ix.n_tensors,
               ix.files_opened, ix.files_opened == 1 ? "" : "s", dtype, bos, eos,
               src.eos_from ? " from " : "", src.eos_from ? src.eos_from : "", others[0] ? "; " : "", others);
        if (plan.n > 1)
            printf("export: %d safetensors files of at most %lld bytes of tensors each, %lld in all\n", plan.n,
                   (long long)x->max_shard_bytes, (long long)plan.total_bytes);
    }
    free(plan.first);
    json_decref(conf);
    if (opened)
        ckpt_index_close(&ix);
    if (have_src)
        export_source_free(&src);
    config_free(&cfg);
    free(init_from);
    free(dir);
    return rc;
}
