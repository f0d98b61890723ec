/* util/ckpt_folder.c - the names of a checkpoint's shard files and step folders, and which step folder
 * a path a user gives names (declared in ckpt_index.h, whose reader and callers use them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/ckpt_index.h"
#include "util/fileio.h"

void ckpt_shard_file(char *buf, size_t size, int tp, int pp, int dpcp)
{
    snprintf(buf, size, "shard-tp%d-pp%d-dpcp%d.bin", tp, pp, dpcp);
}

int ckpt_is_step_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 13)
        return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

int ckpt_step_folder(const char *path, char **step, Error *err)
{
    *step = NULL;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--; /* "ckpt/" names ckpt */
    char *dir = strndup(path, n), *file = malloc(n + 16), *text = NULL;
    if (!dir || !file) {
        free(dir);
        free(file);
        return error_runtime(err, path, "out of memory");
    }
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    struct stat st;
    int rc = 0, follow = 1;
    if (stat(dir, &st) != 0) {
        rc = error_errno(err, dir, "no checkpoint here");
    } else if (!S_ISDIR(st.st_mode)) {
        /* The pointer file itself: its folder is the checkpoint folder. */
        if (strcmp(base, "latest") != 0)
            rc = error_set(err, dir, "a file, not a checkpoint: give a checkpoint folder (checkpoint.dir), its "
                           "latest, or one of its step-NNNNNNNN folders");
        strcpy(file, dir);
        size_t cut = (size_t)(base - dir); /* "ck/latest" -> "ck", "/latest" -> "/", "latest" -> "." */
        if (cut == 0)
            strcpy(dir, ".");
        else
            dir[cut > 1 ? cut - 1 : 1] = '\0';
    } else {
        sprintf(file, "%s/latest", dir);
        if (stat(file, &st) != 0) {
            follow = 0; /* a step folder - or no checkpoint at all */
            sprintf(file, "%s/index.json", dir);
            if (stat(file, &st) != 0)
                rc = error_set(err, dir, "not a checkpoint: no latest, no index.json (give a checkpoint folder "
                               "(checkpoint.dir), its latest, or one of its step-NNNNNNNN folders)");
        }
    }
    if (rc == 0 && follow && file_read_text(file, "checkpoint pointer", &text, &n, err) != 0)
        rc = -1;
    if (rc == 0 && follow) {
        text[strcspn(text, "\n")] = '\0';
        if (!ckpt_is_step_name(text))
            rc = error_set(err, file, "names '%.40s', not a step-NNNNNNNN folder", text);
        else if (!(*step = malloc(strlen(dir) + strlen(text) + 2)))
            rc = error_runtime(err, dir, "out of memory");
        else
            sprintf(*step, "%s/%s", dir, text);
    }
    if (rc == 0 && !follow) {
        *step = dir;
        dir = NULL;
    }
    free(text);
    free(file);
    free(dir);
    return rc;
}
