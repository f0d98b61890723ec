/*
 * engine/plan/plan_groups_nest.c - the groups search's last stage: documents moved between nested
 * blocks.
 *
 * The split and its local search (plan_groups.c, plan_groups_refine.c) give every CP rank one group,
 * and a document moves between groups only whole, so what is left at CP 16 is granularity: ranks
 * of different groups stay a few percent apart when no whole document fits the gap. Nothing in
 * the execution needs the groups to be a partition: a document sharded over any aligned block
 * exchanges its K/V in that block's communicator, and a rank that lies in several blocks holding
 * sharded documents runs one exchange per block (largest first), its time the sum of them. Blocks
 * are the nodes of the tree over the ranks (plan_shard_impl.h): a rank lies in one block of each
 * size. With documents free to go to any block, a block of 2^j ranks moves about d / 2^j tokens per
 * rank at a time, so a short document sharded over the ranks of a slow pair, or a long one moved
 * to a half, evens ranks that whole documents could not.
 *
 * The search starts from the refined split (each document on its group's block, or on its rank's
 * block when whole) and repeatedly makes the best move off the slowest rank s (time T): a document
 * on a block above s to any other block. As in plan_groups_refine.c, a move is taken only when
 * every rank it changes ends strictly below T, and of those the one whose changed ranks end lowest,
 * so the rank times sorted descending fall lexicographically, the search ends and the slowest rank
 * never rises; when the slowest rank has no such move, the next slowest ranks are tried (a budget
 * of cp such moves, for micro-batches of at most 6 cp documents). Every rank keeps its capacity.
 * A block's documents add to each of its ranks their attention per rank (est), ceil(tokens / 2^j)
 * rows and the block's exchange, all on the cost model's lines (plan_groups_impl.h).
 * Bound: at most 2 n + cp moves, each a scan of the n documents for those above the rank, then per
 * such document 2 cp - 2 target blocks, each dropped in O(1) when the least it adds to its ranks
 * reaches the best move so far, else evaluated over its ranks (O(cp)).
 */
#include "engine/plan/plan_groups_impl.h"

static int node_depth(int v)
{
    return 31 - __builtin_clz((unsigned)v);
}

/* Rows each rank of block v holds of its documents: per_doc gives ceil(tokens / size) at most. */
static int64_t node_rows(const Nest *x, int v, int64_t tok)
{
    int size = x->cp >> node_depth(v);
    return (tok + size - 1) / size;
}

/* Both directions of block v's exchange of tok tokens (0 for a rank alone). */
static double node_comm(const Nest *x, int v, int64_t tok)
{
    int lg = x->depth - node_depth(v);
    return 2 * line_cp_comm(x->line, lg, tok);
}

/* Document k's attention per rank on block v. */
static double node_attn(const Nest *x, int64_t k, int v)
{
    return x->est[k * x->stride + (x->depth - node_depth(v))];
}

static double rank_time(const Nest *x, int r, double da, int64_t drows, double dcomm, int64_t *rows)
{
    *rows = x->rows[r] + drows;
    return line_rank_time(x->line, x->attn_r[r] + da, *rows) + x->comm_r[r] + dcomm;
}

/* Document k onto (sign +1) or off (-1) block v: the block's sums and its ranks'. */
static void apply(Nest *x, int64_t k, int v, int sign)
{
    int64_t d = x->docs[k].len, tok = x->tok[v] + sign * d;
    double a = sign * node_attn(x, k, v);
    int64_t drows = node_rows(x, v, tok) - node_rows(x, v, x->tok[v]);
    double dcomm = node_comm(x, v, tok) - node_comm(x, v, x->tok[v]);
    x->tok[v] = tok;
    int size = x->cp >> node_depth(v), first = (v - (1 << node_depth(v))) * size;
    for (int r = first; r < first + size; r++) {
        x->attn_r[r] += a;
        x->rows[r] += drows;
        x->comm_r[r] += dcomm;
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
        apply(x, k, x->node[k], +1);
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
    int64_t k;
    int to;
    double t; /* the highest time over the ranks it changes */
} NestMove;

/* The change a document of d tokens and attention a per rank makes to each rank of block v, when
 * added (sign +1) or removed (-1). */
typedef struct Delta {
    double attn, comm;
    int64_t rows;
    int first, size;
} Delta;

static Delta delta(const Nest *x, int64_t k, int v, int sign)
{
    int64_t d = x->docs[k].len, tok = x->tok[v] + sign * d;
    int h = node_depth(v), size = x->cp >> h;
    return (Delta){sign * node_attn(x, k, v), node_comm(x, v, tok) - node_comm(x, v, x->tok[v]),
                   node_rows(x, v, tok) - node_rows(x, v, x->tok[v]), (v - (1 << h)) * size, size};
}

static int in_block(const Delta *b, int r)
{
    return r >= b->first && r < b->first + b->size;
}

/* The best move off rank s (time T), given now[r] every rank's time and top[v] the slowest time
 * among block v's ranks. */
static NestMove best_move(const Nest *x, int s, double T, const double *now, const double *top)
{
    int cp = x->cp, leaf = cp + s;
    NestMove best = {-1, 0, 0};
    for (int64_t k = 0; k < x->n; k++) {
        int u = x->node[k];
        if ((leaf >> (node_depth(leaf) - node_depth(u))) != u)
            continue; /* not on a block above s */
        Delta off = delta(x, k, u, -1);
        /* Its block's ranks without it; the highest of them. */
        double out_max = 0;
        for (int r = off.first; r < off.first + off.size; r++) {
            int64_t rows;
            double t = rank_time(x, r, off.attn, off.rows, off.comm, &rows);
            out_max = t > out_max ? t : out_max;
        }
        for (int w = 1; w < 2 * cp; w++) {
            if (w == u)
                continue;
            Delta on = delta(x, k, w, +1);
            double bar = best.k >= 0 && best.t < T ? best.t : T;
            /* Every rank of w that does not lose the document gains at least this. */
            int nested = in_block(&off, on.first) || in_block(&on, off.first);
            if (!nested && top[w] + on.attn + x->line->lin * (double)on.rows + on.comm >= bar)
                continue;
            double mx = 0;
            int ok = 1;
            for (int r = on.first; r < on.first + on.size && ok; r++) {
                int64_t rows;
                int both = in_block(&off, r);
                double t = rank_time(x, r, on.attn + (both ? off.attn : 0), on.rows + (both ? off.rows : 0),
                                     on.comm + (both ? off.comm : 0), &rows);
                ok = rows <= x->capacity && t < bar;
                mx = t > mx ? t : mx;
            }
            if (!ok)
                continue;
            /* The ranks that only lose it. */
            if (!nested) {
                mx = out_max > mx ? out_max : mx;
            } else if (!in_block(&on, off.first) || on.size < off.size) {
                for (int r = off.first; r < off.first + off.size; r++) {
                    if (in_block(&on, r))
                        continue;
                    int64_t rows;
                    double t = rank_time(x, r, off.attn, off.rows, off.comm, &rows);
                    mx = t > mx ? t : mx;
                }
            }
            if (mx < bar)
                best = (NestMove){k, w, mx};
        }
    }
    (void)now;
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
        NestMove best = best_move(x, by_t[0], now[by_t[0]], now, top);
        for (int i = 1; i < cp && best.k < 0 && x->plateau > 0; i++)
            if ((best = best_move(x, by_t[i], now[by_t[i]], now, top)).k >= 0)
                x->plateau--;
        if (best.k < 0)
            return;
        apply(x, best.k, x->node[best.k], -1);
        apply(x, best.k, best.to, +1);
        x->node[best.k] = best.to;
        x->moves++;
    }
}
