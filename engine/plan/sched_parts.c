/* engine/plan/sched_parts.c - what a pass costs, part by part, for the pipeline simulator (see
 * sched.h): a micro-batch's per-chunk times, a pass's parts (the time breakdown), the stages' busy
 * seconds. */
#include "engine/plan/sched.h"

#include <stdlib.h>

void sched_micro_batch_times(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, double *fwd,
                             double *bwd, double *p2p)
{
    int chunks = cost->pp * cost->v;
    int64_t max_tokens = 0;
    for (int r = 0; r < p->cp; r++) {
        int64_t t = p->ranks[mb->first_rank + r].tokens;
        max_tokens = t > max_tokens ? t : max_tokens;
    }
    /* mb->bwd_s already holds train.recompute's work (cost_linear_bwd_s, cost_attn_fb_s and the
     * exchanges charge it). */
    double layer_bwd = mb->bwd_s;
    for (int g = 0; g < chunks; g++) {
        int layers = cost_chunk_layers(cost, g);
        fwd[g] = layers * mb->fwd_s;
        bwd[g] = layers * layer_bwd;
        if (g == 0 && max_tokens > 0) {
            fwd[g] += cost_embed_fwd_s(cost, max_tokens);
            bwd[g] += cost_embed_bwd_s(cost, max_tokens);
        }
        if (g == chunks - 1 && max_tokens > 0) {
            fwd[g] += cost_head_fwd_s(cost, max_tokens);
            bwd[g] += cost_head_bwd_s(cost, max_tokens);
        }
    }
    *p2p = cost_p2p_s(cost, max_tokens);
}

void sched_breakdown_add(SchedBreakdown *to, const SchedBreakdown *from, double scale)
{
    /* Every part is a double, one after another (no padding between doubles): added as an array. */
    double *t = &to->products;
    const double *f = &from->products;
    for (size_t k = 0; k < sizeof *to / sizeof(double); k++)
        t[k] += scale * f[k];
}

void sched_pass_parts(const StepPlan *p, const PlanMicroBatch *mb, const CostModel *cost, int g, int backward,
                      SchedBreakdown *b)
{
    /* The rank the pass's time is the slowest CP rank's (shard_commit): its parts. */
    int worst = 0, chunks = cost->pp * cost->v;
    double most = -1;
    int64_t max_tokens = 0;
    for (int r = 0; r < p->cp; r++) {
        const PlanRank *k = &p->ranks[mb->first_rank + r];
        double t = backward ? k->attn_bwd_s + k->linear_bwd_s + k->comm_bwd_s : k->attn_fwd_s + k->linear_fwd_s + k->comm_fwd_s;
        if (t > most) {
            most = t;
            worst = r;
        }
        max_tokens = k->tokens > max_tokens ? k->tokens : max_tokens;
    }
    const PlanRank *k = &p->ranks[mb->first_rank + worst];
    double layers = cost_chunk_layers(cost, g), prod, elem;
    CostTpComm tp;
    cost_linear_split(cost, k->tokens, backward, &prod, &elem);
    cost_tp_comm_parts(cost, k->tokens, &tp);
    /* Each direction is charged the mean of the two (cost_tp_comm_s). */
    double tp_s = cost_tp_comm_s(cost, k->tokens), comm = backward ? k->comm_bwd_s : k->comm_fwd_s;
    b->attention += layers * (backward ? k->attn_bwd_s : k->attn_fwd_s);
    b->products += layers * prod;
    b->elementwise += layers * elem;
    b->tp_exposed += layers * (tp.fwd_exposed + tp.bwd_exposed) / 2;
    b->tp_hidden += layers * tp.hidden / 2;
    b->contention += layers * tp.contention / 2;
    /* The rest of the exchange is CP's: exposed, and the contention of what ran beside the whole
     * documents' attention. */
    double cp_hidden = backward ? k->cp_hidden_bwd_s : k->cp_hidden_fwd_s;
    double cp_contention = cost->hw.comm_sm_share * cp_hidden, cp_exposed = comm - tp_s - cp_contention;
    b->cp_exposed += layers * (cp_exposed > 0 ? cp_exposed : 0);
    b->cp_hidden += layers * cp_hidden;
    b->contention += layers * cp_contention;
    if (g == 0 && max_tokens > 0) {
        double e, c;
        cost_embed_split(cost, max_tokens, backward, &e, &c);
        b->elementwise += e;
        b->tp_exposed += c;
    }
    if (g == chunks - 1 && max_tokens > 0) {
        double hp, he;
        cost_head_split(cost, max_tokens, backward, &hp, &he);
        b->products += hp;
        b->elementwise += he;
    }
}

int sched_stage_busy(const StepPlan *p, const CostModel *cost, double *busy, Error *err)
{
    int chunks = cost->pp * cost->v;
    double *fwd = malloc((size_t)chunks * sizeof *fwd), *bwd = malloc((size_t)chunks * sizeof *bwd), p2p;
    int rc = fwd && bwd ? 0 : error_runtime(err, "pipeline", "out of memory");
    for (int64_t i = 0; rc == 0 && i < (int64_t)p->dp * p->m; i++) {
        sched_micro_batch_times(p, &p->mbs[i], cost, fwd, bwd, &p2p);
        for (int g = 0; g < chunks; g++)
            busy[g % cost->pp] += fwd[g] + bwd[g];
    }
    free(fwd);
    free(bwd);
    return rc;
}
