/*
 * test/test_config.c - the config: loading, presets, derived defaults, every kind of error with
 * its location, --set, and the --print-config round trip of every example config.
 */
#include "test/testlib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/config_keys.h"

/* Loads yaml (named t.yaml in errors), applies sets, resolves for world_size. Returns the status. */
static int load(Config *cfg, const char *yaml, const char *const *sets, int world, Error *err)
{
    config_init(cfg);
    memset(err, 0, sizeof *err);
    if (config_load_string(cfg, yaml, "t.yaml", err) != 0)
        return -1;
    for (int i = 0; sets && sets[i]; i++)
        if (config_apply_set(cfg, sets[i], err) != 0)
            return -1;
    return config_resolve(cfg, world, err);
}

/* Asserts that loading fails with status 2 and exactly the message msg. */
static void expect_error(const char *yaml, const char *const *sets, int world, const char *msg)
{
    Config cfg;
    Error err;
    int rc = load(&cfg, yaml, sets, world, &err);
    if (rc == 0 || err.status != 2 || strcmp(err.msg, msg) != 0) {
        print_error("yaml:\n%s\nexpected error: %s\ngot rc %d status %d: %s\n", yaml, msg, rc, err.status, err.msg);
        config_free(&cfg);
        fail();
    }
    config_free(&cfg);
}

static const char tiny[] = "model:\n  preset: tiny\ntrain:\n  device: cpu\n";

static void test_defaults_and_preset(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    assert_int_equal(load(&cfg, "model:\n  preset: llama3-8b\n", NULL, 0, &err), 0);
    assert_int_equal(cfg.model.n_layers, 32);
    assert_int_equal(cfg.model.d_model, 4096);
    assert_int_equal(cfg.model.n_kv_heads, 8);
    assert_int_equal(cfg.model.d_ffn, 14336);
    assert_int_equal(cfg.model.vocab_size, 128256);
    assert_true(cfg.model.rope_theta == 500000.0);
    assert_false(cfg.model.tie_embeddings);
    /* Derived defaults. */
    assert_int_equal(cfg.data.context_window, 8192);
    assert_int_equal(cfg.balance.max_tokens_per_micro_batch, 2 * 8192);
    assert_int_equal(cfg.train.device, DEVICE_CUDA);
    assert_int_equal(cfg.train.precision, PRECISION_BF16);
    assert_true(cfg.train.min_lr == cfg.train.lr / 10);
    assert_int_equal(cfg.parallel.dp, 0); /* auto, no launch */
    assert_int_equal(cfg.data.global_batch_tokens, 0);
    assert_int_equal(cfg.balance.packer, PACKER_WLB);
    assert_int_equal(cfg.train.attention, ATTENTION_AUTO);
    config_free(&cfg);
    /* train.attention: cudnn on the GPU in bf16 (whether the build and the machine have cuDNN is the
     * backend's to say when it opens); own and auto also on the CPU, which has one attention */
    assert_int_equal(load(&cfg, "model:\n  preset: llama3-8b\ntrain:\n  attention: cudnn\n", NULL, 0, &err), 0);
    assert_int_equal(cfg.train.attention, ATTENTION_CUDNN);
    config_free(&cfg);
    assert_int_equal(load(&cfg, "model:\n  preset: tiny\ntrain:\n  device: cpu\n  attention: own\n", NULL, 0, &err),
                     0);
    assert_int_equal(cfg.train.attention, ATTENTION_OWN);
    config_free(&cfg);
}

static void test_explicit_keys_override_preset(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    /* The explicit key comes before the preset in the file and still wins. */
    assert_int_equal(load(&cfg, "model:\n  max_seq_len: 131072\n  preset: llama3-8b\n", NULL, 0, &err), 0);
    assert_int_equal(cfg.model.max_seq_len, 131072);
    assert_int_equal(cfg.data.context_window, 131072);
    assert_int_equal(cfg.model.n_layers, 32);
    config_free(&cfg);
    const char *sets[] = {"model.n_layers=2", "model.preset=llama3.2-1b", NULL};
    assert_int_equal(load(&cfg, "model:\n  preset: llama3-8b\n", sets, 0, &err), 0);
    assert_int_equal(cfg.model.n_layers, 2);
    assert_int_equal(cfg.model.d_model, 2048);
    assert_true(cfg.model.tie_embeddings);
    config_free(&cfg);
}

static void test_world_size(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    const char *yaml = "model: {preset: llama3-8b}\nparallel: {tp: 2, cp: 2, pp: 2}\n";
    assert_int_equal(load(&cfg, yaml, NULL, 32, &err), 0);
    assert_int_equal(cfg.parallel.dp, 4);
    /* Derived global batch: pp * dp * window, so M = pp micro-batches per replica. */
    assert_int_equal(cfg.data.global_batch_tokens, 2 * 4 * 8192);
    assert_int_equal(config_micro_batches(&cfg), 2);
    config_free(&cfg);
    expect_error(yaml, NULL, 30,
                 "t.yaml:2:16: parallel.dp: auto needs the job's 30 ranks to be a multiple of tp * cp * pp = 8");
    expect_error("model: {preset: llama3-8b}\nparallel: {tp: 2, dp: 3}\n", NULL, 8,
                 "t.yaml:2:23: parallel.dp: tp * cp * pp * dp = 2 * 1 * 1 * 3 = 6, but the job has 8 ranks "
                 "(mpirun -np / srun -n)");
}

static void test_unknown_keys_have_hints(void **state)
{
    (void)state;
    expect_error("model:\n  preset: tiny\nparallel:\n  tpp: 2\n", NULL, 0,
                 "t.yaml:4:3: parallel.tpp: unknown key (did you mean parallel.tp?)");
    expect_error("paralel:\n  tp: 2\n", NULL, 0, "t.yaml:1:1: paralel: unknown section (did you mean parallel?)");
    expect_error("model:\n  tp: 2\n", NULL, 0, "t.yaml:2:3: model.tp: unknown key (did you mean parallel.tp?)");
    expect_error("model:\n  xyzzy_frobnicate: 2\n", NULL, 0,
                 "t.yaml:2:3: model.xyzzy_frobnicate: unknown key (see wlbtrain --help-config)");
    const char *sets[] = {"train.lrr=0.1", NULL};
    expect_error(tiny, sets, 0, "--set train.lrr=0.1: train.lrr: unknown key (did you mean train.lr?)");
    /* A key earlier versions knew says why it is gone, in a file and in --set. */
    expect_error("balance:\n  cp_fill: true\n", NULL, 0,
                 "t.yaml:2:3: balance.cp_fill: removed: the step pass it switched changed predicted throughput "
                 "by under 0.2% on every benchmarked layout (docs/planner.md); delete the line");
    const char *fill[] = {"balance.cp_fill=false", NULL};
    expect_error(tiny, fill, 0, "--set balance.cp_fill=false: balance.cp_fill: removed: the step pass it switched "
                 "changed predicted throughput by under 0.2% on every benchmarked layout (docs/planner.md); delete the line");
    assert_string_equal(config_key_hint("data.contex_window"), "data.context_window");
    assert_null(config_key_hint("completely.different"));
}

static void test_types_and_ranges(void **state)
{
    (void)state;
    expect_error("model:\n  preset: tiny\nparallel:\n  tp: two\n", NULL, 0,
                 "t.yaml:4:7: parallel.tp: expected an integer, got 'two'");
    expect_error("model:\n  preset: tiny\nparallel:\n  tp: 0\n", NULL, 0,
                 "t.yaml:4:7: parallel.tp: must be between 1 and 1024, got 0");
    expect_error("model:\n  preset: tiny\nparallel:\n  dp: many\n", NULL, 0,
                 "t.yaml:4:7: parallel.dp: expected an integer or auto, got 'many'");
    expect_error("train:\n  lr: fast\n", NULL, 0, "t.yaml:2:7: train.lr: expected a number, got 'fast'");
    expect_error("train:\n  lr: 0\n", NULL, 0, "t.yaml:2:7: train.lr: must be > 0 and <= 10, got 0");
    expect_error("train:\n  beta1: 1.0\n", NULL, 0, "t.yaml:2:10: train.beta1: must be >= 0 and < 1, got 1.0");
    expect_error("model:\n  tie_embeddings: yes\n", NULL, 0,
                 "t.yaml:2:19: model.tie_embeddings: expected true or false, got 'yes'");
    expect_error("balance:\n  packer: best\n", NULL, 0,
                 "t.yaml:2:11: balance.packer: expected one of fixed|fixed_greedy|wlb, got 'best'");
    expect_error("parallel:\n  tp: [1, 2]\n", NULL, 0, "t.yaml:2:7: parallel.tp: expected a single value, got a list");
    expect_error("parallel:\n  tp: {a: 1}\n", NULL, 0,
                 "t.yaml:2:7: parallel.tp: expected a value or a list, got a mapping");
    expect_error("balance:\n  outlier_thresholds: [1000, x]\n", NULL, 0,
                 "t.yaml:2:23: balance.outlier_thresholds: expected an integer, got 'x'");
    expect_error("parallel: 3\n", NULL, 0,
                 "t.yaml:1:11: parallel: expected a mapping of keys (such as parallel.KEY: VALUE)");
    expect_error("- a\n- b\n", NULL, 0, "t.yaml:1:1: expected a mapping of sections (model:, parallel:, data:, ...)");
    expect_error("parallel:\n  tp: 1\n  tp: 2\n", NULL, 0, "t.yaml:3:3: parallel.tp: set twice in this file");
}

static void test_yaml_syntax_error_location(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    assert_int_not_equal(load(&cfg, "model:\n  preset: tiny\n parallel: [\n", NULL, 0, &err), 0);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "t.yaml:3:"));
    assert_non_null(strstr(err.msg, "YAML syntax:"));
    config_free(&cfg);
    expect_error("a: 1\n---\nb: 2\n", NULL, 0, "t.yaml:3:1: a second YAML document; a config is one document");
}

/* n "[" then n "]" after prefix, malloc'd. */
static char *nested_brackets(const char *prefix, int n)
{
    size_t len = strlen(prefix);
    char *s = malloc(len + 2 * (size_t)n + 2);
    assert_non_null(s);
    memcpy(s, prefix, len);
    memset(s + len, '[', (size_t)n);
    memset(s + len + n, ']', (size_t)n);
    strcpy(s + len + 2 * (size_t)n, "\n");
    return s;
}

/* Deep nesting is refused at the first node past 16 levels, before libyaml's scanner (quadratic in
 * the depth) gets far: a 200 KB config of 100,000 nested lists took over a minute to load. */
static void test_deep_nesting_refused(void **state)
{
    (void)state;
    char *deep = nested_brackets("", 100000);
    expect_error(deep, NULL, 0,
                 "t.yaml:1:17: YAML nested more than 16 levels deep; a config is sections of keys whose values are "
                 "plain values or lists of them (3 levels)");
    free(deep);
    char *in_key = nested_brackets("data:\n  path: ", 100000);
    expect_error(in_key, NULL, 0,
                 "t.yaml:2:23: YAML nested more than 16 levels deep; a config is sections of keys whose values are "
                 "plain values or lists of them (3 levels)");
    free(in_key);
    /* Block nesting counts too: "- " 17 times. */
    char block[64] = "";
    for (int i = 0; i < 17; i++)
        strcat(block, "- ");
    strcat(block, "x\n");
    expect_error(block, NULL, 0,
                 "t.yaml:1:33: YAML nested more than 16 levels deep; a config is sections of keys whose values are "
                 "plain values or lists of them (3 levels)");
    char *set_value = nested_brackets("data.path=", 100000);
    const char *sets[] = {set_value, NULL};
    Config cfg;
    Error err;
    assert_int_not_equal(load(&cfg, tiny, sets, 0, &err), 0);
    assert_int_equal(err.status, 2);
    char expect[256] = "--set data.path="; /* the argument's first 72 characters, then "..." */
    memset(expect + 16, '[', 62);
    strcpy(expect + 78, "...: YAML nested more than 16 levels deep; a config is sections of keys whose values are "
                        "plain values or lists of them (3 levels)");
    assert_string_equal(err.msg, expect);
    config_free(&cfg);
    free(set_value);
    /* 16 levels load (and then fail for what they are: a list where a section belongs). */
    char *ok = nested_brackets("", 16);
    expect_error(ok, NULL, 0, "t.yaml:1:1: expected a mapping of sections (model:, parallel:, data:, ...)");
    free(ok);
}

static void test_cross_field_rules(void **state)
{
    (void)state;
    /* The example of the issue: the error points at parallel.tp as written. */
    expect_error("model:\n  preset: llama3-8b\nparallel:\n  tp: 12\n", NULL, 0,
                 "t.yaml:4:7: parallel.tp: must divide model.n_heads (32), got 12");
    expect_error("model:\n  preset: llama3.2-3b\nparallel:\n  tp: 6\n", NULL, 0,
                 "t.yaml:4:7: parallel.tp: must divide model.n_kv_heads (8) or be a multiple of it, got 6");
    expect_error("model:\n  preset: tiny\n  d_ffn: 390\nparallel:\n  tp: 4\n", NULL, 0,
                 "t.yaml:5:7: parallel.tp: must divide model.d_ffn (390), got 4");
    expect_error("model:\n  preset: tiny\n  vocab_size: 502\nparallel:\n  tp: 4\n", NULL, 0,
                 "t.yaml:5:7: parallel.tp: must divide model.vocab_size (502) for the vocabulary-parallel "
                 "embedding, got 4");
    expect_error("model:\n  preset: tiny\n  n_heads: 8\n  n_kv_heads: 3\n", NULL, 0,
                 "t.yaml:4:15: model.n_kv_heads: must divide model.n_heads (8), got 3");
    expect_error("model:\n  preset: tiny\n  n_heads: 6\n", NULL, 0,
                 "t.yaml:3:12: model.n_heads: must divide model.d_model (128), got 6");
    expect_error("model:\n  preset: tiny\nparallel:\n  pp: 5\n", NULL, 0,
                 "t.yaml:4:7: parallel.pp: must not exceed model.n_layers (4), got 5");
    expect_error("model:\n  preset: tiny\nparallel:\n  cp: 3\n", NULL, 0,
                 "t.yaml:4:7: data.context_window: must be a multiple of 2 * parallel.cp = 6, got 4096");
    expect_error("model:\n  preset: tiny\ndata:\n  context_window: 8192\n", NULL, 0,
                 "t.yaml:4:19: data.context_window: must not exceed model.max_seq_len (4096), got 8192");
    expect_error("model:\n  preset: tiny\nparallel:\n  dp: 2\ndata:\n  global_batch_tokens: 4096\n", NULL, 0,
                 "t.yaml:6:24: data.global_batch_tokens: must be a multiple of parallel.dp * data.context_window = "
                 "2 * 4096 = 8192, got 4096");
    expect_error("model:\n  preset: tiny\ndata:\n  path: [a, b]\n  weights: [1]\n", NULL, 0,
                 "t.yaml:5:12: data.weights: 1 weights for 2 paths in data.path");
    expect_error("model:\n  preset: tiny\ndata:\n  path: a\n  lengths_file: l.txt\n", NULL, 0,
                 "t.yaml:5:17: data.lengths_file: set data.path (a data set) or data.lengths_file (lengths for a "
                 "dry run), not both (unset data.path with --set data.path=)");
    expect_error("model:\n  preset: tiny\ntrain:\n  device: cpu\n  recompute: some\n", NULL, 0,
                 "t.yaml:5:14: train.recompute: expected one of none|selective|full, got 'some'");
    expect_error("model:\n  preset: tiny\ntrain:\n  lr: 0.001\n  min_lr: 0.01\n", NULL, 0,
                 "t.yaml:5:11: train.min_lr: must not exceed train.lr (0.001), got 0.01");
    expect_error("model:\n  preset: tiny\ncheckpoint:\n  every: 10\n", NULL, 0,
                 "t.yaml:4:10: checkpoint.every: needs checkpoint.dir");
    expect_error("model:\n  preset: tiny\nparallel:\n  cp: 6\ndata:\n  context_window: 4092\nbalance:\n"
                 "  cp_sharding: groups\n", NULL, 0,
                 "t.yaml:8:16: balance.cp_sharding: groups needs parallel.cp a power of two, got 6");
    expect_error("model:\n  preset: tiny\nbalance:\n  outlier_thresholds: [3000, 2000]\n", NULL, 0,
                 "t.yaml:4:23: balance.outlier_thresholds: must be increasing, got 2000 after 3000");
    expect_error("model:\n  preset: tiny\nbalance:\n  max_tokens_per_micro_batch: 100\n", NULL, 0,
                 "t.yaml:4:31: balance.max_tokens_per_micro_batch: must be at least data.context_window (4096), "
                 "got 100");
    expect_error("model:\n  preset: tiny\ntrain:\n  device: cpu\nparallel:\n  comm: nccl\n", NULL, 0,
                 "t.yaml:6:9: parallel.comm: nccl needs train.device: cuda");
    expect_error("model:\n  preset: tiny\ntrain:\n  attention: fast\n", NULL, 0,
                 "t.yaml:4:14: train.attention: expected one of auto|cudnn|own, got 'fast'");
    expect_error("model:\n  preset: tiny\ntrain:\n  device: cpu\n  attention: cudnn\n", NULL, 0,
                 "t.yaml:5:14: train.attention: cudnn needs train.device: cuda");
    expect_error("model:\n  preset: llama3.2-1b\ntrain:\n  precision: fp32\n  attention: cudnn\n", NULL, 0,
                 "t.yaml:5:14: train.attention: cudnn needs train.precision: bf16");
    expect_error("model:\n  preset: tiny\ntrain:\n  attention: cudnn\n", NULL, 0,
                 "t.yaml:4:14: train.attention: cudnn runs head sizes 64 and 128, the model's is 32");
    expect_error("model:\n  n_layers: 2\n", NULL, 0,
                 "t.yaml: model.d_model: required (set it, or model.preset for a named shape)");
    expect_error("model:\n  preset: llama9\n", NULL, 0,
                 "t.yaml:2:11: model.preset: unknown preset 'llama9' (presets: llama2-7b, llama3-8b, llama3-70b, "
                 "llama3.1-8b, llama3.1-70b, llama3-405b, llama3.2-1b, llama3.2-3b, stories260k, tiny)");
}

static void test_set_overrides(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    const char *sets[] = {"parallel.tp=2", "data.path=[x, y]", "data.weights=[3, 1]", "train.init_from=",
                          "balance.outlier_thresholds=[]", NULL};
    assert_int_equal(load(&cfg, "model:\n  preset: tiny\ntrain:\n  init_from: w.bin\n", sets, 0, &err), 0);
    assert_int_equal(cfg.parallel.tp, 2);
    assert_int_equal(cfg.data.path.n, 2);
    assert_string_equal(cfg.data.path.v[1], "y");
    assert_true(cfg.data.weights.v[0] == 3.0);
    assert_null(cfg.train.init_from);
    assert_int_equal(cfg.balance.outlier_thresholds.n, 0);
    config_free(&cfg);
    /* The names of train.recompute's values are the key's choices, in enum order. */
    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        char set[64];
        snprintf(set, sizeof set, "train.recompute=%s", config_recompute_name((Recompute)r));
        const char *one[] = {set, NULL};
        assert_int_equal(load(&cfg, tiny, one, 0, &err), 0);
        assert_int_equal(cfg.train.recompute, r);
        config_free(&cfg);
    }
    const char *bad[] = {"parallel.tp=x", NULL};
    expect_error(tiny, bad, 0, "--set parallel.tp=x: parallel.tp: expected an integer, got 'x'");
    const char *cross[] = {"model.preset=llama3-8b", "parallel.tp=12", NULL};
    expect_error("", cross, 0, "--set parallel.tp=12: parallel.tp: must divide model.n_heads (32), got 12");
    const char *noeq[] = {"parallel.tp", NULL};
    expect_error(tiny, noeq, 0, "--set: expected KEY=VALUE (such as parallel.tp=2), got 'parallel.tp'");
}

/* Prints cfg, loads the text back and checks it is the same config. */
static void assert_round_trip(const Config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    Error err = {0};
    assert_int_equal(config_print(cfg, f, &err), 0);
    assert_int_equal(fclose(f), 0);
    Config back;
    config_init(&back);
    if (config_load_string(&back, text, "printed.yaml", &err) != 0 || config_resolve(&back, 0, &err) != 0) {
        print_error("%s\nprinted config does not load: %s\n", text, err.msg);
        fail();
    }
    assert_true(config_equal(cfg, &back));
    config_free(&back);
    free(text);
}

static void test_print_round_trip_examples(void **state)
{
    (void)state;
    DIR *d = opendir("config/examples");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strstr(e->d_name, ".yaml"))
            continue;
        char *path = test_format("config/examples/%s", e->d_name);
        Config cfg;
        Error err = {0};
        config_init(&cfg);
        if (config_load_file(&cfg, path, &err) != 0 || config_resolve(&cfg, 0, &err) != 0) {
            print_error("%s: %s\n", path, err.msg);
            fail();
        }
        assert_round_trip(&cfg);
        config_free(&cfg);
        free(path);
        n++;
    }
    closedir(d);
    assert_true(n >= 5);
}

static void test_print_round_trip_odd_values(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    /* Strings that look like the null words must come back as strings. */
    const char *yaml = "model: {preset: tiny, rope_theta: 123456.789, norm_eps: 1.0e-6}\n"
                       "data: {path: [\"none\", 'a b: c', \"#x\"], weights: [0.1, 0.7, 0.2], "
                       "lengths_column: \"null\"}\n"
                       "train: {device: cpu, lr: 0.1, min_lr: 0, grad_clip: 0.3}\n";
    assert_int_equal(load(&cfg, yaml, NULL, 0, &err), 0);
    assert_string_equal(cfg.data.path.v[0], "none");
    assert_string_equal(cfg.data.lengths_column, "null");
    assert_round_trip(&cfg);
    config_free(&cfg);
}

/* parallel.stage_layers: even, auto or a list, printed as written (auto loads back to auto: the
 * engine places it from the same config); the resolved split in parallel.chunk_layers; a list that
 * does not fit the model chunks is an error at the key's line. */
static void test_stage_layers(void **state)
{
    (void)state;
    Config cfg;
    Error err;
    const char *base = "model: {preset: llama3-8b}\nparallel:\n  pp: 4\n";
    /* The default: auto, placed by the engine (trainer_stage_layers), not here. */
    assert_int_equal(load(&cfg, base, NULL, 0, &err), 0);
    assert_int_equal(cfg.parallel.stage_layers.choice, STAGE_LAYERS_AUTO);
    assert_int_equal(cfg.parallel.chunk_layers.n, 0);
    assert_round_trip(&cfg);
    config_free(&cfg);
    const char *even[] = {"parallel.stage_layers=even", NULL};
    assert_int_equal(load(&cfg, base, even, 0, &err), 0);
    assert_int_equal(cfg.parallel.stage_layers.choice, STAGE_LAYERS_EVEN);
    assert_int_equal(cfg.parallel.chunk_layers.n, 4);
    int begin, end;
    config_chunk_layers(&cfg, 3, &begin, &end);
    assert_int_equal(begin, 24);
    assert_int_equal(end, 32);
    assert_round_trip(&cfg);
    config_free(&cfg);
    const char *list[] = {"parallel.stage_layers=[7, 9, 9, 7]", NULL};
    assert_int_equal(load(&cfg, base, list, 0, &err), 0);
    assert_int_equal(cfg.parallel.stage_layers.choice, STAGE_LAYERS_LIST);
    config_chunk_layers(&cfg, 1, &begin, &end);
    assert_int_equal(begin, 7);
    assert_int_equal(end, 16);
    assert_round_trip(&cfg);
    config_free(&cfg);
    /* Interleaved: one count per model chunk, chunk g on stage g % pp. */
    const char *inter[] = {"parallel.virtual_stages=2", "parallel.stage_layers=[3, 4, 4, 5, 4, 4, 5, 3]", NULL};
    assert_int_equal(load(&cfg, base, inter, 0, &err), 0);
    config_chunk_layers(&cfg, 7, &begin, &end);
    assert_int_equal(begin, 29);
    assert_int_equal(end, 32);
    config_free(&cfg);
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 4\n  stage_layers: [8, 8, 16]\n", NULL, 0,
                 "t.yaml:4:17: parallel.stage_layers: 3 counts for 4 model chunks: one per pipeline stage (pp 4 x "
                 "virtual_stages 1)");
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 2\n  virtual_stages: 2\n  stage_layers: [16, 16]\n",
                 NULL, 0, "t.yaml:5:17: parallel.stage_layers: 2 counts for 4 model chunks: one per pipeline stage and "
                 "virtual stage (pp 2 x virtual_stages 2)");
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 2\n  stage_layers: [0, 32]\n", NULL, 0,
                 "t.yaml:4:17: parallel.stage_layers: model chunk 0 (stage 0) has no layer; every chunk needs at least "
                 "one");
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 2\n  stage_layers: [15, 16]\n", NULL, 0,
                 "t.yaml:4:17: parallel.stage_layers: the counts add up to 31 layers, model.n_layers is 32");
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 2\n  stage_layers: balanced\n", NULL, 0,
                 "t.yaml:4:17: parallel.stage_layers: expected one of even|auto or a list of integers, got 'balanced'");
    expect_error("model: {preset: llama3-8b}\nparallel:\n  pp: 2\n  stage_layers: [16, -1]\n", NULL, 0,
                 "t.yaml:4:17: parallel.stage_layers: must be between 0 and 1024, got -1");
    const char *short_list[] = {"parallel.pp=2", "parallel.stage_layers=[1, 3]", NULL};
    expect_error("model: {preset: llama3-8b}\n", short_list, 0,
                 "--set parallel.stage_layers=[1, 3]: parallel.stage_layers: the counts add up to 4 layers, "
                 "model.n_layers is 32");
    /* One stage: a single count is a list of one. */
    const char *one[] = {"parallel.stage_layers=32", NULL};
    assert_int_equal(load(&cfg, "model: {preset: llama3-8b}\n", one, 0, &err), 0);
    assert_int_equal(cfg.parallel.chunk_layers.v[0], 32);
    config_free(&cfg);
}

static void test_every_default_loads(void **state)
{
    (void)state;
    /* config_init exits on a bad default; reaching here means every constant default loaded. Check
     * the reference lists every key with a default or a description of it. */
    Config cfg;
    config_init(&cfg);
    config_free(&cfg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print_reference(f);
    fclose(f);
    for (int k = 0; k < config_n_keys; k++) {
        char *row = test_format("| `%s` |", config_keys[k].name);
        assert_non_null(strstr(text, row));
        assert_true(config_keys[k].def || config_keys[k].doc_default);
        free(row);
    }
    free(text);
}

/* parallel.timeout_s: 0 (off) or at least the floor; 1e-9 made every start a false hang. The test
 * hook that lowers the floor for the tests' tiny models (WLBTRAIN_TEST_TIMEOUT_FLOOR_S, which
 * test/run.sh sets) is checked too, and restored after. */
static void test_timeout_floor(void **state)
{
    (void)state;
    const char *was = getenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S");
    char *saved = was ? strdup(was) : NULL;
    unsetenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S");
    expect_error("model:\n  preset: tiny\nparallel:\n  timeout_s: 1.0e-9\n", NULL, 0,
                 "t.yaml:4:14: parallel.timeout_s: 0 (the watchdog off) or at least 10 seconds: a hang is a wait of "
                 "minutes (default 600), and a start or a checkpoint save holds ranks for seconds; got 1e-09");
    expect_error("model:\n  preset: tiny\nparallel:\n  timeout_s: 3\n", NULL, 0,
                 "t.yaml:4:14: parallel.timeout_s: 0 (the watchdog off) or at least 10 seconds: a hang is a wait of "
                 "minutes (default 600), and a start or a checkpoint save holds ranks for seconds; got 3");
    Config cfg;
    Error err;
    static const char *const ok[] = {"model:\n  preset: tiny\nparallel:\n  timeout_s: 0\n", "model:\n  preset: tiny\nparallel:\n  timeout_s: 10\n",
                                     "model:\n  preset: tiny\nparallel:\n  timeout_s: 600\n"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(load(&cfg, ok[i], NULL, 0, &err), 0);
        config_free(&cfg);
    }
    setenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S", "2", 1);
    assert_int_equal(load(&cfg, "model:\n  preset: tiny\nparallel:\n  timeout_s: 3\n", NULL, 0, &err), 0);
    config_free(&cfg);
    expect_error("model:\n  preset: tiny\nparallel:\n  timeout_s: 1\n", NULL, 0,
                 "t.yaml:4:14: parallel.timeout_s: 0 (the watchdog off) or at least 2 seconds: a hang is a wait of "
                 "minutes (default 600), and a start or a checkpoint save holds ranks for seconds; got 1");
    setenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S", "0.001", 1);
    expect_error("model:\n  preset: tiny\nparallel:\n  timeout_s: 3\n", NULL, 0,
                 "WLBTRAIN_TEST_TIMEOUT_FLOOR_S: expected seconds from 1 to 10, got '0.001'");
    if (saved)
        setenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S", saved, 1);
    else
        unsetenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S");
    free(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_preset),
        cmocka_unit_test(test_explicit_keys_override_preset),
        cmocka_unit_test(test_world_size),
        cmocka_unit_test(test_unknown_keys_have_hints),
        cmocka_unit_test(test_types_and_ranges),
        cmocka_unit_test(test_yaml_syntax_error_location),
        cmocka_unit_test(test_deep_nesting_refused),
        cmocka_unit_test(test_cross_field_rules),
        cmocka_unit_test(test_set_overrides),
        cmocka_unit_test(test_print_round_trip_examples),
        cmocka_unit_test(test_print_round_trip_odd_values),
        cmocka_unit_test(test_stage_layers),
        cmocka_unit_test(test_every_default_loads),
        cmocka_unit_test(test_timeout_floor),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
