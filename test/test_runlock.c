/*
 * test/test_runlock.c - the run folder's lock (util/runlock.h): taken once, refused to a second taker
 * with the holder named, taken over only when stale, by the requeued Slurm job or after a dead local
 * holder; the heartbeat refreshes it and stops touching a lock that is no longer its own; of many
 * processes taking one folder at once exactly one gets it.
 */
#include "test/testlib.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/runlock.h"

static char *dir;

static int setup(void **state)
{
    (void)state;
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_RESTART_COUNT");
    dir = test_tmpdir();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_rm_rf(dir);
    free(dir);
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_RESTART_COUNT");
    return 0;
}

static char *lock_path(void) { return test_format("%s/%s", dir, RUNLOCK_NAME); }

/* A lock record of someone else, its heartbeat age_s seconds old. */
static void plant(const char *host, long pid, const char *job, long restart, double age_s)
{
    char *path = lock_path();
    char *line = test_format("wlbtrain-run-lock 1 host=%s pid=%ld job=%s restart=%ld started=2026-01-01T00:00:00Z "
                             "token=%s.%ld.1.2\n", host, pid, job, restart, host, pid);
    free(test_write_file(dir, RUNLOCK_NAME, line, strlen(line)));
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= (time_t)age_s;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
    free(line);
    free(path);
}

static void test_take_refuse_release(void **state)
{
    (void)state;
    setenv("SLURM_JOB_ID", "4242", 1);
    RunLock a, b;
    Error err = {0};
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    char *path = lock_path();
    RunLockRecord r;
    assert_int_equal(runlock_read(path, &r, &err), 0);
    assert_int_equal(r.pid, (long)getpid());
    assert_string_equal(r.job, "4242");
    assert_int_equal(r.restart, 0);
    assert_true(runlock_held(&a));
    /* A second taker (this process again: alive, same host, same job and restart) is refused. */
    assert_int_equal(runlock_take(&b, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
    assert_int_equal(err.status, ERROR_INPUT);
    char *want = test_format("checkpoint.dir: %s is in use by another job: host %s, pid %ld, Slurm job 4242 (restart 0), "
                             "started %s, heartbeat 0 s ago", dir, r.host, (long)getpid(), r.started);
    assert_non_null(strstr(err.msg, want));
    free(want);
    /* Only the lock file itself is left in the folder (no temporary files). */
    char *listing = test_format("ls -A %s | wc -l", dir);
    FILE *p = popen(listing, "r");
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    assert_int_equal(n, 1);
    free(listing);
    runlock_release(&a);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(runlock_take(&b, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    runlock_release(&b);
    free(path);
}

static void test_stale_and_fresh(void **state)
{
    (void)state;
    RunLock a;
    Error err = {0};
    plant("othernode", 99, "", 0, 60); /* fresh: refused */
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
    assert_int_equal(err.status, ERROR_INPUT);
    assert_non_null(strstr(err.msg, "host othernode, pid 99, started 2026-01-01T00:00:00Z, heartbeat 60 s ago"));
    plant("othernode", 99, "", 0, 125); /* over the 120 s bound: taken over */
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    assert_true(runlock_held(&a));
    runlock_release(&a);
    /* Not a record at all: refused while fresh, taken over once stale. */
    free(test_write_file(dir, RUNLOCK_NAME, "garbage\n", 8));
    memset(&err, 0, sizeof err);
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
    assert_non_null(strstr(err.msg, "an unreadable lock record"));
    char *path = lock_path();
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= 200;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    runlock_release(&a);
    free(path);
}

static void test_dead_local_holder(void **state)
{
    (void)state;
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    int st;
    waitpid(child, &st, 0);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    plant(host, (long)child, "", 0, 1);
    RunLock a;
    Error err = {0};
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    runlock_release(&a);
    /* A holder that has ended but is not reaped yet (a zombie: kill(pid, 0) still finds it) is gone
     * too: a rank ended by MPI_Abort, seen right after mpirun returns, where nobody reaps orphans. */
    pid_t zombie = fork();
    if (zombie == 0)
        _exit(0);
    char stat_path[64], *stat_text = NULL;
    snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", (long)zombie);
    for (int i = 0; i < 2000 && !(stat_text && strstr(stat_text, ") Z ")); i++) {
        free(stat_text);
        usleep(1000);
        stat_text = test_read_file(stat_path, NULL);
    }
    assert_non_null(strstr(stat_text, ") Z "));
    free(stat_text);
    plant(host, (long)zombie, "", 0, 1);
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    runlock_release(&a);
    waitpid(zombie, &st, 0);
    /* A live process of this host (this one's parent) is not taken over. */
    plant(host, (long)getppid(), "", 0, 1);
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
}

static void test_same_slurm_job_after_requeue(void **state)
{
    (void)state;
    RunLock a;
    Error err = {0};
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_RESTART_COUNT", "1", 1);
    plant("othernode", 5, "77", 1, 1); /* the same attempt: refused */
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
    plant("othernode", 5, "78", 0, 1); /* another job: refused */
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), -1);
    assert_non_null(strstr(err.msg, "Slurm job 78 (restart 0)"));
    plant("othernode", 5, "77", 0, 1); /* this job before its requeue: taken over */
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    RunLockRecord r;
    char *path = lock_path();
    assert_int_equal(runlock_read(path, &r, &err), 0);
    assert_string_equal(r.job, "77");
    assert_int_equal(r.restart, 1);
    runlock_release(&a);
    free(path);
}

static double mtime_of(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
}

static void test_heartbeat_and_fencing(void **state)
{
    (void)state;
    RunLock a;
    Error err = {0};
    char *path = lock_path();
    assert_int_equal(runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err), 0);
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    double now = (double)t[0].tv_sec;
    t[0].tv_sec -= 100;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
    assert_int_equal(runlock_heartbeat_start(&a, 0.1, &err), 0);
    usleep(400000);
    assert_true(mtime_of(path) > now - 5);
    /* Taken over by another while this holder stood still: the heartbeat stops touching it and the
     * release leaves the other's lock in place. */
    plant("othernode", 7, "", 0, 100);
    usleep(400000);
    assert_true(mtime_of(path) < now - 50);
    assert_false(runlock_held(&a));
    runlock_release(&a);
    assert_int_equal(access(path, F_OK), 0);
    RunLockRecord r;
    assert_int_equal(runlock_read(path, &r, &err), 0);
    assert_string_equal(r.host, "othernode");
    free(path);
}

/* Many processes take one folder at the same moment: exactly one gets it. */
static void test_one_of_many(void **state)
{
    (void)state;
    enum { N = 8 };
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t kids[N];
    for (int i = 0; i < N; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0)
                _exit(3);
            RunLock a;
            Error err = {0};
            int got = runlock_take(&a, dir, "checkpoint.dir", RUNLOCK_STALE_S, &err) == 0;
            usleep(500000); /* hold it while the others try */
            _exit(got ? 0 : err.status == ERROR_INPUT ? 1 : 2);
        }
    }
    close(go[0]);
    close(go[1]); /* EOF: every child goes at once */
    int taken = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        assert_true(WIFEXITED(st));
        taken += WEXITSTATUS(st) == 0;
        refused += WEXITSTATUS(st) == 1;
    }
    assert_int_equal(taken, 1);
    assert_int_equal(refused, N - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_take_refuse_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_and_fresh, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_local_holder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_slurm_job_after_requeue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_heartbeat_and_fencing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_of_many, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
