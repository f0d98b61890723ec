/*
 * engine/model/model.c - the tensor table of a rank (its blocks of the full tensors), initialisation, and
 * the activation buffers (see model.h).
 */
#include "engine/model/model.h"
#include "engine/model/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/rng.h"

void model_tensor_name(ModelTensorKind kind, int layer, char *buf, size_t size)
{
    static const char *const layer_names[MODEL_LAYER_TENSORS] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight",
    };
    if (kind == T_EMBED)
        snprintf(buf, size, "model.embed_tokens.weight");
    else if (kind == T_FINAL_NORM)
        snprintf(buf, size, "model.norm.weight");
    else if (kind == T_HEAD)
        snprintf(buf, size, "lm_head.weight");
    else
        snprintf(buf, size, "model.layers.%d.%s", layer, layer_names[kind - T_ATTN_NORM]);
}

/* Adds the rank's block [row0, row0 + rows) x [col0, col0 + cols) of a full tensor. */
static void add_tensor(Model *m, ModelTensorKind kind, int layer, int64_t full_rows, int64_t full_cols, int64_t row0,
                       int64_t rows, int64_t col0, int64_t cols, int counts)
{
    ModelTensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->layer = layer;
    t->full_rows = full_rows;
    t->full_cols = full_cols;
    t->row0 = row0;
    t->rows = rows;
    t->col0 = col0;
    t->cols = cols;
    t->offset = m->n_params;
    t->is_vector = kind == T_ATTN_NORM || kind == T_MLP_NORM || kind == T_FINAL_NORM;
    t->decay = !t->is_vector && kind != T_EMBED;
    t->counts = counts;
    model_tensor_name(kind, layer, t->name, sizeof t->name);
    m->n_params += rows * cols;
}

void model_dims(ModelDims *d, const ConfigModel *c, const ModelParallel *p)
{
    memset(d, 0, sizeof *d);
    d->n_layers = (int)c->n_layers;
    d->d = (int)c->d_model;
    d->n_heads = (int)c->n_heads;
    d->n_kv_heads = (int)c->n_kv_heads;
    d->head_dim = d->d / d->n_heads;
    d->d_ffn = (int)c->d_ffn;
    d->vocab = (int)c->vocab_size;
    d->norm_eps = (float)c->norm_eps;
    d->tied = c->tie_embeddings;
    int tp = p ? p->tp : 1, tr = p ? p->tp_rank : 0, chunks = p ? p->n_chunks : 1, g = p ? p->chunk : 0;
    d->tp = tp;
    d->tp_rank = tr;
    d->cp = p ? p->cp : 1;
    d->sp = p && p->sequence_parallel && tp > 1;
    d->layer_begin = p ? p->layer_begin : 0;
    d->layer_end = p ? p->layer_end : d->n_layers;
    d->has_embed = g == 0;
    d->has_head = g == chunks - 1;
    d->local_heads = d->n_heads / tp;
    d->local_ffn = d->d_ffn / tp;
    d->local_vocab = d->vocab / tp;
    d->vocab0 = (int64_t)tr * d->local_vocab;
    if (d->n_kv_heads >= tp) {
        d->local_kv_heads = d->n_kv_heads / tp;
        d->kv_head0 = tr * d->local_kv_heads;
        d->kv_replicas = 1;
    } else { /* fewer kv heads than TP ranks: tp / n_kv_heads ranks share one */
        d->local_kv_heads = 1;
        d->kv_replicas = tp / d->n_kv_heads;
        d->kv_head0 = tr / d->kv_replicas;
    }
}

int64_t model_rows(const ModelDims *d, int64_t T)
{
    return d->sp ? (T + d->tp - 1) / d->tp : T;
}

/* The rank's tensor table (no parameter memory yet): m->tensors, m->n_tensors, m->n_params. */
static int build_tensors(Model *m, const ConfigModel *c, const ModelParallel *par, Error *err)
{
    ModelDims *d = &m->dims;
    model_dims(d, c, par);
    int64_t D = d->head_dim, hd = (int64_t)d->n_heads * D, kvd = (int64_t)d->n_kv_heads * D;
    int64_t lhd = (int64_t)d->local_heads * D, lkv = (int64_t)d->local_kv_heads * D;
    int first_tp = d->tp_rank == 0, kv_lead = d->tp_rank % d->kv_replicas == 0;
    m->tensors = calloc((size_t)d->n_layers * MODEL_LAYER_TENSORS + 4, sizeof *m->tensors);
    if (!m->tensors)
        return error_runtime(err, "model", "out of memory");
    /* The embedding: on the first chunk, and on the last when it is also the output projection.
     * With more than one chunk that copy does not count (the first chunk's does). */
    if (d->has_embed || (d->has_head && d->tied))
        add_tensor(m, T_EMBED, -1, d->vocab, d->d, d->vocab0, d->local_vocab, 0, d->d, d->has_embed);
    for (int l = d->layer_begin; l < d->layer_end; l++) {
        add_tensor(m, T_ATTN_NORM, l, 1, d->d, 0, 1, 0, d->d, first_tp);
        add_tensor(m, T_WQ, l, hd, d->d, d->tp_rank * lhd, lhd, 0, d->d, 1);
        add_tensor(m, T_WK, l, kvd, d->d, d->kv_head0 * D, lkv, 0, d->d, kv_lead);
        add_tensor(m, T_WV, l, kvd, d->d, d->kv_head0 * D, lkv, 0, d->d, kv_lead);
        add_tensor(m, T_WO, l, d->d, hd, 0, d->d, d->tp_rank * lhd, lhd, 1);
        add_tensor(m, T_MLP_NORM, l, 1, d->d, 0, 1, 0, d->d, first_tp);
        add_tensor(m, T_WGATE, l, d->d_ffn, d->d, (int64_t)d->tp_rank * d->local_ffn, d->local_ffn, 0, d->d, 1);
        add_tensor(m, T_WUP, l, d->d_ffn, d->d, (int64_t)d->tp_rank * d->local_ffn, d->local_ffn, 0, d->d, 1);
        add_tensor(m, T_WDOWN, l, d->d, d->d_ffn, 0, d->d, (int64_t)d->tp_rank * d->local_ffn, d->local_ffn, 1);
    }
    if (d->has_head) {
        add_tensor(m, T_FINAL_NORM, -1, 1, d->d, 0, 1, 0, d->d, first_tp);
        if (!d->tied)
            add_tensor(m, T_HEAD, -1, d->vocab, d->d, d->vocab0, d->local_vocab, 0, d->d, 1);
    }
    return 0;
}

int64_t model_param_count(const ConfigModel *c, const ModelParallel *par)
{
    Model m;
    memset(&m, 0, sizeof m);
    Error err = {0};
    int64_t n = build_tensors(&m, c, par, &err) == 0 ? m.n_params : -1;
    free(m.tensors);
    return n;
}

int model_tensor_table(const ConfigModel *c, const ModelParallel *par, ModelTensor **tensors, int *n, int64_t *n_params,
                       Error *err)
{
    Model m;
    memset(&m, 0, sizeof m);
    if (build_tensors(&m, c, par, err) != 0)
        return -1;
    *tensors = m.tensors;
    *n = m.n_tensors;
    *n_params = m.n_params;
    return 0;
}

int model_init(Model *m, const ConfigModel *c, const Ops *ops, const ModelParallel *par, Recompute recompute,
               Error *err)
{
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->recompute = recompute;
    m->logits_floats = ops->logits_floats;
    m->comm = par ? par->comm : NULL;
    ModelDims *d = &m->dims;
    if (build_tensors(m, c, par, err) != 0)
        return -1;
    m->params = ops->alloc((size_t)m->n_params * sizeof(float));
    m->grads = ops->alloc((size_t)m->n_params * sizeof(float));
    m->wact = ops->act_is_f32 ? (Act *)m->params : ops->alloc((size_t)m->n_params * ops->act_bytes);
    m->inv_freq = ops->alloc((size_t)(d->head_dim / 2) * sizeof(float));
    /* The CP exchange's pieces: one per rank of each block this rank exchanges in (nested blocks:
     * cp + cp / 2 + ... < 2 cp). */
    m->cp_req = d->cp > 1 ? calloc((size_t)(2 * d->cp), sizeof *m->cp_req) : NULL;
    float freq[4096];
    if (!m->params || !m->grads || !m->wact || !m->inv_freq || d->head_dim / 2 > 4096 || (d->cp > 1 && !m->cp_req)) {
        long long n = (long long)m->n_params; /* model_free clears it */
        model_free(m);
        return error_runtime(err, "model", "out of memory for %lld parameters", n);
    }
    m->rope_scale = model_rope_table(c, d->head_dim, freq);
    ops->to_device(m->inv_freq, freq, (size_t)(d->head_dim / 2) * sizeof(float));
    return model_set_slots(m, 1, err);
}

void model_free(Model *m)
{
    if (m->ops) {
        model_free_activations(m);
        if (m->wact != (Act *)m->params)
            m->ops->free(m->wact);
        m->ops->free(m->params);
        m->ops->free(m->grads);
        m->ops->free(m->inv_freq);
    }
    free(m->slots);
    free(m->tensors);
    free(m->cp_req);
    memset(m, 0, sizeof *m);
}

void model_weights_changed(Model *m)
{
    if (m->wact != (Act *)m->params)
        ops_cast(m->ops, m->wact, DT_ACT, m->params, DT_F32, m->n_params);
}

void model_weights_changed_range(Model *m, int64_t begin, int64_t end)
{
    if (m->wact != (Act *)m->params && end > begin)
        ops_cast(m->ops, ops_act(m->ops, m->wact, begin), DT_ACT, m->params + begin, DT_F32, end - begin);
}

const ModelTensor *model_tensor(const Model *m, ModelTensorKind kind, int layer)
{
    if (kind == T_HEAD && m->dims.tied)
        kind = T_EMBED;
    int in_layer = kind >= T_ATTN_NORM && kind <= T_WDOWN;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].kind == kind && m->tensors[i].layer == (in_layer ? layer : -1))
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

float *model_output(const Model *m, int slot)
{
    return m->slots[slot].h[m->dims.layer_end - m->dims.layer_begin];
}
float *model_input_grad(const Model *m, int slot) { return m->slots[slot].dx; }

int model_init_weights(Model *m, uint64_t seed, Error *err)
{
    float *host = malloc((size_t)m->n_params * sizeof *host);
    int64_t widest = 1;
    for (int i = 0; i < m->n_tensors; i++)
        widest = m->tensors[i].full_cols > widest ? m->tensors[i].full_cols : widest;
    float *row = malloc((size_t)widest * sizeof *row);
    if (!host || !row) {
        free(host);
        free(row);
        return error_runtime(err, "model", "out of memory for the initial weights of %lld parameters",
                             (long long)m->n_params);
    }
    double out_scale = 1.0 / sqrt(2.0 * m->dims.n_layers);
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        float *w = host + t->offset;
        if (t->is_vector) {
            for (int64_t j = 0; j < t->cols; j++)
                w[j] = 1.0f;
            continue;
        }
        double std = 0.02 * (t->kind == T_WO || t->kind == T_WDOWN ? out_scale : 1.0);
        /* A stream per full row, keyed by the tensor's identity (the head of tied embeddings is the
         * embedding): the values of a block do not depend on the layout. */
        uint64_t id = (uint64_t)(t->kind == T_HEAD && m->dims.tied ? T_EMBED : t->kind) * 100003u + (uint64_t)(t->layer + 1);
        for (int64_t r = 0; r < t->rows; r++) {
            Rng rng;
            rng_seed(&rng, rng_hash3(seed, id, (uint64_t)(t->row0 + r)));
            for (int64_t j = 0; j < t->full_cols; j += 2) {
                /* Box-Muller: two standard normals from two uniforms in (0, 1]. */
                double u1 = 1.0 - rng_uniform(&rng), u2 = rng_uniform(&rng);
                double rad = sqrt(-2.0 * log(u1));
                row[j] = (float)(std * rad * cos(2 * M_PI * u2));
                if (j + 1 < t->full_cols)
                    row[j + 1] = (float)(std * rad * sin(2 * M_PI * u2));
            }
            memcpy(w + r * t->cols, row + t->col0, (size_t)t->cols * sizeof *row);
        }
    }
    m->ops->to_device(m->params, host, (size_t)m->n_params * sizeof *host);
    model_weights_changed(m);
    free(host);
    free(row);
    return 0;
}
