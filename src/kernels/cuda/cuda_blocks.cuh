/*
 * ggml's block types (GGUF weights) on the GPU: each type's weights decoded to float32 with
 * exactly the operations of ggml's dequantize_row_* (ggml-quants.c), unfused and in the same
 * order (a product then a sum is two roundings, never an FMA), so a decoded weight has the bits
 * the C reference gives (compiled without contraction, as -std=c11 does).
 *
 * The kernels (cuda_blocks.cu) take a row 32 weights at a time: a "unit". A unit is a whole
 * block of the 32-wide types, and an eighth of a 256-wide super-block (K-quants, IQ4_XS), chosen
 * so that its bytes are few, contiguous runs: e.g. Q4_K's unit j is the 16 bytes qs[16 j ..]
 * (their low nibbles are 16 weights of sub-block 2 (j / 2), the high nibbles 16 of the next),
 * so 8 lanes read a super-block's 128 code bytes in one 16-byte load each. Per type, bu<DT>:
 *   BS, BB, UPB   elements and bytes of a block, units in a block
 *   U             what a unit needs after its loads (codes as words, scales as floats)
 *   load(u,b,j)   unit j of the block at b (any alignment: GGUF rows of 18-, 17- or 210-byte
 *                 blocks are not word-aligned)
 *   deq(u,g)      the unit's weights 4g .. 4g+3 (g < 8, known at compile time)
 *   xoff(j,g)     where in the block those four weights are (they are always contiguous)
 *
 * Layouts (ggml-common.h; f16 = IEEE half, little-endian; e = element index in the block):
 *   Q8_0   34 B  d:f16 | qs[32]:i8                        w = qs[e] * d
 *   Q4_0   18 B  d:f16 | qs[16]                           w = (nib - 8) * d
 *   Q4_1   20 B  d:f16 m:f16 | qs[16]                     w = nib * d + m
 *   Q5_0   22 B  d:f16 | qh:u32 | qs[16]                  w = ((nib | qh.e << 4) - 16) * d
 *   Q5_1   24 B  d:f16 m:f16 | qh:u32 | qs[16]            w = (nib | qh.e << 4) * d + m
 *   MXFP4  17 B  e:e8m0 | qs[16]                          w = e2m1x2[nib] * 2^(e - 128)
 *            (32-wide: byte i holds e = i in its low nibble, e = i + 16 in its high nibble)
 *   Q2_K   84 B  scales[16] | qs[64] | d:f16 dmin:f16     w = d sc.lo * q2 - dmin sc.hi
 *   Q3_K  110 B  hmask[32] | qs[64] | scales[12] | d:f16   w = d (sc6 - 32) * (q2 - 4 !hbit)
 *   Q4_K  144 B  d dmin | scales[12] | qs[128]            w = d sc6 * nib - dmin m6
 *   Q5_K  176 B  d dmin | scales[12] | qh[32] | qs[128]   w = d sc6 * (nib + 16 hbit) - dmin m6
 *   Q6_K  210 B  ql[128] | qh[64] | scales[16]:i8 | d:f16 w = d sc * ((ql4 | qh2 << 4) - 32)
 *   IQ4_XS 136 B d:f16 | scales_h:u16 | scales_l[4] | qs[128]  w = d (ls6 - 32) * iq4nl[nib]
 *   IQ4_NL  18 B d:f16 | qs[16] (Q4_0's layout)           w = d * iq4nl[nib]
 *
 *   Q2_K/Q3_K/Q6_K, halves n of 128: e = 128 n + 32 k + l (k < 4, l < 32) takes byte l of the
 *   half's 32 (Q6_K: 64 low + 32 high) code bytes, bits 2k (Q6_K: nibble k & 1 of byte l + 32
 *   (k & 1), high bits 2k of qh), scale 8 n + 2 k + l / 16. Unit j = (n = j / 4, l in
 *   8 (j % 4) .. +7): four runs of 8 weights, one per k.
 *   Q4_K/Q5_K, pairs p of 64: e = 64 p + l takes the low nibble of qs[32 p + l], e = 64 p + 32 + l
 *   the high one (l < 32); scales 2 p and 2 p + 1 (6-bit scale and min, packed in 12 bytes);
 *   Q5_K's fifth bit is bit 2 p (low) / 2 p + 1 (high) of qh[l]. Unit j = (p = j / 2, l in
 *   16 (j % 2) .. +15): two runs of 16.
 *   IQ4_XS, sub-blocks of 32 as Q4_0's layout, unit = sub-block, 6-bit scale from both fields.
 */
#ifndef SL_CUDA_BLOCKS_CUH
#define SL_CUDA_BLOCKS_CUH

#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------ loads */

/* Bytes of weights at any alignment, through the read-only cache. A word that holds a byte of
 * the range is read whole: it never crosses a page, so no read faults past the data. */
__device__ __forceinline__ uint32_t blk_ld8(const uint8_t *p) {
    return __ldg(p);
}

__device__ __forceinline__ uint32_t blk_ld16(const uint8_t *p) {
    if ((uintptr_t)p & 1) return (uint32_t)__ldg(p) | (uint32_t)__ldg(p + 1) << 8;
    return __ldg((const uint16_t *)p);
}

/* W little-endian words from p: 16-byte loads where p allows, else aligned words funnel-shifted
 * (W + 1 loads when p is not word-aligned). */
template <int W> __device__ __forceinline__ void blk_ldw(uint32_t (&v)[W], const uint8_t *p) {
    const uintptr_t a = (uintptr_t)p;
    if (W % 4 == 0 && (a & 15) == 0) {
#pragma unroll
        for (int i = 0; i < W / 4; i++) {
            const uint4 q = __ldg((const uint4 *)p + i);
            v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
        }
        return;
    }
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 3) * 8;
    uint32_t cur = __ldg(w);
#pragma unroll
    for (int i = 0; i < W; i++) {
        const uint32_t nxt = i + 1 < W || sh ? __ldg(w + i + 1) : 0u;
        v[i] = __funnelshift_r(cur, nxt, sh); /* cur when sh == 0 */
        cur = nxt;
    }
}

/* Byte i of a word: unsigned, and as int8. */
__device__ __forceinline__ int blk_u8(uint32_t w, int i) {
    return (int)((w >> (8 * i)) & 0xffu);
}
__device__ __forceinline__ int blk_s8(uint32_t w, int i) {
    return (int)(int8_t)(uint8_t)(w >> (8 * i));
}

/* Byte idx (runtime, < 12) of three words, without indexing a register array (which would
 * put it in local memory). */
__device__ __forceinline__ int blk_byte12(uint32_t a, uint32_t b, uint32_t c, int idx) {
    const uint32_t w = idx < 4 ? a : idx < 8 ? b : c;
    return (int)((w >> (8 * (idx & 3))) & 0xffu);
}

/* Entry n (< 16) of a table of 16 int8 held as four words (entries 4i .. 4i+3 in word i, low
 * byte first): a byte permute over each half, and the half picked by bit 3. */
__device__ __forceinline__ float blk_lut(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                         uint32_t n) {
    const uint32_t lo = __byte_perm(t0, t1, n & 7u), hi = __byte_perm(t2, t3, n & 7u);
    return (float)(int8_t)(uint8_t)(n & 8u ? hi : lo);
}

/* ggml's kvalues_iq4nl: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113 */
#define BLK_IQ4NL 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u
/* e2m1 values doubled (ggml's kvalues_mxfp4): 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 | -4 -6 -8 -12 */
#define BLK_E2M1X2 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu

/* 2^(e - 128), half the E8M0 scale (the e2m1 table is doubled): a denormal for e < 2. */
__device__ __forceinline__ float blk_e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* Nibble i of a word's 4 bytes: low (hi = 0) or high. */
__device__ __forceinline__ int blk_nib(uint32_t w, int i, int hi) {
    return (int)((w >> (8 * i + 4 * hi)) & 15u);
}

/* The 6-bit scale and min of sub-block is (< 8) from the 12 packed bytes of Q4_K / Q5_K (s0,
 * s1, s2: bytes 0-3, 4-7, 8-11): scales 0-3 and mins 0-3 are the low 6 bits of bytes 0-3 and
 * 4-7; scales and mins 4-7 are the nibbles of bytes 8-11 with bytes 0-7's top 2 bits above. */
__device__ __forceinline__ void blk_scale_min_k4(uint32_t s0, uint32_t s1, uint32_t s2, int is,
                                                 int &sc, int &m) {
    if (is < 4) {
        sc = blk_byte12(s0, s1, s2, is) & 63;
        m = blk_byte12(s0, s1, s2, is + 4) & 63;
    } else {
        const int b = blk_byte12(s0, s1, s2, is + 4);
        sc = (b & 15) | (blk_byte12(s0, s1, s2, is - 4) >> 6) << 4;
        m = (b >> 4) | (blk_byte12(s0, s1, s2, is) >> 6) << 4;
    }
}

/* ------------------------------------------------------------ types */

template <int DT> struct bu;

template <> struct bu<SL_DTYPE_Q8_0> {
    static constexpr int BS = 32, BB = 34, UPB = 1;
    struct U {
        float d;
        uint32_t q[8];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        u.d = cu_f16((uint16_t)blk_ld16(b));
        blk_ldw<8>(u.q, b + 2);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        const uint32_t w = u.q[g];
        return make_float4(__fmul_rn((float)blk_s8(w, 0), u.d), __fmul_rn((float)blk_s8(w, 1), u.d),
                           __fmul_rn((float)blk_s8(w, 2), u.d),
                           __fmul_rn((float)blk_s8(w, 3), u.d));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

/* The 32-wide nibble types: weights 4g .. 4g+3 are the low (g < 4) or high nibbles of code
 * word g % 4. */
template <> struct bu<SL_DTYPE_Q4_0> {
    static constexpr int BS = 32, BB = 18, UPB = 1;
    struct U {
        float d;
        uint32_t q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        u.d = cu_f16((uint16_t)blk_ld16(b));
        blk_ldw<4>(u.q, b + 2);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        const uint32_t w = u.q[g & 3];
        const int hi = g >> 2;
        return make_float4(__fmul_rn((float)(blk_nib(w, 0, hi) - 8), u.d),
                           __fmul_rn((float)(blk_nib(w, 1, hi) - 8), u.d),
                           __fmul_rn((float)(blk_nib(w, 2, hi) - 8), u.d),
                           __fmul_rn((float)(blk_nib(w, 3, hi) - 8), u.d));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

template <> struct bu<SL_DTYPE_Q4_1> {
    static constexpr int BS = 32, BB = 20, UPB = 1;
    struct U {
        float d, m;
        uint32_t q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        uint32_t v[5];
        blk_ldw<5>(v, b);
        u.d = cu_f16((uint16_t)(v[0] & 0xffffu)), u.m = cu_f16((uint16_t)(v[0] >> 16));
        u.q[0] = v[1], u.q[1] = v[2], u.q[2] = v[3], u.q[3] = v[4];
    }
    static __device__ __forceinline__ float one(const U &u, int q) {
        return __fadd_rn(__fmul_rn((float)q, u.d), u.m);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        const uint32_t w = u.q[g & 3];
        const int hi = g >> 2;
        return make_float4(one(u, blk_nib(w, 0, hi)), one(u, blk_nib(w, 1, hi)),
                           one(u, blk_nib(w, 2, hi)), one(u, blk_nib(w, 3, hi)));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

template <> struct bu<SL_DTYPE_Q5_0> {
    static constexpr int BS = 32, BB = 22, UPB = 1;
    struct U {
        float d;
        uint32_t h, q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        uint32_t h[1];
        u.d = cu_f16((uint16_t)blk_ld16(b));
        blk_ldw<1>(h, b + 2);
        u.h = h[0];
        blk_ldw<4>(u.q, b + 6);
    }
    /* element e = 4g + i: its nibble and bit e of qh */
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int q = blk_nib(u.q[g & 3], i, g >> 2) | (int)((u.h >> (4 * g + i)) & 1u) << 4;
        return __fmul_rn((float)(q - 16), u.d);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

template <> struct bu<SL_DTYPE_Q5_1> {
    static constexpr int BS = 32, BB = 24, UPB = 1;
    struct U {
        float d, m;
        uint32_t h, q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        uint32_t v[6];
        blk_ldw<6>(v, b);
        u.d = cu_f16((uint16_t)(v[0] & 0xffffu)), u.m = cu_f16((uint16_t)(v[0] >> 16));
        u.h = v[1];
        u.q[0] = v[2], u.q[1] = v[3], u.q[2] = v[4], u.q[3] = v[5];
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int q = blk_nib(u.q[g & 3], i, g >> 2) | (int)((u.h >> (4 * g + i)) & 1u) << 4;
        return __fadd_rn(__fmul_rn((float)q, u.d), u.m);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

template <> struct bu<SL_DTYPE_MXFP4> {
    static constexpr int BS = 32, BB = 17, UPB = 1;
    struct U {
        float d;
        uint32_t q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        u.d = blk_e8m0_half(blk_ld8(b));
        blk_ldw<4>(u.q, b + 1);
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        return __fmul_rn(blk_lut(BLK_E2M1X2, (uint32_t)blk_nib(u.q[g & 3], i, g >> 2)), u.d);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

/* IQ4_XS's grid, one f16 scale per 32 (llama-quantize's type for the rows of an IQ4_XS model
 * that are not whole super-blocks). */
template <> struct bu<SL_DTYPE_IQ4_NL> {
    static constexpr int BS = 32, BB = 18, UPB = 1;
    struct U {
        float d;
        uint32_t q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int) {
        u.d = cu_f16((uint16_t)blk_ld16(b));
        blk_ldw<4>(u.q, b + 2);
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        return __fmul_rn(u.d, blk_lut(BLK_IQ4NL, (uint32_t)blk_nib(u.q[g & 3], i, g >> 2)));
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int, int g) { return 4 * g; }
};

/* Q2_K unit j: half n = j / 4, l in 8 m .. 8 m + 7 (m = j % 4); weights 4g .. 4g+3 are
 * k = g / 2, l = 8 m + 4 (g % 2) + 0..3. */
template <> struct bu<SL_DTYPE_Q2_K> {
    static constexpr int BS = 256, BB = 84, UPB = 8;
    struct U {
        uint32_t q[2];
        float dl[4], ml[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        const int n = j >> 2, m = j & 3;
        uint32_t s[2], dm[1];
        blk_ldw<2>(u.q, b + 16 + 32 * n + 8 * m);
        blk_ldw<2>(s, b + 8 * n); /* scales 8n .. 8n+7 */
        blk_ldw<1>(dm, b + 80);
        const float d = cu_f16((uint16_t)(dm[0] & 0xffffu)), dmin = cu_f16((uint16_t)(dm[0] >> 16));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int sc = blk_byte12(s[0], s[1], 0, 2 * k + (m >> 1));
            u.dl[k] = __fmul_rn(d, (float)(sc & 15));
            u.ml[k] = __fmul_rn(dmin, (float)(sc >> 4));
        }
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int k = g >> 1, q = (blk_u8(u.q[g & 1], i) >> (2 * k)) & 3;
        return __fsub_rn(__fmul_rn(u.dl[k], (float)q), u.ml[k]);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int j, int g) {
        return 128 * (j >> 2) + 32 * (g >> 1) + 8 * (j & 3) + 4 * (g & 1);
    }
};

/* Q3_K unit j: as Q2_K's; the high bit of weight (n, k, l) is bit 4 n + k of hmask[l], and its
 * 6-bit scale s = 8 n + 2 k + l / 16 has its low nibble in byte s % 8 (low nibble for s < 8,
 * high for s >= 8) and its top two bits at bit 2 (s / 4) of byte 8 + s % 4. */
template <> struct bu<SL_DTYPE_Q3_K> {
    static constexpr int BS = 256, BB = 110, UPB = 8;
    struct U {
        uint32_t q[2], h[2]; /* h: the hmask bits of this half (4 n .. 4 n + 3) moved to 0 .. 3 */
        float dl[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        const int n = j >> 2, m = j & 3;
        uint32_t s[3];
        blk_ldw<2>(u.h, b + 8 * m);
        blk_ldw<2>(u.q, b + 32 + 32 * n + 8 * m);
        blk_ldw<3>(s, b + 96);
        const float d = cu_f16((uint16_t)blk_ld16(b + 108));
        u.h[0] = (u.h[0] >> (4 * n)) & 0x0F0F0F0Fu, u.h[1] = (u.h[1] >> (4 * n)) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int s8 = 2 * k + (m >> 1); /* s % 8, s = 8 n + s8 */
            const int lo = (blk_byte12(s[0], s[1], s[2], s8) >> (4 * n)) & 15;
            const int hi =
                (blk_byte12(s[0], s[1], s[2], 8 + (s8 & 3)) >> (2 * (2 * n + (k >> 1)))) & 3;
            u.dl[k] = __fmul_rn(d, (float)((lo | hi << 4) - 32));
        }
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int k = g >> 1, q = (blk_u8(u.q[g & 1], i) >> (2 * k)) & 3;
        const int hb = (blk_u8(u.h[g & 1], i) >> k) & 1;
        return __fmul_rn(u.dl[k], (float)(q - (hb ? 0 : 4)));
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int j, int g) {
        return 128 * (j >> 2) + 32 * (g >> 1) + 8 * (j & 3) + 4 * (g & 1);
    }
};

/* Q4_K unit j: pair p = j / 2, l in 16 h .. 16 h + 15 (h = j % 2): weights 4g .. 4g+3 are the
 * low (g < 4, sub-block 2p) or high (sub-block 2p + 1) nibbles of code word g % 4. */
template <> struct bu<SL_DTYPE_Q4_K> {
    static constexpr int BS = 256, BB = 144, UPB = 8;
    struct U {
        uint32_t q[4];
        float d1, m1, d2, m2;
    };
    /* d and dmin, the scale/min pairs of sub-blocks 2p and 2p + 1 of the header words hd */
    static __device__ __forceinline__ void scales(U &u, const uint32_t (&hd)[4], int p) {
        const float d = cu_f16((uint16_t)(hd[0] & 0xffffu)), dmin = cu_f16((uint16_t)(hd[0] >> 16));
        int sc, m;
        blk_scale_min_k4(hd[1], hd[2], hd[3], 2 * p, sc, m);
        u.d1 = __fmul_rn(d, (float)sc), u.m1 = __fmul_rn(dmin, (float)m);
        blk_scale_min_k4(hd[1], hd[2], hd[3], 2 * p + 1, sc, m);
        u.d2 = __fmul_rn(d, (float)sc), u.m2 = __fmul_rn(dmin, (float)m);
    }
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        uint32_t hd[4];
        blk_ldw<4>(hd, b);
        blk_ldw<4>(u.q, b + 16 + 16 * j);
        scales(u, hd, j >> 1);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        const uint32_t w = u.q[g & 3];
        const int hi = g >> 2;
        const float d = hi ? u.d2 : u.d1, m = hi ? u.m2 : u.m1;
        return make_float4(__fsub_rn(__fmul_rn(d, (float)blk_nib(w, 0, hi)), m),
                           __fsub_rn(__fmul_rn(d, (float)blk_nib(w, 1, hi)), m),
                           __fsub_rn(__fmul_rn(d, (float)blk_nib(w, 2, hi)), m),
                           __fsub_rn(__fmul_rn(d, (float)blk_nib(w, 3, hi)), m));
    }
    static __device__ __forceinline__ int xoff(int j, int g) {
        return 64 * (j >> 1) + 32 * (g >> 2) + 16 * (j & 1) + 4 * (g & 3);
    }
};

template <> struct bu<SL_DTYPE_Q5_K> {
    static constexpr int BS = 256, BB = 176, UPB = 8;
    struct U {
        uint32_t q[4], h[4]; /* h: qh bits 2p (low nibbles), 2p + 1 (high) moved to 0, 1 */
        float d1, m1, d2, m2;
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        uint32_t hd[4];
        blk_ldw<4>(hd, b);
        blk_ldw<4>(u.h, b + 16 + 16 * (j & 1));
        blk_ldw<4>(u.q, b + 48 + 16 * j);
        const int p = j >> 1;
#pragma unroll
        for (int i = 0; i < 4; i++)
            u.h[i] = (u.h[i] >> (2 * p)) & 0x03030303u;
        const float d = cu_f16((uint16_t)(hd[0] & 0xffffu)), dmin = cu_f16((uint16_t)(hd[0] >> 16));
        int sc, m;
        blk_scale_min_k4(hd[1], hd[2], hd[3], 2 * p, sc, m);
        u.d1 = __fmul_rn(d, (float)sc), u.m1 = __fmul_rn(dmin, (float)m);
        blk_scale_min_k4(hd[1], hd[2], hd[3], 2 * p + 1, sc, m);
        u.d2 = __fmul_rn(d, (float)sc), u.m2 = __fmul_rn(dmin, (float)m);
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int hi = g >> 2;
        const int q = blk_nib(u.q[g & 3], i, hi) + (((blk_u8(u.h[g & 3], i) >> hi) & 1) ? 16 : 0);
        return __fsub_rn(__fmul_rn(hi ? u.d2 : u.d1, (float)q), hi ? u.m2 : u.m1);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int j, int g) {
        return 64 * (j >> 1) + 32 * (g >> 2) + 16 * (j & 1) + 4 * (g & 3);
    }
};

/* Q6_K unit j: half n = j / 4, l in 8 m .. 8 m + 7 (m = j % 4): weights 4g .. 4g+3 are k = g / 2
 * (low nibbles of ql[64n + l] for k = 0, of ql[64n + 32 + l] for 1, their high nibbles for 2
 * and 3; qh[32n + l] bits 2k, 2k+1 above), l = 8 m + 4 (g % 2) + 0..3. */
template <> struct bu<SL_DTYPE_Q6_K> {
    static constexpr int BS = 256, BB = 210, UPB = 8;
    struct U {
        uint32_t a[2], b[2], h[2];
        float ds[4]; /* d * scale of k */
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        const int n = j >> 2, m = j & 3;
        uint32_t s[2];
        blk_ldw<2>(u.a, b + 64 * n + 8 * m);
        blk_ldw<2>(u.b, b + 64 * n + 32 + 8 * m);
        blk_ldw<2>(u.h, b + 128 + 32 * n + 8 * m);
        blk_ldw<2>(s, b + 192 + 8 * n);
        const float d = cu_f16((uint16_t)blk_ld16(b + 208));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int sc = (int)(int8_t)(uint8_t)blk_byte12(s[0], s[1], 0, 2 * k + (m >> 1));
            u.ds[k] = __fmul_rn(d, (float)sc);
        }
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        const int k = g >> 1, w = g & 1;
        const int lo = blk_nib(k & 1 ? u.b[w] : u.a[w], i, k >> 1);
        const int q = (lo | ((blk_u8(u.h[w], i) >> (2 * k)) & 3) << 4) - 32;
        return __fmul_rn(u.ds[k], (float)q);
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int j, int g) {
        return 128 * (j >> 2) + 32 * (g >> 1) + 8 * (j & 3) + 4 * (g & 1);
    }
};

template <> struct bu<SL_DTYPE_IQ4_XS> {
    static constexpr int BS = 256, BB = 136, UPB = 8;
    struct U {
        float dl;
        uint32_t q[4];
    };
    static __device__ __forceinline__ void load(U &u, const uint8_t *b, int j) {
        uint32_t hd[2];
        blk_ldw<2>(hd, b); /* d, scales_h, scales_l[4] */
        blk_ldw<4>(u.q, b + 8 + 16 * j);
        const float d = cu_f16((uint16_t)(hd[0] & 0xffffu));
        const int ls = (blk_u8(hd[1], j >> 1) >> (4 * (j & 1)) & 15) |
                       (int)((hd[0] >> (16 + 2 * j)) & 3u) << 4;
        u.dl = __fmul_rn(d, (float)(ls - 32));
    }
    static __device__ __forceinline__ float one(const U &u, int g, int i) {
        return __fmul_rn(u.dl, blk_lut(BLK_IQ4NL, (uint32_t)blk_nib(u.q[g & 3], i, g >> 2)));
    }
    static __device__ __forceinline__ float4 deq(const U &u, int g) {
        return make_float4(one(u, g, 0), one(u, g, 1), one(u, g, 2), one(u, g, 3));
    }
    static __device__ __forceinline__ int xoff(int j, int g) { return 32 * j + 4 * g; }
};

/* ------------------------------------------------------ the order of sums */

/* What every kernel of cuda_blocks.cu sums with, so that each output's bits depend only on its
 * row, its x row and K: lane l takes units l, l + 32, ...; a unit adds its 8 groups of 4 in
 * turn (blk_dot4); the lanes' sums then go through warp_sum's butterfly. */

/* Staged x: 4 floats of padding after every 32, so that the 8 lanes of a quarter-warp reading
 * 16 bytes each at units 32 floats apart fall on distinct banks. */
#define BLK_UNIT_FLOATS 36

__device__ __forceinline__ int blk_pad(int e) {
    return e + 4 * (e >> 5);
}

/* w . x of a group, fma(w3, x3, fma(w2, x2, fma(w1, x1, w0 x0))), every rounding spelled out (no
 * contraction left to the compiler). */
__device__ __forceinline__ float blk_dot4(const float4 &w, const float4 &x) {
    return __fmaf_rn(w.w, x.w, __fmaf_rn(w.z, x.z, __fmaf_rn(w.y, x.y, __fmul_rn(w.x, x.x))));
}

/*
 * Stages columns e0 .. e0 + ne - 1 of nrows rows of x (row stride ldx floats) into xs (row t at
 * t * xts, column e at blk_pad(e - e0)); rows at or past valid are zeros. All threads call it;
 * ends with a barrier.
 */
__device__ __forceinline__ void blk_stage(float *xs, int xts, const float *x, size_t ldx, int nrows,
                                          int valid, int e0, int ne) {
    const bool vec = (((uintptr_t)(x + e0) | (ldx * sizeof(float))) & 15) == 0;
    if (vec) {
        const int q = ne / 4;
        for (int i = threadIdx.x; i < nrows * q; i += blockDim.x) {
            const int t = i / q, e = (i % q) * 4;
            const float4 v = t < valid ? __ldg((const float4 *)(x + (size_t)t * ldx + e0 + e))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4 *)(xs + (size_t)t * xts + blk_pad(e)) = v;
        }
    } else {
        for (int i = threadIdx.x; i < nrows * ne; i += blockDim.x) {
            const int t = i / ne, e = i % ne;
            xs[(size_t)t * xts + blk_pad(e)] =
                t < valid ? __ldg(x + (size_t)t * ldx + e0 + e) : 0.0f;
        }
    }
    __syncthreads();
}

/*
 * The order's per-lane part over units s0 .. s1-1 (one stage: x columns 32 s0 .. in xs, row t
 * at t * xts) for R rows (row[r]: the row's first byte) and NT tokens, added to acc.
 */
template <int DT, int R, int NT>
__device__ __forceinline__ void blk_units(float (&acc)[R][NT], const uint8_t *const (&row)[R],
                                          const float *xs, int xts, int s0, int s1) {
    using B = bu<DT>;
#pragma unroll 1
    for (int u = s0 + (int)(threadIdx.x & 31); u < s1; u += 32) {
        const int b = u / B::UPB, j = u % B::UPB;
        typename B::U st[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            B::load(st[r], row[r] + (size_t)b * B::BB, j);
        const int e0 = (b * B::UPB - s0) * 32; /* the block's first column in the stage */
#pragma unroll
        for (int g = 0; g < 8; g++) {
            float4 w[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                w[r] = B::deq(st[r], g);
            const float *xp = xs + blk_pad(e0 + B::xoff(j, g));
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 xv = *(const float4 *)(xp + (size_t)t * xts);
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][t] = __fadd_rn(acc[r][t], blk_dot4(w[r], xv));
            }
        }
    }
}

/* Calls f(bu_tag<DT>{}) for a block dtype dt (host code: one template instance per type);
 * returns 0 for any other dtype. */
template <int DT> struct bu_tag { static constexpr int dt = DT; };

template <typename F> static int blk_switch(int dt, F &&f) {
    switch (dt) {
    case SL_DTYPE_Q8_0: f(bu_tag<SL_DTYPE_Q8_0>{}); return 1;
    case SL_DTYPE_Q4_0: f(bu_tag<SL_DTYPE_Q4_0>{}); return 1;
    case SL_DTYPE_Q4_1: f(bu_tag<SL_DTYPE_Q4_1>{}); return 1;
    case SL_DTYPE_Q5_0: f(bu_tag<SL_DTYPE_Q5_0>{}); return 1;
    case SL_DTYPE_Q5_1: f(bu_tag<SL_DTYPE_Q5_1>{}); return 1;
    case SL_DTYPE_Q2_K: f(bu_tag<SL_DTYPE_Q2_K>{}); return 1;
    case SL_DTYPE_Q3_K: f(bu_tag<SL_DTYPE_Q3_K>{}); return 1;
    case SL_DTYPE_Q4_K: f(bu_tag<SL_DTYPE_Q4_K>{}); return 1;
    case SL_DTYPE_Q5_K: f(bu_tag<SL_DTYPE_Q5_K>{}); return 1;
    case SL_DTYPE_Q6_K: f(bu_tag<SL_DTYPE_Q6_K>{}); return 1;
    case SL_DTYPE_IQ4_XS: f(bu_tag<SL_DTYPE_IQ4_XS>{}); return 1;
    case SL_DTYPE_MXFP4: f(bu_tag<SL_DTYPE_MXFP4>{}); return 1;
    case SL_DTYPE_IQ4_NL: f(bu_tag<SL_DTYPE_IQ4_NL>{}); return 1;
    default: return 0;
    }
}

#endif /* SL_CUDA_BLOCKS_CUH */
