/*
 * cuda/cuda_attention.cu - document-causal attention over segments on the GPU (see engine/ops.h).
 *
 * The ops: with the compute dtype bf16, the tensor-core kernels of cuda_flash_*.cu (cuda_flash.h)
 * for the head sizes they are built for; otherwise (fp32, or another head size) the float32
 * reference kernels, which the tensor-core ones are tested against (bf16 operands widened to
 * float32 scratch first). The reference kernels' blocks are in cuda_attention_ref.cuh (the math and
 * the two backward modes are described there); this file launches them over the work lists of
 * cuda_flash_plan.cuh (kept per segment list by cuda_flash.cu).
 *
 * Backward, train.deterministic true: Delta, then one dK/dV launch per wave of segments that share
 * no key (each dk, dv float has one writer per launch), then dQ by query tiles: no floating-point
 * atomics, the same bits every run. false: Delta, then one dK/dV launch over every wave that adds
 * dQ (and dk, dv where segments share keys) with atomics.
 *
 * The bf16 attention at the tensor-core kernels' head sizes goes through cuda_attention_select.cu,
 * which runs them or cuDNN's fused attention as train.attention says.
 */
#include <math.h>

#include "cuda/cuda_attention_ref.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash.h"
#include "cuda/cuda_flash_launch.cuh"

/* bf16 operands widened to float32 (head sizes without tensor-core kernels). */
static CudaScratch delta_buf, widen_buf;
static int deterministic_bwd = 1;

template <class C> __global__ void __launch_bounds__(C::THREADS) k_attn_fwd(RefAttnArgs a)
{
    extern __shared__ float sm[];
    ref_fwd_cta<C>(a, sm, blockIdx.x, (int)threadIdx.x);
}

template <class C> __global__ void __launch_bounds__(C::THREADS) k_attn_delta(RefAttnArgs a)
{
    ref_delta_cta<C::D, C::BM, C::THREADS>(a, blockIdx.x, (int)threadIdx.x);
}

template <class C, bool ATOMIC_DQ> __global__ void __launch_bounds__(C::THREADS) k_attn_dkdv(RefAttnArgs a)
{
    extern __shared__ float sm[];
    ref_dkdv_cta<C, ATOMIC_DQ>(a, sm, blockIdx.x, (int)threadIdx.x);
}

template <class C> __global__ void __launch_bounds__(C::THREADS) k_attn_dq(RefAttnArgs a)
{
    extern __shared__ float sm[];
    ref_dq_cta<C>(a, sm, blockIdx.x, (int)threadIdx.x);
}

/* The arguments every launch shares, and the work lists of the segments. */
static FlashDevPlan ref_plan(const char *where, RefAttnArgs *a, const AttnSegment *segs, int64_t n_segs,
                             AttnShape s, FlashPlanShape tiles)
{
    char msg[160];
    if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) {
        snprintf(msg, sizeof msg, "%d query heads are not a multiple of %d kv heads", s.n_heads, s.n_kv_heads);
        cuda_fatal(where, msg);
    }
    if (s.q_stride < (int64_t)s.n_heads * s.head_dim || s.kv_stride < (int64_t)s.n_kv_heads * s.head_dim ||
        s.o_stride < (int64_t)s.n_heads * s.head_dim) {
        snprintf(msg, sizeof msg, "strides q %lld, kv %lld, out %lld shorter than a row of heads", (long long)s.q_stride,
                 (long long)s.kv_stride, (long long)s.o_stride);
        cuda_fatal(where, msg);
    }
    FlashDevPlan p = cuda_flash_plan(where, segs, n_segs, tiles, s.n_heads);
    a->segs = p.segs;
    a->n_heads = s.n_heads;
    a->group = s.n_heads / s.n_kv_heads;
    a->q_stride = s.q_stride;
    a->kv_stride = s.kv_stride;
    a->o_stride = s.o_stride;
    a->scale = 1.0f / sqrtf((float)s.head_dim);
    return p;
}

template <class C>
static void launch_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const AttnSegment *segs,
                       int64_t n_segs, AttnShape s)
{
    const char *where = "attention_fwd";
    RefAttnArgs a = {};
    const FlashDevPlan p = ref_plan(where, &a, segs, n_segs, s, ref_attn_plan_shape<C>());
    if (p.plan->fwd_count == 0)
        return;
    a.items = p.items + p.plan->fwd_begin;
    a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
    static bool smem_set = false;
    flash_allow_smem(k_attn_fwd<C>, C::FWD_SMEM, &smem_set, where);
    k_attn_fwd<C><<<(unsigned)(p.plan->fwd_count * s.n_heads), C::THREADS, C::FWD_SMEM>>>(a);
    CUDA_LAUNCHED(where);
}

template <class C>
static void launch_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                       AttnShape s)
{
    const char *where = "attention_bwd";
    RefAttnArgs a = {};
    const FlashDevPlan p = ref_plan(where, &a, segs, n_segs, s, ref_attn_plan_shape<C>());
    const FlashPlan &plan = *p.plan;
    if (plan.dq_count == 0)
        return;
    a.q = q, a.k = k, a.v = v, a.out = (float *)out, a.lse = (float *)lse, a.dout = dout;
    a.dq = dq, a.dk = dk, a.dv = dv;
    a.delta = (float *)delta_buf.get((size_t)(plan.rows * s.n_heads) * sizeof(float));
    a.items = p.items + plan.dq_begin;
    k_attn_delta<C><<<(unsigned)plan.dq_count, C::THREADS>>>(a);
    CUDA_LAUNCHED("attention_bwd delta");
    const int64_t waves = (int64_t)plan.wave_begin.size() - 1, n_kv = s.n_kv_heads;
    if (deterministic_bwd) {
        static bool dkdv_set = false, dq_set = false;
        flash_allow_smem(k_attn_dkdv<C, false>, C::DKDV_SMEM, &dkdv_set, where);
        flash_allow_smem(k_attn_dq<C>, C::DQ_SMEM, &dq_set, where);
        a.kv_atomic = 0;
        for (int64_t w = 0; w < waves; w++) {
            a.items = p.items + plan.wave_begin[(size_t)w];
            const int64_t n = plan.wave_begin[(size_t)w + 1] - plan.wave_begin[(size_t)w];
            k_attn_dkdv<C, false><<<(unsigned)(n * n_kv), C::THREADS, C::DKDV_SMEM>>>(a);
            CUDA_LAUNCHED("attention_bwd dk, dv");
        }
        a.items = p.items + plan.dq_begin;
        k_attn_dq<C><<<(unsigned)(plan.dq_count * s.n_heads), C::THREADS, C::DQ_SMEM>>>(a);
        CUDA_LAUNCHED("attention_bwd dq");
    } else {
        static bool dkdv_set = false;
        flash_allow_smem(k_attn_dkdv<C, true>, C::DKDV_SMEM, &dkdv_set, where);
        a.kv_atomic = waves > 1;
        a.items = p.items + plan.wave_begin[0];
        const int64_t n = plan.wave_begin[(size_t)waves] - plan.wave_begin[0];
        k_attn_dkdv<C, true><<<(unsigned)(n * n_kv), C::THREADS, C::DKDV_SMEM>>>(a);
        CUDA_LAUNCHED("attention_bwd dk, dv, dq");
    }
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
    case 8: call(8); break;                                                                        \
    case 16: call(16); break;                                                                      \
    case 32: call(32); break;                                                                      \
    case 64: call(64); break;                                                                      \
    case 80: call(80); break;                                                                      \
    case 96: call(96); break;                                                                      \
    case 128: call(128); break;                                                                    \
    case 256: call(256); break;                                                                    \
    default: {                                                                                     \
        char msg_[160];                                                                            \
        snprintf(msg_, sizeof msg_, "head size %d has no kernel (8, 16, 32, 64, 80, 96, 128, 256)", a.head_dim); \
        cuda_fatal("attention", msg_);                                                             \
    }                                                                                              \
    }

void cuda_attention_fwd_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                            const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
#define FWD(D) launch_fwd<RefAttnTiles<D>::Cfg>(out, lse, q, k, v, segs, n_segs, a)
    ATTN_DISPATCH(FWD)
#undef FWD
}

void cuda_attention_bwd_f32(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                            AttnShape a)
{
#define BWD(D) launch_bwd<RefAttnTiles<D>::Cfg>(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a)
    ATTN_DISPATCH(BWD)
#undef BWD
}

/* ---------------------------------------------------------------------------------------------- */
/* The ops                                                                                         */

void cuda_attention_set_deterministic(int deterministic) { deterministic_bwd = deterministic; }

void cuda_attention_close(void)
{
    delta_buf.release();
    widen_buf.release();
    cuda_attention_select_close();
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
        cuda_attention_bf16_fwd(out, lse, q, k, v, segs, n_segs, a);
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
        cuda_attention_bf16_bwd(dq, dk, dv, dout, out, lse, q, k, v, segs, n_segs, a);
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
