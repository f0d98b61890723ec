/*
 * test/flash_emu.h - a host emulator for the flash attention kernels (cuda/cuda_flash_*.cuh): their
 * own source runs on the CPU, one fiber per GPU thread, through the primitives below, which are the
 * functions cuda/cuda_flash_frag.cuh implements with PTX on the device. Included before the kernels
 * (it defines FLASH_EMULATE). See flash_emu.cc for how each primitive is modelled.
 *
 * What a launch checks, besides computing the result:
 *   - warp collectives (ldmatrix, mma, shuffles, shared loads and stores) are executed by all 32
 *     lanes of the warp together, with the same operation (else: "divergent");
 *   - every __syncthreads is reached by every thread (else: "deadlock");
 *   - shared memory: no read of a word never written, no read of a word whose cp.async is not yet
 *     waited for, no two threads touching one word (one writing) between two barriers (a race);
 *   - cp.async data lands at the wait (lazy) or at the issue (eager): a kernel that reads too early
 *     or overwrites too early gets the wrong numbers in one of the two modes;
 *   - global memory: every access inside a registered buffer, aligned, writes only to writable
 *     buffers, and no float written by two blocks of one launch unless both used atomics;
 *   - bank conflicts of ldmatrix and of shared loads and stores are counted (a performance figure).
 * Errors are collected (the first ones kept as messages); a deadlock or divergence abandons the
 * launch.
 */
#ifndef WLB_TEST_FLASH_EMU_H
#define WLB_TEST_FLASH_EMU_H

#define FLASH_EMULATE 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <string>
#include <vector>

/* CUDA's vector types, as the kernels use them. */
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

/* ---------------------------------------------------------------------------------------------- */
/* The primitives of cuda/cuda_flash_frag.cuh                                                      */

void flash_sync_cta();
void flash_ldsm_x4(uint32_t (&r)[4], const void *row);
void flash_ldsm_x4_trans(uint32_t (&r)[4], const void *row);
void flash_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
void flash_cp_async_16(void *smem, const void *gmem, bool valid);
void flash_cp_async_4(void *smem, const void *gmem, bool valid);
void flash_cp_async_commit();
void flash_emu_cp_async_wait(int n);
template <int N> inline void flash_cp_async_wait() { flash_emu_cp_async_wait(N); }
float flash_shfl_xor(float v, int mask);
inline float flash_exp2(float x) { return exp2f(x); }
inline float flash_log2(float x) { return log2f(x); }
/* float -> bf16, round to nearest even (NaN stays a NaN) */
uint16_t flash_emu_bf16(float x);
inline float flash_emu_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t flash_pack_bf16(float lo, float hi) { return flash_emu_bf16(lo) | (uint32_t)flash_emu_bf16(hi) << 16; }
inline float flash_bf16_lo(uint32_t v) { return flash_emu_float((uint16_t)(v & 0xffff)); }
inline float flash_bf16_hi(uint32_t v) { return flash_emu_float((uint16_t)(v >> 16)); }
void flash_st_shared_u32(void *p, uint32_t v);
float flash_ld_shared_f32(const void *p);
/* Checks a global access of `bytes` at p (aligned to `bytes`, at most 16); write: the buffer must be
 * writable and, with owner >= 0 semantics, unshared between blocks. */
void flash_emu_global(const void *p, size_t bytes, bool write, bool atomic);
template <class T> inline T flash_ld_global(const T *p)
{
    flash_emu_global(p, sizeof(T), false, false);
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}
void flash_st_global_u32(void *p, uint32_t v);
void flash_st_global_f32(float *p, float v);
void flash_add_global_f32x2(float *p, float a, float b);
void flash_add_global_f32(float *p, float v);
void flash_atomic_add_f32(float *p, float v);

/* ---------------------------------------------------------------------------------------------- */
/* Driving it                                                                                      */

enum FlashEmuSchedule {
    FLASH_EMU_ROUND_ROBIN, /* threads take turns at every collective */
    FLASH_EMU_LOW_FIRST,   /* the lowest runnable thread first: warp 0 runs ahead to each barrier */
    FLASH_EMU_HIGH_FIRST,  /* the highest first: the last warp runs ahead */
};

struct FlashEmuConfig {
    FlashEmuSchedule schedule = FLASH_EMU_ROUND_ROBIN;
    bool lazy_copies = true; /* cp.async lands at the wait (true) or at the issue (false) */
};

struct FlashEmuStats {
    int64_t blocks = 0, collectives = 0, mma = 0, ldsm = 0, switches = 0;
    int64_t atomics = 0;                             /* floating-point atomic adds to global memory */
    int64_t ldsm_wavefronts = 0, ldsm_ideal = 0;   /* shared-memory wavefronts of ldmatrix: actual, minimum */
    int64_t shared_wavefronts = 0, shared_ideal = 0; /* of the 4-byte shared loads and stores */
};

void flash_emu_configure(FlashEmuConfig c);
/* Global buffers the kernels may touch (the next launches check against them). */
void flash_emu_buffer(const void *base, size_t bytes, bool writable, const char *name);
void flash_emu_clear_buffers();
/* Runs blocks [first, last) of a launch of `threads` threads with `smem` bytes of shared memory;
 * body(smem, block, tid) is one thread. Returns the number of errors found. */
int flash_emu_launch(const char *name, int64_t blocks, int threads, int smem,
                     const std::function<void(unsigned char *, int64_t, int)> &body);
/* Errors so far (messages of the first few) and counters; reset clears both. */
int flash_emu_errors(std::string *messages);
FlashEmuStats flash_emu_stats();
void flash_emu_reset();

#endif
