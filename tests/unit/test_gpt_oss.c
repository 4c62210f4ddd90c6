/*
 * gpt-oss's parts (tests/fixtures/fam/gpt_oss_*, made by transformers): its experts in both
 * checkpoint layouts bitwise alike across store modes, cache sizes, chunkings and the device
 * path (linear biases through the GPU cache, the clamped SwiGLU off the fused kernels); a pack
 * keeping MXFP4; YaRN's tables; the config values it refuses.
 */
#include <sys/stat.h>

#include "model/model.h"
#include "model/packer.h"
#include "model/rope.h"
#include "test.h"

static const int32_t ids[] = {112, 47, 103, 110, 81, 102, 59, 47, 23, 18, 85, 36, 56};
#define N_IDS ((int32_t)(sizeof ids / sizeof ids[0]))

TEST(test_gpt_oss_modes_bitwise) {
    static const char *const cases[] = {"gpt_oss_a", "gpt_oss_mxfp4"};
    for (size_t c = 0; c < 2; c++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/fam/%s", test_fixtures, cases[c]);
        int32_t V = 0;
        const sl_model_params mp = {.n_threads = 2};
        float *base = test_logits(dir, &mp, ids, N_IDS, N_IDS, NULL, &V);
        CHECK(base != NULL);
        if (!base) continue;
        const size_t count = (size_t)N_IDS * (size_t)V;
        const int32_t k = 2, E = 4;
        struct {
            sl_experts_mode mode;
            int32_t slots, chunk;
            sl_backend_kind be;
            int32_t dev_slots;
        } v[] = {
            {SL_EXPERTS_RESIDENT, 0, 1, SL_BACKEND_CPU, 0},
            {SL_EXPERTS_STREAM, k, 3, SL_BACKEND_CPU, 0},
            {SL_EXPERTS_STREAM, E - 1, 1, SL_BACKEND_CPU, 0},
            {SL_EXPERTS_RESIDENT, 0, 1, SL_BACKEND_CPU_DEVICE, 0},
            {SL_EXPERTS_STREAM, k, 1, SL_BACKEND_CPU_DEVICE, k},
            {SL_EXPERTS_MAPPED, 0, 5, SL_BACKEND_CPU_DEVICE, k + 1},
        };
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            const sl_model_params vp = {.n_threads = 2,
                                        .experts = v[i].mode,
                                        .cache_experts = v[i].slots,
                                        .backend = v[i].be,
                                        .gpu_experts = v[i].dev_slots};
            sl_stats st;
            float *got = test_logits(dir, &vp, ids, N_IDS, v[i].chunk, &st, &V);
            CHECKF(got && memcmp(got, base, count * sizeof(float)) == 0, "%s variant %zu differs",
                   cases[c], i);
            if (v[i].mode == SL_EXPERTS_STREAM) CHECK(st.bytes_read > 0);
            free(got);
        }
        /* --quant keep: MXFP4 experts and their biases as they are, so the same bits */
        char out[600];
        snprintf(out, sizeof out, "%s/pack-%s", test_tmpdir(), cases[c]);
        const sl_pack_params pp = {.quant = SL_QUANT_KEEP};
        sl_error err = {0};
        CHECKF(sl_pack(dir, out, &pp, &err) == SL_OK, "%s", err.msg);
        /* its blobs' linear biases: streamed, and through the device cache */
        const sl_model_params pv[] = {
            mp,
            {.n_threads = 2, .experts = SL_EXPERTS_STREAM, .cache_experts = k},
            {.n_threads = 2,
             .experts = SL_EXPERTS_STREAM,
             .cache_experts = k + 1,
             .backend = SL_BACKEND_CPU_DEVICE,
             .gpu_experts = k},
        };
        for (size_t i = 0; i < sizeof pv / sizeof pv[0]; i++) {
            float *pk = test_logits(out, &pv[i], ids, N_IDS, i ? 1 : N_IDS, NULL, &V);
            CHECKF(pk && memcmp(pk, base, count * sizeof(float)) == 0,
                   "%s: the kept pack differs (variant %zu)", cases[c], i);
            free(pk);
        }
        free(base);
    }
}

/* YaRN as transformers' _compute_yarn_parameters gives it for gpt-oss's rope_parameters (head
 * dim 64): attention_factor 0.1 ln 32 + 1, the lowest dims' frequencies kept, the highest
 * divided by the factor, and the values numpy's float32 arithmetic gives in between. */
TEST(test_rope_yarn) {
    const char *cfg =
        "{\"model_type\": \"gpt_oss\", \"vocab_size\": 8, \"hidden_size\": 64, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 1, \"head_dim\": 64, "
        "\"num_local_experts\": 2, \"num_experts_per_tok\": 1, \"intermediate_size\": 32, "
        "\"max_position_embeddings\": 131072, \"layer_types\": [\"sliding_attention\", "
        "\"full_attention\"], \"sliding_window\": 128, \"rope_parameters\": {\"rope_type\": "
        "\"yarn\", \"rope_theta\": 150000.0, \"factor\": 32.0, \"beta_fast\": 32.0, "
        "\"beta_slow\": 1.0, \"original_max_position_embeddings\": 4096, \"truncate\": false}}";
    sl_config c;
    sl_error err = {0};
    CHECKF(sl_config_parse(&c, cfg, "config.json", &err) == SL_OK, "%s", err.msg);
    CHECK(c.rope.type == SL_ROPE_YARN &&
          fabs(c.rope.attention_factor - 1.3465735902799727) < 1e-12);
    CHECK(c.layer_is_sliding && c.layer_is_sliding[0] && !c.layer_is_sliding[1] &&
          c.sliding_window == 128);
    float inv[32];
    sl_rope_inv_freq(&c.rope, c.rope_theta, 64, inv);
    /* numpy's float32 of the same steps (the ramp runs over dims 8.09 .. 17.40: dim 8 is
     * kept, 20 and 31 interpolated) */
    static const float want[4][2] = {{0, 1.0f},
                                     {8, 0.050813280045986176f},
                                     {20, 1.818833698052913e-05f},
                                     {31, 3.023511396804679e-07f}};
    for (int i = 0; i < 4; i++) {
        const float w = want[i][1], g = inv[(int)want[i][0]];
        CHECKF(fabsf(g - w) <= 2e-6f * fabsf(w), "inv_freq[%d] %.9g, want %.9g", (int)want[i][0], g,
               w);
    }
    sl_config_free(&c);
    /* DeepSeek-V3's mscale and mscale_all_dim: their ratio (1 when equal) */
    const char *ds = "{\"model_type\": \"x\", \"vocab_size\": 8, \"hidden_size\": 64, "
                     "\"num_hidden_layers\": 1, \"num_attention_heads\": 1, "
                     "\"max_position_embeddings\": 163840, \"rope_scaling\": {\"type\": \"yarn\", "
                     "\"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 0.707, "
                     "\"original_max_position_embeddings\": 4096}}";
    CHECKF(sl_config_parse(&c, ds, "config.json", &err) == SL_OK, "%s", err.msg);
    const double m1 = 0.1 * log(40.0) + 1, m2 = 0.1 * 0.707 * log(40.0) + 1;
    CHECK(fabs(c.rope.attention_factor - m1 / m2) < 1e-12 && c.rope.truncate == 1 &&
          c.rope.beta_fast == 32 && c.rope.beta_slow == 1);
    sl_config_free(&c);
}

/* What gpt_oss refuses, with the key named. */
TEST(test_gpt_oss_config_errors) {
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {"\"swiglu_limit\": 5.0", "swiglu_limit"},
        {"\"quantization_config\": {\"quant_method\": \"fp8\"}", "quant_method 'fp8'"},
        {"\"mlp_only_layers\": [0]", "has no experts"},
        {"\"rope_parameters\": {\"rope_type\": \"longrope\"}", "'longrope' is not supported"},
        {"\"layer_types\": [\"sliding_attention\"]", "layer_types"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"model_type\": \"gpt_oss\", \"vocab_size\": 8, \"hidden_size\": 64, "
                 "\"num_hidden_layers\": 2, \"num_attention_heads\": 1, \"head_dim\": 64, "
                 "\"num_local_experts\": 2, \"num_experts_per_tok\": 1, "
                 "\"intermediate_size\": 32, \"sliding_window\": 4, %s}",
                 bad[i].extra);
        sl_config c;
        sl_error err = {0};
        CHECKF(sl_config_parse(&c, cfg, "config.json", &err) != SL_OK &&
                   strstr(err.msg, bad[i].want),
               "case %zu: %s", i, err.msg);
    }
}
