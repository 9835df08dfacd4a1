/* Paged attention for the CPU, float32, reading the cache in place through block tables (no gather,
 * no copy): decode (each sequence's one new query over its context) and prefill / extend (each
 * sequence's new tokens, causally, over its context and one another).
 *
 *   k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
 *   block_tables:     (num_seqs, width) int32
 *
 * Both keep an online softmax per query row (running max m, running sum l, accumulator acc), as
 * minillm/attention/triton_paged.py does on a GPU:
 *
 *     m' = max(m, max(scores))    acc = acc * exp(m - m') + sum_t exp(s_t - m') v_t
 *                                 l   = l   * exp(m - m') + sum_t exp(s_t - m')      out = acc / l
 *
 * A sequence whose lengths are out of range, or whose table names a block outside [0, num_blocks), is
 * not read (its output is left as it was) and counted: the return value, which the caller turns into
 * an error. The kernels guard their own reads.
 *
 * Built and loaded by minillm/attention/cpu_paged.py (through minillm/native.py). Both measured
 * against the torch reference by benchmarks/cpu_attention_kernels.py.
 *
 * ------------------------------------------------------------------------------------------------
 * Decode:  q, out: (num_seqs, num_heads, head_dim)     context_lens: (num_seqs,) int32, each >= 1
 *          (a sequence's heads contiguous in q, sequences q_stride floats apart: q may be a view of
 *          the fused qkv rows; out is contiguous)
 *
 * Tasks are (sequence, a run of KV heads), spread over torch's OpenMP threads. Decode attention
 * reads every cached byte once and does little with it, so the memory is what it waits for. Three
 * things keep that wait short, each measured on a 2-core CPU:
 *   - A task takes all the KV heads of a token row when their query heads' accumulators fit in
 *     registers (at most 256 floats): it then reads each row as one contiguous run of memory,
 *     instead of every other 256 bytes of it. With few sequences it takes fewer heads, so that
 *     every thread has a task.
 *   - A jump to a block that is not the next one in memory is announced a block ahead
 *     (__builtin_prefetch): the hardware prefetcher follows runs, not block tables.
 *   - The arithmetic is cheap: exp is a polynomial the compiler vectorizes (fast_exp.h), the
 *     accumulators are rescaled only when the running max moves, and the common shapes are compiled
 *     with their sizes as constants (SPECIALISED below), so the loops unroll into registers.
 * ------------------------------------------------------------------------------------------------ */
#include <omp.h>
#include <string.h>

#include "fast_exp.h"

#define MAX_REGISTER_FLOATS 256 /* accumulators a task keeps: query heads x head_dim */


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
                ph[t] = fast_exp(ph[t] - m_new);
                sum += ph[t];
            }
            if (m_new > m[h]) { /* the max moved: what was summed so far shrinks by exp(m - m') */
                const float rescale = fast_exp(m[h] - m_new);
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

int paged_decode_attention_f32(const float *q, long q_stride, const float *k_cache, const float *v_cache,
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
        const float *qs = q + s * q_stride + (long)kv * group * head_dim;
        float *os = out + ((long)s * num_heads + kv * group) * head_dim;
        SPECIALISED(64, 1) SPECIALISED(64, 2) SPECIALISED(64, 4) SPECIALISED(64, 8)
        SPECIALISED(128, 1) SPECIALISED(128, 2)
        attend(qs, k_cache, v_cache, table, len, os, scale, head_dim, block_size, task_kv * group, group, kv,
               num_kv_heads);
    }
    return refused;
}

/* ------------------------------------------------------------------------------------------------
 * The store: each new token's K and V rows (num_kv_heads x head_dim floats, contiguous; tokens
 * k_stride / v_stride floats apart, so they may be views of the fused qkv rows) copied into its slot,
 * slot = block * block_size + offset. A slot outside [0, num_slots) is not written, and counted.
 * ------------------------------------------------------------------------------------------------ */

int store_kv_f32(const float *k, long k_stride, const float *v, long v_stride, const long *slot_mapping,
                 int num_tokens, float *k_cache, float *v_cache, int row, long num_slots)
{
    int refused = 0;
    for (int t = 0; t < num_tokens; t++) {
        const long slot = slot_mapping[t];
        if (slot < 0 || slot >= num_slots) {
            refused++;
            continue;
        }
        memcpy(k_cache + slot * row, k + t * k_stride, row * sizeof(float));
        memcpy(v_cache + slot * row, v + t * v_stride, row * sizeof(float));
    }
    return refused;
}

/* ------------------------------------------------------------------------------------------------
 * Paged prefill / extend attention: sequence i's query_lens[i] new tokens (rows query_starts[i]... of
 * q), at positions context_starts[i]..., attend causally to every cached token up to their own —
 * their own K/V already stored — read in place through the block table.
 *
 *   q:   (num_tokens, num_heads, head_dim), a token's heads contiguous, tokens q_stride apart
 *   out: (num_tokens, num_heads, head_dim), tokens out_stride apart; rows of other sequences untouched
 *
 * A task is one KV head of one tile of up to TILE_ROWS / group new tokens: its rows are (token, query
 * head) pairs, all reading the same keys. It walks the key blocks up to its last token's position;
 * each block's K is first transposed into `kt` (head_dim x block_size), so that a row's scores are
 * head_dim vector multiply-adds across the block's keys — no horizontal sums. Scores past a row's own
 * position (the causal triangle, in the tile's last blocks only) are left out of its softmax. Tasks
 * are handed out longest first (a sequence's last tiles see the most keys), so the threads finish
 * together. Prefill does arithmetic on what it reads (every key serves a tile of rows), so here the
 * work is keeping the multiply-adds independent and in registers (prefill_rows16).
 * ------------------------------------------------------------------------------------------------ */

#define TILE_ROWS 64 /* rows (token x query head) of one task: their accumulators stay in L1 */

/* Rows r0 .. r0 + count - 1 of a tile against one key block (its K transposed in kt): their scores
 * together — `count` independent sums per step, so the multiply-adds do not wait on one another — then
 * each row's online-softmax update and its share of the block's values. */
static inline __attribute__((always_inline)) void
prefill_rows(const float *q, long q_stride, const float *kt, const float *v_block, long row, int r0, const int count,
             int first, int context_start, int b, int keys, float *m, float *l, float *acc, float scale, int kv,
             const int group, const int head_dim, const int block_size)
{
    float s[count][block_size];
    const float *qr[count];
    int visible[count];
    for (int i = 0; i < count; i++) {
        const int r = r0 + i, position = context_start + first + r / group;
        qr[i] = q + (first + r / group) * q_stride + (long)(kv * group + r % group) * head_dim;
        visible[i] = position - b * block_size + 1 < keys ? position - b * block_size + 1 : keys;
        for (int j = 0; j < block_size; j++)
            s[i][j] = 0.f;
    }
    for (int d = 0; d < head_dim; d++)
        for (int i = 0; i < count; i++) {
            const float qd = qr[i][d] * scale;
            #pragma omp simd
            for (int j = 0; j < block_size; j++)
                s[i][j] += qd * kt[d * block_size + j];
        }
    int widest = 0;
    for (int i = 0; i < count; i++) {
        const int r = r0 + i;
        if (visible[i] <= 0) { /* the whole block is after this row's token */
            for (int j = 0; j < block_size; j++)
                s[i][j] = 0.f;
            continue;
        }
        widest = visible[i] > widest ? visible[i] : widest;
        float m_new = m[r], sum = 0.f;
        for (int j = 0; j < visible[i]; j++)
            m_new = s[i][j] > m_new ? s[i][j] : m_new;
        #pragma omp simd reduction(+ : sum)
        for (int j = 0; j < block_size; j++) {
            s[i][j] = j < visible[i] ? fast_exp(s[i][j] - m_new) : 0.f;
            sum += s[i][j];
        }
        if (m_new > m[r]) {
            const float rescale = fast_exp(m[r] - m_new);
            l[r] *= rescale;
            #pragma omp simd
            for (int d = 0; d < head_dim; d++)
                acc[r * head_dim + d] *= rescale;
            m[r] = m_new;
        }
        l[r] += sum;
    }
    for (int i = 0; i < count; i++) {
        float *ar = acc + (r0 + i) * head_dim;
        for (int j = 0; j < widest; j++) {
            const float p = s[i][j], *v = v_block + j * row;
            #pragma omp simd
            for (int d = 0; d < head_dim; d++)
                ar[d] += p * v[d];
        }
    }
}


typedef float vec16 __attribute__((vector_size(64))); /* 16 floats: an AVX-512 register, or 2 or 4 narrower */

static inline vec16 load16(const float *p)
{
    vec16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* prefill_rows for blocks of 16 keys and head_dim a multiple of 16, with the scores and each row's
 * accumulator held in vector variables: the compiler keeps them in registers, where the plain loops
 * above would go through memory at every multiply-add. */
static inline __attribute__((always_inline)) void
prefill_rows16(const float *q, long q_stride, const float *kt, const float *v_block, long row, int r0,
               const int count, int first, int context_start, int b, int keys, float *m, float *l, float *acc,
               float scale, int kv, const int group, const int head_dim)
{
    vec16 s[count];
    const float *qr[count];
    int visible[count];
    for (int i = 0; i < count; i++) {
        const int r = r0 + i, position = context_start + first + r / group;
        qr[i] = q + (first + r / group) * q_stride + (long)(kv * group + r % group) * head_dim;
        visible[i] = position - b * 16 + 1 < keys ? position - b * 16 + 1 : keys;
        s[i] = (vec16){0};
    }
    for (int d = 0; d < head_dim; d++) {
        const vec16 k = load16(kt + d * 16);
        for (int i = 0; i < count; i++)
            s[i] += qr[i][d] * k;
    }
    for (int i = 0; i < count; i++) {
        const int r = r0 + i, seen = visible[i];
        if (seen <= 0)
            continue; /* the whole block is after this row's token */
        float p[16];
        memcpy(p, &s[i], sizeof p);
        float m_new = m[r], sum = 0.f;
        #pragma omp simd reduction(max : m_new)
        for (int j = 0; j < 16; j++)
            m_new = j < seen && p[j] * scale > m_new ? p[j] * scale : m_new;
        #pragma omp simd reduction(+ : sum)
        for (int j = 0; j < 16; j++) {
            p[j] = j < seen ? fast_exp(p[j] * scale - m_new) : 0.f;
            sum += p[j];
        }
        float *ar = acc + r * head_dim;
        const float rescale = m_new > m[r] ? fast_exp(m[r] - m_new) : 1.f;
        l[r] = l[r] * rescale + sum;
        m[r] = m_new;
        vec16 a[head_dim / 16]; /* the row's accumulator, in registers: head_dim / 16 independent sums */
        for (int c = 0; c < head_dim / 16; c++)
            a[c] = load16(ar + 16 * c) * rescale;
        for (int j = 0; j < seen; j++)
            for (int c = 0; c < head_dim / 16; c++)
                a[c] += p[j] * load16(v_block + j * row + 16 * c);
        memcpy(ar, a, sizeof a);
    }
}

static inline __attribute__((always_inline)) void
prefill_tile(const float *q, long q_stride, const float *k_cache, const float *v_cache, const int *table,
             int first, int tokens, int context_start, float *out, long out_stride, float scale, int kv,
             const int group, const int head_dim, const int block_size, int num_kv_heads)
{
    const int rows = tokens * group; /* row r: token r / group, query head kv * group + r % group */
    const long row = (long)num_kv_heads * head_dim;
    float m[rows], l[rows], acc[rows * head_dim], kt[head_dim * block_size];
    for (int r = 0; r < rows; r++) {
        m[r] = -87.f * 64;
        l[r] = 0.f;
    }
    for (int i = 0; i < rows * head_dim; i++)
        acc[i] = 0.f;
    memset(kt, 0, sizeof kt); /* a last block's missing keys: zeros, never counted */
    const int last = context_start + first + tokens - 1; /* the tile's last position: no key after it */
    for (int b = 0; b * block_size <= last; b++) {
        const long block = table[b];
        const int keys = last - b * block_size + 1 < block_size ? last - b * block_size + 1 : block_size;
        const float *k_block = k_cache + block * block_size * row + (long)kv * head_dim;
        const float *v_block = v_cache + block * block_size * row + (long)kv * head_dim;
        for (int j = 0; j < keys; j++) /* K^T: keys side by side, one row of kt per dimension */
            for (int d = 0; d < head_dim; d++)
                kt[d * block_size + j] = k_block[j * row + d];
        int r = 0;
        if (block_size == 16 && head_dim % 16 == 0) {
            for (; r + 8 <= rows; r += 8)
                prefill_rows16(q, q_stride, kt, v_block, row, r, 8, first, context_start, b, keys, m, l, acc, scale, kv,
                               group, head_dim);
            for (; r < rows; r++)
                prefill_rows16(q, q_stride, kt, v_block, row, r, 1, first, context_start, b, keys, m, l, acc, scale, kv,
                               group, head_dim);
        }
        for (; r + 4 <= rows; r += 4)
            prefill_rows(q, q_stride, kt, v_block, row, r, 4, first, context_start, b, keys, m, l, acc, scale, kv,
                         group, head_dim, block_size);
        for (; r < rows; r++)
            prefill_rows(q, q_stride, kt, v_block, row, r, 1, first, context_start, b, keys, m, l, acc, scale, kv,
                         group, head_dim, block_size);
    }
    for (int r = 0; r < rows; r++) {
        float *o = out + (first + r / group) * out_stride + (long)(kv * group + r % group) * head_dim;
        const float inverse = 1.f / l[r];
        #pragma omp simd
        for (int d = 0; d < head_dim; d++)
            o[d] = acc[r * head_dim + d] * inverse;
    }
}

int paged_prefill_attention_f32(const float *q, long q_stride, const float *k_cache, const float *v_cache,
                                const int *block_tables, const int *query_starts, const int *query_lens,
                                const int *context_starts, float *out, long out_stride, int num_seqs,
                                int num_heads, int num_kv_heads, int head_dim, int block_size, int width,
                                int num_blocks, float scale)
{
    const int group = num_heads / num_kv_heads;
    const int tile = TILE_ROWS / group > 0 ? TILE_ROWS / group : 1; /* new tokens per task */
    int refused = 0;
    long tasks = 0;
    for (int s = 0; s < num_seqs; s++)
        tasks += (long)num_kv_heads * ((query_lens[s] + tile - 1) / tile);
    #pragma omp parallel for schedule(dynamic, 1) reduction(+ : refused)
    for (long task = 0; task < tasks; task++) {
        /* which sequence, KV head and tile: walk the sequences (a prefill step has few) */
        long t = task;
        int s = 0;
        while (t >= (long)num_kv_heads * ((query_lens[s] + tile - 1) / tile)) {
            t -= (long)num_kv_heads * ((query_lens[s] + tile - 1) / tile);
            s++;
        }
        const int tiles = (query_lens[s] + tile - 1) / tile;
        const int kv = t % num_kv_heads, first = (tiles - 1 - t / num_kv_heads) * tile; /* the longest first */
        const int tokens = query_lens[s] - first < tile ? query_lens[s] - first : tile;
        const int *table = block_tables + (long)s * width;
        const int end = context_starts[s] + query_lens[s];
        int valid = context_starts[s] >= 0 && query_lens[s] >= 1 && end <= width * block_size;
        for (int b = 0; valid && b * block_size < end; b++)
            valid = table[b] >= 0 && table[b] < num_blocks;
        if (!valid) {
            refused += kv == 0 && first == 0; /* one count per sequence */
            continue;
        }
        const float *qs = q + query_starts[s] * q_stride;
        float *os = out + query_starts[s] * out_stride;
        if (head_dim == 64 && block_size == 16 && group == 1)
            prefill_tile(qs, q_stride, k_cache, v_cache, table, first, tokens, context_starts[s], os, out_stride,
                         scale, kv, 1, 64, 16, num_kv_heads);
        else if (head_dim == 64 && block_size == 16 && group == 2)
            prefill_tile(qs, q_stride, k_cache, v_cache, table, first, tokens, context_starts[s], os, out_stride,
                         scale, kv, 2, 64, 16, num_kv_heads);
        else if (head_dim == 128 && block_size == 16)
            prefill_tile(qs, q_stride, k_cache, v_cache, table, first, tokens, context_starts[s], os, out_stride,
                         scale, kv, group, 128, 16, num_kv_heads);
        else
            prefill_tile(qs, q_stride, k_cache, v_cache, table, first, tokens, context_starts[s], os, out_stride,
                         scale, kv, group, head_dim, block_size, num_kv_heads);
    }
    return refused;
}
