/*
 * engine/plan_state.c - the planner's state as words, for checkpoints (see plan.h).
 *
 * Layout: step, seq, n_queues, has_pending, the pending piece, then per queue its length and its
 * pieces, then the leftovers' length and pieces. A piece is 6 words: source, doc, offset, len, seq,
 * arrival (its place in a micro-batch and its CP rank are decided when it is placed).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan.h"

enum { PIECE_WORDS = 6 };

static void put_piece(uint64_t **w, const PlanDoc *d)
{
    uint64_t *p = *w;
    p[0] = d->source;
    p[1] = d->doc;
    p[2] = d->offset;
    p[3] = (uint64_t)d->len;
    p[4] = (uint64_t)d->seq;
    p[5] = (uint64_t)d->arrival;
    *w += PIECE_WORDS;
}

static PlanDoc get_piece(const uint64_t *p)
{
    return (PlanDoc){(uint32_t)p[0], p[1], p[2], (int64_t)p[3], 0, (int64_t)p[4], (int64_t)p[5], -1};
}

size_t plan_state_words(const Planner *pl)
{
    size_t n = 4 + PIECE_WORDS + 1 + PIECE_WORDS * (size_t)pl->remained.n;
    for (int q = 0; q < pl->n_queues; q++)
        n += 1 + PIECE_WORDS * (size_t)pl->queues[q].n;
    return n;
}

void plan_state_save(const Planner *pl, uint64_t *w)
{
    *w++ = (uint64_t)pl->step;
    *w++ = (uint64_t)pl->seq;
    *w++ = (uint64_t)pl->n_queues;
    *w++ = (uint64_t)pl->has_pending;
    PlanDoc none = {0};
    put_piece(&w, pl->has_pending ? &pl->pending : &none);
    for (int q = 0; q < pl->n_queues; q++) {
        *w++ = (uint64_t)pl->queues[q].n;
        for (int64_t i = 0; i < pl->queues[q].n; i++)
            put_piece(&w, &pl->queues[q].items[pl->queues[q].head + i]);
    }
    *w++ = (uint64_t)pl->remained.n;
    for (int64_t i = 0; i < pl->remained.n; i++)
        put_piece(&w, &pl->remained.items[pl->remained.head + i]);
}

/* Reads a queue of pieces at w[*at]; checks the counts against the words left. */
static int read_queue(PlanQueue *q, const uint64_t *w, size_t n, size_t *at, int64_t window, Error *err)
{
    if (*at >= n || w[*at] > (n - *at - 1) / PIECE_WORDS)
        return error_set(err, "planner state", "truncated");
    int64_t count = (int64_t)w[(*at)++];
    PlanDoc *items = count ? malloc((size_t)count * sizeof *items) : NULL;
    if (count && !items)
        return error_runtime(err, "planner state", "out of memory");
    for (int64_t i = 0; i < count; i++, *at += PIECE_WORDS) {
        items[i] = get_piece(w + *at);
        int64_t len = items[i].len;
        if (len <= 0 || len > window) {
            free(items);
            return error_set(err, "planner state", "a queued piece of %lld tokens does not fit the window of %lld",
                             (long long)len, (long long)window);
        }
    }
    free(q->items);
    *q = (PlanQueue){items, 0, count, count};
    return 0;
}

int plan_state_restore(Planner *pl, const uint64_t *w, size_t n, Error *err)
{
    if (n < 4 + PIECE_WORDS)
        return error_set(err, "planner state", "truncated");
    if (w[2] != (uint64_t)pl->n_queues)
        return error_set(err, "planner state", "saved with %llu outlier queues, the config has %d",
                         (unsigned long long)w[2], pl->n_queues);
    if (w[3] > 1)
        return error_set(err, "planner state", "corrupted (pending flag %llu)", (unsigned long long)w[3]);
    size_t at = 4 + PIECE_WORDS;
    for (int q = 0; q < pl->n_queues; q++)
        if (read_queue(&pl->queues[q], w, n, &at, pl->window, err) != 0)
            return -1;
    if (read_queue(&pl->remained, w, n, &at, pl->window, err) != 0)
        return -1;
    if (at != n)
        return error_set(err, "planner state", "%zu words, %zu expected", n, at);
    pl->step = (int64_t)w[0];
    pl->seq = (int64_t)w[1];
    pl->has_pending = (int)w[3];
    pl->pending = get_piece(w + 4);
    return 0;
}
