/*
 * test/test_stall.c - util/stall.h: stall_freeze stops the process for the time asked and it runs
 * on; the stall clock counts such a stop while its counting() says so and not otherwise (the
 * straggler's view of a rank stopped inside a collective, engine/train/train_straggler.c).
 */
#include "test/testlib.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/stall.h"

/* The counted clock of the test: runs while counting_now (set through counting_set). */
static int counting_now;
static double counting_since, counting_total;
static double counting(void) { return counting_total + (counting_now ? clock_seconds() - counting_since : 0); }
static void counting_set(int on)
{
    double now = clock_seconds();
    if (counting_now && !on)
        counting_total += now - counting_since;
    counting_since = now;
    counting_now = on;
}

/* What the clock counted once its thread has run after a stop: it looks when it next wakes, which
 * on a loaded machine may take a while - waits until the count passes `above`, at most 2 s. */
static double counted_after(const StallClock *s, double above)
{
    for (int i = 0; i < 200 && stall_clock_seconds(s) <= above; i++) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return stall_clock_seconds(s);
}

static void test_freeze_stops_the_process(void **state)
{
    (void)state;
    Error err = {0};
    double t0 = clock_seconds();
    assert_int_equal(stall_freeze(0.2, &err), 0);
    double took = clock_seconds() - t0;
    printf("# stall_freeze(0.2) took %.3f s\n", took);
    assert_true(took >= 0.19);
    assert_int_equal(stall_freeze(0, &err), -1);
    assert_int_equal(err.status, 2);
    assert_string_equal(err.msg, "stall: a freeze of 0 s (0.001 .. 3600)");
}

static void test_clock_counts_stops_while_counting(void **state)
{
    (void)state;
    Error err = {0};
    StallClock *s = stall_clock_start(counting);
    assert_non_null(s);
    /* First a stop while not counting, then (its wake-up seen: the clock's thread runs within the
     * pause, long before the next stop) one while counting: only the second is counted. */
    counting_set(0);
    assert_int_equal(stall_freeze(0.3, &err), 0);
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    double before = stall_clock_seconds(s);
    counting_set(1);
    assert_int_equal(stall_freeze(0.3, &err), 0);
    double counted = counted_after(s, before);
    printf("# stopped 0.3 s while not counting: %.3f s counted; then 0.3 s while counting: %.3f s in all\n", before,
           counted);
    assert_true(before < 0.05);
    assert_true(counted >= 0.25 && counted <= 0.5);
    /* A stop outside the counted time that ends just before the counted time begins - before the
     * clock's thread has woken to see the stop - is not counted (a rank stopped outside the comm
     * layer that enters a collective at once when continued). */
    counting_set(0);
    nanosleep(&pause, NULL);
    double ahead = stall_clock_seconds(s);
    assert_int_equal(stall_freeze(0.3, &err), 0);
    counting_set(1);
    nanosleep(&pause, NULL);
    double after = stall_clock_seconds(s);
    printf("# stopped 0.3 s just before the counted time began: %.3f s counted\n", after - ahead);
    assert_true(after - ahead < 0.05);
    stall_clock_stop(s);
    assert_true(stall_clock_seconds(NULL) == 0);
    stall_clock_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freeze_stops_the_process),
        cmocka_unit_test(test_clock_counts_stops_while_counting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
