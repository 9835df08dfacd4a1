/* A step's structured-output mask, applied to the logits on the CPU: every token whose bit is 0 in its
 * row of the bitmask gets -inf. One bit per token, 32 tokens a word (xgrammar's layout: token t is bit
 * t % 32 of word t / 32). A word of all ones — every token of it allowed — is skipped whole, and in a
 * JSON mask most words are all ones or all zeros.
 *
 *   apply_bitmask_f32   logits (rows, vocab) float32, row r of it at logits + r * stride;
 *                       bitmask (rows, words) int32; `rows`: which rows to mask (num_rows of them)
 *
 * The library's own CPU routine took ~0.2 ms for 16 rows of 4,096 tokens here, as long as a decode step's
 * whole sampling; this loop takes a few µs. Built and loaded by minillm/structured/grammars.py.
 */
#include <math.h>
#include <stdint.h>

void apply_bitmask_f32(float *logits, long stride, const int32_t *bitmask, long words, const long *rows,
                       long num_rows, long vocab)
{
    for (long i = 0; i < num_rows; i++) {
        float *row = logits + rows[i] * stride;
        const uint32_t *bits = (const uint32_t *)(bitmask + rows[i] * words);
        for (long w = 0; w < words && w * 32 < vocab; w++) {
            uint32_t word = bits[w];
            if (word == 0xFFFFFFFFu)
                continue;
            long base = w * 32, end = base + 32 < vocab ? base + 32 : vocab;
            for (long t = base; t < end; t++)
                if (!((word >> (t - base)) & 1u))
                    row[t] = -INFINITY;
        }
    }
}
