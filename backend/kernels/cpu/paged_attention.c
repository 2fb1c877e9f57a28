/* Paged attention on the CPU, fp32 or bf16 (q, pages and out in the model's dtype; scores,
 * softmax and the weighted sum in fp32): decodes and prefill chunks in one call, reading K/V
 * straight from their pages (no gathered copy of the context). A bf16 block is widened into a
 * small fp32 buffer once per query (all kv heads at once): half the memory traffic of fp32 pages.
 *
 * Layout (backend/kernels/forward_context.py, backend/kv/pools.py):
 *   q, out        [num_tokens, num_heads, head_dim]           packed sequences, step order;
 *                 q's rows may be strided (q_stride values apart: a slice of the qkv output)
 *   k/v_cache     [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables  [num_seqs, table_width] int32
 *   query_start   [num_seqs + 1] int32: sequence i's queries are rows query_start[i] .. [i+1]
 *   context_lens  [num_seqs] int32: tokens of context after this step (cached | this chunk)
 *
 * Query j of a chunk of q_len tokens sits at position context_len - q_len + j and attends to
 * keys 0 .. that position (causal; a decode is the q_len = 1 case). Each query walks the
 * context block by block with an online softmax per head, so the work is
 * O(queries x context x heads x head_dim) and memory stays O(heads x head_dim + one block).
 * The query heads of one kv head (GQA group) share each key/value row read.
 *
 * Built at first use by backend/kernels/cpu/attention.py with the host compiler (-O3 -march=native),
 * so the loops vectorize to whatever the CPU has (AVX2, AVX-512, NEON).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define MAX_GROUP 64   /* query heads per kv head */
#define MAX_DIM 512    /* head_dim */
#define MAX_BLOCK 256  /* block_size */
/* -ffinite-math-only assumes no infinities: "no score yet" is a large finite negative number */

int paged_attention_bf16_amx(const uint16_t *q, long q_stride, const uint16_t *k_cache,
                             const uint16_t *v_cache, const int32_t *block_tables,
                             int table_width, const int32_t *query_start,
                             const int32_t *context_lens, int num_seqs, int num_heads,
                             int num_kv_heads, int head_dim, int block_size, float scale,
                             uint16_t *out);

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One pass over a query's context for every head: each page block's rows (all kv heads, one
 * contiguous run of the page) are read once — widened into an fp32 buffer for bf16 — and the
 * next block is prefetched while this one is used (a decode's keys are scattered pages: reading
 * them in order, whole, is what the memory system serves fastest). Online softmax per head. */
static int attention(const void *q_, long q_stride, const void *k_cache_, const void *v_cache_,
                     const int32_t *restrict block_tables, int table_width,
                     const int32_t *restrict query_start, const int32_t *restrict context_lens,
                     int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                     float scale, void *out_, int bf16) {
    if (num_kv_heads <= 0 || num_heads % num_kv_heads) return -1;
    const int group = num_heads / num_kv_heads;
    if (group > MAX_GROUP || head_dim > MAX_DIM || block_size > MAX_BLOCK) return -2;
    const long row = (long)num_kv_heads * head_dim;  /* values per token slot in a page */
    const long elem = bf16 ? 2 : 4;
    /* heap, not stack: a worker thread's stack may be small */
    float *work = malloc(sizeof(float) * ((size_t)num_heads * head_dim * 2
                                          + (size_t)group * block_size
                                          + (size_t)block_size * row * 2 + (size_t)num_heads * 2));
    if (work == NULL) return -3;
    float *acc = work, *qbuf = acc + (long)num_heads * head_dim;
    float *s = qbuf + (long)num_heads * head_dim;
    float *kbuf = s + (long)group * block_size, *vbuf = kbuf + (long)block_size * row;
    float *m = vbuf + (long)block_size * row, *l = m + num_heads;
    const char *kc = k_cache_, *vc = v_cache_;

    for (int i = 0; i < num_seqs; i++) {
        const int q0 = query_start[i], q_len = query_start[i + 1] - q0;
        const int ctx = context_lens[i];
        const int32_t *table = block_tables + (long)i * table_width;
        for (int j = 0; j < q_len; j++) {
            const int pos = ctx - q_len + j;  /* attends to keys 0 .. pos */
            const int n_keys = pos + 1;
            const long q_off = (long)(q0 + j) * q_stride;
            const float *qt = (const float *)q_ + q_off;
            if (bf16) {
                bf16_row_to_f32((const uint16_t *)q_ + q_off, qbuf, num_heads * head_dim);
                qt = qbuf;
            }
            for (int h = 0; h < num_heads; h++) {
                m[h] = -1e30f;
                l[h] = 0.f;
            }
            memset(acc, 0, sizeof(float) * num_heads * head_dim);
            for (int t0 = 0; t0 < n_keys; t0 += block_size) {
                const long base = (long)table[t0 / block_size] * block_size * row;
                const int n = n_keys - t0 < block_size ? n_keys - t0 : block_size;
                if (t0 + block_size < n_keys) {  /* the next block, while this one computes */
                    const long next = (long)table[t0 / block_size + 1] * block_size * row * elem;
                    const long bytes = (long)block_size * row * elem;
                    for (long b = 0; b < bytes; b += 64) {
                        __builtin_prefetch(kc + next + b);
                        __builtin_prefetch(vc + next + b);
                    }
                }
                const float *kb = (const float *)k_cache_ + base, *vb = (const float *)v_cache_ + base;
                if (bf16) {
                    bf16_row_to_f32((const uint16_t *)k_cache_ + base, kbuf, (int)(n * row));
                    bf16_row_to_f32((const uint16_t *)v_cache_ + base, vbuf, (int)(n * row));
                    kb = kbuf;
                    vb = vbuf;
                }
                for (int g = 0; g < num_kv_heads; g++) {
                    const float *qg = qt + (long)g * group * head_dim;
                    const float *kg = kb + (long)g * head_dim, *vg = vb + (long)g * head_dim;
                    float *mg = m + g * group, *lg = l + g * group;
                    float *ag = acc + (long)g * group * head_dim;
                    /* scores of the block's keys for every query head of the group; four keys
                       at a time so the four dot products are independent FMA chains */
                    int t = 0;
                    for (; t + 4 <= n; t += 4) {
                        const float *k0 = kg + t * row, *k1 = k0 + row, *k2 = k1 + row,
                                    *k3 = k2 + row;
                        for (int r = 0; r < group; r++) {
                            const float *qr = qg + (long)r * head_dim;
                            float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
                            for (int d = 0; d < head_dim; d++) {
                                a0 += qr[d] * k0[d];
                                a1 += qr[d] * k1[d];
                                a2 += qr[d] * k2[d];
                                a3 += qr[d] * k3[d];
                            }
                            float *sr = s + (long)r * block_size;
                            sr[t] = a0 * scale;
                            sr[t + 1] = a1 * scale;
                            sr[t + 2] = a2 * scale;
                            sr[t + 3] = a3 * scale;
                        }
                    }
                    for (; t < n; t++)
                        for (int r = 0; r < group; r++)
                            s[(long)r * block_size + t] =
                                dot(qg + (long)r * head_dim, kg + t * row, head_dim) * scale;
                    for (int r = 0; r < group; r++) {
                        float *restrict sr = s + (long)r * block_size;
                        float *restrict ar = ag + (long)r * head_dim;
                        float bmax = -1e30f;
                        for (int u = 0; u < n; u++)
                            bmax = sr[u] > bmax ? sr[u] : bmax;
                        const float m_new = bmax > mg[r] ? bmax : mg[r];
                        const float corr = exp_approx(mg[r] - m_new);  /* ~0 on the first block */
                        for (int d = 0; d < head_dim; d++) ar[d] *= corr;
                        float sum = 0.f;  /* a local sum: the loop vectorizes (exp included) */
                        for (int u = 0; u < n; u++) {
                            const float p = exp_approx(sr[u] - m_new);
                            sr[u] = p;
                            sum += p;
                        }
                        lg[r] = lg[r] * corr + sum;
                        mg[r] = m_new;
                    }
                    for (int u = 0; u < n; u++) {
                        const float *vt = vg + u * row;
                        for (int r = 0; r < group; r++) {
                            const float p = s[(long)r * block_size + u];
                            float *ar = ag + (long)r * head_dim;
                            for (int d = 0; d < head_dim; d++) ar[d] += p * vt[d];
                        }
                    }
                }
            }
            for (int h = 0; h < num_heads; h++) {
                const long o = ((long)(q0 + j) * num_heads + h) * head_dim;
                const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
                float *ah = acc + (long)h * head_dim;
                for (int d = 0; d < head_dim; d++) ah[d] *= inv;
                if (bf16)
                    f32_row_to_bf16(ah, (uint16_t *)out_ + o, head_dim);
                else
                    memcpy((float *)out_ + o, ah, sizeof(float) * head_dim);
            }
        }
    }
    free(work);
    return 0;
}

int paged_attention_f32(const float *q, long q_stride, const float *k_cache, const float *v_cache,
                        const int32_t *block_tables, int table_width, const int32_t *query_start,
                        const int32_t *context_lens, int num_seqs, int num_heads,
                        int num_kv_heads, int head_dim, int block_size, float scale, float *out) {
    return attention(q, q_stride, k_cache, v_cache, block_tables, table_width, query_start,
                     context_lens, num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                     out, 0);
}

int paged_attention_bf16(const uint16_t *q, long q_stride, const uint16_t *k_cache,
                         const uint16_t *v_cache, const int32_t *block_tables, int table_width,
                         const int32_t *query_start, const int32_t *context_lens, int num_seqs,
                         int num_heads, int num_kv_heads, int head_dim, int block_size,
                         float scale, uint16_t *out) {
    /* AMX tiles for the scores where the CPU and the shapes allow (paged_attention_amx.c) */
    const int rc = paged_attention_bf16_amx(q, q_stride, k_cache, v_cache, block_tables,
                                            table_width, query_start, context_lens, num_seqs,
                                            num_heads, num_kv_heads, head_dim, block_size, scale,
                                            out);
    if (rc <= 0) return rc;
    return attention(q, q_stride, k_cache, v_cache, block_tables, table_width, query_start,
                     context_lens, num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                     out, 1);
}

/* The step's K/V rows into their page slots: token t's [num_kv_heads, head_dim] row (row_bytes
 * bytes, rows k_stride / v_stride bytes apart: slices of the qkv output) goes to slot
 * slot_mapping[t]; -1 (padding) writes nothing. */
void write_kv_rows(const char *restrict k, long k_stride, const char *restrict v, long v_stride,
                   const int64_t *restrict slot_mapping, int num_tokens, long row_bytes,
                   char *restrict k_cache, char *restrict v_cache) {
    for (int t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        memcpy(k_cache + slot * row_bytes, k + t * k_stride, row_bytes);
        memcpy(v_cache + slot * row_bytes, v + t * v_stride, row_bytes);
    }
}
