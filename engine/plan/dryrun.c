/* engine/plan/dryrun.c - the dry run (see dryrun.h): steps, stats, summary, and --compare. */
#include "engine/plan/dryrun.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_sources.h"
#include "engine/plan/batch_spread.h"
#include "engine/plan/cost.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_shard.h"
#include "engine/plan/plan_trace.h"
#include "engine/plan/sched.h"
#include "engine/plan/stages.h"
#include "util/clock.h"
#include "util/fileio.h"

/* What one step of one run predicts. */
typedef struct StepStats {
    double pp_imbalance, cp_imbalance, cp_time_imbalance, predicted_ms, baseline_ms, packer_ms;
    double predicted_s, baseline_s; /* the same times in seconds, as the simulator gave them */
    /* Attention work: the plan's pairs and Plain-4D's of the same documents (plan_attn_pairs); and
     * Plain-4D of exactly the plan's pieces (plan_baseline_equal_work), whose work is the plan's. */
    double attn_pairs, baseline_pairs, equal_s, equal_ms;
    int64_t tokens;
    double delay_token_steps;
} StepStats;

/* ---------------------------------------------------------------------------------------------- */
/* JSON lines                                                                                      */

static void json_mb_costs(FILE *f, const char *key, const StepPlan *p, const CostModel *cost)
{
    fprintf(f, ",\"%s\":[", key);
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
        fprintf(f, "%s%.4g", i ? "," : "", (p->mbs[i].fwd_s + p->mbs[i].bwd_s) * cost->n_layers * 1e3);
    fputc(']', f);
}

/* Per-rank compute of micro-batch i of p under each CP mode, for the plots. */
static int json_cp_ranks(FILE *f, const StepPlan *p, int64_t i, const CostModel *cost, int64_t capacity, Error *err)
{
    static const CpSharding modes[] = {CP_PER_SEQ, CP_PER_DOC, CP_HYBRID, CP_GROUPS};
    /* groups only where it can run: cp a power of two. */
    int n_modes = (p->cp & (p->cp - 1)) == 0 ? 4 : 3;
    StepPlan one = {0};
    int rc = 0;
    fprintf(f, ",\"cp_rank_mb\":%lld,\"cp_rank_ms\":{", (long long)i);
    for (int k = 0; k < n_modes && rc == 0; k++) {
        plan_reset(&one, p->step, 1, 1, p->cp);
        if (!one.mbs) {
            rc = error_runtime(err, "dry run", "out of memory");
            break;
        }
        const PlanMicroBatch *src = &p->mbs[i];
        one.mbs[0] = *src;
        one.mbs[0].first_doc = 0;
        for (int64_t d = 0; d < src->n_docs && rc == 0; d++)
            if (plan_add_doc(&one, &p->docs[src->first_doc + d]) < 0)
                rc = error_runtime(err, "dry run", "out of memory");
        if (rc == 0)
            rc = plan_shard(&one, 0, modes[k], cost, capacity, err);
        fprintf(f, "%s\"%s\":[", k ? "," : "", config_cp_sharding_name(modes[k]));
        for (int r = 0; rc == 0 && r < p->cp; r++)
            fprintf(f, "%s%.4g", r ? "," : "", plan_rank_compute(&one, &one.mbs[0], r) * cost->n_layers * 1e3);
        fputc(']', f);
    }
    fputc('}', f);
    plan_free(&one);
    return rc;
}

static void json_step(FILE *f, const Config *cfg, const Planner *pl, const StepPlan *p, const StepStats *s)
{
    int counts[CP_GROUPS + 1] = {0};
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
        counts[p->mbs[i].mode]++;
    int64_t docs = 0;
    for (int64_t k = 0; k < p->n_docs; k++)
        docs += p->docs[k].source != PLAN_PAD_SOURCE;
    fprintf(f, "{\"step\":%lld,\"packer\":\"%s\",\"cp_sharding\":\"%s\",\"docs\":%lld,\"tokens\":%lld,"
               "\"batch_fraction\":%.6g,\"pad_tokens\":%lld,\"queued\":%lld,\"carried\":%lld,\"mb_tokens\":[",
            (long long)p->step + 1, config_packer_name(pl->packer), config_cp_sharding_name(pl->sharding),
            (long long)docs, (long long)p->tokens, (double)p->tokens / (double)pl->batch_tokens,
            (long long)p->pad_tokens, (long long)p->queued, (long long)p->carried);
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
        fprintf(f, "%s%lld", i ? "," : "", (long long)p->mbs[i].tokens);
    fprintf(f, "],\"pp_imbalance\":%.6g,\"cp_imbalance\":%.6g,\"cp_time_imbalance\":%.6g,\"sharding\":{\"per_seq\":%d,\"per_doc\":%d,"
               "\"hybrid\":%d,\"groups\":%d},\"predicted_ms\":%.6g,\"baseline_ms\":%.6g,\"speedup\":%.6g,\"packer_ms\":%.4g,"
               "\"token_delay_steps\":%.4g,\"long_documents\":\"%s\",\"attn_pairs\":%.17g,\"baseline_attn_pairs\":%.17g,"
               "\"equal_work_baseline_ms\":%.6g,\"speedup_equal_work\":%.6g",
            s->pp_imbalance, s->cp_imbalance, s->cp_time_imbalance, counts[CP_PER_SEQ], counts[CP_PER_DOC], counts[CP_HYBRID],
            counts[CP_GROUPS], s->predicted_ms, s->baseline_ms, s->predicted_ms > 0 ? s->baseline_ms / s->predicted_ms : 1, s->packer_ms,
            p->tokens ? s->delay_token_steps / (double)p->tokens : 0, pl->cut ? "cut" : "keep", s->attn_pairs,
            s->baseline_pairs, s->equal_ms, s->predicted_ms > 0 ? s->equal_ms / s->predicted_ms : 1);
    /* CP ranks by the size of the blocks they exchange K/V in, over the step's micro-batches (the
     * whole CP group but with sharding groups; 1: no exchange), and the ranks that exchange in
     * more than one (nested blocks). */
    if (p->cp > 1) {
        fputs(",\"cp_group_ranks\":{", f);
        int first = 1, depth = 0;
        while ((p->cp >> depth) > 1 && depth < 31)
            depth++;
        int64_t nested = 0;
        for (int h = depth; h >= 0; h--) { /* h = depth: ranks alone, no exchange */
            int64_t n = 0;
            for (int64_t r = 0; r < p->n_ranks; r++)
                n += h == depth ? p->ranks[r].exchanges == 0 : (p->ranks[r].exchanges >> h) & 1;
            if (n)
                fprintf(f, "%s\"%d\":%lld", first ? "" : ",", h == depth ? 1 : p->cp >> h, (long long)n);
            first &= !n;
        }
        for (int64_t r = 0; r < p->n_ranks; r++)
            nested += __builtin_popcount(p->ranks[r].exchanges) > 1;
        int64_t cut = 0;
        for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
            cut += p->mbs[i].cut_docs;
        fprintf(f, "},\"cp_nested_ranks\":%lld,\"cp_cut_docs\":%lld", (long long)nested, (long long)cut);
    }
    (void)cfg;
}

/* ---------------------------------------------------------------------------------------------- */
/* Summaries                                                                                       */

typedef struct Dist {
    double mean, p50, p95, max;
} Dist;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Mean and nearest-rank percentiles of v[0..n) (v is sorted in place). */
static Dist dist_of(double *v, int64_t n)
{
    Dist d = {0, 0, 0, 0};
    if (n == 0)
        return d;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int64_t i = 0; i < n; i++)
        d.mean += v[i];
    d.mean /= (double)n;
    d.p50 = v[(int64_t)ceil(0.50 * (double)n) - 1];
    d.p95 = v[(int64_t)ceil(0.95 * (double)n) - 1];
    d.max = v[n - 1];
    return d;
}

typedef struct RunSummary {
    int64_t steps, tokens;
    double predicted_s, baseline_s, delay_token_steps;
    double attn_pairs, baseline_pairs, equal_s; /* sums over the steps */
    int cut;                                    /* the run's long_documents: cut (1) or keep */
    Dist pp, cp, cpt, speedup, packer_ms, speedup_eq;
    BatchSpread batch; /* the steps' tokens against data.global_batch_tokens */
    int n_stages;
    double *stage_busy; /* seconds each pipeline stage computes over the run (sched_stage_busy) */
    SchedBreakdown *breakdown; /* where each stage's time goes, summed over the run (n_stages) */
    int overlap;               /* parallel.overlap, as priced */
    int tp_chunks;             /* parallel.tp_chunks, as priced (auto resolved) */
} RunSummary;

/* The slowest stage's busy time: its share of all the stages' (1 / pp when balanced), and over
 * their mean; *slowest gets which stage it is. */
static double slowest_stage_share(const RunSummary *s, int *slowest, double *over_mean)
{
    double total = 0;
    *slowest = 0;
    for (int k = 0; k < s->n_stages; k++) {
        total += s->stage_busy[k];
        if (s->stage_busy[k] > s->stage_busy[*slowest])
            *slowest = k;
    }
    *over_mean = total > 0 ? s->stage_busy[*slowest] * s->n_stages / total : 1;
    return total > 0 ? s->stage_busy[*slowest] / total : 1;
}

static void json_dist(FILE *f, const char *key, Dist d)
{
    fprintf(f, ",\"%s\":{\"mean\":%.6g,\"p50\":%.6g,\"p95\":%.6g,\"max\":%.6g}", key, d.mean, d.p50, d.p95, d.max);
}

/* The worst rank's memory, in GB (10^9 bytes). */
static void json_memory(FILE *f, const DryRunMemoryPlan *mp)
{
    const DryRunMemory *w = &mp->stages[mp->worst];
    fprintf(f, ",\"memory\":{\"peak_gb\":%.4g,\"weights_gb\":%.4g,\"grads_gb\":%.4g,\"optimizer_gb\":%.4g,"
               "\"activations_gb\":%.4g,\"other_gb\":%.4g,\"stage\":%d,\"budget_gb\":%.4g}",
            w->peak / 1e9, (w->weights + w->weights_act) / 1e9, w->grads / 1e9, w->optimizer / 1e9,
            w->activations / 1e9, w->other / 1e9, mp->worst, mp->budget / 1e9);
}

/* The breakdown's parts by name, in the order they are printed (sched.h: SchedBreakdown). */
static const char *const breakdown_names[] = {"products", "attention", "elementwise", "tp_exposed", "tp_hidden",
                                              "cp_exposed", "cp_hidden", "pp_exposed", "pp_hidden", "dp_exposed",
                                              "dp_hidden", "contention", "optimizer", "bubble"};
enum { BREAKDOWN_PARTS = sizeof breakdown_names / sizeof breakdown_names[0] };

static const double *breakdown_parts(const SchedBreakdown *b)
{
    _Static_assert(sizeof(SchedBreakdown) == BREAKDOWN_PARTS * sizeof(double), "a name for every part");
    return &b->products;
}

/* The stages' mean: an average stage, whose parts also add up to the run's predicted time. */
static SchedBreakdown breakdown_mean(const RunSummary *s)
{
    SchedBreakdown m = {0};
    for (int k = 0; k < s->n_stages; k++)
        sched_breakdown_add(&m, &s->breakdown[k], 1.0 / s->n_stages);
    return m;
}

static void json_breakdown_one(FILE *f, const SchedBreakdown *b)
{
    for (int i = 0; i < BREAKDOWN_PARTS; i++)
        fprintf(f, "%s\"%s\":%.6g", i ? "," : "{", breakdown_names[i], breakdown_parts(b)[i]);
    fputc('}', f);
}

/* "time_breakdown": seconds over the run's steps, per pipeline stage and their mean. */
static void json_breakdown(FILE *f, const RunSummary *s)
{
    fprintf(f, ",\"time_breakdown\":{\"overlap\":%s,\"tp_chunks\":%d,\"seconds\":%.6g,\"stages\":[",
            s->overlap ? "true" : "false", s->tp_chunks,
            s->predicted_s);
    for (int k = 0; k < s->n_stages; k++) {
        if (k)
            fputc(',', f);
        json_breakdown_one(f, &s->breakdown[k]);
    }
    fputs("],\"mean\":", f);
    SchedBreakdown m = breakdown_mean(s);
    json_breakdown_one(f, &m);
    fputc('}', f);
}

static void json_summary(FILE *f, const RunSummary *s, const Planner *pl, const DryRunMemoryPlan *mp)
{
    fprintf(f, "{\"summary\":true,\"packer\":\"%s\",\"cp_sharding\":\"%s\",\"steps\":%lld,\"tokens\":%lld,"
               "\"predicted_s\":%.6g,\"baseline_s\":%.6g,\"throughput_speedup\":%.6g",
            config_packer_name(pl->packer), config_cp_sharding_name(pl->sharding), (long long)s->steps,
            (long long)s->tokens, s->predicted_s, s->baseline_s, s->predicted_s > 0 ? s->baseline_s / s->predicted_s : 1);
    json_dist(f, "pp_imbalance", s->pp);
    json_dist(f, "cp_imbalance", s->cp);
    json_dist(f, "cp_time_imbalance", s->cpt);
    json_dist(f, "speedup", s->speedup);
    json_dist(f, "packer_ms", s->packer_ms);
    const BatchSpread *b = &s->batch;
    fprintf(f, ",\"tokens_per_step\":{\"batch\":%lld,\"mean\":%.6g,\"p5\":%lld,\"p50\":%lld,\"p95\":%lld,\"min\":%lld,"
               "\"max\":%lld,\"off_10pct\":%lld,\"under_75pct\":%lld}",
            (long long)b->batch, b->mean, (long long)b->p5, (long long)b->p50, (long long)b->p95, (long long)b->min,
            (long long)b->max, (long long)b->off_near, (long long)b->under_floor);
    /* Work per step, and the run's speedup over Plain-4D at equal work: Plain-4D of the run's own
     * pieces, step by step, over the run's predicted time. */
    fprintf(f, ",\"long_documents\":\"%s\",\"attn_pairs_per_token\":%.6g,\"attn_pairs_per_step\":%.6g,"
               "\"baseline_attn_pairs_per_step\":%.6g,\"equal_work_baseline_s\":%.6g,\"throughput_speedup_equal_work\":%.6g",
            pl->cut ? "cut" : "keep", s->tokens ? s->attn_pairs / (double)s->tokens : 0,
            s->steps ? s->attn_pairs / (double)s->steps : 0,
            s->steps ? s->baseline_pairs / (double)s->steps : 0, s->equal_s,
            s->predicted_s > 0 ? s->equal_s / s->predicted_s : 1);
    json_dist(f, "speedup_equal_work", s->speedup_eq);
    int slowest;
    double over_mean, share = slowest_stage_share(s, &slowest, &over_mean);
    fputs(",\"stage_layers\":[", f);
    for (int g = 0; g < pl->pp * pl->cost->v; g++)
        fprintf(f, "%s%lld", g ? "," : "", (long long)cost_chunk_layers(pl->cost, g));
    fputs("],\"stage_busy_s\":[", f);
    for (int k = 0; k < s->n_stages; k++)
        fprintf(f, "%s%.6g", k ? "," : "", s->stage_busy[k]);
    fprintf(f, "],\"slowest_stage\":%d,\"slowest_stage_share\":%.6g,\"stage_max_over_mean\":%.6g", slowest, share,
            over_mean);
    json_breakdown(f, s);
    if (mp)
        json_memory(f, mp);
    fprintf(f, ",\"token_delay_steps\":%.6g}\n", s->tokens ? s->delay_token_steps / (double)s->tokens : 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* One run: a packer and a CP mode over the stream                                                 */

typedef struct Run {
    const Config *cfg;
    const DataSources *data;
    const CostModel *cost;
    PackerKind packer;
    CpSharding sharding;
    int64_t steps;
    int print_steps;   /* one stdout line per log.every steps */
    int with_baseline; /* simulate Plain-4D on the same documents */
    FILE *stats;       /* JSON lines, or NULL */
    const DryRunMemoryPlan *memory; /* NULL: not reported */
    PlanTraceOut *trace, *trace_base; /* the predicted timelines of trace.steps (the plan's, Plain-4D's of
                                       * the same documents), or NULL */
} Run;

static void print_step(const Config *cfg, const StepPlan *p, const StepStats *s)
{
    int counts[CP_GROUPS + 1] = {0};
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
        counts[p->mbs[i].mode]++;
    printf("step %5lld  tokens %9lld  queued %3lld  pp_imb %.3f  cp_imb %.3f", (long long)p->step + 1,
           (long long)p->tokens, (long long)p->queued, s->pp_imbalance, s->cp_imbalance);
    if (cfg->parallel.cp > 1)
        printf("  seq/doc/hyb/grp %d/%d/%d/%d", counts[CP_PER_SEQ], counts[CP_PER_DOC], counts[CP_HYBRID],
               counts[CP_GROUPS]);
    printf("  pred %9.2f ms  base %9.2f ms  x%.3f  plan %.2f ms%s\n", s->predicted_ms, s->baseline_ms,
           s->predicted_ms > 0 ? s->baseline_ms / s->predicted_ms : 1.0, s->packer_ms,
           batch_under_floor(p->tokens, cfg->data.global_batch_tokens) ? "  (under 75% of the batch)" : "");
}

/* Plans the next step (timing the planner) and predicts it: s gets the imbalances and the step times,
 * *worst_mb the micro-batch with the worst CP imbalance. With run->with_baseline, base gets Plain-4D's
 * plan of the same documents. */
static int plan_and_predict(const Run *run, Planner *pl, StepPlan *plan, StepPlan *base, StepPlan *equal,
                            StepStats *s, int64_t *worst_mb, SchedBreakdown *breakdown, Error *err)
{
    memset(s, 0, sizeof *s);
    /* The planner's wall time: what a step waits for it, with its threads (balance.plan_threads)
     * sharding micro-batches at once. Other processes on a busy machine inflate it; measure on an
     * idle one (plan_threads 1 gives the CPU time of a single thread). */
    double t0 = clock_seconds();
    if (plan_step(pl, plan, err) != 0)
        return -1;
    s->packer_ms = (clock_seconds() - t0) * 1e3;
    double seconds = 0, base_s = 0;
    if (sched_step_breakdown(plan, run->cost, &seconds, breakdown, err) != 0)
        return -1;
    if (run->with_baseline &&
        (plan_baseline(pl, plan, base, err) != 0 || sched_step_time(base, run->cost, &base_s, err) != 0 ||
         plan_baseline_equal_work(pl, plan, equal, err) != 0 ||
         sched_step_time(equal, run->cost, &s->equal_s, err) != 0))
        return -1;
    s->attn_pairs = plan_attn_pairs(plan);
    s->baseline_pairs = run->with_baseline ? plan_attn_pairs(base) : 0;
    s->equal_ms = s->equal_s * 1e3;
    s->pp_imbalance = plan_pp_imbalance(plan);
    s->cp_imbalance = plan_cp_imbalance(plan, worst_mb);
    s->cp_time_imbalance = plan_cp_time_imbalance(plan);
    s->predicted_s = seconds;
    s->baseline_s = base_s;
    s->predicted_ms = seconds * 1e3;
    s->baseline_ms = base_s * 1e3;
    s->tokens = plan->tokens;
    s->delay_token_steps = plan->delay_token_steps;
    return 0;
}

/* The per-step figures a run's summary is made of. */
typedef struct Series {
    double *pp, *cp, *cpt, *speedup, *packer_ms, *speedup_eq;
    int64_t *tokens;
} Series;

static int series_alloc(Series *v, int64_t n, Error *err)
{
    /* The six series side by side in one block. */
    size_t len = (size_t)(n ? n : 1);
    double *all = malloc(6 * len * sizeof *all);
    v->tokens = malloc(len * sizeof *v->tokens);
    if (!all || !v->tokens) {
        free(all);
        free(v->tokens);
        v->tokens = NULL;
        return error_runtime(err, "dry run", "out of memory");
    }
    double **cols[6] = {&v->pp, &v->cp, &v->cpt, &v->speedup, &v->packer_ms, &v->speedup_eq};
    for (int i = 0; i < 6; i++)
        *cols[i] = all + (size_t)i * len;
    return 0;
}

static void series_free(Series *v)
{
    free(v->pp);
    free(v->tokens);
}

static void series_add(Series *v, RunSummary *sum, int64_t step, const StepStats *s, int with_baseline)
{
    v->pp[step] = s->pp_imbalance;
    v->cp[step] = s->cp_imbalance;
    v->cpt[step] = s->cp_time_imbalance;
    v->speedup[step] = with_baseline && s->predicted_s > 0 ? s->baseline_s / s->predicted_s : 1;
    v->packer_ms[step] = s->packer_ms;
    v->speedup_eq[step] = with_baseline && s->predicted_s > 0 ? s->equal_s / s->predicted_s : 1;
    v->tokens[step] = s->tokens;
    sum->attn_pairs += s->attn_pairs;
    sum->baseline_pairs += s->baseline_pairs;
    sum->equal_s += s->equal_s;
    sum->tokens += s->tokens;
    sum->predicted_s += s->predicted_s;
    sum->baseline_s += s->baseline_s;
    sum->delay_token_steps += s->delay_token_steps;
}

static void series_summarize(Series *v, RunSummary *sum, int64_t n, int64_t batch)
{
    sum->steps = n;
    sum->batch = batch_spread_of(v->tokens, n, batch);
    sum->pp = dist_of(v->pp, n);
    sum->cp = dist_of(v->cp, n);
    sum->cpt = dist_of(v->cpt, n);
    sum->speedup = dist_of(v->speedup, n);
    sum->packer_ms = dist_of(v->packer_ms, n);
    sum->speedup_eq = dist_of(v->speedup_eq, n);
}

/* The step's stdout line (every log.every steps, the first and the last) and its JSON line. */
static int report_step(const Run *run, const Planner *pl, const StepPlan *plan, const StepPlan *base,
                       const StepStats *s, int64_t worst_mb, Error *err)
{
    const Config *cfg = run->cfg;
    int64_t step = plan->step + 1;
    if (run->print_steps && (step % cfg->log.every == 0 || step == 1 || step == run->steps))
        print_step(cfg, plan, s);
    if (!run->stats)
        return 0;
    json_step(run->stats, cfg, pl, plan, s);
    json_mb_costs(run->stats, "mb_cost_ms", plan, run->cost);
    if (run->with_baseline)
        json_mb_costs(run->stats, "baseline_mb_cost_ms", base, run->cost);
    int rc = 0;
    if (cfg->parallel.cp > 1 && worst_mb >= 0)
        rc = json_cp_ranks(run->stats, plan, worst_mb, run->cost, pl->rank_capacity, err);
    fputs("}\n", run->stats);
    return rc;
}

static void run_summary_free(RunSummary *s)
{
    free(s->stage_busy);
    s->stage_busy = NULL;
    free(s->breakdown);
    s->breakdown = NULL;
}

/* Plans, predicts and reports run->steps steps; sum gets the run's summary (run_summary_free). */
static int run_steps(const Run *run, RunSummary *sum, Error *err)
{
    memset(sum, 0, sizeof *sum);
    const Config *cfg = run->cfg;
    DataStream stream;
    Planner pl;
    StepPlan plan = {0}, base = {0}, equal = {0};
    Series v = {0};
    /* Training's stream: without the documents data.valid_fraction holds out. */
    if (data_stream_init(&stream, run->data->src, run->data->weights, run->data->n, (uint64_t)cfg->data.seed,
                         (uint64_t)cfg->data.context_window, err) != 0)
        return -1;
    if (data_stream_set_split(&stream, DATA_SPLIT_TRAIN, cfg->data.valid_fraction, err) != 0) {
        data_stream_free(&stream);
        return -1;
    }
    int rc = plan_init(&pl, cfg, run->cost, &stream, run->packer, run->sharding, err);
    if (rc == 0)
        rc = series_alloc(&v, run->steps, err);
    sum->n_stages = (int)cfg->parallel.pp;
    sum->overlap = run->cost->overlap;
    sum->tp_chunks = run->cost->tp_chunks;
    if (rc == 0 && (!(sum->stage_busy = calloc((size_t)sum->n_stages, sizeof *sum->stage_busy)) ||
                    !(sum->breakdown = calloc((size_t)sum->n_stages, sizeof *sum->breakdown))))
        rc = error_runtime(err, "dry run", "out of memory");
    for (int64_t step = 0; step < run->steps && rc == 0; step++) {
        StepStats s;
        int64_t worst_mb = -1;
        rc = plan_and_predict(run, &pl, &plan, &base, &equal, &s, &worst_mb, sum->breakdown, err);
        if (rc == 0)
            rc = sched_stage_busy(&plan, run->cost, sum->stage_busy, err);
        if (rc == 0 && run->trace)
            rc = plan_trace_add_step(run->trace, &plan, run->cost, s.predicted_s, err);
        if (rc == 0 && run->trace_base && run->with_baseline)
            rc = plan_trace_add_step(run->trace_base, &base, run->cost, s.baseline_s, err);
        if (rc == 0) {
            series_add(&v, sum, step, &s, run->with_baseline);
            rc = report_step(run, &pl, &plan, &base, &s, worst_mb, err);
        }
    }
    if (rc == 0) {
        series_summarize(&v, sum, run->steps, cfg->data.global_batch_tokens);
        sum->cut = pl.cut;
        if (run->stats)
            json_summary(run->stats, sum, &pl, run->memory);
    }
    series_free(&v);
    if (rc != 0)
        run_summary_free(sum);
    plan_free(&plan);
    plan_free(&base);
    plan_free(&equal);
    plan_destroy(&pl);
    data_stream_free(&stream);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */

static void print_header(const Config *cfg, const DataSources *data, const CostModel *cost, int64_t steps)
{
    const ConfigParallel *p = &cfg->parallel;
    int64_t gpus = p->tp * p->cp * p->pp * p->dp;
    printf("dry run: %lld GPUs (tp %lld, cp %lld, pp %lld, dp %lld), %lld steps of %lld tokens "
           "(M = %lld micro-batches per replica, window %lld), hardware %s\n",
           (long long)gpus, (long long)p->tp, (long long)p->cp, (long long)p->pp, (long long)p->dp, (long long)steps,
           (long long)cfg->data.global_batch_tokens, (long long)config_micro_batches(cfg),
           (long long)cfg->data.context_window, config_hardware_name(cfg->balance.hardware));
    /* What every predicted figure below is priced with, and where its rates came from. */
    printf("cost profile: %s: %s\n", cost->source.profile, cost->source.text);
    uint64_t docs = 0, tokens = 0;
    for (int i = 0; i < data->n; i++) {
        docs += data->src[i].n_docs;
        tokens += data->src[i].n_tokens;
    }
    printf("data: %s, %llu documents, %llu tokens\n", cfg->data.lengths_file ? cfg->data.lengths_file : cfg->data.path.v[0],
           (unsigned long long)docs, (unsigned long long)tokens);
}

/* The split of the layers, and what a typical micro-batch costs each stage under it (stages.h):
 * the figures parallel.stage_layers: auto balances. */
static int print_stages(const Config *cfg, const CostModel *cost, const DataSources *data, Error *err)
{
    int pp = cost->pp, v = cost->v;
    StageCosts c;
    char text[512];
    if (stages_typical_costs(cfg, cost, data->src, data->weights, data->n, &c, err) != 0)
        return -1;
    config_int_list_text(cfg->parallel.chunk_layers.v, pp * v, text, sizeof text);
    double layer = c.layer_fwd_s + c.layer_bwd_s, head = c.head_fwd_s + c.head_bwd_s;
    printf("stages: layers per %s %s (parallel.stage_layers: %s); a typical micro-batch (a window, %.0f attention "
           "pairs per token): a layer %.2f ms, the output layer and loss %.2f ms (%.2f layers), the embedding %.2f ms; "
           "per stage", v > 1 ? "model chunk" : "stage", text, config_stage_layers_name((StageLayers)cfg->parallel.stage_layers.choice),
           c.pairs_per_token, layer * 1e3, head * 1e3, layer > 0 ? head / layer : 0,
           (c.embed_fwd_s + c.embed_bwd_s) * 1e3);
    double most = 0, sum = 0;
    for (int k = 0; k < pp; k++) {
        double t = stages_stage_s(&c, pp, v, cfg->parallel.chunk_layers.v, k);
        printf("%s%.1f", k ? ", " : " ", t * 1e3);
        most = t > most ? t : most;
        sum += t;
    }
    printf(" ms (slowest %.3f x the mean)\n", sum > 0 ? most * pp / sum : 1);
    return 0;
}

/* Every pipeline stage's rank: its memory by part, and the worst against the budget. */
static void print_memory(const Config *cfg, const DryRunMemoryPlan *mp)
{
    printf("memory per rank, GB (train.recompute: %s%s; largest micro-batch %lld tokens, %lld rows on a CP rank):\n",
           config_recompute_name(cfg->train.recompute), cfg->parallel.zero ? ", ZeRO-1" : "", (long long)mp->mb_tokens,
           (long long)mp->rank_rows);
    printf("%6s %7s %9s %9s %9s %10s %12s %9s %9s %9s\n", "stage", "layers", "weights", "bf16", "grads", "optimizer",
           "activations", "in_flight", "other", "peak");
    for (int s = 0; s < mp->n_stages; s++) {
        const DryRunMemory *m = &mp->stages[s];
        int64_t layers = 0;
        for (int g = s; g < cfg->parallel.chunk_layers.n; g += mp->n_stages)
            layers += cfg->parallel.chunk_layers.v[g];
        printf("%6d %7lld %9.2f %9.2f %9.2f %10.2f %12.2f %9d %9.2f %9.2f\n", s, (long long)layers, m->weights / 1e9,
               m->weights_act / 1e9, m->grads / 1e9, m->optimizer / 1e9, m->activations / 1e9, m->slots,
               m->other / 1e9, m->peak / 1e9);
    }
    double peak = mp->stages[mp->worst].peak;
    if (mp->budget > 0 && peak <= mp->budget)
        printf("memory: peak %.1f GB per rank (stage %d) of %.1f GB: fits, %.1f GB to spare\n", peak / 1e9, mp->worst,
               mp->budget / 1e9, (mp->budget - peak) / 1e9);
    else if (mp->budget > 0)
        printf("memory: peak %.1f GB per rank (stage %d) of %.1f GB: DOES NOT FIT, %.1f GB over (planned anyway: "
               "--no-memory-check)\n", peak / 1e9, mp->worst, mp->budget / 1e9, (peak - mp->budget) / 1e9);
    else
        printf("memory: peak %.1f GB per rank (stage %d); no budget to check against (balance.hardware: cpu)\n",
               peak / 1e9, mp->worst);
}

static void print_summary(const RunSummary *s)
{
    printf("summary: %lld steps, %lld tokens; pp_imbalance mean %.3f p95 %.3f max %.3f; cp_imbalance mean %.3f "
           "max %.3f (with the exchange: mean %.3f max %.3f)\n",
           (long long)s->steps, (long long)s->tokens, s->pp.mean, s->pp.p95, s->pp.max, s->cp.mean, s->cp.max,
           s->cpt.mean, s->cpt.max);
    printf("summary: predicted %.2f s (%.0f tokens/s) vs Plain-4D %.2f s on the same documents: speedup %.3fx (per "
           "step mean %.3f, p50 %.3f); planning %.3f ms/step mean, %.3f max; token delay %.3f steps\n",
           s->predicted_s, s->predicted_s > 0 ? (double)s->tokens / s->predicted_s : 0, s->baseline_s,
           s->predicted_s > 0 ? s->baseline_s / s->predicted_s : 1, s->speedup.mean,
           s->speedup.p50, s->packer_ms.mean, s->packer_ms.max,
           s->tokens ? s->delay_token_steps / (double)s->tokens : 0);
    const BatchSpread *b = &s->batch;
    double pct = b->batch > 0 ? 100.0 / (double)b->batch : 0;
    printf("summary: tokens per step against the batch of %lld (data.global_batch_tokens): mean %.0f, p5 %lld (%.1f%%), "
           "p50 %lld, p95 %lld (%.1f%%), min %lld (%.1f%%), max %lld (%.1f%%); %lld of %lld steps more than %d%% off "
           "it, %lld under %d%%\n",
           (long long)b->batch, b->mean, (long long)b->p5, pct * (double)b->p5, (long long)b->p50, (long long)b->p95,
           pct * (double)b->p95, (long long)b->min, pct * (double)b->min, (long long)b->max, pct * (double)b->max,
           (long long)b->off_near, (long long)b->steps, BATCH_NEAR_PERCENT, (long long)b->under_floor,
           BATCH_FLOOR_PERCENT);
    double n = s->steps > 0 ? (double)s->steps : 1;
    printf("summary: attention work %.4g pairs/step (documents %s at window ends), Plain-4D %.4g (cut at window "
           "ends); at equal work (Plain-4D of the same pieces, %.2f s) speedup %.3fx (per step mean %.3f, p50 %.3f)\n",
           s->attn_pairs / n, s->cut ? "cut" : "kept whole", s->baseline_pairs / n, s->equal_s,
           s->predicted_s > 0 ? s->equal_s / s->predicted_s : 1, s->speedup_eq.mean, s->speedup_eq.p50);
    if (s->n_stages > 1) {
        int slowest;
        double over_mean, share = slowest_stage_share(s, &slowest, &over_mean);
        printf("summary: stages busy");
        for (int k = 0; k < s->n_stages; k++)
            printf("%s%.2f", k ? ", " : " ", s->stage_busy[k]);
        printf(" s; the slowest, stage %d, %.1f%% of their time (balanced: %.1f%%), %.3f x their mean\n", slowest,
               100 * share, 100.0 / s->n_stages, over_mean);
    }
}

/* On stderr: the steps under BATCH_FLOOR_PERCENT of the batch, if any (what names the run). */
static void warn_under_floor(const RunSummary *s, const char *what)
{
    const BatchSpread *b = &s->batch;
    if (b->under_floor == 0)
        return;
    fprintf(stderr, "wlbtrain: warning: %s%s%lld of %lld steps trained under %d%% of data.global_batch_tokens (%lld), the "
                    "smallest %lld tokens (%.1f%%): the optimizer's batch, which the learning rate is set for, is not "
                    "what those steps train\n", what ? what : "", what ? ": " : "", (long long)b->under_floor,
            (long long)b->steps, BATCH_FLOOR_PERCENT, (long long)b->batch, (long long)b->min,
            b->batch > 0 ? 100.0 * (double)b->min / (double)b->batch : 0);
}

/* Where the time goes: each stage's parts over the run, exposed communication and hidden side by side. */
static void print_breakdown(const RunSummary *s)
{
    printf("time breakdown, s over the run (parallel.overlap: %s, tp_chunks: %d; shown parts + bubble = the step "
           "time; _hid: ran hidden, beside computation or the pipeline's fill):\n", s->overlap ? "true" : "false",
           s->tp_chunks);
    printf("%6s %9s %9s %9s %8s %8s %8s %8s %9s %8s %8s %8s %8s %8s %8s\n", "stage", "products", "attention",
           "elemwise", "tp", "cp", "pp", "dp", "contend", "optim", "bubble", "tp_hid", "cp_hid", "pp_hid", "dp_hid");
    SchedBreakdown m = breakdown_mean(s);
    for (int k = 0; k <= s->n_stages; k++) {
        const SchedBreakdown *b = k < s->n_stages ? &s->breakdown[k] : &m;
        char name[16];
        snprintf(name, sizeof name, k < s->n_stages ? "%d" : "mean", k);
        printf("%6s %9.2f %9.2f %9.2f %8.2f %8.2f %8.2f %8.2f %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", name,
               b->products, b->attention, b->elementwise, b->tp_exposed, b->cp_exposed, b->pp_exposed, b->dp_exposed,
               b->contention, b->optimizer, b->bubble, b->tp_hidden, b->cp_hidden, b->pp_hidden, b->dp_hidden);
    }
    double comm = m.tp_exposed + m.cp_exposed + m.pp_exposed + m.dp_exposed;
    double hid = m.tp_hidden + m.cp_hidden + m.pp_hidden + m.dp_hidden;
    printf("time breakdown: the mean stage's communication %.1f%% of the step exposed, %.2f s hidden (%.1f%% of all of "
           "it); bubble %.1f%%\n", s->predicted_s > 0 ? 100 * comm / s->predicted_s : 0, hid,
           comm + hid > 0 ? 100 * hid / (comm + hid) : 0, s->predicted_s > 0 ? 100 * m.bubble / s->predicted_s : 0);
}

static int compare_all(const Run *base_run, Error *err)
{
    static const PackerKind packers[] = {PACKER_FIXED, PACKER_FIXED_GREEDY, PACKER_WLB};
    static const CpSharding modes[] = {CP_PER_SEQ, CP_PER_DOC, CP_ADAPTIVE, CP_HYBRID, CP_GROUPS};
    /* groups needs cp a power of two (aligned blocks). */
    int64_t cp = base_run->cfg->parallel.cp;
    int n_modes = cp == 1 ? 1 : (cp & (cp - 1)) == 0 ? 5 : 4;
    double plain_tps = 0;
    printf("%-13s %-9s %8s %8s %8s %12s %8s %9s %8s %9s %5s %12s %8s %7s %7s %7s %7s %7s %5s\n", "packer", "cp",
           "pp_imb", "p95", "cp_imb", "tokens/s", "speedup", "plan_ms", "delay", "cp_t_imb", "docs", "pairs/tok", "x_eq",
           "comm%", "bubble%", "tok_p5%", "tok_p95", "tok_min", "<75%");
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < n_modes; b++) {
            Run run = *base_run;
            run.packer = packers[a];
            run.sharding = modes[b];
            run.print_steps = 0;
            run.with_baseline = 1; /* for the speedup at equal work */
            RunSummary s;
            if (run_steps(&run, &s, err) != 0)
                return -1;
            SchedBreakdown mean = breakdown_mean(&s);
            run_summary_free(&s);
            double shown = mean.tp_exposed + mean.cp_exposed + mean.pp_exposed + mean.dp_exposed;
            double tps = s.predicted_s > 0 ? (double)s.tokens / s.predicted_s : 0;
            if (a == 0 && b == 0)
                plain_tps = tps;
            double pct = s.batch.batch > 0 ? 100.0 / (double)s.batch.batch : 0;
            printf("%-13s %-9s %8.3f %8.3f %8.3f %12.0f %7.3fx %9.3f %8.3f %9.3f %5s %12.4g %7.3fx %7.1f %7.1f %7.1f "
                   "%7.1f %7.1f %5lld\n",
                   config_packer_name(run.packer), config_cp_sharding_name(run.sharding), s.pp.mean, s.pp.p95, s.cp.mean,
                   tps, plain_tps > 0 ? tps / plain_tps : 1, s.packer_ms.mean,
                   s.tokens ? s.delay_token_steps / (double)s.tokens : 0, s.cpt.mean, s.cut ? "cut" : "keep",
                   s.tokens ? s.attn_pairs / (double)s.tokens : 0, s.predicted_s > 0 ? s.equal_s / s.predicted_s : 1,
                   s.predicted_s > 0 ? 100 * shown / s.predicted_s : 0, s.predicted_s > 0 ? 100 * mean.bubble / s.predicted_s : 0,
                   pct * (double)s.batch.p5, pct * (double)s.batch.p95, pct * (double)s.batch.min,
                   (long long)s.batch.under_floor);
            fflush(stdout);
            char what[64];
            snprintf(what, sizeof what, "%s + %s", config_packer_name(run.packer), config_cp_sharding_name(run.sharding));
            warn_under_floor(&s, what);
        }
    printf("tokens/s: predicted for the whole cluster; speedup: against fixed + per_seq (Plain-4D) on the same "
           "stream; cp_t_imb: cp_imb with each rank's K/V exchange counted; docs: cut at window ends or kept whole "
           "(balance.long_documents); pairs/tok: attention work (document-causal pairs) per token trained; x_eq: speedup over Plain-4D "
           "of the run's own pieces (equal work); comm%%, bubble%%: the mean stage's exposed communication (TP, CP, PP, DP) and "
           "pipeline bubble, %% of the step (the dry run's time breakdown); tok_p5%%, tok_p95, tok_min: the tokens of a step, "
           "5th and 95th percentile and least, %% of data.global_batch_tokens; <75%%: steps under 75%% of it\n");
    return 0;
}

int dryrun_predict(const Config *cfg, const DataSources *data, int64_t steps, int with_baseline, DryRunFigures *out,
                   Error *err)
{
    CostModel cost;
    memset(out, 0, sizeof *out);
    if (cost_model_init(&cost, cfg, err) != 0)
        return -1;
    Run run = {cfg, data, &cost, cfg->balance.packer, cfg->balance.cp_sharding, steps, 0, with_baseline, NULL, NULL,
               NULL, NULL};
    RunSummary s;
    if (run_steps(&run, &s, err) != 0)
        return -1;
    *out = (DryRunFigures){s.steps, s.tokens, s.predicted_s, s.baseline_s, s.pp.mean, s.cp.mean, s.cpt.mean,
                           breakdown_mean(&s)};
    run_summary_free(&s);
    return 0;
}

void dryrun_data_hint(const Config *cfg, Error *err)
{
    if (cfg->data.path.n && err->status == ERROR_INPUT)
        error_append(err, " (a dry run needs only document lengths: --set data.lengths_file=FILE --set data.path=)");
}

int dryrun_run(const Config *cfg, const DryRunOptions *opt, Error *err)
{
    DataSources data;
    CostModel cost;
    if (cfg->parallel.dp <= 0)
        return error_set(err, "parallel.dp", "a dry run needs a number for dp (auto takes it from a launch): set "
                         "parallel.dp or --set parallel.dp=N");
    if (cost_model_init(&cost, cfg, err) != 0)
        return -1;
    WLB_ASSERT(cost.has_split); /* the split is resolved: config_resolve, for auto trainer_stage_layers */
    if (cost.v > 1 && config_micro_batches(cfg) % cfg->parallel.pp)
        return error_set(err, "parallel.virtual_stages", "interleaved 1F1B needs the micro-batches per replica "
                         "(%lld) to be a multiple of parallel.pp (%lld)", (long long)config_micro_batches(cfg),
                         (long long)cfg->parallel.pp);
    if (data_sources_open(&data, cfg->data.path.v, cfg->data.weights.n ? cfg->data.weights.v : NULL,
                          cfg->data.path.n, cfg->data.lengths_file, cfg->data.lengths_column, err) != 0) {
        dryrun_data_hint(cfg, err);
        return -1;
    }
    if (data.lengths.skipped) { /* what a length list left out is said, not silently dropped */
        char note[1400];
        data_lengths_skipped_note(&data.lengths, cfg->data.lengths_file, note, sizeof note);
        fprintf(stderr, "wlbtrain: warning: %s\n", note);
    }
    AtomicFile stats = {0};
    PlanTraceOut trace, trace_base = {0};
    /* trace.steps: the predicted timelines, and Plain-4D's of the same documents beside them (not
     * with --compare: its runs are other configs') */
    int rc = plan_trace_open(&trace, cfg, "predicted", err);
    if (rc == 0 && !opt->compare)
        rc = plan_trace_open(&trace_base, cfg, "predicted-plain4d", err);
    if (rc == 0 && opt->stats_out)
        rc = atomic_open(&stats, opt->stats_out, err);
    Run run = {cfg, &data, &cost, cfg->balance.packer, cfg->balance.cp_sharding, opt->steps, 1, 1, stats.f,
               opt->memory, opt->compare ? NULL : &trace, opt->compare ? NULL : &trace_base};
    if (rc == 0) {
        print_header(cfg, &data, &cost, opt->steps);
        if (cost.pp > 1)
            rc = print_stages(cfg, &cost, &data, err);
    }
    if (rc == 0) {
        if (opt->memory)
            print_memory(cfg, opt->memory);
        if (opt->compare) {
            rc = compare_all(&run, err);
        } else {
            RunSummary s;
            rc = run_steps(&run, &s, err);
            if (rc == 0) {
                print_summary(&s);
                print_breakdown(&s);
                warn_under_floor(&s, NULL);
            }
            if (rc == 0)
                run_summary_free(&s);
        }
    }
    if (rc == 0 && !opt->compare)
        rc = plan_trace_close(&trace, err);
    if (rc == 0 && !opt->compare && trace.traced) /* (none traced: said once, above) */
        rc = plan_trace_close(&trace_base, err);
    if (opt->stats_out && rc == 0)
        rc = atomic_commit(&stats, err);
    else if (opt->stats_out && stats.f)
        atomic_abort(&stats);
    plan_trace_free(&trace);
    plan_trace_free(&trace_base);
    data_sources_close(&data);
    return rc;
}
