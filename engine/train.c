/* engine/train.c - the training loop (see train.h). */
#include "engine/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "data/data_sources.h"
#include "engine/batch.h"
#include "engine/cost.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "engine/plan.h"
#include "util/fileio.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void format_duration(double s, char *buf, size_t size)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, size, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, size, "%lds", t);
}

/* What this version trains: one process on the CPU backend. */
static int check_supported(const Config *cfg, Error *err)
{
    const ConfigParallel *p = &cfg->parallel;
    if (cfg->train.device != DEVICE_CPU)
        return error_set(err, "train.device", "training on cuda is not in this version yet; set train.device: cpu");
    if (p->tp * p->cp * p->pp * p->dp != 1)
        return error_set(err, "parallel", "this version trains in one process (tp = cp = pp = dp = 1); multi-rank "
                         "training comes with the 4D engine (a dry run plans any layout)");
    if (cfg->data.path.n == 0)
        return error_set(err, "data.path", "training reads tokens: set data.path (a Megatron PREFIX)");
    return 0;
}

typedef struct Trainer {
    const Config *cfg;
    DataSources data;
    DataStream stream;
    CostModel cost;
    Planner planner;
    StepPlan plan;
    Model model;
    Optim optim;
    BatchBuffers batch;
    FILE *metrics;
} Trainer;

/* One optimizer step; fills the step's loss, grad norm, lr and tokens. */
static int train_step(Trainer *tr, double *loss, double *grad_norm, double *lr, int64_t *tokens, Error *err)
{
    Model *m = &tr->model;
    if (plan_step(&tr->planner, &tr->plan, err) != 0)
        return -1;
    int64_t n_targets = batch_step_targets(&tr->plan, &tr->data);
    m->ops->zero(m->grads, m->n_params);
    double sum = 0;
    float dloss = n_targets > 0 ? 1.0f / (float)n_targets : 0.0f;
    for (int64_t i = 0; i < (int64_t)tr->plan.dp * tr->plan.m; i++) {
        ModelBatch b;
        double mb_sum;
        if (batch_build(&tr->batch, &tr->plan, i, 0, &tr->data, m->dims.vocab, &b, err) != 0 ||
            model_forward(m, &b, 1, dloss, &mb_sum, err) != 0 || model_backward(m, &b, err) != 0)
            return -1;
        sum += mb_sum;
    }
    *loss = n_targets > 0 ? sum / (double)n_targets : 0;
    if (!isfinite(*loss))
        return error_runtime(err, "train", "step %lld: the loss is %f; stopping (lower train.lr?)",
                             (long long)tr->plan.step + 1, *loss);
    *grad_norm = optim_step(&tr->optim, m, lr);
    *tokens = tr->plan.tokens;
    return 0;
}

static int setup(Trainer *tr, const Config *cfg, Error *err)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    const ConfigData *d = &cfg->data;
    if (check_supported(cfg, err) != 0 || cost_model_init(&tr->cost, cfg, err) != 0 ||
        data_sources_open(&tr->data, d->path.v, d->weights.n ? d->weights.v : NULL, d->path.n, NULL, NULL, err) != 0)
        return -1;
    if (data_stream_init(&tr->stream, tr->data.src, tr->data.weights, tr->data.n, (uint64_t)d->seed,
                         (uint64_t)d->context_window, err) != 0 ||
        plan_init(&tr->planner, cfg, &tr->cost, &tr->stream, cfg->balance.packer, cfg->balance.cp_sharding, err) != 0)
        return -1;
    const Ops *ops = cpu_ops();
    if (model_init(&tr->model, &cfg->model, ops, err) != 0)
        return -1;
    if (cfg->train.init_from) {
        if (model_load(&tr->model, cfg->train.init_from, err) != 0)
            return -1;
    } else {
        model_init_weights(&tr->model, (uint64_t)cfg->train.seed);
    }
    tr->batch.ops = ops;
    if (optim_init(&tr->optim, &cfg->train, &tr->model, err) != 0)
        return -1;
    if (cfg->log.metrics) {
        if (file_make_parents(cfg->log.metrics, err) != 0)
            return -1;
        if (!(tr->metrics = fopen(cfg->log.metrics, "w")))
            return error_errno(err, cfg->log.metrics, "cannot create");
    }
    return 0;
}

static void teardown(Trainer *tr)
{
    if (tr->metrics)
        fclose(tr->metrics);
    batch_free(&tr->batch);
    optim_free(&tr->optim, &tr->model);
    model_free(&tr->model);
    plan_free(&tr->plan);
    plan_destroy(&tr->planner);
    data_stream_free(&tr->stream);
    data_sources_close(&tr->data);
}

int train_run(const Config *cfg, Error *err)
{
    Trainer tr;
    int rc = setup(&tr, cfg, err);
    if (rc == 0)
        printf("train: %s model, %lld parameters, %lld steps of %lld tokens (window %lld, %lld micro-batches), "
               "backend %s\n", cfg->model.preset ? cfg->model.preset : "custom", (long long)tr.model.n_params,
               (long long)cfg->train.steps, (long long)cfg->data.global_batch_tokens, (long long)cfg->data.context_window,
               (long long)config_micro_batches(cfg), tr.model.ops->name);
    double t_start = now_s();
    for (int64_t step = 1; rc == 0 && step <= cfg->train.steps; step++) {
        double t0 = now_s(), loss = 0, norm = 0, lr = 0;
        int64_t tokens = 0;
        rc = train_step(&tr, &loss, &norm, &lr, &tokens, err);
        if (rc != 0)
            break;
        double ms = (now_s() - t0) * 1e3, tps = tokens / (ms / 1e3);
        if (tr.metrics) {
            fprintf(tr.metrics, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens\":%lld,"
                                "\"tokens_per_s\":%.1f,\"step_ms\":%.2f}\n",
                    (long long)step, loss, lr, norm, (long long)tokens, tps, ms);
            if (fflush(tr.metrics) != 0 || ferror(tr.metrics))
                rc = error_errno(err, cfg->log.metrics, "cannot write");
        }
        if (step % cfg->log.every == 0 || step == 1 || step == cfg->train.steps) {
            char left[32];
            double elapsed = now_s() - t_start;
            format_duration(elapsed / (double)step * (double)(cfg->train.steps - step), left, sizeof left);
            printf("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  tokens %lld  tokens/s %.0f  %.0f ms  "
                   "(%s left)\n", (long long)step, (long long)cfg->train.steps, loss, lr, norm, (long long)tokens, tps,
                   ms, left);
            fflush(stdout);
        }
    }
    teardown(&tr);
    return rc;
}
