/*
 * engine/comm/comm_sum16.c - the partial sums in the compute dtype (parallel.reduce_dtype: compute;
 * comm.h, comm_reduce_scatter_sum and the functions beside it), and MPI's bfloat16 sum.
 *
 * The float32 partial sums (a rank's share of a row-parallel product's output, an input gradient,
 * dK and dV) are rounded to bfloat16 (nearest, ties to even), summed over the group in bfloat16 -
 * each addition rounded to bfloat16, what ncclBfloat16 sums do (NCCL adds in float32 and rounds each
 * step's result) - and widened back to float32: half the bytes of the float32 sums, the rounding of
 * Megatron's bf16 reductions. MPI has no bfloat16 type: its path is MPI_UINT16_T with a user
 * operation that adds two bfloat16 values and rounds the sum, declared non-commutative so that MPI
 * applies it in group-rank order, ((x0 + x1) + x2) + ..: the same bits every run.
 */
#include "engine/comm/comm.h"
#include "engine/comm/comm_async.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "util/bf16.h"
#include "util/clock.h"

void comm_bf16_add(const uint16_t *in, uint16_t *inout, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        inout[i] = bf16_from_float(bf16_to_float(in[i]) + bf16_to_float(inout[i]));
}

/* inout[i] = bf16(in[i] + inout[i]): MPI's (invec, inoutvec) order. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    comm_bf16_add(in, inout, *len);
}

static int mpi_fail(int rc, const char *what, Error *err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = 0;
    return error_runtime(err, "mpi", "%s: %s", what, len ? msg : "error");
}

/* WLB_COMM_SUM16_GATHER=1 (a test hook, test_parallel's test_reduce_dtype): the same sums computed
 * another way - every rank's words all-gathered and added here in group-rank order, ((x0 + x1) + x2)
 * + .., each addition rounded by util/bf16.h - so that a run's bits pin the user operation's (its
 * rounding, its order) against them. cnt: the ranks' shares of a reduce-scatter (NULL: an all-reduce). */
static int sum_by_gather(MPI_Comm comm, int size, int me, const uint16_t *s, uint16_t *d, int64_t n, const int *cnt)
{
    uint16_t *all = malloc((size_t)(n ? n : 1) * (size_t)size * sizeof *all);
    if (!all)
        return MPI_ERR_NO_MEM;
    int rc = MPI_Allgather(s, (int)n, MPI_UINT16_T, all, (int)n, MPI_UINT16_T, comm);
    int64_t first = 0, mine = cnt ? cnt[me] : n;
    for (int r = 0; cnt && r < me; r++)
        first += cnt[r];
    for (int64_t i = 0; rc == MPI_SUCCESS && i < mine; i++) {
        uint16_t acc = all[first + i];
        for (int r = 1; r < size; r++)
            acc = bf16_from_float(bf16_to_float(acc) + bf16_to_float(all[(int64_t)r * n + first + i]));
        d[i] = acc;
    }
    free(all);
    return rc;
}

int comm_mpi_sum_bf16(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                      Error *err)
{
    static MPI_Op op = MPI_OP_NULL;
    int rc;
    if (op == MPI_OP_NULL && (rc = MPI_Op_create(bf16_sum, 0, &op)) != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Op_create", err);
    int size = c->size[g], me = c->rank[g], cnt[4096];
    if (n > INT32_MAX || size > 4096)
        return error_runtime(err, "comm", "a bfloat16 sum of %lld elements over %d ranks is too large", (long long)n,
                             size);
    int64_t mine = counts ? counts[me] : n;
    for (int r = 0; counts && r < size; r++)
        cnt[r] = (int)counts[r];
    /* MPI reads host memory: a GPU backend's buffers are staged through the host. */
    uint16_t *hs = NULL, *hr = NULL;
    const void *s = send;
    void *d = recv;
    if (c->stage) {
        hs = malloc((size_t)(n ? n : 1) * sizeof *hs);
        hr = malloc((size_t)(mine ? mine : 1) * sizeof *hr);
        if (!hs || !hr) {
            free(hs);
            free(hr);
            return error_runtime(err, "comm", "out of memory staging %lld bfloat16 sums", (long long)n);
        }
        if (n)
            c->ops->to_host(hs, send, (size_t)n * sizeof *hs);
        s = hs;
        d = hr;
    }
    MPI_Comm comm = *(MPI_Comm *)c->groups[g];
    double t0 = clock_seconds();
    const char *gather = getenv("WLB_COMM_SUM16_GATHER");
    if (gather && !strcmp(gather, "1"))
        rc = sum_by_gather(comm, size, me, s, d, n, counts ? cnt : NULL);
    else
        rc = counts ? MPI_Reduce_scatter(s, d, cnt, MPI_UINT16_T, op, comm)
                    : MPI_Allreduce(s, d, (int)n, MPI_UINT16_T, op, comm);
    /* WLB_COMM_LINK: a ring's bytes, twice for an all-reduce, as the float32 sums are held. */
    if (rc == MPI_SUCCESS)
        comm_link_hold_ring(c, g, t0, (counts ? 1.0 : 2.0) * (double)n * sizeof(uint16_t));
    if (rc == MPI_SUCCESS && c->stage && mine)
        c->ops->to_device(recv, hr, (size_t)mine * sizeof *hr);
    free(hs);
    free(hr);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, counts ? "MPI_Reduce_scatter" : "MPI_Allreduce", err);
}

/* 1 when the sums go through bfloat16: asked for, a bfloat16 compute dtype, a group of several. */
int comm_sums_in_bf16(const Comm *c, LayoutGroup g, Dt sum_dt)
{
    return sum_dt == DT_ACT && c->ops && c->ops->act_bytes == 2 && c->mpi && c->size[g] > 1;
}

/* Room in the backend's memory for n bfloat16 values to send and `mine` to receive. */
static int room(Comm *c, int64_t n, uint16_t **send, uint16_t **recv, Error *err)
{
    if (n > c->cap_sum16) {
        if (c->sum16)
            c->ops->free(c->sum16);
        c->sum16 = c->ops->alloc((size_t)(2 * n) * sizeof(uint16_t));
        c->cap_sum16 = c->sum16 ? n : 0;
        if (!c->sum16)
            return error_runtime(err, "comm", "out of memory for %lld bfloat16 sums", (long long)n);
    }
    *send = c->sum16;
    *recv = (uint16_t *)c->sum16 + c->cap_sum16;
    return 0;
}

int comm_reserve_sum16(Comm *c, int64_t n, Error *err)
{
    uint16_t *s, *r;
    return c->ops && n > 0 ? room(c, n, &s, &r, err) : 0;
}

/* The sums through bfloat16: send (n float32) rounded, summed by the path, recv (mine float32) widened.
 * On the caller's thread, after the group's started collectives (a started one ran its drain at
 * its start; comm.c's runner comes here for it). */
static int sum_via_bf16(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, const int64_t *counts,
                        Error *err)
{
    if (!c->impl->sum_bf16)
        return error_runtime(err, "parallel.reduce_dtype", "the %s path has no bfloat16 sums", c->impl->name);
    uint16_t *s = NULL, *r = NULL;
    comm_async_drain(c, g);
    if (room(c, n, &s, &r, err) != 0)
        return -1;
    int64_t mine = counts ? counts[c->rank[g]] : n;
    ops_cast(c->ops, s, DT_ACT, send, DT_F32, n);
    if (c->impl->sum_bf16(c, g, s, r, n, counts, err) != 0)
        return -1;
    ops_cast(c->ops, recv, DT_F32, r, DT_ACT, mine);
    return 0;
}

int comm_run_sum_bf16(Comm *c, const CommOp *op, Error *err)
{
    LayoutGroup g = op->group;
    int64_t counts[4096], n = 0;
    if (c->size[g] > 4096)
        return error_runtime(err, "comm", "a group of %d ranks", c->size[g]);
    switch (op->kind) {
    case COMM_OP_ALLREDUCE_SUM:
        return op->n == 0 ? 0 : sum_via_bf16(c, g, op->recv, op->recv, op->n, NULL, err);
    case COMM_OP_REDUCE_SCATTER:
        for (int r = 0; r < c->size[g]; r++)
            counts[r] = op->n;
        return sum_via_bf16(c, g, op->send, op->recv, op->n * c->size[g], counts, err);
    case COMM_OP_REDUCE_SCATTERV:
        for (int r = 0; r < c->size[g]; r++)
            n += op->counts[r];
        return sum_via_bf16(c, g, op->send, op->recv, n, op->counts, err);
    default:
        return error_runtime(err, "comm", "collective %d is no sum", (int)op->kind);
    }
}

int comm_reduce_scatter_sum(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Dt sum_dt, Error *err)
{
    if (!comm_sums_in_bf16(c, g, sum_dt))
        return comm_reduce_scatter(c, g, send, recv, n, err);
    double t0 = comm_block_begin();
    comm_log_op(c, g, "reduce_scatter", n);
    CommOp op = {COMM_OP_REDUCE_SCATTER, g, send, recv, n, NULL, sum_dt};
    return comm_block_end(t0, comm_run_sum_bf16(c, &op, err));
}

int comm_allreduce_sum_dt(Comm *c, LayoutGroup g, float *buf, int64_t n, Dt sum_dt, Error *err)
{
    if (!comm_sums_in_bf16(c, g, sum_dt) || n == 0)
        return comm_allreduce_sum(c, g, buf, n, err);
    double t0 = comm_block_begin();
    comm_log_op(c, g, "allreduce", n);
    CommOp op = {COMM_OP_ALLREDUCE_SUM, g, NULL, buf, n, NULL, sum_dt};
    return comm_block_end(t0, comm_run_sum_bf16(c, &op, err));
}
