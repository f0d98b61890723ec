/* data/data_sources.c - see data_sources.h. */
#include "data/data_sources.h"

#include <stdlib.h>
#include <string.h>

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
