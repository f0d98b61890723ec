/*
 * engine/train/train_continue.c - a run that starts from another run's checkpoint as its next stage
 * (checkpoint.continue_from; see train.h, and docs/checkpoints.md "Stages: a longer window from a
 * checkpoint").
 *
 * Continued pretraining goes through stages - Llama 3 took its 8K model to 128K in six, each a run
 * with a longer window and often a larger RoPE base - and each stage starts from the last one's
 * checkpoint with the optimizer's state, as ProLong's 512K stage does from its 64K run. What may
 * change between the checkpoint's config (its config.yaml) and this run's:
 *   - every key outside model.*: the window, the data and its blend, the batch, the layout, the
 *     learning rate and the schedule, ...;
 *   - of the model.* keys, those that change no tensor: model.preset, model.max_seq_len, and every
 *     key named model.rope_* (the base, the scaling and its parameters - any such key, including
 *     ones added after this file: the rule is the prefix, not a list). The RoPE tables are built
 *     from the config at set-up, not saved, so the new ones simply apply.
 * Any other model.* key is refused with one line before anything is read: the shape keys (layers,
 * dimensions, heads, kv heads, FFN, vocabulary, tied embeddings) would not fit the saved tensors,
 * and model.norm_eps would change what they compute.
 *
 * What comes from the checkpoint: the weights, AdamW's two moments and its update count (the bias
 * correction goes on: with warm moments a restarted count would divide m by 1 - beta1 = 0.1 at the
 * first update, a tenfold step), and the skipped steps with continue. The data stream's position and
 * the planner's outlier queues belong to the stream that saved them: they are restored only when no
 * data.* (data.tokenizer aside: it only names what export copies) and no balance.* key changed,
 * else both start afresh (the stream from its start with data.seed, the queues empty). The
 * validation record is not carried: the earlier stage measured another window, often another set.
 *
 * checkpoint.continue_schedule: restart - this run's steps count from 1 to train.steps and the LR
 * schedule (warmup, decay) runs over them from its start (Optim.lr_step0 = the updates done before);
 * continue - training goes on after the checkpoint's step, up to train.steps, on the schedule as the
 * earlier run had it (train.steps then counts every stage's steps).
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train.h"
#include "util/ckpt_index.h"
#include "util/clock.h"

/* 1 when a continued run may change this key: any key but model.*'s, and of those model.preset,
 * model.max_seq_len and every model.rope_* key. */
static int changeable(const char *key)
{
    if (strncmp(key, "model.", 6) != 0)
        return 1;
    return !strncmp(key, "model.rope_", 11) || !strcmp(key, "model.max_seq_len") || !strcmp(key, "model.preset");
}

/* 1 when the change touches what the data stream and the planner's queues depend on (not
 * data.tokenizer: it only tells export which tokenizer files to copy). */
static int moves_the_stream(const char *key)
{
    if (!strcmp(key, "data.tokenizer"))
        return 0;
    return !strncmp(key, "data.", 5) || !strncmp(key, "balance.", 8);
}

/* An Error when checkpoint.dir is the folder that holds the step folder `step_dir`: this run's
 * checkpoints would replace the earlier stage's, and checkpoint.keep would prune them. */
static int check_own_dir(const Config *cfg, const char *step_dir, Error *err)
{
    if (!cfg->checkpoint.dir)
        return 0;
    char *copy = strdup(step_dir), a[PATH_MAX], b[PATH_MAX];
    if (!copy)
        return error_runtime(err, "checkpoint.continue_from", "out of memory");
    int same = realpath(dirname(copy), a) && realpath(cfg->checkpoint.dir, b) && !strcmp(a, b);
    free(copy);
    if (same)
        return error_set(err, "checkpoint.dir", "%.400s holds the checkpoint that checkpoint.continue_from names: "
                         "give this stage a checkpoint folder of its own (its steps would replace the earlier "
                         "stage's)", cfg->checkpoint.dir);
    return 0;
}

int trainer_continue_check_dir(const Config *cfg, Error *err)
{
    if (!cfg->checkpoint.continue_from || !cfg->checkpoint.dir)
        return 0;
    /* A checkpoint that cannot be found is trainer_continue's error, when it is reached: a stage that
     * resumes from its own folder needs the earlier stage's no more. */
    Error lookup = {0};
    char *path = NULL;
    if (ckpt_step_folder(cfg->checkpoint.continue_from, &path, &lookup) != 0)
        return 0;
    int rc = check_own_dir(cfg, path, err);
    free(path);
    return rc;
}

int trainer_continue(Trainer *tr, int64_t *done, Error *err)
{
    const Config *cfg = tr->cfg;
    *done = 0;
    if (!cfg->checkpoint.continue_from)
        return 0;
    int lead = tr->lay.rank == 0;
    char *path = NULL;
    if (ckpt_step_folder(cfg->checkpoint.continue_from, &path, err) != 0)
        return -1;
    /* The earlier run's config, as it saved it. */
    char file[4200];
    snprintf(file, sizeof file, "%s/config.yaml", path);
    Config old;
    config_init(&old);
    ConfigChange *ch = malloc(CONFIG_MAX_KEYS * sizeof *ch); /* room for every key: none cut */
    int rc = ch ? config_load_file(&old, file, err) : error_runtime(err, "checkpoint.continue_from", "out of memory");
    /* Resolved as export resolves it: a key that wlbtrain derives and the saved file predates gets
     * the value the earlier run had, not a default that would show as a change. */
    if (rc == 0)
        rc = config_resolve(&old, 0, err);
    int n = rc == 0 ? config_changes(&old, cfg, ch, CONFIG_MAX_KEYS) : 0;
    int stream_kept = 1;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!changeable(ch[i].key))
            rc = error_set(err, "checkpoint.continue_from", "%.300s: %s %.100s -> %.100s: a continued run keeps the "
                           "model (of the model keys only model.rope_*, model.max_seq_len and model.preset may "
                           "change)", path, ch[i].key, ch[i].before, ch[i].after);
        if (moves_the_stream(ch[i].key))
            stream_kept = 0;
    }
    if (rc == 0)
        rc = check_own_dir(cfg, path, err); /* run before any resume too (trainer_continue_check_dir) */
    int64_t step = 0;
    double t0 = clock_seconds();
    if (rc == 0)
        rc = trainer_load_checkpoint(tr, path, CKPT_LOAD_MOMENTS | (stream_kept ? CKPT_LOAD_STREAM : 0), &step, err);
    int go_on = cfg->checkpoint.continue_schedule == CONTINUE_GO_ON;
    if (rc == 0 && go_on && step >= cfg->train.steps)
        rc = error_set(err, "checkpoint.continue_schedule", "continue: %.300s was saved after step %lld, and "
                       "train.steps is %lld: nothing to train (with continue train.steps counts the earlier "
                       "stages' steps too: raise it, or restart the schedule)", path, (long long)step,
                       (long long)cfg->train.steps);
    if (rc == 0) {
        int64_t updates = tr->chunks[0].optim.step;
        memset(&tr->valid_record, 0, sizeof tr->valid_record);
        if (go_on) {
            *done = step;
        } else {
            for (int k = 0; k < tr->v; k++)
                tr->chunks[k].optim.lr_step0 = updates;
            tr->skipped = 0;
        }
        if (lead) {
            printf("continue: %s, after step %lld: weights and AdamW's moments (%lld updates; %s; %.3f s)\n", path,
                   (long long)step, (long long)updates, tr->resume_how, clock_seconds() - t0);
            if (go_on)
                printf("continue: steps and LR schedule go on after step %lld, to train.steps %lld\n",
                       (long long)step, (long long)cfg->train.steps);
            else
                printf("continue: steps and LR schedule restart: steps 1 to %lld, warmup %lld\n",
                       (long long)cfg->train.steps, (long long)cfg->train.warmup_steps);
            printf("continue: data stream and planner queues %s\n", stream_kept
                   ? "go on where they were (no data.* or balance.* key changed)"
                   : "start afresh (a data.* or balance.* key changed)");
            printf("continue: %d key%s changed%s\n", n, n == 1 ? "" : "s", n ? ":" : "");
            for (int i = 0; i < n; i++)
                printf("continue:   %s %s -> %s\n", ch[i].key, ch[i].before, ch[i].after);
            fflush(stdout);
        }
    }
    free(ch);
    config_free(&old);
    free(path);
    return rc;
}
