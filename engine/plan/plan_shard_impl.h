/*
 * engine/plan/plan_shard_impl.h - plan_shard's candidate layouts, shared with plan_groups.c.
 *
 * A Shard is one candidate layout of a micro-batch over the CP ranks, built document by document:
 * ranges and segments per rank, and what the cost model needs to predict it (attention seconds and
 * tokens per rank, the sharded tokens of every rank's exchange group).
 */
#ifndef WLB_ENGINE_PLAN_SHARD_IMPL_H
#define WLB_ENGINE_PLAN_SHARD_IMPL_H

#include <stdint.h>

#include "engine/plan/cost.h"
#include "engine/plan/plan.h"

enum { SHARD_DEPTHS = 11 }; /* blocks of 1024 ranks down to 1 */

typedef struct Shard {
    int cp;
    PlanRange *ranges;
    PlanSegment *segs;
    int64_t n_ranges, cap_ranges, n_segs, cap_segs;
    int64_t *last_range;   /* per rank: its last range (to merge contiguous ones), -1 none */
    int64_t *tokens;       /* per rank */
    double *attn;          /* per rank: attention seconds, forward + backward */
    double *attn_fwd, *attn_bwd;
    int64_t *blk_sharded;  /* per block (below): the tokens of the documents sharded over it, what its
                            * K/V exchange moves */
    int32_t *uneven;       /* per block: the documents cut unevenly over it (plan_groups_cut.c) */
    int64_t *own;          /* per rank and tree depth (SHARD_DEPTHS): its rows of the documents
                            * sharded over its block at that depth */
    int *counter;          /* per block: per_doc's leftover-token counter */
    int64_t sharded;       /* tokens in any K/V all-gather */
    int32_t *doc_rank;     /* per document: the rank holding it whole, or -1 when sharded */
    int32_t *doc_first, *doc_size; /* per document: its group */
    int64_t cap_docs, cap_doc_first, cap_doc_size;
} Shard;

enum { SHARD_SEQ, SHARD_DOC, SHARD_BEST, SHARD_GROUPS, SHARD_EVEN, SHARD_N }; /* EVEN: groups with eveners */

typedef struct ShardScratch {
    Shard cand[SHARD_N];
    int64_t *order;        /* the documents, longest first */
    int64_t cap_order;
    int64_t hybrid_threshold; /* hybrid's best: documents from this length sharded (-1: none) */
    double *hyb_whole, *hyb_lb; /* per document (hybrid_doc_bounds) */
    int64_t cap_hyb_whole, cap_hyb_lb;
    double *est;           /* plan_groups: per document and group size, predicted seconds */
    int64_t cap_est;
    int32_t *assign, *best_assign; /* plan_groups: per document, its group */
    double *nest_est;      /* plan_groups: per document and size 2^j, when cp > 16 */
    int32_t *even_node;    /* plan_groups: per document, its block as an evener (0: none) */
    double *even_rows;     /* plan_groups: the eveners' rows per rank */
    int64_t cap_nest_est, cap_even_node, cap_even_rows;
    int64_t cap_assign, cap_best_assign;
    int splits_descending;  /* plan_groups: try the splits in the order that breaks their ties, not
                             * the reverse (for the tests: the layout must be the same) */
} ShardScratch;

/* Empties s for a micro-batch of n_docs documents: every rank in the one group of all CP ranks. */
int shard_reset(Shard *s, int64_t n_docs);
/* Document k whole on rank r. */
int shard_whole(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int r);
/* Document k per_doc over CP ranks first .. first + g - 1, an aligned block (2 g chunks, chunks i
 * and 2 g - 1 - i on rank first + i); its tokens join the block's exchange. */
int shard_per_doc_group(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g);
/* Document k over the aligned block first .. first + g - 1 in 2 g chunks of size[c] tokens (0:
 * none), in document order, chunks i and 2 g - 1 - i on rank first + i (per_doc's placement, with
 * any sizes); its tokens join the block's exchange. */
int shard_chunks(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g,
                 const int64_t *size);
/* Rows [start, start + len) on rank r, their queries against keys [kv_start, start + len). The
 * caller keeps the document's group (doc_*) and exchange counters. */
int shard_piece(Shard *s, const CostModel *cost, int r, int64_t start, int64_t len, int64_t kv_start);
/* Lays out micro-batches list[0 .. n - 1] of p (n at most PLAN_MAX_THREADS) at once, on up to
 * `threads` threads, list[j] in plan scratch j: chosen[j] is its layout (mode as plan_shard's; each
 * micro-batch's mode set), to be copied into the plan with shard_commit before the next call. Reads
 * only their documents. -1 out of memory. */
int plan_shard_lay_out(StepPlan *p, const int64_t *list, int n, CpSharding mode, const CostModel *cost,
                       int64_t rank_capacity, int threads, const Shard **chosen);
/* Copies candidate s into the plan as micro-batch mb's ranks, ranges and segments (rank by rank),
 * its documents' groups and its per-layer times. */
int shard_commit(StepPlan *p, PlanMicroBatch *mb, const Shard *s, const CostModel *cost);
/* Allocates s's per-rank and per-block arrays for cp ranks (kept across calls). */
int shard_alloc(Shard *s, int cp);
void shard_free(Shard *s);
/* per_doc's chunk sizes of a document of len tokens over g ranks (2 g chunks), the leftover tokens
 * placed by the running counter. */
void shard_per_doc_chunks(int g, int64_t len, int *counter, int64_t *size);
/* One layer forward + backward of a rank with this attention time and tokens, exchange excluded. */
double shard_rank_time_with(const CostModel *cost, double attn, int64_t tokens);
/* The tokens block v's exchange is priced at: its sharded tokens; with a document cut unevenly, as
 * many as make (g - 1) / g of them what its rank holding the fewest receives (an all-gather ends
 * when that rank has every other rank's rows). */
int64_t shard_block_exchange_tokens(const Shard *s, int v);
/* Rank r's K/V exchange in one direction: the all-gathers of the blocks above it that hold sharded
 * documents, one after another. */
double shard_rank_cp_comm(const Shard *s, const CostModel *cost, int r);
/* The slowest rank's seconds per layer, forward + backward, its exchanges included. */
double shard_time(const Shard *s, const CostModel *cost);
/* The micro-batch's seconds per layer as the plan records them: the slowest rank's forward and the
 * slowest rank's backward (what the pipeline schedule takes). */
void shard_mb_times(const Shard *s, const CostModel *cost, double *fwd, double *bwd);
/* 1 when no rank holds more than capacity tokens. */
int shard_fits(const Shard *s, int64_t capacity);

/* hybrid's candidate with this threshold (plan_hybrid.c): shard_time of the layout shard_hybrid
 * would make, without making it; -1 when it breaks the capacity or cannot be faster than bound
 * (bound > 0). order: the documents longest first; NULL with threshold 0 (every document sharded:
 * per_doc's layout). */
double hybrid_predict(const CostModel *cost, const PlanDoc *docs, int64_t n, const int64_t *order, int cp,
                      int64_t threshold, int64_t capacity, double bound, const double *whole);
/* Per document: whole[k], its attention seconds whole (forward + backward, the figure a layout
 * adds), and shard_lb[k], a lower bound on its attention summed over the ranks when sharded per_doc
 * over cp. whole may then be passed to hybrid_predict. */
void hybrid_doc_bounds(const CostModel *cost, const PlanDoc *docs, int64_t n, int cp, double *whole, double *shard_lb);
/* A lower bound on hybrid_predict's figure for this threshold, from those (O(n), no layout). */
double hybrid_lower_bound(const CostModel *cost, const PlanDoc *docs, int64_t n, int cp, const double *whole,
                          const double *shard_lb, int64_t threshold);

/* groups (plan_groups.c): the best layout over aligned power-of-two groups of the CP ranks (cp a
 * power of two), in sc->cand[SHARD_GROUPS], its time in *t (-1: none within capacity, or none
 * predicted faster than limit, when limit > 0). sc->order must hold the documents longest first. */
int plan_groups_best(ShardScratch *sc, const CostModel *cost, const PlanDoc *docs, int64_t n, int64_t capacity,
                     double limit, double *t);
/* The groups search's rank time (its sampled lines): shard_rank_time_with(attn, rows) plus the
 * exchange of `tokens` over `size` ranks, both directions. For the tests. */
double plan_groups_line_check(const CostModel *cost, int size, double attn, int64_t rows, int64_t tokens);

#endif
