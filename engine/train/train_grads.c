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
 * The global norm counts each element of the full model once: a block counts when its tensor is
 * marked counts (one of the TP replicas, the first chunk's copy of tied embeddings), and without
 * ZeRO only on the ranks with dp = cp = 0 (the others hold the same sums); with ZeRO every rank
 * counts its shard.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train.h"

static int sum_kv_replicas(Trainer *tr, Model *m, Error *err)
{
    const ModelDims *d = &m->dims;
    if (d->kv_replicas == 1)
        return 0;
    const Ops *o = m->ops;
    int64_t kvd = (int64_t)d->n_kv_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t layers = d->layer_end - d->layer_begin, per = 2 * kvd * d->d, n = layers * per;
    float *buf = o->alloc((size_t)(n ? n : 1) * sizeof *buf); /* zeroed */
    if (!buf)
        return error_runtime(err, "train", "out of memory");
    for (int l = d->layer_begin; l < d->layer_end; l++)
        for (int j = 0; j < 2; j++) {
            const ModelTensor *t = model_tensor(m, j ? T_WV : T_WK, l);
            o->copy(buf + (l - d->layer_begin) * per + j * kvd * d->d + t->row0 * d->d, m->grads + t->offset, lkv * d->d);
        }
    int rc = comm_allreduce_sum(tr->comm, GROUP_TP, buf, n, err);
    for (int l = d->layer_begin; rc == 0 && l < d->layer_end; l++)
        for (int j = 0; j < 2; j++) {
            const ModelTensor *t = model_tensor(m, j ? T_WV : T_WK, l);
            o->copy(m->grads + t->offset, buf + (l - d->layer_begin) * per + j * kvd * d->d + t->row0 * d->d, lkv * d->d);
        }
    o->free(buf);
    return rc;
}

/* Sequence parallelism: the norm weights' gradients (replicated over TP, each rank's from its own
 * rows) summed over TP, in place, one tensor at a time. */
static int sum_sp_norms(Trainer *tr, Model *m, Error *err)
{
    if (!m->dims.sp)
        return 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        if (t->is_vector && comm_allreduce_sum(tr->comm, GROUP_TP, m->grads + t->offset, t->cols, err) != 0)
            return -1;
    }
    return 0;
}

/* The first chunk (stage 0) and the last (stage pp - 1) swap their embedding gradients and add. */
static int sum_tied_embeddings(Trainer *tr, Error *err)
{
    if (!tr->cfg->model.tie_embeddings || tr->n_chunks == 1)
        return 0;
    int first = tr->lay.pp_rank == 0, last = tr->lay.pp_rank == tr->pp - 1;
    if (!first && !last)
        return 0;
    Model *a = &tr->chunks[0].model, *z = &tr->chunks[tr->v - 1].model;
    const Ops *o = a->ops;
    float *ga = first ? a->grads + model_tensor(a, T_EMBED, -1)->offset : NULL;
    float *gz = last ? z->grads + model_tensor(z, T_EMBED, -1)->offset : NULL;
    const ModelTensor *t = model_tensor(first ? a : z, T_EMBED, -1);
    int64_t n = t->rows * t->cols;
    if (first && last) { /* pp = 1: both chunks are here */
        o->add(ga, ga, gz, n);
        o->copy(gz, ga, n);
        return 0;
    }
    /* mine + other on one side, other + mine on the other: the same bits. */
    float *mine = first ? ga : gz, *other = o->alloc((size_t)n * sizeof *other);
    if (!other)
        return error_runtime(err, "train", "out of memory");
    CommRequest req = {0};
    int peer = first ? tr->pp - 1 : 0;
    int rc = comm_isend(tr->comm, GROUP_PP, peer, 0, mine, n, &req, err);
    if (rc == 0)
        rc = comm_recv(tr->comm, GROUP_PP, peer, 0, other, n, err);
    if (comm_wait(tr->comm, &req, rc == 0 ? err : &(Error){0}) != 0)
        rc = -1;
    if (rc == 0)
        o->add(mine, mine, other, n);
    o->free(other);
    return rc;
}

void trainer_shard_range(int64_t n, int g, int r, int64_t *begin, int64_t *end)
{
    *begin = n * r / g;
    *end = n * (r + 1) / g;
}

/* The shards' sizes over DP x CP (at most 4096 ranks: trainer_init checks). */
static void shard_counts(const Trainer *tr, const Model *m, int64_t *counts)
{
    int g = tr->comm->size[GROUP_DPCP];
    for (int r = 0; r < g; r++) {
        int64_t b, e;
        trainer_shard_range(m->n_params, g, r, &b, &e);
        counts[r] = e - b;
    }
}

int trainer_gather_shards(Trainer *tr, const Model *m, float *full, const float *shard, Error *err)
{
    int64_t counts[4096], b, e;
    shard_counts(tr, m, counts);
    trainer_optim_range(tr, m, &b, &e);
    if (shard && shard != full + b)
        m->ops->copy(full + b, shard, e - b);
    return comm_allgatherv(tr->comm, GROUP_DPCP, NULL, full, counts, DT_F32, err);
}

int trainer_reduce_grads(Trainer *tr, Error *err)
{
    Comm *c = tr->comm;
    tr->grads_gathered = 0;
    for (int k = 0; k < tr->v; k++)
        if (sum_sp_norms(tr, &tr->chunks[k].model, err) != 0 || sum_kv_replicas(tr, &tr->chunks[k].model, err) != 0)
            return -1;
    if (sum_tied_embeddings(tr, err) != 0)
        return -1;
    for (int k = 0; k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        Model *m = &ch->model;
        if (!tr->cfg->parallel.zero) {
            if (comm_allreduce_sum(c, GROUP_DPCP, m->grads, m->n_params, err) != 0)
                return -1;
            continue;
        }
        int64_t counts[4096];
        shard_counts(tr, m, counts);
        if (comm_reduce_scatterv(c, GROUP_DPCP, m->grads, ch->shard_grads, counts, err) != 0)
            return -1;
    }
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
        if (tr->cfg->train.nonfinite != NONFINITE_SKIP)
            return error_runtime(err, "train", "step %lld: the %s is %g; stopping (train.nonfinite: stop; lower "
                                 "train.lr, or skip such steps with train.nonfinite: skip)",
                                 (long long)tr->plan.step + 1, isfinite(st->loss) ? "gradient norm" : "loss",
                                 isfinite(st->loss) ? st->grad_norm : st->loss);
        st->skipped = 1;
        tr->skipped++;
        return 0;
    }
    for (int k = 0; k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        Model *m = &ch->model;
        st->lr = optim_update(&ch->optim, m, zero ? ch->shard_grads : m->grads, st->grad_norm, !zero);
        if (zero) { /* every rank's updated shard; then the compute copy of the whole */
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
    if (grads && gather_shard_grads(tr, err) != 0)
        return -1;
    const float *arrays[64];
    for (int k = 0; k < tr->v; k++)
        arrays[k] = grads ? tr->chunks[k].model.grads : tr->chunks[k].model.params;
    return trainer_gather_arrays(tr, name, arrays, full, err);
}
