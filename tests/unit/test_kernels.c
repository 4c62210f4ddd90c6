/*
 * Kernel contracts the op table (tests/ops/ops_table.c, every op against its reference) does not
 * cover: half conversions, matmul's bits independent of the batch and the thread count, the
 * router's ties, the DeltaNet ops token by token, attention over a selection.
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
        /* every value but the last is a half: exact; 1e-3 within half a half's ulp (2^-11
         * relative, 2^-8 for bf16) */
        const float v = vals[i], h = sl_f16_to_f32(sl_f32_to_f16(v));
        const float b = sl_bf16_to_f32(sl_f32_to_bf16(v));
        CHECKF(i + 1 < sizeof vals / sizeof vals[0] ? h == v : fabsf(h - v) <= fabsf(v) * 0x1p-11f,
               "f16 %g -> %g", v, h);
        CHECKF(fabsf(b - v) <= fabsf(v) * 0x1p-8f, "bf16 %g -> %g", v, b);
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

/* The op table (tests/ops/) checks every op against its reference; what stays here are the
 * contracts it does not: the DeltaNet ops give the same bits for T tokens at once as for one
 * token at a time (conv1d_silu with its state, plain and dilated; delta_rule). */
TEST(test_deltanet_token_by_token) {
    sl_backend be;
    sl_backend_cpu_init(&be, 2, SL_ISA_AVX512);
    enum { T = 6, C = 7, K = 4, NK = 2, NV = 6, DK = 5, DV = 3 };
    for (int dil = 1; dil <= 2; dil++) {
        const int S = (K - 1) * dil;
        float x[T * C], w[C * K], y[T * C], y1[T * C], st[C * 3 * 2], st1[C * 3 * 2];
        for (int i = 0; i < T * C; i++)
            x[i] = frand() * 2, y[i] = y1[i] = POISON;
        for (int i = 0; i < C * K; i++)
            w[i] = frand();
        for (int i = 0; i < C * S; i++)
            st[i] = st1[i] = frand();
        sl_tensor wt = {.dtype = SL_DTYPE_F32, .ndim = 3, .shape = {C, 1, K}, .data = w};
        be.ops->conv1d_silu(&be, y, x, T, C, &wt, K, dil, st);
        for (int t = 0; t < T; t++)
            be.ops->conv1d_silu(&be, y1 + t * C, x + t * C, 1, C, &wt, K, dil, st1);
        CHECKF(memcmp(y, y1, sizeof y) == 0 && memcmp(st, st1, (size_t)C * S * 4) == 0,
               "conv1d_silu, dilation %d", dil);
    }
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
