/*
 * util/trace.h - one rank's timeline, written as a trace file in the JSON dialect that PyTorch's
 * profiler (Kineto) writes: Perfetto and chrome://tracing draw it, and Holistic Trace Analysis
 * (HTA) reads a folder of them, one file per rank, as it reads a PyTorch job's.
 *
 * A Trace collects events in memory while a rank works - complete spans (Trace Event Format phase
 * "X": a name, a category, a process and a thread, a start and a duration in microseconds from the
 * trace's base time) and the names of processes and threads ("M")
 * - and trace_write writes them once, atomically, at the end. Recording copies the event into an
 * array and formats nothing, so that a traced step runs as fast as an untraced one; it is
 * thread-safe (a mutex), since communication threads record their collectives beside the rank's
 * main thread.
 *
 * The file, as HTA needs it (../shared/reference/run-trust-and-timelines.md, section 5):
 *
 *   {
 *    "schemaVersion": 1,
 *    "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
 *    "deviceProperties": [ ... ],
 *    "baseTimeNanoseconds": 1795000000000000000,
 *    "displayTimeUnit": "ms",
 *    "traceName": "...",
 *    "traceEvents": [ {...}, ... ]
 *   }
 *
 * distributedInfo comes before traceEvents and every key is printed with ": " (HTA finds a file's
 * rank with the regular expression "rank":\s+(\d+), the first match in the file). Timestamps are
 * microseconds with three decimals (nanoseconds exact) relative to baseTimeNanoseconds, which every
 * rank of a job sets alike (a wall-clock time rounded down), so that the ranks' spans line up.
 *
 * HTA keeps only events with both "dur" and "cat"; it takes an event for a GPU kernel when its args
 * hold "stream" >= 0 and "correlation" >= 0, and with two or more "ProfilerStep#N" spans it drops
 * every kernel whose correlation matches no host-side event (a "cuda_runtime" launch). It counts a
 * kernel whose name starts with "nccl" as communication, "Memcpy"/"Memset" as memory, anything else
 * as computation: device-side spans are named accordingly.
 */
#ifndef WLB_UTIL_TRACE_H
#define WLB_UTIL_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the file's header says. Strings are copied. */
typedef struct TraceInfo {
    int rank, world_size;
    const char *backend;       /* distributedInfo.backend: "nccl" or "mpi" */
    int64_t base_time_ns;      /* baseTimeNanoseconds: the zero of every ts, alike on all ranks */
    const char *trace_name;    /* traceName, or NULL */
    const char *device_name;   /* deviceProperties[0].name, or NULL for no deviceProperties */
    int device_id;             /* deviceProperties[0].id */
} TraceInfo;

typedef struct Trace Trace;

/* The key of a TraceArg must be a string that outlives the Trace (a literal); a string value is
 * copied. At most TRACE_MAX_ARGS per event. */
enum { TRACE_MAX_ARGS = 12 };
typedef enum { TRACE_ARG_INT, TRACE_ARG_NUM, TRACE_ARG_STR } TraceArgKind;
typedef struct TraceArg {
    const char *key;
    TraceArgKind kind;
    union { /* by kind (one of them: an event's args stay small) */
        int64_t i;
        double f;
        const char *s;
    };
} TraceArg;

/* An event's arguments, filled by the trace_arg_* calls below (extra ones past the limit are
 * dropped: a programming error caught by the tests, never a crash). */
typedef struct TraceArgs {
    int n;
    TraceArg a[TRACE_MAX_ARGS];
} TraceArgs;

static inline void trace_args_init(TraceArgs *args) { args->n = 0; }
void trace_arg_int(TraceArgs *args, const char *key, int64_t v);
void trace_arg_num(TraceArgs *args, const char *key, double v);
void trace_arg_str(TraceArgs *args, const char *key, const char *v);

/* NULL only when memory runs out. */
Trace *trace_new(const TraceInfo *info);
void trace_free(Trace *t);

/* A complete span (phase "X"): cat and name are copied; ts_us and dur_us in microseconds from
 * base_time_ns; args may be NULL. */
void trace_span(Trace *t, const char *cat, const char *name, int pid, int64_t tid, double ts_us,
                double dur_us, const TraceArgs *args);
/* Names (metadata events "process_name", "process_labels", "process_sort_index", "thread_name",
 * "thread_sort_index"); label may be NULL. */
void trace_name_process(Trace *t, int pid, const char *name, const char *label, int sort_index);
void trace_name_thread(Trace *t, int pid, int64_t tid, const char *name, int sort_index);

size_t trace_event_count(const Trace *t);
/* Microseconds of the span events recorded so far on (pid, tid), summed (for checks and tests). */
double trace_busy_us(const Trace *t, int pid, int64_t tid);

/* Writes the file atomically (a temporary name, fsync, rename); the folder must exist. An Error
 * names the path. */
int trace_write(const Trace *t, const char *path, Error *err);
/* The same with extra's events after t's (t's header): two recordings as one file. */
int trace_write_merged(const Trace *t, const Trace *extra, const char *path, Error *err);


/* The steps a run traces (trace.steps): "3-5,10" - step numbers and inclusive ranges, comma
 * separated, at most TRACE_MAX_RANGES of them; "" or NULL: none. */
enum { TRACE_MAX_RANGES = 64 };
typedef struct TraceSteps {
    int n;
    int64_t lo[TRACE_MAX_RANGES], hi[TRACE_MAX_RANGES];
} TraceSteps;
/* -1 with an Error (status 2, naming `where`) on a malformed list: a step below 1, a range that
 * runs backwards, anything but digits, '-' and ','. */
int trace_steps_parse(const char *s, const char *where, TraceSteps *out, Error *err);
/* 1 when step is one of them. */
int trace_steps_has(const TraceSteps *st, int64_t step);
/* The last step of the list (0: none). */
int64_t trace_steps_last(const TraceSteps *st);

#ifdef __cplusplus
}
#endif

#endif
