/*
 * test/test_dryrun_overlap.c - the dry run's time breakdown (docs/planner.md, "Where a step's time
 * goes"): in --stats-out's summary as time_breakdown, every stage's shown parts and its bubble add up
 * to the predicted time, with parallel.overlap true and false; overlap hides what the cost model says
 * it hides (TP in the backward, the CP K/V exchange beside the whole documents' attention, the
 * gradients' reduction and ZeRO-1's all-gather over DP x CP, the pipeline's messages) and nothing
 * with it off; the text output and --compare show it; the removed
 * balance.tp_comm_overlap says what replaced it.
 */
#include "test/testlib.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/plan/cost.h"

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

static const char *const parts[] = {"products", "attention", "elementwise", "tp_exposed", "tp_hidden",
                                    "cp_exposed", "cp_hidden", "pp_exposed", "pp_hidden", "dp_exposed",
                                    "dp_hidden", "contention", "optimizer", "bubble"};
enum { N_PARTS = sizeof parts / sizeof parts[0] };

/* A short list of document lengths written into dir (its path: free it): mostly 100-1600 tokens,
 * every 23rd about 3000. */
static char *write_lengths(const char *dir)
{
    char lengths[8192] = "[";
    for (int i = 0; i < 400; i++) {
        char num[16];
        snprintf(num, sizeof num, "%s%d", i ? "," : "", i % 23 == 0 ? 3000 + i : 100 + (i * 131) % 1500);
        strcat(lengths, num);
    }
    strcat(lengths, "]");
    return test_write_file(dir, "lengths.json", lengths, strlen(lengths));
}

/* An 8B model on tp 4 x cp 2 x pp 2 x dp 2 with ZeRO-1 (64 ranks, so DP x CP crosses nodes), the
 * lengths of write_lengths, 4K windows. */
static char *write_config(const char *dir)
{
    char *lpath = write_lengths(dir);
    char *yaml = test_format("model: {preset: llama3-8b}\n"
                             "parallel: {tp: 4, cp: 2, pp: 2, dp: 2, zero: 1}\n"
                             "data: {lengths_file: %s, context_window: 4096, global_batch_tokens: 65536}\n"
                             "balance: {packer: wlb, cp_sharding: hybrid, hardware: h100}\n"
                             "train: {steps: 6}\nlog: {every: 3}\n",
                             lpath);
    char *path = test_write_file(dir, "dry.yaml", yaml, strlen(yaml));
    free(lpath);
    free(yaml);
    return path;
}

/* The summary line's time_breakdown (a new reference: json_decref), and its predicted_s. */
static json_t *read_breakdown(const char *stats, double *predicted)
{
    FILE *f = fopen(stats, "r");
    assert_non_null(f);
    char line[1 << 16];
    json_t *got = NULL;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        if (json_object_get(o, "summary")) {
            *predicted = json_number_value(json_object_get(o, "predicted_s"));
            got = json_incref(json_object_get(o, "time_breakdown"));
        }
        json_decref(o);
    }
    fclose(f);
    assert_non_null(got);
    return got;
}

static double part(json_t *stage, const char *name)
{
    json_t *v = json_object_get(stage, name);
    if (!json_is_number(v)) {
        print_error("time_breakdown stage lacks %s\n", name);
        fail();
    }
    return json_number_value(v);
}

/* Every stage's and the mean's shown parts + bubble = the predicted time; every part >= 0. */
static void check_adds_up(json_t *b, double predicted, int stages)
{
    assert_true(fabs(json_number_value(json_object_get(b, "seconds")) - predicted) <= 1e-5 * predicted);
    json_t *list = json_object_get(b, "stages");
    assert_int_equal(json_array_size(list), stages);
    for (int s = 0; s <= stages; s++) {
        json_t *st = s < stages ? json_array_get(list, s) : json_object_get(b, "mean");
        double shown = 0;
        for (int k = 0; k < N_PARTS; k++) {
            double v = part(st, parts[k]);
            assert_true(v >= -1e-9 * predicted);
            if (!strstr(parts[k], "_hidden"))
                shown += v;
        }
        if (fabs(shown - predicted) > 1e-4 * predicted) {
            print_error("stage %d: parts add up to %.9g s, the step to %.9g s\n", s, shown, predicted);
            fail();
        }
    }
}

static void test_breakdown(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir), *stats = test_format("%s/stats.jsonl", dir);
    json_t *b[2];
    double predicted[2];
    for (int on = 0; on < 2; on++) {
        CmdResult r;
        RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--stats-out", stats, "--set",
            on ? "parallel.overlap=true" : "parallel.overlap=false");
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, on ? "time breakdown, s over the run (parallel.overlap: true"
                                         : "time breakdown, s over the run (parallel.overlap: false"));
        assert_non_null(strstr(r.out, "  mean "));
        test_cmd_free(&r);
        b[on] = read_breakdown(stats, &predicted[on]);
        assert_true(json_is_true(json_object_get(b[on], "overlap")) == on);
        check_adds_up(b[on], predicted[on], 2);
    }
    json_t *off = json_object_get(b[0], "mean"), *on = json_object_get(b[1], "mean");
    printf("# predicted %.4f s with overlap, %.4f s without; tp exposed %.4f / %.4f (hidden %.4f), dp exposed "
           "%.4f / %.4f (hidden %.4f), pp exposed %.4f / %.4f (hidden %.4f), contention %.4f\n", predicted[1],
           predicted[0], part(on, "tp_exposed"), part(off, "tp_exposed"), part(on, "tp_hidden"), part(on, "dp_exposed"),
           part(off, "dp_exposed"), part(on, "dp_hidden"), part(on, "pp_exposed"), part(off, "pp_exposed"),
           part(on, "pp_hidden"), part(on, "contention"));
    /* Without overlap nothing hides and nothing contends. */
    for (int k = 0; k < N_PARTS; k++)
        if (strstr(parts[k], "_hidden") && strcmp(parts[k], "dp_hidden") != 0)
            assert_true(part(off, parts[k]) == 0);
    assert_true(part(off, "contention") == 0);
    /* With it, TP's backward collectives, the gradients' buckets, ZeRO-1's gather and the messages
     * hide in part, and the step is faster; so does CP's K/V exchange, beside the attention of the
     * documents held whole (hybrid keeps the short ones whole). */
    assert_true(part(on, "tp_hidden") > 0 && part(on, "tp_exposed") < part(off, "tp_exposed"));
    assert_true(part(on, "dp_hidden") > part(off, "dp_hidden") && part(on, "dp_exposed") < part(off, "dp_exposed"));
    assert_true(part(on, "pp_hidden") > 0 && part(on, "pp_exposed") < part(off, "pp_exposed"));
    assert_true(part(on, "contention") > 0);
    assert_true(part(on, "cp_hidden") > 0);
    assert_true(predicted[1] < predicted[0]);
    json_decref(b[0]);
    json_decref(b[1]);
    /* per_seq shards every document: no whole document's attention runs beside the exchange, but
     * the sharded ones' runs block by block as the pieces arrive (engine/model/model_cp.c): some of
     * it hides, and with overlap off none. */
    for (int o = 0; o < 2; o++) {
        CmdResult r;
        RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--stats-out", stats, "--set",
            "balance.cp_sharding=per_seq", "--set", o ? "parallel.overlap=true" : "parallel.overlap=false");
        assert_int_equal(r.status, 0);
        test_cmd_free(&r);
        b[o] = read_breakdown(stats, &predicted[o]);
        check_adds_up(b[o], predicted[o], 2);
    }
    off = json_object_get(b[0], "mean");
    on = json_object_get(b[1], "mean");
    printf("# hybrid's K/V exchange hides in part; per_seq: cp exposed %.4f / %.4f (hidden %.4f)\n",
           part(on, "cp_exposed"), part(off, "cp_exposed"), part(on, "cp_hidden"));
    assert_true(part(on, "cp_hidden") > 0 && part(off, "cp_hidden") == 0);
    assert_true(part(on, "cp_exposed") > 0 && part(on, "cp_exposed") < part(off, "cp_exposed"));
    json_decref(b[0]);
    json_decref(b[1]);
    /* Without ZeRO-1 the only DP x CP traffic is the gradients' reduction: its buckets hide behind the
     * last micro-batch's backward with overlap (the last bucket shows), and nothing hides without. */
    for (int o = 0; o < 2; o++) {
        CmdResult r;
        RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--stats-out", stats, "--set", "parallel.zero=0",
            "--set", o ? "parallel.overlap=true" : "parallel.overlap=false");
        assert_int_equal(r.status, 0);
        test_cmd_free(&r);
        b[o] = read_breakdown(stats, &predicted[o]);
        check_adds_up(b[o], predicted[o], 2);
    }
    off = json_object_get(b[0], "mean");
    on = json_object_get(b[1], "mean");
    printf("# without ZeRO-1: dp exposed %.4f / %.4f (hidden %.4f)\n", part(on, "dp_exposed"), part(off, "dp_exposed"),
           part(on, "dp_hidden"));
    assert_true(part(off, "dp_hidden") == 0 && part(on, "dp_hidden") > 0 && part(on, "dp_exposed") > 0);
    assert_true(part(on, "dp_exposed") < part(off, "dp_exposed"));
    json_decref(b[0]);
    json_decref(b[1]);
    /* --compare: the exposed communication and the bubble as a share of the step. */
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--compare", "--steps", "2");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "comm%"));
    assert_non_null(strstr(r.out, "bubble%"));
    test_cmd_free(&r);
    free(cfg);
    free(stats);
    test_rm_rf(dir);
    free(dir);
}

/* The gradients' buckets priced as the engine makes them (train.h): with overlap and a reduction
 * much faster than the backward (8K tokens a replica), what shows of DP is the last bucket alone -
 * the first layer's attention half with the embedding (its MLP half ran beside the attention
 * half's backward) - each step: steps x its all-reduce, to the rounding of the summary's figures. */
static void test_dp_last_bucket(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *lpath = write_lengths(dir);
    char *yaml = test_format("model: {preset: llama3-8b}\n"
                             "parallel: {tp: 4, cp: 1, pp: 1, dp: 2, zero: 0}\n"
                             "data: {lengths_file: %s, context_window: 8192, global_batch_tokens: 16384}\n"
                             "balance: {packer: fixed, hardware: h100}\ntrain: {steps: 3}\n",
                             lpath);
    char *cfg = test_write_file(dir, "dp.yaml", yaml, strlen(yaml)), *stats = test_format("%s/stats.jsonl", dir);
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--stats-out", stats);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    double predicted;
    json_t *b = read_breakdown(stats, &predicted), *mean = json_object_get(b, "mean");
    /* The same config's cost model, in this process. */
    Config c;
    CostModel m;
    Error err = {0};
    config_init(&c);
    assert_int_equal(config_load_string(&c, yaml, "dp.yaml", &err), 0);
    assert_int_equal(config_resolve(&c, 0, &err), 0);
    assert_int_equal(cost_model_init(&m, &c, &err), 0);
    double mlp = 3 * m.d_model * m.ffn_local + m.d_model;
    double last = cost_dp_reduce_s(&m, m.layer_params - mlp + m.embed_params);
    printf("# dp exposed %.6f s over 3 steps; the last bucket's all-reduce %.6f s a step\n", part(mean, "dp_exposed"),
           last);
    assert_true(fabs(part(mean, "dp_exposed") - 3 * last) < 1e-5 + 1e-3 * 3 * last);
    assert_true(part(mean, "dp_hidden") > 2 * part(mean, "dp_exposed"));
    config_free(&c);
    json_decref(b);
    free(stats);
    free(cfg);
    free(yaml);
    free(lpath);
    test_rm_rf(dir);
    free(dir);
}

/* The knob the cost model had before it priced each collective is refused, saying what replaced it. */
static void test_removed_knob(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir);
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--set", "balance.tp_comm_overlap=1");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "balance.tp_comm_overlap: removed: the cost model prices each collective"));
    assert_non_null(strstr(r.err, "parallel.overlap"));
    test_cmd_free(&r);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_breakdown),
        cmocka_unit_test(test_dp_last_bucket),
        cmocka_unit_test(test_removed_knob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
