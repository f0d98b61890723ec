/*
 * bench/trace_record.c - the cost of recording one event of a measured timeline (trace.steps), on
 * one core: the hot path of a traced collective as engine/comm records it (comm_trace.h: the
 * accounting's two state changes, two clock readings, the device-side span with its args and its
 * host-side launch, and a flow's two ends when it was issued before it ran), repeated, timed with
 * the monotonic clock; the best of several rounds (the least disturbed by other processes), in
 * nanoseconds per event of the file (a span, a launch and a flow end are one event each).
 * bench/trace_overhead.sh multiplies it by the events a rank records per step.
 *
 * Usage: trace_record [--spans N] [--rounds R]   (default 200000 spans, 7 rounds). Prints one line:
 *   ns_per_event N  ns_per_span N  events_per_span N
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_trace.h"
#include "util/clock.h"

static double one_round(int64_t spans, double *events_per_span)
{
    TraceInfo info = {.rank = 0, .world_size = 1, .backend = "mpi", .base_time_ns = 0, .trace_name = "bench",
                      .device_name = NULL, .device_id = 0};
    Trace *trace = trace_new(&info);
    CommTracer t;
    if (!trace || comm_tracer_init(&t, trace, 0, 1, 0) != 0) {
        fprintf(stderr, "trace_record: out of memory\n");
        exit(1);
    }
    comm_tracer_set_on(&t, 1, clock_seconds());
    double t0 = clock_seconds();
    for (int64_t i = 0; i < spans; i++) {
        /* as comm_trace_begin / comm_trace_end: a collective on the TP group, issued before it ran on
         * every other one (a flow) */
        double a = clock_seconds();
        comm_tracer_account(&t, 0, 1, a);
        double b = clock_seconds();
        comm_tracer_account(&t, 0, -1, b);
        comm_trace_record(&t, COMM_TRACE_ALLGATHER, GROUP_TP, 4096, -1, i % 2 ? a - 1e-5 : a, 0, a, b + 2e-6);
    }
    double s = clock_seconds() - t0;
    *events_per_span = (double)trace_event_count(trace) / (double)spans;
    comm_tracer_free(&t);
    trace_free(trace);
    return s;
}

int main(int argc, char **argv)
{
    int64_t spans = 200000;
    int rounds = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--spans") && i + 1 < argc)
            spans = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: trace_record [--spans N] [--rounds R]\n");
            return 2;
        }
    }
    if (spans < 1 || rounds < 1) {
        fprintf(stderr, "trace_record: --spans and --rounds must be positive\n");
        return 2;
    }
    double best = -1, per = 0;
    for (int r = 0; r < rounds; r++) {
        double s = one_round(spans, &per);
        best = best < 0 || s < best ? s : best;
    }
    printf("ns_per_event %.1f  ns_per_span %.1f  events_per_span %.2f\n", best * 1e9 / (per * (double)spans),
           best * 1e9 / (double)spans, per);
    return 0;
}
