/*
 * test/test_comm_sum16.c - the bfloat16 sums' addition (parallel.reduce_dtype: compute on MPI's
 * path, engine/comm/comm_sum16.c): each step of the user operation, inout = bf16(in + inout), must
 * round the exact sum to the nearest bfloat16, ties to even, as ncclBfloat16's sums do - not keep
 * its top 16 bits (toward zero), which shifts every SP reduce-scatter, TP sum and dK/dV sum in bf16
 * by up to an ulp and which no end-to-end tolerance sees.
 *
 * The reference is float64 and rounds by its own arithmetic (the two bfloat16 neighbours of the
 * exact sum and the distance to each), not by util/bf16.h. The operands' exponents differ by at most
 * 8, so float32 holds their sum exactly and a single rounding is what both NCCL and MPI's operation do.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "util/rng.h"

static uint16_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    assert_int_equal(u & 0xffffu, 0); /* a bfloat16 value: the low half is zero */
    return (uint16_t)(u >> 16);
}

static double value_of(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bfloat16 nearest to x (normal range), ties to the even significand; *tie set when x was halfway,
 * *up when the magnitude was rounded up. */
static uint16_t round_ref(double x, int *tie, int *up)
{
    *tie = *up = 0;
    if (x == 0)
        return 0;
    int e;
    double m = frexp(fabs(x), &e);  /* |x| = m 2^e, m in [0.5, 1) */
    double q = ldexp(m, 8);         /* 8 significant bits: q in [128, 256) */
    double lo = floor(q), frac = q - lo;
    double r = lo;
    if (frac > 0.5 || (frac == 0.5 && fmod(lo, 2) == 1))
        r = lo + 1;
    *tie = frac == 0.5;
    *up = r > lo;
    return bits_of((float)copysign(ldexp(r, e - 8), x));
}

/* A random bfloat16 of exponent e (value in [2^e, 2^(e+1))), random significand and sign. */
static uint16_t random_bf16(Rng *s, int e)
{
    uint64_t r = rng_next_u64(s);
    double v = ldexp(1.0 + (double)(r & 0x7f) / 128.0, e);
    return bits_of((float)((r >> 7) & 1 ? -v : v));
}

/* Hand-made cases: halfway sums both ways to even, just above halfway, negatives, cancellation. */
static void test_cases(void **state)
{
    (void)state;
    const struct { float a, b; uint16_t want; } cases[] = {
        {1.0f, 0x1p-8f, 0x3f80},                    /* 1 + half an ulp: a tie, down to the even 1.0 */
        {1.0f + 0x1p-7f, 0x1p-8f, 0x3f82},          /* 1.0078125 + half an ulp: a tie, up to the even */
        {-1.0f - 0x1p-7f, -0x1p-8f, 0xbf82},        /* the same, negative: away from zero */
        {1.0f, 0x1p-8f + 0x1p-12f, 0x3f81},         /* just above halfway: up */
        {3.0f, -0x1p-7f, 0x4040},                   /* 2.9921875: halfway between 2.984375 and 3, to 3 */
        {1.5f, -1.5f, 0x0000},                      /* cancellation: +0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t a = bits_of(cases[i].a), b = bits_of(cases[i].b);
        int tie, up;
        assert_int_equal(round_ref((double)cases[i].a + (double)cases[i].b, &tie, &up), cases[i].want);
        comm_bf16_add(&a, &b, 1);
        if (b != cases[i].want)
            print_error("%g + %g: 0x%04x, nearest-even 0x%04x\n", (double)cases[i].a, (double)cases[i].b, b,
                        cases[i].want);
        assert_int_equal(b, cases[i].want);
    }
}

/* 200,000 random pairs, one call over the whole array: every sum the float64 reference's bits. */
static void test_random(void **state)
{
    (void)state;
    enum { N = 200000 };
    static uint16_t in[N], inout[N], want[N];
    Rng s;
    rng_seed(&s, 52);
    int ties = 0, ups = 0;
    for (int i = 0; i < N; i++) {
        int e = (int)rng_below(&s, 13) - 6;
        in[i] = random_bf16(&s, e);
        inout[i] = random_bf16(&s, e + (int)rng_below(&s, 17) - 8);
        int tie, up;
        want[i] = round_ref(value_of(in[i]) + value_of(inout[i]), &tie, &up);
        ties += tie;
        ups += up;
    }
    comm_bf16_add(in, inout, N);
    int wrong = 0, first = -1;
    for (int i = 0; i < N; i++)
        if (inout[i] != want[i] && wrong++ == 0)
            first = i;
    printf("# %d random sums: %d halfway, %d rounded up in magnitude; %d differ from the float64 reference\n", N,
           ties, ups, wrong);
    if (wrong)
        print_error("first: 0x%04x + (the other) gave 0x%04x, nearest-even 0x%04x\n", in[first], inout[first],
                    want[first]);
    assert_true(ties > 1000 && ups > 10000); /* the cases that tell rounding from truncation */
    assert_int_equal(wrong, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests_name("comm_sum16", tests, NULL, NULL);
}
