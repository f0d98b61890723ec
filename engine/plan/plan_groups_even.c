/*
 * engine/plan/plan_groups_even.c - the groups search's eveners: documents cut unevenly over a block
 * to fill what whole documents and per_doc's equal shares leave uneven.
 *
 * After the split and the nested search (plan_groups.c, plan_groups_nest.c), the
 * ranks of a CP 16 micro-batch are still 1-3% apart: a rank holds about 6-8K rows there, so 1% is
 * 60-80 rows, while the shortest documents of a 128K micro-batch are near 1K tokens, and a document
 * only moves whole or in per_doc's equal shares. An evener is the continuous knob those moves
 * lack: a document on a block above the slowest rank s is taken off it and cut over a block w
 * containing that one, each rank of w getting as many rows as it lacks: with the document off,
 * rank i of w has time b_i on the lines, a row adds a (its GEMMs and so on, and per_doc's attention
 * per row over w), and the level L with sum_i max(0, (L - b_i) / a) = d (water-filling over the
 * sorted b_i) gives rank i max(0, (L - b_i) / a) rows. Its exchange: the document's K/V over w,
 * priced as an all-gather of uneven shares is (the rank holding the fewest rows receives the
 * rest, so a rank left without rows costs w up to d / g tokens more than per_doc's).
 *
 * groups_even_pick repeats, while it lowers the slowest rank: of every document on a block above
 * s and every block containing its block, the cut that leaves w's slowest rank lowest, if below s's
 * time. At most EVEN_MAX eveners a micro-batch.
 * groups_even_lay_out lays them out with those rows, rounded; plan_groups_best keeps the layout with
 * the eveners only when its exact figure beats the one without.
 * Bound: at most EVEN_MAX rounds, each O(n L) water-fillings of at most cp ranks (O(cp log cp)
 * each).
 */
#include <math.h>
#include <stdlib.h>

#include "engine/plan/plan_groups.h"

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The level L at which sum_r max(0, (L - base[r]) / c) = d; sorted: scratch of n. */
static double water_level(const double *base, int n, double c, double d, double *sorted)
{
    if (n <= 32) { /* a block of a few ranks: insertion sort beats qsort's calls */
        for (int r = 0; r < n; r++) {
            int j = r;
            for (; j > 0 && sorted[j - 1] > base[r]; j--)
                sorted[j] = sorted[j - 1];
            sorted[j] = base[r];
        }
    } else {
        for (int r = 0; r < n; r++)
            sorted[r] = base[r];
        qsort(sorted, (size_t)n, sizeof *sorted, by_value);
    }
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

/* Bases of block w's ranks with document k off block u (inside w) and w's exchange grown by it;
 * out: the bases, returns their highest. */
static double bases(const Nest *x, int64_t k, int u, int w, double *b)
{
    int64_t d = x->docs[k].len;
    NestDelta du = nest_delta(x, u, -d, -nest_attn(x, k, u));
    /* w's exchange with k on it, from w's tokens once k is off u (the same when w is u). */
    double dw_comm = w == u ? -du.comm : nest_delta(x, w, d, 0).comm;
    int ws = plan_block_size(x->cp, w), wf = plan_block_first(x->cp, w);
    double top = 0;
    for (int r = wf; r < wf + ws; r++) {
        int in = r >= du.first && r < du.first + du.size;
        b[r - wf] = line_t(x, r, in ? du.attn : 0, in ? (double)du.rows : 0, (in ? du.comm : 0) + dw_comm);
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
    int hw = plan_block_depth(w), ws = plan_block_size(x->cp, w);
    int64_t d = x->docs[k].len;
    double b[1024], sorted[1024];
    /* A row adds its GEMMs and so on, and its share of per_doc's attention over w. */
    double per_attn = nest_attn(x, k, w) * ws / (double)d;
    double per = per_row(x->line, x->rows[s]) + per_attn;
    *comm = 0;
    if (!(per > 0) || !(d > 0)) /* a cost model without row costs: nothing to even with */
        return INFINITY;
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

/* Puts an evener on the lines: document k off block u, cut over block w (containing u) with rows[i]
 * rows on w's rank i; uneven: the exchange it adds to each rank of w beyond per_doc's. */
static void evener_apply(Nest *x, int64_t k, int u, int w, const double *rows, double uneven)
{
    int ws = plan_block_size(x->cp, w), wf = plan_block_first(x->cp, w);
    int64_t d = x->docs[k].len;
    double per_attn = nest_attn(x, k, w) * ws / (double)d;
    nest_move(x, k, u, -1);
    double comm = nest_delta(x, w, d, 0).comm; /* after k left u, which may be w */
    x->tok[w] += d;
    for (int i = 0; i < ws; i++) {
        x->rows[wf + i] += (int64_t)(rows[i] + 0.5);
        x->attn_r[wf + i] += rows[i] * per_attn;
        x->comm_r[wf + i] += comm + uneven;
    }
}

typedef struct Pick {
    int64_t k;
    int u, w;
    double t;
} Pick;

/* 1 when block v lies above rank s (holds it). */
static int above(int cp, int s, int v)
{
    return plan_block_inside(cp + s, v);
}

/* The best evener for the slowest rank s, on the lines, if it beats p->t: a document on a block
 * above s cut over a block containing that one. */
static void best_evener(Nest *x, const int32_t *even, int s, Pick *p)
{
    int cp = x->cp;
    double rows[1024], comm;
    for (int64_t k = 0; k < x->n; k++) {
        int u = x->node[k];
        if (even[k] || !above(cp, s, u))
            continue;
        for (int w = u; w >= 1; w /= 2) {
            double t = plan_block_size(cp, w) > 1 ? even_try(x, k, u, w, s, rows, &comm) : p->t;
            if (t < p->t)
                *p = (Pick){k, u, w, t};
        }
    }
}

int groups_even_pick(Nest *x, int32_t *even, double *scratch, EvenCut *out)
{
    int cp = x->cp, n_ev = 0;
    while (n_ev < EVEN_MAX) {
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
        Pick p = {-1, 0, 0, T};
        best_evener(x, even, s, &p);
        if (p.k < 0)
            break;
        double *rows = scratch + (size_t)n_ev * cp, uneven;
        even_try(x, p.k, p.u, p.w, s, rows, &uneven);
        evener_apply(x, p.k, p.u, p.w, rows, uneven);
        even[p.k] = p.w;
        out[n_ev++] = (EvenCut){p.k, p.w, rows};
    }
    return n_ev;
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

int groups_even_lay_out(Shard *s, const CostModel *cost, const PlanDoc *docs, const EvenCut *ev, int n_ev)
{
    for (int i = 0; i < n_ev; i++) {
        int g = plan_block_size(s->cp, ev[i].w), first = plan_block_first(s->cp, ev[i].w);
        int64_t x[1024], sizes[2 * 1024];
        round_rows(ev[i].rows, g, docs[ev[i].k].len, x);
        /* Rank i's rows as two chunks, mirrored as per_doc places its two (chunks i and 2 g - 1 - i
         * of the document), so its rows sit early and late and its attention per row is near the
         * document's mean. */
        for (int r = 0; r < g; r++) {
            sizes[r] = (x[r] + 1) / 2;
            sizes[2 * g - 1 - r] = x[r] / 2;
        }
        s->uneven[ev[i].w]++;
        if (shard_chunks(s, cost, docs, ev[i].k, first, g, sizes) != 0)
            return -1;
    }
    return 0;
}
