/*
 * test/test_continue.c - continued pretraining in stages (checkpoint.continue_from), with the tiny
 * recipe of config/examples/cpt-tiny-w64.yaml -> w128 -> w256 run as it is (on a corpus of its own,
 * fewer steps, the tiny model smaller still: 2 layers of width 32).
 *
 * Stage 1 (window 64, RoPE base 10000) runs 10 steps' schedule and stops after 6 with a checkpoint.
 * Then: stages 2 (window 128, base 40000) and 3 (256, 160000) start from the previous stage's
 * checkpoint and train; each prints the keys that changed, old -> new, and starts at the previous
 * stage's loss, not a fresh model's. In one process, the moments and weights a continued run starts
 * with are the checkpoint's bit for bit, its update count goes on and its schedule restarts; then it
 * trains. continue_schedule continue goes on after step 6 with the learning rates of the
 * uninterrupted stage-1 run; restart counts from step 1 with the warmup again, and a restarted stage
 * stopped and resumed goes on on its own schedule bit for bit. When no data.* or
 * balance.* key changed the stream and the queues go on: continued with nothing else changed, the
 * run is the uninterrupted one bit for bit (also with data.tokenizer set: it names only what export
 * copies); with a new RoPE base it reads the same tokens. A stage
 * on two TP ranks reads the one-process checkpoint resharded. A changed shape key
 * or model.norm_eps is one error line, and so is checkpoint.dir naming the earlier stage's folder; a
 * changed model.rope_* key is accepted and printed (the rule is the prefix).
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"
#include "util/statefile.h"

static char *dir, *docs;

/* The tiny preset made smaller still (the same for every stage): cheap enough for the ASan build. */
static const char *const smaller[] = {"model.n_layers=2", "model.d_model=32", "model.d_ffn=64", NULL};

/* [mpirun -np RANKS] wlbtrain --config config/examples/cpt-tiny-wW.yaml on the test corpus,
 * checkpoints in DIR/NAME, metrics in DIR/NAME.jsonl, continuing from DIR/FROM (NULL: as the file
 * says - none for w64), more --set arguments after (ranks 0: one process). */
static void stage_on(CmdResult *r, int ranks, int window, const char *name, const char *from, const char *const *sets)
{
    const char *args[48];
    int k = 0;
    char np[16];
    const char *bin = getenv("WLBTRAIN");
    test_launch_argv(args, &k, 120, ranks, NULL, np);
    args[k++] = bin && *bin ? bin : "./wlbtrain";
    char *cfg = test_format("config/examples/cpt-tiny-w%d.yaml", window);
    char *data = test_format("data.path=%s", docs), *ck = test_format("checkpoint.dir=%s/%s", dir, name);
    char *mt = test_format("log.metrics=%s/%s.jsonl", dir, name);
    char *cf = from ? test_format("checkpoint.continue_from=%s/%s", dir, from) : NULL;
    args[k++] = "--config";
    args[k++] = cfg;
    const char *mine[] = {data, ck, mt, cf};
    for (int i = 0; i < 4; i++)
        if (mine[i]) {
            args[k++] = "--set";
            args[k++] = mine[i];
        }
    for (int i = 0; smaller[i]; i++) {
        args[k++] = "--set";
        args[k++] = smaller[i];
    }
    for (int i = 0; sets && sets[i]; i++) {
        args[k++] = "--set";
        args[k++] = sets[i];
    }
    args[k] = NULL;
    test_run(r, args);
    if (r->status != 0)
        printf("# %s: exit %d\n%s%s", name, r->status, r->out, r->err);
    free(cfg);
    free(data);
    free(ck);
    free(mt);
    free(cf);
}

static void stage(CmdResult *r, int window, const char *name, const char *from, const char *const *sets)
{
    stage_on(r, 0, window, name, from, sets);
}

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    dir = test_tmpdir();
    docs = test_write_docs(dir, "docs", 3, 400, 4, 512);
    /* Stage 1: the schedule of 10 steps, stopped after 6 (a checkpoint is written at the stop). */
    CmdResult r;
    const char *sets[] = {"train.steps=10", "train.stop_after=6", NULL};
    stage(&r, 64, "w64", NULL, sets);
    int ok = r.status == 0 && strstr(r.out, "stopped after step 6");
    test_cmd_free(&r);
    /* And the same run uninterrupted: the reference of the learning rates and losses after step 6. */
    const char *whole[] = {"train.steps=10", NULL};
    stage(&r, 64, "w64-whole", NULL, whole);
    ok = ok && r.status == 0;
    test_cmd_free(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    test_rm_rf(dir);
    free(dir);
    free(docs);
    return 0;
}

/* The value text of key in the metrics line of `step` of DIR/NAME.jsonl ("" when absent). */
static void metric(const char *name, int64_t step, const char *key, char *out, size_t size)
{
    char *path = test_format("%s/%s.jsonl", dir, name), *text = test_read_file(path, NULL);
    assert_non_null(text);
    char want[48], pat[64];
    snprintf(want, sizeof want, "{\"step\":%lld,", (long long)step);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    out[0] = '\0';
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, want, strlen(want)) != 0)
            continue;
        const char *p = strstr(line, pat);
        if (p) {
            p += strlen(pat);
            size_t n = *p == '[' ? strcspn(p, "]") + 1 : strcspn(p, ",}");
            snprintf(out, size, "%.*s", (int)n, p);
        }
    }
    free(text);
    free(path);
}

/* The recipe's stages 2 and 3 (restart): the changed keys printed, the loss goes on. */
static void test_recipe_stages(void **state)
{
    (void)state;
    CmdResult r;
    const char *six[] = {"train.steps=6", NULL};
    char first1[40], last1[40], first2[40], last2[40], first3[40], pos[200];
    metric("w64", 1, "loss", first1, sizeof first1);
    metric("w64", 6, "loss", last1, sizeof last1);
    stage(&r, 128, "w128", "w64", six);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue:"));
    printf("%s", strstr(r.out, "continue:"));
    assert_non_null(strstr(r.out, "continue:   data.context_window 64 -> 128\n"));
    assert_non_null(strstr(r.out, "continue:   model.rope_theta 10000 -> 40000\n"));
    assert_non_null(strstr(r.out, "continue: data stream and planner queues start afresh"));
    assert_non_null(strstr(r.out, "after step 6: weights and AdamW's moments (6 updates;"));
    test_cmd_free(&r);
    metric("w128", 1, "loss", first2, sizeof first2);
    metric("w128", 6, "loss", last2, sizeof last2);
    stage(&r, 256, "w256", "w128", six);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue:   data.context_window 128 -> 256\n"));
    assert_non_null(strstr(r.out, "continue:   model.rope_theta 40000 -> 160000\n"));
    assert_non_null(strstr(r.out, "(12 updates;"));
    test_cmd_free(&r);
    metric("w256", 1, "loss", first3, sizeof first3);
    metric("w256", 6, "valid_position_loss", pos, sizeof pos);
    printf("# loss: stage 1 %s .. %s, stage 2 %s .. %s, stage 3 from %s; stage 3's valid loss by position %s\n",
           first1, last1, first2, last2, first3, pos);
    /* A fresh model starts near ln 512 = 6.24; each stage starts nearer to where the last one ended
     * than to that. */
    assert_true(atof(first1) > 6.0 && atof(last1) < atof(first1) - 0.1);
    assert_true(atof(first2) < (atof(first1) + atof(last1)) / 2);
    assert_true(atof(first3) < (atof(first1) + atof(last2)) / 2 && atof(last2) < atof(last1));
    assert_true(pos[0] == '[' && strchr(pos, ','));
}

/* In one process: the state a continued run starts with is the checkpoint's, bit for bit. */
static void test_moments_are_the_checkpoints(void **state)
{
    (void)state;
    Config cfg;
    Comm comm;
    Trainer tr;
    Error err = {0};
    char *data = test_format("data.path=%s", docs), *cf = test_format("checkpoint.continue_from=%s/w64", dir);
    config_init(&cfg);
    int rc = config_load_file(&cfg, "config/examples/cpt-tiny-w128.yaml", &err) != 0 ||
             config_apply_set(&cfg, data, &err) != 0 || config_apply_set(&cfg, cf, &err) != 0 ||
             config_apply_set(&cfg, "checkpoint.dir=none", &err) != 0 ||
             config_apply_set(&cfg, "log.metrics=none", &err) != 0 || config_apply_set(&cfg, smaller[0], &err) != 0 ||
             config_apply_set(&cfg, smaller[1], &err) != 0 || config_apply_set(&cfg, smaller[2], &err) != 0 ||
             config_resolve(&cfg, 1, &err) != 0 ||
             trainer_stage_layers(&cfg, NULL, NULL, &err) != 0 || comm_start(&comm, 0, &err) != 0 ||
             comm_split(&comm, 1, 1, 1, 1, 0, &err) != 0 || trainer_init(&tr, &cfg, &comm, &err) != 0;
    if (rc)
        print_error("setup: %s\n", err.msg);
    assert_int_equal(rc, 0);
    int64_t done = -1;
    assert_int_equal(trainer_continue(&tr, &done, &err), 0);
    assert_int_equal(done, 0); /* restart */
    Optim *o = &tr.chunks[0].optim;
    Model *m = &tr.chunks[0].model;
    assert_int_equal(o->step, 6);
    assert_int_equal(o->lr_step0, 6);
    /* The checkpoint's shard against what the trainer holds. */
    char *shard = test_format("%s/w64/step-00000006/shard-tp0-pp0-dpcp0.bin", dir);
    StateFile sf;
    assert_int_equal(statefile_open(&sf, shard, &err), 0);
    const char *names[3] = {"params.c0", "m.c0", "v.c0"};
    const float *have[3] = {m->params, o->m, o->v};
    size_t n = (size_t)m->n_params;
    float *host = malloc(n * sizeof *host);
    for (int i = 0; i < 3; i++) {
        const StateSection *s = statefile_find(&sf, names[i]);
        assert_non_null(s);
        assert_int_equal(s->size, n * sizeof *host);
        tr.ops->to_host(host, have[i], n * sizeof *host);
        double norm = 0;
        for (size_t j = 0; j < n; j++)
            norm += (double)host[j] * host[j];
        printf("# %s: %zu floats, norm %.6g, bit for bit the checkpoint's\n", names[i], n, sqrt(norm));
        assert_true(norm > 0);
        assert_memory_equal(host, s->data, n * sizeof *host);
    }
    statefile_close(&sf);
    free(shard);
    free(host);
    /* It trains: the schedule's first step (lr / warmup_steps), a finite loss. */
    TrainStats st;
    assert_int_equal(trainer_forward_backward(&tr, &st, &err), 0);
    assert_int_equal(trainer_update(&tr, &st, &err), 0);
    printf("# first step of the continued run: loss %.4f, lr %g, AdamW update %lld\n", st.loss, st.lr,
           (long long)o->step);
    char fresh[40], reached[40];
    metric("w64", 1, "loss", fresh, sizeof fresh); /* a fresh model's first loss */
    metric("w64", 6, "loss", reached, sizeof reached);
    assert_true(isfinite(st.loss) && st.loss < (atof(fresh) + atof(reached)) / 2);
    assert_true(st.lr == cfg.train.lr / (double)cfg.train.warmup_steps);
    assert_int_equal(o->step, 7);
    trainer_free(&tr);
    comm_finish(&comm);
    config_free(&cfg);
    free(data);
    free(cf);
}

/* continue: steps 7..10 with the uninterrupted stage-1 run's learning rates; restart: 1..4, warmup. */
static void test_restart_or_continue(void **state)
{
    (void)state;
    CmdResult r;
    const char *go_on[] = {"train.steps=10", "checkpoint.continue_schedule=continue", "train.lr=2.0e-3",
                           "train.warmup_steps=3", NULL};
    stage(&r, 128, "w128-continue", "w64", go_on);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue: steps and LR schedule go on after step 6, to train.steps 10\n"));
    assert_non_null(strstr(r.out, "step     7/10"));
    test_cmd_free(&r);
    char a[40], b[40];
    metric("w128-continue", 6, "lr", a, sizeof a);
    assert_string_equal(a, ""); /* no line before step 7 */
    for (int s = 7; s <= 10; s++) {
        metric("w128-continue", s, "lr", a, sizeof a);
        metric("w64-whole", s, "lr", b, sizeof b);
        printf("# step %d: lr %s continued, %s uninterrupted\n", s, a, b);
        assert_true(a[0] != '\0');
        assert_string_equal(a, b);
    }
    const char *restart[] = {"train.steps=4", NULL};
    stage(&r, 128, "w128-restart", "w64", restart);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue: steps and LR schedule restart: steps 1 to 4, warmup 2\n"));
    test_cmd_free(&r);
    metric("w128-restart", 1, "lr", a, sizeof a);
    assert_string_equal(a, "0.0005"); /* train.lr 1e-3 over warmup_steps 2 */
    metric("w128-restart", 4, "lr", a, sizeof a);
    assert_true(a[0] != '\0');
    /* A restarted stage stopped after step 2 and resumed (its own checkpoint, not continue_from
     * again) goes on on its own schedule: steps 3 and 4 as in the stage run in one go, bit for bit. */
    const char *stop[] = {"train.steps=4", "train.stop_after=2", NULL};
    stage(&r, 128, "w128-resumed", "w64", stop);
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    const char *resume[] = {"train.steps=4", "checkpoint.resume=auto", NULL};
    stage(&r, 128, "w128-resumed", "w64", resume);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "resume: "));
    assert_null(strstr(r.out, "continue: "));
    test_cmd_free(&r);
    for (int s = 3; s <= 4; s++)
        for (int i = 0; i < 2; i++) {
            const char *key = i ? "loss" : "lr";
            metric("w128-resumed", s, key, a, sizeof a);
            metric("w128-restart", s, key, b, sizeof b);
            assert_true(a[0] != '\0');
            assert_string_equal(a, b);
        }
    /* continue past train.steps: nothing to train, one line. */
    const char *short_[] = {"train.steps=6", "checkpoint.continue_schedule=continue", NULL};
    stage(&r, 128, "w128-short", "w64", short_);
    test_assert_error(&r, "checkpoint.continue_schedule: continue: ");
    test_cmd_free(&r);
}

/* Nothing of the data or the model changed: the stream and the planner's queues go on, and with the
 * schedule continued the run is the uninterrupted one, bit for bit. With a new RoPE base the steps
 * read the same tokens (the stream still goes on) and the losses differ. */
static void test_same_data_goes_on(void **state)
{
    (void)state;
    CmdResult r;
    const char *same[] = {"train.steps=10", "checkpoint.continue_schedule=continue", NULL};
    stage(&r, 64, "w64-same", "w64", same);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue: data stream and planner queues go on where they were"));
    test_cmd_free(&r);
    /* data.tokenizer only names what export copies: the stream still goes on. */
    const char *tok[] = {"train.steps=7", "checkpoint.continue_schedule=continue", "data.tokenizer=tok/tokenizer.json",
                         NULL};
    stage(&r, 64, "w64-tok", "w64", tok);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue:   data.tokenizer none -> tok/tokenizer.json\n"));
    assert_non_null(strstr(r.out, "continue: data stream and planner queues go on where they were"));
    test_cmd_free(&r);
    char t[40], w[40];
    metric("w64-tok", 7, "loss", t, sizeof t);
    metric("w64-whole", 7, "loss", w, sizeof w);
    assert_true(t[0] != '\0');
    assert_string_equal(t, w);
    const char *theta[] = {"train.steps=10", "checkpoint.continue_schedule=continue", "model.rope_theta=20000", NULL};
    stage(&r, 64, "w64-theta", "w64", theta);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue:   model.rope_theta 10000 -> 20000\n"));
    assert_non_null(strstr(r.out, "continue: data stream and planner queues go on where they were"));
    test_cmd_free(&r);
    for (int s = 7; s <= 10; s++) {
        const char *keys[] = {"loss", "grad_norm", "lr", "tokens", "queued"};
        for (int i = 0; i < 5; i++) {
            char a[40], b[40], c[40];
            metric("w64-same", s, keys[i], a, sizeof a);
            metric("w64-whole", s, keys[i], b, sizeof b);
            metric("w64-theta", s, keys[i], c, sizeof c);
            if (i == 0)
                printf("# step %d: loss %s continued, %s uninterrupted, %s with rope_theta 20000\n", s, a, b, c);
            assert_true(a[0] != '\0' && c[0] != '\0');
            assert_string_equal(a, b);
            if (i == 0 || i == 1)
                assert_string_not_equal(c, b);
            else
                assert_string_equal(c, b);
        }
    }
}

/* A stage on another layout: two TP ranks read the one-process checkpoint resharded, and train. */
static void test_stage_on_two_ranks(void **state)
{
    (void)state;
    CmdResult r;
    const char *tp2[] = {"parallel.tp=2", "train.steps=2", NULL};
    stage_on(&r, 2, 128, "w128-tp2", "w64", tp2);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "(6 updates; resharded from tp 1, cp 1, pp 1, dp 1, zero 0"));
    assert_non_null(strstr(r.out, "continue:   parallel.tp 1 -> 2\n"));
    assert_non_null(strstr(r.out, "step     2/2"));
    test_cmd_free(&r);
    char a[40], b[40];
    metric("w128-tp2", 1, "loss", a, sizeof a);
    metric("w128", 1, "loss", b, sizeof b); /* the same stage in one process (test_recipe_stages) */
    printf("# stage 2's first loss: %s on tp 2, %s in one process\n", a, b);
    assert_true(a[0] != '\0' && b[0] != '\0');
    assert_true(fabs(atof(a) - atof(b)) <= 1e-6 * atof(b));
}

static void test_refusals(void **state)
{
    (void)state;
    CmdResult r;
    const char *ffn[] = {"model.d_ffn=256", NULL};
    stage(&r, 128, "w128-ffn", "w64", ffn);
    test_assert_error(&r, "checkpoint.continue_from: ");
    assert_non_null(strstr(r.err, "/w64/step-00000006: model.d_ffn 64 -> 256: a continued run keeps the model"));
    test_cmd_free(&r);
    const char *eps[] = {"model.norm_eps=1e-6", NULL};
    stage(&r, 128, "w128-eps", "w64", eps);
    test_assert_error(&r, "model.norm_eps 1e-05 -> 1e-06: a continued run keeps the model");
    test_cmd_free(&r);
    stage(&r, 128, "w64", "w64", NULL);
    test_assert_error(&r, "checkpoint.dir: ");
    assert_non_null(strstr(r.err, "holds the checkpoint that checkpoint.continue_from names"));
    test_cmd_free(&r);
    /* With resume auto too: refused before the earlier stage's latest would be resumed as this run. */
    const char *own[] = {"checkpoint.resume=auto", NULL};
    stage(&r, 128, "w64", "w64", own);
    test_assert_error(&r, "checkpoint.dir: ");
    assert_non_null(strstr(r.err, "holds the checkpoint that checkpoint.continue_from names"));
    assert_null(strstr(r.out, "resume: "));
    test_cmd_free(&r);
    /* A RoPE key other than the base: accepted and printed, whatever its name (the model.rope_ prefix). */
    const char *scaled[] = {"model.rope_scaling=llama3", "model.rope_scaling_factor=4",
                            "model.rope_original_max_seq_len=64", "train.steps=1", NULL};
    stage(&r, 128, "w128-scaled", "w64", scaled);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "continue:   model.rope_scaling none -> llama3\n"));
    assert_non_null(strstr(r.out, "continue:   model.rope_scaling_factor 8 -> 4\n"));
    assert_non_null(strstr(r.out, "continue:   model.rope_original_max_seq_len 8192 -> 64\n"));
    test_cmd_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recipe_stages),
        cmocka_unit_test(test_moments_are_the_checkpoints),
        cmocka_unit_test(test_restart_or_continue),
        cmocka_unit_test(test_same_data_goes_on),
        cmocka_unit_test(test_stage_on_two_ranks),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
