/*
 * engine/model/model_head.c - the vocabulary-parallel ends of the model: the token embedding and the
 * output projection with its cross-entropy (Megatron's VocabParallelEmbedding and
 * vocab_parallel_cross_entropy).
 *
 * TP rank r holds the vocabulary rows [vocab0, vocab0 + V) of the embedding and of the output
 * projection. Embedding: a rank writes the rows of the tokens in its slice and zeros elsewhere; the
 * all-reduce over TP puts every token's row on every rank. Cross-entropy of a row with logits z
 * spread over the ranks:
 *     m = max_r max_i z_i                       (all-reduce max)
 *     S = sum_r exp(m_r - m) sum_i exp(z_i - m_r) (each rank's sum from its own max m_r; all-reduce sum)
 *     lse = m + log S;   loss = lse - z_target  (z_target from the rank that holds it: all-reduce sum)
 *     dz_i = dloss (exp(z_i - lse) - [i = target])   on every rank for its own columns,
 * and the gradient of the normalized hidden state, dz W, is a partial sum over the vocabulary
 * slices, all-reduced over TP. Every TP rank ends with the same loss; the trainer counts one.
 * The rows go through in blocks (model_head_chunk) so that [T, V] logits never exist at once; the
 * logits are float32 (the loss is a difference of large numbers), their gradient is in the compute
 * dtype for the two products that read it.
 *
 * With sequence parallelism (model_sp.c) the stream has this rank's R rows: the embedding's partial
 * rows are reduce-scattered onto them instead of all-reduced (and its backward all-gathers the
 * gradient first); the head all-gathers the normed rows, computes the logits of all T rows as
 * above, and reduce-scatters the partial gradient dz W of all of them onto the R rows of dhn.
 */
#include <math.h>

#include "engine/model/model_impl.h"

int model_embed_fwd(Model *m, float *h, const ModelBatch *b, Error *err)
{
    const ModelDims *d = &m->dims;
    float *rows = d->sp ? m->tmp : h;
    m->ops->embedding_fwd(rows, b->tokens, b->T, model_param(m, T_EMBED, -1), d->vocab0, d->local_vocab, d->d);
    if (d->sp)
        return model_sp_scatter(m, m->tmp, b->T, h, err);
    return model_tp_allreduce(m, h, b->T * d->d, NULL, err);
}

int model_embed_bwd(Model *m, const float *dh, const ModelBatch *b, Error *err)
{
    const ModelDims *d = &m->dims;
    if (d->sp) {
        if (model_sp_gather(m, dh, DT_F32, b->T, m->tmp, err) != 0)
            return -1;
        dh = m->tmp;
    }
    m->ops->embedding_bwd(model_grad(m, T_EMBED, -1), b->tokens, dh, b->T, d->vocab0, d->local_vocab, d->d);
    return 0;
}

/* Rows [r, r + n) of the slot: logits, the loss of each row with a target, and with train their
 * gradient in m->dlogits. One pass over each row's logits gives its max, sum of exponentials and
 * target logit (ce_stats); the ranks' rows combine on the host in double. */
static int head_rows(Model *m, const ModelBatch *b, const Act *hn, int64_t r, int64_t n, int train, float dloss,
                     double *loss_sum, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t V = d->local_vocab;
    const int32_t *targets = b->targets + r;
    o->matmul_fwd(mat_f32(m->logits), ops_act(o, hn, r * d->d), model_weight(m, T_HEAD, -1), n, d->d, V);
    o->ce_stats(m->stats, m->logits, targets, n, V, d->vocab0);
    o->to_host(m->h_stats, m->stats, (size_t)(3 * n) * sizeof(double));
    o->to_host(m->h_targets, targets, (size_t)n * sizeof(int32_t));
    double *mx = m->h_lse; /* the row maxima, then lse in place */
    for (int64_t i = 0; i < n; i++)
        mx[i] = m->h_stats[3 * i];
    if (d->tp > 1) {
        /* The max over the ranks, each rank's sum rescaled to it, then the sums and target logits. */
        if (model_tp_allreduce_f64(m, mx, n, 1, err) != 0)
            return -1;
        for (int64_t i = 0; i < n; i++) {
            m->h_stats[3 * i + 1] *= exp(m->h_stats[3 * i] - mx[i]);
            m->h_stats[3 * i] = 0;
        }
        if (model_tp_allreduce_f64(m, m->h_stats, 3 * n, 0, err) != 0)
            return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        mx[i] += log(m->h_stats[3 * i + 1]); /* now lse */
        if (m->h_targets[i] >= 0) {
            *loss_sum += mx[i] - m->h_stats[3 * i + 2];
            if (b->row_loss)
                b->row_loss[r + i] = mx[i] - m->h_stats[3 * i + 2];
        }
    }
    if (train) {
        o->to_device(m->lse, mx, (size_t)n * sizeof(double));
        o->ce_grad(m->dlogits, m->logits, m->lse, targets, n, V, d->vocab0, dloss);
    }
    return 0;
}

int model_head_fwd(Model *m, ModelSlot *s, const ModelBatch *b, int train, float dloss, double *loss_sum,
                   Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t chunk = model_head_chunk(m), V = d->local_vocab;
    float *dw_out = model_grad(m, T_HEAD, -1);
    const Act *w_out = model_weight(m, T_HEAD, -1);
    /* With SP: all T normed rows in sp_full, their partial gradients in tmp. */
    const Act *hn = s->hn;
    float *dhn_all = d->sp ? m->tmp : s->dhn;
    if (d->sp) {
        if (model_sp_gather(m, s->hn, DT_ACT, b->T, m->sp_full, err) != 0)
            return -1;
        hn = m->sp_full;
    }
    for (int64_t r = 0; r < b->T; r += chunk) {
        int64_t n = b->T - r < chunk ? b->T - r : chunk;
        if (head_rows(m, b, hn, r, n, train, dloss, loss_sum, err) != 0)
            return -1;
        if (!train)
            continue;
        float *dhn = dhn_all + r * d->d;
        o->matmul_bwd_dw(dw_out, m->dlogits, ops_act(o, hn, r * d->d), n, d->d, V);
        o->matmul_bwd_dx(mat_f32(dhn), m->dlogits, w_out, n, d->d, V);
        if (!d->sp && model_tp_allreduce(m, dhn, n * d->d, NULL, err) != 0)
            return -1;
    }
    if (train && d->sp)
        return model_sp_scatter(m, m->tmp, b->T, s->dhn, err);
    return 0;
}
