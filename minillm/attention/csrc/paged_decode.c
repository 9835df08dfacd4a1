/* Paged decode attention for the CPU, float32: each sequence's one new query attends over its
 * context_len cached tokens, read in place through its block table (no gather, no copy).
 *
 *   q, out:           (num_seqs, num_heads, head_dim)
 *   k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
 *   block_tables:     (num_seqs, width) int32     context_lens: (num_seqs,) int32, each >= 1
 *
 * One task per (sequence, KV head), spread over torch's OpenMP threads: the group of query heads
 * sharing that KV head walks the table a block at a time with an online softmax (running max m,
 * running sum l, accumulator acc), as minillm/attention/triton_paged.py does on a GPU:
 *
 *     m' = max(m, max(scores))    acc = acc * exp(m - m') + sum_t exp(s_t - m') v_t
 *                                 l   = l   * exp(m - m') + sum_t exp(s_t - m')      out = acc / l
 *
 * A row whose context length is outside [1, width * block_size], or whose table names a block outside
 * [0, num_blocks), is not read (its output is left as it was) and counted: the return value, which the
 * caller turns into an error. The kernel guards its own reads, once per row.
 *
 * Built and loaded by minillm/attention/cpu_paged.py.
 */
#include <math.h>

int paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int *block_tables, const int *context_lens, float *out,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                               int block_size, int width, int num_blocks, float scale)
{
    const int group = num_heads / num_kv_heads;
    int refused = 0;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) reduction(+ : refused)
    for (int s = 0; s < num_seqs; s++) {
        for (int kv = 0; kv < num_kv_heads; kv++) {
            const int len = context_lens[s];
            int valid = len >= 1 && len <= width * block_size;
            for (int b = 0; valid && b * block_size < len; b++)
                valid = block_tables[(long)s * width + b] >= 0 && block_tables[(long)s * width + b] < num_blocks;
            if (!valid) {
                refused += kv == 0;  /* one count per row */
                continue;
            }
            float m[group], l[group], acc[group * head_dim], scores[group * block_size];
            const float *qs = q + ((long)s * num_heads + kv * group) * head_dim;
            for (int g = 0; g < group; g++) {
                m[g] = -INFINITY;
                l[g] = 0.f;
            }
            for (int i = 0; i < group * head_dim; i++)
                acc[i] = 0.f;
            for (int b = 0; b * block_size < len; b++) {
                const long block = block_tables[(long)s * width + b];
                const int tokens = len - b * block_size < block_size ? len - b * block_size : block_size;
                for (int t = 0; t < tokens; t++) {  /* this block's scores, every query head of the group */
                    const float *k = k_cache + ((block * block_size + t) * num_kv_heads + kv) * head_dim;
                    for (int g = 0; g < group; g++) {
                        const float *qg = qs + g * head_dim;
                        float dot = 0.f;
                        #pragma omp simd reduction(+ : dot)
                        for (int d = 0; d < head_dim; d++)
                            dot += qg[d] * k[d];
                        scores[g * block_size + t] = dot * scale;
                    }
                }
                for (int g = 0; g < group; g++) {  /* the online softmax's update */
                    const float *sg = scores + g * block_size;
                    float *ag = acc + g * head_dim;
                    float m_new = m[g];
                    for (int t = 0; t < tokens; t++)
                        m_new = sg[t] > m_new ? sg[t] : m_new;
                    const float rescale = expf(m[g] - m_new);
                    l[g] *= rescale;
                    #pragma omp simd
                    for (int d = 0; d < head_dim; d++)
                        ag[d] *= rescale;
                    for (int t = 0; t < tokens; t++) {
                        const float p = expf(sg[t] - m_new);
                        const float *v = v_cache + ((block * block_size + t) * num_kv_heads + kv) * head_dim;
                        l[g] += p;
                        #pragma omp simd
                        for (int d = 0; d < head_dim; d++)
                            ag[d] += p * v[d];
                    }
                    m[g] = m_new;
                }
            }
            for (int g = 0; g < group; g++) {
                float *o = out + ((long)s * num_heads + kv * group + g) * head_dim;
                const float inverse = 1.f / l[g];
                for (int d = 0; d < head_dim; d++)
                    o[d] = acc[g * head_dim + d] * inverse;
            }
        }
    }
    return refused;
}
