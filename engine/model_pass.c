/*
 * engine/model_pass.c - forward and backward of a stage (see model.h), one op at a time.
 *
 * Forward of layer l, keeping what the backward needs (LayerActs):
 *     x = h;  a = rmsnorm(x);  q, k, v = a Wq^T, a Wk^T, a Wv^T;  rope(q), rope(k)
 *     att = attention(q, k, v);  h = x + att Wo^T  (= y)
 *     b = rmsnorm(y);  g, u = b Wg^T, b Wu^T;  s = silu(g) u;  h = y + s Wd^T
 * Backward of layer l, dh arriving as d(h out):
 *     ds = dh Wd;  dg, du = swiglu'(ds);  db = dg Wg + du Wu;  dh += rmsnorm'(db)      (= d y)
 *     datt = dh Wo;  dq, dk, dv = attention'(datt);  unrotate dq, dk;
 *     da = dq Wq + dk Wk + dv Wv;  dh += rmsnorm'(da)                                   (= d x)
 * The last stage runs the output projection in chunks of rows right after the final norm, and
 * with train its backward too, so the [T, vocab] logits exist one chunk at a time.
 */
#include <string.h>

#include "engine/model.h"

static float *param(const Model *m, ModelTensorKind kind, int layer)
{
    return m->params + model_tensor(m, kind, layer)->offset;
}

static float *grad(const Model *m, ModelTensorKind kind, int layer)
{
    return m->grads + model_tensor(m, kind, layer)->offset;
}

static AttnShape attn_shape(const ModelDims *d)
{
    return (AttnShape){d->n_heads, d->n_kv_heads, d->head_dim, (int64_t)d->n_heads * d->head_dim,
                       (int64_t)d->n_kv_heads * d->head_dim};
}

static void layer_forward(Model *m, int l, const ModelBatch *b)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    LayerActs *a = &m->acts[l - d->layer_begin];
    int64_t T = b->T, hd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    o->copy(a->x, m->h, T * d->d);
    o->rmsnorm_fwd(a->a, a->rstd1, a->x, param(m, T_ATTN_NORM, l), T, d->d, d->norm_eps);
    o->matmul_fwd(a->q, a->a, param(m, T_WQ, l), T, d->d, hd);
    o->matmul_fwd(a->k, a->a, param(m, T_WK, l), T, d->d, kvd);
    o->matmul_fwd(a->v, a->a, param(m, T_WV, l), T, d->d, kvd);
    o->rope(a->q, b->positions, T, d->n_heads, d->head_dim, m->inv_freq, 0);
    o->rope(a->k, b->positions, T, d->n_kv_heads, d->head_dim, m->inv_freq, 0);
    o->attention_fwd(a->att, a->lse, a->q, a->k, a->v, b->segs, b->n_segs, attn_shape(d));
    o->matmul_fwd(m->tmp_d, a->att, param(m, T_WO, l), T, hd, d->d);
    o->add(m->h, m->tmp_d, T * d->d);
    o->copy(a->y, m->h, T * d->d);
    o->rmsnorm_fwd(a->b, a->rstd2, a->y, param(m, T_MLP_NORM, l), T, d->d, d->norm_eps);
    o->matmul_fwd(a->g, a->b, param(m, T_WGATE, l), T, d->d, d->d_ffn);
    o->matmul_fwd(a->u, a->b, param(m, T_WUP, l), T, d->d, d->d_ffn);
    o->swiglu_fwd(a->s, a->g, a->u, T * d->d_ffn);
    o->matmul_fwd(m->tmp_d, a->s, param(m, T_WDOWN, l), T, d->d_ffn, d->d);
    o->add(m->h, m->tmp_d, T * d->d);
}

static void layer_backward(Model *m, int l, const ModelBatch *b)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    LayerActs *a = &m->acts[l - d->layer_begin];
    int64_t T = b->T, hd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    int64_t F = d->d_ffn;
    float *ds = m->tmp_d2;
    /* MLP */
    o->matmul_bwd(ds, grad(m, T_WDOWN, l), m->dh, a->s, param(m, T_WDOWN, l), T, F, d->d, 0);
    o->swiglu_bwd(m->dg, m->du, ds, a->g, a->u, T * F);
    o->matmul_bwd(m->tmp_d, grad(m, T_WGATE, l), m->dg, a->b, param(m, T_WGATE, l), T, d->d, F, 0);
    o->matmul_bwd(m->tmp_d, grad(m, T_WUP, l), m->du, a->b, param(m, T_WUP, l), T, d->d, F, 1);
    o->rmsnorm_bwd(m->dh, grad(m, T_MLP_NORM, l), m->tmp_d, a->y, param(m, T_MLP_NORM, l), a->rstd2, T, d->d);
    /* Attention */
    o->matmul_bwd(m->datt, grad(m, T_WO, l), m->dh, a->att, param(m, T_WO, l), T, hd, d->d, 0);
    o->zero(m->dq, T * hd);
    o->zero(m->dk, T * kvd);
    o->zero(m->dv, T * kvd);
    o->attention_bwd(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v, b->segs, b->n_segs,
                     attn_shape(d));
    o->rope(m->dq, b->positions, T, d->n_heads, d->head_dim, m->inv_freq, 1);
    o->rope(m->dk, b->positions, T, d->n_kv_heads, d->head_dim, m->inv_freq, 1);
    o->matmul_bwd(m->tmp_d, grad(m, T_WQ, l), m->dq, a->a, param(m, T_WQ, l), T, d->d, hd, 0);
    o->matmul_bwd(m->tmp_d, grad(m, T_WK, l), m->dk, a->a, param(m, T_WK, l), T, d->d, kvd, 1);
    o->matmul_bwd(m->tmp_d, grad(m, T_WV, l), m->dv, a->a, param(m, T_WV, l), T, d->d, kvd, 1);
    o->rmsnorm_bwd(m->dh, grad(m, T_ATTN_NORM, l), m->tmp_d, a->x, param(m, T_ATTN_NORM, l), a->rstd1, T, d->d);
}

/* Embedding, layers and final norm: m->hn holds the normalized last hidden states. */
static int forward_hidden(Model *m, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    if (model_reserve(m, b->T, err) != 0)
        return -1;
    o->embedding_fwd(m->h, b->tokens, b->T, param(m, T_EMBED, -1), 0, d->vocab, d->d);
    for (int l = d->layer_begin; l < d->layer_end; l++)
        layer_forward(m, l, b);
    o->rmsnorm_fwd(m->hn, m->rstd_f, m->h, param(m, T_FINAL_NORM, -1), b->T, d->d, d->norm_eps);
    return 0;
}

int model_predict(Model *m, const ModelBatch *b, int64_t row, float *logits, Error *err)
{
    if (row < 0 || row >= b->T)
        return error_runtime(err, "model", "no row %lld in a micro-batch of %lld", (long long)row, (long long)b->T);
    if (forward_hidden(m, b, err) != 0)
        return -1;
    const ModelDims *d = &m->dims;
    m->ops->matmul_fwd(m->logits, m->hn + row * d->d, param(m, T_HEAD, -1), 1, d->d, d->vocab);
    m->ops->to_host(logits, m->logits, (size_t)d->vocab * sizeof *logits);
    return 0;
}

int model_forward(Model *m, const ModelBatch *b, int train, float dloss, double *loss_sum, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T;
    *loss_sum = 0;
    if (T == 0)
        return 0;
    if (forward_hidden(m, b, err) != 0)
        return -1;
    const float *w_out = param(m, T_HEAD, -1);
    float *dw_out = grad(m, T_HEAD, -1);
    int64_t chunk = model_head_chunk(m);
    for (int64_t r = 0; r < T; r += chunk) {
        int64_t n = T - r < chunk ? T - r : chunk;
        o->matmul_fwd(m->logits, m->hn + r * d->d, w_out, n, d->d, d->vocab);
        /* dlogits overwrite the logits of the chunk */
        *loss_sum += o->cross_entropy(train ? m->logits : NULL, m->logits, b->targets + r, n, d->vocab, dloss);
        if (train)
            o->matmul_bwd(m->dhn + r * d->d, dw_out, m->logits, m->hn + r * d->d, w_out, n, d->d, d->vocab, 0);
    }
    return 0;
}

int model_backward(Model *m, const ModelBatch *b, Error *err)
{
    (void)err;
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T;
    if (T == 0)
        return 0;
    o->zero(m->dh, T * d->d);
    o->rmsnorm_bwd(m->dh, grad(m, T_FINAL_NORM, -1), m->dhn, m->h, param(m, T_FINAL_NORM, -1), m->rstd_f, T, d->d);
    for (int l = d->layer_end - 1; l >= d->layer_begin; l--)
        layer_backward(m, l, b);
    o->embedding_bwd(grad(m, T_EMBED, -1), b->tokens, m->dh, T, 0, d->vocab, d->d);
    return 0;
}
