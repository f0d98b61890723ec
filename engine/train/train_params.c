/*
 * engine/train/train_params.c - ZeRO-1's parameter all-gather ahead of the next forward (see
 * train.h, trainer_start_param_gather).
 *
 * After the update each rank of DP x CP holds its shard of the new parameters, in place in params.
 * With parallel.overlap the all-gather that puts the whole back together runs per bucket (the
 * gradient buckets, trainer_bucket_range: the embedding's with the first layer's attention half,
 * that layer's MLP half, each other layer's, the output layer's), all started at once and run in
 * that order by the group's communication thread, while the rank goes on (the step's end, the next plan, the next forward's first layers). The forward
 * waits for a bucket just before the first layer that reads it (Model.weights_needed), then writes
 * the bucket's compute-dtype copy. An all-gather only copies: the parameters are the same bits as
 * the single all-gather without overlap.
 */
#include "engine/train/train.h"

/* The last bucket of m that the forward needs before it reads the weights of layer (-1: before
 * the layers, layer_end: after): in forward order 0, TRAINER_BUCKET_FIRST_MLP, 1 .. layers - 1,
 * TRAINER_BUCKET_TAIL. */
static int bucket_of(const Model *m, int layer)
{
    int layers = m->dims.layer_end - m->dims.layer_begin;
    if (layer < m->dims.layer_begin)
        return 0;
    if (layer >= m->dims.layer_end)
        return TRAINER_BUCKET_TAIL(layers);
    return layer == m->dims.layer_begin ? TRAINER_BUCKET_FIRST_MLP(layers) : layer - m->dims.layer_begin;
}

/* Bucket b of chunk k gathered: its compute-dtype copy written. */
static int finish_bucket(Trainer *tr, TrainChunk *ch, int b, Error *err)
{
    if (!ch->param_pending[b])
        return 0;
    ch->param_pending[b] = 0;
    if (comm_wait(tr->comm, &ch->param_req[b], err) != 0)
        return -1;
    int64_t lo, hi;
    trainer_bucket_range(&ch->model, b, &lo, &hi);
    model_weights_changed_range(&ch->model, lo, hi);
    return 0;
}

/* Bucket b of chunk k's all-gather started. */
static int start_bucket_gather(Trainer *tr, TrainChunk *ch, int b, Error *err)
{
    Model *m = &ch->model;
    int64_t lo, hi, counts[4096];
    trainer_bucket_range(m, b, &lo, &hi);
    trainer_shard_counts(tr, m, lo, hi, counts);
    ch->param_pending[b] = 1;
    return hi > lo ? comm_iallgatherv(tr->comm, GROUP_DPCP, NULL, m->params + lo, counts, DT_F32, &ch->param_req[b], err)
                   : 0;
}

int trainer_start_param_gather(Trainer *tr, int k, Error *err)
{
    TrainChunk *ch = &tr->chunks[k];
    int layers = ch->model.dims.layer_end - ch->model.dims.layer_begin;
    if (start_bucket_gather(tr, ch, 0, err) != 0 ||
        start_bucket_gather(tr, ch, TRAINER_BUCKET_FIRST_MLP(layers), err) != 0)
        return -1;
    for (int b = 1; b < layers; b++)
        if (start_bucket_gather(tr, ch, b, err) != 0)
            return -1;
    return start_bucket_gather(tr, ch, TRAINER_BUCKET_TAIL(layers), err);
}

int trainer_weights_needed(void *ctx, Model *m, int layer, Error *err)
{
    Trainer *tr = ctx;
    for (int k = 0; k < tr->v; k++) {
        if (&tr->chunks[k].model != m)
            continue;
        /* Bucket 0 first: the first layer reads both halves of its weights. */
        int b = bucket_of(m, layer);
        return finish_bucket(tr, &tr->chunks[k], 0, err) != 0 || finish_bucket(tr, &tr->chunks[k], b, err) != 0 ? -1 : 0;
    }
    return 0; /* a model the trainer does not hold (none: every forward runs a chunk) */
}

int trainer_params_ready(Trainer *tr, Error *err)
{
    for (int k = 0; tr->chunks && k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        int buckets = trainer_bucket_count(&ch->model);
        for (int b = 0; ch->param_pending && b < buckets; b++)
            if (finish_bucket(tr, ch, b, err) != 0)
                return -1;
    }
    return 0;
}
