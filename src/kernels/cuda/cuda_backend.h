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

/* Which kernel the attention op runs for a prompt without a selection: AUTO the tiled one from
 * a size on (cuda_ops.cu, ATT_TILE_MIN_T), PLAIN always the one-block-per-query kernel (the
 * reference the tiled one is tested against), TILED the tiled one at any size it covers. For
 * tests and benchmarks; a backend starts at AUTO. */
typedef enum sl_cuda_att_path {
    SL_CUDA_ATT_AUTO = 0,
    SL_CUDA_ATT_PLAIN = 1,
    SL_CUDA_ATT_TILED = 2,
} sl_cuda_att_path;
void sl_cuda_set_attention_path(const sl_backend *be, sl_cuda_att_path path);

#ifdef __cplusplus
}
#endif

#endif /* SL_CUDA_BACKEND_H */
