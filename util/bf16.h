/*
 * util/bf16.h - bfloat16 (the top 16 bits of a float32) to and from float32, on the host.
 * Rounding is to nearest, ties to even (what __float2bfloat16_rn does on the GPU); NaN stays NaN.
 */
#ifndef WLB_UTIL_BF16_H
#define WLB_UTIL_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN, sign kept */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
