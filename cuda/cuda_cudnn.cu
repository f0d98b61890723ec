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
 * The batches and the waves are made on the host by cuda_cudnn_batch.h (tested on the CPU). Plans
 * are cached per shape class (cuda_cudnn_graph.cpp): the batch, the longest sequences and the rows
 * reached are rounded up to powers of two. Workspace, gradient scratch and batch arrays come from
 * the stream-ordered pool (CudaScratch): reserved at setup for the largest micro-batch
 * (cuda_cudnn_attention_reserve, sized by engine/ops.h's ops_cudnn_buffers), and grown in a call
 * only where cuDNN asks for more workspace than that estimate.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_cudnn.h"
#include "cuda/cuda_cudnn_batch.h"

#include <string.h>

#include <vector>

#ifdef WLB_CUDNN

/* The batch arrays of a call on the device (lengths, offsets, the segments), cuDNN's workspace, and
 * the backward's packed bf16 gradients. */
static CudaScratch batch_buf, workspace_buf, grad_buf;

/* dq[q_row + r, :] += gq[q_row + r, :] for the query rows of segment blockIdx.y, and dk, dv likewise on
 * its key rows; gq rows hold H values, gk and gv rows Hkv. Segments of one wave share no row. */
__global__ void k_cudnn_add_grads(float *dq, float *dk, float *dv, const bf16 *gq, const bf16 *gk, const bf16 *gv,
                                  const CudnnSeg *segs, int64_t n_segs, int64_t H, int64_t Hkv, int64_t q_stride,
                                  int64_t kv_stride)
{
    for (int64_t s = blockIdx.y; s < n_segs; s += gridDim.y) {
        const CudnnSeg g = segs[s];
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

/* Bytes of a batch of B sequences and n_seg segments on the device, as upload() lays them out: the
 * lengths, then (8-byte aligned) the offsets, then the segments. */
static size_t batch_bytes(size_t B, size_t n_seg)
{
    return ((2 * B * sizeof(int32_t) + 7) & ~(size_t)7) + CUDNN_OFFSETS * (B + 1) * sizeof(int64_t) +
           n_seg * sizeof(CudnnSeg);
}

/* Copies the batch to the device (in stream order) and points the arguments at it. */
static const CudnnSeg *upload(const CudnnBatch &b, CudnnSdpaArgs *a)
{
    const size_t B = (size_t)b.desc.batch, n_off = B + 1, n_seg = b.segs.size();
    std::vector<char> host(batch_bytes(B, n_seg));
    char *h = host.data();
    size_t at = 0;
    memcpy(h + at, b.seq_q.data(), B * sizeof(int32_t)), at += B * sizeof(int32_t);
    memcpy(h + at, b.seq_kv.data(), B * sizeof(int32_t)), at += B * sizeof(int32_t);
    at = (at + 7) & ~(size_t)7;
    const size_t off_at = at;
    for (int k = 0; k < CUDNN_OFFSETS; k++)
        memcpy(h + at, b.off[k].data(), n_off * sizeof(int64_t)), at += n_off * sizeof(int64_t);
    const size_t seg_at = at;
    if (n_seg)
        memcpy(h + at, b.segs.data(), n_seg * sizeof(CudnnSeg)), at += n_seg * sizeof(CudnnSeg);
    char *dev = (char *)batch_buf.get(at);
    /* from pageable memory: the copy is staged before the call returns, so `host` may go */
    CUDA_CHECK(cudaMemcpyAsync(dev, h, at, cudaMemcpyHostToDevice, 0));
    a->seq_q = (const int32_t *)dev;
    a->seq_kv = (const int32_t *)(dev + B * sizeof(int32_t));
    const int64_t *off = (const int64_t *)(dev + off_at);
    a->off_q = off + CUDNN_OFF_Q * n_off, a->off_kv = off + CUDNN_OFF_KV * n_off;
    a->off_o = off + CUDNN_OFF_O * n_off, a->off_stats = off + CUDNN_OFF_STATS * n_off;
    a->off_dq = off + CUDNN_OFF_DQ * n_off, a->off_dkv = off + CUDNN_OFF_DKV * n_off;
    return (const CudnnSeg *)(dev + seg_at);
}

extern "C" int cuda_cudnn_attention_reserve(int n_heads, int n_kv_heads, int head_dim, int64_t rows, int deterministic)
{
    char why[256];
    if (!cuda_cudnn_load(why, sizeof why))
        return 0; /* the choice said so already: nothing of cuDNN's will run */
    int64_t grads, workspace;
    ops_cudnn_buffers(rows, n_heads, n_kv_heads, head_dim, deterministic, &grads, &workspace);
    const size_t R = (size_t)cudnn_pow2_at_least(rows, 64); /* at most R sequences a call */
    return workspace_buf.reserve((size_t)workspace) && grad_buf.reserve((size_t)grads + 64) &&
                   batch_buf.reserve(batch_bytes(R, R))
               ? 0
               : -1;
}

/* The plan of a batch and its workspace, or 0 and why (no plan, or its workspace does not fit in the
 * device's memory: a decline, not an error, so that a deterministic backward can go to the own kernels). */
static int plan_of(const CudnnBatch &b, int64_t *plan, void **workspace, char *why, size_t why_size)
{
    int64_t ws = 0;
    if ((*plan = cuda_cudnn_plan(&b.desc, &ws, why, why_size)) < 0)
        return 0;
    const size_t want = (size_t)(ws > 0 ? ws : 1);
    if (!workspace_buf.reserve(want)) {
        snprintf(why, why_size, "cuDNN's workspace of %.2f GiB does not fit in the GPU's memory", (double)want / (1 << 30));
        return 0;
    }
    *workspace = workspace_buf.p;
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

extern "C" int cuda_cudnn_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
                                        const AttnSegment *segs, int64_t n_segs, AttnShape s, char *why,
                                        size_t why_size)
{
    if (!shape_ok(q, k, v, out, segs, n_segs, s, why, why_size))
        return 0;
    /* every plan first: a shape cuDNN refuses leaves the outputs untouched for the fallback */
    CudnnBatch b[2];
    int64_t plan[2] = {-1, -1};
    for (int full = 0; full < 2; full++) {
        std::vector<int64_t> idx = cudnn_group(segs, n_segs, full);
        if (idx.empty())
            continue;
        cudnn_make_batch(&b[full], segs, idx, s, 0, !full, 0);
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
    std::vector<CudnnBatch> batches;
    for (int full = 0; full < 2; full++)
        for (const std::vector<int64_t> &wave : cudnn_waves(segs, cudnn_group(segs, n_segs, full))) {
            batches.emplace_back();
            cudnn_make_batch(&batches.back(), segs, wave, s, 1, !full, deterministic);
            const CudnnSdpaDesc &d = batches.back().desc;
            if (deterministic && cuda_cudnn_version() < CUDNN_ORDERED_DQ_VERSION &&
                cudnn_deterministic_workspace(d) > OPS_CUDNN_DP_WORKSPACE_MAX) {
                snprintf(why, why_size,
                         "cuDNN %d's deterministic backward would take %.1f GiB of workspace here (%lld sequences "
                         "padded to %lld queries, %lld keys; 9.25 and newer need no such workspace)",
                         cuda_cudnn_version(),
                         (double)cudnn_deterministic_workspace(d) / (1 << 30), (long long)d.batch, (long long)d.max_q,
                         (long long)d.max_kv);
                return 0;
            }
            int64_t plan;
            void *ws;
            if (!plan_of(batches.back(), &plan, &ws, why, why_size))
                return 0;
        }
    for (const CudnnBatch &b : batches) {
        int64_t plan;
        void *ws;
        if (!plan_of(b, &plan, &ws, why, why_size))
            return 0;
        /* packed bf16 gradients of the rows the wave reaches (rows_q, rows_kv bound them) */
        const size_t nq = (size_t)(b.desc.rows_q * H), nkv = (size_t)(b.desc.rows_kv * Hkv);
        bf16 *gq = (bf16 *)grad_buf.get((nq + 2 * nkv) * sizeof(bf16) + 64), *gk = gq + nq, *gv = gk + nkv;
        CudnnSdpaArgs a;
        memset(&a, 0, sizeof a);
        const CudnnSeg *dev_segs = upload(b, &a);
        a.q = q, a.k = k, a.v = v, a.o = (void *)out, a.stats = (float *)lse, a.dout = dout;
        a.dq = gq, a.dk = gk, a.dv = gv;
        char msg[512];
        if (cuda_cudnn_execute(plan, &a, ws, msg, sizeof msg) != 0)
            cuda_fatal("attention_bwd (cudnn)", msg);
        const int64_t n = (int64_t)b.segs.size();
        int64_t longest = 0;
        for (const CudnnSeg &g : b.segs) {
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

extern "C" void cuda_cudnn_describe(char *buf, size_t size)
{
    char why[256];
    int v = cuda_cudnn_library(why, sizeof why);
    if (v) /* cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch */
        snprintf(buf, size, "cuDNN attention with libcudnn %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(buf, size, "cuDNN attention compiled in, but %s", why);
}

extern "C" void cuda_cudnn_attention_close(int report)
{
    int64_t built, refused;
    double seconds;
    cuda_cudnn_plan_stats(&built, &refused, &seconds);
    if (report && built + refused > 0)
        fprintf(stderr,
                "wlbtrain: attention: cuDNN built %lld plans (%lld shapes refused) in %.2f s of this run\n",
                (long long)built, (long long)refused, seconds);
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

extern "C" void cuda_cudnn_attention_close(int) {}

extern "C" int cuda_cudnn_attention_reserve(int, int, int, int64_t, int) { return 0; }

extern "C" void cuda_cudnn_describe(char *buf, size_t size)
{
    snprintf(buf, size, "no cuDNN attention (built without the cudnn-frontend headers)");
}

#endif
