/*
 * ggml's block types (kernels/blocks.h): sl_dequant_row against floats ggml's own code made
 * (tests/unit/data/ggml_blocks.bin, written by tools/lab/ggml_ref_blocks.c: rows quantised by
 * ggml's quantiser, hard cases and random bytes), bit for bit; the test quantiser's round trip.
 */
#include <float.h>
#include <strings.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "test.h"

static const sl_dtype block_types[] = {
    SL_DTYPE_Q8_0,   SL_DTYPE_Q4_0,  SL_DTYPE_Q4_1,   SL_DTYPE_Q5_0, SL_DTYPE_Q5_1,
    SL_DTYPE_Q2_K,   SL_DTYPE_Q3_K,  SL_DTYPE_Q4_K,   SL_DTYPE_Q5_K, SL_DTYPE_Q6_K,
    SL_DTYPE_IQ4_XS, SL_DTYPE_MXFP4, SL_DTYPE_IQ4_NL,
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
        {SL_DTYPE_Q8_0, 0.01},   {SL_DTYPE_Q4_0, 0.15},   {SL_DTYPE_Q4_1, 0.08},
        {SL_DTYPE_Q5_0, 0.07},   {SL_DTYPE_Q5_1, 0.04},   {SL_DTYPE_Q2_K, 0.45},
        {SL_DTYPE_Q3_K, 0.30},   {SL_DTYPE_Q4_K, 0.10},   {SL_DTYPE_Q5_K, 0.05},
        {SL_DTYPE_Q6_K, 0.04},   {SL_DTYPE_IQ4_XS, 0.12}, {SL_DTYPE_MXFP4, 0.25},
        {SL_DTYPE_IQ4_NL, 0.12},
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

/* A row of random bytes: every field of every block random (scales NaN, Inf, subnormal, <0). */
static void random_bytes(uint8_t *q, size_t n) {
    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        q[i] = (uint8_t)(rng_state >> 56);
    }
}

/* Every ISA's SIMD widening gives sl_dequant_row's floats bit for bit. */
TEST(test_blocks_dequant_isas) {
    enum { K = 1024 };
    float x[K], ref[K + 1], got[K + 1];
    uint8_t q[K * 2];
    for (int c = 0; c < N_BLOCK_TYPES; c++) {
        const sl_dtype t = block_types[c];
        for (int row = 0; row < 4; row++) {
            if (row < 2) {
                for (int k = 0; k < K; k++)
                    x[k] = frand() * (row ? 1e3f : 1.0f) + (row ? 0.0f : 0.5f);
                sl_quant_row_simple(t, x, q, K);
            } else {
                random_bytes(q, sl_row_bytes(t, K));
            }
            sl_dequant_row(t, q, ref, K);
            for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
                got[K] = 1234.5f;
                sl_dequant_row_isa((sl_isa)isa, t, q, got, K);
                int bad = 0;
                for (int k = 0; k < K && !bad; k++)
                    if (!same_float(got[k], ref[k])) {
                        CHECKF(0, "%s %s row %d [%d]: got %.9g want %.9g", sl_dtype_name(t),
                               sl_isa_name((sl_isa)isa), row, k, got[k], ref[k]);
                        bad = 1;
                    }
                CHECKF(got[K] == 1234.5f, "%s %s: wrote past the row", sl_dtype_name(t),
                       sl_isa_name((sl_isa)isa));
            }
        }
    }
}

/* matmul over block weights on every ISA, float path: within a tight tolerance of the product of
 * sl_dequant_row's floats in double; the scalar path is sl_dot_ref bit for bit; per ISA, a token
 * gives the same bits alone (T = 1) or in a batch (T = 7), on one thread or two. */
TEST(test_blocks_matmul_isas) {
    enum { N = 37, T = 7, KMAX = 768, POISON_N = 5 };
    const float POISON = 1234567.0f;
    for (int c = 0; c < N_BLOCK_TYPES; c++) {
        const sl_dtype t = block_types[c];
        const int32_t Ks[] = {sl_dtype_block_size(t), 512, KMAX};
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const int32_t K = Ks[ki];
            const size_t rb = sl_row_bytes(t, K);
            uint8_t *q = malloc(rb * N);
            float *wf = malloc(sizeof(float) * (size_t)N * K), *x = malloc(sizeof(float) * T * K);
            for (int32_t i = 0; i < N * K; i++)
                wf[i] = frand() * (i % 7 == 0 ? 2.0f : 0.5f) + (c % 2 ? 0.2f : 0.0f);
            for (int32_t n = 0; n < N; n++) {
                sl_quant_row_simple(t, wf + (size_t)n * K, q + n * rb, K);
                sl_dequant_row(t, q + n * rb, wf + (size_t)n * K, K);
            }
            for (int32_t i = 0; i < T * K; i++)
                x[i] = frand();
            const sl_tensor w = {
                .name = "w", .dtype = t, .ndim = 2, .shape = {N, K}, .data = q, .nbytes = rb * N};
            double ref[T * N], rms = 0;
            for (int32_t i = 0; i < T; i++)
                for (int32_t n = 0; n < N; n++) {
                    double s = 0;
                    for (int32_t k = 0; k < K; k++)
                        s += (double)wf[(size_t)n * K + k] * x[(size_t)i * K + k];
                    ref[i * N + n] = s;
                    rms += s * s;
                }
            rms = sqrt(rms / (T * N));
            for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
                float y[T * N + POISON_N], y1[N + POISON_N], y2[T * N + POISON_N];
                sl_backend be, be1;
                sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                sl_backend_cpu_init(&be1, 1, (sl_isa)isa);
                for (int i = 0; i < T * N + POISON_N; i++)
                    y[i] = y2[i] = POISON;
                sl_matmul_blocks_cpu_path(&be, y, x, &w, T, SL_QPATH_FLOAT);
                sl_matmul_blocks_cpu_path(&be1, y2, x, &w, T, SL_QPATH_FLOAT);
                double worst = 0;
                for (int i = 0; i < T * N; i++) {
                    worst = fmax(worst, fabs(y[i] - ref[i]) / fmax(fmax(fabs(ref[i]), rms), 1e-30));
                    CHECKF(same_float(y[i], y2[i]), "%s %s K=%d [%d]: 2 threads %.9g, 1: %.9g",
                           sl_dtype_name(t), sl_isa_name(be.isa), K, i, y[i], y2[i]);
                }
                for (int i = T * N; i < T * N + POISON_N; i++)
                    CHECKF(y[i] == POISON, "%s %s: wrote past y", sl_dtype_name(t),
                           sl_isa_name(be.isa));
                CHECKF(worst < 2e-6 * sqrt(K / 32.0), "%s %s K=%d: rel err %.3g", sl_dtype_name(t),
                       sl_isa_name(be.isa), K, worst);
                for (int32_t i = 0; i < T; i++) {
                    for (int j = 0; j < N + POISON_N; j++)
                        y1[j] = POISON;
                    sl_matmul_blocks_cpu_path(&be, y1, x + (size_t)i * K, &w, 1, SL_QPATH_FLOAT);
                    CHECKF(memcmp(y1, y + i * N, sizeof(float) * N) == 0,
                           "%s %s K=%d token %d: T=1 and T=%d differ", sl_dtype_name(t),
                           sl_isa_name(be.isa), K, i, T);
                    CHECK(y1[N] == POISON);
                }
                if (isa == SL_ISA_SCALAR)
                    for (int32_t i = 0; i < T; i++)
                        for (int32_t n = 0; n < N; n++) {
                            const float d = sl_dot_ref(&w, n, x + (size_t)i * K);
                            CHECKF(same_float(d, y[i * N + n]), "%s K=%d: sl_dot_ref %.9g, %.9g",
                                   sl_dtype_name(t), K, d, y[i * N + n]);
                        }
            }
            free(q), free(wf), free(x);
        }
    }
}

/* The int8 activations of blocks.h / cpu_blocks_int8.c, as specified: per 32 columns d and xq
 * (float32, rint), X the float sum in its lane order; a group with a non-finite X is NaN. */
static void int8_spec(const float *x, int32_t K, float *xd, int8_t *xq, float *X) {
    for (int32_t g = 0; g < K / 32; g++) {
        const float *v = x + 32 * g;
        float l[8], m = 0;
        for (int32_t i = 0; i < 8; i++) /* the lane tree, then simd.h's horizontal sum */
            l[i] = (v[i] + v[8 + i]) + (v[16 + i] + v[24 + i]);
        const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
        const float s = (a0 + a2) + (a1 + a3);
        for (int32_t k = 32 * g; k < 32 * g + 32; k++)
            m = fmaxf(m, fabsf(x[k]));
        const float id = fminf(127.0f / m, FLT_MAX);
        X[g] = s;
        xd[g] = isfinite(s) ? m / 127.0f : NAN;
        for (int32_t k = 32 * g; k < 32 * g + 32; k++)
            xq[k] = isfinite(s) ? (int8_t)lrintf(x[k] * id) : 0;
    }
}

/* A row's weights as the int8 path splits them (cpu_blocks_int8.c): wq = s * (u - z) and the
 * offsets wb (per column), in double. Q4_K/Q5_K (centred on z = 8, 16) by sl_dequant_row on
 * copies: dmin = 0 gives s * q, d = 0 gives -dmin * m, codes all 1 (and dmin = 0) give s; the
 * others have no offset and wq = w. */
static void split_offsets(sl_dtype t, const uint8_t *row, int32_t K, double *wq, double *wb) {
    const size_t rb = sl_row_bytes(t, K), bb = sl_dtype_block_bytes(t);
    uint8_t *c = malloc(rb);
    float *sq = malloc(sizeof(float) * K), *m = malloc(sizeof(float) * K),
          *s1 = malloc(sizeof(float) * K);
    sl_dequant_row(t, row, sq, K);
    for (int32_t k = 0; k < K; k++)
        m[k] = s1[k] = 0;
    const int q5 = t == SL_DTYPE_Q5_K;
    if (t == SL_DTYPE_Q4_K || q5) {
        memcpy(c, row, rb);
        for (size_t b = 0; b < rb; b += bb)
            c[b + 2] = c[b + 3] = 0;
        sl_dequant_row(t, c, sq, K);
        for (size_t b = 0; b < rb; b += bb) {
            if (q5) memset(c + b + 16, 0, 32);         /* qh */
            memset(c + b + (q5 ? 48 : 16), 0x11, 128); /* qs: every code 1 */
        }
        sl_dequant_row(t, c, s1, K);
        memcpy(c, row, rb);
        for (size_t b = 0; b < rb; b += bb)
            c[b] = c[b + 1] = 0;
        sl_dequant_row(t, c, m, K);
    }
    const double z = q5 ? 16 : 8;
    for (int32_t k = 0; k < K; k++) {
        wq[k] = (double)sq[k] - z * s1[k];
        wb[k] = (double)m[k] + z * s1[k];
    }
    free(c), free(sq), free(m), free(s1);
}

/* The int8 path on each ISA that has it: against the same arithmetic in double on x quantised as
 * specified (float rounding only), against the float path within the bound of cpu_blocks_int8.c,
 * with a typical error far below it; bitwise the same for a token alone or in a batch and on one
 * or two threads; a non-finite x makes its token's outputs NaN and no other's. */
TEST(test_blocks_int8) {
    enum { N = 37, T = 7, KMAX = 1024, POISON_N = 3 };
    const sl_dtype types[] = {SL_DTYPE_Q8_0, SL_DTYPE_Q4_0, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K,
                              SL_DTYPE_Q6_K};
    int ran = 0;
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        const sl_dtype t = types[c];
        CHECK(sl_blocks_int8_type(t));
        const int32_t Ks[] = {sl_dtype_block_size(t), 96, 768, KMAX};
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const int32_t K = Ks[ki];
            if (K % sl_dtype_block_size(t)) continue;
            const size_t rb = sl_row_bytes(t, K);
            uint8_t *q = malloc(rb * N);
            float *wf = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * T * K);
            double *wq = malloc(sizeof(double) * N * K), *wb = malloc(sizeof(double) * N * K);
            for (int32_t i = 0; i < N * K; i++)
                wf[i] = frand() * 0.5f + (c % 2 ? 0.1f : 0.0f);
            for (int32_t n = 0; n < N; n++) {
                sl_quant_row_simple(t, wf + (size_t)n * K, q + n * rb, K);
                split_offsets(t, q + n * rb, K, wq + (size_t)n * K, wb + (size_t)n * K);
            }
            for (int32_t i = 0; i < T * K; i++) /* groups of different spreads */
                x[i] = frand() * (1.0f + (float)((i / 32) % 4));
            const sl_tensor w = {
                .name = "w", .dtype = t, .ndim = 2, .shape = {N, K}, .data = q, .nbytes = rb * N};
            float xd[KMAX / 32], X[KMAX / 32];
            int8_t xq[KMAX];
            double emul[T * N], bound[T * N], rms = 0;
            for (int32_t i = 0; i < T; i++) {
                int8_spec(x + (size_t)i * K, K, xd, xq, X);
                for (int32_t n = 0; n < N; n++) {
                    double e = 0, bd = 0;
                    for (int32_t k = 0; k < K; k++) {
                        const double v = wq[(size_t)n * K + k];
                        e += v * ((double)xd[k / 32] * xq[k]);
                        bd += fabs(v) * xd[k / 32] / 2;
                        if (k % 32 == 0) e += wb[(size_t)n * K + k] * X[k / 32];
                    }
                    emul[i * N + n] = e, bound[i * N + n] = bd;
                    rms += e * e;
                }
            }
            rms = sqrt(rms / (T * N));
            for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
                sl_backend be, be1;
                sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                sl_backend_cpu_init(&be1, 1, (sl_isa)isa);
                if (!sl_blocks_int8_available(&be, &w)) continue;
                ran++;
                float y[T * N + POISON_N], yf[T * N], y2[T * N], y1[N];
                for (int i = 0; i < T * N + POISON_N; i++)
                    y[i] = 1234567.0f;
                sl_matmul_blocks_cpu_path(&be, y, x, &w, T, SL_QPATH_INT8);
                sl_matmul_blocks_cpu_path(&be1, y2, x, &w, T, SL_QPATH_INT8);
                sl_matmul_blocks_cpu_path(&be, yf, x, &w, T, SL_QPATH_FLOAT);
                double worst = 0, typ = 0, tref = 0;
                for (int i = 0; i < T * N; i++) {
                    const double e = fabs(y[i] - emul[i]) / fmax(fabs(emul[i]), rms);
                    worst = fmax(worst, e);
                    CHECKF(fabs((double)y[i] - yf[i]) <= bound[i] + 1e-5 * rms,
                           "%s %s K=%d [%d]: int8 %.9g float %.9g, bound %.3g", sl_dtype_name(t),
                           sl_isa_name(be.isa), K, i, y[i], yf[i], bound[i]);
                    CHECKF(same_float(y[i], y2[i]), "%s %s K=%d [%d]: 1 and 2 threads differ",
                           sl_dtype_name(t), sl_isa_name(be.isa), K, i);
                    typ += ((double)y[i] - yf[i]) * ((double)y[i] - yf[i]);
                    tref += (double)yf[i] * yf[i];
                }
                CHECKF(worst < 1e-5, "%s %s K=%d: int8 path vs its arithmetic in double: %.3g",
                       sl_dtype_name(t), sl_isa_name(be.isa), K, worst);
                CHECKF(sqrt(typ / tref) < 0.007, "%s %s K=%d: typical int8 error %.3g of rms",
                       sl_dtype_name(t), sl_isa_name(be.isa), K, sqrt(typ / tref));
                for (int i = T * N; i < T * N + POISON_N; i++)
                    CHECK(y[i] == 1234567.0f);
                for (int32_t i = 0; i < T; i++) {
                    sl_matmul_blocks_cpu_path(&be, y1, x + (size_t)i * K, &w, 1, SL_QPATH_INT8);
                    CHECKF(memcmp(y1, y + i * N, sizeof y1) == 0,
                           "%s %s K=%d token %d: T=1 and T=%d differ", sl_dtype_name(t),
                           sl_isa_name(be.isa), K, i, T);
                }
                /* an Inf in token 2, a NaN in token 5 */
                const float keep2 = x[2 * K + K / 2], keep5 = x[5 * K + 3];
                x[2 * K + K / 2] = INFINITY, x[5 * K + 3] = NAN;
                sl_matmul_blocks_cpu_path(&be, y, x, &w, T, SL_QPATH_INT8);
                x[2 * K + K / 2] = keep2, x[5 * K + 3] = keep5;
                for (int32_t i = 0; i < T; i++)
                    for (int32_t n = 0; n < N; n++)
                        CHECKF((i == 2 || i == 5) ? isnan(y[i * N + n])
                                                  : same_float(y[i * N + n], y2[i * N + n]),
                               "%s %s K=%d token %d row %d: %g with non-finite x", sl_dtype_name(t),
                               sl_isa_name(be.isa), K, i, n, y[i * N + n]);
            }
            free(q), free(wf), free(wq), free(wb), free(x);
        }
    }
    CHECKF(ran > 0 || sl_cpu_best_isa() == SL_ISA_SCALAR, "no ISA ran the int8 path");
}
