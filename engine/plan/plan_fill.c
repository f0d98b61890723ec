/*
 * engine/plan/plan_fill.c - groups' step pass: fill the idle CP ranks of a micro-batch that its
 * long documents leave uneven with short documents from the step's other micro-batches.
 *
 * Why. With balance.cp_sharding: groups a micro-batch is evened over its CP ranks as well as its
 * documents allow. When a long document dominates it (say 55K tokens cut over a block of 8 of 16
 * ranks), its block sits at that document's level and the other ranks several percent lower:
 * moving rows of the long document to them would put them in its K/V exchange, which costs more
 * than the gap. With many mid-size documents the ranks end within a few percent of each other, a
 * document's length apart. Nothing inside the micro-batch closes that; the packer balanced the
 * micro-batches' totals, not their ranks. So the step is the place to close it.
 *
 * What. After every micro-batch is sharded, the step's most uneven one A (slowest rank over the
 * mean of its ranks, per layer forward + backward with exchanges, above FILL_FROM) takes documents
 * that the others hold whole on one rank:
 *   FILL_RANKS  each of A's ranks, least loaded first, takes the longest such document that keeps
 *               its forward and its backward at most A's slowest (what the pipeline takes), or
 *               trades one of its own whole documents for a longer one that fits
 *               (the giver gets the shorter one on the same rank), whichever adds more, up to
 *               FILL_MOVES times; no rank passes A's most rows (the LM head and the pipeline's sends
 *               scale with them). A document whole on a rank costs it its own d x d causal
 *               attention, the linear layers of d more rows and their TP all-reduce, and no
 *               exchange: the figure is exact. A keeps its layout with what it took (a replay,
 *               plan_fill_replay.c), a giver its layout less what it gave. When A is above
 *               FILL_AGAIN, the documents the others shard are candidates too (a giver's block
 *               then exchanges less; a traded document goes whole to its least loaded rank): a gap
 *               that a long document leaves on a block of A's ranks is often wider than any whole
 *               document of the others that fits.
 *   FILL_ROOM   when that finds nothing that is kept: A takes documents worth a share of its
 *               ranks' summed room and is laid out anew (groups may regroup what it holds): the
 *               first of FILL_SHARES, then, while nothing is kept and A is still above FILL_AGAIN
 *               (the evenness wlbtrain aims at), the others in turn - how much a new layout can
 *               place well depends on the documents taken, which no share fits always.
 * A try is kept when the step's predicted time (its pipeline simulated; in the step's order before
 * the try when the order chosen afresh is slower, keep_arrangement) does not rise and the
 * micro-batches it changed end more even than A was; when the replays alone fall short, the
 * micro-batches that stayed as uneven as A (all of them, when a replay failed or the step got
 * slower) are laid out anew by plan_shard, each keeping the faster of the two; else the plan is
 * restored as it was. Then the step's new most uneven micro-batch tries, until it has tried once
 * already. A micro-batch that took is never a giver after, so no document goes back.
 *
 * Cost. Each micro-batch tries at most once the exact fill and once per room share: the step's
 * documents sorted (n log n), a binary search over them per rank and move (per rank, whole
 * document and move when trading), a replay of each micro-batch changed (linear in its pieces),
 * and at most one plan_shard of each micro-batch changed.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_fill_impl.h"
#include "engine/plan/sched.h"

#define FILL_FROM 1.005   /* a micro-batch's time imbalance (slowest rank over mean) to fill */
#define FILL_AGAIN 1.01   /* a micro-batch this uneven tries FILL_ROOM's other shares */
static const double FILL_SHARES[] = {0.8, 0.5, 1.2, 0.3, 1.6}; /* FILL_ROOM: shares of the room taken */
#define FILL_STEP 0.0005  /* FILL_RANKS: a move adds at least this share of the rank's time */
#define FILL_MOVES 8      /* FILL_RANKS: the most moves per rank */

enum { FILL_RANKS, FILL_ROOM }; /* the two ways a micro-batch takes */

/* Rank r of micro-batch mb: its predicted seconds per layer, forward + backward, exchanges included. */
static double rank_time(const StepPlan *p, const PlanMicroBatch *mb, int r)
{
    const PlanRank *k = &p->ranks[mb->first_rank + r];
    return plan_rank_compute(p, mb, r) + k->comm_fwd_s + k->comm_bwd_s;
}

/* What a document of len tokens adds to a rank holding `rows` rows when put on it whole (what
 * shard_whole and shard_commit record: its attention, the linear layers and the TP all-reduce of
 * both directions; no exchange). */
static void whole_cost(const CostModel *cost, int64_t rows, int64_t len, double *fwd, double *bwd)
{
    double tp = cost_tp_comm_s(cost, rows + len) - cost_tp_comm_s(cost, rows);
    cost_attn_fb_s(cost, len, len, fwd, bwd);
    *fwd += cost_linear_fwd_s(cost, rows + len) - cost_linear_fwd_s(cost, rows) + tp;
    *bwd += cost_linear_bwd_s(cost, rows + len) - cost_linear_bwd_s(cost, rows) + tp;
}

/* A rank's forward and backward seconds per layer. */
static double rank_fwd(const PlanRank *k)
{
    return k->attn_fwd_s + k->linear_fwd_s + k->comm_fwd_s;
}

static double rank_bwd(const PlanRank *k)
{
    return k->attn_bwd_s + k->linear_bwd_s + k->comm_bwd_s;
}


/* The worst imbalance of the micro-batches with mask[i] set (of all: plan_cp_time_imbalance). */
static double worst_imbalance(const StepPlan *p, const uint8_t *mask)
{
    double worst = 1, level;
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
        if (mask[i]) {
            double imb = plan_mb_time_imbalance(p, i, &level);
            worst = imb > worst ? imb : worst;
        }
    return worst;
}

static int by_len_desc(const void *a, const void *b)
{
    const Candidate *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? 1 : -1;
    return x->doc < y->doc ? -1 : x->doc > y->doc;
}

/* Micro-batches laid out document by document (per_seq cuts the micro-batch, not its documents). */
static int replayable(const PlanMicroBatch *mb)
{
    return mb->mode != CP_PER_SEQ;
}

/* Candidates for micro-batch a: documents held whole by the others that have not taken (and those
 * they shard, with f->sharded_too), longest first. */
static void collect(Fill *f, const StepPlan *p, int64_t a)
{
    f->n_cand = 0;
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        const PlanMicroBatch *mb = &p->mbs[i];
        if (i == a || f->role[i] == ROLE_TOOK || !replayable(mb))
            continue;
        for (int64_t k = mb->first_doc; k < mb->first_doc + mb->n_docs; k++)
            if (p->docs[k].source != PLAN_PAD_SOURCE && (p->docs[k].rank >= 0 || f->sharded_too))
                f->cand[f->n_cand++] = (Candidate){k, p->docs[k].len, (int32_t)i, p->docs[k].rank, -1, -1};
    }
    qsort(f->cand, (size_t)f->n_cand, sizeof *f->cand, by_len_desc);
}

/* 1 when the taker's document doc is traded away already. */
static int moved_out(const Fill *f, int64_t doc)
{
    for (int64_t i = 0; i < f->n_back; i++)
        if (f->back[i].doc == doc)
            return 1;
    return 0;
}

/* A rank of the taker, for the candidates: what it may gain. */
typedef struct Fit {
    const CostModel *cost;
    int64_t rows, most;       /* the rank's rows (less what leaves), the most tokens it may gain */
    int64_t out_len;          /* a document leaving the rank (0: none): candidates must be longer */
    double t_f, t_b, top_f, top_b; /* the rank's times (less what leaves) and their ceilings */
} Fit;

static int fits(const Fit *t, int64_t len)
{
    double df, db;
    if (len - t->out_len > t->most || len <= t->out_len)
        return 0;
    whole_cost(t->cost, t->rows, len, &df, &db);
    return t->t_f + df <= t->top_f && t->t_b + db <= t->top_b;
}

/* The longest unused candidate that fits, or n_cand: the cost grows with the length, so binary
 * search the first that fits, then skip the ones taken. */
static int64_t longest_fit(const Fill *f, const Fit *t)
{
    int64_t lo = 0, hi = f->n_cand;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        /* lengths not above the out document's fail too, but they sort last: first fit is fine */
        if (f->cand[mid].len <= t->out_len || fits(t, f->cand[mid].len))
            hi = mid;
        else
            lo = mid + 1;
    }
    while (lo < f->n_cand && f->cand[lo].to_mb >= 0)
        lo++;
    return lo < f->n_cand && fits(t, f->cand[lo].len) ? lo : f->n_cand;
}

/* FILL_ROOM: micro-batch a takes documents up to f->share of its ranks' room, the sum over them
 * of how far each is below the slowest, each priced whole on a rank of the mean
 * rows, longest first: a new layout (plan_shard) may spread them, and regroup what it held. */
static int64_t fill_room(Fill *f, const StepPlan *p, int64_t a)
{
    const CostModel *cost = f->pl->cost;
    int64_t s_max = f->pl->packer == PACKER_WLB ? f->pl->s_max : f->pl->window;
    const PlanMicroBatch *mb = &p->mbs[a];
    const PlanRank *k = &p->ranks[mb->first_rank];
    double level;
    plan_mb_time_imbalance(p, a, &level);
    double top = level, room = 0;
    int64_t rows = 0, room_rows = 0, n_low = 0, taken = 0, tokens = mb->tokens - mb->pad;
    for (int r = 0; r < p->cp; r++) {
        double t = rank_time(p, mb, r);
        if (t < top) {
            room += top - t;
            rows += k[r].tokens;
            room_rows += f->pl->rank_capacity - k[r].tokens;
            n_low++;
        }
    }
    if (n_low == 0)
        return 0;
    room *= f->share;
    f->n_back = 0;
    int64_t mean_rows = rows / n_low;
    for (;;) {
        int64_t most = room_rows < s_max - tokens ? room_rows : s_max - tokens;
        double df, db;
        int64_t lo = 0, hi = f->n_cand;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            whole_cost(cost, mean_rows, f->cand[mid].len, &df, &db);
            if (f->cand[mid].len <= most && df + db <= room)
                hi = mid;
            else
                lo = mid + 1;
        }
        while (lo < f->n_cand && f->cand[lo].to_mb >= 0)
            lo++;
        if (lo == f->n_cand)
            break;
        f->cand[lo].to_mb = (int32_t)a;
        f->cand[lo].to_rank = FILL_ANYWHERE;
        whole_cost(cost, mean_rows, f->cand[lo].len, &df, &db);
        room -= df + db;
        room_rows -= f->cand[lo].len;
        tokens += f->cand[lo].len;
        taken++;
    }
    return taken;
}

/* FILL_RANKS: micro-batch a's ranks, least loaded first, each up to its forward and backward
 * ceilings (the micro-batch's slowest of each, what the pipeline takes): it takes
 * the longest candidate that fits, or trades one of its whole documents for a longer one that fits
 * (the giver gets the shorter one on the same rank), whichever adds more; again until neither
 * adds FILL_STEP of its time. Exact: a whole document's cost does not depend on the others. */
static int64_t fill_ranks(Fill *f, const StepPlan *p, int64_t a)
{
    const CostModel *cost = f->pl->cost;
    int64_t s_max = f->pl->packer == PACKER_WLB ? f->pl->s_max : f->pl->window;
    const PlanMicroBatch *mb = &p->mbs[a];
    const PlanRank *k = &p->ranks[mb->first_rank];
    double top_f = mb->fwd_s, top_b = mb->bwd_s;
    int64_t tokens = mb->tokens - mb->pad, taken = 0, max_rows = 0;
    /* The rank holding the most rows sets the LM head's and the pipeline sends' times (sched.c):
     * no rank goes above it. */
    for (int r = 0; r < p->cp; r++)
        max_rows = k[r].tokens > max_rows ? k[r].tokens : max_rows;
    f->n_back = 0;
    memset(f->done, 0, (size_t)p->cp);
    for (int n = 0; n < p->cp; n++) {
        int r = -1;
        for (int q = 0; q < p->cp; q++)
            if (!f->done[q] && (r < 0 || rank_time(p, mb, q) < rank_time(p, mb, r)))
                r = q;
        f->done[r] = 1;
        double t_f = rank_fwd(&k[r]), t_b = rank_bwd(&k[r]), df, db, dxf, dxb;
        int64_t rows = k[r].tokens;
        for (int moves = 0; moves < FILL_MOVES; moves++) {
            Fit t = {cost, rows, 0, 0, t_f, t_b, top_f, top_b};
            t.most = max_rows - rows < s_max - tokens ? max_rows - rows : s_max - tokens;
            /* Taking a candidate. */
            int64_t best = longest_fit(f, &t), best_x = -1;
            double gain = 0;
            if (best < f->n_cand) {
                whole_cost(cost, rows, f->cand[best].len, &df, &db);
                gain = df + db;
            }
            /* Trading a whole document x of the rank for a longer candidate. */
            for (int64_t x = mb->first_doc; x < mb->first_doc + mb->n_docs; x++) {
                const PlanDoc *d = &p->docs[x];
                if (d->rank != r || d->source == PLAN_PAD_SOURCE || moved_out(f, x))
                    continue;
                Fit u = t;
                u.rows = rows - d->len;
                whole_cost(cost, u.rows, d->len, &dxf, &dxb);
                u.t_f -= dxf;
                u.t_b -= dxb;
                u.out_len = d->len;
                int64_t y = longest_fit(f, &u);
                if (y == f->n_cand)
                    continue;
                whole_cost(cost, u.rows, f->cand[y].len, &df, &db);
                if (df + db - dxf - dxb > gain) {
                    gain = df + db - dxf - dxb;
                    best = y;
                    best_x = x;
                }
            }
            if (best == f->n_cand || gain < FILL_STEP * (t_f + t_b))
                break;
            Candidate *y = &f->cand[best];
            int64_t base = rows;
            if (best_x >= 0) {
                const PlanDoc *d = &p->docs[best_x];
                base -= d->len;
                whole_cost(cost, base, d->len, &dxf, &dxb);
                t_f -= dxf;
                t_b -= dxb;
                f->back[f->n_back++] = (Candidate){best_x, d->len, (int32_t)a, r, y->mb,
                                                   y->from_rank >= 0 ? y->from_rank : FILL_ANYWHERE};
                tokens -= d->len;
                rows -= d->len;
            }
            whole_cost(cost, base, y->len, &df, &db);
            y->to_mb = (int32_t)a;
            y->to_rank = r;
            t_f += df;
            t_b += db;
            rows += y->len;
            tokens += y->len;
            taken++;
        }
    }
    return taken;
}

/* When the new arrangement (plan_arrange's pipeline order, chosen afresh from the new costs) makes
 * the step slower, the step's arrangement before the try, if that is faster: with no micro-batch
 * slower, the pipeline in its old order is no slower than before (each operation starts when the
 * ones it waits for end, none of which got longer), where a new order chosen by the costs can lose
 * a little. Sets *after_s; -1 on error. */
static int keep_arrangement(Fill *f, StepPlan *p, double *after_s, Error *err)
{
    int64_t n_mb = (int64_t)p->dp * p->m;
    for (int64_t i = 0; i < n_mb; i++) {
        f->arranged[2 * i] = p->mbs[i].replica;
        f->arranged[2 * i + 1] = p->mbs[i].order;
        p->mbs[i].replica = f->saved.mbs[i].replica;
        p->mbs[i].order = f->saved.mbs[i].order;
    }
    double before_order_s;
    if (sched_step_time(p, f->pl->cost, &before_order_s, err) != 0)
        return -1;
    if (before_order_s < *after_s) {
        *after_s = before_order_s;
        return 0;
    }
    for (int64_t i = 0; i < n_mb; i++) {
        p->mbs[i].replica = f->arranged[2 * i];
        p->mbs[i].order = f->arranged[2 * i + 1];
    }
    return 0;
}

/* Micro-batch i is laid out anew in this pass of a try (besides its replay): in the second pass
 * when marked so, and a room fill's taker always. */
static int anew_at(const Fill *f, int pass, int how, int64_t a, int64_t i)
{
    return (pass == 1 && f->redo[i]) || (how == FILL_ROOM && i == a);
}

/* Micro-batch a takes what fits. Returns the documents moved (0: none, or not kept), -1 on error. */
static int64_t try_fill(Fill *f, StepPlan *p, int64_t a, int how, double *step_s, Error *err)
{
    const Planner *pl = f->pl;
    int64_t n_mb = (int64_t)p->dp * p->m;
    collect(f, p, a);
    int64_t taken = how == FILL_ROOM ? fill_room(f, p, a) : fill_ranks(f, p, a);
    if (taken == 0)
        return 0;
    double level, before = plan_mb_time_imbalance(p, a, &level);
    if (fill_save(f, p) != 0)
        return error_runtime(err, "planner", "out of memory");
    memcpy(f->role0, f->role, (size_t)n_mb); /* undone when the try is not kept */
    memset(f->changed, 0, (size_t)n_mb);
    memset(f->given, 0, (size_t)p->n_docs);
    for (int64_t c = 0; c < f->n_cand; c++)
        if (f->cand[c].to_mb >= 0) {
            f->given[f->cand[c].doc] = 1;
            f->changed[f->cand[c].mb] = f->changed[a] = 1;
        }
    for (int64_t c = 0; c < f->n_back; c++)
        f->given[f->back[c].doc] = 1;
    for (int64_t i = 0; i < n_mb; i++)
        if (f->changed[i])
            f->role[i] = i == a ? ROLE_TOOK : f->role[i] == ROLE_NONE ? ROLE_GAVE : f->role[i];
    int rc = fill_rebuild_docs(f, p) != 0 ? error_runtime(err, "planner", "out of memory") : 0;
    /* First the replays alone (a FILL_ROOM taker also anew); when that is not kept, the changed
     * micro-batches anew too. */
    double after_s = 0;
    for (int pass = 0; pass < 2 && rc >= 0; pass++) {
        if (pass == 1) {
            if (rc == 0 && after_s <= *step_s && worst_imbalance(p, f->changed) < before)
                break;
            /* Anew: every micro-batch changed when a replay failed or the step got slower, else
             * those left as uneven as the taker was. */
            for (int64_t i = 0; i < n_mb; i++)
                f->redo[i] = f->changed[i] && (rc != 0 || after_s > *step_s || plan_mb_time_imbalance(p, i, &level) >= before);
        }
        rc = 0;
        p->n_ranges = p->n_segments = p->n_ranks = 0;
        /* The micro-batches laid out anew are laid out at once (plan_shard_lay_out, on the
         * planner's threads), up to PLAN_MAX_THREADS of them ahead of the one copied in. */
        int64_t list[PLAN_MAX_THREADS];
        const Shard *fresh[PLAN_MAX_THREADS];
        int n_fresh = 0, next = 0;
        for (int64_t i = 0; i < n_mb && rc == 0; i++) {
            if (!f->changed[i]) {
                rc = fill_copy_layout(f, p, i) != 0 ? error_runtime(err, "planner", "out of memory") : 0;
                continue;
            }
            if (!anew_at(f, pass, how, a, i)) {
                rc = fill_lay_out(f, p, i, NULL, err);
                continue;
            }
            if (next == n_fresh) {
                n_fresh = next = 0;
                for (int64_t j = i; j < n_mb && n_fresh < PLAN_MAX_THREADS; j++)
                    if (f->changed[j] && anew_at(f, pass, how, a, j))
                        list[n_fresh++] = j;
                if (plan_shard_lay_out(p, list, n_fresh, CP_GROUPS, pl->cost, pl->rank_capacity, pl->threads,
                                       fresh) != 0) {
                    rc = error_runtime(err, "planner", "out of memory");
                    break;
                }
            }
            rc = fill_lay_out(f, p, i, fresh[next++], err);
        }
        if (rc == 0 && (plan_arrange(pl, p, err) != 0 || sched_step_time(p, pl->cost, &after_s, err) != 0))
            rc = -1;
        if (rc == 0 && after_s > *step_s && keep_arrangement(f, p, &after_s, err) != 0)
            rc = -1;
    }
    if (rc < 0)
        return -1;
    if (rc == 0 && after_s <= *step_s && worst_imbalance(p, f->changed) < before) {
        *step_s = after_s;
        for (int64_t c = 0; c < f->n_cand; c++)
            p->filled_sharded += f->cand[c].to_mb >= 0 && f->cand[c].from_rank < 0;
        return taken;
    }
    fill_restore(f, p);
    memcpy(f->role, f->role0, (size_t)n_mb);
    return 0;
}

int fill_alloc(Fill *f, const Planner *pl, const StepPlan *p)
{
    int64_t n_mb = (int64_t)p->dp * p->m;
    /* A micro-batch gains at most a padding piece over the step's documents. */
    int64_t most_docs = p->n_docs + n_mb;
    memset(f, 0, sizeof *f);
    f->pl = pl;
    f->cand = malloc((size_t)most_docs * sizeof *f->cand);
    f->back = malloc((size_t)most_docs * sizeof *f->back);
    f->role = calloc((size_t)n_mb, 1);
    f->role0 = malloc((size_t)n_mb);
    f->changed = malloc((size_t)n_mb);
    f->redo = malloc((size_t)n_mb);
    f->done = malloc((size_t)p->cp);
    f->given = calloc((size_t)most_docs, 1);
    f->src = malloc((size_t)most_docs * sizeof *f->src);
    f->to = malloc((size_t)most_docs * sizeof *f->to);
    f->held = malloc((size_t)p->cp * sizeof *f->held);
    f->tried = calloc((size_t)n_mb, 1);
    f->arranged = malloc((size_t)(2 * n_mb) * sizeof *f->arranged);
    return f->cand && f->back && f->role && f->role0 && f->changed && f->redo && f->done && f->given && f->src &&
                   f->to && f->held && f->tried && f->arranged
               ? 0
               : -1;
}

void fill_free(Fill *f)
{
    fill_saved_free(&f->saved);
    shard_free(&f->shard);
    free(f->cand);
    free(f->back);
    free(f->role);
    free(f->role0);
    free(f->changed);
    free(f->redo);
    free(f->done);
    free(f->given);
    free(f->src);
    free(f->to);
    free(f->segs);
    free(f->held);
    free(f->tried);
    free(f->arranged);
}

int plan_fill_idle(const Planner *pl, StepPlan *p, Error *err)
{
    int64_t n_mb = (int64_t)p->dp * p->m;
    p->filled_docs = p->filled_sharded = 0;
    if (p->cp < 2 || n_mb < 2 || plan_cp_time_imbalance(p) <= FILL_FROM)
        return 0;
    Fill f;
    double step_s, level;
    int rc = 0;
    if (fill_alloc(&f, pl, p) != 0)
        rc = error_runtime(err, "planner", "out of memory");
    else if (sched_step_time(p, pl->cost, &step_s, err) != 0)
        rc = -1;
    /* The step's worst micro-batch takes, while it is above FILL_FROM and has not tried yet (a
     * giver may: it takes from those that have not taken): the imbalance that counts is the worst
     * micro-batch's, and each try costs layouts. First the exact fill, then the room's. */
    while (rc == 0) {
        int64_t a = -1;
        double worst = FILL_FROM;
        for (int64_t i = 0; i < n_mb; i++) {
            double imb = plan_mb_time_imbalance(p, i, &level);
            if (imb > worst) {
                worst = imb;
                a = i;
            }
        }
        if (a < 0 || f.tried[a] || !replayable(&p->mbs[a]))
            break;
        f.tried[a] = 1;
        /* A micro-batch above FILL_AGAIN may also take documents the others shard: what its ranks
         * lack is often more than any whole document that fits. */
        f.sharded_too = worst > FILL_AGAIN;
        int64_t moved = try_fill(&f, p, a, FILL_RANKS, &step_s, err);
        f.sharded_too = 0;
        for (int i = 0; i < (int)(sizeof FILL_SHARES / sizeof *FILL_SHARES) && moved == 0; i++) {
            if (i > 0 && plan_mb_time_imbalance(p, a, &level) <= FILL_AGAIN)
                break;
            f.share = FILL_SHARES[i];
            moved = try_fill(&f, p, a, FILL_ROOM, &step_s, err);
        }
        if (moved < 0)
            rc = -1;
        else
            p->filled_docs += moved;
    }
    fill_free(&f);
    return rc;
}
