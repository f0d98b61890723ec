/* engine/plan/stages.c - the auto split of the layers over the model chunks (see stages.h). */
#include "engine/plan/stages.h"

#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "engine/plan/sched.h"

int stages_typical_costs(const Config *cfg, const CostModel *cost, const DataSource *src, const double *weights,
                         int n, StageCosts *out, Error *err)
{
    DataStream stream;
    Planner pl;
    int64_t window = cfg->data.context_window, cp = cfg->parallel.cp;
    if (data_stream_init(&stream, src, weights, n, (uint64_t)cfg->data.seed, (uint64_t)window, err) != 0)
        return -1;
    /* The planner's rule for documents that straddle a window end (balance.long_documents) sets the
     * stream's; plan_init reads nothing else here. */
    int rc = plan_init(&pl, cfg, NULL, &stream, cfg->balance.packer, cfg->balance.cp_sharding, err);
    double attn_f = 0, attn_b = 0, pairs = 0, tokens = 0;
    while (rc == 0 && tokens < (double)STAGES_SAMPLE_WINDOWS * (double)window) {
        DataPiece piece;
        double f, b;
        data_stream_next(&stream, &piece);
        cost_attn_fb_s(cost, (int64_t)piece.len, (int64_t)piece.len, &f, &b);
        attn_f += f;
        attn_b += b;
        pairs += cost_attn_pairs(cost, (int64_t)piece.len, (int64_t)piece.len);
        tokens += (double)piece.len;
    }
    if (rc == 0) {
        /* One window of the sample's mix, 1 / cp of it on a CP rank. */
        int64_t t = window / cp;
        double share = (double)window / tokens / (double)cp;
        out->layer_fwd_s = attn_f * share + cost_linear_fwd_s(cost, t) + cost_tp_comm_s(cost, t);
        /* The backward's costs hold train.recompute's work (cost.h). */
        out->layer_bwd_s = attn_b * share + cost_linear_bwd_s(cost, t) + cost_tp_comm_s(cost, t);
        out->embed_fwd_s = cost_embed_fwd_s(cost, t);
        out->embed_bwd_s = cost_embed_bwd_s(cost, t);
        out->head_fwd_s = cost_head_fwd_s(cost, t);
        out->head_bwd_s = cost_head_bwd_s(cost, t);
        out->p2p_s = cost_p2p_s(cost, t);
        out->pairs_per_token = pairs / tokens;
        plan_destroy(&pl);
    }
    data_stream_free(&stream);
    return rc;
}

static double layer_s(const StageCosts *c) { return c->layer_fwd_s + c->layer_bwd_s; }

/* The fixed part of chunk g's time (of pp v chunks), forward + backward: the embedding on the
 * first, the output layer on the last. */
static double chunk_extra_s(const StageCosts *c, int chunks, int g)
{
    return (g == 0 ? c->embed_fwd_s + c->embed_bwd_s : 0) + (g == chunks - 1 ? c->head_fwd_s + c->head_bwd_s : 0);
}

double stages_stage_s(const StageCosts *c, int pp, int v, const int64_t *chunk_layers, int s)
{
    double t = 0;
    for (int g = s; g < pp * v; g += pp)
        t += (double)chunk_layers[g] * layer_s(c) + chunk_extra_s(c, pp * v, g);
    return t;
}

/* Stage s's n layers over its v chunks: one each, then one at a time to the chunk whose time is
 * least (ties to the first). */
static void spread(const StageCosts *c, int pp, int v, int s, int n, int64_t *chunk_layers)
{
    int chunks = pp * v;
    for (int g = s; g < chunks; g += pp)
        chunk_layers[g] = 1;
    for (int r = v; r < n; r++) {
        int best = s;
        for (int g = s + pp; g < chunks; g += pp)
            if ((double)chunk_layers[g] * layer_s(c) + chunk_extra_s(c, chunks, g) <
                (double)chunk_layers[best] * layer_s(c) + chunk_extra_s(c, chunks, best))
                best = g;
        chunk_layers[best]++;
    }
}

/* T_s with n layers (its chunks' fixed parts do not depend on how they are spread). */
static double stage_time(const StageCosts *c, int pp, int v, int s, int n)
{
    double extra = 0;
    for (int g = s; g < pp * v; g += pp)
        extra += chunk_extra_s(c, pp * v, g);
    return (double)n * layer_s(c) + extra;
}

int stages_least_slowest(const StageCosts *c, const StageLayout *l, StageFits fits, void *ctx, int64_t *chunk_layers)
{
    int n_layers = l->n_layers, pp = l->pp, v = l->v;
    int most = n_layers - v * (pp - 1), fit_all = 1, room = 0, n[STAGES_MAX], cap[STAGES_MAX];
    WLB_ASSERT(pp <= STAGES_MAX && v * pp <= n_layers); /* config_resolve's rules */
    /* The most layers each stage holds within its memory (it grows with them); the other chunks
     * hold one layer each meanwhile, so every chunk's layers lie within the model. */
    for (int g = 0; g < pp * v; g++)
        chunk_layers[g] = 1;
    for (int s = 0; s < pp; s++) {
        cap[s] = v - 1;
        for (int k = v; k <= most; k++) {
            spread(c, pp, v, s, k, chunk_layers);
            if (fits && !fits(ctx, s, chunk_layers))
                break;
            cap[s] = k;
        }
        spread(c, pp, v, s, v, chunk_layers);
        room += cap[s];
        fit_all &= cap[s] >= v;
    }
    if (!fit_all || room < n_layers) { /* no split fits: place for time alone */
        fit_all = 0;
        for (int s = 0; s < pp; s++)
            cap[s] = most;
    }
    for (int s = 0; s < pp; s++)
        n[s] = v;
    for (int r = pp * v; r < n_layers; r++) {
        int best = -1;
        for (int s = 0; s < pp; s++)
            if (n[s] < cap[s] &&
                (best < 0 || stage_time(c, pp, v, s, n[s] + 1) <= stage_time(c, pp, v, best, n[best] + 1)))
                best = s;
        n[best]++;
    }
    for (int s = 0; s < pp; s++)
        spread(c, pp, v, s, n[s], chunk_layers);
    return fit_all;
}

int stages_step_s(const StageCosts *c, const StageLayout *l, const int64_t *chunk_layers, double *seconds, Error *err)
{
    int chunks = l->pp * l->v;
    size_t n = (size_t)l->m * (size_t)chunks;
    double *fwd = malloc(n * sizeof *fwd), *bwd = malloc(n * sizeof *bwd);
    double *p2p = malloc((size_t)(l->m > 0 ? l->m : 1) * sizeof *p2p);
    if (!fwd || !bwd || !p2p) {
        free(fwd);
        free(bwd);
        free(p2p);
        return error_runtime(err, "parallel.stage_layers", "out of memory");
    }
    for (int k = 0; k < l->m; k++) {
        p2p[k] = c->p2p_s;
        for (int g = 0; g < chunks; g++) {
            double layers = (double)chunk_layers[g];
            fwd[(size_t)k * chunks + g] = layers * c->layer_fwd_s + (g == 0 ? c->embed_fwd_s : 0) +
                                          (g == chunks - 1 ? c->head_fwd_s : 0);
            bwd[(size_t)k * chunks + g] = layers * c->layer_bwd_s + (g == 0 ? c->embed_bwd_s : 0) +
                                          (g == chunks - 1 ? c->head_bwd_s : 0);
        }
    }
    SchedReplica rep = {l->pp, l->v, l->m, fwd, bwd, p2p, 0, NULL}; /* splits compared alike: receives posted ahead */
    int rc = sched_makespan(&rep, seconds, err);
    free(fwd);
    free(bwd);
    free(p2p);
    return rc;
}

int stages_auto(const StageCosts *c, const StageLayout *l, StageFits fits, void *ctx, int64_t *chunk_layers,
                int *all_fit, Error *err)
{
    int chunks = l->pp * l->v, even_fits = 1;
    int64_t even[STAGES_MAX];
    double t_least, t_even;
    *all_fit = stages_least_slowest(c, l, fits, ctx, chunk_layers);
    config_even_layers(l->n_layers, chunks, even);
    for (int s = 0; fits && s < l->pp; s++)
        even_fits &= fits(ctx, s, even) != 0;
    if (stages_step_s(c, l, chunk_layers, &t_least, err) != 0 || stages_step_s(c, l, even, &t_even, err) != 0)
        return -1;
    /* The even split where it fits as well as the other does, and a typical step is as fast. */
    if ((even_fits || !*all_fit) && t_even <= t_least) {
        memcpy(chunk_layers, even, (size_t)chunks * sizeof *even);
        *all_fit = even_fits;
    }
    return 0;
}
