/*
 * cuda/cuda_ops.cu - the CUDA backend's two ops tables (compute dtype float32 or bfloat16, see
 * cuda_ops.h), its memory, and the vector ops. The
 * other kernels are in cuda_kernels.cu (element-wise and rows), cuda_loss.cu (cross-entropy),
 * cuda_embedding.cu, cuda_matmul.cu (cuBLASLt) and cuda_attention.cu (with cuda_flash_*.cu).
 */
#include "cuda/cuda_ops.h"

#include <math.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash.h"
#include "cuda/cuda_info.h"

/* ---------------------------------------------------------------------------------------------- */
/* Memory                                                                                          */

/* The most the device had in use (total - free) at any allocation or peak query: what the memory
 * model predicts, the CUDA runtime's own memory and the libraries' buffers included. */
static size_t device_peak;

static size_t cuda_peak_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (total_b - free_b > device_peak)
        device_peak = total_b - free_b;
    return device_peak;
}

/* cudaMalloc and cudaFree calls so far (Ops.alloc_calls): each waits for the whole device. */
static int64_t cuda_alloc_count;

static int64_t cuda_alloc_calls(void) { return cuda_alloc_count; }

static void *cuda_alloc(size_t bytes)
{
    cuda_alloc_count++;
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is the caller's to report */
        return nullptr;
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    cuda_peak_bytes();
    return p;
}

static void cuda_free(void *p)
{
    if (!p)
        return;
    cuda_alloc_count++;
    CUDA_CHECK(cudaFree(p));
}

/* cudaMemcpyDefault: host or device on either side (unified addressing). */
static void cuda_copy_bytes(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

static void cuda_memory(size_t *free_bytes, size_t *total_bytes)
{
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static void cuda_sync(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

/* ---------------------------------------------------------------------------------------------- */
/* Vector ops (float32)                                                                            */

__global__ void k_add(float *out, const float *a, const float *b, int64_t n)
{
    GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

static void add(float *out, const float *a, const float *b, int64_t n)
{
    if (n == 0)
        return;
    k_add<<<cuda_blocks(n), CUDA_THREADS>>>(out, a, b, n);
    CUDA_LAUNCHED("add");
}

static void copy(float *dst, const float *src, int64_t n)
{
    if (n > 0 && dst != src)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof *dst, cudaMemcpyDeviceToDevice, 0));
}

static void zero(float *x, int64_t n)
{
    if (n > 0)
        CUDA_CHECK(cudaMemsetAsync(x, 0, (size_t)n * sizeof *x, 0));
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

/* ---------------------------------------------------------------------------------------------- */
/* The tables                                                                                      */

/* The PCI place of the GPU this process opened (Backend.device_id), -1 when the runtime cannot say. */
static int64_t cuda_device_id(void)
{
    int dev = 0, domain = 0, bus = 0, device = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&device, cudaDevAttrPciDeviceId, dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int64_t)domain << 16 | (int64_t)bus << 8 | (int64_t)device;
}

template <class T> static Ops table(const char *name)
{
    Ops o;
    memset(&o, 0, sizeof o);
    o.name = name;
    o.host_memory = 0;
    o.act_bytes = sizeof(T);
    o.act_is_f32 = sizeof(T) == sizeof(float);
    o.logits_floats = OPS_LOGITS_FLOATS_GPU;
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.to_device = cuda_copy_bytes;
    o.to_host = cuda_copy_bytes;
    o.memory = cuda_memory;
    o.peak_bytes = cuda_peak_bytes;
    o.alloc_calls = cuda_alloc_calls;
    o.attention_reserve = sizeof(T) == 2 ? cuda_attention_reserve : nullptr; /* cuDNN's path is bf16 */
    o.sync = cuda_sync;
    o.timer_mark = cuda_timer_mark;
    o.timer_seconds = cuda_timer_seconds;
    o.copy_rows = cuda_copy_rows<T>;
    o.embedding_fwd = cuda_embedding_fwd;
    o.embedding_bwd = cuda_embedding_bwd;
    o.rmsnorm_fwd = cuda_rmsnorm_fwd<T>;
    o.rmsnorm_bwd = cuda_rmsnorm_bwd<T>;
    o.matmul_fwd = cuda_matmul_fwd<T>;
    o.matmul_bwd_dx = cuda_matmul_bwd_dx<T>;
    o.matmul_bwd_dw = cuda_matmul_bwd_dw<T>;
    o.rope_fwd = cuda_rope_fwd<T>;
    o.rope_bwd = cuda_rope_bwd<T>;
    o.attention_fwd = cuda_attention_fwd<T>;
    o.attention_bwd = cuda_attention_bwd<T>;
    o.attention_merge = cuda_attention_merge<T>;
    o.attention_merge_store = cuda_attention_merge_store<T>;
    o.swiglu_fwd = cuda_swiglu_fwd<T>;
    o.swiglu_bwd = cuda_swiglu_bwd<T>;
    o.ce_stats = cuda_ce_stats;
    o.ce_grad = cuda_ce_grad<T>;
    o.add = add;
    o.copy = copy;
    o.zero = zero;
    o.sum_squares = sum_squares;
    o.adamw = cuda_adamw<T>;
    return o;
}

static Ops ops_f32, ops_bf16;
static int opened;

const Ops *cuda_ops_open(int local_rank, int use_bf16, int deterministic, int attention, Error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        error_set(err, "train.device", "cuda: no GPU visible (%s); set train.device: cpu",
                  e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return nullptr;
    }
    if (!opened) {
        CUDA_CHECK(cudaSetDevice(local_rank % n));
        /* The stream-ordered pool of the backend's own buffers (cuda_stream_alloc) keeps what it took. */
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, local_rank % n));
        CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
        ops_f32 = table<float>("cuda (fp32)");
        ops_bf16 = table<bf16>("cuda (bf16)");
        opened = 1;
    }
    /* Opening again (the tests compare both precisions in one process) only changes the flags. */
    cuda_matmul_open(deterministic);
    if (cuda_attention_select(attention, deterministic, local_rank, err) != 0)
        return nullptr;
    return use_bf16 ? &ops_bf16 : &ops_f32;
}

void cuda_ops_close(void)
{
    if (!opened)
        return;
    cuda_matmul_close();
    cuda_attention_close();
    cuda_kernels_close();
    cuda_embedding_close();
    cuda_flash_release();
    sumsq_scratch.release();
    cuda_timer_release();
}

/* --version: what the build has and what it finds (cuda_info.cu). */
static void cuda_backend_describe(char *buf, size_t size)
{
    char line[768];
    cuda_describe(line, sizeof line);
    snprintf(buf, size, "compiled in (%s)", line);
}

static const Ops *cuda_backend_open(const BackendOpen *opt, Error *err)
{
    return cuda_ops_open(opt->local_rank, opt->bf16, opt->deterministic, opt->attention, err);
}

extern "C" const Backend cuda_backend = {"cuda", cuda_backend_describe, cuda_backend_open, cuda_device_id, nullptr,
                                         cuda_ops_close};
