/*
 * cuda/cuda_ops.cu - the CUDA backend's ops table, memory, and its element-wise and reduction
 * kernels (see cuda_ops.h). The matrix products are in cuda_matmul.cu, attention in
 * cuda_attention.cu. Each kernel does what the CPU op of the same name does (cpu/cpu_ops.c), in the
 * same precision: float32 arithmetic, float64 for the sums the CPU sums in float64.
 */
#include "cuda/cuda_ops.h"

#include <math.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_info.h"

/* ---------------------------------------------------------------------------------------------- */
/* Reductions inside a block (blockDim.x a multiple of 32, at most 1024): every thread gets the sum. */

__device__ double block_sum(double v)
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

__device__ float block_max(float v)
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

#define GRID_STRIDE(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------------------------------------- */
/* Memory                                                                                          */

static void *cuda_alloc(size_t bytes)
{
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is the caller's to report */
        return nullptr;
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

static void cuda_free(void *p)
{
    if (p)
        CUDA_CHECK(cudaFree(p));
}

/* cudaMemcpyDefault: host or device on either side (unified addressing). */
static void cuda_copy_bytes(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

/* ---------------------------------------------------------------------------------------------- */
/* Embedding                                                                                       */

__global__ void k_embedding_fwd(float *out, const int32_t *tokens, int64_t T, const float *table, int64_t row0,
                                int64_t rows, int64_t d)
{
    GRID_STRIDE(i, T * d)
    {
        int64_t t = i / d, j = i % d, r = (int64_t)tokens[t] - row0;
        out[i] = r >= 0 && r < rows ? table[r * d + j] : 0.0f;
    }
}

__global__ void k_embedding_bwd(float *dtable, const int32_t *tokens, const float *dout, int64_t T, int64_t row0,
                                int64_t rows, int64_t d)
{
    GRID_STRIDE(i, T * d)
    {
        int64_t t = i / d, j = i % d, r = (int64_t)tokens[t] - row0;
        if (r >= 0 && r < rows)
            atomicAdd(&dtable[r * d + j], dout[i]);
    }
}

static void embedding_fwd(float *out, const int32_t *tokens, int64_t T, const float *table, int64_t row0,
                          int64_t rows, int64_t d)
{
    if (T * d == 0)
        return;
    k_embedding_fwd<<<cuda_blocks(T * d), CUDA_THREADS>>>(out, tokens, T, table, row0, rows, d);
    CUDA_LAUNCHED("embedding_fwd");
}

static void embedding_bwd(float *dtable, const int32_t *tokens, const float *dout, int64_t T, int64_t row0,
                          int64_t rows, int64_t d)
{
    if (T * d == 0)
        return;
    k_embedding_bwd<<<cuda_blocks(T * d), CUDA_THREADS>>>(dtable, tokens, dout, T, row0, rows, d);
    CUDA_LAUNCHED("embedding_bwd");
}

/* ---------------------------------------------------------------------------------------------- */
/* RMSNorm: one block per row                                                                      */

__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t d, float eps)
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
        out[blockIdx.x * d + i] = xt[i] * r * w[i];
}

/* dx += dy w r - x r^3 mean(dy w x) */
__global__ void k_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *rstd,
                                 int64_t d)
{
    const float *xt = x + blockIdx.x * d, *dy = dout + blockIdx.x * d;
    double dot = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        dot += (double)dy[i] * w[i] * xt[i];
    dot = block_sum(dot);
    float r = rstd[blockIdx.x], c = (float)(dot / (double)d) * r * r * r;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        dx[blockIdx.x * d + i] += dy[i] * w[i] * r - xt[i] * c;
}

/* dw partial sums: block (column block, row chunk), one column per thread. */
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

static void rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps)
{
    if (T == 0)
        return;
    k_rmsnorm_fwd<<<(unsigned)T, CUDA_THREADS>>>(out, rstd, x, w, d, eps);
    CUDA_LAUNCHED("rmsnorm_fwd");
}

static CudaScratch norm_scratch;

static void rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                        int64_t T, int64_t d)
{
    if (T == 0)
        return;
    k_rmsnorm_bwd_dx<<<(unsigned)T, CUDA_THREADS>>>(dx, dout, x, w, rstd, d);
    CUDA_LAUNCHED("rmsnorm_bwd dx");
    int64_t chunks = (T + NORM_ROWS - 1) / NORM_ROWS;
    float *partial = (float *)norm_scratch.get((size_t)(chunks * d) * sizeof(float));
    dim3 grid((unsigned)((d + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)chunks);
    k_rmsnorm_bwd_dw<<<grid, CUDA_THREADS>>>(partial, dout, x, rstd, T, d);
    CUDA_LAUNCHED("rmsnorm_bwd dw");
    k_sum_chunks<<<cuda_blocks(d), CUDA_THREADS>>>(dw, partial, chunks, d);
    CUDA_LAUNCHED("rmsnorm_bwd sum");
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE: pairs (i, i + D/2) of every head rotated by positions[t] inv_freq[i] (the angle in double) */

__global__ void k_rope(float *x, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                       const float *inv_freq, int inverse)
{
    int half = head_dim / 2;
    GRID_STRIDE(k, T * half)
    {
        int64_t t = k / half;
        int i = (int)(k % half);
        double s, c;
        sincos((double)positions[t] * inv_freq[i], &s, &c);
        float cf = (float)c, sf = (float)(inverse ? -s : s);
        for (int h = 0; h < n_heads; h++) {
            float *p = x + t * (int64_t)n_heads * head_dim + (int64_t)h * head_dim;
            float a = p[i], b = p[i + half];
            p[i] = a * cf - b * sf;
            p[i + half] = b * cf + a * sf;
        }
    }
}

static void rope(float *x, const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                 int inverse)
{
    if (T == 0)
        return;
    k_rope<<<cuda_blocks(T * (head_dim / 2)), CUDA_THREADS>>>(x, positions, T, n_heads, head_dim, inv_freq, inverse);
    CUDA_LAUNCHED("rope");
}

/* ---------------------------------------------------------------------------------------------- */
/* SwiGLU                                                                                          */

__global__ void k_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n)
{
    GRID_STRIDE(i, n)
    out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        float s = 1.0f / (1.0f + expf(-gate[i]));
        dgate[i] = dout[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        dup[i] = dout[i] * gate[i] * s;
    }
}

static void swiglu_fwd(float *out, const float *gate, const float *up, int64_t n)
{
    if (n == 0)
        return;
    k_swiglu_fwd<<<cuda_blocks(n), CUDA_THREADS>>>(out, gate, up, n);
    CUDA_LAUNCHED("swiglu_fwd");
}

static void swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n)
{
    if (n == 0)
        return;
    k_swiglu_bwd<<<cuda_blocks(n), CUDA_THREADS>>>(dgate, dup, dout, gate, up, n);
    CUDA_LAUNCHED("swiglu_bwd");
}

/* ---------------------------------------------------------------------------------------------- */
/* Cross-entropy over a vocabulary slice: one block per row for the reductions                     */

__global__ void k_ce_row_max(double *mx, const float *logits, int64_t V)
{
    const float *z = logits + blockIdx.x * V;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        m = fmaxf(m, z[i]);
    m = block_max(m);
    if (threadIdx.x == 0)
        mx[blockIdx.x] = m;
}

__global__ void k_ce_row_sumexp(double *sum, const float *logits, const double *mx, int64_t V)
{
    const float *z = logits + blockIdx.x * V;
    float m = (float)mx[blockIdx.x];
    double s = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        s += expf(z[i] - m);
    s = block_sum(s);
    if (threadIdx.x == 0)
        sum[blockIdx.x] = s;
}

__global__ void k_ce_target_logit(double *z, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                                  int64_t vocab0)
{
    GRID_STRIDE(t, T)
    {
        int64_t c = (int64_t)targets[t] - vocab0;
        z[t] = targets[t] >= 0 && c >= 0 && c < V ? (double)logits[t * V + c] : 0.0;
    }
}

/* dloss (softmax - onehot); p - 1 at the target as expm1 in double (p near 1 would cancel in float). */
__global__ void k_ce_grad(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                          int64_t V, int64_t vocab0, float dloss)
{
    GRID_STRIDE(i, T * V)
    {
        int64_t t = i / V, j = i % V;
        if (targets[t] < 0) {
            dlogits[i] = 0.0f;
            continue;
        }
        double x = (double)logits[i] - lse[t];
        dlogits[i] = j == (int64_t)targets[t] - vocab0 ? (float)((double)dloss * expm1(x)) : dloss * expf((float)x);
    }
}

static void ce_row_max(double *mx, const float *logits, int64_t T, int64_t V)
{
    if (T == 0)
        return;
    k_ce_row_max<<<(unsigned)T, CUDA_THREADS>>>(mx, logits, V);
    CUDA_LAUNCHED("ce_row_max");
}

static void ce_row_sumexp(double *sum, const float *logits, const double *mx, int64_t T, int64_t V)
{
    if (T == 0)
        return;
    k_ce_row_sumexp<<<(unsigned)T, CUDA_THREADS>>>(sum, logits, mx, V);
    CUDA_LAUNCHED("ce_row_sumexp");
}

static void ce_target_logit(double *z, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                            int64_t vocab0)
{
    if (T == 0)
        return;
    k_ce_target_logit<<<cuda_blocks(T), CUDA_THREADS>>>(z, logits, targets, T, V, vocab0);
    CUDA_LAUNCHED("ce_target_logit");
}

static void ce_grad(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                    int64_t V, int64_t vocab0, float dloss)
{
    if (T * V == 0)
        return;
    k_ce_grad<<<cuda_blocks(T * V), CUDA_THREADS>>>(dlogits, logits, lse, targets, T, V, vocab0, dloss);
    CUDA_LAUNCHED("ce_grad");
}

/* ---------------------------------------------------------------------------------------------- */
/* Rows, element-wise, sums                                                                        */

__global__ void k_gather_rows(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width)
{
    GRID_STRIDE(i, n * width)
    dst[i] = src[rows[i / width] * width + i % width];
}

__global__ void k_scatter_rows(float *dst, const int64_t *rows, const float *src, int64_t n, int64_t width)
{
    GRID_STRIDE(i, n * width)
    dst[rows[i / width] * width + i % width] = src[i];
}

__global__ void k_add(float *out, const float *a, int64_t n)
{
    GRID_STRIDE(i, n)
    out[i] += a[i];
}

__global__ void k_scale(float *x, float s, int64_t n)
{
    GRID_STRIDE(i, n)
    x[i] *= s;
}

static void gather_rows(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width)
{
    if (n * width == 0)
        return;
    k_gather_rows<<<cuda_blocks(n * width), CUDA_THREADS>>>(dst, src, rows, n, width);
    CUDA_LAUNCHED("gather_rows");
}

static void scatter_rows(float *dst, const int64_t *rows, const float *src, int64_t n, int64_t width)
{
    if (n * width == 0)
        return;
    k_scatter_rows<<<cuda_blocks(n * width), CUDA_THREADS>>>(dst, rows, src, n, width);
    CUDA_LAUNCHED("scatter_rows");
}

static void add(float *out, const float *a, int64_t n)
{
    if (n == 0)
        return;
    k_add<<<cuda_blocks(n), CUDA_THREADS>>>(out, a, n);
    CUDA_LAUNCHED("add");
}

static void copy(float *dst, const float *src, int64_t n)
{
    if (n > 0 && dst != src)
        CUDA_CHECK(cudaMemcpy(dst, src, (size_t)n * sizeof *dst, cudaMemcpyDeviceToDevice));
}

static void scale(float *x, float s, int64_t n)
{
    if (n == 0)
        return;
    k_scale<<<cuda_blocks(n), CUDA_THREADS>>>(x, s, n);
    CUDA_LAUNCHED("scale");
}

static void zero(float *x, int64_t n)
{
    if (n > 0)
        CUDA_CHECK(cudaMemset(x, 0, (size_t)n * sizeof *x));
}

/* Sum of squares: each block a contiguous range, summed in double; the blocks' sums added on the
 * host in order (the same result every run). */
enum { SUMSQ_BLOCKS = 1024 };

__global__ void k_sum_squares(double *part, const float *x, int64_t n)
{
    int64_t per = (n + gridDim.x - 1) / gridDim.x, a = blockIdx.x * per, b = a + per < n ? a + per : n;
    double s = 0;
    for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

static CudaScratch sumsq_scratch;

static double sum_squares(const float *x, int64_t n)
{
    if (n == 0)
        return 0;
    double *part = (double *)sumsq_scratch.get(SUMSQ_BLOCKS * sizeof(double)), host[SUMSQ_BLOCKS];
    k_sum_squares<<<SUMSQ_BLOCKS, CUDA_THREADS>>>(part, x, n);
    CUDA_LAUNCHED("sum_squares");
    CUDA_CHECK(cudaMemcpy(host, part, sizeof host, cudaMemcpyDeviceToHost));
    double total = 0;
    for (int i = 0; i < SUMSQ_BLOCKS; i++)
        total += host[i];
    return total;
}

/* PyTorch's AdamW, as the CPU op. */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, AdamWStep s)
{
    GRID_STRIDE(i, n)
    {
        m[i] = s.beta1 * m[i] + (1 - s.beta1) * g[i];
        v[i] = s.beta2 * v[i] + (1 - s.beta2) * g[i] * g[i];
        p[i] -= s.lr * s.weight_decay * p[i];
        p[i] -= s.lr * (m[i] / s.bias1) / (sqrtf(v[i] / s.bias2) + s.eps);
    }
}

static void adamw(float *p, const float *g, float *m, float *v, int64_t n, AdamWStep s)
{
    if (n == 0)
        return;
    k_adamw<<<cuda_blocks(n), CUDA_THREADS>>>(p, g, m, v, n, s);
    CUDA_LAUNCHED("adamw");
}

/* ---------------------------------------------------------------------------------------------- */

int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static Ops ops_table;

const Ops *cuda_ops_open(int local_rank, int bf16, Error *err)
{
    static int opened = -1;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        error_set(err, "train.device", "cuda: no GPU visible (%s); set train.device: cpu",
                  e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return nullptr;
    }
    if (opened == -1) {
        CUDA_CHECK(cudaSetDevice(local_rank % n));
        cuda_matmul_init(bf16);
        Ops *o = &ops_table;
        memset(o, 0, sizeof *o);
        o->name = bf16 ? "cuda (bf16 matrix products)" : "cuda (fp32)";
        o->host_memory = 0;
        o->alloc = cuda_alloc;
        o->free = cuda_free;
        o->to_device = cuda_copy_bytes;
        o->to_host = cuda_copy_bytes;
        o->embedding_fwd = embedding_fwd;
        o->embedding_bwd = embedding_bwd;
        o->rmsnorm_fwd = rmsnorm_fwd;
        o->rmsnorm_bwd = rmsnorm_bwd;
        o->matmul_fwd = cuda_matmul_fwd;
        o->matmul_bwd = cuda_matmul_bwd;
        o->rope = rope;
        o->attention_fwd = cuda_attention_fwd;
        o->attention_bwd = cuda_attention_bwd;
        o->swiglu_fwd = swiglu_fwd;
        o->swiglu_bwd = swiglu_bwd;
        o->ce_row_max = ce_row_max;
        o->ce_row_sumexp = ce_row_sumexp;
        o->ce_target_logit = ce_target_logit;
        o->ce_grad = ce_grad;
        o->gather_rows = gather_rows;
        o->scatter_rows = scatter_rows;
        o->add = add;
        o->copy = copy;
        o->scale = scale;
        o->zero = zero;
        o->sum_squares = sum_squares;
        o->adamw = adamw;
        opened = bf16;
    } else if (opened != bf16) { /* the tests compare both precisions in one process */
        cuda_matmul_init(bf16);
        ops_table.name = bf16 ? "cuda (bf16 matrix products)" : "cuda (fp32)";
        opened = bf16;
    }
    return &ops_table;
}

/* --version: what the build has and what it finds (cuda_info.cu). */
static void cuda_backend_describe(char *buf, size_t size)
{
    char line[448];
    cuda_describe(line, sizeof line);
    snprintf(buf, size, "compiled in (%s)", line);
}

static const Ops *cuda_backend_open(const BackendOpen *opt, Error *err)
{
    return cuda_ops_open(opt->local_rank, opt->bf16, err);
}

extern "C" const Backend cuda_backend = {"cuda", cuda_backend_describe, cuda_backend_open, cuda_device_count, nullptr};
