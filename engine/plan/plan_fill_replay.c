/*
 * engine/plan/plan_fill_replay.c - the step pass's layouts (plan_fill.c): the plan saved and
 * restored, its documents moved between micro-batches, and a micro-batch laid out as it was with
 * what it gained or lost (a replay), or anew.
 *
 * A replay reads the saved layout back document by document: a document held whole stays on its
 * rank; a sharded one's pieces are its segments (queries starting inside it, each against keys
 * from its start), each put back on its rank at the document's new offset, with the document's
 * block and that block's exchange (priced as a cut, plan_groups_cut.c, when the pieces are not
 * per_doc's shares); a document coming to the micro-batch goes whole on the rank the search chose;
 * padding goes whole on the least loaded rank. Nothing else moves, so the figures of the ranks the
 * search did not touch stay those of the saved layout (padding aside).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_fill_impl.h"
#include "util/array.h"

static int copy_array(void **dst, int64_t *cap, const void *src, int64_t n, size_t size)
{
    void *d = array_grow(*dst, cap, n > 0 ? n : 1, size);
    if (!d)
        return -1;
    *dst = d;
    if (n > 0)
        memcpy(d, src, (size_t)n * size);
    return 0;
}

int fill_save(Fill *f, const StepPlan *p)
{
    Saved *s = &f->saved;
    int64_t n_mb = (int64_t)p->dp * p->m;
    s->n_docs = p->n_docs;
    s->n_ranges = p->n_ranges;
    s->n_segments = p->n_segments;
    s->n_ranks = p->n_ranks;
    return copy_array((void **)&s->mbs, &s->cap[0], p->mbs, n_mb, sizeof *p->mbs) ||
                   copy_array((void **)&s->docs, &s->cap[1], p->docs, p->n_docs, sizeof *p->docs) ||
                   copy_array((void **)&s->ranges, &s->cap[2], p->ranges, p->n_ranges, sizeof *p->ranges) ||
                   copy_array((void **)&s->segments, &s->cap[3], p->segments, p->n_segments, sizeof *p->segments) ||
                   copy_array((void **)&s->ranks, &s->cap[4], p->ranks, p->n_ranks, sizeof *p->ranks)
               ? -1
               : 0;
}

/* The plan's arrays only grow, so the saved counts fit in them. */
void fill_restore(const Fill *f, StepPlan *p)
{
    const Saved *s = &f->saved;
    memcpy(p->mbs, s->mbs, (size_t)p->dp * (size_t)p->m * sizeof *p->mbs);
    memcpy(p->docs, s->docs, (size_t)s->n_docs * sizeof *p->docs);
    memcpy(p->ranges, s->ranges, (size_t)s->n_ranges * sizeof *p->ranges);
    memcpy(p->segments, s->segments, (size_t)s->n_segments * sizeof *p->segments);
    memcpy(p->ranks, s->ranks, (size_t)s->n_ranks * sizeof *p->ranks);
    p->n_docs = s->n_docs;
    p->n_ranges = s->n_ranges;
    p->n_segments = s->n_segments;
    p->n_ranks = s->n_ranks;
}

void fill_saved_free(Saved *s)
{
    free(s->mbs);
    free(s->docs);
    free(s->ranges);
    free(s->segments);
    free(s->ranks);
}

int fill_rebuild_docs(Fill *f, StepPlan *p)
{
    const Saved *s = &f->saved;
    int64_t n_mb = (int64_t)p->dp * p->m;
    int64_t pad_unit = 2 * p->cp;
    p->n_docs = 0;
    for (int64_t i = 0; i < n_mb; i++) {
        PlanMicroBatch *mb = &p->mbs[i];
        const PlanMicroBatch *old = &s->mbs[i];
        mb->first_doc = p->n_docs;
        int64_t at = 0;
        for (int64_t c = -old->n_docs; c < f->n_cand + f->n_back; c++) {
            /* c < 0: the saved documents in order; then the candidates and the traded documents
             * that go to i */
            const Candidate *m = c < 0 ? NULL : c < f->n_cand ? &f->cand[c] : &f->back[c - f->n_cand];
            int64_t k = c < 0 ? old->first_doc + old->n_docs + c : m->doc;
            if (c < 0 ? f->given[k] || s->docs[k].source == PLAN_PAD_SOURCE : m->to_mb != i)
                continue;
            PlanDoc d = s->docs[k];
            d.start = at;
            at += d.len;
            f->src[p->n_docs] = k;
            f->to[p->n_docs] = c < 0 ? FILL_KEEP : m->to_rank;
            if (plan_add_doc(p, &d) < 0)
                return -1;
        }
        int64_t pad = at % pad_unit ? pad_unit - at % pad_unit : 0;
        if (pad) {
            /* The saved padding where it is the same piece (its place kept, for a micro-batch laid
             * out as saved), else a new one. */
            const PlanDoc *was = old->pad ? &s->docs[old->first_doc + old->n_docs - 1] : NULL;
            PlanDoc d = {PLAN_PAD_SOURCE, 0, 0, pad, at, -1, p->step, -1, 0, 0};
            if (was && was->start == at && was->len == pad)
                d = *was;
            f->src[p->n_docs] = -1;
            f->to[p->n_docs] = FILL_KEEP;
            if (plan_add_doc(p, &d) < 0)
                return -1;
        }
        mb->tokens = at + pad;
        mb->pad = pad;
        mb->n_docs = p->n_docs - mb->first_doc;
    }
    return 0;
}

/* The rank of s with the least time, its exchanges included. */
static int least_rank(const Shard *s, const CostModel *cost)
{
    int r = 0;
    double least = 0;
    for (int q = 0; q < s->cp; q++) {
        double t = shard_rank_time_with(cost, s->attn[q], s->tokens[q]) + 2 * shard_rank_cp_comm(s, cost, q);
        if (q == 0 || t < least) {
            least = t;
            r = q;
        }
    }
    return r;
}

/* Sorts a[0..n) by query start (no two alike: a query row is on one rank) with tmp[0..n): a merge
 * sort with the comparison inline - the replay's hottest step after the layouts - that passes over
 * halves already in order (each rank's segments mostly are). */
static void sort_by_q_start(PlanSegment *a, PlanSegment *tmp, int64_t n)
{
    if (n < 16) {
        for (int64_t i = 1; i < n; i++) {
            PlanSegment x = a[i];
            int64_t j = i;
            for (; j > 0 && a[j - 1].q_start > x.q_start; j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    int64_t h = n / 2;
    sort_by_q_start(a, tmp, h);
    sort_by_q_start(a + h, tmp, n - h);
    if (a[h - 1].q_start < a[h].q_start)
        return;
    int64_t i = 0, j = h, o = 0;
    while (i < h && j < n)
        tmp[o++] = a[i].q_start < a[j].q_start ? a[i++] : a[j++];
    while (i < h)
        tmp[o++] = a[i++];
    while (j < n)
        tmp[o++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

/* Micro-batch i's saved layout with its new documents (fill_rebuild_docs) into f->shard (the
 * replay the file's comment describes). Returns 0, 1 when the saved layout cannot be read back or
 * a rank ends over its capacity, -1 out of memory. */
static int replay(Fill *f, const StepPlan *p, int64_t i)
{
    const Saved *s = &f->saved;
    const CostModel *cost = f->pl->cost;
    const PlanMicroBatch *mb = &p->mbs[i], *old = &s->mbs[i];
    const PlanDoc *docs = p->docs + mb->first_doc;
    Shard *sh = &f->shard;
    int cp = p->cp;
    if (shard_alloc(sh, cp) != 0 || shard_reset(sh, mb->n_docs) != 0)
        return -1;
    /* The saved micro-batch's segments, by query start: each document's are consecutive. */
    int64_t n_segs = 0;
    for (int r = 0; r < cp; r++)
        n_segs += s->ranks[old->first_rank + r].n_segments;
    PlanSegment *segs = array_grow(f->segs, &f->cap_segs, n_segs > 0 ? 2 * n_segs : 1, sizeof *segs);
    if (!segs)
        return -1;
    f->segs = segs;
    n_segs = 0;
    for (int r = 0; r < cp; r++) {
        const PlanRank *k = &s->ranks[old->first_rank + r];
        for (int64_t j = k->first_segment; j < k->first_segment + k->n_segments; j++)
            segs[n_segs++] = s->segments[j];
    }
    sort_by_q_start(segs, segs + n_segs, n_segs); /* the second half: the sort's scratch */
    int64_t pad = -1;
    for (int64_t j = 0; j < mb->n_docs; j++) {
        int64_t at = mb->first_doc + j, k = f->src[at];
        if (k < 0) {
            pad = j;
            continue;
        }
        const PlanDoc *d = &s->docs[k];
        if (f->to[at] == FILL_ANYWHERE) {
            if (shard_whole(sh, cost, docs, j, least_rank(sh, cost)) != 0)
                return -1;
            continue;
        }
        if (f->to[at] >= 0 || d->rank >= 0) {
            if (shard_whole(sh, cost, docs, j, f->to[at] >= 0 ? f->to[at] : d->rank) != 0)
                return -1;
            continue;
        }
        int first = d->group_first, g = d->group_size;
        if (g < 2 || g > cp || (g & (g - 1)) || first % g)
            return 1;
        int v = plan_block_of(cp, first, g), h = plan_block_depth(v);
        for (int r = first; r < first + g; r++)
            f->held[r] = 0;
        /* Its pieces: the segments whose queries start inside it (binary search the first). */
        int64_t lo = 0, hi = n_segs;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (segs[mid].q_start < d->start)
                lo = mid + 1;
            else
                hi = mid;
        }
        int64_t covered = 0;
        for (; lo < n_segs && segs[lo].q_start < d->start + d->len; lo++) {
            const PlanSegment *g0 = &segs[lo];
            if (g0->kv_start != d->start || g0->rank < first || g0->rank >= first + g)
                return 1;
            int64_t start = docs[j].start + (g0->q_start - d->start);
            if (shard_piece(sh, cost, g0->rank, start, g0->q_len, docs[j].start) != 0)
                return -1;
            sh->own[g0->rank * SHARD_DEPTHS + h] += g0->q_len;
            f->held[g0->rank] += g0->q_len;
            covered += g0->q_len;
        }
        if (covered != d->len)
            return 1;
        /* per_doc's shares are two chunks of len / 2 g rows, and at most one leftover row each;
         * other shares are a cut (plan_groups_cut.c), whose exchange is priced as such. */
        int64_t share = 2 * (d->len / (2 * g));
        int per_doc = 1;
        for (int r = first; r < first + g; r++)
            per_doc &= f->held[r] >= share && f->held[r] <= share + 2;
        sh->uneven[v] += !per_doc;
        sh->doc_rank[j] = -1;
        sh->doc_first[j] = first;
        sh->doc_size[j] = g;
        sh->blk_sharded[v] += d->len;
        sh->sharded += d->len;
    }
    if (pad >= 0) {
        /* Whole on the rank with the least time (a padding piece is under 2 CP tokens). */
        if (shard_whole(sh, cost, docs, pad, least_rank(sh, cost)) != 0)
            return -1;
    }
    return shard_fits(sh, f->pl->rank_capacity) ? 0 : 1;
}

int fill_lay_out(Fill *f, StepPlan *p, int64_t i, const Shard *fresh, Error *err)
{
    const Planner *pl = f->pl;
    PlanMicroBatch *mb = &p->mbs[i];
    int rc = replay(f, p, i);
    if (rc < 0)
        return error_runtime(err, "planner", "out of memory");
    if (rc > 0 && !fresh)
        return 1;
    if (fresh) {
        int64_t n_ranges = p->n_ranges, n_segments = p->n_segments, n_ranks = p->n_ranks;
        if (shard_commit(p, mb, fresh, pl->cost) != 0)
            return error_runtime(err, "planner", "out of memory");
        /* Compared on the figures the pipeline takes: the slowest forward plus the slowest
         * backward. */
        double fwd = 0, bwd = 0;
        if (rc == 0)
            shard_mb_times(&f->shard, pl->cost, &fwd, &bwd);
        if (rc > 0 || mb->fwd_s + mb->bwd_s < fwd + bwd)
            return 0;
        p->n_ranges = n_ranges;
        p->n_segments = n_segments;
        p->n_ranks = n_ranks;
    }
    if (shard_commit(p, mb, &f->shard, pl->cost) != 0)
        return error_runtime(err, "planner", "out of memory");
    /* per_doc with a document now whole is hybrid's kind of layout (the dry run counts modes). */
    mb->mode = f->saved.mbs[i].mode;
    for (int64_t k = mb->first_doc; k < mb->first_doc + mb->n_docs && mb->mode == CP_PER_DOC; k++)
        if (p->docs[k].rank >= 0 && p->docs[k].source != PLAN_PAD_SOURCE)
            mb->mode = CP_HYBRID;
    return 0;
}

int fill_copy_layout(const Fill *f, StepPlan *p, int64_t i)
{
    const Saved *s = &f->saved;
    const PlanRank *old = &s->ranks[s->mbs[i].first_rank];
    p->mbs[i].first_rank = p->n_ranks;
    for (int r = 0; r < p->cp; r++) {
        int64_t k = plan_add_rank(p);
        if (k < 0)
            return -1;
        PlanRank *pr = &p->ranks[k];
        *pr = old[r];
        pr->first_range = p->n_ranges;
        pr->first_segment = p->n_segments;
        for (int64_t j = old[r].first_range; j < old[r].first_range + old[r].n_ranges; j++)
            if (plan_add_range(p, r, s->ranges[j].start, s->ranges[j].len) < 0)
                return -1;
        for (int64_t j = old[r].first_segment; j < old[r].first_segment + old[r].n_segments; j++) {
            const PlanSegment *g = &s->segments[j];
            if (plan_add_segment(p, r, g->q_start, g->q_len, g->kv_start) < 0)
                return -1;
        }
    }
    return 0;
}
