/* engine/train/train_trace.c - measured timelines of chosen steps (see train_trace.h). */
#include "engine/train/train_trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/plan/cost.h"
#include "engine/plan/plan_trace.h"
#include "util/clock.h"
#include "util/fileio.h"

/* The trace folder: trace.dir, else checkpoint.dir/traces, else traces. */
static void trace_root(const Config *cfg, char *buf, size_t size)
{
    if (cfg->trace.dir)
        snprintf(buf, size, "%s", cfg->trace.dir);
    else if (cfg->checkpoint.dir)
        snprintf(buf, size, "%s/traces", cfg->checkpoint.dir);
    else
        snprintf(buf, size, "traces");
}

static double realtime_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void name_lanes(TrainTrace *tt, const Comm *c, int rank)
{
    Trace *t = tt->trace;
    char name[64];
    snprintf(name, sizeof name, "rank %d host", rank);
    trace_name_process(t, tt->tracer.host_pid, name, NULL, 2 * rank);
    trace_name_thread(t, tt->tracer.host_pid, COMM_TRACE_HOST_TID, "main thread", 0);
    snprintf(name, sizeof name, "rank %d device", rank);
    trace_name_process(t, tt->tracer.device_pid, name, "GPU", 2 * rank + 1);
    trace_name_thread(t, tt->tracer.device_pid, COMM_TRACE_STREAM_COMPUTE, "stream 7 compute", 0);
    for (int g = 0; g < GROUP_COUNT; g++)
        if (g == GROUP_TP || g == GROUP_CP || g == GROUP_PP || g == GROUP_DP || g == GROUP_DPCP ||
            g == GROUP_WORLD || comm_group_made(c, (LayoutGroup)g)) {
            snprintf(name, sizeof name, "stream %d %s", COMM_TRACE_STREAM_GROUP + g,
                     tt->tracer.names[COMM_TRACE_ALLREDUCE][g] + strlen("ncclKernel_AllReduce "));
            trace_name_thread(t, tt->tracer.device_pid, COMM_TRACE_STREAM_GROUP + g, name, 1 + g);
        }
    trace_name_thread(t, tt->tracer.device_pid, COMM_TRACE_STREAM_SEND, "stream 60 pp send", 40);
    trace_name_thread(t, tt->tracer.device_pid, COMM_TRACE_STREAM_RECV, "stream 61 pp recv", 41);
}

int train_trace_open(Trainer *tr, Error *err)
{
    const Config *cfg = tr->cfg;
    tr->trace = NULL;
    if (!cfg->trace.steps)
        return 0;
    TrainTrace *tt = calloc(1, sizeof *tt);
    if (!tt)
        return error_runtime(err, "trace", "out of memory");
    tr->trace = tt;
    if (trace_steps_parse(cfg->trace.steps, "trace.steps", &tt->steps, err) != 0)
        return -1;
    tt->last_step = trace_steps_last(&tt->steps);
    tt->timer_ref = -1;
    char root[4000], mark[4200];
    trace_root(cfg, root, sizeof root);
    snprintf(tt->dir, sizeof tt->dir, "%s/measured", root);
    snprintf(tt->both_dir, sizeof tt->both_dir, "%s/measured-predicted", root);
    snprintf(mark, sizeof mark, "%s/x", tt->dir);
    char mark2[4200];
    snprintf(mark2, sizeof mark2, "%s/x", tt->both_dir);
    if (tr->lay.rank == 0 && (file_make_parents(mark, err) != 0 || file_make_parents(mark2, err) != 0))
        return -1;
    /* The clocks: rank 0's base time for all, each rank's offset from rank 0. */
    Comm *c = tr->comm;
    double offset = 0, rtt = 0, base = 0;
    if (comm_clock_offset(c, 20, &offset, &rtt, err) != 0)
        return -1;
    if (tr->lay.rank == 0)
        base = floor(realtime_s() / 86400.0) * 86400.0; /* the day: ts stay small, ns exact */
    if (comm_broadcast(c, GROUP_WORLD, 0, &base, sizeof base, err) != 0)
        return -1;
    /* Other ranks make the folder too (rank 0's may not be visible yet on a shared file system). */
    if (tr->lay.rank != 0 && (file_make_parents(mark, err) != 0 || file_make_parents(mark2, err) != 0))
        return -1;
    double shift = realtime_s() - clock_seconds() + offset - base;
    int world = comm_world_size(c);
    char name[160];
    snprintf(name, sizeof name, "wlbtrain rank %d of %d, steps %s (clock offset from rank 0 %.1f us, ping %.1f us)",
             tr->lay.rank, world, cfg->trace.steps, offset * 1e6, rtt * 1e6);
    TraceInfo info = {tr->lay.rank, world, c->impl->name, (int64_t)base * 1000000000LL, name, tr->backend->name,
                      tr->backend->device_id ? (int)tr->backend->device_id() : 0};
    if (!(tt->trace = trace_new(&info)) || !(tt->predicted = trace_new(&info)) || !(tt->votes = calloc((size_t)world * 3 + 3, sizeof *tt->votes)) ||
        !(tt->fig.compute_s = calloc((size_t)world * 3, sizeof(double))))
        return error_runtime(err, "trace", "out of memory");
    tt->fig.world = world;
    tt->fig.comm_s = tt->fig.compute_s + world;
    tt->fig.idle_s = tt->fig.compute_s + 2 * world;
    if (comm_tracer_init(&tt->tracer, tt->trace, tr->lay.rank, (int)getpid(), shift) != 0)
        return error_runtime(err, "trace", "cannot make a mutex");
    name_lanes(tt, c, tr->lay.rank);
    plan_trace_lanes(tt->predicted, TRAIN_TRACE_PID_PREDICTED, "predicted", 2 * world + tr->lay.rank);
    c->tracer = &tt->tracer;
    if (tr->lay.rank == 0) {
        printf("trace: steps %s, one file per rank in %s (clock offsets measured by pings with rank 0)\n",
               cfg->trace.steps, tt->dir);
        fflush(stdout);
    }
    return 0;
}

static int write_file(Trainer *tr, Error *err)
{
    TrainTrace *tt = tr->trace;
    char path[4200];
    snprintf(path, sizeof path, "%s/rank%d.pt.trace.json", tt->dir, tr->lay.rank);
    tt->written = 1;
    if (trace_write(tt->trace, path, err) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/rank%d.pt.trace.json", tt->both_dir, tr->lay.rank);
    return trace_write_merged(tt->trace, tt->predicted, path, err);
}

int train_trace_close(Trainer *tr, Error *err)
{
    TrainTrace *tt = tr->trace;
    if (!tt)
        return 0;
    int rc = 0;
    if (tt->trace && !tt->written && trace_event_count(tt->trace) > 0)
        rc = write_file(tr, err);
    if (tr->comm && tr->comm->tracer == &tt->tracer) {
        tr->comm->tracer = NULL;
        comm_tracer_free(&tt->tracer);
    }
    trace_free(tt->trace);
    trace_free(tt->predicted);
    free(tt->votes);
    free(tt->fig.compute_s);
    free(tt);
    tr->trace = NULL;
    return rc;
}

void train_trace_step_begin(Trainer *tr, int64_t step)
{
    TrainTrace *tt = tr->trace;
    if (!tt || !trace_steps_has(&tt->steps, step))
        return;
    tt->step_t0 = clock_seconds();
    comm_tracer_set_on(&tt->tracer, 1, tt->step_t0);
    train_trace_timer_start(tr);
}

double *train_trace_votes(Trainer *tr, int64_t step, double *votes, int *n)
{
    TrainTrace *tt = tr->trace;
    *n = 3;
    if (!tt || !trace_steps_has(&tt->steps, step))
        return votes;
    *n = 3 + 3 * tt->fig.world;
    return tt->votes;
}

void train_trace_step_stop(Trainer *tr, int64_t step, double *slots)
{
    TrainTrace *tt = tr->trace;
    if (!tt || !trace_steps_has(&tt->steps, step))
        return;
    double t1 = clock_seconds();
    comm_tracer_set_on(&tt->tracer, 0, t1);
    if (tt->timer_ref >= 0)
        train_trace_timer_spans(&tt->tracer, tr->ops, tt->timer_ref, tt->timer_ref_s, tr->sched, tr->n_sched,
                                tr->pass_timed, tr->lay.pp_rank, tr->pp, step);
    char name[48];
    snprintf(name, sizeof name, "ProfilerStep#%lld", (long long)step);
    TraceArgs a;
    trace_args_init(&a);
    trace_arg_int(&a, "step", step);
    trace_span(tt->trace, "user_annotation", name, tt->tracer.host_pid, COMM_TRACE_HOST_TID,
               comm_trace_us(&tt->tracer, tt->step_t0), (t1 - tt->step_t0) * 1e6, &a);
    /* The rank's own accounting of the step (comm_trace.h): the sums now less the sums at the last
     * traced step's end, in this rank's slots (the others' 0: the vote's maximum gathers them). */
    double now[3];
    comm_tracer_sums(&tt->tracer, &now[0], &now[1], &now[2]);
    memset(slots, 0, (size_t)tt->fig.world * 3 * sizeof *slots);
    for (int j = 0; j < 3; j++) {
        slots[3 * tr->lay.rank + j] = now[j] - tt->sums[j];
        tt->sums[j] = now[j];
    }
}

int train_trace_step_predicted(Trainer *tr, int64_t step, Error *err)
{
    TrainTrace *tt = tr->trace;
    if (!tt || !trace_steps_has(&tt->steps, step))
        return 0;
    /* PLAN_TRACE_BESIDE: in measured-predicted/ beside the measured events, on their whole-microsecond
     * grid and out of HTA's view (which would count its spans as the rank's device's). */
    return plan_trace_step(tt->predicted, &tr->plan, &tr->cost, tr->lay.rank, comm_trace_us(&tt->tracer, tt->step_t0),
                           TRAIN_TRACE_PID_PREDICTED, PLAN_TRACE_BESIDE, NULL, err);
}

int train_trace_step_end(Trainer *tr, int64_t step, const double *slots, Error *err)
{
    TrainTrace *tt = tr->trace;
    if (!tt)
        return 0;
    tt->fig.traced = trace_steps_has(&tt->steps, step);
    for (int r = 0; tt->fig.traced && r < tt->fig.world; r++) {
        tt->fig.compute_s[r] = slots[3 * r];
        tt->fig.comm_s[r] = slots[3 * r + 1];
        tt->fig.idle_s[r] = slots[3 * r + 2];
    }
    /* Written after the step after the last traced one: what a traced step started (ZeRO-1's
     * parameter gathers) is waited for, and so recorded, by then. */
    if (!tt->written && step >= tt->last_step + 1)
        return write_file(tr, err);
    return 0;
}

static void put_array(FILE *f, const char *key, const double *v, int n)
{
    fprintf(f, ",\"%s\":[", key);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%.6f", i ? "," : "", v[i]);
    fputc(']', f);
}

void train_trace_write_metrics(FILE *f, const Trainer *tr)
{
    const TrainTrace *tt = tr->trace;
    if (!tt || !tt->fig.traced)
        return;
    put_array(f, "trace_compute_s", tt->fig.compute_s, tt->fig.world);
    put_array(f, "trace_comm_s", tt->fig.comm_s, tt->fig.world);
    put_array(f, "trace_idle_s", tt->fig.idle_s, tt->fig.world);
}

double train_trace_host_begin(const Trainer *tr) { return train_trace_on(tr) ? clock_seconds() : 0; }

double train_trace_step_host_begin(const Trainer *tr, int64_t step)
{
    return tr->trace && trace_steps_has(&tr->trace->steps, step) ? clock_seconds() : 0;
}

void train_trace_host_end(Trainer *tr, const char *name, double t0)
{
    if (t0 <= 0 || !tr->trace)
        return;
    CommTracer *t = &tr->trace->tracer;
    trace_span(t->trace, "user_annotation", name, t->host_pid, COMM_TRACE_HOST_TID, comm_trace_us(t, t0),
               (clock_seconds() - t0) * 1e6, NULL);
}

double train_trace_compute_begin(Trainer *tr)
{
    if (!train_trace_on(tr))
        return 0;
    double t0 = clock_seconds();
    comm_tracer_account(&tr->trace->tracer, 1, 0, t0);
    return t0;
}

/* The predicted seconds of pass (backward?) of micro-batch mb through global chunk g: the plan's
 * per-layer time of its slowest CP rank over the chunk's layers. */
static double predicted_s(const Trainer *tr, const PlanMicroBatch *mb, int g, int backward)
{
    return (backward ? mb->bwd_s : mb->fwd_s) * cost_chunk_layers(&tr->cost, g);
}

static void pass_args(TraceArgs *a, const StepPlan *plan, const PlanMicroBatch *mb, int64_t step, int k, int g, int s,
                      double predicted)
{
    trace_args_init(a);
    trace_arg_int(a, "step", step);
    trace_arg_int(a, "microbatch", k);
    trace_arg_int(a, "chunk", g);
    trace_arg_int(a, "stage", s);
    if (mb) {
        trace_arg_int(a, "tokens", mb->tokens - mb->pad);
        trace_arg_int(a, "documents", mb->n_docs);
    }
    if (predicted >= 0)
        trace_arg_num(a, "predicted_us", predicted * 1e6);
    (void)plan;
}

void train_trace_pass_end(Trainer *tr, const char *name, const StepPlan *plan, int i, int k, int c, double t0)
{
    if (t0 <= 0 || !tr->trace)
        return;
    CommTracer *t = &tr->trace->tracer;
    double t1 = clock_seconds();
    comm_tracer_account(t, -1, 0, t1);
    if (tr->ops->timer_mark && name[0] != 'e')
        return; /* the device's own spans, from its timer (train_trace_timer_spans) */
    int s = tr->lay.pp_rank, g = c * tr->pp + s, backward = name[0] == 'b';
    const PlanMicroBatch *mb = &plan->mbs[tr->mb_index[k]];
    TraceArgs a;
    pass_args(&a, plan, mb, plan->step + 1, k, g, s, predicted_s(tr, mb, g, backward));
    trace_arg_int(&a, "pass", i);
    comm_trace_device_span(t, name, COMM_TRACE_STREAM_COMPUTE, t0, t1, t0, comm_trace_correlation(t), &a);
}

void train_trace_compute_end(Trainer *tr, const char *name, double t0)
{
    if (t0 <= 0 || !tr->trace)
        return;
    CommTracer *t = &tr->trace->tracer;
    double t1 = clock_seconds();
    comm_tracer_account(t, -1, 0, t1);
    comm_trace_device_span(t, name, COMM_TRACE_STREAM_COMPUTE, t0, t1, t0, comm_trace_correlation(t), NULL);
}

void train_trace_timer_start(Trainer *tr)
{
    TrainTrace *tt = tr->trace;
    tt->timer_ref = -1;
    if (!tr->ops->timer_mark)
        return;
    tr->ops->sync();
    tt->timer_ref = 2 * tr->n_sched;
    tt->timer_ref_s = clock_seconds();
    tr->ops->timer_mark(tt->timer_ref);
}

void train_trace_timer_spans(CommTracer *t, const Ops *ops, int ref, double ref_s, const SchedOp *sched, int n,
                             const int *timed, int stage, int pp, int64_t step)
{
    for (int i = 0; i < n; i++) {
        if (!timed[i])
            continue;
        const SchedOp *op = &sched[i];
        double t0 = ref_s + ops->timer_seconds(ref, 2 * i), t1 = t0 + ops->timer_seconds(2 * i, 2 * i + 1);
        TraceArgs a;
        pass_args(&a, NULL, NULL, step, op->mb, op->chunk * pp + stage, stage, -1);
        trace_arg_int(&a, "pass", i);
        comm_trace_device_span(t, op->backward ? "backward" : "forward", COMM_TRACE_STREAM_COMPUTE, t0, t1, t0,
                               comm_trace_correlation(t), &a);
    }
}
