/*
 * test/test_plan_trace.c - the dry run's predicted timeline (engine/plan/plan_trace.c): a step of
 * the planner recorded for every rank of a layout, written as trace files and read back (jansson).
 * On tp 2 x pp 2, cp 2 x dp 2 (ZeRO-1), tp = cp = pp = dp = 2, pp 4 interleaved (v 2) and pp 2 x dp 2
 * without overlap:
 *
 * 1 every rank holds all its stage's passes (micro-batches x chunks x 2), in the order
 *   sched_stage_ops gives its stage (1F1B, or interleaved), as (name, microbatch, chunk) by start time;
 * 2 no two spans of a rank's compute stream overlap, nor of any other lane (to the nanosecond), and
 *   the step's ProfilerStep span lasts sched_step_time's seconds;
 * 3 the passes keep the pipeline's dependencies across the ranks' files: a forward starts after the
 *   previous chunk's forward of its micro-batch ended (on the previous stage), a backward after the
 *   next chunk's backward (or its own forward on the last chunk);
 * 4 on every stage's rank of the slowest replica, the exposed_us of its tp, cp, pp and dp spans add up
 *   to the dry run's time breakdown of that step (sched_step_breakdown), and the compute stream's gaps
 *   minus the exposed pp and dp time to its bubble;
 * 5 every device-side span has a stream, a correlation id >= 2e9 and one cudaLaunchKernel with that id
 *   at its start (what HTA needs to keep it);
 * 6 trace.steps as the dry run reads it (util/trace.h's parser): the steps, and errors of status 2;
 * 7 the dry run's files: every rank of 16; of 1024 ranks (over PLAN_TRACE_MAX_FILES) TP rank 0 of each
 *   CP rank, stage and replica; of 8192, TP and CP rank 0 of every stage of the first replicas.
 */
#include "test/testlib.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/plan/cost.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_trace.h"
#include "engine/plan/sched.h"

enum { N_DOCS = 3000 };

typedef struct Fixture {
    Config cfg;
    CostModel cost;
    uint32_t lens[N_DOCS];
    DataStream stream;
    Planner pl;
    StepPlan plan;
} Fixture;

/* A planned step (the second: the wlb packer's queues have had a step) of the layout in yaml. */
static void setup(Fixture *f, const char *yaml)
{
    Error err = {0};
    memset(f, 0, sizeof *f);
    config_init(&f->cfg);
    if (config_apply_set(&f->cfg, "parallel.stage_layers=even", &err) != 0 ||
        config_load_string(&f->cfg, yaml, "t.yaml", &err) != 0 || config_resolve(&f->cfg, 0, &err) != 0 ||
        cost_model_init(&f->cost, &f->cfg, &err) != 0) {
        print_error("%s\n", err.msg);
        fail();
    }
    uint64_t total = 0;
    for (int i = 0; i < N_DOCS; i++) {
        f->lens[i] = 20 + (uint32_t)((i * 7919) % 600) + (i % 37 == 0 ? 900 : 0);
        total += f->lens[i];
    }
    DataSource src = data_source_from_lengths(f->lens, N_DOCS, total);
    assert_int_equal(data_stream_init(&f->stream, &src, NULL, 1, 3, (uint64_t)f->cfg.data.context_window, &err), 0);
    assert_int_equal(plan_init(&f->pl, &f->cfg, &f->cost, &f->stream, f->cfg.balance.packer,
                               f->cfg.balance.cp_sharding, &err), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(plan_step(&f->pl, &f->plan, &err), 0);
    for (int64_t i = 0; i < (int64_t)f->plan.dp * f->plan.m; i++)
        assert_true(f->plan.mbs[i].tokens > 0); /* no empty micro-batch: every pass is drawn */
}

static void teardown(Fixture *f)
{
    plan_free(&f->plan);
    plan_destroy(&f->pl);
    data_stream_free(&f->stream);
    config_free(&f->cfg);
}

/* One span read back. */
typedef struct Span {
    const char *name, *cat;
    int64_t tid, mb, chunk, corr;
    double ts, dur, exposed;
} Span;

static int64_t arg_int(json_t *args, const char *key)
{
    json_t *v = json_object_get(args, key);
    return v ? json_integer_value(v) : -1;
}

/* The X events of a trace file, in file order; *root to json_decref. */
static Span *read_spans(const char *path, int *n, json_t **root)
{
    json_error_t jerr;
    *root = json_load_file(path, 0, &jerr);
    if (!*root) {
        print_error("%s: %s\n", path, jerr.text);
        fail();
    }
    json_t *events = json_object_get(*root, "traceEvents");
    Span *s = calloc(json_array_size(events) + 1, sizeof *s);
    assert_non_null(s);
    *n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X"))
            continue;
        json_t *args = json_object_get(e, "args");
        Span *x = &s[(*n)++];
        x->name = json_string_value(json_object_get(e, "name"));
        x->cat = json_string_value(json_object_get(e, "cat"));
        x->tid = json_integer_value(json_object_get(e, "tid"));
        x->ts = json_number_value(json_object_get(e, "ts"));
        x->dur = json_number_value(json_object_get(e, "dur"));
        x->mb = arg_int(args, "microbatch");
        x->chunk = arg_int(args, "chunk");
        x->corr = arg_int(args, "correlation");
        json_t *ex = json_object_get(args, "exposed_us");
        x->exposed = ex ? json_number_value(ex) : 0;
        if (arg_int(args, "stream") >= 0)
            assert_int_equal(arg_int(args, "stream"), x->tid);
    }
    return s;
}

static int is_pass(const Span *s) { return !strcmp(s->name, "forward") || !strcmp(s->name, "backward"); }

static int by_ts(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* Passes of a rank's file sorted by start. */
static Span *passes(Span *all, int n, int *np)
{
    Span *p = calloc((size_t)n + 1, sizeof *p);
    assert_non_null(p);
    *np = 0;
    for (int i = 0; i < n; i++)
        if (is_pass(&all[i]))
            p[(*np)++] = all[i];
    qsort(p, (size_t)*np, sizeof *p, by_ts);
    return p;
}

/* The spans lie on a nanosecond grid (their ends rounded): sums of a few hundred spans' durations
 * agree to this. */
static void near(double got, double want, const char *what, int rank)
{
    double tol = 0.2 + 1e-9 * fabs(want);
    if (fabs(got - want) > tol) {
        print_error("rank %d: %s: %.4f us in the trace, %.4f us in the dry run's figures\n", rank, what, got, want);
        fail();
    }
}

static void check_layout(const char *yaml)
{
    Fixture f;
    setup(&f, yaml);
    Error err = {0};
    const CostModel *c = &f.cost;
    int tp = c->tp, cp = c->cp, pp = c->pp, v = c->v, dp = f.plan.dp, m = f.plan.m, world = tp * cp * pp * dp;
    SchedTimeline tl;
    assert_int_equal(sched_step_timeline(&f.plan, c, &tl, &err), 0);
    double step_s, t0 = 5000;
    SchedBreakdown *bd = calloc((size_t)pp, sizeof *bd);
    assert_non_null(bd);
    assert_int_equal(sched_step_breakdown(&f.plan, c, &step_s, bd, &err), 0);
    char *dir = test_tmpdir();
    Span **spans = calloc((size_t)world, sizeof *spans), **ps = calloc((size_t)world, sizeof *ps);
    int *ns = calloc((size_t)world, sizeof *ns), *nps = calloc((size_t)world, sizeof *nps);
    json_t **roots = calloc((size_t)world, sizeof *roots);
    SchedOp *ops = malloc((size_t)2 * m * v * sizeof *ops);
    assert_true(spans && ps && ns && nps && roots && ops);
    for (int rank = 0; rank < world; rank++) {
        TraceInfo info = {.rank = rank, .world_size = world, .backend = "mpi", .base_time_ns = 0};
        Trace *t = trace_new(&info);
        assert_non_null(t);
        plan_trace_lanes(t, rank, "predicted", rank);
        plan_trace_rank(t, &f.plan, c, &tl, rank, t0, rank, 0);
        char *path = test_format("%s/rank%d.pt.trace.json", dir, rank);
        assert_int_equal(trace_write(t, path, &err), 0);
        trace_free(t);
        spans[rank] = read_spans(path, &ns[rank], &roots[rank]);
        ps[rank] = passes(spans[rank], ns[rank], &nps[rank]);
        free(path);
    }
    for (int rank = 0; rank < world; rank++) {
        int s = rank / (tp * cp) % pp, r = rank / (tp * cp * pp);
        /* 1: the stage's passes in its schedule's order */
        int n = sched_stage_ops(s, pp, v, m, ops);
        assert_int_equal(nps[rank], n);
        assert_int_equal(n, 2 * m * v);
        for (int i = 0; i < n; i++) {
            const Span *x = &ps[rank][i];
            if (strcmp(x->name, ops[i].backward ? "backward" : "forward") || x->mb != ops[i].mb ||
                x->chunk != ops[i].chunk * pp + s) {
                print_error("rank %d pass %d: %s mb %lld chunk %lld, the schedule's %s mb %d chunk %d\n", rank, i,
                            x->name, (long long)x->mb, (long long)x->chunk, ops[i].backward ? "backward" : "forward",
                            ops[i].mb, ops[i].chunk * pp + s);
                fail();
            }
        }
        /* 2: the compute stream never runs two spans at once; the step span */
        int nc = 0;
        Span *comp = calloc((size_t)ns[rank] + 1, sizeof *comp);
        assert_non_null(comp);
        double busy = 0, exposed[4] = {0}; /* tp, cp, pp, dp */
        int have_step = 0;
        for (int i = 0; i < ns[rank]; i++) {
            const Span *x = &spans[rank][i];
            if (x->tid == PLAN_TRACE_STREAM_COMPUTE) {
                comp[nc++] = *x;
                busy += x->dur;
            }
            int lane = x->tid == PLAN_TRACE_STREAM_TP ? 0 : x->tid == PLAN_TRACE_STREAM_CP ? 1
                     : x->tid == PLAN_TRACE_STREAM_PP_RECV ? 2 : x->tid == PLAN_TRACE_STREAM_DP ? 3 : -1;
            if (lane >= 0)
                exposed[lane] += x->exposed;
            if (!strncmp(x->name, "ProfilerStep#", 13)) {
                have_step = 1;
                char want[48];
                snprintf(want, sizeof want, "ProfilerStep#%lld", (long long)f.plan.step + 1);
                assert_string_equal(x->name, want);
                near(x->ts, t0, "step start", rank);
                near(x->dur, step_s * 1e6, "step", rank);
            }
        }
        assert_true(have_step);
        qsort(comp, (size_t)nc, sizeof *comp, by_ts);
        for (int i = 1; i < nc; i++)
            if (comp[i].ts < comp[i - 1].ts + comp[i - 1].dur - 0.002) {
                print_error("rank %d: %s at %.3f overlaps %s [%.3f, %.3f]\n", rank, comp[i].name, comp[i].ts,
                            comp[i - 1].name, comp[i - 1].ts, comp[i - 1].ts + comp[i - 1].dur);
                fail();
            }
        assert_true(comp[0].ts >= t0 - 0.002 && comp[nc - 1].ts + comp[nc - 1].dur <= t0 + step_s * 1e6 + 0.002);
        free(comp);
        /* ... nor any other device-side lane (Perfetto moves a span that overlaps another on its lane
         * without nesting to an overflow track) */
        Span *lane = calloc((size_t)ns[rank] + 1, sizeof *lane);
        assert_non_null(lane);
        for (int tid = 2; tid < 64; tid++) {
            int nl = 0;
            for (int i = 0; i < ns[rank]; i++)
                if (spans[rank][i].tid == tid)
                    lane[nl++] = spans[rank][i];
            qsort(lane, (size_t)nl, sizeof *lane, by_ts);
            for (int i = 1; i < nl; i++)
                if (lane[i].ts < lane[i - 1].ts + lane[i - 1].dur - 1e-6) {
                    print_error("rank %d lane %d: %s at %.3f overlaps %s [%.3f, %.3f]\n", rank, tid, lane[i].name,
                                lane[i].ts, lane[i - 1].name, lane[i - 1].ts, lane[i - 1].ts + lane[i - 1].dur);
                    fail();
                }
        }
        free(lane);
        /* 3: dependencies across the ranks (the same TP and CP rank of the neighbouring stage) */
        for (int i = 0; i < nps[rank]; i++) {
            const Span *x = &ps[rank][i];
            int back = !strcmp(x->name, "backward"), g = (int)x->chunk, from = back ? g + 1 : g - 1;
            const char *want = back ? "backward" : "forward";
            if (back && g == pp * v - 1) {
                from = g;
                want = "forward";
            }
            if (from < 0)
                continue;
            int other = rank + ((from % pp) - s) * tp * cp;
            const Span *y = NULL;
            for (int j = 0; j < nps[other] && !y; j++)
                if (ps[other][j].mb == x->mb && ps[other][j].chunk == from && !strcmp(ps[other][j].name, want))
                    y = &ps[other][j];
            assert_non_null(y);
            if (x->ts < y->ts + y->dur - 0.002) {
                print_error("rank %d: %s mb %lld chunk %d starts at %.3f, before %s chunk %d ends (%.3f)\n", rank,
                            x->name, (long long)x->mb, g, x->ts, want, from, y->ts + y->dur);
                fail();
            }
        }
        /* 4: the slowest replica's exposed communication and bubble are the time breakdown's */
        if (r == tl.slowest && rank % (tp * cp) == 0) {
            const SchedBreakdown *b = &bd[s];
            near(exposed[0], b->tp_exposed * 1e6, "tp exposed", rank);
            near(exposed[1], b->cp_exposed * 1e6, "cp exposed", rank);
            near(exposed[2], b->pp_exposed * 1e6, "pp exposed", rank);
            near(exposed[3], b->dp_exposed * 1e6, "dp exposed", rank);
            double gaps = step_s * 1e6 - busy;
            near(gaps - exposed[2] - exposed[3], b->bubble * 1e6, "bubble", rank);
        }
        /* 5: every device-side span has its launch */
        for (int i = 0; i < ns[rank]; i++) {
            const Span *x = &spans[rank][i];
            if (strcmp(x->cat, "kernel"))
                continue;
            assert_true(x->corr >= PLAN_TRACE_CORRELATION_BASE);
            int launches = 0;
            for (int j = 0; j < ns[rank]; j++)
                launches += !strcmp(spans[rank][j].cat, "cuda_runtime") && spans[rank][j].corr == x->corr &&
                            spans[rank][j].tid == PLAN_TRACE_TID_HOST && fabs(spans[rank][j].ts - x->ts) < 0.002;
            assert_int_equal(launches, 1);
        }
    }
    for (int rank = 0; rank < world; rank++) {
        free(spans[rank]);
        free(ps[rank]);
        json_decref(roots[rank]);
    }
    free(spans);
    free(ps);
    free(ns);
    free(nps);
    free(roots);
    free(ops);
    free(bd);
    sched_timeline_free(&tl);
    test_rm_rf(dir);
    free(dir);
    teardown(&f);
}

static void test_tp2_pp2(void **state)
{
    (void)state;
    check_layout("model: {preset: tiny}\nparallel: {tp: 2, pp: 2, dp: 1}\n"
                 "data: {context_window: 1024, global_batch_tokens: 8192}\nbalance: {packer: wlb}\n");
}

static void test_cp2_dp2_zero(void **state)
{
    (void)state;
    check_layout("model: {preset: tiny}\nparallel: {cp: 2, dp: 2, zero: 1}\n"
                 "data: {context_window: 1024, global_batch_tokens: 8192}\n"
                 "balance: {packer: wlb, cp_sharding: per_doc}\n");
}

static void test_4d(void **state)
{
    (void)state;
    check_layout("model: {preset: tiny}\nparallel: {tp: 2, cp: 2, pp: 2, dp: 2}\n"
                 "data: {context_window: 512, global_batch_tokens: 4096}\n"
                 "balance: {packer: wlb, cp_sharding: hybrid}\n");
}

static void test_pp4_interleaved(void **state)
{
    (void)state;
    check_layout("model: {preset: tiny, n_layers: 8}\nparallel: {pp: 4, virtual_stages: 2, dp: 1}\n"
                 "data: {context_window: 1024, global_batch_tokens: 8192}\nbalance: {packer: fixed}\n");
}

static void test_pp2_dp2_no_overlap(void **state)
{
    (void)state;
    check_layout("model: {preset: tiny}\nparallel: {pp: 2, dp: 2, overlap: false}\n"
                 "data: {context_window: 1024, global_batch_tokens: 16384}\nbalance: {packer: wlb}\n");
}

/* The dry run reads trace.steps with util/trace.h's parser: the steps it draws. */
static void test_steps(void **state)
{
    (void)state;
    TraceSteps s;
    Error err = {0};
    assert_int_equal(trace_steps_parse("3-5,10", "trace.steps", &s, &err), 0);
    int64_t want[] = {3, 4, 5, 10};
    for (int64_t k = 1; k <= 12; k++) {
        int in = 0;
        for (int i = 0; i < 4; i++)
            in |= want[i] == k;
        assert_int_equal(trace_steps_has(&s, k), in);
    }
    static const char *bad[] = {"0", "5-3", "3-", "-3", "a", "3,,4", "1.5", "2-x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Error e = {0};
        assert_int_equal(trace_steps_parse(bad[i], "trace.steps", &s, &e), -1);
        assert_int_equal(e.status, ERROR_INPUT);
        assert_non_null(strstr(e.msg, "trace.steps"));
    }
}

static void test_which_ranks(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        int files, every; /* files; 1: every rank, 2: TP rank 0, 3: TP and CP rank 0 of the first replicas */
    } cases[] = {{"model: {preset: tiny}\nparallel: {tp: 2, cp: 2, pp: 2, dp: 2}\ntrace: {steps: 1}\n", 16, 1},
                 {"model: {preset: llama3.1-8b}\nparallel: {tp: 8, cp: 4, pp: 4, dp: 8}\ntrace: {steps: 1}\n", 128, 2},
                 {"model: {preset: llama3.1-8b}\nparallel: {tp: 8, cp: 4, pp: 4, dp: 64}\ntrace: {steps: 1}\n", 256, 3}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Config cfg;
        Error err = {0};
        config_init(&cfg);
        assert_int_equal(config_load_string(&cfg, cases[k].yaml, "t.yaml", &err), 0);
        if (config_resolve(&cfg, 0, &err) != 0) {
            print_error("%s\n", err.msg);
            fail();
        }
        PlanTraceOut o;
        assert_int_equal(plan_trace_open(&o, &cfg, "predicted", &err), 0);
        assert_int_equal(o.n, cases[k].files);
        int tp = (int)cfg.parallel.tp, cp = (int)cfg.parallel.cp, pp = (int)cfg.parallel.pp;
        for (int i = 0; i < o.n; i++) {
            if (cases[k].every < 3) {
                assert_int_equal(o.ranks[i], i * (cases[k].every == 1 ? 1 : tp));
                continue;
            }
            /* TP and CP rank 0; stage i % pp of replica i / pp */
            assert_int_equal(o.ranks[i] % (tp * cp), 0);
            assert_int_equal(o.ranks[i] / (tp * cp) % pp, i % pp);
            assert_int_equal(o.ranks[i] / (tp * cp * pp), i / pp);
        }
        assert_string_equal(o.dir, "traces/predicted");
        plan_trace_free(&o);
        config_free(&cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_pp2),           cmocka_unit_test(test_cp2_dp2_zero),
        cmocka_unit_test(test_4d),                cmocka_unit_test(test_pp4_interleaved),
        cmocka_unit_test(test_pp2_dp2_no_overlap),
        cmocka_unit_test(test_steps),             cmocka_unit_test(test_which_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
