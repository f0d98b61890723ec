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
 * other ranks wait for it in every collective. Beside it, what the plan predicted of that excess
 * (planned_rank_s: the rank's micro-batches' predicted attention and linear seconds per layer, times
 * its stage's layers): a rank slow because the plan gave it more work (its CP shard, its stage's
 * layers, its replica's micro-batches) is the planner's to even; one the plan did not expect to be
 * slow is the machine's (a slow GPU, a throttled node). The step's figures carry slowest_predicted_s,
 * and the warning says which it is.
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

/* World rank r's predicted compute of the step: for each micro-batch of its replica, its CP rank's
 * predicted seconds per layer (plan_rank_compute) times the layers of its stage's chunks. */
static double planned_rank_s(const Trainer *tr, int r)
{
    const Layout *me = &tr->lay;
    Layout l = layout_of(me->tp, me->cp, me->pp, me->dp, r);
    const ConfigIntList *split = &tr->cfg->parallel.chunk_layers;
    int64_t layers = 0;
    for (int c = 0; c < tr->v; c++) {
        int g = c * tr->pp + l.pp_rank;
        layers += g < split->n ? split->v[g] : 0;
    }
    double s = 0;
    for (int64_t i = 0; i < (int64_t)tr->plan.dp * tr->plan.m; i++)
        if (tr->plan.mbs[i].replica == l.dp_rank && tr->plan.mbs[i].tokens > 0)
            s += (double)layers * plan_rank_compute(&tr->plan, &tr->plan.mbs[i], l.cp_rank);
    return s;
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
    /* The plan's own excess for that rank over its median rank. */
    for (int r = 0; r < world; r++)
        sorted[r] = planned_rank_s(tr, r);
    double planned = sorted[slowest];
    qsort(sorted, (size_t)world, sizeof *sorted, cmp_double);
    double planned_median = world % 2 ? sorted[world / 2] : (sorted[world / 2 - 1] + sorted[world / 2]) / 2;
    st->slowest_predicted_s = planned - planned_median;
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
        int expected = st->slowest_predicted_s >= 0.5 * excess;
        fprintf(stderr, "wlbtrain: warning: straggler: rank %d computed %.3f s in step %lld, %.3f s (%.0f%%) over the "
                "median of the %d ranks, the slowest %d steps in a row: the others wait for it in every collective; "
                "the plan predicted %.3f s of that excess (%s)\n",
                slowest, t[slowest], (long long)step, excess, median > 0 ? 100 * excess / median : 0.0, world,
                tr->straggler_steps, st->slowest_predicted_s,
                expected ? "its share of the work: the planner's to even" : "not predicted: the machine is slow");
        fflush(stderr);
    }
    free(t);
    free(sorted);
    return 0;
}
