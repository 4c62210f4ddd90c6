/*
 * Prefill products on tensor cores: y[T, N] = x[T, K] . W[N, K]^T (+ b) for BF16, Q8 and Q4
 * weights with T > 4, one product (cu_mma_matmul) or a batch of them in one launch
 * (cu_mma_matmul_batch: the routed experts of a prefill chunk). Q4 takes these only on float x
 * (sl_cuda_params.int4_float_act) or where the int8 kernels do not (cuda_imma.cu).
 *
 * BF16 tensor-core products with float32 accumulation, as exact as the float32 tiles of
 * cuda_matmul.cu (gemm_tiled, the plain reference beside this) but for the order of the sums:
 *   - x is split into three BF16 parts, hi = bf16(x), mid = bf16(x - hi) and
 *     lo = bf16(x - hi - mid) (each difference exact in float32), and all three are multiplied,
 *     smallest first: x is carried to 24 bits, as float32 holds it. Two parts carried 16 bits,
 *     ~4e-6 of each x: ten times float32's rounding in the products, which the hybrid fixtures'
 *     token-by-token vs one-pass check (test_cuda_model, 1e-5) amplified to 1.8e-5;
 *   - the weights enter exactly: BF16 as they are, Q8 and Q4 as their codes less the centre z
 *     (128 / 8: integers of at most 8 bits, exact in BF16), and each quantisation group's partial
 *     sums P[t, n] are scaled at the group's end, as cpu_quant.c's formula has it:
 *         y[t, n] += scale[n, g] * P[t, n] + (bias[n, g] + z scale[n, g]) * X[t, g]
 *     where X[t, g] is the float sum of x[t] over the group's columns.
 *
 * Tiles: a block holds BM = 32 WM tokens x 64 rows (WM warps along the tokens, 2 along the
 * rows, each warp 32 x 32 as 2 x 4 fragments of mma.m16n8k16) and walks K in steps of 32 (a step
 * never spans two groups: groups are 32, 64 or 128). The next step's x and weights are loaded
 * into registers while the tensor cores work on the current one, then converted into shared
 * memory (rows padded to 40 elements, so that the fragments' 32-bit reads fall on 32 distinct
 * banks).
 */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.cuh"

#define MMA_BN 64
#define MMA_BK 32
#define MMA_KP 40 /* padded row of a shared tile, in BF16 elements */

/* The BF16 bits of v rounded to nearest. */
__device__ __forceinline__ uint32_t mma_bf16_bits(float v) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* d += a . b for one m16n8k16 fragment (BF16 in, float32 accumulate). */
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* A code q less the centre z, as BF16 bits: exact (|q - z| <= 128), through the float
 * 2^23 + q (the code in the low mantissa bits), whose top 16 bits are the BF16 of the exact
 * difference. */
__device__ __forceinline__ uint32_t mma_code(uint32_t q, float z) {
    return __float_as_uint(__uint_as_float(0x4b000000u | q) - (8388608.0f + z)) >> 16;
}

template <int DT> struct mma_wregs { static constexpr int N = 1; };
/* 16-byte loads of a step's 64 x 32 weights: BF16 64 bytes a row, Q8 32, Q4 16 */
template <> struct mma_wregs<SL_DTYPE_BF16> { static constexpr int N = 256; };
template <> struct mma_wregs<SL_DTYPE_Q8> { static constexpr int N = 128; };
template <> struct mma_wregs<SL_DTYPE_Q4> { static constexpr int N = 64; };

/*
 * The tile of rows n0.. and tokens t0.. (a block of 64 WM threads). x rows are 16-byte aligned
 * and K % 32 == 0; the weight rows 16-byte aligned (cu_mma_ok).
 */
template <int DT, int WM>
__device__ __forceinline__ void mma_tile(float *__restrict__ y, const float *__restrict__ x, cu_w w,
                                         const void *__restrict__ bias, int bias_dt, int N, int K,
                                         int T, int64_t n0, int64_t t0) {
    constexpr int BM = 32 * WM, NT = 64 * WM;
    constexpr int XL = BM * (MMA_BK / 4) / NT; /* float4 loads of x a thread: 4 */
    constexpr int WL = (mma_wregs<DT>::N + NT - 1) / NT;
    constexpr bool Q = DT != SL_DTYPE_BF16;
    constexpr float Z = DT == SL_DTYPE_Q8 ? 128.0f : 8.0f;
    __shared__ __align__(16) uint16_t xh[BM][MMA_KP], xm[BM][MMA_KP], xl[BM][MMA_KP];
    __shared__ __align__(16) uint16_t ws[MMA_BN][MMA_KP];
    __shared__ float xg[BM], sc[MMA_BN], bz[MMA_BN];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM, g = lane >> 2, q4 = lane & 3;
    const int G = 1 << w.gshift;

    float4 xr[XL];
    uint4 wr[WL];
    float scr = 0.0f, bzr = 0.0f; /* the group's scale and bias of row n0 + tid (tid < 64) */
    /* Registers <- step k0: x, weights and, at a group's first step, its scales. */
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < XL; i++) {
            const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
            const int64_t t = t0 + r;
            xr[i] = t < T ? __ldg((const float4 *)(x + (size_t)t * K + k0) + c)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < WL; i++) {
            const int idx = tid + i * NT;
            constexpr int per_row = mma_wregs<DT>::N / MMA_BN;
            const int r = idx / per_row, c = idx % per_row;
            const int64_t n = n0 + r;
            wr[i] = make_uint4(0, 0, 0, 0);
            if (idx < mma_wregs<DT>::N && n < N) {
                const size_t off = DT == SL_DTYPE_BF16 ? (size_t)k0 * 2
                                   : DT == SL_DTYPE_Q8 ? (size_t)k0
                                                       : (size_t)k0 / 2;
                wr[i] = __ldg((const uint4 *)(w.data + (size_t)n * w.ws + off) + c);
            }
        }
        if (Q && (k0 & (G - 1)) == 0 && tid < MMA_BN) {
            const int64_t n = n0 + tid;
            scr = bzr = 0.0f;
            if (n < N) {
                const size_t gi = (size_t)n * (size_t)w.G + (size_t)(k0 >> w.gshift);
                scr = cu_qparam(w.scales, w.sdt, gi);
                bzr = cu_qparam(w.biases, w.sdt, gi) + Z * scr;
            }
        }
    };
    /* Shared tiles <- the registers of step k0. */
    auto store = [&](int k0) {
        const bool first = (k0 & (G - 1)) == 0;
#pragma unroll
        for (int i = 0; i < XL; i++) {
            const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
            const float v[4] = {xr[i].x, xr[i].y, xr[i].z, xr[i].w};
            uint32_t h[4], m[4], l[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float r1 = v[j] - __uint_as_float((h[j] = mma_bf16_bits(v[j])) << 16);
                m[j] = mma_bf16_bits(r1);
                l[j] = mma_bf16_bits(r1 - __uint_as_float(m[j] << 16));
            }
            *(uint2 *)&xh[r][c * 4] = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
            *(uint2 *)&xm[r][c * 4] = make_uint2(m[0] | m[1] << 16, m[2] | m[3] << 16);
            *(uint2 *)&xl[r][c * 4] = make_uint2(l[0] | l[1] << 16, l[2] | l[3] << 16);
            if (Q) { /* the row's sum over the step: its 8 loads are 8 neighbouring lanes */
                float s = (v[0] + v[1]) + (v[2] + v[3]);
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                if (c == 0) xg[r] = first ? s : xg[r] + s;
            }
        }
#pragma unroll
        for (int i = 0; i < WL; i++) {
            const int idx = tid + i * NT;
            if (idx >= mma_wregs<DT>::N) break;
            constexpr int per_row = mma_wregs<DT>::N / MMA_BN;
            const int r = idx / per_row, c = idx % per_row;
            const uint32_t u[4] = {wr[i].x, wr[i].y, wr[i].z, wr[i].w};
            if (DT == SL_DTYPE_BF16) {
                *(uint4 *)&ws[r][c * 8] = wr[i];
            } else if (DT == SL_DTYPE_Q8) { /* 16 codes: columns c * 16 .. */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t b[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        b[e] = mma_code((u[j] >> (8 * e)) & 255u, Z);
                    *(uint2 *)&ws[r][c * 16 + j * 4] =
                        make_uint2(b[0] | b[1] << 16, b[2] | b[3] << 16);
                }
            } else { /* 32 codes, low nibble first: columns 0 .. 31 */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t b[8];
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        b[e] = mma_code((u[j] >> (4 * e)) & 15u, Z);
                    *(uint4 *)&ws[r][j * 8] = make_uint4(b[0] | b[1] << 16, b[2] | b[3] << 16,
                                                         b[4] | b[5] << 16, b[6] | b[7] << 16);
                }
            }
        }
        if (Q && first && tid < MMA_BN) sc[tid] = scr, bz[tid] = bzr;
    };

    float acc[2][4][4] = {}, part[2][4][4] = {};
    load(0);
    store(0);
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += MMA_BK) {
        const bool more = k0 + MMA_BK < K;
        if (more) load(k0 + MMA_BK);
        float(&d)[2][4][4] = Q ? part : acc;
#pragma unroll
        for (int ks = 0; ks < MMA_BK; ks += 16) {
            uint32_t ah[2][4], am[2][4], al[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int r = wm * 32 + mi * 16 + g, c = ks + 2 * q4;
                ah[mi][0] = *(const uint32_t *)&xh[r][c];
                ah[mi][1] = *(const uint32_t *)&xh[r + 8][c];
                ah[mi][2] = *(const uint32_t *)&xh[r][c + 8];
                ah[mi][3] = *(const uint32_t *)&xh[r + 8][c + 8];
                am[mi][0] = *(const uint32_t *)&xm[r][c];
                am[mi][1] = *(const uint32_t *)&xm[r + 8][c];
                am[mi][2] = *(const uint32_t *)&xm[r][c + 8];
                am[mi][3] = *(const uint32_t *)&xm[r + 8][c + 8];
                al[mi][0] = *(const uint32_t *)&xl[r][c];
                al[mi][1] = *(const uint32_t *)&xl[r + 8][c];
                al[mi][2] = *(const uint32_t *)&xl[r][c + 8];
                al[mi][3] = *(const uint32_t *)&xl[r + 8][c + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int n = wn * 32 + ni * 8 + g, c = ks + 2 * q4;
                const uint32_t b0 = *(const uint32_t *)&ws[n][c];
                const uint32_t b1 = *(const uint32_t *)&ws[n][c + 8];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    mma_bf16(d[mi][ni], al[mi], b0, b1);
                    mma_bf16(d[mi][ni], am[mi], b0, b1);
                    mma_bf16(d[mi][ni], ah[mi], b0, b1);
                }
            }
        }
        if (Q && (!more || ((k0 + MMA_BK) & (G - 1)) == 0)) { /* the group ends: scale it in */
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = wm * 32 + mi * 16 + g + (e >> 1) * 8;
                        const int n = wn * 32 + ni * 8 + 2 * q4 + (e & 1);
                        acc[mi][ni][e] += sc[n] * part[mi][ni][e] + bz[n] * xg[r];
                        part[mi][ni][e] = 0.0f;
                    }
        }
        __syncthreads();
        if (more) store(k0 + MMA_BK);
        __syncthreads();
    }
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int64_t n = n0 + wn * 32 + ni * 8 + 2 * q4 + e2;
            if (n >= N) continue;
            const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)n) : 0.0f;
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t t = t0 + wm * 32 + mi * 16 + g + h * 8;
                    if (t < T) y[(size_t)t * N + n] = acc[mi][ni][h * 2 + e2] + bv;
                }
        }
}

template <int DT, int WM>
__global__ void __launch_bounds__(64 * WM)
    mma_gemm(float *__restrict__ y, const float *__restrict__ x, cu_w w,
             const void *__restrict__ bias, int bias_dt, int N, int K, int T) {
    cu_pdl_wait();
    mma_tile<DT, WM>(y, x, w, bias, bias_dt, N, K, T, (int64_t)blockIdx.x * MMA_BN,
                     (int64_t)blockIdx.y * (32 * WM));
}

/* A batch of products in one launch, a block per tile of any of them (map[b]: the item of block
 * b, its tiles from tile0 on, row tiles fastest). */
template <int DT, int WM>
__global__ void __launch_bounds__(64 * WM)
    mma_gemm_batch(const cu_gemm_item *__restrict__ items, const int32_t *__restrict__ map, int K) {
    cu_pdl_wait();
    const cu_gemm_item it = items[map[blockIdx.x]];
    const int tile = (int)blockIdx.x - it.tile0;
    mma_tile<DT, WM>(it.y, it.x, it.w, nullptr, 0, it.N, K, it.T,
                     (int64_t)(tile % it.tiles_n) * MMA_BN,
                     (int64_t)(tile / it.tiles_n) * (32 * WM));
}

/* ------------------------------------------------------------ dispatch */

bool cu_mma_ok(const cu_ctx *c, const cu_w &w, const float *x, int64_t K) {
    if (!c->tensor_cores) return false;
    if (w.dt != SL_DTYPE_BF16 && w.dt != SL_DTYPE_Q8 && w.dt != SL_DTYPE_Q4) return false;
    if (w.dt != SL_DTYPE_BF16 && (w.gshift < 5 || w.gshift > 7)) return false;
    return K % MMA_BK == 0 && ((uintptr_t)w.data & 15) == 0 && (w.ws & 15) == 0 &&
           ((uintptr_t)x & 15) == 0;
}

/* Warps along the tokens: the most (larger tiles read each weight fewer times) that still give
 * every SM two blocks. */
static int mma_wm(const cu_ctx *c, int64_t tiles_n, int64_t T) {
    int wm = 4;
    while (wm > 1 &&
           (T <= 32 * (wm / 2) || tiles_n * ((T + 32 * wm - 1) / (32 * wm)) < 2 * c->n_sm))
        wm /= 2;
    return wm;
}

template <int DT>
static void mma_launch(cu_ctx *c, int wm, float *y, const float *x, const cu_w &w, const void *b,
                       int bdt, int N, int K, int T) {
    const dim3 grid(cu_blocks((size_t)N, MMA_BN), cu_blocks((size_t)T, 32 * wm));
    if (wm == 4)
        cu_launch(mma_gemm<DT, 4>, grid, 256, 0, c, y, x, w, b, bdt, N, K, T);
    else if (wm == 2)
        cu_launch(mma_gemm<DT, 2>, grid, 128, 0, c, y, x, w, b, bdt, N, K, T);
    else
        cu_launch(mma_gemm<DT, 1>, grid, 64, 0, c, y, x, w, b, bdt, N, K, T);
}

void cu_mma_matmul(cu_ctx *c, float *y, const float *x, const cu_w &w, const void *b, int bdt,
                   int N, int K, int T) {
    const int wm = mma_wm(c, cu_blocks((size_t)N, MMA_BN), T);
    switch (w.dt) {
    case SL_DTYPE_BF16: mma_launch<SL_DTYPE_BF16>(c, wm, y, x, w, b, bdt, N, K, T); break;
    case SL_DTYPE_Q8: mma_launch<SL_DTYPE_Q8>(c, wm, y, x, w, b, bdt, N, K, T); break;
    default: mma_launch<SL_DTYPE_Q4>(c, wm, y, x, w, b, bdt, N, K, T); break;
    }
}

template <int DT>
static void mma_batch_launch(cu_ctx *c, int wm, unsigned tiles, const cu_gemm_item *items,
                             const int32_t *map, int K) {
    if (wm == 4)
        cu_launch(mma_gemm_batch<DT, 4>, tiles, 256, 0, c, items, map, K);
    else if (wm == 2)
        cu_launch(mma_gemm_batch<DT, 2>, tiles, 128, 0, c, items, map, K);
    else
        cu_launch(mma_gemm_batch<DT, 1>, tiles, 64, 0, c, items, map, K);
}

int cu_mma_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                        const sl_tensor *const *w, const int32_t *T, const int32_t *sel, int32_t n,
                        int K) {
    cu_ctx *c = cu_of(be);
    int64_t rows = 0, tokens = 0;
    for (int32_t j = 0; j < n; j++) /* all suited: the caller checked (cu_mma_ok) */
        rows += w[sel[j]]->shape[0], tokens += T[sel[j]];
    /* the tile height for the items' mean token count and all their row tiles */
    const int wm = mma_wm(c, cu_blocks((size_t)rows, MMA_BN), tokens / n);
    unsigned tiles;
    const int32_t *dm;
    const cu_gemm_item *di = cu_gemm_items(be, y, x, w, T, sel, n, MMA_BN, 32 * wm, &tiles, &dm);
    if (!di) return 0;
    switch (w[sel[0]]->dtype) {
    case SL_DTYPE_BF16: mma_batch_launch<SL_DTYPE_BF16>(c, wm, tiles, di, dm, K); break;
    case SL_DTYPE_Q8: mma_batch_launch<SL_DTYPE_Q8>(c, wm, tiles, di, dm, K); break;
    default: mma_batch_launch<SL_DTYPE_Q4>(c, wm, tiles, di, dm, K); break;
    }
    CUDA_LAUNCHED(c);
    return 1;
}
