/* Paged decode attention for the CPU, float32: each sequence's one new query attends over its
 * context_len cached tokens, read in place through its block table (no gather, no copy).
 *
 *   q, out:           (num_seqs, num_heads, head_dim)
 *   k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
 *   block_tables:     (num_seqs, width) int32     context_lens: (num_seqs,) int32, each >= 1
 *
 * Tasks are (sequence, a run of KV heads), spread over torch's OpenMP threads. A task walks the
 * table a block at a time with an online softmax (running max m, running sum l, accumulator acc) for
 * every query head its KV heads serve, as minillm/attention/triton_paged.py does on a GPU:
 *
 *     m' = max(m, max(scores))    acc = acc * exp(m - m') + sum_t exp(s_t - m') v_t
 *                                 l   = l   * exp(m - m') + sum_t exp(s_t - m')      out = acc / l
 *
 * Decode attention reads every cached byte once and does little with it, so the memory is what it
 * waits for. Three things keep that wait short, each measured on a 2-core CPU (see
 * benchmarks/cpu_decode_kernel.py):
 *   - A task takes all the KV heads of a token row when their query heads' accumulators fit in
 *     registers (at most 256 floats): it then reads each row as one contiguous run of memory,
 *     instead of every other 256 bytes of it. With few sequences it takes fewer heads, so that
 *     every thread has a task.
 *   - A jump to a block that is not the next one in memory is announced a block ahead
 *     (__builtin_prefetch): the hardware prefetcher follows runs, not block tables.
 *   - The arithmetic is cheap: exp is a polynomial the compiler vectorizes (exp_nonpositive), the
 *     accumulators are rescaled only when the running max moves, and the common shapes are compiled
 *     with their sizes as constants (SPECIALISED below), so the loops unroll into registers.
 *
 * A row whose context length is outside [1, width * block_size], or whose table names a block outside
 * [0, num_blocks), is not read (its output is left as it was) and counted: the return value, which the
 * caller turns into an error. The kernel guards its own reads, once per row.
 *
 * Built and loaded by minillm/attention/cpu_paged.py.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define MAX_REGISTER_FLOATS 256 /* accumulators a task keeps: query heads x head_dim */

/* e^x for x <= 0, in plain arithmetic a compiler vectorizes: x = n ln2 + r with |r| <= ln2 / 2, e^r by
 * its Taylor polynomial, 2^n written into the exponent bits. Relative error about 2e-7 (expf's
 * rounding); below -87 it returns e^-87 (1.6e-38), which no softmax sum can tell from 0. */
static inline float exp_nonpositive(float x)
{
    x = x < -87.f ? -87.f : x;
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

/* One task: `heads` query heads of one sequence (those of KV heads kv, kv + 1, ...: head h reads KV
 * head kv + h / group), over its `len` tokens. Always inlined, so that where the call passes constants
 * the loops unroll and `acc` stays in registers. */
static inline __attribute__((always_inline)) void
attend(const float *q, const float *k_cache, const float *v_cache, const int *table, int len, float *out,
       float scale, const int head_dim, const int block_size, const int heads, const int group, int kv,
       int num_kv_heads)
{
    const long row = (long)num_kv_heads * head_dim; /* one token to the next, within a block */
    float m[heads], l[heads], acc[heads * head_dim], p[heads * block_size];
    for (int h = 0; h < heads; h++) {
        m[h] = -87.f * 64; /* below any score that could matter; no infinities to subtract */
        l[h] = 0.f;
    }
    for (int i = 0; i < heads * head_dim; i++)
        acc[i] = 0.f;
    for (int b = 0; b * block_size < len; b++) {
        const long block = table[b];
        const int tokens = len - b * block_size < block_size ? len - b * block_size : block_size;
        const float *k_block = k_cache + block * block_size * row + (long)kv * head_dim;
        const float *v_block = v_cache + block * block_size * row + (long)kv * head_dim;
        if ((b + 1) * block_size < len && table[b + 1] != block + 1) { /* a jump: fetch the next block now */
            const long next = (long)table[b + 1] * block_size * row;
            for (long i = 0; i < block_size * row; i += 16) {
                __builtin_prefetch(k_cache + next + i);
                __builtin_prefetch(v_cache + next + i);
            }
        }
        for (int t = 0; t < tokens; t++) { /* scores: every head against the token's K row */
            for (int h = 0; h < heads; h++) {
                const float *qh = q + h * head_dim, *k = k_block + t * row + (h / group) * head_dim;
                float dot = 0.f;
                #pragma omp simd reduction(+ : dot)
                for (int d = 0; d < head_dim; d++)
                    dot += qh[d] * k[d];
                p[h * block_size + t] = dot * scale;
            }
        }
        for (int h = 0; h < heads; h++) { /* the online softmax's update */
            float *ph = p + h * block_size, m_new = m[h], sum = 0.f;
            for (int t = 0; t < tokens; t++)
                m_new = ph[t] > m_new ? ph[t] : m_new;
            #pragma omp simd reduction(+ : sum)
            for (int t = 0; t < tokens; t++) {
                ph[t] = exp_nonpositive(ph[t] - m_new);
                sum += ph[t];
            }
            if (m_new > m[h]) { /* the max moved: what was summed so far shrinks by exp(m - m') */
                const float rescale = exp_nonpositive(m[h] - m_new);
                l[h] *= rescale;
                for (int d = 0; d < head_dim; d++)
                    acc[h * head_dim + d] *= rescale;
                m[h] = m_new;
            }
            l[h] += sum;
        }
        for (int t = 0; t < tokens; t++) { /* acc += p v, every head from the token's V row */
            for (int h = 0; h < heads; h++) {
                const float weight = p[h * block_size + t], *v = v_block + t * row + (h / group) * head_dim;
                #pragma omp simd
                for (int d = 0; d < head_dim; d++)
                    acc[h * head_dim + d] += weight * v[d];
            }
        }
    }
    for (int h = 0; h < heads; h++) {
        const float inverse = 1.f / l[h];
        for (int d = 0; d < head_dim; d++)
            out[h * head_dim + d] = acc[h * head_dim + d] * inverse;
    }
}

/* The shapes compiled with constant sizes (block size 16, the engine's default); others run the same
 * code with sizes read at run time. */
#define SPECIALISED(HD, HEADS)                                                                          \
    if (head_dim == HD && block_size == 16 && task_kv * group == HEADS) {                               \
        attend(qs, k_cache, v_cache, table, len, os, scale, HD, 16, HEADS, group, kv, num_kv_heads);   \
        continue;                                                                                       \
    }

int paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int *block_tables, const int *context_lens, float *out,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                               int block_size, int width, int num_blocks, float scale)
{
    const int group = num_heads / num_kv_heads;
    /* KV heads per task: as many as fit in registers and divide num_kv_heads, while every thread gets a task */
    int task_kv = num_kv_heads;
    while (task_kv > 1 && (task_kv * group * head_dim > MAX_REGISTER_FLOATS || num_kv_heads % task_kv
                           || num_seqs * (num_kv_heads / task_kv) < 2 * omp_get_max_threads()))
        task_kv--;
    const int tasks_per_seq = num_kv_heads / task_kv;
    int refused = 0;
    #pragma omp parallel for schedule(dynamic, 1) reduction(+ : refused)
    for (long task = 0; task < (long)num_seqs * tasks_per_seq; task++) {
        const int s = task / tasks_per_seq, kv = task % tasks_per_seq * task_kv;
        const int len = context_lens[s];
        const int *table = block_tables + (long)s * width;
        int valid = len >= 1 && len <= width * block_size;
        for (int b = 0; valid && b * block_size < len; b++)
            valid = table[b] >= 0 && table[b] < num_blocks;
        if (!valid) {
            refused += kv == 0; /* one count per row */
            continue;
        }
        const float *qs = q + ((long)s * num_heads + kv * group) * head_dim;
        float *os = out + ((long)s * num_heads + kv * group) * head_dim;
        SPECIALISED(64, 1) SPECIALISED(64, 2) SPECIALISED(64, 4) SPECIALISED(64, 8)
        SPECIALISED(128, 1) SPECIALISED(128, 2)
        attend(qs, k_cache, v_cache, table, len, os, scale, head_dim, block_size, task_kv * group, group, kv,
               num_kv_heads);
    }
    return refused;
}
