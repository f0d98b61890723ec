/* util/stall.c - see stall.h. */
#include "util/stall.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"

struct StallClock {
    pthread_t thread;
    double (*counting_s)(void);
    double started; /* by the starting thread: a stop before the clock's thread first runs counts */
    atomic_int stop;
    atomic_llong stalled_ns;
};

/* The seconds this thread has waited for a CPU while runnable (the second field of
 * /proc/thread-self/schedstat, the kernel's run_delay); 0 without the file (fd < 0). */
static double run_delay_s(int fd)
{
    char buf[96];
    ssize_t n = fd < 0 ? -1 : pread(fd, buf, sizeof buf - 1, 0);
    unsigned long long run_ns, delay_ns;
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return sscanf(buf, "%llu %llu", &run_ns, &delay_ns) == 2 ? (double)delay_ns * 1e-9 : 0;
}

static void *run(void *arg)
{
    StallClock *s = arg;
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    double last = s->started, delay = run_delay_s(fd), counted = s->counting_s ? s->counting_s() : 0;
    while (!atomic_load(&s->stop)) {
        struct timespec tick = {0, (long)(STALL_TICK_S * 1e9)};
        while (nanosleep(&tick, &tick) != 0 && errno == EINTR) {
        }
        /* Late by what it did not wait for a CPU: stopped or frozen, not merely crowded out; of that,
         * the part the counted time ran through (less its run while this thread waited for a CPU). */
        double now = clock_seconds(), now_delay = run_delay_s(fd), now_counted = s->counting_s ? s->counting_s() : 0;
        double waited = now_delay - delay, late = now - last - STALL_TICK_S - waited;
        if (late > STALL_MIN_S) {
            double in = s->counting_s ? now_counted - counted - waited : late;
            in = in < late ? in : late;
            if (in > 0)
                atomic_fetch_add(&s->stalled_ns, (long long)(in * 1e9));
        }
        last = now;
        delay = now_delay;
        counted = now_counted;
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

StallClock *stall_clock_start(double (*counting_s)(void))
{
    StallClock *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->counting_s = counting_s;
    s->started = clock_seconds();
    if (pthread_create(&s->thread, NULL, run, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

double stall_clock_seconds(const StallClock *s)
{
    return s ? (double)atomic_load(&((StallClock *)s)->stalled_ns) * 1e-9 : 0;
}

void stall_clock_stop(StallClock *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    free(s);
}

/* The timer fires every `seconds` until deleted: should the first SIGCONT come before the stop (the
 * process descheduled between arming and raising), the next one continues it. */
int stall_freeze(double seconds, Error *err)
{
    if (!(seconds >= 0.001 && seconds <= 3600))
        return error_set(err, "stall", "a freeze of %g s (0.001 .. 3600)", seconds);
    timer_t timer;
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGCONT;
    if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0)
        return error_errno(err, "stall", "timer_create");
    time_t whole = (time_t)seconds;
    struct timespec t = {whole, (long)((seconds - (double)whole) * 1e9)};
    struct itimerspec when = {t, t};
    if (timer_settime(timer, 0, &when, NULL) != 0) {
        error_errno(err, "stall", "timer_settime");
        timer_delete(timer);
        return -1;
    }
    raise(SIGSTOP);
    timer_delete(timer);
    return 0;
}
