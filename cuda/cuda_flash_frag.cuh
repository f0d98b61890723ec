/*
 * cuda/cuda_flash_frag.cuh - the warp-level pieces of the flash attention kernels: the tensor-core
 * product mma.m16n8k16 (bfloat16 in, float32 accumulate), ldmatrix, cp.async, and the per-lane index
 * maps that say which row and column of a tile each lane's registers hold.
 *
 * The kernels (cuda_flash_fwd.cuh, cuda_flash_bwd.cuh) call only the flash_* functions of this file
 * for anything that touches shared memory, global memory or another lane. Built by nvcc they are
 * the PTX instructions below. Built with FLASH_EMULATE (test/test_flash_emulated.cc), the host
 * emulator test/flash_emu.h provides the same functions: the kernels' own source then runs on the
 * CPU, one fiber per thread, with ldmatrix and mma written from the PTX ISA's fragment tables, and
 * every shared-memory access checked for races. The index maps are __host__ __device__ so that the
 * same code computes them in both worlds.
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). A warp's 32
 * lanes are 8 groups of 4: g = lane / 4, t = lane % 4. A .b32 register holds two bf16, the
 * lower-indexed column in the low 16 bits.
 *   A (16 x 16, row-major), 4 registers: a[0] row g,   cols 2t, 2t+1      a[1] row g+8, cols 2t, 2t+1
 *                                        a[2] row g,   cols 2t+8, 2t+9    a[3] row g+8, cols 2t+8, 2t+9
 *   B (16 x 8, k x n), 2 registers:      b[0] rows 2t, 2t+1 of col g       b[1] rows 2t+8, 2t+9 of col g
 *   C, D (16 x 8, float32), 4 floats:    c[0], c[1] row g, cols 2t, 2t+1   c[2], c[3] row g+8, same cols
 * ldmatrix.x4 loads four 8 x 8 bf16 matrices: lanes 8i .. 8i+7 give the addresses of the 8 rows
 * (16 bytes each) of matrix i, and register i of lane l receives row l/4, cols 2(l%4), 2(l%4)+1 of
 * matrix i; with .trans it receives the transpose: rows 2(l%4), 2(l%4)+1 of col l/4.
 */
#ifndef WLB_CUDA_CUDA_FLASH_FRAG_CUH
#define WLB_CUDA_CUDA_FLASH_FRAG_CUH

#include <stdint.h>

#ifdef FLASH_EMULATE
#ifndef WLB_TEST_FLASH_EMU_H
#error "the emulated build includes test/flash_emu.h before the kernels"
#endif
#define FLASH_DEV inline
#define FLASH_HD inline
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define FLASH_DEV __device__ __forceinline__
#define FLASH_HD __host__ __device__ __forceinline__
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Index maps (the same on the host and the device)                                                */

/* Shared-memory tiles are ROWS x COLS bf16, row-major, cut into 16-byte chunks of 8 elements; chunk
 * c of row r is stored at chunk c ^ (r % 8) of that row (COLS a multiple of 64, so the XOR stays in
 * the row). The 8 rows one ldmatrix matrix reads, or 8 lanes of a cp.async write, then fall on 8
 * different chunks, i.e. on all 32 banks: no bank conflict. Returns the element offset. */
template <int COLS> FLASH_HD int flash_swz(int r, int c)
{
    static_assert(COLS % 64 == 0, "swizzled tiles are a multiple of 64 columns wide");
    return r * COLS + (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
}

/* Which row and column (relative to the 16 x 16 block at m0/k0 or n0/k0) a lane addresses in an
 * ldmatrix.x4, for the four ways an operand can lie in shared memory:
 *   A stored [m][k] (row-major, no transpose): matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
 *     (m 0-7, k 8-15), (m 8-15, k 8-15) -> a[0..3];
 *   A stored [k][m] (.trans): matrix i covers k 8(i/2).., m 8(i%2)..;
 *   B stored [n][k] (no transpose), two n8 tiles: matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
 *     (n 8-15, k 0-7), (n 8-15, k 8-15) -> b[0], b[1] of the first tile, b[0], b[1] of the second;
 *   B stored [k][n] (.trans): matrix i covers k 8(i%2).., n 8(i/2)...
 * Lane l addresses row l % 8 of matrix l / 8. */
FLASH_HD int flash_lane_a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; } /* m */
FLASH_HD int flash_lane_a_col(int lane) { return (lane >> 4) * 8; }                    /* k */
FLASH_HD int flash_lane_at_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }      /* k */
FLASH_HD int flash_lane_at_col(int lane) { return ((lane >> 3) & 1) * 8; }             /* m */
FLASH_HD int flash_lane_b_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }       /* n */
FLASH_HD int flash_lane_b_col(int lane) { return ((lane >> 3) & 1) * 8; }              /* k */
FLASH_HD int flash_lane_bt_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; } /* k */
FLASH_HD int flash_lane_bt_col(int lane) { return (lane >> 4) * 8; }                    /* n */

FLASH_HD int flash_imin(int a, int b) { return a < b ? a : b; }
FLASH_HD int flash_imax(int a, int b) { return a > b ? a : b; }

/* Row and column of accumulator element i (0..3) of a lane in its 16 x 8 tile. */
FLASH_HD int flash_c_row(int lane, int i) { return (lane >> 2) + (i >> 1) * 8; }
FLASH_HD int flash_c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }

#ifndef FLASH_EMULATE
/* ---------------------------------------------------------------------------------------------- */
/* The device primitives                                                                           */

FLASH_DEV uint32_t flash_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

FLASH_DEV void flash_sync_cta() { __syncthreads(); }

FLASH_DEV void flash_ldsm_x4(uint32_t (&r)[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(flash_smem_u32(row)));
}

FLASH_DEV void flash_ldsm_x4_trans(uint32_t (&r)[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(flash_smem_u32(row)));
}

/* d += a b: one 16 x 8 x 16 product of the warp (a: 4 registers, b: 2, d: 4 floats). */
FLASH_DEV void flash_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, asynchronously; valid 0 writes zeros and reads nothing (src-size 0). */
FLASH_DEV void flash_cp_async_16(void *smem, const void *gmem, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(flash_smem_u32(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

FLASH_DEV void flash_cp_async_4(void *smem, const void *gmem, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(flash_smem_u32(smem)), "l"(gmem),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

FLASH_DEV void flash_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Waits until at most N of this thread's committed groups are still in flight. The data is then
 * this thread's; other threads see it after the next flash_sync_cta. */
template <int N> FLASH_DEV void flash_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

FLASH_DEV float flash_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

/* 2^x (ex2.approx: 2^-inf = 0) and log2. */
FLASH_DEV float flash_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
FLASH_DEV float flash_log2(float x) { return log2f(x); }

/* Two floats rounded to bf16 (round to nearest even), lo in the low half. */
FLASH_DEV uint32_t flash_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
FLASH_DEV float flash_bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
FLASH_DEV float flash_bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

FLASH_DEV void flash_st_shared_u32(void *p, uint32_t v) { *static_cast<uint32_t *>(p) = v; }
FLASH_DEV float flash_ld_shared_f32(const void *p) { return *static_cast<const float *>(p); }

/* Read-only global loads (items, segments, 16-byte vectors of bf16). */
template <class T> FLASH_DEV T flash_ld_global(const T *p) { return __ldg(p); }

FLASH_DEV void flash_st_global_u32(void *p, uint32_t v) { *static_cast<uint32_t *>(p) = v; }
FLASH_DEV void flash_st_global_f32(float *p, float v) { *p = v; }
/* p[0] += a, p[1] += b (p 8-byte aligned; this thread owns both floats). */
FLASH_DEV void flash_add_global_f32x2(float *p, float a, float b)
{
    float2 x = *reinterpret_cast<float2 *>(p);
    x.x += a;
    x.y += b;
    *reinterpret_cast<float2 *>(p) = x;
}
/* *p += v (this thread the only writer of the float in the launch). */
FLASH_DEV void flash_add_global_f32(float *p, float v) { *p += v; }
FLASH_DEV void flash_atomic_add_f32(float *p, float v) { atomicAdd(p, v); }
#endif /* !FLASH_EMULATE */

#endif
