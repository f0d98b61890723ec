/*
 * engine/model.c - the tensor table, initialisation, and the forward and backward of a stage over
 * the ops interface (see model.h for the architecture).
 */
#include "engine/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/rng.h"

static const char *const layer_names[MODEL_LAYER_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight",
};

static void add_tensor(Model *m, ModelTensorKind kind, int layer, int64_t rows, int64_t cols, int decay)
{
    ModelTensor *t = &m->tensors[m->n_tensors++];
    t->kind = kind;
    t->layer = layer;
    t->rows = rows;
    t->cols = cols;
    t->offset = m->n_params;
    t->decay = decay;
    if (kind == T_EMBED)
        snprintf(t->name, sizeof t->name, "model.embed_tokens.weight");
    else if (kind == T_FINAL_NORM)
        snprintf(t->name, sizeof t->name, "model.norm.weight");
    else if (kind == T_HEAD)
        snprintf(t->name, sizeof t->name, "lm_head.weight");
    else
        snprintf(t->name, sizeof t->name, "model.layers.%d.%s", layer, layer_names[kind - T_ATTN_NORM]);
    m->n_params += rows * cols;
}

/* RoPE frequencies 1 / theta^(2i / D), with Llama 3.1's scaling when configured (Hugging Face's
 * _compute_llama3_parameters): long wavelengths slowed by factor, short ones kept, a smooth blend
 * between low_freq_wavelen = original / low_freq_factor and high_freq_wavelen = original /
 * high_freq_factor. */
static void rope_frequencies(const ConfigModel *c, int head_dim, float *out)
{
    for (int i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, 2.0 * i / head_dim);
        if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            double orig = (double)c->rope_original_max_seq_len, wavelen = 2 * M_PI / f;
            double low_wl = orig / c->rope_low_freq_factor, high_wl = orig / c->rope_high_freq_factor;
            if (wavelen > low_wl) {
                f /= c->rope_scaling_factor;
            } else if (wavelen >= high_wl) {
                double smooth = (orig / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_scaling_factor + smooth * f;
            }
        }
        out[i] = (float)f;
    }
}

int model_init(Model *m, const ConfigModel *c, const Ops *ops, Error *err)
{
    memset(m, 0, sizeof *m);
    m->ops = ops;
    ModelDims *d = &m->dims;
    d->n_layers = (int)c->n_layers;
    d->d = (int)c->d_model;
    d->n_heads = (int)c->n_heads;
    d->n_kv_heads = (int)c->n_kv_heads;
    d->head_dim = d->d / d->n_heads;
    d->d_ffn = (int)c->d_ffn;
    d->vocab = (int)c->vocab_size;
    d->norm_eps = (float)c->norm_eps;
    d->tied = c->tie_embeddings;
    d->layer_begin = 0;
    d->layer_end = d->n_layers;
    d->has_embed = d->has_head = 1;
    int64_t hd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    m->tensors = calloc((size_t)d->n_layers * MODEL_LAYER_TENSORS + 3, sizeof *m->tensors);
    if (!m->tensors)
        return error_runtime(err, "model", "out of memory");
    add_tensor(m, T_EMBED, -1, d->vocab, d->d, 0);
    for (int l = d->layer_begin; l < d->layer_end; l++) {
        add_tensor(m, T_ATTN_NORM, l, 1, d->d, 0);
        add_tensor(m, T_WQ, l, hd, d->d, 1);
        add_tensor(m, T_WK, l, kvd, d->d, 1);
        add_tensor(m, T_WV, l, kvd, d->d, 1);
        add_tensor(m, T_WO, l, d->d, hd, 1);
        add_tensor(m, T_MLP_NORM, l, 1, d->d, 0);
        add_tensor(m, T_WGATE, l, d->d_ffn, d->d, 1);
        add_tensor(m, T_WUP, l, d->d_ffn, d->d, 1);
        add_tensor(m, T_WDOWN, l, d->d, d->d_ffn, 1);
    }
    add_tensor(m, T_FINAL_NORM, -1, 1, d->d, 0);
    if (!d->tied)
        add_tensor(m, T_HEAD, -1, d->vocab, d->d, 1);
    m->params = ops->alloc((size_t)m->n_params * sizeof(float));
    m->grads = ops->alloc((size_t)m->n_params * sizeof(float));
    m->inv_freq = ops->alloc((size_t)(d->head_dim / 2) * sizeof(float));
    float freq[4096];
    if (!m->params || !m->grads || !m->inv_freq || d->head_dim / 2 > 4096) {
        model_free(m);
        return error_runtime(err, "model", "out of memory for %lld parameters", (long long)m->n_params);
    }
    rope_frequencies(c, d->head_dim, freq);
    ops->to_device(m->inv_freq, freq, (size_t)(d->head_dim / 2) * sizeof(float));
    return 0;
}

/* The activation buffers: per layer (LayerActs) and per stage. */
enum { N_BUFFERS = 14 };

static void layer_buffers(LayerActs *a, float **out[N_BUFFERS])
{
    float **p[N_BUFFERS] = {&a->x, &a->a, &a->rstd1, &a->q, &a->k, &a->v, &a->att,
                            &a->lse, &a->y, &a->b, &a->rstd2, &a->g, &a->u, &a->s};
    memcpy(out, p, sizeof p);
}

static void stage_buffers(Model *m, float **out[N_BUFFERS])
{
    float **p[N_BUFFERS] = {&m->h, &m->hn, &m->rstd_f, &m->dh, &m->dhn, &m->tmp_d, &m->tmp_d2,
                            &m->datt, &m->dq, &m->dk, &m->dv, &m->dg, &m->du, &m->logits};
    memcpy(out, p, sizeof p);
}

static void free_acts(Model *m)
{
    const Ops *o = m->ops;
    float **p[N_BUFFERS];
    for (int l = 0; m->acts && l < m->dims.layer_end - m->dims.layer_begin; l++) {
        layer_buffers(&m->acts[l], p);
        for (int i = 0; i < N_BUFFERS; i++)
            o->free(*p[i]);
    }
    free(m->acts);
    m->acts = NULL;
    stage_buffers(m, p);
    for (int i = 0; i < N_BUFFERS; i++) {
        o->free(*p[i]);
        *p[i] = NULL;
    }
    m->cap_tokens = 0;
}

int64_t model_head_chunk(const Model *m)
{
    int64_t c = (INT64_C(1) << 24) / m->dims.vocab;
    return c < 1 ? 1 : c;
}

int model_reserve(Model *m, int64_t T, Error *err)
{
    if (T <= m->cap_tokens)
        return 0;
    free_acts(m);
    const ModelDims *d = &m->dims;
    int64_t hd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim, F = d->d_ffn;
    int n_layers = d->layer_end - d->layer_begin;
    if (!(m->acts = calloc((size_t)n_layers, sizeof *m->acts)))
        return error_runtime(err, "model", "out of memory");
    /* Sizes in floats, in the order of layer_buffers and of the stage buffers. */
    int64_t layer_sizes[N_BUFFERS] = {T * d->d, T * d->d, T, T * hd, T * kvd, T * kvd, T * hd,
                                      T * d->n_heads, T * d->d, T * d->d, T, T * F, T * F, T * F};
    int64_t stage_sizes[N_BUFFERS] = {T * d->d, T * d->d, T,        T * d->d, T * d->d, T * d->d, T * F,
                                      T * hd,   T * hd,   T * kvd,  T * kvd,  T * F,    T * F,
                                      model_head_chunk(m) * d->vocab};
    int ok = 1;
    float **p[N_BUFFERS];
    for (int l = 0; l < n_layers; l++) {
        layer_buffers(&m->acts[l], p);
        for (int i = 0; i < N_BUFFERS; i++)
            ok &= (*p[i] = m->ops->alloc((size_t)layer_sizes[i] * sizeof(float))) != NULL;
    }
    stage_buffers(m, p);
    for (int i = 0; i < N_BUFFERS; i++)
        ok &= (*p[i] = m->ops->alloc((size_t)stage_sizes[i] * sizeof(float))) != NULL;
    if (!ok) {
        free_acts(m);
        return error_runtime(err, "model", "out of memory for the activations of %lld tokens", (long long)T);
    }
    m->cap_tokens = T;
    return 0;
}

void model_free(Model *m)
{
    if (m->ops) {
        free_acts(m);
        m->ops->free(m->params);
        m->ops->free(m->grads);
        m->ops->free(m->inv_freq);
    }
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const ModelTensor *model_tensor(const Model *m, ModelTensorKind kind, int layer)
{
    if (kind == T_HEAD && m->dims.tied)
        kind = T_EMBED;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].kind == kind && m->tensors[i].layer == (kind >= T_ATTN_NORM && kind <= T_WDOWN ? layer : -1))
            return &m->tensors[i];
    return NULL;
}

const ModelTensor *model_tensor_by_name(const Model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

void model_init_weights(Model *m, uint64_t seed)
{
    float *host = malloc((size_t)m->n_params * sizeof *host);
    if (!host) {
        fputs("wlbtrain: error: model: out of memory\n", stderr);
        exit(1);
    }
    double out_scale = 1.0 / sqrt(2.0 * m->dims.n_layers);
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        float *w = host + t->offset;
        if (t->kind == T_ATTN_NORM || t->kind == T_MLP_NORM || t->kind == T_FINAL_NORM) {
            for (int64_t j = 0; j < t->cols; j++)
                w[j] = 1.0f;
            continue;
        }
        double std = 0.02 * (t->kind == T_WO || t->kind == T_WDOWN ? out_scale : 1.0);
        /* A stream per row, keyed by the tensor's identity: layout-independent values. */
        uint64_t id = (uint64_t)t->kind * 100003u + (uint64_t)(t->layer + 1);
        for (int64_t r = 0; r < t->rows; r++) {
            Rng rng;
            rng_seed(&rng, rng_hash3(seed, id, (uint64_t)r));
            for (int64_t j = 0; j < t->cols; j += 2) {
                /* Box-Muller: two standard normals from two uniforms in (0, 1]. */
                double u1 = 1.0 - rng_uniform(&rng), u2 = rng_uniform(&rng);
                double rad = sqrt(-2.0 * log(u1));
                w[r * t->cols + j] = (float)(std * rad * cos(2 * M_PI * u2));
                if (j + 1 < t->cols)
                    w[r * t->cols + j + 1] = (float)(std * rad * sin(2 * M_PI * u2));
            }
        }
    }
    m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
    free(host);
}
