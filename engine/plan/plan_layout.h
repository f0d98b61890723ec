/*
 * engine/plan/plan_layout.h - one candidate layout of a micro-batch over its CP ranks (a Shard), built
 * document by document, and what the cost model predicts of it.
 *
 * A Shard holds per rank its token ranges and attention segments (plan_types.h's coordinates) and
 * what the cost model needs to predict it: attention seconds and tokens per rank, and the sharded
 * tokens of every block of CP ranks that exchanges K/V (the binary tree of blocks, plan_types.h).
 * The sharding modes (plan_shard.c, plan_hybrid.c, plan_groups*.c) build candidates with these
 * primitives, compare them on shard_time, and copy the one they keep into the plan (shard_commit).
 */
#ifndef WLB_ENGINE_PLAN_LAYOUT_H
#define WLB_ENGINE_PLAN_LAYOUT_H

#include <stdint.h>

#include "engine/plan/cost.h"
#include "engine/plan/plan_types.h"

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
    double *whole_fwd, *whole_bwd; /* per rank: the attention of the documents it holds whole (on it
                            * alone: nothing exchanged), what its K/V exchange runs beside */
    int64_t *blk_sharded;  /* per block (below): the tokens of the documents sharded over it, what its
                            * K/V exchange moves */
    int32_t *uneven;       /* per block: the documents cut unevenly over it (groups' eveners) */
    int64_t *own;          /* per rank and tree depth (SHARD_DEPTHS): its rows of the documents
                            * sharded over its block at that depth */
    int *counter;          /* per block: per_doc's leftover-token counter */
    int64_t sharded;       /* tokens in any K/V all-gather */
    int32_t *doc_rank;     /* per document: the rank holding it whole, or -1 when sharded */
    int32_t *doc_first, *doc_size; /* per document: its group */
    int64_t cap_docs, cap_doc_first, cap_doc_size;
} Shard;

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
/* Document k per_doc over the whole CP group. */
int shard_per_doc(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k);
/* The whole micro-batch of total tokens per_seq (Llama 3): 2 CP equal chunks, rank i holding chunks
 * i and 2 CP - 1 - i; a document crossing chunks gives one segment per chunk. */
int shard_per_seq(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t n_docs, int64_t total);
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
/* The slowest rank's seconds per layer, forward + backward, its exchanges included, all of them
 * exposed: what the sharding modes compare candidates on (their bounds and predictions are built
 * on it); the plan records what hides beside the whole documents' attention (shard_commit). */
double shard_time(const Shard *s, const CostModel *cost);
/* The micro-batch's seconds per layer as the plan records them: the slowest rank's forward and the
 * slowest rank's backward (what the pipeline schedule takes), the K/V exchange priced beside the
 * attention it runs beside (cost_cp_beside). */
void shard_mb_times(const Shard *s, const CostModel *cost, double *fwd, double *bwd);
/* A rank's comm_fwd_s, comm_bwd_s and cp_hidden_*_s from its tokens, attention and K/V exchange
 * (cp_comm_s, n_cp_pieces, attn_*_s, whole_*_s): the TP exchanges (cost_tp_comm_s) and the exchange
 * beside the whole documents' attention and, piece by piece, the sharded ones' (cost_cp_beside), as
 * cost prices them. */
void plan_rank_price(PlanRank *pr, const CostModel *cost);
/* Every micro-batch's ranks priced (plan_rank_price) and its fwd_s, bwd_s again: a plan made with
 * one cost model (the planner's) priced with another (parallel.overlap as configured). */
void plan_price(StepPlan *p, const CostModel *cost);
/* 1 when no rank holds more than capacity tokens. */
int shard_fits(const Shard *s, int64_t capacity);

#endif
