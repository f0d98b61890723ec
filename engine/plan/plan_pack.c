/*
 * engine/plan/plan_pack.c - the packers: which document pieces go into which of the step's N = DP x M
 * micro-batches (see plan.h for what each packer does and why).
 *
 * Every packer draws from the stream through the planner, so the pieces it does not use this step
 * (the boundary piece, queued outliers, leftovers) are the planner's state and come first later:
 * no token is lost or read twice.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_pack.h"
#include "util/array.h"

/* ---------------------------------------------------------------------------------------------- */
/* Queues and scratch                                                                              */

static int queue_push(PlanQueue *q, const PlanDoc *d)
{
    if (q->head + q->n == q->cap && q->head > 0) { /* slide to the front before growing */
        memmove(q->items, q->items + q->head, (size_t)q->n * sizeof *q->items);
        q->head = 0;
    }
    PlanDoc *bigger = array_grow(q->items, &q->cap, q->head + q->n + 1, sizeof *bigger);
    if (!bigger)
        return -1;
    q->items = bigger;
    q->items[q->head + q->n++] = *d;
    return 0;
}

static PlanDoc queue_pop(PlanQueue *q)
{
    PlanDoc d = q->items[q->head++];
    if (--q->n == 0)
        q->head = 0;
    return d;
}

/* Room for n docs in the planner's scratch arrays (docs and their micro-batch). */
typedef struct Packed {
    PlanDoc *docs;
    int32_t *mb;
    int64_t n, cap;
} Packed;

static int packed_add(Packed *pk, const PlanDoc *d, int32_t mb)
{
    int64_t cap = pk->cap;
    PlanDoc *docs = array_grow(pk->docs, &cap, pk->n + 1, sizeof *docs);
    if (!docs)
        return -1;
    pk->docs = docs;
    int32_t *mbs = array_grow(pk->mb, &pk->cap, pk->n + 1, sizeof *mbs);
    if (!mbs)
        return -1;
    pk->mb = mbs;
    pk->docs[pk->n] = *d;
    pk->mb[pk->n++] = mb;
    return 0;
}

static void packed_free(Packed *pk)
{
    free(pk->docs);
    free(pk->mb);
}

/* Writes the packed docs into the plan, micro-batch by micro-batch (keeping their order within each),
 * setting start offsets and padding each micro-batch to a multiple of pad_unit tokens. */
static int emit(StepPlan *p, const Packed *pk, int n_mb, int64_t pad_unit, Error *err)
{
    /* Counting sort of the docs by micro-batch, stable. */
    int64_t *first = calloc((size_t)n_mb + 1, sizeof *first), *order = malloc(((size_t)pk->n + 1) * sizeof *order);
    if (!first || !order) {
        free(first);
        free(order);
        return error_runtime(err, "planner", "out of memory");
    }
    for (int64_t k = 0; k < pk->n; k++)
        first[pk->mb[k] + 1]++;
    for (int i = 0; i < n_mb; i++)
        first[i + 1] += first[i];
    for (int64_t k = 0; k < pk->n; k++)
        order[first[pk->mb[k]]++] = k;
    int rc = 0;
    for (int32_t i = 0, k = 0; i < n_mb && rc == 0; i++) {
        PlanMicroBatch *mb = &p->mbs[i];
        mb->first_doc = p->n_docs;
        int64_t at = 0;
        for (; k < first[i]; k++) {
            PlanDoc d = pk->docs[order[k]];
            d.start = at;
            at += d.len;
            if (plan_add_doc(p, &d) < 0)
                rc = error_runtime(err, "planner", "out of memory");
        }
        int64_t pad = at % pad_unit ? pad_unit - at % pad_unit : 0;
        if (pad) {
            PlanDoc d = {PLAN_PAD_SOURCE, 0, 0, pad, at, -1, p->step, -1, 0, 0};
            if (plan_add_doc(p, &d) < 0)
                rc = error_runtime(err, "planner", "out of memory");
        }
        mb->tokens = at + pad;
        mb->pad = pad;
        mb->n_docs = p->n_docs - mb->first_doc;
    }
    free(first);
    free(order);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* Reading the step's pieces                                                                       */

/* The next piece: the one held back last time, or a new one from the stream. */
static void take_piece(Planner *pl, PlanDoc *d)
{
    if (pl->has_pending) {
        *d = pl->pending;
        pl->has_pending = 0;
    } else {
        DataPiece piece;
        data_stream_next(pl->stream, &piece);
        *d = (PlanDoc){piece.source, piece.doc, piece.offset, (int64_t)piece.len, 0, pl->seq++, -1, -1, 0, 0};
    }
    if (d->arrival < 0) /* it joins this step's batch now */
        d->arrival = pl->step;
}

static void hold_back(Planner *pl, const PlanDoc *d)
{
    pl->pending = *d;
    pl->has_pending = 1;
}

/* Takes exactly want tokens, splitting the last piece; its remainder waits for the next step. */
static int take_exact(Planner *pl, int64_t want, Packed *pk, int32_t mb, Error *err)
{
    while (want > 0) {
        PlanDoc d;
        take_piece(pl, &d);
        if (d.len > want) {
            PlanDoc rest = d;
            rest.offset += (uint64_t)want;
            rest.len -= want;
            hold_back(pl, &rest);
            d.len = want;
        }
        want -= d.len;
        if (packed_add(pk, &d, mb) != 0)
            return error_runtime(err, "planner", "out of memory");
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

/* Takes whole pieces while they fit in want tokens; the first that does not waits for the next
 * window. A piece is at most a window long, so an empty window always takes one. */
static int take_whole(Planner *pl, int64_t want, Packed *pk, int32_t mb, Error *err)
{
    while (want > 0) {
        PlanDoc d;
        take_piece(pl, &d);
        if (d.len > want) {
            d.arrival = -1; /* it joins the batch when taken */
            hold_back(pl, &d);
            return 0;
        }
        want -= d.len;
        if (packed_add(pk, &d, mb) != 0)
            return error_runtime(err, "planner", "out of memory");
    }
    return 0;
}

/* cut: the stream is cut at its windows, so each window is exactly one of them (take_exact never
 * splits); keep: whole pieces, a window ends where the next piece does not fit. */
int plan_pack_fixed(Planner *pl, StepPlan *p, Error *err)
{
    Packed pk = {0};
    int rc = 0;
    for (int32_t i = 0; i < pl->n_mb && rc == 0; i++)
        rc = pl->cut ? take_exact(pl, pl->window, &pk, i, err) : take_whole(pl, pl->window, &pk, i, err);
    if (rc == 0)
        rc = emit(p, &pk, pl->n_mb, 1, err);
    packed_free(&pk);
    return rc;
}

/* Longest first; equal lengths in stream order. */
static int by_length_desc(const void *a, const void *b)
{
    const PlanDoc *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? 1 : -1;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* cut: exactly N windows of the (cut) stream, the last piece split at the step's end; keep: last
 * step's leftovers, then whole pieces while they fit in N windows' tokens. */
static int greedy_intake(Planner *pl, Packed *in, Error *err)
{
    int64_t want = (int64_t)pl->n_mb * pl->window;
    if (pl->cut)
        return take_exact(pl, want, in, 0, err);
    while (pl->remained.n > 0) {
        PlanDoc d = queue_pop(&pl->remained);
        want -= d.len;
        if (packed_add(in, &d, 0) != 0)
            return error_runtime(err, "planner", "out of memory");
    }
    return take_whole(pl, want, in, 0, err);
}

int plan_pack_fixed_greedy(Planner *pl, StepPlan *p, Error *err)
{
    Packed in = {0}, pk = {0};
    int n = pl->n_mb, rc = greedy_intake(pl, &in, err);
    double *load = calloc((size_t)n, sizeof *load);
    int64_t *room = malloc((size_t)n * sizeof *room);
    if (rc == 0 && (!load || !room))
        rc = error_runtime(err, "planner", "out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        room[i] = pl->window;
    if (rc == 0 && in.n > 1) /* in.docs is NULL while empty: qsort's pointer must not be */
        qsort(in.docs, (size_t)in.n, sizeof *in.docs, by_length_desc);
    for (int64_t k = 0; rc == 0 && k < in.n; k++) {
        PlanDoc d = in.docs[k];
        int best = -1;
        for (int i = 0; i < n; i++)
            if (room[i] >= d.len && (best < 0 || load[i] < load[best]))
                best = i;
        if (best >= 0) {
            room[best] -= d.len;
            load[best] += cost_doc_s(pl->cost, d.len);
            if (packed_add(&pk, &d, best) != 0)
                rc = error_runtime(err, "planner", "out of memory");
            continue;
        }
        if (!pl->cut) { /* keep: it waits for the next step, whole */
            if (queue_push(&pl->remained, &d) != 0)
                rc = error_runtime(err, "planner", "out of memory");
            continue;
        }
        /* No window has room for all of it: fill the roomiest windows with parts of it. */
        while (rc == 0 && d.len > 0) {
            int j = 0;
            for (int i = 1; i < n; i++)
                if (room[i] > room[j])
                    j = i;
            PlanDoc part = d;
            part.len = d.len < room[j] ? d.len : room[j];
            room[j] -= part.len;
            load[j] += cost_doc_s(pl->cost, part.len);
            d.offset += (uint64_t)part.len;
            d.len -= part.len;
            if (packed_add(&pk, &part, j) != 0)
                rc = error_runtime(err, "planner", "out of memory");
        }
    }
    if (rc == 0)
        rc = emit(p, &pk, n, 1, err);
    free(load);
    free(room);
    packed_free(&in);
    packed_free(&pk);
    return rc;
}

/* The queue of an outlier of length len: the last threshold it reaches (-1: not an outlier). */
static int queue_of(const Planner *pl, int64_t len)
{
    int q = -1;
    for (int i = 0; i < pl->n_queues; i++)
        if (len >= pl->thresholds[i])
            q = i;
    return q;
}

/* The tokens of the n oldest outliers of queue q (it holds at least n). */
static int64_t queue_head_tokens(const PlanQueue *q, int n)
{
    int64_t tokens = 0;
    for (int i = 0; i < n; i++)
        tokens += q->items[q->head + i].len;
    return tokens;
}

/* Puts k pieces back at the front of queue q, in their order (a release undone: they were its oldest). */
static int queue_unpop(PlanQueue *q, const PlanDoc *docs, int64_t k)
{
    if (q->head > 0) {
        memmove(q->items, q->items + q->head, (size_t)q->n * sizeof *q->items);
        q->head = 0;
    }
    PlanDoc *bigger = array_grow(q->items, &q->cap, q->n + k, sizeof *bigger);
    if (!bigger)
        return -1;
    q->items = bigger;
    memmove(q->items + k, q->items, (size_t)q->n * sizeof *q->items);
    memcpy(q->items, docs, (size_t)k * sizeof *docs);
    q->n += k;
    return 0;
}

/* A step's intake as it is read: the pieces going into the step (set), their tokens with last step's
 * leftovers (taken), and the releases among them - set[first, first + n_mb) from queue q each. */
typedef struct Release {
    int q;
    int64_t first, tokens;
} Release;

typedef struct Intake {
    Packed set;
    int64_t taken;
    Release *rel;
    int64_t n_rel, cap_rel;
} Intake;

/* Moves the n oldest outliers of queue q into the step; -1 out of memory. */
static int release(Planner *pl, int q, int n, Intake *in)
{
    Release r = {q, in->set.n, 0};
    for (int i = 0; i < n; i++) {
        PlanDoc d = queue_pop(&pl->queues[q]);
        r.tokens += d.len;
        if (packed_add(&in->set, &d, 0) != 0)
            return -1;
    }
    Release *bigger = array_grow(in->rel, &in->cap_rel, in->n_rel + 1, sizeof *bigger);
    if (!bigger)
        return -1;
    in->rel = bigger;
    in->rel[in->n_rel++] = r;
    in->taken += r.tokens;
    return 0;
}

/* Undoes the step's releases from queues other than q, last first, so each queue gets its outliers
 * back at its front in their order; returns the tokens freed, -1 out of memory. */
static int64_t undo_releases_but(Planner *pl, int q, int n, Intake *in)
{
    int64_t freed = 0;
    for (int64_t r = in->n_rel - 1; r >= 0; r--) {
        Release *x = &in->rel[r];
        if (x->q == q)
            continue;
        if (queue_unpop(&pl->queues[x->q], in->set.docs + x->first, n) != 0)
            return -1;
        /* Close the gap in the set (later entries shift down; later releases' first with them). */
        memmove(in->set.docs + x->first, in->set.docs + x->first + n,
                (size_t)(in->set.n - x->first - n) * sizeof *in->set.docs);
        in->set.n -= n;
        for (int64_t later = r + 1; later < in->n_rel; later++)
            in->rel[later].first -= n;
        freed += x->tokens;
        in->taken -= x->tokens;
        memmove(x, x + 1, (size_t)(in->n_rel - r - 1) * sizeof *x);
        in->n_rel--;
    }
    return freed;
}

/* Of the queues that hold one outlier per micro-batch and whose N oldest fit beside taken, the one
 * whose release is the largest (ties: the oldest first outlier); -1 when none does. Taken largest
 * first at a step's start, the releases fill the step as far as they can (first fit decreasing): a
 * queue of window-size pieces, whose release is the whole batch when the batch is N windows, goes
 * into an empty step instead of waiting behind a smaller release that leaves no room for it. */
static int largest_ready_queue(const Planner *pl, int n, int64_t room, int64_t taken)
{
    int best = -1;
    int64_t best_tokens = 0;
    for (int q = 0; q < pl->n_queues; q++) {
        const PlanQueue *pq = &pl->queues[q];
        if (pq->n < n)
            continue;
        int64_t tokens = queue_head_tokens(pq, n);
        if (taken + tokens > room)
            continue;
        if (best < 0 || tokens > best_tokens ||
            (tokens == best_tokens && pq->items[pq->head].seq < pl->queues[best].items[pl->queues[best].head].seq)) {
            best = q;
            best_tokens = tokens;
        }
    }
    return best;
}

/* The step's room: the configured batch, but no more than its micro-batches can hold (N x S_max). */
static int64_t step_room(const Planner *pl)
{
    int64_t hold = (int64_t)pl->n_mb * pl->s_max;
    return pl->batch_tokens < hold ? pl->batch_tokens : hold;
}

/* len tokens (an ordinary piece, or a backed-up queue's release) that would take the step from taken
 * past its room: they go in when that lands nearer the room than leaving them out does (the overshoot
 * under the shortfall) and the micro-batches can hold them; else they wait for the next step. So a
 * step ends within half a piece of its room, whatever the length of the piece at its boundary. */
static int closing_piece_fits(const Planner *pl, int64_t room, int64_t taken, int64_t len)
{
    if (taken + len <= room)
        return 1;
    return taken + len - room < room - taken && taken + len <= (int64_t)pl->n_mb * pl->s_max;
}

/* 1. The step's documents, counted against its room R = min(global_batch_tokens, N x S_max) - every
 *    token that goes into the step, and only those:
 *    - last step's leftovers (pieces no micro-batch had room for), first;
 *    - the outlier queues that hold one outlier per micro-batch, the largest release first, each
 *      while its N oldest fit in what is left of R (N of at most a window each fit in an empty step:
 *      N W <= R);
 *    - then the stream: an ordinary piece goes in while it fits (the one at the boundary when that
 *      lands nearer R, closing_piece_fits), else it is held back for the next step and the step is
 *      full; an outlier goes to its queue - not counted, it is not trained yet - and a queue that
 *      reaches N releases its N oldest now if they fit.
 *    Reading goes on until the step is full, so a step whose intake was mostly outliers still trains
 *    about R tokens (the queues fill; they release in this step or the next ones), and so does the
 *    first step of a run, when the queues are empty. A queue whose N oldest do not fit waits; when
 *    it holds WLB_BACKLOG releases (a stretch of the stream of nearly nothing but outliers, as the
 *    window-size pieces of a document of millions of tokens; a stream of outliers alone would
 *    never end the step), its N oldest go in if that lands nearer R, if need be in place of the
 *    step's releases from the other queues (put back at their fronts: the tiny config's queue of
 *    window-size pieces releases exactly N windows = its whole batch, which fits nothing beside
 *    it), else the step ends. */
enum { WLB_BACKLOG = 8 }; /* releases' worth a queue may back up by while a step is read */

static int wlb_intake(Planner *pl, Intake *in, Error *err)
{
    int n = pl->n_mb;
    int64_t room = step_room(pl);
    for (int64_t i = 0; i < pl->remained.n; i++)
        in->taken += pl->remained.items[pl->remained.head + i].len;
    for (int q; (q = largest_ready_queue(pl, n, room, in->taken)) >= 0;)
        if (release(pl, q, n, in) != 0)
            return error_runtime(err, "planner", "out of memory");
    while (in->taken < room) {
        PlanDoc d;
        take_piece(pl, &d);
        int q = queue_of(pl, d.len);
        if (q < 0) {
            if (!closing_piece_fits(pl, room, in->taken, d.len)) {
                d.arrival = -1; /* it belongs to the next step's batch */
                hold_back(pl, &d);
                return 0;
            }
            in->taken += d.len;
            if (packed_add(&in->set, &d, 0) != 0)
                return error_runtime(err, "planner", "out of memory");
            continue;
        }
        if (queue_push(&pl->queues[q], &d) != 0)
            return error_runtime(err, "planner", "out of memory");
        if (pl->queues[q].n < n)
            continue;
        int64_t tokens = queue_head_tokens(&pl->queues[q], n);
        if (in->taken + tokens <= room) {
            if (release(pl, q, n, in) != 0)
                return error_runtime(err, "planner", "out of memory");
            continue;
        }
        /* It waits: reading goes on for ordinary pieces to fill the step, up to a backlog of
         * WLB_BACKLOG releases in the queue. Then its N oldest go in when that lands nearer the room
         * than the step is now - if need be in place of the step's releases from the other queues,
         * which go back to the front of their queues (ready again next step); else the step ends. */
        if (pl->queues[q].n < WLB_BACKLOG * (int64_t)n)
            continue;
        int64_t others = 0;
        for (int64_t r = 0; r < in->n_rel; r++)
            others += in->rel[r].q != q ? in->rel[r].tokens : 0;
        int beside = closing_piece_fits(pl, room, in->taken, tokens);
        int instead = others > 0 && closing_piece_fits(pl, room, in->taken - others, tokens);
        if (beside && instead) /* the nearer of the two */
            beside = llabs(in->taken + tokens - room) <= llabs(in->taken - others + tokens - room);
        if (beside || instead) {
            if (!beside && undo_releases_but(pl, q, n, in) < 0)
                return error_runtime(err, "planner", "out of memory");
            if (release(pl, q, n, in) != 0)
                return error_runtime(err, "planner", "out of memory");
            continue;
        }
        return 0;
    }
    return 0;
}

/* The micro-batch a piece of len goes on (stage 3's rule): the least loaded with room under S_max,
 * else the one with the fewest tokens if it has room; -1 when none has. */
static int place_piece(const Planner *pl, const double *load, const int64_t *tokens, int64_t len)
{
    int w = 0, l = 0;
    for (int i = 1; i < pl->n_mb; i++) {
        if (load[i] < load[w])
            w = i;
        if (tokens[i] < tokens[l])
            l = i;
    }
    return tokens[w] + len <= pl->s_max ? w : tokens[l] + len <= pl->s_max ? l : -1;
}

/* 4. The gaps. The intake counted the room's worth of pieces, but whole pieces do not always pack
 *    into the micro-batches (with S_max the window, pieces of up to a window each into N windows):
 *    what no micro-batch holds waits for the next step, which then counts it first - so the steps
 *    would train a steady fraction of the room. While the step trains less than its room, the
 *    stream's next ordinary pieces go into the gaps by stage 3's rule (an outlier goes to its
 *    queue, not counted); the first that fits no micro-batch, or that would take the step further
 *    past its room than it is short of it, is held back for the next step. At most FILL_READS
 *    pieces a step are read so. */
enum { FILL_READS = 256 };

static int fill_gaps(Planner *pl, Packed *pk, double *load, int64_t *tokens, Error *err)
{
    int64_t room = step_room(pl), trained = 0;
    for (int i = 0; i < pl->n_mb; i++)
        trained += tokens[i];
    for (int reads = 0; trained < room && reads < FILL_READS; reads++) {
        PlanDoc d;
        take_piece(pl, &d);
        int q = queue_of(pl, d.len);
        if (q >= 0) {
            if (queue_push(&pl->queues[q], &d) != 0)
                return error_runtime(err, "planner", "out of memory");
            continue;
        }
        int dest = place_piece(pl, load, tokens, d.len);
        if (dest < 0 || !closing_piece_fits(pl, room, trained, d.len)) {
            d.arrival = -1; /* it belongs to the next step's batch */
            hold_back(pl, &d);
            return 0;
        }
        load[dest] += cost_doc_s(pl->cost, d.len);
        tokens[dest] += d.len;
        trained += d.len;
        if (packed_add(pk, &d, dest) != 0)
            return error_runtime(err, "planner", "out of memory");
    }
    return 0;
}

int plan_pack_wlb(Planner *pl, StepPlan *p, Error *err)
{
    int n = pl->n_mb, rc = 0;
    Packed pk = {0};
    Intake in = {0};
    if (wlb_intake(pl, &in, err) != 0) {
        packed_free(&in.set);
        free(in.rel);
        return -1;
    }
    Packed set = in.set;
    free(in.rel);
    /* 2. Longest first, after last step's leftovers. */
    if (set.n > 1) /* all of the intake queued: set.docs is NULL */
        qsort(set.docs, (size_t)set.n, sizeof *set.docs, by_length_desc);
    int64_t n_left = pl->remained.n;
    double *load = calloc((size_t)n, sizeof *load);
    int64_t *tokens = calloc((size_t)n, sizeof *tokens);
    if (!load || !tokens)
        rc = error_runtime(err, "planner", "out of memory");
    /* 3. Each on the least loaded micro-batch with room under S_max, else the one with the fewest
     *    tokens, else it waits for the next step. */
    for (int64_t k = 0; rc == 0 && k < n_left + set.n; k++) {
        PlanDoc d = k < n_left ? queue_pop(&pl->remained) : set.docs[k - n_left];
        int dest = place_piece(pl, load, tokens, d.len);
        if (dest < 0) {
            if (queue_push(&pl->remained, &d) != 0)
                rc = error_runtime(err, "planner", "out of memory");
            continue;
        }
        load[dest] += cost_doc_s(pl->cost, d.len);
        tokens[dest] += d.len;
        if (packed_add(&pk, &d, dest) != 0)
            rc = error_runtime(err, "planner", "out of memory");
    }
    if (rc == 0)
        rc = fill_gaps(pl, &pk, load, tokens, err);
    if (rc == 0)
        rc = emit(p, &pk, n, pl->cp > 1 ? 2 * pl->cp : 1, err);
    free(load);
    free(tokens);
    packed_free(&set);
    packed_free(&pk);
    return rc;
}

/* Stream order: by position in the stream, then by offset within a split document. */
static int by_stream_order(const void *a, const void *b)
{
    const PlanDoc *x = a, *y = b;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int plan_pack_baseline(const Planner *pl, const StepPlan *src, StepPlan *out, int cut, Error *err)
{
    Packed in = {0}, pk = {0};
    int rc = 0;
    int64_t total = 0;
    for (int64_t k = 0; k < src->n_docs && rc == 0; k++)
        if (src->docs[k].source != PLAN_PAD_SOURCE) {
            total += src->docs[k].len;
            if (packed_add(&in, &src->docs[k], 0) != 0)
                rc = error_runtime(err, "planner", "out of memory");
        }
    if (rc == 0 && in.n > 1)
        qsort(in.docs, (size_t)in.n, sizeof *in.docs, by_stream_order);
    /* Windows: ceil(total / W) when cutting; else counted by filling them. */
    int64_t n_mb = (total + pl->window - 1) / pl->window;
    if (!cut) {
        n_mb = 0;
        for (int64_t k = 0, fill = pl->window; k < in.n; k++) {
            if (fill + in.docs[k].len > pl->window) {
                n_mb++;
                fill = 0;
            }
            fill += in.docs[k].len;
        }
    }
    int64_t m = (n_mb + pl->dp - 1) / pl->dp;
    if (m == 0)
        m = 1;
    /* Interleaved 1F1B runs micro-batches in groups of pp: round up with empty ones. */
    if (pl->cost->v > 1)
        m = (m + pl->pp - 1) / pl->pp * pl->pp;
    plan_reset(out, src->step, pl->dp, (int)m, pl->cp);
    if (rc == 0 && !out->mbs)
        rc = error_runtime(err, "planner", "out of memory");
    /* Concatenate and cut at every multiple of the window, as Plain-4D's loader does (or start the
     * next window with a piece that does not fit). */
    int64_t fill = 0;
    int32_t mb = 0;
    for (int64_t k = 0; k < in.n && rc == 0; k++) {
        PlanDoc d = in.docs[k];
        if (!cut && fill + d.len > pl->window) {
            fill = 0;
            mb++;
        }
        while (d.len > 0 && rc == 0) {
            PlanDoc part = d;
            part.len = d.len < pl->window - fill ? d.len : pl->window - fill;
            if (packed_add(&pk, &part, mb) != 0)
                rc = error_runtime(err, "planner", "out of memory");
            d.offset += (uint64_t)part.len;
            d.len -= part.len;
            fill += part.len;
            if (fill == pl->window) {
                fill = 0;
                mb++;
            }
        }
    }
    if (rc == 0)
        rc = emit(out, &pk, pl->dp * (int)m, 1, err);
    for (int64_t i = 0; i < (int64_t)pl->dp * m && rc == 0; i++) {
        out->mbs[i].replica = (int32_t)(i / m);
        out->mbs[i].order = (int32_t)(i % m);
    }
    for (int64_t k = 0; k < out->n_docs; k++)
        out->tokens += out->docs[k].len;
    packed_free(&in);
    packed_free(&pk);
    return rc;
}
