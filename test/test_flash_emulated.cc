/*
 * test/test_flash_emulated.cc - the flash attention kernels' own source (cuda/cuda_flash_*.cuh, and
 * the float32 reference's, cuda/cuda_attention_ref.cuh), run on the CPU by the emulator of
 * test/flash_emu.h, against the CPU backend's attention (the reference) on the same bf16-rounded
 * inputs. No GPU: this is how the index math of fragments, tiles, masks and work lists is checked
 * where there is none.
 *
 *   fragments   the kernels' ldmatrix loaders (all four operand layouts) and the mma accumulators
 *               against the PTX ISA's fragment tables as the emulator implements them; swizzled
 *               tiles free of bank conflicts
 *   plans       work lists: every query row in exactly one tile of each query list, every key row of
 *               every segment in one dK/dV tile, waves without shared keys, longest tiles first,
 *               bad segment lists refused
 *   attention   forward (out, lse) and backward (dq, dk, dv; deterministic and atomic) on segment
 *               lists with documents of 1, 63, 64, 65 and 130 tokens, context-parallel key ranges
 *               (q_len < kv_len), two segments sharing keys, GQA ratios 1, 4 and 8, head sizes 64
 *               and 128, q/k/v as columns of one fused array and out with a stride of its own
 *   schedules   the same forward and backward under three thread schedules and both cp.async
 *               timings give the same bits (a race would show as a difference)
 *   reference   the float32 reference kernels (cuda/cuda_attention_ref.cuh: fp32 training, and the
 *               head sizes without tensor-core kernels, such as test/test_cuda_model.c's 16) at head
 *               sizes 8, 16, 64 and 256 against the CPU backend within 1e-5 relative, both backward
 *               modes; the deterministic one makes no atomic add and writes every float of dq, dk,
 *               dv from one block per launch, and gives the same bits under every schedule
 * Every emulated launch must also be free of the emulator's own findings (races, shared reads of
 * unwritten or in-flight data, out-of-bounds or misaligned global accesses, two blocks writing one
 * float, divergence, deadlock).
 *
 * Tolerances (relative L2 error against the float32 reference on the same bf16 inputs): out 1e-2 and
 * gradients 2e-2 (P, dS and out are rounded to bf16 once each, 2^-9 relative each), lse 1e-5
 * (float32 throughout). The emulated products are exact sums in double, so the errors seen here are
 * those of the roundings the kernels choose, not of the tensor cores.
 */
#include "test/flash_emu.h"

#include "cuda/cuda_attention_ref.cuh"
#include "cuda/cuda_flash_bwd.cuh"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include <cmocka.h>

#include "cpu/cpu_ops.h"
}

#include <algorithm>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

/* Fails the test with the emulator's messages when a launch found anything. */
static void expect_clean(int found, const char *what)
{
    if (found == 0)
        return;
    std::string msg;
    flash_emu_errors(&msg);
    printf("# %s: %d emulator findings:\n", what, found);
    size_t at = 0;
    while (at < msg.size()) {
        size_t end = msg.find('\n', at);
        printf("#   %s\n", msg.substr(at, end - at).c_str());
        at = end == std::string::npos ? msg.size() : end + 1;
    }
    fail_msg("%s: %d findings of the emulator", what, found);
}

static std::mt19937_64 rng(20261123);

static float randn()
{
    static std::normal_distribution<float> n(0.0f, 1.0f);
    return n(rng);
}

static uint16_t bf16(float x) { return flash_emu_bf16(x); }
static float unbf16(uint16_t b) { return flash_emu_float(b); }

/* ---------------------------------------------------------------------------------------------- */
/* Fragments                                                                                       */

/* One warp: a 32 x 64 bf16 matrix (distinct values) goes into a swizzled tile by cp.async; every
 * loader reads 16 x 16 blocks of it at several offsets, and each register is compared with the
 * element the PTX tables say it holds. */
static void test_fragments(void **state)
{
    (void)state;
    flash_emu_reset();
    constexpr int ROWS = 32, COLS = 64;
    std::vector<uint16_t> src(ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++)
        src[(size_t)i] = bf16((float)i); /* exact: i < 2^8 * 2^... small integers are exact in bf16 up to 256 */
    for (int i = 0; i < ROWS * COLS; i++)
        src[(size_t)i] = (uint16_t)(0x3f80 + i); /* distinct bit patterns (finite bf16 values) */
    /* out[block][lane][reg] for 4 loaders x offsets */
    const int offsets[][2] = {{0, 0}, {16, 0}, {0, 16}, {16, 48}, {8, 32}};
    constexpr int N_OFF = 5;
    std::vector<uint32_t> out(4 * N_OFF * 32 * 4);
    flash_emu_clear_buffers();
    flash_emu_buffer(src.data(), src.size() * 2, false, "src");
    flash_emu_buffer(out.data(), out.size() * 4, true, "out");
    auto body = [&](unsigned char *smem, int64_t, int tid) {
        uint16_t *tile = (uint16_t *)smem;
        flash_load_tile<ROWS, COLS, 32>(tile, src.data(), COLS, ROWS, tid);
        flash_cp_async_commit();
        flash_cp_async_wait<0>();
        flash_sync_cta();
        for (int o = 0; o < N_OFF; o++) {
            uint32_t r[4][4];
            const int a = offsets[o][0], b = offsets[o][1];
            flash_ldsm_a<COLS>(r[0], tile, a, b, tid);  /* A = tile[a.., b..] */
            flash_ldsm_at<COLS>(r[1], tile, b, a, tid); /* A = tile^T: rows b.. (of A) = cols, k = tile rows a.. */
            flash_ldsm_b<COLS>(r[2], tile, a, b, tid);  /* B[k][n] = tile[n = a..][k = b..] */
            flash_ldsm_bt<COLS>(r[3], tile, b, a, tid); /* B[k][n] = tile[k = a..][n = b..] */
            for (int l = 0; l < 4; l++)
                for (int i = 0; i < 4; i++)
                    flash_st_global_u32(&out[(size_t)(((l * N_OFF + o) * 32 + tid) * 4 + i)], r[l][i]);
        }
    };
    expect_clean(flash_emu_launch("fragments", 1, 32, ROWS * COLS * 2, body), "fragments");
    auto at = [&](int r, int c) { return src[(size_t)(r * COLS + c)]; };
    int bad = 0;
    for (int o = 0; o < N_OFF; o++) {
        const int a = offsets[o][0], b = offsets[o][1];
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane / 4, t = lane % 4;
            for (int i = 0; i < 8; i++) { /* the A table: a_i row g (+8: i = 2,3,6,7), col 2t + i%2 (+8: i >= 4) */
                const int row = g + ((i / 2) % 2) * 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
                const uint32_t ra = out[(size_t)(((0 * N_OFF + o) * 32 + lane) * 4 + i / 2)];
                const uint32_t rat = out[(size_t)(((1 * N_OFF + o) * 32 + lane) * 4 + i / 2)];
                const uint16_t va = (uint16_t)(i % 2 ? ra >> 16 : ra & 0xffff);
                const uint16_t vat = (uint16_t)(i % 2 ? rat >> 16 : rat & 0xffff);
                bad += va != at(a + row, b + col);   /* A[row][col] = tile[a + row][b + col] */
                bad += vat != at(a + col, b + row);  /* A[row][col] = tile[a + col][b + row] */
            }
            for (int tile_n = 0; tile_n < 2; tile_n++)
                for (int i = 0; i < 4; i++) { /* the B table: b_i row 2t + i%2 (+8: i >= 2), col g */
                    const int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0), n = g + 8 * tile_n;
                    const int reg = 2 * tile_n + i / 2;
                    const uint32_t rb = out[(size_t)(((2 * N_OFF + o) * 32 + lane) * 4 + reg)];
                    const uint32_t rbt = out[(size_t)(((3 * N_OFF + o) * 32 + lane) * 4 + reg)];
                    bad += (uint16_t)(i % 2 ? rb >> 16 : rb & 0xffff) != at(a + n, b + k);
                    bad += (uint16_t)(i % 2 ? rbt >> 16 : rbt & 0xffff) != at(a + k, b + n);
                }
        }
    }
    FlashEmuStats st = flash_emu_stats();
    printf("# fragments: %d wrong registers; ldmatrix %lld wavefronts for %lld conflict-free\n", bad,
           (long long)st.ldsm_wavefronts, (long long)st.ldsm_ideal);
    assert_int_equal(bad, 0);
    assert_int_equal(st.ldsm_wavefronts, st.ldsm_ideal);
}

/* A 32 x 32 by 32 x 16 product through the loaders and flash_mma, A from a [m][k] tile and from a
 * [k][m] tile, B from [n][k] and [k][n]: all four combinations against the plain product. */
static void test_mma(void **state)
{
    (void)state;
    flash_emu_reset();
    constexpr int M = 32, K = 64, N = 64; /* tiles are 64 wide; the product uses 32 x 32 x 16 of them */
    std::vector<uint16_t> a((size_t)M * K), at((size_t)K * M * 2), b((size_t)N * K), bt((size_t)K * N);
    std::vector<float> A((size_t)M * K), B((size_t)K * N);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            float x = unbf16(bf16(randn()));
            A[(size_t)(m * K + k)] = x;
            a[(size_t)(m * K + k)] = bf16(x);
        }
    at.assign((size_t)K * 64, 0);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            at[(size_t)(k * 64 + m)] = bf16(A[(size_t)(m * K + k)]);
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            float x = unbf16(bf16(randn()));
            B[(size_t)(k * N + n)] = x;
            b[(size_t)(n * K + k)] = bf16(x);
            bt[(size_t)(k * N + n)] = bf16(x);
        }
    /* acc (MT 2 x NT 4) = A[0:32, 0:64] B[0:64, 16:48] */
    std::vector<float> out(4 * M * 32, 0.0f);
    flash_emu_clear_buffers();
    flash_emu_buffer(a.data(), a.size() * 2, false, "a");
    flash_emu_buffer(at.data(), at.size() * 2, false, "at");
    flash_emu_buffer(b.data(), b.size() * 2, false, "b");
    flash_emu_buffer(bt.data(), bt.size() * 2, false, "bt");
    flash_emu_buffer(out.data(), out.size() * 4, true, "out");
    auto body = [&](unsigned char *smem, int64_t, int tid) {
        uint16_t *ta = (uint16_t *)smem, *tat = ta + M * K, *tb = tat + K * 64, *tbt = tb + N * K;
        flash_load_tile<M, K, 32>(ta, a.data(), K, M, tid);
        flash_load_tile<K, 64, 32>(tat, at.data(), 64, K, tid);
        flash_load_tile<N, K, 32>(tb, b.data(), K, N, tid);
        flash_load_tile<K, N, 32>(tbt, bt.data(), N, K, tid);
        flash_cp_async_commit();
        flash_cp_async_wait<0>();
        flash_sync_cta();
        for (int v = 0; v < 4; v++) {
            float acc[2][4][4];
            flash_zero(acc);
            const bool a_t = v & 1, b_t = v & 2;
            /* two calls of 32 k each: k0 = 0 and 32 */
            for (int k0 = 0; k0 < K; k0 += 32) {
                if (!a_t && !b_t)
                    flash_warp_gemm<2, 4, 2, false, K, false, K>(acc, ta, 0, tb, 16, k0, tid);
                else if (a_t && !b_t)
                    flash_warp_gemm<2, 4, 2, true, 64, false, K>(acc, tat, 0, tb, 16, k0, tid);
                else if (!a_t && b_t)
                    flash_warp_gemm<2, 4, 2, false, K, true, N>(acc, ta, 0, tbt, 16, k0, tid);
                else
                    flash_warp_gemm<2, 4, 2, true, 64, true, N>(acc, tat, 0, tbt, 16, k0, tid);
            }
            for (int mt = 0; mt < 2; mt++)
                for (int nt = 0; nt < 4; nt++)
                    for (int i = 0; i < 4; i++) {
                        const int r = 16 * mt + flash_c_row(tid, i), c = 8 * nt + flash_c_col(tid, i);
                        flash_st_global_f32(&out[(size_t)((v * M + r) * 32 + c)], acc[mt][nt][i]);
                    }
        }
    };
    expect_clean(flash_emu_launch("mma", 1, 32, (M * K + K * 64 + N * K + K * N) * 2, body), "mma");
    double worst = 0;
    for (int v = 0; v < 4; v++)
        for (int r = 0; r < M; r++)
            for (int c = 0; c < 32; c++) {
                double ref = 0;
                for (int k = 0; k < K; k++)
                    ref += (double)A[(size_t)(r * K + k)] * B[(size_t)(k * N + 16 + c)];
                worst = std::max(worst, fabs(out[(size_t)((v * M + r) * 32 + c)] - ref));
            }
    FlashEmuStats st = flash_emu_stats();
    printf("# mma: worst |error| %.2e over 4 operand layouts; ldmatrix %lld wavefronts for %lld\n", worst,
           (long long)st.ldsm_wavefronts, (long long)st.ldsm_ideal);
    assert_true(worst < 1e-4);
    assert_int_equal(st.ldsm_wavefronts, st.ldsm_ideal);
}

/* ---------------------------------------------------------------------------------------------- */
/* Plans                                                                                           */

static void check_plan(const std::vector<AttnSegment> &segs, FlashPlanShape s)
{
    FlashPlan p;
    char err[200];
    assert_int_equal(flash_plan_build(&p, segs.data(), (int64_t)segs.size(), s, err, sizeof err), 0);
    const int64_t n = (int64_t)p.segs.size();
    /* query lists: every row of every segment exactly once */
    auto check_queries = [&](int64_t begin, int64_t count, int bm, int bn) {
        std::vector<std::vector<int>> seen((size_t)n);
        for (int64_t i = 0; i < n; i++)
            seen[(size_t)i].assign((size_t)p.segs[(size_t)i].y, 0);
        int64_t last_cost = INT64_MAX;
        for (int64_t k = begin; k < begin + count; k++) {
            const int2 it = p.items[(size_t)k];
            const int4 g = p.segs[(size_t)it.x];
            assert_true(it.y >= 0 && it.y < g.y && it.y % bm == 0);
            for (int r = it.y; r < std::min(g.y, it.y + bm); r++)
                seen[(size_t)it.x][(size_t)r]++;
            const int64_t cost = flash_cdiv((int64_t)g.w - g.y + std::min(g.y, it.y + bm), bn);
            assert_true(cost <= last_cost); /* longest first */
            last_cost = cost;
        }
        for (auto &v : seen)
            for (int c : v)
                assert_int_equal(c, 1);
    };
    check_queries(p.fwd_begin, p.fwd_count, s.fwd_bm, s.fwd_bn);
    check_queries(p.dq_begin, p.dq_count, s.dq_bm, s.dq_bn);
    /* key lists: every key of every segment once, in one wave; no two segments of a wave share keys */
    std::vector<std::vector<int>> seen((size_t)n);
    for (int64_t i = 0; i < n; i++)
        seen[(size_t)i].assign((size_t)p.segs[(size_t)i].w, 0);
    for (size_t w = 0; w + 1 < p.wave_begin.size(); w++) {
        std::vector<std::pair<int, int>> ranges;
        std::vector<int> segs_in;
        int64_t last_cost = INT64_MAX;
        for (int64_t k = p.wave_begin[w]; k < p.wave_begin[w + 1]; k++) {
            const int2 it = p.items[(size_t)k];
            const int4 g = p.segs[(size_t)it.x];
            assert_true(it.y >= 0 && it.y < g.w && it.y % s.kv_bn == 0);
            for (int r = it.y; r < std::min(g.w, it.y + s.kv_bn); r++)
                seen[(size_t)it.x][(size_t)r]++;
            if (std::find(segs_in.begin(), segs_in.end(), it.x) == segs_in.end()) {
                segs_in.push_back(it.x);
                ranges.push_back({g.z, g.z + g.w});
            }
            const int64_t cost = flash_cdiv(g.y - std::max(0, it.y - (g.w - g.y)), s.kv_bm);
            assert_true(cost <= last_cost);
            last_cost = cost;
        }
        std::sort(ranges.begin(), ranges.end());
        for (size_t i = 1; i < ranges.size(); i++)
            assert_true(ranges[i - 1].second <= ranges[i].first);
    }
    for (auto &v : seen)
        for (int c : v)
            assert_int_equal(c, 1);
}

static void test_plans(void **state)
{
    (void)state;
    FlashPlanShape s = flash_plan_shape<FlashTiles<64>>(), s2 = flash_plan_shape<FlashTiles<128>>();
    /* documents, CP chunks sharing keys (3 chunks of one document: 3 waves), an empty segment */
    std::vector<AttnSegment> segs = {{0, 1, 0, 1, 0},       {1, 63, 1, 63, 0},     {64, 64, 64, 64, 0},   {128, 65, 128, 65, 0},
                                     {193, 0, 193, 0, 0},   {193, 40, 193, 60, 0}, {233, 50, 193, 200, 0}, {283, 30, 193, 130, 0},
                                     {313, 700, 400, 700, 0}};
    check_plan(segs, s);
    check_plan(segs, s2);
    /* out of order, many small documents and one long one */
    std::vector<AttnSegment> many;
    int64_t row = 0;
    for (int i = 0; i < 300; i++) {
        int64_t len = 1 + (int64_t)(rng() % 40);
        many.push_back({row, len, row, len, 0});
        row += len;
    }
    many.push_back({row, 5000, row, 5000, 0});
    std::shuffle(many.begin(), many.end(), rng);
    check_plan(many, s);
    FlashPlan p;
    char err[200];
    assert_int_equal(flash_plan_build(&p, many.data(), (int64_t)many.size(), s, err, sizeof err), 0);
    assert_int_equal((int)p.wave_begin.size(), 2); /* one wave */
    assert_int_equal(flash_plan_build(&p, segs.data(), (int64_t)segs.size(), s, err, sizeof err), 0);
    assert_int_equal((int)p.wave_begin.size(), 4); /* three waves */
    /* refused: shared query rows, kv_len < q_len, negative rows */
    std::vector<AttnSegment> bad1 = {{0, 10, 0, 10, 0}, {5, 10, 20, 10, 0}};
    assert_int_equal(flash_plan_build(&p, bad1.data(), 2, s, err, sizeof err), -1);
    printf("# refused: %s\n", err);
    std::vector<AttnSegment> bad2 = {{0, 10, 0, 5, 0}};
    assert_int_equal(flash_plan_build(&p, bad2.data(), 1, s, err, sizeof err), -1);
    printf("# refused: %s\n", err);
    std::vector<AttnSegment> bad3 = {{-1, 10, 0, 10, 0}};
    assert_int_equal(flash_plan_build(&p, bad3.data(), 1, s, err, sizeof err), -1);
}

/* ---------------------------------------------------------------------------------------------- */
/* Attention                                                                                       */

/* A problem: segments, shapes, bf16 inputs in a fused [T, (H + 2 Hkv) D] array, float copies of the
 * same values for the reference. */
struct Problem {
    int H, Hkv, D;
    int64_t T, qkv_stride, o_stride;
    std::vector<AttnSegment> segs;
    std::vector<uint16_t> qkv, dout;   /* bf16 */
    std::vector<float> qkv_f, dout_f;  /* the same values */
    AttnShape shape() const { return AttnShape{H, Hkv, D, qkv_stride, qkv_stride, o_stride}; }
};

static Problem make_problem(int H, int Hkv, int D, std::vector<AttnSegment> segs)
{
    Problem pr;
    pr.H = H, pr.Hkv = Hkv, pr.D = D, pr.segs = segs;
    pr.T = 0;
    for (const AttnSegment &g : segs)
        pr.T = std::max(pr.T, std::max(g.q_row + g.q_len, g.kv_row + g.kv_len));
    pr.qkv_stride = (int64_t)(H + 2 * Hkv) * D;
    pr.o_stride = (int64_t)H * D + 24; /* out's rows longer than its heads (a multiple of 8) */
    pr.qkv.resize((size_t)(pr.T * pr.qkv_stride));
    pr.qkv_f.resize(pr.qkv.size());
    for (size_t i = 0; i < pr.qkv.size(); i++) {
        pr.qkv[i] = bf16(randn());
        pr.qkv_f[i] = unbf16(pr.qkv[i]);
    }
    pr.dout.resize((size_t)(pr.T * pr.o_stride));
    pr.dout_f.resize(pr.dout.size());
    for (size_t i = 0; i < pr.dout.size(); i++) {
        pr.dout[i] = bf16(randn());
        pr.dout_f[i] = unbf16(pr.dout[i]);
    }
    return pr;
}

/* ||x - ref|| / ||ref|| over the given rows and columns [col0, col0 + cols) of row-major arrays. */
template <class X>
static double rel_error(const X &x, const std::vector<float> &ref, int64_t stride, int64_t col0, int64_t cols,
                        const std::vector<int64_t> &rows, float (*get)(const X &, size_t))
{
    double num = 0, den = 0;
    for (int64_t r : rows)
        for (int64_t c = col0; c < col0 + cols; c++) {
            size_t i = (size_t)(r * stride + c);
            double d = (double)get(x, i) - ref[i];
            num += d * d;
            den += (double)ref[i] * ref[i];
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static float get_f(const std::vector<float> &v, size_t i) { return v[i]; }
static float get_bf16(const std::vector<uint16_t> &v, size_t i) { return unbf16(v[i]); }

struct Results {
    std::vector<uint16_t> out;
    std::vector<float> lse, dq, dk, dv; /* dq in q's columns of a [T, qkv_stride] array, dk, dv likewise */
};

/* The global buffers of one emulated attention: the plan's lists and the inputs (read-only), out,
 * then lse, Delta, dq, dk and dv (float32, in that order). */
static void emu_buffers(const FlashPlan &plan, const void *qkv, size_t qkv_bytes, const void *dout, size_t dout_bytes,
                        const void *out, size_t out_bytes, std::initializer_list<const std::vector<float> *> floats)
{
    static const char *const names[] = {"lse", "delta", "dq", "dk", "dv"};
    flash_emu_clear_buffers();
    flash_emu_buffer(plan.segs.data(), plan.segs.size() * sizeof(int4), false, "segs");
    flash_emu_buffer(plan.items.data(), plan.items.size() * sizeof(int2), false, "items");
    flash_emu_buffer(qkv, qkv_bytes, false, "qkv");
    flash_emu_buffer(dout, dout_bytes, false, "dout");
    flash_emu_buffer(out, out_bytes, true, "out");
    size_t i = 0;
    for (const std::vector<float> *f : floats)
        flash_emu_buffer(f->data(), f->size() * 4, true, names[i++]);
}

/* The emulated kernels on one problem, exactly as cuda_flash.cu launches them. */
template <int D> static void emulate(const Problem &pr, bool deterministic, Results *res, bool backward)
{
    using Tiles = FlashTiles<D>;
    FlashPlan plan;
    char err[200];
    assert_int_equal(flash_plan_build(&plan, pr.segs.data(), (int64_t)pr.segs.size(), flash_plan_shape<Tiles>(), err,
                                      sizeof err),
                     0);
    const float scale = 1.0f / sqrtf((float)D);
    res->out.assign((size_t)(pr.T * pr.o_stride), 0xffff); /* NaN: rows never written show */
    res->lse.assign((size_t)(pr.T * pr.H), NAN);
    res->dq.assign(pr.qkv.size(), 0.0f);
    res->dk.assign(pr.qkv.size(), 0.0f);
    res->dv.assign(pr.qkv.size(), 0.0f);
    std::vector<float> delta((size_t)(plan.rows * pr.H), NAN);
    const uint16_t *q = pr.qkv.data(), *k = q + pr.H * D, *v = k + pr.Hkv * D;
    emu_buffers(plan, pr.qkv.data(), pr.qkv.size() * 2, pr.dout.data(), pr.dout.size() * 2, res->out.data(),
                res->out.size() * 2, {&res->lse, &delta, &res->dq, &res->dk, &res->dv});
    FlashFwdArgs fa = {plan.segs.data(), plan.items.data() + plan.fwd_begin, q, k, v, res->out.data(),
                       res->lse.data(), pr.H, pr.H / pr.Hkv, pr.qkv_stride, pr.qkv_stride, pr.o_stride,
                       scale * 1.4426950408889634f};
    using F = typename Tiles::Fwd;
    const bool full = plan.n_full > 0; /* a list of full segments: the kernels' FULL instances */
    expect_clean(flash_emu_launch("fwd", plan.fwd_count * pr.H, F::THREADS, F::SMEM,
                                  [&](unsigned char *smem, int64_t b, int tid) {
                                      full ? flash_fwd_cta<F, true>(fa, smem, b, tid)
                                           : flash_fwd_cta<F, false>(fa, smem, b, tid);
                                  }),
                 "forward");
    if (!backward)
        return;
    /* dq, dk, dv in the columns of q, k, v of fused arrays, as the model's gradient of qkv */
    FlashBwdArgs ba = {plan.segs.data(), nullptr, q, k, v, res->out.data(), pr.dout.data(), res->lse.data(),
                       delta.data(), res->dq.data(), res->dk.data() + pr.H * D, res->dv.data() + (pr.H + pr.Hkv) * D,
                       pr.H, pr.H / pr.Hkv, pr.qkv_stride, pr.qkv_stride, pr.o_stride, scale,
                       scale * 1.4426950408889634f, 0};
    using K = typename Tiles::Dkdv;
    using Q = typename Tiles::Dq;
    ba.items = plan.items.data() + plan.dq_begin;
    expect_clean(flash_emu_launch("delta", plan.dq_count, 256, 0,
                                  [&](unsigned char *, int64_t b, int tid) { flash_delta_cta<D, Q::BM, 256>(ba, b, tid); }),
                 "delta");
    const int64_t waves = (int64_t)plan.wave_begin.size() - 1;
    if (deterministic) {
        for (int64_t w = 0; w < waves; w++) {
            ba.items = plan.items.data() + plan.wave_begin[(size_t)w];
            ba.kv_atomic = 0;
            const int64_t n = plan.wave_begin[(size_t)w + 1] - plan.wave_begin[(size_t)w];
            expect_clean(flash_emu_launch("dkdv", n * pr.Hkv, K::THREADS, K::SMEM,
                                          [&](unsigned char *smem, int64_t b, int tid) {
                                              full ? flash_dkdv_cta<K, false, true>(ba, smem, b, tid)
                                                   : flash_dkdv_cta<K, false, false>(ba, smem, b, tid);
                                          }),
                         "dk, dv (deterministic)");
        }
        ba.items = plan.items.data() + plan.dq_begin;
        expect_clean(flash_emu_launch("dq", plan.dq_count * pr.H, Q::THREADS, Q::SMEM,
                                      [&](unsigned char *smem, int64_t b, int tid) {
                                          full ? flash_dq_cta<Q, true>(ba, smem, b, tid)
                                               : flash_dq_cta<Q, false>(ba, smem, b, tid);
                                      }),
                     "dq (deterministic)");
    } else {
        ba.items = plan.items.data() + plan.wave_begin[0];
        ba.kv_atomic = waves > 1;
        const int64_t n = plan.wave_begin[(size_t)waves] - plan.wave_begin[0];
        expect_clean(flash_emu_launch("dkdv+dq", n * pr.Hkv, K::THREADS, K::SMEM,
                                      [&](unsigned char *smem, int64_t b, int tid) {
                                          full ? flash_dkdv_cta<K, true, true>(ba, smem, b, tid)
                                               : flash_dkdv_cta<K, true, false>(ba, smem, b, tid);
                                      }),
                     "dk, dv, dq (atomic)");
    }
}

/* The reference: the CPU backend on float copies of the same bf16 values (the forward's out as the
 * reference computes it; the backward from the reference's own out and lse). */
struct Reference {
    std::vector<float> out, lse, dq, dk, dv;
};

static Reference reference(const Problem &pr)
{
    Reference r;
    AttnShape a = pr.shape();
    const float *q = pr.qkv_f.data(), *k = q + pr.H * pr.D, *v = k + pr.Hkv * pr.D;
    r.out.assign((size_t)(pr.T * pr.o_stride), 0.0f);
    r.lse.assign((size_t)(pr.T * pr.H), 0.0f);
    cpu_attention_fwd(r.out.data(), r.lse.data(), q, k, v, pr.segs.data(), (int64_t)pr.segs.size(), a);
    r.dq.assign(pr.qkv_f.size(), 0.0f);
    r.dk.assign(pr.qkv_f.size(), 0.0f);
    r.dv.assign(pr.qkv_f.size(), 0.0f);
    cpu_attention_bwd(r.dq.data(), r.dk.data() + pr.H * pr.D, r.dv.data() + (pr.H + pr.Hkv) * pr.D, pr.dout_f.data(),
                      r.out.data(), r.lse.data(), q, k, v, pr.segs.data(), (int64_t)pr.segs.size(), a);
    return r;
}

/* Rows with queries, rows with keys. */
static void rows_of(const Problem &pr, std::vector<int64_t> *qrows, std::vector<int64_t> *krows)
{
    std::vector<char> q((size_t)pr.T, 0), k((size_t)pr.T, 0);
    for (const AttnSegment &g : pr.segs) {
        for (int64_t i = 0; i < g.q_len; i++)
            q[(size_t)(g.q_row + i)] = 1;
        if (g.q_len)
            for (int64_t j = 0; j < g.kv_len; j++)
                k[(size_t)(g.kv_row + j)] = 1;
    }
    for (int64_t t = 0; t < pr.T; t++) {
        if (q[(size_t)t])
            qrows->push_back(t);
        if (k[(size_t)t])
            krows->push_back(t);
    }
}

/* Prints and returns in e the relative errors of dq, dk, dv (in the q, k and v columns of fused
 * arrays) against the reference's; fails when a gradient was written outside its columns. */
static void gradient_errors(const char *name, const Problem &pr, const std::vector<float> &dq,
                            const std::vector<float> &dk, const std::vector<float> &dv, const Reference &ref,
                            double e[3])
{
    std::vector<int64_t> qrows, krows;
    rows_of(pr, &qrows, &krows);
    const int64_t HD = (int64_t)pr.H * pr.D, KD = (int64_t)pr.Hkv * pr.D;
    e[0] = rel_error(dq, ref.dq, pr.qkv_stride, 0, HD, qrows, get_f);
    e[1] = rel_error(dk, ref.dk, pr.qkv_stride, HD, KD, krows, get_f);
    e[2] = rel_error(dv, ref.dv, pr.qkv_stride, HD + KD, KD, krows, get_f);
    printf("  dq %.2e  dk %.2e  dv %.2e", e[0], e[1], e[2]);
    /* nothing outside the q, k, v columns */
    for (size_t i = 0; i < dq.size(); i++) {
        int64_t col = (int64_t)(i % (size_t)pr.qkv_stride);
        if ((col >= HD && dq[i] != 0) || ((col < HD || col >= HD + KD) && dk[i] != 0) || (col < HD + KD && dv[i] != 0)) {
            printf("\n");
            fail_msg("%s: a gradient written outside its columns (float %zu)", name, i);
        }
    }
}

static void check_against_reference(const char *name, const Problem &pr, const Results &res, const Reference &ref,
                                    bool backward)
{
    std::vector<int64_t> qrows, krows;
    rows_of(pr, &qrows, &krows);
    const int64_t HD = (int64_t)pr.H * pr.D;
    double e_out = rel_error(res.out, ref.out, pr.o_stride, 0, HD, qrows, get_bf16);
    double e_lse = rel_error(res.lse, ref.lse, pr.H, 0, pr.H, qrows, get_f);
    printf("# %-34s out %.2e  lse %.2e", name, e_out, e_lse);
    bool ok = e_out <= 1e-2 && e_lse <= 1e-5;
    if (backward) {
        double e[3];
        gradient_errors(name, pr, res.dq, res.dk, res.dv, ref, e);
        ok = ok && e[0] <= 2e-2 && e[1] <= 2e-2 && e[2] <= 2e-2;
    }
    printf("\n");
    if (!ok)
        fail_msg("%s: error over tolerance", name);
}

/* The segment lists of the tests: documents of 1, 63, 64, 65, 130 tokens; a document of 200 keys
 * whose queries are two CP chunks ([20, 60) and [150, 200): q_len < kv_len, sharing keys); a
 * chunk of the second half of a document of 70. */
static std::vector<AttnSegment> mixed_segments()
{
    std::vector<AttnSegment> s;
    int64_t row = 0;
    for (int len : {1, 63, 64, 65, 130}) {
        s.push_back({row, len, row, len, 0});
        row += len;
    }
    s.push_back({row + 20, 40, row, 60, 0});
    s.push_back({row + 150, 50, row, 200, 0});
    row += 200;
    s.push_back({row + 35, 35, row, 70, 0});
    return s;
}

template <int D> static void check_case(const char *name, int H, int Hkv, std::vector<AttnSegment> segs)
{
    flash_emu_reset();
    Problem pr = make_problem(H, Hkv, D, segs);
    Reference ref = reference(pr);
    Results det, atomic;
    emulate<D>(pr, true, &det, true);
    char label[80];
    snprintf(label, sizeof label, "%s, deterministic", name);
    check_against_reference(label, pr, det, ref, true);
    emulate<D>(pr, false, &atomic, true);
    snprintf(label, sizeof label, "%s, atomic", name);
    check_against_reference(label, pr, atomic, ref, true);
    FlashEmuStats st = flash_emu_stats();
    printf("#   %lld blocks, %lld mma, ldmatrix %lld wavefronts (%lld conflict-free), shared 4-byte %lld (%lld)\n",
           (long long)st.blocks, (long long)st.mma, (long long)st.ldsm_wavefronts, (long long)st.ldsm_ideal,
           (long long)st.shared_wavefronts, (long long)st.shared_ideal);
    assert_int_equal(st.ldsm_wavefronts, st.ldsm_ideal);
}

/* Under AddressSanitizer (make test's asan build, where every allocation of the emulator is
 * traced) the larger cases take minutes: that build runs the smallest case of each head size, the
 * release build runs them all. */
#if defined(__SANITIZE_ADDRESS__)
enum { FLASH_EMU_ALL_CASES = 0 };
#else
enum { FLASH_EMU_ALL_CASES = 1 };
#endif

static void test_attention_d64(void **state)
{
    (void)state;
    if (FLASH_EMU_ALL_CASES)
        check_case<64>("D 64, H 4, Hkv 1 (GQA 4)", 4, 1, mixed_segments());
    check_case<64>("D 64, H 2, Hkv 2 (MHA)", 2, 2, mixed_segments());
}

static void test_attention_d128(void **state)
{
    (void)state;
    if (FLASH_EMU_ALL_CASES)
        check_case<128>("D 128, H 8, Hkv 1 (GQA 8)", 8, 1, mixed_segments());
    check_case<128>("D 128, H 4, Hkv 2 (GQA 2)", 4, 2, {{0, 150, 0, 150, 0}, {150, 1, 150, 1, 0}, {151, 64, 151, 64, 0}});
}

/* Full segments (every query sees every key: context parallelism's key blocks before the queries),
 * as one list: whole key tiles, a last tile cut short (67 and 130 keys), one key, one query, fewer
 * keys than queries, and two segments that share their keys (two query chunks of one document
 * against one rank's block). */
static std::vector<AttnSegment> full_segments()
{
    return {{300, 60, 0, 130, 1}, {360, 30, 130, 67, 1}, {390, 1, 0, 1, 1}, {391, 100, 200, 10, 1},
            {491, 64, 0, 64, 1},  {555, 40, 0, 64, 1}};
}

static void test_attention_full(void **state)
{
    (void)state;
    check_case<64>("D 64, H 4, Hkv 2, full blocks", 4, 2, full_segments());
    if (FLASH_EMU_ALL_CASES)
        check_case<128>("D 128, H 4, Hkv 1, full blocks", 4, 1, full_segments());
}

/* The same launches under every schedule and cp.async timing: the same bits. */
static void test_schedules(void **state)
{
    (void)state;
    flash_emu_reset();
    Problem pr = make_problem(4, 2, 64, {{0, 70, 0, 70, 0}, {70, 30, 70, 100, 0}, {100, 40, 70, 70, 0}});
    Results first;
    bool have = false;
    for (int sched = 0; sched < 3; sched++)
        for (int lazy = 0; lazy < 2; lazy++)
            for (int det = 0; det < 2; det++) {
                FlashEmuConfig c;
                c.schedule = (FlashEmuSchedule)sched;
                c.lazy_copies = lazy;
                flash_emu_configure(c);
                Results r;
                emulate<64>(pr, det, &r, true);
                if (!det) /* atomic adds in emulation run in block order: the same bits too */
                    continue;
                if (!have) {
                    first = r;
                    have = true;
                    continue;
                }
                assert_memory_equal(r.out.data(), first.out.data(), r.out.size() * 2);
                assert_memory_equal(r.lse.data(), first.lse.data(), r.lse.size() * 4);
                assert_memory_equal(r.dq.data(), first.dq.data(), r.dq.size() * 4);
                assert_memory_equal(r.dk.data(), first.dk.data(), r.dk.size() * 4);
                assert_memory_equal(r.dv.data(), first.dv.data(), r.dv.size() * 4);
            }
    flash_emu_configure(FlashEmuConfig());
    printf("# 3 schedules x 2 cp.async timings: the same bits\n");
}

/* ---------------------------------------------------------------------------------------------- */
/* The float32 reference kernels                                                                   */

/* The reference kernels (cuda/cuda_attention_ref.cuh) on the float values of a problem, launched as
 * cuda_attention.cu launches them: forward, Delta, then the dK/dV launches and dQ (deterministic:
 * one dK/dV launch per wave, then the dQ pass) from the emulated forward's out and lse. Returns
 * the floating-point atomic adds of the backward's launches. */
template <class C> static int64_t emulate_reference(const Problem &pr, bool deterministic, Reference *res)
{
    FlashPlan plan;
    char err[200];
    assert_int_equal(flash_plan_build(&plan, pr.segs.data(), (int64_t)pr.segs.size(), ref_attn_plan_shape<C>(), err,
                                      sizeof err),
                     0);
    res->out.assign((size_t)(pr.T * pr.o_stride), NAN); /* rows never written show */
    res->lse.assign((size_t)(pr.T * pr.H), NAN);
    res->dq.assign(pr.qkv_f.size(), 0.0f);
    res->dk.assign(pr.qkv_f.size(), 0.0f);
    res->dv.assign(pr.qkv_f.size(), 0.0f);
    std::vector<float> delta((size_t)(plan.rows * pr.H), NAN);
    emu_buffers(plan, pr.qkv_f.data(), pr.qkv_f.size() * 4, pr.dout_f.data(), pr.dout_f.size() * 4, res->out.data(),
                res->out.size() * 4, {&res->lse, &delta, &res->dq, &res->dk, &res->dv});
    const float *q = pr.qkv_f.data(), *k = q + pr.H * pr.D, *v = k + pr.Hkv * pr.D;
    RefAttnArgs a = {plan.segs.data(), plan.items.data() + plan.fwd_begin, q, k, v, res->out.data(), res->lse.data(),
                     pr.dout_f.data(), delta.data(), res->dq.data(), res->dk.data() + pr.H * pr.D,
                     res->dv.data() + (pr.H + pr.Hkv) * pr.D, pr.H, pr.H / pr.Hkv, pr.qkv_stride, pr.qkv_stride,
                     pr.o_stride, 1.0f / sqrtf((float)pr.D), 0};
    auto run = [&](const char *name, int64_t blocks, int smem, void (*cta)(const RefAttnArgs &, float *, int64_t, int)) {
        expect_clean(flash_emu_launch(name, blocks, C::THREADS, smem,
                                      [&](unsigned char *sm, int64_t b, int tid) { cta(a, (float *)sm, b, tid); }),
                     name);
    };
    run("reference forward", plan.fwd_count * pr.H, C::FWD_SMEM, ref_fwd_cta<C>);
    const int64_t atomics_before = flash_emu_stats().atomics;
    a.items = plan.items.data() + plan.dq_begin;
    expect_clean(flash_emu_launch("reference delta", plan.dq_count, C::THREADS, 0,
                                  [&](unsigned char *, int64_t b, int tid) {
                                      ref_delta_cta<C::D, C::BM, C::THREADS>(a, b, tid);
                                  }),
                 "reference delta");
    const int64_t waves = (int64_t)plan.wave_begin.size() - 1;
    if (deterministic) {
        for (int64_t w = 0; w < waves; w++) {
            a.items = plan.items.data() + plan.wave_begin[(size_t)w];
            run("reference dk, dv (deterministic)", (plan.wave_begin[(size_t)w + 1] - plan.wave_begin[(size_t)w]) * pr.Hkv,
                C::DKDV_SMEM, ref_dkdv_cta<C, false>);
        }
        a.items = plan.items.data() + plan.dq_begin;
        run("reference dq (deterministic)", plan.dq_count * pr.H, C::DQ_SMEM, ref_dq_cta<C>);
    } else {
        a.items = plan.items.data() + plan.wave_begin[0];
        a.kv_atomic = waves > 1;
        run("reference dk, dv, dq (atomic)", (plan.wave_begin[(size_t)waves] - plan.wave_begin[0]) * pr.Hkv,
            C::DKDV_SMEM, ref_dkdv_cta<C, true>);
    }
    return flash_emu_stats().atomics - atomics_before;
}

/* Forward and both backward modes of the reference at head size D against the CPU backend on the
 * same float32 values: within 1e-5 relative (float32 sums in another order); the deterministic
 * backward without a single atomic, and (the emulator's check) no float of dq, dk or dv written by
 * two blocks of one launch; the atomic one with atomics (the count is live). */
template <int D> static void check_reference_case(const char *name, int H, int Hkv, std::vector<AttnSegment> segs)
{
    using C = typename RefAttnTiles<D>::Cfg;
    flash_emu_reset();
    Problem pr = make_problem(H, Hkv, D, segs);
    Reference ref = reference(pr);
    std::vector<int64_t> qrows, krows;
    rows_of(pr, &qrows, &krows);
    for (int det = 1; det >= 0; det--) {
        Reference got;
        const int64_t atomics = emulate_reference<C>(pr, det, &got);
        double e_out = rel_error(got.out, ref.out, pr.o_stride, 0, (int64_t)H * D, qrows, get_f);
        double e_lse = rel_error(got.lse, ref.lse, pr.H, 0, pr.H, qrows, get_f), e[3];
        printf("# reference %-24s %-13s out %.2e  lse %.2e", name, det ? "deterministic" : "atomic", e_out, e_lse);
        gradient_errors(name, pr, got.dq, got.dk, got.dv, ref, e);
        printf("  atomics %lld\n", (long long)atomics);
        assert_true(e_out <= 1e-5 && e_lse <= 1e-5 && e[0] <= 1e-5 && e[1] <= 1e-5 && e[2] <= 1e-5);
        if (det)
            assert_int_equal(atomics, 0);
        else
            assert_true(atomics > 0);
    }
}

static void test_reference_kernels(void **state)
{
    (void)state;
    check_reference_case<16>("D 16, H 4, Hkv 2", 4, 2, mixed_segments()); /* test/test_cuda_model.c's model */
    check_reference_case<16>("D 16, H 4, Hkv 2, full blocks", 4, 2, full_segments());
    if (!FLASH_EMU_ALL_CASES)
        return;
    check_reference_case<64>("D 64, H 4, Hkv 1", 4, 1, mixed_segments());
    check_reference_case<8>("D 8, H 2, Hkv 2", 2, 2, mixed_segments());
    check_reference_case<256>("D 256, H 2, Hkv 1", 2, 1, {{0, 40, 0, 40, 0}, {40, 17, 40, 50, 0}, {57, 20, 40, 70, 0}});
}

/* The deterministic reference under every schedule: the same bits. */
static void test_reference_schedules(void **state)
{
    (void)state;
    flash_emu_reset();
    Problem pr = make_problem(4, 2, 16, {{0, 70, 0, 70, 0}, {70, 30, 70, 100, 0}, {100, 40, 70, 70, 0}});
    Reference first;
    for (int sched = 0; sched < 3; sched++) {
        FlashEmuConfig c;
        c.schedule = (FlashEmuSchedule)sched;
        flash_emu_configure(c);
        Reference r;
        emulate_reference<RefAttnTiles<16>::Cfg>(pr, true, &r);
        if (sched == 0) {
            first = r;
            continue;
        }
        const std::vector<float> *a[5] = {&r.out, &r.lse, &r.dq, &r.dk, &r.dv}, *b[5] = {&first.out, &first.lse,
                                                                                        &first.dq, &first.dk, &first.dv};
        for (int i = 0; i < 5; i++)
            assert_memory_equal(a[i]->data(), b[i]->data(), a[i]->size() * 4);
    }
    flash_emu_configure(FlashEmuConfig());
    printf("# reference, deterministic: 3 schedules, the same bits\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fragments),     cmocka_unit_test(test_mma),
        cmocka_unit_test(test_plans),         cmocka_unit_test(test_attention_d64),
        cmocka_unit_test(test_attention_d128), cmocka_unit_test(test_attention_full),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_reference_kernels), cmocka_unit_test(test_reference_schedules),
    };
    return cmocka_run_group_tests_name("flash_emulated", tests, NULL, NULL);
}
