/* cpu/cpu_info.c - see cpu_info.h. */
#include "cpu/cpu_info.h"

#include <omp.h>
#include <stdio.h>

void cpu_describe(char *buf, size_t size)
{
    snprintf(buf, size, "fp32, OpenMP %d thread(s) per rank (OMP_NUM_THREADS)", omp_get_max_threads());
}
