/*
 * cuda/cuda_common.cuh - what the CUDA backend's files share: error checks, launch shapes, the
 * backend's scratch memory, and the kernels' entry points across files.
 */
#ifndef WLB_CUDA_CUDA_COMMON_CUH
#define WLB_CUDA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/ops.h"
#include "util/error.h"

/* A failed CUDA call ends the process through the one fatal path (util/error.h): the ops have no
 * error path (see cuda_ops.h). */
#define cuda_fatal(where, what) wlb_fatal_at(__FILE__, __LINE__, "cuda: %s: %s", (where), (what))

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            cuda_fatal(#call, cudaGetErrorString(e_));                                             \
    } while (0)

/* After a kernel launch: the launch error, if any. */
#define CUDA_LAUNCHED(name)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            cuda_fatal(name, cudaGetErrorString(e_));                                              \
    } while (0)

enum { CUDA_THREADS = 256 };

/* Blocks for a grid-stride loop over n elements (at most 65535 x 1024: the loop covers the rest). */
static inline unsigned cuda_blocks(int64_t n)
{
    int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 64 ? 65535 * 64 : b);
}

/* A device buffer that grows on demand (contents not kept). */
struct CudaScratch {
    void *p = nullptr;
    size_t bytes = 0;
    void *get(size_t want)
    {
        if (want > bytes) {
            if (p)
                CUDA_CHECK(cudaFree(p));
            size_t n = want > 2 * bytes ? want : 2 * bytes;
            CUDA_CHECK(cudaMalloc(&p, n));
            bytes = n;
        }
        return p;
    }
};

/* cuda_matmul.cu: init (again) with bf16 or fp32 products */
void cuda_matmul_init(int bf16);
void cuda_matmul_fwd(float *out, const float *x, const float *w, int64_t T, int64_t n_in, int64_t n_out);
void cuda_matmul_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, int64_t T,
                     int64_t n_in, int64_t n_out, int accumulate_dx);

/* cuda_attention.cu */
void cuda_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                        const AttnSegment *segs, int64_t n_segs, AttnShape shape);
void cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                        AttnShape shape);
/* Whether the attention kernels are built for this head size. */
int cuda_attention_supports(int head_dim);

#endif
