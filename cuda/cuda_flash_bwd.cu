/*
 * cuda/cuda_flash_bwd.cu - the backward kernels of the flash attention (the blocks are in
 * cuda_flash_bwd.cuh): Delta, dK/dV (with or without dQ by atomics) and dQ, one instance per head
 * size.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_bwd.cuh"
#include "cuda/cuda_flash_launch.cuh"

enum { FLASH_DELTA_THREADS = 256 };

template <int D, int BM> __global__ void __launch_bounds__(FLASH_DELTA_THREADS) k_flash_delta(FlashBwdArgs a)
{
    flash_delta_cta<D, BM, FLASH_DELTA_THREADS>(a, blockIdx.x, (int)threadIdx.x);
}

template <class C, bool ATOMIC_DQ> __global__ void __launch_bounds__(C::THREADS) k_flash_dkdv(FlashBwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_dkdv_cta<C, ATOMIC_DQ>(a, smem, blockIdx.x, (int)threadIdx.x);
}

template <class C> __global__ void __launch_bounds__(C::THREADS) k_flash_dq(FlashBwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_dq_cta<C>(a, smem, blockIdx.x, (int)threadIdx.x);
}

template <int D> void flash_launch_delta(const FlashBwdArgs &a, int64_t n_items)
{
    k_flash_delta<D, FlashTiles<D>::Dq::BM><<<(unsigned)n_items, FLASH_DELTA_THREADS>>>(a);
    CUDA_LAUNCHED("cuda_flash_bwd delta");
}

template <int D> void flash_launch_dkdv(const FlashBwdArgs &a, int64_t n_items, bool atomic_dq)
{
    using C = typename FlashTiles<D>::Dkdv;
    const unsigned blocks = (unsigned)(n_items * (a.n_heads / a.group));
    if (atomic_dq) {
        static bool smem_set = false;
        flash_allow_smem(k_flash_dkdv<C, true>, C::SMEM, &smem_set, "cuda_flash_bwd dk, dv");
        k_flash_dkdv<C, true><<<blocks, C::THREADS, C::SMEM>>>(a);
    } else {
        static bool smem_set = false;
        flash_allow_smem(k_flash_dkdv<C, false>, C::SMEM, &smem_set, "cuda_flash_bwd dk, dv");
        k_flash_dkdv<C, false><<<blocks, C::THREADS, C::SMEM>>>(a);
    }
    CUDA_LAUNCHED("cuda_flash_bwd dk, dv");
}

template <int D> void flash_launch_dq(const FlashBwdArgs &a, int64_t n_items)
{
    using C = typename FlashTiles<D>::Dq;
    static bool smem_set = false;
    flash_allow_smem(k_flash_dq<C>, C::SMEM, &smem_set, "cuda_flash_bwd dq");
    k_flash_dq<C><<<(unsigned)(n_items * a.n_heads), C::THREADS, C::SMEM>>>(a);
    CUDA_LAUNCHED("cuda_flash_bwd dq");
}

template void flash_launch_delta<64>(const FlashBwdArgs &, int64_t);
template void flash_launch_delta<128>(const FlashBwdArgs &, int64_t);
template void flash_launch_dkdv<64>(const FlashBwdArgs &, int64_t, bool);
template void flash_launch_dkdv<128>(const FlashBwdArgs &, int64_t, bool);
template void flash_launch_dq<64>(const FlashBwdArgs &, int64_t);
template void flash_launch_dq<128>(const FlashBwdArgs &, int64_t);
