/*
 * cuda/cuda_flash_fwd.cu - the forward kernel of the flash attention (the block is
 * flash_fwd_cta in cuda_flash_fwd.cuh), one instance per head size.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_fwd.cuh"
#include "cuda/cuda_flash_launch.cuh"

template <class C> __global__ void __launch_bounds__(C::THREADS) k_flash_fwd(FlashFwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_fwd_cta<C>(a, smem, blockIdx.x, (int)threadIdx.x);
}

template <int D> void flash_launch_fwd(const FlashFwdArgs &a, int64_t n_items)
{
    using C = typename FlashTiles<D>::Fwd;
    static bool smem_set = false;
    flash_allow_smem(k_flash_fwd<C>, C::SMEM, &smem_set, "cuda_flash_fwd");
    k_flash_fwd<C><<<(unsigned)(n_items * a.n_heads), C::THREADS, C::SMEM>>>(a);
    CUDA_LAUNCHED("cuda_flash_fwd");
}

template void flash_launch_fwd<64>(const FlashFwdArgs &, int64_t);
template void flash_launch_fwd<128>(const FlashFwdArgs &, int64_t);
