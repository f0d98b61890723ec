/*
 * engine/plan/plan_groups_cut.c - the eveners' exact layout: documents cut unevenly over blocks.
 *
 * The eveners (plan_groups_even.c) pick, on the lines, documents and blocks of CP ranks to cut them
 * over so that each rank of a block gets as many of a document's rows as it lacks. Here they are
 * laid out on the exact times, after every other document of the micro-batch: first with the rows
 * the lines gave, in the order they were picked; then each evener in turn is taken out and cut
 * again against the exact times of everything else (the others included). A cut of
 * document d over block g: rank i (time b_i without it) gets x_i rows, the water level L solving
 * sum_i max(0, (L - b_i) / a_i) = d, a_i what a row adds to rank i (its GEMMs, element-wise work,
 * TP all-reduce, and its attention per row: per_doc's mean in the first pass, then each rank's own
 * from the last pass's chunks); then, since a chunk's attention steps with its query tiles, rows
 * move from the slowest rank of the block to the fastest, a tile at first and halving whenever a
 * move does not lower the slowest. The cut with the lowest slowest rank is kept (the one it
 * started from included). A rank's x_i rows are two chunks placed as per_doc places its two
 * (chunks i and 2 g - 1 - i of the document), so its rows sit early and late and its attention per
 * row is near the document's mean. The block's exchange is priced as an all-gather of uneven
 * shares is (shard_block_exchange_tokens): its rank holding the fewest rows receives the rest.
 * Bound: per evener and round, EVEN_PASSES water levels (a sort of g ranks) and CUT_MOVES moves,
 * each an exact evaluation of 2 g chunks.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_groups_impl.h"

enum { EVEN_PASSES = 3, CUT_MOVES = 8, CUT_ROUNDS = 1 };

/* The level L at which sum_r max(0, (L - b[r]) / a[r]) = d, for slopes a[r] > 0: the sum is
 * piecewise linear in L, so with the ranks in order of b, the first i whose level
 * L = (d + sum b[r] / a[r]) / (sum 1 / a[r]) over those i does not reach the next b is it. */
static double water_level_slopes(const double *b, const double *a, int n, double d)
{
    int order[1024];
    for (int r = 0; r < n; r++) { /* insertion sort: a block has a few ranks */
        int j = r;
        for (; j > 0 && b[order[j - 1]] > b[r]; j--)
            order[j] = order[j - 1];
        order[j] = r;
    }
    double inv = 0, sum = 0, level = b[order[0]];
    for (int i = 0; i < n; i++) {
        inv += 1 / a[order[i]];
        sum += b[order[i]] / a[order[i]];
        level = (d + sum) / inv;
        if (i + 1 < n && level <= b[order[i + 1]])
            break;
    }
    return level;
}

/* Rank i of a block of g gets x[i] rows of the document as two chunks, mirrored as in per_doc:
 * the front chunks in rank order, then the back chunks in reverse. sizes: the 2 g chunks in
 * document order; attn: each rank's attention seconds. */
static void mirrored(const CostModel *cost, const int64_t *x, int g, int64_t *sizes, double *attn)
{
    for (int i = 0; i < g; i++) {
        sizes[i] = (x[i] + 1) / 2;
        sizes[2 * g - 1 - i] = x[i] / 2;
        attn[i] = 0;
    }
    int64_t at = 0;
    for (int c = 0; c < 2 * g; c++) {
        int i = c < g ? c : 2 * g - 1 - c;
        double f = 0, b = 0;
        if (sizes[c] > 0)
            cost_attn_fb_s(cost, sizes[c], at + sizes[c], &f, &b);
        attn[i] += f + b;
        at += sizes[c];
    }
}

/* Whole rows in proportion to want[], summing to d: floors, then the largest remainders. */
static void round_rows(const double *want, int g, int64_t d, int64_t *x)
{
    double total = 0, share[1024];
    for (int i = 0; i < g; i++)
        total += want[i] > 0 ? want[i] : 0;
    int64_t sum = 0;
    for (int i = 0; i < g; i++) {
        share[i] = total > 0 ? (want[i] > 0 ? want[i] : 0) * (double)d / total : (double)d / g;
        x[i] = (int64_t)share[i];
        sum += x[i];
    }
    for (; sum < d; sum++) {
        int best = 0;
        for (int i = 1; i < g; i++)
            if (share[i] - (double)x[i] > share[best] - (double)x[best])
                best = i;
        x[best]++;
    }
}

/* One evener's block in s. */
typedef struct Cut {
    Shard *s;
    const CostModel *cost;
    int first, g, v, h;
    int64_t len, capacity;
} Cut;

static Cut cut_of(Shard *s, const CostModel *cost, const PlanDoc *docs, const EvenCut *e, int64_t capacity)
{
    int cp = s->cp, g = plan_block_size(cp, e->w);
    return (Cut){s, cost, plan_block_first(cp, e->w), g, e->w, plan_block_depth(e->w), docs[e->k].len, capacity};
}

/* The evener's rows x into s's sums (sign +1) or out of them (-1), without ranges: each rank's
 * attention and tokens, its rows of the block, the block's tokens and count of uneven documents. */
static void cut_sums(const Cut *c, const int64_t *x, int sign)
{
    Shard *s = c->s;
    int64_t sizes[2 * 1024];
    double attn[1024];
    mirrored(c->cost, x, c->g, sizes, attn);
    for (int i = 0; i < c->g; i++) {
        int q = c->first + i;
        s->attn[q] += sign * attn[i];
        s->tokens[q] += sign * x[i];
        s->own[q * SHARD_DEPTHS + c->h] += sign * x[i];
    }
    s->blk_sharded[c->v] += sign * c->len;
    s->uneven[c->v] += sign;
}

/* The slowest rank of the block with the evener's rows x added to s (without it), every rank's
 * time in ti; -1 when a rank would pass the capacity. */
static double cut_eval(const Cut *c, const int64_t *x, double *ti)
{
    Shard *s = c->s;
    for (int i = 0; i < c->g; i++)
        if (s->tokens[c->first + i] + x[i] > c->capacity)
            return -1;
    double saved[1024], t = 0;
    for (int i = 0; i < c->g; i++)
        saved[i] = s->attn[c->first + i];
    cut_sums(c, x, +1);
    for (int i = 0; i < c->g; i++) {
        int q = c->first + i;
        ti[i] = shard_rank_time_with(c->cost, s->attn[q], s->tokens[q]) + 2 * shard_rank_cp_comm(s, c->cost, q);
        t = ti[i] > t ? ti[i] : t;
    }
    cut_sums(c, x, -1);
    for (int i = 0; i < c->g; i++) /* exactly as they were */
        s->attn[c->first + i] = saved[i];
    return t;
}

/* The best cut of the evener against s as it is (without it), from x (its rows so far), into x. */
static void cut_best(const Cut *c, int64_t *x)
{
    Shard *s = c->s;
    const CostModel *cost = c->cost;
    int g = c->g;
    double base[1024], slope[1024], row[1024], attn[1024], want[1024], ti[1024], tj[1024];
    int64_t best[1024], y[1024], sizes[2 * 1024];
    for (int i = 0; i < g; i++)
        best[i] = x[i];
    double best_t = cut_eval(c, best, ti);
    /* Each rank's time without the document, its exchanges included: the block's own is the same
     * on all its ranks and does not move the water level, but a rank of a block nested inside it
     * has that block's exchange on top. */
    double per_doc_row = groups_attn_per_rank(cost, c->len, g) * g / (double)c->len;
    for (int i = 0; i < g; i++) {
        int q = c->first + i;
        double compute = shard_rank_time_with(cost, s->attn[q], s->tokens[q]);
        base[i] = compute + 2 * shard_rank_cp_comm(s, cost, q);
        row[i] = (shard_rank_time_with(cost, s->attn[q], s->tokens[q] + 1024) - compute) / 1024;
        slope[i] = row[i] + per_doc_row;
        if (!(slope[i] > 0)) /* a cost model without row costs: keep the rows the lines gave */
            return;
    }
    for (int pass = 0; pass < EVEN_PASSES; pass++) {
        double level = water_level_slopes(base, slope, g, (double)c->len);
        for (int i = 0; i < g; i++) {
            double room = (double)(c->capacity - s->tokens[c->first + i]);
            want[i] = level > base[i] ? (level - base[i]) / slope[i] : 0;
            want[i] = want[i] < room ? want[i] : room > 0 ? room : 0;
        }
        round_rows(want, g, c->len, y);
        double t = cut_eval(c, y, tj);
        mirrored(cost, y, g, sizes, attn);
        for (int i = 0; i < g; i++)
            if (y[i] > 0 && row[i] + attn[i] / (double)y[i] > 0)
                slope[i] = row[i] + attn[i] / (double)y[i];
        if (t >= 0 && (best_t < 0 || t < best_t)) {
            best_t = t;
            memcpy(best, y, (size_t)g * sizeof *best);
            memcpy(ti, tj, (size_t)g * sizeof *ti);
        }
    }
    /* Rows from the slowest rank to the fastest, a tile at first, halving when it does not help. */
    int64_t step = cost->hw.attn_tile > 1 ? cost->hw.attn_tile : 64;
    for (int it = 0; it < CUT_MOVES && step > 0 && best_t >= 0; it++) {
        int hi = 0, lo = 0;
        for (int i = 1; i < g; i++) {
            hi = ti[i] > ti[hi] ? i : hi;
            lo = ti[i] < ti[lo] ? i : lo;
        }
        int64_t m = step < best[hi] ? step : best[hi];
        if (m <= 0 || hi == lo)
            break;
        memcpy(y, best, (size_t)g * sizeof *y);
        y[hi] -= m;
        y[lo] += m;
        double t = cut_eval(c, y, tj);
        if (t >= 0 && t < best_t) {
            best_t = t;
            memcpy(best, y, (size_t)g * sizeof *best);
            memcpy(ti, tj, (size_t)g * sizeof *ti);
        } else {
            step /= 2;
        }
    }
    memcpy(x, best, (size_t)g * sizeof *x);
}

int groups_even_lay_out(Shard *s, const CostModel *cost, const PlanDoc *docs, const EvenCut *ev, int n_ev,
                        int64_t capacity)
{
    int cp = s->cp;
    int64_t *xs = malloc((size_t)n_ev * (size_t)cp * sizeof *xs);
    double *saved = malloc((size_t)cp * sizeof *saved);
    if (!xs || !saved) {
        free(xs);
        free(saved);
        return -1;
    }
    memcpy(saved, s->attn, (size_t)cp * sizeof *saved);
    /* The lines' rows first, in the order the eveners were picked. */
    for (int i = 0; i < n_ev; i++) {
        Cut c = cut_of(s, cost, docs, &ev[i], capacity);
        round_rows(ev[i].rows, c.g, c.len, xs + (size_t)i * cp);
        cut_sums(&c, xs + (size_t)i * cp, +1);
    }
    /* Each cut again against the exact times of everything else. */
    for (int round = 0; round < CUT_ROUNDS; round++)
        for (int i = 0; i < n_ev; i++) {
            Cut c = cut_of(s, cost, docs, &ev[i], capacity);
            cut_sums(&c, xs + (size_t)i * cp, -1);
            cut_best(&c, xs + (size_t)i * cp);
            cut_sums(&c, xs + (size_t)i * cp, +1);
        }
    /* Out of the sums (the attention exactly as it was), then laid out for real. */
    for (int i = 0; i < n_ev; i++) {
        Cut c = cut_of(s, cost, docs, &ev[i], capacity);
        cut_sums(&c, xs + (size_t)i * cp, -1);
    }
    memcpy(s->attn, saved, (size_t)cp * sizeof *saved);
    int rc = 0;
    for (int i = 0; i < n_ev && rc == 0; i++) {
        Cut c = cut_of(s, cost, docs, &ev[i], capacity);
        int64_t sizes[2 * 1024];
        double attn[1024];
        mirrored(cost, xs + (size_t)i * cp, c.g, sizes, attn);
        s->uneven[c.v]++;
        rc = shard_chunks(s, cost, docs, ev[i].k, c.first, c.g, sizes);
    }
    free(xs);
    free(saved);
    return rc;
}
