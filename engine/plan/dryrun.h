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
#include "data/data_sources.h"
#include "engine/plan/sched.h"
#include "util/error.h"

/* The device memory of one rank, in bytes, by what holds it (engine/train/train_memory.h computes
 * it: the planner cannot see the model's tensors). */
typedef struct DryRunMemory {
    double weights;      /* float32 master weights */
    double weights_act;  /* their copy in the compute dtype (bf16), 0 in float32 */
    double grads;        /* float32 gradients */
    double optimizer;    /* AdamW's two moments (a shard with ZeRO-1) and ZeRO-1's gradient shard */
    double activations;  /* micro-batches in flight x what each keeps, and the scratch they share */
    double other;        /* stage input, batch inputs, the largest transient buffer, workspace, context */
    double peak;         /* the sum */
    int slots;           /* micro-batches in flight (all of the rank's model chunks) */
} DryRunMemory;

/* Every pipeline stage's rank (the TP, CP and DP ranks of a stage hold the same), the worst of them
 * and the budget it is checked against (0: none). */
typedef struct DryRunMemoryPlan {
    int n_stages;
    DryRunMemory *stages;
    int worst;
    double budget;
    int64_t mb_tokens, rank_rows; /* the largest micro-batch, and the rows one CP rank holds of it */
} DryRunMemoryPlan;

typedef struct DryRunOptions {
    int64_t steps;          /* steps to plan */
    const char *stats_out;  /* JSON lines, or NULL */
    int compare;            /* every packer x CP mode on the same stream, as a table */
    const DryRunMemoryPlan *memory; /* printed, and in the summary line; NULL: not reported */
} DryRunOptions;

int dryrun_run(const Config *cfg, const DryRunOptions *opt, Error *err);

/* What a dry run of one layout predicts, as its summary lines print it: for the layout search
 * (engine/train/train_search.h), which ranks layouts by it. */
typedef struct DryRunFigures {
    int64_t steps, tokens;       /* planned, and the tokens they train */
    double predicted_s;          /* the steps' predicted time: tokens / predicted_s is the tokens/s */
    double baseline_s;           /* Plain-4D's on the same documents (0 without the baseline) */
    double pp_imbalance, cp_imbalance, cp_time_imbalance; /* means over the steps */
    SchedBreakdown breakdown;    /* where the mean stage's time goes, seconds over the steps */
} DryRunFigures;
/* Plans `steps` steps of cfg (resolved, its split placed) over data exactly as dryrun_run does, with
 * the config's packer and CP mode, printing nothing; with_baseline also Plain-4D of the same
 * documents. data is only read: threads may share it, each with its own cfg. */
int dryrun_predict(const Config *cfg, const DataSources *data, int64_t steps, int with_baseline, DryRunFigures *out,
                   Error *err);
/* After data.path failed to open (err set): an example config's data is not here, so the error
 * says what a dry run needs instead (document lengths). Used by the dry run and by auto's
 * placement of the layers (training checks its data before, trainer_check_data). */
void dryrun_data_hint(const Config *cfg, Error *err);

#endif
