/* util/array.c - see array.h. */
#include "util/array.h"

#include <stdlib.h>

void *array_grow(void *items, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap && items)
        return items;
    int64_t c = *cap > 0 ? *cap : 64;
    while (c < need) {
        if (c > INT64_MAX / 2 || (uint64_t)c > SIZE_MAX / 2 / elem)
            return NULL;
        c *= 2;
    }
    void *bigger = realloc(items, (size_t)c * elem);
    if (bigger)
        *cap = c;
    return bigger;
}
