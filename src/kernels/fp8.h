/*
 * Hugging Face's block-wise FP8 (the official Qwen3 / DeepSeek-V3 FP8 checkpoints): an F8_E4M3
 * matrix with F32 block scales (sl_tensor_is_fp8, tensor.h), on the CPU (cpu_fp8.c).
 */
#ifndef SL_FP8_H
#define SL_FP8_H

#include "format/tensor.h"
#include "kernels/ops.h"

/* Row `row` of w widened to K floats, fp8 * scale rounded once. */
void sl_dequant_fp8_row(const sl_tensor *w, int64_t row, float *dst);
/* One row dotted with x in the scalar reference order (one accumulator over k). */
float sl_dot_fp8_ref(const sl_tensor *w, int64_t row, const float *x);
/* y[T, N] = x[T, K] . W^T for an FP8 W [N, K]; the contract of sl_matmul_cpu, and on one ISA
 * the bits of sl_matmul_cpu over the F32 matrix sl_dequant_fp8_row gives. */
void sl_matmul_fp8_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                       int32_t T);

#endif /* SL_FP8_H */
