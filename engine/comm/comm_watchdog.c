/* engine/comm/comm_watchdog.c - the flight recorder and the collective watchdog (see comm_watchdog.h). */
#include "engine/comm/comm_watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm/runtime.h"
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

/* The side communicator's messages: a query (one int) and its answer (ANSWER_WORDS int64: what the
 * answering rank has begun on each group, each group's id, -1 where it has none, and the group and
 * group count of its oldest collective in flight, -1 when none). */
/* The longest the reporter waits for the other waiting ranks' records (end_rank). */
#define COMM_WATCHDOG_LATE_S 5.0

enum { TAG_QUERY = 1, TAG_ANSWER = 2, ANSWER_WORDS = 2 * GROUP_COUNT + 2, ANSWERS_PENDING = 64 };

/* The recorder, one per process. */
static struct {
    pthread_mutex_t mu;
    Flight ring[COMM_FLIGHT_RING];
    int64_t seq;                      /* entries begun */
    int64_t gseq[GROUP_COUNT];        /* per group */
    int in_flight;
    double last_event;                /* the last start or finish (clock_seconds) */
    int on;                           /* recording (comm_watchdog_launch) */
    /* The watchdog. */
    pthread_t thread;
    int running, quit;
    double timeout;
    char dir[4096];
    char attempt[FLIGHT_ATTEMPT_MAX];
    const volatile sig_atomic_t *stop;
    int rank, world;
    int group_id[GROUP_COUNT], group_size[GROUP_COUNT];
    int mpi;                          /* MPI runs: a hang ends through MPI_Abort */
    CommWatchdogJob job;              /* the data path's hooks (comm_watchdog_attach) */
    double stood_still;               /* the longest this process stood still past timeout since a
                                       * collective last finished (0: never) - a gap the job went on
                                       * after (a CPU-starved start, say) does not count */
    /* The side communicator (comm_watchdog_attach .. comm_watchdog_detach). */
    int side_on;
    MPI_Comm side;
    MPI_Request query;                /* the posted receive of the next query */
    int query_from;
    MPI_Request answer_req[ANSWERS_PENDING];
    int64_t answer_buf[ANSWERS_PENDING][ANSWER_WORDS];
    int64_t ckpt_saving, ckpt_done;   /* the step of a save under way, of the newest complete one (0: none) */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const group_names[] = {"tp", "cp", "pp", "dp", "dpcp", "world"};

static const char *group_name(int g) { return g < GROUP_CP_BLOCK ? group_names[g] : "cp_block"; }

void comm_flight_begin(LayoutGroup g, int group_id, int group_size, const char *op, int64_t n, int peer)
{
    if (!rec.on || group_size <= 1)
        return;
    pthread_mutex_lock(&rec.mu);
    Flight *f = &rec.ring[rec.seq % COMM_FLIGHT_RING];
    if (rec.seq >= COMM_FLIGHT_RING && f->t1 == 0)
        rec.in_flight--; /* still in flight 512 entries later: overwritten, no longer counted */
    *f = (Flight){rec.seq + 1, ++rec.gseq[g], (int)g, group_id, op, n, peer, clock_seconds(), 0,
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
            rec.stood_still = 0; /* a collective finished after it: the job went on with this rank */
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
    rec.stood_still = 0;
    pthread_mutex_unlock(&rec.mu);
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
    fprintf(f, "%s\nrank %d world %d reason %s now %.6f\nattempt %s\n", FLIGHT_MAGIC, rec.rank, rec.world, reason,
            now, rec.attempt);
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

/* The oldest entry in flight (under the mutex), or NULL. */
static const Flight *oldest_in_flight(void)
{
    int64_t first = rec.seq > COMM_FLIGHT_RING ? rec.seq - COMM_FLIGHT_RING : 0;
    for (int64_t s = first; s < rec.seq; s++)
        if (rec.ring[s % COMM_FLIGHT_RING].t1 == 0)
            return &rec.ring[s % COMM_FLIGHT_RING];
    return NULL;
}

/* This rank's answer to a query (under the mutex). */
static void answer_of(int64_t *a)
{
    for (int g = 0; g < GROUP_COUNT; g++) {
        a[g] = rec.gseq[g];
        a[GROUP_COUNT + g] = rec.group_size[g] > 1 ? rec.group_id[g] : -1;
    }
    const Flight *f = rec.in_flight > 0 ? oldest_in_flight() : NULL;
    a[2 * GROUP_COUNT] = f ? f->group : -1;
    a[2 * GROUP_COUNT + 1] = f ? f->gseq : 0;
}

/* Answers the queries that arrived on the side communicator (under the mutex; the watchdog's thread
 * only). An MPI error stops the answering: the asking rank then names this one as silent. */
static void serve_queries(void)
{
    while (rec.side_on) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(&rec.query, &done, &st) != MPI_SUCCESS) {
            rec.side_on = 0;
            return;
        }
        if (!done)
            return;
        int k = 0;
        for (; k < ANSWERS_PENDING; k++) { /* a free slot: never used, or its send finished */
            int sent = 1;
            if (rec.answer_req[k] != MPI_REQUEST_NULL &&
                MPI_Test(&rec.answer_req[k], &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                sent = 0;
            if (sent)
                break;
        }
        if (k < ANSWERS_PENDING) {
            answer_of(rec.answer_buf[k]);
            if (MPI_Isend(rec.answer_buf[k], ANSWER_WORDS, MPI_INT64_T, st.MPI_SOURCE, TAG_ANSWER, rec.side,
                          &rec.answer_req[k]) != MPI_SUCCESS)
                rec.answer_req[k] = MPI_REQUEST_NULL;
        }
        if (MPI_Irecv(&rec.query_from, 1, MPI_INT, MPI_ANY_SOURCE, TAG_QUERY, rec.side, &rec.query) != MPI_SUCCESS)
            rec.side_on = 0;
    }
}

/* Sleeps d seconds answering queries (under the mutex). */
static void sleep_serving(double d)
{
    double end = clock_seconds() + d;
    for (double now = clock_seconds(); now < end; now = clock_seconds()) {
        serve_queries();
        sleep_s(end - now < 0.02 ? end - now : 0.02);
    }
}

/* Appends the ranks of flag[0 .. n) set, "rank 2" or "ranks 2, 3", to buf. */
static void list_ranks(const unsigned char *flag, int n, char *buf, size_t size)
{
    int count = 0;
    for (int r = 0; r < n; r++)
        count += flag[r] != 0;
    size_t at = strlen(buf);
    at += (size_t)snprintf(buf + at, at < size ? size - at : 0, "rank%s ", count > 1 ? "s" : "");
    if (at >= size)
        return;
    int first = 1;
    for (int r = 0; r < n && at + 16 < size; r++)
        if (flag[r]) {
            at += (size_t)snprintf(buf + at, size - at, "%s%d", first ? "" : ", ", r);
            first = 0;
        }
}

/* Asks every other rank on the side communicator what it has begun, waiting at most the grace, and
 * writes into out which ranks never reached f: members of f's group behind it, and the ranks that did
 * not answer (stopped, killed, or hung where MPI cannot answer); got[r] 1 for the ranks that answered.
 * "" when it cannot ask (no side communicator: MPI not started yet, or finishing). Under the mutex. */
static void ask_peers(const Flight *f, char *out, size_t size, unsigned char *got)
{
    out[0] = '\0';
    if (!rec.side_on || rec.world <= 1 || !got)
        return;
    int n = rec.world;
    int64_t *ans = calloc((size_t)n * ANSWER_WORDS, sizeof *ans);
    MPI_Request *rq = malloc((size_t)n * 2 * sizeof *rq);
    unsigned char *silent = calloc((size_t)n, 1), *behind = calloc((size_t)n, 1);
    int one = rec.rank, ok = ans && rq && silent && behind;
    for (int r = 0; ok && r < n; r++) {
        rq[2 * r] = rq[2 * r + 1] = MPI_REQUEST_NULL;
        if (r == rec.rank)
            continue;
        if (MPI_Irecv(&ans[(size_t)r * ANSWER_WORDS], ANSWER_WORDS, MPI_INT64_T, r, TAG_ANSWER, rec.side,
                      &rq[2 * r]) != MPI_SUCCESS ||
            MPI_Isend(&one, 1, MPI_INT, r, TAG_QUERY, rec.side, &rq[2 * r + 1]) != MPI_SUCCESS)
            ok = 0;
    }
    double deadline = clock_seconds() + COMM_WATCHDOG_GRACE_S;
    for (int waiting = n - 1; ok && waiting > 0 && clock_seconds() < deadline;) {
        for (int r = 0; r < n; r++) {
            int done = 0;
            if (r != rec.rank && !got[r] && MPI_Test(&rq[2 * r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
                got[r] = 1;
                waiting--;
            }
        }
        serve_queries(); /* the others ask at the same time */
        if (waiting > 0)
            sleep_s(0.01);
    }
    for (int r = 0; ok && r < n; r++) { /* what did not come is cancelled: nothing stays posted */
        if (r == rec.rank)
            continue;
        if (!got[r] && rq[2 * r] != MPI_REQUEST_NULL) {
            MPI_Cancel(&rq[2 * r]);
            MPI_Wait(&rq[2 * r], MPI_STATUS_IGNORE);
        }
        int sent = 0;
        if (rq[2 * r + 1] != MPI_REQUEST_NULL &&
            (MPI_Test(&rq[2 * r + 1], &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS || !sent))
            MPI_Request_free(&rq[2 * r + 1]);
        const int64_t *a = &ans[(size_t)r * ANSWER_WORDS];
        int member = f->peer < 0 && a[GROUP_COUNT + f->group] == f->group_id;
        silent[r] = !got[r];
        behind[r] = got[r] && member && a[f->group] < f->gseq;
    }
    if (ok) {
        int any_silent = 0, any_behind = 0;
        for (int r = 0; r < n; r++) {
            any_silent |= silent[r];
            any_behind |= behind[r];
        }
        if (any_silent || any_behind) {
            snprintf(out, size, "; asked the other ranks: ");
            if (any_behind) {
                snprintf(out + strlen(out), size - strlen(out), "never reached it: ");
                list_ranks(behind, n, out, size);
            }
            if (any_silent) {
                snprintf(out + strlen(out), size - strlen(out), "%sno answer from ", any_behind ? "; " : "");
                list_ranks(silent, n, out, size);
                snprintf(out + strlen(out), size - strlen(out), " (stopped, killed or hung where MPI cannot answer)");
            }
        } else {
            snprintf(out, size, "; asked the other ranks: every one answered and reached it");
        }
    }
    free(ans);
    free(rq);
    free(silent);
    free(behind);
}

/* The job ended with status: the data path's communicators aborted (NCCL: ncclCommAbort on each, which
 * also ends a kernel stuck waiting for a peer), then MPI_Abort while MPI runs - the launcher (mpirun,
 * srun) ends every rank and returns this status - else _exit (before MPI_Init returned, or in
 * MPI_Finalize: the launcher ends the others as a rank gone). */
static void leave(int status)
{
    if (rec.job.abort)
        rec.job.abort(rec.job.ctx);
    fflush(stdout);
    fflush(stderr);
    if (rec.mpi)
        MPI_Abort(MPI_COMM_WORLD, status);
    _exit(status);
}

/* The data path reported an asynchronous error (NCCL's: a peer or a link gone): the ring written, one
 * line, the hang's exit (a requeue resumes from the last checkpoint). */
static void end_rank_async(const char *why)
{
    write_ring("hang", clock_seconds());
    fflush(stdout);
    fprintf(stderr, "wlbtrain: error: rank %d: %s%s%s\n", rec.rank, why,
            rec.dir[0] ? "; flight recorder in " : "", rec.dir);
    leave(COMM_EXIT_HANG);
}

/* The end of this rank: the other ranks asked, the ring written, one line, the others given time to
 * write theirs, rank 0's comparison of the files, then the exit that takes the job down. */
static void end_rank(int hang, const Flight *f, double waited)
{
    double now = clock_seconds();
    /* This process stood still longer than the timeout (SIGSTOP, then the launcher's SIGCONT and
     * SIGTERM as it ends the job: the stop flag): the others have timed out waiting for it, written
     * their records and named it. A record of its own, written now, would describe the job after
     * their end and change what `wlbtrain inspect` reads from the folder: none is written. A hang
     * found a whole timeout after the gap is this rank's own wait (it was starved, and the job went
     * on without ending): reported as any. */
    if (rec.stood_still > 0 && !hang) {
        fflush(stdout);
        fprintf(stderr, "wlbtrain: error: rank %d: this process stood still for %.0f s (stopped or starved), longer "
                "than parallel.timeout_s: the other ranks' flight records describe the hang; it writes none\n",
                rec.rank, rec.stood_still);
        fflush(stderr);
        if (rec.job.abort)
            rec.job.abort(rec.job.ctx);
        _exit(hang ? COMM_EXIT_HANG : COMM_EXIT_STOPPED); /* never MPI_Abort: the others report */
    }
    char asked[1024] = "";
    unsigned char *answered = calloc((size_t)rec.world, 1); /* out of memory: not asked */
    if (hang)
        ask_peers(f, asked, sizeof asked, answered);
    write_ring(hang ? "hang" : "stop", now);
    char what[256];
    if (f->peer >= 0)
        snprintf(what, sizeof what, "%s %d elements with group rank %d of %s %d (its message %lld)", f->op,
                 (int)f->n, f->peer, group_name(f->group), f->group_id, (long long)f->gseq);
    else if (f->n > 0)
        snprintf(what, sizeof what, "%s of %lld elements on %s %d (its collective %lld)", f->op, (long long)f->n,
                 group_name(f->group), f->group_id, (long long)f->gseq);
    else /* MPI's own: MPI_Init, the splits, the final barrier, MPI_Finalize */
        snprintf(what, sizeof what, "%s on %s %d (its collective %lld)", f->op, group_name(f->group), f->group_id,
                 (long long)f->gseq);
    fflush(stdout);
    if (hang)
        fprintf(stderr, "wlbtrain: error: rank %d: hang: no collective finished for %.0f s (parallel.timeout_s); "
                "waiting in %s for %.0f s%s%s%s\n", rec.rank, now - rec.last_event, what, waited, asked,
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
    sleep_serving(COMM_WATCHDOG_GRACE_S);
    /* The reporter: the lowest live rank - of those that answered the query when it could be asked,
     * else the lowest that wrote a file (rank 0, unless it is the one that stopped). It compares the
     * files and ends the job; the others wait longer, so that the end does not cut the reporter
     * short. Without a folder every rank has said what it found: the reporter ends the job. */
    int asked_ok = asked[0] != 0, reporter = 1;
    for (int r = 0; reporter && r < rec.rank; r++) {
        char other[4200];
        snprintf(other, sizeof other, "%s/" FLIGHT_FILE_FORMAT, rec.dir, r);
        reporter = asked_ok ? !answered[r] : !rec.dir[0] || access(other, F_OK) != 0;
    }
    /* How much later than this one another waiting rank's watchdog may fire (its last collective
     * began later): at most 5 s waited, so that the job still ends within timeout + 10 s. */
    double late = rec.timeout < COMM_WATCHDOG_LATE_S ? rec.timeout : COMM_WATCHDOG_LATE_S;
    if (reporter && rec.dir[0]) {
        /* On a hang the records of the other waiting ranks are waited for, so that the comparison does
         * not take a late one for a missing one: of the ranks that answered (alive), or - where none could be
         * asked (MPI_Init, MPI_Finalize) - of every rank, up to `late`. */
        double until = clock_seconds() + late;
        for (int r = 0; hang && r < rec.world; r++) {
            char other[4200];
            snprintf(other, sizeof other, "%s/" FLIGHT_FILE_FORMAT, rec.dir, r);
            while ((asked_ok ? answered[r] : r != rec.rank) && access(other, F_OK) != 0 && clock_seconds() < until)
                sleep_serving(0.05);
        }
        char line[1024];
        Error e = {0};
        if (flight_compare(rec.dir, rec.world, rec.attempt, line, sizeof line, &e) == 0)
            fprintf(stderr, "wlbtrain: error: %s\n", line);
        fflush(stderr);
    } else if (!reporter) {
        sleep_serving(2 * COMM_WATCHDOG_GRACE_S + (hang ? late : 0));
    }
    free(answered);
    leave(hang ? COMM_EXIT_HANG : COMM_EXIT_STOPPED);
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
        serve_queries();
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
        if (rec.job.async_error && rec.job.async_error(rec.job.ctx, why, sizeof why))
            end_rank_async(why);
        pthread_mutex_unlock(&rec.mu);
    }
}

int comm_watchdog_launch(int rank, int world, double timeout_s, const char *dir, const volatile sig_atomic_t *stop,
                         Error *err)
{
    if (world <= 1 || timeout_s <= 0 || rec.running)
        return 0;
    runtime_attempt(rec.attempt, sizeof rec.attempt);
    snprintf(rec.dir, sizeof rec.dir, "%s", dir ? dir : "");
    /* Records of an earlier attempt (a requeued job's first hang) are kept aside, not read as this
     * one's. Every rank does it (a rank stopped before it must not leave them): moves race harmlessly. */
    if (rec.dir[0] && flight_set_aside(rec.dir, rec.attempt, err) != 0)
        return -1;
    rec.timeout = timeout_s;
    rec.stop = stop;
    rec.rank = rank;
    rec.world = world;
    for (int g = 0; g < GROUP_COUNT; g++)
        rec.group_id[g] = rec.group_size[g] = 0;
    rec.group_size[GROUP_WORLD] = world; /* before the split: the world, as the launcher says */
    memset(&rec.job, 0, sizeof rec.job);
    rec.stood_still = 0;
    rec.mpi = 0;
    rec.side_on = 0;
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

void comm_watchdog_mpi(int running)
{
    if (!rec.running)
        return;
    pthread_mutex_lock(&rec.mu);
    rec.mpi = running;
    pthread_mutex_unlock(&rec.mu);
}

int comm_watchdog_attach(const CommWatchdogJob *job, Error *err)
{
    if (!rec.running)
        return 0;
    MPI_Comm side = MPI_COMM_NULL;
    if (job->side) {
        /* Collective over the world, like the splits: recorded as one. */
        comm_flight_begin(GROUP_WORLD, 0, rec.world, "MPI_Comm_dup", 0, -1);
        int rc = comm_flight_end(MPI_Comm_dup(MPI_COMM_WORLD, &side));
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_set_errhandler(side, MPI_ERRORS_RETURN);
        if (rc != MPI_SUCCESS)
            return error_runtime(err, "mpi", "the watchdog's side communicator: MPI error %d", rc);
    }
    pthread_mutex_lock(&rec.mu);
    rec.job = *job;
    for (int g = 0; g < GROUP_COUNT; g++) {
        rec.group_id[g] = job->group_id[g];
        rec.group_size[g] = job->group_size[g];
    }
    if (side != MPI_COMM_NULL) {
        rec.side = side;
        for (int k = 0; k < ANSWERS_PENDING; k++)
            rec.answer_req[k] = MPI_REQUEST_NULL;
        rec.side_on = MPI_Irecv(&rec.query_from, 1, MPI_INT, MPI_ANY_SOURCE, TAG_QUERY, side, &rec.query) ==
                      MPI_SUCCESS;
    }
    pthread_mutex_unlock(&rec.mu);
    return 0;
}

void comm_watchdog_detach(void)
{
    if (!rec.running)
        return;
    pthread_mutex_lock(&rec.mu);
    if (rec.side_on) {
        MPI_Cancel(&rec.query);
        MPI_Wait(&rec.query, MPI_STATUS_IGNORE);
        for (int k = 0; k < ANSWERS_PENDING; k++) {
            int sent = 0;
            if (rec.answer_req[k] != MPI_REQUEST_NULL &&
                (MPI_Test(&rec.answer_req[k], &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS || !sent))
                MPI_Request_free(&rec.answer_req[k]);
        }
        MPI_Comm_free(&rec.side);
    }
    rec.side_on = 0;
    memset(&rec.job, 0, sizeof rec.job); /* the data path is closed by now */
    pthread_mutex_unlock(&rec.mu);
}

void comm_watchdog_stop(void)
{
    if (!rec.running)
        return;
    comm_watchdog_detach();
    pthread_mutex_lock(&rec.mu);
    rec.quit = 1;
    pthread_mutex_unlock(&rec.mu);
    pthread_join(rec.thread, NULL);
    rec.running = 0;
    rec.on = 0;
    rec.mpi = 0;
}
