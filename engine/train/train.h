/*
 * engine/train/train.h - training: the loop of steps, on one process or on the 4D layout under MPI.
 *
 * Each step, on every rank:
 *   1. The planner packs the step's documents (plan.h). Every rank plans every step itself, from
 *      the same config and data; a CRC of the plan is compared over all ranks (a rank that planned
 *      differently stops the job).
 *   2. The rank's pipeline stage runs its replica's micro-batches in 1F1B order (sched.h, with
 *      interleaved virtual stages when parallel.virtual_stages > 1): forward and backward of its
 *      model chunks (model.h), activations received from the previous stage and sent to the next,
 *      their gradients the other way. The loss of a token is scaled by 1 / (the step's labeled
 *      tokens), so the step's loss is the token sum over the global batch over its token count.
 *   3. Gradients: the replicas of a kv head over TP are summed (tp > n_kv_heads), the two copies
 *      of tied embeddings (first and last stage) are summed, and everything is summed over DP x CP
 *      (all-reduce; with parallel.zero = 1 reduce-scattered: each rank of DP x CP owns a shard).
 *   4. Global gradient norm (each element counted once over the job), clipping, AdamW (on the
 *      shard with ZeRO-1, then the parameters all-gathered).
 *   5. Rank 0 prints a line per log.every steps and writes one JSON object per step to
 *      log.metrics: loss, lr, grad_norm, tokens, time, and the predicted and measured pipeline and
 *      context-parallel imbalance (the measured compute seconds of every micro-batch on every rank,
 *      gathered).
 *   6. Every train.eval_every steps and after the last, the validation loss (train_eval.c): held-out
 *      documents through the model, forward only, on a stream of their own.
 * A rank that fails prints its error and takes the whole job down (comm_abort): no rank waits for
 * a dead peer.
 */
#ifndef WLB_ENGINE_TRAIN_H
#define WLB_ENGINE_TRAIN_H

#include <jansson.h>
#include <stdio.h>

#include "config/config.h"
#include "data/data_sources.h"
#include "engine/train/batch.h"
#include "engine/backend.h"
#include "engine/comm/comm.h"
#include "engine/plan/cost.h"
#include "engine/model/model.h"
#include "engine/train/optim.h"
#include "engine/plan/plan.h"
#include "engine/plan/sched.h"
#include "util/error.h"
#include "util/stall.h"
#include "util/statefile.h"

/* One model chunk of this rank (one, or v with interleaving) and what runs it. */
typedef struct TrainChunk {
    Model model;
    Optim optim;
    int *slot_of;            /* per micro-batch of the replica: its activation slot, -1 none */
    int *slot_busy;          /* per slot */
    CommRequest *send_h;     /* per slot: the send of its output (forward) */
    CommRequest *send_dx;    /* per slot: the send of its input gradient (backward) */
    float *shard_grads;      /* ZeRO-1: this rank's shard of the summed gradients */
    /* The gradient buckets (trainer_bucket_count of them, trainer_bucket_range): each one's
     * reduction over DP x CP, and whether it was started this step. */
    CommRequest *grad_req;
    int *bucket_started;
    int last_backward;       /* the schedule's index of the chunk's last backward pass this step (-1: none) */
    CommRequest *param_req;  /* ZeRO-1: per bucket, the parameters' all-gather after the update */
    int *param_pending;      /* per bucket: gathered parameters not yet waited for (and cast) */
    float *kv_scratch;       /* tp > n_kv_heads: the kv replicas' sum over TP (train_grads.c), else NULL */
    float *tied_scratch;     /* tied embeddings over stages: the other copy's gradient, on the chunk that
                              * holds one copy (train_grads.c), else NULL */
} TrainChunk;

/* The validation loss by token position (the RoPE position: the token's offset in its document),
 * train.eval_position_buckets: bucket i holds the labelled tokens at positions [from[i], from[i + 1]),
 * the last one from from[n - 1] on (positions past the window: pieces of longer documents keep their
 * offsets); loss[i] their mean loss (NaN when it has none), targets[i] their count. The buckets'
 * targets add up to the evaluation's, and their token-weighted mean is its loss. */
enum { EVAL_MAX_BUCKETS = CONFIG_MAX_POSITION_EDGES + 1 };
typedef struct PositionLoss {
    int n;
    int64_t from[EVAL_MAX_BUCKETS];
    double loss[EVAL_MAX_BUCKETS];
    int64_t targets[EVAL_MAX_BUCKETS];
} PositionLoss;

/* What an evaluation's forward passes add up by position on this rank (trainer_forward_eval):
 * per bucket of edges (as PositionLoss.from) the summed loss and the count of its labelled tokens;
 * row_loss is host scratch (cap rows). */
typedef struct PositionSums {
    int n;
    int64_t from[EVAL_MAX_BUCKETS];
    double loss[EVAL_MAX_BUCKETS], targets[EVAL_MAX_BUCKETS];
    double *row_loss;
    int64_t cap;
} PositionSums;

typedef struct TrainStats {
    double loss, grad_norm, lr;
    int64_t tokens;
    double pp_imbalance, cp_imbalance;                   /* predicted by the plan */
    double pp_imbalance_measured, cp_imbalance_measured; /* from the measured compute */
    int64_t queued;          /* documents waiting in the outlier queues after the step */
    int64_t attn_pairs;      /* (query, key) pairs attention computes: sum over pieces of l (l + 1) / 2 */
    int skipped;             /* the update was skipped: the loss or the gradients were not finite */
    double mem_used_gb;      /* the device's memory in use after the step (GB; for cpu the machine's) */
    double mem_peak_gb;      /* the most any rank held so far (ops->peak_bytes, GB): what mem_predicted predicts */
    /* Micro-batch balance (train_balance.c): the worst replica's max / mean of its micro-batches'
     * forward + backward compute, predicted and measured; replica 0's times (m of them). */
    double mb_imbalance, mb_imbalance_measured;
    const double *mb_s_measured, *mb_s_predicted;
    int n_mb;
    /* The outlier queues' delay: the mean over the step's tokens of the steps each waited since it
     * was read, and the tokens that waited at least one step. */
    double token_delay_steps;
    int64_t delayed_tokens;
    /* The evaluation after the step, when there was one (train.eval_every). */
    int evaluated;
    double valid_loss, eval_s;
    int64_t valid_tokens;
    PositionLoss valid_by_position;
    /* Stragglers (train_straggler.c): the rank that computed longest in the step, its compute
     * seconds, and the median of the ranks'. */
    int slowest_rank;
    double slowest_compute_s, median_compute_s;
    int busy_measured;                     /* the busy seconds below were measured (no device timer) */
    double slowest_busy_s, median_busy_s;  /* the step's time less the waits for other ranks */
    double slowest_predicted_s; /* the plan's predicted excess of that rank over the median rank */
} TrainStats;

/* The validation loss of the held-out documents (train_eval.c): their cross-entropy summed over
 * every labelled token of the evaluation, over the count of those tokens. */
typedef struct EvalStats {
    double loss;
    int64_t tokens;   /* tokens of data evaluated (padding excluded) */
    int64_t targets;  /* of those, the labelled ones (a next token in the document): the loss's count */
    int64_t steps;    /* global batches of the validation set */
    double seconds;
    PositionLoss by_position; /* the same loss by token position (train.eval_position_buckets) */
} EvalStats;

/* What a run last measured and the best it measured (step 0: nothing yet); checkpoints keep it. */
typedef struct TrainValidRecord {
    int64_t last_step, best_step;
    double last_loss, best_loss;
} TrainValidRecord;

typedef struct Trainer {
    const Config *cfg;
    const Backend *backend;  /* train.device's (engine/backend.h) */
    const Ops *ops;          /* its ops */
    Comm *comm;
    Layout lay;
    int pp, v, n_chunks, m;  /* stages, chunks per stage, chunks in all, micro-batches per replica */
    DataSources data;
    DataStream stream;
    CostModel cost;
    Planner planner;
    StepPlan plan;
    TrainChunk *chunks;      /* v: chunk c is global chunk c * pp + pp_rank */
    BatchBuffers *batches;   /* m: the inputs of the replica's k-th micro-batch */
    ModelBatch *inputs;
    int64_t *mb_index;       /* m: plan index of the replica's k-th micro-batch */
    SchedOp *sched;          /* this stage's passes, in order */
    int n_sched;
    float *recv;             /* a received activation or gradient (backend memory) */
    int64_t recv_cap;
    /* parallel.overlap: the receive of the next pass, posted before the current pass runs
     * (train_pipeline.c), in slot (pass index) % 2 - the current pass's own may still be pending
     * in the other; its buffer becomes recv when that pass takes it. */
    float *recv_ahead[2];
    int64_t recv_ahead_cap[2];
    CommRequest ahead_req[2];
    int ahead_pass[2];       /* the schedule's index of the pass each is for (ahead_req active) */
    double *mb_compute;      /* m: this rank's compute seconds per micro-batch (comm excluded) */
    double *all_compute;     /* world x m, gathered */
    int *pass_timed;         /* per pass of sched: marked by the device timer this step */
    double *pass_comm;       /* per pass: host seconds of its exchanges (taken off its device time) */
    int64_t *pass_waits;     /* per pass: comm_wait_mark at its start and its end */
    double *mb_s_measured;   /* m: replica 0's micro-batches in pipeline order, measured seconds */
    double *mb_s_predicted;  /* m: the same, predicted by the cost model (train_balance.c) */
    int64_t n_targets;       /* labeled tokens of the step */
    double loss_sum;
    int grads_gathered;      /* ZeRO-1: the summed gradients were all-gathered for trainer_gather */
    int64_t skipped;         /* steps whose update was skipped (train.nonfinite: skip) */
    int straggler_rank, straggler_steps; /* the rank slowest by a margin, for how many steps in a row */
    double straggler_mark_s, straggler_mark_blocked_s, straggler_mark_stalled_s; /* where this rank's
                                                                                  * busy-time window began */
    StallClock *stall_clock; /* time the process did not run inside a comm wait (train_straggler.c) */
    double fault_sleep_s;     /* WLBTRAIN_FAULT slow: seconds slept inside this step's first pass */
    int64_t updates_at_start; /* the optimizer's updates when this run's first step began (after a
                               * resume: the checkpoint's), for the hint of a non-finite first step */
    double mem_predicted;    /* the memory model's peak of the worst rank (bytes, train_memory.h) */
    struct TrainValid *valid; /* the validation set and its planner (train_eval.c); NULL without one */
    TrainValidRecord valid_record;
    int eval_only;           /* trainer_init_eval: no optimizer state */
    /* Test hooks (WLBTRAIN_FAULT): perturb this step's plan, poison a gradient, die while saving. */
    char resume_how[320];    /* trainer_resume: how the shards were read (the resume line says it) */
    /* The run's id (util/ckpt_ident.h; trainer_run_id), that of a continued run's parent and the step
     * it continued from (parent_run 0: none), and what the last checkpoint loaded said of its run
     * (0: a checkpoint older than the binding). */
    uint64_t run_id, parent_run, loaded_run, loaded_parent_run;
    int64_t parent_step, loaded_step, loaded_parent_step;
    uint32_t fault_plan;
    int fault_nan, fault_kill_in_save, fault_signal_in_save;
    double fault_stall_after_save; /* rank 0: seconds slept once a save is complete, before pruning */
    struct TrainTrace *trace; /* trace.steps: the measured timeline (train_trace.h); NULL: none */
} Trainer;

/* Sets up a rank of the job described by comm's layout: data, planner, model chunks (initialised
 * or loaded from train.init_from), optimizer. */
int trainer_init(Trainer *tr, const Config *cfg, Comm *comm, Error *err);
/* The same for evaluation only (wlbtrain eval): no optimizer state; trainer_update must not be called. */
int trainer_init_eval(Trainer *tr, const Config *cfg, Comm *comm, Error *err);
/* The backend of train.device (backends.c has those this build knows), opened with the config's
 * precision and determinism for the GPU local_rank picks: what trainer_init and `calibrate` run on.
 * NULL and an Error (train.device, status 2) when there is none. */
const Ops *trainer_open_backend(const Config *cfg, int local_rank, const Backend **backend, Error *err);
void trainer_free(Trainer *tr);
/* Plans the next step and runs its forward and backward: afterwards every rank of DP x CP holds
 * the summed gradients (without ZeRO) and st has the loss, tokens and imbalance. */
int trainer_forward_backward(Trainer *tr, TrainStats *st, Error *err);
/* The forward and backward of the step planned in tr->plan (trainer_forward_backward after it
 * planned; tests put plans of their own there): every rank must hold the same plan. */
int trainer_run_plan(Trainer *tr, TrainStats *st, Error *err);
/* Clipping and AdamW with the gradients of trainer_forward_backward; st gets grad_norm and lr.
 * When the loss or the gradient norm is not finite: with train.nonfinite skip the update is left
 * out (st->skipped, counted in tr->skipped), else it is an Error. */
int trainer_update(Trainer *tr, TrainStats *st, Error *err);
/* A full tensor (Hugging Face name), gathered from every rank's block onto every rank (host, rows x
 * cols): the parameters, or with grads the gradients (before trainer_update). Every rank of the
 * job must call it. Returns 0, or -1 when no rank has that name. */
int trainer_gather(Trainer *tr, const char *name, int grads, float *full, Error *err);
/* The same from any arrays laid out like each chunk's parameters (arrays[c] for chunk c). */
int trainer_gather_arrays(Trainer *tr, const char *name, const float *const *arrays, float *full, Error *err);

/* Validation (train_eval.c). trainer_valid_init: the validation set of data.valid_path or
 * data.valid_fraction (nothing when there is none), by trainer_init. trainer_evaluate: the
 * validation loss of the weights as they are, on every rank of the job (all must call it), recorded
 * in tr->valid_record as measured after `step`. trainer_valid_begin and trainer_valid_next: the
 * evaluation's plans one global batch after another, from the start (every evaluation reads these).
 * trainer_valid_describe: one line on the set and what an evaluation reads. */
int trainer_valid_init(Trainer *tr, Error *err);
void trainer_valid_free(Trainer *tr);
int trainer_evaluate(Trainer *tr, int64_t step, EvalStats *st, Error *err);
int trainer_valid_begin(Trainer *tr, Error *err);
int trainer_valid_next(Trainer *tr, const StepPlan **plan, const DataSources **data, Error *err);
int64_t trainer_valid_steps(const Trainer *tr);
void trainer_valid_describe(const Trainer *tr, char *buf, size_t size);
/* `wlbtrain eval`: the validation loss of a checkpoint's weights (checkpoint, a step folder or a
 * checkpoint folder) or of train.init_from's (checkpoint NULL), on the job's layout; rank 0 prints
 * it and with out writes it as a JSON object. */
int trainer_eval_run(const Config *cfg, const char *checkpoint, const char *out, Error *err);

/* Between the pipeline and the evaluation (train_pipeline.c): every rank planned p itself; a CRC of
 * it (xor perturb, a test hook) must be the same on all. trainer_forward_only: the forward passes of
 * this rank's share of p's micro-batches (documents from data), no backward, no gradient; this
 * rank's part of the token losses added to *loss_sum (the head's TP rank 0 of each CP rank and
 * replica holds one). */
int trainer_check_plan(Trainer *tr, const StepPlan *p, uint32_t perturb, Error *err);
int trainer_forward_only(Trainer *tr, const StepPlan *plan, const DataSources *data, double *loss_sum, Error *err);
/* The same, and with pos (NULL: none) each labelled token's loss also added to its position's bucket
 * of pos, with the count (on the ranks that add to *loss_sum). */
int trainer_forward_eval(Trainer *tr, const StepPlan *plan, const DataSources *data, double *loss_sum,
                         PositionSums *pos, Error *err);
/* The buckets' edges of train.eval_position_buckets for cfg's window (auto: 1024, 4096, 16384, 65536,
 * 131072, then doubling, those below data.context_window) into from (from[0] = 0); returns the
 * number of buckets. */
int trainer_position_buckets(const Config *cfg, int64_t *from);
/* "0-1K 2.3456 (1200), 1K-4K 2.1234 (3400), 4K+ - (0)": each bucket's positions, mean loss ("-" when
 * empty) and labelled tokens. */
void trainer_position_text(const PositionLoss *p, char *buf, size_t size);

/* Checkpoints (train_ckpt.c). trainer_save writes checkpoint.dir/step-NNNNNNNN after `step`
 * (every rank takes part, rank 0 writes). trainer_checkpoint_path: the checkpoint that
 * checkpoint.resume names (auto: the latest in checkpoint.dir, *path NULL when there is none yet;
 * a path: a step folder, a checkpoint folder whose latest is taken, or that latest file:
 * ckpt_step_folder). trainer_resume loads it
 * into a freshly initialised trainer of any layout and gives the step it was saved after. */
int trainer_save(Trainer *tr, int64_t step, Error *err);
/* After the checkpoint is loaded (or none): the run's id - a resume keeps the checkpoint's (and its
 * parent), a continued run (checkpoint.continue_from) gets a new one and records the checkpoint's
 * run and step as its parent, a run at step 1 a new one. Rank 0 makes a new id, every rank gets it
 * (a collective: every rank calls it). */
int trainer_run_id(Trainer *tr, int resumed, int continued, Error *err);
int trainer_checkpoint_path(const Config *cfg, char **path, Error *err);
int trainer_resume(Trainer *tr, const char *path, int64_t *step, Error *err);
/* The weights only of the checkpoint at path (a step folder) into a trainer of any layout, its
 * validation record into tr->valid_record; *step: the step it was saved after. */
int trainer_load_weights(Trainer *tr, const char *path, int64_t *step, Error *err);
/* What trainer_load_checkpoint takes from a checkpoint besides the weights, the validation record
 * and the step it was saved after (*step): CKPT_LOAD_MOMENTS AdamW's moments, update count and the
 * start of its LR schedule (Optim.lr_step0), and the skipped steps; CKPT_LOAD_STREAM the planner's
 * state and the data stream's position (the held-out share must be the config's). trainer_resume is
 * both, trainer_load_weights neither. */
enum { CKPT_LOAD_MOMENTS = 1, CKPT_LOAD_STREAM = 2 };
int trainer_load_checkpoint(Trainer *tr, const char *path, unsigned what, int64_t *step, Error *err);
/* The weights (and unless weights_only the moments) of every chunk from the shards the opened index
 * ix (util/ckpt_index.h) of the checkpoint at path names, saved after step; sets tr->resume_how
 * (train_ckpt_load.c). */
struct CkptIndex;
int trainer_restore_shards(Trainer *tr, struct CkptIndex *ix, int64_t step, int weights_only, const char *path,
                           Error *err);
/* checkpoint.continue_from (train_continue.c): when the run has nothing to resume, it starts from that
 * checkpoint of another run as its next stage - the config compared with the checkpoint's (a changed
 * model key other than model.preset, model.max_seq_len and model.rope_* is an Error; rank 0 prints
 * every changed key, old -> new), the weights and AdamW's state loaded, the data stream and the
 * planner's queues restored only when no data.* (data.tokenizer aside) or balance.* key changed, and
 * the step count and LR schedule restarted or continued (checkpoint.continue_schedule). *done: the
 * step training goes on after (0 with restart). Nothing to do (*done 0) without continue_from. */
int trainer_continue(Trainer *tr, int64_t *done, Error *err);
/* An Error when checkpoint.continue_from is set and checkpoint.dir is the folder that holds the
 * checkpoint it names (this run's steps would replace the earlier stage's). Checked before
 * checkpoint.resume looks for a checkpoint: with resume auto the earlier stage's latest would else be
 * resumed as this run's. 0 when the checkpoint cannot be found (trainer_continue's error). */
int trainer_continue_check_dir(const Config *cfg, Error *err);
/* What a run writes, checked before any work (train_outputs.c): checkpoint.dir and (lead: rank 0's)
 * log.metrics writable, and checkpoint.dir holding no checkpoint of another run that this one would
 * replace (trainer_continue_check_dir first). */
int trainer_check_outputs(const Config *cfg, int lead, Error *err);
/* After a step's forward and backward (tr->all_compute gathered): each rank's busy time since the
 * last call (its waits for other ranks taken off; compute seconds with a device timer) gathered, the
 * slowest rank and its excess over the median into st; rank 0 warns on stderr when one rank stays
 * the slowest by a margin (train_straggler.c). trainer_straggler_start opens the first window,
 * before the first step. Collective over the job. */
void trainer_straggler_start(Trainer *tr);
/* Ends what trainer_straggler_start started (trainer_free calls it). */
void trainer_straggler_stop(Trainer *tr);
int trainer_stragglers(Trainer *tr, int64_t step, TrainStats *st, Error *err);
/* What binds a checkpoint's files to it (index version 3): the run id and a continued run's parent,
 * and every file's size and CRC-32 - sums[i] of the shard file files[i] of the index, in its order. */
typedef struct CkptBinding {
    uint64_t run, parent_run;
    int64_t parent_step;
    const StateSum *sums;
    int n_sums;
    StateSum state_sum, config_sum;
} CkptBinding;
/* Writes path (atomically): the index.json of a checkpoint that cfg's layout saves after `step`
 * (train_ckpt_index.c), with bound's run, the model keys of cfg and the files' sums, and its checksum
 * (util/ckpt_index.h); trainer_index_json: the part of that index the model and layout give (no run,
 * contents or checksum) as a JSON object for the caller to json_decref. */
int trainer_index_write(const Config *cfg, int64_t step, const CkptBinding *bound, const char *path, Error *err);
int trainer_index_json(const Config *cfg, int64_t step, json_t **root, Error *err);
/* cfg's model keys (model.*, model.preset aside: a name, not a value) that differ from the defaults,
 * as {key: YAML text}: what index.json records of the model, so that an edited config.yaml is named
 * by the key (every model key counts, those added later too). */
int trainer_model_keys(const Config *cfg, json_t **out, Error *err);
/* The files of the step folder dir against each other, before any weight is read
 * (train_ckpt_check.c): index.json's checksum, no key twice, and every entry equal to the index that
 * config.yaml's model and layout give; config.yaml's model shape and layout equal to state.bin's
 * meta section (trainer_meta_check, which also gives the step state.bin was saved after); with a
 * bound index (version 3) config.yaml's model keys and checksum, state.bin's and every shard's ident
 * and size (and state.bin's checksum) against the index. Resume, continue_from, eval, export and
 * inspect all check it; any difference is one Error. An older index passes with the checks its
 * format allows, and with warn one warning line on stderr says which were not possible. */
int trainer_checkpoint_check(const char *dir, int warn, Error *err);
/* The checkpoint a run would load (checkpoint.resume's, else checkpoint.continue_from's) checked so
 * (trainer_checkpoint_check, warn: lead) before MPI starts, as every rank checks its config: bad
 * input there is one line from rank 0 (main.c), not one from each rank and the launcher's abort.
 * 0 when there is none, or it cannot be found (the resume says that). */
int trainer_checkpoint_precheck(const Config *cfg, int lead, Error *err);
/* `wlbtrain inspect PATH` of a checkpoint (a step folder, or a checkpoint folder without flight
 * recorder files - those are a hang's, cli_inspect's; *handled 0 for anything else): every check of a
 * resume, every shard read whole (its CRCs, its CRC-32 against the index's), and two lines on stdout:
 * what it is (step, run, layout, files) and what was checked. */
int trainer_checkpoint_inspect(const char *path, int *handled, Error *err);
int trainer_meta_check(const Config *saved, const char *dir, int64_t *step, Error *err);

/* Between the trainer's files: the gradient reduction after the pipeline (train_grads.c), and the
 * parameters [begin, end) this rank's optimizer updates (all, or its ZeRO-1 shard). */
int trainer_reduce_grads(Trainer *tr, Error *err);
/* The buckets of a chunk of `layers` layers (train_grads.c), in the order the parameters lie
 * (model.c): bucket 0 is the tensors before the first layer (the embedding, or a tied output
 * projection's copy) with the first layer's attention half (its norm, Q, K, V, O);
 * TRAINER_BUCKET_FIRST_MLP the first layer's MLP half (its norm, gate, up, down); 1 .. layers - 1
 * layer layer_begin + b's tensors; TRAINER_BUCKET_TAIL those after the last layer (final norm,
 * output projection). Every chunk has a layer (config_resolve). */
#define TRAINER_BUCKET_TAIL(layers) (layers)
#define TRAINER_BUCKET_FIRST_MLP(layers) ((layers) + 1)
static inline int trainer_bucket_count(const Model *m)
{
    return m->dims.layer_end - m->dims.layer_begin + 2;
}
/* Bucket b of m's parameters (and gradients) as [*lo, *hi). */
void trainer_bucket_range(const Model *m, int b, int64_t *lo, int64_t *hi);
/* ZeRO-1 with parallel.overlap (train_params.c): after chunk k's update, its parameters' all-gather
 * over DP x CP starts bucket by bucket (in forward order); the next forward waits for each bucket
 * just before the layer that reads it (Model.weights_needed); trainer_params_ready waits for all
 * of them (before anything else reads the parameters: the update, a gather, a checkpoint). */
int trainer_start_param_gather(Trainer *tr, int k, Error *err);
int trainer_weights_needed(void *ctx, Model *m, int layer, Error *err);
int trainer_params_ready(Trainer *tr, Error *err);
/* Model.grads_ready of a chunk's last backward pass (ctx: the Trainer): part of layer's gradients
 * is final, the reduction of the bucket it completes starts (train_grads.c). */
int trainer_layer_grads_ready(void *ctx, Model *m, int layer, ModelGradsPart part, Error *err);
void trainer_optim_range(const Trainer *tr, const Model *m, int64_t *begin, int64_t *end);
/* Rank r's ZeRO-1 shard of n parameters over a group of size g: [n r / g, n (r + 1) / g). */
void trainer_shard_range(int64_t n, int g, int r, int64_t *begin, int64_t *end);
/* counts[r]: how much of [lo, hi) of m's parameters falls in rank r's shard over DP x CP. */
void trainer_shard_counts(const Trainer *tr, const Model *m, int64_t lo, int64_t hi, int64_t *counts);
/* ZeRO-1: full gets every rank's shard of an array laid out like m's parameters, all-gathered over
 * DP x CP; this rank's shard is copied into place first (shard NULL: it is there already). */
int trainer_gather_shards(Trainer *tr, const Model *m, float *full, const float *shard, Error *err);
/* Room for n floats in the buffer a stage receives its input (or its output's gradient) into
 * (train_pipeline.c): reserved at set-up for the largest micro-batch, so that it never grows. */
int trainer_reserve_recv(Trainer *tr, int64_t n, Error *err);
/* ranks[2 i], ranks[2 i + 1]: rank i's machine (a hash of its host name) and device (Backend.device_id,
 * -1: none). The first two ranks of one machine with the same device (*a < *b) and that device, or
 * *a = *b = -1 and -1: parallel.comm's choice (NCCL needs a GPU per rank). */
int64_t trainer_shared_device(const double *ranks, int n, int *a, int *b);
/* Room for n floats in the buffer of receives posted ahead number a (0 or 1). */
int trainer_reserve_ahead(Trainer *tr, int a, int64_t n, Error *err);

/* Micro-batch balance of the step just run (train_balance.c), from tr->all_compute and the plan:
 * fills st's mb_* fields. trainer_write_mb_metrics appends them to a metrics line: ,"mb_imbalance":
 * ..., "mb_imbalance_measured": ..., "mb_ms_predicted": [...], "mb_ms_measured": [...]. */
void trainer_mb_balance(Trainer *tr, TrainStats *st);
/* Measured seconds of micro-batch k of replica dp on CP rank cp (train_pipeline.c): over the
 * pipeline stages, the slowest TP rank of each, from tr->all_compute. */
double trainer_measured_cp_rank_s(const Trainer *tr, int dp, int k, int cp);
void trainer_write_mb_metrics(FILE *f, const TrainStats *st);

/* The exit status of a job that stopped early on SIGUSR1 or SIGTERM after writing a checkpoint:
 * "not finished, resume me" (sysexits.h's EX_TEMPFAIL, temporary failure, retry). The Slurm
 * scripts requeue the job on it (scripts/slurm/, docs/slurm.md "Time limits and preemption"). */
enum { TRAIN_EXIT_PREEMPTED = 75 };

/* The whole job: places the layers of parallel.stage_layers: auto (trainer_stage_layers, into cfg),
 * starts MPI when launched, trains cfg->train.steps steps, or fewer when train.stop_after or a
 * signal stops it (train.c). *exit_status: 0, or TRAIN_EXIT_PREEMPTED after a signal. */
int trainer_run(Config *cfg, int *exit_status, Error *err);
/* An Error unless cfg has the data training reads: data.path set, and the .idx and .bin of each set
 * of data.path and data.valid_path there to open (the error says training reads the tokens). */
int trainer_check_data(const Config *cfg, Error *err);

#endif
