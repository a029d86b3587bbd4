/* The sampler's CPU kernels (see paths.py): a decode step's attention, one new query per row over a
 * KV cache, the rest of its work between the matrix products (RoPE, the cache write, RMSNorm,
 * SiLU), and on CPUs with AVX512-BF16 the bf16 sampler's products, its head and a decoder layer in
 * one call.
 *
 * Attention runs one task per (row, KV head): the scores of that head's G query heads over every
 * cached position (each key read once for all G), a softmax per query head, then the weighted sum
 * of the values (each value read once for all G), in blocks of 16 positions. Positions whose
 * additive mask is -inf (padding, or not yet written) take no part: their scores are dropped and
 * their values never read. Tasks are spread over OpenMP threads.
 *
 * fp32 arithmetic throughout; the cache holds fp32 or bf16 keys and values, and the elementwise
 * kernels also read and write bf16, rounding to nearest even as torch does. head_dim a multiple
 * of 16. Vectors are GCC (12 or later) / Clang vector extensions, so the compiler emits whatever
 * SIMD the machine has (-march=native).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define W 16
typedef float vf __attribute__((vector_size(64), aligned(4)));

typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
#define NEG (-3.0e38f)

/* Lane by lane: a where mask (a comparison's result) is set, else b. */
static inline vf pick(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)

/* The sums of 16 vectors' lanes, one per lane of the result (lane j: the sum of a[j]): halving
 * steps that add each vector's two halves while packing two vectors into one, 15 additions and 30
 * shuffles for 16 sums where a horizontal sum per vector takes 4 additions and 4 shuffles each. */
static inline vf hsums(const vf a[W]) {
    vf b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUF(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        c[i] = SHUF(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               SHUF(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        d[i] = SHUF(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               SHUF(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return SHUF(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SHUF(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
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

typedef uint16_t vh __attribute__((vector_size(32), aligned(2)));
typedef uint32_t vu __attribute__((vector_size(64)));

/* `nv` vectors of a cache from element i: in place for fp32, else widened into buf (exactly: a bf16
 * is the high half of an fp32). */
static inline const vf *block(const void *p, int64_t i, int nv, const int bf16, vf *buf) {
    if (!bf16) return (const vf *)((const float *)p + i);
    const vh *h = (const vh *)((const uint16_t *)p + i);
    for (int k = 0; k < nv; k++) buf[k] = (vf)(__builtin_convertvector(h[k], vu) << 16);
    return buf;
}

/* On Intel Xeons with AMX, asks the memory for the block `AHEAD` blocks after position t0 (of T, D
 * elements each), which reads a cache faster there; on an AMD EPYC prefetching was slower on fp32
 * caches, so elsewhere it asks for nothing (measured on both; see this file's git history). */
#define AHEAD 2
static inline void ahead(const void *p, int t0, int T, int D, const int bf16) {
#if defined(__AMX_TILE__)
    const int t = t0 + AHEAD * W;
    if (t >= T) return;
    const int n = T - t < W ? T - t : W, es = bf16 ? 2 : 4;
    const char *from = (const char *)p + (int64_t)t * D * es;
    for (int l = 0; l < n * D * es; l += 64) __builtin_prefetch(from + l);
#else
    (void)p, (void)t0, (void)T, (void)D, (void)bf16;
#endif
}

/* One (row, KV head) task: the scores of its G query heads (qb: G x D) over the unmasked positions
 * of keys kb / values vb (T positions, D apart), a softmax per head, the weighted values into
 * og (G x D); keys and values in fp32 or (kv_bf16) bf16. s: scratch of G * (T + W) + 2 * G floats;
 * acc: G * D / W vectors. Positions go in blocks of W: each block's keys and values are read from
 * memory once and from the L1 cache by every query head, whose partial sums stay in registers.
 * Inlined into `attend` with C = D / W and kv_bf16 constants, so the loops over a head's vectors
 * unroll. */
static inline __attribute__((always_inline)) void attend_(const float *qb, const void *kb, const void *vb,
                                                          const int kv_bf16, const float *m, int G, const int C,
                                                          int T, float scale, float *s, vf *acc, float *og) {
    const int D = C * W, Tp = (T + W - 1) / W * W;
    float *inv = s + (size_t)G * Tp;
    vf buf[W * C];  /* a block of bf16 keys or values, widened once for all G heads */
    vf top[G];
    for (int g = 0; g < G; g++) top[g] = (vf){0} + NEG;
    for (int t0 = 0; t0 < T; t0 += W) {
        const int n = T - t0 < W ? T - t0 : W;
        vf mv = (vf){0} + NEG;  /* lanes past T count as masked */
        if (n == W)
            mv = *(const vf *)(m + t0);
        else
            for (int j = 0; j < n; j++) mv[j] = m[t0 + j];
        const vi masked = mv < -1.0e30f;
        ahead(kb, t0, T, D, kv_bf16);
        const vf *kt = block(kb, (int64_t)t0 * D, n * C, kv_bf16, buf);
        for (int g = 0; g < G; g++) {
            const vf *qg = (const vf *)(qb + g * D);
            vf a[W];
            for (int j = 0; j < n; j++) {
                a[j] = qg[0] * kt[j * C];
                for (int c = 1; c < C; c++) a[j] += qg[c] * kt[j * C + c];
            }
            for (int j = n; j < W; j++) a[j] = (vf){0};
            /* masked positions are left out of the max and of the softmax below */
            const vf sc = pick(masked, (vf){0} + NEG, hsums(a) * scale + mv);
            *(vf *)(s + g * Tp + t0) = sc;
            top[g] = pick(sc > top[g], sc, top[g]);
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = s + g * Tp, total = 0.0f, hi = top[g][0];
        for (int j = 1; j < W; j++) hi = top[g][j] > hi ? top[g][j] : hi;
        #pragma omp simd reduction(+ : total)
        for (int t = 0; t < T; t++) {
            const float e = MASKED(m[t]) ? 0.0f : exp_nonpositive(sg[t] - hi);
            sg[t] = e;
            total += e;
        }
        inv[g] = 1.0f / total;
    }
    for (int i = 0; i < G * C; i++) acc[i] = (vf){0};
    for (int t0 = 0; t0 < T; t0 += W) {
        const int n = T - t0 < W ? T - t0 : W;
        int any_masked = 0;
        for (int j = 0; j < n; j++) any_masked |= MASKED(m[t0 + j]);
        ahead(vb, t0, T, D, kv_bf16);
        const vf *vt = block(vb, (int64_t)t0 * D, n * C, kv_bf16, buf);
        for (int g = 0; g < G; g++) {
            vf r[C];
            for (int c = 0; c < C; c++) r[c] = acc[g * C + c];
            const float *pg = s + g * Tp + t0;
            for (int j = 0; j < n; j++) {
                if (any_masked && MASKED(m[t0 + j])) continue;
                for (int c = 0; c < C; c++) r[c] += pg[j] * vt[j * C + c];
            }
            for (int c = 0; c < C; c++) acc[g * C + c] = r[c];
        }
    }
    for (int g = 0; g < G; g++) {
        vf *o = (vf *)(og + g * D);
        for (int c = 0; c < C; c++) o[c] = acc[g * C + c] * inv[g];
    }
}

static void attend(const float *qb, const void *kb, const void *vb, int kv_bf16, const float *m, int G, int D,
                   int T, float scale, float *s, vf *acc, float *og) {
    switch ((D / W) * 2 + !!kv_bf16) {  /* head_dim 64 and 128, the common ones, unrolled */
    case 8: attend_(qb, kb, vb, 0, m, G, 4, T, scale, s, acc, og); break;
    case 9: attend_(qb, kb, vb, 1, m, G, 4, T, scale, s, acc, og); break;
    case 16: attend_(qb, kb, vb, 0, m, G, 8, T, scale, s, acc, og); break;
    case 17: attend_(qb, kb, vb, 1, m, G, 8, T, scale, s, acc, og); break;
    default:
        if (kv_bf16)
            attend_(qb, kb, vb, 1, m, G, D / W, T, scale, s, acc, og);
        else
            attend_(qb, kb, vb, 0, m, G, D / W, T, scale, s, acc, og);
    }
}

/* --- the rest of a decode step's elementwise work, on fp32 or bf16 tensors --------------------- */

static inline float load(const void *p, int64_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    union { uint32_t u; float f; } x = {(uint32_t)((const uint16_t *)p)[i] << 16};
    return x.f;
}

/* fp32 to bf16, rounding to nearest even (as torch does). */
static inline void store(void *p, int64_t i, float f, int bf16) {
    if (!bf16) {
        ((float *)p)[i] = f;
        return;
    }
    union { float f; uint32_t u; } x = {f};
    uint16_t h = (x.u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((x.u >> 16) | 0x40u)
                                                   : (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
    ((uint16_t *)p)[i] = h;
}

/* Rotates one head (D values, two halves) by RoPE: x * cos + rotate_half(x) * sin. */
static inline void rope(const void *x, int bf16, const float *cs, const float *sn, int D, float *y) {
    const int half = D / 2;
    for (int i = 0; i < half; i++) y[i] = load(x, i, bf16) * cs[i] + -load(x, i + half, bf16) * sn[i];
    for (int i = half; i < D; i++) y[i] = load(x, i, bf16) * cs[i] + load(x, i - half, bf16) * sn[i];
}

/* A decode step's attention from the projections' output: RoPE on q and k (q, k, v: fp32 or bf16,
 * heads D apart, rows q_stride and kv_stride elements apart), the new key and value written to the
 * layer's cache at position `pos` (k_cache, v_cache as in decode_attention, through `rows`; a bf16
 * cache gets them rounded to nearest even), then attention over positions 0..pos under `mask`
 * ([B, pos + 1], row stride mask_sb). cos, sin: [B, D]. out: [B, H, D], fp32 or bf16. Returns 0,
 * or -1 when a thread's scratch could not be allocated. */
int rope_decode_attention(const void *q, const void *k, const void *v, int in_bf16, int64_t q_stride,
                          int64_t kv_stride, const float *cos, const float *sin, void *k_cache, void *v_cache,
                          int kv_bf16, int64_t kv_sb, int64_t kv_sh,
                          const int64_t *rows, int pos, const float *mask, int64_t mask_sb, void *out, int out_bf16,
                          int B, int H, int Hkv, int D, float scale, int threads) {
    const int G = H / Hkv, C = D / W, T = pos + 1;
    const int64_t kv_es = kv_bf16 ? 2 : 4;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *s = malloc(sizeof(float) * ((size_t)G * (T + W) + 2 * (size_t)G));
        vf *acc = aligned_alloc(64, sizeof(vf) * (size_t)G * C);
        float *qr = aligned_alloc(64, sizeof(float) * ((size_t)G * D * 2 + D)), *og = qr + (size_t)G * D;
        float *kr = og + (size_t)G * D;
        failed = s == NULL || acc == NULL || qr == NULL;
        #pragma omp for schedule(static)
        for (int64_t task = 0; task < (int64_t)B * Hkv; task++) {
            if (failed) continue;
            const int64_t b = task / Hkv, h = task % Hkv;
            const int64_t at = (rows ? rows[b] : b) * kv_sb + h * kv_sh, here = at + (int64_t)pos * D;
            const float *cs = cos + b * D, *sn = sin + b * D;
            const int64_t qi = b * q_stride, kvi = b * kv_stride + h * D, es = in_bf16 ? 2 : 4;
            rope((const char *)k + kvi * es, in_bf16, cs, sn, D, kr);
            for (int i = 0; i < D; i++) {
                store(k_cache, here + i, kr[i], kv_bf16);
                store(v_cache, here + i, load(v, kvi + i, in_bf16), kv_bf16);
            }
            for (int g = 0; g < G; g++)
                rope((const char *)q + (qi + (h * G + g) * D) * es, in_bf16, cs, sn, D, qr + g * D);
            attend(qr, (char *)k_cache + at * kv_es, (char *)v_cache + at * kv_es, kv_bf16, mask + b * mask_sb, G, D,
                   T, scale, s, acc, og);
            for (int i = 0; i < G * D; i++) store(out, (b * H + h * G) * D + i, og[i], out_bf16);
        }
        free(s);
        free(acc);
        free(qr);
    }
    return failed ? -1 : 0;
}

/* RMSNorm of a residual stream x ([rows, dim] fp32): with `add` (rows `add_stride` apart, fp32 or
 * bf16), x += add first, in place. out = w * (x * rsqrt(mean(x^2) + eps)), [rows, dim], fp32 or bf16. */
void rms_norm(float *x, const void *add, int add_bf16, int64_t add_stride, const float *w, float eps, void *out,
              int out_bf16, int rows, int dim, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        float *xr = x + (int64_t)r * dim;
        if (add)
            for (int i = 0; i < dim; i++) xr[i] += load(add, (int64_t)r * add_stride + i, add_bf16);
        float ss = 0.0f;
        #pragma omp simd reduction(+ : ss)
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / __builtin_sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) store(out, (int64_t)r * dim + i, w[i] * (xr[i] * inv), out_bf16);
    }
}

/* SwiGLU's activation: out = silu(gate) * up, [rows, f] (gate and up rows `stride` apart, fp32 or
 * bf16; out contiguous, fp32 or bf16). */
void silu_mul(const void *gate, const void *up, int in_bf16, int64_t stride, void *out, int out_bf16, int rows,
              int f, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        const int64_t in = (int64_t)r * stride;
        #pragma omp simd
        for (int i = 0; i < f; i++) {
            const float g = load(gate, in + i, in_bf16), e = exp_nonpositive(g < 0.0f ? g : -g);
            const float sig = g < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
            store(out, (int64_t)r * f + i, g * sig * load(up, in + i, in_bf16), out_bf16);
        }
    }
}

/* How a bf16 product multiplies (`head_bf16`, `linear_bf16`, `decode_layer_bf16`): the CPU's bf16 dot-product
 * instruction (AVX512-BF16), AMX tiles, or fp32 FMAs of the bf16 values (`fma_tile`: the same sums). */
enum { KERNEL_DOTS = 0, KERNEL_AMX = 1, KERNEL_FMA = 2 };

/* The bf16 sampler's unembedding: out[m][n] = sum_k x[m][k] w[n][k] with x and w rounded to bf16 and
 * the products summed in fp32 (the CPU's bf16 dot-product instruction, or AMX tiles below), the logits
 * written in fp32. `w` is packed by `pack_head`: [N / 16][K2][16 columns][2 consecutive k] bf16, K2
 * the width padded to a multiple of 32, halved, N a multiple of 32, zeros where padded. Tiles of up
 * to 8 rows x 32 columns keep 16 sums in registers; each thread takes whole 32-column strips, whose
 * weights it reads from memory once and from its cache for every further tile of rows. Built only
 * for CPUs with AVX512-BF16. */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

static inline __attribute__((always_inline)) void head_tile(const uint32_t *xb, int64_t K2, const uint32_t *w0,
                                                            float *out, int64_t ldo, const int R) {
    __m512 acc[8][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint32_t *w1 = w0 + 16 * K2;
    for (int64_t k = 0; k < K2; k++) {
        const __m512bh a = (__m512bh)_mm512_loadu_si512(w0 + 16 * k), b = (__m512bh)_mm512_loadu_si512(w1 + 16 * k);
        for (int r = 0; r < R; r++) {
            const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)xb[r * K2 + k]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, a);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, b);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

/* `head_tile`'s sums in fp32 FMAs: x as floats, each pair of k odd first (`xf`, 2 K2 a row: x[2k + 1]
 * then x[2k]), the weight's bf16 pairs widened (exactly) in registers. A product of two bf16 values is
 * exact in fp32, so each FMA rounds once, as the dot-product instruction rounds each of its two adds:
 * the same sums, in the same order. Some CPUs run two FMAs faster than one bf16 dot product
 * (`KERNEL_FMA`). */
static inline __attribute__((always_inline)) void fma_tile(const float *xf, int64_t K2, const uint32_t *w0,
                                                           float *out, int64_t ldo, const int R) {
    __m512 acc[8][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint32_t *w1 = w0 + 16 * K2;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t k = 0; k < K2; k++) {
        const __m512i a = _mm512_loadu_si512(w0 + 16 * k), b = _mm512_loadu_si512(w1 + 16 * k);
        const __m512 a_odd = _mm512_castsi512_ps(_mm512_and_si512(a, high));
        const __m512 b_odd = _mm512_castsi512_ps(_mm512_and_si512(b, high));
        const __m512 a_even = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
        const __m512 b_even = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
        for (int r = 0; r < R; r++) {
            const __m512 odd = _mm512_set1_ps(xf[r * 2 * K2 + 2 * k]), even = _mm512_set1_ps(xf[r * 2 * K2 + 2 * k + 1]);
            acc[r][0] = _mm512_fmadd_ps(odd, a_odd, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(odd, b_odd, acc[r][1]);
            acc[r][0] = _mm512_fmadd_ps(even, a_even, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(even, b_even, acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out + r * ldo, acc[r][0]);
        _mm512_storeu_ps(out + r * ldo + 16, acc[r][1]);
    }
}

static inline uint32_t to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    return (v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16;
}

/* A block's fp32 sums (`sums`: 32 rows of 32, `rows` of them real) plus the bias, rounded to bf16 as
 * torch rounds (to nearest even; NaN to 0x7fc0), into `out` from column `c`: n columns a row, of
 * which this block writes those below n. */
static void store_bf16(const float *sums, int rows, const float *bias, uint16_t *out, int64_t c, int64_t n) {
    for (int h = 0; h < 2; h++) {
        const int64_t col = c + 16 * h;
        if (col >= n) break;
        const __mmask16 keep = n - col >= 16 ? 0xffff : (__mmask16)((1u << (n - col)) - 1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + col) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            const __m512 v = _mm512_add_ps(_mm512_loadu_ps(sums + 32 * r + 16 * h), b);
            const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
            __m512i even = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
            even = _mm512_srli_epi32(_mm512_add_epi32(even, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
            even = _mm512_mask_mov_epi32(even, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
            _mm256_mask_storeu_epi16(out + r * n + col, keep, _mm512_cvtepi32_epi16(even));
        }
    }
}

/* `head_tile`'s sums (or with `xf`, x widened by `widen_pairs`, `fma_tile`'s) of up to 8 rows (`R`)
 * against the weight's 32-column strip `wj`: into `out`
 * (rows `ldo` apart), or with `out16` set, plus `bias` (or none) rounded to bf16 into `out16`'s
 * columns from c (`store_bf16`). */
static inline __attribute__((always_inline)) void dots_tile(const uint32_t *xm, const float *xf, int64_t K2,
                                                            const uint32_t *wj, float *out, int64_t ldo,
                                                            const float *bias, uint16_t *out16, int64_t c, int64_t n,
                                                            const int R) {
    float sums[8 * 32] __attribute__((aligned(64)));
    if (xf)
        fma_tile(xf, K2, wj, out16 ? sums : out, out16 ? 32 : ldo, R);
    else
        head_tile(xm, K2, wj, out16 ? sums : out, out16 ? 32 : ldo, R);
    if (out16) store_bf16(sums, R, bias, out16, c, n);
}

/* x's rows as `fma_tile` reads them (floats, each pair odd first), in the calling thread's buffer,
 * kept between calls; NULL where it could not be allocated. */
static __thread float *widened;
static __thread size_t widened_len;

static float *widen_pairs(const uint32_t *xb, int M, int64_t K2) {
    const size_t need = (size_t)M * 2 * K2 + 1;
    if (need > widened_len) {
        free(widened);
        widened = malloc(need * sizeof(float));
        widened_len = widened ? need : 0;
        if (!widened) return NULL;
    }
    for (int64_t i = 0; i < (int64_t)M * K2; i++) {
        union { uint32_t u; float f; } odd = {xb[i] & 0xffff0000u}, even = {xb[i] << 16};
        widened[2 * i] = odd.f;
        widened[2 * i + 1] = even.f;
    }
    return widened;
}

/* x's M rows (bf16 pairs, K2 a row) against a packed weight of N columns in dot products, AVX512-BF16's
 * or with `fma` fp32 FMAs' (`fma_tile`): each thread takes whole 32-column strips of the weight, read
 * from memory once, and their sums for every block of up to 8 rows; fp32 into `out` (M rows of N), or
 * with `out16` set, plus `bias`, in bf16 into `out16` (M rows of n columns). 0; 1 where the buffer of
 * widened rows could not be allocated. */
static int dots(const uint32_t *xb, int64_t K2, const uint32_t *w, float *out, int M, int64_t N, int threads,
                const float *bias, uint16_t *out16, int64_t n, int fma) {
    const float *xf = fma ? widen_pairs(xb, M, K2) : NULL;
    if (fma && !xf) return 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t j = 0; j < N / 32; j++) {
        const uint32_t *wj = w + 2 * j * 16 * K2;
        for (int m = 0; m < M; m += 8) {
            const uint32_t *xm = xb + m * K2;
            const float *xfm = xf ? xf + m * 2 * K2 : NULL;
            float *o = out16 ? NULL : out + m * N + 32 * j;
            uint16_t *o16 = out16 ? out16 + m * n : NULL;
            switch (M - m < 8 ? M - m : 8) {
            case 1: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 1); break;
            case 2: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 2); break;
            case 3: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 3); break;
            case 4: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 4); break;
            case 5: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 5); break;
            case 6: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 6); break;
            case 7: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 7); break;
            default: dots_tile(xm, xfm, K2, wj, o, N, bias, o16, 32 * j, n, 8); break;
            }
        }
    }
    return 0;
}

/* AMX tiles (Intel Xeon from Sapphire Rapids on): a 16 x 32 bf16 tile of x times a 32 x 16 tile of
 * the weight, summed in fp32, in one instruction. The packed weight's 16-column blocks are already
 * the layout a weight tile loads (pairs of consecutive k side by side, 64 bytes a row). Linux lends a
 * process the tiles' registers only on request (`amx_ready`). */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

static int amx_ready(void) {
    static int ready = -1;
    if (ready < 0) ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ready;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-3: sums for 32 rows x 32 columns (0-1 for a last block of 16 rows); 4-5: rows of x; 6-7:
 * columns of the weight. `xb` holds a multiple of 16 rows, `out` as many rows of N floats. The first
 * block of rows reads a strip of the weight from memory, prefetched `HEAD_PREFETCH` bytes ahead (the
 * tile loads alone leave the memory idle between them); the other blocks find it in the cache.
 * With `out16` set, the sums go through a small buffer to `store_bf16` instead: the M real rows, n
 * columns, in bf16 with `bias` (or none) added. */
#define HEAD_PREFETCH 2048
static void head_amx(const uint32_t *xb, int64_t K2, const uint32_t *w, float *out, int M16, int64_t N, int threads,
                     const float *bias, uint16_t *out16, int M, int64_t n) {
#pragma omp parallel num_threads(threads)
    {
        tile_config cfg = {0};
        cfg.palette = 1;
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
        float sums[32 * 32] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t j = 0; j < N / 32; j++) {
            const uint32_t *w0 = w + 2 * j * 16 * K2, *w1 = w0 + 16 * K2;
            for (int m = 0; m < M16; m += 32) {
                const uint32_t *x0 = xb + m * K2, *x1 = x0 + 16 * K2;
                const int pairs = M16 - m >= 32;
                float *o = out16 ? sums : out + m * N + 32 * j;
                const int64_t ldo = out16 ? 32 : N;
                _tile_zero(0);
                _tile_zero(1);
                if (pairs) {
                    _tile_zero(2);
                    _tile_zero(3);
                }
                for (int64_t k = 0; k < K2; k += 16) {
                    if (m == 0)
                        for (int l = 0; l < 1024; l += 64) {
                            _mm_prefetch((const char *)(w0 + 16 * k) + HEAD_PREFETCH + l, _MM_HINT_T0);
                            _mm_prefetch((const char *)(w1 + 16 * k) + HEAD_PREFETCH + l, _MM_HINT_T0);
                        }
                    _tile_loadd(4, x0 + k, 4 * K2);
                    _tile_loadd(6, w0 + 16 * k, 64);
                    _tile_loadd(7, w1 + 16 * k, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    if (pairs) {
                        _tile_loadd(5, x1 + k, 4 * K2);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, o, 4 * ldo);
                _tile_stored(1, o + 16, 4 * ldo);
                if (pairs) {
                    _tile_stored(2, o + 16 * ldo, 4 * ldo);
                    _tile_stored(3, o + 16 * ldo + 16, 4 * ldo);
                }
                if (out16 && m < M) {
                    const int rows = M - m < (pairs ? 32 : 16) ? M - m : (pairs ? 32 : 16);
                    store_bf16(sums, rows, bias, out16 + m * n, 32 * j, n);
                }
            }
        }
        _tile_release();
    }
}
#else
static int amx_ready(void) { return 0; }
static void head_amx(const uint32_t *xb, int64_t K2, const uint32_t *w, float *out, int M16, int64_t N, int threads,
                     const float *bias, uint16_t *out16, int M, int64_t n) {
    (void)xb, (void)K2, (void)w, (void)out, (void)M16, (void)N, (void)threads, (void)bias, (void)out16, (void)M, (void)n;
}
#endif

/* Whether AMX tiles may be asked for here: built for them, and Linux lent them to this process. */
int amx_lent(void) { return amx_ready(); }

/* x in bf16 pairs, zeros past K and past M: one buffer per calling thread, kept between calls. */
static __thread uint32_t *scratch;
static __thread size_t scratch_len;

/* x ([M][K], fp32 or bf16 where `x_bf16`, rows `x_stride` elements apart) as bf16 pairs in the calling
 * thread's scratch: K2 pairs a row, zeros past K, `rows` >= M rows, zeros past M. NULL where the
 * scratch could not be allocated. */
static uint32_t *bf16_rows(const void *x, int64_t x_stride, int x_bf16, int M, int rows, int64_t K, int64_t K2) {
    const size_t need = (size_t)rows * K2 + 1;
    if (need > scratch_len) {
        free(scratch);
        scratch = malloc(need * sizeof(uint32_t));
        scratch_len = scratch ? need : 0;
        if (!scratch) return NULL;
    }
    uint32_t *xb = scratch;
    for (int m = 0; m < M; m++) {
        uint32_t *dst = xb + m * K2;
        if (x_bf16) {
            memcpy(dst, (const uint16_t *)x + m * x_stride, (size_t)K * 2);
            if (K % 2) dst[K / 2] &= 0xffff;
        } else {
            const float *row = (const float *)x + m * x_stride;
            for (int64_t k = 0; 2 * k < K; k++) {
                const uint32_t hi = 2 * k + 1 < K ? to_bf16(row[2 * k + 1]) : 0;
                dst[k] = to_bf16(row[2 * k]) | hi << 16;
            }
        }
        memset(dst + (K + 1) / 2, 0, (size_t)(K2 - (K + 1) / 2) * sizeof(uint32_t));
    }
    memset(xb + (int64_t)M * K2, 0, (size_t)(rows - M) * K2 * sizeof(uint32_t));
    return xb;
}

/* Whether `kernel` names a way of multiplying (a `KERNEL_*`) that this CPU and process have. */
static int kernel_ready(int kernel) {
    return kernel == KERNEL_DOTS || kernel == KERNEL_FMA || (kernel == KERNEL_AMX && amx_ready());
}

/* x: [M][K] fp32 (or bf16 where `x_bf16`), rows `x_stride` elements apart; `w` holds K2 pairs of k a
 * column (K2 >= (K + 1) / 2, zeros past K; a multiple of 16 for AMX); out: [M][N] fp32, rows N apart,
 * with room for M rounded up to 16 rows where `kernel` is `KERNEL_AMX`. 0; 1 where the scratch for x
 * could not be allocated; 2 where the kernel is not available here. */
int head_bf16(const void *x, int64_t x_stride, int x_bf16, const uint32_t *w, float *out, int M, int64_t K,
              int64_t K2, int64_t N, int kernel, int threads) {
    const int amx = kernel == KERNEL_AMX;
    if (!kernel_ready(kernel) || (amx && K2 % 16)) return 2;
    const int rows = amx ? (M + 15) / 16 * 16 : M;
    uint32_t *xb = bf16_rows(x, x_stride, x_bf16, M, rows, K, K2);
    if (!xb) return 1;
    if (amx) {
        head_amx(xb, K2, w, out, rows, N, threads, NULL, NULL, M, N);
        return 0;
    }
    return dots(xb, K2, w, out, M, N, threads, NULL, NULL, 0, kernel == KERNEL_FMA);
}

/* A bf16 projection of a decode step's rows: out[m][c] = bf16(sum_k x[m][k] w[c][k] + bias[c]), the
 * products summed in fp32 and rounded once, as a bf16 matrix product rounds its fp32 sums (oneDNN's):
 * by `kernel`, in AMX tiles or in dot products (`dots`). x: [M][K] bf16, rows `x_stride` apart; w:
 * `pack_head`'s layout, N columns (a multiple of 32), K2 pairs (a multiple of 16 for AMX); bias: n
 * floats or NULL; out: [M][n] bf16. 0; 1 where the scratch could not be allocated; 2 where the kernel
 * is not available here. */
int linear_bf16(const void *x, int64_t x_stride, const uint32_t *w, const float *bias, uint16_t *out, int M,
                int64_t K, int64_t K2, int64_t N, int64_t n, int kernel, int threads) {
    const int amx = kernel == KERNEL_AMX;
    if (!kernel_ready(kernel) || (amx && K2 % 16)) return 2;
    const int rows = amx ? (M + 15) / 16 * 16 : M;
    uint32_t *xb = bf16_rows(x, x_stride, 1, M, rows, K, K2);
    if (!xb) return 1;
    if (!amx) return dots(xb, K2, w, NULL, M, N, threads, bias, out, n, kernel == KERNEL_FMA);
    head_amx(xb, K2, w, NULL, rows, N, threads, bias, out, M, n);
    return 0;
}

/* The layers' buffers of bf16 activations, one per calling thread, kept between calls. */
static __thread uint16_t *layer_buf;
static __thread size_t layer_len;

/* `linear_bf16` of M rows K apart into out (n columns), the weight's padding from K and n. Its return
 * code. */
static int project(const uint16_t *x, int64_t K, const uint32_t *w, const float *bias, uint16_t *out, int M,
                   int64_t n, int kernel, int threads) {
    return linear_bf16(x, K, w, bias, out, M, K, (K + 31) / 32 * 16, (n + 31) / 32 * 32, n, kernel, threads);
}

/* One decoder layer of the bf16 sampler's decode step in one call, its products by `kernel` (AMX tiles
 * or dot products): what the layer runs op by op from Python (paths.py: the same kernels in the same
 * order, so the same result to the bit), for B rows of a residual stream x ([B][d] fp32, updated in place). `pending` (bf16 [B][d], or NULL): the
 * previous layer's MLP output, joining x in the first norm. The four projections are `pack_head`
 * weights (q/k/v fused: (H + 2 Hkv) D columns; o: d; gate/up fused: 2 f; down: d), each with its fp32
 * bias or NULL; norms: fp32 weights of d. RoPE, the cache, the mask and `rows` as in
 * `rope_decode_attention`. out: the MLP output, bf16 [B][d]. 0; 1 where memory could not be allocated;
 * 2 where the kernel is not available here. */
int decode_layer_bf16(float *x, const uint16_t *pending, const float *norm1, float eps1, const float *norm2,
                      float eps2, const uint32_t *w_qkv, const float *b_qkv, const uint32_t *w_o, const float *b_o,
                      const uint32_t *w_gu, const float *b_gu, const uint32_t *w_down, const float *b_down,
                      const float *cos, const float *sin, void *k_cache, void *v_cache, int kv_bf16,
                      int64_t kv_sb, int64_t kv_sh, const int64_t *rows, int pos, const float *mask, int64_t mask_sb,
                      float scale, uint16_t *out, int B, int d, int H, int Hkv, int D, int f, int kernel,
                      int threads) {
    if (!kernel_ready(kernel)) return 2;
    const int64_t n_qkv = (int64_t)(H + 2 * Hkv) * D, n_att = (int64_t)H * D;
    const size_t need = (size_t)B * (d + n_qkv + n_att + d + 2 * (int64_t)f + f);
    if (need > layer_len) {
        free(layer_buf);
        layer_buf = malloc(need * sizeof(uint16_t));
        layer_len = layer_buf ? need : 0;
        if (!layer_buf) return 1;
    }
    uint16_t *h = layer_buf, *qkv = h + (size_t)B * d, *att = qkv + (size_t)B * n_qkv, *o = att + (size_t)B * n_att;
    uint16_t *gu = o + (size_t)B * d, *act = gu + (size_t)B * 2 * f;
    int rc;
    rms_norm(x, pending, 1, d, norm1, eps1, h, 1, B, d, threads);
    if ((rc = project(h, d, w_qkv, b_qkv, qkv, B, n_qkv, kernel, threads))) return rc;
    if (rope_decode_attention(qkv, qkv + n_att, qkv + n_att + (int64_t)Hkv * D, 1, n_qkv, n_qkv, cos, sin, k_cache,
                              v_cache, kv_bf16, kv_sb, kv_sh, rows, pos, mask, mask_sb, att, 1, B, H, Hkv, D, scale,
                              threads))
        return 1;
    if ((rc = project(att, n_att, w_o, b_o, o, B, d, kernel, threads))) return rc;
    rms_norm(x, o, 1, d, norm2, eps2, h, 1, B, d, threads);
    if ((rc = project(h, d, w_gu, b_gu, gu, B, 2 * (int64_t)f, kernel, threads))) return rc;
    silu_mul(gu, gu + f, 1, 2 * (int64_t)f, act, 1, B, f, threads);
    return project(act, f, w_down, b_down, out, B, d, kernel, threads);
}
#endif
