/* Dtype table and tensor formatting. */
#include "format/tensor.h"

#include <stdio.h>
#include <string.h>

/* Block types: {name, elements per block, bytes per block}, from ggml's block layouts
 * (ggml-common.h), e.g. Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
 * nibbles = 144 bytes per 256 weights. */
static const struct {
    const char *name;
    int32_t block;
    size_t bytes;
} block_table[SL_DTYPE_COUNT] = {
    [SL_DTYPE_Q8_0] = {"Q8_0", 32, 34},       [SL_DTYPE_Q4_0] = {"Q4_0", 32, 18},
    [SL_DTYPE_Q4_1] = {"Q4_1", 32, 20},       [SL_DTYPE_Q5_0] = {"Q5_0", 32, 22},
    [SL_DTYPE_Q5_1] = {"Q5_1", 32, 24},       [SL_DTYPE_Q2_K] = {"Q2_K", 256, 84},
    [SL_DTYPE_Q3_K] = {"Q3_K", 256, 110},     [SL_DTYPE_Q4_K] = {"Q4_K", 256, 144},
    [SL_DTYPE_Q5_K] = {"Q5_K", 256, 176},     [SL_DTYPE_Q6_K] = {"Q6_K", 256, 210},
    [SL_DTYPE_IQ4_XS] = {"IQ4_XS", 256, 136}, [SL_DTYPE_MXFP4] = {"MXFP4", 32, 17},
};

static const struct {
    const char *name;
    size_t size;
} dtype_table[SL_DTYPE_COUNT] = {
    [SL_DTYPE_NONE] = {"?", 0},          [SL_DTYPE_F32] = {"F32", 4},
    [SL_DTYPE_F16] = {"F16", 2},         [SL_DTYPE_BF16] = {"BF16", 2},
    [SL_DTYPE_F64] = {"F64", 8},         [SL_DTYPE_I64] = {"I64", 8},
    [SL_DTYPE_I32] = {"I32", 4},         [SL_DTYPE_I16] = {"I16", 2},
    [SL_DTYPE_I8] = {"I8", 1},           [SL_DTYPE_U8] = {"U8", 1},
    [SL_DTYPE_BOOL] = {"BOOL", 1},       [SL_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [SL_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [SL_DTYPE_Q8] = {"Q8", 1},
    [SL_DTYPE_Q4] = {"Q4", 0},           [SL_DTYPE_U32] = {"U32", 4},
};

size_t sl_dtype_size(sl_dtype t) {
    return (unsigned)t < SL_DTYPE_COUNT ? dtype_table[t].size : 0;
}

const char *sl_dtype_name(sl_dtype t) {
    if (sl_dtype_is_block(t)) return block_table[t].name;
    return (unsigned)t < SL_DTYPE_COUNT ? dtype_table[t].name : "?";
}

int32_t sl_dtype_block_size(sl_dtype t) {
    return sl_dtype_is_block(t) ? block_table[t].block : 1;
}

size_t sl_dtype_block_bytes(sl_dtype t) {
    return sl_dtype_is_block(t) ? block_table[t].bytes : sl_dtype_size(t);
}

double sl_dtype_bits(sl_dtype t) {
    if (sl_dtype_is_block(t)) return 8.0 * (double)block_table[t].bytes / block_table[t].block;
    if (t == SL_DTYPE_Q4) return 4.0 + 32.0 / SL_QGROUP;
    if (t == SL_DTYPE_Q8) return 8.0 + 32.0 / SL_QGROUP;
    return 8.0 * (double)sl_dtype_size(t);
}

size_t sl_tensor_scale_bytes(const sl_tensor *t) {
    if (!sl_dtype_is_quant(t->dtype) || t->ndim < 1) return 0;
    int64_t rows = 1;
    for (int32_t d = 0; d + 1 < t->ndim; d++)
        rows *= t->shape[d];
    return sl_tensor_qscale_bytes(t, rows); /* its group size and scale dtype */
}

size_t sl_row_bytes(sl_dtype t, int64_t cols) {
    if (t == SL_DTYPE_Q4) return (size_t)(cols + 1) / 2;
    if (sl_dtype_is_block(t)) return (size_t)(cols / block_table[t].block) * block_table[t].bytes;
    return (size_t)cols * sl_dtype_size(t);
}

sl_dtype sl_dtype_from_name(const char *s) {
    for (int i = 1; i <= SL_DTYPE_F8_E5M2; i++) /* safetensors names only */
        if (strcmp(s, dtype_table[i].name) == 0) return (sl_dtype)i;
    return strcmp(s, "U32") == 0 ? SL_DTYPE_U32 : SL_DTYPE_NONE;
}

const char *sl_shape_str(const sl_tensor *t, char *buf, size_t len) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}
