/*
 * CUDA matmul, y[T, N] = x[T, K] . W[N, K]^T (+ b), for F32/F16/BF16/Q8/Q4 W, the kernels
 * built on its GEMV (batches, the fused routed experts, the router with its top-k), and embed.
 * ggml's block types (GGUF weights) go to cuda_blocks.cu from each entry point.
 *
 * Three kernels:
 *   gemv_fast     decode (T <= 4), rows whose bytes split into aligned 16-byte chunks.
 *                 A warp owns R rows; lane l reads chunks l, l+32, ... of each row with
 *                 one 16-byte streaming load (L1 bypassed so x stays in L1), and every
 *                 x value it loads (float4, L1-cached) serves all R rows and NT tokens.
 *                 16 bytes are 4 F32, 8 F16/BF16, 16 Q8 or 32 Q4 weights; a Q8/Q4
 *                 chunk never straddles a 64-wide group, so per chunk
 *                     y += scale * sum((q - z) x) + (bias + z scale) * sum(x)
 *                 with codes centred on z = 128 (Q8) / 8 (Q4), as cpu_quant.c does,
 *                 to keep the two terms from cancelling.
 *                 Q4 takes the int8 formula of quant.h instead where K % 64 == 0
 *                 (SL_Q4X below; --cuda-int4-float-act keeps float x): x quantised per 64
 *                 columns while it is staged, and integer dot products, ~1 instruction
 *                 a weight instead of ~5 (decode 314 -> 373 tok/s, BENCHMARKS 11.1).
 *   gemv_generic  decode, any K and alignment: a warp per row, element loads.
 *   gemm_tiled    prefill (T > 4): 64 tokens x 64 rows per block (32 x 32 where that leaves
 *                 SMs idle), K in steps of 32,
 *                 weights widened into shared memory once per tile and reused by all
 *                 64 tokens; each thread accumulates 4 x 4 outputs in registers.
 *                 Tensor cores take prefill where they can: Q4 while x is quantised to
 *                 int8 on int8 ones (cuda_imma.cu, SL_Q4X's formula, beside a plain
 *                 reference of its own), else BF16, Q8 and Q4 on BF16 ones (cuda_mma.cu,
 *                 whose reference these tiles are); the rest run here.
 * All accumulate in float32; sums are ordered differently from the CPU backend's
 * (tree reductions), which the tests allow for.
 */
#include <float.h>

#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"

/* Warps of a GEMV block. Every block stages its own copy of x (and, taking a pending norm, adds
 * and normalises it), so fewer, larger blocks read less from L2 and repeat less work: on an H200
 * at Qwen3-30B-A3B shapes 8 warps decoded 7% faster than 4 (BENCHMARKS 11.1). */
#define GEMV_WARPS 8

/* Blocks of the experts' gate/up a SM must hold at 1 or 2 rows a warp (launch bounds), so that
 * gate_up_rows can count its waves: at Qwen3-30B-A3B shapes 768 blocks of one row a warp (76
 * registers, 3 a SM) took two waves of 396 slots, and 384 of two rows (97 registers unbounded,
 * 2 a SM) two of 264; bounded to 3 (80 registers, 24 bytes spilled) they take one: decode 3%
 * faster than at one row (BENCHMARKS 11.1). */
#define GU_MINB 3

/* Weights per 16-byte chunk. */
template <int DT> struct chunk_elems;
template <> struct chunk_elems<SL_DTYPE_F32> { static constexpr int E = 4; };
template <> struct chunk_elems<SL_DTYPE_F16> { static constexpr int E = 8; };
template <> struct chunk_elems<SL_DTYPE_BF16> { static constexpr int E = 8; };
template <> struct chunk_elems<SL_DTYPE_Q8> { static constexpr int E = 16; };
template <> struct chunk_elems<SL_DTYPE_Q4> { static constexpr int E = 32; };

/*
 * SL_Q4X, a kernel-side dtype: Q4 weights against x quantised to int8, the formula of quant.h's
 * SL_QPATH_INT8 (what the CPU backend runs on AVX-512 VNNI):
 *   y = sum_g scale_g (d_g sum_k (q_k - 8) xq_k) + (bias_g + 8 scale_g) X_g
 * taken a 32-weight chunk at a time (half a group). The staged x of a chunk is a 48-byte record:
 * its 32 xq bytes ordered as the nibbles come out of a weight word (lo = w & 0x0F0F0F0F holds
 * elements 0, 2, 4, 6 of the word's 8, hi = w >> 4 & 0x0F0F0F0F elements 1, 3, 5, 7; words
 * lo0 hi0 lo1 hi1 ... lo3 hi3), then the group's d, the chunk's float sum X and its code sum S
 * (so sum (q - 8) xq = dp4a sums - 8 S, exact in int). 48 bytes keep the lanes' 16-byte reads of
 * consecutive records on distinct banks. Per chunk and row: 8 dp4a, 4 shifts, 8 masks and one
 * int-to-float conversion, against ~5 float instructions a weight in the float formula.
 */
#define SL_Q4X 100
template <> struct chunk_elems<SL_Q4X> { static constexpr int E = 32; };
#define Q4X_REC 12 /* floats in a chunk's record */

/* 16 bytes read once: skip L1 so the activations it holds stay there. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/*
 * A code as the float 2^23 + code: the code becomes the low mantissa bits of
 * 0x4B000000, so q - z is one exact FADD away, with no int-to-float conversion
 * (a quarter-rate instruction). Q8 takes byte k with one byte permute; Q4 the
 * nibble at bit sh with a shift and a LOP3. Measured on an H200 (151936 x 2048,
 * T = 1): Q8 3.65 TB/s with the permute, 3.07 with shift+mask, 3.25 with I2F;
 * Q4 1.86 TB/s whichever way, so Q4 is bound elsewhere (see the report).
 */
__device__ __forceinline__ float code_byte(uint32_t u, int k) {
    return __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440u | (unsigned)k));
}

__device__ __forceinline__ float code_nibble(uint32_t u, int sh) {
    return __uint_as_float(((u >> sh) & 15u) | 0x4b000000u);
}

/* The first of the R rows the calling warp owns in row-block bx. */
template <int R> __device__ __forceinline__ int64_t gemv_row0(int64_t bx) {
    return (bx * GEMV_WARPS + threadIdx.x / 32) * R;
}

/* Asks L2 for the codes of rows row0 .. row0+R-1 (those below N; contiguous), a 128-byte line a
 * lane at a time. gemv_ahead calls it before cu_pdl_wait for rows longer than what it preloads
 * into registers (with dependent launch the rest then streams in while the previous kernel
 * ends). */
__device__ __forceinline__ void l2_prefetch_rows(const cu_w &w, int64_t row0, int R, int N) {
    const int64_t rows = min((int64_t)R, (int64_t)N - row0);
    if (rows <= 0) return;
    const char *p = (const char *)w.data + (size_t)row0 * w.ws;
    const size_t bytes = (size_t)rows * w.ws;
    for (size_t off = (size_t)(threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

/*
 * Where the GEMVs read x: lane l reads the 16-byte chunks l, l + 32, ... of a row, so at each
 * step the lanes' x slices lie E floats apart; read from global memory each such load touches
 * up to 32 cache lines, and profiling showed these L1 wavefronts, not DRAM, bounding the
 * decode GEMVs. So a block first stages its x rows in shared memory with 4 floats of padding
 * per chunk (chunk c of row t at t * ts + c * (E + 4)): the 8 lanes of each quarter-warp phase
 * of a 16-byte load then fall on distinct banks. cs, ts: floats per chunk and per row.
 */
typedef struct xsrc {
    const float *p;
    int cs, ts;
} xsrc;

/* Bytes of shared memory the staged copy of nt rows of K takes; 0 when over 44 KiB (the
 * default limit per block is 48, and kernels have a little static shared memory of their own):
 * the GEMVs then read global memory. */
static size_t stage_bytes(int dt_elems, int64_t K, int nt) {
    const size_t b = (size_t)nt * (size_t)(K / dt_elems) * (size_t)(dt_elems + 4) * sizeof(float);
    return b <= (44u << 10) ? b : 0;
}

/* The same for kernels of dtype DT. SL_Q4X: room for one row of floats (what a pending norm
 * stages before quantising it), then the nt rows' records (quant_staged); a plain x is quantised
 * straight from global memory, so K = 2048 fits four tokens (21 KB, against 48 KB as floats). */
template <int DT> static size_t stage_bytes_of(int64_t K, int nt) {
    if (DT != SL_Q4X) return stage_bytes(chunk_elems<DT>::E, K, nt);
    const size_t b = (size_t)(K / 32) * (36 + (size_t)nt * Q4X_REC) * sizeof(float);
    return b <= (44u << 10) ? b : 0;
}

extern __shared__ __align__(16) float cu_xs[]; /* the block's staged x (dynamic) */

/*
 * SL_Q4X: nt rows of x (in src: element j of chunk c of row t at t ts + c cs + j; global
 * memory, or the float row a pending norm staged) quantised into records after that row,
 *   m = max |x|, d = m / 127, xq = rint(x min(127 / m, FLT_MAX))
 * as quant.h has it (cu_q8_lane). Eight lanes take a 64-column group, four groups a warp at
 * once, so a block of 8 warps quantises a row of 2048 in one round (each lane's share of the
 * chain: one 32-byte read, three shuffle steps for the group's max and two for its chunk's
 * sums). Lane s of a group holds columns 8 (s & 3) .. +7 of its chunk (chunk 2 g + s / 4):
 * exactly the columns of weight word s & 3, so it writes that word's lo and hi bytes (8 bytes).
 * X and S are summed in a fixed order, so every kernel's records are the same bits. K % 64 == 0.
 */
__device__ __forceinline__ xsrc quant_staged(const xsrc &src, int K, int nt) {
    const int C = K / 32, G = C / 2, NG = nt * G, lane = threadIdx.x & 31, s = lane & 7;
    float *rec0 = cu_xs + (size_t)C * 36;
    for (int g0 = (int)(threadIdx.x / 32) * 4; g0 < NG; g0 += (int)(blockDim.x / 32) * 4) {
        const int g = g0 + lane / 8, ok = g < NG; /* uniform loop: every lane shuffles */
        const int t = ok ? g / G : 0, c = 2 * (ok ? g % G : 0) + s / 4;
        const float *f = src.p + (size_t)t * src.ts + (size_t)c * src.cs + (s & 3) * 8;
        float v[8];
        *(float4 *)v = ok ? *(const float4 *)f : make_float4(0, 0, 0, 0); /* generic: */
        *(float4 *)(v + 4) =
            ok ? *(const float4 *)(f + 4) : make_float4(0, 0, 0, 0); /* or shared */
        float m, X;
        uint32_t lo, hi;
        int S;
        cu_q8_lane(v, m, lo, hi, S, X);
        if (!ok) continue;
        float *rec = rec0 + ((size_t)t * C + c) * Q4X_REC;
        *(uint2 *)(rec + 2 * (s & 3)) = make_uint2(lo, hi);
        if ((s & 3) == 0) {
            rec[8] = __fdiv_rn(m, 127.0f);
            rec[9] = X;
            rec[10] = __int_as_float(S);
        }
    }
    __syncthreads();
    return xsrc{rec0, Q4X_REC, C * Q4X_REC};
}

/* nt rows of x [nt, K] (16-byte aligned) into cu_xs when the launch gave it shared memory; all
 * threads of the block call it. */
template <int DT>
__device__ __forceinline__ xsrc stage_x(const float *x, int K, int nt, bool staged) {
    constexpr int E = chunk_elems<DT>::E;
    if (!staged) return xsrc{x, E, K};
    if (DT == SL_Q4X) return quant_staged(xsrc{x, E, K}, K, nt);
    const int C = K / E, ts = C * (E + 4), q4 = K / 4;
    for (int i = threadIdx.x; i < nt * q4; i += blockDim.x) {
        const int t = i / q4, q = i % q4, c = q * 4 / E, j = q * 4 % E;
        *(float4 *)(cu_xs + (size_t)t * ts + c * (E + 4) + j) = __ldg((const float4 *)x + i);
    }
    __syncthreads();
    return xsrc{cu_xs, E + 4, ts};
}

/*
 * stage_x for one token whose input is a pending add_rmsnorm_next (p, K = p.n wide, staged):
 * every block computes x + d and its norm itself, 16 bytes a thread at a time, into its staged
 * copy (a block-wide sum of squares between the two passes); the writer block also stores
 * x_out and y, which later kernels read. Costs each block a second 8 KB read from L2 at K = 2048;
 * saves the add_rmsnorm launch (~3.5 us and a gap at Qwen3-30B-A3B shapes).
 */
/* The most rows a GEMV that takes over a pending norm may have: every working block reads x and
 * d from L2 (16 KB at K = 2048), so the q/k/v batch (5,120 rows) and the router gain, while a
 * head of 151,936 rows would read ~150 MB: it leaves the norm to its own kernel. */
#define PRENORM_MAX_ROWS 16384

/* Whether a one-token GEMV launch of `rows` rows (in all), chunks of E and K columns can take a
 * pending norm over: few enough rows, and x staged in shared memory. */
static bool prenorm_fits(int64_t rows, int E, int64_t K) {
    return rows <= PRENORM_MAX_ROWS && stage_bytes(E, K, 1) > 0;
}

/*
 * A pending norm's weights do not depend on the previous kernel, so a GEMV that takes the norm
 * over loads them before its wait (norm_preload): the first NORM_PRE float4 steps of each
 * thread's share (all of it at K <= 2048 with 256 threads), which takes an L2 round trip off
 * the chain after the wait (x + d, the sum of squares, then the weights). The same values, so
 * the same bits.
 */
#define NORM_PRE 2
struct npre {
    float4 w[NORM_PRE > 0 ? NORM_PRE : 1];
};

/* The pending norm's weight elements 4q .. 4q + 3. */
__device__ __forceinline__ float4 norm_w4(const cu_prenorm &p, int q) {
    return make_float4(
        cu_load_f(p.w, p.wdt, (size_t)q * 4), cu_load_f(p.w, p.wdt, (size_t)q * 4 + 1),
        cu_load_f(p.w, p.wdt, (size_t)q * 4 + 2), cu_load_f(p.w, p.wdt, (size_t)q * 4 + 3));
}

__device__ __forceinline__ void norm_preload(npre &np, const cu_prenorm &p, int K) {
#pragma unroll
    for (int i = 0; i < NORM_PRE; i++) {
        const int q = (int)threadIdx.x + i * (int)blockDim.x;
        if (p.x && q < K / 4) np.w[i] = norm_w4(p, q);
    }
}

/* Step q of stage_x_prenorm's second pass: the staged x + d of elements 4q .. 4q + 3 normalised
 * (inv) and weighted (w). */
template <int E>
__device__ __forceinline__ void norm_step(const cu_prenorm &p, int q, float inv, const float4 &w,
                                          bool writer) {
    float4 *at = (float4 *)(cu_xs + (q * 4 / E) * (E + 4) + q * 4 % E);
    float4 v = *at;
    v.x = (v.x * inv) * (p.w_offset + w.x);
    v.y = (v.y * inv) * (p.w_offset + w.y);
    v.z = (v.z * inv) * (p.w_offset + w.z);
    v.w = (v.w * inv) * (p.w_offset + w.w);
    *at = v;
    if (writer) ((float4 *)p.y)[q] = v;
}

template <int DT>
__device__ __forceinline__ xsrc stage_x_prenorm(const cu_prenorm &p, int K, bool writer,
                                                const npre &np) {
    constexpr int E = chunk_elems<DT>::E;
    __shared__ float sh[32];
    const int q4 = K / 4;
    float ss = 0.0f;
    for (int q = threadIdx.x; q < q4; q += blockDim.x) {
        const float4 a = __ldcg((const float4 *)p.x + q), b = __ldcg((const float4 *)p.d + q);
        const float4 v = {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w};
        ss = __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmaf_rn(v.x, v.x, ss))));
        *(float4 *)(cu_xs + (q * 4 / E) * (E + 4) + q * 4 % E) = v;
        if (writer) ((float4 *)p.x_out)[q] = v;
    }
    ss = block_reduce<false>(ss, sh); /* also orders the staged writes before the reads */
    const float inv = 1.0f / sqrtf(ss / (float)K + p.eps);
#pragma unroll
    for (int i = 0; i < NORM_PRE; i++) { /* the preloaded steps */
        const int q = (int)threadIdx.x + i * (int)blockDim.x;
        if (q < q4) norm_step<E>(p, q, inv, np.w[i], writer);
    }
    for (int q = threadIdx.x + NORM_PRE * blockDim.x; q < q4; q += blockDim.x)
        norm_step<E>(p, q, inv, norm_w4(p, q), writer);
    __syncthreads();
    if (DT == SL_Q4X) return quant_staged(xsrc{cu_xs, E + 4, (K / E) * (E + 4)}, K, 1);
    return xsrc{cu_xs, E + 4, (K / E) * (E + 4)};
}

/*
 * A GEMV's weights (and Q8/Q4 scales and biases, widened) for the first P steps of its chunk
 * loop, loaded into registers ahead: kernels whose weights do not depend on earlier kernels
 * load them before cu_pdl_wait (with dependent launch they then arrive while the previous
 * kernel ends), the expert kernels as soon as the picks are known, before staging x. At
 * Qwen3-30B-A3B shapes P steps cover a whole row (K = 2048 is two int4 chunks a lane), so
 * what is left after the wait is one read of x from L2 and the arithmetic.
 */
template <int DT, int R, int P, bool GS = false> struct wpre {
    uint4 v[P][R];
    float s[P][R], b[P][R]; /* Q8/Q4: the chunk's group scale, and bias + z scale */
    int n;                  /* steps loaded (0 .. P: those of chunks below C) */
};

/* Steps each lane preloads: enough for rows of 2048 int4 at R <= 2, within ~48 registers. */
template <int R> struct pre_steps { static constexpr int P = R >= 8 ? 1 : R >= 4 ? 2 : 4; };

/*
 * Chunk c of row n: its 16 bytes, and for Q8/Q4 its group's scale s and b = bias + z s. GS: the
 * scales and biases in any of their dtypes (cu_qparam; F16 or F32 ones come from MLX
 * checkpoints), else BF16 (sluice's packs, GGUF-less checkpoints). A template parameter, not a
 * test in the loop: the dtype choice in the GEMVs' preloaded steps took moe_down_sum from 102 to
 * 128 registers and a decode step from 437 to 350 tok/s on an H200 (BENCHMARKS 11).
 */
template <int DT> struct quant_dt {
    static constexpr bool v = DT == SL_DTYPE_Q8 || DT == SL_DTYPE_Q4 || DT == SL_Q4X;
};
static bool generic_scales(const cu_w &w) {
    return w.sdt != SL_DTYPE_BF16;
}
/* f(std::bool_constant<GS>): GS = gs for a quantised DT (the launch's instantiation), else
 * false (the scales of a float dtype are never read). */
template <int DT, typename F> static void by_scales(bool gs, F f) {
    if constexpr (quant_dt<DT>::v)
        if (gs) return f(std::true_type{});
    f(std::false_type{});
}
template <int DT, bool GS>
__device__ __forceinline__ void gemv_load(const cu_w &w, int64_t n, int c, uint4 &v, float &s,
                                          float &b) {
    constexpr float Z = DT == SL_DTYPE_Q8 ? 128.0f : 8.0f;
    v = ld_stream((const uint4 *)(w.data + (size_t)n * w.ws) + c);
    if (quant_dt<DT>::v) {
        const int64_t gi = n * w.G + (((int64_t)c * chunk_elems<DT>::E) >> w.gshift);
        s = GS ? cu_qparam(w.scales, w.sdt, (size_t)gi) : cu_bf16(__ldg(w.scales + gi));
        b = __fmaf_rn(Z, s,
                      GS ? cu_qparam(w.biases, w.sdt, (size_t)gi) : cu_bf16(__ldg(w.biases + gi)));
    } else {
        s = b = 0.0f;
    }
}

/* The chunk loop's weights of rows row0 .. row0+R-1 (rows past N read row N-1), as gemv_rows
 * reads them (lane chunks ks * 32 + lane + 32 nks j). */
template <int DT, int R, int P, bool GS>
__device__ __forceinline__ void gemv_preload(wpre<DT, R, P, GS> &pre, const cu_w &w, int N, int K,
                                             int64_t row0, int ks = 0, int nks = 1) {
    const int C = K / chunk_elems<DT>::E, c0 = ks * 32 + (threadIdx.x & 31);
    pre.n = 0;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int c = c0 + p * 32 * nks;
        if (c >= C) break;
        pre.n = p + 1;
#pragma unroll
        for (int r = 0; r < R; r++)
            gemv_load<DT, GS>(w, min(row0 + r, (int64_t)N - 1), c, pre.v[p][r], pre.s[p][r],
                              pre.b[p][r]);
    }
}

/* a.x + b.y + c.z + d.w, its roundings spelled out (as the rest of gemv_step's) so that every
 * kernel built on gemv_rows gives the same bits, whatever the compiler would contract where. */
__device__ __forceinline__ float dot4(float a, float b, float c, float d, const float4 &x) {
    return __fmaf_rn(d, x.w, __fmaf_rn(c, x.z, __fmaf_rn(b, x.y, __fmul_rn(a, x.x))));
}

/* One chunk step of gemv_rows: chunk c of R rows (wv; Q8/Q4 with their scale s and b = bias + z
 * scale) against NT rows of x, into acc. */
template <int DT, int R, int NT>
__device__ __forceinline__ void gemv_step(float (&acc)[R][NT], const uint4 (&wv)[R],
                                          const float (&s)[R], const float (&b)[R], const xsrc &x,
                                          int c) {
    constexpr int E = chunk_elems<DT>::E;
    constexpr bool QUANT = DT == SL_DTYPE_Q8 || DT == SL_DTYPE_Q4;
    constexpr float CZ =
        8388608.0f + (DT == SL_DTYPE_Q8 ? 128.0f : 8.0f); /* code offset + centre */
    const float4 *xc = (const float4 *)(x.p + (size_t)c * x.cs);
    if (DT == SL_Q4X) {
        uint4 xa[NT], xb[NT];
        float dd[NT], xx[NT];
        int ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint4 *rec = (const uint4 *)(x.p + (size_t)t * x.ts + (size_t)c * x.cs);
            xa[t] = rec[0], xb[t] = rec[1];
            const float4 st = *(const float4 *)(rec + 2);
            dd[t] = st.x, xx[t] = st.y, ss[t] = __float_as_int(st.z);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int lo[4], hi[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t u = word_of(wv[r], j);
                lo[j] = (int)(u & 0x0f0f0f0fu), hi[j] = (int)((u >> 4) & 0x0f0f0f0fu);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int a = -8 * ss[t];
                a = __dp4a(lo[0], (int)xa[t].x, a), a = __dp4a(hi[0], (int)xa[t].y, a);
                a = __dp4a(lo[1], (int)xa[t].z, a), a = __dp4a(hi[1], (int)xa[t].w, a);
                a = __dp4a(lo[2], (int)xb[t].x, a), a = __dp4a(hi[2], (int)xb[t].y, a);
                a = __dp4a(lo[3], (int)xb[t].z, a), a = __dp4a(hi[3], (int)xb[t].w, a);
                acc[r][t] = __fadd_rn(
                    acc[r][t], __fmaf_rn(s[r], __fmul_rn(dd[t], (float)a), __fmul_rn(b[r], xx[t])));
            }
        }
    } else if (QUANT) {
        float d[R][NT], xs[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            xs[t] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++)
                d[r][t] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < E / 4; j++) {
            float4 xv[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                xv[t] = xc[(size_t)t * (x.ts / 4) + j];
                xs[t] += (xv[t].x + xv[t].y) + (xv[t].z + xv[t].w);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                /* Codes widened once per row, whatever NT (see code_byte). */
                float q0, q1, q2, q3;
                if (DT == SL_DTYPE_Q8) {
                    const uint32_t u = word_of(wv[r], j);
                    q0 = code_byte(u, 0), q1 = code_byte(u, 1);
                    q2 = code_byte(u, 2), q3 = code_byte(u, 3);
                } else {
                    /* Nibbles 4 (j & 1) .. +3 of word j / 2, low nibble first. */
                    const uint32_t u = word_of(wv[r], j >> 1);
                    const int sh = (j & 1) * 16;
                    q0 = code_nibble(u, sh), q1 = code_nibble(u, sh + 4);
                    q2 = code_nibble(u, sh + 8), q3 = code_nibble(u, sh + 12);
                }
                q0 -= CZ, q1 -= CZ, q2 -= CZ, q3 -= CZ; /* exact: q - z */
#pragma unroll
                for (int t = 0; t < NT; t++)
                    d[r][t] = __fadd_rn(d[r][t], dot4(q0, q1, q2, q3, xv[t]));
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[r][t] = __fadd_rn(acc[r][t], __fmaf_rn(s[r], d[r][t], __fmul_rn(b[r], xs[t])));
    } else {
#pragma unroll
        for (int j = 0; j < E / 4; j++) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 xv = xc[(size_t)t * (x.ts / 4) + j];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float w0, w1, w2, w3;
                    if (DT == SL_DTYPE_F32) {
                        w0 = __uint_as_float(wv[r].x), w1 = __uint_as_float(wv[r].y);
                        w2 = __uint_as_float(wv[r].z), w3 = __uint_as_float(wv[r].w);
                    } else {
                        const uint32_t a = word_of(wv[r], 2 * j), h = word_of(wv[r], 2 * j + 1);
                        if (DT == SL_DTYPE_BF16) {
                            w0 = __uint_as_float(a << 16), w1 = __uint_as_float(a & 0xffff0000u);
                            w2 = __uint_as_float(h << 16), w3 = __uint_as_float(h & 0xffff0000u);
                        } else {
                            w0 = cu_f16((uint16_t)(a & 0xffffu)), w1 = cu_f16((uint16_t)(a >> 16));
                            w2 = cu_f16((uint16_t)(h & 0xffffu)), w3 = cu_f16((uint16_t)(h >> 16));
                        }
                    }
                    acc[r][t] = __fadd_rn(acc[r][t], dot4(w0, w1, w2, w3, xv));
                }
            }
        }
    }
}

/* The dot products of rows row0 .. row0+R-1 (those past N repeat row N-1) with NT rows of x,
 * summed over the warp: every lane ends with all R x NT sums (over the row's chunks ks * 32 +
 * lane + 32 nks j when the row is split over nks warps), the chunk loop unrolled U times
 * (more loads in flight, more registers), its first pre.n steps from registers (gemv_preload
 * with the same rows, ks and nks). The arithmetic of gemv_fast, shared with the batched
 * and fused expert kernels so they give the same bits (wherever x is read from, whatever R,
 * U and preloading). */
template <int DT, int R, int NT, int U, int P, bool GS>
__device__ __forceinline__ void gemv_rows(float (&acc)[R][NT], const xsrc &x, const cu_w &w, int N,
                                          int K, int64_t row0, int ks, int nks,
                                          const wpre<DT, R, P, GS> &pre) {
    const int C = K / chunk_elems<DT>::E;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    int c = ks * 32 + (threadIdx.x & 31);
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (p >= pre.n) break;
        gemv_step<DT, R, NT>(acc, pre.v[p], pre.s[p], pre.b[p], x, c);
        c += 32 * nks;
    }
    /* the loop below runs past the preloaded steps only when all P were (else c >= C) */
#pragma unroll U
    for (; c < C; c += 32 * nks) {
        uint4 wv[R];
        float s[R], b[R];
#pragma unroll
        for (int r = 0; r < R; r++) /* rows past N read the last row; their sums are dropped */
            gemv_load<DT, GS>(w, min(row0 + r, (int64_t)N - 1), c, wv[r], s[r], b[r]);
        gemv_step<DT, R, NT>(acc, wv, s, b, x, c);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = warp_sum(acc[r][t]);
}

/* Before a GEMV's wait: the first steps of rows row0 .. row0+R-1 into registers (gemv_preload),
 * and, with l2, the rest of the rows (when longer) asked of L2. */
template <int DT, int R, int P, bool GS>
__device__ __forceinline__ void gemv_ahead(wpre<DT, R, P, GS> &pre, const cu_w &w, int N, int K,
                                           int64_t row0, bool l2, int ks = 0, int nks = 1) {
    pre.n = 0;
    if (row0 >= N) return;
    gemv_preload(pre, w, N, K, row0, ks, nks);
    if (l2 && K / chunk_elems<DT>::E > P * 32 * nks) l2_prefetch_rows(w, row0, R, N);
}

/* The body of gemv_fast for block bx (also run by gemv_fast_batch, one matrix per blockIdx.y),
 * its rows' first steps in pre (gemv_ahead). */
template <int DT, int R, int NT, int P, bool GS>
__device__ __forceinline__ void
gemv_fast_body(float *__restrict__ y, const float *x, const cu_w &w, const void *__restrict__ bias,
               int bias_dt, int N, int K, int64_t bx, bool staged, const wpre<DT, R, P, GS> &pre,
               const cu_prenorm &pn, const npre &np, bool writer) {
    if (bx * GEMV_WARPS * R >= N) return; /* no rows in this block (the writer always has) */
    const xsrc xs =
        NT == 1 && pn.x ? stage_x_prenorm<DT>(pn, K, writer, np) : stage_x<DT>(x, K, NT, staged);
    const int64_t row0 = gemv_row0<R>(bx);
    if (row0 >= N) return;
    float acc[R][NT];
    gemv_rows<DT, R, NT, 2, P>(acc, xs, w, N, K, row0, 0, 1, pre);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row0 + r >= N) break;
            const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)(row0 + r)) : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++)
                y[(size_t)t * N + row0 + r] = acc[r][t] + bv;
        }
    }
}

template <int DT, int R, int NT, bool GS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_fast(float *__restrict__ y, const float *__restrict__ x, cu_w w,
              const void *__restrict__ bias, int bias_dt, int N, int K, bool staged,
              cu_prenorm pn) {
    wpre<DT, R, pre_steps<R>::P, GS> pre;
    gemv_ahead(pre, w, N, K, gemv_row0<R>(blockIdx.x), true);
    npre np;
    if (NT == 1) norm_preload(np, pn, K);
    cu_pdl_wait();
    gemv_fast_body<DT, R, NT>(y, x, w, bias, bias_dt, N, K, (int64_t)blockIdx.x, staged, pre, pn,
                              np, blockIdx.x == 0);
}

/* One matrix-vector product of a batch (sl_ops.matmul_batch). */
typedef struct gemv_item {
    float *y;
    const float *x;
    cu_w w;
    int N; /* rows of this item's matrix; the grid covers the largest */
    int spare;
} gemv_item;
static_assert(sizeof(gemv_item) == 2 * 8 + sizeof(cu_w) + 2 * 4, "gemv_item without padding");

/* Up to SMALL_BATCH items (q, k, v) travel as a kernel parameter: no upload, so no copy
 * node in a decode step's graph. Their row blocks are numbered one after another (item j's from
 * b0[j], unused entries INT32_MAX) in a 1-D grid: a 2-D grid sized by the largest item gives the
 * smaller ones blocks without rows, which hold scheduler slots ahead of working blocks (q/k/v:
 * 1,536 blocks for 640 working ones, so v's always came in a second wave). */
#define SMALL_BATCH 4
typedef struct gemv_items {
    gemv_item it[SMALL_BATCH];
    int b0[SMALL_BATCH + 2]; /* SMALL_BATCH + 1 used: the last one pads */
} gemv_items;
static_assert(sizeof(gemv_items) == SMALL_BATCH * sizeof(gemv_item) + (SMALL_BATCH + 2) * 4,
              "gemv_items without padding");

/* One decode token at one row a warp (q/k/v): 5 blocks a SM, so that q/k/v's 640 blocks at
 * Qwen3-30B-A3B shapes fit one wave of 660 slots (64 registers unbounded: 4 a SM, 528). Within
 * the 51 registers that leaves, two steps are preloaded (a whole row of 2048 int4). */
template <int R, int NT> struct batch_one_wave { static constexpr bool on = R == 1 && NT == 1; };

template <int DT, int R, int NT, bool GS>
__global__ void __launch_bounds__(GEMV_WARPS * 32, batch_one_wave<R, NT>::on ? 5 : 0)
    gemv_fast_batch(const gemv_item *__restrict__ items, gemv_items small, int K, bool staged,
                    cu_prenorm pn) {
    int j = (int)blockIdx.y, bx = (int)blockIdx.x; /* the item, its row block */
    if (!items) {
        j = 0;
#pragma unroll
        for (int i = 1; i < SMALL_BATCH; i++)
            j += bx >= small.b0[i];
        bx -= small.b0[j];
    }
    const int64_t row0 = gemv_row0<R>(bx);
    wpre<DT, R, batch_one_wave<R, NT>::on ? 2 : pre_steps<R>::P, GS> pre;
    npre np;
    if (!items) { /* items in device memory come from a copy: read them after the wait */
        gemv_ahead(pre, small.it[j].w, small.it[j].N, K, row0, true);
        if (NT == 1 && row0 < small.it[j].N) norm_preload(np, pn, K);
    }
    cu_pdl_wait();
    const gemv_item it = items ? items[j] : small.it[j];
    if (items) {
        gemv_ahead(pre, it.w, it.N, K, row0, false);
        if (NT == 1) norm_preload(np, pn, K);
    }
    gemv_fast_body<DT, R, NT>(it.y, it.x, it.w, nullptr, 0, it.N, K, (int64_t)bx, staged, pre, pn,
                              np, blockIdx.x == 0 && blockIdx.y == 0);
}

/* A warp per row, any dtype, K and alignment. */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_generic(float *__restrict__ y, const float *__restrict__ x, cu_w w,
                 const void *__restrict__ bias, int bias_dt, int N, int K) {
    cu_pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    if (n >= N) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int k = lane; k < K; k += 32) {
        const float wv = cu_load_w(w, n, k);
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[t] += wv * x[(size_t)t * K + k];
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
        const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)n) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            y[(size_t)t * N + n] = acc[t] + bv;
    }
}

/* ------------------------------------------------------------ prefill */

#define GM_BM 64 /* tokens per block */
#define GM_BN 64 /* rows per block */
#define GM_BK 32

/* S consecutive floats of a shared tile in one vector load (16 or 8 bytes, aligned). */
template <int S> __device__ __forceinline__ void gemm_lds(float (&v)[S], const float *p);
template <> __device__ __forceinline__ void gemm_lds<4>(float (&v)[4], const float *p) {
    const float4 a = *(const float4 *)p;
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
template <> __device__ __forceinline__ void gemm_lds<2>(float (&v)[2], const float *p) {
    const float2 a = *(const float2 *)p;
    v[0] = a.x, v[1] = a.y;
}

/* The tile of rows n0.. and tokens t0.. (a block of 256 threads, 16 x 16, each S x S outputs:
 * 64 x 64 at S = 4, 32 x 32 at S = 2), over columns kb .. ke - 1 (all: ke < 0). Every output is
 * summed over k in order, one product at a time, whatever S: the two tile sizes give the same
 * bits. */
template <int DT, int S = 4>
__device__ __forceinline__ void
gemm_tile(float *__restrict__ y, const float *__restrict__ x, cu_w w, const void *__restrict__ bias,
          int bias_dt, int N, int K, int T, int64_t n0, int64_t t0, int kb = 0, int ke = -1) {
    constexpr int BM = 16 * S, BN = 16 * S;
    __shared__ __align__(16) float xs[GM_BK][BM + 4];
    __shared__ __align__(16) float wsm[GM_BK][BN + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    w.dt = DT; /* lets the compiler resolve cu_load_w's branches */
    float acc[S][S] = {};
    if (ke < 0) ke = K;
    for (int k0 = kb; k0 < ke; k0 += GM_BK) {
#pragma unroll
        for (int i = 0; i < BM * GM_BK / 256; i++) {
            const int idx = tid + i * 256, r = idx / GM_BK, kk = idx % GM_BK, k = k0 + kk;
            const int64_t t = t0 + r, n = n0 + r;
            xs[kk][r] = (t < T && k < ke) ? x[(size_t)t * K + k] : 0.0f;
            wsm[kk][r] = (n < N && k < ke) ? cu_load_w(w, n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GM_BK; kk++) {
            float av[S], bv[S];
            gemm_lds<S>(av, &xs[kk][ty * S]);
            gemm_lds<S>(bv, &wsm[kk][tx * S]);
#pragma unroll
            for (int i = 0; i < S; i++)
#pragma unroll
                for (int j = 0; j < S; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < S; j++) {
        const int64_t n = n0 + tx * S + j;
        if (n >= N) continue;
        const float bv = bias ? cu_load_f(bias, bias_dt, (size_t)n) : 0.0f;
#pragma unroll
        for (int i = 0; i < S; i++) {
            const int64_t t = t0 + ty * S + i;
            if (t < T) y[(size_t)t * N + n] = acc[i][j] + bv;
        }
    }
}

template <int DT, int S>
__global__ void __launch_bounds__(256)
    gemm_tiled(float *__restrict__ y, const float *__restrict__ x, cu_w w,
               const void *__restrict__ bias, int bias_dt, int N, int K, int T) {
    cu_pdl_wait();
    gemm_tile<DT, S>(y, x, w, bias, bias_dt, N, K, T, (int64_t)blockIdx.x * (16 * S),
                     (int64_t)blockIdx.y * (16 * S));
}

/* A batch of T > 4 products of one dtype and K in one launch, a block per tile of any of them
 * (map[b]: the item of block b), each tile computed as gemm_tiled computes it. Prefill's expert
 * batches: a launch per expert left most SMs idle (12 to 32 tiles each). */
template <int DT>
__global__ void __launch_bounds__(256) gemm_tiled_batch(const cu_gemm_item *__restrict__ items,
                                                        const int32_t *__restrict__ map, int K) {
    cu_pdl_wait();
    const cu_gemm_item it = items[map[blockIdx.x]];
    const int tile = (int)blockIdx.x - it.tile0;
    gemm_tile<DT>(it.y, it.x, it.w, nullptr, 0, it.N, K, it.T, (int64_t)(tile % it.tiles_n) * GM_BN,
                  (int64_t)(tile / it.tiles_n) * GM_BM);
}

/* ------------------------------------------------------------ dispatch */

template <int DT, int R, bool GS>
static void launch_fast_r(cu_ctx *c, float *y, const float *x, const cu_w &w, const void *b,
                          int bdt, int N, int K, int T, const cu_prenorm &pn) {
    const unsigned blocks = cu_blocks((size_t)N, GEMV_WARPS * R);
    const size_t sm = stage_bytes_of<DT>(K, T);
    switch (T) {
    case 1:
        cu_launch(gemv_fast<DT, R, 1, GS>, blocks, GEMV_WARPS * 32, sm, c, y, x, w, b, bdt, N, K,
                  sm > 0, pn);
        break;
    case 2:
        cu_launch(gemv_fast<DT, R, 2, GS>, blocks, GEMV_WARPS * 32, sm, c, y, x, w, b, bdt, N, K,
                  sm > 0, pn);
        break;
    case 3:
        cu_launch(gemv_fast<DT, R, 3, GS>, blocks, GEMV_WARPS * 32, sm, c, y, x, w, b, bdt, N, K,
                  sm > 0, pn);
        break;
    default:
        cu_launch(gemv_fast<DT, R, 4, GS>, blocks, GEMV_WARPS * 32, sm, c, y, x, w, b, bdt, N, K,
                  sm > 0, pn);
        break;
    }
}

/* More rows per warp reuse each x load more, but leave fewer warps to hide latency: take
 * the most that still gives every SM a few blocks, for `rows` rows in all. */
static int rows_per_warp(const cu_ctx *c, int64_t rows) {
    const int64_t want = (int64_t)c->n_sm * 4;
    return rows / (GEMV_WARPS * 4) >= want ? 4 : rows / (GEMV_WARPS * 2) >= want ? 2 : 1;
}

/* Whether Q4 products of K columns and nt staged rows take SL_Q4X (unless
 * sl_cuda_params.int4_float_act). */
static bool q4x_ok(const cu_ctx *c, int64_t K, int nt) {
    return c->q4x && K % 64 == 0 && stage_bytes_of<SL_Q4X>(K, nt) > 0;
}

template <int DT, bool GS>
static void launch_fast_gs(cu_ctx *c, float *y, const float *x, const cu_w &w, const void *b,
                           int bdt, int N, int K, int T, const cu_prenorm &pn) {
    switch (rows_per_warp(c, N)) {
    case 4: launch_fast_r<DT, 4, GS>(c, y, x, w, b, bdt, N, K, T, pn); break;
    case 2: launch_fast_r<DT, 2, GS>(c, y, x, w, b, bdt, N, K, T, pn); break;
    default: launch_fast_r<DT, 1, GS>(c, y, x, w, b, bdt, N, K, T, pn); break;
    }
}

template <int DT>
static void launch_fast(cu_ctx *c, float *y, const float *x, const cu_w &w, const void *b, int bdt,
                        int N, int K, int T, const cu_prenorm &pn) {
    by_scales<DT>(generic_scales(w), [&](auto gs) {
        launch_fast_gs<DT, decltype(gs)::value>(c, y, x, w, b, bdt, N, K, T, pn);
    });
}

static int chunk_of(int dt) {
    switch (dt) {
    case SL_DTYPE_F32: return 4;
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: return 8;
    case SL_DTYPE_Q8: return 16;
    case SL_DTYPE_Q4: return 32;
    default: return 0;
    }
}

/* The float32 tiles of a T > 4 product: 64 x 64, or 32 x 32 when small. */
template <int DT>
static void gemm_launch(cu_ctx *c, bool small, float *y, const float *x, const cu_w &w,
                        const void *b, int bdt, int64_t N, int64_t K, int T) {
    const int e = small ? 32 : 64;
    const dim3 grid(cu_blocks((size_t)N, e), cu_blocks((size_t)T, e));
    if (small)
        cu_launch(gemm_tiled<DT, 2>, grid, 256, 0, c, y, x, w, b, bdt, (int)N, (int)K, T);
    else
        cu_launch(gemm_tiled<DT, 4>, grid, 256, 0, c, y, x, w, b, bdt, (int)N, (int)K, T);
}

/* tc: whether a prompt-sized product may take the tensor cores (cu_mma_ok) */
static void matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T, bool tc) {
    if (sl_dtype_is_block(w->dtype)) {
        cu_blk_matmul(be, y, x, w, bias, T);
        return;
    }
    if (sl_tensor_is_fp8(w)) {
        cu_fp8_matmul(be, y, x, w, bias, T);
        return;
    }
    SL_ASSERT(w->ndim == 2);
    const int64_t N = w->shape[0], K = w->shape[1];
    SL_ASSERT(N < INT32_MAX && K < INT32_MAX);
    const int dt = (int)w->dtype;
    SL_ASSERT(chunk_of(dt) > 0);
    if (T <= 0 || N <= 0) return;
    cu_ctx *c = cu_of(be);
    const cu_w wv = cu_w_of(w);
    const void *b = bias && bias->data ? bias->data : NULL;
    const int bdt = b ? (int)bias->dtype : 0;
    const int E = chunk_of(dt);
    const int fast =
        K > 0 && K % E == 0 && ((uintptr_t)wv.data & 15) == 0 && ((uintptr_t)x & 15) == 0;
    /* a pending add_rmsnorm_next whose y is x: done while staging x (one token, fast path) */
    const cu_prenorm pn = cu_norm_take(be, x, T, K, fast && prenorm_fits(N, E, K));
    if (T > 4 && tc && cu_imma_ok(c, wv, x, K)) {
        cu_imma_matmul(be, y, x, wv, b, bdt, (int)N, (int)K, T);
        return;
    }
    if (T > 4 && tc && cu_mma_ok(c, wv, x, K)) {
        cu_mma_matmul(c, y, x, wv, b, bdt, (int)N, (int)K, T);
        CUDA_LAUNCHED(c);
        return;
    }
    if (T > 4) {
        /* 32 x 32 tiles where 64 x 64 ones leave SMs idle (the router: 128 rows, 16 tiles of
         * 64 x 64 at 512 tokens), the same bits */
        const bool small =
            (int64_t)cu_blocks((size_t)N, GM_BN) * cu_blocks((size_t)T, GM_BM) < c->n_sm;
        switch (dt) {
        case SL_DTYPE_F32: gemm_launch<SL_DTYPE_F32>(c, small, y, x, wv, b, bdt, N, K, T); break;
        case SL_DTYPE_F16: gemm_launch<SL_DTYPE_F16>(c, small, y, x, wv, b, bdt, N, K, T); break;
        case SL_DTYPE_BF16: gemm_launch<SL_DTYPE_BF16>(c, small, y, x, wv, b, bdt, N, K, T); break;
        case SL_DTYPE_Q8: gemm_launch<SL_DTYPE_Q8>(c, small, y, x, wv, b, bdt, N, K, T); break;
        default: gemm_launch<SL_DTYPE_Q4>(c, small, y, x, wv, b, bdt, N, K, T); break;
        }
        CUDA_LAUNCHED(c);
        return;
    }
    if (fast) {
        switch (dt) {
        case SL_DTYPE_F32:
            launch_fast<SL_DTYPE_F32>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            break;
        case SL_DTYPE_F16:
            launch_fast<SL_DTYPE_F16>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            break;
        case SL_DTYPE_BF16:
            launch_fast<SL_DTYPE_BF16>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            break;
        case SL_DTYPE_Q8:
            launch_fast<SL_DTYPE_Q8>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            break;
        default:
            if (q4x_ok(c, K, T))
                launch_fast<SL_Q4X>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            else
                launch_fast<SL_DTYPE_Q4>(c, y, x, wv, b, bdt, (int)N, (int)K, T, pn);
            break;
        }
    } else {
        const unsigned blocks = cu_blocks((size_t)N, GEMV_WARPS);
        const unsigned th = GEMV_WARPS * 32;
        switch (T) {
        case 1:
            cu_launch(gemv_generic<1>, blocks, th, 0, c, y, x, wv, b, bdt, (int)N, (int)K);
            break;
        case 2:
            cu_launch(gemv_generic<2>, blocks, th, 0, c, y, x, wv, b, bdt, (int)N, (int)K);
            break;
        case 3:
            cu_launch(gemv_generic<3>, blocks, th, 0, c, y, x, wv, b, bdt, (int)N, (int)K);
            break;
        default:
            cu_launch(gemv_generic<4>, blocks, th, 0, c, y, x, wv, b, bdt, (int)N, (int)K);
            break;
        }
    }
    CUDA_LAUNCHED(c);
}

/* Numbers the row blocks (of rb rows) of small's n items one after another (b0); their count. */
static unsigned number_blocks(gemv_items &small, int n, unsigned rb) {
    unsigned b = 0;
    int j = 0;
    for (; j < n && j < SMALL_BATCH; j++) {
        small.b0[j] = (int)b;
        b += cu_blocks((size_t)small.it[j].N, rb);
    }
    for (small.b0[j++] = (int)b; j <= SMALL_BATCH; j++)
        small.b0[j] = INT32_MAX;
    return b;
}

template <int DT, int R, bool GS>
static void launch_batch_r(cu_ctx *c, const gemv_item *items, gemv_items small, int n, int N, int K,
                           int T, const cu_prenorm &pn) {
    const dim3 grid = items ? dim3(cu_blocks((size_t)N, GEMV_WARPS * R), (unsigned)n)
                            : dim3(number_blocks(small, n, GEMV_WARPS * R), 1);
    const size_t sm = stage_bytes_of<DT>(K, T);
    switch (T) {
    case 1:
        cu_launch(gemv_fast_batch<DT, R, 1, GS>, grid, GEMV_WARPS * 32, sm, c, items, small, K,
                  sm > 0, pn);
        break;
    case 2:
        cu_launch(gemv_fast_batch<DT, R, 2, GS>, grid, GEMV_WARPS * 32, sm, c, items, small, K,
                  sm > 0, pn);
        break;
    case 3:
        cu_launch(gemv_fast_batch<DT, R, 3, GS>, grid, GEMV_WARPS * 32, sm, c, items, small, K,
                  sm > 0, pn);
        break;
    default:
        cu_launch(gemv_fast_batch<DT, R, 4, GS>, grid, GEMV_WARPS * 32, sm, c, items, small, K,
                  sm > 0, pn);
        break;
    }
}

/* items in device memory, or NULL and the n <= SMALL_BATCH of small; N: the largest item's
 * rows; rows: all items' together. */
template <int DT, bool GS>
static void launch_batch_gs(cu_ctx *c, const gemv_item *items, const gemv_items &small, int n,
                            int N, int64_t rows, int K, int T, const cu_prenorm &pn) {
    switch (rows_per_warp(c, rows)) {
    case 4: launch_batch_r<DT, 4, GS>(c, items, small, n, N, K, T, pn); break;
    case 2: launch_batch_r<DT, 2, GS>(c, items, small, n, N, K, T, pn); break;
    default: launch_batch_r<DT, 1, GS>(c, items, small, n, N, K, T, pn); break;
    }
}

/* gs: some item's scales are not BF16 (generic_scales): the whole launch reads them so. */
template <int DT>
static void launch_batch(cu_ctx *c, const gemv_item *items, const gemv_items &small, int n, int N,
                         int64_t rows, int K, int T, const cu_prenorm &pn, bool gs) {
    by_scales<DT>(gs, [&](auto g) {
        launch_batch_gs<DT, decltype(g)::value>(c, items, small, n, N, rows, K, T, pn);
    });
}

/* Whether product i can be one item of a GEMV batch of dtype dt (chunk E) and K. */
static int gemv_item_ok(const sl_tensor *w, const float *x, int32_t T, int dt, int E, int64_t K) {
    return E > 0 && T >= 1 && T <= 4 && K % E == 0 && (int)w->dtype == dt && w->shape[1] == K &&
           w->shape[0] < INT32_MAX && ((uintptr_t)w->data & 15) == 0 && ((uintptr_t)x & 15) == 0;
}

/* The products sel[0..n) (all T, dtype dt and K; gemv_item_ok) as one GEMV launch. */
static void gemv_batch(const sl_backend *be, float *const *y, const float *const *x,
                       const sl_tensor *const *w, const int32_t *sel, int32_t n, int32_t T, int dt,
                       int K, const cu_prenorm &pn) {
    cu_ctx *c = cu_of(be);
    gemv_items small = {};
    gemv_item *items = n <= SMALL_BATCH ? small.it : (gemv_item *)c->items_host;
    SL_ASSERT((size_t)n * sizeof *items <= c->items_bytes / 2); /* cu_matmul_batch checked */
    int64_t N = 0, rows = 0;
    bool gs = false;
    for (int32_t j = 0; j < n; j++) {
        const int32_t i = sel[j];
        items[j] = gemv_item{y[i], x[i], cu_w_of(w[i]), (int)w[i]->shape[0], 0};
        N = SL_MAX(N, w[i]->shape[0]);
        rows += w[i]->shape[0];
        gs = gs || generic_scales(items[j].w);
    }
    const gemv_item *dev =
        n <= SMALL_BATCH ? NULL : (const gemv_item *)cu_items(be, items, (size_t)n * sizeof *items);
    switch (dt) {
    case SL_DTYPE_F32:
        launch_batch<SL_DTYPE_F32>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        break;
    case SL_DTYPE_F16:
        launch_batch<SL_DTYPE_F16>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        break;
    case SL_DTYPE_BF16:
        launch_batch<SL_DTYPE_BF16>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        break;
    case SL_DTYPE_Q8:
        launch_batch<SL_DTYPE_Q8>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        break;
    default:
        if (q4x_ok(c, K, T))
            launch_batch<SL_Q4X>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        else
            launch_batch<SL_DTYPE_Q4>(c, dev, small, n, (int)N, rows, K, T, pn, gs);
        break;
    }
    CUDA_LAUNCHED(c);
}

void cu_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
               const sl_tensor *bias, int32_t T) {
    matmul(be, y, x, w, bias, T, true);
}

const cu_gemm_item *cu_gemm_items(const sl_backend *be, float *const *y, const float *const *x,
                                  const sl_tensor *const *w, const int32_t *T, const int32_t *sel,
                                  int32_t n, int bn, int bm, unsigned *tiles, const int32_t **map) {
    cu_ctx *c = cu_of(be);
    size_t nt = 0;
    for (int32_t j = 0; j < n; j++)
        nt += (size_t)cu_blocks((size_t)w[sel[j]]->shape[0], bn) * cu_blocks((size_t)T[sel[j]], bm);
    const size_t ib = ((size_t)n * sizeof(cu_gemm_item) + 15) & ~(size_t)15;
    const size_t bytes = ib + nt * sizeof(int32_t);
    if (bytes > c->items_bytes / 2 || bytes > c->stage_bytes / 8 || nt > 0x7fffffff) return NULL;
    cu_gemm_item *items = (cu_gemm_item *)c->items_host;
    int32_t *hmap = (int32_t *)(c->items_host + ib);
    int tile = 0;
    for (int32_t j = 0; j < n; j++) {
        const int32_t i = sel[j];
        const int tn = (int)cu_blocks((size_t)w[i]->shape[0], bn);
        const int tt = (int)cu_blocks((size_t)T[i], bm);
        items[j] = cu_gemm_item{y[i], x[i], cu_w_of(w[i]), (int)w[i]->shape[0], T[i], tile, tn};
        for (int b = 0; b < tn * tt; b++)
            hmap[tile + b] = j;
        tile += tn * tt;
    }
    const uint8_t *dev = (const uint8_t *)cu_items(be, items, bytes);
    *tiles = (unsigned)nt;
    *map = (const int32_t *)(dev + ib);
    return (const cu_gemm_item *)dev;
}

/* The products sel[0..n) (T > 4, dtype dt and K) as one tiled launch; 0 when their items and
 * tile map do not fit the parameter ring (the caller then runs them one by one). */
static int gemm_batch(const sl_backend *be, float *const *y, const float *const *x,
                      const sl_tensor *const *w, const int32_t *T, const int32_t *sel, int32_t n,
                      int dt, int K) {
    cu_ctx *c = cu_of(be);
    /* each product as cu_matmul takes it alone: all on int8 tensor cores, all on BF16 ones, all
     * on the float32 tiles, or (a mix) one by one */
    int on_i8 = 0, on_tc = 0;
    for (int32_t j = 0; j < n; j++) {
        const cu_w wj = cu_w_of(w[sel[j]]);
        on_i8 += cu_imma_ok(c, wj, x[sel[j]], K);
        on_tc += cu_mma_ok(c, wj, x[sel[j]], K);
    }
    if (on_i8 == n) return cu_imma_matmul_batch(be, y, x, w, T, sel, n, K);
    if (on_i8) return 0;
    if (on_tc == n) return cu_mma_matmul_batch(be, y, x, w, T, sel, n, K);
    if (on_tc) return 0;
    unsigned tiles;
    const int32_t *dm;
    const cu_gemm_item *di = cu_gemm_items(be, y, x, w, T, sel, n, GM_BN, GM_BM, &tiles, &dm);
    if (!di) return 0;
    switch (dt) {
    case SL_DTYPE_F32:
        cu_launch(gemm_tiled_batch<SL_DTYPE_F32>, tiles, 256, 0, c, di, dm, K);
        break;
    case SL_DTYPE_F16:
        cu_launch(gemm_tiled_batch<SL_DTYPE_F16>, tiles, 256, 0, c, di, dm, K);
        break;
    case SL_DTYPE_BF16:
        cu_launch(gemm_tiled_batch<SL_DTYPE_BF16>, tiles, 256, 0, c, di, dm, K);
        break;
    case SL_DTYPE_Q8: cu_launch(gemm_tiled_batch<SL_DTYPE_Q8>, tiles, 256, 0, c, di, dm, K); break;
    default: cu_launch(gemm_tiled_batch<SL_DTYPE_Q4>, tiles, 256, 0, c, di, dm, K); break;
    }
    CUDA_LAUNCHED(c);
    return 1;
}

/*
 * A batch as few launches as its products allow, each product computed exactly as cu_matmul
 * computes it alone (so its bits never depend on the batch around it): those with the same T <= 4
 * and the fast GEMV's alignment as one GEMV launch per T, those with T > 4 as one tiled launch,
 * when all share dtype and K; anything else one matmul after another.
 */
void cu_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                     const sl_tensor *const *w, const int32_t *T, int32_t n) {
    if (n <= 0) return;
    if (sl_dtype_is_block(w[0]->dtype)) {
        cu_blk_matmul_batch(be, y, x, w, T, n);
        return;
    }
    for (int32_t i = 0; i < n; i++)
        if (sl_tensor_is_fp8(w[i])) {
            cu_fp8_matmul_batch(be, y, x, w, T, n);
            return;
        }
    cu_ctx *c = cu_of(be);
    const int dt = (int)w[0]->dtype, E = chunk_of(dt);
    const int64_t K = w[0]->shape[1];
    /* the host parameter block (no allocation in the forward pass): items in its first half,
     * the indices of one launch's products (sel) in its second */
    int same = E > 0 && K < INT32_MAX && n <= 65535 &&
               (size_t)n * sizeof(gemv_item) <= c->items_bytes / 2 &&
               (size_t)n * sizeof(int32_t) <= c->items_bytes / 2;
    for (int32_t i = 0; same && i < n; i++)
        same = (int)w[i]->dtype == dt && w[i]->shape[1] == K && w[i]->shape[0] < INT32_MAX;
    /* A pending add_rmsnorm_next whose y every product reads (one token each): done while
     * staging x, when they all go into the one GEMV launch. */
    cu_prenorm pn = {};
    if (c->pend.x) {
        int take = same;
        int64_t rows = 0;
        for (int32_t i = 0; take && i < n; i++) {
            take = T[i] == 1 && x[i] == c->pend.y && gemv_item_ok(w[i], x[i], 1, dt, E, K);
            rows += w[i]->shape[0];
        }
        pn = cu_norm_take(be, x[0], 1, K, take && prenorm_fits(rows, E, K));
    }
    if (!same) {
        for (int32_t i = 0; i < n; i++)
            cu_matmul(be, y[i], x[i], w[i], NULL, T[i]);
        return;
    }
    int32_t *sel = (int32_t *)(c->items_host + c->items_bytes / 2);
    for (int32_t t = 1; t <= 4; t++) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (T[i] == t && gemv_item_ok(w[i], x[i], t, dt, E, K)) sel[m++] = i;
        if (m) gemv_batch(be, y, x, w, sel, m, t, dt, (int)K, pn);
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (T[i] > 4)
            sel[m++] = i;
        else if (T[i] >= 1 && !gemv_item_ok(w[i], x[i], T[i], dt, E, K))
            cu_matmul(be, y[i], x[i], w[i], NULL, T[i]);
    }
    if (m && !gemm_batch(be, y, x, w, T, sel, m, dt, (int)K))
        for (int32_t j = 0; j < m; j++)
            cu_matmul(be, y[sel[j]], x[sel[j]], w[sel[j]], NULL, T[sel[j]]);
}

/* ------------------------------------------------------ routed experts */

/* Expert e's matrix j (0 gate, 1 up, 2 down) from its table row, shaped as proto. */
__device__ __forceinline__ cu_w expert_w(cu_w w, const sl_expert_ptrs &p, int j) {
    w.data = (const uint8_t *)p.p[3 * j];
    w.scales = (const uint16_t *)p.p[3 * j + 1];
    w.biases = (const uint16_t *)p.p[3 * j + 2];
    return w;
}

/* act[i] = silu(gate_e x[i / k]) * up_e x[i / k] for row i = blockIdx.y, e = ids[i]: the
 * gate and up GEMVs of gemv_fast_batch (same arithmetic, + 0.0f as the bias-less store
 * adds) and the swiglu op's formula, in one launch. */
template <int DT, int R, bool GS>
__global__ void __launch_bounds__(GEMV_WARPS * 32, R <= 2 ? GU_MINB : 0)
    moe_gate_up(float *__restrict__ act, const float *__restrict__ x,
                const int32_t *__restrict__ ids, const sl_expert_ptrs *__restrict__ table, cu_w pg,
                cu_w pu, int k, int I, int H, bool staged) {
    cu_pdl_wait();
    const int i = blockIdx.y;
    const int64_t row0 = gemv_row0<R>(blockIdx.x);
    const sl_expert_ptrs p = table[ids[i]];
    /* a zero row: not in the cache (see moe_down_sum); the rows' first steps load while x
     * is staged */
    const bool run = row0 < I && p.p[0];
    const cu_w wg = expert_w(pg, p, 0), wu = expert_w(pu, p, 1);
    wpre<DT, R, 2, GS> prg, pru;
    prg.n = pru.n = 0;
    if (run) gemv_preload(prg, wg, I, H, row0), gemv_preload(pru, wu, I, H, row0);
    const xsrc xt = stage_x<DT>(x + (size_t)(i / k) * H, H, 1, staged);
    if (!run) return;
    float g[R][1], u[R][1];
    gemv_rows<DT, R, 1, 2, 2>(g, xt, wg, I, H, row0, 0, 1, prg);
    gemv_rows<DT, R, 1, 2, 2>(u, xt, wu, I, H, row0, 0, 1, pru);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (row0 + r < I)
                act[(size_t)i * I + row0 + r] = cu_silu_mul(g[r][0] + 0.0f, u[r][0] + 0.0f);
}

/* Experts per token the fused kernels take: a warp each in moe_down_sum (16: 512 threads, so
 * up to 128 registers a thread). */
#define MOE_MAX_K 16

/* y[t] rows row0 .. row0+R-1, t = blockIdx.y, row0 = blockIdx.x R: warp r computes them for
 * rank r (down_e act[t k + r], e = ids[t k + r], plus the 0.0f of the bias-less store) into
 * shared memory, then R threads sum the ranks in order, as the weighted_sum kernel does. */
template <int DT, int R, bool GS>
__global__ void __launch_bounds__(32 * MOE_MAX_K)
    moe_down_sum(float *__restrict__ y, const float *__restrict__ act,
                 const int32_t *__restrict__ ids, const float *__restrict__ w,
                 const sl_expert_ptrs *__restrict__ table, cu_w pd, int I, int H, int k,
                 bool staged) {
    __shared__ float part[MOE_MAX_K * R]; /* [rank][row] */
    const int t = blockIdx.y, r = threadIdx.x / 32;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    const int i = t * k + r;
    /* Only act comes from the previous kernel (moe_gate_up). The picks and the table were
     * written before gate/up, and this kernel launches only once every gate/up block has
     * passed its wait (cu_pdl_wait), which returns when the kernels before gate/up are done.
     * So they are read, and the rows' first step loaded, before this kernel's wait: with
     * dependent launch they arrive while gate/up ends. A token with a pick not in
     * the expert cache (a zero table row) is left as it is: the cache runs the kernels again
     * once its misses are in (ops.h). */
    const sl_expert_ptrs p = table[__ldcg(ids + i)];
    const cu_w wd = expert_w(pd, p, 2);
    wpre<DT, R, 1, GS> pre;
    pre.n = 0;
    if (p.p[0]) gemv_preload(pre, wd, H, I, row0);
    const bool run = __syncthreads_and(p.p[0] != nullptr);
    cu_pdl_wait();
    if (!run) return;
    const xsrc xs = stage_x<DT>(act + (size_t)t * k * I, I, k, staged); /* token t's k rows */
    const xsrc xr = {xs.p + (size_t)r * xs.ts, xs.cs, xs.ts};
    float v[R][1];
    gemv_rows<DT, R, 1, 1, 1>(v, xr, wd, H, I, row0, 0, 1, pre);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int j = 0; j < R; j++)
            part[r * R + j] = v[j][0] + 0.0f;
    __syncthreads();
    if (threadIdx.x < R && row0 + threadIdx.x < H) {
        float acc = 0.0f;
        for (int q = 0; q < k; q++)
            acc += w[(size_t)t * k + q] * part[q * R + threadIdx.x];
        y[(size_t)t * H + row0 + threadIdx.x] = acc;
    }
}

/* Gate/up rows a warp: the fewest that fit the grid in one wave (GU_MINB blocks a SM), else as
 * the GEMVs. */
static int gate_up_rows(const cu_ctx *c, int64_t rows) {
    for (int r = 1; r <= 2; r *= 2)
        if ((int64_t)cu_blocks((size_t)rows, GEMV_WARPS * r) <= (int64_t)c->n_sm * GU_MINB)
            return r;
    return rows_per_warp(c, rows);
}

template <int DT, bool GS>
static void launch_moe_gs(cu_ctx *c, float *y, float *act, const float *x, const int32_t *ids,
                          const float *w, const sl_expert_ptrs *table,
                          const sl_tensor *const proto[3], int T, int k) {
    const int I = (int)proto[0]->shape[0], H = (int)proto[0]->shape[1], n = T * k;
    const cu_w pg = cu_w_of(proto[0]), pu = cu_w_of(proto[1]), pd = cu_w_of(proto[2]);
    const int rg = gate_up_rows(c, (int64_t)I * n);
    /* down: a block of k warps per R rows and token; the most rows (up to 8) that still give
     * every SM a block. Fewer, fuller blocks: at Qwen3-30B-A3B shapes R = 4 made 512 blocks of
     * 90 registers a thread, two to a SM (two waves); R = 8 makes 256, two to a SM, with the
     * chunk loop not unrolled (expert rows are short: a row of 768 int4 weights is 24 chunks,
     * one a lane) to stay within 128 registers. */
    const int64_t hb = (int64_t)H * T, sm = c->n_sm;
    const int rd = hb / 8 >= sm ? 8 : hb / 4 >= sm ? 4 : hb / 2 >= sm ? 2 : 1;
    const dim3 gg(cu_blocks((size_t)I, GEMV_WARPS * rg), (unsigned)n);
    const dim3 gd(cu_blocks((size_t)H, rd), (unsigned)T);
    const unsigned th = GEMV_WARPS * 32, td = 32 * k;
    const size_t sg = stage_bytes_of<DT>(H, 1), sd = stage_bytes_of<DT>(I, k);
    switch (rg) {
    case 4:
        cu_launch(moe_gate_up<DT, 4, GS>, gg, th, sg, c, act, x, ids, table, pg, pu, k, I, H,
                  sg > 0);
        break;
    case 2:
        cu_launch(moe_gate_up<DT, 2, GS>, gg, th, sg, c, act, x, ids, table, pg, pu, k, I, H,
                  sg > 0);
        break;
    default:
        cu_launch(moe_gate_up<DT, 1, GS>, gg, th, sg, c, act, x, ids, table, pg, pu, k, I, H,
                  sg > 0);
        break;
    }
    switch (rd) {
    case 8:
        cu_launch(moe_down_sum<DT, 8, GS>, gd, td, sd, c, y, act, ids, w, table, pd, I, H, k,
                  sd > 0);
        break;
    case 4:
        cu_launch(moe_down_sum<DT, 4, GS>, gd, td, sd, c, y, act, ids, w, table, pd, I, H, k,
                  sd > 0);
        break;
    case 2:
        cu_launch(moe_down_sum<DT, 2, GS>, gd, td, sd, c, y, act, ids, w, table, pd, I, H, k,
                  sd > 0);
        break;
    default:
        cu_launch(moe_down_sum<DT, 1, GS>, gd, td, sd, c, y, act, ids, w, table, pd, I, H, k,
                  sd > 0);
        break;
    }
}

template <int DT>
static void launch_moe(cu_ctx *c, float *y, float *act, const float *x, const int32_t *ids,
                       const float *w, const sl_expert_ptrs *table, const sl_tensor *const proto[3],
                       int T, int k) {
    const bool gs = generic_scales(cu_w_of(proto[0])) || generic_scales(cu_w_of(proto[1])) ||
                    generic_scales(cu_w_of(proto[2]));
    by_scales<DT>(gs, [&](auto g) {
        launch_moe_gs<DT, decltype(g)::value>(c, y, act, x, ids, w, table, proto, T, k);
    });
}

/* The fused path takes exactly the shapes for which matmul_batch's one-launch path runs
 * (chunk-divisible K, 16-byte aligned rows; table rows are expert-cache slots, 64-byte
 * aligned), so a caller's fallback never changes the bits. */
int cu_moe_experts(const sl_backend *be, float *y, float *act, const float *x, const int32_t *ids,
                   const float *w, const sl_expert_ptrs *table, const sl_tensor *const proto[3],
                   int32_t T, int32_t k) {
    if (sl_dtype_is_block(proto[0]->dtype))
        return cu_blk_moe_experts(be, y, act, x, ids, w, table, proto, T, k);
    if (sl_tensor_is_fp8(proto[0]))
        return cu_fp8_moe_experts(be, y, act, x, ids, w, table, proto, T, k);
    const int dt = (int)proto[0]->dtype, E = chunk_of(dt);
    const int64_t I = proto[0]->shape[0], H = proto[0]->shape[1];
    const int64_t n = (int64_t)T * k;
    /* K % E == 0 with E >= 4 also keeps every row of x and act 16-byte aligned */
    int ok = E > 0 && n >= 0 && n <= 65535 && k >= 1 && k <= MOE_MAX_K && H % E == 0 &&
             I % E == 0 && I < INT32_MAX && H < INT32_MAX && ((uintptr_t)x & 15) == 0 &&
             ((uintptr_t)act & 15) == 0;
    for (int j = 1; ok && j < 3; j++)
        ok = (int)proto[j]->dtype == dt;
    ok = ok && proto[1]->shape[0] == I && proto[1]->shape[1] == H && proto[2]->shape[0] == H &&
         proto[2]->shape[1] == I;
    if (!ok || !n) return ok;
    cu_ctx *c = cu_of(be);
    switch (dt) {
    case SL_DTYPE_F32: launch_moe<SL_DTYPE_F32>(c, y, act, x, ids, w, table, proto, T, k); break;
    case SL_DTYPE_F16: launch_moe<SL_DTYPE_F16>(c, y, act, x, ids, w, table, proto, T, k); break;
    case SL_DTYPE_BF16: launch_moe<SL_DTYPE_BF16>(c, y, act, x, ids, w, table, proto, T, k); break;
    case SL_DTYPE_Q8: launch_moe<SL_DTYPE_Q8>(c, y, act, x, ids, w, table, proto, T, k); break;
    default:
        if (q4x_ok(c, proto[0]->shape[1], 1) && q4x_ok(c, proto[2]->shape[1], k))
            launch_moe<SL_Q4X>(c, y, act, x, ids, w, table, proto, T, k);
        else
            launch_moe<SL_DTYPE_Q4>(c, y, act, x, ids, w, table, proto, T, k);
        break;
    }
    CUDA_LAUNCHED(c);
    return 1;
}

/* -------------------------------------------------------------- router */

/*
 * Router top-k of one token's E <= ROUTE_BLOCK_MAX logits p by the whole block, k <= 32: the
 * picks and weights cu_route gives, without its k serial rounds (one warp's, which took ~7 us
 * of the router kernel on an H200): each entry's rank in the order of cu_ranks_before is counted
 * against all E probabilities in shared memory, and the entries ranked below k are the picks.
 * When the softmax sum is NaN (a NaN or infinite logit) every probability is NaN, and the picks
 * are 0 .. k-1, as sl_router_topk's are then. The logits are read through L2 (__ldcg).
 */
#define ROUTE_BLOCK_MAX 256

__device__ void cu_route_block(int32_t *ids, float *w, float *p, int E, int k, int renorm) {
    __shared__ float sp[ROUTE_BLOCK_MAX], sh[32], wk[32]; /* wk: the picks' weights, by rank */
    const int tid = threadIdx.x, nt = blockDim.x;
    float mx = -INFINITY;
    for (int e = tid; e < E; e += nt) {
        sp[e] = __ldcg(p + e);
        mx = fmaxf(mx, sp[e]);
    }
    mx = block_reduce<true>(mx, sh);
    float sum = 0.0f;
    for (int e = tid; e < E; e += nt)
        sum += sp[e] = expf(sp[e] - mx);
    sum = block_reduce<false>(sum, sh);
    for (int e = tid; e < E; e += nt)
        p[e] = sp[e] /= sum;
    __syncthreads();
    if (isnan(sum)) {
        if (tid < k) ids[tid] = tid, wk[tid] = sp[tid];
    } else {
        for (int e = tid; e < E; e += nt) {
            const float x = sp[e];
            int rank = 0;
            for (int j = 0; j < E; j++)
                rank += cu_ranks_before(sp[j], j, x, e);
            if (rank < k) ids[rank] = e, wk[rank] = x;
        }
    }
    __syncthreads();
    if (tid < k) {
        float s = 0.0f;
        if (renorm)
            for (int r = 0; r < k; r++) /* rank order, as the CPU sums */
                s += wk[r];
        w[tid] = renorm ? wk[tid] / s : wk[tid];
    }
}

/* The router of NT <= 4 tokens in one launch. A block per logit: each of its warps sums a
 * GEMV_WARPS-th of the row's chunks (router rows are few, so one warp per row would leave most SMs
 * idle and take several DRAM round trips), and the parts are added in order. Then the block that
 * finishes last routes each token (cu_route_block, else a warp per token). */
template <int DT, int NT, bool GS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    router_gemv(float *__restrict__ logits, const float *__restrict__ x, cu_w w, int E, int K,
                int32_t *__restrict__ ids, float *__restrict__ wts, int k, int renorm,
                unsigned *done, bool staged, cu_prenorm pn) {
    const int warp = threadIdx.x / 32;
    wpre<DT, 1, pre_steps<1>::P, GS> pre;
    gemv_ahead(pre, w, E, K, blockIdx.x, true, warp, GEMV_WARPS);
    npre np;
    if (NT == 1) norm_preload(np, pn, K);
    cu_pdl_wait();
    __shared__ float part[GEMV_WARPS][NT];
    const xsrc xs = NT == 1 && pn.x ? stage_x_prenorm<DT>(pn, K, blockIdx.x == 0, np)
                                    : stage_x<DT>(x, K, NT, staged);
    float acc[1][NT];
    gemv_rows<DT, 1, NT, 2, pre_steps<1>::P>(acc, xs, w, E, K, blockIdx.x, warp, GEMV_WARPS, pre);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int t = 0; t < NT; t++)
            part[warp][t] = acc[0][t];
    __syncthreads();
    if (threadIdx.x < NT) {
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < GEMV_WARPS; q++)
            v += part[q][threadIdx.x];
        logits[(size_t)threadIdx.x * E + blockIdx.x] = v;
    }
    if (!cu_last_block(done, gridDim.x)) return;
    if (E <= ROUTE_BLOCK_MAX && k <= 32 && E <= 2 * (int)blockDim.x) {
        for (int t = 0; t < NT; t++) {
            cu_route_block(ids + t * k, wts + t * k, logits + (size_t)t * E, E, k, renorm);
            __syncthreads(); /* sp, sh and wk are reused by the next token */
        }
    } else if (warp < NT) {
        cu_route(ids + warp * k, wts + warp * k, logits + (size_t)warp * E, E, k, renorm);
    }
}

/*
 * A prompt's router logits in S slices of K (blockIdx.z: slice z of columns z ks .. (z + 1) ks
 * - 1), each into its own plane of part [S][T][E]: a 128-expert router at 512 tokens is 64 tiles
 * of 32 x 32, too few for the SMs, and each tile's loop over K was a chain of 64 dependent
 * loads. route_split_kernel adds the planes in order.
 */
template <int DT>
__global__ void __launch_bounds__(256)
    router_split(float *__restrict__ part, const float *__restrict__ x, cu_w w, int E, int K, int T,
                 int ks) {
    cu_pdl_wait();
    const int z = blockIdx.z;
    gemm_tile<DT, 2>(part + (size_t)z * T * E, x, w, nullptr, 0, E, K, T, (int64_t)blockIdx.x * 32,
                     (int64_t)blockIdx.y * 32, z * ks, min(K, (z + 1) * ks));
}

/* The logits of token blockIdx.x as the sum of its S planes (in plane order), then its picks as
 * route_kernel makes them. */
__global__ void route_split_kernel(int32_t *__restrict__ ids, float *__restrict__ w,
                                   float *__restrict__ logits, const float *__restrict__ part,
                                   int S, int T, int E, int k, int renorm) {
    cu_pdl_wait();
    const size_t t = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += 32) {
        float v = __ldcg(part + t * E + e);
        for (int z = 1; z < S; z++)
            v += __ldcg(part + ((size_t)z * T + t) * E + e);
        logits[t * E + e] = v;
    }
    __syncwarp();
    cu_route(ids + t * k, w + t * k, logits + t * E, E, k, renorm);
}

/* Routing of logits already computed, a warp per token (the path for T > 4). */
__global__ void route_kernel(int32_t *__restrict__ ids, float *__restrict__ w,
                             float *__restrict__ logits, int E, int k, int renorm) {
    cu_pdl_wait();
    const size_t t = blockIdx.x;
    cu_route(ids + t * k, w + t * k, logits + t * E, E, k, renorm);
}

template <int DT, bool GS>
static void launch_router_gs(cu_ctx *c, int32_t *ids, float *w, float *logits, const float *x,
                             const cu_w &wv, int E, int K, int T, int k, int renorm,
                             const cu_prenorm &pn) {
    const unsigned blocks = (unsigned)E, th = GEMV_WARPS * 32;
    const size_t sm = stage_bytes_of<DT>(K, T);
    switch (T) {
    case 1:
        cu_launch(router_gemv<DT, 1, GS>, blocks, th, sm, c, logits, x, wv, E, K, ids, w, k, renorm,
                  c->done, sm > 0, pn);
        break;
    case 2:
        cu_launch(router_gemv<DT, 2, GS>, blocks, th, sm, c, logits, x, wv, E, K, ids, w, k, renorm,
                  c->done, sm > 0, pn);
        break;
    case 3:
        cu_launch(router_gemv<DT, 3, GS>, blocks, th, sm, c, logits, x, wv, E, K, ids, w, k, renorm,
                  c->done, sm > 0, pn);
        break;
    default:
        cu_launch(router_gemv<DT, 4, GS>, blocks, th, sm, c, logits, x, wv, E, K, ids, w, k, renorm,
                  c->done, sm > 0, pn);
        break;
    }
}

template <int DT>
static void launch_router(cu_ctx *c, int32_t *ids, float *w, float *logits, const float *x,
                          const cu_w &wv, int E, int K, int T, int k, int renorm,
                          const cu_prenorm &pn) {
    by_scales<DT>(generic_scales(wv), [&](auto gs) {
        launch_router_gs<DT, decltype(gs)::value>(c, ids, w, logits, x, wv, E, K, T, k, renorm, pn);
    });
}

/*
 * Every sl_route_cfg rule (the path for anything but a plain softmax router), one warp per
 * token over logits already computed (bias included): the scores into logits, the groups (lane
 * g scores group g, the sum of its two largest keys, then counts the groups ranked before it),
 * then k rounds, each taking the best key ranked after the previous pick among the allowed
 * experts (each lane its entries, then a butterfly), then lane 0 turns the picks into weights
 * in rank order, as sl_route_topk does.
 */
struct cu_route_rule {
    const void *sb, *es; /* select_bias and expert_scale data, or NULL */
    int score, renorm, n_group, topk_group;
    int sb_dt, es_dt;
    float scale;
    int spare;
};
static_assert(sizeof(cu_route_rule) == 2 * 8 + 8 * 4, "cu_route_rule without padding");

__device__ __forceinline__ float rule_key(const float *l, const cu_route_rule &r, int e) {
    return r.sb ? __ldcg(l + e) + cu_load_f(r.sb, r.sb_dt, (size_t)e) : __ldcg(l + e);
}

__global__ void route_rule_kernel(int32_t *__restrict__ ids_all, float *__restrict__ w_all,
                                  float *__restrict__ logits, int E, int k, cu_route_rule r) {
    __shared__ float gs[SL_ROUTE_MAX_GROUPS];
    __shared__ int allowed[SL_ROUTE_MAX_GROUPS];
    cu_pdl_wait();
    const int lane = threadIdx.x;
    const size_t t = blockIdx.x;
    float *l = logits + t * (size_t)E;
    int32_t *ids = ids_all + t * (size_t)k;
    float *w = w_all + t * (size_t)k;
    if (r.score == SL_ROUTE_SOFTMAX) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = lane; e < E; e += 32)
            mx = fmaxf(mx, __ldcg(l + e));
        mx = warp_max(mx);
        for (int e = lane; e < E; e += 32) {
            const float v = expf(__ldcg(l + e) - mx);
            l[e] = v;
            sum += v;
        }
        sum = warp_sum(sum);
        for (int e = lane; e < E; e += 32)
            l[e] /= sum;
    } else if (r.score == SL_ROUTE_SIGMOID) {
        for (int e = lane; e < E; e += 32)
            l[e] = 1.0f / (1.0f + expf(-__ldcg(l + e)));
    }
    __syncwarp();
    const int sig = r.score == SL_ROUTE_SIGMOID;
    const cu_route_rule rk = {sig ? r.sb : NULL, NULL,    r.score, r.renorm, r.n_group,
                              r.topk_group,      r.sb_dt, 0,       r.scale,  0};
    const int grouped = sig && r.n_group > 1, ng = grouped ? E / r.n_group : E;
    if (grouped) {
        for (int g = lane; g < r.n_group; g += 32) {
            int i1 = -1, i2 = -1;
            float v1 = 0.0f, v2 = 0.0f;
            for (int e = g * ng; e < (g + 1) * ng; e++) {
                const float v = rule_key(l, rk, e);
                if (i1 < 0 || cu_ranks_before(v, e, v1, i1))
                    i2 = i1, v2 = v1, i1 = e, v1 = v;
                else if (i2 < 0 || cu_ranks_before(v, e, v2, i2))
                    i2 = e, v2 = v;
            }
            gs[g] = v1 + v2;
        }
        __syncwarp();
        for (int g = lane; g < r.n_group; g += 32) {
            int rank = 0;
            for (int h = 0; h < r.n_group; h++)
                rank += cu_ranks_before(gs[h], h, gs[g], g);
            allowed[g] = rank < r.topk_group;
        }
        __syncwarp();
    }
    float prev_v = 0.0f;
    int prev_i = -1;
    for (int q = 0; q < k; q++) {
        float bv = 0.0f;
        int bi = -1;
        for (int e = lane; e < E; e += 32) {
            if (grouped && !allowed[e / ng]) continue;
            const float v = rule_key(l, rk, e);
            if (prev_i >= 0 && !cu_ranks_before(prev_v, prev_i, v, e)) continue;
            if (bi < 0 || cu_ranks_before(v, e, bv, bi)) bv = v, bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || cu_ranks_before(ov, oi, bv, bi))) bv = ov, bi = oi;
        }
        if (bi < 0) bi = q, bv = rule_key(l, rk, q); /* only NaN gets here: keep ids valid */
        if (lane == 0) ids[q] = bi;
        prev_v = bv, prev_i = bi;
    }
    __syncwarp();
    if (lane) return;
    float sum = 0.0f;
    const float mx = __ldcg(l + ids[0]);
    for (int q = 0; q < k; q++) {
        const float v = __ldcg(l + ids[q]);
        float x = v;
        if (r.score == SL_ROUTE_TOPK_SIGMOID) x = 1.0f / (1.0f + expf(-v));
        if (r.score == SL_ROUTE_TOPK_SOFTMAX) sum += x = expf(v - mx);
        w[q] = x;
    }
    if (r.score == SL_ROUTE_TOPK_SOFTMAX)
        for (int q = 0; q < k; q++)
            w[q] /= sum;
    if (r.renorm) {
        float s = 0.0f;
        for (int q = 0; q < k; q++) /* rank order, as the CPU sums */
            s += w[q];
        if (sig) s += 1e-20f;
        for (int q = 0; q < k; q++)
            w[q] /= s;
    }
    if (r.es)
        for (int q = 0; q < k; q++)
            w[q] *= cu_load_f(r.es, r.es_dt, (size_t)ids[q]);
    if (r.scale != 0.0f && r.scale != 1.0f)
        for (int q = 0; q < k; q++)
            w[q] *= r.scale;
}

/* A prompt's plain routing through router_split when its float32 tiles alone would leave SMs
 * idle and the scratch holds the planes; false: not taken. */
static bool route_split(cu_ctx *c, int32_t *ids, float *w, float *logits, const float *x,
                        const sl_tensor *router, int E, int K, int T, int k, int renorm) {
    const int dt = (int)router->dtype;
    if (dt != SL_DTYPE_F32 && dt != SL_DTYPE_F16 && dt != SL_DTYPE_BF16) return false;
    const int tiles = (int)cu_blocks((size_t)E, 32) * (int)cu_blocks((size_t)T, 32);
    int S = 1;
    while (S < 8 && tiles * S < 2 * c->n_sm && K / (2 * S) >= 4 * GM_BK &&
           (size_t)2 * S * T * E * sizeof(float) <= c->scratch_bytes)
        S *= 2;
    if (S == 1) return false;
    const int ks = (K / S + GM_BK - 1) / GM_BK * GM_BK;
    float *part = (float *)c->scratch;
    const dim3 grid(cu_blocks((size_t)E, 32), cu_blocks((size_t)T, 32), (unsigned)S);
    const cu_w wv = cu_w_of(router);
    switch (dt) {
    case SL_DTYPE_F32:
        cu_launch(router_split<SL_DTYPE_F32>, grid, 256, 0, c, part, x, wv, E, K, T, ks);
        break;
    case SL_DTYPE_F16:
        cu_launch(router_split<SL_DTYPE_F16>, grid, 256, 0, c, part, x, wv, E, K, T, ks);
        break;
    default:
        cu_launch(router_split<SL_DTYPE_BF16>, grid, 256, 0, c, part, x, wv, E, K, T, ks);
        break;
    }
    cu_launch(route_split_kernel, (unsigned)T, 32, 0, c, ids, w, logits, part, S, T, E, k, renorm);
    CUDA_LAUNCHED(c);
    return true;
}

void cu_moe_route(const sl_backend *be, const sl_route_args *a) {
    const sl_tensor *router = a->router;
    const int64_t E = router->shape[0], K = router->shape[1];
    const int32_t T = a->T, k = a->k;
    const int dt = (int)router->dtype, C = chunk_of(dt);
    if (T <= 0 || E <= 0 || k <= 0) return;
    cu_ctx *c = cu_of(be);
    const sl_route_cfg *rc = &a->cfg;
    const int plain = rc->score == SL_ROUTE_SOFTMAX && !a->bias && !a->select_bias &&
                      !a->expert_scale && (rc->scale == 0.0f || rc->scale == 1.0f);
    if (!plain) {
        /* float32 tiles, not the tensor cores: the picks are a discontinuous function of the
         * scores, and a 1e-5 change in a near tie would take another expert than the CPU's */
        matmul(be, a->logits, a->x, router, a->bias, T, false);
        const cu_route_rule r = {a->select_bias ? a->select_bias->data : NULL,
                                 a->expert_scale ? a->expert_scale->data : NULL,
                                 (int)rc->score,
                                 rc->renormalize,
                                 rc->n_group,
                                 rc->topk_group,
                                 a->select_bias ? (int)a->select_bias->dtype : 0,
                                 a->expert_scale ? (int)a->expert_scale->dtype : 0,
                                 rc->scale,
                                 0};
        cu_launch(route_rule_kernel, (unsigned)T, 32, 0, c, a->ids, a->w, a->logits, (int)E, k, r);
        CUDA_LAUNCHED(c);
        return;
    }
    int32_t *ids = a->ids;
    float *w = a->w, *logits = a->logits;
    const float *x = a->x;
    const int renormalize = rc->renormalize;
    const int fast = T <= 4 && C > 0 && K % C == 0 && E < INT32_MAX && K < INT32_MAX &&
                     ((uintptr_t)router->data & 15) == 0 && ((uintptr_t)x & 15) == 0;
    /* a pending add_rmsnorm_next whose y is x: done while staging x */
    const cu_prenorm pn = cu_norm_take(be, x, T, K, fast && prenorm_fits(E, C, K));
    if (!fast) {
        if (route_split(c, ids, w, logits, x, router, (int)E, (int)K, T, k, renormalize)) return;
        matmul(be, logits, x, router, NULL, T, false); /* as cu_moe_route: float32 */
        cu_launch(route_kernel, (unsigned)T, 32, 0, c, ids, w, logits, (int)E, k, renormalize);
        CUDA_LAUNCHED(c);
        return;
    }
    const cu_w wv = cu_w_of(router);
    switch (dt) {
    case SL_DTYPE_F32:
        launch_router<SL_DTYPE_F32>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize,
                                    pn);
        break;
    case SL_DTYPE_F16:
        launch_router<SL_DTYPE_F16>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize,
                                    pn);
        break;
    case SL_DTYPE_BF16:
        launch_router<SL_DTYPE_BF16>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize,
                                     pn);
        break;
    case SL_DTYPE_Q8:
        launch_router<SL_DTYPE_Q8>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize, pn);
        break;
    default:
        if (q4x_ok(c, K, T))
            launch_router<SL_Q4X>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize, pn);
        else
            launch_router<SL_DTYPE_Q4>(c, ids, w, logits, x, wv, (int)E, (int)K, T, k, renormalize,
                                       pn);
        break;
    }
    CUDA_LAUNCHED(c);
}

/* -------------------------------------------------------------- embed */

__global__ void embed_kernel(float *__restrict__ y, cu_w w, const int32_t *__restrict__ ids,
                             int n) {
    cu_pdl_wait();
    const int t = blockIdx.y;
    const int64_t row = ids[t];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[(size_t)t * n + i] = cu_load_w(w, row, i);
}

void cu_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
              int32_t T) {
    if (sl_dtype_is_block(table->dtype)) {
        cu_blk_embed(be, y, table, ids, T);
        return;
    }
    if (sl_tensor_is_fp8(table)) {
        cu_fp8_embed(be, y, table, ids, T);
        return;
    }
    if (T <= 0) return;
    const cu_w w = cu_w_of(table);
    const int n = (int)table->shape[1];
    if (n <= 0) return;
    cu_ctx *c = cu_of(be);
    dim3 grid(cu_blocks((size_t)n, 256) < 64 ? cu_blocks((size_t)n, 256) : 64, (unsigned)T);
    cu_launch(embed_kernel, grid, 256, 0, c, y, w, ids, n);
    CUDA_LAUNCHED(c);
}
