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
 * Message layout for CP rank r: its n_r rows of K, then its n_r rows of V (2 n_r lkv floats).
 */
#include "engine/model/model_impl.h"
#include "util/clock.h"

/* Elements each CP rank contributes, and their total. */
static int64_t exchange_counts(const Model *m, const ModelBatch *b, int64_t *counts)
{
    int64_t lkv = (int64_t)m->dims.local_kv_heads * m->dims.head_dim, total = 0;
    for (int r = 0; r < m->dims.cp; r++) {
        counts[r] = 2 * b->recv_counts[r] * lkv;
        total += counts[r];
    }
    return total;
}

int model_cp_gather_kv(Model *m, LayerActs *a, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    int64_t lkv = (int64_t)m->dims.local_kv_heads * m->dims.head_dim, counts[1024];
    o->scatter_rows(a->k_mb, b->mb_row, a->k, b->T, lkv);
    o->scatter_rows(a->v_mb, b->mb_row, a->v, b->T, lkv);
    if (exchange_counts(m, b, counts) == 0)
        return 0;
    o->gather_rows(m->xfer, a->k, b->send_rows, b->n_send, lkv);
    o->gather_rows(m->xfer + b->n_send * lkv, a->v, b->send_rows, b->n_send, lkv);
    double t0 = clock_seconds();
    int rc = comm_allgatherv(m->comm, GROUP_CP, m->xfer, m->xfer2, counts, err);
    m->comm_s += clock_seconds() - t0;
    if (rc != 0)
        return -1;
    int64_t at = 0, row = 0;
    for (int r = 0; r < m->dims.cp; r++) {
        int64_t n = b->recv_counts[r];
        o->scatter_rows(a->k_mb, b->recv_rows + row, m->xfer2 + at, n, lkv);
        o->scatter_rows(a->v_mb, b->recv_rows + row, m->xfer2 + at + n * lkv, n, lkv);
        at += 2 * n * lkv;
        row += n;
    }
    return 0;
}

int model_cp_scatter_dkv(Model *m, const ModelBatch *b, Error *err)
{
    const Ops *o = m->ops;
    int64_t lkv = (int64_t)m->dims.local_kv_heads * m->dims.head_dim, counts[1024];
    o->gather_rows(m->dk, m->dk_mb, b->mb_row, b->T, lkv);
    o->gather_rows(m->dv, m->dv_mb, b->mb_row, b->T, lkv);
    if (exchange_counts(m, b, counts) == 0)
        return 0;
    int64_t at = 0, row = 0;
    for (int r = 0; r < m->dims.cp; r++) {
        int64_t n = b->recv_counts[r];
        o->gather_rows(m->xfer + at, m->dk_mb, b->recv_rows + row, n, lkv);
        o->gather_rows(m->xfer + at + n * lkv, m->dv_mb, b->recv_rows + row, n, lkv);
        at += 2 * n * lkv;
        row += n;
    }
    double t0 = clock_seconds();
    int rc = comm_reduce_scatterv(m->comm, GROUP_CP, m->xfer, m->xfer2, counts, err);
    m->comm_s += clock_seconds() - t0;
    if (rc != 0)
        return -1;
    o->scatter_rows(m->dk, b->send_rows, m->xfer2, b->n_send, lkv);
    o->scatter_rows(m->dv, b->send_rows, m->xfer2 + b->n_send * lkv, b->n_send, lkv);
    return 0;
}
