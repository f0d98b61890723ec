/* cpu/cpu_info.c - see cpu_info.h. */
#include "cpu/cpu_info.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

void cpu_describe(char *buf, size_t size)
{
    snprintf(buf, size, "fp32 (bf16 emulated with train.precision: bf16), OpenMP %d thread(s) per rank "
             "(OMP_NUM_THREADS)", omp_get_max_threads());
}

int cpu_share_cores(int ranks_here)
{
    const char *env = getenv("OMP_NUM_THREADS");
    if ((!env || !*env) && ranks_here > 1) {
        int n = omp_get_num_procs() / ranks_here;
        omp_set_num_threads(n > 0 ? n : 1);
    }
    return omp_get_max_threads();
}
