/*
 * cuda/cuda_cudnn.cu - the engine's attention (engine/ops.h) on cuDNN's fused attention: the segments
 * of a call as ragged batches of cuDNN's SDPA (cuda_cudnn.h), and the backward's gradients added
 * into the engine's float32 accumulators. cuda_attention.cu decides when this path runs.
 *
 * Forward. Each segment is one sequence of the batch: its q_len query rows at q_row, its kv_len key
 * rows at kv_row (element offsets into the fused arrays: row * stride), so CP's shards (queries at the
 * end of their keys) need no copy. Causal segments (full 0) are one call with the diagonal at the
 * bottom right; full segments (every query sees every key) a second call without the mask. cuDNN
 * writes out (bf16) and the log-sum-exp straight into lse[row * n_heads + h].
 *
 * Backward. The engine's contract adds into float32 dq, dk, dv, and segments may share keys (CP
 * chunks of one document) or, across calls, rows. cuDNN writes bf16 gradients of each sequence, so
 * the segments are cut into waves whose query ranges and key ranges are disjoint; a wave is one
 * cuDNN call into packed bf16 scratch, then one kernel adds the scratch rows of its segments into dq,
 * dk, dv (one writer per element per wave; the waves in a fixed order). cuDNN's gradients are rounded
 * to bf16 once before they are added (the engine's own kernels add float32).
 *
 * Plans are cached per shape class (cuda_cudnn_graph.cpp): the batch, the longest sequences and the
 * rows reached are rounded up to powers of two. Workspace and scratch grow on demand from the
 * stream-ordered pool (CudaScratch) during the first step and are kept.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_cudnn.h"

#include <string.h>

#include <vector>

#ifdef WLB_CUDNN

/* The batch arrays of one call: lengths (int32), offsets (int64), and the segments of a wave. */
static CudaScratch batch_buf, workspace_buf, grad_buf;

static int64_t pow2_at_least(int64_t n, int64_t lo)
{
    int64_t p = lo;
    while (p < n)
        p *= 2;
    return p;
}

/* A wave's segments on the device, for the accumulation kernel. */
struct DevSeg {
    int64_t q_row, q_len, kv_row, kv_len;
};

/* dq[q_row + r, :] += gq[q_row + r, :] for the query rows of segment blockIdx.y, and dk, dv likewise on
 * its key rows; gq rows hold H values, gk and gv rows Hkv. Segments of one wave share no row. */
__global__ void k_cudnn_add_grads(float *dq, float *dk, float *dv, const bf16 *gq, const bf16 *gk, const bf16 *gv,
                                  const DevSeg *segs, int64_t n_segs, int64_t H, int64_t Hkv, int64_t q_stride,
                                  int64_t kv_stride)
{
    for (int64_t s = blockIdx.y; s < n_segs; s += gridDim.y) {
        const DevSeg g = segs[s];
        const int64_t nq = g.q_len * H, nkv = g.kv_len * Hkv;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nq; i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t row = g.q_row + i / H, c = i % H;
            dq[row * q_stride + c] += __bfloat162float(gq[row * H + c]);
        }
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nkv; i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t row = g.kv_row + i / Hkv, c = i % Hkv;
            dk[row * kv_stride + c] += __bfloat162float(gk[row * Hkv + c]);
            dv[row * kv_stride + c] += __bfloat162float(gv[row * Hkv + c]);
        }
    }
}

/* The host side of one call's batch, laid out as it is copied: seq_q, seq_kv (int32, batch each), then
 * the offsets (int64, batch + 1 each): q, kv, o, stats, dq, dkv; then the wave's segments. */
struct Batch {
    CudnnSdpaDesc desc;
    std::vector<int32_t> seq_q, seq_kv;
    std::vector<int64_t> off[6];
    std::vector<DevSeg> segs;
};

enum { OFF_Q, OFF_KV, OFF_O, OFF_STATS, OFF_DQ, OFF_DKV };

/* The batch of segments segs[idx[i]] (q_len > 0 each). */
static void make_batch(Batch *b, const AttnSegment *segs, const std::vector<int64_t> &idx, AttnShape s, int backward,
                       int causal, int deterministic)
{
    const int64_t n = (int64_t)idx.size(), H = (int64_t)s.n_heads * s.head_dim, Hkv = (int64_t)s.n_kv_heads * s.head_dim;
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
    d.batch = pow2_at_least(n, 1);
    d.max_q = pow2_at_least(max_q, 64);
    d.max_kv = pow2_at_least(max_kv, 64);
    d.rows_q = backward ? pow2_at_least(rows_q, 64) : 0;
    d.rows_kv = backward ? pow2_at_least(rows_kv, 64) : 0;
    b->desc = d;
    b->seq_q.assign((size_t)d.batch, 0);
    b->seq_kv.assign((size_t)d.batch, 0);
    for (auto &o : b->off)
        o.assign((size_t)d.batch + 1, 0);
    b->segs.clear();
    const int64_t q_mul[6] = {s.q_stride, 0, s.o_stride, s.n_heads, H, 0};
    const int64_t kv_mul[6] = {0, s.kv_stride, 0, 0, 0, Hkv};
    for (int64_t j = 0; j <= d.batch; j++) {
        /* sequence j, or past the last one: an empty sequence at the end of the last (offsets that
         * never decrease) */
        const AttnSegment &g = segs[idx[(size_t)(j < n ? j : n - 1)]];
        const int64_t q_row = j < n ? g.q_row : g.q_row + g.q_len, kv_row = j < n ? g.kv_row : g.kv_row + g.kv_len;
        for (int k = 0; k < 6; k++)
            b->off[k][(size_t)j] = q_row * q_mul[k] + kv_row * kv_mul[k];
        if (j < n) {
            b->seq_q[(size_t)j] = (int32_t)g.q_len;
            b->seq_kv[(size_t)j] = (int32_t)g.kv_len;
            b->segs.push_back(DevSeg{g.q_row, g.q_len, g.kv_row, g.kv_len});
        }
    }
}

/* Copies the batch to the device (in stream order) and points the arguments at it. */
static const DevSeg *upload(const Batch &b, CudnnSdpaArgs *a)
{
    const size_t B = (size_t)b.desc.batch, n_off = B + 1, n_seg = b.segs.size();
    const size_t bytes = 2 * B * sizeof(int32_t) + 6 * n_off * sizeof(int64_t) + n_seg * sizeof(DevSeg);
    std::vector<char> host(bytes + 16);
    char *h = host.data();
    size_t at = 0;
    memcpy(h + at, b.seq_q.data(), B * sizeof(int32_t)), at += B * sizeof(int32_t);
    memcpy(h + at, b.seq_kv.data(), B * sizeof(int32_t)), at += B * sizeof(int32_t);
    at = (at + 7) & ~(size_t)7;
    const size_t off_at = at;
    for (int k = 0; k < 6; k++)
        memcpy(h + at, b.off[k].data(), n_off * sizeof(int64_t)), at += n_off * sizeof(int64_t);
    const size_t seg_at = at;
    if (n_seg)
        memcpy(h + at, b.segs.data(), n_seg * sizeof(DevSeg)), at += n_seg * sizeof(DevSeg);
    char *dev = (char *)batch_buf.get(at);
    /* from pageable memory: the copy is staged before the call returns, so `host` may go */
    CUDA_CHECK(cudaMemcpyAsync(dev, h, at, cudaMemcpyHostToDevice, 0));
    a->seq_q = (const int32_t *)dev;
    a->seq_kv = (const int32_t *)(dev + B * sizeof(int32_t));
    const int64_t *off = (const int64_t *)(dev + off_at);
    a->off_q = off + OFF_Q * n_off, a->off_kv = off + OFF_KV * n_off, a->off_o = off + OFF_O * n_off;
    a->off_stats = off + OFF_STATS * n_off, a->off_dq = off + OFF_DQ * n_off, a->off_dkv = off + OFF_DKV * n_off;
    return (const DevSeg *)(dev + seg_at);
}

/* The plan of a batch and its workspace, or 0 and why. */
static int plan_of(const Batch &b, int64_t *plan, void **workspace, char *why, size_t why_size)
{
    int64_t ws = 0;
    if ((*plan = cuda_cudnn_plan(&b.desc, &ws, why, why_size)) < 0)
        return 0;
    *workspace = workspace_buf.get((size_t)(ws > 0 ? ws : 1));
    return 1;
}

/* Whether cuDNN takes a call of this shape at all: 1, or 0 and why. */
static int shape_ok(const void *q, const void *k, const void *v, const void *o, const AttnSegment *segs, int64_t n,
                    AttnShape s, char *why, size_t why_size)
{
    if (s.head_dim != 64 && s.head_dim != 128) {
        snprintf(why, why_size, "head size %d (cuDNN's path is built for 64 and 128)", s.head_dim);
        return 0;
    }
    if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads) {
        snprintf(why, why_size, "%d query heads are not a multiple of %d kv heads", s.n_heads, s.n_kv_heads);
        return 0;
    }
    /* 16-byte rows and arrays: what cuDNN's tensor-memory loads need */
    if (s.q_stride % 8 || s.kv_stride % 8 || s.o_stride % 8 || ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)o) % 16) {
        snprintf(why, why_size, "rows or arrays not 16-byte aligned");
        return 0;
    }
    for (int64_t i = 0; i < n; i++)
        if (segs[i].q_len > 0 && (segs[i].kv_len <= 0 || segs[i].q_len > INT32_MAX || segs[i].kv_len > INT32_MAX ||
                                  (!segs[i].full && segs[i].kv_len < segs[i].q_len))) {
            snprintf(why, why_size, "segment %lld: %lld queries, %lld keys", (long long)i, (long long)segs[i].q_len,
                     (long long)segs[i].kv_len);
            return 0;
        }
    return 1;
}

/* The indices of the segments with queries, causal ones (full 0) or full ones. */
static std::vector<int64_t> group(const AttnSegment *segs, int64_t n, int full)
{
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; i++)
        if (segs[i].q_len > 0 && (segs[i].full != 0) == (full != 0))
            idx.push_back(i);
    return idx;
}

extern "C" int cuda_cudnn_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
                                        const AttnSegment *segs, int64_t n_segs, AttnShape s, char *why,
                                        size_t why_size)
{
    if (!shape_ok(q, k, v, out, segs, n_segs, s, why, why_size))
        return 0;
    /* every plan first: a shape cuDNN refuses leaves the outputs untouched for the fallback */
    Batch b[2];
    int64_t plan[2] = {-1, -1};
    for (int full = 0; full < 2; full++) {
        std::vector<int64_t> idx = group(segs, n_segs, full);
        if (idx.empty())
            continue;
        make_batch(&b[full], segs, idx, s, 0, !full, 0);
        void *ws;
        if (!plan_of(b[full], &plan[full], &ws, why, why_size))
            return 0;
    }
    for (int full = 0; full < 2; full++) {
        if (plan[full] < 0)
            continue;
        void *ws = nullptr;
        if (!plan_of(b[full], &plan[full], &ws, why, why_size)) /* found in the cache this time */
            return 0;
        CudnnSdpaArgs a;
        memset(&a, 0, sizeof a);
        upload(b[full], &a);
        a.q = q, a.k = k, a.v = v, a.o = out, a.stats = lse;
        char msg[512];
        if (cuda_cudnn_execute(plan[full], &a, ws, msg, sizeof msg) != 0)
            cuda_fatal("attention_fwd (cudnn)", msg);
    }
    return 1;
}

/* Waves of segments whose query ranges and key ranges are pairwise disjoint, each in the order given. */
static std::vector<std::vector<int64_t>> waves_of(const AttnSegment *segs, const std::vector<int64_t> &idx)
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

/* Bytes of the score-sized workspace cuDNN's deterministic backward takes on Hopper (dP in bf16 for
 * every sequence padded to the batch's longest, tiles of 64 queries and 128 keys), and the most this
 * path lets it take before it leaves a deterministic backward to the engine's kernel. */
static int64_t deterministic_workspace(const CudnnSdpaDesc &d)
{
    return d.batch * d.n_heads * ((d.max_q + 63) / 64 * 64) * ((d.max_kv + 127) / 128 * 128) * 2;
}
static const int64_t DETERMINISTIC_WORKSPACE_MAX = INT64_C(1) << 31;

extern "C" int cuda_cudnn_attention_bwd(float *dq, float *dk, float *dv, const void *dout, const void *out,
                                        const float *lse, const void *q, const void *k, const void *v,
                                        const AttnSegment *segs, int64_t n_segs, AttnShape s, int deterministic,
                                        char *why, size_t why_size)
{
    if (!shape_ok(q, k, v, out, segs, n_segs, s, why, why_size) || ((uintptr_t)dout % 16)) {
        if ((uintptr_t)dout % 16)
            snprintf(why, why_size, "dout not 16-byte aligned");
        return 0;
    }
    const int64_t H = (int64_t)s.n_heads * s.head_dim, Hkv = (int64_t)s.n_kv_heads * s.head_dim;
    /* every wave's plan first, so that a refusal leaves dq, dk, dv untouched for the fallback */
    std::vector<Batch> batches;
    for (int full = 0; full < 2; full++)
        for (const std::vector<int64_t> &wave : waves_of(segs, group(segs, n_segs, full))) {
            batches.emplace_back();
            make_batch(&batches.back(), segs, wave, s, 1, !full, deterministic);
            const CudnnSdpaDesc &d = batches.back().desc;
            if (deterministic && deterministic_workspace(d) > DETERMINISTIC_WORKSPACE_MAX) {
                snprintf(why, why_size,
                         "cuDNN's deterministic backward would take %.1f GiB of workspace here (%lld sequences "
                         "padded to %lld queries, %lld keys)",
                         (double)deterministic_workspace(d) / (1 << 30), (long long)d.batch, (long long)d.max_q,
                         (long long)d.max_kv);
                return 0;
            }
            int64_t plan;
            void *ws;
            if (!plan_of(batches.back(), &plan, &ws, why, why_size))
                return 0;
        }
    for (const Batch &b : batches) {
        int64_t plan;
        void *ws;
        if (!plan_of(b, &plan, &ws, why, why_size))
            return 0;
        /* packed bf16 gradients of the rows the wave reaches (rows_q, rows_kv bound them) */
        const size_t nq = (size_t)(b.desc.rows_q * H), nkv = (size_t)(b.desc.rows_kv * Hkv);
        bf16 *gq = (bf16 *)grad_buf.get((nq + 2 * nkv) * sizeof(bf16) + 64), *gk = gq + nq, *gv = gk + nkv;
        CudnnSdpaArgs a;
        memset(&a, 0, sizeof a);
        const DevSeg *dev_segs = upload(b, &a);
        a.q = q, a.k = k, a.v = v, a.o = (void *)out, a.stats = (float *)lse, a.dout = dout;
        a.dq = gq, a.dk = gk, a.dv = gv;
        char msg[512];
        if (cuda_cudnn_execute(plan, &a, ws, msg, sizeof msg) != 0)
            cuda_fatal("attention_bwd (cudnn)", msg);
        const int64_t n = (int64_t)b.segs.size();
        int64_t longest = 0;
        for (const DevSeg &g : b.segs) {
            const int64_t e = g.q_len * H > g.kv_len * Hkv ? g.q_len * H : g.kv_len * Hkv;
            longest = e > longest ? e : longest;
        }
        unsigned bx = cuda_blocks(longest) < 1024 ? cuda_blocks(longest) : 1024;
        dim3 grid(bx, (unsigned)(n < 65535 ? n : 65535));
        k_cudnn_add_grads<<<grid, CUDA_THREADS>>>(dq, dk, dv, gq, gk, gv, dev_segs, n, H, Hkv, s.q_stride,
                                                  s.kv_stride);
        CUDA_LAUNCHED("attention_bwd (cudnn) add");
    }
    return 1;
}

extern "C" int cuda_cudnn_attention_available(char *why, size_t why_size)
{
    return cuda_cudnn_load(why, why_size);
}

extern "C" void cuda_cudnn_attention_close(void)
{
    cuda_cudnn_unload();
    batch_buf.release();
    workspace_buf.release();
    grad_buf.release();
}

#else /* built without the cudnn-frontend headers */

extern "C" int cuda_cudnn_attention_available(char *why, size_t why_size)
{
    snprintf(why, why_size, "this build has no cuDNN attention (the cudnn-frontend headers were not found when it "
                            "was built: scripts/install-deps.sh fetches them)");
    return 0;
}

extern "C" int cuda_cudnn_attention_fwd(void *, float *, const void *, const void *, const void *, const AttnSegment *,
                                        int64_t, AttnShape, char *why, size_t why_size)
{
    snprintf(why, why_size, "no cuDNN attention in this build");
    return 0;
}

extern "C" int cuda_cudnn_attention_bwd(float *, float *, float *, const void *, const void *, const float *,
                                        const void *, const void *, const void *, const AttnSegment *, int64_t,
                                        AttnShape, int, char *why, size_t why_size)
{
    snprintf(why, why_size, "no cuDNN attention in this build");
    return 0;
}

extern "C" void cuda_cudnn_attention_close(void) {}

#endif
