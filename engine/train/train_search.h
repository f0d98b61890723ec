/*
 * engine/train/train_search.h - the layout search (`wlbtrain --config FILE --dry-run --search`):
 * which tp x cp x pp x dp, virtual stages, train.recompute, parallel.zero and S_max make the
 * config's model, window and data fastest on a cluster of N GPUs.
 *
 * 1. Enumerate: tp inside a node (dividing balance's GPUs per node, the heads and the kv heads), cp
 *    (the window a multiple of 2 cp), pp (at most the layers), dp the rest of the GPUs (the global
 *    batch a multiple of dp windows), virtual stages 1, 2, 4 (pp > 1, the micro-batches a multiple of
 *    pp), each recompute mode, ZeRO-1 or not (dp cp > 1), and with the wlb packer S_max of 1, 2 and 4
 *    windows (at most the replica's windows). CP mode: the one that chooses among the most layouts
 *    per micro-batch (groups with cp a power of two, else hybrid), or per_seq where that one does not
 *    fit (per_seq needs the least activation memory). Every other key is the config's; the global
 *    batch stays the config's.
 * 2. Prune before planning: each candidate is resolved as a config, its layers placed
 *    (parallel.stage_layers) and its memory predicted (train_memory.h); those over the budget are
 *    dropped.
 * 3. Plan the survivors on the config's data for `steps` steps (dryrun_predict, as a dry run plans
 *    them), several layouts at once on the machine's cores with one planning thread each, and
 *    rank them by predicted tokens/s. The ten best and the config's own get Plain-4D at the same
 *    layout (a second planning run each), and the ten best are planned again over twice the steps:
 *    a first that is no longer first there is said (run with more --steps).
 * Nothing is hard-coded about which layout wins: the ranking is the cost model's and the
 * planner's, so it follows them when they change.
 */
#ifndef WLB_ENGINE_TRAIN_SEARCH_H
#define WLB_ENGINE_TRAIN_SEARCH_H

#include <stdint.h>

#include "config/config.h"
#include "util/error.h"

typedef struct SearchOptions {
    const char *config_path; /* the config file, loaded afresh for every candidate */
    const char *const *sets; /* --set KEY=VALUE, applied after the file, before the candidate's layout */
    int n_sets;
    int64_t gpus;            /* the cluster; 0: the config's tp x cp x pp x dp */
    int64_t steps;           /* steps each layout is planned */
    const char *out;         /* --search-out: the best layout as a config file; NULL: not written */
    const char *stats_out;   /* --stats-out: one JSON object per layout; NULL: not written */
    int all;                 /* --search-all: plan every layout, those the memory model refuses too, and
                              * none once for another: the reference the pruned search must agree with */
} SearchOptions;

/* Default steps per layout when --steps is not given: enough for the example configs' rankings
 * (docs/layout-search.md); the ten best are planned again over twice as many, and a ranking whose
 * first changes there is said. */
#define SEARCH_DEFAULT_STEPS 100

/* Runs the search for cfg (the resolved config of opt->config_path and opt->sets) and prints its
 * table on stdout, its progress on stderr. No layout fits: an Error (status 2) naming the least
 * memory a layout needs and how many GPUs would fit one. */
int trainer_search_run(const Config *cfg, const SearchOptions *opt, Error *err);

#endif
