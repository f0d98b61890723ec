/*
 * engine/model/model_sp.c - sequence parallelism's exchanges over TP (model.h, "SP").
 *
 * The residual stream of a chunk's T rows lives on R = ceil(T / tp) rows per TP rank: rank r holds
 * rows [r R, (r + 1) R) of the T rows padded to Tp = R tp. Two exchanges connect it with the
 * products, whose inputs and outputs span all T rows:
 *   gather   every rank's R rows, one after the other: the Tp rows in order (comm_allgather; the
 *            normed rows and the gradient of the stream in the compute dtype, the embedding's
 *            gradient in float32). The products read the first T.
 *   scatter  partial sums over all rows (a row-parallel product's output, an input gradient, the
 *            embedding of the rank's vocabulary slice) summed over TP, each rank receiving the sums
 *            of its own R rows (comm_reduce_scatter, float32): the all-reduce's sums without the
 *            rows a rank does not hold. The padding rows [T, Tp) of the partial sums are zeroed
 *            first, so the stream's padding rows are zero, the norms map them to zero, and no
 *            product reads them: they add nothing to any output or gradient.
 * The reduce-scatter adds the same partial sums as the all-reduce it replaces, in the
 * communicator's fixed order: the same results, run after run.
 */
#include "engine/model/model_impl.h"
#include "util/clock.h"

int model_sp_gather(Model *m, const void *x, Dt dt, int64_t T, void *full, Error *err)
{
    double t0 = clock_seconds();
    int rc = comm_allgather(m->comm, GROUP_TP, x, full, model_rows(&m->dims, T) * m->dims.d, dt, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_gather_start(Model *m, const void *x, Dt dt, int64_t T, void *full, CommRequest *req, Error *err)
{
    double t0 = clock_seconds();
    int rc = comm_iallgather(m->comm, GROUP_TP, x, full, model_rows(&m->dims, T) * m->dims.d, dt, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_scatter_start(Model *m, float *part, int64_t T, float *out, CommRequest *req, Error *err)
{
    int64_t D = m->dims.d, R = model_rows(&m->dims, T), Tp = R * m->dims.tp;
    if (Tp > T)
        m->ops->zero(part + T * D, (Tp - T) * D);
    double t0 = clock_seconds();
    int rc = comm_ireduce_scatter_sum(m->comm, GROUP_TP, part, out, R * D, m->sum_dt, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_comm_wait(Model *m, CommRequest *req, Error *err)
{
    double t0 = clock_seconds();
    int rc = comm_wait(m->comm, req, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}

int model_sp_scatter(Model *m, float *part, int64_t T, float *out, Error *err)
{
    int64_t D = m->dims.d, R = model_rows(&m->dims, T), Tp = R * m->dims.tp;
    if (Tp > T)
        m->ops->zero(part + T * D, (Tp - T) * D);
    double t0 = clock_seconds();
    int rc = comm_reduce_scatter_sum(m->comm, GROUP_TP, part, out, R * D, m->sum_dt, err);
    m->comm_s += clock_seconds() - t0;
    return rc;
}
