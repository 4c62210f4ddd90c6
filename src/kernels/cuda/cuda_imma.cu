/*
 * Q4 prefill products on int8 tensor cores: y[T, N] = x[T, K] . W[N, K]^T (+ b) for Q4 weights
 * with T > 4 and K % 64 == 0 while x is quantised to int8 (c->q4x: unless
 * sl_cuda_params.int4_float_act), one product (cu_imma_matmul) or a batch of them
 * (cu_imma_matmul_batch: a prefill chunk's routed experts, a layer's q/k/v).
 *
 * The arithmetic is quant.h's SL_QPATH_INT8, the CPU's on AVX-512 VNNI and decode's (SL_Q4X in
 * cuda_matmul.cu): x quantised per token and 64-column group (m = max |x|, d = m / 127,
 * xq = rint(x min(127 / m, FLT_MAX))), integer products with the codes, one float step per
 * segment s of L = min(group, 64) columns (one weight group g(s) and one x group):
 *     y = sum_s scale_g(s) (d_s sum_{k in s} (q_k - 8) xq_k) + (bias_g(s) + 8 scale_g(s)) X_s
 * X_s the float sum of x over the segment. Per output the float steps run in column order,
 *     f = float(I_s), acc = fma(bz, X_s, fma(scale, d_s f, acc)), bz = fma(8, scale, bias)
 * then y = acc + b: the same in every tile shape, batch or slice, and in imma_ref, the plain
 * kernel beside this one (bitwise, tests/cuda/test_cuda_ops.c). Against decode's GEMVs and the
 * CPU only the float rounding differs (X and the steps' order): the xq, d and integer sums are
 * the same.
 *
 * Two launches a product (or batch):
 *   imma_quant  x [T, K] quantised into the device scratch once (quant_staged's arithmetic, so
 *               the same xq, d and chunk sums as decode), as xq [T, K] bytes, each 32-column
 *               chunk in the order the codes come out of a weight word (below), then a record
 *               {d, X_s, c0_s, 0} per token and segment, c0 = 1.5 2^23 as int - 8 sum xq.
 *   imma_gemm   tiles of 128 weight rows x BT tokens (BT = 128, 64 or 32, chosen per launch by
 *               imma_pick), K in stages of 64 columns (one x group) through a 4-stage cp.async
 *               pipeline; per warp 16 MI rows x 8 NJ tokens of m16n8k32 MMAs, u8 codes (A) by s8
 *               xq (B) into int32: exact, so the order within a segment is free.
 *
 * Fragments (PTX ISA, mma.m16n8k32 .u8/.s8: g = lane / 4, q = lane % 4; A row-major 16 x 32,
 * a0 row g cols 4q..4q+3, a1 row g+8 the same, a2 row g cols 16+4q.., a3 row g+8; B 32 x 8,
 * b0 rows 4q..4q+3 of column g, b1 rows 16+4q..; D d0, d1 row g cols 2q, 2q+1, d2, d3 row g+8):
 * a Q4 row's 16 bytes of a 32-column chunk are 4 words of 8 codes, low nibble first, so word q
 * holds columns 8q..8q+7 and
 *     lo = w & 0x0F0F0F0F = the codes of columns 8q, 8q+2, 8q+4, 8q+6 (a byte each)
 *     hi = w >> 4 & 0x0F0F0F0F = those of 8q+1, 8q+3, 8q+5, 8q+7.
 * Taking MMA column kappa = 4q + e as column 8q + 2e and 16 + 4q + e as 8q + 2e + 1, a thread's
 * A fragment is lo and hi of word q of rows g and g+8, and ldmatrix of 8 rows x 16 bytes hands
 * lane (g, q) word q of row g: one ldmatrix.x4 and three logic ops a word give two m16 tiles'
 * fragments. So xq is stored permuted alike, each chunk as bytes [lo0 lo1 lo2 lo3 hi0 hi1 hi2
 * hi3] (lo_j: xq of columns 8j, 8j+2, 8j+4, 8j+6), and ldmatrix of 8 tokens x 16 bytes hands lane
 * (g, q) b0 (first 16 bytes) or b1 (last 16) of token g.
 *
 * The codes enter unsigned (u8 x s8): sum q xq - 8 sum xq is the centred sum, and the first MMA
 * of a segment starts from c0 (the token's - 8 sum xq plus 0x4B400000, the bits of 1.5 2^23), so
 * the int32 result is the bits of the float 1.5 2^23 + I (|I| <= 64 * 8 * 127 < 2^22): f = that
 * float - 1.5 2^23, exact, one FADD instead of a conversion (16 a clock an SM) and no centring
 * of the codes.
 *
 * Shared memory, per stage: codes [2 chunks][128 rows][16 B], xq [4 quarters][BT tokens][16 B]
 * (quarter: 16 bytes of a chunk), records [BT][64 / L], then [64 / L][128] float2 {scale, bz}
 * (loaded through registers: 2-byte scales do not suit cp.async). Eight consecutive rows or
 * tokens of one chunk or quarter are 128 contiguous bytes: ldmatrix reads them without bank
 * conflicts.
 */
#include <float.h>

#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "kernels/cuda/cuda_backend.h"
}

#define IMMA_BK     64 /* columns of a stage: one x group */
#define IMMA_STAGES 4
#define IMMA_BR     128        /* weight rows of a tile */
#define IMMA_F15    0x4B400000 /* the bits of 1.5 * 2^23 */

/* One x quantised: its rows [T, K], the copy's bytes [T, K] and records [T, K / L]. */
typedef struct imma_qjob {
    const float *x;
    uint8_t *xq;
    float4 *rec;
    int T;
} imma_qjob;

/* One product of a batch: its tiles tile0 .. tile0 + tiles_n * ceil(T / BT) - 1 of the launch,
 * row tiles fastest. */
typedef struct imma_item {
    float *y;
    const uint8_t *xq;
    const float4 *rec;
    cu_w w;
    int N, T, tile0, tiles_n;
} imma_item;

/* Bytes of the quantised copy of T rows of K (xq, then the records). */
static size_t imma_xbytes(int64_t T, int64_t K, int L) {
    return (size_t)T * (size_t)K + (size_t)T * (size_t)(K / L) * sizeof(float4);
}

/* ------------------------------------------------------------- quantise x */

/*
 * Eight lanes a (token, 64-column group), lane s holding columns 8 s .. 8 s + 7 (chunk s / 4,
 * its word s % 4), quantised as quant_staged quantises them (cu_q8_lane: the same xq, d and
 * chunk sums X_chunk = (X_0 + X_2) + (X_1 + X_3)); a group's X = X_chunk0 + X_chunk1. A group
 * whose X is not finite (an Inf or NaN in x, or an overflowing sum) gets xq = 0 and d = NaN, as
 * the CPU's (quant.h): every output of its token is NaN. 256 threads: 32 groups a block;
 * blockIdx.y: the job (jobs == NULL: one).
 */
__global__ void __launch_bounds__(256)
    imma_quant(const imma_qjob *__restrict__ jobs, imma_qjob one, int K, int L) {
    cu_pdl_wait();
    const imma_qjob jb = jobs ? jobs[blockIdx.y] : one;
    const int G = K / 64, lane = threadIdx.x & 31, s = lane & 7;
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    const bool ok = i < (int64_t)jb.T * G; /* every lane stays for the shuffles */
    const int64_t t = ok ? i / G : 0;
    const int gi = ok ? (int)(i % G) : 0;
    float v[8];
    if (ok) {
        const float4 *f = (const float4 *)(jb.x + (size_t)t * K + (size_t)gi * 64 + s * 8);
        *(float4 *)v = __ldg(f);
        *(float4 *)(v + 4) = __ldg(f + 1);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = 0.0f;
    }
    float m, Xc;
    uint32_t lo, hi;
    int Sc;
    cu_q8_lane(v, m, lo, hi, Sc, Xc); /* lanes s and s ^ 4 hold the group's two chunks */
    const float Xg = __fadd_rn(Xc, __shfl_xor_sync(0xffffffffu, Xc, 4));
    int Sg = Sc + __shfl_xor_sync(0xffffffffu, Sc, 4);
    if (!ok) return;
    const bool bad = !isfinite(Xg);
    if (bad) lo = hi = 0, Sg = Sc = 0;
    const float d = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(m, 127.0f);
    const int c = 2 * gi + s / 4, j = s & 3;
    uint8_t *row = jb.xq + (size_t)t * K;
    *(uint32_t *)(row + 32 * c + 4 * j) = lo;
    *(uint32_t *)(row + 32 * c + 16 + 4 * j) = hi;
    if (L == 64 && s == 0)
        jb.rec[(size_t)t * G + gi] = make_float4(d, Xg, __int_as_float(IMMA_F15 - 8 * Sg), 0.0f);
    if (L == 32 && j == 0)
        jb.rec[(size_t)t * 2 * G + c] = make_float4(d, Xc, __int_as_float(IMMA_F15 - 8 * Sc), 0.0f);
}

/* ------------------------------------------------------------------ GEMM */

/* A tile shape: MI m16 tiles of weight rows and NJ n8 tiles of tokens a warp, WR x WT warps
 * (WR along the rows: 16 MI WR = 128), segments of L columns. Stage layout in bytes. */
template <int MI, int NJ, int WR, int WT, int L> struct imma_shape {
    static constexpr int BR = 16 * MI * WR, BT = 8 * NJ * WT, NT = 32 * WR * WT, SEG = 64 / L;
    static constexpr int W_BYTES = BR * 32, X_BYTES = BT * 64, R_BYTES = BT * SEG * 16;
    static constexpr int P_BYTES = SEG * BR * 8;
    static constexpr int XO = W_BYTES, RO = XO + X_BYTES, PO = RO + R_BYTES;
    static constexpr int STAGE = PO + P_BYTES, SMEM = IMMA_STAGES * STAGE;
    static constexpr int PE = (SEG * BR + NT - 1) / NT; /* {scale, bz} pairs a thread loads */
    static_assert(BR == IMMA_BR && MI % 2 == 0 && NJ % 2 == 0, "tile shape");
};

/* Four 8 x 8 b16 matrices (8 rows of 16 bytes each; lanes 8 i .. 8 i + 7 address matrix i's
 * rows): r[i] of lane l is bytes 4 (l % 4) .. 4 (l % 4) + 3 of row l / 4 of matrix i. */
__device__ __forceinline__ void imma_ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d = a . b + c for one m16n8k32 fragment: u8 codes by s8 xq, int32 accumulation. */
__device__ __forceinline__ void imma_mma(int (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2], int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %10, %11};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c0), "r"(c1));
#endif
}

/* d += a . b */
__device__ __forceinline__ void imma_mma_acc(int (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/*
 * The tile of rows n0 .. n0 + 127 and tokens t0 .. t0 + BT - 1 of y (a block of NT threads):
 * xq and rec the quantised x (imma_quant), smem the block's dynamic shared memory. Rows past N
 * and tokens past T read row N - 1 and token T - 1 (their sums are dropped).
 */
template <int MI, int NJ, int WR, int WT, int L>
__device__ __forceinline__ void imma_tile(float *__restrict__ y, const uint8_t *__restrict__ xq,
                                          const float4 *__restrict__ rec, const cu_w &w,
                                          const void *__restrict__ bias, int bias_dt, int N, int K,
                                          int T, int n0, int t0, uint8_t *smem) {
    using S = imma_shape<MI, NJ, WR, WT, L>;
    constexpr int BR = S::BR, BT = S::BT, NT = S::NT, SEG = S::SEG;
    constexpr uint32_t M4 = 0x0f0f0f0fu;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = warp % WR, wt = warp / WR, g = lane >> 2, q4 = lane & 3;
    const int nk = K / IMMA_BK, KL = K / L;
    const uint32_t sbase = cu_saddr(smem);

    /* stage kt's codes, xq and records into slot, asynchronously */
    auto load = [&](int slot, int kt) {
        const uint32_t st = sbase + (uint32_t)(slot * S::STAGE);
        const int k0 = kt * IMMA_BK;
#pragma unroll
        for (int i = 0; i < 2 * BR / NT; i++) { /* two 16-byte chunks a row, neighbours */
            const int p = tid + i * NT, r = p >> 1, c = p & 1;
            const int n = min(n0 + r, N - 1);
            cu_cp16(st + (uint32_t)((c * BR + r) * 16),
                    w.data + (size_t)n * w.ws + (size_t)(k0 / 2) + 16 * c);
        }
#pragma unroll
        for (int i = 0; i < 4 * BT / NT; i++) { /* four quarters a token */
            const int p = tid + i * NT, t = p >> 2, h = p & 3;
            const int tt = min(t0 + t, T - 1);
            cu_cp16(st + (uint32_t)(S::XO + (h * BT + t) * 16),
                    xq + (size_t)tt * K + (size_t)k0 + 16 * h);
        }
#pragma unroll
        for (int i = 0; i < (BT * SEG + NT - 1) / NT; i++) {
            const int p = tid + i * NT, t = p / SEG, j = p % SEG;
            if (p < BT * SEG) {
                const int tt = min(t0 + t, T - 1);
                cu_cp16(st + (uint32_t)(S::RO + (t * SEG + j) * 16),
                        rec + (size_t)tt * KL + (size_t)kt * SEG + j);
            }
        }
    };
    /* stage kt's {scale, bias + 8 scale} of the tile's rows: their raw bits loaded into
     * registers, widened and stored into the slot after the stage computing meanwhile (widened
     * at once, each load stalled its warp for the memory's latency) */
    uint32_t pr[S::PE][2];
    auto prm_load = [&](int kt) {
#pragma unroll
        for (int e = 0; e < S::PE; e++) {
            const int p = tid + e * NT, j = p / BR, r = p % BR;
            if (p < SEG * BR) {
                const int64_t n = min(n0 + r, N - 1);
                const size_t gi = (size_t)(n * w.G) + (size_t)((kt * IMMA_BK + j * L) >> w.gshift);
                pr[e][0] = cu_qparam_bits(w.scales, w.sdt, gi);
                pr[e][1] = cu_qparam_bits(w.biases, w.sdt, gi);
            }
        }
    };
    auto prm_store = [&](int slot) {
        float2 *P = (float2 *)(smem + slot * S::STAGE + S::PO);
#pragma unroll
        for (int e = 0; e < S::PE; e++) {
            const int p = tid + e * NT;
            if (p < SEG * BR) { /* [j][r]: p = j BR + r */
                const float sc = cu_qparam_widen(pr[e][0], w.sdt);
                P[p] = make_float2(sc, __fmaf_rn(8.0f, sc, cu_qparam_widen(pr[e][1], w.sdt)));
            }
        }
    };

    float acc[MI][NJ][4];
    int ai[MI][NJ][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int nj = 0; nj < NJ; nj++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][nj][e] = 0.0f;
    const int tw = wt * 8 * NJ + 2 * q4; /* the thread's first token in the tile (+ 8 nj, + 1) */
    const int rw = wr * 16 * MI + g;     /* its first row (+ 16 mi, + 8) */

    /* the MMAs and float steps of the stage in slot */
    auto compute = [&](int slot) {
        const uint32_t st = sbase + (uint32_t)(slot * S::STAGE);
        const uint8_t *sp = smem + slot * S::STAGE;
        const float4 *R = (const float4 *)(sp + S::RO);
        const float2 *P = (const float2 *)(sp + S::PO);
#pragma unroll
        for (int j = 0; j < 2; j++) { /* the stage's two 32-column chunks */
            const int sg = L == 64 ? 0 : j;
            const bool first = L == 32 || j == 0;
            int ci[NJ][2];
            if (first)
#pragma unroll
                for (int nj = 0; nj < NJ; nj++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        ci[nj][e] = __float_as_int(R[(tw + 8 * nj + e) * SEG + sg].z);
            uint32_t a[MI][4];
#pragma unroll
            for (int p = 0; p < MI / 2; p++) { /* rows 32 p + lane: m16 tiles 2p, 2p + 1 */
                uint32_t r[4];
                imma_ldsm4(r, st + (uint32_t)((j * BR + wr * 16 * MI + 32 * p + lane) * 16));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t u = r[2 * h], v = r[2 * h + 1]; /* rows g, g + 8 */
                    a[2 * p + h][0] = u & M4, a[2 * p + h][1] = v & M4;
                    a[2 * p + h][2] = (u >> 4) & M4, a[2 * p + h][3] = (v >> 4) & M4;
                }
            }
            uint32_t b[NJ][2];
            /* matrix i: tokens 16 p + 8 (i / 2) .., quarter 2 j + i % 2: b0, b1 of n8 tiles 2p,
             * 2p + 1 */
#pragma unroll
            for (int p = 0; p < NJ / 2; p++) {
                const int mx = lane >> 3;
                const int tok = wt * 8 * NJ + 16 * p + 8 * (mx >> 1) + (lane & 7);
                const int qt = 2 * j + (mx & 1);
                uint32_t r[4];
                imma_ldsm4(r, st + (uint32_t)(S::XO + (qt * BT + tok) * 16));
                b[2 * p][0] = r[0], b[2 * p][1] = r[1];
                b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) {
                    if (first)
                        imma_mma(ai[mi][nj], a[mi], b[nj], ci[nj][0], ci[nj][1]);
                    else
                        imma_mma_acc(ai[mi][nj], a[mi], b[nj]);
                }
            if (L == 64 && j == 0) continue;
            /* the segment ends: its float step */
            float2 dx[NJ][2], sb[MI][2];
#pragma unroll
            for (int nj = 0; nj < NJ; nj++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    dx[nj][e] = *(const float2 *)&R[(tw + 8 * nj + e) * SEG + sg]; /* d, X */
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    sb[mi][h] = P[sg * BR + rw + 16 * mi + 8 * h]; /* scale, bz */
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int nj = 0; nj < NJ; nj++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float2 p = sb[mi][e >> 1], q = dx[nj][e & 1];
                        const float f = __fsub_rn(__int_as_float(ai[mi][nj][e]), 12582912.0f);
                        acc[mi][nj][e] =
                            __fmaf_rn(p.y, q.y, __fmaf_rn(p.x, __fmul_rn(q.x, f), acc[mi][nj][e]));
                    }
        }
    };

    /* the pipeline: stages kt + 1 .. kt + IMMA_STAGES - 1 in flight while kt computes */
#pragma unroll
    for (int s = 0; s < IMMA_STAGES - 1; s++) {
        if (s < nk) {
            load(s, s);
            prm_load(s);
            prm_store(s);
        }
        cu_cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cu_cp_wait<IMMA_STAGES - 2>(); /* this thread's copies of stage kt are in */
        __syncthreads(); /* everyone's; and stage kt - 1 is computed: its slot is free */
        const int nx = kt + IMMA_STAGES - 1;
        if (nx < nk) {
            load(nx % IMMA_STAGES, nx);
            prm_load(nx);
        }
        cu_cp_commit();
        compute(kt % IMMA_STAGES);
        if (nx < nk) prm_store(nx % IMMA_STAGES);
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = n0 + rw + 16 * mi + 8 * h;
            if (n >= N) continue;
            const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)n) : 0.0f;
#pragma unroll
            for (int nj = 0; nj < NJ; nj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = t0 + tw + 8 * nj + e;
                    if (t < T) y[(size_t)t * N + n] = __fadd_rn(acc[mi][nj][2 * h + e], bv);
                }
        }
}

extern __shared__ __align__(16) uint8_t imma_sm[];

/* Blocks a SM the tile shapes are bounded to (registers: the float and int32 accumulators).
 * Warps of 2 x 4 fragments in every shape, at most 128 registers and 16 warps a SM, ran 5-20%
 * slower on the dense products (more shared-memory loads a MMA) and no faster on the experts. */
template <int NT> struct imma_minb { static constexpr int B = NT >= 256 ? 1 : 2; };

template <int MI, int NJ, int WR, int WT, int L>
__global__ void __launch_bounds__(32 * WR * WT, imma_minb<32 * WR * WT>::B)
    imma_gemm(float *__restrict__ y, const uint8_t *__restrict__ xq, const float4 *__restrict__ rec,
              cu_w w, const void *__restrict__ bias, int bias_dt, int N, int K, int T) {
    cu_pdl_wait();
    imma_tile<MI, NJ, WR, WT, L>(y, xq, rec, w, bias, bias_dt, N, K, T, (int)blockIdx.x * IMMA_BR,
                                 (int)blockIdx.y * (8 * NJ * WT), imma_sm);
}

/* A batch in one launch, a block per tile of any item (map[b]: the item of block b). */
template <int MI, int NJ, int WR, int WT, int L>
__global__ void __launch_bounds__(32 * WR * WT, imma_minb<32 * WR * WT>::B)
    imma_gemm_batch(const imma_item *__restrict__ items, const int32_t *__restrict__ map, int K) {
    cu_pdl_wait();
    const imma_item it = items[map[blockIdx.x]];
    const int tile = (int)blockIdx.x - it.tile0;
    imma_tile<MI, NJ, WR, WT, L>(it.y, it.xq, it.rec, it.w, nullptr, 0, it.N, K, it.T,
                                 (tile % it.tiles_n) * IMMA_BR, (tile / it.tiles_n) * (8 * NJ * WT),
                                 imma_sm);
}

/* ------------------------------------------------------------ reference */

/*
 * The plain kernel of the same arithmetic: a block per token and 256 rows quantises the token
 * itself (a thread a 64-column group, in column order: m, xq = rint(x inv), each chunk's X as
 * imma_quant adds it), into shared memory [K] bytes of xq in column order, d per group, X per
 * chunk; then a thread a row walks the segments: the integer sum of (q - 8) xq in column order,
 * and the float step of imma_tile. K <= IMMA_REF_MAX_K.
 */
#define IMMA_REF_MAX_K 32768

__global__ void __launch_bounds__(256)
    imma_ref(float *__restrict__ y, const float *__restrict__ x, cu_w w,
             const void *__restrict__ bias, int bias_dt, int N, int K, int T, int L) {
    extern __shared__ __align__(16) uint8_t ref_sm[];
    cu_pdl_wait();
    const int G = K / 64, t = blockIdx.y;
    int8_t *xs = (int8_t *)ref_sm;
    float *dg = (float *)(ref_sm + K), *Xc = dg + G;
    const float *xt = x + (size_t)t * K;
    for (int gi = threadIdx.x; gi < G; gi += blockDim.x) {
        const float *v = xt + gi * 64;
        float m = 0.0f;
        for (int k = 0; k < 64; k++)
            m = fmaxf(m, fabsf(v[k]));
        const float inv = fminf(__fdiv_rn(127.0f, m), FLT_MAX);
        float xc[2];
        for (int c = 0; c < 2; c++) {
            float part[4];
            for (int jj = 0; jj < 4; jj++) {
                part[jj] = 0.0f;
                for (int e = 0; e < 8; e++)
                    part[jj] = __fadd_rn(part[jj], v[32 * c + 8 * jj + e]);
            }
            xc[c] = __fadd_rn(__fadd_rn(part[0], part[2]), __fadd_rn(part[1], part[3]));
        }
        const bool bad = !isfinite(__fadd_rn(xc[0], xc[1]));
        for (int k = 0; k < 64; k++)
            xs[gi * 64 + k] = bad ? 0 : (int8_t)rintf(__fmul_rn(v[k], inv));
        dg[gi] = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(m, 127.0f);
        Xc[2 * gi] = xc[0], Xc[2 * gi + 1] = xc[1];
    }
    __syncthreads();
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const uint8_t *row = w.data + (size_t)n * w.ws;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += L) {
        int I = 0;
        for (int k = k0; k < k0 + L; k++) {
            const int q = (row[k >> 1] >> ((k & 1) * 4)) & 15;
            I += (q - 8) * (int)xs[k];
        }
        const size_t gi = (size_t)n * (size_t)w.G + (size_t)(k0 >> w.gshift);
        const float sc = cu_qparam(w.scales, w.sdt, gi);
        const float bz = __fmaf_rn(8.0f, sc, cu_qparam(w.biases, w.sdt, gi));
        const float X = L == 64 ? __fadd_rn(Xc[k0 / 32], Xc[k0 / 32 + 1]) : Xc[k0 / 32];
        acc = __fmaf_rn(bz, X, __fmaf_rn(sc, __fmul_rn(dg[k0 / 64], (float)I), acc));
    }
    const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)n) : 0.0f;
    y[(size_t)t * N + n] = __fadd_rn(acc, bv);
}

/* ------------------------------------------------------------- dispatch */

/* The tile shapes by tokens: 128 (4 x 4 fragments a warp, 8 warps), 64 (the same warps, 4), 32
 * (2 x 4 fragments, 4 warps along the rows); the relative rate each reaches per MMA (smaller
 * tiles load more a MMA), for imma_pick's estimate. */
enum { IMMA_T128, IMMA_T64, IMMA_T32, IMMA_NSHAPES };
static const int imma_bt[IMMA_NSHAPES] = {128, 64, 32};
static const double imma_rate[IMMA_NSHAPES] = {1.0, 0.9, 0.7};

template <int MI, int NJ, int WR, int WT, int L> static cudaError_t imma_allow() {
    const int sm = imma_shape<MI, NJ, WR, WT, L>::SMEM;
    cudaError_t e = cudaFuncSetAttribute(imma_gemm<MI, NJ, WR, WT, L>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(imma_gemm_batch<MI, NJ, WR, WT, L>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    return e;
}

cudaError_t cu_imma_init(void) {
    cudaError_t e;
    if ((e = imma_allow<4, 4, 2, 4, 64>()) != cudaSuccess ||
        (e = imma_allow<4, 4, 2, 4, 32>()) != cudaSuccess ||
        (e = imma_allow<4, 4, 2, 2, 64>()) != cudaSuccess ||
        (e = imma_allow<4, 4, 2, 2, 32>()) != cudaSuccess ||
        (e = imma_allow<2, 4, 4, 1, 64>()) != cudaSuccess ||
        (e = imma_allow<2, 4, 4, 1, 32>()) != cudaSuccess)
        return e;
    return cudaSuccess;
}

/* Segment length of w: its group, at most 64. */
static int imma_seg(const cu_w &w) {
    return w.gshift == 5 ? 32 : 64;
}

bool cu_imma_fits(const cu_ctx *c, const cu_w &w, const float *x, int64_t K) {
    return w.dt == SL_DTYPE_Q4 && w.gshift >= 5 && w.gshift <= 7 && K > 0 && K % 64 == 0 &&
           ((uintptr_t)w.data & 15) == 0 && (w.ws & 15) == 0 && ((uintptr_t)x & 15) == 0 &&
           imma_xbytes(1, K, imma_seg(w)) <= c->scratch_bytes;
}

bool cu_imma_ok(const cu_ctx *c, const cu_w &w, const float *x, int64_t K) {
    return c->tensor_cores && c->q4x && cu_imma_fits(c, w, x, K);
}

/*
 * The tile shape for products of tiles(s) tiles at shape s: the least estimated time, taken as
 * the tiles the busiest SM runs (blocks sharing a SM share its rate) times a tile's work over
 * the shape's rate. Ties to the larger tile.
 */
template <typename F> static int imma_pick(const cu_ctx *c, F tiles) {
    for (int s = 0; s < IMMA_NSHAPES; s++)
        if (imma_bt[s] == c->imma_tile) return s;
    int best = IMMA_T128;
    double best_cost = 0;
    for (int s = 0; s < IMMA_NSHAPES; s++) {
        const int64_t per_sm = (tiles(s) + c->n_sm - 1) / c->n_sm;
        const double cost = (double)per_sm * imma_bt[s] / imma_rate[s];
        if (s == 0 || cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

template <int MI, int NJ, int WR, int WT, int L>
static void imma_launch1(cu_ctx *c, float *y, const uint8_t *xq, const float4 *rec, const cu_w &w,
                         const void *b, int bdt, int N, int K, int T) {
    using S = imma_shape<MI, NJ, WR, WT, L>;
    const dim3 grid(cu_blocks((size_t)N, S::BR), cu_blocks((size_t)T, S::BT));
    cu_launch(imma_gemm<MI, NJ, WR, WT, L>, grid, S::NT, S::SMEM, c, y, xq, rec, w, b, bdt, N, K,
              T);
}

template <int L>
static void imma_launch(cu_ctx *c, int s, float *y, const uint8_t *xq, const float4 *rec,
                        const cu_w &w, const void *b, int bdt, int N, int K, int T) {
    switch (s) {
    case IMMA_T128: imma_launch1<4, 4, 2, 4, L>(c, y, xq, rec, w, b, bdt, N, K, T); break;
    case IMMA_T64: imma_launch1<4, 4, 2, 2, L>(c, y, xq, rec, w, b, bdt, N, K, T); break;
    default: imma_launch1<2, 4, 4, 1, L>(c, y, xq, rec, w, b, bdt, N, K, T); break;
    }
}

template <int MI, int NJ, int WR, int WT, int L>
static void imma_launch_batch1(cu_ctx *c, unsigned tiles, const imma_item *items,
                               const int32_t *map, int K) {
    using S = imma_shape<MI, NJ, WR, WT, L>;
    cu_launch(imma_gemm_batch<MI, NJ, WR, WT, L>, tiles, S::NT, S::SMEM, c, items, map, K);
}

template <int L>
static void imma_launch_batch(cu_ctx *c, int s, unsigned tiles, const imma_item *items,
                              const int32_t *map, int K) {
    switch (s) {
    case IMMA_T128: imma_launch_batch1<4, 4, 2, 4, L>(c, tiles, items, map, K); break;
    case IMMA_T64: imma_launch_batch1<4, 4, 2, 2, L>(c, tiles, items, map, K); break;
    default: imma_launch_batch1<2, 4, 4, 1, L>(c, tiles, items, map, K); break;
    }
}

/* Quantises x [T, K] (jobs NULL: one; else njobs of them, the most rows maxT) into the scratch. */
static void imma_quantise(cu_ctx *c, const imma_qjob *jobs, const imma_qjob &one, int njobs,
                          int maxT, int K, int L) {
    const dim3 grid(cu_blocks((size_t)maxT * (size_t)(K / 64), 32), (unsigned)njobs);
    cu_launch(imma_quant, grid, 256, 0, c, jobs, one, K, L);
}

void cu_imma_matmul(const sl_backend *be, float *y, const float *x, const cu_w &w, const void *b,
                    int bdt, int N, int K, int T) {
    cu_ctx *c = cu_of(be);
    const int L = imma_seg(w);
    /* as many tokens at once as the scratch holds (cu_imma_fits: at least one) */
    const int64_t slice = SL_MIN((int64_t)T, (int64_t)(c->scratch_bytes / imma_xbytes(1, K, L)));
    uint8_t *xq = (uint8_t *)cu_scratch(be, imma_xbytes(slice, K, L));
    if (!xq) return; /* recorded for the status op */
    const int64_t tiles_n = cu_blocks((size_t)N, IMMA_BR);
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int Ts = (int)SL_MIN(slice, T - t0);
        const imma_qjob job = {x + (size_t)t0 * K, xq, (float4 *)(xq + (size_t)Ts * K), Ts};
        imma_quantise(c, NULL, job, 1, Ts, K, L);
        const int s =
            imma_pick(c, [&](int sh) { return tiles_n * cu_blocks((size_t)Ts, imma_bt[sh]); });
        float *ys = y + (size_t)t0 * N;
        if (L == 64)
            imma_launch<64>(c, s, ys, xq, job.rec, w, b, bdt, N, K, Ts);
        else
            imma_launch<32>(c, s, ys, xq, job.rec, w, b, bdt, N, K, Ts);
    }
    CUDA_LAUNCHED(c);
}

/*
 * The products sel[0..n) (sel NULL: 0 .. n-1; all Q4 of one K, cu_imma_fits each) in launches
 * of as many as the scratch holds: their x quantised (one launch; products reading the same x
 * rows, the gate and up of an expert or a layer's q/k/v, share one copy), then one GEMM launch
 * over their tiles. Items with T = 0 take nothing; one whose x alone outgrows the scratch runs
 * alone, in slices. Each item gets the bits it gets alone. Returns 0 when the items differ in
 * segment length or their parameters do not fit the ring (nothing launched).
 */
int cu_imma_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, const int32_t *sel, int32_t n,
                         int K) {
    cu_ctx *c = cu_of(be);
#define IMMA_SEL(j) (sel ? sel[j] : (j))
    if (n <= 0) return 1;
    const int L = imma_seg(cu_w_of(w[IMMA_SEL(0)]));
    /* the host block: items [n], jobs [n] and the tile map, uploaded as one per launch (the
     * launch's items and jobs first in theirs); past them, took[j]: the item position j became
     * in the current launch (-1: none) */
    const size_t ib = ((size_t)n * sizeof(imma_item) + 15) & ~(size_t)15;
    const size_t jb = ((size_t)n * sizeof(imma_qjob) + 15) & ~(size_t)15;
    size_t max_tiles = 0; /* at the smallest tiles: bounds every launch's map */
    for (int32_t j = 0; j < n; j++) {
        const int32_t i = IMMA_SEL(j);
        if (imma_seg(cu_w_of(w[i])) != L) return 0;
        max_tiles += (size_t)cu_blocks((size_t)w[i]->shape[0], IMMA_BR) *
                     cu_blocks((size_t)SL_MAX(T[i], 0), imma_bt[IMMA_NSHAPES - 1]);
    }
    const size_t up_max = ib + jb + max_tiles * sizeof(int32_t);
    if (up_max + (size_t)n * sizeof(int32_t) > c->items_bytes / 2 || up_max > c->stage_bytes / 8 ||
        max_tiles > 0x7fffffff)
        return 0;
    imma_item *items = (imma_item *)c->items_host;
    imma_qjob *jobs = (imma_qjob *)(c->items_host + ib);
    int32_t *map = (int32_t *)(c->items_host + ib + jb);
    int32_t *took = (int32_t *)(c->items_host + up_max);
    uint8_t *scr = (uint8_t *)c->scratch;
    int32_t j = 0;
    while (j < n) {
        const int32_t first = j;
        int m = 0, nq = 0, maxT = 0;
        size_t used = 0;
        for (; j < n; j++) {
            const int32_t i = IMMA_SEL(j);
            took[j] = -1;
            if (T[i] <= 0) continue;
            /* the same x rows as the previous position's or those of the position half a batch
             * back (the gate and up of one expert): that item's copy */
            int share = -1;
            const int32_t cand[2] = {j - 1, n % 2 == 0 ? j - n / 2 : -1};
            for (int q = 0; q < 2 && share < 0; q++)
                if (cand[q] >= first && took[cand[q]] >= 0 && x[IMMA_SEL(cand[q])] == x[i] &&
                    items[took[cand[q]]].T == T[i])
                    share = took[cand[q]];
            const size_t need = share >= 0 ? 0 : imma_xbytes(T[i], K, L);
            if (used + need > c->scratch_bytes) break;
            imma_item it = {y[i], NULL, NULL, cu_w_of(w[i]), (int)w[i]->shape[0], T[i], 0, 0};
            if (share >= 0) {
                it.xq = items[share].xq, it.rec = items[share].rec;
            } else {
                uint8_t *q = scr + used;
                float4 *r = (float4 *)(q + (size_t)T[i] * K);
                jobs[nq++] = imma_qjob{x[i], q, r, T[i]};
                it.xq = q, it.rec = r;
                used += need;
                maxT = SL_MAX(maxT, T[i]);
            }
            took[j] = m;
            items[m++] = it;
        }
        if (m == 0) {
            if (j < n) { /* its x alone outgrows the scratch: in slices */
                const int32_t i = IMMA_SEL(j);
                cu_imma_matmul(be, y[i], x[i], cu_w_of(w[i]), NULL, 0, (int)w[i]->shape[0], K,
                               T[i]);
                j++;
            }
            continue;
        }
        const int s = imma_pick(c, [&](int sh) {
            int64_t t = 0;
            for (int q = 0; q < m; q++)
                t += (int64_t)cu_blocks((size_t)items[q].N, IMMA_BR) *
                     cu_blocks((size_t)items[q].T, imma_bt[sh]);
            return t;
        });
        int tile = 0;
        for (int q = 0; q < m; q++) {
            const int tn = (int)cu_blocks((size_t)items[q].N, IMMA_BR);
            const int tt = (int)cu_blocks((size_t)items[q].T, imma_bt[s]);
            items[q].tile0 = tile, items[q].tiles_n = tn;
            for (int b = 0; b < tn * tt; b++)
                map[tile + b] = q;
            tile += tn * tt;
        }
        const uint8_t *dev =
            (const uint8_t *)cu_items(be, c->items_host, ib + jb + (size_t)tile * sizeof(int32_t));
        imma_quantise(c, (const imma_qjob *)(dev + ib), imma_qjob{}, nq, maxT, K, L);
        if (L == 64)
            imma_launch_batch<64>(c, s, (unsigned)tile, (const imma_item *)dev,
                                  (const int32_t *)(dev + ib + jb), K);
        else
            imma_launch_batch<32>(c, s, (unsigned)tile, (const imma_item *)dev,
                                  (const int32_t *)(dev + ib + jb), K);
        CUDA_LAUNCHED(c);
    }
#undef IMMA_SEL
    return 1;
}

/* ------------------------------------------------- paths, for tests */

extern "C" int sl_cuda_q4_prefill(const sl_backend *be, float *y, const float *x,
                                  const sl_tensor *w, const sl_tensor *bias, int32_t T,
                                  sl_cuda_q4_path path) {
    cu_ctx *c = cu_of(be);
    if (w->dtype != SL_DTYPE_Q4 || w->ndim != 2 || T <= 0 || w->shape[0] >= INT32_MAX) return 0;
    const cu_w wv = cu_w_of(w);
    const int N = (int)w->shape[0], K = (int)wv.K;
    const void *b = bias && bias->data ? bias->data : NULL;
    const int bdt = b ? (int)bias->dtype : 0;
    cu_norm_flush(be);
    switch (path) {
    case SL_CUDA_Q4_IMMA:
        if (!cu_imma_fits(c, wv, x, K)) return 0;
        cu_imma_matmul(be, y, x, wv, b, bdt, N, K, T);
        return 1;
    case SL_CUDA_Q4_IMMA_REF: {
        if (!cu_imma_fits(c, wv, x, K) || K > IMMA_REF_MAX_K || T > 65535) return 0;
        const size_t sm = (size_t)K + (size_t)(K / 64) * 3 * sizeof(float);
        cu_launch(imma_ref, dim3(cu_blocks((size_t)N, 256), (unsigned)T), 256, sm, c, y, x, wv, b,
                  bdt, N, K, T, imma_seg(wv));
        CUDA_LAUNCHED(c);
        return 1;
    }
    default:
        if (!cu_mma_ok(c, wv, x, K)) return 0;
        cu_mma_matmul(c, y, x, wv, b, bdt, N, K, T);
        CUDA_LAUNCHED(c);
        return 1;
    }
}

extern "C" int sl_cuda_q4_prefill_batch(const sl_backend *be, float *const *y,
                                        const float *const *x, const sl_tensor *const *w,
                                        const int32_t *T, int32_t n, sl_cuda_q4_path path) {
    cu_ctx *c = cu_of(be);
    enum { MAX_ITEMS = 4096 };
    if (n <= 0 || n > MAX_ITEMS) return 0;
    const int64_t K = w[0]->shape[1];
    for (int32_t i = 0; i < n; i++) {
        const cu_w wi = cu_w_of(w[i]);
        if (w[i]->dtype != SL_DTYPE_Q4 || w[i]->ndim != 2 || w[i]->shape[1] != K || T[i] < 0 ||
            !(path == SL_CUDA_Q4_BF16 ? cu_mma_ok(c, wi, x[i], K) : cu_imma_fits(c, wi, x[i], K)))
            return 0;
    }
    cu_norm_flush(be);
    if (path == SL_CUDA_Q4_IMMA) return cu_imma_matmul_batch(be, y, x, w, T, NULL, n, (int)K);
    if (path == SL_CUDA_Q4_BF16) {
        int32_t sel[MAX_ITEMS];
        for (int32_t i = 0; i < n; i++)
            sel[i] = i;
        return cu_mma_matmul_batch(be, y, x, w, T, sel, n, (int)K);
    }
    for (int32_t i = 0; i < n; i++)
        if (T[i] > 0 && !sl_cuda_q4_prefill(be, y[i], x[i], w[i], NULL, T[i], path)) return 0;
    return 1;
}
