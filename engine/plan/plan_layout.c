/* engine/plan/plan_layout.c - a candidate layout (Shard): its primitives, its predicted times, and
 * its copy into the plan (see plan_layout.h). */
#include "engine/plan/plan_layout.h"

#include <stdlib.h>

#include "util/array.h"

static void shard_free_ranks(Shard *s)
{
    free(s->last_range);
    free(s->tokens);
    free(s->attn);
    free(s->attn_fwd);
    free(s->attn_bwd);
    free(s->whole_fwd);
    free(s->whole_bwd);
    free(s->blk_sharded);
    free(s->uneven);
    free(s->own);
    free(s->counter);
}

int shard_alloc(Shard *s, int cp)
{
    if (s->cp == cp)
        return 0;
    shard_free_ranks(s);
    s->cp = cp;
    size_t n = (size_t)cp;
    s->last_range = malloc(n * sizeof *s->last_range);
    s->tokens = malloc(n * sizeof *s->tokens);
    s->attn = malloc(n * sizeof *s->attn);
    s->attn_fwd = malloc(n * sizeof *s->attn_fwd);
    s->attn_bwd = malloc(n * sizeof *s->attn_bwd);
    s->whole_fwd = malloc(n * sizeof *s->whole_fwd);
    s->whole_bwd = malloc(n * sizeof *s->whole_bwd);
    s->blk_sharded = malloc(2 * n * sizeof *s->blk_sharded);
    s->uneven = malloc(2 * n * sizeof *s->uneven);
    s->own = malloc(n * SHARD_DEPTHS * sizeof *s->own);
    s->counter = malloc(2 * n * sizeof *s->counter);
    return s->last_range && s->tokens && s->attn && s->attn_fwd && s->attn_bwd && s->whole_fwd && s->whole_bwd &&
                   s->blk_sharded && s->uneven && s->own && s->counter
               ? 0
               : -1;
}

int shard_reset(Shard *s, int64_t n_docs)
{
    int32_t *doc_rank = array_grow(s->doc_rank, &s->cap_docs, n_docs, sizeof *doc_rank);
    if (!doc_rank)
        return -1;
    s->doc_rank = doc_rank;
    int32_t *doc_first = array_grow(s->doc_first, &s->cap_doc_first, n_docs, sizeof *doc_first);
    if (!doc_first)
        return -1;
    s->doc_first = doc_first;
    int32_t *doc_size = array_grow(s->doc_size, &s->cap_doc_size, n_docs, sizeof *doc_size);
    if (!doc_size)
        return -1;
    s->doc_size = doc_size;
    for (int64_t k = 0; k < n_docs; k++) {
        s->doc_rank[k] = -1;
        s->doc_first[k] = 0;
        s->doc_size[k] = s->cp;
    }
    s->n_ranges = s->n_segs = s->sharded = 0;
    for (int r = 0; r < s->cp; r++) {
        s->last_range[r] = -1;
        s->tokens[r] = 0;
        s->attn[r] = s->attn_fwd[r] = s->attn_bwd[r] = s->whole_fwd[r] = s->whole_bwd[r] = 0;
    }
    for (int v = 0; v < 2 * s->cp; v++) {
        s->blk_sharded[v] = 0;
        s->uneven[v] = 0;
        s->counter[v] = 0;
    }
    for (int i = 0; i < s->cp * SHARD_DEPTHS; i++)
        s->own[i] = 0;
    return 0;
}

void shard_free(Shard *s)
{
    free(s->doc_rank);
    free(s->doc_first);
    free(s->doc_size);
    free(s->ranges);
    free(s->segs);
    shard_free_ranks(s);
}

static int add_range(Shard *s, int r, int64_t start, int64_t len)
{
    if (len <= 0)
        return 0;
    s->tokens[r] += len;
    int64_t last = s->last_range[r];
    if (last >= 0 && s->ranges[last].start + s->ranges[last].len == start) {
        s->ranges[last].len += len;
        return 0;
    }
    PlanRange *ranges = array_grow(s->ranges, &s->cap_ranges, s->n_ranges + 1, sizeof *ranges);
    if (!ranges)
        return -1;
    s->ranges = ranges;
    s->last_range[r] = s->n_ranges;
    s->ranges[s->n_ranges++] = (PlanRange){r, start, len};
    return 0;
}

/* whole: the segment's document is on rank r alone. */
static int add_segment(Shard *s, const CostModel *cost, int r, int64_t q_start, int64_t q_len, int64_t kv_start,
                       int whole)
{
    if (q_len <= 0)
        return 0;
    PlanSegment *segs = array_grow(s->segs, &s->cap_segs, s->n_segs + 1, sizeof *segs);
    if (!segs)
        return -1;
    s->segs = segs;
    s->segs[s->n_segs++] = (PlanSegment){r, q_start, q_len, kv_start};
    int64_t kv_len = q_start + q_len - kv_start;
    double f, b;
    cost_attn_fb_s(cost, q_len, kv_len, &f, &b);
    s->attn_fwd[r] += f;
    s->attn_bwd[r] += b;
    s->attn[r] += f + b;
    if (whole) {
        s->whole_fwd[r] += f;
        s->whole_bwd[r] += b;
    }
    return 0;
}

/* Rows [start, start + len) on rank r, their queries against keys [kv_start, start + len). The
 * caller keeps the document's group (doc_*) and exchange counters. */
static int shard_piece(Shard *s, const CostModel *cost, int r, int64_t start, int64_t len, int64_t kv_start,
                       int whole)
{
    return add_range(s, r, start, len) != 0 || add_segment(s, cost, r, start, len, kv_start, whole) != 0 ? -1 : 0;
}

/* Document k held whole by rank r: one range, one segment, nothing exchanged. */
int shard_whole(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int r)
{
    s->doc_rank[k] = r;
    s->doc_first[k] = r;
    s->doc_size[k] = 1;
    return shard_piece(s, cost, r, docs[k].start, docs[k].len, docs[k].start, 1);
}

/* Chunk sizes of a document of len tokens cut per_doc: len / 2CP each, and the len mod 2CP leftover
 * tokens one each to the chunks the counter points at, the counter running on across documents
 * (as WLB-LLM's artifact does). Chunk c and chunk 2CP - 1 - c share a rank, so every rank gets one
 * of the first CP leftovers of a cycle and one of the next CP: rank counts differ by at most one,
 * and not at all when the micro-batch is a multiple of 2 CP tokens. */
void shard_per_doc_chunks(int g, int64_t len, int *counter, int64_t *size)
{
    int n = 2 * g;
    for (int c = 0; c < n; c++)
        size[c] = len / n;
    for (int64_t e = 0; e < len % n; e++)
        size[(*counter)++ % n]++;
}

/* Document k sharded per_doc over the g CP ranks first .. first + g - 1 (an aligned block): chunk i
 * and 2 g - 1 - i of it on rank first + i. Each block runs its own leftover counter. */
int shard_per_doc_group(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g)
{
    int64_t size[2 * 1024];
    shard_per_doc_chunks(g, docs[k].len, &s->counter[plan_block_of(s->cp, first, g)], size);
    return shard_chunks(s, cost, docs, k, first, g, size);
}

int shard_chunks(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k, int first, int g,
                 const int64_t *size)
{
    const PlanDoc *d = &docs[k];
    int64_t at = d->start;
    int v = plan_block_of(s->cp, first, g), h = plan_block_depth(v);
    for (int c = 0; c < 2 * g; c++) {
        int r = first + (c < g ? c : 2 * g - 1 - c);
        if (shard_piece(s, cost, r, at, size[c], d->start, g == 1) != 0)
            return -1;
        s->own[r * SHARD_DEPTHS + h] += size[c];
        at += size[c];
    }
    s->doc_rank[k] = -1;
    s->doc_first[k] = first;
    s->doc_size[k] = g;
    s->blk_sharded[v] += d->len;
    s->sharded += d->len;
    return 0;
}

int shard_per_doc(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t k)
{
    return shard_per_doc_group(s, cost, docs, k, 0, s->cp);
}

/* Chunk c is [c T / 2CP, (c + 1) T / 2CP); a document crossing chunks gives one segment per chunk,
 * each with keys from the document's start. */
int shard_per_seq(Shard *s, const CostModel *cost, const PlanDoc *docs, int64_t n_docs, int64_t total)
{
    int n = 2 * s->cp;
    int64_t k = 0;
    for (int c = 0; c < n; c++) {
        int64_t cs = total * c / n, ce = total * (c + 1) / n;
        int r = c < s->cp ? c : n - 1 - c;
        if (add_range(s, r, cs, ce - cs) != 0)
            return -1;
        while (k < n_docs && docs[k].start + docs[k].len <= cs)
            k++;
        for (int64_t j = k; j < n_docs && docs[j].start < ce; j++) {
            int64_t qs = docs[j].start > cs ? docs[j].start : cs;
            int64_t qe = docs[j].start + docs[j].len < ce ? docs[j].start + docs[j].len : ce;
            if (add_segment(s, cost, r, qs, qe - qs, docs[j].start, 0) != 0)
                return -1;
        }
    }
    s->sharded = total;
    s->blk_sharded[1] = total;
    return 0;
}

/* Predicted seconds of one layer, forward + backward, of a rank with this attention time and tokens:
 * attention, GEMMs and element-wise work, TP all-reduces. */
double shard_rank_time_with(const CostModel *cost, double attn, int64_t tokens)
{
    return attn + cost_linear_fwd_s(cost, tokens) + cost_linear_bwd_s(cost, tokens) + 2 * cost_tp_comm_s(cost, tokens);
}

static double rank_time(const Shard *s, const CostModel *cost, int r)
{
    return shard_rank_time_with(cost, s->attn[r], s->tokens[r]);
}

int64_t shard_block_exchange_tokens(const Shard *s, int v)
{
    int g = plan_block_size(s->cp, v), first = plan_block_first(s->cp, v), h = plan_block_depth(v);
    if (!s->uneven[v] || g < 2)
        return s->blk_sharded[v];
    int64_t least = s->blk_sharded[v];
    for (int r = first; r < first + g; r++)
        least = s->own[r * SHARD_DEPTHS + h] < least ? s->own[r * SHARD_DEPTHS + h] : least;
    return ((s->blk_sharded[v] - least) * g + g - 2) / (g - 1);
}

/* Rank r's K/V exchange in one direction: the all-gathers of the blocks above it that hold sharded
 * documents, one after another (*x seconds, *n blocks). */
static void shard_rank_cp_exchange(const Shard *s, const CostModel *cost, int r, double *x, int *n)
{
    *x = 0;
    *n = 0;
    for (int v = (s->cp + r) / 2; v >= 1; v /= 2) {
        int size = plan_block_size(s->cp, v);
        double t = cost_cp_comm_group_s(cost, size, shard_block_exchange_tokens(s, v));
        *x += t;
        *n += t > 0 ? size : 0;
    }
}

void plan_rank_price(PlanRank *pr, const CostModel *cost)
{
    double tp = cost_tp_comm_s(cost, pr->tokens);
    CostCpComm cf, cb;
    double sharded_fwd = pr->attn_fwd_s - pr->whole_fwd_s, sharded_bwd = pr->attn_bwd_s - pr->whole_bwd_s;
    cost_cp_beside(cost, pr->cp_comm_s, pr->n_cp_pieces, pr->whole_fwd_s, sharded_fwd > 0 ? sharded_fwd : 0, 0,
                   &cf);
    /* The backward's dK/dV reductions in bf16 run beside nothing (cost.h: sums_bf16). */
    int bf16 = cost->sums_bf16;
    cost_cp_beside(cost, pr->cp_comm_s, pr->n_cp_pieces, bf16 ? 0 : pr->whole_bwd_s,
                   bf16 || sharded_bwd < 0 ? 0 : sharded_bwd, 1, &cb);
    pr->comm_fwd_s = tp + cf.exposed + cf.contention;
    pr->comm_bwd_s = tp + cb.exposed + cb.contention;
    pr->cp_hidden_fwd_s = cf.hidden;
    pr->cp_hidden_bwd_s = cb.hidden;
}

void plan_price(StepPlan *p, const CostModel *cost)
{
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        PlanMicroBatch *mb = &p->mbs[i];
        mb->fwd_s = mb->bwd_s = 0;
        for (int r = 0; r < p->cp; r++) {
            PlanRank *pr = &p->ranks[mb->first_rank + r];
            plan_rank_price(pr, cost);
            double f = pr->attn_fwd_s + pr->linear_fwd_s + pr->comm_fwd_s;
            double b = pr->attn_bwd_s + pr->linear_bwd_s + pr->comm_bwd_s;
            mb->fwd_s = f > mb->fwd_s ? f : mb->fwd_s;
            mb->bwd_s = b > mb->bwd_s ? b : mb->bwd_s;
        }
    }
}

/* The slowest rank, its group's K/V exchange included: CP ranks meet at every layer. (With one
 * group, the whole CP group, this is the slowest rank's compute plus the group's exchange.) */
double shard_time(const Shard *s, const CostModel *cost)
{
    double worst = 0;
    for (int r = 0; r < s->cp; r++) {
        double x;
        int n;
        shard_rank_cp_exchange(s, cost, r, &x, &n);
        double t = rank_time(s, cost, r) + 2 * x;
        worst = t > worst ? t : worst;
    }
    return worst;
}

/* Rank r's forward and backward seconds per layer, as the plan records them (commit). */
static void rank_fwd_bwd(const Shard *s, const CostModel *cost, int r, double *f, double *b)
{
    PlanRank pr = {.tokens = s->tokens[r], .attn_fwd_s = s->attn_fwd[r], .attn_bwd_s = s->attn_bwd[r],
                   .whole_fwd_s = s->whole_fwd[r], .whole_bwd_s = s->whole_bwd[r]};
    int n;
    shard_rank_cp_exchange(s, cost, r, &pr.cp_comm_s, &n);
    pr.n_cp_pieces = n;
    plan_rank_price(&pr, cost);
    *f = s->attn_fwd[r] + cost_linear_fwd_s(cost, s->tokens[r]) + pr.comm_fwd_s;
    *b = s->attn_bwd[r] + cost_linear_bwd_s(cost, s->tokens[r]) + pr.comm_bwd_s;
}

/* The micro-batch's predicted seconds per layer as the plan records them: the slowest forward and
 * the slowest backward (what the pipeline schedule and the dry run take). */
void shard_mb_times(const Shard *s, const CostModel *cost, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    for (int r = 0; r < s->cp; r++) {
        double f, b;
        rank_fwd_bwd(s, cost, r, &f, &b);
        *fwd = f > *fwd ? f : *fwd;
        *bwd = b > *bwd ? b : *bwd;
    }
}

int shard_fits(const Shard *s, int64_t capacity)
{
    for (int r = 0; r < s->cp; r++)
        if (s->tokens[r] > capacity)
            return 0;
    return 1;
}

int shard_commit(StepPlan *p, PlanMicroBatch *mb, const Shard *s, const CostModel *cost)
{
    for (int64_t k = 0; k < mb->n_docs; k++) {
        PlanDoc *d = &p->docs[mb->first_doc + k];
        d->rank = s->doc_rank[k];
        d->group_first = s->doc_first[k];
        d->group_size = s->doc_size[k];
    }
    mb->first_rank = p->n_ranks;
    mb->sharded_tokens = s->sharded;
    mb->cut_docs = 0;
    for (int v = 1; v < 2 * s->cp; v++)
        mb->cut_docs += s->uneven[v];
    mb->fwd_s = mb->bwd_s = 0;
    for (int r = 0; r < s->cp; r++) {
        int64_t k = plan_add_rank(p);
        if (k < 0)
            return -1;
        PlanRank *pr = &p->ranks[k];
        pr->tokens = s->tokens[r];
        pr->exchanges = 0;
        for (int v = (s->cp + r) / 2; v >= 1; v /= 2)
            if (s->blk_sharded[v] > 0)
                pr->exchanges |= 1u << plan_block_depth(v);
        pr->first_range = p->n_ranges;
        for (int64_t i = 0; i < s->n_ranges; i++)
            if (s->ranges[i].rank == r && plan_add_range(p, r, s->ranges[i].start, s->ranges[i].len) < 0)
                return -1;
        pr->n_ranges = p->n_ranges - pr->first_range;
        pr->first_segment = p->n_segments;
        for (int64_t i = 0; i < s->n_segs; i++) {
            const PlanSegment *g = &s->segs[i];
            if (g->rank == r && plan_add_segment(p, r, g->q_start, g->q_len, g->kv_start) < 0)
                return -1;
        }
        pr->n_segments = p->n_segments - pr->first_segment;
        pr->attn_fwd_s = s->attn_fwd[r];
        pr->attn_bwd_s = s->attn_bwd[r];
        pr->linear_fwd_s = cost_linear_fwd_s(cost, pr->tokens);
        pr->linear_bwd_s = cost_linear_bwd_s(cost, pr->tokens);
        int n;
        shard_rank_cp_exchange(s, cost, r, &pr->cp_comm_s, &n);
        pr->n_cp_pieces = n;
        pr->whole_fwd_s = s->whole_fwd[r];
        pr->whole_bwd_s = s->whole_bwd[r];
        plan_rank_price(pr, cost);
        double f = pr->attn_fwd_s + pr->linear_fwd_s + pr->comm_fwd_s;
        double b = pr->attn_bwd_s + pr->linear_bwd_s + pr->comm_bwd_s;
        mb->fwd_s = f > mb->fwd_s ? f : mb->fwd_s;
        mb->bwd_s = b > mb->bwd_s ? b : mb->bwd_s;
    }
    return 0;
}
