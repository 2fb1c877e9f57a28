/* Repetition / presence / frequency penalties on fp32 logits, in place, touching only the
 * tokens a row has seen (its prompt and output ids) instead of [rows, vocab] passes: at 200
 * rows of an 8,192-token vocabulary with 160-token histories the torch version (counts
 * scattered into [B, V + 1], ~10 full passes) took 29 ms a step; this takes a fraction of one.
 *
 * Row r's histories are ids[offsets[r] .. offsets[r + 1]) of the flat prompt / output arrays;
 * ids outside [0, vocab) are ignored. For every token v seen in the prompt or the output, as
 * vLLM and the OpenAI API define the penalties (backend/runner/sampler.py apply_penalties):
 *   l = l > 0 ? l / rep : l * rep;   l -= freq * count_in_output(v);   l -= pres if count > 0
 * Returns 0, or -1 when the scratch memory could not be had.
 */
#include <stdint.h>
#include <stdlib.h>

static void penalize(float *restrict row, int64_t v, const int32_t *restrict count,
                     float rep, float pres, float freq) {
    float l = row[v];
    l = l > 0.f ? l / rep : l * rep;
    const int32_t c = count[v];
    l = l - freq * (float)c;
    row[v] = l - pres * (c > 0 ? 1.f : 0.f);
}

int apply_penalties_f32(float *logits, int rows, int vocab, long row_stride,
                        const int64_t *prompt_ids, const int64_t *prompt_offsets,
                        const int64_t *output_ids, const int64_t *output_offsets,
                        const float *rep, const float *pres, const float *freq) {
    int32_t *count = calloc((size_t)vocab, sizeof(int32_t));
    uint8_t *done = calloc((size_t)vocab, 1);
    if (count == NULL || done == NULL) {
        free(count);
        free(done);
        return -1;
    }
    for (int r = 0; r < rows; r++) {
        float *row = logits + (long)r * row_stride;
        const int64_t o0 = output_offsets[r], o1 = output_offsets[r + 1];
        const int64_t p0 = prompt_offsets[r], p1 = prompt_offsets[r + 1];
        for (int64_t i = o0; i < o1; i++)
            if (output_ids[i] >= 0 && output_ids[i] < vocab) count[output_ids[i]]++;
        for (int64_t i = o0; i < o1; i++) {
            const int64_t v = output_ids[i];
            if (v >= 0 && v < vocab && !done[v]) {
                done[v] = 1;
                penalize(row, v, count, rep[r], pres[r], freq[r]);
            }
        }
        for (int64_t i = p0; i < p1; i++) {
            const int64_t v = prompt_ids[i];
            if (v >= 0 && v < vocab && !done[v]) {
                done[v] = 1;
                penalize(row, v, count, rep[r], pres[r], freq[r]);
            }
        }
        for (int64_t i = o0; i < o1; i++)  /* scratch back to zero for the next row */
            if (output_ids[i] >= 0 && output_ids[i] < vocab) {
                count[output_ids[i]] = 0;
                done[output_ids[i]] = 0;
            }
        for (int64_t i = p0; i < p1; i++)
            if (prompt_ids[i] >= 0 && prompt_ids[i] < vocab) done[prompt_ids[i]] = 0;
    }
    free(count);
    free(done);
    return 0;
}
