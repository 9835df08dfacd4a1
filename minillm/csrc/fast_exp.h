/* e^x in plain arithmetic a compiler vectorizes, for the C kernels of minillm/attention/csrc and
 * minillm/model/csrc (minillm/native.py puts this folder on their include path):
 * x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial, 2^n written into the exponent bits.
 * Relative error about 2e-7 (expf's rounding). x is clamped to [-87, 88]: below, e^-87 (1.6e-38),
 * which no softmax sum can tell from 0; above, e^88, still a finite float. */
#ifndef MINILLM_FAST_EXP_H
#define MINILLM_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float fast_exp(float x)
{
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    const float shifted = x * 1.44269504f + 12582912.f; /* + 1.5 * 2^23 rounds x / ln2 to an integer n */
    const float n = shifted - 12582912.f;
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln2 in two parts: r stays exact */
    float p = 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    int32_t bits;
    memcpy(&bits, &shifted, sizeof bits);   /* n sits in the low bits of `shifted`'s mantissa */
    bits = (bits - 0x4B400000 + 127) << 23; /* 2^n: n + 127 in the exponent field */
    float two_to_n;
    memcpy(&two_to_n, &bits, sizeof two_to_n);
    return p * two_to_n;
}

#endif
