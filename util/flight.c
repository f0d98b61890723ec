/* util/flight.c - reading and comparing the flight recorder's files (see flight.h). */
#include "util/flight.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { FLIGHT_GROUPS = 64, FLIGHT_OPS = 512, FLIGHT_MAX_RANKS = 1 << 20 };

typedef struct FlightGroup {
    int g, id, size;
    long long begun;
    char name[16];
} FlightGroup;

typedef struct FlightOp {
    long long seq, gseq, n;
    int g, id, peer;
    char name[16], op[40];
    double t0, t1;
} FlightOp;

typedef struct FlightRank {
    int present, world;
    char reason[16];
    char attempt[FLIGHT_ATTEMPT_MAX];
    FlightGroup groups[FLIGHT_GROUPS];
    int n_groups;
    FlightOp wait; /* the oldest op in flight (wait.seq 0: none) */
} FlightRank;

/* Reads DIR/flight-rank-r.txt into *fr (fr->present 0 when there is none). */
static int read_rank(const char *dir, int r, FlightRank *fr, Error *err)
{
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/" FLIGHT_FILE_FORMAT, dir, r);
    memset(fr, 0, sizeof *fr);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int rc = 0, rank = -1, lineno = 0;
    snprintf(fr->attempt, sizeof fr->attempt, "unknown");
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\n")] = '\0';
        FlightOp o;
        FlightGroup *gr = &fr->groups[fr->n_groups];
        if (lineno == 1) {
            if (strcmp(line, FLIGHT_MAGIC) != 0)
                rc = error_set(err, path, "not a wlbtrain flight recorder file");
        } else if (lineno == 2) {
            if (sscanf(line, "rank %d world %d reason %15s", &rank, &fr->world, fr->reason) != 3 || rank != r ||
                fr->world < 1 || fr->world > FLIGHT_MAX_RANKS)
                rc = error_set(err, path, "line 2: not 'rank %d world N reason WHY now T'", r);
        } else if (!strncmp(line, "attempt ", 8)) {
            if (sscanf(line, "attempt %127s", fr->attempt) != 1)
                rc = error_set(err, path, "line %d: not 'attempt A'", lineno);
        } else if (!strncmp(line, "group ", 6)) {
            if (fr->n_groups >= FLIGHT_GROUPS ||
                sscanf(line, "group %d %15s %d %d %lld", &gr->g, gr->name, &gr->id, &gr->size, &gr->begun) != 5)
                rc = error_set(err, path, "line %d: not 'group G NAME ID SIZE BEGUN'", lineno);
            else
                fr->n_groups++;
        } else if (!strncmp(line, "op ", 3)) {
            if (sscanf(line, "op %lld %d %15s %d %lld %39s %lld %d %lf %lf", &o.seq, &o.g, o.name, &o.id, &o.gseq,
                       o.op, &o.n, &o.peer, &o.t0, &o.t1) != 10)
                rc = error_set(err, path, "line %d: not 'op SEQ G NAME ID GSEQ OP N PEER T0 T1'", lineno);
            else if (o.t1 == 0 && fr->wait.seq == 0)
                fr->wait = o;
        } else {
            rc = error_set(err, path, "line %d: not a flight recorder line", lineno);
        }
    }
    if (rc == 0 && lineno < 2)
        rc = error_set(err, path, "truncated: no header");
    fclose(f);
    fr->present = rc == 0;
    return rc;
}

/* Rank fr's group g, or NULL. */
static const FlightGroup *group_of(const FlightRank *fr, int g)
{
    for (int i = 0; i < fr->n_groups; i++)
        if (fr->groups[i].g == g)
            return &fr->groups[i];
    return NULL;
}

/* "0, 1, 3" of the ranks whose flag is set, into buf. */
static void rank_list(const unsigned char *flag, int n, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && at + 16 < size; r++)
        if (flag[r])
            at += (size_t)snprintf(buf + at, size - at, "%s%d", at ? ", " : "", r);
}

/* 1 with *r when name is a flight recorder file's, flight-rank-R.txt. */
static int file_rank(const char *name, int *r)
{
    int used = 0;
    return sscanf(name, "flight-rank-%d.txt%n", r, &used) == 1 && used > 0 && name[used] == '\0' && *r >= 0;
}

/* The attempt of DIR's newest flight recorder file into attempt ("" when there is none). */
static void newest_attempt(const char *dir, char *attempt, size_t size)
{
    attempt[0] = '\0';
    DIR *dh = opendir(dir);
    if (!dh)
        return;
    struct dirent *e;
    double newest = -1;
    int pick = -1, r;
    while ((e = readdir(dh))) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!file_rank(e->d_name, &r) || stat(path, &st) != 0)
            continue;
        double t = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
        if (t > newest) {
            newest = t;
            pick = r;
        }
    }
    closedir(dh);
    FlightRank fr;
    Error e2 = {0};
    if (pick >= 0 && read_rank(dir, pick, &fr, &e2) == 0 && fr.present)
        snprintf(attempt, size, "%s", fr.attempt);
}

int flight_compare(const char *dir, int world, const char *attempt, char *line, size_t size, Error *err)
{
    char newest[FLIGHT_ATTEMPT_MAX];
    if (!attempt) {
        newest_attempt(dir, newest, sizeof newest);
        attempt = newest;
    }
    FlightRank first;
    /* The job's size: the caller's, or the first file's of the attempt. */
    for (int r = 0; world <= 0 && r < 4096; r++) {
        if (read_rank(dir, r, &first, err) != 0)
            return -1;
        if (first.present && !strcmp(first.attempt, attempt))
            world = first.world;
    }
    if (world <= 0)
        return error_set(err, dir, "no flight recorder files (flight-rank-R.txt) here");
    FlightRank *fr = calloc((size_t)world, sizeof *fr);
    unsigned char *waiting = calloc((size_t)world, 1), *behind = calloc((size_t)world, 1),
                  *missing = calloc((size_t)world, 1);
    int rc = fr && waiting && behind && missing ? 0 : error_runtime(err, dir, "out of memory");
    int present = 0;
    for (int r = 0; rc == 0 && r < world; r++) {
        rc = read_rank(dir, r, &fr[r], err);
        if (fr[r].present && strcmp(fr[r].attempt, attempt) != 0)
            fr[r].present = 0; /* another launch's: not this hang's picture */
        present += fr[r].present;
        missing[r] = !fr[r].present;
    }
    if (rc == 0 && present == 0)
        rc = error_set(err, dir, "no flight recorder files (flight-rank-R.txt) here");
    /* The collective to name: the earliest-started wait whose group has members behind it or
     * without a file. */
    const FlightOp *pick = NULL;
    for (int r = 0; rc == 0 && r < world; r++) {
        const FlightOp *w = &fr[r].wait;
        if (!fr[r].present || w->seq == 0)
            continue;
        const FlightGroup *gr = group_of(&fr[r], w->g);
        int members = 0, late = 0;
        for (int q = 0; q < world; q++) {
            const FlightGroup *qg = fr[q].present ? group_of(&fr[q], w->g) : NULL;
            if (qg && qg->id == w->id) {
                members++;
                late += qg->begun < w->gseq;
            }
        }
        if ((late > 0 || (gr && members < gr->size)) && (!pick || w->t0 < pick->t0))
            pick = w;
    }
    if (rc == 0 && !pick) {
        snprintf(line, size, "flight recorder %s: %d of %d ranks wrote one; no collective that some ranks never "
                 "reached", dir, present, world);
    } else if (rc == 0) {
        int unknown = 0, size_g = 0;
        for (int q = 0; q < world; q++) {
            const FlightGroup *qg = fr[q].present ? group_of(&fr[q], pick->g) : NULL;
            if (!qg || qg->id != pick->id)
                continue;
            size_g = qg->size;
            waiting[q] = fr[q].wait.seq && fr[q].wait.g == pick->g && fr[q].wait.gseq == pick->gseq;
            behind[q] = qg->begun < pick->gseq;
            unknown++;
        }
        char w[256], b[256], m[256], never[600];
        rank_list(waiting, world, w, sizeof w);
        rank_list(behind, world, b, sizeof b);
        rank_list(missing, world, m, sizeof m);
        /* Members of the group short of its size are among the ranks that left no file. */
        int absent = unknown < size_g && m[0];
        snprintf(never, sizeof never, "%s%s%s%s%s", b[0] ? "rank" : "", b[0] && strchr(b, ',') ? "s " : b[0] ? " " : "",
                 b, b[0] && absent ? "; " : "", absent ? "" : "");
        if (absent)
            snprintf(never + strlen(never), sizeof never - strlen(never), "rank%s %s (no flight record: stopped, "
                     "killed or hung outside a collective)", strchr(m, ',') ? "s" : "", m);
        snprintf(line, size, "flight recorder %s: rank%s %s wait%s in %s on %s %d (the group's %s %lld); never "
                 "reached it: %s", dir, strchr(w, ',') ? "s" : "", w, strchr(w, ',') ? "" : "s", pick->op,
                 pick->name, pick->id, pick->peer >= 0 ? "message" : "collective", pick->gseq, never);
    }
    free(fr);
    free(waiting);
    free(behind);
    free(missing);
    return rc;
}

/* mkdir that finds the folder there already content. */
static int make_dir(const char *path)
{
    return mkdir(path, 0777) == 0 || errno == EEXIST ? 0 : -1;
}

int flight_set_aside(const char *dir, const char *attempt, Error *err)
{
    (void)err;
    DIR *dh = opendir(dir);
    if (!dh)
        return 0; /* no folder yet: nothing to keep aside */
    struct dirent *e;
    int r;
    while ((e = readdir(dh))) {
        FlightRank fr;
        Error e2 = {0};
        if (!file_rank(e->d_name, &r) || read_rank(dir, r, &fr, &e2) != 0 || !fr.present ||
            !strcmp(fr.attempt, attempt))
            continue; /* not a record, malformed (left for inspect to say), or this attempt's */
        if (strchr(fr.attempt, '/') || fr.attempt[0] == '.')
            snprintf(fr.attempt, sizeof fr.attempt, "unknown"); /* a folder name, never a path */
        char sub[4300], from[4400], to[4600];
        snprintf(sub, sizeof sub, "%s/" FLIGHT_ATTEMPTS_DIR, dir);
        int ok = make_dir(sub) == 0;
        snprintf(sub, sizeof sub, "%s/" FLIGHT_ATTEMPTS_DIR "/%s", dir, fr.attempt);
        snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", sub, e->d_name);
        if (!(ok && make_dir(sub) == 0 && (rename(from, to) == 0 || errno == ENOENT)))
            fprintf(stderr, "wlbtrain: warning: %s: cannot move an earlier attempt's flight record into %s: %s\n",
                    from, sub, strerror(errno));
    }
    closedir(dh);
    return 0;
}
