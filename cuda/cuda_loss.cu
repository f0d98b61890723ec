/*
 * cuda/cuda_loss.cu - the cross-entropy of a block of logits rows (see engine/ops.h).
 *
 * ce_stats reads each row once: a block per row, every thread keeps a running (max m, sum s of
 * exp(z - m)) over its columns, rescaling s when m grows (online softmax); the threads' pairs merge
 * in a fixed order, s' = s_a exp(m_a - m) + s_b exp(m_b - m) with m = max(m_a, m_b). The target's
 * logit is read by one thread. With first the block writes its row's (max, sum, target); else it
 * merges them into the row's running statistics of the vocabulary tiles before (engine/ops.h), in
 * double, the same formula: a block of rows is computed a tile of columns at a time
 * (engine/model/model_head.c), so its logits never exceed one tile. ce_grad then writes dloss (exp(z - lse) - [target]) in the compute
 * dtype, p - 1 at the target through expm1 in double (p near 1 would cancel in float).
 */
#include <math.h>

#include "cuda/cuda_common.cuh"

enum { CE_THREADS = 512 };

__global__ void __launch_bounds__(CE_THREADS)
    k_ce_stats(double *stats, const float *logits, const int32_t *targets, int64_t V, int64_t vocab0, int first)
{
    const float *z = logits + blockIdx.x * V;
    float m = -INFINITY, s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        float x = z[i];
        if (x > m) {
            s = s * expf(m - x) + 1.0f; /* exp(-inf) = 0 on the first element */
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    /* The block's max, then every thread's sum rescaled to it and summed in a fixed order. */
    float mx = block_max(m);
    double part = m == -INFINITY ? 0.0 : (double)s * exp((double)m - (double)mx);
    double sum = block_sum(part);
    if (threadIdx.x == 0) {
        int64_t t = targets[blockIdx.x], c = t - vocab0;
        double zt = t >= 0 && c >= 0 && c < V ? (double)z[c] : 0.0;
        double *st = stats + 3 * blockIdx.x;
        if (first) {
            st[0] = mx;
            st[1] = sum;
            st[2] = zt;
        } else {
            double M = fmax(st[0], (double)mx);
            st[1] = st[1] * exp(st[0] - M) + sum * exp((double)mx - M);
            st[0] = M;
            st[2] += zt;
        }
    }
}

void cuda_ce_stats(double *stats, const float *logits, const int32_t *targets, int64_t T_, int64_t V, int64_t vocab0,
                   int first)
{
    if (T_ == 0)
        return;
    k_ce_stats<<<(unsigned)T_, CE_THREADS>>>(stats, logits, targets, V, vocab0, first);
    CUDA_LAUNCHED("ce_stats");
}

/* Grid (column tiles, rows): no division per element. */
template <class T>
__global__ void k_ce_grad(T *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T_,
                          int64_t V, int64_t vocab0, float dloss)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= V)
        return;
    for (int64_t t = blockIdx.y; t < T_; t += gridDim.y) {
        int64_t at = t * V + j;
        if (targets[t] < 0) {
            dlogits[at] = from_f32<T>(0.0f);
            continue;
        }
        float x = logits[at] - (float)lse[t];
        dlogits[at] = j == (int64_t)targets[t] - vocab0 ? from_f32<T>((float)((double)dloss * expm1((double)logits[at] - lse[t])))
                                                        : from_f32<T>(dloss * expf(x));
    }
}

template <class T>
void cuda_ce_grad(Act *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T_, int64_t V,
                  int64_t vocab0, float dloss)
{
    if (T_ * V == 0)
        return;
    dim3 grid((unsigned)((V + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)(T_ < 65535 ? T_ : 65535));
    k_ce_grad<T><<<grid, CUDA_THREADS>>>((T *)dlogits, logits, lse, targets, T_, V, vocab0, dloss);
    CUDA_LAUNCHED("ce_grad");
}

template void cuda_ce_grad<float>(Act *, const float *, const double *, const int32_t *, int64_t, int64_t, int64_t,
                                  float);
template void cuda_ce_grad<bf16>(Act *, const float *, const double *, const int32_t *, int64_t, int64_t, int64_t,
                                 float);
