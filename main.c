/*
 * main.c - wlbtrain's entry: parse the command line, load and resolve the config, run the job.
 *
 * Dependencies point one way: main -> cli, config, engine -> data, util; the engine reaches the
 * backends (cpu/, cuda/) only through the tables that backends.c registers (docs/architecture.md;
 * test/test_layering.py checks every include).
 * Every error ends here: "wlbtrain: error: WHERE: WHAT" on stderr, exit 2 for bad input, 1 at run time.
 * A training run stopped by SIGUSR1 or SIGTERM exits 75 (TRAIN_EXIT_PREEMPTED) once its checkpoint
 * is written. `wlbtrain eval` loads its config here too (eval_config) and runs through the trainer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "config/config.h"
#include "engine/plan/dryrun.h"
#include "engine/comm/runtime.h"
#include "engine/train/calibrate.h"
#include "engine/train/train.h"
#include "engine/train/train_memory.h"
#include "engine/train/train_search.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"
#include "engine/train/train_stages.h"

/* Loads the config file, applies --set and --steps, and resolves it for this launch. */
static int load_config(const CliOptions *opt, Config *cfg, const RuntimeLaunch *launch, Error *err)
{
    config_init(cfg);
    if (config_load_file(cfg, opt->config_path, err) != 0)
        return -1;
    for (int i = 0; i < opt->n_sets; i++)
        if (config_apply_set(cfg, opt->sets[i], err) != 0)
            return -1;
    if (opt->trace) { /* --trace STEPS = --set trace.steps=STEPS */
        char arg[1100];
        if (snprintf(arg, sizeof arg, "trace.steps=%s", opt->trace) >= (int)sizeof arg)
            return error_set(err, "--trace", "too long: '%.40s...'", opt->trace);
        if (config_apply_set(cfg, arg, err) != 0)
            return -1;
    }
    if (opt->steps > 0) {
        char arg[64];
        snprintf(arg, sizeof arg, "train.steps=%lld", (long long)opt->steps);
        if (config_apply_set(cfg, arg, err) != 0)
            return -1;
    }
    /* A dry run simulates the configured cluster and --print-config shows it as written; training
     * runs in the world it was launched into (one process when started by hand). */
    int world = opt->dry_run ? 0 : launch->world_size;
    if (opt->print_config && !strcmp(launch->launcher, "none"))
        world = 0;
    return config_resolve(cfg, world, err);
}

/* `wlbtrain eval`: the config is --config's, or the checkpoint's config.yaml with the layout of the
 * launch (one process, or data-parallel over the launched ranks), before --set; train.init_from none
 * with --checkpoint, --init-from's file otherwise. *owned: a string cfg points to, for the caller to free after it. */
static int eval_config(const CliOptions *opt, Config *cfg, const RuntimeLaunch *launch, char **owned, Error *err)
{
    static const char *const own_layout[] = {"parallel.tp=1", "parallel.cp=1", "parallel.pp=1",
                                             "parallel.virtual_stages=1", "parallel.dp=auto", "parallel.zero=0"};
    config_init(cfg);
    *owned = NULL;
    char *dir = NULL;
    int rc = 0;
    if (opt->config_path) {
        rc = config_load_file(cfg, opt->config_path, err);
    } else if ((rc = ckpt_step_folder(opt->eval.checkpoint, &dir, err)) == 0) {
        char *path = malloc(strlen(dir) + sizeof "/config.yaml");
        if (!path)
            rc = error_runtime(err, "eval", "out of memory");
        else
            sprintf(path, "%s/config.yaml", dir);
        if (rc == 0)
            rc = config_load_file(cfg, path, err);
        free(path);
        for (size_t i = 0; rc == 0 && i < sizeof own_layout / sizeof own_layout[0]; i++)
            rc = config_apply_set(cfg, own_layout[i], err);
    }
    free(dir);
    if (rc == 0 && opt->eval.checkpoint) /* the checkpoint's weights replace whatever init_from would load */
        rc = config_apply_set(cfg, "train.init_from=none", err);
    if (rc == 0) /* evaluation continues no run: the weights are --checkpoint's or --init-from's */
        rc = config_apply_set(cfg, "checkpoint.continue_from=none", err);
    if (rc == 0 && opt->eval.init_from) {
        if (!(*owned = malloc(strlen(opt->eval.init_from) + sizeof "train.init_from=")))
            return error_runtime(err, "eval", "out of memory");
        sprintf(*owned, "train.init_from=%s", opt->eval.init_from);
        rc = config_apply_set(cfg, *owned, err);
    }
    for (int i = 0; rc == 0 && i < opt->n_sets; i++)
        rc = config_apply_set(cfg, opt->sets[i], err);
    return rc == 0 ? config_resolve(cfg, launch->world_size, err) : -1;
}

/* Under a launcher every rank reads the same config and finds the same bad input: rank 0 says it
 * at once; another rank waits 3 s first - when rank 0 failed alike, the launcher (mpirun) has
 * ended the job by then and the line is said once, not once per rank; when only this rank failed
 * (its node cannot write checkpoint.dir, say), it is still said, with the rank. */
static void error_exit_once(const Error *err)
{
    RuntimeLaunch l = runtime_launch_from_env();
    if (l.rank > 0 && strcmp(l.launcher, "none") != 0 && err->status == ERROR_INPUT) {
        fflush(stdout);
        struct timespec ts = {3, 0};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        fprintf(stderr, "wlbtrain: error: rank %d: %s\n", l.rank, err->msg);
        exit(ERROR_INPUT);
    }
    error_exit(err);
}

/* `wlbtrain export`: the output folder checked writable (nothing made yet) and the checkpoint's
 * files checked against each other as a resume checks them (trainer_checkpoint_check), then exported. */
static int export_checked(const CliExport *x, Error *err)
{
    char *dir;
    if (file_check_writable(x->out, 1, "--out", err) != 0 || ckpt_step_folder(x->checkpoint, &dir, err) != 0)
        return -1;
    int rc = trainer_checkpoint_check(dir, 1, err);
    free(dir);
    return rc == 0 ? cli_export(x, err) : -1;
}

/* *exit_status: 0, or the trainer's TRAIN_EXIT_PREEMPTED (a run stopped by a signal). */

/* The cost model prices NCCL's links: on GPUs parallel.comm: mpi stages every collective and message
 * through host memory, which no prediction of the dry run or the search sees. */
static void warn_host_staged(const Config *cfg)
{
    if (cfg->train.device == DEVICE_CUDA && cfg->parallel.comm == COMM_MPI)
        fprintf(stderr, "wlbtrain: warning: parallel.comm: mpi on GPUs stages every collective and message through "
                "host memory; the dry run prices NCCL's links, so such a run is slower than predicted "
                "(parallel.comm: auto takes NCCL when each rank has a GPU of its own)\n");
}
static int run(const CliOptions *opt, int *exit_status, Error *err)
{
    RuntimeLaunch launch = runtime_launch_from_env();
    Config cfg;
    char *owned = NULL;
    int rc = opt->command == CLI_EVAL ? eval_config(opt, &cfg, &launch, &owned, err) : load_config(opt, &cfg, &launch, err);
    if (rc == 0 && opt->command == CLI_EVAL) {
        /* parallel.stage_layers: auto placed as training places it (every rank alike). */
        rc = trainer_stage_layers(&cfg, NULL, NULL, err);
        if (rc == 0)
            rc = trainer_eval_run(&cfg, opt->eval.checkpoint, opt->eval.out, err);
    } else if (rc == 0 && opt->command == CLI_CALIBRATE) {
        rc = calibrate_run(&cfg, opt->calibrate_out, err);
    } else if (rc == 0 && opt->print_config) {
        if (launch.rank == 0)
            rc = config_print(&cfg, stdout, err);
    } else if (rc == 0 && opt->dry_run && opt->search) {
        SearchOptions so = {opt->config_path, opt->sets, opt->n_sets, opt->gpus,
                            opt->steps ? opt->steps : SEARCH_DEFAULT_STEPS, opt->search_out, opt->stats_out,
                            opt->search_all};
        warn_host_staged(&cfg);
        rc = cfg.parallel.dp > 0 || opt->gpus ? trainer_search_run(&cfg, &so, err)
                                 : error_set(err, "parallel.dp", "the search needs the config's layout as numbers (dp: "
                                             "set parallel.dp, or give --gpus N)");
    } else if (rc == 0 && opt->dry_run) {
        /* parallel.stage_layers: auto placed (for every rank alike), then the memory each rank needs:
         * a layout that does not fit is refused here as in training. */
        DryRunMemoryPlan memory = {0};
        rc = cfg.parallel.dp > 0 ? trainer_stage_layers(&cfg, NULL, NULL, err) : 0;
        if (rc == 0 && cfg.parallel.dp > 0)
            rc = trainer_memory_plan(&cfg, &memory, err);
        if (rc == 0 && memory.stages && !opt->no_memory_check)
            rc = trainer_memory_check(&cfg, &memory, err);
        DryRunOptions dr = {cfg.train.steps, opt->stats_out, opt->compare, memory.stages ? &memory : NULL};
        if (rc == 0)
            warn_host_staged(&cfg);
        if (rc == 0)
            rc = dryrun_run(&cfg, &dr, err);
        trainer_memory_free(&memory);
    } else if (rc == 0) {
        rc = trainer_run(&cfg, exit_status, err);
    }
    config_free(&cfg);
    free(owned);
    return rc;
}

int main(int argc, char **argv)
{
    Error err = {0};
    CliOptions opt;
    int exit_status = 0;
    int rc = cli_parse(argc, argv, &opt, &err);
    if (rc == 0) {
        switch (opt.command) {
        case CLI_HELP:
            cli_print_help(opt.help_topic);
            break;
        case CLI_HELP_CONFIG:
            config_print_reference(stdout);
            break;
        case CLI_VERSION:
            cli_print_version();
            break;
        case CLI_INSPECT: {
            int checkpoint = 0; /* a checkpoint (engine/train), else a data set or flight records */
            rc = trainer_checkpoint_inspect(opt.inspect_prefix, &checkpoint, &err);
            if (!checkpoint)
                rc = cli_inspect(opt.inspect_prefix, &err);
            break;
        }
        case CLI_CONVERT:
            rc = cli_convert(&opt.convert, &err);
            break;
        case CLI_EXPORT:
            rc = export_checked(&opt.export_, &err);
            break;
        case CLI_RUN:
        case CLI_CALIBRATE:
        case CLI_EVAL:
            rc = run(&opt, &exit_status, &err);
            break;
        }
    }
    cli_free(&opt);
    if (rc != 0)
        error_exit_once(&err);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        error_runtime(&err, "stdout", "cannot write the output");
        error_exit(&err);
    }
    return exit_status;
}
