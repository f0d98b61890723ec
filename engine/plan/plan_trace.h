/*
 * engine/plan/plan_trace.h - the predicted timeline: a step as the pipeline simulator places it
 * (sched.h: sched_step_timeline), written as trace spans (util/trace.h) in the same dialect and with
 * the same names as a training run's measured trace, so that the two can be laid side by side and
 * compared pass by pass (docs/timelines.md).
 *
 * One rank's spans of one step, under the caller's pid:
 *
 *   host thread (tid PLAN_TRACE_TID_HOST)  "ProfilerStep#N" (user_annotation) over the step, N the
 *          step as the log numbers it; a "cudaLaunchKernel" (cuda_runtime, no duration) at the start
 *          of every device-side span, with its correlation id (>= PLAN_TRACE_CORRELATION_BASE), which
 *          HTA needs to keep the device-side spans of a trace of two or more steps.
 *   compute stream (PLAN_TRACE_STREAM_COMPUTE)  "forward" / "backward" (cat kernel): every pass of
 *          the rank's stage in its 1F1B (interleaved) order, from when the simulator starts it to when
 *          it ends; args step, microbatch (its place in the replica's pipeline, PlanMicroBatch.order:
 *          the trainer's k), chunk (the model chunk g = c * pp + stage), stage, tokens (padding left out)
 *          and documents (pieces of documents; a padding piece is none) of the micro-batch,
 *          predicted_us. Then "contention" (the computation slowed by the
 *          collectives that ran beside it, drawn after the gradients' reduction) and "optimizer".
 *          The gaps between them are the stage's bubbles and waits.
 *   tp, cp streams  "ncclKernel_Exchange tp" / "ncclKernel_Exchange cp": per pass, the TP (CP) exchanges of its
 *          layers summed (cost.h prices them layer by layer), drawn from the pass's start; args
 *          exposed_us (the part the pass waits for: inside its duration), hidden_us.
 *   pp recv stream  "ncclKernel_Recv pp": as the measured trace draws a message between stages, the
 *          time the receiving pass waited for it, just before the pass (exposed_us; hidden_us: the
 *          rest of it, which moved while the stage computed). A message that moved hidden, and a send
 *          (a send never blocks in the model), is no span: the lanes never hold two spans at once.
 *   dp_cp stream  "ncclKernel_AllReduce dp_cp" (ZeRO-1: "ncclKernel_ReduceScatter dp_cp") per gradient bucket of the
 *          stage, exposed_us: its part after the stage's last pass (the reduction's exposed time);
 *          "ncclKernel_AllGather dp_cp", ZeRO-1's parameter gather per chunk, exposed_us: what the chunk's
 *          first forward waited for it.
 *
 * The device-side spans carry args stream, correlation and device as HTA needs them; communication
 * is named as the measured trace names it, "ncclKernel_OP GROUP", since HTA (0.5, the pinned one)
 * counts a span as communication only when its name matches ^nccl.*Kernel, the rest as computation. Every TP and CP
 * rank of a stage of a replica has the same spans: the simulator times a pass by its slowest CP rank.
 * A micro-batch without a token has no pass and no message (the trainer skips it), though the
 * simulator still charges its messages' latency. Summed over a rank of the slowest replica, the
 * spans' exposed_us per group are the dry run's time breakdown of that step (sched_step_breakdown:
 * tp_exposed, cp_exposed, pp_exposed, dp_exposed), and the compute stream's gaps minus the pp and dp
 * exposed time its bubble.
 */
#ifndef WLB_ENGINE_PLAN_TRACE_H
#define WLB_ENGINE_PLAN_TRACE_H

#include <stdint.h>

#include "config/config.h"
#include "engine/plan/cost.h"
#include "engine/plan/plan_types.h"
#include "engine/plan/sched.h"
#include "util/error.h"
#include "util/trace.h"

/* The lanes are the measured trace's (engine/comm/comm_trace.h): the compute stream 7, a stream per
 * group at 20 + its LayoutGroup (tp 20, cp 21, the DP x CP reduction 24), the pipeline's receives 61. */
enum {
    PLAN_TRACE_TID_HOST = 1,
    PLAN_TRACE_STREAM_COMPUTE = 7,
    PLAN_TRACE_STREAM_TP = 20,
    PLAN_TRACE_STREAM_CP = 21,
    PLAN_TRACE_STREAM_DP = 24,
    PLAN_TRACE_STREAM_PP_RECV = 61,
    /* The dry run writes at most this many files (one per rank): beyond it, TP rank 0 of every CP
     * rank, stage and replica, or if those are still too many TP and CP rank 0 of every stage of the
     * first replicas (plan_trace_open). */
    PLAN_TRACE_MAX_FILES = 256,
};
/* Correlation ids of the predicted spans start here (a measured trace's start at 1e6: the two
 * tracks of one file never share one). */
#define PLAN_TRACE_CORRELATION_BASE INT64_C(2000000000)

/* Names the process pid and its lanes (metadata events; process_name `name`). */
void plan_trace_lanes(Trace *t, int pid, const char *name, int sort_index);

/* flags: PLAN_TRACE_BESIDE - the track lies beside a measured one in the same file (a training
 * run's): its spans carry no stream, correlation or launch and its step is "predicted step N", all
 * in category "predicted", since HTA would take them for the rank's device and steps (it does not
 * look at process ids); Perfetto draws them as a process of their own. */
enum { PLAN_TRACE_BESIDE = 1 };

/* Records world_rank's spans of the step tl simulates (of plan p, priced by cost: the dry run's or
 * the trainer's model) into t, the step starting at t0_us, under pid. world_rank numbers the ranks
 * as the launch does (engine/comm/layout.h: tp fastest, then cp, pp, dp); it must be below
 * tp x cp x pp x dp. */
void plan_trace_rank(Trace *t, const StepPlan *p, const CostModel *cost, const SchedTimeline *tl, int world_rank,
                     double t0_us, int pid, unsigned flags);
/* The same, simulating the step first: for a training run's predicted track beside its measured
 * one (flags PLAN_TRACE_BESIDE). *step_us (NULL: not wanted) gets the step's predicted
 * microseconds. */
int plan_trace_step(Trace *t, const StepPlan *p, const CostModel *cost, int world_rank, double t0_us, int pid,
                    unsigned flags, double *step_us, Error *err);

/* The dry run's predicted traces: one Trace per rank written (at most PLAN_TRACE_MAX_FILES), the
 * steps laid one after another from time 0 (each at the sum of the predicted times before it). */
typedef struct PlanTraceOut {
    TraceSteps steps;  /* trace.steps (util/trace.h) */
    char *dir;         /* TRACE_DIR/predicted (or another sub-folder) */
    int n;             /* ranks written */
    int *ranks;
    Trace **traces;
    int world;
    double t_us;       /* where the next step starts */
    int64_t traced, planned; /* steps recorded, and seen */
    const char *text;  /* trace.steps as written */
} PlanTraceOut;
/* From a resolved config with trace.steps set (NULL trace.steps: o->n = 0, nothing is written); the
 * files go to TRACE_DIR/sub: "predicted" for the configured packer's plans, "predicted-plain4d" for
 * the dry run's baseline (Plain-4D's plan of the same documents). */
int plan_trace_open(PlanTraceOut *o, const Config *cfg, const char *sub, Error *err);
/* Step p (predicted step_s seconds): recorded when trace.steps has it; the clock moves on either way. */
int plan_trace_add_step(PlanTraceOut *o, const StepPlan *p, const CostModel *cost, double step_s, Error *err);
/* Writes the files (TRACE_DIR/sub/rank<R>.pt.trace.json); prints where on stdout. */
int plan_trace_close(PlanTraceOut *o, Error *err);
void plan_trace_free(PlanTraceOut *o);

#endif
