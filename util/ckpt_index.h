/*
 * util/ckpt_index.h - reading the index.json of a sharded checkpoint (engine/train/train_ckpt.c has
 * the format; rank 0 writes it from the config alone, train_ckpt_index.c): by a resume on any layout
 * and by `wlbtrain export`; and, for both, which step folder a path a user gives names.
 *
 * The reader checks the index before anything is used (its checksum, no key twice in an object, its version, the layout, every file name,
 * every chunk's moment shards partitioning its parameter vector, every tensor's blocks inside it and
 * adding up to it) and opens a shard file only when a section of it is first needed (statefile_open
 * checks its CRCs then), so a resume reads only the files that overlap its blocks. With a bound index
 * (version 3) a shard opened is also checked against what the index lists of it: its ident section
 * (run, step, place: util/ckpt_ident.h), its size and the CRC-32 of the whole file.
 */
#ifndef WLB_UTIL_CKPT_INDEX_H
#define WLB_UTIL_CKPT_INDEX_H

#include <jansson.h>
#include <stdint.h>

#include "util/ckpt_ident.h"
#include "util/error.h"
#include "util/statefile.h"

/* Version 3 binds the files to the checkpoint: "run" (the run id, util/ckpt_ident.h, and a continued
 * run's parent), "model" (config.yaml's model keys) and "contents" (every file's size and CRC-32);
 * each shard and state.bin carry an ident section. Version 2 (before that) carries "crc32", the
 * index's own checksum, which version 3 keeps; version 1 (before it) has neither. All three are
 * read, each with the checks its format allows (CkptIndex.version says which). */
enum { CKPT_INDEX_VERSION = 3, CKPT_INDEX_BOUND = 3 };

/* The checksum of an index: zlib's CRC-32 of root without its "crc32" key, dumped as compact JSON
 * with sorted keys and ASCII escapes - what Python's json.dumps(d, separators=(",", ":"),
 * sort_keys=True) gives, so a test (or a repair tool) can compute it too. The index carries it as
 * "crc32": eight lowercase hex digits. -1 when root cannot be dumped (out of memory). */
int ckpt_index_crc(const json_t *root, uint32_t *crc);
/* index.json read as the checkpoint reader reads it: an object with no key twice (jansson keeps the
 * last of two otherwise), its checksum verified (version 2), "crc32" removed. */
int ckpt_index_load(const char *path, json_t **root, Error *err);

/* A flat range [begin, end) of a chunk's AdamW moments, sections m and v of a file. */
typedef struct CkptShard {
    int file;
    int64_t begin, end;
    char m[STATE_NAME_LEN], v[STATE_NAME_LEN];
} CkptShard;

/* The parameter vector of model chunk `chunk` on TP rank tp: n floats in section `section` of a file,
 * and its moments in shards. */
typedef struct CkptChunk {
    int tp, chunk, file;
    char section[STATE_NAME_LEN];
    int64_t n;
    CkptShard *shards;
    int n_shards;
} CkptChunk;

/* A block [row0, row0 + rows) x [col0, col0 + cols) of a full tensor: rows x cols floats from float
 * `offset` of a chunk's parameter vector (chunks[chunk]), which lies in section `section` of file. */
typedef struct CkptBlock {
    int chunk, file;
    char section[STATE_NAME_LEN];
    int64_t offset, row0, rows, col0, cols;
} CkptBlock;

typedef struct CkptTensor {
    char name[96];
    int64_t rows, cols;
    int is_vector;
    CkptBlock *blocks;
    int n_blocks;
} CkptTensor;

typedef struct CkptIndex {
    char dir[4096];
    int version;
    /* Version 3: the run id, each shard file's size and CRC-32 (sums[i]) and place (tp, pp, dpcp
     * rank; from its name), state.bin's and config.yaml's. A shard file is checked against them
     * (and its ident section) when it is first opened, before any of it is used. */
    uint64_t run, parent_run; /* parent_run: a continued run's parent (0: none), after parent_step */
    int64_t parent_step;
    StateSum *sums, state_sum, config_sum;
    int (*place)[3];
    /* Set: the reads open (and check) the files they need and copy nothing - a pass that finds a
     * swapped or damaged file before any weight is taken. */
    int verify_only;
    int tp, cp, pp, dp, virtual_stages, zero;
    int64_t *stage_layers; /* the layers of each model chunk (pp * virtual_stages), or NULL: an index
                            * written before the split was a setting (the layers were split evenly) */
    int64_t step;
    char (*files)[64];
    StateFile *sf;
    unsigned char *opened;
    int n_files, files_opened;
    CkptChunk *chunks;
    int n_chunks;
    CkptTensor *tensors;
    int n_tensors;
} CkptIndex;

/* The name of the shard file of TP rank tp, pipeline rank pp, DP x CP rank dpcp. */
void ckpt_shard_file(char *buf, size_t size, int tp, int pp, int dpcp);
/* 1 when name is a checkpoint's step folder name, step-NNNNNNNN. */
int ckpt_is_step_name(const char *name);
/* The step folder that path names (*step, malloc'd), as a resume and `wlbtrain export` take it:
 * a checkpoint folder (checkpoint.dir: the step its `latest` names), that `latest` file itself, or
 * a step folder (one with an index.json; what is wrong inside it, reading it says). Anything else
 * (a missing path, another file, a folder with neither latest nor index.json, a latest that names
 * no step-NNNNNNNN folder) is an Error. */
int ckpt_step_folder(const char *path, char **step, Error *err);

/* Reads and checks dir/index.json. */
int ckpt_index_open(CkptIndex *ix, const char *dir, Error *err);
/* What index.json lists for state.bin (version 3): its ident. */
void ckpt_index_state_ident(const CkptIndex *ix, CkptIdent *id);
/* Opens shard file i (once; its CRCs checked, and with version 3 its size, CRC-32 and ident against
 * the index's): what every read does first. */
int ckpt_index_open_file(CkptIndex *ix, int i, Error *err);
/* Every shard file's ident (a swapped, stale or foreign file is named) and size against what the
 * index lists (version 3; nothing before it), reading only each file's header and ident section:
 * what a whole checkpoint is checked by before anything is loaded, cheaply (its CRC-32 is checked
 * as each file is opened). */
int ckpt_index_check_files(CkptIndex *ix, Error *err);
/* A file's size and CRC-32 against what the index lists: an Error naming it otherwise. */
int ckpt_index_check_sum(const StateSum *have, const StateSum *want, const char *path, Error *err);
void ckpt_index_close(CkptIndex *ix);
const CkptTensor *ckpt_index_tensor(const CkptIndex *ix, const char *name);
const CkptChunk *ckpt_index_chunk(const CkptIndex *ix, int tp, int chunk);
/* The full tensor t (host, rows x cols) from its blocks: what 0 the weights, 1 AdamW's m, 2 its v.
 * tmp: room for the largest block. */
int ckpt_index_full(CkptIndex *ix, const CkptTensor *t, int what, float *full, float *tmp, Error *err);
/* Floats [begin, end) of chunk c's weights (what 0) or moments (1 m, 2 v), straight from the shard
 * files' mappings: put(ctx, dst + k, src, n) for each piece (k from 0; only the shards overlapping
 * the range are opened). */
typedef void (*CkptPut)(void *ctx, float *dst, const float *src, int64_t n);
int ckpt_index_range(CkptIndex *ix, const CkptChunk *c, int what, int64_t begin, int64_t end, CkptPut put, void *ctx,
                     float *dst, Error *err);

#endif
