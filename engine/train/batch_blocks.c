/*
 * engine/train/batch_blocks.c - the sharded documents' attention of one micro-batch on one CP rank,
 * cut into calls over key blocks (ModelBatch.cp_calls; engine/model/model_cp.c runs them).
 *
 * A query segment of a sharded document (its queries: this rank's rows [q, q + q_len) of the
 * micro-batch; its keys: [kv_row, q + q_len)) sees keys that lie on several CP ranks of the
 * document's block. The keys of rank s are its ranges of the micro-batch (PlanRange: consecutive
 * rows), so the keys of s the segment sees are runs: each range cut to [kv_row, q) - wholly before
 * the queries, every query sees every key (a `full` segment) - and, on this rank, the range that
 * holds the queries themselves cut to [kv_row, q + q_len): the diagonal block, causal at its end.
 * Attention over all of a segment's keys is the log-sum-exp merge of its attention over each run
 * (engine/ops.h: attention_merge), so a run can be computed as soon as its rank's rows are in.
 *
 * The calls: per exchange (the order of ModelBatch.cp_ex), this rank's runs first - call 0 holds
 * every segment's diagonal block (each segment has exactly one; `first`), the next calls its other
 * runs, the k-th of each segment in call k - then the other ranks of the block in block order, the
 * k-th run of each segment in their k-th call. A call holds a segment at most once, so its query
 * rows are disjoint, as one attention call needs.
 */
#include "engine/train/batch.h"


#include "util/array.h"

/* Room for n_calls calls and n_segs segments; 0, or -1 out of memory. */
static int grow(BatchBuffers *bb, int64_t n_calls, int64_t n_segs)
{
    CpCall *c = array_grow(bb->cp_calls, &bb->cap_calls, n_calls, sizeof *c);
    if (c)
        bb->cp_calls = c;
    AttnSegment *g = array_grow(bb->block_segs, &bb->cap_block_segs, n_segs, sizeof *g);
    if (g)
        bb->block_segs = g;
    return c && g ? 0 : -1;
}

/* Run k (0: the first) of segment g among the keys of CP rank `src` (its ranges): 1 and the run in
 * *run, or 0 when it has fewer. own: src is this rank, whose run holding the queries - the diagonal
 * block - comes first. */
static int nth_run(const StepPlan *p, const PlanRank *src, const AttnSegment *g, int own, int k, AttnSegment *run)
{
    int64_t q = g->kv_row + g->kv_len - g->q_len, end = g->kv_row + g->kv_len;
    int seen = 0;
    for (int pass = 0; pass < 2; pass++) /* own: the diagonal block, then the rest */
        for (int64_t r = 0; r < src->n_ranges; r++) {
            const PlanRange *rg = &p->ranges[src->first_range + r];
            int64_t a = rg->start > g->kv_row ? rg->start : g->kv_row;
            int64_t diag = own && rg->start <= q && q < rg->start + rg->len;
            if ((pass == 0) != (diag != 0) || (pass == 0 && !own))
                continue;
            int64_t b = rg->start + rg->len, lim = diag ? end : q;
            b = b < lim ? b : lim;
            if (a >= b)
                continue;
            if (seen++ == k) {
                *run = (AttnSegment){g->q_row, g->q_len, a, b - a, !diag};
                return 1;
            }
        }
    return 0;
}

int batch_cp_blocks(BatchBuffers *bb, const StepPlan *p, const PlanMicroBatch *mb, int rank, const int64_t *blk,
                    ModelBatch *out, Error *err)
{
    /* Each call's segments follow the previous call's in block_segs (segs set at the end: the
     * array may move as it grows). */
    int64_t n_calls = 0, n_segs = 0;
    for (int e = 0; e < out->n_cp_ex; e++) {
        const CpExchange *x = &out->cp_ex[e];
        int64_t v = plan_block_of(p->cp, x->first, x->size);
        int me = rank - x->first;
        for (int i = 0; i < x->size; i++) {
            int s = i == 0 ? me : i <= me ? i - 1 : i; /* this rank first, then the others in order */
            const PlanRank *src = &p->ranks[mb->first_rank + x->first + s];
            for (int k = 0;; k++) {
                int64_t first_seg = n_segs;
                for (int64_t j = out->n_whole_segs; j < out->n_segs; j++) {
                    const AttnSegment *g = &out->segs[j];
                    AttnSegment run;
                    if (blk[g->kv_row] != v || !nth_run(p, src, g, s == me, k, &run))
                        continue;
                    if (grow(bb, n_calls + 1, n_segs + 1) != 0)
                        return error_runtime(err, "batch", "out of memory");
                    bb->block_segs[n_segs++] = run;
                }
                if (n_segs == first_seg)
                    break;
                bb->cp_calls[n_calls++] = (CpCall){.ex = e, .src = s, .first = s == me && k == 0,
                                                   .n_segs = n_segs - first_seg};
            }
        }
    }
    for (int64_t c = 0, at = 0; c < n_calls; at += bb->cp_calls[c++].n_segs)
        bb->cp_calls[c].segs = bb->block_segs + at;
    out->cp_calls = bb->cp_calls;
    out->n_cp_calls = n_calls;
    return 0;
}
