/*
 * cuda/cuda_matmul.cu - the matrix products of the CUDA backend through cuBLASLt.
 *
 * Row-major [rows, cols] is column-major [cols, rows], so with W [n_out, n_in] and x [T, n_in]:
 *   out = x W^T        column-major out^T [n_out, T] = op_T(W^T [n_in, n_out]) x^T [n_in, T]
 *   dx  = dout W       column-major dx^T [n_in, T]   = W^T [n_in, n_out] dout^T [n_out, T]
 *   dW += dout^T x     column-major dW^T [n_in, n_out] = x^T [n_in, T] op_T(dout^T [n_out, T])
 * With bf16 the operands are rounded to bfloat16 (nearest even) into scratch buffers just before
 * each product, which accumulates and writes float32 (CUBLAS_COMPUTE_32F; dW and an accumulated
 * dx through beta = 1). With fp32 the operands go in as they are (CUBLAS_COMPUTE_32F, no TF32).
 */
#include <cublasLt.h>
#include <cuda_bf16.h>

#include "cuda/cuda_common.cuh"

static cublasLtHandle_t lt;
static int use_bf16;
static CudaScratch workspace, cast_a, cast_b;
enum { WORKSPACE_BYTES = 32 << 20 };

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            cuda_fatal(#call, cublasLtGetStatusString(s_));                                        \
    } while (0)

void cuda_matmul_init(int bf16)
{
    if (!lt)
        LT_CHECK(cublasLtCreate(&lt));
    use_bf16 = bf16;
    workspace.get(WORKSPACE_BYTES);
}

__global__ void k_to_bf16(__nv_bfloat16 *out, const float *in, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

/* The operand as the product reads it: bf16 in scratch, or the float32 array itself. */
static const void *operand(CudaScratch *s, const float *x, int64_t n)
{
    if (!use_bf16)
        return x;
    __nv_bfloat16 *b = (__nv_bfloat16 *)s->get((size_t)(n ? n : 1) * sizeof *b);
    if (n > 0) {
        k_to_bf16<<<cuda_blocks(n), CUDA_THREADS>>>(b, x, n);
        CUDA_LAUNCHED("to_bf16");
    }
    return b;
}

/* D [m, n] = alpha op(A) op(B) + beta D, column-major, D float32. A is [m, k] after op (stored
 * [k, m] when transposed), B [k, n] after op. */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
                 int64_t ldb, float beta, float *D, int64_t ldd)
{
    if (m == 0 || n == 0)
        return;
    if (k == 0) { /* nothing to add; an overwrite of zeros */
        if (beta == 0.0f)
            for (int64_t j = 0; j < n; j++)
                CUDA_CHECK(cudaMemset(D + j * ldd, 0, (size_t)m * sizeof *D));
        return;
    }
    cudaDataType_t ab = use_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, ld;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, ab, trans_a ? k : m, trans_a ? m : k, lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, trans_b ? n : k, trans_b ? k : n, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE_BYTES;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0)
        cuda_fatal("cublasLtMatmulAlgoGetHeuristic", "no algorithm for this product");
    float alpha = 1.0f;
    LT_CHECK(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo,
                            workspace.get(WORKSPACE_BYTES), WORKSPACE_BYTES, 0));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

void cuda_matmul_fwd(float *out, const float *x, const float *w, int64_t T, int64_t n_in, int64_t n_out)
{
    const void *W = operand(&cast_a, w, n_out * n_in), *X = operand(&cast_b, x, T * n_in);
    /* out^T [n_out, T] = (W^T)^T [n_out, n_in] x^T [n_in, T] */
    gemm(1, 0, n_out, T, n_in, W, n_in, X, n_in, 0.0f, out, n_out);
}

void cuda_matmul_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, int64_t T,
                     int64_t n_in, int64_t n_out, int accumulate_dx)
{
    const void *D = operand(&cast_a, dout, T * n_out);
    if (dx) {
        const void *W = operand(&cast_b, w, n_out * n_in);
        /* dx^T [n_in, T] = W^T [n_in, n_out] dout^T [n_out, T] */
        gemm(0, 0, n_in, T, n_out, W, n_in, D, n_out, accumulate_dx ? 1.0f : 0.0f, dx, n_in);
    }
    const void *X = operand(&cast_b, x, T * n_in);
    /* dW^T [n_in, n_out] += x^T [n_in, T] (dout^T)^T [T, n_out] */
    gemm(0, 1, n_in, n_out, T, X, n_in, D, n_out, 1.0f, dw, n_in);
}
