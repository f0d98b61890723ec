/*
 * engine/comm/comm.h - collectives and point-to-point messages on the groups of the layout.
 *
 * The implementation here is MPI (comm_mpi.c): one communicator per group, split from the world
 * by the layout. Float buffers are the backend's memory (comm_set_backend): host memory for the
 * CPU backend, passed to MPI as they are; device memory for a GPU backend, staged through host
 * buffers (copied out before and back after each call). The f64 collectives and
 * comm_allreduce_sum_host take host memory. A job started without a launcher has no MPI at all:
 * every group is this one process, collectives are copies and nothing is sent.
 *
 * Errors: MPI calls return their errors (MPI_ERRORS_RETURN) and each becomes an Error (status 1).
 * A rank that fails calls comm_abort, which takes the whole job down (MPI_Abort): no rank is left
 * waiting for a dead peer. Counts are elements; a message of more than 2^31 - 1 elements is an
 * Error (the CPU engine never sends one).
 */
#ifndef WLB_ENGINE_COMM_H
#define WLB_ENGINE_COMM_H

#include <stdint.h>

#include "engine/comm/layout.h"
#include "engine/ops.h"
#include "util/error.h"

typedef struct Comm {
    Layout layout;
    int mpi;                      /* 1 when MPI is initialised (a launched job) */
    void *groups[GROUP_COUNT];    /* MPI_Comm handles */
    int size[GROUP_COUNT], rank[GROUP_COUNT];
    int tag_limit;                /* the largest message tag (MPI_TAG_UB) */
    int node_ranks;               /* ranks of the job on this machine */
    const Ops *ops;               /* whose memory the float buffers are (NULL: host) */
    int stage;                    /* copy float buffers through host memory */
    float *host, *host2;          /* staging buffers, cap_host floats each */
    int64_t cap_host;
    void *nccl;                   /* CudaNccl: float collectives and messages through NCCL */
} Comm;

/* A send in flight (comm_isend), until comm_wait. */
typedef struct CommRequest {
    int active;
    unsigned char handle[16]; /* the MPI_Request */
    float *staged;            /* the host copy being sent, when staging */
    void *event;              /* the send's completion, with NCCL */
} CommRequest;

/* Starts MPI when the job was launched (by mpirun, srun, ...), else runs as a world of one. */
int comm_start(Comm *c, int launched, Error *err);
/* The layout's groups; the world must have tp * cp * pp * dp ranks. */
int comm_split(Comm *c, int tp, int cp, int pp, int dp, Error *err);
void comm_finish(Comm *c);
/* Float buffers are ops's memory from now on: staged through the host unless ops keeps host memory
 * (ops->host_memory); stage forces staging anyway (the tests run the staging path on the CPU). */
void comm_set_backend(Comm *c, const Ops *ops, int stage);
/* From now on the float collectives and messages go through NCCL (device buffers; builds with the
 * CUDA backend only): communicators for every group, split from one world communicator whose id
 * rank 0 broadcasts over MPI. Collective over the job. Messages (comm_isend, comm_recv) only in
 * the pipeline group. */
int comm_use_nccl(Comm *c, Error *err);
/* Ends every rank of the job now with this exit status (after this rank printed why). */
void comm_abort(const Comm *c, int status);
int comm_world_size(const Comm *c);
int comm_world_rank(const Comm *c);

int comm_allreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err);
int comm_allreduce_sum_host(const Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err);
int comm_allreduce_sum_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err);
int comm_allreduce_max_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err);
/* recv = the group's send buffers one after the other, counts[i] elements from group rank i.
 * send NULL: this rank's part is already in place in recv. */
int comm_allgatherv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts, Error *err);
/* Sums the group's send buffers, each laid out as counts[0] elements for group rank 0, then
 * counts[1] for rank 1, ...; this rank gets the sum of its part in recv. */
int comm_reduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                         Error *err);
/* recv = n doubles from every group rank, in group-rank order. */
int comm_allgather_f64(const Comm *c, LayoutGroup g, const double *send, double *recv, int64_t n, Error *err);
int comm_broadcast(const Comm *c, LayoutGroup g, int root, void *buf, int64_t bytes, Error *err);
/* Point to point within a group (peer = group rank), matched by tag (0 .. tag_limit). comm_isend
 * starts a send and returns; buf must stay untouched until comm_wait(req), which does nothing for a
 * request that is not active. comm_recv blocks until the message is there. */
int comm_isend(const Comm *c, LayoutGroup g, int peer, int tag, const float *buf, int64_t n, CommRequest *req,
               Error *err);
int comm_wait(const Comm *c, CommRequest *req, Error *err);
int comm_recv(Comm *c, LayoutGroup g, int peer, int tag, float *buf, int64_t n, Error *err);
int comm_barrier(const Comm *c, Error *err);

#endif
