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
 * Asynchronous collectives (comm_istart and the comm_i* forms, comm_async.c): a collective starts
 * and returns a CommRequest; comm_wait(req) returns once its result is in the receive buffer. The
 * send buffer stays untouched and the receive buffer unread until then. Every rank of a group
 * starts the group's collectives in the same order (the engine issues them from one thread, in
 * program order). With c->overlap 0, or where a path has no way to run them in the background, a
 * start runs the collective to the end before it returns. Under MPI (and host memory) each group
 * gets a communication thread that runs the group's started collectives in issue order, so they
 * progress while the caller computes (Open MPI makes no progress outside MPI calls); this needs
 * MPI_THREAD_MULTIPLE, which comm_start asks for. A blocking collective or message on a group first
 * lets the group's started collectives finish (one order per communicator). Under NCCL a start
 * queues the collective on the group's stream after the compute stream's work, and the wait makes
 * the compute stream wait for it (cuda/cuda_nccl.cu).
 *
 * Test and measurement hooks of the MPI path, from the environment (read by comm_start):
 *   WLB_COMM_LINK=LATENCY_US,GBPS  every collective and message takes at least LATENCY_US + its
 *                  bytes on the wire / GBPS (10^9 bytes/s): communication costs time on one machine.
 *   WLB_COMM_CHAOS=MAX_US  every collective started in the background (a communication thread's)
 *                  waits a random 0 .. MAX_US before it runs, reads
 *                  its send buffer only then, and its receive buffer holds NaN (every byte 0xff)
 *                  until its comm_wait returns: a missing wait, or a buffer reused too early, shows
 *                  as a wrong number.
 *   WLB_COMM_LOG=DIR  every collective issued is a line of DIR/rank-R.log ("GROUP-ID OP ELEMENTS",
 *                  ID the group's lowest world rank): the lines of one group must be the same on
 *                  each of its ranks.
 *   WLB_COMM_STRICT=SECONDS  the pipeline's messages behave as NCCL's do (comm_strict.c): matched
 *                  per lane slot and peer in issue order, tags ignored (each message carries its
 *                  tag, checked at the receive: a message out of order is an error); a send
 *                  completes only once its receive is posted (rendezvous); and the first message of
 *                  a pair that comm_connect_pipeline did not connect waits, at its start, for the
 *                  peer to post the matching receive, as NCCL's connection at first use does. A
 *                  message that waits SECONDS for its peer is reported as a deadlock (an Error
 *                  naming the lane, the peer and the tag) instead of hanging.
 *
 * Errors: MPI calls return their errors (MPI_ERRORS_RETURN) and each becomes an Error (status 1).
 * A rank that fails calls comm_abort, which takes the whole job down (MPI_Abort): no rank is left
 * waiting for a dead peer. Counts are elements; a message of more than 2^31 - 1 elements is an
 * Error (the CPU engine never sends one).
 */
#ifndef WLB_ENGINE_COMM_H
#define WLB_ENGINE_COMM_H

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
/* The slot (0 .. COMM_LANE_SLOTS - 1) of the messages on `lane` sent by PP rank `sender` of pp. */
int comm_lane_slot(CommLane lane, int sender, int pp);
/* The PP rank this one sends to (*to) and receives from (*from) on lane, -1 for none; wrap: the
 * pipeline's ends exchange too (interleaved stages). */
void comm_lane_peers(const Comm *c, CommLane lane, int wrap, int *to, int *from);

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

/* MPI's data path (comm_mpi.c), every Comm's until comm_use. */
extern const CommImpl comm_mpi;
/* Its bfloat16 sums (comm_sum16.c: a user operation on MPI_UINT16_T). */
int comm_mpi_sum_bf16(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                      Error *err);
/* That operation's step: inout[i] = bf16(in[i] + inout[i]) for n bfloat16 words, the sum of the two
 * values (exact in float32 when their exponents are close) rounded to nearest, ties to even - what
 * ncclBfloat16's sums do (test_comm_sum16 checks it against a float64 reference). */
void comm_bf16_add(const uint16_t *in, uint16_t *inout, int64_t n);

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
 * and comm_allreduce_sum, float32 on both sides, but with sum_dt DT_ACT and a
 * bfloat16 compute dtype they travel and add in bfloat16 (comm_sum16.c: each rank's values rounded,
 * each addition rounded, the result widened), half the bytes; DT_F32, a float32 backend or a group
 * of one: the float32 call. */
int comm_reduce_scatter_sum(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Dt sum_dt, Error *err);
int comm_allreduce_sum_dt(Comm *c, LayoutGroup g, float *buf, int64_t n, Dt sum_dt, Error *err);
/* Room in the backend's memory for bfloat16 sums of up to n elements, taken now (at setup: a sum in a
 * step then allocates nothing). */
int comm_reserve_sum16(Comm *c, int64_t n, Error *err);
/* Bytes of one element of dt on c's backend (4 for DT_F32; the compute dtype's for DT_ACT, 4 with
 * host memory). */
size_t comm_elem_bytes(const Comm *c, Dt dt);
/* recv = n doubles from every group rank, in group-rank order. */
int comm_allgather_f64(const Comm *c, LayoutGroup g, const double *send, double *recv, int64_t n, Error *err);
int comm_broadcast(const Comm *c, LayoutGroup g, int root, void *buf, int64_t bytes, Error *err);
/* The pipeline's messages, between PP ranks (peer = PP group rank) on a lane (see CommLane). MPI
 * matches them by tag (0 .. tag_limit); NCCL by lane slot and peer in issue order, so both ends must
 * issue a lane's messages in the same order (the tag is then only checked, under WLB_COMM_STRICT).
 * comm_isend starts a send and returns; buf must stay untouched until comm_wait(req), which does
 * nothing for a request that is not active. comm_recv returns once the message is there (on NCCL's
 * path: once the compute stream waits for it). */
int comm_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
               CommRequest *req, Error *err);
int comm_wait(const Comm *c, CommRequest *req, Error *err);
int comm_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err);
/* A receive posted ahead: the message lands in buf (n floats) by comm_wait(req); buf untouched
 * until then. Only where comm_can_post_receives (parallel.overlap, a path that can: MPI's, NCCL's
 * once the lanes are connected). */
int comm_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, CommRequest *req,
               Error *err);
int comm_can_post_receives(const Comm *c);
/* Sends n floats to group rank peer and receives n from it into recv (not send), as one operation:
 * the peer calls it with this rank as its peer. No order between the send and the receive, so the
 * pair cannot wait on each other (NCCL: one group of a send and a receive on the group's
 * communicator; MPI: MPI_Sendrecv). */
int comm_exchange(Comm *c, LayoutGroup g, int peer, const float *send, float *recv, int64_t n, Error *err);
/* Connects the pipeline's lanes between neighbouring stages (and the ends, with wrap): collective
 * over the PP group, once, before the first message. NCCL connects a pair at its first message,
 * inside the sender's call, which then waits for the peer to post its receive; connected up front
 * no message ever waits there. */
int comm_connect_pipeline(Comm *c, int wrap, Error *err);
int comm_barrier(const Comm *c, Error *err);

/* The time the compute stream waited for communication, on a path where a wait costs the host
 * nothing (NCCL's: the compute stream waits for an event). comm_wait_mark returns the number of waits
 * so far in this step (after comm_wait_reset), comm_waited_s the device seconds that the waits
 * [from, to) held the compute stream, once the work queued before the later mark has finished.
 * -1 on a path without such waits (MPI's: the host waits, and its clock measures that). */
int64_t comm_wait_mark(Comm *c);
double comm_waited_s(Comm *c, int64_t from, int64_t to);
void comm_wait_reset(Comm *c);

/* Started collectives (see the top). op's buffers as the blocking form of the same name takes them;
 * req must not be active (an active one is an error: wait for it first). With a group of one, no
 * overlap, or a path that cannot run it in the background, the collective completes before the
 * start returns (req stays inactive). */
int comm_istart(Comm *c, const CommOp *op, CommRequest *req, Error *err);
int comm_iallreduce_sum(Comm *c, LayoutGroup g, float *buf, int64_t n, CommRequest *req, Error *err);
int comm_ireduce_scatterv(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                          CommRequest *req, Error *err);
int comm_iallgatherv(Comm *c, LayoutGroup g, const void *send, void *recv, const int64_t *counts, Dt dt,
                     CommRequest *req, Error *err);
int comm_iallgather(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, Dt dt, CommRequest *req,
                    Error *err);
/* The partial sums started in a chosen dtype (parallel.reduce_dtype; comm_reduce_scatter_sum and the
 * functions beside it). Sums that go through bfloat16 (comm_sums_in_bf16) complete at their start,
 * after the group's started ones: their rounding and widening run on the caller's thread and compute
 * stream, and the bfloat16 buffers are the Comm's one pair. Float32 sums start as the forms above. */
int comm_iallreduce_sum_dt(Comm *c, LayoutGroup g, float *buf, int64_t n, Dt sum_dt, CommRequest *req, Error *err);
int comm_ireduce_scatter_sum(Comm *c, LayoutGroup g, const float *send, float *recv, int64_t n, Dt sum_dt,
                             CommRequest *req, Error *err);
int comm_ireduce_scatterv_sum(Comm *c, LayoutGroup g, const float *send, float *recv, const int64_t *counts,
                              Dt sum_dt, CommRequest *req, Error *err);
/* 1 when sums over g in sum_dt travel and add in bfloat16 (sum_dt DT_ACT, a bfloat16 compute dtype,
 * MPI's or NCCL's path, a group of several). */
int comm_sums_in_bf16(const Comm *c, LayoutGroup g, Dt sum_dt);
/* parallel.overlap: 1 = started collectives run in the background, 0 = each completes at its start
 * (the blocking order). */
void comm_set_overlap(Comm *c, int on);
/* Requests started (sends and collectives) and not yet waited for: 0 at the end of every step. */
int64_t comm_outstanding(const Comm *c);

#ifdef __cplusplus
}
#endif

#endif
