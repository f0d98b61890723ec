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
 * Message layout for CP rank r: its n_r rows of K, then its n_r rows of V (2 n_r lkv floats; K and
 * V are converted from the compute dtype to float32 for the message, which is exact).
 *
 * With sharding groups the exchange runs inside the rank's group (ModelBatch.cp_first, cp_size): an
 * aligned block of CP ranks with its own communicator (layout_cp_block), over which the group's
 * documents are sharded; a group of one exchanges nothing. Every rank of a block builds the same
 * counts from the plan, so a block calls its collective, or not, as one.
 */
#include "engine/model/model_impl.h"
#include "util/clock.h"

/* Elements each CP rank of the group contributes, and their total (0 for a group of one). */
static int64_t exchange_counts(const ModelBatch *b, int64_t lkv, int64_t *counts)
{
    int64_t total = 0;
    for (int r = 0; r < b->cp_size && b->cp_size > 1; r++) {
        counts[r] = 2 * b->recv_counts[r] * lkv;
        total += counts[r];
    }
    return total;
}

/* The communicator of the rank's exchange group. */
static int exchange_group(const Model *m, const ModelBatch *b, LayoutGroup *g, Error *err)
{
    *g = layout_cp_block(&m->comm->layout, b->cp_size);
    if (!comm_group_made(m->comm, *g) || m->comm->size[*g] != b->cp_size)
        return error_runtime(err, "cp", "no communicator for a group of %d CP ranks (balance.cp_sharding: groups "
                             "makes them at start)", b->cp_size);
    return 0;
}

int model_cp_gather_kv(Model *m, LayerActs *a, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv, counts[1024];
    const Act *k = ops_act(o, a->qkv, lq), *v = ops_act(o, a->qkv, lq + lkv);
    o->copy_rows(a->k_mb, DT_ACT, lkv, b->mb_row, k, DT_ACT, Q, NULL, b->T, lkv);
    o->copy_rows(a->v_mb, DT_ACT, lkv, b->mb_row, v, DT_ACT, Q, NULL, b->T, lkv);
    LayoutGroup g;
    if (exchange_counts(b, lkv, counts) == 0)
        return 0;
    if (exchange_group(m, b, &g, err) != 0)
        return -1;
    /* The message travels in float32 (exact for the compute dtype). */
    o->copy_rows(m->xfer, DT_F32, lkv, NULL, k, DT_ACT, Q, b->send_rows, b->n_send, lkv);
    o->copy_rows(m->xfer + b->n_send * lkv, DT_F32, lkv, NULL, v, DT_ACT, Q, b->send_rows, b->n_send, lkv);
    double t0 = clock_seconds();
    int rc = comm_allgatherv(m->comm, g, m->xfer, m->xfer2, counts, err);
    m->comm_s += clock_seconds() - t0;
    if (rc != 0)
        return -1;
    int64_t at = 0, row = 0;
    for (int r = 0; r < b->cp_size; r++) {
        int64_t n = b->recv_counts[r];
        o->copy_rows(a->k_mb, DT_ACT, lkv, b->recv_rows + row, m->xfer2 + at, DT_F32, lkv, NULL, n, lkv);
        o->copy_rows(a->v_mb, DT_ACT, lkv, b->recv_rows + row, m->xfer2 + at + n * lkv, DT_F32, lkv, NULL, n, lkv);
        at += 2 * n * lkv;
        row += n;
    }
    return 0;
}

int model_cp_scatter_dkv(Model *m, float *dqkv, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv, counts[1024];
    float *dk = dqkv + lq, *dv = dqkv + lq + lkv;
    o->copy_rows(dk, DT_F32, Q, NULL, m->dk_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    o->copy_rows(dv, DT_F32, Q, NULL, m->dv_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    LayoutGroup g;
    if (exchange_counts(b, lkv, counts) == 0)
        return 0;
    if (exchange_group(m, b, &g, err) != 0)
        return -1;
    int64_t at = 0, row = 0;
    for (int r = 0; r < b->cp_size; r++) {
        int64_t n = b->recv_counts[r];
        o->copy_rows(m->xfer + at, DT_F32, lkv, NULL, m->dk_mb, DT_F32, lkv, b->recv_rows + row, n, lkv);
        o->copy_rows(m->xfer + at + n * lkv, DT_F32, lkv, NULL, m->dv_mb, DT_F32, lkv, b->recv_rows + row, n, lkv);
        at += 2 * n * lkv;
        row += n;
    }
    double t0 = clock_seconds();
    int rc = comm_reduce_scatterv(m->comm, g, m->xfer, m->xfer2, counts, err);
    m->comm_s += clock_seconds() - t0;
    if (rc != 0)
        return -1;
    o->copy_rows(dk, DT_F32, Q, b->send_rows, m->xfer2, DT_F32, lkv, NULL, b->n_send, lkv);
    o->copy_rows(dv, DT_F32, Q, b->send_rows, m->xfer2 + b->n_send * lkv, DT_F32, lkv, NULL, b->n_send, lkv);
    return 0;
}
