/*
 * engine/comm/comm_watchdog.h - the flight recorder of this rank's collectives and messages, and the
 * watchdog that ends the job when they stop finishing.
 *
 * The recorder: a ring of the last COMM_FLIGHT_RING collectives and messages this rank issued (its
 * number, the group and that group's own count, the operation, its elements, when it started and
 * finished). The comm layer calls comm_flight_begin where a collective or message starts (comm_log_op,
 * comm_isend, comm_irecv, comm_recv), comm_flight_bind to tie the one just begun to its request,
 * and comm_flight_end (blocking calls, on their thread) or comm_flight_end_req (comm_wait) where it
 * finishes; comm_flight_progress where a communication thread finished one in the background.
 * A group of one rank records nothing (nothing to wait for). Thread-safe (one mutex).
 *
 * The watchdog (comm_watchdog_start, a thread polling 4 times a second): when something is in flight
 * and nothing has started or finished for timeout_s, the rank is waiting for a peer that does not
 * come (a rank stopped, a NIC or GPU gone, a deadlock). It then writes its ring to
 * DIR/flight-rank-R.txt (util/flight.h has the format and the comparison `wlbtrain inspect` makes),
 * prints one line naming the collective it waits in, gives the other ranks COMM_WATCHDOG_GRACE_S to
 * write theirs, and ends the process with COMM_EXIT_HANG - which makes the launcher end every rank
 * (mpirun and srun stop a job one of whose ranks failed). Rank 0 first reads the files the others
 * wrote and names the ranks that never reached the collective. A stop signal (the flag the trainer's
 * handler sets) while a collective has been waiting a tenth of timeout_s (at least COMM_WATCHDOG_GRACE_S:
 * a checkpoint save the signal lets finish keeps its waits) ends the rank the same way
 * with status 75 (preempted: no checkpoint of the step in flight; a requeue resumes from the last),
 * so SIGTERM/SIGUSR1 still work while a collective hangs. A rank that itself stood still longer
 * than timeout_s (stopped, or starved of CPU: the poll sees the gap) writes no record when it then
 * ends: the others timed out waiting for it and their records, written before, are the picture
 * `wlbtrain inspect` reads. On a data path that reports errors
 * asynchronously (NCCL's: CommImpl.async_error, ncclCommGetAsyncError on each communicator) the
 * watchdog polls them too and ends the rank the hang's way on one; before any such exit the path's
 * communicators are aborted (CommImpl.abort: ncclCommAbort), so no kernel of the rank stays stuck on
 * the GPU waiting for a peer.
 */
#ifndef WLB_ENGINE_COMM_WATCHDOG_H
#define WLB_ENGINE_COMM_WATCHDOG_H

#include <signal.h>
#include <stdint.h>

#include "engine/comm/comm.h"

enum { COMM_FLIGHT_RING = 512, COMM_EXIT_HANG = 76, COMM_EXIT_STOPPED = 75 };
#define COMM_WATCHDOG_GRACE_S 2.0

void comm_flight_begin(const Comm *c, LayoutGroup g, const char *op, int64_t n, int peer);
void comm_flight_bind(const void *req);
/* Ends what this thread began and did not bind (blocking calls); returns rc, so a call reads
 * `return comm_flight_end(impl(...))`. */
int comm_flight_end(int rc);
void comm_flight_end_req(const void *req);
void comm_flight_progress(void);

/* Starts the watchdog thread (c launched with more than one rank, timeout_s > 0). dir: where the
 * ring is written (NULL: not written, the line only); stop: the flag a stop signal sets (NULL:
 * none). Every Error is at start; comm_watchdog_stop ends the thread (before comm_finish). */
int comm_watchdog_start(const Comm *c, double timeout_s, const char *dir, const volatile sig_atomic_t *stop,
                        Error *err);
void comm_watchdog_stop(void);
/* What the stop line says of the run's checkpoints: the trainer notes a save of `step` as it begins
 * (complete 0) and once every rank knows rank 0 finished it (complete 1). */
void comm_watchdog_note_checkpoint(int64_t step, int complete);

#endif
