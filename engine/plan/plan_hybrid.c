/*
 * engine/plan/plan_hybrid.c - hybrid's candidates (plan_hybrid.h): each predicted without laying it
 * out, the fastest laid out.
 *
 * hybrid tries a dozen length thresholds per micro-batch and keeps the fastest; laying every one out
 * (ranges and segments) cost most of its planning time. hybrid_predict runs the same steps as
 * shard_hybrid (below) on per-rank sums only - attention seconds and tokens, added in the same
 * order with the same floating-point operations - so a finished prediction equals shard_time of the
 * layout bit for bit, and only the winner is laid out.
 *
 * It also stops early: a rank's time, attn + linear(tokens) + 2 tp(tokens) + 2 exchange(sharded),
 * only grows as documents are added (attention sums nonnegative terms, the linear terms grow with the
 * tokens, the exchange with the sharded tokens, rounding is monotone) and tp >= 0, so
 * attn + linear(tokens) + 2 exchange is a lower bound of the rank's final time at every point. When
 * it reaches `bound` the candidate cannot be strictly faster than bound and is dropped: the
 * candidate kept is the same as when every one is predicted to the end.
 */
#include "engine/plan/plan_hybrid.h"

#include <math.h>
#include <stdlib.h>

#include "util/array.h"

/* The rank's final time is at least this (see above). */
static double lower_bound(const CostModel *cost, double attn, int64_t tokens, double comm2)
{
    return attn + cost_linear_fwd_s(cost, tokens) + cost_linear_bwd_s(cost, tokens) + comm2;
}

/* Document k per_doc over all cp ranks, as shard_per_doc adds it: rank sums only. */
static void add_per_doc(const CostModel *cost, const PlanDoc *d, int cp, int *counter, double *attn, int64_t *tok)
{
    int64_t size[2 * 1024], at = d->start;
    int n = 2 * cp;
    shard_per_doc_chunks(cp, d->len, counter, size);
    for (int c = 0; c < n; c++) {
        int r = c < cp ? c : n - 1 - c;
        if (size[c] > 0) {
            tok[r] += size[c];
            int64_t kv = at + size[c] - d->start;
            double f, b;
            cost_attn_fb_s(cost, size[c], kv, &f, &b);
            attn[r] += f + b;
        }
        at += size[c];
    }
}

/* Per document: whole[k], its attention seconds whole (forward + backward, the figure a layout
 * adds), and shard_lb[k], a lower bound on its attention summed over the ranks when sharded per_doc
 * over cp. whole may then be passed to hybrid_predict. */
static void hybrid_doc_bounds(const CostModel *cost, const PlanDoc *docs, int64_t n, int cp, double *whole, double *shard_lb)
{
    for (int64_t k = 0; k < n; k++) {
        int64_t d = docs[k].len, base = d / (2 * cp);
        double f, b;
        cost_attn_fb_s(cost, d, d, &f, &b);
        whole[k] = f + b;
        shard_lb[k] = 0;
        /* Chunk c of the 2 cp has q >= base tokens and starts o >= c base tokens into the document;
         * its seconds, FLOPs over the rate, are (o + (qp + 1) / 2) (qp + half) times a constant:
         * growing in o and in the padded qp (on the rate curve; a calibration table's rates need
         * not, so no bound there). At q = base they are affine in o, F(o) = F0 + (F1 - F0) o / base,
         * and the 2 cp chunks sum to at least 2 cp F0 + (F1 - F0) cp (2 cp - 1). */
        if (base > 0 && cost->table.n == 0) {
            double f0, b0, f1, b1;
            cost_attn_fb_s(cost, base, base, &f0, &b0);
            cost_attn_fb_s(cost, base, 2 * base, &f1, &b1);
            double F0 = f0 + b0, F1 = f1 + b1;
            shard_lb[k] = 2.0 * cp * F0 + (F1 - F0) * cp * (2.0 * cp - 1);
        }
    }
}

double hybrid_lower_bound(const CostModel *cost, const PlanDoc *docs, int64_t n, int cp, const double *whole,
                          const double *shard_lb, int64_t threshold)
{
    /* The slowest rank is at least the mean: every rank's attention summed (sharded documents at
     * least their bound, whole ones their attention or, if they end up sharded, the smaller of the
     * two), the GEMM and element-wise work at its slope (a launch term only adds), TP traffic >= 0,
     * and the exchange of at least the documents sharded by the threshold. */
    enum { X = 1 << 20 };
    double slope = (cost_linear_fwd_s(cost, X) + cost_linear_bwd_s(cost, X) - cost_linear_fwd_s(cost, 1) -
                    cost_linear_bwd_s(cost, 1)) / (X - 1);
    double attn = 0;
    int64_t tokens = 0, sharded = 0;
    for (int64_t k = 0; k < n; k++) {
        tokens += docs[k].len;
        if (docs[k].len >= threshold) {
            attn += shard_lb[k];
            sharded += docs[k].len;
        } else {
            attn += whole[k] < shard_lb[k] ? whole[k] : shard_lb[k];
        }
    }
    double lb = (attn + slope * (double)tokens) / cp + 2 * cost_cp_comm_group_s(cost, cp, sharded);
    return lb * (1 - 1e-9); /* rounding: the figures it bounds are sums of rounded terms */
}

double hybrid_predict(const CostModel *cost, const PlanDoc *docs, int64_t n, const int64_t *order, int cp,
                      int64_t threshold, int64_t capacity, double bound, const double *whole)
{
    double attn[1024], t_rank[1024];
    int64_t tok[1024], sharded = 0;
    int counter = 0;
    for (int r = 0; r < cp; r++) {
        attn[r] = 0;
        tok[r] = 0;
    }
    for (int64_t k = 0; k < n; k++)
        if (docs[k].len >= threshold) {
            add_per_doc(cost, &docs[k], cp, &counter, attn, tok);
            sharded += docs[k].len;
        }
    double comm2 = 2 * cost_cp_comm_group_s(cost, cp, sharded);
    for (int r = 0; r < cp; r++) {
        if (bound > 0 && lower_bound(cost, attn[r], tok[r], comm2) >= bound)
            return -1;
        t_rank[r] = shard_rank_time_with(cost, attn[r], tok[r]);
    }
    for (int64_t i = 0; order && i < n; i++) {
        const PlanDoc *d = &docs[order[i]];
        if (d->len >= threshold)
            continue;
        int best = -1;
        double best_t = 0;
        for (int r = 0; r < cp; r++)
            if (tok[r] + d->len <= capacity && (best < 0 || t_rank[r] < best_t)) {
                best = r;
                best_t = t_rank[r];
            }
        if (best >= 0) {
            if (d->len > 0) {
                tok[best] += d->len;
                double f, b;
                if (whole) {
                    attn[best] += whole[order[i]]; /* the same f + b, computed once */
                } else {
                    cost_attn_fb_s(cost, d->len, d->len, &f, &b);
                    attn[best] += f + b;
                }
            }
            t_rank[best] = shard_rank_time_with(cost, attn[best], tok[best]);
            if (bound > 0 && lower_bound(cost, attn[best], tok[best], comm2) >= bound)
                return -1;
            continue;
        }
        /* No rank has room: sharded, as shard_hybrid does. */
        add_per_doc(cost, d, cp, &counter, attn, tok);
        sharded += d->len;
        comm2 = 2 * cost_cp_comm_group_s(cost, cp, sharded);
        for (int r = 0; r < cp; r++) {
            t_rank[r] = shard_rank_time_with(cost, attn[r], tok[r]);
            if (bound > 0 && lower_bound(cost, attn[r], tok[r], comm2) >= bound)
                return -1;
        }
    }
    /* shard_time and shard_fits of the layout. */
    double worst = 0;
    for (int r = 0; r < cp; r++) {
        if (tok[r] > capacity)
            return -1;
        double t = shard_rank_time_with(cost, attn[r], tok[r]) + 2 * cost_cp_comm_group_s(cost, cp, sharded);
        worst = t > worst ? t : worst;
    }
    return worst;
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
        t_rank[r] = shard_rank_time_with(cost, s->attn[r], s->tokens[r]);
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
            t_rank[r] = shard_rank_time_with(cost, s->attn[r], s->tokens[r]);
    }
    return 0;
}

/* Each candidate is predicted without its layout (hybrid_predict, the same figure) and dropped as
 * soon as it cannot beat the best so far; the winner alone is laid out. */
int hybrid_best(Hybrid *h, const CostModel *cost, const PlanDoc *docs, int64_t n, int64_t capacity, double bound,
                double *best_t)
{
    int64_t *order = array_grow(h->order, &h->cap_order, n + 1, sizeof *order);
    if (!order)
        return -1;
    h->order = order;
    for (int64_t k = 0; k < n; k++)
        h->order[k] = k;
    qsort_r(h->order, (size_t)n, sizeof *h->order, by_len_desc, (void *)docs);
    int64_t longest = n ? docs[h->order[0]].len : 0;
    int64_t first = cost->hw.attn_tile > 16 ? cost->hw.attn_tile : 16;
    *best_t = -1;
    h->threshold = -1;
    int cp = h->layout.cp;
    double *whole = array_grow(h->whole, &h->cap_whole, n + 1, sizeof *whole);
    if (!whole)
        return -1;
    h->whole = whole;
    double *lb = array_grow(h->shard_lb, &h->cap_lb, n + 1, sizeof *lb);
    if (!lb)
        return -1;
    h->shard_lb = lb;
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
        double t = hybrid_predict(cost, docs, n, h->order, cp, thresholds[i], capacity, limit, whole);
        if (t >= 0 && (*best_t < 0 || t <= *best_t)) {
            *best_t = t;
            h->threshold = thresholds[i];
        }
    }
    if (h->threshold < 0)
        return 0;
    if (shard_hybrid(&h->layout, cost, docs, n, h->order, h->threshold, capacity) != 0)
        return -1;
    *best_t = shard_time(&h->layout, cost);
    return 0;
}

void hybrid_free(Hybrid *h)
{
    shard_free(&h->layout);
    free(h->order);
    free(h->whole);
    free(h->shard_lb);
}
