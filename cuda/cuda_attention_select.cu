/*
 * cuda/cuda_attention_select.cu - which kernels the bf16 attention runs at the head sizes of the
 * tensor-core kernels (64, 128): train.attention (engine/backend.h's BackendAttention).
 *
 *   own    the engine's kernels (cuda_flash.h).
 *   cudnn  cuDNN's fused attention (cuda_cudnn.cu); a call it declines is fatal, except a
 *          deterministic backward it declines (its workspace would be too big), which runs on the
 *          own deterministic kernels (said once).
 *   auto   with train.deterministic false and cuDNN loaded: the first forward of each attention shape
 *          (heads, head size, strides) runs cuDNN once (its plan is built then, outside the timing),
 *          then one forward of each implementation on that call's segments, timed by CUDA events,
 *          and compares their outputs: cuDNN is kept for the shape's forwards and backwards when it
 *          was faster and agrees with the own kernels (out within 2e-2 and lse within 1e-3, relative
 *          L2 over the segments' rows: both read the same bf16 inputs, so they differ by roundings
 *          of about 2^-9), else the own kernels; one line says which and why. With
 *          train.deterministic true auto is own: a choice made by timing could differ between two
 *          runs, and their bits with it.
 */
#include <math.h>

#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash.h"
#include "engine/backend.h"

static int attention_impl = BACKEND_ATTN_OWN; /* BackendAttention; auto only where cuDNN loaded */
static int deterministic = 1;
static int first_on_machine = 1; /* local rank 0: says what cuDNN's plans cost at close */

int cuda_attention_select(int impl, int deterministic_bwd, int local_rank, Error *err)
{
    char why[320];
    deterministic = deterministic_bwd;
    first_on_machine = local_rank == 0;
    cuda_attention_set_deterministic(deterministic_bwd);
    if (impl == BACKEND_ATTN_OWN || (impl == BACKEND_ATTN_AUTO && deterministic_bwd)) {
        attention_impl = BACKEND_ATTN_OWN;
        return 0;
    }
    if (!cuda_cudnn_attention_available(why, sizeof why)) {
        if (impl == BACKEND_ATTN_CUDNN)
            return error_set(err, "train.attention", "cudnn: %s", why);
        static int told;
        if (!told++)
            fprintf(stderr, "wlbtrain: attention: auto: cuDNN unavailable (%s): the engine's kernels\n", why);
        attention_impl = BACKEND_ATTN_OWN;
        return 0;
    }
    attention_impl = impl;
    return 0;
}

/* auto's choice per attention shape: cudnn 1 (cuDNN) or 0 (own). */
struct AutoChoice {
    AttnShape shape;
    int cudnn;
};
static std::vector<AutoChoice> auto_choices;
/* The own kernels' outputs of the first call, kept for the comparison; its sums. */
static CudaScratch reference_buf, sums_buf;

static AutoChoice *auto_find(AttnShape s)
{
    for (AutoChoice &c : auto_choices)
        if (c.shape.n_heads == s.n_heads && c.shape.n_kv_heads == s.n_kv_heads && c.shape.head_dim == s.head_dim &&
            c.shape.q_stride == s.q_stride && c.shape.kv_stride == s.kv_stride && c.shape.o_stride == s.o_stride)
            return &c;
    return nullptr;
}

/* Over the query rows of segment blockIdx.y: sums[0] += (out - ref)^2, sums[1] += ref^2 over the n_heads
 * * head_dim values of a row; sums[2], sums[3] the same of lse. In double, added with atomics (a check,
 * not a result: its order does not matter). */
__global__ void k_compare_rows(double *sums, const bf16 *out, const float *lse, const bf16 *ref_out,
                               const float *ref_lse, const AttnSegment *segs, int64_t n_segs, int64_t width,
                               int64_t o_stride, int n_heads)
{
    double d_out = 0, r_out = 0, d_lse = 0, r_lse = 0;
    for (int64_t s = blockIdx.y; s < n_segs; s += gridDim.y) {
        const AttnSegment g = segs[s];
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < g.q_len * width;
             i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t at = (g.q_row + i / width) * o_stride + i % width;
            const double a = __bfloat162float(out[at]), b = __bfloat162float(ref_out[at]);
            d_out += (a - b) * (a - b), r_out += b * b;
        }
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < g.q_len * n_heads;
             i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t at = g.q_row * n_heads + i;
            const double a = lse[at], b = ref_lse[at];
            d_lse += (a - b) * (a - b), r_lse += b * b;
        }
    }
    d_out = block_sum(d_out), r_out = block_sum(r_out), d_lse = block_sum(d_lse), r_lse = block_sum(r_lse);
    if (threadIdx.x == 0) {
        atomicAdd(&sums[0], d_out), atomicAdd(&sums[1], r_out);
        atomicAdd(&sums[2], d_lse), atomicAdd(&sums[3], r_lse);
    }
}

/* The relative L2 differences of out and lse between the call's outputs and ref_out, ref_lse. */
static void compare(const Act *out, const float *lse, const bf16 *ref_out, const float *ref_lse,
                    const AttnSegment *segs, int64_t n_segs, AttnShape a, double *err_out, double *err_lse)
{
    double *sums = (double *)sums_buf.get(4 * sizeof(double) + n_segs * sizeof(AttnSegment));
    AttnSegment *dev_segs = (AttnSegment *)(sums + 4);
    CUDA_CHECK(cudaMemsetAsync(sums, 0, 4 * sizeof(double), 0));
    CUDA_CHECK(cudaMemcpyAsync(dev_segs, segs, (size_t)n_segs * sizeof *segs, cudaMemcpyHostToDevice, 0));
    dim3 grid(64, (unsigned)(n_segs < 65535 ? (n_segs > 0 ? n_segs : 1) : 65535));
    k_compare_rows<<<grid, CUDA_THREADS>>>(sums, (const bf16 *)out, lse, ref_out, ref_lse, dev_segs, n_segs,
                                           (int64_t)a.n_heads * a.head_dim, a.o_stride, a.n_heads);
    CUDA_LAUNCHED("attention auto compare");
    double host[4];
    CUDA_CHECK(cudaMemcpy(host, sums, sizeof host, cudaMemcpyDeviceToHost));
    *err_out = host[1] > 0 ? sqrt(host[0] / host[1]) : sqrt(host[0]);
    *err_lse = host[3] > 0 ? sqrt(host[2] / host[3]) : sqrt(host[2]);
}

/* The forward on auto (see the top of the file). */
static void auto_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                     int64_t n_segs, AttnShape a)
{
    char why[320];
    if (const AutoChoice *c = auto_find(a)) {
        if (!c->cudnn || !cuda_cudnn_attention_fwd(out, lse, q, k, v, segs, n_segs, a, why, sizeof why))
            cuda_flash_fwd(out, lse, q, k, v, segs, n_segs, a);
        return;
    }
    AutoChoice choice = {a, 0};
    if (!cuda_cudnn_attention_fwd(out, lse, q, k, v, segs, n_segs, a, why, sizeof why)) {
        fprintf(stderr, "wlbtrain: attention: auto: cuDNN declines H %d/%d D %d (%s): the engine's kernels\n",
                a.n_heads, a.n_kv_heads, a.head_dim, why);
        auto_choices.push_back(choice);
        cuda_flash_fwd(out, lse, q, k, v, segs, n_segs, a);
        return;
    }
    /* the rows the outputs span: the own kernels' copy of them is the reference */
    int64_t rows = 0, q_rows = 0;
    for (int64_t i = 0; i < n_segs; i++) {
        rows = segs[i].q_row + segs[i].q_len > rows ? segs[i].q_row + segs[i].q_len : rows;
        q_rows += segs[i].q_len;
    }
    const size_t out_n = rows > 0 ? (size_t)((rows - 1) * a.o_stride + (int64_t)a.n_heads * a.head_dim) : 0,
                 lse_n = (size_t)(rows * a.n_heads);
    bf16 *ref_out = (bf16 *)reference_buf.get(out_n * sizeof(bf16) + lse_n * sizeof(float) + 16);
    float *ref_lse = (float *)(ref_out + ((out_n + 7) / 8) * 8);
    cudaEvent_t ev[4];
    for (cudaEvent_t &e : ev)
        CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(ev[0], 0));
    cuda_flash_fwd(out, lse, q, k, v, segs, n_segs, a);
    CUDA_CHECK(cudaEventRecord(ev[1], 0));
    CUDA_CHECK(cudaMemcpyAsync(ref_out, out, out_n * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
    CUDA_CHECK(cudaMemcpyAsync(ref_lse, lse, lse_n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
    CUDA_CHECK(cudaEventRecord(ev[2], 0));
    if (!cuda_cudnn_attention_fwd(out, lse, q, k, v, segs, n_segs, a, why, sizeof why))
        cuda_fatal("attention_fwd (auto)", why); /* its plan is cached: it took the same call just before */
    CUDA_CHECK(cudaEventRecord(ev[3], 0));
    CUDA_CHECK(cudaEventSynchronize(ev[3]));
    float own_ms = 0, cudnn_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&own_ms, ev[0], ev[1]));
    CUDA_CHECK(cudaEventElapsedTime(&cudnn_ms, ev[2], ev[3]));
    for (cudaEvent_t &e : ev)
        CUDA_CHECK(cudaEventDestroy(e));
    double err_out, err_lse;
    compare(out, lse, ref_out, ref_lse, segs, n_segs, a, &err_out, &err_lse);
    const int agrees = err_out <= 2e-2 && err_lse <= 1e-3;
    choice.cudnn = agrees && cudnn_ms < own_ms;
    auto_choices.push_back(choice);
    fprintf(stderr,
            "wlbtrain: attention: auto: forward of %lld query rows in %lld segments, H %d/%d D %d: cuDNN %.3f ms, "
            "own %.3f ms, outputs apart by %.1e (out) and %.1e (lse): %s\n",
            (long long)q_rows, (long long)n_segs, a.n_heads, a.n_kv_heads, a.head_dim, cudnn_ms, own_ms, err_out,
            err_lse, choice.cudnn ? "cuDNN" : agrees ? "own (faster)" : "own (cuDNN's outputs differ)");
    if (!choice.cudnn) { /* the outputs are cuDNN's: the own kernels' go back */
        CUDA_CHECK(cudaMemcpyAsync(out, ref_out, out_n * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
        CUDA_CHECK(cudaMemcpyAsync(lse, ref_lse, lse_n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
    }
}

void cuda_attention_bf16_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                             int64_t n_segs, AttnShape a)
{
    char why[320];
    if (attention_impl == BACKEND_ATTN_CUDNN) {
        if (!cuda_cudnn_attention_fwd(out, lse, q, k, v, segs, n_segs, a, why, sizeof why))
            cuda_fatal("attention_fwd (train.attention: cudnn)", why);
    } else if (attention_impl == BACKEND_ATTN_AUTO) {
        auto_fwd(out, lse, q, k, v, segs, n_segs, a);
    } else {
        cuda_flash_fwd(out, lse, q, k, v, segs, n_segs, a);
    }
}

/* cuDNN's where the forward's choice was cuDNN, unless it declines the call - a deterministic backward
 * whose workspace is too big, or on auto a shape it has no plan for - then the engine's kernels. */
void cuda_attention_bf16_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                             const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                             AttnShape a)
{
    char why[320];
    const AutoChoice *c = attention_impl == BACKEND_ATTN_AUTO ? auto_find(a) : nullptr;
    if (attention_impl == BACKEND_ATTN_CUDNN || (c && c->cudnn)) {
        if (cuda_cudnn_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a, deterministic, why,
                                     sizeof why))
            return;
        if (attention_impl == BACKEND_ATTN_CUDNN && !deterministic)
            cuda_fatal("attention_bwd (train.attention: cudnn)", why);
        static int told;
        if (!told++)
            fprintf(stderr, "wlbtrain: attention: backward on the engine's kernels: %s\n", why);
    }
    cuda_flash_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a, deterministic);
}

int cuda_attention_reserve(int n_heads, int n_kv_heads, int head_dim, int64_t rows)
{
    if (attention_impl == BACKEND_ATTN_OWN || (head_dim != 64 && head_dim != 128))
        return 0;
    return cuda_cudnn_attention_reserve(n_heads, n_kv_heads, head_dim, rows, deterministic);
}

void cuda_attention_select_close(void)
{
    cuda_cudnn_attention_close(first_on_machine);
    auto_choices.clear();
    reference_buf.release();
    sums_buf.release();
}
