/*
 * The op table (ops_table.h): the cases, the plain references and the runner.
 *
 * A case is a row {op, runner, dtype, eight integer parameters, tolerance}; the runner builds
 * its inputs from a generator seeded by the row's index (the same inputs whatever the filter),
 * runs the op on the backend and checks every output buffer with ot_check. References are
 * computed in double from the float inputs, so they hold no backend's rounding.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blocks.h"
#include "kernels/quant.h"
#include "ops_table.h"

/* ------------------------------------------------------------- the run */

typedef struct ot_case ot_case;

typedef struct ot_run {
    const sl_backend *be;
    const ops_table_params *p;
    const ot_case *c; /* the case running */
    uint64_t rng;
    /* the op's verdict over its cases */
    int cases, bad, skipped;
    double max_err;
    char first_bad[320];
    /* F8_E4M3 weights of this case: rows and columns per scale block (0: 128) and the row
     * phase of the view (rows of its first block above row 0); matmul rows set them. */
    int32_t f8_brows, f8_group, f8_phase;
} ot_run;

/* One row of the table. Rows of one op sit together: the runner reports per op. */
struct ot_case {
    const char *op;                           /* the sl_ops field it tests */
    void (*run)(ot_run *r, const ot_case *c); /* builds, runs and checks the case */
    sl_dtype dt;                              /* the weight's dtype, where the op has one */
    int32_t p[10];                            /* sizes and switches, as each runner documents */
    double tol;                               /* relative to max(|ref|, rms(ref)); 0: exact */
};

static float frand(ot_run *r) { /* uniform in [-1, 1) */
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return (float)((r->rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rand_vec(ot_run *r, size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = frand(r) * scale;
    return v;
}

/* A reference buffer: NaN (must stay unwritten) until the reference sets it. */
static double *ref_vec(size_t n) {
    double *v = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
    return v;
}

/* Backend memory holding a copy of host bytes. */
static void *up(ot_run *r, const void *h, size_t bytes) {
    void *d = r->be->ops->alloc(r->be, bytes ? bytes : 4);
    SL_ASSERT(d);
    if (bytes) r->be->ops->to_dev(r->be, d, h, bytes);
    return d;
}
#define UPF(r, h, n) ((float *)up((r), (h), (size_t)(n) * sizeof(float)))

/* Backend memory of n floats, all NaN. */
static float *poisoned(ot_run *r, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = UPF(r, h, n);
    free(h);
    return d;
}

static void dfree(ot_run *r, void *d) {
    if (d) r->be->ops->release(r->be, d);
}

/* Records a failing case; the first one's description is kept (the case's dtype and
 * parameters, then what the format says). */
__attribute__((format(printf, 2, 3))) static void fail(ot_run *r, const char *fmt, ...) {
    if (!r->bad) {
        int n = snprintf(r->first_bad, sizeof r->first_bad, "%s {", sl_dtype_name(r->c->dt));
        for (int j = 0; j < 8; j++)
            n += snprintf(r->first_bad + n, sizeof r->first_bad - (size_t)n, j ? ",%d" : "%d",
                          r->c->p[j]);
        n += snprintf(r->first_bad + n, sizeof r->first_bad - (size_t)n, "} ");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first_bad + n, sizeof r->first_bad - (size_t)n, fmt, ap);
        va_end(ap);
    }
    r->bad++;
}

/* Compares n floats of backend memory with ref (NaN: must have stayed NaN); tol as the header
 * says. Returns 0 when they agree. */
static int ot_check(ot_run *r, const char *what, const float *dev, const double *ref, size_t n,
                    double tol) {
    float *got = malloc((n ? n : 1) * sizeof(float));
    r->be->ops->to_host(r->be, got, dev, n * sizeof(float));
    double ss = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(ref[i])) ss += ref[i] * ref[i], cnt++;
    const double rms = cnt ? sqrt(ss / (double)cnt) : 0;
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        if (isnan(ref[i])) {
            if (!isnan(got[i])) {
                fail(r, "%s[%zu]: written (%.9g), should be untouched", what, i, got[i]);
                bad = 1;
            }
            continue;
        }
        if (!isfinite(got[i])) {
            fail(r, "%s[%zu]: got %.9g want %.9g", what, i, got[i], ref[i]);
            bad = 1;
            continue;
        }
        const double err = tol == 0 ? (got[i] == (float)ref[i] ? 0 : INFINITY)
                                    : fabs(got[i] - ref[i]) / fmax(fmax(fabs(ref[i]), rms), 1e-30);
        if (err > tol) {
            fail(r, "%s[%zu]: got %.9g want %.9g (err %.2e)", what, i, got[i], ref[i], err);
            bad = 1;
        } else if (err > r->max_err) {
            r->max_err = err;
        }
    }
    free(got);
    return bad;
}

/* The tolerance of a product with weights of dtype dt. */
static double prod_tol(const ot_run *r, sl_dtype dt, double tol) {
    /* int8 activations: each group's rounding is d/2 of a 127-step grid (quant.h), a relative
     * error of some 1e-2 of the output's rms at these sizes; 6e-2 bounds its tail. */
    if ((dt == SL_DTYPE_Q4 && r->p->q4_int8) || (dt == SL_DTYPE_Q8 && r->p->q8_int8))
        return fmax(tol, 6e-2);
    /* int8 activations per 32 columns (cpu_blocks_int8.c): typically 0.4% of the output's rms,
     * up to 3% in the tail of these small products (and of the experts' two in a row) */
    return sl_dtype_is_block(dt) && r->p->block_int8 && sl_blocks_int8_type(dt) ? fmax(tol, 6e-2)
                                                                                : tol;
}

/* --------------------------------------------------------- weights */

/* A weight on both sides: the host tensor for the reference, the backend's copy for the op,
 * and its values widened (by the library's reference conversions). */
typedef struct ot_weight {
    sl_tensor h, d;
    void *hdata, *dalloc, *ds, *db;
    uint16_t *hs, *hb;
    float *wide; /* [rows, K] */
} ot_weight;

/* An F8_E4M3 matrix with F32 block scales, quantised as Hugging Face's conversion does (per
 * block scale amax / 448): the view of rows [phase, phase + N) of a matrix one phase taller, so
 * that a view starting mid-block is checked too. */
static void weight_make_fp8(ot_run *r, ot_weight *w, int64_t N, int64_t K, float scale,
                            int misalign) {
    const int32_t br = r->f8_brows ? r->f8_brows : 128, bc = r->f8_group ? r->f8_group : 128;
    const int64_t ph = r->f8_phase, all = N + ph, nrb = (all + br - 1) / br,
                  ncb = (K + bc - 1) / bc;
    float *tmp = rand_vec(r, (size_t)(all * K), scale), *sc = malloc((size_t)(nrb * ncb + 1) * 4);
    uint8_t *q = calloc((size_t)(all * K) + 1, 1);
    for (int64_t i = 0; i < nrb; i++)
        for (int64_t j = 0; j < ncb; j++) {
            float amax = 0;
            for (int64_t n = i * br; n < SL_MIN(all, (i + 1) * br); n++)
                for (int64_t k = j * bc; k < SL_MIN(K, (j + 1) * bc); k++)
                    amax = fmaxf(amax, fabsf(tmp[n * K + k]));
            const float s = amax > 0 ? amax / 448.0f : 1.0f;
            sc[i * ncb + j] = s;
            for (int64_t n = i * br; n < SL_MIN(all, (i + 1) * br); n++)
                for (int64_t k = j * bc; k < SL_MIN(K, (j + 1) * bc); k++)
                    q[n * K + k] = sl_f32_to_fp8_e4m3(tmp[n * K + k] / s);
        }
    free(tmp);
    memset(w, 0, sizeof *w);
    w->hdata = q;
    w->hs = (uint16_t *)sc;
    const sl_tensor full = {.name = "w",
                            .dtype = SL_DTYPE_F8_E4M3,
                            .ndim = 2,
                            .shape = {all, K},
                            .data = q,
                            .nbytes = (size_t)(all * K),
                            .scales = w->hs,
                            .group = bc,
                            .brows = br,
                            .sdtype = SL_DTYPE_F32};
    w->h = sl_fp8_rows(&full, ph, N);
    w->wide = malloc((size_t)(N * K + 1) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        sl_dequant_fp8_row(&w->h, n, w->wide + n * K);
    const size_t off = misalign ? 4 : 0;
    w->dalloc = r->be->ops->alloc(r->be, full.nbytes + 16);
    SL_ASSERT(w->dalloc);
    r->be->ops->to_dev(r->be, (uint8_t *)w->dalloc + off, q, full.nbytes);
    w->ds = up(r, sc, (size_t)(nrb * ncb) * 4);
    sl_tensor fd = full;
    fd.data = (uint8_t *)w->dalloc + off;
    fd.scales = w->ds;
    w->d = sl_fp8_rows(&fd, ph, N);
}

/* shape [N, K] (N > 0) or [K] (N == 0); misalign moves the backend's data 4 bytes off its
 * allocation's alignment. */
static void weight_make(ot_run *r, ot_weight *w, sl_dtype dt, int64_t N, int64_t K, float scale,
                        int misalign) {
    if (dt == SL_DTYPE_F8_E4M3) {
        weight_make_fp8(r, w, N, K, scale, misalign);
        return;
    }
    memset(w, 0, sizeof *w);
    const int64_t rows = N ? N : 1, G = sl_qgroups(K);
    const size_t rb = sl_row_bytes(dt, K), nbytes = rb * (size_t)rows;
    w->hdata = calloc(nbytes + 1, 1);
    w->wide = malloc((size_t)(rows * K + 1) * sizeof(float));
    if (sl_dtype_is_quant(dt)) {
        w->hs = malloc((size_t)(rows * G) * 2 + 2);
        w->hb = malloc((size_t)(rows * G) * 2 + 2);
    }
    float *tmp = malloc((size_t)(K + 1) * sizeof(float));
    for (int64_t n = 0; n < rows; n++) {
        for (int64_t k = 0; k < K; k++)
            tmp[k] = frand(r) * scale;
        uint8_t *row = (uint8_t *)w->hdata + (size_t)n * rb;
        if (sl_dtype_is_block(dt)) /* any valid blocks will do: the reference widens these */
            sl_quant_row_simple(dt, tmp, row, K);
        else if (sl_dtype_is_quant(dt))
            sl_quantize_row(dt, tmp, K, row, w->hs + n * G, w->hb + n * G);
        else if (dt == SL_DTYPE_F32)
            memcpy(row, tmp, (size_t)K * sizeof(float));
        else
            for (int64_t k = 0; k < K; k++)
                ((uint16_t *)row)[k] =
                    dt == SL_DTYPE_BF16 ? sl_f32_to_bf16(tmp[k]) : sl_f32_to_f16(tmp[k]);
    }
    free(tmp);
    w->h = (sl_tensor){.name = "w",
                       .dtype = dt,
                       .ndim = N ? 2 : 1,
                       .shape = {N ? N : K, N ? K : 0},
                       .data = w->hdata,
                       .nbytes = nbytes,
                       .scales = w->hs,
                       .biases = w->hb};
    for (int64_t n = 0; n < rows; n++)
        if (sl_dtype_is_block(dt))
            sl_dequant_row(dt, (const uint8_t *)w->hdata + (size_t)n * rb, w->wide + n * K, K);
        else if (sl_dtype_is_quant(dt))
            sl_dequantize_row(&w->h, n, w->wide + n * K);
        else
            sl_to_f32(w->wide + n * K, w->hdata, dt, (size_t)(n * K), (size_t)K);
    w->d = w->h;
    const size_t off = misalign ? 4 : 0;
    w->dalloc = r->be->ops->alloc(r->be, nbytes + 16);
    SL_ASSERT(w->dalloc);
    r->be->ops->to_dev(r->be, (uint8_t *)w->dalloc + off, w->hdata, nbytes);
    w->d.data = (uint8_t *)w->dalloc + off;
    if (w->hs) {
        w->ds = up(r, w->hs, (size_t)(rows * G) * 2);
        w->db = up(r, w->hb, (size_t)(rows * G) * 2);
        w->d.scales = w->ds;
        w->d.biases = w->db;
    }
}

/* MLX checkpoints' Q8/Q4 layouts (mlx_ckpt.h): layout 1 groups of 32 with BF16 scales, 2 groups
 * of 128 with F16, 3 groups of 32 with F32. w (made by weight_make) keeps its codes and gets new
 * scales and biases, random values exact in every dtype (negative scales too, as MLX writes). */
static void weight_relayout(ot_run *r, ot_weight *w, int layout) {
    static const int32_t groups[] = {0, 32, 128, 32};
    static const sl_dtype sds[] = {0, SL_DTYPE_BF16, SL_DTYPE_F16, SL_DTYPE_F32};
    const int64_t N = w->h.shape[0], K = w->h.shape[1];
    w->h.group = groups[layout];
    w->h.sdtype = sds[layout];
    const size_t n = sl_tensor_scale_bytes(&w->h), ss = sds[layout] == SL_DTYPE_F32 ? 4 : 2;
    free(w->hs), free(w->hb), dfree(r, w->ds), dfree(r, w->db);
    void *hs = malloc(n + 4), *hb = malloc(n + 4);
    for (size_t i = 0; i < n / ss; i++)
        for (int j = 0; j < 2; j++) {
            /* 8 significant bits, |v| in [2^-9, 2^-3] */
            const float v = ldexpf((float)(128 + (int)(frand(r) * 127.0f)) / 256.0f,
                                   -3 - (int)(fabsf(frand(r)) * 6.0f)) *
                            (frand(r) < 0 ? -1.0f : 1.0f);
            void *p = j ? hb : hs;
            if (ss == 4)
                ((float *)p)[i] = v;
            else
                ((uint16_t *)p)[i] =
                    sds[layout] == SL_DTYPE_F16 ? sl_f32_to_f16(v) : sl_f32_to_bf16(v);
        }
    w->hs = hs, w->hb = hb;
    w->h.scales = hs, w->h.biases = hb;
    for (int64_t r0 = 0; r0 < N; r0++)
        sl_dequantize_row(&w->h, r0, w->wide + r0 * K);
    const void *dd = w->d.data;
    w->d = w->h;
    w->d.data = dd;
    w->ds = up(r, hs, n), w->db = up(r, hb, n);
    w->d.scales = w->ds, w->d.biases = w->db;
}

static void weight_free(ot_run *r, ot_weight *w) {
    free(w->hdata), free(w->hs), free(w->hb), free(w->wide);
    dfree(r, w->dalloc), dfree(r, w->ds), dfree(r, w->db);
}

/* y[t][n] = sum_k w[n][k] x[t][k] in double. */
static void ref_matmul(double *y, const float *x, const float *w, int64_t N, int64_t K, int64_t T) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)w[n * K + k] * x[t * K + k];
            y[t * N + n] = acc;
        }
}

static double silu(double v) {
    return v / (1 + exp(-v));
}
static double sigm(double v) {
    return 1 / (1 + exp(-v));
}
/* act of sl_act in double (activate, act_mul) */
static double act_ref(double v, sl_act act) {
    switch (act) {
    case SL_ACT_NONE: return v;
    case SL_ACT_SIGMOID: return sigm(v);
    case SL_ACT_GELU_TANH:
        return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case SL_ACT_TANH: return tanh(v);
    default: return silu(v);
    }
}

/* Per row of n: x * rsqrt(mean(x^2) + eps), in double. */
static void ref_rmsnorm(double *y, const double *x, const float *w, int64_t rows, int64_t n,
                        double eps, double off) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++)
            ss += x[r * n + i] * x[r * n + i];
        const double inv = 1 / sqrt(ss / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] = x[r * n + i] * inv * (w ? off + w[i] : 1);
    }
}

static double *widen(const float *x, size_t n) {
    double *d = calloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* NeoX RoPE of row v of one head, in double. */
static void ref_rope_head(double *v, int32_t rot, const float *c, const float *s) {
    for (int32_t i = 0; i < rot / 2; i++) {
        const double a = v[i], b = v[i + rot / 2];
        v[i] = a * c[i] - b * s[i];
        v[i + rot / 2] = b * c[i] + a * s[i];
    }
}

/* The same on interleaved pairs (2i, 2i + 1). */
static void ref_rope_head_inter(double *v, int32_t rot, const float *c, const float *s) {
    for (int32_t i = 0; i < rot / 2; i++) {
        const double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = b * c[i] + a * s[i];
    }
}

static void rope_tables(ot_run *r, float **ct, float **st, int32_t P, int32_t half) {
    *ct = malloc((size_t)(P * half + 1) * sizeof(float));
    *st = malloc((size_t)(P * half + 1) * sizeof(float));
    for (int32_t i = 0; i < P * half; i++) {
        const float a = frand(r) * 3.14159f;
        (*ct)[i] = cosf(a), (*st)[i] = sinf(a);
    }
}

/* ------------------------------------------------------------- memory */

/* p: n */
static void run_alloc(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0];
    float *d = r->be->ops->alloc(r->be, n * sizeof(float));
    double *ref = calloc(n, sizeof(double));
    ot_check(r, "zero-filled", d, ref, n, 0);
    free(ref), dfree(r, d);
}

/* p: n, how (0 to_dev/to_host, 1 pinned, 2 to_host_begin/end, 3 to_dev_async + copy_join,
 * 4 a graph) */
static void run_copies(ot_run *r, const ot_case *c) {
    const sl_ops *o = r->be->ops;
    const size_t n = (size_t)c->p[0], tot = n + 3;
    const int how = c->p[1];
    if ((how == 1 && !o->pin) || (how == 2 && !o->to_host_begin) || (how == 4 && !o->graph_begin)) {
        r->skipped++;
        return;
    }
    float *h = rand_vec(r, tot, 1);
    double *ref = ref_vec(tot);
    float *d = poisoned(r, tot);
    if (how == 1) o->pin(r->be, h, n * sizeof(float));
    if (how == 3) {
        float *src = r->be->ops->alloc(r->be, n * sizeof(float));
        o->to_dev_async(r->be, src, h, n * sizeof(float));
        if (o->copy_join) o->copy_join(r->be);
        o->copy2d(r->be, d, n, src, n, 1, (int32_t)n); /* an op that sees the copied bytes */
        o->sync(r->be);
        dfree(r, src);
    } else if (how == 4) {
        float *src = UPF(r, h, n);
        o->fill(r->be, d, 0, n);
        o->graph_begin(r->be);
        o->axpy(r->be, d, 2.0f, src, n);
        if (o->graph_end(r->be, 1) < 0) o->axpy(r->be, d, 2.0f, src, n);
        o->sync(r->be);
        dfree(r, src);
    } else {
        o->to_dev(r->be, d, h, n * sizeof(float));
    }
    for (size_t i = 0; i < n; i++)
        ref[i] = how == 4 ? 2.0 * h[i] : h[i];
    if (how == 2 && n * sizeof(float) <= SL_PEEK_BYTES) {
        float *back = malloc(n * sizeof(float) + 1);
        o->to_host_begin(r->be, back, d, n * sizeof(float));
        o->to_host_end(r->be);
        for (size_t i = 0; i < n; i++)
            if (back[i] != h[i]) {
                fail(r, "to_host_begin[%zu]: got %.9g want %.9g", i, back[i], h[i]);
                break;
            }
        free(back);
    }
    ot_check(r, "copy", d, ref, tot, 0);
    if (how == 1) o->unpin(r->be, h);
    free(h), free(ref), dfree(r, d);
}

/* p: n */
static void run_fill(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0], tot = n + 5;
    float *d = poisoned(r, tot);
    double *ref = ref_vec(tot);
    r->be->ops->fill(r->be, d, 0.25f, n);
    for (size_t i = 0; i < n; i++)
        ref[i] = 0.25;
    ot_check(r, "dst", d, ref, tot, 0);
    free(ref), dfree(r, d);
}

/* p: rows, cols, src_ld, dst_ld, overlap (dst 2 rows and 1 element before src, same buffer) */
static void run_copy2d(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], cols = c->p[1];
    const size_t sld = (size_t)c->p[2], dld = (size_t)c->p[3];
    if (c->p[4]) {
        const size_t n = (size_t)(rows + 2) * sld + 1;
        float *b = rand_vec(r, n, 1), *db = UPF(r, b, n);
        double *ref = widen(b, n);
        for (int32_t i = 0; i < rows; i++)
            for (int32_t j = 0; j < cols; j++)
                ref[(size_t)i * sld + (size_t)j] = b[(size_t)(i + 2) * sld + 1 + (size_t)j];
        r->be->ops->copy2d(r->be, db, sld, db + 2 * sld + 1, sld, rows, cols);
        ot_check(r, "overlapping", db, ref, n, 0);
        free(b), free(ref), dfree(r, db);
        return;
    }
    const size_t sn = (size_t)rows * sld, dn = (size_t)rows * dld + 3;
    float *s = rand_vec(r, sn, 1), *ds = UPF(r, s, sn), *dd = poisoned(r, dn);
    double *ref = ref_vec(dn);
    for (int32_t i = 0; i < rows; i++)
        for (int32_t j = 0; j < cols; j++)
            ref[(size_t)i * dld + (size_t)j] = s[(size_t)i * sld + (size_t)j];
    r->be->ops->copy2d(r->be, dd, dld, ds, sld, rows, cols);
    ot_check(r, "dst", dd, ref, dn, 0);
    free(s), free(ref), dfree(r, ds), dfree(r, dd);
}

/* p: cols, with dst index list, with src index list */
static void run_copy_rows(ot_run *r, const ot_case *c) {
    enum { N = 5, SRC_ROWS = 8, DST_ROWS = 10 };
    const int32_t cols = c->p[0];
    const int32_t si[N] = {7, 0, 3, 3, 5}, di[N] = {9, 2, 4, 0, 6};
    const size_t dn = (size_t)DST_ROWS * (size_t)cols;
    float *s = rand_vec(r, (size_t)SRC_ROWS * cols, 1), *ds = UPF(r, s, SRC_ROWS * cols);
    float *dd = poisoned(r, dn);
    int32_t *dsi = up(r, si, sizeof si), *ddi = up(r, di, sizeof di);
    double *ref = ref_vec(dn);
    for (int32_t i = 0; i < N; i++)
        for (int32_t j = 0; j < cols; j++)
            ref[(size_t)(c->p[1] ? di[i] : i) * (size_t)cols + (size_t)j] =
                s[(size_t)(c->p[2] ? si[i] : i) * (size_t)cols + (size_t)j];
    r->be->ops->copy_rows(r->be, dd, c->p[1] ? ddi : NULL, ds, c->p[2] ? dsi : NULL, N, cols);
    ot_check(r, "dst", dd, ref, dn, 0);
    free(s), free(ref), dfree(r, ds), dfree(r, dd), dfree(r, dsi), dfree(r, ddi);
}

/* ------------------------------------------------------------ products */

/* p: N, K, T, bias (0 none, 1 F32, 2 BF16, 3 a bias tensor without data), misaligned weight;
 * Q8/Q4: p[5] an MLX layout (weight_relayout);
 * F8_E4M3: rows and columns per scale block (0: 128), row phase of the view */
static void run_matmul(ot_run *r, const ot_case *c) {
    const int32_t N = c->p[0], K = c->p[1], T = c->p[2];
    r->f8_brows = c->p[5], r->f8_group = c->p[6], r->f8_phase = c->p[7];
    ot_weight w, b;
    weight_make(r, &w, c->dt, N, K, 0.5f, c->p[4]);
    if (c->p[5] && sl_dtype_is_quant(c->dt)) weight_relayout(r, &w, c->p[5]); /* MLX layouts */
    weight_make(r, &b, c->p[3] == 2 ? SL_DTYPE_BF16 : SL_DTYPE_F32, 0, N, 0.5f, 0);
    sl_tensor bd = b.d;
    if (c->p[3] == 3) bd.data = NULL;
    const size_t yn = (size_t)T * N + 7;
    float *x = rand_vec(r, (size_t)T * K, 1), *dx = UPF(r, x, (size_t)T * K), *dy = poisoned(r, yn);
    double *ref = ref_vec(yn);
    ref_matmul(ref, x, w.wide, N, K, T);
    if (c->p[3] == 1 || c->p[3] == 2)
        for (int32_t t = 0; t < T; t++)
            for (int32_t n = 0; n < N; n++)
                ref[(size_t)t * N + n] += b.wide[n];
    r->be->ops->matmul(r->be, dy, dx, &w.d, c->p[3] ? &bd : NULL, T);
    ot_check(r, "y", dy, ref, yn, prod_tol(r, c->dt, c->tol));
    free(x), free(ref), dfree(r, dx), dfree(r, dy);
    weight_free(r, &w), weight_free(r, &b);
}

/* p: items, K, mixed dtypes (0: dt for all; 1: float and Q8/Q4; 2: block types), T0, an MLX
 * layout for the quantised items but the first (weight_relayout; 0: none). Item i: N = 5 + 7 i
 * rows, T = 1 + i % 3 (T0 = 0: the decode products), 1 (T0 < 0: one token each, as a decode
 * step's experts) or T0 + 13 i (a prompt's). */
static void run_matmul_batch(ot_run *r, const ot_case *c) {
    enum { MAXN = 8 };
    static const sl_dtype mix[] = {SL_DTYPE_F32, SL_DTYPE_Q4, SL_DTYPE_BF16, SL_DTYPE_Q8,
                                   SL_DTYPE_F16};
    static const sl_dtype mix_blocks[] = {SL_DTYPE_Q4_K, SL_DTYPE_Q8_0, SL_DTYPE_BF16,
                                          SL_DTYPE_Q6_K, SL_DTYPE_MXFP4};
    const int32_t n = c->p[0], K = c->p[1];
    ot_weight w[MAXN];
    float *x[MAXN] = {0}, *dx[MAXN] = {0}, *dy[MAXN] = {0};
    const float *cdx[MAXN] = {0};
    const sl_tensor *wd[MAXN] = {0};
    int32_t Ts[MAXN] = {0};
    double *ref[MAXN] = {0};
    for (int32_t i = 0; i < n; i++) {
        const int32_t N = 5 + 7 * i;
        Ts[i] = c->p[3] > 0 ? c->p[3] + 13 * i : c->p[3] < 0 ? 1 : 1 + i % 3;
        const sl_dtype dt = c->p[2] == 1 ? mix[i % 5] : c->p[2] == 2 ? mix_blocks[i % 5] : c->dt;
        weight_make(r, &w[i], dt, N, K, 0.5f, 0);
        /* p[4]: an MLX layout for the quantised items past the first (a batch of mixed scales) */
        if (c->p[4] && i > 0 && sl_dtype_is_quant(dt)) weight_relayout(r, &w[i], c->p[4]);
        x[i] = rand_vec(r, (size_t)Ts[i] * K, 1);
        cdx[i] = dx[i] = UPF(r, x[i], (size_t)Ts[i] * K);
        dy[i] = poisoned(r, (size_t)Ts[i] * N + 3);
        ref[i] = ref_vec((size_t)Ts[i] * N + 3);
        ref_matmul(ref[i], x[i], w[i].wide, N, K, Ts[i]);
        wd[i] = &w[i].d;
    }
    r->be->ops->matmul_batch(r->be, dy, cdx, wd, Ts, n);
    for (int32_t i = 0; i < n; i++) {
        const size_t yn = (size_t)Ts[i] * (size_t)w[i].h.shape[0] + 3;
        ot_check(r, "y[i]", dy[i], ref[i], yn, prod_tol(r, w[i].h.dtype, c->tol));
        /* bitwise what matmul gives */
        float *alone = poisoned(r, yn);
        r->be->ops->matmul(r->be, alone, dx[i], wd[i], NULL, Ts[i]);
        float *got = malloc(yn * sizeof(float));
        r->be->ops->to_host(r->be, got, alone, yn * sizeof(float));
        double *want = widen(got, yn);
        ot_check(r, "y[i] vs matmul", dy[i], want, yn, 0);
        free(got), free(want), dfree(r, alone);
        free(x[i]), free(ref[i]), dfree(r, dx[i]), dfree(r, dy[i]);
        weight_free(r, &w[i]);
    }
}

/* p: V, n, T */
static void run_embed(ot_run *r, const ot_case *c) {
    const int32_t V = c->p[0], n = c->p[1], T = c->p[2];
    const int32_t ids[6] = {0, V - 1, 7 % V, 7 % V, 13 % V, 2 % V};
    ot_weight w;
    weight_make(r, &w, c->dt, V, n, 1.0f, 0);
    int32_t *dids = up(r, ids, sizeof ids);
    const size_t yn = (size_t)T * n + 5;
    float *dy = poisoned(r, yn);
    double *ref = ref_vec(yn);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < n; i++)
            ref[(size_t)t * n + i] = w.wide[(size_t)ids[t] * n + i];
    r->be->ops->embed(r->be, dy, &w.d, dids, T);
    ot_check(r, "y", dy, ref, yn, c->tol);
    free(ref), dfree(r, dy), dfree(r, dids), weight_free(r, &w);
}

/* ---------------------------------------------------------------- norms */

/* p: rows, n, w_offset, in place */
static void run_rmsnorm(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], n = c->p[1];
    const size_t tot = (size_t)rows * n + 4;
    ot_weight w;
    weight_make(r, &w, c->dt, 0, n, 1.0f, 0);
    float *x = rand_vec(r, tot, 2), *dx = UPF(r, x, tot), *dy = c->p[3] ? dx : poisoned(r, tot);
    double *xd = widen(x, tot), *ref = ref_vec(tot);
    ref_rmsnorm(ref, xd, w.wide, rows, n, 1e-6, c->p[2]);
    if (c->p[3])
        for (size_t i = (size_t)rows * n; i < tot; i++)
            ref[i] = x[i];
    r->be->ops->rmsnorm(r->be, dy, dx, &w.d, rows, n, 1e-6f, (float)c->p[2]);
    ot_check(r, "y", dy, ref, tot, c->tol);
    if (!c->p[3]) dfree(r, dy);
    free(x), free(xd), free(ref), dfree(r, dx), weight_free(r, &w);
}

/* p: rows, n, w_offset */
static void run_add_rmsnorm(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], n = c->p[1];
    const size_t tot = (size_t)rows * n + 4, m = (size_t)rows * n;
    ot_weight w;
    weight_make(r, &w, c->dt, 0, n, 1.0f, 0);
    float *x = rand_vec(r, tot, 2), *d = rand_vec(r, tot, 1);
    float *dx = UPF(r, x, tot), *dd = UPF(r, d, tot), *dy = poisoned(r, tot);
    double *xs = widen(x, tot), *ref = ref_vec(tot);
    for (size_t i = 0; i < m; i++)
        xs[i] = (float)(x[i] + d[i]); /* one float add: exact reference */
    ref_rmsnorm(ref, xs, w.wide, rows, n, 1e-6, c->p[2]);
    r->be->ops->add_rmsnorm(r->be, dy, dx, dd, &w.d, rows, n, 1e-6f, (float)c->p[2]);
    ot_check(r, "x", dx, xs, tot, 0);
    ot_check(r, "y", dy, ref, tot, c->tol);
    free(x), free(d), free(xs), free(ref), dfree(r, dx), dfree(r, dd), dfree(r, dy);
    weight_free(r, &w);
}

/* p: rows, n, w_offset, N of the matmul that reads y next (the op may be left to it) */
static void run_add_rmsnorm_next(ot_run *r, const ot_case *c) {
    if (!r->be->ops->add_rmsnorm_next) {
        r->skipped++;
        return;
    }
    const int32_t rows = c->p[0], n = c->p[1], N = c->p[3];
    const size_t tot = (size_t)rows * n + 4, m = (size_t)rows * n, zn = (size_t)rows * N + 3;
    ot_weight w, mw;
    weight_make(r, &w, c->dt, 0, n, 1.0f, 0);
    weight_make(r, &mw, SL_DTYPE_BF16, N, n, 0.5f, 0);
    float *x = rand_vec(r, tot, 2), *d = rand_vec(r, tot, 1);
    float *dx = UPF(r, x, tot), *dd = UPF(r, d, tot), *dxo = poisoned(r, tot);
    float *dy = poisoned(r, tot), *dz = poisoned(r, zn);
    double *xs = ref_vec(tot), *ref = ref_vec(tot), *zref = ref_vec(zn);
    for (size_t i = 0; i < m; i++)
        xs[i] = (float)(x[i] + d[i]);
    ref_rmsnorm(ref, xs, w.wide, rows, n, 1e-6, c->p[2]);
    float *yf = malloc(m * sizeof(float));
    for (size_t i = 0; i < m; i++)
        yf[i] = (float)ref[i];
    ref_matmul(zref, yf, mw.wide, N, n, rows);
    r->be->ops->add_rmsnorm_next(r->be, dy, dxo, dx, dd, &w.d, rows, n, 1e-6f, (float)c->p[2]);
    r->be->ops->matmul(r->be, dz, dy, &mw.d, NULL, rows);
    ot_check(r, "x_out", dxo, xs, tot, 0);
    ot_check(r, "y", dy, ref, tot, c->tol);
    ot_check(r, "next matmul", dz, zref, zn, 1e-4);
    free(x), free(d), free(xs), free(ref), free(zref), free(yf);
    dfree(r, dx), dfree(r, dd), dfree(r, dxo), dfree(r, dy), dfree(r, dz);
    weight_free(r, &w), weight_free(r, &mw);
}

/* p: rows, n, gate (sl_act) */
static void run_gated_rmsnorm(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], n = c->p[1];
    const size_t tot = (size_t)rows * n + 3;
    ot_weight w;
    weight_make(r, &w, c->dt, 0, n, 1.0f, 0);
    float *x = rand_vec(r, tot, 2), *z = rand_vec(r, tot, 3);
    float *dx = UPF(r, x, tot), *dz = UPF(r, z, tot), *dy = poisoned(r, tot);
    double *xd = widen(x, tot), *ref = ref_vec(tot);
    ref_rmsnorm(ref, xd, w.wide, rows, n, 1e-6, 0);
    for (size_t i = 0; i < (size_t)rows * n; i++)
        ref[i] *= c->p[2] == SL_ACT_SIGMOID ? sigm(z[i]) : silu(z[i]);
    r->be->ops->gated_rmsnorm(r->be, dy, dx, dz, &w.d, rows, n, 1e-6f, (sl_act)c->p[2]);
    ot_check(r, "y", dy, ref, tot, c->tol);
    free(x), free(z), free(xd), free(ref), dfree(r, dx), dfree(r, dz), dfree(r, dy);
    weight_free(r, &w);
}

/* p: rows, n */
static void run_l2norm(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], n = c->p[1];
    const size_t tot = (size_t)rows * n + 2;
    float *x = rand_vec(r, tot, 1), *dx = UPF(r, x, tot);
    double *ref = widen(x, tot);
    for (int32_t i = 0; i < rows; i++) {
        double ss = 0;
        for (int32_t j = 0; j < n; j++)
            ss += ref[(size_t)i * n + j] * ref[(size_t)i * n + j];
        for (int32_t j = 0; j < n; j++)
            ref[(size_t)i * n + j] /= sqrt(ss + 1e-6);
    }
    r->be->ops->l2norm(r->be, dx, rows, n, 1e-6f);
    ot_check(r, "x", dx, ref, tot, c->tol);
    free(x), free(ref), dfree(r, dx);
}

/* ------------------------------------------------------------ attention */

/* p: T, heads, head_dim, rot_dim, pos0 */
static void run_rope(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], nh = c->p[1], hd = c->p[2], rot = c->p[3], pos0 = c->p[4];
    const int32_t half = rot / 2, P = pos0 + T;
    float *ct, *st;
    rope_tables(r, &ct, &st, P, half);
    const size_t tot = (size_t)T * nh * hd;
    float *x = rand_vec(r, tot + 2, 1);
    double *ref = widen(x, tot + 2);
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < nh; h++)
            ref_rope_head(ref + ((size_t)t * nh + h) * hd, rot, ct + (size_t)(pos0 + t) * half,
                          st + (size_t)(pos0 + t) * half);
    float *dx = UPF(r, x, tot + 2), *dct = UPF(r, ct, (size_t)P * half),
          *dst = UPF(r, st, (size_t)P * half);
    r->be->ops->rope(r->be, dx, T, nh, hd, rot, pos0, dct, dst);
    ot_check(r, "x", dx, ref, tot + 2, c->tol);
    free(ct), free(st), free(x), free(ref), dfree(r, dx), dfree(r, dct), dfree(r, dst);
}

/* The reference of sl_qkv_args a: q, k normed and roped in place (double), q's temperature,
 * cache rows set. */
static void ref_qkv_prep(double *q, double *k, const float *v, double *kc, double *vc,
                         const float *qn, const float *kn, const sl_qkv_args *a, const float *ct,
                         const float *st) {
    const int32_t T = a->T, pos0 = a->pos0, nh = a->n_heads, nkv = a->n_kv_heads;
    const int32_t hd = a->head_dim, rot = a->rot_dim;
    if (qn) ref_rmsnorm(q, q, qn, (int64_t)T * nh, hd, 1e-6, a->w_offset);
    if (kn) ref_rmsnorm(k, k, kn, (int64_t)T * nkv, hd, 1e-6, a->w_offset);
    const int32_t half = rot / 2;
    void (*rope)(double *, int32_t, const float *, const float *) =
        a->rope_interleaved ? ref_rope_head_inter : ref_rope_head;
    for (int32_t t = 0; t < T; t++) {
        for (int32_t h = 0; h < nh; h++)
            rope(q + ((size_t)t * nh + h) * hd, rot, ct + (size_t)(pos0 + t) * half,
                 st + (size_t)(pos0 + t) * half);
        for (int32_t h = 0; h < nkv; h++)
            rope(k + ((size_t)t * nkv + h) * hd, rot, ct + (size_t)(pos0 + t) * half,
                 st + (size_t)(pos0 + t) * half);
        if (a->temp_floor > 0) {
            const double f =
                log1p(floor((pos0 + t + 1.0) / a->temp_floor)) * (double)a->temp_scale + 1;
            for (size_t i = 0; i < (size_t)nh * hd; i++)
                q[(size_t)t * nh * hd + i] *= f;
        }
    }
    const size_t row = (size_t)nkv * hd;
    for (int32_t t = 0; t < T; t++)
        for (size_t i = 0; i < row; i++) {
            kc[(size_t)(pos0 + t) * row + i] = k[(size_t)t * row + i];
            vc[(size_t)(pos0 + t) * row + i] = v[(size_t)t * row + i];
        }
}

/* The attention inputs of one case, on both sides. */
typedef struct qkv_case {
    int32_t T, pos0, nh, nkv, hd, rot, ctx;
    float *q, *k, *v, *kc, *vc, *ct, *st; /* host */
    float *dq, *dk, *dv, *dkc, *dvc, *dct, *dst;
    ot_weight qn, kn;
    int norms;
    sl_qkv_args a; /* on the backend's buffers */
} qkv_case;

/* cache_rows: how many rows of the caches hold values (the rest NaN, as unwritten); flags:
 * 2 interleaved RoPE, 4 a temperature (floor 3, scale 0.5: it changes every third position). */
static void qkv_make(ot_run *r, qkv_case *s, const int32_t *p, int norms, double off,
                     int32_t cache_rows, int flags) {
    memset(s, 0, sizeof *s);
    s->T = p[0], s->pos0 = p[1], s->nh = p[2], s->nkv = p[3], s->hd = p[4], s->rot = p[5];
    s->ctx = s->pos0 + s->T;
    const size_t qn = (size_t)s->T * s->nh * s->hd, kn = (size_t)s->T * s->nkv * s->hd,
                 cn = (size_t)s->ctx * s->nkv * s->hd;
    s->q = rand_vec(r, qn, 2), s->k = rand_vec(r, kn, 2), s->v = rand_vec(r, kn, 1);
    s->kc = rand_vec(r, cn, 2), s->vc = rand_vec(r, cn, 1);
    for (size_t i = (size_t)cache_rows * s->nkv * s->hd; i < cn; i++)
        s->kc[i] = s->vc[i] = NAN;
    rope_tables(r, &s->ct, &s->st, s->ctx, s->rot / 2);
    s->dq = UPF(r, s->q, qn), s->dk = UPF(r, s->k, kn), s->dv = UPF(r, s->v, kn);
    s->dkc = UPF(r, s->kc, cn), s->dvc = UPF(r, s->vc, cn);
    s->dct = UPF(r, s->ct, (size_t)s->ctx * (s->rot / 2));
    s->dst = UPF(r, s->st, (size_t)s->ctx * (s->rot / 2));
    s->norms = norms;
    if (norms) {
        weight_make(r, &s->qn, SL_DTYPE_BF16, 0, s->hd, 1.0f, 0);
        weight_make(r, &s->kn, SL_DTYPE_F32, 0, s->hd, 1.0f, 0);
    }
    s->a = (sl_qkv_args){.q = s->dq,
                         .k = s->dk,
                         .v = s->dv,
                         .kc = s->dkc,
                         .vc = s->dvc,
                         .q_norm = norms ? &s->qn.d : NULL,
                         .k_norm = norms ? &s->kn.d : NULL,
                         .T = s->T,
                         .pos0 = s->pos0,
                         .n_heads = s->nh,
                         .n_kv_heads = s->nkv,
                         .head_dim = s->hd,
                         .rot_dim = s->rot,
                         .eps = 1e-6f,
                         .w_offset = (float)off,
                         .cos_tab = s->dct,
                         .sin_tab = s->dst,
                         .rope_interleaved = (flags & 2) != 0,
                         .temp_floor = flags & 4 ? 3.0f : 0.0f,
                         .temp_scale = 0.5f};
}

/* The reference of the prep: q, k, kc, vc in double. */
static void qkv_ref(const qkv_case *s, double **q, double **k, double **kc, double **vc) {
    const size_t qn = (size_t)s->T * s->nh * s->hd, kn = (size_t)s->T * s->nkv * s->hd,
                 cn = (size_t)s->ctx * s->nkv * s->hd;
    *q = widen(s->q, qn), *k = widen(s->k, kn), *kc = widen(s->kc, cn), *vc = widen(s->vc, cn);
    ref_qkv_prep(*q, *k, s->v, *kc, *vc, s->norms ? s->qn.wide : NULL, s->norms ? s->kn.wide : NULL,
                 &s->a, s->ct, s->st);
}

static void qkv_free(ot_run *r, qkv_case *s) {
    free(s->q), free(s->k), free(s->v), free(s->kc), free(s->vc), free(s->ct), free(s->st);
    dfree(r, s->dq), dfree(r, s->dk), dfree(r, s->dv), dfree(r, s->dkc), dfree(r, s->dvc);
    dfree(r, s->dct), dfree(r, s->dst);
    if (s->norms) weight_free(r, &s->qn), weight_free(r, &s->kn);
}

/* p: T, pos0, heads, kv heads, head_dim, rot_dim, flags (1 norms, 2 interleaved RoPE, 4 a
 * temperature), w_offset */
static void run_qkv_prep(ot_run *r, const ot_case *c) {
    qkv_case s;
    qkv_make(r, &s, c->p, c->p[6] & 1, c->p[7], c->p[1], c->p[6]);
    double *q, *k, *kc, *vc;
    qkv_ref(&s, &q, &k, &kc, &vc);
    r->be->ops->qkv_prep(r->be, &s.a);
    const size_t qn = (size_t)s.T * s.nh * s.hd, kn = (size_t)s.T * s.nkv * s.hd,
                 cn = (size_t)s.ctx * s.nkv * s.hd;
    ot_check(r, "q", s.dq, q, qn, c->tol);
    ot_check(r, "k", s.dk, k, kn, c->tol);
    ot_check(r, "kc", s.dkc, kc, cn, c->tol);
    ot_check(r, "vc", s.dvc, vc, cn, 0);
    free(q), free(k), free(kc), free(vc);
    qkv_free(r, &s);
}

/* p: T, pos0, heads, kv heads, head_dim, mode (0 dense, 1 a selection of rows, 2 with prep),
 * sliding window (0: none), sinks (1: a logit per head, in c->dt), chunk (0: none; modes 0 and
 * 2), prep flags (qkv_make's; mode 2) */
static void run_attention(ot_run *r, const ot_case *c) {
    const int mode = c->p[5], window = c->p[6], chunk = mode == 1 ? 0 : c->p[8];
    const int32_t q[6] = {c->p[0], c->p[1], c->p[2], c->p[3], c->p[4], c->p[4]};
    qkv_case s;
    qkv_make(r, &s, q, mode == 2, 0, mode == 2 ? q[1] : q[0] + q[1], mode == 2 ? c->p[9] : 0);
    const int32_t T = s.T, nh = s.nh, nkv = s.nkv, hd = s.hd, ctx = s.ctx;
    double *rq, *rk, *kc, *vc;
    if (mode == 2) {
        qkv_ref(&s, &rq, &rk, &kc, &vc);
    } else {
        rq = widen(s.q, (size_t)T * nh * hd), rk = NULL;
        kc = widen(s.kc, (size_t)ctx * nkv * hd), vc = widen(s.vc, (size_t)ctx * nkv * hd);
    }
    /* the selection: every third row and the query's own, ascending */
    int32_t *sel = malloc((size_t)T * ctx * sizeof(int32_t)), *nsel = malloc((size_t)T * 4);
    for (int32_t t = 0; t < T; t++) {
        nsel[t] = 0;
        for (int32_t j = 0; j <= s.pos0 + t; j++)
            if (j % 3 == 1 || j == s.pos0 + t) sel[(size_t)t * ctx + nsel[t]++] = j;
        for (int32_t j = nsel[t]; j < ctx; j++)
            sel[(size_t)t * ctx + j] = -1;
    }
    const size_t on = (size_t)T * nh * hd + 3;
    double *ref = ref_vec(on);
    const double scale = 1 / sqrt((double)hd);
    double *sc = malloc((size_t)ctx * sizeof(double));
    /* sinks around the scores' size, some above every score */
    ot_weight sw = {0};
    if (c->p[7]) weight_make(r, &sw, c->dt, 0, nh, 3, 0);
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < nh; h++) {
            const int32_t p = s.pos0 + t;
            int32_t first = window > 0 && p >= window ? p - window + 1 : 0;
            if (chunk > 0 && p / chunk * chunk > first) first = p / chunk * chunk;
            const int32_t kvh = h / (nh / nkv), n = mode == 1 ? nsel[t] : p + 1 - first;
            double mx = -INFINITY, sum = 0;
            const double sink = c->p[7] ? sw.wide[h] : -INFINITY;
            for (int32_t j = 0; j < n; j++) {
                const int32_t row = mode == 1 ? sel[(size_t)t * ctx + j] : first + j;
                double acc = 0;
                for (int32_t d = 0; d < hd; d++)
                    acc += (double)(float)rq[((size_t)t * nh + h) * hd + d] *
                           (float)kc[((size_t)row * nkv + kvh) * hd + d];
                sc[j] = acc * (float)scale;
                mx = fmax(mx, sc[j]);
            }
            mx = fmax(mx, sink);
            for (int32_t j = 0; j < n; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            sum += exp(sink - mx);
            for (int32_t d = 0; d < hd; d++) {
                double o = 0;
                for (int32_t j = 0; j < n; j++) {
                    const int32_t row = mode == 1 ? sel[(size_t)t * ctx + j] : first + j;
                    o += sc[j] / sum * (float)vc[((size_t)row * nkv + kvh) * hd + d];
                }
                ref[((size_t)t * nh + h) * hd + d] = o;
            }
        }
    const int32_t nth = r->be->n_threads > 0 ? r->be->n_threads : 1;
    float *dout = poisoned(r, on), *scratch = r->be->ops->alloc(r->be, (size_t)nth * ctx * 4);
    int32_t *dsel = up(r, sel, (size_t)T * ctx * 4), *dnsel = up(r, nsel, (size_t)T * 4);
    sl_attn_args a = {.out = dout,
                      .q = s.dq,
                      .kcache = s.dkc,
                      .vcache = s.dvc,
                      .T = T,
                      .pos0 = s.pos0,
                      .n_heads = nh,
                      .n_kv_heads = nkv,
                      .head_dim = hd,
                      .scale = (float)scale,
                      .scratch = scratch,
                      .sel = mode == 1 ? dsel : NULL,
                      .n_sel = mode == 1 ? dnsel : NULL,
                      .sel_stride = ctx,
                      .prep = mode == 2 ? &s.a : NULL,
                      .window = window,
                      .chunk = chunk,
                      .sinks = c->p[7] ? &sw.d : NULL};
    r->be->ops->attention(r->be, &a);
    ot_check(r, "out", dout, ref, on, c->tol);
    if (mode == 2) {
        ot_check(r, "kc", s.dkc, kc, (size_t)ctx * nkv * hd, c->tol);
        ot_check(r, "vc", s.dvc, vc, (size_t)ctx * nkv * hd, 0);
    }
    free(rq), free(rk), free(kc), free(vc), free(sel), free(nsel), free(ref), free(sc);
    if (c->p[7]) weight_free(r, &sw);
    dfree(r, dout), dfree(r, scratch), dfree(r, dsel), dfree(r, dnsel);
    qkv_free(r, &s);
}

/* RoPE of one row's rot dims in double: pairs (i, i + rot/2), or (2i, 2i + 1) interleaved. */
static void ref_rope_pairs(double *v, int32_t rot, int inter, const float *c, const float *s) {
    for (int32_t i = 0; i < rot / 2; i++) {
        const int32_t ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : i + rot / 2;
        const double a = v[ia], b = v[ib];
        v[ia] = a * c[i] - b * s[i];
        v[ib] = b * c[i] + a * s[i];
    }
}

/* p: T, pos0, heads, kv_dim, rope_dim, interleaved, norm dtype BF16 (else F32) */
static void run_latent_attention(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], pos0 = c->p[1], nh = c->p[2], kvd = c->p[3], rd = c->p[4];
    const int inter = c->p[5];
    const int32_t ctx = pos0 + T, half = rd / 2, row = kvd + rd;
    const size_t qn = (size_t)T * nh * row, cn = (size_t)ctx * row, on = (size_t)T * nh * kvd;
    float *q = rand_vec(r, qn, 1), *kv = rand_vec(r, (size_t)T * row, 2);
    float *cache = rand_vec(r, cn, 1);
    for (size_t i = (size_t)pos0 * row; i < cn; i++)
        cache[i] = NAN; /* the prep's rows */
    float *ct, *st;
    rope_tables(r, &ct, &st, ctx, half);
    ot_weight nw;
    weight_make(r, &nw, c->p[6] ? SL_DTYPE_BF16 : SL_DTYPE_F32, 0, kvd, 1.0f, 0);
    /* the reference: the prep, then the attention, in double */
    double *rq = widen(q, qn), *rc = widen(cache, cn), *rkv = widen(kv, (size_t)T * row);
    for (int32_t t = 0; t < T; t++) {
        double *dst = rc + (size_t)(pos0 + t) * row;
        const float *cr = ct + (size_t)(pos0 + t) * half, *sr = st + (size_t)(pos0 + t) * half;
        ref_rmsnorm(dst, rkv + (size_t)t * row, nw.wide, 1, kvd, 1e-6, 0);
        for (int32_t i = 0; i < rd; i++)
            dst[kvd + i] = rkv[(size_t)t * row + kvd + i];
        ref_rope_pairs(dst + kvd, rd, inter, cr, sr);
        for (int32_t h = 0; h < nh; h++)
            ref_rope_pairs(rq + ((size_t)t * nh + h) * row + kvd, rd, inter, cr, sr);
    }
    const double scale = 0.7 / sqrt((double)row);
    double *ref = ref_vec(on + 3), *sc = malloc((size_t)ctx * sizeof(double));
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < nh; h++) {
            const double *qh = rq + ((size_t)t * nh + h) * row;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = 0; j <= pos0 + t; j++) {
                double acc = 0;
                for (int32_t d = 0; d < row; d++)
                    acc += qh[d] * rc[(size_t)j * row + d];
                sc[j] = acc * (float)scale;
                mx = fmax(mx, sc[j]);
            }
            for (int32_t j = 0; j <= pos0 + t; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int32_t d = 0; d < kvd; d++) {
                double o = 0;
                for (int32_t j = 0; j <= pos0 + t; j++)
                    o += sc[j] / sum * rc[(size_t)j * row + d];
                ref[((size_t)t * nh + h) * kvd + d] = o;
            }
        }
    const int32_t nth = r->be->n_threads > 0 ? r->be->n_threads : 1;
    float *dq = UPF(r, q, qn), *dc = UPF(r, cache, cn), *dkv = UPF(r, kv, (size_t)T * row);
    float *dct = UPF(r, ct, (size_t)ctx * half), *dst = UPF(r, st, (size_t)ctx * half);
    float *dout = poisoned(r, on + 3), *scratch = r->be->ops->alloc(r->be, (size_t)nth * ctx * 4);
    const sl_latent_attn_args a = {.out = dout,
                                   .q = dq,
                                   .cache = dc,
                                   .kv = dkv,
                                   .kv_norm = &nw.d,
                                   .T = T,
                                   .pos0 = pos0,
                                   .n_heads = nh,
                                   .kv_dim = kvd,
                                   .rope_dim = rd,
                                   .interleaved = inter,
                                   .eps = 1e-6f,
                                   .w_offset = 0.0f,
                                   .scale = (float)scale,
                                   .cos_tab = dct,
                                   .sin_tab = dst,
                                   .scratch = scratch};
    r->be->ops->latent_attention(r->be, &a);
    ot_check(r, "out", dout, ref, on + 3, c->tol);
    ot_check(r, "cache", dc, rc, cn, c->tol);
    ot_check(r, "q", dq, rq, qn, c->tol);
    free(q), free(kv), free(cache), free(ct), free(st), free(rq), free(rc), free(rkv);
    free(ref), free(sc);
    weight_free(r, &nw);
    dfree(r, dq), dfree(r, dc), dfree(r, dkv), dfree(r, dct), dfree(r, dst), dfree(r, dout);
    dfree(r, scratch);
}

/* p: heads, blocks, d */
static void run_qsa_scores(ot_run *r, const ot_case *c) {
    const int32_t nh = c->p[0], nb = c->p[1], d = c->p[2];
    float *q = rand_vec(r, (size_t)nh * d, 1), *k = rand_vec(r, (size_t)nb * d, 1);
    float *dq = UPF(r, q, (size_t)nh * d), *dk = UPF(r, k, (size_t)nb * d),
          *ds = poisoned(r, (size_t)nb + 2);
    double *ref = ref_vec((size_t)nb + 2);
    for (int32_t b = 0; b < nb; b++) {
        double acc = 0;
        for (int32_t h = 0; h < nh; h++) {
            double s = 0;
            for (int32_t i = 0; i < d; i++)
                s += (double)q[(size_t)h * d + i] * k[(size_t)b * d + i];
            acc += fmax(s, 0);
        }
        ref[b] = acc / sqrt((double)d);
    }
    r->be->ops->qsa_scores(r->be, ds, dq, dk, nh, nb, d);
    ot_check(r, "scores", ds, ref, (size_t)nb + 2, c->tol);
    free(q), free(k), free(ref), dfree(r, dq), dfree(r, dk), dfree(r, ds);
}

/* ------------------------------------------------------------- elementwise */

/* p: n, which (0 swiglu, 1 axpy, 2 sigmoid_mul) */
static void run_binary(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0], tot = n + 3;
    float *a = rand_vec(r, tot, 4), *b = rand_vec(r, tot, 2);
    float *da = UPF(r, a, tot), *db = UPF(r, b, tot);
    float *dout = c->p[1] == 0 ? poisoned(r, tot) : db;
    double *ref = c->p[1] == 0 ? ref_vec(tot) : widen(b, tot);
    for (size_t i = 0; i < n; i++)
        ref[i] = c->p[1] == 0   ? silu(a[i]) * b[i]
                 : c->p[1] == 1 ? b[i] + 0.37 * a[i]
                                : b[i] * sigm(a[i]);
    switch (c->p[1]) {
    case 0: r->be->ops->swiglu(r->be, dout, da, db, n); break;
    case 1: r->be->ops->axpy(r->be, dout, 0.37f, da, n); break;
    default: r->be->ops->sigmoid_mul(r->be, dout, da, n); break;
    }
    ot_check(r, "y", dout, ref, tot, c->tol);
    if (dout != db) dfree(r, dout);
    free(a), free(b), free(ref), dfree(r, da), dfree(r, db);
}

/* p: n, in place (out = gate); the clamped SwiGLU with gpt-oss's alpha and limit, inputs
 * reaching past the limit on both sides */
static void run_swiglu_clamped(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0], tot = n + 3;
    const float alpha = 1.702f, limit = 7.0f;
    float *g = rand_vec(r, tot, 10), *u = rand_vec(r, tot, 10);
    float *dg = UPF(r, g, tot), *du = UPF(r, u, tot), *dout = c->p[1] ? dg : poisoned(r, tot);
    double *ref = c->p[1] ? widen(g, tot) : ref_vec(tot);
    for (size_t i = 0; i < n; i++) {
        const double gg = fmin(g[i], limit), uu = fmin(fmax(u[i], -limit), limit);
        ref[i] = (uu + 1) * gg * sigm((double)(float)(gg * alpha));
    }
    r->be->ops->swiglu_clamped(r->be, dout, dg, du, n, alpha, limit);
    ot_check(r, "y", dout, ref, tot, c->tol);
    if (!c->p[1]) dfree(r, dout);
    free(g), free(u), free(ref), dfree(r, dg), dfree(r, du);
}

/* p: rows, n; the bias in c->dt */
static void run_add_bias(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], n = c->p[1];
    const size_t tot = (size_t)rows * n + 3;
    float *y = rand_vec(r, tot, 2), *dy = UPF(r, y, tot);
    ot_weight b;
    weight_make(r, &b, c->dt, 0, n, 1, 0);
    double *ref = widen(y, tot);
    for (int32_t t = 0; t < rows; t++)
        for (int32_t i = 0; i < n; i++)
            ref[(size_t)t * n + i] = (double)y[(size_t)t * n + i] + b.wide[i];
    r->be->ops->add_bias(r->be, dy, &b.d, rows);
    ot_check(r, "y", dy, ref, tot, c->tol);
    free(y), free(ref), dfree(r, dy);
    weight_free(r, &b);
}

/* p: n, act, out (0 apart, 1 in gate, 2 in up) */
static void run_act_mul(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0], tot = n + 3;
    const sl_act act = (sl_act)c->p[1];
    float *g = rand_vec(r, tot, 5), *u = rand_vec(r, tot, 2);
    float *dg = UPF(r, g, tot), *du = UPF(r, u, tot);
    float *dout = c->p[2] == 1 ? dg : c->p[2] == 2 ? du : poisoned(r, tot);
    double *ref = c->p[2] == 1 ? widen(g, tot) : c->p[2] == 2 ? widen(u, tot) : ref_vec(tot);
    for (size_t i = 0; i < n; i++)
        ref[i] = act_ref(g[i], act) * u[i];
    r->be->ops->act_mul(r->be, dout, dg, du, n, act);
    ot_check(r, "out", dout, ref, tot, c->tol);
    if (!c->p[2]) dfree(r, dout);
    free(g), free(u), free(ref), dfree(r, dg), dfree(r, du);
}

/* p: n, act, in place */
static void run_activate(ot_run *r, const ot_case *c) {
    static const float div[] = {4.0f, 3.0f, 2.0f, 1.0f, 30.0f};
    static const float mul[] = {1.0f, 2.0f, 0.5f, 1.0f, 30.0f};
    const size_t n = (size_t)c->p[0], tot = n + 3;
    const sl_act act = (sl_act)c->p[1];
    /* soft-capping (tanh, c = 30) sees logits of either side of c */
    float *x = rand_vec(r, tot, act == SL_ACT_TANH ? 90 : 6), *dx = UPF(r, x, tot);
    float *dy = c->p[2] ? dx : poisoned(r, tot);
    double *ref = c->p[2] ? widen(x, tot) : ref_vec(tot);
    for (size_t i = 0; i < n; i++)
        ref[i] = mul[act] * act_ref(x[i] / div[act], act);
    r->be->ops->activate(r->be, dy, dx, n, div[act], mul[act], act);
    ot_check(r, "y", dy, ref, tot, c->tol);
    if (!c->p[2]) dfree(r, dy);
    free(x), free(ref), dfree(r, dx);
}

/* p: T, k, n, through a row list (a permutation: row (t, j) of x at (7 (t k + j) + 3) mod T k,
 * T k not a multiple of 7) */
static void run_weighted_sum(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], k = c->p[1], n = c->p[2], tk = T * k;
    const size_t yn = (size_t)T * n + 3;
    float *x = rand_vec(r, (size_t)tk * n, 1), *w = rand_vec(r, (size_t)tk, 1);
    float *dx = UPF(r, x, (size_t)tk * n), *dw = UPF(r, w, (size_t)tk), *dy = poisoned(r, yn);
    int32_t *rows = malloc((size_t)tk * sizeof *rows), *drows = NULL;
    SL_ASSERT(rows);
    for (int32_t i = 0; i < tk; i++)
        rows[i] = c->p[3] ? (int32_t)((7 * (int64_t)i + 3) % tk) : i;
    if (c->p[3]) drows = up(r, rows, (size_t)tk * sizeof *rows);
    double *ref = ref_vec(yn);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < n; i++) {
            double acc = 0;
            for (int32_t j = 0; j < k; j++)
                acc += (double)w[t * k + j] * x[(size_t)rows[t * k + j] * n + i];
            ref[(size_t)t * n + i] = acc;
        }
    r->be->ops->weighted_sum(r->be, dy, dx, drows, dw, T, k, n);
    ot_check(r, "y", dy, ref, yn, c->tol);
    free(x), free(w), free(ref), free(rows), dfree(r, dx), dfree(r, dw), dfree(r, dy);
    if (drows) dfree(r, drows);
}

/* p: T, hc, n, which (0 hc_inject, 1 hc_mix, 2 ple_gate) */
static void run_hyper(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], hc = c->p[1], n = c->p[2];
    const size_t big = (size_t)T * hc * n, tot = big + 3;
    float *w = rand_vec(r, tot, 1), *x = rand_vec(r, tot, 2), *v = rand_vec(r, (size_t)T * n, 1);
    float *inj = rand_vec(r, (size_t)T * hc, 1);
    float *dw = UPF(r, w, tot), *dx = UPF(r, x, tot), *dv = UPF(r, v, (size_t)T * n);
    float *dinj = UPF(r, inj, (size_t)T * hc), *dy = NULL;
    double *ref;
    switch (c->p[3]) {
    case 0:
        ref = widen(w, tot);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < hc; h++)
                for (int32_t i = 0; i < n; i++)
                    ref[((size_t)t * hc + h) * n + i] +=
                        (double)inj[t * hc + h] * v[(size_t)t * n + i];
        r->be->ops->hc_inject(r->be, dw, dv, dinj, T, hc, n);
        ot_check(r, "w", dw, ref, tot, c->tol);
        break;
    case 1:
        ref = ref_vec((size_t)T * n + 3);
        dy = poisoned(r, (size_t)T * n + 3);
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < n; i++) {
                double acc = 0;
                for (int32_t h = 0; h < hc; h++)
                    acc +=
                        (double)w[((size_t)t * hc + h) * n + i] * x[((size_t)t * hc + h) * n + i];
                ref[(size_t)t * n + i] = acc / hc;
            }
        r->be->ops->hc_mix(r->be, dy, dw, dx, T, hc, n);
        ot_check(r, "y", dy, ref, (size_t)T * n + 3, c->tol);
        break;
    default:
        ref = ref_vec(tot);
        dy = poisoned(r, tot);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < hc; h++) {
                double g = 0;
                for (int32_t i = 0; i < n; i++)
                    g += (double)w[((size_t)t * hc + h) * n + i] * x[((size_t)t * hc + h) * n + i];
                g /= sqrt((double)n);
                g = (g > 0 ? 1 : g < 0 ? -1 : 0) * sqrt(fmax(fabs(g), 1e-6));
                for (int32_t i = 0; i < n; i++)
                    ref[((size_t)t * hc + h) * n + i] = sigm(g) * v[(size_t)t * n + i];
            }
        r->be->ops->ple_gate(r->be, dy, dw, dx, dv, T, hc, n);
        ot_check(r, "y", dy, ref, tot, c->tol);
        break;
    }
    free(w), free(x), free(v), free(inj), free(ref);
    dfree(r, dw), dfree(r, dx), dfree(r, dv), dfree(r, dinj), dfree(r, dy);
}

/* ------------------------------------------------------------- DeltaNet */

/* p: T, C, K, dilation */
static void run_conv1d_silu(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], C = c->p[1], K = c->p[2], D = c->p[3], S = (K - 1) * D;
    ot_weight w;
    weight_make(r, &w, c->dt, C, K, 1.0f, 0);
    w.h.ndim = w.d.ndim = 3, w.h.shape[1] = w.d.shape[1] = 1, w.h.shape[2] = w.d.shape[2] = K;
    const size_t yn = (size_t)T * C + 3, sn = (size_t)C * S;
    float *x = rand_vec(r, (size_t)T * C, 2), *st = rand_vec(r, sn + 1, 1);
    float *dx = UPF(r, x, (size_t)T * C), *dst = UPF(r, st, sn), *dy = poisoned(r, yn);
    double *ref = ref_vec(yn), *sref = ref_vec(sn);
    for (int32_t ch = 0; ch < C; ch++) {
        /* the channel's inputs, the state's oldest first, then x */
        double *in = malloc((size_t)(S + T) * sizeof(double));
        for (int32_t j = 0; j < S; j++)
            in[j] = st[(size_t)ch * S + j];
        for (int32_t t = 0; t < T; t++)
            in[S + t] = x[(size_t)t * C + ch];
        for (int32_t t = 0; t < T; t++) {
            double acc = 0;
            for (int32_t j = 0; j < K; j++)
                acc += (double)w.wide[(size_t)ch * K + j] * in[S + t - (K - 1 - j) * D];
            ref[(size_t)t * C + ch] = silu(acc);
        }
        for (int32_t j = 0; j < S; j++)
            sref[(size_t)ch * S + j] = in[T + j];
        free(in);
    }
    r->be->ops->conv1d_silu(r->be, dy, dx, T, C, &w.d, K, D, dst);
    ot_check(r, "y", dy, ref, yn, c->tol);
    ot_check(r, "state", dst, sref, sn, 0);
    free(x), free(st), free(ref), free(sref), dfree(r, dx), dfree(r, dst), dfree(r, dy);
    weight_free(r, &w);
}

static void l2rows(float *x, int32_t rows, int32_t n) {
    for (int32_t i = 0; i < rows; i++) {
        double ss = 0;
        for (int32_t j = 0; j < n; j++)
            ss += (double)x[(size_t)i * n + j] * x[(size_t)i * n + j];
        for (int32_t j = 0; j < n; j++)
            x[(size_t)i * n + j] = (float)(x[(size_t)i * n + j] / sqrt(ss + 1e-6));
    }
}

/* p: T, nk, nv, dk, dv */
/* p: T, nk, nv, dk, dv, GGUF's form (A_log holding -exp(A_log), value heads tiled) */
static void run_delta_rule(ot_run *r, const ot_case *c) {
    const int32_t T = c->p[0], nk = c->p[1], nv = c->p[2], dk = c->p[3], dv = c->p[4];
    const int32_t gguf = c->p[5];
    const size_t qn = (size_t)T * nk * dk, vn = (size_t)T * nv * dv, sn = (size_t)nv * dk * dv;
    float *q = rand_vec(r, qn, 1), *k = rand_vec(r, qn, 1), *v = rand_vec(r, vn, 1);
    float *a = rand_vec(r, (size_t)T * nv, 3), *b = rand_vec(r, (size_t)T * nv, 3);
    float *S = rand_vec(r, sn, 0.2f);
    l2rows(q, T * nk, dk), l2rows(k, T * nk, dk);
    ot_weight Al, dt;
    weight_make(r, &Al, SL_DTYPE_F32, 0, nv, 1.0f, 0);
    weight_make(r, &dt, SL_DTYPE_F32, 0, nv, 1.0f, 0);
    float *dq = UPF(r, q, qn), *dkk = UPF(r, k, qn), *dvv = UPF(r, v, vn);
    float *da = UPF(r, a, (size_t)T * nv), *db = UPF(r, b, (size_t)T * nv), *dS = UPF(r, S, sn);
    float *dout = poisoned(r, vn + 3);
    double *ref = ref_vec(vn + 3), *R = widen(S, sn), *kv = malloc((size_t)dv * sizeof(double));
    const double q_scale = 1 / sqrt((double)dk);
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < nv; h++) {
            const int32_t kh = gguf ? h % nk : h / (nv / nk);
            const float *qt = q + ((size_t)t * nk + kh) * dk, *kt = k + ((size_t)t * nk + kh) * dk;
            const double xa = (double)a[t * nv + h] + dt.wide[h];
            const double A = gguf ? Al.wide[h] : -exp(Al.wide[h]);
            const double g = A * log1p(exp(xa)), beta = sigm(b[t * nv + h]);
            double *Rh = R + (size_t)h * dk * dv;
            for (int32_t j = 0; j < dv; j++)
                kv[j] = 0;
            for (int32_t i = 0; i < dk; i++)
                for (int32_t j = 0; j < dv; j++)
                    Rh[(size_t)i * dv + j] *= exp(g), kv[j] += Rh[(size_t)i * dv + j] * kt[i];
            for (int32_t i = 0; i < dk; i++)
                for (int32_t j = 0; j < dv; j++)
                    Rh[(size_t)i * dv + j] +=
                        kt[i] * (v[((size_t)t * nv + h) * dv + j] - kv[j]) * beta;
            for (int32_t j = 0; j < dv; j++) {
                double acc = 0;
                for (int32_t i = 0; i < dk; i++)
                    acc += Rh[(size_t)i * dv + j] * qt[i] * (float)q_scale;
                ref[((size_t)t * nv + h) * dv + j] = acc;
            }
        }
    sl_delta_args args = {.out = dout,
                          .q = dq,
                          .k = dkk,
                          .v = dvv,
                          .a = da,
                          .b = db,
                          .A_log = &Al.d,
                          .dt_bias = &dt.d,
                          .state = dS,
                          .T = T,
                          .nk = nk,
                          .nv = nv,
                          .dk = dk,
                          .dv = dv,
                          .q_scale = (float)q_scale,
                          .A_neg_exp = gguf,
                          .v_tiled = gguf};
    r->be->ops->delta_rule(r->be, &args);
    ot_check(r, "out", dout, ref, vn + 3, c->tol);
    ot_check(r, "state", dS, R, sn, c->tol);
    free(q), free(k), free(v), free(a), free(b), free(S), free(ref), free(R), free(kv);
    dfree(r, dq), dfree(r, dkk), dfree(r, dvv), dfree(r, da), dfree(r, db), dfree(r, dS);
    dfree(r, dout), weight_free(r, &Al), weight_free(r, &dt);
}

/* ------------------------------------------------------------------ MoE */

/* Reference top-k of probabilities p[E] (ties to the lower id). */
static void ref_topk(const double *p, int32_t E, int32_t k, int32_t *ids) {
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            int taken = 0;
            for (int32_t i = 0; i < j; i++)
                taken |= ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[j] = best;
    }
}

/* The router rules run_moe_route tries (p[6]): the plain softmax, then one of each other score
 * with the tensor it may carry. */
static sl_route_cfg route_rule(int32_t rule, int32_t renorm, int32_t n_group) {
    static const sl_route_cfg rules[] = {
        {.score = SL_ROUTE_SOFTMAX},
        {.score = SL_ROUTE_TOPK_SOFTMAX},           /* with a router bias */
        {.score = SL_ROUTE_SIGMOID, .scale = 2.5f}, /* with select_bias, groups */
        {.score = SL_ROUTE_TOPK_SIGMOID},           /* none */
        {.score = SL_ROUTE_SOFTMAX, .scale = 0.5f}, /* with expert_scale */
    };
    sl_route_cfg cfg = rules[rule];
    cfg.renormalize = renorm;
    if (cfg.score == SL_ROUTE_SIGMOID && n_group > 1)
        cfg.n_group = n_group, cfg.topk_group = SL_MAX(n_group / 2, 1);
    return cfg;
}

/* p: E, K, k, T, renormalize, exact ties (rows E-1 and E/2 repeat rows 1 and 3), rule
 * (route_rule), n_group. The reference computes in double: the keys the picks rank by (masked
 * to -inf outside the chosen groups), then the weights of the op's own picks (a near tie may
 * swap two picks). */
static void run_moe_route(ot_run *r, const ot_case *c) {
    const int32_t E = c->p[0], K = c->p[1], k = c->p[2], T = c->p[3], renorm = c->p[4];
    const sl_route_cfg cfg = route_rule(c->p[6], renorm, c->p[7]);
    ot_weight w, bias, sb, es;
    weight_make(r, &w, c->dt, E, K, 0.5f, 0);
    weight_make(r, &bias, SL_DTYPE_F32, 0, E, 0.5f, 0);
    weight_make(r, &sb, SL_DTYPE_F32, 0, E, 0.2f, 0);
    weight_make(r, &es, SL_DTYPE_BF16, 0, E, 1.0f, 0);
    const int has_bias = c->p[6] == 1, has_sb = c->p[6] == 2, has_es = c->p[6] == 4;
    if (c->p[5]) {
        const size_t rb = sl_row_bytes(c->dt, K);
        uint8_t *h = w.hdata;
        memcpy(h + (size_t)(E - 1) * rb, h + rb, rb);
        memcpy(h + (size_t)(E / 2) * rb, h + 3 * rb, rb);
        memcpy(w.wide + (size_t)(E - 1) * K, w.wide + K, (size_t)K * sizeof(float));
        memcpy(w.wide + (size_t)(E / 2) * K, w.wide + 3 * K, (size_t)K * sizeof(float));
        r->be->ops->to_dev(r->be, (void *)w.d.data, h, (size_t)E * rb);
    }
    float *x = rand_vec(r, (size_t)T * K, 1), *dx = UPF(r, x, (size_t)T * K);
    const size_t ln = (size_t)T * E + 3, kn = (size_t)T * k;
    float *dl = poisoned(r, ln), *dw = poisoned(r, kn + 2);
    int32_t *dids = r->be->ops->alloc(r->be, kn * sizeof(int32_t));
    double *sc = ref_vec(ln), *wref = ref_vec(kn + 2), *key = ref_vec((size_t)E);
    ref_matmul(sc, x, w.wide, E, K, T);
    for (int32_t t = 0; t < T; t++) {
        double *p = sc + (size_t)t * E, mx = -INFINITY, sum = 0;
        for (int32_t e = 0; e < E; e++)
            p[e] += has_bias ? bias.wide[e] : 0;
        if (cfg.score == SL_ROUTE_SOFTMAX) {
            for (int32_t e = 0; e < E; e++)
                mx = fmax(mx, p[e]);
            for (int32_t e = 0; e < E; e++)
                sum += (p[e] = exp(p[e] - mx));
            for (int32_t e = 0; e < E; e++)
                p[e] /= sum;
        } else if (cfg.score == SL_ROUTE_SIGMOID) {
            for (int32_t e = 0; e < E; e++)
                p[e] = sigm(p[e]);
        }
    }
    const sl_route_args a = {.ids = dids,
                             .w = dw,
                             .logits = dl,
                             .x = dx,
                             .router = &w.d,
                             .bias = has_bias ? &bias.d : NULL,
                             .select_bias = has_sb ? &sb.d : NULL,
                             .expert_scale = has_es ? &es.d : NULL,
                             .T = T,
                             .k = k,
                             .cfg = cfg};
    r->be->ops->moe_route(r->be, &a);
    int32_t *ids = malloc(kn * sizeof(int32_t)), *want = malloc((size_t)k * sizeof(int32_t));
    r->be->ops->to_host(r->be, ids, dids, kn * sizeof(int32_t));
    const double tol = prod_tol(r, c->dt, c->tol);
    const int bad0 = r->bad;
    for (int32_t t = 0; t < T; t++) {
        const double *p = sc + (size_t)t * E;
        const int32_t *got = ids + (size_t)t * k;
        for (int32_t e = 0; e < E; e++)
            key[e] = p[e] + (has_sb ? sb.wide[e] : 0);
        if (cfg.n_group > 1) { /* groups by the sum of their two best keys */
            const int32_t ng = E / cfg.n_group;
            double gs[SL_ROUTE_MAX_GROUPS];
            int32_t top2[2];
            for (int32_t g = 0; g < cfg.n_group; g++) {
                ref_topk(key + g * ng, ng, 2, top2);
                gs[g] = key[g * ng + top2[0]] + key[g * ng + top2[1]];
            }
            for (int32_t g = 0; g < cfg.n_group; g++) {
                int32_t rank = 0;
                for (int32_t h = 0; h < cfg.n_group; h++)
                    rank += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
                if (rank >= cfg.topk_group)
                    for (int32_t e = g * ng; e < (g + 1) * ng; e++)
                        key[e] = -INFINITY;
            }
        }
        ref_topk(key, E, k, want);
        const double span = cfg.score == SL_ROUTE_SOFTMAX ? key[want[0]] : 1 + fabs(key[want[0]]);
        double sum = 0, wk[64];
        for (int32_t j = 0; j < k; j++) {
            /* the j-th pick: a valid, new id whose key is the j-th largest (to the tolerance:
             * near ties may swap); exact ties go to the lower id */
            int ok = got[j] >= 0 && got[j] < E;
            for (int32_t i = 0; ok && i < j; i++)
                ok = got[i] != got[j];
            if (ok) ok = fabs(key[got[j]] - key[want[j]]) <= tol * span;
            if (ok && j && key[got[j]] == key[got[j - 1]]) ok = got[j] > got[j - 1];
            if (!ok) {
                fail(r, "ids[%d]: got %d want %d", t * k + j, got[j], want[j]);
                break;
            }
            const double v = p[got[j]];
            wk[j] = cfg.score == SL_ROUTE_TOPK_SOFTMAX   ? exp(v - p[got[0]])
                    : cfg.score == SL_ROUTE_TOPK_SIGMOID ? sigm(v)
                                                         : v;
            sum += wk[j];
        }
        if (r->bad > bad0) break;
        double den = 1;
        if (cfg.score == SL_ROUTE_TOPK_SOFTMAX) den = sum;
        if (cfg.renormalize) den = cfg.score == SL_ROUTE_TOPK_SOFTMAX ? sum : sum + 1e-20;
        for (int32_t j = 0; j < k; j++)
            wref[(size_t)t * k + j] =
                wk[j] / den * (has_es ? es.wide[got[j]] : 1) * (cfg.scale != 0 ? cfg.scale : 1);
    }
    if (r->bad == bad0) ot_check(r, "w", dw, wref, kn + 2, tol);
    ot_check(r, "scores", dl, sc, ln, tol);
    free(x), free(ids), free(want), free(sc), free(wref), free(key);
    dfree(r, dx), dfree(r, dl), dfree(r, dw), dfree(r, dids), weight_free(r, &w);
    weight_free(r, &bias), weight_free(r, &sb), weight_free(r, &es);
}

/* p: n, bound (clamped to [-bound / 4, bound / 4]) */
static void run_clamp(ot_run *r, const ot_case *c) {
    const size_t n = (size_t)c->p[0];
    const float b = (float)c->p[1] / 4;
    float *x = rand_vec(r, n, 2), *dx = UPF(r, x, n);
    double *ref = ref_vec(n);
    for (size_t i = 0; i < n; i++)
        ref[i] = x[i] < -b ? -b : x[i] > b ? b : x[i];
    r->be->ops->clamp(r->be, dx, n, -b, b);
    ot_check(r, "x", dx, ref, n, 0);
    free(x), free(ref), dfree(r, dx);
}

/* p: rows, rep, n */
static void run_scale_rows(ot_run *r, const ot_case *c) {
    const int32_t rows = c->p[0], rep = c->p[1], n = c->p[2];
    const size_t xn = (size_t)((rows + rep - 1) / rep) * n, yn = (size_t)rows * n + 3;
    float *x = rand_vec(r, xn, 2), *sv = rand_vec(r, (size_t)rows, 1);
    float *dx = UPF(r, x, xn), *ds = UPF(r, sv, rows), *dy = poisoned(r, yn);
    double *ref = ref_vec(yn);
    for (int32_t i = 0; i < rows; i++)
        for (int32_t j = 0; j < n; j++)
            ref[(size_t)i * n + j] = (double)(sv[i] * x[(size_t)(i / rep) * n + j]);
    r->be->ops->scale_rows(r->be, dy, dx, ds, rows, rep, n);
    ot_check(r, "y", dy, ref, yn, 0);
    free(x), free(sv), free(ref), dfree(r, dx), dfree(r, ds), dfree(r, dy);
}

/* p: T, H, I, a missing expert (its table row zero: the tokens that pick it are skipped), an MLX
 * layout for every weight (weight_relayout; 0: none).
 * Six experts, two picks a token (they differ). */
static void run_moe_experts(ot_run *r, const ot_case *c) {
    enum { NE = 6, K = 2, MT = 8 };
    const sl_ops *o = r->be->ops;
    const int32_t T = c->p[0], H = c->p[1], I = c->p[2];
    ot_weight w[NE][3];
    for (int e = 0; e < NE; e++) {
        weight_make(r, &w[e][0], c->dt, I, H, 0.5f, 0);
        weight_make(r, &w[e][1], c->dt, I, H, 0.5f, 0);
        weight_make(r, &w[e][2], c->dt, H, I, 0.5f, 0);
        for (int j = 0; j < 3 && c->p[4]; j++) /* p[4]: an MLX layout (weight_relayout) */
            weight_relayout(r, &w[e][j], c->p[4]);
    }
    const sl_tensor *proto[3] = {&w[0][0].d, &w[0][1].d, &w[0][2].d};
    if (!o->moe_experts ||
        !o->moe_experts(r->be, NULL, NULL, NULL, NULL, NULL, NULL, proto, 0, K)) {
        r->skipped++;
        goto out;
    }
    const int32_t missing = c->p[3] ? 1 : -1;
    sl_expert_ptrs rows[NE];
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < 3; j++) {
            rows[e].p[3 * j] = e == missing ? NULL : w[e][j].d.data;
            rows[e].p[3 * j + 1] = e == missing ? NULL : w[e][j].d.scales;
            rows[e].p[3 * j + 2] = e == missing ? NULL : w[e][j].d.biases;
        }
    int32_t ids[MT * K];
    float wts[MT * K];
    for (int32_t t = 0; t < T; t++) /* a token's two picks differ (by 3, mod 6) */
        ids[t * K] = (2 * t + 1) % NE, ids[t * K + 1] = (2 * t + 4) % NE,
                wts[t * K] = 0.6f + 0.05f * t, wts[t * K + 1] = 0.4f - 0.05f * t;
    sl_expert_ptrs *table = up(r, rows, sizeof rows);
    int32_t *dids = up(r, ids, (size_t)T * K * sizeof(int32_t));
    float *dwts = UPF(r, wts, (size_t)T * K);
    float *x = rand_vec(r, (size_t)T * H, 1), *dx = UPF(r, x, (size_t)T * H);
    const size_t yn = (size_t)T * H + 3, an = (size_t)T * K * I;
    float *dy = poisoned(r, yn), *dact = poisoned(r, an);
    double *yref = ref_vec(yn), *aref = ref_vec(an), *g = ref_vec(I), *u = ref_vec(I),
           *dn = ref_vec(H);
    float *af = malloc((size_t)I * sizeof(float));
    for (int32_t t = 0; t < T; t++) {
        if (ids[t * K] == missing || ids[t * K + 1] == missing) continue;
        for (int32_t h = 0; h < H; h++)
            yref[(size_t)t * H + h] = 0;
        for (int32_t j = 0; j < K; j++) {
            const int32_t i = t * K + j, e = ids[i];
            ref_matmul(g, x + (size_t)t * H, w[e][0].wide, I, H, 1);
            ref_matmul(u, x + (size_t)t * H, w[e][1].wide, I, H, 1);
            for (int32_t n = 0; n < I; n++)
                af[n] = (float)(aref[(size_t)i * I + n] = silu(g[n]) * u[n]);
            ref_matmul(dn, af, w[e][2].wide, H, I, 1);
            for (int32_t h = 0; h < H; h++)
                yref[(size_t)t * H + h] += (double)wts[i] * dn[h];
        }
    }
    const double tol = prod_tol(r, c->dt, c->tol);
    o->moe_experts(r->be, dy, dact, dx, dids, dwts, table, proto, T, K);
    ot_check(r, "y", dy, yref, yn, tol);
    for (int32_t i = 0; i < T * K; i++) /* act rows of skipped tokens are undefined */
        if (!isnan(aref[(size_t)i * I]))
            ot_check(r, "act", dact + (size_t)i * I, aref + (size_t)i * I, (size_t)I, tol);
    free(x), free(yref), free(aref), free(g), free(u), free(dn), free(af);
    dfree(r, table), dfree(r, dids), dfree(r, dwts), dfree(r, dx), dfree(r, dy), dfree(r, dact);
out:
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < 3; j++)
            weight_free(r, &w[e][j]);
}

/* ------------------------------------------------------------ the table */

#define F32  SL_DTYPE_F32
#define F16  SL_DTYPE_F16
#define BF16 SL_DTYPE_BF16
#define Q8   SL_DTYPE_Q8
#define Q4   SL_DTYPE_Q4
/* ggml's block types (issue 26) */
#define Q8_0   SL_DTYPE_Q8_0
#define Q4_0   SL_DTYPE_Q4_0
#define Q4_1   SL_DTYPE_Q4_1
#define Q5_0   SL_DTYPE_Q5_0
#define Q5_1   SL_DTYPE_Q5_1
#define Q2_K   SL_DTYPE_Q2_K
#define Q3_K   SL_DTYPE_Q3_K
#define Q4_K   SL_DTYPE_Q4_K
#define Q5_K   SL_DTYPE_Q5_K
#define Q6_K   SL_DTYPE_Q6_K
#define IQ4_XS SL_DTYPE_IQ4_XS
#define MXFP4  SL_DTYPE_MXFP4
#define F8     SL_DTYPE_F8_E4M3 /* with F32 block scales (Hugging Face's block-wise FP8) */
#define IQ4_NL SL_DTYPE_IQ4_NL

/* matmul rows {N, K, T, bias, misaligned} for each weight dtype: K = 1, odd K, K past a
 * quantisation group, rows not a multiple of any tile; two shapes through every T a backend
 * may treat apart (the GEMV of T <= 4, tiles at 17 and 70). */
/* clang-format off */
#define MM(dt, N, K, T, bias, mis) {"matmul", run_matmul, dt, {N, K, T, bias, mis}, 2e-5}
#define MM_T(dt, N, K, bias)                                                                       \
    MM(dt, N, K, 1, bias, 0), MM(dt, N, K, 2, bias, 0), MM(dt, N, K, 3, bias, 0),                  \
    MM(dt, N, K, 4, bias, 0), MM(dt, N, K, 17, bias, 0), MM(dt, N, K, 70, bias, 0)
#define MATMUL_ROWS(dt)                                                                            \
    MM(dt, 1, 1, 1, 1, 0), MM(dt, 5, 1, 2, 0, 0), MM(dt, 37, 75, 5, 2, 0),                         \
    MM(dt, 7, 65, 3, 1, 0), MM(dt, 16, 131, 4, 0, 0), MM(dt, 130, 257, 9, 1, 0),                   \
    MM(dt, 64, 1024, 17, 0, 1), MM(dt, 129, 96, 70, 1, 0), MM(dt, 300, 256, 4, 0, 0),              \
    MM_T(dt, 33, 63, 3), MM_T(dt, 17, 2049, 2), MM_TC(dt)
/* Prompt-sized products the tensor-core tiles take where a backend has them (K % 32 == 0): tiles
 * of 32, 64 and 128 tokens, a partial last group (160 = 64 + 64 + 32), rows and tokens past a
 * tile, biases. */
#define MM_TC(dt)                                                                                  \
    MM(dt, 130, 256, 70, 1, 0), MM(dt, 64, 1024, 17, 0, 0), MM(dt, 200, 512, 300, 2, 0),           \
    MM(dt, 33, 160, 5, 0, 0), MM(dt, 65, 96, 129, 0, 0)
/* Block types: K whole blocks (256 for every type; 32 and 96 too for the 32-element ones), the
 * same row counts, biases, misalignment and T as above. */
#define BLOCK_MATMUL_ROWS(dt)                                                                      \
    MM(dt, 1, 256, 1, 1, 0), MM(dt, 37, 512, 5, 2, 0), MM(dt, 16, 256, 4, 0, 1),                   \
    MM(dt, 130, 256, 9, 1, 0), MM(dt, 64, 1024, 17, 0, 1), MM(dt, 300, 256, 4, 0, 0),              \
    MM_T(dt, 33, 768, 3)
/* MLX's layouts (weight_relayout): K a multiple of the group (32 or 128) or not, every T path. */
#define MMX(dt, N, K, T, lay) {"matmul", run_matmul, dt, {N, K, T, 0, 0, lay}, 2e-5}
#define MLX_MATMUL_ROWS(dt, lay)                                                                   \
    MMX(dt, 37, 256, 1, lay), MMX(dt, 5, 96, 3, lay), MMX(dt, 130, 384, 5, lay),                   \
    MMX(dt, 64, 1024, 17, lay), MMX(dt, 33, 2048, 4, lay), MMX(dt, 17, 75, 70, lay)
#define BLOCK32_MATMUL_ROWS(dt)                                                                    \
    BLOCK_MATMUL_ROWS(dt), MM(dt, 5, 32, 2, 0, 0), MM(dt, 17, 96, 3, 1, 1)
#define BLOCK_BATCH(dt) {"matmul_batch", run_matmul_batch, dt, {3, 256, 0}, 2e-5}
/* FP8 {N, K, T, bias, misaligned, block rows, block columns, row phase}: 128 x 128 blocks over
 * partial ones (K < 128, 257 columns, 130 and 300 rows), views starting mid-block (the up half
 * of a fused gate_up), small blocks the SIMD paths take (16 x 32) and one only AVX2 does
 * (columns of 24: AVX-512 runs the scalar order). */
#define M8(N, K, T, bias, mis, br, bc, ph)                                                         \
    {"matmul", run_matmul, F8, {N, K, T, bias, mis, br, bc, ph}, 2e-5}
#define FP8_MATMUL_ROWS                                                                            \
    M8(1, 1, 1, 1, 0, 0, 0, 0), M8(37, 75, 5, 2, 0, 0, 0, 0), M8(130, 257, 9, 1, 0, 0, 0, 0),      \
    M8(300, 256, 4, 0, 1, 0, 0, 0), M8(64, 1024, 17, 0, 0, 0, 0, 0),                               \
    M8(200, 200, 3, 0, 0, 0, 0, 60), M8(72, 144, 2, 1, 1, 0, 0, 127),                              \
    M8(33, 96, 70, 1, 0, 16, 32, 5), M8(20, 72, 2, 0, 0, 4, 24, 3), M8(33, 200, 1, 3, 0, 0, 0, 0), \
    M8(33, 200, 2, 0, 0, 0, 0, 0), M8(33, 200, 4, 0, 0, 0, 0, 0), M8(33, 200, 17, 0, 0, 0, 0, 0)
/* Widening is exact: the rows are sl_dequant_row's floats. */
#define BLOCK_EMBED(dt) {"embed", run_embed, dt, {50, 256, 6}, 0}
/* clang-format on */

static const ot_case table[] = {
    {"alloc", run_alloc, F32, {1}, 0},
    {"alloc", run_alloc, F32, {1001}, 0},
    {"copies", run_copies, F32, {7, 0}, 0},
    {"copies", run_copies, F32, {65536, 1}, 0},
    {"copies", run_copies, F32, {300, 2}, 0},
    {"copies", run_copies, F32, {4097, 3}, 0},
    {"copies", run_copies, F32, {1001, 4}, 0},
    {"fill", run_fill, F32, {1}, 0},
    {"fill", run_fill, F32, {4097}, 0},
    {"copy2d", run_copy2d, F32, {5, 7, 11, 9, 0}, 0},
    {"copy2d", run_copy2d, F32, {1, 1, 1, 1, 0}, 0},
    {"copy2d", run_copy2d, F32, {6, 10, 12, 12, 1}, 0},
    {"copy_rows", run_copy_rows, F32, {33, 0, 0}, 0},
    {"copy_rows", run_copy_rows, F32, {33, 1, 0}, 0},
    {"copy_rows", run_copy_rows, F32, {1, 0, 1}, 0},
    {"copy_rows", run_copy_rows, F32, {257, 1, 1}, 0},
    {"copy_rows", run_copy_rows, F32, {64, 1, 1}, 0},
    {"copy_rows", run_copy_rows, F32, {2048, 0, 1}, 0},

    MATMUL_ROWS(F32),
    MATMUL_ROWS(F16),
    MATMUL_ROWS(BF16),
    MATMUL_ROWS(Q8),
    MATMUL_ROWS(Q4),
    MLX_MATMUL_ROWS(Q8, 1),
    MLX_MATMUL_ROWS(Q8, 2),
    MLX_MATMUL_ROWS(Q8, 3),
    MLX_MATMUL_ROWS(Q4, 1),
    MLX_MATMUL_ROWS(Q4, 2),
    MLX_MATMUL_ROWS(Q4, 3),
    BLOCK32_MATMUL_ROWS(Q8_0),
    BLOCK32_MATMUL_ROWS(Q4_0),
    BLOCK32_MATMUL_ROWS(Q4_1),
    BLOCK32_MATMUL_ROWS(Q5_0),
    BLOCK32_MATMUL_ROWS(Q5_1),
    BLOCK32_MATMUL_ROWS(MXFP4),
    BLOCK32_MATMUL_ROWS(IQ4_NL),
    BLOCK_MATMUL_ROWS(Q2_K),
    BLOCK_MATMUL_ROWS(Q3_K),
    BLOCK_MATMUL_ROWS(Q4_K),
    BLOCK_MATMUL_ROWS(Q5_K),
    BLOCK_MATMUL_ROWS(Q6_K),
    BLOCK_MATMUL_ROWS(IQ4_XS),
    FP8_MATMUL_ROWS,
    {"matmul_batch", run_matmul_batch, F32, {1, 63, 0}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {8, 256, 0, -1}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q8, {5, 192, 0, -1}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {3, 64, 0, -1}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {3, 256, 0, -1, 2}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q8, {4, 256, 0, -1, 3}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {5, 256, 0, 5}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q8, {4, 160, 0, 40}, 2e-5},
    {"matmul_batch", run_matmul_batch, BF16, {3, 96, 0, 70}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {6, 256, 1, 6}, 2e-5},
    {"matmul_batch", run_matmul_batch, BF16, {3, 256, 0}, 2e-5},
    {"matmul_batch", run_matmul_batch, Q4, {4, 192, 0}, 2e-5},
    {"matmul_batch", run_matmul_batch, F32, {5, 130, 1}, 2e-5},
    {"matmul_batch", run_matmul_batch, F32, {7, 2049, 1}, 2e-5},
    BLOCK_BATCH(Q8_0),
    BLOCK_BATCH(Q4_0),
    BLOCK_BATCH(Q4_1),
    BLOCK_BATCH(Q5_0),
    BLOCK_BATCH(Q5_1),
    BLOCK_BATCH(MXFP4),
    BLOCK_BATCH(IQ4_NL),
    BLOCK_BATCH(Q2_K),
    BLOCK_BATCH(Q3_K),
    BLOCK_BATCH(Q4_K),
    BLOCK_BATCH(Q5_K),
    BLOCK_BATCH(Q6_K),
    BLOCK_BATCH(IQ4_XS),
    {"matmul_batch", run_matmul_batch, Q4_K, {7, 512, 2}, 2e-5},
    {"matmul_batch", run_matmul_batch, F8, {4, 200, 0}, 2e-5},
    {"embed", run_embed, F32, {50, 1, 6}, 1e-6},
    {"embed", run_embed, F16, {50, 63, 6}, 1e-6},
    {"embed", run_embed, BF16, {50, 200, 6}, 1e-6},
    {"embed", run_embed, Q8, {50, 2049, 6}, 1e-6},
    {"embed", run_embed, Q4, {50, 63, 6}, 1e-6},
    {"embed", run_embed, Q4, {9, 2049, 3}, 1e-6},
    BLOCK_EMBED(Q8_0),
    BLOCK_EMBED(Q4_0),
    BLOCK_EMBED(Q4_1),
    BLOCK_EMBED(Q5_0),
    BLOCK_EMBED(Q5_1),
    BLOCK_EMBED(MXFP4),
    BLOCK_EMBED(IQ4_NL),
    BLOCK_EMBED(Q2_K),
    BLOCK_EMBED(Q3_K),
    BLOCK_EMBED(Q4_K),
    {"embed", run_embed, F8, {50, 200, 6}, 0},
    BLOCK_EMBED(Q5_K),
    BLOCK_EMBED(Q6_K),
    BLOCK_EMBED(IQ4_XS),
    {"embed", run_embed, Q5_0, {9, 96, 3}, 0},

    {"rmsnorm", run_rmsnorm, F32, {3, 1, 0, 0}, 1e-5},
    {"rmsnorm", run_rmsnorm, BF16, {3, 63, 1, 0}, 1e-5},
    {"rmsnorm", run_rmsnorm, F16, {3, 2049, 0, 1}, 1e-5},
    {"rmsnorm", run_rmsnorm, F32, {1, 9000, 1, 1}, 1e-5},
    {"add_rmsnorm", run_add_rmsnorm, F32, {3, 63, 0}, 1e-5},
    {"add_rmsnorm", run_add_rmsnorm, BF16, {2, 2048, 1}, 1e-5},
    {"add_rmsnorm", run_add_rmsnorm, F16, {1, 9000, 0}, 1e-5},
    {"add_rmsnorm_next", run_add_rmsnorm_next, BF16, {1, 2048, 0, 37}, 1e-5},
    {"add_rmsnorm_next", run_add_rmsnorm_next, F32, {3, 257, 1, 9}, 1e-5},
    {"gated_rmsnorm", run_gated_rmsnorm, F32, {5, 64, SL_ACT_SILU}, 1e-5},
    {"gated_rmsnorm", run_gated_rmsnorm, BF16, {5, 257, SL_ACT_SIGMOID}, 1e-5},
    {"gated_rmsnorm", run_gated_rmsnorm, F32, {2, 9, SL_ACT_SIGMOID}, 1e-5},
    {"l2norm", run_l2norm, F32, {4, 1}, 1e-5},
    {"l2norm", run_l2norm, F32, {4, 128}, 1e-5},
    {"l2norm", run_l2norm, F32, {3, 257}, 1e-5},

    {"rope", run_rope, F32, {1, 4, 64, 64, 37}, 1e-5},
    {"rope", run_rope, F32, {17, 3, 128, 64, 0}, 1e-5},
    {"rope", run_rope, F32, {2, 3, 10, 6, 5}, 1e-5},
    {"rope", run_rope, F32, {5, 2, 256, 128, 100}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {3, 4, 4, 2, 8, 6, 1, 0}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {1, 37, 8, 2, 128, 128, 1, 1}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {5, 0, 2, 1, 64, 32, 0, 0}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {4, 6, 4, 2, 16, 16, 3, 0}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {1, 40, 8, 2, 128, 128, 3, 0}, 1e-5},
    {"qkv_prep", run_qkv_prep, F32, {6, 2, 4, 2, 32, 0, 4, 0}, 1e-5},
    {"attention", run_attention, F32, {3, 4, 4, 2, 5, 0}, 2e-5},
    {"attention", run_attention, F32, {1, 37, 8, 2, 64, 0}, 2e-5},
    {"attention", run_attention, F32, {5, 0, 2, 1, 128, 0}, 2e-5},
    {"attention", run_attention, F32, {7, 300, 4, 4, 128, 0}, 2e-5},
    {"attention", run_attention, F32, {2, 5, 2, 1, 4, 1}, 2e-5},
    {"attention", run_attention, F32, {1, 40, 8, 2, 128, 1}, 2e-5},
    {"attention", run_attention, F32, {1, 37, 8, 2, 128, 2}, 2e-5},
    {"attention", run_attention, F32, {3, 9, 4, 2, 64, 2}, 2e-5},
    /* sliding windows (cutting, and wider than the context) and sinks */
    {"attention", run_attention, F32, {5, 20, 4, 2, 16, 0, 7, 0}, 2e-5},
    {"attention", run_attention, BF16, {1, 300, 8, 2, 64, 0, 128, 1}, 2e-5},
    {"attention", run_attention, F32, {1, 300, 8, 2, 64, 2, 128, 1}, 2e-5},
    {"attention", run_attention, F32, {9, 3, 4, 4, 8, 0, 64, 1}, 2e-5},
    {"attention", run_attention, F16, {3, 1, 4, 2, 32, 2, 2, 1}, 2e-5},
    {"attention", run_attention, F32, {2, 5, 2, 1, 4, 1, 0, 1}, 2e-5},
    /* chunked local attention, with interleaved RoPE and q's temperature in the prep */
    {"attention", run_attention, F32, {9, 5, 4, 2, 16, 0, 0, 0, 4}, 2e-5},
    {"attention", run_attention, F32, {1, 300, 8, 2, 128, 0, 0, 0, 128}, 2e-5},
    {"attention", run_attention, F32, {1, 37, 8, 2, 128, 2, 0, 0, 16, 2}, 2e-5},
    {"attention", run_attention, F32, {1, 39, 8, 2, 128, 2, 0, 0, 0, 4}, 2e-5},
    {"attention", run_attention, F32, {5, 14, 4, 2, 64, 2, 0, 0, 8, 2}, 2e-5},
    {"attention", run_attention, F32, {6, 30, 4, 2, 16, 0, 9, 1, 16}, 2e-5},
    /* prompts (CUDA takes its tiled kernel from 64 queries on): past a tile of queries and of
     * keys, a prefix in the cache, grouped heads (1-8), windows, chunks, sinks, head dims 8-256
     * (24 and 80: padded to the tile's) */
    {"attention", run_attention, F32, {70, 0, 8, 2, 64, 0}, 2e-5},
    {"attention", run_attention, F32, {130, 37, 4, 1, 128, 0}, 2e-5},
    {"attention", run_attention, BF16, {100, 20, 8, 2, 64, 0, 48, 1}, 2e-5},
    {"attention", run_attention, F32, {96, 10, 4, 2, 32, 0, 0, 0, 40}, 2e-5},
    {"attention", run_attention, F32, {65, 3, 2, 2, 256, 0}, 2e-5},
    {"attention", run_attention, F32, {33, 0, 4, 4, 8, 0, 0, 1}, 2e-5},
    {"attention", run_attention, F32, {64, 5, 4, 2, 64, 2}, 2e-5},
    {"attention", run_attention, F32, {150, 40, 16, 2, 128, 0, 0, 1}, 2e-5},
    {"attention", run_attention, F32, {140, 0, 4, 2, 24, 0, 50, 0}, 2e-5},
    {"attention", run_attention, F32, {80, 200, 8, 1, 80, 0, 0, 0, 64}, 2e-5},
    {"latent_attention", run_latent_attention, F32, {3, 4, 4, 32, 8, 1, 0}, 2e-5},
    {"latent_attention", run_latent_attention, F32, {1, 300, 3, 64, 16, 0, 1}, 2e-5},
    {"latent_attention", run_latent_attention, F32, {5, 0, 2, 20, 6, 1, 1}, 2e-5},
    {"latent_attention", run_latent_attention, F32, {1, 600, 2, 512, 64, 1, 1}, 2e-5},
    {"qsa_scores", run_qsa_scores, F32, {3, 4, 6}, 1e-5},
    {"qsa_scores", run_qsa_scores, F32, {16, 37, 128}, 1e-5},

    {"swiglu", run_binary, F32, {1, 0}, 2e-6},
    {"swiglu", run_binary, F32, {4097, 0}, 2e-6},
    {"axpy", run_binary, F32, {1, 1}, 2e-6},
    {"axpy", run_binary, F32, {4097, 1}, 2e-6},
    {"sigmoid_mul", run_binary, F32, {5, 2}, 2e-6},
    {"sigmoid_mul", run_binary, F32, {4097, 2}, 2e-6},
    {"swiglu_clamped", run_swiglu_clamped, F32, {1, 0}, 2e-6},
    {"swiglu_clamped", run_swiglu_clamped, F32, {4097, 1}, 2e-6},
    {"add_bias", run_add_bias, BF16, {1, 5}, 1e-7},
    {"add_bias", run_add_bias, F32, {7, 2880}, 1e-7},
    {"add_bias", run_add_bias, F16, {3, 33}, 1e-7},
    {"activate", run_activate, F32, {7, SL_ACT_SIGMOID, 0}, 2e-6},
    {"activate", run_activate, F32, {4097, SL_ACT_SILU, 1}, 2e-6},
    {"activate", run_activate, F32, {1000, SL_ACT_NONE, 0}, 2e-6},
    {"activate", run_activate, F32, {4099, SL_ACT_GELU_TANH, 0}, 2e-6},
    {"activate", run_activate, F32, {33, SL_ACT_GELU_TANH, 1}, 2e-6},
    {"activate", run_activate, F32, {4097, SL_ACT_TANH, 0}, 2e-6},
    {"act_mul", run_act_mul, F32, {4097, SL_ACT_GELU_TANH, 0}, 2e-6},
    {"act_mul", run_act_mul, F32, {5, SL_ACT_GELU_TANH, 1}, 2e-6},
    {"act_mul", run_act_mul, F32, {300, SL_ACT_SILU, 2}, 2e-6},
    {"act_mul", run_act_mul, F32, {65, SL_ACT_SIGMOID, 0}, 2e-6},
    {"act_mul", run_act_mul, F32, {65, SL_ACT_NONE, 0}, 2e-6},
    {"weighted_sum", run_weighted_sum, F32, {3, 4, 33}, 2e-6},
    {"weighted_sum", run_weighted_sum, F32, {1, 8, 2049}, 2e-6},
    {"weighted_sum", run_weighted_sum, F32, {5, 8, 64, 1}, 2e-6},
    {"weighted_sum", run_weighted_sum, F32, {3, 4, 33, 1}, 2e-6},
    {"hc_inject", run_hyper, F32, {2, 3, 5, 0}, 2e-6},
    {"hc_inject", run_hyper, F32, {3, 4, 257, 0}, 2e-6},
    {"hc_mix", run_hyper, F32, {2, 3, 5, 1}, 2e-6},
    {"hc_mix", run_hyper, F32, {3, 4, 257, 1}, 2e-6},
    {"ple_gate", run_hyper, F32, {2, 3, 5, 2}, 1e-5},
    {"ple_gate", run_hyper, F32, {3, 4, 257, 2}, 1e-5},

    {"conv1d_silu", run_conv1d_silu, F32, {5, 7, 4, 1}, 1e-5},
    {"conv1d_silu", run_conv1d_silu, BF16, {6, 5, 3, 2}, 1e-5},
    {"conv1d_silu", run_conv1d_silu, F32, {1, 33, 4, 1}, 1e-5},
    {"conv1d_silu", run_conv1d_silu, F32, {9, 130, 4, 3}, 1e-5},
    {"delta_rule", run_delta_rule, F32, {5, 2, 6, 5, 3}, 1e-4},
    {"delta_rule", run_delta_rule, F32, {1, 1, 2, 128, 128}, 1e-4},
    {"delta_rule", run_delta_rule, F32, {3, 2, 4, 64, 33}, 1e-4},
    {"delta_rule", run_delta_rule, F32, {4, 2, 6, 16, 9, 1}, 1e-4},

    {"moe_route", run_moe_route, BF16, {8, 256, 2, 1, 0, 1}, 1e-5},
    {"moe_route", run_moe_route, BF16, {60, 256, 4, 3, 1, 1}, 1e-5},
    {"moe_route", run_moe_route, F32, {128, 64, 8, 4, 1, 0}, 1e-5},
    {"moe_route", run_moe_route, Q4, {513, 256, 8, 6, 0, 0}, 1e-5},
    {"moe_route", run_moe_route, F32, {1100, 64, 40, 2, 1, 0}, 1e-5},
    {"moe_route", run_moe_route, Q4_K, {64, 256, 4, 3, 1, 1}, 1e-5},
    {"moe_route", run_moe_route, Q8_0, {60, 96, 8, 2, 0, 0}, 1e-5},
    /* prompts through a float router: CUDA sums its K in slices (router_split) */
    {"moe_route", run_moe_route, BF16, {128, 512, 8, 40, 1, 1}, 1e-5},
    {"moe_route", run_moe_route, F32, {60, 256, 4, 33, 0, 0}, 1e-5},
    {"moe_route", run_moe_route, F32, {64, 64, 4, 3, 1, 0, 1, 0}, 1e-5},
    {"moe_route", run_moe_route, BF16, {8, 256, 2, 2, 0, 1, 1, 0}, 1e-5},
    {"moe_route", run_moe_route, F32, {64, 64, 6, 5, 1, 0, 2, 8}, 1e-5},
    {"moe_route", run_moe_route, BF16, {256, 128, 8, 2, 1, 1, 2, 8}, 1e-5},
    {"moe_route", run_moe_route, F32, {60, 64, 4, 3, 0, 0, 2, 0}, 1e-5},
    {"moe_route", run_moe_route, Q4, {128, 256, 4, 1, 0, 0, 2, 1}, 1e-5},
    {"moe_route", run_moe_route, F32, {16, 64, 1, 3, 0, 0, 3, 0}, 1e-5},
    {"moe_route", run_moe_route, BF16, {129, 128, 8, 4, 0, 1, 3, 0}, 1e-5},
    {"moe_route", run_moe_route, F32, {128, 64, 8, 4, 1, 0, 4, 0}, 1e-5},
    {"moe_route", run_moe_route, BF16, {33, 96, 3, 1, 0, 1, 4, 0}, 1e-5},
    {"clamp", run_clamp, F32, {1000, 3}, 0},
    {"clamp", run_clamp, F32, {4097, 7}, 0},
    {"scale_rows", run_scale_rows, F32, {12, 4, 33}, 0},
    {"scale_rows", run_scale_rows, F32, {5, 1, 2049}, 0},
    {"moe_experts", run_moe_experts, Q4, {3, 256, 128, 0}, 1e-4},
    {"moe_experts", run_moe_experts, Q8, {1, 192, 64, 0}, 1e-4},
    {"moe_experts", run_moe_experts, Q4, {1, 256, 128, 0, 2}, 1e-4},
    {"moe_experts", run_moe_experts, Q4, {2, 256, 128, 1, 3}, 1e-4},
    {"moe_experts", run_moe_experts, Q8, {1, 192, 64, 0, 3}, 1e-4},
    {"moe_experts", run_moe_experts, BF16, {5, 128, 320, 1}, 1e-4},
    {"moe_experts", run_moe_experts, F32, {2, 65, 31, 1}, 1e-4},
    {"moe_experts", run_moe_experts, Q4_K, {3, 256, 512, 0}, 1e-4},
    {"moe_experts", run_moe_experts, MXFP4, {2, 256, 96, 1}, 1e-4},
    {"moe_experts", run_moe_experts, F8, {3, 200, 136, 0}, 1e-4},
    {"moe_experts", run_moe_experts, F8, {2, 144, 300, 1}, 1e-4},
};

int ops_table_run(const sl_backend *be, const ops_table_params *p) {
    const size_t n = sizeof table / sizeof table[0];
    int failed = 0;
    ot_run r = {.be = be, .p = p};
    for (size_t i = 0; i < n; i++) {
        const ot_case *c = &table[i];
        if (p->filter && !strstr(c->op, p->filter)) continue;
        const int first = i == 0 || strcmp(table[i - 1].op, c->op) != 0;
        const int last = i + 1 == n || strcmp(table[i + 1].op, c->op) != 0;
        if (first) r.cases = r.bad = r.skipped = 0, r.max_err = 0, r.first_bad[0] = 0;
        r.c = c;
        r.f8_brows = r.f8_group = r.f8_phase = 0;
        r.rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ull);
        const int bad = r.bad;
        if (sl_dtype_is_block(c->dt) && !p->block_types)
            r.skipped++;
        else
            c->run(&r, c);
        r.cases++;
        if (r.bad > bad) failed++;
        if (!last) continue;
        sl_error err = {0};
        if (be->ops->status && be->ops->status(be, &err) != SL_OK) {
            r.bad++, failed++;
            snprintf(r.first_bad, sizeof r.first_bad, "backend status: %s", err.msg);
        }
        if (r.bad)
            fprintf(stderr, "FAIL %-16s %s: %d of %d cases; first: %s\n", c->op, be->ops->name,
                    r.bad, r.cases, r.first_bad);
        else if (p->log)
            fprintf(p->log, "ok   %-16s %s: %2d cases%s, max rel err %.2e\n", c->op, be->ops->name,
                    r.cases - r.skipped, r.skipped ? " (some skipped)" : "", r.max_err);
    }
    return failed;
}
