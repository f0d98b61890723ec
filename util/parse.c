/* util/parse.c - strict number parsing (see parse.h). */
#include "util/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int parse_int64_n(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        neg = s[i++] == '-';
    if (i == n)
        return -1;
    uint64_t v = 0;
    int digits = 0, last_underscore = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '_') {
            if (!digits || last_underscore)
                return -1;
            last_underscore = 1;
            continue;
        }
        if (c < '0' || c > '9')
            return -1;
        unsigned d = (unsigned)(c - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        digits++;
        last_underscore = 0;
    }
    if (!digits || last_underscore)
        return -1;
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return -1;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v;
    }
    return 0;
}

int parse_int64(const char *s, int64_t *out)
{
    return parse_int64_n(s, strlen(s), out);
}

int parse_double(const char *s, double *out)
{
    if (!*s || strchr(" \t\n\r\f\v", s[0]))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v))
        return -1;
    /* strtod also reads hex floats and "infinity"; the isfinite check covers the latter. */
    *out = v;
    return 0;
}
