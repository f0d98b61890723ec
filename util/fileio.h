/*
 * util/fileio.h - reading and writing files safely.
 *
 * file_map: a read-only memory map of a whole file (64-bit sizes; files over 4 GiB work).
 * file_read_all: a whole file into memory, through zlib so that gzip files are decompressed
 *   transparently (plain files pass through unchanged).
 * AtomicFile: write under a temporary name in the same folder, then fsync and rename over the
 *   target: a reader sees the old file or the complete new one, never a torn one, and a failed
 *   write leaves the old file untouched.
 */
#ifndef WLB_UTIL_FILEIO_H
#define WLB_UTIL_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

typedef struct MappedFile {
    const unsigned char *data; /* NULL for an empty file */
    uint64_t size;
} MappedFile;

int file_map(const char *path, MappedFile *m, Error *err);
void file_unmap(MappedFile *m);

/* Reads all of path (gunzipping if it is gzip) into a NUL-terminated malloc'd buffer. */
int file_read_all(const char *path, char **data, size_t *len, Error *err);
/* The same for a text file: a NUL byte in it is an error "PATH: not a WHAT (it contains NUL bytes)". */
int file_read_text(const char *path, const char *what, char **text, size_t *len, Error *err);

/* Creates the folders above path (like mkdir -p of its dirname); 0 when they exist. */
int file_make_parents(const char *path, Error *err);

/* Removes a file or a folder with everything in it; 0 when it does not exist. */
int file_remove_tree(const char *path, Error *err);
/* fsync a folder, so that renames and creations inside it survive a crash. */
int file_sync_dir(const char *dir, Error *err);

/* Whether a WHAT (an output: "checkpoint.dir", "log.metrics", ...) can be written at path before any
 * work is done, without leaving anything behind: is_dir, a folder that will hold files (it, or the
 * nearest folder above it that exists, when it is still to be made); else a file (it, when it
 * exists, must be a regular file that opens for writing; its folder, or the nearest above, must take
 * new files, as atomic writes need). The folder is probed by writing, fsyncing and removing a file
 * of 64 KiB, so a read-only, full or over-quota file system is found here. An Error names the path,
 * the folder and the reason. */
int file_check_writable(const char *path, int is_dir, const char *what, Error *err);

typedef struct AtomicFile {
    FILE *f;   /* write here between atomic_open and atomic_commit */
    char *path;
    char *tmp;
} AtomicFile;

int atomic_open(AtomicFile *a, const char *path, Error *err);
/* Flushes, fsyncs, closes and renames onto the target; on failure the target is untouched. */
int atomic_commit(AtomicFile *a, Error *err);
/* Discards the temporary file (safe to call after a failed commit or twice). */
void atomic_abort(AtomicFile *a);

#endif
