/*
 * ggml's block types (Q8_0 .. MXFP4, IQ4_NL) on the CUDA backend, against a plain host reference.
 *
 * For each type: random valid blocks (every code pattern, scale fields in a sane range, MXFP4
 * exponents down to the denormal ones), decoded on the host by the CPU's reference
 * (sl_dequant_row: ggml's dequantize_row_* formulas, float, in their order), then
 *   embed         the decoded rows bit for bit (weights at every byte alignment)
 *   matmul        against the decoded weights times x in double, T = 1, 2, 3, 5, 64, 200, K from
 *                 the block size to 16384 (several x stages), odd N (up to 16901: 2 and 4 rows a
 *                 warp), with a bias, misaligned weights and x; every token of a T > 1 product
 *                 bitwise equal to the same token alone (T = 1)
 *   matmul_batch  items of every T class, more than fit a kernel parameter, one of another
 *                 dtype: each item bitwise equal to matmul alone
 *   moe_experts   bitwise equal to matmul_batch, swiglu, matmul_batch and weighted_sum, and
 *                 within tolerance of a double reference; gate/up and down of different types
 * Outputs are pre-filled with a poison value past their end too: what an op must not write
 * must stay poison. One line per type and op, then "N passed, M failed".
 *
 *   build-cuda/test_cuda_blocks [TYPE]         (make CUDA=1 build-cuda/test_cuda_blocks)
 *   build-cuda/test_cuda_blocks bench [TYPE]   decode GB/s, prefill GFLOP/s, fused experts
 * TYPE (ggml's spelling, "Q4_K"): that type alone.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blocks.h"
#include "core/common.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"

#define POISON 1e30f
#define TAIL   5 /* poisoned floats past each output */

static sl_backend gpu;
static int n_passed, n_failed;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)((double)rnd32() / 2147483648.0 - 1.0);
}
static float *rand_vec(size_t n) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = frand();
    return v;
}
static float *poison_vec(size_t n) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = POISON;
    return v;
}

static void *dalloc(size_t bytes) {
    void *d = gpu.ops->alloc(&gpu, bytes);
    SL_ASSERT(d);
    return d;
}
/* A device copy of host bytes at `off` bytes past a fresh allocation (off < 16). */
static void *up_at(const void *h, size_t bytes, size_t off, void **base) {
    *base = dalloc(bytes + 16);
    uint8_t *d = (uint8_t *)*base + off;
    gpu.ops->to_dev(&gpu, d, h, bytes);
    return d;
}
static float *upf(const float *h, size_t n) {
    void *base;
    return up_at(h, n * sizeof(float), 0, &base);
}
static float *down(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    gpu.ops->to_host(&gpu, h, d, n * sizeof(float));
    return h;
}
static void dfree(void *d) {
    gpu.ops->release(&gpu, d);
}

/* One verdict per (type, op), over its cases. */
typedef struct report {
    char name[64];
    int cases, bad;
    double max_err;
    char first_bad[320];
} report;

static void rep_begin(report *r, sl_dtype dt, const char *op) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s %s", sl_dtype_name(dt), op);
}

/* Counts a failure; keeps the first one's description. */
static void rep_fail(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rep_fail(report *r, const char *fmt, ...) {
    if (r->bad++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->first_bad, sizeof r->first_bad, fmt, ap);
    va_end(ap);
}

static void rep_end(report *r) {
    if (r->bad) {
        n_failed++;
        printf("FAIL %-22s %3d cases, %d bad; first: %s\n", r->name, r->cases, r->bad,
               r->first_bad);
    } else {
        n_passed++;
        printf("ok   %-22s %3d cases, max rel err %.2e\n", r->name, r->cases, r->max_err);
    }
    fflush(stdout);
}

/* got[0 .. n + TAIL) (host) against ref[0 .. n): within tol of max(|ref|, rms(ref)) each, and
 * the tail still poison. */
static void check_close(report *r, const char *what, const float *got, const double *ref, size_t n,
                        double tol) {
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += ref[i] * ref[i];
    const double rms = n ? sqrt(ss / (double)n) : 0;
    r->cases++;
    for (size_t i = 0; i < n; i++) {
        const double den = fmax(fmax(fabs(ref[i]), rms), 1e-30), err = fabs(got[i] - ref[i]) / den;
        if (!isfinite(got[i]) || got[i] == POISON || !(err <= tol)) {
            rep_fail(r, "%s: [%zu] got %.9g want %.9g (err %.2e)", what, i, got[i], ref[i], err);
            return;
        }
        if (err > r->max_err) r->max_err = err;
    }
    for (size_t i = n; i < n + TAIL; i++)
        if (got[i] != POISON) {
            rep_fail(r, "%s: [%zu] written past the end: %.9g", what, i, got[i]);
            return;
        }
}

/* a[0 .. n) and b[0 .. n) the same bits. */
static void check_same(report *r, const char *what, const float *a, const float *b, size_t n) {
    r->cases++;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float))) {
            rep_fail(r, "%s: [%zu] %.9g vs %.9g", what, i, a[i], b[i]);
            return;
        }
}

/* ------------------------------------------------- host blocks: make and decode */

static uint16_t f16_of(float v) {
    return sl_f32_to_f16(v);
}
static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
/* A scale field: magnitude 2^-12 .. 2^-5 (so that sums of thousands of weights stay far from
 * f16 and f32 limits), positive or of either sign. */
static uint16_t rand_scale(int sign) {
    const float m = ldexpf(1.0f + (float)(rnd32() % 1024) / 1024.0f, -12 + (int)(rnd32() % 8));
    return f16_of(sign && (rnd32() & 1) ? -m : m);
}

/* One random valid block of dt at b: every code byte random, the f16 scales sane. */
static void make_block(sl_dtype dt, uint8_t *b) {
    const size_t bb = sl_dtype_block_bytes(dt);
    for (size_t i = 0; i < bb; i++)
        b[i] = (uint8_t)rnd32();
    switch (dt) {
    case SL_DTYPE_Q8_0:
    case SL_DTYPE_Q4_0:
    case SL_DTYPE_Q5_0: put16(b, rand_scale(1)); break;
    case SL_DTYPE_Q4_1:
    case SL_DTYPE_Q5_1: put16(b, rand_scale(0)), put16(b + 2, rand_scale(1)); break;
    case SL_DTYPE_MXFP4: { /* 2^-11 .. 2^-4 mostly; now and then a denormal scale (e < 2) */
        const uint32_t r = rnd32() % 16;
        b[0] = (uint8_t)(r == 0 ? rnd32() % 3 : 116 + rnd32() % 8);
        break;
    }
    case SL_DTYPE_Q2_K: put16(b + 80, rand_scale(0)), put16(b + 82, rand_scale(0)); break;
    case SL_DTYPE_Q3_K: put16(b + 108, rand_scale(1)); break;
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: put16(b, rand_scale(0)), put16(b + 2, rand_scale(0)); break;
    case SL_DTYPE_Q6_K: put16(b + 208, rand_scale(1)); break;
    case SL_DTYPE_IQ4_XS:
    case SL_DTYPE_IQ4_NL: put16(b, rand_scale(1)); break;
    default: SL_ASSERT(0);
    }
}

static void make_rows(sl_dtype dt, uint8_t *w, int64_t N, int64_t K) {
    const int64_t nb = N * (K / sl_dtype_block_size(dt));
    for (int64_t i = 0; i < nb; i++)
        make_block(dt, w + (size_t)i * sl_dtype_block_bytes(dt));
}

/* Rows [N, K] of dt decoded (N K floats) by the CPU's reference, sl_dequant_row (bit-exact to
 * ggml's dequantize_row_*, tests/unit/test_blocks.c). */
static float *ref_dequant(sl_dtype dt, const uint8_t *w, int64_t N, int64_t K) {
    float *y = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        sl_dequant_row(dt, w + (size_t)n * sl_row_bytes(dt, K), y + (size_t)(n * K), K);
    return y;
}

/* y[t][n] = sum_k wf[n][k] x[t][k] (+ bias[n]), in double. */
static double *ref_matmul(const float *wf, const float *x, const float *bias, int64_t N, int64_t K,
                          int64_t T) {
    double *y = malloc((size_t)(N * T) * sizeof(double));
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            const float *wr = wf + (size_t)(n * K), *xr = x + (size_t)(t * K);
            for (int64_t k = 0; k < K; k++)
                s += (double)wr[k] * xr[k];
            y[(size_t)(t * N + n)] = s;
        }
    return y;
}

/* A block weight [N, K] on both sides: host bytes, their decoding, and a device copy whose
 * first byte is `off` bytes past 16-byte alignment. */
typedef struct bweight {
    uint8_t *h;
    float *wf;
    sl_tensor d;
    void *dbase;
} bweight;

static void bw_make(bweight *w, sl_dtype dt, int64_t N, int64_t K, size_t off) {
    const size_t bytes = sl_row_bytes(dt, K) * (size_t)N;
    w->h = malloc(bytes);
    make_rows(dt, w->h, N, K);
    w->wf = ref_dequant(dt, w->h, N, K);
    w->d = (sl_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {N, K}, .nbytes = bytes};
    w->d.data = up_at(w->h, bytes, off, &w->dbase);
}

static void bw_free(bweight *w) {
    free(w->h), free(w->wf), dfree(w->dbase);
}

/* ------------------------------------------------------------- tests */

static const sl_dtype types[] = {SL_DTYPE_Q8_0,  SL_DTYPE_Q4_0, SL_DTYPE_Q4_1,   SL_DTYPE_Q5_0,
                                 SL_DTYPE_Q5_1,  SL_DTYPE_Q2_K, SL_DTYPE_Q3_K,   SL_DTYPE_Q4_K,
                                 SL_DTYPE_Q5_K,  SL_DTYPE_Q6_K, SL_DTYPE_IQ4_XS, SL_DTYPE_MXFP4,
                                 SL_DTYPE_IQ4_NL};
#define N_TYPES (sizeof types / sizeof types[0])

static const char *only; /* a type's name: test (or time) that one alone */
static int skip(sl_dtype dt) {
    return only && strcmp(only, sl_dtype_name(dt));
}

/* embed: rows of a [V, n] table, decoded bit for bit, at each alignment of the table. */
static void test_embed(sl_dtype dt) {
    report r;
    rep_begin(&r, dt, "embed");
    const int bs = sl_dtype_block_size(dt);
    enum { V = 40, T = 7 };
    const int32_t ids[T] = {0, 39, 5, 5, 17, 38, 1};
    for (size_t off = 0; off < 4; off++) {
        const int64_t n = bs * (off + 3); /* 96 .. 1536 columns */
        bweight w;
        bw_make(&w, dt, V, n, off);
        void *ib;
        int32_t *dids = up_at(ids, sizeof ids, 0, &ib);
        const size_t yn = (size_t)(T * n);
        float *y = poison_vec(yn + TAIL), *dy = upf(y, yn + TAIL);
        gpu.ops->embed(&gpu, dy, &w.d, dids, T);
        float *got = down(dy, yn + TAIL);
        double *ref = malloc(yn * sizeof(double));
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < n; i++)
                ref[(size_t)(t * n + i)] = w.wf[(size_t)(ids[t] * n + i)];
        char what[64];
        snprintf(what, sizeof what, "n=%d off=%zu", (int)n, off);
        check_close(&r, what, got, ref, yn, 0); /* tolerance 0: the decoded floats exactly */
        free(y), free(got), free(ref), dfree(dy), dfree(ib), bw_free(&w);
    }
    rep_end(&r);
}

/* matmul against the double reference, and each token of T > 1 bitwise equal to it alone. */
static void test_matmul(sl_dtype dt) {
    report r, rb;
    rep_begin(&r, dt, "matmul");
    rep_begin(&rb, dt, "matmul T=1 vs T>1");
    const int64_t bs = sl_dtype_block_size(dt);
    /* {N, K, T, bias, weight offset, x offset (floats)}; K in blocks of bs where it must */
    const int64_t cases[][6] = {
        {37, bs, 1, 0, 0, 0},      {37, bs, 2, 0, 0, 0},      {37, 256, 3, 1, 0, 0},
        {37, 256, 5, 0, 2, 0},     {37, 256, 64, 0, 0, 1},    {1, 512, 1, 0, 1, 0},
        {130, 4096, 1, 0, 0, 0},   {130, 4096, 3, 0, 0, 0},   {130, 4096, 64, 1, 0, 0},
        {257, 1024, 200, 0, 0, 0}, {257, 1024, 200, 0, 3, 1}, {33, 9 * bs, 1, 0, 0, 0},
        {33, 9 * bs, 5, 0, 0, 0},  {5, 16384, 1, 0, 0, 0},    {5, 16384, 8, 0, 1, 0},
        {16901, 256, 1, 0, 0, 0},  {16901, 256, 2, 1, 0, 0},  {9001, 256, 4, 0, 0, 0},
        {200, 2048, 1, 0, 0, 0},   {200, 2048, 4, 0, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t N = cases[ci][0], K = cases[ci][1], T = cases[ci][2];
        const int has_bias = (int)cases[ci][3];
        const size_t woff = (size_t)cases[ci][4], xoff = (size_t)cases[ci][5];
        bweight w;
        bw_make(&w, dt, N, K, woff);
        float *x = rand_vec((size_t)(T * K) + xoff), *bias = rand_vec((size_t)N);
        float *dxb = upf(x, (size_t)(T * K) + xoff), *dx = dxb + xoff, *db = upf(bias, (size_t)N);
        const sl_tensor bt = {.name = "b",
                              .dtype = SL_DTYPE_F32,
                              .ndim = 1,
                              .shape = {N},
                              .data = db,
                              .nbytes = (size_t)N * 4};
        const size_t yn = (size_t)(T * N);
        float *y = poison_vec(yn + TAIL), *dy = upf(y, yn + TAIL);
        gpu.ops->matmul(&gpu, dy, dx, &w.d, has_bias ? &bt : NULL, (int32_t)T);
        float *got = down(dy, yn + TAIL);
        double *ref = ref_matmul(w.wf, x + xoff, has_bias ? bias : NULL, N, K, T);
        char what[96];
        snprintf(what, sizeof what, "N=%d K=%d T=%d bias=%d woff=%zu xoff=%zu", (int)N, (int)K,
                 (int)T, has_bias, woff, xoff);
        check_close(&r, what, got, ref, yn, 1e-4);
        if (T > 1) {
            float *y1 = poison_vec((size_t)N + TAIL), *dy1 = upf(y1, (size_t)N + TAIL);
            for (int64_t t = 0; t < T; t++) {
                gpu.ops->matmul(&gpu, dy1, dx + (size_t)(t * K), &w.d, has_bias ? &bt : NULL, 1);
                float *g1 = down(dy1, (size_t)N);
                char w1[128];
                snprintf(w1, sizeof w1, "%s, token %d", what, (int)t);
                check_same(&rb, w1, got + (size_t)(t * N), g1, (size_t)N);
                free(g1);
            }
            free(y1), dfree(dy1);
        }
        free(x), free(bias), free(y), free(got), free(ref);
        dfree(dxb), dfree(db), dfree(dy), bw_free(&w);
    }
    rep_end(&r);
    rep_end(&rb);
}

/* matmul_batch: 11 items of every T class (more than a kernel parameter holds), one F32 item
 * among them; each bitwise what matmul gives alone, and near the reference. */
static void test_batch(sl_dtype dt) {
    report r;
    rep_begin(&r, dt, "matmul_batch");
    enum { NB = 11, K = 512 };
    static const int32_t Ns[NB] = {96, 33, 130, 64, 200, 7, 1, 45, 300, 17, 90};
    static const int32_t Ts[NB] = {1, 1, 2, 3, 4, 9, 1, 70, 1, 1, 5};
    bweight w[NB];
    sl_tensor fw = {0};
    float *fwh = NULL;
    void *fwd = NULL;
    float *hx[NB], *dx[NB], *dy[NB];
    const sl_tensor *wd[NB];
    for (int i = 0; i < NB; i++) {
        if (i == 5) { /* an F32 item: another dtype, computed through cu_matmul */
            fwh = rand_vec((size_t)Ns[i] * K);
            fw = (sl_tensor){.name = "f",
                             .dtype = SL_DTYPE_F32,
                             .ndim = 2,
                             .shape = {Ns[i], K},
                             .nbytes = (size_t)Ns[i] * K * 4};
            fw.data = up_at(fwh, fw.nbytes, 0, &fwd);
            wd[i] = &fw;
        } else {
            bw_make(&w[i], dt, Ns[i], K, (size_t)(i % 3));
            wd[i] = &w[i].d;
        }
        hx[i] = rand_vec((size_t)Ts[i] * K), dx[i] = upf(hx[i], (size_t)Ts[i] * K);
        float *p = poison_vec((size_t)Ts[i] * Ns[i] + TAIL);
        dy[i] = upf(p, (size_t)Ts[i] * Ns[i] + TAIL);
        free(p);
    }
    gpu.ops->matmul_batch(&gpu, dy, (const float *const *)dx, wd, Ts, NB);
    for (int i = 0; i < NB; i++) {
        const size_t yn = (size_t)Ts[i] * Ns[i];
        float *got = down(dy[i], yn + TAIL);
        double *ref = ref_matmul(i == 5 ? fwh : w[i].wf, hx[i], NULL, Ns[i], K, Ts[i]);
        char what[64];
        snprintf(what, sizeof what, "item %d (N=%d T=%d)", i, Ns[i], Ts[i]);
        check_close(&r, what, got, ref, yn, 1e-4);
        float *p = poison_vec(yn + TAIL), *dz = upf(p, yn + TAIL);
        gpu.ops->matmul(&gpu, dz, dx[i], wd[i], NULL, Ts[i]);
        float *alone = down(dz, yn);
        check_same(&r, what, got, alone, yn);
        free(got), free(ref), free(p), free(alone), dfree(dz);
    }
    for (int i = 0; i < NB; i++) {
        if (i != 5) bw_free(&w[i]);
        free(hx[i]), dfree(dx[i]), dfree(dy[i]);
    }
    free(fwh), dfree(fwd);
    rep_end(&r);
}

/* moe_experts with gate/up of gdt and down of ddt: bitwise against the ops it fuses, and near
 * a double reference (act and y); one expert then leaves the cache (a zero table row): the
 * tokens that picked it keep their y rows. */
static void test_moe(report *r, sl_dtype gdt, sl_dtype ddt, int T, int H, int I, int k, int NE) {
    bweight gw[16], uw[16], dw[16];
    SL_ASSERT(NE <= 16);
    sl_expert_ptrs rows[16];
    memset(rows, 0, sizeof rows);
    for (int e = 0; e < NE; e++) {
        bw_make(&gw[e], gdt, I, H, 0), bw_make(&uw[e], gdt, I, H, 0), bw_make(&dw[e], ddt, H, I, 0);
        rows[e].p[0] = gw[e].d.data, rows[e].p[3] = uw[e].d.data, rows[e].p[6] = dw[e].d.data;
    }
    void *tb, *ib, *wb;
    sl_expert_ptrs *table = up_at(rows, sizeof rows, 0, &tb);
    int32_t ids[64];
    float wts[64];
    SL_ASSERT(T * k <= 64);
    for (int t = 0; t < T; t++) /* k distinct picks a token, weights summing to 1 */
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = (t * 5 + j + 1) % NE;
            wts[t * k + j] = (1.0f + j + t) / (k * (k + 1) / 2.0f + k * t);
        }
    int32_t *dids = up_at(ids, (size_t)T * k * sizeof(int32_t), 0, &ib);
    float *dwts = up_at(wts, (size_t)T * k * sizeof(float), 0, &wb);
    float *x = rand_vec((size_t)T * H), *dx = upf(x, (size_t)T * H);
    float *py = poison_vec((size_t)T * H + TAIL), *pa = poison_vec((size_t)T * k * I + TAIL);
    float *dy = upf(py, (size_t)T * H + TAIL), *dact = upf(pa, (size_t)T * k * I + TAIL);
    const sl_tensor *proto[3] = {&gw[0].d, &uw[0].d, &dw[0].d};
    char what[96];
    snprintf(what, sizeof what, "%s/%s T=%d H=%d I=%d k=%d", sl_dtype_name(gdt), sl_dtype_name(ddt),
             T, H, I, k);
    r->cases++;
    if (!gpu.ops->moe_experts(&gpu, dy, dact, dx, dids, dwts, table, proto, T, k)) {
        rep_fail(r, "%s: declined", what);
    } else {
        /* the GPU ops it fuses: per pick a T = 1 item of each batch, then weighted_sum */
        const int n = T * k;
        float *rg = upf(pa, (size_t)n * I), *ru = upf(pa, (size_t)n * I);
        float *rout = upf(pa, (size_t)n * H), *ry = upf(py, (size_t)T * H);
        float *by[128];
        const float *bx[128];
        const sl_tensor *bwt[128];
        int32_t bT[128];
        for (int i = 0; i < n; i++) {
            bx[i] = bx[n + i] = dx + (size_t)(i / k) * H;
            by[i] = rg + (size_t)i * I, by[n + i] = ru + (size_t)i * I;
            bwt[i] = &gw[ids[i]].d, bwt[n + i] = &uw[ids[i]].d;
            bT[i] = bT[n + i] = 1;
        }
        gpu.ops->matmul_batch(&gpu, by, bx, bwt, bT, 2 * n);
        gpu.ops->swiglu(&gpu, rg, rg, ru, (size_t)n * I);
        for (int i = 0; i < n; i++)
            bx[i] = rg + (size_t)i * I, by[i] = rout + (size_t)i * H, bwt[i] = &dw[ids[i]].d;
        gpu.ops->matmul_batch(&gpu, by, bx, bwt, bT, n);
        gpu.ops->weighted_sum(&gpu, ry, rout, NULL, dwts, T, k, H);
        float *gact = down(dact, (size_t)n * I + TAIL), *gy = down(dy, (size_t)T * H + TAIL);
        float *ract = down(rg, (size_t)n * I), *ryy = down(ry, (size_t)T * H);
        char w2[128];
        snprintf(w2, sizeof w2, "%s act vs ops", what);
        check_same(r, w2, gact, ract, (size_t)n * I);
        snprintf(w2, sizeof w2, "%s y vs ops", what);
        check_same(r, w2, gy, ryy, (size_t)T * H);
        /* double reference */
        double *aref = malloc((size_t)n * I * sizeof(double)),
               *yref = calloc((size_t)T * H, sizeof(double));
        float *af = malloc((size_t)I * sizeof(float));
        for (int i = 0; i < n; i++) {
            const int e = ids[i];
            double *g = ref_matmul(gw[e].wf, x + (size_t)(i / k) * H, NULL, I, H, 1);
            double *u = ref_matmul(uw[e].wf, x + (size_t)(i / k) * H, NULL, I, H, 1);
            for (int j = 0; j < I; j++) {
                aref[(size_t)i * I + j] = g[j] / (1.0 + exp(-g[j])) * u[j];
                af[j] = (float)aref[(size_t)i * I + j];
            }
            double *dn = ref_matmul(dw[e].wf, af, NULL, H, I, 1);
            for (int j = 0; j < H; j++)
                yref[(size_t)(i / k) * H + j] += wts[i] * dn[j];
            free(g), free(u), free(dn);
        }
        snprintf(w2, sizeof w2, "%s act", what);
        check_close(r, w2, gact, aref, (size_t)n * I, 1e-4);
        snprintf(w2, sizeof w2, "%s y", what);
        check_close(r, w2, gy, yref, (size_t)T * H, 1e-4);
        /* expert ids[0] out of the cache */
        static const sl_expert_ptrs none;
        gpu.ops->to_dev(&gpu, table + ids[0], &none, sizeof none);
        float *dpy = upf(py, (size_t)T * H);
        gpu.ops->moe_experts(&gpu, dpy, dact, dx, dids, dwts, table, proto, T, k);
        float *gpy = down(dpy, (size_t)T * H);
        for (int t = 0; t < T; t++) {
            int skip = 0;
            for (int j = 0; j < k; j++)
                skip |= ids[t * k + j] == ids[0];
            snprintf(w2, sizeof w2, "%s, expert %d out: token %d", what, ids[0], t);
            check_same(r, w2, gpy + (size_t)t * H, (skip ? py : gy) + (size_t)t * H, (size_t)H);
        }
        free(gpy), dfree(dpy);
        free(aref), free(yref), free(af), free(gact), free(gy), free(ract), free(ryy);
        dfree(rg), dfree(ru), dfree(rout), dfree(ry);
    }
    for (int e = 0; e < NE; e++)
        bw_free(&gw[e]), bw_free(&uw[e]), bw_free(&dw[e]);
    free(x), free(py), free(pa);
    dfree(tb), dfree(ib), dfree(wb), dfree(dx), dfree(dy), dfree(dact);
}

/* -------------------------------------------------------- benchmarks */

/* A [N, K] weight of dt in device memory: a few MB of random blocks repeated (the bytes do not
 * change the time). */
static sl_tensor bench_weight(sl_dtype dt, int64_t N, int64_t K) {
    const size_t bytes = sl_row_bytes(dt, K) * (size_t)N, chunk = sl_row_bytes(dt, K) * 64;
    uint8_t *h = malloc(chunk);
    make_rows(dt, h, 64, K);
    uint8_t *d = dalloc(bytes);
    for (size_t o = 0; o < bytes; o += chunk)
        gpu.ops->to_dev(&gpu, d + o, h, SL_MIN(chunk, bytes - o));
    free(h);
    return (sl_tensor){
        .name = "b", .dtype = dt, .ndim = 2, .shape = {N, K}, .data = d, .nbytes = bytes};
}

/* The average time of `stmt` over `reps` back-to-back runs (after 3 unmeasured), in seconds. */
#define TIME_S(reps, stmt)                                                                         \
    ({                                                                                             \
        for (int i_ = 0; i_ < 3; i_++)                                                             \
            stmt;                                                                                  \
        sl_cuda_sync(&gpu);                                                                        \
        const double t0_ = sl_now();                                                               \
        for (int i_ = 0; i_ < (reps); i_++)                                                        \
            stmt;                                                                                  \
        sl_cuda_sync(&gpu);                                                                        \
        (sl_now() - t0_) / (reps);                                                                 \
    })

/* Decode GEMVs (GB/s of weight bytes), prefill (GFLOP/s) and the fused experts at Qwen3-30B-A3B
 * shapes (hidden 2048, 128 experts of 768, top-8), per type. */
static void bench(void) {
    enum { TMAX = 512 };
    static const int64_t shapes[][2] = {{2048, 2048}, {4096, 2048}, {151936, 2048}};
    float *dx = dalloc((size_t)TMAX * 4096 * sizeof(float));
    float *dy = dalloc((size_t)TMAX * 151936 * sizeof(float));
    gpu.ops->fill(&gpu, dx, 0.01f, (size_t)TMAX * 4096);
    printf("\nmatmul, weight bytes read per call; 50 runs each (prefill T=512: 10)\n");
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const sl_dtype dt = types[ti];
            if (skip(dt)) continue;
            const int64_t N = shapes[si][0], K = shapes[si][1];
            sl_tensor w = bench_weight(dt, N, K);
            printf("  %-6s %6d x %d (%6.1f MB):", sl_dtype_name(dt), (int)N, (int)K,
                   (double)w.nbytes / 1e6);
            for (int T = 1; T <= 4; T *= 4) {
                const double t = TIME_S(50, gpu.ops->matmul(&gpu, dy, dx, &w, NULL, T));
                printf("  T=%d %7.1f us %6.0f GB/s", T, t * 1e6, (double)w.nbytes / t / 1e9);
            }
            if (N <= 4096) {
                const double t = TIME_S(10, gpu.ops->matmul(&gpu, dy, dx, &w, NULL, TMAX));
                printf("  | T=%d %7.1f us %6.0f GFLOP/s", TMAX, t * 1e6,
                       2.0 * (double)N * K * TMAX / t / 1e9);
            }
            printf("\n");
            dfree((void *)w.data);
        }
    enum { H = 2048, I = 768, NE = 128, KT = 8 };
    static const sl_dtype moe[][2] = {{SL_DTYPE_Q4_K, SL_DTYPE_Q6_K},
                                      {SL_DTYPE_Q4_K, SL_DTYPE_Q4_K},
                                      {SL_DTYPE_Q8_0, SL_DTYPE_Q8_0},
                                      {SL_DTYPE_MXFP4, SL_DTYPE_MXFP4},
                                      {SL_DTYPE_IQ4_XS, SL_DTYPE_IQ4_XS}};
    printf("moe_experts, %d experts of %d x %d, top-%d, one token (8 experts' bytes read):\n", NE,
           I, H, KT);
    for (size_t mi = 0; mi < sizeof moe / sizeof moe[0]; mi++) {
        if (skip(moe[mi][0])) continue;
        sl_tensor g = bench_weight(moe[mi][0], I, H), u = bench_weight(moe[mi][0], I, H),
                  d = bench_weight(moe[mi][1], H, I);
        sl_expert_ptrs rows[NE];
        memset(rows, 0, sizeof rows);
        for (int e = 0; e < NE; e++) /* every expert the same matrices: 8 experts' bytes */
            rows[e].p[0] = g.data, rows[e].p[3] = u.data, rows[e].p[6] = d.data;
        void *tb, *ib, *wb;
        sl_expert_ptrs *table = up_at(rows, sizeof rows, 0, &tb);
        int32_t ids[KT];
        float wts[KT];
        for (int j = 0; j < KT; j++)
            ids[j] = 7 * j + 3, wts[j] = 1.0f / KT;
        int32_t *dids = up_at(ids, sizeof ids, 0, &ib);
        float *dw = up_at(wts, sizeof wts, 0, &wb), *dact = dalloc((size_t)KT * I * 4);
        const sl_tensor *proto[3] = {&g, &u, &d};
        const double t =
            TIME_S(200, gpu.ops->moe_experts(&gpu, dy, dact, dx, dids, dw, table, proto, 1, KT));
        const double bytes = (double)KT * (double)(g.nbytes + u.nbytes + d.nbytes);
        printf("  %-6s/%-6s %6.1f us %6.0f GB/s\n", sl_dtype_name(moe[mi][0]),
               sl_dtype_name(moe[mi][1]), t * 1e6, bytes / t / 1e9);
        dfree((void *)g.data), dfree((void *)u.data), dfree((void *)d.data);
        dfree(tb), dfree(ib), dfree(wb), dfree(dact);
    }
    dfree(dx), dfree(dy);
}

int main(int argc, char **argv) {
    sl_error err = {0};
    if (sl_backend_cuda_init(&gpu, 0, NULL, &err) != SL_OK) {
        fprintf(stderr, "test_cuda_blocks: %s\n", err.msg);
        return 1;
    }
    const int do_bench = argc > 1 && !strcmp(argv[1], "bench");
    only = argc > 1 + do_bench ? argv[1 + do_bench] : NULL;
    if (do_bench) {
        printf("ggml block types on %s: benchmarks\n", sl_cuda_device_name(&gpu));
        bench();
        sl_backend_cuda_free(&gpu);
        return 0;
    }
    printf("ggml block types on %s against a host reference\n", sl_cuda_device_name(&gpu));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const sl_dtype dt = types[ti];
        if (skip(dt)) continue;
        test_embed(dt);
        test_matmul(dt);
        test_batch(dt);
        report r;
        rep_begin(&r, dt, "moe_experts");
        test_moe(&r, dt, dt, 1, 512, 256, 4, 6);
        test_moe(&r, dt, dt, 3, 512, 256, 8, 12);
        /* with the down of a GGUF's Q4_K_M mix: Q6_K under other gate/up types */
        test_moe(&r, dt, SL_DTYPE_Q6_K, 2, 1024, 512, 10, 16);
        rep_end(&r);
        if (gpu.ops->status(&gpu, &err) != SL_OK) {
            printf("FAIL %s: CUDA error: %s\n", sl_dtype_name(dt), err.msg);
            n_failed++;
            break;
        }
    }
    if (!skip(SL_DTYPE_Q4_K)) {
        report r;
        rep_begin(&r, SL_DTYPE_Q4_K, "moe_experts (big)");
        test_moe(&r, SL_DTYPE_Q4_K, SL_DTYPE_Q6_K, 1, 2048, 768, 8, 16); /* Qwen3-30B-A3B-like */
        rep_end(&r);
    }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    sl_backend_cuda_free(&gpu);
    return n_failed ? 1 : 0;
}
