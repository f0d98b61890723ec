/*
 * util/runlock.c - the run folder's lock file (see runlock.h).
 */
#include "util/runlock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECORD_MAGIC "wlbtrain-run-lock 1"

/* A word fit for the record (no spaces, no '=' games): other bytes become '_'. */
static void copy_word(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c > ' ' && c < 127 ? (char)c : '_';
    }
    dst[i] = '\0';
}

static void fill_self(RunLockRecord *r)
{
    memset(r, 0, sizeof *r);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "unknown");
    copy_word(r->host, sizeof r->host, host);
    r->pid = (long)getpid();
    copy_word(r->job, sizeof r->job, getenv("SLURM_JOB_ID"));
    const char *rc = getenv("SLURM_RESTART_COUNT");
    char *end = NULL;
    long n = rc ? strtol(rc, &end, 10) : 0;
    r->restart = rc && end != rc && *end == '\0' && n >= 0 ? n : 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    strftime(r->started, sizeof r->started, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(r->token, sizeof r->token, "%.80s.%ld.%lld.%09ld", r->host, r->pid, (long long)now.tv_sec, now.tv_nsec);
}

static int parse_record(const char *text, RunLockRecord *r)
{
    memset(r, 0, sizeof *r);
    if (strncmp(text, RECORD_MAGIC " ", strlen(RECORD_MAGIC) + 1) != 0)
        return -1;
    int seen = 0;
    const char *p = text + strlen(RECORD_MAGIC) + 1;
    while (*p && *p != '\n') {
        const char *end = p + strcspn(p, " \n"), *eq = memchr(p, '=', (size_t)(end - p));
        if (eq) {
            char val[256];
            snprintf(val, sizeof val, "%.*s", (int)(end - eq - 1), eq + 1);
            size_t klen = (size_t)(eq - p);
#define KEY(k) (klen == strlen(k) && strncmp(p, k, klen) == 0)
            if (KEY("host"))
                copy_word(r->host, sizeof r->host, val), seen |= 1;
            else if (KEY("pid"))
                r->pid = strtol(val, NULL, 10), seen |= 2;
            else if (KEY("job"))
                copy_word(r->job, sizeof r->job, val), seen |= 4;
            else if (KEY("restart"))
                r->restart = strtol(val, NULL, 10), seen |= 8;
            else if (KEY("started"))
                copy_word(r->started, sizeof r->started, val);
            else if (KEY("token"))
                copy_word(r->token, sizeof r->token, val), seen |= 16;
#undef KEY
        }
        p = *end == ' ' ? end + 1 : end;
    }
    return seen == 31 ? 0 : -1;
}

int runlock_read(const char *path, RunLockRecord *r, Error *err)
{
    char text[1024];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return error_errno(err, path, "cannot read the run lock");
    ssize_t n = read(fd, text, sizeof text - 1);
    int saved = errno;
    close(fd);
    if (n < 0) {
        errno = saved;
        return error_errno(err, path, "cannot read the run lock");
    }
    text[n] = '\0';
    if (parse_record(text, r) != 0)
        return error_set(err, path, "not a wlbtrain run lock (expected a line '%s host=... pid=... job=... "
                         "restart=... token=...')", RECORD_MAGIC);
    return 0;
}

int runlock_held(const RunLock *lk)
{
    RunLockRecord r;
    Error e = {0};
    return lk->path && runlock_read(lk->path, &r, &e) == 0 && strcmp(r.token, lk->self.token) == 0;
}

static double mtime_of(const struct stat *st)
{
    return (double)st->st_mtim.tv_sec + 1e-9 * (double)st->st_mtim.tv_nsec;
}

/* Whether process pid of this host has ended: kill(pid, 0) fails with ESRCH, or it is a zombie that
 * nobody has reaped yet - kill() still finds a zombie, and one whose launcher ended before reaping it
 * stays one where no init process reaps orphans (a container's first process often does not): a
 * rank ended by MPI_Abort is seen so right after mpirun returns. */
static int process_gone(long pid)
{
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the state follows the last ')' */
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* Why the holder's lock may be taken over ("" when it may not), into why. */
static void takeover_reason(const RunLockRecord *self, const RunLockRecord *h, int readable, double age, double stale_s,
                            char *why, size_t cap)
{
    why[0] = '\0';
    if (readable && self->job[0] && strcmp(h->job, self->job) == 0 && h->restart < self->restart)
        snprintf(why, cap, "the same Slurm job %s before its requeue (restart %ld, now %ld)", h->job, h->restart,
                 self->restart);
    else if (readable && strcmp(h->host, self->host) == 0 && h->pid > 0 && h->pid != self->pid &&
             process_gone(h->pid))
        snprintf(why, cap, "its process %ld on this host is gone", h->pid);
    else if (age > stale_s)
        snprintf(why, cap, "its heartbeat is %.0f s old, over the %.0f s bound", age, stale_s);
}

static void describe(char *out, size_t cap, const RunLockRecord *h, int readable, double age)
{
    if (!readable) {
        snprintf(out, cap, "an unreadable lock record, heartbeat %.0f s ago", age);
        return;
    }
    char job[128] = "";
    if (h->job[0])
        snprintf(job, sizeof job, ", Slurm job %s (restart %ld)", h->job, h->restart);
    snprintf(out, cap, "host %s, pid %ld%s, started %s, heartbeat %.0f s ago", h->host, h->pid, job, h->started, age);
}

int runlock_check(const char *dir, const char *where, double stale_s, Error *err)
{
    RunLockRecord self, h;
    fill_self(&self);
    size_t cap = strlen(dir) + sizeof RUNLOCK_NAME + 2;
    char *path = malloc(cap);
    if (!path)
        return error_runtime(err, where, "out of memory");
    snprintf(path, cap, "%s/%s", dir, RUNLOCK_NAME);
    struct stat sl;
    Error e = {0};
    int rc = 0;
    if (stat(path, &sl) == 0) {
        int readable = runlock_read(path, &h, &e) == 0;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double age = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec - mtime_of(&sl);
        age = age > 0 ? age : 0;
        char why[256], who[600];
        takeover_reason(&self, &h, readable, age, stale_s, why, sizeof why);
        describe(who, sizeof who, &h, readable, age);
        if (!why[0] && (readable || e.status == ERROR_INPUT))
            rc = error_set(err, where, "%s is in use by another job: %s (%s; a lock whose heartbeat is older than %.0f "
                           "s is stale and is taken over). Wait for that job to end, or give another folder", dir, who,
                           path, stale_s);
    }
    free(path);
    return rc;
}

static int write_own(const char *own, const RunLockRecord *r, Error *err)
{
    char line[1024];
    int n = snprintf(line, sizeof line, RECORD_MAGIC " host=%s pid=%ld job=%s restart=%ld started=%s token=%s\n",
                     r->host, r->pid, r->job, r->restart, r->started, r->token);
    int fd = open(own, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return error_errno(err, own, "cannot create the run lock");
    int rc = 0;
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0)
        rc = error_errno(err, own, "cannot write the run lock");
    if (close(fd) != 0 && rc == 0)
        rc = error_errno(err, own, "cannot write the run lock");
    if (rc != 0)
        unlink(own);
    return rc;
}

int runlock_take(RunLock *lk, const char *dir, const char *where, double stale_s, Error *err)
{
    static int serial;
    memset(lk, 0, sizeof *lk);
    fill_self(&lk->self);
    size_t cap = strlen(dir) + 400;
    char *path = malloc(cap), *own = malloc(cap);
    if (!path || !own) {
        free(path);
        free(own);
        return error_runtime(err, where, "out of memory");
    }
    snprintf(path, cap, "%s/%s", dir, RUNLOCK_NAME);
    snprintf(own, cap, "%s/.%s.%.80s.%ld.%d", dir, RUNLOCK_NAME, lk->self.host, lk->self.pid, serial++);
    int rc = -1;
    for (int attempt = 0; attempt < 5; attempt++) {
        if (write_own(own, &lk->self, err) != 0)
            break;
        struct stat st;
        if (link(own, path) == 0 || (errno != EEXIST && stat(own, &st) == 0 && st.st_nlink == 2)) {
            unlink(own);
            rc = 0;
            break;
        }
        if (errno != EEXIST) {
            error_errno(err, path, "cannot make the run lock");
            unlink(own);
            break;
        }
        /* Held: by whom, how long since its heartbeat (the server's times of both files). */
        RunLockRecord h;
        Error e = {0};
        struct stat sl, so;
        if (stat(path, &sl) != 0 || stat(own, &so) != 0) {
            unlink(own);
            if (errno == ENOENT)
                continue; /* released meanwhile: again */
            error_errno(err, path, "cannot read the run lock");
            break;
        }
        int readable = runlock_read(path, &h, &e) == 0;
        if (!readable && e.status == ERROR_RUNTIME) {
            unlink(own);
            if (errno == ENOENT)
                continue;
            *err = e;
            break;
        }
        double age = mtime_of(&so) - mtime_of(&sl);
        age = age > 0 ? age : 0;
        char why[256], who[600];
        takeover_reason(&lk->self, &h, readable, age, stale_s, why, sizeof why);
        describe(who, sizeof who, &h, readable, age);
        if (!why[0]) {
            unlink(own);
            error_set(err, where, "%s is in use by another job: %s (%s; a lock whose heartbeat is older than %.0f s "
                      "is stale and is taken over). Wait for that job to end, or give another folder", dir, who, path,
                      stale_s);
            break;
        }
        if (rename(own, path) != 0) {
            error_errno(err, path, "cannot take over the run lock");
            unlink(own);
            break;
        }
        /* Two jobs that took over the same lock at once: the last rename wins; the other sees it here. */
        struct timespec settle = {0, (long)(RUNLOCK_SETTLE_S * 1e9)};
        nanosleep(&settle, NULL);
        lk->path = path;
        if (!runlock_held(lk)) {
            lk->path = NULL;
            RunLockRecord now;
            Error e2 = {0};
            int ok = runlock_read(path, &now, &e2) == 0;
            describe(who, sizeof who, &now, ok, 0);
            error_set(err, where, "%s is in use by another job: %s (%s; it took over the same stale lock at the "
                      "same time). Wait for that job to end, or give another folder", dir, who, path);
            break;
        }
        printf("run lock: took over %s from %s: %s\n", path, who, why);
        fflush(stdout);
        rc = 0;
        break;
    }
    free(own);
    if (rc != 0) {
        if (!err->status)
            error_runtime(err, path, "cannot take the run lock: it kept changing");
        free(path);
        lk->path = NULL;
        return -1;
    }
    lk->path = path;
    if (!(lk->dir = strdup(dir))) {
        runlock_release(lk);
        return error_runtime(err, where, "out of memory");
    }
    return 0;
}

static void *heartbeat(void *arg)
{
    RunLock *lk = arg;
    pthread_mutex_lock(&lk->mu);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = (double)until.tv_nsec * 1e-9 + lk->beat_s;
        until.tv_sec += (time_t)t;
        until.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
        while (!lk->stop && pthread_cond_timedwait(&lk->cv, &lk->mu, &until) != ETIMEDOUT)
            ;
        if (lk->stop)
            break;
        pthread_mutex_unlock(&lk->mu);
        /* Fencing: touch only a lock that is still ours. */
        int mine = runlock_held(lk);
        if (mine && utimensat(AT_FDCWD, lk->path, NULL, 0) != 0)
            fprintf(stderr, "wlbtrain: warning: %s: cannot refresh the run lock's heartbeat: %s\n", lk->path,
                    strerror(errno));
        pthread_mutex_lock(&lk->mu);
        if (!mine) {
            lk->lost = 1;
            fprintf(stderr, "wlbtrain: warning: %s: the run lock is no longer this job's (it was taken over as "
                    "stale): another job may write %s now\n", lk->path, lk->dir);
            break;
        }
    }
    pthread_mutex_unlock(&lk->mu);
    return NULL;
}

int runlock_heartbeat_start(RunLock *lk, double beat_s, Error *err)
{
    lk->beat_s = beat_s;
    if (pthread_mutex_init(&lk->mu, NULL) != 0)
        return error_runtime(err, lk->path, "cannot start the run lock's heartbeat");
    if (pthread_cond_init(&lk->cv, NULL) != 0) {
        pthread_mutex_destroy(&lk->mu);
        return error_runtime(err, lk->path, "cannot start the run lock's heartbeat");
    }
    int e = pthread_create(&lk->thread, NULL, heartbeat, lk);
    if (e != 0) {
        pthread_cond_destroy(&lk->cv);
        pthread_mutex_destroy(&lk->mu);
        return error_runtime(err, lk->path, "cannot start the run lock's heartbeat: %s", strerror(e));
    }
    lk->beating = 1;
    return 0;
}

static void stop_heartbeat(RunLock *lk)
{
    if (!lk->beating)
        return;
    pthread_mutex_lock(&lk->mu);
    lk->stop = 1;
    pthread_cond_signal(&lk->cv);
    pthread_mutex_unlock(&lk->mu);
    pthread_join(lk->thread, NULL);
    pthread_cond_destroy(&lk->cv);
    pthread_mutex_destroy(&lk->mu);
    lk->beating = 0;
}

void runlock_leave(RunLock *lk)
{
    stop_heartbeat(lk);
    free(lk->path);
    free(lk->dir);
    lk->path = lk->dir = NULL;
}

void runlock_release(RunLock *lk)
{
    stop_heartbeat(lk);
    if (runlock_held(lk)) {
        unlink(lk->path);
        if (lk->made_dir && lk->dir)
            rmdir(lk->dir); /* fails, leaving it, unless empty */
    }
    runlock_leave(lk);
}
