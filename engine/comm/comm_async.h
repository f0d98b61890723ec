/*
 * engine/comm/comm_async.h - started collectives, the communication threads and the environment's
 * test hooks (comm_async.c; see comm.h), below comm.h in engine/comm's order (docs/architecture.md):
 * it sees the Comm through comm_types.h, and runs a collective through the runner the caller gives.
 * Not for callers outside engine/comm.
 */
#ifndef WLB_ENGINE_COMM_ASYNC_H
#define WLB_ENGINE_COMM_ASYNC_H

#include "engine/comm/comm_types.h"

/* The state of the started collectives and the environment's hooks (WLB_COMM_LINK, _CHAOS, _LOG),
 * set up by comm_start; -1 with err (status 2) for a malformed variable. */
int comm_async_init(Comm *c, Error *err);
/* Opens WLB_COMM_LOG's file once the groups are known (comm_split). */
int comm_async_open_log(Comm *c, Error *err);
/* Stops the communication threads (every request must have been waited for) and frees the state. */
void comm_async_free(Comm *c);
/* How a started collective runs to the end, on its thread (or on a waiter): the layer above's (comm.c,
 * through the Comm's data path), so that this one needs nothing from it. */
typedef int (*CommRunOp)(Comm *c, const CommOp *op, Error *err);
/* op on group op->group's communication thread, run by run; req active. */
int comm_async_start(Comm *c, const CommOp *op, CommRunOp run, CommRequest *req, Error *err);
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
/* 1 on a communication thread: MPI's path then finishes a collective by polling with short sleeps
 * (comm_mpi.c), leaving the cores to the products. */
int comm_async_polling(void);
/* Requests started and not yet waited for (comm_outstanding). */
int64_t comm_async_outstanding(const Comm *c);

#endif
