/*
 * engine/comm/comm.c - the float collectives and messages of comm.h, through the Comm's data path
 * (c->impl: MPI's, or the one comm_use switched to).
 */
#include "engine/comm/comm.h"

#include "engine/comm/comm_async.h"
#include "engine/comm/comm_strict.h"
#include "engine/comm/comm_trace.h"
#include "engine/comm/comm_watchdog.h"
#include "util/clock.h"

#include <pthread.h>

/* comm_blocked_s: this thread's seconds in calls that can wait, and how deep it is in them now (a
 * call made inside another is not counted again). comm_any_blocked_s: the seconds in which some
 * thread was inside one - the finished spans, and the one open since any_since while any_open
 * threads are inside (under any_mu: the stall clock's thread reads it). */
static _Thread_local double blocked_s;
static _Thread_local int blocked_depth;
static pthread_mutex_t any_mu = PTHREAD_MUTEX_INITIALIZER;
static double any_closed_s, any_since;
static int any_open;

double comm_blocked_s(void) { return blocked_s; }

double comm_any_blocked_s(void)
{
    pthread_mutex_lock(&any_mu);
    double s = any_closed_s + (any_open ? clock_seconds() - any_since : 0);
    pthread_mutex_unlock(&any_mu);
    return s;
}

double comm_block_begin(void)
{
    if (blocked_depth++)
        return -1;
    double t0 = clock_seconds();
    pthread_mutex_lock(&any_mu);
    if (any_open++ == 0)
        any_since = t0;
    pthread_mutex_unlock(&any_mu);
    return t0;
}

int comm_block_end(double t0, int rc)
{
    if (--blocked_depth == 0 && t0 >= 0) {
        double t1 = clock_seconds();
        blocked_s += t1 - t0;
        pthread_mutex_lock(&any_mu);
        if (--any_open == 0)
            any_closed_s += t1 - any_since;
        pthread_mutex_unlock(&any_mu);
    }
    return rc;
}

/* A blocking collective on g: logged, after the collectives started on g have run. */
static void blocking(const Comm *c, LayoutGroup g, const char *op, int64_t n)
{
    comm_log_op(c, g, op, n);
    comm_async_drain(c, g);
}

/* Runs op to the end through c's data path (the blocking forms): at a start that completes at once,
 * and on the communication threads (comm_async_start's runner). The sums are float32 on the path,
 * or in bfloat16 (comm_sums_in_bf16) - those only at a start, never on a thread. */
static int run_op(Comm *c, const CommOp *op, Error *err)
{
    const CommImpl *i = c->impl;
    int sum = op->kind == COMM_OP_ALLREDUCE_SUM || op->kind == COMM_OP_REDUCE_SCATTERV ||
              op->kind == COMM_OP_REDUCE_SCATTER;
    if (sum && comm_sums_in_bf16(c, op->group, op->dt))
        return comm_run_sum_bf16(c, op, err);
    switch (op->kind) {
    case COMM_OP_ALLREDUCE_SUM:
        return op->n == 0 ? 0 : i->allreduce_sum(c, op->group, (float *)op->recv, op->n, err);
    case COMM_OP_ALLGATHERV:
        return i->allgatherv(c, op->group, op->send, op->recv, op->counts, op->dt, err);
    case COMM_OP_REDUCE_SCATTERV:
        return i->reduce_scatterv(c, op->group, (const float *)op->send, (float *)op->recv, op->counts, err);
    case COMM_OP_ALLGATHER:
        return i->allgather(c, op->group, op->send, op->recv, op->n, op->dt, err);
    case COMM_OP_REDUCE_SCATTER:
        return i->reduce_scatter(c, op->group, (const float *)op->send, (float *)op->recv, op->n, err);
    }
    return error_runtime(err, "comm", "unknown collective %d", (int)op->kind);
}

int64_t comm_outstanding(const Comm *c) { return comm_async_outstanding(c); }

static int64_t sum_counts(const Comm *c, LayoutGroup g, const int64_t *counts)
{
    int64_t t = 0;
    for (int i = 0; i < c->size[g]; i++)
        t += counts[i];
    return t;
}

int comm_use(Comm *c, const CommImpl *impl, Error *err)
{
    if (impl == c->impl)
        return 0;
    if (impl->open && impl->open(c, err) != 0) {
        if (impl->close)
            impl->close(c);
        c->impl_state = NULL;
        return -1;
    }
    c->impl = impl;
    return 0;
}

int comm_allreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    blocking(c, g, "allreduce", n);
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(n == 0 ? 0 : c->impl->allreduce_sum(c, g, buf, n, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLREDUCE, g, n * 4, -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_allgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt, Error *err)
{
    double t0 = comm_block_begin();
    blocking(c, g, "allgatherv", sum_counts(c, g, counts));
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(c->impl->allgatherv(c, g, send, recv, counts, dt, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLGATHER, g, sum_counts(c, g, counts) * (int64_t)comm_elem_bytes(c, dt), -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_reduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts, Error *err)
{
    double t0 = comm_block_begin();
    blocking(c, g, "reduce_scatterv", sum_counts(c, g, counts));
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(c->impl->reduce_scatterv(c, g, send, recv, counts, err));
    comm_trace_end(c, &sp, COMM_TRACE_REDUCE_SCATTER, g, sum_counts(c, g, counts) * 4, -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_allgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, Error *err)
{
    double t0 = comm_block_begin();
    blocking(c, g, "allgather", n);
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(c->impl->allgather(c, g, send, recv, n, dt, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLGATHER, g, n * c->size[g] * (int64_t)comm_elem_bytes(c, dt), -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_reduce_scatter(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    blocking(c, g, "reduce_scatter", n);
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(c->impl->reduce_scatter(c, g, send, recv, n, err));
    comm_trace_end(c, &sp, COMM_TRACE_REDUCE_SCATTER, g, n * c->size[g] * 4, -1, 0, 0);
    return comm_block_end(t0, rc);
}


void comm_lane_peers(const Comm *c, CommLane lane, int wrap, int *to, int *from)
{
    int pp = c->size[GROUP_PP], s = c->rank[GROUP_PP];
    int next = s + 1 < pp ? s + 1 : wrap ? 0 : -1, prev = s > 0 ? s - 1 : wrap ? pp - 1 : -1;
    if (pp == 1)
        next = prev = -1;
    *to = lane == COMM_LANE_ACT ? next : prev;
    *from = lane == COMM_LANE_ACT ? prev : next;
}

int comm_connect_pipeline(Comm *c, int wrap, Error *err)
{
    if (!c->mpi || c->size[GROUP_PP] == 1)
        return 0;
    int to[COMM_LANES], from[COMM_LANES];
    for (int l = 0; l < COMM_LANES; l++) {
        comm_lane_peers(c, (CommLane)l, wrap, &to[l], &from[l]);
        comm_strict_connected(c, (CommLane)l, to[l], from[l]);
    }
    comm_async_drain(c, GROUP_PP);
    return c->impl->connect ? c->impl->connect(c, to, from, err) : 0;
}

int comm_exchange(Comm *c, LayoutGroup g, int peer, const float *send, float *recv, int64_t n, Error *err)
{
    if (!c->mpi)
        return error_runtime(err, "comm", "exchange with %d in a world of one", peer);
    double t0 = comm_block_begin();
    blocking(c, g, "exchange", n);
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(n == 0 ? 0 : c->impl->exchange(c, g, peer, send, recv, n, err));
    comm_trace_end(c, &sp, COMM_TRACE_EXCHANGE, g, n * 4, -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
               CommRequest *req, Error *err)
{
    if (!c->mpi)
        return error_runtime(err, "comm", "send to %d in a world of one", peer);
    double t0 = comm_block_begin();
    comm_async_drain(c, g);
    comm_block_end(t0, 0);
    comm_flight_begin(g, c->group_id[g], c->mpi ? c->size[g] : 1, "send", n, peer);
    comm_flight_bind(req);
    if (c->impl->isend(c, g, peer, lane, tag, buf, n, req, err) != 0)
        return -1;
    comm_trace_request_start(c, req, COMM_TRACE_SEND, g, n * 4, peer);
    comm_async_count(c, 1);
    return 0;
}

static int wait_request(const Comm *c, CommRequest *req, Error *err)
{
    if (!req->active)
        return 0;
    if (req->collective && req->op)
        return comm_async_wait(c, req, err);
    comm_async_count(c, -1);
    if (req->trace_started > 0 && c->tracer) {
        /* A traced message: its span is the wait (how long this rank waited for it to complete). */
        CommSpan sp = {1, clock_seconds()};
        double started = req->trace_started;
        req->trace_started = 0;
        comm_tracer_account(c->tracer, 0, 1, sp.t0);
        int rc = c->impl->wait(c, req, err);
        comm_trace_end(c, &sp, (CommTraceOp)req->trace_op, (LayoutGroup)req->trace_group, req->trace_bytes,
                       req->trace_peer, started, sp.t0);
        return rc;
    }
    return c->impl->wait(c, req, err);
}

int comm_wait(const Comm *c, CommRequest *req, Error *err)
{
    double t0 = comm_block_begin();
    int rc = wait_request(c, req, err);
    comm_flight_end_req(req);
    return comm_block_end(t0, rc);
}

int comm_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err)
{
    if (!c->mpi)
        return error_runtime(err, "comm", "receive from %d in a world of one", peer);
    double t0 = comm_block_begin();
    comm_async_drain(c, g);
    comm_flight_begin(g, c->group_id[g], c->mpi ? c->size[g] : 1, "recv", n, peer);
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = comm_flight_end(c->impl->recv(c, g, peer, lane, tag, buf, n, err));
    comm_trace_end(c, &sp, COMM_TRACE_RECV, g, n * 4, peer, 0, 0);
    return comm_block_end(t0, rc);
}

void comm_set_overlap(Comm *c, int on) { c->overlap = on; }

int64_t comm_wait_mark(Comm *c) { return c->impl->wait_mark ? c->impl->wait_mark(c) : -1; }

double comm_waited_s(Comm *c, int64_t from, int64_t to)
{
    return c->impl->waited_s && from >= 0 ? c->impl->waited_s(c, from, to) : -1;
}

void comm_wait_reset(Comm *c)
{
    if (c->impl->wait_reset)
        c->impl->wait_reset(c);
}

int comm_can_post_receives(const Comm *c) { return c->mpi && c->overlap && c->impl->irecv; }

int comm_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, CommRequest *req,
               Error *err)
{
    if (!comm_can_post_receives(c))
        return error_runtime(err, "comm", "receives cannot be posted ahead on this path");
    double t0 = comm_block_begin();
    comm_async_drain(c, g);
    comm_block_end(t0, 0);
    req->collective = 0;
    req->op = NULL;
    comm_flight_begin(g, c->group_id[g], c->mpi ? c->size[g] : 1, "recv", n, peer);
    comm_flight_bind(req);
    if (c->impl->irecv(c, g, peer, lane, tag, buf, n, req, err) != 0)
        return -1;
    comm_trace_request_start(c, req, COMM_TRACE_RECV, g, n * 4, peer);
    comm_async_count(c, 1);
    return 0;
}

static const char *const op_names[] = {"allreduce", "allgatherv", "reduce_scatterv", "allgather", "reduce_scatter"};

int comm_istart(Comm *c, const CommOp *op, CommRequest *req, Error *err)
{
    LayoutGroup g = op->group;
    if (req->active)
        return error_runtime(err, "comm", "a collective started on a request still active (not waited for)");
    req->collective = 0;
    req->op = NULL;
    int v = op->kind == COMM_OP_ALLGATHERV || op->kind == COMM_OP_REDUCE_SCATTERV;
    comm_log_op(c, g, op_names[op->kind], v ? sum_counts(c, g, op->counts) : op->n);
    comm_flight_bind(req); /* finished at comm_wait */
    int sum = op->kind == COMM_OP_ALLREDUCE_SUM || op->kind == COMM_OP_REDUCE_SCATTERV || op->kind == COMM_OP_REDUCE_SCATTER;
    int background = c->overlap && c->mpi && c->size[g] > 1 && !(op->kind == COMM_OP_ALLREDUCE_SUM && op->n == 0) &&
                     !(sum && comm_sums_in_bf16(c, g, op->dt));
    if (background && c->impl->istart) {
        if (c->impl->istart(c, op, req, err) != 0)
            return -1;
        /* NCCL's: traced as the host sees it, from its start to the end of its wait (comm_wait) */
        comm_trace_request_start(c, req, comm_trace_op_of(op->kind), g, comm_op_bytes(c, op), -1);
        comm_async_count(c, 1);
        return 0;
    }
    /* MPI's communication threads: host memory only (a staged GPU buffer is copied by the caller's
     * thread, whose device context it is). */
    if (background && c->impl == &comm_mpi && !c->stage && c->thread_multiple)
        return comm_async_start(c, op, run_op, req, err);
    double t0 = comm_block_begin();
    comm_async_drain(c, g); /* at once, after the group's started ones */
    CommSpan sp;
    comm_trace_begin(c, &sp);
    int rc = run_op(c, op, err);
    comm_trace_end(c, &sp, comm_trace_op_of(op->kind), g, comm_op_bytes(c, op), -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_iallreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_ALLREDUCE_SUM, g, NULL, buf, n, NULL, DT_F32};
    return comm_istart(c, &op, req, err);
}

int comm_ireduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                          CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_REDUCE_SCATTERV, g, send, recv, 0, counts, DT_F32};
    return comm_istart(c, &op, req, err);
}

int comm_iallgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt,
                     CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_ALLGATHERV, g, send, recv, 0, counts, dt};
    return comm_istart(c, &op, req, err);
}

int comm_iallgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, CommRequest *req,
                    Error *err)
{
    CommOp op = {COMM_OP_ALLGATHER, g, send, recv, n, NULL, dt};
    return comm_istart(c, &op, req, err);
}

int comm_iallreduce_sum_dt(Comm *c, LayoutGroup g, float *buf, int64_t n, Dt sum_dt, CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_ALLREDUCE_SUM, g, NULL, buf, n, NULL, sum_dt};
    return comm_istart(c, &op, req, err);
}

int comm_ireduce_scatter_sum(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Dt sum_dt,
                             CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_REDUCE_SCATTER, g, send, recv, n, NULL, sum_dt};
    return comm_istart(c, &op, req, err);
}

int comm_ireduce_scatterv_sum(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                              Dt sum_dt, CommRequest *req, Error *err)
{
    CommOp op = {COMM_OP_REDUCE_SCATTERV, g, send, recv, 0, counts, sum_dt};
    return comm_istart(c, &op, req, err);
}
