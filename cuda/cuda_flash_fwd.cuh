/*
 * cuda/cuda_flash_fwd.cuh - the forward block of the flash attention kernels (FlashAttention-2's
 * algorithm): one block computes C::BM query rows of one segment for one query head.
 *
 * Math, per query row i (scores in base 2: s = q.k * log2(e) / sqrt(D), so that exp(x) becomes
 * exp2 with the log2(e) folded into the scale):
 *   over key tiles j (the last one first: it holds the diagonal, the only tiles masked),
 *     m' = max(m, max_j s_ij)              the running maximum
 *     alpha = 2^(m - m')                   rescales what was summed under the old maximum
 *     p_ij = 2^(s_ij - m')                 (masked keys: s = -inf, p = 0)
 *     l = alpha l + sum_j p_ij,   o = alpha o + sum_j p_ij v_j   (p rounded to bf16 for the product)
 *   out_i = o / l (bf16), lse_i = (m + log2 l) ln 2 (natural log: the unit of engine/ops.h).
 * A row whose keys are all masked so far keeps m = -inf; its exponentials then use 0 as the
 * reference (2^-inf = 0), never -inf - -inf.
 *
 * Masking: query row r of the tile (segment row i0 + r) sees keys j <= u0 + r with
 * u0 = kv_len - q_len + i0. Key tiles wholly above the last row's limit are never visited; a warp
 * masks only the tiles that cross its first row's limit (at most BM / BN + 1 of them). FULL (a list
 * of full segments, engine/ops.h: every query sees every key; the plan stores kv_len negated): every
 * row sees the kv_len keys, and only a last tile that runs past them is masked, by column.
 *
 * Layout: warp w owns rows [w BM / WARPS, (w + 1) BM / WARPS), MT tiles of 16 rows. Its S block
 * (MT x BN / 8 accumulator tiles) stays in registers and becomes the A operand of P V directly
 * (flash_c_to_a). Shared memory: Q [BM][D], K and V [2][BN][D] (cp.async, double buffered: tile
 * t - 1 loads while tile t is used).
 */
#ifndef WLB_CUDA_CUDA_FLASH_FWD_CUH
#define WLB_CUDA_CUDA_FLASH_FWD_CUH

#include "cuda/cuda_flash_plan.cuh"
#include "cuda/cuda_flash_tile.cuh"

#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f

template <class C, bool FULL = false>
FLASH_DEV void flash_fwd_cta(const FlashFwdArgs &p, unsigned char *smem, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, MT = C::MT, THREADS = C::THREADS;
    constexpr int NS = BN / 8, NO = D / 8, KD = D / 16, KN = BN / 16;
    const int2 item = flash_ld_global(p.items + block / p.n_heads);
    const int h = (int)(block % p.n_heads), kh = h / p.group;
    const int4 seg = flash_ld_global(p.segs + item.x); /* q_row, q_len, kv_row, kv_len */
    const int i0 = item.y, rows = flash_imin(BM, seg.y - i0), u0 = seg.w - seg.y + i0;
    const int n_keys = FULL ? -seg.w : u0 + rows, n_tiles = (n_keys + BN - 1) / BN;
    const int lane = tid & 31, wr = (tid >> 5) * (BM / C::WARPS); /* the warp's first row */
    uint16_t *sQ = reinterpret_cast<uint16_t *>(smem), *sK = sQ + BM * D, *sV = sK + 2 * BN * D;
    const uint16_t *kg = p.k + (int64_t)seg.z * p.kv_stride + kh * D;
    const uint16_t *vg = p.v + (int64_t)seg.z * p.kv_stride + kh * D;

    flash_load_tile<BM, D, THREADS>(sQ, p.q + (int64_t)(seg.x + i0) * p.q_stride + h * D, p.q_stride, rows, tid);
    {
        const int j0 = (n_tiles - 1) * BN;
        flash_load_tile<BN, D, THREADS>(sK, kg + (int64_t)j0 * p.kv_stride, p.kv_stride, n_keys - j0, tid);
        flash_load_tile<BN, D, THREADS>(sV, vg + (int64_t)j0 * p.kv_stride, p.kv_stride, n_keys - j0, tid);
        flash_cp_async_commit();
    }

    float o[MT][NO][4], m[MT][2], l[MT][2];
    flash_zero(o);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            m[mt][hf] = -INFINITY;
            l[mt][hf] = 0.0f;
        }
    [[maybe_unused]] uint32_t qf[C::QREG ? MT : 1][C::QREG ? KD : 1][4];

    for (int it = 0; it < n_tiles; it++) {
        const int t = n_tiles - 1 - it, buf = it & 1;
        if (it + 1 < n_tiles) { /* the next tile into the other buffer (free since the last sync) */
            const int j1 = (t - 1) * BN;
            uint16_t *k1 = sK + (buf ^ 1) * BN * D, *v1 = sV + (buf ^ 1) * BN * D;
            flash_load_tile<BN, D, THREADS>(k1, kg + (int64_t)j1 * p.kv_stride, p.kv_stride, n_keys - j1, tid);
            flash_load_tile<BN, D, THREADS>(v1, vg + (int64_t)j1 * p.kv_stride, p.kv_stride, n_keys - j1, tid);
            flash_cp_async_commit();
            flash_cp_async_wait<1>();
        } else {
            flash_cp_async_wait<0>();
        }
        flash_sync_cta();
        const uint16_t *kt = sK + buf * BN * D, *vt = sV + buf * BN * D;

        /* S = Q K^T for the warp's rows */
        float s[MT][NS][4];
        flash_zero(s);
        if constexpr (C::QREG) {
            if (it == 0)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int kd = 0; kd < KD; kd++)
                        flash_ldsm_a<D>(qf[mt][kd], sQ, wr + 16 * mt, 16 * kd, lane);
            flash_warp_gemm_ra<MT, NS, KD, false, D>(s, qf, kt, 0, 0, lane);
        } else {
            flash_warp_gemm<MT, NS, KD, false, D, false, D>(s, sQ, wr, kt, 0, 0, lane);
        }

        /* scale to base 2; mask keys past each row's limit on the tiles that cross it */
        const int j0 = t * BN;
        const bool masked = FULL ? j0 + BN > n_keys : j0 + BN - 1 > u0 + wr;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float x = s[mt][nt][i] * p.scale_log2;
                    const int j = j0 + 8 * nt + flash_c_col(lane, i);
                    if (masked && (FULL ? j >= n_keys : j > u0 + wr + 16 * mt + flash_c_row(lane, i)))
                        x = -INFINITY;
                    s[mt][nt][i] = x;
                }

        /* online softmax: rows g (elements 0, 1) and g + 8 (elements 2, 3) of each row tile */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = m[mt][hf];
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                mx = flash_quad_max(mx);
                const float ref = mx == -INFINITY ? 0.0f : mx;
                const float alpha = flash_exp2(m[mt][hf] - ref);
                m[mt][hf] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float pe = flash_exp2(s[mt][nt][2 * hf + e] - ref);
                        s[mt][nt][2 * hf + e] = pe;
                        sum += pe;
                    }
                l[mt][hf] = l[mt][hf] * alpha + sum; /* this lane's columns; summed over the quad at the end */
#pragma unroll
                for (int nt = 0; nt < NO; nt++) {
                    o[mt][nt][2 * hf] *= alpha;
                    o[mt][nt][2 * hf + 1] *= alpha;
                }
            }

        /* O += P V: P's accumulators are the A operand (bf16), V [key][d] is B stored [k][n] */
        uint32_t pa[MT][KN][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kn = 0; kn < KN; kn++)
                flash_c_to_a(pa[mt][kn], s[mt][2 * kn], s[mt][2 * kn + 1]);
        flash_warp_gemm_ra<MT, NO, KN, true, D>(o, pa, vt, 0, 0, lane);
        flash_sync_cta(); /* every warp is done with this buffer before it is loaded again */
    }

    /* out = O / l, lse = (m + log2 l) ln 2, for the tile's real rows */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float sum = flash_quad_sum(l[mt][hf]);
            const int r = wr + 16 * mt + flash_c_row(lane, 2 * hf);
            if (r >= rows)
                continue;
            const int64_t row = (int64_t)seg.x + i0 + r;
            const float inv = 1.0f / sum;
            uint16_t *orow = p.out + row * p.o_stride + h * D + flash_c_col(lane, 0);
#pragma unroll
            for (int nt = 0; nt < NO; nt++)
                flash_st_global_u32(orow + 8 * nt, flash_pack_bf16(o[mt][nt][2 * hf] * inv, o[mt][nt][2 * hf + 1] * inv));
            if ((lane & 3) == 0)
                flash_st_global_f32(p.lse + row * p.n_heads + h, (m[mt][hf] + flash_log2(sum)) * FLASH_LN2);
        }
}

#endif
