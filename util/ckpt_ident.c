/* util/ckpt_ident.c - a checkpoint file's run, step and place (see ckpt_ident.h). */
#include "util/ckpt_ident.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

int ckpt_run_new(uint64_t *run, Error *err)
{
    uint64_t v = 0;
    while (v == 0) {
        ssize_t n = getrandom(&v, sizeof v, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof v)
            return error_errno(err, "checkpoint", "cannot make a run id (getrandom)");
    }
    *run = v;
    return 0;
}

void ckpt_run_text(uint64_t run, char *buf)
{
    snprintf(buf, CKPT_RUN_HEX, "%016llx", (unsigned long long)run);
}

int ckpt_run_parse(const char *text, uint64_t *run)
{
    if (!text || strlen(text) != 16 || strspn(text, "0123456789abcdef") != 16)
        return -1;
    unsigned long long v = 0;
    for (int i = 0; i < 16; i++)
        v = v << 4 | (unsigned long long)(text[i] <= '9' ? text[i] - '0' : text[i] - 'a' + 10);
    *run = v;
    return 0;
}

void ckpt_ident_words(const CkptIdent *id, uint64_t *w)
{
    uint64_t v[CKPT_IDENT_WORDS] = {1,
                                    (uint64_t)id->role,
                                    id->run,
                                    (uint64_t)id->step,
                                    (uint64_t)(int64_t)id->tp_rank,
                                    (uint64_t)(int64_t)id->pp_rank,
                                    (uint64_t)(int64_t)id->dpcp,
                                    (uint64_t)id->tp,
                                    (uint64_t)id->cp,
                                    (uint64_t)id->pp,
                                    (uint64_t)id->dp,
                                    (uint64_t)id->virtual_stages,
                                    (uint64_t)id->zero};
    memcpy(w, v, sizeof v);
}

int ckpt_ident_parse(const uint64_t *w, const char *path, CkptIdent *id, Error *err)
{
    /* Small fields are bounded before they are narrowed (the place words of state.bin are -1). */
    int sane = w[0] == 1 && w[1] <= 1 && w[3] < ((uint64_t)1 << 48);
    for (int i = 4; i < 7; i++)
        sane = sane && ((int64_t)w[i] >= -1 && (int64_t)w[i] < 65536);
    for (int i = 7; i < CKPT_IDENT_WORDS; i++)
        sane = sane && w[i] <= 65536;
    if (!sane)
        return error_set(err, path, "the ident section is corrupted or of a newer format (format %llu)",
                         (unsigned long long)w[0]);
    *id = (CkptIdent){w[2],          (int64_t)w[3],       (int)w[1],           (int)(int64_t)w[4], (int)(int64_t)w[5],
                      (int)(int64_t)w[6], (int)w[7],       (int)w[8],           (int)w[9],          (int)w[10],
                      (int)w[11],         (int)w[12]};
    return 0;
}

int ckpt_ident_read(const StateFile *f, const char *path, CkptIdent *id, Error *err)
{
    const StateSection *s = statefile_find(f, CKPT_IDENT_SECTION);
    uint64_t w[CKPT_IDENT_WORDS];
    if (!s)
        return 0;
    if (s->size != sizeof w)
        return error_set(err, path, "the ident section has %llu bytes, not %zu", (unsigned long long)s->size, sizeof w);
    memcpy(w, s->data, sizeof w);
    return ckpt_ident_parse(w, path, id, err) == 0 ? 1 : -1;
}

/* "the shard of tp 1, pp 0, dpcp 0" or "the training state". */
static void what_text(const CkptIdent *id, char *buf, size_t size)
{
    if (id->role == CKPT_ROLE_STATE)
        snprintf(buf, size, "the training state");
    else
        snprintf(buf, size, "the shard of tp %d, pp %d, dpcp %d", id->tp_rank, id->pp_rank, id->dpcp);
}

static void layout_text(const CkptIdent *id, char *buf, size_t size)
{
    snprintf(buf, size, "tp %d, cp %d, pp %d, dp %d, virtual_stages %d, zero %d", id->tp, id->cp, id->pp, id->dp,
             id->virtual_stages, id->zero);
}

int ckpt_ident_check(const CkptIdent *have, const CkptIdent *want, const char *path, Error *err)
{
    char hw[80], ww[80], hr[CKPT_RUN_HEX], wr[CKPT_RUN_HEX], hl[120], wl[120], why[400];
    what_text(have, hw, sizeof hw);
    what_text(want, ww, sizeof ww);
    ckpt_run_text(have->run, hr);
    ckpt_run_text(want->run, wr);
    layout_text(have, hl, sizeof hl);
    layout_text(want, wl, sizeof wl);
    if (have->run != want->run)
        snprintf(why, sizeof why, "a file of another run (run %s, not %s)", hr, wr);
    else if (have->step != want->step)
        snprintf(why, sizeof why, "a file of the checkpoint of step %lld of this run, not of step %lld (stale: "
                 "copied in from another checkpoint)", (long long)have->step, (long long)want->step);
    else if (strcmp(hl, wl) != 0)
        snprintf(why, sizeof why, "a file saved by the layout %s, not %s", hl, wl);
    else if (have->role != want->role || have->tp_rank != want->tp_rank || have->pp_rank != want->pp_rank ||
             have->dpcp != want->dpcp)
        snprintf(why, sizeof why, "%s (swapped or renamed)",
                 have->role == want->role ? "another rank's file" : "another kind of checkpoint file");
    else
        return 0;
    return error_set(err, path, "holds %s after step %lld of run %s, not %s that index.json lists here: %s", hw,
                     (long long)have->step, hr, ww, why);
}
