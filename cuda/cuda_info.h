/*
 * cuda/cuda_info.h - what the CUDA backend was built with and what it finds at run time.
 * Compiled only when nvcc is found (WLB_CUDA): the CUDA backend's --version line (cuda_ops.cu).
 */
#ifndef WLB_CUDA_CUDA_INFO_H
#define WLB_CUDA_CUDA_INFO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One line: CUDA runtime, cuBLASLt and NCCL versions, cuDNN's attention (built, and the libcudnn
 * found), and the GPUs visible now (or why none). */
void cuda_describe(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
