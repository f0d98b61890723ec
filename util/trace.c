/* util/trace.c - see trace.h. */
#include "util/trace.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fileio.h"

typedef struct TraceEvent {
    char phase;            /* 'X' or 'M' */
    const char *cat;       /* in the arena */
    const char *name;      /* in the arena */
    int pid;
    int64_t tid;
    double ts, dur;        /* microseconds */
    int sort_index;        /* 'M': the sort index, or -1 */
    int n_args;
    TraceArg *args;        /* n_args of them in the arena (an event stays small: most have few), string
                            * values too */
} TraceEvent;

/* Strings live in blocks that never move, so that events can point into them. */
typedef struct ArenaBlock {
    struct ArenaBlock *next;
    size_t used, size;
    char data[];
} ArenaBlock;

enum { INTERN_SLOTS = 512 };

struct Trace {
    pthread_mutex_t lock;
    TraceInfo info;        /* strings in the arena */
    TraceEvent *events;
    size_t n, cap;
    ArenaBlock *arena;
    int out_of_memory;     /* an event was dropped: trace_write fails rather than write a partial file */
    /* The names, categories and string values recorded so far, each copied once (a trace repeats a
     * few strings thousands of times): open addressing by content, full: copied each time. */
    const char *interned[INTERN_SLOTS];
};

/* len bytes in the arena, 8-byte aligned (the caller holds the lock, or the Trace is not shared
 * yet); NULL when memory runs out. */
static void *arena_alloc(Trace *t, size_t len)
{
    ArenaBlock *b = t->arena;
    size_t at = b ? (b->used + 7) & ~(size_t)7 : 0;
    if (!b || at > b->size || b->size - at < len) {
        size_t size = len > 65536 ? len : 65536;
        ArenaBlock *nb = malloc(sizeof *nb + size);
        if (!nb)
            return NULL;
        nb->next = b;
        nb->used = 0;
        nb->size = size;
        t->arena = b = nb;
        at = 0;
    }
    void *p = b->data + at;
    b->used = at + len;
    return p;
}

/* A copy of s in the arena. */
static const char *arena_copy(Trace *t, const char *s)
{
    if (!s)
        return NULL;
    size_t len = strlen(s) + 1;
    char *p = arena_alloc(t, len);
    if (p)
        memcpy(p, s, len);
    return p;
}

/* s in the arena, the same copy for the same text (FNV-1a over its bytes picks the slot). */
static const char *intern(Trace *t, const char *s)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 16777619u;
    for (int k = 0; k < 8; k++) {
        const char **slot = &t->interned[(h + (uint32_t)k) % INTERN_SLOTS];
        if (!*slot)
            return *slot = arena_copy(t, s);
        if (!strcmp(*slot, s))
            return *slot;
    }
    return arena_copy(t, s);
}

static void arg_add(TraceArgs *args, const char *key, TraceArgKind kind, int64_t i, double f, const char *s)
{
    if (args->n >= TRACE_MAX_ARGS)
        return;
    TraceArg *a = &args->a[args->n++];
    a->key = key;
    a->kind = kind;
    if (kind == TRACE_ARG_INT)
        a->i = i;
    else if (kind == TRACE_ARG_NUM)
        a->f = f;
    else
        a->s = s;
}

void trace_arg_int(TraceArgs *args, const char *key, int64_t v) { arg_add(args, key, TRACE_ARG_INT, v, 0, NULL); }
void trace_arg_num(TraceArgs *args, const char *key, double v) { arg_add(args, key, TRACE_ARG_NUM, 0, v, NULL); }
void trace_arg_str(TraceArgs *args, const char *key, const char *v) { arg_add(args, key, TRACE_ARG_STR, 0, 0, v); }

Trace *trace_new(const TraceInfo *info)
{
    Trace *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return NULL;
    }
    t->info = *info;
    t->info.backend = arena_copy(t, info->backend ? info->backend : "mpi");
    t->info.trace_name = arena_copy(t, info->trace_name);
    t->info.device_name = arena_copy(t, info->device_name);
    if (!t->info.backend || (info->trace_name && !t->info.trace_name) ||
        (info->device_name && !t->info.device_name)) {
        trace_free(t);
        return NULL;
    }
    return t;
}

void trace_free(Trace *t)
{
    if (!t)
        return;
    for (ArenaBlock *b = t->arena, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(t->events);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* Appends an event with its args (under the lock), copying its strings and args; on out of memory
 * it is dropped and the Trace remembers it. */
static void add(Trace *t, const TraceEvent *e, const TraceArgs *args)
{
    pthread_mutex_lock(&t->lock);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        TraceEvent *ev = realloc(t->events, cap * sizeof *ev);
        if (!ev) {
            t->out_of_memory = 1;
            pthread_mutex_unlock(&t->lock);
            return;
        }
        t->events = ev;
        t->cap = cap;
    }
    TraceEvent *d = &t->events[t->n];
    *d = *e;
    d->cat = intern(t, e->cat);
    d->name = intern(t, e->name);
    int ok = d->cat && d->name;
    d->n_args = args ? args->n : 0;
    d->args = NULL;
    if (d->n_args > 0) {
        d->args = arena_alloc(t, (size_t)d->n_args * sizeof *d->args);
        ok = ok && d->args;
        for (int i = 0; ok && i < d->n_args; i++) {
            d->args[i] = args->a[i];
            if (args->a[i].kind == TRACE_ARG_STR) {
                d->args[i].s = intern(t, args->a[i].s ? args->a[i].s : "");
                ok = ok && d->args[i].s;
            }
        }
    }
    if (ok)
        t->n++;
    else
        t->out_of_memory = 1;
    pthread_mutex_unlock(&t->lock);
}

void trace_span(Trace *t, const char *cat, const char *name, int pid, int64_t tid, double ts_us,
                double dur_us, const TraceArgs *args)
{
    TraceEvent e = {.phase = 'X', .cat = cat, .name = name, .pid = pid, .tid = tid, .ts = ts_us,
                    .dur = dur_us < 0 ? 0 : dur_us, .sort_index = -1};
    add(t, &e, args);
}

static void add_meta(Trace *t, const char *name, int pid, int64_t tid, const char *key, const char *value,
                     int sort_index)
{
    TraceEvent e = {.phase = 'M', .cat = "__metadata", .name = name, .pid = pid, .tid = tid,
                    .sort_index = sort_index};
    TraceArgs a;
    trace_args_init(&a);
    if (value)
        trace_arg_str(&a, key, value);
    add(t, &e, &a);
}

void trace_name_process(Trace *t, int pid, const char *name, const char *label, int sort_index)
{
    add_meta(t, "process_name", pid, 0, "name", name, -1);
    if (label)
        add_meta(t, "process_labels", pid, 0, "labels", label, -1);
    add_meta(t, "process_sort_index", pid, 0, NULL, NULL, sort_index);
}

void trace_name_thread(Trace *t, int pid, int64_t tid, const char *name, int sort_index)
{
    add_meta(t, "thread_name", pid, tid, "name", name, -1);
    add_meta(t, "thread_sort_index", pid, tid, NULL, NULL, sort_index);
}

size_t trace_event_count(const Trace *t)
{
    pthread_mutex_lock((pthread_mutex_t *)&t->lock);
    size_t n = t->n;
    pthread_mutex_unlock((pthread_mutex_t *)&t->lock);
    return n;
}

double trace_busy_us(const Trace *t, int pid, int64_t tid)
{
    double sum = 0;
    pthread_mutex_lock((pthread_mutex_t *)&t->lock);
    for (size_t i = 0; i < t->n; i++)
        if (t->events[i].phase == 'X' && t->events[i].pid == pid && t->events[i].tid == tid)
            sum += t->events[i].dur;
    pthread_mutex_unlock((pthread_mutex_t *)&t->lock);
    return sum;
}

/* s as a JSON string, quotes included. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void put_args(FILE *f, const TraceEvent *e)
{
    if (e->n_args == 0 && e->sort_index < 0)
        return;
    fputs(", \"args\": {", f);
    for (int i = 0; i < e->n_args; i++) {
        const TraceArg *a = &e->args[i];
        if (i)
            fputs(", ", f);
        put_string(f, a->key);
        fputs(": ", f);
        if (a->kind == TRACE_ARG_INT)
            fprintf(f, "%" PRId64, a->i);
        else if (a->kind == TRACE_ARG_NUM)
            fprintf(f, "%.9g", a->f);
        else
            put_string(f, a->s);
    }
    if (e->sort_index >= 0)
        fprintf(f, "%s\"sort_index\": %d", e->n_args ? ", " : "", e->sort_index);
    fputc('}', f);
}

static void put_event(FILE *f, const TraceEvent *e)
{
    fprintf(f, "  {\"ph\": \"%c\", \"cat\": ", e->phase);
    put_string(f, e->cat);
    fputs(", \"name\": ", f);
    put_string(f, e->name);
    fprintf(f, ", \"pid\": %d, \"tid\": %" PRId64, e->pid, e->tid);
    if (e->phase != 'M')
        fprintf(f, ", \"ts\": %.3f", e->ts);
    if (e->phase == 'X')
        fprintf(f, ", \"dur\": %.3f", e->dur);
    put_args(f, e);
    fputc('}', f);
}

int trace_write(const Trace *t, const char *path, Error *err) { return trace_write_merged(t, NULL, path, err); }

int trace_write_merged(const Trace *t, const Trace *extra, const char *path, Error *err)
{
    if (t->out_of_memory || (extra && extra->out_of_memory))
        return error_runtime(err, path, "the trace ran out of memory while recording: not written");
    AtomicFile a;
    if (atomic_open(&a, path, err) != 0)
        return -1;
    FILE *f = a.f;
    const TraceInfo *in = &t->info;
    fprintf(f, "{\n \"schemaVersion\": 1,\n \"distributedInfo\": {\"backend\": ");
    put_string(f, in->backend);
    fprintf(f, ", \"rank\": %d, \"world_size\": %d},\n", in->rank, in->world_size);
    if (in->device_name) {
        fprintf(f, " \"deviceProperties\": [{\"id\": %d, \"name\": ", in->device_id);
        put_string(f, in->device_name);
        fputs("}],\n", f);
    }
    fprintf(f, " \"baseTimeNanoseconds\": %" PRId64 ",\n \"displayTimeUnit\": \"ms\",\n", in->base_time_ns);
    if (in->trace_name) {
        fputs(" \"traceName\": ", f);
        put_string(f, in->trace_name);
        fputs(",\n", f);
    }
    fputs(" \"traceEvents\": [\n", f);
    size_t n_extra = extra ? extra->n : 0;
    for (size_t i = 0; i < t->n + n_extra; i++) {
        put_event(f, i < t->n ? &t->events[i] : &extra->events[i - t->n]);
        fputs(i + 1 < t->n + n_extra ? ",\n" : "\n", f);
    }
    fputs(" ]\n}\n", f);
    if (ferror(f)) {
        atomic_abort(&a);
        return error_errno(err, path, "cannot write");
    }
    return atomic_commit(&a, err);
}

int trace_steps_parse(const char *s, const char *where, TraceSteps *out, Error *err)
{
    out->n = 0;
    if (!s)
        return 0;
    const char *p = s;
    while (*p == ' ')
        p++;
    if (!*p)
        return 0;
    for (;;) {
        int64_t v[2] = {0, 0};
        int parts = 0;
        for (; parts < 2; parts++) {
            while (*p == ' ')
                p++;
            if (*p < '0' || *p > '9')
                return error_set(err, where, "expected step numbers and ranges such as 3-5,10, got '%s'", s);
            while (*p >= '0' && *p <= '9') {
                if (v[parts] > (INT64_MAX - 9) / 10)
                    return error_set(err, where, "step number too large in '%s'", s);
                v[parts] = v[parts] * 10 + (*p++ - '0');
            }
            while (*p == ' ')
                p++;
            if (*p != '-' || parts == 1)
                break;
            p++;
        }
        if (parts == 0)
            v[1] = v[0];
        if (v[0] < 1 || v[1] < v[0])
            return error_set(err, where, "steps count from 1 and a range runs upwards (such as 3-5), got '%s'", s);
        if (out->n == TRACE_MAX_RANGES)
            return error_set(err, where, "more than %d ranges in '%s'", TRACE_MAX_RANGES, s);
        out->lo[out->n] = v[0];
        out->hi[out->n] = v[1];
        out->n++;
        if (!*p)
            return 0;
        if (*p != ',')
            return error_set(err, where, "expected step numbers and ranges such as 3-5,10, got '%s'", s);
        p++;
    }
}

int trace_steps_has(const TraceSteps *st, int64_t step)
{
    for (int i = 0; i < st->n; i++)
        if (step >= st->lo[i] && step <= st->hi[i])
            return 1;
    return 0;
}

int64_t trace_steps_last(const TraceSteps *st)
{
    int64_t last = 0;
    for (int i = 0; i < st->n; i++)
        last = st->hi[i] > last ? st->hi[i] : last;
    return last;
}
