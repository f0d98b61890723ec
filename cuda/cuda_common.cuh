/*
 * cuda/cuda_common.cuh - what the CUDA backend's files share: error checks, launch shapes, the
 * compute dtype, the backend's scratch memory, and the entry points across files.
 *
 * The compute dtype (engine/ops.h) is a template parameter of the kernels: float for
 * train.precision: fp32, __nv_bfloat16 for bf16. Each op is one template instantiated twice, and
 * the two op tables of cuda_ops.cu point at the two instances.
 */
#ifndef WLB_CUDA_CUDA_COMMON_CUH
#define WLB_CUDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/ops.h"
#include "util/error.h"

/* A failed CUDA call ends the process through the one fatal path (util/error.h): the ops have no
 * error path (see cuda_ops.h). */
#define cuda_fatal(where, what) wlb_fatal_at(__FILE__, __LINE__, "cuda: %s: %s", (where), (what))

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            cuda_fatal(#call, cudaGetErrorString(e_));                                             \
    } while (0)

/* After a kernel launch: the launch error, if any. */
#define CUDA_LAUNCHED(name)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            cuda_fatal(name, cudaGetErrorString(e_));                                              \
    } while (0)

enum { CUDA_THREADS = 256 };

/* Blocks for a grid-stride loop over n elements (at most 65535 x 64: the loop covers the rest). */
static inline unsigned cuda_blocks(int64_t n)
{
    int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 64 ? 65535 * 64 : b);
}

#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* The compute dtype: load as float, store rounded to nearest even. */
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

/* Sums over a block (blockDim.x a multiple of 32, at most 1024): every thread gets the sum, in an
 * order fixed by the block shape (the same bits every run): warps by shuffles, then the warps'
 * partial results in order. */
static __device__ __forceinline__ double block_sum(double v)
{
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < warps; i++)
        s += part[i];
    return s;
}

static __device__ __forceinline__ float block_max(float v)
{
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float m = part[0];
    for (int i = 1; i < warps; i++)
        m = fmaxf(m, part[i]);
    return m;
}


/* The backend's own buffers come from the device's memory pool in the compute stream's order
 * (cudaMallocAsync, cudaFreeAsync on the default stream): unlike cudaMalloc and cudaFree they wait
 * for nothing - not the device, not the communication streams - so a buffer that grows in the middle
 * of a step stalls no collective. A buffer freed this way is reused only by work queued after the free
 * on the compute stream, where every kernel that reads these buffers runs. cuda_ops_open keeps the
 * pool's memory once taken (its release threshold), so growing costs no trip to the driver twice. */
static inline void *cuda_stream_alloc(size_t bytes)
{
    void *p = nullptr;
    CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, 0));
    return p;
}

static inline void cuda_stream_free(void *p)
{
    if (p)
        CUDA_CHECK(cudaFreeAsync(p, 0));
}

/* A device buffer that grows on demand (contents not kept), from the stream-ordered pool; release()
 * at close. */
struct CudaScratch {
    void *p = nullptr;
    size_t bytes = 0;
    void *get(size_t want)
    {
        if (want > bytes) {
            cuda_stream_free(p);
            size_t n = want > 2 * bytes ? want : 2 * bytes;
            p = cuda_stream_alloc(n);
            bytes = n;
        }
        return p;
    }
    /* Grows to at least want bytes (exactly want) without a fatal error: 1, or 0 when the device's
     * memory cannot hold them (the error cleared; the buffer keeps what it had). */
    int reserve(size_t want)
    {
        if (want <= bytes)
            return 1;
        void *q = nullptr;
        if (cudaMallocAsync(&q, want, 0) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        release();
        p = q, bytes = want;
        return 1;
    }
    void release()
    {
        cuda_stream_free(p);
        p = nullptr;
        bytes = 0;
    }
};

/* The ops that depend on the compute dtype T (float or bf16), each instantiated for both; see
 * engine/ops.h for their contracts. The file is named after each group. */
/* cuda_kernels.cu */
template <class T> void cuda_copy_rows(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows,
                                       const void *src, Dt src_dt, int64_t src_stride, const int64_t *src_rows,
                                       int64_t n, int64_t width);
template <class T> void cuda_rmsnorm_fwd(Act *out, float *rstd, const float *x, const float *w, int64_t T_, int64_t d,
                                         float eps);
template <class T> void cuda_rmsnorm_bwd(float *dx, Act *dx_act, float *dw, const float *dout, const float *x,
                                         const float *w, const float *rstd, int64_t T_, int64_t d);
template <class T> void cuda_rope_fwd(Act *x, int64_t stride, const int32_t *positions, int64_t T_, int n_heads,
                                      int head_dim, const float *inv_freq, float scale);
template <class T> void cuda_rope_bwd(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                                      const int32_t *positions, int64_t T_, int n_heads, int head_dim,
                                      const float *inv_freq, float scale);
template <class T> void cuda_swiglu_fwd(Act *out, const Act *gu, int64_t T_, int64_t F);
template <class T> void cuda_swiglu_bwd(Act *dgu, const float *dout, const Act *gu, int64_t T_, int64_t F);
template <class T> void cuda_adamw(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n,
                                   const AdamWSpan *spans, int n_spans, AdamWStep s);
/* cuda_loss.cu */
void cuda_ce_stats(double *stats, const float *logits, const int32_t *targets, int64_t T_, int64_t V, int64_t vocab0,
                   int first);
template <class T> void cuda_ce_grad(Act *dlogits, const float *logits, const double *lse, const int32_t *targets,
                                     int64_t T_, int64_t V, int64_t vocab0, float dloss);
/* cuda_embedding.cu */
void cuda_embedding_fwd(float *out, const int32_t *tokens, int64_t T_, const float *table, int64_t row0, int64_t rows,
                        int64_t d);
void cuda_embedding_bwd(float *dtable, const int32_t *tokens, const float *dout, int64_t T_, int64_t row0,
                        int64_t rows, int64_t d);
/* cuda_matmul.cu */
template <class T> void cuda_matmul_fwd(MatOut out, const Act *x, const Act *w, int64_t T_, int64_t n_in,
                                        int64_t n_out);
template <class T> void cuda_matmul_bwd_dx(MatOut dx, const Act *dout, const Act *w, int64_t T_, int64_t n_in,
                                           int64_t n_out);
template <class T> void cuda_matmul_bwd_dw(float *dw, const Act *dout, const Act *x, int64_t T_, int64_t n_in,
                                           int64_t n_out);
/* cuda_attention.cu */
template <class T> void cuda_attention_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v,
                                           const AttnSegment *segs, int64_t n_segs, AttnShape shape);
template <class T> void cuda_attention_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out,
                                           const float *lse, const Act *q, const Act *k, const Act *v,
                                           const AttnSegment *segs, int64_t n_segs, AttnShape shape);
/* cuda_attention_merge.cu */
template <class T> void cuda_attention_merge(float *acc, float *acc_lse, const Act *part, const float *part_lse,
                                             const AttnSegment *segs, int64_t n_segs, AttnShape shape, int first);
template <class T> void cuda_attention_merge_store(Act *out, float *lse, const float *acc, const float *acc_lse,
                                                   const AttnSegment *segs, int64_t n_segs, AttnShape shape);

/* Scratch of the element-wise and loss kernels, and the embedding's sort, released at close. */
void cuda_kernels_close(void);
void cuda_embedding_close(void);

/* cuda_matmul.cu: the cuBLASLt handle, its workspace and its plan cache (opened once), released at
 * close; with deterministic no algorithm that reduces with atomics. */
void cuda_matmul_open(int deterministic);
void cuda_matmul_close(void);

/* cuda_attention.cu: the float32 reference kernels (any head size in cuda_attention_supports), and
 * whether the next backward must be deterministic (train.deterministic). */
void cuda_attention_fwd_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                            const AttnSegment *segs, int64_t n_segs, AttnShape shape);
void cuda_attention_bwd_f32(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                            AttnShape shape);
int cuda_attention_supports(int head_dim);
void cuda_attention_set_deterministic(int deterministic);
void cuda_attention_close(void);
/* cuda_attention_select.cu: which implementation the bf16 attention takes at head sizes 64 and 128
 * (train.attention: auto, cudnn, own; engine/backend.h's BackendAttention) and whether backwards
 * must be deterministic (train.deterministic); 0, or -1 and an Error (train.attention, status 2) when
 * cudnn is asked for and this build or machine has none. bf16_fwd, bf16_bwd: the ops there (the
 * contracts of engine/ops.h); select_close frees what the choice holds (cuDNN's plans, scratch). */
int cuda_attention_select(int impl, int deterministic, int local_rank, Error *err);
void cuda_attention_bf16_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                             int64_t n_segs, AttnShape a);
void cuda_attention_bf16_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                             const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                             AttnShape a);
void cuda_attention_select_close(void);
/* Ops.attention_reserve (engine/ops.h): cuDNN's buffers, where train.attention may run cuDNN. */
int cuda_attention_reserve(int n_heads, int n_kv_heads, int head_dim, int64_t rows);

/* cuda_cudnn.cu: the engine's attention on cuDNN's fused attention (bf16 arrays, head sizes 64 and
 * 128). available: 1 when the build has the path and libcudnn.so.9 loads, else 0 and why. fwd and bwd
 * (the contracts of engine/ops.h; bwd adds into dq, dk, dv): 1 when done, 0 and why when cuDNN does
 * not take this call (its shape, or no plan for it), with nothing written; a failure after that is
 * fatal. deterministic: cuDNN's deterministic backward, declined (0) where its workspace is too big. */
extern "C" int cuda_cudnn_attention_available(char *why, size_t why_size);
extern "C" int cuda_cudnn_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
                                        const AttnSegment *segs, int64_t n_segs, AttnShape s, char *why,
                                        size_t why_size);
extern "C" int cuda_cudnn_attention_bwd(float *dq, float *dk, float *dv, const void *dout, const void *out,
                                        const float *lse, const void *q, const void *k, const void *v,
                                        const AttnSegment *segs, int64_t n_segs, AttnShape s, int deterministic,
                                        char *why, size_t why_size);
/* close: frees the plans and scratch; with report, says on stderr how many plans the run built and
 * what building them cost (one process a machine says it: the local rank 0). */
extern "C" void cuda_cudnn_attention_close(int report);
/* Takes cuDNN's workspace, gradient scratch and batch arrays for calls of at most `rows` rows
 * (ops_cudnn_buffers; deterministic: with its deterministic backward's): 0, or -1 when the device's
 * memory cannot hold them. */
extern "C" int cuda_cudnn_attention_reserve(int n_heads, int n_kv_heads, int head_dim, int64_t rows, int deterministic);
/* For --version: whether the path is built and which libcudnn it finds (no GPU needed). */
extern "C" void cuda_cudnn_describe(char *buf, size_t size);

#endif
