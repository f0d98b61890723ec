/*
 * config/config_changes.c - which keys differ between two configs, with both values as YAML text
 * (see config.h): what a run that continues another one's checkpoint prints at its start.
 */
#include <stdio.h>
#include <string.h>

#include "config/config_keys.h"

/* Key k's value as it would be written in a YAML file: a scalar, or a list in flow style ("[a, b]"),
 * cut with "...]" where it would not fit in size (>= 8). */
static void value_text(const Config *cfg, int k, char *buf, size_t size)
{
    char item[160];
    int quote;
    if (!config_key_is_list(cfg, k)) {
        config_key_format(cfg, k, 0, item, sizeof item, &quote);
        snprintf(buf, size, quote ? "'%s'" : "%s", item);
        return;
    }
    size_t len = 1;
    buf[0] = '[';
    buf[1] = '\0';
    int n = config_key_count(cfg, k);
    for (int i = 0; i < n; i++) {
        config_key_format(cfg, k, i, item, sizeof item, &quote);
        char one[180];
        size_t m = (size_t)snprintf(one, sizeof one, quote ? "%s'%s'" : "%s%s", i ? ", " : "", item);
        if (len + m + 6 > size) {
            snprintf(buf + len, size - len, "%s...]", i ? ", " : "");
            return;
        }
        memcpy(buf + len, one, m + 1);
        len += m;
    }
    snprintf(buf + len, size - len, "]");
}

int config_changes(const Config *a, const Config *b, ConfigChange *out, int max)
{
    int n = 0;
    for (int k = 0; k < config_n_keys; k++) {
        if (config_key_equal(a, b, k))
            continue;
        if (n < max) {
            out[n].key = config_keys[k].name;
            value_text(a, k, out[n].before, sizeof out[n].before);
            value_text(b, k, out[n].after, sizeof out[n].after);
        }
        n++;
    }
    return n;
}
