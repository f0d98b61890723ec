/*
 * engine/plan/plan_hybrid.c - predicting one hybrid candidate without laying it out.
 *
 * hybrid tries a dozen length thresholds per micro-batch and keeps the fastest; laying every one out
 * (ranges and segments) cost most of its planning time. hybrid_predict runs the same steps as
 * plan_shard.c's shard_hybrid on per-rank sums only - attention seconds and tokens, added in the same
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
#include "engine/plan/plan_shard_impl.h"

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

double hybrid_predict(const CostModel *cost, const PlanDoc *docs, int64_t n, const int64_t *order, int cp,
                      int64_t threshold, int64_t capacity, double bound)
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
                cost_attn_fb_s(cost, d->len, d->len, &f, &b);
                attn[best] += f + b;
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
