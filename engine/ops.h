/*
 * engine/ops.h - the operations a backend implements; the model (model.c) is written once against
 * them. cpu/ implements them in fp32 (the reference), cuda/ on the GPU (matrix products in bf16
 * with fp32 accumulation when train.precision is bf16; everything else fp32). Pointers are to
 * backend memory (host for cpu, device for cuda).
 *
 * Shapes are row-major, one row per token. A weight W of a linear layer is [out, in] (Hugging Face
 * and PyTorch layout) and the layer computes y = x W^T. Gradients of weights are always
 * accumulated (+=): micro-batches add up. Gradients of activations are overwritten unless the op
 * says "accumulate".
 *
 * Attention runs over segments (AttnSegment): the query rows [q_row, q_row + q_len) against the
 * key/value rows [kv_row, kv_row + kv_len), aligned at the end (document-causal): query i sees keys
 * kv_row .. kv_row + kv_len - q_len + i. Query head h uses key/value head h / (n_heads / n_kv_heads).
 * The scale is 1 / sqrt(head_dim). lse keeps, per query row and head, the log of the softmax
 * denominator (with the max folded in) for the backward.
 */
#ifndef WLB_ENGINE_OPS_H
#define WLB_ENGINE_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct AttnSegment {
    int64_t q_row, q_len, kv_row, kv_len;
} AttnSegment;

typedef struct AttnShape {
    int n_heads, n_kv_heads, head_dim;
    /* Elements between consecutive rows: of q (and dq), of k and v (and dk, dv), of out (and dout).
     * q, k and v may be column ranges of one fused [T, q + k + v] array. */
    int64_t q_stride, kv_stride, o_stride;
} AttnShape;

typedef struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float bias1, bias2; /* 1 - beta1^t, 1 - beta2^t */
} AdamWStep;

typedef struct Ops {
    const char *name;
    int host_memory; /* 1: its memory is host memory (MPI can use it as it is) */
    /* Memory of the backend. alloc returns zeroed memory or NULL. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);

    /* out[t] = table[tokens[t] - row0], or zero when the token is outside [row0, row0 + rows) (the
     * vocabulary-parallel slice of this rank). */
    void (*embedding_fwd)(float *out, const int32_t *tokens, int64_t T, const float *table, int64_t row0,
                          int64_t rows, int64_t d);
    void (*embedding_bwd)(float *dtable, const int32_t *tokens, const float *dout, int64_t T, int64_t row0,
                          int64_t rows, int64_t d);
    /* out = x / sqrt(mean(x^2) + eps) * w; rstd[t] = 1 / sqrt(mean(x_t^2) + eps). */
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
    /* dx += (accumulate), dw += */
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                        int64_t T, int64_t d);
    /* out[T, n_out] = x[T, n_in] W^T */
    void (*matmul_fwd)(float *out, const float *x, const float *w, int64_t T, int64_t n_in, int64_t n_out);
    /* dx[T, n_in] = dout W (accumulated into dx when accumulate_dx; dx may be NULL), dw += dout^T x */
    void (*matmul_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w, int64_t T,
                       int64_t n_in, int64_t n_out, int accumulate_dx);
    /* Rotates pairs (i, i + head_dim/2) of every head of x[T, n_heads * head_dim] in place by
     * positions[t] * inv_freq[i] (Hugging Face's rotate_half form); inverse = 1 rotates back (the
     * backward of a rotation is the inverse rotation). */
    void (*rope)(float *x, const int32_t *positions, int64_t T, int n_heads, int head_dim, const float *inv_freq,
                 int inverse);
    void (*attention_fwd)(float *out, float *lse, const float *q, const float *k, const float *v,
                          const AttnSegment *segs, int64_t n_segs, AttnShape shape);
    /* dq, dk, dv overwritten on the rows the segments touch (the caller zeroes them first). */
    void (*attention_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                          AttnShape shape);
    /* out = silu(gate) * up, elementwise */
    void (*swiglu_fwd)(float *out, const float *gate, const float *up, int64_t n);
    void (*swiglu_bwd)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
    /* Cross-entropy over a vocabulary split by rows between ranks: logits[T, V] hold the columns
     * [vocab0, vocab0 + V) of the full vocabulary. The caller combines the per-row results of all
     * ranks (max of the maxima, sums of the rest) into lse = max + log(sum exp(z - max)); the loss
     * of a row with a target is lse - z_target. */
    void (*ce_row_max)(double *mx, const float *logits, int64_t T, int64_t V);
    void (*ce_row_sumexp)(double *sum, const float *logits, const double *mx, int64_t T, int64_t V);
    /* z of the target when it falls in this rank's columns, else 0 (also for no target). */
    void (*ce_target_logit)(double *z, const float *logits, const int32_t *targets, int64_t T, int64_t V,
                            int64_t vocab0);
    /* dlogits = dloss * (softmax - onehot), from the full lse (zero rows for no target); dlogits may
     * be logits (in place). */
    void (*ce_grad)(float *dlogits, const float *logits, const double *lse, const int32_t *targets, int64_t T,
                    int64_t V, int64_t vocab0, float dloss);
    /* Rows of width floats: gather dst[i] = src[rows[i]], scatter dst[rows[i]] = src[i] (i < n; rows
     * in backend memory). The context-parallel K/V exchange packs and places rows with them. */
    void (*gather_rows)(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width);
    void (*scatter_rows)(float *dst, const int64_t *rows, const float *src, int64_t n, int64_t width);
    void (*add)(float *out, const float *a, int64_t n); /* out += a */
    void (*copy)(float *dst, const float *src, int64_t n);
    void (*scale)(float *x, float s, int64_t n);
    void (*zero)(float *x, int64_t n);
    double (*sum_squares)(const float *x, int64_t n);
    /* AdamW with bias correction and decoupled weight decay (PyTorch's), on n parameters. */
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, AdamWStep s);
} Ops;

#endif
