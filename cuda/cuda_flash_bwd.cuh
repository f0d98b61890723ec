/*
 * cuda/cuda_flash_bwd.cuh - the backward blocks of the flash attention kernels (FlashAttention-2's
 * algorithm). With the forward's P = softmax(S), S = Q K^T / sqrt(D), out = P V:
 *   Delta_i = dout_i . out_i                       (flash_delta_cta, first)
 *   P_ij = 2^(s_ij - lse_i log2 e)                 recomputed from the forward's lse (base 2 scores)
 *   dP_ij = dout_i . v_j
 *   dS_ij = P_ij (dP_ij - Delta_i)                 (the softmax's Jacobian; sum_j P_ij dP_ij = Delta_i)
 *   dV_j += sum_i P_ij dout_i,  dK_j += sum_i dS_ij q_i / sqrt(D),  dQ_i += sum_j dS_ij k_j / sqrt(D).
 * P and dS are rounded to bf16 as the operands of the products; everything sums in float32.
 *
 * flash_dkdv_cta: one block per (key tile of BN rows, kv head). It keeps K and V of its tile in
 * shared memory and dK, dV in registers, and walks every query head of the kv head's group and every
 * query tile that sees the keys (from the first query whose limit reaches the tile's first key):
 * products 1 (S, dP), 2 (dV, dK) and, in the atomic mode, 3 (dQ, added to dq with atomicAdd). At
 * the end it adds dK, dV to dk, dv: plainly when it is the only writer of those rows in the launch,
 * else with atomics.
 * flash_dq_cta (deterministic mode): one block per (query tile, query head), like the forward; it
 * recomputes S and dP and keeps dQ in registers, then adds it to dq. Every sum then runs in an order
 * fixed by the code, and every float of dq, dk, dv has one writer per launch: the same bits every
 * run. The price is S and dP computed twice: 7 products of the forward's size instead of 5.
 *
 * Masking (segment-relative rows): query i sees key j when i < q_len, j < kv_len and
 * j <= kv_len - q_len + i (FULL: a list of full segments, kv_len stored negated, every query sees
 * every key). Rows past the ends are zero in shared memory and masked out of P.
 */
#ifndef WLB_CUDA_CUDA_FLASH_BWD_CUH
#define WLB_CUDA_CUDA_FLASH_BWD_CUH

#include "cuda/cuda_flash_fwd.cuh"
#include "cuda/cuda_flash_plan.cuh"
#include "cuda/cuda_flash_tile.cuh"

/* ---------------------------------------------------------------------------------------------- */
/* Delta                                                                                           */

/* Delta of the BM rows of one query tile (a dQ item) and every head: D / 8 lanes per (row, head),
 * 16 bytes of out and dout each, summed over the lanes by shuffles. */
template <int D, int BM, int THREADS>
FLASH_DEV void flash_delta_cta(const FlashBwdArgs &p, int64_t block, int tid)
{
    constexpr int L = D / 8, PER_PASS = THREADS / L;
    static_assert(32 % L == 0, "a (row, head) within one warp");
    const int2 item = flash_ld_global(p.items + block);
    const int4 seg = flash_ld_global(p.segs + item.x);
    const int rows = flash_imin(BM, seg.y - item.y), pairs = rows * p.n_heads;
    for (int base = 0; base < pairs; base += PER_PASS) { /* the same trip count on every lane */
        const int pair = base + tid / L;
        const bool ok = pair < pairs;
        float sum = 0.0f;
        int64_t row = 0;
        int h = 0;
        if (ok) {
            row = (int64_t)seg.x + item.y + pair / p.n_heads;
            h = pair % p.n_heads;
            const int64_t at = row * p.o_stride + h * D + (tid % L) * 8;
            const uint4 a = flash_ld_global(reinterpret_cast<const uint4 *>(p.out + at));
            const uint4 b = flash_ld_global(reinterpret_cast<const uint4 *>(p.dout + at));
            const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                sum += flash_bf16_lo(av[e]) * flash_bf16_lo(bv[e]) + flash_bf16_hi(av[e]) * flash_bf16_hi(bv[e]);
        }
#pragma unroll
        for (int o = 1; o < L; o <<= 1)
            sum += flash_shfl_xor(sum, o);
        if (ok && tid % L == 0)
            flash_st_global_f32(p.delta + row * p.n_heads + h, sum);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* dK, dV (and dQ with atomics)                                                                    */

template <class C, bool ATOMIC_DQ, bool FULL = false>
FLASH_DEV void flash_dkdv_cta(const FlashBwdArgs &p, unsigned char *smem, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, THREADS = C::THREADS;
    const int n_kv = p.n_heads / p.group;
    const int2 item = flash_ld_global(p.items + block / n_kv);
    const int kh = (int)(block % n_kv);
    const int4 seg = flash_ld_global(p.segs + item.x); /* q_row, q_len, kv_row, kv_len */
    const int q_len = seg.y, kv_len = FULL ? -seg.w : seg.w, off = FULL ? kv_len - 1 : kv_len - q_len, j0 = item.y;
    const int first = flash_imax(0, j0 - off); /* the first query that sees key j0 */
    const int n_qt = (q_len - first + BM - 1) / BM, n_steps = p.group * n_qt;
    const int lane = tid & 31, warp = tid >> 5;
    uint16_t *sK = reinterpret_cast<uint16_t *>(smem), *sV = sK + BN * D, *sQ = sV + BN * D, *sdO = sQ + 2 * BM * D;
    uint16_t *sP = sdO + 2 * BM * D, *sdS = sP + BM * BN;
    float *sLse = reinterpret_cast<float *>(sdS + BM * BN), *sDelta = sLse + 2 * BM;

    /* K and V of the tile, once */
    const int64_t kv0 = (int64_t)seg.z + j0;
    flash_load_tile<BN, D, THREADS>(sK, p.k + kv0 * p.kv_stride + kh * D, p.kv_stride, kv_len - j0, tid);
    flash_load_tile<BN, D, THREADS>(sV, p.v + kv0 * p.kv_stride + kh * D, p.kv_stride, kv_len - j0, tid);
    /* Step s: query head kh * group + s / n_qt, query tile s % n_qt. */
    auto load_step = [&](int s, int buf) {
        const int h = kh * p.group + s / n_qt, i0 = first + (s % n_qt) * BM, valid = q_len - i0;
        const int64_t row = (int64_t)seg.x + i0;
        flash_load_tile<BM, D, THREADS>(sQ + buf * BM * D, p.q + row * p.q_stride + h * D, p.q_stride, valid, tid);
        flash_load_tile<BM, D, THREADS>(sdO + buf * BM * D, p.dout + row * p.o_stride + h * D, p.o_stride, valid, tid);
        flash_load_column<BM, THREADS>(sLse + buf * BM, p.lse + row * p.n_heads + h, p.n_heads, valid, tid);
        flash_load_column<BM, THREADS>(sDelta + buf * BM, p.delta + row * p.n_heads + h, p.n_heads, valid, tid);
    };
    load_step(0, 0);
    flash_cp_async_commit();

    float dv[C::MT2][C::NT2][4], dk[C::MT2][C::NT2][4];
    flash_zero(dv);
    flash_zero(dk);
    const int wm1 = warp / C::WN1, wn1 = warp % C::WN1, wm2 = warp / C::WN2, wn2 = warp % C::WN2;
    const int m1 = wm1 * C::TM1, n1 = wn1 * C::TN1; /* phase 1: query rows, key columns */
    const int m2 = wm2 * C::TM2, n2 = wn2 * C::TN2; /* phase 2: key rows, d columns */

    for (int step = 0; step < n_steps; step++) {
        const int buf = step & 1;
        if (step + 1 < n_steps) {
            load_step(step + 1, buf ^ 1);
            flash_cp_async_commit();
            flash_cp_async_wait<1>();
        } else {
            flash_cp_async_wait<0>();
        }
        flash_sync_cta();
        const int h = kh * p.group + step / n_qt, i0 = first + (step % n_qt) * BM;
        const uint16_t *qt = sQ + buf * BM * D, *dot = sdO + buf * BM * D;
        const bool masked = i0 + off < j0 + BN - 1 || i0 + BM > q_len || j0 + BN > kv_len;

        /* 1. S = Q K^T, dP = dO V^T (BM x BN; both operands stored [row][d]) -> P, dS in shared */
        {
            float s[C::MT1][C::NT1][4], dp[C::MT1][C::NT1][4];
            flash_zero(s);
            flash_zero(dp);
            flash_warp_gemm<C::MT1, C::NT1, D / 16, false, D, false, D>(s, qt, m1, sK, n1, 0, lane);
            flash_warp_gemm<C::MT1, C::NT1, D / 16, false, D, false, D>(dp, dot, m1, sV, n1, 0, lane);
#pragma unroll
            for (int mt = 0; mt < C::MT1; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = m1 + 16 * mt + flash_c_row(lane, 2 * hf);
                    const float lse2 = flash_ld_shared_f32(sLse + buf * BM + r) * FLASH_LOG2E;
                    const float delta = flash_ld_shared_f32(sDelta + buf * BM + r);
#pragma unroll
                    for (int nt = 0; nt < C::NT1; nt++) {
                        float pe[2], ds[2];
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int c = n1 + 8 * nt + flash_c_col(lane, e);
                            pe[e] = flash_exp2(s[mt][nt][2 * hf + e] * p.scale_log2 - lse2);
                            if (masked && !(i0 + r < q_len && j0 + c < kv_len && j0 + c <= off + i0 + r))
                                pe[e] = 0.0f;
                            ds[e] = pe[e] * (dp[mt][nt][2 * hf + e] - delta);
                        }
                        const int at = flash_swz<BN>(r, n1 + 8 * nt + flash_c_col(lane, 0));
                        flash_st_shared_u32(sP + at, flash_pack_bf16(pe[0], pe[1]));
                        flash_st_shared_u32(sdS + at, flash_pack_bf16(ds[0], ds[1]));
                    }
                }
        }
        flash_sync_cta();

        /* 2. dV += P^T dO, dK += dS^T Q (BN x D): P, dS stored [query][key] are A^T; dO, Q stored
         * [query][d] are B stored [k][n] */
        flash_warp_gemm<C::MT2, C::NT2, BM / 16, true, BN, true, D>(dv, sP, m2, dot, n2, 0, lane);
        flash_warp_gemm<C::MT2, C::NT2, BM / 16, true, BN, true, D>(dk, sdS, m2, qt, n2, 0, lane);

        /* 3. dQ += dS K / sqrt(D) (BM x D), added to dq with atomics */
        if constexpr (ATOMIC_DQ) {
            const int wm3 = warp / C::WN3, wn3 = warp % C::WN3, m3 = wm3 * C::TM3, n3 = wn3 * C::TN3;
            float dqa[C::MT3][C::NT3][4];
            flash_zero(dqa);
            flash_warp_gemm<C::MT3, C::NT3, BN / 16, false, BN, true, D>(dqa, sdS, m3, sK, n3, 0, lane);
#pragma unroll
            for (int mt = 0; mt < C::MT3; mt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = m3 + 16 * mt + flash_c_row(lane, i);
                    if (i0 + r >= q_len)
                        continue;
                    float *row = p.dq + ((int64_t)seg.x + i0 + r) * p.q_stride + h * D + n3 + flash_c_col(lane, i);
#pragma unroll
                    for (int nt = 0; nt < C::NT3; nt++)
                        flash_atomic_add_f32(row + 8 * nt, dqa[mt][nt][i] * p.scale);
                }
        }
        flash_sync_cta(); /* P, dS and this buffer are free for the next step */
    }

    /* dv += dV, dk += dK / sqrt(D) on the tile's real keys */
#pragma unroll
    for (int mt = 0; mt < C::MT2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int key = m2 + 16 * mt + flash_c_row(lane, 2 * hf);
            if (j0 + key >= kv_len)
                continue;
            const int64_t at = (kv0 + key) * p.kv_stride + kh * D + n2 + flash_c_col(lane, 0);
#pragma unroll
            for (int nt = 0; nt < C::NT2; nt++) {
                const float v0 = dv[mt][nt][2 * hf], v1 = dv[mt][nt][2 * hf + 1];
                const float k0 = dk[mt][nt][2 * hf] * p.scale, k1 = dk[mt][nt][2 * hf + 1] * p.scale;
                if (p.kv_atomic) {
                    flash_atomic_add_f32(p.dv + at + 8 * nt, v0);
                    flash_atomic_add_f32(p.dv + at + 8 * nt + 1, v1);
                    flash_atomic_add_f32(p.dk + at + 8 * nt, k0);
                    flash_atomic_add_f32(p.dk + at + 8 * nt + 1, k1);
                } else {
                    flash_add_global_f32x2(p.dv + at + 8 * nt, v0, v1);
                    flash_add_global_f32x2(p.dk + at + 8 * nt, k0, k1);
                }
            }
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* dQ (deterministic mode)                                                                         */

template <class C, bool FULL = false>
FLASH_DEV void flash_dq_cta(const FlashBwdArgs &p, unsigned char *smem, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, MT = C::MT, THREADS = C::THREADS;
    constexpr int NS = BN / 8, NO = D / 8, KD = D / 16, KN = BN / 16;
    const int2 item = flash_ld_global(p.items + block / p.n_heads);
    const int h = (int)(block % p.n_heads), kh = h / p.group;
    const int4 seg = flash_ld_global(p.segs + item.x);
    const int i0 = item.y, rows = flash_imin(BM, seg.y - i0), u0 = seg.w - seg.y + i0;
    const int n_keys = FULL ? -seg.w : u0 + rows, n_tiles = (n_keys + BN - 1) / BN;
    const int lane = tid & 31, wr = (tid >> 5) * (BM / C::WARPS);
    uint16_t *sQ = reinterpret_cast<uint16_t *>(smem), *sdO = sQ + BM * D, *sK = sdO + BM * D, *sV = sK + 2 * BN * D;
    const int64_t row0 = (int64_t)seg.x + i0;
    const uint16_t *kg = p.k + (int64_t)seg.z * p.kv_stride + kh * D;
    const uint16_t *vg = p.v + (int64_t)seg.z * p.kv_stride + kh * D;

    flash_load_tile<BM, D, THREADS>(sQ, p.q + row0 * p.q_stride + h * D, p.q_stride, rows, tid);
    flash_load_tile<BM, D, THREADS>(sdO, p.dout + row0 * p.o_stride + h * D, p.o_stride, rows, tid);
    {
        const int j0 = (n_tiles - 1) * BN;
        flash_load_tile<BN, D, THREADS>(sK, kg + (int64_t)j0 * p.kv_stride, p.kv_stride, n_keys - j0, tid);
        flash_load_tile<BN, D, THREADS>(sV, vg + (int64_t)j0 * p.kv_stride, p.kv_stride, n_keys - j0, tid);
        flash_cp_async_commit();
    }
    /* lse (base 2) and Delta of the lane's rows; zero past the end (those rows are masked) */
    float lse2[MT][2], delta[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = wr + 16 * mt + flash_c_row(lane, 2 * hf);
            const bool ok = r < rows;
            lse2[mt][hf] = ok ? flash_ld_global(p.lse + (row0 + r) * p.n_heads + h) * FLASH_LOG2E : 0.0f;
            delta[mt][hf] = ok ? flash_ld_global(p.delta + (row0 + r) * p.n_heads + h) : 0.0f;
        }

    float dq[MT][NO][4];
    flash_zero(dq);
    for (int it = 0; it < n_tiles; it++) {
        const int t = n_tiles - 1 - it, buf = it & 1;
        if (it + 1 < n_tiles) {
            const int j1 = (t - 1) * BN;
            flash_load_tile<BN, D, THREADS>(sK + (buf ^ 1) * BN * D, kg + (int64_t)j1 * p.kv_stride, p.kv_stride,
                                            n_keys - j1, tid);
            flash_load_tile<BN, D, THREADS>(sV + (buf ^ 1) * BN * D, vg + (int64_t)j1 * p.kv_stride, p.kv_stride,
                                            n_keys - j1, tid);
            flash_cp_async_commit();
            flash_cp_async_wait<1>();
        } else {
            flash_cp_async_wait<0>();
        }
        flash_sync_cta();
        const uint16_t *kt = sK + buf * BN * D, *vt = sV + buf * BN * D;
        float s[MT][NS][4], dp[MT][NS][4];
        flash_zero(s);
        flash_zero(dp);
        flash_warp_gemm<MT, NS, KD, false, D, false, D>(s, sQ, wr, kt, 0, 0, lane);
        flash_warp_gemm<MT, NS, KD, false, D, false, D>(dp, sdO, wr, vt, 0, 0, lane);
        const int j0 = t * BN;
        const bool masked = (FULL ? j0 + BN > n_keys : j0 + BN - 1 > u0 + wr) || wr + 16 * MT > rows;
        /* dS = P (dP - Delta), into s */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = wr + 16 * mt + flash_c_row(lane, i), j = j0 + 8 * nt + flash_c_col(lane, i);
                    float pe = flash_exp2(s[mt][nt][i] * p.scale_log2 - lse2[mt][i >> 1]);
                    if (masked && !(r < rows && (FULL ? j < n_keys : j <= u0 + r)))
                        pe = 0.0f;
                    s[mt][nt][i] = pe * (dp[mt][nt][i] - delta[mt][i >> 1]);
                }
        /* dQ += dS K: dS's accumulators are the A operand, K [key][d] is B stored [k][n] */
        uint32_t da[MT][KN][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kn = 0; kn < KN; kn++)
                flash_c_to_a(da[mt][kn], s[mt][2 * kn], s[mt][2 * kn + 1]);
        flash_warp_gemm_ra<MT, NO, KN, true, D>(dq, da, kt, 0, 0, lane);
        flash_sync_cta();
    }

    /* dq += dQ / sqrt(D) on the tile's real rows (this block is their only writer) */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = wr + 16 * mt + flash_c_row(lane, 2 * hf);
            if (r >= rows)
                continue;
            float *row = p.dq + (row0 + r) * p.q_stride + h * D + flash_c_col(lane, 0);
#pragma unroll
            for (int nt = 0; nt < NO; nt++)
                flash_add_global_f32x2(row + 8 * nt, dq[mt][nt][2 * hf] * p.scale, dq[mt][nt][2 * hf + 1] * p.scale);
        }
}

#endif
