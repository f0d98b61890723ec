/*
 * util/parse.h - strict parsing of numbers from text (flags, YAML scalars, data files).
 *
 * The whole string must be the number: no leading or trailing spaces, no trailing junk, no
 * overflow. Integers are decimal with an optional sign; '_' may separate digit groups (131_072).
 * Doubles are what strtod reads, finite only (no nan, no inf).
 */
#ifndef WLB_UTIL_PARSE_H
#define WLB_UTIL_PARSE_H

#include <stddef.h>
#include <stdint.h>

int parse_int64(const char *s, int64_t *out);
int parse_double(const char *s, double *out);
/* Same, over the n bytes at s (not NUL-terminated): for fields of a mapped or read file. */
int parse_int64_n(const char *s, size_t n, int64_t *out);

#endif
