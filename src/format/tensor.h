/*
 * A tensor as the loader sees it: a typed, shaped view of bytes that live
 * elsewhere (an mmap of a checkpoint file, or one allocation). Never owns data.
 */
#ifndef SL_TENSOR_H
#define SL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum sl_dtype {
    SL_DTYPE_NONE = 0, /* absent tensor */
    SL_DTYPE_F32,
    SL_DTYPE_F16,
    SL_DTYPE_BF16,
    SL_DTYPE_F64,
    SL_DTYPE_I64,
    SL_DTYPE_I32,
    SL_DTYPE_I16,
    SL_DTYPE_I8,
    SL_DTYPE_U8,
    SL_DTYPE_BOOL,
    SL_DTYPE_F8_E4M3,
    SL_DTYPE_F8_E5M2,
    /* Group-wise affine quantisation as in MLX (sluice's packs, MLX checkpoints): groups of
     * sl_tensor.group (SL_QGROUP in packs) along a row, w = q * scale + bias with one scale and
     * bias per group, BF16 unless sl_tensor.sdtype says F16 or F32. */
    SL_DTYPE_Q8, /* one byte per weight, q in [0, 255] */
    SL_DTYPE_Q4, /* two per byte, low nibble first, q in [0, 15]; rows padded to whole bytes */
    /* ggml's block formats (GGUF files): a row is a whole number of self-contained blocks
     * (scales inside), laid out as ggml defines them (ggml-common.h); sl_dtype_block_size
     * elements in sl_dtype_block_bytes bytes. */
    SL_DTYPE_Q8_0,
    SL_DTYPE_Q4_0,
    SL_DTYPE_Q4_1,
    SL_DTYPE_Q5_0,
    SL_DTYPE_Q5_1,
    SL_DTYPE_Q2_K,
    SL_DTYPE_Q3_K,
    SL_DTYPE_Q4_K,
    SL_DTYPE_Q5_K,
    SL_DTYPE_Q6_K,
    SL_DTYPE_IQ4_XS,
    SL_DTYPE_MXFP4,
    SL_DTYPE_IQ4_NL, /* after MXFP4: the block types stay one range */
    SL_DTYPE_U32,    /* safetensors; MLX's packed codes before binding makes them Q4/Q8 */
    SL_DTYPE_COUNT
} sl_dtype;

#define SL_QGROUP 64

#define SL_MAX_DIMS 8

typedef struct sl_tensor {
    const char *name; /* owned by whoever owns the bytes */
    sl_dtype dtype;
    int32_t ndim;
    int64_t shape[SL_MAX_DIMS];
    const void *data; /* NULL when absent */
    size_t nbytes;    /* bytes at data */
    /* Q8/Q4: [rows, ceil(cols / group)] of sdtype each, row-major (a pack's: groups of
     * SL_QGROUP, BF16; an MLX checkpoint's: its own).
     * F8_E4M3 (Hugging Face's block-wise FP8): scales is the checkpoint's weight_scale_inv,
     * [ceil((rphase + rows) / brows), ceil(cols / group)] F32 row-major (sdtype F32), biases
     * NULL; w[r][c] = fp8[r][c] * scales[(rphase + r) / brows][c / group] (the "inverse" scale
     * multiplies). */
    const void *scales;
    const void *biases;
    int32_t group; /* elements per scale group along a row (FP8: columns per block); 0: SL_QGROUP */
    int32_t brows; /* F8_E4M3 block scales: rows per scale block */
    sl_dtype sdtype; /* dtype of scales/biases; SL_DTYPE_NONE means BF16 */
    /* F8_E4M3 row views: rows of the view's first scale block that lie above its row 0 (a
     * view starting mid-block, e.g. the up half of a fused gate_up split at row I); 0 for a
     * whole tensor. scales then points at that first block's row of scales. */
    int32_t rphase;
} sl_tensor;

/* Bytes per element; 0 for NONE, for Q4 (half a byte) and for block types: use sl_row_bytes. */
size_t sl_dtype_size(sl_dtype t);
/* Bytes at t->scales (and as many at t->biases when it has them): 0 for types without; F8_E4M3
 * block scales: sl_fp8_scale_bytes. */
size_t sl_tensor_scale_bytes(const sl_tensor *t);
/* Bytes of one row of cols elements (Q4 rounds up to whole bytes; a block type's cols must be
 * a multiple of its block size, which loaders check). */
size_t sl_row_bytes(sl_dtype t, int64_t cols);
/* Block types: elements per block and bytes per block; 1 and sl_dtype_size for the others. */
int32_t sl_dtype_block_size(sl_dtype t);
size_t sl_dtype_block_bytes(sl_dtype t);
static inline int sl_dtype_is_block(sl_dtype t) {
    return t >= SL_DTYPE_Q8_0 && t <= SL_DTYPE_IQ4_NL;
}
/* Bits per weight as stored ("4.5" for Q4_0); scales and biases of Q8/Q4 counted. */
double sl_dtype_bits(sl_dtype t);
/* Quantisation groups in a row of cols elements. */
static inline int64_t sl_qgroups(int64_t cols) {
    return (cols + SL_QGROUP - 1) / SL_QGROUP;
}
static inline int sl_dtype_is_quant(sl_dtype t) {
    return t == SL_DTYPE_Q8 || t == SL_DTYPE_Q4;
}
/* F8_E4M3 with block scales (Hugging Face's fine-grained FP8): whether t is one. */
static inline int sl_tensor_is_fp8(const sl_tensor *t) {
    return t->dtype == SL_DTYPE_F8_E4M3 && t->scales != NULL;
}
/* F8_E4M3: bytes of block scales at t->scales (F32, whole scale rows from the view's first
 * block through its last); 0 for other types. */
size_t sl_fp8_scale_bytes(const sl_tensor *t);
/* F8_E4M3: the view of rows [row0, row0 + rows) of a 2-D tensor, scales and row phase
 * included (data, shape and nbytes as for any 1-byte type). */
sl_tensor sl_fp8_rows(const sl_tensor *t, int64_t row0, int64_t rows);
/* e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals; no infinities;
 * 0x7f and 0xff are NaN) as float, exactly: the 256 values. */
extern const float sl_fp8_e4m3_table[256];
static inline float sl_fp8_e4m3_to_f32(uint8_t b) {
    return sl_fp8_e4m3_table[b];
}
/* The nearest e4m3fn code (ties to even), saturating at +-448; NaN -> 0x7f. */
uint8_t sl_f32_to_fp8_e4m3(float f);

/* A Q8/Q4 tensor's group size, groups per row of cols, scale dtype and bytes of one scale. */
static inline int32_t sl_tensor_group(const sl_tensor *t) {
    return t->group > 0 ? t->group : SL_QGROUP;
}
static inline int64_t sl_tensor_qgroups(const sl_tensor *t, int64_t cols) {
    const int64_t g = sl_tensor_group(t);
    return (cols + g - 1) / g;
}
static inline sl_dtype sl_tensor_sdtype(const sl_tensor *t) {
    return t->sdtype == SL_DTYPE_NONE ? SL_DTYPE_BF16 : t->sdtype;
}
/* Bytes of the scales (as many again for the biases) of rows rows of a Q8/Q4 tensor. */
static inline size_t sl_tensor_qscale_bytes(const sl_tensor *t, int64_t rows) {
    const int64_t cols = t->shape[t->ndim - 1];
    const size_t ss = sl_tensor_sdtype(t) == SL_DTYPE_F32 ? 4 : 2;
    return (size_t)rows * (size_t)sl_tensor_qgroups(t, cols) * ss;
}
/* Whether a Q8/Q4 tensor has sluice's pack layout: groups of SL_QGROUP, BF16 scales. */
static inline int sl_tensor_qplain(const sl_tensor *t) {
    return sl_tensor_group(t) == SL_QGROUP && sl_tensor_sdtype(t) == SL_DTYPE_BF16;
}
/* Safetensors spelling ("BF16"), ggml's for block types ("Q4_K"); "?" for NONE. */
const char *sl_dtype_name(sl_dtype t);
/* Parses the safetensors spelling; SL_DTYPE_NONE if unknown. */
sl_dtype sl_dtype_from_name(const char *s);

/* Writes "[2, 3, 4]" into buf. */
const char *sl_shape_str(const sl_tensor *t, char *buf, size_t len);

static inline int sl_tensor_present(const sl_tensor *t) {
    return t->data != NULL;
}

#endif /* SL_TENSOR_H */
