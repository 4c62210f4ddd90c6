/*
 * CPU matmul over Hugging Face's block-wise FP8 (F8_E4M3 weights with F32 block scales, the
 * official Qwen3 / DeepSeek-V3 FP8 checkpoints), y[T,N] = x[T,K] . W[N,K]^T, with the contract
 * of cpu_matmul.c: every output element's summation order depends only on K and the ISA.
 *
 *   weight   w[n][k] = fp8[n][k] * S[(rphase + n) / brows][k / group]   (rounded once, to float)
 *   scalar:  s = 0; s += w[k] * x[k] for k = 0 .. K-1
 *   SIMD:    acc[l] = fma(w[k], x[k], acc[l]) for k = l, l+L, l+2L, ... (L = 16 AVX-512, 8 AVX2),
 *            the fixed horizontal sum of simd.h, then s += w[k] * x[k] over the K % L tail
 *
 * That is cpu_matmul.c's order over the dequantised matrix, and the widened weights are the
 * dequantised floats bit for bit, so on one ISA an FP8 matrix gives exactly the bits of its
 * float32 twin. The SIMD paths widen in registers: an e4m3 byte seeeemmm becomes the f16
 * s0eeeemmm0000000 (exponent bias 15 instead of 7, subnormals included: exactly the value times
 * 2^-8, widened by F16C), then one multiply by 256 * scale, which equals fp8 * scale rounded
 * once (the power of two moves between exact factors). NaN codes (0x7f, 0xff) get an all-ones
 * f16 exponent, so they widen to NaN as the table has it. The SIMD paths need group % L == 0
 * (128 in every official checkpoint), so that a vector never straddles two scale blocks;
 * another group runs the scalar order. Threads split the rows in blocks of 16.
 */
#include <immintrin.h>
#include <omp.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "kernels/simd.h"

#define INLINE   __attribute__((always_inline))
#define F2_ATTR  SL_AVX2_ATTR
#define F5_ATTR  __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define ROWS_BLK 16

/* The scales of row n: its block row of ceil(K / group) floats. */
static inline const float *fp8_srow(const sl_tensor *w, int64_t n) {
    const int64_t ncb = (w->shape[1] + w->group - 1) / w->group;
    return (const float *)w->scales + (size_t)((w->rphase + n) / w->brows) * (size_t)ncb;
}

/* ---------------------------------------------------------------- scalar */

void sl_dequant_fp8_row(const sl_tensor *w, int64_t row, float *dst) {
    const int64_t K = w->shape[1];
    const uint8_t *q = (const uint8_t *)w->data + (size_t)row * (size_t)K;
    const float *s = fp8_srow(w, row);
    for (int64_t k = 0; k < K; k++)
        dst[k] = sl_fp8_e4m3_to_f32(q[k]) * s[k / w->group];
}

float sl_dot_fp8_ref(const sl_tensor *w, int64_t row, const float *x) {
    const int64_t K = w->shape[1];
    const uint8_t *q = (const uint8_t *)w->data + (size_t)row * (size_t)K;
    const float *sc = fp8_srow(w, row);
    float s = 0;
    for (int64_t k = 0; k < K; k++)
        s += sl_fp8_e4m3_to_f32(q[k]) * sc[k / w->group] * x[k];
    return s;
}

static void frows_scalar(float *y, const float *x, const sl_tensor *w, int32_t T, int64_t n0,
                         int64_t n1) {
    const int64_t N = w->shape[0], K = w->shape[1];
    for (int64_t n = n0; n < n1; n++)
        for (int32_t t = 0; t < T; t++)
            y[(size_t)t * (size_t)N + (size_t)n] = sl_dot_fp8_ref(w, n, x + (size_t)t * (size_t)K);
}

/* The K % L tail of one row against one token, after the vector part. */
static inline float fp8_tail(const uint8_t *q, const float *sc, int32_t group, const float *x,
                             int64_t k, int64_t K, float s) {
    for (; k < K; k++)
        s += sl_fp8_e4m3_to_f32(q[k]) * sc[k / group] * x[k];
    return s;
}

/* ------------------------------------------------------------------ SIMD */

/* 8 (AVX2) or 16 (AVX-512) e4m3 bytes as f16 codes worth 2^-8 times their value. */
F2_ATTR static inline INLINE __m128i fp8_to_h16x8(const uint8_t *p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i sgn = _mm_and_si128(_mm_slli_epi16(b, 8), _mm_set1_epi16((short)0x8000));
    const __m128i mag = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(0x3f80));
    const __m128i nan =
        _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80)), _mm_set1_epi16(0x7c00));
    return _mm_or_si128(_mm_or_si128(sgn, mag), nan);
}

F5_ATTR static inline INLINE __m256i fp8_to_h16x16(const uint8_t *p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i sgn = _mm256_and_si256(_mm256_slli_epi16(b, 8), _mm256_set1_epi16((short)0x8000));
    const __m256i mag = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(0x3f80));
    const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3f80)),
                                         _mm256_set1_epi16(0x7c00));
    return _mm256_or_si256(_mm256_or_si256(sgn, mag), nan);
}

F2_ATTR static inline INLINE __m256 fp8_load8(const uint8_t *p, __m256 s256) {
    return _mm256_mul_ps(_mm256_cvtph_ps(fp8_to_h16x8(p)), s256);
}

F5_ATTR static inline INLINE __m512 fp8_load16(const uint8_t *p, __m512 s256) {
    return _mm512_mul_ps(_mm512_cvtph_ps(fp8_to_h16x16(p)), s256);
}

/* NR rows (data q, stride K bytes; scale rows sc[r]) against NT tokens (stride K floats). */
#define DEFINE_FTILE(ISA, ATTR, VEC, L, ZERO, SET1, FMA, LOADX, LOADW, HSUM)                       \
    ATTR static inline INLINE void ftile_##ISA(const uint8_t *q, const float *const *sc,           \
                                               int32_t group, const float *x, float *y, size_t ys, \
                                               int64_t K, const int NR, const int NT) {            \
        VEC acc[4][4];                                                                             \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)                                       \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[r][t] = ZERO;                 \
        int64_t k = 0;                                                                             \
        while (k + L <= K) {                                                                       \
            const int64_t b = k / group, kend = SL_MIN(K, (b + 1) * group);                        \
            VEC s[4];                                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) s[r] = SET1(256.0f * sc[r][b]);   \
            for (; k + L <= kend; k += L) {                                                        \
                VEC xv[4];                                                                         \
                _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) xv[t] =                       \
                    LOADX(x + (size_t)t * (size_t)K + k);                                          \
                _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                             \
                    const VEC wv = LOADW(q + (size_t)r * (size_t)K + k, s[r]);                     \
                    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[r][t] =               \
                        FMA(wv, xv[t], acc[r][t]);                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++)                                                           \
                y[(size_t)t * ys + (size_t)r] =                                                    \
                    fp8_tail(q + (size_t)r * (size_t)K, sc[r], group, x + (size_t)t * (size_t)K,   \
                             k, K, HSUM(acc[r][t]));                                               \
    }

DEFINE_FTILE(avx2, F2_ATTR, __m256, 8, _mm256_setzero_ps(), _mm256_set1_ps, _mm256_fmadd_ps,
             _mm256_loadu_ps, fp8_load8, sl_hsum256)
DEFINE_FTILE(avx512, F5_ATTR, __m512, 16, _mm512_setzero_ps(), _mm512_set1_ps, _mm512_fmadd_ps,
             _mm512_loadu_ps, fp8_load16, sl_hsum512)

/* Rows [n0, n1) for all T tokens: tiles of 4 x 4, then remainders. */
#define DEFINE_FROWS(ISA, ATTR)                                                                    \
    ATTR static void frows_##ISA(float *y, const float *x, const sl_tensor *w, int32_t T,          \
                                 int64_t n0, int64_t n1) {                                         \
        const int64_t N = w->shape[0], K = w->shape[1];                                            \
        const uint8_t *q = w->data;                                                                \
        int64_t n = n0;                                                                            \
        for (; n < n1;) {                                                                          \
            const int nr = n + 4 <= n1 ? 4 : 1;                                                    \
            const float *sc[4];                                                                    \
            for (int r = 0; r < nr; r++)                                                           \
                sc[r] = fp8_srow(w, n + r);                                                        \
            const uint8_t *qn = q + (size_t)n * (size_t)K;                                         \
            int32_t t = 0;                                                                         \
            if (nr == 4) {                                                                         \
                for (; t + 4 <= T; t += 4)                                                         \
                    ftile_##ISA(qn, sc, w->group, x + (size_t)t * (size_t)K,                       \
                                y + (size_t)t * (size_t)N + n, (size_t)N, K, 4, 4);                \
                for (; t < T; t++)                                                                 \
                    ftile_##ISA(qn, sc, w->group, x + (size_t)t * (size_t)K,                       \
                                y + (size_t)t * (size_t)N + n, (size_t)N, K, 4, 1);                \
            } else {                                                                               \
                for (; t + 4 <= T; t += 4)                                                         \
                    ftile_##ISA(qn, sc, w->group, x + (size_t)t * (size_t)K,                       \
                                y + (size_t)t * (size_t)N + n, (size_t)N, K, 1, 4);                \
                for (; t < T; t++)                                                                 \
                    ftile_##ISA(qn, sc, w->group, x + (size_t)t * (size_t)K,                       \
                                y + (size_t)t * (size_t)N + n, (size_t)N, K, 1, 1);                \
            }                                                                                      \
            n += nr;                                                                               \
        }                                                                                          \
    }

DEFINE_FROWS(avx2, F2_ATTR)
DEFINE_FROWS(avx512, F5_ATTR)

/* ---------------------------------------------------------------- driver */

void sl_matmul_fp8_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                       int32_t T) {
    SL_ASSERT(w->ndim == 2 && sl_tensor_is_fp8(w) && w->group > 0 && w->brows > 0);
    const int64_t N = w->shape[0], K = w->shape[1];
    sl_isa isa = be->isa;
    if (isa == SL_ISA_AVX512 && w->group % 16) isa = SL_ISA_SCALAR;
    if (isa == SL_ISA_AVX2 && w->group % 8) isa = SL_ISA_SCALAR;
    /* Small products are not worth waking a second thread for. */
    const int nth = (N * K * T < (1 << 15) || N < 8) ? 1 : be->n_threads;
    const int64_t n_blocks = (N + ROWS_BLK - 1) / ROWS_BLK;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        const int64_t n0 = b * ROWS_BLK, n1 = SL_MIN(N, n0 + ROWS_BLK);
        switch (isa) {
        case SL_ISA_AVX512: frows_avx512(y, x, w, T, n0, n1); break;
        case SL_ISA_AVX2: frows_avx2(y, x, w, T, n0, n1); break;
        default: frows_scalar(y, x, w, T, n0, n1); break;
        }
    }
}
