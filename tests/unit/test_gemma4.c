/* Gemma 4's config keys: what transformers derives from them, and clear refusals. */
#include "families/gemma4/gemma4.h"
#include "test.h"

/* A gemma4_text config: base's keys (4 layers, H 32, 4 heads of 8, 2 KV heads), then more's. */
static sl_status parse(sl_config *c, const char *more, sl_error *err) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model_type\":\"gemma4_text\",\"vocab_size\":64,\"hidden_size\":32,"
             "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"head_dim\":8,\"intermediate_size\":16%s%s}",
             more[0] ? "," : "", more);
    return sl_config_parse(c, text, "config.json", err);
}

TEST(test_gemma4_config) {
    sl_config c;
    sl_error err = {0};
    /* Gemma4TextConfig's defaults: every sixth layer full (and always the last), global head dim
     * 512 there, proportional RoPE on a quarter of it, per-layer inputs of 256, dense */
    CHECKF(parse(&c, "", &err) == SL_OK, "%s", err.msg);
    const g4_config *g = c.fam;
    CHECK(g->layers[0].kind == G4_SLIDING && g->layers[3].kind == G4_FULL);
    CHECK(g->kind[G4_SLIDING].head_dim == 8 && g->kind[G4_SLIDING].rope_angles == 4 &&
          g->kind[G4_SLIDING].theta == 1e4);
    CHECK(g->kind[G4_FULL].head_dim == 512 && g->kind[G4_FULL].n_kv_heads == 2 &&
          g->kind[G4_FULL].rope_angles == 64 && g->kind[G4_FULL].theta == 1e6);
    CHECK(g->sliding_window == 512 && g->ple_dim == 256 && !g->moe && c.n_experts == 0);
    CHECK(c.expert_glu == SL_GLU_GELU_TANH && c.logit_softcap == 0 && g->max_q == 4 * 512);
    sl_config_free(&c);

    /* The MoE checkpoints' keys: keys as values with global KV heads, top_k_experts,
     * soft-capping, KV sharing (its source: the last earlier layer of the kind) */
    CHECKF(parse(&c,
                 "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                 "\"full_attention\"],\"global_head_dim\":16,\"num_global_key_value_heads\":1,"
                 "\"attention_k_eq_v\":true,\"enable_moe_block\":true,\"num_experts\":8,"
                 "\"top_k_experts\":2,\"moe_intermediate_size\":8,\"final_logit_softcapping\":30.0,"
                 "\"num_kv_shared_layers\":2,\"use_double_wide_mlp\":true,\"sliding_window\":7,"
                 "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\","
                 "\"rope_theta\":10000.0},\"full_attention\":{\"rope_type\":\"proportional\","
                 "\"partial_rotary_factor\":0.5,\"rope_theta\":1000000.0,\"factor\":8.0}}",
                 &err) == SL_OK,
           "%s", err.msg);
    g = c.fam;
    CHECK(g->kind[G4_FULL].head_dim == 16 && g->kind[G4_FULL].n_kv_heads == 1 &&
          g->kind[G4_FULL].no_v && !g->kind[G4_SLIDING].no_v);
    CHECK(g->kind[G4_FULL].rope_angles == 4 && g->kind[G4_FULL].factor == 8.0);
    CHECK(g->moe && c.n_experts == 8 && c.n_experts_used == 2 && c.norm_topk_prob &&
          c.layer_is_moe[0] && c.layer_is_moe[3] && c.logit_softcap == 30.0f);
    CHECK(g->layers[1].kv_src == 1 && g->layers[2].kv_src == 0 && g->layers[3].kv_src == 1);
    CHECK(!g->layers[1].double_wide && g->layers[2].double_wide && g->sliding_window == 7);
    sl_config_free(&c);

    /* per_layer_config, as transformers 5.17 saves it */
    CHECKF(parse(&c,
                 "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                 "\"full_attention\"],\"per_layer_config\":{\"01\":{\"head_dim\":32},\"3\":{"
                 "\"head_dim\":32,\"num_key_value_heads\":2}},\"hidden_size_per_layer_input\":0",
                 &err) == SL_OK,
           "%s", err.msg);
    g = c.fam;
    CHECK(g->kind[G4_FULL].head_dim == 32 && g->kind[G4_FULL].rope_angles == 4 && !g->ple_dim);
    sl_config_free(&c);

    struct {
        const char *more, *needle;
    } bad[] = {
        {"\"hidden_activation\":\"gelu\"", "hidden_activation"},
        {"\"use_bidirectional_attention\":\"all\"", "use_bidirectional_attention"},
        {"\"attention_bias\":true", "attention_bias"},
        {"\"layer_types\":[\"sliding_attention\",\"x\",\"full_attention\",\"full_attention\"]",
         "layer_types[1]"},
        {"\"per_layer_config\":{\"3\":{\"intermediate_size\":8}}", "intermediate_size"},
        {"\"per_layer_config\":{\"9\":{\"head_dim\":8}}", "per_layer_config['9']"},
        /* two full layers of different head dims: one RoPE table per kind in transformers */
        {"\"layer_types\":[\"full_attention\",\"sliding_attention\",\"sliding_attention\","
         "\"full_attention\"],\"per_layer_config\":{\"3\":{\"head_dim\":16}}",
         "layer 3"},
        {"\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"yarn\"},"
         "\"full_attention\":{\"rope_type\":\"default\"}}",
         "rope_type 'yarn'"},
        {"\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10.0}",
         "rope_parameters.sliding_attention"},
        /* the last full layer shares, but no full layer comes before the shared ones */
        {"\"num_kv_shared_layers\":1", "shares the K/V"},
        {"\"enable_moe_block\":true", "num_experts"},
        {"\"vocab_size_per_layer_input\":32", "vocab_size_per_layer_input"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (sl_error){0};
        const sl_status st = parse(&c, bad[i].more, &err);
        CHECKF(st != SL_OK && strstr(err.msg, bad[i].needle) && strstr(err.msg, "config.json"),
               "case %zu: '%s'", i, err.msg);
        if (!st) sl_config_free(&c);
    }
}

/* The gemma4_a fixture (transformers 5.17: sliding window 16, per-layer inputs, soft-capping,
 * GELU-tanh experts): its 40-token prompt within 1e-4 of transformers' logits, and the same bits
 * with the experts streamed, and on the device path (CPU_DEVICE: weights in backend memory,
 * experts through the device cache), in chunks. */
TEST(test_gemma4_fixture) {
    char dir[512], path[600], buf[4096] = {0};
    snprintf(dir, sizeof dir, "%s/fam/gemma4_a", test_fixtures);
    enum { N = 40, V = 128 };
    int32_t ids[N], vocab = 0;
    snprintf(path, sizeof path, "%s/ref.json", dir);
    FILE *f = fopen(path, "r");
    const size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    const char *p = strstr(buf, "\"ids\": [");
    CHECK(len > 0 && p);
    if (!p) return;
    p += 8;
    for (int32_t i = 0; i < N; i++) {
        char *end;
        ids[i] = (int32_t)strtol(p, &end, 10);
        p = end + strspn(end, ", \n");
    }
    float *want = malloc(N * V * sizeof(float));
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    f = fopen(path, "rb");
    CHECK(f && fread(want, sizeof(float), N * V, f) == N * V);
    if (f) fclose(f);
    sl_model_params mp = {.n_threads = 2};
    float *base = test_logits(dir, &mp, ids, N, N, NULL, &vocab);
    CHECK(base && vocab == V);
    if (base) CHECKF(test_rel_l2(base, want, N * V) <= 1e-4, "%g", test_rel_l2(base, want, N * V));
    free(want);
    if (!base) return;
    struct {
        sl_experts_mode mode;
        int32_t slots, chunk;
        sl_backend_kind be;
        int32_t dev_slots;
    } v[] = {
        {SL_EXPERTS_STREAM, 2, 7, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_MAPPED, 0, 1, SL_BACKEND_CPU_DEVICE, 0},
        {SL_EXPERTS_STREAM, 2, 3, SL_BACKEND_CPU_DEVICE, 2},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        sl_model_params vp = {.n_threads = 2,
                              .experts = v[i].mode,
                              .cache_experts = v[i].slots,
                              .backend = v[i].be,
                              .gpu_experts = v[i].dev_slots};
        float *got = test_logits(dir, &vp, ids, N, v[i].chunk, NULL, &vocab);
        CHECKF(got && memcmp(got, base, (size_t)N * V * sizeof(float)) == 0,
               "variant %zu differs from mapped", i);
        free(got);
    }
    free(base);
}
