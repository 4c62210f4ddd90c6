/* Dtype table and tensor formatting. */
#include "format/tensor.h"

#include <math.h>
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
    [SL_DTYPE_IQ4_NL] = {"IQ4_NL", 32, 18},
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
    if (sl_tensor_is_fp8(t)) return sl_fp8_scale_bytes(t);
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

/* ------------------------------------------------------------------ FP8 */

/* Code b's value: sign b >> 7; e = (b >> 3) & 15, m = b & 7; 2^(e-7) (1 + m/8) for e > 0,
 * 2^-6 m/8 for e == 0; 0x7f and 0xff are NaN (e4m3fn has no infinities). */
/* clang-format off */
const float sl_fp8_e4m3_table[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, NAN,
};
/* clang-format on */

uint8_t sl_f32_to_fp8_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    /* The positive codes 0 .. 0x7e increase with their value: the last one not above a, then
     * whichever of it and the next is nearer (ties to the even code, the even mantissa). */
    int lo = 0;
    while (lo < 0x7e && sl_fp8_e4m3_table[lo + 1] <= a)
        lo++;
    if (lo < 0x7e) {
        const float dl = a - sl_fp8_e4m3_table[lo], dh = sl_fp8_e4m3_table[lo + 1] - a;
        if (dh < dl || (dh == dl && (lo & 1))) lo++;
    }
    return (uint8_t)(sign | lo);
}

size_t sl_fp8_scale_bytes(const sl_tensor *t) {
    if (!sl_tensor_is_fp8(t) || t->ndim < 2) return 0;
    const int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    const int64_t mats = t->ndim == 3 ? t->shape[0] : 1;
    const int64_t sr = (t->rphase + rows + t->brows - 1) / t->brows;
    return (size_t)(mats * sr * ((cols + t->group - 1) / t->group)) * sizeof(float);
}

sl_tensor sl_fp8_rows(const sl_tensor *t, int64_t row0, int64_t rows) {
    sl_tensor v = *t;
    const int64_t cols = t->shape[1], p = t->rphase + row0;
    v.data = (const uint8_t *)t->data + (size_t)row0 * (size_t)cols;
    v.shape[0] = rows;
    v.nbytes = (size_t)rows * (size_t)cols;
    v.scales = (const float *)t->scales +
               (size_t)(p / t->brows) * (size_t)((cols + t->group - 1) / t->group);
    v.rphase = (int32_t)(p % t->brows);
    return v;
}
