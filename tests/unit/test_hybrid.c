/*
 * The hybrid families (Qwen3-Next, Qwen3.5-MoE) beyond parity: a bf16 pack
 * (3-D conv weights, 1-D A_log/dt_bias, the fused/separate DeltaNet projections,
 * the VLM prefix) gives the same bits as the checkpoint, streamed or not; the
 * recurrent state refuses to rewind and is cleared by reset.
 */
#include "model/model.h"
#include "test.h"

static const int32_t ids[] = {199, 84, 95, 75, 77, 172, 45, 117, 8, 87}; /* < every vocab */
#define N_IDS ((int32_t)(sizeof ids / sizeof ids[0]))

TEST(test_hybrid_pack_bitwise) {
    static const char *const cases[] = {"qwen3_next_a", "qwen3_next_b", "qwen3_5_moe_vlm"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char src[512], dst[600];
        snprintf(src, sizeof src, "%s/%s", test_fixtures, cases[c]);
        int32_t V = 0;
        sl_model_params mp = {.n_threads = 2};
        float *ref = test_logits(src, &mp, ids, N_IDS, N_IDS, NULL, &V);
        CHECK(ref != NULL);
        for (int q = SL_QUANT_BF16; ref && q <= SL_QUANT_INT8; q++) {
            snprintf(dst, sizeof dst, "%s/hybrid-%s-%d", test_tmpdir(), cases[c], q);
            sl_pack_params pp = {.quant = (sl_quant)q};
            sl_error err = {0};
            CHECKF(sl_pack(src, dst, &pp, &err) == SL_OK, "%s: %s", cases[c], err.msg);
            mp.experts = SL_EXPERTS_STREAM;
            mp.cache_experts = 3;
            float *got = test_logits(dst, &mp, ids, N_IDS, 3, NULL, &V);
            CHECK(got != NULL);
            if (got && q == SL_QUANT_BF16)
                CHECKF(memcmp(got, ref, (size_t)N_IDS * (size_t)V * sizeof(float)) == 0,
                       "%s: bf16 pack differs from the checkpoint", cases[c]);
            if (got && q == SL_QUANT_INT8) {
                /* Loose: int8 flips a few top-k choices of these random routers, and a flip
                 * moves a whole row (the per-row error is ~1e-2 elsewhere). */
                const double e = test_rel_l2(got, ref, (size_t)N_IDS * (size_t)V);
                CHECKF(e <= 0.15, "%s: int8 rel L2 %g", cases[c], e);
            }
            free(got);
            mp = (sl_model_params){.n_threads = 2};
        }
        free(ref);
    }
}

TEST(test_hybrid_rewind_and_reset) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_next_a", test_fixtures);
    sl_model_params mp = {.n_threads = 1};
    sl_model *m = NULL;
    sl_session *s = NULL;
    sl_error err = {0};
    CHECK(sl_model_load(dir, &mp, &m, &err) == SL_OK);
    sl_session_params sp = {.max_ctx = 32};
    CHECK(m && sl_session_create(m, &sp, &s, &err) == SL_OK);
    if (!s) {
        sl_model_free(m);
        return;
    }
    const size_t V = (size_t)m->cfg.vocab_size;
    float *a = malloc(V * sizeof(float)), *b = malloc(V * sizeof(float));
    CHECK(sl_session_forward(s, ids, 4, a, 0, &err) == SL_OK);
    CHECK(sl_session_rewind(s, 2) != 0); /* recurrent state: refused, nothing changes */
    CHECK(sl_session_pos(s) == 4);
    CHECK(sl_session_rewind(s, 4) == 0);
    /* Reset clears the recurrent state too: the same prompt gives the same bits. */
    sl_session_forward(s, ids + 4, 3, b, 0, &err);
    sl_session_reset(s);
    CHECK(sl_session_forward(s, ids, 4, b, 0, &err) == SL_OK);
    CHECK(memcmp(a, b, V * sizeof(float)) == 0);
    free(a);
    free(b);
    sl_session_free(s);
    sl_model_free(m);

    /* Models without linear attention still rewind. */
    snprintf(dir, sizeof dir, "%s/qwen3_gqa_untied", test_fixtures);
    CHECK(sl_model_load(dir, &mp, &m, &err) == SL_OK);
    CHECK(m && sl_session_create(m, &sp, &s, &err) == SL_OK);
    if (s) {
        CHECK(sl_session_forward(s, ids, 4, NULL, 0, &err) == SL_OK);
        CHECK(sl_session_rewind(s, 2) == 0);
        CHECK(sl_session_pos(s) == 2);
    }
    sl_session_free(s);
    sl_model_free(m);
}
