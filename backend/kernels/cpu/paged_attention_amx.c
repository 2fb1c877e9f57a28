/* Paged attention for bf16 on CPUs with AMX tiles (Intel Sapphire Rapids and later): the scores
 * by tile dot products straight from the bf16 pages, the softmax and the weighted sum of V in
 * AVX-512. Same layout, arguments and results as paged_attention.c's bf16 path (scores, softmax
 * and the sum in fp32, one rounding of the output); that path is the fallback for everything
 * this one does not take.
 *
 * Why: the portable kernel computes each score as a 64-wide dot product and reduces the vector
 * horizontally per (key, head), ~12 instructions a score; on a decode-heavy step that was 20 of
 * tiny-coder's 35 ms at batch 200 (BENCHMARKS.md, issue 32). Here, per query and kv head, one
 * TDPBF16PS multiplies a 16-key x 32-dim tile of K (read in place from its page: no widening,
 * no copy) by the group's query heads laid out as the tile's B operand (VNNI pairs), giving
 * 16 keys x all the group's heads per instruction. Two passes per query row (all scores, then an
 * exact softmax, then P.V) instead of the online softmax: the scores of a whole context are
 * [context, group] fp32, a few KB.
 *
 * Taken when: built with AMX-TILE/AMX-BF16/AVX-512F (-march=native on such a CPU), the kernel
 * granted the tile state (arch_prctl ARCH_REQ_XCOMP_PERM), head_dim a multiple of 16 up to 128,
 * block_size a multiple of 16, at most 16 query heads per kv head, and not switched off
 * (cpu_amx_mode(0); TIDEGATE_CPU_AMX=off at load). Elsewhere (AVX2, ARM, other shapes) this
 * file compiles to the mode switch alone and the portable kernel runs.
 *
 * Tile state is per thread: the caller's configuration is saved on entry and restored on exit
 * (oneDNN's AMX matmuls run in the same thread and may keep theirs loaded between calls).
 */
#define _GNU_SOURCE  /* syscall() */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#define TIDEGATE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define TIDEGATE_AMX 0
#endif

static int amx_mode = -1;  /* -1: not asked yet; 0: off; 1: on */

/* The AMX path's switch: set = 0 turns it off, 1 on (where built and granted), -1 only asks.
 * Returns whether it is on now. */
int cpu_amx_mode(int set) {
#if TIDEGATE_AMX
    if (amx_mode < 0 || set == 1) {
        const char *env = getenv("TIDEGATE_CPU_AMX");
        const int wanted = set == 1 || !(env != NULL && strcmp(env, "off") == 0);
        /* ARCH_REQ_XCOMP_PERM (0x1023), XFEATURE_XTILEDATA (18): the kernel must grant the
           tile state before the first tile instruction (a no-op once granted) */
        amx_mode = wanted && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    if (set == 0) amx_mode = 0;
    return amx_mode;
#else
    (void)set;
    return amx_mode = 0;
#endif
}

#if TIDEGATE_AMX

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tilecfg_t;

/* tiles: 0, 3 scores (16 keys x group fp32); 1, 2 K (16 keys x 32 dims bf16; with a tail, tile
          2 holds the last tail dims of head_dim % 32); 4..7 the query heads' 32-dim chunks as B
          operands (16 dim pairs x group; the tail chunk tail / 2 pairs) */
static void configure(int group, int nc, int tail) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = (t == 1 || t == 2) ? 64 : (uint16_t)(group * 4);
    }
    if (tail) {
        cfg.colsb[2] = (uint16_t)(2 * tail);
        cfg.rows[4 + nc - 1] = (uint8_t)(tail / 2);
    }
    _tile_loadconfig(&cfg);
}

static inline __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* chunk c of 16 keys' scores into tile C: K's dims 32c.. times B tile B (= 4 + c; literals: the
 * intrinsics paste tile numbers into the instruction); the A tile alternates 1 / 2 without a
 * tail, and is 2 for the tail chunk (its own width) and 1 for the others with one */
#define SCORE_CHUNK(C, c, B, k, rs, nc, tail)                                              \
    if ((c) < (nc)) {                                                                       \
        if ((tail) ? (c) == (nc) - 1 : ((c) & 1)) {                                         \
            _tile_loadd(2, (k) + 32 * (c), (rs));                                           \
            _tile_dpbf16ps(C, 2, B);                                                        \
        } else {                                                                            \
            _tile_loadd(1, (k) + 32 * (c), (rs));                                           \
            _tile_dpbf16ps(C, 1, B);                                                        \
        }                                                                                   \
    }

/* 16 keys' scores (rows of s, group floats each) against the B tiles 4.. (nc of them) */
#define SCORE_TILE(C, k, rs, nc, tail, s, group)                              \
    do {                                                                      \
        _tile_zero(C);                                                        \
        SCORE_CHUNK(C, 0, 4, k, rs, nc, tail)                                 \
        SCORE_CHUNK(C, 1, 5, k, rs, nc, tail)                                 \
        SCORE_CHUNK(C, 2, 6, k, rs, nc, tail)                                 \
        SCORE_CHUNK(C, 3, 7, k, rs, nc, tail)                                 \
        _tile_stored(C, (s), (group) * 4);                                    \
    } while (0)

/* acc[r][0..16*DV) += sum over the context's keys of p[t][r0 + r] * V[t] for rb <= 16 / DV heads
 * (the accumulators stay in registers: DV x rb <= 16 zmm) */
static inline __attribute__((always_inline)) void
weighted_sum(const int DV, const float *restrict p, int group, int r0, int rb,
             const uint16_t *restrict v_cache, const int32_t *restrict table, int block_size,
             long row, int g, int n_keys, float *restrict acc) {
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    const int head_dim = 16 * DV;
    for (int t0 = 0; t0 < n_keys; t0 += block_size) {
        const uint16_t *vb = v_cache + (long)table[t0 / block_size] * block_size * row
                             + (long)g * head_dim;
        const int n = n_keys - t0 < block_size ? n_keys - t0 : block_size;
        for (int u = 0; u < n; u++) {
            const uint16_t *vt = vb + u * row;
            const float *pt = p + (long)(t0 + u) * group + r0;
            __m512 v[8];
            for (int c = 0; c < DV; c++) v[c] = load_bf16x16(vt + 16 * c);
            for (int r = 0; r < 16 / DV; r++) {
                if (r >= rb) break;
                const __m512 w = _mm512_set1_ps(pt[r]);
                for (int c = 0; c < DV; c++) a[r * DV + c] = _mm512_fmadd_ps(w, v[c], a[r * DV + c]);
            }
        }
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < DV; c++) _mm512_storeu_ps(acc + (long)(r0 + r) * head_dim + 16 * c, a[r * DV + c]);
}

static void weighted_sums(const float *p, int group, const uint16_t *v_cache,
                          const int32_t *table, int block_size, long row, int g, int head_dim,
                          int n_keys, float *acc) {
    const int dv = head_dim / 16, per = 16 / dv;
    for (int r0 = 0; r0 < group; r0 += per) {
        const int rb = group - r0 < per ? group - r0 : per;
        switch (dv) {
        case 1: weighted_sum(1, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 2: weighted_sum(2, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 3: weighted_sum(3, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 4: weighted_sum(4, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 5: weighted_sum(5, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 6: weighted_sum(6, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        case 7: weighted_sum(7, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        default: weighted_sum(8, p, group, r0, rb, v_cache, table, block_size, row, g, n_keys, acc); break;
        }
    }
}

/* At batch 200 a layer's K/V pages (~7 MB for tiny-coder) are cold: read once a step, after the
 * other layers'. The next sequence's pages are requested into L2 while this one computes, one
 * page block (K and V, every kv head) per 32 keys of scores, the rest after its last query: a
 * burst of all of them at the sequence's start (~1,100 lines) stalls on the fill buffers.
 * B=200 decode, tiny-coder's shapes, 14 layers' pools cycled: 1.93 (none) -> 1.55-1.65 (burst,
 * two sequences ahead) -> 1.38-1.41 ms a layer (spread, next sequence); one layer in cache: 1.0. */
typedef struct {
    const int32_t *table;  /* the next sequence's block table, NULL: none */
    int ctx, t;            /* its context, and the first key not yet requested */
} prefetch_cursor;

static void prefetch_block(const uint16_t *k_cache, const uint16_t *v_cache, prefetch_cursor *c,
                           int block_size, long row) {
    if (c->table == NULL || c->t >= c->ctx) return;
    const long base = (long)c->table[c->t / block_size] * block_size * row;
    const long bytes = (long)(c->ctx - c->t < block_size ? c->ctx - c->t : block_size) * row * 2;
    const char *kp = (const char *)(k_cache + base), *vp = (const char *)(v_cache + base);
    for (long b = 0; b < bytes; b += 64) {
        _mm_prefetch(kp + b, _MM_HINT_T1);
        _mm_prefetch(vp + b, _MM_HINT_T1);
    }
    c->t += block_size;
}

/* 1: not taken (the caller runs the portable kernel); 0: done; < 0: allocation failed */
int paged_attention_bf16_amx(const uint16_t *q, long q_stride, const uint16_t *k_cache,
                             const uint16_t *v_cache, const int32_t *restrict block_tables,
                             int table_width, const int32_t *restrict query_start,
                             const int32_t *restrict context_lens, int num_seqs, int num_heads,
                             int num_kv_heads, int head_dim, int block_size, float scale,
                             uint16_t *out) {
    if (cpu_amx_mode(-1) != 1) return 1;
    if (num_kv_heads <= 0 || num_heads % num_kv_heads) return 1;
    const int group = num_heads / num_kv_heads;
    if (group > 16 || head_dim % 16 || head_dim <= 0 || head_dim > 128 || block_size % 16
        || block_size <= 0)
        return 1;
    const int nc = (head_dim + 31) / 32, tail = head_dim % 32;  /* 32-dim chunks; the last's width */
    const long row = (long)num_kv_heads * head_dim;
    const long rs = row * 2;  /* bytes from one key's row to the next within a page */
    int max_ctx = 1;
    for (int i = 0; i < num_seqs; i++) max_ctx = context_lens[i] > max_ctx ? context_lens[i] : max_ctx;
    const long n16_max = ((long)max_ctx + 31) / 32 * 32;  /* scores are made 32 keys at a time */
    const int gw = 16 * group;
    float *work = aligned_alloc(64, sizeof(float) * (size_t)((n16_max * group + 63) / 64 * 64
                                                              + 3 * 256 + (long)num_heads * head_dim));
    uint16_t *qv = aligned_alloc(64, sizeof(uint16_t) * (size_t)(16 * 4 * 32));
    if (work == NULL || qv == NULL) {
        free(work);
        free(qv);
        return -3;
    }
    float *s = work, *mrep = s + (n16_max * group + 63) / 64 * 64, *srep = mrep + 256;
    float *acc = srep + 256;
    tilecfg_t saved;
    _tile_storeconfig(&saved);
    configure(group, nc, tail);

    for (int i = 0; i < num_seqs; i++) {
        const int q0 = query_start[i], q_len = query_start[i + 1] - q0, ctx = context_lens[i];
        const int32_t *table = block_tables + (long)i * table_width;
        prefetch_cursor next = {NULL, 0, 0};
        if (i + 1 < num_seqs)
            next = (prefetch_cursor){block_tables + (long)(i + 1) * table_width, context_lens[i + 1], 0};
        for (int j = 0; j < q_len; j++) {
            const int n_keys = ctx - q_len + j + 1;  /* causal: keys 0 .. the query's position */
            const int n32 = (n_keys + 31) / 32 * 32;
            const uint16_t *qt = q + (long)(q0 + j) * q_stride;
            for (int g = 0; g < num_kv_heads; g++) {
                /* B operands: chunk c, row i holds dims 32c + 2i, 32c + 2i + 1 of every head */
                const uint16_t *qg = qt + (long)g * group * head_dim;
                for (int r = 0; r < group; r++)
                    for (int d = 0; d < head_dim; d++)
                        qv[(d / 32) * 16 * 2 * group + ((d % 32) / 2) * 2 * group + 2 * r + (d & 1)] =
                            qg[(long)r * head_dim + d];
                _tile_loadd(4, qv, group * 4);
                if (nc > 1) _tile_loadd(5, qv + 32 * group, group * 4);
                if (nc > 2) _tile_loadd(6, qv + 64 * group, group * 4);
                if (nc > 3) _tile_loadd(7, qv + 96 * group, group * 4);
                /* scores, 16 keys per tile (a 16-key run never crosses a page: block_size is a
                   multiple of 16); rows past n_keys read the page's other slots and are
                   overwritten below */
                for (int t0 = 0; t0 < n_keys; t0 += 32) {
                    const uint16_t *k0 = k_cache + ((long)table[t0 / block_size] * block_size
                                                    + t0 % block_size) * row + (long)g * head_dim;
                    prefetch_block(k_cache, v_cache, &next, block_size, row);
                    SCORE_TILE(0, k0, rs, nc, tail, s + (long)t0 * group, group);
                    if (t0 + 16 < n_keys) {
                        const int t1 = t0 + 16;
                        const uint16_t *k1 = k_cache + ((long)table[t1 / block_size] * block_size
                                                        + t1 % block_size) * row + (long)g * head_dim;
                        SCORE_TILE(3, k1, rs, nc, tail, s + (long)t1 * group, group);
                    }
                }
                for (long x = (long)n_keys * group; x < (long)n32 * group; x++) s[x] = -1e30f;
                /* exact softmax per head over the columns of s ([n32][group]), 16 rows at a
                   time so the loops run over 16 * group contiguous floats */
                for (int x = 0; x < gw; x++) mrep[x] = -1e30f;
                for (int t0 = 0; t0 < n32; t0 += 16) {
                    const float *sb = s + (long)t0 * group;
                    for (int x = 0; x < gw; x++) mrep[x] = sb[x] > mrep[x] ? sb[x] : mrep[x];
                }
                float m[16], l[16];
                for (int r = 0; r < group; r++) {
                    m[r] = -1e30f;
                    for (int k = 0; k < 16; k++) m[r] = mrep[k * group + r] > m[r] ? mrep[k * group + r] : m[r];
                }
                for (int x = 0; x < gw; x++) {
                    mrep[x] = m[x % group];
                    srep[x] = 0.f;
                }
                for (int t0 = 0; t0 < n32; t0 += 16) {
                    float *sb = s + (long)t0 * group;
                    for (int x = 0; x < gw; x++) {
                        const float e = exp_approx((sb[x] - mrep[x]) * scale);
                        sb[x] = e;
                        srep[x] += e;  /* padding rows add exp(-87) ~ 1e-38 each: nothing */
                    }
                }
                for (int r = 0; r < group; r++) {
                    l[r] = 0.f;
                    for (int k = 0; k < 16; k++) l[r] += srep[k * group + r];
                }
                float *ag = acc + (long)g * group * head_dim;
                weighted_sums(s, group, v_cache, table, block_size, row, g, head_dim, n_keys, ag);
                for (int r = 0; r < group; r++) {
                    const float inv = 1.f / l[r];
                    float *ar = ag + (long)r * head_dim;
                    for (int d = 0; d < head_dim; d++) ar[d] *= inv;
                }
            }
            while (next.table != NULL && next.t < next.ctx)
                prefetch_block(k_cache, v_cache, &next, block_size, row);
            f32_row_to_bf16(acc, out + (long)(q0 + j) * num_heads * head_dim, num_heads * head_dim);
        }
    }
    if (saved.palette)
        _tile_loadconfig(&saved);
    else
        _tile_release();
    free(work);
    free(qv);
    return 0;
}

#else

int paged_attention_bf16_amx(const uint16_t *q, long q_stride, const uint16_t *k_cache,
                             const uint16_t *v_cache, const int32_t *block_tables,
                             int table_width, const int32_t *query_start,
                             const int32_t *context_lens, int num_seqs, int num_heads,
                             int num_kv_heads, int head_dim, int block_size, float scale,
                             uint16_t *out) {
    (void)q, (void)q_stride, (void)k_cache, (void)v_cache, (void)block_tables, (void)table_width;
    (void)query_start, (void)context_lens, (void)num_seqs, (void)num_heads, (void)num_kv_heads;
    (void)head_dim, (void)block_size, (void)scale, (void)out;
    return 1;
}

#endif
