/*
 * test/dump_train.c - trains a few steps with the real trainer on any layout (run it under mpirun)
 * and writes what the equivalence tests compare (test/test_parallel.c, test/test_cp_nested.c):
 *
 *   mpirun -np N dump_train CONFIG.yaml OUT.safetensors [--layout LAYOUT] [--set KEY=VALUE ...]
 *
 * OUT holds, gathered onto rank 0 in full Hugging Face shapes: loss and tokens (one per step,
 * F64), grad.NAME for every weight after step 1's backward (the reduced gradients the optimizer
 * sees, before clipping), and param.NAME after the last step. With a validation set in the config
 * (data.valid_path or data.valid_fraction) also valid_loss and valid_tokens (F64, one each): the
 * evaluation after the last step (trainer_evaluate, forward only), and its loss by token position:
 * valid_position_loss and valid_position_targets (F64, one per bucket; 0 for an empty bucket's loss).
 *
 * --layout: one step of a plan made here by hand, not by the planner (trainer_run_plan; OUT holds
 * loss, tokens and grad.NAME). LAYOUT places the documents of every micro-batch over the CP ranks:
 * FIRST:SIZE per document, comma-separated - SIZE 1: whole on CP rank FIRST; SIZE > 1: sharded
 * per_doc over the aligned block [FIRST, FIRST + SIZE) (2 SIZE chunks, chunks i and 2 SIZE - 1 - i
 * on rank FIRST + i), its K/V exchanged in that block. Blocks may nest: "0:4,0:2,2:2,3:1" at CP 4
 * puts ranks 2 and 3 in [0, 4) and [2, 4). With parallel.cp = 1 every document is whole on the one
 * rank: the reference. Every micro-batch of the step holds as many documents as LAYOUT names, the
 * next documents of the data set of 16 to 255 tokens, in order (the same whatever the layout).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/comm/runtime.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"
#include "util/safetensors.h"

enum { MAX_DOCS = 64 }; /* documents a LAYOUT names */

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

/* Parses LAYOUT into first[], size[]; the number of documents, -1 when malformed or not blocks of cp. */
static int parse_layout(const char *s, int cp, int *first, int *size)
{
    int n = 0;
    while (*s && n < MAX_DOCS) {
        char *end;
        long f = strtol(s, &end, 10), g;
        if (*end != ':')
            return -1;
        g = strtol(end + 1, &end, 10);
        if ((*end && *end != ',') || g < 1 || f < 0 || f % g != 0 || f + g > cp || (g & (g - 1)) != 0)
            return -1;
        first[n] = (int)f;
        size[n++] = (int)g;
        s = *end ? end + 1 : end;
    }
    return *s ? -1 : n;
}

/* Rank r's share of micro-batch i, whose documents lie as first[], size[] say: its ranges and
 * segments (queries per piece, keys from the document's start), and the blocks it exchanges in. */
static int add_rank(StepPlan *p, const PlanMicroBatch *mb, int r, const int *first, const int *size)
{
    int64_t k = plan_add_rank(p), tokens = 0, first_range = p->n_ranges, first_segment = p->n_segments;
    uint32_t exchanges = 0;
    if (k < 0)
        return -1;
    for (int64_t j = 0; j < mb->n_docs; j++) {
        const PlanDoc *d = &p->docs[mb->first_doc + j];
        int f = first[j], g = size[j];
        if (r < f || r >= f + g)
            continue;
        if (g == 1) {
            if (plan_add_range(p, r, d->start, d->len) < 0 || plan_add_segment(p, r, d->start, d->len, d->start) < 0)
                return -1;
            tokens += d->len;
            continue;
        }
        /* per_doc over the block: 2 g chunks of len / 2 g tokens, the first len mod 2 g one more. */
        int n = 2 * g;
        int64_t at = d->start;
        for (int c = 0; c < n; c++) {
            int64_t len = d->len / n + (c < d->len % n);
            if (f + (c < g ? c : n - 1 - c) == r) {
                if (plan_add_range(p, r, at, len) < 0 || plan_add_segment(p, r, at, len, d->start) < 0)
                    return -1;
                tokens += len;
            }
            at += len;
        }
        exchanges |= 1u << plan_block_depth(plan_block_of(p->cp, f, g));
    }
    PlanRank *pr = &p->ranks[k];
    pr->tokens = tokens;
    pr->exchanges = exchanges;
    pr->first_range = first_range;
    pr->n_ranges = p->n_ranges - first_range;
    pr->first_segment = first_segment;
    pr->n_segments = p->n_segments - first_segment;
    return 0;
}

/* The step: dp x m micro-batches, each with the next documents of 16 to 255 tokens, laid out. */
static int make_plan(Trainer *tr, const int *first, const int *size, int n_docs, Error *err)
{
    StepPlan *p = &tr->plan;
    int cp = tr->lay.cp;
    plan_reset(p, 0, tr->lay.dp, tr->m, cp);
    if (!p->mbs)
        return error_runtime(err, "dump_train", "out of memory");
    const DataSource *src = &tr->data.src[0];
    uint64_t doc = 0;
    for (int64_t i = 0; i < (int64_t)tr->lay.dp * tr->m; i++) {
        PlanMicroBatch *mb = &p->mbs[i];
        mb->replica = (int32_t)(i / tr->m);
        mb->order = (int32_t)(i % tr->m);
        mb->mode = CP_GROUPS;
        mb->first_doc = p->n_docs;
        int64_t at = 0;
        for (int k = 0; k < n_docs; k++) {
            int64_t len = 0;
            while (doc < src->n_docs && ((len = (int64_t)data_source_doc_len(src, doc)) < 16 || len > 255))
                doc++;
            if (doc >= src->n_docs)
                return error_set(err, "dump_train", "the data set has too few documents of 16 to 255 tokens");
            int whole = cp == 1 || size[k] == 1;
            PlanDoc d = {0, doc++, 0, len, at, p->n_docs, 0, whole ? (cp == 1 ? 0 : first[k]) : -1,
                         cp == 1 ? 0 : first[k], cp == 1 ? 1 : size[k]};
            if (plan_add_doc(p, &d) < 0)
                return error_runtime(err, "dump_train", "out of memory");
            at += len;
        }
        mb->n_docs = p->n_docs - mb->first_doc;
        mb->tokens = at;
        p->tokens += at;
        mb->first_rank = p->n_ranks;
        int one[MAX_DOCS] = {0}, zero[MAX_DOCS] = {0};
        for (int k = 0; k < n_docs; k++)
            one[k] = 1;
        for (int r = 0; r < cp; r++)
            if (add_rank(p, mb, r, cp == 1 ? zero : first, cp == 1 ? one : size) != 0)
                return error_runtime(err, "dump_train", "out of memory");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fputs("usage: dump_train CONFIG.yaml OUT.safetensors [--layout LAYOUT] [--set KEY=VALUE ...]\n", stderr);
        return 2;
    }
    Error err = {0};
    RuntimeLaunch launch = runtime_launch_from_env();
    Config cfg;
    config_init(&cfg);
    if (config_load_file(&cfg, argv[1], &err) != 0)
        die(NULL, &err);
    const char *layout = NULL;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layout"))
            layout = argv[i + 1];
        else if (strcmp(argv[i], "--set") || config_apply_set(&cfg, argv[i + 1], &err) != 0)
            die(NULL, err.msg[0] ? &err : &(Error){2, "expected --set KEY=VALUE or --layout LAYOUT"});
    }
    if (config_resolve(&cfg, launch.world_size, &err) != 0 || trainer_stage_layers(&cfg, NULL, NULL, &err) != 0)
        die(NULL, &err);
    Comm comm;
    const ConfigParallel *p = &cfg.parallel;
    if (comm_start(&comm, strcmp(launch.launcher, "none") != 0, &err) != 0 ||
        comm_split(&comm, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp,
                   cfg.balance.cp_sharding == CP_GROUPS, &err) != 0)
        die(NULL, &err);
    int first[MAX_DOCS], size[MAX_DOCS], n_docs = 0;
    if (layout && (n_docs = parse_layout(layout, (int)p->cp == 1 ? 1 << 30 : (int)p->cp, first, size)) < 1)
        die(&comm, &(Error){2, "LAYOUT: FIRST:SIZE per document, comma-separated, aligned blocks of CP ranks"});
    Trainer tr;
    if (trainer_init(&tr, &cfg, &comm, &err) != 0)
        die(&comm, &err);
    int64_t steps = layout ? 1 : cfg.train.steps;
    double *loss = calloc((size_t)steps, sizeof *loss), *tokens = calloc((size_t)steps, sizeof *tokens);
    StWriter w = {0};
    int64_t allocs_after_first = 0;
    for (int64_t s = 0; s < steps; s++) {
        TrainStats st;
        int64_t allocs0 = tr.ops->alloc_calls();
        if (layout && (make_plan(&tr, first, size, n_docs, &err) != 0 || trainer_run_plan(&tr, &st, &err) != 0))
            die(&comm, &err);
        if (!layout && trainer_forward_backward(&tr, &st, &err) != 0)
            die(&comm, &err);
        if (s == 0)
            add_tensors(&tr, &w, "grad", 1);
        if (!layout && trainer_update(&tr, &st, &err) != 0)
            die(&comm, &err);
        loss[s] = st.loss;
        tokens[s] = (double)st.tokens;
        if (s > 0)
            allocs_after_first += tr.ops->alloc_calls() - allocs0;
    }
    /* No step after the first allocates the backend's memory (train_setup.c, reserve_step_buffers). */
    double worst_allocs = (double)allocs_after_first;
    if (comm_allreduce_max_f64(&comm, GROUP_WORLD, &worst_allocs, 1, &err) != 0)
        die(&comm, &err);
    if (worst_allocs > 0) {
        error_runtime(&err, "train", "steps after the first allocated or freed the backend's memory %.0f times on a "
                      "rank (Ops.alloc_calls): a step must allocate nothing once the first is over", worst_allocs);
        die(&comm, &err);
    }
    if (!layout)
        add_tensors(&tr, &w, "param", 0);
    EvalStats ev = {0};
    if (!layout && tr.valid && trainer_evaluate(&tr, steps, &ev, &err) != 0)
        die(&comm, &err);
    if (comm_world_rank(&comm) == 0) {
        int64_t n = steps, one = 1;
        double valid[2] = {ev.loss, (double)ev.tokens}, by_pos[2][EVAL_MAX_BUCKETS];
        int64_t nb = ev.by_position.n;
        for (int i = 0; i < nb; i++) {
            by_pos[0][i] = ev.by_position.targets[i] > 0 ? ev.by_position.loss[i] : 0;
            by_pos[1][i] = (double)ev.by_position.targets[i];
        }
        if (st_writer_add(&w, "loss", ST_F64, &n, 1, loss, &err) != 0 ||
            st_writer_add(&w, "tokens", ST_F64, &n, 1, tokens, &err) != 0 ||
            (ev.steps > 0 && (st_writer_add(&w, "valid_loss", ST_F64, &one, 1, &valid[0], &err) != 0 ||
                              st_writer_add(&w, "valid_tokens", ST_F64, &one, 1, &valid[1], &err) != 0 ||
                              st_writer_add(&w, "valid_position_loss", ST_F64, &nb, 1, by_pos[0], &err) != 0 ||
                              st_writer_add(&w, "valid_position_targets", ST_F64, &nb, 1, by_pos[1], &err) != 0)) ||
            st_write(&w, argv[2], &err) != 0)
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
