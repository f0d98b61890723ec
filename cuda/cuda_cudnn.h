/*
 * cuda/cuda_cudnn.h - the C interface of cuDNN's fused attention (cuda_cudnn_graph.cpp, C++ over the
 * cudnn-frontend header library) to the CUDA backend (cuda_cudnn.cu, which maps the engine's segments
 * onto it). Built only where the headers were found (WLB_CUDNN, see the Makefile); libcudnn.so.9 is
 * opened at run time (dlopen), so a build with the path runs where cuDNN is absent.
 *
 * One call is cuDNN's SDPA over a ragged (THD) batch: sequence b has seq_q[b] query rows starting at
 * element off_q[b] of q (rows q_stride elements apart, head h at column h * head_dim) and seq_kv[b]
 * key/value rows at off_kv[b] of k and v (rows kv_stride apart). causal: query i of a sequence sees
 * keys 0 .. seq_kv - seq_q + i (the diagonal at the bottom right, as engine/ops.h aligns segments at
 * their end); else every key. Scale 1 / sqrt(head_dim). The statistics are the natural log-sum-exp of
 * the scaled scores of each query row and head, stats[off_stats[b] + i * n_heads + h]: the engine's
 * lse layout [rows, heads]. Every offset array has batch + 1 entries; pointers are device memory.
 */
#ifndef WLB_CUDA_CUDA_CUDNN_H
#define WLB_CUDA_CUDA_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuDNN's deterministic backward past OPS_CUDNN_DP_WORKSPACE_MAX (engine/ops.h) of score workspace
 * on Hopper: cuDNN 9.25 and newer is asked for its ordered dQ accumulation instead - deterministic
 * too, workspace linear in the rows - through cudnn-frontend's CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT
 * (set to that bound when the library loads, unless the environment sets it); with an older cuDNN
 * such a backward is declined, and the engine's deterministic kernels run it. */
#define CUDNN_ORDERED_DQ_VERSION 92500

/* What one execution plan is built for: a graph per distinct description, built once and kept. The
 * sizes are upper bounds (rounded up to powers of two by the caller, so that few plans are built):
 * batch sequences (unused ones have length 0), at most max_q queries and max_kv keys each, offsets
 * reaching at most rows_q query rows and rows_kv key rows (the backward's accumulation workspace). */
typedef struct CudnnSdpaDesc {
    int backward, causal, deterministic; /* deterministic: cuDNN's deterministic backward */
    int n_heads, n_kv_heads, head_dim;
    int64_t q_stride, kv_stride, o_stride;
    int64_t batch, max_q, max_kv, rows_q, rows_kv;
} CudnnSdpaDesc;

/* The arrays of one execution. Forward: q, k, v in; o (bf16, o_stride) and stats out. Backward: q, k,
 * v, o, dout (o's layout) and stats in; dq [rows, n_heads * head_dim] and dk, dv [rows, n_kv_heads *
 * head_dim] (bf16, packed, at off_dq and off_dkv) out. */
typedef struct CudnnSdpaArgs {
    const void *q, *k, *v;
    void *o;
    float *stats;
    const void *dout;
    void *dq, *dk, *dv;
    const int32_t *seq_q, *seq_kv;
    const int64_t *off_q, *off_kv, *off_o, *off_stats, *off_dq, *off_dkv;
} CudnnSdpaArgs;

/* Opens libcudnn.so.9 and a cuDNN handle on the current device (once; later calls return the first
 * answer): 1, or 0 with the reason in why. */
int cuda_cudnn_load(char *why, size_t why_size);
/* Opens libcudnn.so.9 alone (no handle, no GPU needed): its version (e.g. 91900), or 0 and why (not
 * found, or older than 9.6). For --version. */
int cuda_cudnn_library(char *why, size_t why_size);
/* The loaded cuDNN's version (e.g. 91900), 0 when none is loaded. */
int cuda_cudnn_version(void);
/* The plan for d, built the first time (graph, heuristics, plan) and kept: its index (>= 0) and
 * workspace bytes, or -1 with why (cuDNN does not support the graph on this GPU; kept, and said again
 * without a second try). A forward the implementation cudnn-frontend chooses cannot build is tried
 * again as its composite implementation. */
int64_t cuda_cudnn_plan(const CudnnSdpaDesc *d, int64_t *workspace_bytes, char *why, size_t why_size);
/* Runs plan on the default stream with the workspace (at least its workspace bytes): 0, or -1 with why. */
int cuda_cudnn_execute(int64_t plan, const CudnnSdpaArgs *a, void *workspace, char *why, size_t why_size);
/* Checks d against cudnn-frontend's rules of what cuDNN supports on SM sm_version (90: Hopper)
 * without a GPU: the graph is made and validated (as cuda_cudnn_plan tries it: a forward as the
 * chosen implementation, then the composite one), not built (that needs a device and a handle).
 * Opens libcudnn.so.9 (its version decides some rules). 1, or 0 with why. For the CPU tests. */
int cuda_cudnn_check(const CudnnSdpaDesc *d, int sm_version, char *why, size_t why_size);
/* The plans built so far, the shapes refused (each tried once) and the seconds spent building both
 * (host time: graph, heuristics, compilation). */
void cuda_cudnn_plan_stats(int64_t *built, int64_t *refused, double *seconds);
/* Drops the plans and the handle (the library stays loaded: cuDNN is not made to unload). */
void cuda_cudnn_unload(void);

#ifdef __cplusplus
}
#endif

#endif
