/*
 * engine/train/train_ckpt.c - checkpoints: save the training state, resume from it (see train.h).
 *
 * A checkpoint is a folder checkpoint.dir/step-NNNNNNNN:
 *   model.safetensors  every weight in full, Hugging Face Llama names, F32 (gathered from all
 *                      ranks: the file does not depend on the layout that wrote it)
 *   state.bin          util/statefile.h sections, each CRC-checked:
 *                        meta     u64 words: format, step, optimizer updates, skipped steps, then
 *                                 the model's shape and the layout that saved it
 *                        planner  the planner's words (plan_state_save): queues and leftovers
 *                        stream   the data stream's words (data_stream_save): the position and
 *                                 the shuffle's state - the only random state training has
 *                        moments  AdamW's m then v of every full tensor, in Hugging Face order
 *   config.yaml        the resolved config (wlbtrain export reads the model's shape from it)
 * Rank 0 writes it under .tmp-step-NNNNNNNN, fsyncs every file, renames the folder into place and
 * only then points checkpoint.dir/latest at it (itself replaced atomically), and removes the
 * oldest beyond checkpoint.keep. A job killed at any moment leaves latest naming a complete
 * checkpoint. Resuming reads the full tensors and gives each rank its blocks, so a checkpoint
 * resumes on any layout (tp, cp, pp, dp, zero); on the same layout it continues bit for bit.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/train/train.h"
#include "util/fileio.h"
#include "util/safetensors.h"
#include "util/statefile.h"

enum { META_FORMAT = 1, META_WORDS = 20 };

/* The words of the meta section. */
static void meta_words(const Trainer *tr, int64_t step, uint64_t *w)
{
    const ConfigModel *m = &tr->cfg->model;
    const ConfigParallel *p = &tr->cfg->parallel;
    uint64_t v[META_WORDS] = {META_FORMAT, (uint64_t)step, (uint64_t)tr->chunks[0].optim.step, (uint64_t)tr->skipped,
                              (uint64_t)m->n_layers, (uint64_t)m->d_model, (uint64_t)m->n_heads,
                              (uint64_t)m->n_kv_heads, (uint64_t)m->d_ffn, (uint64_t)m->vocab_size,
                              (uint64_t)m->tie_embeddings, (uint64_t)p->tp, (uint64_t)p->cp, (uint64_t)p->pp,
                              (uint64_t)p->dp, (uint64_t)p->virtual_stages, (uint64_t)p->zero,
                              (uint64_t)tr->cfg->data.context_window, (uint64_t)tr->cfg->data.global_batch_tokens, 0};
    memcpy(w, v, sizeof v);
}

static const char *const meta_model_keys[7] = {"model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads",
                                               "model.d_ffn", "model.vocab_size", "model.tie_embeddings"};

/* AdamW's moments of every chunk laid out like its parameters (ZeRO-1 keeps a shard: the shards
 * are all-gathered into copies, freed by the caller). */
static int full_moments(Trainer *tr, const float **m, const float **v, float **own, Error *err)
{
    for (int k = 0; k < tr->v; k++) {
        Optim *o = &tr->chunks[k].optim;
        Model *md = &tr->chunks[k].model;
        if (!tr->cfg->parallel.zero) {
            m[k] = o->m;
            v[k] = o->v;
            continue;
        }
        for (int j = 0; j < 2; j++) {
            float *full = md->ops->alloc((size_t)md->n_params * sizeof *full);
            if (!full)
                return error_runtime(err, "checkpoint", "out of memory");
            own[2 * k + j] = full;
            if (trainer_gather_shards(tr, md, full, j ? o->v : o->m, err) != 0)
                return -1;
            (j ? v : m)[k] = full;
        }
    }
    return 0;
}

/* The weights into model.safetensors and the moments into a buffer (rank 0's; all ranks gather). */
static int gather_state(Trainer *tr, const char *weights_path, float **moments, uint64_t *moments_size, Error *err)
{
    const ModelDims *d = &tr->chunks[0].model.dims;
    int lead = tr->lay.rank == 0, n = model_full_tensor_count(d), rc = 0;
    int64_t total = 0, most = 0;
    for (int i = 0; i < n; i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        total += rows * cols;
        most = rows * cols > most ? rows * cols : most;
    }
    const float *params[64], *m[64], *v[64];
    float *own[128] = {0};
    for (int k = 0; k < tr->v; k++)
        params[k] = tr->chunks[k].model.params;
    StWriter w = {0};
    float *full = malloc((size_t)most * sizeof *full);
    *moments = lead ? malloc((size_t)(2 * total) * sizeof **moments) : NULL;
    *moments_size = (uint64_t)(2 * total) * sizeof **moments;
    if (!full || (lead && !*moments))
        rc = error_runtime(err, "checkpoint", "out of memory");
    if (rc == 0)
        rc = full_moments(tr, m, v, own, err);
    int64_t at = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        int64_t shape[2] = {rows, cols};
        rc = trainer_gather_arrays(tr, name, params, full, err);
        if (rc == 0 && lead)
            rc = st_writer_add(&w, name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, full, err);
        for (int j = 0; rc == 0 && j < 2; j++) {
            rc = trainer_gather_arrays(tr, name, j ? v : m, full, err);
            if (rc == 0 && lead)
                memcpy(*moments + at + j * rows * cols, full, (size_t)(rows * cols) * sizeof *full);
        }
        at += 2 * rows * cols;
    }
    if (rc == 0 && lead) {
        char shape[160];
        snprintf(shape, sizeof shape, "%d layers, d_model %d, vocabulary %d", d->n_layers, d->d, d->vocab);
        rc = st_writer_meta(&w, "format", "pt", err);
        if (rc == 0)
            rc = st_writer_meta(&w, "wlbtrain_model", shape, err);
        if (rc == 0)
            rc = st_write(&w, weights_path, err);
    }
    for (int k = 0; k < 2 * tr->v; k++)
        if (own[k])
            tr->chunks[k / 2].model.ops->free(own[k]);
    st_writer_free(&w);
    free(full);
    return rc;
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

static int is_step_dir(const char *name) { return !strncmp(name, "step-", 5) && strlen(name) == 13; }

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
        } else if (is_step_dir(e->d_name)) {
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

int trainer_save(Trainer *tr, int64_t step, Error *err)
{
    const char *dir = tr->cfg->checkpoint.dir;
    int lead = tr->lay.rank == 0, rc = 0;
    char tmp[4096], final[4096], name[32], path[4200];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    if (lead) {
        snprintf(path, sizeof path, "%s/x", tmp);
        if (file_remove_tree(tmp, err) != 0 || file_make_parents(path, err) != 0)
            return -1;
    }
    float *moments = NULL;
    uint64_t moments_size = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    rc = gather_state(tr, path, &moments, &moments_size, err);
    if (rc == 0 && lead && tr->fault_kill_in_save) {
        fflush(stdout);
        raise(SIGKILL); /* the test of an interrupted save */
    }
    if (rc == 0 && lead) {
        uint64_t meta[META_WORDS];
        meta_words(tr, step, meta);
        size_t np = plan_state_words(&tr->planner), ns = data_stream_state_words(&tr->stream);
        uint64_t *planner = malloc((np + 1) * sizeof *planner), *stream = malloc((ns + 1) * sizeof *stream);
        if (!planner || !stream) {
            rc = error_runtime(err, "checkpoint", "out of memory");
        } else {
            plan_state_save(&tr->planner, planner);
            data_stream_save(&tr->stream, stream);
            StateSection s[4] = {{"meta", meta, sizeof meta},
                                 {"planner", planner, np * sizeof *planner},
                                 {"stream", stream, ns * sizeof *stream},
                                 {"moments", moments, moments_size}};
            snprintf(path, sizeof path, "%s/state.bin", tmp);
            rc = statefile_write(path, s, 4, err);
        }
        free(planner);
        free(stream);
        snprintf(path, sizeof path, "%s/config.yaml", tmp);
        if (rc == 0)
            rc = write_config(tr->cfg, path, err);
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
        if (rc == 0)
            rc = prune(dir, tr->cfg->checkpoint.keep, err);
    }
    free(moments);
    return rc;
}

int trainer_checkpoint_path(const Config *cfg, char **path, Error *err)
{
    *path = NULL;
    const char *r = cfg->checkpoint.resume;
    if (!r)
        return 0;
    const char *dir = strcmp(r, "auto") ? r : cfg->checkpoint.dir;
    char latest[4096], *text = NULL;
    snprintf(latest, sizeof latest, "%s/latest", dir);
    struct stat st;
    if (stat(latest, &st) != 0) {
        if (!strcmp(r, "auto"))
            return 0; /* nothing saved yet: start at step 1 */
        return (*path = strdup(r)) ? 0 : error_runtime(err, r, "out of memory");
    }
    size_t len;
    if (file_read_text(latest, "checkpoint pointer", &text, &len, err) != 0)
        return -1;
    text[strcspn(text, "\n")] = '\0';
    if (!is_step_dir(text)) {
        int rc = error_set(err, latest, "names '%.40s', not a step-NNNNNNNN folder", text);
        free(text);
        return rc;
    }
    *path = malloc(strlen(dir) + strlen(text) + 2);
    if (*path)
        sprintf(*path, "%s/%s", dir, text);
    free(text);
    return *path ? 0 : error_runtime(err, dir, "out of memory");
}

/* Each chunk's moments from the full tensors of the moments section. */
static int restore_moments(Trainer *tr, const StateSection *sec, const char *where, Error *err)
{
    const ModelDims *d = &tr->chunks[0].model.dims;
    int n = model_full_tensor_count(d);
    uint64_t want = 0;
    for (int i = 0; i < n; i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        want += (uint64_t)(2 * rows * cols) * sizeof(float);
    }
    if (sec->size != want)
        return error_set(err, where, "the moments section has %llu bytes, this model needs %llu",
                         (unsigned long long)sec->size, (unsigned long long)want);
    for (int k = 0; k < tr->v; k++) {
        TrainChunk *ch = &tr->chunks[k];
        Model *m = &ch->model;
        float *host[2] = {malloc((size_t)m->n_params * sizeof(float)), malloc((size_t)m->n_params * sizeof(float))};
        float *full = malloc(sizeof(float) * (size_t)(sec->size / sizeof(float) / 2 + 1));
        int rc = host[0] && host[1] && full ? 0 : error_runtime(err, "checkpoint", "out of memory");
        const unsigned char *p = sec->data;
        for (int i = 0; rc == 0 && i < n; i++) {
            char name[96];
            int64_t rows, cols;
            int vec;
            model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
            for (int j = 0; j < 2; j++, p += (size_t)(rows * cols) * sizeof(float)) {
                memcpy(full, p, (size_t)(rows * cols) * sizeof(float)); /* the section may be unaligned */
                model_put_block(m, name, full, host[j]);
            }
        }
        if (rc == 0) {
            Optim *o = &ch->optim;
            m->ops->to_device(o->m, host[0] + o->begin, (size_t)(o->end - o->begin) * sizeof(float));
            m->ops->to_device(o->v, host[1] + o->begin, (size_t)(o->end - o->begin) * sizeof(float));
        }
        free(host[0]);
        free(host[1]);
        free(full);
        if (rc != 0)
            return -1;
    }
    return 0;
}

int trainer_resume(Trainer *tr, const char *path, int64_t *step, Error *err)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/state.bin", path);
    StateFile sf;
    if (statefile_open(&sf, file, err) != 0)
        return -1;
    const StateSection *meta = statefile_find(&sf, "meta"), *planner = statefile_find(&sf, "planner");
    const StateSection *stream = statefile_find(&sf, "stream"), *moments = statefile_find(&sf, "moments");
    int rc = 0;
    uint64_t w[META_WORDS] = {0}, mine[META_WORDS];
    if (!meta || !planner || !stream || !moments || meta->size != sizeof w)
        rc = error_set(err, file, "not a wlbtrain training state (sections meta, planner, stream, moments)");
    if (rc == 0) {
        memcpy(w, meta->data, sizeof w);
        meta_words(tr, 0, mine);
        if (w[0] != META_FORMAT)
            rc = error_set(err, file, "training state format %llu; this wlbtrain reads %d", (unsigned long long)w[0],
                           META_FORMAT);
        for (int i = 0; rc == 0 && i < 7; i++)
            if (w[4 + i] != mine[4 + i])
                rc = error_set(err, file, "saved for a model with %s %llu, the config has %llu", meta_model_keys[i],
                               (unsigned long long)w[4 + i], (unsigned long long)mine[4 + i]);
    }
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    for (int k = 0; rc == 0 && k < tr->v; k++)
        rc = model_load(&tr->chunks[k].model, file, err);
    if (rc == 0)
        rc = restore_moments(tr, moments, path, err);
    /* Words in the file may be unaligned: copy them out first. */
    uint64_t *words = rc == 0 ? malloc((size_t)(planner->size > stream->size ? planner->size : stream->size) + 8) : NULL;
    if (rc == 0 && !words)
        rc = error_runtime(err, "checkpoint", "out of memory");
    if (rc == 0) {
        memcpy(words, planner->data, (size_t)planner->size);
        rc = plan_state_restore(&tr->planner, words, (size_t)(planner->size / 8), err);
    }
    if (rc == 0) {
        memcpy(words, stream->data, (size_t)stream->size);
        rc = data_stream_restore(&tr->stream, words, (size_t)(stream->size / 8), err);
    }
    free(words);
    if (rc == 0) {
        for (int k = 0; k < tr->v; k++)
            tr->chunks[k].optim.step = (int64_t)w[2];
        tr->skipped = (int64_t)w[3];
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
