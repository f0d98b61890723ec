/*
 * cuda/cuda_attention_ref.cuh - the blocks of the float32 reference attention (cuda_attention.cu
 * launches them; test/test_flash_emulated.cc runs the same source on the host under the emulator of
 * test/flash_emu.h). Written to be right first: float32 throughout, tiles of queries and keys in
 * shared memory, one thread per element of each small product, an online softmax, no score matrix
 * in device memory. Semantics: engine/ops.h (AttnSegment, AttnShape); scale 1 / sqrt(D).
 *
 * Work lists are those of the tensor-core kernels (cuda_flash_plan.cuh) cut by the tiles of C:
 * items (segment, first row of a tile), segments as int4 {q_row, q_len, kv_row, kv_len}, and the
 * dK/dV items in waves of segments that share no key row.
 *
 * Forward (ref_fwd_cta): a block per (query tile of BM rows, query head). For each tile of BN keys,
 * in order, S = q k / sqrt(D) (masked: query i of the segment sees keys up to off + i, flash_seg_off),
 * the new row maxima m', alpha = exp(m - m'), P = exp(S - m'), l = alpha l + sum P,
 * O = alpha O + P V; at the end out = O / l and lse = m + log l.
 * Backward (FlashAttention-2's, in float32): Delta_i = dout_i . out_i (ref_delta_cta) first; then
 * P = exp(S - lse), dP = dout v, dS = P (dP - Delta) / sqrt(D) (ref_scores_bwd), and
 *   ref_dkdv_cta: a block per (key tile of BN rows, kv head), walking every query head of the kv
 *     head's group and every query tile that sees its keys, in order: dV += P^T dout, dK += dS^T q
 *     in shared memory, added to dk, dv at the end - plainly when the block is their only writer in
 *     the launch (a wave), else (kv_atomic) with atomics. ATOMIC_DQ: dQ += dS k is added to dq with
 *     atomics on the way (train.deterministic: false, one launch over every wave);
 *   ref_dq_cta (train.deterministic: true): a block per (query tile, query head) walks the key tiles
 *     in order, recomputes dS and keeps dQ in shared memory, then adds it to dq once.
 * Deterministic mode: one dK/dV launch per wave, then the dQ launch: every float of dq, dk, dv has
 * one writer per launch and every sum an order fixed by the code, so the same bits every run, with
 * no floating-point atomics.
 *
 * Global memory goes through the flash_* primitives of cuda_flash_frag.cuh (so that the emulator
 * checks every access); shared memory is plain float arrays, each phase separated by
 * flash_sync_cta.
 */
#ifndef WLB_CUDA_CUDA_ATTENTION_REF_CUH
#define WLB_CUDA_CUDA_ATTENTION_REF_CUH

#include <math.h>

#include "cuda/cuda_flash_frag.cuh"
#include "cuda/cuda_flash_plan.cuh"

/* The tiles of one head size: BM query rows and BN key rows a tile, THREADS a block; the bytes of
 * shared memory of each block. */
template <int D_, int BM_, int BN_> struct RefAttnCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_, THREADS = 128;
    /* Q, O [BM][D]; K, V [BN][D]; S [BM][BN]; m, l, alpha [BM] */
    static constexpr int FWD_SMEM = 4 * ((2 * BM + 2 * BN) * D + BM * BN + 3 * BM);
    /* K, V, dK, dV [BN][D]; Q, dO [BM][D]; P, dS [BM][BN]; lse, Delta [BM] */
    static constexpr int DKDV_SMEM = 4 * ((4 * BN + 2 * BM) * D + 2 * BM * BN + 2 * BM);
    /* Q, dO, dQ [BM][D]; K, V [BN][D]; dS [BM][BN]; lse, Delta [BM] */
    static constexpr int DQ_SMEM = 4 * ((3 * BM + 2 * BN) * D + BM * BN + 2 * BM);
};

/* The tiles of each head size (cuda_attention.cu builds 8, 16, 32, 64, 80, 96, 128 and 256). */
template <int D> struct RefAttnTiles {
    using Cfg = RefAttnCfg<D, 32, 32>;
};
template <> struct RefAttnTiles<256> {
    using Cfg = RefAttnCfg<256, 16, 16>;
};

template <class C> inline FlashPlanShape ref_attn_plan_shape()
{
    return FlashPlanShape{C::BM, C::BN, C::BM, C::BN, C::BN, C::BM};
}

struct RefAttnArgs {
    const int4 *segs;
    const int2 *items;
    const float *q, *k, *v;
    float *out, *lse; /* written by the forward, read by the backward */
    const float *dout;
    float *delta; /* dout . out, laid out as lse: [row * n_heads + h] */
    float *dq, *dk, *dv;
    int n_heads, group; /* group: query heads per kv head */
    int64_t q_stride, kv_stride, o_stride;
    float scale;   /* 1 / sqrt(D) */
    int kv_atomic; /* dk, dv added with atomics (segments of this launch share keys) */
};

/* ROWS rows of D floats (row r from src + r * stride) into dst [ROWS][D], rows >= valid as zeros. */
template <int ROWS, int D, int THREADS>
FLASH_DEV void ref_load_rows(float *dst, const float *src, int64_t stride, int valid, int tid)
{
    for (int e = tid; e < ROWS * D; e += THREADS) {
        const int r = e / D, d = e % D;
        dst[e] = r < valid ? flash_ld_global(src + r * stride + d) : 0.0f;
    }
}

/* lse and Delta of BM query rows from row0 on (head h), rows >= valid as zeros. */
template <int BM, int THREADS>
FLASH_DEV void ref_load_lse_delta(float *lse_s, float *delta_s, const RefAttnArgs &a, int64_t row0, int h, int valid,
                                  int tid)
{
    for (int i = tid; i < BM; i += THREADS) {
        const int64_t at = (row0 + i) * a.n_heads + h;
        lse_s[i] = i < valid ? flash_ld_global(a.lse + at) : 0.0f;
        delta_s[i] = i < valid ? flash_ld_global(a.delta + at) : 0.0f;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Forward                                                                                         */

template <class C> FLASH_DEV void ref_fwd_cta(const RefAttnArgs &a, float *sm, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, THREADS = C::THREADS;
    float *Qs = sm, *Os = Qs + BM * D, *Ks = Os + BM * D, *Vs = Ks + BN * D, *S = Vs + BN * D;
    float *m_s = S + BM * BN, *l_s = m_s + BM, *alpha_s = l_s + BM;
    const int2 item = flash_ld_global(a.items + block / a.n_heads);
    const int h = (int)(block % a.n_heads), kh = h / a.group;
    const int4 g = flash_ld_global(a.segs + item.x); /* q_row, q_len, kv_row, kv_len */
    const int i0 = item.y, rows = flash_imin(BM, g.y - i0), offset = flash_seg_off(g), kv = flash_seg_keys(g);
    const int64_t row0 = (int64_t)g.x + i0;
    const float *kg = a.k + (int64_t)g.z * a.kv_stride + (int64_t)kh * D;
    const float *vg = a.v + (int64_t)g.z * a.kv_stride + (int64_t)kh * D;
    ref_load_rows<BM, D, THREADS>(Qs, a.q + row0 * a.q_stride + (int64_t)h * D, a.q_stride, rows, tid);
    for (int e = tid; e < BM * D; e += THREADS)
        Os[e] = 0.0f;
    for (int i = tid; i < BM; i += THREADS) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }
    const int last = flash_imin(offset + i0 + rows, kv) - 1; /* the last key any row of the tile sees */
    for (int j0 = 0; j0 <= last; j0 += BN) {
        flash_sync_cta();
        const int keys = kv - j0;
        ref_load_rows<BN, D, THREADS>(Ks, kg + (int64_t)j0 * a.kv_stride, a.kv_stride, keys, tid);
        ref_load_rows<BN, D, THREADS>(Vs, vg + (int64_t)j0 * a.kv_stride, a.kv_stride, keys, tid);
        flash_sync_cta();
        for (int e = tid; e < BM * BN; e += THREADS) {
            const int i = e / BN, j = e % BN;
            float s = -INFINITY;
            if (i < rows && j < keys && j0 + j <= offset + i0 + i) {
                float dot = 0.0f;
#pragma unroll 16
                for (int d = 0; d < D; d++)
                    dot += Qs[i * D + d] * Ks[j * D + d];
                s = dot * a.scale;
            }
            S[e] = s;
        }
        flash_sync_cta();
        for (int i = tid; i < BM; i += THREADS) {
            float mx = -INFINITY;
            for (int j = 0; j < BN; j++)
                mx = fmaxf(mx, S[i * BN + j]);
            float m_new = fmaxf(m_s[i], mx), alpha = 1.0f, sum = 0.0f;
            if (m_new == -INFINITY) { /* no key for this row yet (or a padding row) */
                for (int j = 0; j < BN; j++)
                    S[i * BN + j] = 0.0f;
            } else {
                alpha = m_s[i] == -INFINITY ? 0.0f : expf(m_s[i] - m_new);
                for (int j = 0; j < BN; j++) {
                    float p = S[i * BN + j] == -INFINITY ? 0.0f : expf(S[i * BN + j] - m_new);
                    S[i * BN + j] = p;
                    sum += p;
                }
            }
            l_s[i] = l_s[i] * alpha + sum;
            m_s[i] = m_new;
            alpha_s[i] = alpha;
        }
        flash_sync_cta();
        for (int e = tid; e < BM * D; e += THREADS) {
            const int i = e / D, d = e % D;
            float acc = Os[e] * alpha_s[i];
#pragma unroll 8
            for (int j = 0; j < BN; j++)
                acc += S[i * BN + j] * Vs[j * D + d];
            Os[e] = acc;
        }
    }
    flash_sync_cta();
    for (int e = tid; e < rows * D; e += THREADS) {
        const int i = e / D, d = e % D;
        flash_st_global_f32(a.out + (row0 + i) * a.o_stride + (int64_t)h * D + d, Os[e] / l_s[i]);
    }
    for (int i = tid; i < rows; i += THREADS)
        flash_st_global_f32(a.lse + (row0 + i) * a.n_heads + h, m_s[i] + logf(l_s[i]));
}

/* ---------------------------------------------------------------------------------------------- */
/* Backward                                                                                        */

/* Delta = dout . out of the BM rows of one query tile (a dQ item) and every head. */
template <int D, int BM, int THREADS> FLASH_DEV void ref_delta_cta(const RefAttnArgs &a, int64_t block, int tid)
{
    const int2 item = flash_ld_global(a.items + block);
    const int4 g = flash_ld_global(a.segs + item.x);
    const int rows = flash_imin(BM, g.y - item.y);
    for (int e = tid; e < rows * a.n_heads; e += THREADS) {
        const int64_t row = (int64_t)g.x + item.y + e / a.n_heads;
        const int h = e % a.n_heads;
        const int64_t at = row * a.o_stride + (int64_t)h * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++)
            s += flash_ld_global(a.dout + at + d) * flash_ld_global(a.out + at + d);
        flash_st_global_f32(a.delta + row * a.n_heads + h, s);
    }
}

/* P (when P is not null) and dS = P (dP - Delta) / sqrt(D) of BM query rows (i0 on, `rows` of them
 * real) against BN keys (j0 on) of a segment with key offset kv_len - q_len, from Q, dO, K, V, lse
 * and Delta in shared memory; masked pairs are 0. */
template <class C>
FLASH_DEV void ref_scores_bwd(float *P, float *dS, const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                              const float *lse_s, const float *delta_s, int i0, int rows, int j0, int keys, int offset,
                              float scale, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN;
    for (int e = tid; e < BM * BN; e += C::THREADS) {
        const int i = e / BN, j = e % BN;
        float p = 0.0f, ds = 0.0f;
        if (i < rows && j < keys && j0 + j <= offset + i0 + i) {
            float qk = 0.0f, dp = 0.0f;
#pragma unroll 16
            for (int d = 0; d < D; d++) {
                qk += Qs[i * D + d] * Ks[j * D + d];
                dp += dOs[i * D + d] * Vs[j * D + d];
            }
            p = expf(qk * scale - lse_s[i]);
            ds = p * (dp - delta_s[i]) * scale;
        }
        if (P)
            P[e] = p;
        dS[e] = ds;
    }
}

/* (dS K)[i][d] over the tile's BN keys, in order. */
template <class C> FLASH_DEV float ref_ds_k(const float *dS, const float *Ks, int i, int d)
{
    float acc = 0.0f;
#pragma unroll 8
    for (int j = 0; j < C::BN; j++)
        acc += dS[i * C::BN + j] * Ks[j * C::D + d];
    return acc;
}

template <class C, bool ATOMIC_DQ>
FLASH_DEV void ref_dkdv_cta(const RefAttnArgs &a, float *sm, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, THREADS = C::THREADS;
    float *Ks = sm, *Vs = Ks + BN * D, *dKs = Vs + BN * D, *dVs = dKs + BN * D, *Qs = dVs + BN * D, *dOs = Qs + BM * D;
    float *P = dOs + BM * D, *dS = P + BM * BN, *lse_s = dS + BM * BN, *delta_s = lse_s + BM;
    const int n_kv = a.n_heads / a.group;
    const int2 item = flash_ld_global(a.items + block / n_kv);
    const int kh = (int)(block % n_kv);
    const int4 g = flash_ld_global(a.segs + item.x);
    const int j0 = item.y, keys = flash_imin(BN, flash_seg_keys(g) - j0), offset = flash_seg_off(g);
    const int64_t kv0 = (int64_t)g.z + j0;
    ref_load_rows<BN, D, THREADS>(Ks, a.k + kv0 * a.kv_stride + (int64_t)kh * D, a.kv_stride, keys, tid);
    ref_load_rows<BN, D, THREADS>(Vs, a.v + kv0 * a.kv_stride + (int64_t)kh * D, a.kv_stride, keys, tid);
    for (int e = tid; e < BN * D; e += THREADS) {
        dKs[e] = 0.0f;
        dVs[e] = 0.0f;
    }
    const int first = flash_imax(0, j0 - offset); /* the first query that sees key j0 */
    for (int hh = 0; hh < a.group; hh++) {
        const int h = kh * a.group + hh;
        for (int i0 = first; i0 < g.y; i0 += BM) {
            const int rows = flash_imin(BM, g.y - i0);
            const int64_t row0 = (int64_t)g.x + i0;
            flash_sync_cta();
            ref_load_rows<BM, D, THREADS>(Qs, a.q + row0 * a.q_stride + (int64_t)h * D, a.q_stride, rows, tid);
            ref_load_rows<BM, D, THREADS>(dOs, a.dout + row0 * a.o_stride + (int64_t)h * D, a.o_stride, rows, tid);
            ref_load_lse_delta<BM, THREADS>(lse_s, delta_s, a, row0, h, rows, tid);
            flash_sync_cta();
            ref_scores_bwd<C>(P, dS, Qs, dOs, Ks, Vs, lse_s, delta_s, i0, rows, j0, keys, offset, a.scale, tid);
            flash_sync_cta();
            for (int e = tid; e < BN * D; e += THREADS) {
                const int j = e / D, d = e % D;
                float acc_v = 0.0f, acc_k = 0.0f;
                for (int i = 0; i < BM; i++) {
                    acc_v += P[i * BN + j] * dOs[i * D + d];
                    acc_k += dS[i * BN + j] * Qs[i * D + d];
                }
                dVs[e] += acc_v;
                dKs[e] += acc_k;
            }
            if constexpr (ATOMIC_DQ) {
                for (int e = tid; e < rows * D; e += THREADS) {
                    const int i = e / D, d = e % D;
                    const float acc = ref_ds_k<C>(dS, Ks, i, d);
                    if (acc != 0.0f)
                        flash_atomic_add_f32(a.dq + (row0 + i) * a.q_stride + (int64_t)h * D + d, acc);
                }
            }
        }
    }
    flash_sync_cta();
    for (int e = tid; e < keys * D; e += THREADS) {
        const int j = e / D, d = e % D;
        const int64_t at = (kv0 + j) * a.kv_stride + (int64_t)kh * D + d;
        if (a.kv_atomic) {
            flash_atomic_add_f32(a.dk + at, dKs[e]);
            flash_atomic_add_f32(a.dv + at, dVs[e]);
        } else {
            flash_add_global_f32(a.dk + at, dKs[e]);
            flash_add_global_f32(a.dv + at, dVs[e]);
        }
    }
}

template <class C> FLASH_DEV void ref_dq_cta(const RefAttnArgs &a, float *sm, int64_t block, int tid)
{
    constexpr int D = C::D, BM = C::BM, BN = C::BN, THREADS = C::THREADS;
    float *Qs = sm, *dOs = Qs + BM * D, *dQs = dOs + BM * D, *Ks = dQs + BM * D, *Vs = Ks + BN * D, *dS = Vs + BN * D;
    float *lse_s = dS + BM * BN, *delta_s = lse_s + BM;
    const int2 item = flash_ld_global(a.items + block / a.n_heads);
    const int h = (int)(block % a.n_heads), kh = h / a.group;
    const int4 g = flash_ld_global(a.segs + item.x);
    const int i0 = item.y, rows = flash_imin(BM, g.y - i0), offset = flash_seg_off(g), kv = flash_seg_keys(g);
    const int64_t row0 = (int64_t)g.x + i0;
    const float *kg = a.k + (int64_t)g.z * a.kv_stride + (int64_t)kh * D;
    const float *vg = a.v + (int64_t)g.z * a.kv_stride + (int64_t)kh * D;
    ref_load_rows<BM, D, THREADS>(Qs, a.q + row0 * a.q_stride + (int64_t)h * D, a.q_stride, rows, tid);
    ref_load_rows<BM, D, THREADS>(dOs, a.dout + row0 * a.o_stride + (int64_t)h * D, a.o_stride, rows, tid);
    ref_load_lse_delta<BM, THREADS>(lse_s, delta_s, a, row0, h, rows, tid);
    for (int e = tid; e < BM * D; e += THREADS)
        dQs[e] = 0.0f;
    const int last = flash_imin(offset + i0 + rows, kv) - 1; /* the last key any row of the tile sees */
    for (int j0 = 0; j0 <= last; j0 += BN) {
        flash_sync_cta();
        const int keys = flash_imin(BN, kv - j0);
        ref_load_rows<BN, D, THREADS>(Ks, kg + (int64_t)j0 * a.kv_stride, a.kv_stride, keys, tid);
        ref_load_rows<BN, D, THREADS>(Vs, vg + (int64_t)j0 * a.kv_stride, a.kv_stride, keys, tid);
        flash_sync_cta();
        ref_scores_bwd<C>(nullptr, dS, Qs, dOs, Ks, Vs, lse_s, delta_s, i0, rows, j0, keys, offset, a.scale, tid);
        flash_sync_cta();
        for (int e = tid; e < BM * D; e += THREADS)
            dQs[e] += ref_ds_k<C>(dS, Ks, e / D, e % D);
    }
    /* dq += dQ on the tile's real rows (this block is their only writer; dQs[e] is this thread's) */
    for (int e = tid; e < rows * D; e += THREADS) {
        const int i = e / D, d = e % D;
        flash_add_global_f32(a.dq + (row0 + i) * a.q_stride + (int64_t)h * D + d, dQs[e]);
    }
}

#endif
