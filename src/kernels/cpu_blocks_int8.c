/*
 * Block-type matmul with int8 activations (blocks.h: SL_QPATH_INT8 for Q8_0, Q4_0, Q4_K, Q5_K
 * and Q6_K): x is quantised to int8 once per call, per token and group of 32 columns, and each
 * weight's code meets it in integer multiply-adds (AVX-512 VNNI vpdpbusd; AVX2 vpmaddubsw +
 * vpmaddwd), leaving one float step per 16 or 32 weights instead of one per weight.
 *
 * Activations, per token and group g of 32 columns (AVX2 code, so both kernels quantise alike):
 *   m = max |x_k|,  d_g = m / 127,  xq_k = rint(x_k * min(127 / m, FLT_MAX))   (float32)
 *   X_g = the sum of the group's x: lanes l < 8 of (x_l + x_8+l) + (x_16+l + x_24+l), then
 *         simd.h's horizontal sum (for the formats with an offset)
 * A group whose X is not finite (an Inf or NaN in x, or a sum that overflows) gets xq = 0 and
 * d = NaN, so every output of the token is NaN: defined, and still non-finite for the check on
 * the logits. Columns past K (up to whole 64s) are zero with d = 0.
 *
 * Weights, as blocks.c draws them, are codes u (unsigned bytes) with w = s * (u - z) + b per 16
 * or 32 weights: Q4_0 z = 8, Q6_K z = 32, Q8_0 (signed codes) z = 128 on VNNI (u = q + 128), while
 * AVX2 multiplies q by xq directly (|q| times xq with q's sign: z = 0); Q4_K and Q5_K are centred
 * too (z = 8 and 16, offset b = z*s - dmin*m, in float), which halves the size of s * (u - z) and
 * with it the error below. One output, with lanes of 4 consecutive columns (L = 16 lanes on
 * AVX-512, 8 on AVX2), per 64 columns (AVX2: per 32):
 *   I[l]   = sum over the lane's 4 columns of u * xq  -  z * (sum of those xq)    (exact int32)
 *   acc[l] = fma(float(I[l]), s * d, acc[l])          (s, d: the lane's weight scale and group)
 * and per 256-block of Q4_K/Q5_K first acc[0..7] = fma(b_g, X_g, acc[0..7]) over its 8 groups;
 * y = horizontal sum of acc (simd.h). The order depends only on K and the ISA, never on T, the
 * tile or the thread: a token gives the same bits alone or in a batch.
 *
 * Error against the float path: only x's rounding is new, |xq_k d_g - x_k| <= d_g / 2, so
 *   |y_int8 - y_float| <= sum over groups g of (d_g / 2) * sum_k |s_k (u_k - z)|
 * plus float rounding (s * d, the offsets and the accumulation: ~1e-6 relative), the inner sum
 * over the group's weights less their offsets. The errors of a group's columns are independent
 * and of either sign, so they mostly cancel: typically 0.3-0.5% of the output's rms
 * (tests/unit/test_blocks.c measures it).
 *
 * Per-call data lives in fixed stack buffers (nothing is allocated): a batch too big for them
 * goes through in slices of tokens, rows longer than BQ_MAX columns take the float path.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "kernels/simd.h"

#define INLINE  __attribute__((always_inline))
#define BINL    static inline INLINE
#define B2_ATTR SL_AVX2_ATTR
#define B5_ATTR __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))
#define BQ_MAX  40960 /* most columns (a multiple of 64) of x quantised per slice */
#define BPF     2     /* tiles ahead to prefetch */

int sl_blocks_int8_type(sl_dtype t) {
    return t == SL_DTYPE_Q8_0 || t == SL_DTYPE_Q4_0 || t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K ||
           t == SL_DTYPE_Q6_K;
}

static int cpu_has_vnni(void) {
    return __builtin_cpu_supports("avx512vnni");
}

/* The kernel a backend runs: AVX-512 with VNNI, else AVX2 (AVX-512 without VNNI too). */
static sl_isa int8_isa(const sl_backend *be) {
    if (be->isa >= SL_ISA_AVX512 && cpu_has_vnni()) return SL_ISA_AVX512;
    return be->isa >= SL_ISA_AVX2 ? SL_ISA_AVX2 : SL_ISA_SCALAR;
}

int sl_blocks_int8_on(const sl_backend *be) {
    return int8_isa(be) != SL_ISA_SCALAR;
}

int sl_blocks_int8_available(const sl_backend *be, const sl_tensor *w) {
    return sl_blocks_int8_type(w->dtype) && int8_isa(be) != SL_ISA_SCALAR && w->shape[1] <= BQ_MAX;
}

static inline int bsize(sl_dtype t) {
    return t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K || t == SL_DTYPE_Q6_K ? 256 : 32;
}

/* z of the codes as the ISA's kernel feeds them (see the top). */
static int zero_point(sl_dtype t, sl_isa isa) {
    switch (t) {
    case SL_DTYPE_Q4_0:
    case SL_DTYPE_Q4_K: return 8;
    case SL_DTYPE_Q5_K: return 16;
    case SL_DTYPE_Q6_K: return 32;
    case SL_DTYPE_Q8_0: return isa == SL_ISA_AVX512 ? 128 : 0;
    default: return 0;
    }
}

/* ------------------------------------------------------- activations */

/* One token's x, quantised: Kp = K rounded up to 64. */
typedef struct bq_tok {
    int8_t *xq;  /* [Kp] */
    int32_t *zl; /* [Kp / 4]: -z * (sum of the lane's 4 xq) */
    float *dl;   /* [Kp / 4]: d of the lane's group */
    float *X;    /* [Kp / 32]: the group's sum of x */
} bq_tok;

/* One token's x into o (AVX2: both kernels take the same bytes). A group that K cuts short is
 * read through a zero-padded copy. */
B2_ATTR static void bq_prep(const float *x, int64_t K, int64_t Kp, int z, bq_tok *o) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float pad[32];
    for (int64_t g = 0; g < Kp / 32; g++) {
        const int64_t k0 = 32 * g;
        const float *xg = x + k0;
        if (k0 + 32 > K) {
            const int64_t n = K > k0 ? K - k0 : 0;
            memcpy(pad, x + k0, (size_t)n * sizeof(float));
            memset(pad + n, 0, (size_t)(32 - n) * sizeof(float));
            xg = pad;
        }
        __m256 v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm256_loadu_ps(xg + 8 * j);
        const float X =
            sl_hsum256(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
        __m256 mv =
            _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                          _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const int ok = isfinite(X);
        const float d = ok ? m / 127.0f : NAN;
        const __m256 id = _mm256_set1_ps(fminf(127.0f / m, FLT_MAX)); /* m = 0: x is 0 */
        __m256i q[4];
        for (int j = 0; j < 4; j++) /* rint: the default rounding, to nearest even */
            q[j] = ok ? _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id)) : _mm256_setzero_si256();
        const __m256i b = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(o->xq + k0), b);
        const __m256i s4 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), b), _mm256_set1_epi16(1));
        _mm256_storeu_si256((__m256i *)(o->zl + k0 / 4),
                            _mm256_mullo_epi32(s4, _mm256_set1_epi32(-z)));
        _mm256_storeu_ps(o->dl + k0 / 4, _mm256_set1_ps(d));
        o->X[g] = X;
    }
}

/* ---------------------------------------------------------------- codes */

/* 64 columns (one "unit": a quarter of a 256-block, or two 32-blocks) of a row as two halves of
 * 32 codes in column order (unsigned bytes, Q8_0's signed), and up to 8 weight scales s8 of which
 * lane l of half h (columns 32h + 4l .. + 3) takes s8[sidx(t, p, h, l)]. */
typedef struct bunit {
    __m256i c[2];
    __m256 s8;
} bunit;

BINL int sidx(const sl_dtype t, int p, int h, int l) {
    switch (t) {
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: return 2 * p + h;                   /* a scale per 32: all 8 groups */
    case SL_DTYPE_Q6_K: return 4 * (p & 1) + 2 * h + l / 4; /* a scale per 16: half the 16 */
    default: return h;                                      /* the two 32-blocks' */
    }
}

B2_ATTR BINL float h16(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

B2_ATTR BINL __m256i ld32(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Bytes of v shifted right by n (0..7), masked. */
B2_ATTR BINL __m256i sh8(__m256i v, int n, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(n)),
                            _mm256_set1_epi8((char)mask));
}

/* The 32 codes of a Q4_0 block in column order: its 16 low nibbles, then the high. */
B2_ATTR BINL __m256i q4_0_codes(const uint8_t *b) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(b + 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}

/* Scales of a 256-block: Q4_K/Q5_K s0 per group of 32 and the offsets b; Q6_K s0, s1 per 16. */
typedef struct bkscales {
    __m256 s0, s1, b;
} bkscales;

B2_ATTR BINL void bk_scales(const sl_dtype t, const uint8_t *b, bkscales *o) {
    const float z = t == SL_DTYPE_Q5_K ? 16.0f : 8.0f; /* Q4_K/Q5_K's centre (zero_point) */
    if (t == SL_DTYPE_Q6_K) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(b + 192));
        const __m256 d = _mm256_set1_ps(h16(b + 208));
        o->s0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
        o->s1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
        o->b = _mm256_setzero_ps();
        return;
    }
    /* 6-bit scales and mins (blocks.c): scales 0-3 and mins 0-3 the low 6 bits of bytes 0-3 and
     * 4-7; 4-7 the nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 and 4-7 */
    uint32_t u[3];
    memcpy(u, b + 4, 12);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    const __m128i sc =
        _mm_setr_epi32((int)(u[0] & k6), (int)((u[2] & k4) | ((u[0] >> 6) & k2) << 4), 0, 0);
    const __m128i mn =
        _mm_setr_epi32((int)(u[1] & k6), (int)(((u[2] >> 4) & k4) | ((u[1] >> 6) & k2) << 4), 0, 0);
    o->s0 = _mm256_mul_ps(_mm256_set1_ps(h16(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    const __m256 m =
        _mm256_mul_ps(_mm256_set1_ps(h16(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    o->b = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(z), o->s0), m);
    o->s1 = o->s0;
}

/* Unit p (0..3) of a 256-block b (its scales in ks), or of the 32-blocks b and b + bb (two == 0:
 * b is the row's last block, the second half is zero). */
B2_ATTR BINL void bunit_get(const sl_dtype t, const uint8_t *b, size_t bb, int p, int two,
                            const bkscales *ks, bunit *o) {
    switch (t) {
    case SL_DTYPE_Q8_0:
    case SL_DTYPE_Q4_0: {
        const uint8_t *b1 = b + bb;
        o->c[0] = t == SL_DTYPE_Q8_0 ? ld32(b + 2) : q4_0_codes(b);
        o->c[1] = !two                 ? _mm256_setzero_si256()
                  : t == SL_DTYPE_Q8_0 ? ld32(b1 + 2)
                                       : q4_0_codes(b1);
        const int h1 = two ? b1[0] | b1[1] << 8 : 0;
        o->s8 = _mm256_castps128_ps256(
            _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(b[0] | b[1] << 8), h1, 1)));
        break;
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        /* groups 2p (low nibbles) and 2p + 1 (high) of the same 32 bytes */
        const __m256i q = ld32(b + (t == SL_DTYPE_Q5_K ? 48 : 16) + 32 * p);
        o->c[0] = _mm256_and_si256(q, _mm256_set1_epi8(15));
        o->c[1] = sh8(q, 4, 15);
        if (t == SL_DTYPE_Q5_K) {
            const __m256i qh = ld32(b + 16);
            for (int h = 0; h < 2; h++) {
                const __m256i m = _mm256_set1_epi8((char)(1 << (2 * p + h)));
                o->c[h] = _mm256_or_si256(
                    o->c[h], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m),
                                              _mm256_set1_epi8(16)));
            }
        }
        o->s8 = ks->s0;
        break;
    }
    case SL_DTYPE_Q6_K: {
        /* unit p: half hf = p / 2, 32-column fields c = 2 (p % 2) and c + 1 */
        const int hf = p >> 1, up = p & 1;
        const uint8_t *ql = b + 64 * hf, *qhp = b + 128 + 32 * hf;
        const __m256i qh = ld32(qhp);
        for (int h = 0; h < 2; h++) {
            const __m256i nib = sh8(ld32(ql + 32 * h), 4 * up, 15);
            const __m256i top = _mm256_slli_epi16(sh8(qh, 2 * (2 * up + h), 3), 4);
            o->c[h] = _mm256_or_si256(nib, top);
        }
        o->s8 = hf ? ks->s1 : ks->s0; /* scales 8hf + 4up .. + 3 at sidx */
        break;
    }
    default: break;
    }
}

/* The lanes' scale indices into s8 (sidx), as a vector. */
B2_ATTR BINL __m256i sidx256(const sl_dtype t, int p, int h) {
    return _mm256_setr_epi32(sidx(t, p, h, 0), sidx(t, p, h, 1), sidx(t, p, h, 2), sidx(t, p, h, 3),
                             sidx(t, p, h, 4), sidx(t, p, h, 5), sidx(t, p, h, 6),
                             sidx(t, p, h, 7));
}

/* --------------------------------------------------------------- tiles */

/* What a tile reads: rows and tokens. */
typedef struct bq_job {
    const uint8_t *w; /* N rows of blocks, stride ws */
    size_t ws, bb;
    int64_t N, K, Kp;
    int32_t T;
    sl_dtype t;
    const int8_t *xq; /* [T, Kp] */
    const int32_t *zl;
    const float *dl; /* [T, Kp / 4] */
    const float *X;  /* [T, Kp / 32] */
    float *y;        /* [T, N] */
} bq_job;

#define bprefetch(p, n, ahead)                                                                     \
    do {                                                                                           \
        for (size_t o_ = 0; o_ < (n); o_ += 64)                                                    \
            _mm_prefetch((const char *)(uintptr_t)((uintptr_t)(p) + (ahead) + o_), _MM_HINT_T0);   \
    } while (0)

/* The tile body shared by both ISAs: NR rows from n, NT tokens from t0. UNIT(r, i, u, k) adds
 * unit u's contribution to acc[r][i] (k: its first column); OFFS(r, i, blk) the offsets of the
 * 256-block at column blk. */
#define BQ_TILE(ISA, ATTR, VEC, ZERO, HSUM, UNIT, OFFS)                                            \
    /* unit p of the 256-block, or the 32-blocks, at column k (two: both 32-blocks there) */       \
    ATTR BINL void bq_unit_##ISA(const bq_job *a, const sl_dtype t, int64_t n, int32_t t0,         \
                                 const int NR, const int NT, VEC acc[4][4], bkscales *ks,          \
                                 int64_t k, const int p, const int two, size_t ahead) {            \
        const int big = bsize(t) == 256;                                                           \
        const size_t off = (size_t)(k / bsize(t)) * a->bb;                                         \
        bunit un[4];                                                                               \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                                     \
            const uint8_t *b = a->w + (size_t)(n + r) * a->ws + off;                               \
            if (p == 0) bprefetch(b, big ? a->bb : 2 * a->bb, ahead);                              \
            if (big && p == 0) bk_scales(t, b, &ks[r]);                                            \
            bunit_get(t, b, a->bb, p, two, &ks[r], &un[r]);                                        \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) {                                     \
            _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                                 \
                if (big && p == 0 && t != SL_DTYPE_Q6_K) OFFS(r, i, k);                            \
                UNIT(r, i, k);                                                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    ATTR BINL void bq_tile_##ISA(const bq_job *a, const sl_dtype t, int64_t n, int32_t t0,         \
                                 const int NR, const int NT) {                                     \
        const size_t ahead = (size_t)(BPF * NR) * a->ws;                                           \
        VEC acc[4][4];                                                                             \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)                                       \
            _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) acc[r][i] = ZERO;                 \
        bkscales ks[4];                                                                            \
        if (bsize(t) == 256) {                                                                     \
            for (int64_t k = 0; k < a->K; k += 256)                                                \
                _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)                                \
                    bq_unit_##ISA(a, t, n, t0, NR, NT, acc, ks, k + 64 * p, p, 1, ahead);          \
        } else {                                                                                   \
            int64_t k = 0;                                                                         \
            for (; k + 64 <= a->K; k += 64)                                                        \
                bq_unit_##ISA(a, t, n, t0, NR, NT, acc, ks, k, 0, 1, ahead);                       \
            if (k < a->K) bq_unit_##ISA(a, t, n, t0, NR, NT, acc, ks, k, 0, 0, ahead);             \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)                                       \
            _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++)                                   \
                a->y[(size_t)(t0 + i) * (size_t)a->N + (size_t)(n + r)] = HSUM(acc[r][i]);         \
    }

/* ------------------------------------------------------- AVX-512 VNNI */

B5_ATTR BINL __m512i sidx512(const sl_dtype t, int p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(sidx256(t, p, 0)), sidx256(t, p, 1), 1);
}

/* unit of token t0 + i, row r: 16 int32 lanes of u * xq (+ z * ...), times s * d */
#define UNIT512(r, i, k)                                                                           \
    do {                                                                                           \
        const size_t tx = (size_t)(t0 + i);                                                        \
        __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(un[r].c[0]), un[r].c[1], 1);         \
        if (t == SL_DTYPE_Q8_0) c = _mm512_xor_si512(c, _mm512_set1_epi8((char)0x80));             \
        const __m512i xv = _mm512_loadu_si512((const void *)(a->xq + tx * (size_t)a->Kp + k));     \
        const size_t lo = tx * (size_t)(a->Kp / 4) + (size_t)(k / 4);                              \
        const __m512i z = _mm512_loadu_si512((const void *)(a->zl + lo));                          \
        const __m512i I = _mm512_dpbusd_epi32(z, c, xv);                                           \
        const __m512 sv = _mm512_permutexvar_ps(sidx512(t, p), _mm512_castps256_ps512(un[r].s8));  \
        const __m512 sd = _mm512_mul_ps(sv, _mm512_loadu_ps(a->dl + lo));                          \
        acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), sd, acc[r][i]);                         \
    } while (0)

#define OFFS512(r, i, k)                                                                           \
    acc[r][i] =                                                                                    \
        _mm512_fmadd_ps(_mm512_zextps256_ps512(ks[r].b),                                           \
                        _mm512_zextps256_ps512(_mm256_loadu_ps(                                    \
                            a->X + (size_t)(t0 + i) * (size_t)(a->Kp / 32) + (size_t)(k / 32))),   \
                        acc[r][i])

BQ_TILE(avx512, B5_ATTR, __m512, _mm512_setzero_ps(), sl_hsum512, UNIT512, OFFS512)

/* ----------------------------------------------------------------- AVX2 */

/* 8 int32 lanes of q * xq over 32 columns (vpmaddubsw pairs never saturate: |u| <= 63, or
 * |q| <= 128 for Q8_0, times |xq| <= 127, twice, is at most 32512). */
B2_ATTR BINL __m256i dot32_avx2(const sl_dtype t, __m256i c, __m256i xv) {
    const __m256i p = t == SL_DTYPE_Q8_0
                          ? _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(xv, c))
                          : _mm256_maddubs_epi16(c, xv);
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

#define UNIT256(r, i, k)                                                                           \
    do {                                                                                           \
        const size_t tx = (size_t)(t0 + i);                                                        \
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                      \
            const __m256i xv =                                                                     \
                _mm256_loadu_si256((const __m256i *)(a->xq + tx * (size_t)a->Kp + k + 32 * h));    \
            const size_t lo = tx * (size_t)(a->Kp / 4) + (size_t)(k / 4) + 8 * (size_t)h;          \
            __m256i I = dot32_avx2(t, un[r].c[h], xv);                                             \
            I = _mm256_add_epi32(I, _mm256_loadu_si256((const __m256i *)(a->zl + lo)));            \
            const __m256 sd = _mm256_mul_ps(_mm256_permutevar8x32_ps(un[r].s8, sidx256(t, p, h)),  \
                                            _mm256_loadu_ps(a->dl + lo));                          \
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sd, acc[r][i]);                     \
        }                                                                                          \
    } while (0)

#define OFFS256(r, i, k)                                                                           \
    acc[r][i] = _mm256_fmadd_ps(                                                                   \
        ks[r].b,                                                                                   \
        _mm256_loadu_ps(a->X + (size_t)(t0 + i) * (size_t)(a->Kp / 32) + (size_t)(k / 32)),        \
        acc[r][i])

BQ_TILE(avx2, B2_ATTR, __m256, _mm256_setzero_ps(), sl_hsum256, UNIT256, OFFS256)

/* --------------------------------------------------------------- driver */

/* Rows [n0, n1) for all tokens: tiles of 4 x 4, then remainders; one expansion per type. */
#define BQ_ROWS_BODY(ISA, T_)                                                                      \
    do {                                                                                           \
        int64_t n = n0;                                                                            \
        for (; n + 4 <= n1; n += 4) {                                                              \
            int32_t i = 0;                                                                         \
            for (; i + 4 <= a->T; i += 4)                                                          \
                bq_tile_##ISA(a, T_, n, i, 4, 4);                                                  \
            for (; i < a->T; i++)                                                                  \
                bq_tile_##ISA(a, T_, n, i, 4, 1);                                                  \
        }                                                                                          \
        for (; n < n1; n++) {                                                                      \
            int32_t i = 0;                                                                         \
            for (; i + 4 <= a->T; i += 4)                                                          \
                bq_tile_##ISA(a, T_, n, i, 1, 4);                                                  \
            for (; i < a->T; i++)                                                                  \
                bq_tile_##ISA(a, T_, n, i, 1, 1);                                                  \
        }                                                                                          \
    } while (0)

#define BQ_ROWS(ISA, ATTR)                                                                         \
    ATTR static void bq_rows_##ISA(const bq_job *a, int64_t n0, int64_t n1) {                      \
        switch (a->t) {                                                                            \
        case SL_DTYPE_Q8_0: BQ_ROWS_BODY(ISA, SL_DTYPE_Q8_0); break;                               \
        case SL_DTYPE_Q4_0: BQ_ROWS_BODY(ISA, SL_DTYPE_Q4_0); break;                               \
        case SL_DTYPE_Q4_K: BQ_ROWS_BODY(ISA, SL_DTYPE_Q4_K); break;                               \
        case SL_DTYPE_Q5_K: BQ_ROWS_BODY(ISA, SL_DTYPE_Q5_K); break;                               \
        case SL_DTYPE_Q6_K: BQ_ROWS_BODY(ISA, SL_DTYPE_Q6_K); break;                               \
        default: SL_ASSERT(0);                                                                     \
        }                                                                                          \
    }

BQ_ROWS(avx512, B5_ATTR)
BQ_ROWS(avx2, B2_ATTR)

void sl_matmul_blocks_int8_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                               int32_t T) {
    SL_ASSERT(sl_blocks_int8_available(be, w));
    const sl_isa isa = int8_isa(be);
    const int64_t N = w->shape[0], K = w->shape[1], Kp = (K + 63) / 64 * 64;
    const int32_t slice = (int32_t)(BQ_MAX / Kp);
    int8_t xq[BQ_MAX] __attribute__((aligned(64)));
    int32_t zl[BQ_MAX / 4] __attribute__((aligned(64)));
    float dl[BQ_MAX / 4] __attribute__((aligned(64)));
    float X[BQ_MAX / 32] __attribute__((aligned(64)));
    const int z = zero_point(w->dtype, isa);
    for (int32_t ts = 0; ts < T; ts += slice) {
        const int32_t Ts = SL_MIN(slice, T - ts);
        for (int32_t i = 0; i < Ts; i++) {
            bq_tok o = {.xq = xq + (size_t)i * (size_t)Kp,
                        .zl = zl + (size_t)i * (size_t)(Kp / 4),
                        .dl = dl + (size_t)i * (size_t)(Kp / 4),
                        .X = X + (size_t)i * (size_t)(Kp / 32)};
            bq_prep(x + (size_t)(ts + i) * (size_t)K, K, Kp, z, &o);
        }
        const bq_job a = {.w = w->data,
                          .ws = sl_row_bytes(w->dtype, K),
                          .bb = sl_dtype_block_bytes(w->dtype),
                          .N = N,
                          .K = K,
                          .Kp = Kp,
                          .T = Ts,
                          .t = w->dtype,
                          .xq = xq,
                          .zl = zl,
                          .dl = dl,
                          .X = X,
                          .y = y + (size_t)ts * (size_t)N};
        /* Small products are not worth waking a second thread for. */
        const int nth = (N * K * Ts < (1 << 15) || N < 8) ? 1 : be->n_threads;
        const int64_t n_blocks = (N + 15) / 16; /* rows per work item: keeps tiles of 4 whole */
#pragma omp parallel for num_threads(nth) schedule(static)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t n0 = b * 16, n1 = SL_MIN(N, n0 + 16);
            if (isa == SL_ISA_AVX512)
                bq_rows_avx512(&a, n0, n1);
            else
                bq_rows_avx2(&a, n0, n1);
        }
    }
}
