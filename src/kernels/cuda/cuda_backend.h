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

#ifdef __cplusplus
}
#endif

#endif /* SL_CUDA_BACKEND_H */
