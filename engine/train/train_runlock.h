/*
 * engine/train/train_runlock.h - the run's claim on the files it writes (train_runlock.c).
 *
 * One job per run folder: before training starts (after MPI started, before any collective of
 * training and before anything is written), rank 0 takes checkpoint.dir's run lock
 * (util/runlock.h), checks that log.metrics is this run's or new, and that checkpoint.dir has room
 * for one more checkpoint; one broadcast tells every rank the outcome, so that all stop together
 * (exit 2, the same line) when the folder is another job's.
 *
 * log.metrics and its run: a run with checkpoint.dir marks its log.metrics as its own in a file
 * beside it, LOG.owner ("checkpoint.dir /absolute/path"), written when the run opens log.metrics. A
 * later start finds log.metrics new or empty, or marked with its own checkpoint.dir (a resume, or a
 * requeued job that restarts from step 1 because it had no checkpoint yet), or unmarked (a copy, or
 * a file of a run without checkpoint.dir or of an older wlbtrain): it goes on as before - cut after
 * the resumed step and appended to, or replaced by a run from step 1. A log.metrics marked with
 * another checkpoint.dir (another run's) is refused with exit 2 and left as it is: give a new path,
 * or remove LOG.owner to make it this run's. A run without checkpoint.dir (it can neither resume nor
 * mark) replaces its log.metrics as it always did, unless the run that marked it is running now
 * (that folder's lock is held).
 *
 * The lock is released at the end of a run that returns (exit 0, or 75 after a stop signal: the
 * requeued job, or a user's new job, takes it at once); a job ended by the watchdog (76) or killed
 * leaves it, and the requeued job (same SLURM_JOB_ID, a higher SLURM_RESTART_COUNT), a new run on
 * the same host once the process is gone, or anyone once its heartbeat is 120 s old takes it over.
 */
#ifndef WLB_ENGINE_TRAIN_RUNLOCK_H
#define WLB_ENGINE_TRAIN_RUNLOCK_H

#include <stdio.h>

#include "config/config.h"
#include "engine/comm/comm.h"
#include "util/error.h"
#include "util/runlock.h"

#define TRAIN_METRICS_OWNER ".owner"
/* Bytes per parameter of one checkpoint: float32 weights and AdamW's two float32 moments. */
#define TRAIN_CKPT_BYTES_PER_PARAM 12

/* The claim above, on every rank of comm (rank 0 takes, all learn): 0, or -1 with the same err on
 * every rank. lock: rank 0's (zeroed elsewhere). */
int trainer_claim_outputs(const Config *cfg, const Comm *comm, RunLock *lock, Error *err);
/* Before MPI starts, on every rank (nothing written): checkpoint.dir's lock, when another job holds
 * it, is the error (so that it comes before the checks of the folder's contents). */
int trainer_check_lock(const Config *cfg, Error *err);
/* At the end: released when the run returned (released 1), else left for a take-over. */
void trainer_unclaim_outputs(RunLock *lock, int released);
/* checkpoint.dir's free space against one checkpoint of cfg's model: 0, or -1 (exit 2) naming both. */
int trainer_check_space(const Config *cfg, Error *err);
/* Rank 0, when it opens log.metrics: marks it as this run's (LOG.owner; nothing without
 * checkpoint.dir). */
int trainer_metrics_record(const Config *cfg, Error *err);

#endif
