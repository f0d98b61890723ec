/*
 * config/config_load.c - YAML (libyaml's document API) and --set KEY=VALUE into a Config.
 *
 * The file is a mapping of sections (model, parallel, data, balance, train, checkpoint, log), each a
 * mapping of keys to a scalar or a list of scalars. Errors point at the offending node, 1-based:
 * "llama8b.yaml:12:5: parallel.tp: expected an integer, got 'two'".
 *
 * Nesting is limited before the document is built (CONFIG_MAX_NESTING): libyaml 0.2.5's scanner
 * checks every open flow level for stale simple keys at each token, so text nested n levels deep
 * costs O(n^2) - 200 KB of "[" (100,000 levels) ran past a minute. A config is at most 3 levels
 * (sections, keys, lists); the limit is checked on the event stream, which stops at the first
 * node past it, after at most the limit's worth of levels have been scanned.
 */
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/config_keys.h"
#include "util/fileio.h"

/* Deepest nesting of mappings and sequences accepted; a config needs 3 (see the top). */
#define CONFIG_MAX_NESTING 16

void config_init(Config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int k = 0; k < config_n_keys; k++) {
        const char *def = config_keys[k].def;
        if (!def)
            continue;
        int plain = 1;
        ConfigValue v = {0, 1, &def, &plain};
        Error err = {0};
        /* The defaults are constants of the table; a test checks each one loads. */
        if (config_key_assign(cfg, k, &v, "default", &err) != 0)
            error_exit(&err);
    }
}

void config_free(Config *cfg)
{
    for (int k = 0; k < config_n_keys; k++)
        config_key_free(cfg, k);
    free(cfg->parallel.chunk_layers.v);
    cfg->parallel.chunk_layers = (ConfigIntList){0, NULL};
    free(cfg->source_path);
    cfg->source_path = NULL;
}

static void mark_where(const char *name, yaml_mark_t m, char *buf, size_t size)
{
    snprintf(buf, size, "%s:%zu:%zu", name, m.line + 1, m.column + 1);
}

/* Location of a node: "name:line:col", or the --set argument when set_arg is given (its first 72
 * characters and "..." when longer than 80, so that the message after it fits the Error). */
static void node_where(const char *name, const char *set_arg, yaml_mark_t m, char *buf, size_t size)
{
    if (set_arg && strlen(set_arg) > 80)
        snprintf(buf, size, "--set %.72s...", set_arg);
    else if (set_arg)
        snprintf(buf, size, "--set %s", set_arg);
    else
        mark_where(name, m, buf, size);
}

/* A scalar or a sequence of scalars as a ConfigValue; the arrays are malloc'd. */
static int node_value(yaml_document_t *doc, yaml_node_t *node, const char *key, const char *name,
                      const char *set_arg, ConfigValue *v, const char ***items, int **plain, Error *err)
{
    char where[1200];
    node_where(name, set_arg, node->start_mark, where, sizeof where);
    *items = NULL;
    *plain = NULL;
    if (node->type == YAML_MAPPING_NODE)
        return error_set(err, where, "%s: expected a value or a list, got a mapping", key);
    int n = 1;
    if (node->type == YAML_SEQUENCE_NODE)
        n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
    *items = calloc((size_t)n + 1, sizeof **items);
    *plain = calloc((size_t)n + 1, sizeof **plain);
    if (!*items || !*plain)
        return error_runtime(err, where, "out of memory");
    if (node->type == YAML_SCALAR_NODE) {
        (*items)[0] = (const char *)node->data.scalar.value;
        (*plain)[0] = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    } else {
        for (int i = 0; i < n; i++) {
            yaml_node_t *item = yaml_document_get_node(doc, node->data.sequence.items.start[i]);
            if (!item || item->type != YAML_SCALAR_NODE) {
                if (item)
                    node_where(name, set_arg, item->start_mark, where, sizeof where);
                return error_set(err, where, "%s: list entries must be plain values", key);
            }
            (*items)[i] = (const char *)item->data.scalar.value;
            (*plain)[i] = item->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        }
    }
    *v = (ConfigValue){node->type == YAML_SEQUENCE_NODE, n, *items, *plain};
    return 0;
}

/* Assigns a YAML node to key k and records where it came from. */
static int assign_node(Config *cfg, int k, yaml_document_t *doc, yaml_node_t *node, const char *name,
                       ConfigOrigin origin, Error *err)
{
    ConfigValue v;
    const char **items;
    int *plain;
    char where[1200];
    const char *set_arg = origin.kind == ORIGIN_SET ? origin.arg : NULL;
    node_where(name, set_arg, node->start_mark, where, sizeof where);
    int rc = node_value(doc, node, config_keys[k].name, name, set_arg, &v, &items, &plain, err);
    if (rc == 0)
        rc = config_key_assign(cfg, k, &v, where, err);
    free(items);
    free(plain);
    if (rc == 0)
        cfg->origin[k] = origin;
    return rc;
}

static int yaml_problem(yaml_parser_t *p, const char *name, Error *err)
{
    char where[1200];
    if (p->error == YAML_MEMORY_ERROR)
        return error_runtime(err, name, "out of memory parsing YAML");
    mark_where(name, p->problem_mark, where, sizeof where);
    if (p->context)
        return error_set(err, where, "YAML syntax: %s %s", p->problem ? p->problem : "error", p->context);
    return error_set(err, where, "YAML syntax: %s", p->problem ? p->problem : "error");
}

/* The error for a key the table does not have: why it is gone, the nearest key, or the help. */
static int unknown_key(Error *err, const char *where, const char *key)
{
    const char *removed = config_key_removed(key), *hint = config_key_hint(key);
    if (removed)
        return error_set(err, where, "%s: %s", key, removed);
    if (hint)
        return error_set(err, where, "%s: unknown key (did you mean %s?)", key, hint);
    return error_set(err, where, "%s: unknown key (see wlbtrain --help-config)", key);
}

static int load_section(Config *cfg, yaml_document_t *doc, const char *section, yaml_node_t *map,
                        const char *name, unsigned char *seen, Error *err)
{
    char where[1200];
    if (map->type == YAML_SCALAR_NODE && map->data.scalar.length == 0)
        return 0; /* "model:" with nothing under it */
    if (map->type != YAML_MAPPING_NODE) {
        mark_where(name, map->start_mark, where, sizeof where);
        return error_set(err, where, "%s: expected a mapping of keys (such as %s.KEY: VALUE)", section, section);
    }
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top; pair++) {
        yaml_node_t *kn = yaml_document_get_node(doc, pair->key);
        yaml_node_t *vn = yaml_document_get_node(doc, pair->value);
        mark_where(name, kn->start_mark, where, sizeof where);
        if (kn->type != YAML_SCALAR_NODE)
            return error_set(err, where, "%s: keys must be plain names", section);
        char full[512];
        snprintf(full, sizeof full, "%s.%s", section, (const char *)kn->data.scalar.value);
        int k = config_key_find(full);
        if (k < 0)
            return unknown_key(err, where, full);
        if (seen[k])
            return error_set(err, where, "%s: set twice in this file", full);
        seen[k] = 1;
        ConfigOrigin origin = {ORIGIN_FILE, (int)vn->start_mark.line + 1, (int)vn->start_mark.column + 1, NULL};
        if (assign_node(cfg, k, doc, vn, name, origin, err) != 0)
            return -1;
    }
    return 0;
}

/* Walks the events of text and refuses a node nested deeper than CONFIG_MAX_NESTING (at that
 * node: name:line:col, or where for --set). Syntax errors are left to the loader that follows. */
static int check_nesting(const char *text, const char *name, const char *set_arg, Error *err)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return error_runtime(err, name, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    int depth = 0, rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev))
            break; /* the loader reports it, with the same location */
        yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > CONFIG_MAX_NESTING) {
                char where[1200];
                node_where(name, set_arg, ev.start_mark, where, sizeof where);
                rc = error_set(err, where,
                               "YAML nested more than %d levels deep; a config is sections of keys whose "
                               "values are plain values or lists of them (3 levels)", CONFIG_MAX_NESTING);
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (rc != 0 || type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&parser);
    return rc;
}

int config_load_string(Config *cfg, const char *text, const char *name, Error *err)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    if (check_nesting(text, name, NULL, err) != 0)
        return -1;
    if (!yaml_parser_initialize(&parser))
        return error_runtime(err, name, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_problem(&parser, name, err);
        yaml_parser_delete(&parser);
        return -1;
    }
    if (!cfg->source_path || strcmp(cfg->source_path, name)) {
        free(cfg->source_path);
        if (!(cfg->source_path = strdup(name))) {
            yaml_document_delete(&doc);
            yaml_parser_delete(&parser);
            return error_runtime(err, name, "out of memory");
        }
    }
    int rc = 0;
    char where[1200];
    unsigned char seen[CONFIG_MAX_KEYS] = {0};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        /* A second document after this one is a mistake worth reporting. */
        yaml_document_t extra;
        if (!yaml_parser_load(&parser, &extra)) {
            rc = yaml_problem(&parser, name, err);
        } else {
            yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
            if (extra_root) {
                mark_where(name, extra_root->start_mark, where, sizeof where);
                rc = error_set(err, where, "a second YAML document; a config is one document");
            }
            yaml_document_delete(&extra);
        }
    }
    if (rc == 0 && root && !(root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0)) {
        if (root->type != YAML_MAPPING_NODE) {
            mark_where(name, root->start_mark, where, sizeof where);
            rc = error_set(err, where, "expected a mapping of sections (model:, parallel:, data:, ...)");
        }
        for (yaml_node_pair_t *pair = rc ? NULL : root->data.mapping.pairs.start;
             pair && pair < root->data.mapping.pairs.top; pair++) {
            yaml_node_t *kn = yaml_document_get_node(&doc, pair->key);
            yaml_node_t *vn = yaml_document_get_node(&doc, pair->value);
            mark_where(name, kn->start_mark, where, sizeof where);
            if (kn->type != YAML_SCALAR_NODE) {
                rc = error_set(err, where, "section names must be plain names");
                break;
            }
            const char *section = (const char *)kn->data.scalar.value;
            if (!config_section_known(section, strlen(section))) {
                const char *hint = config_section_hint(section);
                if (hint)
                    rc = error_set(err, where, "%s: unknown section (did you mean %s?)", section, hint);
                else
                    rc = error_set(err, where,
                                   "%s: unknown section (sections: model, parallel, data, balance, train, "
                                   "checkpoint, log)", section);
                break;
            }
            if ((rc = load_section(cfg, &doc, section, vn, name, seen, err)) != 0)
                break;
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int config_load_file(Config *cfg, const char *path, Error *err)
{
    char *text;
    size_t len;
    if (file_read_text(path, "YAML text file", &text, &len, err) != 0)
        return -1;
    int rc = config_load_string(cfg, text, path, err);
    free(text);
    return rc;
}

int config_apply_set(Config *cfg, const char *arg, Error *err)
{
    char where[1200];
    snprintf(where, sizeof where, "--set %s", arg);
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return error_set(err, "--set", "expected KEY=VALUE (such as parallel.tp=2), got '%s'", arg);
    char key[256];
    if ((size_t)(eq - arg) >= sizeof key)
        return error_set(err, where, "key too long");
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg), arg);
    int k = config_key_find(key);
    if (k < 0)
        return unknown_key(err, where, key);
    const char *value = eq + 1;
    if (check_nesting(value, where, arg, err) != 0)
        return -1;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return error_runtime(err, where, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)value, strlen(value));
    if (!yaml_parser_load(&parser, &doc)) {
        int rc = error_set(err, where, "%s: cannot read the value: %s", key,
                           parser.problem ? parser.problem : "YAML syntax error");
        yaml_parser_delete(&parser);
        return rc;
    }
    int rc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    ConfigOrigin origin = {ORIGIN_SET, 0, 0, arg};
    if (!root) {
        /* An empty value (KEY=) is null: unsets an optional key, an error for others. */
        const char *empty = "";
        int plain = 1;
        ConfigValue v = {0, 1, &empty, &plain};
        rc = config_key_assign(cfg, k, &v, where, err);
        if (rc == 0)
            cfg->origin[k] = origin;
    } else {
        rc = assign_node(cfg, k, &doc, root, where, origin, err);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}
