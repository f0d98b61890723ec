/*
 * engine/model/model_chain_bwd.c - the backward between two layers' attention, in pieces of rows,
 * with sequence parallelism (model.h "SP"; model_pass.c has the math, model_chain.c the forward's
 * pipeline).
 *
 * From the QKV product's backward of layer l (upper) to the attention output product's backward of
 * layer l - 1 (lower), everything works row by row: a row of dqkv gives a row of the QKV input
 * gradient, its sum over TP gives a row of d(x) of layer l, which is a row of d(out) of layer l - 1,
 * and on through its MLP and its norm to a row of datt. So that span runs in the pieces of rows
 * SP deals out (parallel.tp_chunks, model_sp.c), each piece passing five stages, each ending by
 * starting the exchange that the piece's next stage waits for:
 *
 *   0 qkv       part = dqkv Wqkv (upper)                       start: reduce-scatter part -> sum
 *               dWqkv += dqkv^T a (a's rows gathered before attention', beside it)
 *   1 norm      dh += rmsnorm'(sum) (upper's first norm)       start: all-gather dh
 *   2 mlp       dWdown += dh^T s;  ds = dh Wdown (lower)       start: all-gather b
 *               dgu = swiglu'(ds);  part = dgu Wgu             start: reduce-scatter part -> sum
 *   3 mlp_norm  dWgu += dgu^T b (once b is in, beside the sums)
 *               dh += rmsnorm'(sum)                            start: all-gather dh
 *   4 out       dWo += dh^T att;  datt = dh Wo
 *
 * The stages run in the wavefront order of util/wavefront.h, as the forward's: the QKV input
 * gradient's reduce-scatter runs beside the lower layer's MLP products of earlier pieces instead of
 * beside the small dWqkv alone, and each gather of dh beside other pieces' products. A chunk's top
 * layer runs stages 1-4 (stage 1 only starts the gather of the head's or the next stage's dh), its
 * first layer stages 0-1 (its d(x) is the chunk's). A piece runs the products, norms and sums the
 * layer-at-a-time backward (model_pass.c, with full recomputation) runs on its rows, the weight
 * gradients taking the pieces' terms in piece order; the order does not depend on parallel.overlap,
 * so the bits are the same with it on or off.
 *
 * Buffers: part is m->tmp, the sums m->sp_part, the gathers m->sp_full, each piece on its own rows;
 * a piece writes one again only after the stage that waited for what was there before (stage 1
 * gathers dh over the gathered a that stage 0 read; stage 2 gathers b over the dh it read; stage 2
 * writes part and sum after stage 1 waited for the exchange that used them).
 */
#include "engine/model/model_impl.h"
#include "util/wavefront.h"

enum { STAGE_QKV, STAGE_NORM, STAGE_MLP, STAGE_MLP_NORM, STAGE_OUT, N_STAGES };

typedef struct ChainBack {
    Model *m;
    const ModelChainBack *in;
    SpPieces p;
    SpExchange ex[N_STAGES - 1]; /* ex[s]: the exchange stage s ends with, one request per piece */
    SpExchange b_gather;         /* stage 2's gather of the lower layer's b */
} ChainBack;

/* Stage s of piece j: waits for what it reads, computes, starts its exchanges. */
static int stage_run(ChainBack *c, int s, int j, Error *err)
{
    Model *m = c->m;
    const Ops *o = m->ops;
    const ModelChainBack *in = c->in;
    const ModelDims *d = &m->dims;
    /* The piece's rows of the products (row, n of them: T's rows, padding left out) and of this
     * rank's stream (own, own_rows of them). */
    int64_t D = d->d, F = d->local_ffn, own_rows = model_sp_piece_rows(&c->p, j);
    int64_t row = model_sp_piece_first(&c->p, j), n = model_sp_piece_real(&c->p, j), own = j * c->p.c;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, Q = lq + 2 * (int64_t)d->local_kv_heads * d->head_dim;
    int up = in->upper, lo = in->upper - 1, i = lo - d->layer_begin;
    const LayerActs *la = lo >= d->layer_begin ? &in->slot->layers[i] : NULL;
    const Act *dout = ops_act(o, m->sp_full, row * D);
    /* What the stage reads from the stage before (stage 3 waits for the sums after dWgu). */
    if (s > 0 && s != STAGE_MLP_NORM && model_comm_wait(m, &c->ex[s - 1].req[j], err) != 0)
        return -1;
    switch (s) {
    case STAGE_QKV:
        if (n > 0)
            o->matmul_bwd_dx(mat_f32(m->tmp + row * D), ops_act(o, m->dqkv, row * Q), model_weight(m, T_WQ, up), n, D,
                             Q);
        if (model_sp_scatter_piece(m, m->tmp, &c->p, j, m->sp_part, &c->ex[s].req[j], err) != 0 ||
            model_comm_wait(m, &in->a_gather->req[j], err) != 0)
            return -1;
        if (n > 0)
            o->matmul_bwd_dw(model_grad(m, T_WQ, up), ops_act(o, m->dqkv, row * Q), ops_act(o, in->a_full, row * D), n,
                             D, Q);
        return 0;
    case STAGE_NORM:
        if (up < d->layer_end) /* d(x) of the upper layer: its first norm's backward */
            o->rmsnorm_bwd(m->dh + own * D, ops_act(o, m->dh_act, own * D), model_grad(m, T_ATTN_NORM, up),
                           m->sp_part + own * D, in->slot->h[up - d->layer_begin] + own * D,
                           model_param(m, T_ATTN_NORM, up), in->slot->layers[up - d->layer_begin].rstd1 + own,
                           own_rows, D);
        if (!la)
            return 0;
        return model_sp_gather_piece(m, m->dh_act, DT_ACT, &c->p, j, m->sp_full, &c->ex[s].req[j], err);
    case STAGE_MLP:
        if (n > 0) {
            o->matmul_bwd_dw(model_grad(m, T_WDOWN, lo), dout, ops_act(o, la->s, row * F), n, F, D);
            o->matmul_bwd_dx(mat_f32(m->g32 + row * F), dout, model_weight(m, T_WDOWN, lo), n, F, D);
        }
        if (model_sp_gather_piece(m, la->b, DT_ACT, &c->p, j, m->sp_full, &c->b_gather.req[j], err) != 0)
            return -1;
        if (n > 0) {
            o->swiglu_bwd(ops_act(o, m->dgu, row * 2 * F), m->g32 + row * F, ops_act(o, la->gu, row * 2 * F), n, F);
            o->matmul_bwd_dx(mat_f32(m->tmp + row * D), ops_act(o, m->dgu, row * 2 * F), model_weight(m, T_WGATE, lo),
                             n, D, 2 * F);
        }
        return model_sp_scatter_piece(m, m->tmp, &c->p, j, m->sp_part, &c->ex[s].req[j], err);
    case STAGE_MLP_NORM:
        if (model_comm_wait(m, &c->b_gather.req[j], err) != 0)
            return -1;
        if (n > 0)
            o->matmul_bwd_dw(model_grad(m, T_WGATE, lo), ops_act(o, m->dgu, row * 2 * F), dout, n, D, 2 * F);
        if (model_comm_wait(m, &c->ex[STAGE_MLP].req[j], err) != 0)
            return -1;
        o->rmsnorm_bwd(m->dh + own * D, ops_act(o, m->dh_act, own * D), model_grad(m, T_MLP_NORM, lo),
                       m->sp_part + own * D, la->y + own * D, model_param(m, T_MLP_NORM, lo), la->rstd2 + own,
                       own_rows, D);
        return model_sp_gather_piece(m, m->dh_act, DT_ACT, &c->p, j, m->sp_full, &c->ex[s].req[j], err);
    default: /* STAGE_OUT */
        if (n > 0) {
            o->matmul_bwd_dw(model_grad(m, T_WO, lo), dout, ops_act(o, la->att, row * lq), n, lq, D);
            o->matmul_bwd_dx(mat_act(ops_act(o, m->datt, row * lq)), dout, model_weight(m, T_WO, lo), n, lq, D);
        }
        return 0;
    }
}

int model_chain_backward(Model *m, const ModelChainBack *in, int64_t T, Error *err)
{
    const ModelDims *d = &m->dims;
    ChainBack c = {m, in, model_sp_pieces(m, T), {{{{0}}}}, {{{0}}}};
    /* The stages this pair of layers has: from the upper layer's QKV product (none above the
     * chunk's top layer) to the lower's attention output product (none below its first layer). */
    int first = in->upper < d->layer_end ? STAGE_QKV : STAGE_NORM;
    int last = in->upper - 1 >= d->layer_begin ? STAGE_OUT : STAGE_NORM;
    int n_stages = last - first + 1;
    int stage[N_STAGES * MODEL_MAX_TP_CHUNKS], piece[N_STAGES * MODEL_MAX_TP_CHUNKS];
    int n = wavefront_order(n_stages, c.p.n, stage, piece);
    for (int k = 0; k < n; k++)
        if (stage_run(&c, first + stage[k], piece[k], err) != 0)
            return -1;
    return 0;
}
