/*
 * test/test_calibrate.c - `wlbtrain calibrate` on the CPU backend writes a profile that checks out
 * and that the dry run and training load; bad profiles and bad calibrate commands are one error
 * line (exit 2); the metrics' micro-batch balance (mb_imbalance, mb_imbalance_measured,
 * mb_ms_predicted, mb_ms_measured) is consistent; and the profile's rates drive the predictions.
 * No assertion here depends on how fast the machine is (bench/planner_calibration.sh measures the
 * accuracy).
 */
#include "test/testlib.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

typedef struct Fixture {
    char *dir, *cfg, *profile, *metrics;
} Fixture;

/* A small model on a data set of short and long documents: 4 micro-batches of about 256 tokens. */
static void fixture(Fixture *f, const char *packer)
{
    f->dir = test_tmpdir();
    char *docs = test_write_docs(f->dir, "docs", 7, 400, 4, 64);
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, max_seq_len: 256,"
        " rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false}\n"
        "parallel: {dp: 1}\n"
        "data: {path: %s, context_window: 256, global_batch_tokens: 1024}\n"
        "balance: {packer: %s, hardware: cpu}\n"
        "train: {device: cpu, steps: 3, lr: 0.01, warmup_steps: 1}\n"
        "log: {every: 10, metrics: %s/m.jsonl}\n",
        docs, packer, f->dir);
    f->cfg = test_write_file(f->dir, "c.yaml", yaml, strlen(yaml));
    f->profile = test_format("%s/profile.json", f->dir);
    f->metrics = test_format("%s/m.jsonl", f->dir);
    free(yaml);
    free(docs);
}

static void fixture_free(Fixture *f)
{
    test_rm_rf(f->dir);
    free(f->dir);
    free(f->cfg);
    free(f->profile);
    free(f->metrics);
}

static void calibrate(const Fixture *f)
{
    CmdResult r;
    RUN(&r, "calibrate", "--config", f->cfg, "--out", f->profile);
    if (r.status != 0)
        print_error("%s%s", r.out, r.err);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "calibrate: wrote "));
    test_cmd_free(&r);
}

/* Trains with the given --set (NULL: none); the metrics' lines as JSON objects. */
static int train(const Fixture *f, const char *set, json_t **lines, int max)
{
    CmdResult r;
    if (set)
        RUN(&r, "--config", f->cfg, "--set", set);
    else
        RUN(&r, "--config", f->cfg);
    if (r.status != 0)
        print_error("%s%s", r.out, r.err);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    FILE *in = fopen(f->metrics, "r");
    assert_non_null(in);
    char line[8192];
    int n = 0;
    while (n < max && fgets(line, sizeof line, in)) {
        json_error_t je;
        lines[n] = json_loads(line, 0, &je);
        assert_non_null(lines[n]);
        n++;
    }
    fclose(in);
    return n;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static void test_calibrate_writes_a_profile(void **state)
{
    (void)state;
    Fixture f;
    fixture(&f, "wlb");
    calibrate(&f);
    json_error_t je;
    json_t *p = json_load_file(f.profile, 0, &je);
    assert_non_null(p);
    assert_string_equal(json_string_value(json_object_get(p, "format")), "wlbtrain-calibration");
    assert_int_equal(json_integer_value(json_object_get(p, "version")), 2);
    assert_string_equal(json_string_value(json_object_get(p, "backend")), "cpu");
    double eff = num(p, "gemm_efficiency");
    assert_true(eff > 0 && eff <= 1 && num(p, "hbm_gbps") > 0 && num(p, "launch_us") >= 0);
    json_t *att = json_object_get(p, "attention"), *q = json_object_get(att, "q");
    /* Lengths 16, 32, ... 256 (the window), tile 1 on the CPU. */
    assert_int_equal(json_array_size(q), 5);
    assert_int_equal(json_integer_value(json_array_get(q, 4)), 256);
    assert_int_equal(json_array_size(json_object_get(att, "fwd_tflops")), 5);
    /* The head size it was measured at: the cost model takes the table by it. */
    json_t *model = json_object_get(p, "model");
    assert_int_equal(json_integer_value(json_object_get(att, "head_dim")),
                     json_integer_value(json_object_get(model, "d_model")) /
                         json_integer_value(json_object_get(model, "n_heads")));
    json_decref(p);

    char *set = test_format("balance.calibration=%s", f.profile);
    CmdResult r;
    RUN(&r, "--config", f.cfg, "--dry-run", "--steps", "2", "--set", set);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    json_t *lines[4];
    assert_int_equal(train(&f, set, lines, 4), 3);
    for (int i = 0; i < 3; i++)
        json_decref(lines[i]);
    free(set);
    fixture_free(&f);
}

static void test_bad_profiles_and_commands(void **state)
{
    (void)state;
    Fixture f;
    fixture(&f, "wlb");
    const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 3, \"backend\": \"cpu\"}", "calibration version must be"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 2, \"backend\": \"cpu\", \"peak_tflops\": 1, "
         "\"gemm_efficiency\": 0.5, \"hbm_gbps\": 10, \"launch_us\": 0}", "attention: missing"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 2,", "line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *path = test_write_file(f.dir, "bad.json", bad[i].text, strlen(bad[i].text));
        char *set = test_format("balance.calibration=%s", path);
        CmdResult r;
        RUN(&r, "--config", f.cfg, "--dry-run", "--steps", "1", "--set", set);
        test_assert_error(&r, bad[i].msg);
        test_cmd_free(&r);
        RUN(&r, "--config", f.cfg, "--set", set);
        test_assert_error(&r, bad[i].msg);
        test_cmd_free(&r);
        free(set);
        free(path);
    }
    CmdResult r;
    RUN(&r, "calibrate", "--config", f.cfg);
    test_assert_error(&r, "calibrate: needs --out PROFILE");
    test_cmd_free(&r);
    RUN(&r, "calibrate", "--config", f.cfg, "--out", f.profile, "--dry-run");
    test_assert_error(&r, "calibrate: takes --config, --set and --out only");
    test_cmd_free(&r);
    if (!test_gpu_visible()) {
        RUN(&r, "calibrate", "--config", f.cfg, "--out", f.profile, "--set", "train.device=cuda");
        test_assert_error(&r, "train.device: ");
        test_cmd_free(&r);
    }
    /* Nothing was written by the failed commands. */
    FILE *none = fopen(f.profile, "r");
    assert_null(none);
    fixture_free(&f);
}

/* max / mean of a JSON array of numbers. */
static double max_over_mean(json_t *a)
{
    double mx = 0, sum = 0;
    size_t n = json_array_size(a);
    for (size_t i = 0; i < n; i++) {
        double x = json_number_value(json_array_get(a, i));
        mx = x > mx ? x : mx;
        sum += x;
    }
    return sum > 0 ? mx * (double)n / sum : 1;
}

static void test_metrics_micro_batch_balance(void **state)
{
    (void)state;
    Fixture f;
    fixture(&f, "wlb");
    json_t *lines[4];
    assert_int_equal(train(&f, NULL, lines, 4), 3);
    for (int i = 0; i < 3; i++) {
        json_t *o = lines[i], *pred = json_object_get(o, "mb_ms_predicted"), *meas = json_object_get(o, "mb_ms_measured");
        assert_true(json_is_array(pred) && json_is_array(meas));
        assert_int_equal(json_array_size(pred), 4); /* M = 4 micro-batches of replica 0 */
        assert_int_equal(json_array_size(meas), 4);
        for (size_t k = 0; k < 4; k++) {
            double p = json_number_value(json_array_get(pred, k)), m = json_number_value(json_array_get(meas, k));
            /* An empty micro-batch is 0 on both sides, any other positive on both. */
            assert_true((p == 0) == (m == 0) && p >= 0 && m >= 0);
        }
        /* The step's balance is the arrays' max / mean (one replica), to the printed digits. */
        assert_true(fabs(num(o, "mb_imbalance") - max_over_mean(pred)) < 2e-3 * num(o, "mb_imbalance"));
        assert_true(fabs(num(o, "mb_imbalance_measured") - max_over_mean(meas)) < 2e-3 * num(o, "mb_imbalance_measured"));
        assert_true(num(o, "mb_imbalance") >= 1 && num(o, "mb_imbalance_measured") >= 1);
        json_decref(o);
    }
    fixture_free(&f);
}

/* The profile's rates are what the trainer predicts with: with the fixed packer (whose packing does
 * not depend on the cost model) the calibrated profile predicts other times than the default
 * profile, and a copy with every rate halved and launch_us doubled predicts exactly twice them. */
static void test_profile_drives_predictions(void **state)
{
    (void)state;
    Fixture f;
    fixture(&f, "fixed");
    calibrate(&f);
    json_error_t je;
    json_t *p = json_load_file(f.profile, 0, &je);
    assert_non_null(p);
    json_object_set_new(p, "gemm_efficiency", json_real(num(p, "gemm_efficiency") / 2));
    json_object_set_new(p, "hbm_gbps", json_real(num(p, "hbm_gbps") / 2));
    json_object_set_new(p, "launch_us", json_real(num(p, "launch_us") * 2));
    json_t *att = json_object_get(p, "attention");
    const char *keys[] = {"fwd_tflops", "bwd_tflops"};
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(att, keys[k]);
        for (size_t i = 0; i < json_array_size(a); i++)
            json_array_set_new(a, i, json_real(json_number_value(json_array_get(a, i)) / 2));
    }
    char *slow = test_format("%s/slow.json", f.dir);
    assert_int_equal(json_dump_file(p, slow, 0), 0);
    json_decref(p);

    json_t *def[4], *cal[4], *half[4];
    char *set_cal = test_format("balance.calibration=%s", f.profile), *set_slow = test_format("balance.calibration=%s", slow);
    assert_int_equal(train(&f, NULL, def, 4), 3);
    assert_int_equal(train(&f, set_cal, cal, 4), 3);
    assert_int_equal(train(&f, set_slow, half, 4), 3);
    int differs = 0;
    for (int i = 0; i < 3; i++) {
        json_t *pd = json_object_get(def[i], "mb_ms_predicted"), *pc = json_object_get(cal[i], "mb_ms_predicted"),
               *ph = json_object_get(half[i], "mb_ms_predicted");
        for (size_t k = 0; k < json_array_size(pc); k++) {
            double d = json_number_value(json_array_get(pd, k)), c = json_number_value(json_array_get(pc, k)),
                   h = json_number_value(json_array_get(ph, k));
            assert_true(c > 0);
            assert_true(fabs(h - 2 * c) <= 2e-3 * h);
            differs += fabs(d - c) > 0.1 * c;
        }
        json_decref(def[i]);
        json_decref(cal[i]);
        json_decref(half[i]);
    }
    assert_true(differs > 0);
    free(set_cal);
    free(set_slow);
    free(slow);
    fixture_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate_writes_a_profile),
        cmocka_unit_test(test_bad_profiles_and_commands),
        cmocka_unit_test(test_metrics_micro_batch_balance),
        cmocka_unit_test(test_profile_drives_predictions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
