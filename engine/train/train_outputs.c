/*
 * engine/train/train_outputs.c - what a training run will write, checked before any work (see
 * train.h, trainer_check_outputs):
 *   - checkpoint.dir and log.metrics can be written (util/fileio.h's file_check_writable: a folder
 *     that takes a new file of 64 KiB, so a read-only, full or over-quota file system is found at
 *     the start, not at the first save, checkpoint.every steps of work later);
 *   - checkpoint.dir holds no checkpoint of another run that this one would replace. A run that
 *     starts at step 1 (checkpoint.resume none, or auto without a latest) in a folder holding step
 *     folders would overwrite them and move latest back; a run resuming a checkpoint of another
 *     folder would mix two runs in this one (checkpoint.keep would remove the other's); a run resuming
 *     a step of its own folder that has later steps would replace them. Each is refused, naming what
 *     is there and how to resume or start afresh.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/train/train.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"

/* The step folders of dir: how many, the first and the last name ("" when none). A dir that does
 * not exist holds none. */
static int step_folders(const char *dir, int *n, char *first, char *last, Error *err)
{
    *n = 0;
    first[0] = last[0] = '\0';
    DIR *dh = opendir(dir);
    if (!dh)
        return errno == ENOENT || errno == ENOTDIR ? 0 : error_errno(err, dir, "cannot list the checkpoint folder");
    struct dirent *e;
    while ((e = readdir(dh))) {
        if (!ckpt_is_step_name(e->d_name))
            continue;
        if (!*n || strcmp(e->d_name, first) < 0)
            snprintf(first, 16, "%.13s", e->d_name);
        if (!*n || strcmp(e->d_name, last) > 0)
            snprintf(last, 16, "%.13s", e->d_name);
        (*n)++;
    }
    closedir(dh);
    return 0;
}

/* 1 when the folders a and b are the same folder (both exist). */
static int same_folder(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int check_not_another_run(const Config *cfg, Error *err)
{
    const char *dir = cfg->checkpoint.dir;
    char first[16], last[16], held[64];
    int n;
    if (step_folders(dir, &n, first, last, err) != 0)
        return -1;
    if (n == 0)
        return 0;
    snprintf(held, sizeof held, n == 1 ? "%s" : "%s ... %s", first, last);
    char *path = NULL, latest[4200];
    struct stat st;
    snprintf(latest, sizeof latest, "%s/latest", dir);
    int has_latest = stat(latest, &st) == 0;
    if (trainer_checkpoint_path(cfg, &path, err) != 0)
        return -1;
    int rc = 0;
    if (!path) {
        rc = error_set(err, "checkpoint.dir", "%s holds %d checkpoint%s of another run (%s)%s; starting at step 1 "
                       "would replace them. Resume it (checkpoint.resume: %s%s%s), or give a new checkpoint.dir (or "
                       "remove those step folders to start afresh)", dir, n, n == 1 ? "" : "s", held,
                       has_latest ? "" : " but no latest", has_latest ? "auto" : dir, has_latest ? "" : "/",
                       has_latest ? "" : last);
    } else {
        /* The step folder resumed and the folder it is in. */
        const char *base = strrchr(path, '/');
        char *parent = base ? strndup(path, (size_t)(base - path) + (base == path)) : strdup(".");
        base = base ? base + 1 : path;
        if (!parent)
            rc = error_runtime(err, "checkpoint.dir", "out of memory");
        else if (!same_folder(parent, dir))
            rc = error_set(err, "checkpoint.dir", "%s holds %d checkpoint%s of another run (%s); resuming %s into it "
                           "would mix the two runs (checkpoint.keep removes the oldest). Give an empty checkpoint.dir, "
                           "or resume that run (checkpoint.resume: %s)", dir, n, n == 1 ? "" : "s", held, path, dir);
        else if (strcmp(last, base) > 0)
            rc = error_set(err, "checkpoint.dir", "%s holds %s, later than the resumed %s: this run would replace it "
                           "and move latest back. Resume the latest (checkpoint.resume: auto), or remove the later "
                           "step folders to go back to %s", dir, last, base, base);
        free(parent);
    }
    free(path);
    return rc;
}

int trainer_check_outputs(const Config *cfg, int lead, Error *err)
{
    if (cfg->checkpoint.dir) {
        if (trainer_continue_check_dir(cfg, err) != 0 || check_not_another_run(cfg, err) != 0)
            return -1;
        if (file_check_writable(cfg->checkpoint.dir, 1, "checkpoint.dir", err) != 0)
            return -1;
    }
    /* log.metrics is rank 0's. */
    if (lead && cfg->log.metrics && file_check_writable(cfg->log.metrics, 0, "log.metrics", err) != 0)
        return -1;
    return 0;
}
