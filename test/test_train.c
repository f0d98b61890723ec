/*
 * test/test_train.c - training as a user runs it: the loss falls on a learnable corpus, the
 * metrics file has a line per step with every field, runs are repeatable bit for bit (also with
 * another number of threads), and the errors.
 */
#include "test/testlib.h"

#include "engine/train/train.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_idx.h"
#include "util/rng.h"

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

/* Documents that count (each token the previous plus one, modulo 60) from a random start, with a
 * random token now and then: a tiny model learns the rule in a few dozen steps. */
static char *write_corpus(const char *dir)
{
    char *prefix = test_format("%s/counting", dir);
    DataIdxWriter w;
    Error err = {0};
    Rng rng;
    rng_seed(&rng, 2);
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    for (int d = 0; d < 200; d++) {
        int32_t tok[300];
        int len = 20 + (int)rng_below(&rng, 280);
        tok[0] = (int32_t)rng_below(&rng, 60);
        for (int i = 1; i < len; i++)
            tok[i] = rng_below(&rng, 20) ? (tok[i - 1] + 1) % 60 : (int32_t)rng_below(&rng, 60);
        assert_int_equal(data_idx_writer_add(&w, tok, (uint64_t)len, &err), 0);
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    return prefix;
}

static char *write_config(const char *dir, const char *prefix)
{
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {dp: 1}\n"
        "data: {path: %s, context_window: 128, global_batch_tokens: 512}\n"
        "balance: {hardware: cpu}\n"
        "train: {device: cpu, steps: 40, lr: 0.01, warmup_steps: 5}\n"
        "log: {every: 10, metrics: %s/run/metrics.jsonl}\n",
        prefix, dir);
    char *path = test_write_file(dir, "train.yaml", yaml, strlen(yaml));
    free(yaml);
    return path;
}

/* The losses of a metrics file, checking each line's fields. */
static int read_losses(const char *path, double *loss, int max)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int n = 0;
    const char *keys[] = {"step", "loss", "lr", "grad_norm", "tokens", "batch_fraction", "tokens_per_s", "step_ms"};
    while (fgets(line, sizeof line, f) && n < max) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            assert_non_null(json_object_get(o, keys[k]));
        assert_int_equal(json_integer_value(json_object_get(o, "step")), n + 1);
        loss[n++] = json_number_value(json_object_get(o, "loss"));
        json_decref(o);
    }
    fclose(f);
    return n;
}

static void test_loss_falls(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = write_corpus(dir), *cfg = write_config(dir, prefix);
    char *metrics = test_format("%s/run/metrics.jsonl", dir);
    CmdResult r;
    RUN(&r, "--config", cfg);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "train: custom model, "));
    assert_non_null(strstr(r.out, "step    10/40  loss "));
    assert_non_null(strstr(r.out, "step    40/40  loss "));
    assert_non_null(strstr(r.out, " left)"));
    test_cmd_free(&r);
    double loss[64];
    assert_int_equal(read_losses(metrics, loss, 64), 40);
    /* From about ln(64) = 4.2 to well under half of it. */
    double first = (loss[0] + loss[1]) / 2, last = (loss[38] + loss[39]) / 2;
    if (!(first > 3.5 && last < 0.5 * first)) {
        print_error("loss %g at the start, %g at the end\n", first, last);
        fail();
    }
    free(metrics);
    free(cfg);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

static void test_repeatable(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = write_corpus(dir), *cfg = write_config(dir, prefix);
    char *metrics = test_format("%s/run/metrics.jsonl", dir);
    double a[64], b[64];
    CmdResult r;
    setenv("OMP_NUM_THREADS", "2", 1);
    RUN(&r, "--config", cfg, "--steps", "8");
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    assert_int_equal(read_losses(metrics, a, 64), 8);
    /* One thread: every sum runs in the same order, so the losses are the same bits. */
    setenv("OMP_NUM_THREADS", "1", 1);
    RUN(&r, "--config", cfg, "--steps", "8");
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    unsetenv("OMP_NUM_THREADS");
    assert_int_equal(read_losses(metrics, b, 64), 8);
    assert_memory_equal(a, b, sizeof(double) * 8);
    free(metrics);
    free(cfg);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

/* A corpus of outliers with a short document now and then: with outlier thresholds [32, 64, 96] and
 * 16 micro-batches a step, the queues fill slowly (about 9 documents each a step). The wlb packer
 * used to count the outliers it queued against the step's batch, so step 1 trained only the few
 * short documents it read and left most of its micro-batches without a token (issue 48); it reads
 * on until the step is full now. */
static char *write_outlier_corpus(const char *dir)
{
    char *prefix = test_format("%s/outliers", dir);
    DataIdxWriter w;
    Error err = {0};
    Rng rng;
    rng_seed(&rng, 12);
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    for (int d = 0; d < 400; d++) {
        int32_t tok[128];
        int len = rng_below(&rng, 12) ? 32 + (int)rng_below(&rng, 96) : 4 + (int)rng_below(&rng, 20);
        for (int i = 0; i < len; i++)
            tok[i] = (int32_t)rng_below(&rng, 60);
        assert_int_equal(data_idx_writer_add(&w, tok, (uint64_t)len, &err), 0);
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    return prefix;
}

/* The losses of a metrics file (every field checked by read_losses) into loss[]. */
static void run_outliers(const char *cfg, int ranks, const char *const *sets, const char *metrics, double *loss)
{
    const char *argv[40];
    int k = 0;
    char np[16];
    const char *bin = getenv("WLBTRAIN");
    test_launch_argv(argv, &k, 120, ranks, NULL, np);
    argv[k++] = bin ? bin : "./wlbtrain";
    argv[k++] = "--config";
    argv[k++] = cfg;
    for (int i = 0; sets[i]; i++) {
        argv[k++] = "--set";
        argv[k++] = sets[i];
    }
    argv[k] = NULL;
    CmdResult r;
    test_run(&r, argv);
    if (r.status != 0)
        print_error("%s\n%s\n", r.out, r.err);
    assert_int_equal(r.status, 0);
    /* The closing line: the spread of the steps' tokens against the batch, none under 75%. */
    const char *line = strstr(r.out, "batch: tokens per step over steps 1-3 against data.global_batch_tokens 2048: ");
    assert_non_null(line);
    assert_non_null(strstr(line, ", 0 under 75%\n"));
    assert_null(strstr(r.err, "under 75%"));
    test_cmd_free(&r);
    assert_int_equal(read_losses(metrics, loss, 64), 3);
    /* batch_fraction is the step's tokens over the batch. */
    FILE *f = fopen(metrics, "r");
    assert_non_null(f);
    char text[4096];
    while (fgets(text, sizeof text, f)) {
        json_error_t je;
        json_t *o = json_loads(text, 0, &je);
        assert_non_null(o);
        double tokens = (double)json_integer_value(json_object_get(o, "tokens"));
        assert_true(fabs(json_number_value(json_object_get(o, "batch_fraction")) - tokens / 2048) < 1e-5);
        json_decref(o);
    }
    fclose(f);
}

/* The batch at the first step: step 1 of the outlier corpus, when the queues are empty, trains at
 * least 75% of global_batch_tokens with no micro-batch empty (it held 16 micro-batches, most of
 * them empty, before issue 48), training says so in its metrics (batch_fraction) and its closing
 * line, and every layout gives the one process's losses. */
static void test_first_step_trains_the_batch(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = write_outlier_corpus(dir);
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {dp: 1}\n"
        "data: {path: %s, context_window: 128, global_batch_tokens: 2048}\n"
        "balance: {hardware: cpu, packer: wlb, outlier_thresholds: [32, 64, 96]}\n"
        "train: {device: cpu, steps: 3, lr: 0.003, warmup_steps: 1, eps: 1.0e-3}\n"
        "log: {every: 1, metrics: %s/m.jsonl}\n",
        prefix, dir);
    char *cfg = test_write_file(dir, "outliers.yaml", yaml, strlen(yaml));
    char *metrics = test_format("%s/m.jsonl", dir), *stats = test_format("%s/stats.jsonl", dir);
    /* The plan of step 1 (the dry run plans the same steps). */
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "1", "--stats-out", stats);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    char *text = test_read_file(stats, NULL);
    assert_non_null(text);
    json_error_t je;
    json_t *o = json_loads(strtok(text, "\n"), 0, &je);
    assert_non_null(o);
    json_t *mbs = json_object_get(o, "mb_tokens");
    size_t empty = 0;
    for (size_t i = 0; i < json_array_size(mbs); i++)
        empty += json_integer_value(json_array_get(mbs, i)) == 0;
    int64_t tokens = json_integer_value(json_object_get(o, "tokens"));
    printf("# step 1: %lld tokens of 2048, %zu of %zu micro-batches without a token\n", (long long)tokens, empty,
           json_array_size(mbs));
    assert_int_equal(json_array_size(mbs), 16);
    assert_int_equal(empty, 0);
    assert_true(4 * tokens >= 3 * 2048);
    json_decref(o);
    free(text);
    double one[64], other[64];
    const char *none[] = {NULL};
    run_outliers(cfg, 0, none, metrics, one);
    const char *layout[] = {"parallel.pp=2", "parallel.cp=2", "balance.cp_sharding=hybrid", NULL};
    run_outliers(cfg, 4, layout, metrics, other);
    for (int i = 0; i < 3; i++) {
        printf("# step %d: loss %.9f in one process, %.9f on pp 2 x cp 2\n", i + 1, one[i], other[i]);
        assert_true(fabs(one[i] - other[i]) <= 1e-5 * fabs(one[i]));
    }
    free(stats);
    free(metrics);
    free(cfg);
    free(yaml);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

static void test_errors(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = write_corpus(dir), *cfg = write_config(dir, prefix);
    CmdResult r;
    /* train.device: cuda without the CUDA backend, or without a GPU, is one line and exit 2; with
     * both it trains. Which case this is comes from the build (WLB_CUDA) and the machine's device
     * files, not from the binary under test. */
    RUN(&r, "--config", cfg, "--set", "train.device=cuda", "--set", "train.precision=fp32", "--steps", "2");
#ifndef WLB_CUDA
    test_assert_error(&r, "train.device: this wlbtrain was built without the CUDA backend");
#else
    if (test_gpu_visible()) {
        if (r.status != 0)
            print_error("%s\n", r.err);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "backend cuda"));
        assert_non_null(strstr(r.out, "step     2/2  loss "));
    } else {
        test_assert_error(&r, "train.device: cuda: no GPU visible");
    }
#endif
    test_cmd_free(&r);
    /* Started by hand, the job is one process: a layout of more ranks does not fit it. */
    RUN(&r, "--config", cfg, "--set", "parallel.tp=2");
    test_assert_error(&r, "parallel.dp: tp * cp * pp * dp = 2 * 1 * 1 * 1 = 2, but the job has 1 ranks");
    test_cmd_free(&r);
    setenv("WLBTRAIN_FAULT", "crash@0:1", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLBTRAIN_FAULT");
    test_assert_error(&r, "WLBTRAIN_FAULT: unknown fault 'crash' (error, kill, plan, nan, savekill, savesignal, hang, slow, stall, "
                          "exit or savestall)");
    test_cmd_free(&r);
    /* The communication hooks' variables (engine/comm/comm.h): a malformed one is bad input. */
    setenv("WLB_COMM_LINK", "50", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLB_COMM_LINK");
    test_assert_error(&r, "WLB_COMM_LINK: \"50\": expected LATENCY_US,GBPS");
    test_cmd_free(&r);
    setenv("WLB_COMM_LINK", "50,0", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLB_COMM_LINK");
    test_assert_error(&r, "WLB_COMM_LINK: \"50,0\": expected LATENCY_US,GBPS (latency >= 0, bandwidth > 0)");
    test_cmd_free(&r);
    setenv("WLB_COMM_CHAOS", "0", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLB_COMM_CHAOS");
    test_assert_error(&r, "WLB_COMM_CHAOS: \"0\": expected the longest delay in microseconds, 1 .. 10000000");
    test_cmd_free(&r);
    setenv("WLBTRAIN_FAULT", "error@0:2", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLBTRAIN_FAULT");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "wlbtrain: error: WLBTRAIN_FAULT: injected failure at step 2"));
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--set", "data.path=", "--set", "data.lengths_file=x.txt");
    test_assert_error(&r, "data.path: training reads tokens: set data.path");
    test_cmd_free(&r);
    /* A missing data set: training's own message (the dry run's says it needs only lengths). */
    char *missing = test_format("data.path=%s/none", dir);
    RUN(&r, "--config", cfg, "--set", missing);
    char *expect = test_format("%s/none.idx: cannot open: No such file or directory (training reads the tokens, "
                               "PREFIX.idx and PREFIX.bin of each data set; wlbtrain convert makes a data set from "
                               "text)", dir);
    test_assert_error(&r, expect);
    assert_null(strstr(r.err, "dry run"));
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--dry-run", "--set", missing);
    test_assert_error(&r, "none.idx: cannot open: No such file or directory (a dry run needs only document lengths");
    test_cmd_free(&r);
    free(missing);
    free(expect);
    RUN(&r, "--config", cfg, "--set", "train.init_from=/nonexistent/w.safetensors");
    test_assert_error(&r, "/nonexistent/w.safetensors: cannot open: No such file or directory");
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--set", "model.vocab_size=32");
    test_assert_error(&r, "outside model.vocab_size (32)");
    test_cmd_free(&r);
    char *bad = test_format("log.metrics=%s/train.yaml/m.jsonl", dir);
    RUN(&r, "--config", cfg, "--set", bad);
    test_assert_error(&r, "m.jsonl cannot be written: ");
    test_cmd_free(&r);
    /* Non-finite before any update: the hint is the weights and the model's settings, not the
     * learning rate (issue 50); a RoPE base of 1 or less is refused. */
    setenv("WLBTRAIN_FAULT", "nan@0:1", 1);
    RUN(&r, "--config", cfg);
    unsetenv("WLBTRAIN_FAULT");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "step 1: the gradient norm is nan; stopping (train.nonfinite: stop; before any "
                                  "update of this run, so not the learning rate: check the weights"));
    assert_null(strstr(r.err, "lower train.lr"));
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--set", "model.rope_theta=0.5");
    test_assert_error(&r, "model.rope_theta");
    test_cmd_free(&r);
    /* A batch of far too many windows is said as what it is, not blamed on parallel.dp (issue 50). */
    RUN(&r, "--config", cfg, "--set", "data.global_batch_tokens=1000000000000000");
    test_assert_error(&r, "data.global_batch_tokens: 1000000000000000 tokens are ");
    assert_null(strstr(r.err, "the planner needs a number for dp"));
    test_cmd_free(&r);
    /* A warmup set longer than the run (issue 50): refused before the first step; equal is fine; the
     * config's warmup (5) over a run --steps shortened: a warning. */
    RUN(&r, "--config", cfg, "--set", "train.warmup_steps=50", "--steps", "3");
    test_assert_error(&r, "--set train.warmup_steps=50: train.warmup_steps: 50, longer than the run (train.steps 3)");
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--set", "train.warmup_steps=2", "--steps", "2");
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.err, "warmup"));
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--steps", "2");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.err, "wlbtrain: warning: "));
    assert_non_null(strstr(r.err, "train.warmup_steps 5 is longer than this run's 2 steps"));
    test_cmd_free(&r);
    free(bad);
    free(cfg);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

/* parallel.comm's choice: two ranks share a GPU only on one machine with one PCI place; one GPU
 * visible per rank (every rank's device 0 has a place of its own) shares nothing; CPUs (-1) never. */
static void test_shared_device(void **state)
{
    (void)state;
    int a, b;
    const double own[] = {7, 0x1b00, 7, 0x2900, 9, 0x1b00, 9, 0x2900}; /* 2 machines, 2 GPUs each */
    assert_int_equal(trainer_shared_device(own, 4, &a, &b), -1);
    assert_int_equal(a, -1);
    const double shared[] = {7, 0x1b00, 7, 0x2900, 7, 0x2900, 7, 0x1b00};
    assert_int_equal(trainer_shared_device(shared, 4, &a, &b), 0x1b00);
    assert_int_equal(a, 0);
    assert_int_equal(b, 3);
    const double cpus[] = {7, -1, 7, -1};
    assert_int_equal(trainer_shared_device(cpus, 2, &a, &b), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_device),
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_repeatable),
        cmocka_unit_test(test_first_step_trains_the_batch),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("train", tests, NULL, NULL);
}
