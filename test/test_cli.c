/*
 * test/test_cli.c - the command line, run as a user runs it: help, version, every flag error,
 * config errors through the binary, --print-config round trip and --set, launch detection.
 */
#include "test/testlib.h"

#include <stdlib.h>
#include <string.h>

#define RUN(r, ...)                                       \
    do {                                                  \
        const char *args_[] = {__VA_ARGS__, NULL};        \
        test_run_wlbtrain(r, args_);                      \
    } while (0)

static void test_help_names_every_flag(void **state)
{
    (void)state;
    CmdResult r;
    RUN(&r, "--help");
    assert_int_equal(r.status, 0);
    const char *flags[] = {"--config", "--set", "--steps", "--dry-run", "--stats-out", "--print-config",
                           "--compare", "inspect", "convert", "--help-config", "--version", "--trace"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(r.out, flags[i])) {
            print_error("--help does not mention %s\n", flags[i]);
            fail();
        }
    test_cmd_free(&r);
    RUN(&r, "inspect", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "wlbtrain inspect PREFIX"));
    test_cmd_free(&r);
    RUN(&r, "convert", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--tokenizer"));
    test_cmd_free(&r);
}

static void test_version_says_cuda(void **state)
{
    (void)state;
    CmdResult r;
    RUN(&r, "--version");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "wlbtrain "));
    assert_non_null(strstr(r.out, "backend cuda: "));
    /* The sanitizer build never has CUDA; the release build has it exactly when nvcc was found
     * (this test is compiled with the same flags: WLB_CUDA). With it, the line names the CUDA
     * runtime and the GPUs - none on a machine without an NVIDIA device file. */
#ifdef WLB_CUDA
    assert_non_null(strstr(r.out, "backend cuda: compiled in (CUDA runtime "));
    if (test_gpu_visible())
        assert_non_null(strstr(r.out, " GPU(s)"));
    else
        assert_true(strstr(r.out, "; no CUDA driver on this machine)") || strstr(r.out, "; no GPU visible ("));
#else
    assert_non_null(strstr(r.out, "backend cuda: not compiled in (built without nvcc, or with make CUDA=0)\n"));
#endif
    test_cmd_free(&r);
}

static void test_help_config_lists_keys(void **state)
{
    (void)state;
    CmdResult r;
    RUN(&r, "--help-config");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "| `parallel.tp` |"));
    assert_non_null(strstr(r.out, "| `balance.outlier_thresholds` |"));
    test_cmd_free(&r);
}

/* The config reference of docs/configuration.md is the output of --help-config, word for word. */
static void test_config_reference_is_current(void **state)
{
    (void)state;
    size_t len;
    char *page = test_read_file("docs/configuration.md", &len);
    assert_non_null(page);
    const char *begin = strstr(page, "<!-- config-reference:begin -->\n");
    const char *end = strstr(page, "<!-- config-reference:end -->");
    assert_non_null(begin);
    assert_non_null(end);
    begin += strlen("<!-- config-reference:begin -->\n");
    CmdResult r;
    RUN(&r, "--help-config");
    assert_int_equal(r.status, 0);
    if (strlen(r.out) != (size_t)(end - begin) || strncmp(begin, r.out, strlen(r.out))) {
        print_error("docs/configuration.md's config reference differs from ./wlbtrain --help-config: run "
                    "scripts/update-config-reference.sh\n");
        fail();
    }
    test_cmd_free(&r);
    free(page);
}

static void test_flag_errors(void **state)
{
    (void)state;
    CmdResult r;
    RUN(&r, "--bogus");
    test_assert_error(&r, "--bogus: unknown flag (see wlbtrain --help)");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--steps", "ten");
    test_assert_error(&r, "--steps: expected a positive integer, got 'ten'");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--steps=0");
    test_assert_error(&r, "--steps: expected a positive integer, got '0'");
    test_cmd_free(&r);
    RUN(&r, "--config");
    test_assert_error(&r, "--config: needs a value");
    test_cmd_free(&r);
    RUN(&r, "--steps", "3");
    test_assert_error(&r, "--config: is required");
    test_cmd_free(&r);
    RUN(&r, "--config", "a.yaml", "--config", "b.yaml");
    test_assert_error(&r, "--config: given twice ('a.yaml' and 'b.yaml')");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--set", "tp");
    test_assert_error(&r, "--set: expected KEY=VALUE");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--stats-out", "s.jsonl");
    test_assert_error(&r, "--stats-out: only with --dry-run");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--compare");
    test_assert_error(&r, "--compare: only with --dry-run");
    test_cmd_free(&r);
    RUN(&r, "config/examples/tiny-cpu.yaml");
    test_assert_error(&r, "config/examples/tiny-cpu.yaml: unexpected argument");
    test_cmd_free(&r);
    const char *none[] = {NULL};
    test_run_wlbtrain(&r, none);
    test_assert_error(&r, "nothing to do");
    test_cmd_free(&r);
}

static void test_config_errors_through_the_binary(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    CmdResult r;
    RUN(&r, "--config", "/nonexistent/x.yaml", "--print-config");
    test_assert_error(&r, "/nonexistent/x.yaml: cannot open: No such file or directory");
    test_cmd_free(&r);
    char *bad = test_write_file(dir, "bad.yaml", "model:\n  preset: llama3-8b\nparallel:\n  tp: 12\n", 46);
    RUN(&r, "--config", bad, "--print-config");
    char *expect = test_format("%s:4:7: parallel.tp: must divide model.n_heads (32), got 12", bad);
    test_assert_error(&r, expect);
    free(expect);
    test_cmd_free(&r);
    char *syntax = test_write_file(dir, "syntax.yaml", "model:\n  preset: [tiny\n", 22);
    RUN(&r, "--config", syntax, "--print-config");
    test_assert_error(&r, "YAML syntax:");
    expect = test_format("%s:3:1:", syntax);
    test_assert_error(&r, expect);
    free(expect);
    test_cmd_free(&r);
    char *binary = test_write_file(dir, "bin.yaml", "a\0b", 3);
    RUN(&r, "--config", binary, "--print-config");
    test_assert_error(&r, "not a YAML text file");
    test_cmd_free(&r);
    RUN(&r, "--config", "config/examples/tiny-cpu.yaml", "--set", "model.n_heads=3", "--print-config");
    test_assert_error(&r, "--set model.n_heads=3: model.n_heads: must divide model.d_model (128), got 3");
    test_cmd_free(&r);
    free(bad);
    free(syntax);
    free(binary);
    test_rm_rf(dir);
    free(dir);
}

static void test_print_config_round_trip_with_sets(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    CmdResult r, back;
    RUN(&r, "--config", "config/examples/llama8b.yaml", "--set", "parallel.cp=4", "--set",
        "balance.outlier_thresholds=[40000, 80000]", "--steps", "7", "--print-config");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "  cp: 4\n"));
    assert_non_null(strstr(r.out, "  steps: 7\n"));
    assert_non_null(strstr(r.out, "outlier_thresholds: [40000, 80000]\n"));
    assert_non_null(strstr(r.out, "  n_layers: 32\n")); /* the preset, expanded */
    char *printed = test_write_file(dir, "printed.yaml", r.out, strlen(r.out));
    RUN(&back, "--config", printed, "--print-config");
    assert_int_equal(back.status, 0);
    assert_string_equal(back.out, r.out); /* printing is a fixed point */
    test_cmd_free(&r);
    test_cmd_free(&back);
    free(printed);
    test_rm_rf(dir);
    free(dir);
}

static void test_launch_resolves_dp_auto(void **state)
{
    (void)state;
    CmdResult r;
    /* As mpirun -np 16 would set it: dp = 16 / (tp*cp*pp) = 16 / 8 = 2. */
    setenv("OMPI_COMM_WORLD_SIZE", "16", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    RUN(&r, "--config", "config/examples/llama3-8b-8gpu.yaml", "--print-config");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "  dp: 2\n"));
    test_cmd_free(&r);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    RUN(&r, "--config", "config/examples/llama3-8b-8gpu.yaml", "--print-config");
    test_assert_error(&r, "parallel.dp: auto needs the job's 6 ranks to be a multiple of tp * cp * pp = 8");
    test_cmd_free(&r);
    /* A rank other than 0 prints nothing. */
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    RUN(&r, "--config", "config/examples/llama3-8b-8gpu.yaml", "--print-config");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "");
    test_cmd_free(&r);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
}

int main(void)
{
    /* The tests set launcher variables themselves; start from none. */
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("SLURM_STEP_NUM_TASKS");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_names_every_flag),
        cmocka_unit_test(test_version_says_cuda),
        cmocka_unit_test(test_help_config_lists_keys),
        cmocka_unit_test(test_config_reference_is_current),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_config_errors_through_the_binary),
        cmocka_unit_test(test_print_config_round_trip_with_sets),
        cmocka_unit_test(test_launch_resolves_dp_auto),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
