/* engine/comm/comm_watchdog.c - the flight recorder and the collective watchdog (see comm_watchdog.h). */
#include "engine/comm/comm_watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/flight.h"

/* One collective or message. */
typedef struct Flight {
    int64_t seq, gseq;   /* this rank's count of them, and of its group's */
    int group, group_id; /* the layout group and its id (its lowest world rank) */
    const char *op;      /* a literal */
    int64_t n;
    int peer;            /* a message's peer (group rank), -1 for a collective */
    double t0, t1;       /* started, finished (0 while in flight) */
    pthread_t thread;    /* who began it */
    const void *req;     /* the request it finishes at (comm_flight_bind), NULL for a blocking call */
} Flight;

/* The recorder, one per process. */
static struct {
    pthread_mutex_t mu;
    Flight ring[COMM_FLIGHT_RING];
    int64_t seq;                      /* entries begun */
    int64_t gseq[GROUP_COUNT];        /* per group */
    int in_flight;
    double last_event;                /* the last start or finish (clock_seconds) */
    int on;                           /* recording (comm_watchdog_start) */
    /* The watchdog. */
    pthread_t thread;
    int running, quit;
    double timeout;
    char dir[4096];
    const volatile sig_atomic_t *stop;
    int rank, world;
    int group_id[GROUP_COUNT], group_size[GROUP_COUNT];
    const Comm *comm;                 /* its data path's asynchronous errors and abort (NCCL's) */
    double stood_still;               /* the longest this process stood still past timeout (0: never) */
    int64_t ckpt_saving, ckpt_done;   /* the step of a save under way, of the newest complete one (0: none) */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const group_names[] = {"tp", "cp", "pp", "dp", "dpcp", "world"};

static const char *group_name(int g) { return g < GROUP_CP_BLOCK ? group_names[g] : "cp_block"; }

void comm_flight_begin(const Comm *c, LayoutGroup g, const char *op, int64_t n, int peer)
{
    if (!rec.on || !c->mpi || c->size[g] <= 1)
        return;
    pthread_mutex_lock(&rec.mu);
    Flight *f = &rec.ring[rec.seq % COMM_FLIGHT_RING];
    if (rec.seq >= COMM_FLIGHT_RING && f->t1 == 0)
        rec.in_flight--; /* still in flight 512 entries later: overwritten, no longer counted */
    *f = (Flight){rec.seq + 1, ++rec.gseq[g], (int)g, c->group_id[g], op, n, peer, clock_seconds(), 0,
                  pthread_self(), NULL};
    rec.seq++;
    rec.in_flight++;
    rec.last_event = f->t0;
    pthread_mutex_unlock(&rec.mu);
}

/* The entries of this ring still in flight, newest first, that match (thread and unbound, or req). */
static void end_matching(int by_req, const void *req)
{
    pthread_mutex_lock(&rec.mu);
    pthread_t self = pthread_self();
    double now = clock_seconds();
    int64_t first = rec.seq > COMM_FLIGHT_RING ? rec.seq - COMM_FLIGHT_RING : 0;
    for (int64_t s = rec.seq - 1; s >= first; s--) {
        Flight *f = &rec.ring[s % COMM_FLIGHT_RING];
        if (f->t1 > 0)
            continue;
        if (by_req ? f->req == req : (!f->req && pthread_equal(f->thread, self))) {
            f->t1 = now;
            rec.in_flight--;
            rec.last_event = now;
        }
    }
    pthread_mutex_unlock(&rec.mu);
}

void comm_flight_bind(const void *req)
{
    if (!rec.on)
        return;
    pthread_mutex_lock(&rec.mu);
    pthread_t self = pthread_self();
    int64_t first = rec.seq > COMM_FLIGHT_RING ? rec.seq - COMM_FLIGHT_RING : 0;
    for (int64_t s = rec.seq - 1; s >= first; s--) {
        Flight *f = &rec.ring[s % COMM_FLIGHT_RING];
        if (f->t1 == 0 && !f->req && pthread_equal(f->thread, self)) {
            f->req = req;
            break;
        }
    }
    pthread_mutex_unlock(&rec.mu);
}

int comm_flight_end(int rc)
{
    if (rec.on)
        end_matching(0, NULL);
    return rc;
}

void comm_flight_end_req(const void *req)
{
    if (rec.on)
        end_matching(1, req);
}

void comm_flight_progress(void)
{
    if (!rec.on)
        return;
    pthread_mutex_lock(&rec.mu);
    rec.last_event = clock_seconds();
    pthread_mutex_unlock(&rec.mu);
}

/* The oldest entry in flight (under the mutex), or NULL. */
static const Flight *oldest_in_flight(void)
{
    int64_t first = rec.seq > COMM_FLIGHT_RING ? rec.seq - COMM_FLIGHT_RING : 0;
    for (int64_t s = first; s < rec.seq; s++)
        if (rec.ring[s % COMM_FLIGHT_RING].t1 == 0)
            return &rec.ring[s % COMM_FLIGHT_RING];
    return NULL;
}

/* DIR/flight-rank-R.txt (util/flight.h's format), written under a temporary name and renamed. */
static void write_ring(const char *reason, double now)
{
    if (!rec.dir[0])
        return;
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/" FLIGHT_FILE_FORMAT, rec.dir, rec.rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "wlbtrain: warning: rank %d: cannot write the flight recorder %s: %s\n", rec.rank, tmp,
                strerror(errno));
        return;
    }
    fprintf(f, "%s\nrank %d world %d reason %s now %.6f\n", FLIGHT_MAGIC, rec.rank, rec.world, reason, now);
    for (int g = 0; g < GROUP_COUNT; g++)
        if (rec.group_size[g] > 1)
            fprintf(f, "group %d %s %d %d %lld\n", g, group_name(g), rec.group_id[g], rec.group_size[g],
                    (long long)rec.gseq[g]);
    int64_t first = rec.seq > COMM_FLIGHT_RING ? rec.seq - COMM_FLIGHT_RING : 0;
    for (int64_t s = first; s < rec.seq; s++) {
        const Flight *e = &rec.ring[s % COMM_FLIGHT_RING];
        fprintf(f, "op %lld %d %s %d %lld %s %lld %d %.6f %.6f\n", (long long)e->seq, e->group, group_name(e->group),
                e->group_id, (long long)e->gseq, e->op, (long long)e->n, e->peer, e->t0, e->t1);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0)
        fprintf(stderr, "wlbtrain: warning: rank %d: cannot write the flight recorder %s\n", rec.rank, path);
}

static void sleep_s(double d)
{
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The data path's communicators aborted (NCCL: ncclCommAbort on each, which also ends a kernel stuck
 * waiting for a peer), so that nothing of this process stays on the GPU. */
static void abort_path(void)
{
    if (rec.comm && rec.comm->impl->abort)
        rec.comm->impl->abort(rec.comm);
}

/* The data path reported an asynchronous error (NCCL's: a peer or a link gone): the ring written, one
 * line, the communicators aborted, the hang's exit (a requeue resumes from the last checkpoint). */
static void end_rank_async(const char *why)
{
    write_ring("hang", clock_seconds());
    fflush(stdout);
    fprintf(stderr, "wlbtrain: error: rank %d: %s%s%s\n", rec.rank, why,
            rec.dir[0] ? "; flight recorder in " : "", rec.dir);
    fflush(stderr);
    abort_path();
    _exit(COMM_EXIT_HANG);
}

/* The end of this rank: the ring written, one line, the others given time to write theirs, rank 0's
 * comparison of the files, then the exit that takes the job down. */
static void end_rank(int hang, const Flight *f, double waited)
{
    double now = clock_seconds();
    /* This process stood still longer than the timeout (SIGSTOP, then the launcher's SIGCONT as it
     * ends the job): the others have timed out waiting for it, written their records and named it.
     * A record of its own, written now, would describe the job after their end and change what
     * `wlbtrain inspect` reads from the folder: none is written. */
    if (rec.stood_still > 0) {
        fflush(stdout);
        fprintf(stderr, "wlbtrain: error: rank %d: this process stood still for %.0f s (stopped or starved), longer "
                "than parallel.timeout_s: the other ranks' flight records describe the hang; it writes none\n",
                rec.rank, rec.stood_still);
        fflush(stderr);
        abort_path();
        _exit(hang ? COMM_EXIT_HANG : COMM_EXIT_STOPPED);
    }
    write_ring(hang ? "hang" : "stop", now);
    char what[256];
    if (f->peer >= 0)
        snprintf(what, sizeof what, "%s %d elements with group rank %d of %s %d (its message %lld)", f->op,
                 (int)f->n, f->peer, group_name(f->group), f->group_id, (long long)f->gseq);
    else
        snprintf(what, sizeof what, "%s of %lld elements on %s %d (its collective %lld)", f->op, (long long)f->n,
                 group_name(f->group), f->group_id, (long long)f->gseq);
    fflush(stdout);
    if (hang)
        fprintf(stderr, "wlbtrain: error: rank %d: hang: no collective finished for %.0f s (parallel.timeout_s); "
                "waiting in %s for %.0f s%s%s\n", rec.rank, now - rec.last_event, what, waited,
                rec.dir[0] ? "; flight recorder in " : "", rec.dir);
    else if (rec.ckpt_saving > rec.ckpt_done)
        fprintf(stderr, "wlbtrain: error: rank %d: stop signal while waiting %.0f s in %s: stopping in the middle "
                "of the checkpoint of step %lld (latest names it if rank 0 finished it, else the one before; resume "
                "goes on from latest)\n", rec.rank, waited, what, (long long)rec.ckpt_saving);
    else if (rec.ckpt_done > 0)
        fprintf(stderr, "wlbtrain: error: rank %d: stop signal while waiting %.0f s in %s: stopping; the newest "
                "checkpoint, of step %lld, is complete (resume goes on from it)\n", rec.rank, waited, what,
                (long long)rec.ckpt_done);
    else
        fprintf(stderr, "wlbtrain: error: rank %d: stop signal while waiting %.0f s in %s: stopping without a "
                "checkpoint since this process started (resume goes on from the last one)\n", rec.rank, waited, what);
    fflush(stderr);
    sleep_s(COMM_WATCHDOG_GRACE_S);
    /* The reporter: the lowest rank that wrote a file (rank 0, unless it is the one that stopped). It
     * compares the files and exits first; the others wait a little longer, so that the launcher
     * ending the job does not cut the reporter short. */
    int reporter = rec.dir[0] != 0;
    for (int r = 0; reporter && r < rec.rank; r++) {
        char other[4200];
        snprintf(other, sizeof other, "%s/" FLIGHT_FILE_FORMAT, rec.dir, r);
        reporter = access(other, F_OK) != 0;
    }
    if (reporter) {
        char line[1024];
        Error e = {0};
        if (flight_compare(rec.dir, rec.world, line, sizeof line, &e) == 0)
            fprintf(stderr, "wlbtrain: error: %s\n", line);
        fflush(stderr);
    } else {
        sleep_s(2 * COMM_WATCHDOG_GRACE_S);
    }
    abort_path();
    _exit(hang ? COMM_EXIT_HANG : COMM_EXIT_STOPPED);
}

static void *watch(void *arg)
{
    (void)arg;
    double prev = clock_seconds();
    for (;;) {
        sleep_s(0.25);
        pthread_mutex_lock(&rec.mu);
        if (rec.quit) {
            pthread_mutex_unlock(&rec.mu);
            return NULL;
        }
        double now = clock_seconds();
        /* A poll far later than its 0.25 s: this process itself was stopped (SIGSTOP, then the
         * launcher's SIGCONT before it ends the job) or starved - not a peer that did not come. The
         * time it stood still is not waiting. */
        if (now - prev > 1.0) {
            rec.last_event = now;
            if (now - prev > rec.timeout && now - prev > rec.stood_still)
                rec.stood_still = now - prev;
        }
        prev = now;
        double idle = now - rec.last_event;
        const Flight *f = rec.in_flight > 0 ? oldest_in_flight() : NULL;
        int stop = rec.stop && *rec.stop;
        /* With a stop signal pending, a wait a tenth of the timeout long (at least the grace) is
         * taken for a hang: long enough for the waits of a checkpoint save the signal lets finish. */
        double stop_after = rec.timeout / 10 > COMM_WATCHDOG_GRACE_S ? rec.timeout / 10 : COMM_WATCHDOG_GRACE_S;
        if (f && (idle > rec.timeout || (stop && idle > stop_after))) {
            Flight copy = *f;
            /* The mutex stays held: nothing records while the rank ends. */
            end_rank(idle > rec.timeout, &copy, now - copy.t0);
        }
        char why[512];
        if (rec.comm && rec.comm->impl->async_error && rec.comm->impl->async_error(rec.comm, why, sizeof why))
            end_rank_async(why);
        pthread_mutex_unlock(&rec.mu);
    }
}

int comm_watchdog_start(const Comm *c, double timeout_s, const char *dir, const volatile sig_atomic_t *stop,
                        Error *err)
{
    if (!c->mpi || c->size[GROUP_WORLD] <= 1 || timeout_s <= 0 || rec.running)
        return 0;
    rec.timeout = timeout_s;
    snprintf(rec.dir, sizeof rec.dir, "%s", dir ? dir : "");
    rec.stop = stop;
    rec.rank = c->rank[GROUP_WORLD];
    rec.world = c->size[GROUP_WORLD];
    for (int g = 0; g < GROUP_COUNT; g++) {
        rec.group_id[g] = c->group_id[g];
        rec.group_size[g] = comm_group_made(c, (LayoutGroup)g) ? c->size[g] : 0;
    }
    rec.comm = c;
    rec.stood_still = 0;
    rec.last_event = clock_seconds();
    rec.quit = 0;
    rec.on = 1;
    int rc = pthread_create(&rec.thread, NULL, watch, NULL);
    if (rc != 0) {
        rec.on = 0;
        return error_runtime(err, "parallel.timeout_s", "cannot start the watchdog thread: %s", strerror(rc));
    }
    rec.running = 1;
    return 0;
}

void comm_watchdog_note_checkpoint(int64_t step, int complete)
{
    pthread_mutex_lock(&rec.mu);
    if (complete)
        rec.ckpt_done = step;
    else
        rec.ckpt_saving = step;
    pthread_mutex_unlock(&rec.mu);
}

void comm_watchdog_stop(void)
{
    if (!rec.running)
        return;
    pthread_mutex_lock(&rec.mu);
    rec.quit = 1;
    pthread_mutex_unlock(&rec.mu);
    pthread_join(rec.thread, NULL);
    rec.running = 0;
    rec.on = 0;
}
