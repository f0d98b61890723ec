/*
 * cuda/cuda_embedding.cu - the vocabulary-parallel embedding on the GPU (see engine/ops.h).
 *
 * Forward: a gather of float32 master-weight rows. Backward, deterministically: a token that
 * occurs several times adds several rows of dout into one row of dtable, and atomics would add them
 * in a different order every run. So the rows are sorted by token (CUB's radix sort of (token,
 * row) pairs, which is stable: equal tokens keep their row order), and each run of equal tokens is
 * summed by one block per tile of columns, in row order, then added once. Cost: a sort of T pairs
 * and one pass over dout, the same as the atomics' pass.
 */
#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_common.cuh"

__global__ void k_embedding_fwd(float *out, const int32_t *tokens, int64_t T_, const float *table, int64_t row0,
                                int64_t rows, int64_t d)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    for (int64_t t = blockIdx.y; t < T_; t += gridDim.y) {
        int64_t r = (int64_t)tokens[t] - row0;
        out[t * d + j] = r >= 0 && r < rows ? table[r * d + j] : 0.0f;
    }
}

void cuda_embedding_fwd(float *out, const int32_t *tokens, int64_t T_, const float *table, int64_t row0, int64_t rows,
                        int64_t d)
{
    if (T_ * d == 0)
        return;
    dim3 grid((unsigned)((d + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)(T_ < 65535 ? T_ : 65535));
    k_embedding_fwd<<<grid, CUDA_THREADS>>>(out, tokens, T_, table, row0, rows, d);
    CUDA_LAUNCHED("embedding_fwd");
}

__global__ void k_iota(int32_t *x, int64_t n)
{
    GRID_STRIDE(i, n)
    x[i] = (int32_t)i;
}

/* Block (position i, column tile): when i starts a run of equal tokens, the run's rows summed in
 * order into its tokens's row. */
__global__ void k_embedding_bwd_runs(float *dtable, const uint32_t *tok, const int32_t *row, const float *dout,
                                     int64_t T_, int64_t row0, int64_t rows, int64_t d)
{
    int64_t i = blockIdx.x, j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
    if (j >= d || (i > 0 && tok[i] == tok[i - 1]))
        return;
    int64_t r = (int64_t)(int32_t)tok[i] - row0;
    if (r < 0 || r >= rows)
        return;
    float s = 0.0f;
    for (int64_t k = i; k < T_ && tok[k] == tok[i]; k++)
        s += dout[(int64_t)row[k] * d + j];
    dtable[r * d + j] += s;
}

static CudaScratch sort_keys, sort_vals, sort_temp;

void cuda_embedding_bwd(float *dtable, const int32_t *tokens, const float *dout, int64_t T_, int64_t row0,
                        int64_t rows, int64_t d)
{
    if (T_ * d == 0)
        return;
    if (T_ > INT32_MAX || T_ > 0x7fffffff / 2)
        cuda_fatal("embedding_bwd", "too many rows for one sort");
    /* keys: the tokens (non-negative ids, sorted as unsigned), values: their rows. */
    int n = (int)T_;
    uint32_t *keys = (uint32_t *)sort_keys.get((size_t)n * sizeof(uint32_t));
    int32_t *vals = (int32_t *)sort_vals.get((size_t)2 * n * sizeof(int32_t));
    k_iota<<<cuda_blocks(n), CUDA_THREADS>>>(vals, n);
    CUDA_LAUNCHED("embedding_bwd iota");
    size_t temp = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, (const uint32_t *)tokens, keys, vals, vals + n, n));
    void *t = sort_temp.get(temp);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(t, temp, (const uint32_t *)tokens, keys, vals, vals + n, n));
    dim3 grid((unsigned)n, (unsigned)((d + CUDA_THREADS - 1) / CUDA_THREADS));
    k_embedding_bwd_runs<<<grid, CUDA_THREADS>>>(dtable, keys, vals + n, dout, T_, row0, rows, d);
    CUDA_LAUNCHED("embedding_bwd");
}

void cuda_embedding_close(void)
{
    sort_keys.release();
    sort_vals.release();
    sort_temp.release();
}
