/*
 * engine/plan/plan.c - the planner's step: take the step's documents from the stream, pack them
 * (plan_pack.c), shard every micro-batch over the CP ranks (plan_shard.c; several micro-batches at
 * once on balance.plan_threads threads), give the micro-batches to the DP replicas and order them in
 * each replica's pipeline (sched.c); the Plain-4D baselines of a step and the balance of a plan.
 */
#include "engine/plan/plan.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "engine/plan/plan_layout.h"
#include "engine/plan/plan_pack.h"
#include "engine/plan/plan_shard.h"
#include "engine/plan/sched.h"

void plan_free(StepPlan *p)
{
    plan_shard_scratch_free(p);
    free(p->mbs);
    free(p->docs);
    free(p->ranges);
    free(p->segments);
    free(p->ranks);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------------------------------------- */
/* The planner                                                                                     */

int plan_init(Planner *pl, const Config *cfg, const CostModel *cost, DataStream *stream, PackerKind packer,
              CpSharding sharding, Error *err)
{
    memset(pl, 0, sizeof *pl);
    if (cost) {
        pl->plan_cost = *cost;
        cost_set_overlap(&pl->plan_cost, 1);
        pl->cost = &pl->plan_cost;
    }
    pl->priced = cost;
    pl->stream = stream;
    pl->packer = packer;
    pl->sharding = sharding;
    /* auto: OpenMP's default team (OMP_NUM_THREADS, else the CPUs), at most 4. */
    pl->threads = (int)cfg->balance.plan_threads;
    if (pl->threads == 0)
        pl->threads = omp_get_max_threads() < 4 ? omp_get_max_threads() : 4;
    pl->dp = (int)cfg->parallel.dp;
    pl->cp = (int)cfg->parallel.cp;
    pl->pp = (int)cfg->parallel.pp;
    pl->m = (int)config_micro_batches(cfg);
    if (pl->dp <= 0 || pl->m <= 0)
        return error_set(err, "parallel.dp", "the planner needs a number for dp (auto is resolved by a launch; "
                         "set parallel.dp, e.g. --set parallel.dp=8)");
    pl->n_mb = pl->dp * pl->m;
    pl->window = cfg->data.context_window;
    pl->batch_tokens = cfg->data.global_batch_tokens;
    LongDocuments ld = cfg->balance.long_documents;
    pl->cut = ld == LONG_DOCS_CUT || (ld == LONG_DOCS_AUTO && packer != PACKER_WLB);
    if (stream)
        stream->cut_at_windows = pl->cut;
    /* Micro-batches are padded to a multiple of 2 * CP; keep the padded size within S_max. */
    int64_t unit = pl->cp > 1 ? 2 * pl->cp : 1;
    pl->s_max = cfg->balance.max_tokens_per_micro_batch / unit * unit;
    /* A CP rank may hold at most its share of S_max (its activation memory). */
    pl->rank_capacity = pl->s_max / pl->cp;
    pl->n_queues = cfg->balance.outlier_thresholds.n;
    if (pl->n_queues > PLAN_MAX_QUEUES)
        return error_set(err, "balance.outlier_thresholds", "at most %d thresholds, got %d", PLAN_MAX_QUEUES,
                         pl->n_queues);
    for (int i = 0; i < pl->n_queues; i++)
        pl->thresholds[i] = cfg->balance.outlier_thresholds.v[i];
    return 0;
}

void plan_largest(const Planner *pl, int64_t *mb_tokens, int64_t *rank_rows)
{
    int64_t unit = pl->cp > 1 ? 2 * pl->cp : 1;
    int64_t mb = pl->packer == PACKER_WLB ? pl->s_max : (pl->window + unit - 1) / unit * unit;
    /* per_seq and per_doc give every CP rank mb / cp rows; hybrid may put whole documents on a rank
     * up to its capacity. */
    int64_t rows = mb / pl->cp;
    if (pl->cp > 1 && (pl->sharding == CP_HYBRID || pl->sharding == CP_GROUPS) && pl->rank_capacity > rows)
        rows = pl->rank_capacity < mb ? pl->rank_capacity : mb;
    *mb_tokens = mb;
    *rank_rows = rows;
}

void plan_destroy(Planner *pl)
{
    for (int i = 0; i < pl->n_queues; i++)
        free(pl->queues[i].items);
    free(pl->remained.items);
    memset(pl, 0, sizeof *pl);
}

/* Replica assignment: micro-batches by descending cost, each to the replica with the least total
 * so far among those with fewer than M (longest-processing-time first with a count limit). */
static void assign_replicas(StepPlan *p, int64_t *load_scratch_count, double *load)
{
    int64_t n = (int64_t)p->dp * p->m;
    int64_t *idx = load_scratch_count; /* n entries: order, then counts */
    for (int64_t i = 0; i < n; i++)
        idx[i] = i;
    /* insertion sort by cost, descending: n is the number of micro-batches, small */
    for (int64_t i = 1; i < n; i++) {
        int64_t k = idx[i];
        double c = p->mbs[k].fwd_s + p->mbs[k].bwd_s;
        int64_t j = i - 1;
        while (j >= 0 && p->mbs[idx[j]].fwd_s + p->mbs[idx[j]].bwd_s < c) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = k;
    }
    int *count = calloc((size_t)p->dp, sizeof *count);
    for (int r = 0; r < p->dp; r++)
        load[r] = 0;
    for (int64_t i = 0; i < n; i++) {
        PlanMicroBatch *mb = &p->mbs[idx[i]];
        int best = -1;
        for (int r = 0; r < p->dp; r++)
            if (count[r] < p->m && (best < 0 || load[r] < load[best]))
                best = r;
        mb->replica = best;
        mb->order = count[best]++;
        load[best] += mb->fwd_s + mb->bwd_s;
    }
    free(count);
}

/* Gives the sharded micro-batches to the DP replicas and orders each replica's pipeline. */
static int plan_arrange(const Planner *pl, StepPlan *p, Error *err)
{
    int64_t n_mb = (int64_t)pl->n_mb;
    if (pl->packer == PACKER_FIXED) {
        /* Plain-4D: the stream's windows in order, replica after replica. */
        for (int64_t i = 0; i < n_mb; i++) {
            p->mbs[i].replica = (int32_t)(i / pl->m);
            p->mbs[i].order = (int32_t)(i % pl->m);
        }
        return 0;
    }
    int64_t *scratch = malloc((size_t)n_mb * sizeof *scratch);
    double *load = malloc((size_t)pl->dp * sizeof *load);
    if (!scratch || !load) {
        free(scratch);
        free(load);
        return error_runtime(err, "planner", "out of memory");
    }
    assign_replicas(p, scratch, load);
    free(scratch);
    free(load);
    return sched_order_replicas(p, pl->cost, err);
}

int plan_step(Planner *pl, StepPlan *p, Error *err)
{
    plan_reset(p, pl->step, pl->dp, pl->m, pl->cp);
    if (!p->mbs)
        return error_runtime(err, "planner", "out of memory");
    int rc;
    switch (pl->packer) {
    case PACKER_FIXED:
        rc = plan_pack_fixed(pl, p, err);
        break;
    case PACKER_FIXED_GREEDY:
        rc = plan_pack_fixed_greedy(pl, p, err);
        break;
    default:
        rc = plan_pack_wlb(pl, p, err);
        break;
    }
    if (rc != 0)
        return -1;
    if (plan_shard_step(p, pl->n_mb, pl->sharding, pl->cost, pl->rank_capacity, pl->threads, err) != 0)
        return -1;
    if (plan_arrange(pl, p, err) != 0)
        return -1;
    if (!pl->priced->overlap)
        plan_price(p, pl->priced);
    for (int64_t i = 0; i < p->n_docs; i++) {
        const PlanDoc *d = &p->docs[i];
        if (d->source == PLAN_PAD_SOURCE) {
            p->pad_tokens += d->len;
        } else {
            p->tokens += d->len;
            p->delay_token_steps += (double)d->len * (double)(p->step - d->arrival);
            p->delayed_tokens += d->arrival < p->step ? d->len : 0;
        }
    }
    p->queued = 0;
    for (int i = 0; i < pl->n_queues; i++)
        p->queued += pl->queues[i].n;
    p->carried = pl->remained.n;
    pl->step++;
    return 0;
}

/* A baseline's windows (plan_pack_baseline), each sharded per_seq. */
static int baseline(const Planner *pl, const StepPlan *src, StepPlan *out, int cut, Error *err)
{
    if (plan_pack_baseline(pl, src, out, cut, err) != 0)
        return -1;
    for (int64_t i = 0; i < (int64_t)out->dp * out->m; i++)
        if (plan_shard(out, i, CP_PER_SEQ, pl->cost, pl->rank_capacity, err) != 0)
            return -1;
    if (!pl->priced->overlap)
        plan_price(out, pl->priced);
    return 0;
}

int plan_baseline(const Planner *pl, const StepPlan *src, StepPlan *out, Error *err)
{
    return baseline(pl, src, out, 1, err);
}

int plan_baseline_equal_work(const Planner *pl, const StepPlan *src, StepPlan *out, Error *err)
{
    return baseline(pl, src, out, 0, err);
}

double plan_attn_pairs(const StepPlan *p)
{
    double pairs = 0;
    for (int64_t k = 0; k < p->n_docs; k++)
        if (p->docs[k].source != PLAN_PAD_SOURCE)
            pairs += (double)p->docs[k].len * (double)(p->docs[k].len + 1) / 2;
    return pairs;
}

double plan_pp_imbalance(const StepPlan *p)
{
    int64_t n = (int64_t)p->dp * p->m;
    double worst = 0, total = 0;
    for (int64_t i = 0; i < n; i++) {
        double c = p->mbs[i].fwd_s + p->mbs[i].bwd_s;
        worst = c > worst ? c : worst;
        total += c;
    }
    return total > 0 ? worst * (double)n / total : 1;
}

double plan_rank_compute(const StepPlan *p, const PlanMicroBatch *mb, int r)
{
    const PlanRank *k = &p->ranks[mb->first_rank + r];
    return k->attn_fwd_s + k->attn_bwd_s + k->linear_fwd_s + k->linear_bwd_s;
}

/* Micro-batch i's slowest CP rank over its CP mean, of each rank's compute, with its K/V exchange
 * (and TP all-reduces) when with_comm; 0 when it holds nothing. */
static double mb_imbalance(const StepPlan *p, int64_t i, int with_comm)
{
    const PlanMicroBatch *mb = &p->mbs[i];
    double mx = 0, sum = 0;
    for (int r = 0; r < p->cp; r++) {
        const PlanRank *k = &p->ranks[mb->first_rank + r];
        double t = plan_rank_compute(p, mb, r) + (with_comm ? k->comm_fwd_s + k->comm_bwd_s : 0);
        mx = t > mx ? t : mx;
        sum += t;
    }
    return sum > 0 ? mx * p->cp / sum : 0;
}

/* The worst micro-batch's imbalance (mb_imbalance); *worst_mb (may be NULL) its index, -1 when all
 * are even. */
static double cp_imbalance(const StepPlan *p, int with_comm, int64_t *worst_mb)
{
    double worst = 1;
    if (worst_mb)
        *worst_mb = -1;
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        double imb = mb_imbalance(p, i, with_comm);
        if (imb >= worst) {
            worst = imb;
            if (worst_mb)
                *worst_mb = i;
        }
    }
    return worst;
}

double plan_cp_imbalance(const StepPlan *p, int64_t *worst_mb) { return cp_imbalance(p, 0, worst_mb); }

double plan_cp_time_imbalance(const StepPlan *p) { return cp_imbalance(p, 1, NULL); }

/* CRC-32 of n fixed-size fields, field by field (no struct padding). */
#define DIGEST(crc, v) ((crc) = crc32((crc), (const Bytef *)&(v), sizeof(v)))

uint32_t plan_digest(const StepPlan *p)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    DIGEST(crc, p->step);
    DIGEST(crc, p->dp);
    DIGEST(crc, p->m);
    DIGEST(crc, p->cp);
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        const PlanMicroBatch *mb = &p->mbs[i];
        DIGEST(crc, mb->replica);
        DIGEST(crc, mb->order);
        DIGEST(crc, mb->tokens);
        DIGEST(crc, mb->first_doc);
        DIGEST(crc, mb->n_docs);
        DIGEST(crc, mb->first_rank);
    }
    for (int64_t i = 0; i < p->n_docs; i++) {
        const PlanDoc *d = &p->docs[i];
        DIGEST(crc, d->source);
        DIGEST(crc, d->doc);
        DIGEST(crc, d->offset);
        DIGEST(crc, d->len);
        DIGEST(crc, d->start);
        DIGEST(crc, d->rank);
        DIGEST(crc, d->group_first);
        DIGEST(crc, d->group_size);
    }
    for (int64_t i = 0; i < p->n_ranges; i++) {
        DIGEST(crc, p->ranges[i].rank);
        DIGEST(crc, p->ranges[i].start);
        DIGEST(crc, p->ranges[i].len);
    }
    for (int64_t i = 0; i < p->n_segments; i++) {
        DIGEST(crc, p->segments[i].rank);
        DIGEST(crc, p->segments[i].q_start);
        DIGEST(crc, p->segments[i].q_len);
        DIGEST(crc, p->segments[i].kv_start);
    }
    for (int64_t i = 0; i < p->n_ranks; i++) {
        DIGEST(crc, p->ranks[i].tokens);
        DIGEST(crc, p->ranks[i].first_range);
        DIGEST(crc, p->ranks[i].n_ranges);
        DIGEST(crc, p->ranks[i].first_segment);
        DIGEST(crc, p->ranks[i].n_segments);
        DIGEST(crc, p->ranks[i].exchanges);
    }
    return (uint32_t)crc;
}
