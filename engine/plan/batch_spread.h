/*
 * engine/plan/batch_spread.h - the tokens of a run's steps against the configured global batch
 * (data.global_batch_tokens): their spread, and the floor under which a step is worth a warning.
 *
 * The global batch is the optimizer's: the learning rate and the schedule are tuned for it, so every
 * step should train about that many tokens. The dry run's summary, --compare, --stats-out and the
 * training metrics report this spread; a step under BATCH_FLOOR_PERCENT of the batch is warned of.
 */
#ifndef WLB_ENGINE_PLAN_BATCH_SPREAD_H
#define WLB_ENGINE_PLAN_BATCH_SPREAD_H

#include <stdint.h>

enum {
    BATCH_FLOOR_PERCENT = 75, /* a step under this share of the batch is warned of */
    BATCH_NEAR_PERCENT = 10,  /* a step within this of the batch is "about the batch" */
};

typedef struct BatchSpread {
    int64_t batch;              /* data.global_batch_tokens */
    int64_t steps;
    double mean;
    int64_t p5, p50, p95, min, max; /* tokens of a step: nearest-rank percentiles */
    int64_t off_near;           /* steps more than BATCH_NEAR_PERCENT off the batch */
    int64_t under_floor;        /* steps under BATCH_FLOOR_PERCENT of the batch */
} BatchSpread;

/* 1 when a step of `tokens` is under BATCH_FLOOR_PERCENT of the batch. */
int batch_under_floor(int64_t tokens, int64_t batch);

/* The spread of tokens[0..n) against batch; tokens is sorted in place. n = 0 gives zeros. */
BatchSpread batch_spread_of(int64_t *tokens, int64_t n, int64_t batch);

#endif
