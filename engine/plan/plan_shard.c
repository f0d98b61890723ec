/*
 * engine/plan/plan_shard.c - the second pass: splitting each micro-batch over the CP ranks
 * (balance.cp_sharding), the fastest of the mode's candidates kept.
 *
 *   per_seq   Llama 3: the micro-batch cut into 2 CP equal chunks; rank i holds chunks i and
 *             2 CP - 1 - i. Balanced for one long document, not for a mix: the rank holding the
 *             tail of a long document does most of its attention.
 *   per_doc   WLB-LLM: every document cut into 2 CP chunks, rank i holds chunks i and 2 CP - 1 - i
 *             of each. The d mod 2 CP leftover tokens of a document enlarge single chunks, chosen by
 *             a counter that runs on across documents through the front chunks of ranks 0..CP-1,
 *             then their back chunks: every rank ends with the same token count when the
 *             micro-batch is a multiple of 2 CP tokens, without padding (papers.md §1.5).
 *             Short documents make chunks shorter than the kernel tile, which wastes work.
 *   adaptive  WLB-LLM's selector: per micro-batch, whichever of the two predicts the lower time.
 *   hybrid    ours (FlexSP's idea inside an all-gather CP group): per document, shard it as
 *             per_doc or place it whole on one rank, where it needs no K/V exchange and runs at
 *             full kernel tiles. Short documents gain most from staying whole (their per_doc chunks
 *             are shorter than a tile) and cost least to balance; long ones must be sharded. So the
 *             candidates are length thresholds L = tile, 2 tile, 4 tile, ... up to a rank's share of
 *             S_max: documents of L tokens or more are sharded, the shorter ones placed whole,
 *             longest first, each on the rank with the least predicted time that has room
 *             (longest-processing-time first). Every candidate is predicted exactly, with per_seq
 *             and per_doc beside them, and the fastest is kept: hybrid never predicts worse than
 *             either (plan_hybrid.c). (A document-by-document greedy does not work: the first
 *             whole document always makes one rank slower than sharding it would, before the
 *             later ones even it.)
 *   groups    hybrid, and per micro-batch each document sharded per_doc over an aligned block of
 *             CP ranks of a power-of-two size (blocks may nest) or kept whole, a few cut unevenly
 *             over theirs (plan_groups*.c); the faster of the two is kept.
 * The candidates are built with plan_layout.c's primitives.
 * Times are per layer: a CP rank's attention over its segments, its GEMMs and element-wise work for
 * its tokens, its TP all-reduces, and the K/V all-gathers of its blocks; CP ranks meet at every layer, so
 * a micro-batch takes the slowest rank's time, forward plus backward.
 */
#include "engine/plan/plan_shard.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "util/array.h"

/* Scratch slot t (the t-th micro-batch laid out at once), its layouts allocated for cp ranks. */
static ShardScratch *scratch_for(StepPlan *p, int t, int cp)
{
    ShardScratch *sc = p->shard_scratch[t];
    if (!sc) {
        sc = p->shard_scratch[t] = calloc(1, sizeof *sc);
        if (!sc)
            return NULL;
    }
    Shard *all[] = {&sc->seq, &sc->doc, &sc->hybrid.layout, &sc->groups.layout, &sc->groups.alt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (shard_alloc(all[i], cp) != 0)
            return NULL;
    return sc;
}

void plan_shard_scratch_free(StepPlan *p)
{
    for (int t = 0; t < PLAN_MAX_THREADS; t++) {
        ShardScratch *sc = p->shard_scratch[t];
        if (!sc)
            continue;
        shard_free(&sc->seq);
        shard_free(&sc->doc);
        hybrid_free(&sc->hybrid);
        plan_groups_free(&sc->groups);
        free(sc);
        p->shard_scratch[t] = NULL;
    }
}

static int64_t shard_max_tokens(const Shard *s)
{
    int64_t mx = 0;
    for (int r = 0; r < s->cp; r++)
        mx = s->tokens[r] > mx ? s->tokens[r] : mx;
    return mx;
}

/* 1 when a is faster than b per layer and over the whole pipeline: the sum of what the pipeline
 * schedule takes of a micro-batch (sched_micro_batch_times) - forward and backward of every layer,
 * the output layer on the most rows a CP rank holds, and the sends of those rows between stages.
 * (Uneven CP ranks cost the last stage's output layer and the sends more than their per-layer
 * time shows.) */
static int shard_faster(const Shard *a, const Shard *b, const CostModel *cost)
{
    double af, ab, bf, bb;
    shard_mb_times(a, cost, &af, &ab);
    shard_mb_times(b, cost, &bf, &bb);
    int64_t ma = shard_max_tokens(a), mb = shard_max_tokens(b);
    double sends = 2.0 * (cost->pp * cost->v - 1);
    double ta = cost->n_layers * (af + ab) + cost_head_fwd_s(cost, ma) + cost_head_bwd_s(cost, ma) +
                sends * cost_p2p_s(cost, ma);
    double tb = cost->n_layers * (bf + bb) + cost_head_fwd_s(cost, mb) + cost_head_bwd_s(cost, mb) +
                sends * cost_p2p_s(cost, mb);
    return af + ab < bf + bb && ta < tb;
}

/* Candidate s (mode m) chosen when it is the first or its forward + backward per layer, as the plan
 * records them, is less than *best. */
static void pick(const Shard *s, CpSharding m, const CostModel *cost, double *best, const Shard **chosen,
                 PlanMicroBatch *mb)
{
    double f, b;
    shard_mb_times(s, cost, &f, &b);
    if (!*chosen || f + b < *best) {
        *best = f + b;
        *chosen = s;
        mb->mode = m;
    }
}

/* Micro-batch mb's layout, chosen in sc (*chosen, one of sc's candidates; mb->mode set). Reads only
 * mb's documents and writes only mb->mode and sc: threads run it on different micro-batches at once.
 * Returns -1 out of memory. */
static int shard_choose(ShardScratch *sc, const PlanDoc *docs, PlanMicroBatch *mb, int cp, CpSharding mode,
                        const CostModel *cost, int64_t rank_capacity, const Shard **chosen_out)
{
    int64_t n = mb->n_docs;
    Shard *seq = &sc->seq, *doc = &sc->doc, *hyb = &sc->hybrid.layout, *grp = &sc->groups.layout;
    if (shard_reset(seq, n) != 0 || shard_reset(doc, n) != 0)
        return -1;
    const Shard *chosen;
    int rc = 0;
    if (cp == 1) {
        /* One rank holds everything; every document is whole. */
        for (int64_t k = 0; k < n && rc == 0; k++)
            rc = shard_whole(seq, cost, docs, k, 0);
        chosen = seq;
        mb->mode = CP_PER_SEQ;
    } else {
        double t_seq = -1, t_hyb = -1, t_grp = -1;
        if (mode != CP_PER_DOC && (rc = shard_per_seq(seq, cost, docs, n, mb->tokens)) == 0)
            t_seq = shard_time(seq, cost);
        int with_hybrid = mode == CP_HYBRID || mode == CP_GROUPS;
        /* hybrid is kept only when faster than per_seq (and per_doc): a candidate that cannot beat
         * per_seq is dropped early. groups needs hybrid's own best (its bound and threshold). */
        if (rc == 0 && with_hybrid)
            rc = hybrid_best(&sc->hybrid, cost, docs, n, rank_capacity, mode == CP_HYBRID ? t_seq : 0, &t_hyb);
        /* groups: aligned blocks need cp a power of two (the config insists); otherwise hybrid. */
        if (rc == 0 && mode == CP_GROUPS && (cp & (cp - 1)) == 0)
            rc = plan_groups_best(&sc->groups, cost, docs, n, &sc->hybrid, rank_capacity, t_hyb, &t_grp);
        /* The fastest of the candidates as the plan records them, the K/V exchange priced with what
         * hides of it (the searches above take it whole, shard_time; the block-by-block exchange
         * hides much of it behind the sharded documents' own attention, which favours sharding);
         * ties go to the one tried first: per_seq, hybrid, per_doc. per_doc is laid out when it is
         * the mode or adaptive's other candidate, and beside hybrid only when even with all of its
         * exchange hidden it could be the fastest. */
        double best = INFINITY;
        chosen = NULL;
        if (rc == 0 && t_seq >= 0)
            pick(seq, CP_PER_SEQ, cost, &best, &chosen, mb);
        if (rc == 0 && t_hyb >= 0)
            pick(hyb, CP_HYBRID, cost, &best, &chosen, mb);
        int doc_wanted = mode == CP_PER_DOC || mode == CP_ADAPTIVE;
        if (rc == 0 && with_hybrid) {
            double ex = 2 * cost_cp_comm_group_s(cost, cp, mb->tokens);
            doc_wanted = hybrid_lower_bound(cost, docs, n, cp, sc->hybrid.whole, sc->hybrid.shard_lb, 0) - ex < best;
        }
        for (int64_t k = 0; k < n && rc == 0 && doc_wanted; k++)
            rc = shard_per_doc(doc, cost, docs, k);
        if (rc == 0 && doc_wanted)
            pick(doc, CP_PER_DOC, cost, &best, &chosen, mb);
        /* groups against the rest on the figures the plan records, forward and backward, so that it
         * is never predicted worse than hybrid there either, nor in the pipeline. */
        if (t_grp >= 0 && shard_faster(grp, chosen, cost)) {
            chosen = grp;
            mb->mode = CP_GROUPS;
        }
    }
    *chosen_out = chosen;
    return rc;
}

/* Lays out micro-batches list[0 .. n - 1] of p (n at most PLAN_MAX_THREADS) at once, on up to
 * `threads` threads, list[j] in plan scratch j: chosen[j] is its layout (each micro-batch's mode
 * set), to be copied into the plan with shard_commit before the next call. Reads only their
 * documents. -1 out of memory. */
static int lay_out(StepPlan *p, const int64_t *list, int n, CpSharding mode, const CostModel *cost,
                   int64_t rank_capacity, int threads, const Shard **chosen)
{
    for (int j = 0; j < n; j++)
        if (!scratch_for(p, j, p->cp))
            return -1;
    threads = threads < n ? threads : n;
    /* Each thread lays out the next micro-batch of the list not yet taken, in that micro-batch's
     * scratch; the team may be smaller than asked, which changes nothing but the time. */
    int failed = 0;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(dynamic, 1) reduction(| : failed)
    for (int j = 0; j < n; j++) {
        PlanMicroBatch *mb = &p->mbs[list[j]];
        failed |= shard_choose(p->shard_scratch[j], p->docs + mb->first_doc, mb, p->cp, mode, cost,
                               rank_capacity, &chosen[j]) != 0;
    }
    return failed ? -1 : 0;
}

/* Micro-batches list[0 .. n - 1] laid out at once, then copied into the plan in list order. */
static int lay_out_and_commit(StepPlan *p, const int64_t *list, int n, CpSharding mode, const CostModel *cost,
                              int64_t rank_capacity, int threads, Error *err)
{
    const Shard *chosen[PLAN_MAX_THREADS];
    if (p->cp > 1024)
        return error_set(err, "parallel.cp", "at most 1024, got %d", p->cp);
    if (lay_out(p, list, n, mode, cost, rank_capacity, threads, chosen) != 0)
        return error_runtime(err, "planner", "out of memory");
    for (int j = 0; j < n; j++)
        if (shard_commit(p, &p->mbs[list[j]], chosen[j], cost) != 0)
            return error_runtime(err, "planner", "out of memory");
    return 0;
}

int plan_shard(StepPlan *p, int64_t i, CpSharding mode, const CostModel *cost, int64_t rank_capacity, Error *err)
{
    return lay_out_and_commit(p, &i, 1, mode, cost, rank_capacity, 1, err);
}

int plan_shard_step(StepPlan *p, int64_t n_mb, CpSharding mode, const CostModel *cost, int64_t rank_capacity,
                    int threads, Error *err)
{
    /* Up to PLAN_MAX_THREADS micro-batches at once. */
    int64_t list[PLAN_MAX_THREADS];
    for (int64_t first = 0; first < n_mb; first += PLAN_MAX_THREADS) {
        int n = n_mb - first < PLAN_MAX_THREADS ? (int)(n_mb - first) : PLAN_MAX_THREADS;
        for (int j = 0; j < n; j++)
            list[j] = first + j;
        if (lay_out_and_commit(p, list, n, mode, cost, rank_capacity, threads, err) != 0)
            return -1;
    }
    return 0;
}
