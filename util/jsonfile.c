/* util/jsonfile.c - see jsonfile.h. */
#include "util/jsonfile.h"

#include <stdio.h>

#include "util/fileio.h"

int json_file_write(const char *path, const json_t *root, size_t flags, Error *err)
{
    AtomicFile a;
    if (atomic_open(&a, path, err) != 0)
        return -1;
    if (json_dumpf(root, a.f, flags) != 0 || fputc('\n', a.f) == EOF) {
        atomic_abort(&a);
        return error_errno(err, path, "cannot write");
    }
    return atomic_commit(&a, err);
}
