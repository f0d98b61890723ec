/* engine/plan/plan_types.c - a StepPlan's arrays: emptied for a step, grown as the passes append. */
#include "engine/plan/plan_types.h"

#include <stdlib.h>
#include <string.h>

#include "util/array.h"

void plan_reset(StepPlan *p, int64_t step, int dp, int m, int cp)
{
    int64_t n_mb = (int64_t)dp * m;
    if (p->dp * p->m < n_mb) {
        free(p->mbs);
        p->mbs = calloc((size_t)n_mb, sizeof *p->mbs);
    }
    if (p->mbs)
        memset(p->mbs, 0, (size_t)n_mb * sizeof *p->mbs);
    p->step = step;
    p->dp = p->mbs ? dp : 0;
    p->m = m;
    p->cp = cp;
    p->n_docs = p->n_ranges = p->n_segments = p->n_ranks = 0;
    p->tokens = p->pad_tokens = p->queued = p->carried = 0;
    p->delay_token_steps = 0;
    p->delayed_tokens = 0;
}

int64_t plan_add_doc(StepPlan *p, const PlanDoc *d)
{
    void *bigger = array_grow(p->docs, &p->cap_docs, p->n_docs + 1, sizeof *p->docs);
    if (!bigger)
        return -1;
    p->docs = bigger;
    p->docs[p->n_docs] = *d;
    return p->n_docs++;
}

int64_t plan_add_range(StepPlan *p, int32_t rank, int64_t start, int64_t len)
{
    void *bigger = array_grow(p->ranges, &p->cap_ranges, p->n_ranges + 1, sizeof *p->ranges);
    if (!bigger)
        return -1;
    p->ranges = bigger;
    p->ranges[p->n_ranges] = (PlanRange){rank, start, len};
    return p->n_ranges++;
}

int64_t plan_add_segment(StepPlan *p, int32_t rank, int64_t q_start, int64_t q_len, int64_t kv_start)
{
    void *bigger = array_grow(p->segments, &p->cap_segments, p->n_segments + 1, sizeof *p->segments);
    if (!bigger)
        return -1;
    p->segments = bigger;
    p->segments[p->n_segments] = (PlanSegment){rank, q_start, q_len, kv_start};
    return p->n_segments++;
}

int64_t plan_add_rank(StepPlan *p)
{
    void *bigger = array_grow(p->ranks, &p->cap_ranks, p->n_ranks + 1, sizeof *p->ranks);
    if (!bigger)
        return -1;
    p->ranks = bigger;
    memset(&p->ranks[p->n_ranks], 0, sizeof *p->ranks);
    return p->n_ranks++;
}
