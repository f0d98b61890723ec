/*
 * test/plan_checks.c - see plan_checks.h.
 */
#include "test/plan_checks.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_groups.h"
#include "test/testlib.h"

void check_layout_mb(const StepPlan *p, int64_t i)
{
    const PlanMicroBatch *mb = &p->mbs[i];
    int64_t T = mb->tokens;
    int *holder = malloc(sizeof(int) * (size_t)(T + 1));
    int64_t *doc_start = malloc(sizeof(int64_t) * (size_t)(T + 1));
    int *seen = calloc((size_t)T + 1, sizeof(int));
    for (int64_t t = 0; t < T; t++)
        holder[t] = -1;
    for (int64_t k = 0; k < mb->n_docs; k++) {
        const PlanDoc *d = &p->docs[mb->first_doc + k];
        for (int64_t t = d->start; t < d->start + d->len; t++)
            doc_start[t] = d->start;
    }
    for (int r = 0; r < p->cp; r++) {
        const PlanRank *pr = &p->ranks[mb->first_rank + r];
        int64_t tokens = 0;
        for (int64_t i = 0; i < pr->n_ranges; i++) {
            const PlanRange *g = &p->ranges[pr->first_range + i];
            assert_int_equal(g->rank, r);
            assert_true(g->len > 0 && g->start >= 0 && g->start + g->len <= T);
            for (int64_t t = g->start; t < g->start + g->len; t++) {
                assert_int_equal(holder[t], -1); /* held once */
                holder[t] = r;
            }
            tokens += g->len;
        }
        assert_int_equal(tokens, pr->tokens);
        for (int64_t i = 0; i < pr->n_segments; i++) {
            const PlanSegment *g = &p->segments[pr->first_segment + i];
            assert_int_equal(g->rank, r);
            assert_true(g->q_len > 0 && g->kv_start <= g->q_start);
            for (int64_t t = g->q_start; t < g->q_start + g->q_len; t++) {
                /* The query token is this rank's, computed once, and sees exactly its document's
                 * tokens up to itself: keys [kv_start, t] must be [doc_start(t), t]. */
                assert_int_equal(holder[t], r);
                seen[t]++;
                assert_int_equal(g->kv_start, doc_start[t]);
            }
        }
    }
    for (int64_t t = 0; t < T; t++) {
        assert_true(holder[t] >= 0); /* held */
        assert_int_equal(seen[t], 1); /* queried exactly once */
    }
    /* A document kept whole lies on its rank, entirely. */
    for (int64_t k = 0; k < mb->n_docs; k++) {
        const PlanDoc *d = &p->docs[mb->first_doc + k];
        if (d->rank >= 0)
            for (int64_t t = d->start; t < d->start + d->len; t++)
                assert_int_equal(holder[t], d->rank);
    }
    free(holder);
    free(doc_start);
    free(seen);
}


int *holders_mb(const StepPlan *p, int64_t i)
{
    const PlanMicroBatch *mb = &p->mbs[i];
    int *holder = malloc(sizeof(int) * (size_t)(mb->tokens + 1));
    assert_non_null(holder);
    for (int r = 0; r < p->cp; r++) {
        const PlanRank *pr = &p->ranks[mb->first_rank + r];
        for (int64_t i = 0; i < pr->n_ranges; i++) {
            const PlanRange *g = &p->ranges[pr->first_range + i];
            for (int64_t t = g->start; t < g->start + g->len; t++)
                holder[t] = r;
        }
    }
    return holder;
}


GroupsSeen check_groups_mb(const StepPlan *p, int64_t i, const CostModel *m, int64_t capacity)
{
    const PlanMicroBatch *mb = &p->mbs[i];
    int cp = p->cp, *holder = holders_mb(p, i);
    const PlanRank *pr = &p->ranks[mb->first_rank];
    GroupsSeen seen = {0, 0, 0};
    int64_t blk_tok[2048] = {0}, own[1024][12];
    int uneven[2048] = {0}, sizes = 0;
    memset(own, 0, sizeof own);
    for (int64_t k = 0; k < mb->n_docs; k++) {
        const PlanDoc *d = &p->docs[mb->first_doc + k];
        int f = d->group_first, g = d->group_size;
        assert_true(g >= 1 && (g & (g - 1)) == 0 && f % g == 0 && f + g <= cp);
        if (g == 1) {
            assert_int_equal(d->rank, f);
            sizes |= 1;
            continue;
        }
        assert_int_equal(d->rank, -1);
        sizes |= g;
        int v = plan_block_of(cp, f, g), h = plan_block_depth(v);
        int64_t held[1024] = {0};
        for (int64_t t = d->start; t < d->start + d->len; t++) {
            int r = holder[t];
            assert_true(r >= f && r < f + g);
            held[r]++;
            own[r][h]++;
        }
        blk_tok[v] += d->len;
        /* Two chunks of len / 2g tokens each, the leftovers one more (per_seq cuts the micro-batch
         * instead), or cut unevenly. */
        int per_doc = 1;
        for (int r = f; r < f + g && mb->mode != CP_PER_SEQ; r++)
            per_doc &= held[r] >= 2 * (d->len / (2 * g)) && held[r] <= 2 * (d->len / (2 * g)) + 2;
        seen.cut += !per_doc;
        uneven[v] |= !per_doc;
    }
    assert_true(seen.cut <= EVEN_MAX);
    for (int r = 0; r < cp; r++) {
        assert_true(pr[r].tokens <= capacity);
        uint32_t want = 0;
        /* Each block's price: uneven (a cut document seen) or not; a cut that happens to give
         * per_doc's shares is priced uneven by the planner and looks even here, so either price
         * is accepted for a block that looks even. */
        double even_price[12], cut_price[12];
        int nb = 0, must_cut[12];
        for (int v = (cp + r) / 2; v >= 1; v /= 2) {
            if (blk_tok[v] == 0)
                continue;
            int h = plan_block_depth(v), g = plan_block_size(cp, v), first = plan_block_first(cp, v);
            want |= 1u << h;
            int64_t least = blk_tok[v];
            for (int q = first; q < first + g; q++)
                least = own[q][h] < least ? own[q][h] : least;
            even_price[nb] = cost_cp_comm_group_s(m, g, blk_tok[v]);
            cut_price[nb] = cost_cp_comm_group_s(m, g, ((blk_tok[v] - least) * g + g - 2) / (g - 1));
            must_cut[nb++] = uneven[v];
        }
        assert_int_equal(pr[r].exchanges, want);
        seen.nested += __builtin_popcount(want) >= 2;
        if (mb->mode == CP_GROUPS) {
            /* The exchange whole: its exposed part and contention, and what hid beside attention. */
            double got = pr[r].comm_fwd_s - cost_tp_comm_s(m, pr[r].tokens) +
                         (1 - m->hw.comm_sm_share) * pr[r].cp_hidden_fwd_s;
            int match = 0;
            for (int c = 0; c < 1 << nb && !match; c++) {
                double comm = 0;
                int ok = 1;
                for (int b = 0; b < nb; b++) {
                    ok &= !must_cut[b] || (c >> b & 1);
                    comm += c >> b & 1 ? cut_price[b] : even_price[b];
                }
                match = ok && fabs(got - comm) <= 1e-9 * comm + 1e-15;
            }
            if (!match) {
                print_error("rank %d: exchange %.17g, not the plan's blocks' all-gathers\n", r, got);
                fail();
            }
        }
    }
    free(holder);
    seen.sizes = __builtin_popcount((unsigned)sizes);
    return seen;
}


int64_t check_step_limits(const StepPlan *p, const Planner *pl)
{
    int64_t n_mb = (int64_t)p->dp * p->m, unit = pl->packer == PACKER_WLB && p->cp > 1 ? 2 * p->cp : 1;
    int64_t cap = pl->packer == PACKER_WLB ? pl->s_max : pl->window, largest = 0, tokens = 0, pad = 0;
    assert_int_equal(n_mb, pl->n_mb);
    assert_int_equal(cap % unit, 0); /* else padding could take a micro-batch past it */
    /* What the trainer reserves for the largest micro-batch and one CP rank's rows of it, and the
     * memory check prices: every plan must fit in it. */
    int64_t reserved_tokens, reserved_rows;
    plan_largest(pl, &reserved_tokens, &reserved_rows);
    for (int64_t i = 0; i < n_mb; i++) {
        const PlanMicroBatch *mb = &p->mbs[i];
        if (mb->tokens > cap || mb->tokens > reserved_tokens) {
            print_error("step %lld: micro-batch %lld of %lld holds %lld tokens, over its cap of %lld (%s packer: %s)\n",
                        (long long)p->step + 1, (long long)i, (long long)n_mb, (long long)mb->tokens, (long long)cap,
                        config_packer_name(pl->packer),
                        pl->packer == PACKER_WLB ? "S_max, balance.max_tokens_per_micro_batch" : "the window");
            fail();
        }
        largest = mb->tokens > largest ? mb->tokens : largest;
        int64_t at = 0, data = 0;
        for (int64_t k = 0; k < mb->n_docs; k++) {
            const PlanDoc *d = &p->docs[mb->first_doc + k];
            assert_int_equal(d->start, at);
            assert_true(d->len > 0 && d->len <= pl->window);
            if (d->source == PLAN_PAD_SOURCE)
                assert_int_equal(k, mb->n_docs - 1); /* the padding is the last piece */
            else
                data += d->len;
            at += d->len;
        }
        assert_int_equal(at, mb->tokens);
        assert_int_equal(mb->pad, mb->tokens - data);
        assert_true(mb->pad < unit);
        assert_int_equal(mb->tokens % unit, 0);
        int64_t held = 0;
        for (int r = 0; r < p->cp; r++) {
            const PlanRank *pr = &p->ranks[mb->first_rank + r];
            if (pr->tokens < 0 || pr->tokens > pl->rank_capacity || pr->tokens > reserved_rows) {
                print_error("step %lld: micro-batch %lld (%s): CP rank %d holds %lld rows; its capacity is %lld, the "
                            "trainer reserves %lld (plan_largest)\n", (long long)p->step + 1, (long long)i,
                            config_cp_sharding_name(mb->mode), r, (long long)pr->tokens, (long long)pl->rank_capacity,
                            (long long)reserved_rows);
                fail();
            }
            held += pr->tokens;
        }
        assert_int_equal(held, mb->tokens);
        tokens += data;
        pad += mb->pad;
    }
    assert_int_equal(tokens, p->tokens);
    assert_int_equal(pad, p->pad_tokens);
    return largest;
}

int64_t plan_step_checked(Planner *pl, StepPlan *p)
{
    Error err = {0};
    if (plan_step(pl, p, &err) != 0) {
        print_error("plan_step: %s\n", err.msg);
        fail();
    }
    return check_step_limits(p, pl);
}

int64_t check_stats_mb_cap(const char *stats, int64_t cap, int64_t *n_mb)
{
    FILE *f = fopen(stats, "r");
    assert_non_null(f);
    static char line[1 << 20];
    int64_t largest = 0, count = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je), *mbs = json_object_get(o, "mb_tokens");
        assert_non_null(o);
        if (json_object_get(o, "summary")) {
            json_decref(o);
            continue;
        }
        assert_true(json_is_array(mbs) && json_array_size(mbs) > 0);
        size_t i;
        json_t *v;
        json_array_foreach(mbs, i, v)
        {
            int64_t t = json_integer_value(v);
            if (t > cap) {
                print_error("%s: step %lld: micro-batch %zu of %zu holds %lld tokens, over the cap of %lld\n", stats,
                            (long long)json_integer_value(json_object_get(o, "step")), i, json_array_size(mbs),
                            (long long)t, (long long)cap);
                json_decref(o);
                fclose(f);
                fail();
            }
            largest = t > largest ? t : largest;
            count++;
        }
        json_decref(o);
    }
    fclose(f);
    if (n_mb)
        *n_mb = count;
    return largest;
}
