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
 * the launcher). A block larger than the GPU allows (an sm_86/sm_89 card: 99 KB; A100: 163 KB;
 * H100: 227 KB) stops with a message that says so, not with the runtime's "invalid argument". */
template <class K> static void flash_allow_smem(K kernel, int bytes, bool *done, const char *name)
{
    if (!*done) {
        int dev = 0, most = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (bytes > most) {
            char msg[200];
            snprintf(msg, sizeof msg, "a block needs %d bytes of shared memory, this GPU allows %d", bytes, most);
            cuda_fatal(name, msg);
        }
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *done = true;
    }
}

/* The work lists of a segment list cut by the given tiles, on the device: built and uploaded once
 * per distinct list and kept (cuda_flash.cu keeps the recent ones; the reference kernels of
 * cuda_attention.cu use them too). items[k] is the plan's item k. Bad segments, or more than
 * 2^31 - 1 blocks of items x n_heads in one launch, stop with a message. Valid until the next call. */
struct FlashDevPlan {
    const FlashPlan *plan;
    const int4 *segs;
    const int2 *items;
};
FlashDevPlan cuda_flash_plan(const char *where, const AttnSegment *segs, int64_t n, FlashPlanShape tiles, int n_heads);

/* Forward: n_items query tiles x n_heads blocks. full: the list's segments are all full (every
 * query sees every key), else all causal (the kernels are built for one kind a launch). */
template <int D> void flash_launch_fwd(const FlashFwdArgs &a, int64_t n_items, bool full);
/* Delta over the dQ list's query tiles (n_items blocks). */
template <int D> void flash_launch_delta(const FlashBwdArgs &a, int64_t n_items);
/* dK, dV over key tiles (n_items x n_kv_heads blocks); atomic_dq: dQ too, with atomics. */
template <int D> void flash_launch_dkdv(const FlashBwdArgs &a, int64_t n_items, bool atomic_dq, bool full);
/* dQ over the dQ list (n_items x n_heads blocks). */
template <int D> void flash_launch_dq(const FlashBwdArgs &a, int64_t n_items, bool full);

#endif
