/*
 * cli/cli_args.c - argv -> CliOptions (see cli.h).
 *
 * Flags take their value as the next argument or after '=' (--steps 10, --steps=10). Every error
 * names the flag it is about, so the user sees e.g. "wlbtrain: error: --steps: expected a positive
 * integer, got 'ten'".
 */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "util/parse.h"

/* If argv[*i] is FLAG or FLAG=VALUE, sets *value (reading the next argument when needed) and
 * returns 1; returns 0 when argv[*i] is another flag; -1 with err set when the value is missing. */
static int flag_value(int argc, char **argv, int *i, const char *flag, const char **value, Error *err)
{
    const char *a = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(a, flag, n) != 0)
        return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return error_set(err, flag, "needs a value");
    *value = argv[++*i];
    return 1;
}

static int parse_positive(const char *flag, const char *v, int64_t *out, Error *err)
{
    if (parse_int64(v, out) != 0 || *out <= 0)
        return error_set(err, flag, "expected a positive integer, got '%s'", v);
    return 0;
}

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static int parse_inspect(int argc, char **argv, CliOptions *o, Error *err)
{
    o->command = CLI_INSPECT;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            o->command = CLI_HELP;
            o->help_topic = "inspect";
            return 0;
        }
        if (a[0] == '-' && a[1] != '\0')
            return error_set(err, a, "unknown flag for inspect (see wlbtrain inspect --help)");
        if (o->inspect_prefix)
            return error_set(err, "inspect", "takes one PREFIX, got '%s' and '%s'", o->inspect_prefix, a);
        o->inspect_prefix = a;
    }
    if (!o->inspect_prefix)
        return error_set(err, "inspect", "needs a PREFIX (the data set's PREFIX.idx and PREFIX.bin)");
    return 0;
}

/* A flag whose value is a string, optionally one of a '|'-separated list of choices. */
typedef struct StrFlag {
    const char *flag;
    const char **dest;
    const char *choices; /* NULL = any non-empty value */
} StrFlag;

static int in_choices(const char *v, const char *choices)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, v, n))
            return 1;
        p += len + (bar != NULL);
    }
    return 0;
}

/* 1 when argv[*i] is one of the flags (value stored), 0 when none, -1 on a bad value. */
static int match_str_flags(const StrFlag *flags, int n, int argc, char **argv, int *i, Error *err)
{
    for (int k = 0; k < n; k++) {
        const char *v = NULL;
        int r = flag_value(argc, argv, i, flags[k].flag, &v, err);
        if (r <= 0) {
            if (r < 0)
                return -1;
            continue;
        }
        if (!*v)
            return error_set(err, flags[k].flag, "expected a value, got ''");
        if (flags[k].choices && !in_choices(v, flags[k].choices))
            return error_set(err, flags[k].flag, "expected one of %s, got '%s'", flags[k].choices, v);
        *flags[k].dest = v;
        return 1;
    }
    return 0;
}

static int parse_convert(int argc, char **argv, CliOptions *o, Error *err)
{
    CliConvert *c = &o->convert;
    const char *eod = NULL, *bos = NULL;
    const StrFlag flags[] = {
        {"--out", &c->out, NULL},
        {"--tokenizer", &c->tokenizer, NULL},
        {"--pattern", &c->pattern, "llama3|gpt2"},
        {"--format", &c->format, "text|jsonl"},
        {"--json-key", &c->json_key, NULL},
        {"--files-from", &c->files_from, NULL},
        {"--dtype", &c->dtype, "auto|uint16|int32"},
        {"--eod", &eod, NULL},
        {"--bos", &bos, NULL},
        {"--special-tokens", &c->special_tokens, "ordinary|match"},
    };
    o->command = CLI_CONVERT;
    c->json_key = "text";
    c->dtype = "auto";
    c->special_tokens = "ordinary";
    c->eod = -1;
    c->bos = -1;
    c->inputs = calloc((size_t)argc, sizeof *c->inputs);
    if (!c->inputs)
        return error_runtime(err, "convert", "out of memory");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            o->command = CLI_HELP;
            o->help_topic = "convert";
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            c->quiet = true;
            continue;
        }
        int r = match_str_flags(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, &i, err);
        if (r < 0)
            return -1;
        if (r > 0)
            continue;
        if (a[0] == '-' && a[1] != '\0')
            return error_set(err, a, "unknown flag for convert (see wlbtrain convert --help)");
        c->inputs[c->n_inputs++] = argv[i];
    }
    if (eod && !strcmp(eod, "none"))
        c->eod = -2;
    else if (eod && (parse_int64(eod, &c->eod) != 0 || c->eod < 0 || c->eod > INT32_MAX))
        return error_set(err, "--eod", "expected a token id or 'none', got '%s'", eod);
    if (bos && !strcmp(bos, "none"))
        c->bos = -2;
    else if (bos && (parse_int64(bos, &c->bos) != 0 || c->bos < 0 || c->bos > INT32_MAX))
        return error_set(err, "--bos", "expected a token id or 'none', got '%s'", bos);
    if (!c->out)
        return error_set(err, "convert", "needs --out PREFIX");
    if (!c->n_inputs && !c->files_from)
        return error_set(err, "convert", "needs input files (or --files-from FILE)");
    return 0;
}

/* A size as Hugging Face's max_shard_size writes it: bytes, or a number with KB, MB, GB (powers of
 * 1000) or KiB, MiB, GiB (of 1024); at least 1 byte. */
static int parse_size(const char *s, int64_t *bytes)
{
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit) && v * units[i].scale >= 1 && v * units[i].scale < 9e18) {
            *bytes = (int64_t)(v * units[i].scale);
            return 0;
        }
    return -1;
}

static int parse_export(int argc, char **argv, CliOptions *o, Error *err)
{
    CliExport *x = &o->export_;
    const char *shard = "5GB";
    const StrFlag flags[] = {
        {"--checkpoint", &x->checkpoint, NULL},
        {"--out", &x->out, NULL},
        {"--dtype", &x->dtype, "auto|float32|bfloat16"},
        {"--max-shard-size", &shard, NULL},
    };
    o->command = CLI_EXPORT;
    x->dtype = "auto";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            o->command = CLI_HELP;
            o->help_topic = "export";
            return 0;
        }
        int r = match_str_flags(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, &i, err);
        if (r < 0)
            return -1;
        if (r == 0)
            return error_set(err, a, "unknown argument for export (see wlbtrain export --help)");
    }
    if (!x->checkpoint)
        return error_set(err, "export", "needs --checkpoint PATH (a checkpoint folder or one of its step-NNNNNNNN)");
    if (!x->out)
        return error_set(err, "export", "needs --out DIR");
    if (parse_size(shard, &x->max_shard_bytes) != 0)
        return error_set(err, "--max-shard-size", "expected a size such as 5GB, 500MB, 2GiB or a byte count, got '%s'",
                         shard);
    return 0;
}

/* eval: weights from one place; a config of its own unless the checkpoint's is taken. */
static int check_eval(const CliOptions *o, Error *err)
{
    const CliEval *e = &o->eval;
    if (!e->checkpoint == !e->init_from)
        return error_set(err, "eval", "needs --checkpoint PATH (a checkpoint folder or one of its step-NNNNNNNN) or "
                         "--init-from PATH (a Hugging Face model folder, safetensors or llama2.c weights), one of them");
    if (e->init_from && !o->config_path)
        return error_set(err, "eval", "--init-from needs --config FILE (the model's shape and the validation set)");
    if (o->dry_run || o->compare || o->no_memory_check || o->print_config || o->stats_out || o->steps || o->search ||
        o->search_all || o->gpus || o->search_out)
        return error_set(err, "eval", "takes --checkpoint or --init-from, --config, --set and --out only (see "
                         "wlbtrain eval --help)");
    return 0;
}

int cli_parse(int argc, char **argv, CliOptions *o, Error *err)
{
    memset(o, 0, sizeof *o);
    o->command = CLI_RUN;
    if (argc < 2)
        return error_set(err, "wlbtrain", "nothing to do: give --config FILE (see wlbtrain --help)");
    if (!strcmp(argv[1], "inspect"))
        return parse_inspect(argc, argv, o, err);
    if (!strcmp(argv[1], "convert"))
        return parse_convert(argc, argv, o, err);
    if (!strcmp(argv[1], "export"))
        return parse_export(argc, argv, o, err);
    /* calibrate and eval take the run's --config and --set, and flags of their own. */
    int calibrate = !strcmp(argv[1], "calibrate"), eval = !strcmp(argv[1], "eval"), sub = calibrate || eval;
    if (calibrate)
        o->command = CLI_CALIBRATE;
    if (eval)
        o->command = CLI_EVAL;
    const StrFlag eval_flags[] = {
        {"--checkpoint", &o->eval.checkpoint, NULL},
        {"--init-from", &o->eval.init_from, NULL},
        {"--out", &o->eval.out, NULL},
    };

    o->sets = calloc((size_t)argc, sizeof *o->sets);
    if (!o->sets)
        return error_runtime(err, "wlbtrain", "out of memory");
    for (int i = 1 + sub; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (is_help(a)) {
            o->command = CLI_HELP;
            o->help_topic = calibrate ? "calibrate" : eval ? "eval" : NULL;
            return 0;
        }
        if (eval && (r = match_str_flags(eval_flags, 3, argc, argv, &i, err)) != 0) {
            if (r < 0)
                return -1;
            continue;
        }
        if (calibrate && (r = flag_value(argc, argv, &i, "--out", &o->calibrate_out, err)) != 0) {
            if (r < 0)
                return -1;
            continue;
        }
        if (!strcmp(a, "--help-config")) {
            o->command = CLI_HELP_CONFIG;
            return 0;
        }
        if (!strcmp(a, "--version")) {
            o->command = CLI_VERSION;
            return 0;
        }
        if (!strcmp(a, "--dry-run")) {
            o->dry_run = true;
            continue;
        }
        if (!strcmp(a, "--compare")) {
            o->compare = true;
            continue;
        }
        if (!strcmp(a, "--search")) {
            o->search = true;
            continue;
        }
        if (!strcmp(a, "--search-all")) {
            o->search_all = true;
            continue;
        }
        if (!strcmp(a, "--no-memory-check")) {
            o->no_memory_check = true;
            continue;
        }
        if (!strcmp(a, "--print-config")) {
            o->print_config = true;
            continue;
        }
        const char *config = NULL;
        const StrFlag flags[] = {{"--config", &config, NULL}, {"--stats-out", &o->stats_out, NULL},
                                 {"--search-out", &o->search_out, NULL}, {"--trace", &o->trace, NULL}};
        if ((r = match_str_flags(flags, 4, argc, argv, &i, err)) != 0) {
            if (r < 0)
                return -1;
            if (config && o->config_path)
                return error_set(err, "--config", "given twice ('%s' and '%s')", o->config_path, config);
            if (config)
                o->config_path = config;
            continue;
        }
        if ((r = flag_value(argc, argv, &i, "--set", &v, err)) != 0) {
            if (r < 0)
                return -1;
            const char *eq = strchr(v, '=');
            if (!eq || eq == v)
                return error_set(err, "--set", "expected KEY=VALUE (such as parallel.tp=2), got '%s'", v);
            o->sets[o->n_sets++] = v;
            continue;
        }
        if ((r = flag_value(argc, argv, &i, "--gpus", &v, err)) != 0) {
            if (r < 0 || parse_positive("--gpus", v, &o->gpus, err) != 0)
                return -1;
            continue;
        }
        if ((r = flag_value(argc, argv, &i, "--steps", &v, err)) != 0) {
            if (r < 0 || parse_positive("--steps", v, &o->steps, err) != 0)
                return -1;
            continue;
        }
        if (a[0] == '-')
            return error_set(err, a, "unknown flag (see wlbtrain --help)");
        return error_set(err, a, "unexpected argument (subcommands are inspect, convert, export, calibrate and eval; "
                         "see wlbtrain --help)");
    }
    if (eval)
        return check_eval(o, err);
    if (!o->config_path)
        return error_set(err, "--config", "is required (see wlbtrain --help)");
    if (calibrate && !o->calibrate_out)
        return error_set(err, "calibrate", "needs --out PROFILE (the calibration file to write)");
    if (calibrate && (o->dry_run || o->compare || o->no_memory_check || o->print_config || o->stats_out || o->steps))
        return error_set(err, "calibrate", "takes --config, --set and --out only (see wlbtrain calibrate --help)");
    if (o->stats_out && !o->dry_run)
        return error_set(err, "--stats-out", "only with --dry-run (training writes log.metrics)");
    if (o->trace && (calibrate || o->search))
        return error_set(err, "--trace", "traces training steps or the dry run's steps (not calibrate or --search)");
    if (o->compare && !o->dry_run)
        return error_set(err, "--compare", "only with --dry-run");
    if (o->search && !o->dry_run)
        return error_set(err, "--search", "only with --dry-run (wlbtrain --config FILE --dry-run --search)");
    if (o->search && (o->compare || o->no_memory_check))
        return error_set(err, "--search", "takes --gpus, --search-out, --search-all, --stats-out and --steps, not "
                         "--compare or --no-memory-check (run those on the layout it writes)");
    if (o->gpus && !o->search)
        return error_set(err, "--gpus", "only with --dry-run --search");
    if (o->search_out && !o->search)
        return error_set(err, "--search-out", "only with --dry-run --search");
    if (o->search_all && !o->search)
        return error_set(err, "--search-all", "only with --dry-run --search");
    if (o->no_memory_check && !o->dry_run)
        return error_set(err, "--no-memory-check", "only with --dry-run (training never starts a layout that does "
                         "not fit: raise train.gpu_memory_gb if the device has more)");
    return 0;
}

void cli_free(CliOptions *o)
{
    free(o->sets);
    free(o->convert.inputs);
    o->sets = NULL;
    o->convert.inputs = NULL;
}
