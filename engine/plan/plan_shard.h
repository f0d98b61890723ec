/*
 * engine/plan/plan_shard.h - the second pass: each micro-batch of a packed step split over the CP
 * ranks in the configured mode (balance.cp_sharding; plan_shard.c describes the modes), with its
 * ranks, ranges, segments and per-layer costs written into the plan.
 */
#ifndef WLB_ENGINE_PLAN_SHARD_H
#define WLB_ENGINE_PLAN_SHARD_H

#include "engine/plan/plan_groups.h"

/* The candidates of one micro-batch, kept across steps (StepPlan.shard_scratch: one per micro-batch
 * laid out at once). */
typedef struct ShardScratch {
    Shard seq, doc; /* per_seq's and per_doc's layouts */
    Hybrid hybrid;  /* hybrid's candidates and its best */
    Groups groups;  /* groups' search and its best */
} ShardScratch;

/* Shards micro-batch i of p over the CP ranks in the given mode (adaptive, hybrid and groups choose)
 * and fills its PlanRank entries and per-layer costs. */
int plan_shard(StepPlan *p, int64_t i, CpSharding mode, const CostModel *cost, int64_t rank_capacity, Error *err);
/* plan_shard of micro-batches 0 .. n_mb - 1, on up to `threads` threads: a micro-batch's layout
 * depends on its documents alone, and the layouts are copied into the plan in order, so the plan is
 * the same for any thread count. */
int plan_shard_step(StepPlan *p, int64_t n_mb, CpSharding mode, const CostModel *cost, int64_t rank_capacity,
                    int threads, Error *err);
/* Frees p's sharding scratch (plan_free does). */
void plan_shard_scratch_free(StepPlan *p);

#endif
