/*
 * test/dump_train.c - trains a few steps with the real trainer on any layout (run it under mpirun)
 * and writes what the equivalence tests compare (test/test_parallel.c):
 *
 *   mpirun -np N dump_train CONFIG.yaml OUT.safetensors [--set KEY=VALUE ...]
 *
 * OUT holds, gathered onto rank 0 in full Hugging Face shapes: loss and tokens (one per step,
 * F64), grad.NAME for every weight after step 1's backward (the reduced gradients the optimizer
 * sees, before clipping), and param.NAME after the last step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/comm/runtime.h"
#include "engine/train/train.h"
#include "util/safetensors.h"

static void die(const Comm *c, const Error *err)
{
    fprintf(stderr, "dump_train: rank %d: %s\n", c ? comm_world_rank(c) : 0, err->msg);
    if (c)
        comm_abort(c, 1);
    exit(1);
}

/* Every full tensor, gathered (all ranks), added to w on rank 0 as PREFIX.NAME. */
static void add_tensors(Trainer *tr, StWriter *w, const char *prefix, int grads)
{
    const ModelDims *d = &tr->chunks[0].model.dims;
    Error err = {0};
    for (int i = 0; i < model_full_tensor_count(d); i++) {
        char name[96], key[128];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        float *full = malloc((size_t)(rows * cols) * sizeof *full);
        if (!full || trainer_gather(tr, name, grads, full, &err) != 0)
            die(tr->comm, err.msg[0] ? &err : &(Error){1, "out of memory"});
        int64_t shape[2] = {rows, cols};
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        if (tr->lay.rank == 0 && st_writer_add(w, key, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, full, &err) != 0)
            die(tr->comm, &err);
        free(full);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fputs("usage: dump_train CONFIG.yaml OUT.safetensors [--set KEY=VALUE ...]\n", stderr);
        return 2;
    }
    Error err = {0};
    RuntimeLaunch launch = runtime_launch_from_env();
    Config cfg;
    config_init(&cfg);
    if (config_load_file(&cfg, argv[1], &err) != 0)
        die(NULL, &err);
    for (int i = 3; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "--set") || config_apply_set(&cfg, argv[i + 1], &err) != 0)
            die(NULL, err.msg[0] ? &err : &(Error){2, "expected --set KEY=VALUE"});
    if (config_resolve(&cfg, launch.world_size, &err) != 0)
        die(NULL, &err);
    Comm comm;
    const ConfigParallel *p = &cfg.parallel;
    if (comm_start(&comm, strcmp(launch.launcher, "none") != 0, &err) != 0 ||
        comm_split(&comm, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp,
                   cfg.balance.cp_sharding == CP_GROUPS, &err) != 0)
        die(NULL, &err);
    Trainer tr;
    if (trainer_init(&tr, &cfg, &comm, &err) != 0)
        die(&comm, &err);
    int64_t steps = cfg.train.steps;
    double *loss = calloc((size_t)steps, sizeof *loss), *tokens = calloc((size_t)steps, sizeof *tokens);
    StWriter w = {0};
    for (int64_t s = 0; s < steps; s++) {
        TrainStats st;
        if (trainer_forward_backward(&tr, &st, &err) != 0)
            die(&comm, &err);
        if (s == 0)
            add_tensors(&tr, &w, "grad", 1);
        if (trainer_update(&tr, &st, &err) != 0)
            die(&comm, &err);
        loss[s] = st.loss;
        tokens[s] = (double)st.tokens;
    }
    add_tensors(&tr, &w, "param", 0);
    if (comm_world_rank(&comm) == 0) {
        int64_t n = steps;
        if (st_writer_add(&w, "loss", ST_F64, &n, 1, loss, &err) != 0 ||
            st_writer_add(&w, "tokens", ST_F64, &n, 1, tokens, &err) != 0 || st_write(&w, argv[2], &err) != 0)
            die(&comm, &err);
    }
    st_writer_free(&w);
    free(loss);
    free(tokens);
    trainer_free(&tr);
    comm_finish(&comm);
    config_free(&cfg);
    return 0;
}
