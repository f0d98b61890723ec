/* engine/plan/plan_trace.c - the predicted timeline as trace spans (see plan_trace.h). */
#include "engine/plan/plan_trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/fileio.h"

/* ---------------------------------------------------------------------------------------------- */
/* One rank's spans                                                                                */

void plan_trace_lanes(Trace *t, int pid, const char *name, int sort_index)
{
    trace_name_process(t, pid, name, "predicted", sort_index);
    static const struct {
        int tid;
        const char *name;
    } lanes[] = {{PLAN_TRACE_TID_HOST, "host (predicted)"},     {PLAN_TRACE_STREAM_COMPUTE, "stream 7 compute"},
                 {PLAN_TRACE_STREAM_TP, "stream 20 tp"},          {PLAN_TRACE_STREAM_CP, "stream 21 cp"},
                 {PLAN_TRACE_STREAM_DP, "stream 24 dp_cp"},       {PLAN_TRACE_STREAM_PP_RECV, "stream 61 pp recv"}};
    for (size_t i = 0; i < sizeof lanes / sizeof lanes[0]; i++)
        trace_name_thread(t, pid, lanes[i].tid, lanes[i].name, (int)i);
}

/* Where a rank's spans go: the trace, the process, and whether the track lies beside a measured
 * one (PLAN_TRACE_BESIDE). */
typedef struct Out {
    Trace *t;
    int pid;
    unsigned flags;
} Out;

/* A span's ends on the file's grid: nanoseconds, or beside a measured track whole microseconds as
 * the measured spans lie (at a measured run's clock, some 10^10 us, a double's sum of a start and a
 * duration with three decimals is off by 10^-5 us). The start and the end are rounded, the duration
 * is their difference: one span's end is the next one's start exactly, never an overlap by
 * rounding (Perfetto would move it to an overflow track). Returns the duration. */
static double on_grid(const Out *o, double *ts, double dur)
{
    double q = o->flags & PLAN_TRACE_BESIDE ? 1.0 : 1e-3;
    double a = round(*ts / q) * q, b = round((*ts + dur) / q) * q;
    *ts = a;
    return b - a;
}

/* A device-side span on `stream` and its launch on the host thread, linked by a correlation id
 * unique in the trace (args: the span's own, stream, correlation and device added); beside a
 * measured track, the span alone (cat "predicted"): HTA takes no part of it for the rank's device.
 * Nothing for an empty span. */
static void device_span(const Out *o, int stream, const char *name, double ts, double dur, TraceArgs *args)
{
    Trace *t = o->t;
    int pid = o->pid;
    dur = on_grid(o, &ts, dur);
    if (dur <= 0)
        return;
    if (o->flags & PLAN_TRACE_BESIDE) {
        trace_span(t, "predicted", name, pid, stream, ts, dur, args);
        return;
    }
    int64_t corr = PLAN_TRACE_CORRELATION_BASE + (int64_t)trace_event_count(t);
    TraceArgs launch;
    trace_args_init(&launch);
    trace_arg_int(&launch, "correlation", corr);
    trace_span(t, "cuda_runtime", "cudaLaunchKernel", pid, PLAN_TRACE_TID_HOST, ts, 0, &launch);
    trace_arg_int(args, "device", 0);
    trace_arg_int(args, "stream", stream);
    trace_arg_int(args, "correlation", corr);
    trace_span(t, "kernel", name, pid, stream, ts, dur, args);
}

/* A communication span: group, exposed and hidden microseconds, bytes (< 0: unknown). */
static void comm_span(const Out *o, int stream, const char *name, const char *group, double ts, double dur,
                      double exposed_us, double hidden_us, double bytes)
{
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_str(&a, "group", group);
    if (bytes >= 0)
        trace_arg_int(&a, "bytes", (int64_t)bytes);
    trace_arg_num(&a, "exposed_us", exposed_us);
    trace_arg_num(&a, "hidden_us", hidden_us > 0 ? hidden_us : 0);
    device_span(o, stream, name, ts, dur, &a);
}

/* The most tokens a CP rank holds of micro-batch mb (what its messages between stages carry). */
static int64_t rank_tokens_max(const StepPlan *p, const PlanMicroBatch *mb)
{
    int64_t most = 0;
    for (int r = 0; r < p->cp; r++)
        most = p->ranks[mb->first_rank + r].tokens > most ? p->ranks[mb->first_rank + r].tokens : most;
    return most;
}

static int64_t mb_documents(const StepPlan *p, const PlanMicroBatch *mb)
{
    int64_t n = 0;
    for (int64_t d = 0; d < mb->n_docs; d++)
        n += p->docs[mb->first_doc + d].source != PLAN_PAD_SOURCE;
    return n;
}

/* Where pass (backward, k, c) is in stage s's order: pos[((k * v + c) * 2 + backward)]. */
static void pass_positions(const SchedTimeline *tl, int s, int *pos)
{
    const SchedOp *ops = tl->ops + (size_t)s * tl->per_stage;
    for (int i = 0; i < tl->per_stage; i++)
        pos[(ops[i].mb * tl->v + ops[i].chunk) * 2 + ops[i].backward] = i;
}

/* The passes of replica r's stage s, their TP and CP exchanges, and the waits for the messages they
 * receive. */
static void rank_passes(const Out *o, const StepPlan *p, const CostModel *cost, const SchedTimeline *tl, int r, int s,
                        double t0)
{
    int pp = tl->pp, m = tl->m;
    size_t base = ((size_t)r * pp + s) * tl->per_stage;
    for (int i = 0; i < tl->per_stage; i++) {
        SchedOp op = tl->ops[(size_t)s * tl->per_stage + i];
        const PlanMicroBatch *mb = &p->mbs[tl->mb_index[(size_t)r * m + op.mb]];
        if (mb->tokens == 0) /* the trainer skips it: no pass, no message */
            continue;
        int g = op.chunk * pp + s;
        double from = t0 + tl->pass_start[base + i] * 1e6, dur = (tl->pass_end[base + i] - tl->pass_start[base + i]) * 1e6;
        TraceArgs a;
        trace_args_init(&a);
        trace_arg_int(&a, "step", p->step + 1);
        trace_arg_int(&a, "microbatch", op.mb);
        trace_arg_int(&a, "chunk", g);
        trace_arg_int(&a, "stage", s);
        trace_arg_int(&a, "tokens", mb->tokens - mb->pad); /* the data's, as the measured trace counts */
        trace_arg_int(&a, "documents", mb_documents(p, mb));
        trace_arg_num(&a, "predicted_us", dur);
        device_span(o, PLAN_TRACE_STREAM_COMPUTE, op.backward ? "backward" : "forward", from, dur, &a);
        SchedBreakdown parts = {0};
        sched_pass_parts(p, mb, cost, g, op.backward, &parts);
        if (cost->tp > 1) {
            double x = parts.tp_exposed * 1e6, all = x + parts.tp_hidden * 1e6;
            comm_span(o, PLAN_TRACE_STREAM_TP, "ncclKernel_Exchange tp", "tp", from, all < dur ? all : dur, x, all - x, -1);
        }
        if (cost->cp > 1) {
            double x = parts.cp_exposed * 1e6, all = x + parts.cp_hidden * 1e6;
            comm_span(o, PLAN_TRACE_STREAM_CP, "ncclKernel_Exchange cp", "cp", from, all < dur ? all : dur, x, all - x, -1);
        }
        /* The message it receives, as the measured trace draws one: the time the pass waited for it,
         * just before it (the rest of the message moved while the stage computed: hidden_us). Waits
         * come one after another, never two at once; a message that moved hidden is no span. */
        double bytes = cost->p2p_bytes * (double)rank_tokens_max(p, mb), p2p = tl->p2p[(size_t)r * m + op.mb] * 1e6;
        double shown = tl->msg_shown[base + i] * 1e6;
        if (tl->msg_from[base + i] >= 0)
            comm_span(o, PLAN_TRACE_STREAM_PP_RECV, "ncclKernel_Recv pp", "pp", from - shown, shown, shown, p2p - shown,
                      bytes);
    }
}

/* Stage s's collectives over DP x CP: ZeRO-1's all-gather (exposed: what replica r's first forward
 * of each chunk waited for it) and the gradient buckets (exposed: past the stage's last pass); then
 * the contention and the optimizer on the compute stream. */
static void rank_collectives(const Out *o, const CostModel *cost, const SchedTimeline *tl, int r, int s, double t0,
                             const int *pos)
{
    size_t base = ((size_t)r * tl->pp + s) * tl->per_stage;
    for (int c = 0; c < tl->v; c++) {
        double from = tl->gather_from[s * tl->v + c], to = tl->gather_to[s * tl->v + c];
        double shown = tl->gather_shown[base + pos[(0 * tl->v + c) * 2]];
        comm_span(o, PLAN_TRACE_STREAM_DP, "ncclKernel_AllGather dp_cp", "dp_cp", t0 + from * 1e6, (to - from) * 1e6,
                  shown * 1e6, (to - from - shown) * 1e6, -1);
    }
    double end = tl->passes_end[s];
    for (int j = 0; j < tl->n_buckets[s]; j++) {
        size_t at = (size_t)s * tl->max_buckets + j;
        double from = tl->bucket_from[at], to = tl->bucket_to[at], past = from > end ? from : end;
        double shown = to > past ? to - past : 0;
        comm_span(o, PLAN_TRACE_STREAM_DP, cost->zero ? "ncclKernel_ReduceScatter dp_cp" : "ncclKernel_AllReduce dp_cp",
                  "dp_cp", t0 + from * 1e6, (to - from) * 1e6, shown * 1e6, (to - from - shown) * 1e6,
                  4 * tl->bucket_params[at]);
    }
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_str(&a, "note", "the computation slowed by the collectives beside it (comm_sm_share)");
    device_span(o, PLAN_TRACE_STREAM_COMPUTE, "contention", t0 + (end + tl->dp_exposed[s]) * 1e6,
                tl->contention[s] * 1e6, &a);
    trace_args_init(&a);
    device_span(o, PLAN_TRACE_STREAM_COMPUTE, "optimizer", t0 + tl->optimizer_from[s] * 1e6,
                (tl->optimizer_to[s] - tl->optimizer_from[s]) * 1e6, &a);
}

void plan_trace_rank(Trace *t, const StepPlan *p, const CostModel *cost, const SchedTimeline *tl, int world_rank,
                     double t0_us, int pid, unsigned flags)
{
    Out o = {t, pid, flags};
    int tp = cost->tp, cp = cost->cp, pp = tl->pp;
    int s = world_rank / (tp * cp) % pp, r = world_rank / (tp * cp * pp);
    WLB_ASSERT(r < tl->dp);
    char name[48];
    snprintf(name, sizeof name, flags & PLAN_TRACE_BESIDE ? "predicted step %lld" : "ProfilerStep#%lld",
             (long long)p->step + 1);
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_num(&a, "predicted_us", tl->step_s * 1e6);
    double step_ts = t0_us, step_dur = on_grid(&o, &step_ts, tl->step_s * 1e6);
    trace_span(t, flags & PLAN_TRACE_BESIDE ? "predicted" : "user_annotation", name, pid, PLAN_TRACE_TID_HOST, step_ts,
               step_dur, &a);
    size_t n = (size_t)tl->m * tl->v * 2;
    int *pos = malloc(n * sizeof *pos);
    if (!pos) { /* no memory for the lookup: the step span alone (trace_write fails on a lost event anyway) */
        return;
    }
    pass_positions(tl, s, pos);
    rank_passes(&o, p, cost, tl, r, s, t0_us);
    rank_collectives(&o, cost, tl, r, s, t0_us, pos);
    free(pos);
}

int plan_trace_step(Trace *t, const StepPlan *p, const CostModel *cost, int world_rank, double t0_us, int pid,
                    unsigned flags, double *step_us, Error *err)
{
    SchedTimeline tl;
    int rc = sched_step_timeline(p, cost, &tl, err);
    if (rc == 0) {
        plan_trace_rank(t, p, cost, &tl, world_rank, t0_us, pid, flags);
        if (step_us)
            *step_us = tl.step_s * 1e6;
    }
    sched_timeline_free(&tl);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* The dry run's files                                                                             */

void plan_trace_free(PlanTraceOut *o)
{
    for (int i = 0; o->traces && i < o->n; i++)
        trace_free(o->traces[i]);
    free(o->traces);
    free(o->ranks);
    free(o->dir);
    memset(o, 0, sizeof *o);
}

/* The ranks whose files are written: all of them up to PLAN_TRACE_MAX_FILES; beyond, TP rank 0 of
 * every CP rank, stage and replica (the other TP ranks' files are the same) if they fit; else TP and
 * CP rank 0 of every stage of the first replicas. Returns 1 when not all. */
static int pick_ranks(PlanTraceOut *o, const Config *cfg)
{
    const ConfigParallel *par = &cfg->parallel;
    int tp = (int)par->tp, cp = (int)par->cp, pp = (int)par->pp;
    int64_t world = par->tp * par->cp * par->pp * par->dp;
    o->world = (int)world;
    int step = world <= PLAN_TRACE_MAX_FILES ? 1 : world / tp <= PLAN_TRACE_MAX_FILES ? tp : 0;
    if (step) {
        for (int k = 0; k < world; k += step)
            o->ranks[o->n++] = k;
        return step > 1;
    }
    int replicas = PLAN_TRACE_MAX_FILES / pp > 0 ? PLAN_TRACE_MAX_FILES / pp : 1;
    for (int r = 0; r < replicas && r < par->dp; r++)
        for (int s = 0; s < pp && o->n < PLAN_TRACE_MAX_FILES; s++)
            o->ranks[o->n++] = ((r * pp + s) * cp) * tp;
    return 1;
}

int plan_trace_open(PlanTraceOut *o, const Config *cfg, const char *sub, Error *err)
{
    memset(o, 0, sizeof *o);
    if (!cfg->trace.steps)
        return 0;
    if (trace_steps_parse(cfg->trace.steps, "trace.steps", &o->steps, err) != 0)
        return -1;
    o->text = cfg->trace.steps;
    const char *dir = cfg->trace.dir, *ck = cfg->checkpoint.dir;
    size_t len = (dir ? strlen(dir) : ck ? strlen(ck) + 8 : 6) + strlen(sub) + 2;
    if (!(o->dir = malloc(len)) || !(o->ranks = malloc(PLAN_TRACE_MAX_FILES * sizeof *o->ranks)) ||
        !(o->traces = calloc(PLAN_TRACE_MAX_FILES, sizeof *o->traces))) {
        plan_trace_free(o);
        return error_runtime(err, "trace", "out of memory");
    }
    if (dir)
        snprintf(o->dir, len, "%s/%s", dir, sub);
    else if (ck)
        snprintf(o->dir, len, "%s/traces/%s", ck, sub);
    else
        snprintf(o->dir, len, "traces/%s", sub);
    if (pick_ranks(o, cfg) && !strcmp(sub, "predicted"))
        fprintf(stderr, "wlbtrain: note: trace.steps: %d ranks: the predicted timelines of %d of them (%s), at most "
                        "%d files\n", o->world, o->n, o->ranks[1] - o->ranks[0] == cfg->parallel.tp && o->n > 1 ?
                        "TP rank 0 of every CP rank, stage and replica" : "TP and CP rank 0 of every stage of the "
                        "first replicas", PLAN_TRACE_MAX_FILES);
    /* Every file shares one base time, a wall-clock time floored to a day, as Kineto's do. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t base = ((int64_t)now.tv_sec / 86400) * 86400 * INT64_C(1000000000);
    for (int i = 0; i < o->n; i++) {
        TraceInfo info = {.rank = o->ranks[i], .world_size = o->world,
                          .backend = cfg->train.device == DEVICE_CUDA ? "nccl" : "mpi", .base_time_ns = base,
                          .trace_name = sub,
                          .device_name = config_hardware_name(cfg->balance.hardware), .device_id = 0};
        if (!(o->traces[i] = trace_new(&info))) {
            o->n = i;
            plan_trace_free(o);
            return error_runtime(err, "trace", "out of memory");
        }
        char name[48];
        snprintf(name, sizeof name, "rank %d (predicted)", o->ranks[i]);
        plan_trace_lanes(o->traces[i], o->ranks[i], name, o->ranks[i]);
    }
    return 0;
}

int plan_trace_add_step(PlanTraceOut *o, const StepPlan *p, const CostModel *cost, double step_s, Error *err)
{
    if (o->n == 0)
        return 0;
    double t0 = o->t_us;
    o->t_us += step_s * 1e6;
    o->planned++;
    if (!trace_steps_has(&o->steps, p->step + 1))
        return 0;
    SchedTimeline tl;
    int rc = sched_step_timeline(p, cost, &tl, err);
    for (int i = 0; rc == 0 && i < o->n; i++)
        plan_trace_rank(o->traces[i], p, cost, &tl, o->ranks[i], t0, o->ranks[i], 0);
    sched_timeline_free(&tl);
    o->traced += rc == 0;
    return rc;
}

int plan_trace_close(PlanTraceOut *o, Error *err)
{
    if (o->n == 0)
        return 0;
    if (o->traced == 0) {
        fprintf(stderr, "wlbtrain: warning: trace.steps: '%s': none of these steps is among the %lld planned: no "
                        "timeline written\n", o->text, (long long)o->planned);
        return 0;
    }
    size_t len = strlen(o->dir) + 48;
    char *path = malloc(len);
    if (!path)
        return error_runtime(err, "trace", "out of memory");
    int rc = 0;
    for (int i = 0; rc == 0 && i < o->n; i++) {
        snprintf(path, len, "%s/rank%d.pt.trace.json", o->dir, o->ranks[i]);
        if ((i == 0 && file_make_parents(path, err) != 0) || trace_write(o->traces[i], path, err) != 0)
            rc = -1;
    }
    free(path);
    if (rc == 0)
        printf("trace: the predicted timelines of %lld step%s of %d rank%s in %s/\n", (long long)o->traced,
               o->traced == 1 ? "" : "s", o->n, o->n == 1 ? "" : "s", o->dir);
    return rc;
}
