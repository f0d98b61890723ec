/*
 * engine/plan/plan_groups_nest.c - the groups search's nested blocks: documents moved between any
 * blocks of CP ranks after the split.
 *
 * The split (plan_groups.c) gives every CP rank one group, and its greedy never looks back, so its
 * slowest rank is often a few percent above the mean. Nothing in the execution needs the groups to
 * be a partition: a document sharded over any aligned block exchanges its K/V in that block's
 * communicator, and a rank that lies in several blocks holding sharded documents runs one exchange
 * per block (largest first), its time the sum of them. Blocks are the nodes of the tree over the
 * ranks (plan.h): a rank lies in one block of each size. With documents free to go to
 * any block, a block of 2^j ranks moves about d / 2^j tokens per rank at a time, so a short document
 * sharded over the ranks of a slow pair, or a long one moved to a half, evens ranks that whole
 * documents could not.
 *
 * The search starts from the split (each document on its group's block, or on its rank's block when
 * whole) and repeatedly makes the best move off the slowest rank s (time T): a document on a block
 * above s to any other block, or swapped with a shorter document on another block (k to its block,
 * it to k's). A move is taken only when every rank it changes ends strictly below T, and of those
 * the one whose changed ranks end lowest, so the rank times sorted descending fall
 * lexicographically, the search ends and the slowest rank never rises; when the slowest rank has no
 * such move, the next NEST_SCAN - 1 slowest ranks are tried (a budget of cp such moves, for
 * micro-batches of at most 6 cp documents). Every rank keeps its capacity. A block's documents add
 * to each of its ranks their attention per rank (est), ceil(tokens / 2^j) rows and the block's
 * exchange, all on the cost model's lines (plan_groups.h).
 * Bound: at most 2 n + cp moves, each a scan of the n documents for those above the rank, then per
 * such document 2 cp - 2 target blocks and n swap partners, each dropped in O(1) when the least it
 * adds to its ranks reaches the best move so far, else evaluated over its ranks (O(cp)).
 */
#include "engine/plan/plan_groups.h"

enum { NEST_SCAN = 4 }; /* when the slowest rank is stuck, moves off the next slowest ranks up to this */

/* "Strictly below T" means below T by more than rounding: a move is predicted on one sum of its
 * deltas, and nest_move applies them one block at a time, which may round a rank predicted a hair
 * below T back to T; two such moves then undo each other forever (a swap of two documents between
 * sibling blocks whose ranks tie at T, seen with the TP collectives exposed). */
#define NEST_BELOW (1 - 1e-12)

static double rank_time(const Nest *x, int r, double da, int64_t drows, double dcomm, int64_t *rows)
{
    *rows = x->rows[r] + drows;
    return line_rank_time(x->line, x->attn_r[r] + da, *rows) + x->comm_r[r] + dcomm;
}

void nest_move(Nest *x, int64_t k, int v, int sign)
{
    int64_t d = sign * x->docs[k].len;
    NestDelta c = nest_delta(x, v, d, sign * nest_attn(x, k, v));
    x->tok[v] += d;
    for (int r = c.first; r < c.first + c.size; r++) {
        x->attn_r[r] += c.attn;
        x->rows[r] += c.rows;
        x->comm_r[r] += c.comm;
    }
}

double groups_nest_start(Nest *x)
{
    for (int v = 1; v < 2 * x->cp; v++)
        x->tok[v] = 0;
    for (int r = 0; r < x->cp; r++) {
        x->attn_r[r] = x->comm_r[r] = 0;
        x->rows[r] = 0;
    }
    x->plateau = x->n <= 6 * (int64_t)x->cp ? x->cp : 0;
    for (int64_t k = 0; k < x->n; k++)
        nest_move(x, k, x->node[k], +1);
    for (int r = 0; r < x->cp; r++)
        if (x->rows[r] > x->capacity)
            return -1;
    return groups_nest_worst(x);
}

double groups_nest_worst(const Nest *x)
{
    double T = 0;
    for (int r = 0; r < x->cp; r++) {
        int64_t rows;
        double t = rank_time(x, r, 0, 0, 0, &rows);
        T = t > T ? t : T;
    }
    return T;
}

typedef struct NestMove {
    int64_t k, k2; /* the document; k2: the one swapped with it (-1: none) */
    int to;        /* k's new block (k2 goes to k's old one) */
    double t;      /* the highest time over the ranks it changes */
} NestMove;

static int in_block(const NestDelta *b, int r)
{
    return r >= b->first && r < b->first + b->size;
}

/* The highest new time over the ranks of blocks a and b (each rank with the deltas of the blocks it
 * lies in), or -1 when a rank would reach `bar` or exceed the capacity. */
static double changed_max(const Nest *x, const NestDelta *a, const NestDelta *b, double bar)
{
    double mx = 0;
    for (int pass = 0; pass < 2; pass++) {
        const NestDelta *blk = pass ? b : a;
        for (int r = blk->first; r < blk->first + blk->size; r++) {
            if (pass && in_block(a, r))
                continue; /* done in the first pass */
            int ia = in_block(a, r), ib = in_block(b, r);
            int64_t rows;
            double t = rank_time(x, r, (ia ? a->attn : 0) + (ib ? b->attn : 0), (ia ? a->rows : 0) + (ib ? b->rows : 0),
                                 (ia ? a->comm : 0) + (ib ? b->comm : 0), &rows);
            if (rows > x->capacity || t >= bar)
                return -1;
            mx = t > mx ? t : mx;
        }
    }
    return mx;
}

/* What a change adds at least to each of its block's ranks: its attention, its rows' GEMMs and
 * element-wise work and TP exchanges, its K/V exchange. */
static double least_gain(const Nest *x, const NestDelta *d)
{
    return d->attn + x->line->lin * (double)d->rows + line_tp_least(x->line, d->rows) + d->comm;
}

/* A lower bound on the slowest of block b's ranks after changes a and b (top_b: its slowest now). */
static double least_after(const Nest *x, const NestDelta *a, const NestDelta *b, double top_b)
{
    double gb = least_gain(x, b), ga = least_gain(x, a);
    if (!in_block(a, b->first) && !in_block(b, a->first))
        return top_b + gb; /* apart */
    if (in_block(a, b->first) && b->size <= a->size)
        return top_b + gb + ga; /* b inside a: every rank of b has both */
    return top_b + gb + (ga < 0 ? ga : 0); /* a inside b */
}

static void consider(NestMove *best, int64_t k, int64_t k2, int to, double t)
{
    if (t >= 0 && (best->k < 0 || t < best->t))
        *best = (NestMove){k, k2, to, t};
}

/* The best move off rank s (time T), top[v] the slowest time among block v's ranks: a document on a
 * block above s to another block, or swapped with a document on another block. */
static NestMove best_move(const Nest *x, int s, double T, const double *top)
{
    int cp = x->cp, leaf = cp + s;
    T *= NEST_BELOW;
    NestMove best = {-1, -1, 0, 0};
    for (int64_t k = 0; k < x->n; k++) {
        int u = x->node[k];
        if (!plan_block_inside(leaf, u))
            continue; /* not on a block above s */
        int64_t d = x->docs[k].len;
        double eu = nest_attn(x, k, u);
        NestDelta off = nest_delta(x, u, -d, -eu);
        for (int w = 1; w < 2 * cp; w++) {
            if (w == u)
                continue;
            double bar = best.k >= 0 ? best.t : T, ew = nest_attn(x, k, w);
            /* Its slowest rank gains at least the attention and the GEMMs of its share (when apart
             * from u): the cheap test first. */
            int lg = x->depth - plan_block_depth(w), ws = 1 << lg, wf = plan_block_first(cp, w);
            if ((wf >= off.first + off.size || off.first >= wf + ws) &&
                top[w] + ew + x->line->lin * (double)(d >> lg) + line_tp_least(x->line, d >> lg) >= bar)
                continue; /* d / ws: sizes are powers of two */
            NestDelta on = nest_delta(x, w, d, ew);
            if (least_after(x, &off, &on, top[w]) >= bar)
                continue;
            consider(&best, k, -1, w, changed_max(x, &off, &on, bar));
        }
        /* Swaps: k to k2's block, k2 to u. */
        for (int64_t k2 = 0; k2 < x->n; k2++) {
            int w = x->node[k2];
            int64_t d2 = x->docs[k2].len;
            if (w == u || d2 >= d)
                continue;
            double bar = best.k >= 0 ? best.t : T, ew = nest_attn(x, k, w) - nest_attn(x, k2, w);
            int lg = x->depth - plan_block_depth(w), ws = 1 << lg, wf = plan_block_first(cp, w);
            int64_t least_rows = ((d - d2) >> lg) - 1; /* d > d2 */
            if ((wf >= off.first + off.size || off.first >= wf + ws) &&
                top[w] + ew + x->line->lin * (double)least_rows + line_tp_least(x->line, least_rows) >= bar)
                continue;
            NestDelta a = nest_delta(x, u, d2 - d, nest_attn(x, k2, u) - eu);
            NestDelta b = nest_delta(x, w, d - d2, ew);
            if (least_after(x, &a, &b, top[w]) >= bar)
                continue;
            consider(&best, k, k2, w, changed_max(x, &a, &b, bar));
        }
    }
    return best;
}

void groups_nest(Nest *x)
{
    int cp = x->cp;
    int64_t cap = x->max_moves > 0 ? x->max_moves : 2 * x->n + cp;
    double now[1024], top[2048];
    int by_t[1024];
    for (int64_t step = 0; step < cap; step++) {
        for (int r = 0; r < cp; r++) {
            int64_t rows;
            now[r] = top[cp + r] = rank_time(x, r, 0, 0, 0, &rows);
            int j = r;
            for (; j > 0 && now[by_t[j - 1]] < now[r]; j--)
                by_t[j] = by_t[j - 1];
            by_t[j] = r;
        }
        for (int v = cp - 1; v >= 1; v--)
            top[v] = top[2 * v] > top[2 * v + 1] ? top[2 * v] : top[2 * v + 1];
        NestMove best = best_move(x, by_t[0], now[by_t[0]], top);
        for (int i = 1; i < NEST_SCAN && i < cp && best.k < 0 && x->plateau > 0; i++)
            if ((best = best_move(x, by_t[i], now[by_t[i]], top)).k >= 0)
                x->plateau--;
        if (best.k < 0)
            return;
        int from = x->node[best.k];
        nest_move(x, best.k, from, -1);
        if (best.k2 >= 0) {
            nest_move(x, best.k2, best.to, -1);
            nest_move(x, best.k2, from, +1);
            x->node[best.k2] = from;
        }
        nest_move(x, best.k, best.to, +1);
        x->node[best.k] = best.to;
        x->moves++;
    }
}
