/*
 * util/jsonfile.h - a JSON document (jansson) written to a file atomically, as every other output:
 * a temporary name, fsync, rename; a newline after it.
 */
#ifndef WLB_UTIL_JSONFILE_H
#define WLB_UTIL_JSONFILE_H

#include <jansson.h>
#include <stddef.h>

#include "util/error.h"

/* root dumped with jansson's flags (JSON_INDENT(n), JSON_SORT_KEYS, ...); the file is left as it was
 * on an error. */
int json_file_write(const char *path, const json_t *root, size_t flags, Error *err);

#endif
