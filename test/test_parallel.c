/*
 * test/test_parallel.c - the 4D engine equals one process: every layout (dp, tp, pp, cp) of a tiny
 * model, every CP sharding mode where cp > 1, packers fixed and wlb, trained 3 steps under
 * `mpirun --oversubscribe` by test/dump_train, against the same config with every size 1. The loss
 * of each step, every gradient of step 1 and every parameter after step 3 must agree within 1e-5
 * relative (per tensor: max |x - ref| / max |ref|); tokens per step exactly. Every layout with
 * tp > 1 runs with sequence parallelism (parallel.sequence_parallel, the default; the corpus makes
 * CP ranks' row counts that tp does not divide, so padding rows are exercised too). Also the
 * extras: kv heads replicated over TP (tp 4 > 2 kv heads), interleaved virtual stages, ZeRO-1,
 * tied embeddings split over stages, layers split unevenly over the stages
 * (parallel.stage_layers), TP without sequence parallelism (with and without
 * recomputation), and every message staged through host buffers (what a GPU backend does with
 * parallel.comm: mpi; WLBTRAIN_COMM_STAGE=1 turns it on for the CPU backend). The ASan build runs a smaller matrix (the same code paths).
 *
 * AdamW's eps is 1e-3 here, not 1e-8: with a tiny eps the first updates are lr * sign(g), and a
 * gradient element a 10^-7 of its tensor's largest - whose sign the summation order decides - moves
 * its parameter by +lr or -lr (3e-4 relative with 1e-8, 3e-6 with 1e-4). The gradients agree to
 * about 2e-6 whatever eps is; with 1e-3 the parameters do too.
 *
 * The corpus has documents of 1 to 30 tokens with a 128-token window: no document reaches the
 * outlier threshold (32) and wlb carries nothing over, so every layout trains the same documents
 * (a layout that did not would show in the tokens and the loss).
 *
 * parallel.overlap (test_overlap): on 16 ranks (dp, tp, pp, cp 2 each, SP on) with ZeRO-1,
 * interleaving, and each CP mode (groups at tp 2 x pp 2 x cp 4), and without SP (full recompute,
 * tied embeddings), and ZeRO-1 in bf16 on dp 2 x pp 2, the run with overlap on - under WLB_COMM_CHAOS, every started
 * collective delayed by a random time with NaN in its receive buffer until its wait - gives the same
 * bits as the run with overlap off (losses, gradients of step 1, parameters after step 3, the
 * validation loss); every rank of a group issued the same collectives in the same order
 * (WLB_COMM_LOG); and the engine itself stops a step with a request still outstanding.
 * test_fault_order: WLBTRAIN_FAULT=nan on one rank under overlap changes no collective (every group's
 * log in one order, the step skipped).
 *
 * Validation: every run ends with an evaluation of two global batches (forward only; with pp > 1
 * through the stages without a backward), of the 30% of the short corpus's documents it holds out
 * (data.valid_fraction), and for the long corpus of a held-out set of its own (data.valid_path, long
 * documents too, so that CP shards them): its loss must agree within the same 1e-5 and its tokens
 * exactly, on every layout, CP mode and packer (dump_train's valid_loss and valid_tokens), and so must
 * its loss by token position (valid_position_loss, valid_position_targets; buckets 0-8, 8-32, 32-100,
 * 100+: the long documents' pieces past the window's length keep their offsets).
 *
 * balance.cp_sharding: groups needs documents worth sharding over part of the CP ranks: a second
 * corpus where every fourth document has 100 to 255 tokens, packer fixed (which packs the stream
 * in order whatever the layout), at CP 2, CP 4 and tp 2 x cp 4 x pp 2 (16 ranks); the dry run of the
 * same config shows that the runs used blocks of 2 CP ranks and ranks of their own.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/safetensors.h"

#include <sys/stat.h>

typedef struct Fixture {
    char *dir, *config, *bin;
    char *ref[2];      /* reference dumps: packer fixed, wlb */
    char *ref_tied;
    char *ref_bf16;    /* wlb, train.precision: bf16 */
    char *config_long; /* the corpus with long documents */
    char *ref_long;    /* its reference: packer fixed */
    char *ref_long_wlb; /* and with packer wlb */
    char *ref6;        /* wlb, model.n_layers: 6 (room for an uneven interleaved split) */
    char *ref_tied8, *ref_tied16; /* wlb, tied embeddings, 8 and 16 layers (pp 4 x 2 and 4 virtual stages) */
    char *ref_tied6;   /* wlb, tied, 6 layers, 3 windows a step (pp 3 x 2 virtual stages) */
} Fixture;

static Fixture fx;
static const char *const packers[2] = {"fixed", "wlb"};
static const char *const modes[4] = {"per_seq", "per_doc", "adaptive", "hybrid"};

/* Runs dump_train on n ranks (n = 0: one process without mpirun) with the --set arguments; the
 * ranks get the environment variable `var` (NULL: none). */
static const char *config_of(const char *ref)
{
    return ref == fx.ref_long || ref == fx.ref_long_wlb ? fx.config_long : fx.config;
}

static int run_dump_cfg(int n, const char *config, const char *out, const char *const *sets, const char *var,
                        char **log)
{
    const char *argv[64];
    int k = 0;
    char np[16];
    test_launch_argv(argv, &k, 300, n, var, np);
    argv[k++] = fx.bin;
    argv[k++] = config;
    argv[k++] = out;
    for (int i = 0; sets[i]; i++) {
        argv[k++] = "--set";
        argv[k++] = sets[i];
    }
    argv[k] = NULL;
    CmdResult r;
    test_run(&r, argv);
    *log = test_format("%s%s", r.out, r.err);
    int status = r.status;
    test_cmd_free(&r);
    return status;
}

static int run_dump_env(int n, const char *out, const char *const *sets, const char *var, char **log)
{
    return run_dump_cfg(n, fx.config, out, sets, var, log);
}

static int run_dump(int n, const char *out, const char *const *sets, char **log)
{
    return run_dump_env(n, out, sets, NULL, log);
}

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    /* Every run's pipeline messages as NCCL's (comm.h, WLB_COMM_STRICT): matched per lane and peer in
     * order, rendezvous, connected at first use; a message that waits 120 s for its peer fails the
     * run with its lane and tag instead of hanging it. */
    setenv("WLB_COMM_STRICT", "120", 1);
    fx.dir = test_tmpdir();
    char *prefix = test_write_docs(fx.dir, "docs", 7, 300, 0, 256);
    /* WLB_TEST_DEVICE=cuda: the same suite on the GPU (scripts/device/), every rank of every layout
     * on the one GPU, messages staged through the host (parallel.comm: mpi). */
    const char *env = getenv("WLB_TEST_DEVICE");
    const char *device = env && !strcmp(env, "cuda") ? "cuda, precision: fp32" : "cpu";
    printf("# device: %s\n", device);
    char *yaml = test_format(
        "model: {n_layers: 4, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 128, vocab_size: 256,"
        " rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: %s, context_window: 128, global_batch_tokens: 512, seed: 3, valid_fraction: 0.3}\n"
        "balance: {hardware: cpu}\n"
        "train: {device: %s, steps: 3, lr: 0.003, warmup_steps: 1, weight_decay: 0.1, eps: 1.0e-3, seed: 9,"
        " eval_tokens: 1024, eval_position_buckets: [8, 32, 100]}\n",
        prefix, device);
    fx.config = test_write_file(fx.dir, "base.yaml", yaml, strlen(yaml));
    free(yaml);
    free(prefix);
    prefix = test_write_docs(fx.dir, "long", 2, 300, 4, 256);
    char *valid = test_write_docs(fx.dir, "long-valid", 8, 100, 4, 256);
    /* A link latency of 1 us (the cpu profile's is 20): with a piece per CP rank of a block, blocks
     * then pay for this corpus's documents the way they pay for long ones on GPUs, so that groups
     * lays out blocks of 2 at tp 2 x cp 4 x pp 2 too (test_groups). */
    const char cal[] = "{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"link_latency_us\": 1}\n";
    char *cal_path = test_write_file(fx.dir, "link.json", cal, strlen(cal));
    yaml = test_format(
        "model: {n_layers: 4, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 128, vocab_size: 256,"
        " rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: %s, context_window: 128, global_batch_tokens: 512, seed: 3, valid_path: %s}\n"
        "balance: {hardware: cpu, packer: fixed, calibration: %s}\n"
        "train: {device: %s, steps: 3, lr: 0.003, warmup_steps: 1, weight_decay: 0.1, eps: 1.0e-3, seed: 9,"
        " eval_tokens: 1024, eval_position_buckets: [8, 32, 100]}\n",
        prefix, valid, cal_path, device);
    free(cal_path);
    fx.config_long = test_write_file(fx.dir, "long.yaml", yaml, strlen(yaml));
    free(yaml);
    free(prefix);
    free(valid);
    const char *bin_dir = getenv("WLB_TEST_BIN_DIR");
    fx.bin = test_format("%s/dump_train", bin_dir ? bin_dir : "build/release/test");
    for (int p = 0; p < 2; p++) {
        fx.ref[p] = test_format("%s/ref-%s.safetensors", fx.dir, packers[p]);
        char *set = test_format("balance.packer=%s", packers[p]), *log;
        const char *sets[] = {set, NULL};
        if (run_dump(0, fx.ref[p], sets, &log) != 0) {
            fprintf(stderr, "reference run failed:\n%s\n", log);
            return -1;
        }
        free(log);
        free(set);
    }
    fx.ref_long = test_format("%s/ref-long.safetensors", fx.dir);
    fx.ref_long_wlb = test_format("%s/ref-long-wlb.safetensors", fx.dir);
    for (int p = 0; p < 2; p++) {
        const char *none[] = {NULL}, *wlb[] = {"balance.packer=wlb", NULL};
        char *log;
        if (run_dump_cfg(0, fx.config_long, p ? fx.ref_long_wlb : fx.ref_long, p ? wlb : none, NULL, &log) != 0) {
            fprintf(stderr, "reference run failed:\n%s\n", log);
            return -1;
        }
        free(log);
    }
    fx.ref6 = test_format("%s/ref-6.safetensors", fx.dir);
    const char *six[] = {"balance.packer=wlb", "model.n_layers=6", NULL};
    char *log6;
    if (run_dump(0, fx.ref6, six, &log6) != 0) {
        fprintf(stderr, "reference run failed:\n%s\n", log6);
        return -1;
    }
    free(log6);
    fx.ref_tied8 = test_format("%s/ref-tied8.safetensors", fx.dir);
    fx.ref_tied16 = test_format("%s/ref-tied16.safetensors", fx.dir);
    const char *tied8[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=8", NULL};
    const char *tied16[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=16", NULL};
    fx.ref_tied6 = test_format("%s/ref-tied6.safetensors", fx.dir);
    const char *tied6[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=6",
                           "data.global_batch_tokens=384", NULL};
    const char *const *deep_sets[] = {tied8, tied16, tied6};
    const char *deep_refs[] = {fx.ref_tied8, fx.ref_tied16, fx.ref_tied6};
    for (int i = 0; i < 3 && !TEST_SANITIZED; i++) { /* ASan: the deep pipelines' first two layouts only */
        char *log_deep;
        int st = run_dump(0, deep_refs[i], deep_sets[i], &log_deep);
        if (st != 0)
            fprintf(stderr, "reference run failed:\n%s\n", log_deep);
        free(log_deep);
        if (st != 0)
            return -1;
    }
    fx.ref_tied = test_format("%s/ref-tied.safetensors", fx.dir);
    fx.ref_bf16 = test_format("%s/ref-bf16.safetensors", fx.dir);
    const char *sets[] = {"balance.packer=wlb", "model.tie_embeddings=true", NULL};
    const char *sets16[] = {"balance.packer=wlb", "train.precision=bf16", NULL};
    char *log;
    int rc = run_dump(0, fx.ref_tied, sets, &log);
    if (rc == 0) {
        free(log);
        rc = run_dump(0, fx.ref_bf16, sets16, &log);
    }
    if (rc != 0)
        fprintf(stderr, "reference run failed:\n%s\n", log);
    free(log);
    return rc == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(fx.dir);
    free(fx.dir);
    free(fx.config);
    free(fx.bin);
    free(fx.ref[0]);
    free(fx.ref[1]);
    free(fx.ref_tied);
    free(fx.ref_bf16);
    free(fx.config_long);
    free(fx.ref_long);
    free(fx.ref_long_wlb);
    free(fx.ref6);
    free(fx.ref_tied8);
    free(fx.ref_tied16);
    free(fx.ref_tied6);
    return 0;
}

/* One layout with the given extra settings (and the environment variable var, NULL: none) against
 * a reference, within tol; prints one line. */
static int check_layout_tol(int dp, int tp, int pp, int cp, const char *ref, const char *const *extra,
                            const char *var, const char *what, double tol)
{
    char *out = test_format("%s/out.safetensors", fx.dir);
    char lay[4][32];
    snprintf(lay[0], 32, "parallel.dp=%d", dp);
    snprintf(lay[1], 32, "parallel.tp=%d", tp);
    snprintf(lay[2], 32, "parallel.pp=%d", pp);
    snprintf(lay[3], 32, "parallel.cp=%d", cp);
    const char *sets[16] = {lay[0], lay[1], lay[2], lay[3]};
    int k = 4;
    for (int i = 0; extra[i]; i++)
        sets[k++] = extra[i];
    sets[k] = NULL;
    char *log;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    remove(out);
    int status = run_dump_cfg(dp * tp * pp * cp, config_of(ref), out, sets, var, &log);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char name[1100];
    char vname[1100];
    double e = status == 0 ? test_compare_tensors(out, ref, "", name, sizeof name) : INFINITY;
    double ev = status == 0 ? test_compare_tensors(out, ref, "valid_", vname, sizeof vname) : INFINITY;
    if (status != 0)
        snprintf(name, sizeof name, "exit status %d", status);
    int ok = e <= tol;
    printf("# (dp %d, tp %d, pp %d, cp %d) %-40s worst %.2e (%s), valid_loss %.1e  %.1fs%s\n", dp, tp, pp, cp, what,
           e, name, ev, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, ok ? "" : "  FAIL");
    if (!ok)
        printf("# log:\n%s\n", log);
    fflush(stdout);
    free(log);
    remove(out);
    free(out);
    return ok;
}

static int check_layout_env(int dp, int tp, int pp, int cp, const char *ref, const char *const *extra,
                            const char *var, const char *what)
{
    return check_layout_tol(dp, tp, pp, cp, ref, extra, var, what, 1e-5);
}

static int check_layout(int dp, int tp, int pp, int cp, const char *ref, const char *const *extra, const char *what)
{
    return check_layout_env(dp, tp, pp, cp, ref, extra, NULL, what);
}

/* 1 when the dumps a and b hold the same tensors with the same bytes (NaN included); else 0 with
 * the first that differs in what. */
static int same_bits(const char *a, const char *b, char *what, size_t size)
{
    StFile x, y;
    Error err = {0};
    if (st_open(&x, a, &err) != 0) {
        snprintf(what, size, "%s", err.msg);
        return 0;
    }
    assert_int_equal(st_open(&y, b, &err), 0);
    int same = x.n_tensors == y.n_tensors && x.n_tensors > 0;
    snprintf(what, size, "%d and %d tensors", x.n_tensors, y.n_tensors);
    for (int i = 0; same && i < y.n_tensors; i++) {
        const StTensor *r = &y.tensors[i], *t = st_find(&x, r->name);
        size_t bytes = (size_t)r->numel * (r->dtype == ST_F64 ? 8 : 4);
        same = t && t->dtype == r->dtype && t->numel == r->numel && !memcmp(t->data, r->data, bytes);
        if (!same)
            snprintf(what, size, "%s", r->name);
    }
    st_close(&x);
    st_close(&y);
    return same;
}

/* The line after l (a last line without a newline: its end). */
static const char *next_line(const char *l)
{
    const char *nl = strchr(l, '\n');
    return nl ? nl + 1 : l + strlen(l);
}

/* Does line l start with key and a space? */
static int has_key(const char *l, const char *key) { return !strncmp(l, key, strlen(key)) && l[strlen(key)] == ' '; }

/* The lines of every rank's log in dir (rank-R.log, R < ranks), grouped by their group ("G-ID"):
 * for each group, every rank that has lines of it has the same lines in the same order. Returns
 * the number of groups compared, -1 when two ranks differ or a rank's log is missing (what says
 * where). */
static int same_order(const char *dir, int ranks, char *what, size_t size)
{
    char **text = calloc((size_t)ranks, sizeof *text);
    assert_non_null(text);
    int ok = 1;
    for (int r = 0; r < ranks; r++) {
        char *path = test_format("%s/rank-%d.log", dir, r);
        size_t len;
        text[r] = test_read_file(path, &len);
        if (!text[r] && ok) {
            snprintf(what, size, "no log of rank %d", r);
            ok = 0;
        }
        free(path);
    }
    int groups = 0;
    /* For each rank's each group key (first rank holding it), compare the key's lines on every rank. */
    for (int r = 0; r < ranks && ok; r++)
        for (const char *line = text[r]; *line && ok; line = next_line(line)) {
            char key[64];
            if (sscanf(line, "%63s", key) != 1)
                break;
            int first = 1; /* does an earlier rank or line hold the key? then it was compared */
            for (int q = 0; q < r && first; q++)
                for (const char *l = text[q]; *l && first; l = next_line(l))
                    first = !has_key(l, key);
            for (const char *l = text[r]; l < line && first; l = next_line(l))
                first = !has_key(l, key);
            if (!first)
                continue;
            groups++;
            char *mine = NULL;
            for (int q = 0; q < ranks && ok; q++) {
                size_t cap = strlen(text[q]) + 2, n = 0;
                char *seq = malloc(cap);
                assert_non_null(seq);
                for (const char *l = text[q]; *l; l = next_line(l))
                    if (has_key(l, key)) {
                        size_t len = (size_t)(next_line(l) - l);
                        memcpy(seq + n, l, len);
                        n += len;
                        if (seq[n - 1] != '\n')
                            seq[n++] = '\n';
                    }
                seq[n] = 0;
                if (n && !mine) {
                    mine = seq;
                    continue;
                }
                if (n && strcmp(seq, mine)) {
                    snprintf(what, size, "group %s: ranks %d and %d issued different collectives", key, r, q);
                    ok = 0;
                }
                free(seq);
            }
            free(mine);
        }
    for (int r = 0; r < ranks; r++)
        free(text[r]);
    free(text);
    return ok ? groups : -1;
}

/* One layout with overlap off, then on under WLB_COMM_CHAOS: the same bits, the off run against
 * the reference within tol, and the same collectives in the same order on each group's ranks. */
static int check_overlap_tol(int dp, int tp, int pp, int cp, const char *ref, const char *const *extra,
                             const char *what, double tol)
{
    char *out[2], *logs[2];
    const int ranks = dp * tp * pp * cp;
    char lay[5][40];
    snprintf(lay[0], 40, "parallel.dp=%d", dp);
    snprintf(lay[1], 40, "parallel.tp=%d", tp);
    snprintf(lay[2], 40, "parallel.pp=%d", pp);
    snprintf(lay[3], 40, "parallel.cp=%d", cp);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int status = 0;
    for (int on = 0; on < 2; on++) {
        out[on] = test_format("%s/overlap-%d.safetensors", fx.dir, on);
        logs[on] = test_format("%s/overlap-log-%d", fx.dir, on);
    }
    for (int on = 0; on < 2 && status == 0; on++) {
        test_rm_rf(logs[on]);
        assert_int_equal(mkdir(logs[on], 0755), 0);
        snprintf(lay[4], 40, "parallel.overlap=%s", on ? "true" : "false");
        const char *sets[16] = {lay[0], lay[1], lay[2], lay[3], lay[4]};
        int k = 5;
        for (int i = 0; extra[i]; i++)
            sets[k++] = extra[i];
        sets[k] = NULL;
        setenv("WLB_COMM_LOG", logs[on], 1);
        if (on)
            setenv("WLB_COMM_CHAOS", "3000", 1);
        char *log;
        status = run_dump_cfg(ranks, config_of(ref), out[on], sets, NULL, &log);
        unsetenv("WLB_COMM_LOG");
        unsetenv("WLB_COMM_CHAOS");
        if (status != 0)
            printf("# overlap %s: exit status %d\n# log:\n%s\n", on ? "on" : "off", status, log);
        free(log);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char name[1100] = "-", diff[1100] = "-", order[256] = "-";
    double e = status == 0 ? test_compare_tensors(out[0], ref, "", name, sizeof name) : INFINITY;
    int same = status == 0 && same_bits(out[1], out[0], diff, sizeof diff);
    int groups[2] = {-1, -1};
    for (int on = 0; on < 2 && status == 0; on++)
        groups[on] = same_order(logs[on], ranks, order, sizeof order);
    int ok = e <= tol && same && groups[0] > 0 && groups[1] > 0;
    printf("# (dp %d, tp %d, pp %d, cp %d) %-36s off vs one process %.2e (%s); on (chaos) vs off: %s%s; "
           "order: %d, %d groups%s%s  %.1fs%s\n", dp, tp, pp, cp, what, e, name, same ? "same bits" : "DIFFER in ",
           same ? "" : diff, groups[0], groups[1], groups[0] < 0 || groups[1] < 0 ? " - " : "",
           groups[0] < 0 || groups[1] < 0 ? order : "",
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, ok ? "" : "  FAIL");
    fflush(stdout);
    for (int on = 0; on < 2; on++) {
        remove(out[on]);
        test_rm_rf(logs[on]);
        free(out[on]);
        free(logs[on]);
    }
    return ok;
}

static int check_overlap(int dp, int tp, int pp, int cp, const char *ref, const char *const *extra, const char *what)
{
    return check_overlap_tol(dp, tp, pp, cp, ref, extra, what, 1e-5);
}

static void test_overlap(void **state)
{
    (void)state;
    int ok = 1;
    const char *zero[] = {"balance.packer=wlb", "parallel.zero=1", "balance.cp_sharding=hybrid", NULL};
    ok &= check_overlap(2, 2, 2, 2, fx.ref[1], zero, "ZeRO-1, SP, hybrid");
    const char *inter[] = {"balance.packer=wlb", "parallel.virtual_stages=2", "model.n_layers=6",
                           "parallel.stage_layers=[2, 1, 1, 2]", "balance.cp_sharding=per_seq", NULL};
    if (!TEST_SANITIZED)
        ok &= check_overlap(2, 2, 2, 2, fx.ref6, inter, "interleaved, per_seq");
    const char *modes_left[] = {"per_doc", "adaptive"};
    for (int i = 0; i < 2 && !TEST_SANITIZED; i++) {
        char *mode = test_format("balance.cp_sharding=%s", modes_left[i]);
        const char *extra[] = {"balance.packer=fixed", mode, NULL};
        ok &= check_overlap(2, 2, 2, 2, fx.ref[0], extra, modes_left[i]);
        free(mode);
    }
    /* ZeRO-1 in bf16 (the GPU's default precision): a bucket's bf16 weight copy is written from the
     * gathered parameters, so only after its all-gather is waited for (under the chaos a receive
     * buffer is NaN until then); against one bf16 process within bf16's 1e-2 (test_modes). */
    const char *zero16[] = {"balance.packer=wlb", "parallel.zero=1", "train.precision=bf16", NULL};
    if (!TEST_SANITIZED)
        ok &= check_overlap_tol(2, 1, 2, 1, fx.ref_bf16, zero16, "ZeRO-1, bf16", 1e-2);
    const char *groups[] = {"balance.cp_sharding=groups", NULL};
    const char *no_sp[] = {"balance.packer=wlb", "parallel.sequence_parallel=false", "train.recompute=full",
                           "model.tie_embeddings=true", NULL};
    if (!TEST_SANITIZED) { /* ASan: the first layout only (a minute there) */
        ok &= check_overlap(1, 2, 2, 4, fx.ref_long, groups, "groups, long documents");
        ok &= check_overlap(2, 2, 2, 2, fx.ref_tied, no_sp, "no SP, recompute full, tied");
    }
    assert_true(ok);
}

/* WLBTRAIN_FAULT=nan on one rank with parallel.overlap (wlbtrain, dp 2 x tp 2, SP, ZeRO-1): that
 * rank's schedule is its peers' - its gradient buckets start during the backward too - so every
 * group's ranks issue the same collectives in the same order (WLB_COMM_LOG), and the step is
 * skipped (train.nonfinite: skip) on every rank. */
static void test_fault_order(void **state)
{
    (void)state;
    char *logs = test_format("%s/fault-log", fx.dir), *ck = test_format("checkpoint.dir=%s/fault-ck", fx.dir);
    test_rm_rf(logs);
    assert_int_equal(mkdir(logs, 0755), 0);
    const char *bin = getenv("WLBTRAIN"), *argv[64];
    int k = 0;
    char np[16];
    setenv("WLBTRAIN_FAULT", "nan@1:2", 1);
    setenv("WLB_COMM_LOG", logs, 1);
    test_launch_argv(argv, &k, 300, 4, "WLBTRAIN_FAULT", np);
    const char *args[] = {bin ? bin : "./wlbtrain", "--config", fx.config, "--set", ck, "--set", "parallel.dp=2",
                          "--set", "parallel.tp=2", "--set", "parallel.overlap=true", "--set", "parallel.zero=1",
                          "--set", "balance.packer=wlb", "--set", "train.nonfinite=skip", NULL};
    for (int i = 0; args[i]; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    CmdResult r;
    test_run(&r, argv);
    unsetenv("WLBTRAIN_FAULT");
    unsetenv("WLB_COMM_LOG");
    if (r.status != 0)
        printf("# exit status %d\n# out:\n%s\n# err:\n%s\n", r.status, r.out, r.err);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "not finite, update skipped (1 so far)"));
    test_cmd_free(&r);
    char order[256] = "-";
    int groups = same_order(logs, 4, order, sizeof order);
    printf("# nan on rank 1, overlap: %d groups in the same order%s%s\n", groups, groups < 0 ? " - " : "",
           groups < 0 ? order : "");
    assert_true(groups > 0);
    test_rm_rf(logs);
    free(logs);
    free(ck);
}

/* parallel.tp_chunks: each TP product and its exchange in pieces of rows (engine/model/model_tp.c,
 * model_sp.c) - one piece, 3 (uneven: the last piece shorter and partly padding), and 16 (more
 * pieces than a micro-batch has rows per rank: pieces without rows) - against one process, with and
 * without SP (without: packer fixed, whose last rows have targets, so a last piece one row short
 * shows; with SP 3 pieces under both packers); and 3 with overlap on under WLB_COMM_CHAOS against
 * off (the same bits), with full recomputation (the backward a layer at a time) and selective (the
 * chained backward). */
static void test_tp_chunks(void **state)
{
    (void)state;
    int ok = 1;
    const char *counts[] = {"1", "3", "16"};
    for (int i = 0; i < 3; i++) {
        if (TEST_SANITIZED && i != 1)
            continue; /* ASan: 3 pieces, the last shorter; the release build runs 1 and 16 too */
        char *chunks = test_format("parallel.tp_chunks=%s", counts[i]);
        char *what = test_format("tp_chunks %s", counts[i]);
        char *what_no_sp = test_format("tp_chunks %s, no SP", counts[i]);
        const char *sp[] = {"balance.packer=wlb", chunks, NULL};
        ok &= check_layout(1, 4, 1, 2, fx.ref[1], sp, what);
        /* Without SP, packer fixed: its windows are full and cut inside documents, so a CP rank's
         * last row has a target and every row of the last, shorter piece counts (under wlb a last
         * piece one row short passed: its micro-batches end with a document's last token). */
        const char *no_sp[] = {"balance.packer=fixed", chunks, "parallel.sequence_parallel=false", NULL};
        if (!TEST_SANITIZED)
            ok &= check_layout(1, 4, 1, 2, fx.ref[0], no_sp, what_no_sp);
        /* and with SP on the same rows: 3 pieces, the last shorter */
        const char *sp_fixed[] = {"balance.packer=fixed", chunks, NULL};
        if (i == 1 && !TEST_SANITIZED)
            ok &= check_layout(1, 4, 1, 2, fx.ref[0], sp_fixed, "tp_chunks 3, fixed");
        free(chunks);
        free(what);
        free(what_no_sp);
    }
    const char *three[] = {"balance.packer=wlb", "parallel.tp_chunks=3", "train.recompute=full", NULL};
    if (!TEST_SANITIZED) /* ASan: the chained backward below, which runs the same pieces and more */
        ok &= check_overlap(1, 4, 2, 1, fx.ref[1], three, "tp_chunks 3, recompute full");
    /* The chained backward (model_chain_bwd.c) with its pieces interleaved, and selective's halves
     * recomputed around each chain. */
    const char *chained[] = {"balance.packer=wlb", "parallel.tp_chunks=3", "train.recompute=selective", NULL};
    ok &= check_overlap(1, 4, 2, 1, fx.ref[1], chained, "tp_chunks 3, recompute selective");
    assert_true(ok);
}

/* A layout under both packers and, with cp > 1, every CP mode. */
static void check_matrix(int dp, int tp, int pp, int cp)
{
    int ok = 1;
    for (int p = 0; p < 2; p++)
        for (int m = 0; m < (cp > 1 ? 4 : 1); m++) {
            if (TEST_SANITIZED && (p == 0 || (cp > 1 && m != 3)))
                continue; /* ASan: wlb, and hybrid for cp > 1 */
            char *packer = test_format("balance.packer=%s", packers[p]);
            char *mode = test_format("balance.cp_sharding=%s", cp > 1 ? modes[m] : "hybrid");
            char *what = test_format("%s, %s", packers[p], cp > 1 ? modes[m] : "-");
            const char *extra[] = {packer, mode, NULL};
            ok &= check_layout(dp, tp, pp, cp, fx.ref[p], extra, what);
            free(packer);
            free(mode);
            free(what);
        }
    assert_true(ok);
}

static void test_dp2(void **state) { (void)state; check_matrix(2, 1, 1, 1); }
static void test_tp2(void **state) { (void)state; check_matrix(1, 2, 1, 1); }
static void test_pp2(void **state) { (void)state; check_matrix(1, 1, 2, 1); }
static void test_cp2(void **state) { (void)state; check_matrix(1, 1, 1, 2); }
static void test_cp4(void **state) { (void)state; check_matrix(1, 1, 1, 4); }
static void test_dp2_tp2_pp2(void **state) { (void)state; check_matrix(2, 2, 2, 1); }
static void test_tp2_pp2_cp2(void **state) { (void)state; check_matrix(1, 2, 2, 2); }
static void test_dp2_tp2_pp2_cp2(void **state) { (void)state; check_matrix(2, 2, 2, 2); }

static void test_extras(void **state)
{
    (void)state;
    int ok = 1;
    const char *wlb[] = {"balance.packer=wlb", NULL};
    ok &= check_layout(1, 4, 1, 1, fx.ref[1], wlb, "kv heads replicated (tp 4 > 2)");
    const char *interleaved[] = {"balance.packer=wlb", "parallel.virtual_stages=2", NULL};
    ok &= check_layout(1, 2, 2, 1, fx.ref[1], interleaved, "interleaved, 2 virtual stages");
    const char *zero[] = {"balance.packer=wlb", "parallel.zero=1", NULL};
    ok &= check_layout(2, 2, 1, 2, fx.ref[1], zero, "ZeRO-1 over DP x CP");
    const char *tied[] = {"balance.packer=wlb", "model.tie_embeddings=true", NULL};
    ok &= check_layout(1, 2, 2, 1, fx.ref_tied, tied, "tied embeddings over 2 stages");
    const char *no_sp[] = {"balance.packer=wlb", "parallel.sequence_parallel=false", NULL};
    if (!TEST_SANITIZED) /* ASan: the next layout's no-SP path on 8 ranks instead of 16 */
        ok &= check_layout(2, 2, 2, 2, fx.ref[1], no_sp, "no sequence parallelism");
    const char *no_sp_full[] = {"balance.packer=wlb", "parallel.sequence_parallel=false", "train.recompute=full",
                                "model.tie_embeddings=true", NULL};
    ok &= check_layout(1, 4, 1, 2, fx.ref_tied, no_sp_full, "no sequence parallelism, full, tied");
    /* The path of a GPU backend with parallel.comm: mpi: every buffer copied through the host. */
    /* ASan: test_modes' staged bf16 run takes this path on 8 ranks instead of 16 */
    setenv("WLBTRAIN_COMM_STAGE", "1", 1);
    const char *staged[] = {"balance.packer=wlb", "parallel.zero=1", "model.tie_embeddings=true", NULL};
    if (!TEST_SANITIZED)
        ok &= check_layout_env(2, 2, 2, 2, fx.ref_tied, staged, "WLBTRAIN_COMM_STAGE", "staged through host buffers");
    unsetenv("WLBTRAIN_COMM_STAGE");
    assert_true(ok);
}

/* The output head in blocks of 128 rows over tiles of 9 columns of each TP rank's 128-column slice
 * (train.logits_block 1200; model_head.c: the statistics merged tile by tile, then over the ranks;
 * the backward recomputes each tile's logits), with SP at tp 2 x cp 2 and without SP at tp 2 x pp
 * 2, against one process with the whole slice in one block. */
static void test_head_tiles(void **state)
{
    (void)state;
    int ok = 1;
    const char *sp[] = {"balance.packer=wlb", "train.logits_block=1200", NULL};
    ok &= check_layout(1, 2, 1, 2, fx.ref[1], sp, "head over vocabulary tiles");
    const char *no_sp[] = {"balance.packer=wlb", "train.logits_block=1200", "parallel.sequence_parallel=false", NULL};
    ok &= check_layout(1, 2, 2, 1, fx.ref[1], no_sp, "head over vocabulary tiles, no SP");
    assert_true(ok);
}

/* Pipelines of 3 and 4 stages with tied embeddings (the first and last stage sum the embedding's
 * gradient: a pair the pipeline itself never connects), interleaved over 3 stages with 2 virtual
 * stages (the lanes' ring of 3 colours) and over 4 stages with 2 and 4
 * virtual stages (the last stage's messages to the first; 2 virtual stages at cp 2 with ZeRO-1 over DP x CP),
 * all under WLB_COMM_STRICT (group_setup): NCCL's matching, rendezvous and connection at first use.
 * An odd pp colours the lanes' ring with 3 colours (comm_lane_slot), an even one with 2. */
static void test_deep_pipelines(void **state)
{
    (void)state;
    int ok = 1;
    const char *tied[] = {"balance.packer=wlb", "model.tie_embeddings=true", NULL};
    ok &= check_layout(1, 1, 3, 1, fx.ref_tied, tied, "tied embeddings over 3 stages");
    if (TEST_SANITIZED) { /* ASan: the tied pair of pp 4 and the odd ring; the release build runs the rest */
        ok &= check_layout(1, 1, 4, 1, fx.ref_tied, tied, "tied embeddings over 4 stages");
        assert_true(ok);
        return;
    }
    const char *odd[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=6",
                         "data.global_batch_tokens=384", "parallel.virtual_stages=2", NULL};
    ok &= check_layout(1, 1, 3, 1, fx.ref_tied6, odd, "tied, interleaved v 2 over 3 stages");
    ok &= check_layout(1, 1, 4, 1, fx.ref_tied, tied, "tied embeddings over 4 stages");
    const char *v2[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=8",
                        "parallel.virtual_stages=2", "parallel.zero=1", NULL};
    ok &= check_layout(1, 1, 4, 2, fx.ref_tied8, v2, "tied, interleaved v 2, cp 2, ZeRO-1");
    const char *v4[] = {"balance.packer=wlb", "model.tie_embeddings=true", "model.n_layers=16",
                        "parallel.virtual_stages=4", NULL};
    ok &= check_layout(1, 1, 4, 1, fx.ref_tied16, v4, "tied, interleaved v 4");
    assert_true(ok);
}

/* parallel.stage_layers: the pipeline's layers split unevenly - [1, 3] at pp 2, and interleaved
 * [2, 1, 1, 2] over pp 2 x 2 virtual stages of a 6-layer model, both on 16 ranks (dp, tp, pp, cp 2
 * each) - and placed by auto (on one stage of 3 layers and one of 1, with the embedding tied), give
 * one process's losses, gradients and parameters. */
static void test_stage_layers(void **state)
{
    (void)state;
    int ok = 1;
    const char *uneven[] = {"balance.packer=wlb", "parallel.stage_layers=[1, 3]", NULL};
    if (!TEST_SANITIZED) /* ASan: the uneven split of the interleaved layout and of [3, 1] below */
        ok &= check_layout(2, 2, 2, 2, fx.ref[1], uneven, "stage layers [1, 3]");
    const char *interleaved[] = {"balance.packer=wlb", "model.n_layers=6", "parallel.virtual_stages=2",
                                 "parallel.stage_layers=[2, 1, 1, 2]", NULL};
    ok &= check_layout(2, 2, 2, 2, fx.ref6, interleaved, "interleaved, stage layers [2, 1, 1, 2]");
    const char *last_heavy[] = {"balance.packer=wlb", "model.tie_embeddings=true", "parallel.stage_layers=[3, 1]",
                                NULL};
    ok &= check_layout(1, 2, 2, 1, fx.ref_tied, last_heavy, "tied embeddings, stage layers [3, 1]");
    const char *placed[] = {"balance.packer=wlb", "parallel.stage_layers=auto", NULL};
    ok &= check_layout(1, 1, 2, 2, fx.ref[1], placed, "stage layers auto");
    assert_true(ok);
}

/* How many CP ranks of the dry run of the long corpus at this layout and packer exchange in blocks
 * of each size (its cp_group_ranks, summed over the steps): sizes[g] for g = 1, 2, 4; sizes[0]:
 * ranks in nested blocks (cp_nested_ranks); *cut: documents cut unevenly (cp_cut_docs). */
static void dry_run_group_ranks(int tp, int pp, int cp, const char *packer, int64_t *sizes, int64_t *cut)
{
    const char *bin = getenv("WLBTRAIN");
    char *stats = test_format("%s/groups.jsonl", fx.dir);
    char lay[4][32];
    snprintf(lay[3], 32, "balance.packer=%s", packer);
    snprintf(lay[0], 32, "parallel.tp=%d", tp);
    snprintf(lay[1], 32, "parallel.pp=%d", pp);
    snprintf(lay[2], 32, "parallel.cp=%d", cp);
    const char *argv[] = {bin ? bin : "./wlbtrain", "--config", fx.config_long, "--dry-run", "--steps", "3",
                          "--set", lay[0], "--set", lay[1], "--set", lay[2], "--set", lay[3],
                          "--set", "balance.cp_sharding=groups", "--stats-out", stats, NULL};
    CmdResult r;
    test_run(&r, argv);
    if (r.status != 0)
        print_error("dry run: %s%s\n", r.out, r.err);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    size_t len;
    char *text = test_read_file(stats, &len);
    for (int g = 0; g <= 4; g++)
        sizes[g] = 0;
    *cut = 0;
    /* "cp_group_ranks":{"1":N,"2":N,...},"cp_nested_ranks":N,"cp_cut_docs":N on every step line. */
    for (char *at = strstr(text, "\"cp_group_ranks\":{"); at; at = strstr(at + 1, "\"cp_group_ranks\":{")) {
        char *end = strchr(at, '}');
        for (int g = 1; g <= 4; g *= 2) {
            char key[16];
            snprintf(key, sizeof key, "\"%d\":", g);
            char *k = strstr(at, key);
            if (k && k < end)
                sizes[g] += strtoll(k + strlen(key), NULL, 10);
        }
        char *nested = strstr(end, "\"cp_nested_ranks\":"), *cuts = strstr(end, "\"cp_cut_docs\":");
        assert_non_null(nested);
        assert_non_null(cuts);
        sizes[0] += strtoll(nested + strlen("\"cp_nested_ranks\":"), NULL, 10);
        *cut += strtoll(cuts + strlen("\"cp_cut_docs\":"), NULL, 10);
    }
    free(text);
    free(stats);
}

/* balance.cp_sharding: groups against one process, on the corpus with long documents (packers
 * fixed and wlb) at CP 2, CP 4 and 16 ranks (tp 2, cp 4, pp 2), and on the short one with wlb. The
 * dry run of the long corpus must show blocks of 2 CP ranks (their communicators), ranks of their
 * own (no exchange) and documents cut unevenly over a block (eveners) at CP 4 and at tp 2 x cp 4 x
 * pp 2: otherwise the runs would not test them. (Nested blocks: test_cp_nested, on hand-made
 * plans.) */
static void test_groups(void **state)
{
    (void)state;
    int64_t sizes[5], cut;
    dry_run_group_ranks(1, 1, 4, "fixed", sizes, &cut);
    printf("# dry run, cp 4, groups: CP ranks in blocks of 1, 2, 4: %lld, %lld, %lld; in nested blocks %lld; "
           "documents cut unevenly %lld\n", (long long)sizes[1], (long long)sizes[2], (long long)sizes[4],
           (long long)sizes[0], (long long)cut);
    assert_true(sizes[1] > 0 && sizes[2] > 0 && cut > 0);
    dry_run_group_ranks(2, 2, 4, "fixed", sizes, &cut);
    printf("# dry run, tp 2 x cp 4 x pp 2: in nested blocks %lld; documents cut unevenly %lld\n", (long long)sizes[0],
           (long long)cut);
    assert_true(sizes[2] > 0 && cut > 0);
    int ok = 1;
    const char *groups[] = {"balance.cp_sharding=groups", NULL};
    const char *wlb[] = {"balance.packer=wlb", "balance.cp_sharding=groups", NULL};
    ok &= check_layout(1, 1, 1, 2, fx.ref_long, groups, "groups, long documents");
    ok &= check_layout(1, 1, 1, 4, fx.ref_long, groups, "groups, long documents");
    ok &= check_layout(1, 1, 1, 4, fx.ref_long_wlb, wlb, "wlb, groups, long documents");
    if (!TEST_SANITIZED) {
        ok &= check_layout(1, 2, 2, 4, fx.ref_long, groups, "groups, long documents");
        ok &= check_layout(1, 1, 1, 2, fx.ref[1], wlb, "wlb, groups");
        ok &= check_layout(1, 1, 1, 4, fx.ref[1], wlb, "wlb, groups");
    }
    assert_true(ok);
}

/* Runs a layout into out (kept), 0 when it ran. */
static int run_layout_to(int dp, int tp, int pp, int cp, const char *const *extra, const char *var, const char *out)
{
    char lay[4][32];
    snprintf(lay[0], 32, "parallel.dp=%d", dp);
    snprintf(lay[1], 32, "parallel.tp=%d", tp);
    snprintf(lay[2], 32, "parallel.pp=%d", pp);
    snprintf(lay[3], 32, "parallel.cp=%d", cp);
    const char *sets[16] = {lay[0], lay[1], lay[2], lay[3]};
    int k = 4;
    for (int i = 0; extra[i]; i++)
        sets[k++] = extra[i];
    sets[k] = NULL;
    char *log;
    remove(out);
    int status = run_dump_cfg(dp * tp * pp * cp, fx.config, out, sets, var, &log);
    if (status != 0)
        printf("# log:\n%s\n", log);
    free(log);
    return status;
}

/* parallel.reduce_dtype: compute in bf16 - the SP reduce-scatters, the TP sums of the embedding
 * and the output layer, and the dK/dV reduce-scatter travel and add in bf16 (an MPI user operation,
 * each addition rounded): near one bf16 process (3e-2 rather than the float32 sums' 1e-2: each
 * rank's partial sums are rounded to 8 bits of mantissa before they are added; the worst is a norm
 * weight's gradient, a sum over every row), and not the bits of the float32 sums (which a
 * reduce_dtype left unused would give); staged through host buffers too. With parallel.overlap the
 * started TP and CP sums in bf16 complete at their start (comm.h): the same bits as overlap false.
 * And the same bits as the sums computed another way (WLB_COMM_SUM16_GATHER: every rank's bf16 words
 * gathered and added in rank order, each addition rounded to nearest even by util/bf16.h): the MPI
 * user operation's rounding, which the tolerance above would not see truncated (1.6e-02 then, 1.1e-02
 * right; test_comm_sum16 pins the addition itself). */
static void test_reduce_dtype(void **state)
{
    (void)state;
    const char *f32[] = {"balance.packer=wlb", "balance.cp_sharding=per_doc", "train.precision=bf16", NULL};
    const char *b16[] = {"balance.packer=wlb", "balance.cp_sharding=per_doc", "train.precision=bf16",
                         "parallel.reduce_dtype=compute", NULL};
    const char *b16_off[] = {"balance.packer=wlb", "balance.cp_sharding=per_doc", "train.precision=bf16",
                             "parallel.reduce_dtype=compute", "parallel.overlap=false", NULL};
    char *a = test_format("%s/sums-fp32.safetensors", fx.dir), *b = test_format("%s/sums-bf16.safetensors", fx.dir);
    char *c = test_format("%s/sums-bf16-off.safetensors", fx.dir);
    char *d = test_format("%s/sums-bf16-gather.safetensors", fx.dir);
    char name[1100];
    for (int staged = 0; staged < 2; staged++) {
        const char *var = staged ? "WLBTRAIN_COMM_STAGE" : NULL;
        if (staged)
            setenv("WLBTRAIN_COMM_STAGE", "1", 1);
        assert_int_equal(run_layout_to(1, 2, 1, 2, f32, var, a), 0);
        assert_int_equal(run_layout_to(1, 2, 1, 2, b16, var, b), 0);
        assert_int_equal(run_layout_to(1, 2, 1, 2, b16_off, var, c), 0);
        unsetenv("WLBTRAIN_COMM_STAGE");
        double to_ref = test_compare_tensors(b, fx.ref_bf16, "", name, sizeof name);
        double to_f32 = test_compare_tensors(b, a, "", name, sizeof name);
        double to_off = test_compare_tensors(b, c, "", name, sizeof name);
        printf("# (tp 2, cp 2) bf16 sums%s: worst %.2e against one bf16 process, %.2e against the float32 sums, "
               "%.2e against parallel.overlap false (%s)\n", staged ? ", staged" : "", to_ref, to_f32, to_off, name);
        assert_true(to_ref <= 3e-2 && to_f32 > 0 && to_off == 0);
        if (staged)
            continue;
        setenv("WLB_COMM_SUM16_GATHER", "1", 1);
        assert_int_equal(run_layout_to(1, 2, 1, 2, b16, "WLB_COMM_SUM16_GATHER", d), 0);
        unsetenv("WLB_COMM_SUM16_GATHER");
        int same = same_bits(b, d, name, sizeof name);
        printf("# (tp 2, cp 2) bf16 sums against the same sums gathered and added in rank order: %s%s\n",
               same ? "same bits" : "DIFFER in ", same ? "" : name);
        assert_true(same);
    }
    remove(a);
    remove(b);
    remove(c);
    remove(d);
    free(a);
    free(b);
    free(c);
    free(d);
}

/* train.recompute recomputes with the same ops (collectives included under full): the same
 * tolerance as every layout; train.precision: bf16 (on the CPU the GPU's roundings emulated; the
 * all-gathers carry bf16, also staged through host buffers) against one bf16 process: each layout sums in its own order before rounding, so the tolerance is
 * bf16's. */
static void test_modes(void **state)
{
    (void)state;
    int ok = 1;
    const char *full[] = {"balance.packer=wlb", "balance.cp_sharding=hybrid", "train.recompute=full", NULL};
    ok &= check_layout(1, 2, 2, 2, fx.ref[1], full, "recompute full");
    const char *selective[] = {"balance.packer=wlb", "train.recompute=selective", NULL};
    if (!TEST_SANITIZED) /* ASan: test_tp_chunks runs selective recompute (its chained backward) */
        ok &= check_layout(2, 2, 2, 1, fx.ref[1], selective, "recompute selective");
    const char *bf16[] = {"balance.packer=wlb", "balance.cp_sharding=per_doc", "train.precision=bf16", NULL};
    if (!TEST_SANITIZED) /* ASan: the staged run below, the same model path and more copies */
        ok &= check_layout_tol(1, 2, 1, 2, fx.ref_bf16, bf16, NULL, "bf16, per_doc", 1e-2);
    /* The SP and K/V all-gathers carry 2-byte elements: staged through the host as a GPU's are. */
    setenv("WLBTRAIN_COMM_STAGE", "1", 1);
    ok &= check_layout_tol(1, 2, 2, 2, fx.ref_bf16, bf16, "WLBTRAIN_COMM_STAGE", "bf16, per_doc, staged", 1e-2);
    unsetenv("WLBTRAIN_COMM_STAGE");
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_dp2),         cmocka_unit_test(test_tp2),         cmocka_unit_test(test_pp2),
        cmocka_unit_test(test_cp2),         cmocka_unit_test(test_cp4),         cmocka_unit_test(test_dp2_tp2_pp2),
        cmocka_unit_test(test_tp2_pp2_cp2), cmocka_unit_test(test_dp2_tp2_pp2_cp2), cmocka_unit_test(test_extras),
        cmocka_unit_test(test_modes),       cmocka_unit_test(test_groups),      cmocka_unit_test(test_stage_layers),
        cmocka_unit_test(test_reduce_dtype),  cmocka_unit_test(test_deep_pipelines), cmocka_unit_test(test_head_tiles),
        cmocka_unit_test(test_overlap),     cmocka_unit_test(test_tp_chunks),   cmocka_unit_test(test_fault_order),
    };
    const char *filter = getenv("WLB_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("parallel", all, group_setup, group_teardown);
}
