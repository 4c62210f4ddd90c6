/*
 * Group-wise affine quantisation (as in MLX) and its fused kernels.
 *
 * A quantised [N, K] matrix is three arrays (see sl_tensor):
 *   data    N rows of q: Q8 one byte per weight; Q4 two per byte, low nibble
 *           first, each row padded to a whole byte (sl_row_bytes)
 *   scales  [N, G] BF16, G = ceil(K / 64): group g covers columns 64g .. 64g+63
 *   biases  [N, G] BF16                    (the last group may be shorter)
 * and w[n][k] = q[n][k] * scale[n][k / 64] + bias[n][k / 64].
 *
 * The matmul never widens the matrix: per group it forms sum(q * x) and
 * sum(x), then y += scale * sum(q * x) + bias * sum(x).
 */
#ifndef SL_QUANT_H
#define SL_QUANT_H

#include "kernels/ops.h"

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
void sl_matmul_quant_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                         int32_t T);

#endif /* SL_QUANT_H */
