/* The model's elementwise ops on the CPU, fp32 and bf16 (computed in fp32, rounded once per
 * stored value), one pass over memory each (backend/kernels/reference/ops.py has
 * the torch reference and the shapes). Torch runs each of these as 4-10 separate ops, every one
 * a full pass over a [tokens, hidden] tensor plus a dispatch; on a small model at small batch
 * that dispatch, not the arithmetic, is the cost.
 *
 * Rows may be strided (q and k are column slices of the fused qkv projection's output).
 */
#include <math.h>
#include <stdint.h>

#include "common.h"

#define MAX_ROW 16384  /* bf16 kernels: widest row (hidden, heads x head_dim, intermediate) */

static void norm_row(const float *restrict x, const float *restrict w, int h, float eps,
                     float *restrict out) {
    float ss = 0.f;
    for (int i = 0; i < h; i++) ss += x[i] * x[i];
    const float inv = 1.f / sqrtf(ss / (float)h + eps);
    for (int i = 0; i < h; i++) out[i] = w[i] * (x[i] * inv);
}

/* out[t] = w * x[t] / sqrt(mean(x[t]^2) + eps) */
void rms_norm_f32(const float *restrict x, long x_stride, const float *restrict w, int tokens,
                  int h, float eps, float *restrict out) {
    for (int t = 0; t < tokens; t++) norm_row(x + t * x_stride, w, h, eps, out + (long)t * h);
}

/* new_residual = x + residual; out = rms_norm(new_residual) */
void add_rms_norm_f32(const float *restrict x, const float *restrict residual,
                      const float *restrict w, int tokens, int h, float eps,
                      float *restrict out, float *restrict new_residual) {
    for (int t = 0; t < tokens; t++) {
        const long o = (long)t * h;
        for (int i = 0; i < h; i++) new_residual[o + i] = x[o + i] + residual[o + i];
        norm_row(new_residual + o, w, h, eps, out + o);
    }
}

/* Loads and stores of either dtype: `bf16` is a constant at every call site below, so each
 * always-inline body compiles to its own fp32 and bf16 loop (one source for the two). */
static inline __attribute__((always_inline)) float load_at(const void *p, long i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void store_at(void *p, long i, float v, int bf16) {
    if (bf16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* Rotate-half rotary in place. cos_sin[p] = [cos(p f_0..f_{D/2-1}) | sin(...)]:
 *   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin   (x1, x2 = the halves of a head) */
static inline __attribute__((always_inline)) void
rotate_heads(void *restrict x, int heads, const float *restrict cs, int d, int bf16) {
    const int half = d / 2;
    for (int hh = 0; hh < heads; hh++) {
        const long x1 = (long)hh * d, x2 = x1 + half;
        for (int i = 0; i < half; i++) {
            const float c = cs[i], s = cs[half + i];
            const float a = load_at(x, x1 + i, bf16), b = load_at(x, x2 + i, bf16);
            store_at(x, x1 + i, a * c - b * s, bf16);
            store_at(x, x2 + i, b * c + a * s, bf16);
        }
    }
}

static inline __attribute__((always_inline)) void
rotary(char *q, long q_stride, int q_heads, char *k, long k_stride, int k_heads,
       const int64_t *restrict positions, const float *restrict cos_sin, int d, int tokens,
       int bf16) {
    const long elem = bf16 ? 2 : 4;
    for (int t = 0; t < tokens; t++) {
        const float *cs = cos_sin + positions[t] * d;
        rotate_heads(q + t * q_stride * elem, q_heads, cs, d, bf16);
        rotate_heads(k + t * k_stride * elem, k_heads, cs, d, bf16);
    }
}

void rotary_f32(float *q, long q_stride, int q_heads, float *k, long k_stride, int k_heads,
                const int64_t *restrict positions, const float *restrict cos_sin, int d,
                int tokens) {
    rotary((char *)q, q_stride, q_heads, (char *)k, k_stride, k_heads, positions, cos_sin, d,
           tokens, 0);
}

void rotary_bf16(uint16_t *q, long q_stride, int q_heads, uint16_t *k, long k_stride, int k_heads,
                 const int64_t *restrict positions, const float *restrict cos_sin, int d,
                 int tokens) {
    rotary((char *)q, q_stride, q_heads, (char *)k, k_stride, k_heads, positions, cos_sin, d,
           tokens, 1);
}

/* out[t] = silu(x[t, :i]) * x[t, i:] */
static inline __attribute__((always_inline)) void
silu_and_mul(const void *restrict x, int tokens, int i_size, void *restrict out, int bf16) {
    for (int t = 0; t < tokens; t++) {
        const long g = (long)t * 2 * i_size, u = g + i_size, o = (long)t * i_size;
        for (int i = 0; i < i_size; i++) {
            const float gf = load_at(x, g + i, bf16);
            store_at(out, o + i, gf / (1.f + exp_approx(-gf)) * load_at(x, u + i, bf16), bf16);
        }
    }
}

void silu_and_mul_f32(const float *restrict x, int tokens, int i_size, float *restrict out) {
    silu_and_mul(x, tokens, i_size, out, 0);
}

void silu_and_mul_bf16(const uint16_t *restrict x, int tokens, int i_size, uint16_t *restrict out) {
    silu_and_mul(x, tokens, i_size, out, 1);
}

/* ---- norms in bf16: each row widened to fp32 on the stack, the fp32 code above, rounded once */

int rms_norm_bf16(const uint16_t *restrict x, long x_stride, const uint16_t *restrict w,
                  int tokens, int h, float eps, uint16_t *restrict out) {
    if (h > MAX_ROW) return -1;
    float xf[MAX_ROW], wf[MAX_ROW], of[MAX_ROW];
    bf16_row_to_f32(w, wf, h);
    for (int t = 0; t < tokens; t++) {
        bf16_row_to_f32(x + t * x_stride, xf, h);
        norm_row(xf, wf, h, eps, of);
        f32_row_to_bf16(of, out + (long)t * h, h);
    }
    return 0;
}

/* new_residual = bf16(x + residual); out = rms_norm(new_residual), as the bf16 model rounds it */
int add_rms_norm_bf16(const uint16_t *restrict x, const uint16_t *restrict residual,
                      const uint16_t *restrict w, int tokens, int h, float eps,
                      uint16_t *restrict out, uint16_t *restrict new_residual) {
    if (h > MAX_ROW) return -1;
    float rf[MAX_ROW], wf[MAX_ROW], of[MAX_ROW];
    bf16_row_to_f32(w, wf, h);
    for (int t = 0; t < tokens; t++) {
        const long o = (long)t * h;
        for (int i = 0; i < h; i++) {
            new_residual[o + i] = f32_to_bf16(bf16_to_f32(x[o + i]) + bf16_to_f32(residual[o + i]));
            rf[i] = bf16_to_f32(new_residual[o + i]);
        }
        norm_row(rf, wf, h, eps, of);
        f32_row_to_bf16(of, out + o, h);
    }
    return 0;
}
