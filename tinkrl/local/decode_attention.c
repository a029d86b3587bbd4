/* Decode attention: one new query per row over a KV cache (see decode_attention.py).
 *
 * One task per (row, KV head): the scores of that head's G query heads over every unmasked cached
 * position (each key read once for all G), a softmax per query head, then the weighted sum of the
 * values (each value read once for all G). Positions whose additive mask is -inf (padding, or not
 * yet written) are skipped, keys and values alike. Tasks are spread over OpenMP threads.
 *
 * fp32 throughout; head_dim a multiple of 16. Vectors are GCC/Clang vector extensions, so the
 * compiler emits whatever SIMD the machine has (-march=native).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define W 16
typedef float vf __attribute__((vector_size(64), aligned(4)));
typedef float vf8 __attribute__((vector_size(32), aligned(4)));
typedef float vf4 __attribute__((vector_size(16), aligned(4)));

static inline float hsum(vf a) {
    vf8 lo, hi;
    memcpy(&lo, &a, sizeof lo);
    memcpy(&hi, (const char *)&a + sizeof lo, sizeof hi);
    vf8 s8 = lo + hi;
    vf4 l4, h4;
    memcpy(&l4, &s8, sizeof l4);
    memcpy(&h4, (const char *)&s8 + sizeof l4, sizeof h4);
    vf4 s4 = l4 + h4;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* e^x for x <= 0 (a score minus its row's max): Cephes' expf polynomial, within 2 ulp; written
 * without calls so the compiler vectorises the loop it is in. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)n << 23;
    return u.f;
}

#define MASKED(m) ((m) < -1.0e30f)

/* q: [B, H, D] contiguous; k, v: [cache rows, Hkv, >=T, D] with row stride kv_sb and head stride
 * kv_sh (elements; positions D apart); rows: the cache row of each of the B rows (NULL: row b is
 * cache row b); mask: additive [B, T] with row stride mask_sb (0: one row for all); out: [B, H, D]
 * contiguous. Returns 0, or -1 when a thread's scratch could not be allocated. */
int decode_attention(const float *q, const float *k, const float *v, const int64_t *rows, const float *mask,
                     float *out, int B, int H, int Hkv, int D, int T, int64_t kv_sb, int64_t kv_sh, int64_t mask_sb,
                     float scale, int threads) {
    const int G = H / Hkv, C = D / W;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *s = malloc(sizeof(float) * ((size_t)G * T + 2 * (size_t)G));
        vf *acc = aligned_alloc(64, sizeof(vf) * (size_t)G * C);
        failed = s == NULL || acc == NULL;
        #pragma omp for schedule(static)
        for (int64_t task = 0; task < (int64_t)B * Hkv; task++) {
            if (failed) continue;
            const int64_t b = task / Hkv, h = task % Hkv;
            const int64_t at = (rows ? rows[b] : b) * kv_sb + h * kv_sh;
            const float *kb = k + at, *vb = v + at;
            const float *m = mask + b * mask_sb, *qb = q + (b * H + h * G) * D;
            float *mx = s + (size_t)G * T, *inv = mx + G;
            for (int g = 0; g < G; g++) mx[g] = -3.0e38f;
            for (int t = 0; t < T; t++) {
                if (MASKED(m[t])) continue;
                const vf *kt = (const vf *)(kb + (int64_t)t * D);
                for (int g = 0; g < G; g++) {
                    const vf *qg = (const vf *)(qb + g * D);
                    vf a = qg[0] * kt[0];
                    for (int c = 1; c < C; c++) a += qg[c] * kt[c];
                    const float sc = hsum(a) * scale + m[t];
                    s[g * T + t] = sc;
                    mx[g] = sc > mx[g] ? sc : mx[g];
                }
            }
            for (int g = 0; g < G; g++) {
                float *sg = s + g * T, total = 0.0f;
                const float top = mx[g];
                #pragma omp simd reduction(+ : total)
                for (int t = 0; t < T; t++) {
                    const float e = MASKED(m[t]) ? 0.0f : exp_nonpositive(sg[t] - top);
                    sg[t] = e;
                    total += e;
                }
                inv[g] = 1.0f / total;
            }
            for (int i = 0; i < G * C; i++) acc[i] = (vf){0};
            for (int t = 0; t < T; t++) {
                if (MASKED(m[t])) continue;
                const vf *vt = (const vf *)(vb + (int64_t)t * D);
                for (int g = 0; g < G; g++) {
                    const float p = s[g * T + t];
                    for (int c = 0; c < C; c++) acc[g * C + c] += p * vt[c];
                }
            }
            for (int g = 0; g < G; g++) {
                vf *o = (vf *)(out + (b * H + h * G + g) * D);
                for (int c = 0; c < C; c++) o[c] = acc[g * C + c] * inv[g];
            }
        }
        free(s);
        free(acc);
    }
    return failed ? -1 : 0;
}
