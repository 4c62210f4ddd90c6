/*
 * Kernels against plain double-precision references on odd sizes, outputs
 * pre-filled with a poison value so an unwritten element shows up.
 */
#include "core/common.h"
#include "kernels/ops.h"
#include "kernels/topk.h"
#include "test.h"

#define POISON 1234567.0f

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* A random [N, K] weight in the given dtype; returns the widened copy too. */
static void *make_weight(sl_tensor *t, sl_dtype dt, int64_t N, int64_t K, float *wide) {
    void *data = malloc((size_t)(N * K) * sl_dtype_size(dt));
    for (int64_t i = 0; i < N * K; i++) {
        float v = frand() * 0.5f;
        if (dt == SL_DTYPE_BF16) {
            uint16_t h = sl_f32_to_bf16(v);
            ((uint16_t *)data)[i] = h;
            wide[i] = sl_bf16_to_f32(h);
        } else if (dt == SL_DTYPE_F16) {
            uint16_t h = sl_f32_to_f16(v);
            ((uint16_t *)data)[i] = h;
            wide[i] = sl_f16_to_f32(h);
        } else {
            ((float *)data)[i] = v;
            wide[i] = v;
        }
    }
    *t = (sl_tensor){.name = "w",
                     .dtype = dt,
                     .ndim = 2,
                     .shape = {N, K},
                     .data = data,
                     .nbytes = (size_t)(N * K) * sl_dtype_size(dt)};
    return data;
}

TEST(test_half_conversions) {
    const float vals[] = {0.0f,           -0.0f,           1.0f, -2.5f, 65504.0f, 6.1035156e-05f,
                          5.9604645e-08f, 0.333251953125f, 1e-3f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        CHECKF(sl_f16_to_f32(sl_f32_to_f16(vals[i])) == vals[i] || vals[i] == 1e-3f, "%g", vals[i]);
        CHECK(sl_bf16_to_f32(sl_f32_to_bf16(vals[i])) - vals[i] <= fabsf(vals[i]) / 128);
    }
    CHECK(sl_f32_to_f16(1e6f) == 0x7c00);
    CHECK(isinf(sl_f16_to_f32(0x7c00)));
    CHECK(isnan(sl_f16_to_f32(0x7e00)));
    CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(NAN))));
    CHECK(sl_f32_to_bf16(1.00390625f) == 0x3f80); /* ties to even */
    CHECK(sl_f32_to_bf16(1.01171875f) == 0x3f82);
    for (uint32_t h = 0; h < 0x7c00; h++) /* every finite half round-trips */
        if (sl_f32_to_f16(sl_f16_to_f32((uint16_t)h)) != h) {
            CHECKF(0, "half 0x%04x", h);
            break;
        }
}

TEST(test_matmul_all_isas_and_dtypes) {
    const sl_dtype dts[] = {SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
    const int64_t shapes[][3] = {{1, 1, 1},  {37, 75, 1}, {37, 75, 5},  {16, 131, 4},
                                 {9, 16, 7}, {64, 33, 3}, {130, 257, 9}};
    for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++)
        for (size_t d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int64_t N = shapes[s][0], K = shapes[s][1], T = shapes[s][2];
                sl_backend be;
                sl_backend_cpu_init(&be, 2, (sl_isa)isa);
                float *wide = malloc((size_t)(N * K) * sizeof(float));
                float *x = malloc((size_t)(T * K) * sizeof(float));
                float *y = malloc((size_t)(T * N) * sizeof(float));
                float *y1 = malloc((size_t)N * sizeof(float));
                float bias_v[256];
                sl_tensor w,
                    bias = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias_v};
                void *wd = make_weight(&w, dts[d], N, K, wide);
                for (int64_t i = 0; i < T * K; i++)
                    x[i] = frand();
                for (int64_t i = 0; i < N; i++)
                    bias_v[i] = frand();
                for (int64_t i = 0; i < T * N; i++)
                    y[i] = POISON;
                sl_matmul_cpu(&be, y, x, &w, &bias, (int32_t)T);
                double worst = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = 0; n < N; n++) {
                        double ref = bias_v[n];
                        for (int64_t k = 0; k < K; k++)
                            ref += (double)wide[n * K + k] * (double)x[t * K + k];
                        worst = fmax(worst, fabs(y[t * N + n] - ref) / (1 + fabs(ref)));
                    }
                CHECKF(worst < 1e-5, "isa %s dtype %s %lldx%lldx%lld: error %g",
                       sl_isa_name(be.isa), sl_dtype_name(dts[d]), (long long)T, (long long)N,
                       (long long)K, worst);
                /* The same token alone gives the same bits as inside the batch. */
                sl_matmul_cpu(&be, y1, x + (T - 1) * K, &w, &bias, 1);
                CHECK(memcmp(y1, y + (T - 1) * N, (size_t)N * sizeof(float)) == 0);
                /* And so does one thread. */
                be.n_threads = 1;
                float *y2 = malloc((size_t)(T * N) * sizeof(float));
                sl_matmul_cpu(&be, y2, x, &w, &bias, (int32_t)T);
                CHECK(memcmp(y2, y, (size_t)(T * N) * sizeof(float)) == 0);
                free(y2);
                free(wd), free(wide), free(x), free(y), free(y1);
            }
}

TEST(test_rmsnorm_rope_swiglu) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    enum { R = 3, N = 21 };
    float x[R * N], y[R * N], w[N];
    for (int i = 0; i < R * N; i++)
        x[i] = frand() * 3;
    for (int i = 0; i < N; i++)
        w[i] = frand();
    sl_tensor wt = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {N}, .data = w};
    for (float off = 0; off <= 1; off += 1) {
        for (int i = 0; i < R * N; i++)
            y[i] = POISON;
        be.ops->rmsnorm(&be, y, x, &wt, R, N, 1e-6f, off);
        for (int r = 0; r < R; r++) {
            double ss = 0;
            for (int i = 0; i < N; i++)
                ss += (double)x[r * N + i] * x[r * N + i];
            double inv = 1 / sqrt(ss / N + 1e-6);
            for (int i = 0; i < N; i++)
                CHECK(fabs(y[r * N + i] - x[r * N + i] * inv * (off + w[i])) < 1e-5);
        }
    }
    /* RoPE: rotate-half on the first rot dims of each head, the rest untouched. */
    enum { T = 2, NH = 3, HD = 10, ROT = 6, POS0 = 5 };
    float q[T * NH * HD], q0[T * NH * HD], cs[16 * ROT / 2], sn[16 * ROT / 2];
    for (int p = 0; p < 16; p++)
        for (int i = 0; i < ROT / 2; i++) {
            double ang = p * pow(10000.0, -2.0 * i / ROT);
            cs[p * ROT / 2 + i] = (float)cos(ang);
            sn[p * ROT / 2 + i] = (float)sin(ang);
        }
    for (int i = 0; i < T * NH * HD; i++)
        q[i] = q0[i] = frand();
    be.ops->rope(&be, q, T, NH, HD, ROT, POS0, cs, sn);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *a = q0 + (t * NH + h) * HD, *b = q + (t * NH + h) * HD;
            for (int i = 0; i < ROT / 2; i++) {
                double ang = (POS0 + t) * pow(10000.0, -2.0 * i / ROT);
                CHECK(fabs(b[i] - (a[i] * cos(ang) - a[i + ROT / 2] * sin(ang))) < 1e-5);
                CHECK(fabs(b[i + ROT / 2] - (a[i + ROT / 2] * cos(ang) + a[i] * sin(ang))) < 1e-5);
            }
            for (int i = ROT; i < HD; i++)
                CHECK(b[i] == a[i]);
        }
    float g[7], u[7], o[7];
    for (int i = 0; i < 7; i++)
        g[i] = frand() * 4, u[i] = frand();
    be.ops->swiglu(&be, o, g, u, 7);
    for (int i = 0; i < 7; i++)
        CHECK(fabs(o[i] - g[i] / (1 + exp(-g[i])) * u[i]) < 1e-6);
}

/* The Gated DeltaNet ops: conv1d+SiLU with state, l2norm, the delta rule, the gated norm;
 * T tokens at once and one token at a time give the same bits. */
TEST(test_deltanet_ops) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    enum { T = 5, C = 7, K = 4, NK = 2, NV = 6, DK = 5, DV = 3 };
    /* conv */
    float x[T * C], w[C * K], y[T * C], y1[T * C], st[C * (K - 1)], st1[C * (K - 1)];
    for (int i = 0; i < T * C; i++)
        x[i] = frand() * 2, y[i] = y1[i] = POISON;
    for (int i = 0; i < C * K; i++)
        w[i] = frand();
    for (int i = 0; i < C * (K - 1); i++)
        st[i] = st1[i] = frand();
    sl_tensor wt = {.dtype = SL_DTYPE_F32, .ndim = 3, .shape = {C, 1, K}, .data = w};
    float hist[C * (K - 1)];
    memcpy(hist, st, sizeof hist);
    be.ops->conv1d_silu(&be, y, x, T, C, &wt, K, 1, st);
    for (int t = 0; t < T; t++)
        be.ops->conv1d_silu(&be, y1 + t * C, x + t * C, 1, C, &wt, K, 1, st1);
    CHECK(memcmp(y, y1, sizeof y) == 0 && memcmp(st, st1, sizeof st) == 0);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                const int src = t - (K - 1) + j; /* < 0: from the initial state */
                acc += (double)w[c * K + j] *
                       (src >= 0 ? x[src * C + c] : hist[c * (K - 1) + (K - 1) + src]);
            }
            CHECK(fabs(y[t * C + c] - acc / (1 + exp(-acc))) < 1e-5);
        }
    for (int c = 0; c < C; c++)
        for (int j = 0; j < K - 1; j++)
            CHECK(st[c * (K - 1) + j] == x[(T - (K - 1) + j) * C + c]);
    /* l2norm */
    float v[3 * 7];
    for (int i = 0; i < 21; i++)
        v[i] = frand();
    float v0[21];
    memcpy(v0, v, sizeof v);
    be.ops->l2norm(&be, v, 3, 7, 1e-6f);
    for (int r = 0; r < 3; r++) {
        double ss = 0;
        for (int i = 0; i < 7; i++)
            ss += (double)v0[r * 7 + i] * v0[r * 7 + i];
        for (int i = 0; i < 7; i++)
            CHECK(fabs(v[r * 7 + i] - v0[r * 7 + i] / sqrt(ss + 1e-6)) < 1e-6);
    }
    /* delta rule */
    float q[T * NK * DK], k[T * NK * DK], vv[T * NV * DV], a[T * NV], b[T * NV], Al[NV], dt[NV];
    float o[T * NV * DV], o1[T * NV * DV], S[NV * DK * DV] = {0}, S1[NV * DK * DV] = {0};
    for (int i = 0; i < T * NK * DK; i++)
        q[i] = frand(), k[i] = frand() * 0.4f;
    for (int i = 0; i < T * NV * DV; i++)
        vv[i] = frand(), o[i] = o1[i] = POISON;
    for (int i = 0; i < T * NV; i++)
        a[i] = frand() * 3, b[i] = frand() * 3;
    for (int i = 0; i < NV; i++)
        Al[i] = frand(), dt[i] = frand();
    sl_tensor At = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {NV}, .data = Al};
    sl_tensor dtt = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {NV}, .data = dt};
    sl_delta_args da = {.out = o,
                        .q = q,
                        .k = k,
                        .v = vv,
                        .a = a,
                        .b = b,
                        .A_log = &At,
                        .dt_bias = &dtt,
                        .state = S,
                        .T = T,
                        .nk = NK,
                        .nv = NV,
                        .dk = DK,
                        .dv = DV,
                        .q_scale = 0.45f};
    be.ops->delta_rule(&be, &da);
    for (int t = 0; t < T; t++) {
        sl_delta_args d1 = da;
        d1.out = o1 + t * NV * DV, d1.q = q + t * NK * DK, d1.k = k + t * NK * DK;
        d1.v = vv + t * NV * DV, d1.a = a + t * NV, d1.b = b + t * NV, d1.state = S1, d1.T = 1;
        be.ops->delta_rule(&be, &d1);
    }
    CHECK(memcmp(o, o1, sizeof o) == 0 && memcmp(S, S1, sizeof S) == 0);
    double R[NV][DK][DV] = {{{0}}};
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NV; h++) {
            const int kh = h / (NV / NK);
            const float *qt = q + (t * NK + kh) * DK, *kt = k + (t * NK + kh) * DK;
            const double xa = a[t * NV + h] + (double)dt[h];
            const double g = -exp(Al[h]) * log1p(exp(xa)), beta = 1 / (1 + exp(-b[t * NV + h]));
            double kv[DV] = {0};
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++)
                    R[h][i][j] *= exp(g), kv[j] += R[h][i][j] * kt[i];
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++)
                    R[h][i][j] += kt[i] * (vv[(t * NV + h) * DV + j] - kv[j]) * beta;
            for (int j = 0; j < DV; j++) {
                double acc = 0;
                for (int i = 0; i < DK; i++)
                    acc += R[h][i][j] * qt[i] * 0.45;
                CHECK(fabs(o[(t * NV + h) * DV + j] - acc) < 1e-5);
            }
        }
    /* gated norm: plain weight */
    float gx[2 * DV * 3], gz[2 * DV * 3], gy[2 * DV * 3], gw[DV * 3];
    for (int i = 0; i < 18; i++)
        gx[i] = frand() * 2, gz[i] = frand() * 3, gy[i] = POISON;
    for (int i = 0; i < 9; i++)
        gw[i] = frand();
    sl_tensor gwt = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {9}, .data = gw};
    be.ops->gated_rmsnorm(&be, gy, gx, gz, &gwt, 2, 9, 1e-6f, SL_ACT_SILU);
    for (int r = 0; r < 2; r++) {
        double ss = 0;
        for (int i = 0; i < 9; i++)
            ss += (double)gx[r * 9 + i] * gx[r * 9 + i];
        for (int i = 0; i < 9; i++) {
            const double z = gz[r * 9 + i];
            CHECK(fabs(gy[r * 9 + i] -
                       gw[i] * gx[r * 9 + i] / sqrt(ss / 9 + 1e-6) * z / (1 + exp(-z))) < 1e-5);
        }
    }
    float sy[5], sg[5], sy0[5];
    for (int i = 0; i < 5; i++)
        sy[i] = sy0[i] = frand(), sg[i] = frand() * 4;
    be.ops->sigmoid_mul(&be, sy, sg, 5);
    for (int i = 0; i < 5; i++)
        CHECK(fabs(sy[i] - sy0[i] / (1 + exp(-sg[i]))) < 1e-6);
}

TEST(test_attention_against_naive) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    enum { T = 3, POS0 = 4, NH = 4, NKV = 2, HD = 5, CTX = POS0 + T };
    float q[T * NH * HD], kc[CTX * NKV * HD], vc[CTX * NKV * HD], out[T * NH * HD];
    float scratch[2 * CTX];
    for (int i = 0; i < T * NH * HD; i++)
        q[i] = frand() * 2, out[i] = POISON;
    for (int i = 0; i < CTX * NKV * HD; i++)
        kc[i] = frand() * 2, vc[i] = frand();
    sl_attn_args a = {.out = out,
                      .q = q,
                      .kcache = kc,
                      .vcache = vc,
                      .T = T,
                      .pos0 = POS0,
                      .n_heads = NH,
                      .n_kv_heads = NKV,
                      .head_dim = HD,
                      .scale = 0.4472136f,
                      .scratch = scratch};
    be.ops->attention(&be, &a);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV), n = POS0 + t + 1;
            double s[CTX], mx = -1e30, sum = 0;
            for (int j = 0; j < n; j++) {
                s[j] = 0;
                for (int d = 0; d < HD; d++)
                    s[j] += (double)q[(t * NH + h) * HD + d] * kc[(j * NKV + kvh) * HD + d];
                s[j] *= 0.4472136;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < n; j++)
                sum += (s[j] = exp(s[j] - mx));
            for (int d = 0; d < HD; d++) {
                double o = 0;
                for (int j = 0; j < n; j++)
                    o += s[j] / sum * vc[(j * NKV + kvh) * HD + d];
                CHECK(fabs(out[(t * NH + h) * HD + d] - o) < 1e-5);
            }
        }
}

TEST(test_router_topk) {
    float probs[6], w[3];
    int32_t ids[3];
    const float logits[6] = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 2.0f};
    sl_router_topk(logits, 6, 3, 0, probs, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 1 && ids[2] == 2); /* ties go to the lower index */
    double sum = 0;
    for (int e = 0; e < 6; e++)
        sum += exp(logits[e] - 3.0);
    CHECK(fabs(w[0] - 1 / sum) < 1e-6 && fabs(w[1] - exp(-1.0) / sum) < 1e-6);
    sl_router_topk(logits, 6, 3, 1, probs, ids, w);
    CHECK(fabs(w[0] + w[1] + w[2] - 1) < 1e-6);
    CHECK(fabs(w[1] / w[0] - exp(-1.0)) < 1e-6);
    /* Large expert counts: no bitmask limit. */
    enum { E = 512 };
    float big[E], pb[E];
    for (int e = 0; e < E; e++)
        big[e] = (float)((e * 37) % E);
    int32_t id2[10];
    float w2[10];
    sl_router_topk(big, E, 10, 1, pb, id2, w2);
    for (int r = 0; r < 10; r++)
        CHECK(big[id2[r]] == (float)(E - 1 - r));
    /* NaN logits never produce an invalid id. */
    float nan_l[4] = {NAN, NAN, NAN, NAN};
    sl_router_topk(nan_l, 4, 2, 1, pb, id2, w2);
    CHECK(id2[0] >= 0 && id2[0] < 4 && id2[1] >= 0 && id2[1] < 4);
}

/* Qwen4-Exp ops against naive double-precision formulas. */
TEST(test_qwen4_ops) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    /* dilated conv: kernel 3, dilation 2, state of (K-1)*d = 4 inputs; T=1 steps agree */
    enum { T = 6, C = 5, K = 3, D = 2, S = (K - 1) * D };
    float x[T * C], w[C * K], y[T * C], y1[T * C], st[C * S], st1[C * S], hist[C * S];
    for (int i = 0; i < T * C; i++)
        x[i] = frand() * 2, y[i] = y1[i] = POISON;
    for (int i = 0; i < C * K; i++)
        w[i] = frand();
    for (int i = 0; i < C * S; i++)
        st[i] = st1[i] = hist[i] = frand();
    sl_tensor wt = {.dtype = SL_DTYPE_F32, .ndim = 3, .shape = {C, 1, K}, .data = w};
    be.ops->conv1d_silu(&be, y, x, T, C, &wt, K, D, st);
    for (int t = 0; t < T; t++)
        be.ops->conv1d_silu(&be, y1 + t * C, x + t * C, 1, C, &wt, K, D, st1);
    CHECK(memcmp(y, y1, sizeof y) == 0 && memcmp(st, st1, sizeof st) == 0);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                const int src = t - (K - 1 - j) * D; /* < 0: from the initial state */
                acc += (double)w[c * K + j] * (src >= 0 ? x[src * C + c] : hist[c * S + S + src]);
            }
            CHECK(fabs(y[t * C + c] - acc / (1 + exp(-acc))) < 1e-5);
        }
    /* sigmoid-gated norm */
    float gx[8], gz[8], gy[8], gw[4];
    for (int i = 0; i < 8; i++)
        gx[i] = frand() * 2, gz[i] = frand() * 3, gy[i] = POISON;
    for (int i = 0; i < 4; i++)
        gw[i] = frand();
    sl_tensor gwt = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {4}, .data = gw};
    be.ops->gated_rmsnorm(&be, gy, gx, gz, &gwt, 2, 4, 1e-6f, SL_ACT_SIGMOID);
    for (int r = 0; r < 2; r++) {
        double ss = 0;
        for (int i = 0; i < 4; i++)
            ss += (double)gx[r * 4 + i] * gx[r * 4 + i];
        for (int i = 0; i < 4; i++)
            CHECK(fabs(gy[r * 4 + i] - gw[i] * gx[r * 4 + i] / sqrt(ss / 4 + 1e-6) /
                                           (1 + exp(-gz[r * 4 + i]))) < 1e-5);
    }
    /* activate */
    float ax[7], ay[7];
    for (int i = 0; i < 7; i++)
        ax[i] = frand() * 6, ay[i] = POISON;
    be.ops->activate(&be, ay, ax, 7, 3.0f, 2.0f, SL_ACT_SIGMOID);
    for (int i = 0; i < 7; i++)
        CHECK(fabs(ay[i] - 2 / (1 + exp(-ax[i] / 3.0))) < 1e-6);
    be.ops->activate(&be, ay, ax, 7, 4.0f, 1.0f, SL_ACT_SILU);
    for (int i = 0; i < 7; i++)
        CHECK(fabs(ay[i] - ax[i] / 4.0 / (1 + exp(-ax[i] / 4.0))) < 1e-6);
    /* hc_mix and ple_gate: 2 tokens, 3 streams of 5 */
    enum { HT = 2, HC = 3, HN = 5 };
    float hw[HT * HC * HN], hx[HT * HC * HN], hv[HT * HN], hy[HT * HC * HN];
    for (int i = 0; i < HT * HC * HN; i++)
        hw[i] = frand(), hx[i] = frand() * 2, hy[i] = POISON;
    for (int i = 0; i < HT * HN; i++)
        hv[i] = frand();
    be.ops->hc_mix(&be, hy, hw, hx, HT, HC, HN);
    for (int t = 0; t < HT; t++)
        for (int i = 0; i < HN; i++) {
            double acc = 0;
            for (int c = 0; c < HC; c++)
                acc += (double)hw[(t * HC + c) * HN + i] * hx[(t * HC + c) * HN + i];
            CHECK(fabs(hy[t * HN + i] - acc / HC) < 1e-6);
        }
    be.ops->ple_gate(&be, hy, hw, hx, hv, HT, HC, HN);
    for (int t = 0; t < HT; t++)
        for (int c = 0; c < HC; c++) {
            double g = 0;
            for (int i = 0; i < HN; i++)
                g += (double)hw[(t * HC + c) * HN + i] * hx[(t * HC + c) * HN + i];
            g /= sqrt(HN);
            g = (g > 0 ? 1 : g < 0 ? -1 : 0) * sqrt(fmax(fabs(g), 1e-6));
            for (int i = 0; i < HN; i++)
                CHECK(fabs(hy[(t * HC + c) * HN + i] - hv[t * HN + i] / (1 + exp(-g))) < 1e-6);
        }
    /* qsa_scores: 3 heads, 4 blocks of 6 */
    float qq[3 * 6], kk[4 * 6], sc[4];
    for (int i = 0; i < 18; i++)
        qq[i] = frand();
    for (int i = 0; i < 24; i++)
        kk[i] = frand();
    be.ops->qsa_scores(&be, sc, qq, kk, 3, 4, 6);
    for (int b = 0; b < 4; b++) {
        double acc = 0;
        for (int h = 0; h < 3; h++) {
            double d = 0;
            for (int i = 0; i < 6; i++)
                d += (double)qq[h * 6 + i] * kk[b * 6 + i];
            acc += fmax(d, 0);
        }
        CHECK(fabs(sc[b] - acc / sqrt(6)) < 1e-6);
    }
}

/* Attention over a selection: every position listed is bitwise the dense result; a subset
 * equals dense attention over a cache holding only those rows. */
TEST(test_attention_selection) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    enum { T = 2, POS0 = 5, NH = 2, NKV = 1, HD = 4, CTX = POS0 + T, W = CTX };
    float q[T * NH * HD], kc[CTX * HD], vc[CTX * HD], dense[T * NH * HD], out[T * NH * HD];
    float scratch[2 * CTX];
    for (int i = 0; i < T * NH * HD; i++)
        q[i] = frand() * 2, dense[i] = out[i] = POISON;
    for (int i = 0; i < CTX * HD; i++)
        kc[i] = frand() * 2, vc[i] = frand();
    sl_attn_args a = {.out = dense,
                      .q = q,
                      .kcache = kc,
                      .vcache = vc,
                      .T = T,
                      .pos0 = POS0,
                      .n_heads = NH,
                      .n_kv_heads = NKV,
                      .head_dim = HD,
                      .scale = 0.5f,
                      .scratch = scratch};
    be.ops->attention(&be, &a);
    int32_t sel[T * W], nsel[T];
    for (int t = 0; t < T; t++) {
        nsel[t] = POS0 + t + 1;
        for (int j = 0; j < nsel[t]; j++)
            sel[t * W + j] = j;
    }
    a.out = out, a.sel = sel, a.n_sel = nsel, a.sel_stride = W;
    be.ops->attention(&be, &a);
    CHECK(memcmp(out, dense, sizeof out) == 0);
    /* positions {1, 3, 4, last}: the same as dense over a cache of just those rows */
    float kc2[4 * HD], vc2[4 * HD], out2[NH * HD], q2[NH * HD];
    const int pick[4] = {1, 3, 4, POS0};
    for (int i = 0; i < 4; i++) {
        memcpy(kc2 + i * HD, kc + pick[i] * HD, HD * sizeof(float));
        memcpy(vc2 + i * HD, vc + pick[i] * HD, HD * sizeof(float));
        sel[i] = pick[i];
    }
    nsel[0] = 4;
    a.T = 1, a.out = out;
    be.ops->attention(&be, &a);
    memcpy(q2, q, sizeof q2);
    sl_attn_args a2 = {.out = out2,
                       .q = q2,
                       .kcache = kc2,
                       .vcache = vc2,
                       .T = 1,
                       .pos0 = 3,
                       .n_heads = NH,
                       .n_kv_heads = NKV,
                       .head_dim = HD,
                       .scale = 0.5f,
                       .scratch = scratch};
    be.ops->attention(&be, &a2);
    CHECK(memcmp(out, out2, sizeof out2) == 0);
}
