/* util/fileio.c - memory maps, whole-file reads through zlib, atomic writes (see fileio.h). */
#include "util/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int file_map(const char *path, MappedFile *m, Error *err)
{
    m->data = NULL;
    m->size = 0;
    /* O_NONBLOCK: a FIFO (a model folder's shard, say) opens at once and is refused below as not a
     * regular file, instead of blocking the open until something writes to it. A regular file's
     * reads ignore the flag. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return error_errno(err, path, "cannot open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        error_errno(err, path, "cannot stat");
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, path, "not a regular file");
    }
    m->size = (uint64_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, (size_t)m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            error_errno(err, path, "cannot map");
            close(fd);
            return -1;
        }
        m->data = p;
    }
    close(fd);
    return 0;
}

void file_unmap(MappedFile *m)
{
    if (m->data)
        munmap((void *)m->data, (size_t)m->size);
    m->data = NULL;
    m->size = 0;
}

int file_read_all(const char *path, char **data, size_t *len, Error *err)
{
    *data = NULL;
    *len = 0;
    struct stat st;
    if (stat(path, &st) != 0)
        return error_errno(err, path, "cannot open");
    if (!S_ISREG(st.st_mode))
        return error_set(err, path, "not a regular file");
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return error_errno(err, path, "cannot open");
    size_t cap = (size_t)st.st_size + 1 > 4096 ? (size_t)st.st_size + 1 : 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        gzclose(gz);
        return error_runtime(err, path, "out of memory reading %zu bytes", cap);
    }
    for (;;) {
        if (cap - n < 2) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                gzclose(gz);
                return error_runtime(err, path, "out of memory reading %zu bytes", cap * 2);
            }
            buf = bigger;
            cap *= 2;
        }
        size_t want = cap - n - 1;
        if (want > (1u << 30))
            want = 1u << 30;
        int got = gzread(gz, buf + n, (unsigned)want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            error_set(err, path, "cannot decompress: %s", zerr == Z_ERRNO ? strerror(errno) : msg);
            free(buf);
            gzclose(gz);
            return -1;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    gzclose(gz);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

int file_read_text(const char *path, const char *what, char **text, size_t *len, Error *err)
{
    if (file_read_all(path, text, len, err) != 0)
        return -1;
    if (strlen(*text) != *len) {
        free(*text);
        *text = NULL;
        return error_set(err, path, "not a %s (it contains NUL bytes)", what);
    }
    return 0;
}

int file_make_parents(const char *path, Error *err)
{
    char *copy = strdup(path);
    if (!copy)
        return error_runtime(err, path, "out of memory");
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
            int rc = error_errno(err, copy, "cannot create the folder");
            free(copy);
            return rc;
        }
        *p = '/';
    }
    free(copy);
    return 0;
}

int atomic_open(AtomicFile *a, const char *path, Error *err)
{
    a->f = NULL;
    a->path = strdup(path);
    size_t n = strlen(path) + 32;
    a->tmp = malloc(n);
    if (!a->path || !a->tmp) {
        free(a->path);
        free(a->tmp);
        a->path = a->tmp = NULL;
        return error_runtime(err, path, "out of memory");
    }
    snprintf(a->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(a->f = fdopen(fd, "wb"))) {
        error_errno(err, path, "cannot create");
        if (fd >= 0)
            close(fd);
        free(a->path);
        free(a->tmp);
        a->path = a->tmp = NULL;
        return -1;
    }
    return 0;
}

/* fsync the folder holding path, so the rename itself survives a crash. */
static int fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int atomic_commit(AtomicFile *a, Error *err)
{
    if (!a->f)
        return error_runtime(err, a->path ? a->path : "atomic_commit", "file is not open");
    int bad = ferror(a->f) != 0;
    bad |= fflush(a->f) != 0;
    bad |= fsync(fileno(a->f)) != 0;
    bad |= fclose(a->f) != 0;
    a->f = NULL;
    if (bad) {
        error_errno(err, a->path, "cannot write");
        err->status = ERROR_RUNTIME;
        atomic_abort(a);
        return -1;
    }
    if (rename(a->tmp, a->path) != 0) {
        error_errno(err, a->path, "cannot rename temporary file into place");
        err->status = ERROR_RUNTIME;
        atomic_abort(a);
        return -1;
    }
    fsync_parent(a->path); /* best effort: the data itself is already on disk */
    free(a->path);
    free(a->tmp);
    a->path = a->tmp = NULL;
    return 0;
}

void atomic_abort(AtomicFile *a)
{
    if (a->f)
        fclose(a->f);
    a->f = NULL;
    if (a->tmp)
        unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    a->path = a->tmp = NULL;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int file_remove_tree(const char *path, Error *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : error_errno(err, path, "cannot remove");
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return error_errno(err, path, "cannot remove");
    return 0;
}

int file_sync_dir(const char *dir, Error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return error_errno(err, dir, "cannot open");
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : error_errno(err, dir, "cannot sync");
}

/* The nearest folder at or above path that exists (malloc'd in *dir), or an Error. */
static int nearest_folder(const char *path, int self, const char *what, char **dir, Error *err)
{
    char *d = strdup(path && path[0] ? path : ".");
    if (!d)
        return error_runtime(err, what, "out of memory");
    if (!self) { /* start from the folder the file is in */
        char *slash = strrchr(d, '/');
        if (!slash)
            strcpy(d, ".");
        else
            slash[slash == d] = '\0'; /* "/x" -> "/" */
    }
    for (;;) {
        struct stat st;
        if (stat(d, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                int rc = error_set(err, what, "%s cannot be written: %s is a file, not a folder", path, d);
                free(d);
                return rc;
            }
            *dir = d;
            return 0;
        }
        if (errno != ENOENT && errno != ENOTDIR) {
            int rc = error_set(err, what, "%s cannot be written: cannot look at %s: %s", path, d, strerror(errno));
            free(d);
            return rc;
        }
        size_t n = strlen(d);
        while (n > 1 && d[n - 1] == '/')
            d[--n] = '\0';
        char *slash = strrchr(d, '/');
        if (!slash)
            strcpy(d, ".");
        else
            slash[slash == d] = '\0';
    }
}

int file_check_writable(const char *path, int is_dir, const char *what, Error *err)
{
    struct stat st;
    if (!is_dir && stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return error_set(err, what, "%s is a folder, not a file", path);
        int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd < 0)
            return error_set(err, what, "%s cannot be written: %s", path, strerror(errno));
        close(fd);
    }
    char *dir = NULL, *probe = NULL;
    if (nearest_folder(path, is_dir, what, &dir, err) != 0)
        return -1;
    int rc = 0, fd = -1;
    size_t n = strlen(dir) + 64;
    if (!(probe = malloc(n))) {
        free(dir);
        return error_runtime(err, what, "out of memory");
    }
    snprintf(probe, n, "%s/.wlbtrain-probe-%ld", dir, (long)getpid());
    static char zeros[65536];
    fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = error_set(err, what, "%s cannot be written: the folder %s takes no new file: %s", path, dir,
                       strerror(errno));
    } else {
        size_t at = 0;
        while (rc == 0 && at < sizeof zeros) {
            ssize_t k = write(fd, zeros + at, sizeof zeros - at);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                rc = error_set(err, what, "%s cannot be written: the folder %s is full or over quota (%s)", path, dir,
                               k < 0 ? strerror(errno) : "a write of 0 bytes");
            else
                at += (size_t)k;
        }
        if (rc == 0 && fsync(fd) != 0)
            rc = error_set(err, what, "%s cannot be written: the folder %s is full or over quota (%s)", path, dir,
                           strerror(errno));
        if (close(fd) != 0 && rc == 0)
            rc = error_set(err, what, "%s cannot be written: closing a file in %s: %s", path, dir, strerror(errno));
        if (unlink(probe) != 0 && rc == 0)
            rc = error_set(err, what, "%s: cannot remove the probe file %s: %s", path, probe, strerror(errno));
    }
    free(probe);
    free(dir);
    return rc;
}
