/* Paged attention on the CPU, fp32: decodes and prefill chunks in one call, reading K/V
 * straight from their pages (no gathered copy of the context, no dtype conversion).
 *
 * Layout (backend/kernels/forward_context.py, backend/kv/pools.py):
 *   q, out        [num_tokens, num_heads, head_dim]           packed sequences, step order;
 *                 q's rows may be strided (q_stride floats apart: a slice of the qkv output)
 *   k/v_cache     [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables  [num_seqs, table_width] int32
 *   query_start   [num_seqs + 1] int32: sequence i's queries are rows query_start[i] .. [i+1]
 *   context_lens  [num_seqs] int32: tokens of context after this step (cached | this chunk)
 *
 * Query j of a chunk of q_len tokens sits at position context_len - q_len + j and attends to
 * keys 0 .. that position (causal; a decode is the q_len = 1 case). Each (query, kv head)
 * pair walks the context block by block with an online softmax, so the work is
 * O(queries x context x head_dim) and memory stays O(head_dim). The query heads of one kv
 * head (GQA group) share each key/value row read.
 *
 * Built at first use by backend/kernels/cpu/attention.py with the host compiler (-O3 -march=native),
 * so the loops vectorize to whatever the CPU has (AVX2, AVX-512, NEON).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 64   /* query heads per kv head */
#define MAX_DIM 512    /* head_dim */
#define MAX_BLOCK 256  /* block_size */
/* -ffinite-math-only assumes no infinities: "no score yet" is a large finite negative number */

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

int paged_attention_f32(const float *restrict q, long q_stride, const float *restrict k_cache,
                        const float *restrict v_cache, const int32_t *restrict block_tables,
                        int table_width, const int32_t *restrict query_start,
                        const int32_t *restrict context_lens, int num_seqs, int num_heads,
                        int num_kv_heads, int head_dim, int block_size, float scale,
                        float *restrict out) {
    if (num_kv_heads <= 0 || num_heads % num_kv_heads) return -1;
    const int group = num_heads / num_kv_heads;
    if (group > MAX_GROUP || head_dim > MAX_DIM || block_size > MAX_BLOCK) return -2;
    const long row = (long)num_kv_heads * head_dim;  /* floats per token slot in a page */
    float acc[MAX_GROUP][MAX_DIM];
    float m[MAX_GROUP], l[MAX_GROUP], s[MAX_GROUP][MAX_BLOCK];

    for (int i = 0; i < num_seqs; i++) {
        const int q0 = query_start[i], q_len = query_start[i + 1] - q0;
        const int ctx = context_lens[i];
        const int32_t *table = block_tables + (long)i * table_width;
        for (int j = 0; j < q_len; j++) {
            const int pos = ctx - q_len + j;  /* attends to keys 0 .. pos */
            const int n_keys = pos + 1;
            for (int g = 0; g < num_kv_heads; g++) {
                const float *qg = q + (long)(q0 + j) * q_stride + (long)g * group * head_dim;
                for (int r = 0; r < group; r++) {
                    m[r] = -1e30f;
                    l[r] = 0.f;
                    memset(acc[r], 0, sizeof(float) * head_dim);
                }
                for (int t0 = 0; t0 < n_keys; t0 += block_size) {
                    const long base = (long)table[t0 / block_size] * block_size * row + (long)g * head_dim;
                    const int n = n_keys - t0 < block_size ? n_keys - t0 : block_size;
                    /* scores of the block's keys for every query head of the group; four keys
                       at a time so the four dot products are independent FMA chains */
                    int t = 0;
                    for (; t + 4 <= n; t += 4) {
                        const float *k0 = k_cache + base + t * row, *k1 = k0 + row,
                                    *k2 = k1 + row, *k3 = k2 + row;
                        for (int r = 0; r < group; r++) {
                            const float *qr = qg + (long)r * head_dim;
                            float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
                            for (int d = 0; d < head_dim; d++) {
                                a0 += qr[d] * k0[d];
                                a1 += qr[d] * k1[d];
                                a2 += qr[d] * k2[d];
                                a3 += qr[d] * k3[d];
                            }
                            s[r][t] = a0 * scale;
                            s[r][t + 1] = a1 * scale;
                            s[r][t + 2] = a2 * scale;
                            s[r][t + 3] = a3 * scale;
                        }
                    }
                    for (; t < n; t++)
                        for (int r = 0; r < group; r++)
                            s[r][t] = dot(qg + (long)r * head_dim, k_cache + base + t * row, head_dim) * scale;
                    for (int r = 0; r < group; r++) {
                        float bmax = -1e30f;
                        for (int u = 0; u < n; u++)
                            if (s[r][u] > bmax) bmax = s[r][u];
                        const float m_new = bmax > m[r] ? bmax : m[r];
                        const float corr = expf(m[r] - m_new);  /* 0 on the first block */
                        l[r] *= corr;
                        for (int d = 0; d < head_dim; d++) acc[r][d] *= corr;
                        for (int u = 0; u < n; u++) {
                            const float p = expf(s[r][u] - m_new);
                            s[r][u] = p;
                            l[r] += p;
                        }
                        m[r] = m_new;
                    }
                    for (int u = 0; u < n; u++) {
                        const float *vt = v_cache + base + u * row;
                        for (int r = 0; r < group; r++) {
                            const float p = s[r][u];
                            for (int d = 0; d < head_dim; d++) acc[r][d] += p * vt[d];
                        }
                    }
                }
                for (int r = 0; r < group; r++) {
                    float *o = out + ((long)(q0 + j) * num_heads + (long)g * group + r) * head_dim;
                    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
                    for (int d = 0; d < head_dim; d++) o[d] = acc[r][d] * inv;
                }
            }
        }
    }
    return 0;
}
