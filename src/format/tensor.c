/* Dtype table and tensor formatting. */
#include "format/tensor.h"

#include <stdio.h>
#include <string.h>

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
    [SL_DTYPE_Q4] = {"Q4", 0},
};

size_t sl_dtype_size(sl_dtype t) {
    return (unsigned)t < SL_DTYPE_COUNT ? dtype_table[t].size : 0;
}

const char *sl_dtype_name(sl_dtype t) {
    return (unsigned)t < SL_DTYPE_COUNT ? dtype_table[t].name : "?";
}

size_t sl_row_bytes(sl_dtype t, int64_t cols) {
    if (t == SL_DTYPE_Q4) return (size_t)(cols + 1) / 2;
    return (size_t)cols * sl_dtype_size(t);
}

sl_dtype sl_dtype_from_name(const char *s) {
    for (int i = 1; i <= SL_DTYPE_F8_E5M2; i++) /* safetensors names only */
        if (strcmp(s, dtype_table[i].name) == 0) return (sl_dtype)i;
    return SL_DTYPE_NONE;
}

const char *sl_shape_str(const sl_tensor *t, char *buf, size_t len) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}
