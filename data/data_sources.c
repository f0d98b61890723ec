/*
 * data/data_sources.c - see data_sources.h.
 *
 * Each Megatron set is two memory mappings (its .idx and its .bin; the descriptors are closed once
 * mapped, so no descriptor stays open per set). Linux limits the mappings of a process
 * (vm.max_map_count, 65530 by default): 100,000 sets need 200,000 and the 32,766th mmap would fail
 * with ENOMEM, an "out of memory" that is none. So before opening many sets (DATA_MAP_CHECK_FROM or
 * more) the mappings they need are compared with what the process may still add, less
 * DATA_MAP_RESERVE for the rest of the run (malloc's large blocks, threads, MPI, a GPU's driver),
 * and too many sets are refused up front with the limit and what to do.
 */
#include "data/data_sources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DATA_MAP_CHECK_FROM = 256, DATA_MAP_RESERVE = 4096 };

/* A number from the first line of a /proc file, or -1. */
static long long proc_number(const char *path)
{
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* The mappings this process holds now (the lines of /proc/self/maps), or -1. */
static long long maps_in_use(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    long long lines = 0;
    for (int c; (c = getc(f)) != EOF;)
        lines += c == '\n';
    fclose(f);
    return lines;
}

int data_sources_check_count(int n, Error *err)
{
    if (n < DATA_MAP_CHECK_FROM)
        return 0;
    long long limit = proc_number("/proc/sys/vm/max_map_count"), used = maps_in_use();
    if (limit < 0 || used < 0)
        return 0;
    long long need = 2 * (long long)n, room = limit - used - DATA_MAP_RESERVE;
    if (need <= room)
        return 0;
    return error_set(err, "data",
                     "%d data sets need %lld memory mappings (an .idx and a .bin each), more than this process "
                     "may add: Linux allows %lld (vm.max_map_count), %lld are in use and %d are kept for the run, "
                     "so at most %lld sets; merge the sets into fewer (Megatron-LM's tools/merge_datasets.py, or "
                     "wlbtrain convert of their text into one) or raise the limit (sysctl -w vm.max_map_count=%lld)",
                     n, need, limit, used, DATA_MAP_RESERVE, room > 0 ? room / 2 : 0,
                     used + DATA_MAP_RESERVE + need + 1024);
}

int data_sources_open(DataSources *s, char *const *paths, const double *weights, int n_paths,
                      const char *lengths_file, const char *lengths_column, Error *err)
{
    memset(s, 0, sizeof *s);
    if (n_paths == 0 && !lengths_file)
        return error_set(err, "data.path", "no data: set data.path (a Megatron PREFIX) or data.lengths_file");
    s->n = n_paths ? n_paths : 1;
    s->src = calloc((size_t)s->n, sizeof *s->src);
    if (!s->src)
        return error_runtime(err, "data", "out of memory");
    if (n_paths == 0) {
        if (data_lengths_load(&s->lengths, lengths_file, lengths_column, err) != 0) {
            data_sources_close(s);
            return -1;
        }
        s->src[0] = data_source_from_lengths(s->lengths.len, s->lengths.n, s->lengths.n_tokens);
        return 0;
    }
    if (data_sources_check_count(n_paths, err) != 0) {
        data_sources_close(s);
        return -1;
    }
    s->idx = calloc((size_t)n_paths, sizeof *s->idx);
    if (!s->idx) {
        data_sources_close(s);
        return error_runtime(err, "data", "out of memory");
    }
    for (int i = 0; i < n_paths; i++) {
        if (data_idx_open(&s->idx[i], paths[i], err) != 0) {
            data_sources_close(s);
            return -1;
        }
        if (s->idx[i].n_tokens == 0) {
            error_set(err, paths[i], "the data set has no tokens");
            data_sources_close(s);
            return -1;
        }
        s->src[i] = data_source_from_idx(&s->idx[i]);
    }
    s->weights = weights;
    return 0;
}

void data_sources_close(DataSources *s)
{
    for (int i = 0; s->idx && i < s->n; i++)
        data_idx_close(&s->idx[i]);
    free(s->idx);
    free(s->src);
    data_lengths_free(&s->lengths);
    memset(s, 0, sizeof *s);
}
