/*
 * engine/plan/plan_types.h - the planner's data types: a step's plan (StepPlan: its micro-batches,
 * the document pieces in them, every CP rank's token ranges and attention segments, and what each
 * is predicted to cost) and the planner's state carried from step to step (Planner). Every pass of
 * the planner (plan.h has their order) reads and writes these.
 *
 * Coordinates. A micro-batch is its pieces laid end to end: token t of the micro-batch is token
 * t - doc.start of its piece, whose RoPE position is doc.offset + (t - doc.start). A CP rank holds
 * some ranges [start, start + len) of the micro-batch, in the order listed (its local layout), and
 * computes attention segments: queries [q_start, q_start + q_len) against keys and values
 * [kv_start, q_start + q_len) of the micro-batch, document-causal: query q_start + i sees keys up to
 * q_start + i. A segment's keys are all in one document. Keys of a sharded document come from the
 * CP all-gather; a whole (unsharded) document lies entirely on the rank that computes it.
 */
#ifndef WLB_ENGINE_PLAN_TYPES_H
#define WLB_ENGINE_PLAN_TYPES_H

#include <stdint.h>

#include "config/config.h"
#include "data/data_stream.h"
#include "engine/plan/cost.h"
#include "util/error.h"

enum { PLAN_PAD_SOURCE = UINT32_MAX }; /* a piece of padding tokens (no data, no loss) */

/* A piece of a document, as queued or as placed in a micro-batch. */
typedef struct PlanDoc {
    uint32_t source;   /* data source, or PLAN_PAD_SOURCE */
    uint64_t doc;      /* document id in the source */
    uint64_t offset;   /* first token of the piece within its document (RoPE position) */
    int64_t len;       /* tokens */
    int64_t start;     /* first token within the micro-batch (once placed) */
    int64_t seq;       /* position in the stream: the baseline packs in this order */
    int64_t arrival;   /* step at which it was read from the stream */
    int32_t rank;      /* CP rank holding it whole, or -1 when sharded over a group of CP ranks */
    int32_t group_first, group_size; /* once placed: the CP ranks [first, first + size) it is spread
                                      * over (per_doc within them when size > 1, and its K/V exchanged
                                      * among them); size 1: whole on rank `first`; the whole CP group
                                      * for per_seq and per_doc */
} PlanDoc;

typedef struct PlanRange {
    int32_t rank;
    int64_t start, len;
} PlanRange;

typedef struct PlanSegment {
    int32_t rank;
    int64_t q_start, q_len, kv_start; /* keys [kv_start, q_start + q_len) */
} PlanSegment;

/* The aligned blocks of CP ranks form a binary tree (balance.cp_sharding: groups; the other modes
 * use its root only, and for them cp need not be a power of two): block 1 is all cp ranks, blocks
 * 2 v and 2 v + 1 the two halves of block v, block cp + r rank r alone. The blocks at depth h have
 * cp >> h ranks, and block v's first rank is a multiple of its size. */
static inline int plan_block_depth(int v)
{
    return 31 - __builtin_clz((unsigned)v);
}
static inline int plan_block_size(int cp, int v)
{
    return cp >> plan_block_depth(v);
}
static inline int plan_block_first(int cp, int v)
{
    return (v - (1 << plan_block_depth(v))) * plan_block_size(cp, v);
}
/* The block of `size` ranks starting at `first` (a multiple of size). */
static inline int plan_block_of(int cp, int first, int size)
{
    return cp / size + first / size;
}
/* 1 when block a lies inside block b (or is b). */
static inline int plan_block_inside(int a, int b)
{
    int da = plan_block_depth(a), db = plan_block_depth(b);
    return da >= db && (a >> (da - db)) == b;
}

/* One CP rank's share of a micro-batch, and its predicted seconds per layer. The rank exchanges
 * K/V (and dK/dV) in the blocks of CP ranks above it that hold sharded documents: the whole CP
 * group in every mode but groups; with groups, aligned blocks of power-of-two sizes, possibly several
 * nested ones (the tree above), largest first. Bit h of `exchanges`: its block of cp >> h ranks
 * (rank - rank % (cp >> h) onwards) holds documents sharded over it; no bit: it exchanges nothing. */
typedef struct PlanRank {
    int64_t tokens;
    uint32_t exchanges;
    int64_t first_range, n_ranges;
    int64_t first_segment, n_segments;
    double attn_fwd_s, attn_bwd_s, linear_fwd_s, linear_bwd_s, comm_fwd_s, comm_bwd_s;
    /* The K/V exchange, per layer and direction: all of it (its blocks' cost_cp_comm_group_s, in
     * n_cp_pieces pieces: a piece per rank of each block), and the attention of the documents the
     * rank holds whole that it runs beside (cost_cp_beside, with the rest of attn_*_s: the sharded
     * documents', block by block); of it what hides (comm_*_s has the exposed rest and the contention). */
    double cp_comm_s, whole_fwd_s, whole_bwd_s;
    int32_t n_cp_pieces;
    double cp_hidden_fwd_s, cp_hidden_bwd_s;
} PlanRank;

typedef struct PlanMicroBatch {
    int32_t replica;         /* DP replica that runs it */
    int32_t order;           /* its place in that replica's pipeline */
    int64_t tokens;          /* padding included */
    int64_t pad;             /* padding tokens (the last piece) */
    int64_t first_doc, n_docs;
    CpSharding mode;         /* per_seq, per_doc, hybrid or groups: what was chosen */
    int64_t sharded_tokens;  /* tokens whose K/V go through a CP all-gather (of any group) */
    int32_t cut_docs;        /* documents cut unevenly over their block (groups' eveners) */
    int64_t first_rank;      /* cp PlanRank entries */
    double fwd_s, bwd_s;     /* per layer: the slowest CP rank, communication included */
} PlanMicroBatch;

enum { PLAN_MAX_THREADS = 64 }; /* balance.plan_threads */

typedef struct StepPlan {
    int64_t step;
    int dp, m, cp;
    PlanMicroBatch *mbs;     /* dp * m, in packing order; replica/order say where each runs */
    PlanDoc *docs;
    PlanRange *ranges;
    PlanSegment *segments;
    PlanRank *ranks;
    int64_t n_docs, n_ranges, n_segments, n_ranks;
    int64_t cap_docs, cap_ranges, cap_segments, cap_ranks;
    int64_t tokens;          /* tokens of data (padding excluded) */
    int64_t pad_tokens;
    int64_t queued;          /* documents waiting in the outlier queues after this step */
    int64_t carried;         /* documents carried to the next step (did not fit) */
    double delay_token_steps; /* sum over the step's tokens of (step - arrival) */
    int64_t delayed_tokens;  /* the step's tokens read at an earlier step (arrival < step) */
    struct ShardScratch *shard_scratch[PLAN_MAX_THREADS]; /* plan_shard's working memory, one per
                                                           * micro-batch laid out at once */
} StepPlan;

/* The planner: state carried from step to step. */
typedef struct PlanQueue {
    PlanDoc *items;
    int64_t head, n, cap; /* FIFO: items[head .. head + n) */
} PlanQueue;

enum { PLAN_MAX_QUEUES = 16 };

typedef struct Planner {
    /* What the planner decides with (packing, sharding, order): the cost model with parallel.overlap
     * taken as true either way, so that overlap never changes the plan (and with it the order of the
     * sums: the same numbers with overlap true and false). The plan's times are then priced with
     * `priced`, the configured model (plan_price). */
    const CostModel *cost;
    const CostModel *priced;
    CostModel plan_cost;
    DataStream *stream;
    PackerKind packer;
    CpSharding sharding;
    int dp, m, cp, pp, n_mb;
    int64_t window, batch_tokens, s_max, rank_capacity;
    int n_queues;
    int64_t thresholds[PLAN_MAX_QUEUES];
    PlanQueue queues[PLAN_MAX_QUEUES];
    PlanQueue remained;      /* wlb: did not fit, first in the next step */
    int cut;                 /* balance.long_documents resolved: cut at the stream's windows */
    int threads;             /* balance.plan_threads resolved: threads that shard a step's micro-batches */
    int has_pending;         /* a piece read from the stream but not yet taken */
    PlanDoc pending;
    int64_t seq;             /* pieces read from the stream */
    int64_t step;            /* the next step to plan */
} Planner;

/* Empties p for a new step, keeping its memory. */
void plan_reset(StepPlan *p, int64_t step, int dp, int m, int cp);
/* Appends to the plan's arrays (growing them); return the new element's index, -1 out of memory. */
int64_t plan_add_doc(StepPlan *p, const PlanDoc *d);
int64_t plan_add_range(StepPlan *p, int32_t rank, int64_t start, int64_t len);
int64_t plan_add_segment(StepPlan *p, int32_t rank, int64_t q_start, int64_t q_len, int64_t kv_start);
int64_t plan_add_rank(StepPlan *p);

#endif
