/*
 * engine/train.c - the training job: start the ranks, run the steps, report (see train.h).
 *
 * Failure: an error on any rank after MPI started is printed by that rank ("wlbtrain: error:
 * rank R: WHERE: WHAT") and ends the whole job through comm_abort with the error's status; a rank
 * that dies is noticed by the launcher, which stops the others. Either way no rank is left waiting.
 *
 * Test hook: WLBTRAIN_FAULT=KIND@RANK:STEP makes world rank RANK fail at the start of step STEP:
 * KIND error (an error, status 1), kill (SIGKILL, as a crashed node), or plan (its plan of that
 * step differs from the other ranks', which the plan check must catch).
 */
#include "engine/train.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_info.h"
#include "engine/runtime.h"
#include "util/fileio.h"
#include "util/parse.h"

typedef enum FaultKind { FAULT_NONE, FAULT_ERROR, FAULT_KILL, FAULT_PLAN } FaultKind;

typedef struct Fault {
    FaultKind kind;
    int rank;
    int64_t step;
} Fault;

static int parse_fault(Fault *f, Error *err)
{
    memset(f, 0, sizeof *f);
    const char *s = getenv("WLBTRAIN_FAULT");
    if (!s || !*s)
        return 0;
    char kind[16];
    long long rank, step;
    int used = 0;
    if (sscanf(s, "%15[a-z]@%lld:%lld%n", kind, &rank, &step, &used) != 3 || s[used] || rank < 0 || step < 1)
        return error_set(err, "WLBTRAIN_FAULT", "expected KIND@RANK:STEP (KIND error, kill or plan), got '%s'", s);
    if (!strcmp(kind, "error"))
        f->kind = FAULT_ERROR;
    else if (!strcmp(kind, "kill"))
        f->kind = FAULT_KILL;
    else if (!strcmp(kind, "plan"))
        f->kind = FAULT_PLAN;
    else
        return error_set(err, "WLBTRAIN_FAULT", "unknown fault '%s' (error, kill or plan)", kind);
    f->rank = (int)rank;
    f->step = step;
    return 0;
}

static int inject_fault(const Fault *f, Trainer *tr, int64_t step, Error *err)
{
    tr->fault_plan = 0;
    if (f->kind == FAULT_NONE || f->step != step || f->rank != tr->lay.rank)
        return 0;
    if (f->kind == FAULT_ERROR)
        return error_runtime(err, "WLBTRAIN_FAULT", "injected failure at step %lld", (long long)step);
    if (f->kind == FAULT_KILL) {
        fflush(stdout);
        raise(SIGKILL);
    }
    tr->fault_plan = 0x5eed;
    return 0;
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

static int write_metrics(FILE *f, const char *path, int64_t step, const TrainStats *st, double ms, Error *err)
{
    fprintf(f, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens\":%lld,\"tokens_per_s\":%.1f,"
               "\"step_ms\":%.2f,\"pp_imbalance\":%.4f,\"pp_imbalance_measured\":%.4f,\"cp_imbalance\":%.4f,"
               "\"cp_imbalance_measured\":%.4f}\n",
            (long long)step, st->loss, st->lr, st->grad_norm, (long long)st->tokens, st->tokens / (ms / 1e3), ms,
            st->pp_imbalance, st->pp_imbalance_measured, st->cp_imbalance, st->cp_imbalance_measured);
    if (fflush(f) != 0 || ferror(f))
        return error_errno(err, path, "cannot write");
    return 0;
}

static void print_banner(const Trainer *tr, const Config *cfg)
{
    int64_t params = 0;
    for (int c = 0; c < tr->v; c++)
        params += tr->chunks[c].model.n_params;
    const ConfigParallel *p = &cfg->parallel;
    printf("train: %s model, %lld steps of %lld tokens (window %lld, %lld micro-batches per replica), backend %s\n"
           "train: %d rank%s: tp %lld, cp %lld, pp %lld%s, dp %lld%s; rank 0 holds %lld parameters; %d OpenMP "
           "thread%s per rank\n",
           cfg->model.preset ? cfg->model.preset : "custom", (long long)cfg->train.steps,
           (long long)cfg->data.global_batch_tokens, (long long)cfg->data.context_window, (long long)tr->m,
           tr->chunks[0].model.ops->name, comm_world_size(tr->comm), comm_world_size(tr->comm) > 1 ? "s" : "",
           (long long)p->tp, (long long)p->cp,
           (long long)p->pp, p->virtual_stages > 1 ? " (interleaved)" : "", (long long)p->dp,
           p->zero ? ", ZeRO-1" : "", (long long)params, omp_get_max_threads(), omp_get_max_threads() > 1 ? "s" : "");
    fflush(stdout);
}

/* The steps, on every rank; rank 0 reports. */
static int train_loop(Trainer *tr, const Config *cfg, const Fault *fault, Error *err)
{
    FILE *metrics = NULL;
    int lead = tr->lay.rank == 0;
    if (lead && cfg->log.metrics) {
        if (file_make_parents(cfg->log.metrics, err) != 0)
            return -1;
        if (!(metrics = fopen(cfg->log.metrics, "w")))
            return error_errno(err, cfg->log.metrics, "cannot create");
    }
    if (lead)
        print_banner(tr, cfg);
    int rc = 0;
    double t_start = model_clock();
    for (int64_t step = 1; rc == 0 && step <= cfg->train.steps; step++) {
        double t0 = model_clock();
        TrainStats st;
        rc = inject_fault(fault, tr, step, err);
        if (rc == 0)
            rc = trainer_forward_backward(tr, &st, err);
        if (rc == 0 && !isfinite(st.loss))
            rc = error_runtime(err, "train", "step %lld: the loss is %f; stopping (lower train.lr?)", (long long)step,
                               st.loss);
        if (rc == 0)
            rc = trainer_update(tr, &st, err);
        if (rc != 0 || !lead)
            continue;
        double ms = (model_clock() - t0) * 1e3;
        if (metrics)
            rc = write_metrics(metrics, cfg->log.metrics, step, &st, ms, err);
        if (step % cfg->log.every == 0 || step == 1 || step == cfg->train.steps) {
            char left[32];
            double elapsed = model_clock() - t_start;
            format_duration(elapsed / (double)step * (double)(cfg->train.steps - step), left, sizeof left);
            printf("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  tokens %lld  tokens/s %.0f  %.0f ms  "
                   "(%s left)\n", (long long)step, (long long)cfg->train.steps, st.loss, st.lr, st.grad_norm,
                   (long long)st.tokens, st.tokens / (ms / 1e3), ms, left);
            fflush(stdout);
        }
    }
    if (metrics && fclose(metrics) != 0 && rc == 0)
        rc = error_errno(err, cfg->log.metrics, "cannot write");
    return rc;
}

int train_run(const Config *cfg, Error *err)
{
    RuntimeLaunch launch = runtime_launch_from_env();
    Fault fault;
    if (parse_fault(&fault, err) != 0)
        return -1;
    Comm comm;
    const ConfigParallel *p = &cfg->parallel;
    if (comm_start(&comm, strcmp(launch.launcher, "none") != 0, err) != 0 ||
        comm_split(&comm, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp, err) != 0) {
        comm_finish(&comm);
        return -1;
    }
    cpu_share_cores(comm.node_ranks);
    Trainer tr;
    int rc = trainer_init(&tr, cfg, &comm, err);
    if (rc == 0)
        rc = train_loop(&tr, cfg, &fault, err);
    if (rc != 0 && comm_world_size(&comm) > 1) {
        /* Alone, this rank would leave the others waiting in their next collective. */
        fprintf(stderr, "wlbtrain: error: rank %d: %s\n", comm_world_rank(&comm), err->msg);
        comm_abort(&comm, err->status ? err->status : 1);
    }
    trainer_free(&tr);
    comm_finish(&comm);
    return rc;
}
