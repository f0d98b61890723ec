/*
 * data/data_sources.h - opening the data of a run: the Megatron sets of data.path (with their
 * blending weights) or the length list of data.lengths_file, as DataSources for the stream.
 */
#ifndef WLB_DATA_DATA_SOURCES_H
#define WLB_DATA_DATA_SOURCES_H

#include "data/data_idx.h"
#include "data/data_lengths.h"
#include "data/data_stream.h"

typedef struct DataSources {
    int n;
    DataIdx *idx;          /* n sets, or NULL for a length list */
    DataLengths lengths;   /* the length list (n = 1) */
    DataSource *src;       /* n */
    const double *weights; /* NULL = equal */
} DataSources;

/* Opens paths[0..n_paths) (weights: n_paths or NULL), or lengths_file when n_paths is 0. */
int data_sources_open(DataSources *s, char *const *paths, const double *weights, int n_paths,
                      const char *lengths_file, const char *lengths_column, Error *err);
void data_sources_close(DataSources *s);
/* An Error (status 2) when n Megatron sets need more memory mappings than this process may still add
 * (vm.max_map_count, 2 a set; see data_sources.c), saying the limit and what to do; 0 when they fit
 * or the limit cannot be read. data_sources_open checks its paths; training checks data.path and
 * data.valid_path together (they are open at once). */
int data_sources_check_count(int n, Error *err);

#endif
