/* util/statefile.c - see statefile.h. */
#include "util/statefile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum { HEAD = 24, ENTRY = 56, TAIL = 8 };
static const char MAGIC[8] = {'W', 'L', 'B', 'S', 'T', 'A', 'T', 'E'};

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* CRC-32 of n bytes, in pieces small enough for zlib's uInt. */
static uint32_t crc_of(const void *data, uint64_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const Bytef *p = data;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)crc;
}

static uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

/* The header of n sections (offsets, sizes, the sections' CRCs crcs[]) into head; its size. */
static uint64_t make_header(unsigned char *head, const char (*names)[STATE_NAME_LEN], const uint64_t *sizes,
                            const uint32_t *crcs, int n)
{
    uint64_t header = HEAD + (uint64_t)ENTRY * n + TAIL, at = align8(header);
    memset(head, 0, HEAD + ENTRY * STATE_MAX_SECTIONS + TAIL);
    memcpy(head, MAGIC, 8);
    put_u32(head + 8, 1);
    put_u32(head + 12, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        unsigned char *e = head + HEAD + ENTRY * i;
        memcpy(e, names[i], strnlen(names[i], STATE_NAME_LEN));
        put_u64(e + 32, at);
        put_u64(e + 40, sizes[i]);
        put_u32(e + 48, crcs[i]);
        at = align8(at + sizes[i]);
    }
    put_u64(head + 16, at);
    put_u32(head + header - TAIL, crc_of(head, header - TAIL));
    return header;
}

int statefile_write_stream(const char *path, const char (*names)[STATE_NAME_LEN], const uint64_t *sizes, int n,
                           StateFill fill, void *ctx, StateSum *sum, Error *err)
{
    if (n < 0 || n > STATE_MAX_SECTIONS)
        return error_runtime(err, path, "%d sections (at most %d)", n, STATE_MAX_SECTIONS);
    for (int i = 0; i < n; i++) {
        size_t len = strnlen(names[i], STATE_NAME_LEN);
        if (len == 0 || len == STATE_NAME_LEN)
            return error_runtime(err, path, "section name of %zu characters", len);
    }
    enum { PIECE = 16 << 20 };
    uint32_t crcs[STATE_MAX_SECTIONS] = {0};
    unsigned char head[HEAD + ENTRY * STATE_MAX_SECTIONS + TAIL], *buf = malloc(PIECE);
    if (!buf)
        return error_runtime(err, path, "out of memory");
    AtomicFile a;
    if (atomic_open(&a, path, err) != 0) {
        free(buf);
        return -1;
    }
    /* A header with no CRCs yet holds the place; the real one is written over it at the end. */
    static const unsigned char zeros[8];
    uint64_t header = make_header(head, names, sizes, crcs, n), body_bytes = 0;
    int bad = fwrite(head, 1, (size_t)header, a.f) != header;
    bad |= fwrite(zeros, 1, (size_t)(align8(header) - header), a.f) != align8(header) - header;
    /* The whole file's CRC: the body's (every byte after the header's padding) from the sections'
     * CRCs and their padding, the header's once it is final, combined (crc32_combine: no second pass
     * over the data). */
    uLong body = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < n && !bad; i++) {
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t at = 0; at < sizes[i] && !bad; at += PIECE) {
            uint64_t k = sizes[i] - at < PIECE ? sizes[i] - at : PIECE;
            fill(ctx, i, at, buf, k);
            crc = crc32(crc, buf, (uInt)k);
            bad |= fwrite(buf, 1, (size_t)k, a.f) != k;
        }
        crcs[i] = (uint32_t)crc;
        size_t pad = (size_t)(align8(sizes[i]) - sizes[i]);
        body = crc32(crc32_combine(body, crc, (z_off_t)sizes[i]), zeros, (uInt)pad);
        body_bytes += align8(sizes[i]);
        bad |= fwrite(zeros, 1, pad, a.f) != pad;
    }
    make_header(head, names, sizes, crcs, n);
    bad = bad || fseek(a.f, 0, SEEK_SET) != 0 || fwrite(head, 1, (size_t)header, a.f) != header;
    if (sum) {
        uLong whole = crc32(crc32(0L, Z_NULL, 0), head, (uInt)header);
        whole = crc32(whole, zeros, (uInt)(align8(header) - header));
        sum->crc = (uint32_t)crc32_combine(whole, body, (z_off_t)body_bytes);
        sum->bytes = align8(header) + body_bytes;
    }
    free(buf);
    if (bad) {
        atomic_abort(&a);
        return error_errno(err, path, "cannot write");
    }
    return atomic_commit(&a, err);
}

/* statefile_write's sections in memory: copied piece by piece, as any stream. */
static void fill_from_sections(void *ctx, int i, uint64_t at, void *buf, uint64_t n)
{
    const StateSection *s = ctx;
    memcpy(buf, (const unsigned char *)s[i].data + at, (size_t)n);
}

int statefile_write(const char *path, const StateSection *s, int n, StateSum *sum, Error *err)
{
    if (n < 0 || n > STATE_MAX_SECTIONS)
        return error_runtime(err, path, "%d sections (at most %d)", n, STATE_MAX_SECTIONS);
    char names[STATE_MAX_SECTIONS][STATE_NAME_LEN];
    uint64_t sizes[STATE_MAX_SECTIONS];
    for (int i = 0; i < n; i++) {
        memcpy(names[i], s[i].name, STATE_NAME_LEN);
        sizes[i] = s[i].size;
    }
    return statefile_write_stream(path, (const char (*)[STATE_NAME_LEN])names, sizes, n, fill_from_sections,
                                  (void *)s, sum, err);
}

int statefile_open(StateFile *f, const char *path, Error *err)
{
    memset(f, 0, sizeof *f);
    if (file_map(path, &f->map, err) != 0)
        return -1;
    const unsigned char *p = f->map.data;
    uint64_t size = f->map.size;
    int rc = 0;
    if (size < HEAD + TAIL || memcmp(p, MAGIC, 8) != 0) {
        rc = error_set(err, path, "not a wlbtrain state file (%llu bytes, no WLBSTATE magic)",
                       (unsigned long long)size);
    } else if (get_u32(p + 8) != 1) {
        rc = error_set(err, path, "state file version %u; this wlbtrain reads version 1", get_u32(p + 8));
    } else if (get_u32(p + 12) > STATE_MAX_SECTIONS) {
        rc = error_set(err, path, "corrupted: %u sections", get_u32(p + 12));
    } else if (get_u64(p + 16) != size) {
        rc = error_set(err, path, "truncated or extended: %llu bytes, the header says %llu",
                       (unsigned long long)size, (unsigned long long)get_u64(p + 16));
    }
    if (rc != 0) {
        statefile_close(f);
        return rc;
    }
    int n = (int)get_u32(p + 12);
    uint64_t header = HEAD + (uint64_t)ENTRY * n + TAIL;
    if (header > size || get_u32(p + header - TAIL) != crc_of(p, header - TAIL)) {
        statefile_close(f);
        return error_set(err, path, "corrupted header (CRC mismatch)");
    }
    /* The whole file's CRC from the pieces that are CRC'd anyway: the header, then each section and
     * the bytes before it, combined. Sections that do not lie in order (never so as written) take a
     * pass of their own. */
    uLong whole = crc32(0L, Z_NULL, 0);
    uint64_t done = 0;
    int in_order = 1;
    for (int i = 0; i < n; i++) {
        const unsigned char *e = p + HEAD + ENTRY * i;
        StateSection *s = &f->sections[i];
        memcpy(s->name, e, STATE_NAME_LEN);
        s->name[STATE_NAME_LEN - 1] = '\0';
        uint64_t off = get_u64(e + 32), len = get_u64(e + 40);
        int rc = 0;
        if (off < header || off > size || len > size - off)
            rc = error_set(err, path, "corrupted: section %s lies outside the file", s->name);
        uint32_t crc = rc == 0 ? crc_of(p + off, len) : 0;
        if (rc == 0 && crc != get_u32(e + 48))
            rc = error_set(err, path, "corrupted: section %s fails its CRC-32", s->name);
        if (rc != 0) {
            statefile_close(f);
            return rc;
        }
        s->data = p + off;
        s->size = len;
        in_order = in_order && off >= done;
        if (in_order) {
            whole = crc32_combine(whole, crc_of(p + done, off - done), (z_off_t)(off - done));
            whole = crc32_combine(whole, crc, (z_off_t)len);
            done = off + len;
        }
    }
    if (in_order)
        whole = crc32_combine(whole, crc_of(p + done, size - done), (z_off_t)(size - done));
    f->n = n;
    f->sum.bytes = size;
    f->sum.crc = in_order ? (uint32_t)whole : crc_of(p, size);
    return 0;
}

int statefile_peek(const char *path, const char *name, void *buf, uint64_t size, uint64_t *bytes, Error *err)
{
    unsigned char head[HEAD + ENTRY * STATE_MAX_SECTIONS + TAIL];
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_errno(err, path, "cannot open");
    int rc = 0;
    long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0)
        rc = error_errno(err, path, "cannot read");
    uint64_t file_size = end > 0 ? (uint64_t)end : 0;
    size_t got = rc == 0 ? fread(head, 1, sizeof head, f) : 0;
    uint32_t n = got >= HEAD ? get_u32(head + 12) : 0;
    uint64_t header = HEAD + (uint64_t)ENTRY * n + TAIL;
    if (rc == 0 && (got < HEAD + TAIL || memcmp(head, MAGIC, 8) != 0))
        rc = error_set(err, path, "not a wlbtrain state file (%llu bytes, no WLBSTATE magic)",
                       (unsigned long long)file_size);
    else if (rc == 0 && get_u32(head + 8) != 1)
        rc = error_set(err, path, "state file version %u; this wlbtrain reads version 1", get_u32(head + 8));
    else if (rc == 0 && n > STATE_MAX_SECTIONS)
        rc = error_set(err, path, "corrupted: %u sections", n);
    else if (rc == 0 && get_u64(head + 16) != file_size)
        rc = error_set(err, path, "truncated or extended: %llu bytes, the header says %llu",
                       (unsigned long long)file_size, (unsigned long long)get_u64(head + 16));
    else if (rc == 0 && (header > got || get_u32(head + header - TAIL) != crc_of(head, header - TAIL)))
        rc = error_set(err, path, "corrupted header (CRC mismatch)");
    int found = 0;
    for (uint32_t i = 0; rc == 0 && !found && i < n; i++) {
        const unsigned char *e = head + HEAD + ENTRY * i;
        if (strnlen((const char *)e, STATE_NAME_LEN) == STATE_NAME_LEN || strcmp((const char *)e, name) != 0)
            continue;
        found = 1;
        uint64_t off = get_u64(e + 32), len = get_u64(e + 40);
        if (len != size || off < header || off > file_size || len > file_size - off)
            rc = error_set(err, path, "corrupted: section %s has %llu bytes at %llu, not %llu inside the file", name,
                           (unsigned long long)len, (unsigned long long)off, (unsigned long long)size);
        else if (fseek(f, (long)off, SEEK_SET) != 0 || fread(buf, 1, (size_t)size, f) != size)
            rc = error_errno(err, path, "cannot read");
        else if (crc_of(buf, size) != get_u32(e + 48))
            rc = error_set(err, path, "corrupted: section %s fails its CRC-32", name);
    }
    fclose(f);
    *bytes = file_size;
    return rc != 0 ? -1 : !found;
}

void statefile_close(StateFile *f)
{
    file_unmap(&f->map);
    memset(f, 0, sizeof *f);
}

const StateSection *statefile_find(const StateFile *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->sections[i].name, name))
            return &f->sections[i];
    return NULL;
}
