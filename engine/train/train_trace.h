/*
 * engine/train/train_trace.h - measured timelines of chosen training steps (trace.steps, --trace;
 * docs/timelines.md).
 *
 * Every rank records its traced steps into a Trace (util/trace.h) and writes it, once the last
 * traced step is over (or at the end of the run), as TRACE_DIR/measured/rank<R>.pt.trace.json in
 * the JSON dialect of PyTorch's profiler, which Perfetto draws and Holistic Trace Analysis reads:
 *
 *   host (pid: the process id; the rank's thread): ProfilerStep#N per step, and the host's work
 *     as user_annotation spans - plan, data (a micro-batch's inputs), grad_reduce, checkpoint,
 *     evaluation, comm_wait - with a cudaLaunchKernel event (cat cuda_runtime) at the issue of every
 *     device-side span, as a PyTorch trace has;
 *   device (pid: the world rank, "rank R device"): the compute stream (7) with every forward and
 *     backward pass (args step, microbatch, chunk, stage, tokens, documents, predicted_us) and the
 *     optimizer; one stream per group for its collectives and two for the pipeline's messages
 *     (engine/comm/comm_trace.h). The evaluation and the checkpoint after a traced step are host
 *     spans only (recording ends with the step's vote).
 *
 * The clock: CLOCK_MONOTONIC as the rank reads it, mapped to CLOCK_REALTIME, corrected by the
 * rank's offset from rank 0 (pings at the start: comm_clock_offset), relative to a base time that
 * rank 0 chooses for all (baseTimeNanoseconds). On one machine the offsets are the pings' noise; on
 * a cluster they are the nodes' clock differences.
 *
 * On a backend with a device timer (CUDA: Ops.timer_mark) the passes' spans come from the device:
 * the events that time each pass, placed on the host clock by a reference mark at the step's
 * start (train_trace_timer_spans).
 *
 * The predicted track: the same step as the planner's pipeline simulator places it
 * (engine/plan/plan_trace.h: plan_trace_step on the step's own plan), from the measured step's
 * start, as a process of its own (pid TRAIN_TRACE_PID_PREDICTED, "predicted"), in a second file per
 * rank, TRACE_DIR/measured-predicted/rank<R>.pt.trace.json, the measured events and the predicted
 * track together, for Perfetto; TRACE_DIR/measured/ stays the measured alone. The track is written
 * with PLAN_TRACE_BESIDE (no stream, correlation or launch; "predicted step N"), so that HTA, which
 * takes every such span of a file for the rank's device, reads either folder alike.
 *
 * With trace.steps unset nothing is set up and every hook is one branch on a NULL pointer.
 */
#ifndef WLB_ENGINE_TRAIN_TRACE_H
#define WLB_ENGINE_TRAIN_TRACE_H

#include <stdio.h>

#include "engine/comm/comm_trace.h"
#include "engine/ops.h"
#include "engine/plan/sched.h"
#include "engine/train/train.h"

/* The process ids of the file: the device lanes' is the world rank; the predicted track's (the
 * planner's picture of the same step, added by the predicted-timelines code) one of its own. */
enum { TRAIN_TRACE_PID_PREDICTED = 1 << 24 };

/* What a traced step's metrics line gets (rank 0; every rank's figures gathered). */
typedef struct TrainTraceFigures {
    int traced;
    int world;
    double *compute_s, *comm_s, *idle_s; /* world each: this step's seconds by the rank's own accounting */
} TrainTraceFigures;

typedef struct TrainTrace {
    TraceSteps steps;
    char dir[4096];             /* TRACE_DIR/measured */
    char both_dir[4096];        /* TRACE_DIR/measured-predicted: the same with the predicted track */
    Trace *trace;
    Trace *predicted;           /* the predicted track (engine/plan/plan_trace.h), pid TRAIN_TRACE_PID_PREDICTED */
    CommTracer tracer;
    int64_t last_step;          /* the last traced step: the file is written after the step after it */
    int written;
    double step_t0;
    double sums[3];             /* the accounting's sums at the end of the last traced step */
    double *votes;              /* 3 + world x 3: the end of step vote with every rank's figures */
    TrainTraceFigures fig;
    int timer_ref;              /* the device timer's reference mark (2 n_sched), or -1 */
    double timer_ref_s;         /* clock_seconds() when it was recorded */
} TrainTrace;

/* trace.steps set: parses it, makes TRACE_DIR/measured, measures the clock offsets, sets up the
 * recording on tr->comm. Collective over the world. Nothing without trace.steps. */
int train_trace_open(Trainer *tr, Error *err);
/* Writes the file if it was not yet (an Error names it) and frees everything. */
int train_trace_close(Trainer *tr, Error *err);
/* Around each step of the loop: step_begin turns recording on for a traced step. At its end the
 * figures of every rank travel with the step's vote (train.c: one all-reduce, MAX, over the world):
 * train_trace_votes gives the vote's array (votes itself, 3 doubles, for a step not traced; else
 * one with room for 3 more per rank) and *n its length; step_stop ends the step's recording (its
 * ProfilerStep span) and puts this rank's figures in its slots (votes + 3), the others' 0; step_end,
 * after the vote, takes everyone's into tr->trace->fig and writes the file after the step after the
 * last traced one. */
double *train_trace_votes(Trainer *tr, int64_t step, double *votes, int *n);
void train_trace_step_begin(Trainer *tr, int64_t step);
void train_trace_step_stop(Trainer *tr, int64_t step, double *slots);
int train_trace_step_end(Trainer *tr, int64_t step, const double *slots, Error *err);
/* After the step's metrics line (outside its time): the planner's prediction of the traced step's
 * plan, this rank's spans from the step's measured start, onto the predicted track. */
int train_trace_step_predicted(Trainer *tr, int64_t step, Error *err);
/* A traced step's figures on its metrics line: ,"trace_compute_s":[...],"trace_comm_s":[...],
 * "trace_idle_s":[...] (nothing for a step not traced). */
void train_trace_write_metrics(FILE *f, const Trainer *tr);

/* 1 while a step is being traced (the hooks below do nothing otherwise). */
static inline int train_trace_on(const Trainer *tr) { return tr->trace && tr->trace->tracer.on; }

/* Host-side spans: begin returns the start (0 when not tracing), end records [t0, now] as name. */
double train_trace_host_begin(const Trainer *tr);
void train_trace_host_end(Trainer *tr, const char *name, double t0);
/* The same for a host span after a traced step's figures (the checkpoint): begins when step is traced. */
double train_trace_step_host_begin(const Trainer *tr, int64_t step);
/* Device-side compute spans: begin accounts the compute from now on and returns the start (0 when
 * not tracing); the pass's end records it (name forward or backward; i the schedule's
 * index, k the replica's micro-batch, c the local chunk), the optimizer's likewise. */
double train_trace_compute_begin(Trainer *tr);
void train_trace_pass_end(Trainer *tr, const char *name, const StepPlan *plan, int i, int k, int c, double t0);
void train_trace_compute_end(Trainer *tr, const char *name, double t0);
/* The device timer's reference mark at a traced step's start (a backend with timer_mark). */
void train_trace_timer_start(Trainer *tr);
/* The device spans of the passes timed by a device timer: pass i of sched (timed[i]) from mark 2 i
 * to 2 i + 1, placed at ref_s (clock_seconds()) + the time from mark ref to mark 2 i. One span per
 * timed pass, on t's compute stream, named as the pass (its args: microbatch, chunk, stage). */
void train_trace_timer_spans(CommTracer *t, const Ops *ops, int ref, double ref_s, const SchedOp *sched, int n,
                             const int *timed, int stage, int pp, int64_t step);

#endif
