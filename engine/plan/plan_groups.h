/*
 * engine/plan/plan_groups.h - balance.cp_sharding: groups (plan_groups.c says what it does): its
 * entry, and the cost lines, groups and nested-block state its split (plan_groups.c), nested search
 * (plan_groups_nest.c) and eveners (plan_groups_even.c) share.
 */
#ifndef WLB_ENGINE_PLAN_GROUPS_H
#define WLB_ENGINE_PLAN_GROUPS_H

#include "engine/plan/plan_hybrid.h"

/* groups' working memory and result for one micro-batch (kept across calls). */
typedef struct Groups {
    Shard layout;          /* the best layout found */
    Shard alt;             /* the layout with eveners, while it is tried */
    double *est;           /* per document and group size, predicted seconds */
    int32_t *assign, *best_assign; /* per document, its group */
    double *nest_est;      /* per document and size 2^j, when cp > 16 */
    int32_t *even_node;    /* per document, its block as an evener (0: none) */
    double *even_rows;     /* the eveners' rows per rank */
    int64_t cap_est, cap_assign, cap_best_assign, cap_nest_est, cap_even_node, cap_even_rows;
    int splits_descending; /* try the splits in the order that breaks their ties, not the reverse
                            * (for the tests: the layout must be the same) */
} Groups;

/* The best layout over aligned power-of-two groups of the CP ranks (cp a power of two), in
 * g->layout (allocated for the CP, as g->alt: shard_alloc), its time in *t (-1: none within
 * capacity, or none predicted faster than limit, when limit > 0). hyb: hybrid_best's result for
 * the same documents (its order, threshold and layout). -1 out of memory. */
int plan_groups_best(Groups *g, const CostModel *cost, const PlanDoc *docs, int64_t n, const Hybrid *hyb,
                     int64_t capacity, double limit, double *t);
void plan_groups_free(Groups *g);

enum { GROUPS_UNITS = 16, GROUPS_LEVELS = 5 }; /* at most 16 units: sizes u, 2u, 4u, 8u, 16u */
enum { LINE_SIZES = 11 };                      /* group sizes 2^0 .. 2^10: any CP up to 1024 */

/* The search evaluates rank times tens of thousands of times per micro-batch, so it takes the
 * cost model's non-attention terms as the lines they are, sampled once: GEMMs and element-wise
 * work are proportional to the rows, lin x rows; a TP all-reduce pair is 2 (A x + latency) less the
 * o G x that runs under the GEMMs, clipped at 0: max(0, a x + b), with a = tp(2) - tp(1) and
 * b = 2 tp(1) - tp(2) when tp(2) > 0 (else it is 0 from 2 rows on); an exchange over g ranks is
 * c_g x + latency for x > 0 tokens. Tested against the cost model (test_plan_shard). */
typedef struct LineCost {
    double lin, tp_a, tp_b, tp_1;
    int tp_flat;                  /* tp(2) == 0: no TP traffic shows from 2 rows on */
    double cp_a[LINE_SIZES], cp_b[LINE_SIZES]; /* per group size 2^j */
} LineCost;

/* Samples the cost model's lines (plan_groups.c). */
void line_cost_init(LineCost *c, const CostModel *cost);
/* A document of d tokens sharded per_doc over g ranks: its attention seconds per rank (plan_groups.c). */
double groups_attn_per_rank(const CostModel *cost, int64_t d, int g);

/* shard_rank_time_with(attn, rows), from the lines. */
static inline double line_rank_time(const LineCost *c, double attn, int64_t rows)
{
    double x = (double)rows, tp = rows <= 0 ? 0 : rows == 1 ? c->tp_1 : c->tp_flat ? 0 : c->tp_a * x + c->tp_b;
    return attn + c->lin * x + 2 * (tp > 0 ? tp : 0);
}

/* The least line_rank_time's TP term changes by when a rank's rows change by dr, whatever its rows
 * (a lower bound for the searches' pruning): with the term a x + b (b >= 0, x >= 1 rows; 0 rows
 * cost nothing) 2 a dr growing and 2 (a dr - b) shrinking (the last rows take the intercept with
 * them); clipped at 0 (b < 0) 0 growing and 2 a dr shrinking; flat, at most the one row's. */
static inline double line_tp_least(const LineCost *c, int64_t dr)
{
    if (c->tp_flat)
        return dr == 0 ? 0 : -2 * c->tp_1;
    double a = c->tp_a, b = c->tp_b, x = (double)dr;
    if (b >= 0)
        return 2 * (dr >= 0 ? a * x : a * x - b);
    return dr >= 0 ? 0 : 2 * a * x;
}

/* cost_cp_comm_group_s(2^j, tokens), from the lines. */
static inline double line_cp_comm(const LineCost *c, int j, int64_t tokens)
{
    return tokens > 0 && j > 0 ? c->cp_a[j] * (double)tokens + c->cp_b[j] : 0;
}

typedef struct Group {
    int first, size, level, log2_size;
    double attn;    /* predicted attention seconds per rank, forward + backward */
    int64_t tokens; /* of the group's documents */
    double t;       /* predicted seconds per layer */
} Group;

/* The nested-block search's state (plan_groups_nest.c): every document on a block of the tree over
 * the ranks (plan_types.h; cp a power of two), and per rank the sums of the blocks above it. */
typedef struct Nest {
    const LineCost *line;
    const PlanDoc *docs;
    const double *est;   /* est[k * stride + j]: document k's attention per rank over 2^j ranks */
    int stride, cp, depth; /* cp = 2^depth */
    int64_t n, capacity;
    int32_t *node;       /* per document: its block (cp + r: whole on rank r) */
    int64_t *tok;        /* per block (2 cp): its documents' tokens */
    double *attn_r, *comm_r; /* per rank: attention per rank of the blocks above it; their exchanges */
    int64_t *rows;       /* per rank */
    int64_t max_moves;   /* the most moves one groups_nest makes; 0: 2 n + cp */
    int plateau;         /* moves off a rank other than the slowest still allowed */
    int64_t moves;       /* moves made */
} Nest;

/* groups_nest_start fills the sums from x->node and returns the slowest rank's time, or -1 when a
 * rank is over the capacity; groups_nest moves documents between blocks while the slowest rank can
 * be lowered; groups_nest_worst is the slowest rank's time. */
double groups_nest_start(Nest *x);
void groups_nest(Nest *x);
double groups_nest_worst(const Nest *x);

/* An evener as picked on the lines: document k cut over block w, rows[i] rows on w's rank i. */
typedef struct EvenCut {
    int64_t k;
    int w;
    const double *rows;
} EvenCut;

/* The eveners (plan_groups_even.c), on the lines: even[k] gets the block document k is cut over
 * (0: not an evener), out[] the eveners in the order they were picked; x's sums include them.
 * scratch: EVEN_MAX x cp doubles. Returns their number. */
enum { EVEN_MAX = 16 };
int groups_even_pick(Nest *x, int32_t *even, double *scratch, EvenCut *out);
/* The eveners' layout, after every other document is laid out in s: each cut over its block with
 * the rows the lines gave, rounded. */
int groups_even_lay_out(Shard *s, const CostModel *cost, const PlanDoc *docs, const EvenCut *ev, int n_ev);
/* What block v gaining dtok tokens (losing: dtok < 0) and da attention per rank does to each of its
 * ranks [first, first + size) on the lines. Inline with the helpers below: the nested search and
 * the eveners call them in their innermost loops. */
typedef struct NestDelta {
    double attn, comm; /* both directions of the block's exchange */
    int64_t rows;
    int first, size;
} NestDelta;

/* Rows each rank of block v holds of its documents: per_doc gives ceil(tokens / size) at most. */
static inline int64_t nest_node_rows(const Nest *x, int v, int64_t tok)
{
    int lg = x->depth - plan_block_depth(v); /* size 2^lg: a shift where tok >= 0 (always, in a valid state) */
    return tok >= 0 ? (tok + ((int64_t)1 << lg) - 1) >> lg : (tok + ((int64_t)1 << lg) - 1) / ((int64_t)1 << lg);
}

/* Both directions of block v's exchange of tok tokens (0 for a rank alone). */
static inline double nest_node_comm(const Nest *x, int v, int64_t tok)
{
    return 2 * line_cp_comm(x->line, x->depth - plan_block_depth(v), tok);
}

static inline NestDelta nest_delta(const Nest *x, int v, int64_t dtok, double da)
{
    int64_t tok = x->tok[v] + dtok;
    return (NestDelta){da, nest_node_comm(x, v, tok) - nest_node_comm(x, v, x->tok[v]),
                       nest_node_rows(x, v, tok) - nest_node_rows(x, v, x->tok[v]), plan_block_first(x->cp, v),
                       plan_block_size(x->cp, v)};
}

/* Document k's attention per rank sharded over block v (whole when v is a rank). */
static inline double nest_attn(const Nest *x, int64_t k, int v)
{
    return x->est[k * x->stride + (x->depth - plan_block_depth(v))];
}
/* Document k onto (sign +1) or off (-1) block v, in the nested search's sums. */
void nest_move(Nest *x, int64_t k, int v, int sign);

#endif
