/*
 * Every CUDA op against the CPU op (the reference backend) on odd sizes.
 *
 * Each case fills the output buffers of both backends with the same poison
 * value, runs the CPU op on host buffers and the CUDA op on device copies of
 * the same inputs, reads the device result back, and compares the whole
 * buffer: elements the op must not write keep the poison on both sides
 * (compared exactly), the rest must agree to a relative tolerance measured
 * against max(|ref|, rms(ref)). One line per op, then "N passed, M failed".
 *
 * First the op table (tests/ops/ops_table.c: every op against its plain reference, the table the
 * unit tests run on the CPU) runs on the CUDA backend; the checks here are those the table has
 * no place for: bitwise agreement among the GPU's own paths (batch items vs alone, the fused MoE
 * step vs its parts, a norm left to the next GEMV), and Q4 on int8 activations.
 * With "bench" it times instead decode GEMV on large shapes (GB/s of weight bytes read), one
 * decode layer's ops at Qwen3-30B-A3B shapes, the prefill matmul (GFLOP/s), prompt attention
 * at those shapes (the plain kernel against the tiled one, GFLOP/s) and Q4 prefill's paths
 * (int8 tensor cores, their reference, BF16 tensor cores).
 *
 *   build-cuda/test_cuda [fixtures-dir (unused)]
 *   build-cuda/test_cuda bench
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

#include "../ops/ops_table.h"

#define POISON 1e30f

static sl_backend cpu, gpu;
static int ops_passed, ops_failed;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rand_vec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

static float *poison_vec(size_t n) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = POISON;
    return v;
}

/* Device copy of host bytes. */
static void *up(const void *h, size_t bytes) {
    void *d = gpu.ops->alloc(&gpu, bytes);
    SL_ASSERT(d);
    gpu.ops->to_dev(&gpu, d, h, bytes);
    return d;
}
#define UPF(h, n) ((float *)up((h), (size_t)(n) * sizeof(float)))

static float *down(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    gpu.ops->to_host(&gpu, h, d, n * sizeof(float));
    return h;
}

static void dfree(void *d) {
    gpu.ops->release(&gpu, d);
}

/* One op's verdict, accumulated over its cases. */
typedef struct op_report {
    const char *name;
    int cases, bad;
    double max_err;
    char first_bad[256];
} op_report;

static void op_begin(op_report *r, const char *name) {
    memset(r, 0, sizeof *r);
    r->name = name;
}

static void op_end(op_report *r) {
    if (r->bad) {
        ops_failed++;
        printf("FAIL %-14s %3d cases, %d bad; first: %s\n", r->name, r->cases, r->bad,
               r->first_bad);
    } else {
        ops_passed++;
        printf("ok   %-14s %3d cases, max rel err %.2e\n", r->name, r->cases, r->max_err);
    }
    fflush(stdout);
}

/* The least tolerance of the checks against the CPU (bitwise ones, tol 0, stay bitwise): raised
 * while the tests rerun on int8-quantised activations (test_q4x), where it bounds the relative
 * L2 error of the whole output instead of each element's: the worst of thousands of elements
 * is a tail of the rounding noise (5.4e-2 of the rms once, for an L2 error of ~1e-2, when another
 * test's extra case moved the random inputs). */
static double tol_floor;
static int q4x_run;

/* Compares a device buffer of n floats with the CPU's host buffer; frees nothing. */
static void check(op_report *r, const char *what, const float *dev, const float *ref, size_t n,
                  double tol) {
    if (tol > 0 && tol < tol_floor) tol = tol_floor;
    float *got = down(dev, n);
    double ss = 0, mx = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++)
        if (ref[i] != POISON && isfinite(ref[i])) {
            ss += (double)ref[i] * ref[i];
            mx = fmax(mx, fabs(ref[i]));
            cnt++;
        }
    const double rms = cnt ? sqrt(ss / (double)cnt) : 0;
    double worst = 0, se = 0;
    size_t wi = 0;
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        if (got[i] == ref[i]) continue;
        if (ref[i] == POISON || got[i] == POISON || !isfinite(got[i]) || !isfinite(ref[i])) {
            bad = 1, wi = i, worst = INFINITY;
            break;
        }
        const double d = (double)got[i] - ref[i], den = fmax(fmax(fabs(ref[i]), rms), 1e-30);
        se += d * d;
        if (fabs(d) / den > worst) worst = fabs(d) / den, wi = i;
    }
    if (!bad && q4x_run && tol > 0) worst = ss > 0 ? sqrt(se / ss) : se > 0 ? INFINITY : 0;
    if (worst > tol) bad = 1;
    (void)mx;
    r->cases++;
    if (isfinite(worst) && worst > r->max_err) r->max_err = worst;
    if (bad) {
        if (!r->bad)
            snprintf(r->first_bad, sizeof r->first_bad, "%s: [%zu] got %.9g want %.9g (err %.2e)",
                     what, wi, got[wi], ref[wi], worst);
        r->bad++;
    }
    free(got);
}

/* --------------------------------------------------------- weights */

/* A weight on both sides: host tensor for the CPU, device tensor for CUDA. */
typedef struct wpair {
    sl_tensor h, d;
    void *hdata, *ddata_alloc;
    uint16_t *hs, *hb;
    void *ds, *db;
} wpair;

static uint16_t to_half_bits(sl_dtype dt, float v) {
    return dt == SL_DTYPE_BF16 ? sl_f32_to_bf16(v) : sl_f32_to_f16(v);
}

/* shape [N, K] (ndim 2) or [K] (N = 0); misalign moves the device bytes off 16-byte alignment. */
static void wpair_make(wpair *w, sl_dtype dt, int64_t N, int64_t K, float scale, int misalign) {
    memset(w, 0, sizeof *w);
    const int64_t rows = N ? N : 1;
    const size_t rb = sl_row_bytes(dt, K), nbytes = rb * (size_t)rows;
    w->hdata = calloc(nbytes + 1, 1);
    float *tmp = rand_vec((size_t)K, scale);
    const int64_t G = sl_qgroups(K);
    if (sl_dtype_is_quant(dt)) {
        w->hs = malloc((size_t)(rows * G) * 2 + 2);
        w->hb = malloc((size_t)(rows * G) * 2 + 2);
    }
    for (int64_t n = 0; n < rows; n++) {
        for (int64_t k = 0; k < K; k++)
            tmp[k] = frand() * scale;
        uint8_t *row = (uint8_t *)w->hdata + (size_t)n * rb;
        if (sl_dtype_is_quant(dt))
            sl_quantize_row(dt, tmp, K, row, w->hs + n * G, w->hb + n * G);
        else if (dt == SL_DTYPE_F32)
            memcpy(row, tmp, (size_t)K * 4);
        else
            for (int64_t k = 0; k < K; k++)
                ((uint16_t *)row)[k] = to_half_bits(dt, tmp[k]);
    }
    free(tmp);
    w->h = (sl_tensor){.name = "w",
                       .dtype = dt,
                       .ndim = N ? 2 : 1,
                       .data = w->hdata,
                       .nbytes = nbytes,
                       .scales = w->hs,
                       .biases = w->hb};
    if (N) {
        w->h.shape[0] = N;
        w->h.shape[1] = K;
    } else {
        w->h.shape[0] = K;
    }
    w->d = w->h;
    const size_t off = misalign ? 4 : 0;
    w->ddata_alloc = gpu.ops->alloc(&gpu, nbytes + 16);
    SL_ASSERT(w->ddata_alloc);
    gpu.ops->to_dev(&gpu, (uint8_t *)w->ddata_alloc + off, w->hdata, nbytes);
    w->d.data = (uint8_t *)w->ddata_alloc + off;
    if (w->hs) {
        w->ds = up(w->hs, (size_t)(rows * G) * 2);
        w->db = up(w->hb, (size_t)(rows * G) * 2);
        w->d.scales = w->ds;
        w->d.biases = w->db;
    }
}

static void wpair_free(wpair *w) {
    free(w->hdata), free(w->hs), free(w->hb);
    dfree(w->ddata_alloc), dfree(w->ds), dfree(w->db);
}

static const sl_dtype float_dtypes[] = {SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};

/* ------------------------------------------------------------- ops */

/* add_rmsnorm (x updated, y normed) and qkv_prep (norms, rope, cache rows) against the CPU. */
static void test_fused_norms(void) {
    op_report r;
    op_begin(&r, "add_rmsnorm");
    static const int ns[] = {63, 2048, 9000}; /* the last past the register path */
    for (size_t ni = 0; ni < 3; ni++)
        for (size_t di = 0; di < 3; di++) {
            const int rows = 3, n = ns[ni];
            wpair w;
            wpair_make(&w, float_dtypes[di], 0, n, 1.0f, 0);
            const size_t tot = (size_t)rows * n + 4;
            float *x = rand_vec(tot, 2), *d = rand_vec(tot, 1), *y = poison_vec(tot);
            float *dx = UPF(x, tot), *dd = UPF(d, tot), *dy = UPF(y, tot);
            cpu.ops->add_rmsnorm(&cpu, y, x, d, &w.h, rows, n, 1e-6f, (float)di);
            gpu.ops->add_rmsnorm(&gpu, dy, dx, dd, &w.d, rows, n, 1e-6f, (float)di);
            check(&r, "x", dx, x, tot, 0);
            /* the sum of n squares in the CPU's order and the block's: their difference grows
             * like sqrt(n) ulps (2.02e-6 at n = 9000 once) */
            check(&r, "y", dy, y, tot, 2e-6 * fmax(1.0, sqrt(n / 2048.0)));
            free(x), free(d), free(y), dfree(dx), dfree(dd), dfree(dy), wpair_free(&w);
        }
    op_end(&r);

    op_begin(&r, "qkv_prep");
    static const int cases[][6] = {/* T, pos0, heads, kv heads, head_dim, rot_dim */
                                   {1, 37, 4, 2, 64, 64},
                                   {5, 0, 3, 1, 128, 64},
                                   {3, 9, 8, 8, 256, 128}};
    for (size_t c = 0; c < 3; c++)
        for (int norm = 0; norm < 2; norm++) {
            const int T = cases[c][0], pos0 = cases[c][1], nh = cases[c][2], nkv = cases[c][3];
            const int hd = cases[c][4], rot = cases[c][5], half = rot / 2, P = pos0 + T + 2;
            float *ct = malloc((size_t)P * half * sizeof(float)),
                  *st = malloc((size_t)P * half * sizeof(float));
            for (int i = 0; i < P * half; i++) {
                const float a = frand() * 3.14159f;
                ct[i] = cosf(a), st[i] = sinf(a);
            }
            const size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd,
                         ncache = (size_t)P * nkv * hd;
            float *q = rand_vec(nq, 2), *k = rand_vec(nk, 2), *v = rand_vec(nk, 1);
            float *kc = poison_vec(ncache), *vc = poison_vec(ncache);
            float *dq = UPF(q, nq), *dk = UPF(k, nk), *dv = UPF(v, nk), *dkc = UPF(kc, ncache),
                  *dvc = UPF(vc, ncache), *dct = UPF(ct, (size_t)P * half),
                  *dst = UPF(st, (size_t)P * half);
            wpair qn, kn;
            wpair_make(&qn, SL_DTYPE_BF16, 0, hd, 1.0f, 0);
            wpair_make(&kn, SL_DTYPE_F32, 0, hd, 1.0f, 0);
            sl_qkv_args a = {.q = q,
                             .k = k,
                             .v = v,
                             .kc = kc,
                             .vc = vc,
                             .q_norm = norm ? &qn.h : NULL,
                             .k_norm = norm ? &kn.h : NULL,
                             .T = T,
                             .pos0 = pos0,
                             .n_heads = nh,
                             .n_kv_heads = nkv,
                             .head_dim = hd,
                             .rot_dim = rot,
                             .eps = 1e-6f,
                             .w_offset = 0.0f,
                             .cos_tab = ct,
                             .sin_tab = st};
            cpu.ops->qkv_prep(&cpu, &a);
            a.q = dq, a.k = dk, a.v = dv, a.kc = dkc, a.vc = dvc, a.cos_tab = dct, a.sin_tab = dst;
            a.q_norm = norm ? &qn.d : NULL, a.k_norm = norm ? &kn.d : NULL;
            gpu.ops->qkv_prep(&gpu, &a);
            check(&r, "q", dq, q, nq, 2e-6);
            check(&r, "k", dk, k, nk, 2e-6);
            check(&r, "kcache", dkc, kc, ncache, 2e-6);
            check(&r, "vcache", dvc, vc, ncache, 0);
            free(ct), free(st), free(q), free(k), free(v), free(kc), free(vc);
            dfree(dq), dfree(dk), dfree(dv), dfree(dkc), dfree(dvc), dfree(dct), dfree(dst);
            wpair_free(&qn), wpair_free(&kn);
        }
    op_end(&r);
}

/* add_rmsnorm_next, taken over by the GEMV that reads its y (matmul, matmul_batch of three,
 * moe_route), or launched before another op (a head too wide to take it, a read back): each
 * consumer's result against the CPU's add_rmsnorm then the op, and x_out and y themselves. */
static void test_norm_next(void) {
    op_report r;
    op_begin(&r, "add_rmsnorm_next");
    enum { K = 512, NE = 40, KT = 4 };
    static const int Ns[] = {96, 20000}; /* the second over PRENORM_MAX_ROWS */
    for (int use = 0; use < 5; use++) {
        const int N = use == 3 ? Ns[1] : Ns[0];
        wpair nw, w[3], router;
        wpair_make(&nw, SL_DTYPE_BF16, 0, K, 1.0f, 0);
        for (int i = 0; i < 3; i++)
            wpair_make(&w[i], SL_DTYPE_Q4, N + 8 * i, K, 0.5f, 0);
        wpair_make(&router, SL_DTYPE_BF16, NE, K, 0.5f, 0);
        float *x = rand_vec(K, 2), *d = rand_vec(K, 1), *xo = poison_vec(K), *y = poison_vec(K);
        float *dx = UPF(x, K), *dd = UPF(d, K), *dxo = UPF(xo, K), *dy = UPF(y, K);
        /* CPU: x_out by add_rmsnorm on a copy of x */
        memcpy(xo, x, K * sizeof(float));
        cpu.ops->add_rmsnorm(&cpu, y, xo, d, &nw.h, 1, K, 1e-6f, 1.0f);
        gpu.ops->add_rmsnorm_next(&gpu, dy, dxo, dx, dd, &nw.d, 1, K, 1e-6f, 1.0f);
        float *out[3], *dout[3];
        for (int i = 0; i < 3; i++)
            out[i] = poison_vec((size_t)N + 8 * i), dout[i] = UPF(out[i], (size_t)N + 8 * i);
        char what[64];
        snprintf(what, sizeof what, "use %d", use);
        if (use == 0 || use == 3) { /* matmul (use 3: too many rows, the norm runs first) */
            cpu.ops->matmul(&cpu, out[0], y, &w[0].h, NULL, 1);
            gpu.ops->matmul(&gpu, dout[0], dy, &w[0].d, NULL, 1);
            check(&r, what, dout[0], out[0], (size_t)N, 1e-4);
        } else if (use == 1) { /* q/k/v-like batch */
            const float *xs[3] = {y, y, y}, *dxs[3] = {dy, dy, dy};
            const sl_tensor *wh[3] = {&w[0].h, &w[1].h, &w[2].h},
                            *wd[3] = {&w[0].d, &w[1].d, &w[2].d};
            const int32_t Ts[3] = {1, 1, 1};
            cpu.ops->matmul_batch(&cpu, out, xs, wh, Ts, 3);
            gpu.ops->matmul_batch(&gpu, dout, dxs, wd, Ts, 3);
            for (int i = 0; i < 3; i++)
                check(&r, what, dout[i], out[i], (size_t)N + 8 * i, 1e-4);
        } else if (use == 2) { /* the router */
            int32_t hid[KT], gid[KT], *did = gpu.ops->alloc(&gpu, sizeof hid);
            float hw[KT], *dw = gpu.ops->alloc(&gpu, sizeof hw);
            float *hl = poison_vec(NE), *dl = UPF(hl, NE);
            const sl_route_cfg rc = {.renormalize = 1};
            const sl_route_args ha = {.ids = hid,
                                      .w = hw,
                                      .logits = hl,
                                      .x = y,
                                      .router = &router.h,
                                      .T = 1,
                                      .k = KT,
                                      .cfg = rc},
                                da = {.ids = did,
                                      .w = dw,
                                      .logits = dl,
                                      .x = dy,
                                      .router = &router.d,
                                      .T = 1,
                                      .k = KT,
                                      .cfg = rc};
            cpu.ops->moe_route(&cpu, &ha);
            gpu.ops->moe_route(&gpu, &da);
            gpu.ops->to_host(&gpu, gid, did, sizeof gid);
            r.cases++;
            if (memcmp(gid, hid, sizeof gid) && !r.bad++)
                snprintf(r.first_bad, sizeof r.first_bad, "router picks differ after the norm");
            check(&r, "router weights", dw, hw, KT, 1e-5);
            free(hl), dfree(dl), dfree(did), dfree(dw);
        } /* use 4: read back straight away */
        check(&r, "x_out", dxo, xo, K, 0);
        check(&r, "y", dy, y, K, 2e-6);
        float *xin = down(dx, K);
        r.cases++;
        if (memcmp(xin, x, K * sizeof(float)) && !r.bad++)
            snprintf(r.first_bad, sizeof r.first_bad, "add_rmsnorm_next changed its x (use %d)",
                     use);
        free(xin);
        for (int i = 0; i < 3; i++)
            free(out[i]), dfree(dout[i]), wpair_free(&w[i]);
        free(x), free(d), free(xo), free(y), dfree(dx), dfree(dd), dfree(dxo), dfree(dy);
        wpair_free(&nw), wpair_free(&router);
    }
    op_end(&r);
}

/* attention with its qkv_prep (sl_attn_args.prep): the kernel that does both (decode, no
 * selection) bitwise against qkv_prep then attention on the GPU (out and both caches), and
 * against the CPU; head_dim 18 takes the two-launch path. */
static void test_attention_prep(void) {
    static const int cases[][6] = {/* pos0, heads, kv heads, head_dim, rot_dim, norms */
                                   {0, 4, 4, 64, 64, 1},      {37, 8, 2, 128, 128, 1},
                                   {3000, 16, 4, 128, 64, 1}, {90, 4, 1, 256, 256, 0},
                                   {12, 6, 3, 80, 40, 1},     {20, 4, 2, 18, 18, 1}};
    op_report r;
    op_begin(&r, "attention+prep");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int pos0 = cases[c][0], nh = cases[c][1], nkv = cases[c][2], hd = cases[c][3];
        const int rot = cases[c][4], norm = cases[c][5], half = rot / 2, P = pos0 + 3;
        float *ct = malloc((size_t)P * half * sizeof(float)),
              *st = malloc((size_t)P * half * sizeof(float));
        for (int i = 0; i < P * half; i++) {
            const float a = frand() * 3.14159f;
            ct[i] = cosf(a), st[i] = sinf(a);
        }
        const size_t nq = (size_t)nh * hd, nk = (size_t)nkv * hd, ncache = (size_t)P * nk;
        float *q = rand_vec(nq, 2), *k = rand_vec(nk, 2), *v = rand_vec(nk, 1);
        float *kc = rand_vec(ncache, 1), *vc = rand_vec(ncache, 1), *o = poison_vec(nq + 3);
        for (size_t i = (size_t)pos0 * nk; i < ncache; i++) /* rows pos0 .. : to be written */
            kc[i] = vc[i] = POISON;
        float *dct = UPF(ct, (size_t)P * half), *dst = UPF(st, (size_t)P * half);
        wpair qn, kn;
        wpair_make(&qn, SL_DTYPE_BF16, 0, hd, 1.0f, 0);
        wpair_make(&kn, SL_DTYPE_F32, 0, hd, 1.0f, 0);
        /* two GPU copies: 0 the two ops, 1 attention with prep */
        float *dq[2], *dk[2], *dv[2], *dkc[2], *dvc[2], *dout[2];
        for (int g = 0; g < 2; g++) {
            dq[g] = UPF(q, nq), dk[g] = UPF(k, nk), dv[g] = UPF(v, nk);
            dkc[g] = UPF(kc, ncache), dvc[g] = UPF(vc, ncache), dout[g] = UPF(o, nq + 3);
        }
        sl_qkv_args pa = {.q = q,
                          .k = k,
                          .v = v,
                          .kc = kc,
                          .vc = vc,
                          .q_norm = norm ? &qn.h : NULL,
                          .k_norm = norm ? &kn.h : NULL,
                          .T = 1,
                          .pos0 = pos0,
                          .n_heads = nh,
                          .n_kv_heads = nkv,
                          .head_dim = hd,
                          .rot_dim = rot,
                          .eps = 1e-6f,
                          .w_offset = 0.0f,
                          .cos_tab = ct,
                          .sin_tab = st};
        float *scratch = malloc((size_t)cpu.n_threads * (pos0 + 1) * sizeof(float));
        sl_attn_args a = {.out = o,
                          .q = q,
                          .kcache = kc,
                          .vcache = vc,
                          .T = 1,
                          .pos0 = pos0,
                          .n_heads = nh,
                          .n_kv_heads = nkv,
                          .head_dim = hd,
                          .scale = 1.0f / sqrtf((float)hd),
                          .scratch = scratch,
                          .prep = &pa};
        cpu.ops->attention(&cpu, &a);
        a.scratch = NULL;
        pa.cos_tab = dct, pa.sin_tab = dst;
        pa.q_norm = norm ? &qn.d : NULL, pa.k_norm = norm ? &kn.d : NULL;
        for (int g = 0; g < 2; g++) {
            pa.q = dq[g], pa.k = dk[g], pa.v = dv[g], pa.kc = dkc[g], pa.vc = dvc[g];
            a.out = dout[g], a.q = dq[g], a.kcache = dkc[g], a.vcache = dvc[g];
            a.prep = g ? &pa : NULL;
            if (!g) gpu.ops->qkv_prep(&gpu, &pa);
            gpu.ops->attention(&gpu, &a);
        }
        char what[96];
        snprintf(what, sizeof what, "pos0=%d h=%d/%d hd=%d rot=%d norm=%d", pos0, nh, nkv, hd, rot,
                 norm);
        check(&r, what, dout[1], o, nq + 3, 2e-5);
        float *o0 = down(dout[0], nq + 3), *k0 = down(dkc[0], ncache), *v0 = down(dvc[0], ncache);
        check(&r, "out vs two ops", dout[1], o0, nq + 3, 0);
        check(&r, "kcache vs two ops", dkc[1], k0, ncache, 0);
        check(&r, "vcache vs two ops", dvc[1], v0, ncache, 0);
        check(&r, "kcache vs cpu", dkc[1], kc, ncache, 2e-6);
        free(o0), free(k0), free(v0), free(scratch);
        free(ct), free(st), free(q), free(k), free(v), free(kc), free(vc), free(o);
        for (int g = 0; g < 2; g++)
            dfree(dq[g]), dfree(dk[g]), dfree(dv[g]), dfree(dkc[g]), dfree(dvc[g]), dfree(dout[g]);
        dfree(dct), dfree(dst), wpair_free(&qn), wpair_free(&kn);
    }
    op_end(&r);
}

/* Prompt attention: the tiled kernels (cuda_ops.cu: attn_tiled_kernel in float32, attn_tc_kernel
 * on tensor cores up to head_dim 128) against the plain one on the GPU, each forced
 * (sl_cuda_set_attention_path), to ~2e-6: the same arithmetic but for the order of the sums; the
 * tensor cores' to 1e-5 (three TF32 MMAs a product: ~21 bits of each operand, where float32 has
 * 24; up to 6e-6 seen). Odd prompt sizes around the tiles
 * (64 rows, 64 or 32 keys), chunks after cached tokens (pos0 > 0), groups of 1-8 query heads a
 * KV head (3: rows of a token across two tiles), head dims 16-256 (16, 24 and 80 padded),
 * windows, chunks and sinks. */
static void test_attention_tiled(void) {
    static const int cases[][8] = {
        /* T, pos0, heads, kv heads, head_dim, window, chunk, sinks */
        {5, 0, 8, 8, 64, 0, 0, 0},       {5, 37, 32, 4, 128, 0, 0, 1},
        {33, 0, 16, 4, 128, 0, 0, 0},    {33, 100, 8, 1, 256, 0, 0, 0},
        {40, 0, 4, 2, 16, 16, 0, 1},     {130, 0, 32, 4, 128, 0, 0, 0},
        {130, 70, 4, 4, 64, 48, 0, 1},   {130, 21, 16, 2, 256, 0, 40, 0},
        {140, 3, 4, 2, 24, 0, 0, 0},     {200, 13, 6, 2, 80, 0, 0, 1},
        {65, 3, 12, 3, 32, 9, 5, 1},     {517, 0, 8, 2, 64, 0, 0, 0},
        {517, 300, 32, 4, 128, 0, 0, 1}, {517, 9, 4, 1, 256, 100, 0, 0},
        {517, 64, 8, 8, 128, 0, 128, 1}, {517, 1000, 32, 4, 128, 200, 0, 0}};
    const uint64_t rng_kept = rng_state; /* the later tests' inputs stay as they were */
    op_report r;
    op_begin(&r, "attention tiled");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int T = cases[c][0], pos0 = cases[c][1], nh = cases[c][2], nkv = cases[c][3];
        const int hd = cases[c][4], P = pos0 + T;
        const size_t nq = (size_t)T * nh * hd, ncache = (size_t)P * nkv * hd;
        float *q = rand_vec(nq, 2), *kc = rand_vec(ncache, 1), *vc = rand_vec(ncache, 1);
        float *dq = UPF(q, nq), *dkc = UPF(kc, ncache), *dvc = UPF(vc, ncache);
        float *o = poison_vec(nq + 3), *dout[3] = {UPF(o, nq + 3), UPF(o, nq + 3), UPF(o, nq + 3)};
        wpair sw; /* around the scores' size, some above them */
        if (cases[c][7]) wpair_make(&sw, SL_DTYPE_F32, 0, nh, 3.0f, 0);
        sl_attn_args a = {.q = dq,
                          .kcache = dkc,
                          .vcache = dvc,
                          .T = T,
                          .pos0 = pos0,
                          .n_heads = nh,
                          .n_kv_heads = nkv,
                          .head_dim = hd,
                          .scale = 1.0f / sqrtf((float)hd),
                          .window = cases[c][5],
                          .chunk = cases[c][6],
                          .sinks = cases[c][7] ? &sw.d : NULL};
        static const sl_cuda_att_path paths[3] = {SL_CUDA_ATT_PLAIN, SL_CUDA_ATT_TILED,
                                                  SL_CUDA_ATT_TC};
        for (int g = 0; g < 3; g++) {
            sl_cuda_set_attention_path(&gpu, paths[g]);
            a.out = dout[g];
            gpu.ops->attention(&gpu, &a);
        }
        sl_cuda_set_attention_path(&gpu, SL_CUDA_ATT_AUTO);
        float *plain = down(dout[0], nq + 3);
        for (int g = 1; g < 3; g++) {
            char what[128];
            snprintf(what, sizeof what, "%s T=%d pos0=%d h=%d/%d hd=%d window=%d chunk=%d sinks=%d",
                     g == 1 ? "float32" : "tensor cores", T, pos0, nh, nkv, hd, cases[c][5],
                     cases[c][6], cases[c][7]);
            check(&r, what, dout[g], plain, nq + 3, g == 1 ? 2e-6 : 1e-5);
        }
        free(plain), free(q), free(kc), free(vc), free(o);
        dfree(dq), dfree(dkc), dfree(dvc), dfree(dout[0]), dfree(dout[1]), dfree(dout[2]);
        if (cases[c][7]) wpair_free(&sw);
    }
    op_end(&r);
    rng_state = rng_kept;
}

/* -------------------------------------------------------- benchmarks */

static double time_matmul(float *dy, const float *dx, const sl_tensor *w, int T, int reps) {
    for (int i = 0; i < 3; i++)
        gpu.ops->matmul(&gpu, dy, dx, w, NULL, T);
    sl_cuda_sync(&gpu);
    const double t0 = sl_now();
    for (int i = 0; i < reps; i++)
        gpu.ops->matmul(&gpu, dy, dx, w, NULL, T);
    sl_cuda_sync(&gpu);
    return (sl_now() - t0) / reps;
}

static void bench_matmul(void) {
    static const int shapes[][2] = {{2048, 768}, {768, 2048}, {151936, 2048}};
    /* F32 takes the float32 tiles: 64 x 64 in the batch, 32 x 32 alone where the few tiles of
     * these shapes leave SMs idle; bitwise all the same */
    static const sl_dtype dts[] = {SL_DTYPE_Q4, SL_DTYPE_Q8, SL_DTYPE_BF16, SL_DTYPE_F32};
    printf("\nGEMV (decode) on %s, weight bytes incl. scales/biases, 50 runs each:\n",
           sl_cuda_device_name(&gpu));
    for (size_t s = 0; s < 3; s++)
        for (size_t di = 0; di < 3; di++) {
            const int N = shapes[s][0], K = shapes[s][1];
            const sl_dtype dt = dts[di];
            const size_t G = (size_t)sl_qgroups(K);
            const size_t data = sl_row_bytes(dt, K) * (size_t)N;
            const size_t sb = sl_dtype_is_quant(dt) ? (size_t)N * G * 2 : 0;
            sl_tensor w = {
                .name = "bench", .dtype = dt, .ndim = 2, .shape = {N, K}, .nbytes = data};
            void *dd = gpu.ops->alloc(&gpu, data);
            void *ds = sb ? gpu.ops->alloc(&gpu, sb) : NULL,
                 *db = sb ? gpu.ops->alloc(&gpu, sb) : NULL;
            SL_ASSERT(dd && (!sb || (ds && db)));
            w.data = dd, w.scales = ds, w.biases = db;
            float *dx = gpu.ops->alloc(&gpu, (size_t)512 * K * sizeof(float));
            float *dy = gpu.ops->alloc(&gpu, (size_t)512 * N * sizeof(float));
            const double bytes = (double)(data + 2 * sb);
            printf("  %-5s %6d x %-5d (%7.1f MB):", sl_dtype_name(dt), N, K, bytes / 1e6);
            for (int T = 1; T <= 4; T *= 4) {
                const double t = time_matmul(dy, dx, &w, T, 50);
                printf("  T=%d %7.1f us %7.1f GB/s", T, t * 1e6, bytes / t / 1e9);
            }
            if (N <= 2048) {
                const double t = time_matmul(dy, dx, &w, 512, 10);
                printf("  | T=512 %7.1f us %6.0f GFLOP/s", t * 1e6, 2.0 * N * K * 512 / t / 1e9);
            }
            printf("\n");
            dfree(dd), dfree(ds), dfree(db), dfree(dx), dfree(dy);
        }
}

/* The average time of `stmt` over `reps` back-to-back runs on the GPU's stream (after 5
 * unmeasured), in us; TIME_US: over 200. */
#define TIME_REPS(reps, stmt)                                                                      \
    ({                                                                                             \
        for (int i_ = 0; i_ < 5; i_++)                                                             \
            stmt;                                                                                  \
        sl_cuda_sync(&gpu);                                                                        \
        const double t0_ = sl_now();                                                               \
        for (int i_ = 0; i_ < (reps); i_++)                                                        \
            stmt;                                                                                  \
        sl_cuda_sync(&gpu);                                                                        \
        (sl_now() - t0_) / (reps)*1e6;                                                             \
    })
#define TIME_US(stmt) TIME_REPS(200, stmt)

/* One decode layer's ops at Qwen3-30B-A3B shapes (hidden 2048, 32/4 heads of 128, 128 experts of
 * 768, top-8, int4; router BF16), each timed alone (launch overhead included, ~3 us a launch). */
static void bench_layer(void) {
    enum { H = 2048, QD = 4096, KVD = 512, NE = 128, I = 768, KT = 8 };
    wpair q, k, v, o, router, nw, ex[3];
    wpair_make(&q, SL_DTYPE_Q4, QD, H, 0.5f, 0);
    wpair_make(&k, SL_DTYPE_Q4, KVD, H, 0.5f, 0);
    wpair_make(&v, SL_DTYPE_Q4, KVD, H, 0.5f, 0);
    wpair_make(&o, SL_DTYPE_Q4, H, QD, 0.5f, 0);
    wpair_make(&router, SL_DTYPE_BF16, NE, H, 0.5f, 0);
    wpair_make(&nw, SL_DTYPE_BF16, 0, H, 1.0f, 0);
    wpair_make(&ex[0], SL_DTYPE_Q4, I, H, 0.5f, 0);
    wpair_make(&ex[1], SL_DTYPE_Q4, I, H, 0.5f, 0);
    wpair_make(&ex[2], SL_DTYPE_Q4, H, I, 0.5f, 0);
    float *hx = rand_vec(QD, 1), *dx = UPF(hx, QD);
    float *dy = gpu.ops->alloc(&gpu, (QD + 2 * KVD) * sizeof(float));
    float *dres = gpu.ops->alloc(&gpu, H * sizeof(float)); /* add_rmsnorm's residual */
    float *dl = gpu.ops->alloc(&gpu, NE * sizeof(float));
    float *dact = gpu.ops->alloc(&gpu, KT * I * sizeof(float));
    float *dw = gpu.ops->alloc(&gpu, KT * sizeof(float));
    int32_t *dids = gpu.ops->alloc(&gpu, KT * sizeof(int32_t));
    /* every expert of the table is the same three matrices: the bytes read are those of 8 */
    sl_expert_ptrs rows[NE];
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < 3; j++) {
            rows[e].p[3 * j] = ex[j].d.data;
            rows[e].p[3 * j + 1] = ex[j].d.scales;
            rows[e].p[3 * j + 2] = ex[j].d.biases;
        }
    sl_expert_ptrs *table = up(rows, sizeof rows);
    const sl_tensor *proto[3] = {&ex[0].d, &ex[1].d, &ex[2].d};
    float *qkv_y[3] = {dy, dy + QD, dy + QD + KVD};
    const float *qkv_x[3] = {dx, dx, dx};
    const sl_tensor *qkv_w[3] = {&q.d, &k.d, &v.d};
    const int32_t ones[3] = {1, 1, 1};
    const double t_norm = TIME_US(gpu.ops->add_rmsnorm(&gpu, dy, dres, dx, &nw.d, 1, H, 1e-6f, 0));
    const double t_qkv = TIME_US(gpu.ops->matmul_batch(&gpu, qkv_y, qkv_x, qkv_w, ones, 3));
    const double t_o = TIME_US(gpu.ops->matmul(&gpu, dy, dx, &o.d, NULL, 1));
    const sl_route_args ra = {.ids = dids,
                              .w = dw,
                              .logits = dl,
                              .x = dx,
                              .router = &router.d,
                              .T = 1,
                              .k = KT,
                              .cfg = {.renormalize = 1}};
    const double t_route = TIME_US(gpu.ops->moe_route(&gpu, &ra));
    const double t_rgemv = TIME_US(gpu.ops->matmul(&gpu, dl, dx, &router.d, NULL, 1));
    const double t_exp =
        TIME_US(gpu.ops->moe_experts(&gpu, dy, dact, dx, dids, dw, table, proto, 1, KT));
    printf("decode layer ops (Qwen3-30B-A3B shapes, int4), us each, launch included:\n"
           "  add_rmsnorm %.1f | q/k/v batch %.1f | o-proj %.1f | router+top-k %.1f (its GEMV "
           "alone %.1f) | experts %.1f\n",
           t_norm, t_qkv, t_o, t_route, t_rgemv, t_exp);
    wpair *all[] = {&q, &k, &v, &o, &router, &nw, &ex[0], &ex[1], &ex[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        wpair_free(all[i]);
    free(hx);
    dfree(dx), dfree(dy), dfree(dres), dfree(dl), dfree(dact), dfree(dw), dfree(dids), dfree(table);
}

static void bench_attention(void) {
    const int nh = 32, nkv = 4, hd = 128, ctx = 4096;
    const size_t kvn = (size_t)ctx * nkv * hd;
    float *dk = gpu.ops->alloc(&gpu, kvn * 4), *dv = gpu.ops->alloc(&gpu, kvn * 4);
    float *dq = gpu.ops->alloc(&gpu, (size_t)512 * nh * hd * 4),
          *dout = gpu.ops->alloc(&gpu, (size_t)512 * nh * hd * 4);
    sl_attn_args a = {.out = dout,
                      .q = dq,
                      .kcache = dk,
                      .vcache = dv,
                      .T = 1,
                      .pos0 = ctx - 1,
                      .n_heads = nh,
                      .n_kv_heads = nkv,
                      .head_dim = hd,
                      .scale = 0.088f};
    gpu.ops->attention(&gpu, &a);
    sl_cuda_sync(&gpu);
    double t0 = sl_now();
    for (int i = 0; i < 50; i++)
        gpu.ops->attention(&gpu, &a);
    sl_cuda_sync(&gpu);
    const double td = (sl_now() - t0) / 50;
    a.T = 512, a.pos0 = 0;
    gpu.ops->attention(&gpu, &a);
    sl_cuda_sync(&gpu);
    t0 = sl_now();
    for (int i = 0; i < 5; i++)
        gpu.ops->attention(&gpu, &a);
    sl_cuda_sync(&gpu);
    const double tp = (sl_now() - t0) / 5;
    printf("attention 32/4 heads x 128: decode at ctx %d %.1f us (%.0f GB/s of KV), prefill T=512 "
           "%.1f us\n",
           ctx, td * 1e6, 2.0 * kvn * 4 / td / 1e9, tp * 1e6);
    /* a decode step's qkv_prep and attention at 48 keys (the decode benchmark's contexts), as two
     * ops and as attention with prep (one launch where it fuses) */
    float *dkr = gpu.ops->alloc(&gpu, (size_t)nkv * hd * 4),
          *dvr = gpu.ops->alloc(&gpu, (size_t)nkv * hd * 4);
    float *tab = gpu.ops->alloc(&gpu, (size_t)ctx * hd / 2 * 4);
    gpu.ops->fill(&gpu, tab, 0.5f, (size_t)ctx * hd / 2);
    sl_qkv_args p = {.q = dq,
                     .k = dkr,
                     .v = dvr,
                     .kc = dk,
                     .vc = dv,
                     .T = 1,
                     .pos0 = 47,
                     .n_heads = nh,
                     .n_kv_heads = nkv,
                     .head_dim = hd,
                     .rot_dim = hd,
                     .eps = 1e-6f,
                     .cos_tab = tab,
                     .sin_tab = tab};
    static const int keys[] = {48, 128, 512, 2048};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        a.T = 1, a.pos0 = p.pos0 = keys[i] - 1, a.prep = NULL;
        const double t_two = TIME_US((gpu.ops->qkv_prep(&gpu, &p), gpu.ops->attention(&gpu, &a)));
        a.prep = &p;
        const double t_one = TIME_US(gpu.ops->attention(&gpu, &a));
        printf("qkv_prep + attention at %d keys: %.1f us as two ops, %.1f us as attention with "
               "prep\n",
               keys[i], t_two, t_one);
    }
    dfree(dk), dfree(dv), dfree(dq), dfree(dout), dfree(dkr), dfree(dvr), dfree(tab);
}

/* Prompt attention at Qwen3-30B-A3B shapes (32 query heads, 4 KV heads of 128) from position 0,
 * the plain kernel against the tiled one, in GFLOP/s of the causal work (4 head_dim flops a
 * (query, key, head): q . k and p v). The plain kernel's splits past 4096 keys need their
 * scratch reserved first (1.1 GB at 16384 tokens). */
static void bench_attention_prompt(void) {
    const int nh = 32, nkv = 4, hd = 128, Tmax = 16384;
    static const int Ts[] = {64, 128, 256, 512, 4096, 16384};
    const sl_reserve_args ra = {.max_batch = Tmax, .max_ctx = Tmax, .n_heads = nh, .head_dim = hd};
    sl_error err = {0};
    if (gpu.ops->reserve && gpu.ops->reserve(&gpu, &ra, &err) != SL_OK) {
        printf("prompt attention: %s\n", err.msg);
        return;
    }
    const size_t qn = (size_t)Tmax * nh * hd, kvn = (size_t)Tmax * nkv * hd;
    float *dq = gpu.ops->alloc(&gpu, qn * 4), *dout = gpu.ops->alloc(&gpu, qn * 4);
    float *dk = gpu.ops->alloc(&gpu, kvn * 4), *dv = gpu.ops->alloc(&gpu, kvn * 4);
    SL_ASSERT(dq && dout && dk && dv);
    /* values of a trained model's size: no inf or NaN in the exps */
    gpu.ops->fill(&gpu, dq, 0.05f, qn);
    gpu.ops->fill(&gpu, dk, 0.05f, kvn);
    gpu.ops->fill(&gpu, dv, 0.5f, kvn);
    printf("prompt attention, 32/4 heads x 128, pos0 0 (plain: one block a query and head; "
           "tiled: float32, 64 rows x 64 keys; tc: tensor cores, 64 rows x 32 keys):\n");
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        const int T = Ts[i], reps = T >= 16384 ? 2 : T >= 4096 ? 3 : 20;
        sl_attn_args a = {.out = dout,
                          .q = dq,
                          .kcache = dk,
                          .vcache = dv,
                          .T = T,
                          .n_heads = nh,
                          .n_kv_heads = nkv,
                          .head_dim = hd,
                          .scale = 0.088f};
        const double flops = 4.0 * hd * nh * ((double)T * (T + 1) / 2);
        double t[3];
        static const sl_cuda_att_path paths[3] = {SL_CUDA_ATT_PLAIN, SL_CUDA_ATT_TILED,
                                                  SL_CUDA_ATT_TC};
        for (int g = 0; g < 3; g++) {
            sl_cuda_set_attention_path(&gpu, paths[g]);
            gpu.ops->attention(&gpu, &a);
            sl_cuda_sync(&gpu);
            const double t0 = sl_now();
            for (int k = 0; k < reps; k++)
                gpu.ops->attention(&gpu, &a);
            sl_cuda_sync(&gpu);
            t[g] = (sl_now() - t0) / reps;
        }
        sl_cuda_set_attention_path(&gpu, SL_CUDA_ATT_AUTO);
        printf("  T=%-5d plain %9.1f us %6.0f GFLOP/s | tiled %9.1f us %6.0f GFLOP/s | tc %9.1f us "
               "%6.0f GFLOP/s | tc %.2fx tiled\n",
               T, t[0] * 1e6, flops / t[0] / 1e9, t[1] * 1e6, flops / t[1] / 1e9, t[2] * 1e6,
               flops / t[2] / 1e9, t[1] / t[2]);
    }
    if (gpu.ops->status && gpu.ops->status(&gpu, &err) != SL_OK)
        printf("prompt attention: %s\n", err.msg);
    dfree(dq), dfree(dout), dfree(dk), dfree(dv);
}

/* A Q4 weight [N, K] for timing: device bytes of a fixed pattern (codes 0xA, 0x9, ...), scales
 * 2^-7 and biases -0.125 (BF16); what the values are does not change the work. */
static sl_tensor bench_q4(int64_t N, int64_t K) {
    const size_t data = sl_row_bytes(SL_DTYPE_Q4, K) * (size_t)N;
    const size_t sb = (size_t)N * (size_t)sl_qgroups(K) * 2;
    float *d = gpu.ops->alloc(&gpu, data), *s = gpu.ops->alloc(&gpu, sb),
          *b = gpu.ops->alloc(&gpu, sb);
    SL_ASSERT(d && s && b);
    uint32_t bits[3] = {0x3FD9999Au, 0x3C003C00u, 0xBE00BE00u};
    float v[3];
    memcpy(v, bits, sizeof v);
    gpu.ops->fill(&gpu, d, v[0], data / 4);
    gpu.ops->fill(&gpu, s, v[1], sb / 4);
    gpu.ops->fill(&gpu, b, v[2], sb / 4);
    return (sl_tensor){.name = "bench",
                       .dtype = SL_DTYPE_Q4,
                       .ndim = 2,
                       .shape = {N, K},
                       .data = d,
                       .nbytes = data,
                       .scales = s,
                       .biases = b};
}

static void bench_q4_free(sl_tensor *w) {
    dfree((void *)w->data), dfree((void *)w->scales), dfree((void *)w->biases);
}

static size_t q4_bytes(const sl_tensor *w) {
    return w->nbytes + 2 * (size_t)w->shape[0] * (size_t)sl_qgroups(w->shape[1]) * 2;
}

static const char *const q4_path_name[] = {"int8 TC", "int8 ref", "BF16 TC"};

static void bench_q4_line(const char *what, int T, int path, double us, double ops, double bytes) {
    printf("  %-8s %-26s T=%-5d %9.1f us %7.1f TOPS %7.0f GB/s\n", q4_path_name[path], what, T, us,
           ops / us / 1e6, bytes / us / 1e3);
}

/*
 * Q4 prefill at Qwen3-30B-A3B shapes on each path (sl_cuda_q4_path): the int8 tensor-core kernel
 * (matmul's default), its plain reference and the BF16 tensor cores (float x): dense products
 * (q, o-proj and the head) at 512 and 4096 tokens, and a 512-token chunk's routed experts (128
 * experts of 32 tokens: gate and up as one batch of 256 whose pairs share x, down as one of 128).
 * Tensor ops a second (2 N K T) and weight bytes (codes, scales, biases) read once a second.
 */
static void bench_imma(void) {
    sl_error err = {0};
    /* a session's scratch for x of 4096 x 4096 (the experts' 4096 rows of 2048 fit too) */
    const sl_reserve_args ra = {.max_batch = 4096,
                                .max_ctx = 4096,
                                .n_heads = 32,
                                .head_dim = 128,
                                .max_x = (int64_t)4096 * 4096};
    if (gpu.ops->reserve(&gpu, &ra, &err)) printf("  reserve: %s\n", err.msg);
    printf("Q4 prefill on %s, Qwen3-30B-A3B shapes:\n", sl_cuda_device_name(&gpu));
    static const int dense[][2] = {{4096, 2048}, {2048, 4096}, {151936, 2048}};
    float *dx = gpu.ops->alloc(&gpu, (size_t)4096 * 4096 * sizeof(float));
    float *dy = gpu.ops->alloc(&gpu, (size_t)4096 * 151936 * sizeof(float));
    SL_ASSERT(dx && dy);
    {
        float *hx = rand_vec((size_t)4096 * 4096, 1);
        gpu.ops->to_dev(&gpu, dx, hx, (size_t)4096 * 4096 * sizeof(float));
        free(hx);
    }
    for (int s = 0; s < 3; s++) {
        const int N = dense[s][0], K = dense[s][1];
        sl_tensor w = bench_q4(N, K);
        char what[64];
        snprintf(what, sizeof what, "dense %d x %d", N, K);
        for (int T = 512; T <= 4096; T *= 8)
            for (int path = 0; path < 3; path++) {
                const double ops = 2.0 * N * K * T;
                if (path == SL_CUDA_Q4_IMMA_REF && (T > 512 || N > 4096)) continue; /* slow */
                const int reps =
                    SL_MAX(1, SL_MIN(path == SL_CUDA_Q4_IMMA_REF ? 5 : 50, (int)(2e12 / ops)));
                const double us = TIME_REPS(
                    reps, sl_cuda_q4_prefill(&gpu, dy, dx, &w, NULL, T, (sl_cuda_q4_path)path));
                bench_q4_line(what, T, path, us, ops, (double)q4_bytes(&w));
            }
        /* the int8 path at each tile height, forced (what imma_pick weighs) */
        for (int bt = 128; bt >= 32; bt /= 2) {
            sl_cuda_set_imma_tile(&gpu, bt);
            const double us =
                TIME_REPS(20, sl_cuda_q4_prefill(&gpu, dy, dx, &w, NULL, 512, SL_CUDA_Q4_IMMA));
            printf("    %s T=512 tiles of %d tokens: %.1f us\n", what, bt, us);
        }
        sl_cuda_set_imma_tile(&gpu, 0);
        bench_q4_free(&w);
    }
    enum { NE = 128, TE = 32, H = 2048, I = 768 };
    sl_tensor *ew = malloc(3 * NE * sizeof(sl_tensor));
    const sl_tensor *gu[2 * NE], *dn[NE];
    float *gy[2 * NE], *dyv[NE];
    const float *gx[2 * NE], *dxv[NE];
    int32_t Ts[2 * NE];
    float *act = gpu.ops->alloc(&gpu, (size_t)NE * TE * I * 2 * sizeof(float));
    SL_ASSERT(act);
    size_t bgu = 0, bdn = 0;
    for (int e = 0; e < NE; e++) {
        ew[3 * e] = bench_q4(I, H), ew[3 * e + 1] = bench_q4(I, H), ew[3 * e + 2] = bench_q4(H, I);
        gu[e] = &ew[3 * e], gu[NE + e] = &ew[3 * e + 1], dn[e] = &ew[3 * e + 2];
        gx[e] = gx[NE + e] = dx + (size_t)e * TE * H;
        gy[e] = act + (size_t)e * TE * I, gy[NE + e] = act + (size_t)(NE + e) * TE * I;
        dxv[e] = act + (size_t)e * TE * I;
        dyv[e] = dy + (size_t)e * TE * H;
        Ts[e] = Ts[NE + e] = TE;
        bgu += q4_bytes(&ew[3 * e]) + q4_bytes(&ew[3 * e + 1]), bdn += q4_bytes(&ew[3 * e + 2]);
    }
    for (int path = 0; path < 3; path++) {
        const int reps = path == SL_CUDA_Q4_IMMA_REF ? 2 : 20;
        double us = TIME_REPS(
            reps, sl_cuda_q4_prefill_batch(&gpu, gy, gx, gu, Ts, 2 * NE, (sl_cuda_q4_path)path));
        bench_q4_line("experts gate+up 256 x 768", TE, path, us, 2.0 * 2 * NE * I * H * TE,
                      (double)bgu);
        us = TIME_REPS(reps,
                       sl_cuda_q4_prefill_batch(&gpu, dyv, dxv, dn, Ts, NE, (sl_cuda_q4_path)path));
        bench_q4_line("experts down 128 x 2048", TE, path, us, 2.0 * NE * H * I * TE, (double)bdn);
    }
    /* a prompt's uneven loads: 8 to 56 tokens an expert (4,036 rows, 31.5 on average), each
     * expert's rows after the last one's */
    size_t off = 0;
    for (int e = 0; e < NE; e++) {
        Ts[e] = Ts[NE + e] = 8 + (37 * e) % 49;
        gx[e] = gx[NE + e] = dx + off * H;
        gy[e] = act + off * I, gy[NE + e] = act + ((size_t)NE * TE + off) * I;
        dxv[e] = act + off * I;
        dyv[e] = dy + off * H;
        off += (size_t)Ts[e];
    }
    SL_ASSERT(off <= (size_t)NE * TE);
    for (int path = 0; path < 3; path += 2) {
        double us = TIME_REPS(
            20, sl_cuda_q4_prefill_batch(&gpu, gy, gx, gu, Ts, 2 * NE, (sl_cuda_q4_path)path));
        bench_q4_line("experts gate+up, 8-56 tokens", 32, path, us, 2.0 * 2 * I * H * (double)off,
                      (double)bgu);
        us = TIME_REPS(20,
                       sl_cuda_q4_prefill_batch(&gpu, dyv, dxv, dn, Ts, NE, (sl_cuda_q4_path)path));
        bench_q4_line("experts down, 8-56 tokens", 32, path, us, 2.0 * H * I * (double)off,
                      (double)bdn);
    }
    for (int bt = 128; bt >= 32; bt /= 2) {
        sl_cuda_set_imma_tile(&gpu, bt);
        const double ug =
            TIME_REPS(20, sl_cuda_q4_prefill_batch(&gpu, gy, gx, gu, Ts, 2 * NE, SL_CUDA_Q4_IMMA));
        const double ud =
            TIME_REPS(20, sl_cuda_q4_prefill_batch(&gpu, dyv, dxv, dn, Ts, NE, SL_CUDA_Q4_IMMA));
        printf("    experts, 8-56 tokens, tiles of %d tokens: gate+up %.1f us, down %.1f us\n", bt,
               ug, ud);
    }
    sl_cuda_set_imma_tile(&gpu, 0);
    for (int i = 0; i < 3 * NE; i++)
        bench_q4_free(&ew[i]);
    free(ew);
    dfree(dx), dfree(dy), dfree(act);
}

/* matmul_batch: one GEMV launch (same T <= 4), one per T <= 4 plus a tiled launch of those with
 * T > 4 (mixed T; items of several row and token tiles), each item against the CPU. */
static void test_matmul_batch(void) {
    op_report r;
    op_begin(&r, "matmul_batch");
    enum { NB = 5, K = 256 };
    /* F32 takes the float32 tiles: 64 x 64 in the batch, 32 x 32 alone where the few tiles of
     * these shapes leave SMs idle; bitwise all the same */
    static const sl_dtype dts[] = {SL_DTYPE_Q4, SL_DTYPE_Q8, SL_DTYPE_BF16, SL_DTYPE_F32};
    static const int32_t Ns[NB] = {96, 33, 130, 64, 200};
    /* {1, 1, 1, 1, 2}: four T = 1 items of unequal rows, the GEMV launch whose items travel
     * as a kernel parameter (row blocks numbered across the items) */
    static const int32_t Ts[5][NB] = {
        {1, 1, 1, 1, 1}, {3, 3, 3, 3, 3}, {1, 2, 5, 1, 3}, {6, 70, 1, 9, 65}, {1, 1, 1, 1, 2}};
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (int c = 0; c < 5; c++) {
            wpair w[NB];
            float *hx[NB], *hy[NB], *dx[NB], *dy[NB];
            const sl_tensor *wh[NB], *wd[NB];
            for (int i = 0; i < NB; i++) {
                const int32_t N = Ns[i], T = Ts[c][i];
                wpair_make(&w[i], dts[di], N, K, 0.5f, 0);
                wh[i] = &w[i].h, wd[i] = &w[i].d;
                hx[i] = rand_vec((size_t)T * K, 1), dx[i] = UPF(hx[i], T * K);
                hy[i] = poison_vec((size_t)T * N + 3), dy[i] = UPF(hy[i], T * N + 3);
            }
            cpu.ops->matmul_batch(&cpu, hy, (const float *const *)hx, wh, Ts[c], NB);
            gpu.ops->matmul_batch(&gpu, dy, (const float *const *)dx, wd, Ts[c], NB);
            for (int i = 0; i < NB; i++) {
                const size_t yn = (size_t)Ts[c][i] * Ns[i] + 3;
                check(&r, "matmul_batch", dy[i], hy[i], yn, 1e-4);
                /* bitwise what the item computes alone */
                float *dz = UPF(hy[i], yn);
                gpu.ops->matmul(&gpu, dz, dx[i], wd[i], NULL, Ts[c][i]);
                float *alone = down(dz, yn);
                check(&r, "batch item vs alone", dy[i], alone, yn, 0);
                free(alone), dfree(dz);
                wpair_free(&w[i]);
                free(hx[i]), free(hy[i]), dfree(dx[i]), dfree(dy[i]);
            }
        }
    op_end(&r);
}

/* moe_route against the CPU (same picks, ties to the lower id included; the one-launch path
 * for T <= 4 and the two-launch one); moe_experts bitwise against matmul_batch (T = 1 items),
 * swiglu, matmul_batch and weighted_sum on the GPU, and against the CPU's op within
 * tolerance. */
static void test_moe(void) {
    op_report r;
    op_begin(&r, "moe_route");
    /* 1100 experts: the top-k reads p instead of registers; k = 40: picks past the 32 lanes */
    static const int32_t Es[] = {8, 60, 128, 513, 1100}, ks[] = {1, 4, 8, 40}, Ts[] = {1, 3, 4, 6};
    static const sl_dtype rdts[] = {SL_DTYPE_BF16, SL_DTYPE_Q4, SL_DTYPE_F32};
    enum { KR = 256 };
    for (int ei = 0; ei < 5; ei++)
        for (int di = 0; di < 3; di++) {
            const int32_t E = Es[ei];
            wpair rw;
            wpair_make(&rw, rdts[di], E, KR, 0.5f, 0);
            if (rdts[di] == SL_DTYPE_BF16) { /* exact ties: rows E-1 and E/2 repeat rows 1, 3 */
                const size_t rb = sl_row_bytes(SL_DTYPE_BF16, KR);
                uint8_t *h = rw.hdata;
                memcpy(h + (size_t)(E - 1) * rb, h + rb, rb);
                memcpy(h + (size_t)(E / 2) * rb, h + 3 * rb, rb);
                gpu.ops->to_dev(&gpu, (void *)rw.d.data, h, (size_t)E * rb);
            }
            for (int ki = 0; ki < 4; ki++)
                for (int ti = 0; ti < 4; ti++) {
                    const int32_t k = ks[ki], T = Ts[ti];
                    /* on int8 x a Q4 router's logits move by ~1e-2: picks may differ */
                    if (k > E || (q4x_run && rdts[di] == SL_DTYPE_Q4)) continue;
                    float *hx = rand_vec((size_t)T * KR, 1), *dx = UPF(hx, T * KR);
                    float *hl = poison_vec((size_t)T * E), *dl = UPF(hl, T * E);
                    int32_t hid[6 * 40], gid[6 * 40], *did = gpu.ops->alloc(&gpu, sizeof hid);
                    float hw[6 * 40], *dw = gpu.ops->alloc(&gpu, sizeof hw);
                    const int renorm = ti & 1;
                    const sl_route_cfg rc = {.renormalize = renorm};
                    const sl_route_args ha = {.ids = hid,
                                              .w = hw,
                                              .logits = hl,
                                              .x = hx,
                                              .router = &rw.h,
                                              .T = T,
                                              .k = k,
                                              .cfg = rc},
                                        da = {.ids = did,
                                              .w = dw,
                                              .logits = dl,
                                              .x = dx,
                                              .router = &rw.d,
                                              .T = T,
                                              .k = k,
                                              .cfg = rc};
                    cpu.ops->moe_route(&cpu, &ha);
                    gpu.ops->moe_route(&gpu, &da);
                    gpu.ops->to_host(&gpu, gid, did, (size_t)T * k * sizeof(int32_t));
                    r.cases++;
                    if (memcmp(gid, hid, (size_t)T * k * sizeof(int32_t)) && !r.bad++)
                        snprintf(r.first_bad, sizeof r.first_bad,
                                 "ids differ (%s, E %d, k %d, T %d)", sl_dtype_name(rdts[di]), E, k,
                                 T);
                    check(&r, "weights", dw, hw, (size_t)T * k, 1e-5);
                    check(&r, "probs", dl, hl, (size_t)T * E, 1e-5);
                    free(hx), free(hl), dfree(dx), dfree(dl), dfree(did), dfree(dw);
                }
            wpair_free(&rw);
        }
    /* the other rules (one warp a token over logits of a matmul with the bias): softmax with
     * per-expert factors, top-k then softmax, sigmoid with groups, top-k then sigmoid */
    static const sl_route_cfg rules[] = {
        {.score = SL_ROUTE_SOFTMAX, .renormalize = 1, .scale = 0.5f},
        {.score = SL_ROUTE_TOPK_SOFTMAX},
        {.score = SL_ROUTE_SIGMOID, .renormalize = 1, .n_group = 4, .topk_group = 2, .scale = 2.5f},
        {.score = SL_ROUTE_SIGMOID, .n_group = 0},
        {.score = SL_ROUTE_TOPK_SIGMOID},
    };
    for (size_t ri = 0; ri < sizeof rules / sizeof rules[0]; ri++)
        for (int ei = 0; ei < 4; ei++) {
            const int32_t E = Es[ei] == 60 ? 64 : Es[ei] == 513 ? 512 : Es[ei];
            const int32_t T = 1 + 2 * ei, k = SL_MIN(E / 4, 8);
            wpair rw, bias, sb, es;
            wpair_make(&rw, SL_DTYPE_BF16, E, KR, 0.5f, 0);
            wpair_make(&bias, SL_DTYPE_F32, 0, E, 0.5f, 0);
            wpair_make(&sb, SL_DTYPE_F32, 0, E, 0.2f, 0);
            wpair_make(&es, SL_DTYPE_BF16, 0, E, 1.0f, 0);
            const int has_bias = ri == 1, has_sb = rules[ri].score == SL_ROUTE_SIGMOID,
                      has_es = ri == 0;
            float *hx = rand_vec((size_t)T * KR, 1), *dx = UPF(hx, T * KR);
            float *hl = poison_vec((size_t)T * E), *dl = UPF(hl, T * E);
            int32_t hid[7 * 8], gid[7 * 8], *did = gpu.ops->alloc(&gpu, sizeof hid);
            float hw[7 * 8], *dw = gpu.ops->alloc(&gpu, sizeof hw);
            const sl_route_args ha = {.ids = hid,
                                      .w = hw,
                                      .logits = hl,
                                      .x = hx,
                                      .router = &rw.h,
                                      .bias = has_bias ? &bias.h : NULL,
                                      .select_bias = has_sb ? &sb.h : NULL,
                                      .expert_scale = has_es ? &es.h : NULL,
                                      .T = T,
                                      .k = k,
                                      .cfg = rules[ri]},
                                da = {.ids = did,
                                      .w = dw,
                                      .logits = dl,
                                      .x = dx,
                                      .router = &rw.d,
                                      .bias = has_bias ? &bias.d : NULL,
                                      .select_bias = has_sb ? &sb.d : NULL,
                                      .expert_scale = has_es ? &es.d : NULL,
                                      .T = T,
                                      .k = k,
                                      .cfg = rules[ri]};
            cpu.ops->moe_route(&cpu, &ha);
            gpu.ops->moe_route(&gpu, &da);
            gpu.ops->to_host(&gpu, gid, did, (size_t)T * k * sizeof(int32_t));
            r.cases++;
            if (memcmp(gid, hid, (size_t)T * k * sizeof(int32_t)) && !r.bad++)
                snprintf(r.first_bad, sizeof r.first_bad, "ids differ (rule %d, E %d, k %d, T %d)",
                         (int)ri, E, k, T);
            check(&r, "weights", dw, hw, (size_t)T * k, 1e-5);
            check(&r, "scores", dl, hl, (size_t)T * E, 1e-5);
            free(hx), free(hl), dfree(dx), dfree(dl), dfree(did), dfree(dw);
            wpair_free(&rw), wpair_free(&bias), wpair_free(&sb), wpair_free(&es);
        }
    op_end(&r);

    op_begin(&r, "moe_experts");
    /* T, H, I: shapes that take each rows-per-block choice of the down kernel (4, 8, 8, 2, 1
     * on an H200's 132 SMs), prefill and decode; the last, gate/up at two rows a warp (at one,
     * 416 blocks: more than a wave of 396) */
    enum { NS = 6 };
    static const int shapes[NS][3] = {{3, 256, 128}, {1, 2048, 192}, {5, 1152, 128},
                                      {2, 192, 64},  {1, 256, 64},   {1, 256, 1664}};
    enum { NE = 6, K = 2, MT = 5 };
    /* F32 takes the float32 tiles: 64 x 64 in the batch, 32 x 32 alone where the few tiles of
     * these shapes leave SMs idle; bitwise all the same */
    static const sl_dtype dts[] = {SL_DTYPE_Q4, SL_DTYPE_Q8, SL_DTYPE_BF16, SL_DTYPE_F32};
    for (size_t di = 0; di < 3 * NS; di++) {
        const int T = shapes[di % NS][0], H = shapes[di % NS][1], I = shapes[di % NS][2];
        wpair w[NE][3];
        sl_expert_ptrs rows[NE], hrows[NE];
        for (int e = 0; e < NE; e++) {
            wpair_make(&w[e][0], dts[di / NS], I, H, 0.5f, 0);
            wpair_make(&w[e][1], dts[di / NS], I, H, 0.5f, 0);
            wpair_make(&w[e][2], dts[di / NS], H, I, 0.5f, 0);
            for (int j = 0; j < 3; j++) {
                rows[e].p[3 * j] = w[e][j].d.data, hrows[e].p[3 * j] = w[e][j].h.data;
                rows[e].p[3 * j + 1] = w[e][j].d.scales, hrows[e].p[3 * j + 1] = w[e][j].h.scales;
                rows[e].p[3 * j + 2] = w[e][j].d.biases, hrows[e].p[3 * j + 2] = w[e][j].h.biases;
            }
        }
        sl_expert_ptrs *table = gpu.ops->alloc(&gpu, sizeof rows);
        gpu.ops->to_dev(&gpu, table, rows, sizeof rows);
        int32_t ids[MT * K];
        float wts[MT * K];
        for (int t = 0; t < T; t++) /* a token's two picks differ (by 3, mod 6) */
            ids[t * K] = (2 * t + 1) % NE, ids[t * K + 1] = (2 * t + 4) % NE,
                    wts[t * K] = 0.6f + 0.05f * t, wts[t * K + 1] = 0.4f - 0.05f * t;
        int32_t *dids = gpu.ops->alloc(&gpu, (size_t)T * K * sizeof(int32_t));
        float *dwts = UPF(wts, T * K);
        gpu.ops->to_dev(&gpu, dids, ids, (size_t)T * K * sizeof(int32_t));
        float *hx = rand_vec((size_t)T * H, 1), *dx = UPF(hx, T * H);
        float *hy = poison_vec((size_t)T * H), *dy = UPF(hy, T * H);
        float *hact = poison_vec((size_t)T * K * I), *dact = UPF(hact, T * K * I);
        float *rg = UPF(hact, T * K * I), *ru = UPF(hact, T * K * I);
        float *rout = gpu.ops->alloc(&gpu, (size_t)T * K * H * sizeof(float));
        float *ry = UPF(hy, T * H);
        const sl_tensor *proto[3] = {&w[0][0].d, &w[0][1].d, &w[0][2].d};
        const sl_tensor *hproto[3] = {&w[0][0].h, &w[0][1].h, &w[0][2].h};
        r.cases++;
        if (!gpu.ops->moe_experts(&gpu, dy, dact, dx, dids, dwts, table, proto, T, K) && !r.bad++)
            snprintf(r.first_bad, sizeof r.first_bad, "moe_experts declined %s T=%d H=%d",
                     sl_dtype_name(dts[di / NS]), T, H);
        /* the GPU reference: per row i a T = 1 item of each batch, then weighted_sum */
        float *by[2 * MT * K];
        const float *bxs[2 * MT * K];
        const sl_tensor *bw[2 * MT * K];
        int32_t bT[2 * MT * K];
        for (int i = 0; i < T * K; i++) {
            bxs[i] = bxs[T * K + i] = dx + (size_t)(i / K) * H;
            by[i] = rg + (size_t)i * I, by[T * K + i] = ru + (size_t)i * I;
            bw[i] = &w[ids[i]][0].d, bw[T * K + i] = &w[ids[i]][1].d;
            bT[i] = bT[T * K + i] = 1;
        }
        gpu.ops->matmul_batch(&gpu, by, bxs, bw, bT, 2 * T * K);
        gpu.ops->swiglu(&gpu, rg, rg, ru, (size_t)T * K * I);
        for (int i = 0; i < T * K; i++)
            bxs[i] = rg + (size_t)i * I, by[i] = rout + (size_t)i * H, bw[i] = &w[ids[i]][2].d;
        gpu.ops->matmul_batch(&gpu, by, bxs, bw, bT, T * K);
        gpu.ops->weighted_sum(&gpu, ry, rout, NULL, dwts, T, K, H);
        float *gact = down(rg, (size_t)T * K * I), *gy = down(ry, (size_t)T * H);
        check(&r, "act vs batches", dact, gact, (size_t)T * K * I, 0);
        check(&r, "y vs batches", dy, gy, (size_t)T * H, 0);
        /* the CPU reference of the same op */
        cpu.ops->moe_experts(&cpu, hy, hact, hx, ids, wts, hrows, hproto, T, K);
        check(&r, "act vs cpu", dact, hact, (size_t)T * K * I, 1e-4);
        check(&r, "y vs cpu", dy, hy, (size_t)T * H, 1e-4);
        /* expert ids[0] out of the cache (a zero table row): the tokens that pick it keep their
         * y rows, the others get the same bits */
        static const sl_expert_ptrs none;
        gpu.ops->to_dev(&gpu, table + ids[0], &none, sizeof none);
        float *py = poison_vec((size_t)T * H), *dpy = UPF(py, T * H);
        gpu.ops->moe_experts(&gpu, dpy, dact, dx, dids, dwts, table, proto, T, K);
        float *gpy = down(dpy, (size_t)T * H), *gdy = down(dy, (size_t)T * H);
        for (int t = 0; t < T; t++) {
            const int skip = ids[t * K] == ids[0] || ids[t * K + 1] == ids[0];
            const float *want = (skip ? py : gdy) + (size_t)t * H;
            if (memcmp(gpy + (size_t)t * H, want, (size_t)H * sizeof(float)) && !r.bad++)
                snprintf(r.first_bad, sizeof r.first_bad, "moe_experts %s T=%d: token %d %s",
                         sl_dtype_name(dts[di / NS]), T, t,
                         skip ? "written through a zero row" : "differs");
        }
        free(py), free(gpy), free(gdy), dfree(dpy);
        free(gact), free(gy), free(hx), free(hy), free(hact);
        dfree(dx), dfree(dy), dfree(dact), dfree(rout), dfree(rg), dfree(ru), dfree(ry);
        dfree(dids), dfree(dwts), dfree(table);
        for (int e = 0; e < NE; e++)
            for (int j = 0; j < 3; j++)
                wpair_free(&w[e][j]);
    }
    op_end(&r);
}

/* ------------------------------------------ Q4 prefill on int8 tensor cores */

static uint8_t rand_byte(void) {
    return (uint8_t)((frand() + 1.0f) * 128.0f);
}

/* A Q4 weight [N, K] in groups of `group` columns with scales and biases of dtype sdt (BF16,
 * F16 or F32) on both sides: random codes; scales of 8 significant bits in [2^-8, 2^-3); biases
 * near -8 scale, as quantising makes them (bias + 8 scale, which multiplies X, stays small). */
static void wpair_q4(wpair *w, int64_t N, int64_t K, int32_t group, sl_dtype sdt) {
    memset(w, 0, sizeof *w);
    const size_t rb = sl_row_bytes(SL_DTYPE_Q4, K), nbytes = rb * (size_t)N;
    uint8_t *codes = malloc(nbytes + 1);
    for (size_t i = 0; i < nbytes; i++)
        codes[i] = rand_byte();
    const int64_t G = (K + group - 1) / group;
    const size_t ss = sdt == SL_DTYPE_F32 ? 4 : 2, sb = (size_t)(N * G) * ss;
    uint8_t *hs = malloc(sb + 4), *hb = malloc(sb + 4);
    for (int64_t i = 0; i < N * G; i++) {
        const float sc = ldexpf((float)(128 + (int)(fabsf(frand()) * 127.0f)) / 256.0f,
                                -3 - (int)(fabsf(frand()) * 5.0f));
        const float v[2] = {sc, -8.0f * sc * (1.0f + 0.25f * frand())};
        for (int j = 0; j < 2; j++) {
            uint8_t *p = (j ? hb : hs) + (size_t)i * ss;
            if (sdt == SL_DTYPE_F32) {
                memcpy(p, &v[j], 4);
            } else {
                const uint16_t h = sdt == SL_DTYPE_F16 ? sl_f32_to_f16(v[j]) : sl_f32_to_bf16(v[j]);
                memcpy(p, &h, 2);
            }
        }
    }
    w->hdata = codes;
    w->hs = (uint16_t *)hs, w->hb = (uint16_t *)hb;
    w->h = (sl_tensor){.name = "w",
                       .dtype = SL_DTYPE_Q4,
                       .ndim = 2,
                       .shape = {N, K},
                       .data = codes,
                       .nbytes = nbytes,
                       .scales = hs,
                       .biases = hb,
                       .group = group,
                       .sdtype = sdt};
    w->d = w->h;
    w->ddata_alloc = up(codes, nbytes);
    w->ds = up(hs, sb), w->db = up(hb, sb);
    w->d.data = w->ddata_alloc, w->d.scales = w->ds, w->d.biases = w->db;
}

/* y[T, N] of quant.h's int8 formula for w in double, over x quantised as the GPU does (m, d, xq
 * in float32) and X summed in double: what the int8 kernels compute but for their float
 * rounding. A token with a group whose sum is not finite: NaN. bias: N floats or NULL. */
static void ref_q4_int8(double *y, const float *x, const wpair *w, const float *bias, int32_t T) {
    const int64_t N = w->h.shape[0], K = w->h.shape[1], grp = w->h.group;
    const int64_t Gw = (K + grp - 1) / grp, G = K / 64;
    const size_t rb = sl_row_bytes(SL_DTYPE_Q4, K);
    const uint8_t *codes = w->hdata;
    int8_t *xq = malloc((size_t)K);
    double *dg = malloc((size_t)G * sizeof(double));
    for (int32_t t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * K;
        int bad = 0;
        for (int64_t g = 0; g < G; g++) {
            float m = 0.0f;
            double X = 0;
            for (int k = 0; k < 64; k++)
                m = fmaxf(m, fabsf(xt[g * 64 + k])), X += xt[g * 64 + k];
            const float inv = fminf(127.0f / m, FLT_MAX);
            for (int k = 0; k < 64; k++) { /* |v| <= 127, or not finite (bad: unused) */
                const float v = xt[g * 64 + k] * inv;
                xq[g * 64 + k] = isfinite(v) ? (int8_t)rintf(v) : 0;
            }
            dg[g] = m / 127.0f;
            bad |= !isfinite(X);
        }
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t gw = 0; gw < Gw; gw++) {
                const double sc = sl_qparam(w->h.scales, w->h.sdtype, (size_t)(n * Gw + gw));
                const double bz =
                    sl_qparam(w->h.biases, w->h.sdtype, (size_t)(n * Gw + gw)) + 8 * sc;
                for (int64_t k = gw * grp; k < SL_MIN(K, (gw + 1) * grp); k++) {
                    const int q = (codes[(size_t)n * rb + (size_t)k / 2] >> (k % 2 * 4)) & 15;
                    acc += sc * dg[k / 64] * (double)((q - 8) * xq[k]) + bz * xt[k];
                }
            }
            y[(size_t)t * N + n] = bad ? NAN : acc + (bias ? bias[n] : 0.0f);
        }
    }
    free(xq), free(dg);
}

/* Bitwise: the device buffers a and b of n floats (NaN payloads included). */
static void same_bits(op_report *r, const char *what, const float *a, const float *b, size_t n) {
    float *ha = down(a, n), *hb = down(b, n);
    r->cases++;
    if (memcmp(ha, hb, n * sizeof(float))) {
        size_t i = 0;
        while (i < n && !memcmp(ha + i, hb + i, sizeof(float)))
            i++;
        if (!r->bad++)
            snprintf(r->first_bad, sizeof r->first_bad, "%s: [%zu] %.9g vs %.9g", what, i, ha[i],
                     hb[i]);
    }
    free(ha), free(hb);
}

/*
 * Decode steps as graphs (cuda_backend.cu): attention with its q/k prep and a RoPE at successive
 * positions, their new rows staged from the host each step, run once op by op and once as a
 * graph step. A step that asks for the launches of the last recording replays it (the position
 * read from device memory, the staged rows from the same pinned addresses); one that differs
 * records (the attention's splits grow every 32 keys, its q/k prep leaves it past 4 splits).
 * Every step's outputs and the caches at the end: bitwise those of the ops one by one; and
 * most steps replayed. With and without a sliding window.
 */
static void test_graph_steps(void) {
    op_report r;
    op_begin(&r, "graph steps");
    const int nh = 32, nkv = 4, hd = 128, half = hd / 2, P0 = 20, P1 = 300;
    const size_t nq = (size_t)nh * hd, nk = (size_t)nkv * hd, ncache = (size_t)P1 * nk;
    float *ct = malloc((size_t)P1 * half * sizeof(float)),
          *st = malloc((size_t)P1 * half * sizeof(float));
    for (int i = 0; i < P1 * half; i++) {
        const float a = frand() * 3.14159f;
        ct[i] = cosf(a), st[i] = sinf(a);
    }
    float *dct = UPF(ct, (size_t)P1 * half), *dst = UPF(st, (size_t)P1 * half);
    wpair qn, kn;
    wpair_make(&qn, SL_DTYPE_BF16, 0, hd, 1.0f, 0);
    wpair_make(&kn, SL_DTYPE_F32, 0, hd, 1.0f, 0);
    for (int window = 0; window <= 100; window += 100) {
        float *kc = rand_vec(ncache, 1), *vc = rand_vec(ncache, 1);
        float *dq[2], *dk[2], *dv[2], *dkc[2], *dvc[2], *dout[2], *dx[2];
        for (int g = 0; g < 2; g++) {
            dq[g] = UPF(kc, nq), dk[g] = UPF(kc, nk), dv[g] = UPF(kc, nk), dx[g] = UPF(kc, nq);
            dkc[g] = UPF(kc, ncache), dvc[g] = UPF(vc, ncache), dout[g] = UPF(kc, nq);
        }
        int replayed = 0, recorded = 0, dropped = 0;
        for (int pos = P0; pos < P1; pos++) {
            float *q = rand_vec(nq, 2), *k = rand_vec(nk, 2), *v = rand_vec(nk, 1),
                  *x = rand_vec(nq, 1);
            for (int g = 0; g < 2; g++) {
                const sl_qkv_args pa = {.q = dq[g],
                                        .k = dk[g],
                                        .v = dv[g],
                                        .kc = dkc[g],
                                        .vc = dvc[g],
                                        .q_norm = &qn.d,
                                        .k_norm = &kn.d,
                                        .T = 1,
                                        .pos0 = pos,
                                        .n_heads = nh,
                                        .n_kv_heads = nkv,
                                        .head_dim = hd,
                                        .rot_dim = hd,
                                        .eps = 1e-6f,
                                        .cos_tab = dct,
                                        .sin_tab = dst};
                const sl_attn_args a = {.out = dout[g],
                                        .q = dq[g],
                                        .kcache = dkc[g],
                                        .vcache = dvc[g],
                                        .T = 1,
                                        .pos0 = pos,
                                        .n_heads = nh,
                                        .n_kv_heads = nkv,
                                        .head_dim = hd,
                                        .scale = 1.0f / sqrtf((float)hd),
                                        .prep = &pa,
                                        .window = window};
                for (int again = 0; again < 2; again++) {
                    if (g && !again) gpu.ops->graph_begin(&gpu);
                    gpu.ops->to_dev(&gpu, dq[g], q, nq * sizeof(float));
                    gpu.ops->to_dev(&gpu, dk[g], k, nk * sizeof(float));
                    gpu.ops->to_dev(&gpu, dv[g], v, nk * sizeof(float));
                    gpu.ops->to_dev(&gpu, dx[g], x, nq * sizeof(float));
                    gpu.ops->attention(&gpu, &a);
                    gpu.ops->rope(&gpu, dx[g], 1, nh, hd, hd, pos, dct, dst);
                    if (!g) break;
                    if (!again) {
                        const int rc = gpu.ops->graph_end(&gpu, 1);
                        replayed += rc == 2, recorded += rc == 1;
                        if (rc >= 0) break;
                        dropped++; /* nothing ran: the step again, op by op */
                    }
                }
            }
            char what[64];
            snprintf(what, sizeof what, "window %d, position %d: out", window, pos);
            same_bits(&r, what, dout[1], dout[0], nq);
            snprintf(what, sizeof what, "window %d, position %d: rope", window, pos);
            same_bits(&r, what, dx[1], dx[0], nq);
            free(q), free(k), free(v), free(x);
        }
        same_bits(&r, "k cache", dkc[1], dkc[0], ncache);
        same_bits(&r, "v cache", dvc[1], dvc[0], ncache);
        printf("  window %d: %d steps, %d replayed, %d recorded, %d dropped\n", window, P1 - P0,
               replayed, recorded, dropped);
        r.cases++;
        if (dropped || replayed < (P1 - P0) * 3 / 4) {
            if (!r.bad++)
                snprintf(r.first_bad, sizeof r.first_bad,
                         "window %d: %d of %d steps replayed, %d dropped", window, replayed,
                         P1 - P0, dropped);
        }
        for (int g = 0; g < 2; g++)
            dfree(dq[g]), dfree(dk[g]), dfree(dv[g]), dfree(dx[g]), dfree(dkc[g]), dfree(dvc[g]),
                dfree(dout[g]);
        free(kc), free(vc);
    }
    dfree(dct), dfree(dst), wpair_free(&qn), wpair_free(&kn);
    free(ct), free(st);
    op_end(&r);
}

/* The device buffer got against want (host, n values): NaN where want is NaN, POISON untouched
 * where want is POISON, else within tol of max(|want|, rms(want)). */
static void near(op_report *r, const char *what, const float *got, const double *want, size_t n,
                 double tol) {
    float *h = down(got, n);
    double ss = 0, worst = 0;
    size_t cnt = 0, wi = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i]) && want[i] != POISON) ss += want[i] * want[i], cnt++;
    const double rms = cnt ? sqrt(ss / (double)cnt) : 0;
    for (size_t i = 0; i < n && !bad; i++) {
        if (isnan(want[i]) || want[i] == POISON) {
            bad = isnan(want[i]) ? !isnan(h[i]) : h[i] != POISON;
            wi = i;
            continue;
        }
        const double e = isfinite(h[i])
                             ? fabs(h[i] - want[i]) / fmax(fmax(fabs(want[i]), rms), 1e-30)
                             : INFINITY;
        if (e > worst) worst = e, wi = i;
        bad = e > tol;
    }
    r->cases++;
    if (!bad && worst > r->max_err) r->max_err = worst;
    if (bad && !r->bad++)
        snprintf(r->first_bad, sizeof r->first_bad, "%s: [%zu] got %.9g want %.9g (err %.2e)", what,
                 wi, h[wi], want[wi], worst);
    free(h);
}

/*
 * Q4 prefill on int8 tensor cores (cuda_imma.cu), on a backend with int8 activations: the kernel
 * bitwise against its plain reference on every tile size and edge (T 5 .. 700, rows past a tile,
 * K from one group to past 4096, groups of 32, 64 and 128, BF16, F16 and F32 scales, biases, x
 * with tiny, zero and spiky groups and a non-finite token), poison-filled outputs; against a
 * double evaluation of quant.h's formula and the CPU's VNNI path (where this CPU has it) within
 * float rounding; batches (items of T = 0, 1, 7, 33, 300, x shared by pairs and triples)
 * bitwise against the reference and each item alone; a product and a batch larger than the
 * scratch (CU_SCRATCH_MIN: run in slices).
 */
static void test_imma(void) {
    op_report r;
    op_begin(&r, "Q4 prefill int8 TC");
    sl_backend cv; /* the CPU's int8 path, where it runs */
    sl_backend_cpu_init(&cv, 4, sl_cpu_best_isa());
    const int vnni = sl_quant_int8_available(&cv);
    static const sl_dtype sdts[] = {SL_DTYPE_BF16, SL_DTYPE_F16, SL_DTYPE_F32};
    /* N, K, T, group, scale dtype (index), bias (0 none, 1 F32, 2 BF16), special x */
    static const int cases[][7] = {
        {1, 64, 5, 64, 0, 0, 0},      {7, 128, 7, 32, 0, 1, 1},       {130, 256, 33, 64, 1, 2, 0},
        {200, 192, 64, 128, 2, 0, 1}, {128, 512, 65, 64, 0, 1, 0},    {257, 320, 127, 128, 0, 0, 1},
        {300, 768, 128, 32, 1, 0, 0}, {64, 1024, 129, 64, 2, 1, 1},   {260, 2048, 300, 64, 0, 0, 0},
        {33, 4160, 17, 64, 0, 0, 1},  {129, 4096, 513, 128, 1, 1, 0}, {96, 2048, 700, 32, 0, 2, 1},
        {1, 4096, 6, 64, 0, 0, 0},    {2050, 64, 9, 64, 2, 0, 1},     {33, 8192, 700, 64, 0, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], K = cases[ci][1], T = cases[ci][2], grp = cases[ci][3];
        const sl_dtype sdt = sdts[cases[ci][4]];
        const int bk = cases[ci][5], special = cases[ci][6];
        wpair w, b;
        wpair_q4(&w, N, K, grp, sdt);
        wpair_make(&b, bk == 2 ? SL_DTYPE_BF16 : SL_DTYPE_F32, 0, N, 0.5f, 0);
        float *bias = NULL;
        if (bk) {
            bias = malloc((size_t)N * sizeof(float));
            for (int n = 0; n < N; n++)
                bias[n] = bk == 2 ? sl_bf16_to_f32(((const uint16_t *)b.hdata)[n])
                                  : ((const float *)b.hdata)[n];
        }
        float *x = rand_vec((size_t)T * K, 1);
        if (special) /* token 0: group 0 tiny, the last zero; token 1 a spike; token 2 an Inf */
            for (int k = 0; k < K; k++) {
                x[k] *= k < 64 ? 1e-30f : k >= K - 64 && K > 64 ? 0.0f : 1.0f;
                if (k == K / 2 + 3) x[K + k] = 40.0f;
                if (k == 5 && T > 2) x[2 * (size_t)K + k] = INFINITY;
            }
        const size_t yn = (size_t)T * N + 5;
        float *p = poison_vec(yn), *dx = UPF(x, (size_t)T * K);
        float *dy = UPF(p, yn), *dr = UPF(p, yn);
        char what[96];
        snprintf(what, sizeof what, "N=%d K=%d T=%d group %d %s bias %d", N, K, T, grp,
                 sl_dtype_name(sdt), bk);
        const sl_tensor *bt = bk ? &b.d : NULL;
        r.cases++;
        if ((!sl_cuda_q4_prefill(&gpu, dy, dx, &w.d, bt, T, SL_CUDA_Q4_IMMA) ||
             !sl_cuda_q4_prefill(&gpu, dr, dx, &w.d, bt, T, SL_CUDA_Q4_IMMA_REF)) &&
            !r.bad++)
            snprintf(r.first_bad, sizeof r.first_bad, "%s: not taken", what);
        same_bits(&r, what, dy, dr, yn);
        double *want = malloc(yn * sizeof(double));
        ref_q4_int8(want, x, &w, bias, T);
        for (size_t i = (size_t)T * N; i < yn; i++)
            want[i] = POISON;
        near(&r, what, dy, want, yn, 1e-5);
        if (vnni && grp % 64 == 0) { /* the CPU takes int8 x at groups of 64 and 128 */
            float *yc = malloc(yn * sizeof(float));
            sl_matmul_quant_cpu_path(&cv, yc, x, &w.h, T, SL_QPATH_INT8);
            for (size_t i = 0; i < (size_t)T * N; i++)
                want[i] = (double)yc[i] + (bias ? bias[i % N] : 0.0f);
            near(&r, "vs cpu vnni", dy, want, yn, 1e-5);
            free(yc);
        }
        /* the same product through matmul (T > 4, int8 x on): the int8 kernel */
        float *dm = UPF(p, yn);
        gpu.ops->matmul(&gpu, dm, dx, &w.d, bt, T);
        same_bits(&r, "matmul", dm, dy, yn);
        free(want), free(x), free(p), free(bias), dfree(dx), dfree(dy), dfree(dr), dfree(dm);
        wpair_free(&w), wpair_free(&b);
    }
    /* batches: items of T 0 .. 300, the second half's x the first half's (gate and up); items of
     * one x (q/k/v) at groups of 32; items whose x outgrow the scratch together, and one alone */
    enum { NB = 10 };
    static const int bT[3][NB] = {{0, 1, 7, 33, 300, 0, 1, 7, 33, 300},
                                  {9, 9, 9, 70, 70, 70, 5, 5, 5, 5},
                                  {300, 300, 300, 300, 300, 300, 1000, 6, 0, 12}};
    static const int bK[3] = {512, 256, 4096}, bG[3] = {64, 32, 128};
    for (int bi = 0; bi < 3; bi++) {
        const int K = bK[bi];
        wpair w[NB];
        float *hx[NB], *dx[NB], *dy[NB], *dr[NB], *da[NB];
        const sl_tensor *wd[NB];
        int32_t Ts[NB];
        for (int i = 0; i < NB; i++) {
            const int N = 5 + 31 * i;
            Ts[i] = bT[bi][i];
            wpair_q4(&w[i], N, K, bG[bi], sdts[i % 3]);
            wd[i] = &w[i].d;
            /* shared x: batch 0 pairs i, i + 5; batch 1 runs of equal T */
            const int src = bi == 0 && i >= NB / 2               ? i - NB / 2
                            : bi == 1 && i && Ts[i] == Ts[i - 1] ? i - 1
                                                                 : -1;
            hx[i] = src >= 0 ? hx[src] : rand_vec((size_t)SL_MAX(Ts[i], 1) * K, 1);
            dx[i] = src >= 0 ? dx[src] : UPF(hx[i], (size_t)SL_MAX(Ts[i], 1) * K);
            const size_t yn = (size_t)Ts[i] * N + 5;
            float *p = poison_vec(yn);
            dy[i] = UPF(p, yn), dr[i] = UPF(p, yn), da[i] = UPF(p, yn);
            free(p);
        }
        r.cases++;
        if (!sl_cuda_q4_prefill_batch(&gpu, dy, (const float *const *)dx, wd, Ts, NB,
                                      SL_CUDA_Q4_IMMA) &&
            !r.bad++)
            snprintf(r.first_bad, sizeof r.first_bad, "batch %d not taken", bi);
        for (int i = 0; i < NB; i++) {
            const size_t yn = (size_t)Ts[i] * (size_t)w[i].h.shape[0] + 5;
            char what[64];
            snprintf(what, sizeof what, "batch %d item %d (T=%d)", bi, i, Ts[i]);
            if (Ts[i] > 0) {
                sl_cuda_q4_prefill(&gpu, dr[i], dx[i], wd[i], NULL, Ts[i], SL_CUDA_Q4_IMMA_REF);
                sl_cuda_q4_prefill(&gpu, da[i], dx[i], wd[i], NULL, Ts[i], SL_CUDA_Q4_IMMA);
            }
            same_bits(&r, what, dy[i], dr[i], yn); /* T = 0: both untouched */
            same_bits(&r, "batch vs alone", dy[i], da[i], yn);
        }
        /* matmul_batch on int8 x: the same bits (its T <= 4 items take the GEMVs) */
        float *dm[NB];
        for (int i = 0; i < NB; i++) {
            const size_t yn = (size_t)Ts[i] * (size_t)w[i].h.shape[0] + 5;
            float *p = poison_vec(yn);
            dm[i] = UPF(p, yn);
            free(p);
        }
        gpu.ops->matmul_batch(&gpu, dm, (const float *const *)dx, wd, Ts, NB);
        for (int i = 0; i < NB; i++)
            if (Ts[i] > 4)
                same_bits(&r, "matmul_batch", dm[i], dy[i],
                          (size_t)Ts[i] * (size_t)w[i].h.shape[0] + 5);
        for (int i = 0; i < NB; i++) {
            const int shared = bi == 0 ? i >= NB / 2 : bi == 1 && i && Ts[i] == Ts[i - 1];
            if (!shared) free(hx[i]), dfree(dx[i]);
            dfree(dy[i]), dfree(dr[i]), dfree(da[i]), dfree(dm[i]), wpair_free(&w[i]);
        }
    }
    sl_error err = {0}; /* a failed launch leaves poison that the bitwise checks cannot see */
    r.cases++;
    if (gpu.ops->status(&gpu, &err) != SL_OK && !r.bad++)
        snprintf(r.first_bad, sizeof r.first_bad, "backend status: %s", err.msg);
    op_end(&r);
}

/*
 * The default (a second GPU backend, without int4_float_act): Q4 decode products on int8-quantised
 * x against a double reference of quant.h's formula (x with tiny, zero and spiky groups), the op
 * table's products, the prefill kernel on int8 tensor cores (test_imma), then the batch and MoE
 * tests again: bitwise among the GPU's kernels, within the activations' rounding of the CPU.
 */
static void test_q4x(void) {
    sl_error err = {0};
    sl_backend gq;
    const int ok = sl_backend_cuda_init(&gq, 0, NULL, &err) == SL_OK;
    op_report r;
    op_begin(&r, "matmul Q4 on int8 x");
    if (!ok) {
        r.cases++, r.bad++;
        snprintf(r.first_bad, sizeof r.first_bad, "init: %s", err.msg);
        op_end(&r);
        return;
    }
    /* everything on gq, whose stream orders its copies and kernels */
    const sl_backend keep = gpu;
    gpu = gq;
    static const int shapes[][2] = {{5, 64}, {33, 128}, {130, 2048}, {17, 4096}, {96, 768}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int N = shapes[si][0], K = shapes[si][1], G = K / 64;
        wpair w;
        wpair_make(&w, SL_DTYPE_Q4, N, K, 0.5f, 0);
        const uint8_t *codes = w.hdata;
        const size_t rb = sl_row_bytes(SL_DTYPE_Q4, K);
        for (int T = 1; T <= 4; T++) {
            float *x = rand_vec((size_t)T * K, 1);
            for (int t = 0; t < T; t++) { /* group 0 tiny, the last zero (K > 64), one spike */
                for (int k = 0; k < 64; k++)
                    x[(size_t)t * K + k] *= 1e-30f;
                if (G > 1) memset(x + (size_t)t * K + K - 64, 0, 64 * sizeof(float));
                x[(size_t)t * K + K / 2 + 3] = 40.0f;
            }
            const size_t yn = (size_t)T * N + 5;
            float *ref = poison_vec(yn), *y = poison_vec(yn);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int g = 0; g < G; g++) {
                        const float *xg = x + (size_t)t * K + g * 64;
                        float m = 0, X = 0;
                        for (int k = 0; k < 64; k++)
                            m = fmaxf(m, fabsf(xg[k])), X += xg[k];
                        const float d = m / 127.0f, inv = fminf(127.0f / m, FLT_MAX);
                        long isum = 0;
                        for (int k = 0; k < 64; k++) {
                            const int kk = g * 64 + k;
                            const int q = (codes[(size_t)n * rb + kk / 2] >> (kk % 2 * 4)) & 15;
                            isum += (long)(q - 8) * (long)rintf(xg[k] * inv);
                        }
                        const double sc = sl_bf16_to_f32(w.hs[n * G + g]),
                                     bi = sl_bf16_to_f32(w.hb[n * G + g]);
                        acc += sc * (double)d * (double)isum + (bi + 8 * sc) * (double)X;
                    }
                    ref[(size_t)t * N + n] = (float)acc;
                }
            float *dx = UPF(x, (size_t)T * K), *dy = UPF(y, yn);
            gpu.ops->matmul(&gpu, dy, dx, &w.d, NULL, T);
            char what[64];
            snprintf(what, sizeof what, "N=%d K=%d T=%d", N, K, T);
            check(&r, what, dy, ref, yn, 1e-5);
            free(x), free(ref), free(y), dfree(dx), dfree(dy);
        }
        wpair_free(&w);
    }
    /* the op table's products again, Q4 within int8 x's rounding (prefill on int8 tensor cores) */
    const ops_table_params tp = {.q4_int8 = 1, .block_types = 1, .filter = "matmul", .log = stdout};
    const int table_failed = ops_table_run(&gq, &tp);
    r.cases++;
    if (table_failed && !r.bad++)
        snprintf(r.first_bad, sizeof r.first_bad, "op table on int8 x: %d cases failed",
                 table_failed);
    op_end(&r);
    test_imma();
    tol_floor = 5e-2, q4x_run = 1;
    test_matmul_batch();
    test_moe();
    gpu = keep, tol_floor = 0, q4x_run = 0;
    sl_backend_cuda_free(&gq);
}

/* test_cuda: the op table (tests/ops/) on the CUDA backend, then the checks of this file;
 * test_cuda bench [NAME]: the benchmarks alone (make bench CUDA=1), or those named. */
int main(int argc, char **argv) {
    const int bench_only = argc > 1 && !strcmp(argv[1], "bench");
    sl_error err = {0};
    /* The op tests compare with the scalar CPU's float order, so Q4 products take float x
     * (int4_float_act; test_q4x checks the int8 formula, the default, on a backend of its
     * own); the benchmarks run the defaults. */
    const sl_cuda_params float_act = {.int4_float_act = 1};
    if (sl_backend_cuda_init(&gpu, 0, bench_only ? NULL : &float_act, &err) != SL_OK) {
        fprintf(stderr, "test_cuda: %s\n", err.msg);
        return 1;
    }
    /* The scalar ISA: float order everywhere (Q4 never takes the int8 activation path). */
    sl_backend_cpu_init(&cpu, 4, SL_ISA_SCALAR);
    if (bench_only) {
        /* test_cuda bench [NAME]: those whose name holds NAME */
        const char *only = argc > 2 ? argv[2] : "";
        printf("CUDA op benchmarks on %s\n", sl_cuda_device_name(&gpu));
        if (strstr("matmul", only)) bench_matmul();
        if (strstr("layer", only)) bench_layer();
        if (strstr("attention", only)) bench_attention();
        if (strstr("attention_prompt", only)) bench_attention_prompt();
        if (strstr("imma", only)) bench_imma();
        sl_backend_cuda_free(&gpu);
        return 0;
    }
    printf("CUDA ops against the op table's references on %s\n", sl_cuda_device_name(&gpu));
    /* ggml block types run in the float order (cuda_blocks.cuh): checked as float products. */
    const ops_table_params tp = {.q4_int8 = 0, .block_types = 1, .log = stdout};
    const int table_failed = ops_table_run(&gpu, &tp);
    printf("op table: %d cases failed\n", table_failed);
    printf("CUDA ops vs CPU (scalar): bitwise contracts, fusions, int8 activations\n");
    test_fused_norms();
    test_norm_next();
    test_attention_prep();
    test_attention_tiled();
    test_matmul_batch();
    test_moe();
    test_q4x();
    test_graph_steps();
    printf("%d passed, %d failed\n", ops_passed, ops_failed);
    sl_backend_cuda_free(&gpu);
    return ops_failed || table_failed ? 1 : 0;
}
