/*
 * cuda/cuda_flash.cu - the host side of the tensor-core attention (cuda_flash.h): checks the
 * arguments, builds or finds the call's work lists (cuda_flash_plan.cuh), and launches the kernels
 * of cuda_flash_fwd.cu and cuda_flash_bwd.cu on the default stream.
 *
 * Plans. The model calls attention with the same segments in every layer, forward and backward, so
 * the lists of a segment list are built and uploaded once and kept: the last FLASH_PLANS distinct
 * lists, found again by comparing the segments themselves (a memcmp) and the tiles they were cut by
 * (cuda_flash_plan: the float32 reference kernels of cuda_attention.cu and the merges of
 * cuda_attention_merge.cu use the cache with their own tiles; context parallelism's blocks make a
 * few lists per rank of a micro-batch, hence the room). The upload is a
 * cudaMemcpyAsync from the plan's host copy, which stays alive and unchanged while the plan is
 * kept; it is ordered before the kernels that read it and after those that read the buffer before.
 * A new plan costs linear host work in segments and tiles (a 128K window of thousands of documents:
 * tens of microseconds), a kept one a comparison.
 *
 * Registers (nvcc -Xptxas -v, sm_90; sm_80 within a few): forward 255 (D 64, no spill; D 128, 4
 * bytes spilled), dQ 168 / 250, dK dV 255 with 24-56 bytes spilled at D 64 and 160-236 at D 128
 * (8 warps: one block an SM). Re-read the report when the tiles of cuda_flash_plan.cuh change; a
 * spill of more than a few hundred bytes shows in the kernel benchmark.
 */
#include <math.h>
#include <string.h>

#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_flash.h"
#include "cuda/cuda_flash_launch.cuh"

enum { FLASH_PLANS = 256 };

struct FlashPlanEntry {
    std::vector<AttnSegment> key; /* the segments the plan was built from */
    FlashPlanShape tiles{};       /* and the tiles they were cut by */
    bool valid = false;
    FlashPlan plan;
    void *dev = nullptr; /* the segments, then the items */
    size_t dev_bytes = 0;
    uint64_t last_use = 0;
};

/* The backend is used from one host thread (see cuda_ops.h): plain statics. */
static FlashPlanEntry flash_plans[FLASH_PLANS];
static uint64_t flash_clock;
static float *flash_delta;
static size_t flash_delta_bytes;

int cuda_flash_supports(int head_dim) { return head_dim == 64 || head_dim == 128; }

static void flash_check_shape(const char *where, AttnShape a)
{
    char msg[200];
    if (!cuda_flash_supports(a.head_dim)) {
        snprintf(msg, sizeof msg, "head size %d has no kernel (64, 128)", a.head_dim);
        cuda_fatal(where, msg);
    }
    if (a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) {
        snprintf(msg, sizeof msg, "%d query heads are not a multiple of %d kv heads", a.n_heads, a.n_kv_heads);
        cuda_fatal(where, msg);
    }
    if (a.q_stride % 8 || a.kv_stride % 8 || a.o_stride % 8 || a.q_stride < (int64_t)a.n_heads * a.head_dim ||
        a.kv_stride < (int64_t)a.n_kv_heads * a.head_dim || a.o_stride < (int64_t)a.n_heads * a.head_dim) {
        snprintf(msg, sizeof msg, "strides q %lld, kv %lld, out %lld: each a multiple of 8 elements and a whole row",
                 (long long)a.q_stride, (long long)a.kv_stride, (long long)a.o_stride);
        cuda_fatal(where, msg);
    }
}

/* cp.async reads 16 bytes at a time: bf16 arrays 16-byte aligned; float pairs 8-byte aligned. */
static void flash_check_align(const char *where, const char *name, const void *p, uintptr_t align)
{
    if ((uintptr_t)p % align) {
        char msg[120];
        snprintf(msg, sizeof msg, "%s is not %u-byte aligned", name, (unsigned)align);
        cuda_fatal(where, msg);
    }
}

/* The plan of these segments cut by these tiles: kept, or built and uploaded. */
FlashDevPlan cuda_flash_plan(const char *where, const AttnSegment *segs, int64_t n, FlashPlanShape tiles, int n_heads)
{
    FlashPlanEntry *e = nullptr, *oldest = &flash_plans[0];
    for (FlashPlanEntry &c : flash_plans) {
        if (c.valid && memcmp(&c.tiles, &tiles, sizeof tiles) == 0 && (int64_t)c.key.size() == n &&
            (n == 0 || memcmp(c.key.data(), segs, (size_t)n * sizeof *segs) == 0)) {
            e = &c;
            break;
        }
        if (c.last_use < oldest->last_use)
            oldest = &c;
    }
    if (!e) {
        e = oldest;
        char err[200];
        e->valid = false; /* unusable until complete */
        if (flash_plan_build(&e->plan, segs, n, tiles, err, sizeof err) != 0)
            cuda_fatal(where, err);
        e->key.assign(segs, segs + n);
        const size_t seg_bytes = e->plan.segs.size() * sizeof(int4), bytes = seg_bytes + e->plan.items.size() * sizeof(int2);
        if (bytes > e->dev_bytes) {
            const size_t want = bytes > 2 * e->dev_bytes ? bytes : 2 * e->dev_bytes;
            cuda_stream_free(e->dev); /* reused only after the kernels queued before, which read it */
            e->dev = cuda_stream_alloc(want);
            e->dev_bytes = want;
        }
        if (bytes) {
            CUDA_CHECK(cudaMemcpyAsync(e->dev, e->plan.segs.data(), seg_bytes, cudaMemcpyHostToDevice, 0));
            CUDA_CHECK(cudaMemcpyAsync((char *)e->dev + seg_bytes, e->plan.items.data(), bytes - seg_bytes,
                                       cudaMemcpyHostToDevice, 0));
        }
        e->tiles = tiles;
        e->valid = true;
    }
    e->last_use = ++flash_clock;
    if (e->plan.max_items * n_heads > INT32_MAX) /* blocks of one launch (gridDim.x): items x heads */
        cuda_fatal(where, "too many tiles for one launch");
    const int4 *dsegs = (const int4 *)e->dev;
    return FlashDevPlan{&e->plan, dsegs, (const int2 *)(dsegs + e->plan.segs.size())};
}

/* The plan of a call; *full: its segments are all full (the kernels take one kind a launch: a list
 * that mixes them stops with a message). */
static FlashDevPlan flash_plan_get(const char *where, const AttnSegment *segs, int64_t n, AttnShape shape, bool *full)
{
    FlashPlanShape tiles = shape.head_dim == 64 ? flash_plan_shape<FlashTiles<64>>() : flash_plan_shape<FlashTiles<128>>();
    FlashDevPlan e = cuda_flash_plan(where, segs, n, tiles, shape.n_heads);
    *full = e.plan->n_full > 0;
    if (*full && e.plan->n_full != (int64_t)e.plan->segs.size())
        cuda_fatal(where, "the segments of one call are all causal or all full (every query sees every key)");
    return e;
}

void cuda_flash_fwd(void *out, float *lse, const void *q, const void *k, const void *v, const AttnSegment *segs,
                    int64_t n_segs, AttnShape shape)
{
    const char *where = "cuda_flash_fwd";
    flash_check_shape(where, shape);
    flash_check_align(where, "q", q, 16);
    flash_check_align(where, "k", k, 16);
    flash_check_align(where, "v", v, 16);
    flash_check_align(where, "out", out, 16);
    flash_check_align(where, "lse", lse, 4);
    bool full;
    const FlashDevPlan e = flash_plan_get(where, segs, n_segs, shape, &full);
    if (e.plan->fwd_count == 0)
        return;
    const float scale = 1.0f / sqrtf((float)shape.head_dim);
    FlashFwdArgs a = {e.segs,
                      e.items + e.plan->fwd_begin,
                      (const uint16_t *)q,
                      (const uint16_t *)k,
                      (const uint16_t *)v,
                      (uint16_t *)out,
                      lse,
                      shape.n_heads,
                      shape.n_heads / shape.n_kv_heads,
                      shape.q_stride,
                      shape.kv_stride,
                      shape.o_stride,
                      scale * 1.4426950408889634f};
    if (shape.head_dim == 64)
        flash_launch_fwd<64>(a, e.plan->fwd_count, full);
    else
        flash_launch_fwd<128>(a, e.plan->fwd_count, full);
}

template <int D> static void flash_bwd_run(FlashBwdArgs a, const FlashDevPlan &e, int deterministic, bool full)
{
    const FlashPlan &p = *e.plan;
    a.items = e.items + p.dq_begin;
    flash_launch_delta<D>(a, p.dq_count);
    const int64_t waves = (int64_t)p.wave_begin.size() - 1;
    if (deterministic) {
        /* one launch per wave (no two blocks of a launch share a dk, dv row), then dQ */
        a.kv_atomic = 0;
        for (int64_t w = 0; w < waves; w++) {
            a.items = e.items + p.wave_begin[(size_t)w];
            flash_launch_dkdv<D>(a, p.wave_begin[(size_t)w + 1] - p.wave_begin[(size_t)w], false, full);
        }
        a.items = e.items + p.dq_begin;
        flash_launch_dq<D>(a, p.dq_count, full);
    } else {
        /* one launch for every wave, dQ by atomics; dk, dv by atomics when segments share keys */
        a.kv_atomic = waves > 1;
        a.items = e.items + p.wave_begin[0];
        flash_launch_dkdv<D>(a, p.wave_begin[(size_t)waves] - p.wave_begin[0], true, full);
    }
}

void cuda_flash_bwd(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse,
                    const void *q, const void *k, const void *v, const AttnSegment *segs, int64_t n_segs,
                    AttnShape shape, int deterministic)
{
    const char *where = "cuda_flash_bwd";
    flash_check_shape(where, shape);
    const void *bf16[] = {q, k, v, out, dout};
    const char *bf16_names[] = {"q", "k", "v", "out", "dout"};
    for (int i = 0; i < 5; i++)
        flash_check_align(where, bf16_names[i], bf16[i], 16);
    flash_check_align(where, "dq", dq, 8);
    flash_check_align(where, "dk", dk, 8);
    flash_check_align(where, "dv", dv, 8);
    flash_check_align(where, "lse", lse, 4);
    bool full;
    const FlashDevPlan e = flash_plan_get(where, segs, n_segs, shape, &full);
    if (e.plan->dq_count == 0)
        return;
    const size_t delta_bytes = (size_t)e.plan->rows * (size_t)shape.n_heads * sizeof(float);
    if (delta_bytes > flash_delta_bytes) {
        cuda_stream_free(flash_delta);
        flash_delta = (float *)cuda_stream_alloc(delta_bytes);
        flash_delta_bytes = delta_bytes;
    }
    const float scale = 1.0f / sqrtf((float)shape.head_dim);
    FlashBwdArgs a = {e.segs,
                      nullptr,
                      (const uint16_t *)q,
                      (const uint16_t *)k,
                      (const uint16_t *)v,
                      (const uint16_t *)out,
                      (const uint16_t *)dout,
                      lse,
                      flash_delta,
                      dq,
                      dk,
                      dv,
                      shape.n_heads,
                      shape.n_heads / shape.n_kv_heads,
                      shape.q_stride,
                      shape.kv_stride,
                      shape.o_stride,
                      scale,
                      scale * 1.4426950408889634f,
                      0};
    if (shape.head_dim == 64)
        flash_bwd_run<64>(a, e, deterministic, full);
    else
        flash_bwd_run<128>(a, e, deterministic, full);
}

void cuda_flash_release(void)
{
    for (FlashPlanEntry &e : flash_plans) {
        cuda_stream_free(e.dev);
        e = FlashPlanEntry();
    }
    cuda_stream_free(flash_delta);
    flash_delta = nullptr;
    flash_delta_bytes = 0;
}
