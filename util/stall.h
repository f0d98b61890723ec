/*
 * util/stall.h - time the process did not run: measured (the stall clock) and, for tests, made.
 *
 * A process that is stopped and continued (SIGSTOP / SIGCONT) or frozen sees nothing of it on its
 * clocks: the time is simply gone between two instructions. The stall clock is a thread that sleeps
 * STALL_TICK_S at a time; when it wakes more than STALL_MIN_S later than that, less the time it
 * waited for a CPU meanwhile (the kernel's run_delay, /proc/thread-self/schedstat: a crowded
 * machine delays every process alike, and a waiting rank crowded out delays nobody), the process
 * was stopped or frozen, and that time is counted - the part of it that counting_s(), a clock of
 * the seconds in which stops count (NULL: all of them), advanced through between the two wake-ups,
 * less what it advanced while the thread waited for a CPU after the stop. Asking at both ends,
 * rather than at the wake-up only, keeps a stop made outside the counted time out when the counted
 * time begins right after it (before this thread woke). Without the schedstat file the whole
 * lateness counts. A wake-up a thousand times a second, each a read of that file, costs a few
 * microseconds.
 *
 * stall_freeze stops the whole process for a while as `kill -STOP` would, and continues it with a
 * timer's SIGCONT: a deterministic stop/continue for the tests (WLBTRAIN_FAULT stall, train.c).
 */
#ifndef WLB_UTIL_STALL_H
#define WLB_UTIL_STALL_H

#include "util/error.h"

#define STALL_TICK_S 0.001
#define STALL_MIN_S 0.01

typedef struct StallClock StallClock;

/* Starts the clock's thread; NULL when it cannot (out of memory, no thread). */
StallClock *stall_clock_start(double (*counting_s)(void));
/* Seconds counted so far (any thread may ask). */
double stall_clock_seconds(const StallClock *s);
/* Ends the thread and frees s (NULL: nothing). */
void stall_clock_stop(StallClock *s);

/* Stops this process (every thread) for `seconds` (0.001 .. 3600), then it runs on. */
int stall_freeze(double seconds, Error *err);

#endif
