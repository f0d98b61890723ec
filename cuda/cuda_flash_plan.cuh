/*
 * cuda/cuda_flash_plan.cuh - what the flash attention kernels are given: their tile shapes (one set
 * per head size), their arguments, and the work lists built on the host from the segments.
 *
 * Work lists. A kernel's blocks walk a list of items (segment, first row of a tile): the forward and
 * the dQ kernel take tiles of query rows, one block per (item, query head); the dK/dV kernel takes
 * tiles of key rows, one block per (item, kv head). Items are sorted by their cost, longest first
 * (a counting sort: linear), so that the long tiles of a long document start first and the short
 * ones fill the gaps at the end. Block b of a launch is item b / heads, head b % heads: the heads
 * of one item run side by side and share its keys and values in L2.
 * Waves. Segments that share key rows (two query chunks of one document under context
 * parallelism) add to the same dK, dV rows. The segments are split into waves in which no two share
 * a key row: the deterministic backward launches the dK/dV kernel once per wave, so that every
 * dK, dV element is written by one block of a launch and the waves add in a fixed order.
 * Host work per call is linear in the number of segments and tiles; the plan is uploaded once per
 * distinct segment list (cuda_flash.cu keeps the recent ones).
 */
#ifndef WLB_CUDA_CUDA_FLASH_PLAN_CUH
#define WLB_CUDA_CUDA_FLASH_PLAN_CUH

#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "engine/ops.h"

#ifndef FLASH_EMULATE
#include <vector_types.h> /* int2, int4 (the emulator defines its own) */
#endif

/* A segment as the kernels read it: int4 {q_row, q_len, kv_row, kv_len}, a `full` segment's (every
 * query sees every key) with kv_len negated; an item: int2 {segment index, first row of the tile (a
 * query row for the forward and dQ lists, a key row for dK/dV), relative to the segment}. */
#ifdef FLASH_EMULATE
#define FLASH_SEG_FN inline
#else
#define FLASH_SEG_FN __host__ __device__ __forceinline__
#endif
/* Its keys, and the offset of its causal limit: query i sees key j when j < keys and j <= off + i
 * (off = kv_len - q_len; a full segment's kv_len - 1, which no key passes). */
FLASH_SEG_FN int flash_seg_keys(int4 g) { return g.w < 0 ? -g.w : g.w; }
FLASH_SEG_FN int flash_seg_off(int4 g) { return g.w < 0 ? -g.w - 1 : g.w - g.y; }

/* ---------------------------------------------------------------------------------------------- */
/* Tile shapes                                                                                     */

/* Forward: BM query rows a block, WARPS warps of BM / WARPS rows each, key tiles of BN rows (double
 * buffered); QREG keeps the warp's Q fragments in registers for the whole block. */
template <int D_, int BM_, int BN_, int WARPS_, bool QREG_> struct FlashFwdCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_, WARPS = WARPS_, THREADS = 32 * WARPS;
    static constexpr bool QREG = QREG_;
    static constexpr int MT = BM / WARPS / 16; /* 16-row tiles of a warp */
    static constexpr int SMEM = 2 * (BM * D + 4 * BN * D); /* bytes: Q, K[2], V[2] */
    static_assert(BM % (16 * WARPS) == 0 && BN % 16 == 0 && D % 64 == 0, "forward tile shape");
};

/* dK, dV: BN key rows a block, query tiles of BM rows (double buffered). Three warp layouts:
 *   1. S = Q K^T and dP = dO V^T (BM x BN): WM1 warps along queries, WARPS / WM1 along keys;
 *   2. dV += P^T dO and dK += dS^T Q (BN x D): WM2 warps along keys, WARPS / WM2 along D;
 *   3. (atomic mode) dQ += dS K (BM x D): WM3 warps along queries, WARPS / WM3 along D.
 * P and dS go through shared memory (bf16) between 1 and 2/3. */
template <int D_, int BM_, int BN_, int WARPS_, int WM1_, int WM2_, int WM3_> struct FlashDkdvCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_, WARPS = WARPS_, THREADS = 32 * WARPS;
    static constexpr int WM1 = WM1_, WN1 = WARPS / WM1, TM1 = BM / WM1, TN1 = BN / WN1, MT1 = TM1 / 16, NT1 = TN1 / 8;
    static constexpr int WM2 = WM2_, WN2 = WARPS / WM2, TM2 = BN / WM2, TN2 = D / WN2, MT2 = TM2 / 16, NT2 = TN2 / 8;
    static constexpr int WM3 = WM3_, WN3 = WARPS / WM3, TM3 = BM / WM3, TN3 = D / WN3, MT3 = TM3 / 16, NT3 = TN3 / 8;
    /* bytes: K, V; Q[2], dO[2]; P, dS; lse[2], Delta[2] */
    static constexpr int SMEM = 2 * (2 * BN * D + 4 * BM * D + 2 * BM * BN) + 4 * 4 * BM;
    static_assert(WARPS % WM1 == 0 && WARPS % WM2 == 0 && WARPS % WM3 == 0, "warp layouts");
    static_assert(TM1 % 16 == 0 && TN1 % 16 == 0 && TM2 % 16 == 0 && TN2 % 16 == 0 && TM3 % 16 == 0 &&
                      TN3 % 16 == 0,
                  "warp tiles are whole 16 x 16 blocks");
    static_assert(BN % 64 == 0 && D % 64 == 0 && BM <= THREADS, "dK/dV tile shape");
};

/* dQ (deterministic backward): like the forward, BM query rows a block, key tiles of BN rows. */
template <int D_, int BM_, int BN_, int WARPS_> struct FlashDqCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_, WARPS = WARPS_, THREADS = 32 * WARPS;
    static constexpr int MT = BM / WARPS / 16;
    static constexpr int SMEM = 2 * (2 * BM * D + 4 * BN * D); /* bytes: Q, dO, K[2], V[2] */
    static_assert(BM % (16 * WARPS) == 0 && BN % 16 == 0 && D % 64 == 0, "dQ tile shape");
};

/* The shapes of each head size (their registers and shared memory: see the report of
 * `-Xptxas -v`, quoted in cuda_flash.cu). */
template <int D> struct FlashTiles;
template <> struct FlashTiles<64> {
    using Fwd = FlashFwdCfg<64, 128, 64, 4, true>;
    using Dkdv = FlashDkdvCfg<64, 64, 128, 8, 2, 4, 4>;
    using Dq = FlashDqCfg<64, 64, 64, 4>;
};
template <> struct FlashTiles<128> {
    using Fwd = FlashFwdCfg<128, 128, 32, 4, false>;
    using Dkdv = FlashDkdvCfg<128, 64, 128, 8, 2, 4, 4>;
    using Dq = FlashDqCfg<128, 64, 64, 4>;
};

/* ---------------------------------------------------------------------------------------------- */
/* Kernel arguments (device pointers; bf16 arrays as uint16_t)                                     */

struct FlashFwdArgs {
    const int4 *segs;
    const int2 *items;
    const uint16_t *q, *k, *v;
    uint16_t *out;
    float *lse;
    int n_heads, group; /* group: query heads per kv head */
    int64_t q_stride, kv_stride, o_stride;
    float scale_log2; /* log2(e) / sqrt(D): scores in base 2 */
};

struct FlashBwdArgs {
    const int4 *segs;
    const int2 *items;
    const uint16_t *q, *k, *v, *out, *dout;
    const float *lse;
    float *delta; /* rowsum(dout * out), laid out as lse: [row * n_heads + h] */
    float *dq, *dk, *dv;
    int n_heads, group;
    int64_t q_stride, kv_stride, o_stride;
    float scale, scale_log2;
    int kv_atomic; /* dk, dv added with atomics (segments of this launch share keys) */
};

/* ---------------------------------------------------------------------------------------------- */
/* Work lists                                                                                      */

/* The tile sizes the lists are cut by. */
struct FlashPlanShape {
    int fwd_bm, fwd_bn; /* forward: query tile, key tile */
    int dq_bm, dq_bn;   /* dQ and Delta: query tile, key tile */
    int kv_bn, kv_bm;   /* dK/dV: key tile, query tile */
};

template <class Tiles> inline FlashPlanShape flash_plan_shape()
{
    return FlashPlanShape{Tiles::Fwd::BM, Tiles::Fwd::BN, Tiles::Dq::BM, Tiles::Dq::BN, Tiles::Dkdv::BN,
                          Tiles::Dkdv::BM};
}

struct FlashPlan {
    std::vector<int4> segs;  /* the segments with queries, as int32 */
    std::vector<int2> items; /* forward list, then dQ list, then the dK/dV lists of every wave */
    int64_t fwd_begin = 0, fwd_count = 0, dq_begin = 0, dq_count = 0;
    std::vector<int64_t> wave_begin; /* dK/dV items of wave w: [wave_begin[w], wave_begin[w + 1]) */
    int64_t rows = 0;                /* 1 + the last query row: rows of lse and Delta */
    int64_t max_items = 0;           /* the longest list */
    int64_t n_full = 0;              /* how many of segs are full (every query sees every key) */
};

/* Appends the items of one list sorted by cost, longest first (stable: equal costs keep their
 * order). cost[i] >= 1. */
inline void flash_sort_items(std::vector<int2> &out, const std::vector<int2> &items, const std::vector<int32_t> &cost)
{
    int32_t top = 0;
    for (int32_t c : cost)
        top = c > top ? c : top;
    std::vector<int64_t> start((size_t)top + 2, 0);
    for (int32_t c : cost)
        start[(size_t)(top - c) + 1]++; /* bucket top - c: the costliest first */
    for (size_t b = 1; b < start.size(); b++)
        start[b] += start[b - 1];
    size_t base = out.size();
    out.resize(base + items.size());
    for (size_t i = 0; i < items.size(); i++)
        out[base + (size_t)start[(size_t)(top - cost[i])]++] = items[i];
}

static inline int64_t flash_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Builds the lists. Returns 0, or -1 with a message in err for segments the kernels cannot run:
 * a negative row or length, kv_len < q_len (a causal one), no key (a full one), rows past 2^31, or
 * two segments with a query row in common (each query row has one segment: its output and dQ have
 * one writer). */
inline int flash_plan_build(FlashPlan *p, const AttnSegment *segs, int64_t n_segs, FlashPlanShape s, char *err,
                            size_t err_size)
{
    *p = FlashPlan();
    const int64_t LIMIT = INT32_MAX - 1024; /* rows and tiles stay in int32, with room for a tile */
    std::vector<int64_t> order;            /* the segments with queries */
    for (int64_t i = 0; i < n_segs; i++) {
        const AttnSegment &g = segs[i];
        if (g.q_row < 0 || g.q_len < 0 || g.kv_row < 0 || g.kv_len < (g.full ? 1 : g.q_len) ||
            g.q_row + g.q_len > LIMIT || g.kv_row + g.kv_len > LIMIT || (g.full != 0 && g.full != 1)) {
            snprintf(err, err_size, "segment %lld (q_row %lld, q_len %lld, kv_row %lld, kv_len %lld, full %lld) out of range",
                     (long long)i, (long long)g.q_row, (long long)g.q_len, (long long)g.kv_row, (long long)g.kv_len,
                     (long long)g.full);
            return -1;
        }
        if (g.q_len == 0)
            continue;
        order.push_back(i);
        p->n_full += g.full != 0;
        p->segs.push_back(int4{(int)g.q_row, (int)g.q_len, (int)g.kv_row, g.full ? -(int)g.kv_len : (int)g.kv_len});
        p->rows = std::max(p->rows, g.q_row + g.q_len);
    }
    const int64_t n = (int64_t)p->segs.size();
    /* Query rows are disjoint: sorted by q_row, each ends before the next begins. */
    {
        std::vector<int32_t> by_q((size_t)n);
        for (int64_t i = 0; i < n; i++)
            by_q[(size_t)i] = (int32_t)i;
        auto q_less = [&](int32_t a, int32_t b) { return p->segs[(size_t)a].x < p->segs[(size_t)b].x; };
        if (!std::is_sorted(by_q.begin(), by_q.end(), q_less))
            std::stable_sort(by_q.begin(), by_q.end(), q_less);
        for (int64_t i = 1; i < n; i++) {
            const int4 &a = p->segs[(size_t)by_q[(size_t)i - 1]], &b = p->segs[(size_t)by_q[(size_t)i]];
            if (a.x + a.y > b.x) {
                snprintf(err, err_size, "segments %lld and %lld share query rows", (long long)order[(size_t)by_q[(size_t)i - 1]],
                         (long long)order[(size_t)by_q[(size_t)i]]);
                return -1;
            }
        }
    }
    std::vector<int2> list;
    std::vector<int32_t> cost;
    /* Query tiles of bm rows; cost: key tiles of bn rows the tile's last row sees. */
    auto query_list = [&](int bm, int bn) {
        list.clear();
        cost.clear();
        for (int64_t i = 0; i < n; i++) {
            const int4 &g = p->segs[(size_t)i];
            for (int start = 0; start < g.y; start += bm) {
                int64_t rows = std::min<int64_t>(bm, g.y - start);
                list.push_back(int2{(int)i, start});
                cost.push_back((int32_t)flash_cdiv(std::min<int64_t>(flash_seg_keys(g), (int64_t)flash_seg_off(g) + start + rows), bn));
            }
        }
    };
    p->fwd_begin = 0;
    query_list(s.fwd_bm, s.fwd_bn);
    flash_sort_items(p->items, list, cost);
    p->fwd_count = (int64_t)p->items.size();
    p->dq_begin = p->fwd_count;
    query_list(s.dq_bm, s.dq_bn);
    flash_sort_items(p->items, list, cost);
    p->dq_count = (int64_t)p->items.size() - p->dq_begin;
    p->max_items = std::max(p->fwd_count, p->dq_count);
    /* Waves: first fit in the order of kv_row (intervals: first fit uses as many waves as the
     * deepest overlap). */
    std::vector<int32_t> by_kv((size_t)n), wave_of((size_t)n);
    for (int64_t i = 0; i < n; i++)
        by_kv[(size_t)i] = (int32_t)i;
    auto kv_less = [&](int32_t a, int32_t b) { return p->segs[(size_t)a].z < p->segs[(size_t)b].z; };
    if (!std::is_sorted(by_kv.begin(), by_kv.end(), kv_less))
        std::stable_sort(by_kv.begin(), by_kv.end(), kv_less);
    std::vector<int64_t> wave_end; /* the end of the last key range placed in each wave */
    for (int32_t i : by_kv) {
        const int4 &g = p->segs[(size_t)i];
        size_t w = 0;
        while (w < wave_end.size() && wave_end[w] > g.z)
            w++;
        if (w == wave_end.size())
            wave_end.push_back(0);
        wave_end[w] = (int64_t)g.z + flash_seg_keys(g);
        wave_of[(size_t)i] = (int32_t)w;
    }
    for (size_t w = 0; w < wave_end.size(); w++) {
        p->wave_begin.push_back((int64_t)p->items.size());
        list.clear();
        cost.clear();
        for (int64_t i = 0; i < n; i++) {
            if (wave_of[(size_t)i] != (int32_t)w)
                continue;
            const int4 &g = p->segs[(size_t)i];
            int off = flash_seg_off(g);
            for (int j0 = 0; j0 < flash_seg_keys(g); j0 += s.kv_bn) {
                int first = std::max(0, j0 - off); /* the first query that sees key j0 */
                list.push_back(int2{(int)i, j0});
                cost.push_back((int32_t)flash_cdiv(g.y - first, s.kv_bm));
            }
        }
        flash_sort_items(p->items, list, cost);
        p->max_items = std::max(p->max_items, (int64_t)p->items.size() - p->wave_begin.back());
    }
    p->wave_begin.push_back((int64_t)p->items.size());
    return 0;
}

#endif
