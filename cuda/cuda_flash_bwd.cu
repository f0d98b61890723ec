/*
 * cuda/cuda_flash_bwd.cu - the backward kernels of the flash attention (the blocks are in
 * cuda_flash_bwd.cuh): Delta, dK/dV (with or without dQ by atomics) and dQ, one instance per head
 * size and per kind of segment list (causal, or full: every query sees every key).
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_bwd.cuh"
#include "cuda/cuda_flash_launch.cuh"

enum { FLASH_DELTA_THREADS = 256 };

template <int D, int BM> __global__ void __launch_bounds__(FLASH_DELTA_THREADS) k_flash_delta(FlashBwdArgs a)
{
    flash_delta_cta<D, BM, FLASH_DELTA_THREADS>(a, blockIdx.x, (int)threadIdx.x);
}

template <class C, bool ATOMIC_DQ, bool FULL>
__global__ void __launch_bounds__(C::THREADS) k_flash_dkdv(FlashBwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_dkdv_cta<C, ATOMIC_DQ, FULL>(a, smem, blockIdx.x, (int)threadIdx.x);
}

template <class C, bool FULL> __global__ void __launch_bounds__(C::THREADS) k_flash_dq(FlashBwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    flash_dq_cta<C, FULL>(a, smem, blockIdx.x, (int)threadIdx.x);
}

/* Launches kernel k (blocks of C) once its shared memory limit is raised (flag: one per kernel). */
template <class C, class K> static void launch(K k, bool *smem_set, const char *name, unsigned blocks, const FlashBwdArgs &a)
{
    flash_allow_smem(k, C::SMEM, smem_set, name);
    k<<<blocks, C::THREADS, C::SMEM>>>(a);
}

template <int D> void flash_launch_delta(const FlashBwdArgs &a, int64_t n_items)
{
    k_flash_delta<D, FlashTiles<D>::Dq::BM><<<(unsigned)n_items, FLASH_DELTA_THREADS>>>(a);
    CUDA_LAUNCHED("cuda_flash_bwd delta");
}

template <int D> void flash_launch_dkdv(const FlashBwdArgs &a, int64_t n_items, bool atomic_dq, bool full)
{
    using C = typename FlashTiles<D>::Dkdv;
    const unsigned blocks = (unsigned)(n_items * (a.n_heads / a.group));
    const char *name = "cuda_flash_bwd dk, dv";
    static bool set[4];
    if (atomic_dq && full)
        launch<C>(k_flash_dkdv<C, true, true>, &set[0], name, blocks, a);
    else if (atomic_dq)
        launch<C>(k_flash_dkdv<C, true, false>, &set[1], name, blocks, a);
    else if (full)
        launch<C>(k_flash_dkdv<C, false, true>, &set[2], name, blocks, a);
    else
        launch<C>(k_flash_dkdv<C, false, false>, &set[3], name, blocks, a);
    CUDA_LAUNCHED(name);
}

template <int D> void flash_launch_dq(const FlashBwdArgs &a, int64_t n_items, bool full)
{
    using C = typename FlashTiles<D>::Dq;
    const unsigned blocks = (unsigned)(n_items * a.n_heads);
    static bool set[2];
    if (full)
        launch<C>(k_flash_dq<C, true>, &set[0], "cuda_flash_bwd dq", blocks, a);
    else
        launch<C>(k_flash_dq<C, false>, &set[1], "cuda_flash_bwd dq", blocks, a);
    CUDA_LAUNCHED("cuda_flash_bwd dq");
}

template void flash_launch_delta<64>(const FlashBwdArgs &, int64_t);
template void flash_launch_delta<128>(const FlashBwdArgs &, int64_t);
template void flash_launch_dkdv<64>(const FlashBwdArgs &, int64_t, bool, bool);
template void flash_launch_dkdv<128>(const FlashBwdArgs &, int64_t, bool, bool);
template void flash_launch_dq<64>(const FlashBwdArgs &, int64_t, bool);
template void flash_launch_dq<128>(const FlashBwdArgs &, int64_t, bool);
