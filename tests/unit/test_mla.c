/*
 * Multi-head latent attention's load-time pieces: W_UK^T made from kv_b_proj in every storage
 * (the same values, transposed: FP8 kept with its block scales where they tile each head, else
 * widened), and the DeepSeek-V3 config values transformers cannot run, refused by name. The
 * forward pass is checked against transformers by tests/fam_test.sh (deepseek_v3_a, _b), the
 * latent_attention op by the op table.
 */
#include "kernels/fp8.h"
#include "model/config.h"
#include "model/mla.h"
#include "test.h"

/* uk_t of L (made from kv_b) against kv_b's values read column-wise: 0 when all are equal. */
static long uk_mismatches(const blk_mla_dims *d, const blk_mla_layer *L) {
    const int64_t nh = d->n_heads, dn = d->nope_dim, dv = d->v_dim, kv = d->kv_lora_rank;
    float *src = malloc((size_t)kv * sizeof(float)), *dst = malloc((size_t)dn * sizeof(float));
    long bad = 0;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t c = 0; c < kv; c++) {
            const int64_t r = h * kv + c;
            if (sl_tensor_is_fp8(&L->uk_t))
                sl_dequant_fp8_row(&L->uk_t, r, dst);
            else
                sl_to_f32(dst, L->uk_t.data, L->uk_t.dtype, (size_t)(r * dn), (size_t)dn);
            for (int64_t e = 0; e < dn; e++) {
                if (sl_tensor_is_fp8(&L->kv_b))
                    sl_dequant_fp8_row(&L->kv_b, h * (dn + dv) + e, src);
                else
                    sl_to_f32(src, L->kv_b.data, L->kv_b.dtype, (size_t)((h * (dn + dv) + e) * kv),
                              (size_t)kv);
                bad += src[c] != dst[e];
            }
        }
    free(src), free(dst);
    return bad;
}

TEST(test_mla_uk_transpose) {
    const blk_mla_dims d = {.n_heads = 3, .kv_lora_rank = 32, .nope_dim = 16, .v_dim = 16};
    const int64_t N = 3 * 32, K = 32;
    uint8_t *codes = malloc((size_t)(N * K));
    uint16_t *bf = malloc((size_t)(N * K) * 2);
    float *scales = malloc(64 * sizeof(float));
    uint32_t x = 12345;
    for (int64_t i = 0; i < N * K; i++) {
        x = x * 1664525u + 1013904223u;
        codes[i] = (uint8_t)(x >> 24);
        if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1; /* no NaN codes */
        bf[i] = (uint16_t)(x >> 16);
        if ((bf[i] & 0x7f80) == 0x7f80) bf[i] ^= 0x4000; /* finite */
    }
    for (int i = 0; i < 64; i++)
        scales[i] = 0.001f * (float)(i + 1);
    /* FP8, blocks tiling the heads (16 x 16): kept FP8; blocks that do not (24 rows): F32 */
    const int32_t brs[2] = {16, 24};
    for (int i = 0; i < 2; i++) {
        blk_mla_layer L = {0};
        sl_error err = {0};
        L.kv_b = (sl_tensor){.dtype = SL_DTYPE_F8_E4M3,
                             .ndim = 2,
                             .shape = {N, K},
                             .data = codes,
                             .nbytes = (size_t)(N * K),
                             .scales = scales,
                             .group = 16,
                             .brows = brs[i],
                             .sdtype = SL_DTYPE_F32};
        CHECK(blk_mla_make_uk_t(&d, &L, &err) == SL_OK);
        CHECKF(L.uk_t.dtype == (i == 0 ? SL_DTYPE_F8_E4M3 : SL_DTYPE_F32), "%s",
               sl_dtype_name(L.uk_t.dtype));
        CHECK(L.uk_t.shape[0] == 96 && L.uk_t.shape[1] == 16);
        const long bad = uk_mismatches(&d, &L);
        CHECKF(bad == 0, "FP8 brows %d: %ld values differ", brs[i], bad);
        blk_mla_free(&L);
    }
    /* BF16: the same values, transposed, in BF16 */
    blk_mla_layer L = {0};
    sl_error err = {0};
    L.kv_b = (sl_tensor){.dtype = SL_DTYPE_BF16,
                         .ndim = 2,
                         .shape = {N, K},
                         .data = bf,
                         .nbytes = (size_t)(N * K) * 2};
    CHECK(blk_mla_make_uk_t(&d, &L, &err) == SL_OK && L.uk_t.dtype == SL_DTYPE_BF16);
    CHECK(uk_mismatches(&d, &L) == 0);
    blk_mla_free(&L);
    free(codes), free(bf), free(scales);
}

TEST(test_deepseek_v3_config_refusals) {
    static const char *base =
        "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 32, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"q_lora_rank\": null, "
        "\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": "
        "8, "
        "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 2, "
        "\"intermediate_size\": 32, \"moe_intermediate_size\": 16, \"first_k_dense_replace\": 1";
    static const struct {
        const char *extra, *want;
    } cases[] = {
        {"", NULL},
        {", \"head_dim\": 8", "head_dim 8 differs from qk_rope_head_dim 4"},
        {", \"num_key_value_heads\": 2", "num_key_value_heads 2"},
        {", \"n_group\": 3", "n_group 3 groups"},
        {", \"n_group\": 8", "n_group 8 groups"},
        {", \"topk_group\": 1, \"num_experts_per_tok\": 3", "cannot hold"},
        {", \"partial_rotary_factor\": 0.5", "partial_rotary_factor"},
        {", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2}", "not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s}", base, cases[i].extra);
        sl_config c;
        sl_error err = {0};
        const sl_status st = sl_config_parse(&c, text, "config.json", &err);
        if (!cases[i].want) {
            CHECKF(st == SL_OK, "%s", err.msg);
            CHECK(c.head_dim == 4 && c.rot_dim == 4 && c.layer_is_moe[0] == 0 &&
                  c.layer_is_moe[1] == 1 && c.n_experts == 8 && c.norm_topk_prob == 1);
            sl_config_free(&c);
        } else {
            CHECKF(st != SL_OK && strstr(err.msg, cases[i].want), "case %zu: %s", i, err.msg);
        }
    }
}
