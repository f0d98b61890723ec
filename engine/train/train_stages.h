/*
 * engine/train/train_stages.h - the split of the layers over the pipeline's model chunks, as the
 * trainer, the memory model and the checkpoints see it (parallel.stage_layers; the resolved split
 * is parallel.chunk_layers, config.h).
 *
 * even and a list of counts are resolved by config_resolve. auto needs the cost model, the data
 * (the attention work of a typical micro-batch) and the memory model, so the engine places it:
 * trainer_stage_layers, before a dry run or training uses the config (main.c). The search is
 * engine/plan/stages.h's; here each candidate stage is weighed by the memory model
 * (trainer_stage_memory) against the budget of every rank (trainer_memory_budget), the same on
 * every rank and in the dry run, so that all of them place the layers alike.
 */
#ifndef WLB_ENGINE_TRAIN_STAGES_H
#define WLB_ENGINE_TRAIN_STAGES_H

#include "config/config.h"
#include "data/data_sources.h"
#include "engine/comm/comm.h"
#include "engine/model/model.h"
#include "engine/plan/stages.h"
#include "util/error.h"

/* What the model of chunk g on TP rank tp_rank is, under cfg's resolved split. */
ModelParallel trainer_chunk_parallel(const Config *cfg, int tp_rank, int g, Comm *comm);

/* parallel.stage_layers: auto placed into cfg->parallel.chunk_layers (nothing to do for even and a
 * list). Needs parallel.dp a number (trainer_micro_batches). costs (NULL: not wanted) gets the typical micro-batch it placed
 * for; *fits (NULL: not wanted) whether every stage fits its memory. */
int trainer_stage_layers(Config *cfg, StageCosts *costs, int *fits, Error *err);
/* The same on data already open (cfg's data.path or data.lengths_file): what the layout search
 * (train_search.h) places each candidate with, the data read once. */
int trainer_stage_layers_on(Config *cfg, const DataSources *data, StageCosts *costs, int *fits, Error *err);

#endif
