/* engine/train/train_search_table.c - the layout search's table (see train_search_table.h). */
#include "engine/train/train_search_table.h"

#include <math.h>
#include <string.h>

typedef void (*CellFn)(char *buf, size_t size, const SearchRow *r, const SearchRow *best);

typedef struct Column {
    const char *header;
    int width;
    int left; /* left-aligned */
    CellFn cell;
} Column;

static void cell_rank(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->rank)
        snprintf(b, n, "%d", r->rank);
    else
        snprintf(b, n, "-");
}

static void cell_layout(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    const SearchLayout *l = &r->layout;
    snprintf(b, n, "%d x %d x %d x %d", l->tp, l->cp, l->pp, l->dp);
}

static void cell_v(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%d", r->layout.v);
}

static void cell_recompute(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%s", config_recompute_name(r->layout.recompute));
}

static void cell_zero(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%d", r->layout.zero);
}

static void cell_s_max(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%lldK", (long long)(r->layout.s_max / 1024));
}

static void cell_cp_mode(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%s", r->layout.cp > 1 ? config_cp_sharding_name(r->layout.sharding) : "-");
}

static void cell_memory(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    snprintf(b, n, "%.1f%s", r->peak / 1e9, r->fits ? "" : "!");
}

static void cell_tps(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->fig.steps)
        snprintf(b, n, "%.0f", r->tps);
    else
        snprintf(b, n, "-");
}

static void cell_vs_best(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    if (r->fig.steps && best && best->tps > 0)
        snprintf(b, n, "%.3f", r->tps / best->tps);
    else
        snprintf(b, n, "-");
}

static void cell_pp_imb(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->fig.steps)
        snprintf(b, n, "%.3f", r->fig.pp_imbalance);
    else
        snprintf(b, n, "-");
}

static void cell_cp_imb(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->fig.steps)
        snprintf(b, n, "%.3f", r->fig.cp_imbalance);
    else
        snprintf(b, n, "-");
}

static void cell_plain(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->has_plain)
        snprintf(b, n, "%.0f", r->plain_tps);
    else
        snprintf(b, n, "-");
}

static void cell_over_plain(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    if (r->has_plain && r->plain_tps > 0 && r->fig.steps)
        snprintf(b, n, "%.3fx", r->tps / r->plain_tps);
    else
        snprintf(b, n, "-");
}

/* Where the step goes (the dry run's time breakdown, its mean stage): the exposed communication and
 * the pipeline bubble, in % of the predicted time. */
static void cell_breakdown(char *b, size_t n, const SearchRow *r, const SearchRow *best)
{
    (void)best;
    const SchedBreakdown *t = &r->fig.breakdown;
    double step = r->fig.predicted_s;
    if (r->fig.steps && step > 0)
        snprintf(b, n, "%.0f%% / %.0f%%", 100 * (t->tp_exposed + t->cp_exposed + t->pp_exposed + t->dp_exposed) / step,
                 100 * fmax(t->bubble, 0) / step); /* a rounding's -0 */
    else
        snprintf(b, n, "-");
}

/* The table's columns, in order. A figure of the dry run becomes a column here (a DryRunFigures
 * field read through r->fig). */
static const Column columns[] = {
    {"#", 3, 0, cell_rank},
    {"tp x cp x pp x dp", 18, 1, cell_layout},
    {"v", 2, 0, cell_v},
    {"recompute", 10, 1, cell_recompute},
    {"zero", 4, 0, cell_zero},
    {"S_max", 6, 0, cell_s_max},
    {"cp mode", 8, 1, cell_cp_mode},
    {"mem GB", 7, 0, cell_memory},
    {"tokens/s", 10, 0, cell_tps},
    {"x best", 6, 0, cell_vs_best},
    {"pp_imb", 6, 0, cell_pp_imb},
    {"cp_imb", 6, 0, cell_cp_imb},
    {"Plain-4D", 10, 0, cell_plain},
    {"wlb/Plain", 9, 0, cell_over_plain},
    {"comm / bubble", 13, 0, cell_breakdown},
};
enum { N_COLUMNS = sizeof columns / sizeof columns[0] };

static void print_row(FILE *f, const SearchRow *r, const SearchRow *best)
{
    char cell[64];
    for (int c = 0; c < N_COLUMNS; c++) {
        columns[c].cell(cell, sizeof cell, r, best);
        fprintf(f, columns[c].left ? "%s%-*s" : "%s%*s", c ? "  " : "", columns[c].width, cell);
    }
    fprintf(f, "%s\n", r->layout.own ? "  <- the config's" : "");
}

void trainer_search_table(FILE *f, const SearchSummary *s, const SearchRow *rows, int n, const SearchRow *own)
{
    fprintf(f, "search: %lld GPUs (%d per node), %d layouts, %d valid, %d fit", (long long)s->gpus, s->gpus_per_node,
            s->candidates, s->valid, s->fit);
    if (s->budget > 0)
        fprintf(f, " %.1f GB per GPU", s->budget / 1e9);
    fprintf(f, ", %d planned (%lld steps each), %.1f s on %d threads\n", s->planned, (long long)s->steps, s->seconds,
            s->threads);
    for (int c = 0; c < N_COLUMNS; c++)
        fprintf(f, columns[c].left ? "%s%-*s" : "%s%*s", c ? "  " : "", columns[c].width, columns[c].header);
    fputc('\n', f);
    const SearchRow *best = n > 0 ? &rows[0] : NULL;
    int shown_own = 0;
    for (int k = 0; k < n && k < SEARCH_TABLE_ROWS; k++) {
        print_row(f, &rows[k], best);
        shown_own |= rows[k].layout.own;
    }
    if (own && !shown_own)
        print_row(f, own, best);
    fprintf(f, "tp x cp x pp x dp: the layout (tp inside a node); v: virtual stages; S_max: "
               "balance.max_tokens_per_micro_batch; mem GB: the worst rank's peak (!: over the budget); tokens/s: "
               "predicted for the cluster; x best: over the first row's; pp_imb, cp_imb: mean over the steps; "
               "Plain-4D: fixed windows and per_seq at the same layout; wlb/Plain: the config's packer over it; comm / "
               "bubble: the exposed communication and the pipeline bubble of the mean stage, %% of the step\n");
    if (own && !own->fits)
        fprintf(f, "the config's own layout does not fit its memory budget (a plain dry run refuses it)\n");
    else if (own && best && own->rank != 1)
        fprintf(f, "the config's own layout is #%d of %d: %.3fx slower than the best\n", own->rank, n,
                own->tps > 0 ? best->tps / own->tps : 0);
    else if (own)
        fprintf(f, "the config's own layout is the fastest\n");
}
