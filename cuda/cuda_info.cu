/* cuda/cuda_info.cu - versions of the CUDA libraries linked in, and the GPUs visible (see cuda_info.h). */
#include "cuda/cuda_info.h"

#include "cuda/cuda_common.cuh"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

void cuda_describe(char *buf, size_t size)
{
    int runtime = 0, driver = 0, nccl = 0, n_gpus = 0;
    size_t lt = cublasLtGetVersion();
    char gpus[512];
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        runtime = 0;
    if (ncclGetVersion(&nccl) != ncclSuccess)
        nccl = 0;
    cudaError_t e = cudaDriverGetVersion(&driver);
    if (e != cudaSuccess || driver == 0) {
        snprintf(gpus, sizeof gpus, "no CUDA driver on this machine");
    } else if ((e = cudaGetDeviceCount(&n_gpus)) != cudaSuccess) {
        snprintf(gpus, sizeof gpus, "no GPU visible (%s)", cudaGetErrorString(e));
    } else {
        cudaDeviceProp p;
        if (n_gpus > 0 && cudaGetDeviceProperties(&p, 0) == cudaSuccess)
            snprintf(gpus, sizeof gpus, "%d GPU(s), first %.200s (sm_%d%d), driver %d.%d", n_gpus, p.name, p.major,
                     p.minor, driver / 1000, (driver % 1000) / 10);
        else
            snprintf(gpus, sizeof gpus, "%d GPU(s)", n_gpus);
    }
    char cudnn[320];
    cuda_cudnn_describe(cudnn, sizeof cudnn);
    snprintf(buf, size, "CUDA runtime %d.%d, cuBLASLt %zu, NCCL %d.%d.%d, %s; %s", runtime / 1000,
             (runtime % 1000) / 10, lt, nccl / 10000, (nccl % 10000) / 100, nccl % 100, cudnn, gpus);
}
