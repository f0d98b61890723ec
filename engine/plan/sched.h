/*
 * engine/plan/sched.h - the pipeline schedule: simulating 1F1B (and interleaved 1F1B) over
 * variable-length micro-batches, to predict a step's time and to order micro-batches.
 *
 * Stage s of a replica runs its forward (F) and backward (B) passes in Megatron's 1F1B order:
 * min(pp - s - 1, M) forwards to fill the pipeline, then one forward and one backward alternately,
 * then the remaining backwards. With v virtual stages (interleaved), rank s holds model chunks
 * s, s + pp, ..., micro-batches go through the chunks in groups of pp, and the warm-up is
 * 2 (pp - s - 1) + (v - 1) pp forwards (Megatron's schedule table; M must be a multiple of pp).
 * F of micro-batch m on chunk g starts when F(m, g - 1) has ended and its activations have arrived;
 * B(m, g) when B(m, g + 1) has ended and its gradients have arrived. The makespan of a replica is
 * when its last pass ends; a step ends when its slowest replica does (the gradient reduction
 * waits for all).
 */
#ifndef WLB_ENGINE_SCHED_H
#define WLB_ENGINE_SCHED_H

#include "engine/plan/cost.h"
#include "engine/plan/plan_types.h"

/* Times of one replica's micro-batches in pipeline order: fwd[m * chunks + g] and bwd[...] for model
 * chunk g = c * pp + s (chunks = pp * v), p2p[m] per hop. */
typedef struct SchedReplica {
    int pp, v, n_mb;
    const double *fwd, *bwd, *p2p;
} SchedReplica;

/* One pass of a stage: the forward or backward of micro-batch mb (its place in the replica's
 * pipeline order) on the stage's model chunk `chunk` (0 .. v - 1; global chunk chunk * pp + s). */
typedef struct SchedOp {
    int backward, mb, chunk;
} SchedOp;

/* The 2 n_mb v passes of stage s in the order it runs them (the trainer executes exactly this
 * order; the simulator times it). Returns the count. */
int sched_stage_ops(int s, int pp, int v, int n_mb, SchedOp *ops);

/* *makespan: seconds until the replica's last pass ends. An Error when the schedule cannot run
 * (status 2: with v > 1, n_mb must be a multiple of pp) or memory runs out (status 1). */
int sched_makespan(const SchedReplica *r, double *makespan, Error *err);

/* Per-chunk times of micro-batch mb of a plan, written to fwd[g], bwd[g] (g < pp * v), and its p2p:
 * the chunk's layers (the config's split, cost_chunk_layers) times the per-layer forward and backward
 * of the slowest CP rank (the backward with what train.recompute reruns), plus the embedding on
 * chunk 0 and the output layer and loss on the last chunk, for the most tokens a CP rank holds. */
void sched_micro_batch_times(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, double *fwd,
                             double *bwd, double *p2p);

/* Predicted step time: the slowest replica's makespan, in seconds. */
int sched_step_time(const StepPlan *p, const CostModel *cost, double *seconds, Error *err);

/* Adds to busy[s] (s < pp) the seconds pipeline stage s computes in step p: the forward and backward
 * of its chunks over every micro-batch of every replica (summed over the replicas). Returns -1 out
 * of memory. */
int sched_stage_busy(const StepPlan *p, const CostModel *cost, double *busy, Error *err);

/* Chooses the order of each replica's micro-batches (descending, ascending or largest in the
 * middle) with the shortest simulated makespan, and sets mb->order accordingly. */
int sched_order_replicas(StepPlan *p, const CostModel *cost, Error *err);

#endif
