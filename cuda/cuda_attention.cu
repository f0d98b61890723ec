/*
 * cuda/cuda_attention.cu - document-causal attention over segments on the GPU (see engine/ops.h).
 *
 * The ops: with the compute dtype bf16, the tensor-core kernels of cuda_flash_*.cu (cuda_flash.h)
 * for the head sizes they are built for; otherwise (fp32, or another head size) the float32
 * reference kernels below, which the tensor-core ones are tested against (bf16 operands widened to
 * float32 scratch first).
 *
 * The reference kernels are flash-style: tiles of queries and keys in shared memory, an online
 * softmax, no score matrix in device memory; float32 throughout, written to be right first.
 *
 * Forward: a block per (tile of BM query rows of one segment, query head). For each tile of BN keys
 * the block computes the scores S = q k / sqrt(D) (masked: query i of the segment sees keys up to
 * kv_len - q_len + i), the new row maxima m', the rescale alpha = exp(m - m'), P = exp(S - m'),
 * l = alpha l + sum P, O = alpha O + P V; at the end out = O / l and lse = m + log l.
 * Backward (FlashAttention-2): Delta_i = dout_i . out_i first; then a block per (tile of BN keys of
 * one segment, query head) walks the query tiles that see its keys, recomputes P = exp(S - lse),
 * and accumulates dV += P^T dout, dK += dS^T q with dS = P (dout v - Delta) / sqrt(D) in shared
 * memory; dQ += dS k goes to device memory with atomics, and so do dK and dV at the end (the query
 * heads of a group, and segments that share keys, add to the same rows).
 */
#include <math.h>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash.h"

struct Tile {
    int64_t seg, start; /* a tile's segment and its first query (forward) or key (backward) */
};

/* The segments and a tile list in device memory, rebuilt each call (host data, small). */
static CudaScratch seg_buf, tile_buf, delta_buf, widen_buf;
static int deterministic_bwd = 1;

static const AttnSegment *upload_segments(const AttnSegment *segs, int64_t n)
{
    AttnSegment *d = (AttnSegment *)seg_buf.get((size_t)(n ? n : 1) * sizeof *d);
    if (n)
        CUDA_CHECK(cudaMemcpy(d, segs, (size_t)n * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

/* Tiles of `step` rows over each segment's queries (by_keys 0) or keys (1). */
static const Tile *upload_tiles(const AttnSegment *segs, int64_t n, int step, int by_keys, int64_t *n_tiles)
{
    std::vector<Tile> tiles;
    for (int64_t s = 0; s < n; s++) {
        int64_t len = by_keys ? segs[s].kv_len : segs[s].q_len;
        for (int64_t a = 0; a < len; a += step)
            tiles.push_back(Tile{s, a});
    }
    *n_tiles = (int64_t)tiles.size();
    Tile *d = (Tile *)tile_buf.get((tiles.size() + 1) * sizeof *d);
    if (!tiles.empty())
        CUDA_CHECK(cudaMemcpy(d, tiles.data(), tiles.size() * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

enum { ATTN_THREADS = 128 };

template <int D, int BM, int BN> static size_t fwd_smem()
{
    return sizeof(float) * ((size_t)(2 * BM + 2 * BN) * D + (size_t)BM * BN + 3 * BM);
}

template <int D, int BM, int BN>
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_fwd(float *out, float *lse, const float *q, const float *k,
                                                           const float *v, const AttnSegment *segs, const Tile *tiles,
                                                           AttnShape a, float scale)
{
    extern __shared__ float sm[];
    float *Qs = sm, *Os = Qs + BM * D, *Ks = Os + BM * D, *Vs = Ks + BN * D, *S = Vs + BN * D;
    float *m_s = S + BM * BN, *l_s = m_s + BM, *alpha_s = l_s + BM;
    const Tile tile = tiles[blockIdx.x];
    const AttnSegment g = segs[tile.seg];
    const int h = blockIdx.y, kh = h / (a.n_heads / a.n_kv_heads), tid = threadIdx.x;
    const int64_t i0 = tile.start, rows = g.q_len - i0 < BM ? g.q_len - i0 : BM, offset = g.kv_len - g.q_len;
    for (int e = tid; e < BM * D; e += ATTN_THREADS) {
        int i = e / D, d = e % D;
        Qs[e] = i < rows ? q[(g.q_row + i0 + i) * a.q_stride + (int64_t)h * D + d] : 0.0f;
        Os[e] = 0.0f;
    }
    for (int i = tid; i < BM; i += ATTN_THREADS) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }
    int64_t last = offset + i0 + rows - 1; /* the last key any row of the tile sees */
    if (last > g.kv_len - 1)
        last = g.kv_len - 1;
    for (int64_t j0 = 0; j0 <= last; j0 += BN) {
        __syncthreads();
        for (int e = tid; e < BN * D; e += ATTN_THREADS) {
            int j = e / D, d = e % D;
            int64_t at = (g.kv_row + j0 + j) * a.kv_stride + (int64_t)kh * D + d;
            bool in = j0 + j < g.kv_len;
            Ks[e] = in ? k[at] : 0.0f;
            Vs[e] = in ? v[at] : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < BM * BN; e += ATTN_THREADS) {
            int i = e / BN, j = e % BN;
            int64_t jj = j0 + j;
            float s = -INFINITY;
            if (i < rows && jj < g.kv_len && jj <= offset + i0 + i) {
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < D; d++)
                    dot += Qs[i * D + d] * Ks[j * D + d];
                s = dot * scale;
            }
            S[e] = s;
        }
        __syncthreads();
        for (int i = tid; i < BM; i += ATTN_THREADS) {
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
        __syncthreads();
        for (int e = tid; e < BM * D; e += ATTN_THREADS) {
            int i = e / D, d = e % D;
            float acc = Os[e] * alpha_s[i];
#pragma unroll 8
            for (int j = 0; j < BN; j++)
                acc += S[i * BN + j] * Vs[j * D + d];
            Os[e] = acc;
        }
    }
    __syncthreads();
    for (int e = tid; e < BM * D; e += ATTN_THREADS) {
        int i = e / D, d = e % D;
        if (i < rows)
            out[(g.q_row + i0 + i) * a.o_stride + (int64_t)h * D + d] = Os[e] / l_s[i];
    }
    for (int i = tid; i < rows; i += ATTN_THREADS)
        lse[(g.q_row + i0 + i) * a.n_heads + h] = m_s[i] + logf(l_s[i]);
}

/* Delta = dout . out per (row, head) of every row the segments touch. */
__global__ void k_attn_delta(float *delta, const float *dout, const float *out, const AttnSegment *segs,
                             const Tile *tiles, AttnShape a, int bm)
{
    const Tile tile = tiles[blockIdx.x];
    const AttnSegment g = segs[tile.seg];
    for (int e = threadIdx.x; e < bm * a.n_heads; e += blockDim.x) {
        int64_t i = tile.start + e / a.n_heads;
        int h = e % a.n_heads;
        if (i >= g.q_len)
            continue;
        int64_t at = (g.q_row + i) * a.o_stride + (int64_t)h * a.head_dim;
        float s = 0.0f;
        for (int d = 0; d < a.head_dim; d++)
            s += dout[at + d] * out[at + d];
        delta[(g.q_row + i) * a.n_heads + h] = s;
    }
}

template <int D, int BM, int BN> static size_t bwd_smem()
{
    return sizeof(float) * ((size_t)(4 * BN + 2 * BM) * D + (size_t)2 * BM * BN + 2 * BM);
}

template <int D, int BM, int BN>
__global__ void __launch_bounds__(ATTN_THREADS)
    k_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *delta,
               const float *q, const float *k, const float *v, const AttnSegment *segs, const Tile *tiles, AttnShape a,
               float scale)
{
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + BN * D, *dKs = Vs + BN * D, *dVs = dKs + BN * D, *Qs = dVs + BN * D, *dOs = Qs + BM * D;
    float *P = dOs + BM * D, *dS = P + BM * BN, *lse_s = dS + BM * BN, *delta_s = lse_s + BM;
    const Tile tile = tiles[blockIdx.x];
    const AttnSegment g = segs[tile.seg];
    const int h = blockIdx.y, kh = h / (a.n_heads / a.n_kv_heads), tid = threadIdx.x;
    const int64_t j0 = tile.start, offset = g.kv_len - g.q_len;
    for (int e = tid; e < BN * D; e += ATTN_THREADS) {
        int j = e / D, d = e % D;
        int64_t at = (g.kv_row + j0 + j) * a.kv_stride + (int64_t)kh * D + d;
        bool in = j0 + j < g.kv_len;
        Ks[e] = in ? k[at] : 0.0f;
        Vs[e] = in ? v[at] : 0.0f;
        dKs[e] = 0.0f;
        dVs[e] = 0.0f;
    }
    /* The first query that sees key j0: offset + i >= j0. */
    int64_t first = j0 - offset > 0 ? j0 - offset : 0;
    for (int64_t i0 = first; i0 < g.q_len; i0 += BM) {
        int64_t rows = g.q_len - i0 < BM ? g.q_len - i0 : BM;
        __syncthreads();
        for (int e = tid; e < BM * D; e += ATTN_THREADS) {
            int i = e / D, d = e % D;
            int64_t at = (g.q_row + i0 + i) * a.q_stride + (int64_t)h * D + d;
            Qs[e] = i < rows ? q[at] : 0.0f;
            dOs[e] = i < rows ? dout[(g.q_row + i0 + i) * a.o_stride + (int64_t)h * D + d] : 0.0f;
        }
        for (int i = tid; i < BM; i += ATTN_THREADS) {
            int64_t r = (g.q_row + i0 + i) * a.n_heads + h;
            lse_s[i] = i < rows ? lse[r] : 0.0f;
            delta_s[i] = i < rows ? delta[r] : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < BM * BN; e += ATTN_THREADS) {
            int i = e / BN, j = e % BN;
            int64_t jj = j0 + j;
            float p = 0.0f, ds = 0.0f;
            if (i < rows && jj < g.kv_len && jj <= offset + i0 + i) {
                float qk = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < D; d++) {
                    qk += Qs[i * D + d] * Ks[j * D + d];
                    dp += dOs[i * D + d] * Vs[j * D + d];
                }
                p = expf(qk * scale - lse_s[i]);
                ds = p * (dp - delta_s[i]) * scale;
            }
            P[e] = p;
            dS[e] = ds;
        }
        __syncthreads();
        for (int e = tid; e < BN * D; e += ATTN_THREADS) {
            int j = e / D, d = e % D;
            float acc_v = 0.0f, acc_k = 0.0f;
            for (int i = 0; i < BM; i++) {
                acc_v += P[i * BN + j] * dOs[i * D + d];
                acc_k += dS[i * BN + j] * Qs[i * D + d];
            }
            dVs[e] += acc_v;
            dKs[e] += acc_k;
        }
        for (int e = tid; e < BM * D; e += ATTN_THREADS) {
            int i = e / D, d = e % D;
            if (i >= rows)
                continue;
            float acc = 0.0f;
#pragma unroll 8
            for (int j = 0; j < BN; j++)
                acc += dS[i * BN + j] * Ks[j * D + d];
            if (acc != 0.0f)
                atomicAdd(&dq[(g.q_row + i0 + i) * a.q_stride + (int64_t)h * D + d], acc);
        }
    }
    __syncthreads();
    for (int e = tid; e < BN * D; e += ATTN_THREADS) {
        int j = e / D, d = e % D;
        if (j0 + j >= g.kv_len)
            continue;
        int64_t at = (g.kv_row + j0 + j) * a.kv_stride + (int64_t)kh * D + d;
        atomicAdd(&dk[at], dKs[e]);
        atomicAdd(&dv[at], dVs[e]);
    }
}

template <int D, int BM, int BN>
static void launch_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const AttnSegment *segs,
                       int64_t n_segs, AttnShape a)
{
    int64_t n_tiles;
    const AttnSegment *dsegs = upload_segments(segs, n_segs);
    const Tile *tiles = upload_tiles(segs, n_segs, BM, 0, &n_tiles);
    if (n_tiles == 0)
        return;
    size_t smem = fwd_smem<D, BM, BN>();
    CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd<D, BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)n_tiles, (unsigned)a.n_heads);
    k_attn_fwd<D, BM, BN><<<grid, ATTN_THREADS, smem>>>(out, lse, q, k, v, dsegs, tiles, a, 1.0f / sqrtf((float)D));
    CUDA_LAUNCHED("attention_fwd");
}

template <int D, int BM, int BN>
static void launch_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                       AttnShape a)
{
    int64_t rows = 0, n_tiles;
    for (int64_t s = 0; s < n_segs; s++) {
        int64_t end = segs[s].q_row + segs[s].q_len;
        rows = end > rows ? end : rows;
    }
    const AttnSegment *dsegs = upload_segments(segs, n_segs);
    /* Delta over the query tiles, then the key tiles (the tile list is rebuilt in between). */
    float *delta = (float *)delta_buf.get((size_t)(rows * a.n_heads + 1) * sizeof(float));
    const Tile *qtiles = upload_tiles(segs, n_segs, BM, 0, &n_tiles);
    if (n_tiles == 0)
        return;
    k_attn_delta<<<(unsigned)n_tiles, ATTN_THREADS>>>(delta, dout, out, dsegs, qtiles, a, BM);
    CUDA_LAUNCHED("attention_bwd delta");
    const Tile *ktiles = upload_tiles(segs, n_segs, BN, 1, &n_tiles);
    size_t smem = bwd_smem<D, BM, BN>();
    CUDA_CHECK(cudaFuncSetAttribute(k_attn_bwd<D, BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)n_tiles, (unsigned)a.n_heads);
    k_attn_bwd<D, BM, BN><<<grid, ATTN_THREADS, smem>>>(dq, dk, dv, dout, lse, delta, q, k, v, dsegs, ktiles, a,
                                                         1.0f / sqrtf((float)D));
    CUDA_LAUNCHED("attention_bwd");
}

int cuda_attention_supports(int head_dim)
{
    switch (head_dim) {
    case 8: case 16: case 32: case 64: case 80: case 96: case 128: case 256:
        return 1;
    default:
        return 0;
    }
}

#define ATTN_DISPATCH(call)                                                                        \
    switch (a.head_dim) {                                                                          \
    case 8: call(8, 32, 32); break;                                                                \
    case 16: call(16, 32, 32); break;                                                              \
    case 32: call(32, 32, 32); break;                                                              \
    case 64: call(64, 32, 32); break;                                                              \
    case 80: call(80, 32, 32); break;                                                              \
    case 96: call(96, 32, 32); break;                                                              \
    case 128: call(128, 32, 32); break;                                                            \
    case 256: call(256, 16, 16); break;                                                            \
    default: {                                                                                     \
        char msg_[160];                                                                            \
        snprintf(msg_, sizeof msg_, "head size %d has no kernel (8, 16, 32, 64, 80, 96, 128, 256)", a.head_dim); \
        cuda_fatal("attention", msg_);                                                             \
    }                                                                                              \
    }

void cuda_attention_fwd_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                            const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
#define FWD(D, BM, BN) launch_fwd<D, BM, BN>(out, lse, q, k, v, segs, n_segs, a)
    ATTN_DISPATCH(FWD)
#undef FWD
}

void cuda_attention_bwd_f32(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                            AttnShape a)
{
#define BWD(D, BM, BN) launch_bwd<D, BM, BN>(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a)
    ATTN_DISPATCH(BWD)
#undef BWD
}

/* ---------------------------------------------------------------------------------------------- */
/* The ops                                                                                         */

void cuda_attention_set_deterministic(int deterministic) { deterministic_bwd = deterministic; }

void cuda_attention_close(void)
{
    seg_buf.release();
    tile_buf.release();
    delta_buf.release();
    widen_buf.release();
}

/* Rows the segments read: of queries (and outputs), of keys and values. */
static void segment_rows(const AttnSegment *segs, int64_t n, int64_t *q_rows, int64_t *kv_rows)
{
    *q_rows = *kv_rows = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t q = segs[i].q_row + segs[i].q_len, kv = segs[i].kv_row + segs[i].kv_len;
        *q_rows = q > *q_rows ? q : *q_rows;
        *kv_rows = kv > *kv_rows ? kv : *kv_rows;
    }
}

static int64_t extent(int64_t rows, int64_t stride, int64_t width) { return rows > 0 ? (rows - 1) * stride + width : 0; }

/* bf16 arrays of the given extents widened into one float32 scratch: views[i] = the i-th. */
static void widen(const bf16 *const *src, const int64_t *n, int count, float **views)
{
    int64_t total = 0;
    for (int i = 0; i < count; i++)
        total += n[i];
    float *w = (float *)widen_buf.get((size_t)(total + 1) * sizeof(float));
    for (int i = 0; i < count; i++) {
        views[i] = w;
        cuda_copy_rows<bf16>(w, DT_F32, n[i], nullptr, src[i], DT_ACT, n[i], nullptr, 1, n[i]);
        w += n[i];
    }
}

template <class T>
void cuda_attention_fwd(Act *out, float *lse, const Act *q, const Act *k, const Act *v, const AttnSegment *segs,
                        int64_t n_segs, AttnShape a)
{
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_attention_fwd_f32((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, segs, n_segs,
                               a);
    } else if (cuda_flash_supports(a.head_dim)) {
        cuda_flash_fwd(out, lse, q, k, v, segs, n_segs, a);
    } else {
        int64_t qr, kvr, H = (int64_t)a.n_heads * a.head_dim, Hkv = (int64_t)a.n_kv_heads * a.head_dim;
        segment_rows(segs, n_segs, &qr, &kvr);
        const bf16 *src[4] = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)out};
        int64_t n[4] = {extent(qr, a.q_stride, H), extent(kvr, a.kv_stride, Hkv), extent(kvr, a.kv_stride, Hkv),
                        extent(qr, a.o_stride, H)};
        float *f[4];
        widen(src, n, 4, f);
        cuda_attention_fwd_f32(f[3], lse, f[0], f[1], f[2], segs, n_segs, a);
        cuda_copy_rows<bf16>(out, DT_ACT, n[3], nullptr, f[3], DT_F32, n[3], nullptr, 1, n[3]);
    }
}

template <class T>
void cuda_attention_bwd(float *dq, float *dk, float *dv, const Act *dout, const Act *out, const float *lse,
                        const Act *q, const Act *k, const Act *v, const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_attention_bwd_f32(dq, dk, dv, (const float *)dout, (const float *)out, lse, (const float *)q,
                               (const float *)k, (const float *)v, segs, n_segs, a);
    } else if (cuda_flash_supports(a.head_dim)) {
        cuda_flash_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a, deterministic_bwd);
    } else {
        int64_t qr, kvr, H = (int64_t)a.n_heads * a.head_dim, Hkv = (int64_t)a.n_kv_heads * a.head_dim;
        segment_rows(segs, n_segs, &qr, &kvr);
        const bf16 *src[5] = {(const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)out,
                              (const bf16 *)dout};
        int64_t n[5] = {extent(qr, a.q_stride, H), extent(kvr, a.kv_stride, Hkv), extent(kvr, a.kv_stride, Hkv),
                        extent(qr, a.o_stride, H), extent(qr, a.o_stride, H)};
        float *f[5];
        widen(src, n, 5, f);
        cuda_attention_bwd_f32(dq, dk, dv, f[4], f[3], lse, f[0], f[1], f[2], segs, n_segs, a);
    }
}

#define INSTANTIATE(T)                                                                             \
    template void cuda_attention_fwd<T>(Act *, float *, const Act *, const Act *, const Act *, const AttnSegment *, \
                                        int64_t, AttnShape);                                      \
    template void cuda_attention_bwd<T>(float *, float *, float *, const Act *, const Act *, const float *,       \
                                        const Act *, const Act *, const Act *, const AttnSegment *, int64_t,      \
                                        AttnShape);
INSTANTIATE(float)
INSTANTIATE(bf16)
