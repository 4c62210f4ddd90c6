/*
 * ggml's block types (kernels/blocks.h): sl_dequant_row against floats ggml's own code made
 * (tests/unit/data/ggml_blocks.bin, written by tools/lab/ggml_ref_blocks.c: rows quantised by
 * ggml's quantiser, hard cases and random bytes), bit for bit; the test quantiser's round trip.
 */
#include <strings.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "test.h"

static const sl_dtype block_types[] = {
    SL_DTYPE_Q8_0, SL_DTYPE_Q4_0, SL_DTYPE_Q4_1, SL_DTYPE_Q5_0, SL_DTYPE_Q5_1,   SL_DTYPE_Q2_K,
    SL_DTYPE_Q3_K, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K, SL_DTYPE_Q6_K, SL_DTYPE_IQ4_XS, SL_DTYPE_MXFP4,
};
#define N_BLOCK_TYPES (int)(sizeof block_types / sizeof block_types[0])

static sl_dtype type_of_name(const char *name) {
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        if (strcasecmp(sl_dtype_name(block_types[i]), name) == 0) return block_types[i];
    return SL_DTYPE_NONE;
}

/* Same bits, or both NaN (a NaN's payload is not part of the format). */
static int same_float(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

TEST(test_blocks_dequant_ggml) {
    char path[512];
    snprintf(path, sizeof path, "%s/../unit/data/ggml_blocks.bin", test_fixtures);
    size_t n = 0;
    uint8_t *buf = read_all(path, &n);
    CHECKF(buf && n >= 12 && memcmp(buf, "SLGGMLB1", 8) == 0, "%s: missing or not a block file",
           path);
    if (!buf || n < 12) {
        free(buf);
        return;
    }
    const uint32_t count = rd32(buf + 8);
    CHECKF(count == (uint32_t)N_BLOCK_TYPES, "%u records, want one per block type", count);
    size_t off = 12;
    int seen[SL_DTYPE_COUNT] = {0};
    for (uint32_t r = 0; r < count; r++) {
        if (off + 20 > n) break;
        char name[9] = {0};
        memcpy(name, buf + off, 8);
        const uint32_t K = rd32(buf + off + 8), rows = rd32(buf + off + 12),
                       rb = rd32(buf + off + 16);
        off += 20;
        const sl_dtype t = type_of_name(name);
        const size_t need = (size_t)rows * rb + (size_t)rows * K * sizeof(float);
        CHECKF(t != SL_DTYPE_NONE && off + need <= n, "record %u (%s) malformed", r, name);
        if (t == SL_DTYPE_NONE || off + need > n) break;
        CHECKF(rb == sl_row_bytes(t, K), "%s: row of %u is %u bytes, sluice says %zu", name, K, rb,
               sl_row_bytes(t, K));
        seen[t] = 1;
        const uint8_t *q = buf + off;
        const uint8_t *want = q + (size_t)rows * rb;
        float *got = malloc((size_t)K * sizeof(float));
        for (uint32_t i = 0; i < rows; i++) {
            sl_dequant_row(t, q + (size_t)i * rb, got, K);
            int bad = 0;
            for (uint32_t k = 0; k < K && !bad; k++) {
                float w;
                memcpy(&w, want + ((size_t)i * K + k) * sizeof(float), sizeof w);
                if (!same_float(got[k], w)) {
                    CHECKF(0, "%s row %u [%u]: got %.9g (0x%08x) want %.9g", name, i, k, got[k],
                           *(const uint32_t *)&got[k], w);
                    bad = 1;
                }
            }
        }
        free(got);
        off += need;
    }
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        CHECKF(seen[block_types[i]], "%s: no reference rows", sl_dtype_name(block_types[i]));
    free(buf);
}

static uint64_t rng_state = 0x5851f42d4c957f2dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* The test quantiser gives valid blocks whose values are near the input: the relative rms error
 * of a round trip stays within what the type's bits allow (with room: it searches nothing). */
TEST(test_blocks_quant_simple) {
    enum { K = 1024 };
    /* rms error / rms of the input, for uniform input: about step / sqrt(12) */
    const struct {
        sl_dtype t;
        double tol;
    } cases[] = {
        {SL_DTYPE_Q8_0, 0.01}, {SL_DTYPE_Q4_0, 0.15},   {SL_DTYPE_Q4_1, 0.08},
        {SL_DTYPE_Q5_0, 0.07}, {SL_DTYPE_Q5_1, 0.04},   {SL_DTYPE_Q2_K, 0.45},
        {SL_DTYPE_Q3_K, 0.30}, {SL_DTYPE_Q4_K, 0.10},   {SL_DTYPE_Q5_K, 0.05},
        {SL_DTYPE_Q6_K, 0.04}, {SL_DTYPE_IQ4_XS, 0.12}, {SL_DTYPE_MXFP4, 0.25},
    };
    float x[K], y[K];
    uint8_t q[K * 2];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const sl_dtype t = cases[c].t;
        for (int shape = 0; shape < 3; shape++) {
            for (int k = 0; k < K; k++) /* uniform; offset (mins); scales varying by 1e4 */
                x[k] = shape == 0   ? frand()
                       : shape == 1 ? 2.0f + frand()
                                    : frand() * powf(10.0f, (float)((k / 64) % 5 - 2));
            memset(q, 0xA5, sizeof q);
            sl_quant_row_simple(t, x, q, K);
            sl_dequant_row(t, q, y, K);
            /* error relative to the rms of each 256 (a super-block shares one scale) */
            double worst = 0;
            for (int b = 0; b < K; b += 256) {
                double e = 0, s = 0;
                for (int k = b; k < b + 256; k++) {
                    CHECKF(isfinite(y[k]), "%s shape %d [%d]: %g", sl_dtype_name(t), shape, k,
                           y[k]);
                    e += ((double)y[k] - x[k]) * ((double)y[k] - x[k]);
                    s += (double)x[k] * x[k];
                }
                worst = fmax(worst, sqrt(e / s));
            }
            const double tol = cases[c].tol * (shape == 2 ? 2 : 1);
            CHECKF(worst <= tol, "%s shape %d: relative rms error %.3g > %.3g", sl_dtype_name(t),
                   shape, worst, tol);
        }
        /* zeros and non-finite input: finite, zero output */
        for (int k = 0; k < K; k++)
            x[k] = k % 3 == 0 ? NAN : k % 3 == 1 ? INFINITY : 0.0f;
        sl_quant_row_simple(t, x, q, K);
        sl_dequant_row(t, q, y, K);
        for (int k = 0; k < K; k++)
            CHECKF(y[k] == 0, "%s: non-finite input [%d] -> %g", sl_dtype_name(t), k, y[k]);
    }
}
