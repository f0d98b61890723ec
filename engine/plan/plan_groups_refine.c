/*
 * engine/plan/plan_groups_refine.c - the groups search's local search (after the greedy).
 *
 * The greedy places documents longest first and never looks back, so its slowest rank is often a
 * few percent above the mean: the last documents were too short to even it out, or a long one went
 * where it finished earliest then but not where it fits best in the end. The local search takes the
 * greedy's layout (groups, every document's group or whole rank) and repeatedly makes the best move
 * that lowers the slowest rank s (time T):
 *   - a document held whole by s: to another rank whole, or sharded over any group;
 *   - a document sharded over s's group: to another group, or whole to any rank;
 *   - swapping a document held whole by s with a shorter one held whole by another rank.
 * A move is taken only when every rank it changes ends strictly below T (s included), and of those
 * the one whose changed ranks end lowest: the rank times sorted descending then fall
 * lexicographically with every move, so the search ends, and the slowest rank's time never rises
 * (it falls, or the number of ranks at it does). When the slowest rank has no such move, the same
 * search runs off the next slowest ranks in turn (the same rule, with their own time for T: the
 * sorted times still fall), which often opens room for the slowest rank's next move - a budget
 * of cp such moves, and only for micro-batches of at most 6 cp documents. Every rank keeps its
 * capacity (its group's share plus its whole documents). Rank times come from the same lines as
 * the greedy (plan_groups.c).
 * Bound: at most 2 n + cp moves (a safety cap; max_moves > 0 sets another), each O(n x cp) line
 * evaluations off one rank at worst, cp times that when the slowest is stuck (at most cp + 1 times
 * a search); a candidate whose receiving rank would pass T on its attention alone is skipped
 * before its time is evaluated.
 */
#include "engine/plan/plan_groups_impl.h"

/* Rank r's time with its group's attention, tokens and its whole documents changed by the deltas. */
static double rank_t(const Refine *f, int r, double d_gattn, int64_t d_gtok, double d_wattn, int64_t d_wtok,
                     int64_t *rows)
{
    const Group *g = &f->g[f->grp_of[r]];
    int64_t gt = g->tokens + d_gtok;
    *rows = (gt + g->size - 1) / g->size + f->whole_tok[r] + d_wtok;
    return group_rank_time(f->line, g->size, g->log2_size, g->attn + d_gattn + f->whole_attn[r] + d_wattn, gt, *rows);
}

/* The highest time over group a's ranks with its attention and tokens changed (+ rank x's whole
 * documents changed by wa, wt, when x is in a), or -1 when a rank would exceed the capacity. */
static double group_max(const Refine *f, int a, double ga, int64_t gt, int x, double wa, int64_t wt)
{
    double mx = 0;
    for (int r = f->g[a].first; r < f->g[a].first + f->g[a].size; r++) {
        int64_t rows;
        double t = rank_t(f, r, ga, gt, r == x ? wa : 0, r == x ? wt : 0, &rows);
        if (rows > f->capacity)
            return -1;
        mx = t > mx ? t : mx;
    }
    return mx;
}

typedef struct Move {
    int64_t k, k2;  /* the document; k2: the one swapped with it (-1: none) */
    int32_t to;     /* its new place: a group (>= 0) or -1 - r whole on rank r */
    double t;       /* the highest time over the ranks it changes */
} Move;

static void consider(Move *best, int64_t k, int64_t k2, int32_t to, double t, double T)
{
    if (t >= 0 && t < T && (best->k < 0 || t < best->t))
        *best = (Move){k, k2, to, t};
}

static void apply(Refine *f, int64_t k, int32_t to, int sign)
{
    int64_t d = f->docs[k].len;
    if (to >= 0) {
        f->g[to].attn += sign * f->est[k * (f->levels + 1) + f->g[to].level];
        f->g[to].tokens += sign * d;
    } else {
        f->whole_attn[-1 - to] += sign * f->est[k * (f->levels + 1) + f->levels];
        f->whole_tok[-1 - to] += sign * d;
    }
}

double groups_refine_start(Refine *f)
{
    for (int a = 0; a < f->ng; a++) {
        f->g[a].attn = 0;
        f->g[a].tokens = 0;
        for (int r = f->g[a].first; r < f->g[a].first + f->g[a].size; r++)
            f->grp_of[r] = a;
    }
    for (int r = 0; r < f->cp; r++) {
        f->whole_attn[r] = 0;
        f->whole_tok[r] = 0;
    }
    /* Moves off a rank other than the slowest allowed in the search: cp, when the micro-batch holds
     * at most 6 cp documents (a scan of every rank then costs O(cp n) candidates, as much as a few
     * greedy passes; with more, and shorter, documents the slowest rank's own moves even it out). */
    f->plateau = f->n <= 6 * (int64_t)f->cp ? f->cp : 0;
    for (int64_t k = 0; k < f->n; k++) {
        int32_t a = f->assign[k];
        if (a >= 0 && f->g[a].size == 1) /* a group of one holds its documents whole */
            a = f->assign[k] = -1 - f->g[a].first;
        apply(f, k, a, +1);
    }
    for (int r = 0; r < f->cp; r++) {
        int64_t rows;
        rank_t(f, r, 0, 0, 0, 0, &rows);
        if (rows > f->capacity)
            return -1;
    }
    return groups_refine_worst(f);
}

double groups_refine_worst(const Refine *f)
{
    double T = 0;
    for (int r = 0; r < f->cp; r++) {
        int64_t rows;
        double t = rank_t(f, r, 0, 0, 0, 0, &rows);
        T = t > T ? t : T;
    }
    return T;
}

/* The best move off rank s (time T): every rank it changes ends strictly below T. best.k < 0: none. */
static Move best_move(const Refine *f, int s, double T, const double *now, const double *gmax, double *out)
{
    int cp = f->cp;
    int gs = f->grp_of[s];
    Move best = {-1, -1, 0, 0};
    for (int64_t k = 0; k < f->n; k++) {
        int32_t at = f->assign[k];
        int64_t d = f->docs[k].len;
        const double *e = &f->est[k * (f->levels + 1)];
        if (at == -1 - s) {
            /* Held whole by s. The lowest s can get: without it. */
            double wa = -e[f->levels];
            int64_t rows_s;
            double ts = rank_t(f, s, 0, 0, wa, -d, &rows_s);
            for (int r = 0; r < cp; r++) {
                /* r's time grows by at least the document's attention. */
                if (r == s || now[r] + e[f->levels] >= T)
                    continue;
                int64_t rows_r;
                double tr = rank_t(f, r, 0, 0, e[f->levels], d, &rows_r);
                if (rows_r <= f->capacity)
                    consider(&best, k, -1, -1 - r, ts > tr ? ts : tr, T);
            }
            for (int a = 0; a < f->ng; a++) {
                if (f->g[a].size == 1)
                    continue; /* a group of one: the same as whole on its rank */
                double ga = e[f->g[a].level];
                double t = group_max(f, a, ga, d, s, wa, -d);
                if (t >= 0 && a != gs)
                    t = t > ts ? t : ts;
                consider(&best, k, -1, a, t, T);
            }
            /* Swaps with a shorter document held whole elsewhere. */
            for (int64_t k2 = 0; k2 < f->n; k2++) {
                int32_t at2 = f->assign[k2];
                if (at2 >= 0 || at2 == at || f->docs[k2].len >= d)
                    continue;
                int r = -1 - at2;
                double w2 = f->est[k2 * (f->levels + 1) + f->levels];
                if (now[r] + e[f->levels] - w2 >= T) /* r gains the attention difference and more */
                    continue;
                int64_t d2 = f->docs[k2].len, rows_2, rows_r;
                double ts2 = rank_t(f, s, 0, 0, wa + w2, d2 - d, &rows_2);
                double tr = rank_t(f, r, 0, 0, e[f->levels] - w2, d - d2, &rows_r);
                if (rows_r <= f->capacity)
                    consider(&best, k, k2, at2, ts2 > tr ? ts2 : tr, T);
            }
        } else if (at == gs && f->g[gs].size > 1) {
            /* Sharded over s's group: its ranks all lose it. Their times without it, and the
             * highest two (when one of them takes it whole, the others stay at theirs). */
            double ga = -e[f->g[gs].level], top1 = -1, top2 = -1;
            int top_r = -1;
            for (int r = f->g[gs].first; r < f->g[gs].first + f->g[gs].size; r++) {
                int64_t rows;
                out[r] = rank_t(f, r, ga, -d, 0, 0, &rows);
                if (out[r] > top1) {
                    top2 = top1;
                    top1 = out[r];
                    top_r = r;
                } else if (out[r] > top2) {
                    top2 = out[r];
                }
            }
            double t_out = top1;
            for (int a = 0; a < f->ng; a++) {
                /* Every rank of a gains at least the document's attention there. */
                if (a == gs || f->g[a].size == 1 || gmax[a] + e[f->g[a].level] >= T)
                    continue;
                double t = group_max(f, a, e[f->g[a].level], d, -1, 0, 0);
                if (t >= 0)
                    consider(&best, k, -1, a, t > t_out ? t : t_out, T);
            }
            for (int r = 0; r < cp; r++) {
                int in = f->grp_of[r] == gs;
                if ((in ? out[r] : now[r]) + e[f->levels] >= T)
                    continue;
                int64_t rows;
                double t = in ? rank_t(f, r, ga, -d, e[f->levels], d, &rows) : rank_t(f, r, 0, 0, e[f->levels], d, &rows);
                if (rows > f->capacity)
                    continue;
                double others = in ? (r == top_r ? top2 : top1) : t_out;
                consider(&best, k, -1, -1 - r, t > others ? t : others, T);
            }
        }
    }
    return best;
}

void groups_refine(Refine *f)
{
    int cp = f->cp;
    int64_t cap = f->max_moves > 0 ? f->max_moves : 2 * f->n + cp;
    double now[1024], out[1024]; /* every rank's time before the move; without a document */
    double gmax[GROUPS_UNITS];       /* per group: its slowest rank's time */
    int by_t[1024];                  /* the ranks, slowest first */
    for (int64_t step = 0; step < cap; step++) {
        for (int r = 0; r < cp; r++) {
            int64_t rows;
            now[r] = rank_t(f, r, 0, 0, 0, 0, &rows);
        }
        for (int a = 0; a < f->ng; a++)
            gmax[a] = 0;
        for (int r = 0; r < cp; r++) {
            gmax[f->grp_of[r]] = now[r] > gmax[f->grp_of[r]] ? now[r] : gmax[f->grp_of[r]];
            int j = r;
            for (; j > 0 && now[by_t[j - 1]] < now[r]; j--)
                by_t[j] = by_t[j - 1];
            by_t[j] = r;
        }
        /* Off the slowest rank if it can; else off the next slowest that can (every rank a move
         * changes still ends below the rank it leaves, so the sorted times fall all the same and
         * the slowest never rises), which can open room for the slowest's next move. */
        Move best = best_move(f, by_t[0], now[by_t[0]], now, gmax, out);
        /* Off the next slowest only while the budget lasts (cp such moves a search): when the
         * slowest is stuck, each costs a scan of the ranks in turn. */
        for (int i = 1; i < cp && best.k < 0 && f->plateau > 0; i++)
            if ((best = best_move(f, by_t[i], now[by_t[i]], now, gmax, out)).k >= 0)
                f->plateau--;
        if (best.k < 0)
            return;
        int32_t from = f->assign[best.k];
        apply(f, best.k, from, -1);
        if (best.k2 >= 0) {
            apply(f, best.k2, best.to, -1);
            apply(f, best.k2, from, +1);
            f->assign[best.k2] = from;
        }
        apply(f, best.k, best.to, +1);
        f->assign[best.k] = best.to;
        f->moves++;
    }
}
