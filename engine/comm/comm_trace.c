/* engine/comm/comm_trace.c - see comm_trace.h. */
#include "engine/comm/comm_trace.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"

/* NCCL's kernels' names, which HTA knows for communication by ^nccl.*Kernel (HolisticTraceAnalysis
 * 0.5: "nccl:all_reduce" would count as computation). */
static const char *const op_names[COMM_TRACE_OPS] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                                     "Send", "Recv", "SendRecv"};

static const char *group_name(int g)
{
    static const char *const names[] = {"tp", "cp", "pp", "dp", "dp_cp", "world"};
    return g < GROUP_CP_BLOCK ? names[g] : "cp_block";
}

int comm_tracer_init(CommTracer *t, Trace *trace, int device_pid, int host_pid, double shift_s)
{
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mu, NULL) != 0)
        return -1;
    t->trace = trace;
    t->device_pid = device_pid;
    t->host_pid = host_pid;
    t->shift_s = shift_s;
    t->next_correlation = COMM_TRACE_CORRELATION0;
    for (int o = 0; o < COMM_TRACE_OPS; o++)
        for (int g = 0; g < GROUP_COUNT; g++) {
            if (g >= GROUP_CP_BLOCK)
                snprintf(t->names[o][g], sizeof t->names[o][g], "ncclKernel_%s cp_block%d", op_names[o],
                         2 << (g - GROUP_CP_BLOCK));
            else
                snprintf(t->names[o][g], sizeof t->names[o][g], "ncclKernel_%s %s", op_names[o], group_name(g));
        }
    return 0;
}

void comm_tracer_free(CommTracer *t)
{
    if (t)
        pthread_mutex_destroy(&t->mu);
}

/* The state's time up to now into its sums (the caller holds mu). */
static void accrue(CommTracer *t, double now)
{
    double dt = now - t->last_s;
    dt = dt > 0 ? dt : 0;
    if (t->computing > 0)
        t->compute_s += dt;
    else if (t->communicating > 0)
        t->comm_s += dt;
    if (now > t->last_s && (t->computing > 0 || t->communicating > 0))
        t->last_s = now;
}

void comm_tracer_set_on(CommTracer *t, int on, double now)
{
    pthread_mutex_lock(&t->mu);
    if (!on && t->on) {
        /* The window ends: what runs on past it is neither accounted nor drawn (comm_trace_record
         * cuts its span here), as HTA would see none of it. */
        accrue(t, now);
        t->off_at = now;
    } else if (on && !t->on) {
        /* A window begins. A collective still running from before (it began in the last window or
         * between the two) counts, and is drawn, from now on; the idle time since the last busy
         * moment ends here then. */
        if (t->computing > 0 || t->communicating > 0) {
            if (t->seen_busy && now > t->last_s)
                t->idle_s += now - t->last_s;
            t->seen_busy = 1;
            t->last_s = now;
        }
        t->prev_on_at = t->on_at;
        t->on_at = now;
    }
    __atomic_store_n(&t->on, on, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->mu);
}

int64_t comm_trace_correlation(CommTracer *t)
{
    return __atomic_fetch_add(&t->next_correlation, 1, __ATOMIC_RELAXED);
}

/* The state's time since the last change goes to its sum: computing wins over communicating; idle
 * counts only between two busy times (HTA's idle: inside the span of the device-side events), so
 * it is added when a busy time begins. */
void comm_tracer_account(CommTracer *t, int dcompute, int dcomm, double now)
{
    pthread_mutex_lock(&t->mu);
    if (!t->on) { /* past the traced window: the counts only (a span that began inside ends) */
        t->computing += dcompute;
        t->communicating += dcomm;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    double dt = now - t->last_s;
    dt = dt > 0 ? dt : 0;
    int busy = t->computing > 0 || t->communicating > 0;
    if (t->computing > 0)
        t->compute_s += dt;
    else if (t->communicating > 0)
        t->comm_s += dt;
    t->computing += dcompute;
    t->communicating += dcomm;
    if (!busy && (t->computing > 0 || t->communicating > 0)) {
        if (t->seen_busy)
            t->idle_s += dt;
        t->seen_busy = 1;
    }
    if (now > t->last_s)
        t->last_s = now;
    pthread_mutex_unlock(&t->mu);
}

void comm_tracer_sums(CommTracer *t, double *compute_s, double *comm_s, double *idle_s)
{
    pthread_mutex_lock(&t->mu);
    *compute_s = t->compute_s;
    *comm_s = t->comm_s;
    *idle_s = t->idle_s;
    pthread_mutex_unlock(&t->mu);
}

void comm_trace_device_span(CommTracer *t, const char *name, int64_t stream, double t0_s, double t1_s,
                            double launch_s, int64_t corr, TraceArgs *args)
{
    /* HTA takes a device event for a kernel when its args hold stream >= 0 and correlation >= 0,
     * and keeps it (with two steps or more) only when a host-side event has its correlation. */
    TraceArgs own;
    if (!args) {
        trace_args_init(&own);
        args = &own;
    }
    trace_arg_int(args, "stream", stream);
    trace_arg_int(args, "correlation", corr);
    /* On whole microseconds: HTA rounds a span's start up and its end down, which would take up to
     * 2 us off every span (and add it to the idle time between spans); whole ones it keeps as
     * they are. Both ends rounded to the nearest: spans that touch still touch. */
    double ts = nearbyint(comm_trace_us(t, t0_s)), end = nearbyint(comm_trace_us(t, t1_s));
    double launch = nearbyint(comm_trace_us(t, launch_s)); /* a point (no partial overlap on the host) */
    trace_span(t->trace, "kernel", name, t->device_pid, stream, ts, end - ts, args);
    TraceArgs la;
    trace_args_init(&la);
    trace_arg_int(&la, "correlation", corr);
    trace_span(t->trace, "cuda_runtime", "cudaLaunchKernel", t->host_pid, COMM_TRACE_HOST_TID, launch, 0, &la);
    /* No ac2g flow events (Perfetto's arrows from a launch to its kernel): they would be a quarter of
     * the events of a step, and the correlation id already ties the two together. */
}

void comm_trace_begin(const Comm *c, CommSpan *s)
{
    s->on = comm_tracer_on(c->tracer);
    if (!s->on)
        return;
    s->t0 = clock_seconds();
    comm_tracer_account(c->tracer, 0, 1, s->t0);
}

static void record_part(CommTracer *t, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer, double started_s,
                        double waited_s, double t0_s, double t1_s);

void comm_trace_record(CommTracer *t, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer, double started_s,
                       double waited_s, double t0_s, double t1_s)
{
    /* Only its parts inside traced windows, as the accounting counts it: the last window that ended,
     * and the one running now (a collective that began in a window and ran on past its end -
     * ZeRO-1's gathers after the update, a send waited for in the next step - is cut there). */
    pthread_mutex_lock(&t->mu);
    double win[2][2] = {{t->on ? t->prev_on_at : t->on_at, t->off_at}, {t->on_at, t->on ? 1e300 : -1}};
    pthread_mutex_unlock(&t->mu);
    for (int w = 0; w < 2; w++) {
        double a = t0_s > win[w][0] ? t0_s : win[w][0], b = t1_s < win[w][1] ? t1_s : win[w][1];
        if (b > a || (t0_s == t1_s && a == b)) /* a part of it; an instant inside the window */
            record_part(t, op, g, bytes, peer, started_s, waited_s, a, b);
    }
}

static void record_part(CommTracer *t, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer, double started_s,
                        double waited_s, double t0_s, double t1_s)
{
    int64_t corr = comm_trace_correlation(t);
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_str(&a, "group", group_name(g));
    trace_arg_int(&a, "bytes", bytes);
    if (peer >= 0)
        trace_arg_int(&a, "peer", peer);
    trace_arg_num(&a, "started_us", comm_trace_us(t, started_s));
    if (waited_s > 0)
        trace_arg_num(&a, "waited_us", comm_trace_us(t, waited_s));
    trace_arg_num(&a, "finished_us", comm_trace_us(t, t1_s));
    int64_t stream = op == COMM_TRACE_SEND ? COMM_TRACE_STREAM_SEND
                     : op == COMM_TRACE_RECV ? COMM_TRACE_STREAM_RECV
                                              : COMM_TRACE_STREAM_GROUP + (int64_t)g;
    comm_trace_device_span(t, t->names[op][g], stream, t0_s, t1_s, started_s, corr, &a);
}

void comm_trace_end(const Comm *c, const CommSpan *s, CommTraceOp op, LayoutGroup g, int64_t bytes, int peer,
                    double started_s, double waited_s)
{
    if (!s->on)
        return;
    CommTracer *t = c->tracer;
    double now = clock_seconds();
    comm_tracer_account(t, 0, -1, now);
    comm_trace_record(t, op, g, bytes, peer, started_s > 0 ? started_s : s->t0, waited_s, s->t0, now);
}

void comm_trace_request_start(const Comm *c, CommRequest *req, CommTraceOp op, LayoutGroup g, int64_t bytes,
                              int peer)
{
    req->trace_started = 0;
    if (!comm_tracer_on(c->tracer))
        return;
    req->trace_started = clock_seconds();
    req->trace_bytes = bytes;
    req->trace_op = (short)op;
    req->trace_group = (short)g;
    req->trace_peer = (short)peer;
}

void comm_trace_host_wait(const Comm *c, double t0_s)
{
    CommTracer *t = c->tracer;
    double now = clock_seconds();
    trace_span(t->trace, "user_annotation", "comm_wait", t->host_pid, COMM_TRACE_HOST_TID, comm_trace_us(t, t0_s),
               (now - t0_s) * 1e6, NULL);
}

CommTraceOp comm_trace_op_of(CommOpKind kind)
{
    switch (kind) {
    case COMM_OP_ALLREDUCE_SUM:
        return COMM_TRACE_ALLREDUCE;
    case COMM_OP_ALLGATHERV:
    case COMM_OP_ALLGATHER:
        return COMM_TRACE_ALLGATHER;
    case COMM_OP_REDUCE_SCATTERV:
    case COMM_OP_REDUCE_SCATTER:
        return COMM_TRACE_REDUCE_SCATTER;
    }
    return COMM_TRACE_ALLREDUCE;
}

int64_t comm_op_bytes(const Comm *c, const CommOp *op)
{
    int64_t e = (int64_t)comm_elem_bytes(c, op->dt), n = op->n;
    if (op->kind == COMM_OP_ALLGATHERV || op->kind == COMM_OP_REDUCE_SCATTERV) {
        n = 0;
        for (int i = 0; i < c->size[op->group]; i++)
            n += op->counts[i];
    } else if (op->kind != COMM_OP_ALLREDUCE_SUM) {
        n *= c->size[op->group];
    }
    return n * e;
}
