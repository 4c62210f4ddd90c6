/*
 * CPU matrix multiply, y[T,N] = x[T,K] . W[N,K]^T, with W in F32/F16/BF16.
 *
 * Every output element is one dot product whose summation order depends only
 * on K and the ISA, never on T, N, the tile it was computed in or the thread:
 *   lanes:  acc[l] += w[k] * x[k] for k = l, l+L, l+2L, ... (L = 8 or 16)
 *   then:   s = horizontal sum of acc; s += w[k] * x[k] for the K % L tail
 * So a token gives the same bits alone (decode) or inside a batch (prefill).
 * Tiles of up to 4 rows x 4 tokens reuse each widened weight vector across
 * tokens; threads split the rows.
 */
#include <immintrin.h>
#include <omp.h>

#include "kernels/blocks.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/simd.h"

/* ---------------------------------------------------------------- scalar */

static inline float load_w(const void *w, sl_dtype dt, size_t i) {
    uint16_t h;
    float f;
    switch (dt) {
    case SL_DTYPE_BF16: memcpy(&h, (const uint8_t *)w + 2 * i, 2); return sl_bf16_to_f32(h);
    case SL_DTYPE_F16: memcpy(&h, (const uint8_t *)w + 2 * i, 2); return sl_f16_to_f32(h);
    default: memcpy(&f, (const uint8_t *)w + 4 * i, 4); return f;
    }
}

void sl_to_f32(float *dst, const void *src, sl_dtype dtype, size_t i0, size_t n) {
    if (dtype == SL_DTYPE_F32) {
        memcpy(dst, (const float *)src + i0, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = load_w(src, dtype, i0 + i);
}

/* Reference dot: the scalar ISA's order (lanes of 1). */
static float dot_scalar(const void *w, sl_dtype dt, const float *x, int64_t K) {
    float s = 0;
    for (int64_t k = 0; k < K; k++)
        s += load_w(w, dt, (size_t)k) * x[k];
    return s;
}

float sl_dot_ref(const sl_tensor *w, int64_t row, const float *x) {
    int64_t K = w->shape[1];
    if (sl_tensor_is_fp8(w)) return sl_dot_fp8_ref(w, row, x);
    if (sl_dtype_is_block(w->dtype))
        return sl_dot_blocks_ref(
            w->dtype, (const uint8_t *)w->data + (size_t)row * sl_row_bytes(w->dtype, K), x, K);
    const uint8_t *base = (const uint8_t *)w->data + (size_t)(row * K) * sl_dtype_size(w->dtype);
    return dot_scalar(base, w->dtype, x, K);
}

/* ------------------------------------------------------------------ AVX2 */

#define AVX2_ATTR SL_AVX2_ATTR

AVX2_ATTR static inline __m256 avx2_load(const void *w, sl_dtype dt, int64_t k) {
    if (dt == SL_DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == SL_DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
    return _mm256_loadu_ps((const float *)w + k);
}

/* Tiles are inlined with constant NR, NT and dtype, and their small loops
 * unrolled, so the 4 x 4 accumulators live in registers (-O2 does neither by
 * itself). */
#define INLINE __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

/* NR rows of W (stride ws bytes) against NT tokens of x (stride xs floats). */
#define DEFINE_TILE(ISA, ATTR, VEC, L, ZERO, FMA, LOADX, LOADW, HSUM)                              \
    ATTR static inline INLINE void tile_##ISA(const uint8_t *w, size_t ws, sl_dtype dt,            \
                                              const float *x, size_t xs, float *y, size_t ys,      \
                                              int64_t K, const int NR, const int NT) {             \
        VEC acc[4][4];                                                                             \
        UNROLL for (int r = 0; r < NR; r++) UNROLL for (int t = 0; t < NT; t++) acc[r][t] = ZERO;  \
        int64_t k = 0;                                                                             \
        for (; k + L <= K; k += L) {                                                               \
            VEC xv[4];                                                                             \
            UNROLL for (int t = 0; t < NT; t++) xv[t] = LOADX(x + (size_t)t * xs + k);             \
            UNROLL for (int r = 0; r < NR; r++) {                                                  \
                VEC wv = LOADW(w + (size_t)r * ws, dt, k);                                         \
                UNROLL for (int t = 0; t < NT; t++) acc[r][t] = FMA(wv, xv[t], acc[r][t]);         \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < NR; r++)                                                               \
            for (int t = 0; t < NT; t++) {                                                         \
                float s = HSUM(acc[r][t]);                                                         \
                const float *xt = x + (size_t)t * xs;                                              \
                for (int64_t j = k; j < K; j++)                                                    \
                    s += load_w(w + (size_t)r * ws, dt, (size_t)j) * xt[j];                        \
                y[(size_t)t * ys + r] = s;                                                         \
            }                                                                                      \
    }

DEFINE_TILE(avx2, AVX2_ATTR, __m256, 8, _mm256_setzero_ps(), _mm256_fmadd_ps, _mm256_loadu_ps,
            avx2_load, sl_hsum256)

/* --------------------------------------------------------------- AVX-512 */

#define AVX512_ATTR SL_AVX512_ATTR

AVX512_ATTR static inline __m512 avx512_load(const void *w, sl_dtype dt, int64_t k) {
    if (dt == SL_DTYPE_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == SL_DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k)));
    return _mm512_loadu_ps((const float *)w + k);
}

DEFINE_TILE(avx512, AVX512_ATTR, __m512, 16, _mm512_setzero_ps(), _mm512_fmadd_ps, _mm512_loadu_ps,
            avx512_load, sl_hsum512)

/* ---------------------------------------------------------------- driver */

/* Rows [n0, n1) of y for all T tokens, tiles of 4 x 4 then remainders; one
 * instantiation per dtype so the weight widening is resolved at compile time. */
#define DEFINE_ROWS(ISA, ATTR)                                                                     \
    ATTR static inline INLINE void rows_body_##ISA(float *y, const float *x, const uint8_t *w,     \
                                                   size_t ws, const sl_dtype dt, int64_t K,        \
                                                   int64_t N, int32_t T, int64_t n0, int64_t n1) { \
        int64_t n = n0;                                                                            \
        for (; n + 4 <= n1; n += 4) {                                                              \
            int32_t t = 0;                                                                         \
            for (; t + 4 <= T; t += 4)                                                             \
                tile_##ISA(w + (size_t)n * ws, ws, dt, x + (size_t)t * K, (size_t)K,               \
                           y + (size_t)t * N + n, (size_t)N, K, 4, 4);                             \
            for (; t < T; t++)                                                                     \
                tile_##ISA(w + (size_t)n * ws, ws, dt, x + (size_t)t * K, (size_t)K,               \
                           y + (size_t)t * N + n, (size_t)N, K, 4, 1);                             \
        }                                                                                          \
        for (; n < n1; n++) {                                                                      \
            int32_t t = 0;                                                                         \
            for (; t + 4 <= T; t += 4)                                                             \
                tile_##ISA(w + (size_t)n * ws, ws, dt, x + (size_t)t * K, (size_t)K,               \
                           y + (size_t)t * N + n, (size_t)N, K, 1, 4);                             \
            for (; t < T; t++)                                                                     \
                tile_##ISA(w + (size_t)n * ws, ws, dt, x + (size_t)t * K, (size_t)K,               \
                           y + (size_t)t * N + n, (size_t)N, K, 1, 1);                             \
        }                                                                                          \
    }                                                                                              \
    ATTR static void rows_##ISA(float *y, const float *x, const uint8_t *w, size_t ws,             \
                                sl_dtype dt, int64_t K, int64_t N, int32_t T, int64_t n0,          \
                                int64_t n1) {                                                      \
        if (dt == SL_DTYPE_BF16)                                                                   \
            rows_body_##ISA(y, x, w, ws, SL_DTYPE_BF16, K, N, T, n0, n1);                          \
        else if (dt == SL_DTYPE_F16)                                                               \
            rows_body_##ISA(y, x, w, ws, SL_DTYPE_F16, K, N, T, n0, n1);                           \
        else                                                                                       \
            rows_body_##ISA(y, x, w, ws, SL_DTYPE_F32, K, N, T, n0, n1);                           \
    }

DEFINE_ROWS(avx2, AVX2_ATTR)
DEFINE_ROWS(avx512, AVX512_ATTR)

static void rows_scalar(float *y, const float *x, const uint8_t *w, size_t ws, sl_dtype dt,
                        int64_t K, int64_t N, int32_t T, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++)
        for (int32_t t = 0; t < T; t++)
            y[(size_t)t * (size_t)N + (size_t)n] =
                dot_scalar(w + (size_t)n * ws, dt, x + (size_t)t * (size_t)K, K);
}

void sl_matmul_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T) {
    SL_ASSERT(w->ndim == 2);
    const int64_t N = w->shape[0], K = w->shape[1];
    if (sl_dtype_is_quant(w->dtype)) {
        sl_matmul_quant_cpu(be, y, x, w, T);
        goto add_bias;
    }
    if (sl_dtype_is_block(w->dtype)) {
        sl_matmul_blocks_cpu(be, y, x, w, T);
        goto add_bias;
    }
    if (sl_tensor_is_fp8(w)) {
        sl_matmul_fp8_cpu(be, y, x, w, T);
        goto add_bias;
    }
    const size_t ws = (size_t)K * sl_dtype_size(w->dtype);
    const uint8_t *wd = w->data;
    /* Small products are not worth waking a second thread for. */
    int nth = (N * K * T < (1 << 15) || N < 8) ? 1 : be->n_threads;
    const int64_t block = 16; /* rows per work item: keeps tiles of 4 whole */
    const int64_t n_blocks = (N + block - 1) / block;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t n0 = b * block, n1 = SL_MIN(N, n0 + block);
        switch (be->isa) {
        case SL_ISA_AVX512: rows_avx512(y, x, wd, ws, w->dtype, K, N, T, n0, n1); break;
        case SL_ISA_AVX2: rows_avx2(y, x, wd, ws, w->dtype, K, N, T, n0, n1); break;
        default: rows_scalar(y, x, wd, ws, w->dtype, K, N, T, n0, n1); break;
        }
    }
add_bias:
    if (bias && bias->data) {
        for (int32_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++)
                y[(size_t)t * (size_t)N + (size_t)n] += load_w(bias->data, bias->dtype, (size_t)n);
    }
}

void sl_matmul_batch_cpu(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n) {
    int one = n > 1 && sl_dtype_is_quant(w[0]->dtype);
    for (int32_t i = 0; one && i < n; i++)
        one = T[i] == 1;
    if (one && sl_matmul_quant_batch1_cpu(be, y, x, w, n)) return;
    for (int32_t i = 0; i < n; i++)
        sl_matmul_cpu(be, y[i], x[i], w[i], NULL, T[i]);
}
