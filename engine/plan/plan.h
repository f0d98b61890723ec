/*
 * engine/plan/plan.h - the balance planner: one step's documents -> a StepPlan.
 *
 * plan_step runs the passes in this order, each in its own file, each using only the data types
 * (plan_types.h), the cost model (cost.h) and the passes before it:
 *   pack      plan_pack.c: the step's documents into DP x M micro-batches (the packers below);
 *   shard     plan_shard.c: every micro-batch over the CP ranks (the CP sharding modes below), from
 *             the layouts of plan_layout.c, hybrid's candidates (plan_hybrid.c) and groups' search
 *             (plan_groups.c, plan_groups_nest.c, plan_groups_even.c);
 *   arrange   plan.c: the micro-batches to the DP replicas, then each replica's order through the
 *             pipeline, the fastest of three as the pipeline simulator (sched.c) predicts it.
 *
 * A StepPlan is pure data: which document pieces go into which of the DP x M micro-batches, in
 * which order each DP replica runs its micro-batches through the pipeline, how each micro-batch is
 * split over the CP ranks (the token ranges every CP rank holds and the attention segments it
 * computes), and the predicted cost of every micro-batch on every CP rank. Every rank of a DP
 * replica executes the same plan; the dry run simulates all of them.
 *
 * Packers (balance.packer):
 *   fixed         the stream's pieces in order, into windows of at most the context window
 *                 (Plain-4D).
 *   fixed_greedy  the step's pieces (global_batch_tokens of them) repacked into windows of at most
 *                 the context window, longest first, each into the window with the least predicted
 *                 cost that has room (Fixed-4D).
 *   wlb           WLB-LLM Algorithm 1: variable-length micro-batches of at most S_max tokens; long
 *                 documents (>= outlier_thresholds[0]) wait in queues until one can go to every
 *                 micro-batch; what does not fit carries to the next step. A step trains about
 *                 global_batch_tokens: everything that goes into it, released outliers included,
 *                 counts against min(global_batch_tokens, N x S_max), queued ones not.
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
 * CP sharding (balance.cp_sharding): per_seq, per_doc, adaptive, hybrid, groups (plan_shard.c).
 */
#ifndef WLB_ENGINE_PLAN_H
#define WLB_ENGINE_PLAN_H

#include "engine/plan/plan_types.h"

/* Frees p's arrays and its sharding scratch. */
void plan_free(StepPlan *p);

/* packer and sharding may differ from cfg's (the dry run's --compare and baseline use that). */
int plan_init(Planner *pl, const Config *cfg, const CostModel *cost, DataStream *stream, PackerKind packer,
              CpSharding sharding, Error *err);
void plan_destroy(Planner *pl);
/* Plans the next step into p. */
int plan_step(Planner *pl, StepPlan *p, Error *err);

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
double plan_rank_compute(const StepPlan *p, const PlanMicroBatch *mb, int r);
/* A CRC-32 of everything the ranks execute: micro-batches, pieces, ranges, segments. Ranks that
 * planned the same step get the same digest. */
uint32_t plan_digest(const StepPlan *p);

/* The largest micro-batch this planner makes (*mb_tokens: a window for the fixed packers, S_max for
 * wlb) and the most rows one CP rank holds of it (*rank_rows): what activation memory must hold. */
void plan_largest(const Planner *pl, int64_t *mb_tokens, int64_t *rank_rows);

#endif
