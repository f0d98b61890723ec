/* engine/train/train_search.c - the layout search (see train_search.h): candidates, pruning, planning. */
#include "engine/train/train_search.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_sources.h"
#include "engine/plan/cost.h"
#include "engine/plan/dryrun.h"
#include "engine/train/train_memory.h"
#include "engine/train/train_search_table.h"
#include "engine/train/train_stages.h"
#include "util/clock.h"
#include "util/fileio.h"

/* One candidate: its layout, and what the memory model and the planner say of it. */
typedef struct Candidate {
    SearchLayout l;
    int valid;         /* the config resolved and the layers placed */
    int fits;          /* the worst rank within the budget */
    double peak;       /* the worst rank's bytes */
    Config cfg;        /* resolved, split placed; kept while the candidate is to be planned */
    int held;          /* cfg is held: the candidate is to be planned */
    double check_tps;  /* tokens/s over twice the steps (the ten best only) */
    SearchRow row;
} Candidate;

typedef struct Search {
    const SearchOptions *opt;
    const Config *base;
    char *yaml;         /* the config file's text */
    DataSources data;
    int gpn;            /* GPUs per node: tp stays inside one */
    double budget;      /* bytes a rank may use; 0: not checked */
    Candidate *c;
    int n, cap;
} Search;

/* ---------------------------------------------------------------------------------------------- */
/* Enumeration                                                                                     */

static int add(Search *s, const SearchLayout *l, Error *err)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        Candidate *c = realloc(s->c, (size_t)cap * sizeof *c);
        if (!c)
            return error_runtime(err, "--search", "out of memory");
        s->c = c;
        s->cap = cap;
    }
    Candidate *c = &s->c[s->n++];
    memset(c, 0, sizeof *c);
    c->l = *l;
    return 0;
}

static int is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/* Every layout of `gpus` GPUs (train_search.h, 1.), the CP mode the preferred one (per_seq is added
 * later for the layouts where it does not fit). */
static int enumerate(Search *s, int64_t gpus, Error *err)
{
    const Config *b = s->base;
    const ConfigModel *m = &b->model;
    int64_t w = b->data.context_window, batch = b->data.global_batch_tokens;
    int wlb = b->balance.packer == PACKER_WLB;
    for (int tp = 1; tp <= s->gpn && tp <= gpus; tp++) {
        if (s->gpn % tp || gpus % tp || m->n_heads % tp || m->n_kv_heads % tp)
            continue;
        /* cp halves of the window: cp <= w / 2, so a cluster of a billion GPUs is not counted one by
         * one (dp takes what is left). */
        for (int64_t cp = 1; cp <= gpus / tp && 2 * cp <= w; cp++) {
            if ((gpus / tp) % cp || w % (2 * cp))
                continue;
            for (int64_t pp = 1; pp <= gpus / tp / cp && pp <= m->n_layers; pp++) {
                if ((gpus / tp / cp) % pp)
                    continue;
                int64_t dp = gpus / tp / cp / pp;
                if (batch % (dp * w))
                    continue;
                int64_t mbs = batch / (dp * w); /* micro-batches per replica */
                for (int v = 1; v <= 4; v *= 2) {
                    if (v > 1 && (pp == 1 || mbs % pp || pp * v > m->n_layers))
                        continue;
                    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++)
                        for (int zero = 0; zero <= (dp * cp > 1); zero++)
                            for (int k = 1; k <= 4; k *= 2) {
                                if (k > 1 && (!wlb || k > mbs))
                                    continue;
                                SearchLayout l = {tp, (int)cp, (int)pp, (int)dp, v, zero, (Recompute)r,
                                                  wlb ? k * w : b->balance.max_tokens_per_micro_batch,
                                                  cp == 1 ? b->balance.cp_sharding : is_pow2(cp) ? CP_GROUPS : CP_HYBRID, 0};
                                if (add(s, &l, err) != 0)
                                    return -1;
                            }
                }
            }
        }
    }
    return 0;
}

static SearchLayout own_layout(const Config *b)
{
    const ConfigParallel *p = &b->parallel;
    return (SearchLayout){(int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp, (int)p->virtual_stages, (int)p->zero,
                          b->train.recompute, b->balance.max_tokens_per_micro_batch, b->balance.cp_sharding, 1};
}

static int same_layout(const SearchLayout *a, const SearchLayout *b)
{
    return a->tp == b->tp && a->cp == b->cp && a->pp == b->pp && a->dp == b->dp && a->v == b->v &&
           a->zero == b->zero && a->recompute == b->recompute && a->s_max == b->s_max && a->sharding == b->sharding;
}

/* ---------------------------------------------------------------------------------------------- */
/* A candidate as a config                                                                          */

static int apply(Config *cfg, Error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int apply(Config *cfg, Error *err, const char *fmt, ...)
{
    char set[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(set, sizeof set, fmt, ap);
    va_end(ap);
    return config_apply_set(cfg, set, err);
}

/* cfg: the config file and --set, then the layout's keys, resolved for a dry run, its layers placed. */
static int build(const Search *s, const SearchLayout *l, Config *cfg, Error *err)
{
    const Config *b = s->base;
    config_init(cfg);
    int rc = config_load_string(cfg, s->yaml, s->opt->config_path, err);
    for (int i = 0; i < s->opt->n_sets && rc == 0; i++)
        rc = config_apply_set(cfg, s->opt->sets[i], err);
    if (rc == 0)
        rc = apply(cfg, err, "parallel.tp=%d", l->tp) || apply(cfg, err, "parallel.cp=%d", l->cp) ||
             apply(cfg, err, "parallel.pp=%d", l->pp) || apply(cfg, err, "parallel.dp=%d", l->dp) ||
             apply(cfg, err, "parallel.virtual_stages=%d", l->v) || apply(cfg, err, "parallel.zero=%d", l->zero) ||
             apply(cfg, err, "train.recompute=%s", config_recompute_name(l->recompute)) ||
             apply(cfg, err, "balance.max_tokens_per_micro_batch=%lld", (long long)l->s_max) ||
             apply(cfg, err, "balance.cp_sharding=%s", config_cp_sharding_name(l->sharding)) ||
             /* the config's batch, not one derived from the layout */
             apply(cfg, err, "data.global_batch_tokens=%lld", (long long)b->data.global_batch_tokens)
            ? -1 : 0;
    /* A list of layer counts fits only its own number of model chunks. */
    if (rc == 0 && b->parallel.stage_layers.choice == STAGE_LAYERS_LIST &&
        (int64_t)l->pp * l->v != b->parallel.pp * b->parallel.virtual_stages)
        rc = apply(cfg, err, "parallel.stage_layers=auto");
    if (rc == 0)
        rc = config_resolve(cfg, 0, err);
    if (rc == 0)
        rc = trainer_stage_layers_on(cfg, &s->data, NULL, NULL, err);
    if (rc != 0)
        config_free(cfg);
    return rc;
}

/* Resolves candidate c, places its layers and predicts its memory. An input error (the layout breaks
 * a rule of the config) leaves it invalid; any other is returned. keep: hold its config for planning
 * even when it does not fit (--search-all). */
static int admit(const Search *s, Candidate *c, int keep, Error *err)
{
    Error why = {0};
    if (build(s, &c->l, &c->cfg, &why) != 0) {
        if (why.status == ERROR_INPUT)
            return 0;
        *err = why;
        return -1;
    }
    DryRunMemoryPlan mp;
    if (trainer_memory_plan(&c->cfg, &mp, &why) != 0) {
        config_free(&c->cfg);
        if (why.status == ERROR_INPUT)
            return 0;
        *err = why;
        return -1;
    }
    c->valid = 1;
    c->peak = mp.stages[mp.worst].peak;
    c->fits = s->budget <= 0 || c->peak <= s->budget;
    trainer_memory_free(&mp);
    if (!c->fits && !keep) {
        config_free(&c->cfg);
        return 0;
    }
    c->held = 1;
    return 0;
}

static void release(Candidate *c)
{
    if (c->held) {
        c->held = 0;
        config_free(&c->cfg);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Progress                                                                                        */

typedef struct Progress {
    const char *what;
    int total, done, tty;
    double t0, last;
} Progress;

static void progress_start(Progress *p, const char *what, int total)
{
    double now = clock_seconds();
    *p = (Progress){what, total, 0, isatty(STDERR_FILENO), now, now};
}

/* One more done (called inside a critical section): on a terminal the line is redrawn at most
 * every 0.2 s, elsewhere a line every 10 s. */
static void progress_step(Progress *p)
{
    p->done++;
    double now = clock_seconds();
    if (now - p->last < (p->tty ? 0.2 : 10) && p->done < p->total)
        return;
    if (p->done == p->total && p->last == p->t0)
        return; /* quick enough that no line was needed */
    p->last = now;
    fprintf(stderr, "%ssearch: %s %d/%d layouts, %.0f s%s", p->tty ? "\r" : "", p->what, p->done, p->total,
            now - p->t0, p->tty ? "   " : "\n");
    if (p->tty && p->done == p->total)
        fputc('\n', stderr);
}

/* ---------------------------------------------------------------------------------------------- */
/* The phases                                                                                      */

static int threads(void)
{
    int t = omp_get_max_threads();
    return t > 0 ? t : 1;
}

/* Resolves and sizes every candidate from `first` on; returns how many fit. */
/* A planning thread's task ended: the first error is kept (and stops the tasks not yet started),
 * and the progress line moves on. */
static void task_done(int rc, const Error *e, int *failed, Error *first_err, Progress *pr)
{
#pragma omp critical(search_progress)
    {
        if (rc != 0 && !*failed) {
#pragma omp atomic write
            *failed = 1;
            *first_err = *e;
        }
        if (pr)
            progress_step(pr);
    }
}

static int admit_all(Search *s, int first, int keep, Progress *pr, Error *err)
{
    int failed = 0;
    Error first_err = {0};
#pragma omp parallel for num_threads(threads()) schedule(dynamic, 4)
    for (int i = first; i < s->n; i++) {
        Error e = {0};
        int rc = 0, stop;
#pragma omp atomic read
        stop = failed;
        if (!stop)
            rc = admit(s, &s->c[i], keep, &e);
        task_done(rc, &e, &failed, &first_err, pr);
    }
    if (failed) {
        *err = first_err;
        return -1;
    }
    int fits = 0;
    for (int i = first; i < s->n; i++)
        fits += s->c[i].valid && s->c[i].fits;
    return fits;
}

/* What a planning pass records: the ranking's figures, Plain-4D's beside them, or the tokens/s over
 * twice the steps (the stability check). */
typedef enum PlanPass { PASS_RANK, PASS_PLAIN, PASS_CHECK } PlanPass;

/* Plans list[0 .. n) (candidate indices), several at once with one planning thread each. */
static int plan_all(Search *s, const int *list, int n, PlanPass pass, Progress *pr, Error *err)
{
    int failed = 0;
    Error first_err = {0};
#pragma omp parallel for num_threads(threads()) schedule(dynamic, 1)
    for (int j = 0; j < n; j++) {
        Candidate *c = &s->c[list[j]];
        Error e = {0};
        int rc = 0, stop;
#pragma omp atomic read
        stop = failed;
        if (!stop) {
            /* One planning thread: the layouts themselves fill the cores (the planner's threads only
             * change how fast a step is planned, never the plan). */
            Config one = c->cfg;
            one.balance.plan_threads = 1;
            DryRunFigures f;
            int64_t steps = pass == PASS_CHECK ? 2 * s->opt->steps : s->opt->steps;
            rc = dryrun_predict(&one, &s->data, steps, pass == PASS_PLAIN, &f, &e);
            if (rc == 0 && pass == PASS_PLAIN) {
                c->row.plain_tps = f.baseline_s > 0 ? (double)f.tokens / f.baseline_s : 0;
                c->row.has_plain = 1;
            } else if (rc == 0 && pass == PASS_CHECK) {
                c->check_tps = f.predicted_s > 0 ? (double)f.tokens / f.predicted_s : 0;
            } else if (rc == 0) {
                c->row.fig = f;
                c->row.tps = f.predicted_s > 0 ? (double)f.tokens / f.predicted_s : 0;
            }
        }
        task_done(rc, &e, &failed, &first_err, pr);
    }
    if (failed) {
        *err = first_err;
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* No layout fits                                                                                  */

/* The candidate of least memory among s->c[first ..), or -1. */
static int least_memory(const Search *s, int first)
{
    int best = -1;
    for (int i = first; i < s->n; i++)
        if (s->c[i].valid && (best < 0 || s->c[i].peak < s->c[best].peak))
            best = i;
    return best;
}

static void layout_text(const SearchLayout *l, char *buf, size_t size)
{
    snprintf(buf, size, "tp %d, cp %d, pp %d, dp %d%s, train.recompute: %s%s", l->tp, l->cp, l->pp, l->dp,
             l->v > 1 ? ", virtual_stages > 1" : "", config_recompute_name(l->recompute),
             l->zero ? ", parallel.zero: 1" : "");
}

/* The Error when no layout of `gpus` fits: the least a rank needs, and the fewest GPUs (doubling, up
 * to 64 times) with a layout that fits, as the layout of least memory there. */
static int no_fit(Search *s, int64_t gpus, Error *err)
{
    char least[256] = "", more[400] = "";
    int i = least_memory(s, 0);
    double need = i >= 0 ? s->c[i].peak : 0;
    if (i >= 0)
        layout_text(&s->c[i].l, least, sizeof least);
    for (int64_t g = 2 * gpus; g <= 64 * gpus && !more[0]; g *= 2) {
        int first = s->n;
        if (enumerate(s, g, err) != 0)
            return -1;
        int fits = admit_all(s, first, 0, NULL, err);
        if (fits < 0)
            return -1;
        int best = -1;
        for (int k = first; k < s->n; k++)
            if (s->c[k].valid && s->c[k].fits && (best < 0 || s->c[k].peak < s->c[best].peak))
                best = k;
        if (best >= 0) {
            char l[256];
            layout_text(&s->c[best].l, l, sizeof l);
            snprintf(more, sizeof more, "%lld GPUs would fit: %s (%.1f GB)", (long long)g, l, s->c[best].peak / 1e9);
        }
        for (int k = first; k < s->n; k++)
            release(&s->c[k]);
    }
    if (i < 0)
        return error_set(err, "--search", "no layout of %lld GPUs is valid for this model and batch (tp inside a node of "
                         "%d dividing the heads, cp with the window a multiple of 2 cp, the batch a multiple of dp "
                         "windows)%s%s", (long long)gpus, s->gpn, more[0] ? "; " : "", more);
    return error_set(err, "--search", "no layout of %lld GPUs fits %.1f GB per GPU: the least memory is %.1f GB (%s); "
                     "%s", (long long)gpus, s->budget / 1e9, need / 1e9, least,
                     more[0] ? more : "nor would 64 times as many GPUs");
}

/* ---------------------------------------------------------------------------------------------- */

/* --stats-out: one JSON object per candidate that resolved, in the order enumerated. */
static int write_stats(const Search *s, Error *err)
{
    AtomicFile f = {0};
    if (atomic_open(&f, s->opt->stats_out, err) != 0)
        return -1;
    for (int i = 0; i < s->n; i++) {
        const Candidate *c = &s->c[i];
        const SearchLayout *l = &c->l;
        if (!c->valid)
            continue;
        fprintf(f.f, "{\"tp\":%d,\"cp\":%d,\"pp\":%d,\"dp\":%d,\"virtual_stages\":%d,\"recompute\":\"%s\",\"zero\":%d,"
                     "\"max_tokens_per_micro_batch\":%lld,\"cp_sharding\":\"%s\",\"own\":%s,\"fits\":%s,\"peak_gb\":%.4g",
                l->tp, l->cp, l->pp, l->dp, l->v, config_recompute_name(l->recompute), l->zero, (long long)l->s_max,
                config_cp_sharding_name(l->sharding), l->own ? "true" : "false", c->fits ? "true" : "false",
                c->peak / 1e9);
        if (c->row.fig.steps)
            fprintf(f.f, ",\"rank\":%d,\"steps\":%lld,\"tokens\":%lld,\"predicted_s\":%.9g,\"tokens_per_s\":%.9g,"
                         "\"pp_imbalance\":%.6g,\"cp_imbalance\":%.6g",
                    c->row.rank, (long long)c->row.fig.steps, (long long)c->row.fig.tokens, c->row.fig.predicted_s,
                    c->row.tps, c->row.fig.pp_imbalance, c->row.fig.cp_imbalance);
        if (c->row.has_plain)
            fprintf(f.f, ",\"plain_tokens_per_s\":%.9g", c->row.plain_tps);
        fputs("}\n", f.f);
    }
    return atomic_commit(&f, err);
}

/* The stability check's verdict: whether the first of the ten best over `steps` steps is still the
 * first over twice as many. */
static void print_stability(const Search *s, Candidate *const *order, int n)
{
    if (n < 2)
        return;
    int first = 0;
    for (int k = 1; k < n; k++)
        if (order[k]->check_tps > order[first]->check_tps)
            first = k;
    long long steps = (long long)s->opt->steps;
    if (first == 0)
        printf("steps: enough - over %lld steps the first of the ten is still the fastest (%.0f tokens/s, %.3fx the "
               "second)\n", 2 * steps, order[0]->check_tps,
               order[0]->check_tps / fmax(order[1]->check_tps, 1e-300));
    else
        printf("steps: NOT enough - over %lld steps #%d is the fastest of the ten (%.0f tokens/s, %.3fx the first's "
               "%.0f): run the search with --steps %lld or more\n", 2 * steps, first + 1, order[first]->check_tps,
               order[first]->check_tps / fmax(order[0]->check_tps, 1e-300), order[0]->check_tps, 2 * steps);
}

static int by_speed(const void *a, const void *b)
{
    const Candidate *x = *(const Candidate *const *)a, *y = *(const Candidate *const *)b;
    if (x->row.tps != y->row.tps)
        return x->row.tps > y->row.tps ? -1 : 1;
    /* Ties: the less memory first. */
    return x->peak < y->peak ? -1 : x->peak > y->peak;
}

static int write_best(const Search *s, const Candidate *best, int n_ranked, Error *err)
{
    AtomicFile f = {0};
    char l[256];
    if (atomic_open(&f, s->opt->out, err) != 0)
        return -1;
    layout_text(&best->l, l, sizeof l);
    fprintf(f.f, "# The fastest of %d layouts of %s on %lld GPUs that fit, by wlbtrain --dry-run --search\n"
                 "# (%lld steps): %s, S_max %lld, cp_sharding %s; predicted %.0f tokens/s, %.1f GB per rank.\n"
                 "# A plain dry run reproduces it: wlbtrain --config THIS_FILE --dry-run --steps %lld\n",
            n_ranked, s->opt->config_path, (long long)best->l.tp * best->l.cp * best->l.pp * best->l.dp,
            (long long)s->opt->steps, l, (long long)best->l.s_max, config_cp_sharding_name(best->l.sharding),
            best->row.tps, best->peak / 1e9, (long long)s->opt->steps);
    int rc = config_print(&best->cfg, f.f, err);
    if (rc == 0)
        return atomic_commit(&f, err);
    atomic_abort(&f);
    return -1;
}

int trainer_search_run(const Config *cfg, const SearchOptions *opt, Error *err)
{
    Search s = {opt, cfg, NULL, {0}, 0, trainer_memory_budget(cfg), NULL, 0, 0};
    size_t len;
    CostModel cost;
    int64_t gpus = opt->gpus ? opt->gpus : cfg->parallel.tp * cfg->parallel.cp * cfg->parallel.pp * cfg->parallel.dp;
    if (cfg->data.global_batch_tokens <= 0)
        return error_set(err, "data.global_batch_tokens", "the search compares layouts on the same batch: set it (a "
                         "multiple of data.context_window)");
    /* The outputs before the search (which may take minutes): writable, and --search-out never the
     * config it reads. */
    struct stat so, sc;
    if (opt->out && stat(opt->out, &so) == 0 && stat(opt->config_path, &sc) == 0 && so.st_dev == sc.st_dev &&
        so.st_ino == sc.st_ino)
        return error_set(err, "--search-out", "%s is the config the search reads (%s): give another file", opt->out,
                         opt->config_path);
    if (opt->out && file_check_writable(opt->out, 0, "--search-out", err) != 0)
        return -1;
    if (opt->stats_out && file_check_writable(opt->stats_out, 0, "--stats-out", err) != 0)
        return -1;
    if (cost_model_init(&cost, cfg, err) != 0)
        return -1;
    s.gpn = cost.hw.gpus_per_node > 0 ? cost.hw.gpus_per_node : 1;
    if (file_read_text(opt->config_path, "YAML text file", &s.yaml, &len, err) != 0)
        return -1;
    const ConfigData *d = &cfg->data;
    if (data_sources_open(&s.data, d->path.v, d->weights.n ? d->weights.v : NULL, d->path.n, d->lengths_file,
                          d->lengths_column, err) != 0) {
        dryrun_data_hint(cfg, err);
        free(s.yaml);
        return -1;
    }
    double t0 = clock_seconds();
    int rc = enumerate(&s, gpus, err);
    /* The config's own layout, when it is one of this cluster's. */
    SearchLayout own = own_layout(cfg);
    int own_i = -1;
    if (rc == 0 && (int64_t)own.tp * own.cp * own.pp * own.dp == gpus) {
        for (int i = 0; i < s.n && own_i < 0; i++)
            if (same_layout(&s.c[i].l, &own))
                own_i = i;
        if (own_i < 0 && (rc = add(&s, &own, err)) == 0)
            own_i = s.n - 1;
        if (own_i >= 0)
            s.c[own_i].l.own = 1;
    }
    Progress pr;
    int fits = 0;
    if (rc == 0) {
        progress_start(&pr, "sizing", s.n);
        fits = admit_all(&s, 0, opt->all, &pr, err);
        rc = fits < 0 ? -1 : 0;
    }
    /* per_seq where the preferred CP mode does not fit (its rank holds only its share of a micro-batch). */
    if (rc == 0) {
        int first = s.n;
        for (int i = 0; i < first && rc == 0; i++) {
            SearchLayout l = s.c[i].l;
            if (!s.c[i].valid || s.c[i].fits || l.cp == 1 || l.sharding == CP_PER_SEQ || l.own)
                continue;
            l.sharding = CP_PER_SEQ;
            rc = add(&s, &l, err);
        }
        int more = rc == 0 && s.n > first ? admit_all(&s, first, opt->all, NULL, err) : 0;
        rc = more < 0 ? -1 : rc;
        fits += more > 0 ? more : 0;
    }
    int valid = 0;
    for (int i = 0; i < s.n; i++)
        valid += s.c[i].valid;
    if (rc == 0 && fits == 0)
        rc = no_fit(&s, gpus, err);
    /* Plan every survivor. */
    int *list = rc == 0 ? malloc((size_t)s.n * sizeof *list) : NULL;
    Candidate **order = rc == 0 ? malloc((size_t)s.n * sizeof *order) : NULL;
    if (rc == 0 && (!list || !order))
        rc = error_runtime(err, "--search", "out of memory");
    int n_plan = 0, n_ranked = 0, n_check = 0;
    if (rc == 0) {
        for (int i = 0; i < s.n; i++)
            if (s.c[i].held)
                list[n_plan++] = i;
        progress_start(&pr, "planning", n_plan);
        rc = plan_all(&s, list, n_plan, PASS_RANK, &pr, err);
    }
    if (rc == 0) {
        for (int i = 0; i < s.n; i++) {
            Candidate *c = &s.c[i];
            if (c->held && c->fits)
                order[n_ranked++] = c;
        }
        qsort(order, (size_t)n_ranked, sizeof *order, by_speed);
        for (int k = 0; k < n_ranked; k++)
            order[k]->row.rank = k + 1;
        /* Plain-4D at the same layout: the ten best and the config's own. */
        int n_base = 0;
        for (int k = 0; k < n_ranked && k < SEARCH_TABLE_ROWS; k++)
            list[n_base++] = (int)(order[k] - s.c);
        if (own_i >= 0 && s.c[own_i].held) {
            int listed = 0;
            for (int k = 0; k < n_base; k++)
                listed |= list[k] == own_i;
            if (!listed)
                list[n_base++] = own_i;
        }
        rc = plan_all(&s, list, n_base, PASS_PLAIN, NULL, err);
        /* Enough steps? The ten best again over twice the steps: the same first, or a warning. */
        n_check = n_ranked < SEARCH_TABLE_ROWS ? n_ranked : SEARCH_TABLE_ROWS;
        for (int k = 0; k < n_check; k++)
            list[k] = (int)(order[k] - s.c);
        if (rc == 0)
            rc = plan_all(&s, list, n_check, PASS_CHECK, NULL, err);
    }
    if (rc == 0) {
        SearchRow *rows = malloc((size_t)(n_ranked + 1) * sizeof *rows);
        if (!rows) {
            rc = error_runtime(err, "--search", "out of memory");
        } else {
            for (int k = 0; k < n_ranked; k++) {
                rows[k] = order[k]->row;
                rows[k].layout = order[k]->l;
                rows[k].peak = order[k]->peak;
                rows[k].rank = k + 1;
            }
            SearchRow own_row = {0};
            const SearchRow *own_p = NULL;
            if (own_i >= 0 && s.c[own_i].valid) {
                own_row = s.c[own_i].row;
                own_row.layout = s.c[own_i].l;
                own_row.peak = s.c[own_i].peak;
                own_row.fits = s.c[own_i].fits;
                for (int k = 0; k < n_ranked; k++)
                    if (order[k] == &s.c[own_i])
                        own_row.rank = k + 1;
                own_p = &own_row;
            }
            for (int k = 0; k < n_ranked; k++)
                rows[k].fits = 1;
            SearchSummary sum = {gpus, s.gpn, opt->steps, s.budget, s.n, valid, fits, n_plan, clock_seconds() - t0,
                                 threads()};
            trainer_search_table(stdout, &sum, rows, n_ranked, own_p);
            print_stability(&s, order, n_check);
            free(rows);
        }
    }
    if (rc == 0 && opt->stats_out)
        rc = write_stats(&s, err);
    if (rc == 0 && opt->out && n_ranked > 0)
        rc = write_best(&s, order[0], n_ranked, err);
    free(list);
    free(order);
    for (int i = 0; i < s.n; i++)
        release(&s.c[i]);
    free(s.c);
    data_sources_close(&s.data);
    free(s.yaml);
    return rc;
}
