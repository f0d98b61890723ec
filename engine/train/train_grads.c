/*
 * engine/train/train_grads.c - from every rank's gradients to the update (see train.h, steps 3 and 4).
 *
 * After the pipeline a rank holds the gradient of its block of the weights from its own tokens.
 *   norms (SP)   with sequence parallelism each TP rank normalized its own rows of the stream:
 *                its norm weights' gradients are partial sums over them, summed over TP.
 *   kv replicas  with tp > n_kv_heads, tp / n_kv_heads TP ranks hold the same kv head and each
 *                has the part of its gradient that its own query heads caused: summed over them.
 *                (An all-reduce over TP of a buffer with a place per kv head: a rank writes its
 *                part at its head's place, the others' places stay zero.)
 *   tied         with tied embeddings on more than one chunk, the first chunk's embedding and the
 *                last chunk's output projection are the same weights: their gradients are summed
 *                (exchanged between the two stages), so both copies stay equal.
 *   DP x CP      the ranks that differ in dp or cp hold the same block, each with the gradient of
 *                other tokens: all-reduced (or with ZeRO-1 reduce-scattered, each rank getting its
 *                shard of the sum).
 * Buckets (train.h): the DP x CP reduction runs per bucket of a chunk's gradients - the tensors
 * after the layers (final norm, output projection), each layer's, and at the bottom the tensors
 * before the layers (the embedding) - each as soon as its gradients are final: with
 * parallel.overlap a layer's bucket starts when the chunk's last micro-batch's backward has passed
 * the layer (Model.grads_ready) and runs while the backward goes on to the layers below. Below the
 * chunk's first layer nothing is left to run beside but the embedding's backward, so that layer is
 * split: its MLP half (norm and three products, two thirds of a Llama layer's weights) is a bucket
 * that starts as soon as the MLP's backward is done and runs beside the attention half's; the
 * attention half goes last, in one bucket with the embedding that lies next to it (one collective
 * less at the end, where each one's cost shows). The last chunk's final norm and output projection
 * start once the backward has passed the final norm (a tied output projection is the embedding's
 * copy, placed before the layers, model.c); the bottom bucket once the first chunk's backward is
 * done, or after the pipeline when tied embeddings span two chunks (summed first). Without overlap
 * (or on a rank whose replica ran no backward on the chunk) every bucket runs after the pipeline,
 * in the same sizes and order - the chunks from last to first, each its tail, its layers top first,
 * the first layer's MLP half, then the bottom buckets (the embeddings' after their sum) - so both
 * give the same bits and pair with the peers' collectives. A bucket's TP sums (SP norms, kv
 * replicas) run just before it starts.
 * The global norm counts each element of the full model once: a block counts when its tensor is
 * marked counts (one of the TP replicas, the first chunk's copy of tied embeddings), and without
 * ZeRO only on the ranks with dp = cp = 0 (the others hold the same sums); with ZeRO every rank
 * counts its shard.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train.h"

/* Layer l's kv replicas of chunk k summed over TP, through the chunk's scratch buffer (kv_scratch,
 * allocated once at setup: no allocation on the backward's path). */
static int sum_kv_replicas(Trainer *tr, int k, int l, Error *err)
{
    Model *m = &tr->chunks[k].model;
    const ModelDims *d = &m->dims;
    if (d->kv_replicas == 1)
        return 0;
    const Ops *o = m->ops;
    int64_t kvd = (int64_t)d->n_kv_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t n = 2 * kvd * d->d;
    float *buf = tr->chunks[k].kv_scratch;
    if (!buf)
        return error_runtime(err, "train", "no scratch buffer for the kv replicas' sum");
    o->zero(buf, n);
    for (int j = 0; j < 2; j++) {
        const ModelTensor *t = model_tensor(m, j ? T_WV : T_WK, l);
        o->copy(buf + j * kvd * d->d + t->row0 * d->d, m->grads + t->offset, lkv * d->d);
    }
    int rc = comm_allreduce_sum(tr->comm, GROUP_TP, buf, n, err);
    for (int j = 0; rc == 0 && j < 2; j++) {
        const ModelTensor *t = model_tensor(m, j ? T_WV : T_WK, l);
        o->copy(m->grads + t->offset, buf + j * kvd * d->d + t->row0 * d->d, lkv * d->d);
    }
    return rc;
}

/* Sequence parallelism: the norm weights' gradients in [lo, hi) of m's (replicated over TP, each
 * rank's from its own rows) summed over TP, in place, one tensor at a time. */
static int sum_sp_norms(Trainer *tr, Model *m, int64_t lo, int64_t hi, Error *err)
{
    if (!m->dims.sp)
        return 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        if (t->is_vector && t->offset >= lo && t->offset < hi &&
            comm_allreduce_sum(tr->comm, GROUP_TP, m->grads + t->offset, t->cols, err) != 0)
            return -1;
    }
    return 0;
}

/* The first chunk (stage 0) and the last (stage pp - 1) swap their embedding gradients and add:
 * one exchange (comm_exchange: the send and the receive as one operation, so the two stages cannot
 * wait for each other), into the chunk's scratch allocated at setup. */
static int sum_tied_embeddings(Trainer *tr, Error *err)
{
    if (!tr->cfg->model.tie_embeddings || tr->n_chunks == 1)
        return 0;
    int first = tr->lay.pp_rank == 0, last = tr->lay.pp_rank == tr->pp - 1;
    if (!first && !last)
        return 0;
    TrainChunk *a = &tr->chunks[0], *z = &tr->chunks[tr->v - 1];
    const Ops *o = a->model.ops;
    const ModelTensor *t = model_tensor(first ? &a->model : &z->model, T_EMBED, -1);
    int64_t n = t->rows * t->cols;
    float *ga = first ? a->model.grads + t->offset : NULL;
    float *gz = last ? z->model.grads + model_tensor(&z->model, T_EMBED, -1)->offset : NULL;
    if (first && last) { /* pp = 1: both chunks are here */
        o->add(ga, ga, gz, n);
        o->copy(gz, ga, n);
        return 0;
    }
    /* mine + other on one side, other + mine on the other: the same bits. */
    TrainChunk *ch = first ? a : z;
    float *mine = first ? ga : gz;
    if (comm_exchange(tr->comm, GROUP_PP, first ? tr->pp - 1 : 0, mine, ch->tied_scratch, n, err) != 0)
        return -1;
    o->add(mine, mine, ch->tied_scratch, n);
    return 0;
}

void trainer_shard_range(int64_t n, int g, int r, int64_t *begin, int64_t *end)
{
    *begin = n * r / g;
    *end = n * (r + 1) / g;
}

/* The part of [lo, hi) of m's parameters in each rank's shard over DP x CP (at most 4096 ranks:
 * trainer_init checks); [0, n_params): the shards' sizes. */
void trainer_shard_counts(const Trainer *tr, const Model *m, int64_t lo, int64_t hi, int64_t *counts)
{
    int g = tr->comm->size[GROUP_DPCP];
    for (int r = 0; r < g; r++) {
        int64_t b, e;
        trainer_shard_range(m->n_params, g, r, &b, &e);
        int64_t from = lo > b ? lo : b, to = hi < e ? hi : e;
        counts[r] = to > from ? to - from : 0;
    }
}

int trainer_gather_shards(Trainer *tr, const Model *m, float *full, const float *shard, Error *err)
{
    int64_t counts[4096], b, e;
    trainer_shard_counts(tr, m, 0, m->n_params, counts);
    trainer_optim_range(tr, m, &b, &e);
    if (shard && shard != full + b)
        m->ops->copy(full + b, shard, e - b);
    return comm_allgatherv(tr->comm, GROUP_DPCP, NULL, full, counts, DT_F32, err);
}

/* Where layer l's tensors begin in m's parameters; for l = layer_end, where the tensors after the
 * layers do. A layer's tensors follow each other from its attention norm to its down projection,
 * the layers one after another, the tensors after them last (model.c). */
static int64_t layer_start(const Model *m, int l)
{
    if (l < m->dims.layer_end)
        return model_tensor(m, T_ATTN_NORM, l)->offset;
    const ModelTensor *t = model_tensor(m, T_WDOWN, l - 1);
    return t->offset + t->rows * t->cols;
}

/* Bucket b of m's gradients (train.h). The tensors before the layers (from 0) and the first layer's
 * attention half end where its MLP norm begins. */
void trainer_bucket_range(const Model *m, int b, int64_t *lo, int64_t *hi)
{
    int first = m->dims.layer_begin, layers = m->dims.layer_end - first;
    int64_t mlp = model_tensor(m, T_MLP_NORM, first)->offset;
    if (b == 0) {
        *lo = 0;
        *hi = mlp;
    } else if (b == TRAINER_BUCKET_FIRST_MLP(layers)) {
        *lo = mlp;
        *hi = layer_start(m, first + 1);
    } else if (b == TRAINER_BUCKET_TAIL(layers)) {
        *lo = layer_start(m, m->dims.layer_end);
        *hi = m->n_params;
    } else {
        *lo = layer_start(m, first + b);
        *hi = layer_start(m, first + b + 1);
    }
}

/* Bucket b of chunk k has its final gradients: its TP sums (the SP norms in it, the kv replicas of
 * its layer's attention), then its reduction over DP x CP started: all-reduced in place, or with
 * ZeRO-1 reduce-scattered, each rank getting the part of the bucket that falls in its shard. */
static int start_bucket(Trainer *tr, int k, int b, Error *err)
{
    TrainChunk *ch = &tr->chunks[k];
    Model *m = &ch->model;
    int layers = m->dims.layer_end - m->dims.layer_begin;
    int64_t lo, hi;
    trainer_bucket_range(m, b, &lo, &hi);
    ch->bucket_started[b] = 1;
    if (sum_sp_norms(tr, m, lo, hi, err) != 0 || (b < layers && sum_kv_replicas(tr, k, m->dims.layer_begin + b, err) != 0))
        return -1;
    if (hi <= lo)
        return 0;
    if (!tr->cfg->parallel.zero)
        return comm_iallreduce_sum(tr->comm, GROUP_DPCP, m->grads + lo, hi - lo, &ch->grad_req[b], err);
    int64_t counts[4096], mine_b, mine_e;
    trainer_shard_counts(tr, m, lo, hi, counts);
    trainer_optim_range(tr, m, &mine_b, &mine_e);
    float *recv = ch->shard_grads + (lo > mine_b && lo < mine_e ? lo - mine_b : 0);
    return comm_ireduce_scatterv(tr->comm, GROUP_DPCP, m->grads + lo, recv, counts, &ch->grad_req[b], err);
}

/* The embedding's bucket of chunk k can start when its backward is done: unless tied embeddings
 * span two chunks, whose gradients are summed (sum_tied_embeddings) after the pipeline first. */
static int embed_bucket_early(const Trainer *tr)
{
    return !tr->cfg->model.tie_embeddings || tr->n_chunks == 1;
}

/* Bucket 0 of m holds tensors before the first layer (the embedding, or a tied output projection's
 * copy): it starts once they are final (the embedding's backward, or the tied copies' sum), not with
 * the first layer's attention half. */
static int bottom_waits(const Model *m)
{
    return model_tensor(m, T_EMBED, -1) != NULL;
}

int trainer_layer_grads_ready(void *ctx, Model *m, int layer, ModelGradsPart part, Error *err)
{
    Trainer *tr = ctx;
    int layers = m->dims.layer_end - m->dims.layer_begin, b = layer - m->dims.layer_begin;
    for (int k = 0; k < tr->v; k++) {
        if (&tr->chunks[k].model != m)
            continue;
        if (part == MODEL_GRADS_MLP) /* only the first layer's halves are buckets of their own */
            return b == 0 ? start_bucket(tr, k, TRAINER_BUCKET_FIRST_MLP(layers), err) : 0;
        if (layer < 0) /* the embedding's backward is done */
            return embed_bucket_early(tr) ? start_bucket(tr, k, 0, err) : 0;
        if (b == 0 && bottom_waits(m))
            return 0;
        return start_bucket(tr, k, b < layers ? b : TRAINER_BUCKET_TAIL(layers), err);
    }
    return error_runtime(err, "train", "gradients of a model chunk the trainer does not hold");
}

int trainer_reduce_grads(Trainer *tr, Error *err)
{
    tr->grads_gathered = 0;
    /* The buckets not started during the backward, in the backward's order (a rank whose replica
     * ran no backward pass on a chunk issues the same collectives in the same order as its peers
     * that did): the chunks' last backward passes run from the last chunk to the first (sched.c),
     * each the final norm and output projection (the head's chunk), then the layers top first. */
    for (int k = tr->v - 1; k >= 0; k--) {
        TrainChunk *ch = &tr->chunks[k];
        int layers = ch->model.dims.layer_end - ch->model.dims.layer_begin, mlp = TRAINER_BUCKET_FIRST_MLP(layers);
        if (!ch->bucket_started[TRAINER_BUCKET_TAIL(layers)] && start_bucket(tr, k, TRAINER_BUCKET_TAIL(layers), err) != 0)
            return -1;
        for (int b = layers - 1; b >= 1; b--)
            if (!ch->bucket_started[b] && start_bucket(tr, k, b, err) != 0)
                return -1;
        if ((!ch->bucket_started[mlp] && start_bucket(tr, k, mlp, err) != 0) ||
            (!bottom_waits(&ch->model) && !ch->bucket_started[0] && start_bucket(tr, k, 0, err) != 0))
            return -1;
    }
    if (sum_tied_embeddings(tr, err) != 0)
        return -1;
    for (int k = 0; k < tr->v; k++) /* the buckets with the embeddings */
        if (!tr->chunks[k].bucket_started[0] && start_bucket(tr, k, 0, err) != 0)
            return -1;
    for (int k = 0; k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        int buckets = trainer_bucket_count(&ch->model);
        for (int b = 0; b < buckets; b++) {
            ch->bucket_started[b] = 0;
            if (comm_wait(tr->comm, &ch->grad_req[b], err) != 0)
                return -1;
        }
    }
    /* ZeRO-1 with overlap: the parameters' all-gathers of a chunk that ran no forward this step
     * (the forward waits for the others) - before the count, and before the update reads them. */
    if (trainer_params_ready(tr, err) != 0)
        return -1;
    int64_t left = comm_outstanding(tr->comm);
    if (left != 0)
        return error_runtime(err, "train", "step %lld: %lld communication requests still outstanding after the "
                             "gradients' reduction", (long long)tr->plan.step + 1, (long long)left);
    return 0;
}

int trainer_update(Trainer *tr, TrainStats *st, Error *err)
{
    Comm *c = tr->comm;
    int zero = (int)tr->cfg->parallel.zero, counts_here = zero || (tr->lay.dp_rank == 0 && tr->lay.cp_rank == 0);
    double sumsq = 0;
    for (int k = 0; k < tr->v && counts_here; k++) {
        TrainChunk *ch = &tr->chunks[k];
        sumsq += optim_grad_sumsq(&ch->optim, &ch->model, zero ? ch->shard_grads : ch->model.grads);
    }
    if (comm_allreduce_sum_f64(c, GROUP_WORLD, &sumsq, 1, err) != 0)
        return -1;
    st->grad_norm = sqrt(sumsq);
    st->lr = optim_lr(&tr->cfg->train, tr->chunks[0].optim.step + 1 - tr->chunks[0].optim.lr_step0);
    /* Every rank sees the same loss and norm, so all of them decide alike. */
    if (!isfinite(st->loss) || !isfinite(st->grad_norm)) {
        /* Before any update of this run the learning rate cannot be the cause: the weights it
         * started from (train.init_from, a checkpoint) or the model's settings are. */
        int first = tr->chunks[0].optim.step == tr->updates_at_start;
        if (tr->cfg->train.nonfinite != NONFINITE_SKIP)
            return error_runtime(err, "train", "step %lld: the %s is %g; stopping (train.nonfinite: stop; %s)",
                                 (long long)tr->plan.step + 1, isfinite(st->loss) ? "gradient norm" : "loss",
                                 isfinite(st->loss) ? st->grad_norm : st->loss,
                                 first ? "before any update of this run, so not the learning rate: check the weights "
                                         "it started from (train.init_from, the checkpoint) for NaN or infinite values "
                                         "and the model's settings (model.rope_*, model.norm_eps)"
                                       : "lower train.lr, or skip such steps with train.nonfinite: skip");
        st->skipped = 1;
        tr->skipped++;
        return 0;
    }
    for (int k = 0; k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        Model *m = &ch->model;
        st->lr = optim_update(&ch->optim, m, zero ? ch->shard_grads : m->grads, st->grad_norm, !zero);
        if (zero && tr->cfg->parallel.overlap) { /* bucket by bucket, ahead of the next forward */
            if (trainer_start_param_gather(tr, k, err) != 0)
                return -1;
        } else if (zero) { /* every rank's updated shard; then the compute copy of the whole */
            if (trainer_gather_shards(tr, m, m->params, NULL, err) != 0)
                return -1;
            model_weights_changed(m);
        }
    }
    return 0;
}

void trainer_optim_range(const Trainer *tr, const Model *m, int64_t *begin, int64_t *end)
{
    if (!tr->cfg->parallel.zero) {
        *begin = 0;
        *end = m->n_params;
        return;
    }
    trainer_shard_range(m->n_params, tr->comm->size[GROUP_DPCP], tr->comm->rank[GROUP_DPCP], begin, end);
}

/* ZeRO-1 keeps only a shard of the summed gradients: put the sum back together in grads. */
static int gather_shard_grads(Trainer *tr, Error *err)
{
    if (!tr->cfg->parallel.zero || tr->grads_gathered)
        return 0;
    for (int k = 0; k < tr->v; k++)
        if (trainer_gather_shards(tr, &tr->chunks[k].model, tr->chunks[k].model.grads, tr->chunks[k].shard_grads,
                                err) != 0)
            return -1;
    tr->grads_gathered = 1;
    return 0;
}

int trainer_gather_arrays(Trainer *tr, const char *name, const float *const *arrays, float *full, Error *err)
{
    const ModelDims *d = &tr->chunks[0].model.dims;
    int64_t rows = 0, cols = 0;
    int vec, found = 0;
    for (int i = 0; i < model_full_tensor_count(d) && !found; i++) {
        char n[96];
        model_full_tensor(d, i, n, sizeof n, &rows, &cols, &vec);
        found = !strcmp(n, name);
    }
    if (!found)
        return error_runtime(err, "train", "no tensor %s in the model", name);
    memset(full, 0, (size_t)(rows * cols) * sizeof *full);
    /* The ranks with dp = cp = 0 add the blocks they count; the sum over the job is each block
     * once (x + 0 = x exactly). */
    if (tr->lay.dp_rank == 0 && tr->lay.cp_rank == 0)
        for (int k = 0; k < tr->v; k++) {
            const Model *m = &tr->chunks[k].model;
            const ModelTensor *t = model_tensor_by_name(m, name);
            if (!t || !t->counts)
                continue;
            for (int64_t r = 0; r < t->rows; r++)
                m->ops->to_host(full + (t->row0 + r) * t->full_cols + t->col0, arrays[k] + t->offset + r * t->cols,
                                (size_t)t->cols * sizeof *full);
        }
    return comm_allreduce_sum_host(tr->comm, GROUP_WORLD, full, rows * cols, err);
}

int trainer_gather(Trainer *tr, const char *name, int grads, float *full, Error *err)
{
    if (trainer_params_ready(tr, err) != 0)
        return -1;
    if (grads && gather_shard_grads(tr, err) != 0)
        return -1;
    const float *arrays[64];
    for (int k = 0; k < tr->v; k++)
        arrays[k] = grads ? tr->chunks[k].model.grads : tr->chunks[k].model.params;
    return trainer_gather_arrays(tr, name, arrays, full, err);
}
