/*
 * cuda/cuda_attention_merge.cu - attention over key blocks merged by log-sum-exp (engine/ops.h:
 * attention_merge, attention_merge_store), for context parallelism's block-by-block attention.
 *
 * Per query row and head: (acc, acc_lse) holds the attention over the blocks seen so far (float32),
 * (part, part_lse) one more block's (the compute dtype). With m = max(acc_lse, part_lse),
 * wa = e^(acc_lse - m), wb = e^(part_lse - m):  acc = (wa acc + wb part) / (wa + wb),
 * acc_lse = m + log(wa + wb) - the softmax over the union of the keys, each block's output weighed
 * by its share of the denominator. A row whose part_lse is -inf (no key in the block) keeps acc.
 *
 * The rows are the query rows of the call's segments (host memory): their list goes to the device
 * through the flash plans' cache (cuda_flash_plan: uploaded once per distinct segment list), and one
 * block handles one tile of MERGE_ROWS rows of one segment for every head.
 */
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash_launch.cuh"

enum { MERGE_ROWS = 64, MERGE_THREADS = 256 };

/* The plan whose forward list cuts the segments into tiles of MERGE_ROWS query rows. */
static FlashDevPlan merge_plan(const char *where, const AttnSegment *segs, int64_t n, int n_heads)
{
    return cuda_flash_plan(where, segs, n, FlashPlanShape{MERGE_ROWS, 64, MERGE_ROWS, 64, 64, MERGE_ROWS}, n_heads);
}

template <class T> __device__ __forceinline__ float merge_load(const T *p) { return (float)*p; }
template <> __device__ __forceinline__ float merge_load<bf16>(const bf16 *p) { return __bfloat162float(*p); }

template <class T>
__global__ void __launch_bounds__(MERGE_THREADS)
    k_attention_merge(float *acc, float *acc_lse, const T *part, const float *part_lse, const int4 *segs,
                      const int2 *items, int n_heads, int head_dim, int64_t o_stride, int first)
{
    __shared__ float wa[MERGE_ROWS], wb[MERGE_ROWS];
    const int2 item = items[blockIdx.x];
    const int4 g = segs[item.x];
    const int h = blockIdx.y, rows = min(MERGE_ROWS, g.y - item.y);
    const int64_t row0 = (int64_t)g.x + item.y;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        float *la = acc_lse + (row0 + r) * n_heads + h, lb = part_lse[(row0 + r) * n_heads + h];
        float a = 0.0f, b = 1.0f; /* first: acc = part */
        if (!first && *la != -INFINITY) {
            if (lb == -INFINITY) {
                a = 1.0f;
                b = 0.0f;
            } else {
                const float m = fmaxf(*la, lb), ea = expf(*la - m), eb = expf(lb - m), inv = 1.0f / (ea + eb);
                a = ea * inv;
                b = eb * inv;
                lb = m + logf(ea + eb);
            }
        }
        wa[r] = a;
        wb[r] = b;
        if (b != 0.0f)
            *la = lb;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * head_dim; e += blockDim.x) {
        const int r = e / head_dim, d = e % head_dim;
        const int64_t at = (row0 + r) * o_stride + (int64_t)h * head_dim + d;
        const float bv = wb[r];
        if (bv == 0.0f)
            continue;
        const float pv = merge_load<T>(part + at);
        acc[at] = wa[r] == 0.0f ? pv : wa[r] * acc[at] + bv * pv;
    }
}

template <class T>
__global__ void __launch_bounds__(MERGE_THREADS)
    k_attention_merge_store(T *out, float *lse, const float *acc, const float *acc_lse, const int4 *segs,
                            const int2 *items, int n_heads, int head_dim, int64_t o_stride)
{
    const int2 item = items[blockIdx.x];
    const int4 g = segs[item.x];
    const int h = blockIdx.y, rows = min(MERGE_ROWS, g.y - item.y);
    const int64_t row0 = (int64_t)g.x + item.y;
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        lse[(row0 + r) * n_heads + h] = acc_lse[(row0 + r) * n_heads + h];
    for (int e = threadIdx.x; e < rows * head_dim; e += blockDim.x) {
        const int64_t at = (row0 + e / head_dim) * o_stride + (int64_t)h * head_dim + e % head_dim;
        out[at] = (T)acc[at];
    }
}

template <class T>
void cuda_attention_merge(float *acc, float *acc_lse, const Act *part, const float *part_lse, const AttnSegment *segs,
                          int64_t n_segs, AttnShape a, int first)
{
    const FlashDevPlan p = merge_plan("attention_merge", segs, n_segs, a.n_heads);
    if (p.plan->fwd_count == 0)
        return;
    dim3 grid((unsigned)p.plan->fwd_count, (unsigned)a.n_heads);
    k_attention_merge<T><<<grid, MERGE_THREADS>>>(acc, acc_lse, (const T *)part, part_lse, p.segs,
                                                  p.items + p.plan->fwd_begin, a.n_heads, a.head_dim, a.o_stride,
                                                  first);
    CUDA_CHECK(cudaGetLastError());
}

template <class T>
void cuda_attention_merge_store(Act *out, float *lse, const float *acc, const float *acc_lse, const AttnSegment *segs,
                                int64_t n_segs, AttnShape a)
{
    const FlashDevPlan p = merge_plan("attention_merge_store", segs, n_segs, a.n_heads);
    if (p.plan->fwd_count == 0)
        return;
    dim3 grid((unsigned)p.plan->fwd_count, (unsigned)a.n_heads);
    k_attention_merge_store<T><<<grid, MERGE_THREADS>>>((T *)out, lse, acc, acc_lse, p.segs,
                                                        p.items + p.plan->fwd_begin, a.n_heads, a.head_dim,
                                                        a.o_stride);
    CUDA_CHECK(cudaGetLastError());
}

#define INSTANTIATE(T)                                                                             \
    template void cuda_attention_merge<T>(float *, float *, const Act *, const float *, const AttnSegment *, int64_t, \
                                          AttnShape, int);                                        \
    template void cuda_attention_merge_store<T>(Act *, float *, const float *, const float *, const AttnSegment *, \
                                                int64_t, AttnShape);
INSTANTIATE(float)
INSTANTIATE(bf16)
