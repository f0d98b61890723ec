/*
 * cuda/cuda_kernels.cu - the element-wise and row-wise ops of the CUDA backend, in the compute dtype
 * T (float or bf16; see cuda_common.cuh): rows between dtypes, RMSNorm with its cast, RoPE on the
 * fused q | k | v rows, SwiGLU on the fused gate | up rows, and AdamW over every parameter in one
 * launch writing the compute copy of the weights. Each kernel does what the CPU op of the same name
 * does (cpu/cpu_ops.c): float32 arithmetic, double where the CPU sums in double, every sum in an
 * order fixed by the launch shape (the same bits run after run).
 */
#include <math.h>

#include "cuda/cuda_common.cuh"

/* An Act (or float) array as T. */
template <class T> static __host__ __device__ __forceinline__ T *as(Act *p) { return (T *)p; }

/* ---------------------------------------------------------------------------------------------- */
/* Rows between dtypes: grid (column tiles, row groups), each block a tile of one row at a time     */

template <class D, class S>
__global__ void k_copy_rows(D *dst, int64_t ds, const int64_t *dr, const S *src, int64_t ss, const int64_t *sr,
                            int64_t n, int64_t width)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= width)
        return;
    for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
        int64_t a = dr ? dr[i] : i, b = sr ? sr[i] : i;
        dst[a * ds + j] = from_f32<D>(to_f32(src[b * ss + j]));
    }
}

template <class D, class S>
static void launch_copy_rows(void *dst, int64_t ds, const int64_t *dr, const void *src, int64_t ss, const int64_t *sr,
                             int64_t n, int64_t width)
{
    dim3 grid((unsigned)((width + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)(n < 65535 ? n : 65535));
    k_copy_rows<D, S><<<grid, CUDA_THREADS>>>((D *)dst, ds, dr, (const S *)src, ss, sr, n, width);
    CUDA_LAUNCHED("copy_rows");
}

template <class T>
void cuda_copy_rows(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src, Dt src_dt,
                    int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width)
{
    if (n <= 0 || width <= 0)
        return;
    int d_act = dst_dt == DT_ACT, s_act = src_dt == DT_ACT;
    if (d_act && s_act)
        launch_copy_rows<T, T>(dst, dst_stride, dst_rows, src, src_stride, src_rows, n, width);
    else if (d_act)
        launch_copy_rows<T, float>(dst, dst_stride, dst_rows, src, src_stride, src_rows, n, width);
    else if (s_act)
        launch_copy_rows<float, T>(dst, dst_stride, dst_rows, src, src_stride, src_rows, n, width);
    else
        launch_copy_rows<float, float>(dst, dst_stride, dst_rows, src, src_stride, src_rows, n, width);
}

/* ---------------------------------------------------------------------------------------------- */
/* RMSNorm: one block per row                                                                      */

template <class T> __global__ void k_rmsnorm_fwd(T *out, float *rstd, const float *x, const float *w, int64_t d, float eps)
{
    const float *xt = x + blockIdx.x * d;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        ss += (double)xt[i] * xt[i];
    ss = block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / (double)d + eps));
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        out[blockIdx.x * d + i] = from_f32<T>(xt[i] * r * w[i]);
}

/* dx += dy w r - x r^3 mean(dy w x); dx_act = dx in the compute dtype. */
template <class T>
__global__ void k_rmsnorm_bwd_dx(float *dx, T *dx_act, const float *dout, const float *x, const float *w,
                                 const float *rstd, int64_t d)
{
    const float *xt = x + blockIdx.x * d, *dy = dout + blockIdx.x * d;
    double dot = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        dot += (double)dy[i] * w[i] * xt[i];
    dot = block_sum(dot);
    float r = rstd[blockIdx.x], c = (float)(dot / (double)d) * r * r * r;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float v = dx[blockIdx.x * d + i] + (dy[i] * w[i] * r - xt[i] * c);
        dx[blockIdx.x * d + i] = v;
        if (dx_act)
            dx_act[blockIdx.x * d + i] = from_f32<T>(v);
    }
}

/* dw partial sums: block (column block, row chunk), one column per thread; then the chunks in order. */
enum { NORM_ROWS = 256 };

__global__ void k_rmsnorm_bwd_dw(float *partial, const float *dout, const float *x, const float *rstd, int64_t T,
                                 int64_t d)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, t0 = blockIdx.y * (int64_t)NORM_ROWS;
    if (j >= d)
        return;
    float s = 0;
    for (int64_t t = t0; t < T && t < t0 + NORM_ROWS; t++)
        s += dout[t * d + j] * x[t * d + j] * rstd[t];
    partial[blockIdx.y * d + j] = s;
}

__global__ void k_sum_chunks(float *dw, const float *partial, int64_t chunks, int64_t d)
{
    GRID_STRIDE(j, d)
    {
        float s = 0;
        for (int64_t c = 0; c < chunks; c++)
            s += partial[c * d + j];
        dw[j] += s;
    }
}

template <class T>
void cuda_rmsnorm_fwd(Act *out, float *rstd, const float *x, const float *w, int64_t T_, int64_t d, float eps)
{
    if (T_ == 0)
        return;
    k_rmsnorm_fwd<T><<<(unsigned)T_, CUDA_THREADS>>>(as<T>(out), rstd, x, w, d, eps);
    CUDA_LAUNCHED("rmsnorm_fwd");
}

static CudaScratch norm_scratch;

template <class T>
void cuda_rmsnorm_bwd(float *dx, Act *dx_act, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int64_t T_, int64_t d)
{
    if (T_ == 0)
        return;
    k_rmsnorm_bwd_dx<T><<<(unsigned)T_, CUDA_THREADS>>>(dx, as<T>(dx_act), dout, x, w, rstd, d);
    CUDA_LAUNCHED("rmsnorm_bwd dx");
    int64_t chunks = (T_ + NORM_ROWS - 1) / NORM_ROWS;
    float *partial = (float *)norm_scratch.get((size_t)(chunks * d) * sizeof(float));
    dim3 grid((unsigned)((d + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)chunks);
    k_rmsnorm_bwd_dw<<<grid, CUDA_THREADS>>>(partial, dout, x, rstd, T_, d);
    CUDA_LAUNCHED("rmsnorm_bwd dw");
    k_sum_chunks<<<cuda_blocks(d), CUDA_THREADS>>>(dw, partial, chunks, d);
    CUDA_LAUNCHED("rmsnorm_bwd sum");
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE: a thread per (row, frequency), the angle in double, the heads of the row in turn          */

template <class T>
__global__ void k_rope_fwd(T *x, int64_t stride, const int32_t *positions, int64_t T_, int n_heads, int head_dim,
                           const float *inv_freq, float scale)
{
    int half = head_dim / 2;
    GRID_STRIDE(k, T_ * half)
    {
        int64_t t = k / half;
        int i = (int)(k % half);
        double s, c;
        sincos((double)positions[t] * inv_freq[i], &s, &c);
        float cf = (float)(c * scale), sf = (float)(s * scale);
        for (int h = 0; h < n_heads; h++) {
            T *p = x + t * stride + (int64_t)h * head_dim;
            float a = to_f32(p[i]), b = to_f32(p[i + half]);
            p[i] = from_f32<T>(a * cf - b * sf);
            p[i + half] = from_f32<T>(b * cf + a * sf);
        }
    }
}

/* The inverse rotation from the float32 gradient g into dx (compute dtype). */
template <class T>
__global__ void k_rope_bwd(T *dx, int64_t dx_stride, const float *g, int64_t g_stride, const int32_t *positions,
                           int64_t T_, int n_heads, int head_dim, const float *inv_freq, float scale)
{
    int half = head_dim / 2;
    GRID_STRIDE(k, T_ * half)
    {
        int64_t t = k / half;
        int i = (int)(k % half);
        double s, c;
        sincos((double)positions[t] * inv_freq[i], &s, &c);
        float cf = (float)(c * scale), sf = (float)(-s * scale);
        for (int h = 0; h < n_heads; h++) {
            const float *p = g + t * g_stride + (int64_t)h * head_dim;
            T *o = dx + t * dx_stride + (int64_t)h * head_dim;
            float a = p[i], b = p[i + half];
            o[i] = from_f32<T>(a * cf - b * sf);
            o[i + half] = from_f32<T>(b * cf + a * sf);
        }
    }
}

template <class T>
void cuda_rope_fwd(Act *x, int64_t stride, const int32_t *positions, int64_t T_, int n_heads, int head_dim,
                   const float *inv_freq, float scale)
{
    if (T_ == 0)
        return;
    k_rope_fwd<T><<<cuda_blocks(T_ * (head_dim / 2)), CUDA_THREADS>>>(as<T>(x), stride, positions, T_, n_heads,
                                                                     head_dim, inv_freq, scale);
    CUDA_LAUNCHED("rope_fwd");
}

template <class T>
void cuda_rope_bwd(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                   const int32_t *positions, int64_t T_, int n_heads, int head_dim, const float *inv_freq,
                   float scale)
{
    if (T_ == 0)
        return;
    int64_t rotated = (int64_t)n_heads * head_dim;
    k_rope_bwd<T><<<cuda_blocks(T_ * (head_dim / 2)), CUDA_THREADS>>>(as<T>(dx), dx_stride, g, g_stride, positions,
                                                                     T_, n_heads, head_dim, inv_freq, scale);
    CUDA_LAUNCHED("rope_bwd");
    if (width > rotated) /* the columns after the rotated heads (v): cast only */
        cuda_copy_rows<T>(as<T>(dx) + rotated, DT_ACT, dx_stride, nullptr, g + rotated, DT_F32, g_stride, nullptr, T_,
                          width - rotated);
}

/* ---------------------------------------------------------------------------------------------- */
/* SwiGLU on rows of gate | up: silu(g) = g s(g), s = sigmoid; d silu / dg = s (1 + g (1 - s))      */

template <class T> __global__ void k_swiglu_fwd(T *out, const T *gu, int64_t T_, int64_t F)
{
    GRID_STRIDE(k, T_ * F)
    {
        int64_t t = k / F, i = k % F;
        float g = to_f32(gu[t * 2 * F + i]), u = to_f32(gu[t * 2 * F + F + i]);
        out[k] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
}

template <class T> __global__ void k_swiglu_bwd(T *dgu, const float *dout, const T *gu, int64_t T_, int64_t F)
{
    GRID_STRIDE(k, T_ * F)
    {
        int64_t t = k / F, i = k % F;
        float g = to_f32(gu[t * 2 * F + i]), u = to_f32(gu[t * 2 * F + F + i]), dy = dout[k];
        float s = 1.0f / (1.0f + expf(-g));
        dgu[t * 2 * F + i] = from_f32<T>(dy * u * s * (1.0f + g * (1.0f - s)));
        dgu[t * 2 * F + F + i] = from_f32<T>(dy * g * s);
    }
}

template <class T> void cuda_swiglu_fwd(Act *out, const Act *gu, int64_t T_, int64_t F)
{
    if (T_ * F == 0)
        return;
    k_swiglu_fwd<T><<<cuda_blocks(T_ * F), CUDA_THREADS>>>(as<T>(out), (const T *)gu, T_, F);
    CUDA_LAUNCHED("swiglu_fwd");
}

template <class T> void cuda_swiglu_bwd(Act *dgu, const float *dout, const Act *gu, int64_t T_, int64_t F)
{
    if (T_ * F == 0)
        return;
    k_swiglu_bwd<T><<<cuda_blocks(T_ * F), CUDA_THREADS>>>(as<T>(dgu), dout, (const T *)gu, T_, F);
    CUDA_LAUNCHED("swiglu_bwd");
}

/* ---------------------------------------------------------------------------------------------- */
/* AdamW over all parameters in one launch: the spans (runs of equal weight decay) in shared memory,
 * each element finds its span by bisection; the compute copy of the weight is written beside. */

enum { ADAMW_MAX_SPANS = 2048 };

template <class T>
__global__ void k_adamw(float *p, const float *g, float *m, float *v, T *p_act, int64_t n, const AdamWSpan *spans,
                        int n_spans, AdamWStep s)
{
    __shared__ int64_t ends[ADAMW_MAX_SPANS];
    __shared__ float decay[ADAMW_MAX_SPANS];
    for (int i = threadIdx.x; i < n_spans; i += blockDim.x) {
        ends[i] = spans[i].end;
        decay[i] = spans[i].weight_decay;
    }
    __syncthreads();
    GRID_STRIDE(i, n)
    {
        int lo = 0, hi = n_spans - 1; /* the first span whose end is past i */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (ends[mid] > i)
                hi = mid;
            else
                lo = mid + 1;
        }
        float gi = g[i] * s.grad_scale;
        float mi = s.beta1 * m[i] + (1 - s.beta1) * gi, vi = s.beta2 * v[i] + (1 - s.beta2) * gi * gi;
        float pi = p[i];
        pi -= s.lr * decay[lo] * pi;
        pi -= s.lr * (mi / s.bias1) / (sqrtf(vi / s.bias2) + s.eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (p_act)
            p_act[i] = from_f32<T>(pi);
    }
}

static CudaScratch span_scratch;

template <class T>
void cuda_adamw(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n, const AdamWSpan *spans,
                int n_spans, AdamWStep s)
{
    if (n == 0 || n_spans == 0)
        return;
    if (n_spans > ADAMW_MAX_SPANS)
        cuda_fatal("adamw", "more weight-decay spans than the kernel holds");
    AdamWSpan *d = (AdamWSpan *)span_scratch.get((size_t)n_spans * sizeof *d);
    CUDA_CHECK(cudaMemcpy(d, spans, (size_t)n_spans * sizeof *d, cudaMemcpyHostToDevice));
    k_adamw<T><<<cuda_blocks(n), CUDA_THREADS>>>(p, g, m, v, as<T>(p_act), n, d, n_spans, s);
    CUDA_LAUNCHED("adamw");
}

void cuda_kernels_close(void)
{
    norm_scratch.release();
    span_scratch.release();
}

/* The two instances of every op. */
#define INSTANTIATE(T)                                                                             \
    template void cuda_copy_rows<T>(void *, Dt, int64_t, const int64_t *, const void *, Dt, int64_t,  \
                                    const int64_t *, int64_t, int64_t);                           \
    template void cuda_rmsnorm_fwd<T>(Act *, float *, const float *, const float *, int64_t, int64_t, float); \
    template void cuda_rmsnorm_bwd<T>(float *, Act *, float *, const float *, const float *, const float *, \
                                      const float *, int64_t, int64_t);                           \
    template void cuda_rope_fwd<T>(Act *, int64_t, const int32_t *, int64_t, int, int, const float *, float); \
    template void cuda_rope_bwd<T>(Act *, int64_t, const float *, int64_t, int64_t, const int32_t *, int64_t, int, \
                                   int, const float *, float);                                    \
    template void cuda_swiglu_fwd<T>(Act *, const Act *, int64_t, int64_t);                       \
    template void cuda_swiglu_bwd<T>(Act *, const float *, const Act *, int64_t, int64_t);        \
    template void cuda_adamw<T>(float *, const float *, float *, float *, Act *, int64_t, const AdamWSpan *, int, \
                                AdamWStep);
INSTANTIATE(float)
INSTANTIATE(bf16)
