/*
 * Hugging Face's block-wise FP8 on the GPU (the official Qwen3 / DeepSeek-V3 FP8 checkpoints):
 * an F8_E4M3 matrix [N, K] with F32 block scales (tensor.h, sl_tensor_is_fp8),
 *
 *   w[n][k] = fp8[n][k] * S[(rphase + n) / brows][k / group]
 *
 * decoded exactly (cuda_fp8.h's e4m3 -> half, then float: every e4m3 value, NaN included, is a
 * half) and multiplied by its scale rounded once (__fmul_rn: never fused with the product that
 * follows), so a widened weight has the bits of the CPU's sl_dequant_fp8_row. Products: one warp
 * per output row, lanes over k (4 consecutive bytes a lane where rows allow a word load), FMA
 * into one accumulator per lane, then warp_sum; only the order of the sum differs from the CPU.
 * matmul, matmul_batch (one product after another, each exactly as matmul alone), embed and the
 * fused routed experts (moe_experts: the same dot products, cu_silu_mul, weighted_sum's order)
 * all take the same dot, so the fused path gives matmul_batch's bits.
 */
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"

#define F8_WARPS 8 /* warps (rows) per block */

/* An FP8 matrix as the kernels see it. */
typedef struct f8w {
    const uint8_t *q; /* [N, K] codes */
    const float *s;   /* [ceil((rphase + N) / brows), ncb] scales */
    int64_t N, K, ncb;
    int32_t group, brows, rphase;
} f8w;

static f8w f8_of(const sl_tensor *t) {
    f8w w;
    w.q = (const uint8_t *)t->data;
    w.s = (const float *)t->scales;
    w.N = t->shape[0];
    w.K = t->shape[1];
    w.group = t->group;
    w.brows = t->brows;
    w.rphase = t->rphase;
    w.ncb = (w.K + w.group - 1) / w.group;
    return w;
}

__device__ __forceinline__ float f8_dec(uint32_t b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}

/* Weight k (code b) of a row with scale row s. */
__device__ __forceinline__ float f8_w(const float *s, int32_t group, int64_t k, uint32_t b) {
    return __fmul_rn(f8_dec(b), __ldg(s + k / group));
}

/* Row n of w dotted with x[0 .. K), by one warp; the sum in every lane. */
__device__ float f8_dot(const f8w &w, int64_t n, const float *__restrict__ x) {
    const int lane = threadIdx.x & 31;
    const uint8_t *q = w.q + (size_t)n * (size_t)w.K;
    const float *s = w.s + (size_t)((w.rphase + n) / w.brows) * (size_t)w.ncb;
    float acc = 0.0f;
    if ((w.K & 3) == 0 && ((uintptr_t)q & 3) == 0) {
        for (int64_t k = 4 * lane; k < w.K; k += 128) {
            const uint32_t v = __ldg((const uint32_t *)(q + k));
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc = fmaf(f8_w(s, w.group, k + j, (v >> (8 * j)) & 255u), x[k + j], acc);
        }
    } else {
        for (int64_t k = lane; k < w.K; k += 32)
            acc = fmaf(f8_w(s, w.group, k, __ldg(q + k)), x[k], acc);
    }
    return warp_sum(acc);
}

/* ---------------------------------------------------------------- matmul */

__global__ void f8_matmul_kernel(float *__restrict__ y, const float *__restrict__ x, f8w w,
                                 const void *bias, int bdt) {
    cu_pdl_wait();
    const int64_t n = (int64_t)blockIdx.x * F8_WARPS + (threadIdx.x >> 5);
    const int64_t t = blockIdx.y;
    if (n >= w.N) return;
    float v = f8_dot(w, n, x + (size_t)t * (size_t)w.K);
    if ((threadIdx.x & 31) == 0) {
        if (bias) v += cu_load_f(bias, bdt, (size_t)n);
        y[(size_t)t * (size_t)w.N + (size_t)n] = v;
    }
}

void cu_fp8_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T) {
    SL_ASSERT(w->ndim == 2 && sl_tensor_is_fp8(w) && w->group > 0 && w->brows > 0);
    cu_norm_flush(be); /* x may be a pending add_rmsnorm_next's y */
    const f8w fw = f8_of(w);
    if (T <= 0 || fw.N <= 0) return;
    SL_ASSERT(T <= 65535);
    cu_ctx *c = cu_of(be);
    const void *b = bias && bias->data ? bias->data : NULL;
    dim3 grid(cu_blocks((size_t)fw.N, F8_WARPS), (unsigned)T);
    cu_launch(f8_matmul_kernel, grid, F8_WARPS * 32, 0, c, y, x, fw, b, b ? (int)bias->dtype : 0);
    CUDA_LAUNCHED(c);
}

void cu_fp8_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        cu_matmul(be, y[i], x[i], w[i], NULL, T[i]);
}

/* ----------------------------------------------------------------- embed */

__global__ void f8_embed_kernel(float *__restrict__ y, f8w w, const int32_t *__restrict__ ids) {
    cu_pdl_wait();
    const int t = blockIdx.y;
    const int64_t row = ids[t];
    const uint8_t *q = w.q + (size_t)row * (size_t)w.K;
    const float *s = w.s + (size_t)((w.rphase + row) / w.brows) * (size_t)w.ncb;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < w.K;
         k += (int64_t)gridDim.x * blockDim.x)
        y[(size_t)t * (size_t)w.K + (size_t)k] = f8_w(s, w.group, k, __ldg(q + k));
}

void cu_fp8_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T) {
    const f8w fw = f8_of(table);
    if (T <= 0 || fw.K <= 0) return;
    cu_ctx *c = cu_of(be);
    const unsigned bx = cu_blocks((size_t)fw.K, 256);
    dim3 grid(bx < 64 ? bx : 64, (unsigned)T);
    cu_launch(f8_embed_kernel, grid, 256, 0, c, y, fw, ids);
    CUDA_LAUNCHED(c);
}

/* ----------------------------------------------------------- moe_experts */

/* Whether every pick of token t has its weights in the table (else the token is skipped). */
__device__ __forceinline__ bool f8_token_ready(const sl_expert_ptrs *table, const int32_t *ids,
                                               int64_t t, int k) {
    for (int r = 0; r < k; r++)
        if (!table[ids[t * k + r]].p[0]) return false;
    return true;
}

/* act[i][n] = silu(gate_e . x[t]) * (up_e . x[t]), i = t k + r, one warp per (n, i). */
__global__ void f8_gate_up_kernel(float *__restrict__ act, const float *__restrict__ x,
                                  const int32_t *__restrict__ ids,
                                  const sl_expert_ptrs *__restrict__ table, f8w g, f8w u, int k) {
    cu_pdl_wait();
    const int64_t n = (int64_t)blockIdx.x * F8_WARPS + (threadIdx.x >> 5);
    const int64_t i = blockIdx.y, t = i / k;
    if (n >= g.N || !f8_token_ready(table, ids, t, k)) return;
    const sl_expert_ptrs *e = &table[ids[i]];
    g.q = (const uint8_t *)e->p[0], g.s = (const float *)e->p[1];
    u.q = (const uint8_t *)e->p[3], u.s = (const float *)e->p[4];
    const float *xt = x + (size_t)t * (size_t)g.K;
    const float gv = f8_dot(g, n, xt), uv = f8_dot(u, n, xt);
    if ((threadIdx.x & 31) == 0) act[(size_t)i * (size_t)g.N + (size_t)n] = cu_silu_mul(gv, uv);
}

/* y[t][h] = sum over r < k (in order) of w[i] (down_e . act[i]), one warp per (h, t). */
__global__ void f8_down_kernel(float *__restrict__ y, const float *__restrict__ act,
                               const int32_t *__restrict__ ids, const float *__restrict__ wt,
                               const sl_expert_ptrs *__restrict__ table, f8w d, int k) {
    cu_pdl_wait();
    const int64_t h = (int64_t)blockIdx.x * F8_WARPS + (threadIdx.x >> 5);
    const int64_t t = blockIdx.y;
    if (h >= d.N || !f8_token_ready(table, ids, t, k)) return;
    float acc = 0.0f;
    for (int r = 0; r < k; r++) {
        const int64_t i = t * k + r;
        const sl_expert_ptrs *e = &table[ids[i]];
        d.q = (const uint8_t *)e->p[6], d.s = (const float *)e->p[7];
        const float v = f8_dot(d, h, act + (size_t)i * (size_t)d.K);
        acc += wt[i] * v; /* weighted_sum's expression */
    }
    if ((threadIdx.x & 31) == 0) y[(size_t)t * (size_t)d.N + (size_t)h] = acc;
}

int cu_fp8_moe_experts(const sl_backend *be, float *y, float *act, const float *x,
                       const int32_t *ids, const float *w, const sl_expert_ptrs *table,
                       const sl_tensor *const proto[3], int32_t T, int32_t k) {
    for (int j = 0; j < 3; j++)
        if (!sl_tensor_is_fp8(proto[j]) || proto[j]->ndim != 2 || proto[j]->rphase != 0 ||
            proto[j]->group <= 0 || proto[j]->brows <= 0)
            return 0;
    const f8w g = f8_of(proto[0]), u = f8_of(proto[1]), d = f8_of(proto[2]);
    if (u.N != g.N || u.K != g.K || d.N != g.K || d.K != g.N || k < 1 || (int64_t)T * k > 65535)
        return 0;
    if (T == 0) return 1;
    cu_norm_flush(be);
    cu_ctx *c = cu_of(be);
    dim3 g1(cu_blocks((size_t)g.N, F8_WARPS), (unsigned)(T * k));
    cu_launch(f8_gate_up_kernel, g1, F8_WARPS * 32, 0, c, act, x, ids, table, g, u, (int)k);
    CUDA_LAUNCHED(c);
    dim3 g2(cu_blocks((size_t)d.N, F8_WARPS), (unsigned)T);
    cu_launch(f8_down_kernel, g2, F8_WARPS * 32, 0, c, y, (const float *)act, ids, w, table, d,
              (int)k);
    CUDA_LAUNCHED(c);
    return 1;
}
