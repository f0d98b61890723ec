/*
 * engine/model/model_sp.c - sequence parallelism's exchanges over TP (model.h, "SP").
 *
 * The residual stream of a chunk's T rows lives on R = ceil(T / tp) rows per TP rank, of the T rows
 * padded to Tp = R tp. The rows are dealt out in k = parallel.tp_chunks pieces (model_tp.c splits
 * each product and its exchange along them): with c = ceil(R / k),
 *     piece j    the rows [j tp c, j tp c + tp c_j) of the Tp, c_j = min(c, R - j c) of them per rank:
 *                rank r holds rows j tp c + r c_j + i (i < c_j) as its rows j c + i.
 * With k = 1 rank r holds rows [r R, (r + 1) R). Two exchanges connect the stream with the
 * products, whose inputs and outputs span all T rows, one collective per piece:
 *   gather   every rank's c_j rows of piece j, one after the other: rows [j tp c, j tp c + tp c_j)
 *            in order (comm_allgather; the normed rows and the gradient of the stream in the compute
 *            dtype, the embedding's gradient in float32). The products read the first T.
 *   scatter  partial sums over all rows (a row-parallel product's output, an input gradient, the
 *            embedding of the rank's vocabulary slice) summed over TP, each rank receiving the sums
 *            of its own rows of each piece (comm_reduce_scatter, parallel.reduce_dtype): the
 *            all-reduce's sums without the rows a rank does not hold. The padding rows [T, Tp) of
 *            the partial sums are zeroed first, so the stream's padding rows are zero, the norms
 *            map them to zero, and no product reads them: they add nothing to any output or
 *            gradient.
 * The reduce-scatter adds the same partial sums as the all-reduce it replaces, in the
 * communicator's fixed order: the same results, run after run.
 */
#include "engine/model/model_impl.h"
#include "util/clock.h"

int model_tp_chunks(const Model *m)
{
    return m->tp_chunks < 1 ? 1 : m->tp_chunks > MODEL_MAX_TP_CHUNKS ? MODEL_MAX_TP_CHUNKS : m->tp_chunks;
}

SpPieces model_sp_pieces(const Model *m, int64_t T)
{
    int k = model_tp_chunks(m);
    SpPieces p = {T, model_rows(&m->dims, T), 0, 0, m->dims.tp};
    p.c = (p.R + k - 1) / k;
    p.n = p.c > 0 ? (int)((p.R + p.c - 1) / p.c) : 0;
    return p;
}

int64_t model_sp_piece_rows(const SpPieces *p, int j)
{
    int64_t left = p->R - j * p->c;
    return left < p->c ? left : p->c;
}

int64_t model_sp_piece_first(const SpPieces *p, int j)
{
    return (int64_t)p->tp * j * p->c;
}

int64_t model_sp_piece_real(const SpPieces *p, int j)
{
    int64_t first = model_sp_piece_first(p, j), end = first + p->tp * model_sp_piece_rows(p, j);
    end = end < p->T ? end : p->T;
    return end > first ? end - first : 0;
}

/* p advanced by i elements of dt. */
static void *at(const Model *m, const void *p, Dt dt, int64_t i)
{
    return (char *)(uintptr_t)p + i * (int64_t)(dt == DT_F32 ? sizeof(float) : m->ops->act_bytes);
}

int model_sp_gather_piece(Model *m, const void *x, Dt dt, const SpPieces *p, int j, void *full, CommRequest *req,
                          Error *err)
{
    int64_t D = m->dims.d, n = model_sp_piece_rows(p, j) * D;
    const void *send = at(m, x, dt, j * p->c * D);
    void *recv = at(m, full, dt, model_sp_piece_first(p, j) * D);
    double t0 = clock_seconds();
    int rc = req ? comm_iallgather(m->comm, GROUP_TP, send, recv, n, dt, req, err)
                 : comm_allgather(m->comm, GROUP_TP, send, recv, n, dt, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_scatter_piece(Model *m, float *part, const SpPieces *p, int j, float *out, CommRequest *req, Error *err)
{
    int64_t D = m->dims.d, first = model_sp_piece_first(p, j), real = model_sp_piece_real(p, j);
    int64_t rows = p->tp * model_sp_piece_rows(p, j), n = model_sp_piece_rows(p, j) * D;
    if (real < rows)
        m->ops->zero(part + (first + real) * D, (rows - real) * D);
    double t0 = clock_seconds();
    float *send = part + first * D, *recv = out + j * p->c * D;
    int rc = req ? comm_ireduce_scatter_sum(m->comm, GROUP_TP, send, recv, n, m->sum_dt, req, err)
                 : comm_reduce_scatter_sum(m->comm, GROUP_TP, send, recv, n, m->sum_dt, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_gather_start(Model *m, const void *x, Dt dt, int64_t T, void *full, SpExchange *ex, Error *err)
{
    SpPieces p = model_sp_pieces(m, T);
    for (int j = 0; j < p.n; j++)
        if (model_sp_gather_piece(m, x, dt, &p, j, full, ex ? &ex->req[j] : NULL, err) != 0)
            return -1;
    return 0;
}

int model_sp_scatter_start(Model *m, float *part, int64_t T, float *out, SpExchange *ex, Error *err)
{
    SpPieces p = model_sp_pieces(m, T);
    for (int j = 0; j < p.n; j++)
        if (model_sp_scatter_piece(m, part, &p, j, out, ex ? &ex->req[j] : NULL, err) != 0)
            return -1;
    return 0;
}

int model_comm_wait(Model *m, CommRequest *req, Error *err)
{
    double t0 = clock_seconds();
    int rc = comm_wait(m->comm, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_wait(Model *m, SpExchange *ex, Error *err)
{
    for (int j = 0; j < MODEL_MAX_TP_CHUNKS; j++)
        if (model_comm_wait(m, &ex->req[j], err) != 0)
            return -1;
    return 0;
}

int model_sp_gather(Model *m, const void *x, Dt dt, int64_t T, void *full, Error *err)
{
    return model_sp_gather_start(m, x, dt, T, full, NULL, err);
}

int model_sp_scatter(Model *m, float *part, int64_t T, float *out, Error *err)
{
    return model_sp_scatter_start(m, part, T, out, NULL, err);
}
