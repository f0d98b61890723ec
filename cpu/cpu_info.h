/* cpu/cpu_info.h - what the CPU reference backend has to work with. */
#ifndef WLB_CPU_CPU_INFO_H
#define WLB_CPU_CPU_INFO_H

#include <stddef.h>

/* One line: precision and the OpenMP threads one rank uses. */
void cpu_describe(char *buf, size_t size);

#endif
