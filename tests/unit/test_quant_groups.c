/*
 * Q8/Q4 with the group sizes and scale dtypes of MLX checkpoints (groups of 32, 64 and 128;
 * BF16, F16 and F32 scales and biases): sl_dequantize_row against the formula on the packed
 * codes, the fused matmul on every ISA and path against a double-precision reference, decode
 * equal to batch bitwise, and the SIMD loaders of other layouts against the pack layout's:
 * a group of 128 gives the bits of groups of 64 with each scale twice, F32 or F16 scales that
 * hold BF16 values the bits of BF16 ones.
 */
#include "core/common.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "test.h"

#define POISON 1234567.0f

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)(urand() & 0xffffff) / 8388608.0f - 1.0f;
}

/* An owned [N, K] matrix: codes, and scales and biases as float (BF16-exact) to store in any
 * dtype. */
typedef struct gmat {
    sl_tensor t;
    uint8_t *q;
    void *sc, *bi;
} gmat;

static void store(void *p, sl_dtype sd, size_t i, float v) {
    if (sd == SL_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (sd == SL_DTYPE_F16)
        ((uint16_t *)p)[i] = sl_f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = sl_f32_to_bf16(v);
}

/* Codes random, scales and biases from sf/bf [N, K / group] (values exact in every dtype). */
static void gmat_init(gmat *m, sl_dtype dt, int32_t group, sl_dtype sd, int64_t N, int64_t K,
                      const uint8_t *codes, const float *sf, const float *bf) {
    const size_t rb = sl_row_bytes(dt, K), G = (size_t)(K / group);
    const size_t ss = sd == SL_DTYPE_F32 ? 4 : 2;
    m->q = malloc(rb * (size_t)N);
    m->sc = malloc(ss * G * (size_t)N);
    m->bi = malloc(ss * G * (size_t)N);
    memcpy(m->q, codes, rb * (size_t)N);
    for (size_t i = 0; i < G * (size_t)N; i++) {
        store(m->sc, sd, i, sf[i]);
        store(m->bi, sd, i, bf[i]);
    }
    m->t = (sl_tensor){.name = "w",
                       .dtype = dt,
                       .ndim = 2,
                       .shape = {N, K},
                       .data = m->q,
                       .nbytes = rb * (size_t)N,
                       .scales = m->sc,
                       .biases = m->bi,
                       .group = group,
                       .sdtype = sd};
}

static void gmat_free(gmat *m) {
    free(m->q), free(m->sc), free(m->bi);
}

/* Scales that F16 holds exactly as well as BF16: 8 significant bits, exponents in F16's normal
 * range; biases likewise. */
static float exact_value(float lo) {
    const float m = (float)(128 + (urand() & 127)) / 256.0f; /* [0.5, 1) with 8 bits */
    const int e = -(int)(urand() % 6);
    return ldexpf(m, e) * (lo < 0 ? -1.0f : 1.0f) * 0.5f;
}

static void run_all(const sl_backend *be, const sl_tensor *w, const float *x, int64_t T, float *y,
                    sl_qpath path) {
    const int64_t N = w->shape[0];
    for (int64_t i = 0; i < T * N; i++)
        y[i] = POISON;
    sl_matmul_quant_cpu_path(be, y, x, w, (int32_t)T, path);
}

TEST(test_quant_groups_matmul) {
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    const int32_t groups[] = {32, 64, 128};
    const sl_dtype sds[] = {SL_DTYPE_BF16, SL_DTYPE_F16, SL_DTYPE_F32};
    const int64_t Ns[] = {1, 37}, Kmul[] = {1, 3, 17}, Ts[] = {1, 3, 5, 9};
    const int best = (int)sl_cpu_best_isa();
    for (int d = 0; d < 2; d++)
        for (int gi = 0; gi < 3; gi++)
            for (int si = 0; si < 3; si++)
                for (int ni = 0; ni < 2; ni++)
                    for (int ki = 0; ki < 3; ki++) {
                        const int32_t grp = groups[gi];
                        const int64_t N = Ns[ni], K = grp * Kmul[ki], G = K / grp;
                        const int64_t T = Ts[(gi + ki + ni) % 4];
                        const size_t rb = sl_row_bytes(dts[d], K);
                        uint8_t *codes = malloc(rb * (size_t)N);
                        float *sf = malloc(sizeof(float) * (size_t)(N * G));
                        float *bf = malloc(sizeof(float) * (size_t)(N * G));
                        for (size_t i = 0; i < rb * (size_t)N; i++)
                            codes[i] = (uint8_t)urand();
                        for (int64_t i = 0; i < N * G; i++) {
                            sf[i] = exact_value(frand()); /* MLX scales may be negative */
                            bf[i] = exact_value(frand());
                        }
                        gmat m;
                        gmat_init(&m, dts[d], grp, sds[si], N, K, codes, sf, bf);
                        char what[160];
                        snprintf(what, sizeof what, "%s group %d %s N=%lld K=%lld T=%lld",
                                 sl_dtype_name(dts[d]), grp, sl_dtype_name(sds[si]), (long long)N,
                                 (long long)K, (long long)T);
                        /* dequantisation: the formula on the packed codes */
                        float *row = malloc(sizeof(float) * (size_t)K);
                        float *x = malloc(sizeof(float) * (size_t)(T * K));
                        double *ref = calloc((size_t)(T * N), sizeof(double));
                        double *mag = calloc((size_t)(T * N), sizeof(double)); /* sum |w x| */
                        double *sq = calloc((size_t)(T * N), sizeof(double));  /* sum (w x)^2 */
                        for (int64_t i = 0; i < T * K; i++)
                            x[i] = frand();
                        int bad = 0;
                        for (int64_t n = 0; n < N; n++) {
                            sl_dequantize_row(&m.t, n, row);
                            for (int64_t k = 0; k < K; k++) {
                                const uint8_t *r = codes + (size_t)n * rb;
                                const unsigned q = dts[d] == SL_DTYPE_Q4
                                                       ? (r[k / 2] >> (4 * (k & 1))) & 15u
                                                       : r[k];
                                const float want =
                                    (float)q * sf[n * G + k / grp] + bf[n * G + k / grp];
                                bad += row[k] != want;
                                for (int64_t t = 0; t < T; t++) {
                                    ref[t * N + n] += (double)row[k] * x[t * K + k];
                                    mag[t * N + n] += fabs((double)row[k] * x[t * K + k]);
                                    sq[t * N + n] += pow((double)row[k] * x[t * K + k], 2);
                                }
                            }
                        }
                        CHECKF(!bad, "%s: %d dequantised weights differ from the formula", what,
                               bad);
                        float *y = malloc(sizeof(float) * (size_t)(T * N));
                        float *y1 = malloc(sizeof(float) * (size_t)N);
                        for (int isa = SL_ISA_SCALAR; isa <= best; isa++) {
                            sl_backend be;
                            sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                            for (int p = SL_QPATH_FLOAT; p <= SL_QPATH_INT8; p++) {
                                run_all(&be, &m.t, x, T, y, (sl_qpath)p);
                                double num = 0, den = 0, worst = 0;
                                for (int64_t i = 0; i < T * N; i++) {
                                    num += (y[i] - ref[i]) * (y[i] - ref[i]);
                                    den += sq[i];
                                    worst = fmax(worst, fabs(y[i] - ref[i]) / (1e-3 + mag[i]));
                                }
                                /* FLOAT: float rounding only (relative to sum |w x|); INT8 (with
                                 * VNNI): x rounded to int8 per group of 64, ~0.4% of each product,
                                 * errors of random sign: RMS against that of the products (not of
                                 * y, which may cancel) */
                                const int int8 = p == SL_QPATH_INT8 &&
                                                 sl_quant_int8_available(&be) && grp % 64 == 0;
                                if (int8)
                                    CHECKF(sqrt(num / fmax(den, 1e-30)) < 2e-2,
                                           "%s isa %s int8: relative error %g", what,
                                           sl_isa_name(be.isa), sqrt(num / fmax(den, 1e-30)));
                                else
                                    CHECKF(worst < 1e-5, "%s isa %s path %d: error %g", what,
                                           sl_isa_name(be.isa), p, worst);
                                for (int64_t t = 0; t < T; t++) {
                                    run_all(&be, &m.t, x + t * K, 1, y1, (sl_qpath)p);
                                    CHECKF(memcmp(y1, y + t * N, sizeof(float) * (size_t)N) == 0,
                                           "%s isa %s path %d: token %lld alone differs", what,
                                           sl_isa_name(be.isa), p, (long long)t);
                                }
                            }
                        }
                        free(y), free(y1), free(row), free(x), free(ref), free(mag), free(sq),
                            free(codes), free(sf), free(bf);
                        gmat_free(&m);
                    }
}

/* The pack layout's loaders against the others': same values, same bits on every ISA and path. */
TEST(test_quant_groups_same_bits) {
    const int64_t N = 21, K = 384, T = 6, G64 = K / 64;
    const int best = (int)sl_cpu_best_isa();
    for (int d = 0; d < 2; d++) {
        const sl_dtype dt = d ? SL_DTYPE_Q4 : SL_DTYPE_Q8;
        const size_t rb = sl_row_bytes(dt, K);
        uint8_t *codes = malloc(rb * (size_t)N);
        float *s128 = malloc(sizeof(float) * (size_t)(N * G64)),
              *b128 = malloc(sizeof(float) * (size_t)(N * G64));
        float *s64 = malloc(sizeof(float) * (size_t)(N * G64)),
              *b64 = malloc(sizeof(float) * (size_t)(N * G64));
        for (size_t i = 0; i < rb * (size_t)N; i++)
            codes[i] = (uint8_t)urand();
        for (int64_t i = 0; i < N * G64; i++) {
            s128[i] = exact_value(frand());
            b128[i] = exact_value(frand());
        }
        for (int64_t n = 0; n < N; n++) /* each group of 128 as two of 64 */
            for (int64_t g = 0; g < G64; g++) {
                s64[n * G64 + g] = s128[n * (G64 / 2) + g / 2];
                b64[n * G64 + g] = b128[n * (G64 / 2) + g / 2];
            }
        gmat plain, wide, f32, f16;
        gmat_init(&plain, dt, 64, SL_DTYPE_BF16, N, K, codes, s64, b64);
        gmat_init(&wide, dt, 128, SL_DTYPE_BF16, N, K, codes, s128, b128);
        gmat_init(&f32, dt, 64, SL_DTYPE_F32, N, K, codes, s64, b64);
        gmat_init(&f16, dt, 64, SL_DTYPE_F16, N, K, codes, s64, b64);
        float *x = malloc(sizeof(float) * (size_t)(T * K));
        for (int64_t i = 0; i < T * K; i++)
            x[i] = frand();
        float *y0 = malloc(sizeof(float) * (size_t)(T * N)),
              *y1 = malloc(sizeof(float) * (size_t)(T * N));
        for (int isa = SL_ISA_AVX2; isa <= best; isa++) { /* scalar walks the tensor's groups */
            sl_backend be;
            sl_backend_cpu_init(&be, 2, (sl_isa)isa);
            for (int p = SL_QPATH_FLOAT; p <= SL_QPATH_INT8; p++) {
                run_all(&be, &plain.t, x, T, y0, (sl_qpath)p);
                const gmat *other[3] = {&wide, &f32, &f16};
                for (int o = 0; o < 3; o++) {
                    run_all(&be, &other[o]->t, x, T, y1, (sl_qpath)p);
                    CHECKF(memcmp(y0, y1, sizeof(float) * (size_t)(T * N)) == 0,
                           "%s isa %s path %d: group %d %s differs from the pack layout",
                           sl_dtype_name(dt), sl_isa_name(be.isa), p, other[o]->t.group,
                           sl_dtype_name(other[o]->t.sdtype));
                }
            }
        }
        gmat_free(&plain), gmat_free(&wide), gmat_free(&f32), gmat_free(&f16);
        free(codes), free(s128), free(b128), free(s64), free(b64), free(x), free(y0), free(y1);
    }
}
