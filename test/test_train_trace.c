/*
 * test/test_train_trace.c - the pieces of the measured timelines (trace.steps) that run without MPI:
 *
 * 1 trace.steps: "3-5,10" and the like parsed into ranges (which steps are in, the last one), and
 *   every malformed list an Error of status 2 naming the key.
 * 2 the rank's own accounting (comm_tracer_account): computing counts before communicating, idle
 *   only between two busy times (HTA's idle lies inside the span of the device-side events), time
 *   never counted twice, nothing outside a traced window; a collective running on past the window's
 *   end counted and drawn up to it (its span cut), one after it not drawn.
 * 3 the device timer's spans (train_trace_timer_spans, the CUDA backend's passes): with a fake
 *   timer (marks at known times), every timed pass becomes one span on the compute stream at the
 *   reference's host time plus its mark's offset, its duration the time between its two marks, its
 *   args (microbatch, chunk = local chunk x pp + stage, stage, stream, correlation >= 1e6), and a
 *   cudaLaunchKernel host event with the same correlation (HTA drops a kernel without one); untimed
 *   passes none.
 */
#include "test/testlib.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train_trace.h"

static void test_steps(void **state)
{
    (void)state;
    TraceSteps st;
    Error err = {0};
    assert_int_equal(trace_steps_parse("3-5,10", "trace.steps", &st, &err), 0);
    assert_int_equal(st.n, 2);
    for (int64_t s = 1; s <= 12; s++)
        assert_int_equal(trace_steps_has(&st, s), (s >= 3 && s <= 5) || s == 10);
    assert_int_equal(trace_steps_last(&st), 10);
    assert_int_equal(trace_steps_parse(" 7 , 2 - 3", "trace.steps", &st, &err), 0);
    assert_int_equal(st.n, 2);
    assert_true(trace_steps_has(&st, 2) && trace_steps_has(&st, 3) && trace_steps_has(&st, 7));
    assert_false(trace_steps_has(&st, 4));
    assert_int_equal(trace_steps_last(&st), 7);
    assert_int_equal(trace_steps_parse("", "trace.steps", &st, &err), 0);
    assert_int_equal(st.n, 0);
    assert_int_equal(trace_steps_parse(NULL, "trace.steps", &st, &err), 0);
    assert_int_equal(st.n, 0);
    assert_false(trace_steps_has(&st, 1));
    const char *bad[] = {"0", "5-3", "a", "3-", "1,,2", "-2", "3,", "2-4-6", "1;2", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Error e = {0};
        assert_int_equal(trace_steps_parse(bad[i], "trace.steps", &st, &e), -1);
        assert_int_equal(e.status, 2);
        assert_non_null(strstr(e.msg, "trace.steps"));
    }
}

static Trace *new_trace(void)
{
    TraceInfo info = {.rank = 1, .world_size = 2, .backend = "mpi", .base_time_ns = 0, .trace_name = "test",
                      .device_name = NULL, .device_id = 0};
    Trace *t = trace_new(&info);
    assert_non_null(t);
    return t;
}

static void test_accounting(void **state)
{
    (void)state;
    Trace *trace = new_trace();
    CommTracer t;
    assert_int_equal(comm_tracer_init(&t, trace, 1, 2, 0), 0);
    double c, m, i;
    comm_tracer_account(&t, 0, 1, 0.5);  /* before the window: not counted */
    comm_tracer_account(&t, 0, -1, 0.7);
    comm_tracer_set_on(&t, 1, 0.8);
    comm_tracer_account(&t, 0, 1, 1.0);  /* idle before the first busy time: not counted */
    comm_tracer_account(&t, 1, 0, 1.5);  /* comm 1.0 .. 1.5 alone */
    comm_tracer_account(&t, 0, -1, 2.0); /* computing over it: compute */
    comm_tracer_account(&t, -1, 0, 3.0); /* compute 1.5 .. 3.0 */
    comm_tracer_sums(&t, &c, &m, &i);
    assert_float_equal(c, 1.5, 1e-12);
    assert_float_equal(m, 0.5, 1e-12);
    assert_float_equal(i, 0.0, 1e-12);
    comm_tracer_account(&t, 0, 1, 4.0);  /* idle 3.0 .. 4.0, between two busy times */
    comm_tracer_account(&t, 0, 1, 4.2);  /* a second communication in flight */
    comm_tracer_account(&t, 0, -1, 4.4);
    comm_tracer_account(&t, 0, -1, 4.5); /* comm 4.0 .. 4.5 once, not twice */
    comm_tracer_sums(&t, &c, &m, &i);
    assert_float_equal(c, 1.5, 1e-12);
    assert_float_equal(m, 1.0, 1e-12);
    assert_float_equal(i, 1.0, 1e-12);
    comm_tracer_account(&t, 1, 0, 6.0);
    comm_tracer_account(&t, -1, 0, 6.25);
    comm_tracer_sums(&t, &c, &m, &i);
    assert_float_equal(c, 1.75, 1e-12);
    assert_float_equal(i, 2.5, 1e-12);
    /* The sums fill the span from the first busy time to the last exactly. */
    assert_float_equal(c + m + i, 6.25 - 1.0, 1e-12);
    /* A collective running on past the window's end (7.5): accounted up to it, its span cut there;
     * one that runs after it is not drawn; the idle time up to the next window's first busy time
     * runs from the cut. */
    comm_tracer_account(&t, 0, 1, 7.0);
    comm_tracer_set_on(&t, 0, 7.5);
    comm_tracer_account(&t, 0, -1, 9.0);
    comm_trace_record(&t, COMM_TRACE_ALLGATHER, GROUP_DP, 64, -1, 6.9, 0, 7.0, 9.0);
    comm_trace_record(&t, COMM_TRACE_ALLGATHER, GROUP_DP, 64, -1, 7.2, 0, 8.0, 8.5);
    comm_tracer_sums(&t, &c, &m, &i);
    assert_float_equal(m, 1.5, 1e-12);
    assert_float_equal(i, 2.5 + 0.75, 1e-12);
    assert_float_equal(trace_busy_us(trace, 1, COMM_TRACE_STREAM_GROUP + GROUP_DP), 0.5e6, 1.0);
    comm_tracer_set_on(&t, 1, 10.0);
    comm_tracer_account(&t, 1, 0, 11.0);
    comm_tracer_account(&t, -1, 0, 12.0);
    comm_tracer_sums(&t, &c, &m, &i);
    assert_float_equal(i, 3.25 + 3.5, 1e-12);
    assert_float_equal(c, 2.75, 1e-12);
    comm_tracer_free(&t);
    trace_free(trace);
}

/* The fake device timer: mark i recorded at marks_s[i]. */
static const double marks_s[] = {0.010, 0.030, 0.031, 0.0315, 0.040, 0.070, 0.005};
static void fake_mark(int i) { (void)i; }
static double fake_seconds(int a, int b) { return marks_s[b] - marks_s[a]; }

static json_t *find_event(json_t *events, const char *cat, int64_t correlation)
{
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        json_t *args = json_object_get(e, "args");
        if (!strcmp(json_string_value(json_object_get(e, "cat")), cat) && args &&
            json_integer_value(json_object_get(args, "correlation")) == correlation)
            return e;
    }
    return NULL;
}

static void test_timer_spans(void **state)
{
    (void)state;
    Trace *trace = new_trace();
    CommTracer t;
    double shift = 1000.0; /* trace us = (s + shift) 1e6 */
    assert_int_equal(comm_tracer_init(&t, trace, 5, 77, shift), 0);
    Ops ops;
    memset(&ops, 0, sizeof ops);
    ops.timer_mark = fake_mark;
    ops.timer_seconds = fake_seconds;
    SchedOp sched[3] = {{0, 0, 1}, {0, 1, 0}, {1, 0, 1}}; /* forward mb 0 chunk 1, forward mb 1, backward mb 0 */
    int timed[3] = {1, 0, 1};
    double ref_s = 50.0;
    train_trace_timer_spans(&t, &ops, 6, ref_s, sched, 3, timed, 1, 2, 4);
    char *dir = test_tmpdir(), *path = test_format("%s/rank1.pt.trace.json", dir);
    Error err = {0};
    assert_int_equal(trace_write(trace, path, &err), 0);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    json_t *events = json_object_get(root, "traceEvents");
    int kernels = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "cat")), "kernel") != 0)
            continue;
        kernels++;
        json_t *args = json_object_get(e, "args");
        int pass = (int)json_integer_value(json_object_get(args, "pass"));
        assert_true(pass == 0 || pass == 2);
        const SchedOp *op = &sched[pass];
        assert_string_equal(json_string_value(json_object_get(e, "name")), op->backward ? "backward" : "forward");
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), 5);
        assert_int_equal(json_integer_value(json_object_get(e, "tid")), COMM_TRACE_STREAM_COMPUTE);
        assert_int_equal(json_integer_value(json_object_get(args, "stream")), COMM_TRACE_STREAM_COMPUTE);
        assert_int_equal(json_integer_value(json_object_get(args, "microbatch")), op->mb);
        assert_int_equal(json_integer_value(json_object_get(args, "chunk")), op->chunk * 2 + 1);
        assert_int_equal(json_integer_value(json_object_get(args, "stage")), 1);
        assert_int_equal(json_integer_value(json_object_get(args, "step")), 4);
        double start = (ref_s + marks_s[2 * pass] - marks_s[6] + shift) * 1e6;
        double dur = (marks_s[2 * pass + 1] - marks_s[2 * pass]) * 1e6;
        assert_float_equal(json_number_value(json_object_get(e, "ts")), nearbyint(start), 1e-6);
        assert_float_equal(json_number_value(json_object_get(e, "dur")), dur, 1.0);
        int64_t corr = json_integer_value(json_object_get(args, "correlation"));
        assert_true(corr >= 1000000);
        json_t *launch = find_event(events, "cuda_runtime", corr);
        assert_non_null(launch);
        assert_string_equal(json_string_value(json_object_get(launch, "name")), "cudaLaunchKernel");
        assert_int_equal(json_integer_value(json_object_get(launch, "pid")), 77);
        assert_true(json_number_value(json_object_get(launch, "ts")) <= json_number_value(json_object_get(e, "ts")));
    }
    assert_int_equal(kernels, 2);
    json_decref(root);
    comm_tracer_free(&t);
    trace_free(trace);    free(path);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_timer_spans),
    };
    return cmocka_run_group_tests_name("train_trace", tests, NULL, NULL);
}
