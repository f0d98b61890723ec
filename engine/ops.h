/*
 * engine/ops.h - the operations a backend implements; the model (engine/model/) is written once
 * against them. Pointers are to backend memory (host for cpu, device for cuda).
 *
 * Mixed precision. A backend has a compute dtype, the dtype of what its matrix products and its
 * attention read: float32 (the CPU reference, and train.precision: fp32) or bfloat16
 * (train.precision: bf16, on the GPU; the CPU backend emulates it for tests). Arrays of the compute
 * dtype have the type Act: only ops read or write their elements, the model just passes them
 * around (ops_act for an offset). Everything else is float32 (float *): the master weights, the
 * gradients of the weights, the residual stream and its gradient, the norms' statistics, the
 * attention's log-sum-exp, the logits, and the gradients that are accumulated or reduced. So a
 * product reads Act operands and writes Act or float32 (MatOut); nothing converts a weight inside
 * a forward or backward (the optimizer writes the compute copy of the weights as it updates them).
 *
 * Shapes are row-major, one row per token. A weight W of a linear layer is [out, in] (Hugging Face
 * and PyTorch layout) and the layer computes y = x W^T; consecutive weights in memory form one
 * product (Wq, Wk, Wv as [q + k + v, in]; Wgate, Wup as [2 ffn, in]). Gradients of weights are
 * always accumulated (+=): micro-batches add up. Gradients of activations are overwritten unless
 * the op says "accumulate".
 *
 * Attention runs over segments (AttnSegment): the query rows [q_row, q_row + q_len) against the
 * key/value rows [kv_row, kv_row + kv_len), aligned at the end (document-causal): query i sees keys
 * kv_row .. kv_row + kv_len - q_len + i; or, with `full`, every query sees all kv_len keys (a block
 * of keys that lies wholly before the queries in their document: context parallelism computes a
 * sharded document's attention block by block, attention_merge). Query head h uses key/value head
 * h / (n_heads / n_kv_heads). The scale is 1 / sqrt(head_dim). lse keeps, per query row and head,
 * the log of the softmax denominator (with the max folded in) for the backward.
 */
#ifndef WLB_ENGINE_OPS_H
#define WLB_ENGINE_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An array of the backend's compute dtype (an incomplete type: never dereferenced outside a
 * backend). */
typedef struct Act Act;

/* The dtype of an argument that may be either: float32, or the backend's compute dtype. */
typedef enum Dt { DT_F32, DT_ACT } Dt;

typedef struct AttnSegment {
    int64_t q_row, q_len, kv_row, kv_len;
    int64_t full; /* 0: causal, aligned at the end (kv_len >= q_len); 1: every query sees every key */
} AttnSegment;

typedef struct AttnShape {
    int n_heads, n_kv_heads, head_dim;
    /* Elements between consecutive rows: of q (and dq), of k and v (and dk, dv), of out (and dout).
     * q, k and v may be column ranges of one fused [T, q + k + v] array. */
    int64_t q_stride, kv_stride, o_stride;
} AttnShape;

/* The most workspace cuDNN's deterministic backward may take for its score gradients (bf16 dP of
 * every sequence padded to the batch's longest); past it cuda/cuda_cudnn.h's CUDNN_ORDERED_DQ_VERSION
 * rule takes another path. */
#define OPS_CUDNN_DP_WORKSPACE_MAX (INT64_C(1) << 31)

/* The buffers cuDNN's attention (cuda/cuda_cudnn.cu) holds for calls of at most `rows` query or key
 * rows at h query and h_kv key/value heads of size D (the rank's), with R = rows rounded up to a power
 * of two (at least 64), as its plans are: its backward's bf16 gradients, 2 R (h + 2 h_kv) D bytes, and
 * cuDNN's workspace as cudnn-frontend 1.32 sizes it for a ragged backward - the float32 dQ
 * accumulator (4 R h D), Delta (4 R h) and, with grouped heads, float32 dK and dV of every query head
 * before their sum over the group (8 R h D); a deterministic backward may take up to
 * OPS_CUDNN_DP_WORKSPACE_MAX more. The memory model counts them; the CUDA backend reserves them at
 * setup (Ops.attention_reserve). An estimate: cuDNN states its workspace only on a GPU. */
static inline void ops_cudnn_buffers(int64_t rows, int h, int h_kv, int D, int deterministic, int64_t *grads,
                                     int64_t *workspace)
{
    int64_t R = 64;
    while (R < rows)
        R *= 2;
    *grads = 2 * R * (h + 2 * (int64_t)h_kv) * D;
    *workspace = 4 * R * h * D + 4 * R * h + (h != h_kv ? 8 * R * h * D : 0) +
                 (deterministic ? OPS_CUDNN_DP_WORKSPACE_MAX : 0);
}

/* Where a product writes: the compute dtype, float32, or float32 as c + the product (c may be the
 * output itself: an accumulation). */
typedef enum MatOutKind { MAT_ACT, MAT_F32, MAT_F32_PLUS } MatOutKind;
typedef struct MatOut {
    void *p;
    const float *c;
    MatOutKind kind;
} MatOut;

static inline MatOut mat_act(Act *p) { MatOut o = {p, NULL, MAT_ACT}; return o; }
static inline MatOut mat_f32(float *p) { MatOut o = {p, NULL, MAT_F32}; return o; }
static inline MatOut mat_f32_plus(float *p, const float *c) { MatOut o = {p, c, MAT_F32_PLUS}; return o; }

/* One AdamW step (PyTorch's: decoupled weight decay, bias correction). The gradient is multiplied
 * by grad_scale first (global-norm clipping: clip / norm, or 1). */
typedef struct AdamWStep {
    float lr, beta1, beta2, eps;
    float bias1, bias2; /* 1 - beta1^t, 1 - beta2^t */
    float grad_scale;
} AdamWStep;

/* A run of parameters [begin, end) with the same weight decay. */
typedef struct AdamWSpan {
    int64_t begin, end;
    float weight_decay;
} AdamWSpan;

/* The block of logits (rows x columns of the rank's vocabulary slice, float32, and its gradient in
 * the compute dtype beside it) of each kind of backend, unless train.logits_block sets another: 2^24
 * floats on the CPU; 2^26 on a GPU (256 MiB, and its bf16 gradient 128 MiB: at Llama 3's vocabulary
 * about 520 rows of the whole slice per block; engine/model/model_head.c says how a block is cut). */
enum { OPS_LOGITS_FLOATS_CPU = 1 << 24, OPS_LOGITS_FLOATS_GPU = 1 << 26 };

typedef struct Ops {
    const char *name;
    int host_memory;       /* 1: its memory is host memory (MPI can use it as it is) */
    size_t act_bytes;      /* bytes of one element of the compute dtype: 4 (float32) or 2 (bfloat16) */
    int act_is_f32;        /* the compute dtype is float32: an Act array may alias a float array */
    int64_t logits_floats; /* the largest block of logits (rows x columns of the vocabulary slice) the
                            * model makes unless train.logits_block says: OPS_LOGITS_FLOATS_CPU or _GPU
                            * (the memory model reads them too) */

    /* Memory of the backend. alloc returns zeroed memory or NULL. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    /* Free and total bytes of the device's memory now (for the out-of-memory message). */
    void (*memory)(size_t *free_bytes, size_t *total_bytes);
    /* The peak of memory use so far, what the memory model predicts: on the CPU the most bytes held
     * at once through alloc; on a GPU the most the device had in use (total - free, the CUDA
     * runtime's own memory included) at any alloc and at this call. */
    size_t (*peak_bytes)(void);
    /* The allocations and frees of device memory made so far (alloc, free and the backend's own): a
     * training step allocates nothing once the first is over (on a GPU cudaMalloc and cudaFree wait
     * for the whole device, communication included); the tests read it. */
    int64_t (*alloc_calls)(void);
    /* Takes now what the attention's own buffers need for calls of at most `rows` query or key rows
     * at the rank's heads, so that no step allocates them: NULL where there is nothing to take (the
     * CPU); on a GPU cuDNN's workspace, gradient scratch and batch arrays (ops_cudnn_buffers) where
     * train.attention may run cuDNN. 0, or -1 when the device's memory cannot hold them. */
    int (*attention_reserve)(int n_heads, int n_kv_heads, int head_dim, int64_t rows);
    /* Waits until every op issued so far has finished (a no-op where ops are synchronous). */
    void (*sync)(void);
    /* Device-side timing, for a backend whose ops run asynchronously (NULL on the CPU, where the
     * host clock between two syncs measures). timer_mark(i) records mark i (i >= 0; marks are
     * reused step after step) behind the ops issued so far, without waiting; timer_seconds(a, b)
     * waits until mark b has passed and returns the seconds between marks a and b. The trainer
     * marks both ends of every forward and backward pass and reads them once, at the step's end. */
    void (*timer_mark)(int i);
    double (*timer_seconds)(int a, int b);

    /* Rows of `width` elements: dst row dst_rows[i] (i when dst_rows is NULL) = src row src_rows[i]
     * (i when NULL), for i < n, converted between the dtypes; rows are `stride` elements apart. A
     * cast of n elements is one row (ops_cast). Index arrays are backend memory. */
    void (*copy_rows)(void *dst, Dt dst_dt, int64_t dst_stride, const int64_t *dst_rows, const void *src, Dt src_dt,
                      int64_t src_stride, const int64_t *src_rows, int64_t n, int64_t width);

    /* out[t] = table[tokens[t] - row0], or zero when the token is outside [row0, row0 + rows) (the
     * vocabulary-parallel slice of this rank); the table is the float32 master weights. */
    void (*embedding_fwd)(float *out, const int32_t *tokens, int64_t T, const float *table, int64_t row0,
                          int64_t rows, int64_t d);
    /* dtable += the rows of dout, each at its token's row (every sum in a fixed order). */
    void (*embedding_bwd)(float *dtable, const int32_t *tokens, const float *dout, int64_t T, int64_t row0,
                          int64_t rows, int64_t d);
    /* out = x / sqrt(mean(x^2) + eps) * w; rstd[t] = 1 / sqrt(mean(x_t^2) + eps). */
    void (*rmsnorm_fwd)(Act *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
    /* dx += the gradient of x (accumulate), then dx_act = dx in the compute dtype (dx_act may be
     * NULL); dw += the gradient of w. */
    void (*rmsnorm_bwd)(float *dx, Act *dx_act, float *dw, const float *dout, const float *x, const float *w,
                        const float *rstd, int64_t T, int64_t d);
    /* out[T, n_out] = x[T, n_in] W^T */
    void (*matmul_fwd)(MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_in, int64_t n_out);
    /* dx[T, n_in] = dout[T, n_out] W */
    void (*matmul_bwd_dx)(MatOut dx, const Act *dout, const Act *w, int64_t T, int64_t n_in, int64_t n_out);
    /* dw[n_out, n_in] += dout^T x */
    void (*matmul_bwd_dw)(float *dw, const Act *dout, const Act *x, int64_t T, int64_t n_in, int64_t n_out);
    /* Rotates pairs (i, i + head_dim/2) of the first n_heads heads of every row of x (rows `stride`
     * apart) in place by positions[t] * inv_freq[i] (Hugging Face's rotate_half form), cos and sin
     * multiplied by scale (yarn's attention factor; 1: a plain rotation). */
    void (*rope_fwd)(Act *x, int64_t stride, const int32_t *positions, int64_t T, int n_heads, int head_dim,
                     const float *inv_freq, float scale);
    /* The backward: dx[t, :width] = g[t, :width] in the compute dtype, its first n_heads heads
     * rotated back (the backward of a rotation is the inverse rotation), times scale. */
    void (*rope_bwd)(Act *dx, int64_t dx_stride, const float *g, int64_t g_stride, int64_t width,
                     const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                     float scale);
    void (*attention_fwd)(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                          int64_t n_segs, AttnShape shape);
    /* Accumulates into dq, dk, dv (float32; the caller zeroes them first) on the rows the segments
     * touch; segments that share keys add their parts. out and lse are the attention's over all
     * the keys its rows see: a block of them (the segments of one call of a blockwise forward)
     * gives that block's share of every gradient. */
    void (*attention_bwd)(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                          const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs,
                          AttnShape shape);
    /* Attention over the union of key blocks, one attention_fwd call per block, by log-sum-exp: on
     * the query rows of segs, per head, (acc, acc_lse) [float32, rows o_stride apart] takes in the
     * block's (part, part_lse) - with first, acc = part; else, with m = max(acc_lse, part_lse),
     * acc = (acc e^(acc_lse - m) + part e^(part_lse - m)) / (e^(acc_lse - m) + e^(part_lse - m)),
     * acc_lse = m + log of that denominator. attention_merge_store then writes out = acc (compute
     * dtype) and lse = acc_lse on those rows: what one call over all the keys computes, up to
     * rounding (each block's part is rounded to the compute dtype once). */
    void (*attention_merge)(float *acc, float *acc_lse, const Act *part, const float *part_lse,
                            const AttnSegment *segs, int64_t n_segs, AttnShape shape, int first);
    void (*attention_merge_store)(Act *out, float *lse, const float *acc, const float *acc_lse,
                                  const AttnSegment *segs, int64_t n_segs, AttnShape shape);
    /* out[t] = silu(g[t]) * u[t], where row t of gu holds g (columns 0 .. F-1) then u (F .. 2F-1). */
    void (*swiglu_fwd)(Act *out, const Act *gu, int64_t T, int64_t F);
    /* dgu[t] = (dout silu'(g) u, dout silu(g)) in gu's layout. */
    void (*swiglu_bwd)(Act *dgu, const float *dout, const Act *gu, int64_t T, int64_t F);
    /* Cross-entropy over a vocabulary split by rows between ranks, and on each rank into tiles of
     * columns: logits[T, V] hold the columns [vocab0, vocab0 + V) of the full vocabulary (a tile of
     * the rank's slice, or all of it). stats[3 t ..] of row t, in one pass over the tile: its max m,
     * sum exp(z - m), and z of the target when the target falls in these columns (else 0, also for no
     * target) - with first; else the tile's (m', s', z') merge into what stats holds (the running
     * softmax statistics of the tiles before it): M = max(m, m'), s = s e^(m - M) + s' e^(m' - M),
     * m = M, z += z'. The caller combines the ranks' rows into lse = max + log(sum exp); the loss of
     * a row with a target is lse - z_target. */
    void (*ce_stats)(double *stats, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                     int64_t vocab0, int first);
    /* dlogits = dloss * (softmax - onehot) on the columns [vocab0, vocab0 + V) (a tile or the whole
     * slice), from the full lse (zero rows for no target). */
    void (*ce_grad)(Act *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                    int64_t V, int64_t vocab0, float dloss);
    void (*add)(float *out, const float *a, const float *b, int64_t n); /* out = a + b (out may be a) */
    void (*copy)(float *dst, const float *src, int64_t n);
    void (*zero)(float *x, int64_t n);
    double (*sum_squares)(const float *x, int64_t n);
    /* AdamW on n parameters p with gradients g and moments m, v; weight decay by spans (covering
     * [0, n) in order); p_act (NULL: none) gets the updated p in the compute dtype. */
    void (*adamw)(float *p, const float *g, float *m, float *v, Act *p_act, int64_t n, const AdamWSpan *spans,
                  int n_spans, AdamWStep s);
} Ops;

/* The element i of an Act array (pointer arithmetic in the compute dtype). */
static inline Act *ops_act(const Ops *o, const Act *p, int64_t i)
{
    return (Act *)((char *)(uintptr_t)p + i * (int64_t)o->act_bytes);
}

/* dst = src (n elements) converted between the dtypes. */
static inline void ops_cast(const Ops *o, void *dst, Dt dst_dt, const void *src, Dt src_dt, int64_t n)
{
    if (n > 0)
        o->copy_rows(dst, dst_dt, n, NULL, src, src_dt, n, NULL, 1, n);
}

#ifdef __cplusplus
}
#endif

#endif
