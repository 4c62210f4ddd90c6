/*
 * ggml's block formats (GGUF weights): dequantisation and a simple quantiser.
 *
 * An [N, K] tensor of a block type holds each row as K / B self-contained blocks of B elements
 * (B = sl_dtype_block_size: 32 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL; 256 for the
 * K-quants and IQ4_XS), laid out byte for byte as ggml defines them (ggml-common.h); scales live
 * inside the blocks, so the tensor's scales/biases are NULL. blocks.c draws each layout.
 *
 * sl_dequant_row is the reference: float32 arithmetic in the order ggml's dequantize_row_* uses,
 * so its floats are bit for bit ggml's (tests/unit/test_blocks.c checks them against floats that
 * ggml's own code produced, tools/lab/ggml_ref_blocks.c).
 */
#ifndef SL_KERNEL_BLOCKS_H
#define SL_KERNEL_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "format/tensor.h"
#include "kernels/ops.h"
#include "kernels/fp8.h"
#include "kernels/quant.h"

/* Widens n elements (a multiple of the block size) of blocks at src into dst. */
void sl_dequant_row(sl_dtype t, const void *src, float *dst, int64_t n);

/* sl_dequant_row through the SIMD path of isa (cpu_blocks.c): the same floats, bit for bit. */
void sl_dequant_row_isa(sl_isa isa, sl_dtype t, const void *src, float *dst, int64_t n);

/* y[T, N] = x[T, K] . W^T for W [N, K] of a block type, on the CPU (cpu_blocks.c); the contract
 * of sl_matmul_cpu: each output's arithmetic depends only on K, the ISA and the path below (on
 * one machine: K and the ISA), never on T, the tile or the thread. */
void sl_matmul_blocks_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                          int32_t T);
/* sl_matmul_blocks_cpu with a choice of path (quant.h's sl_qpath), for tests and benchmarks:
 * FLOAT keeps x in float32 (cpu_blocks.c); INT8 rounds x to int8 per 32 columns once per call and
 * multiplies in integers (cpu_blocks_int8.c, with its error bound), for the types
 * sl_blocks_int8_type names on a backend where sl_blocks_int8_available, else FLOAT. AUTO (what
 * sl_matmul_blocks_cpu does) is INT8 wherever it is available. */
void sl_matmul_blocks_cpu_path(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                               int32_t T, sl_qpath path);
/* The types with an int8 path: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. */
int sl_blocks_int8_type(sl_dtype t);
/* Whether SL_QPATH_INT8 runs w on this backend: an int8 type, AVX2 or AVX-512 (the VNNI kernel
 * where the CPU has it), rows of at most 40960 columns. */
int sl_blocks_int8_available(const sl_backend *be, const sl_tensor *w);
/* Whether this backend takes the int8 path for those types at all (AVX2 or better). */
int sl_blocks_int8_on(const sl_backend *be);
/* The int8 path itself (sl_blocks_int8_available must hold). */
void sl_matmul_blocks_int8_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                               int32_t T);
/* One row of K elements of blocks dotted with x in the scalar reference order: blocks widened by
 * sl_dequant_row, one float accumulator over k. */
float sl_dot_blocks_ref(sl_dtype t, const void *row, const float *x, int64_t K);

/* Quantises n elements (a multiple of the block size) of src into blocks at dst: a plain
 * round-to-nearest encoder (per (sub-)block scale from the range, no search), not ggml's
 * quantiser and not meant for models; for test weights, which only need to be valid blocks.
 * Non-finite inputs count as 0; scales are finite. */
void sl_quant_row_simple(sl_dtype t, const float *src, void *dst, int64_t n);

/* The 16 values of ggml's non-linear 4-bit grids: IQ4_NL / IQ4_XS (kvalues_iq4nl), and
 * MXFP4's e2m1 values doubled (so that the shared scale is 2^(e - 128), see blocks.c). */
extern const int8_t sl_kvalues_iq4nl[16];
extern const int8_t sl_kvalues_mxfp4[16];

/* MXFP4's scale: half of the E8M0 value 2^(e - 127), as float bits (exact for every e). */
static inline float sl_e8m0_half(uint8_t e) {
    const uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* SL_KERNEL_BLOCKS_H */
