/* Placeholder: quantised kernels (being written). */
#include "kernels/quant.h"

void sl_quantize_row(sl_dtype dt, const float *w, int64_t K, uint8_t *q, uint16_t *scales,
                     uint16_t *biases) {
    (void)dt, (void)w, (void)K, (void)q, (void)scales, (void)biases;
    SL_ASSERT(0 && "not yet");
}
void sl_dequantize_row(const sl_tensor *w, int64_t n, float *out) {
    (void)w, (void)n, (void)out;
    SL_ASSERT(0 && "not yet");
}
void sl_matmul_quant_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                         int32_t T) {
    (void)be, (void)y, (void)x, (void)w, (void)T;
    SL_ASSERT(0 && "not yet");
}
