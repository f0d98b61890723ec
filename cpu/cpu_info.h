/* cpu/cpu_info.h - what the CPU reference backend has to work with. */
#ifndef WLB_CPU_CPU_INFO_H
#define WLB_CPU_CPU_INFO_H

#include <stddef.h>

/* One line: precision and the OpenMP threads one rank uses. */
void cpu_describe(char *buf, size_t size);
/* Shares this machine's cores among the ranks_here ranks running on it: unless OMP_NUM_THREADS is
 * set, each uses cores / ranks_here OpenMP threads (at least one) - oversubscribed threads spin
 * against each other and against MPI's polling. Returns the threads this rank uses. */
int cpu_share_cores(int ranks_here);

#endif
