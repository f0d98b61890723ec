/*
 * engine/train/train_straggler.c - stragglers named (see train.h, trainer_stragglers).
 *
 * Every step each rank's compute seconds - the forward and backward of its micro-batches, the time in
 * exchanges taken off (tr->all_compute, already gathered over the job for the balance figures, so
 * this costs nothing more) - summed per rank. The slowest rank, its excess over the median of the
 * ranks, and the median go into the step's figures (log.metrics: slowest_rank, slowest_compute_s,
 * median_compute_s). A rank that is the slowest STRAGGLER_STEPS steps in a row, each time by more
 * than STRAGGLER_SHARE of the median and STRAGGLER_MIN_S, is named on stderr by rank 0 (again every
 * STRAGGLER_REPEAT steps while it stays so): a slow GPU, a throttled node, a noisy neighbour - the
 * other ranks wait for it in every collective. (Whether the plan predicted it is not compared yet:
 * the planner balances micro-batches, not ranks.)
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/train/train.h"

enum { STRAGGLER_STEPS = 3, STRAGGLER_REPEAT = 20 };
#define STRAGGLER_SHARE 0.25
#define STRAGGLER_MIN_S 0.05

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int trainer_stragglers(Trainer *tr, int64_t step, TrainStats *st)
{
    int world = tr->comm->size[GROUP_WORLD];
    double *t = malloc((size_t)world * sizeof *t), *sorted = malloc((size_t)world * sizeof *sorted);
    if (!t || !sorted) {
        free(t);
        free(sorted);
        return -1;
    }
    int slowest = 0;
    for (int r = 0; r < world; r++) {
        t[r] = 0;
        for (int k = 0; k < tr->m; k++)
            t[r] += tr->all_compute[(size_t)r * (size_t)tr->m + (size_t)k];
        sorted[r] = t[r];
        if (t[r] > t[slowest])
            slowest = r;
    }
    qsort(sorted, (size_t)world, sizeof *sorted, cmp_double);
    double median = world % 2 ? sorted[world / 2] : (sorted[world / 2 - 1] + sorted[world / 2]) / 2;
    st->slowest_rank = slowest;
    st->slowest_compute_s = t[slowest];
    st->median_compute_s = median;
    double excess = t[slowest] - median;
    if (world > 1 && excess > STRAGGLER_SHARE * median && excess > STRAGGLER_MIN_S) {
        tr->straggler_steps = tr->straggler_rank == slowest ? tr->straggler_steps + 1 : 1;
        tr->straggler_rank = slowest;
    } else {
        tr->straggler_steps = 0;
        tr->straggler_rank = -1;
    }
    if (tr->lay.rank == 0 && tr->straggler_steps >= STRAGGLER_STEPS &&
        (tr->straggler_steps - STRAGGLER_STEPS) % STRAGGLER_REPEAT == 0) {
        fflush(stdout);
        fprintf(stderr, "wlbtrain: warning: straggler: rank %d computed %.3f s in step %lld, %.3f s (%.0f%%) over the "
                "median of the %d ranks, the slowest %d steps in a row: the others wait for it in every collective\n",
                slowest, t[slowest], (long long)step, excess, median > 0 ? 100 * excess / median : 0.0, world,
                tr->straggler_steps);
        fflush(stderr);
    }
    free(t);
    free(sorted);
    return 0;
}
