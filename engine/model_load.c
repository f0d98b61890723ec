/*
 * engine/model_load.c - initial weights from a file (train.init_from).
 *
 * Two formats, told apart by their first bytes:
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
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "util/fileio.h"
#include "util/safetensors.h"

static int load_safetensors(Model *m, const char *path, Error *err)
{
    StFile f;
    if (st_open(&f, path, err) != 0)
        return -1;
    float *host = malloc((size_t)m->n_params * sizeof *host);
    int rc = host ? 0 : error_runtime(err, path, "out of memory");
    for (int i = 0; rc == 0 && i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        const StTensor *s = st_find(&f, t->name);
        if (!s) {
            rc = error_set(err, path, "no tensor %s (the file has %d tensors; wlbtrain reads Hugging Face Llama "
                           "names)", t->name, f.n_tensors);
            break;
        }
        int is_vector = t->rows == 1 && s->n_dims == 1;
        if (!(is_vector ? s->shape[0] == t->cols
                        : s->n_dims == 2 && s->shape[0] == t->rows && s->shape[1] == t->cols)) {
            rc = error_set(err, path, "%s has shape [%lld%s%lld], the config's model needs [%lld, %lld]", t->name,
                           (long long)s->shape[0], s->n_dims > 1 ? ", " : "", s->n_dims > 1 ? (long long)s->shape[1] : 0LL,
                           (long long)t->rows, (long long)t->cols);
            break;
        }
        if (s->dtype == ST_I32 || s->dtype == ST_I64) {
            rc = error_set(err, path, "%s is %s, not a floating-point tensor", t->name, st_dtype_name(s->dtype));
            break;
        }
        st_read_f32(s, host + t->offset);
    }
    if (rc == 0)
        m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
    free(host);
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

static int load_llama2c(Model *m, const char *path, const MappedFile *map, Error *err)
{
    const ModelDims *d = &m->dims;
    int32_t h[7];
    memcpy(h, map->data, sizeof h);
    int shared = h[5] > 0;
    int32_t vocab = shared ? h[5] : -h[5];
    const char *keys[] = {"model.d_model", "model.d_ffn", "model.n_layers", "model.n_heads", "model.n_kv_heads",
                          "model.vocab_size"};
    int32_t want[] = {d->d, d->d_ffn, d->n_layers, d->n_heads, d->n_kv_heads, d->vocab};
    int32_t got[] = {h[0], h[1], h[2], h[3], h[4], vocab};
    for (int i = 0; i < 6; i++)
        if (got[i] != want[i])
            return error_set(err, path, "a llama2.c model with %s %d, the config has %d", keys[i], got[i], want[i]);
    if (shared != d->tied)
        return error_set(err, path, "a llama2.c model whose classifier is %sshared, but model.tie_embeddings is %s",
                         shared ? "" : "not ", d->tied ? "true" : "false");
    int64_t L = d->n_layers, dm = d->d, F = d->d_ffn, hd = (int64_t)d->n_heads * d->head_dim;
    int64_t kvd = (int64_t)d->n_kv_heads * d->head_dim, seq = h[6], half = d->head_dim / 2;
    int64_t floats = vocab * dm + L * (2 * dm + hd * dm + 2 * kvd * dm + dm * hd + 3 * F * dm) + dm + 2 * seq * half +
                     (shared ? 0 : vocab * dm);
    if (seq < 0 || map->size != 28 + (uint64_t)floats * 4)
        return error_set(err, path, "llama2.c model of %llu bytes, its header promises %llu", (unsigned long long)map->size,
                         (unsigned long long)(28 + floats * 4));
    float *host = malloc((size_t)m->n_params * sizeof *host), *tmp = malloc((size_t)(hd > F ? hd : F) * dm * sizeof *tmp);
    if (!host || !tmp) {
        free(host);
        free(tmp);
        return error_runtime(err, path, "out of memory");
    }
    const unsigned char *p = map->data + 28;
    /* Copies n floats of each layer's tensor of this kind, layer after layer. */
#define READ_LAYERS(kind, n)                                                                   \
    for (int l = 0; l < L; l++, p += (size_t)(n) * 4)                                          \
        memcpy(host + model_tensor(m, kind, l)->offset, p, (size_t)(n) * 4);
    memcpy(host + model_tensor(m, T_EMBED, -1)->offset, p, (size_t)(vocab * dm) * 4);
    p += (size_t)(vocab * dm) * 4;
    READ_LAYERS(T_ATTN_NORM, dm)
    READ_LAYERS(T_WQ, hd * dm)
    READ_LAYERS(T_WK, kvd * dm)
    READ_LAYERS(T_WV, kvd * dm)
    READ_LAYERS(T_WO, dm * hd)
    READ_LAYERS(T_MLP_NORM, dm)
    READ_LAYERS(T_WGATE, F * dm)
    READ_LAYERS(T_WDOWN, dm * F)
    READ_LAYERS(T_WUP, F * dm)
#undef READ_LAYERS
    memcpy(host + model_tensor(m, T_FINAL_NORM, -1)->offset, p, (size_t)dm * 4);
    p += (size_t)dm * 4 + (size_t)(2 * seq * half) * 4; /* and skip the RoPE tables */
    if (!shared)
        memcpy(host + model_tensor(m, T_HEAD, -1)->offset, p, (size_t)(vocab * dm) * 4);
    for (int l = 0; l < L; l++) {
        permute_rotary(host + model_tensor(m, T_WQ, l)->offset, d->n_heads, d->head_dim, dm, tmp);
        permute_rotary(host + model_tensor(m, T_WK, l)->offset, d->n_kv_heads, d->head_dim, dm, tmp);
    }
    m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
    free(host);
    free(tmp);
    return 0;
}

int model_load(Model *m, const char *path, Error *err)
{
    MappedFile map;
    if (file_map(path, &map, err) != 0)
        return -1;
    int rc;
    /* safetensors: a little-endian header length, then '{'. llama2.c: seven small ints. */
    if (map.size >= 9 && map.data[8] == '{')
        rc = load_safetensors(m, path, err);
    else if (map.size >= 28)
        rc = load_llama2c(m, path, &map, err);
    else
        rc = error_set(err, path, "neither a safetensors file nor a llama2.c model (%llu bytes)",
                       (unsigned long long)map.size);
    file_unmap(&map);
    return rc;
}
