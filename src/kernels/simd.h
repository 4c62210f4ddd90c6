/*
 * SIMD helpers shared by the CPU kernels. Functions carry their own target
 * attribute, so the library builds for baseline x86-64 and each kernel picks
 * its ISA at run time (sl_backend.isa).
 */
#ifndef SL_SIMD_H
#define SL_SIMD_H

#include <immintrin.h>

#define SL_AVX2_ATTR   __attribute__((target("avx2,fma,f16c")))
#define SL_AVX512_ATTR __attribute__((target("avx512f,avx512bw")))
#define SL_INLINE      static inline __attribute__((always_inline))

/* Horizontal sums in a fixed order (results must not depend on the caller). */
SL_AVX2_ATTR SL_INLINE float sl_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

SL_AVX512_ATTR SL_INLINE float sl_hsum512(__m512 v) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

#endif /* SL_SIMD_H */
