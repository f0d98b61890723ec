/*
 * test/test_dryrun.c - the dry run as a user runs it: per-step lines, the stats file (every field
 * docs/planner.md names, each imbalance equal to its definition over the per-micro-batch and per-rank
 * costs printed beside it, a summary last that summarizes the steps), --compare, the attention work
 * and the speedup at equal work equal to their definitions under each long_documents rule, the balance the
 * docs/planner.md reports on the real length lists (wlb well below Plain-4D's pipeline imbalance, per_doc
 * even over the CP ranks), reading lengths from a Megatron .idx, a large cluster, the dry runs the
 * example configs' comments give (and the error that says how when their data is not here), entries
 * <= 0 of a length list skipped with a warning that says what, and the errors.
 */
#include "test/testlib.h"
#include "test/plan_checks.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_idx.h"

#define RUN(r, ...)                                \
    do {                                           \
        const char *args_[] = {__VA_ARGS__, NULL}; \
        test_run_wlbtrain(r, args_);               \
    } while (0)

/* Mostly short, every 37th long: outliers for a window of 4096. */
static int mixed_length(int i) { return i % 37 == 0 ? 2500 + i : 50 + (i * 97) % 700; }

/* A config whose lengths come from a small list written here. */
static char *write_config(const char *dir, const char *extra)
{
    char *lpath = test_write_lengths(dir, "lengths.json", 600, mixed_length);
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
    double sum_pp = 0, sum_cp = 0, max_pp = 0;
    const char *step_keys[] = {"step", "docs", "tokens", "queued", "mb_tokens", "pp_imbalance", "cp_imbalance",
                               "sharding", "predicted_ms", "baseline_ms", "speedup", "packer_ms", "long_documents",
                               "attn_pairs", "baseline_attn_pairs", "equal_work_baseline_ms", "speedup_equal_work"};
    const char *dist_keys[] = {"pp_imbalance", "cp_imbalance", "speedup", "packer_ms"};
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        assert_false(summary); /* the summary is the last line */
        if (json_object_get(o, "summary")) {
            summary = 1;
            assert_int_equal(json_integer_value(json_object_get(o, "steps")), 12);
            /* The summary summarizes the 12 step lines above it (values printed to 6 digits). */
            json_t *pp = json_object_get(o, "pp_imbalance"), *cp = json_object_get(o, "cp_imbalance");
            assert_true(fabs(json_number_value(json_object_get(pp, "mean")) - sum_pp / 12) < 1e-5);
            assert_true(fabs(json_number_value(json_object_get(pp, "max")) - max_pp) < 1e-5);
            assert_true(fabs(json_number_value(json_object_get(cp, "mean")) - sum_cp / 12) < 1e-5);
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
            /* 2 replicas x M 4 micro-batches. pp_imbalance: the costliest micro-batch x their
             * number / their total cost (mb_cost_ms, printed to 4 digits); wlb keeps it small on
             * this list (Plain-4D's is above 1.03, below). */
            json_t *costs = json_object_get(o, "mb_cost_ms");
            assert_int_equal(json_array_size(json_object_get(o, "mb_tokens")), 8);
            assert_int_equal(json_array_size(costs), 8);
            double worst = 0, total = 0;
            for (size_t i = 0; i < 8; i++) {
                double c = json_number_value(json_array_get(costs, i));
                worst = c > worst ? c : worst;
                total += c;
            }
            double pp = json_number_value(json_object_get(o, "pp_imbalance"));
            if (fabs(pp - worst * 8 / total) > 2e-3 || pp > 1.04) {
                print_error("step %d: pp_imbalance %g, from mb_cost_ms %g\n", steps, pp, worst * 8 / total);
                fail();
            }
            /* cp_imbalance: the slowest CP rank over their mean in the step's worst micro-batch,
             * whose ranks' compute cp_rank_ms gives under each mode (the chosen one: hybrid here). */
            json_t *ranks = json_object_get(json_object_get(o, "cp_rank_ms"), "hybrid");
            assert_int_equal(json_array_size(ranks), 2);
            double r0 = json_number_value(json_array_get(ranks, 0)), r1 = json_number_value(json_array_get(ranks, 1));
            double cp = json_number_value(json_object_get(o, "cp_imbalance"));
            if (fabs(cp - (r0 > r1 ? r0 : r1) * 2 / (r0 + r1)) > 2e-3) {
                print_error("step %d: cp_imbalance %g, from cp_rank_ms %g %g\n", steps, cp, r0, r1);
                fail();
            }
            sum_pp += pp;
            sum_cp += cp;
            max_pp = pp > max_pp ? pp : max_pp;
            /* per_doc's ranks of that micro-batch are even, up to the attention tile: the chunks
             * of these short documents are shorter than a tile (128) and round up differently. */
            json_t *per_doc = json_object_get(json_object_get(o, "cp_rank_ms"), "per_doc");
            double d0 = json_number_value(json_array_get(per_doc, 0)), d1 = json_number_value(json_array_get(per_doc, 1));
            assert_true(fabs(d0 - d1) <= 0.03 * (d0 + d1) / 2);
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
    const char *modes[] = {"per_seq", "per_doc", "adaptive", "hybrid", "groups"};
    int rows = 0;
    for (char *line = r.out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 5; b++)
                if (!strncmp(line, packers[a], strlen(packers[a])) && strstr(line, modes[b]) &&
                    strstr(line, modes[b]) < strchr(line, '\n'))
                    rows++;
    assert_int_equal(rows, 15);
    /* The rows' values: pp_imb p95 cp_imb tokens/s speedup, per packer and mode. */
    double pp[3][5], cp[3][5], speedup[3][5], pairs[3][5], x_eq[3][5];
    char docs[3][5][8];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 5; b++) {
            char head[64];
            snprintf(head, sizeof head, "\n%-13s %-8s", a == 0 ? "fixed" : a == 1 ? "fixed_greedy" : "wlb", modes[b]);
            const char *row = strstr(r.out, head);
            assert_non_null(row);
            double p95, tps, plan_ms, delay, cpt;
            assert_int_equal(sscanf(row + strlen(head), "%lf %lf %lf %lf %lfx %lf %lf %lf %7s %lf %lfx", &pp[a][b], &p95,
                                    &cp[a][b], &tps, &speedup[a][b], &plan_ms, &delay, &cpt, docs[a][b], &pairs[a][b],
                                    &x_eq[a][b]),
                             11);
            /* auto: the fixed packers cut documents at window ends, wlb keeps them whole */
            assert_string_equal(docs[a][b], a < 2 ? "cut" : "keep");
        }
    /* Plain-4D against itself; per_doc even over the CP ranks; per micro-batch adaptive takes the
     * faster of per_seq and per_doc, hybrid is never slower than any and groups never slower than
     * hybrid (the same documents: the packers do not look at the CP mode), so neither is their
     * throughput; wlb packs more evenly than fixed (3 decimals printed: by 0.005 here). */
    assert_true(speedup[0][0] == 1.0);
    /* Plain-4D of its own pieces is itself; the fixed packers train the same tokens of the stream
     * cut at the same window ends, and fixed_greedy may split a piece further (no window with room):
     * no more attention work per token (4 digits printed). The packers do not look at the CP mode. */
    assert_true(x_eq[0][0] == 1.0);
    assert_true(pairs[1][0] <= pairs[0][0] && pairs[1][0] > 0.99 * pairs[0][0]);
    for (int a = 0; a < 3; a++)
        for (int b = 1; b < 5; b++)
            assert_true(pairs[a][b] == pairs[a][0]);
    for (int a = 0; a < 3; a++) {
        assert_true(cp[a][1] <= 1.01);
        assert_true(speedup[a][2] >= fmax(speedup[a][0], speedup[a][1]) - 0.001);
        for (int b = 0; b < 3; b++)
            assert_true(speedup[a][3] >= speedup[a][b] - 0.001);
        assert_true(speedup[a][4] >= speedup[a][3] - 0.001);
    }
    assert_true(pp[2][1] < pp[0][1] - 0.004);
    test_cmd_free(&r);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

/* The attention work of n_tok tokens of documents of doc tokens each, laid end to end from stream
 * position first and cut at every multiple of window of that position: sum of d (d + 1) / 2 over the
 * pieces (a document is cut where a multiple of the window falls inside it). Written from the
 * definition: walk the pieces. */
static double cut_pairs(int64_t first, int64_t n_tok, int64_t doc, int64_t window)
{
    double pairs = 0;
    for (int64_t at = first; at < first + n_tok;) {
        int64_t doc_end = (at / doc + 1) * doc, win_end = (at / window + 1) * window, end = first + n_tok;
        end = doc_end < end ? doc_end : end;
        end = win_end < end ? win_end : end;
        pairs += (double)(end - at) * (double)(end - at + 1) / 2;
        at = end;
    }
    return pairs;
}

/* Reads the step lines and the summary of a stats file; returns the number of step lines. */
static int read_stats(const char *stats, json_t **steps, int max, json_t **summary)
{
    FILE *f = fopen(stats, "r");
    assert_non_null(f);
    char line[1 << 16];
    int n = 0;
    *summary = NULL;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        if (json_object_get(o, "summary"))
            *summary = o;
        else if (n < max)
            steps[n++] = o;
        else
            json_decref(o);
    }
    fclose(f);
    assert_non_null(*summary);
    return n;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        print_error("no %s\n", key);
        fail();
    }
    return json_number_value(v);
}

/* Attention work and the speedup at equal work, equal to their definitions. Documents of 3000 tokens,
 * window 4096, 8 windows a step, no outlier queues:
 *   fixed (cut by default): step s trains stream tokens [32768 s, 32768 (s + 1)) cut at every 4096:
 *     attn_pairs = cut_pairs of them; Plain-4D of its own pieces is itself (per_seq): speedup at
 *     equal work 1.
 *   fixed, keep: whole documents of 3000, one a window: attn_pairs = (tokens / 3000) x 3000 x 3001 / 2.
 *   wlb (keep by default): whole documents too; baseline_attn_pairs = Plain-4D's cut of the step's
 *     documents end to end (cut_pairs from 0).
 * Every step: speedup_equal_work = equal_work_baseline_ms / predicted_ms; the summary: pairs per step
 * the mean of the steps', equal_work_baseline_s their sum, throughput_speedup_equal_work its ratio to
 * predicted_s, and the stdout summary line says it. */
static void test_attention_work(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    char lengths[8192] = "[";
    for (int i = 0; i < 1000; i++)
        strcat(lengths, i ? ",3000" : "3000");
    strcat(lengths, "]");
    char *lpath = test_write_file(dir, "lengths.json", lengths, strlen(lengths));
    char *yaml = test_format("model: {preset: tiny}\nparallel: {tp: 1, cp: 2, pp: 2, dp: 2}\n"
                             "data: {lengths_file: %s, context_window: 4096, global_batch_tokens: 32768}\n"
                             "balance: {outlier_thresholds: [], cp_sharding: per_seq}\ntrain: {steps: 6}\n",
                             lpath);
    char *cfg = test_write_file(dir, "w.yaml", yaml, strlen(yaml)), *stats = test_format("%s/w.jsonl", dir);
    const char *runs[3][2] = {{"balance.packer=fixed", "balance.long_documents=auto"},
                              {"balance.packer=fixed", "balance.long_documents=keep"},
                              {"balance.packer=wlb", "balance.long_documents=auto"}};
    for (int run = 0; run < 3; run++) {
        CmdResult r;
        RUN(&r, "--config", cfg, "--dry-run", "--stats-out", stats, "--set", runs[run][0], "--set", runs[run][1]);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "summary: attention work "));
        assert_non_null(strstr(r.out, run == 0 ? "(documents cut at window ends)" : "(documents kept whole at window ends)"));
        test_cmd_free(&r);
        json_t *steps[6], *sum;
        assert_int_equal(read_stats(stats, steps, 6, &sum), 6);
        double pairs_sum = 0, equal_ms = 0;
        for (int i = 0; i < 6; i++) {
            json_t *o = steps[i];
            double tokens = num(o, "tokens"), pairs = num(o, "attn_pairs"), base = num(o, "baseline_attn_pairs");
            double want = run == 0 ? cut_pairs(32768 * (int64_t)i, 32768, 3000, 4096) : tokens / 3000 * 3000.0 * 3001 / 2;
            if (pairs != want) {
                print_error("%s %s step %d: attn_pairs %.17g, expected %.17g\n", runs[run][0], runs[run][1], i + 1,
                            pairs, want);
                fail();
            }
            assert_true(tokens == (run == 0 ? 32768 : tokens));
            assert_string_equal(json_string_value(json_object_get(o, "long_documents")), run == 0 ? "cut" : "keep");
            if (run == 2)
                assert_true(base == cut_pairs(0, (int64_t)tokens, 3000, 4096) && base < pairs);
            double eq = num(o, "equal_work_baseline_ms"), pred = num(o, "predicted_ms"), x = num(o, "speedup_equal_work");
            assert_true(fabs(x - eq / pred) <= 1e-5 * x);
            if (run == 0)
                assert_true(fabs(x - 1) < 1e-5 && base == pairs);
            pairs_sum += pairs;
            equal_ms += eq;
            json_decref(o);
        }
        assert_true(fabs(num(sum, "attn_pairs_per_step") - pairs_sum / 6) <= 1e-5 * pairs_sum / 6);
        double tok = num(sum, "tokens");
        assert_true(fabs(num(sum, "attn_pairs_per_token") - pairs_sum / tok) <= 1e-5 * pairs_sum / tok);
        assert_true(fabs(num(sum, "equal_work_baseline_s") - equal_ms / 1e3) <= 1e-4 * equal_ms / 1e3);
        double tx = num(sum, "throughput_speedup_equal_work");
        assert_true(fabs(tx - num(sum, "equal_work_baseline_s") / num(sum, "predicted_s")) <= 1e-5 * tx);
        assert_non_null(json_object_get(sum, "speedup_equal_work"));
        json_decref(sum);
    }
    free(cfg);
    free(stats);
    free(yaml);
    free(lpath);
    test_rm_rf(dir);
    free(dir);
}

/* The balance docs/planner.md reports, on the real length lists, at WLB-LLM's 7B-128K layout (TP 8, CP 2,
 * PP 4, DP 1, interleaved, H100 profile), 100 steps: the wlb packer's mean pp_imbalance is below 1.03
 * and at least 0.05 below the fixed packer's (Plain-4D's windows: 1.07 to 1.25 on these lists), and
 * per_doc sharding leaves the CP ranks even (mean cp_imbalance at most 1.001, every step at most
 * 1.005) under both packers; wlb + hybrid within the bounds (below). */
static double summary_value(const char *stats, const char *key, const char *stat)
{
    char *text = test_read_file(stats, NULL);
    assert_non_null(text);
    const char *last = strstr(text, "{\"summary\"");
    assert_non_null(last);
    json_error_t je;
    json_t *o = json_loads(last, 0, &je);
    assert_non_null(o);
    double v = json_number_value(json_object_get(json_object_get(o, key), stat));
    json_decref(o);
    free(text);
    return v;
}

static void test_balance_on_real_lists(void **state)
{
    (void)state;
    const char *lists[] = {"lengths/distca_wlbllm_lengths.json", "lengths/distca_prolong_lengths.json",
                           "lengths/flexsp_wikipedia_lengths.txt", "lengths/linux61_files_llama3_tokens.csv.gz"};
    /* Every list is looked for before anything is allocated: skip() leaves by longjmp (testlib.h). */
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        SKIP_WITHOUT_REAL_DATA(list, lists[i]);
        (void)list;
    }
    char *dir = test_tmpdir();
    const char *yaml = "model: {preset: llama2-7b, max_seq_len: 131072}\n"
                       "parallel: {tp: 8, cp: 2, pp: 4, dp: 1, virtual_stages: 2}\n"
                       "data: {context_window: 131072, global_batch_tokens: 524288}\n"
                       "balance: {cp_sharding: per_doc, hardware: h100-fa3}\n";
    /* The bounds below were set at the published rates (h100-fa3). Under the engine's profile (h100,
     * the default for train.device: cuda since issue 49) with every step at the configured batch
     * (issue 48), the WLB-LLM list's wlb + hybrid pp_imbalance is mean 1.022, p95 1.120 (1.012 and
     * 1.073 here): a step of exactly the batch leaves less ordinary fill to even the outliers' quadratic
     * cost, which the engine's slower attention weighs more (docs/planner.md, the batch kept). */
    char *cfg = test_write_file(dir, "7b-128k.yaml", yaml, strlen(yaml)), *stats = test_format("%s/s.jsonl", dir);
    /* ASan: the WLB-LLM list (the same code; the release build plans all four) */
    const size_t n_lists = TEST_SANITIZED ? 1 : sizeof lists / sizeof lists[0];
    for (size_t i = 0; i < n_lists; i++) {
        const char *list = test_real_data(lists[i]);
        assert_non_null(list);
        char *set = test_format("data.lengths_file=%s", list);
        double pp[2];
        const char *packers[2] = {"balance.packer=fixed", "balance.packer=wlb"};
        for (int k = 0; k < 2; k++) {
            CmdResult r;
            /* The WLB-LLM layout (at S_max 2 windows without recomputation its activations do not
             * fit even with sequence parallelism): the planner's figures only. */
            RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--steps", "100", "--set", set, "--set",
                packers[k], "--stats-out", stats);
            assert_int_equal(r.status, 0);
            test_cmd_free(&r);
            pp[k] = summary_value(stats, "pp_imbalance", "mean");
            double cp_mean = summary_value(stats, "cp_imbalance", "mean"), cp_max = summary_value(stats, "cp_imbalance", "max");
            /* No micro-batch over its cap: the window for fixed (padded to 2 CP: the window is a multiple),
             * S_max (the default, 2 windows) for wlb. */
            int64_t largest = check_stats_mb_cap(stats, k ? 262144 : 131072, NULL);
            printf("# %s, %s: pp_imbalance mean %.4f, cp_imbalance mean %.5f max %.5f, largest micro-batch %lld\n",
                   lists[i], packers[k] + 15, pp[k], cp_mean, cp_max, (long long)largest);
            assert_true(cp_mean <= 1.001 && cp_max <= 1.005);
        }
        assert_true(pp[1] <= 1.03);
        /* wlb removes most of fixed's excess over 1 (the TP traffic, exposed, is the same on every
         * micro-batch of equal tokens, so it narrows both). */
        assert_true(pp[1] - 1 <= 0.25 * (pp[0] - 1));
        /* The bounds for wlb + hybrid (the default outlier queues, whose last one takes the
         * window-size pieces of documents longer than the window), interleaved and not: mean
         * pp_imbalance at most 1.03 and its p95 at most 1.10, mean cp imbalance at most 1.01 (the
         * planning time is printed; tests do not time, bench/wlbllm_table1.sh does). 200 steps: on
         * the Linux list the bad steps of the old two queues (p95 1.13) come after step 100. The
         * CP bound is on the ranks' times (cp_time_imbalance): a rank's rows cost their exposed
         * all-gathers and reduce-scatters too, and the planner evens times, not attention + GEMMs
         * alone (cp_imbalance, printed). On the Linux list the bound is 1.011: the chained TP
         * forward (engine/model/model_chain.c) hides more of those collectives, the same in
         * seconds on both CP ranks, so the same residual of the documents' placement is a larger
         * share of what is left (1.0098 before it, 1.0103 with it; 1.0095 with tp_chunks 2, which
         * hides less). */
        for (int v = 2; v >= 1; v--) {
            char *vs = test_format("parallel.virtual_stages=%d", v);
            CmdResult r;
            RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--steps", "200", "--set", set, "--set",
                "balance.packer=wlb", "--set", "balance.cp_sharding=hybrid", "--set", vs, "--stats-out", stats);
            assert_int_equal(r.status, 0);
            test_cmd_free(&r);
            double mean = summary_value(stats, "pp_imbalance", "mean"), p95 = summary_value(stats, "pp_imbalance", "p95");
            double cp = summary_value(stats, "cp_time_imbalance", "mean"), ms = summary_value(stats, "packer_ms", "mean");
            double cp_compute = summary_value(stats, "cp_imbalance", "mean");
            printf("# %s, wlb + hybrid, v %d: pp_imbalance mean %.4f p95 %.4f, cp_time_imbalance mean %.4f "
                   "(cp_imbalance %.4f), plan %.3f ms\n", lists[i], v, mean, p95, cp, cp_compute, ms);
            assert_true(mean <= 1.03 && p95 <= 1.10 && cp <= (strstr(lists[i], "linux") ? 1.011 : 1.01));
            check_stats_mb_cap(stats, 262144, NULL);
            /* The batch kept (issue 48): 95% of the steps within 10% of it, none under 75%. */
            double off = summary_value(stats, "tokens_per_step", "off_10pct");
            double under = summary_value(stats, "tokens_per_step", "under_75pct");
            printf("# %s, wlb + hybrid, v %d: %.0f of 200 steps more than 10%% off the batch, %.0f under 75%%\n",
                   lists[i], v, off, under);
            assert_true(off <= 10 && under == 0);
            free(vs);
        }
        free(set);
    }
    free(stats);
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
    RUN(&r, "--config", cfg, "--dry-run", "--no-memory-check", "--steps", "2", "--set", "model.preset=llama3-405b",
        "--set", "parallel.tp=8", "--set", "parallel.cp=16", "--set", "parallel.pp=16", "--set", "parallel.dp=8",
        "--set", "data.context_window=131072", "--set", "data.global_batch_tokens=16777216");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "dry run: 16384 GPUs (tp 8, cp 16, pp 16, dp 8)"));
    assert_non_null(strstr(r.out, "DOES NOT FIT"));
    test_cmd_free(&r);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

/* The summary's memory object as numbers (bytes / 1e9), in the order of the keys below. */
static const char *const memory_keys[] = {"peak_gb", "weights_gb", "grads_gb", "optimizer_gb", "activations_gb",
                                          "other_gb"};
enum { N_MEMORY_KEYS = 6 };

static void read_memory(const char *stats, double *v)
{
    char *text = test_read_file(stats, NULL);
    assert_non_null(text);
    const char *last = strstr(text, "{\"summary\"");
    assert_non_null(last);
    json_t *o = json_loads(last, 0, NULL), *mem = o ? json_object_get(o, "memory") : NULL;
    assert_non_null(mem);
    for (int i = 0; i < N_MEMORY_KEYS; i++) {
        json_t *x = json_object_get(mem, memory_keys[i]);
        assert_true(json_is_number(x));
        v[i] = json_number_value(x);
    }
    json_decref(o);
    free(text);
}

/* The memory model in the dry run: the per-rank table, the summary's memory object (its parts sum
 * to the peak), what each key changes (recompute modes keep less, ZeRO-1 shards the moments over
 * DP x CP, S_max bounds the activations), and the refusal of a layout that does not fit, whose
 * suggested changes do fit. The figures themselves are checked against the allocations of real runs
 * in test_parallel_run.c. */
/* A dry run of 8B layer shapes (4 layers) at 32K windows on tp 2 x cp 2 x pp 2 (wlb, hybrid), h100,
 * with the given extra arguments (NULL-terminated); stats NULL: no stats file. */
static void dry_8b(CmdResult *r, const char *cfg, const char *stats, const char *const *extra)
{
    const char *argv[64] = {"--config", cfg, "--dry-run", "--steps", "2", "--set", "model.preset=llama3-8b", "--set",
                            "model.n_layers=4", "--set", "model.max_seq_len=32768", "--set",
                            "data.context_window=32768", "--set", "data.global_batch_tokens=262144", "--set",
                            "parallel.dp=1", "--set", "balance.hardware=h100", "--set", "train.device=cuda", "--set",
                            "parallel.stage_layers=even"};
    int k = 23;
    if (stats) {
        argv[k++] = "--stats-out";
        argv[k++] = stats;
    }
    for (int i = 0; extra[i]; i++)
        argv[k++] = extra[i];
    argv[k] = NULL;
    test_run_wlbtrain(r, argv);
}

/* The memory model in the dry run: the per-rank table, the summary's memory object (its parts sum
 * to the peak), what each key changes (recompute modes keep less, ZeRO-1 shards the moments over
 * DP x CP, S_max bounds the activations), and the refusal of a layout that does not fit, whose
 * suggested change does fit. The figures themselves are checked against the allocations of real
 * runs in test_parallel_run.c. */
static void test_memory_model(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *stats = test_format("%s/s.jsonl", dir);
    char *cfg = write_config(dir, "");
    CmdResult r;
    double base[N_MEMORY_KEYS], v[N_MEMORY_KEYS];
    dry_8b(&r, cfg, stats, (const char *[]){"--set", "train.gpu_memory_gb=1000", NULL});
    if (r.status != 0)
        print_error("%s\n", r.err);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "memory per rank, GB (train.recompute: none;"));
    assert_non_null(strstr(r.out, " stage  layers   weights      bf16     grads  optimizer  activations in_flight"));
    assert_non_null(strstr(r.out, "\n     0       2 ")); /* 4 layers, 2 a stage */
    assert_non_null(strstr(r.out, "of 1000.0 GB: fits"));
    test_cmd_free(&r);
    read_memory(stats, base);
    double sum = 0;
    for (int i = 1; i < N_MEMORY_KEYS; i++)
        sum += base[i];
    assert_true(fabs(sum - base[0]) <= 1e-3 * base[0]);
    /* Weights are float32 + their bf16 copy (6 bytes a parameter), gradients 4, moments 8. */
    assert_true(base[1] > 0 && fabs(base[2] - base[1] * 4 / 6) <= 1e-3 * base[2]);
    assert_true(fabs(base[3] - 2 * base[2]) <= 1e-3 * base[3]);
    dry_8b(&r, cfg, stats, (const char *[]){"--set", "train.gpu_memory_gb=1000", "--set", "train.recompute=selective",
                                            NULL});
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    read_memory(stats, v);
    double selective = v[4];
    assert_true(selective < base[4] && v[1] == base[1] && v[3] == base[3]);
    dry_8b(&r, cfg, stats, (const char *[]){"--set", "train.gpu_memory_gb=1000", "--set", "train.recompute=full", NULL});
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    read_memory(stats, v);
    assert_true(v[4] < 0.8 * selective); /* of the worst rank; 2 layers a stage: one layer's scratch weighs */
    /* ZeRO-1 over DP x CP = 2: the moments halve (plus the gradient shard). */
    dry_8b(&r, cfg, stats, (const char *[]){"--set", "train.gpu_memory_gb=1000", "--set", "parallel.zero=1", NULL});
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    read_memory(stats, v);
    assert_true(v[3] < 0.8 * base[3] && v[3] > 0.5 * base[3] && v[4] == base[4]);
    /* Half the S_max: activations about half. */
    dry_8b(&r, cfg, stats, (const char *[]){"--set", "train.gpu_memory_gb=1000", "--set",
                                            "balance.max_tokens_per_micro_batch=32768", NULL});
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    read_memory(stats, v);
    assert_true(v[4] < 0.6 * base[4] && v[4] > 0.4 * base[4] && v[1] == base[1]);
    /* Too little memory: one line, exit 2, the stats file left as it was; the suggested change fits
     * with the peak it promised. */
    double budget = 0.8 * base[0];
    char set_budget[64];
    snprintf(set_budget, sizeof set_budget, "train.gpu_memory_gb=%.3f", budget);
    free(test_write_file(dir, "s.jsonl", "old\n", 4));
    dry_8b(&r, cfg, stats, (const char *[]){"--set", set_budget, NULL});
    assert_int_equal(r.status, 2);
    const char *line = strstr(r.err, "wlbtrain: error: train.gpu_memory_gb: the layout needs ");
    assert_non_null(line);
    assert_non_null(strstr(line, " GB budget; each of these alone would fit: "));
    assert_true(strchr(line, '\n') == NULL || strchr(line, '\n')[1] == '\0');
    char *kept = test_read_file(stats, NULL);
    assert_string_equal(kept, "old\n");
    free(kept);
    const char *fix = strstr(line, "train.recompute: full (");
    assert_non_null(fix);
    double promised = strtod(fix + strlen("train.recompute: full ("), NULL);
    test_cmd_free(&r);
    dry_8b(&r, cfg, stats, (const char *[]){"--set", set_budget, "--set", "train.recompute=full", NULL});
    assert_int_equal(r.status, 0);
    test_cmd_free(&r);
    read_memory(stats, v);
    assert_true(v[0] <= budget && fabs(v[0] - promised) <= 0.06);
    /* Without sequence parallelism the stream's rows are on every TP rank: in the budget the layout
     * fits with it, turning it back on is among the changes that fit. */
    char sp_budget[64];
    snprintf(sp_budget, sizeof sp_budget, "train.gpu_memory_gb=%.3f", 1.001 * base[0]);
    dry_8b(&r, cfg, NULL, (const char *[]){"--set", sp_budget, "--set", "parallel.sequence_parallel=false", NULL});
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "parallel.sequence_parallel: true ("));
    test_cmd_free(&r);
    /* --no-memory-check plans it anyway and says so. */
    dry_8b(&r, cfg, NULL, (const char *[]){"--no-memory-check", "--set", set_budget, NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "DOES NOT FIT"));
    test_cmd_free(&r);
    free(stats);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

/* The summary's number at key, and its array at akey (up to n values; returns how many). */
static double summary_number(const char *stats, const char *key, const char *akey, double *a, int n, int *count)
{
    char *text = test_read_file(stats, NULL);
    assert_non_null(text);
    json_t *o = json_loads(strstr(text, "{\"summary\""), 0, NULL);
    assert_non_null(o);
    json_t *x = json_object_get(o, key), *arr = json_object_get(o, akey);
    assert_true(json_is_number(x) && json_is_array(arr));
    double v = json_number_value(x);
    *count = (int)json_array_size(arr);
    for (int i = 0; i < *count && i < n; i++)
        a[i] = json_number_value(json_array_get(arr, (size_t)i));
    json_decref(o);
    free(text);
    return v;
}

/* parallel.stage_layers in the dry run: Llama 3 8B's vocabulary at 8K windows of short documents,
 * pp 4 - the output layer weighs about two layers. The stages line and the memory table show the
 * split; the summary's slowest-stage share is its definition over the stages' busy times; auto
 * takes layers off the last stage and predicts a faster step than even, with a smaller share for
 * the slowest stage. */
static void test_stage_balance(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir, ""), *stats = test_format("%s/s.jsonl", dir);
    double predicted[2], share[2];
    for (int a = 0; a < 2; a++) {
        CmdResult r;
        RUN(&r, "--config", cfg, "--dry-run", "--steps", "6", "--stats-out", stats, "--set", "model.preset=llama3-8b",
            "--set", "model.max_seq_len=8192", "--set", "data.context_window=8192", "--set", "parallel.tp=2",
            "--set", "parallel.cp=1", "--set", "parallel.pp=4", "--set", "parallel.dp=1", "--set",
            "data.global_batch_tokens=65536", "--set", a ? "parallel.stage_layers=auto" : "parallel.stage_layers=even");
        if (r.status != 0)
            print_error("%s\n", r.err);
        assert_int_equal(r.status, 0);
        const char *line = strstr(r.out, "stages: layers per stage [");
        assert_non_null(line);
        assert_non_null(strstr(line, a ? "(parallel.stage_layers: auto)" : "[8, 8, 8, 8] (parallel.stage_layers: even)"));
        assert_non_null(strstr(r.out, "summary: stages busy "));
        double busy[4], layers[4], total = 0, most = 0;
        int n;
        share[a] = summary_number(stats, "slowest_stage_share", "stage_busy_s", busy, 4, &n);
        assert_int_equal(n, 4);
        for (int s = 0; s < 4; s++) {
            total += busy[s];
            most = busy[s] > most ? busy[s] : most;
        }
        assert_true(fabs(share[a] - most / total) <= 1e-5 * share[a]);
        predicted[a] = summary_number(stats, "predicted_s", "stage_layers", layers, 4, &n);
        assert_int_equal(n, 4);
        char table[64];
        snprintf(table, sizeof table, "\n     3 %7.0f ", layers[3]);
        assert_non_null(strstr(r.out, table));
        assert_true(layers[0] + layers[1] + layers[2] + layers[3] == 32);
        if (a)
            assert_true(layers[3] < 8);
        printf("# %s: layers %g, %g, %g, %g; predicted %.4f s; slowest stage %.1f%% of the stages' time\n",
               a ? "auto" : "even", layers[0], layers[1], layers[2], layers[3], predicted[a], 100 * share[a]);
        test_cmd_free(&r);
    }
    assert_true(predicted[1] < predicted[0] && share[1] < share[0]);
    free(stats);
    free(cfg);
    test_rm_rf(dir);
    free(dir);
}

/* The example configs users start from fit the memory of their GPUs by the memory model, and plan. */
static void test_examples_fit(void **state)
{
    (void)state;
    SKIP_WITHOUT_REAL_DATA(list, "lengths/distca_wlbllm_lengths.json");
    char *set = test_format("data.lengths_file=%s", list);
    const char *configs[] = {"config/examples/llama8b.yaml", "config/examples/llama70b.yaml",
                             "config/examples/llama70b-128k.yaml", "config/examples/llama3-8b-8gpu.yaml",
                             "config/examples/llama8b-wlbllm.yaml"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        CmdResult r;
        /* dp as written; llama3-8b-8gpu.yaml's auto (a launch's) as one node */
        RUN(&r, "--config", configs[i], "--dry-run", "--steps", "2", "--set", "data.path=", "--set", "data.weights=",
            "--set", set, "--set", i == 3 ? "parallel.dp=1" : "log.every=1");
        if (r.status != 0)
            print_error("%s: %s\n", configs[i], r.err);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, " of 80.0 GB: fits, "));
        /* The headline jobs at the paper's S_max of 2 windows (sequence parallelism makes room). */
        const char *mb = strstr(r.out, "largest micro-batch "), *window = strstr(r.out, "window ");
        assert_non_null(mb);
        assert_non_null(window);
        if (i != 3)
            assert_true(strtoll(mb + strlen("largest micro-batch "), NULL, 10) ==
                        2 * strtoll(window + strlen("window "), NULL, 10));
        test_cmd_free(&r);
    }
    free(set);
}

/* The dry-run commands in the example configs' comments run as written (with the real data where
 * WLB_REAL_DATA says, and 2 steps); typed without their --set lines, the error says how. */
static void test_example_commands(void **state)
{
    (void)state;
    SKIP_WITHOUT_REAL_DATA(real, "lengths");
    char real_root[4096];
    snprintf(real_root, sizeof real_root, "%.*s", (int)(strlen(real) - strlen("/lengths")), real);
    const char *configs[] = {"config/examples/llama8b.yaml", "config/examples/llama70b-128k.yaml",
                             "config/examples/llama8b-wlbllm.yaml"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        char *text = test_read_file(configs[i], NULL), *words[64], *command = NULL;
        int n = 0;
        /* The comment lines "#   ./wlbtrain ... --dry-run \" and the lines they continue on. */
        for (char *line = strtok(text, "\n"); line && line[0] == '#'; line = strtok(NULL, "\n")) {
            char *at = line + strspn(line, "# ");
            if (!command && strncmp(at, "./wlbtrain ", 11) == 0 && strstr(at, "--dry-run"))
                command = at;
            else if (!command)
                continue;
            int more = line[strlen(line) - 1] == '\\';
            for (char *w = strtok_r(at, " \\", &at); w && n < 60; w = strtok_r(NULL, " \\", &at))
                words[n++] = !strncmp(w, "data.lengths_file=../shared/real-data/", 38)
                                 ? test_format("data.lengths_file=%s/%s", real_root, w + 38)
                                 : test_format("%s", w);
            if (!more)
                break;
        }
        assert_non_null(command);
        assert_string_equal(words[0], "./wlbtrain");
        words[n++] = test_format("--steps");
        words[n++] = test_format("2");
        words[n] = NULL;
        CmdResult r;
        test_run_wlbtrain(&r, (const char *const *)words + 1);
        if (r.status != 0)
            print_error("%s: the comment's dry run: %s\n", configs[i], r.err);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "summary: "));
        printf("# %s: the comment's dry run (%d words, --steps 2 added) ran\n", configs[i], n);
        test_cmd_free(&r);
        /* Without its --set lines: the data path is not here, and the error says what a dry run needs. */
        RUN(&r, "--config", configs[i], "--dry-run", "--steps", "2");
        test_assert_error(&r, ".idx: cannot open: No such file or directory (a dry run needs only document lengths: "
                              "--set data.lengths_file=FILE --set data.path=)");
        test_cmd_free(&r);
        for (int k = 0; k < n; k++)
            free(words[k]);
        free(text);
    }
}

/* Entries <= 0 of a length list are skipped and said: how many, negative and zero, the first; a list
 * whose skipped entries are all zeros is said too. */
static void test_skipped_lengths(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *cfg = write_config(dir, "");
    const char *list = "300\n-3\n1200\n0\n800\n0\n";
    char *lengths = test_write_file(dir, "l.txt", list, strlen(list)), *set = test_format("data.lengths_file=%s", lengths);
    CmdResult r;
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "1", "--set", set);
    assert_int_equal(r.status, 0);
    char *want = test_format("wlbtrain: warning: %s: 3 of 6 entries skipped, lengths <= 0 (1 negative, 2 zero; the "
                             "first, -3, at line 2)\n", lengths);
    assert_string_equal(r.err, want);
    char *data = test_format("data: %s, 3 documents, 2300 tokens\n", lengths);
    assert_non_null(strstr(r.out, data));
    test_cmd_free(&r);
    /* Zeros alone (real lists have them without any negative entry) are said the same way. */
    const char *zeros = "300\n0\n1200\n800\n0\n";
    char *zlist = test_write_file(dir, "z.txt", zeros, strlen(zeros)), *zset = test_format("data.lengths_file=%s", zlist);
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "1", "--set", zset);
    assert_int_equal(r.status, 0);
    char *zwant = test_format("wlbtrain: warning: %s: 2 of 5 entries skipped, lengths <= 0 (0 negative, 2 zero; the "
                              "first, 0, at line 2)\n", zlist);
    assert_string_equal(r.err, zwant);
    test_cmd_free(&r);
    free(zwant);
    free(zset);
    free(zlist);
    /* A list with nothing to skip says nothing. */
    RUN(&r, "--config", cfg, "--dry-run", "--steps", "1");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    test_cmd_free(&r);
    free(data);
    free(want);
    free(set);
    free(lengths);
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
        cmocka_unit_test(test_attention_work),
        cmocka_unit_test(test_balance_on_real_lists),
        cmocka_unit_test(test_lengths_from_idx),
        cmocka_unit_test(test_large_cluster),
        cmocka_unit_test(test_memory_model),
        cmocka_unit_test(test_stage_balance),
        cmocka_unit_test(test_examples_fit),
        cmocka_unit_test(test_example_commands),
        cmocka_unit_test(test_skipped_lengths),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("dryrun", tests, NULL, NULL);
}
