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
 * The rows go through in blocks, each a tile of the slice's columns at a time (head_block,
 * model_head_tiles), so that no more than one block of logits exists at once; the logits are
 * float32 (the loss is a difference of large numbers), their gradient is in the compute dtype for
 * the two products that read it.
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

/* Rows [r, r + n) of hn: the loss of each row with a target, and with train the head's weight
 * gradient (dw_out += ) and the rows' input gradient (dhn, overwritten: this rank's partial sum over
 * its vocabulary slice). The slice goes a tile of t.cols columns at a time (model_head_tiles):
 *
 *   forward   for each tile j: z_j = hn W_j^T [n, cols] (float32), its (max, sum exp, target logit)
 *             merged into each row's running statistics on the device (ce_stats: online softmax
 *             across tiles, as FlashAttention merges key blocks); after the last tile the ranks'
 *             statistics combine into lse on the host (the TP all-reduces above);
 *   backward  for each tile j: dz_j = dloss (exp(z_j - lse) - onehot) in the compute dtype,
 *             dW_j += dz_j^T hn, dhn += dz_j W_j (the first tile writes dhn).
 *
 * With one tile (the whole slice) z stays in m->logits between the two passes: the block's product
 * runs once, as in Liger-Kernel's fused linear cross-entropy (the rows of a block go through the
 * product, the loss and the gradient before the next block is computed). With several tiles the
 * backward computes z_j again from hn and W_j (Cut Cross-Entropy's approach: what is kept per row is
 * the statistics, never the logits), one more product of the head in exchange for a logits block
 * that does not grow with the vocabulary. The sums over tiles are the unfused sums in another order:
 * the loss and gradients equal one tile's to float rounding (test/test_model_modes.c). */
static int head_block(Model *m, const ModelBatch *b, const Act *hn, float *dhn, HeadTiles t, int64_t r, int64_t n,
                      int train, float dloss, double *loss_sum, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t V = d->local_vocab;
    const int32_t *targets = b->targets + r;
    const Act *x = ops_act(o, hn, r * d->d), *w_out = model_weight(m, T_HEAD, -1);
    for (int64_t c = 0; c < V; c += t.cols) {
        int64_t nc = V - c < t.cols ? V - c : t.cols;
        o->matmul_fwd(mat_f32(m->logits), x, ops_act(o, w_out, c * d->d), n, d->d, nc);
        o->ce_stats(m->stats, m->logits, targets, n, nc, d->vocab0 + c, c == 0);
    }
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
    if (!train)
        return 0;
    o->to_device(m->lse, mx, (size_t)n * sizeof(double));
    float *dw_out = model_grad(m, T_HEAD, -1);
    for (int64_t c = 0; c < V; c += t.cols) {
        int64_t nc = V - c < t.cols ? V - c : t.cols;
        const Act *w = ops_act(o, w_out, c * d->d);
        if (nc < V) /* several tiles: the last tile's logits are in m->logits, this one's are not */
            o->matmul_fwd(mat_f32(m->logits), x, w, n, d->d, nc);
        o->ce_grad(m->dlogits, m->logits, m->lse, targets, n, nc, d->vocab0 + c, dloss);
        o->matmul_bwd_dw(dw_out + c * d->d, m->dlogits, x, n, d->d, nc);
        o->matmul_bwd_dx(c == 0 ? mat_f32(dhn) : mat_f32_plus(dhn, dhn), m->dlogits, w, n, d->d, nc);
    }
    return 0;
}

int model_head_fwd(Model *m, ModelSlot *s, const ModelBatch *b, int train, float dloss, double *loss_sum,
                   Error *err)
{
    const ModelDims *d = &m->dims;
    HeadTiles t = model_head_tiles(d, m->logits_floats, m->cap); /* the tiles the scratch was made for */
    /* With SP: all T normed rows in sp_full, their partial gradients in tmp. */
    const Act *hn = s->hn;
    float *dhn_all = d->sp ? m->tmp : s->dhn;
    if (d->sp) {
        if (model_sp_gather(m, s->hn, DT_ACT, b->T, m->sp_full, err) != 0)
            return -1;
        hn = m->sp_full;
    }
    for (int64_t r = 0; r < b->T; r += t.rows) {
        int64_t n = b->T - r < t.rows ? b->T - r : t.rows;
        float *dhn = dhn_all + r * d->d;
        if (head_block(m, b, hn, dhn, t, r, n, train, dloss, loss_sum, err) != 0)
            return -1;
        if (train && !d->sp && model_tp_allreduce(m, dhn, n * d->d, NULL, err) != 0)
            return -1;
    }
    if (train && d->sp)
        return model_sp_scatter(m, m->tmp, b->T, s->dhn, err);
    return 0;
}
