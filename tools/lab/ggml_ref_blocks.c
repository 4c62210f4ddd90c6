/*
 * Reference blocks from llama.cpp's own code, for tests/unit/test_blocks.c: for each of the 13
 * ggml block types sluice reads, rows of floats quantised by ggml's quantiser
 * (ggml_quantize_chunk, no importance matrix) plus one row of random bytes, and what ggml's
 * dequantiser (ggml_get_type_traits(type)->to_float) makes of each row. sl_dequant_row must give
 * the same floats bit for bit. Not built by make; its output is committed as
 * tests/unit/data/ggml_blocks.bin.
 *
 * Build and run (llama.cpp's build at /tmp/nlc-bundle/build):
 *
 *   cc -O2 -std=c11 -o /tmp/ggml_ref_blocks tools/lab/ggml_ref_blocks.c \
 *       -I/tmp/nlc-bundle/ggml/include -L/tmp/nlc-bundle/build/bin -lggml-base \
 *       -Wl,-rpath,/tmp/nlc-bundle/build/bin -lm
 *   /tmp/ggml_ref_blocks tests/unit/data/ggml_blocks.bin
 *
 * File format (little-endian):
 *   "SLGGMLB1"  magic, 8 bytes
 *   u32         number of records (one per type)
 *   record:     char name[8] (ggml's type name, NUL-padded), u32 n (elements per row),
 *               u32 rows, u32 row_bytes, rows * row_bytes bytes of blocks,
 *               rows * n float32: ggml's dequantisation of each row
 *
 * Rows of each type (n = 256):
 *   0 uniform in [-1, 1)           4 huge: up to 1e7, so f16 scales overflow (Inf, NaN out)
 *   1 magnitudes 1e-3 .. 1e3       5 tiny: ~1e-7, subnormal f16 scales, or zero
 *   2 all zeros                    6 positive, offset 3 (mins), with one outlier
 *   3 constant 0.37, then -2.5     7 random bytes: every field random (negative, NaN scales)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#define N    256
#define ROWS 8

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float uni(void) { /* [-1, 1) */
    return (float)((next() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void make_row(int r, float *x) {
    for (int i = 0; i < N; i++) {
        switch (r) {
        case 0: x[i] = uni(); break;
        case 1: x[i] = uni() * powf(10.0f, (float)((i / 32) % 7 - 3)); break;
        case 2: x[i] = 0.0f; break;
        case 3: x[i] = i < N / 2 ? 0.37f : -2.5f; break;
        case 4: x[i] = uni() * (i % 64 < 32 ? 1e7f : 3e4f); break;
        case 5: x[i] = i < N / 2 ? uni() * 1e-7f : 0.0f; break;
        case 6: x[i] = 3.0f + uni() + (i == 77 ? 40.0f : 0.0f); break;
        default: x[i] = 0.0f;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.bin\n", argv[0]);
        return 2;
    }
    static const enum ggml_type types[] = {
        GGML_TYPE_Q8_0,   GGML_TYPE_Q4_0,  GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
        GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,  GGML_TYPE_Q4_K,   GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4, GGML_TYPE_IQ4_NL, /* last: the records before it keep
                                                                their random bytes */
    };
    const uint32_t count = sizeof types / sizeof types[0];
    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fwrite("SLGGMLB1", 1, 8, f);
    fwrite(&count, 4, 1, f);
    float x[N], y[N * ROWS];
    for (uint32_t i = 0; i < count; i++) {
        const enum ggml_type t = types[i];
        const uint32_t rb = (uint32_t)ggml_row_size(t, N), n = N, rows = ROWS;
        uint8_t *q = calloc(ROWS, rb);
        for (int r = 0; r < ROWS; r++) {
            if (r == ROWS - 1) {
                for (uint32_t j = 0; j < rb; j++)
                    q[r * rb + j] = (uint8_t)(next() >> 56);
            } else {
                make_row(r, x);
                ggml_quantize_chunk(t, x, q + r * rb, 0, 1, N, NULL);
            }
            ggml_get_type_traits(t)->to_float(q + r * rb, y + r * N, N);
        }
        char name[8] = {0};
        strncpy(name, ggml_type_name(t), sizeof name - 1);
        fwrite(name, 1, 8, f);
        fwrite(&n, 4, 1, f);
        fwrite(&rows, 4, 1, f);
        fwrite(&rb, 4, 1, f);
        fwrite(q, 1, (size_t)ROWS * rb, f);
        fwrite(y, sizeof(float), (size_t)ROWS * N, f);
        free(q);
        printf("%-7s %u rows of %u: %u bytes each\n", name, rows, n, rb);
    }
    return fclose(f) == 0 ? 0 : 1;
}
