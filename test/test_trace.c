/*
 * test/test_trace.c - util/trace.c's files: what HTA and Perfetto need of them.
 *
 * 1 a trace written and read back as JSON (jansson): the header (schemaVersion, distributedInfo's
 *   backend, rank and world size, deviceProperties, baseTimeNanoseconds), every span with its
 *   category, name, pid, tid, microsecond start and duration (three decimals), and arguments of each
 *   kind (strings with quotes, backslashes and control characters escaped); the metadata
 *   events; distributedInfo before traceEvents and "rank": with a space (HTA's regular expression).
 * 2 recording from several threads at once loses no event, and trace_busy_us sums one thread's spans.
 * 3 a folder that does not exist: an Error naming the path, nothing written.
 * 4 trace_write_merged: the first trace's header, its events and then the second's.
 */
#include "test/testlib.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/trace.h"

static Trace *new_trace(int rank)
{
    TraceInfo info = {.rank = rank, .world_size = 4, .backend = "mpi", .base_time_ns = 1795000000000000000LL,
                      .trace_name = "test", .device_name = "cpu", .device_id = 0};
    Trace *t = trace_new(&info);
    assert_non_null(t);
    return t;
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *path = test_format("%s/rank3.pt.trace.json", dir);
    Trace *t = new_trace(3);
    trace_name_process(t, 0, "rank 3", "CPU 0", 3);
    trace_name_thread(t, 0, 7, "compute", 1);
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_int(&a, "stream", 7);
    trace_arg_int(&a, "correlation", 1000000001);
    trace_arg_num(&a, "predicted_us", 12.5);
    trace_arg_str(&a, "note", "a \"quoted\" \\ name\n");
    trace_span(t, "kernel", "forward", 0, 7, 1234.5675, 10.0004, &a);
    trace_span(t, "user_annotation", "ProfilerStep#2", 0, 1, 1000, 500, NULL);
    assert_int_equal(trace_event_count(t), 7); /* process: 3 metadata events, thread: 2, 2 spans */
    Error err = {0};
    assert_int_equal(trace_write(t, path, &err), 0);
    trace_free(t);

    size_t len;
    char *text = test_read_file(path, &len);
    assert_non_null(text);
    char *rank = strstr(text, "\"rank\": 3"), *events = strstr(text, "\"traceEvents\"");
    assert_non_null(rank);
    assert_non_null(events);
    assert_true(rank < events);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        fail_msg("%s: not JSON: %s at line %d", path, jerr.text, jerr.line);
    assert_int_equal(json_integer_value(json_object_get(root, "schemaVersion")), 1);
    json_t *di = json_object_get(root, "distributedInfo");
    assert_string_equal(json_string_value(json_object_get(di, "backend")), "mpi");
    assert_int_equal(json_integer_value(json_object_get(di, "rank")), 3);
    assert_int_equal(json_integer_value(json_object_get(di, "world_size")), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(root, "deviceProperties"), 0), "name")), "cpu");
    assert_true(json_integer_value(json_object_get(root, "baseTimeNanoseconds")) == 1795000000000000000LL);
    json_t *ev = json_object_get(root, "traceEvents");
    assert_int_equal(json_array_size(ev), 7);
    int spans = 0, meta = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        assert_non_null(json_object_get(e, "cat"));
        if (strcmp(ph, "X") == 0) {
            spans++;
            assert_non_null(json_object_get(e, "dur"));
            if (strcmp(json_string_value(json_object_get(e, "name")), "forward") == 0) {
                assert_float_equal(json_number_value(json_object_get(e, "ts")), 1234.568, 1e-9);
                assert_float_equal(json_number_value(json_object_get(e, "dur")), 10.000, 1e-9);
                assert_int_equal(json_integer_value(json_object_get(e, "tid")), 7);
                json_t *args = json_object_get(e, "args");
                assert_int_equal(json_integer_value(json_object_get(args, "stream")), 7);
                assert_int_equal(json_integer_value(json_object_get(args, "correlation")), 1000000001);
                assert_float_equal(json_number_value(json_object_get(args, "predicted_us")), 12.5, 0);
                assert_string_equal(json_string_value(json_object_get(args, "note")), "a \"quoted\" \\ name\n");
            }
        } else {
            assert_string_equal(ph, "M");
            meta++;
        }
    }
    assert_int_equal(spans, 2);
    assert_int_equal(meta, 5);
    json_decref(root);
    free(text);
    test_rm_rf(dir);
    free(path);
    free(dir);
}

static void *record(void *arg)
{
    Trace *t = arg;
    for (int i = 0; i < 5000; i++)
        trace_span(t, "kernel", "nccl:all_reduce", 0, 9, i, 1, NULL);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    Trace *t = new_trace(0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, record, t), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(trace_event_count(t), 20000);
    assert_float_equal(trace_busy_us(t, 0, 9), 20000, 0);
    assert_float_equal(trace_busy_us(t, 0, 8), 0, 0);
    trace_free(t);
}

static void test_bad_folder(void **state)
{
    (void)state;
    Trace *t = new_trace(0);
    trace_span(t, "kernel", "forward", 0, 1, 0, 1, NULL);
    Error err = {0};
    assert_int_equal(trace_write(t, "/nonexistent-folder/rank0.pt.trace.json", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent-folder/rank0.pt.trace.json"));
    trace_free(t);
}

static void test_merged(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *path = test_format("%s/rank2.pt.trace.json", dir);
    Trace *a = new_trace(2), *b = new_trace(5);
    trace_span(a, "kernel", "forward", 2, 7, 10, 5, NULL);
    trace_span(a, "kernel", "backward", 2, 7, 20, 5, NULL);
    trace_span(b, "kernel", "forward", 99, 7, 11, 4, NULL);
    Error err = {0};
    assert_int_equal(trace_write_merged(a, b, path, &err), 0);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "distributedInfo"), "rank")), 2);
    json_t *ev = json_object_get(root, "traceEvents");
    assert_int_equal(json_array_size(ev), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 1), "name")), "backward");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ev, 2), "pid")), 99);
    json_decref(root);
    trace_free(a);
    trace_free(b);    free(path);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_bad_folder),
        cmocka_unit_test(test_merged),
    };
    return cmocka_run_group_tests_name("trace", tests, NULL, NULL);
}
