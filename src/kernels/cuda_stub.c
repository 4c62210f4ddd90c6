/*
 * The CUDA backend's entry points when sluice is built without CUDA (the
 * default `make`; `make CUDA=1` compiles src/kernels/cuda/ instead).
 */
#include "kernels/ops.h"

sl_status sl_backend_cuda_init(sl_backend *be, int32_t gpu, const sl_cuda_params *p,
                               sl_error *err) {
    (void)be, (void)gpu, (void)p;
    return sl_fail(err, SL_ERR_UNSUPPORTED,
                   "this sluice was built without CUDA (rebuild with make CUDA=1)");
}

void sl_backend_cuda_free(sl_backend *be) {
    (void)be;
}

sl_status sl_backend_cuda_mem(int32_t gpu, int64_t *free_bytes, int64_t *total_bytes,
                              sl_error *err) {
    (void)gpu;
    *free_bytes = *total_bytes = 0;
    return sl_fail(err, SL_ERR_UNSUPPORTED,
                   "this sluice was built without CUDA (rebuild with make CUDA=1)");
}

int sl_backend_cuda_available(void) {
    return 0;
}
