/*
 * engine/plan/plan_shard.c - splitting a micro-batch over the CP ranks (balance.cp_sharding).
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
 *             either. (A document-by-document greedy does not work: the first whole document
 *             always makes one rank slower than sharding it would, before the later ones even it.)
 *   groups    hybrid, and per micro-batch each document sharded per_doc over an aligned block of
 *             CP ranks of a power-of-two size (blocks may nest) or kept whole, a few cut unevenly
 *             over theirs (plan_groups*.c); the faster of the two is kept.
 * Times are per layer: a CP rank's attention over its segments, its GEMMs and element-wise work for
 * its tokens, its TP all-reduces, and the K/V all-gathers of its blocks; CP ranks meet at every layer, so
 * a micro-batch takes the slowest rank's time, forward plus backward.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "engine/plan/plan_shard_impl.h"
#include "util/array.h"

static void shard_free_ranks(Shard *s)
{
    free(s->last_range);
    free(s->tokens);
    free(s->attn);
    free(s->attn_fwd);
    free(s->attn_bwd);
    free(s->blk_sharded);
    free(s->uneven);
    free(s->own);
    free(s->counter);
}

int shard_alloc(Shard *s, int cp)
{
    if (s->cp == cp)
        return 0;
    shard_free_ranks(s);
    s->cp = cp;
    size_t n = (size_t)cp;
    s->last_range = malloc(n * sizeof *s->last_range);
    s->tokens = malloc(n * sizeof *s->tokens);
    s->attn = malloc(n * sizeof *s->attn);
    s->attn_fwd = malloc(n * sizeof *s->attn_fwd);
    s->attn_bwd = malloc(n * sizeof *s->attn_bwd);
    s->blk_sharded = malloc(2 * n * sizeof *s->blk_sharded);
    s->uneven = malloc(2 * n * sizeof *s->uneven);
    s->own = malloc(n * SHARD_DEPTHS * sizeof *s->own);
    s->counter = malloc(2 * n * sizeof *s->counter);
    return s->last_range && s->tokens && s->attn && s->attn_fwd && s->attn_bwd && s->blk_sharded && s->uneven &&
                   s->own && s->counter
               ? 0
               : -1;
}

int shard_reset(Shard *s, int64_t n_docs)
{
    int32_t *doc_rank = array_grow(s->doc_rank, &s->cap_docs, n_docs, sizeof *doc_rank);
    if (!doc_rank)
        return -1;
    s->doc_rank = doc_rank;
    int32_t *doc_first = array_grow(s->doc_first, &s->cap_doc_first, n_docs, sizeof *doc_first);
    if (!doc_first)
        return -1;
    s->doc_first = doc_first;
    int32_t *doc_size = array_grow(s->doc_size, &s->cap_doc_size, n_docs, sizeof *doc_size);
    if (!doc_size)
        return -1;
    s->doc_size = doc_size;
    for (int64_t k = 0; k < n_docs; k++) {
        s->doc_rank[k] = -1;
        s->doc_first[k] = 0;
        s->doc_size[k] = s->cp;
    }
    s->n_ranges = s->n_segs = s->sharded = 0;
    for (int r = 0; r < s->cp; r++) {
        s->last_range[r] = -1;
        s->tokens[r] = 0;
        s->attn[r] = s->attn_fwd[r] = s->attn_bwd[r] = 0;
    }
    for (int v = 0; v < 2 * s->cp; v++) {
        s->blk_sharded[v] = 0;
        s->uneven[v] = 0;
        s->counter[v] = 0;
    }
    for (int i = 0; i < s->cp * SHARD_DEPTHS; i++)
        s->own[i] = 0;
    return 0;
}

void shard_free(Shard *s)
{
    free(s->doc_rank);
    free(s->doc_first);
    free(s->doc_size);
    free(s->ranges);
    free(s->segs);
    shard_free_ranks(s);
}

static int add_range(Shard *s, int r, int64_t start, int64_t len)
{
    if (len <= 0)
        return 0;
    s->tokens[r] += len;
    int64_t last = s->last_range[r];
    if (last >= 0 && s->ranges[last].start + s->ranges[last].len == start) {
        s->ranges[last].len += len;
        return 0;
    }
    PlanRange *ranges = array_grow(s->ranges, &s->cap_ranges, s->n_ranges + 1, sizeof *ranges);
    if (!ranges)
        return -1;
    s->ranges = ranges;
    s->last_range[r] = s->n_ranges;
    s->ranges[s->n_ranges++] = (PlanRange){r, start, len};
    return 0;
}

static int add_segment(Shard *s, const CostModel *cost, int r, int64_t q_start, int64_t q_len, int64_t kv_start)
{
    if (q_len <= 0)
        return 0;
    PlanSegment *segs = array_grow(s->segs, &s->cap_segs, s->n_segs + 1, sizeof *segs);
    if (!segs)
        return -1;
    s->segs = segs;
    s->segs[s->n_segs++] = (PlanSegment){r, q_start, q_len, kv_start};
    int64_t kv_len = q_start + q_len - kv_start;
    double f, b;
    cost_attn_fb_s(cost, q_len, kv_len, &f, &b);
    s->attn_fwd[r] += f;
    s->attn_bwd[r] += b;
    s->attn[r] += f + b;
    return 0;
}

int shard_piece(Shard *s, const CostModel *cost, int r, int64_t start, int64_t len, int64_t kv_start)
{
    return add_range(s, r, start, len) != 0 || add_segment(s, cost, r, start, len, kv_start) != 0 ? -1 : 0;
}

/* Document k held whole by rank r: one range, one segment, nothing exchanged. */
int shard_whole(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int r)
{
    s->doc_rank[k] = r;
    s->doc_first[k] = r;
    s->doc_size[k] = 1;
    return shard_piece(s, cost, r, docs[k].start, docs[k].len, docs[k].start);
}

/* Chunk sizes of a document of len tokens cut per_doc: len / 2CP each, and the len mod 2CP leftover
 * tokens one each to the chunks the counter points at, the counter running on across documents
 * (as WLB-LLM's artifact does). Chunk c and chunk 2CP - 1 - c share a rank, so every rank gets one
 * of the first CP leftovers of a cycle and one of the next CP: rank counts differ by at most one,
 * and not at all when the micro-batch is a multiple of 2 CP tokens. */
void shard_per_doc_chunks(int g, int64_t len, int *counter, int64_t *size)
{
    int n = 2 * g;
    for (int c = 0; c < n; c++)
        size[c] = len / n;
    for (int64_t e = 0; e < len % n; e++)
        size[(*counter)++ % n]++;
}

/* Document k sharded per_doc over the g CP ranks first .. first + g - 1 (an aligned block): chunk i
 * and 2 g - 1 - i of it on rank first + i. Each block runs its own leftover counter. */
int shard_per_doc_group(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g)
{
    int64_t size[2 * 1024];
    shard_per_doc_chunks(g, docs[k].len, &s->counter[plan_block_of(s->cp, first, g)], size);
    return shard_chunks(s, cost, docs, k, first, g, size);
}

int shard_chunks(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g,
                 const int64_t *size)
{
    const PlanDoc *d = &docs[k];
    int64_t at = d->start;
    int v = plan_block_of(s->cp, first, g), h = plan_block_depth(v);
    for (int c = 0; c < 2 * g; c++) {
        int r = first + (c < g ? c : 2 * g - 1 - c);
        if (shard_piece(s, cost, r, at, size[c], d->start) != 0)
            return -1;
        s->own[r * SHARD_DEPTHS + h] += size[c];
        at += size[c];
    }
    s->doc_rank[k] = -1;
    s->doc_first[k] = first;
    s->doc_size[k] = g;
    s->blk_sharded[v] += d->len;
    s->sharded += d->len;
    return 0;
}

/* A document sharded per_doc over the whole CP group. */
static int shard_per_doc(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k)
{
    return shard_per_doc_group(s, cost, docs, k, 0, s->cp);
}

/* The whole micro-batch per_seq: chunk c is [c T / 2CP, (c + 1) T / 2CP); a document crossing
 * chunks gives one segment per chunk, each with keys from the document's start. */
static int shard_per_seq(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t n_docs, int64_t total)
{
    int n = 2 * s->cp;
    int64_t k = 0;
    for (int c = 0; c < n; c++) {
        int64_t cs = total * c / n, ce = total * (c + 1) / n;
        int r = c < s->cp ? c : n - 1 - c;
        if (add_range(s, r, cs, ce - cs) != 0)
            return -1;
        while (k < n_docs && docs[k].start + docs[k].len <= cs)
            k++;
        for (int64_t j = k; j < n_docs && docs[j].start < ce; j++) {
            int64_t qs = docs[j].start > cs ? docs[j].start : cs;
            int64_t qe = docs[j].start + docs[j].len < ce ? docs[j].start + docs[j].len : ce;
            if (add_segment(s, cost, r, qs, qe - qs, docs[j].start) != 0)
                return -1;
        }
    }
    s->sharded = total;
    s->blk_sharded[1] = total;
    return 0;
}

/* Predicted seconds of one layer, forward + backward, of a rank with this attention time and tokens:
 * attention, GEMMs and element-wise work, TP all-reduces. */
double shard_rank_time_with(const CostModel *cost, double attn, int64_t tokens)
{
    return attn + cost_linear_fwd_s(cost, tokens) + cost_linear_bwd_s(cost, tokens) + 2 * cost_tp_comm_s(cost, tokens);
}

static double rank_time(const Shard *s, const CostModel *cost, int r)
{
    return shard_rank_time_with(cost, s->attn[r], s->tokens[r]);
}

int64_t shard_block_exchange_tokens(const Shard *s, int v)
{
    int g = plan_block_size(s->cp, v), first = plan_block_first(s->cp, v), h = plan_block_depth(v);
    if (!s->uneven[v] || g < 2)
        return s->blk_sharded[v];
    int64_t least = s->blk_sharded[v];
    for (int r = first; r < first + g; r++)
        least = s->own[r * SHARD_DEPTHS + h] < least ? s->own[r * SHARD_DEPTHS + h] : least;
    return ((s->blk_sharded[v] - least) * g + g - 2) / (g - 1);
}

double shard_rank_cp_comm(const Shard *s, const CostModel *cost, int r)
{
    double t = 0;
    for (int v = (s->cp + r) / 2; v >= 1; v /= 2)
        t += cost_cp_comm_group_s(cost, plan_block_size(s->cp, v), shard_block_exchange_tokens(s, v));
    return t;
}

/* The slowest rank, its group's K/V exchange included: CP ranks meet at every layer. (With one
 * group, the whole CP group, this is the slowest rank's compute plus the group's exchange.) */
double shard_time(const Shard *s, const CostModel *cost)
{
    double worst = 0;
    for (int r = 0; r < s->cp; r++) {
        double t = rank_time(s, cost, r) + 2 * shard_rank_cp_comm(s, cost, r);
        worst = t > worst ? t : worst;
    }
    return worst;
}

/* Rank r's forward and backward seconds per layer, as the plan records them (commit). */
static void rank_fwd_bwd(const Shard *s, const CostModel *cost, int r, double *f, double *b)
{
    double comm = cost_tp_comm_s(cost, s->tokens[r]) + shard_rank_cp_comm(s, cost, r);
    *f = s->attn_fwd[r] + cost_linear_fwd_s(cost, s->tokens[r]) + comm;
    *b = s->attn_bwd[r] + cost_linear_bwd_s(cost, s->tokens[r]) + comm;
}

/* The micro-batch's predicted seconds per layer as the plan records them: the slowest forward and
 * the slowest backward (what the pipeline schedule and the dry run take). */
void shard_mb_times(const Shard *s, const CostModel *cost, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    for (int r = 0; r < s->cp; r++) {
        double f, b;
        rank_fwd_bwd(s, cost, r, &f, &b);
        *fwd = f > *fwd ? f : *fwd;
        *bwd = b > *bwd ? b : *bwd;
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

int shard_fits(const Shard *s, int64_t capacity)
{
    for (int r = 0; r < s->cp; r++)
        if (s->tokens[r] > capacity)
            return 0;
    return 1;
}

/* Longest first; equal lengths by position. */
static int by_len_desc(const void *a, const void *b, void *docs_)
{
    const PlanDoc *docs = docs_;
    const PlanDoc *x = &docs[*(const int64_t *)a], *y = &docs[*(const int64_t *)b];
    if (x->len != y->len)
        return x->len < y->len ? 1 : -1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* One hybrid candidate: documents of at least threshold tokens sharded, the others whole, longest
 * first on the least loaded rank with room (sharded when none has room). order: the documents
 * longest first. */
static int shard_hybrid(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t n_docs, const int64_t *order,
                        int64_t threshold, int64_t capacity)
{
    if (shard_reset(s, n_docs) != 0)
        return -1;
    for (int64_t k = 0; k < n_docs; k++)
        if (docs[k].len >= threshold && shard_per_doc(s, cost, docs, k) != 0)
            return -1;
    /* Each rank's time, kept as documents arrive (only the ranks a document lands on change). */
    double t_rank[1024];
    for (int r = 0; r < s->cp; r++)
        t_rank[r] = rank_time(s, cost, r);
    for (int64_t i = 0; i < n_docs; i++) {
        int64_t k = order[i];
        if (docs[k].len >= threshold)
            continue;
        int best = -1;
        double best_t = 0;
        for (int r = 0; r < s->cp; r++) {
            if (s->tokens[r] + docs[k].len <= capacity && (best < 0 || t_rank[r] < best_t)) {
                best = r;
                best_t = t_rank[r];
            }
        }
        if ((best >= 0 ? shard_whole(s, cost, docs, k, best) : shard_per_doc(s, cost, docs, k)) != 0)
            return -1;
        for (int r = best >= 0 ? best : 0; r < (best >= 0 ? best + 1 : s->cp); r++)
            t_rank[r] = rank_time(s, cost, r);
    }
    return 0;
}

int shard_commit(StepPlan *p, PlanMicroBatch *mb, const Shard *s, const CostModel *cost)
{
    for (int64_t k = 0; k < mb->n_docs; k++) {
        PlanDoc *d = &p->docs[mb->first_doc + k];
        d->rank = s->doc_rank[k];
        d->group_first = s->doc_first[k];
        d->group_size = s->doc_size[k];
    }
    mb->first_rank = p->n_ranks;
    mb->sharded_tokens = s->sharded;
    mb->cut_docs = 0;
    for (int v = 1; v < 2 * s->cp; v++)
        mb->cut_docs += s->uneven[v];
    mb->fwd_s = mb->bwd_s = 0;
    for (int r = 0; r < s->cp; r++) {
        int64_t k = plan_add_rank(p);
        if (k < 0)
            return -1;
        PlanRank *pr = &p->ranks[k];
        pr->tokens = s->tokens[r];
        pr->exchanges = 0;
        for (int v = (s->cp + r) / 2; v >= 1; v /= 2)
            if (s->blk_sharded[v] > 0)
                pr->exchanges |= 1u << plan_block_depth(v);
        pr->first_range = p->n_ranges;
        for (int64_t i = 0; i < s->n_ranges; i++)
            if (s->ranges[i].rank == r && plan_add_range(p, r, s->ranges[i].start, s->ranges[i].len) < 0)
                return -1;
        pr->n_ranges = p->n_ranges - pr->first_range;
        pr->first_segment = p->n_segments;
        for (int64_t i = 0; i < s->n_segs; i++) {
            const PlanSegment *g = &s->segs[i];
            if (g->rank == r && plan_add_segment(p, r, g->q_start, g->q_len, g->kv_start) < 0)
                return -1;
        }
        pr->n_segments = p->n_segments - pr->first_segment;
        pr->attn_fwd_s = s->attn_fwd[r];
        pr->attn_bwd_s = s->attn_bwd[r];
        pr->linear_fwd_s = cost_linear_fwd_s(cost, pr->tokens);
        pr->linear_bwd_s = cost_linear_bwd_s(cost, pr->tokens);
        pr->comm_fwd_s = pr->comm_bwd_s = cost_tp_comm_s(cost, pr->tokens) + shard_rank_cp_comm(s, cost, r);
        double f = pr->attn_fwd_s + pr->linear_fwd_s + pr->comm_fwd_s;
        double b = pr->attn_bwd_s + pr->linear_bwd_s + pr->comm_bwd_s;
        mb->fwd_s = f > mb->fwd_s ? f : mb->fwd_s;
        mb->bwd_s = b > mb->bwd_s ? b : mb->bwd_s;
    }
    return 0;
}

/* Scratch slot t (the t-th micro-batch laid out at once), grown for cp ranks and n_docs documents. */
static ShardScratch *scratch_for(StepPlan *p, int t, int cp, int64_t n_docs)
{
    ShardScratch *sc = p->shard_scratch[t];
    if (!sc) {
        sc = p->shard_scratch[t] = calloc(1, sizeof *sc);
        if (!sc)
            return NULL;
    }
    for (int i = 0; i < SHARD_N; i++)
        if (shard_alloc(&sc->cand[i], cp) != 0)
            return NULL;
    int64_t *order = array_grow(sc->order, &sc->cap_order, n_docs, sizeof *order);
    if (!order)
        return NULL;
    sc->order = order;
    return sc;
}

void plan_shard_scratch_free(StepPlan *p)
{
    for (int t = 0; t < PLAN_MAX_THREADS; t++) {
        ShardScratch *sc = p->shard_scratch[t];
        if (!sc)
            continue;
        for (int i = 0; i < SHARD_N; i++)
            shard_free(&sc->cand[i]);
        free(sc->order);
        free(sc->est);
        free(sc->hyb_whole);
        free(sc->hyb_lb);
        free(sc->assign);
        free(sc->best_assign);
        free(sc->nest_est);
        free(sc->even_node);
        free(sc->even_rows);
        free(sc);
        p->shard_scratch[t] = NULL;
    }
}

/* Tries every hybrid threshold; leaves the fastest layout that keeps every rank within capacity in
 * sc->cand[SHARD_BEST] (its time in *best_t; -1 when none does, or none is faster than bound when
 * bound > 0). Each candidate is predicted without its layout (hybrid_predict, the same figure) and
 * dropped as soon as it cannot beat the best so far; the winner alone is laid out. */
static int best_hybrid(ShardScratch *sc, const CostModel *cost, const PlanDoc *docs, int64_t n, int64_t capacity,
                       double bound, double *best_t)
{
    for (int64_t k = 0; k < n; k++)
        sc->order[k] = k;
    qsort_r(sc->order, (size_t)n, sizeof *sc->order, by_len_desc, (void *)docs);
    int64_t longest = n ? docs[sc->order[0]].len : 0;
    int64_t first = cost->hw.attn_tile > 16 ? cost->hw.attn_tile : 16;
    *best_t = -1;
    sc->hybrid_threshold = -1;
    int cp = sc->cand[SHARD_BEST].cp;
    double *whole = array_grow(sc->hyb_whole, &sc->cap_hyb_whole, n + 1, sizeof *whole);
    if (!whole)
        return -1;
    sc->hyb_whole = whole;
    double *lb = array_grow(sc->hyb_lb, &sc->cap_hyb_lb, n + 1, sizeof *lb);
    if (!lb)
        return -1;
    sc->hyb_lb = lb;
    hybrid_doc_bounds(cost, docs, n, cp, whole, lb);
    /* The thresholds tile, 2 tile, ... up to the first above the longest document or the capacity,
     * tried from the largest: a few documents sharded first, which is cheap to predict and usually
     * near the best, so the candidates that shard almost everything (dear to predict, rarely
     * best) are mostly dropped on their O(n) lower bound. The kept one is the same as trying them
     * from the smallest and keeping the first fastest: the fastest, ties to the smallest threshold
     * (a candidate equal to the best so far is taken, and only one strictly slower is dropped). */
    int64_t thresholds[64];
    int nt = 0;
    for (int64_t threshold = first; nt < 64; threshold *= 2) {
        thresholds[nt++] = threshold;
        if (threshold > longest || threshold > capacity)
            break;
    }
    for (int i = nt - 1; i >= 0; i--) {
        /* A document that fits on no rank whole is sharded, and its chunks may then overfill a
         * rank that whole documents filled first: such a candidate breaks the capacity (a rank's
         * activation memory) and is not taken (-1). per_seq and per_doc, even by construction, remain.
         * Dropped when it cannot beat bound (hybrid must be strictly faster than per_seq and per_doc)
         * or be at most the best so far. */
        double limit = *best_t >= 0 ? nextafter(*best_t, INFINITY) : bound;
        if (limit > 0 && hybrid_lower_bound(cost, docs, n, cp, whole, lb, thresholds[i]) >= limit)
            continue;
        double t = hybrid_predict(cost, docs, n, sc->order, cp, thresholds[i], capacity, limit, whole);
        if (t >= 0 && (*best_t < 0 || t <= *best_t)) {
            *best_t = t;
            sc->hybrid_threshold = thresholds[i];
        }
    }
    if (sc->hybrid_threshold < 0)
        return 0;
    Shard *best = &sc->cand[SHARD_BEST];
    if (shard_hybrid(best, cost, docs, n, sc->order, sc->hybrid_threshold, capacity) != 0)
        return -1;
    *best_t = shard_time(best, cost);
    return 0;
}

/* Micro-batch mb's layout, chosen in sc (*chosen, one of sc's candidates; mb->mode set). Reads only
 * mb's documents and writes only mb->mode and sc: threads run it on different micro-batches at once.
 * Returns -1 out of memory. */
static int shard_choose(ShardScratch *sc, const PlanDoc *docs, PlanMicroBatch *mb, int cp, CpSharding mode,
                        const CostModel *cost, int64_t rank_capacity, const Shard **chosen_out)
{
    int64_t n = mb->n_docs;
    Shard *seq = &sc->cand[SHARD_SEQ], *doc = &sc->cand[SHARD_DOC], *hyb = &sc->cand[SHARD_BEST];
    Shard *grp = &sc->cand[SHARD_GROUPS];
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
        double t_seq = -1, t_doc = -1, t_hyb = -1, t_grp = -1;
        if (mode != CP_PER_DOC && (rc = shard_per_seq(seq, cost, docs, n, mb->tokens)) == 0)
            t_seq = shard_time(seq, cost);
        /* per_doc is laid out only when it is the mode or is chosen; else predicted (hybrid_predict
         * with every document sharded is per_doc's layout, predicted without it). */
        int doc_laid = mode == CP_PER_DOC, with_hybrid = mode == CP_HYBRID || mode == CP_GROUPS;
        for (int64_t k = 0; k < n && rc == 0 && doc_laid; k++)
            rc = shard_per_doc(doc, cost, docs, k);
        if (rc == 0 && doc_laid)
            t_doc = shard_time(doc, cost);
        else if (rc == 0 && mode == CP_ADAPTIVE)
            t_doc = hybrid_predict(cost, docs, n, NULL, cp, 0, INT64_MAX, 0, NULL);
        /* hybrid is kept only when faster than per_seq (and per_doc): a candidate that cannot beat
         * per_seq is dropped early. groups needs hybrid's own best (its bound and threshold). */
        if (rc == 0 && with_hybrid)
            rc = best_hybrid(sc, cost, docs, n, rank_capacity, mode == CP_HYBRID ? t_seq : 0, &t_hyb);
        /* per_doc then matters only if it can be chosen below: strictly faster than per_seq and at
         * most hybrid's time. Predicted only when its lower bound allows that, and dropped as soon as
         * it cannot (t_doc -1): per_seq or hybrid is then chosen exactly as with its figure. */
        if (rc == 0 && with_hybrid) {
            double lim = t_seq;
            if (t_hyb >= 0 && nextafter(t_hyb, INFINITY) < lim)
                lim = nextafter(t_hyb, INFINITY);
            if (hybrid_lower_bound(cost, docs, n, cp, sc->hyb_whole, sc->hyb_lb, 0) < lim)
                t_doc = hybrid_predict(cost, docs, n, NULL, cp, 0, INT64_MAX, lim, NULL);
        }
        /* groups: aligned blocks need cp a power of two (the config insists); otherwise hybrid. */
        if (rc == 0 && mode == CP_GROUPS && (cp & (cp - 1)) == 0)
            rc = plan_groups_best(sc, cost, docs, n, rank_capacity, t_hyb, &t_grp);
        /* The fastest of the computed candidates; ties go to the simpler layout. */
        chosen = t_seq >= 0 ? seq : doc;
        mb->mode = t_seq >= 0 ? CP_PER_SEQ : CP_PER_DOC;
        if (t_doc >= 0 && t_seq >= 0 && t_doc < t_seq) {
            chosen = doc;
            mb->mode = CP_PER_DOC;
        }
        double t_chosen = chosen == seq ? t_seq : t_doc;
        for (int64_t k = 0; k < n && rc == 0 && chosen == doc && !doc_laid; k++)
            rc = shard_per_doc(doc, cost, docs, k);
        if (t_hyb >= 0 && t_hyb < t_chosen) {
            chosen = hyb;
            mb->mode = CP_HYBRID;
        }
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

int plan_shard_lay_out(StepPlan *p, const int64_t *list, int n, CpSharding mode, const CostModel *cost,
                       int64_t rank_capacity, int threads, const Shard **chosen)
{
    int64_t most = 0;
    for (int j = 0; j < n; j++)
        most = p->mbs[list[j]].n_docs > most ? p->mbs[list[j]].n_docs : most;
    for (int j = 0; j < n; j++)
        if (!scratch_for(p, j, p->cp, most))
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
    if (plan_shard_lay_out(p, list, n, mode, cost, rank_capacity, threads, chosen) != 0)
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
