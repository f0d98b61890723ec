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
 * time; or an evener already made re-cut over a larger block (a pair evened to its mean can then be
 * evened with its neighbours); when none helps, s's partner (s ^ 1) may trade the documents it
 * holds whole with another rank's (both staying below s's time) if that opens an evener - s's pair
 * is aligned, a slack rank elsewhere is not. At most EVEN_MAX eveners a micro-batch.
 * The exact layout cuts each evener again on the exact times (plan_groups_cut.c); plan_groups_best
 * keeps the layout with the eveners only when its exact figure beats the one without.
 * Bound: at most 2 EVEN_MAX rounds, each O(n (L + EVEN_MAX)) water-fillings of at most cp ranks
 * (O(cp log cp) each), and when stuck cp trades of O(n) each with as many again.
 */
#include <math.h>
#include <stdlib.h>

#include "engine/plan/plan_groups_impl.h"

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

/* One evener on the lines: document k, taken off block u, cut over block w (containing u) with
 * rows[i] rows on w's rank i; uneven: the exchange it adds to each rank of w beyond per_doc's. */
typedef struct Evener {
    int64_t k;
    int u, w;
    double uneven;
    double *rows;
} Evener;

/* Puts evener e on the lines (sign +1) or takes it off (-1), k back on u. */
static void evener_apply(Nest *x, const Evener *e, int sign)
{
    int ws = plan_block_size(x->cp, e->w), wf = plan_block_first(x->cp, e->w);
    int64_t d = x->docs[e->k].len;
    double per_attn = nest_attn(x, e->k, e->w) * ws / (double)d;
    if (sign > 0)
        nest_move(x, e->k, e->u, -1);
    double comm = nest_delta(x, e->w, sign * d, 0).comm; /* after k left u, which may be w */
    x->tok[e->w] += sign * d;
    for (int i = 0; i < ws; i++) {
        x->rows[wf + i] += sign * (int64_t)(e->rows[i] + 0.5);
        x->attn_r[wf + i] += sign * e->rows[i] * per_attn;
        x->comm_r[wf + i] += comm + sign * e->uneven;
    }
    if (sign < 0)
        nest_move(x, e->k, e->u, +1);
}

typedef struct Pick {
    int64_t k;
    int u, w, again; /* again: the index of the evener it re-cuts, or -1 */
    double t;
    int64_t shed;    /* a document moved out of the re-cut evener's block first (-1: none) */
    int shed_to;     /* its new block */
    int rebuild;     /* 1: block w rebuilt around k first (rebuild) */
} Pick;

/* 1 when block v lies above rank s (holds it). */
static int above(int cp, int s, int v)
{
    return plan_block_inside(cp + s, v);
}

/* The best evener for the slowest rank s, on the lines, if it beats p->t: a document on a block
 * above s cut over a block containing that one, or an evener whose block is above s re-cut over a
 * larger block. */
static void best_evener(Nest *x, Evener *ev, int n_ev, const int32_t *even, int s, Pick *p)
{
    int cp = x->cp;
    double rows[1024], comm;
    for (int64_t k = 0; k < x->n && n_ev < EVEN_MAX; k++) {
        int u = x->node[k];
        if (even[k] || !above(cp, s, u))
            continue;
        for (int w = u; w >= 1; w /= 2) {
            double t = plan_block_size(cp, w) > 1 ? even_try(x, k, u, w, s, rows, &comm) : p->t;
            if (t < p->t)
                *p = (Pick){k, u, w, -1, t, -1, 0, 0};
        }
    }
    for (int i = 0; i < n_ev; i++) {
        if (!above(cp, s, ev[i].w) || ev[i].w == 1)
            continue;
        evener_apply(x, &ev[i], -1);
        for (int w = ev[i].w / 2; w >= 1; w /= 2) {
            double t = even_try(x, ev[i].k, ev[i].u, w, s, rows, &comm);
            if (t < p->t)
                *p = (Pick){ev[i].k, ev[i].u, w, i, t, -1, 0, 0};
        }
        evener_apply(x, &ev[i], +1);
    }
}

/* When s's evener levels its whole block above the rest: a document inside that block moved to a
 * block apart from it (staying below p->t there) and the evener re-cut over its block, which then
 * levels lower. */
static void best_shed(Nest *x, Evener *ev, int n_ev, const int32_t *even, int s, Pick *p)
{
    int cp = x->cp;
    double rows[1024], comm, top[2048];
    for (int r = 0; r < cp; r++)
        top[cp + r] = line_t(x, r, 0, 0, 0);
    for (int v = cp - 1; v >= 1; v--)
        top[v] = top[2 * v] > top[2 * v + 1] ? top[2 * v] : top[2 * v + 1];
    for (int i = 0; i < n_ev; i++) {
        int w = ev[i].w;
        if (!above(cp, s, w) || w == 1)
            continue;
        evener_apply(x, &ev[i], -1);
        for (int64_t k = 0; k < x->n; k++) {
            int u = x->node[k];
            if (even[k] || !plan_block_inside(u, w))
                continue;
            for (int to = 1; to < 2 * cp; to++) {
                if (plan_block_inside(to, w) || plan_block_inside(w, to))
                    continue; /* not apart */
                if (top[to] + nest_attn(x, k, to) >= p->t)
                    continue; /* its ranks gain at least its attention */
                /* Block to's ranks with k (apart from w, k leaving u does not touch them): none may
                 * reach p->t or its capacity - checked before moving anything (up to rounding: the
                 * sums are kept in another order once moved, hence the margin). */
                NestDelta on = nest_delta(x, to, x->docs[k].len, nest_attn(x, k, to));
                double ranks_t = 0;
                int over = 0;
                for (int r = on.first; r < on.first + on.size; r++) {
                    double tr = line_t(x, r, on.attn, (double)on.rows, on.comm);
                    ranks_t = tr > ranks_t ? tr : ranks_t;
                    over |= x->rows[r] + on.rows > x->capacity;
                }
                if (over || ranks_t >= p->t * (1 + 1e-12))
                    continue;
                nest_move(x, k, u, -1);
                nest_move(x, k, to, +1);
                int size = plan_block_size(cp, to), first = plan_block_first(cp, to);
                double t = even_try(x, ev[i].k, ev[i].u, w, s, rows, &comm);
                for (int r = first; r < first + size && t < p->t; r++) {
                    double tr = line_t(x, r, 0, 0, 0);
                    t = tr > t ? tr : t;
                    if (x->rows[r] > x->capacity)
                        t = p->t;
                }
                nest_move(x, k, to, -1);
                nest_move(x, k, u, +1);
                if (t < p->t)
                    *p = (Pick){ev[i].k, ev[i].u, w, i, t, k, to, 0};
            }
        }
        evener_apply(x, &ev[i], +1);
    }
}

/* Block w rebuilt around document k: every other document on a block inside w (eveners aside)
 * whole, longest first, each on the rank of w that would finish earliest with room, and k on w
 * itself, to be cut over it. saved: room for the documents' blocks before (returned: how many). */
static int64_t rebuild(Nest *x, const int32_t *even, int64_t k, int w, int64_t *list, int32_t *saved)
{
    int cp = x->cp, ws = plan_block_size(cp, w), wf = plan_block_first(cp, w);
    int64_t m = 0;
    for (int64_t j = 0; j < x->n; j++)
        if (!even[j] && plan_block_inside(x->node[j], w)) {
            /* Longest first (insertion; equal lengths in document order). */
            int64_t i = m++;
            for (; i > 0 && x->docs[list[i - 1]].len < x->docs[j].len; i--) {
                list[i] = list[i - 1];
                saved[i] = saved[i - 1];
            }
            list[i] = j;
            saved[i] = x->node[j];
            nest_move(x, j, x->node[j], -1);
        }
    /* The ranks' times, kept current: a whole document changes its rank's only, one sharded over
     * w every rank's. */
    double t[1024];
    for (int r = 0; r < ws; r++)
        t[r] = line_t(x, wf + r, 0, 0, 0);
    for (int64_t i = 0; i < m; i++) {
        int64_t j = list[i];
        int at = -1;
        for (int r = 0; r < ws && j != k; r++)
            if (x->rows[wf + r] + x->docs[j].len <= x->capacity && (at < 0 || t[r] < t[at]))
                at = r;
        x->node[j] = j == k || at < 0 ? w : cp + wf + at; /* no room: sharded over w */
        nest_move(x, j, x->node[j], +1);
        for (int r = x->node[j] == w ? 0 : at; r < (x->node[j] == w ? ws : at + 1); r++)
            t[r] = line_t(x, wf + r, 0, 0, 0);
    }
    return m;
}

/* Undoes rebuild. */
static void unbuild(Nest *x, const int64_t *list, const int32_t *saved, int64_t m)
{
    for (int64_t i = 0; i < m; i++) {
        nest_move(x, list[i], x->node[list[i]], -1);
        x->node[list[i]] = saved[i];
        nest_move(x, list[i], saved[i], +1);
    }
}

/* When no evener lowers s: a block w above s rebuilt around its longest document, which then
 * evens it (the others whole at full kernel tiles and without exchange). */
static void best_rebuild(Nest *x, const int32_t *even, int s, int64_t *list, int32_t *saved, Pick *p)
{
    int cp = x->cp;
    double rows[1024], comm;
    for (int w = (cp + s) / 2; w >= 1; w /= 2) {
        int64_t longest = -1;
        for (int64_t j = 0; j < x->n; j++)
            if (!even[j] && plan_block_inside(x->node[j], w) && (longest < 0 || x->docs[j].len > x->docs[longest].len))
                longest = j;
        if (longest < 0)
            continue;
        int64_t m = rebuild(x, even, longest, w, list, saved);
        double t = even_try(x, longest, w, w, s, rows, &comm);
        unbuild(x, list, saved, m);
        if (t < p->t)
            *p = (Pick){longest, w, w, -1, t, -1, 0, 1};
    }
}

/* Ranks a and b trade the documents they hold whole (eveners stay). With T > 0, only when both end below T (else
 * nothing changes and -1); T < 0: unconditionally (to undo a trade). */
static int trade(Nest *x, const int32_t *even, int a, int b, double T)
{
    int cp = x->cp;
    if (T > 0) {
        double da = 0, db = 0;
        int64_t ra = 0, rb = 0;
        for (int64_t k = 0; k < x->n; k++) {
            double e = nest_attn(x, k, cp + a); /* whole on a rank */
            int sign = even[k] ? 0 : x->node[k] == cp + a ? 1 : x->node[k] == cp + b ? -1 : 0;
            da -= sign * e;
            db += sign * e;
            ra -= sign * x->docs[k].len;
            rb += sign * x->docs[k].len;
        }
        if (line_t(x, a, da, (double)ra, 0) >= T || line_t(x, b, db, (double)rb, 0) >= T ||
            x->rows[a] + ra > x->capacity || x->rows[b] + rb > x->capacity)
            return -1;
    }
    for (int64_t k = 0; k < x->n; k++) {
        int v = x->node[k];
        if (!even[k] && (v == cp + a || v == cp + b)) {
            int to = v == cp + a ? cp + b : cp + a;
            nest_move(x, k, v, -1);
            nest_move(x, k, to, +1);
            x->node[k] = to;
        }
    }
    return 0;
}

int groups_even_pick(Nest *x, int32_t *even, double *scratch, int64_t *list, int32_t *saved, EvenCut *out)
{
    int cp = x->cp, n_ev = 0;
    Evener ev[EVEN_MAX];
    for (int round = 0; round < 2 * EVEN_MAX; round++) {
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
        Pick p = {-1, 0, 0, -1, T, -1, 0, 0};
        best_evener(x, ev, n_ev, even, s, &p);
        /* None: s's partner may be as slow as s. The documents held whole by the partner and by
         * another rank q can trade places (no block changes; both must stay below T), which can
         * give s a partner with room to even with: the best trade that opens an evener is made. */
        int swap_q = -1;
        for (int q = 0; q < cp && p.k < 0 && x->n <= 6 * (int64_t)cp; q++) {
            if (q == s || q == (s ^ 1) || trade(x, even, s ^ 1, q, T) != 0)
                continue;
            Pick with = p;
            best_evener(x, ev, n_ev, even, s, &with);
            if (with.k >= 0 && (p.k < 0 || with.t < p.t)) {
                p = with;
                swap_q = q;
            }
            trade(x, even, s ^ 1, q, -1); /* back */
        }
        if (p.k < 0 && swap_q < 0)
            best_shed(x, ev, n_ev, even, s, &p);
        if (p.k < 0 && swap_q < 0 && n_ev < EVEN_MAX)
            best_rebuild(x, even, s, list, saved, &p);
        if (p.k < 0)
            break;
        if (swap_q >= 0)
            trade(x, even, s ^ 1, swap_q, -1);
        int i = p.again >= 0 ? p.again : n_ev++;
        if (p.again >= 0)
            evener_apply(x, &ev[i], -1);
        if (p.rebuild)
            rebuild(x, even, p.k, p.w, list, saved);
        if (p.shed >= 0) {
            nest_move(x, p.shed, x->node[p.shed], -1);
            nest_move(x, p.shed, p.shed_to, +1);
            x->node[p.shed] = p.shed_to;
        }
        ev[i] = (Evener){p.k, p.u, p.w, 0, scratch + (size_t)i * cp};
        even_try(x, p.k, p.u, p.w, s, ev[i].rows, &ev[i].uneven);
        evener_apply(x, &ev[i], +1);
        even[p.k] = p.w;
        if (p.again >= 0) { /* re-cut: it moves to the end of the order */
            for (int j = 0; j < n_ev; j++)
                if (out[j].k == p.k) {
                    for (; j + 1 < n_ev; j++)
                        out[j] = out[j + 1];
                    break;
                }
        }
        out[n_ev - 1] = (EvenCut){p.k, p.w, ev[i].rows};
    }
    return n_ev;
}
