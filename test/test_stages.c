/*
 * test/test_stages.c - parallel.stage_layers: auto. The search (engine/plan/stages.c) against every
 * split of small models (the slowest stage it reaches is the least any split reaches, with and
 * without memory limits, interleaved or not), Llama 3's first/last-stage rule where the output layer
 * weighs (interleaved: on the last model chunk, priced here in a step), the typical micro-batch
 * against its definition, and the trainer's placement under the
 * memory model (train_stages.c): it fits where the even split does not, and every rank computes the
 * same.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/ops.h"
#include "engine/plan/cost.h"
#include "engine/plan/plan.h"
#include "engine/plan/sched.h"
#include "engine/plan/stages.h"
#include "engine/train/train_memory.h"
#include "engine/train/train_stages.h"

enum { MAX_CHUNKS = 16 };

/* Costs of a layer (a third forward), an embedding and an output layer, no sends. */
static StageCosts costs(double layer, double embed, double head)
{
    return (StageCosts){layer / 3, 2 * layer / 3, embed / 3, 2 * embed / 3, head / 3, 2 * head / 3, 0, 0};
}

/* The largest stage time of a split. */
static double slowest(const StageCosts *c, int pp, int v, const int64_t *split)
{
    double most = 0;
    for (int s = 0; s < pp; s++) {
        double t = stages_stage_s(c, pp, v, split, s);
        most = t > most ? t : most;
    }
    return most;
}

/* A memory limit for the search: stage s holds at most limit[s] layers. */
static int within_limit(void *ctx, int s, const int64_t *split)
{
    const int *limit = ctx;
    int pp = limit[MAX_CHUNKS], v = limit[MAX_CHUNKS + 1];
    int64_t n = 0;
    for (int g = s; g < pp * v; g += pp)
        n += split[g];
    return n <= limit[s];
}

/* The least slowest-stage time over every split of L layers into pp * v chunks of at least one
 * (every composition, by recursion), among those within limit (NULL: all); -1 when none is. */
static double best_by_brute_force(const StageCosts *c, int L, int pp, int v, int *limit, int64_t *split, int g)
{
    int chunks = pp * v;
    if (g == chunks - 1) {
        split[g] = L;
        for (int s = 0; limit && s < pp; s++)
            if (!within_limit(limit, s, split))
                return -1;
        return slowest(c, pp, v, split);
    }
    double best = -1;
    for (int n = 1; n <= L - (chunks - 1 - g); n++) {
        split[g] = n;
        double t = best_by_brute_force(c, L - n, pp, v, limit, split, g + 1);
        if (t >= 0 && (best < 0 || t < best))
            best = t;
    }
    return best;
}

static void check_split(const int64_t *split, int L, int chunks)
{
    int64_t sum = 0;
    for (int g = 0; g < chunks; g++) {
        assert_true(split[g] >= 1);
        sum += split[g];
    }
    assert_int_equal(sum, L);
}

static void test_auto_is_exact(void **state)
{
    (void)state;
    const double heads[] = {0, 0.3, 1, 2.4, 5.5}, embeds[] = {0, 0.05, 0.7};
    int cases = 0, limited = 0;
    for (int pp = 1; pp <= 4; pp++)
        for (int v = 1; v <= 3; v++)
            for (int L = pp * v; L <= pp * v + 6 && L <= 14; L++)
                for (int h = 0; h < 5; h++)
                    for (int e = 0; e < 3; e++) {
                        StageCosts c = costs(1.0, embeds[e], heads[h]);
                        StageLayout l = {L, pp, v, 0};
                        int64_t split[MAX_CHUNKS], scratch[MAX_CHUNKS];
                        assert_int_equal(stages_least_slowest(&c, &l, NULL, NULL, split), 1);
                        check_split(split, L, pp * v);
                        double best = best_by_brute_force(&c, L, pp, v, NULL, scratch, 0);
                        if (fabs(slowest(&c, pp, v, split) - best) > 1e-12)
                            print_error("pp %d v %d L %d head %g embed %g: auto %g, best %g\n", pp, v, L, heads[h],
                                        embeds[e], slowest(&c, pp, v, split), best);
                        assert_true(fabs(slowest(&c, pp, v, split) - best) <= 1e-12);
                        /* A memory limit per stage (a pseudo-random one): the best within it, or none. */
                        int limit[MAX_CHUNKS + 2];
                        for (int s = 0; s < pp; s++)
                            limit[s] = v + (int)((7u * (unsigned)(L + s) + 3u * (unsigned)h + (unsigned)e) % 5u);
                        limit[MAX_CHUNKS] = pp;
                        limit[MAX_CHUNKS + 1] = v;
                        double lim_best = best_by_brute_force(&c, L, pp, v, limit, scratch, 0);
                        int fits = stages_least_slowest(&c, &l, within_limit, limit, split);
                        check_split(split, L, pp * v);
                        assert_int_equal(fits, lim_best >= 0);
                        if (fits) {
                            for (int s = 0; s < pp; s++)
                                assert_true(within_limit(limit, s, split));
                            assert_true(fabs(slowest(&c, pp, v, split) - lim_best) <= 1e-12);
                            limited++;
                        } else {
                            /* None fits: placed for time alone. */
                            assert_true(fabs(slowest(&c, pp, v, split) - best) <= 1e-12);
                        }
                        cases++;
                    }
    printf("# %d cases against every split, %d of them with a memory limit that some split meets\n", cases, limited);
    assert_true(limited > 100);
}

/* Llama 3's rule: with an output layer of 2.4 layers, the last stage gives up layers (and the first,
 * embedding aside, keeps its share); with a light one the split stays even. Interleaved, the chunk
 * with the output layer holds fewer than the other chunk of its stage. */
static void test_auto_first_last_rule(void **state)
{
    (void)state;
    StageCosts heavy = costs(1.0, 0.05, 2.4), light = costs(1.0, 0.05, 0.3);
    StageLayout l4 = {32, 4, 1, 0}, l16 = {126, 16, 1, 0}, l4x2 = {32, 4, 2, 0};
    int64_t split[8];
    stages_least_slowest(&heavy, &l4, NULL, NULL, split);
    assert_true(split[0] == 8 && split[1] == 9 && split[2] == 9 && split[3] == 6);
    stages_least_slowest(&light, &l4, NULL, NULL, split);
    for (int s = 0; s < 4; s++)
        assert_int_equal(split[s], 8);
    /* 126 layers over 16 stages (Llama 3 405B): the even split has 8 on the first 14 stages and 7 on
     * the last two; with the output layer of 2.4 layers the last stage keeps at most 6. */
    int64_t big[16], split16[16];
    stages_least_slowest(&heavy, &l16, NULL, NULL, big);
    check_split(big, 126, 16);
    assert_true(big[15] <= 6);
    config_even_layers(126, 16, split16);
    assert_true(split16[15] == 7 && fabs(slowest(&heavy, 16, 1, split16) - 9.4) <= 1e-12);
    assert_true(fabs(slowest(&heavy, 16, 1, big) - 8.4) <= 1e-12);
    stages_least_slowest(&heavy, &l4x2, NULL, NULL, split);
    check_split(split, 32, 8);
    assert_true(split[3] + split[7] == 6 && split[7] < split[3]);
    assert_true(split[0] + split[4] == 8 && split[1] + split[5] == 9);
}

/* The step check: Llama 3 405B at 8K on 16 stages (the dry run's typical micro-batch: a layer
 * 19.49 ms, the embedding 1.61, the output layer 8.52, a send 0.5): taking a layer off the first and
 * the last stage gains 1% on the slowest stage, but with 32 micro-batches a step the pipeline's
 * fill and drain lose more, so auto keeps the even split; with 64 the gain wins. Llama 3 8B's
 * output layer (two layers) wins at 32. Where the even split does not fit, auto keeps the one that
 * does, slower or not. */
static void test_auto_step_check(void **state)
{
    (void)state;
    StageCosts big = costs(19.49e-3, 1.61e-3, 8.52e-3);
    big.p2p_s = 0.5e-3;
    int64_t split[16], least[16], even[16];
    int fit;
    Error err = {0};
    for (int m = 32; m <= 64; m += 32) {
        StageLayout l = {126, 16, 1, m};
        double t_split, t_even, t_least;
        assert_int_equal(stages_auto(&big, &l, NULL, NULL, split, &fit, &err), 0);
        stages_least_slowest(&big, &l, NULL, NULL, least);
        config_even_layers(126, 16, even);
        assert_int_equal(stages_step_s(&big, &l, split, &t_split, &err), 0);
        assert_int_equal(stages_step_s(&big, &l, even, &t_even, &err), 0);
        assert_int_equal(stages_step_s(&big, &l, least, &t_least, &err), 0);
        printf("# 405B at 8K, %d micro-batches: least slowest stage %.4f s a step (first %lld, last %lld layers), "
               "even %.4f s\n", m, t_least, (long long)least[0], (long long)least[15], t_even);
        assert_true(least[0] == 7 && least[15] == 7);
        assert_true(t_split <= t_even && t_split == (t_least < t_even ? t_least : t_even));
        assert_memory_equal(split, m == 32 ? even : least, sizeof split);
    }
    StageCosts eight = costs(1.0, 0.05, 2.0);
    StageLayout l8 = {32, 4, 1, 32};
    assert_int_equal(stages_auto(&eight, &l8, NULL, NULL, split, &fit, &err), 0);
    assert_true(fit && split[3] < 8);
    /* Stage 0 holds at most 7 layers: the even split does not fit, auto's does. */
    int limit[MAX_CHUNKS + 2] = {7, 20, 20, 20};
    limit[MAX_CHUNKS] = 4;
    limit[MAX_CHUNKS + 1] = 1;
    StageCosts light = costs(1.0, 0.05, 0.3);
    assert_int_equal(stages_auto(&light, &l8, within_limit, limit, split, &fit, &err), 0);
    assert_true(fit && split[0] <= 7);
    /* Interleaved: the step is simulated with the interleaved schedule (m a multiple of pp). */
    StageLayout inter = {32, 4, 2, 8};
    assert_int_equal(stages_auto(&eight, &inter, NULL, NULL, split, &fit, &err), 0);
    check_split(split, 32, 8);
    StageLayout odd = {32, 4, 2, 6};
    assert_int_equal(stages_auto(&eight, &odd, NULL, NULL, split, &fit, &err), -1);
    assert_non_null(strstr(err.msg, "interleaved 1F1B takes micro-batches in groups of pp"));
}

/* A typical step of split under the schedule, priced here: every chunk its layers, the embedding on
 * chunk 0, the output layer on the last chunk (pp v - 1: stage pp - 1's last chunk). */
static double step_by_hand(const StageCosts *c, const StageLayout *l, const int64_t *split)
{
    int chunks = l->pp * l->v;
    double fwd[8 * MAX_CHUNKS], bwd[8 * MAX_CHUNKS], p2p[8];
    assert_true(l->m <= 8 && chunks <= MAX_CHUNKS);
    for (int k = 0; k < l->m; k++) {
        p2p[k] = c->p2p_s;
        for (int g = 0; g < chunks; g++) {
            fwd[k * chunks + g] = (double)split[g] * c->layer_fwd_s;
            bwd[k * chunks + g] = (double)split[g] * c->layer_bwd_s;
        }
        fwd[k * chunks] += c->embed_fwd_s;
        bwd[k * chunks] += c->embed_bwd_s;
        fwd[k * chunks + chunks - 1] += c->head_fwd_s;
        bwd[k * chunks + chunks - 1] += c->head_bwd_s;
    }
    SchedReplica rep = {l->pp, l->v, l->m, fwd, bwd, p2p, 0, NULL}; /* receives posted ahead, as stages.c prices */
    double t;
    Error err = {0};
    assert_int_equal(sched_makespan(&rep, &t, &err), 0);
    return t;
}

/* Interleaved (pp 4, 2 chunks a stage, 32 layers, 8 micro-batches, an output layer of 2 layers):
 * the output layer is on the last model chunk, so auto moves layers off it, and its split is faster
 * than the even one in a step priced here - and its own step time is that one. */
static void test_auto_interleaved_output_layer(void **state)
{
    (void)state;
    StageCosts eight = costs(1.0, 0.05, 2.0);
    StageLayout inter = {32, 4, 2, 8};
    int64_t split[8], even[8];
    int fit;
    Error err = {0};
    assert_int_equal(stages_auto(&eight, &inter, NULL, NULL, split, &fit, &err), 0);
    check_split(split, 32, 8);
    config_even_layers(32, 8, even);
    double t_auto = step_by_hand(&eight, &inter, split), t_even = step_by_hand(&eight, &inter, even), t_own;
    assert_int_equal(stages_step_s(&eight, &inter, split, &t_own, &err), 0);
    printf("# pp 4 x 2 chunks, 32 layers, 8 micro-batches: auto [%lld %lld %lld %lld | %lld %lld %lld %lld] %.2f "
           "a step, even %.2f (%.1f%% slower)\n", (long long)split[0], (long long)split[1], (long long)split[2],
           (long long)split[3], (long long)split[4], (long long)split[5], (long long)split[6], (long long)split[7],
           t_auto, t_even, 100 * (t_even / t_auto - 1));
    assert_true(fabs(t_own - t_auto) <= 1e-9 * t_auto);
    assert_true(split[7] < even[7]);
    assert_true(t_auto < 0.95 * t_even);
}

/* A lengths file of n documents of len tokens. */
static char *write_lengths(const char *dir, int n, int len)
{
    char *text = calloc((size_t)n * 8 + 1, 1);
    for (int i = 0; i < n; i++)
        sprintf(text + strlen(text), "%d\n", len);
    char *path = test_write_file(dir, "lengths.txt", text, strlen(text));
    free(text);
    return path;
}

static void make_config(Config *cfg, const char *yaml)
{
    Error err = {0};
    config_init(cfg);
    if (config_load_string(cfg, yaml, "t.yaml", &err) != 0 || config_resolve(cfg, 0, &err) != 0) {
        print_error("%s\n", err.msg);
        fail();
    }
}

/* The typical micro-batch against its definition: documents of 1000 tokens, a window of 4096 on 2
 * CP ranks (2048 tokens each); the sample runs to the first document past 256 windows (1049
 * documents), so a window holds 4.096 documents' attention, half of it on a CP rank. */
static void test_typical_costs(void **state)
{
    (void)state;
    double bwd_none = 0, tp_none = 0;
    for (int recompute = 0; recompute <= 2; recompute++) {
        static const char *const modes[] = {"none", "selective", "full"};
        char *yaml = test_format("model: {preset: llama3-8b, max_seq_len: 4096}\n"
                                 "parallel: {tp: 2, cp: 2, pp: 2, dp: 1}\n"
                                 "data: {context_window: 4096, global_batch_tokens: 16384}\n"
                                 "train: {recompute: %s}\n",
                                 modes[recompute]);
        Config cfg;
        CostModel cost;
        Error err = {0};
        make_config(&cfg, yaml);
        assert_int_equal(cost_model_init(&cost, &cfg, &err), 0);
        uint32_t *lens = malloc(3000 * sizeof *lens);
        for (int i = 0; i < 3000; i++)
            lens[i] = 1000;
        DataSource src = data_source_from_lengths(lens, 3000, 3000000);
        StageCosts c;
        assert_int_equal(stages_typical_costs(&cfg, &cost, &src, NULL, 1, &c, &err), 0);
        double f, b;
        cost_attn_fb_s(&cost, 1000, 1000, &f, &b);
        double share = 4096.0 / 1049000.0 / 2 * 1049;
        double fwd = share * f + cost_linear_fwd_s(&cost, 2048) + cost_tp_comm_s(&cost, 2048);
        double bwd = share * b + cost_linear_bwd_s(&cost, 2048) + cost_tp_comm_s(&cost, 2048);
        assert_true(fabs(c.layer_fwd_s - fwd) <= 1e-12 * fwd);
        assert_true(fabs(c.layer_bwd_s - bwd) <= 1e-12 * c.layer_bwd_s);
        /* train.recompute's work is in the cost model's backward, counted once: a longer backward;
         * under full by exactly the layer's forward again, whose exchanges are the forward's
         * (they carry the rerun's share: less those without recomputation). */
        if (recompute == 0) {
            bwd_none = bwd;
            tp_none = cost_tp_comm_s(&cost, 2048);
        }
        assert_true(recompute == 0 || bwd > bwd_none);
        assert_true(recompute != 2 || fabs(bwd - bwd_none - (fwd - tp_none)) <= 1e-12 * bwd);
        assert_true(c.head_fwd_s == cost_head_fwd_s(&cost, 2048) && c.head_bwd_s == cost_head_bwd_s(&cost, 2048));
        assert_true(c.embed_fwd_s == cost_embed_fwd_s(&cost, 2048) && c.embed_bwd_s == cost_embed_bwd_s(&cost, 2048));
        assert_true(c.p2p_s == cost_p2p_s(&cost, 2048) && c.p2p_s > 0);
        assert_true(fabs(c.pairs_per_token - cost_attn_pairs(&cost, 1000, 1000) / 1000) <= 1e-9);
        free(lens);
        config_free(&cfg);
        free(yaml);
    }
}

/* The trainer's placement: Llama 3 8B at 8K windows of short documents, pp 4 - the output layer
 * weighs about 2 layers. With room, the last stage gives up layers. With a budget the even split
 * exceeds on stage 0 (the most micro-batches in flight) but some split meets, every stage of the
 * placed split fits by the memory model; with too little for any, it places for time and says so. */
static void test_trainer_placement(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *lengths = write_lengths(dir, 4000, 300);
    const char *form = "model: {preset: llama3-8b}\n"
                       "parallel: {tp: 2, pp: 4, dp: 1, stage_layers: auto}\n"
                       "data: {lengths_file: %s, global_batch_tokens: 131072}\n"
                       "train: {device: cuda, gpu_memory_gb: %s}\n";
    char *yaml = test_format(form, lengths, "0");
    Config cfg;
    Error err = {0};
    StageCosts c;
    int fits;
    make_config(&cfg, yaml);
    assert_int_equal(trainer_stage_layers(&cfg, &c, &fits, &err), 0);
    assert_true(fits);
    check_split(cfg.parallel.chunk_layers.v, 32, 4);
    printf("# 8B at 8K, pp 4: output layer %.2f layers; placed %lld, %lld, %lld, %lld\n",
           (c.head_fwd_s + c.head_bwd_s) / (c.layer_fwd_s + c.layer_bwd_s),
           (long long)cfg.parallel.chunk_layers.v[0], (long long)cfg.parallel.chunk_layers.v[1],
           (long long)cfg.parallel.chunk_layers.v[2], (long long)cfg.parallel.chunk_layers.v[3]);
    assert_true(c.head_fwd_s + c.head_bwd_s > 1.5 * (c.layer_fwd_s + c.layer_bwd_s));
    assert_true(cfg.parallel.chunk_layers.v[3] < 8);
    int64_t free_split[4];
    memcpy(free_split, cfg.parallel.chunk_layers.v, sizeof free_split);
    /* The budget: between the peak of stage 0 under the even split and the least peak of stage 0 with
     * one layer fewer. */
    DryRunMemory even0, less0;
    int64_t even[4] = {8, 8, 8, 8}, fewer[4] = {7, 9, 8, 8};
    assert_int_equal(trainer_stage_memory(&cfg, even, 0, &even0, &err), 0);
    assert_int_equal(trainer_stage_memory(&cfg, fewer, 0, &less0, &err), 0);
    assert_true(less0.peak < even0.peak);
    double budget = (less0.peak + even0.peak) / 2;
    config_free(&cfg);
    char gb[32];
    snprintf(gb, sizeof gb, "%.6f", budget / 1e9);
    char *tight = test_format(form, lengths, gb);
    make_config(&cfg, tight);
    assert_int_equal(trainer_stage_layers(&cfg, NULL, &fits, &err), 0);
    assert_true(fits);
    check_split(cfg.parallel.chunk_layers.v, 32, 4);
    assert_true(cfg.parallel.chunk_layers.v[0] <= 7);
    DryRunMemoryPlan mp;
    assert_int_equal(trainer_memory_plan(&cfg, &mp, &err), 0);
    for (int s = 0; s < 4; s++)
        assert_true(mp.stages[s].peak <= budget);
    trainer_memory_free(&mp);
    config_free(&cfg);
    free(tight);
    /* Far too little: no split fits; placed for time alone (the memory check then refuses it). */
    tight = test_format(form, lengths, "1");
    make_config(&cfg, tight);
    assert_int_equal(trainer_stage_layers(&cfg, NULL, &fits, &err), 0);
    assert_false(fits);
    assert_memory_equal(cfg.parallel.chunk_layers.v, free_split, sizeof free_split);
    config_free(&cfg);
    free(tight);
    /* even and a list are config_resolve's: nothing to place. */
    char *listed = test_format("%s", yaml);
    char *at = strstr(listed, "auto");
    memcpy(at, "even", 4);
    make_config(&cfg, listed);
    assert_int_equal(trainer_stage_layers(&cfg, NULL, NULL, &err), 0);
    assert_int_equal(cfg.parallel.chunk_layers.v[3], 8);
    config_free(&cfg);
    free(listed);
    free(yaml);
    free(lengths);
    test_rm_rf(dir);
    free(dir);
}

/* The memory model holds cuDNN's attention buffers (engine/ops.h's ops_cudnn_buffers, what the CUDA
 * backend reserves at setup) wherever train.attention may run cuDNN - cudnn, and auto with a
 * non-deterministic backward - once, at the rank's heads (TP 2: 16 query and 4 kv heads of 128),
 * for the largest micro-batch's rows, with cudnn and train.deterministic the score-sized workspace
 * its deterministic backward may take; never with own or a deterministic auto. */
static void test_memory_cudnn_buffers(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *lengths = write_lengths(dir, 4000, 300);
    const char *form = "model: {preset: llama3.1-8b}\n"
                       "parallel: {tp: 2, pp: 2, dp: 1, stage_layers: even}\n"
                       "data: {lengths_file: %s, context_window: 8192, global_batch_tokens: 32768}\n"
                       "balance: {max_tokens_per_micro_batch: 8192}\n"
                       "train: {device: cuda, precision: bf16, attention: %s, deterministic: %s}\n";
    /* attention, deterministic, which buffers: 0 none, 1 cuDNN's, 2 with its deterministic backward's */
    const char *modes[5][3] = {{"own", "false", "0"}, {"cudnn", "false", "1"}, {"auto", "false", "1"},
                               {"auto", "true", "0"}, {"cudnn", "true", "2"}};
    int64_t grads, workspace, det_grads, det_workspace;
    ops_cudnn_buffers(8192, 16, 4, 128, 0, &grads, &workspace);
    ops_cudnn_buffers(8192, 16, 4, 128, 1, &det_grads, &det_workspace);
    assert_true(det_workspace == workspace + OPS_CUDNN_DP_WORKSPACE_MAX && det_grads == grads);
    double base[2] = {0, 0};
    for (int i = 0; i < 5; i++) {
        char *yaml = test_format(form, lengths, modes[i][0], modes[i][1]);
        Config cfg;
        Error err = {0};
        make_config(&cfg, yaml);
        DryRunMemoryPlan mp;
        assert_int_equal(trainer_memory_plan(&cfg, &mp, &err), 0);
        for (int s = 0; s < 2; s++) {
            if (i == 0)
                base[s] = mp.stages[s].peak;
            double extra = mp.stages[s].peak - base[s];
            printf("# attention %s, deterministic %s, stage %d: %+.3f GB\n", modes[i][0], modes[i][1], s, extra / 1e9);
            const double want = modes[i][2][0] == '1'   ? (double)(grads + workspace)
                                : modes[i][2][0] == '2' ? (double)(det_grads + det_workspace)
                                                        : 0;
            assert_true(fabs(extra - want) < 1.0);
        }
        trainer_memory_free(&mp);
        config_free(&cfg);
        free(yaml);
    }
    test_rm_rf(dir);
    free(dir);
    free(lengths);
}

/* The model of each chunk holds the layers of the split: [1, 3] at pp 2 puts layer 0 with the
 * embedding and layers 1..3 with the output layer (model_dims through trainer_chunk_parallel). */
static void test_chunk_models(void **state)
{
    (void)state;
    Config cfg;
    make_config(&cfg, "model: {preset: tiny}\nparallel: {pp: 2, tp: 2, dp: 1, stage_layers: [1, 3]}\n");
    ModelParallel first = trainer_chunk_parallel(&cfg, 1, 0, NULL), last = trainer_chunk_parallel(&cfg, 1, 1, NULL);
    ModelDims d0, d1, whole;
    model_dims(&d0, &cfg.model, &first);
    model_dims(&d1, &cfg.model, &last);
    model_dims(&whole, &cfg.model, NULL);
    assert_true(d0.layer_begin == 0 && d0.layer_end == 1 && d0.has_embed && !d0.has_head);
    assert_true(d1.layer_begin == 1 && d1.layer_end == 4 && !d1.has_embed && d1.has_head);
    assert_true(d0.tp_rank == 1 && d1.tp == 2);
    /* Parameters: the layers' blocks add up to the model's, the head's and embedding's aside. */
    int64_t n0 = model_param_count(&cfg.model, &first), n1 = model_param_count(&cfg.model, &last);
    int64_t embed = (int64_t)whole.vocab / 2 * whole.d, layer = (n0 - embed);
    assert_int_equal(n1 - 3 * layer, embed + whole.d); /* the output layer and the final norm */
    config_free(&cfg);
}

/* The memory model sizes each chunk by its own layers: a stage's weights and gradients depend on its
 * layers, not on how they are spread over its chunks - [5, 9, 10, 8] over 2 stages of 2 chunks
 * holds what [15, 17] over 2 stages of one does. */
static void test_memory_follows_split(void **state)
{
    (void)state;
    Config a, b;
    Error err = {0};
    make_config(&a, "model: {preset: llama3-8b}\nparallel: {tp: 2, pp: 2, virtual_stages: 2, dp: 1, "
                    "stage_layers: [5, 9, 10, 8]}\ndata: {global_batch_tokens: 32768}\n");
    make_config(&b, "model: {preset: llama3-8b}\nparallel: {tp: 2, pp: 2, dp: 1, stage_layers: [15, 17]}\n"
                    "data: {global_batch_tokens: 32768}\n");
    for (int s = 0; s < 2; s++) {
        DryRunMemory x, y;
        assert_int_equal(trainer_stage_memory(&a, a.parallel.chunk_layers.v, s, &x, &err), 0);
        assert_int_equal(trainer_stage_memory(&b, b.parallel.chunk_layers.v, s, &y, &err), 0);
        assert_true(x.weights == y.weights && x.grads == y.grads && x.optimizer == y.optimizer);
    }
    config_free(&a);
    config_free(&b);
}

/* The simulator's per-chunk times follow the split: chunk g's layers times the per-layer forward
 * and backward (the backward with the forward again under full recomputation, the norms and
 * SwiGLU under selective), the embedding on chunk 0, the output layer on the last; and a stage's
 * busy time over a step (sched_stage_busy) is the sum over its chunks. */
static void test_simulator_follows_split(void **state)
{
    (void)state;
    static const char *const modes[] = {"none", "selective", "full"};
    for (int r = 0; r <= 2; r++) {
        Config cfg;
        CostModel cost;
        Error err = {0};
        char *yaml = test_format("model: {preset: llama3-8b}\nparallel: {tp: 2, pp: 2, virtual_stages: 2, dp: 1, "
                                 "stage_layers: [5, 9, 10, 8]}\ntrain: {recompute: %s}\n", modes[r]);
        make_config(&cfg, yaml);
        assert_int_equal(cost_model_init(&cost, &cfg, &err), 0);
        StepPlan p = {0};
        plan_reset(&p, 0, 1, 1, 1);
        assert_non_null(p.mbs);
        int64_t rank = plan_add_rank(&p);
        assert_true(rank == 0);
        p.ranks[0].tokens = 4096;
        p.mbs[0].first_rank = 0;
        p.mbs[0].tokens = 4096;
        p.mbs[0].fwd_s = 0.01;
        p.mbs[0].bwd_s = 0.02;
        double fwd[4], bwd[4], p2p, busy[2] = {0, 0};
        sched_micro_batch_times(&p, &p.mbs[0], &cost, fwd, bwd, &p2p);
        const int layers[4] = {5, 9, 10, 8};
        /* The micro-batch's bwd_s holds train.recompute's work already (the cost model's): the
         * simulator adds nothing for it. */
        for (int g = 0; g < 4; g++) {
            double f = layers[g] * 0.01, b = layers[g] * 0.02;
            if (g == 0) {
                f += cost_embed_fwd_s(&cost, 4096);
                b += cost_embed_bwd_s(&cost, 4096);
            }
            if (g == 3) {
                f += cost_head_fwd_s(&cost, 4096);
                b += cost_head_bwd_s(&cost, 4096);
            }
            assert_true(fabs(fwd[g] - f) <= 1e-12 && fabs(bwd[g] - b) <= 1e-12);
        }
        assert_true(p2p == cost_p2p_s(&cost, 4096));
        assert_int_equal(sched_stage_busy(&p, &cost, busy, &err), 0);
        assert_true(fabs(busy[0] - (fwd[0] + bwd[0] + fwd[2] + bwd[2])) <= 1e-12);
        assert_true(fabs(busy[1] - (fwd[1] + bwd[1] + fwd[3] + bwd[3])) <= 1e-12);
        plan_free(&p);
        config_free(&cfg);
        free(yaml);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_is_exact),
        cmocka_unit_test(test_auto_first_last_rule),
        cmocka_unit_test(test_auto_step_check),
        cmocka_unit_test(test_auto_interleaved_output_layer),
        cmocka_unit_test(test_typical_costs),
        cmocka_unit_test(test_trainer_placement),
        cmocka_unit_test(test_chunk_models),
        cmocka_unit_test(test_memory_follows_split),
        cmocka_unit_test(test_memory_cudnn_buffers),
        cmocka_unit_test(test_simulator_follows_split),
    };
    return cmocka_run_group_tests_name("stages", tests, NULL, NULL);
}
