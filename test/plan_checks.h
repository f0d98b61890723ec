/*
 * test/plan_checks.h - checks of a planned micro-batch shared by the planner's tests: its layout
 * against the document-causal mask, and the groups invariants.
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

#endif
