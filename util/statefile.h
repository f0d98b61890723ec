/*
 * util/statefile.h - a binary file of named sections, each checked by a CRC-32 (zlib's): the
 * training state of a checkpoint.
 *
 * Layout, little-endian:
 *     0   magic "WLBSTATE"
 *     8   u32 version (1), u32 number of sections n (at most STATE_MAX_SECTIONS)
 *    16   u64 size of the whole file
 *    24   n entries of 56 bytes: name (32 bytes, NUL-padded), u64 offset, u64 size, u32 CRC-32 of
 *         the section's bytes, u32 zero
 *         then u32 CRC-32 of every byte before it (the header), u32 zero
 *   then the sections' bytes, each starting at a multiple of 8.
 * Reading checks everything before any of it is used: magic, version, the file's size (a truncated
 * file is an error), every entry inside the file, the header's CRC and each section's CRC. Every
 * failure is a bad-input Error (status 2) "PATH: what".
 * Both ways the CRC-32 of the whole file comes too (StateSum: what a checkpoint's index lists of each
 * file), computed on the way - the writer from the streamed bytes, the reader from the sections'
 * CRCs it computes anyway (zlib's crc32_combine) - so it costs no second pass over the file.
 */
#ifndef WLB_UTIL_STATEFILE_H
#define WLB_UTIL_STATEFILE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "util/fileio.h"

enum { STATE_MAX_SECTIONS = 64, STATE_NAME_LEN = 32 };

/* A whole file's size and CRC-32 (zlib's). */
typedef struct StateSum {
    uint64_t bytes;
    uint32_t crc;
} StateSum;

typedef struct StateSection {
    char name[STATE_NAME_LEN];
    const void *data;
    uint64_t size;
} StateSection;

/* Writes the sections to path atomically (temporary name, fsync, rename): statefile_write_stream
 * over the sections in memory. sum (NULL: not wanted): the written file's size and CRC-32. */
int statefile_write(const char *path, const StateSection *sections, int n, StateSum *sum, Error *err);

/* Streamed: section i has sizes[i] bytes, which fill(ctx, i, at, buf, n) copies, n bytes
 * from byte `at`, into buf (at most 16 MiB at a time: the one buffer it allocates); the CRCs are
 * computed on the way and the header written last. */
typedef void (*StateFill)(void *ctx, int section, uint64_t at, void *buf, uint64_t n);
int statefile_write_stream(const char *path, const char (*names)[STATE_NAME_LEN], const uint64_t *sizes, int n,
                           StateFill fill, void *ctx, StateSum *sum, Error *err);

typedef struct StateFile {
    MappedFile map;
    StateSection sections[STATE_MAX_SECTIONS];
    int n;
    StateSum sum; /* the whole file's size and CRC-32 */
} StateFile;

int statefile_open(StateFile *f, const char *path, Error *err);
/* Without reading the rest of the file: its size (*bytes) and the section called name, which must
 * have size bytes, into buf - the header checked (magic, version, the size it gives, its CRC) and
 * the section's CRC. 0 when read, 1 when the file has no such section, -1 and an Error otherwise. */
int statefile_peek(const char *path, const char *name, void *buf, uint64_t size, uint64_t *bytes, Error *err);
void statefile_close(StateFile *f);
/* The section called name, or NULL. */
const StateSection *statefile_find(const StateFile *f, const char *name);

#endif
