/*
 * engine/train/train_search_table.h - the layout search's table (train_search.h): what a row says of
 * one layout, and the table of the best ones on stdout.
 *
 * The table is a list of columns (train_search_table.c, `columns`): a column is a header, a width
 * and the function that formats a row's cell, so a figure the dry run gains (a field of
 * DryRunFigures, carried in SearchRow.fig) becomes a column by one entry there.
 */
#ifndef WLB_ENGINE_TRAIN_SEARCH_TABLE_H
#define WLB_ENGINE_TRAIN_SEARCH_TABLE_H

#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "engine/plan/dryrun.h"

/* One layout of the cluster. */
typedef struct SearchLayout {
    int tp, cp, pp, dp, v, zero;
    Recompute recompute;
    int64_t s_max;       /* balance.max_tokens_per_micro_batch */
    CpSharding sharding; /* balance.cp_sharding */
    int own;             /* the config's own layout */
} SearchLayout;

typedef struct SearchRow {
    SearchLayout layout;
    int rank;            /* 1 = the fastest; 0: not ranked (the config's own when it does not fit) */
    int fits;
    double peak;         /* the worst rank's memory, bytes */
    DryRunFigures fig;   /* the planned steps */
    double tps;          /* predicted tokens/s of the whole cluster */
    double plain_tps;    /* Plain-4D's at the same layout (fixed windows, per_seq), when has_plain */
    int has_plain;
} SearchRow;

typedef struct SearchSummary {
    int64_t gpus;
    int gpus_per_node;
    int64_t steps;
    double budget;       /* bytes per GPU, 0: none */
    int candidates, valid, fit, planned;
    double seconds;      /* the search's wall time so far */
    int threads;
} SearchSummary;

enum { SEARCH_TABLE_ROWS = 10 };

/* The header lines, the best SEARCH_TABLE_ROWS of rows[0 .. n) (sorted, fastest first), and the
 * config's own (own, NULL: none on this cluster) marked, or after them when it is not among them. */
void trainer_search_table(FILE *f, const SearchSummary *sum, const SearchRow *rows, int n, const SearchRow *own);

#endif
