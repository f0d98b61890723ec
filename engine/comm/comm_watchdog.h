/*
 * engine/comm/comm_watchdog.h - the flight recorder of this rank's collectives and messages, and the
 * watchdog that ends the job when they stop finishing, from before MPI_Init to after MPI_Finalize.
 *
 * It sits below comm.h (docs/architecture.md, engine/comm's table): it knows the layout's groups and
 * plain numbers, not the Comm, so that it runs before there is one. Its only calls out are MPI's own
 * (the side communicator below, MPI_Abort) and the two hooks of a data path (CommWatchdogJob).
 *
 * The recorder: a ring of the last COMM_FLIGHT_RING collectives and messages this rank issued (its
 * number, the group and that group's own count, the operation, its elements, when it started and
 * finished). The comm layer calls comm_flight_begin where a collective or message starts (comm_log_op,
 * comm_isend, comm_irecv, comm_recv, and MPI's own collective calls: MPI_Init, the communicator
 * splits, the final barrier, MPI_Finalize), comm_flight_bind to tie the one just begun to its
 * request, and comm_flight_end (blocking calls, on their thread) or comm_flight_end_req (comm_wait)
 * where it finishes; comm_flight_progress where a communication thread finished one in the
 * background. A group of one rank records nothing (nothing to wait for). Thread-safe (one mutex).
 *
 * The watchdog (a thread polling 4 times a second), started by comm_watchdog_launch before MPI_Init
 * with the rank and size the launcher's environment gives (runtime.h): when something is in flight
 * and nothing has started or finished for timeout_s, the rank is waiting for a peer that does not
 * come (a rank stopped, a NIC or GPU gone, a deadlock) - in MPI_Init (a rank that never started),
 * in setup, in a step, in the last checkpoint, in the final barrier or MPI_Finalize. It then asks the
 * other ranks, on a side communicator of its own (comm_watchdog_attach: each live rank's watchdog
 * answers within a poll with what it has begun on each group; the stopped rank cannot), which of
 * them never reached the collective it waits in; writes its ring to DIR/flight-rank-R.txt (util/flight.h
 * has the format and the comparison `wlbtrain inspect` makes); prints one line naming the
 * collective it waits in and the ranks that did not answer or are behind; gives the other ranks
 * COMM_WATCHDOG_GRACE_S to write theirs; and ends the job with COMM_EXIT_HANG through
 * MPI_Abort(MPI_COMM_WORLD, 76) while MPI runs - which both mpirun and srun pass on as the job's
 * status - or _exit(76) before MPI_Init returned and from MPI_Finalize on (the launcher then ends
 * the other ranks). Rank 0 (the lowest rank that wrote a file) first reads the files the others
 * wrote and names the ranks that never reached the collective: with a folder the files name it even
 * in MPI_Init, where there is no communicator to ask. A stop signal (the flag the trainer's handler
 * sets) while a collective has been waiting a tenth of timeout_s (at least COMM_WATCHDOG_GRACE_S: a
 * checkpoint save the signal lets finish keeps its waits) ends the job the same way with status 75
 * (preempted: no checkpoint of the step in flight; a requeue resumes from the last), so
 * SIGTERM/SIGUSR1 still work while a collective hangs. A rank that itself stood still longer than
 * timeout_s (stopped, or starved of CPU: the poll sees the gap) writes no record when it then
 * ends: the others timed out waiting for it and their records, written before, are the picture
 * `wlbtrain inspect` reads. On a data path that reports errors asynchronously (NCCL's) the watchdog
 * polls them too and ends the rank the hang's way on one; before any such exit the path's
 * communicators are aborted (ncclCommAbort), so no kernel of the rank stays stuck on the GPU.
 *
 * Attempts: the records belong to one launch of the job (the attempt: the launcher's job, step and
 * restart count, util/flight.h's flight_attempt). comm_watchdog_launch moves the records of other
 * attempts out of DIR into DIR/flight-attempts/ATTEMPT/, and the comparison reads one attempt only:
 * a requeued job that hangs again is judged on its own records.
 */
#ifndef WLB_ENGINE_COMM_WATCHDOG_H
#define WLB_ENGINE_COMM_WATCHDOG_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm/layout.h"
#include "util/error.h"

enum { COMM_FLIGHT_RING = 512, COMM_EXIT_HANG = 76, COMM_EXIT_STOPPED = 75 };
#define COMM_WATCHDOG_GRACE_S 2.0

/* g's id (its lowest world rank) and size on this rank: nothing is recorded for a group of one. */
void comm_flight_begin(LayoutGroup g, int group_id, int group_size, const char *op, int64_t n, int peer);
void comm_flight_bind(const void *req);
/* Ends what this thread began and did not bind (blocking calls); returns rc, so a call reads
 * `return comm_flight_end(impl(...))`. */
int comm_flight_end(int rc);
void comm_flight_end_req(const void *req);
void comm_flight_progress(void);

/* Starts the watchdog thread before MPI starts (world > 1, timeout_s > 0; else nothing): rank and
 * world as the launcher says, dir where the ring is written (NULL: not written, the line only),
 * stop the flag a stop signal sets (NULL: none). Moves other attempts' records out of dir. Every
 * Error is here; comm_watchdog_stop ends the thread (after MPI_Finalize). */
int comm_watchdog_launch(int rank, int world, double timeout_s, const char *dir, const volatile sig_atomic_t *stop,
                         Error *err);
/* MPI is initialised (1: a hang ends through MPI_Abort) or finalizing (0: through _exit). */
void comm_watchdog_mpi(int running);

/* What the job's communicators tell the watchdog once they are made (comm_split). */
typedef struct CommWatchdogJob {
    int group_id[GROUP_COUNT], group_size[GROUP_COUNT]; /* size 0: no such communicator */
    int side;          /* 1: make the side communicator (MPI_THREAD_MULTIPLE granted) */
    /* The data path's asynchronous errors and abort (NCCL's), called from the watchdog's thread
     * with ctx; NULL: none. */
    const void *ctx;
    int (*async_error)(const void *ctx, char *msg, size_t size);
    void (*abort)(const void *ctx);
} CommWatchdogJob;

/* Collective over the world (the side communicator is a duplicate of MPI_COMM_WORLD): from now on
 * the watchdog knows the groups and can ask the other ranks. Nothing when it is not running. */
int comm_watchdog_attach(const CommWatchdogJob *job, Error *err);
/* The side communicator freed (every rank, after the final barrier, before MPI_Finalize). */
void comm_watchdog_detach(void);
void comm_watchdog_stop(void);
/* What the stop line says of the run's checkpoints: the trainer notes a save of `step` as it begins
 * (complete 0) and once every rank knows rank 0 finished it (complete 1). */
void comm_watchdog_note_checkpoint(int64_t step, int complete);

#endif
