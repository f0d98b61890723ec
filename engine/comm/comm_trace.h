/*
 * engine/comm/comm_trace.h - a rank's collectives and messages on its timeline (trace.steps,
 * docs/timelines.md), and the rank's own accounting of the traced time: computing, communicating,
 * idle.
 *
 * A CommTracer belongs to one rank (engine/train/train_trace.c makes it and hangs it on the Comm);
 * while `on` (a traced step), every collective and message this rank takes part in becomes a span
 * on a device-side lane of the rank's Trace (util/trace.h), named as HTA classifies NCCL kernels
 * (^nccl.*Kernel: "ncclKernel_AllReduce tp", "ncclKernel_Send pp", ...; args group, bytes, peer, and the times it was
 * started, waited for and finished, in trace microseconds), with a host-side launch event
 * ("cudaLaunchKernel", cat cuda_runtime) of the same correlation id on the issuing thread, as a
 * PyTorch trace has. A collective started in the background is a span where its communication
 * thread ran it; the issuing thread's wait for it, when it waited, is a host-side span
 * ("comm_wait"). With the tracer off (or absent) each hook is one branch.
 *
 * The accounting. HTA reads a rank's device-side lanes and reports, over the time from their first
 * span's start to their last span's end, the idle time (no span on any lane) and the communication
 * time (a communication span, no computation span). The tracer keeps the same two figures by
 * itself, as the rank runs: a state (computing: a compute span open; else communicating: a
 * communication in flight on any thread; else idle) whose time since the last change is added to
 * its sum at every change, idle only between two busy times. A traced window ends with
 * comm_tracer_set_on(t, 0): a collective that began inside it and runs on past it (ZeRO-1's
 * parameter gathers after the update) is accounted, and drawn, up to that moment only. It never
 * reads the Trace: the test
 * (test/test_timelines.py) compares HTA's figures from the files with these sums, which
 * engine/train/train_trace.c writes into log.metrics.
 */
#ifndef WLB_ENGINE_COMM_TRACE_H
#define WLB_ENGINE_COMM_TRACE_H

#include <pthread.h>
#include <stdint.h>

#include "engine/comm/comm_types.h"
#include "util/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The lanes. Device side (pid CommTracer.device_pid): the compute stream and one stream per group for
 * its collectives (20 + group), the pipeline's sends and receives on streams of their own. Host side
 * (pid CommTracer.host_pid): the rank's thread. */
enum {
    COMM_TRACE_STREAM_COMPUTE = 7,
    COMM_TRACE_STREAM_GROUP = 20,             /* + LayoutGroup */
    COMM_TRACE_STREAM_SEND = 60,
    COMM_TRACE_STREAM_RECV = 61,
    COMM_TRACE_HOST_TID = 1,
    COMM_TRACE_CORRELATION0 = 1000000000      /* HTA: correlation ids >= 1e6 (small ones break on pandas 3) */
};

/* What a span of communication was. */
typedef enum CommTraceOp {
    COMM_TRACE_ALLREDUCE,
    COMM_TRACE_ALLGATHER,
    COMM_TRACE_REDUCE_SCATTER,
    COMM_TRACE_BROADCAST,
    COMM_TRACE_SEND,
    COMM_TRACE_RECV,
    COMM_TRACE_EXCHANGE,
    COMM_TRACE_OPS
} CommTraceOp;

typedef struct CommTracer {
    Trace *trace;
    int on;                   /* recording (read with __atomic: communication threads look too) */
    int device_pid, host_pid;
    double shift_s;           /* trace microseconds = (clock_seconds() + shift_s) * 1e6 */
    int64_t next_correlation; /* __atomic */
    /* The accounting (under mu). */
    pthread_mutex_t mu;
    int computing, communicating; /* compute spans open; communications in flight */
    int seen_busy;
    double last_s;            /* clock_seconds() of the last change */
    double compute_s, comm_s, idle_s;
    double on_at, off_at;     /* clock_seconds() when the traced window began, when the last one ended */
    double prev_on_at;        /* when the window that ended at off_at began */
    /* "ncclKernel_OP GROUP", made once (no formatting while recording). */
    char names[COMM_TRACE_OPS][GROUP_COUNT][40];
} CommTracer;

/* A span being measured. */
typedef struct CommSpan {
    int on;
    double t0;
} CommSpan;

/* Sets up t (trace, pids, shift_s filled by the caller before). -1 when a mutex cannot be made. */
int comm_tracer_init(CommTracer *t, Trace *trace, int device_pid, int host_pid, double shift_s);
void comm_tracer_free(CommTracer *t);
static inline int comm_tracer_on(const CommTracer *t) { return t && __atomic_load_n(&t->on, __ATOMIC_RELAXED); }
/* Recording on or off from now (clock_seconds()); off ends the traced window (see the top). */
void comm_tracer_set_on(CommTracer *t, int on, double now);
/* Trace microseconds of a clock_seconds() reading. */
static inline double comm_trace_us(const CommTracer *t, double s) { return (s + t->shift_s) * 1e6; }
int64_t comm_trace_correlation(CommTracer *t);

/* The accounting's state changes at clock_seconds() `now`: dcompute, dcomm = +1 (a span opens) or -1. */
void comm_tracer_account(CommTracer *t, int dcompute, int dcomm, double now);
/* The sums so far: seconds computing, communicating (not computing) and idle between busy times. */
void comm_tracer_sums(CommTracer *t, double *compute_s, double *comm_s, double *idle_s);

/* A device-side span of [t0_s, t1_s] (clock_seconds()) on (device_pid, stream) and its launch on the
 * host at launch_s, correlation id corr; args may be NULL. */
void comm_trace_device_span(CommTracer *t, const char *name, int64_t stream, double t0_s, double t1_s,
                            double launch_s, int64_t corr, TraceArgs *args);

/* The hooks of engine/comm (comm.c, comm_mpi.c, comm_async.c). begin: a communication of c starts
 * now (accounted in flight); end: it is over, recorded as op on g (bytes, peer -1: none), started at
 * started_s (0: at begin) and waited for at waited_s (0: not waited for apart). */
void comm_trace_begin(const Comm *c, CommSpan *s);
void comm_trace_end(const Comm *c, const CommSpan *s, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer,
                    double started_s, double waited_s);
/* The span of a communication on its lane, [t0_s, t1_s], with when it was started, waited for (0:
 * not apart) and finished in its args. */
void comm_trace_record(CommTracer *t, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer, double started_s,
                       double waited_s, double t0_s, double t1_s);
/* A started collective's kind of span, and its bytes (the whole buffer of the group's result). */
CommTraceOp comm_trace_op_of(CommOpKind kind);
int64_t comm_op_bytes(const Comm *c, const CommOp *op);
/* Messages in flight (comm_isend, comm_irecv): marked in the request at their start; their span is
 * the wait (comm_wait). */
void comm_trace_request_start(const Comm *c, CommRequest *req, CommTraceOp op, LayoutGroup g, int64_t bytes,
                              int peer);
/* The host-side span of the issuing thread's wait for a background collective, [t0_s, now]. */
void comm_trace_host_wait(const Comm *c, double t0_s);


#ifdef __cplusplus
}
#endif

#endif
