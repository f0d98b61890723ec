/*
 * engine/model/model_cp.c - the context-parallel K/V exchange (all-gather CP, as Llama 3 trains).
 *
 * A CP rank holds some rows of the micro-batch (ModelBatch.mb_row says which). Its attention
 * segments read keys and values in micro-batch rows: a document placed whole on the rank reads
 * only its own rows; a sharded document reads rows of every CP rank. So before attention each
 * rank writes its own K and V rows into k_mb, v_mb at their micro-batch rows, and the rows of the
 * sharded documents (send_rows) are all-gathered over the CP group and placed at recv_rows. Only
 * sharded rows travel: a micro-batch whose documents are all whole needs no message at all.
 *
 * Backward: attention leaves dK, dV in micro-batch rows (dk_mb, dv_mb), each rank with its own
 * queries' share. A whole document's rows are this rank's alone. A sharded row gets a share from
 * every rank whose queries read it: the shares are reduce-scattered over CP, each rank receiving
 * the sum for its own sharded rows - the transpose of the all-gather.
 *
 * Message layout for CP rank r: its n_r rows of K, then its n_r rows of V (2 n_r lkv elements).
 * The all-gather carries K and V as they are, in the compute dtype (bf16 under train.precision:
 * bf16: half the bytes of float32, and nothing lost, for attention reads that dtype anyway). The
 * reduce-scatter of dK, dV forms sums, so it travels in float32, as attention accumulates them: a
 * share rounded to bf16 before the sum would lose what the float32 sum keeps.
 *
 * With sharding groups a document is sharded over an aligned block of CP ranks, and blocks nest
 * (the tree of plan.h): a rank exchanges in each block above it that holds sharded
 * documents (ModelBatch.cp_ex), each on the block's own communicator (layout_cp_block), carrying
 * only the rows of the documents sharded over exactly that block. The local copy is done once; then
 * one all-gather per exchange, largest block first, and in backward one reduce-scatter per exchange
 * in the same order. Every rank of a block builds the same exchanges from the plan, so a block
 * calls its collectives as one, and since each rank goes from its largest block down, a rank that
 * waits in a block waits only on ranks that have finished every larger block they share: nested
 * blocks cannot deadlock. A row belongs to one exchange, so the rows of all exchanges together are
 * at most the micro-batch's: m->xfer and m->xfer2 (2 lkv floats per micro-batch row) hold all of
 * them at once, exchange e at the offset of the exchanges before it, so that every exchange can be
 * in flight at the same time (each on its block's communicator).
 *
 * Overlap: the exchanges are started (comm_istart) and finished apart. The forward starts them,
 * runs attention over the segments of documents held whole (ModelBatch.n_whole_segs: they read
 * this rank's rows only, placed by the local copy), then finishes them and runs the sharded
 * documents' segments. The backward runs the sharded documents' attention backward first, starts
 * the reduce-scatters of their dK, dV, runs the whole documents' beside them, then finishes. The
 * rows of whole and sharded documents are disjoint: the same numbers as one attention call.
 */
#include "engine/model/model_impl.h"
#include "util/clock.h"

/* Elements each CP rank of exchange x's block contributes, and their total. */
static int64_t exchange_counts(const CpExchange *x, int64_t lkv, int64_t *counts)
{
    int64_t total = 0;
    for (int r = 0; r < x->size; r++) {
        counts[r] = 2 * x->recv_counts[r] * lkv;
        total += counts[r];
    }
    return total;
}

/* The communicator of exchange x's block. */
static int exchange_group(const Model *m, const CpExchange *x, LayoutGroup *g, Error *err)
{
    *g = layout_cp_block(&m->comm->layout, x->size);
    if (!comm_group_made(m->comm, *g) || m->comm->size[*g] != x->size)
        return error_runtime(err, "cp", "no communicator for a block of %d CP ranks (balance.cp_sharding: groups "
                             "makes them at start)", x->size);
    return 0;
}

/* Where exchange e's message sits in xfer and xfer2 (elements): after the exchanges before it. */
static int64_t exchange_offset(const ModelBatch *b, int e, int64_t lkv)
{
    int64_t at = 0, counts[1024];
    for (int i = 0; i < e; i++)
        at += exchange_counts(&b->cp_ex[i], lkv, counts);
    return at;
}

/* Starts exchange x's all-gather: this rank's rows of K and V (from the qkv rows k, v of width Q) to
 * every rank of the block, into xfer2 at `at`. */
static int gather_start(Model *m, const CpExchange *x, const Act *k, const Act *v, int64_t Q, int64_t lkv, int64_t at,
                        CommRequest *req, Error *err)
{
    const Ops *o = m->ops;
    int64_t counts[1024];
    LayoutGroup g;
    if (exchange_counts(x, lkv, counts) == 0)
        return 0;
    if (exchange_group(m, x, &g, err) != 0)
        return -1;
    /* The message travels in the compute dtype (xfer, xfer2 hold it: float32 room is enough). */
    Act *send = ops_act(o, (Act *)m->xfer, at), *recv = ops_act(o, (Act *)m->xfer2, at);
    o->copy_rows(send, DT_ACT, lkv, NULL, k, DT_ACT, Q, x->send_rows, x->n_send, lkv);
    o->copy_rows(ops_act(o, send, x->n_send * lkv), DT_ACT, lkv, NULL, v, DT_ACT, Q, x->send_rows, x->n_send, lkv);
    double t0 = clock_seconds();
    int rc = comm_iallgatherv(m->comm, g, send, recv, counts, DT_ACT, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

/* Finishes exchange x's all-gather: everyone's rows placed at their micro-batch rows of k_mb, v_mb. */
static int gather_finish(Model *m, LayerActs *a, const CpExchange *x, int64_t lkv, int64_t base, CommRequest *req,
                         Error *err)
{
    const Ops *o = m->ops;
    int64_t counts[1024];
    if (exchange_counts(x, lkv, counts) == 0)
        return 0;
    if (model_comm_wait(m, req, err) != 0)
        return -1;
    Act *recv = ops_act(o, (Act *)m->xfer2, base);
    int64_t at = 0, row = 0;
    for (int r = 0; r < x->size; r++) {
        int64_t n = x->recv_counts[r];
        o->copy_rows(a->k_mb, DT_ACT, lkv, x->recv_rows + row, ops_act(o, recv, at), DT_ACT, lkv, NULL, n, lkv);
        o->copy_rows(a->v_mb, DT_ACT, lkv, x->recv_rows + row, ops_act(o, recv, at + n * lkv), DT_ACT, lkv, NULL, n,
                     lkv);
        at += 2 * n * lkv;
        row += n;
    }
    return 0;
}

int model_cp_gather_kv_start(Model *m, LayerActs *a, const ModelBatch *b, CommRequest *reqs, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv;
    const Act *k = ops_act(o, a->qkv, lq), *v = ops_act(o, a->qkv, lq + lkv);
    o->copy_rows(a->k_mb, DT_ACT, lkv, b->mb_row, k, DT_ACT, Q, NULL, b->T, lkv);
    o->copy_rows(a->v_mb, DT_ACT, lkv, b->mb_row, v, DT_ACT, Q, NULL, b->T, lkv);
    for (int e = 0; e < b->n_cp_ex; e++)
        if (gather_start(m, &b->cp_ex[e], k, v, Q, lkv, exchange_offset(b, e, lkv), &reqs[e], err) != 0)
            return -1;
    return 0;
}

int model_cp_gather_kv_finish(Model *m, LayerActs *a, const ModelBatch *b, CommRequest *reqs, Error *err)
{
    int64_t lkv = (int64_t)m->dims.local_kv_heads * m->dims.head_dim;
    for (int e = 0; e < b->n_cp_ex; e++)
        if (gather_finish(m, a, &b->cp_ex[e], lkv, exchange_offset(b, e, lkv), &reqs[e], err) != 0)
            return -1;
    return 0;
}

/* Starts exchange x's reduce-scatter, the transpose of the all-gather: the shares of dK, dV (dk_mb,
 * dv_mb) at the micro-batch rows of the block's exchange, summed over the block, each rank
 * receiving the sums of its own rows into xfer2 at `at`. */
static int scatter_start(Model *m, const CpExchange *x, int64_t lkv, int64_t base, CommRequest *req, Error *err)
{
    const Ops *o = m->ops;
    int64_t counts[1024];
    LayoutGroup g;
    if (exchange_counts(x, lkv, counts) == 0)
        return 0;
    if (exchange_group(m, x, &g, err) != 0)
        return -1;
    float *send = m->xfer + base;
    int64_t at = 0, row = 0;
    for (int r = 0; r < x->size; r++) {
        int64_t n = x->recv_counts[r];
        o->copy_rows(send + at, DT_F32, lkv, NULL, m->dk_mb, DT_F32, lkv, x->recv_rows + row, n, lkv);
        o->copy_rows(send + at + n * lkv, DT_F32, lkv, NULL, m->dv_mb, DT_F32, lkv, x->recv_rows + row, n, lkv);
        at += 2 * n * lkv;
        row += n;
    }
    double t0 = clock_seconds();
    int rc = comm_ireduce_scatterv_sum(m->comm, g, send, m->xfer2 + base, counts, m->sum_dt, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

/* Finishes it: the sums of this rank's rows (its own share included: they replace what the local
 * copy wrote there) into dqkv's K and V columns (dk, dv; width Q). */
static int scatter_finish(Model *m, const CpExchange *x, float *dk, float *dv, int64_t Q, int64_t lkv, int64_t base,
                          CommRequest *req, Error *err)
{
    const Ops *o = m->ops;
    int64_t counts[1024];
    if (exchange_counts(x, lkv, counts) == 0)
        return 0;
    if (model_comm_wait(m, req, err) != 0)
        return -1;
    const float *sums = m->xfer2 + base;
    o->copy_rows(dk, DT_F32, Q, x->send_rows, sums, DT_F32, lkv, NULL, x->n_send, lkv);
    o->copy_rows(dv, DT_F32, Q, x->send_rows, sums + x->n_send * lkv, DT_F32, lkv, NULL, x->n_send, lkv);
    return 0;
}

int model_cp_scatter_dkv_start(Model *m, const ModelBatch *b, CommRequest *reqs, Error *err)
{
    int64_t lkv = (int64_t)m->dims.local_kv_heads * m->dims.head_dim;
    for (int e = 0; e < b->n_cp_ex; e++)
        if (scatter_start(m, &b->cp_ex[e], lkv, exchange_offset(b, e, lkv), &reqs[e], err) != 0)
            return -1;
    return 0;
}

int model_cp_scatter_dkv_finish(Model *m, float *dqkv, const ModelBatch *b, CommRequest *reqs, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv;
    float *dk = dqkv + lq, *dv = dqkv + lq + lkv;
    o->copy_rows(dk, DT_F32, Q, NULL, m->dk_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    o->copy_rows(dv, DT_F32, Q, NULL, m->dv_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    for (int e = 0; e < b->n_cp_ex; e++)
        if (scatter_finish(m, &b->cp_ex[e], dk, dv, Q, lkv, exchange_offset(b, e, lkv), &reqs[e], err) != 0)
            return -1;
    return 0;
}
