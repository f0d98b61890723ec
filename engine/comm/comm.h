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

#include "engine/comm/comm_types.h"
#include "engine/comm/layout.h"
#include "engine/ops.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The PP rank this one sends to (*to) and receives from (*from) on lane, -1 for none; wrap: the
 * pipeline's ends exchange too (interleaved stages). */
void comm_lane_peers(const Comm *c, CommLane lane, int wrap, int *to, int *from);

/* MPI's data path (comm_mpi.c), every Comm's until comm_use. */
extern const CommImpl comm_mpi;
/* Its bfloat16 sums (comm_sum16.c: a user operation on MPI_UINT16_T). */
int comm_mpi_sum_bf16(Comm *c, LayoutGroup g, const void *send, void *recv, int64_t n, const int64_t *counts,
                      Error *err);
/* A sum through bfloat16 (comm_sums_in_bf16) run to the end on the caller's thread (comm_sum16.c;
 * engine/comm's own: comm.c's runner of started collectives comes here for such a sum). */
int comm_run_sum_bf16(Comm *c, const CommOp *op, Error *err);
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
/* The offset of this rank's clock (for trace.steps' timelines, comm_mpi.c) from world rank 0's (CLOCK_REALTIME, seconds: add it to read rank
 * 0's), measured by pings with rank 0 (the round trip of least time of `rounds`, half of it taken
 * as the way there); collective over the world. 0 on rank 0 and without MPI. */
int comm_clock_offset(const Comm *c, int rounds, double *offset_s, double *rtt_s, Error *err);

/* comm_elem_bytes (comm_types.h): bytes of one element of dt on c's backend. */
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

/* Host seconds the calling thread has spent inside this layer's calls that can wait for other ranks
 * (the blocking collectives and messages, comm_wait, and the waits of a start for the collectives
 * queued before it): what a rank waited for its peers, and moved its data. The trainer takes it off
 * a step's time to find the rank's own share (train_straggler.c). Per thread, counted once where
 * one call makes another (comm_block_begin / comm_block_end around each, comm.c). */
double comm_blocked_s(void);
/* Seconds so far in which some thread of the process was inside such a call (a clock that runs
 * while one is: the straggler's stall clock reads it around a stop). */
double comm_any_blocked_s(void);
double comm_block_begin(void);
int comm_block_end(double t0, int rc);

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
