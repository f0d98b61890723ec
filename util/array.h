/*
 * util/array.h - growing arrays.
 *
 * array_grow returns items enlarged (by doubling, from 64) to hold at least need elements of elem
 * bytes, updating *cap; it returns items itself when it is big enough, and NULL when memory runs
 * out, leaving items and *cap as they were:
 *     PlanDoc *bigger = array_grow(q->items, &q->cap, q->n + 1, sizeof *bigger);
 *     if (!bigger) return error_runtime(...);
 *     q->items = bigger;
 */
#ifndef WLB_UTIL_ARRAY_H
#define WLB_UTIL_ARRAY_H

#include <stddef.h>
#include <stdint.h>

void *array_grow(void *items, int64_t *cap, int64_t need, size_t elem);

#endif
