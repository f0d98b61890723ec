/*
 * engine/plan/plan_fill_impl.h - groups' step pass (plan_fill.c): what its search and its layouts
 * (plan_fill_replay.c) share.
 */
#ifndef WLB_ENGINE_PLAN_FILL_IMPL_H
#define WLB_ENGINE_PLAN_FILL_IMPL_H

#include <stdint.h>

#include "engine/plan/plan.h"
#include "engine/plan/plan_shard_impl.h"

enum { ROLE_NONE, ROLE_TOOK, ROLE_GAVE }; /* a micro-batch that took gives nothing after */
enum { FILL_KEEP = -1, FILL_ANYWHERE = -2 }; /* a document's new rank: its saved place; the least
                                              * loaded rank (a new layout may place it better) */

/* A document moving to another micro-batch. */
typedef struct Candidate {
    int64_t doc;            /* index in the plan's docs */
    int64_t len;
    int32_t mb, from_rank;  /* the micro-batch giving it, the rank holding it whole */
    int32_t to_mb, to_rank; /* where it goes (to_mb -1: it stays); to_rank a rank or FILL_ANYWHERE */
} Candidate;

/* The plan as it was before a try, to lay out from and to restore. */
typedef struct Saved {
    PlanMicroBatch *mbs;
    PlanDoc *docs;
    PlanRange *ranges;
    PlanSegment *segments;
    PlanRank *ranks;
    int64_t n_docs, n_ranges, n_segments, n_ranks;
    int64_t cap[5];
} Saved;

/* The pass's working memory. */
typedef struct Fill {
    const Planner *pl;
    Saved saved;
    Shard shard;          /* a replayed layout */
    Candidate *cand;      /* documents other micro-batches hold whole, longest first */
    int64_t n_cand;
    Candidate *back;      /* the taker's documents traded away, to the giver's rank */
    int64_t n_back;
    uint8_t *role, *role0; /* per micro-batch: ROLE_*; role0 as before the try */
    uint8_t *changed;     /* per micro-batch: changed by the try */
    uint8_t *redo;        /* per micro-batch: laid out anew in the try's second pass */
    uint8_t *tried;       /* per micro-batch: has tried to take */
    uint8_t *given;       /* per saved document: moves */
    uint8_t *done;        /* per rank: filled */
    int64_t *src;         /* per new document: its index in the saved docs, -1 for padding */
    int32_t *to;          /* per new document: FILL_KEEP, FILL_ANYWHERE or the rank it moves to */
    PlanSegment *segs;    /* a saved micro-batch's segments by query start, and as many again for the sort */
    int64_t cap_segs;
    int64_t *held;        /* per rank: a document's rows */
    double share;         /* FILL_ROOM: the share of the room taken */
    int sharded_too;      /* the candidates include documents the others shard */
    int32_t *arranged;    /* per micro-batch: replica and order of the new arrangement (keep_arrangement) */
} Fill;

/* plan_fill.c: the pass's working memory for plan p (f zeroed first; -1 out of memory, f still
 * to be freed), and its release. */
int fill_alloc(Fill *f, const Planner *pl, const StepPlan *p);
void fill_free(Fill *f);

/* plan_fill_replay.c. fill_save copies the plan into f->saved, fill_restore copies it back. */
int fill_save(Fill *f, const StepPlan *p);
void fill_restore(const Fill *f, StepPlan *p);
void fill_saved_free(Saved *s);
/* The plan's docs anew from the saved ones: each micro-batch keeps its documents but those moving
 * (f->given), then those coming to it (f->cand, then f->back), then padding to 2 CP tokens; sets
 * f->src and f->to. */
int fill_rebuild_docs(Fill *f, StepPlan *p);
/* Lays out micro-batch i after fill_rebuild_docs: its saved layout replayed (each piece at its
 * document's new offset, a document coming to it whole on its rank), or, given fresh (its new layout
 * from plan_shard_lay_out), whichever of the two the pipeline predicts faster. Returns 0, 1 when it
 * cannot (a rank over its capacity, a saved layout it cannot read), -1 with err set. */
int fill_lay_out(Fill *f, StepPlan *p, int64_t i, const Shard *fresh, Error *err);
/* Micro-batch i's saved layout appended unchanged (its documents kept their offsets). */
int fill_copy_layout(const Fill *f, StepPlan *p, int64_t i);

#endif
