/*
 * engine/plan/plan_groups.c - balance.cp_sharding: groups (FlexSP's heterogeneous sequence-parallel
 * groups, in all-gather CP): the split search, and the stages after it.
 *
 * Every document of a micro-batch is sharded per_doc over an aligned block of CP ranks of a
 * power-of-two size (a block of size g starts at a multiple of g, so it is one of the blocks whose
 * communicators are made once at start, comm.h: GROUP_CP_BLOCK; 2 g chunks, chunks i and 2 g - 1 - i
 * on the block's rank i) or kept whole on one rank (a block of one, no exchange). Why: a document
 * sharded over all CP ranks gives chunks of d / 2 CP tokens - a 16K document at CP 16 makes chunks
 * of 512, where the attention kernel runs at 512 / (512 + 238) = 68% of its long-query rate - and
 * every rank gathers its K/V; over a block just large enough to balance it, its chunks are longer
 * and its K/V go to fewer ranks over a faster link (a block of tp * g ranks within a node uses
 * NVLink). Blocks may nest (plan_groups_nest.c) and a few documents may be cut unevenly over theirs
 * (plan_groups_even.c).
 *
 * This file, for K = min(cp, 16) units of u = cp / K ranks:
 *  1. Predict every document on every block size g = u, 2u, .., cp: its attention per rank when
 *     sharded per_doc over g ranks. With chunks of c = ceil(d / 2g) tokens, chunk j sees (j + 1) c
 *     keys; at a fixed query length the cost model is affine in the keys, f(c, (j + 1) c) =
 *     f(c, c) + j (f(c, 2c) - f(c, c)), so the 2g chunks sum to 2g f(c, c) + g (2g - 1)
 *     (f(c, 2c) - f(c, c)), evenly over the g ranks (the mirrored pairs balance it): four cost
 *     evaluations per document and size. A block's rank time is then its documents' attention per
 *     rank, plus GEMMs, element-wise work and TP all-reduces of ceil(tokens / g) rows, plus the K/V
 *     all-gather and dK/dV reduce-scatter of its tokens over g ranks (cost_cp_comm_group_s).
 *  2. Every split of the K units into power-of-two groups - a multiset of sizes, laid out largest
 *     first, which aligns them (the sum of larger powers of two is a multiple of each smaller one;
 *     groups of one size are interchangeable for the cost model, so positions do not matter): there
 *     are b(K) of them, the binary partitions of K: 2, 4, 10, 36 for K = 2, 4, 8, 16.
 *  3. For each split, documents longest first, each to the group where it would finish earliest -
 *     longest-processing-time first on machines of different speeds (Q||Cmax) - among the groups
 *     with room (a group of g ranks holds at most g x the rank capacity: per_doc gives its ranks
 *     token counts within one of each other); of the groups of one size only the least loaded with
 *     room is a candidate (they differ in nothing else). The documents shorter than hybrid's best
 *     threshold are kept whole instead, each on the rank (of any group) that would finish earliest
 *     with room - hybrid's rule inside the split, which makes hybrid's own layout the split {CP};
 *     when hybrid keeps none whole, every document is sharded. A split is abandoned as soon as
 *     it cannot beat hybrid or the best split so far: when a group's new time reaches it, or when
 *     the mean over the ranks of the work so far plus the least work the remaining documents need
 *     (each on its cheapest group size) does - the slowest rank is at least the mean.
 *  4. The nested search (plan_groups_nest.c) from the best split, or from hybrid's layout when no
 *     split beat it; the layout it ends with is laid out exactly (ranges, segments) and predicted
 *     exactly.
 *  5. The eveners (plan_groups_even.c) on the nested search's result, laid out exactly; kept
 *     when faster than step 4's layout. plan_shard keeps the result only
 *     when it beats hybrid, per_seq and per_doc on the time the plan records and fits the capacity,
 *     so groups never predicts worse than hybrid.
 * Bound of steps 1-3: n documents, L = log2 K + 1 sizes, G <= K groups: 4 n (L + 1) attention
 * evaluations, then at most b(K) greedy passes of n (G comparisons + L group-time evaluations) or,
 * for whole documents, n CP comparisons; at K = 16 that is at most 36 n (16 + 5) steps, each a few
 * flops (step 3 evaluates the cost model's lines, not the model). The later stages' bounds are in
 * their files; all of it with hybrid's own candidates beside it: docs/benchmarks.md, measured planning time.
 */
#include <stdlib.h>

#include "engine/plan/plan_groups.h"
#include "util/array.h"

void line_cost_init(LineCost *c, const CostModel *cost)
{
    enum { X = 1 << 20 };
    c->lin = (cost_linear_fwd_s(cost, X) + cost_linear_bwd_s(cost, X)) / X;
    double t1 = cost_tp_comm_s(cost, 1), t2 = cost_tp_comm_s(cost, 2);
    c->tp_1 = t1;
    c->tp_flat = t2 <= 0;
    c->tp_a = t2 - t1;
    c->tp_b = 2 * t1 - t2;
    for (int j = 0; j < LINE_SIZES; j++) {
        double x1 = cost_cp_comm_group_s(cost, 1 << j, 1), x2 = cost_cp_comm_group_s(cost, 1 << j, 2);
        c->cp_a[j] = x2 - x1;
        c->cp_b[j] = 2 * x1 - x2;
    }
}

typedef struct Search {
    LineCost line;
    const PlanDoc *docs;
    const int64_t *order;
    int64_t n, capacity;
    int units, unit, levels, cp;
    int64_t threshold;        /* documents shorter than this go whole to one rank (phase 2) */
    int count[GROUPS_LEVELS]; /* the split being built: groups per level */
    double *rank_attn, *rank_comm, *rank_t; /* phase 2, per rank */
    int *heap;                /* phase 2: the ranks as a binary min-heap on (rank_t, rank) */
    double *rest;             /* rest[i]: a lower bound on the rank-seconds of documents i.. (order) */
    double limit;             /* abandon a split that cannot beat this (hybrid's time), 0: none */
    int64_t *rank_tok;
    const double *est;        /* est[k * (levels + 1) + j]: document k's attention per rank on level
                               * j; j = levels: whole on one rank */
    int32_t *assign, *best_assign; /* per document: its group, or -1 - r whole on rank r */
    Group best[GROUPS_UNITS];
    int n_best;
    double best_t; /* -1: no split yet */
    int tie_wins;  /* a split tried now is earlier in the order that breaks ties than the best, so
                    * one that ties it wins */
    int descending; /* the splits tried in the order that breaks ties (the tests: the same result) */
} Search;

static double attn_fb(const CostModel *cost, int64_t q, int64_t kv)
{
    double f, b;
    cost_attn_fb_s(cost, q, kv, &f, &b);
    return f + b;
}

/* Attention seconds per rank of a document of d tokens sharded per_doc over g ranks (step 1). */
double groups_attn_per_rank(const CostModel *cost, int64_t d, int g)
{
    if (g == 1)
        return attn_fb(cost, d, d);
    int64_t c = (d + 2 * g - 1) / (2 * g);
    double f1 = attn_fb(cost, c, c), f2 = attn_fb(cost, c, 2 * c);
    return (2.0 * g * f1 + g * (2.0 * g - 1) * (f2 - f1)) / g;
}

/* A rank of a group of 2^log2_size ranks with attn attention per rank and the group's tokens
 * sharded evenly: attention, lines (ceil(tokens / size) rows, by a shift: the search's hottest
 * line), the group's exchange. */
static double group_time(const LineCost *c, int log2_size, double attn, int64_t tokens)
{
    return line_rank_time(c, attn, (tokens + ((int64_t)1 << log2_size) - 1) >> log2_size) +
           2 * line_cp_comm(c, log2_size, tokens);
}

/* Binary min-heaps of indices into t (phase 1: a size's groups, phase 2: the ranks): a before b
 * when it has less time so far, the lower index on a tie - so a heap's top is what a scan in index
 * order for the least time would pick. */
static int heap_before(const double *t, int a, int b)
{
    return t[a] < t[b] || (t[a] == t[b] && a < b);
}

static void heap_sift_down(const double *t, int *h, int n, int i)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && heap_before(t, h[c + 1], h[c]))
            c++;
        if (!heap_before(t, h[c], h[i]))
            return;
        int tmp = h[c];
        h[c] = h[i];
        h[i] = tmp;
        i = c;
    }
}

/* The heap of indices first .. first + n - 1. */
static void heap_build(const double *t, int *h, int first, int n)
{
    for (int i = 0; i < n; i++)
        h[i] = first + i;
    for (int i = n / 2 - 1; i >= 0; i--)
        heap_sift_down(t, h, n, i);
}

/* After the time of one index of the heap rose: the top's, sifted down; any other's (picked by a
 * scan when the top had no room), the heap rebuilt. */
static void heap_rose(const double *t, int *h, int first, int n, int top)
{
    if (top)
        heap_sift_down(t, h, n, 0);
    else
        heap_build(t, h, first, n);
}

/* x reaches the limit: the split cannot beat the best so far (or hybrid, limit 0: none). */
static int reaches(const Search *s, double x, double limit)
{
    return limit > 0 && (x > limit || (x == limit && !s->tie_wins));
}

/* Step 3 for the split in s->count: the predicted time of its slowest group, or -1 when a document
 * fits in no group or the split cannot beat the best so far. */
static double assign_split(Search *s, Group *g, int *n_groups)
{
    int ng = 0, first = 0;
    for (int j = s->levels - 1; j >= 0; j--)
        for (int c = 0; c < s->count[j]; c++) {
            int size = s->unit << j, lg = 0;
            while ((1 << lg) < size)
                lg++;
            g[ng++] = (Group){first, size, j, lg, 0, 0, 0};
            first += size;
        }
    *n_groups = ng;
    /* Groups of one size (a class; contiguous in g) differ only in their load: of each size, the
     * one with the least time so far that has room is the candidate - its class heap's top, unless
     * that one has no room, when the class is scanned in order. */
    double gt[GROUPS_UNITS]; /* g[a].t */
    int heap[GROUPS_UNITS], class_first[GROUPS_LEVELS], class_n[GROUPS_LEVELS], class_of[GROUPS_UNITS], n_class = 0;
    for (int a = 0; a < ng; a++) {
        gt[a] = 0;
        if (a == 0 || g[a].size != g[a - 1].size) {
            class_first[n_class] = a;
            class_n[n_class++] = 0;
        }
        class_of[a] = n_class - 1;
        class_n[n_class - 1]++;
    }
    for (int c = 0; c < n_class; c++)
        heap_build(gt, heap + class_first[c], class_first[c], class_n[c]);
    double worst = 0, work = 0; /* work: rank-seconds so far, the sum over ranks of their times */
    double limit = s->best_t >= 0 ? s->best_t : s->limit;
    int64_t i = 0;
    for (; i < s->n && s->docs[s->order[i]].len >= s->threshold; i++) {
        int64_t k = s->order[i], d = s->docs[k].len;
        int pick = -1, pick_top = 0;
        double pick_t = 0;
        for (int c = 0; c < n_class; c++) {
            int lead = heap[class_first[c]], top = 1;
            if (g[lead].tokens + d > (int64_t)g[lead].size * s->capacity) {
                lead = -1;
                top = 0;
                for (int b = class_first[c]; b < class_first[c] + class_n[c]; b++)
                    if (g[b].tokens + d <= (int64_t)g[b].size * s->capacity && (lead < 0 || gt[b] < gt[lead]))
                        lead = b;
            }
            if (lead < 0)
                continue;
            double t = group_time(&s->line, g[lead].log2_size,
                                  g[lead].attn + s->est[k * (s->levels + 1) + g[lead].level], g[lead].tokens + d);
            if (pick < 0 || t < pick_t) {
                pick = lead;
                pick_t = t;
                pick_top = top;
            }
        }
        if (pick < 0 || reaches(s, pick_t, limit))
            return -1;
        g[pick].attn += s->est[k * (s->levels + 1) + g[pick].level];
        g[pick].tokens += d;
        work += (pick_t - g[pick].t) * g[pick].size;
        g[pick].t = gt[pick] = pick_t;
        int c = class_of[pick];
        if (class_n[c] > 1) /* a class of one group is its own heap */
            heap_rose(gt, heap + class_first[c], class_first[c], class_n[c], pick_top);
        /* The slowest rank is at least the mean: the work so far and the least the rest needs. */
        if (reaches(s, (work + s->rest[i + 1]) / s->cp, limit))
            return -1;
        worst = pick_t > worst ? pick_t : worst;
        s->assign[k] = pick;
    }
    if (i == s->n)
        return worst;
    /* Phase 2: the shorter documents whole, longest first, each on the rank that would finish
     * earliest with room (hybrid's rule, inside the split: a rank holds its group's share and its
     * whole documents, and exchanges its group's K/V). */
    for (int a = 0; a < ng; a++)
        for (int r = g[a].first; r < g[a].first + g[a].size; r++) {
            s->rank_attn[r] = g[a].attn;
            s->rank_tok[r] = (g[a].tokens + g[a].size - 1) / g[a].size;
            s->rank_comm[r] = 2 * line_cp_comm(&s->line, g[a].log2_size, g[a].tokens);
            s->rank_t[r] = g[a].t;
        }
    heap_build(s->rank_t, s->heap, 0, s->cp);
    for (; i < s->n; i++) {
        int64_t k = s->order[i], d = s->docs[k].len;
        double a1 = s->est[k * (s->levels + 1) + s->levels];
        /* The same document adds the same time to any rank (its attention, and rows on a line):
         * the rank that finishes it earliest is the one with the least time so far - the heap's
         * top, unless that one has no room, when the ranks are scanned in order. */
        int pick = s->heap[0], top = 1;
        if (s->rank_tok[pick] + d > s->capacity) {
            pick = -1;
            top = 0;
            for (int r = 0; r < s->cp; r++)
                if (s->rank_tok[r] + d <= s->capacity && (pick < 0 || s->rank_t[r] < s->rank_t[pick]))
                    pick = r;
        }
        if (pick < 0)
            return -1;
        double pick_t = line_rank_time(&s->line, s->rank_attn[pick] + a1, s->rank_tok[pick] + d) + s->rank_comm[pick];
        if (reaches(s, pick_t, limit))
            return -1;
        s->rank_attn[pick] += a1;
        s->rank_tok[pick] += d;
        work += pick_t - s->rank_t[pick];
        s->rank_t[pick] = pick_t;
        heap_rose(s->rank_t, s->heap, 0, s->cp, top);
        if (reaches(s, (work + s->rest[i + 1]) / s->cp, limit))
            return -1;
        worst = pick_t > worst ? pick_t : worst;
        s->assign[k] = -1 - pick;
    }
    return worst;
}

/* The split in s->count, kept when it beats the best so far. */
static void try_split(Search *s)
{
    Group g[GROUPS_UNITS];
    int ng;
    double t = assign_split(s, g, &ng);
    if (t >= 0 && (s->best_t < 0 || t < s->best_t || (s->tie_wins && t == s->best_t))) {
        s->best_t = t;
        s->tie_wins = !s->descending;
        for (int a = 0; a < ng; a++)
            s->best[a] = g[a];
        s->n_best = ng;
        int32_t *tmp = s->assign;
        s->assign = s->best_assign;
        s->best_assign = tmp;
    }
}

/* Step 2: every count of groups of level `level` and below that fills `units` units. Ties between
 * splits go to the one with the most groups of the largest size, then of the next size, and so on
 * (a lexicographic order on the counts, largest size first); the search tries them the other way
 * round, most small groups first - the best splits on the real lists hold groups of 1 to 4 ranks of
 * 16, so the bound is tight early and most splits are abandoned after a few documents - and breaks
 * ties by that order (tie_wins), so the result does not depend on the order tried. */
static void enumerate(Search *s, int level, int units)
{
    if (level == 0) {
        s->count[0] = units;
        try_split(s);
        return;
    }
    for (int i = 0; i <= units >> level; i++) {
        s->count[level] = s->descending ? (units >> level) - i : i;
        enumerate(s, level - 1, units - (s->count[level] << level));
    }
}

/* The exact layout of the nested blocks in s: every document on its block (node), per_doc or whole,
 * in micro-batch order; with eveners (even[k] > 0), those after them (plan_groups_even.c). */
static int lay_out(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t n, const int32_t *node,
                   const int32_t *even, const EvenCut *ev, int n_ev)
{
    int cp = s->cp;
    if (shard_reset(s, n) != 0)
        return -1;
    for (int64_t k = 0; k < n; k++) {
        if (even && even[k] > 0)
            continue;
        int v = node[k], size = plan_block_size(cp, v);
        int rc = size == 1 ? shard_whole(s, cost, docs, k, v - cp)
                           : shard_per_doc_group(s, cost, docs, k, plan_block_first(cp, v), size);
        if (rc != 0)
            return -1;
    }
    return n_ev > 0 ? groups_even_lay_out(s, cost, docs, ev, n_ev) : 0;
}

int plan_groups_best(Groups *gr, const CostModel *cost, const PlanDoc *docs, int64_t n, const Hybrid *hyb,
                     int64_t capacity, double limit, double *t)
{
    Shard *out = &gr->layout;
    int cp = out->cp;
    Search s = {.docs = docs, .order = hyb->order, .n = n, .capacity = capacity, .best_t = -1,
                .limit = limit > 0 ? limit : 0, .descending = gr->splits_descending};
    line_cost_init(&s.line, cost);
    s.units = cp < GROUPS_UNITS ? cp : GROUPS_UNITS;
    s.unit = cp / s.units;
    while ((1 << s.levels) <= s.units)
        s.levels++;
    /* est, then rest (n + 1). */
    double *est = array_grow(gr->est, &gr->cap_est, n * (s.levels + 1) + n + 2, sizeof *est);
    if (!est)
        return -1;
    gr->est = est;
    int32_t *assign = array_grow(gr->assign, &gr->cap_assign, n + 1, sizeof *assign);
    if (!assign)
        return -1;
    gr->assign = assign;
    int32_t *best_assign = array_grow(gr->best_assign, &gr->cap_best_assign, n + 1, sizeof *best_assign);
    if (!best_assign)
        return -1;
    gr->best_assign = best_assign;
    for (int64_t k = 0; k < n; k++) {
        for (int j = 0; j < s.levels; j++)
            est[k * (s.levels + 1) + j] = groups_attn_per_rank(cost, docs[k].len, s.unit << j);
        est[k * (s.levels + 1) + s.levels] = groups_attn_per_rank(cost, docs[k].len, 1);
    }
    /* A document's least rank-seconds: its attention on the size where that is least (per rank
     * times ranks), and its GEMM and element-wise work, which no split changes. */
    double *rest = est + n * (s.levels + 1);
    rest[n] = 0;
    for (int64_t i = n - 1; i >= 0; i--) {
        int64_t k = hyb->order[i];
        double w = est[k * (s.levels + 1) + s.levels];
        for (int j = 0; j < s.levels; j++) {
            double x = est[k * (s.levels + 1) + j] * (s.unit << j);
            w = x < w ? x : w;
        }
        rest[i] = rest[i + 1] + w + s.line.lin * (double)docs[k].len;
    }
    s.rest = rest;
    double rank_attn[1024], rank_comm[1024], rank_t[1024];
    int heap[1024];
    int64_t rank_tok[1024];
    s.cp = cp;
    s.rank_attn = rank_attn;
    s.rank_comm = rank_comm;
    s.rank_tok = rank_tok;
    s.rank_t = rank_t;
    s.heap = heap;
    s.est = est;
    s.assign = gr->assign;
    s.best_assign = gr->best_assign;
    /* Every split, the documents shorter than hybrid's best threshold whole (hybrid's layout is
     * the split {cp} with that threshold), or every document sharded when hybrid kept none whole.
     * No state from other micro-batches: a micro-batch's layout depends on its documents alone, so
     * a step's micro-batches can be planned in any order, in parallel (plan_shard_step). */
    s.threshold = hyb->threshold > 0 ? hyb->threshold : 0;
    enumerate(&s, s.levels - 1, s.units);
    /* The search swaps its two assignment arrays; give both back to the scratch. */
    gr->assign = s.assign;
    gr->best_assign = s.best_assign;
    *t = -1;
    /* The nested search (plan_groups_nest.c) from the best split - or from hybrid's own layout
     * (the split {cp} with hybrid's documents whole where it put them) when no split beat hybrid:
     * every document on its group's block, or on its rank's when whole. */
    int32_t *node = s.best_assign;
    if (s.best_t < 0) {
        if (hyb->threshold <= 0)
            return 0;
        for (int64_t k = 0; k < n; k++)
            node[k] = hyb->layout.doc_rank[k] < 0 ? 1 : cp + hyb->layout.doc_rank[k];
    } else {
        for (int64_t k = 0; k < n; k++) {
            int a = node[k];
            node[k] = a < 0 ? cp - 1 - a : plan_block_of(cp, s.best[a].first, s.best[a].size);
        }
    }
    /* The attention per rank on every block size: est when a unit is one rank, else sampled here. */
    int depth = 0;
    while ((1 << depth) < cp)
        depth++;
    const double *nest_est = est;
    int stride = s.levels + 1;
    if (s.unit > 1) {
        double *e = array_grow(gr->nest_est, &gr->cap_nest_est, n * (depth + 1) + 1, sizeof *e);
        if (!e)
            return -1;
        gr->nest_est = e;
        for (int64_t k = 0; k < n; k++)
            for (int j = 0; j <= depth; j++)
                e[k * (depth + 1) + j] = groups_attn_per_rank(cost, docs[k].len, 1 << j);
        nest_est = e;
        stride = depth + 1;
    }
    int64_t tok[2048], rows[1024];
    double comm_r[1024];
    Nest x = {.line = &s.line, .docs = docs, .est = nest_est, .stride = stride, .cp = cp, .depth = depth, .n = n,
              .capacity = capacity, .node = node, .tok = tok, .attn_r = rank_attn, .comm_r = comm_r, .rows = rows};
    if (groups_nest_start(&x) < 0)
        return 0;
    groups_nest(&x);
    double after = groups_nest_worst(&x);
    /* Step 4: the exact layout, documents in micro-batch order (per_doc's leftover counters run in
     * that order, as in the other modes) - from hybrid's layout, only when the search ended faster
     * than hybrid. */
    if ((s.best_t >= 0 || after < limit) && lay_out(out, cost, docs, n, node, NULL, NULL, 0) != 0)
        return -1;
    if ((s.best_t >= 0 || after < limit) && shard_fits(out, capacity))
        *t = shard_time(out, cost);
    /* The eveners (plan_groups_even.c), on the lines (a document's block in even_node, 0: none),
     * then laid out exactly: kept when faster than without. */
    int32_t *even_node = array_grow(gr->even_node, &gr->cap_even_node, n + 1, sizeof *even_node);
    double *even_rows = array_grow(gr->even_rows, &gr->cap_even_rows, (int64_t)EVEN_MAX * cp, sizeof *even_rows);
    gr->even_node = even_node ? even_node : gr->even_node;
    gr->even_rows = even_rows ? even_rows : gr->even_rows;
    if (!even_node || !even_rows)
        return -1;
    for (int64_t k = 0; k < n; k++)
        even_node[k] = 0;
    EvenCut ev[EVEN_MAX];
    int n_even = groups_even_pick(&x, even_node, even_rows, ev);
    if (n_even > 0 && (s.best_t >= 0 || groups_nest_worst(&x) < limit)) {
        Shard *alt = &gr->alt;
        if (lay_out(alt, cost, docs, n, node, even_node, ev, n_even) != 0)
            return -1;
        double t_alt = shard_fits(alt, capacity) ? shard_time(alt, cost) : -1;
        if (t_alt >= 0 && (*t < 0 || t_alt < *t)) {
            Shard tmp = *out;
            *out = *alt;
            *alt = tmp;
            *t = t_alt;
        }
    }
    return 0;
}

void plan_groups_free(Groups *g)
{
    shard_free(&g->layout);
    shard_free(&g->alt);
    free(g->est);
    free(g->assign);
    free(g->best_assign);
    free(g->nest_est);
    free(g->even_node);
    free(g->even_rows);
}
