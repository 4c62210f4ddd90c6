/*
 * Group-wise affine quantisation (as in MLX) and its fused kernels.
 *
 * A quantised [N, K] matrix is three arrays (see sl_tensor):
 *   data    N rows of q: Q8 one byte per weight; Q4 two per byte, low nibble
 *           first, each row padded to a whole byte (sl_row_bytes)
 *   scales  [N, G] BF16, G = ceil(K / 64): group g covers columns 64g .. 64g+63
 *   biases  [N, G] BF16                    (the last group may be shorter)
 * and w[n][k] = q[n][k] * scale[n][k / 64] + bias[n][k / 64]. That is sluice's pack layout;
 * MLX checkpoints bring groups of 32 or 128 too (sl_tensor.group) and F16 or F32 scales and
 * biases (sl_tensor.sdtype), which every kernel here also takes.
 *
 * The matmul never widens the matrix: per group it forms sum(q * x) and
 * sum(x), then y += scale * sum(q * x) + bias * sum(x).
 */
#ifndef SL_QUANT_H
#define SL_QUANT_H

#include "kernels/ops.h"

/* Element i of a Q8/Q4 tensor's scales or biases (dtype sd: BF16, F16 or F32) as float. */
static inline float sl_qparam(const void *p, sl_dtype sd, size_t i) {
    if (sd == SL_DTYPE_F32) return ((const float *)p)[i];
    if (sd == SL_DTYPE_F16) return sl_f16_to_f32(((const uint16_t *)p)[i]);
    return sl_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* Quantises one row of K floats: min/max affine per group, BF16 scale and bias,
 * q = round((w - bias) / scale) clamped to the code range. Reference code for pack. */
void sl_quantize_row(sl_dtype dt, const float *w, int64_t K, uint8_t *q, uint16_t *scales,
                     uint16_t *biases);
/* Widens row n of a Q8/Q4 tensor into out[K]. */
void sl_dequantize_row(const sl_tensor *w, int64_t n, float *out);

/*
 * y[T, N] = x[T, K] . dequant(W)^T for a Q8/Q4 W, same contract as
 * sl_matmul_cpu: each element's summation order depends only on K and the
 * ISA (never on T, the tile or the thread), so batch and decode agree bitwise.
 * Allocates nothing.
 */
/* Products of one token each (decode's batches: a layer's q/k/v, its experts' gate and up,
 * their downs), all Q4 or all Q8 with int8 activations, or all Q8 on AVX-512, in one parallel
 * region instead of one a product, each row computed as sl_matmul_quant_cpu computes it (the same
 * bits); 0 when the products do not all qualify (nothing done). */
int sl_matmul_quant_batch1_cpu(const sl_backend *be, float *const *y, const float *const *x,
                               const sl_tensor *const *w, int32_t n);
void sl_matmul_quant_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                         int32_t T);

/*
 * How a Q8/Q4 matmul treats the activations. FLOAT keeps x in float32 (the
 * order described in cpu_quant.c). INT8 quantises each token's x once per
 * call, symmetric per group of 64 columns:
 *   m = max |x_k|,  d = m / 127,  xq_k = rint(x_k * min(127 / m, FLT_MAX))
 * (float32 arithmetic, round to nearest even; zero-padded past K), and sums
 * integer products of codes and xq (AVX-512 VNNI):
 *   y = sum_g scale_g * (d_g * sum_k (q_k - z) xq_k) + (bias_g + z scale_g) * X_g
 * with X_g the float sum of x over the group and z the codes' centre (8 for Q4, 128 for Q8).
 * Only the rounding of x to xq
 * is new error: |y - exact| <= sum_g scale_g * e_g * sum_k |q_k - z| plus
 * float rounding, where e_g = d_g / 2 (to 1e-4 relative), or m itself for a
 * group so small (m < 127 / FLT_MAX, ~4e-37) that its xq are all zero. A group whose X is not
 * finite (an Inf or NaN in x, or finite values whose sum overflows) gets xq = 0 and d = NaN, so
 * every output of that token is NaN: never undefined behaviour, never a finite value made up
 * from non-finite input. Per-token bits still depend only on K (never on T, the tile or the
 * thread). INT8 where unavailable takes FLOAT. AUTO (what sl_matmul_quant_cpu does) is INT8
 * whenever it is available, for Q8 too: its x rounding is about as large as its weights' (the
 * logits of int8 packs move 1.4x further from the float model's, tests/unit/test_store.c), and
 * prompts run 2-4x faster than on float x (docs/BENCHMARKS.md 5.1).
 */
typedef enum sl_qpath {
    SL_QPATH_AUTO = 0,
    SL_QPATH_FLOAT,
    SL_QPATH_INT8,
} sl_qpath;

/* INT8 takes rows of at most this many groups (K <= 131072); longer ones FLOAT. */
#define SL_QINT8_MAX_GROUPS 2048

/* Whether SL_QPATH_INT8 runs on this backend: AVX-512 and a CPU with VNNI. */
int sl_quant_int8_available(const sl_backend *be);
/* sl_matmul_quant_cpu with a choice of path, for tests and benchmarks. */
void sl_matmul_quant_cpu_path(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                              int32_t T, sl_qpath path);

#endif /* SL_QUANT_H */
