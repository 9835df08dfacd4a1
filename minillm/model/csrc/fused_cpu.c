/* Fused elementwise kernels for the CPU, float32: each does in one pass over memory what the torch
 * code of minillm/model/layers.py and rope.py does in several operators (each its own loop, its own
 * output tensor, its own dispatch). In a decode step of a small model those operators cost more than
 * their arithmetic: this is what vLLM's fused_add_rms_norm, rotary_embedding and silu_and_mul do.
 *
 *   rms_norm_f32      out = x / sqrt(mean(x^2) + eps) * weight              (rows, size)
 *                     with `sum`: sum = x + residual first, and that is normalised
 *   rope_f32          q and k rotated in place inside the fused qkv rows     (rows, row_stride)
 *   silu_mul_f32      out = silu(gate) * up, gate_up = [gate | up]           (rows, 2 * size)
 *
 * Rows are shared among torch's OpenMP threads when there are enough of them to pay for waking the
 * threads. Built and loaded by minillm/model/fused_cpu.py.
 */
#include <math.h>

#include "fast_exp.h"

#define PARALLEL_FROM 16384 /* elements: below this one thread is faster than waking the others */

void rms_norm_f32(const float *x, const float *residual, float *sum, const float *weight, float *out,
                  long rows, int size, float eps)
{
    #pragma omp parallel for if (rows * size >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *src = x + r * size;
        if (residual != 0) { /* the residual stream's add, in the same pass */
            float *s = sum + r * size;
            const float *res = residual + r * size;
            #pragma omp simd
            for (int d = 0; d < size; d++)
                s[d] = src[d] + res[d];
            src = s;
        }
        float squares = 0.f;
        #pragma omp simd reduction(+ : squares)
        for (int d = 0; d < size; d++)
            squares += src[d] * src[d];
        const float inverse = 1.f / sqrtf(squares / size + eps);
        float *o = out + r * size;
        #pragma omp simd
        for (int d = 0; d < size; d++)
            o[d] = src[d] * inverse * weight[d];
    }
}

/* Rotate the first `heads` heads of every row in place (q's heads, then k's: adjacent in the fused
 * qkv row) by their token's angles: x * cos + rotate_half(x) * sin, the halves of head_dim paired.
 * cos, signed_sin: (rows, head_dim), signed_sin's first half negated (minillm/model/rope.py::Rotation). */
void rope_f32(float *qkv, long row_stride, const float *cos, const float *signed_sin, long rows, int heads,
              int head_dim)
{
    const int half = head_dim / 2;
    #pragma omp parallel for if (rows * heads * head_dim >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *c = cos + r * head_dim, *s = signed_sin + r * head_dim;
        for (int h = 0; h < heads; h++) {
            float *x = qkv + r * row_stride + (long)h * head_dim;
            #pragma omp simd
            for (int d = 0; d < half; d++) {
                const float first = x[d], second = x[d + half];
                x[d] = first * c[d] + second * s[d];
                x[d + half] = second * c[d + half] + first * s[d + half];
            }
        }
    }
}


void silu_mul_f32(const float *gate_up, float *out, long rows, int size)
{
    #pragma omp parallel for if (rows * size >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * size, *up = gate + size;
        float *o = out + r * size;
        #pragma omp simd
        for (int d = 0; d < size; d++)
            o[d] = gate[d] / (1.f + fast_exp(-gate[d])) * up[d];
    }
}
