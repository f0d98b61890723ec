/*
 * util/ckpt_ident.h - what binds a checkpoint's file to its checkpoint: the run, the step and the
 * file's place in the layout, written into the file itself (an "ident" section of util/statefile.h)
 * and listed, with every file's size and CRC-32, in the checkpoint's index.json (version 3).
 *
 * A run id is 16 lowercase hex digits (64 random bits, getrandom), made at the run's first start
 * and kept by every resume; a run continued from another run's checkpoint (checkpoint.continue_from,
 * a new stage) gets an id of its own and records its parent's (docs/checkpoints.md says why).
 *
 * The ident section: CKPT_IDENT_WORDS little-endian u64 words - format (1), role (0 a shard file,
 * 1 state.bin), run id, step, TP rank, pipeline rank, DP x CP rank (a shard's place; all ones for
 * state.bin), then the layout that saved it: tp, cp, pp, dp, virtual_stages, zero. A shard's chunks
 * follow from its pipeline rank (chunk g = k x pp + pipeline rank, k < virtual_stages).
 */
#ifndef WLB_UTIL_CKPT_IDENT_H
#define WLB_UTIL_CKPT_IDENT_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "util/statefile.h"

enum { CKPT_IDENT_WORDS = 13, CKPT_ROLE_SHARD = 0, CKPT_ROLE_STATE = 1, CKPT_RUN_HEX = 17 };
#define CKPT_IDENT_SECTION "ident"

typedef struct CkptIdent {
    uint64_t run;
    int64_t step;
    int role;
    int tp_rank, pp_rank, dpcp; /* -1 for state.bin */
    int tp, cp, pp, dp, virtual_stages, zero;
} CkptIdent;

/* A new run id (never 0); -1 and an Error when the system gives no random bytes. */
int ckpt_run_new(uint64_t *run, Error *err);
/* The id as text (buf: CKPT_RUN_HEX bytes), and back: -1 unless 16 lowercase hex digits. */
void ckpt_run_text(uint64_t run, char *buf);
int ckpt_run_parse(const char *text, uint64_t *run);

/* The section's words of id. */
void ckpt_ident_words(const CkptIdent *id, uint64_t *w);
/* The ident section of f into id: 1 when there is one, 0 when f has none (a file written before
 * the binding), -1 and an Error (path) when it is malformed. */
int ckpt_ident_read(const StateFile *f, const char *path, CkptIdent *id, Error *err);
/* The same from the section's words (statefile_peek read them): 0, or -1 and an Error. */
int ckpt_ident_parse(const uint64_t *w, const char *path, CkptIdent *id, Error *err);
/* 0 when have is want; else an Error (path) that says what the file is and what index.json lists
 * there, and why they differ first by run, then step, layout, role and place: "PATH: holds the shard
 * of tp 1, pp 0, dpcp 0 after step 6 of run 0123456789abcdef, not the shard of tp 0, pp 0, dpcp 0
 * that index.json lists here: another rank's file (swapped or renamed)". */
int ckpt_ident_check(const CkptIdent *have, const CkptIdent *want, const char *path, Error *err);

#endif
