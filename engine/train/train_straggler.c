/*
 * engine/train/train_straggler.c - stragglers named (see train.h, trainer_stragglers).
 *
 * What a slow rank delays is the others' waits, wherever in the step it is slow: in its passes, in
 * planning or building its batches, in the optimizer, in the reductions' copies, or stopped by the
 * machine (a throttled node, a noisy neighbour, the process stopped and continued). So each rank's
 * figure is its busy time: the wall time since the last step's figures were gathered, less the
 * seconds it spent inside the comm layer's calls that wait for other ranks (comm_blocked_s: the
 * blocking collectives and messages, comm_wait, the waits of a start). A rank the others wait for
 * is busy while they wait, so its busy time is the longest; the ranks that waited have it in their
 * blocked seconds. One all-gather of a double a step (after the balance figures) shares them. The
 * window runs from gather to gather, so a step's figure holds the previous step's optimizer update,
 * its vote and (rank 0) its metrics line; an evaluation or a checkpoint save falls in the next
 * step's window too (a single step: the warning needs STRAGGLER_STEPS in a row).
 * Waiting is not always the others' fault: a rank that stops running inside a collective - the
 * process stopped and continued, frozen - holds every rank in it up (MPI's collectives need each
 * rank to progress them) while its own clock counts the time as a wait. A stall clock sees that
 * time: a thread that sleeps STALL_TICK_S at a time and finds, when it wakes more than STALL_MIN_S
 * late beyond what it waited for a CPU, that the process was stopped in between; such a gap while
 * the rank was inside a wait (comm_any_blocked_s, read before and after the gap) is added back to
 * its busy time (one while it computed is in it already; util/stall.h).
 * That is the host clock's view, right where the host clock times the compute (the CPU backend).
 * With a device timer (CUDA: events) the host runs ahead of the device and waits for it in
 * synchronisations the comm layer does not see, so there the figure stays each rank's compute
 * seconds - the forward and backward of its micro-batches, the device time its waits for
 * communication held the stream taken off (tr->all_compute, already gathered for the balance
 * figures) - and no extra gather is made.
 * The slowest rank, its figure and the median go into the step's figures (log.metrics:
 * slowest_rank, slowest_busy_s and median_busy_s where busy time is measured; slowest_compute_s and
 * median_compute_s, that rank's and the median compute, always). A rank that is the slowest
 * STRAGGLER_STEPS steps in a row, each time by more than STRAGGLER_SHARE of the median and
 * STRAGGLER_MIN_S, is named on stderr by rank 0 (again every STRAGGLER_REPEAT steps while it stays
 * so). Beside it, what the plan predicted of that excess (planned_rank_s: the rank's micro-batches'
 * predicted attention and linear seconds per layer, times its stage's layers): a rank slow because
 * the plan gave it more work (its CP shard, its stage's layers, its replica's micro-batches) is the
 * planner's to even; one the plan did not expect to be slow is the machine's (a slow GPU, a
 * throttled node). The step's figures carry slowest_predicted_s, and the warning says which it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/train.h"
#include "util/clock.h"
#include "util/stall.h"

enum { STRAGGLER_STEPS = 3, STRAGGLER_REPEAT = 20 };
#define STRAGGLER_SHARE 0.25
#define STRAGGLER_MIN_S 0.05

static double stalled_s(const Trainer *tr) { return stall_clock_seconds(tr->stall_clock); }

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

/* The start of the next busy-time window: now. */
static void mark(Trainer *tr)
{
    tr->straggler_mark_s = clock_seconds();
    tr->straggler_mark_blocked_s = comm_blocked_s();
    tr->straggler_mark_stalled_s = stalled_s(tr);
}

void trainer_straggler_start(Trainer *tr)
{
    /* The stall clock where busy time is measured (no device timer) and there are others to wait;
     * counting the gaps that fall inside a comm wait. Without it (no thread) the busy time is all. */
    if (!tr->stall_clock && !tr->ops->timer_mark && tr->comm->size[GROUP_WORLD] > 1)
        tr->stall_clock = stall_clock_start(comm_any_blocked_s);
    mark(tr);
}

void trainer_straggler_stop(Trainer *tr)
{
    stall_clock_stop(tr->stall_clock);
    tr->stall_clock = NULL;
}

static double median_of(double *sorted, int n)
{
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

/* Rank 0's warning: the rank, its figure (busy or computed) and its excess, and whether the plan
 * expected it. */
static void warn(const Trainer *tr, int64_t step, const TrainStats *st, int busy, double figure, double median,
                 int world)
{
    double excess = figure - median;
    int expected = st->slowest_predicted_s >= 0.5 * excess;
    char what[160] = "";
    if (busy)
        snprintf(what, sizeof what, " (busy: the step's time less its waits for other ranks; it computed %.3f s, "
                 "the median rank %.3f s)", st->slowest_compute_s, st->median_compute_s);
    fflush(stdout);
    fprintf(stderr, "wlbtrain: warning: straggler: rank %d %s %.3f s in step %lld, %.3f s (%.0f%%) over the median "
            "of the %d ranks%s, the slowest %d steps in a row: the others wait for it in every collective; the plan "
            "predicted %.3f s of that excess (%s)\n",
            st->slowest_rank, busy ? "was busy" : "computed", figure, (long long)step, excess,
            median > 0 ? 100 * excess / median : 0.0, world, what, tr->straggler_steps, st->slowest_predicted_s,
            expected ? "its share of the work: the planner's to even" : "not predicted: the machine is slow");
    fflush(stderr);
}

int trainer_stragglers(Trainer *tr, int64_t step, TrainStats *st, Error *err)
{
    int world = tr->comm->size[GROUP_WORLD];
    /* Busy time where the host clock is the compute's clock (no device timer: see the top). */
    int busy = !tr->ops->timer_mark;
    double mine = clock_seconds() - tr->straggler_mark_s - (comm_blocked_s() - tr->straggler_mark_blocked_s) +
                  (stalled_s(tr) - tr->straggler_mark_stalled_s);
    double *t = malloc((size_t)world * sizeof *t), *sorted = malloc((size_t)world * sizeof *sorted);
    double *compute = malloc((size_t)world * sizeof *compute);
    if (!t || !sorted || !compute) {
        free(t), free(sorted), free(compute);
        return error_runtime(err, "train", "out of memory");
    }
    if (busy && comm_allgather_f64(tr->comm, GROUP_WORLD, &mine, t, 1, err) != 0) {
        free(t), free(sorted), free(compute);
        return -1;
    }
    mark(tr); /* the next window starts after the gather */
    for (int r = 0; r < world; r++) {
        compute[r] = 0;
        for (int k = 0; k < tr->m; k++)
            compute[r] += tr->all_compute[(size_t)r * (size_t)tr->m + (size_t)k];
        if (!busy)
            t[r] = compute[r];
    }
    int slowest = 0;
    for (int r = 0; r < world; r++) {
        sorted[r] = t[r];
        if (t[r] > t[slowest])
            slowest = r;
    }
    double median = median_of(sorted, world);
    st->slowest_rank = slowest;
    st->busy_measured = busy;
    st->slowest_busy_s = busy ? t[slowest] : 0;
    st->median_busy_s = busy ? median : 0;
    st->slowest_compute_s = compute[slowest];
    memcpy(sorted, compute, (size_t)world * sizeof *sorted);
    st->median_compute_s = median_of(sorted, world);
    double excess = t[slowest] - median;
    /* The plan's own excess for that rank over its median rank. */
    for (int r = 0; r < world; r++)
        sorted[r] = planned_rank_s(tr, r);
    double planned = sorted[slowest];
    st->slowest_predicted_s = planned - median_of(sorted, world);
    if (world > 1 && excess > STRAGGLER_SHARE * median && excess > STRAGGLER_MIN_S) {
        tr->straggler_steps = tr->straggler_rank == slowest ? tr->straggler_steps + 1 : 1;
        tr->straggler_rank = slowest;
    } else {
        tr->straggler_steps = 0;
        tr->straggler_rank = -1;
    }
    if (tr->lay.rank == 0 && tr->straggler_steps >= STRAGGLER_STEPS &&
        (tr->straggler_steps - STRAGGLER_STEPS) % STRAGGLER_REPEAT == 0)
        warn(tr, step, st, busy, t[slowest], median, world);
    free(t), free(sorted), free(compute);
    return 0;
}
