/*
 * engine/train/train_ckpt_load.c - a checkpoint's weights and moments into a trainer of any layout
 * (trainer_restore_shards, train.h; the format: train_ckpt.c). On the layout that saved it each rank
 * copies its chunk vectors as saved; on any other each block comes from the full tensor rebuilt from
 * the index's blocks, one tensor at a time in host memory. Either way every file a rank reads is
 * opened and checked first (util/ckpt_index.h: its CRCs, and with a bound index its ident, size and
 * whole CRC-32) in a pass that copies nothing, so no weight is taken from a checkpoint with a bad file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train.h"
#include "util/ckpt_index.h"

/* Another layout saved it: each of this rank's blocks from the full tensor rebuilt from the index's
 * blocks (weights, then m and v clipped to the optimizer's range), one tensor at a time. */
static int reshard_chunk(Trainer *tr, CkptIndex *ix, TrainChunk *ch, int weights_only, float *full, float *tmp,
                         float *block, Error *err)
{
    Model *m = &ch->model;
    Optim *o = &ch->optim;
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        const CkptTensor *it = ckpt_index_tensor(ix, t->name);
        int64_t n = t->rows * t->cols, lo = t->offset > o->begin ? t->offset : o->begin;
        int64_t hi = t->offset + n < o->end ? t->offset + n : o->end;
        for (int what = 0; what < 3; what++) {
            if (what > 0 && (weights_only || lo >= hi))
                break; /* no moments wanted, or none of this block here (a ZeRO-1 shard elsewhere) */
            if (ckpt_index_full(ix, it, what, full, tmp, err) != 0)
                return -1;
            if (ix->verify_only)
                continue; /* the files checked, nothing copied */
            for (int64_t r = 0; r < t->rows; r++)
                memcpy(block + r * t->cols, full + (t->row0 + r) * t->full_cols + t->col0, (size_t)t->cols * sizeof *full);
            if (what == 0)
                tr->ops->to_device(m->params + t->offset, block, (size_t)n * sizeof *block);
            else
                tr->ops->to_device((what == 1 ? o->m : o->v) + (lo - o->begin), block + (lo - t->offset),
                                   (size_t)(hi - lo) * sizeof *block);
        }
    }
    return 0;
}

static void put_device(void *ctx, float *dst, const float *src, int64_t n)
{
    ((const Ops *)ctx)->to_device(dst, src, (size_t)n * sizeof *dst);
}

/* 1 when the index's chunks hold the layers the config's do (an index without stage_layers split
 * them evenly). */
static int same_split(const CkptIndex *ix, const Config *cfg)
{
    int chunks = ix->pp * ix->virtual_stages;
    const ConfigIntList *mine = &cfg->parallel.chunk_layers;
    for (int g = 0; g < chunks && g < mine->n; g++) {
        int64_t even = cfg->model.n_layers / chunks + (g < cfg->model.n_layers % chunks);
        if ((ix->stage_layers ? ix->stage_layers[g] : even) != mine->v[g])
            return 0;
    }
    return chunks == mine->n;
}

/* Every chunk's weights (and moments) from the shards: as saved (same) or resharded. */
static int load_chunks(Trainer *tr, CkptIndex *ix, int same, int weights_only, float *full, float *tmp, float *block,
                       const char *path, Error *err)
{
    int rc = 0;
    for (int k = 0; rc == 0 && k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        Model *m = &ch->model;
        Optim *o = &ch->optim;
        if (same) {
            const CkptChunk *c = ckpt_index_chunk(ix, tr->lay.tp_rank, k * tr->pp + tr->lay.pp_rank);
            if (!c || c->n != m->n_params)
                rc = error_set(err, path, "index.json: chunk %d of TP rank %d is not this layout's",
                               k * tr->pp + tr->lay.pp_rank, tr->lay.tp_rank);
            if (rc == 0)
                rc = ckpt_index_range(ix, c, 0, 0, m->n_params, put_device, (void *)tr->ops, m->params, err);
            if (rc == 0 && !weights_only)
                rc = ckpt_index_range(ix, c, 1, o->begin, o->end, put_device, (void *)tr->ops, o->m, err);
            if (rc == 0 && !weights_only)
                rc = ckpt_index_range(ix, c, 2, o->begin, o->end, put_device, (void *)tr->ops, o->v, err);
        } else {
            rc = reshard_chunk(tr, ix, ch, weights_only, full, tmp, block, err);
        }
        if (rc == 0 && !ix->verify_only)
            model_weights_changed(m);
    }
    return rc;
}

/* Weights and moments (weights_only: weights) of every chunk from the shards. On the layout that
 * saved them (tp, pp, virtual_stages) the chunk's parameter vector is the saved one: its weights come
 * from the one section that holds them and its moments from the shards that overlap its optimizer
 * range (its own with the same ZeRO-1 layout), copied as they are. Otherwise each block is resharded. */
int trainer_restore_shards(Trainer *tr, CkptIndex *ix, int64_t step, int weights_only, const char *path, Error *err)
{
    const ConfigParallel *p = &tr->cfg->parallel;
    const ModelDims *d = &tr->chunks[0].model.dims;
    int same = ix->tp == p->tp && ix->pp == p->pp && ix->virtual_stages == p->virtual_stages &&
               same_split(ix, tr->cfg), rc = 0;
    int64_t most = 1;
    if (ix->step != step)
        return error_set(err, path, "index.json is of step %lld, state.bin of step %lld", (long long)ix->step,
                         (long long)step);
    for (int i = 0; i < model_full_tensor_count(d); i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        const CkptTensor *t = ckpt_index_tensor(ix, name);
        if (!t)
            return error_set(err, path, "index.json has no tensor %s (the model has it)", name);
        if (t->rows != rows || t->cols != cols || t->is_vector != vec)
            return error_set(err, path, "index.json: %s is [%lld, %lld], the model's is [%lld, %lld]", name,
                             (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
        most = rows * cols > most ? rows * cols : most;
    }
    float *full = same ? NULL : malloc((size_t)most * sizeof *full);
    float *tmp = same ? NULL : malloc((size_t)most * sizeof *tmp), *block = same ? NULL : malloc((size_t)most * sizeof *tmp);
    if (!same && (!full || !tmp || !block))
        rc = error_runtime(err, "checkpoint", "out of memory");
    /* Twice: first every file this rank reads is opened and checked (its CRCs; with a bound index its
     * ident, size and CRC-32) and nothing copied, so that a swapped, stale or foreign file is refused
     * before any weight is taken; then the copies, from the files already open. */
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        ix->verify_only = pass == 0;
        rc = load_chunks(tr, ix, same, weights_only, full, tmp, block, path, err);
    }
    ix->verify_only = 0;
    free(full);
    free(tmp);
    free(block);
    /* What the resume line reports: how, and the most files a rank opened. */
    double opened = ix->files_opened;
    if (rc == 0)
        rc = comm_allreduce_max_f64(tr->comm, GROUP_WORLD, &opened, 1, err);
    if (rc == 0 && same)
        snprintf(tr->resume_how, sizeof tr->resume_how, "same layout, each rank read its own shards: at most %d "
                 "shard file%s a rank", (int)opened, opened == 1 ? "" : "s");
    /* The layers per chunk that saved it, when they were not split evenly. */
    char saved_split[160] = "";
    int chunks = ix->pp * ix->virtual_stages;
    for (int g = 0; ix->stage_layers && g < chunks; g++)
        if (ix->stage_layers[g] != tr->cfg->model.n_layers / chunks + (g < tr->cfg->model.n_layers % chunks)) {
            memcpy(saved_split, ", layers per chunk ", 20);
            config_int_list_text(ix->stage_layers, chunks, saved_split + 19, sizeof saved_split - 19);
            break;
        }
    if (rc == 0 && !same)
        snprintf(tr->resume_how, sizeof tr->resume_how, "resharded from tp %d, cp %d, pp %d, dp %d, zero %d%s: at most "
                 "%d shard file%s a rank", ix->tp, ix->cp, ix->pp, ix->dp, ix->zero, saved_split, (int)opened,
                 opened == 1 ? "" : "s");
    return rc;
}
