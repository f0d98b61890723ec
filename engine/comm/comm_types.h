/*
 * engine/comm/comm_types.h - the types every file of engine/comm shares: the Comm, the pipeline's
 * lanes, a collective to start, a request, and the table of a data path (CommImpl). Types only (and
 * the lanes' colouring, a pure function): comm.h declares what is done with them, and the files below
 * comm.h in engine/comm's order (docs/architecture.md) - the communication threads, the strict mode -
 * see the Comm through this header alone, so that nothing below comm.h includes it.
 */
#ifndef WLB_ENGINE_COMM_TYPES_H
#define WLB_ENGINE_COMM_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/layout.h"
#include "engine/ops.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommImpl CommImpl;
typedef struct CommAsync CommAsync;

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
    int overlap;                  /* started collectives run in the background (parallel.overlap) */
    int thread_multiple;          /* MPI granted MPI_THREAD_MULTIPLE: communication threads may run */
    CommAsync *async;             /* the communication threads and what they run (comm_async.c) */
    int group_id[GROUP_COUNT];    /* a group's lowest world rank (the same on its every rank) */
    double link_latency_s;        /* WLB_COMM_LINK (0, 0: none) */
    double link_bytes_per_s;
    int chaos_us;                 /* WLB_COMM_CHAOS (0: off) */
    void *log;                    /* WLB_COMM_LOG: this rank's FILE (NULL: none) */
    double strict_s;              /* WLB_COMM_STRICT's seconds (0: off) */
    unsigned char *connected;     /* strict: [slot * size[GROUP_PP] + peer] a lane's pair is connected */
    int shared_gpu_test;          /* NCCL between ranks that share a GPU, over sockets (tests only) */
    int fault_stop_in_finalize;   /* test hook (WLBTRAIN_FAULT hang@R:finalize): comm_finish stops this
                                   * process (SIGSTOP) between the final barrier and MPI_Finalize */
    struct CommTracer *tracer;    /* trace.steps: the timeline's recorder (comm_trace.h), NULL: none */
} Comm;

/* The pipeline's messages go in two lanes: activations (a stage to the next; with interleaving the
 * last stage's to the first) and gradients (the other way). NCCL matches messages per communicator
 * and peer in issue order, without tags, and runs each communicator's operations one after another on
 * its stream; so every lane has a communicator per colour of the sending stage (comm_lane_slot: the
 * stages of the ring coloured so that neighbours differ, 2 colours for an even pp, 3 for an odd one).
 * A rank then sends in one slot of a lane and receives in another, each a queue of messages to or
 * from one peer, in the order both ends issue them: sched_stage_ops gives every stage the same order
 * of micro-batches and chunks, so the sender's order of a lane is the receiver's (test_sched checks
 * it). */
typedef enum CommLane { COMM_LANE_ACT, COMM_LANE_GRAD, COMM_LANES } CommLane;
enum { COMM_LANE_COLORS = 3, COMM_LANE_SLOTS = COMM_LANES * COMM_LANE_COLORS };
/* The slot (0 .. COMM_LANE_SLOTS - 1) of the messages on `lane` sent by PP rank `sender` of pp: a
 * ring of pp stages coloured so that neighbours differ: 0, 1, 0, 1, ..., and with an odd pp the last
 * stage (a neighbour of stage 0 as of stage pp - 2) colour 2. */
static inline int comm_lane_slot(CommLane lane, int sender, int pp)
{
    int color = pp % 2 && sender == pp - 1 && pp > 1 ? 2 : sender % 2;
    return (int)lane * COMM_LANE_COLORS + color;
}

/* A collective to start (comm_istart). */
typedef enum CommOpKind {
    COMM_OP_ALLREDUCE_SUM,  /* recv: n floats summed in place (send unused) */
    COMM_OP_ALLGATHERV,     /* send (or NULL), recv, counts, dt */
    COMM_OP_REDUCE_SCATTERV,/* send, recv, counts */
    COMM_OP_ALLGATHER,      /* send (or NULL), recv, n, dt */
    COMM_OP_REDUCE_SCATTER  /* send, recv, n */
} CommOpKind;

typedef struct CommOp {
    CommOpKind kind;
    LayoutGroup group;
    const void *send;
    void *recv;
    int64_t n;
    const int64_t *counts; /* the group's size of them; copied by the start */
    Dt dt;                 /* the gathers' element; the sums' dtype (DT_F32, or DT_ACT: reduce_dtype compute) */
} CommOp;

/* A send in flight (comm_isend) or a started collective (comm_istart), until comm_wait. */
typedef struct CommRequest {
    int active;
    int collective;           /* a started collective (else a send) */
    void *op;                 /* the collective as the communication thread runs it (MPI path) */
    unsigned char handle[16]; /* the MPI_Request */
    float *staged;            /* the host copy being sent, when staging */
    void *event;              /* the send's completion, with NCCL */
    double t0, link_bytes;    /* WLB_COMM_LINK: when the send (receive) began, its bytes */
    float *dest;              /* a receive staged through the host: where comm_wait puts it */
    int64_t n;
    int tag, peer, lane;      /* strict: what the receive expects */
    double trace_started;     /* a traced message: when it started (comm_trace.h; 0: not traced) */
    int64_t trace_bytes;
    short trace_op, trace_group, trace_peer;
} CommRequest;

/* A data path for the float collectives and messages (comm.h). Same contracts as comm.h's comm_
 * functions of the same names. */
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
    int (*isend)(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
                 CommRequest *req, Error *err);
    int (*wait)(const Comm *c, CommRequest *req, Error *err);
    int (*recv)(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err);
    /* Sends n floats to group rank peer and receives n from it as one operation (comm_exchange). */
    int (*exchange)(Comm *c, LayoutGroup g, int peer, const float *send, float *recv, int64_t n, Error *err);
    /* Connects the pipeline's lanes now (comm_connect_pipeline): to[lane], from[lane] as
     * comm_lane_peers gives them. NULL: nothing to connect. */
    int (*connect)(Comm *c, const int *to, const int *from, Error *err);
    /* Sums of n bfloat16 values of the backend's memory over the group, each addition rounded to
     * bfloat16 (comm_reduce_scatter_sum below): counts NULL, all-reduced into recv (which may be
     * send); else reduce-scattered, counts[i] of them for group rank i, this rank's into recv.
     * NULL: the path has none. */
    int (*sum_bf16)(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                    Error *err);
    /* Starts op in the background (req->collective set; wait finishes it). NULL: the generic layer
     * runs it (MPI's communication threads, or at once). */
    int (*istart)(Comm *c, const CommOp *op, CommRequest *req, Error *err);
    /* Posts a receive (comm_irecv); NULL: the path cannot (receives are comm_recv's). */
    int (*irecv)(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, CommRequest *req,
                 Error *err);
    /* The compute stream's waits for communication, timed on the device (comm_wait_mark). NULL: the
     * path waits on the host, where the caller's clock sees the waits. */
    int64_t (*wait_mark)(Comm *c);
    double (*waited_s)(Comm *c, int64_t from, int64_t to);
    void (*wait_reset)(Comm *c);
    /* For the watchdog's thread (comm_watchdog.c), while the caller's thread may be inside a call:
     * 1 with msg when a communicator reports an asynchronous error; abort ends every communicator
     * (and what waits in it). NULL: the path has none (MPI's errors come back from its calls). */
    int (*async_error)(const Comm *c, char *msg, size_t size);
    void (*abort)(const Comm *c);
};

/* Bytes of one element of dt on c's backend (4 for DT_F32; the compute dtype's for DT_ACT, 4 with
 * host memory). */
static inline size_t comm_elem_bytes(const Comm *c, Dt dt)
{
    return dt == DT_ACT && c->ops ? (size_t)c->ops->act_bytes : sizeof(float);
}

#ifdef __cplusplus
}
#endif

#endif
