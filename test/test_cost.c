/*
 * test/test_cost.c - the cost model: FLOP counts against their closed forms, attention growing with
 * the square of the document length and the rest linearly, communication terms, what recomputation
 * adds to the backward, calibration files.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/plan/cost.h"
#include "util/wavefront.h"

/* A resolved config from YAML; the layers split evenly unless the YAML says otherwise (auto is the
 * engine's to place, trainer_stage_layers). The formulas are checked against the published H100
 * rates (balance.hardware h100-fa3: the numbers of engine/plan/cost.c) unless the YAML names
 * another profile; test_engine_profiles checks the engine's. */
static void make_config(Config *cfg, const char *yaml)
{
    Error err = {0};
    config_init(cfg);
    if (config_apply_set(cfg, "parallel.stage_layers=even", &err) != 0 ||
        config_apply_set(cfg, "balance.hardware=h100-fa3", &err) != 0 ||
        config_load_string(cfg, yaml, "t.yaml", &err) != 0 || config_resolve(cfg, 0, &err) != 0) {
        print_error("%s\n", err.msg);
        fail();
    }
}

static void make_model(CostModel *m, const char *yaml)
{
    Config cfg;
    Error err = {0};
    make_config(&cfg, yaml);
    assert_int_equal(cost_model_init(m, &cfg, &err), 0);
    config_free(&cfg);
}

static void test_flop_closed_forms(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 8, dp: 1}\n");
    /* Llama 3 8B: d 4096, 32 heads of 128, 8 kv heads, ffn 14336, vocab 128256; TP 8. */
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.local_heads, 4);
    assert_int_equal(m.local_kv_heads, 1);
    double d = 4096, f = 14336.0 / 8;
    double expect = 2 * d * 128 * (4 + 4) /* q + o */ + 2 * d * 128 * 2 * 1 /* k, v */ + 3 * 2 * d * f;
    assert_true(fabs(m.gemm_flops_fwd - expect) < 1e-6 * expect);
    assert_true(m.head_flops_fwd == 2 * d * 128256.0 / 8);
    /* K and V of one local kv head: gathered in bf16, their gradients reduce-scattered in float32 */
    assert_true(m.kv_bytes == 2 * 1 * 128 * (2 + 4) / 2);

    /* Pairs of a segment: query i sees kv_len - q_len + i + 1 keys. With a tile of 1 it is exact. */
    make_model(&m, "model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {attn_tile: 1}\n");
    for (int64_t q = 1; q < 300; q += 37)
        for (int64_t off = 0; off < 500; off += 123) {
            double brute = 0;
            for (int64_t i = 0; i < q; i++)
                brute += (double)(off + i + 1);
            assert_true(cost_attn_pairs(&m, q, q + off) == brute);
        }
    /* With the default tile of 128 a short chunk costs a full tile. */
    make_model(&m, "model: {preset: tiny}\nparallel: {dp: 1}\n");
    assert_int_equal(m.hw.attn_tile, 128);
    assert_true(cost_attn_pairs(&m, 5, 5) == cost_attn_pairs(&m, 128, 128));
    assert_true(cost_attn_pairs(&m, 129, 1129) == 256.0 * 1000 + 256.0 * 257 / 2);
}

static void test_attention_quadratic_rest_linear(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b, max_seq_len: 131072}\nparallel: {tp: 8, dp: 1}\n");
    for (int64_t n = 8192; n <= 65536; n *= 2) {
        double a1 = cost_attn_fwd_s(&m, n, n) + cost_attn_bwd_s(&m, n, n);
        double a2 = cost_attn_fwd_s(&m, 2 * n, 2 * n) + cost_attn_bwd_s(&m, 2 * n, 2 * n);
        /* 4x the pairs, at a slightly better rate for the longer query. */
        assert_true(a2 / a1 > 3.8 && a2 / a1 < 4.0);
        assert_true(fabs(cost_linear_fwd_s(&m, 2 * n) - 2 * cost_linear_fwd_s(&m, n)) < 1e-12);
        assert_true(fabs(cost_linear_bwd_s(&m, 2 * n) - 2 * cost_linear_bwd_s(&m, n)) < 1e-12);
        assert_true(cost_linear_bwd_s(&m, n) > 1.9 * cost_linear_fwd_s(&m, n)); /* dgrad + wgrad */
    }
    /* Without the efficiency curve the ratio is the pairs ratio exactly. */
    make_model(&m, "model: {preset: llama3-8b, max_seq_len: 131072}\nparallel: {dp: 1}\n"
                   "balance: {attn_half_tokens: 1.0e-9, attn_tile: 1}\n");
    double r = cost_attn_fwd_s(&m, 20000, 20000) / cost_attn_fwd_s(&m, 10000, 10000);
    assert_true(fabs(r - cost_attn_pairs(&m, 20000, 20000) / cost_attn_pairs(&m, 10000, 10000)) < 1e-6);
    /* A short document costs more per pair than a long one (tile padding, lower rate). */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {dp: 1}\n");
    double per_pair_short = cost_attn_fwd_s(&m, 100, 100) / (100.0 * 101 / 2);
    double per_pair_long = cost_attn_fwd_s(&m, 8000, 8000) / (8000.0 * 8001 / 2);
    assert_true(per_pair_short > 2 * per_pair_long);
}

static void test_communication(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 1, cp: 1, dp: 1}\n");
    assert_true(cost_tp_comm_s(&m, 8192) == 0);
    assert_true(cost_cp_comm_s(&m, 8192) == 0);
    assert_true(cost_p2p_s(&m, 8192) == 0);
    /* CP 2 with TP 4 stays in a node: the all-gather moves half the K/V over NVLink, in a piece per
     * CP rank (a latency each). */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1, overlap: false}\n");
    double kv = 8192.0 * 2 * 2 * 128 * 3; /* tokens x (K, V) x 2 local kv heads x head_dim x (bf16 + fp32) / 2 */
    double expect = kv * 0.5 / (370e9) + 2 * 15e-6;
    assert_true(fabs(cost_cp_comm_s(&m, 8192) - expect) < 1e-9);
    /* TP with sequence parallelism (the default), every collective on the compute path: a
     * direction's mean of 3 all-gathers of bf16 rows and 2 reduce-scatters of float32 ones, (n-1)/n
     * of the bytes each, each in parallel.tp_chunks (4) pieces that pay the latency each. */
    double act = 8192.0 * 4096 * 2, sums = 8192.0 * 4096 * 4, L = 15e-6;
    double agb = act * 0.75 / 370e9, rsb = sums * 0.75 / 370e9, ag = agb + 4 * L, rs = rsb + 4 * L;
    double sp = 3 * ag + 2 * rs;
    assert_true(fabs(cost_tp_comm_s(&m, 8192) - sp) < 1e-9);
    CostTpComm c;
    cost_tp_comm_parts(&m, 8192, &c);
    assert_true(fabs(c.fwd_exposed - (2 * ag + 2 * rs)) < 1e-12 && fabs(c.bwd_exposed - (4 * ag + 2 * rs)) < 1e-12);
    assert_true(c.hidden == 0 && c.contention == 0);
    /* Stages: tp * cp * pp = 16 > 8 GPUs per node, so the p2p link is the network; a TP rank sends
     * its quarter of the float32 stream. */
    assert_true(fabs(cost_p2p_s(&m, 8192) - (sums / 4 / 45e9 + 15e-6)) < 1e-9);
    /* One piece: one latency each. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 2, pp: 2, dp: 1, overlap: false, tp_chunks: 1}\n");
    assert_true(fabs(cost_tp_comm_s(&m, 8192) - (3 * (agb + L) + 2 * (rsb + L))) < 1e-9);
    /* Overlapped (parallel.overlap, the default). One product at a time, the backward's gathers of
     * the stream's gradient in 4 pieces beside their products' pieces would show the first gather's
     * quarter of the bandwidth time and of each other piece what it takes longer than a quarter of
     * the product - the down (2 d 14336 / 4 FLOPs a row on TP 4) and attention output (2 d 8 x 128)
     * products, twice (weight and input gradient) -, and the all-gathers of the normed rows beside
     * the input-gradient products and the reduce-scatters beside the weight-gradient products (QKV:
     * 2 d (8 + 2 x 2) 128, gate/up: 4 d 14336 / 4) would hide up to the product's time. The chained
     * backward (cost.c's chain, engine/model/model_chain_bwd.c) runs the QKV input gradient's
     * reduce-scatter beside the MLP products of the layer below too: it hides more than that, no
     * more than the exchanges' bandwidth time, and every latency shows. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1}\n");
    double rate = 989e12 * 0.78, qkv = 2 * 4096.0 * 128 * 12 * 8192 / rate, gu = 4 * 4096.0 * 3584 * 8192 / rate;
    double out = 2 * 4096.0 * 128 * 8 * 8192 / rate, down = gu / 2;
#define PIPE(b, p) ((b) - ((b) / 4 + 0.75 * fmax(0, (b) - (p))))
    double one_by_one_bwd = PIPE(agb, 2 * down) + PIPE(agb, 2 * out) + fmin(agb, qkv) + fmin(rsb, qkv) +
                            fmin(agb, gu) + fmin(rsb, gu);
    assert_true(rsb > out && rsb > qkv && agb < gu && rsb < gu); /* some show in part */
    assert_true(fabs(PIPE(agb, gu) - 0.75 * agb) < 1e-15);       /* a long product: 3 of 4 pieces hide */
    cost_tp_comm_parts(&m, 8192, &c);
    double bwd_hidden = 4 * ag + 2 * rs - c.bwd_exposed;
    assert_true(bwd_hidden > one_by_one_bwd + 0.1 * rsb && bwd_hidden <= 4 * agb + 2 * rsb);
    assert_true(c.bwd_exposed >= 6 * 4 * L);
    /* The forward runs in pieces from the attention output product to the next layer's QKV product
     * (cost.c's chain, engine/model/model_chain.c): what it hides is the rest of its exchanges'
     * time, every latency still shows, and it hides more than each exchange beside the pieces of
     * its own product would (PIPE), since the long MLP products cover the attention block's
     * reduce-scatter too. It cannot hide more than the products' time. */
    double fwd_hidden = c.hidden - bwd_hidden, one_by_one = PIPE(agb, qkv) + PIPE(rsb, out) + PIPE(agb, gu) +
                                                              PIPE(rsb, down);
    assert_true(fabs(c.fwd_exposed - (2 * ag + 2 * rs - fwd_hidden)) < 1e-12);
    assert_true(fwd_hidden > one_by_one && fwd_hidden <= qkv + out + gu + down);
    assert_true(c.fwd_exposed >= 4 * 4 * L);
    assert_true(fabs(c.contention - 16.0 / 132 * c.hidden) < 1e-12);
    assert_true(fabs(cost_tp_comm_s(&m, 8192) - (c.fwd_exposed + c.bwd_exposed + c.contention) / 2) < 1e-15);
    assert_true(cost_tp_comm_s(&m, 8192) < sp);
    /* One piece: each stage waits for the exchange before it, so nothing of the forward hides; the
     * backward's exchanges hide behind the products between their start and the step that waits:
     * the gather of a behind the QKV input gradient's product (attention' is not priced beside it),
     * the QKV input gradient's sums behind dWqkv, the gather of b behind dgu Wgu, the gate/up input
     * gradient's sums behind dWgu - what the layer-at-a-time order hides. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 1, tp: 4, cp: 2, pp: 2, dp: 1}\n");
    cost_tp_comm_parts(&m, 8192, &c);
    assert_true(fabs(c.fwd_exposed - (2 * (agb + L) + 2 * (rsb + L))) < 1e-12);
    double one = fmin(agb, qkv) + fmin(rsb, qkv) + fmin(agb, gu) + fmin(rsb, gu);
    assert_true(fabs(c.bwd_exposed - (4 * (agb + L) + 2 * (rsb + L) - one)) < 1e-12);

    /* parallel.reduce_dtype: compute sends bf16 partial sums in bf16: half the reduce-scatters' and
     * the dK/dV reduce-scatter's bytes; float32 training keeps float32. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1, overlap: false, "
                   "reduce_dtype: compute}\ntrain: {precision: bf16}\n");
    assert_true(fabs(cost_tp_comm_s(&m, 8192) - 3 * ag - 2 * (sums / 2 * 0.75 / 370e9 + 4 * L)) < 1e-9);
    assert_true(fabs(cost_cp_comm_s(&m, 8192) - (8192.0 * 2 * 2 * 128 * 2 * 0.5 / 370e9 + 2 * 15e-6)) < 1e-9);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1, overlap: false, "
                   "reduce_dtype: compute}\ntrain: {precision: fp32}\n");
    assert_true(fabs(cost_tp_comm_s(&m, 8192) - 3 * (sums * 0.75 / 370e9 + 4 * L) - 2 * rs) < 1e-9);
    /* With overlap, sums in bf16 run where they are issued (comm.h): only the gathers hide. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1, reduce_dtype: compute}\n"
                   "train: {precision: bf16}\n");
    cost_tp_comm_parts(&m, 8192, &c);
    double rs16 = sums / 2 * 0.75 / 370e9 + 4 * L, gathers = 4 * ag + 2 * rs16 - c.bwd_exposed;
    double fwd_gathers = c.hidden - gathers;
    assert_true(m.sums_bf16 && gathers > 0 && gathers <= 4 * agb + 1e-15);
    assert_true(fwd_gathers > 0 && fwd_gathers <= 2 * agb + 1e-15);
    /* Without SP: two all-reduces of float32 partial sums a direction, 2 (n-1)/n of the bytes each;
     * every TP rank sends the whole stream. The forward's in 4 pieces, each beside the next piece
     * of its product (attention output, down); with overlap the backward's (one each) run beside
     * the weight-gradient products after them (gate/up, QKV), as the engine runs them. */
    double arb = sums * 1.5 / 370e9, ar = arb + L, ar4 = arb + 4 * L;
    for (int on = 0; on < 2; on++) {
        char *y = test_format("model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, pp: 2, dp: 1, "
                              "sequence_parallel: false, overlap: %s}\n", on ? "true" : "false");
        make_model(&m, y);
        free(y);
        double fwd = on ? PIPE(arb, out) + PIPE(arb, down) : 0, hid = on ? fmin(arb, gu) + fmin(arb, qkv) : 0;
        cost_tp_comm_parts(&m, 8192, &c);
        assert_true(fabs(c.fwd_exposed - (2 * ar4 - fwd)) < 1e-12 && fabs(c.hidden - fwd - hid) < 1e-12);
        assert_true(fabs(c.bwd_exposed - (2 * ar - hid)) < 1e-12);
        assert_true(fabs(c.contention - 16.0 / 132 * (fwd + hid)) < 1e-12);
        assert_true(on ? hid > 0 && fwd > 0 : fabs(cost_tp_comm_s(&m, 8192) - (ar4 + ar)) < 1e-15);
        assert_true(fabs(cost_p2p_s(&m, 8192) - (sums / 45e9 + 15e-6)) < 1e-9);
    }
#undef PIPE
    /* The K/V exchange in pieces (engine/model/model_cp.c), a latency each, always exposed. Beside
     * the whole documents' attention alone (no sharded one) its bandwidth time hides up to that
     * attention's; without overlap nothing hides. */
    CostCpComm x;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 4, dp: 1}\n");
    cost_cp_beside(&m, 1e-3, 2, 0.4e-3, 0, 0, &x);
    assert_true(fabs(x.hidden - 0.4e-3) < 1e-15 && fabs(x.exposed - 0.6e-3) < 1e-15);
    assert_true(fabs(x.contention - 16.0 / 132 * 0.4e-3) < 1e-15);
    cost_cp_beside(&m, 1e-3, 2, 1.0, 0, 0, &x);
    assert_true(fabs(x.hidden - (1e-3 - 30e-6)) < 1e-15 && fabs(x.exposed - 30e-6) < 1e-15);
    cost_cp_beside(&m, 1e-3, 2, 0, 0, 0, &x);
    assert_true(x.hidden == 0 && x.exposed == 1e-3 && x.contention == 0);
    /* The sharded documents' attention block by block: 4 pieces of 0.25 ms (1 ms of bandwidth, 60 us
     * of latencies). Forward: the own block first, then each other rank's block as its piece
     * arrives (at 0.5, 0.75 and 1 ms: the own piece first on the link); 4 blocks of 0.5 ms hide all
     * of it, of 0.1 ms the compute waits until 1 ms for the last piece, then runs its block: 0.7 ms
     * of the bandwidth shows. Backward: each rank's blocks, then its reduction beside the next
     * blocks; whole documents last: with blocks of 0.1 ms and 0.2 ms of whole documents the last
     * reduction ends at 1.1 ms, 0.5 ms after the compute. */
    cost_cp_beside(&m, 1.06e-3, 4, 0, 2e-3, 0, &x);
    assert_true(fabs(x.exposed - 60e-6) < 1e-15 && fabs(x.hidden - 1e-3) < 1e-15);
    cost_cp_beside(&m, 1.06e-3, 4, 0, 0.4e-3, 0, &x);
    assert_true(fabs(x.exposed - 0.76e-3) < 1e-15 && fabs(x.hidden - 0.3e-3) < 1e-15);
    cost_cp_beside(&m, 1.06e-3, 4, 0.2e-3, 0.4e-3, 1, &x);
    assert_true(fabs(x.exposed - 0.56e-3) < 1e-15 && fabs(x.hidden - 0.5e-3) < 1e-15);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 4, dp: 1, overlap: false}\n");
    cost_cp_beside(&m, 1e-3, 2, 1.0, 1.0, 0, &x);
    assert_true(x.hidden == 0 && x.exposed == 1e-3 && x.contention == 0);
}

/* The breakdown's parts of the linear work, the embedding and the output layer add up to what the
 * pipeline is charged, under each recomputation; and the parts keep the relations between the
 * directions and the recomputation modes (the backward's products twice the forward's, full
 * recomputation adds the forward's products and element-wise work, selective only element-wise
 * work, the output layer's backward has no element-wise part). */
static void test_parts_add_up(void **state)
{
    (void)state;
    const char *modes[] = {"none", "selective", "full"};
    double lp[3][2], le[3][2];
    for (int k = 0; k < 3; k++) {
        CostModel m;
        char *y = test_format("model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 2, dp: 1}\ntrain: {recompute: %s}\n",
                              modes[k]);
        make_model(&m, y);
        free(y);
        for (int bw = 0; bw < 2; bw++) {
            double p, e, c;
            cost_linear_split(&m, 5000, bw, &p, &e);
            assert_true(p > 0 && e > 0 && p + e == (bw ? cost_linear_bwd_s(&m, 5000) : cost_linear_fwd_s(&m, 5000)));
            lp[k][bw] = p;
            le[k][bw] = e;
            cost_head_split(&m, 5000, bw, &p, &e);
            assert_true(p > 0 && p + e == (bw ? cost_head_bwd_s(&m, 5000) : cost_head_fwd_s(&m, 5000)));
            double hp, he;
            cost_head_split(&m, 5000, 0, &hp, &he);
            /* The loss: 4 bytes a logit forward, 6 backward (cost_head_split). */
            assert_true(bw ? fabs(e - 1.5 * he) < 1e-15 && fabs(p - 2 * hp) < 1e-15 : e > 0);
            cost_embed_split(&m, 5000, bw, &e, &c);
            assert_true(e > 0 && c > 0 && e + c == (bw ? cost_embed_bwd_s(&m, 5000) : cost_embed_fwd_s(&m, 5000)));
        }
    }
    for (int k = 0; k < 3; k++)
        assert_true(lp[k][0] == lp[0][0] && le[k][0] == le[0][0]); /* the forward is the same in every mode */
    assert_true(fabs(lp[0][1] - 2 * lp[0][0]) < 1e-15 && lp[1][1] == lp[0][1]);
    assert_true(le[1][1] > le[0][1]);
    assert_true(fabs(lp[2][1] - 3 * lp[0][0]) < 1e-15 && fabs(le[2][1] - le[0][1] - le[0][0]) < 1e-15);
}

/* DP x CP: the float32 gradients of a rank's parameters all-reduced (ZeRO-1: reduce-scattered, and
 * the parameters all-gathered), over NVLink while the group fits in a node. */
static void test_dp_reduction(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 2, dp: 1}\n");
    /* A layer on TP 4: its products' quarter and both norms whole. */
    double d = 4096, layer = d * 128 * (2 * 8 + 2 * 2) + 3 * d * 3584 + 2 * d;
    assert_true(fabs(m.layer_params - layer) < 1e-6);
    assert_true(fabs(cost_dp_reduce_s(&m, 1e8) - (4e8 * 2 * 0.5 / 370e9 + 15e-6)) < 1e-12);
    assert_true(cost_dp_gather_s(&m, 1e8) == 0);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 2, dp: 1, zero: 1}\n");
    assert_true(fabs(cost_dp_reduce_s(&m, 1e8) - (4e8 * 0.5 / 370e9 + 15e-6)) < 1e-12);
    assert_true(fabs(cost_dp_gather_s(&m, 1e8) - (4e8 * 0.5 / 370e9 + 15e-6)) < 1e-12);
    /* 4 replicas of tp 4 x cp 2 x pp 2: 64 ranks, over the network; one rank alone reduces nothing. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 2, pp: 2, dp: 4}\n");
    assert_true(fabs(cost_dp_reduce_s(&m, 1e8) - (4e8 * 2 * 7 / 8 / 45e9 + 15e-6)) < 1e-12);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 4, cp: 1, dp: 1}\n");
    assert_true(cost_dp_reduce_s(&m, 1e8) == 0);
}

/* train.recompute in the backward: selective adds the norms' and SwiGLU's element-wise bytes, full
 * the layer's forward (GEMMs, element-wise, attention) and its exchanges once more. */
static void test_recompute(void **state)
{
    (void)state;
    CostModel none, sel, full;
    const char *base = "model: {preset: llama3-8b}\nparallel: {tp_chunks: 4, tp: 4, cp: 2, dp: 1, overlap: false}\n";
    char *y = test_format("%strain: {recompute: selective}\n", base), *z = test_format("%strain: {recompute: full}\n", base);
    make_model(&none, base);
    make_model(&sel, y);
    make_model(&full, z);
    free(y);
    free(z);
    int64_t n = 8192;
    assert_true(cost_linear_fwd_s(&sel, n) == cost_linear_fwd_s(&none, n));
    double extra = cost_linear_bwd_s(&sel, n) - cost_linear_bwd_s(&none, n);
    assert_true(extra > 0 && extra < 0.2 * cost_linear_fwd_s(&none, n));
    assert_true(fabs(cost_linear_bwd_s(&full, n) - cost_linear_bwd_s(&none, n) - cost_linear_fwd_s(&none, n)) < 1e-12);
    double f0, b0, f2, b2;
    cost_attn_fb_s(&none, 4000, 6000, &f0, &b0);
    cost_attn_fb_s(&full, 4000, 6000, &f2, &b2);
    assert_true(f2 == f0 && fabs(b2 - b0 - f0) < 1e-12);
    assert_true(cost_tp_comm_s(&sel, n) == cost_tp_comm_s(&none, n));
    /* SP on TP 4: 3 all-gathers and 2 reduce-scatters a direction on the mean, each in 4 pieces;
     * full recomputation runs the forward again up to the down product in the backward: 2
     * all-gathers and 1 reduce-scatter more. */
    double ag = 8192.0 * 4096 * 2 * 0.75 / 370e9 + 60e-6, rs = 8192.0 * 4096 * 4 * 0.75 / 370e9 + 60e-6;
    assert_true(fabs(cost_tp_comm_s(&none, n) - (3 * ag + 2 * rs)) < 1e-12);
    assert_true(fabs(cost_tp_comm_s(&full, n) - (4 * ag + 2.5 * rs)) < 1e-12);
    assert_true(cost_cp_comm_s(&full, n) > cost_cp_comm_s(&none, n));
}

/* parallel.tp_chunks: auto - pieces where the products are long enough to hide their exchanges,
 * one piece where they are not, whatever parallel.overlap says; a number is taken as it is. */
static void test_auto_tp_chunks(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 8, cp: 2, dp: 1}\n");
    int k = m.tp_chunks;
    assert_true(k > 1);
    CostModel t = m;
    t.tp_chunks = 1;
    cost_set_overlap(&t, t.overlap);
    assert_true(cost_tp_comm_s(&m, 65536) < cost_tp_comm_s(&t, 65536));
    make_model(&t, "model: {preset: llama3-8b}\nparallel: {tp: 8, cp: 2, dp: 1, overlap: false}\n");
    assert_int_equal(t.tp_chunks, k);
    make_model(&m, "model: {n_layers: 2, d_model: 128, n_heads: 4, n_kv_heads: 4, d_ffn: 384, vocab_size: 512, rope_theta: 10000, norm_eps: 1.0e-5,\n"
                   "tie_embeddings: false, max_seq_len: 256}\n"
                   "parallel: {tp: 2, dp: 1}\ndata: {context_window: 256}\nbalance: {hardware: cpu}\n");
    assert_int_equal(m.tp_chunks, 1);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 1, dp: 1}\n");
    assert_int_equal(m.tp_chunks, 1);
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 8, dp: 1, tp_chunks: 3}\n");
    assert_int_equal(m.tp_chunks, 3);
}

/* The even split: n / chunks each, the remainder to the first chunks; the cost model reads the
 * config's split, even or a list. */
static void test_stage_layers(void **state)
{
    (void)state;
    int64_t split[40];
    for (int layers = 1; layers <= 40; layers++)
        for (int pp = 1; pp <= layers; pp++) {
            int64_t total = 0;
            config_even_layers(layers, pp, split);
            for (int s = 0; s < pp; s++) {
                assert_true(split[s] == layers / pp + (s < layers % pp));
                total += split[s];
            }
            assert_int_equal(total, layers);
        }
    CostModel m;
    make_model(&m, "model: {preset: tiny}\nparallel: {pp: 2, virtual_stages: 2, dp: 1}\n");
    int tiny = m.n_layers;
    for (int g = 0; g < 4; g++)
        assert_int_equal(cost_chunk_layers(&m, g), tiny / 4 + (g < tiny % 4));
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {pp: 4, dp: 1, stage_layers: [7, 9, 9, 7]}\n");
    assert_int_equal(cost_chunk_layers(&m, 0), 7);
    assert_int_equal(cost_chunk_layers(&m, 1), 9);
    assert_int_equal(cost_chunk_layers(&m, 3), 7);
}

/* The embedding: float32 rows written and summed over TP with nothing to hide under - an
 * all-reduce, or with sequence parallelism a reduce-scatter onto the rank's rows; its backward a
 * scatter-add, after an all-gather of the rows' gradients with SP. */
static void test_embedding(void **state)
{
    (void)state;
    CostModel m;
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 8, dp: 1, sequence_parallel: false}\n");
    double rows = 8192.0 * 4096 * 4;
    assert_true(fabs(cost_embed_fwd_s(&m, 8192) - (rows / 3350e9 + rows * 2 * 7 / 8 / 370e9 + 15e-6)) < 1e-12);
    assert_true(fabs(cost_embed_bwd_s(&m, 8192) - 3 * rows / 3350e9) < 1e-12);
    assert_true(cost_embed_fwd_s(&m, 0) == 0 && cost_embed_bwd_s(&m, 0) == 0);
    /* With SP one collective per piece of the stream's rows (parallel.tp_chunks 4): 4 latencies. */
    make_model(&m, "model: {preset: llama3-8b}\nparallel: {tp: 8, dp: 1, tp_chunks: 4}\n");
    assert_true(fabs(cost_embed_fwd_s(&m, 8192) - (rows / 3350e9 + rows * 7 / 8 / 370e9 + 60e-6)) < 1e-12);
    assert_true(fabs(cost_embed_bwd_s(&m, 8192) - (3 * rows / 3350e9 + rows * 7 / 8 / 370e9 + 60e-6)) < 1e-12);
}

/* The engine's profiles: taken with train.device cuda and h100 / h200, not on the CPU device nor
 * with -fa3; the loss, the optimizer and the attention priced at their rates; the source named. */
static void test_engine_profiles(void **state)
{
    (void)state;
    CostModel e, pub, cpu_dev, fa3;
    const char *shape = "model: {preset: llama3.2-1b}\nparallel: {dp: 1}\n";
    char *y = test_format("%sbalance: {hardware: h200}\ntrain: {device: cuda}\n", shape);
    make_model(&e, y);
    free(y);
    y = test_format("%sbalance: {hardware: h200}\ntrain: {device: cpu}\n", shape);
    make_model(&cpu_dev, y);
    free(y);
    y = test_format("%sbalance: {hardware: h200-fa3}\ntrain: {device: cuda}\n", shape);
    make_model(&fa3, y);
    free(y);
    pub = fa3;
    assert_string_equal(e.source.profile, "h200");
    assert_non_null(strstr(e.source.text, "engine/plan/profiles/h200.json"));
    assert_string_equal(fa3.source.profile, "h200-fa3");
    assert_non_null(strstr(fa3.source.text, "published rates"));
    assert_string_equal(cpu_dev.source.profile, "h200 (published rates)");
    assert_true(cpu_dev.table.n == 0 && fa3.table.n == 0 && e.table.n > 0);
    assert_int_equal(e.table.head_dim, 64); /* llama3.2-1b: 2048 / 32 */
    /* The engine's rates are slower than the published ones where it was measured slower. */
    assert_true(e.hw.gemm_efficiency < pub.hw.gemm_efficiency && e.hw.loss_gbps < pub.hw.loss_gbps);
    assert_true(cost_attn_fwd_s(&e, 8192, 8192) > 1.5 * cost_attn_fwd_s(&pub, 8192, 8192));
    /* The loss: forward 4 bytes a local logit, backward 6, at loss_gbps. */
    double p, el;
    cost_head_split(&e, 1000, 0, &p, &el);
    assert_true(fabs(el - 4.0 * 128256 * 1000 / (e.hw.loss_gbps * 1e9)) < 1e-15);
    cost_head_split(&e, 1000, 1, &p, &el);
    assert_true(fabs(el - 6.0 * 128256 * 1000 / (e.hw.loss_gbps * 1e9)) < 1e-15);
    /* The optimizer: 34 bytes a parameter; with ZeRO-1 over 8 ranks 34 / 8 of the shard and 6 of the
     * bf16 cast of every parameter. */
    assert_true(fabs(cost_optimizer_s(&e, 1e9) - 34e9 / (e.hw.optimizer_gbps * 1e9)) < 1e-12);
    assert_true(cost_optimizer_s(&e, 0) == 0);
    CostModel z;
    y = test_format("%sparallel: {dp: 8, zero: 1}\nbalance: {hardware: h200}\ntrain: {device: cuda}\n",
                    "model: {preset: llama3.2-1b}\n");
    make_model(&z, y);
    free(y);
    assert_true(fabs(cost_optimizer_s(&z, 8e9) - (34e9 + 6 * 8e9) / (z.hw.optimizer_gbps * 1e9)) < 1e-12);
    /* Head size 128 takes its own table (llama3-8b). */
    CostModel h128;
    make_model(&h128, "model: {preset: llama3-8b}\nparallel: {dp: 1}\nbalance: {hardware: h100}\n"
                      "train: {device: cuda}\n");
    assert_int_equal(h128.table.head_dim, 128);
    assert_string_equal(h128.source.profile, "h100");
}

/* A file with attention tables for several head sizes: the model's own, else the nearest in log2;
 * its profile and source strings; a table without head_dim among several, or a source that is not a
 * string, is refused naming the file. */
static void test_calibration_tables(void **state)
{
    (void)state;
    const char *head = "{\"format\": \"wlbtrain-calibration\", \"version\": 2, \"backend\": \"cuda\",\n"
                       " \"peak_tflops\": 500, \"gemm_efficiency\": 0.5, \"hbm_gbps\": 100, \"launch_us\": 0,\n";
    const char *tables = " \"profile\": \"x\", \"source\": \"made here\", \"sources\": {\"hbm_gbps\": \"a guess\"},\n"
                         " \"attention\": [{\"head_dim\": 64, \"q\": [128], \"fwd_tflops\": [10], \"bwd_tflops\": [5]},\n"
                         "   {\"head_dim\": 256, \"q\": [128], \"fwd_tflops\": [30], \"bwd_tflops\": [15]}]}\n";
    char *text = test_format("%s%s", head, tables);
    CostHardware hw = *cost_hardware_profile(HW_H100);
    CostAttnTable t = {0};
    CostSource src;
    Error err = {0};
    assert_int_equal(calibration_load_text(text, "t.json", 64, &hw, &t, &src, &err), 0);
    assert_true(t.head_dim == 64 && t.fwd_tflops[0] == 10);
    assert_true(hw.loss_gbps == 100 && hw.optimizer_gbps == 100); /* absent: hbm_gbps */
    assert_string_equal(src.profile, "x");
    assert_string_equal(src.text, "made here (t.json)");
    assert_int_equal(calibration_load_text(text, "t.json", 256, &hw, &t, NULL, &err), 0);
    assert_true(t.head_dim == 256 && t.fwd_tflops[0] == 30);
    assert_int_equal(calibration_load_text(text, "t.json", 128, &hw, &t, NULL, &err), 0);
    assert_int_equal(t.head_dim, 64); /* 64 and 256 are equally far; the first kept */
    assert_int_equal(calibration_load_text(text, "t.json", 200, &hw, &t, NULL, &err), 0);
    assert_int_equal(t.head_dim, 256);
    free(text);
    text = test_format("%s \"attention\": [{\"q\": [128], \"fwd_tflops\": [10], \"bwd_tflops\": [5]},\n"
                       "  {\"head_dim\": 128, \"q\": [128], \"fwd_tflops\": [10], \"bwd_tflops\": [5]}]}\n", head);
    assert_int_equal(calibration_load_text(text, "t.json", 64, &hw, &t, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "head_dim: missing"));
    assert_non_null(strstr(err.msg, "t.json"));
    free(text);
    text = test_format("%s \"sources\": {\"hbm_gbps\": 3}, \"attention\": {\"q\": [128], \"fwd_tflops\": [10], "
                       "\"bwd_tflops\": [5]}}\n", head);
    assert_int_equal(calibration_load_text(text, "t.json", 64, &hw, &t, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "sources.hbm_gbps"));
    free(text);
    /* calibrate's output names the device and time it was measured on. */
    text = test_format("%s \"device\": \"GPU X\", \"measured\": \"2026-01-01\", \"attention\": {\"q\": [128], "
                       "\"fwd_tflops\": [10], \"bwd_tflops\": [5]}}\n", head);
    assert_int_equal(calibration_load_text(text, "c.json", 64, &hw, &t, &src, &err), 0);
    assert_string_equal(src.profile, "c.json");
    assert_string_equal(src.text, "calibrated by wlbtrain calibrate on GPU X at 2026-01-01");
    free(text);
}

static void test_calibration_file(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    const char *good = "{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"device\": \"test\",\n"
                       " \"peak_tflops\": 500, \"gemm_efficiency\": 0.5, \"inter_node_gbps\": 10,\n"
                       " \"attention\": {\"tile\": 64, \"q\": [64, 256, 1024],\n"
                       "   \"fwd_tflops\": [100, 200, 300], \"bwd_tflops\": [50, 100, 150]}}\n";
    char *path = test_write_file(dir, "cal.json", good, strlen(good));
    char *yaml = test_format("model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {calibration: %s}\n", path);
    CostModel m;
    make_model(&m, yaml);
    assert_true(m.hw.peak_tflops == 500 && m.hw.gemm_efficiency == 0.5 && m.hw.inter_node_gbps == 10);
    assert_int_equal(m.hw.attn_tile, 64);
    assert_int_equal(m.table.n, 3);
    /* At q = 512 (half-way in log2 between 256 and 1024) the rate is 250 TF forward. */
    double flops = 4.0 * m.head_dim * m.local_heads * cost_attn_pairs(&m, 512, 512);
    assert_true(fabs(cost_attn_fwd_s(&m, 512, 512) - flops / 250e12) < 1e-15);
    assert_true(fabs(cost_attn_bwd_s(&m, 512, 512) - 2.5 * flops / 125e12) < 1e-15);
    /* Clamped at the ends. */
    flops = 4.0 * m.head_dim * m.local_heads * cost_attn_pairs(&m, 8192, 8192);
    assert_true(fabs(cost_attn_fwd_s(&m, 8192, 8192) - flops / 300e12) < 1e-15);
    /* Version 2 (what calibrate writes): launch_us adds a fixed part to a layer's pass with tokens,
     * a third forward, two thirds backward; none without tokens. */
    const char *v2 = "{\"format\": \"wlbtrain-calibration\", \"version\": 2, \"backend\": \"cpu\", \"device\": \"t\",\n"
                     " \"model\": {\"d_model\": 128}, \"check\": {\"mixes\": 1},\n"
                     " \"peak_tflops\": 500, \"gemm_efficiency\": 0.5, \"hbm_gbps\": 100, \"launch_us\": 30,\n"
                     " \"attention\": {\"tile\": 1, \"q\": [64], \"fwd_tflops\": [1], \"bwd_tflops\": [1]}}\n";
    char *path2 = test_write_file(dir, "cal2.json", v2, strlen(v2));
    char *yaml2 = test_format("model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {calibration: %s}\n", path2);
    CostModel m0, m2;
    make_model(&m2, yaml2);
    assert_true(m2.hw.launch_us == 30 && m2.hw.hbm_gbps == 100 && m2.hw.attn_tile == 1 && m2.table.n == 1);
    m0 = m2;
    m0.hw.launch_us = 0;
    assert_true(fabs(cost_linear_fwd_s(&m2, 100) - cost_linear_fwd_s(&m0, 100) - 10e-6) < 1e-12);
    assert_true(fabs(cost_linear_bwd_s(&m2, 100) - cost_linear_bwd_s(&m0, 100) - 20e-6) < 1e-12);
    assert_true(cost_linear_fwd_s(&m2, 0) == 0);
    free(yaml2);
    free(path2);
    /* An explicit key beats the calibration file. */
    free(yaml);
    yaml = test_format("model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {calibration: %s, peak_tflops: 123}\n", path);
    make_model(&m, yaml);
    assert_true(m.hw.peak_tflops == 123);
    free(yaml);

    const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"version\": 1}", "not a wlbtrain calibration file"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 3}", "calibration version must be 1 to 2"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": \"2\"}", "calibration version must be 1 to 2"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 2}", "backend: missing"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 2, \"backend\": \"cpu\"}", "peak_tflops: missing"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 2, \"backend\": \"tpu\"}", "backend: expected"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"gemm_efficiency\": 1.5}",
         "gemm_efficiency: expected a number in [1e-06, 1]"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"launch_us\": -1}", "launch_us: expected"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"gpus_per_node\": 2.5}", "gpus_per_node: expected a whole"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"peak_tflop\": 3}", "unknown key 'peak_tflop'"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"attention\": {\"q\": [1], \"fwd_tflops\": [1], "
         "\"bwd_tflops\": [1], \"tile\": 0}}", "tile: expected a whole number in [1, 4096]"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"peak_tflops\": -1}",
         "peak_tflops: expected a number in [1e-06, 100000]"},
        /* Rates so small that the predicted times would be infinite (found by fuzz_calibration). */
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"peak_tflops\": 1e-300}",
         "peak_tflops: expected a number in [1e-06, 100000]"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"inter_node_gbps\": 1e-9}",
         "inter_node_gbps: expected a number in [1e-06, 1e+06]"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"attention\": {\"q\": [1, 2], \"fwd_tflops\": [1, 1], "
         "\"bwd_tflops\": [1, 1e-300]}}",
         "attention.bwd_tflops[1]: expected a rate of at least 1e-06 TFLOP/s"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"attention\": {\"q\": [1, 2], \"fwd_tflops\": [1], "
         "\"bwd_tflops\": [1, 2]}}",
         "attention: q, fwd_tflops and bwd_tflops must have the same length (2, 1, 2)"},
        {"{\"format\": \"wlbtrain-calibration\", \"version\": 1, \"attention\": {\"q\": [2, 1], \"fwd_tflops\": [1, 1], "
         "\"bwd_tflops\": [1, 2]}}",
         "attention.q must be increasing"},
        {"{\"format\": ", "line 1, column"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = test_write_file(dir, "bad.json", bad[i].text, strlen(bad[i].text));
        Config cfg;
        Error err = {0};
        char *y = test_format("model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {calibration: %s}\n", p);
        make_config(&cfg, y);
        assert_int_equal(cost_model_init(&m, &cfg, &err), -1);
        assert_int_equal(err.status, 2);
        if (!strstr(err.msg, bad[i].msg) || strncmp(err.msg, p, strlen(p))) {
            print_error("expected '%s' in: %s\n", bad[i].msg, err.msg);
            fail();
        }
        config_free(&cfg);
        free(y);
        free(p);
    }
    /* The same floor for the balance.* keys, which win over the file. */
    const char *keys[] = {"peak_tflops", "gemm_efficiency", "attn_efficiency", "hbm_gbps", "intra_node_gbps",
                          "inter_node_gbps"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        Config cfg;
        Error err = {0};
        char *y = test_format("model: {preset: tiny}\nparallel: {dp: 1}\nbalance: {%s: 1.0e-9}\n", keys[i]);
        make_config(&cfg, y);
        assert_int_equal(cost_model_init(&m, &cfg, &err), -1);
        assert_int_equal(err.status, 2);
        char *want = test_format("balance.%s: 1e-09 is below the least rate the cost model takes (1e-06)", keys[i]);
        if (!strstr(err.msg, want)) {
            print_error("expected '%s' in: %s\n", want, err.msg);
            fail();
        }
        config_free(&cfg);
        free(want);
        free(y);
    }
    free(path);
    test_rm_rf(dir);
    free(dir);
}

/* The wavefront order that the TP forward's pieces run in (util/wavefront.h) and cost.c prices:
 * stage s of piece j at step j + 2 s, the later stage first within a step; every stage of every
 * piece once, each piece's stages in turn and each stage's pieces in turn. */
static void test_wavefront_order(void **state)
{
    (void)state;
    int stage[64], piece[64];
    const int want[][2] = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {0, 3}, {2, 0}, {1, 2},
                           {2, 1}, {1, 3}, {2, 2}, {2, 3}};
    assert_int_equal(wavefront_order(3, 4, stage, piece), 12);
    for (int i = 0; i < 12; i++)
        assert_true(stage[i] == want[i][0] && piece[i] == want[i][1]);
    for (int n = 1; n <= 5; n++)
        for (int k = 1; k <= 12; k++) {
            int seen[5][12] = {{0}}, count = wavefront_order(n, k, stage, piece);
            assert_int_equal(count, n * k);
            for (int i = 0; i < count; i++) {
                int s = stage[i], j = piece[i];
                assert_true(s >= 0 && s < n && j >= 0 && j < k && !seen[s][j]);
                assert_true((s == 0 || seen[s - 1][j]) && (j == 0 || seen[s][j - 1]));
                seen[s][j] = 1;
            }
        }
    assert_int_equal(wavefront_order(0, 4, stage, piece), 0);
    assert_int_equal(wavefront_order(3, 0, stage, piece), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flop_closed_forms),
        cmocka_unit_test(test_attention_quadratic_rest_linear),
        cmocka_unit_test(test_communication),
        cmocka_unit_test(test_wavefront_order),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_auto_tp_chunks),
        cmocka_unit_test(test_dp_reduction),
        cmocka_unit_test(test_parts_add_up),
        cmocka_unit_test(test_stage_layers),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_engine_profiles),
        cmocka_unit_test(test_calibration_tables),
        cmocka_unit_test(test_calibration_file),
    };
    return cmocka_run_group_tests_name("cost", tests, NULL, NULL);
}
