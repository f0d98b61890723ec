/*
 * test/test_dryrun.c - the dry run as a user runs it: per-step lines, the stats file (every field
 * the issue names, a summary last), --compare, reading lengths from a Megatron .idx, a large
 * cluster, and the errors.
 */
#include "test/testlib.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_idx.h"

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

/* A config whose lengths come from a small list written here. */
static char *write_config(const char *dir, const char *extra)
{
    char lengths[8192] = "[";
    for (int i = 0; i < 600; i++) {
        char num[16];
        /* Mostly short, every 37th long: outliers for a window of 4096. */
        snprintf(num, sizeof num, "%s%d", i ? "," : "", i % 37 == 0 ? 2500 + i : 50 + (i * 97) % 700);
        strcat(lengths, num);
    }
    strcat(lengths, "]");
    char *lpath = test_write_file(dir, "lengths.json", lengths, strlen(lengths));
    char *yaml = test_format("model: {preset: tiny}\n"
                             "parallel: {tp: 2, cp: 2, pp: 2, dp: 2}\n"
                             "data: {lengths_file: %s, context_window: 4096, global_batch_tokens: 32768}\n"
                             "balance: {packer: wlb, cp_sharding: hybrid}\n"
                             "train: {steps: 12}\nlog: {every: 4}\n%s",
                             lpath, extra);
    char *path = test_write_file(dir, "dry.yaml", yaml, strlen(yaml));
    free(lpath);
    free(yaml);
    return path;
}

static void test_stats_file(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir, ""), *stats = test_format("%s/stats.jsonl", dir);
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--stats-out", stats);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "dry run: 16 GPUs (tp 2, cp 2, pp 2, dp 2), 12 steps"));
    assert_non_null(strstr(r.out, "step     1 "));
    assert_non_null(strstr(r.out, "step    12 "));
    assert_non_null(strstr(r.out, "summary: "));
    test_cmd_free(&r);
    FILE *f = fopen(stats, "r");
    assert_non_null(f);
    char line[1 << 16];
    int steps = 0, summary = 0;
    const char *step_keys[] = {"step", "docs", "tokens", "queued", "mb_tokens", "pp_imbalance", "cp_imbalance",
                               "sharding", "predicted_ms", "baseline_ms", "speedup", "packer_ms"};
    const char *dist_keys[] = {"pp_imbalance", "cp_imbalance", "speedup", "packer_ms"};
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        assert_false(summary); /* the summary is the last line */
        if (json_object_get(o, "summary")) {
            summary = 1;
            assert_int_equal(json_integer_value(json_object_get(o, "steps")), 12);
            for (size_t k = 0; k < 4; k++) {
                json_t *d = json_object_get(o, dist_keys[k]);
                assert_non_null(d);
                double mean = json_number_value(json_object_get(d, "mean"));
                double p50 = json_number_value(json_object_get(d, "p50"));
                double p95 = json_number_value(json_object_get(d, "p95"));
                double mx = json_number_value(json_object_get(d, "max"));
                assert_true(p50 <= p95 && p95 <= mx && mean <= mx);
            }
            assert_non_null(json_object_get(o, "token_delay_steps"));
        } else {
            steps++;
            for (size_t k = 0; k < sizeof step_keys / sizeof step_keys[0]; k++)
                if (!json_object_get(o, step_keys[k])) {
                    print_error("step line lacks %s: %s\n", step_keys[k], line);
                    fail();
                }
            assert_int_equal(json_integer_value(json_object_get(o, "step")), steps);
            /* 2 replicas x M 4 micro-batches; pp_imbalance is >= 1 by its definition. */
            assert_int_equal(json_array_size(json_object_get(o, "mb_tokens")), 8);
            assert_true(json_number_value(json_object_get(o, "pp_imbalance")) >= 1.0);
            assert_true(json_number_value(json_object_get(o, "cp_imbalance")) >= 1.0);
            json_t *sh = json_object_get(o, "sharding");
            assert_int_equal(json_integer_value(json_object_get(sh, "per_seq")) +
                                 json_integer_value(json_object_get(sh, "per_doc")) +
                                 json_integer_value(json_object_get(sh, "hybrid")),
                             8);
            double speedup = json_number_value(json_object_get(o, "speedup"));
            double pred = json_number_value(json_object_get(o, "predicted_ms"));
            double base = json_number_value(json_object_get(o, "baseline_ms"));
            assert_true(pred > 0 && base > 0 && speedup > 0.999 * base / pred && speedup < 1.001 * base / pred);
        }
        json_decref(o);
    }
    fclose(f);
    assert_int_equal(steps, 12);
    assert_true(summary);
    free(cfg);
    free(stats);
    test_rm_rf(dir);
    free(dir);
}

static void test_compare_table(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir, "");
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--compare", "--steps", "6");
    assert_int_equal(r.status, 0);
    const char *packers[] = {"fixed ", "fixed_greedy", "wlb "};
    const char *modes[] = {"per_seq", "per_doc", "adaptive", "hybrid"};
    int rows = 0;
    for (char *line = r.out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                if (!strncmp(line, packers[a], strlen(packers[a])) && strstr(line, modes[b]) &&
                    strstr(line, modes[b]) < strchr(line, '\n'))
                    rows++;
    assert_int_equal(rows, 12);
    assert_non_null(strstr(r.out, "fixed         per_seq"));
    assert_non_null(strstr(r.out, "1.000x")); /* Plain-4D against itself */
    test_cmd_free(&r);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

static void test_lengths_from_idx(void **state)
{
    (void)state;
    /* A Megatron set written here: the dry run reads only its .idx lengths. */
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
    DataIdxWriter w;
    Error err = {0};
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    int32_t tokens[3000];
    for (int i = 0; i < 3000; i++)
        tokens[i] = i % 500;
    for (int d = 0; d < 300; d++)
        assert_int_equal(data_idx_writer_add(&w, tokens, (uint64_t)(20 + (d * 131) % 2900), &err), 0);
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    char *yaml = test_format("model: {preset: tiny}\nparallel: {cp: 2, dp: 1}\n"
                             "data: {path: %s, context_window: 2048, global_batch_tokens: 8192}\n",
                             prefix);
    char *cfg = test_write_file(dir, "idx.yaml", yaml, strlen(yaml));
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "5");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "300 documents"));
    test_cmd_free(&r);
    free(yaml);
    free(cfg);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

static void test_large_cluster(void **state)
{
    (void)state;
    /* 16,384 GPUs: TP 8, CP 16, PP 16, DP 8, 128K windows, 16M tokens a step (as Llama 3 405B). */
    char *dir = test_tmpdir(), *cfg = write_config(dir, "");
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "2", "--set", "model.preset=llama3-405b", "--set",
        "parallel.tp=8", "--set", "parallel.cp=16", "--set", "parallel.pp=16", "--set", "parallel.dp=8", "--set",
        "data.context_window=131072", "--set", "data.global_batch_tokens=16777216");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "dry run: 16384 GPUs (tp 8, cp 16, pp 16, dp 8)"));
    test_cmd_free(&r);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

static void test_errors(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir, "");
    char *stats = test_format("%s/keep.jsonl", dir);
    free(test_write_file(dir, "keep.jsonl", "old\n", 4));
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--set", "parallel.dp=auto");
    test_assert_error(&r, "parallel.dp: a dry run needs a number for dp");
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--dry-run", "--set", "data.lengths_file=none");
    test_assert_error(&r, "data.path: no data: set data.path (a Megatron PREFIX) or data.lengths_file");
    test_cmd_free(&r);
    /* A failing run leaves an existing stats file as it was. */
    RUN(&r, "--config", cfg, "--dry-run", "--stats-out", stats, "--set", "data.lengths_file=/nonexistent/l.txt");
    test_assert_error(&r, "/nonexistent/l.txt: cannot open: No such file or directory");
    test_cmd_free(&r);
    size_t len;
    char *kept = test_read_file(stats, &len);
    assert_string_equal(kept, "old\n");
    free(kept);
    RUN(&r, "--config", cfg, "--dry-run", "--stats-out", "/nonexistent/dir/s.jsonl");
    test_assert_error(&r, "/nonexistent/dir/s.jsonl: cannot create");
    test_cmd_free(&r);
    RUN(&r, "--config", cfg, "--dry-run", "--set", "parallel.virtual_stages=2", "--set",
        "data.global_batch_tokens=24576");
    test_assert_error(&r, "interleaved 1F1B needs the micro-batches per replica (3) to be a multiple of "
                          "parallel.pp (2)");
    test_cmd_free(&r);
    free(stats);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_file),
        cmocka_unit_test(test_compare_table),
        cmocka_unit_test(test_lengths_from_idx),
        cmocka_unit_test(test_large_cluster),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("dryrun", tests, NULL, NULL);
}
