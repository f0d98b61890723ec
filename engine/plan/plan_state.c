/*
 * engine/plan/plan_state.c - the planner's state as words, for checkpoints (see plan.h).
 *
 * Layout: step, seq, n_queues, has_pending, the pending piece, then per queue its length and its
 * pieces, then the leftovers' length and pieces. A piece is 6 words: source, doc, offset, len, seq,
 * arrival (its place in a micro-batch and its CP rank are decided when it is placed).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"

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
    return (PlanDoc){(uint32_t)p[0], p[1], p[2], (int64_t)p[3], 0, (int64_t)p[4], (int64_t)p[5], -1, 0, 0};
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
/* A saved piece must be a piece of a document of the stream's sources, read at or before the
 * saved step and position (the piece held back has no arrival step yet: -1). */
static int check_piece(const Planner *pl, const PlanDoc *d, const uint64_t *w, Error *err)
{
    const DataStream *st = pl->stream;
    uint64_t step = w[0], seq = w[1];
    if (d->source >= (uint32_t)st->n_sources)
        return error_set(err, "planner state", "a piece of source %u; the data has %d source(s)", d->source,
                         st->n_sources);
    const DataSource *src = &st->sources[d->source].src;
    if (d->doc >= src->n_docs)
        return error_set(err, "planner state", "a piece of document %llu; source %u has %llu",
                         (unsigned long long)d->doc, d->source, (unsigned long long)src->n_docs);
    uint64_t doc_len = data_source_doc_len(src, d->doc);
    if (d->len <= 0 || d->len > pl->window || d->offset > doc_len || (uint64_t)d->len > doc_len - d->offset)
        return error_set(err, "planner state", "a piece [%llu, +%lld) of a document of %llu tokens (window %lld)",
                         (unsigned long long)d->offset, (long long)d->len, (unsigned long long)doc_len,
                         (long long)pl->window);
    if (d->seq < 0 || (uint64_t)d->seq > seq || d->arrival < -1 || (d->arrival >= 0 && (uint64_t)d->arrival > step))
        return error_set(err, "planner state", "a piece read at step %lld, position %lld, after the saved step %llu, "
                         "position %llu", (long long)d->arrival, (long long)d->seq, (unsigned long long)step,
                         (unsigned long long)seq);
    return 0;
}

static int read_queue(const Planner *pl, PlanQueue *q, const uint64_t *w, size_t n, size_t *at, Error *err)
{
    if (*at >= n || w[*at] > (n - *at - 1) / PIECE_WORDS)
        return error_set(err, "planner state", "truncated");
    int64_t count = (int64_t)w[(*at)++];
    PlanDoc *items = count ? malloc((size_t)count * sizeof *items) : NULL;
    if (count && !items)
        return error_runtime(err, "planner state", "out of memory");
    for (int64_t i = 0; i < count; i++, *at += PIECE_WORDS) {
        items[i] = get_piece(w + *at);
        if (check_piece(pl, &items[i], w, err) != 0) {
            free(items);
            return -1;
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
    if (w[0] > ((uint64_t)1 << 48) || w[1] > ((uint64_t)1 << 62))
        return error_set(err, "planner state", "corrupted (step %llu, position %llu)", (unsigned long long)w[0],
                         (unsigned long long)w[1]);
    PlanDoc pending = get_piece(w + 4);
    if (w[3] && check_piece(pl, &pending, w, err) != 0)
        return -1;
    size_t at = 4 + PIECE_WORDS;
    for (int q = 0; q < pl->n_queues; q++)
        if (read_queue(pl, &pl->queues[q], w, n, &at, err) != 0)
            return -1;
    if (read_queue(pl, &pl->remained, w, n, &at, err) != 0)
        return -1;
    if (at != n)
        return error_set(err, "planner state", "%zu words, %zu expected", n, at);
    pl->step = (int64_t)w[0];
    pl->seq = (int64_t)w[1];
    pl->has_pending = (int)w[3];
    pl->pending = pending;
    return 0;
}
