/*
 * engine/train/train_runlock.c - the run's claim on the files it writes (see train_runlock.h).
 */
#include "engine/train/train_runlock.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "engine/model/model.h"
#include "util/fileio.h"

/* n bytes for a person: "123 bytes" up to 10 KiB, then KiB, MiB, GiB. */
static void human_bytes(double n, char *out, size_t cap)
{
    const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 10240 && u < 4) {
        n /= 1024;
        u++;
    }
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", n, unit[u]);
}

int trainer_check_space(const Config *cfg, Error *err)
{
    const char *dir = cfg->checkpoint.dir;
    if (!dir)
        return 0;
    int64_t params = model_param_count(&cfg->model, NULL);
    if (params < 0)
        return error_runtime(err, "checkpoint.dir", "out of memory");
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0)
        return error_errno(err, dir, "cannot read the free space of checkpoint.dir");
    double need = (double)params * TRAIN_CKPT_BYTES_PER_PARAM, avail = (double)sv.f_bavail * (double)sv.f_frsize;
    if (avail >= need)
        return 0;
    char a[32], b[32];
    human_bytes(avail, a, sizeof a);
    human_bytes(need, b, sizeof b);
    return error_set(err, "checkpoint.dir", "%s has %s free (%.0f bytes), less than one checkpoint of this model needs: "
                     "%s (%lld parameters x %d bytes: float32 weights and AdamW's two moments). Free space there, or "
                     "give another checkpoint.dir", dir, a, avail, b, (long long)params, TRAIN_CKPT_BYTES_PER_PARAM);
}

/* The "step" of a metrics line, or -1. */
static long long line_step(const char *line)
{
    json_t *o = json_loads(line, 0, NULL);
    json_t *s = o ? json_object_get(o, "step") : NULL;
    long long v = json_is_integer(s) ? (long long)json_integer_value(s) : -1;
    json_decref(o);
    return v;
}

static char *owner_path(const char *metrics)
{
    size_t n = strlen(metrics) + sizeof TRAIN_METRICS_OWNER + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", metrics, TRAIN_METRICS_OWNER);
    return p;
}

/* The line count of path and the steps of its first and last lines (0 lines: missing or empty). With
 * line, the first line itself into *line (malloc'd, its newline cut; NULL when none) and no steps. */
static int read_lines(const char *path, long long *lines, long long *first, long long *last, char **line, Error *err)
{
    *lines = 0;
    *first = *last = -1;
    if (line)
        *line = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : error_errno(err, path, "cannot read");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    int oom = 0;
    while ((n = getline(&buf, &cap, f)) > 0) {
        if (buf[n - 1] == '\n')
            buf[--n] = '\0';
        if (++*lines == 1) {
            *first = line_step(buf);
            if (line && !(*line = strdup(buf)))
                oom = 1;
        }
        if (!line)
            *last = line_step(buf);
    }
    free(buf);
    int bad = ferror(f);
    fclose(f);
    if (bad || oom) {
        if (line) {
            free(*line);
            *line = NULL;
        }
        return bad ? error_errno(err, path, "cannot read") : error_runtime(err, path, "out of memory");
    }
    return 0;
}

/* The absolute path of checkpoint.dir (made by now), malloc'd; NULL when none. */
static int run_identity(const Config *cfg, char **id, Error *err)
{
    *id = NULL;
    if (!cfg->checkpoint.dir)
        return 0;
    if (!(*id = realpath(cfg->checkpoint.dir, NULL)))
        return error_errno(err, cfg->checkpoint.dir, "cannot resolve checkpoint.dir");
    return 0;
}

/* log.metrics is new, empty, this run's or nobody's (see the header). */
static int check_metrics(const Config *cfg, Error *err)
{
    const char *path = cfg->log.metrics;
    if (!path)
        return 0;
    long long lines, first, last, n, a, b;
    char *owner = owner_path(path), *holder = NULL, *me = NULL;
    if (!owner)
        return error_runtime(err, path, "out of memory");
    int rc = read_lines(path, &lines, &first, &last, NULL, err);
    if (rc == 0)
        rc = read_lines(owner, &n, &a, &b, &holder, err);
    if (rc == 0)
        rc = run_identity(cfg, &me, err);
    const char *prefix = "checkpoint.dir ";
    const char *named = holder && strncmp(holder, prefix, strlen(prefix)) == 0 ? holder + strlen(prefix) : holder;
    if (rc == 0 && holder && !(me && strcmp(named, me) == 0)) {
        /* Marked by another run: refused when it has lines to lose, or when that run is running now
         * (its folder's lock held) and would go on writing; a run without checkpoint.dir replaces a
         * finished run's file as it always did. */
        Error held = {0};
        int running = runlock_check(named, "", RUNLOCK_STALE_S, &held) != 0;
        char what[96];
        if (lines > 0)
            snprintf(what, sizeof what, "holds %lld line%s (steps %lld to %lld)", lines, lines == 1 ? "" : "s", first,
                     last);
        else
            snprintf(what, sizeof what, "is empty so far");
        if (running || (lines > 0 && me))
            rc = error_set(err, "log.metrics", "%s %s of another run%s: %s says it is the log of the run in %s; this run "
                           "would cut or replace them. Give a new log.metrics, or remove %s to start it afresh (or "
                           "remove %s to make it this run's)", path, what, running ? ", running now" : "", owner, named,
                           path, owner);
    }
    free(owner);
    free(holder);
    free(me);
    return rc;
}

int trainer_metrics_record(const Config *cfg, Error *err)
{
    char *me = NULL, *owner = NULL;
    if (!cfg->log.metrics)
        return 0;
    if (run_identity(cfg, &me, err) != 0)
        return -1;
    if (!me)
        return 0;
    int rc = 0;
    AtomicFile af;
    if (!(owner = owner_path(cfg->log.metrics)))
        rc = error_runtime(err, cfg->log.metrics, "out of memory");
    else if ((rc = atomic_open(&af, owner, err)) == 0) {
        fprintf(af.f, "checkpoint.dir %s\n", me);
        rc = atomic_commit(&af, err);
    }
    free(owner);
    free(me);
    return rc;
}

int trainer_claim_outputs(const Config *cfg, const Comm *comm, RunLock *lock, Error *err)
{
    memset(lock, 0, sizeof *lock);
    struct {
        int32_t status;
        char msg[sizeof err->msg];
    } out;
    memset(&out, 0, sizeof out);
    if (comm_world_rank(comm) == 0) {
        Error e = {0};
        int rc = 0;
        const char *dir = cfg->checkpoint.dir;
        if (dir) {
            struct stat st;
            int existed = stat(dir, &st) == 0;
            size_t n = strlen(dir) + 3;
            char *mark = malloc(n);
            if (!mark)
                rc = error_runtime(&e, "checkpoint.dir", "out of memory");
            else {
                snprintf(mark, n, "%s/x", dir);
                rc = file_make_parents(mark, &e);
                free(mark);
            }
            if (rc == 0)
                rc = runlock_take(lock, dir, "checkpoint.dir", RUNLOCK_STALE_S, &e);
            lock->made_dir = rc == 0 && !existed; /* a run that writes nothing leaves no folder */
            if (rc == 0)
                rc = trainer_check_space(cfg, &e);
        }
        if (rc == 0)
            rc = check_metrics(cfg, &e);
        if (rc == 0 && lock->path)
            rc = runlock_heartbeat_start(lock, RUNLOCK_HEARTBEAT_S, &e);
        if (rc != 0) {
            runlock_release(lock);
            out.status = e.status ? e.status : ERROR_RUNTIME;
            snprintf(out.msg, sizeof out.msg, "%s", e.msg);
        }
    }
    if (comm_world_size(comm) > 1 && comm_broadcast(comm, GROUP_WORLD, 0, &out, (int64_t)sizeof out, err) != 0) {
        runlock_release(lock);
        return -1;
    }
    if (out.status) {
        err->status = out.status;
        snprintf(err->msg, sizeof err->msg, "%s", out.msg);
        return -1;
    }
    return 0;
}

int trainer_check_lock(const Config *cfg, Error *err)
{
    return cfg->checkpoint.dir ? runlock_check(cfg->checkpoint.dir, "checkpoint.dir", RUNLOCK_STALE_S, err) : 0;
}

void trainer_unclaim_outputs(RunLock *lock, int released)
{
    if (released)
        runlock_release(lock);
    else
        runlock_leave(lock);
}
