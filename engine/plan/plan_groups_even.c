/*
 * engine/plan/plan_groups_even.c - the groups search's evener: one document cut unevenly over all
 * CP ranks to fill what whole documents leave uneven.
 *
 * After the split, the local search and the nested blocks, the ranks of a CP 16 micro-batch are
 * still 1-3% apart: a rank holds about 8K rows there, so 1% is 80 rows, while the shortest
 * documents of a 128K micro-batch are close to 1K tokens, and a document only moves whole or in
 * per_doc's equal shares. The evener is the continuous knob those moves lack. One document is
 * taken out of its block and sharded over the whole CP group in one chunk per rank, each chunk as
 * long as its rank's deficit: with every other document placed, rank r's time is b_r, and a chunk
 * of x_r rows adds about c x_r (GEMMs, element-wise work, TP all-reduces per row) plus the chunk's
 * attention, so the level L with sum_r max(0, (L - b_r) / c) = d (water-filling, the b_r sorted)
 * gives x_r = max(0, (L - b_r) / c). The chunks lie in rank order, chunk r's queries over the keys
 * of the document up to its end (the document-causal mask, as every sharded chunk: the K/V
 * all-gather of the whole group brings them). A rank above the level gets no chunk but still takes
 * part in the exchange, which every rank pays: the document's K/V over all CP ranks.
 *
 * Which document: the one whose line-model level (groups_even_pick) is lowest, among those whose
 * removal and water-filling beat the slowest rank now; none when no document does (it was even
 * enough, or every document is too short to fill the gaps). The layout (groups_even_place) then
 * water-fills on the exact rank times of the placed documents and corrects for the chunks'
 * attention (a chunk's position sets its keys) in a few passes; the plan records the exact figure
 * of the result, and plan_shard keeps the layout only when it is faster than hybrid's.
 * Bound: picking is n water-fillings of cp ranks (O(n cp log cp)); placing, EVEN_PASSES more.
 */
#include <stdlib.h>

#include "engine/plan/plan_groups_impl.h"

enum { EVEN_PASSES = 4 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The level L at which sum_r max(0, (L - base[r]) / c) = d; sorted: scratch of n. */
static double water_level(const double *base, int n, double c, double d, double *sorted)
{
    for (int r = 0; r < n; r++)
        sorted[r] = base[r];
    qsort(sorted, (size_t)n, sizeof *sorted, by_value);
    double sum = 0; /* of the bases below the level */
    int i = 0;
    for (; i < n; i++) {
        /* Filling the i lowest to sorted[i] takes (i sorted[i] - sum) / c rows. */
        if ((i * sorted[i] - sum) / c >= d)
            break;
        sum += sorted[i];
    }
    return (d * c + sum) / i;
}

/* What a rank holding `rows` rows grows by per row on the lines (GEMMs, element-wise work, TP
 * all-reduce where it shows). */
static double per_row(const LineCost *c, int64_t rows)
{
    enum { STEP = 1024 };
    return (line_rank_time(c, 0, rows + STEP) - line_rank_time(c, 0, rows)) / STEP;
}

/* Rank r's time on the lines with its attention, rows and exchange changed. */
static double line_t(const Nest *x, int r, double da, double drows, double dcomm)
{
    return line_rank_time(x->line, x->attn_r[r] + da, x->rows[r] + (int64_t)drows) + x->comm_r[r] + dcomm;
}

/* Bases of block w's ranks (w_first .. + w_size) with document k off block u (inside w) and w's
 * exchange grown by it; out: the bases, returns their highest. */
static double bases(const Nest *x, int64_t k, int u, int w, double *b)
{
    int cp = x->cp, hu = 31 - __builtin_clz((unsigned)u), hw = 31 - __builtin_clz((unsigned)w);
    int us = cp >> hu, uf = (u - (1 << hu)) * us, ws = cp >> hw, wf = (w - (1 << hw)) * ws;
    int64_t d = x->docs[k].len;
    double e = x->est[k * x->stride + (x->depth - hu)];
    double du_comm = 2 * (line_cp_comm(x->line, x->depth - hu, x->tok[u] - d) - line_cp_comm(x->line, x->depth - hu, x->tok[u]));
    int64_t du_rows = us == 1 ? -d : (x->tok[u] - d + us - 1) / us - (x->tok[u] + us - 1) / us;
    int64_t tw = x->tok[w] - (w == u ? d : 0); /* w's tokens once k is off u */
    double dw_comm = 2 * (line_cp_comm(x->line, x->depth - hw, tw + d) - line_cp_comm(x->line, x->depth - hw, tw));
    double top = 0;
    for (int r = wf; r < wf + ws; r++) {
        int in = r >= uf && r < uf + us;
        b[r - wf] = line_t(x, r, in ? -e : 0, in ? (double)du_rows : 0, (in ? du_comm : 0) + dw_comm);
        top = b[r - wf] > top ? b[r - wf] : top;
    }
    return top;
}

/* Document k (on block u, above rank s) cut over block w (containing u) by the water level, on the
 * lines: the slowest time over w's ranks it leaves, and in rows[] each rank's share and in *comm
 * w's exchange change per rank. The exchange is priced as shard_block_exchange_tokens does: the
 * rank holding the fewest rows receives the rest, so a rank left without a share of the document
 * costs every rank of w up to d / g tokens more than per_doc's even shares. */
static double even_try(const Nest *x, int64_t k, int u, int w, int s, double *rows, double *comm)
{
    int cp = x->cp, hw = 31 - __builtin_clz((unsigned)w), ws = cp >> hw;
    int64_t d = x->docs[k].len;
    double b[1024], sorted[1024];
    /* A row adds its GEMMs and so on, and its share of per_doc's attention over w. */
    double per_attn = x->est[k * x->stride + x->depth - hw] * ws / (double)d;
    double per = per_row(x->line, x->rows[s]) + per_attn;
    double top = bases(x, k, u, w, b);
    double level = water_level(b, ws, per, (double)d, sorted);
    double least = (double)d;
    for (int i = 0; i < ws; i++) {
        rows[i] = level > b[i] ? (level - b[i]) / per : 0;
        least = rows[i] < least ? rows[i] : least;
    }
    double short_of = (double)d / ws - least;
    *comm = short_of > 0 ? 2 * x->line->cp_a[x->depth - hw] * ws / (ws - 1) * short_of : 0;
    return (level > top ? level : top) + *comm;
}

int groups_even_pick(Nest *x, int32_t *even)
{
    int cp = x->cp, count = 0;
    double rows[1024];
    for (int round = 0; round < cp; round++) {
        /* The slowest rank s, and its time T. */
        int s = 0;
        double T = 0;
        for (int r = 0; r < cp; r++) {
            double t = line_t(x, r, 0, 0, 0);
            if (t > T) {
                T = t;
                s = r;
            }
        }
        int64_t pick = -1;
        int pick_w = 0;
        double pick_t = T;
        for (int64_t k = 0; k < x->n; k++) {
            int u = x->node[k], leaf = cp + s;
            if (even[k] || (leaf >> (31 - __builtin_clz((unsigned)leaf) - (31 - __builtin_clz((unsigned)u)))) != u)
                continue; /* an evener already, or not on a block above s */
            for (int w = u; w >= 1; w /= 2) {
                double comm, t = (cp >> (31 - __builtin_clz((unsigned)w))) > 1 ? even_try(x, k, u, w, s, rows, &comm) : T;
                if (t < pick_t) {
                    pick_t = t;
                    pick = k;
                    pick_w = w;
                }
            }
        }
        if (pick < 0)
            break;
        /* Apply it on the lines: off its block, its rows onto w's ranks by the water level. */
        int u = x->node[pick], hw = 31 - __builtin_clz((unsigned)pick_w), ws = cp >> hw, wf = (pick_w - (1 << hw)) * ws;
        int64_t d = x->docs[pick].len;
        double uneven;
        even_try(x, pick, u, pick_w, s, rows, &uneven);
        double per_attn = x->est[pick * x->stride + x->depth - hw] * ws / (double)d;
        nest_move(x, pick, u, -1);
        x->tok[pick_w] += d;
        double comm = 2 * (line_cp_comm(x->line, x->depth - hw, x->tok[pick_w]) -
                           line_cp_comm(x->line, x->depth - hw, x->tok[pick_w] - d));
        for (int r = wf; r < wf + ws; r++) {
            x->rows[r] += (int64_t)(rows[r - wf] + 0.5);
            x->attn_r[r] += rows[r - wf] * per_attn;
            x->comm_r[r] += comm + uneven;
        }
        even[pick] = pick_w;
        count++;
    }
    return count;
}

/* The level L at which sum_r max(0, (L - b[r]) / a[r]) = d, for slopes a[r] > 0 (bisection). */
static double water_level_slopes(const double *b, const double *a, int n, double d)
{
    double lo = b[0], hi = b[0];
    for (int r = 0; r < n; r++) {
        lo = b[r] < lo ? b[r] : lo;
        hi = b[r] + a[r] * d > hi ? b[r] + a[r] * d : hi;
    }
    for (int it = 0; it < 60; it++) {
        double mid = (lo + hi) / 2, rows = 0;
        for (int r = 0; r < n; r++)
            rows += mid > b[r] ? (mid - b[r]) / a[r] : 0;
        if (rows >= d)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* Rank i of a block of g gets x[i] rows of the document as two chunks, mirrored as in per_doc:
 * the front chunks in rank order, then the back chunks in reverse, so every rank's rows sit at an
 * early and a late position and its attention per row is near the document's mean. sizes: the 2 g
 * chunks in document order; attn: each rank's attention seconds. */
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
    double total = 0;
    for (int i = 0; i < g; i++)
        total += want[i];
    int64_t sum = 0;
    double share[1024];
    for (int i = 0; i < g; i++) {
        share[i] = total > 0 ? want[i] * (double)d / total : (double)d / g;
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

int groups_even_place(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g, int64_t capacity)
{
    const PlanDoc *d = &docs[k];
    double base[1024], slope[1024], c[1024], attn[1024], want[1024];
    int64_t x[1024], best_x[1024], sizes[2 * 1024];
    int v = block_of(s->cp, first, g), h = 31 - __builtin_clz((unsigned)v);
    /* Each rank's time without block v's exchange (the same on all its ranks, so it does not move
     * the water level; it is priced per pass below). */
    double comm_v = 2 * cost_cp_comm_group_s(cost, g, shard_block_exchange_tokens(s, v));
    /* per_doc's attention over the block, per row: the first pass's estimate of a row's. */
    double per_doc_row = groups_attn_per_rank(cost, d->len, g) * g / (double)d->len;
    for (int i = 0; i < g; i++) {
        int q = first + i;
        base[i] = shard_rank_time_with(cost, s->attn[q], s->tokens[q]) + 2 * shard_rank_cp_comm(s, cost, q) - comm_v;
        c[i] = (shard_rank_time_with(cost, s->attn[q], s->tokens[q] + 1024) -
                shard_rank_time_with(cost, s->attn[q], s->tokens[q])) / 1024;
        slope[i] = c[i] + per_doc_row;
    }
    double best_t = -1;
    for (int pass = 0; pass < EVEN_PASSES; pass++) {
        double level = water_level_slopes(base, slope, g, (double)d->len);
        for (int i = 0; i < g; i++) {
            double room = (double)(capacity - s->tokens[first + i]);
            want[i] = level > base[i] ? (level - base[i]) / slope[i] : 0;
            want[i] = want[i] < room ? want[i] : room > 0 ? room : 0;
        }
        round_rows(want, g, d->len, x);
        mirrored(cost, x, g, sizes, attn);
        /* The block's exchange with these rows: its rank holding the fewest receives the rest. */
        int64_t least = -1;
        for (int i = 0; i < g; i++) {
            int64_t own = s->own[(first + i) * SHARD_DEPTHS + h] + x[i];
            least = least < 0 || own < least ? own : least;
        }
        int64_t recv = s->blk_sharded[v] + d->len - least;
        double comm = 2 * cost_cp_comm_group_s(cost, g, (recv * g + g - 2) / (g - 1));
        /* The block's slowest rank with these rows, exactly; the next pass's slopes from each
         * rank's attention per row at its positions. */
        double t = 0;
        for (int i = 0; i < g; i++) {
            int q = first + i;
            double ti = base[i] - shard_rank_time_with(cost, s->attn[q], s->tokens[q]) +
                        shard_rank_time_with(cost, s->attn[q] + attn[i], s->tokens[q] + x[i]) + comm;
            t = ti > t ? ti : t;
            if (x[i] > 0)
                slope[i] = c[i] + attn[i] / (double)x[i];
        }
        if (best_t < 0 || t < best_t) {
            best_t = t;
            for (int i = 0; i < g; i++)
                best_x[i] = x[i];
        }
    }
    mirrored(cost, best_x, g, sizes, attn);
    s->uneven[v] = 1;
    return shard_chunks(s, cost, docs, k, first, g, sizes);
}
