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
 * the exchanges' collectives (below: a piece per rank of the block), largest block first, and in the
 * backward likewise. Every rank of a block builds the same exchanges from the plan, so a block
 * calls its collectives as one, and since each rank goes from its largest block down, a rank that
 * waits in a block waits only on ranks that have finished every larger block they share: nested
 * blocks cannot deadlock. A row belongs to one exchange, so the rows of all exchanges together are
 * at most the micro-batch's: m->xfer and m->xfer2 (2 lkv floats per micro-batch row) hold all of
 * them at once, exchange e at the offset of the exchanges before it, so that every exchange can be
 * in flight at the same time (each on its block's communicator).
 *
 * Pieces and blocks. Each exchange runs as one collective per rank of its block, that rank's rows
 * to every other (a broadcast: an all-gather in which only that rank sends), and the attention of
 * the sharded documents runs key block by key block (ModelBatch.cp_calls, engine/train/
 * batch_blocks.c): first over this rank's own keys, then over each other rank's keys once its piece
 * is in, the blocks' outputs merged by their log-sum-exp (attention_merge) into what one call over
 * all the keys gives. So a piece travels while the blocks of the pieces before it are computed. The
 * backward runs the same blocks grouped by the rank whose keys they read, and each rank's dK, dV
 * shares are reduced onto it (a reduce: the reduce-scatter in which only that rank receives) as
 * soon as its blocks are done, beside the next rank's blocks. Every rank of a block starts the
 * pieces in block order; the whole documents' attention (ModelBatch.n_whole_segs: this rank's rows
 * only) runs beside the pieces in flight, after the forward's start and after the backward's last
 * block. Overlap on or off, the blocks and their order are the same: the same numbers.
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

/* This rank's place in exchange x's block. */
static int block_rank(const Model *m, const CpExchange *x) { return m->comm->layout.cp_rank - x->first; }

/* Where rank s's rows start in exchange x's recv_rows: after the rows of the ranks before it. Its
 * piece of the message starts 2 lkv times that far in (K rows, then V rows, rank after rank). */
static int64_t piece_row(const CpExchange *x, int s)
{
    int64_t row = 0;
    for (int r = 0; r < s; r++)
        row += x->recv_counts[r];
    return row;
}

static int64_t piece_at(const CpExchange *x, int s, int64_t lkv) { return 2 * lkv * piece_row(x, s); }

/* Piece s of exchange e, numbered after the pieces of the exchanges before it (m->cp_req's index). */
static int piece_index(const ModelBatch *b, int e, int s)
{
    int at = 0;
    for (int i = 0; i < e; i++)
        at += b->cp_ex[i].size;
    return at + s;
}

static CommRequest *piece_req(Model *m, const ModelBatch *b, int e, int s)
{
    return &m->cp_req[piece_index(b, e, s)];
}

/* The element counts of a piece of exchange x: rank s's 2 n_s lkv, no other rank's. */
static void piece_counts(const CpExchange *x, int s, int64_t lkv, int64_t *counts)
{
    for (int r = 0; r < x->size; r++)
        counts[r] = r == s ? 2 * x->recv_counts[s] * lkv : 0;
}

/* Starts piece s of exchange e's all-gather: rank s's rows of K and V (packed at xfer + base + its
 * place) to every rank of the block, into xfer2 at the same place. */
static int piece_gather_start(Model *m, const ModelBatch *b, int e, int s, int64_t lkv, int64_t base, Error *err)
{
    const CpExchange *x = &b->cp_ex[e];
    int64_t counts[1024], at = base + piece_at(x, s, lkv);
    LayoutGroup g;
    if (x->recv_counts[s] == 0)
        return 0; /* every rank of the block sees the same counts and skips it */
    if (exchange_group(m, x, &g, err) != 0)
        return -1;
    piece_counts(x, s, lkv, counts);
    double t0 = clock_seconds();
    int rc = comm_iallgatherv(m->comm, g, ops_act(m->ops, (Act *)m->xfer, at), ops_act(m->ops, (Act *)m->xfer2, at),
                              counts, DT_ACT, piece_req(m, b, e, s), err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

/* Waits for piece s of exchange e and places its rows at their micro-batch rows of k_mb, v_mb (this
 * rank's own rows are there already); *placed marks it done. */
static int piece_gather_finish(Model *m, LayerActs *a, const ModelBatch *b, int e, int s, int64_t lkv, int64_t base,
                               char *placed, Error *err)
{
    const Ops *o = m->ops;
    const CpExchange *x = &b->cp_ex[e];
    if (*placed)
        return 0;
    *placed = 1;
    if (model_comm_wait(m, piece_req(m, b, e, s), err) != 0)
        return -1;
    if (s == block_rank(m, x))
        return 0;
    int64_t n = x->recv_counts[s], row = piece_row(x, s);
    const Act *recv = ops_act(o, (Act *)m->xfer2, base + piece_at(x, s, lkv));
    o->copy_rows(a->k_mb, DT_ACT, lkv, x->recv_rows + row, recv, DT_ACT, lkv, NULL, n, lkv);
    o->copy_rows(a->v_mb, DT_ACT, lkv, x->recv_rows + row, ops_act(o, recv, n * lkv), DT_ACT, lkv, NULL, n, lkv);
    return 0;
}

/* Starts piece s of exchange e's reduce-scatter, the transpose of its gather: this rank's shares of
 * dK, dV (dk_mb, dv_mb) at rank s's rows, packed into xfer at the piece's place, summed over the
 * block onto rank s, into xfer2 at the same place. */
static int piece_scatter_start(Model *m, const ModelBatch *b, int e, int s, int64_t lkv, int64_t base, Error *err)
{
    const Ops *o = m->ops;
    const CpExchange *x = &b->cp_ex[e];
    int64_t counts[1024], at = base + piece_at(x, s, lkv), n = x->recv_counts[s], row = piece_row(x, s);
    LayoutGroup g;
    if (n == 0)
        return 0;
    if (exchange_group(m, x, &g, err) != 0)
        return -1;
    o->copy_rows(m->xfer + at, DT_F32, lkv, NULL, m->dk_mb, DT_F32, lkv, x->recv_rows + row, n, lkv);
    o->copy_rows(m->xfer + at + n * lkv, DT_F32, lkv, NULL, m->dv_mb, DT_F32, lkv, x->recv_rows + row, n, lkv);
    piece_counts(x, s, lkv, counts);
    double t0 = clock_seconds();
    int rc = comm_ireduce_scatterv_sum(m->comm, g, m->xfer + at, m->xfer2 + at, counts, m->sum_dt,
                                       piece_req(m, b, e, s), err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

/* The attention of the call's key block: into att_part, merged into att_acc. */
static void block_fwd(Model *m, LayerActs *a, const CpCall *c, AttnShape shape)
{
    const Ops *o = m->ops;
    o->attention_fwd(m->att_part, m->att_part_lse, a->qkv, a->k_mb, a->v_mb, c->segs, c->n_segs, shape);
    o->attention_merge(m->att_acc, m->att_acc_lse, m->att_part, m->att_part_lse, c->segs, c->n_segs, shape, c->first);
}

int model_cp_attention_fwd(Model *m, LayerActs *a, const ModelBatch *b, AttnShape shape, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv, whole = b->n_whole_segs;
    const Act *k = ops_act(o, a->qkv, lq), *v = ops_act(o, a->qkv, lq + lkv);
    char placed[2 * 1024] = {0};
    /* This rank's rows at their micro-batch rows; its pieces packed, K rows then V rows. */
    o->copy_rows(a->k_mb, DT_ACT, lkv, b->mb_row, k, DT_ACT, Q, NULL, b->T, lkv);
    o->copy_rows(a->v_mb, DT_ACT, lkv, b->mb_row, v, DT_ACT, Q, NULL, b->T, lkv);
    for (int e = 0; e < b->n_cp_ex; e++) {
        const CpExchange *x = &b->cp_ex[e];
        int64_t base = exchange_offset(b, e, lkv), at = base + piece_at(x, block_rank(m, x), lkv);
        Act *send = ops_act(o, (Act *)m->xfer, at);
        o->copy_rows(send, DT_ACT, lkv, NULL, k, DT_ACT, Q, x->send_rows, x->n_send, lkv);
        o->copy_rows(ops_act(o, send, x->n_send * lkv), DT_ACT, lkv, NULL, v, DT_ACT, Q, x->send_rows, x->n_send, lkv);
    }
    for (int e = 0; e < b->n_cp_ex; e++)
        for (int s = 0; s < b->cp_ex[e].size; s++)
            if (piece_gather_start(m, b, e, s, lkv, exchange_offset(b, e, lkv), err) != 0)
                return -1;
    /* The documents held whole, beside the pieces; then the sharded ones block by block. */
    if (whole > 0)
        o->attention_fwd(a->att, a->lse, a->qkv, a->k_mb, a->v_mb, b->segs, whole, shape);
    for (int64_t i = 0; i < b->n_cp_calls; i++) {
        const CpCall *c = &b->cp_calls[i];
        if (piece_gather_finish(m, a, b, c->ex, c->src, lkv, exchange_offset(b, c->ex, lkv),
                                &placed[piece_index(b, c->ex, c->src)], err) != 0)
            return -1;
        block_fwd(m, a, c, shape);
    }
    if (b->n_segs > whole)
        o->attention_merge_store(a->att, a->lse, m->att_acc, m->att_acc_lse, b->segs + whole, b->n_segs - whole,
                                 shape);
    /* Every piece is waited for and placed (the backward reads k_mb, v_mb). */
    for (int e = 0; e < b->n_cp_ex; e++)
        for (int s = 0; s < b->cp_ex[e].size; s++)
            if (piece_gather_finish(m, a, b, e, s, lkv, exchange_offset(b, e, lkv), &placed[piece_index(b, e, s)],
                                    err) != 0)
                return -1;
    return 0;
}

int model_cp_attention_bwd(Model *m, LayerActs *a, const ModelBatch *b, float *dqkv, AttnShape shape, Error *err)
{
    const Ops *o = m->ops;
    const ModelDims *d = &m->dims;
    int64_t lq = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t Q = lq + 2 * lkv, whole = b->n_whole_segs;
    float *dk = dqkv + lq, *dv = dqkv + lq + lkv;
    o->zero(m->dk_mb, b->T_mb * lkv);
    o->zero(m->dv_mb, b->T_mb * lkv);
    /* The sharded documents' blocks, rank by rank of each block: a rank's shares go out as soon as
     * every block that reads its keys is done. */
    for (int e = 0; e < b->n_cp_ex; e++)
        for (int s = 0; s < b->cp_ex[e].size; s++) {
            for (int64_t i = 0; i < b->n_cp_calls; i++) {
                const CpCall *c = &b->cp_calls[i];
                if (c->ex == e && c->src == s)
                    o->attention_bwd(dqkv, m->dk_mb, m->dv_mb, m->datt, a->att, a->lse, a->qkv, a->k_mb, a->v_mb,
                                     c->segs, c->n_segs, shape);
            }
            if (piece_scatter_start(m, b, e, s, lkv, exchange_offset(b, e, lkv), err) != 0)
                return -1;
        }
    if (whole > 0)
        o->attention_bwd(dqkv, m->dk_mb, m->dv_mb, m->datt, a->att, a->lse, a->qkv, a->k_mb, a->v_mb, b->segs,
                         whole, shape);
    /* This rank's rows into dqkv's K and V columns; the sharded ones replaced by their sums (its own
     * share included). */
    o->copy_rows(dk, DT_F32, Q, NULL, m->dk_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    o->copy_rows(dv, DT_F32, Q, NULL, m->dv_mb, DT_F32, lkv, b->mb_row, b->T, lkv);
    for (int e = 0; e < b->n_cp_ex; e++) {
        const CpExchange *x = &b->cp_ex[e];
        for (int s = 0; s < x->size; s++)
            if (model_comm_wait(m, piece_req(m, b, e, s), err) != 0)
                return -1;
        const float *sums = m->xfer2 + exchange_offset(b, e, lkv) + piece_at(x, block_rank(m, x), lkv);
        o->copy_rows(dk, DT_F32, Q, x->send_rows, sums, DT_F32, lkv, NULL, x->n_send, lkv);
        o->copy_rows(dv, DT_F32, Q, x->send_rows, sums + x->n_send * lkv, DT_F32, lkv, NULL, x->n_send, lkv);
    }
    return 0;
}
