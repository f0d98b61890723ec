/*
 * engine/model/model_tp.c - the TP products with their exchanges in pieces (parallel.tp_chunks).
 *
 * With sequence parallelism (model_sp.c) each product next to the residual stream has an exchange
 * on its critical path: the all-gather of its input before a column-parallel product (QKV,
 * gate/up), the reduce-scatter of its partial sums after a row-parallel one (attention output,
 * down), the all-gather of the stream's gradient before the row-parallel products' backward. Every
 * row of a product's output reads its own row of the input only, and SP deals the stream's rows out
 * in k = parallel.tp_chunks pieces, each a block of consecutive rows of the T (model_sp.c), so
 * the product splits along the same pieces, one call per piece. The forward from the attention
 * output product to the next layer's QKV product runs its pieces in one pipeline (model_chain.c);
 * what stands alone is here:
 *
 *   gather_product    out = gather(x) W^T (a chunk's first QKV product, a recomputation's). The
 *                     k gathers start at once (the group runs them one after another); piece j is
 *                     multiplied once its gather is in, beside the gathers of the pieces after
 *                     it: only the first piece's gather has nothing beside it.
 *   product_allreduce without SP: part = x W^T all-reduced over TP in place, piece j of the T
 *                     rows while piece j + 1 is multiplied.
 *   gather_backward   dout = gather(dh); dW += dout^T x and dx = dout W piece by piece, each beside
 *                     the gathers of the pieces after it (dW's terms added in row order, as one
 *                     call would).
 *
 * Without SP (tp > 1, sequence_parallel false) only the partial sums are exchanged: piece j is
 * rows [j c, j c + c_j) of the T rows (c = ceil(T / k)).
 *
 * The pieces do not depend on parallel.overlap, which only decides whether a started exchange runs
 * in the background: the products, the sums and their order are the same either way (the same
 * bits). With k = 1 each exchange is one collective and each product one call.
 */
#include "engine/model/model_impl.h"

/* out advanced by i elements (its c too). */
static MatOut mat_at(const Ops *o, MatOut out, int64_t i)
{
    MatOut r = out;
    r.p = out.kind == MAT_ACT ? (void *)ops_act(o, out.p, i) : (void *)((float *)out.p + i);
    if (out.c)
        r.c = out.c + i;
    return r;
}

int model_tp_gather_product(Model *m, MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_out, Error *err)
{
    const Ops *o = m->ops;
    int64_t D = m->dims.d;
    if (!m->dims.sp) {
        o->matmul_fwd(out, x, w, T, D, n_out);
        return 0;
    }
    SpPieces p = model_sp_pieces(m, T);
    SpExchange gather = {{{0}}};
    if (model_sp_gather_start(m, x, DT_ACT, T, m->sp_full, &gather, err) != 0)
        return -1;
    for (int j = 0; j < p.n; j++) {
        int64_t row = model_sp_piece_first(&p, j), n = model_sp_piece_real(&p, j);
        if (model_comm_wait(m, &gather.req[j], err) != 0)
            return -1;
        if (n > 0)
            o->matmul_fwd(mat_at(o, out, row * n_out), ops_act(o, m->sp_full, row * D), w, n, D, n_out);
    }
    return 0;
}

int model_tp_product_allreduce(Model *m, const Act *x, const Act *w, int64_t T, int64_t n_in, Error *err)
{
    const Ops *o = m->ops;
    int64_t D = m->dims.d;
    int64_t k = model_tp_chunks(m), c = (T + k - 1) / k;
    SpExchange sums = {{{0}}};
    for (int j = 0; j * c < T; j++) {
        int64_t row = j * c, n = T - row < c ? T - row : c;
        o->matmul_fwd(mat_f32(m->tmp + row * D), ops_act(o, x, row * n_in), w, n, n_in, D);
        if (model_tp_allreduce(m, m->tmp + row * D, n * D, &sums.req[j], err) != 0)
            return -1;
    }
    return model_sp_wait(m, &sums, err);
}

int model_tp_gather_backward(Model *m, const Act *dh, const Act *x, const Act *w, float *dw, MatOut dx, int64_t T,
                             int64_t n_in, Error *err)
{
    const Ops *o = m->ops;
    int64_t D = m->dims.d;
    if (!m->dims.sp) {
        o->matmul_bwd_dw(dw, dh, x, T, n_in, D);
        o->matmul_bwd_dx(dx, dh, w, T, n_in, D);
        return 0;
    }
    SpPieces p = model_sp_pieces(m, T);
    SpExchange gather = {{{0}}};
    if (model_sp_gather_start(m, dh, DT_ACT, T, m->sp_full, &gather, err) != 0)
        return -1;
    for (int j = 0; j < p.n; j++) {
        int64_t row = model_sp_piece_first(&p, j), n = model_sp_piece_real(&p, j);
        if (model_comm_wait(m, &gather.req[j], err) != 0)
            return -1;
        if (n <= 0)
            continue;
        const Act *dout = ops_act(o, m->sp_full, row * D);
        o->matmul_bwd_dw(dw, dout, ops_act(o, x, row * n_in), n, n_in, D);
        o->matmul_bwd_dx(mat_at(o, dx, row * n_in), dout, w, n, n_in, D);
    }
    return 0;
}
