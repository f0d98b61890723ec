/*
 * engine/train/train.c - the training job: start the ranks, run the steps, report (see train.h).
 *
 * Failure: an error on any rank after MPI started is printed by that rank ("wlbtrain: error:
 * rank R: WHERE: WHAT") and ends the whole job through comm_abort with the error's status; a rank
 * that dies is noticed by the launcher, which stops the others. Either way no rank is left waiting.
 *
 * Evaluation: after step s when s is a multiple of train.eval_every or the last step, before the
 * checkpoint (which records it): the validation loss (train_eval.c), on the log line and in the
 * metrics line of the step, whose time leaves the evaluation out; the last and best at the end.
 *
 * Checkpoints: after step s, when checkpoint.dir is set and s is a multiple of checkpoint.every
 * or the last step (train_ckpt.c). checkpoint.resume (auto or a path) loads one first; training
 * goes on from the step after it, and log.metrics keeps its lines up to that step. When it finds
 * none, checkpoint.continue_from starts the run from another run's checkpoint (train_continue.c).
 *
 * Stopping early (docs/slurm.md, "Time limits and preemption"): SIGUSR1 or SIGTERM on any rank, or
 * train.stop_after, ends the run after a step that every rank finishes: at the end of each step
 * one small all-reduce (MAX) tells every rank whether any rank was signalled and whether rank 0's
 * clock passed a stop_after wall time, so all ranks stop after the same step. Then a checkpoint of
 * that step is written (due or not), rank 0 says why it stopped, and the job exits with
 * TRAIN_EXIT_PREEMPTED after a signal, 0 after stop_after. The schedule is that of train.steps, so
 * resuming continues bit for bit.
 *
 * Test hook: WLBTRAIN_FAULT=KIND@RANK:STEP makes world rank RANK fail at step STEP: KIND error (an
 * error, status 1), kill (SIGKILL, as a crashed node), plan (its plan of that step differs from
 * the other ranks', which the plan check must catch), nan (a NaN in one of its gradients) or
 * savekill (SIGKILL in the middle of the checkpoint saved after that step), savesignal (SIGTERM to
 * itself there, as Slurm's during a save, which must finish and stop the run), hang (SIGSTOP to
 * itself at the start of the step: a rank that stops answering; the others' watchdog must end the
 * job), slow (a sleep of WLBTRAIN_FAULT_SLOW_S seconds, default 5, at every step from STEP on: a
 * straggler), stall (stopped for WLBTRAIN_FAULT_SLOW_S at the start of every step from STEP on and
 * continued by a timer, util/stall.h: a straggler outside its passes), exit (_exit(1) at the step:
 * a rank gone) or savestall (SIGTERM to every rank in the checkpoint saved after that step, and RANK
 * stalling WLBTRAIN_FAULT_SLOW_S seconds once it is complete, before the oldest are removed: the
 * others' stop line must say the checkpoint is complete). STEP may also name a moment outside the
 * steps, for hang: start (before MPI_Init: the others wait in it), setup (after the communicators
 * are made, before the model is), end (after the last checkpoint, before the final barrier) or
 * finalize (after the final barrier, before MPI_Finalize). WLBTRAIN_STEP_DELAY=S
 * makes rank 0 sleep S seconds after every step, so that a test's signal lands in the middle of a
 * run of a tiny model.
 */
#include "engine/train/train.h"
#include "engine/train/train_memory.h"
#include "engine/train/train_runlock.h"
#include "engine/train/train_stages.h"
#include "engine/train/train_trace.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config_keys.h"
#include "engine/comm/comm_watchdog.h"
#include "engine/comm/runtime.h"
#include "engine/plan/batch_spread.h"
#include "util/array.h"
#include "util/clock.h"
#include "util/fileio.h"
#include "util/parse.h"
#include "util/stall.h"

typedef enum FaultKind {
    FAULT_NONE,
    FAULT_ERROR,
    FAULT_KILL,
    FAULT_PLAN,
    FAULT_NAN,
    FAULT_SAVEKILL,
    FAULT_SAVESIGNAL,
    FAULT_HANG,
    FAULT_SLOW,
    FAULT_EXIT,
    FAULT_STALL,
    FAULT_SAVESTALL
} FaultKind;

/* The moments of WLBTRAIN_FAULT outside the steps (Fault.step). */
enum { FAULT_AT_START = -1, FAULT_AT_SETUP = -2, FAULT_AT_END = -3, FAULT_AT_FINALIZE = -4 };

typedef struct Fault {
    FaultKind kind;
    int rank;
    int64_t step;
    double slow_s; /* slow: the sleep of each step, stall: the stop (WLBTRAIN_FAULT_SLOW_S, default 5) */
} Fault;

static int parse_fault(Fault *f, Error *err)
{
    memset(f, 0, sizeof *f);
    const char *s = getenv("WLBTRAIN_FAULT");
    if (!s || !*s)
        return 0;
    char kind[16], at[16];
    long long rank = -1, step = 0;
    int used = 0;
    static const char *const moments[] = {"start", "setup", "end", "finalize"};
    if (sscanf(s, "%15[a-z]@%lld:%15[a-z0-9]%n", kind, &rank, at, &used) == 3 && !s[used]) {
        for (int m = 0; m < 4; m++)
            if (!strcmp(at, moments[m]))
                step = -1 - m;
        int tail = 0;
        if (step == 0 && (sscanf(at, "%lld%n", &step, &tail) != 1 || at[tail] || step < 1))
            step = 0;
    }
    if (step == 0 || rank < 0 || (step < 0 && strcmp(kind, "hang") != 0))
        return error_set(err, "WLBTRAIN_FAULT", "expected KIND@RANK:STEP (KIND error, kill, plan, nan, savekill, "
                         "savesignal, hang, slow, stall, exit or savestall; for hang STEP may be start, setup, end "
                         "or finalize), got '%s'", s);
    static const char *const kinds[] = {"",     "error", "kill", "plan", "nan",  "savekill",
                                        "savesignal", "hang", "slow", "exit", "stall", "savestall"};
    for (int k = 1; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
        if (!strcmp(kind, kinds[k]))
            f->kind = (FaultKind)k;
    if (f->kind == FAULT_NONE)
        return error_set(err, "WLBTRAIN_FAULT", "unknown fault '%s' (error, kill, plan, nan, savekill, savesignal, "
                         "hang, slow, stall, exit or savestall)", kind);
    const char *slow = getenv("WLBTRAIN_FAULT_SLOW_S");
    f->slow_s = 5;
    if (slow && *slow && (parse_double(slow, &f->slow_s) != 0 || f->slow_s < 0 || f->slow_s > 3600))
        return error_set(err, "WLBTRAIN_FAULT_SLOW_S", "expected seconds between 0 and 3600, got '%s'", slow);
    f->rank = (int)rank;
    f->step = step;
    return 0;
}

/* WLBTRAIN_FAULT hang: SIGSTOP to this process, as `kill -STOP`: the rank stops answering, outside
 * any collective. */
static void fault_stop(void)
{
    fflush(stdout);
    raise(SIGSTOP);
    /* Woken by the launcher ending the job (its SIGCONT before SIGTERM and SIGKILL): a hung rank
     * stays hung - it must not go on into the next collective and report a hang of its own. */
    for (;;)
        pause();
}

/* A hang at a moment outside the steps (FAULT_AT_*), on the fault's rank. */
static void fault_at(const Fault *f, int rank, int64_t moment)
{
    if (f->kind == FAULT_HANG && f->step == moment && f->rank == rank)
        fault_stop();
}

static int inject_fault(const Fault *f, Trainer *tr, int64_t step, Error *err)
{
    tr->fault_plan = 0;
    tr->fault_nan = tr->fault_kill_in_save = tr->fault_signal_in_save = 0;
    tr->fault_stall_after_save = 0;
    if (f->kind == FAULT_SLOW && f->rank == tr->lay.rank && step >= f->step) {
        /* a straggler: this rank slow at every step from STEP on, inside its first pass's compute */
        tr->fault_sleep_s = f->slow_s;
        return 0;
    }
    if (f->kind == FAULT_STALL && f->rank == tr->lay.rank && step >= f->step) {
        /* a straggler outside its passes: this rank stopped and continued at the start of every step
         * from STEP on, as `kill -STOP`, `kill -CONT` after WLBTRAIN_FAULT_SLOW_S would */
        fflush(stdout);
        return stall_freeze(f->slow_s, err);
    }
    if (f->kind == FAULT_SAVESTALL && f->step == step) {
        /* SIGTERM to every rank in the save after STEP (a launcher's, as Slurm's), and RANK stalls
         * WLBTRAIN_FAULT_SLOW_S once the checkpoint is complete, before removing the oldest ones (rank
         * 0: a slow file system) - the others wait in their next collective with a stop pending */
        tr->fault_signal_in_save = 1;
        tr->fault_stall_after_save = f->rank == tr->lay.rank ? f->slow_s : 0;
        return 0;
    }
    if (f->kind == FAULT_NONE || f->step != step || f->rank != tr->lay.rank)
        return 0;
    if (f->kind == FAULT_HANG)
        fault_stop();
    if (f->kind == FAULT_EXIT) {
        fflush(stdout);
        _exit(1); /* a rank gone without a word (no MPI_Finalize, no abort) */
    }
    tr->fault_nan = f->kind == FAULT_NAN;
    tr->fault_kill_in_save = f->kind == FAULT_SAVEKILL;
    tr->fault_signal_in_save = f->kind == FAULT_SAVESIGNAL;
    if (f->kind == FAULT_NAN || f->kind == FAULT_SAVEKILL || f->kind == FAULT_SAVESIGNAL)
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

/* The signal that asked this process to stop (0: none). A handler may only touch a volatile
 * sig_atomic_t (async-signal-safe), so this is the one global of the trainer: the step loop reads
 * it at the end of every step. */
static volatile sig_atomic_t train_stop_signal;

static void train_on_signal(int sig) { train_stop_signal = sig; }

/* SIGUSR1 (what Slurm's --signal sends ahead of the time limit, and what mpirun forwards to the
 * ranks) and SIGTERM (what Slurm sends every task at the limit or on preemption) ask for a stop
 * after the step in flight. SA_RESTART: a signal must not make a read or an MPI call fail. */
static const int train_stop_signals[2] = {SIGUSR1, SIGTERM};

static int install_stop_handlers(struct sigaction *old, Error *err)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = train_on_signal;
    sa.sa_flags = SA_RESTART;
    if (sigemptyset(&sa.sa_mask) != 0)
        return error_errno(err, "train", "cannot set up the signal handlers");
    train_stop_signal = 0;
    for (int i = 0; i < 2; i++)
        if (sigaction(train_stop_signals[i], &sa, &old[i]) != 0)
            return error_errno(err, "train", "cannot install the handler of SIGUSR1 and SIGTERM");
    return 0;
}

static void restore_stop_handlers(const struct sigaction *old)
{
    for (int i = 0; i < 2; i++)
        sigaction(train_stop_signals[i], &old[i], NULL); /* the handlers we installed: cannot fail */
}

/* Why a run stops before train.steps. */
typedef enum StopReason { STOP_NONE, STOP_STEPS, STOP_TIME, STOP_SIGNAL } StopReason;

typedef struct StopRule {
    int64_t steps;     /* train.stop_after as a step count of this run, 0 = none */
    double seconds;    /* as a wall time since the run started (rank 0's clock), 0 = none */
    double t_begin;    /* when the run started, on rank 0 */
    double delay;      /* WLBTRAIN_STEP_DELAY (test hook) */
    StopReason reason; /* after the step that stopped the run */
    int signal;        /* the signal, for STOP_SIGNAL */
} StopRule;

static int stop_rule_init(StopRule *r, const Config *cfg, double t_begin, Error *err)
{
    memset(r, 0, sizeof *r);
    r->t_begin = t_begin;
    if (cfg->train.stop_after && config_stop_after(cfg->train.stop_after, &r->steps, &r->seconds) != 0)
        return error_set(err, "train.stop_after", "not a step count or a wall time: '%s'", cfg->train.stop_after);
    const char *d = getenv("WLBTRAIN_STEP_DELAY");
    if (d && *d && (parse_double(d, &r->delay) != 0 || r->delay < 0 || r->delay > 60))
        return error_set(err, "WLBTRAIN_STEP_DELAY", "expected seconds between 0 and 60, got '%s'", d);
    return 0;
}

/* This rank's votes after a step: [0] the signal that asked it to stop (0: none), [1] rank 0's
 * clock past a stop_after wall time. A signal may reach only some ranks (mpirun forwards it to all,
 * a kill by hand to one) and clocks differ, so the votes are agreed over the world (MAX) with the
 * step's other figures before stop_decide reads them. */
static void stop_votes(const StopRule *r, const Trainer *tr, double *votes)
{
    if (r->delay > 0 && tr->lay.rank == 0) {
        struct timespec ts = {(time_t)r->delay, (long)((r->delay - (double)(time_t)r->delay) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    votes[0] = (double)train_stop_signal;
    votes[1] = tr->lay.rank == 0 && r->seconds > 0 && clock_seconds() - r->t_begin >= r->seconds;
}

/* After step `step` (the run started after `done`), from the agreed votes: whether every rank stops
 * now (the step count is the same on every rank). */
static void stop_decide(StopRule *r, const double *votes, int64_t step, int64_t done)
{
    if (votes[0] > 0) {
        r->reason = STOP_SIGNAL;
        r->signal = (int)votes[0];
    } else if (votes[1] > 0) {
        r->reason = STOP_TIME;
    } else if (r->steps > 0 && step - done >= r->steps) {
        r->reason = STOP_STEPS;
    }
}

/* Rank 0's line on why the run stopped (after the line of the step). */
static void stop_report(const StopRule *r, const Config *cfg, int64_t step, int saved)
{
    char why[160];
    if (r->reason == STOP_SIGNAL)
        snprintf(why, sizeof why, "%s received", r->signal == SIGTERM ? "SIGTERM" : r->signal == SIGUSR1 ? "SIGUSR1"
                                                                                                       : "a signal");
    else
        snprintf(why, sizeof why, "train.stop_after %s reached", cfg->train.stop_after);
    printf("stop: %s; stopped after step %lld of %lld (the schedule is that of train.steps %lld)%s\n", why,
           (long long)step, (long long)cfg->train.steps, (long long)cfg->train.steps,
           saved ? "; resume with checkpoint.resume: auto" : "");
    if (!saved)
        fprintf(stderr, "wlbtrain: warning: checkpoint.dir: not set, so no checkpoint was written: this run cannot "
                        "be resumed from step %lld\n", (long long)step);
    fflush(stdout);
    fflush(stderr);
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

/* One JSON object per step; loss and grad_norm with all their digits (a resumed run must match
 * bit for bit), and after an evaluation the validation loss likewise. */
static int write_metrics(FILE *f, const char *path, int64_t step, const TrainStats *st, const Trainer *tr,
                         double ms, int64_t batch, Error *err)
{
    int64_t skipped = tr->skipped;
    double mem_predicted = tr->mem_predicted;
    fprintf(f, "{\"step\":%lld,\"slowest_rank\":%d,\"slowest_compute_s\":%.6g,\"median_compute_s\":%.6g,"
               "\"slowest_predicted_s\":%.6g,\"loss\":%.17g,\"lr\":%.6g,\"grad_norm\":%.17g,\"tokens\":%lld,\"batch_fraction\":%.6g,"
               "\"tokens_per_s\":%.1f,"
               "\"step_ms\":%.2f,\"pp_imbalance\":%.4f,\"pp_imbalance_measured\":%.4f,\"cp_imbalance\":%.4f,"
               "\"cp_imbalance_measured\":%.4f,\"queued\":%lld,\"token_delay_steps\":%.6g,\"delayed_tokens\":%lld,"
               "\"skipped\":%lld,\"attn_pairs\":%lld,\"mem_used_gb\":%.2f,\"mem_peak_gb\":%.6g,\"mem_predicted_gb\":%.6g",
            (long long)step, st->slowest_rank, st->slowest_compute_s, st->median_compute_s, st->slowest_predicted_s,
            st->loss, st->lr,
            st->grad_norm, (long long)st->tokens, (double)st->tokens / (double)batch, st->tokens / (ms / 1e3), ms,
            st->pp_imbalance, st->pp_imbalance_measured, st->cp_imbalance, st->cp_imbalance_measured,
            (long long)st->queued, st->token_delay_steps, (long long)st->delayed_tokens, (long long)skipped,
            (long long)st->attn_pairs, st->mem_used_gb, st->mem_peak_gb, mem_predicted / 1e9);
    trainer_write_mb_metrics(f, st); /* train_balance.c */
    train_trace_write_metrics(f, tr); /* a traced step: the ranks' own busy, communication and idle seconds */
    if (st->evaluated) {
        fprintf(f, ",\"valid_loss\":%.17g,\"valid_tokens\":%lld,\"eval_ms\":%.2f", st->valid_loss,
                (long long)st->valid_tokens, st->eval_s * 1e3);
        /* By position (train_eval.c): the buckets' first positions, mean losses (null: empty), counts. */
        const PositionLoss *p = &st->valid_by_position;
        for (int a = 0; a < 3; a++) {
            fputs(a == 0 ? ",\"valid_position_from\":[" : a == 1 ? "],\"valid_position_loss\":[" :
                  "],\"valid_position_targets\":[", f);
            for (int i = 0; i < p->n; i++) {
                if (i)
                    fputc(',', f);
                if (a == 0)
                    fprintf(f, "%lld", (long long)p->from[i]);
                else if (a == 1 && p->targets[i] > 0)
                    fprintf(f, "%.17g", p->loss[i]);
                else if (a == 1)
                    fputs("null", f);
                else
                    fprintf(f, "%lld", (long long)p->targets[i]);
            }
        }
        fputc(']', f);
    }
    fputs("}\n", f);
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
           "thread%s per rank; comm %s\n",
           cfg->model.preset ? cfg->model.preset : "custom", (long long)cfg->train.steps,
           (long long)cfg->data.global_batch_tokens, (long long)cfg->data.context_window, (long long)tr->m,
           tr->chunks[0].model.ops->name, comm_world_size(tr->comm), comm_world_size(tr->comm) > 1 ? "s" : "",
           (long long)p->tp, (long long)p->cp,
           (long long)p->pp, p->virtual_stages > 1 ? " (interleaved)" : "", (long long)p->dp,
           p->zero ? ", ZeRO-1" : "", (long long)params, omp_get_max_threads(), omp_get_max_threads() > 1 ? "s" : "",
           !tr->comm->mpi ? "none (one process)" : tr->comm->impl != &comm_mpi ? tr->comm->impl->name
                                                : tr->comm->stage ? "mpi, staged through the host" : "mpi");
    if (tr->n_chunks > 1) {
        char split[512];
        config_int_list_text(p->chunk_layers.v, tr->n_chunks, split, sizeof split);
        printf("train: layers per %s %s (parallel.stage_layers: %s)\n", tr->v > 1 ? "model chunk" : "stage", split,
               config_stage_layers_name((StageLayers)p->stage_layers.choice));
    }
    fflush(stdout);
}

/* The step of a log.metrics line (a JSON object with "step"), or INT64_MAX for a line that is not one:
 * such lines are dropped when the file is cut back. */
static int64_t metrics_line_step(const char *line)
{
    json_t *o = json_loads(line, 0, NULL);
    json_t *step = o ? json_object_get(o, "step") : NULL;
    int64_t s = json_is_integer(step) ? (int64_t)json_integer_value(step) : INT64_MAX;
    json_decref(o);
    return s;
}

/* log.metrics for a run that starts after step `first` - 1: a fresh file, or after a resume the
 * old one cut after that step (replaced atomically) and appended to. */
static int open_metrics(const char *path, int64_t first, FILE **out, Error *err)
{
    *out = NULL;
    if (file_make_parents(path, err) != 0)
        return -1;
    char *text = NULL;
    size_t len = 0;
    FILE *probe = first > 1 ? fopen(path, "r") : NULL;
    if (probe) {
        fclose(probe);
        if (file_read_text(path, "metrics file", &text, &len, err) != 0)
            return -1;
        AtomicFile a;
        if (atomic_open(&a, path, err) != 0) {
            free(text);
            return -1;
        }
        for (char *line = text, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next)
                *next++ = '\0';
            if (metrics_line_step(line) < first)
                fprintf(a.f, "%s\n", line);
        }
        free(text);
        if (atomic_commit(&a, err) != 0)
            return -1;
    }
    if (!(*out = fopen(path, probe ? "a" : "w")))
        return error_errno(err, path, "cannot create");
    return 0;
}

/* After `step`: a checkpoint when one is due, or when the run stops there (force); *saved: whether
 * one was written. */
static int maybe_save(Trainer *tr, const Config *cfg, int64_t step, int force, int *saved, Error *err)
{
    const ConfigCheckpoint *c = &cfg->checkpoint;
    *saved = 0;
    if (!c->dir || !(force || (c->every > 0 && step % c->every == 0) || step == cfg->train.steps))
        return 0;
    double t0 = clock_seconds();
    if (trainer_save(tr, step, err) != 0)
        return -1;
    *saved = 1;
    if (tr->lay.rank == 0) {
        printf("checkpoint: %s/step-%08lld (%.3f s)\n", c->dir, (long long)step, clock_seconds() - t0);
        fflush(stdout);
    }
    return 0;
}

/* After `step`: the validation loss when one is due (every train.eval_every steps and after the
 * last), into st. */
static int maybe_evaluate(Trainer *tr, const Config *cfg, int64_t step, TrainStats *st, Error *err)
{
    int64_t every = cfg->train.eval_every;
    if (every <= 0 || !(step % every == 0 || step == cfg->train.steps))
        return 0;
    EvalStats ev;
    if (trainer_evaluate(tr, step, &ev, err) != 0)
        return -1;
    st->evaluated = 1;
    st->valid_loss = ev.loss;
    st->valid_tokens = ev.tokens;
    st->eval_s = ev.seconds;
    st->valid_by_position = ev.by_position;
    return 0;
}

/* The tokens of the steps this process trained (rank 0), for their spread at the end. */
typedef struct BatchRecord {
    int64_t *tokens;
    int64_t n, cap, first_step;
} BatchRecord;

/* Records a step's tokens; one under 75% of the batch is warned of on stderr: the learning rate is
 * set for the batch, and that step's update runs at it on fewer tokens. */
static int batch_record(BatchRecord *b, int64_t step, int64_t tokens, int64_t batch, Error *err)
{
    if (batch_under_floor(tokens, batch))
        fprintf(stderr, "wlbtrain: warning: step %lld trained %lld tokens, %.1f%% of data.global_batch_tokens (%lld): "
                        "under %d%% of the batch its learning rate is set for\n", (long long)step, (long long)tokens,
                100.0 * (double)tokens / (double)batch, (long long)batch, BATCH_FLOOR_PERCENT);
    int64_t *bigger = array_grow(b->tokens, &b->cap, b->n + 1, sizeof *bigger);
    if (!bigger)
        return error_runtime(err, "training", "out of memory");
    b->tokens = bigger;
    if (b->n == 0)
        b->first_step = step;
    b->tokens[b->n++] = tokens;
    return 0;
}

/* The spread of the recorded steps' tokens against the batch, one line. */
static void batch_report(BatchRecord *b, int64_t batch)
{
    if (b->n == 0)
        return;
    BatchSpread s = batch_spread_of(b->tokens, b->n, batch);
    double pct = 100.0 / (double)batch;
    printf("batch: tokens per step over steps %lld-%lld against data.global_batch_tokens %lld: mean %.0f, p5 %lld "
           "(%.1f%%), p95 %lld (%.1f%%), min %lld (%.1f%%), max %lld (%.1f%%); %lld steps more than %d%% off it, %lld "
           "under %d%%\n", (long long)b->first_step, (long long)(b->first_step + b->n - 1), (long long)batch, s.mean,
           (long long)s.p5, pct * (double)s.p5, (long long)s.p95, pct * (double)s.p95, (long long)s.min,
           pct * (double)s.min, (long long)s.max, pct * (double)s.max, (long long)s.off_near, BATCH_NEAR_PERCENT,
           (long long)s.under_floor, BATCH_FLOOR_PERCENT);
    fflush(stdout);
}

/* The steps after `done`, on every rank, until train.steps or a stop (stop->reason); rank 0
 * reports. */
static int train_loop(Trainer *tr, const Config *cfg, const Fault *fault, int64_t done, StopRule *stop, Error *err)
{
    FILE *metrics = NULL;
    BatchRecord batch = {0};
    int lead = tr->lay.rank == 0;
    if (lead && cfg->log.metrics &&
        (open_metrics(cfg->log.metrics, done + 1, &metrics, err) != 0 || trainer_metrics_record(cfg, err) != 0)) {
        if (metrics)
            fclose(metrics);
        return -1;
    }
    int rc = 0;
    double t_start = clock_seconds();
    trainer_straggler_start(tr);
    for (int64_t step = done + 1; rc == 0 && stop->reason == STOP_NONE && step <= cfg->train.steps; step++) {
        double t0 = clock_seconds();
        TrainStats st;
        train_trace_step_begin(tr, step);
        rc = inject_fault(fault, tr, step, err);
        if (rc == 0)
            rc = trainer_forward_backward(tr, &st, err);
        if (rc == 0)
            rc = trainer_stragglers(tr, step, &st, err);
        double t_update = train_trace_compute_begin(tr);
        if (rc == 0)
            rc = trainer_update(tr, &st, err);
        train_trace_compute_end(tr, "optimizer", t_update);
        if (rc == 0) {
            size_t free_b, total_b;
            tr->ops->memory(&free_b, &total_b);
            st.mem_used_gb = (double)(total_b - free_b) / 1e9;
            /* One all-reduce (MAX) a step: the stop votes and the most memory any rank held. */
            /* ... and on a traced step every rank's own figures (train_trace.h). */
            double votes[3], *agreed;
            int n_votes;
            agreed = train_trace_votes(tr, step, votes, &n_votes);
            stop_votes(stop, tr, agreed);
            agreed[2] = (double)tr->ops->peak_bytes() / 1e9;
            train_trace_step_stop(tr, step, agreed + 3);
            rc = comm_allreduce_max_f64(tr->comm, GROUP_WORLD, agreed, n_votes, err);
            if (rc == 0)
                rc = train_trace_step_end(tr, step, agreed + 3, err);
            st.mem_peak_gb = agreed[2];
            if (rc == 0 && step < cfg->train.steps) /* a stop in the last step changes nothing */
                stop_decide(stop, agreed, step, done);
        }
        double t_eval = train_trace_step_host_begin(tr, step);
        if (rc == 0)
            rc = maybe_evaluate(tr, cfg, step, &st, err);
        if (st.evaluated)
            train_trace_host_end(tr, "evaluation", t_eval);
        /* The step's time (its evaluation and checkpoint not in it), and rank 0's metrics line
         * written before the checkpoint: a job that dies after the save (a hang in the vote after it,
         * say) and is resumed from it keeps every step's line. */
        double ms = (clock_seconds() - t0 - st.eval_s) * 1e3;
        if (rc == 0 && lead && metrics)
            rc = write_metrics(metrics, cfg->log.metrics, step, &st, tr, ms, cfg->data.global_batch_tokens, err);
        if (rc == 0)
            rc = train_trace_step_predicted(tr, step, err); /* outside the step's time */
        int saved = 0;
        double t_save = train_trace_step_host_begin(tr, step);
        if (rc == 0)
            rc = maybe_save(tr, cfg, step, stop->reason != STOP_NONE, &saved, err);
        if (saved)
            train_trace_host_end(tr, "checkpoint", t_save);
        if (rc == 0 && saved && stop->reason == STOP_NONE && step < cfg->train.steps) {
            /* A signal that came during the save (Slurm's SIGTERM, say): the checkpoint in hand is
             * this step's, so the run stops now instead of training one more step and saving again
             * inside the kill wait. One more small vote, only after a save. */
            double again[2] = {(double)train_stop_signal, 0};
            rc = comm_allreduce_max_f64(tr->comm, GROUP_WORLD, again, 2, err);
            if (rc == 0 && again[0] > 0)
                stop_decide(stop, again, step, done);
        }
        if (rc != 0 || !lead)
            continue;
        if (rc == 0)
            rc = batch_record(&batch, step, st.tokens, cfg->data.global_batch_tokens, err);
        if (st.skipped) {
            printf("step %5lld/%lld  loss %g  grad_norm %g: not finite, update skipped (%lld so far)\n",
                   (long long)step, (long long)cfg->train.steps, st.loss, st.grad_norm, (long long)tr->skipped);
            fflush(stdout);
        } else if (step % cfg->log.every == 0 || step == done + 1 || step == cfg->train.steps ||
                   stop->reason != STOP_NONE || st.evaluated) {
            char left[32], valid[64] = "";
            double elapsed = clock_seconds() - t_start;
            format_duration(elapsed / (double)(step - done) * (double)(cfg->train.steps - step), left, sizeof left);
            if (st.evaluated)
                snprintf(valid, sizeof valid, "  valid_loss %.4f (%.0f ms)", st.valid_loss, st.eval_s * 1e3);
            printf("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  tokens %lld  tokens/s %.0f  %.0f ms%s  "
                   "(%s left)\n", (long long)step, (long long)cfg->train.steps, st.loss, st.lr, st.grad_norm,
                   (long long)st.tokens, st.tokens / (ms / 1e3), ms, valid, left);
            fflush(stdout);
        }
        if (stop->reason != STOP_NONE)
            stop_report(stop, cfg, step, cfg->checkpoint.dir != NULL);
    }
    if (rc == 0) /* ZeRO-1: the last update's parameters gathered (parallel.overlap runs it ahead) */
        rc = trainer_params_ready(tr, err);
    if (metrics && fclose(metrics) != 0 && rc == 0)
        rc = error_errno(err, cfg->log.metrics, "cannot write");
    if (rc == 0 && lead)
        batch_report(&batch, cfg->data.global_batch_tokens);
    free(batch.tokens);
    const TrainValidRecord *r = &tr->valid_record;
    if (rc == 0 && lead && cfg->train.eval_every > 0 && r->last_step > 0) {
        printf("valid: valid_loss %.4f after step %lld; best %.4f after step %lld\n", r->last_loss,
               (long long)r->last_step, r->best_loss, (long long)r->best_step);
        fflush(stdout);
    }
    return rc;
}

/* Loads the checkpoint that checkpoint.resume names, if any, else the one of checkpoint.continue_from:
 * *done = the step training goes on after. */
static int resume(Trainer *tr, const Config *cfg, int64_t *done, Error *err)
{
    *done = 0;
    char *path = NULL;
    /* checkpoint.dir the earlier stage's folder: refused before resume auto would find its latest. */
    if (trainer_continue_check_dir(cfg, err) != 0 || trainer_checkpoint_path(cfg, &path, err) != 0)
        return -1;
    int lead = tr->lay.rank == 0, rc = 0;
    if (!path) {
        if (lead && cfg->checkpoint.resume)
            printf("resume: no checkpoint in %s yet, %s\n", cfg->checkpoint.dir,
                   cfg->checkpoint.continue_from ? "continuing from checkpoint.continue_from" : "starting at step 1");
        /* checkpoint.continue_from, if set (train_continue.c); the run's id (a new one; a continued
         * run records the checkpoint's as its parent) */
        rc = trainer_continue(tr, done, err);
        return rc == 0 ? trainer_run_id(tr, 0, cfg->checkpoint.continue_from != NULL, err) : -1;
    }
    double t0 = clock_seconds();
    rc = trainer_resume(tr, path, done, err);
    if (rc == 0)
        rc = trainer_run_id(tr, 1, 0, err); /* the checkpoint's run goes on */
    if (rc == 0 && lead)
        printf("resume: %s, after step %lld (%s; %.3f s)%s\n", path, (long long)*done, tr->resume_how,
               clock_seconds() - t0,
               *done >= cfg->train.steps ? " - train.steps is reached, nothing to train" : "");
    free(path);
    return rc;
}

/* train.warmup_steps set (in the file or by --set) longer than the run: the learning rate would never
 * reach train.lr. Refused when the run's length is the config's; when --steps or --set shortened the
 * run (a smoke test of a long config) a warning says so instead (warn: rank 0, once set up, so that
 * an error line stays the only line). The default (100) is left alone. */
static int check_warmup(const Config *cfg, int warn, Error *err)
{
    int k = config_key_find("train.warmup_steps"), ks = config_key_find("train.steps");
    const ConfigTrain *t = &cfg->train;
    if (k < 0 || ks < 0 || (cfg->origin[k].kind != ORIGIN_FILE && cfg->origin[k].kind != ORIGIN_SET) ||
        t->warmup_steps <= t->steps)
        return 0;
    char where[1200];
    config_where(cfg, k, where, sizeof where);
    if (cfg->origin[ks].kind == ORIGIN_SET && cfg->origin[k].kind == ORIGIN_FILE) {
        if (warn)
            fprintf(stderr, "wlbtrain: warning: %s: train.warmup_steps %lld is longer than this run's %lld steps: the "
                    "learning rate does not reach train.lr\n", where, (long long)t->warmup_steps, (long long)t->steps);
        return 0;
    }
    return error_set(err, where, "train.warmup_steps: %lld, longer than the run (train.steps %lld): the learning rate "
                     "would never reach train.lr; give at most %lld", (long long)t->warmup_steps, (long long)t->steps,
                     (long long)t->steps);
}

int trainer_run(Config *cfg, int *exit_status, Error *err)
{
    double t_begin = clock_seconds();
    *exit_status = 0;
    RuntimeLaunch launch = runtime_launch_from_env();
    Fault fault;
    StopRule stop;
    struct sigaction old[2];
    if (parse_fault(&fault, err) != 0 || stop_rule_init(&stop, cfg, t_begin, err) != 0)
        return -1;
    /* The layers placed (the same on every rank), then a layout that does not fit the device's
     * memory stops here, before anything starts. */
    double mem_predicted = 0;
    if (check_warmup(cfg, 0, err) != 0 || trainer_check_data(cfg, err) != 0 || trainer_check_lock(cfg, err) != 0 ||
        trainer_check_outputs(cfg, launch.rank == 0, err) != 0 ||
        trainer_checkpoint_precheck(cfg, launch.rank == 0, err) != 0 ||
        trainer_stage_layers(cfg, NULL, NULL, err) != 0 || trainer_memory_admit(cfg, &mem_predicted, err) != 0)
        return -1;
    /* Before MPI starts: a signal from then on asks for a stop instead of killing the rank. */
    if (install_stop_handlers(old, err) != 0)
        return -1;
    Comm comm;
    const ConfigParallel *p = &cfg->parallel;
    /* The collective watchdog (comm_watchdog.h; a job of more than one rank), from before MPI_Init:
     * a rank that never starts leaves the others in MPI_Init. Its flight recorder goes to
     * checkpoint.dir (made now, so that it is there when a hang is found). */
    char mark[4200];
    snprintf(mark, sizeof mark, "%s/x", cfg->checkpoint.dir ? cfg->checkpoint.dir : ".");
    int launched = strcmp(launch.launcher, "none") != 0;
    if (launched && launch.world_size > 1 && p->timeout_s > 0 &&
        ((cfg->checkpoint.dir && file_make_parents(mark, err) != 0) ||
         comm_watchdog_launch(launch.rank, launch.world_size, p->timeout_s, cfg->checkpoint.dir, &train_stop_signal,
                              err) != 0)) {
        restore_stop_handlers(old);
        return -1;
    }
    fault_at(&fault, launch.rank, FAULT_AT_START);
    if (comm_start(&comm, launched, err) != 0 ||
        comm_split(&comm, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp,
                   cfg->balance.cp_sharding == CP_GROUPS, err) != 0) {
        comm_finish(&comm);
        comm_watchdog_stop();
        restore_stop_handlers(old);
        return -1;
    }
    /* One job per run folder (train_runlock.h): rank 0 takes checkpoint.dir's lock and checks
     * log.metrics and the free space; every rank learns the outcome before anything is written. */
    RunLock lock;
    if (trainer_claim_outputs(cfg, &comm, &lock, err) != 0) {
        comm_finish(&comm);
        comm_watchdog_stop();
        restore_stop_handlers(old);
        return -1;
    }
    fault_at(&fault, comm_world_rank(&comm), FAULT_AT_SETUP);
    comm.fault_stop_in_finalize = fault.kind == FAULT_HANG && fault.step == FAULT_AT_FINALIZE &&
                                  fault.rank == comm_world_rank(&comm);
    Trainer tr;
    int64_t done = 0;
    int rc = trainer_init(&tr, cfg, &comm, err);
    tr.mem_predicted = mem_predicted;
    if (rc == 0)
        rc = train_trace_open(&tr, err); /* trace.steps: the measured timelines (train_trace.h) */
    if (rc == 0 && tr.lay.rank == 0) {
        print_banner(&tr, cfg);
        check_warmup(cfg, 1, err); /* the warning only: an error was returned before */
    }
    if (rc == 0 && tr.lay.rank == 0 && tr.valid && cfg->train.eval_every > 0) {
        char line[1024];
        trainer_valid_describe(&tr, line, sizeof line);
        printf("%s; every %lld steps and after the last\n", line, (long long)cfg->train.eval_every);
        fflush(stdout);
    }
    if (rc == 0)
        rc = resume(&tr, cfg, &done, err);
    if (rc == 0) {
        tr.updates_at_start = tr.chunks[0].optim.step;
        rc = train_loop(&tr, cfg, &fault, done, &stop, err);
    }
    Error trace_err = {0};
    if (train_trace_close(&tr, &trace_err) != 0 && rc == 0) {
        *err = trace_err;
        rc = -1;
    }
    if (rc != 0 && comm_world_size(&comm) > 1) {
        /* Alone, this rank would leave the others waiting in their next collective. */
        fprintf(stderr, "wlbtrain: error: rank %d: %s\n", comm_world_rank(&comm), err->msg);
        comm_abort(&comm, err->status ? err->status : 1);
    }
    if (rc == 0 && stop.reason == STOP_SIGNAL)
        *exit_status = TRAIN_EXIT_PREEMPTED;
    trainer_free(&tr);
    fault_at(&fault, comm_world_rank(&comm), FAULT_AT_END);
    comm_finish(&comm); /* the watchdog still runs: the final barrier and MPI_Finalize are bounded */
    comm_watchdog_stop();
    trainer_unclaim_outputs(&lock, 1); /* a run that returns releases it (exit 0, 75, or an error alone) */
    restore_stop_handlers(old);
    return rc;
}
