/*
 * test/test_cuda_model.c - the CUDA backend trains the model the CPU backend trains, for two tiny
 * models: head size 16 (attention by the float32 reference kernels in both precisions: there is no
 * tensor-core kernel at 16) and head size 64 (the tensor-core kernels in bf16, the reference in
 * fp32). For each:
 *   fp32: a tiny model's loss and every gradient of step 1, and the parameters after 3 steps
 *         (test/dump_train), equal the CPU's within 1e-5 relative per tensor;
 *   bf16: against the CPU's emulation of the same roundings (train.precision: bf16 on the CPU) the
 *         loss within 1e-3 and the gradients within 2e-2; against the CPU's fp32 the loss within
 *         1e-2 relative and the gradients within 5e-2;
 *   train.recompute: selective and full give the gradients of none bit for bit (bf16; the fixed
 *         packer, whose plan does not depend on the mode's price);
 *   determinism: two bf16 runs of 12 steps print the same losses and norms (17 digits), and a run
 *         killed after its step-6 checkpoint and resumed equals the uninterrupted one bit for bit;
 *   50 training steps of wlbtrain in bf16 follow the CPU's loss curve: every step within 3% (not
 *         with WLB_TEST_SMALL set: scripts/device/gpu_check.sh sanitize);
 *   cuDNN's attention (train.attention: cudnn, head size 64 only; skipped where no libcudnn loads):
 *         its bf16 loss within 1e-3 and step-1 gradients within 3e-2 of the own kernels' (cuDNN
 *         rounds each gradient to bf16 once before the float32 sum, the own kernels do not), and
 *         over 2 CP ranks sharing the GPU (a document's queries at the end of their keys, the
 *         backward's waves of shared keys) the same against one rank.
 * Skipped when the build has no CUDA backend or no GPU is visible (CI); scripts/device/ runs it.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MODELS = 2 };
static const char *const model_name[MODELS] = {"head size 16", "head size 64"};
static const char *const model_dims[MODELS] = {
    "{n_layers: 4, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 128, vocab_size: 256, rope_theta: 10000,"
    " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}",
    "{n_layers: 2, d_model: 128, n_heads: 2, n_kv_heads: 1, d_ffn: 256, vocab_size: 256, rope_theta: 10000,"
    " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}",
};
static char *dir, *config[MODELS];
static int have_gpu, have_cudnn;

static int group_setup(void **state)
{
    (void)state;
    CmdResult r;
    const char *args[] = {"--version", NULL};
    test_run_wlbtrain(&r, args);
    const char *line = strstr(r.out, "backend cuda");
    have_gpu = line && strstr(line, "compiled in") && strstr(line, "GPU(s)");
    if (!have_gpu)
        printf("# skip: %.*s\n", line ? (int)strcspn(line, "\n") : 20, line ? line : "no backend line");
    have_cudnn = have_gpu && strstr(line, "cuDNN attention with libcudnn");
    test_cmd_free(&r);
    dir = test_tmpdir();
    char *prefix = test_write_docs(dir, "docs", 3, 400, 8, 256);
    for (int c = 0; c < MODELS; c++) {
        char *yaml = test_format("model: %s\n"
                                 "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
                                 "data: {path: %s, context_window: 128, global_batch_tokens: 512, seed: 3}\n"
                                 "balance: {hardware: cpu, packer: wlb}\n"
                                 "train: {device: cpu, steps: 3, lr: 0.003, warmup_steps: 1, eps: 1.0e-3, seed: 9}\n"
                                 "log: {every: 10}\n",
                                 model_dims[c], prefix);
        char *name = test_format("gpu-%d.yaml", c);
        config[c] = test_write_file(dir, name, yaml, strlen(yaml));
        free(name);
        free(yaml);
    }
    free(prefix);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(dir);
    free(dir);
    for (int c = 0; c < MODELS; c++)
        free(config[c]);
    return 0;
}

/* dump_train of model c on `ranks` ranks (0: one process without mpirun) with the --set arguments
 * into DIR/NAME-C.safetensors. */
static char *dump_ranks(int c, const char *name, const char *const *sets, int ranks)
{
    const char *bin_dir = getenv("WLB_TEST_BIN_DIR");
    char *bin = test_format("%s/dump_train", bin_dir ? bin_dir : "build/release/test");
    char *out = test_format("%s/%s-%d.safetensors", dir, name, c);
    const char *argv[48];
    int k = 0;
    char np[16];
    test_launch_argv(argv, &k, 600, ranks, NULL, np);
    argv[k++] = bin;
    argv[k++] = config[c];
    argv[k++] = out;
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
    test_cmd_free(&r);
    free(bin);
    return out;
}

static char *dump(int c, const char *name, const char *const *sets)
{
    return dump_ranks(c, name, sets, 0);
}

static void check(int c, const char *out, const char *ref, const char *prefix, double tol, const char *what)
{
    char name[1100];
    double e = test_compare_tensors(out, ref, prefix, name, sizeof name);
    printf("# %s: %-40s worst %.2e (%s), tolerance %.0e\n", model_name[c], what, e, name, tol);
    assert_true(e <= tol);
}

/* The loss within loss_tol and every step-1 gradient within grad_tol of ref's. */
static void check_loss_grads(int c, const char *out, const char *ref, double loss_tol, double grad_tol, const char *what)
{
    char line[2][160];
    snprintf(line[0], sizeof line[0], "%s: loss", what);
    snprintf(line[1], sizeof line[1], "%s: step-1 gradients", what);
    check(c, out, ref, "loss", loss_tol, line[0]);
    check(c, out, ref, "grad.", grad_tol, line[1]);
}

static void test_fp32_equals_cpu(void **state)
{
    (void)state;
    if (!have_gpu) {
        skip();
        return;
    }
    const char *cpu[] = {NULL}, *gpu[] = {"train.device=cuda", "train.precision=fp32", NULL};
    for (int c = 0; c < MODELS; c++) {
        char *a = dump(c, "cpu", cpu), *b = dump(c, "cuda-fp32", gpu);
        check(c, b, a, "", 1e-5, "cuda fp32 against cpu: everything");
        free(a);
        free(b);
    }
}

static void test_bf16_close_to_cpu(void **state)
{
    (void)state;
    if (!have_gpu) {
        skip();
        return;
    }
    const char *cpu[] = {NULL}, *cpu16[] = {"train.precision=bf16", NULL};
    const char *gpu[] = {"train.device=cuda", "train.precision=bf16", NULL};
    for (int c = 0; c < MODELS; c++) {
        char *a = dump(c, "cpu", cpu), *e = dump(c, "cpu-bf16", cpu16), *b = dump(c, "cuda-bf16", gpu);
        check_loss_grads(c, b, e, 1e-3, 2e-2, "cuda bf16 against cpu bf16");
        check_loss_grads(c, b, a, 1e-2, 5e-2, "cuda bf16 against cpu fp32");
        free(a);
        free(e);
        free(b);
    }
}

static void test_recompute_same_bits(void **state)
{
    (void)state;
    if (!have_gpu) {
        skip();
        return;
    }
    /* The fixed packer: wlb prices recomputation, so its plan (and with it the order in which the
     * micro-batches' gradients are summed) may change with the mode. The engine is what is tested. */
    const char *none[] = {"train.device=cuda", "train.precision=bf16", "balance.packer=fixed", NULL};
    const char *sel[] = {"train.device=cuda", "train.precision=bf16", "balance.packer=fixed",
                         "train.recompute=selective", NULL};
    const char *full[] = {"train.device=cuda", "train.precision=bf16", "balance.packer=fixed",
                          "train.recompute=full", NULL};
    for (int c = 0; c < MODELS; c++) {
        char *a = dump(c, "rc-none", none), *b = dump(c, "rc-selective", sel), *f = dump(c, "rc-full", full);
        check(c, b, a, "", 0, "cuda bf16 recompute selective = none");
        check(c, f, a, "", 0, "cuda bf16 recompute full = none");
        free(a);
        free(b);
        free(f);
    }
}

/* wlbtrain on the GPU with model c and --set arguments; its metrics file's text (malloc'd). */
static char *train_metrics(int c, const char *name, const char *const *sets, int expect_status)
{
    char *metrics = test_format("log.metrics=%s/%s-%d.jsonl", dir, name, c);
    char *ck = test_format("checkpoint.dir=%s/ck-%s-%d", dir, name, c);
    const char *args[40] = {"--config", config[c], "--steps", "12", "--set", metrics, "--set", ck, "--set",
                            "train.device=cuda", "--set", "checkpoint.every=6"};
    int k = 12;
    for (int i = 0; sets[i]; i++) {
        args[k++] = "--set";
        args[k++] = sets[i];
    }
    args[k] = NULL;
    CmdResult r;
    test_run_wlbtrain(&r, args);
    if (r.status != expect_status)
        print_error("%s\n%s\n", r.out, r.err);
    assert_int_equal(r.status, expect_status);
    test_cmd_free(&r);
    char *path = test_format("%s/%s-%d.jsonl", dir, name, c), *text = test_read_file(path, NULL);
    assert_non_null(text);
    free(path);
    free(metrics);
    free(ck);
    return text;
}

/* "loss" and "grad_norm" of every line, with all their digits. */
static char *losses_of(const char *metrics)
{
    size_t cap = strlen(metrics) + 1, n = 0;
    char *out = calloc(cap, 1);
    for (const char *p = metrics; (p = strstr(p, "\"loss\":")); p++) {
        const char *e = strstr(p, ",\"tokens\"");
        size_t len = e ? (size_t)(e - p) : 0;
        memcpy(out + n, p, len);
        n += len;
        out[n++] = '\n';
    }
    return out;
}

static void test_deterministic_and_resume(void **state)
{
    (void)state;
    if (!have_gpu) {
        skip();
        return;
    }
    const char *plain[] = {"train.precision=bf16", NULL};
    const char *again[] = {"train.precision=bf16", "checkpoint.resume=auto", NULL};
    for (int m = 0; m < MODELS; m++) {
        char *a = train_metrics(m, "det-a", plain, 0), *b = train_metrics(m, "det-b", plain, 0);
        char *la = losses_of(a), *lb = losses_of(b);
        printf("# %s: two runs of 12 steps, bf16: %s\n", model_name[m],
               strcmp(la, lb) ? "DIFFER" : "the same losses and norms, every digit");
        assert_string_equal(la, lb);
        /* killed after the step-6 checkpoint (in step 7), then resumed */
        setenv("WLBTRAIN_FAULT", "kill@0:7", 1);
        free(train_metrics(m, "det-c", plain, 137));
        unsetenv("WLBTRAIN_FAULT");
        char *c = train_metrics(m, "det-c", again, 0), *lc = losses_of(c);
        printf("# %s: killed at step 7 and resumed from step 6: %s\n", model_name[m],
               strcmp(la, lc) ? "DIFFERS" : "bit for bit");
        assert_string_equal(la, lc);
        free(a), free(b), free(c), free(la), free(lb), free(lc);
    }
}

static int read_losses(const char *path, double *loss, int max)
{
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    int n = 0;
    for (char *p = strstr(text, "\"loss\":"); p && n < max; p = strstr(p + 1, "\"loss\":"))
        loss[n++] = strtod(p + 7, NULL);
    free(text);
    return n;
}

static void test_50_steps_follow_cpu(void **state)
{
    (void)state;
    if (!have_gpu || getenv("WLB_TEST_SMALL")) { /* WLB_TEST_SMALL: under compute-sanitizer (gpu_check.sh) */
        skip();
        return;
    }
    for (int c = 0; c < MODELS; c++) {
        double loss[2][64];
        for (int b = 0; b < 2; b++) {
            char *metrics = test_format("log.metrics=%s/curve-%d-%d.jsonl", dir, b, c);
            const char *args[] = {"--config", config[c], "--steps", "50", "--set", metrics, "--set",
                                  b ? "train.device=cuda" : "train.device=cpu", NULL};
            CmdResult r;
            test_run_wlbtrain(&r, args);
            assert_int_equal(r.status, 0);
            test_cmd_free(&r);
            char *path = test_format("%s/curve-%d-%d.jsonl", dir, b, c);
            assert_int_equal(read_losses(path, loss[b], 64), 50);
            free(path);
            free(metrics);
        }
        double worst = 0;
        for (int s = 0; s < 50; s++)
            worst = fmax(worst, fabs(loss[1][s] - loss[0][s]) / loss[0][s]);
        printf("# %s: 50 steps: loss %.4f -> %.4f (cpu), %.4f -> %.4f (cuda bf16); worst step differs by %.2f%%\n",
               model_name[c], loss[0][0], loss[0][49], loss[1][0], loss[1][49], 100 * worst);
        assert_true(worst <= 0.03);
    }
}

static void test_cudnn_attention(void **state)
{
    (void)state;
    if (!have_cudnn) {
        if (have_gpu)
            printf("# skip: no libcudnn loads (wlbtrain --version)\n");
        skip();
        return;
    }
    const int c = 1; /* head size 64 */
    const char *own[] = {"train.device=cuda", "train.precision=bf16", "train.deterministic=false", NULL};
    const char *cudnn[] = {"train.device=cuda", "train.precision=bf16", "train.deterministic=false",
                           "train.attention=cudnn", NULL};
    const char *cudnn_cp[] = {"train.device=cuda", "train.precision=bf16", "train.deterministic=false",
                              "train.attention=cudnn", "parallel.cp=2", NULL};
    char *a = dump(c, "cuda-own", own), *b = dump(c, "cuda-cudnn", cudnn), *p = dump_ranks(c, "cuda-cudnn-cp2", cudnn_cp, 2);
    check_loss_grads(c, b, a, 1e-3, 3e-2, "cudnn against own kernels");
    check_loss_grads(c, p, b, 1e-3, 3e-2, "cudnn, cp 2 against 1 rank");
    free(a);
    free(b);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_equals_cpu),
        cmocka_unit_test(test_bf16_close_to_cpu),
        cmocka_unit_test(test_recompute_same_bits),
        cmocka_unit_test(test_deterministic_and_resume),
        cmocka_unit_test(test_50_steps_follow_cpu),
        cmocka_unit_test(test_cudnn_attention),
    };
    const char *filter = getenv("WLB_TEST_FILTER"); /* one test by name (gpu_check.sh cudnn) */
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("cuda_model", tests, group_setup, group_teardown);
}
