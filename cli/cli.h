/*
 * cli/cli.h - the command line of wlbtrain.
 *
 *   wlbtrain --config FILE [--set KEY=VALUE]... [--steps N] [--print-config]
 *            [--dry-run [--compare] [--stats-out FILE] [--no-memory-check]]
 *            [--dry-run --search [--gpus N] [--search-out FILE] [--search-all]]
 *   wlbtrain inspect PREFIX
 *   wlbtrain convert --out PREFIX [options] INPUT...
 *   wlbtrain export --checkpoint PATH --out DIR [--dtype auto|float32|bfloat16] [--max-shard-size SIZE]
 *   wlbtrain calibrate --config FILE [--set KEY=VALUE]... --out PROFILE
 *   wlbtrain eval (--checkpoint PATH | --init-from PATH) [--config FILE] [--set KEY=VALUE]... [--out FILE]
 *   wlbtrain --help | --help-config | --version
 *
 * cli_parse only reads argv: it checks every flag and value and fills CliOptions; nothing is
 * opened or loaded. An unknown flag or a malformed value is an Error naming the flag (status 2).
 */
#ifndef WLB_CLI_CLI_H
#define WLB_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef enum CliCommand {
    CLI_RUN,          /* --config: train, dry run or print the config */
    CLI_INSPECT,      /* inspect PREFIX */
    CLI_CONVERT,      /* convert ... */
    CLI_EXPORT,       /* export ... */
    CLI_CALIBRATE,    /* calibrate --config FILE [--set ...] --out PROFILE */
    CLI_EVAL,         /* eval (--checkpoint PATH | --init-from PATH) [--config FILE] [--set ...] [--out FILE] */
    CLI_HELP,         /* --help (or a subcommand's --help) */
    CLI_HELP_CONFIG,  /* --help-config: every config key */
    CLI_VERSION,      /* --version */
} CliCommand;

typedef struct CliConvert {
    const char *out;           /* --out PREFIX */
    const char *tokenizer;     /* --tokenizer FILE (tiktoken BPE ranks or tokenizer.json); NULL = byte-level */
    const char *pattern;       /* --pattern llama3|gpt2 (pre-tokenizer regex); NULL = by tokenizer */
    const char *format;        /* --format text|jsonl; NULL = by file name */
    const char *json_key;      /* --json-key KEY, default "text" */
    const char *files_from;    /* --files-from FILE: one input path per line ('-' = stdin) */
    const char *dtype;         /* --dtype auto|uint16|int32 */
    int64_t eod;               /* --eod ID; -1 = the tokenizer's end-of-text token; -2 = none */
    int64_t bos;               /* --bos ID; -1 = the tokenizer's begin-of-text token; -2 = none */
    const char *special_tokens; /* --special-tokens ordinary|match (special-token text in the input) */
    bool quiet;                /* --quiet: no progress lines */
    char **inputs;             /* positional inputs (pointers into argv) */
    int n_inputs;
} CliConvert;

typedef struct CliExport {
    const char *checkpoint;    /* --checkpoint PATH: a step folder, or a checkpoint folder (its latest) */
    const char *out;           /* --out DIR */
    const char *dtype;         /* --dtype auto|float32|bfloat16 (auto: what the model came in, see cli_export.c) */
    int64_t max_shard_bytes;   /* --max-shard-size: the most tensor bytes in one safetensors file */
} CliExport;

typedef struct CliEval {
    const char *checkpoint;    /* --checkpoint PATH: a step folder, or a checkpoint folder (its latest) */
    const char *init_from;     /* --init-from PATH: weights as train.init_from reads them */
    const char *out;           /* --out FILE: the result as a JSON object; NULL = none */
} CliEval;

typedef struct CliOptions {
    CliCommand command;
    const char *help_topic;    /* for CLI_HELP: NULL, "inspect", "convert", "export", "calibrate" or "eval" */
    const char *config_path;   /* --config */
    const char **sets;         /* --set KEY=VALUE, in order (pointers into argv) */
    int n_sets;
    int64_t steps;             /* --steps N; 0 = not given */
    bool dry_run;              /* --dry-run */
    bool compare;              /* --compare (with --dry-run) */
    bool no_memory_check;      /* --no-memory-check (with --dry-run) */
    bool print_config;         /* --print-config */
    const char *stats_out;     /* --stats-out FILE (with --dry-run) */
    const char *trace;         /* --trace STEPS: trace.steps (NULL: not given) */
    bool search;               /* --search (with --dry-run): the layout search */
    bool search_all;           /* --search-all (with --search): every layout planned, none pruned */
    int64_t gpus;              /* --gpus N (with --search); 0 = the config's */
    const char *search_out;    /* --search-out FILE (with --search) */
    const char *calibrate_out; /* calibrate: --out PROFILE */
    const char *inspect_prefix;
    CliConvert convert;
    CliExport export_;
    CliEval eval;
} CliOptions;

/* Parses argv into o. On error fills err ("--flag: what") and returns -1. cli_free releases the
 * arrays cli_parse allocated (the strings themselves belong to argv). */
int cli_parse(int argc, char **argv, CliOptions *o, Error *err);
void cli_free(CliOptions *o);

/* Help texts on stdout. topic NULL = the main help. */
void cli_print_help(const char *topic);
void cli_print_version(void);

/* Subcommands: return the process exit status (0 on success); errors are printed by the caller. */
int cli_inspect(const char *prefix, Error *err);
int cli_convert(const CliConvert *c, Error *err);
int cli_export(const CliExport *x, Error *err);

#endif
