/*
 * util/runlock.h - an exclusive lock on a run folder that also holds on shared file systems.
 *
 * One job per run folder (checkpoint.dir): the job that takes DIR/run.lock owns the folder until it
 * releases the lock; another job is refused, told who holds it. flock(2) is not used: on NFS it is a
 * whole-file fcntl lock that a `nolock` mount makes local, and on Lustre it is cluster-wide only with
 * the `flock` mount option (`localflock` makes it per node). Instead the lock is a file made by
 * link(2): the holder writes its record into a file of its own (DIR/.run.lock.HOST.PID.N), then
 * links it to DIR/run.lock. link is atomic on every NFS version (O_CREAT|O_EXCL only on NFSv3+), and
 * when its reply is lost the link count of the own file (2) still says whether it was made.
 *
 * The record (one line of text): host, pid, Slurm job id and restart count (SLURM_JOB_ID,
 * SLURM_RESTART_COUNT; empty and 0 outside Slurm), start time, a token that is this holder's alone.
 * The heartbeat is the lock file's modification time: the holder touches it every
 * RUNLOCK_HEARTBEAT_S seconds (a thread), and the time is the file server's (utimensat with no time
 * given), so clocks of other nodes never enter. A lock's age is measured against a file made now in
 * the same folder (the server's "now" too).
 *
 * A lock that is there is taken over only when
 *   - its holder is this Slurm job, started before a requeue (same SLURM_JOB_ID, lower
 *     SLURM_RESTART_COUNT): the requeued job takes its folder back at once;
 *   - its holder ran on this host and that process is gone (kill(pid, 0): ESRCH): a run killed
 *     here (SIGKILL, a crash) does not block the next one;
 *   - its heartbeat is older than the stale bound (RUNLOCK_STALE_S, 120 s: four heartbeats missed;
 *     a holder on another node that died, or whose node lost the file system).
 * A take-over renames the taker's own file over run.lock (atomic), waits RUNLOCK_SETTLE_S and reads
 * the lock again: of two jobs that took over the same stale lock at once, the one whose record is
 * not there is refused. The heartbeat thread also reads the record before each touch; a holder that
 * finds another's record there (its lock was taken over while it stood still) prints a warning once
 * and no longer touches it.
 */
#ifndef WLB_UTIL_RUNLOCK_H
#define WLB_UTIL_RUNLOCK_H

#include <pthread.h>

#include "util/error.h"

#define RUNLOCK_NAME "run.lock"
#define RUNLOCK_HEARTBEAT_S 30.0
#define RUNLOCK_STALE_S 120.0
#define RUNLOCK_SETTLE_S 0.5

/* A lock's record, as read back. */
typedef struct RunLockRecord {
    char host[256];
    long pid;
    char job[64];     /* SLURM_JOB_ID, "" outside Slurm */
    long restart;     /* SLURM_RESTART_COUNT, 0 outside Slurm or before a requeue */
    char started[32]; /* UTC, ISO 8601 */
    char token[128];  /* host.pid.seconds.nanoseconds of the taker: this holder's alone */
} RunLockRecord;

typedef struct RunLock {
    char *dir, *path;   /* the folder, its run.lock (NULL: not held) */
    RunLockRecord self; /* what this holder wrote */
    double beat_s;      /* heartbeat period */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int beating, stop, lost;
    int made_dir;       /* set by the caller when it made dir for the lock: runlock_release removes
                         * dir too when nothing else was put in it */
} RunLock;

/* Takes DIR/run.lock (DIR must exist) for this process: 0 when taken (and a line on stdout when a
 * lock was taken over: whose, and why), else -1 with err: status 2 naming the holder (host, pid,
 * Slurm job, age of its heartbeat), as "WHERE: DIR is in use by ...", or 1 for a file-system error.
 * stale_s: the bound above (tests pass less). Nothing else in DIR is touched. */
int runlock_take(RunLock *lk, const char *dir, const char *where, double stale_s, Error *err);
/* Before a job starts (every rank, nothing written): -1 with the error runlock_take would give when
 * DIR/run.lock is there and would not be taken over now, else 0. The heartbeat's age is measured
 * against this host's clock here (runlock_take measures it against the file server's). */
int runlock_check(const char *dir, const char *where, double stale_s, Error *err);
/* Starts the heartbeat thread: the lock's time touched every beat_s seconds. */
int runlock_heartbeat_start(RunLock *lk, double beat_s, Error *err);
/* Stops the heartbeat and removes run.lock when it is still this holder's (and dir, left empty, when
 * made_dir is set); frees lk. Safe on a lock never taken (zeroed). */
void runlock_release(RunLock *lk);
/* Stops the heartbeat and frees lk, leaving run.lock in place (the process ends with a status the
 * batch script requeues: the requeued job takes it over). */
void runlock_leave(RunLock *lk);
/* Reads the record of the lock file path: 0, or -1 with err (status 2: missing or not a record). */
int runlock_read(const char *path, RunLockRecord *r, Error *err);
/* 1 when lk's run.lock still holds lk's record. */
int runlock_held(const RunLock *lk);

#endif
