/*
 * C-callable extras of the CUDA backend, for tests and benchmarks. The backend
 * itself is reached through sl_backend_cuda_init and its sl_ops table (ops.h).
 */
#ifndef SL_CUDA_BACKEND_H
#define SL_CUDA_BACKEND_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Waits until every op queued on the backend's stream has finished. */
void sl_cuda_sync(const sl_backend *be);
/* The GPU's name and its number of SMs, for reports. */
const char *sl_cuda_device_name(const sl_backend *be);

/* Which kernel the attention op runs for a prompt without a selection: AUTO the tiled ones from
 * a size on (cuda_ops.cu, ATT_TILE_MIN_T), PLAIN always the one-block-per-query kernel (the
 * reference the tiled ones are tested against), TILED the float32 tiled one and TC the tensor-core
 * one where it applies (head_dim <= 128; else TILED), at any size they cover. For tests and
 * benchmarks; a backend starts at AUTO. */
typedef enum sl_cuda_att_path {
    SL_CUDA_ATT_AUTO = 0,
    SL_CUDA_ATT_PLAIN = 1,
    SL_CUDA_ATT_TILED = 2,
    SL_CUDA_ATT_TC = 3,
} sl_cuda_att_path;
void sl_cuda_set_attention_path(const sl_backend *be, sl_cuda_att_path path);

/* The paths of a Q4 prefill product y[T, N] = x[T, K] . W^T (+ bias), for tests and benchmarks:
 * IMMA quant.h's int8 formula on int8 tensor cores (what matmul runs for Q4 at T > 4 unless
 * sl_cuda_params.int4_float_act), IMMA_REF its plain reference (the same bits), BF16 float x on
 * BF16 tensor cores (what matmul runs with int4_float_act). */
typedef enum sl_cuda_q4_path {
    SL_CUDA_Q4_IMMA = 0,
    SL_CUDA_Q4_IMMA_REF,
    SL_CUDA_Q4_BF16,
} sl_cuda_q4_path;

/* The int8 GEMM's tile height in tokens (128, 64 or 32) forced for every launch, or 0: picked
 * per launch (cuda_imma.cu, imma_pick). For benchmarks; the bits do not depend on it. */
void sl_cuda_set_imma_tile(const sl_backend *be, int tokens);

/* One product by path (whatever the backend's flags), any T >= 1; 0 when the path does not take
 * it (K % 64 or 32, alignment, the reference's K <= 32768; nothing queued). */
int sl_cuda_q4_prefill(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                       const sl_tensor *bias, int32_t T, sl_cuda_q4_path path);
/* A batch of n products of one K (items of T = 0 take nothing), as matmul_batch launches it on
 * that path (the reference: one product after another); 0 when the path does not take them. */
int sl_cuda_q4_prefill_batch(const sl_backend *be, float *const *y, const float *const *x,
                             const sl_tensor *const *w, const int32_t *T, int32_t n,
                             sl_cuda_q4_path path);

#ifdef __cplusplus
}
#endif

#endif /* SL_CUDA_BACKEND_H */
