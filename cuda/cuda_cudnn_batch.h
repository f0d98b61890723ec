/*
 * cuda/cuda_cudnn_batch.h - host code of cuDNN's attention path (cuda_cudnn.cu): the engine's
 * segments as cuDNN's ragged batches, and the backward's waves. Plain C++ without CUDA, so that
 * test/test_cudnn_batch.cc checks it on the CPU.
 *
 * A batch is the segments of one cuDNN call, each one sequence: its lengths (seq_q, seq_kv), and its
 * ragged offsets - the element where the sequence starts in each array: q at q_row * q_stride, k and
 * v at kv_row * kv_stride, out and dout at q_row * o_stride, the statistics (lse) at q_row * n_heads,
 * the packed bf16 gradients at q_row * H and kv_row * Hkv (H, Hkv: heads times head size). The
 * batch's sizes in its CudnnSdpaDesc are rounded up to powers of two (so that a few plans serve every
 * step): the sequences past the real ones have length 0 and start where the last one ends, so the
 * offsets never decrease and offset[batch] is the end of the last sequence.
 */
#ifndef WLB_CUDA_CUDA_CUDNN_BATCH_H
#define WLB_CUDA_CUDA_CUDNN_BATCH_H

#include <string.h>

#include <vector>

#include "cuda/cuda_cudnn.h"
#include "engine/ops.h"

/* A segment as the gradient kernel reads it (device memory, beside the offsets). */
struct CudnnSeg {
    int64_t q_row, q_len, kv_row, kv_len;
};

enum { CUDNN_OFF_Q, CUDNN_OFF_KV, CUDNN_OFF_O, CUDNN_OFF_STATS, CUDNN_OFF_DQ, CUDNN_OFF_DKV, CUDNN_OFFSETS };

struct CudnnBatch {
    CudnnSdpaDesc desc;
    std::vector<int32_t> seq_q, seq_kv;        /* desc.batch each */
    std::vector<int64_t> off[CUDNN_OFFSETS];   /* desc.batch + 1 each */
    std::vector<CudnnSeg> segs;                /* the real sequences */
};

static inline int64_t cudnn_pow2_at_least(int64_t n, int64_t lo)
{
    int64_t p = lo;
    while (p < n)
        p *= 2;
    return p;
}

/* The indices of the segments with queries that are causal (full 0) or full (full 1). */
static inline std::vector<int64_t> cudnn_group(const AttnSegment *segs, int64_t n, int full)
{
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; i++)
        if (segs[i].q_len > 0 && (segs[i].full != 0) == (full != 0))
            idx.push_back(i);
    return idx;
}

/* The batch of the segments segs[idx[i]] (at least one, q_len > 0 each). */
static inline void cudnn_make_batch(CudnnBatch *b, const AttnSegment *segs, const std::vector<int64_t> &idx,
                                    AttnShape s, int backward, int causal, int deterministic)
{
    const int64_t n = (int64_t)idx.size(), H = (int64_t)s.n_heads * s.head_dim,
                  Hkv = (int64_t)s.n_kv_heads * s.head_dim;
    int64_t max_q = 1, max_kv = 1, rows_q = 1, rows_kv = 1;
    for (int64_t i : idx) {
        const AttnSegment &g = segs[i];
        max_q = g.q_len > max_q ? g.q_len : max_q;
        max_kv = g.kv_len > max_kv ? g.kv_len : max_kv;
        rows_q = g.q_row + g.q_len > rows_q ? g.q_row + g.q_len : rows_q;
        rows_kv = g.kv_row + g.kv_len > rows_kv ? g.kv_row + g.kv_len : rows_kv;
    }
    CudnnSdpaDesc d;
    memset(&d, 0, sizeof d);
    d.backward = backward, d.causal = causal, d.deterministic = backward && deterministic;
    d.n_heads = s.n_heads, d.n_kv_heads = s.n_kv_heads, d.head_dim = s.head_dim;
    d.q_stride = s.q_stride, d.kv_stride = s.kv_stride, d.o_stride = s.o_stride;
    d.batch = cudnn_pow2_at_least(n, 1);
    d.max_q = cudnn_pow2_at_least(max_q, 64);
    d.max_kv = cudnn_pow2_at_least(max_kv, 64);
    /* the backward's fp32 dQ accumulator and Delta are indexed by the offsets: rows up to rows_q */
    d.rows_q = backward ? cudnn_pow2_at_least(rows_q, 64) : 0;
    d.rows_kv = backward ? cudnn_pow2_at_least(rows_kv, 64) : 0;
    b->desc = d;
    b->seq_q.assign((size_t)d.batch, 0);
    b->seq_kv.assign((size_t)d.batch, 0);
    for (auto &o : b->off)
        o.assign((size_t)d.batch + 1, 0);
    b->segs.clear();
    /* offset k of a sequence = q_row * q_mul[k] + kv_row * kv_mul[k] */
    const int64_t q_mul[CUDNN_OFFSETS] = {s.q_stride, 0, s.o_stride, s.n_heads, H, 0};
    const int64_t kv_mul[CUDNN_OFFSETS] = {0, s.kv_stride, 0, 0, 0, Hkv};
    for (int64_t j = 0; j <= d.batch; j++) {
        const AttnSegment &g = segs[idx[(size_t)(j < n ? j : n - 1)]];
        const int64_t q_row = j < n ? g.q_row : g.q_row + g.q_len, kv_row = j < n ? g.kv_row : g.kv_row + g.kv_len;
        for (int k = 0; k < CUDNN_OFFSETS; k++)
            b->off[k][(size_t)j] = q_row * q_mul[k] + kv_row * kv_mul[k];
        if (j < n) {
            b->seq_q[(size_t)j] = (int32_t)g.q_len;
            b->seq_kv[(size_t)j] = (int32_t)g.kv_len;
            b->segs.push_back(CudnnSeg{g.q_row, g.q_len, g.kv_row, g.kv_len});
        }
    }
}

/* Waves of segments whose query ranges and key ranges are pairwise disjoint (each segment in the
 * first wave it fits, the order of idx kept within a wave): cuDNN writes a sequence's gradients
 * rather than adding them, so two sequences of one call must not share a row. */
static inline std::vector<std::vector<int64_t>> cudnn_waves(const AttnSegment *segs, const std::vector<int64_t> &idx)
{
    std::vector<std::vector<int64_t>> waves;
    auto overlap = [](int64_t a, int64_t la, int64_t b, int64_t lb) { return a < b + lb && b < a + la; };
    for (int64_t i : idx) {
        const AttnSegment &g = segs[i];
        size_t w = 0;
        for (; w < waves.size(); w++) {
            bool clash = false;
            for (int64_t j : waves[w]) {
                const AttnSegment &h = segs[j];
                if (overlap(g.q_row, g.q_len, h.q_row, h.q_len) || overlap(g.kv_row, g.kv_len, h.kv_row, h.kv_len)) {
                    clash = true;
                    break;
                }
            }
            if (!clash)
                break;
        }
        if (w == waves.size())
            waves.emplace_back();
        waves[w].push_back(i);
    }
    return waves;
}

/* Bytes of the score-sized workspace cuDNN's deterministic backward takes on Hopper (the bf16 dP of
 * every sequence padded to the batch's longest, in tiles of 64 queries and 128 keys: cudnn-frontend's
 * own formula), against OPS_CUDNN_DP_WORKSPACE_MAX (engine/ops.h). */
static inline int64_t cudnn_deterministic_workspace(const CudnnSdpaDesc &d)
{
    return d.batch * d.n_heads * ((d.max_q + 63) / 64 * 64) * ((d.max_kv + 127) / 128 * 128) * 2;
}

#endif
