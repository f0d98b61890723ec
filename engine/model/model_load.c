/*
 * engine/model/model_load.c - initial weights from a file (train.init_from), and the map between a rank's
 * blocks and the full tensors.
 *
 * A folder is a Hugging Face model folder (model_folder.c). A file is one of two formats, told apart
 * by their content (model_format.c, which also checks the name):
 *   safetensors  Hugging Face Llama names (model.layers.0.self_attn.q_proj.weight, ...), F32, F16,
 *                BF16 or F64; every tensor the model has must be there with its shape (lm_head is
 *                not needed when the embeddings are tied).
 *   llama2.c     Karpathy's llama2.c checkpoints (such as stories260K.bin): seven int32 (dim,
 *                hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size - negative when the
 *                classifier is not shared -, seq_len), then float32 arrays: token embedding, all
 *                layers' attention norms, wq, wk, wv, wo, ffn norms, w1 (gate), w2 (down), w3 (up),
 *                the final norm, the RoPE tables (skipped), and the classifier if not shared.
 *                llama2.c rotates interleaved pairs (2i, 2i + 1) of each head where we rotate
 *                (i, i + D/2) (Hugging Face's rotate_half): the rows of wq and wk are permuted per
 *                head as Hugging Face's conversion script does, which gives the same model.
 * Each full tensor is read whole and every rank copies out its block (model_put_block).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/model_impl.h"
#include "util/safetensors.h"

int model_full_tensor_count(const ModelDims *d)
{
    return 1 + d->n_layers * MODEL_LAYER_TENSORS + 1 + !d->tied;
}

void model_full_tensor(const ModelDims *d, int i, char *name, size_t name_size, int64_t *rows, int64_t *cols,
                       int *is_vector)
{
    int64_t D = d->d, hd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    int64_t F = d->d_ffn;
    *is_vector = 0;
    if (i == 0) {
        model_tensor_name(T_EMBED, -1, name, name_size);
        *rows = d->vocab, *cols = D;
        return;
    }
    int k = i - 1;
    if (k < d->n_layers * MODEL_LAYER_TENSORS) {
        int l = k / MODEL_LAYER_TENSORS, j = k % MODEL_LAYER_TENSORS;
        model_tensor_name((ModelTensorKind)(T_ATTN_NORM + j), l, name, name_size);
        const int64_t shape[MODEL_LAYER_TENSORS][2] = {{1, D}, {hd, D}, {kvd, D}, {kvd, D}, {D, hd},
                                                       {1, D}, {F, D},  {F, D},   {D, F}};
        *rows = shape[j][0], *cols = shape[j][1];
        *is_vector = j == 0 || j == 5;
        return;
    }
    if (k == d->n_layers * MODEL_LAYER_TENSORS) {
        model_tensor_name(T_FINAL_NORM, -1, name, name_size);
        *rows = 1, *cols = D, *is_vector = 1;
        return;
    }
    model_tensor_name(T_HEAD, -1, name, name_size);
    *rows = d->vocab, *cols = D;
}

int model_put_block(const Model *m, const char *name, const float *full, float *dst)
{
    const ModelTensor *t = model_tensor_by_name(m, name);
    if (!t)
        return 0;
    for (int64_t r = 0; r < t->rows; r++)
        memcpy(dst + t->offset + r * t->cols, full + (t->row0 + r) * t->full_cols + t->col0,
               (size_t)t->cols * sizeof *full);
    return 1;
}

/* Room for the largest full tensor. */
float *model_full_buffer(const Model *m)
{
    int64_t most = 1;
    for (int i = 0; i < model_full_tensor_count(&m->dims); i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(&m->dims, i, name, sizeof name, &rows, &cols, &vec);
        most = rows * cols > most ? rows * cols : most;
    }
    return malloc((size_t)most * sizeof(float));
}

int model_load_tensor(const Model *m, const ModelTensor *t, const StTensor *s, const char *path, float *full,
                      float *host, Error *err)
{
    if (!(t->is_vector ? s->n_dims == 1 && s->shape[0] == t->full_cols
                       : s->n_dims == 2 && s->shape[0] == t->full_rows && s->shape[1] == t->full_cols))
        return error_set(err, path, "%s has shape [%lld%s%lld], the config's model needs [%lld, %lld]", t->name,
                         (long long)s->shape[0], s->n_dims > 1 ? ", " : "", s->n_dims > 1 ? (long long)s->shape[1] : 0LL,
                         (long long)t->full_rows, (long long)t->full_cols);
    if (s->dtype == ST_I32 || s->dtype == ST_I64)
        return error_set(err, path, "%s is %s, not a floating-point tensor", t->name, st_dtype_name(s->dtype));
    st_read_f32(s, full);
    model_put_block(m, t->name, full, host);
    return 0;
}

static int load_safetensors(Model *m, const char *path, Error *err)
{
    StFile f;
    if (st_open(&f, path, err) != 0)
        return -1;
    float *host = malloc((size_t)m->n_params * sizeof *host), *full = model_full_buffer(m);
    int rc = host && full ? 0 : error_runtime(err, path, "out of memory");
    for (int i = 0; rc == 0 && i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        const StTensor *s = st_find(&f, t->name);
        if (!s) {
            rc = error_set(err, path, "no tensor %s (the file has %d tensors; wlbtrain reads Hugging Face Llama "
                           "names)", t->name, f.n_tensors);
            break;
        }
        rc = model_load_tensor(m, t, s, path, full, host, err);
    }
    if (rc == 0) {
        m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
        model_weights_changed(m);
    }
    free(host);
    free(full);
    st_close(&f);
    return rc;
}

/* HF's permute for rotate_half: rows of a head in order (0, 2, 4, ..., 1, 3, 5, ...). */
static void permute_rotary(float *w, int n_heads, int head_dim, int64_t cols, float *tmp)
{
    for (int h = 0; h < n_heads; h++) {
        float *head = w + (int64_t)h * head_dim * cols;
        for (int i = 0; i < head_dim / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + ((int64_t)j * head_dim / 2 + i) * cols, head + ((int64_t)2 * i + j) * cols,
                       (size_t)cols * sizeof *tmp);
        memcpy(head, tmp, (size_t)head_dim * (size_t)cols * sizeof *tmp);
    }
}

/* One full tensor of a llama2.c file at p: into the rank's block (q and k permuted first). */
static void llama2c_tensor(const Model *m, const char *name, const unsigned char *p, int64_t n, int rotary_heads,
                           float *full, float *tmp, float *host)
{
    if (!model_tensor_by_name(m, name))
        return;
    memcpy(full, p, (size_t)n * sizeof *full);
    if (rotary_heads)
        permute_rotary(full, rotary_heads, m->dims.head_dim, m->dims.d, tmp);
    model_put_block(m, name, full, host);
}

static int load_llama2c(Model *m, const char *path, const MappedFile *map, const Llama2cHeader *h, Error *err)
{
    const ModelDims *d = &m->dims;
    const char *keys[] = {"model.d_model", "model.d_ffn", "model.n_layers", "model.n_heads", "model.n_kv_heads",
                          "model.vocab_size"};
    int32_t want[] = {d->d, d->d_ffn, d->n_layers, d->n_heads, d->n_kv_heads, d->vocab};
    int32_t got[] = {h->dim, h->hidden_dim, h->n_layers, h->n_heads, h->n_kv_heads, h->vocab};
    for (int i = 0; i < 6; i++)
        if (got[i] != want[i])
            return error_set(err, path, "a llama2.c model with %s %d, the config has %d", keys[i], got[i], want[i]);
    int shared = h->shared;
    if (shared != d->tied)
        return error_set(err, path, "a llama2.c model whose classifier is %sshared, but model.tie_embeddings is %s",
                         shared ? "" : "not ", d->tied ? "true" : "false");
    int64_t L = d->n_layers, dm = d->d, F = d->d_ffn, hd = (int64_t)d->n_heads * d->head_dim, vocab = h->vocab;
    int64_t kvd = (int64_t)d->n_kv_heads * d->head_dim, seq = h->seq_len, half = d->head_dim / 2;
    float *host = malloc((size_t)m->n_params * sizeof *host), *full = model_full_buffer(m);
    float *tmp = malloc((size_t)d->head_dim * dm * sizeof *tmp);
    if (!host || !full || !tmp) {
        free(host);
        free(full);
        free(tmp);
        return error_runtime(err, path, "out of memory");
    }
    const unsigned char *p = map->data + 28;
    char name[96];
    llama2c_tensor(m, "model.embed_tokens.weight", p, vocab * dm, 0, full, tmp, host);
    p += (size_t)(vocab * dm) * 4;
    /* Then each kind of layer tensor for all layers: (name, floats, rotary heads). */
    const struct { const char *name; int64_t n; int heads; } kinds[] = {
        {"input_layernorm.weight", dm, 0},      {"self_attn.q_proj.weight", hd * dm, d->n_heads},
        {"self_attn.k_proj.weight", kvd * dm, d->n_kv_heads}, {"self_attn.v_proj.weight", kvd * dm, 0},
        {"self_attn.o_proj.weight", dm * hd, 0}, {"post_attention_layernorm.weight", dm, 0},
        {"mlp.gate_proj.weight", F * dm, 0},    {"mlp.down_proj.weight", dm * F, 0},
        {"mlp.up_proj.weight", F * dm, 0},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int l = 0; l < L; l++, p += (size_t)kinds[k].n * 4) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, kinds[k].name);
            llama2c_tensor(m, name, p, kinds[k].n, kinds[k].heads, full, tmp, host);
        }
    llama2c_tensor(m, "model.norm.weight", p, dm, 0, full, tmp, host);
    p += (size_t)dm * 4 + (size_t)(2 * seq * half) * 4; /* and skip the RoPE tables */
    if (!shared)
        llama2c_tensor(m, "lm_head.weight", p, vocab * dm, 0, full, tmp, host);
    m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
    model_weights_changed(m);
    free(host);
    free(full);
    free(tmp);
    return 0;
}

int model_load(Model *m, const char *path, Error *err)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return model_load_folder(m, path, err);
    MappedFile map;
    if (file_map(path, &map, err) != 0)
        return -1;
    Llama2cHeader h;
    int rc = model_weight_format(path, &map, &h, err);
    if (rc == WEIGHTS_SAFETENSORS)
        rc = load_safetensors(m, path, err);
    else if (rc == WEIGHTS_LLAMA2C)
        rc = load_llama2c(m, path, &map, &h, err);
    file_unmap(&map);
    return rc;
}
