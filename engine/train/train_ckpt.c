/*
 * engine/train/train_ckpt.c - checkpoints: save the training state, resume from it (see train.h).
 *
 * A checkpoint is a folder checkpoint.dir/step-NNNNNNNN, sharded: every rank writes only what it
 * holds, all of them at once, and nothing travels through rank 0.
 *   shard-tpT-ppP-dpcpZ.bin  util/statefile.h sections (a CRC-32 each) of the rank with TP rank T,
 *                      pipeline rank P, DP x CP rank Z (= dp * cp_size + cp), for each of its model
 *                      chunks g (global chunk number, k * pp + P):
 *                        params.cG  the chunk's parameter vector, float32 as trained (its tensor
 *                                   blocks in the rank's layout, model.h); written by Z = 0 only:
 *                                   the ranks that differ in dp or cp hold the same weights
 *                        m.cG, v.cG AdamW's moments over the rank's optimizer range [begin, end) of
 *                                   that vector: all of it on Z = 0 without ZeRO-1 (the other Z
 *                                   write no file), each Z's own flat shard with ZeRO-1
 *   index.json         rank 0's, from the config alone (train_ckpt_index.c; read by
 *                      util/ckpt_index.c): format version, step, the layout that saved (tp,
 *                      cp, pp, dp, virtual_stages, zero, and stage_layers: the layers of each model chunk), the shard files, per (TP rank, chunk) its parameter count, weights section and moment shards
 *                      ({file, begin, end, m, v}), and per Hugging Face tensor name its full shape
 *                      and the blocks that make it up ({file, section, offset, tp, chunk, row0, rows,
 *                      col0, cols}: rows x cols floats at `offset` of that chunk's vector; only the
 *                      counted copy of replicated blocks - kv heads over TP, norms, tied embeddings),
 *                      and its checksum crc32 (util/ckpt_index.h); before any weight is read the
 *                      index, config.yaml and state.bin are checked against each other
 *                      (train_ckpt_check.c)
 *   state.bin          rank 0's sections: meta (u64 words: format 2, step, optimizer updates,
 *                      skipped steps, the model's shape, the layout that saved it, the window and
 *                      batch, and the updates before the LR schedule began - Optim.lr_step0, 0 in
 *                      checkpoints older than it, which wrote 0 there), planner (queues
 *                      and leftovers, plan_state_save), stream (the data position and shuffle state),
 *                      valid (the validation record: the step of the last evaluation, its loss, the
 *                      step of the best and its loss, and data.valid_fraction - u64 words, the
 *                      numbers' float64 bits; steps 0 when the run evaluated nothing; absent from
 *                      checkpoints older than it). Resuming with another valid_fraction is refused:
 *                      the saved stream position and queues belong to the stream of the saved split
 *   config.yaml        the resolved config (wlbtrain export reads the model's shape from it)
 * Saving: rank 0 makes .tmp-step-NNNNNNNN; every writing rank streams its sections from the backend
 * through one 16 MiB host buffer into its file (written under a temporary name, fsynced, renamed);
 * when all ranks report success rank 0 writes state.bin, config.yaml and index.json, fsyncs the
 * folder, renames it into place, points latest at it (replaced atomically) and removes the oldest
 * beyond checkpoint.keep. A job killed at any moment leaves latest naming a complete checkpoint.
 * Resuming (every rank reads state.bin and index.json, checked): on the layout that saved it (same
 * tp, pp, virtual_stages and layers per chunk: the same chunk vectors) a rank copies its weights from its params section
 * and its moments from the shards overlapping its optimizer range - with the same ZeRO-1 layout just
 * its own file - bit for bit; on any other layout each of its blocks comes from the full tensor
 * rebuilt from the index's blocks (one tensor at a time, host memory). A shard file is opened (and
 * its CRCs checked) only when one of its sections is needed. Checkpoints of format 1 (a gathered
 * model.safetensors) are refused with a clear error.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zlib.h>

#include "engine/comm/comm_watchdog.h"
#include "engine/train/train.h"
#include "util/ckpt_ident.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"
#include "util/statefile.h"

enum { META_FORMAT = 2, META_WORDS = 20 };

/* The words of the meta section that a config gives: the model's shape, the layout, the window and
 * batch (4 to 18). */
static void meta_config_words(const Config *cfg, uint64_t *w)
{
    const ConfigModel *m = &cfg->model;
    const ConfigParallel *p = &cfg->parallel;
    uint64_t v[15] = {(uint64_t)m->n_layers, (uint64_t)m->d_model, (uint64_t)m->n_heads, (uint64_t)m->n_kv_heads,
                      (uint64_t)m->d_ffn, (uint64_t)m->vocab_size, (uint64_t)m->tie_embeddings, (uint64_t)p->tp,
                      (uint64_t)p->cp, (uint64_t)p->pp, (uint64_t)p->dp, (uint64_t)p->virtual_stages,
                      (uint64_t)p->zero, (uint64_t)cfg->data.context_window, (uint64_t)cfg->data.global_batch_tokens};
    memcpy(w + 4, v, sizeof v);
}

/* The words of the meta section. */
static void meta_words(const Trainer *tr, int64_t step, uint64_t *w)
{
    w[0] = META_FORMAT;
    w[1] = (uint64_t)step;
    w[2] = (uint64_t)tr->chunks[0].optim.step;
    w[3] = (uint64_t)tr->skipped;
    meta_config_words(tr->cfg, w);
    w[19] = (uint64_t)tr->chunks[0].optim.lr_step0;
}

enum { VALID_WORDS = 5 };

/* The valid section's words: the validation record and the split (data.valid_fraction). */
static void record_words(const TrainValidRecord *r, double fraction, uint64_t *w)
{
    w[0] = (uint64_t)r->last_step;
    memcpy(&w[1], &r->last_loss, sizeof w[1]);
    w[2] = (uint64_t)r->best_step;
    memcpy(&w[3], &r->best_loss, sizeof w[3]);
    memcpy(&w[4], &fraction, sizeof w[4]);
}

/* The record from the valid section, when there is one (a section of another size is refused); with
 * check_fraction, a held-out share other than the config's is refused too. */
static int record_read(const StateSection *sec, TrainValidRecord *r, double fraction, int check_fraction,
                       const char *file, Error *err)
{
    uint64_t w[VALID_WORDS];
    if (!sec)
        return 0; /* saved before checkpoints kept one */
    if (sec->size != sizeof w)
        return error_set(err, file, "the valid section has %llu bytes, not %zu", (unsigned long long)sec->size,
                         sizeof w);
    memcpy(w, sec->data, sizeof w);
    double saved;
    memcpy(&saved, &w[4], sizeof saved);
    if (w[0] > ((uint64_t)1 << 48) || w[2] > w[0] || !(saved >= 0 && saved < 1))
        return error_set(err, file, "the valid section is corrupted (steps %llu, %llu, valid_fraction %g)",
                         (unsigned long long)w[0], (unsigned long long)w[2], saved);
    if (check_fraction && saved != fraction)
        return error_set(err, file, "saved by a run with data.valid_fraction %g, the config has %g: the saved data "
                         "position belongs to the other split's training stream (resume with %g, or start a new run)",
                         saved, fraction, saved);
    r->last_step = (int64_t)w[0];
    memcpy(&r->last_loss, &w[1], sizeof r->last_loss);
    r->best_step = (int64_t)w[2];
    memcpy(&r->best_loss, &w[3], sizeof r->best_loss);
    return 0;
}

static const char *const meta_model_keys[13] = {"model.n_layers", "model.d_model", "model.n_heads",
                                                "model.n_kv_heads", "model.d_ffn", "model.vocab_size",
                                                "model.tie_embeddings", "parallel.tp", "parallel.cp", "parallel.pp",
                                                "parallel.dp", "parallel.virtual_stages", "parallel.zero"};

/* The meta section's format word: 2, or an Error that names what the checkpoint is (dir: its folder). */
static int format_check(uint64_t format, const char *file, const char *dir, Error *err)
{
    if (format == 1)
        return error_set(err, file, "a checkpoint of the old gathered format (model.safetensors, training state "
                         "format 1); this wlbtrain reads sharded checkpoints (format %d): resume it with an older "
                         "wlbtrain, or start from its weights with train.init_from=%.200s/model.safetensors",
                         META_FORMAT, dir);
    if (format != META_FORMAT)
        return error_set(err, file, "training state format %llu; this wlbtrain reads %d", (unsigned long long)format,
                         META_FORMAT);
    return 0;
}

int trainer_meta_check(const Config *saved, const char *dir, int64_t *step, Error *err)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/state.bin", dir);
    StateFile sf;
    if (statefile_open(&sf, file, err) != 0)
        return -1;
    const StateSection *meta = statefile_find(&sf, "meta");
    uint64_t w[META_WORDS] = {0}, mine[META_WORDS] = {0};
    int rc = 0;
    if (!meta || meta->size != sizeof w)
        rc = error_set(err, file, "not a wlbtrain training state (no meta section of %zu bytes)", sizeof w);
    if (rc == 0) {
        memcpy(w, meta->data, sizeof w);
        meta_config_words(saved, mine);
        *step = (int64_t)w[1];
    }
    if (rc == 0)
        rc = format_check(w[0], file, dir, err);
    for (int i = 0; rc == 0 && i < 13; i++)
        if (w[4 + i] != mine[4 + i])
            rc = error_set(err, dir, "config.yaml has %s %llu, state.bin was saved with %llu: the checkpoint's "
                           "files disagree (config.yaml edited or from another run)", meta_model_keys[i],
                           (unsigned long long)mine[4 + i], (unsigned long long)w[4 + i]);
    statefile_close(&sf);
    return rc;
}

/* What a rank's shard file holds: per chunk its weights (the rank with dp = cp = 0 of its TP and
 * pipeline ranks) and its moments (that rank's, or with ZeRO-1 every rank's shard). Streamed from
 * the backend's memory through statefile's 16 MiB buffer. */
typedef struct ShardOut {
    const Ops *ops;
    const float *src[STATE_MAX_SECTIONS];
    const uint64_t *ident; /* section 0, in host memory */
} ShardOut;

static void shard_fill(void *ctx, int i, uint64_t at, void *buf, uint64_t n)
{
    const ShardOut *o = ctx;
    if (i == 0)
        memcpy(buf, (const unsigned char *)o->ident + at, (size_t)n);
    else
        o->ops->to_host(buf, o->src[i] + at / sizeof(float), (size_t)n);
}

/* The ident of what this rank writes (a shard file: its place; state.bin: none) after step. */
static CkptIdent ident_of(const Trainer *tr, int64_t step, int role)
{
    const ConfigParallel *p = &tr->cfg->parallel;
    int shard = role == CKPT_ROLE_SHARD;
    return (CkptIdent){tr->run_id, step, role, shard ? tr->lay.tp_rank : -1, shard ? tr->lay.pp_rank : -1,
                       shard ? tr->comm->rank[GROUP_DPCP] : -1, (int)p->tp, (int)p->cp, (int)p->pp, (int)p->dp,
                       (int)p->virtual_stages, (int)p->zero};
}

/* Writes this rank's shard file of the checkpoint after step (when it writes one: *sum's bytes 0
 * otherwise): its ident section first, then its chunks' sections; *sum its size and CRC-32. */
static int write_shard(Trainer *tr, int64_t step, const char *tmp, StateSum *sum, Error *err)
{
    int dpcp = tr->comm->rank[GROUP_DPCP], zero = (int)tr->cfg->parallel.zero;
    *sum = (StateSum){0, 0};
    if (dpcp != 0 && !zero)
        return 0; /* the same weights and moments as dpcp 0's */
    char names[STATE_MAX_SECTIONS][STATE_NAME_LEN], file[64], path[4200];
    uint64_t sizes[STATE_MAX_SECTIONS], ident[CKPT_IDENT_WORDS];
    CkptIdent id = ident_of(tr, step, CKPT_ROLE_SHARD);
    ckpt_ident_words(&id, ident);
    ShardOut o = {tr->ops, {0}, ident};
    int n = 1;
    snprintf(names[0], STATE_NAME_LEN, "%s", CKPT_IDENT_SECTION);
    sizes[0] = sizeof ident;
    for (int k = 0; k < tr->v; k++) {
        const Model *m = &tr->chunks[k].model;
        const Optim *op = &tr->chunks[k].optim;
        int g = k * tr->pp + tr->lay.pp_rank;
        if (n + 3 > STATE_MAX_SECTIONS)
            return error_runtime(err, "checkpoint", "%d chunks per stage: more sections than a shard file holds", tr->v);
        if (dpcp == 0) {
            snprintf(names[n], STATE_NAME_LEN, "params.c%d", g);
            sizes[n] = (uint64_t)m->n_params * sizeof(float);
            o.src[n++] = m->params;
        }
        for (int j = 0; j < 2; j++) {
            snprintf(names[n], STATE_NAME_LEN, "%s.c%d", j ? "v" : "m", g);
            sizes[n] = (uint64_t)(op->end - op->begin) * sizeof(float);
            o.src[n++] = j ? op->v : op->m;
        }
    }
    ckpt_shard_file(file, sizeof file, tr->lay.tp_rank, tr->lay.pp_rank, dpcp);
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    return statefile_write_stream(path, (const char (*)[STATE_NAME_LEN])names, sizes, n, shard_fill, &o, sum, err);
}

/* Every rank's shard file's size and CRC-32 to every rank (rank 0 lists them in the index), and
 * whether every rank wrote its file: one all-reduce of 6 numbers a rank - written (1) or failed (2),
 * its place (tp, pp, dpcp) and size; the CRC-32 and the size below 2^53 are exact in a double.
 * sums[i]: the file of files[i] of the index (TP rank, then pipeline rank, then dpcp). */
static int gather_sums(Trainer *tr, int rc, const StateSum *mine, StateSum *sums, int n_files, Error *err)
{
    int world = comm_world_size(tr->comm), me = comm_world_rank(tr->comm);
    int pp = (int)tr->cfg->parallel.pp, z = tr->cfg->parallel.zero ? (int)(tr->cfg->parallel.dp * tr->cfg->parallel.cp) : 1;
    double *all = calloc((size_t)world * 6, sizeof *all);
    if (!all)
        return error_runtime(err, "checkpoint", "out of memory");
    double *m = all + (size_t)me * 6;
    m[0] = rc != 0 ? 2 : mine->bytes > 0;
    m[1] = tr->lay.tp_rank, m[2] = tr->lay.pp_rank, m[3] = tr->comm->rank[GROUP_DPCP];
    m[4] = (double)mine->bytes, m[5] = (double)mine->crc;
    Error e2 = {0};
    int failed = comm_allreduce_sum_f64(tr->comm, GROUP_WORLD, all, (int64_t)world * 6, rc ? &e2 : err) != 0 ? -1 : 0;
    for (int r = 0; failed == 0 && r < world; r++) {
        const double *a = all + (size_t)r * 6;
        if (a[0] == 2) {
            failed = 1;
        } else if (a[0] == 1) {
            int i = ((int)a[1] * pp + (int)a[2]) * z + (int)a[3];
            if (i >= 0 && i < n_files)
                sums[i] = (StateSum){(uint64_t)a[4], (uint32_t)a[5]};
        }
    }
    free(all);
    if (rc != 0 || failed < 0)
        return -1;
    return failed ? error_runtime(err, "checkpoint", "another rank could not write its shard") : 0;
}

/* config.yaml's size and CRC-32, read back (a few kilobytes). */
static int file_sum(const char *path, StateSum *sum, Error *err)
{
    char *text;
    size_t n;
    if (file_read_text(path, "config", &text, &n, err) != 0)
        return -1;
    sum->bytes = n;
    sum->crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)n);
    free(text);
    return 0;
}

int trainer_run_id(Trainer *tr, int resumed, int continued, Error *err)
{
    if (resumed) { /* the checkpoint's run goes on (and keeps its parent) */
        tr->run_id = tr->loaded_run;
        tr->parent_run = tr->loaded_parent_run;
        tr->parent_step = tr->loaded_parent_step;
    } else if (continued) { /* a new stage: its own id, the checkpoint's run its parent */
        tr->run_id = 0;
        tr->parent_run = tr->loaded_run;
        tr->parent_step = tr->loaded_step;
    }
    if (tr->run_id != 0)
        return 0;
    /* A new id (a run at step 1, a new stage, or a checkpoint older than run ids): rank 0's, to every
     * rank in four 16-bit pieces (exact in the sum). */
    uint64_t id = 0;
    double piece[4] = {0};
    if (tr->lay.rank == 0 && ckpt_run_new(&id, err) != 0)
        id = 0; /* the others still take part; the error is reported below */
    for (int k = 0; k < 4; k++)
        piece[k] = (double)((id >> (16 * k)) & 0xffff);
    Error e2 = {0};
    if (comm_allreduce_sum_f64(tr->comm, GROUP_WORLD, piece, 4, id || tr->lay.rank ? err : &e2) != 0)
        return -1;
    for (int k = 0; k < 4; k++)
        tr->run_id |= (uint64_t)piece[k] << (16 * k);
    if (tr->run_id == 0)
        return tr->lay.rank == 0 ? -1 : error_runtime(err, "checkpoint", "rank 0 could not make a run id");
    return 0;
}

/* Every rank learns whether every rank's rc was 0 (instead of a barrier, which a failed rank would
 * leave the others waiting in); what: what a rank that failed could not do. */
static int all_ok(Trainer *tr, int rc, const char *what, Error *err)
{
    double failed = rc != 0;
    Error e2 = {0};
    if (comm_allreduce_sum_f64(tr->comm, GROUP_WORLD, &failed, 1, rc ? &e2 : err) != 0)
        return -1;
    if (rc != 0)
        return -1;
    return failed > 0 ? error_runtime(err, "checkpoint", "%s", what) : 0;
}

static int write_config(const Config *cfg, const char *path, Error *err)
{
    AtomicFile a;
    if (atomic_open(&a, path, err) != 0)
        return -1;
    if (config_print(cfg, a.f, err) != 0) {
        atomic_abort(&a);
        return -1;
    }
    return atomic_commit(&a, err);
}

/* Removes unfinished saves and the oldest checkpoints beyond keep (never the newest). */
static int prune(const char *dir, int64_t keep, Error *err)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return error_errno(err, dir, "cannot list");
    char (*names)[16] = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dh))) {
        if (!strncmp(e->d_name, ".tmp-step-", 10)) {
            char *p = malloc(strlen(dir) + strlen(e->d_name) + 2);
            if (!p)
                rc = error_runtime(err, dir, "out of memory");
            else {
                sprintf(p, "%s/%s", dir, e->d_name);
                rc = file_remove_tree(p, err);
                free(p);
            }
        } else if (ckpt_is_step_name(e->d_name)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                char (*grown)[16] = realloc(names, (size_t)cap * sizeof *names);
                if (!grown) {
                    rc = error_runtime(err, dir, "out of memory");
                    break;
                }
                names = grown;
            }
            snprintf(names[n++], 16, "%.13s", e->d_name);
        }
    }
    closedir(dh);
    if (rc == 0 && n > keep) {
        qsort(names, (size_t)n, sizeof *names, (int (*)(const void *, const void *))strcmp);
        for (int i = 0; rc == 0 && i < n - keep; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            rc = file_remove_tree(path, err);
        }
    }
    free(names);
    return rc;
}

static int finish_checkpoint(Trainer *tr, int64_t step, const char *tmp, const StateSum *sums, int n_files, Error *err);

int trainer_save(Trainer *tr, int64_t step, Error *err)
{
    const char *dir = tr->cfg->checkpoint.dir;
    int lead = tr->lay.rank == 0, rc = 0;
    if (trainer_params_ready(tr, err) != 0)
        return -1;
    char tmp[4096], final[4096], name[32], path[4200];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    if (lead) {
        snprintf(path, sizeof path, "%s/x", tmp);
        if (file_remove_tree(tmp, err) != 0 || file_make_parents(path, err) != 0)
            rc = -1;
    }
    /* The folder exists before anyone writes into it; every shard is on disk (fsynced) before rank 0
     * finishes the checkpoint. */
    comm_watchdog_note_checkpoint(step, 0);
    if (all_ok(tr, rc, "rank 0 could not make the checkpoint's folder", err) != 0)
        return -1;
    if (tr->fault_signal_in_save)
        raise(SIGTERM); /* the test of a stop signal during a save: the handler only records it */
    const ConfigParallel *p = &tr->cfg->parallel;
    int n_files = (int)(p->tp * p->pp * (p->zero ? p->dp * p->cp : 1));
    StateSum mine, *sums = calloc((size_t)n_files, sizeof *sums);
    if (!sums)
        rc = error_runtime(err, "checkpoint", "out of memory");
    if (rc == 0)
        rc = write_shard(tr, step, tmp, &mine, err);
    if (gather_sums(tr, rc, &mine, sums, n_files, err) != 0) {
        free(sums);
        return -1;
    }
    rc = lead ? finish_checkpoint(tr, step, tmp, sums, n_files, err) : 0;
    free(sums);
    /* Every rank learns that rank 0 finished it (latest names it): what a stop line says from now on
     * (comm_watchdog.h). Then rank 0 removes the oldest, which may take a while on a slow file
     * system - the others wait in their next collective. */
    if (all_ok(tr, rc, "rank 0 could not finish the checkpoint", err) != 0)
        return -1;
    comm_watchdog_note_checkpoint(step, 1);
    if (tr->fault_stall_after_save > 0) {
        struct timespec ts = {(time_t)tr->fault_stall_after_save, 0};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        } /* the test of a slow removal: the others' stop line must say the checkpoint is complete */
    }
    return lead ? prune(dir, tr->cfg->checkpoint.keep, err) : 0;
}

/* Rank 0's part of the checkpoint after `step`, once every shard is written (sums: their sizes and
 * CRC-32s): state.bin, config.yaml and index.json into tmp, the folder into place, latest at it. */
static int finish_checkpoint(Trainer *tr, int64_t step, const char *tmp, const StateSum *sums, int n_files, Error *err)
{
    const char *dir = tr->cfg->checkpoint.dir;
    char final[4096], name[32], path[4200];
    int rc = 0;
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    if (tr->fault_kill_in_save) {
        fflush(stdout);
        raise(SIGKILL); /* the test of an interrupted save */
    }
    uint64_t meta[META_WORDS], ident[CKPT_IDENT_WORDS];
    meta_words(tr, step, meta);
    CkptIdent id = ident_of(tr, step, CKPT_ROLE_STATE);
    ckpt_ident_words(&id, ident);
    CkptBinding bound = {tr->run_id, tr->parent_run, tr->parent_step, sums, n_files, {0, 0}, {0, 0}};
    size_t np = plan_state_words(&tr->planner), ns = data_stream_state_words(&tr->stream);
    uint64_t *planner = malloc((np + 1) * sizeof *planner), *stream = malloc((ns + 1) * sizeof *stream);
    if (!planner || !stream) {
        rc = error_runtime(err, "checkpoint", "out of memory");
    } else {
        plan_state_save(&tr->planner, planner);
        data_stream_save(&tr->stream, stream);
        uint64_t valid[VALID_WORDS];
        record_words(&tr->valid_record, tr->cfg->data.valid_fraction, valid);
        StateSection s[5] = {{"meta", meta, sizeof meta},
                             {"planner", planner, np * sizeof *planner},
                             {"stream", stream, ns * sizeof *stream},
                             {"valid", valid, sizeof valid},
                             {CKPT_IDENT_SECTION, ident, sizeof ident}};
        snprintf(path, sizeof path, "%s/state.bin", tmp);
        rc = statefile_write(path, s, 5, &bound.state_sum, err);
    }
    free(planner);
    free(stream);
    snprintf(path, sizeof path, "%s/config.yaml", tmp);
    if (rc == 0)
        rc = write_config(tr->cfg, path, err);
    if (rc == 0)
        rc = file_sum(path, &bound.config_sum, err);
    snprintf(path, sizeof path, "%s/index.json", tmp);
    if (rc == 0)
        rc = trainer_index_write(tr->cfg, step, &bound, path, err);
    /* Into place: a checkpoint of the same step (a resumed run saving again) is replaced. */
    if (rc == 0 && (file_sync_dir(tmp, err) != 0 || file_remove_tree(final, err) != 0))
        rc = -1;
    if (rc == 0 && rename(tmp, final) != 0)
        rc = error_errno(err, final, "cannot rename the finished checkpoint into place");
    if (rc == 0)
        rc = file_sync_dir(dir, err);
    snprintf(path, sizeof path, "%s/latest", dir);
    AtomicFile a;
    if (rc == 0 && atomic_open(&a, path, err) == 0) {
        fprintf(a.f, "%s\n", name);
        rc = atomic_commit(&a, err);
    } else if (rc == 0) {
        rc = -1;
    }
    return rc;
}

int trainer_checkpoint_path(const Config *cfg, char **path, Error *err)
{
    *path = NULL;
    const char *r = cfg->checkpoint.resume;
    if (!r)
        return 0;
    if (!strcmp(r, "auto")) {
        char latest[4200];
        struct stat st;
        snprintf(latest, sizeof latest, "%s/latest", cfg->checkpoint.dir);
        if (stat(latest, &st) != 0)
            return 0; /* nothing saved yet: start at step 1 */
        r = cfg->checkpoint.dir;
    }
    return ckpt_step_folder(r, path, err);
}

int trainer_load_checkpoint(Trainer *tr, const char *path, unsigned what, int64_t *step, Error *err)
{
    int full = (what & CKPT_LOAD_STREAM) != 0, moments = (what & CKPT_LOAD_MOMENTS) != 0;
    char file[4200];
    snprintf(file, sizeof file, "%s/state.bin", path);
    StateFile sf;
    if (statefile_open(&sf, file, err) != 0)
        return -1;
    const StateSection *meta = statefile_find(&sf, "meta"), *planner = statefile_find(&sf, "planner");
    const StateSection *stream = statefile_find(&sf, "stream");
    int rc = 0;
    uint64_t w[META_WORDS] = {0}, mine[META_WORDS];
    if (!meta || !planner || !stream || meta->size != sizeof w)
        rc = error_set(err, file, "not a wlbtrain training state (sections meta, planner, stream)");
    if (rc == 0) {
        memcpy(w, meta->data, sizeof w);
        meta_words(tr, 0, mine);
        rc = format_check(w[0], file, path, err);
        for (int i = 0; rc == 0 && i < 7; i++)
            if (w[4 + i] != mine[4 + i])
                rc = error_set(err, file, "saved for a model with %s %llu, the config has %llu", meta_model_keys[i],
                               (unsigned long long)w[4 + i], (unsigned long long)mine[4 + i]);
    }
    TrainValidRecord record = {0};
    /* The index and config.yaml against each other and state.bin (trainer_checkpoint_check) were
     * checked before MPI started, by every caller (trainer_checkpoint_precheck, wlbtrain eval's):
     * not again here, where it would read every shard's header a second time on every rank. */
    if (rc == 0)
        rc = record_read(statefile_find(&sf, "valid"), &record, tr->cfg->data.valid_fraction, full, file, err);
    CkptIndex ix;
    int have_index = rc == 0 && ckpt_index_open(&ix, path, err) == 0;
    if (rc == 0 && !have_index)
        rc = -1;
    if (rc == 0) {
        tr->loaded_run = ix.run;
        tr->loaded_parent_run = ix.parent_run;
        tr->loaded_parent_step = ix.parent_step;
        tr->loaded_step = (int64_t)w[1];
        rc = trainer_restore_shards(tr, &ix, (int64_t)w[1], !moments, path, err);
    }
    if (have_index)
        ckpt_index_close(&ix);
    /* Words in the file may be unaligned: copy them out first. */
    uint64_t *words = rc == 0 && full ? malloc((size_t)(planner->size > stream->size ? planner->size : stream->size) + 8)
                                      : NULL;
    if (rc == 0 && full && !words)
        rc = error_runtime(err, "checkpoint", "out of memory");
    if (rc == 0 && full) {
        memcpy(words, planner->data, (size_t)planner->size);
        rc = plan_state_restore(&tr->planner, words, (size_t)(planner->size / 8), err);
    }
    if (rc == 0 && full) {
        memcpy(words, stream->data, (size_t)stream->size);
        rc = data_stream_restore(&tr->stream, words, (size_t)(stream->size / 8), err);
    }
    free(words);
    if (rc == 0 && moments) {
        if (w[19] > w[2])
            rc = error_set(err, file, "the meta section is corrupted (the LR schedule began after update %llu of "
                           "%llu)", (unsigned long long)w[19], (unsigned long long)w[2]);
        for (int k = 0; rc == 0 && k < tr->v; k++) {
            tr->chunks[k].optim.step = (int64_t)w[2];
            tr->chunks[k].optim.lr_step0 = (int64_t)w[19];
        }
        tr->skipped = (int64_t)w[3];
    }
    if (rc == 0) {
        tr->valid_record = record;
        *step = (int64_t)w[1];
    }
    if (rc != 0 && err->msg[0] && strncmp(err->msg, path, strlen(path)) != 0) {
        /* Name the checkpoint in errors from the planner and the stream. */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        snprintf(err->msg, sizeof err->msg, "%.200s: %.800s", path, msg);
    }
    statefile_close(&sf);
    return rc;
}

int trainer_resume(Trainer *tr, const char *path, int64_t *step, Error *err)
{
    return trainer_load_checkpoint(tr, path, CKPT_LOAD_MOMENTS | CKPT_LOAD_STREAM, step, err);
}

int trainer_load_weights(Trainer *tr, const char *path, int64_t *step, Error *err)
{
    return trainer_load_checkpoint(tr, path, 0, step, err);
}
