/*
 * engine/plan/dryrun.h - the dry run: plan every step of the configured cluster in one process, with no
 * MPI launch and no GPU, and report the predicted imbalance and speed of every step.
 *
 * Document lengths come from the .idx of data.path (no token is read) or from data.lengths_file.
 * Every step is planned exactly as training would plan it, its pipeline simulated for every DP
 * replica (sched.h), and the same documents packed the Plain-4D way (fixed windows, per_seq CP)
 * are simulated beside it, so every step has a predicted speedup.
 */
#ifndef WLB_ENGINE_DRYRUN_H
#define WLB_ENGINE_DRYRUN_H

#include <stdint.h>

#include "config/config.h"
#include "util/error.h"

typedef struct DryRunOptions {
    int64_t steps;          /* steps to plan */
    const char *stats_out;  /* JSON lines, or NULL */
    int compare;            /* every packer x CP mode on the same stream, as a table */
} DryRunOptions;

int dryrun_run(const Config *cfg, const DryRunOptions *opt, Error *err);

#endif
