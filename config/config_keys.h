/*
 * config/config_keys.h - the key table behind Config (internal to config/).
 *
 * Each key is one row: its dotted name, type, place in Config, range, default and a help line.
 * The generic code here reads a value into a key, formats a key's value back to YAML text,
 * compares and frees values, all by the row's type; nothing else in config/ knows field offsets.
 */
#ifndef WLB_CONFIG_CONFIG_KEYS_H
#define WLB_CONFIG_CONFIG_KEYS_H

#include "config/config.h"

typedef enum KeyType {
    KEY_INT,        /* int64_t */
    KEY_INT_AUTO,   /* int64_t, or 'auto' stored as 0 */
    KEY_FLOAT,      /* double */
    KEY_BOOL,       /* bool: true | false */
    KEY_ENUM,       /* an enum stored as int; names in choices, in enum order */
    KEY_STR,        /* char *, 'none' (or null, ~, empty) stored as NULL */
    KEY_INT_LIST,   /* ConfigIntList */
    KEY_FLOAT_LIST, /* ConfigFloatList */
    KEY_STR_LIST,   /* ConfigStrList; a single scalar is a list of one */
    KEY_CHOICE_OR_LIST, /* ConfigChoiceOrList: one of the words in choices, or a list of integers
                         * (imin..imax each; a single integer is a list of one) */
} KeyType;

/* Range flags for KEY_FLOAT: the bound itself is excluded. */
enum { KEY_MIN_OPEN = 1, KEY_MAX_OPEN = 2 };

typedef struct ConfigKey {
    const char *name;        /* "parallel.tp" */
    KeyType type;
    size_t offset;           /* of the field in Config */
    int64_t imin, imax;      /* ranges of integers (also the elements of KEY_INT_LIST) */
    double fmin, fmax;       /* ranges of doubles (also the elements of KEY_FLOAT_LIST) */
    unsigned flags;
    const char *choices;     /* KEY_ENUM: "a|b|c" */
    const char *def;         /* constant default as YAML text; NULL = required or derived */
    const char *doc_default; /* what the reference says when def is NULL */
    const char *help;
} ConfigKey;

extern const ConfigKey config_keys[];
extern const int config_n_keys;

/* Index of a key by its dotted name, or -1. */
int config_key_find(const char *name);
/* The known key nearest to name (edit distance), for "did you mean" hints; NULL if none is close. */
const char *config_key_hint(const char *name);
/* Why a key that earlier versions knew is gone and what to do, or NULL when name never was a key. */
const char *config_key_removed(const char *name);
/* The known section nearest to name, or NULL (returns a static buffer). */
const char *config_section_hint(const char *name);
/* 1 when name is a section (model, parallel, ...). */
int config_section_known(const char *name, size_t len);

/* A value as the loader sees it: one scalar or a list of scalars. plain[i] is 0 for a quoted
 * scalar, so that a quoted "none" stays a string. */
typedef struct ConfigValue {
    int is_list;
    int n;
    const char *const *items;
    const int *plain;
} ConfigValue;

/* Reads v into key k of cfg; on error the message is "WHERE: KEY: what". */
int config_key_assign(Config *cfg, int k, const ConfigValue *v, const char *where, Error *err);
/* Formats the scalar (or element i of a list) of key k as YAML text. quote is set when the text
 * must be quoted to read back as the same value. */
void config_key_format(const Config *cfg, int k, int i, char *buf, size_t size, int *quote);
/* Shortest text that reads back to exactly x: whole numbers below 1e15 as integers (10000, not
 * 1e+04), others in the shortest %g form (1e-05, not 1.0000000000000001e-05). */
void config_format_double(double x, char *buf, size_t size);
/* Number of elements of a list key (or 1 for scalars, 0 for a NULL string). */
int config_key_count(const Config *cfg, int k);
/* 1 when key k's value is written as a YAML list. */
int config_key_is_list(const Config *cfg, int k);
int config_key_equal(const Config *a, const Config *b, int k);
void config_key_free(Config *cfg, int k);
/* Copies key k's value from src into dst (deep copy). */
int config_key_copy(Config *dst, const Config *src, int k, Error *err);

/* "file:line:col", "--set KEY=VALUE" or the config path: where key k's value came from. */
void config_where(const Config *cfg, int k, char *buf, size_t size);

/* Fills the model keys the config does not set from model.preset (config_presets.c). */
int config_apply_preset(Config *cfg, Error *err);

/* train.init_from naming a model folder: its config.json's model keys fill those the config leaves
 * unset and must equal those it sets (config_folder.c); nothing for a file or none. */
int config_apply_model_folder(Config *cfg, Error *err);

/* Pointers to fields, for config_resolve. */
#define CONFIG_FIELD(cfg, k, type) ((type *)((char *)(cfg) + config_keys[k].offset))

#endif
