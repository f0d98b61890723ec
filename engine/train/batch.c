/* engine/train/batch.c - one micro-batch's model inputs (see batch.h). */
#include "engine/train/batch.h"

#include <stdlib.h>
#include <string.h>

#include "util/array.h"

/* 1 when the piece ends its document (its last token has no target). */
static int ends_document(const PlanDoc *d, const DataSources *data)
{
    return d->offset + (uint64_t)d->len >= data_source_doc_len(&data->src[d->source], d->doc);
}

int64_t batch_step_targets(const StepPlan *p, const DataSources *data)
{
    int64_t n = 0;
    for (int64_t k = 0; k < p->n_docs; k++)
        if (p->docs[k].source != PLAN_PAD_SOURCE)
            n += p->docs[k].len - ends_document(&p->docs[k], data);
    return n;
}

/* Room for T micro-batch rows on the host (tokens, targets, positions side by side in one array)
 * and `rows` rows in the backend - at least one: a CP rank may hold no row of a micro-batch, and
 * the copies to the backend still need somewhere to point. */
static int reserve(BatchBuffers *bb, int64_t T, int64_t rows, Error *err)
{
    rows = rows > 0 ? rows : 1;
    if (3 * (T + 1) > bb->cap) {
        int32_t *host = array_grow(bb->tokens, &bb->cap, 3 * (T + 1), sizeof *host);
        if (!host)
            return error_runtime(err, "batch", "out of memory");
        bb->tokens = host;
    }
    bb->targets = bb->tokens + (T + 1);
    bb->positions = bb->tokens + 2 * (T + 1);
    if (rows > bb->d_cap) {
        const Ops *o = bb->ops;
        o->free(bb->d_tokens);
        o->free(bb->d_targets);
        o->free(bb->d_positions);
        bb->d_tokens = o->alloc((size_t)rows * sizeof(int32_t));
        bb->d_targets = o->alloc((size_t)rows * sizeof(int32_t));
        bb->d_positions = o->alloc((size_t)rows * sizeof(int32_t));
        if (!bb->d_tokens || !bb->d_targets || !bb->d_positions) {
            bb->d_cap = 0;
            return error_runtime(err, "batch", "out of memory");
        }
        bb->d_cap = rows;
    }
    return 0;
}

/* Room for n entries of the backend's index array. */
static int reserve_index(BatchBuffers *bb, int64_t n, Error *err)
{
    if (n <= bb->d_cap_index)
        return 0;
    bb->ops->free(bb->d_index);
    if (!(bb->d_index = bb->ops->alloc((size_t)n * sizeof *bb->d_index))) {
        bb->d_cap_index = 0;
        return error_runtime(err, "batch", "out of memory");
    }
    bb->d_cap_index = n;
    return 0;
}

/* A CP rank sends at most its own rows and receives at most the micro-batch's: the index array of
 * batch_cp_blocks is at most 2 rank_rows + mb_tokens + 1. */
int batch_reserve(BatchBuffers *bb, int64_t mb_tokens, int64_t rank_rows, int cp, Error *err)
{
    if (reserve(bb, mb_tokens, rank_rows, err) != 0)
        return -1;
    return cp > 1 ? reserve_index(bb, 2 * rank_rows + mb_tokens + 1, err) : 0;
}

/* Tokens, targets and positions of one piece at micro-batch row d->start. */
static int read_piece(BatchBuffers *bb, const PlanDoc *d, const DataSources *data, int64_t vocab, Error *err)
{
    int32_t *tok = bb->tokens + d->start, *tgt = bb->targets + d->start, *pos = bb->positions + d->start;
    if (d->source == PLAN_PAD_SOURCE) {
        for (int64_t i = 0; i < d->len; i++) {
            tok[i] = 0;
            tgt[i] = -1;
            pos[i] = (int32_t)i;
        }
        return 0;
    }
    const DataIdx *idx = &data->idx[d->source];
    int last = ends_document(d, data);
    /* Read one token more when the document goes on: it is the last token's target. The target
     * row reads it into tgt, the tokens into tok. */
    if (data_idx_read_tokens(idx, d->doc, d->offset, (uint64_t)d->len, tok, err) != 0)
        return -1;
    if (!last && data_idx_read_tokens(idx, d->doc, d->offset + (uint64_t)d->len, 1, &tgt[d->len - 1], err) != 0)
        return -1;
    for (int64_t i = 0; i < d->len; i++) {
        if (tok[i] < 0 || tok[i] >= vocab)
            return error_set(err, idx->prefix, "document %llu has token id %d, outside model.vocab_size (%lld)",
                             (unsigned long long)d->doc, tok[i], (long long)vocab);
        if (i + 1 < d->len)
            tgt[i] = tok[i + 1];
        pos[i] = (int32_t)(d->offset + (uint64_t)i);
    }
    if (last)
        tgt[d->len - 1] = -1;
    else if (tgt[d->len - 1] < 0 || tgt[d->len - 1] >= vocab)
        return error_set(err, idx->prefix, "document %llu has token id %d, outside model.vocab_size (%lld)",
                         (unsigned long long)d->doc, tgt[d->len - 1], (long long)vocab);
    return 0;
}

/* The K/V exchanges of micro-batch mb for CP rank `rank` (ModelBatch's CP fields): this rank's rows
 * in micro-batch coordinates, and one exchange per block above it that holds sharded documents
 * (bit h of its PlanRank.exchanges: its block of cp >> h ranks), largest first - the order every
 * rank of a block calls the block's collectives in. An exchange carries the rows of the documents
 * sharded over exactly its block: what every rank of the block sends, in CP rank order and each
 * rank's own row order, the order all of them agree on. A document sharded over a block lies on its
 * ranks only, so each of its rows travels in one exchange. */
/* The segments of documents held whole (blk 0 at their key rows) first, then those of sharded
 * documents, each part in the plan's order (ModelBatch.n_whole_segs): the forward runs the first
 * part beside the K/V exchange. A document's segments stay together and in order, and no row is
 * read by both parts, so attention computes the same numbers either way. */
static int whole_first(BatchBuffers *bb, ModelBatch *out, const int64_t *blk, Error *err)
{
    int64_t n = out->n_segs, w = 0;
    AttnSegment *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!tmp)
        return error_runtime(err, "batch", "out of memory");
    for (int pass = 0; pass < 2; pass++)
        for (int64_t s = 0; s < n; s++)
            if ((blk[bb->segs[s].kv_row] == 0) == (pass == 0))
                tmp[w++] = bb->segs[s];
    for (int64_t s = 0; s < n; s++)
        out->n_whole_segs -= blk[bb->segs[s].kv_row] != 0;
    memcpy(bb->segs, tmp, (size_t)n * sizeof *tmp);
    free(tmp);
    return 0;
}

static int cp_exchange(BatchBuffers *bb, const StepPlan *p, const PlanMicroBatch *mb, int rank, ModelBatch *out,
                       Error *err)
{
    const PlanRank *own = &p->ranks[mb->first_rank + rank];
    int cp = p->cp;
    int64_t T_mb = mb->tokens, need = 3 * T_mb + own->tokens + 1;
    if (need > bb->cap_index) {
        int64_t *ix = array_grow(bb->index, &bb->cap_index, need, sizeof *ix);
        if (!ix)
            return error_runtime(err, "batch", "out of memory");
        bb->index = ix;
    }
    /* recv_counts: the blocks' sizes one after the other, cp + cp / 2 + ... < 2 cp. */
    if (2 * (int64_t)cp > bb->cap_counts) {
        int64_t *c = array_grow(bb->recv_counts, &bb->cap_counts, 2 * (int64_t)cp, sizeof *c);
        if (!c)
            return error_runtime(err, "batch", "out of memory");
        bb->recv_counts = c;
    }
    /* Host arrays: mb_row (own->tokens), send_rows (own->tokens over all exchanges: each row in one
     * at most), recv_rows (T_mb likewise), and per micro-batch row the block its document is sharded
     * over (plan.h's tree of blocks; 0: held whole, or on one rank - nothing travels). */
    int64_t *mb_row = bb->index, *send_rows = mb_row + own->tokens, *recv_rows = send_rows + own->tokens;
    int64_t *blk = recv_rows + T_mb;
    for (int64_t k = 0; k < mb->n_docs; k++) {
        const PlanDoc *d = &p->docs[mb->first_doc + k];
        int64_t v = 0;
        if (d->rank < 0 && d->group_size != 1) {
            int first = d->group_first, size = d->group_size;
            if (size < 1 || first < 0 || first % size != 0 || first + size > cp ||
                plan_block_size(cp, plan_block_of(cp, first, size)) != size)
                return error_runtime(err, "batch", "a document of micro-batch %lld is sharded over CP ranks [%d, %d), "
                                     "not a block of %d CP ranks", (long long)(mb - p->mbs), first, first + size, cp);
            v = plan_block_of(cp, first, size);
        }
        for (int64_t t = d->start; t < d->start + d->len; t++)
            blk[t] = v;
    }
    /* This rank's rows; each of a sharded document must travel in one of its exchanges. */
    int64_t local = 0;
    for (int64_t g = 0; g < own->n_ranges; g++) {
        const PlanRange *rg = &p->ranges[own->first_range + g];
        for (int64_t t = rg->start; t < rg->start + rg->len; t++) {
            mb_row[local++] = t;
            int v = (int)blk[t], size = v ? plan_block_size(cp, v) : cp;
            if (v && (v != plan_block_of(cp, rank - rank % size, size) || !((own->exchanges >> plan_block_depth(v)) & 1)))
                return error_runtime(err, "batch", "CP rank %d holds micro-batch row %lld of a document sharded "
                                     "over a block it does not exchange in", rank, (long long)t);
        }
    }
    if (whole_first(bb, out, blk, err) != 0)
        return -1;
    /* The exchanges, largest block first; where each one's rows start in send_rows and recv_rows. */
    int64_t n_recv = 0, n_send = 0, n_counts = 0, send_at[MODEL_MAX_CP_EXCHANGES], recv_at[MODEL_MAX_CP_EXCHANGES];
    out->n_cp_ex = 0;
    for (int h = 0; h < 32; h++) {
        if (!((own->exchanges >> h) & 1))
            continue;
        int size = cp >> h;
        if (size < 2 || out->n_cp_ex == MODEL_MAX_CP_EXCHANGES)
            return error_runtime(err, "batch", "CP rank %d: exchange bit %d names no block of 2 or more of %d CP ranks",
                                 rank, h, cp);
        int first = rank - rank % size;
        int64_t v = plan_block_of(cp, first, size), *counts = bb->recv_counts + n_counts;
        send_at[out->n_cp_ex] = n_send;
        recv_at[out->n_cp_ex] = n_recv;
        for (int r = first; r < first + size; r++) {
            const PlanRank *pr = &p->ranks[mb->first_rank + r];
            int64_t row = 0; /* rank r's local row */
            counts[r - first] = 0;
            for (int64_t g = 0; g < pr->n_ranges; g++) {
                const PlanRange *rg = &p->ranges[pr->first_range + g];
                for (int64_t t = rg->start; t < rg->start + rg->len; t++, row++) {
                    if (blk[t] != v)
                        continue;
                    recv_rows[n_recv++] = t;
                    counts[r - first]++;
                    if (r == rank)
                        send_rows[n_send++] = row;
                }
            }
        }
        if (n_recv == recv_at[out->n_cp_ex])
            continue; /* no row sharded over the block: every rank of it sees the same and skips it */
        int e = out->n_cp_ex++;
        out->cp_ex[e] = (CpExchange){.first = first, .size = size, .n_send = n_send - send_at[e], .recv_counts = counts};
        n_counts += size;
    }
    /* Backend copy: mb_row, send_rows, recv_rows side by side. */
    int64_t n = 2 * own->tokens + n_recv + 1;
    if (reserve_index(bb, n, err) != 0)
        return -1;
    int64_t *d = bb->d_index;
    bb->ops->to_device(d, mb_row, (size_t)own->tokens * sizeof *d);
    bb->ops->to_device(d + own->tokens, send_rows, (size_t)n_send * sizeof *d);
    bb->ops->to_device(d + 2 * own->tokens, recv_rows, (size_t)n_recv * sizeof *d);
    for (int e = 0; e < out->n_cp_ex; e++) {
        out->cp_ex[e].send_rows = d + own->tokens + send_at[e];
        out->cp_ex[e].recv_rows = d + 2 * own->tokens + recv_at[e];
    }
    out->T_mb = T_mb;
    out->mb_row = d;
    return batch_cp_blocks(bb, p, mb, rank, blk, out, err);
}

int batch_build(BatchBuffers *bb, const StepPlan *p, int64_t i, int rank, const DataSources *data, int64_t vocab,
                ModelBatch *out, Error *err)
{
    const PlanMicroBatch *mb = &p->mbs[i];
    const PlanRank *pr = &p->ranks[mb->first_rank + rank];
    if (reserve(bb, mb->tokens, pr->tokens, err) != 0)
        return -1;
    for (int64_t k = 0; k < mb->n_docs; k++)
        if (read_piece(bb, &p->docs[mb->first_doc + k], data, vocab, err) != 0)
            return -1;
    /* This rank's rows: its ranges, in order. A local row per micro-batch row it holds. */
    int64_t rows = 0;
    int32_t *tok = malloc((size_t)(pr->tokens + 1) * 3 * sizeof *tok);
    int64_t *local = malloc((size_t)(mb->tokens + 1) * sizeof *local);
    if (!tok || !local) {
        free(tok);
        free(local);
        return error_runtime(err, "batch", "out of memory");
    }
    for (int64_t r = 0; r < pr->n_ranges; r++) {
        const PlanRange *g = &p->ranges[pr->first_range + r];
        for (int64_t t = g->start; t < g->start + g->len; t++, rows++) {
            local[t] = rows;
            tok[rows] = bb->tokens[t];
            tok[pr->tokens + rows] = bb->targets[t];
            tok[2 * pr->tokens + rows] = bb->positions[t];
        }
    }
    const Ops *o = bb->ops;
    o->to_device(bb->d_tokens, tok, (size_t)rows * sizeof *tok);
    o->to_device(bb->d_targets, tok + pr->tokens, (size_t)rows * sizeof *tok);
    o->to_device(bb->d_positions, tok + 2 * pr->tokens, (size_t)rows * sizeof *tok);
    AttnSegment *segs = array_grow(bb->segs, &bb->cap_segs, pr->n_segments + 1, sizeof *segs);
    if (!segs) {
        free(tok);
        free(local);
        return error_runtime(err, "batch", "out of memory");
    }
    bb->segs = segs;
    for (int64_t s = 0; s < pr->n_segments; s++) {
        const PlanSegment *g = &p->segments[pr->first_segment + s];
        segs[s] = (AttnSegment){local[g->q_start], g->q_len, g->kv_start, g->q_start + g->q_len - g->kv_start, 0};
    }
    free(tok);
    free(local);
    *out = (ModelBatch){.T = rows, .tokens = bb->d_tokens, .targets = bb->d_targets, .positions = bb->d_positions,
                        .segs = bb->segs, .n_segs = pr->n_segments, .n_whole_segs = pr->n_segments, .T_mb = rows};
    return p->cp > 1 ? cp_exchange(bb, p, mb, rank, out, err) : 0;
}

void batch_free(BatchBuffers *bb)
{
    free(bb->tokens); /* targets and positions live in the same array */
    free(bb->segs);
    free(bb->index);
    free(bb->recv_counts);
    free(bb->cp_calls);
    free(bb->block_segs);
    if (bb->ops) {
        bb->ops->free(bb->d_tokens);
        bb->ops->free(bb->d_targets);
        bb->ops->free(bb->d_positions);
        bb->ops->free(bb->d_index);
    }
    memset(bb, 0, sizeof *bb);
}
