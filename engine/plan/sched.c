/* engine/plan/sched.c - 1F1B pipeline simulation (see sched.h). */
#include "engine/plan/sched.h"

#include <stdlib.h>
#include <string.h>

/* Megatron's micro-batch and chunk of the k-th forward (backward) on a rank. */
static SchedOp nth_op(int k, int backward, int pp, int v)
{
    int group = k / pp, chunk = group % v;
    int mb = (k / (pp * v)) * pp + k % pp;
    if (v == 1)
        mb = k;
    return (SchedOp){backward, mb, backward ? v - 1 - chunk : chunk};
}

/* The op sequence of stage s: warm-up forwards, alternating steady state, cool-down backwards. */
int sched_stage_ops(int s, int pp, int v, int n_mb, SchedOp *ops)
{
    int total = n_mb * v;
    int warmup = v == 1 ? pp - s - 1 : 2 * (pp - s - 1) + (v - 1) * pp;
    if (warmup > total)
        warmup = total;
    int n = 0;
    for (int k = 0; k < warmup; k++)
        ops[n++] = nth_op(k, 0, pp, v);
    for (int i = 0; i < total - warmup; i++) {
        ops[n++] = nth_op(warmup + i, 0, pp, v);
        ops[n++] = nth_op(i, 1, pp, v);
    }
    for (int k = total - warmup; k < total; k++)
        ops[n++] = nth_op(k, 1, pp, v);
    return n;
}

int sched_makespan(const SchedReplica *r, double *makespan, Error *err)
{
    return sched_simulate(r, makespan, NULL, err);
}

static void trace_add(double *v, int i, double x)
{
    if (v)
        v[i] += x;
}

int sched_simulate(const SchedReplica *r, double *makespan, const SchedTrace *trace, Error *err)
{
    int pp = r->pp, v = r->v, n_mb = r->n_mb, chunks = pp * v, per_stage = 2 * n_mb * v;
    *makespan = 0;
    if (trace) {
        double *per_stage_v[] = {trace->stage_end, trace->pp_exposed, trace->pp_hidden, trace->gather_wait,
                                 trace->gather_beside};
        for (size_t k = 0; k < sizeof per_stage_v / sizeof per_stage_v[0]; k++)
            if (per_stage_v[k])
                memset(per_stage_v[k], 0, (size_t)pp * sizeof(double));
        for (int g = 0; g < chunks; g++) {
            if (trace->last_bwd_start)
                trace->last_bwd_start[g] = 0;
            if (trace->last_bwd_end)
                trace->last_bwd_end[g] = 0;
        }
    }
    if (n_mb == 0)
        return 0;
    if (v > 1 && n_mb % pp)
        return error_set(err, "parallel.virtual_stages", "interleaved 1F1B takes micro-batches in groups of pp: "
                         "%d micro-batches per replica with pp %d", n_mb, pp);
    size_t n_ends = (size_t)n_mb * chunks;
    SchedOp *ops = malloc((size_t)pp * per_stage * sizeof *ops);
    double *end_f = malloc(n_ends * sizeof *end_f), *end_b = malloc(n_ends * sizeof *end_b);
    double *free_at = calloc((size_t)pp, sizeof *free_at);
    int *next = calloc((size_t)pp, sizeof *next);
    int rc = 0;
    if (!ops || !end_f || !end_b || !free_at || !next) {
        rc = error_runtime(err, "pipeline", "out of memory for the schedule of %d micro-batches", n_mb);
        goto done;
    }
    for (int s = 0; s < pp; s++)
        sched_stage_ops(s, pp, v, n_mb, ops + (size_t)s * per_stage);
    for (size_t i = 0; i < n_ends; i++)
        end_f[i] = end_b[i] = -1;
    int done_ops = 0, total_ops = pp * per_stage;
    while (done_ops < total_ops) {
        int progress = 0;
        for (int s = 0; s < pp; s++) {
            /* Run this stage's ops for as long as their inputs are ready. */
            while (next[s] < per_stage) {
                SchedOp op = ops[(size_t)s * per_stage + next[s]];
                int g = op.chunk * pp + s;
                size_t at = (size_t)op.mb * chunks + g;
                double sent = -1; /* when the input message left its stage (-1: no message) */
                double ready = 0, moved = -1, shown = 0, gather_shown = 0; /* the message: from, waited for */
                if (!op.backward && g > 0) {
                    if ((sent = end_f[at - 1]) < 0)
                        break;
                } else if (op.backward && g < chunks - 1) {
                    if ((sent = end_b[at + 1]) < 0)
                        break;
                } else if (op.backward) {
                    if (end_f[at] < 0)
                        break;
                    ready = end_f[at];
                }
                double start;
                if (sent >= 0 && r->recv_on_demand) {
                    /* The message moves once the receiver asks for it: all of its time shows. */
                    moved = sent > free_at[s] ? sent : free_at[s];
                    start = moved + r->p2p[op.mb];
                    shown = r->p2p[op.mb];
                    if (trace)
                        trace_add(trace->pp_exposed, s, r->p2p[op.mb]);
                } else if (sent >= 0) {
                    /* Posted ahead: it moves while the stage still computes; only its tail past
                     * both the sender's end and the stage's shows. */
                    ready = sent + r->p2p[op.mb];
                    double waited_from = sent > free_at[s] ? sent : free_at[s];
                    moved = sent;
                    shown = ready > waited_from ? ready - waited_from : 0;
                    shown = shown < r->p2p[op.mb] ? shown : r->p2p[op.mb];
                    start = ready > free_at[s] ? ready : free_at[s];
                    if (trace) {
                        trace_add(trace->pp_exposed, s, shown);
                        trace_add(trace->pp_hidden, s, r->p2p[op.mb] - shown);
                    }
                } else {
                    start = ready > free_at[s] ? ready : free_at[s];
                }
                double dur = op.backward ? r->bwd[at] : r->fwd[at], end = start + dur;
                if (r->gather && !op.backward && op.mb == 0) {
                    /* The chunk's first forward: its parameters' first bucket must be there before
                     * it starts, its last before its last layer runs. */
                    const SchedGather *gt = &r->gather[g];
                    double from = start;
                    start = start > gt->first ? start : gt->first;
                    end = start + dur;
                    double last = gt->last + gt->last_share * dur;
                    end = end > last ? end : last;
                    gather_shown = end - dur - from;
                    if (trace) {
                        trace_add(trace->gather_wait, s, end - dur - from);
                        double beside = (gt->last < end ? gt->last : end) - start;
                        trace_add(trace->gather_beside, s, beside > 0 ? beside : 0);
                    }
                }
                free_at[s] = end;
                (op.backward ? end_b : end_f)[at] = end;
                if (trace && trace->pass_start) {
                    size_t i = (size_t)s * per_stage + next[s];
                    trace->pass_start[i] = end - dur;
                    trace->pass_end[i] = end;
                    trace->msg_from[i] = moved;
                    trace->msg_shown[i] = shown;
                    trace->gather_shown[i] = gather_shown;
                }
                if (trace && op.backward && op.mb == n_mb - 1) { /* the chunk's last backward */
                    if (trace->last_bwd_start)
                        trace->last_bwd_start[g] = end - dur;
                    if (trace->last_bwd_end)
                        trace->last_bwd_end[g] = end;
                }
                next[s]++;
                done_ops++;
                progress = 1;
            }
        }
        WLB_ASSERT(progress); /* a valid 1F1B order always has a pass whose inputs are ready */
    }
    for (int s = 0; s < pp; s++) {
        *makespan = free_at[s] > *makespan ? free_at[s] : *makespan;
        if (trace && trace->stage_end)
            trace->stage_end[s] = free_at[s];
    }
done:
    free(ops);
    free(end_f);
    free(end_b);
    free(free_at);
    free(next);
    return rc;
}

/* Simulates replica r with its micro-batches in the order given by mb_index (count n); gather: ZeRO-1's
 * all-gather per chunk (NULL: none), trace as sched_simulate's. */
static int replica_makespan(const StepPlan *p, const CostModel *cost, const int64_t *mb_index, int n, double *fwd,
                            double *bwd, double *p2p, const SchedGather *gather, const SchedTrace *trace,
                            double *makespan, Error *err)
{
    int chunks = cost->pp * cost->v;
    for (int i = 0; i < n; i++)
        sched_micro_batch_times(p, &p->mbs[mb_index[i]], cost, fwd + (size_t)i * chunks, bwd + (size_t)i * chunks,
                                &p2p[i]);
    SchedReplica rep = {cost->pp, cost->v, n, fwd, bwd, p2p, !cost->overlap, gather};
    return sched_simulate(&rep, makespan, trace, err);
}

/* The gradient buckets of model chunk g on a rank as the engine makes them (train.h,
 * trainer_bucket_range), in the order its backward produces them: the tensors after the layers (the
 * last chunk's final norm and output projection), the layers top first but the first, the first
 * layer's MLP half, and last the bottom bucket - the first layer's attention half with the tensors
 * before the layers (the first chunk's embedding). params[i]: each one's parameters; at[i]: the
 * share of the chunk's backward pass done when it is final, by the products' FLOPs (the attention's
 * own work and the embedding's left out: the MLP half reads as final later than it is, never
 * earlier). Returns how many (at most layers + 2); tied embeddings over chunks are priced as untied. */
static int chunk_buckets(const CostModel *cost, int g, double *params, double *at)
{
    int chunks = cost->pp * cost->v, layers = cost_chunk_layers(cost, g), n = 0;
    double d = cost->d_model, f = cost->ffn_local, head = g == chunks - 1 ? cost->head_params : 0;
    double w_head = head > 0 ? cost->head_flops_fwd : 0, w_layer = cost->gemm_flops_fwd, w_mlp = 6 * d * f;
    double w_all = w_head + layers * w_layer, mlp = 3 * d * f + d;
    layers = layers > 0 ? layers : 1;
    if (head > 0) {
        params[n] = head;
        at[n++] = w_head / w_all;
    }
    for (int j = 1; j < layers; j++) {
        params[n] = cost->layer_params;
        at[n++] = (w_head + j * w_layer) / w_all;
    }
    params[n] = mlp;
    at[n++] = (w_head + (layers - 1) * w_layer + w_mlp) / w_all;
    params[n] = cost->layer_params - mlp + (g == 0 ? cost->embed_params : 0);
    at[n++] = 1;
    return n;
}

/* ZeRO-1's all-gather (NULL when there is none): each stage gathers its chunks in the order it first
 * runs them, bucket by bucket in forward order with overlap (a chunk's first forward starts once
 * its first layer's two buckets are in), or all of them before the step's first pass. *total[s]
 * gets stage s's seconds of it; from, to (NULL: not wanted) when chunk c's gather runs, [s * v + c]. */
static SchedGather *gather_plan(const CostModel *cost, double *total, double *from, double *to)
{
    int pp = cost->pp, v = cost->v;
    memset(total, 0, (size_t)pp * sizeof *total);
    if (!cost->zero || cost->dpcp <= 1)
        return NULL;
    SchedGather *gt = calloc((size_t)pp * v, sizeof *gt);
    double *params = malloc((size_t)(cost->n_layers + 2) * sizeof *params);
    double *at = malloc((size_t)(cost->n_layers + 2) * sizeof *at);
    if (!gt || !params || !at) {
        free(gt);
        free(params);
        free(at);
        return NULL;
    }
    for (int s = 0; s < pp; s++) {
        double t = 0;
        for (int c = 0; c < v; c++) {
            int g = c * pp + s, n = chunk_buckets(cost, g, params, at);
            double chunk = 0;
            for (int i = 0; i < n; i++)
                chunk += cost_dp_gather_s(cost, params[i]);
            if (from) {
                from[s * v + c] = t;
                to[s * v + c] = t + chunk;
            }
            if (cost->overlap) { /* forward order: the bottom bucket, the MLP half, ... */
                double first = cost_dp_gather_s(cost, params[n - 1]) + cost_dp_gather_s(cost, params[n - 2]);
                gt[g] = (SchedGather){t + first, t + chunk, 1.0 / cost_chunk_layers(cost, g)};
            }
            t += chunk;
        }
        total[s] = t;
        for (int c = 0; c < v && !cost->overlap; c++)
            gt[c * pp + s] = (SchedGather){t, t, 0};
    }
    free(params);
    free(at);
    return gt;
}

typedef struct Bucket {
    double ready, seconds, params;
} Bucket;

static int cmp_bucket(const void *a, const void *b)
{
    double x = ((const Bucket *)a)->ready, y = ((const Bucket *)b)->ready;
    return x < y ? -1 : x > y;
}

/* The micro-batches of each replica in their order: idx[r * m + order]. */
static void replica_lists(const StepPlan *p, int64_t *idx, int *count)
{
    memset(count, 0, (size_t)p->dp * sizeof *count);
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        const PlanMicroBatch *mb = &p->mbs[i];
        idx[(int64_t)mb->replica * p->m + mb->order] = i;
        count[mb->replica]++;
    }
}

typedef struct Scratch {
    int64_t *idx, *cand;
    int *count;
    double *fwd, *bwd, *p2p;
} Scratch;

static int scratch_alloc(Scratch *s, const StepPlan *p, const CostModel *cost, Error *err)
{
    size_t n = (size_t)p->dp * p->m, per = (size_t)p->m * cost->pp * cost->v;
    s->idx = malloc(n * sizeof *s->idx);
    s->cand = malloc((size_t)p->m * sizeof *s->cand);
    s->count = malloc((size_t)p->dp * sizeof *s->count);
    s->fwd = malloc(per * sizeof *s->fwd);
    s->bwd = malloc(per * sizeof *s->bwd);
    s->p2p = malloc((size_t)p->m * sizeof *s->p2p);
    if (!s->idx || !s->cand || !s->count || !s->fwd || !s->bwd || !s->p2p)
        return error_runtime(err, "pipeline", "out of memory");
    return 0;
}

static void scratch_free(Scratch *s)
{
    free(s->idx);
    free(s->cand);
    free(s->count);
    free(s->fwd);
    free(s->bwd);
    free(s->p2p);
}

/* The step: every replica simulated, then each stage's gradient reduction over DP x CP (its buckets
 * ready when the last micro-batch's backward of every replica has produced them, with overlap; after
 * the slowest replica's pipeline, without). stages (NULL: not wanted) gets the slowest replica's
 * breakdown; tl (NULL: not wanted, else its arrays allocated: sched_step_timeline) the step in time. */
/* Bucket j of stage s's reduction runs [from, to) (tl NULL: nothing to record). */
static void timeline_bucket(SchedTimeline *tl, int s, double from, double to, double params)
{
    if (!tl)
        return;
    int j = tl->n_buckets[s]++;
    WLB_ASSERT(j < tl->max_buckets);
    size_t at = (size_t)s * tl->max_buckets + j;
    tl->bucket_from[at] = from;
    tl->bucket_to[at] = to;
    tl->bucket_params[at] = params;
}

static int step_simulate(const StepPlan *p, const CostModel *cost, double *seconds, SchedBreakdown *stages,
                         SchedTimeline *tl, Error *err)
{
    int pp = cost->pp, chunks = pp * cost->v, dp = p->dp;
    Scratch sc = {0};
    size_t ns = (size_t)dp * pp, nc = (size_t)dp * chunks;
    double *mk = calloc((size_t)dp, sizeof *mk), *gather_total = calloc((size_t)pp, sizeof *gather_total);
    SchedBreakdown *sb = calloc((size_t)pp, sizeof *sb);
    double *st = calloc(7 * ns + 2 * nc, sizeof *st);
    Bucket *bk = NULL;
    int rc = scratch_alloc(&sc, p, cost, err), max_buckets = chunks * 2 + cost->n_layers;
    double *bp = malloc((size_t)(cost->n_layers + 2) * 2 * sizeof *bp), *bat = bp ? bp + cost->n_layers + 2 : NULL;
    if (rc == 0 && (!mk || !gather_total || !st || !sb || !bp || !(bk = malloc((size_t)max_buckets * sizeof *bk))))
        rc = error_runtime(err, "pipeline", "out of memory");
    SchedGather *gt = rc == 0 ? gather_plan(cost, gather_total, tl ? tl->gather_from : NULL,
                                            tl ? tl->gather_to : NULL) : NULL;
    if (rc == 0 && cost->zero && cost->dpcp > 1 && !gt)
        rc = error_runtime(err, "pipeline", "out of memory");
    /* Per replica: stage_end, pp_exposed, pp_hidden, gather_wait (pp each), last backward (chunks). */
    double *end = st, *ppx = st + ns, *pph = st + 2 * ns, *gw = st + 3 * ns, *lbs = st + 4 * ns, *lbe = lbs + nc;
    double *dpx = lbe + nc, *dph = dpx + pp; /* per stage: reduction exposed / hidden (ns >= 2 pp) */
    double *gb = dph + pp;                    /* per replica: gather_beside */
    *seconds = 0;
    int slow = 0;
    if (rc == 0) {
        replica_lists(p, sc.idx, sc.count);
        for (int r = 0; r < dp && rc == 0; r++) {
            SchedTrace tr = {.stage_end = end + (size_t)r * pp, .pp_exposed = ppx + (size_t)r * pp,
                             .pp_hidden = pph + (size_t)r * pp, .gather_wait = gw + (size_t)r * pp,
                             .gather_beside = gb + (size_t)r * pp, .last_bwd_start = lbs + (size_t)r * chunks,
                             .last_bwd_end = lbe + (size_t)r * chunks};
            if (tl) { /* every replica has m micro-batches (sched_step_timeline checked) */
                size_t at = (size_t)r * pp * tl->per_stage;
                tr.pass_start = tl->pass_start + at;
                tr.pass_end = tl->pass_end + at;
                tr.msg_from = tl->msg_from + at;
                tr.msg_shown = tl->msg_shown + at;
                tr.gather_shown = tl->gather_shown + at;
            }
            rc = replica_makespan(p, cost, sc.idx + (int64_t)r * p->m, sc.count[r], sc.fwd, sc.bwd, sc.p2p, gt, &tr,
                                  &mk[r], err);
            if (tl)
                memcpy(tl->p2p + (size_t)r * p->m, sc.p2p, (size_t)sc.count[r] * sizeof *sc.p2p);
            if (mk[r] > mk[slow])
                slow = r;
            *seconds = mk[r] > *seconds ? mk[r] : *seconds;
        }
    }
    for (int s = 0; s < pp && rc == 0; s++) {
        double stage_end = 0, total = 0, done;
        for (int r = 0; r < dp; r++)
            stage_end = end[(size_t)r * pp + s] > stage_end ? end[(size_t)r * pp + s] : stage_end;
        if (cost->overlap) {
            /* A bucket is final once the share of its chunk's last backward pass that produces it
             * (chunk_buckets) is done in every replica, that pass run uniformly over its work; the
             * buckets go out one at a time. */
            int n = 0;
            for (int c = 0; c < cost->v; c++) {
                int g = c * pp + s, nb = chunk_buckets(cost, g, bp, bat);
                for (int j = 0; j < nb; j++) {
                    double ready = 0, one = cost_dp_reduce_s(cost, bp[j]);
                    for (int r = 0; r < dp; r++) {
                        double a = lbs[(size_t)r * chunks + g], b = lbe[(size_t)r * chunks + g];
                        double t = a + (b - a) * bat[j];
                        ready = t > ready ? t : ready;
                    }
                    bk[n++] = (Bucket){ready, one, bp[j]};
                    total += one;
                }
            }
            qsort(bk, (size_t)n, sizeof *bk, cmp_bucket);
            done = 0;
            for (int i = 0; i < n; i++) {
                double from = done > bk[i].ready ? done : bk[i].ready;
                done = from + bk[i].seconds;
                timeline_bucket(tl, s, from, done, bk[i].params);
            }
        } else {
            done = stage_end;
            for (int c = 0; c < cost->v; c++) /* bucket by bucket, as with overlap */
                for (int j = 0, nb = chunk_buckets(cost, c * pp + s, bp, bat); j < nb; j++) {
                    double one = cost_dp_reduce_s(cost, bp[j]);
                    timeline_bucket(tl, s, done, done + one, bp[j]);
                    done += one;
                    total += one;
                }
        }
        /* What outlasts the stage's passes shows; the rest ran beside them (none without overlap). */
        dpx[s] = !cost->overlap ? total : done > stage_end ? done - stage_end : 0;
        dph[s] = cost->overlap && total > dpx[s] ? total - dpx[s] : 0;
        /* The hidden reduction (beside the last backward passes) and the part of the all-gather that
         * ran beside the first forwards slowed those passes. */
        double gather_hidden = gather_total[s] - gw[(size_t)slow * pp + s];
        gather_hidden = gather_hidden > 0 ? gather_hidden : 0;
        double slowed = cost->hw.comm_sm_share * (dph[s] + gb[(size_t)slow * pp + s]);
        /* Then the optimizer step over the stage's parameters (its chunks' buckets), once the
         * reduction is done. */
        double params = 0;
        for (int c = 0; c < cost->v; c++)
            for (int j = 0, nb = chunk_buckets(cost, c * pp + s, bp, bat); j < nb; j++)
                params += bp[j];
        double optimizer = cost_optimizer_s(cost, params);
        double stage_step = stage_end + dpx[s] + slowed + optimizer;
        *seconds = stage_step > *seconds ? stage_step : *seconds;
        if (tl) {
            tl->passes_end[s] = stage_end;
            tl->dp_exposed[s] = dpx[s];
            tl->contention[s] = slowed;
            tl->optimizer_from[s] = stage_end + dpx[s] + slowed;
            tl->optimizer_to[s] = stage_step;
        }
        SchedBreakdown *b = &sb[s];
        b->pp_exposed = ppx[(size_t)slow * pp + s];
        b->pp_hidden = pph[(size_t)slow * pp + s];
        b->dp_exposed = dpx[s] + gw[(size_t)slow * pp + s];
        b->dp_hidden = dph[s] + gather_hidden;
        b->contention = slowed;
        b->optimizer = optimizer;
    }
    if (tl && rc == 0) {
        tl->slowest = slow;
        memcpy(tl->mb_index, sc.idx, (size_t)dp * p->m * sizeof *sc.idx);
    }
    /* What the slowest replica's stages computed; the rest of the step is their bubble. */
    for (int i = 0; rc == 0 && stages && i < sc.count[slow]; i++) {
        const PlanMicroBatch *mb = &p->mbs[sc.idx[(int64_t)slow * p->m + i]];
        for (int g = 0; g < chunks; g++)
            for (int bw = 0; bw < 2; bw++)
                sched_pass_parts(p, mb, cost, g, bw, &sb[g % pp]);
    }
    for (int s = 0; rc == 0 && stages && s < pp; s++) {
        SchedBreakdown *b = &sb[s], *out = &stages[s];
        double shown = b->products + b->attention + b->elementwise + b->tp_exposed + b->cp_exposed + b->pp_exposed +
                       b->dp_exposed + b->contention + b->optimizer;
        b->bubble = *seconds - shown;
        if (b->bubble < 0 && b->bubble > -1e-9 * *seconds)
            b->bubble = 0; /* a stage that never waits: the sum's rounding, not a negative bubble */
        sched_breakdown_add(out, b, 1);
    }
    free(sb);
    free(gt);
    free(bk);
    free(bp);
    free(mk);
    free(gather_total);
    free(st);
    scratch_free(&sc);
    return rc;
}

int sched_step_time(const StepPlan *p, const CostModel *cost, double *seconds, Error *err)
{
    return step_simulate(p, cost, seconds, NULL, NULL, err);
}

int sched_step_breakdown(const StepPlan *p, const CostModel *cost, double *seconds, SchedBreakdown *stages,
                         Error *err)
{
    return step_simulate(p, cost, seconds, stages, NULL, err);
}

int sched_step_timeline(const StepPlan *p, const CostModel *cost, SchedTimeline *tl, Error *err)
{
    memset(tl, 0, sizeof *tl);
    int pp = cost->pp, v = cost->v, dp = p->dp, m = p->m;
    tl->dp = dp;
    tl->pp = pp;
    tl->v = v;
    tl->m = m;
    tl->per_stage = 2 * m * v;
    tl->max_buckets = cost->n_layers + 2 * v;
    int *count = calloc((size_t)dp, sizeof *count);
    if (!count)
        return error_runtime(err, "pipeline", "out of memory");
    for (int64_t i = 0; i < (int64_t)dp * m; i++)
        if (p->mbs[i].replica >= 0 && p->mbs[i].replica < dp)
            count[p->mbs[i].replica]++;
    for (int r = 0; r < dp; r++)
        if (count[r] != m) {
            int have = count[r];
            free(count);
            return error_runtime(err, "pipeline", "step %lld: replica %d has %d micro-batches, not %d",
                                 (long long)p->step + 1, r, have, m);
        }
    free(count);
    size_t passes = (size_t)dp * pp * tl->per_stage, ns = (size_t)pp * tl->max_buckets;
    tl->breakdown = calloc((size_t)pp, sizeof *tl->breakdown);
    tl->mb_index = malloc((size_t)dp * m * sizeof *tl->mb_index);
    tl->p2p = calloc((size_t)dp * m, sizeof *tl->p2p);
    tl->ops = malloc((size_t)pp * tl->per_stage * sizeof *tl->ops);
    /* The per-pass arrays in one block, then the per-stage ones. */
    double *all = calloc(5 * passes + 2 * (size_t)pp * v + 3 * ns + 5 * (size_t)pp, sizeof *all);
    tl->n_buckets = calloc((size_t)pp, sizeof *tl->n_buckets);
    if (!tl->breakdown || !tl->mb_index || !tl->p2p || !tl->ops || !all || !tl->n_buckets) {
        free(all);
        return error_runtime(err, "pipeline", "out of memory for the timeline of step %lld", (long long)p->step + 1);
    }
    double **cols[] = {&tl->pass_start, &tl->pass_end, &tl->msg_from, &tl->msg_shown, &tl->gather_shown};
    for (size_t k = 0; k < 5; k++)
        *cols[k] = all + k * passes;
    tl->gather_from = all + 5 * passes;
    tl->gather_to = tl->gather_from + (size_t)pp * v;
    tl->bucket_from = tl->gather_to + (size_t)pp * v;
    tl->bucket_to = tl->bucket_from + ns;
    tl->bucket_params = tl->bucket_to + ns;
    tl->passes_end = tl->bucket_params + ns;
    tl->dp_exposed = tl->passes_end + pp;
    tl->contention = tl->dp_exposed + pp;
    tl->optimizer_from = tl->contention + pp;
    tl->optimizer_to = tl->optimizer_from + pp;
    for (int s = 0; s < pp; s++)
        sched_stage_ops(s, pp, v, m, tl->ops + (size_t)s * tl->per_stage);
    return step_simulate(p, cost, &tl->step_s, tl->breakdown, tl, err);
}

void sched_timeline_free(SchedTimeline *tl)
{
    free(tl->breakdown);
    free(tl->mb_index);
    free(tl->p2p);
    free(tl->ops);
    free(tl->pass_start); /* the block of every double array */
    free(tl->n_buckets);
    memset(tl, 0, sizeof *tl);
}

static double mb_cost(const StepPlan *p, int64_t i) { return p->mbs[i].fwd_s + p->mbs[i].bwd_s; }

/* Sorts list (n micro-batch indices) by cost, descending. */
static void sort_desc(const StepPlan *p, int64_t *list, int n)
{
    for (int i = 1; i < n; i++) {
        int64_t k = list[i];
        int j = i - 1;
        while (j >= 0 && mb_cost(p, list[j]) < mb_cost(p, k)) {
            list[j + 1] = list[j];
            j--;
        }
        list[j + 1] = k;
    }
}

/* Where the i-th largest of n micro-batches goes: 0 descending, 1 ascending, 2 largest in the middle
 * and the others alternately left and right of it ("organ pipe"). */
static int position(int kind, int i, int n)
{
    if (kind == 0)
        return i;
    if (kind == 1)
        return n - 1 - i;
    return i % 2 ? n / 2 - (i + 1) / 2 : n / 2 + i / 2;
}

int sched_order_replicas(StepPlan *p, const CostModel *cost, Error *err)
{
    Scratch s = {0};
    if (scratch_alloc(&s, p, cost, err) != 0) {
        scratch_free(&s);
        return -1;
    }
    replica_lists(p, s.idx, s.count);
    for (int r = 0; r < p->dp; r++) {
        int n = s.count[r];
        int64_t *list = s.idx + (int64_t)r * p->m;
        sort_desc(p, list, n);
        /* Small micro-batches fill and drain the pipeline faster; which order wins depends on the
         * mix, so simulate each candidate and keep the fastest. */
        double best = -1, t;
        int best_kind = 0;
        for (int kind = 0; kind < 3 && n > 1; kind++) {
            for (int i = 0; i < n; i++)
                s.cand[position(kind, i, n)] = list[i];
            /* (ZeRO-1's all-gather and the gradients' reduction hardly depend on the order: left out.) */
            if (replica_makespan(p, cost, s.cand, n, s.fwd, s.bwd, s.p2p, NULL, NULL, &t, err) != 0) {
                scratch_free(&s);
                return -1;
            }
            if (best < 0 || t < best) {
                best = t;
                best_kind = kind;
            }
        }
        for (int i = 0; i < n; i++)
            p->mbs[list[i]].order = position(best_kind, i, n);
    }
    scratch_free(&s);
    return 0;
}
