/*
 * test/test_valid.c - the held-out split and the validation loss, in one process.
 *
 * The split (data.valid_fraction): the two sides partition every data set's documents, about the
 * fraction of them held out, the same for every seed; a training stream never yields a validation
 * document - over several epochs and with two sets blended - and a validation stream yields nothing
 * else; a side with no document is an error. Through the trainer: no planned training step holds a
 * held-out document (packers fixed and wlb, several epochs, two blended prefixes), and the
 * evaluation's plans hold only held-out ones; the dry run plans the training stream, step by step
 * the trainer's documents and micro-batches.
 * The evaluation: it reads the same batches every time, the same documents with outlier queues or
 * without, and leaves training untouched (the training stream and planner, the weights, the
 * gradients); its loss is the token sum over the evaluation's labelled tokens over their count,
 * checked against the step losses of the same plans run by the trainer (not a mean of the batches'
 * means, not over all tokens); train.eval_tokens rounded up to whole global batches, at least one;
 * several data.valid_path sets read in proportion to their tokens. And the config rules and the
 * errors of `wlbtrain eval`.
 * (Across layouts: test_parallel; resume and `wlbtrain eval` against the run: test_checkpoint.)
 */
#include "test/testlib.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/plan/dryrun.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"

typedef struct Fixture {
    char *dir, *a, *b; /* two Megatron sets to blend */
} Fixture;

static Fixture fx;

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    fx.dir = test_tmpdir();
    fx.a = test_write_docs(fx.dir, "a", 11, 150, 6, 64);
    fx.b = test_write_docs(fx.dir, "b", 12, 90, 0, 64);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(fx.dir);
    free(fx.dir);
    free(fx.a);
    free(fx.b);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* The split, on length lists                                                                      */

static void test_split_partitions_the_documents(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint32_t *len = malloc(N * sizeof *len);
    for (int i = 0; i < N; i++)
        len[i] = 1 + (uint32_t)(i % 7);
    DataSource src = data_source_from_lengths(len, N, 0);
    for (int i = 0; i < N; i++)
        src.n_tokens += len[i];
    uint64_t docs[3], tokens[3];
    for (int side = 0; side < 3; side++)
        data_split_count(&src, (DataSplit)side, 0.1, &docs[side], &tokens[side]);
    assert_true(docs[DATA_SPLIT_TRAIN] + docs[DATA_SPLIT_VALID] == N && docs[DATA_SPLIT_ALL] == N);
    assert_true(tokens[DATA_SPLIT_TRAIN] + tokens[DATA_SPLIT_VALID] == src.n_tokens);
    /* 10% held out: 2000 expected, a binomial standard deviation of 42. */
    printf("# 0.1 of %d documents: %llu held out\n", N, (unsigned long long)docs[DATA_SPLIT_VALID]);
    assert_true(docs[DATA_SPLIT_VALID] > 1800 && docs[DATA_SPLIT_VALID] < 2200);
    int held = 0, nested = 1;
    for (uint64_t d = 0; d < N; d++) {
        int v = data_split_is_valid(d, 0.1);
        held += v;
        assert_int_equal(data_split_keeps(DATA_SPLIT_TRAIN, 0.1, d), !v);
        assert_int_equal(data_split_keeps(DATA_SPLIT_VALID, 0.1, d), v);
        assert_int_equal(data_split_keeps(DATA_SPLIT_ALL, 0.1, d), 1);
        nested &= !v || data_split_is_valid(d, 0.2); /* a larger share holds out a superset */
        assert_int_equal(data_split_is_valid(d, 0), 0);
    }
    assert_int_equal(held, (int)docs[DATA_SPLIT_VALID]);
    assert_true(nested);

    /* Streams of both sides over 3 epochs: never the other side's document, every document of their
     * own side each epoch; whatever the stream's seed. */
    for (uint64_t seed = 1; seed <= 2; seed++)
        for (int side = DATA_SPLIT_TRAIN; side <= DATA_SPLIT_VALID; side++) {
            DataStream s;
            Error err = {0};
            assert_int_equal(data_stream_init(&s, &src, NULL, 1, seed, 64, &err), 0);
            assert_int_equal(data_stream_set_split(&s, (DataSplit)side, 0.1, &err), 0);
            unsigned char *seen = calloc(N, 1);
            uint64_t pieces = 0;
            while (s.sources[0].epoch < 3) {
                DataPiece p;
                data_stream_next(&s, &p);
                assert_int_equal(data_split_is_valid(p.doc, 0.1), side == DATA_SPLIT_VALID);
                seen[p.doc] = 1;
                pieces++;
            }
            for (uint64_t d = 0; d < N; d++)
                assert_int_equal(seen[d], data_split_keeps((DataSplit)side, 0.1, d));
            assert_true(pieces >= 3 * docs[side] - 1);
            free(seen);
            data_stream_free(&s);
        }
    /* A share that leaves a source no document of a side is an error, not an endless loop. */
    uint32_t one[1] = {5};
    DataSource tiny = data_source_from_lengths(one, 1, 5);
    DataStream s;
    Error err = {0};
    int side = data_split_is_valid(0, 0.5) ? DATA_SPLIT_TRAIN : DATA_SPLIT_VALID;
    assert_int_equal(data_stream_init(&s, &tiny, NULL, 1, 1, 64, &err), 0);
    assert_int_equal(data_stream_set_split(&s, (DataSplit)side, 0.5, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "leaves data source 1 (1 documents) no"));
    data_stream_free(&s);
    free(len);
}

/* ---------------------------------------------------------------------------------------------- */
/* Through the trainer                                                                             */

typedef struct Run {
    Config cfg;
    Comm comm;
    Trainer tr;
} Run;

/* A trainer of a 2-layer model on the sets a and b blended, with the given extra YAML lines and
 * KEY=VALUE (NULL: none). */
static void run_open_set(Run *r, const char *extra, const char *set)
{
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: [%s, %s], weights: [2, 1], context_window: 128, global_batch_tokens: 512}\n"
        "balance: {hardware: cpu, outlier_thresholds: [32, 64]}\n"
        "train: {device: cpu, steps: 4, lr: 0.003, warmup_steps: 1}\n%s",
        fx.a, fx.b, extra);
    Error err = {0};
    config_init(&r->cfg);
    int rc = config_load_string(&r->cfg, yaml, "t.yaml", &err) != 0 || (set && config_apply_set(&r->cfg, set, &err)) ||
             config_resolve(&r->cfg, 1, &err) != 0 || trainer_stage_layers(&r->cfg, NULL, NULL, &err) != 0 ||
             comm_start(&r->comm, 0, &err) != 0 ||
             comm_split(&r->comm, 1, 1, 1, 1, 0, &err) != 0 || trainer_init(&r->tr, &r->cfg, &r->comm, &err) != 0;
    if (rc)
        print_error("setup: %s\n", err.msg);
    assert_int_equal(rc, 0);
    free(yaml);
}

static void run_open(Run *r, const char *extra)
{
    run_open_set(r, extra, NULL);
}

static void run_close(Run *r)
{
    trainer_free(&r->tr);
    comm_finish(&r->comm);
    config_free(&r->cfg);
}

/* The data pieces of a plan as (source, doc, offset, len) quadruples, appended to out (n of them). */
static void plan_pieces(const StepPlan *p, uint64_t *out, int64_t *n)
{
    for (int64_t k = 0; k < p->n_docs; k++) {
        const PlanDoc *d = &p->docs[k];
        if (d->source == PLAN_PAD_SOURCE)
            continue;
        uint64_t *q = out + 4 * (*n)++;
        q[0] = d->source;
        q[1] = d->doc;
        q[2] = d->offset;
        q[3] = (uint64_t)d->len;
    }
}

static int by_piece(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

/* The pieces of one evaluation (sorted); *n of them, malloc'd. */
static uint64_t *eval_pieces(Trainer *tr, int64_t *n)
{
    uint64_t *all = malloc(sizeof(uint64_t) * 4 * 100000);
    Error err = {0};
    *n = 0;
    assert_int_equal(trainer_valid_begin(tr, &err), 0);
    for (int64_t j = 0; j < trainer_valid_steps(tr); j++) {
        const StepPlan *p;
        const DataSources *data;
        assert_int_equal(trainer_valid_next(tr, &p, &data, &err), 0);
        plan_pieces(p, all, n);
    }
    qsort(all, (size_t)*n, 4 * sizeof *all, by_piece);
    return all;
}

/* Over 3 epochs of both blended sets, packers fixed and wlb: no training step holds a held-out
 * document; the evaluation holds nothing else. */
static void test_trainer_never_trains_held_out(void **state)
{
    (void)state;
    const char *packers[] = {"fixed", "wlb"};
    for (int k = 0; k < 2; k++) {
        Run r;
        char *extra = test_format("data: {valid_fraction: 0.25}\nbalance: {packer: %s}\n", packers[k]);
        run_open(&r, extra);
        Trainer *tr = &r.tr;
        Error err = {0};
        int64_t steps = 0, tokens = 0;
        while (tr->stream.sources[0].epoch < 3 || tr->stream.sources[1].epoch < 3) {
            assert_int_equal(plan_step(&tr->planner, &tr->plan, &err), 0);
            for (int64_t i = 0; i < tr->plan.n_docs; i++) {
                const PlanDoc *d = &tr->plan.docs[i];
                if (d->source == PLAN_PAD_SOURCE)
                    continue;
                if (data_split_is_valid(d->doc, 0.25))
                    print_error("step %lld trains held-out document %llu of set %u\n", (long long)steps + 1,
                                (unsigned long long)d->doc, d->source);
                assert_false(data_split_is_valid(d->doc, 0.25));
            }
            tokens += tr->plan.tokens;
            steps++;
        }
        int64_t n;
        uint64_t *pieces = eval_pieces(tr, &n);
        assert_true(n > 0);
        for (int64_t i = 0; i < n; i++)
            assert_true(data_split_is_valid(pieces[4 * i + 1], 0.25));
        printf("# %s: %lld training steps (%lld tokens, 3 epochs of both sets): no held-out document; the "
               "evaluation: %lld pieces, all held out\n", packers[k], (long long)steps, (long long)tokens,
               (long long)n);
        free(pieces);
        free(extra);
        run_close(&r);
    }
}

/* The evaluation reads the same pieces every time, and the same with outlier queues as without
 * (the queues only delay training); an evaluation changes neither the training stream and planner
 * nor the weights and gradients, and gives the same loss twice. */
static void test_evaluation_repeats_and_leaves_training(void **state)
{
    (void)state;
    Run r, q;
    run_open(&r, "data: {valid_fraction: 0.25}\nbalance: {packer: wlb}\ntrain: {eval_tokens: 1536}\n");
    run_open_set(&q, "data: {valid_fraction: 0.25}\nbalance: {packer: wlb}\ntrain: {eval_tokens: 1536}\n",
                 "balance.outlier_thresholds=[]");
    Trainer *tr = &r.tr;
    Error err = {0};
    TrainStats st;
    assert_int_equal(trainer_forward_backward(tr, &st, &err), 0);
    int64_t n1, n2, n3;
    uint64_t *p1 = eval_pieces(tr, &n1), *p2 = eval_pieces(tr, &n2), *p3 = eval_pieces(&q.tr, &n3);
    assert_true(n1 == n2 && n1 == n3 && n1 > 0);
    assert_memory_equal(p1, p2, (size_t)n1 * 4 * sizeof *p1);
    assert_memory_equal(p1, p3, (size_t)n1 * 4 * sizeof *p1);
    /* With queues, the evaluated pieces hold outliers (>= 32 tokens) that a queue would have held. */
    int64_t outliers = 0;
    for (int64_t i = 0; i < n1; i++)
        outliers += p1[4 * i + 3] >= 32;
    printf("# %lld pieces evaluated, %lld of them outliers, the same with and without queues\n", (long long)n1,
           (long long)outliers);
    assert_true(outliers > 0);
    free(p1);
    free(p2);
    free(p3);

    size_t np = plan_state_words(&tr->planner), ns = data_stream_state_words(&tr->stream);
    uint64_t *before = calloc(np + ns, sizeof *before), *after = calloc(np + ns, sizeof *after);
    plan_state_save(&tr->planner, before);
    data_stream_save(&tr->stream, before + np);
    const Model *m = &tr->chunks[0].model;
    size_t bytes = (size_t)m->n_params * sizeof(float);
    float *params = malloc(bytes), *grads = malloc(bytes);
    memcpy(params, m->params, bytes); /* the CPU backend: host memory */
    memcpy(grads, m->grads, bytes);
    EvalStats e1, e2;
    assert_int_equal(trainer_evaluate(tr, 1, &e1, &err), 0);
    assert_int_equal(trainer_evaluate(tr, 2, &e2, &err), 0);
    assert_true(plan_state_words(&tr->planner) == np && data_stream_state_words(&tr->stream) == ns);
    plan_state_save(&tr->planner, after);
    data_stream_save(&tr->stream, after + np);
    assert_memory_equal(before, after, (np + ns) * sizeof *before);
    assert_memory_equal(params, m->params, bytes);
    assert_memory_equal(grads, m->grads, bytes);
    assert_true(memcmp(&e1.loss, &e2.loss, sizeof e1.loss) == 0 && e1.tokens == e2.tokens && e1.steps == 3);
    assert_true(tr->valid_record.last_step == 2 && tr->valid_record.best_step == 1);
    printf("# valid_loss %.6f twice, over %lld labelled tokens of %lld in %lld global batches\n", e1.loss,
           (long long)e1.targets, (long long)e1.tokens, (long long)e1.steps);
    free(before);
    free(after);
    free(params);
    free(grads);
    run_close(&q);
    run_close(&r);
}

/* A deep copy of src into dst (the trainer's own plan, kept for its arrays). */
static void copy_plan(StepPlan *dst, const StepPlan *src)
{
    plan_reset(dst, src->step, src->dp, src->m, src->cp);
    memcpy(dst->mbs, src->mbs, (size_t)src->dp * (size_t)src->m * sizeof *src->mbs);
    for (int64_t i = 0; i < src->n_docs; i++)
        assert_true(plan_add_doc(dst, &src->docs[i]) >= 0);
    for (int64_t i = 0; i < src->n_ranges; i++)
        assert_true(plan_add_range(dst, src->ranges[i].rank, src->ranges[i].start, src->ranges[i].len) >= 0);
    for (int64_t i = 0; i < src->n_segments; i++) {
        const PlanSegment *g = &src->segments[i];
        assert_true(plan_add_segment(dst, g->rank, g->q_start, g->q_len, g->kv_start) >= 0);
    }
    for (int64_t i = 0; i < src->n_ranks; i++) {
        int64_t k = plan_add_rank(dst);
        assert_true(k >= 0);
        dst->ranks[k] = src->ranks[i];
    }
    dst->tokens = src->tokens;
}

/* The validation loss is sum / count over every labelled token of the evaluation: each of its
 * batches run as a training step gives that batch's mean loss (the trainer's own normaliser), and
 * the means weighted by the batches' labelled tokens must give the evaluation's figure. The batches
 * differ in labelled tokens and in mean, and hold document ends (tokens without a label), so a mean
 * of the means or a division by all tokens would not. */
static void test_loss_is_the_mean_over_labelled_tokens(void **state)
{
    (void)state;
    Run r;
    run_open(&r, "data: {valid_fraction: 0.25}\nbalance: {packer: wlb}\ntrain: {eval_tokens: 1536}\n");
    Trainer *tr = &r.tr;
    Error err = {0};
    EvalStats ev;
    assert_int_equal(trainer_evaluate(tr, 1, &ev, &err), 0);
    enum { MAX_STEPS = 8 };
    double mean[MAX_STEPS], sum = 0;
    int64_t targets[MAX_STEPS], count = 0;
    int64_t steps = trainer_valid_steps(tr);
    assert_true(steps >= 2 && steps <= MAX_STEPS);
    StepPlan plans[MAX_STEPS] = {{0}};
    const DataSources *data = NULL;
    assert_int_equal(trainer_valid_begin(tr, &err), 0);
    for (int64_t j = 0; j < steps; j++) {
        const StepPlan *p;
        assert_int_equal(trainer_valid_next(tr, &p, &data, &err), 0);
        copy_plan(&plans[j], p);
    }
    assert_ptr_equal(data, &tr->data); /* a held-out share: the training sets */
    for (int64_t j = 0; j < steps; j++) {
        copy_plan(&tr->plan, &plans[j]);
        TrainStats st;
        assert_int_equal(trainer_run_plan(tr, &st, &err), 0);
        mean[j] = st.loss;
        targets[j] = batch_step_targets(&plans[j], data);
        sum += mean[j] * (double)targets[j];
        count += targets[j];
        printf("# evaluation batch %lld: %lld tokens, %lld labelled, mean loss %.6f\n", (long long)j + 1,
               (long long)plans[j].tokens, (long long)targets[j], mean[j]);
        plan_free(&plans[j]);
    }
    double means = 0;
    for (int64_t j = 0; j < steps; j++)
        means += mean[j] / (double)steps;
    printf("# valid_loss %.12f; token-weighted batch means %.12f; plain mean of means %.12f; over all %lld "
           "tokens %.12f\n", ev.loss, sum / (double)count, means, (long long)ev.tokens, sum / (double)ev.tokens);
    assert_int_equal(ev.targets, count);
    assert_true(ev.tokens > ev.targets);
    assert_true(targets[0] != targets[1] && mean[0] != mean[1]);
    assert_true(fabs(ev.loss - sum / (double)count) <= 1e-12 * ev.loss);
    assert_true(fabs(means - sum / (double)count) > 1e-6 * ev.loss);
    run_close(&r);
}

/* The dry run plans the stream training reads: with data.valid_fraction, without the held-out
 * documents. Step by step, its stats line and the trainer's own plan have the same documents and
 * tokens, the same micro-batches (their tokens in order) and the same queues (packers fixed and wlb,
 * two blended sets). */
static void test_dry_run_plans_the_training_stream(void **state)
{
    (void)state;
    const char *packers[] = {"fixed", "wlb"};
    enum { STEPS = 6 };
    for (int k = 0; k < 2; k++) {
        Run r;
        char *extra = test_format("data: {valid_fraction: 0.25}\nbalance: {packer: %s}\n", packers[k]);
        char *stats = test_format("%s/dry-%s.jsonl", fx.dir, packers[k]);
        run_open(&r, extra);
        DryRunOptions opt = {STEPS, stats, 0, NULL};
        Error err = {0};
        if (dryrun_run(&r.cfg, &opt, &err) != 0)
            print_error("dry run: %s\n", err.msg);
        assert_int_equal(err.status, 0);
        fflush(stdout);
        char *text = test_read_file(stats, NULL);
        assert_non_null(text);
        char *line = strtok(text, "\n");
        Trainer *tr = &r.tr;
        int64_t docs_all = 0;
        for (int step = 1; step <= STEPS; step++, line = strtok(NULL, "\n")) {
            assert_non_null(line);
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            assert_non_null(o);
            assert_int_equal(json_integer_value(json_object_get(o, "step")), step);
            assert_int_equal(plan_step(&tr->planner, &tr->plan, &err), 0);
            const StepPlan *p = &tr->plan;
            int64_t docs = 0;
            for (int64_t i = 0; i < p->n_docs; i++)
                docs += p->docs[i].source != PLAN_PAD_SOURCE;
            json_t *mbs = json_object_get(o, "mb_tokens");
            int64_t dry_docs = json_integer_value(json_object_get(o, "docs"));
            int64_t dry_tokens = json_integer_value(json_object_get(o, "tokens"));
            int64_t dry_queued = json_integer_value(json_object_get(o, "queued"));
            if (dry_docs != docs || dry_tokens != p->tokens || dry_queued != p->queued)
                print_error("%s, step %d: the dry run plans %lld documents, %lld tokens, %lld queued; training "
                            "%lld, %lld, %lld\n", packers[k], step, (long long)dry_docs, (long long)dry_tokens,
                            (long long)dry_queued, (long long)docs, (long long)p->tokens, (long long)p->queued);
            assert_int_equal(dry_docs, docs);
            assert_int_equal(dry_tokens, p->tokens);
            assert_int_equal(dry_queued, p->queued);
            assert_int_equal(json_array_size(mbs), (size_t)p->dp * (size_t)p->m);
            for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
                assert_int_equal(json_integer_value(json_array_get(mbs, (size_t)i)), p->mbs[i].tokens);
            docs_all += docs;
            json_decref(o);
        }
        printf("# %s: %d steps, %lld documents, the same in the dry run as in training\n", packers[k], STEPS,
               (long long)docs_all);
        free(text);
        free(stats);
        free(extra);
        run_close(&r);
    }
}

/* train.eval_tokens that is not a whole number of global batches (512 tokens) is rounded up to
 * whole ones, at least one: an evaluation reads that many. */
static void test_eval_tokens_rounded_up(void **state)
{
    (void)state;
    static const struct {
        const char *tokens;
        int64_t steps;
    } cases[] = {{"1", 1}, {"100", 1}, {"511", 1}, {"512", 1}, {"513", 2}, {"1000", 2}, {"1025", 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Run r;
        char *set = test_format("train.eval_tokens=%s", cases[i].tokens);
        run_open_set(&r, "data: {valid_fraction: 0.25}\nbalance: {packer: fixed}\n", set);
        Error err = {0};
        EvalStats ev;
        assert_int_equal(trainer_evaluate(&r.tr, 1, &ev, &err), 0);
        if (trainer_valid_steps(&r.tr) != cases[i].steps || ev.steps != cases[i].steps)
            print_error("eval_tokens %s: %lld global batches (%lld evaluated), expected %lld\n", cases[i].tokens,
                        (long long)trainer_valid_steps(&r.tr), (long long)ev.steps, (long long)cases[i].steps);
        assert_int_equal(trainer_valid_steps(&r.tr), cases[i].steps);
        assert_int_equal(ev.steps, cases[i].steps);
        free(set);
        run_close(&r);
    }
}

/* Several data.valid_path sets: the evaluation reads each in proportion to its tokens (set b,
 * about a fifth of the tokens, listed first; training's data.weights, 2:1, are not the validation
 * blend): after every batch, each set's tokens read are its share of all read, within the longest
 * document (the sets hold none over 255 tokens). */
static void test_valid_path_sets_by_tokens(void **state)
{
    (void)state;
    Run r;
    char *extra = test_format("data: {valid_path: [%s, %s]}\nbalance: {packer: wlb}\ntrain: {eval_tokens: 4096}\n",
                              fx.b, fx.a);
    run_open(&r, extra);
    Trainer *tr = &r.tr;
    Error err = {0};
    assert_int_equal(trainer_valid_begin(tr, &err), 0);
    double read[2] = {0, 0};
    uint64_t size[2] = {0, 0};
    int64_t steps = trainer_valid_steps(tr);
    assert_int_equal(steps, 8);
    for (int64_t j = 0; j < steps; j++) {
        const StepPlan *p;
        const DataSources *data;
        assert_int_equal(trainer_valid_next(tr, &p, &data, &err), 0);
        assert_int_equal(data->n, 2);
        for (int i = 0; i < 2; i++)
            size[i] = data->src[i].n_tokens;
        for (int64_t k = 0; k < p->n_docs; k++)
            if (p->docs[k].source != PLAN_PAD_SOURCE)
                read[p->docs[k].source] += p->docs[k].len;
        double share = (double)size[0] / (double)(size[0] + size[1]), all = read[0] + read[1];
        printf("# batch %lld: set b %.0f tokens read, set a %.0f; b's share of the sets' tokens %.3f: %.0f\n",
               (long long)j + 1, read[0], read[1], share, share * all);
        assert_true(fabs(read[0] - share * all) <= 256);
    }
    double share = (double)size[0] / (double)(size[0] + size[1]);
    assert_true(share < 0.3); /* far from an equal blend, and from data.weights' 1/3 */
    free(extra);
    run_close(&r);
}

/* ---------------------------------------------------------------------------------------------- */
/* Config rules and `wlbtrain eval`'s errors                                                       */

static void resolve_fails(const char *yaml, const char *expect)
{
    Config cfg;
    Error err = {0};
    config_init(&cfg);
    int rc = config_load_string(&cfg, yaml, "v.yaml", &err) != 0 || config_resolve(&cfg, 1, &err) != 0;
    assert_true(rc);
    if (!strstr(err.msg, expect))
        print_error("expected '%s' in: %s\n", expect, err.msg);
    assert_non_null(strstr(err.msg, expect));
    assert_int_equal(err.status, 2);
    config_free(&cfg);
}

static void test_config_rules_and_eval_errors(void **state)
{
    (void)state;
    const char *base = "model: {preset: tiny}\nparallel: {dp: 1}\ndata: {path: x}\ntrain: {device: cpu";
    char *y = test_format("%s, eval_every: 10}\n", base);
    resolve_fails(y, "train.eval_every: needs a validation set: data.valid_path");
    free(y);
    y = test_format("%s}\ndata: {valid_path: v, valid_fraction: 0.1}\n", base);
    resolve_fails(y, "data.valid_fraction: a validation set is data.valid_path or a share of data.path, not both");
    free(y);
    y = test_format("%s}\ndata: {valid_fraction: 1}\n", base);
    resolve_fails(y, "data.valid_fraction");
    free(y);

    CmdResult r;
    const char *no_weights[] = {"eval", "--config", "x.yaml", NULL};
    test_run_wlbtrain(&r, no_weights);
    test_assert_error(&r, "eval: needs --checkpoint PATH");
    test_cmd_free(&r);
    const char *no_config[] = {"eval", "--init-from", "w.safetensors", NULL};
    test_run_wlbtrain(&r, no_config);
    test_assert_error(&r, "eval: --init-from needs --config FILE");
    test_cmd_free(&r);
    const char *dry[] = {"eval", "--checkpoint", "c", "--dry-run", NULL};
    test_run_wlbtrain(&r, dry);
    test_assert_error(&r, "eval: takes --checkpoint or --init-from");
    test_cmd_free(&r);
    /* Weights but no validation set: one error line, nothing run. */
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {dp: 1}\ndata: {path: %s, context_window: 128, global_batch_tokens: 512}\n"
        "balance: {hardware: cpu}\ntrain: {device: cpu}\n", fx.a);
    char *cfg = test_write_file(fx.dir, "noval.yaml", yaml, strlen(yaml));
    const char *no_set[] = {"eval", "--init-from", "w.safetensors", "--config", cfg, NULL};
    test_run_wlbtrain(&r, no_set);
    test_assert_error(&r, "eval: no validation set: set data.valid_path");
    test_cmd_free(&r);
    /* A held-out share that holds out nothing of a set. */
    const char *none[] = {"eval", "--init-from", "w.safetensors", "--config", cfg, "--set", "data.valid_fraction=1e-9",
                          NULL};
    test_run_wlbtrain(&r, none);
    test_assert_error(&r, "data.valid_fraction: 1e-09 holds out no document of data source 1");
    test_cmd_free(&r);
    free(cfg);
    free(yaml);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_partitions_the_documents),
        cmocka_unit_test(test_trainer_never_trains_held_out),
        cmocka_unit_test(test_evaluation_repeats_and_leaves_training),
        cmocka_unit_test(test_loss_is_the_mean_over_labelled_tokens),
        cmocka_unit_test(test_dry_run_plans_the_training_stream),
        cmocka_unit_test(test_eval_tokens_rounded_up),
        cmocka_unit_test(test_valid_path_sets_by_tokens),
        cmocka_unit_test(test_config_rules_and_eval_errors),
    };
    return cmocka_run_group_tests_name("valid", tests, group_setup, group_teardown);
}
