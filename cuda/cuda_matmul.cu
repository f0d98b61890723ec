/*
 * cuda/cuda_matmul.cu - the matrix products of the CUDA backend through cuBLASLt.
 *
 * Row-major [rows, cols] is column-major [cols, rows], so with W [n_out, n_in] and x [T, n_in]:
 *   out = x W^T        column-major out^T [n_out, T] = op_T(W^T [n_in, n_out]) x^T [n_in, T]
 *   dx  = dout W       column-major dx^T [n_in, T]   = W^T [n_in, n_out] dout^T [n_out, T]
 *   dW += dout^T x     column-major dW^T [n_in, n_out] = x^T [n_in, T] op_T(dout^T [n_out, T])
 * The operands are in the compute dtype T as they come (bf16 weights from the optimizer's copy,
 * bf16 activations: nothing is converted here); the product accumulates in float32
 * (CUBLAS_COMPUTE_32F; no TF32 for float operands) and writes the compute dtype or float32, or
 * float32 plus an addend C (beta = 1: the residual add, dW's accumulation).
 *
 * A product's descriptors and algorithm depend only on its shape and types, so they are made once
 * per shape and kept (a step runs the same few dozen shapes again and again; asking the heuristic
 * each call cost tens of microseconds). Shapes include the micro-batch's token count, which the
 * packers vary from one micro-batch to the next (about 15 shapes per distinct count): when the
 * cache is three quarters full it is emptied and refilled as shapes come, so a long run never
 * outgrows it. With train.deterministic the heuristic may not pick an
 * algorithm that reduces split-K partial sums with atomics (CUBLASLT_REDUCTION_SCHEME_INPLACE).
 */
#include <cublasLt.h>
#include <string.h>

#include "cuda/cuda_common.cuh"

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            cuda_fatal(#call, cublasLtGetStatusString(s_));                                        \
    } while (0)

enum { WORKSPACE_BYTES = 32 << 20, PLANS = 512 };

/* What identifies a product: its shape, its types, and the alignment of its operands (an
 * algorithm may need 16-byte aligned pointers; a weight or a column range inside a larger array
 * may be less aligned, and the heuristic is told). */
typedef struct PlanKey {
    int trans_a, trans_b, with_c;
    int64_t m, n, k, lda, ldb, ldd;
    cudaDataType_t ab, d;
    uint32_t align_a, align_b, align_c, align_d;
} PlanKey;

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al)
        al /= 2;
    return al;
}

typedef struct Plan {
    int used;
    PlanKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} Plan;

static cublasLtHandle_t lt;
static CudaScratch workspace;
static Plan plans[PLANS];
static int n_plans;
static int deterministic_now = -1;

/* Descriptors are host objects that cublasLtMatmul reads when it is called: dropping them does not
 * wait for the products in flight. */
static void drop_plans(void)
{
    n_plans = 0;
    for (int i = 0; i < PLANS; i++) {
        if (!plans[i].used)
            continue;
        cublasLtMatrixLayoutDestroy(plans[i].la);
        cublasLtMatrixLayoutDestroy(plans[i].lb);
        cublasLtMatrixLayoutDestroy(plans[i].ld);
        cublasLtMatmulDescDestroy(plans[i].op);
        plans[i].used = 0;
    }
}

void cuda_matmul_open(int deterministic)
{
    if (!lt)
        LT_CHECK(cublasLtCreate(&lt));
    workspace.get(WORKSPACE_BYTES);
    if (deterministic != deterministic_now) /* the algorithms chosen depend on it */
        drop_plans();
    deterministic_now = deterministic;
}

void cuda_matmul_close(void)
{
    drop_plans();
    workspace.release();
    if (lt)
        cublasLtDestroy(lt);
    lt = nullptr;
    deterministic_now = -1;
}

static uint64_t key_hash(const PlanKey *k)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The plan of a product: found, or made (descriptors and the heuristic's first algorithm). */
static const Plan *plan_of(const PlanKey *key)
{
    uint64_t h = key_hash(key);
    for (int probe = 0; probe < PLANS; probe++) {
        Plan *p = &plans[(h + (uint64_t)probe) % PLANS];
        if (p->used && !memcmp(&p->key, key, sizeof *key))
            return p;
        if (p->used)
            continue;
        if (n_plans >= PLANS * 3 / 4) { /* a new shape and a full cache: start again (short probes) */
            drop_plans();
            p = &plans[h % PLANS];
        }
        p->key = *key;
        LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, key->ab, key->trans_a ? key->k : key->m,
                                            key->trans_a ? key->m : key->k, key->lda));
        LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, key->ab, key->trans_b ? key->n : key->k,
                                            key->trans_b ? key->k : key->n, key->ldb));
        LT_CHECK(cublasLtMatrixLayoutCreate(&p->ld, key->d, key->m, key->n, key->ldd));
        cublasLtMatmulPreference_t pref;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = WORKSPACE_BYTES;
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const uint32_t align[4] = {key->align_a, key->align_b, key->align_c, key->align_d};
        for (int i = 0; i < 4; i++)
            LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
        if (deterministic_now == 1) {
            uint32_t mask = CUBLASLT_REDUCTION_SCHEME_MASK & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_INPLACE;
            LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                                          sizeof mask));
        }
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &heur, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        if (found == 0)
            cuda_fatal("cublasLtMatmulAlgoGetHeuristic", "no algorithm for this product");
        p->algo = heur.algo;
        p->used = 1;
        n_plans++;
        return p;
    }
    cuda_fatal("matmul", "more product shapes than the plan cache holds");
}

/* D [m, n] = op(A) op(B) + (C: beta 1), column-major; C, when given, has D's layout and dtype. */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, cudaDataType_t ab, const void *A,
                 int64_t lda, const void *B, int64_t ldb, cudaDataType_t dt, const void *C, void *D, int64_t ldd)
{
    if (m == 0 || n == 0)
        return;
    size_t el = dt == CUDA_R_32F ? 4 : 2;
    if (k == 0) { /* an empty sum: D = C, or zeros */
        for (int64_t j = 0; j < n; j++) {
            char *d = (char *)D + (size_t)(j * ldd) * el;
            if (C && C != D)
                CUDA_CHECK(cudaMemcpyAsync(d, (const char *)C + (size_t)(j * ldd) * el, (size_t)m * el,
                                           cudaMemcpyDeviceToDevice, 0));
            else if (!C)
                CUDA_CHECK(cudaMemsetAsync(d, 0, (size_t)m * el, 0));
        }
        return;
    }
    PlanKey key;
    memset(&key, 0, sizeof key); /* the hash reads the padding too */
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.with_c = C != nullptr;
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.ab = ab;
    key.d = dt;
    key.align_a = alignment(A);
    key.align_b = alignment(B);
    key.align_c = alignment(C ? C : D);
    key.align_d = alignment(D);
    const Plan *p = plan_of(&key);
    float alpha = 1.0f, beta = C ? 1.0f : 0.0f;
    LT_CHECK(cublasLtMatmul(lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C ? C : D, p->ld, D, p->ld, &p->algo,
                            workspace.get(WORKSPACE_BYTES), WORKSPACE_BYTES, 0));
}

template <class T> static cudaDataType_t dtype_of() { return sizeof(T) == 2 ? CUDA_R_16BF : CUDA_R_32F; }

/* Where a product writes (engine/ops.h MatOut): its dtype and addend. */
template <class T> static cudaDataType_t out_type(MatOut o) { return o.kind == MAT_ACT ? dtype_of<T>() : CUDA_R_32F; }
static const void *out_addend(MatOut o) { return o.kind == MAT_F32_PLUS ? (const void *)o.c : nullptr; }

template <class T>
void cuda_matmul_fwd(MatOut out, const Act *x, const Act *w, int64_t T_, int64_t n_in, int64_t n_out)
{
    /* out^T [n_out, T] = (W^T)^T [n_out, n_in] x^T [n_in, T] */
    gemm(1, 0, n_out, T_, n_in, dtype_of<T>(), w, n_in, x, n_in, out_type<T>(out), out_addend(out), out.p, n_out);
}

template <class T>
void cuda_matmul_bwd_dx(MatOut dx, const Act *dout, const Act *w, int64_t T_, int64_t n_in, int64_t n_out)
{
    /* dx^T [n_in, T] = W^T [n_in, n_out] dout^T [n_out, T] */
    gemm(0, 0, n_in, T_, n_out, dtype_of<T>(), w, n_in, dout, n_out, out_type<T>(dx), out_addend(dx), dx.p, n_in);
}

template <class T>
void cuda_matmul_bwd_dw(float *dw, const Act *dout, const Act *x, int64_t T_, int64_t n_in, int64_t n_out)
{
    /* dW^T [n_in, n_out] += x^T [n_in, T] (dout^T)^T [T, n_out] */
    gemm(0, 1, n_in, n_out, T_, dtype_of<T>(), x, n_in, dout, n_out, CUDA_R_32F, dw, dw, n_in);
}

#define INSTANTIATE(T)                                                                             \
    template void cuda_matmul_fwd<T>(MatOut, const Act *, const Act *, int64_t, int64_t, int64_t);   \
    template void cuda_matmul_bwd_dx<T>(MatOut, const Act *, const Act *, int64_t, int64_t, int64_t); \
    template void cuda_matmul_bwd_dw<T>(float *, const Act *, const Act *, int64_t, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
