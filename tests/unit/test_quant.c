/*
 * Group-wise affine quantisation (Q8/Q4): quantise/dequantise round trip, and
 * the fused matmul for every ISA against a double-precision reference built
 * from sl_dequantize_row, on odd shapes (K not a multiple of the group, odd K
 * for Q4), outputs pre-filled with a poison value. Decode and batch, one
 * thread and two, must agree bitwise. The Q4 int8-activation path (AVX-512
 * VNNI) is checked against the same arithmetic in double on the activations
 * quantised as quant.h specifies (float rounding only), and against the exact
 * product within the bound that activation rounding allows, with its typical
 * error compared to the rounding-noise prediction. Rows of x holding Inf or NaN run through
 * every path without undefined behaviour and give non-finite outputs (issue 24).
 */
#include <float.h>

#include "core/common.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "test.h"

#define POISON 1234567.0f

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static int qmax_of(sl_dtype dt) {
    return dt == SL_DTYPE_Q4 ? 15 : 255;
}

/* An owned quantised [N, K] matrix and the tensor view on it. */
typedef struct qmat {
    sl_tensor t;
    uint8_t *q;
    uint16_t *sc, *bi;
} qmat;

static void qmat_init(qmat *m, sl_dtype dt, int64_t N, int64_t K) {
    const size_t rb = sl_row_bytes(dt, K), G = (size_t)sl_qgroups(K);
    m->q = malloc(rb * (size_t)N + 1);
    m->sc = malloc(sizeof(uint16_t) * G * (size_t)N + 2);
    m->bi = malloc(sizeof(uint16_t) * G * (size_t)N + 2);
    m->t = (sl_tensor){.name = "wq",
                       .dtype = dt,
                       .ndim = 2,
                       .shape = {N, K},
                       .data = m->q,
                       .nbytes = rb * (size_t)N,
                       .scales = m->sc,
                       .biases = m->bi};
}

static void qmat_free(qmat *m) {
    free(m->q), free(m->sc), free(m->bi);
}

/* Quantises N rows of w [N, K] into m. */
static void qmat_quantize(qmat *m, const float *w) {
    const int64_t N = m->t.shape[0], K = m->t.shape[1], G = sl_qgroups(K);
    const size_t rb = sl_row_bytes(m->t.dtype, K);
    for (int64_t n = 0; n < N; n++)
        sl_quantize_row(m->t.dtype, w + n * K, K, m->q + (size_t)n * rb, m->sc + n * G,
                        m->bi + n * G);
}

/* Checks one quantised row against its source: codes in range, zero padding,
 * finite nonzero scales, |w - deq| <= scale / 2 (+ float rounding). Returns the
 * worst error in units of scale. */
static double check_row(sl_dtype dt, const float *w, int64_t K, const char *what) {
    qmat m;
    qmat_init(&m, dt, 1, K);
    qmat_quantize(&m, w);
    float *deq = malloc(sizeof(float) * (size_t)(K + 1));
    sl_dequantize_row(&m.t, 0, deq);
    const int qmax = qmax_of(dt);
    if (dt == SL_DTYPE_Q4 && (K & 1)) CHECKF((m.q[K / 2] >> 4) == 0, "%s: padding nibble", what);
    double worst = 0;
    for (int64_t g = 0; g < sl_qgroups(K); g++) {
        const float s = sl_bf16_to_f32(m.sc[g]), b = sl_bf16_to_f32(m.bi[g]);
        CHECKF(isfinite(s) && s > 0 && isfinite(b), "%s K=%lld group %lld: scale %g bias %g", what,
               (long long)K, (long long)g, s, b);
        for (int64_t k = g * SL_QGROUP; k < SL_MIN(K, (g + 1) * SL_QGROUP); k++) {
            if (!isfinite(w[k])) continue;
            const double err = fabs((double)w[k] - deq[k]);
            const double tol = s / 2 * (1 + 1e-6) + 4 * FLT_EPSILON * (fabs(b) + qmax * s);
            CHECKF(err <= tol, "%s %s K=%lld k=%lld: w %.9g deq %.9g (scale %g bias %g)", what,
                   sl_dtype_name(dt), (long long)K, (long long)k, w[k], deq[k], s, b);
            worst = fmax(worst, err / s);
        }
    }
    free(deq);
    qmat_free(&m);
    return worst;
}

TEST(test_quant_roundtrip) {
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    const int64_t Ks[] = {1, 2, 3, 48, 63, 64, 65, 72, 75, 80, 131, 64 * 3 + 17, 257, 2048};
    float w[2048];
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
            const int64_t K = Ks[i];
            /* Groups of different spreads and offsets. */
            for (int64_t k = 0; k < K; k++) {
                const int64_t g = k / SL_QGROUP;
                w[k] = frand() * (0.05f + 0.3f * (float)(g % 3)) + 0.1f * (float)(g % 5 - 2);
            }
            const double worst = check_row(dts[d], w, K, "random");
            CHECKF(worst > 0.3 || K < 8, "K=%lld: errors suspiciously small (%g)", (long long)K,
                   worst);
            /* Constant rows: exact when BF16 holds the value, near otherwise. */
            const float consts[] = {0.0f, 0.5f, -1.25f, 0.3f, -0.7f, 1e-30f, 3e38f, -3e38f};
            for (size_t c = 0; c < sizeof consts / sizeof consts[0]; c++) {
                for (int64_t k = 0; k < K; k++)
                    w[k] = consts[c];
                check_row(dts[d], w, K, "constant");
                qmat m;
                qmat_init(&m, dts[d], 1, K);
                qmat_quantize(&m, w);
                float deq[2048];
                sl_dequantize_row(&m.t, 0, deq);
                const int exact = sl_bf16_to_f32(sl_f32_to_bf16(consts[c])) == consts[c];
                for (int64_t k = 0; k < K; k++) {
                    if (exact)
                        CHECKF(deq[k] == consts[c], "%s K=%lld: %g -> %g", sl_dtype_name(dts[d]),
                               (long long)K, consts[c], deq[k]);
                    else
                        CHECKF(fabsf(deq[k] - consts[c]) <= fabsf(consts[c]) * 1e-3f,
                               "%s K=%lld: %g -> %g", sl_dtype_name(dts[d]), (long long)K,
                               consts[c], deq[k]);
                }
                qmat_free(&m);
            }
        }
}

/* Extreme inputs never give non-finite scales or biases. */
TEST(test_quant_extremes) {
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    for (size_t d = 0; d < 2; d++) {
        float w[131];
        for (int k = 0; k < 131; k++) /* full float range in one group, denormals in another */
            w[k] = k < 64 ? (k & 1 ? FLT_MAX : -FLT_MAX) * (float)(k % 7) / 7
                          : 1e-42f * (float)(k % 9) - 2e-42f;
        qmat m;
        qmat_init(&m, dts[d], 1, 131);
        qmat_quantize(&m, w);
        for (int g = 0; g < 3; g++) {
            const float s = sl_bf16_to_f32(m.sc[g]), b = sl_bf16_to_f32(m.bi[g]);
            CHECKF(isfinite(s) && s > 0 && isfinite(b), "%s group %d: %g %g", sl_dtype_name(dts[d]),
                   g, s, b);
        }
        for (int k = 64; k < 131; k++) { /* denormal group: within half a (tiny) step */
            float deq[131];
            sl_dequantize_row(&m.t, 0, deq);
            CHECK(fabsf(deq[k] - w[k]) <= sl_bf16_to_f32(m.sc[k / 64]) / 2 + 1e-45f);
        }
        /* Non-finite values: ignored for the range, codes clamp, NaN codes as 0. */
        for (int k = 0; k < 131; k++)
            w[k] = frand();
        w[3] = NAN, w[70] = INFINITY, w[71] = -INFINITY;
        for (int k = 128; k < 131; k++)
            w[k] = NAN; /* a group of only NaNs */
        qmat_quantize(&m, w);
        for (int g = 0; g < 3; g++)
            CHECK(isfinite(sl_bf16_to_f32(m.sc[g])) && isfinite(sl_bf16_to_f32(m.bi[g])));
        check_row(dts[d], w, 131, "non-finite");
        qmat_free(&m);
    }
}

/* y = x . deq(W)^T in double, from sl_dequantize_row. */
static void matmul_ref(const qmat *m, const float *x, int64_t T, double *ref) {
    const int64_t N = m->t.shape[0], K = m->t.shape[1];
    float *row = malloc(sizeof(float) * (size_t)K);
    for (int64_t n = 0; n < N; n++) {
        sl_dequantize_row(&m->t, n, row);
        for (int64_t t = 0; t < T; t++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (double)row[k] * (double)x[t * K + k];
            ref[t * N + n] = s;
        }
    }
    free(row);
}

/*
 * The int8 path in double: x quantised per group as quant.h specifies (the
 * same float operations, so the same xq), then per output, z the codes' centre
 * (8 for Q4, 128 for Q8),
 *   refq  = sum_g s d sum (q - z) xq + (b + z s) X      X exact
 *   bound = sum_g s e sum |q - z|      e: the largest |x - d xq| allowed
 *   var   = sum_g s^2 d^2 / 12 sum (q - z)^2   (rounding errors as uniform noise)
 * so that |y - refq| is float rounding and |refq - exact| <= bound.
 */
static void int8_ref(const qmat *m, const float *x, int64_t T, double *refq, double *bound,
                     double *var) {
    const int64_t N = m->t.shape[0], K = m->t.shape[1], G = sl_qgroups(K);
    const size_t rb = sl_row_bytes(m->t.dtype, K);
    const int q4 = m->t.dtype == SL_DTYPE_Q4, z = q4 ? 8 : 128;
    int *xq = malloc(sizeof(int) * (size_t)(K + 1));
    double *dg = malloc(sizeof(double) * (size_t)G), *eg = malloc(sizeof(double) * (size_t)G),
           *Xg = malloc(sizeof(double) * (size_t)G);
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * K;
        for (int64_t g = 0; g < G; g++) {
            const int64_t k0 = g * SL_QGROUP, k1 = SL_MIN(K, k0 + SL_QGROUP);
            float mx = 0;
            double X = 0;
            for (int64_t k = k0; k < k1; k++) {
                mx = fmaxf(mx, fabsf(xt[k]));
                X += xt[k];
            }
            const float d = mx / 127.0f, id = fminf(127.0f / mx, FLT_MAX);
            for (int64_t k = k0; k < k1; k++)
                xq[k] = (int)rintf(xt[k] * id);
            dg[g] = d, Xg[g] = X;
            eg[g] = mx < 127.0f / FLT_MAX ? mx : d / 2 * (1 + 1e-4);
        }
        for (int64_t n = 0; n < N; n++) {
            const uint8_t *row = m->q + (size_t)n * rb;
            double r = 0, bd = 0, v = 0;
            for (int64_t g = 0; g < G; g++) {
                const double sc = sl_bf16_to_f32(m->sc[n * G + g]);
                const double bi = sl_bf16_to_f32(m->bi[n * G + g]);
                long dot = 0, sabs = 0, ssq = 0;
                for (int64_t k = g * SL_QGROUP; k < SL_MIN(K, (g + 1) * SL_QGROUP); k++) {
                    const int c = (q4 ? (row[k >> 1] >> ((k & 1) * 4)) & 15 : row[k]) - z;
                    dot += (long)c * xq[k];
                    sabs += labs((long)c);
                    ssq += (long)c * c;
                }
                r += sc * dg[g] * (double)dot + (bi + z * sc) * Xg[g];
                bd += sc * eg[g] * (double)sabs;
                v += sc * sc * dg[g] * dg[g] / 12 * (double)ssq;
            }
            refq[t * N + n] = r;
            if (bound) bound[t * N + n] = bd;
            if (var) var[t * N + n] = v;
        }
    }
    free(xq), free(dg), free(eg), free(Xg);
}

/* Error statistics of the int8 path over a test. */
typedef struct err_stats {
    double err2, ref2, var; /* sum of (y - exact)^2, exact^2, predicted variance */
    double worst_bound;     /* max |y - exact| / bound */
} err_stats;

/* Checks int8 results y [T, N] of m: float rounding against refq, the bound
 * against the exact ref, no poison left; accumulates statistics. */
static void check_int8(const qmat *m, const float *x, int64_t T, const float *y, const double *ref,
                       err_stats *st, const char *what) {
    const int64_t N = m->t.shape[0], K = m->t.shape[1];
    double *refq = malloc(sizeof(double) * (size_t)(T * N)),
           *bound = malloc(sizeof(double) * (size_t)(T * N)),
           *var = malloc(sizeof(double) * (size_t)(T * N));
    int8_ref(m, x, T, refq, bound, var);
    /* float rounding grows like sqrt(K): 1e-5 at K = 2048 */
    const double ftol = 1e-5 * fmax(1, sqrt((double)K / 2048));
    double worst = 0, worst_b = 0;
    for (int64_t i = 0; i < T * N; i++) {
        CHECKF(y[i] != POISON && isfinite(y[i]), "%s: output %lld not written (%g)", what,
               (long long)i, y[i]);
        worst = fmax(worst, fabs(y[i] - refq[i]) / (1 + fabs(refq[i])));
        const double e = fabs(y[i] - ref[i]);
        const double lim = bound[i] + ftol * (1 + fabs(ref[i]));
        CHECKF(e <= lim, "%s: output %lld error %g over the bound %g", what, (long long)i, e, lim);
        if (bound[i] > 0) worst_b = fmax(worst_b, e / lim);
        st->err2 += e * e, st->ref2 += ref[i] * ref[i], st->var += var[i];
    }
    CHECKF(worst < ftol, "%s: vs the int8 arithmetic %g", what, worst);
    st->worst_bound = fmax(st->worst_bound, worst_b);
    free(refq), free(bound), free(var);
}

/* The int8 error overall: relative RMS, close to what rounding noise predicts. */
static void report_int8(const err_stats *st, const char *what) {
    if (st->ref2 == 0) return;
    const double rel = sqrt(st->err2 / st->ref2), ratio = sqrt(st->err2 / st->var);
    printf("  %s: int8 activations: rel RMS error %.2e, %.2f x the rounding-noise prediction, "
           "worst %.2f of the bound\n",
           what, rel, ratio, st->worst_bound);
    CHECKF(ratio > 0.8 && ratio < 1.25, "%s: error %g x the prediction", what, ratio);
    CHECKF(rel < 1e-2, "%s: rel RMS error %g", what, rel);
}

TEST(test_quant_matmul_all_isas) {
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    /* T: every token tail of the float (4) and int8 (8) tiles, and two whole int8 tiles */
    const int64_t Ns[] = {1, 37, 130}, Ks[] = {1, 63, 64, 75, 131, 257, 2048},
                  Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16};
    const size_t nT = sizeof Ts / sizeof Ts[0];
    const int best = (int)sl_cpu_best_isa();
    err_stats st = {0};
    int int8_runs = 0;
    for (size_t d = 0; d < 2; d++)
        for (size_t in = 0; in < 3; in++)
            for (size_t ik = 0; ik < 7; ik++)
                for (size_t it = 0; it < nT; it++) {
                    const int64_t N = Ns[in], K = Ks[ik], T = Ts[it];
                    float *w = malloc(sizeof(float) * (size_t)(N * K));
                    float *x = malloc(sizeof(float) * (size_t)(T * K));
                    double *ref = malloc(sizeof(double) * (size_t)(T * N));
                    float *y[3], *y1 = malloc(sizeof(float) * (size_t)N);
                    float *y2 = malloc(sizeof(float) * (size_t)(T * N));
                    float *yi = malloc(sizeof(float) * (size_t)(T * N));
                    /* Rows with their own spread and offset (biases far from -scale*qmax/2). */
                    for (int64_t n = 0; n < N; n++) {
                        const float amp = 0.1f + 0.5f * fabsf(frand()), off = 0.3f * frand();
                        for (int64_t k = 0; k < K; k++)
                            w[n * K + k] = frand() * amp + off;
                    }
                    for (int64_t i = 0; i < T * K; i++)
                        x[i] = frand();
                    qmat m;
                    qmat_init(&m, dts[d], N, K);
                    qmat_quantize(&m, w);
                    matmul_ref(&m, x, T, ref);
                    for (int isa = SL_ISA_SCALAR; isa <= best; isa++) {
                        sl_backend be;
                        sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                        char what[128];
                        snprintf(what, sizeof what, "isa %s %s T=%lld N=%lld K=%lld",
                                 sl_isa_name(be.isa), sl_dtype_name(dts[d]), (long long)T,
                                 (long long)N, (long long)K);
                        /* The float path. */
                        y[isa] = malloc(sizeof(float) * (size_t)(T * N));
                        for (int64_t i = 0; i < T * N; i++)
                            y[isa][i] = POISON;
                        sl_matmul_quant_cpu_path(&be, y[isa], x, &m.t, (int32_t)T, SL_QPATH_FLOAT);
                        double worst = 0;
                        for (int64_t i = 0; i < T * N; i++)
                            worst = fmax(worst, fabs(y[isa][i] - ref[i]) / (1 + fabs(ref[i])));
                        CHECKF(worst < 1e-5, "%s: error %g", what, worst);
                        /* Each token alone (decode) gives the bits it has in the batch. */
                        for (int64_t t = 0; t < T; t++) {
                            for (int64_t n = 0; n < N; n++)
                                y1[n] = POISON;
                            sl_matmul_quant_cpu_path(&be, y1, x + t * K, &m.t, 1, SL_QPATH_FLOAT);
                            CHECKF(memcmp(y1, y[isa] + t * N, sizeof(float) * (size_t)N) == 0,
                                   "%s: token %lld alone differs", what, (long long)t);
                        }
                        /* And so does one thread. */
                        be.n_threads = 1;
                        sl_matmul_quant_cpu_path(&be, y2, x, &m.t, (int32_t)T, SL_QPATH_FLOAT);
                        CHECKF(memcmp(y2, y[isa], sizeof(float) * (size_t)(T * N)) == 0,
                               "%s: 1 vs 2 threads differ", what);
                        be.n_threads = 2;
                        /* SIMD close to the scalar reference order (not bitwise). */
                        double diff = 0;
                        for (int64_t i = 0; i < T * N; i++)
                            diff = fmax(diff, fabs((double)y[isa][i] - y[0][i]) /
                                                  (1 + fabs((double)y[0][i])));
                        CHECKF(diff < 1e-5, "%s: vs scalar %g", what, diff);

                        /* The int8 path where it runs; elsewhere a request for it is the
                         * float path. The default is int8 where it runs. */
                        const int int8 = sl_quant_int8_available(&be);
                        for (int64_t i = 0; i < T * N; i++)
                            yi[i] = POISON;
                        sl_matmul_quant_cpu_path(&be, yi, x, &m.t, (int32_t)T, SL_QPATH_INT8);
                        sl_matmul_quant_cpu(&be, y2, x, &m.t, (int32_t)T);
                        CHECKF(memcmp(y2, yi, sizeof(float) * (size_t)(T * N)) == 0,
                               "%s: the default is not the int8 path", what);
                        if (!int8) {
                            CHECKF(memcmp(yi, y[isa], sizeof(float) * (size_t)(T * N)) == 0,
                                   "%s: int8 requested, not the float path", what);
                            continue;
                        }
                        int8_runs++;
                        strcat(what, " int8");
                        check_int8(&m, x, T, yi, ref, &st, what);
                        for (int64_t t = 0; t < T; t++) {
                            for (int64_t n = 0; n < N; n++)
                                y1[n] = POISON;
                            sl_matmul_quant_cpu_path(&be, y1, x + t * K, &m.t, 1, SL_QPATH_INT8);
                            CHECKF(memcmp(y1, yi + t * N, sizeof(float) * (size_t)N) == 0,
                                   "%s: token %lld alone differs", what, (long long)t);
                        }
                        be.n_threads = 1;
                        sl_matmul_quant_cpu_path(&be, y2, x, &m.t, (int32_t)T, SL_QPATH_INT8);
                        CHECKF(memcmp(y2, yi, sizeof(float) * (size_t)(T * N)) == 0,
                               "%s: 1 vs 2 threads differ", what);
                    }
                    for (int isa = SL_ISA_SCALAR; isa <= best; isa++)
                        free(y[isa]);
                    qmat_free(&m);
                    free(w), free(x), free(ref), free(y1), free(y2), free(yi);
                }
    if (int8_runs)
        report_int8(&st, "all shapes");
    else
        printf("  (no AVX-512 VNNI: the int8 path is not tested here)\n");
}

/* Int8 activations of every size: groups of zeros, tiny (subnormal), huge and
 * mixed magnitudes in one row, a lone outlier; each group gets its own d. */
TEST(test_quant_int8_activations) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, sl_cpu_best_isa());
    if (!sl_quant_int8_available(&be)) {
        printf("  (no AVX-512 VNNI: skipped)\n");
        return;
    }
    enum { N = 37, K = 64 * 21 + 13, T = 7 };
    const int64_t G = sl_qgroups(K);
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * T * K);
    float *y = malloc(sizeof(float) * T * N), y1[N];
    double *ref = malloc(sizeof(double) * T * N);
    for (int i = 0; i < N * K; i++)
        w[i] = frand() * 0.2f + 0.05f;
    const float mags[] = {1.0f, 1e-3f, 1e3f, 0.0f, 1e-40f, 1e-20f, 3e-37f, 1e20f};
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int g = k / 64;
            float mag;
            switch (t) {
            case 0: mag = 0; break;                        /* all zero */
            case 1: mag = mags[g % 8]; break;              /* mixed per group */
            case 2: mag = mags[(g * 3 + 1) % 8]; break;    /* mixed, another order */
            case 3: mag = k == 200 ? 1e4f : 1e-2f; break;  /* one outlier */
            case 4: mag = 1e-40f; break;                   /* subnormal everywhere */
            case 5: mag = g == G - 1 ? 5.0f : 0.0f; break; /* only the short last group */
            default: mag = 1.0f + (float)(g % 5); break;
            }
            x[t * K + k] = frand() * mag;
        }
    for (int d = 0; d < 2; d++) {
        err_stats st = {0};
        const sl_dtype dt = d ? SL_DTYPE_Q4 : SL_DTYPE_Q8;
        qmat m;
        qmat_init(&m, dt, N, K);
        qmat_quantize(&m, w);
        matmul_ref(&m, x, T, ref);
        for (int i = 0; i < T * N; i++)
            y[i] = POISON;
        sl_matmul_quant_cpu_path(&be, y, x, &m.t, T, SL_QPATH_INT8);
        check_int8(&m, x, T, y, ref, &st, d ? "Q4 int8 activations" : "Q8 int8 activations");
        for (int n = 0; n < N; n++)
            CHECKF(y[n] == 0.0f, "%s zero x: y[%d] = %g", sl_dtype_name(dt), n, y[n]);
        for (int t = 0; t < T; t++) {
            sl_matmul_quant_cpu_path(&be, y1, x + t * K, &m.t, 1, SL_QPATH_INT8);
            CHECKF(memcmp(y1, y + t * N, sizeof y1) == 0, "%s token %d alone differs",
                   sl_dtype_name(dt), t);
        }
        qmat_free(&m);
    }
    free(w), free(x), free(y), free(ref);
}

/* Through sl_matmul_cpu (bias added after), with a big enough product to use
 * both threads, a garbage Q4 padding nibble that must not matter, and a row
 * view that starts inside a matrix (as expert slices do). Q4 takes the int8
 * path where it runs. */
TEST(test_quant_matmul_dispatch) {
    enum { N = 70, K = 333, T = 6, R0 = 5 };
    const int64_t G = sl_qgroups(K);
    float *w = malloc(sizeof(float) * N * K), x[T * K], bias_v[N];
    for (int i = 0; i < N * K; i++)
        w[i] = frand() * 0.2f;
    for (int i = 0; i < T * K; i++)
        x[i] = frand();
    for (int i = 0; i < N; i++)
        bias_v[i] = frand();
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    for (size_t d = 0; d < 2; d++) {
        qmat m;
        qmat_init(&m, dts[d], N, K);
        qmat_quantize(&m, w);
        const size_t rb = sl_row_bytes(dts[d], K);
        /* The view: rows R0 .. N-1. */
        sl_tensor v = m.t;
        v.shape[0] = N - R0;
        v.data = m.q + R0 * rb;
        v.scales = m.sc + R0 * G;
        v.biases = m.bi + R0 * G;
        double ref[T * N], bound[T * N];
        matmul_ref(&m, x, T, ref);
        int8_ref(&m, x, T, (double[T * N]){0}, bound, NULL);
        sl_tensor bias = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {N - R0}, .data = bias_v};
        for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
            sl_backend be;
            sl_backend_cpu_init(&be, 2, (sl_isa)isa);
            const int int8 = sl_quant_int8_available(&be);
            float y[T * N], y2[T * N];
            for (int i = 0; i < T * N; i++)
                y[i] = POISON;
            sl_matmul_cpu(&be, y, x, &v, &bias, T);
            double worst = 0;
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N - R0; n++) {
                    const double r = ref[t * N + R0 + n] + bias_v[n];
                    const double b = int8 ? bound[t * N + R0 + n] : 0;
                    worst = fmax(worst, (fabs(y[t * (N - R0) + n] - r) - b) / (1 + fabs(r)));
                }
            CHECKF(worst < 1e-5, "isa %s %s%s: error %g", sl_isa_name(be.isa),
                   sl_dtype_name(dts[d]), int8 ? " int8" : "", worst);
            /* The quantised product, then the bias. */
            sl_matmul_quant_cpu(&be, y2, x, &v, T);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N - R0; n++)
                    y2[t * (N - R0) + n] += bias_v[n];
            CHECK(memcmp(y, y2, sizeof(float) * T * (N - R0)) == 0);
            if (dts[d] == SL_DTYPE_Q4) { /* odd K: fill the padding nibbles, same bits */
                for (int n = 0; n < N; n++)
                    m.q[n * rb + rb - 1] |= 0xf0;
                sl_matmul_cpu(&be, y2, x, &v, &bias, T);
                CHECK(memcmp(y, y2, sizeof(float) * T * (N - R0)) == 0);
                for (int n = 0; n < N; n++)
                    m.q[n * rb + rb - 1] &= 0x0f;
            }
        }
        qmat_free(&m);
    }
    free(w);
}

/* Long rows: batches whose per-group sums of x exceed the kernel's stack
 * buffer go through in slices of tokens, and rows of more than 8192 groups
 * take the scalar path (and more than SL_QINT8_MAX_GROUPS the float path
 * rather than int8); results stay right and per-token bits unchanged. */
TEST(test_quant_matmul_long_rows) {
    const int64_t Ks[] = {64 * 512 + 7, 64 * 8192 + 1};
    const int64_t Ts[] = {20, 2};
    for (size_t i = 0; i < 2; i++) {
        const int64_t N = 5, K = Ks[i], T = Ts[i];
        float *w = malloc(sizeof(float) * (size_t)(N * K)),
              *x = malloc(sizeof(float) * (size_t)(T * K));
        double *ref = malloc(sizeof(double) * (size_t)(T * N));
        float *y = malloc(sizeof(float) * (size_t)(T * N)), y1[5];
        float *yf = malloc(sizeof(float) * (size_t)(T * N));
        for (int64_t j = 0; j < N * K; j++)
            w[j] = frand() * 0.3f;
        for (int64_t j = 0; j < T * K; j++)
            x[j] = frand();
        const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
        for (size_t d = 0; d < 2; d++) {
            qmat m;
            qmat_init(&m, dts[d], N, K);
            qmat_quantize(&m, w);
            matmul_ref(&m, x, T, ref);
            sl_backend be;
            sl_backend_cpu_init(&be, 2, sl_cpu_best_isa());
            for (int p = SL_QPATH_FLOAT; p <= SL_QPATH_INT8; p++) {
                for (int64_t j = 0; j < T * N; j++)
                    y[j] = POISON;
                sl_matmul_quant_cpu_path(&be, y, x, &m.t, (int32_t)T, (sl_qpath)p);
                const int int8 = p == SL_QPATH_INT8 && sl_quant_int8_available(&be) &&
                                 sl_qgroups(K) <= SL_QINT8_MAX_GROUPS;
                if (int8) {
                    err_stats st = {0};
                    check_int8(&m, x, T, y, ref, &st, "long rows int8");
                } else {
                    double worst = 0;
                    for (int64_t j = 0; j < T * N; j++)
                        worst = fmax(worst, fabs(y[j] - ref[j]) / (1 + fabs(ref[j])));
                    /* float rounding grows like sqrt(K): 1e-5 at K = 2048 */
                    const double tol = 1e-5 * sqrt((double)K / 2048);
                    CHECKF(worst < tol, "%s K=%lld T=%lld: error %g", sl_dtype_name(dts[d]),
                           (long long)K, (long long)T, worst);
                    if (p == SL_QPATH_FLOAT)
                        memcpy(yf, y, sizeof(float) * (size_t)(T * N));
                    else
                        CHECK(memcmp(y, yf, sizeof(float) * (size_t)(T * N)) == 0);
                }
                for (int64_t t = 0; t < T; t += T - 1) { /* first and last token alone */
                    sl_matmul_quant_cpu_path(&be, y1, x + t * K, &m.t, 1, (sl_qpath)p);
                    CHECK(memcmp(y1, y + t * N, sizeof y1) == 0);
                }
            }
            qmat_free(&m);
        }
        free(w), free(x), free(ref), free(y), free(yf);
    }
}

/* Issue 24: rows of x holding Inf or NaN (an overflowed layer) go through every ISA and both
 * paths without undefined behaviour (the sanitizer build runs this: the int8 path once summed
 * the int32 codes of NaN, INT_MIN each, and overflowed), and come out non-finite in every
 * output of that token, so the check on the logits sees them; the finite tokens of the batch
 * keep the bits they have alone. */
TEST(test_quant_nonfinite_activations) {
    const sl_dtype dts[] = {SL_DTYPE_Q8, SL_DTYPE_Q4};
    const int64_t Ks[] = {75, 131, 64 * 40 + 3};
    enum { N = 21, T = 8 };
    const int best = (int)sl_cpu_best_isa();
    for (size_t d = 0; d < 2; d++)
        for (size_t ik = 0; ik < sizeof Ks / sizeof Ks[0]; ik++) {
            const int64_t K = Ks[ik], G = sl_qgroups(K);
            float *w = malloc(sizeof(float) * (size_t)(N * K));
            float *x = malloc(sizeof(float) * (size_t)(T * K));
            float *y = malloc(sizeof(float) * (size_t)(T * N)), y1[N];
            for (int64_t i = 0; i < N * K; i++)
                w[i] = frand() * 0.2f + 0.01f;
            for (int64_t i = 0; i < T * K; i++)
                x[i] = frand();
            float *r;
            r = x + 1 * K, r[7] = INFINITY; /* one +Inf */
            r = x + 2 * K, r[K / 2] = NAN;  /* one NaN */
            r = x + 3 * K;                  /* a whole group of NaN */
            for (int64_t k = 0; k < SL_MIN(K, 64); k++)
                r[k] = NAN;
            r = x + 4 * K, r[1] = INFINITY, r[2] = -INFINITY; /* Inf - Inf in one group */
            r = x + 5 * K, r[K - 1] = -INFINITY;              /* in the short last group */
            r = x + 6 * K;                                    /* all of it non-finite */
            for (int64_t k = 0; k < K; k++)
                r[k] = k % 3 ? NAN : (k & 1 ? INFINITY : -INFINITY);
            r = x + 7 * K; /* finite, but the group's sum overflows */
            for (int64_t k = 0; k < SL_MIN(K, 64); k++)
                r[k] = 3e38f;
            qmat m;
            qmat_init(&m, dts[d], N, K);
            qmat_quantize(&m, w);
            for (int isa = SL_ISA_SCALAR; isa <= best; isa++)
                for (int p = SL_QPATH_FLOAT; p <= SL_QPATH_INT8; p++) {
                    sl_backend be;
                    sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                    const char *what =
                        p == SL_QPATH_INT8 && sl_quant_int8_available(&be) ? "int8" : "float";
                    for (int64_t i = 0; i < T * N; i++)
                        y[i] = POISON;
                    sl_matmul_quant_cpu_path(&be, y, x, &m.t, T, (sl_qpath)p);
                    for (int t = 1; t < T; t++)
                        for (int n = 0; n < N; n++)
                            CHECKF(!isfinite(y[t * N + n]),
                                   "isa %s %s %s K=%lld (%lld groups): token %d row %d is %g",
                                   sl_isa_name(be.isa), sl_dtype_name(dts[d]), what, (long long)K,
                                   (long long)G, t, n, y[t * N + n]);
                    sl_matmul_quant_cpu_path(&be, y1, x, &m.t, 1, (sl_qpath)p);
                    CHECKF(memcmp(y1, y, sizeof y1) == 0, "isa %s %s %s K=%lld: finite token",
                           sl_isa_name(be.isa), sl_dtype_name(dts[d]), what, (long long)K);
                    for (int n = 0; n < N; n++)
                        CHECK(isfinite(y1[n]));
                }
            qmat_free(&m);
            free(w), free(x), free(y);
        }
}
