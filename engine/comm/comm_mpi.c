/*
 * engine/comm/comm_mpi.c - the job's ranks and groups under MPI, the host-memory collectives, and
 * MPI's data path for the float collectives and messages (comm_mpi, see comm.h).
 */
#include "engine/comm/comm.h"

#include "engine/comm/comm_async.h"
#include "engine/comm/comm_strict.h"
#include "engine/comm/comm_trace.h"
#include "engine/comm/comm_watchdog.h"
#include "engine/comm/runtime.h"
#include "util/clock.h"

#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int mpi_error(int rc, const char *what, Error *err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return error_runtime(err, "mpi", "%s: %s", what, msg);
}

#define CHECK(call, what)                                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS)                                                                    \
            return mpi_error(rc_, what, err);                                                      \
    } while (0)

static MPI_Comm group_comm(const Comm *c, LayoutGroup g) { return *(MPI_Comm *)c->groups[g]; }

/* The float collectives run as MPI's non-blocking forms, finished here: MPI_Wait on the main
 * thread; on a communication thread (comm_async_polling) MPI_Test between sleeps, so that a
 * thread waiting for its peers leaves the cores to the products instead of spinning in MPI_Wait.
 * The sleeps grow from 20 us to at most 200 us while the wait lasts: a collective whose peers are
 * still computing costs a few wake-ups a millisecond, and one that is moving is polled often enough
 * that its steps (each needs a call to progress) follow each other closely.
 * Both threads use the same forms, so a collective sums in the same order either way. */

static int finish(MPI_Request *r, const char *what, Error *err)
{
    if (!comm_async_polling()) {
        CHECK(MPI_Wait(r, MPI_STATUS_IGNORE), what);
        return 0;
    }
    long nap_ns = 20000;
    for (int spins = 0;; spins++) {
        int done = 0;
        CHECK(MPI_Test(r, &done, MPI_STATUS_IGNORE), what);
        if (done)
            return 0;
        if (spins >= 16) {
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
            if (nap_ns < 200000)
                nap_ns *= 2;
        }
    }
}

/* A non-blocking MPI call that fills request r_, and its finish. */
#define RUN(call, what)                                                                            \
    do {                                                                                           \
        MPI_Request r_;                                                                            \
        CHECK(call, what);                                                                         \
        if (finish(&r_, what, err) != 0)                                                           \
            return -1;                                                                             \
    } while (0)

static int count_ok(int64_t n, const char *what, Error *err)
{
    if (n < 0 || n > INT_MAX)
        return error_runtime(err, "mpi", "%s: %lld elements in one message", what, (long long)n);
    return 0;
}

/* wlb_fatal's way out under MPI: the whole job ends, no rank waits for this one. */
static void abort_job(int status)
{
    MPI_Abort(MPI_COMM_WORLD, status);
}

int comm_start(Comm *c, int launched, Error *err)
{
    memset(c, 0, sizeof *c);
    c->impl = &comm_mpi;
    for (int g = 0; g < GROUP_COUNT; g++) {
        c->size[g] = 1;
        c->rank[g] = 0;
    }
    c->node_ranks = 1;
    if (comm_async_init(c, err) != 0)
        return -1;
    if (!launched)
        return 0;
    int provided;
    /* OpenMP threads compute; the main thread and the communication threads (comm_async.c) call
     * MPI, each on communicators of its own at any one time. Without MPI_THREAD_MULTIPLE started
     * collectives run at their start. */
    /* MPI_Init waits for every rank of the job (the launcher's fence): a rank that never gets there
     * leaves the others in it, so it is a collective of the flight recorder's over the world as the
     * launcher counts it (the watchdog runs from before it: comm_watchdog_launch). */
    comm_flight_begin(GROUP_WORLD, 0, runtime_launch_from_env().world_size, "MPI_Init", 0, -1);
    CHECK(comm_flight_end(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided)), "MPI_Init_thread");
    comm_watchdog_mpi(1);
    c->mpi = 1;
    c->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->size[GROUP_WORLD]), "MPI_Comm_size");
    CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank[GROUP_WORLD]), "MPI_Comm_rank");
    int *ub, flag = 0;
    CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag), "MPI_Comm_get_attr");
    c->tag_limit = flag ? *ub : 32767; /* the standard's minimum */
    if (c->size[GROUP_WORLD] > 1)
        error_set_fatal_context(c->rank[GROUP_WORLD], abort_job);
    MPI_Comm node;
    comm_flight_begin(GROUP_WORLD, 0, c->size[GROUP_WORLD], "MPI_Comm_split_type", 0, -1);
    CHECK(comm_flight_end(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node)),
          "MPI_Comm_split_type");
    int rc = MPI_Comm_size(node, &c->node_ranks);
    MPI_Comm_free(&node);
    CHECK(rc, "MPI_Comm_size");
    return 0;
}

/* The data path's asynchronous errors and abort (NCCL's), for the watchdog's thread: whichever path
 * the Comm uses when it asks. */
static int path_async_error(const void *ctx, char *msg, size_t size)
{
    const Comm *c = ctx;
    return c->impl && c->impl->async_error ? c->impl->async_error(c, msg, size) : 0;
}

static void path_abort(const void *ctx)
{
    const Comm *c = ctx;
    if (c->impl && c->impl->abort)
        c->impl->abort(c);
}

int comm_group_made(const Comm *c, LayoutGroup g)
{
    return g < GROUP_CP_BLOCK || (c->cp_blocks && layout_cp_block_size(g) < c->layout.cp);
}

int comm_split(Comm *c, int tp, int cp, int pp, int dp, int cp_blocks, Error *err)
{
    c->layout = layout_of(tp, cp, pp, dp, c->rank[GROUP_WORLD]);
    c->cp_blocks = cp_blocks;
    if (layout_world(&c->layout) != c->size[GROUP_WORLD])
        return error_set(err, "parallel", "tp * cp * pp * dp = %d, but the job has %d ranks", layout_world(&c->layout),
                         c->size[GROUP_WORLD]);
    if (!c->mpi)
        return 0;
    for (int g = 0; g < GROUP_COUNT; g++) {
        if (!comm_group_made(c, (LayoutGroup)g))
            continue; /* the same groups on every rank: the splits stay collective */
        MPI_Comm *h = malloc(sizeof *h);
        if (!h)
            return error_runtime(err, "mpi", "out of memory");
        c->groups[g] = h;
        int members[4096];
        int n = c->size[GROUP_WORLD] <= 4096 ? layout_group(&c->layout, (LayoutGroup)g, members) : 0;
        if (n == 0 && c->size[GROUP_WORLD] > 4096)
            return error_runtime(err, "mpi", "the CPU engine runs at most 4096 ranks");
        /* The group's color: its lowest member, the same for every member. */
        int color = members[0];
        for (int i = 1; i < n; i++)
            color = members[i] < color ? members[i] : color;
        comm_flight_begin(GROUP_WORLD, 0, c->size[GROUP_WORLD], "MPI_Comm_split", 0, -1);
        CHECK(comm_flight_end(MPI_Comm_split(MPI_COMM_WORLD, color, layout_group_rank(&c->layout, (LayoutGroup)g), h)),
              "MPI_Comm_split");
        CHECK(MPI_Comm_set_errhandler(*h, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        CHECK(MPI_Comm_size(*h, &c->size[g]), "MPI_Comm_size");
        CHECK(MPI_Comm_rank(*h, &c->rank[g]), "MPI_Comm_rank");
        c->group_id[g] = color;
    }
    /* The watchdog (when it runs) learns the groups, and gets its side communicator to ask the
     * other ranks which one never came (MPI_THREAD_MULTIPLE: its thread calls MPI beside the main
     * thread's). */
    CommWatchdogJob job = {.side = c->thread_multiple, .ctx = c, .async_error = path_async_error,
                           .abort = path_abort};
    for (int g = 0; g < GROUP_COUNT; g++) {
        job.group_id[g] = c->group_id[g];
        job.group_size[g] = comm_group_made(c, (LayoutGroup)g) ? c->size[g] : 0;
    }
    if (comm_watchdog_attach(&job, err) != 0)
        return -1;
    return comm_async_open_log(c, err);
}

void comm_set_backend(Comm *c, const Ops *ops, int stage)
{
    c->ops = ops;
    c->stage = stage || (ops && !ops->host_memory);
}

/* Host staging room for n floats in c->host (and c->host2 with two). */
static int stage_room(Comm *c, int64_t n, Error *err)
{
    if (n <= c->cap_host)
        return 0;
    free(c->host);
    free(c->host2);
    c->host = malloc((size_t)(n ? n : 1) * sizeof *c->host);
    c->host2 = malloc((size_t)(n ? n : 1) * sizeof *c->host2);
    c->cap_host = c->host && c->host2 ? n : 0;
    return c->cap_host ? 0 : error_runtime(err, "comm", "out of memory for %lld staged floats", (long long)n);
}

static void to_host(const Comm *c, float *dst, const float *src, int64_t n)
{
    if (n > 0)
        c->ops->to_host(dst, src, (size_t)n * sizeof *dst);
}

static void to_device(const Comm *c, float *dst, const float *src, int64_t n)
{
    if (n > 0)
        c->ops->to_device(dst, src, (size_t)n * sizeof *dst);
}

static int64_t total(const int64_t *counts, int n)
{
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += counts[i];
    return t;
}

void comm_finish(Comm *c)
{
    comm_async_free(c);
    if (c->impl && c->impl->close)
        c->impl->close(c);
    c->impl = &comm_mpi;
    c->impl_state = NULL;
    free(c->host);
    free(c->host2);
    c->host = c->host2 = NULL;
    c->cap_host = 0;
    free(c->connected);
    c->connected = NULL;
    if (c->sum16 && c->ops)
        c->ops->free(c->sum16);
    c->sum16 = NULL;
    c->cap_sum16 = 0;
    for (int g = 0; g < GROUP_COUNT; g++) {
        if (c->groups[g]) {
            MPI_Comm_free((MPI_Comm *)c->groups[g]);
            free(c->groups[g]);
        }
        c->groups[g] = NULL;
    }
    if (c->mpi) {
        /* The end is bounded too: a final barrier (a rank that stopped after its last checkpoint
         * leaves the others here, where the watchdog still asks the side communicator and ends the
         * job through MPI_Abort), then MPI_Finalize (its fence: a rank stopped in it is named by
         * the flight records, and the job ends through _exit). */
        if (c->size[GROUP_WORLD] > 1) {
            comm_flight_begin(GROUP_WORLD, 0, c->size[GROUP_WORLD], "final_barrier", 0, -1);
            comm_flight_end(MPI_Barrier(MPI_COMM_WORLD));
        }
        comm_watchdog_detach();
        comm_watchdog_mpi(0);
        if (c->fault_stop_in_finalize) {
            fflush(stdout);
            raise(SIGSTOP);
            for (;;) /* woken by the launcher's end of the job: stays hung */
                pause();
        }
        error_set_fatal_context(-1, NULL);
        comm_flight_begin(GROUP_WORLD, 0, c->size[GROUP_WORLD], "MPI_Finalize", 0, -1);
        comm_flight_end(MPI_Finalize());
    }
    c->mpi = 0;
}

void comm_abort(const Comm *c, int status)
{
    fflush(stdout);
    fflush(stderr);
    if (c->mpi && c->size[GROUP_WORLD] > 1)
        MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);
}

int comm_world_size(const Comm *c) { return c->size[GROUP_WORLD]; }
int comm_world_rank(const Comm *c) { return c->rank[GROUP_WORLD]; }

/* A group of one needs no MPI: its collectives are the identity. */
static int alone(const Comm *c, LayoutGroup g) { return !c->mpi || c->size[g] == 1; }

/* An in-place all-reduce of host memory (the caller drained g where it is not g's thread). */
static int allreduce_host(const Comm *c, LayoutGroup g, void *buf, int64_t n, MPI_Datatype type, MPI_Op op,
                          Error *err)
{
    if (alone(c, g) || n == 0)
        return 0;
    if (count_ok(n, "allreduce", err) != 0)
        return -1;
    double t0 = clock_seconds();
    RUN(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, type, op, group_comm(c, g), &r_), "MPI_Iallreduce");
    comm_link_hold_ring(c, g, t0, 2.0 * (double)n * (type == MPI_DOUBLE ? sizeof(double) : sizeof(float)));
    return 0;
}

static int mpi_allreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err)
{
    if (alone(c, g) || n == 0 || !c->stage)
        return allreduce_host(c, g, buf, n, MPI_FLOAT, MPI_SUM, err);
    if (stage_room(c, n, err) != 0)
        return -1;
    to_host(c, c->host, buf, n);
    if (allreduce_host(c, g, c->host, n, MPI_FLOAT, MPI_SUM, err) != 0)
        return -1;
    to_device(c, buf, c->host, n);
    return 0;
}

int comm_allreduce_sum_host(const Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    comm_log_op(c, g, "allreduce_host", n);
    comm_async_drain(c, g);
    CommSpan sp = {0, 0};
    if (!alone(c, g))
        comm_trace_begin(c, &sp);
    int rc = comm_flight_end(allreduce_host(c, g, buf, n, MPI_FLOAT, MPI_SUM, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLREDUCE, g, n * 4, -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_allreduce_sum_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    comm_log_op(c, g, "allreduce_f64", n);
    comm_async_drain(c, g);
    CommSpan sp = {0, 0};
    if (!alone(c, g))
        comm_trace_begin(c, &sp);
    int rc = comm_flight_end(allreduce_host(c, g, buf, n, MPI_DOUBLE, MPI_SUM, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLREDUCE, g, n * 8, -1, 0, 0);
    return comm_block_end(t0, rc);
}

int comm_allreduce_max_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    comm_log_op(c, g, "allreduce_max_f64", n);
    comm_async_drain(c, g);
    CommSpan sp = {0, 0};
    if (!alone(c, g))
        comm_trace_begin(c, &sp);
    int rc = comm_flight_end(allreduce_host(c, g, buf, n, MPI_DOUBLE, MPI_MAX, err));
    comm_trace_end(c, &sp, COMM_TRACE_ALLREDUCE, g, n * 8, -1, 0, 0);
    return comm_block_end(t0, rc);
}

/* int counts and displacements for the v-collectives. */
static int displs(const Comm *c, LayoutGroup g, const int64_t *counts, int *cnt, int *dsp, Error *err)
{
    int64_t at = 0;
    for (int i = 0; i < c->size[g]; i++) {
        if (count_ok(counts[i], "collective", err) != 0 || count_ok(at, "collective", err) != 0)
            return -1;
        cnt[i] = (int)counts[i];
        dsp[i] = (int)at;
        at += counts[i];
    }
    return 0;
}

/* An element of dt as MPI sees it: the all-gathers copy bytes, so a 2-byte compute dtype travels
 * as 16-bit integers. */
static MPI_Datatype elem_type(size_t bytes) { return bytes == 2 ? MPI_UINT16_T : MPI_FLOAT; }

/* Host staging room for `bytes` in c->host (and c->host2). */
static int stage_bytes(Comm *c, int64_t bytes, Error *err)
{
    return stage_room(c, (bytes + (int64_t)sizeof(float) - 1) / (int64_t)sizeof(float), err);
}

static int mpi_allgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt,
                          Error *err)
{
    size_t e = comm_elem_bytes(c, dt);
    if (alone(c, g)) {
        if (send && counts[0] && recv != send)
            c->ops ? ops_cast(c->ops, recv, dt, send, dt, counts[0]) : (void)memmove(recv, send, (size_t)counts[0] * e);
        return 0;
    }
    int cnt[4096], dsp[4096];
    if (c->size[g] > 4096 || displs(c, g, counts, cnt, dsp, err) != 0)
        return -1;
    if (c->stage) {
        /* Everything through the host: this rank's part in place, then the whole result back. */
        int64_t n = total(counts, c->size[g]), mine = dsp[c->rank[g]];
        if (stage_bytes(c, n * (int64_t)e, err) != 0)
            return -1;
        char *host = (char *)c->host;
        size_t part = (size_t)counts[c->rank[g]] * e;
        if (part)
            c->ops->to_host(host + (size_t)mine * e, send ? send : (const char *)recv + (size_t)mine * e, part);
        double t0 = clock_seconds();
        RUN(MPI_Iallgatherv(MPI_IN_PLACE, 0, elem_type(e), host, cnt, dsp, elem_type(e), group_comm(c, g), &r_),
            "MPI_Iallgatherv");
        comm_link_hold_ring(c, g, t0, (double)n * (double)e);
        if (n)
            c->ops->to_device(recv, host, (size_t)n * e);
        return 0;
    }
    const void *from = send ? send : MPI_IN_PLACE;
    double t0 = clock_seconds();
    RUN(MPI_Iallgatherv(from, cnt[c->rank[g]], elem_type(e), recv, cnt, dsp, elem_type(e), group_comm(c, g), &r_),
        "MPI_Iallgatherv");
    comm_link_hold_ring(c, g, t0, (double)total(counts, c->size[g]) * (double)e);
    return 0;
}

static int allgather_f64(const Comm *c, LayoutGroup g, const double *send, double *recv, int64_t n, Error *err)
{
    if (alone(c, g)) {
        if (n && recv != send)
            memmove(recv, send, (size_t)n * sizeof *recv);
        return 0;
    }
    if (count_ok(n, "allgather", err) != 0 || count_ok(n * c->size[g], "allgather", err) != 0)
        return -1;
    comm_async_drain(c, g);
    double t0 = clock_seconds();
    CHECK(MPI_Allgather(send, (int)n, MPI_DOUBLE, recv, (int)n, MPI_DOUBLE, group_comm(c, g)), "MPI_Allgather");
    comm_link_hold_ring(c, g, t0, (double)n * c->size[g] * sizeof(double));
    return 0;
}

int comm_allgather_f64(const Comm *c, LayoutGroup g, const double *send, double *recv, int64_t n, Error *err)
{
    double t0 = comm_block_begin();
    CommSpan sp = {0, 0};
    if (!alone(c, g))
        comm_trace_begin(c, &sp);
    int rc = allgather_f64(c, g, send, recv, n, err);
    comm_trace_end(c, &sp, COMM_TRACE_ALLGATHER, g, n * c->size[g] * 8, -1, 0, 0);
    return comm_block_end(t0, rc);
}

static int mpi_reduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                               Error *err)
{
    if (alone(c, g)) {
        if (counts[0] && recv != send)
            c->ops ? c->ops->copy(recv, send, counts[0]) : (void)memmove(recv, send, (size_t)counts[0] * sizeof *recv);
        return 0;
    }
    int cnt[4096], dsp[4096];
    if (c->size[g] > 4096 || displs(c, g, counts, cnt, dsp, err) != 0)
        return -1;
    if (c->stage) {
        int64_t n = total(counts, c->size[g]), mine = counts[c->rank[g]];
        if (stage_room(c, n, err) != 0)
            return -1;
        to_host(c, c->host, send, n);
        double t0 = clock_seconds();
        RUN(MPI_Ireduce_scatter(c->host, c->host2, cnt, MPI_FLOAT, MPI_SUM, group_comm(c, g), &r_), "MPI_Ireduce_scatter");
        comm_link_hold_ring(c, g, t0, (double)n * sizeof(float));
        to_device(c, recv, c->host2, mine);
        return 0;
    }
    double t0 = clock_seconds();
    RUN(MPI_Ireduce_scatter(send, recv, cnt, MPI_FLOAT, MPI_SUM, group_comm(c, g), &r_), "MPI_Ireduce_scatter");
    comm_link_hold_ring(c, g, t0, (double)total(counts, c->size[g]) * sizeof(float));
    return 0;
}

static int mpi_allgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, Error *err)
{
    size_t e = comm_elem_bytes(c, dt);
    int me = c->rank[g];
    if (alone(c, g)) {
        if (send && n && recv != send)
            c->ops ? ops_cast(c->ops, recv, dt, send, dt, n) : (void)memmove(recv, send, (size_t)n * e);
        return 0;
    }
    if (count_ok(n, "allgather", err) != 0 || count_ok(n * c->size[g], "allgather", err) != 0)
        return -1;
    size_t part = (size_t)n * e;
    if (c->stage) {
        /* This rank's part in place in the host buffer, then the whole result back. */
        if (stage_bytes(c, (int64_t)part * c->size[g], err) != 0)
            return -1;
        char *host = (char *)c->host;
        if (part)
            c->ops->to_host(host + part * (size_t)me, send ? send : (const char *)recv + part * (size_t)me, part);
        double t0 = clock_seconds();
        RUN(MPI_Iallgather(MPI_IN_PLACE, 0, elem_type(e), host, (int)n, elem_type(e), group_comm(c, g), &r_),
            "MPI_Iallgather");
        comm_link_hold_ring(c, g, t0, (double)part * c->size[g]);
        if (part)
            c->ops->to_device(recv, host, part * (size_t)c->size[g]);
        return 0;
    }
    const void *from = send ? send : MPI_IN_PLACE;
    double t0 = clock_seconds();
    RUN(MPI_Iallgather(from, (int)n, elem_type(e), recv, (int)n, elem_type(e), group_comm(c, g), &r_), "MPI_Iallgather");
    comm_link_hold_ring(c, g, t0, (double)part * c->size[g]);
    return 0;
}

static int mpi_reduce_scatter(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Error *err)
{
    if (alone(c, g)) {
        if (n && recv != send)
            c->ops ? c->ops->copy(recv, send, n) : (void)memmove(recv, send, (size_t)n * sizeof *recv);
        return 0;
    }
    if (count_ok(n, "reduce_scatter", err) != 0 || count_ok(n * c->size[g], "reduce_scatter", err) != 0)
        return -1;
    if (c->stage) {
        if (stage_room(c, n * c->size[g], err) != 0)
            return -1;
        to_host(c, c->host, send, n * c->size[g]);
        double t0 = clock_seconds();
        RUN(MPI_Ireduce_scatter_block(c->host, c->host2, (int)n, MPI_FLOAT, MPI_SUM, group_comm(c, g), &r_),
            "MPI_Ireduce_scatter_block");
        comm_link_hold_ring(c, g, t0, (double)n * c->size[g] * sizeof(float));
        to_device(c, recv, c->host2, n);
        return 0;
    }
    double t0 = clock_seconds();
    RUN(MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, group_comm(c, g), &r_),
        "MPI_Ireduce_scatter_block");
    comm_link_hold_ring(c, g, t0, (double)n * c->size[g] * sizeof(float));
    return 0;
}

int comm_broadcast(const Comm *c, LayoutGroup g, int root, void *buf, int64_t bytes, Error *err)
{
    if (alone(c, g) || bytes == 0)
        return 0;
    if (count_ok(bytes, "broadcast", err) != 0)
        return -1;
    comm_async_drain(c, g);
    CHECK(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, group_comm(c, g)), "MPI_Bcast");
    return 0;
}

_Static_assert(sizeof(MPI_Request) <= sizeof(((CommRequest *)0)->handle), "CommRequest holds an MPI_Request");

/* A send or receive of n floats is under way as r: comm_wait finishes it (and holds it to the link
 * model's time from now). */
static void request_started(CommRequest *req, MPI_Request r, int64_t n)
{
    memcpy(req->handle, &r, sizeof r);
    req->active = 1;
    req->link_bytes = (double)n * sizeof(float);
    req->t0 = clock_seconds();
}

static int mpi_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
                     CommRequest *req, Error *err)
{
    if (c->strict_s)
        return comm_strict_isend(c, g, peer, lane, tag, buf, n, req, err);
    (void)lane; /* MPI matches by tag */
    if (count_ok(n, "send", err) != 0)
        return -1;
    if (tag < 0 || tag > c->tag_limit)
        return error_runtime(err, "mpi", "message tag %d above MPI's limit %d (fewer micro-batches?)", tag,
                             c->tag_limit);
    req->staged = NULL;
    req->event = NULL;
    req->dest = NULL;
    /* Staged: the host copy lives until comm_wait. */
    if (c->stage) {
        if (!(req->staged = malloc((size_t)(n ? n : 1) * sizeof *req->staged)))
            return error_runtime(err, "comm", "out of memory for a staged send of %lld floats", (long long)n);
        to_host(c, req->staged, buf, n);
        buf = req->staged;
    }
    MPI_Request r;
    int rc = MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, group_comm(c, g), &r);
    if (rc != MPI_SUCCESS) {
        free(req->staged);
        req->staged = NULL;
        return mpi_error(rc, "MPI_Isend", err);
    }
    request_started(req, r, n);
    return 0;
}

static int mpi_wait(const Comm *c, CommRequest *req, Error *err)
{
    if (c->strict_s)
        return comm_strict_wait(c, req, err);
    MPI_Request r;
    memcpy(&r, req->handle, sizeof r);
    req->active = 0;
    int rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && req->dest) /* a staged receive: to the backend's memory */
        to_device(c, req->dest, req->staged, req->n);
    free(req->staged);
    req->staged = NULL;
    req->dest = NULL;
    CHECK(rc, "MPI_Wait");
    comm_link_hold(c, req->t0, req->link_bytes);
    return 0;
}

static int mpi_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n,
                     CommRequest *req, Error *err)
{
    if (c->strict_s)
        return comm_strict_irecv(c, g, peer, lane, tag, buf, n, req, err);
    (void)lane;
    if (count_ok(n, "recv", err) != 0)
        return -1;
    req->staged = NULL;
    req->event = NULL;
    req->dest = NULL;
    if (c->stage) { /* into a host buffer of its own, copied out by the wait */
        if (!(req->staged = malloc((size_t)(n ? n : 1) * sizeof *req->staged)))
            return error_runtime(err, "comm", "out of memory for a staged receive of %lld floats", (long long)n);
        req->dest = buf;
        req->n = n;
        buf = req->staged;
    }
    MPI_Request r;
    int rc = MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, group_comm(c, g), &r);
    if (rc != MPI_SUCCESS) {
        free(req->staged);
        req->staged = NULL;
        req->dest = NULL;
        return mpi_error(rc, "MPI_Irecv", err);
    }
    request_started(req, r, n);
    return 0;
}

static int mpi_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err)
{
    if (c->strict_s)
        return comm_strict_recv(c, g, peer, lane, tag, buf, n, err);
    (void)lane;
    if (count_ok(n, "recv", err) != 0 || (c->stage && stage_room(c, n, err) != 0))
        return -1;
    double t0 = clock_seconds();
    CHECK(MPI_Recv(c->stage ? c->host : buf, (int)n, MPI_FLOAT, peer, tag, group_comm(c, g), MPI_STATUS_IGNORE),
          "MPI_Recv");
    comm_link_hold(c, t0, (double)n * sizeof(float));
    if (c->stage)
        to_device(c, buf, c->host, n);
    return 0;
}

/* MPI_Sendrecv: the send and the receive progress together, whichever side comes first. Tag 0: the
 * callers exchange outside the pipeline's schedule, with no pipeline message in flight. */
static int mpi_exchange(Comm *c, LayoutGroup g, int peer, const float *send, float *recv, int64_t n, Error *err)
{
    if (count_ok(n, "exchange", err) != 0 || (c->stage && stage_room(c, n, err) != 0))
        return -1;
    if (c->stage)
        to_host(c, c->host, send, n);
    double t0 = clock_seconds();
    CHECK(MPI_Sendrecv(c->stage ? c->host : send, (int)n, MPI_FLOAT, peer, 0, c->stage ? c->host2 : recv, (int)n,
                       MPI_FLOAT, peer, 0, group_comm(c, g), MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
    comm_link_hold(c, t0, (double)n * sizeof(float));
    if (c->stage)
        to_device(c, recv, c->host2, n);
    return 0;
}

int comm_barrier(const Comm *c, Error *err)
{
    if (!c->mpi)
        return 0;
    comm_async_drain(c, GROUP_WORLD);
    CHECK(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    return 0;
}

const CommImpl comm_mpi = {
    .name = "mpi",
    .allreduce_sum = mpi_allreduce_sum,
    .allgatherv = mpi_allgatherv,
    .reduce_scatterv = mpi_reduce_scatterv,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .isend = mpi_isend,
    .wait = mpi_wait,
    .recv = mpi_recv,
    .exchange = mpi_exchange,
    .sum_bf16 = comm_mpi_sum_bf16,
    .irecv = mpi_irecv,
};

/* Pings: rank r sends its clock (t1) to rank 0, which answers with its own (t0); back at r at t2.
 * Rank 0's clock read t0 at about (t1 + t2) / 2 of r's: offset = t0 - (t1 + t2) / 2, from the round
 * trip of least time (the one least delayed by anything else). Ranks one at a time, so that rank
 * 0 answers at once. */
static double realtime_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int comm_clock_offset(const Comm *c, int rounds, double *offset_s, double *rtt_s, Error *err)
{
    *offset_s = 0;
    *rtt_s = 0;
    if (!c->mpi || c->size[GROUP_WORLD] == 1)
        return 0;
    MPI_Comm w = group_comm(c, GROUP_WORLD);
    int me = c->rank[GROUP_WORLD], n = c->size[GROUP_WORLD];
    enum { TAG = 0x7e11 };
    comm_async_drain(c, GROUP_WORLD);
    for (int r = 1; r < n; r++) {
        if (me != 0 && me != r)
            continue;
        double best = -1;
        for (int k = 0; k < rounds; k++) {
            double msg;
            int rc;
            if (me == 0) {
                rc = MPI_Recv(&msg, 1, MPI_DOUBLE, r, TAG, w, MPI_STATUS_IGNORE);
                msg = realtime_s();
                if (rc == MPI_SUCCESS)
                    rc = MPI_Send(&msg, 1, MPI_DOUBLE, r, TAG, w);
            } else {
                double t1 = realtime_s();
                rc = MPI_Send(&t1, 1, MPI_DOUBLE, 0, TAG, w);
                if (rc == MPI_SUCCESS)
                    rc = MPI_Recv(&msg, 1, MPI_DOUBLE, 0, TAG, w, MPI_STATUS_IGNORE);
                double t2 = realtime_s();
                if (rc == MPI_SUCCESS && (best < 0 || t2 - t1 < best)) {
                    best = t2 - t1;
                    *offset_s = msg - 0.5 * (t1 + t2);
                    *rtt_s = best;
                }
            }
            if (rc != MPI_SUCCESS)
                return error_runtime(err, "trace", "the clock pings with rank 0 failed (MPI error %d)", rc);
        }
    }
    return 0;
}
