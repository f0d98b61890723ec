/*
 * test/test_sched.c - the pipeline simulator against the textbook makespans of 1F1B and interleaved
 * 1F1B, its response to one slow micro-batch, and its monotony: with the order fixed, no shorter
 * operation makes the makespan longer (the CP sharding compares layouts on their micro-batch times
 * on that ground); every stage's warm-up at 1F1B's bound (how many micro-batches it holds in
 * flight, what the memory model reserves), with and without interleaving; messages with receives
 * posted ahead against received on demand (parallel.overlap), and ZeRO-1's all-gather ahead of the
 * first forwards.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/sched.h"
#include "engine/train/train_memory.h"
#include "util/rng.h"

static double uniform(int pp, int v, int n_mb, double f, double b, double hop)
{
    int chunks = pp * v;
    double *fwd = malloc(sizeof(double) * (size_t)(n_mb * chunks));
    double *bwd = malloc(sizeof(double) * (size_t)(n_mb * chunks));
    double *p2p = malloc(sizeof(double) * (size_t)n_mb);
    for (int i = 0; i < n_mb * chunks; i++) {
        fwd[i] = f / v;
        bwd[i] = b / v;
    }
    for (int i = 0; i < n_mb; i++)
        p2p[i] = hop;
    SchedReplica r = {pp, v, n_mb, fwd, bwd, p2p, 0, NULL};
    double t;
    Error err = {0};
    if (sched_makespan(&r, &t, &err) != 0)
        t = -err.status; /* -2: the schedule cannot run (bad input) */
    free(fwd);
    free(bwd);
    free(p2p);
    return t;
}

static void test_uniform_1f1b(void **state)
{
    (void)state;
    /* Equal micro-batches: (M + PP - 1) (f + b), the bubble being (PP - 1) (f + b). */
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 12; m++) {
            double t = uniform(pp, 1, m, 1.0, 2.0, 0);
            assert_true(fabs(t - (m + pp - 1) * 3.0) < 1e-9);
        }
    /* One micro-batch with a send time c between stages: its forward crosses the PP - 1 boundaries
     * one way and its backward the other, nothing overlaps: exactly PP (f + b) + 2 (PP - 1) c. */
    for (int pp = 1; pp <= 8; pp++) {
        double t1 = uniform(pp, 1, 1, 1.0, 2.0, 0.25), expect = pp * 3.0 + 2 * (pp - 1) * 0.25;
        if (fabs(t1 - expect) > 1e-9) {
            print_error("pp %d, one micro-batch, hops of 0.25: %g, expected %g\n", pp, t1, expect);
            fail();
        }
    }
    /* Sending between stages: the first forward and the last backward cross every boundary, so at
     * least 2 (PP - 1) hops are added; in the steady state a stage may also wait for a round trip. */
    double t = uniform(4, 1, 8, 1.0, 2.0, 0.1);
    assert_true(t >= (8 + 3) * 3.0 + 2 * 3 * 0.1 - 1e-9);
    assert_true(t <= (8 + 3) * 3.0 + 2 * 3 * 0.1 * 8 + 1e-9);
    assert_true(uniform(4, 1, 8, 1.0, 2.0, 0.2) > t);
}

static void test_uniform_interleaved(void **state)
{
    (void)state;
    /* Interleaved with v chunks: the bubble shrinks to (PP - 1) (f + b) / v. */
    for (int pp = 2; pp <= 4; pp++)
        for (int v = 2; v <= 3; v++)
            for (int m = pp; m <= 4 * pp; m += pp) {
                double t = uniform(pp, v, m, 1.0, 2.0, 0);
                double expect = m * 3.0 + (pp - 1) * 3.0 / v;
                if (fabs(t - expect) > 1e-9) {
                    print_error("pp %d v %d m %d: %g, expected %g\n", pp, v, m, t, expect);
                    fail();
                }
            }
    /* Interleaving needs the micro-batches in groups of pp: a bad-input error. */
    assert_true(uniform(4, 2, 6, 1, 2, 0) == -ERROR_INPUT);
}

static void test_one_slow_micro_batch(void **state)
{
    (void)state;
    /* PP 4, M 8, one micro-batch 3x as slow: the pipeline pays for it on every stage it crosses. */
    int pp = 4, m = 8;
    double fwd[32], bwd[32], p2p[8] = {0};
    for (int i = 0; i < m * pp; i++) {
        fwd[i] = 1;
        bwd[i] = 2;
    }
    SchedReplica r = {pp, 1, m, fwd, bwd, p2p, 0, NULL};
    double base, slow, all;
    Error err = {0};
    assert_int_equal(sched_makespan(&r, &base, &err), 0);
    for (int s = 0; s < pp; s++) {
        fwd[3 * pp + s] = 3;
        bwd[3 * pp + s] = 6;
    }
    assert_int_equal(sched_makespan(&r, &slow, &err), 0);
    /* At least the extra work of one stage, at most the extra work on every stage in sequence. */
    assert_true(slow >= base + 6 - 1e-9);
    assert_true(slow <= base + 6 * pp + 1e-9);
    /* PP 1: the makespan is the sum of the work. */
    SchedReplica one = {1, 1, 8, fwd, bwd, p2p, 0, NULL};
    double sum = 0;
    for (int i = 0; i < 8; i++)
        sum += fwd[i] + bwd[i];
    assert_int_equal(sched_makespan(&one, &all, &err), 0);
    assert_true(fabs(all - sum) < 1e-9);
}

static void test_monotone_in_durations(void **state)
{
    (void)state;
    /* Random replicas (PP 1-6, 1-2 virtual stages, 1-12 micro-batches, uneven operations and sends);
     * shortening any operations or sends, the order fixed, never lengthens the makespan: every
     * operation starts when the ones it waits for have ended, none of which got longer. */
    Rng rng;
    rng_seed(&rng, 7);
    Error err = {0};
    int ran = 0;
    for (int trial = 0; trial < 400; trial++) {
        int pp = 1 + (int)rng_below(&rng, 6), v = 1 + (int)rng_below(&rng, 2);
        int m = 1 + (int)rng_below(&rng, 12);
        if (v > 1 && m % pp)
            m = pp * (1 + (int)rng_below(&rng, 3)); /* interleaving needs whole rounds */
        int n = m * pp * v;
        double fwd[300], bwd[300], p2p[40];
        for (int i = 0; i < n; i++) {
            fwd[i] = 0.5 + rng_uniform(&rng);
            bwd[i] = 1.0 + 2 * rng_uniform(&rng);
        }
        for (int i = 0; i < m; i++)
            p2p[i] = 0.2 * rng_uniform(&rng);
        SchedReplica r = {pp, v, m, fwd, bwd, p2p, 0, NULL};
        double before, after;
        int rc = sched_makespan(&r, &before, &err);
        if (rc != 0)
            continue; /* a layout the simulator refuses */
        for (int i = 0; i < n; i++) {
            if (rng_below(&rng, 3) == 0)
                fwd[i] *= rng_uniform(&rng);
            if (rng_below(&rng, 3) == 0)
                bwd[i] *= rng_uniform(&rng);
        }
        for (int i = 0; i < m; i++)
            if (rng_below(&rng, 3) == 0)
                p2p[i] *= rng_uniform(&rng);
        assert_int_equal(sched_makespan(&r, &after, &err), 0);
        ran++;
        if (after > before * (1 + 1e-12)) {
            print_error("trial %d (pp %d, v %d, m %d): %.17g after shortening, %.17g before\n", trial, pp, v, m,
                        after, before);
            fail();
        }
    }
    assert_true(ran >= 300); /* the simulator took most layouts */
}

/* 1F1B's warm-up, against its bound counted here from the passes: stage s of pp runs
 * min(pp - s, M) forwards before its first backward (pp - s - 1 to fill the pipeline, then the
 * steady state's first), so it never holds more than pp - s micro-batches; interleaved with v
 * chunks, Megatron's table: 2 (pp - s - 1) + (v - 1) pp + 1 chunk forwards, at most M v. Every
 * pass of the stage runs once, each backward after its forward, and the most activations the stage
 * holds at once (what the memory model reserves, trainer_slots_in_flight over its chunks) is that
 * same count (interleaved, the chunks' slots together hold at least it). */
static void test_warmup_bound(void **state)
{
    (void)state;
    int cases = 0;
    for (int pp = 1; pp <= 8; pp++)
        for (int v = 1; v <= 3; v++)
            for (int m = 1; m <= 4 * pp; m++) {
                if (v > 1 && m % pp)
                    continue; /* interleaving takes micro-batches in groups of pp */
                int total = m * v;
                SchedOp *ops = malloc((size_t)(2 * total) * sizeof *ops);
                char *seen = malloc((size_t)(2 * total));
                assert_non_null(ops);
                assert_non_null(seen);
                for (int s = 0; s < pp; s++) {
                    int bound = v == 1 ? pp - s : 2 * (pp - s - 1) + (v - 1) * pp + 1;
                    if (bound > total)
                        bound = total;
                    assert_int_equal(sched_stage_ops(s, pp, v, m, ops), 2 * total);
                    memset(seen, 0, (size_t)(2 * total));
                    int before_first_b = -1, held = 0, most = 0;
                    for (int i = 0; i < 2 * total; i++) {
                        const SchedOp *o = &ops[i];
                        assert_true(o->mb >= 0 && o->mb < m && o->chunk >= 0 && o->chunk < v);
                        int at = (o->mb * v + o->chunk) * 2;
                        assert_int_equal(seen[at + o->backward], 0); /* each pass once */
                        if (o->backward)
                            assert_int_equal(seen[at], 1); /* its forward ran before */
                        seen[at + o->backward] = 1;
                        if (o->backward && before_first_b < 0)
                            before_first_b = i;
                        held += o->backward ? -1 : 1;
                        most = held > most ? held : most;
                    }
                    int slots = 0;
                    for (int k = 0; k < v; k++)
                        slots += trainer_slots_in_flight(ops, 2 * total, k);
                    if (before_first_b != bound || most != bound)
                        print_error("pp %d v %d m %d stage %d: %d forwards before the first backward, %d held at "
                                    "most; 1F1B's bound %d\n", pp, v, m, s, before_first_b, most, bound);
                    assert_int_equal(before_first_b, bound);
                    assert_int_equal(most, bound);
                    if (v == 1)
                        assert_int_equal(slots, bound);
                    else
                        assert_true(slots >= bound); /* the chunks' slots together hold the stage's most */
                    cases++;
                }
                free(ops);
                free(seen);
            }
    printf("# %d stages' schedules (pp 1-8, 1-3 chunks, up to 4 pp micro-batches) at 1F1B's warm-up bound\n", cases);
}

/* Two stages, two micro-batches of 1 s passes, 0.5 s hops. Posted ahead, stage 1's second forward
 * finds its input there when its first backward ends (sent at 2 s, arrived 2.5 s, it is busy until
 * 3.5 s): the hop hides. Received on demand, the hop starts at 3.5 s and shows: every hop's full
 * time waits. The trace counts each stage's hops, shown and hidden. */
static void test_messages_posted_or_on_demand(void **state)
{
    (void)state;
    double fwd[4] = {1, 1, 1, 1}, bwd[4] = {1, 1, 1, 1}, p2p[2] = {0.5, 0.5};
    double t_posted, t_demand, end[2], shown[2], hidden[2], wait[2], beside[2], lbs[2], lbe[2];
    SchedTrace tr = {.stage_end = end, .pp_exposed = shown, .pp_hidden = hidden, .gather_wait = wait,
                     .gather_beside = beside, .last_bwd_start = lbs, .last_bwd_end = lbe};
    Error err = {0};
    SchedReplica r = {2, 1, 2, fwd, bwd, p2p, 0, NULL};
    assert_int_equal(sched_simulate(&r, &t_posted, &tr, &err), 0);
    /* stage 0: F0 F1 .. B0 at 4 (stage 1's B0 ends 3.5, + 0.5) .. B1; stage 1: F0 1.5, B0, F1 3.5, B1. */
    assert_true(fabs(end[1] - 5.5) < 1e-12 && fabs(t_posted - 7) < 1e-12);
    assert_true(fabs(shown[1] - 0.5) < 1e-12 && fabs(hidden[1] - 0.5) < 1e-12);
    assert_true(fabs(shown[0] - 1.0) < 1e-12 && hidden[0] == 0);
    assert_true(fabs(lbs[0] - 6) < 1e-12 && fabs(lbe[0] - 7) < 1e-12 && fabs(lbe[1] - 5.5) < 1e-12);
    r.recv_on_demand = 1;
    assert_int_equal(sched_simulate(&r, &t_demand, &tr, &err), 0);
    assert_true(fabs(end[1] - 6) < 1e-12 && fabs(t_demand - 7.5) < 1e-12);
    assert_true(fabs(shown[1] - 1.0) < 1e-12 && hidden[1] == 0 && fabs(shown[0] - 1.0) < 1e-12);
}

/* ZeRO-1's all-gather: the chunk's first forward starts on its first bucket and its last layer (half
 * the pass here) runs after the last; what it waited shows, what ran beside the pass is counted. */
static void test_gather_ahead(void **state)
{
    (void)state;
    double fwd[2] = {1, 1}, bwd[2] = {1, 1}, p2p[2] = {0, 0};
    SchedGather g = {0.3, 0.9, 0.5};
    double t, end[1], shown[1], hidden[1], wait[1], beside[1];
    SchedTrace tr = {.stage_end = end, .pp_exposed = shown, .pp_hidden = hidden, .gather_wait = wait,
                     .gather_beside = beside};
    SchedReplica r = {1, 1, 2, fwd, bwd, p2p, 0, &g};
    Error err = {0};
    assert_int_equal(sched_simulate(&r, &t, &tr, &err), 0);
    /* F0 from 0.3 to max(1.3, 0.9 + 0.5), then B0, F1, B1. */
    assert_true(fabs(t - 4.4) < 1e-12 && fabs(wait[0] - 0.4) < 1e-12 && fabs(beside[0] - 0.6) < 1e-12);
    /* All of it before the step: the pass waits for the whole gather. */
    g = (SchedGather){2, 2, 0};
    assert_int_equal(sched_simulate(&r, &t, &tr, &err), 0);
    assert_true(fabs(t - 6) < 1e-12 && fabs(wait[0] - 2) < 1e-12 && beside[0] == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_1f1b),
        cmocka_unit_test(test_uniform_interleaved),
        cmocka_unit_test(test_one_slow_micro_batch),
        cmocka_unit_test(test_monotone_in_durations),
        cmocka_unit_test(test_warmup_bound),
        cmocka_unit_test(test_messages_posted_or_on_demand),
        cmocka_unit_test(test_gather_ahead),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
