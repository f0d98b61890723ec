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
    int pp = r->pp, v = r->v, n_mb = r->n_mb, chunks = pp * v, per_stage = 2 * n_mb * v;
    *makespan = 0;
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
                double ready = 0;
                if (!op.backward && g > 0) {
                    double e = end_f[at - 1];
                    if (e < 0)
                        break;
                    ready = e + r->p2p[op.mb];
                } else if (op.backward && g < chunks - 1) {
                    double e = end_b[at + 1];
                    if (e < 0)
                        break;
                    ready = e + r->p2p[op.mb];
                } else if (op.backward) {
                    if (end_f[at] < 0)
                        break;
                    ready = end_f[at];
                }
                double start = ready > free_at[s] ? ready : free_at[s];
                double dur = op.backward ? r->bwd[at] : r->fwd[at];
                free_at[s] = start + dur;
                (op.backward ? end_b : end_f)[at] = free_at[s];
                next[s]++;
                done_ops++;
                progress = 1;
            }
        }
        WLB_ASSERT(progress); /* a valid 1F1B order always has a pass whose inputs are ready */
    }
    for (int s = 0; s < pp; s++)
        *makespan = free_at[s] > *makespan ? free_at[s] : *makespan;
done:
    free(ops);
    free(end_f);
    free(end_b);
    free(free_at);
    free(next);
    return rc;
}

void sched_micro_batch_times(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, double *fwd,
                             double *bwd, double *p2p)
{
    int chunks = cost->pp * cost->v;
    int64_t max_tokens = 0;
    for (int r = 0; r < p->cp; r++) {
        int64_t t = p->ranks[mb->first_rank + r].tokens;
        max_tokens = t > max_tokens ? t : max_tokens;
    }
    /* mb->bwd_s already holds train.recompute's work (cost_linear_bwd_s, cost_attn_fb_s and the
     * exchanges charge it). */
    double layer_bwd = mb->bwd_s;
    for (int g = 0; g < chunks; g++) {
        int layers = cost_chunk_layers(cost, g);
        fwd[g] = layers * mb->fwd_s;
        bwd[g] = layers * layer_bwd;
        if (g == 0 && max_tokens > 0) {
            fwd[g] += cost_embed_fwd_s(cost, max_tokens);
            bwd[g] += cost_embed_bwd_s(cost, max_tokens);
        }
        if (g == chunks - 1 && max_tokens > 0) {
            fwd[g] += cost_head_fwd_s(cost, max_tokens);
            bwd[g] += cost_head_bwd_s(cost, max_tokens);
        }
    }
    *p2p = cost_p2p_s(cost, max_tokens);
}

/* Simulates replica r with its micro-batches in the order given by mb_index (count n). */
static int replica_makespan(const StepPlan *p, const CostModel *cost, const int64_t *mb_index, int n, double *fwd,
                            double *bwd, double *p2p, double *makespan, Error *err)
{
    int chunks = cost->pp * cost->v;
    for (int i = 0; i < n; i++)
        sched_micro_batch_times(p, &p->mbs[mb_index[i]], cost, fwd + (size_t)i * chunks, bwd + (size_t)i * chunks,
                                &p2p[i]);
    SchedReplica rep = {cost->pp, cost->v, n, fwd, bwd, p2p};
    return sched_makespan(&rep, makespan, err);
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

/* Predicted makespan of each replica (replica_s has p->dp entries). */
static int replica_times(const StepPlan *p, const CostModel *cost, double *replica_s, Error *err)
{
    Scratch s = {0};
    int rc = scratch_alloc(&s, p, cost, err);
    if (rc == 0) {
        replica_lists(p, s.idx, s.count);
        for (int r = 0; r < p->dp && rc == 0; r++)
            rc = replica_makespan(p, cost, s.idx + (int64_t)r * p->m, s.count[r], s.fwd, s.bwd, s.p2p,
                                  &replica_s[r], err);
    }
    scratch_free(&s);
    return rc;
}

int sched_step_time(const StepPlan *p, const CostModel *cost, double *seconds, Error *err)
{
    double *rep = malloc((size_t)p->dp * sizeof *rep);
    if (!rep)
        return error_runtime(err, "pipeline", "out of memory");
    int rc = replica_times(p, cost, rep, err);
    *seconds = 0;
    for (int r = 0; rc == 0 && r < p->dp; r++)
        *seconds = rep[r] > *seconds ? rep[r] : *seconds;
    free(rep);
    return rc;
}

int sched_stage_busy(const StepPlan *p, const CostModel *cost, double *busy, Error *err)
{
    int chunks = cost->pp * cost->v;
    double *fwd = malloc((size_t)chunks * sizeof *fwd), *bwd = malloc((size_t)chunks * sizeof *bwd), p2p;
    int rc = fwd && bwd ? 0 : error_runtime(err, "pipeline", "out of memory");
    for (int64_t i = 0; rc == 0 && i < (int64_t)p->dp * p->m; i++) {
        sched_micro_batch_times(p, &p->mbs[i], cost, fwd, bwd, &p2p);
        for (int g = 0; g < chunks; g++)
            busy[g % cost->pp] += fwd[g] + bwd[g];
    }
    free(fwd);
    free(bwd);
    return rc;
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
            if (replica_makespan(p, cost, s.cand, n, s.fwd, s.bwd, s.p2p, &t, err) != 0) {
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
