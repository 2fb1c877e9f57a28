/* Shared by the CPU kernels: exp that vectorizes, and bf16 <-> fp32.
 *
 * bf16 is the high half of an fp32. Loads widen exactly;
 * stores round to nearest even (no NaN handling: the kernels are built -ffinite-math-only). The
 * kernels compute in fp32 and round once per stored value. Plain C, so -march=native vectorizes
 * the row loops (AVX-512 here: shifts and adds, 16 values per instruction). */
#ifndef TIDEGATE_CPU_COMMON_H
#define TIDEGATE_CPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) in fp32 without a libm call, so the loops around it vectorize (libm's expf kept SiLU
 * and the softmax scalar: 3 ns a value, 50 ms of a 2,048-token prefill step of tiny-coder).
 * Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, 2^n by the
 * exponent bits; within 2 ulp of expf over [-87, 88] (clamped outside: 0 below, no inf above). */
static inline float exp_approx(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline void bf16_row_to_f32(const uint16_t *restrict x, float *restrict out, int n) {
    for (int i = 0; i < n; i++) out[i] = bf16_to_f32(x[i]);
}

static inline void f32_row_to_bf16(const float *restrict x, uint16_t *restrict out, int n) {
    for (int i = 0; i < n; i++) out[i] = f32_to_bf16(x[i]);
}
#endif
