/*
 * engine/comm/comm_strict.h - WLB_COMM_STRICT (comm_strict.c; comm.h says what it is for): the
 * pipeline's messages on MPI's path as NCCL's. Below comm.h in engine/comm's order
 * (docs/architecture.md): MPI's path (comm_mpi.c) and comm_connect_pipeline (comm.c) call it. Not
 * for callers outside engine/comm.
 */
#ifndef WLB_ENGINE_COMM_STRICT_H
#define WLB_ENGINE_COMM_STRICT_H

#include "engine/comm/comm_types.h"

/* The lane's pairs to and from this rank are connected (comm_connect_pipeline; -1: none). */
void comm_strict_connected(Comm *c, CommLane lane, int to, int from);
/* The messages, as comm.h's comm_isend, comm_recv, comm_irecv and comm_wait. */
int comm_strict_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
                      CommRequest *req, Error *err);
int comm_strict_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err);
int comm_strict_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n,
                      CommRequest *req, Error *err);
int comm_strict_wait(const Comm *c, CommRequest *req, Error *err);

#endif
