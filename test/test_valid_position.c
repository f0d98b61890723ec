/*
 * test/test_valid_position.c - the validation loss by token position (train.eval_position_buckets),
 * in one process.
 *
 * On a corpus with documents longer than the 128-token window (their later pieces keep their
 * offsets as positions, up to 254): every bucket's count of labelled tokens equals the count made
 * here from the evaluation's plans (each piece's labelled tokens at its offset onward), the counts
 * add up to the evaluation's, and the buckets' token-weighted mean equals the validation loss. The
 * auto edges for several windows, and the config rules. (The same figures on every layout, CP and
 * PP included: test_parallel, whose validation runs report them.)
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"

static char *dir, *docs;

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    dir = test_tmpdir();
    docs = test_write_docs(dir, "long", 5, 200, 3, 64);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(dir);
    free(dir);
    free(docs);
    return 0;
}

typedef struct Run {
    Config cfg;
    Comm comm;
    Trainer tr;
} Run;

static void run_open(Run *r, const char *buckets)
{
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: %s, context_window: 128, global_batch_tokens: 512, valid_fraction: 0.3}\n"
        "balance: {hardware: cpu, packer: wlb}\n"
        "train: {device: cpu, steps: 4, lr: 0.003, warmup_steps: 1, eval_tokens: 2048,"
        " eval_position_buckets: %s}\n",
        docs, buckets);
    Error err = {0};
    config_init(&r->cfg);
    int rc = config_load_string(&r->cfg, yaml, "t.yaml", &err) != 0 || config_resolve(&r->cfg, 1, &err) != 0 ||
             trainer_stage_layers(&r->cfg, NULL, NULL, &err) != 0 || comm_start(&r->comm, 0, &err) != 0 ||
             comm_split(&r->comm, 1, 1, 1, 1, 0, &err) != 0 || trainer_init(&r->tr, &r->cfg, &r->comm, &err) != 0;
    if (rc)
        print_error("setup: %s\n", err.msg);
    assert_int_equal(rc, 0);
    free(yaml);
}

static void run_close(Run *r)
{
    trainer_free(&r->tr);
    comm_finish(&r->comm);
    config_free(&r->cfg);
}

/* The labelled tokens of the evaluation's plans by bucket, counted from the pieces: a piece of
 * document d at offset o with len tokens labels positions o .. o + len - 1, less the last when the
 * piece ends its document. */
static void count_from_plans(Trainer *tr, const int64_t *from, int n, int64_t *count, int64_t *max_pos)
{
    Error err = {0};
    memset(count, 0, (size_t)n * sizeof *count);
    *max_pos = 0;
    assert_int_equal(trainer_valid_begin(tr, &err), 0);
    for (int64_t j = 0; j < trainer_valid_steps(tr); j++) {
        const StepPlan *p;
        const DataSources *data;
        assert_int_equal(trainer_valid_next(tr, &p, &data, &err), 0);
        for (int64_t k = 0; k < p->n_docs; k++) {
            const PlanDoc *d = &p->docs[k];
            if (d->source == PLAN_PAD_SOURCE)
                continue;
            uint64_t doc_len = data_source_doc_len(&data->src[d->source], d->doc);
            int64_t labelled = d->len - (d->offset + (uint64_t)d->len >= doc_len);
            for (int64_t i = 0; i < labelled; i++) {
                int64_t pos = (int64_t)d->offset + i;
                int b = n - 1;
                while (b > 0 && pos < from[b])
                    b--;
                count[b]++;
                *max_pos = pos > *max_pos ? pos : *max_pos;
            }
        }
    }
}

static void test_buckets_add_up_to_the_loss(void **state)
{
    (void)state;
    Run r;
    run_open(&r, "[8, 32, 100]");
    Error err = {0};
    EvalStats ev;
    assert_int_equal(trainer_evaluate(&r.tr, 1, &ev, &err), 0);
    const PositionLoss *p = &ev.by_position;
    assert_int_equal(p->n, 4);
    const int64_t want_from[4] = {0, 8, 32, 100};
    int64_t count[4], max_pos, targets = 0;
    double weighted = 0;
    count_from_plans(&r.tr, want_from, 4, count, &max_pos);
    char line[1024];
    trainer_position_text(p, line, sizeof line);
    printf("# valid_loss %.12f over %lld labelled tokens, positions up to %lld; by position %s\n", ev.loss,
           (long long)ev.targets, (long long)max_pos, line);
    assert_true(max_pos >= 128); /* pieces past the window's length keep their offsets */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(p->from[i], want_from[i]);
        assert_int_equal(p->targets[i], count[i]);
        assert_true(p->targets[i] > 0 && isfinite(p->loss[i]));
        targets += p->targets[i];
        weighted += p->loss[i] * (double)p->targets[i];
    }
    assert_int_equal(targets, ev.targets);
    printf("# token-weighted mean of the buckets %.12f (%.1e from valid_loss)\n", weighted / (double)targets,
           fabs(weighted / (double)targets - ev.loss) / ev.loss);
    assert_true(fabs(weighted / (double)targets - ev.loss) <= 1e-12 * ev.loss);
    /* The buckets tell positions apart: their means are not all one figure. */
    assert_true(fabs(p->loss[0] - p->loss[3]) > 1e-6);
    run_close(&r);

    /* [] = one bucket: the loss itself. */
    run_open(&r, "[]");
    EvalStats one;
    assert_int_equal(trainer_evaluate(&r.tr, 1, &one, &err), 0);
    assert_int_equal(one.by_position.n, 1);
    assert_int_equal(one.by_position.targets[0], one.targets);
    assert_true(fabs(one.by_position.loss[0] - one.loss) <= 1e-12 * one.loss);
    assert_true(one.loss == ev.loss); /* the buckets change nothing else */
    run_close(&r);
}

static void test_auto_edges_and_rules(void **state)
{
    (void)state;
    struct {
        int64_t window;
        int n;
        int64_t from[10];
    } cases[] = {
        {128, 1, {0}},
        {1024, 1, {0}},
        {8192, 3, {0, 1024, 4096}},
        {131072, 5, {0, 1024, 4096, 16384, 65536}},
        {200000, 6, {0, 1024, 4096, 16384, 65536, 131072}},
        {1 << 20, 8, {0, 1024, 4096, 16384, 65536, 131072, 262144, 524288}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Config cfg;
        Error err = {0};
        config_init(&cfg);
        char *yaml = test_format("model: {preset: tiny, max_seq_len: %lld}\ndata: {path: x, context_window: %lld}\n",
                                 (long long)cases[c].window, (long long)cases[c].window);
        assert_int_equal(config_load_string(&cfg, yaml, "t.yaml", &err), 0);
        assert_int_equal(config_resolve(&cfg, 0, &err), 0);
        int64_t from[EVAL_MAX_BUCKETS];
        int n = trainer_position_buckets(&cfg, from);
        assert_int_equal(n, cases[c].n);
        for (int i = 0; i < n; i++)
            assert_int_equal(from[i], cases[c].from[i]);
        free(yaml);
        config_free(&cfg);
    }
    const char *bad[][2] = {
        {"[64, 64]", "train.eval_position_buckets: edges must increase, got 64 after 64"},
        {"[0, 5]", "must be between 1 and"},
        {"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]", "at most 15 edges, got 16"},
        {"sometimes", "expected one of auto or a list of integers"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        Config cfg;
        Error err = {0};
        config_init(&cfg);
        char *yaml = test_format("model: {preset: tiny}\ndata: {path: x}\ntrain: {eval_position_buckets: %s}\n",
                                 bad[c][0]);
        int rc = config_load_string(&cfg, yaml, "t.yaml", &err);
        if (rc == 0)
            rc = config_resolve(&cfg, 0, &err);
        printf("# %s: %s\n", bad[c][0], err.msg);
        assert_int_equal(rc, -1);
        assert_non_null(strstr(err.msg, bad[c][1]));
        free(yaml);
        config_free(&cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_add_up_to_the_loss),
        cmocka_unit_test(test_auto_edges_and_rules),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
