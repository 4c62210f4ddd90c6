/*
 * CPU matmul, embed rows and dot products over ggml's block types (blocks.h), y[T,N] = x[T,K] .
 * W[N,K]^T with W in blocks, and the same contract as cpu_matmul.c: every output element's
 * summation order depends only on K and the ISA, never on T, the tile or the thread.
 *
 *   scalar:  s = 0; s += w[k] * x[k] for k = 0 .. K-1, w a block at a time from sl_dequant_row
 *   SIMD:    acc[l] = fma(w[k], x[k], acc[l]) for k = l, l+L, l+2L, ... (L = 16 AVX-512, 8 AVX2),
 *            then the fixed horizontal sum of simd.h
 *
 * The SIMD paths never widen a row to memory: per block they decode its scales to float, then per
 * group of 32 weights build the 32 integer codes in two 128-bit registers (signed bytes), widen
 * them to float in registers as fma(code, scale, offset) and multiply-add with x. The widened
 * weights are sl_dequant_row's floats bit for bit: code * scale never rounds (an f16 times small
 * integers fits 24 bits), so the fma rounds once where ggml's code * scale + offset (or its
 * d*q - m, which is q*d + (-m)) does. Every ISA therefore differs from the reference only in the
 * order of the sum. Tiles of up to 4 rows x 4 tokens reuse each widened group across tokens;
 * threads split the rows in blocks of 16, as cpu_matmul.c. Nothing is allocated.
 *
 * This is the FLOAT path. For Q8_0, Q4_0, Q4_K, Q5_K and Q6_K sl_matmul_blocks_cpu takes the
 * int8-activation path of cpu_blocks_int8.c where the ISA has it (blocks.h).
 */
#include <immintrin.h>
#include <omp.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "kernels/simd.h"

#define INLINE __attribute__((always_inline))
#define BINL   static inline INLINE
/* The codes are built with SSE-width integer ops under AVX2's target (F16C for the scales); the
 * AVX-512 functions add those features, so the helpers inline into both. */
#define B2_ATTR  SL_AVX2_ATTR
#define B5_ATTR  __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define ROWS_BLK 16 /* rows per work item: keeps tiles of 4 whole */

/* ---------------------------------------------------------------- scalar */

/* The reference order: one float accumulator over k, blocks widened by sl_dequant_row. */
float sl_dot_blocks_ref(sl_dtype t, const void *row, const float *x, int64_t K) {
    const int32_t bs = sl_dtype_block_size(t);
    const size_t bb = sl_dtype_block_bytes(t);
    float w[256], s = 0;
    for (int64_t k0 = 0; k0 < K; k0 += bs) {
        sl_dequant_row(t, (const uint8_t *)row + (size_t)(k0 / bs) * bb, w, bs);
        for (int32_t j = 0; j < bs; j++)
            s += w[j] * x[k0 + j];
    }
    return s;
}

/* Rows [n0, n1) for all tokens: per row, tokens in slices of 8 each keep their own accumulator,
 * so a block is widened once per slice and every token's order is sl_dot_blocks_ref's. */
static void brows_scalar(float *y, const float *x, const uint8_t *w, size_t ws, sl_dtype t,
                         int64_t K, int64_t N, int32_t T, int64_t n0, int64_t n1) {
    enum { TS = 8 };
    const int32_t bs = sl_dtype_block_size(t);
    const size_t bb = sl_dtype_block_bytes(t);
    float wb[256];
    for (int64_t n = n0; n < n1; n++)
        for (int32_t t0 = 0; t0 < T; t0 += TS) {
            const int32_t nt = SL_MIN(TS, T - t0);
            float s[TS] = {0};
            for (int64_t k0 = 0; k0 < K; k0 += bs) {
                sl_dequant_row(t, w + (size_t)n * ws + (size_t)(k0 / bs) * bb, wb, bs);
                for (int32_t i = 0; i < nt; i++) {
                    const float *xt = x + (size_t)(t0 + i) * (size_t)K + k0;
                    for (int32_t j = 0; j < bs; j++)
                        s[i] += wb[j] * xt[j];
                }
            }
            for (int32_t i = 0; i < nt; i++)
                y[(size_t)(t0 + i) * (size_t)N + (size_t)n] = s[i];
        }
}

/* ------------------------------------------------------------ the codes */

/* A block is walked in groups of 32 weights. Its scales come first, once per block, as floats
 * (16 for Q2_K, Q3_K and Q6_K, 8 for Q4_K, Q5_K and IQ4_XS, 1 for the 32-element types): weight j
 * of group g is code * s[k] (+ b[k] where the format has an offset), k = bslot(t, g, j).
 * Then per group the 32 codes as signed bytes: element j < 16 is c0 byte j, 16 + j is c1 byte j.
 * The widening is fma(code, s, b): code * s is exact in float for every format (at most 23
 * significant bits: an f16 times small integers), so the fma rounds once, exactly as ggml's
 * code * s + b (or d*sc * q - dmin*m, which is q * s + (-m)) does. */
typedef struct bscales {
    float s[16], b[16];
} bscales;

BINL int32_t bsize(const sl_dtype t) {
    return t == SL_DTYPE_Q2_K || t == SL_DTYPE_Q3_K || t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K ||
                   t == SL_DTYPE_Q6_K || t == SL_DTYPE_IQ4_XS
               ? 256
               : 32;
}

BINL int has_off(const sl_dtype t) {
    return t == SL_DTYPE_Q4_1 || t == SL_DTYPE_Q5_1 || t == SL_DTYPE_Q2_K || t == SL_DTYPE_Q4_K ||
           t == SL_DTYPE_Q5_K;
}

B2_ATTR BINL float h16_at(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

B2_ATTR BINL __m128i bload(const uint8_t *p) {
    return _mm_loadu_si128((const __m128i *)p);
}

B2_ATTR BINL __m128i lo_nib(__m128i q) {
    return _mm_and_si128(q, _mm_set1_epi8(15));
}

B2_ATTR BINL __m128i hi_nib(__m128i q) {
    return _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
}

/* Bytes of q shifted right by n (0..7), then masked. */
B2_ATTR BINL __m128i bshift(__m128i q, int n, int mask) {
    return _mm_and_si128(_mm_srl_epi16(q, _mm_cvtsi32_si128(n)), _mm_set1_epi8((char)mask));
}

/* Bytes v where bit `bit` of the byte of hm is set, else 0. */
B2_ATTR BINL __m128i bit_bytes(__m128i hm, int bit, int v) {
    const __m128i m = _mm_set1_epi8((char)(1 << bit));
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hm, m), m), _mm_set1_epi8((char)v));
}

/* Q5_0/Q5_1: bit j of qh as 16 in byte j (elements 0..15: bits 0..15; 16..31: bits 16..31). */
B2_ATTR BINL void q5_high(const uint8_t *p, __m128i *h0, __m128i *h1) {
    const __m128i v = _mm_set1_epi32(
        (int)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24));
    const __m128i bits = _mm_set1_epi64x((long long)0x8040201008040201ull);
    const __m128i i0 = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i i1 = _mm_set_epi8(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m128i b0 = _mm_and_si128(_mm_shuffle_epi8(v, i0), bits);
    const __m128i b1 = _mm_and_si128(_mm_shuffle_epi8(v, i1), bits);
    *h0 = _mm_and_si128(_mm_cmpeq_epi8(b0, bits), _mm_set1_epi8(16));
    *h1 = _mm_and_si128(_mm_cmpeq_epi8(b1, bits), _mm_set1_epi8(16));
}

B2_ATTR BINL __m128i table16(const int8_t *kv) {
    return _mm_loadu_si128((const __m128i *)kv);
}

/* Which scale (and offset) of bscales weight j of group g takes. */
BINL int bslot(const sl_dtype t, int g, int j) {
    if (bsize(t) == 32) return 0;
    if (t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K || t == SL_DTYPE_IQ4_XS) return g;
    return 2 * g + j / 16; /* Q2_K, Q3_K, Q6_K: a scale per 16 */
}

static inline uint32_t bu32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 8 unsigned bytes (the low 8 of v) as floats, times d. */
B2_ATTR BINL __m256 bytes8_times(__m128i v, float d) {
    return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
}

/* -(v), sign flipped (so -(+0) is -0, as ggml's d*q - m has it). */
B2_ATTR BINL __m256 bneg(__m256 v) {
    return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f));
}

/* The scales (and offsets) of block b (layouts: blocks.c): float by float what sl_dequant_row
 * forms (d * sc; -(dmin * m)), 8 at a time. */
B2_ATTR BINL void bblock_scales(const sl_dtype t, const uint8_t *b, bscales *o) {
    switch (t) {
    case SL_DTYPE_Q8_0:
    case SL_DTYPE_Q4_0:
    case SL_DTYPE_Q5_0:
    case SL_DTYPE_IQ4_NL: o->s[0] = h16_at(b); break;
    case SL_DTYPE_Q4_1:
    case SL_DTYPE_Q5_1:
        o->s[0] = h16_at(b);
        o->b[0] = h16_at(b + 2);
        break;
    case SL_DTYPE_MXFP4: o->s[0] = sl_e8m0_half(b[0]); break;
    case SL_DTYPE_IQ4_XS: {
        /* ls = scales_l nibble g | (scales_h bits 2g..) << 4, in epi32 lanes g = 0..7 */
        const uint32_t lo = bu32(b + 4);
        const __m128i nib = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(lo & 0x0f0f0f0f)),
                                              _mm_cvtsi32_si128((int)((lo >> 4) & 0x0f0f0f0f)));
        const __m256i hi =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[2] | b[3] << 8),
                                               _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                             _mm256_set1_epi32(3));
        const __m256i ls = _mm256_or_si256(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hi, 4));
        _mm256_storeu_ps(
            o->s, _mm256_mul_ps(_mm256_set1_ps(h16_at(b)),
                                _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))));
        break;
    }
    case SL_DTYPE_Q2_K: {
        const float d = h16_at(b + 80), dmin = h16_at(b + 82);
        const __m128i v = bload(b), m15 = _mm_set1_epi8(15);
        const __m128i sc = _mm_and_si128(v, m15), mn = _mm_and_si128(_mm_srli_epi16(v, 4), m15);
        _mm256_storeu_ps(o->s, bytes8_times(sc, d));
        _mm256_storeu_ps(o->s + 8, bytes8_times(_mm_srli_si128(sc, 8), d));
        _mm256_storeu_ps(o->b, bneg(bytes8_times(mn, dmin)));
        _mm256_storeu_ps(o->b + 8, bneg(bytes8_times(_mm_srli_si128(mn, 8), dmin)));
        break;
    }
    case SL_DTYPE_Q3_K: {
        /* 16 6-bit scales: low 4 bits from bytes 0-7 (low nibbles, then high), top 2 from
         * bytes 8-11 */
        const uint32_t a0 = bu32(b + 96), a1 = bu32(b + 100), a2 = bu32(b + 104);
        const uint32_t k2 = 0x0f0f0f0f, k3 = 0x03030303;
        const __m128i v = _mm_setr_epi32((int)((a0 & k2) | (a2 & k3) << 4),
                                         (int)((a1 & k2) | ((a2 >> 2) & k3) << 4),
                                         (int)(((a0 >> 4) & k2) | ((a2 >> 4) & k3) << 4),
                                         (int)(((a1 >> 4) & k2) | ((a2 >> 6) & k3) << 4));
        const __m256 d = _mm256_set1_ps(h16_at(b + 108));
        const __m256i e = _mm256_set1_epi32(32);
        _mm256_storeu_ps(o->s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
                                                    _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), e))));
        _mm256_storeu_ps(o->s + 8,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                              _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)), e))));
        break;
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        /* scales 0-3 and mins 0-3: the low 6 bits of bytes 0-3 and 4-7; scales and mins 4-7:
         * nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 and 4-7 */
        const uint32_t u0 = bu32(b + 4), u1 = bu32(b + 8), u2 = bu32(b + 12);
        const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
        const __m128i sc =
            _mm_setr_epi32((int)(u0 & k6), (int)((u2 & k4) | ((u0 >> 6) & k2) << 4), 0, 0);
        const __m128i mn =
            _mm_setr_epi32((int)(u1 & k6), (int)(((u2 >> 4) & k4) | ((u1 >> 6) & k2) << 4), 0, 0);
        _mm256_storeu_ps(o->s, bytes8_times(sc, h16_at(b)));
        _mm256_storeu_ps(o->b, bneg(bytes8_times(mn, h16_at(b + 2))));
        break;
    }
    case SL_DTYPE_Q6_K: {
        const __m128i v = bload(b + 192);
        const __m256 d = _mm256_set1_ps(h16_at(b + 208));
        _mm256_storeu_ps(o->s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
        _mm256_storeu_ps(
            o->s + 8,
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
        break;
    }
    default: break;
    }
}

/* The codes of group g of block b. */
B2_ATTR BINL void bgroup_codes(const sl_dtype t, const uint8_t *b, int g, __m128i *c0,
                               __m128i *c1) {
    switch (t) {
    case SL_DTYPE_Q8_0: *c0 = bload(b + 2), *c1 = bload(b + 18); break;
    case SL_DTYPE_Q4_0: {
        const __m128i q = bload(b + 2), e = _mm_set1_epi8(8);
        *c0 = _mm_sub_epi8(lo_nib(q), e), *c1 = _mm_sub_epi8(hi_nib(q), e);
        break;
    }
    case SL_DTYPE_Q4_1: {
        const __m128i q = bload(b + 4);
        *c0 = lo_nib(q), *c1 = hi_nib(q);
        break;
    }
    case SL_DTYPE_Q5_0: {
        __m128i h0, h1;
        q5_high(b + 2, &h0, &h1);
        const __m128i q = bload(b + 6), e = _mm_set1_epi8(16);
        *c0 = _mm_sub_epi8(_mm_or_si128(lo_nib(q), h0), e);
        *c1 = _mm_sub_epi8(_mm_or_si128(hi_nib(q), h1), e);
        break;
    }
    case SL_DTYPE_Q5_1: {
        __m128i h0, h1;
        q5_high(b + 4, &h0, &h1);
        const __m128i q = bload(b + 8);
        *c0 = _mm_or_si128(lo_nib(q), h0), *c1 = _mm_or_si128(hi_nib(q), h1);
        break;
    }
    case SL_DTYPE_MXFP4: {
        const __m128i q = bload(b + 1), kv = table16(sl_kvalues_mxfp4);
        *c0 = _mm_shuffle_epi8(kv, lo_nib(q)), *c1 = _mm_shuffle_epi8(kv, hi_nib(q));
        break;
    }
    case SL_DTYPE_IQ4_NL: {
        const __m128i q = bload(b + 2), kv = table16(sl_kvalues_iq4nl);
        *c0 = _mm_shuffle_epi8(kv, lo_nib(q)), *c1 = _mm_shuffle_epi8(kv, hi_nib(q));
        break;
    }
    case SL_DTYPE_IQ4_XS: {
        const __m128i q = bload(b + 8 + 16 * g), kv = table16(sl_kvalues_iq4nl);
        *c0 = _mm_shuffle_epi8(kv, lo_nib(q)), *c1 = _mm_shuffle_epi8(kv, hi_nib(q));
        break;
    }
    case SL_DTYPE_Q2_K: {
        const uint8_t *q = b + 16 + 32 * (g >> 2);
        const int sh = 2 * (g & 3);
        *c0 = bshift(bload(q), sh, 3), *c1 = bshift(bload(q + 16), sh, 3);
        break;
    }
    case SL_DTYPE_Q3_K: {
        const uint8_t *q = b + 32 + 32 * (g >> 2);
        const int sh = 2 * (g & 3), bit = g; /* hmask bit 4h + j = g */
        const __m128i e = _mm_set1_epi8(4);
        *c0 = _mm_sub_epi8(_mm_or_si128(bshift(bload(q), sh, 3), bit_bytes(bload(b), bit, 4)), e);
        *c1 = _mm_sub_epi8(
            _mm_or_si128(bshift(bload(q + 16), sh, 3), bit_bytes(bload(b + 16), bit, 4)), e);
        break;
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        const uint8_t *q = b + (t == SL_DTYPE_Q5_K ? 48 : 16) + 32 * (g / 2);
        const __m128i q0 = bload(q), q1 = bload(q + 16);
        *c0 = bshift(q0, 4 * (g & 1), 15), *c1 = bshift(q1, 4 * (g & 1), 15);
        if (t == SL_DTYPE_Q5_K) {
            *c0 = _mm_or_si128(*c0, bit_bytes(bload(b + 16), g, 16));
            *c1 = _mm_or_si128(*c1, bit_bytes(bload(b + 32), g, 16));
        }
        break;
    }
    case SL_DTYPE_Q6_K: {
        const int h = g >> 2, c = g & 3;
        const uint8_t *ql = b + 64 * h + 32 * (c & 1), *qh = b + 128 + 32 * h;
        const __m128i l0 = bload(ql), l1 = bload(ql + 16), e = _mm_set1_epi8(32);
        const __m128i n0 = bshift(l0, 4 * (c >> 1), 15), n1 = bshift(l1, 4 * (c >> 1), 15);
        const __m128i t0 = _mm_slli_epi16(bshift(bload(qh), 2 * c, 3), 4);
        const __m128i t1 = _mm_slli_epi16(bshift(bload(qh + 16), 2 * c, 3), 4);
        *c0 = _mm_sub_epi8(_mm_or_si128(n0, t0), e);
        *c1 = _mm_sub_epi8(_mm_or_si128(n1, t1), e);
        break;
    }
    default: break;
    }
}

/* Prefetches (no fault, no out-of-bounds pointer formed) the lines of a block `ahead` bytes on:
 * a row is too short a stream for the hardware prefetchers (see cpu_quant.c). A macro: GCC
 * drops calls to a not-yet-inlined function that only prefetches. */
#define bprefetch(p, bb, ahead)                                                                    \
    do {                                                                                           \
        for (size_t o_ = 0; o_ < (bb); o_ += 64)                                                   \
            _mm_prefetch((const char *)(uintptr_t)((uintptr_t)(p) + (ahead) + o_), _MM_HINT_T0);   \
    } while (0)
#ifndef BPF
#define BPF 2 /* tiles ahead */
#endif

/* ------------------------------------------------------------------ AVX2 */

/* Group g's 32 weights as 4 vectors of 8, in column order. */
B2_ATTR BINL void widen_avx2(const sl_dtype t, __m128i c0, __m128i c1, const bscales *sc, int g,
                             __m256 v[4]) {
    const __m128i c[2] = {c0, c1};
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m128i q = i & 1 ? _mm_srli_si128(c[i >> 1], 8) : c[i >> 1];
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const int k = bslot(t, g, 16 * (i >> 1));
        const __m256 s = _mm256_set1_ps(sc->s[k]);
        v[i] = has_off(t) ? _mm256_fmadd_ps(f, s, _mm256_set1_ps(sc->b[k])) : _mm256_mul_ps(f, s);
    }
}

/* NR rows of W (stride ws bytes) against NT tokens of x (stride xs floats). */
B2_ATTR BINL void btile_avx2(const sl_dtype t, const uint8_t *w, size_t ws, const float *x,
                             size_t xs, float *y, size_t ys, int64_t K, const int NR,
                             const int NT) {
    const int32_t bs = bsize(t);
    const size_t bb = sl_dtype_block_bytes(t), ahead = (size_t)(BPF * NR) * ws;
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += bs) {
        const uint8_t *blk = w + (size_t)(k0 / bs) * bb;
        bscales sc[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            bprefetch(blk + (size_t)r * ws, bb, ahead);
            bblock_scales(t, blk + (size_t)r * ws, &sc[r]);
        }
        for (int g = 0; g < bs / 32; g++) {
            __m256 wv[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m128i c0, c1;
                bgroup_codes(t, blk + (size_t)r * ws, g, &c0, &c1);
                widen_avx2(t, c0, c1, &sc[r], g, wv[r]);
            }
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
#pragma GCC unroll 4
                for (int i = 0; i < NT; i++) {
                    const __m256 xv = _mm256_loadu_ps(x + (size_t)i * xs + k0 + 32 * g + 8 * v);
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++)
                        acc[r][i] = _mm256_fmadd_ps(wv[r][v], xv, acc[r][i]);
                }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++)
            y[(size_t)i * ys + (size_t)r] = sl_hsum256(acc[r][i]);
}

/* One block's weights into dst. */
B2_ATTR BINL void bblock_avx2(const sl_dtype t, const uint8_t *b, float *dst) {
    bscales sc;
    bblock_scales(t, b, &sc);
    for (int g = 0; g < bsize(t) / 32; g++) {
        __m128i c0, c1;
        __m256 v[4];
        bgroup_codes(t, b, g, &c0, &c1);
        widen_avx2(t, c0, c1, &sc, g, v);
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(dst + 32 * g + 8 * i, v[i]);
    }
}

/* --------------------------------------------------------------- AVX-512 */

B5_ATTR BINL void widen_avx512(const sl_dtype t, __m128i c0, __m128i c1, const bscales *sc, int g,
                               __m512 v[2]) {
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1));
    const int k0 = bslot(t, g, 0), k1 = bslot(t, g, 16);
    const __m512 s0 = _mm512_set1_ps(sc->s[k0]), s1 = _mm512_set1_ps(sc->s[k1]);
    if (has_off(t)) {
        v[0] = _mm512_fmadd_ps(f0, s0, _mm512_set1_ps(sc->b[k0]));
        v[1] = _mm512_fmadd_ps(f1, s1, _mm512_set1_ps(sc->b[k1]));
    } else {
        v[0] = _mm512_mul_ps(f0, s0);
        v[1] = _mm512_mul_ps(f1, s1);
    }
}

B5_ATTR BINL void btile_avx512(const sl_dtype t, const uint8_t *w, size_t ws, const float *x,
                               size_t xs, float *y, size_t ys, int64_t K, const int NR,
                               const int NT) {
    const int32_t bs = bsize(t);
    const size_t bb = sl_dtype_block_bytes(t), ahead = (size_t)(BPF * NR) * ws;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += bs) {
        const uint8_t *blk = w + (size_t)(k0 / bs) * bb;
        bscales sc[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            bprefetch(blk + (size_t)r * ws, bb, ahead);
            bblock_scales(t, blk + (size_t)r * ws, &sc[r]);
        }
        for (int g = 0; g < bs / 32; g++) {
            __m512 wv[4][2];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m128i c0, c1;
                bgroup_codes(t, blk + (size_t)r * ws, g, &c0, &c1);
                widen_avx512(t, c0, c1, &sc[r], g, wv[r]);
            }
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++)
#pragma GCC unroll 4
                for (int i = 0; i < NT; i++) {
                    const __m512 xv = _mm512_loadu_ps(x + (size_t)i * xs + k0 + 32 * g + 16 * v);
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++)
                        acc[r][i] = _mm512_fmadd_ps(wv[r][v], xv, acc[r][i]);
                }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++)
            y[(size_t)i * ys + (size_t)r] = sl_hsum512(acc[r][i]);
}

B5_ATTR BINL void bblock_avx512(const sl_dtype t, const uint8_t *b, float *dst) {
    bscales sc;
    bblock_scales(t, b, &sc);
    for (int g = 0; g < bsize(t) / 32; g++) {
        __m128i c0, c1;
        __m512 v[2];
        bgroup_codes(t, b, g, &c0, &c1);
        widen_avx512(t, c0, c1, &sc, g, v);
        _mm512_storeu_ps(dst + 32 * g, v[0]);
        _mm512_storeu_ps(dst + 32 * g + 16, v[1]);
    }
}

/* n weights of blocks at src into dst, one expansion per type. */
#define DEFINE_BDEQUANT(ISA, ATTR)                                                                 \
    ATTR static void bdequant_##ISA(sl_dtype t, const uint8_t *src, float *dst, int64_t n) {       \
        const int32_t bs = sl_dtype_block_size(t);                                                 \
        const size_t bb = sl_dtype_block_bytes(t);                                                 \
        for (int64_t k0 = 0; k0 < n; k0 += bs, src += bb, dst += bs)                               \
            switch (t) {                                                                           \
            case SL_DTYPE_Q8_0: bblock_##ISA(SL_DTYPE_Q8_0, src, dst); break;                      \
            case SL_DTYPE_Q4_0: bblock_##ISA(SL_DTYPE_Q4_0, src, dst); break;                      \
            case SL_DTYPE_Q4_1: bblock_##ISA(SL_DTYPE_Q4_1, src, dst); break;                      \
            case SL_DTYPE_Q5_0: bblock_##ISA(SL_DTYPE_Q5_0, src, dst); break;                      \
            case SL_DTYPE_Q5_1: bblock_##ISA(SL_DTYPE_Q5_1, src, dst); break;                      \
            case SL_DTYPE_MXFP4: bblock_##ISA(SL_DTYPE_MXFP4, src, dst); break;                    \
            case SL_DTYPE_Q2_K: bblock_##ISA(SL_DTYPE_Q2_K, src, dst); break;                      \
            case SL_DTYPE_Q3_K: bblock_##ISA(SL_DTYPE_Q3_K, src, dst); break;                      \
            case SL_DTYPE_Q4_K: bblock_##ISA(SL_DTYPE_Q4_K, src, dst); break;                      \
            case SL_DTYPE_Q5_K: bblock_##ISA(SL_DTYPE_Q5_K, src, dst); break;                      \
            case SL_DTYPE_Q6_K: bblock_##ISA(SL_DTYPE_Q6_K, src, dst); break;                      \
            case SL_DTYPE_IQ4_XS: bblock_##ISA(SL_DTYPE_IQ4_XS, src, dst); break;                  \
            case SL_DTYPE_IQ4_NL: bblock_##ISA(SL_DTYPE_IQ4_NL, src, dst); break;                  \
            default: SL_ASSERT(0);                                                                 \
            }                                                                                      \
    }

DEFINE_BDEQUANT(avx2, B2_ATTR)
DEFINE_BDEQUANT(avx512, B5_ATTR)
/* ---------------------------------------------------------------- driver */

/* Rows [n0, n1) for all T tokens: tiles of 4 x 4, then remainders; one expansion per type. */
#define DEFINE_BROWS(ISA, ATTR)                                                                    \
    ATTR BINL void brows_body_##ISA(const sl_dtype t, float *y, const float *x, const uint8_t *w,  \
                                    size_t ws, int64_t K, int64_t N, int32_t T, int64_t n0,        \
                                    int64_t n1) {                                                  \
        int64_t n = n0;                                                                            \
        for (; n + 4 <= n1; n += 4) {                                                              \
            int32_t i = 0;                                                                         \
            for (; i + 4 <= T; i += 4)                                                             \
                btile_##ISA(t, w + (size_t)n * ws, ws, x + (size_t)i * (size_t)K, (size_t)K,       \
                            y + (size_t)i * (size_t)N + n, (size_t)N, K, 4, 4);                    \
            for (; i < T; i++)                                                                     \
                btile_##ISA(t, w + (size_t)n * ws, ws, x + (size_t)i * (size_t)K, (size_t)K,       \
                            y + (size_t)i * (size_t)N + n, (size_t)N, K, 4, 1);                    \
        }                                                                                          \
        for (; n < n1; n++) {                                                                      \
            int32_t i = 0;                                                                         \
            for (; i + 4 <= T; i += 4)                                                             \
                btile_##ISA(t, w + (size_t)n * ws, ws, x + (size_t)i * (size_t)K, (size_t)K,       \
                            y + (size_t)i * (size_t)N + n, (size_t)N, K, 1, 4);                    \
            for (; i < T; i++)                                                                     \
                btile_##ISA(t, w + (size_t)n * ws, ws, x + (size_t)i * (size_t)K, (size_t)K,       \
                            y + (size_t)i * (size_t)N + n, (size_t)N, K, 1, 1);                    \
        }                                                                                          \
    }                                                                                              \
    ATTR static void brows_##ISA(sl_dtype t, float *y, const float *x, const uint8_t *w,           \
                                 size_t ws, int64_t K, int64_t N, int32_t T, int64_t n0,           \
                                 int64_t n1) {                                                     \
        switch (t) {                                                                               \
        case SL_DTYPE_Q8_0: brows_body_##ISA(SL_DTYPE_Q8_0, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q4_0: brows_body_##ISA(SL_DTYPE_Q4_0, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q4_1: brows_body_##ISA(SL_DTYPE_Q4_1, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q5_0: brows_body_##ISA(SL_DTYPE_Q5_0, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q5_1: brows_body_##ISA(SL_DTYPE_Q5_1, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_MXFP4: brows_body_##ISA(SL_DTYPE_MXFP4, y, x, w, ws, K, N, T, n0, n1);       \
            break;                                                                                 \
        case SL_DTYPE_Q2_K: brows_body_##ISA(SL_DTYPE_Q2_K, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q3_K: brows_body_##ISA(SL_DTYPE_Q3_K, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q4_K: brows_body_##ISA(SL_DTYPE_Q4_K, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q5_K: brows_body_##ISA(SL_DTYPE_Q5_K, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_Q6_K: brows_body_##ISA(SL_DTYPE_Q6_K, y, x, w, ws, K, N, T, n0, n1); break;  \
        case SL_DTYPE_IQ4_XS:                                                                      \
            brows_body_##ISA(SL_DTYPE_IQ4_XS, y, x, w, ws, K, N, T, n0, n1);                       \
            break;                                                                                 \
        case SL_DTYPE_IQ4_NL:                                                                      \
            brows_body_##ISA(SL_DTYPE_IQ4_NL, y, x, w, ws, K, N, T, n0, n1);                       \
            break;                                                                                 \
        default: SL_ASSERT(0);                                                                     \
        }                                                                                          \
    }

DEFINE_BROWS(avx2, B2_ATTR)
DEFINE_BROWS(avx512, B5_ATTR)

void sl_matmul_blocks_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                          int32_t T) {
    sl_matmul_blocks_cpu_path(be, y, x, w, T, SL_QPATH_AUTO);
}

void sl_matmul_blocks_cpu_path(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                               int32_t T, sl_qpath path) {
    SL_ASSERT(w->ndim == 2 && sl_dtype_is_block(w->dtype));
    if (path != SL_QPATH_FLOAT && sl_blocks_int8_available(be, w)) {
        sl_matmul_blocks_int8_cpu(be, y, x, w, T);
        return;
    }
    const int64_t N = w->shape[0], K = w->shape[1];
    SL_ASSERT(K % sl_dtype_block_size(w->dtype) == 0);
    const size_t ws = sl_row_bytes(w->dtype, K);
    const uint8_t *wd = w->data;
    /* Small products are not worth waking a second thread for. */
    const int nth = (N * K * T < (1 << 15) || N < 8) ? 1 : be->n_threads;
    const int64_t n_blocks = (N + ROWS_BLK - 1) / ROWS_BLK;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        const int64_t n0 = b * ROWS_BLK, n1 = SL_MIN(N, n0 + ROWS_BLK);
        switch (be->isa) {
        case SL_ISA_AVX512: brows_avx512(w->dtype, y, x, wd, ws, K, N, T, n0, n1); break;
        case SL_ISA_AVX2: brows_avx2(w->dtype, y, x, wd, ws, K, N, T, n0, n1); break;
        default: brows_scalar(y, x, wd, ws, w->dtype, K, N, T, n0, n1); break;
        }
    }
}

void sl_dequant_row_isa(sl_isa isa, sl_dtype t, const void *src, float *dst, int64_t n) {
    SL_ASSERT(sl_dtype_is_block(t) && n % sl_dtype_block_size(t) == 0);
    switch (isa) {
    case SL_ISA_AVX512: bdequant_avx512(t, src, dst, n); break;
    case SL_ISA_AVX2: bdequant_avx2(t, src, dst, n); break;
    default: sl_dequant_row(t, src, dst, n); break;
    }
}
