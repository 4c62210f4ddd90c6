/*
 * CUDA kernels for every op but matmul/embed: copies, element-wise ops, norms,
 * RoPE, attention, the causal conv and the gated delta rule. Each follows its
 * CPU op in cpu_ops.c (same formula, same float32 arithmetic); reductions are
 * trees instead of running sums, so results differ from the CPU in the last bits.
 */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_backend.h"

#define EW_THREADS 256

__device__ __forceinline__ float sigmoidf_(float x) {
    return 1.0f / (1.0f + expf(-x));
}

static unsigned ew_blocks(size_t n) {
    const unsigned b = cu_blocks(n, EW_THREADS);
    return b < 65536u ? b : 65536u; /* grid-stride beyond */
}

/* Threads per row-block for reductions over rows of n. */
static unsigned row_threads(int32_t n) {
    unsigned t = 32;
    while (t < 1024 && (int32_t)t < n)
        t <<= 1;
    return t > 256 ? 256 : t;
}

/* ------------------------------------------------------------ copies */

__global__ void copy2d_kernel(float *dst, size_t dst_ld, const float *src, size_t src_ld,
                              int32_t rows, int32_t cols) {
    cu_pdl_wait();
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)cols, c = i % (size_t)cols;
        dst[r * dst_ld + c] = src[r * src_ld + c];
    }
}

void cu_copy2d(const sl_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
               int32_t rows, int32_t cols) {
    if (rows <= 0 || cols <= 0 || (dst == src && dst_ld == src_ld)) return;
    cu_ctx *c = cu_of(be);
    const size_t n = (size_t)rows * (size_t)cols;
    const float *dend = dst + (size_t)(rows - 1) * dst_ld + (size_t)cols;
    const float *send = src + (size_t)(rows - 1) * src_ld + (size_t)cols;
    if (dst < send && src < dend) {
        /* Overlapping: through scratch, as if every source row were read first. */
        float *tmp = (float *)cu_scratch(be, n * sizeof(float));
        if (!tmp) return;
        cu_launch(copy2d_kernel, ew_blocks(n), EW_THREADS, 0, c, tmp, (size_t)cols, src, src_ld,
                  rows, cols);
        cu_launch(copy2d_kernel, ew_blocks(n), EW_THREADS, 0, c, dst, dst_ld, tmp, (size_t)cols,
                  rows, cols);
    } else {
        cu_launch(copy2d_kernel, ew_blocks(n), EW_THREADS, 0, c, dst, dst_ld, src, src_ld, rows,
                  cols);
    }
    CUDA_LAUNCHED(c);
}

__global__ void copy_rows_kernel(float *__restrict__ dst, const int32_t *__restrict__ dst_idx,
                                 const float *__restrict__ src, const int32_t *__restrict__ src_idx,
                                 int32_t cols) {
    cu_pdl_wait();
    const int32_t i = blockIdx.y;
    float *d = dst + (size_t)(dst_idx ? dst_idx[i] : i) * (size_t)cols;
    const float *sr = src + (size_t)(src_idx ? src_idx[i] : i) * (size_t)cols;
    for (int32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        d[c] = sr[c];
}

/* Rows of float4s (cols % 4 == 0, both sides 16-byte aligned), a warp a row: the scalar kernel
 * ran eight blocks of one float a thread per 2,048-float row (a prompt's 4,096 expert rows:
 * 32,768 blocks). */
__global__ void copy_rows4_kernel(float4 *__restrict__ dst, const int32_t *__restrict__ dst_idx,
                                  const float4 *__restrict__ src,
                                  const int32_t *__restrict__ src_idx, int32_t n, int32_t cols4) {
    cu_pdl_wait();
    const int32_t i = (int32_t)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
    if (i >= n) return;
    float4 *d = dst + (size_t)(dst_idx ? dst_idx[i] : i) * (size_t)cols4;
    const float4 *sr = src + (size_t)(src_idx ? src_idx[i] : i) * (size_t)cols4;
    for (int32_t c = threadIdx.x & 31; c < cols4; c += 32)
        d[c] = sr[c];
}

void cu_copy_rows(const sl_backend *be, float *dst, const int32_t *dst_idx, const float *src,
                  const int32_t *src_idx, int32_t n, int32_t cols) {
    cu_ctx *c = cu_of(be);
    if (n <= 0 || cols <= 0) return;
    if (cols % 4 == 0 && ((uintptr_t)dst & 15) == 0 && ((uintptr_t)src & 15) == 0) {
        cu_launch(copy_rows4_kernel, cu_blocks((size_t)n, EW_THREADS / 32), EW_THREADS, 0, c,
                  (float4 *)dst, dst_idx, (const float4 *)src, src_idx, n, cols / 4);
        CUDA_LAUNCHED(c);
        return;
    }
    unsigned bx = cu_blocks((size_t)cols, EW_THREADS);
    for (int32_t i0 = 0; i0 < n; i0 += 65535) { /* gridDim.y limit */
        const int32_t m = SL_MIN(65535, n - i0);
        dim3 grid(bx < 32 ? bx : 32, (unsigned)m);
        cu_launch(copy_rows_kernel, grid, EW_THREADS, 0, c, dst_idx ? dst : dst + (size_t)i0 * cols,
                  dst_idx ? dst_idx + i0 : NULL, src_idx ? src : src + (size_t)i0 * cols,
                  src_idx ? src_idx + i0 : NULL, cols);
    }
    CUDA_LAUNCHED(c);
}

__global__ void fill_kernel(float *dst, float v, size_t n) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = v;
}

void cu_fill(const sl_backend *be, float *dst, float v, size_t n) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(fill_kernel, ew_blocks(n), EW_THREADS, 0, c, dst, v, n);
    CUDA_LAUNCHED(c);
}

/* ------------------------------------------------------ element-wise */

__global__ void clamp_kernel(float *x, size_t n, float lo, float hi) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = fminf(fmaxf(x[i], lo), hi);
}

void cu_clamp(const sl_backend *be, float *x, size_t n, float lo, float hi) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(clamp_kernel, ew_blocks(n), EW_THREADS, 0, c, x, n, lo, hi);
    CUDA_LAUNCHED(c);
}

__global__ void scale_rows_kernel(float *__restrict__ y, const float *__restrict__ x,
                                  const float *__restrict__ s, int32_t rows, int32_t rep,
                                  int32_t n) {
    cu_pdl_wait();
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)n, c = i % (size_t)n;
        y[i] = s[r] * x[(r / (size_t)rep) * (size_t)n + c];
    }
}

void cu_scale_rows(const sl_backend *be, float *y, const float *x, const float *s, int32_t rows,
                   int32_t rep, int32_t n) {
    cu_ctx *c = cu_of(be);
    const size_t total = (size_t)rows * (size_t)n;
    if (rows <= 0 || n <= 0 || rep <= 0) return;
    cu_launch(scale_rows_kernel, ew_blocks(total), EW_THREADS, 0, c, y, x, s, rows, rep, n);
    CUDA_LAUNCHED(c);
}

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = cu_silu_mul(gate[i], up[i]);
    }
}

void cu_swiglu(const sl_backend *be, float *out, const float *gate, const float *up, size_t n) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(swiglu_kernel, ew_blocks(n), EW_THREADS, 0, c, out, gate, up, n);
    CUDA_LAUNCHED(c);
}

__global__ void swiglu_clamped_kernel(float *out, const float *gate, const float *up, size_t n,
                                      float alpha, float limit) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
        const float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
        out[i] = (u + 1.0f) * glu;
    }
}

void cu_swiglu_clamped(const sl_backend *be, float *out, const float *gate, const float *up,
                       size_t n, float alpha, float limit) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(swiglu_clamped_kernel, ew_blocks(n), EW_THREADS, 0, c, out, gate, up, n, alpha,
              limit);
    CUDA_LAUNCHED(c);
}

/* y[r][i] += b[i]: one thread per element of the rows x n block. */
__global__ void add_bias_kernel(float *y, const void *b, int bdt, size_t n, size_t total) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += cu_load_f(b, bdt, i % n);
}

void cu_add_bias(const sl_backend *be, float *y, const sl_tensor *b, int32_t rows) {
    cu_ctx *c = cu_of(be);
    const size_t n = (size_t)b->shape[0], total = n * (size_t)(rows > 0 ? rows : 0);
    if (!total) return;
    cu_launch(add_bias_kernel, ew_blocks(total), EW_THREADS, 0, c, y, b->data, (int)b->dtype, n,
              total);
    CUDA_LAUNCHED(c);
}

__global__ void axpy_kernel(float *y, float s, const float *x, size_t n) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += s * x[i];
}

void cu_axpy(const sl_backend *be, float *y, float s, const float *x, size_t n) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(axpy_kernel, ew_blocks(n), EW_THREADS, 0, c, y, s, x, n);
    CUDA_LAUNCHED(c);
}

__global__ void sigmoid_mul_kernel(float *y, const float *gate, size_t n) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] *= sigmoidf_(gate[i]);
}

void cu_sigmoid_mul(const sl_backend *be, float *y, const float *gate, size_t n) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(sigmoid_mul_kernel, ew_blocks(n), EW_THREADS, 0, c, y, gate, n);
    CUDA_LAUNCHED(c);
}

/* GELU-tanh as the CPU op spells it (cpu_ops.c act_of). */
__device__ __forceinline__ float gelu_tanhf_(float v) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    return 0.5f * v * (1.0f + tanhf(beta * (v + kappa * (v * v * v))));
}

__global__ void activate_kernel(float *y, const float *x, size_t n, float div, float mul, int act) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i] / div;
        if (act == SL_ACT_GELU_TANH) {
            y[i] = mul * gelu_tanhf_(v);
        } else if (act == SL_ACT_TANH) {
            y[i] = mul * tanhf(v);
        } else {
            const float sg = sigmoidf_(v);
            y[i] = mul * (act == SL_ACT_NONE ? v : act == SL_ACT_SIGMOID ? sg : v * sg);
        }
    }
}

/* act_mul for the activations other than SiLU (which runs swiglu_kernel, for its bits). */
__global__ void act_mul_kernel(float *out, const float *gate, const float *up, size_t n, int act) {
    cu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float a = act == SL_ACT_GELU_TANH ? gelu_tanhf_(g)
                        : act == SL_ACT_TANH    ? tanhf(g)
                        : act == SL_ACT_SIGMOID ? sigmoidf_(g)
                                                : g;
        out[i] = a * up[i];
    }
}

void cu_act_mul(const sl_backend *be, float *out, const float *gate, const float *up, size_t n,
                sl_act act) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    if (act == SL_ACT_SILU)
        cu_launch(swiglu_kernel, ew_blocks(n), EW_THREADS, 0, c, out, gate, up, n);
    else
        cu_launch(act_mul_kernel, ew_blocks(n), EW_THREADS, 0, c, out, gate, up, n, (int)act);
    CUDA_LAUNCHED(c);
}

void cu_activate(const sl_backend *be, float *y, const float *x, size_t n, float div, float mul,
                 sl_act act) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    cu_launch(activate_kernel, ew_blocks(n), EW_THREADS, 0, c, y, x, n, div, mul, (int)act);
    CUDA_LAUNCHED(c);
}

__global__ void weighted_sum_kernel(float *__restrict__ y, const float *__restrict__ x,
                                    const int32_t *__restrict__ rows, const float *__restrict__ w,
                                    int32_t T, int32_t k, int32_t n) {
    cu_pdl_wait();
    const size_t total = (size_t)T * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)n, c = i % (size_t)n;
        float acc = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            const size_t tr = t * (size_t)k + (size_t)r;
            acc += w[tr] * x[(rows ? (size_t)rows[tr] : tr) * (size_t)n + c];
        }
        y[i] = acc;
    }
}

void cu_weighted_sum(const sl_backend *be, float *y, const float *x, const int32_t *rows,
                     const float *w, int32_t T, int32_t k, int32_t n) {
    cu_ctx *c = cu_of(be);
    const size_t total = (size_t)T * (size_t)n;
    if (T <= 0 || n <= 0) return;
    cu_launch(weighted_sum_kernel, ew_blocks(total), EW_THREADS, 0, c, y, x, rows, w, T, k, n);
    CUDA_LAUNCHED(c);
}

__global__ void hc_inject_kernel(float *__restrict__ w, const float *__restrict__ out,
                                 const float *__restrict__ inj, int32_t T, int32_t hc, int32_t n) {
    cu_pdl_wait();
    const size_t total = (size_t)T * (size_t)hc * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t tc = i / (size_t)n, c = i % (size_t)n, t = tc / (size_t)hc;
        w[i] += inj[tc] * out[t * (size_t)n + c];
    }
}

void cu_hc_inject(const sl_backend *be, float *w, const float *out, const float *inj, int32_t T,
                  int32_t hc, int32_t n) {
    cu_ctx *c = cu_of(be);
    const size_t total = (size_t)T * (size_t)hc * (size_t)n;
    if (T <= 0 || hc <= 0 || n <= 0) return;
    cu_launch(hc_inject_kernel, ew_blocks(total), EW_THREADS, 0, c, w, out, inj, T, hc, n);
    CUDA_LAUNCHED(c);
}

__global__ void hc_mix_kernel(float *__restrict__ y, const float *__restrict__ w,
                              const float *__restrict__ x, int32_t T, int32_t hc, int32_t n) {
    cu_pdl_wait();
    const size_t total = (size_t)T * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)n, c = i % (size_t)n;
        const size_t base = t * (size_t)hc * (size_t)n + c;
        float acc = 0.0f;
        for (int32_t h = 0; h < hc; h++)
            acc += w[base + (size_t)h * n] * x[base + (size_t)h * n];
        y[i] = acc / (float)hc;
    }
}

void cu_hc_mix(const sl_backend *be, float *y, const float *w, const float *x, int32_t T,
               int32_t hc, int32_t n) {
    cu_ctx *c = cu_of(be);
    const size_t total = (size_t)T * (size_t)n;
    if (T <= 0 || n <= 0) return;
    cu_launch(hc_mix_kernel, ew_blocks(total), EW_THREADS, 0, c, y, w, x, T, hc, n);
    CUDA_LAUNCHED(c);
}

/* ------------------------------------------------------------- norms */

/* One block per row; y may alias x (each thread reads its elements before writing them). */
__global__ void rmsnorm_kernel(float *y, const float *x, const void *w, int wdt, int32_t n,
                               float eps, float w_offset) {
    cu_pdl_wait();
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (xr[i] * inv) * (w_offset + cu_load_f(w, wdt, (size_t)i));
}

void cu_rmsnorm(const sl_backend *be, float *y, const float *x, const sl_tensor *w, int32_t rows,
                int32_t n, float eps, float w_offset) {
    cu_ctx *c = cu_of(be);
    if (rows <= 0 || n <= 0) return;
    cu_launch(rmsnorm_kernel, (unsigned)rows, row_threads(n), 0, c, y, x, w->data, (int)w->dtype, n,
              eps, w_offset);
    CUDA_LAUNCHED(c);
}

/*
 * x += d (the axpy op's x + 1 * d), then the rmsnorm kernel's formula, a block per row. A
 * thread keeps its ADD_NORM_V elements in registers, so every load is issued up front and
 * nothing is read twice (rows up to 1024 ADD_NORM_V).
 */
#define ADD_NORM_V 8

/* x_out = x + d (x_out may be x: each thread reads its elements before writing them), then
 * y = rmsnorm(x_out); a row a block, ADD_NORM_V elements a thread held in registers. */
__global__ void __launch_bounds__(1024)
    add_rmsnorm_kernel(float *__restrict__ y, float *xo, const float *x,
                       const float *__restrict__ d, const void *__restrict__ w, int wdt, int32_t n,
                       float eps, float w_offset) {
    float wv[ADD_NORM_V]; /* the weights come from no earlier kernel: read before the wait */
#pragma unroll
    for (int j = 0; j < ADD_NORM_V; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        wv[j] = i < n ? cu_load_f(w, wdt, (size_t)i) : 0.0f;
    }
    cu_pdl_wait();
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *xor_ = xo + (size_t)blockIdx.x * n;
    const float *dr = d + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float v[ADD_NORM_V], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < ADD_NORM_V; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        v[j] = i < n ? xr[i] + 1.0f * dr[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < ADD_NORM_V; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < n) xor_[i] = v[j];
        ss += v[j] * v[j];
    }
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
    for (int j = 0; j < ADD_NORM_V; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < n) yr[i] = (v[j] * inv) * (w_offset + wv[j]);
    }
}

/* x_out may be x (add_rmsnorm) or another buffer (add_rmsnorm_next). */
static void add_rmsnorm_to(const sl_backend *be, float *y, float *xo, const float *x,
                           const float *d, const void *w, int wdt, int32_t rows, int32_t n,
                           float eps, float w_offset) {
    if (rows <= 0 || n <= 0) return;
    cu_ctx *c = cu_of(be);
    const unsigned th = (unsigned)((n + ADD_NORM_V * 32 - 1) / (ADD_NORM_V * 32) * 32);
    cu_launch(add_rmsnorm_kernel, (unsigned)rows, th, 0, c, y, xo, x, d, w, wdt, n, eps, w_offset);
    CUDA_LAUNCHED(c);
}

void cu_add_rmsnorm(const sl_backend *be, float *y, float *x, const float *d, const sl_tensor *w,
                    int32_t rows, int32_t n, float eps, float w_offset) {
    if (rows <= 0 || n <= 0) return;
    if (n <= 1024 * ADD_NORM_V) {
        add_rmsnorm_to(be, y, x, x, d, w->data, (int)w->dtype, rows, n, eps, w_offset);
    } else { /* wider rows: the two ops */
        cu_axpy(be, x, 1.0f, d, (size_t)rows * (size_t)n);
        cu_rmsnorm(be, y, x, w, rows, n, eps, w_offset);
    }
}

void cu_norm_flush(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    if (!c->pend.x) return;
    const cu_prenorm p = c->pend;
    c->pend.x = NULL;
    add_rmsnorm_to(be, p.y, p.x_out, p.x, p.d, p.w, p.wdt, 1, p.n, p.eps, p.w_offset);
}

cu_prenorm cu_norm_take(const sl_backend *be, const float *x, int32_t T, int64_t K, int ok) {
    cu_ctx *c = cu_of(be);
    cu_prenorm p = {};
    if (!c->pend.x) return p;
    if (ok && T == 1 && x == c->pend.y && K == c->pend.n) {
        p = c->pend;
        c->pend.x = NULL;
        return p;
    }
    cu_norm_flush(be);
    return p;
}

void cu_add_rmsnorm_next(const sl_backend *be, float *y, float *x_out, const float *x,
                         const float *d, const sl_tensor *w, int32_t rows, int32_t n, float eps,
                         float w_offset) {
    cu_ctx *c = cu_of(be);
    cu_norm_flush(be);
    if (rows <= 0 || n <= 0) return;
    /* one row, float4-aligned: the GEMV stages it 16 bytes at a time */
    const int defer = rows == 1 && n % 4 == 0 && n <= 1024 * ADD_NORM_V &&
                      !(((uintptr_t)y | (uintptr_t)x_out | (uintptr_t)x | (uintptr_t)d) & 15);
    if (defer) {
        c->pend = cu_prenorm{x, d, x_out, y, w->data, (int)w->dtype, n, eps, w_offset};
    } else if (n <= 1024 * ADD_NORM_V) {
        add_rmsnorm_to(be, y, x_out, x, d, w->data, (int)w->dtype, rows, n, eps, w_offset);
    } else { /* wider rows: add_rmsnorm in place on a copy of x */
        cu_copy(c, x_out, x, (size_t)rows * n * sizeof(float), cudaMemcpyDeviceToDevice);
        cu_add_rmsnorm(be, y, x_out, d, w, rows, n, eps, w_offset);
    }
}

__global__ void gated_rmsnorm_kernel(float *y, const float *x, const float *z, const void *w,
                                     int wdt, int32_t n, float eps, int gate) {
    cu_pdl_wait();
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n, *zr = z + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float zi = zr[i], sg = sigmoidf_(zi);
        yr[i] =
            cu_load_f(w, wdt, (size_t)i) * (xr[i] * inv) * (gate == SL_ACT_SIGMOID ? sg : zi * sg);
    }
}

void cu_gated_rmsnorm(const sl_backend *be, float *y, const float *x, const float *z,
                      const sl_tensor *w, int32_t rows, int32_t n, float eps, sl_act gate) {
    cu_ctx *c = cu_of(be);
    if (rows <= 0 || n <= 0) return;
    cu_launch(gated_rmsnorm_kernel, (unsigned)rows, row_threads(n), 0, c, y, x, z, w->data,
              (int)w->dtype, n, eps, (int)gate);
    CUDA_LAUNCHED(c);
}

__global__ void l2norm_kernel(float *x, int32_t n, float eps) {
    cu_pdl_wait();
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] *= inv;
}

void cu_l2norm(const sl_backend *be, float *x, int32_t rows, int32_t n, float eps) {
    cu_ctx *c = cu_of(be);
    if (rows <= 0 || n <= 0) return;
    cu_launch(l2norm_kernel, (unsigned)rows, row_threads(n), 0, c, x, n, eps);
    CUDA_LAUNCHED(c);
}

/* -------------------------------------------------------------- rope */

__global__ void rope_kernel(float *x, int32_t T, int32_t n_heads, int32_t head_dim, int32_t half,
                            int32_t pos0, const int32_t *dpos, const float *cos_tab,
                            const float *sin_tab) {
    if (dpos) pos0 = *dpos; /* a graph step's (cu_dyn): set before the step's first kernel */
    cu_pdl_wait();
    const size_t total = (size_t)T * (size_t)n_heads * (size_t)half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t th = i / (size_t)half, d = i % (size_t)half, t = th / (size_t)n_heads;
        const size_t tab = (size_t)(pos0 + (int32_t)t) * (size_t)half + d;
        const float c = cos_tab[tab], s = sin_tab[tab];
        float *v = x + th * (size_t)head_dim;
        const float a = v[d], b = v[d + half];
        v[d] = a * c - b * s;
        v[d + half] = b * c + a * s;
    }
}

void cu_rope(const sl_backend *be, float *x, int32_t T, int32_t n_heads, int32_t head_dim,
             int32_t rot_dim, int32_t pos0, const float *cos_tab, const float *sin_tab) {
    cu_ctx *c = cu_of(be);
    const int32_t half = rot_dim / 2;
    const size_t total = (size_t)T * (size_t)n_heads * (size_t)half;
    if (!total) return;
    const int32_t *dpos = cu_dyn(c, &pos0);
    cu_launch(rope_kernel, ew_blocks(total), EW_THREADS, 0, c, x, T, n_heads, head_dim, half, pos0,
              dpos, cos_tab, sin_tab);
    CUDA_LAUNCHED(c);
}

/*
 * qkv_prep, a block per head row of one token: the n_heads query rows, then the n_kv key rows
 * (also stored in the cache), then the n_kv value rows (only stored). A row is staged in shared
 * memory, normed (the rmsnorm kernel's formula) and roped (the rope kernel's).
 */
typedef struct qkv_params {
    float *q, *k;
    const float *v;
    float *kc, *vc;
    const void *qn, *kn;
    const int32_t *dpos; /* pos0 in device memory in a graph step (cu_dyn), else NULL */
    const float *cos_tab, *sin_tab;
    int qn_dt, kn_dt;
    int32_t pos0, n_heads, n_kv, hd, half;
    int inter; /* RoPE on interleaved pairs (2i, 2i + 1) */
    float eps, w_offset;
    float tfloor, tscale; /* q's temperature (tfloor 0: none) */
} qkv_params;
static_assert(sizeof(qkv_params) == 10 * 8 + 12 * 4, "qkv_params without padding");

/* The temperature factor of a query at position p (sl_qkv_args), 1 without one. */
__device__ __forceinline__ float cu_attn_temp(const qkv_params &a, int32_t p) {
    if (a.tfloor <= 0.0f) return 1.0f;
    const float x = floorf(__fdiv_rn(__fadd_rn((float)p, 1.0f), a.tfloor));
    return __fadd_rn(__fmul_rn(log1pf(x), a.tscale), 1.0f);
}

/* Pair member i of a roped row (i < 2 half) from row r and its factors c[d], s[d] of pair d:
 * NeoX pairs (i, i + half), or interleaved ones (2d, 2d + 1). */
__device__ __forceinline__ int cu_rope_pair(int i, int half, int inter) {
    return inter ? i >> 1 : (i < half ? i : i - half);
}
__device__ __forceinline__ float cu_rope_elem(const float *r, int i, int half, int inter, float c,
                                              float s) {
    const bool first = inter ? !(i & 1) : i < half;
    const int o = inter ? (first ? i + 1 : i - 1) : (first ? i + half : i - half);
    return first ? __fmaf_rn(r[i], c, -__fmul_rn(r[o], s)) : __fmaf_rn(r[i], c, __fmul_rn(r[o], s));
}

/*
 * One head's row of qkv_prep: x (global) RMSNormed with nw (NULL: none) into row (shared), then
 * RoPE on the first 2 half dims (NeoX, or interleaved pairs with inter) and times mul (q's
 * temperature; 1 is exact) from row into out (global or shared, not row) and, when given, cache.
 * Threads below rt take part (rt >= 32; every thread of the block calls it). The qkv_prep kernel
 * and the attention kernel that fuses it (attn_kernel<W, true>) both run this, so they give the
 * same bits; roundings spelled out (no contraction left to the compiler).
 */
__device__ void cu_qk_prep(float *out, float *row, float *cache, const float *x, const void *nw,
                           int ndt, int hd, int rt, int half, int inter, float mul, float eps,
                           float w_offset, const float *c, const float *s, float *sh) {
    const int tid = threadIdx.x;
    float ss = 0.0f;
    if (tid < rt)
        for (int i = tid; i < hd; i += rt) {
            const float v = x[i];
            row[i] = v;
            ss = __fmaf_rn(v, v, ss);
        }
    if (nw) {
        ss = block_reduce<false>(ss, sh); /* also orders the row writes before the reads */
        const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
        if (tid < rt)
            for (int i = tid; i < hd; i += rt)
                row[i] =
                    __fmul_rn(__fmul_rn(row[i], inv), w_offset + cu_load_f(nw, ndt, (size_t)i));
    }
    __syncthreads();
    if (tid < rt)
        for (int i = tid; i < hd; i += rt) {
            float v = row[i];
            if (i < 2 * half) {
                const int d = cu_rope_pair(i, half, inter);
                v = cu_rope_elem(row, i, half, inter, c[d], s[d]);
            }
            v = __fmul_rn(v, mul);
            out[i] = v;
            if (cache) cache[i] = v;
        }
    __syncthreads(); /* row may be reused, out read by others */
}

/*
 * What cu_qk_prep does, for a row of q and (k != NULL) a row of k at once, one element a thread
 * (hd <= blockDim.x), with the thread's norm weights (wq, wk) and rope factors (c, s) loaded
 * before the kernel's wait: the same arithmetic, so the same bits, one block reduction for both
 * sums of squares and no load of a weight or a factor after the wait. Rows rq, rk (shared),
 * outputs oq, ok (shared), ck: k's cache row (NULL: none), sh: shared [2][32] for the
 * reduction (block_reduce_n).
 */
__device__ void cu_qk_prep_pair(float *oq, float *rq, const float *q, float wq, float *ok,
                                float *rk, float *ck, const float *k, float wk, bool qnorm,
                                bool knorm, int hd, int half, int inter, float qmul, float eps,
                                float w_offset, float c, float s, float (*sh)[32]) {
    const int i = threadIdx.x;
    float sq = 0.0f, sk = 0.0f;
    if (i < hd) {
        const float v = q[i];
        rq[i] = v, sq = __fmaf_rn(v, v, 0.0f);
        if (k) {
            const float u = k[i];
            rk[i] = u, sk = __fmaf_rn(u, u, 0.0f);
        }
    }
    if (qnorm || (k && knorm)) { /* also orders the row writes */
        float ss[2] = {sq, sk};
        block_reduce_n<false, 2>(ss, sh);
        sq = ss[0], sk = ss[1];
    }
    if (i < hd) {
        if (qnorm)
            rq[i] = __fmul_rn(__fmul_rn(rq[i], 1.0f / sqrtf(sq / (float)hd + eps)), w_offset + wq);
        if (k && knorm)
            rk[i] = __fmul_rn(__fmul_rn(rk[i], 1.0f / sqrtf(sk / (float)hd + eps)), w_offset + wk);
    }
    __syncthreads();
    if (i < hd) {
        float v = rq[i], u = k ? rk[i] : 0.0f;
        if (i < 2 * half) {
            v = cu_rope_elem(rq, i, half, inter, c, s);
            if (k) u = cu_rope_elem(rk, i, half, inter, c, s);
        }
        oq[i] = __fmul_rn(v, qmul);
        if (k) {
            ok[i] = u;
            if (ck) ck[i] = u;
        }
    }
    __syncthreads();
}

__global__ void qkv_prep_kernel(qkv_params a) {
    const int32_t pos0 = a.dpos ? *a.dpos : a.pos0; /* set before the step's first kernel */
    cu_pdl_wait();
    extern __shared__ float row[]; /* [hd] */
    __shared__ float sh[32];
    const int per_t = a.n_heads + 2 * a.n_kv, j = blockIdx.x % per_t, hd = a.hd;
    const size_t t = blockIdx.x / per_t, kv_row = (size_t)a.n_kv * hd;
    if (j >= a.n_heads + a.n_kv) { /* a value row: only stored */
        const int h = j - a.n_heads - a.n_kv;
        const float *src = a.v + t * kv_row + (size_t)h * hd;
        float *dst = a.vc + (size_t)(pos0 + t) * kv_row + (size_t)h * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            dst[i] = src[i];
        return;
    }
    const float *c = a.cos_tab + (size_t)(pos0 + t) * a.half;
    const float *s = a.sin_tab + (size_t)(pos0 + t) * a.half;
    if (j < a.n_heads) {
        float *x = a.q + (t * a.n_heads + j) * hd;
        cu_qk_prep(x, row, NULL, x, a.qn, a.qn_dt, hd, blockDim.x, a.half, a.inter,
                   cu_attn_temp(a, pos0 + (int32_t)t), a.eps, a.w_offset, c, s, sh);
    } else {
        const int h = j - a.n_heads;
        float *x = a.k + t * kv_row + (size_t)h * hd;
        float *cache = a.kc + (size_t)(pos0 + t) * kv_row + (size_t)h * hd;
        cu_qk_prep(x, row, cache, x, a.kn, a.kn_dt, hd, blockDim.x, a.half, a.inter, 1.0f, a.eps,
                   a.w_offset, c, s, sh);
    }
}

/* The launch's position in device memory in a graph step (cu_dyn). */
static qkv_params qkv_params_of(cu_ctx *c, const sl_qkv_args *args) {
    qkv_params a;
    memset(&a, 0, sizeof a);
    a.q = args->q, a.k = args->k, a.v = args->v, a.kc = args->kc, a.vc = args->vc;
    a.qn = args->q_norm ? args->q_norm->data : NULL;
    a.kn = args->k_norm ? args->k_norm->data : NULL;
    a.qn_dt = args->q_norm ? (int)args->q_norm->dtype : 0;
    a.kn_dt = args->k_norm ? (int)args->k_norm->dtype : 0;
    a.pos0 = args->pos0, a.n_heads = args->n_heads, a.n_kv = args->n_kv_heads;
    a.dpos = cu_dyn(c, &a.pos0);
    a.hd = args->head_dim, a.half = args->rot_dim / 2;
    a.eps = args->eps, a.w_offset = args->w_offset;
    a.cos_tab = args->cos_tab, a.sin_tab = args->sin_tab;
    a.inter = args->rope_interleaved != 0;
    a.tfloor = args->temp_floor, a.tscale = args->temp_scale;
    return a;
}

void cu_qkv_prep(const sl_backend *be, const sl_qkv_args *args) {
    cu_ctx *c = cu_of(be);
    const int32_t per_t = args->n_heads + 2 * args->n_kv_heads;
    if (args->T <= 0 || per_t <= 0) return;
    const qkv_params a = qkv_params_of(c, args);
    cu_launch(qkv_prep_kernel, (unsigned)(args->T * per_t), row_threads(args->head_dim),
              (size_t)args->head_dim * sizeof(float), c, a);
    CUDA_LAUNCHED(c);
}

/* --------------------------------------------------------- attention */

/*
 * Decode, selections, and the reference of the tiled prompt kernel below (which takes prompts
 * from ATT_TILE_MIN_T tokens on): one block per (query t, head h, split of the keys). Keys
 * j0 .. j1-1 of the query's list (0 .. pos0+t, or its QSA selection) are scored by groups of 8
 * lanes into shared memory, softmaxed with the split's own max, and folded into the output by
 * (dim, key-slice) threads:
 *
 *   splits == 1:  out = sum_j p_j v_j / sum_j p_j           (written directly)
 *   splits  > 1:  part[item][split] = {o[0..hd), m, l}, merged by the item's last split
 *                 to finish (counted in counts[item]), or by attn_combine when there are
 *                 more items than counters
 *
 * Splitting the keys keeps every SM busy when decode has few (t, h) items.
 */
#define ATT_THREADS 256
#define ATT_MAX_L   4096 /* keys per split: scores and row ids fit in 32 KiB */

typedef struct att_params {
    float *out;
    const float *q, *kc, *vc;
    const int32_t *sel, *n_sel;
    const int32_t *dpos; /* decode: pos0 in device memory in a graph step (cu_dyn), else NULL */
    const void *sinks;   /* [n_heads] a sink logit per head (sl_attn_args.sinks), or NULL */
    float *part;
    unsigned *counts; /* [items] zero between launches, or NULL: attn_combine merges */
    int32_t T, pos0, n_heads, n_kv, hd, sel_stride, splits;
    int32_t window; /* sliding window (0: none): query t's keys start at att_first */
    int32_t chunk;  /* chunked local attention (0: none): likewise */
    int sinks_dt;
    float scale;
    int spare;
    qkv_params prep; /* attn_kernel<W, true>: the qkv_prep it does first (T = 1) */
} att_params;
static_assert(sizeof(att_params) == 10 * 8 + 12 * 4 + sizeof(qkv_params),
              "att_params without padding");

/* Keys a split of a decode-kernel launch (attn_kernel) takes: the most keys a query of it has
 * (pos0 + T, at most a window or a chunk), over its splits. */
__host__ __device__ __forceinline__ int32_t att_split_len(int32_t pos0, int32_t T, int32_t window,
                                                          int32_t chunk, int32_t splits) {
    int32_t m = pos0 + T;
    if (window > 0 && window < m) m = window;
    if (chunk > 0 && chunk < m) m = chunk;
    return (m + splits - 1) / splits;
}

/* The first cache row query t, at p = pos0 + t, sees (not with a selection): p + 1 - window
 * with a sliding window, its chunk's first, p - p % chunk, with chunked attention, else 0. Its
 * keys are rows att_first .. p. */
__device__ __forceinline__ int att_first(const att_params &a, int pos0, int t) {
    if (a.sel) return 0;
    const int p = pos0 + t;
    int f = a.window > 0 ? max(0, p + 1 - a.window) : 0;
    if (a.chunk > 0) f = max(f, p - p % a.chunk);
    return f;
}

/* out of one item from its splits' partial sums (parts read through L2: other blocks wrote
 * them), by the calling block's threads over the dims; the head's sink logit joins the
 * denominator here. */
__device__ void attn_merge(const att_params &a, int item) {
    const int hd = a.hd;
    const int t = item / a.n_heads, h = item % a.n_heads;
    const float *p = a.part + (size_t)item * a.splits * (size_t)(hd + 2);
    /* Every split's part is written (an empty one with l = 0), so the loads below are taken
     * whatever they hold and only the sums are conditional: a loop's loads then go out together
     * instead of one L2 round trip after another; the sums keep their order. */
    float M = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < a.splits; s++) {
        const float l = __ldcg(p + (size_t)s * (hd + 2) + hd + 1);
        const float m = __ldcg(p + (size_t)s * (hd + 2) + hd);
        if (l > 0.0f) M = fmaxf(M, m);
    }
    const float sink = a.sinks ? cu_load_f(a.sinks, a.sinks_dt, (size_t)h) : -INFINITY;
    M = fmaxf(M, sink);
    float L = a.sinks ? expf(sink - M) : 0.0f;
#pragma unroll 8
    for (int s = 0; s < a.splits; s++) {
        const float *ps = p + (size_t)s * (hd + 2);
        const float l = __ldcg(ps + hd + 1), m = __ldcg(ps + hd);
        if (l > 0.0f) L += l * expf(m - M);
    }
    float *out = a.out + ((size_t)t * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (int s = 0; s < a.splits; s++) {
            const float *ps = p + (size_t)s * (hd + 2);
            const float l = __ldcg(ps + hd + 1), m = __ldcg(ps + hd), v = __ldcg(ps + d);
            if (l > 0.0f) o += v * expf(m - M);
        }
        out[d] = L > 0.0f ? o / L : 0.0f;
    }
}

/* Attention's reads of q, k and v rows: W = 4 floats at a time when every row is 16-byte aligned
 * (head_dim % 4 == 0, aligned buffers), else 1. */
template <int W> struct att_vec { typedef float4 T; };
template <> struct att_vec<1> { typedef float T; };
__device__ __forceinline__ float att_dot(float a, float b) {
    return a * b;
}
__device__ __forceinline__ float att_dot(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ void att_axpy(float &y, float p, float v) {
    y += p * v;
}
__device__ __forceinline__ void att_axpy(float4 &y, float p, float4 v) {
    y.x += p * v.x, y.y += p * v.y, y.z += p * v.z, y.w += p * v.w;
}
__device__ __forceinline__ float att_comp(float v, int) {
    return v;
}
__device__ __forceinline__ float att_comp(float4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

#define ATT_KEY_LANES 8 /* lanes that score one key together */

/* Before the wait: the cache rows j0 .. of query t's keys (those of earlier tokens are final;
 * those the previous kernel writes are prefetched for nothing, never read stale: L2 is where
 * the writes land), asked of L2 so that the scores' and the output's reads after the wait are L2
 * hits, not two DRAM round trips (the rows of other layers' weights evict them between tokens). */
__device__ __forceinline__ void att_l2_prefetch(const att_params &a, int pos0, int L, int t,
                                                int kvh, int j0) {
    j0 += att_first(a, pos0, t); /* a list index: the rows start at the window's first */
    const int j1 = min(j0 + L, pos0 + t + 1), lines = (a.hd * 4 + 127) / 128;
    const size_t kv_stride = (size_t)a.n_kv * a.hd;
    for (int q = threadIdx.x; q < 2 * lines * (j1 - j0); q += blockDim.x) {
        const int j = j0 + q / (2 * lines), m = q % (2 * lines);
        const float *row = (m < lines ? a.kc : a.vc) + (size_t)j * kv_stride + (size_t)kvh * a.hd;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (m % lines) * 32));
    }
}

/*
 * PREP (decode, T = 1, no selection): the kernel also does the qkv_prep of the token (cu_qk_prep,
 * so the same bits): each block prepares its head's q, and the blocks whose split holds the new
 * position its key, which they read from shared memory and its value from the raw row instead
 * of the cache rows; the group's first head stores both in the caches (no block reads them
 * there in this launch). q and k are left as they came. One launch instead of two at ~2.25 us
 * plus a gap each.
 */
template <int W, bool PREP>
__global__ void __launch_bounds__(ATT_THREADS) attn_kernel(att_params a) {
    typedef typename att_vec<W>::T V;
    const int item = blockIdx.x, split = blockIdx.y, group = a.n_heads / a.n_kv;
    /* a graph step's position (cu_dyn) is set before the step's first kernel */
    const int pos0 = a.dpos ? *a.dpos : a.pos0;
    const int L = att_split_len(pos0, a.T, a.window, a.chunk, a.splits);
    const int t = item / a.n_heads, h = item % a.n_heads, kvh = h / group, j0 = split * L;
    /* PREP: the thread's norm weights and rope factors do not depend on the previous kernel (nor
     * does whether the block's split holds the new key, with no selection): loaded first */
    float wq = 0.0f, wk = 0.0f, rc = 0.0f, rs = 0.0f;
    bool has_key = false;
    const int first = att_first(a, pos0, t); /* keys are rows first + list index */
    if (PREP) {
        const qkv_params &p = a.prep;
        const int i = threadIdx.x;
        has_key = j0 <= pos0 - first && pos0 - first < j0 + L;
        if (i < a.hd) {
            if (p.qn) wq = cu_load_f(p.qn, p.qn_dt, (size_t)i);
            if (p.kn && has_key) wk = cu_load_f(p.kn, p.kn_dt, (size_t)i);
            if (i < 2 * p.half) {
                const size_t d = (size_t)pos0 * p.half + cu_rope_pair(i, p.half, p.inter);
                rc = p.cos_tab[d], rs = p.sin_tab[d];
            }
        }
    }
    /* a selection may come from the previous kernel: read after the wait; a group's first head
     * only (its others read the same rows) */
    if (!a.sel && h % group == 0) att_l2_prefetch(a, pos0, L, t, kvh, j0);
    cu_pdl_wait();
    extern __shared__ __align__(16) float smem[];
    V *so = (V *)smem;                     /* [ATT_THREADS] partial outputs */
    float *sq = smem + W * ATT_THREADS;    /* [hd] */
    float *sk = sq + a.hd;                 /* PREP: [hd] the new key, [2 hd] two rows */
    float *sh = PREP ? sk + 3 * a.hd : sk; /* [32] reductions (PREP: [2][32]) */
    float *sc = sh + (PREP ? 64 : 32);     /* [L] scores, then probabilities */
    int32_t *rows = (int32_t *)(sc + L);   /* [L] cache rows */
    const int hd = a.hd, hv = hd / W, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t q_stride = (size_t)a.n_heads * hd, kv_stride = (size_t)a.n_kv * hd;
    const int32_t *sel = a.sel ? a.sel + (size_t)t * a.sel_stride : NULL;
    const int n_keys = sel ? a.n_sel[t] : pos0 + t + 1 - first;
    const int j1 = min(j0 + L, n_keys), nj = max(j1 - j0, 0);
    const float *q = a.q + (size_t)t * q_stride + (size_t)h * hd;
    const int newj = PREP ? pos0 : -1; /* the cache row read from sk / the raw v instead */
    const float *vnew = PREP ? a.prep.v + (size_t)kvh * hd : nullptr;
    if (PREP) { /* has_key is block-uniform, and j0 <= newj < j1 (newj < n_keys) */
        const qkv_params &p = a.prep;
        const bool store = has_key && h % group == 0;
        float *kc = p.kc + (size_t)pos0 * kv_stride + (size_t)kvh * hd;
        cu_qk_prep_pair(sq, sk + hd, q, wq, sk, sk + 2 * hd, store ? kc : NULL,
                        has_key ? p.k + (size_t)kvh * hd : NULL, wk, p.qn != NULL, p.kn != NULL, hd,
                        p.half, p.inter, cu_attn_temp(p, pos0), p.eps, p.w_offset, rc, rs,
                        (float(*)[32])sh);
        if (store)
            for (int d = tid; d < hd; d += ATT_THREADS)
                p.vc[(size_t)pos0 * kv_stride + (size_t)kvh * hd + d] = vnew[d];
    } else {
        for (int d = tid; d < hd; d += ATT_THREADS)
            sq[d] = q[d];
    }
    for (int j = tid; j < nj; j += ATT_THREADS)
        rows[j] = sel ? sel[j0 + j] : first + j0 + j;
    __syncthreads();

    /* Scores: ATT_KEY_LANES lanes per key, lane g summing vectors g, g + 8, ... of q.k (the 8
     * lanes read whole 32-byte sectors), so a warp scores 4 keys at once and the block 32, with
     * several loads in flight per lane (a warp per key, as before, waited on memory once per
     * key: 12 us for 48 keys at Qwen3 shapes). A warp's loop bounds are the same for all its
     * lanes, so the shuffles have them all. */
    const V *qv = (const V *)sq;
    const int g = lane % ATT_KEY_LANES;
    float mx = -INFINITY;
    for (int jb = warp * (32 / ATT_KEY_LANES); jb < nj; jb += ATT_THREADS / ATT_KEY_LANES) {
        const int j = jb + lane / ATT_KEY_LANES;
        float s = 0.0f;
        if (j < nj) {
            const V *k = PREP && rows[j] == newj
                             ? (const V *)sk
                             : (const V *)(a.kc + (size_t)rows[j] * kv_stride + (size_t)kvh * hd);
#pragma unroll 4
            for (int d = g; d < hv; d += ATT_KEY_LANES)
                s += att_dot(qv[d], k[d]);
        }
        for (int o = ATT_KEY_LANES / 2; o > 0; o /= 2)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= a.scale;
        if (j < nj) {
            if (g == 0) sc[j] = s;
            mx = fmaxf(mx, s);
        }
    }
    mx = block_reduce<true>(mx, sh); /* also orders the sc writes before the reads below */
    /* one split: the sink joins the max and the sum here (several: attn_merge does) */
    const float sink = a.sinks && !a.part ? cu_load_f(a.sinks, a.sinks_dt, (size_t)h) : -INFINITY;
    mx = fmaxf(mx, sink);
    float sum = 0.0f;
    for (int j = tid; j < nj; j += ATT_THREADS) {
        const float p = expf(sc[j] - mx);
        sc[j] = p;
        sum += p;
    }
    sum = block_reduce<false>(sum, sh);
    if (a.sinks && !a.part) sum += expf(sink - mx);

    /* Output: P vectors of dims per pass, ATT_THREADS / P slices of the keys each. */
    const int P = hv < ATT_THREADS ? hv : ATT_THREADS, nsl = ATT_THREADS / P;
    const int dd = tid % P, sl = tid / P;
    float *out = a.out + (size_t)t * q_stride + (size_t)h * hd;
    float *part = a.part ? a.part + ((size_t)item * a.splits + split) * (size_t)(hd + 2) : NULL;
    for (int d0 = 0; d0 < hv; d0 += P) {
        const int d = d0 + dd;
        V acc = {};
        if (sl < nsl && d < hv)
#pragma unroll 4
            for (int j = sl; j < nj; j += nsl)
                att_axpy(acc, sc[j],
                         ((const V *)(PREP && rows[j] == newj ? vnew
                                                              : a.vc + (size_t)rows[j] * kv_stride +
                                                                    (size_t)kvh * hd))[d]);
        so[tid] = acc;
        __syncthreads();
        if (tid < P && d < hv) {
            V o = {};
            for (int s = 0; s < nsl; s++)
                att_axpy(o, 1.0f, so[s * P + tid]);
#pragma unroll
            for (int i = 0; i < W; i++) {
                const float oi = att_comp(o, i);
                if (part)
                    part[d * W + i] = oi;
                else
                    out[d * W + i] = nj > 0 ? oi * (1.0f / sum) : 0.0f;
            }
        }
        __syncthreads();
    }
    if (!part) return;
    if (tid == 0) {
        part[hd] = mx;
        part[hd + 1] = sum;
    }
    if (!a.counts || !cu_last_block(a.counts + item, (unsigned)a.splits)) return;
    attn_merge(a, item);
}

__global__ void attn_combine(att_params a) {
    cu_pdl_wait();
    attn_merge(a, blockIdx.x);
}

/* ------------------------------------------------ tiled prompt attention */

/*
 * Prompts (ATT_TILE_MIN_T tokens or more, no selection) at head_dim 129-256, and the float32
 * reference of attn_tc_kernel (below: the same passes on tensor cores) at the others. attn_kernel
 * gives each (query, head) a block that reads all of the query's keys from L2: T x T/2 x n_heads
 * rows for a prompt. Here a block takes BR query rows of one KV head and streams their keys and
 * values through shared memory once for all of them:
 *
 *   rows    the KV head's (token t, query head g of its group) pairs in the order r = t G + g
 *           (G = n_heads / n_kv), BR consecutive ones a block: BR / G tokens of all G heads when
 *           G divides BR (Qwen3-30B-A3B: 8 tokens x 8 heads), so a key row serves BR rows
 *   keys    the union of the rows' ranges, att_first(t_lo) .. pos0 + t_hi (a later token's
 *           range starts no earlier), in tiles of BK cache rows, masked per row; the rows past
 *           the range are zeros, never read
 *   pass 1  each tile's scores s = (q . k) * scale, to every row's exact max M, the sink's logit
 *           included (attn_kernel's block max)
 *   pass 2  the same scores again (the same function on the same tiles: the same bits), then
 *           p = expf(s - M) with the true max as attn_kernel has it (masked: 0), the row sums l
 *           and O += P V, never rescaled; out = O * (1 / l) as attn_kernel writes it
 *
 * Scoring twice costs half as many flops again as one pass of an online softmax would, for
 * arithmetic that differs from attn_kernel's only in the order of its sums, each kept short:
 *   q . k   chains of 16 products (fma), the D / 16 chain sums added in order (attn_kernel:
 *           8 lanes' chains of head_dim / 32 four-product dots, then a tree of 8)
 *   l       each thread's pairwise sum of its TK keys of a tile, added tile after tile, then a
 *           tree over the row's 16 threads (attn_kernel: chains of keys / 256, then a tree)
 *   O       chains of KF = 32 keys, those added in key order: at n keys the rounding error
 *           grows like sqrt(32^2 / n + n / 32) where one serial chain's grows like sqrt(n),
 *           ~0.3 ulp x (3.4 at 140 keys, 11 at 4096, 23 at 16384) (attn_kernel: 4-64 key
 *           slices of chains of n / slices, then a tree)
 * An online softmax adds one rounding of every element of O and l each time a row's running max
 * moves, and its usual serial chain over all keys; a first version of this kernel took that way
 * and moved the most sensitive fixture (gemma4, 11-29x noise gain) past its bound.
 *
 * Shared memory (floats): Q [BR][D], two tiles [BK][D] (pass 1: K tiles, double-buffered;
 * pass 2: the K and the V tile, each loaded while the other is in use), P [BR][BK], l [BR]. Rows
 * of Q, K and V are D / 4 chunks of 16 bytes, chunk c of row i stored at c ^ (i & 7); rows of P
 * are 4-key chunks, chunk c of row i at c ^ 4 (i & 1): the accesses below then have no bank
 * conflicts (8 consecutive rows' chunk c lie in 8 distinct bank quads; P's two rows a warp writes
 * in distinct halves). head_dim is padded to D with zeros (exact: 0 x 0 adds nothing); the
 * padded dims of the output are not stored.
 *
 * Threads: for the scores 16 x 16, thread (sr, kk) has rows sr + 16 i (i < TR) and keys
 * kk + 16 j (j < TK) of the tiles; for P V (BR / TRO) x NOC, thread (orr, oc) has rows
 * orr TRO + i (i < TRO) and chunks oc + NOC m (m < CO). Blocks take the rows of the latest
 * tokens first (the most keys) so that the short ones fill the tail. At D = 128 and 256 a
 * thread holds ~185 registers (ptxas, no spills: 16 scores, 32 outputs and their chain, the
 * loads in flight), so an SM runs one block; forced down to 128 for two, ptxas spills.
 */
#define ATT_TILE_THREADS 256
#define ATT_TILE_MIN_T   64

/* A tiled prompt-attention block's share (attn_tiled_kernel, attn_tc_kernel): BR rows of KV head
 * blockIdx.y in the order r = t G + g (token t, query head g of the group), the latest rows
 * first, and the keys kf .. kl that those rows' ranges span, in tiles of BK cache rows. */
template <int BR, int BK> struct att_block {
    const att_params &a;
    int G, kvh, rows, r0, kf, kl, n_tiles;
    size_t q_stride, kv_stride;
    __device__ __forceinline__ explicit att_block(const att_params &p) : a(p) {
        G = a.n_heads / a.n_kv, kvh = (int)blockIdx.y, rows = a.T * G;
        r0 = (int)(gridDim.x - 1 - blockIdx.x) * BR;
        kf = att_first(a, a.pos0, r0 / G), kl = a.pos0 + (min(r0 + BR, rows) - 1) / G;
        n_tiles = (kl - kf) / BK + 1;
        q_stride = (size_t)a.n_heads * a.hd, kv_stride = (size_t)a.n_kv * a.hd;
    }
    /* row r's keys lo .. hi (an empty range past the last row) */
    __device__ __forceinline__ void range(int r, int &lo, int &hi) const {
        lo = r < rows ? att_first(a, a.pos0, r / G) : 1;
        hi = r < rows ? a.pos0 + r / G : 0;
    }
    /* where row r is in q and out */
    __device__ __forceinline__ size_t at(int r) const {
        return (size_t)(r / G) * q_stride + (size_t)(kvh * G + r % G) * a.hd;
    }
    /* the sink logit of row r's head; -inf without sinks or for an empty range */
    __device__ __forceinline__ float sink(int r, bool live) const {
        return a.sinks && live ? cu_load_f(a.sinks, a.sinks_dt, (size_t)(kvh * G + r % G))
                               : -INFINITY;
    }
    /* the tile loaders' row functions: the block's Q row i (NULL past the last row), and
     * cache row i of key tile `tile` in the KV head's columns (NULL past kl) */
    __device__ __forceinline__ auto q_rows() const {
        return
            [this](int i) -> const float * { return r0 + i < rows ? a.q + at(r0 + i) : nullptr; };
    }
    __device__ __forceinline__ auto keys(const float *cache, int tile) const {
        const float *base = cache + (size_t)kvh * a.hd;
        return [this, base, tile](int i) -> const float * {
            const int j = kf + tile * BK + i;
            return j <= kl ? base + (size_t)j * kv_stride : nullptr;
        };
    }
};

/* Rows 0 .. R-1 of a tile of D floats each into s, 16-byte chunk c of row i at float at(i, c),
 * row i's first hd floats from row(i) (NULL: zeros), zeros beyond; `any` is a valid address for
 * the zero copies. Every one of the block's THREADS threads takes part. */
template <int D, int R, int THREADS, typename Row, typename At>
__device__ __forceinline__ void att_load(float *s, int hd, const float *any, Row row, At at) {
    constexpr int C = D / 4;
    static_assert(R * C % THREADS == 0, "whole rounds of the block");
#pragma unroll
    for (int m = 0; m < R * C / THREADS; m++) {
        const int e = (int)threadIdx.x + m * THREADS, i = e / C, c = e % C;
        const float *src = row(i);
        const bool ok = src && 4 * c < hd;
        cu_cp16_or_zero(cu_saddr(s + at(i, c)), ok ? src + 4 * c : any, ok);
    }
}

/* attn_tiled_kernel's tiles: chunks swizzled (see there) */
template <int D, int R, typename Row>
__device__ __forceinline__ void att_tile_load(float *s, int hd, const float *any, Row row) {
    att_load<D, R, ATT_TILE_THREADS>(
        s, hd, any, row, [](int i, int c) { return 4 * (i * (D / 4) + (c ^ (i & 7))); });
}

/* The scaled scores of the thread's rows sr + 16 i and keys kk + 16 j of a tile (sq: Q, sk: the
 * K tile), the sums in the order described above; both passes run this, for the same bits. */
template <int D, int TR, int TK>
__device__ __forceinline__ void att_tile_scores(float (&s)[TR][TK], const float *sq,
                                                const float *sk, int sr, int kk, float scale) {
    constexpr int C = D / 4;
    const float4 *q4 = (const float4 *)sq, *k4 = (const float4 *)sk;
#pragma unroll
    for (int i = 0; i < TR; i++)
#pragma unroll
        for (int j = 0; j < TK; j++)
            s[i][j] = 0.0f;
#pragma unroll 1
    for (int c0 = 0; c0 < C; c0 += 4) {
        float part[TR][TK];
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TK; j++)
                part[i][j] = 0.0f;
#pragma unroll
        for (int c = c0; c < c0 + 4; c++) {
            float4 qv[TR], kv[TK];
#pragma unroll
            for (int i = 0; i < TR; i++)
                qv[i] = q4[(sr + 16 * i) * C + (c ^ (sr & 7))];
#pragma unroll
            for (int j = 0; j < TK; j++)
                kv[j] = k4[(kk + 16 * j) * C + (c ^ (kk & 7))];
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TK; j++) {
                    float p = part[i][j];
                    p = __fmaf_rn(qv[i].x, kv[j].x, p);
                    p = __fmaf_rn(qv[i].y, kv[j].y, p);
                    p = __fmaf_rn(qv[i].z, kv[j].z, p);
                    part[i][j] = __fmaf_rn(qv[i].w, kv[j].w, p);
                }
        }
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TK; j++)
                s[i][j] = __fadd_rn(s[i][j], part[i][j]);
    }
#pragma unroll
    for (int i = 0; i < TR; i++)
#pragma unroll
        for (int j = 0; j < TK; j++)
            s[i][j] = __fmul_rn(s[i][j], scale);
}

/* Where P's (row, key) of a tile is: rows of BK keys, 4-key chunks swizzled by the row's parity. */
template <int BK> __device__ __forceinline__ int att_p_at(int row, int key) {
    return row * BK + (((key >> 2) ^ ((row & 1) << 2)) << 2) + (key & 3);
}

/* The pairwise sum of n = 2 or 4 values. */
template <int N> __device__ __forceinline__ float att_pairwise(const float (&p)[N]) {
    static_assert(N == 2 || N == 4, "pairs");
    if (N == 2) return __fadd_rn(p[0], p[1]);
    return __fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[N - 2], p[N - 1]));
}

template <int D, int BR, int BK>
__global__ void __launch_bounds__(ATT_TILE_THREADS) attn_tiled_kernel(att_params a) {
    constexpr int C = D / 4, TR = BR / 16, TK = BK / 16;
    constexpr int OPT = BR * D / ATT_TILE_THREADS; /* outputs a thread */
    constexpr int TRO = OPT >= 16 ? 4 : OPT / 4, CO = OPT / (4 * TRO), NOC = C / CO;
    constexpr int KF = 32;
    static_assert(D >= 32 && BR % 16 == 0 && BK % KF == 0 && (TK == 2 || TK == 4) &&
                      TRO * CO * 4 == OPT && (BR / TRO) * NOC == ATT_TILE_THREADS,
                  "tile layout");
    extern __shared__ __align__(16) float smem[];
    float *sq = smem, *sp = sq + BR * D, *sl = sp + BR * BK, *sb0 = sl + BR, *sb1 = sb0 + BK * D;
    const att_block<BR, BK> b(a);
    const int hd = a.hd, kf = b.kf, kl = b.kl, n_tiles = b.n_tiles;
    const int tid = threadIdx.x, sr = tid / 16, kk = tid % 16;
    /* the key range of each of the thread's rows */
    int lo[TR], hi[TR];
#pragma unroll
    for (int i = 0; i < TR; i++)
        b.range(b.r0 + sr + 16 * i, lo[i], hi[i]);
    auto sink_of = [&](int i) { return b.sink(b.r0 + sr + 16 * i, lo[i] <= hi[i]); };
    cu_pdl_wait();

    /* pass 1: the tiles from the last, so that the first (pass 2's first) is resident after */
    att_tile_load<D, BR>(sq, hd, a.q, b.q_rows());
    att_tile_load<D, BK>(sb0, hd, a.kc, b.keys(a.kc, n_tiles - 1));
    cu_cp_commit();
    float M[TR];
#pragma unroll
    for (int i = 0; i < TR; i++)
        M[i] = -INFINITY;
    for (int it = 0; it < n_tiles; it++) {
        const int tile = n_tiles - 1 - it;
        if (it + 1 < n_tiles) {
            att_tile_load<D, BK>(it & 1 ? sb0 : sb1, hd, a.kc, b.keys(a.kc, tile - 1));
            cu_cp_commit();
            cu_cp_wait<1>();
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads();
        float s[TR][TK];
        att_tile_scores<D, TR, TK>(s, sq, it & 1 ? sb1 : sb0, sr, kk, a.scale);
        const int j0 = kf + tile * BK + kk;
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TK; j++)
                if (j0 + 16 * j >= lo[i] && j0 + 16 * j <= hi[i]) M[i] = fmaxf(M[i], s[i][j]);
        __syncthreads(); /* the buffer is the next prefetch's */
    }
#pragma unroll
    for (int i = 0; i < TR; i++) {
        for (int o = 8; o > 0; o >>= 1) /* the row's 16 threads: lanes of one half-warp */
            M[i] = fmaxf(M[i], __shfl_xor_sync(0xffffffffu, M[i], o));
        M[i] = fmaxf(M[i], sink_of(i));
    }

    /* pass 2: tile 0 is in the buffer pass 1 ended on */
    float *kb = (n_tiles - 1) & 1 ? sb1 : sb0, *vb = (n_tiles - 1) & 1 ? sb0 : sb1;
    const int orr = tid / NOC, oc = tid % NOC;
    float l[TR];
    float4 o[TRO][CO];
#pragma unroll
    for (int i = 0; i < TR; i++)
        l[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < TRO; i++)
#pragma unroll
        for (int m = 0; m < CO; m++)
            o[i][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int tile = 0; tile < n_tiles; tile++) {
        if (tile > 0) { /* K(tile) landed; the last P V is done with vb and sp */
            cu_cp_wait<0>();
            __syncthreads();
        }
        att_tile_load<D, BK>(vb, hd, a.vc, b.keys(a.vc, tile));
        cu_cp_commit();
        float s[TR][TK];
        att_tile_scores<D, TR, TK>(s, sq, kb, sr, kk, a.scale);
        __syncthreads(); /* kb is free */
        const bool more = tile + 1 < n_tiles;
        if (more) {
            att_tile_load<D, BK>(kb, hd, a.kc, b.keys(a.kc, tile + 1));
            cu_cp_commit();
        }
        const int j0 = kf + tile * BK + kk;
#pragma unroll
        for (int i = 0; i < TR; i++) {
            float p[TK];
#pragma unroll
            for (int j = 0; j < TK; j++) {
                const int key = j0 + 16 * j;
                p[j] = key >= lo[i] && key <= hi[i] ? expf(s[i][j] - M[i]) : 0.0f;
                sp[att_p_at<BK>(sr + 16 * i, kk + 16 * j)] = p[j];
            }
            l[i] = __fadd_rn(l[i], att_pairwise<TK>(p));
        }
        if (more)
            cu_cp_wait<1>(); /* V(tile), committed before K(tile + 1) */
        else
            cu_cp_wait<0>();
        __syncthreads();
        /* O += P V over the tile's keys in the range (the rest have p = 0), KF at a time */
        const float4 *v4 = (const float4 *)vb;
        const int nk = min(BK, kl - kf - tile * BK + 1);
        for (int k0 = 0; k0 < nk; k0 += KF) {
            float4 acc[TRO][CO];
#pragma unroll
            for (int i = 0; i < TRO; i++)
#pragma unroll
                for (int m = 0; m < CO; m++)
                    acc[i][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
            for (int k = k0; k < k0 + KF; k += 4) {
                float4 pv[TRO];
#pragma unroll
                for (int i = 0; i < TRO; i++)
                    pv[i] = *(const float4 *)(sp + att_p_at<BK>(orr * TRO + i, k));
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int key = k + u;
#pragma unroll
                    for (int m = 0; m < CO; m++) {
                        const float4 v = v4[key * C + ((oc + NOC * m) ^ (key & 7))];
#pragma unroll
                        for (int i = 0; i < TRO; i++) {
                            const float pu = att_comp(pv[i], u);
                            float4 &y = acc[i][m];
                            y.x = __fmaf_rn(pu, v.x, y.x), y.y = __fmaf_rn(pu, v.y, y.y);
                            y.z = __fmaf_rn(pu, v.z, y.z), y.w = __fmaf_rn(pu, v.w, y.w);
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < TRO; i++)
#pragma unroll
                for (int m = 0; m < CO; m++) {
                    float4 &y = o[i][m];
                    y.x = __fadd_rn(y.x, acc[i][m].x), y.y = __fadd_rn(y.y, acc[i][m].y);
                    y.z = __fadd_rn(y.z, acc[i][m].z), y.w = __fadd_rn(y.w, acc[i][m].w);
                }
        }
    }

    /* l over the row's 16 threads, the sink's term last (attn_kernel's order), for the P V
     * threads' rows */
#pragma unroll
    for (int i = 0; i < TR; i++) {
        for (int o = 8; o > 0; o >>= 1)
            l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], o));
        if (kk == 0) {
            const float sink = sink_of(i);
            sl[sr + 16 * i] = a.sinks && lo[i] <= hi[i] ? l[i] + expf(sink - M[i]) : l[i];
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TRO; i++) {
        const int row = orr * TRO + i, r = b.r0 + row;
        if (r >= b.rows) continue;
        const float inv = 1.0f / sl[row];
        float *out = a.out + b.at(r);
#pragma unroll
        for (int m = 0; m < CO; m++) {
            const int c = oc + NOC * m;
            if (4 * c >= hd) continue;
            const float4 y = o[i][m];
            *(float4 *)(out + 4 * c) = make_float4(__fmul_rn(y.x, inv), __fmul_rn(y.y, inv),
                                                   __fmul_rn(y.z, inv), __fmul_rn(y.w, inv));
        }
    }
}

/* One tiled launch of kernel (attn_tiled_kernel or attn_tc_kernel): a block of `threads` per BR
 * rows of a KV head (att_block); the kernel's shared memory limit raised past the default 48
 * KiB once per context (bit: its bit in c->att_smem). */
template <typename K>
static void att_tiled_launch(cu_ctx *c, K kernel, const att_params &a, int BR, int threads,
                             size_t smem, unsigned bit) {
    if (!(c->att_smem & bit)) {
        const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        CUDA_CHECK(c, e);
        if (e != cudaSuccess) return;
        c->att_smem |= bit;
    }
    const int64_t rows = (int64_t)a.T * (a.n_heads / a.n_kv);
    const dim3 grid((unsigned)((rows + BR - 1) / BR), (unsigned)a.n_kv);
    cu_launch(kernel, grid, threads, smem, c, a);
}

template <int D, int BR, int BK>
static void att_f32_launch(cu_ctx *c, const att_params &a, unsigned bit) {
    const size_t smem = (size_t)(BR * D + BR * BK + BR + 2 * BK * D) * sizeof(float);
    att_tiled_launch(c, attn_tiled_kernel<D, BR, BK>, a, BR, ATT_TILE_THREADS, smem, bit);
}

/* ------------------------------------- prompt attention on tensor cores */

/*
 * attn_tiled_kernel's two passes with both products on tensor cores (mma.m16n8k8, TF32 in,
 * float32 accumulate), for head_dim up to 128. TF32 keeps 10 bits of a float's 23, so pass 2
 * splits each operand x into hi = tf32(x) and lo = tf32(x - hi) and sums lo.hi + hi.lo + hi.hi
 * (the lo.lo term is under float32's rounding): ~21 bits of each product for three MMAs.
 * H200, 32/4 heads x 128: 1.16x attn_tiled_kernel at 512 tokens, 1.45x at 4,096-16,384, slower
 * under 512 (BENCHMARKS 15.1). Nsight Compute finds it bound by the splits' ALU work, not the
 * tensor cores (ALU the busiest pipe; 56% of stalls on fixed-latency dependencies, two warps a
 * scheduler at 255 registers): splitting each K and V tile once for the block, not once a
 * warp, is the next step.
 *
 *   pass 1  the max M of each row, from one-MMA TF32 scores of the operands' float32 bits (the
 *           MMA truncates them): M only has to be near the true max (p = expf(s - M) then stays
 *           within [0, ~1.01] and cancels in O / l); no row compares pass 1's scores with pass 2's
 *   pass 2  the scores again in three MMAs, p = expf(s - M) (masked: 0), l += p, and each key
 *           tile's P V in three MMAs into fresh accumulators, added to O (chains of one tile's
 *           BK keys, as attn_tiled_kernel's KF)
 *
 * A block takes BR = 64 rows (attn_tiled_kernel's order r = t G + g) of one KV head, a warp 16
 * of them, and streams BK = 32 keys a tile (K and V double-buffered, cp.async). Fragments (PTX
 * m16n8k8 .tf32: lane = 4 g + t; A rows g, g + 8, columns t, t + 4; B column g, rows t, t + 4; C
 * rows g, g + 8, columns 2t, 2t + 1):
 *   Q K^T   the 8 dims of a k-step are ordered so that a lane's two are adjacent: over 16 dims
 *           lane t holds dims 4t .. 4t + 3 of its rows (Q) and of key g (K) in one float4, the
 *           first k-step using 4t, 4t + 1, the second 4t + 2, 4t + 3 (a sum over all 16 either
 *           way). Rows of Q and K are D + 16 floats apart: a quarter-warp's float4s (rows g,
 *           g + 1) fall in distinct banks.
 *   P V     the keys of a k-step are ordered 2t, 2t + 1 for k = t, t + 4, so that S's C fragment
 *           is P's A fragment as it stands (no shuffle); V's B fragment is keys 2t, 2t + 1 of
 *           dim g, rows D + 4 floats apart (keys 0, 2, 4, 6 in distinct banks).
 * Masked and padded entries are zeros in the tiles (keys past the range, dims past head_dim),
 * so every product is finite.
 */
#define ATT_TC_THREADS 128
#define ATT_TC_BR      64
#define ATT_TC_BK      32

__device__ __forceinline__ uint32_t att_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
/* x as hi + lo, both TF32 */
__device__ __forceinline__ void att_tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = att_tf32(x);
    lo = att_tf32(x - __uint_as_float(hi));
}
/* d += a . b for one m16n8k8 fragment */
__device__ __forceinline__ void att_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* d += a . b in three MMAs (lo.hi, hi.lo, hi.hi): a float32-accurate product */
__device__ __forceinline__ void att_mma3(float (&d)[4], const uint32_t (&ah)[4],
                                         const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                         uint32_t bl0, uint32_t bl1) {
    att_mma(d, al[0], al[1], al[2], al[3], bh0, bh1);
    att_mma(d, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
    att_mma(d, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

/* attn_tc_kernel's tiles: rows S floats apart */
template <int D, int R, int S, typename Row>
__device__ __forceinline__ void att_tc_load(float *s, int hd, const float *any, Row row) {
    att_load<D, R, ATT_TC_THREADS>(s, hd, any, row, [](int i, int c) { return i * S + 4 * c; });
}

/* The warp's scores S (16 rows x BK keys, C fragments, unscaled) of the K tile sk against its
 * Q rows sq: THREE = false in one TF32 MMA a k-step (pass 1), true in three. */
template <int D, bool THREE>
__device__ __forceinline__ void att_tc_scores(float (&s)[ATT_TC_BK / 8][4], const float *sq,
                                              const float *sk, int g, int t) {
    constexpr int S = D + 16, NT = ATT_TC_BK / 8;
#pragma unroll
    for (int n = 0; n < NT; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < D; c += 16) {
        const float4 qa = *(const float4 *)(sq + g * S + c + 4 * t);
        const float4 qb = *(const float4 *)(sq + (g + 8) * S + c + 4 * t);
        if (!THREE) { /* the float32 bits as they are: the MMA reads their top 19 (truncated) */
            const uint32_t a[2][4] = {{__float_as_uint(qa.x), __float_as_uint(qb.x),
                                       __float_as_uint(qa.y), __float_as_uint(qb.y)},
                                      {__float_as_uint(qa.z), __float_as_uint(qb.z),
                                       __float_as_uint(qa.w), __float_as_uint(qb.w)}};
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float4 k = *(const float4 *)(sk + (8 * n + g) * S + c + 4 * t);
                att_mma(s[n], a[0][0], a[0][1], a[0][2], a[0][3], __float_as_uint(k.x),
                        __float_as_uint(k.y));
                att_mma(s[n], a[1][0], a[1][1], a[1][2], a[1][3], __float_as_uint(k.z),
                        __float_as_uint(k.w));
            }
        } else {
            uint32_t ah[2][4], al[2][4];
            att_tf32_split(qa.x, ah[0][0], al[0][0]), att_tf32_split(qb.x, ah[0][1], al[0][1]);
            att_tf32_split(qa.y, ah[0][2], al[0][2]), att_tf32_split(qb.y, ah[0][3], al[0][3]);
            att_tf32_split(qa.z, ah[1][0], al[1][0]), att_tf32_split(qb.z, ah[1][1], al[1][1]);
            att_tf32_split(qa.w, ah[1][2], al[1][2]), att_tf32_split(qb.w, ah[1][3], al[1][3]);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float4 k = *(const float4 *)(sk + (8 * n + g) * S + c + 4 * t);
                uint32_t kh[4], kl[4];
                att_tf32_split(k.x, kh[0], kl[0]), att_tf32_split(k.y, kh[1], kl[1]);
                att_tf32_split(k.z, kh[2], kl[2]), att_tf32_split(k.w, kh[3], kl[3]);
                att_mma3(s[n], ah[0], al[0], kh[0], kh[1], kl[0], kl[1]);
                att_mma3(s[n], ah[1], al[1], kh[2], kh[3], kl[2], kl[3]);
            }
        }
    }
}

template <int D> __global__ void __launch_bounds__(ATT_TC_THREADS, 2) attn_tc_kernel(att_params a) {
    constexpr int BR = ATT_TC_BR, BK = ATT_TC_BK, NT = BK / 8, DN = D / 8;
    constexpr int DH = DN % 8 == 0 ? 8 : DN; /* PV's accumulators a round */
    constexpr int QS = D + 16, VS = D + 4;   /* row strides of Q and K, of V */
    static_assert(D % 16 == 0 && D <= 128, "head_dim tiles");
    extern __shared__ __align__(16) float smem[];
    float *sq = smem, *sk0 = sq + BR * QS, *sk1 = sk0 + BK * QS, *sv0 = sk1 + BK * QS,
          *sv1 = sv0 + BK * VS;
    const att_block<BR, BK> b(a);
    const int hd = a.hd, kf = b.kf, n_tiles = b.n_tiles;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the thread's two rows, g and g + 8 of the warp's 16, and their key ranges */
    int row[2], lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        row[i] = b.r0 + 16 * warp + g + 8 * i;
        b.range(row[i], lo[i], hi[i]);
    }
    cu_pdl_wait();
    const float *wq = sq + 16 * warp * QS; /* the warp's Q rows */

    /* pass 1 */
    att_tc_load<D, BR, QS>(sq, hd, a.q, b.q_rows());
    att_tc_load<D, BK, QS>(sk0, hd, a.kc, b.keys(a.kc, 0));
    cu_cp_commit();
    float M[2] = {-INFINITY, -INFINITY};
    /* tile's buffers ready: the next tile's K (and V) loads issued into the others, tile's own
     * waited for, by the whole block */
    auto advance = [&](int tile, bool with_v) {
        if (tile + 1 < n_tiles) {
            att_tc_load<D, BK, QS>(tile & 1 ? sk0 : sk1, hd, a.kc, b.keys(a.kc, tile + 1));
            if (with_v)
                att_tc_load<D, BK, VS>(tile & 1 ? sv0 : sv1, hd, a.vc, b.keys(a.vc, tile + 1));
            cu_cp_commit();
            cu_cp_wait<1>();
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads();
    };
    /* f(score, its row (0: g, 1: g + 8), whether its key is in the row's range) for each of the
     * thread's scores of a tile, C fragment n's element e: key 8 n + 2 t + (e & 1) */
    auto each_score = [&](float(&s)[NT][4], int tile, auto f) {
        const int j0 = kf + tile * BK + 2 * t;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1, key = j0 + 8 * n + (e & 1);
                f(s[n][e], i, key >= lo[i] && key <= hi[i]);
            }
    };
    for (int tile = 0; tile < n_tiles; tile++) {
        advance(tile, false);
        float s[NT][4];
        att_tc_scores<D, false>(s, wq, tile & 1 ? sk1 : sk0, g, t);
        each_score(s, tile, [&](float &v, int i, bool in) {
            if (in) M[i] = fmaxf(M[i], v * a.scale);
        });
        __syncthreads(); /* the buffer is the next load's */
    }
    float sink[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        M[i] = fmaxf(M[i], __shfl_xor_sync(0xffffffffu, M[i], 1)); /* the row's quad */
        M[i] = fmaxf(M[i], __shfl_xor_sync(0xffffffffu, M[i], 2));
        sink[i] = b.sink(row[i], lo[i] <= hi[i]);
        M[i] = fmaxf(M[i], sink[i]);
    }

    /* pass 2 */
    att_tc_load<D, BK, QS>(sk0, hd, a.kc, b.keys(a.kc, 0));
    att_tc_load<D, BK, VS>(sv0, hd, a.vc, b.keys(a.vc, 0));
    cu_cp_commit();
    float l[2] = {0.0f, 0.0f}, o[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int tile = 0; tile < n_tiles; tile++) {
        advance(tile, true);
        float s[NT][4];
        att_tc_scores<D, true>(s, wq, tile & 1 ? sk1 : sk0, g, t);
        each_score(s, tile, [&](float &v, int i, bool in) {
            v = in ? expf(v * a.scale - M[i]) : 0.0f;
            l[i] += v;
        });
        /* O += P V: a k-step per 8 keys of the tile, its P the scores' C fragment kn; the
         * tile's sums in fresh accumulators, DH dim fragments at a time (registers) */
        const float *sv = tile & 1 ? sv1 : sv0;
#pragma unroll
        for (int n0 = 0; n0 < DN; n0 += DH) {
            float acc[DH][4];
#pragma unroll
            for (int n = 0; n < DH; n++)
                acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
            for (int kn = 0; kn < NT; kn++) {
                uint32_t ph[4], pl[4];
                att_tf32_split(s[kn][0], ph[0], pl[0]), att_tf32_split(s[kn][2], ph[1], pl[1]);
                att_tf32_split(s[kn][1], ph[2], pl[2]), att_tf32_split(s[kn][3], ph[3], pl[3]);
                const float *v0 = sv + (8 * kn + 2 * t) * VS + 8 * n0 + g, *v1 = v0 + VS;
#pragma unroll
                for (int n = 0; n < DH; n++) {
                    uint32_t bh0, bl0, bh1, bl1;
                    att_tf32_split(v0[8 * n], bh0, bl0);
                    att_tf32_split(v1[8 * n], bh1, bl1);
                    att_mma3(acc[n], ph, pl, bh0, bh1, bl0, bl1);
                }
            }
#pragma unroll
            for (int n = 0; n < DH; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[n0 + n][e] += acc[n][e];
        }
        __syncthreads(); /* the buffers are the next load's */
    }

    /* l over the row's quad, the sink's term last; out = O / l */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        if (a.sinks && lo[i] <= hi[i]) l[i] += expf(sink[i] - M[i]);
        if (row[i] >= b.rows) continue;
        const float inv = 1.0f / l[i];
        float *out = a.out + b.at(row[i]);
#pragma unroll
        for (int n = 0; n < DN; n++) {
            const int d = 8 * n + 2 * t;
            if (d < hd)
                *(float2 *)(out + d) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        }
    }
}

/* Two blocks an SM: 34-108 KiB of shared memory each. */
template <int D> static void att_tc_launch(cu_ctx *c, const att_params &a, unsigned bit) {
    constexpr int BR = ATT_TC_BR, BK = ATT_TC_BK;
    const size_t smem = (size_t)(BR * (D + 16) + 2 * BK * (D + 16) + 2 * BK * (D + 4)) * 4;
    att_tiled_launch(c, attn_tc_kernel<D>, a, BR, ATT_TC_THREADS, smem, bit);
}

/* Whether the tiled kernel takes args: a prompt of ATT_TILE_MIN_T tokens or more (any size when
 * a test asks for it) without a selection, head_dim % 4 == 0 up to 256, rows 16-byte aligned. */
static int att_tiled_use(const cu_ctx *c, const sl_attn_args *a) {
    if (c->att_path == SL_CUDA_ATT_PLAIN || a->sel || a->head_dim % 4 || a->head_dim > 256)
        return 0;
    if (((uintptr_t)a->out | (uintptr_t)a->q | (uintptr_t)a->kcache | (uintptr_t)a->vcache) & 15)
        return 0;
    return c->att_path == SL_CUDA_ATT_TILED || c->att_path == SL_CUDA_ATT_TC ||
           a->T >= ATT_TILE_MIN_T;
}

/* tc: head_dim padded to 32, 64, 96 or 128 on the tensor-core kernel. Else attn_tiled_kernel,
 * head_dim padded to 32, 64 or 128 (tiles of 64 rows and 64 keys: 40, 64 and 112 KiB of shared
 * memory) or 256 (32 rows and 32 keys: 100 KiB); 512 (Gemma 4's global layers) stays on
 * attn_kernel. */
static void att_tiled(cu_ctx *c, const att_params &a, bool tc) {
    if (tc && a.hd <= 32)
        att_tc_launch<32>(c, a, 1u << 4);
    else if (tc && a.hd <= 64)
        att_tc_launch<64>(c, a, 1u << 5);
    else if (tc && a.hd <= 96)
        att_tc_launch<96>(c, a, 1u << 6);
    else if (tc && a.hd <= 128)
        att_tc_launch<128>(c, a, 1u << 7);
    else if (a.hd <= 32)
        att_f32_launch<32, 64, 64>(c, a, 1u);
    else if (a.hd <= 64)
        att_f32_launch<64, 64, 64>(c, a, 2u);
    else if (a.hd <= 128)
        att_f32_launch<128, 64, 64>(c, a, 4u);
    else
        att_f32_launch<256, 32, 32>(c, a, 8u);
}

/* Whether the attention kernel can do prep's qkv_prep itself (attn_kernel<W, true>): one decode
 * token without a selection, on the same buffers and shapes, rows a block's threads cover. */
static int prep_fusable(const sl_attn_args *a, const sl_qkv_args *p) {
    return p->T == 1 && a->T == 1 && !a->sel && p->q == a->q && p->kc == a->kcache &&
           p->vc == a->vcache && p->pos0 == a->pos0 && p->n_heads == a->n_heads &&
           p->n_kv_heads == a->n_kv_heads && p->head_dim == a->head_dim &&
           a->head_dim <= ATT_THREADS && p->rot_dim <= a->head_dim;
}

/* Enough blocks to keep every SM's memory pipe busy, but no split under ATT_MIN_KEYS keys (32: at
 * 128-256 keys 1.5% faster decode than 64, 4.8% than 128, BENCHMARKS 11.1), nor over ATT_MAX_L. */
#define ATT_MIN_KEYS 32
int32_t cu_att_splits(const cu_ctx *c, int32_t n_items, int32_t max_keys) {
    const int32_t want = 8 * c->n_sm, m = ATT_MIN_KEYS;
    int32_t splits = 1;
    if (n_items < want) splits = SL_MIN((want + n_items - 1) / n_items, (max_keys + m - 1) / m);
    splits = SL_MAX(splits, (max_keys + ATT_MAX_L - 1) / ATT_MAX_L);
    return SL_MAX(splits, 1);
}

void cu_attention(const sl_backend *be, const sl_attn_args *args) {
    const int32_t n_items = args->T * args->n_heads;
    if (n_items <= 0) return;
    cu_ctx *c = cu_of(be);
    att_params a;
    memset(&a, 0, sizeof a); /* padding too: a graph step compares the bytes */
    a.out = args->out, a.q = args->q, a.kc = args->kcache, a.vc = args->vcache;
    a.sel = args->sel, a.n_sel = args->n_sel, a.sel_stride = args->sel_stride;
    a.T = args->T, a.pos0 = args->pos0, a.n_heads = args->n_heads, a.n_kv = args->n_kv_heads;
    a.hd = args->head_dim, a.scale = args->scale;
    a.window = args->sel ? 0 : args->window;
    a.chunk = args->sel ? 0 : args->chunk;
    a.sinks = args->sinks ? args->sinks->data : NULL;
    a.sinks_dt = args->sinks ? (int)args->sinks->dtype : 0;
    if (att_tiled_use(c, args)) {
        if (args->prep) cu_qkv_prep(be, args->prep);
        /* tensor cores from 512 keys a row on, unless the backend keeps off them
         * (sl_cuda_params.no_tensor_cores); under that the float32 kernel is faster (0.88x at
         * 64-256 tokens from 0, 1.16x at 512, 1.46x at 4,096: BENCHMARKS 15.1) */
        const bool tc =
            c->att_path == SL_CUDA_ATT_TC ||
            (c->att_path == SL_CUDA_ATT_AUTO && c->tensor_cores && args->pos0 + args->T >= 512);
        att_tiled(c, a, tc);
        CUDA_LAUNCHED(c);
        return;
    }
    /* A selection lists distinct rows of the cache, so no query has more than pos0 + T keys;
     * a sliding window, no more than the window; chunked attention, no more than a chunk. */
    int32_t max_keys = args->pos0 + args->T;
    if (a.window > 0) max_keys = SL_MIN(max_keys, a.window);
    if (a.chunk > 0) max_keys = SL_MIN(max_keys, a.chunk);
    const int32_t splits = cu_att_splits(c, n_items, max_keys);
    a.splits = splits;
    /* In a graph step the kernel reads the position from device memory and works out its
     * splits' length itself, so that its arguments and its shared memory (sized for lengths
     * in steps of 32 keys) stay the same from token to token. */
    a.dpos = cu_dyn(c, &a.pos0);
    const int32_t L = att_split_len(args->pos0, args->T, a.window, a.chunk, splits);
    const int32_t Lmem = a.dpos ? (L + 31) / 32 * 32 : L;
    a.part = NULL;
    a.counts = n_items <= CU_ATT_COUNTS ? c->att_counts : NULL;
    if (splits > 1) {
        a.part =
            (float *)cu_scratch(be, (size_t)n_items * splits * (size_t)(a.hd + 2) * sizeof(float));
        if (!a.part) return;
    }
    const int vec = a.hd % 4 == 0 && !(((uintptr_t)a.q | (uintptr_t)a.kc | (uintptr_t)a.vc) & 15);
    const sl_qkv_args *pr = args->prep;
    /* the raw value row is read as the cache rows are: aligned as they are. Fused at any
     * number of splits: alone the fused kernel is slower past 4 (each split's block preps its
     * head's q again: 14.2 against 11.4 us at 512 keys), but in a decode step's chain of
     * dependent kernels the two launches added 14.25 us a layer against 9.2 fused (H200,
     * 32/4 heads x 128, 128-256 keys; BENCHMARKS 11) */
    const int fuse = pr && vec && !((uintptr_t)pr->v & 15) && prep_fusable(args, pr);
    if (pr && !fuse) cu_qkv_prep(be, pr);
    if (fuse) a.prep = qkv_params_of(c, pr); /* its position is the attention's: one slot */
    const size_t smem =
        (size_t)((vec ? 4 : 1) * ATT_THREADS + (fuse ? 4 * a.hd + 64 : a.hd + 32) + 2 * Lmem) *
        sizeof(float);
    const dim3 grid((unsigned)n_items, (unsigned)splits);
    if (fuse)
        cu_launch(attn_kernel<4, true>, grid, ATT_THREADS, smem, c, a);
    else if (vec)
        cu_launch(attn_kernel<4, false>, grid, ATT_THREADS, smem, c, a);
    else
        cu_launch(attn_kernel<1, false>, grid, ATT_THREADS, smem, c, a);
    if (splits > 1 && !a.counts) cu_launch(attn_combine, (unsigned)n_items, 128, 0, c, a);
    CUDA_LAUNCHED(c);
}

/* --------------------------------------------------- conv1d and delta */

/* One thread per channel, tokens in order; x[<0] comes from the state. */
__global__ void conv1d_silu_kernel(float *__restrict__ y, const float *__restrict__ x, int32_t T,
                                   int32_t C, const void *__restrict__ w, int wdt, int32_t K,
                                   int32_t dil, float *__restrict__ state) {
    cu_pdl_wait();
    const int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int32_t S = (K - 1) * dil;
    float *st = state + (size_t)c * S;
    for (int32_t t = 0; t < T; t++) {
        float acc = 0.0f;
        for (int32_t j = 0; j < K - 1; j++) {
            const int32_t tau = t - (K - 1 - j) * dil;
            const float v = tau < 0 ? st[S + tau] : x[(size_t)tau * C + c];
            acc += cu_load_f(w, wdt, (size_t)c * K + j) * v;
        }
        acc += cu_load_f(w, wdt, (size_t)c * K + K - 1) * x[(size_t)t * C + c];
        y[(size_t)t * C + c] = acc / (1.0f + expf(-acc));
    }
    /* New state: the last S inputs; ascending i only reads entries not yet rewritten. */
    for (int32_t i = 0; i < S; i++) {
        const int32_t tau = T - S + i;
        st[i] = tau < 0 ? st[i + T] : x[(size_t)tau * C + c];
    }
}

void cu_conv1d_silu(const sl_backend *be, float *y, const float *x, int32_t T, int32_t C,
                    const sl_tensor *w, int32_t K, int32_t d, float *state) {
    cu_ctx *c = cu_of(be);
    if (T <= 0 || C <= 0) return;
    cu_launch(conv1d_silu_kernel, cu_blocks((size_t)C, 128), 128, 0, c, y, x, T, C, w->data,
              (int)w->dtype, K, d, state);
    CUDA_LAUNCHED(c);
}

/*
 * Gated delta rule. Value columns are independent, so a block takes one head and
 * 32 columns j; its warps split the dk rows of the state, DR_ROWS each, and keep
 * their S[i][j] in registers for all T tokens. Per token:
 *   S *= decay; kv_j = sum_i S[i][j] k_i           (partials across warps, smem)
 *   kv_j = beta (v_j - kv_j); S[i][j] += k_i kv_j; o_j = sum_i S[i][j] q_i q_scale
 */
#define DR_ROWS      16
#define DR_MAX_WARPS 32 /* dk <= 512 */

typedef struct dr_params {
    float *out;
    const float *q, *k, *v, *a, *b;
    const void *A_log, *dt_bias;
    int A_dt, dt_dt, A_neg_exp, v_tiled;
    float *state;
    int32_t T, nk, nv, dk, dv;
    float q_scale;
} dr_params;
static_assert(sizeof(dr_params) == 9 * 8 + 10 * 4, "dr_params without padding");

__global__ void delta_rule_kernel(dr_params p) {
    cu_pdl_wait();
    __shared__ float ks[DR_MAX_WARPS * DR_ROWS], qs[DR_MAX_WARPS * DR_ROWS];
    __shared__ float red[DR_MAX_WARPS][32], kvs[32], coef[2];
    const int h = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const int j = blockIdx.y * 32 + lane, dk = p.dk, dv = p.dv,
              kh = p.v_tiled ? h % p.nk : h / (p.nv / p.nk);
    const bool jv = j < dv;
    const int i0 = wp * DR_ROWS;
    const size_t qk_row = (size_t)p.nk * dk, v_row = (size_t)p.nv * dv;
    float *S = p.state + (size_t)h * dk * dv;
    float s[DR_ROWS];
#pragma unroll
    for (int ii = 0; ii < DR_ROWS; ii++)
        s[ii] = (jv && i0 + ii < dk) ? S[(size_t)(i0 + ii) * dv + j] : 0.0f;
    const float A_log = cu_load_f(p.A_log, p.A_dt, (size_t)h);
    const float A = p.A_neg_exp ? A_log : -expf(A_log);
    const float dtb = cu_load_f(p.dt_bias, p.dt_dt, (size_t)h);
    for (int t = 0; t < p.T; t++) {
        for (int i = threadIdx.x; i < nw * DR_ROWS; i += blockDim.x) {
            ks[i] = i < dk ? p.k[(size_t)t * qk_row + (size_t)kh * dk + i] : 0.0f;
            qs[i] = i < dk ? p.q[(size_t)t * qk_row + (size_t)kh * dk + i] * p.q_scale : 0.0f;
        }
        if (threadIdx.x == 0) {
            const float xa = p.a[(size_t)t * p.nv + h] + dtb;
            const float softplus = xa > 20.0f ? xa : log1pf(expf(xa));
            coef[0] = expf(A * softplus);
            coef[1] = 1.0f / (1.0f + expf(-p.b[(size_t)t * p.nv + h]));
        }
        __syncthreads();
        const float decay = coef[0], beta = coef[1];
        float part = 0.0f;
#pragma unroll
        for (int ii = 0; ii < DR_ROWS; ii++) {
            s[ii] *= decay;
            part += s[ii] * ks[i0 + ii];
        }
        red[wp][lane] = part;
        __syncthreads();
        if (wp == 0) {
            float kv = 0.0f;
            for (int w = 0; w < nw; w++)
                kv += red[w][lane];
            kvs[lane] = jv ? (p.v[(size_t)t * v_row + (size_t)h * dv + j] - kv) * beta : 0.0f;
        }
        __syncthreads();
        const float kv = kvs[lane];
        float o = 0.0f;
#pragma unroll
        for (int ii = 0; ii < DR_ROWS; ii++) {
            s[ii] += ks[i0 + ii] * kv;
            o += s[ii] * qs[i0 + ii];
        }
        red[wp][lane] = o;
        __syncthreads();
        if (wp == 0 && jv) {
            float acc = 0.0f;
            for (int w = 0; w < nw; w++)
                acc += red[w][lane];
            p.out[(size_t)t * v_row + (size_t)h * dv + j] = acc;
        }
        __syncthreads();
    }
#pragma unroll
    for (int ii = 0; ii < DR_ROWS; ii++)
        if (jv && i0 + ii < dk) S[(size_t)(i0 + ii) * dv + j] = s[ii];
}

void cu_delta_rule(const sl_backend *be, const sl_delta_args *a) {
    cu_ctx *c = cu_of(be);
    if (a->T <= 0 || a->nv <= 0) return;
    SL_ASSERT(a->dk > 0 && a->dk <= DR_MAX_WARPS * DR_ROWS && a->dv > 0);
    SL_ASSERT(a->nk > 0 && a->nv % a->nk == 0);
    dr_params p;
    p.out = a->out, p.q = a->q, p.k = a->k, p.v = a->v, p.a = a->a, p.b = a->b;
    p.A_log = a->A_log->data, p.A_dt = (int)a->A_log->dtype;
    p.dt_bias = a->dt_bias->data, p.dt_dt = (int)a->dt_bias->dtype;
    p.A_neg_exp = a->A_neg_exp, p.v_tiled = a->v_tiled;
    p.state = a->state;
    p.T = a->T, p.nk = a->nk, p.nv = a->nv, p.dk = a->dk, p.dv = a->dv, p.q_scale = a->q_scale;
    const int warps = (a->dk + DR_ROWS - 1) / DR_ROWS;
    dim3 grid((unsigned)a->nv, (unsigned)((a->dv + 31) / 32));
    cu_launch(delta_rule_kernel, grid, (unsigned)(warps * 32), 0, c, p);
    CUDA_LAUNCHED(c);
}

/* ------------------------------------------------------- PLE and QSA */

/* One block per (token, stream) row. */
__global__ void ple_gate_kernel(float *__restrict__ y, const float *__restrict__ key,
                                const float *__restrict__ query, const float *__restrict__ value,
                                int32_t hc, int32_t n, float sq) {
    cu_pdl_wait();
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float *k = key + r * n, *q = query + r * n;
    float g = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        g += k[i] * q[i];
    g = block_reduce<false>(g, sh) / sq;
    g = sqrtf(fmaxf(fabsf(g), 1e-6f)) * (float)((g > 0) - (g < 0));
    const float sg = 1.0f / (1.0f + expf(-g));
    const float *v = value + (r / (size_t)hc) * n;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        y[r * n + i] = sg * v[i];
}

void cu_ple_gate(const sl_backend *be, float *y, const float *key, const float *query,
                 const float *value, int32_t T, int32_t hc, int32_t n) {
    cu_ctx *c = cu_of(be);
    if (T <= 0 || hc <= 0 || n <= 0) return;
    cu_launch(ple_gate_kernel, (unsigned)(T * hc), row_threads(n), 0, c, y, key, query, value, hc,
              n, (float)sqrt((double)n));
    CUDA_LAUNCHED(c);
}

/* One block per key block; warps take heads. */
__global__ void qsa_scores_kernel(float *__restrict__ scores, const float *__restrict__ q,
                                  const float *__restrict__ keys, int32_t n_heads, int32_t d,
                                  float sq) {
    cu_pdl_wait();
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *k = keys + (size_t)blockIdx.x * d;
    float acc = 0.0f;
    for (int h = warp; h < n_heads; h += nw) {
        const float *qh = q + (size_t)h * d;
        float s = 0.0f;
        for (int i = lane; i < d; i += 32)
            s += qh[i] * k[i];
        acc += fmaxf(warp_sum(s), 0.0f);
    }
    if (lane != 0) acc = 0.0f; /* every lane holds the warp's sum; count it once */
    acc = block_reduce<false>(acc, sh);
    if (threadIdx.x == 0) scores[blockIdx.x] = acc / sq;
}

void cu_qsa_scores(const sl_backend *be, float *scores, const float *q, const float *keys,
                   int32_t n_heads, int32_t n_blocks, int32_t d) {
    cu_ctx *c = cu_of(be);
    if (n_blocks <= 0) return;
    cu_launch(qsa_scores_kernel, (unsigned)n_blocks, 128, 0, c, scores, q, keys, n_heads, d,
              (float)sqrt((double)d));
    CUDA_LAUNCHED(c);
}
