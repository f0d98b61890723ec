/* engine/plan/batch_spread.c - the tokens of a run's steps against the batch (see batch_spread.h). */
#include "engine/plan/batch_spread.h"

#include <stdlib.h>

int batch_under_floor(int64_t tokens, int64_t batch)
{
    /* tokens / batch < 75 / 100, in integers */
    return tokens * 100 < batch * (int64_t)BATCH_FLOOR_PERCENT;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The nearest-rank percentile: the smallest value with at least p% of the n values at or below it. */
static int64_t nearest_rank(const int64_t *sorted, int64_t n, int p)
{
    int64_t rank = (n * p + 99) / 100; /* ceil(p n / 100) */
    return sorted[rank > 0 ? rank - 1 : 0];
}

BatchSpread batch_spread_of(int64_t *tokens, int64_t n, int64_t batch)
{
    BatchSpread s = {batch, n, 0, 0, 0, 0, 0, 0, 0, 0};
    if (n == 0)
        return s;
    qsort(tokens, (size_t)n, sizeof *tokens, cmp_i64);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)tokens[i];
        /* |tokens - batch| > 10% of the batch, in integers */
        int64_t off = tokens[i] > batch ? tokens[i] - batch : batch - tokens[i];
        s.off_near += off * 100 > batch * (int64_t)BATCH_NEAR_PERCENT;
        s.under_floor += batch_under_floor(tokens[i], batch);
    }
    s.mean = sum / (double)n;
    s.p5 = nearest_rank(tokens, n, 5);
    s.p50 = nearest_rank(tokens, n, 50);
    s.p95 = nearest_rank(tokens, n, 95);
    s.min = tokens[0];
    s.max = tokens[n - 1];
    return s;
}
