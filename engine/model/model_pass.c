/*
 * engine/model/model_pass.c - forward and backward of a model chunk (see model.h), one op at a time.
 *
 * Forward of layer l on this rank's rows, keeping what the backward needs (LayerActs; [A] is the
 * compute dtype, everything else float32). With TP a rank holds heads and FFN columns of its own
 * (Wq, Wk, Wv, Wgate, Wup split by output rows, Wo and Wdown by input columns), so the two output
 * products give partial sums, all-reduced over TP before they join the residual stream:
 *     a = rmsnorm(x) [A];  qkv = a Wqkv^T [A] (Wq, Wk, Wv as one product);  rope(q), rope(k)
 *     [CP: K, V of the sharded documents all-gathered into micro-batch rows]
 *     att = attention(q, k, v) [A];  y = x + allreduce(att Wo^T)
 *     b = rmsnorm(y) [A];  gu = b Wgu^T [A] (Wgate, Wup as one product);  s = silu(g) u [A]
 *     out = y + allreduce(s Wdown^T)
 * (with tp = 1 the products add into the residual stream directly: y = x + att Wo^T in one call).
 * Backward of layer l, dh = d(out) in float32 and in the compute dtype (dh_act), the same on every
 * TP rank:
 *     dWdown += dh^T s;  ds = dh Wdown;  dgu = swiglu'(ds) [A];  dWgu += dgu^T b
 *     dh += rmsnorm'(allreduce(dgu Wgu))                                         (= dy)
 *     dWo += dh^T att;  datt = dh Wo [A];  dq, dk, dv = attention'(datt) (float32, accumulated)
 *     [CP: dK, dV reduce-scattered];  dqkv = unrotate(dq, dk), dv [A];  dWqkv += dqkv^T a
 *     dh += rmsnorm'(allreduce(dqkv Wqkv))                                       (= dx)
 * The input-gradient product (dgu Wgu, dqkv Wqkv) runs before the weight-gradient product (dWgu,
 * dWqkv), so that its all-reduce (or reduce-scatter) is started and runs beside the weight-gradient
 * product (parallel.overlap; the two products are independent: the same numbers in either order).
 * The all-reduces of the input gradients sum each rank's part: every rank's heads and FFN columns
 * read the whole input. train.recompute: what a layer did not keep (model_memory.c) is computed
 * again at the start of its backward, by the same ops, so the gradients are the same bits.
 *
 * Sequence parallelism (model.h, model_sp.c): x, a, y, b, their rstd and dh have this rank's R rows;
 * the products read all T rows of a and b, all-gathered, and every allreduce above is a
 * reduce-scatter onto the R rows; the backward all-gathers dh before the row-parallel products'
 * backward (dWdown, ds; dWo, datt) and a, b again before dWgu, dWqkv (they are kept on R rows only).
 * The exchanges next to a product split with it into pieces of rows (parallel.tp_chunks,
 * model_tp.c: model_tp_gather_product, model_tp_product_allreduce, model_tp_gather_backward), each
 * piece's exchange beside another piece's product. In the forward everything from the attention
 * output product to the next layer's QKV product reads a row at a time, so with SP that span runs
 * as one pipeline of pieces (model_chain.c): y, b, the MLP, out, and the next layer's a and qkv,
 * piece by piece, each exchange beside other pieces' products. The backward likewise from a layer's
 * QKV input gradient through the layer below's MLP to its datt (model_chain_bwd.c; not with full
 * recomputation, whose forward again would overwrite the scratch the chain reads): between two
 * attention backwards, everything reads a row at a time. The gather of a starts before attention'
 * and runs beside it. A layer at a time (without SP, or with full recomputation) the gathers of a
 * and b start as soon as the gathered rows' buffer is free (after ds, datt) and run beside the work
 * up to the weight-gradient product that reads them (swiglu' and dgu Wgu; attention' and dqkv
 * Wqkv). A collective shows below as a start where its input is ready and a wait where its result
 * is first read (model_sp_wait, model_comm_wait).
 */
#include <math.h>
#include <string.h>

#include "engine/model/model_impl.h"
#include "util/clock.h"

int model_tp_allreduce(Model *m, float *x, int64_t n, CommRequest *req, Error *err)
{
    if (m->dims.tp == 1)
        return 0;
    double t0 = clock_seconds();
    int rc = req ? comm_iallreduce_sum_dt(m->comm, GROUP_TP, x, n, m->sum_dt, req, err)
                 : comm_allreduce_sum_dt(m->comm, GROUP_TP, x, n, m->sum_dt, err);
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

/* Widths of this rank's q heads, k (= v) heads, and the fused q | k | v row. */
static int64_t q_width(const ModelDims *d) { return (int64_t)d->local_heads * d->head_dim; }
static int64_t kv_width(const ModelDims *d) { return (int64_t)d->local_kv_heads * d->head_dim; }
static int64_t qkv_width(const ModelDims *d) { return q_width(d) + 2 * kv_width(d); }

/* Attention reads q, k, v from the fused qkv rows, or with CP k and v from the micro-batch rows. */
static AttnShape attn_shape(const ModelDims *d)
{
    int64_t kv = d->cp > 1 ? kv_width(d) : qkv_width(d);
    return (AttnShape){d->local_heads, d->local_kv_heads, d->head_dim, qkv_width(d), kv, q_width(d)};
}

/* Attention of segs (n of them; none: nothing) from the layer's qkv rows into a->att, a->lse. */
static void attention(Model *m, LayerActs *a, const Act *k, const Act *v, const AttnSegment *segs, int64_t n)
{
    if (n > 0)
        m->ops->attention_fwd(a->att, a->lse, a->qkv, k, v, segs, n, attn_shape(&m->dims));
}

/* All T rows of x (the stream's rows, compute dtype) once model_sp_wait(ex) returns: x itself, or
 * with SP every TP rank's rows all-gathered into m->sp_full. */
static int all_rows_start(Model *m, const Act *x, int64_t T, const Act **full, SpExchange *ex, Error *err)
{
    *full = x;
    if (!m->dims.sp)
        return 0;
    *full = m->sp_full;
    return model_sp_gather_start(m, x, DT_ACT, T, m->sp_full, ex, err);
}

/* The partial sums of a product's output in m->tmp (T rows) summed over TP onto the stream's rows,
 * started: all-reduced in place (*sum = m->tmp), or with SP reduce-scattered into out (R rows,
 * *sum = out); *sum is there once model_sp_wait(ex) returns (m->tmp untouched until then). */
static int tp_sum_start(Model *m, int64_t T, float *out, float **sum, SpExchange *ex, Error *err)
{
    *sum = m->tmp;
    if (m->dims.tp == 1)
        return 0;
    if (!m->dims.sp)
        return model_tp_allreduce(m, m->tmp, T * m->dims.d, &ex->req[0], err);
    *sum = out;
    return model_sp_scatter_start(m, m->tmp, T, out, ex, err);
}

/* Without SP: out = res + the TP-reduced product x W^T (T rows each): into out directly with tp = 1,
 * else all-reduced over TP in pieces (model_tp_product_allreduce). */
static int residual_product(Model *m, float *out, const float *res, const Act *x, const Act *w, int64_t T,
                            int64_t n_in, Error *err)
{
    const Ops *o = m->ops;
    int64_t D = m->dims.d;
    if (m->dims.tp == 1) {
        o->matmul_fwd(mat_f32_plus(out, res), x, w, T, n_in, D);
        return 0;
    }
    if (model_tp_product_allreduce(m, x, w, T, n_in, err) != 0)
        return -1;
    o->add(out, m->tmp, res, T * D);
    return 0;
}

/* Layer l from its input x into a; out = its output (NULL: stop before the down product, which
 * only a recomputation does). have_qkv: a->a, a->rstd1 and a->qkv (before RoPE) are there already,
 * from the layer before. With SP the rows after attention run in pieces (model_chain.c), on into
 * the next layer's QKV product when next (its activations) is given. */
static int layer_forward(Model *m, const ModelBatch *b, int l, const float *x, float *out, LayerActs *a, int have_qkv,
                         LayerActs *next, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T, R = model_rows(d, T), D = d->d, F = d->local_ffn, Q = qkv_width(d);
    if (!have_qkv) {
        o->rmsnorm_fwd(a->a, a->rstd1, x, model_param(m, T_ATTN_NORM, l), R, D, d->norm_eps);
        if (model_tp_gather_product(m, mat_act(a->qkv), a->a, model_weight(m, T_WQ, l), T, Q, err) != 0)
            return -1;
    }
    o->rope_fwd(a->qkv, Q, b->positions, T, d->local_heads + d->local_kv_heads, d->head_dim, m->inv_freq,
                m->rope_scale);
    if (d->cp > 1) {
        if (model_cp_attention_fwd(m, a, b, attn_shape(d), err) != 0)
            return -1;
    } else {
        attention(m, a, ops_act(o, a->qkv, q_width(d)), ops_act(o, a->qkv, q_width(d) + kv_width(d)), b->segs,
                  b->n_segs);
    }
    if (d->sp) {
        ModelChainLayer c = {a, x, out, model_weight(m, T_WO, l), model_weight(m, T_WGATE, l),
                             model_weight(m, T_WDOWN, l), model_param(m, T_MLP_NORM, l), q_width(d), next,
                             next ? model_param(m, T_ATTN_NORM, l + 1) : NULL,
                             next ? model_weight(m, T_WQ, l + 1) : NULL, Q};
        return model_chain_forward(m, &c, T, err);
    }
    if (residual_product(m, a->y, x, a->att, model_weight(m, T_WO, l), T, q_width(d), err) != 0)
        return -1;
    o->rmsnorm_fwd(a->b, a->rstd2, a->y, model_param(m, T_MLP_NORM, l), R, D, d->norm_eps);
    o->matmul_fwd(mat_act(a->gu), a->b, model_weight(m, T_WGATE, l), T, D, 2 * F);
    o->swiglu_fwd(a->s, a->gu, T, F);
    if (!out)
        return 0;
    return residual_product(m, out, a->y, a->s, model_weight(m, T_WDOWN, l), T, F, err);
}

/* What train.recompute left out of a, computed again from the layer's input x: with selective, the
 * attention half (a, rstd1) and the MLP half (b, rstd2, s) as `halves` says (the chained backward
 * recomputes them at different times); with full, the whole layer. */
enum { HALF_ATTN = 1, HALF_MLP = 2, HALF_BOTH = 3 };
static int recompute_layer(Model *m, const ModelBatch *b, int l, const float *x, LayerActs *a, int halves,
                           Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t R = model_rows(d, b->T);
    if (m->recompute == RECOMPUTE_FULL)
        return layer_forward(m, b, l, x, NULL, a, 0, NULL, err);
    if (m->recompute != RECOMPUTE_SELECTIVE)
        return 0;
    if (halves & HALF_ATTN)
        o->rmsnorm_fwd(a->a, a->rstd1, x, model_param(m, T_ATTN_NORM, l), R, d->d, d->norm_eps);
    if (halves & HALF_MLP) {
        o->rmsnorm_fwd(a->b, a->rstd2, a->y, model_param(m, T_MLP_NORM, l), R, d->d, d->norm_eps);
        o->swiglu_fwd(a->s, a->gu, b->T, d->local_ffn);
    }
    return 0;
}

/* Part of layer l's gradients is final (Model.grads_ready; l = layer_end: the tensors after the
 * layers, -1: the embedding). */
static int grads_ready(Model *m, int l, ModelGradsPart part, Error *err)
{
    return m->grads_ready ? m->grads_ready(m->grads_ready_ctx, m, l, part, err) : 0;
}

/* The MLP's backward: m->dh (and m->dh_act) hold d(out) and get d(y). */
static int mlp_backward(Model *m, LayerActs *a, int l, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T, R = model_rows(d, T), D = d->d, F = d->local_ffn;
    const Act *in;
    float *sum, *ds = m->g32;
    SpExchange gather = {{{0}}}, reduce = {{{0}}};
    if (model_tp_gather_backward(m, m->dh_act, a->s, model_weight(m, T_WDOWN, l), model_grad(m, T_WDOWN, l),
                                 mat_f32(ds), T, F, err) != 0)
        return -1;
    if (all_rows_start(m, a->b, T, &in, &gather, err) != 0)
        return -1;
    o->swiglu_bwd(m->dgu, ds, a->gu, T, F);
    o->matmul_bwd_dx(mat_f32(m->tmp), m->dgu, model_weight(m, T_WGATE, l), T, D, 2 * F);
    if (tp_sum_start(m, T, m->sp_part, &sum, &reduce, err) != 0 || model_sp_wait(m, &gather, err) != 0)
        return -1;
    o->matmul_bwd_dw(model_grad(m, T_WGATE, l), m->dgu, in, T, D, 2 * F);
    if (model_sp_wait(m, &reduce, err) != 0)
        return -1;
    o->rmsnorm_bwd(m->dh, m->dh_act, model_grad(m, T_MLP_NORM, l), sum, a->y, model_param(m, T_MLP_NORM, l),
                   a->rstd2, R, D);
    return 0;
}

/* Attention's backward from datt (m->datt) to m->dqkv (after RoPE's backward); a's rows, all T of
 * them, in *in once model_sp_wait(gather) returns (with SP gathered beside attention'). dq, dk, dv
 * accumulate in float32 (dqkv32); with CP dk, dv in micro-batch rows. */
static int attention_backward(Model *m, LayerActs *a, const ModelBatch *b, const Act **in, SpExchange *gather,
                              Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t T = b->T, lq = q_width(d), lkv = kv_width(d), Q = qkv_width(d);
    float *dqkv32 = m->g32;
    if (all_rows_start(m, a->a, T, in, gather, err) != 0)
        return -1;
    o->zero(dqkv32, T * Q);
    const Act *k = ops_act(o, a->qkv, lq), *v = ops_act(o, a->qkv, lq + lkv);
    if (d->cp > 1) {
        if (model_cp_attention_bwd(m, a, b, dqkv32, attn_shape(d), err) != 0)
            return -1;
    } else {
        o->attention_bwd(dqkv32, dqkv32 + lq, dqkv32 + lq + lkv, m->datt, a->att, a->lse, a->qkv, k, v, b->segs,
                         b->n_segs, attn_shape(d));
    }
    o->rope_bwd(m->dqkv, Q, dqkv32, Q, Q, b->positions, T, d->local_heads + d->local_kv_heads, d->head_dim,
                m->inv_freq, m->rope_scale);
    return 0;
}

/* The layer's backward, one part at a time: m->dh (and m->dh_act) hold d(out) and get d(x). */
static int layer_backward(Model *m, ModelSlot *s, int l, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int i = l - d->layer_begin;
    LayerActs *a = &s->layers[i];
    const float *x = s->h[i];
    int64_t T = b->T, R = model_rows(d, T), D = d->d, Q = qkv_width(d);
    const Act *in;
    float *sum;
    SpExchange gather = {{{0}}}, reduce = {{{0}}};
    if (recompute_layer(m, b, l, x, a, HALF_BOTH, err) != 0 || mlp_backward(m, a, l, b, err) != 0 ||
        grads_ready(m, l, MODEL_GRADS_MLP, err) != 0 ||
        model_tp_gather_backward(m, m->dh_act, a->att, model_weight(m, T_WO, l), model_grad(m, T_WO, l),
                                 mat_act(m->datt), T, q_width(d), err) != 0 ||
        attention_backward(m, a, b, &in, &gather, err) != 0)
        return -1;
    o->matmul_bwd_dx(mat_f32(m->tmp), m->dqkv, model_weight(m, T_WQ, l), T, D, Q);
    if (tp_sum_start(m, T, m->sp_part, &sum, &reduce, err) != 0 || model_sp_wait(m, &gather, err) != 0)
        return -1;
    o->matmul_bwd_dw(model_grad(m, T_WQ, l), m->dqkv, in, T, D, Q);
    if (model_sp_wait(m, &reduce, err) != 0)
        return -1;
    o->rmsnorm_bwd(m->dh, m->dh_act, model_grad(m, T_ATTN_NORM, l), sum, x, model_param(m, T_ATTN_NORM, l),
                   a->rstd1, R, D);
    return 0;
}

/* The backward's layers with SP, chained (model_chain_bwd.c): the top layer's MLP and output
 * product from d(out); then per layer, top down, attention' and the chain from its QKV product into
 * the layer below's output product (or, for the first layer, to d(x)). With selective recomputation
 * the layer below's MLP half is recomputed before the chain and its attention half after (the
 * chain still reads this layer's rstd1 from the scratch they share). Layer l's gradients are final
 * once its chain is done. */
static int layers_backward_chained(Model *m, ModelSlot *s, const ModelBatch *b, Error *err)
{
    const ModelDims *d = &m->dims;
    int top = d->layer_end - 1, n = top - d->layer_begin;
    ModelChainBack c = {s, d->layer_end, NULL, NULL};
    if (recompute_layer(m, b, top, s->h[n], &s->layers[n], HALF_BOTH, err) != 0 ||
        model_chain_backward(m, &c, b->T, err) != 0 || grads_ready(m, top, MODEL_GRADS_MLP, err) != 0)
        return -1;
    for (int l = top; l >= d->layer_begin; l--) {
        int i = l - d->layer_begin;
        SpExchange gather = {{{0}}};
        c = (ModelChainBack){s, l, NULL, &gather};
        if (attention_backward(m, &s->layers[i], b, &c.a_full, &gather, err) != 0 ||
            (i > 0 && recompute_layer(m, b, l - 1, s->h[i - 1], &s->layers[i - 1], HALF_MLP, err) != 0) ||
            model_chain_backward(m, &c, b->T, err) != 0)
            return -1;
        if (grads_ready(m, l, MODEL_GRADS_ALL, err) != 0 || (i > 0 && grads_ready(m, l - 1, MODEL_GRADS_MLP, err) != 0))
            return -1;
        if (i > 0 && recompute_layer(m, b, l - 1, s->h[i - 1], &s->layers[i - 1], HALF_ATTN, err) != 0)
            return -1;
    }
    return 0;
}

/* The weights of layer l (-1: before the layers, layer_end: after them) are about to be read. */
static int weights_needed(Model *m, int l, Error *err)
{
    return m->weights_needed ? m->weights_needed(m->weights_needed_ctx, m, l, err) : 0;
}

/* The chunk's input (embedding or h_in) into h[0], its layers, and on the last chunk the final
 * norm into slot->hn. */
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
    int64_t R = model_rows(d, b->T);
    if (weights_needed(m, -1, err) != 0)
        return -1;
    if (d->has_embed) {
        if (model_embed_fwd(m, s->h[0], b, err) != 0)
            return -1;
    } else {
        m->ops->copy(s->h[0], h_in, R * d->d);
    }
    for (int l = d->layer_begin; l < d->layer_end; l++) {
        /* With SP layer l's pieces run on into layer l + 1's QKV product (model_chain.c). */
        int i = l - d->layer_begin, chained = d->sp && l + 1 < d->layer_end;
        if (weights_needed(m, l, err) != 0 || (chained && weights_needed(m, l + 1, err) != 0) ||
            layer_forward(m, b, l, s->h[i], s->h[i + 1], &s->layers[i], d->sp && l > d->layer_begin,
                          chained ? &s->layers[i + 1] : NULL, err) != 0)
            return -1;
    }
    if (weights_needed(m, d->layer_end, err) != 0)
        return -1;
    if (d->has_head)
        m->ops->rmsnorm_fwd(s->hn, s->rstd_f, s->h[d->layer_end - d->layer_begin], model_param(m, T_FINAL_NORM, -1),
                            R, d->d, d->norm_eps);
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
    const Ops *o = m->ops;
    /* The row's logits a tile of the head's block at a time (the block may be narrower than vocab). */
    HeadTiles t = model_head_tiles(d, m->logits_floats, m->cap);
    int64_t cols = t.rows * t.cols;
    for (int64_t c = 0; c < d->vocab; c += cols) {
        int64_t nc = d->vocab - c < cols ? d->vocab - c : cols;
        o->matmul_fwd(mat_f32(m->logits), ops_act(o, m->slots[0].hn, row * d->d),
                      ops_act(o, model_weight(m, T_HEAD, -1), c * d->d), 1, d->d, nc);
        o->to_host(logits + c, m->logits, (size_t)nc * sizeof *logits);
    }
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
    int64_t R = model_rows(d, b->T), D = d->d;
    if (slot < 0 || slot >= m->n_slots)
        return error_runtime(err, "model", "no activation slot %d (%d slots)", slot, m->n_slots);
    if (!d->has_head && !dh_out)
        return error_runtime(err, "model", "chunk of layers %d.. needs the gradient of its output", d->layer_begin);
    ModelSlot *s = &m->slots[slot];
    if (d->has_head) {
        o->zero(m->dh, R * D);
        o->rmsnorm_bwd(m->dh, m->dh_act, model_grad(m, T_FINAL_NORM, -1), s->dhn, s->h[d->layer_end - d->layer_begin],
                       model_param(m, T_FINAL_NORM, -1), s->rstd_f, R, D);
        if (grads_ready(m, d->layer_end, MODEL_GRADS_ALL, err) != 0)
            return -1;
    } else {
        o->copy(m->dh, dh_out, R * D);
        ops_cast(o, m->dh_act, DT_ACT, m->dh, DT_F32, R * D);
    }
    /* With SP the layers' backward runs chained, but a full recomputation's forward again would
     * overwrite the scratch a chain still reads: then, and without SP, a layer at a time. */
    if (d->sp && m->recompute != RECOMPUTE_FULL) {
        if (layers_backward_chained(m, s, b, err) != 0)
            return -1;
    } else {
        for (int l = d->layer_end - 1; l >= d->layer_begin; l--) {
            if (layer_backward(m, s, l, b, err) != 0)
                return -1;
            if (grads_ready(m, l, MODEL_GRADS_ALL, err) != 0)
                return -1;
        }
    }
    if (d->has_embed) {
        if (model_embed_bwd(m, m->dh, b, err) != 0)
            return -1;
        return grads_ready(m, -1, MODEL_GRADS_ALL, err);
    }
    o->copy(s->dx, m->dh, R * D);
    return 0;
}
