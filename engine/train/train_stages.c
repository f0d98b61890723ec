/* engine/train/train_stages.c - the split of the layers over the model chunks (see train_stages.h). */
#include "engine/train/train_stages.h"

#include <stdlib.h>

#include "data/data_sources.h"
#include "engine/plan/dryrun.h"
#include "engine/train/train_memory.h"

ModelParallel trainer_chunk_parallel(const Config *cfg, int tp_rank, int g, Comm *comm)
{
    const ConfigParallel *p = &cfg->parallel;
    int begin, end;
    config_chunk_layers(cfg, g, &begin, &end);
    return (ModelParallel){(int)p->tp, tp_rank, (int)p->cp, g, (int)(p->pp * p->virtual_stages), begin, end, comm,
                           p->sequence_parallel};
}

/* The memory model's verdict on one candidate stage. */
typedef struct FitsCtx {
    const Config *cfg;
    double budget;
    int failed; /* the memory model itself failed (out of memory): err holds why */
    Error err;
} FitsCtx;

static int stage_fits(void *ctx_, int s, const int64_t *chunk_layers)
{
    FitsCtx *ctx = ctx_;
    DryRunMemory m;
    if (ctx->failed || trainer_stage_memory(ctx->cfg, chunk_layers, s, &m, &ctx->err) != 0) {
        ctx->failed = 1;
        return 0;
    }
    return m.peak <= ctx->budget;
}

int trainer_stage_layers(Config *cfg, StageCosts *costs, int *fits, Error *err)
{
    if (cfg->parallel.stage_layers.choice != STAGE_LAYERS_AUTO)
        return 0;
    DataSources data;
    const ConfigData *d = &cfg->data;
    if (data_sources_open(&data, d->path.v, d->weights.n ? d->weights.v : NULL, d->path.n, d->lengths_file,
                          d->lengths_column, err) != 0) {
        dryrun_data_hint(cfg, err);
        return -1;
    }
    int rc = trainer_stage_layers_on(cfg, &data, costs, fits, err);
    data_sources_close(&data);
    return rc;
}

int trainer_stage_layers_on(Config *cfg, const DataSources *data, StageCosts *costs, int *fits, Error *err)
{
    ConfigParallel *p = &cfg->parallel;
    if (p->stage_layers.choice != STAGE_LAYERS_AUTO)
        return 0;
    int64_t m;
    if (trainer_micro_batches(cfg, &m, err) != 0)
        return -1;
    CostModel cost;
    StageCosts c;
    if (cost_model_init(&cost, cfg, err) != 0)
        return -1;
    int rc = stages_typical_costs(cfg, &cost, data->src, data->weights, data->n, &c, err);
    if (rc != 0)
        return -1;
    int chunks = (int)(p->pp * p->virtual_stages);
    int64_t *split = malloc((size_t)chunks * sizeof *split);
    if (!split)
        return error_runtime(err, "parallel.stage_layers", "out of memory");
    /* The same budget in training and in the dry run (whether or not it is checked there), so that
     * both place the layers alike. */
    FitsCtx ctx = {cfg, trainer_memory_budget(cfg), 0, {0}};
    StageLayout l = {(int)cfg->model.n_layers, (int)p->pp, (int)p->virtual_stages, (int)m};
    int all_fit;
    rc = stages_auto(&c, &l, ctx.budget > 0 ? stage_fits : NULL, &ctx, split, &all_fit, err);
    if (rc == 0 && ctx.failed) {
        *err = ctx.err;
        rc = -1;
    }
    if (rc != 0) {
        free(split);
        return -1;
    }
    free(p->chunk_layers.v);
    p->chunk_layers = (ConfigIntList){chunks, split};
    if (costs)
        *costs = c;
    if (fits)
        *fits = all_fit;
    return 0;
}
