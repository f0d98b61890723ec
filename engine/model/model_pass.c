/*
 * engine/model/model_pass.c - forward and backward of a model chunk (see model.h), one op at a time.
 *
 * Forward of layer l on this rank's rows, keeping what the backward needs (LayerActs). With TP a
 * rank holds heads and FFN columns of its own (Wq, Wk, Wv, Wg, Wu split by output rows, Wo and
 * Wd by input columns), so the two output projections give partial sums, all-reduced over TP:
 *     x = h;  a = rmsnorm(x);  q, k, v = a Wq^T, a Wk^T, a Wv^T;  rope(q), rope(k)
 *     [CP: K, V of the sharded documents all-gathered into micro-batch rows]
 *     att = attention(q, k, v);  h = x + allreduce(att Wo^T)  (= y)
 *     b = rmsnorm(y);  g, u = b Wg^T, b Wu^T;  s = silu(g) u;  h = y + allreduce(s Wd^T)
 * Backward of layer l, dh arriving as d(h out) (the same on every TP rank):
 *     ds = dh Wd;  dg, du = swiglu'(ds);  db = allreduce(dg Wg + du Wu);  dh += rmsnorm'(db)  (= dy)
 *     datt = dh Wo;  dq, dk, dv = attention'(datt)  [CP: dK, dV reduce-scattered];  unrotate;
 *     da = allreduce(dq Wq + dk Wk + dv Wv);  dh += rmsnorm'(da)                           (= dx)
 * The all-reduces of db and da sum each rank's part of the input gradient: every rank's heads and
 * FFN columns read the whole input.
 */
#include <math.h>
#include <string.h>

#include "engine/model/model_impl.h"
#include "util/clock.h"

int model_tp_allreduce(Model *m, float *x, int64_t n, Error *err)
{
    if (m->dims.tp == 1)
        return 0;
    double t0 = clock_seconds();
    int rc = comm_allreduce_sum(m->comm, GROUP_TP, x, n, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_tp_allreduce_f64(Model *m, double *x, int64_t n, int max, Error *err)
{
    if (m->dims.tp == 1)
        return 0;
    double t0 = clock_seconds();
    int rc = max ? comm_allreduce_max_f64(m->comm, GROUP_TP, x, n, err)
                 : comm_allreduce_sum_f64(m->comm, GROUP_TP, x, n, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

/* This rank's heads: query head h uses key/value head h / (local_heads / local_kv_heads). */
static AttnShape attn_shape(const ModelDims *d)
{
    return (AttnShape){d->local_heads, d->local_kv_heads, d->head_dim, (int64_t)d->local_heads * d->head_dim,
                       (int64_t)d->local_kv_heads * d->head_dim, (int64_t)d->local_heads * d->head_dim};
}

static int layer_forward(Model *m, ModelSlot *s, int l, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    LayerActs *a = &s->layers[l - d->layer_begin];
    int64_t T = b->T, D = d->d, F = d->local_ffn;
    int64_t lhd = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    o->copy(a->x, s->h, T * D);
    o->rmsnorm_fwd(a->a, a->rstd1, a->x, model_param(m, T_ATTN_NORM, l), T, D, d->norm_eps);
    o->matmul_fwd(a->q, a->a, model_param(m, T_WQ, l), T, D, lhd);
    o->matmul_fwd(a->k, a->a, model_param(m, T_WK, l), T, D, lkv);
    o->matmul_fwd(a->v, a->a, model_param(m, T_WV, l), T, D, lkv);
    o->rope(a->q, b->positions, T, d->local_heads, d->head_dim, m->inv_freq, 0);
    o->rope(a->k, b->positions, T, d->local_kv_heads, d->head_dim, m->inv_freq, 0);
    const float *k = a->k, *v = a->v;
    if (d->cp > 1) {
        if (model_cp_gather_kv(m, a, b, err) != 0)
            return -1;
        k = a->k_mb;
        v = a->v_mb;
    }
    o->attention_fwd(a->att, a->lse, a->q, k, v, b->segs, b->n_segs, attn_shape(d));
    o->matmul_fwd(m->tmp_d, a->att, model_param(m, T_WO, l), T, lhd, D);
    if (model_tp_allreduce(m, m->tmp_d, T * D, err) != 0)
        return -1;
    o->add(s->h, m->tmp_d, T * D);
    o->copy(a->y, s->h, T * D);
    o->rmsnorm_fwd(a->b, a->rstd2, a->y, model_param(m, T_MLP_NORM, l), T, D, d->norm_eps);
    o->matmul_fwd(a->g, a->b, model_param(m, T_WGATE, l), T, D, F);
    o->matmul_fwd(a->u, a->b, model_param(m, T_WUP, l), T, D, F);
    o->swiglu_fwd(a->s, a->g, a->u, T * F);
    o->matmul_fwd(m->tmp_d, a->s, model_param(m, T_WDOWN, l), T, F, D);
    if (model_tp_allreduce(m, m->tmp_d, T * D, err) != 0)
        return -1;
    o->add(s->h, m->tmp_d, T * D);
    return 0;
}

static int layer_backward(Model *m, ModelSlot *s, int l, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    LayerActs *a = &s->layers[l - d->layer_begin];
    int64_t T = b->T, D = d->d, F = d->local_ffn;
    int64_t lhd = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    float *ds = m->tmp_d2;
    /* MLP */
    o->matmul_bwd(ds, model_grad(m, T_WDOWN, l), m->dh, a->s, model_param(m, T_WDOWN, l), T, F, D, 0);
    o->swiglu_bwd(m->dg, m->du, ds, a->g, a->u, T * F);
    o->matmul_bwd(m->tmp_d, model_grad(m, T_WGATE, l), m->dg, a->b, model_param(m, T_WGATE, l), T, D, F, 0);
    o->matmul_bwd(m->tmp_d, model_grad(m, T_WUP, l), m->du, a->b, model_param(m, T_WUP, l), T, D, F, 1);
    if (model_tp_allreduce(m, m->tmp_d, T * D, err) != 0)
        return -1;
    o->rmsnorm_bwd(m->dh, model_grad(m, T_MLP_NORM, l), m->tmp_d, a->y, model_param(m, T_MLP_NORM, l), a->rstd2, T,
                   D);
    /* Attention */
    o->matmul_bwd(m->datt, model_grad(m, T_WO, l), m->dh, a->att, model_param(m, T_WO, l), T, lhd, D, 0);
    o->zero(m->dq, T * lhd);
    if (d->cp > 1) {
        o->zero(m->dk_mb, b->T_mb * lkv);
        o->zero(m->dv_mb, b->T_mb * lkv);
        o->attention_bwd(m->dq, m->dk_mb, m->dv_mb, m->datt, a->att, a->lse, a->q, a->k_mb, a->v_mb, b->segs,
                         b->n_segs, attn_shape(d));
        if (model_cp_scatter_dkv(m, b, err) != 0)
            return -1;
    } else {
        o->zero(m->dk, T * lkv);
        o->zero(m->dv, T * lkv);
        o->attention_bwd(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v, b->segs, b->n_segs,
                         attn_shape(d));
    }
    o->rope(m->dq, b->positions, T, d->local_heads, d->head_dim, m->inv_freq, 1);
    o->rope(m->dk, b->positions, T, d->local_kv_heads, d->head_dim, m->inv_freq, 1);
    o->matmul_bwd(m->tmp_d, model_grad(m, T_WQ, l), m->dq, a->a, model_param(m, T_WQ, l), T, D, lhd, 0);
    o->matmul_bwd(m->tmp_d, model_grad(m, T_WK, l), m->dk, a->a, model_param(m, T_WK, l), T, D, lkv, 1);
    o->matmul_bwd(m->tmp_d, model_grad(m, T_WV, l), m->dv, a->a, model_param(m, T_WV, l), T, D, lkv, 1);
    if (model_tp_allreduce(m, m->tmp_d, T * D, err) != 0)
        return -1;
    o->rmsnorm_bwd(m->dh, model_grad(m, T_ATTN_NORM, l), m->tmp_d, a->x, model_param(m, T_ATTN_NORM, l), a->rstd1,
                   T, D);
    return 0;
}

/* The chunk's input (embedding or h_in), its layers, and on the last chunk the final norm into
 * slot->hn. */
static int forward_hidden(Model *m, int slot, const ModelBatch *b, const float *h_in, Error *err)
{
    const ModelDims *d = &m->dims;
    if (slot < 0 || slot >= m->n_slots)
        return error_runtime(err, "model", "no activation slot %d (%d slots)", slot, m->n_slots);
    if (!d->has_embed && !h_in)
        return error_runtime(err, "model", "chunk of layers %d.. needs its input", d->layer_begin);
    if (model_reserve(m, slot, b->T, d->cp > 1 ? b->T_mb : 0, err) != 0)
        return -1;
    ModelSlot *s = &m->slots[slot];
    if (d->has_embed) {
        if (model_embed_fwd(m, s->h, b, err) != 0)
            return -1;
    } else {
        m->ops->copy(s->h, h_in, b->T * d->d);
    }
    for (int l = d->layer_begin; l < d->layer_end; l++)
        if (layer_forward(m, s, l, b, err) != 0)
            return -1;
    if (d->has_head)
        m->ops->rmsnorm_fwd(s->hn, s->rstd_f, s->h, model_param(m, T_FINAL_NORM, -1), b->T, d->d, d->norm_eps);
    return 0;
}

int model_predict(Model *m, const ModelBatch *b, int64_t row, float *logits, Error *err)
{
    const ModelDims *d = &m->dims;
    if (d->tp != 1 || d->cp != 1 || !d->has_embed || !d->has_head)
        return error_runtime(err, "model", "predicting needs the whole model in one process");
    if (row < 0 || row >= b->T)
        return error_runtime(err, "model", "no row %lld in a micro-batch of %lld", (long long)row, (long long)b->T);
    if (forward_hidden(m, 0, b, NULL, err) != 0)
        return -1;
    m->ops->matmul_fwd(m->logits, m->slots[0].hn + row * d->d, model_param(m, T_HEAD, -1), 1, d->d, d->vocab);
    m->ops->to_host(logits, m->logits, (size_t)d->vocab * sizeof *logits);
    return 0;
}

int model_forward(Model *m, int slot, const ModelBatch *b, const float *h_in, int train, float dloss,
                  double *loss_sum, Error *err)
{
    *loss_sum = 0;
    if (forward_hidden(m, slot, b, h_in, err) != 0)
        return -1;
    if (!m->dims.has_head)
        return 0;
    return model_head_fwd(m, &m->slots[slot], b, train, dloss, loss_sum, err);
}

int model_backward(Model *m, int slot, const ModelBatch *b, const float *dh_out, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T;
    if (slot < 0 || slot >= m->n_slots)
        return error_runtime(err, "model", "no activation slot %d (%d slots)", slot, m->n_slots);
    if (!d->has_head && !dh_out)
        return error_runtime(err, "model", "chunk of layers %d.. needs the gradient of its output", d->layer_begin);
    ModelSlot *s = &m->slots[slot];
    if (d->has_head) {
        o->zero(m->dh, T * d->d);
        o->rmsnorm_bwd(m->dh, model_grad(m, T_FINAL_NORM, -1), s->dhn, s->h, model_param(m, T_FINAL_NORM, -1),
                       s->rstd_f, T, d->d);
    } else {
        o->copy(m->dh, dh_out, T * d->d);
    }
    for (int l = d->layer_end - 1; l >= d->layer_begin; l--)
        if (layer_backward(m, s, l, b, err) != 0)
            return -1;
    if (d->has_embed)
        model_embed_bwd(m, m->dh, b);
    else
        o->copy(s->dx, m->dh, T * d->d);
    return 0;
}
