/*
 * Hugging Face's block-wise FP8 (F8_E4M3 with F32 block scales): the e4m3fn decode of all 256
 * codes against its definition, the encoder, and the CPU kernel on every ISA against the F32
 * matmul of the dequantised matrix: the same bits (cpu_fp8.c's contract). The op table checks
 * the products against double references (matmul, matmul_batch, embed, moe_experts).
 */
#include "kernels/blocks.h"
#include "model/model.h"
#include "test.h"

TEST(test_fp8_decode_all_codes) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = sl_fp8_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            CHECKF(isnan(v), "code 0x%02x: %g, want NaN", b, v);
            continue;
        }
        double want = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
        if (b & 0x80) want = -want;
        CHECKF(v == (float)want && !!signbit(v) == (b >> 7), "code 0x%02x: %g want %g", b, v, want);
        /* every finite code encodes back to itself (0x80, -0, included) */
        CHECKF(sl_f32_to_fp8_e4m3(v) == b, "code 0x%02x encodes as 0x%02x", b,
               sl_f32_to_fp8_e4m3(v));
    }
    CHECK(sl_fp8_e4m3_to_f32(0x7e) == 448.0f && sl_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    CHECK(sl_f32_to_fp8_e4m3(1000.0f) == 0x7e && sl_f32_to_fp8_e4m3(-1000.0f) == 0xfe);
    CHECK(sl_f32_to_fp8_e4m3(1.0625f) == 0x38);  /* halfway 1 and 1.125: ties to even */
    CHECK(sl_f32_to_fp8_e4m3(1.1875f) == 0x3a);  /* halfway 1.125 and 1.25: to the even 1.25 */
    CHECK(sl_f32_to_fp8_e4m3(0x1p-11f) == 0x00); /* below half the smallest subnormal */
}

/* An FP8 matrix of N rows (a view at row phase ph of a taller one) with blocks br x bc, against
 * its F32 twin: equal bits on each ISA, for T = 1 .. 5 and a long T. */
static void check_twin(int64_t N, int64_t K, int32_t br, int32_t bc, int32_t ph) {
    const int64_t all = N + ph, nrb = (all + br - 1) / br, ncb = (K + bc - 1) / bc;
    uint8_t *q = malloc((size_t)(all * K));
    float *sc = malloc((size_t)(nrb * ncb) * sizeof(float));
    uint32_t s = 12345;
    for (int64_t i = 0; i < all * K; i++) {
        s = s * 1664525u + 1013904223u;
        q[i] = (uint8_t)(s >> 24);
        if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1; /* no NaN: the sums must stay comparable */
    }
    for (int64_t i = 0; i < nrb * ncb; i++)
        sc[i] = 0.001f * (float)(1 + i % 7) + 1e-5f * (float)i;
    const sl_tensor full = {.name = "w",
                            .dtype = SL_DTYPE_F8_E4M3,
                            .ndim = 2,
                            .shape = {all, K},
                            .data = q,
                            .nbytes = (size_t)(all * K),
                            .scales = (const uint16_t *)sc,
                            .group = bc,
                            .brows = br,
                            .sdtype = SL_DTYPE_F32};
    const sl_tensor w = sl_fp8_rows(&full, ph, N);
    float *wf = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        sl_dequant_fp8_row(&w, n, wf + n * K);
    const sl_tensor twin = {.name = "twin",
                            .dtype = SL_DTYPE_F32,
                            .ndim = 2,
                            .shape = {N, K},
                            .data = wf,
                            .nbytes = (size_t)(N * K) * 4};
    enum { TMAX = 9 };
    float *x = malloc((size_t)(TMAX * K) * sizeof(float));
    for (int64_t i = 0; i < TMAX * K; i++)
        x[i] = (float)((int)(i * 37 % 101) - 50) / 25.0f;
    float *y = malloc((size_t)(TMAX * N) * sizeof(float)),
          *yt = malloc((size_t)(TMAX * N) * sizeof(float));
    for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
        sl_backend be;
        sl_backend_cpu_init(&be, 2, (sl_isa)isa);
        const int32_t Ts[] = {1, 2, 3, 5, TMAX};
        for (int i = 0; i < 5; i++) {
            const int32_t T = Ts[i];
            sl_matmul_cpu(&be, y, x, &w, NULL, T);
            /* where the SIMD path needs whole vectors per block the kernel runs the scalar
             * order: compare with the twin on that ISA */
            sl_backend bt = be;
            if ((isa == SL_ISA_AVX512 && bc % 16) || (isa == SL_ISA_AVX2 && bc % 8))
                bt.isa = SL_ISA_SCALAR;
            sl_matmul_cpu(&bt, yt, x, &twin, NULL, T);
            CHECKF(memcmp(y, yt, (size_t)(T * N) * sizeof(float)) == 0,
                   "N %lld K %lld blocks %dx%d phase %d isa %s T %d: not the twin's bits",
                   (long long)N, (long long)K, br, bc, ph, sl_isa_name(be.isa), T);
            for (int64_t n = 0; n < N && isa == SL_ISA_SCALAR; n++)
                CHECK(y[n] == sl_dot_fp8_ref(&w, n, x));
        }
    }
    free(q), free(sc), free(wf), free(x), free(y), free(yt);
}

TEST(test_fp8_matmul_twin_bits) {
    check_twin(130, 257, 128, 128, 0);
    check_twin(37, 75, 128, 128, 0);
    check_twin(200, 200, 128, 128, 60); /* a view from mid-block */
    check_twin(33, 96, 16, 32, 5);
    check_twin(20, 72, 4, 24, 3); /* AVX-512 falls back to the scalar order */
    check_twin(7, 1, 128, 128, 0);
}

/* The FP8 fixture through every expert mode on the CPU and on the device path (CPU_DEVICE:
 * weights and the experts' block scales copied into backend memory, experts through the device
 * cache): the mapped bits every time. */
TEST(test_fp8_modes_same_bits) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fp8_qwen3", test_fixtures);
    const int32_t ids[] = {3, 17, 101, 44, 9, 127, 0, 64, 33, 5};
    const int32_t n = (int32_t)(sizeof ids / sizeof ids[0]), k = 2, E = 4;
    int32_t V = 0;
    sl_model_params mp = {.n_threads = 2};
    float *base = test_logits(dir, &mp, ids, n, n, NULL, &V);
    CHECK(base != NULL);
    if (!base) return;
    struct {
        sl_experts_mode mode;
        int32_t slots, chunk;
        sl_backend_kind be;
        int32_t dev_slots;
    } v[] = {
        {SL_EXPERTS_RESIDENT, 0, n, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_STREAM, k, 1, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_STREAM, E - 1, 3, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_MAPPED, 0, 1, SL_BACKEND_CPU_DEVICE, 0},
        {SL_EXPERTS_RESIDENT, 0, n, SL_BACKEND_CPU_DEVICE, 0},
        {SL_EXPERTS_STREAM, k, 1, SL_BACKEND_CPU_DEVICE, k},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        sl_model_params vp = {.n_threads = 2,
                              .experts = v[i].mode,
                              .cache_experts = v[i].slots,
                              .backend = v[i].be,
                              .gpu_experts = v[i].dev_slots};
        sl_stats st;
        float *got = test_logits(dir, &vp, ids, n, v[i].chunk, &st, &V);
        CHECKF(got && memcmp(got, base, (size_t)n * (size_t)V * sizeof(float)) == 0,
               "variant %zu differs from mapped", i);
        if (v[i].mode == SL_EXPERTS_STREAM) CHECK(st.bytes_read > 0);
        free(got);
    }
    free(base);
}
