/*
 * engine/train/train_eval.c - the validation loss: held-out documents through the model, forward
 * only, on any layout (see train.h; docs/validation.md for the user's side).
 *
 * The validation set is the Megatron sets of data.valid_path (blended in proportion to their
 * tokens), or the documents of data.path that data.valid_fraction holds out by document id (blended
 * by data.weights, as training is; the training stream skips them, data_stream.h).
 *
 * What an evaluation reads: the first `steps` global batches of a stream over the validation
 * documents in one fixed order (shuffled once with a seed of its own, not data.seed, so every seed
 * of a study reads the same documents), packed by the run's own planner rules - packer,
 * long_documents, S_max, CP sharding, the layout's DP x M micro-batches - but without outlier
 * queues: delaying a document reorders training, and at evaluation there is no order to change,
 * only documents that a queue would keep out of the evaluated set. Stream and planner start afresh
 * at every evaluation, so every evaluation of a run reads the same pieces in the same micro-batches,
 * and evaluations of runs that differ in packer alone read the same documents. steps: train.eval_tokens
 * (auto: ten global batches) rounded up to whole global batches, at most the whole global batches the
 * set holds (so no document is read twice), at least one.
 *
 * The loss: the cross-entropy of every labelled token (one whose next token is in its document)
 * summed over all the evaluation's micro-batches and ranks, over the count of those tokens - the
 * mean over tokens, not a mean of per-batch means. Each rank sums its own part (the head's TP rank
 * 0 of each CP rank and replica, as in training) and one all-reduce adds the parts.
 *
 * The loss by token position (train.eval_position_buckets): the same labelled tokens by their RoPE
 * position - their offset in their document, which is what a long-context model must learn to use -
 * in buckets such as [0, 1K), [1K, 4K), ... (trainer_position_buckets; the last bucket open-ended).
 * The head hands back each row's loss (ModelBatch.row_loss) to the rank that sums the loss, which
 * adds it to its bucket (trainer_forward_eval); the buckets' sums and counts travel in the loss's own
 * all-reduce. The counts add up to the evaluation's labelled tokens, and the buckets' token-weighted
 * mean is the loss (up to the order of the sums), on every layout.
 *
 * Nothing of training is touched: not the training stream or planner, not the optimizer, not the
 * gradients (the passes are forward only, the head computes no derivative). A run with evaluation
 * trains exactly as one without, and resumes bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/runtime.h"
#include "engine/train/train.h"
#include "util/clock.h"
#include "util/fileio.h"
#include "util/jsonfile.h"
#include "util/ckpt_index.h"

/* The validation stream's shuffle seed ("VALIDSET"): a constant, so that it never follows data.seed. */
static const uint64_t valid_seed = 0x56414c4944534554ull;

struct TrainValid {
    DataSources own;         /* data.valid_path's sets (unused with data.valid_fraction) */
    const DataSources *data; /* the sets of the validation documents: own, or the training sets */
    DataSplit side;          /* DATA_SPLIT_ALL over own, DATA_SPLIT_VALID over the training sets */
    double fraction;
    double *weights;         /* each set's share of the validation stream's tokens */
    DataStream stream;
    Planner planner;
    StepPlan plan;
    int64_t steps;           /* global batches an evaluation reads */
    uint64_t docs, tokens;   /* the validation set */
};

static void valid_release(struct TrainValid *v)
{
    plan_free(&v->plan);
    plan_destroy(&v->planner);
    data_stream_free(&v->stream);
}

void trainer_valid_free(Trainer *tr)
{
    struct TrainValid *v = tr->valid;
    if (!v)
        return;
    valid_release(v);
    data_sources_close(&v->own);
    free(v->weights);
    free(v);
    tr->valid = NULL;
}

/* The sets and the side of the split; the set's size. */
static int open_set(Trainer *tr, struct TrainValid *v, Error *err)
{
    const ConfigData *d = &tr->cfg->data;
    if (d->valid_path.n) {
        if (data_sources_open(&v->own, d->valid_path.v, NULL, d->valid_path.n, NULL, NULL, err) != 0)
            return -1;
        v->data = &v->own;
        v->side = DATA_SPLIT_ALL;
    } else {
        v->data = &tr->data;
        v->side = DATA_SPLIT_VALID;
        v->fraction = d->valid_fraction;
    }
    if (!(v->weights = malloc((size_t)v->data->n * sizeof *v->weights)))
        return error_runtime(err, "valid", "out of memory");
    for (int i = 0; i < v->data->n; i++) {
        uint64_t docs, tokens;
        data_split_count(&v->data->src[i], v->side, v->fraction, &docs, &tokens);
        v->docs += docs;
        v->tokens += tokens;
        /* valid_path: each set by its tokens; a held-out share: the training blend. */
        v->weights[i] = d->valid_path.n ? (double)tokens : v->data->weights ? v->data->weights[i] : 1.0;
        if (v->side == DATA_SPLIT_VALID && docs == 0)
            return error_set(err, "data.valid_fraction", "%g holds out no document of data source %d (%.200s, "
                             "%llu documents): raise it, or set data.valid_path", v->fraction, i + 1,
                             d->path.v[i], (unsigned long long)v->data->src[i].n_docs);
    }
    return 0;
}

int trainer_valid_init(Trainer *tr, Error *err)
{
    const Config *cfg = tr->cfg;
    if (!cfg->data.valid_path.n && !(cfg->data.valid_fraction > 0))
        return 0;
    struct TrainValid *v = calloc(1, sizeof *v);
    if (!v)
        return error_runtime(err, "valid", "out of memory");
    tr->valid = v;
    if (open_set(tr, v, err) != 0)
        return -1;
    int64_t batch = cfg->data.global_batch_tokens;
    int64_t want = cfg->train.eval_tokens > 0 ? cfg->train.eval_tokens : 10 * batch;
    int64_t whole = (int64_t)(v->tokens / (uint64_t)batch);
    v->steps = (want + batch - 1) / batch;
    if (v->steps > whole)
        v->steps = whole > 0 ? whole : 1;
    return trainer_valid_begin(tr, err);
}

int64_t trainer_valid_steps(const Trainer *tr)
{
    return tr->valid ? tr->valid->steps : 0;
}

int trainer_valid_begin(Trainer *tr, Error *err)
{
    struct TrainValid *v = tr->valid;
    const Config *cfg = tr->cfg;
    plan_destroy(&v->planner);
    data_stream_free(&v->stream);
    if (data_stream_init(&v->stream, v->data->src, v->weights, v->data->n, valid_seed,
                         (uint64_t)cfg->data.context_window, err) != 0 ||
        data_stream_set_split(&v->stream, v->side, v->fraction, err) != 0)
        return -1;
    Config no_queues = *cfg; /* a shallow copy that plan_init only reads */
    no_queues.balance.outlier_thresholds.n = 0;
    return plan_init(&v->planner, &no_queues, &tr->cost, &v->stream, cfg->balance.packer, cfg->balance.cp_sharding,
                     err);
}

int trainer_valid_next(Trainer *tr, const StepPlan **plan, const DataSources **data, Error *err)
{
    struct TrainValid *v = tr->valid;
    if (plan_step(&v->planner, &v->plan, err) != 0)
        return -1;
    *plan = &v->plan;
    *data = v->data;
    return 0;
}

int trainer_position_buckets(const Config *cfg, int64_t *from)
{
    const ConfigChoiceOrList *b = &cfg->train.eval_position_buckets;
    int n = 0;
    from[n++] = 0;
    if (b->choice != 0) {
        for (int i = 0; i < b->list.n && n < EVAL_MAX_BUCKETS; i++)
            from[n++] = b->list.v[i];
        return n;
    }
    static const int64_t fixed[5] = {1024, 4096, 16384, 65536, 131072};
    for (int64_t i = 0, e = fixed[0]; e < cfg->data.context_window && n < EVAL_MAX_BUCKETS; i++) {
        from[n++] = e;
        e = i + 1 < 5 ? fixed[i + 1] : 2 * e;
    }
    return n;
}

/* Adds up the evaluation's loss and its loss by position over the job (one all-reduce: the sum, then
 * per bucket its sum and count) into st. */
static int reduce_losses(Trainer *tr, double sum, const PositionSums *pos, EvalStats *st, Error *err)
{
    int n = pos->n;
    double all[1 + 2 * EVAL_MAX_BUCKETS];
    all[0] = sum;
    memcpy(all + 1, pos->loss, (size_t)n * sizeof *all);
    memcpy(all + 1 + n, pos->targets, (size_t)n * sizeof *all);
    if (comm_allreduce_sum_f64(tr->comm, GROUP_WORLD, all, 1 + 2 * n, err) != 0)
        return -1;
    if (st->targets == 0)
        return error_runtime(err, "valid", "the %lld validation tokens evaluated hold no labelled token (every "
                             "document is one token long)", (long long)st->tokens);
    st->loss = all[0] / (double)st->targets;
    PositionLoss *p = &st->by_position;
    p->n = n;
    for (int i = 0; i < n; i++) {
        p->from[i] = pos->from[i];
        p->targets[i] = (int64_t)all[1 + n + i];
        p->loss[i] = p->targets[i] > 0 ? all[1 + i] / all[1 + n + i] : NAN;
    }
    return 0;
}

int trainer_evaluate(Trainer *tr, int64_t step, EvalStats *st, Error *err)
{
    memset(st, 0, sizeof *st);
    if (!tr->valid)
        return error_set(err, "train.eval_every", "no validation set: set data.valid_path or data.valid_fraction");
    double t0 = clock_seconds(), sum = 0;
    if (trainer_valid_begin(tr, err) != 0)
        return -1;
    PositionSums pos;
    memset(&pos, 0, sizeof pos);
    pos.n = trainer_position_buckets(tr->cfg, pos.from);
    int rc = 0;
    for (int64_t j = 0; rc == 0 && j < tr->valid->steps; j++) {
        const StepPlan *plan;
        const DataSources *data;
        rc = trainer_valid_next(tr, &plan, &data, err) != 0 || trainer_check_plan(tr, plan, 0, err) != 0 ||
                     trainer_forward_eval(tr, plan, data, &sum, &pos, err) != 0
                 ? -1
                 : 0;
        if (rc == 0) {
            st->targets += batch_step_targets(plan, data);
            st->tokens += plan->tokens;
            st->steps++;
        }
    }
    free(pos.row_loss);
    if (rc != 0 || reduce_losses(tr, sum, &pos, st, err) != 0)
        return -1;
    st->seconds = clock_seconds() - t0;
    TrainValidRecord *r = &tr->valid_record;
    r->last_step = step;
    r->last_loss = st->loss;
    if (r->best_step == 0 || st->loss < r->best_loss) {
        r->best_step = step;
        r->best_loss = st->loss;
    }
    return 0;
}

/* A position as the buckets name it: 512, 1K, 64K, 1M (1024 units, when whole). */
static void position_name(int64_t x, char *buf, size_t size)
{
    if (x >= 1 << 20 && x % (1 << 20) == 0)
        snprintf(buf, size, "%lldM", (long long)(x >> 20));
    else if (x >= 1024 && x % 1024 == 0)
        snprintf(buf, size, "%lldK", (long long)(x >> 10));
    else
        snprintf(buf, size, "%lld", (long long)x);
}

void trainer_position_text(const PositionLoss *p, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n && len < size; i++) {
        char a[24], b[24], loss[32];
        position_name(p->from[i], a, sizeof a);
        if (i + 1 < p->n)
            position_name(p->from[i + 1], b, sizeof b);
        if (p->targets[i] > 0)
            snprintf(loss, sizeof loss, "%.4f", p->loss[i]);
        else
            snprintf(loss, sizeof loss, "-");
        len += (size_t)snprintf(buf + len, size - len, "%s%s%s%s %s (%lld)", i ? ", " : "", a, i + 1 < p->n ? "-" : "+",
                                i + 1 < p->n ? b : "", loss, (long long)p->targets[i]);
    }
}

void trainer_valid_describe(const Trainer *tr, char *buf, size_t size)
{
    const struct TrainValid *v = tr->valid;
    const ConfigData *d = &tr->cfg->data;
    char what[600];
    if (d->valid_path.n)
        snprintf(what, sizeof what, "data.valid_path (%d set%s, first %.400s)", d->valid_path.n,
                 d->valid_path.n > 1 ? "s" : "", d->valid_path.v[0]);
    else
        snprintf(what, sizeof what, "data.valid_fraction %g of data.path's documents, never trained on", v->fraction);
    snprintf(buf, size, "valid: %llu documents, %llu tokens: %s; an evaluation reads %lld global batch%s "
             "(%lld tokens)", (unsigned long long)v->docs, (unsigned long long)v->tokens, what, (long long)v->steps,
             v->steps > 1 ? "es" : "", (long long)(v->steps * d->global_batch_tokens));
}

/* ---------------------------------------------------------------------------------------------- */
/* wlbtrain eval                                                                                   */

/* The figures as one JSON object (the loss with all its digits, as log.metrics has it). */
static int write_result(const char *out, const char *what, int64_t step, const EvalStats *st, Error *err)
{
    if (file_make_parents(out, err) != 0)
        return -1;
    json_t *o = json_pack("{s:s, s:I, s:f, s:I, s:I, s:I, s:f}", "weights", what, "step", (json_int_t)step,
                          "valid_loss", st->loss, "valid_tokens", (json_int_t)st->tokens, "valid_targets",
                          (json_int_t)st->targets, "eval_steps", (json_int_t)st->steps, "eval_ms", st->seconds * 1e3);
    if (!o)
        return error_runtime(err, out, "cannot make the result (a path that is not UTF-8?)");
    /* By position: the buckets' first positions, mean losses (null for an empty bucket), counts. */
    const PositionLoss *p = &st->by_position;
    json_t *from = json_array(), *loss = json_array(), *count = json_array();
    int ok = from && loss && count;
    for (int i = 0; ok && i < p->n; i++)
        ok = json_array_append_new(from, json_integer(p->from[i])) == 0 &&
             json_array_append_new(loss, p->targets[i] > 0 ? json_real(p->loss[i]) : json_null()) == 0 &&
             json_array_append_new(count, json_integer(p->targets[i])) == 0;
    ok = ok && json_object_set(o, "valid_position_from", from) == 0 &&
         json_object_set(o, "valid_position_loss", loss) == 0 && json_object_set(o, "valid_position_targets", count) == 0;
    json_decref(from);
    json_decref(loss);
    json_decref(count);
    if (!ok) {
        json_decref(o);
        return error_runtime(err, out, "out of memory");
    }
    int rc = json_file_write(out, o, JSON_PRESERVE_ORDER | JSON_COMPACT, err);
    json_decref(o);
    return rc;
}

/* Loads the weights, evaluates, reports (rank 0). */
static int eval_job(Trainer *tr, const char *checkpoint, const char *out, Error *err)
{
    int lead = tr->lay.rank == 0;
    char *dir = NULL, line[1024];
    int64_t step = 0;
    if (checkpoint && (ckpt_step_folder(checkpoint, &dir, err) != 0 || trainer_load_weights(tr, dir, &step, err) != 0)) {
        free(dir);
        return -1;
    }
    const char *what = dir ? dir : tr->cfg->train.init_from ? tr->cfg->train.init_from : "random initialisation";
    if (lead) {
        trainer_valid_describe(tr, line, sizeof line);
        printf("eval: %s%s\n%s\n", what, dir ? "" : " (train.init_from)", line);
        const TrainValidRecord *r = &tr->valid_record;
        if (dir && r->last_step > 0)
            printf("eval: the run measured valid_loss %.6f after step %lld (best %.6f after step %lld)\n",
                   r->last_loss, (long long)r->last_step, r->best_loss, (long long)r->best_step);
        fflush(stdout);
    }
    EvalStats st;
    int rc = trainer_evaluate(tr, step, &st, err);
    if (rc == 0 && lead) {
        printf("eval: valid_loss %.6f (perplexity %.4g) over %lld labelled tokens of %lld, %lld global batch%s, "
               "%.2f s\n", st.loss, exp(st.loss), (long long)st.targets, (long long)st.tokens, (long long)st.steps,
               st.steps > 1 ? "es" : "", st.seconds);
        char line2[EVAL_MAX_BUCKETS * 64];
        trainer_position_text(&st.by_position, line2, sizeof line2);
        printf("eval: by position %s\n", line2);
        fflush(stdout);
        if (out)
            rc = write_result(out, what, step, &st, err);
    }
    free(dir);
    return rc;
}

int trainer_eval_run(const Config *cfg, const char *checkpoint, const char *out, Error *err)
{
    if (!cfg->data.valid_path.n && !(cfg->data.valid_fraction > 0))
        return error_set(err, "eval", "no validation set: set data.valid_path (held-out prefixes) or "
                         "data.valid_fraction (a share of data.path's documents), with --set or in the config");
    RuntimeLaunch launch = runtime_launch_from_env();
    /* The checkpoint's files checked against each other before MPI starts (as a resume's): a
     * swapped, stale or foreign file or an edited config.yaml is one line. */
    char *dir = NULL;
    int bad = checkpoint && (ckpt_step_folder(checkpoint, &dir, err) != 0 ||
                             trainer_checkpoint_check(dir, launch.rank == 0, err) != 0);
    free(dir);
    if (bad)
        return -1;
    Comm comm;
    const ConfigParallel *p = &cfg->parallel;
    if (comm_start(&comm, strcmp(launch.launcher, "none") != 0, err) != 0 ||
        comm_split(&comm, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp, cfg->balance.cp_sharding == CP_GROUPS,
                   err) != 0) {
        comm_finish(&comm);
        return -1;
    }
    Trainer tr;
    int rc = trainer_init_eval(&tr, cfg, &comm, err);
    if (rc == 0)
        rc = eval_job(&tr, checkpoint, out, err);
    if (rc != 0 && comm_world_size(&comm) > 1) {
        fprintf(stderr, "wlbtrain: error: rank %d: %s\n", comm_world_rank(&comm), err->msg);
        comm_abort(&comm, err->status ? err->status : 1);
    }
    trainer_free(&tr);
    comm_finish(&comm);
    return rc;
}
