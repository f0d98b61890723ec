/*
 * config/config_resolve.c - from the keys as written to the config a run uses.
 *
 * 1. model.preset fills the model keys not set explicitly, then the config.json of train.init_from's
 *    model folder the ones still unset (and must agree with the others); model keys without either are
 *    required.
 * 2. Derived defaults: keys the user did not set whose default depends on other keys.
 * 3. parallel.dp: auto becomes world / (tp*cp*pp) when the job is launched (world_size > 0).
 * 4. Cross-field rules. Each error points at the key that is most likely wrong, as written.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_keys.h"
#include "util/parse.h"
#include "util/trace.h"

static int key(const char *name)
{
    int k = config_key_find(name);
    if (k < 0) { /* a typo in this file, not in the user's config */
        Error err;
        error_runtime(&err, "config", "internal: no key named %s", name);
        error_exit(&err);
    }
    return k;
}

static int explicit_(const Config *cfg, int k)
{
    return cfg->origin[k].kind == ORIGIN_FILE || cfg->origin[k].kind == ORIGIN_SET;
}

/* Error at the first of the named keys that was set explicitly (else at the config file), with
 * the message prefixed by the first key's name: "WHERE: KEY: what". */
static int rule_error(const Config *cfg, Error *err, const char *subject, const char *other, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int rule_error(const Config *cfg, Error *err, const char *subject, const char *other, const char *fmt, ...)
{
    int ks = key(subject), k = ks;
    if (!explicit_(cfg, ks) && other && explicit_(cfg, key(other)))
        k = key(other);
    char where[1200], what[800];
    config_where(cfg, k, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return error_set(err, where, "%s: %s", subject, what);
}

/* Sets an integer key that the user left at its default to a derived value. */
static void derive_int(Config *cfg, const char *name, int64_t value)
{
    int k = key(name);
    if (explicit_(cfg, k) || cfg->origin[k].kind == ORIGIN_DERIVED)
        return;
    *CONFIG_FIELD(cfg, k, int64_t) = value;
    cfg->origin[k].kind = ORIGIN_DERIVED;
}

/* Default outlier thresholds for a window W: see docs/planner.md, "Choosing the outlier thresholds". */
static int derive_outlier_thresholds(Config *cfg, Error *err)
{
    int k = key("balance.outlier_thresholds");
    if (explicit_(cfg, k) || cfg->origin[k].kind == ORIGIN_DERIVED)
        return 0;
    ConfigIntList *l = CONFIG_FIELD(cfg, k, ConfigIntList);
    int64_t w = cfg->data.context_window;
    /* Four queues from an eighth, a quarter, a half and three quarters of the window: measured on
     * the real length lists for the WLB-LLM configurations (bench/outlier_thresholds.sh), the
     * fewest queues that keep the pipeline imbalance of wlb + hybrid at 7B-128K within the issue's
     * bounds (mean 1.03, p95 1.10) on every list, the heavy-tailed Linux list included: a queue
     * spans at most 1.5x in length (2.25x in attention cost) above 3W/4, where the window-size
     * pieces of documents longer than the window queue with the documents of 3W/4 to W. The price is
     * a mean token delay of about 0.7 steps (two queues: 0.4). */
    int64_t t[4] = {w / 8, w / 4, w / 2, 3 * w / 4};
    int64_t *v = malloc(sizeof t);
    if (!v)
        return error_runtime(err, "config", "out of memory");
    int n = 0; /* tiny windows: only the distinct positive ones */
    for (int i = 0; i < 4; i++)
        if (t[i] > 0 && (n == 0 || t[i] > v[n - 1]))
            v[n++] = t[i];
    free(l->v);
    l->v = v;
    l->n = n;
    cfg->origin[k].kind = ORIGIN_DERIVED;
    return 0;
}

static int check_model(const Config *cfg, Error *err)
{
    const ConfigModel *m = &cfg->model;
    for (int k = 0; k < config_n_keys; k++) {
        const ConfigKey *ck = &config_keys[k];
        if (!strncmp(ck->name, "model.", 6) && !ck->def && cfg->origin[k].kind == ORIGIN_DEFAULT) {
            char where[1200];
            config_where(cfg, k, where, sizeof where);
            return error_set(err, where, "%s: required (set it, or model.preset for a named shape)", ck->name);
        }
    }
    if (m->d_model % m->n_heads)
        return rule_error(cfg, err, "model.n_heads", "model.d_model", "must divide model.d_model (%lld), got %lld",
                          (long long)m->d_model, (long long)m->n_heads);
    if ((m->d_model / m->n_heads) % 2)
        return rule_error(cfg, err, "model.d_model", "model.n_heads",
                          "the head size d_model / n_heads = %lld must be even (RoPE rotates pairs)",
                          (long long)(m->d_model / m->n_heads));
    if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads)
        return rule_error(cfg, err, "model.n_kv_heads", "model.n_heads", "must divide model.n_heads (%lld), got %lld",
                          (long long)m->n_heads, (long long)m->n_kv_heads);
    return 0;
}

void config_even_layers(int64_t n_layers, int n_chunks, int64_t *out)
{
    for (int g = 0; g < n_chunks; g++)
        out[g] = n_layers / n_chunks + (g < n_layers % n_chunks);
}

/* parallel.chunk_layers from parallel.stage_layers: the even split, or the list once checked (one
 * count per model chunk, none 0, adding up to model.n_layers); empty for auto (the engine's). */
static int resolve_stage_layers(Config *cfg, Error *err)
{
    ConfigParallel *p = &cfg->parallel;
    const ConfigIntList *list = &p->stage_layers.list;
    int chunks = (int)(p->pp * p->virtual_stages);
    free(p->chunk_layers.v);
    p->chunk_layers = (ConfigIntList){0, NULL};
    if (p->stage_layers.choice == STAGE_LAYERS_AUTO)
        return 0;
    if (p->stage_layers.choice == STAGE_LAYERS_LIST) {
        int64_t sum = 0;
        if (list->n != chunks)
            return rule_error(cfg, err, "parallel.stage_layers", NULL,
                              "%d counts for %d model chunks: one per pipeline stage%s (pp %lld x virtual_stages %lld)",
                              list->n, chunks, p->virtual_stages > 1 ? " and virtual stage" : "", (long long)p->pp,
                              (long long)p->virtual_stages);
        for (int g = 0; g < chunks; g++) {
            if (list->v[g] == 0)
                return rule_error(cfg, err, "parallel.stage_layers", NULL,
                                  "model chunk %d (stage %lld) has no layer; every chunk needs at least one", g,
                                  (long long)(g % p->pp));
            sum += list->v[g];
        }
        if (sum != cfg->model.n_layers)
            return rule_error(cfg, err, "parallel.stage_layers", "model.n_layers",
                              "the counts add up to %lld layers, model.n_layers is %lld", (long long)sum,
                              (long long)cfg->model.n_layers);
    }
    int64_t *v = malloc((size_t)chunks * sizeof *v);
    if (!v)
        return error_runtime(err, "config", "out of memory");
    if (p->stage_layers.choice == STAGE_LAYERS_LIST)
        memcpy(v, list->v, (size_t)chunks * sizeof *v);
    else
        config_even_layers(cfg->model.n_layers, chunks, v);
    p->chunk_layers = (ConfigIntList){chunks, v};
    return 0;
}

void config_chunk_layers(const Config *cfg, int g, int *begin, int *end)
{
    const ConfigIntList *l = &cfg->parallel.chunk_layers;
    /* Resolved: config_resolve, and for auto the engine (trainer_stage_layers). */
    WLB_ASSERT(l->n == cfg->parallel.pp * cfg->parallel.virtual_stages && g >= 0 && g < l->n);
    int64_t b = 0;
    for (int i = 0; i < g; i++)
        b += l->v[i];
    *begin = (int)b;
    *end = (int)(b + l->v[g]);
}

/* parallel.timeout_s: 0 (off) or at least CONFIG_TIMEOUT_FLOOR_S. The watchdog covers the start too
 * (MPI_Init, the communicators, loading, the first plan), where ranks of a healthy job arrive seconds
 * apart and a checkpoint save or an evaluation holds the others for as long: below the floor the
 * false hangs outnumber the real ones (1e-9 made every start one). The tests, whose tiny model
 * needs the watchdog's own resolution only (4 polls a second, 2 s of grace), lower the floor with
 * WLBTRAIN_TEST_TIMEOUT_FLOOR_S (a test hook, 1 to the floor; not for users). */
static int check_timeout(const Config *cfg, Error *err)
{
    double t = cfg->parallel.timeout_s, floor_s = CONFIG_TIMEOUT_FLOOR_S, test_floor;
    const char *s = getenv("WLBTRAIN_TEST_TIMEOUT_FLOOR_S");
    if (s && *s) {
        if (parse_double(s, &test_floor) != 0 || !(test_floor >= 1) || test_floor > CONFIG_TIMEOUT_FLOOR_S)
            return error_set(err, "WLBTRAIN_TEST_TIMEOUT_FLOOR_S", "expected seconds from 1 to %g, got '%s'",
                             CONFIG_TIMEOUT_FLOOR_S, s);
        floor_s = test_floor;
    }
    if (t > 0 && t < floor_s)
        return rule_error(cfg, err, "parallel.timeout_s", NULL,
                          "0 (the watchdog off) or at least %g seconds: a hang is a wait of minutes (default 600), "
                          "and a start or a checkpoint save holds ranks for seconds; got %g", floor_s, t);
    return 0;
}

static int check_parallel(Config *cfg, int world_size, Error *err)
{
    const ConfigModel *m = &cfg->model;
    ConfigParallel *p = &cfg->parallel;
    long long tp = p->tp;
    if (m->n_heads % p->tp)
        return rule_error(cfg, err, "parallel.tp", NULL, "must divide model.n_heads (%lld), got %lld",
                          (long long)m->n_heads, tp);
    if (m->n_kv_heads % p->tp && p->tp % m->n_kv_heads)
        return rule_error(cfg, err, "parallel.tp", NULL,
                          "must divide model.n_kv_heads (%lld) or be a multiple of it, got %lld",
                          (long long)m->n_kv_heads, tp);
    if (m->d_ffn % p->tp)
        return rule_error(cfg, err, "parallel.tp", NULL, "must divide model.d_ffn (%lld), got %lld",
                          (long long)m->d_ffn, tp);
    if (m->vocab_size % p->tp)
        return rule_error(cfg, err, "parallel.tp", NULL,
                          "must divide model.vocab_size (%lld) for the vocabulary-parallel embedding, got %lld",
                          (long long)m->vocab_size, tp);
    if (p->pp > m->n_layers)
        return rule_error(cfg, err, "parallel.pp", NULL, "must not exceed model.n_layers (%lld), got %lld",
                          (long long)m->n_layers, (long long)p->pp);
    if (p->pp * p->virtual_stages > m->n_layers)
        return rule_error(cfg, err, "parallel.virtual_stages", "parallel.pp",
                          "pp * virtual_stages = %lld model chunks must not exceed model.n_layers (%lld)",
                          (long long)(p->pp * p->virtual_stages), (long long)m->n_layers);
    if (resolve_stage_layers(cfg, err) != 0)
        return -1;
    long long mp = (long long)(p->tp * p->cp * p->pp);
    if (world_size > 0 && p->dp == 0) {
        if (world_size % mp)
            return rule_error(cfg, err, "parallel.dp", "parallel.tp",
                              "auto needs the job's %d ranks to be a multiple of tp * cp * pp = %lld",
                              world_size, mp);
        p->dp = world_size / mp;
        cfg->origin[key("parallel.dp")].kind = ORIGIN_DERIVED;
    } else if (world_size > 0 && mp * p->dp != world_size) {
        return rule_error(cfg, err, "parallel.dp", "parallel.tp",
                          "tp * cp * pp * dp = %lld * %lld * %lld * %lld = %lld, but the job has %d ranks "
                          "(mpirun -np / srun -n)", tp, (long long)p->cp, (long long)p->pp,
                          (long long)p->dp, mp * p->dp, world_size);
    }
    if (p->comm == COMM_NCCL && cfg->train.device != DEVICE_CUDA)
        return rule_error(cfg, err, "parallel.comm", "train.device", "nccl needs train.device: cuda");
    return check_timeout(cfg, err);
}

/* train.attention: cudnn is cuDNN's bf16 attention on the GPU (whether the build and the machine have
 * it is the backend's to say when it opens). */
static int check_attention(Config *cfg, Error *err)
{
    if (cfg->train.attention != ATTENTION_CUDNN)
        return 0;
    if (cfg->train.device != DEVICE_CUDA)
        return rule_error(cfg, err, "train.attention", "train.device", "cudnn needs train.device: cuda");
    if (cfg->train.precision != PRECISION_BF16)
        return rule_error(cfg, err, "train.attention", "train.precision", "cudnn needs train.precision: bf16");
    long long head = (long long)(cfg->model.d_model / cfg->model.n_heads);
    if (head != 64 && head != 128)
        return rule_error(cfg, err, "train.attention", "model.n_heads",
                          "cudnn runs head sizes 64 and 128, the model's is %lld", head);
    return 0;
}

static int check_data(Config *cfg, Error *err)
{
    ConfigData *d = &cfg->data;
    const ConfigParallel *p = &cfg->parallel;
    if (d->path.n && d->lengths_file)
        return rule_error(cfg, err, "data.lengths_file", NULL,
                          "set data.path (a data set) or data.lengths_file (lengths for a dry run), not both "
                          "(unset data.path with --set data.path=)");
    if (d->weights.n && d->weights.n != d->path.n)
        return rule_error(cfg, err, "data.weights", NULL, "%d weights for %d paths in data.path",
                          d->weights.n, d->path.n);
    if (d->context_window > cfg->model.max_seq_len)
        return rule_error(cfg, err, "data.context_window", "model.max_seq_len",
                          "must not exceed model.max_seq_len (%lld), got %lld",
                          (long long)cfg->model.max_seq_len, (long long)d->context_window);
    if (d->context_window % (2 * p->cp))
        return rule_error(cfg, err, "data.context_window", "parallel.cp",
                          "must be a multiple of 2 * parallel.cp = %lld, got %lld", (long long)(2 * p->cp),
                          (long long)d->context_window);
    if (p->dp > 0) {
        derive_int(cfg, "data.global_batch_tokens", p->pp * p->dp * d->context_window);
        int64_t unit = p->dp * d->context_window;
        if (d->global_batch_tokens == 0 || d->global_batch_tokens % unit)
            return rule_error(cfg, err, "data.global_batch_tokens", "parallel.dp",
                              "must be a multiple of parallel.dp * data.context_window = %lld * %lld = %lld, "
                              "got %lld", (long long)p->dp, (long long)d->context_window, (long long)unit,
                              (long long)d->global_batch_tokens);
        /* The planner holds every micro-batch of a step: a batch of more than 2^20 windows per
         * replica is a typo (a digit too many), said as what it is, not as a bad dp. */
        if (d->global_batch_tokens / unit > CONFIG_MAX_MICRO_BATCHES)
            return rule_error(cfg, err, "data.global_batch_tokens", NULL,
                              "%lld tokens are %lld windows of %lld per replica (parallel.dp %lld), more than the "
                              "%d micro-batches a step may have", (long long)d->global_batch_tokens,
                              (long long)(d->global_batch_tokens / unit), (long long)d->context_window,
                              (long long)p->dp, CONFIG_MAX_MICRO_BATCHES);
    } else if (d->global_batch_tokens % d->context_window) {
        return rule_error(cfg, err, "data.global_batch_tokens", NULL,
                          "must be a multiple of data.context_window (%lld), got %lld",
                          (long long)d->context_window, (long long)d->global_batch_tokens);
    }
    if (d->valid_path.n && d->valid_fraction > 0)
        return rule_error(cfg, err, "data.valid_fraction", "data.valid_path",
                          "a validation set is data.valid_path or a share of data.path, not both");
    return 0;
}

static int check_balance(const Config *cfg, Error *err)
{
    const ConfigBalance *b = &cfg->balance;
    int64_t w = cfg->data.context_window;
    if (b->max_tokens_per_micro_batch < w)
        return rule_error(cfg, err, "balance.max_tokens_per_micro_batch", "data.context_window",
                          "must be at least data.context_window (%lld), got %lld", (long long)w,
                          (long long)b->max_tokens_per_micro_batch);
    for (int i = 0; i < b->outlier_thresholds.n; i++) {
        int64_t t = b->outlier_thresholds.v[i];
        if (t > w)
            return rule_error(cfg, err, "balance.outlier_thresholds", "data.context_window",
                              "must not exceed data.context_window (%lld), got %lld", (long long)w, (long long)t);
        if (i > 0 && t <= b->outlier_thresholds.v[i - 1])
            return rule_error(cfg, err, "balance.outlier_thresholds", NULL,
                              "must be increasing, got %lld after %lld", (long long)t,
                              (long long)b->outlier_thresholds.v[i - 1]);
    }
    /* groups splits the CP ranks into aligned blocks of power-of-two sizes (one communicator per
     * block, made at start): the blocks must tile the CP group. */
    int64_t cp = cfg->parallel.cp;
    if (b->cp_sharding == CP_GROUPS && (cp & (cp - 1)) != 0)
        return rule_error(cfg, err, "balance.cp_sharding", "parallel.cp",
                          "groups needs parallel.cp a power of two, got %lld", (long long)cp);
    return 0;
}

static int check_train(const Config *cfg, Error *err)
{
    const ConfigTrain *t = &cfg->train;
    if (t->min_lr > t->lr)
        return rule_error(cfg, err, "train.min_lr", "train.lr", "must not exceed train.lr (%g), got %g", t->lr,
                          t->min_lr);
    int64_t steps;
    double seconds;
    if (t->stop_after && config_stop_after(t->stop_after, &steps, &seconds) != 0)
        return rule_error(cfg, err, "train.stop_after", NULL,
                          "expected a step count (500) or a wall time (90s, 45m, 2h, 1h30m), got '%s'", t->stop_after);
    if (t->eval_every > 0 && !cfg->data.valid_path.n && !(cfg->data.valid_fraction > 0))
        return rule_error(cfg, err, "train.eval_every", NULL,
                          "needs a validation set: data.valid_path (held-out prefixes) or data.valid_fraction (a share "
                          "of data.path's documents)");
    const ConfigChoiceOrList *pb = &t->eval_position_buckets;
    if (pb->choice != 0 && pb->list.n > CONFIG_MAX_POSITION_EDGES)
        return rule_error(cfg, err, "train.eval_position_buckets", NULL, "at most %d edges, got %d",
                          CONFIG_MAX_POSITION_EDGES, pb->list.n);
    for (int i = 1; pb->choice != 0 && i < pb->list.n; i++)
        if (pb->list.v[i] <= pb->list.v[i - 1])
            return rule_error(cfg, err, "train.eval_position_buckets", NULL, "edges must increase, got %lld after "
                              "%lld", (long long)pb->list.v[i], (long long)pb->list.v[i - 1]);
    const ConfigCheckpoint *c = &cfg->checkpoint;
    if (c->continue_from && t->init_from)
        return rule_error(cfg, err, "checkpoint.continue_from", "train.init_from",
                          "train.init_from is set too: a continued run takes its weights from the "
                          "checkpoint (set train.init_from: none)");
    if (c->every > 0 && !c->dir)
        return rule_error(cfg, err, "checkpoint.every", NULL, "needs checkpoint.dir");
    if (c->resume && !strcmp(c->resume, "auto") && !c->dir)
        return rule_error(cfg, err, "checkpoint.resume", NULL, "auto needs checkpoint.dir");
    TraceSteps traced;
    Error bad = {0};
    if (trace_steps_parse(cfg->trace.steps, "trace.steps", &traced, &bad) != 0)
        return rule_error(cfg, err, "trace.steps", NULL, "%s", bad.msg + strlen("trace.steps: "));
    return 0;
}

int config_resolve(Config *cfg, int world_size, Error *err)
{
    if (config_apply_preset(cfg, err) != 0 || config_apply_model_folder(cfg, err) != 0 || check_model(cfg, err) != 0)
        return -1;
    derive_int(cfg, "data.context_window", cfg->model.max_seq_len);
    derive_int(cfg, "balance.max_tokens_per_micro_batch", 2 * cfg->data.context_window);
    int kp = key("train.precision");
    if (!explicit_(cfg, kp)) {
        cfg->train.precision = cfg->train.device == DEVICE_CUDA ? PRECISION_BF16 : PRECISION_FP32;
        cfg->origin[kp].kind = ORIGIN_DERIVED;
    }
    int kl = key("train.min_lr");
    if (!explicit_(cfg, kl)) {
        cfg->train.min_lr = cfg->train.lr / 10;
        cfg->origin[kl].kind = ORIGIN_DERIVED;
    }
    if (derive_outlier_thresholds(cfg, err) != 0)
        return -1;
    if (check_parallel(cfg, world_size, err) != 0 || check_data(cfg, err) != 0 ||
        check_balance(cfg, err) != 0 || check_train(cfg, err) != 0 || check_attention(cfg, err) != 0)
        return -1;
    return 0;
}

int config_stop_after(const char *s, int64_t *steps, double *seconds)
{
    *steps = 0;
    *seconds = 0;
    /* A bare count is steps; otherwise whole numbers with the units h, m, s, each at most once and
     * in that order. The bound keeps the sum exact in a double and far beyond any allocation. */
    const int64_t most = INT64_C(1) << 40;
    if (*s >= '0' && *s <= '9' && s[strspn(s, "0123456789")] == '\0')
        return parse_int64(s, steps) == 0 && *steps >= 1 && *steps <= most ? 0 : -1;
    static const char units[] = "hms";
    static const int64_t unit_s[] = {3600, 60, 1};
    int next = 0;
    int64_t total = 0;
    while (*s) {
        size_t digits = strspn(s, "0123456789");
        int64_t n;
        const char *u = digits ? strchr(units + next, s[digits]) : NULL;
        if (!u || !s[digits] || digits > 12 || parse_int64_n(s, digits, &n) != 0)
            return -1;
        next = (int)(u - units) + 1;
        total += n * unit_s[u - units];
        s += digits + 1;
    }
    if (total < 1 || total > most)
        return -1;
    *seconds = (double)total;
    return 0;
}

int64_t config_micro_batches(const Config *cfg)
{
    if (cfg->parallel.dp <= 0 || cfg->data.global_batch_tokens <= 0)
        return 0;
    return cfg->data.global_batch_tokens / (cfg->parallel.dp * cfg->data.context_window);
}
