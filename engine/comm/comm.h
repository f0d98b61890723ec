/*
 * engine/comm/comm.h - collectives and point-to-point messages on the groups of the layout.
 *
 * The job's ranks and groups are MPI's (comm_mpi.c): one communicator per group, split from the
 * world by the layout; the f64 collectives, broadcast, barrier and comm_allreduce_sum_host take host
 * memory and always go through MPI. The float collectives and the pipeline's messages take the
 * backend's memory (comm_set_backend) and go through a CommImpl, a table like Ops: MPI's
 * (comm_mpi.c: host memory as it is, a GPU backend's memory staged through host buffers, copied out
 * before and back after each call) unless comm_use switches to another (NCCL's, cuda/cuda_nccl.cu,
 * registered by backends.c). A job started without a launcher has no MPI at all: every group is
 * this one process, collectives are copies and nothing is sent.
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

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommImpl CommImpl;

typedef struct Comm {
    Layout layout;
    int mpi;                      /* 1 when MPI is initialised (a launched job) */
    void *groups[GROUP_COUNT];    /* MPI_Comm handles */
    int size[GROUP_COUNT], rank[GROUP_COUNT];
    int tag_limit;                /* the largest message tag (MPI_TAG_UB) */
    int node_ranks;               /* ranks of the job on this machine */
    int cp_blocks;                /* the CP block communicators were made (comm_split) */
    const Ops *ops;               /* whose memory the float buffers are (NULL: host) */
    int stage;                    /* copy float buffers through host memory */
    float *host, *host2;          /* staging buffers, cap_host floats each */
    int64_t cap_host;
    const CommImpl *impl;         /* the float data path: MPI's, or the one comm_use chose */
    void *impl_state;             /* what that path keeps (NCCL's communicators and streams) */
    void *sum16;                  /* the backend's memory for bfloat16 sums: cap_sum16 to send, as many */
    int64_t cap_sum16;            /* to receive (comm_sum16.c) */
} Comm;

/* A send in flight (comm_isend), until comm_wait. */
typedef struct CommRequest {
    int active;
    unsigned char handle[16]; /* the MPI_Request */
    float *staged;            /* the host copy being sent, when staging */
    void *event;              /* the send's completion, with NCCL */
} CommRequest;

/* A data path for the float collectives and messages (see above). Same contracts as the comm_
 * functions of the same names below. */
struct CommImpl {
    const char *name; /* parallel.comm: mpi, nccl */
    /* Collective over the job, after comm_split: sets up c->impl_state. NULL: nothing to set up. */
    int (*open)(Comm *c, Error *err);
    void (*close)(Comm *c);
    int (*allreduce_sum)(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err);
    int (*allgatherv)(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt,
                      Error *err);
    int (*reduce_scatterv)(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                           Error *err);
    int (*allgather)(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, Error *err);
    int (*reduce_scatter)(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Error *err);
    int (*isend)(const Comm *c, LayoutGroup g, int peer, int tag, const float *buf, int64_t n, CommRequest *req,
                 Error *err);
    int (*wait)(const Comm *c, CommRequest *req, Error *err);
    int (*recv)(Comm *c, LayoutGroup g, int peer, int tag, float *buf, int64_t n, Error *err);
    /* Sums of n bfloat16 values of the backend's memory over the group, each addition rounded to
     * bfloat16 (comm_reduce_scatter_sum below): counts NULL, all-reduced into recv (which may be
     * send); else reduce-scattered, counts[i] of them for group rank i, this rank's into recv.
     * NULL: the path has none. */
    int (*sum_bf16)(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                    Error *err);
};

/* MPI's data path (comm_mpi.c), every Comm's until comm_use. */
extern const CommImpl comm_mpi;
/* Its bfloat16 sums (comm_sum16.c: a user operation on MPI_UINT16_T). */
int comm_mpi_sum_bf16(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                      Error *err);

/* Starts MPI when the job was launched (by mpirun, srun, ...), else runs as a world of one. */
int comm_start(Comm *c, int launched, Error *err);
/* The layout's groups; the world must have tp * cp * pp * dp ranks. cp_blocks: also one
 * communicator per aligned block of CP ranks of each power-of-two size 2 .. cp / 2 (sharding
 * groups; GROUP_CP_BLOCK in layout.h). */
int comm_split(Comm *c, int tp, int cp, int pp, int dp, int cp_blocks, Error *err);
/* 1 when group g has a communicator of its own (every group but the CP blocks comm_split was not
 * asked for, and blocks as large as the CP group, which is GROUP_CP). */
int comm_group_made(const Comm *c, LayoutGroup g);
void comm_finish(Comm *c);
/* Float buffers are ops's memory from now on: staged through the host unless ops keeps host memory
 * (ops->host_memory); stage forces staging anyway (the tests run the staging path on the CPU). */
void comm_set_backend(Comm *c, const Ops *ops, int stage);
/* From now on the float collectives and messages go through impl (collective over the job: every
 * rank switches). */
int comm_use(Comm *c, const CommImpl *impl, Error *err);
/* Ends every rank of the job now with this exit status (after this rank printed why). */
void comm_abort(const Comm *c, int status);
int comm_world_size(const Comm *c);
int comm_world_rank(const Comm *c);

int comm_allreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err);
int comm_allreduce_sum_host(const Comm *c, LayoutGroup g, float *buf, int64_t n, Error *err);
int comm_allreduce_sum_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err);
int comm_allreduce_max_f64(const Comm *c, LayoutGroup g, double *buf, int64_t n, Error *err);
/* recv = the group's send buffers one after the other, counts[i] elements of dtype dt from group
 * rank i (DT_ACT: the compute dtype; a gather only copies, so any dtype travels as it is).
 * send NULL: this rank's part is already in place in recv. */
int comm_allgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt,
                    Error *err);
/* Sums the group's send buffers, each laid out as counts[0] elements for group rank 0, then
 * counts[1] for rank 1, ...; this rank gets the sum of its part in recv. */
int comm_reduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                         Error *err);
/* The equal-count forms (sequence parallelism's exchanges over TP), each one collective of the
 * path (MPI_Allgather / ncclAllGather, MPI_Reduce_scatter_block / ncclReduceScatter):
 * comm_allgather: recv = n elements of dtype dt from every group rank, in group-rank order (DT_ACT:
 * the backend's compute dtype, 2 bytes for bf16; the gather only copies, so the elements travel as
 * they are). send NULL: this rank's part is already in place in recv.
 * comm_reduce_scatter: sums the group's float32 send buffers, each n elements for group rank 0,
 * then n for rank 1, ...; recv (not inside send) gets this rank's n sums. */
int comm_allgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, Error *err);
int comm_reduce_scatter(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Error *err);
/* The partial sums in a chosen dtype (parallel.reduce_dtype): as comm_reduce_scatter,
 * comm_reduce_scatterv and comm_allreduce_sum, float32 on both sides, but with sum_dt DT_ACT and a
 * bfloat16 compute dtype they travel and add in bfloat16 (comm_sum16.c: each rank's values rounded,
 * each addition rounded, the result widened), half the bytes; DT_F32, a float32 backend or a group
 * of one: the float32 call. */
int comm_reduce_scatter_sum(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Dt sum_dt, Error *err);
int comm_reduce_scatterv_sum(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts, Dt sum_dt,
                             Error *err);
int comm_allreduce_sum_dt(Comm *c, LayoutGroup g, float *buf, int64_t n, Dt sum_dt, Error *err);
/* Bytes of one element of dt on c's backend (4 for DT_F32; the compute dtype's for DT_ACT, 4 with
 * host memory). */
size_t comm_elem_bytes(const Comm *c, Dt dt);
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

#ifdef __cplusplus
}
#endif

#endif
