/*
 * cuda/cuda_flash_launch.cuh - the launchers of the flash attention kernels (cuda_flash_fwd.cu,
 * cuda_flash_bwd.cu), called by cuda_flash.cu with the arguments and work lists of one call. n_items
 * is the length of the work list the arguments point at (>= 1); every launcher checks its launch.
 */
#ifndef WLB_CUDA_CUDA_FLASH_LAUNCH_CUH
#define WLB_CUDA_CUDA_FLASH_LAUNCH_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_plan.cuh"

/* Blocks above 48 KB of shared memory need the kernel's limit raised, once (done: a static flag of
 * the launcher). */
template <class K> static void flash_allow_smem(K kernel, int bytes, bool *done)
{
    if (!*done) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *done = true;
    }
}

/* Forward: n_items query tiles x n_heads blocks. */
template <int D> void flash_launch_fwd(const FlashFwdArgs &a, int64_t n_items);
/* Delta over the dQ list's query tiles (n_items blocks). */
template <int D> void flash_launch_delta(const FlashBwdArgs &a, int64_t n_items);
/* dK, dV over key tiles (n_items x n_kv_heads blocks); atomic_dq: dQ too, with atomics. */
template <int D> void flash_launch_dkdv(const FlashBwdArgs &a, int64_t n_items, bool atomic_dq);
/* dQ over the dQ list (n_items x n_heads blocks). */
template <int D> void flash_launch_dq(const FlashBwdArgs &a, int64_t n_items);

#endif
