/*
 * engine/plan/plan.h - the balance planner: one step's documents -> a StepPlan.
 *
 * A StepPlan is pure data: which document pieces go into which of the DP x M micro-batches, in
 * which order each DP replica runs its micro-batches through the pipeline, how each micro-batch is
 * split over the CP ranks (the token ranges every CP rank holds and the attention segments it
 * computes), and the predicted cost of every micro-batch on every CP rank. Every rank of a DP
 * replica executes the same plan; the dry run simulates all of them.
 *
 * Coordinates. A micro-batch is its pieces laid end to end: token t of the micro-batch is token
 * t - doc.start of its piece, whose RoPE position is doc.offset + (t - doc.start). A CP rank holds
 * some ranges [start, start + len) of the micro-batch, in the order listed (its local layout), and
 * computes attention segments: queries [q_start, q_start + q_len) against keys and values
 * [kv_start, q_start + q_len) of the micro-batch, document-causal: query q_start + i sees keys up to
 * q_start + i. A segment's keys are all in one document. Keys of a sharded document come from the
 * CP all-gather; a whole (unsharded) document lies entirely on the rank that computes it.
 *
 * Packers (balance.packer):
 *   fixed         the stream's pieces in order, into windows of at most the context window
 *                 (Plain-4D).
 *   fixed_greedy  the step's pieces (global_batch_tokens of them) repacked into windows of at most
 *                 the context window, longest first, each into the window with the least predicted
 *                 cost that has room (Fixed-4D).
 *   wlb           WLB-LLM Algorithm 1: variable-length micro-batches of at most S_max tokens; long
 *                 documents (>= outlier_thresholds[0]) wait in queues until one can go to every
 *                 micro-batch; what does not fit carries to the next step.
 * Documents (balance.long_documents; auto: cut for the fixed packers, keep for wlb). The stream
 * always cuts a document longer than the window into pieces of at most the window.
 *   cut   the stream is also cut at every multiple of the window of its tokens (Plain-4D's loader),
 *         so documents straddling such a cut come as two pieces. fixed: every window is one of those
 *         windows, exactly full; fixed_greedy: the step is exactly N windows of the stream, and a
 *         piece that fits in no window with room is split over the roomiest ones; wlb: packs the
 *         cut pieces as they come.
 *   keep  no other cut. fixed: a piece that does not fit in the rest of its window starts the next
 *         one (windows are not full); fixed_greedy: the step takes whole pieces up to N windows, and
 *         a piece that fits in no window waits for the next step; wlb: as above.
 * CP sharding (balance.cp_sharding): per_seq, per_doc, adaptive, hybrid (plan_shard.c), groups
 * (plan_groups.c).
 */
#ifndef WLB_ENGINE_PLAN_H
#define WLB_ENGINE_PLAN_H

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

void plan_free(StepPlan *p);
/* Empties p for a new step, keeping its memory. */
void plan_reset(StepPlan *p, int64_t step, int dp, int m, int cp);
/* Appends to the plan's arrays (growing them); return the new element's index, -1 out of memory. */
int64_t plan_add_doc(StepPlan *p, const PlanDoc *d);
int64_t plan_add_range(StepPlan *p, int32_t rank, int64_t start, int64_t len);
int64_t plan_add_segment(StepPlan *p, int32_t rank, int64_t q_start, int64_t q_len, int64_t kv_start);
int64_t plan_add_rank(StepPlan *p);

/* ---------------------------------------------------------------------------------------------- */
/* The planner: state carried from step to step.                                                  */

typedef struct PlanQueue {
    PlanDoc *items;
    int64_t head, n, cap; /* FIFO: items[head .. head + n) */
} PlanQueue;

enum { PLAN_MAX_QUEUES = 16 };

typedef struct Planner {
    const CostModel *cost;
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

/* packer and sharding may differ from cfg's (the dry run's --compare and baseline use that). */
int plan_init(Planner *pl, const Config *cfg, const CostModel *cost, DataStream *stream, PackerKind packer,
              CpSharding sharding, Error *err);
void plan_destroy(Planner *pl);
/* Plans the next step into p. */
int plan_step(Planner *pl, StepPlan *p, Error *err);

/* Documents waiting in the planner (queues, leftovers, the pending piece). */
int64_t plan_waiting_docs(const Planner *pl);

/* The planner's state between steps - the next step, the stream position of its pieces, the piece
 * held back, the outlier queues and the leftovers - as words for a checkpoint (the data stream's
 * own position is saved beside it with data_stream_save). plan_state_words gives the count. */
size_t plan_state_words(const Planner *pl);
void plan_state_save(const Planner *pl, uint64_t *words);
/* Restores into a planner initialised with the same config; bad words are an Error (status 2). */
int plan_state_restore(Planner *pl, const uint64_t *words, size_t n_words, Error *err);

/* Plain-4D of the same documents: the data pieces of src in stream order, cut into windows of the
 * context window, per_seq CP sharding. Used for every step's predicted speedup. */
int plan_baseline(const Planner *pl, const StepPlan *src, StepPlan *out, Error *err);

/* Plain-4D of exactly the pieces of src (the same attention work): in stream order into windows of
 * at most the context window, a piece that does not fit in the rest of a window starting the next
 * one, per_seq CP sharding. The dry run's speedup at equal work. */
int plan_baseline_equal_work(const Planner *pl, const StepPlan *src, StepPlan *out, Error *err);

/* Attention work of a plan: the (query, key) pairs of its data pieces under the document-causal
 * mask, sum of d (d + 1) / 2 over pieces of d tokens (padding excluded; no kernel tile rounding). */
double plan_attn_pairs(const StepPlan *p);

/* Predicted balance of a planned step. pp: WLB-LLM's Table 2 measure, the costliest micro-batch
 * (forward + backward) times the number of micro-batches over their total. cp: the slowest CP
 * rank's compute over the mean of the CP ranks, for the step's worst micro-batch (its index in
 * *worst_mb, -1 when all are even). plan_rank_compute: CP rank r's attention and linear seconds of a
 * micro-batch per layer, forward + backward. */
double plan_pp_imbalance(const StepPlan *p);
double plan_cp_imbalance(const StepPlan *p, int64_t *worst_mb);
/* The same with each rank's time, its K/V exchange (and TP all-reduces) included: with sharding
 * groups ranks of different groups exchange different amounts, and the planner evens their times,
 * not their compute. */
double plan_cp_time_imbalance(const StepPlan *p);
/* Micro-batch i's share of that: its slowest CP rank's time over the mean of its ranks (0 when it
 * holds nothing); *slowest (may be NULL) that rank's seconds per layer, forward + backward. */
double plan_mb_time_imbalance(const StepPlan *p, int64_t i, double *slowest);
double plan_rank_compute(const StepPlan *p, const PlanMicroBatch *mb, int r);
/* A CRC-32 of everything the ranks execute: micro-batches, pieces, ranges, segments. Ranks that
 * planned the same step get the same digest. */
uint32_t plan_digest(const StepPlan *p);

/* The largest micro-batch this planner makes (*mb_tokens: a window for the fixed packers, S_max for
 * wlb) and the most rows one CP rank holds of it (*rank_rows): what activation memory must hold. */
void plan_largest(const Planner *pl, int64_t *mb_tokens, int64_t *rank_rows);

/* Shards micro-batch i of p over the CP ranks in the given mode (adaptive and hybrid choose) and
 * fills its PlanRank entries and per-layer costs (plan_shard.c). */
int plan_shard(StepPlan *p, int64_t i, CpSharding mode, const CostModel *cost, int64_t rank_capacity, Error *err);
/* plan_shard of micro-batches 0 .. n_mb - 1, on up to `threads` threads: a micro-batch's layout
 * depends on its documents alone, and the layouts are copied into the plan in order, so the plan is
 * the same for any thread count. */
int plan_shard_step(StepPlan *p, int64_t n_mb, CpSharding mode, const CostModel *cost, int64_t rank_capacity,
                    int threads, Error *err);
void plan_shard_scratch_free(StepPlan *p);


/* Gives the sharded micro-batches to the DP replicas and orders each replica's pipeline (plan.c). */
int plan_arrange(const Planner *pl, StepPlan *p, Error *err);

/* Packers (plan_pack.c): fill p's micro-batches with docs (start offsets set, not yet sharded). */
int plan_pack_fixed(Planner *pl, StepPlan *p, Error *err);
int plan_pack_fixed_greedy(Planner *pl, StepPlan *p, Error *err);
int plan_pack_wlb(Planner *pl, StepPlan *p, Error *err);

#endif
