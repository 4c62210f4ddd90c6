/*
 * The router rules (sl_route_cfg) and the MoE step around them: hand-worked cases of each
 * rule (ties to the lower id, groups, the order of renormalising and scaling), a MoE layer
 * against a plain per-token reference (weights on the experts' inputs, an ungated shared
 * expert), and the same bits through every expert mode, cache and chunking. The op against a
 * double reference on both backends is tests/ops/ops_table.c's moe_route.
 */
#include <math.h>

#include "kernels/topk.h"
#include "model/blocks.h"
#include "test.h"

static int near(double a, double b) {
    return fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b));
}

static double sig(double x) {
    return 1 / (1 + exp(-x));
}

TEST(test_route_rules_by_hand) {
    const float l0[6] = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 2.0f};
    float l[8], w[4];
    int32_t ids[4];
    /* top-k of the logits, softmax over those k; ties to the lower id */
    sl_route_cfg cfg = {.score = SL_ROUTE_TOPK_SOFTMAX};
    memcpy(l, l0, sizeof l0);
    sl_route_topk(l, 6, 3, &cfg, NULL, NULL, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 1 && ids[2] == 2);
    const double z = 1 + 2 * exp(-1.0);
    CHECK(near(w[0], 1 / z) && near(w[1], exp(-1.0) / z) && near(w[2], exp(-1.0) / z));
    CHECK(memcmp(l, l0, sizeof l0) == 0); /* the logits stay */
    /* top-k of the logits, each weight its sigmoid */
    cfg = (sl_route_cfg){.score = SL_ROUTE_TOPK_SIGMOID};
    sl_route_topk(l, 6, 2, &cfg, NULL, NULL, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 1 && near(w[0], sig(3)) && near(w[1], sig(2)));
    /* softmax, renormalised, then the per-expert factor, then the scale */
    float es_v[6] = {1, 2, 3, 4, 0.5f, 6};
    const sl_tensor es = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {6}, .data = es_v};
    cfg = (sl_route_cfg){.score = SL_ROUTE_SOFTMAX, .renormalize = 1, .scale = 3};
    memcpy(l, l0, sizeof l0);
    sl_route_topk(l, 6, 2, &cfg, NULL, &es, ids, w);
    const double p4 = 1 / (1 + exp(-1.0)), p1 = exp(-1.0) / (1 + exp(-1.0));
    CHECK(ids[0] == 4 && ids[1] == 1 && near(w[0], p4 * 0.5 * 3) && near(w[1], p1 * 2 * 3));
    /* sigmoid scores; groups of two ranked by the sum of their two biased scores: group 1
     * (experts 2, 3) and group 3 (6, 7) win, group 0's best expert (0) is left out though its
     * score is the highest; picks by biased score, weights the unbiased ones, renormalised
     * (+ 1e-20), then scaled */
    const float ls[8] = {4.0f, -4.0f, 1.0f, 1.0f, 0.5f, 0.5f, 0.2f, 2.0f};
    float sb_v[8] = {0, 0, 0, 0, 0, 0, 0.5f, 0};
    const sl_tensor sb = {.dtype = SL_DTYPE_F32, .ndim = 1, .shape = {8}, .data = sb_v};
    cfg = (sl_route_cfg){
        .score = SL_ROUTE_SIGMOID, .renormalize = 1, .n_group = 4, .topk_group = 2, .scale = 2.5f};
    memcpy(l, ls, sizeof ls);
    sl_route_topk(l, 8, 3, &cfg, &sb, NULL, ids, w);
    /* group sums: g0 sig(4)+sig(-4) = 1, g1 2 sig(1) = 1.46, g2 2 sig(.5) = 1.25,
     * g3 sig(.2)+.5+sig(2) = 1.93; picks by biased score: 7 (.88), 6 (1.05) first */
    CHECK(ids[0] == 6 && ids[1] == 7 && ids[2] == 2);
    const double s6 = sig(0.2), s7 = sig(2), s2 = sig(1), den = s6 + s7 + s2 + 1e-20;
    CHECK(near(w[0], s6 / den * 2.5) && near(w[1], s7 / den * 2.5) && near(w[2], s2 / den * 2.5));
    CHECK(near(l[0], sig(4))); /* the scores, unbiased, stay */
    /* equal group scores: the lower group wins; within it the lower expert */
    const float lt[8] = {1, 1, 1, 1, 0, 0, 0, 0};
    cfg = (sl_route_cfg){.score = SL_ROUTE_SIGMOID, .n_group = 4, .topk_group = 1};
    memcpy(l, lt, sizeof lt);
    sl_route_topk(l, 8, 2, &cfg, NULL, NULL, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1 && near(w[0], sig(1)));
    /* the checks a config gets */
    CHECK(sl_route_cfg_check(&cfg, 8, 2) == NULL);
    cfg.n_group = 3;
    CHECK(sl_route_cfg_check(&cfg, 8, 2) != NULL);
    cfg.n_group = 4, cfg.topk_group = 1;
    CHECK(sl_route_cfg_check(&cfg, 8, 3) != NULL); /* one group of 2 holds fewer than 3 */
    cfg.score = SL_ROUTE_SOFTMAX;
    CHECK(sl_route_cfg_check(&cfg, 8, 2) != NULL); /* groups need sigmoid scores */
}

/* A fixture with a sigmoid-gated shared expert: 3 layers, 8 experts, top-2. */
#define FIXTURE "qwen2_gqa_untied"

/* The rules the model-level tests run: each with weights on the outputs or on the inputs, the
 * shared expert gated or not. */
typedef struct rule_case {
    sl_route_cfg cfg;
    int32_t weight_input, ungated;
} rule_case;

static const rule_case rule_cases[] = {
    {{.score = SL_ROUTE_SOFTMAX}, 0, 0},
    {{.score = SL_ROUTE_TOPK_SIGMOID}, 1, 1},
    {{.score = SL_ROUTE_SIGMOID, .renormalize = 1, .n_group = 4, .topk_group = 2, .scale = 2.5f},
     0,
     1},
    {{.score = SL_ROUTE_TOPK_SOFTMAX}, 1, 0},
};

/* Loads the fixture under rule rc (set as a family's read_config would, before the session
 * sizes its scratch); the shared expert's gate dropped when ungated. */
static sl_model *load_rule(const sl_model_params *mp, const rule_case *rc) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixtures, FIXTURE);
    sl_model *m = NULL;
    sl_error err = {0};
    if (sl_model_load(dir, mp, &m, &err)) {
        fprintf(stderr, "  %s: %s\n", dir, err.msg);
        return NULL;
    }
    m->cfg.route_score = rc->cfg.score;
    m->cfg.norm_topk_prob = rc->cfg.renormalize;
    m->cfg.n_group = rc->cfg.n_group;
    m->cfg.topk_group = rc->cfg.topk_group;
    m->cfg.routed_scale = rc->cfg.scale;
    m->cfg.moe_weight_input = rc->weight_input;
    for (int32_t l = 0; rc->ungated && l < m->cfg.n_layers; l++)
        m->layers[l].sh_router.data = NULL;
    return m;
}

/* down(silu(gate . x) * up . x) of one row, in float32 products (sl_dot_ref), into y[H]. */
static void ref_mlp(const sl_tensor *g, const sl_tensor *u, const sl_tensor *d, const float *x,
                    double *y) {
    const int64_t I = g->shape[0], H = d->shape[0];
    float a[256];
    SL_ASSERT(I <= 256);
    for (int64_t i = 0; i < I; i++) {
        const float gv = sl_dot_ref(g, i, x), uv = sl_dot_ref(u, i, x);
        a[i] = gv / (1.0f + expf(-gv)) * uv;
    }
    for (int64_t h = 0; h < H; h++)
        y[h] = sl_dot_ref(d, h, a);
}

/* Layer l's FFN (blk_ffn) on random rows against a per-token reference: the router's logits,
 * sl_route_topk's picks and weights, each pick's expert on x (or on w * x, weight 1), summed,
 * plus the shared expert (sigmoid-gated or not). */
TEST(test_moe_layer_rules) {
    for (size_t ri = 0; ri < sizeof rule_cases / sizeof rule_cases[0]; ri++) {
        const rule_case *rc = &rule_cases[ri];
        const sl_model_params mp = {.n_threads = 2};
        sl_model *m = load_rule(&mp, rc);
        CHECK(m != NULL);
        if (!m) return;
        sl_session *s = NULL;
        sl_error err = {0};
        enum { T = 5 };
        const sl_session_params sp = {.max_ctx = 8, .max_batch = T};
        CHECK(sl_session_create(m, &sp, &s, &err) == SL_OK);
        const int32_t H = m->cfg.hidden_size, E = m->cfg.n_experts, k = m->cfg.n_experts_used;
        double worst = 0;
        for (int32_t l = 0; s && l < m->cfg.n_layers; l++) {
            const sl_layer *L = &m->layers[l];
            if (!L->is_moe) continue;
            uint64_t r = 0x1234567u + (uint64_t)l;
            for (int32_t i = 0; i < T * H; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                s->b.xn[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
            }
            CHECK(blk_ffn(s, l, T, &err) == SL_OK);
            for (int32_t t = 0; t < T; t++) {
                const float *x = s->b.xn + (size_t)t * (size_t)H;
                float logits[64], w[8], xin[256];
                int32_t ids[8];
                SL_ASSERT(E <= 64 && k <= 8 && H <= 256);
                for (int32_t e = 0; e < E; e++)
                    logits[e] = sl_dot_ref(&L->router, e, x);
                sl_route_topk(logits, E, k, &rc->cfg, NULL, NULL, ids, w);
                const sl_expert *ex[8];
                CHECK(sl_experts_fetch(&m->experts, l, ids, k, ex, &err) == SL_OK);
                double want[256] = {0}, y[256];
                for (int32_t j = 0; j < k; j++) {
                    for (int32_t h = 0; h < H; h++)
                        xin[h] = rc->weight_input ? w[j] * x[h] : x[h];
                    ref_mlp(&ex[j]->gate, &ex[j]->up, &ex[j]->down, xin, y);
                    for (int32_t h = 0; h < H; h++)
                        want[h] += (rc->weight_input ? 1.0 : w[j]) * y[h];
                }
                ref_mlp(&L->sh_gate, &L->sh_up, &L->sh_down, x, y);
                const double g = L->sh_router.data ? sig(sl_dot_ref(&L->sh_router, 0, x)) : 1;
                double num = 0, den = 0;
                for (int32_t h = 0; h < H; h++) {
                    want[h] += g * y[h];
                    const double d = s->b.out[(size_t)t * (size_t)H + h] - want[h];
                    num += d * d, den += want[h] * want[h];
                }
                worst = fmax(worst, sqrt(num / den));
            }
        }
        CHECKF(worst < 1e-5, "rule %zu: rel L2 %.3g", ri, worst);
        sl_session_free(s);
        sl_model_free(m);
    }
}

/* Logits of ids through one session of chunk max_batch under rule rc, or NULL. */
static float *rule_logits(const sl_model_params *mp, const rule_case *rc, const int32_t *ids,
                          int32_t n, int32_t chunk, size_t *count) {
    sl_model *m = load_rule(mp, rc);
    if (!m) return NULL;
    sl_session *s = NULL;
    sl_error err = {0};
    const sl_session_params sp = {.max_ctx = n, .max_batch = chunk};
    *count = (size_t)n * (size_t)m->cfg.vocab_size;
    float *out = malloc(*count * sizeof(float));
    if (sl_session_create(m, &sp, &s, &err) || sl_session_forward(s, ids, n, out, 1, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        free(out), out = NULL;
    }
    sl_session_free(s);
    sl_model_free(m);
    return out;
}

/* Every rule gives the same bits through every expert mode, cache size and chunking, the
 * device path's fused experts (no-sync, and ahead of the host) included. */
TEST(test_route_rules_modes_bitwise) {
    int32_t ids[24];
    const int32_t n = 24;
    for (int32_t i = 0; i < n; i++)
        ids[i] = (i * 37 + 11) % 256;
    struct {
        sl_experts_mode mode;
        int32_t slots, chunk;
        sl_backend_kind be;
        int32_t dev_slots;
    } v[] = {
        {SL_EXPERTS_MAPPED, 0, n, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_STREAM, 2, 1, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_STREAM, 3, 5, SL_BACKEND_CPU, 0},
        {SL_EXPERTS_RESIDENT, 0, 1, SL_BACKEND_CPU_DEVICE, 0},
        {SL_EXPERTS_STREAM, 2, 1, SL_BACKEND_CPU_DEVICE, 2},
        {SL_EXPERTS_MAPPED, 0, 3, SL_BACKEND_CPU_DEVICE, 1},
    };
    for (size_t ri = 0; ri < sizeof rule_cases / sizeof rule_cases[0]; ri++) {
        float *base = NULL;
        size_t count = 0;
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            const sl_model_params mp = {.n_threads = 2,
                                        .experts = v[i].mode,
                                        .cache_experts = v[i].slots,
                                        .backend = v[i].be,
                                        .gpu_experts = v[i].dev_slots};
            float *got = rule_logits(&mp, &rule_cases[ri], ids, n, v[i].chunk, &count);
            CHECK(got != NULL);
            if (!base) {
                base = got;
                continue;
            }
            CHECKF(got && memcmp(got, base, count * sizeof(float)) == 0,
                   "rule %zu variant %zu differs", ri, i);
            free(got);
        }
        free(base);
    }
}

/* OLMoE's clip_qkv, which transformers' fixtures leave null: olmoe_a's weights with "clip_qkv":
 * 0.6 against a float64 reference (tools/lab/olmoe_ref.py; the last 4 rows of the 40-token
 * prompt's logits), and the clamp makes a difference. */
TEST(test_olmoe_clip_qkv) {
    char src[512], dir[600], path[700], cmd[1600];
    snprintf(src, sizeof src, "%s/fam/olmoe_a", test_fixtures);
    snprintf(dir, sizeof dir, "%s/olmoe_clip", test_tmpdir());
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && ln -sf \"$(realpath '%s/model.safetensors')\" '%s/' && "
             "sed 's/\"clip_qkv\": null/\"clip_qkv\": 0.6/' '%s/config.json' > '%s/config.json'",
             dir, src, dir, src, dir);
    CHECK(system(cmd) == 0);
    int32_t ids[64], n = 0;
    snprintf(path, sizeof path, "%s/ref.json", src);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    char buf[8192];
    const size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    char *p = strstr(buf, "\"ids\"");
    for (p = p ? strchr(p, '[') + 1 : NULL; p && *p && *p != ']' && n < 64;) {
        ids[n++] = (int32_t)strtol(p, &p, 10);
        while (*p == ',' || *p == ' ' || *p == '\n')
            p++;
    }
    CHECK(n == 40);
    enum { ROWS = 4, V = 128 };
    float want[ROWS * V];
    snprintf(path, sizeof path, "%s/../unit/data/olmoe_clip_tail.f32", test_fixtures);
    f = fopen(path, "rb");
    CHECK(f && fread(want, sizeof want, 1, f) == 1);
    if (f) fclose(f);
    const sl_model_params mp = {.n_threads = 2};
    int32_t vocab = 0;
    float *got = test_logits(dir, &mp, ids, n, n, NULL, &vocab);
    snprintf(src, sizeof src, "%s/fam/olmoe_a", test_fixtures);
    float *plain = test_logits(src, &mp, ids, n, n, NULL, &vocab);
    CHECK(got && plain && vocab == V);
    if (got && plain && vocab == V) {
        const size_t off = (size_t)(n - ROWS) * V;
        const double d = test_rel_l2(got + off, want, ROWS * V);
        CHECKF(d < 1e-5, "clip_qkv: rel L2 %.3g against the reference", d);
        CHECK(test_rel_l2(plain + off, want, ROWS * V) > 0.05);
    }
    free(got), free(plain);
}
