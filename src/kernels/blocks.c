/*
 * ggml's block formats: the reference dequantisation and a simple quantiser (blocks.h).
 *
 * Layouts, byte offsets within one block (f16: IEEE half, little-endian; d, m, dmin are f16):
 *
 *   Q8_0   32 el, 34 B   d | qs[32] int8                      w = q * d
 *   Q4_0   32 el, 18 B   d | qs[16]                           w = (q - 8) * d
 *   Q4_1   32 el, 20 B   d | m | qs[16]                       w = q * d + m
 *   Q5_0   32 el, 22 B   d | qh[4] | qs[16]                   w = (q - 16) * d
 *   Q5_1   32 el, 24 B   d | m | qh[4] | qs[16]               w = q * d + m
 *   MXFP4  32 el, 17 B   e (E8M0) | qs[16]                    w = kv_fp4[q] * 2^(e - 128)
 *   IQ4_NL 32 el, 18 B   d | qs[16]                           w = d * kv_iq4nl[q]
 *
 *   The 32-element types put element j (j < 16) in the low nibble of qs[j] and element j + 16 in
 *   its high nibble; Q5's fifth bit of element j is bit j of qh (a little-endian u32).
 *
 *   Q2_K  256 el, 84 B   scales[16] | qs[64] | d | dmin
 *   Q3_K  256 el, 110 B  hmask[32] | qs[64] | scales[12] | d
 *   Q4_K  256 el, 144 B  d | dmin | scales[12] | qs[128]
 *   Q5_K  256 el, 176 B  d | dmin | scales[12] | qh[32] | qs[128]
 *   Q6_K  256 el, 210 B  ql[128] | qh[64] | scales[16] int8 | d
 *   IQ4_XS 256 el, 136 B d | scales_h (u16) | scales_l[4] | qs[128]
 *
 *   Q2_K and Q3_K: two halves of 128; in half h, element 32j + l (j < 4, l < 32) is the 2-bit
 *   field j of qs[32h + l], with sub-block scale 8h + 2j + l / 16. Q2_K's scale byte holds the
 *   scale (low nibble) and the min (high nibble): w = d*sc * q - dmin*m. Q3_K's third bit is
 *   bit 4h + j of hmask[l] (clear: subtract 4), its 16 6-bit scales (minus 32) pack as:
 *
 *       scales[0..7]   low 4 bits of scale j (low nibbles: j = 0..7; high nibbles: j = 8..15)
 *       scales[8..11]  bits 4-5 of scale j in bits 2(j/4).. of byte 8 + j%4
 *
 *   Q4_K and Q5_K: 8 sub-blocks of 32; sub-block s covers elements 32s..32s+31, as the low
 *   (s even) or high (s odd) nibbles of qs[32(s/2) ..]; Q5_K's fifth bit is bit s of qh[l].
 *   w = d*sc_s * q - dmin*m_s, with 6-bit sc and m packed in 12 bytes:
 *
 *       s < 4:   sc = scales[s] & 63,            m = scales[s + 4] & 63
 *       s >= 4:  sc = scales[s + 4] & 15 | (scales[s - 4] >> 6) << 4
 *                m  = scales[s + 4] >> 4 | (scales[s] >> 6) << 4
 *
 *   Q6_K: two halves of 128; in half h, element 32c + l (c < 4, l < 32) has its low 4 bits in
 *   ql[64h + 32(c&1) + l] (low nibble for c < 2, high for c >= 2) and its top 2 bits in bits
 *   2c.. of qh[32h + l]; scale scales[8h + 2c + l/16]; w = d*sc * (q - 32).
 *
 *   IQ4_XS: 8 sub-blocks of 32 as the 32-element types' nibbles (qs[16s ..]); 6-bit scale
 *   ls = scales_l[s/2] nibble s%2 | (bits 2s.. of scales_h) << 4, w = d*(ls - 32) * kv_iq4nl[q].
 *
 * sl_dequant_row follows ggml's dequantize_row_* operation by operation (float32, in the same
 * order, no fused multiply-add: this file is compiled -std=c11, where GCC does not contract), so
 * every float is ggml's: e.g. Q4_K forms d*sc and dmin*m first, then (d*sc)*q - dmin*m.
 */
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "kernels/blocks.h"

const int8_t sl_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
/* e2m1 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives) doubled: integers. */
const int8_t sl_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float f16_at(const uint8_t *p) {
    return sl_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static inline void f16_put(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static inline uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block s. */
static inline void k4_scale_min(const uint8_t *sc, int s, int *d, int *m) {
    if (s < 4) {
        *d = sc[s] & 63;
        *m = sc[s + 4] & 63;
    } else {
        *d = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *m = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Q3_K: scale j (0..15) as stored, 0..63 (the weight uses it minus 32). */
static inline int q3k_scale(const uint8_t *sc, int j) {
    const int lo = j < 8 ? sc[j] & 15 : sc[j - 8] >> 4;
    return lo | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* ------------------------------------------------------------ dequantise */

static void deq_q8_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

static void deq_q4_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 15) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 15) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    const uint32_t qh = u32_at(b + 2);
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((b[6 + j] & 15) | h0) - 16) * d;
        y[j + 16] = (float)(((b[6 + j] >> 4) | h1) - 16) * d;
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = u32_at(b + 4);
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((b[8 + j] & 15) | h0) * d + m;
        y[j + 16] = (float)((b[8 + j] >> 4) | h1) * d + m;
    }
}

static void deq_mxfp4(const uint8_t *b, float *y) {
    const float d = sl_e8m0_half(b[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)sl_kvalues_mxfp4[b[1 + j] & 15] * d;
        y[j + 16] = (float)sl_kvalues_mxfp4[b[1 + j] >> 4] * d;
    }
}

static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int half = 0; half < 2; half++) {
                const uint8_t s = sc[8 * h + 2 * j + half];
                const float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    y[128 * h + 32 * j + l] = dl * (float)((qs[32 * h + l] >> (2 * j)) & 3) - ml;
            }
}

static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = f16_at(b + 108);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int half = 0; half < 2; half++) {
                const float dl = d * (float)(q3k_scale(sc, 8 * h + 2 * j + half) - 32);
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    const int q =
                        ((qs[32 * h + l] >> (2 * j)) & 3) - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
                    y[128 * h + 32 * j + l] = dl * (float)q;
                }
            }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        int is, im;
        k4_scale_min(sc, s, &is, &im);
        const float d1 = d * (float)is, m1 = dmin * (float)im;
        const uint8_t *q = qs + 32 * (s / 2);
        for (int l = 0; l < 32; l++)
            y[32 * s + l] = d1 * (float)((q[l] >> (4 * (s & 1))) & 15) - m1;
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        int is, im;
        k4_scale_min(sc, s, &is, &im);
        const float d1 = d * (float)is, m1 = dmin * (float)im;
        const uint8_t *q = qs + 32 * (s / 2);
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> (4 * (s & 1))) & 15) | ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = d1 * (float)v - m1;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = f16_at(b + 208);
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int lo = (ql[64 * h + 32 * (c & 1) + l] >> (4 * (c >> 1))) & 15;
                const int q = (lo | ((qh[32 * h + l] >> (2 * c)) & 3) << 4) - 32;
                y[128 * h + 32 * c + l] = d * (float)sc[8 * h + 2 * c + l / 16] * (float)q;
            }
}

/* IQ4_XS's grid with one f16 scale per 32: what llama-quantize writes for the rows of an IQ4_XS
 * model whose length is not a multiple of 256. */
static void deq_iq4_nl(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)sl_kvalues_iq4nl[b[2 + j] & 15];
        y[j + 16] = d * (float)sl_kvalues_iq4nl[b[2 + j] >> 4];
    }
}

static void deq_iq4_xs(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    const unsigned sh = (unsigned)(b[2] | b[3] << 8);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        const int ls = ((sl[s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            y[32 * s + j] = dl * (float)sl_kvalues_iq4nl[qs[16 * s + j] & 15];
            y[32 * s + j + 16] = dl * (float)sl_kvalues_iq4nl[qs[16 * s + j] >> 4];
        }
    }
}

void sl_dequant_row(sl_dtype t, const void *src, float *dst, int64_t n) {
    SL_ASSERT(sl_dtype_is_block(t) && n % sl_dtype_block_size(t) == 0);
    const int32_t bs = sl_dtype_block_size(t);
    const size_t bb = sl_dtype_block_bytes(t);
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / bs; i++, b += bb, dst += bs) {
        switch (t) {
        case SL_DTYPE_Q8_0: deq_q8_0(b, dst); break;
        case SL_DTYPE_Q4_0: deq_q4_0(b, dst); break;
        case SL_DTYPE_Q4_1: deq_q4_1(b, dst); break;
        case SL_DTYPE_Q5_0: deq_q5_0(b, dst); break;
        case SL_DTYPE_Q5_1: deq_q5_1(b, dst); break;
        case SL_DTYPE_MXFP4: deq_mxfp4(b, dst); break;
        case SL_DTYPE_Q2_K: deq_q2_k(b, dst); break;
        case SL_DTYPE_Q3_K: deq_q3_k(b, dst); break;
        case SL_DTYPE_Q4_K: deq_q4_k(b, dst); break;
        case SL_DTYPE_Q5_K: deq_q5_k(b, dst); break;
        case SL_DTYPE_Q6_K: deq_q6_k(b, dst); break;
        case SL_DTYPE_IQ4_XS: deq_iq4_xs(b, dst); break;
        case SL_DTYPE_IQ4_NL: deq_iq4_nl(b, dst); break;
        default: SL_ASSERT(0);
        }
    }
}

/* -------------------------------------------------------------- quantise */

/* The encoder below picks every scale from the (sub-)block's range and rounds each weight to
 * the nearest code; nothing is searched. Some sub-blocks get negative scales on purpose (the
 * formats allow them, and kernels must sign-extend them right). */

static inline float fin(float v) {
    return isfinite(v) ? v : 0.0f;
}

/* rint(v) clamped to [lo, hi]; NaN gives lo. */
static inline int code(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

/* v as f16, finite (clamped to +-65504). */
static inline uint16_t f16_of(float v) {
    return sl_f32_to_f16(fminf(fmaxf(fin(v), -65504.0f), 65504.0f));
}

static float amax_of(const float *x, int n) {
    float a = 0;
    for (int i = 0; i < n; i++)
        a = fmaxf(a, fabsf(fin(x[i])));
    return a;
}

static void range_of(const float *x, int n, float *mn, float *mx) {
    *mn = INFINITY, *mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        *mn = fminf(*mn, fin(x[i]));
        *mx = fmaxf(*mx, fin(x[i]));
    }
}

static inline float inv(float d) {
    return d != 0 ? 1.0f / d : 0.0f;
}

/* Nearest entry of a 16-value grid (in units of the scale). */
static int nearest(const int8_t *kv, float v) {
    int best = 0;
    float be = INFINITY;
    for (int i = 0; i < 16; i++) {
        const float e = fabsf(v - (float)kv[i]);
        if (e < be) be = e, best = i;
    }
    return best;
}

/* Symmetric 32-element types: Q8_0 (bits 8), Q4_0 (4), Q5_0 (5); odd blocks get d < 0. */
static void quant_sym32(sl_dtype t, const float *x, uint8_t *b, int64_t blk) {
    const int bits = t == SL_DTYPE_Q8_0 ? 8 : t == SL_DTYPE_Q4_0 ? 4 : 5;
    const int half = 1 << (bits - 1), top = half - 1;
    const uint16_t h = f16_of((blk & 1 ? -1.0f : 1.0f) * amax_of(x, 32) / (float)top);
    const float id = inv(sl_f16_to_f32(h));
    f16_put(b, h);
    if (t == SL_DTYPE_Q8_0) {
        for (int j = 0; j < 32; j++)
            b[2 + j] = (uint8_t)(int8_t)code(fin(x[j]) * id, -top, top);
        return;
    }
    uint8_t *qs = b + (t == SL_DTYPE_Q5_0 ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const int u0 = code(fin(x[j]) * id, -half, top) + half;
        const int u1 = code(fin(x[j + 16]) * id, -half, top) + half;
        qs[j] = (uint8_t)((u0 & 15) | (u1 & 15) << 4);
        qh |= (uint32_t)(u0 >> 4) << j | (uint32_t)(u1 >> 4) << (j + 16);
    }
    if (t == SL_DTYPE_Q5_0)
        for (int i = 0; i < 4; i++)
            b[2 + i] = (uint8_t)(qh >> (8 * i));
}

/* Affine 32-element types: Q4_1 (4 bits), Q5_1 (5). */
static void quant_aff32(sl_dtype t, const float *x, uint8_t *b) {
    const int top = t == SL_DTYPE_Q4_1 ? 15 : 31;
    float mn, mx;
    range_of(x, 32, &mn, &mx);
    const uint16_t hd = f16_of((mx - mn) / (float)top), hm = f16_of(mn);
    const float id = inv(sl_f16_to_f32(hd)), m = sl_f16_to_f32(hm);
    f16_put(b, hd);
    f16_put(b + 2, hm);
    uint8_t *qs = b + (t == SL_DTYPE_Q5_1 ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const int u0 = code((fin(x[j]) - m) * id, 0, top);
        const int u1 = code((fin(x[j + 16]) - m) * id, 0, top);
        qs[j] = (uint8_t)((u0 & 15) | (u1 & 15) << 4);
        qh |= (uint32_t)(u0 >> 4) << j | (uint32_t)(u1 >> 4) << (j + 16);
    }
    if (t == SL_DTYPE_Q5_1)
        for (int i = 0; i < 4; i++)
            b[4 + i] = (uint8_t)(qh >> (8 * i));
}

static void quant_mxfp4(const float *x, uint8_t *b) {
    /* The smallest exponent that brings the largest magnitude within the grid's 12. */
    const float a = amax_of(x, 32);
    int e = 0;
    while (e < 254 && a > 12.0f * sl_e8m0_half((uint8_t)e))
        e++;
    b[0] = (uint8_t)e;
    const float d = sl_e8m0_half((uint8_t)e); /* as small as 2^-128: divide, 1/d overflows */
    for (int j = 0; j < 16; j++)
        b[1 + j] = (uint8_t)(nearest(sl_kvalues_mxfp4, fin(x[j]) / d) |
                             nearest(sl_kvalues_mxfp4, fin(x[j + 16]) / d) << 4);
}

static void quant_q2_k(const float *x, uint8_t *b) {
    float s[16], m[16], smax = 0, mmax = 0;
    for (int j = 0; j < 16; j++) {
        float mn, mx;
        range_of(x + 16 * j, 16, &mn, &mx);
        mn = fminf(mn, 0.0f); /* w = d*sc * q - dmin*m with m >= 0 */
        s[j] = (mx - mn) / 3.0f, m[j] = -mn;
        smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, m[j]);
    }
    const uint16_t hd = f16_of(smax / 15.0f), hm = f16_of(mmax / 15.0f);
    const float d = sl_f16_to_f32(hd), dmin = sl_f16_to_f32(hm);
    f16_put(b + 80, hd);
    f16_put(b + 82, hm);
    uint8_t *qs = b + 16;
    memset(qs, 0, 64);
    for (int j = 0; j < 16; j++) {
        const int sc = code(s[j] * inv(d), 0, 15), mi = code(m[j] * inv(dmin), 0, 15);
        b[j] = (uint8_t)(sc | mi << 4);
        const float dl = d * (float)sc, ml = dmin * (float)mi;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * j + l; /* element e: half e / 128, field (e % 128) / 32 */
            const int q = code((fin(x[e]) + ml) * inv(dl), 0, 3);
            qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e % 128) / 32)));
        }
    }
}

static void quant_q3_k(const float *x, uint8_t *b) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; j++)
        smax = fmaxf(smax, s[j] = amax_of(x + 16 * j, 16) / 4.0f);
    const uint16_t hd = f16_of(smax / 31.0f);
    const float d = sl_f16_to_f32(hd);
    f16_put(b + 108, hd);
    uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    memset(b, 0, 108);
    for (int j = 0; j < 16; j++) {
        const int v = (j & 1 ? -1 : 1) * code(s[j] * inv(d), 0, 31) + 32; /* stored 1..63 */
        sc[j < 8 ? j : j - 8] |= (uint8_t)((v & 15) << (j < 8 ? 0 : 4));
        sc[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
        const float dl = d * (float)(v - 32);
        for (int l = 0; l < 16; l++) {
            const int e = 16 * j + l, f = (e % 128) / 32, i = e % 32;
            const int u = code(fin(x[e]) * inv(dl), -4, 3) + 4; /* 0..7: low 2 bits, high bit */
            qs[32 * (e / 128) + i] |= (uint8_t)((u & 3) << (2 * f));
            hm[i] |= (uint8_t)((u >> 2) << (4 * (e / 128) + f));
        }
    }
}

/* Q4_K (bits 4) and Q5_K (5). */
static void quant_q45_k(sl_dtype t, const float *x, uint8_t *b) {
    const int top = t == SL_DTYPE_Q4_K ? 15 : 31;
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float mn, mx;
        range_of(x + 32 * j, 32, &mn, &mx);
        mn = fminf(mn, 0.0f);
        s[j] = (mx - mn) / (float)top, m[j] = -mn;
        smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, m[j]);
    }
    const uint16_t hd = f16_of(smax / 63.0f), hm = f16_of(mmax / 63.0f);
    const float d = sl_f16_to_f32(hd), dmin = sl_f16_to_f32(hm);
    const size_t bb = sl_dtype_block_bytes(t);
    memset(b, 0, bb);
    f16_put(b, hd);
    f16_put(b + 2, hm);
    uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (t == SL_DTYPE_Q5_K ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        const int is = code(s[j] * inv(d), 0, 63), im = code(m[j] * inv(dmin), 0, 63);
        if (j < 4) {
            sc[j] |= (uint8_t)is;
            sc[j + 4] |= (uint8_t)im;
        } else {
            sc[j + 4] = (uint8_t)((is & 15) | (im & 15) << 4);
            sc[j - 4] |= (uint8_t)((is >> 4) << 6);
            sc[j] |= (uint8_t)((im >> 4) << 6);
        }
        const float d1 = d * (float)is, m1 = dmin * (float)im;
        for (int l = 0; l < 32; l++) {
            const int u = code((fin(x[32 * j + l]) + m1) * inv(d1), 0, top);
            qs[32 * (j / 2) + l] |= (uint8_t)((u & 15) << (4 * (j & 1)));
            if (t == SL_DTYPE_Q5_K) qh[l] |= (uint8_t)((u >> 4) << j);
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *b) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; j++)
        smax = fmaxf(smax, s[j] = amax_of(x + 16 * j, 16) / 32.0f);
    const uint16_t hd = f16_of(smax / 127.0f);
    const float d = sl_f16_to_f32(hd);
    memset(b, 0, 210);
    f16_put(b + 208, hd);
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)((j & 1 ? -1 : 1) * code(s[j] * inv(d), 0, 127));
        const float dl = d * (float)sc[j];
        for (int l = 0; l < 16; l++) {
            /* element e: half h, 32-column c, column i; its scale is 8h + 2c + i/16 = j */
            const int e = 16 * j + l, h = e / 128, c = (e % 128) / 32, i = e % 32;
            const int u = code(fin(x[e]) * inv(dl), -32, 31) + 32;
            ql[64 * h + 32 * (c & 1) + i] |= (uint8_t)((u & 15) << (4 * (c >> 1)));
            qh[32 * h + i] |= (uint8_t)((u >> 4) << (2 * c));
        }
    }
}

static void quant_iq4_xs(const float *x, uint8_t *b) {
    float s[8], smax = 0;
    for (int j = 0; j < 8; j++)
        smax = fmaxf(smax, s[j] = amax_of(x + 32 * j, 32) / 113.0f);
    const uint16_t hd = f16_of(smax / 31.0f);
    const float d = sl_f16_to_f32(hd);
    memset(b, 0, 136);
    f16_put(b, hd);
    unsigned sh = 0;
    for (int j = 0; j < 8; j++) {
        const int ls = (j & 1 ? -1 : 1) * code(s[j] * inv(d), 0, 31) + 32;
        b[4 + j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
        sh |= (unsigned)(ls >> 4) << (2 * j);
        const float id = inv(d * (float)(ls - 32));
        for (int l = 0; l < 16; l++)
            b[8 + 16 * j + l] =
                (uint8_t)(nearest(sl_kvalues_iq4nl, fin(x[32 * j + l]) * id) |
                          nearest(sl_kvalues_iq4nl, fin(x[32 * j + l + 16]) * id) << 4);
    }
    b[2] = (uint8_t)sh;
    b[3] = (uint8_t)(sh >> 8);
}

static void quant_iq4_nl(const float *x, uint8_t *b, int64_t i) {
    const uint16_t hd = f16_of((i & 1 ? -1.0f : 1.0f) * amax_of(x, 32) / 127.0f);
    const float id = inv(sl_f16_to_f32(hd));
    f16_put(b, hd);
    for (int l = 0; l < 16; l++)
        b[2 + l] = (uint8_t)(nearest(sl_kvalues_iq4nl, fin(x[l]) * id) |
                             nearest(sl_kvalues_iq4nl, fin(x[l + 16]) * id) << 4);
}

void sl_quant_row_simple(sl_dtype t, const float *src, void *dst, int64_t n) {
    SL_ASSERT(sl_dtype_is_block(t) && n % sl_dtype_block_size(t) == 0);
    const int32_t bs = sl_dtype_block_size(t);
    const size_t bb = sl_dtype_block_bytes(t);
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / bs; i++, b += bb, src += bs) {
        switch (t) {
        case SL_DTYPE_Q8_0:
        case SL_DTYPE_Q4_0:
        case SL_DTYPE_Q5_0: quant_sym32(t, src, b, i); break;
        case SL_DTYPE_Q4_1:
        case SL_DTYPE_Q5_1: quant_aff32(t, src, b); break;
        case SL_DTYPE_MXFP4: quant_mxfp4(src, b); break;
        case SL_DTYPE_Q2_K: quant_q2_k(src, b); break;
        case SL_DTYPE_Q3_K: quant_q3_k(src, b); break;
        case SL_DTYPE_Q4_K:
        case SL_DTYPE_Q5_K: quant_q45_k(t, src, b); break;
        case SL_DTYPE_Q6_K: quant_q6_k(src, b); break;
        case SL_DTYPE_IQ4_XS: quant_iq4_xs(src, b); break;
        case SL_DTYPE_IQ4_NL: quant_iq4_nl(src, b, i); break;
        default: SL_ASSERT(0);
        }
    }
}
