/*
 * engine/plan/stages.h - the split of the layers over the pipeline's model chunks when
 * parallel.stage_layers is auto: what a typical micro-batch costs each chunk, and the split whose
 * slowest stage is fastest.
 *
 * Model chunk g (0 .. pp v - 1) runs on pipeline stage g % pp. Every layer sees the same
 * micro-batch, so every layer costs the same; the first chunk also embeds and the last also runs
 * the final norm, the output projection and the loss. For one micro-batch, stage s takes
 *     T_s = n_s layer_s + [s = 0] embed_s + [s = pp - 1] head_s,     n_s = the layers of its chunks
 * (forward + backward, recomputation included). In the steady state of 1F1B the pipeline runs at
 * the pace of its slowest stage, so auto first minimizes max_s T_s over the splits with at least
 * one layer per chunk whose every stage fits its memory (the memory model, through a callback: the
 * planner cannot see the model's tensors). Since T_s depends on n_s alone and grows with it, adding
 * layers one at a time to the stage whose time after the addition is least (among those that still
 * fit) is exact: the largest time it reaches is the (L - pp v)-th smallest of all the stages' next
 * times, which no split can beat (stages_least_slowest). Ties go to the later stage (it holds fewer
 * micro-batches in flight under 1F1B). Inside a stage the layers go the same way over its v chunks,
 * to the chunk whose time is least (ties to the first), so the chunk with the output layer gets
 * fewer.
 * The slowest stage is not the whole step: the pipeline fills and drains through every stage, and
 * with few micro-batches per stage that bubble can cost a split more than its slowest stage gains
 * (Llama 3 405B at 8K windows on 16 stages: one layer off the first and last stage gains 1% on the
 * slowest stage and loses 0.1% over a step of 32 micro-batches). So auto then simulates a step of
 * the configured micro-batches per replica, all typical, through the pipeline schedule
 * (sched_makespan, interleaved or not, the sends between stages included) under that split and
 * under the even one, and keeps the even split when it is as fast and fits: auto never predicts
 * a typical step slower than even.
 *
 * The typical micro-batch: one window of tokens (data.context_window, the mean micro-batch of
 * every packer: global_batch_tokens / (dp M)), each CP rank holding 1 / cp of it, with the
 * attention work per token of the run's own data - the pieces of the first STAGES_SAMPLE_WINDOWS
 * windows of the stream, cut as the planner cuts them - and on the slowest CP rank 1 / cp of it.
 * Only the ratio of the output layer's time to a layer's decides the split, and the split moves
 * only when that ratio crosses a whole layer; the planner then makes every micro-batch's work
 * close to this mean. docs/stage-balance.md has the figures.
 */
#ifndef WLB_ENGINE_STAGES_H
#define WLB_ENGINE_STAGES_H

#include <stdint.h>

#include "config/config.h"
#include "data/data_stream.h"
#include "engine/plan/cost.h"
#include "util/error.h"

enum { STAGES_SAMPLE_WINDOWS = 256, STAGES_MAX = 1024 /* the most stages and model chunks (model.n_layers) */ };

/* Seconds of one typical micro-batch on one rank, forward and backward. */
typedef struct StageCosts {
    double layer_fwd_s, layer_bwd_s; /* one layer (the backward with what train.recompute reruns) */
    double embed_fwd_s, embed_bwd_s; /* the embedding (chunk 0) */
    double head_fwd_s, head_bwd_s;   /* final norm, output projection and loss (the last chunk) */
    double p2p_s;                    /* a send of its activations to the next stage */
    double pairs_per_token;          /* the attention work of the sample (document-causal pairs per token) */
} StageCosts;

/* The pipeline the layers are split over: n_layers over pp stages of v chunks each, m micro-batches
 * per replica in a step. */
typedef struct StageLayout {
    int n_layers, pp, v, m;
} StageLayout;

/* The typical micro-batch of cfg under cost, its attention from the stream of the n sources src
 * (weights: NULL or one each) with cfg's seed, window and cutting rule. */
int stages_typical_costs(const Config *cfg, const CostModel *cost, const DataSource *src, const double *weights,
                         int n, StageCosts *out, Error *err);

/* T_s (forward + backward) of stage s under the split chunk_layers (pp v counts). */
double stages_stage_s(const StageCosts *c, int pp, int v, const int64_t *chunk_layers, int s);

/* Whether stage s fits its memory with the layer counts of its chunks in chunk_layers (the other
 * chunks hold at least one layer each, all of them at most the model's). */
typedef int (*StageFits)(void *ctx, int s, const int64_t *chunk_layers);

/* The split whose largest T_s is least, into chunk_layers[0 .. pp v) (see the top). fits NULL: no
 * memory limit. Returns 1 when every stage fits, 0 when no split does (the split is then the fastest
 * one, memory aside). */
int stages_least_slowest(const StageCosts *c, const StageLayout *l, StageFits fits, void *ctx, int64_t *chunk_layers);

/* Seconds of a step of l->m typical micro-batches through the pipeline under the split. */
int stages_step_s(const StageCosts *c, const StageLayout *l, const int64_t *chunk_layers, double *seconds, Error *err);

/* auto: stages_least_slowest, or the even split where it fits and a typical step is as fast with it.
 * *all_fit: whether every stage of the split fits (0: none could; the memory check refuses it as it
 * would any). */
int stages_auto(const StageCosts *c, const StageLayout *l, StageFits fits, void *ctx, int64_t *chunk_layers,
                int *all_fit, Error *err);

#endif
