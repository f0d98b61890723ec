/*
 * engine/comm/comm_async.h - what comm.c and comm_mpi.c share about started collectives, the
 * communication threads and the environment's test hooks (comm_async.c; see comm.h). Not for
 * callers outside engine/comm.
 */
#ifndef WLB_ENGINE_COMM_ASYNC_H
#define WLB_ENGINE_COMM_ASYNC_H

#include "engine/comm/comm.h"

/* The state of the started collectives and the environment's hooks (WLB_COMM_LINK, _CHAOS, _LOG),
 * set up by comm_start; -1 with err (status 2) for a malformed variable. */
int comm_async_init(Comm *c, Error *err);
/* Opens WLB_COMM_LOG's file once the groups are known (comm_split). */
int comm_async_open_log(Comm *c, Error *err);
/* Stops the communication threads (every request must have been waited for) and frees the state. */
void comm_async_free(Comm *c);
/* op on group op->group's communication thread; req active. */
int comm_async_start(Comm *c, const CommOp *op, CommRequest *req, Error *err);
/* Waits for a request comm_async_start returned. */
int comm_async_wait(const Comm *c, CommRequest *req, Error *err);
/* Returns once every collective started on group g has run (before a blocking call on g). */
void comm_async_drain(const Comm *c, LayoutGroup g);
/* Requests outstanding += delta. */
void comm_async_count(const Comm *c, int delta);
/* One line of WLB_COMM_LOG for a collective issued on g. */
void comm_log_op(const Comm *c, LayoutGroup g, const char *op, int64_t n);
/* WLB_COMM_LINK: sleeps until t0 + latency + wire_bytes / bandwidth (t0: clock_seconds() when the
 * exchange began). */
void comm_link_hold(const Comm *c, double t0, double wire_bytes);
/* The same for a collective over g that moves `bytes` through a ring: each rank sends (size - 1) /
 * size of them (an all-reduce counts its bytes twice: reduce-scatter, then all-gather). */
void comm_link_hold_ring(const Comm *c, LayoutGroup g, double t0, double bytes);
/* From now on this thread finishes MPI's collectives by polling with short sleeps (comm_mpi.c). */
void comm_mpi_poll_thread(void);
/* A sum through bfloat16 (comm_sums_in_bf16) run to the end on the caller's thread (comm_sum16.c). */
int comm_run_sum_bf16(Comm *c, const CommOp *op, Error *err);
/* WLB_COMM_STRICT (comm_strict.c): the pipeline's messages as NCCL's. The lane's pairs to and from
 * this rank are connected (comm_connect_pipeline; -1: none). */
void comm_strict_connected(Comm *c, CommLane lane, int to, int from);
int comm_strict_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
                      CommRequest *req, Error *err);
int comm_strict_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err);
int comm_strict_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n,
                      CommRequest *req, Error *err);
int comm_strict_wait(const Comm *c, CommRequest *req, Error *err);
/* The MPI_Comm of group g (comm_mpi.c), for comm_strict.c. */
void *comm_mpi_handle(const Comm *c, LayoutGroup g);
/* Runs op to the end through c's data path (the blocking forms). */
int comm_run_op(Comm *c, const CommOp *op, Error *err);

#endif
