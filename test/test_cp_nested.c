/*
 * test/test_cp_nested.c - nested K/V exchanges (balance.cp_sharding: groups) equal one process.
 *
 * With sharding groups a document is sharded over an aligned block of CP ranks, and the blocks of
 * one micro-batch may nest: a CP rank then exchanges K/V, and dK/dV in backward, in several blocks
 * per layer, largest first. The planner decides when that pays; here the layouts are made by hand
 * (test/dump_train --layout, the real trainer running a given plan under mpirun), so that the engine is
 * checked on nesting whatever the planner picks: at CP 4 one document over all four ranks, one over
 * [0, 2), one over [2, 4), one whole on rank 3 and one on rank 0; at CP 8 three levels, a level
 * skipped ([4, 6) inside [0, 8) with nothing over [4, 8)); and CP 4 under TP 2 and PP 2. Loss and
 * every gradient of the step must agree with the same documents whole on one process within 1e-5
 * relative (per tensor: max |x - ref| / max |ref|).
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir, *config, *bin;

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    dir = test_tmpdir();
    /* Every other document of 100 to 255 tokens: worth sharding over up to 8 ranks (16 chunks). */
    char *prefix = test_write_docs(dir, "docs", 5, 200, 2, 64);
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 2048}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: %s, context_window: 2048, global_batch_tokens: 4096}\n"
        "balance: {hardware: cpu, packer: fixed, cp_sharding: groups}\n"
        "train: {device: cpu, steps: 1}\n",
        prefix);
    config = test_write_file(dir, "nested.yaml", yaml, strlen(yaml));
    const char *bin_dir = getenv("WLB_TEST_BIN_DIR"); /* test/run.sh sets it, as for test_parallel */
    bin = test_format("%s/dump_train", bin_dir ? bin_dir : "build/release/test");
    free(yaml);
    free(prefix);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(dir);
    free(dir);
    free(config);
    free(bin);
    return 0;
}

/* dump_train --layout on tp x pp x cp ranks (all 1: one process, no mpirun) with this layout into out; its
 * exit status, the output in *log. */
static int run_plan(int tp, int pp, int cp, const char *layout, const char *out, char **log)
{
    const char *argv[32];
    int k = 0;
    char np[16], lay[3][32];
    int n = tp * pp * cp;
    test_launch_argv(argv, &k, 300, n > 1 ? n : 0, NULL, np);
    snprintf(lay[0], 32, "parallel.tp=%d", tp);
    snprintf(lay[1], 32, "parallel.pp=%d", pp);
    snprintf(lay[2], 32, "parallel.cp=%d", cp);
    argv[k++] = bin;
    argv[k++] = config;
    argv[k++] = out;
    argv[k++] = "--layout";
    argv[k++] = layout;
    for (int i = 0; i < 3; i++) {
        argv[k++] = "--set";
        argv[k++] = lay[i];
    }
    argv[k] = NULL;
    CmdResult r;
    remove(out);
    test_run(&r, argv);
    *log = test_format("%s%s", r.out, r.err);
    int status = r.status;
    test_cmd_free(&r);
    return status;
}

/* The layout at (tp, pp, cp) against the same documents whole on one process; prints one line. */
static int check(int tp, int pp, int cp, const char *layout)
{
    char *ref = test_format("%s/ref.safetensors", dir), *out = test_format("%s/out.safetensors", dir), *log;
    int ok = run_plan(1, 1, 1, layout, ref, &log) == 0;
    if (!ok)
        printf("# reference failed:\n%s\n", log);
    free(log);
    char name[1100] = "";
    int status = run_plan(tp, pp, cp, layout, out, &log);
    double e = ok && status == 0 ? test_compare_tensors(out, ref, "", name, sizeof name) : INFINITY;
    if (status != 0)
        snprintf(name, sizeof name, "exit status %d", status);
    ok = e <= 1e-5;
    printf("# (tp %d, pp %d, cp %d) layout %-34s worst %.2e (%s)%s\n", tp, pp, cp, layout, e, name, ok ? "" : "  FAIL");
    if (!ok)
        printf("# log:\n%s\n", log);
    fflush(stdout);
    free(log);
    free(ref);
    free(out);
    return ok;
}

static void test_nested_cp4(void **state)
{
    (void)state;
    assert_true(check(1, 1, 4, "0:4,0:2,2:2,3:1,0:1"));
}

static void test_nested_cp8(void **state)
{
    (void)state;
    assert_true(check(1, 1, 8, "0:8,0:4,4:2,1:1,6:2,5:1,0:2"));
}

static void test_nested_cp4_tp2_pp2(void **state)
{
    (void)state;
    assert_true(check(2, 2, 4, "0:4,0:2,2:2,3:1,0:1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_cp4),
        cmocka_unit_test(test_nested_cp8),
        cmocka_unit_test(test_nested_cp4_tp2_pp2),
    };
    return cmocka_run_group_tests_name("cp_nested", tests, group_setup, group_teardown);
}
