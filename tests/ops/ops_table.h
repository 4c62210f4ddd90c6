/*
 * The op table: every op of sl_ops (src/kernels/ops.h) on one backend against a plain reference
 * (scalar code in double here, over weights widened by sl_to_f32 / sl_dequantize_row /
 * sl_dequant_row), one row
 * per (op, case), in the spirit of llama.cpp's test-backend-ops. One source, compiled into the
 * unit tests (the CPU backend at every ISA) and into test_cuda (the CUDA backend).
 *
 * Each case builds its inputs on the host, copies them to backend memory, fills every output
 * (plus a tail past its end) with NaN, runs the op, reads the outputs back and compares the whole
 * buffer: elements the op must not write stay NaN, the others must be finite and within the
 * row's tolerance of the reference, measured against max(|ref|, rms(ref)) (tolerance 0: equal
 * to the float the reference rounds to). Optional ops the backend lacks are skipped.
 */
#ifndef SL_OPS_TABLE_H
#define SL_OPS_TABLE_H

#include <stdio.h>

#include "kernels/ops.h"

typedef struct ops_table_params {
    /* The backend's Q4 matmuls round the activations to int8 (quant.h's INT8 path; CUDA's
     * SLUICE_CUDA_Q4X): Q4 products are checked within that rounding, not float's. */
    int q4_int8;
    /* The backend's Q8 matmuls round the activations to int8 (the CPU's INT8 path, VNNI). */
    int q8_int8;
    /* The backend runs ggml's block types (Q8_0 .. MXFP4, issue 26): their rows run; else they
     * are skipped. */
    int block_types;
    /* The backend's matmuls over Q8_0, Q4_0, Q4_K, Q5_K and Q6_K round the activations to int8
     * (blocks.h's INT8 path): those products are checked within that rounding. */
    int block_int8;
    const char *filter; /* NULL, or run only ops whose name contains it */
    FILE *log;          /* one line per op; failures are always printed (to stderr) */
} ops_table_params;

/* Runs the table on be; returns the number of failing cases (0: all passed). */
int ops_table_run(const sl_backend *be, const ops_table_params *p);

#endif /* SL_OPS_TABLE_H */
