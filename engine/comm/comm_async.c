/*
 * engine/comm/comm_async.c - started collectives on MPI's path: one communication thread per group,
 * which runs the group's started collectives in the order they were issued (a FIFO, like a CUDA
 * stream), and the environment's test hooks (comm.h: WLB_COMM_LINK, WLB_COMM_CHAOS, WLB_COMM_LOG).
 *
 * Why threads: Open MPI makes no progress on a non-blocking collective outside MPI calls, so an
 * MPI_Iallreduce started before a product would run only when the product is over. A thread blocked
 * polling the collective makes the progress itself (with short sleeps between polls: on an
 * oversubscribed machine a thread spinning in MPI_Wait takes the cores the products need). One thread per group keeps each communicator's collectives in one order on every
 * rank (the order they were issued), and lets a TP collective run while a DP reduction is still in
 * flight; several threads calling MPI at once needs MPI_THREAD_MULTIPLE. The main thread calls MPI
 * too (messages, host collectives, blocking float collectives): on a group with started collectives
 * it first waits until they have run (comm_async_drain), so a communicator never has two callers.
 *
 * Synchronization: one mutex for the whole state; a condition variable per thread (work queued) and
 * one for records done. A request's record (AsyncOp) belongs to the issuing thread until it is
 * queued, to whoever runs it while it runs, and back to the issuer once done is set (under the
 * mutex), until comm_async_wait frees it. A group's records run one at a time in issue order: on
 * its thread, or on the waiting caller when the record waited for is next and the thread idle (a
 * wait that would only hand it over and sleep runs it instead).
 *
 * WLB_COMM_CHAOS: the start copies what the collective reads in place (an in-place all-reduce's
 * buffer, an all-gather's own part) and fills the whole receive buffer with 0xff bytes (NaN in
 * float32 and bf16); the thread sleeps a random time, then reads the send buffer (so one written
 * after the start changes the result) and writes into a buffer of its own, which comm_async_wait
 * copies into the receive buffer. Host memory only (the path runs threads with host memory only).
 */
#include "engine/comm/comm_async.h"
#include "engine/comm/comm_trace.h"
#include "engine/comm/comm_watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/parse.h"

typedef struct AsyncOp {
    CommOp op;
    CommRunOp run;         /* how it runs (comm.c's comm_istart gives it) */
    int64_t *counts;       /* the copy of op.counts (v forms) */
    int done, rc;
    Error err;
    void *result;          /* chaos: the thread writes here, the wait copies it to op.recv */
    void *input;           /* chaos: what the collective reads in place, copied at the start */
    size_t recv_bytes, input_bytes, input_at; /* input goes to recv + input_at for the in-place forms */
    int traced;            /* started in a traced step (comm_trace.h): when, and when it ran */
    double started_s, run0_s, run1_s;
    struct AsyncOp *next;
} AsyncOp;

typedef struct Worker {
    pthread_t thread;
    int running;
    AsyncOp *head, *tail;  /* queued, not yet running */
    int busy;              /* the thread is running one (taken off the queue) */
    pthread_cond_t work;   /* signalled when one is queued, or at the stop */
    int64_t issued, finished;
    unsigned seed;         /* chaos delays */
    Comm *c;
} Worker;

struct CommAsync {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a record is done */
    int stop;
    int64_t outstanding;
    Worker w[GROUP_COUNT];
};

static int env_error(Error *err, const char *name, const char *value, const char *want)
{
    return error_set(err, name, "\"%s\": expected %s", value, want);
}

int comm_async_init(Comm *c, Error *err)
{
    CommAsync *a = calloc(1, sizeof *a);
    if (!a)
        return error_runtime(err, "comm", "out of memory");
    /* c->async only once whole: comm_async_free destroys its mutex and condition variable. */
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        free(a);
        return error_runtime(err, "comm", "cannot make a mutex");
    }
    if (pthread_cond_init(&a->cv, NULL) != 0) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return error_runtime(err, "comm", "cannot make a condition variable");
    }
    c->async = a;
    c->overlap = 1;
    const char *link = getenv("WLB_COMM_LINK");
    if (link && *link) {
        const char *comma = strchr(link, ',');
        char lat[64];
        double us, gbps;
        if (!comma || (size_t)(comma - link) >= sizeof lat)
            return env_error(err, "WLB_COMM_LINK", link, "LATENCY_US,GBPS");
        memcpy(lat, link, (size_t)(comma - link));
        lat[comma - link] = 0;
        if (parse_double(lat, &us) != 0 || parse_double(comma + 1, &gbps) != 0 || !(us >= 0) || !(gbps > 0) ||
            us > 1e9 || gbps > 1e9)
            return env_error(err, "WLB_COMM_LINK", link, "LATENCY_US,GBPS (latency >= 0, bandwidth > 0)");
        c->link_latency_s = us * 1e-6;
        c->link_bytes_per_s = gbps * 1e9;
    }
    const char *chaos = getenv("WLB_COMM_CHAOS");
    if (chaos && *chaos) {
        int64_t us;
        if (parse_int64(chaos, &us) != 0 || us < 1 || us > 10000000)
            return env_error(err, "WLB_COMM_CHAOS", chaos, "the longest delay in microseconds, 1 .. 10000000");
        c->chaos_us = (int)us;
    }
    const char *strict = getenv("WLB_COMM_STRICT");
    if (strict && *strict) {
        int64_t sec;
        if (parse_int64(strict, &sec) != 0 || sec < 1 || sec > 86400)
            return env_error(err, "WLB_COMM_STRICT", strict, "the seconds a message may wait for its peer, 1 .. 86400");
        c->strict_s = (double)sec;
    }
    return 0;
}

int comm_async_open_log(Comm *c, Error *err)
{
    const char *dir = getenv("WLB_COMM_LOG");
    if (!dir || !*dir || c->log)
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.log", dir, c->rank[GROUP_WORLD]);
    if (!(c->log = fopen(path, "w")))
        return error_errno(err, path, "cannot write the communication log");
    return 0;
}

void comm_log_op(const Comm *c, LayoutGroup g, const char *op, int64_t n)
{
    /* the watchdog's flight recorder (comm_watchdog.h) */
    comm_flight_begin(g, c->group_id[g], c->mpi ? c->size[g] : 1, op, n, -1);
    if (c->log && c->size[g] > 1)
        fprintf((FILE *)c->log, "%d-%d %s %lld\n", (int)g, c->group_id[g], op, (long long)n);
}

static void sleep_until(double t)
{
    double now = clock_seconds();
    if (t <= now)
        return;
    double d = t - now;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void comm_link_hold(const Comm *c, double t0, double wire_bytes)
{
    if (c->link_bytes_per_s > 0)
        sleep_until(t0 + c->link_latency_s + wire_bytes / c->link_bytes_per_s);
}

void comm_link_hold_ring(const Comm *c, LayoutGroup g, double t0, double bytes)
{
    comm_link_hold(c, t0, bytes * (double)(c->size[g] - 1) / (double)c->size[g]);
}

void comm_async_count(const Comm *c, int delta)
{
    CommAsync *a = c->async;
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->outstanding += delta;
    pthread_mutex_unlock(&a->mu);
}

int64_t comm_async_outstanding(const Comm *c)
{
    CommAsync *a = c->async;
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mu);
    int64_t n = a->outstanding;
    pthread_mutex_unlock(&a->mu);
    return n;
}

/* The chaos form of the collective: in-place input from the start's copy, output into x->result. */
static int run_chaos(Comm *c, AsyncOp *x, Error *err)
{
    CommOp op = x->op;
    switch (op.kind) {
    case COMM_OP_ALLREDUCE_SUM:
        memcpy(x->result, x->input, x->recv_bytes);
        break;
    case COMM_OP_ALLGATHERV:
    case COMM_OP_ALLGATHER:
        if (!op.send)
            op.send = x->input;
        break;
    default:
        break;
    }
    op.recv = x->result;
    return x->run(c, &op, err);
}

/* Runs record x of worker w (its thread, or a caller that took it off the queue: comm_async_wait),
 * without the mutex; w->busy is set, so nothing else on w's group runs meanwhile. */
static int run_record(Worker *w, AsyncOp *x, Error *err)
{
    if (w->c->chaos_us) {
        double d = (double)(rand_r(&w->seed) % (unsigned)w->c->chaos_us) * 1e-6;
        sleep_until(clock_seconds() + d);
    }
    if (!x->traced)
        return x->result ? run_chaos(w->c, x, err) : x->run(w->c, &x->op, err);
    x->run0_s = clock_seconds();
    comm_tracer_account(w->c->tracer, 0, 1, x->run0_s);
    int rc = x->result ? run_chaos(w->c, x, err) : x->run(w->c, &x->op, err);
    x->run1_s = clock_seconds();
    comm_tracer_account(w->c->tracer, 0, -1, x->run1_s);
    return rc;
}

/* The head of w's queue, taken to run (under the mutex). */
static AsyncOp *take_head(Worker *w)
{
    AsyncOp *x = w->head;
    w->head = x->next;
    if (!w->head)
        w->tail = NULL;
    w->busy = 1;
    return x;
}

/* x has run with rc (under the mutex): its waiter, the group's drains and its thread may go on. */
static void record_done(CommAsync *a, Worker *w, AsyncOp *x, int rc, const Error *e)
{
    x->rc = rc;
    x->err = *e;
    x->done = 1;
    comm_flight_progress();
    w->busy = 0;
    w->finished++;
    pthread_cond_broadcast(&a->cv);
    if (w->head)
        pthread_cond_signal(&w->work);
}

/* The communication thread asks the kernel for short time slices (the fair class's custom slice of
 * Linux 6.12 and later: sched_setattr's sched_runtime, which needs no privilege). Woken when its
 * collective can move on - its peers have joined, its poll's nap is over - it then runs at once,
 * instead of after a slice of the products that fill the cores (on a machine with more ranks than
 * cores, milliseconds a collective, which the step waits for at its last buckets). Its nice value
 * is kept. An older kernel ignores the field or refuses the call; either way the thread runs with
 * the default slices, as it did before. */
static void ask_short_slices(void)
{
#ifdef SYS_sched_setattr
    struct { /* the kernel's struct sched_attr, its first version (48 bytes) */
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.policy = SCHED_OTHER;
    errno = 0;
    attr.nice = getpriority(PRIO_PROCESS, 0); /* this thread's (Linux keeps one per thread) */
    if (errno != 0)
        return;
    attr.runtime = 100000; /* ns: 0.1 ms, the least the kernel takes */
    if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0)
        return; /* no custom slices here: the default ones */
#endif
}

/* Set on the communication threads: MPI's path finishes their collectives by polling (comm_mpi.c). */
static _Thread_local int on_thread;

int comm_async_polling(void) { return on_thread; }

static void *worker_main(void *arg)
{
    Worker *w = arg;
    CommAsync *a = w->c->async;
    on_thread = 1;
    ask_short_slices();
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while ((!w->head || w->busy) && !a->stop)
            pthread_cond_wait(&w->work, &a->mu);
        if (!w->head)
            break;
        AsyncOp *x = take_head(w);
        pthread_mutex_unlock(&a->mu);
        Error e = {0};
        int rc = run_record(w, x, &e);
        pthread_mutex_lock(&a->mu);
        record_done(a, w, x, rc, &e);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* Bytes of op's receive buffer, and where the in-place input is (chaos). */
static void chaos_sizes(const Comm *c, AsyncOp *x)
{
    const CommOp *op = &x->op;
    int size = c->size[op->group], me = c->rank[op->group];
    size_t e = op->kind == COMM_OP_ALLGATHER || op->kind == COMM_OP_ALLGATHERV ? comm_elem_bytes(c, op->dt)
                                                                                : sizeof(float);
    int64_t before = 0, total = 0;
    for (int r = 0; x->counts && r < size; r++) {
        before += r < me ? x->counts[r] : 0;
        total += x->counts[r];
    }
    x->input_at = 0;
    x->input_bytes = 0;
    switch (op->kind) {
    case COMM_OP_ALLREDUCE_SUM:
        x->recv_bytes = x->input_bytes = (size_t)op->n * e;
        break;
    case COMM_OP_ALLGATHERV:
        x->recv_bytes = (size_t)total * e;
        x->input_at = (size_t)before * e;
        x->input_bytes = op->send ? 0 : (size_t)x->counts[me] * e;
        break;
    case COMM_OP_ALLGATHER:
        x->recv_bytes = (size_t)op->n * (size_t)size * e;
        x->input_at = (size_t)op->n * (size_t)me * e;
        x->input_bytes = op->send ? 0 : (size_t)op->n * e;
        break;
    case COMM_OP_REDUCE_SCATTERV:
        x->recv_bytes = (size_t)x->counts[me] * e;
        break;
    case COMM_OP_REDUCE_SCATTER:
        x->recv_bytes = (size_t)op->n * e;
        break;
    }
}

static void free_op(AsyncOp *x)
{
    free(x->counts);
    free(x->result);
    free(x->input);
    free(x);
}

static int chaos_prepare(const Comm *c, AsyncOp *x, Error *err)
{
    chaos_sizes(c, x);
    if (!(x->result = malloc(x->recv_bytes ? x->recv_bytes : 1)) ||
        !(x->input = malloc(x->input_bytes ? x->input_bytes : 1)))
        return error_runtime(err, "comm", "out of memory for a collective of %zu bytes", x->recv_bytes);
    char *recv = x->op.recv;
    if (x->input_bytes)
        memcpy(x->input, recv + x->input_at, x->input_bytes);
    if (x->recv_bytes)
        memset(recv, 0xff, x->recv_bytes);
    return 0;
}

int comm_async_start(Comm *c, const CommOp *op, CommRunOp run, CommRequest *req, Error *err)
{
    CommAsync *a = c->async;
    Worker *w = &a->w[op->group];
    AsyncOp *x = calloc(1, sizeof *x);
    if (!x)
        return error_runtime(err, "comm", "out of memory");
    x->op = *op;
    x->run = run;
    int size = c->size[op->group];
    if (op->counts) {
        if (!(x->counts = malloc((size_t)size * sizeof *x->counts))) {
            free(x);
            return error_runtime(err, "comm", "out of memory");
        }
        memcpy(x->counts, op->counts, (size_t)size * sizeof *x->counts);
        x->op.counts = x->counts;
    }
    if (c->chaos_us && chaos_prepare(c, x, err) != 0) {
        free_op(x);
        return -1;
    }
    if (comm_tracer_on(c->tracer)) {
        x->traced = 1;
        x->started_s = clock_seconds();
    }
    pthread_mutex_lock(&a->mu);
    if (!w->running) {
        w->c = c;
        w->seed = (unsigned)(c->rank[GROUP_WORLD] * 7919 + (int)op->group * 104729 + 1);
        if (pthread_cond_init(&w->work, NULL) != 0) {
            pthread_mutex_unlock(&a->mu);
            free_op(x);
            return error_runtime(err, "comm", "cannot make a condition variable");
        }
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pthread_cond_destroy(&w->work);
            pthread_mutex_unlock(&a->mu);
            free_op(x);
            return error_runtime(err, "comm", "cannot start a communication thread");
        }
        w->running = 1;
    }
    if (w->tail)
        w->tail->next = x;
    else
        w->head = x;
    w->tail = x;
    w->issued++;
    a->outstanding++;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&a->mu);
    req->active = 1;
    req->collective = 1;
    req->op = x;
    return 0;
}

int comm_async_wait(const Comm *c, CommRequest *req, Error *err)
{
    CommAsync *a = c->async;
    AsyncOp *x = req->op;
    Worker *w = &a->w[x->op.group];
    double waited = x->traced ? clock_seconds() : 0;
    pthread_mutex_lock(&a->mu);
    /* Not begun and next in its group's order: the caller runs it itself rather than wake the
     * thread and sleep until it is done (two hand-overs that cost more than a small collective on a
     * machine whose cores the products fill). */
    if (!x->done && w->head == x && !w->busy) {
        take_head(w);
        pthread_mutex_unlock(&a->mu);
        Error e = {0};
        int rc = run_record(w, x, &e);
        pthread_mutex_lock(&a->mu);
        record_done(a, w, x, rc, &e);
    }
    while (!x->done)
        pthread_cond_wait(&a->cv, &a->mu);
    a->outstanding--;
    pthread_mutex_unlock(&a->mu);
    req->active = 0;
    req->collective = 0;
    req->op = NULL;
    if (x->traced) { /* its span where it ran; this thread's wait, when it waited, on the host */
        comm_trace_record(c->tracer, comm_trace_op_of(x->op.kind), x->op.group, comm_op_bytes(c, &x->op), -1,
                          x->started_s, waited, x->run0_s, x->run1_s);
        if (x->run1_s > waited)
            comm_trace_host_wait(c, waited);
    }
    int rc = x->rc;
    if (rc != 0)
        *err = x->err;
    else if (x->result && x->recv_bytes)
        memcpy(x->op.recv, x->result, x->recv_bytes);
    free_op(x);
    return rc;
}

void comm_async_drain(const Comm *c, LayoutGroup g)
{
    CommAsync *a = c->async;
    if (!a || !a->w[g].running)
        return;
    pthread_mutex_lock(&a->mu);
    while (a->w[g].finished < a->w[g].issued)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

void comm_async_free(Comm *c)
{
    CommAsync *a = c->async;
    if (c->log)
        fclose((FILE *)c->log);
    c->log = NULL;
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    for (int g = 0; g < GROUP_COUNT; g++)
        if (a->w[g].running)
            pthread_cond_signal(&a->w[g].work);
    pthread_mutex_unlock(&a->mu);
    for (int g = 0; g < GROUP_COUNT; g++)
        if (a->w[g].running) {
            pthread_join(a->w[g].thread, NULL);
            pthread_cond_destroy(&a->w[g].work);
        }
    /* A thread leaves only with its queue empty (worker_main), so every record has run; one never
     * waited for (an error path) belongs to its request (comm_async_wait frees it), not to this state. */
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
    c->async = NULL;
}
