/*
 * engine/plan/plan_pack.h - the first pass: a step's documents into DP x M micro-batches
 * (balance.packer; plan.h describes the packers), and the Plain-4D packings of the same documents
 * that the dry run's speedups compare against.
 */
#ifndef WLB_ENGINE_PLAN_PACK_H
#define WLB_ENGINE_PLAN_PACK_H

#include "engine/plan/plan_types.h"

/* Fill p's micro-batches with docs (start offsets set, not yet sharded). */
int plan_pack_fixed(Planner *pl, StepPlan *p, Error *err);
int plan_pack_fixed_greedy(Planner *pl, StepPlan *p, Error *err);
int plan_pack_wlb(Planner *pl, StepPlan *p, Error *err);

/* Plain-4D's windows of src's data pieces in stream order, into out (replica and order set, not yet
 * sharded): cut, concatenated and cut at every multiple of the window (Plain-4D's loader); else
 * whole, a piece that does not fit in the rest of a window starting the next. plan_baseline and
 * plan_baseline_equal_work (plan.h) shard them per_seq. */
int plan_pack_baseline(const Planner *pl, const StepPlan *src, StepPlan *out, int cut, Error *err);

#endif
