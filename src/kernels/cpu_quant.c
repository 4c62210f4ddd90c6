/*
 * Group-wise affine quantisation (Q8/Q4, groups of 64, BF16 scale and bias)
 * and the fused CPU matmul over it. See quant.h for the format.
 *
 * The matmul never widens the matrix. Codes are taken relative to a centre z
 * (c = q - z, bias shifted to b' = bias + z * scale, so w = c * scale + b').
 * One output y[t][n], for the SIMD ISAs (L = 16 lanes for AVX-512, 8 for AVX2):
 *   per group g:    d[l]   = sum of c * x over the group's columns in lane l
 *                            (a mul, then FMAs in column order)
 *                   acc[l] = fma(scale_g, d[l], acc[l])
 *   per chunk of 16 groups g0..g0+15, after its groups (lanes are groups now):
 *                   acc    = fma(b'[g0..], X[g0..], acc)     (AVX2: two halves)
 *   at the end:     y = horizontal sum of acc
 * where X_g, the sum of x over group g (a fixed lane tree, then a horizontal
 * sum), is computed once per call and token, not per row. The scalar
 * reference does the same with lanes of 1 and the bias term per group. A
 * short last group is computed as a full one on zero-padded copies of x and q
 * (padding adds exact zeros). That order depends only on K and the ISA,
 * never on T, the tile shape or the thread, so a token gives the same bits
 * alone (decode) or inside a batch.
 *
 * Centring halves the magnitude of the partial sums and so their rounding
 * error. It is free where the codes go through a table (AVX-512 Q4) and costs
 * one integer op elsewhere, which the memory-bound Q8 SIMD paths skip (z = 0);
 * AVX2 Q4 pays it, and the scalar reference centres both (z = 128 for Q8).
 *
 * Q4 codes are stored low nibble first: byte j of a group holds elements 2j
 * (low) and 2j+1 (high). The SIMD paths widen the bytes to 32-bit lanes and
 * split them into the low nibbles = the even elements and the high nibbles =
 * the odd ones, so x is de-interleaved instead of the weights: for small
 * batches once per call (AVX-512), otherwise once per group and tile.
 *
 * Tiles of up to 4 rows x 4 tokens reuse each widened weight vector across
 * the tokens; threads split the rows in blocks of 16. Decode streams the
 * codes: every tile prefetches the rows QPF tiles below it, since a row is
 * too short a stream for the hardware prefetchers to lock on to. Per-call
 * data lives in fixed stack buffers (nothing is allocated); a batch too big
 * for them goes through in slices of tokens.
 *
 * Q8 and Q4 on CPUs with AVX-512 VNNI take another route by default: x
 * quantised to int8 per group once per call, integer dot products with the
 * codes, one float step per group (see "AVX-512 VNNI" below and quant.h).
 * The other ISAs keep x in float.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "kernels/quant.h"
#include "kernels/simd.h"

#define QG  SL_QGROUP /* columns per group */
#define QCH 16        /* groups whose scales and biases a tile widens at once */
#ifndef QPF
#define QPF 2
#endif
/* The tiles index small arrays of vectors by loop counters: only unrolled fully
 * ("#pragma GCC unroll", which -O2 needs) and inlined with their constant
 * shapes do those arrays live in registers. */
#define QINLINE static inline __attribute__((always_inline))

static inline int is_q4(sl_dtype dt) {
    return dt == SL_DTYPE_Q4;
}
/* Bytes of one full group of codes. */
static inline size_t group_bytes(int q4) {
    return q4 ? QG / 2 : QG;
}

/* Code of element k of a row. */
static inline unsigned code_at(const uint8_t *row, int q4, int64_t k) {
    return q4 ? (row[k >> 1] >> ((k & 1) * 4)) & 15u : row[k];
}

/* -------------------------------------------------------- quantise */

#define BF16_MAX_BITS 0x7f7fu /* largest finite bf16, 3.39e38 */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Largest finite bf16 <= v (clamped to -BF16_MAX). v is finite. */
static uint16_t bf16_floor(double v) {
    const double big = (double)sl_bf16_to_f32(BF16_MAX_BITS);
    if (v <= -big) return (uint16_t)(0x8000u | BF16_MAX_BITS);
    if (v >= big) return (uint16_t)BF16_MAX_BITS;
    float f = (float)v;
    if ((double)f > v) f = nextafterf(f, -INFINITY);
    const uint32_t u = f32_bits(f);
    uint16_t h = (uint16_t)(u >> 16);
    if ((u & 0xffffu) && (u >> 31)) h++; /* negative: truncation went up, step one further down */
    return h;
}

/* Smallest bf16 >= v for v > 0 (clamped to BF16_MAX): never zero. */
static uint16_t bf16_ceil_pos(double v) {
    if (v >= (double)sl_bf16_to_f32(BF16_MAX_BITS)) return (uint16_t)BF16_MAX_BITS;
    float f = (float)v;
    if ((double)f < v) f = nextafterf(f, INFINITY);
    const uint32_t u = f32_bits(f);
    uint16_t h = (uint16_t)(u >> 16);
    if (u & 0xffffu) h++;
    return h;
}

/*
 * Per group: bias = min rounded down to BF16, scale = (max - bias) / qmax
 * rounded up to BF16, so every code fits without clamping and the error of
 * each weight is at most scale / 2 (plus float rounding). A constant group
 * that BF16 holds exactly gets scale 1 and q = 0. Non-finite inputs are
 * ignored for the range (NaN codes as 0, +-inf clamp), so scales and biases
 * are always finite.
 */
void sl_quantize_row(sl_dtype dt, const float *w, int64_t K, uint8_t *q, uint16_t *scales,
                     uint16_t *biases) {
    SL_ASSERT(sl_dtype_is_quant(dt) && K >= 0);
    const int q4 = is_q4(dt);
    const int qmax = q4 ? 15 : 255;
    if (q4) memset(q, 0, sl_row_bytes(dt, K));
    const int64_t G = sl_qgroups(K);
    for (int64_t g = 0; g < G; g++) {
        const int64_t k0 = g * QG, k1 = SL_MIN(K, k0 + QG);
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t k = k0; k < k1; k++)
            if (isfinite(w[k])) {
                mn = w[k] < mn ? w[k] : mn;
                mx = w[k] > mx ? w[k] : mx;
            }
        if (mn > mx) mn = mx = 0; /* no finite value */
        const uint16_t bh = bf16_floor(mn);
        const double bias = sl_bf16_to_f32(bh);
        const double range = (double)mx - bias;
        const uint16_t sh = range > 0 ? bf16_ceil_pos(range / qmax) : 0x3f80u /* 1.0 */;
        const double scale = sl_bf16_to_f32(sh);
        scales[g] = sh;
        biases[g] = bh;
        for (int64_t k = k0; k < k1; k++) {
            const double v = ((double)w[k] - bias) / scale;
            const unsigned c = !(v > 0)    ? 0u
                               : v >= qmax ? (unsigned)qmax
                                           : (unsigned)floor(v + 0.5);
            if (q4)
                q[k >> 1] |= (uint8_t)(c << ((k & 1) * 4));
            else
                q[k] = (uint8_t)c;
        }
    }
}

void sl_dequantize_row(const sl_tensor *w, int64_t n, float *out) {
    SL_ASSERT(w->ndim == 2 && sl_dtype_is_quant(w->dtype));
    const int64_t K = w->shape[1], G = sl_tensor_qgroups(w, K), gs = sl_tensor_group(w);
    const sl_dtype sd = sl_tensor_sdtype(w);
    const int q4 = is_q4(w->dtype);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)n * sl_row_bytes(w->dtype, K);
    for (int64_t k = 0; k < K; k++) {
        const float s = sl_qparam(w->scales, sd, (size_t)(n * G + k / gs));
        const float b = sl_qparam(w->biases, sd, (size_t)(n * G + k / gs));
        out[k] = (float)code_at(row, q4, k) * s + b;
    }
}

/* ---------------------------------------------------------- matmul */

typedef struct qmm {
    const uint8_t *w; /* N rows of codes, stride ws bytes */
    size_t ws;
    const uint16_t *sc, *bi; /* [N, Gs] BF16 when plain */
    const float *x;          /* [T, K] */
    float *y;                /* [T, N] */
    int64_t N, K, G;         /* G: groups of QG columns, what the SIMD paths walk */
    int32_t T;
    /* The tensor's own groups: grp columns each, Gs a row, scales and biases of dtype sdt at
     * scv/biv. plain: grp == QG and BF16 (sluice's packs), the only layout the SIMD paths read
     * directly; other multiples of QG go through a widening step per chunk, and other group
     * sizes take the scalar reference. */
    const void *scv, *biv;
    sl_dtype sdt;
    int64_t Gs, grp;
    int plain;
    const float *xsum;  /* SIMD: [T, Gp] sums of x per group (zero past G), see xsums */
    int64_t Gp;         /* G rounded up to whole chunks */
    const float *xperm; /* AVX-512 Q4, small batches: [T, G * 64] x in the codes' order, or NULL */
    /* Int8 path (VNNI), per token and chunk of 16 groups (see q_vnni_prep):
     * xq 16 vectors of quantised x; xd, xr [T, Gp] scales of xq and 8 * (X - d * sum xq),
     * with xsum, in the lane order of the chunk. */
    const uint8_t *xq;
    const float *xd, *xr;
} qmm;

/* Reference: the scalar ISA's order (lanes of 1), codes centred on z (see top); per group of
 * the tensor's own size. */
static float qdot_scalar(const qmm *a, int q4, int64_t n, const float *x) {
    const uint8_t *row = a->w + (size_t)n * a->ws;
    const int z = q4 ? 8 : 128;
    float acc = 0;
    for (int64_t g = 0; g < a->Gs; g++) {
        const int64_t k0 = g * a->grp, k1 = SL_MIN(a->K, k0 + a->grp);
        float d = 0, xs = 0;
        for (int64_t k = k0; k < k1; k++) {
            d += (float)((int)code_at(row, q4, k) - z) * x[k];
            xs += x[k];
        }
        const float s = sl_qparam(a->scv, a->sdt, (size_t)(n * a->Gs + g));
        const float b = sl_qparam(a->biv, a->sdt, (size_t)(n * a->Gs + g)) + (float)z * s;
        acc += s * d;
        acc += b * xs;
    }
    return acc;
}

static void qrows_scalar(const qmm *a, int q4, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++)
        for (int32_t t = 0; t < a->T; t++)
            a->y[(size_t)t * (size_t)a->N + (size_t)n] =
                qdot_scalar(a, q4, n, a->x + (size_t)t * (size_t)a->K);
}

/*
 * What every SIMD tile shares. A tile is NR rows from n and NT tokens from t0;
 * it walks the groups in chunks of QCH whose scales and biases it widens to
 * float first (the bias already shifted for centred codes: bias + z * scale).
 */
typedef struct qtile {
    const float *xr[4];   /* token rows of x */
    const uint8_t *qr[4]; /* code rows */
    const uint16_t *scr, *bir;
    int64_t n;                   /* first row */
    size_t pf_ahead, pf_ahead_s; /* prefetch distances, bytes */
    float sf[4][QCH] __attribute__((aligned(64)));
    float bf[4][QCH] __attribute__((aligned(64)));
    float xpad[4][QG] __attribute__((aligned(64)));
    uint8_t qpad[4][QG];
} qtile;

QINLINE void qtile_init(qtile *f, const qmm *a, int64_t n, int32_t t0, const int NR, const int NT) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++)
        f->xr[t] = a->x + (size_t)(t0 + t) * (size_t)a->K;
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
        f->qr[r] = a->w + (size_t)(n + r) * a->ws;
    f->n = n;
    f->scr = a->sc + (size_t)(n * a->Gs);
    f->bir = a->bi + (size_t)(n * a->Gs);
    /* Each row is a short stream (K or K/2 bytes) that the hardware
     * prefetchers barely pick up: fetch the same columns QPF tiles down. */
    f->pf_ahead = (size_t)(QPF * NR) * a->ws;
    f->pf_ahead_s = (size_t)(QPF * NR * a->Gs) * sizeof(uint16_t);
}

/* Prefetches the line ahead bytes after p, which may lie past the array (as
 * an integer: no out-of-bounds pointer is formed; prefetches never fault).
 * A macro: GCC deems a function that only prefetches pure, and drops calls
 * to it that it has not inlined yet. */
#ifndef QPF_HINT
#define QPF_HINT _MM_HINT_T0
#endif
#define qprefetch(p, ahead)                                                                        \
    _mm_prefetch((const char *)(uintptr_t)((uintptr_t)(p) + (ahead)), QPF_HINT)

/* Pointers to group g of every token and row: in place for a full group,
 * zero-padded copies for the short last one (padding adds exact zeros). */
QINLINE void qtile_group(qtile *f, const qmm *a, int q4, int64_t g, const int NR, const int NT,
                         const float **xg, const uint8_t **qg) {
    const size_t gb = group_bytes(q4);
    if ((g + 1) * QG <= a->K) {
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++)
            xg[t] = f->xr[t] + g * QG;
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            qg[r] = f->qr[r] + (size_t)g * gb;
            qprefetch(qg[r], f->pf_ahead);
        }
        return;
    }
    const size_t rem = (size_t)(a->K - g * QG), rb = a->ws - (size_t)g * gb;
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) {
        memcpy(f->xpad[t], f->xr[t] + g * QG, rem * sizeof(float));
        memset(f->xpad[t] + rem, 0, (QG - rem) * sizeof(float));
        xg[t] = f->xpad[t];
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        memcpy(f->qpad[r], f->qr[r] + (size_t)g * gb, rb);
        memset(f->qpad[r] + rb, 0, QG - rb);
        qg[r] = f->qpad[r];
    }
}

/* Scales and biases of groups g0 .. g0+ng-1 as float; bias + z * scale. A group of QG columns
 * lies inside one of the tensor's groups when grp is a multiple of QG: that one's values. */
static void qtile_chunk_wide(qtile *f, const qmm *a, int64_t g0, int ng, float z, int NR) {
    for (int r = 0; r < NR; r++) {
        const size_t base = (size_t)((f->n + r) * a->Gs);
        for (int i = 0; i < QCH; i++) {
            const size_t j = base + (size_t)((g0 + i) * QG / a->grp);
            f->sf[r][i] = i < ng ? sl_qparam(a->scv, a->sdt, j) : 0.0f;
            f->bf[r][i] = i < ng ? sl_qparam(a->biv, a->sdt, j) + z * f->sf[r][i] : 0.0f;
        }
    }
}

QINLINE void qtile_chunk_scalar(qtile *f, const qmm *a, int64_t g0, int ng, float z, const int NR) {
    if (!a->plain) {
        qtile_chunk_wide(f, a, g0, ng, z, NR);
        return;
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        const uint16_t *s = f->scr + (size_t)(r * a->Gs + g0),
                       *b = f->bir + (size_t)(r * a->Gs + g0);
        qprefetch(s, f->pf_ahead_s);
        qprefetch(b, f->pf_ahead_s);
        for (int i = 0; i < QCH; i++) {
            f->sf[r][i] = i < ng ? sl_bf16_to_f32(s[i]) : 0.0f;
            f->bf[r][i] = i < ng ? sl_bf16_to_f32(b[i]) + z * f->sf[r][i] : 0.0f;
        }
    }
}

/* ------------------------------------------------------------ AVX2 */

/* The group of x starting at column k0 as QG floats: in place, or copied into pad and
 * zero-filled when the row of K ends inside it. */
static inline const float *q_group(const float *x, int64_t K, int64_t k0, float *pad) {
    if (k0 + QG <= K) return x + k0;
    memcpy(pad, x + k0, (size_t)(K - k0) * sizeof(float));
    memset(pad + (K - k0), 0, (size_t)(k0 + QG - K) * sizeof(float));
    return pad;
}

#define AVX2_ATTR SL_AVX2_ATTR
#define AVX2_INL  AVX2_ATTR QINLINE

/* Codes 8j .. 8j+7 of a group in kernel order, as floats (j = 0..7); Q4 centred. */
AVX2_INL __m256 q_avx2_codes(const uint8_t *q, int q4, int j) {
    if (!q4)
        return _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j))));
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * (j >> 1))));
    b = (j & 1) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(8)));
}

/* Sums of x over groups g0 .. g0+QCH-1 of a row of K (zero past the last group). */
AVX2_ATTR static void q_avx2_xsums(const float *x, int64_t K, int64_t g0, float *out) {
    float pad[QG];
    for (int i = 0; i < QCH; i++) {
        const int64_t k0 = (g0 + i) * QG;
        if (k0 >= K) {
            out[i] = 0;
            continue;
        }
        const float *xg = q_group(x, K, k0, pad);
        __m256 v[8];
#pragma GCC unroll 16
        for (int j = 0; j < 8; j++)
            v[j] = _mm256_loadu_ps(xg + 8 * j);
        out[i] = sl_hsum256(
            _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])),
                          _mm256_add_ps(_mm256_add_ps(v[4], v[5]), _mm256_add_ps(v[6], v[7]))));
    }
}

AVX2_INL void q_avx2_tile(const qmm *a, int q4, int64_t n, int32_t t0, const int NR, const int NT) {
    qtile f;
    qtile_init(&f, a, n, t0, NR, NT);
    float xbuf[4][QG] __attribute__((aligned(32)));
    __m256 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < a->G; g0 += QCH) {
        const int ng = (int)SL_MIN(QCH, a->G - g0);
        qtile_chunk_scalar(&f, a, g0, ng, q4 ? 8.0f : 0.0f, NR);
        for (int gi = 0; gi < ng; gi++) {
            const float *xg[4], *xp[4];
            const uint8_t *qg[4];
            qtile_group(&f, a, q4, g0 + gi, NR, NT, xg, qg);
            /* x in the codes' order (Q4: per 16 columns the evens, then the odds). */
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) {
                if (q4) {
                    __m256 v[8];
#pragma GCC unroll 16
                    for (int j = 0; j < 8; j++)
                        v[j] = _mm256_loadu_ps(xg[t] + 8 * j);
#pragma GCC unroll 16
                    for (int c = 0; c < 4; c++) {
                        const __m256 lo = v[2 * c], hi = v[2 * c + 1];
                        const __m256d ev = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88));
                        const __m256d od = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd));
                        _mm256_store_ps(xbuf[t] + 16 * c,
                                        _mm256_castpd_ps(_mm256_permute4x64_pd(ev, 0xd8)));
                        _mm256_store_ps(xbuf[t] + 16 * c + 8,
                                        _mm256_castpd_ps(_mm256_permute4x64_pd(od, 0xd8)));
                    }
                    xp[t] = xbuf[t];
                } else {
                    xp[t] = xg[t];
                }
            }
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++) {
                __m256 d[4];
                const __m256 q0 = q_avx2_codes(qg[r], q4, 0);
#pragma GCC unroll 16
                for (int t = 0; t < NT; t++)
                    d[t] = _mm256_mul_ps(q0, _mm256_loadu_ps(xp[t]));
#pragma GCC unroll 16
                for (int j = 1; j < 8; j++) {
                    const __m256 qf = q_avx2_codes(qg[r], q4, j);
#pragma GCC unroll 16
                    for (int t = 0; t < NT; t++)
                        d[t] = _mm256_fmadd_ps(qf, _mm256_loadu_ps(xp[t] + 8 * j), d[t]);
                }
                const __m256 s = _mm256_set1_ps(f.sf[r][gi]);
#pragma GCC unroll 16
                for (int t = 0; t < NT; t++)
                    acc[r][t] = _mm256_fmadd_ps(s, d[t], acc[r][t]);
            }
        }
        /* The chunk's bias terms: lanes are now groups. */
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) {
            const float *xs = a->xsum + (size_t)(t0 + t) * (size_t)a->Gp + (size_t)g0;
            const __m256 x0 = _mm256_loadu_ps(xs), x1 = _mm256_loadu_ps(xs + 8);
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++) {
                acc[r][t] = _mm256_fmadd_ps(_mm256_load_ps(f.bf[r]), x0, acc[r][t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_load_ps(f.bf[r] + 8), x1, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++)
            a->y[(size_t)(t0 + t) * (size_t)a->N + (size_t)(n + r)] = sl_hsum256(acc[r][t]);
}

/* ---------------------------------------------------------- AVX-512 */

#define AVX512_ATTR SL_AVX512_ATTR
#define AVX512_INL  AVX512_ATTR QINLINE

/* Whether a whole chunk's scales of a layout other than the pack's load as vectors: groups of
 * 64 or 128 (two groups of QG each), BF16, F16 or F32. */
static inline int q_wide_vec(const qmm *a) {
    return a->grp == QG || a->grp == 2 * QG;
}

/* The values (scales or biases p) of QG-column groups g0 .. g0+ng-1 of row n (ng <= 16; lanes
 * past ng zero, their values not read), for q_wide_vec layouts; a group of 128 is two lanes.
 * Widening is exact: the same floats as sl_qparam. */
AVX512_INL __m512 q_avx512_wide(const qmm *a, const void *p, int64_t n, int64_t g0, int ng) {
    const size_t j = (size_t)(n * a->Gs + g0 * QG / a->grp);
    const int two = a->grp != QG, m = two ? (ng + 1) / 2 : ng; /* values to read */
    const __mmask16 mk = (__mmask16)((1u << m) - 1u);
    __m512 v;
    if (a->sdt == SL_DTYPE_F32) {
        v = _mm512_maskz_loadu_ps(mk, (const float *)p + j);
    } else {
        const __m256i h = _mm512_castsi512_si256(
            _mm512_maskz_loadu_epi16((__mmask32)mk, (const uint16_t *)p + j));
        v = a->sdt == SL_DTYPE_F16
                ? _mm512_cvtph_ps(h)
                : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (!two) return v;
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_maskz_permutexvar_ps((__mmask16)((1u << ng) - 1u), dup, v);
}

/* Scales and biases of a chunk as float, 16 at once when the chunk is whole. */
AVX512_INL void q_avx512_chunk(qtile *f, const qmm *a, int64_t g0, int ng, float z, const int NR) {
    if (!a->plain && q_wide_vec(a)) {
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            const __m512 sv = q_avx512_wide(a, a->scv, f->n + r, g0, ng);
            const __m512 bv = q_avx512_wide(a, a->biv, f->n + r, g0, ng);
            _mm512_store_ps(f->sf[r], sv);
            _mm512_store_ps(f->bf[r], _mm512_fmadd_ps(_mm512_set1_ps(z), sv, bv));
        }
        return;
    }
    if (ng < QCH || !a->plain) {
        qtile_chunk_scalar(f, a, g0, ng, z, NR);
        return;
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        const uint16_t *s = f->scr + (size_t)(r * a->Gs + g0),
                       *b = f->bir + (size_t)(r * a->Gs + g0);
        qprefetch(s, f->pf_ahead_s);
        qprefetch(b, f->pf_ahead_s);
        const __m512 sv = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16));
        const __m512 bv = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)b)), 16));
        _mm512_store_ps(f->sf[r], sv);
        _mm512_store_ps(f->bf[r], _mm512_fmadd_ps(_mm512_set1_ps(z), sv, bv));
    }
}

/* Sums of x over groups g0 .. g0+QCH-1 of a row of K (zero past the last group). */
AVX512_ATTR static void q_avx512_xsums(const float *x, int64_t K, int64_t g0, float *out) {
    float pad[QG];
    for (int i = 0; i < QCH; i++) {
        const int64_t k0 = (g0 + i) * QG;
        if (k0 >= K) {
            out[i] = 0;
            continue;
        }
        const float *xg = q_group(x, K, k0, pad);
        const __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
        const __m512 v2 = _mm512_loadu_ps(xg + 32), v3 = _mm512_loadu_ps(xg + 48);
        out[i] = sl_hsum512(_mm512_add_ps(_mm512_add_ps(v0, v1), _mm512_add_ps(v2, v3)));
    }
}

/* Row x of K in the order of Q4 codes, per group (zero-padded): see the tile. */
AVX512_ATTR static void q_avx512_xperm(const float *x, int64_t K, float *out) {
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    float pad[QG];
    for (int64_t k0 = 0; k0 < K; k0 += QG, out += QG) {
        const float *xg = q_group(x, K, k0, pad);
        const __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
        const __m512 v2 = _mm512_loadu_ps(xg + 32), v3 = _mm512_loadu_ps(xg + 48);
        _mm512_store_ps(out, _mm512_permutex2var_ps(v0, even, v1));
        _mm512_store_ps(out + 16, _mm512_permutex2var_ps(v0, odd, v1));
        _mm512_store_ps(out + 32, _mm512_permutex2var_ps(v2, even, v3));
        _mm512_store_ps(out + 48, _mm512_permutex2var_ps(v2, odd, v3));
    }
}

/*
 * Q4 codes become floats through a 16-entry table holding q - 8 (vpermps
 * reads only the low 4 bits of each lane, so the low nibble needs no mask).
 */
AVX512_INL void q_avx512_tile(const qmm *a, int q4, int64_t n, int32_t t0, const int NR,
                              const int NT) {
    qtile f;
    qtile_init(&f, a, n, t0, NR, NT);
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512 tab = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8);
    __m512 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < a->G; g0 += QCH) {
        const int ng = (int)SL_MIN(QCH, a->G - g0);
        q_avx512_chunk(&f, a, g0, ng, q4 ? 8.0f : 0.0f, NR);
        for (int gi = 0; gi < ng; gi++) {
            const float *xg[4];
            const uint8_t *qg[4];
            qtile_group(&f, a, q4, g0 + gi, NR, NT, xg, qg);
            /* x in the codes' order (Q4: per 32 columns the 16 evens, then the
             * 16 odds), precomputed for small batches: the permutes share port
             * 5 with the code widening, the bottleneck of Q4 decode. */
            __m512 xv[4][4];
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) {
                if (q4 && a->xperm) {
                    const float *xp = a->xperm + (size_t)(t0 + t) * (size_t)(a->G * QG) +
                                      (size_t)((g0 + gi) * QG);
#pragma GCC unroll 16
                    for (int j = 0; j < 4; j++)
                        xv[t][j] = _mm512_load_ps(xp + 16 * j);
                    continue;
                }
                const __m512 v0 = _mm512_loadu_ps(xg[t]), v1 = _mm512_loadu_ps(xg[t] + 16);
                const __m512 v2 = _mm512_loadu_ps(xg[t] + 32), v3 = _mm512_loadu_ps(xg[t] + 48);
                if (q4) {
                    xv[t][0] = _mm512_permutex2var_ps(v0, even, v1);
                    xv[t][1] = _mm512_permutex2var_ps(v0, odd, v1);
                    xv[t][2] = _mm512_permutex2var_ps(v2, even, v3);
                    xv[t][3] = _mm512_permutex2var_ps(v2, odd, v3);
                } else {
                    xv[t][0] = v0, xv[t][1] = v1, xv[t][2] = v2, xv[t][3] = v3;
                }
            }
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++) {
                __m512 qf[4], d[4];
                if (q4) {
                    const __m512i b0 =
                        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qg[r]));
                    const __m512i b1 =
                        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qg[r] + 16)));
                    qf[0] = _mm512_permutexvar_ps(b0, tab);
                    qf[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), tab);
                    qf[2] = _mm512_permutexvar_ps(b1, tab);
                    qf[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), tab);
                } else {
#pragma GCC unroll 16
                    for (int j = 0; j < 4; j++)
                        qf[j] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(qg[r] + 16 * j))));
                }
#pragma GCC unroll 16
                for (int t = 0; t < NT; t++)
                    d[t] = _mm512_mul_ps(qf[0], xv[t][0]);
#pragma GCC unroll 16
                for (int j = 1; j < 4; j++)
#pragma GCC unroll 16
                    for (int t = 0; t < NT; t++)
                        d[t] = _mm512_fmadd_ps(qf[j], xv[t][j], d[t]);
                const __m512 s = _mm512_set1_ps(f.sf[r][gi]);
#pragma GCC unroll 16
                for (int t = 0; t < NT; t++)
                    acc[r][t] = _mm512_fmadd_ps(s, d[t], acc[r][t]);
            }
        }
        /* The chunk's bias terms: lanes are now groups. */
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) {
            const __m512 xs =
                _mm512_loadu_ps(a->xsum + (size_t)(t0 + t) * (size_t)a->Gp + (size_t)g0);
#pragma GCC unroll 16
            for (int r = 0; r < NR; r++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_load_ps(f.bf[r]), xs, acc[r][t]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++)
            a->y[(size_t)(t0 + t) * (size_t)a->N + (size_t)(n + r)] = sl_hsum512(acc[r][t]);
}

/* -------------------------------------- AVX-512 VNNI, int8 x (Q8, Q4) */

/*
 * The Q4 int8 path (see quant.h for the arithmetic). Codes stay bytes: the
 * low nibbles are the even elements of a group, the high nibbles the odd
 * ones, and vpdpbusd multiplies unsigned code bytes by signed xq bytes,
 * summing 4 products into each 32-bit lane. Per group the integer sums are
 * exact, so only their conversion and scaling round, once per group.
 *
 * So that one 16-lane vector holds 16 whole groups, a chunk of 16 groups
 * (512 code bytes, 8 vectors of 2 groups) is transposed as 32-bit words:
 * output j (j = 0..7) holds word j (bytes 4j..4j+3) of every group, lane l
 * of every output belonging to group sigma(l) = 4 (l % 4) + l / 4 of the
 * chunk. The quantised x goes through the same transpose once per call (its
 * even and odd elements laid out as the low and high nibbles are), so per
 * row and token a chunk is 16 vpdpbusd into two accumulators:
 *   A = sum_j dpbusd(lo_j, xe_j)   lo_j = word_j & 0x0f   (even elements)
 *   B = sum_j dpbusd(hi_j, xo_j)   hi_j = word_j & 0xf0   (16 x odd codes)
 *   I = A + (B >> 4)                                     (exact: sum q * xq)
 * and, lanes being groups, one float step per chunk:
 *   acc = fma(scale, fma(float(I), d, 8 * (X - d * sum xq)), acc)
 *   acc = fma(bias, X, acc)
 * (centring the codes on 8 without touching them), then y = horizontal sum
 * of acc. The integer part is exact in any order and the float steps are
 * per lane in chunk order, so results depend only on K, never on the tile,
 * T or the thread. Scales and biases are permuted to sigma order per chunk;
 * everything per token is stored in that order by the preparation.
 *
 * Q8 the same way, with codes centred on 128: a chunk is 16 groups of 64
 * bytes (1024, 16 vectors of one group), half transposed (lanes are quarters
 * of groups, q_vnni_transpose16), 16 vpdpbusd into four accumulators per
 * token, whose lanes q_vnni_q8_sum adds up so that lane l holds group l (the
 * identity order: no permutes of the scales). 2 shuffles per 64 code bytes
 * and row, plus 6 per chunk and token; the integer sums are the exact ones of
 * a whole transpose (64 shuffles, measured 36 against 38 GB/s per core for
 * float x in decode).
 */
#define VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define VNNI_INL  VNNI_ATTR QINLINE
#define QCB       (QCH * QG / 2) /* code bytes of a chunk */

static inline int cpu_has_vnni(void) {
    return __builtin_cpu_supports("avx512vnni");
}

int sl_quant_int8_available(const sl_backend *be) {
    return be->isa >= SL_ISA_AVX512 && cpu_has_vnni();
}

/* Lane l of a transposed chunk holds group sigma(l) (an involution). */
static inline int qsigma(int l) {
    return 4 * (l & 3) + (l >> 2);
}

/* The 32-bit-word transpose of 512 bytes (16 groups of 32) described above. */
VNNI_INL void q_vnni_transpose(const uint8_t *p, __m512i out[8]) {
    __m512i v[8], w[8];
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++)
        v[m] = _mm512_loadu_si512((const void *)(p + 64 * m));
        /* w[2i + h]: block b = words 4h .. 4h+3 of group 4i + b */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        w[2 * i] = _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0));
        w[2 * i + 1] = _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1));
    }
    /* 4 x 4 transposes of words within 128-bit blocks: out[4h + i] block b,
     * position k = word 4h + i of group 4k + b. */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i t0 = _mm512_unpacklo_epi32(w[h], w[2 + h]);
        const __m512i t1 = _mm512_unpackhi_epi32(w[h], w[2 + h]);
        const __m512i t2 = _mm512_unpacklo_epi32(w[4 + h], w[6 + h]);
        const __m512i t3 = _mm512_unpackhi_epi32(w[4 + h], w[6 + h]);
        out[4 * h + 0] = _mm512_unpacklo_epi64(t0, t2);
        out[4 * h + 1] = _mm512_unpackhi_epi64(t0, t2);
        out[4 * h + 2] = _mm512_unpacklo_epi64(t1, t3);
        out[4 * h + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
}

/* Q8: a chunk is 16 groups of 64 code bytes, one vector each. Half of the 16 x 16 transpose of
 * their 32-bit words (two shuffle stages of four): out[4i + k], lane 4c + p, holds word 4c + k
 * of group 4i + p. So dpbusd over out[4i .. 4i+3] leaves in lane 4c + p the sum of words
 * 4c .. 4c+3 of group 4i + p, and q_vnni_q8_sum adds the four lanes of each group per token:
 * 32 shuffles a row and chunk plus 6 a token, against 64 for the whole transpose. */
VNNI_INL void q_vnni_transpose16(const uint8_t *p, __m512i out[16]) {
    __m512i a[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const __m512i r0 = _mm512_loadu_si512((const void *)(p + 128 * i));
        const __m512i r1 = _mm512_loadu_si512((const void *)(p + 128 * i + 64));
        a[2 * i] = _mm512_unpacklo_epi32(r0, r1);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r0, r1);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        out[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        out[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        out[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        out[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
}

/* Per-group sums of the four accumulators A[i] (lane 4c + p: a quarter of group 4i + p): lane l
 * of the result is group l's whole integer sum (exact). */
VNNI_INL __m512i q_vnni_q8_sum(const __m512i A[4]) {
    const __m512i p0 = _mm512_add_epi32(_mm512_shuffle_i32x4(A[0], A[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(A[0], A[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i p1 = _mm512_add_epi32(_mm512_shuffle_i32x4(A[2], A[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(A[2], A[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(p0, p1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(p0, p1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/*
 * One token's x for the int8 path: per chunk c, xq[c * 1024 ..] holds 16 vectors, for Q4 2j the
 * transposed even elements of word j, 2j + 1 the odd ones; for Q8 vector j word j of every
 * group (q_vnni_transpose16). xd, xs, xr (Gp floats): d, X and z (X - d sum xq) of each group at
 * its lane in the chunk (z = 8 for Q4, 128 for Q8: the codes' centre). Groups past the row are
 * zero.
 */
VNNI_ATTR static void q_vnni_prep(const float *x, int64_t K, int64_t Gp, int q4, uint8_t *xq,
                                  float *xd, float *xs, float *xr) {
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    /* Q4: E, O the even and odd elements, 32 bytes a group; Q8: E the elements, 64 a group */
    uint8_t E[2 * QCB] __attribute__((aligned(64))), O[QCB] __attribute__((aligned(64)));
    const float z = q4 ? 8.0f : 128.0f;
    float pad[QG];
    for (int64_t c = 0; c < Gp / QCH; c++, xq += 2 * QCB) {
        for (int gi = 0; gi < QCH; gi++) {
            const int64_t k0 = (c * QCH + gi) * QG;
            const size_t l = (size_t)(c * QCH + (q4 ? qsigma(gi) : gi));
            uint8_t *e = q4 ? E + 32 * gi : E + 64 * gi, *o = q4 ? O + 32 * gi : E + 64 * gi + 32;
            if (k0 >= K) {
                memset(e, 0, 32);
                memset(o, 0, 32);
                xd[l] = xs[l] = xr[l] = 0;
                continue;
            }
            const float *xg = q_group(x, K, k0, pad);
            const __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
            const __m512 v2 = _mm512_loadu_ps(xg + 32), v3 = _mm512_loadu_ps(xg + 48);
            const float X = sl_hsum512(_mm512_add_ps(_mm512_add_ps(v0, v1), _mm512_add_ps(v2, v3)));
            if (!isfinite(X)) {
                /* An Inf or NaN in the group (X is then not finite; nor is it when finite
                 * values overflow the sum, and their outputs would be Inf anyway). Its codes
                 * would be the int32 "indefinite" INT_MIN, whose sum below overflows: zero
                 * codes and d = NaN instead make every output of the token NaN, defined and
                 * still non-finite for the check on the logits (sl_session_forward). */
                memset(e, 0, 32);
                memset(o, 0, 32);
                xd[l] = xr[l] = NAN;
                xs[l] = X;
                continue;
            }
            const float m = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)),
                              _mm512_max_ps(_mm512_abs_ps(v2), _mm512_abs_ps(v3))));
            const float d = m / 127.0f;
            const __m512 id = _mm512_set1_ps(fminf(127.0f / m, FLT_MAX)); /* m = 0: x is 0 */
            /* Q4: the evens of the group's halves to e, the odds to o; Q8: the four quarters */
            const __m512 u0 = q4 ? _mm512_permutex2var_ps(v0, even, v1) : v0;
            const __m512 u1 = q4 ? _mm512_permutex2var_ps(v2, even, v3) : v1;
            const __m512 u2 = q4 ? _mm512_permutex2var_ps(v0, odd, v1) : v2;
            const __m512 u3 = q4 ? _mm512_permutex2var_ps(v2, odd, v3) : v3;
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(u0, id));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(u1, id));
            const __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(u2, id));
            const __m512i q3 = _mm512_cvtps_epi32(_mm512_mul_ps(u3, id));
            _mm_storeu_si128((__m128i *)e, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(e + 16), _mm512_cvtsepi32_epi8(q1));
            _mm_storeu_si128((__m128i *)o, _mm512_cvtsepi32_epi8(q2));
            _mm_storeu_si128((__m128i *)(o + 16), _mm512_cvtsepi32_epi8(q3));
            const int sq = _mm512_reduce_add_epi32(
                _mm512_add_epi32(_mm512_add_epi32(q0, q1), _mm512_add_epi32(q2, q3)));
            xd[l] = d;
            xs[l] = X;
            xr[l] = z * fmaf(-d, (float)sq, X);
        }
        if (q4) {
            __m512i te[8], to[8];
            q_vnni_transpose(E, te);
            q_vnni_transpose(O, to);
            for (int j = 0; j < 8; j++) {
                _mm512_store_si512((void *)(xq + 128 * j), te[j]);
                _mm512_store_si512((void *)(xq + 128 * j + 64), to[j]);
            }
        } else {
            __m512i t[16];
            q_vnni_transpose16(E, t);
            for (int j = 0; j < 16; j++)
                _mm512_store_si512((void *)(xq + 64 * j), t[j]);
        }
    }
}

/* Scales and biases of chunk c of row n as float (zero past G; masked lanes are not read), in
 * lane order: sigma for Q4, the identity for Q8. */
VNNI_INL void q_vnni_params(const qmm *a, int64_t n, int64_t g0, int q4, __m512 *sv, __m512 *bv) {
    const __m512i sigma = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const uint16_t *scr = a->sc + (size_t)(n * a->Gs), *bir = a->bi + (size_t)(n * a->Gs);
    const __mmask32 m = (__mmask32)((1u << SL_MIN(QCH, a->G - g0)) - 1u);
    float swide[QCH] __attribute__((aligned(64))), bwide[QCH] __attribute__((aligned(64)));
    if (a->plain) {
        *sv = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, scr + g0))),
            16));
        *bv = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, bir + g0))),
            16));
    } else if (q_wide_vec(a)) { /* other layouts, vector loads */
        const int ng = (int)SL_MIN(QCH, a->G - g0);
        *sv = q_avx512_wide(a, a->scv, n, g0, ng);
        *bv = q_avx512_wide(a, a->biv, n, g0, ng);
    } else { /* groups of 256 or more: widened one by one */
        for (int i = 0; i < QCH; i++) {
            const size_t j = (size_t)(n * a->Gs + (g0 + i) * QG / a->grp);
            swide[i] = g0 + i < a->G ? sl_qparam(a->scv, a->sdt, j) : 0.0f;
            bwide[i] = g0 + i < a->G ? sl_qparam(a->biv, a->sdt, j) : 0.0f;
        }
        *sv = _mm512_load_ps(swide);
        *bv = _mm512_load_ps(bwide);
    }
    if (q4) {
        *sv = _mm512_permutexvar_ps(sigma, *sv);
        *bv = _mm512_permutexvar_ps(sigma, *bv);
    }
}

/* The tile of the int8 path: one row n, tokens t0 .. t0+NT-1 (NT <= QNT).
 * Rows share nothing but the cache, so a row's 16 code vectors of a chunk
 * and its NT accumulators all stay in registers. */
#define QNT 8
VNNI_INL void q_vnni_tile(const qmm *a, int64_t n, int32_t t0, const int NT, int pf, const int q4) {
    const __m512i m_lo = _mm512_set1_epi8(0x0f), m_hi = _mm512_set1_epi8((char)0xf0);
    const int64_t nch = a->Gp / QCH;
    const size_t cb = q4 ? QCB : 2 * QCB; /* code bytes of a chunk */
    const uint8_t *row = a->w + (size_t)n * a->ws;
    const uint16_t *scr = a->sc + (size_t)(n * a->Gs), *bir = a->bi + (size_t)(n * a->Gs);
    /* Decode streams the codes (rows are too short a stream for the hardware
     * prefetchers): fetch the same columns QPF groups of 4 rows down; a
     * batch's later token tiles find them cached. */
    const size_t pf_ahead = (size_t)(QPF * 4) * a->ws;
    const size_t pf_ahead_s = (size_t)(QPF * 4 * a->Gs) * sizeof(uint16_t);
    /* A short last chunk is read in place (the bytes past the row belong to
     * the next rows and meet zero xq) unless that runs past the matrix. */
    const size_t end = (size_t)a->N * a->ws;
    uint8_t qpad[2 * QCB] __attribute__((aligned(64)));
    __m512 acc[QNT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        const int64_t g0 = c * QCH;
        const size_t off = (size_t)c * cb;
        const uint8_t *qp = row + off;
        if (pf) {
#pragma GCC unroll 16
            for (size_t i = 0; i < cb / 64; i++)
                qprefetch(qp + 64 * i, pf_ahead);
            qprefetch(scr + g0, pf_ahead_s);
            qprefetch(bir + g0, pf_ahead_s);
        }
        __m512 sv, bv;
        q_vnni_params(a, n, g0, q4, &sv, &bv);
        if (off + cb > a->ws && (size_t)n * a->ws + off + cb > end) {
            const size_t rem = a->ws - off; /* a zero-padded copy */
            memcpy(qpad, qp, rem);
            memset(qpad + rem, 0, cb - rem);
            qp = qpad;
        }
        /* Q4: lo, hi the low and high nibbles (16 x the odd codes) of words 0..7; Q8: lo vectors
         * 0..7 of the half transpose, hi 8..15 */
        __m512i lo[8], hi[8];
        if (q4) {
            q_vnni_transpose(qp, lo);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                hi[j] = _mm512_and_si512(lo[j], m_hi);
                lo[j] = _mm512_and_si512(lo[j], m_lo);
            }
        } else {
            __m512i w[16];
            q_vnni_transpose16(qp, w);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                lo[j] = w[j], hi[j] = w[8 + j];
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) {
            const __m512i *xv =
                (const __m512i *)(a->xq + ((size_t)(t0 + t) * (size_t)nch + (size_t)c) * 2 * QCB);
            __m512i I;
            if (q4) { /* x's even elements of word j at 2j, odd at 2j + 1 */
                __m512i A = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], xv[0]);
                __m512i B = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], xv[1]);
#pragma GCC unroll 8
                for (int j = 1; j < 8; j++) {
                    A = _mm512_dpbusd_epi32(A, lo[j], xv[2 * j]);
                    B = _mm512_dpbusd_epi32(B, hi[j], xv[2 * j + 1]);
                }
                I = _mm512_add_epi32(A, _mm512_srai_epi32(B, 4));
            } else { /* x as the codes: vector 4i + k at 4i + k */
                __m512i A[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const __m512i *w = i < 2 ? lo + 4 * i : hi + 4 * (i - 2);
                    A[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], xv[4 * i]);
#pragma GCC unroll 4
                    for (int k = 1; k < 4; k++)
                        A[i] = _mm512_dpbusd_epi32(A[i], w[k], xv[4 * i + k]);
                }
                I = q_vnni_q8_sum(A);
            }
            const size_t o = (size_t)(t0 + t) * (size_t)a->Gp + (size_t)g0;
            const __m512 u = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_load_ps(a->xd + o),
                                             _mm512_load_ps(a->xr + o));
            acc[t] = _mm512_fmadd_ps(sv, u, acc[t]);
            acc[t] = _mm512_fmadd_ps(bv, _mm512_load_ps(a->xsum + o), acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++)
        a->y[(size_t)(t0 + t) * (size_t)a->N + (size_t)n] = sl_hsum512(acc[t]);
}

/* Rows [n0, n1) for all tokens: per group of 4 rows, tiles of QNT tokens (the
 * tokens' xq stay cached across the 4 rows, the rows' codes across the tiles). */
VNNI_INL void qrows_vnni(const qmm *a, int64_t n0, int64_t n1, const int q4) {
    const int32_t T = a->T;
    for (int64_t n = n0; n < n1; n += 4) {
        const int64_t nr = SL_MIN(4, n1 - n);
        int32_t t = 0;
        for (; t + QNT <= T; t += QNT)
            for (int64_t r = 0; r < nr; r++)
                q_vnni_tile(a, n + r, t, QNT, t == 0, q4);
        for (int64_t r = 0; r < nr; r++)
            switch (T - t) {
            case 7: q_vnni_tile(a, n + r, t, 7, t == 0, q4); break;
            case 6: q_vnni_tile(a, n + r, t, 6, t == 0, q4); break;
            case 5: q_vnni_tile(a, n + r, t, 5, t == 0, q4); break;
            case 4: q_vnni_tile(a, n + r, t, 4, t == 0, q4); break;
            case 3: q_vnni_tile(a, n + r, t, 3, t == 0, q4); break;
            case 2: q_vnni_tile(a, n + r, t, 2, t == 0, q4); break;
            case 1: q_vnni_tile(a, n + r, t, 1, t == 0, q4); break;
            default: break;
            }
    }
}

/* One copy of the loops per format, q4 constant in each. */
VNNI_ATTR static void qrows_vnni_q4(const qmm *a, int64_t n0, int64_t n1) {
    qrows_vnni(a, n0, n1, 1);
}
VNNI_ATTR static void qrows_vnni_q8(const qmm *a, int64_t n0, int64_t n1) {
    qrows_vnni(a, n0, n1, 0);
}

/* ---------------------------------------------------------- driver */

/* Rows [n0, n1) for all tokens: tiles of 4 rows x 4 tokens, then remainders.
 * NR, NT and the format are constants in every expansion of the tile. */
#define DEFINE_QROWS(ISA, ATTR, Q4NAME, Q4)                                                        \
    ATTR static void qrows_##ISA##_##Q4NAME(const qmm *a, int64_t n0, int64_t n1) {                \
        const int32_t T = a->T;                                                                    \
        int64_t n = n0;                                                                            \
        for (; n + 4 <= n1; n += 4) {                                                              \
            int32_t t = 0;                                                                         \
            for (; t + 4 <= T; t += 4)                                                             \
                q_##ISA##_tile(a, Q4, n, t, 4, 4);                                                 \
            switch (T - t) {                                                                       \
            case 3: q_##ISA##_tile(a, Q4, n, t, 4, 3); break;                                      \
            case 2: q_##ISA##_tile(a, Q4, n, t, 4, 2); break;                                      \
            case 1: q_##ISA##_tile(a, Q4, n, t, 4, 1); break;                                      \
            default: break;                                                                        \
            }                                                                                      \
        }                                                                                          \
        for (; n < n1; n++) {                                                                      \
            int32_t t = 0;                                                                         \
            for (; t + 4 <= T; t += 4)                                                             \
                q_##ISA##_tile(a, Q4, n, t, 1, 4);                                                 \
            switch (T - t) {                                                                       \
            case 3: q_##ISA##_tile(a, Q4, n, t, 1, 3); break;                                      \
            case 2: q_##ISA##_tile(a, Q4, n, t, 1, 2); break;                                      \
            case 1: q_##ISA##_tile(a, Q4, n, t, 1, 1); break;                                      \
            default: break;                                                                        \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_QROWS(avx2, AVX2_ATTR, q8, 0)
DEFINE_QROWS(avx2, AVX2_ATTR, q4, 1)
DEFINE_QROWS(avx512, AVX512_ATTR, q8, 0)
DEFINE_QROWS(avx512, AVX512_ATTR, q4, 1)

/* Group sums of x live on the stack: at most this many floats, [T, Gp]. Longer
 * batches go through in slices of tokens (each token's result is the same). */
#define QXS_MAX 8192
/* And for AVX-512 Q4 x in the codes' order, when [T, G * 64] fits. */
#define QXP_MAX 8192
/* The int8 path's quantised x, [T, Gp * 64] bytes, and its [T, Gp] floats. */
#define QIS_MAX SL_QINT8_MAX_GROUPS
#define QIQ_MAX (QIS_MAX * QG)

/* The row blocks of products a[0..n) in one parallel region: block b of the flat list is
 * product i's rows from (b - first[i]) * 16 (first[0] = 0), so every row gets the kernel a
 * product alone gives it, whichever thread runs it. */
static void qmm_run_many(const sl_backend *be, const qmm *a, const int64_t *first, int n,
                         int64_t n_blocks, sl_isa isa, int q4, int vnni) {
    const int64_t block = 16; /* rows per work item: keeps tiles of 4 whole */
    int64_t work = 0, rows = 0;
    for (int i = 0; i < n; i++)
        work += a[i].N * a[i].K * a[i].T, rows += a[i].N;
    /* Small products are not worth waking a second thread for. */
    const int nth = (work < (1 << 15) || rows < 8) ? 1 : be->n_threads;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        int i = 0;
        while (i + 1 < n && first[i + 1] <= b)
            i++;
        const int64_t n0 = (b - first[i]) * block, n1 = SL_MIN(a[i].N, n0 + block);
        switch (isa) {
        case SL_ISA_AVX512:
            if (vnni && q4)
                qrows_vnni_q4(&a[i], n0, n1);
            else if (vnni)
                qrows_vnni_q8(&a[i], n0, n1);
            else if (q4)
                qrows_avx512_q4(&a[i], n0, n1);
            else
                qrows_avx512_q8(&a[i], n0, n1);
            break;
        case SL_ISA_AVX2:
            if (q4)
                qrows_avx2_q4(&a[i], n0, n1);
            else
                qrows_avx2_q8(&a[i], n0, n1);
            break;
        default: qrows_scalar(&a[i], q4, n0, n1); break;
        }
    }
}

/* Rows [0, N) of a slice. */
static void qmm_run(const sl_backend *be, const qmm *a, sl_isa isa, int q4, int vnni) {
    const int64_t first = 0;
    qmm_run_many(be, a, &first, 1, (a->N + 15) / 16, isa, q4, vnni);
}

/* The job description of tokens [ts, ts + Ts) of a call; path-specific buffers unset. */
static qmm qmm_slice(const sl_tensor *w, const float *x, float *y, int32_t ts, int32_t Ts,
                     int64_t Gp, float *xsum) {
    const int64_t N = w->shape[0], K = w->shape[1];
    return (qmm){.w = w->data,
                 .ws = sl_row_bytes(w->dtype, K),
                 .sc = w->scales,
                 .bi = w->biases,
                 .scv = w->scales,
                 .biv = w->biases,
                 .sdt = sl_tensor_sdtype(w),
                 .Gs = sl_tensor_qgroups(w, K),
                 .grp = sl_tensor_group(w),
                 .plain = sl_tensor_qplain(w),
                 .x = x + (size_t)ts * (size_t)K,
                 .y = y + (size_t)ts * (size_t)N,
                 .N = N,
                 .K = K,
                 .G = sl_qgroups(K),
                 .T = Ts,
                 .xsum = xsum,
                 .Gp = Gp};
}

/* The int8 path; its own stack frame (the float path's buffers are not needed). */
__attribute__((noinline)) static void matmul_int8(const sl_backend *be, float *y, const float *x,
                                                  const sl_tensor *w, int32_t T) {
    const int q4 = is_q4(w->dtype);
    const int64_t K = w->shape[1], G = sl_qgroups(K);
    const int64_t Gp = (G + QCH - 1) / QCH * QCH;
    const int32_t slice = (int32_t)(QIS_MAX / Gp);
    uint8_t xq[QIQ_MAX] __attribute__((aligned(64)));
    float xd[QIS_MAX] __attribute__((aligned(64)));
    float xs[QIS_MAX] __attribute__((aligned(64)));
    float xr[QIS_MAX] __attribute__((aligned(64)));
    for (int32_t ts = 0; ts < T; ts += slice) {
        const int32_t Ts = SL_MIN(slice, T - ts);
        qmm a = qmm_slice(w, x, y, ts, Ts, Gp, xs);
        a.xq = xq;
        a.xd = xd;
        a.xr = xr;
        for (int32_t t = 0; t < Ts; t++) {
            const size_t o = (size_t)t * (size_t)Gp;
            q_vnni_prep(a.x + (size_t)t * (size_t)K, K, Gp, q4, xq + o * QG, xd + o, xs + o,
                        xr + o);
        }
        qmm_run(be, &a, SL_ISA_AVX512, q4, 1);
    }
}

void sl_matmul_quant_cpu_path(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                              int32_t T, sl_qpath path) {
    SL_ASSERT(w->ndim == 2 && sl_dtype_is_quant(w->dtype) && w->scales && w->biases);
    const int64_t K = w->shape[1], G = sl_qgroups(K);
    const int64_t Gp = (G + QCH - 1) / QCH * QCH;
    const int q4 = is_q4(w->dtype);
    /* The SIMD paths walk groups of QG columns: a tensor's groups must be whole numbers of them. */
    const int wide = sl_tensor_group(w) % QG == 0;
    if (wide && path != SL_QPATH_FLOAT && Gp <= QIS_MAX && sl_quant_int8_available(be)) {
        matmul_int8(be, y, x, w, T);
        return;
    }
    /* Rows longer than 8192 groups (K > 524288) take the scalar path. */
    const sl_isa isa = Gp > QXS_MAX || !wide ? SL_ISA_SCALAR : be->isa;
    const int32_t slice = isa == SL_ISA_SCALAR ? SL_MAX(T, 1) : (int32_t)(QXS_MAX / SL_MAX(Gp, 1));
    float xsum[QXS_MAX] __attribute__((aligned(64)));
    float xperm[QXP_MAX] __attribute__((aligned(64)));
    for (int32_t ts = 0; ts < T; ts += slice) {
        const int32_t Ts = SL_MIN(slice, T - ts);
        qmm a = qmm_slice(w, x, y, ts, Ts, Gp, xsum);
        for (int32_t t = 0; t < Ts && isa != SL_ISA_SCALAR; t++)
            for (int64_t g0 = 0; g0 < G; g0 += QCH) {
                if (isa == SL_ISA_AVX512)
                    q_avx512_xsums(a.x + (size_t)t * (size_t)K, K, g0, xsum + t * Gp + g0);
                else
                    q_avx2_xsums(a.x + (size_t)t * (size_t)K, K, g0, xsum + t * Gp + g0);
            }
        if (isa == SL_ISA_AVX512 && q4 && Ts * G * QG <= QXP_MAX) {
            for (int32_t t = 0; t < Ts; t++)
                q_avx512_xperm(a.x + (size_t)t * (size_t)K, K, xperm + (size_t)(t * G * QG));
            a.xperm = xperm;
        }
        qmm_run(be, &a, isa, q4, 0);
    }
}

/* Stack bytes of the one-token batches' prepared x: a chunk of products at a time. */
#define QB_STACK (64 * 1024)

int sl_matmul_quant_batch1_cpu(const sl_backend *be, float *const *y, const float *const *x,
                               const sl_tensor *const *w, int32_t n) {
    if (n <= 1 || be->int4_float_act) return 0;
    /* the paths whose prepared x is small: int8 activations (VNNI), Q8 on float ones (AVX-512) */
    const int q4 = w[0]->dtype == SL_DTYPE_Q4;
    const int vnni = sl_quant_int8_available(be);
    if (!vnni && !(!q4 && be->isa == SL_ISA_AVX512)) return 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t G = sl_qgroups(w[i]->shape[1]);
        if (w[i]->ndim != 2 || w[i]->dtype != w[0]->dtype || !w[i]->scales || !w[i]->biases ||
            sl_tensor_group(w[i]) % QG || (G + QCH - 1) / QCH * QCH > QIS_MAX)
            return 0;
    }
    enum { CHUNK = 32 };
    qmm a[CHUNK];
    int64_t first[CHUNK];
    uint8_t stack[QB_STACK] __attribute__((aligned(64)));
    for (int32_t i0 = 0; i0 < n;) {
        size_t used = 0;
        int m = 0;
        int64_t blocks = 0;
        for (; i0 + m < n && m < CHUNK; m++) {
            const sl_tensor *t = w[i0 + m];
            const int64_t K = t->shape[1], G = sl_qgroups(K);
            const int64_t Gp = (G + QCH - 1) / QCH * QCH;
            const size_t need = vnni ? (size_t)Gp * QG + 3 * (size_t)Gp * sizeof(float)
                                     : (size_t)Gp * sizeof(float);
            if (used + need > sizeof stack) {
                if (m == 0) return 0; /* one product's x alone does not fit (never at QIS_MAX) */
                break;
            }
            qmm *q = &a[m];
            float *xs = (float *)(stack + used);
            *q = qmm_slice(t, x[i0 + m], y[i0 + m], 0, 1, Gp, xs);
            if (vnni) {
                q->xq = stack + used + 3 * (size_t)Gp * sizeof(float);
                q->xd = xs + Gp;
                q->xr = xs + 2 * Gp;
                q_vnni_prep(q->x, K, Gp, q4, (uint8_t *)q->xq, (float *)q->xd, xs, (float *)q->xr);
            } else {
                for (int64_t g0 = 0; g0 < G; g0 += QCH)
                    q_avx512_xsums(q->x, K, g0, xs + g0);
            }
            used += (need + 63) & ~(size_t)63;
            first[m] = blocks;
            blocks += (t->shape[0] + 15) / 16;
        }
        qmm_run_many(be, a, first, m, blocks, SL_ISA_AVX512, q4, vnni);
        i0 += m;
    }
    return 1;
}

void sl_matmul_quant_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                         int32_t T) {
    sl_matmul_quant_cpu_path(be, y, x, w, T, be->int4_float_act ? SL_QPATH_FLOAT : SL_QPATH_AUTO);
}
