/*
 * test/plan_checks.h - checks of a planned micro-batch shared by the planner's tests: its layout
 * against the document-causal mask, the groups invariants, and the limits every packer keeps on
 * every micro-batch of a step (in the planner and in a dry run's stats file).
 */
#ifndef WLB_TEST_PLAN_CHECKS_H
#define WLB_TEST_PLAN_CHECKS_H

#include <stdint.h>

#include "engine/plan/cost.h"
#include "engine/plan/plan.h"

/* Checks the ranges and segments of micro-batch i against the document-causal mask, token by token:
 * every token held once, queried once, against exactly its document's keys up to itself; a document
 * kept whole lies on its rank. */
void check_layout_mb(const StepPlan *p, int64_t i);
/* Which rank holds each token of micro-batch i (from the plan's ranges); the caller frees it. */
int *holders_mb(const StepPlan *p, int64_t i);

/* What check_groups saw. */
typedef struct GroupsSeen {
    int sizes;   /* distinct sizes of the blocks documents are sharded over (a rank alone: 1) */
    int nested;  /* ranks exchanging in two blocks or more */
    int cut;     /* documents cut unevenly (eveners) */
} GroupsSeen;

/* The groups invariants on micro-batch i of p, beyond check_layout_mb's mask: a document whole on a
 * rank has the group (rank, 1); a sharded document's group is an aligned power-of-two block, every
 * token of it lies on a rank of that block, and each rank of the block holds per_doc's share (two
 * chunks of len / 2 size tokens, leftovers aside) - but for at most EVEN_MAX documents cut unevenly
 * (the eveners); a rank's exchange bits are exactly the blocks above it holding sharded documents
 * (so the K/V all-gathers it joins bring every key its queries need, and every rank of a block
 * agrees), and the exchange time the plan records for it is the sum of those blocks' all-gathers,
 * a block holding a cut document priced at what its rank holding the fewest rows receives; no
 * rank holds more than capacity. */
GroupsSeen check_groups_mb(const StepPlan *p, int64_t i, const CostModel *m, int64_t capacity);

/* The limits of every micro-batch of a planned step, whatever the packer, from the planner's settings:
 * - the step has dp x m micro-batches;
 * - each holds at most its cap, padding included: S_max for wlb (pl->s_max, that is
 *   balance.max_tokens_per_micro_batch floored to a multiple of 2 CP), the window for fixed and
 *   fixed_greedy. The memory check sizes every rank's activations by this cap (plan_largest), so
 *   a micro-batch over it is memory that was never checked;
 * - its pieces lie end to end from token 0 and fill it exactly; none is empty or longer than the
 *   window; its padding is the last piece, under the pad unit (2 CP for wlb, none for the fixed
 *   packers) and makes the micro-batch a multiple of it;
 * - its CP ranks hold its tokens between them, none more than its share of S_max
 *   (pl->rank_capacity);
 * - it fits what the trainer reserves and the memory check prices (plan_largest: the largest
 *   micro-batch's tokens and one CP rank's rows of it);
 * and the step's tokens and padding are the micro-batches' sums. Returns the largest micro-batch's
 * tokens. */
int64_t check_step_limits(const StepPlan *p, const Planner *pl);
/* plan_step, asserted to succeed, and check_step_limits on what it planned; returns the largest
 * micro-batch's tokens. */
int64_t plan_step_checked(Planner *pl, StepPlan *p);
/* A dry run's --stats-out file: every step line's mb_tokens at most cap (a failure names the step,
 * the micro-batch and both numbers). Returns the largest micro-batch of the run; *n_mb (when not
 * NULL) counts the micro-batches read. */
int64_t check_stats_mb_cap(const char *stats, int64_t cap, int64_t *n_mb);

#endif
