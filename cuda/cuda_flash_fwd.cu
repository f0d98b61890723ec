/*
 * cuda/cuda_flash_fwd.cu - the forward kernel of the flash attention (the block is
 * flash_fwd_cta in cuda_flash_fwd.cuh), one instance per head size and per kind of segment list
 * (causal, or full: every query sees every key).
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_fwd.cuh"
#include "cuda/cuda_flash_launch.cuh"

template <class C, bool FULL> __global__ void __launch_bounds__(C::THREADS) k_flash_fwd(FlashFwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_fwd_cta<C, FULL>(a, smem, blockIdx.x, (int)threadIdx.x);
}

template <int D> void flash_launch_fwd(const FlashFwdArgs &a, int64_t n_items, bool full)
{
    using C = typename FlashTiles<D>::Fwd;
    const unsigned blocks = (unsigned)(n_items * a.n_heads);
    if (full) {
        static bool smem_set = false;
        flash_allow_smem(k_flash_fwd<C, true>, C::SMEM, &smem_set, "cuda_flash_fwd");
        k_flash_fwd<C, true><<<blocks, C::THREADS, C::SMEM>>>(a);
    } else {
        static bool smem_set = false;
        flash_allow_smem(k_flash_fwd<C, false>, C::SMEM, &smem_set, "cuda_flash_fwd");
        k_flash_fwd<C, false><<<blocks, C::THREADS, C::SMEM>>>(a);
    }
    CUDA_LAUNCHED("cuda_flash_fwd");
}

template void flash_launch_fwd<64>(const FlashFwdArgs &, int64_t, bool);
template void flash_launch_fwd<128>(const FlashFwdArgs &, int64_t, bool);
