/*
 * config/config_print.c - a Config as YAML (--print-config), equality, and the key reference
 * (--help-config, the config reference of docs/configuration.md).
 */
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/config_keys.h"

static int emit(yaml_emitter_t *em, yaml_event_t *ev, Error *err)
{
    if (!yaml_emitter_emit(em, ev))
        return error_runtime(err, "--print-config", "cannot write YAML: %s",
                             em->problem ? em->problem : "output error");
    return 0;
}

static int emit_scalar(yaml_emitter_t *em, const char *text, int quote, Error *err)
{
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1, 1,
                                 quote ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE);
    return emit(em, &ev, err);
}

static int emit_key_value(yaml_emitter_t *em, const Config *cfg, int k, Error *err)
{
    const ConfigKey *key = &config_keys[k];
    char buf[4096];
    int quote;
    if (emit_scalar(em, strchr(key->name, '.') + 1, 0, err) != 0)
        return -1;
    if (!config_key_is_list(cfg, k)) {
        config_key_format(cfg, k, 0, buf, sizeof buf, &quote);
        return emit_scalar(em, buf, quote, err);
    }
    yaml_event_t ev;
    yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_FLOW_SEQUENCE_STYLE);
    if (emit(em, &ev, err) != 0)
        return -1;
    for (int i = 0; i < config_key_count(cfg, k); i++) {
        config_key_format(cfg, k, i, buf, sizeof buf, &quote);
        if (emit_scalar(em, buf, quote, err) != 0)
            return -1;
    }
    yaml_sequence_end_event_initialize(&ev);
    return emit(em, &ev, err);
}

static int emit_config(yaml_emitter_t *em, const Config *cfg, Error *err)
{
    yaml_event_t ev;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    if (emit(em, &ev, err) != 0)
        return -1;
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    if (emit(em, &ev, err) != 0)
        return -1;
    yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
    if (emit(em, &ev, err) != 0)
        return -1;
    for (int k = 0; k < config_n_keys;) {
        const char *name = config_keys[k].name;
        size_t len = (size_t)(strchr(name, '.') - name);
        char section[64];
        snprintf(section, sizeof section, "%.*s", (int)len, name);
        if (emit_scalar(em, section, 0, err) != 0)
            return -1;
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
        if (emit(em, &ev, err) != 0)
            return -1;
        for (; k < config_n_keys && !strncmp(config_keys[k].name, name, len + 1); k++)
            if (emit_key_value(em, cfg, k, err) != 0)
                return -1;
        yaml_mapping_end_event_initialize(&ev);
        if (emit(em, &ev, err) != 0)
            return -1;
    }
    yaml_mapping_end_event_initialize(&ev);
    if (emit(em, &ev, err) != 0)
        return -1;
    yaml_document_end_event_initialize(&ev, 1);
    if (emit(em, &ev, err) != 0)
        return -1;
    yaml_stream_end_event_initialize(&ev);
    return emit(em, &ev, err);
}

int config_print(const Config *cfg, FILE *out, Error *err)
{
    yaml_emitter_t em;
    if (!yaml_emitter_initialize(&em))
        return error_runtime(err, "--print-config", "out of memory");
    yaml_emitter_set_output_file(&em, out);
    yaml_emitter_set_width(&em, 4096);
    yaml_emitter_set_unicode(&em, 1);
    int rc = emit_config(&em, cfg, err);
    if (rc == 0 && !yaml_emitter_flush(&em))
        rc = error_runtime(err, "--print-config", "cannot write the output");
    yaml_emitter_delete(&em);
    return rc;
}

void config_int_list_text(const int64_t *v, int n, char *buf, size_t size)
{
    /* size >= 8 (callers' buffers are larger): "[" and ", ...]" always fit. */
    size_t len = 1, fits = 1; /* fits: the end of the last item after which ", ...]" still fits */
    buf[0] = '[';
    for (int i = 0; i < n; i++) {
        char item[32];
        size_t k = (size_t)snprintf(item, sizeof item, "%s%lld", i ? ", " : "", (long long)v[i]);
        if (len + k + 2 > size) {
            snprintf(buf + fits, size - fits, "%s...]", fits > 1 ? ", " : "");
            return;
        }
        memcpy(buf + len, item, k);
        len += k;
        if (len + 7 <= size)
            fits = len;
    }
    snprintf(buf + len, size - len, "]");
}

int config_equal(const Config *a, const Config *b)
{
    for (int k = 0; k < config_n_keys; k++)
        if (!config_key_equal(a, b, k))
            return 0;
    return 1;
}

/* The key's choices separated by spaces; returns their length. */
static size_t choice_words(const ConfigKey *key, char *buf, size_t size)
{
    size_t n = 0;
    for (const char *p = key->choices; *p && n + 2 < size; p++)
        buf[n++] = *p == '|' ? ' ' : *p;
    buf[n] = '\0';
    return n;
}

/* "integer 1..1024", "number > 0", "one of a, b" ... for the reference. */
static void describe_type(const ConfigKey *key, char *buf, size_t size)
{
    switch (key->type) {
    case KEY_INT:
    case KEY_INT_AUTO:
    case KEY_INT_LIST:
        snprintf(buf, size, "%s%s %lld..%lld", key->type == KEY_INT_LIST ? "list of integers" : "integer",
                 key->type == KEY_INT_AUTO ? " or auto," : "", (long long)key->imin, (long long)key->imax);
        return;
    case KEY_FLOAT:
    case KEY_FLOAT_LIST:
        snprintf(buf, size, "%s %s %g, %s %g", key->type == KEY_FLOAT_LIST ? "list of numbers" : "number",
                 (key->flags & KEY_MIN_OPEN) ? ">" : ">=", key->fmin, (key->flags & KEY_MAX_OPEN) ? "<" : "<=",
                 key->fmax);
        return;
    case KEY_BOOL:
        snprintf(buf, size, "true or false");
        return;
    case KEY_ENUM:
        choice_words(key, buf, size);
        return;
    case KEY_STR:
        snprintf(buf, size, "string");
        return;
    case KEY_STR_LIST:
        snprintf(buf, size, "string or list of strings");
        return;
    case KEY_CHOICE_OR_LIST: {
        size_t n = choice_words(key, buf, size);
        snprintf(buf + n, size - n, " or list of integers %lld..%lld", (long long)key->imin, (long long)key->imax);
        return;
    }
    }
}

void config_print_reference(FILE *out)
{
    fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int k = 0; k < config_n_keys; k++) {
        const ConfigKey *key = &config_keys[k];
        char type[256];
        describe_type(key, type, sizeof type);
        fprintf(out, "| `%s` | %s | %s | %s |\n", key->name, type, key->def ? key->def : key->doc_default,
                key->help);
    }
}
