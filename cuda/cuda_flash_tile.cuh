/*
 * cuda/cuda_flash_tile.cuh - tiles for the flash attention kernels: copying rows of q, k, v, out,
 * dout from global memory into swizzled shared-memory tiles (cp.async), loading mma operands out of
 * those tiles (ldmatrix), and a warp's block of products acc += A B over a tile.
 *
 * A warp's accumulator block is float acc[MT][NT][4]: MT tiles of 16 rows by NT tiles of 8 columns,
 * each in the C layout of cuda_flash_frag.cuh. Element (mt, nt, i) sits at row m0 + 16 mt +
 * flash_c_row(lane, i), column n0 + 8 nt + flash_c_col(lane, i) of the block's matrix.
 */
#ifndef WLB_CUDA_CUDA_FLASH_TILE_CUH
#define WLB_CUDA_CUDA_FLASH_TILE_CUH

#include "cuda/cuda_flash_frag.cuh"

/* Copies ROWS rows of COLS bf16 (row r from src + r * stride) into a swizzled tile, rows >= valid
 * as zeros, with cp.async by all THREADS threads (consecutive threads take consecutive 16-byte
 * chunks of a row: coalesced reads). src must be 16-byte aligned and stride a multiple of 8. */
template <int ROWS, int COLS, int THREADS>
FLASH_DEV void flash_load_tile(uint16_t *tile, const uint16_t *src, int64_t stride, int valid, int tid)
{
    constexpr int CHUNKS = COLS / 8, TOTAL = ROWS * CHUNKS, ROUNDS = (TOTAL + THREADS - 1) / THREADS;
#pragma unroll
    for (int k = 0; k < ROUNDS; k++) {
        int i = tid + k * THREADS;
        if (TOTAL % THREADS == 0 || i < TOTAL) {
            int r = i / CHUNKS, c = (i % CHUNKS) * 8;
            bool ok = r < valid;
            flash_cp_async_16(tile + flash_swz<COLS>(r, c), src + (ok ? r : 0) * stride + c, ok);
        }
    }
}

/* n floats (n <= THREADS) from src[r * stride] into dst[r], r >= valid as zeros (lse, Delta). */
template <int N, int THREADS>
FLASH_DEV void flash_load_column(float *dst, const float *src, int64_t stride, int valid, int tid)
{
    static_assert(N <= THREADS, "one float per thread");
    if (tid < N) {
        bool ok = tid < valid;
        flash_cp_async_4(dst + tid, src + (ok ? tid : 0) * stride, ok);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Operands out of swizzled tiles (COLS: the tile's width)                                          */

/* A (16 x 16 at m0, k0) of a tile stored [m][k]. */
template <int COLS> FLASH_DEV void flash_ldsm_a(uint32_t (&a)[4], const uint16_t *tile, int m0, int k0, int lane)
{
    flash_ldsm_x4(a, tile + flash_swz<COLS>(m0 + flash_lane_a_row(lane), k0 + flash_lane_a_col(lane)));
}

/* A (16 x 16 at m0, k0) of a tile stored [k][m]: A = the tile's transpose. */
template <int COLS> FLASH_DEV void flash_ldsm_at(uint32_t (&a)[4], const uint16_t *tile, int m0, int k0, int lane)
{
    flash_ldsm_x4_trans(a, tile + flash_swz<COLS>(k0 + flash_lane_at_row(lane), m0 + flash_lane_at_col(lane)));
}

/* B of two n8 tiles (n0 .. n0+15, k0 .. k0+15) of a tile stored [n][k]: b[0], b[1] for n0,
 * b[2], b[3] for n0 + 8. */
template <int COLS> FLASH_DEV void flash_ldsm_b(uint32_t (&b)[4], const uint16_t *tile, int n0, int k0, int lane)
{
    flash_ldsm_x4(b, tile + flash_swz<COLS>(n0 + flash_lane_b_row(lane), k0 + flash_lane_b_col(lane)));
}

/* The same from a tile stored [k][n]. */
template <int COLS> FLASH_DEV void flash_ldsm_bt(uint32_t (&b)[4], const uint16_t *tile, int n0, int k0, int lane)
{
    flash_ldsm_x4_trans(b, tile + flash_swz<COLS>(k0 + flash_lane_bt_row(lane), n0 + flash_lane_bt_col(lane)));
}

/* ---------------------------------------------------------------------------------------------- */
/* A warp's products                                                                               */

/* acc[MT][NT] += A[m0 .. m0 + 16 MT, k] B[k, n0 .. n0 + 8 NT] over k0 <= k < k0 + 16 KSTEPS. A is read from a
 * tile of width ACOLS stored [m][k] (A_T false) or [k][m] (A_T true); B from a tile of width BCOLS
 * stored [n][k] (B_T false) or [k][n] (B_T true). Each B pair is loaded once and used by all MT
 * row tiles; each A tile once for all NT column tiles. */
template <int MT, int NT, int KSTEPS, bool A_T, int ACOLS, bool B_T, int BCOLS>
FLASH_DEV void flash_warp_gemm(float (&acc)[MT][NT][4], const uint16_t *a_tile, int m0, const uint16_t *b_tile, int n0,
                               int k0, int lane)
{
    static_assert(NT % 2 == 0, "B operands are loaded in pairs of n8 tiles");
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (A_T)
                flash_ldsm_at<ACOLS>(a[mt], a_tile, m0 + 16 * mt, k0 + 16 * ks, lane);
            else
                flash_ldsm_a<ACOLS>(a[mt], a_tile, m0 + 16 * mt, k0 + 16 * ks, lane);
        }
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t b[4];
            if (B_T)
                flash_ldsm_bt<BCOLS>(b, b_tile, n0 + 16 * np, k0 + 16 * ks, lane);
            else
                flash_ldsm_b<BCOLS>(b, b_tile, n0 + 16 * np, k0 + 16 * ks, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                flash_mma(acc[mt][2 * np], a[mt], b[0], b[1]);
                flash_mma(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

/* The same with A already in registers: a[MT][KSTEPS][4], the A fragments of the 16 x 16 blocks
 * (m0 + 16 mt, k0 + 16 ks). */
template <int MT, int NT, int KSTEPS, bool B_T, int BCOLS>
FLASH_DEV void flash_warp_gemm_ra(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KSTEPS][4], const uint16_t *b_tile,
                                  int n0, int k0, int lane)
{
    static_assert(NT % 2 == 0, "B operands are loaded in pairs of n8 tiles");
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t b[4];
            if (B_T)
                flash_ldsm_bt<BCOLS>(b, b_tile, n0 + 16 * np, k0 + 16 * ks, lane);
            else
                flash_ldsm_b<BCOLS>(b, b_tile, n0 + 16 * np, k0 + 16 * ks, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                flash_mma(acc[mt][2 * np], a[mt][ks], b[0], b[1]);
                flash_mma(acc[mt][2 * np + 1], a[mt][ks], b[2], b[3]);
            }
        }
    }
}

/* Accumulators of a 16 x 16 block (column tiles 2 kb and 2 kb + 1) as the A operand of the next
 * product, rounded to bf16: the C layout of two adjacent n8 tiles is the A layout of one k16 block
 * (a[0] = row g cols 2t.. of tile 2kb, a[1] = row g+8 of tile 2kb, a[2], a[3] the same of 2kb+1). */
FLASH_DEV void flash_c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4])
{
    a[0] = flash_pack_bf16(c0[0], c0[1]);
    a[1] = flash_pack_bf16(c0[2], c0[3]);
    a[2] = flash_pack_bf16(c1[0], c1[1]);
    a[3] = flash_pack_bf16(c1[2], c1[3]);
}

template <int MT, int NT> FLASH_DEV void flash_zero(float (&acc)[MT][NT][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[mt][nt][i] = 0.0f;
}

/* Quad reductions: the 4 lanes of a group hold the columns of the same rows. */
FLASH_DEV float flash_quad_max(float v)
{
    v = fmaxf(v, flash_shfl_xor(v, 1));
    return fmaxf(v, flash_shfl_xor(v, 2));
}
FLASH_DEV float flash_quad_sum(float v)
{
    v += flash_shfl_xor(v, 1);
    return v + flash_shfl_xor(v, 2);
}

#endif
