/*
 * engine/model/model_chain.c - a layer's forward after attention, in pieces of rows, with
 * sequence parallelism (model.h "SP"; model_pass.c has the math).
 *
 * Everything from the attention output product to the next layer's QKV product works row by row:
 * a row of the attention output gives a row of y, of b, of the MLP, of the layer's output and of
 * the next layer's normed rows and qkv. So the whole span runs in the pieces of rows that SP deals
 * out (parallel.tp_chunks, model_sp.c), each piece passing five stages, each ending by starting the
 * exchange that the next stage of the piece waits for:
 *
 *   0 out        part = att Wo^T                                start: reduce-scatter part -> y
 *   1 mlp_in     y += x;  b = rmsnorm(y)                        start: all-gather b
 *   2 mlp        gu = b Wgu^T;  s = silu(g) u;  part = s Wdown^T   start: reduce-scatter part -> out
 *   3 residual   out += y;  a' = rmsnorm(out) (next layer)     start: all-gather a'
 *   4 next_qkv   qkv' = a' Wqkv'^T (next layer)
 *
 * The stages run in the wavefront order of util/wavefront.h: piece j's stage s two steps after its
 * stage s - 1, so each exchange runs beside the stages of other pieces - the attention output's
 * reduce-scatter beside the MLP of earlier pieces, the MLP's beside the next pieces' products - and
 * not only beside the pieces of its own product (model_tp.c). The last layer of a chunk stops after
 * stage 3's sum; a recomputation (train.recompute: full) stops after stage 2's s, as its forward
 * does. Every piece runs the products, norms and sums it would run one product at a time, on the
 * same rows (a norm and silu(g) u read a row only): the same bits in any order, overlap on or off.
 *
 * Buffers: part is m->tmp and the gathers land in m->sp_full, each piece on its own rows; a piece
 * writes them again only after the stage that waited for what was there before (stage 2 writes
 * part after stage 1 waited for the reduce-scatter that read it; stage 3 gathers into sp_full after
 * stage 2 read it).
 */
#include "engine/model/model_impl.h"
#include "util/wavefront.h"

enum { STAGE_OUT, STAGE_MLP_IN, STAGE_MLP, STAGE_RESIDUAL, STAGE_NEXT_QKV, N_STAGES };

typedef struct Chain {
    Model *m;
    const ModelChainLayer *in;
    SpPieces p;
    SpExchange ex[N_STAGES - 1]; /* ex[s]: the exchange stage s starts, one request per piece */
} Chain;

/* Stage s of piece j: waits for the exchange of stage s - 1, computes, starts its own. */
static int stage_run(Chain *c, int s, int j, Error *err)
{
    Model *m = c->m;
    const Ops *o = m->ops;
    const ModelChainLayer *in = c->in;
    /* The piece's rows of the products (row, n of them: T's rows, padding left out) and of this
     * rank's stream (own, own_rows of them). */
    int64_t D = m->dims.d, F = m->dims.local_ffn, own_rows = model_sp_piece_rows(&c->p, j);
    int64_t row = model_sp_piece_first(&c->p, j), n = model_sp_piece_real(&c->p, j), own = j * c->p.c;
    float eps = m->dims.norm_eps;
    if (s > 0 && model_comm_wait(m, &c->ex[s - 1].req[j], err) != 0)
        return -1;
    switch (s) {
    case STAGE_OUT:
        if (n > 0)
            o->matmul_fwd(mat_f32(m->tmp + row * D), ops_act(o, in->a->att, row * in->q_width), in->wo, n, in->q_width,
                          D);
        return model_sp_scatter_piece(m, m->tmp, &c->p, j, in->a->y, &c->ex[s].req[j], err);
    case STAGE_MLP_IN:
        o->add(in->a->y + own * D, in->a->y + own * D, in->x + own * D, own_rows * D);
        o->rmsnorm_fwd(ops_act(o, in->a->b, own * D), in->a->rstd2 + own, in->a->y + own * D, in->mlp_norm,
                       own_rows, D, eps);
        return model_sp_gather_piece(m, in->a->b, DT_ACT, &c->p, j, m->sp_full, &c->ex[s].req[j], err);
    case STAGE_MLP:
        if (n > 0) {
            o->matmul_fwd(mat_act(ops_act(o, in->a->gu, row * 2 * F)), ops_act(o, m->sp_full, row * D), in->wgu, n, D,
                          2 * F);
            o->swiglu_fwd(ops_act(o, in->a->s, row * F), ops_act(o, in->a->gu, row * 2 * F), n, F);
        }
        if (!in->out)
            return 0;
        if (n > 0)
            o->matmul_fwd(mat_f32(m->tmp + row * D), ops_act(o, in->a->s, row * F), in->wdown, n, F, D);
        return model_sp_scatter_piece(m, m->tmp, &c->p, j, in->out, &c->ex[s].req[j], err);
    case STAGE_RESIDUAL:
        o->add(in->out + own * D, in->out + own * D, in->a->y + own * D, own_rows * D);
        if (!in->next)
            return 0;
        o->rmsnorm_fwd(ops_act(o, in->next->a, own * D), in->next->rstd1 + own, in->out + own * D, in->next_norm,
                       own_rows, D, eps);
        return model_sp_gather_piece(m, in->next->a, DT_ACT, &c->p, j, m->sp_full, &c->ex[s].req[j], err);
    default: /* STAGE_NEXT_QKV */
        if (n > 0)
            o->matmul_fwd(mat_act(ops_act(o, in->next->qkv, row * in->next_qkv_width)),
                          ops_act(o, m->sp_full, row * D), in->next_wqkv, n, D, in->next_qkv_width);
        return 0;
    }
}

int model_chain_forward(Model *m, const ModelChainLayer *in, int64_t T, Error *err)
{
    Chain c = {m, in, model_sp_pieces(m, T), {{{{0}}}}};
    int stages = !in->out ? STAGE_MLP + 1 : !in->next ? STAGE_RESIDUAL + 1 : N_STAGES;
    int stage[N_STAGES * MODEL_MAX_TP_CHUNKS], piece[N_STAGES * MODEL_MAX_TP_CHUNKS];
    int n = wavefront_order(stages, c.p.n, stage, piece);
    for (int i = 0; i < n; i++)
        if (stage_run(&c, stage[i], piece[i], err) != 0)
            return -1;
    return 0;
}
