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
 * when its last pass ends; a step ends when its slowest replica does and the gradients are reduced.
 *
 * Communication between passes (parallel.overlap, cost.h): a message between stages moves as soon as
 * its sender is done when the receive was posted ahead (overlap), or only once the receiver asks for
 * it (recv_on_demand: without overlap). The gradients' reduction over DP x CP runs a layer a bucket
 * after the pipeline (without overlap), or from the moment the last micro-batch's backward produced
 * each bucket; ZeRO-1's parameter all-gather runs before the step's first forward (without overlap)
 * or a bucket ahead of the layers that need it.
 */
#ifndef WLB_ENGINE_SCHED_H
#define WLB_ENGINE_SCHED_H

#include "engine/plan/cost.h"
#include "engine/plan/plan_types.h"

/* Times of one replica's micro-batches in pipeline order: fwd[m * chunks + g] and bwd[...] for model
 * chunk g = c * pp + s (chunks = pp * v), p2p[m] per hop. */
/* ZeRO-1's parameter all-gather of model chunk g, seconds from the start of the step: when its first
 * bucket and its last bucket are there, and the share of the chunk's forward that runs after the last
 * bucket arrives (its last layer). */
typedef struct SchedGather {
    double first, last, last_share;
} SchedGather;

typedef struct SchedReplica {
    int pp, v, n_mb;
    const double *fwd, *bwd, *p2p;
    int recv_on_demand;        /* 1: a message moves when the receiver asks (no receive posted ahead) */
    const SchedGather *gather; /* per model chunk, NULL: no parameter gather */
} SchedReplica;

/* What a simulated replica's stages waited for, and when each chunk's last backward ran (arrays
 * the caller sizes: pp entries, and pp * v for the chunks; any may be NULL). */
typedef struct SchedTrace {
    double *stage_end;          /* when the stage's last pass ends */
    double *pp_exposed, *pp_hidden; /* seconds of its incoming messages it waited for / that moved
                                     * while it computed */
    double *gather_wait;        /* seconds it waited for ZeRO-1's all-gather */
    double *gather_beside;      /* seconds the all-gather ran beside its passes (the rest: while it
                                 * waited, for the gather or for its first input) */
    double *last_bwd_start, *last_bwd_end; /* per chunk: its last backward pass */
    /* Per pass, at [s * 2 n_mb v + i] for stage s's i-th pass in sched_stage_ops order (the
     * predicted timeline, plan_trace.h): when it starts and ends; when its incoming message began to
     * move (-1: it has none) and the seconds of it the stage waited for; the seconds it waited for
     * ZeRO-1's all-gather. */
    double *pass_start, *pass_end, *msg_from, *msg_shown, *gather_shown;
} SchedTrace;

/* Where a pipeline stage's time goes in a step, in seconds: what it computes (products, attention,
 * element-wise work), the communication that shows (_exposed: the stage waits for it) and what runs
 * hidden (_hidden: beside its computation, or for ZeRO-1's all-gather also while the stage waits for
 * its first input), the computation slowed by the collectives beside it (contention, comm_sm_share),
 * and the rest of the step, idle (bubble). dp is the gradients' reduction over DP x CP and ZeRO-1's
 * all-gather; optimizer the step's gradient norm and AdamW update (cost_optimizer_s). products +
 * attention + elementwise + the _exposed parts + contention + optimizer + bubble = the step time. */
typedef struct SchedBreakdown {
    double products, attention, elementwise;
    double tp_exposed, tp_hidden, cp_exposed, cp_hidden, pp_exposed, pp_hidden, dp_exposed, dp_hidden;
    double contention, optimizer, bubble; /* optimizer: the gradient norm and AdamW after the reduction */
} SchedBreakdown;

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
/* The same, and what the stages waited for (trace: NULL or arrays as SchedTrace says). */
int sched_simulate(const SchedReplica *r, double *makespan, const SchedTrace *trace, Error *err);

/* Per-chunk times of micro-batch mb of a plan, written to fwd[g], bwd[g] (g < pp * v), and its p2p:
 * the chunk's layers (the config's split, cost_chunk_layers) times the per-layer forward and backward
 * of the slowest CP rank (the backward with what train.recompute reruns), plus the embedding on
 * chunk 0 and the output layer and loss on the last chunk, for the most tokens a CP rank holds. */
void sched_micro_batch_times(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, double *fwd,
                             double *bwd, double *p2p);

/* One simulated step laid out in time, every rank's view of it, in seconds from the step's start:
 * what sched_step_breakdown prices, pass by pass and collective by collective (the predicted
 * timeline, plan_trace.h, draws it). Arrays by replica r < dp, stage s < pp, pass i < per_stage. */
typedef struct SchedTimeline {
    int dp, pp, v, m, per_stage;  /* per_stage: 2 m v passes */
    double step_s;                /* the step's predicted time (sched_step_time) */
    int slowest;                  /* the replica whose stages `breakdown` describes */
    SchedBreakdown *breakdown;    /* [s]: sched_step_breakdown's figures for the step */
    int64_t *mb_index;            /* [r * m + k]: the plan's index of replica r's k-th micro-batch */
    double *p2p;                  /* [r * m + k]: seconds of its message between two stages */
    SchedOp *ops;                 /* [s * per_stage + i]: stage s's passes in order */
    /* [(r * pp + s) * per_stage + i], as SchedTrace's fields of the same names */
    double *pass_start, *pass_end, *msg_from, *msg_shown, *gather_shown;
    /* ZeRO-1's parameter all-gather of stage s's chunk c, [s * v + c] (0, 0 without ZeRO-1) */
    double *gather_from, *gather_to;
    /* The gradients' reduction over DP x CP of stage s: its buckets in the order they run,
     * [s * max_buckets + j], j < n_buckets[s], each with its parameters */
    int max_buckets;
    int *n_buckets;
    double *bucket_from, *bucket_to, *bucket_params;
    /* [s]: when the stage's last pass ends (the latest over the replicas); the reduction's seconds
     * past it (exposed); the computation slowed by the collectives beside it (contention, drawn
     * after the reduction); the optimizer step */
    double *passes_end, *dp_exposed, *contention, *optimizer_from, *optimizer_to;
} SchedTimeline;

/* Simulates step p and lays it out in *tl (sched_timeline_free frees it, also after an error). */
int sched_step_timeline(const StepPlan *p, const CostModel *cost, SchedTimeline *tl, Error *err);
void sched_timeline_free(SchedTimeline *tl);

/* Predicted step time, in seconds: the slowest replica's makespan, ZeRO-1's all-gather and the
 * gradients' reduction over DP x CP included. */
int sched_step_time(const StepPlan *p, const CostModel *cost, double *seconds, Error *err);
/* to += scale x from, part by part. */
void sched_breakdown_add(SchedBreakdown *to, const SchedBreakdown *from, double scale);
/* The same, and where each stage's time goes in the slowest replica (stages: pp entries, added to). */
int sched_step_breakdown(const StepPlan *p, const CostModel *cost, double *seconds, SchedBreakdown *stages,
                         Error *err);
/* Adds the parts of pass `backward` of micro-batch mb on model chunk g (products, attention,
 * element-wise work, TP and CP exposed and hidden, contention) to b: they add up to the pass's
 * seconds (sched_micro_batch_times). */
void sched_pass_parts(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, int g, int backward,
                      SchedBreakdown *b);

/* Adds to busy[s] (s < pp) the seconds pipeline stage s computes in step p: the forward and backward
 * of its chunks over every micro-batch of every replica (summed over the replicas). Returns -1 out
 * of memory. */
int sched_stage_busy(const StepPlan *p, const CostModel *cost, double *busy, Error *err);

/* Chooses the order of each replica's micro-batches (descending, ascending or largest in the
 * middle) with the shortest simulated makespan, and sets mb->order accordingly. */
int sched_order_replicas(StepPlan *p, const CostModel *cost, Error *err);

#endif
