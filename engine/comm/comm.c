/*
 * engine/comm/comm.c - the float collectives and messages of comm.h, through the Comm's data path
 * (c->impl: MPI's, or the one comm_use switched to).
 */
#include "engine/comm/comm.h"

int comm_use(Comm *c, const CommImpl *impl, Error *err)
{
    if (impl == c->impl)
        return 0;
    if (impl->open && impl->open(c, err) != 0) {
        if (impl->close)
            impl->close(c);
        c->impl_state = NULL;
        return -1;
    }
    c->impl = impl;
    return 0;
}

int comm_allreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err)
{
    return n == 0 ? 0 : c->impl->allreduce_sum(c, g, buf, n, err);
}

int comm_allgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt, Error *err)
{
    return c->impl->allgatherv(c, g, send, recv, counts, dt, err);
}

int comm_reduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts, Error *err)
{
    return c->impl->reduce_scatterv(c, g, send, recv, counts, err);
}

int comm_allgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, Error *err)
{
    return c->impl->allgather(c, g, send, recv, n, dt, err);
}

int comm_reduce_scatter(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Error *err)
{
    return c->impl->reduce_scatter(c, g, send, recv, n, err);
}

size_t comm_elem_bytes(const Comm *c, Dt dt)
{
    return dt == DT_ACT && c->ops ? c->ops->act_bytes : sizeof(float);
}

int comm_isend(const Comm *c, LayoutGroup g, int peer, int tag, const float *buf, int64_t n, CommRequest *req,
               Error *err)
{
    if (!c->mpi)
        return error_runtime(err, "comm", "send to %d in a world of one", peer);
    return c->impl->isend(c, g, peer, tag, buf, n, req, err);
}

int comm_wait(const Comm *c, CommRequest *req, Error *err)
{
    return req->active ? c->impl->wait(c, req, err) : 0;
}

int comm_recv(Comm *c, LayoutGroup g, int peer, int tag, float *buf, int64_t n, Error *err)
{
    if (!c->mpi)
        return error_runtime(err, "comm", "receive from %d in a world of one", peer);
    return c->impl->recv(c, g, peer, tag, buf, n, err);
}
