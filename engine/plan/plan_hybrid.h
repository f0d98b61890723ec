/*
 * engine/plan/plan_hybrid.h - balance.cp_sharding: hybrid's candidates. Per document, shard it
 * per_doc over the CP group or keep it whole on one rank: the documents of at least a threshold
 * sharded, the shorter ones whole, longest first, each on the rank with the least predicted time
 * that has room; thresholds tile, 2 tile, 4 tile, ... (plan_shard.c's header says why).
 */
#ifndef WLB_ENGINE_PLAN_HYBRID_H
#define WLB_ENGINE_PLAN_HYBRID_H

#include "engine/plan/plan_layout.h"

/* hybrid's working memory and result for one micro-batch (kept across calls). */
typedef struct Hybrid {
    Shard layout;              /* the fastest candidate, laid out */
    int64_t threshold;         /* its threshold: documents from this length sharded (-1: none) */
    int64_t *order;            /* the documents, longest first */
    double *whole, *shard_lb;  /* per document: its attention whole, and a lower bound on its
                                * attention summed over the ranks when sharded per_doc */
    int64_t cap_order, cap_whole, cap_lb;
} Hybrid;

/* Tries every threshold; leaves the fastest layout that keeps every rank within capacity in
 * h->layout, its time in *best_t (-1 when none does, or none is faster than bound when bound > 0).
 * h->layout must be allocated for the micro-batch's CP (shard_alloc). -1 out of memory. */
int hybrid_best(Hybrid *h, const CostModel *cost, const PlanDoc *docs, int64_t n, int64_t capacity, double bound,
                double *best_t);
void hybrid_free(Hybrid *h);

/* hybrid's candidate with this threshold: shard_time of the layout shard_hybrid would make, without making it; -1 when it breaks the capacity or cannot be faster than bound
 * (bound > 0). order: the documents longest first; NULL with threshold 0 (every document sharded:
 * per_doc's layout). */
double hybrid_predict(const CostModel *cost, const PlanDoc *docs, int64_t n, const int64_t *order, int cp,
                      int64_t threshold, int64_t capacity, double bound, const double *whole);
/* A lower bound on hybrid_predict's figure for this threshold, from hybrid_best's per-document
 * figures (Hybrid.whole, .shard_lb; O(n), no layout). */
double hybrid_lower_bound(const CostModel *cost, const PlanDoc *docs, int64_t n, int cp, const double *whole,
                          const double *shard_lb, int64_t threshold);

#endif
