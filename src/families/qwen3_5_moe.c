/*
 * Qwen3.5-MoE (model_type "qwen3_5_moe_text", and "qwen3_5_moe" for the
 * vision-language checkpoint, whose text model sits under model.language_model.
 * and whose vision tower model.visual.* is not bound). As Qwen3-Next, except:
 * Gated DeltaNet's projections are separate (in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a), every layer is MoE with a gated shared expert, and the top-k
 * router weights are always renormalised (config.c sets norm_topk_prob).
 * M-RoPE reduces to plain partial RoPE for text-only input.
 */
#include "model/blocks.h"

static sl_status qwen3_5_moe_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {.qkv_bias = m->cfg.attention_bias,
                                .o_bias = m->cfg.attention_bias,
                                .qk_norm = 1,
                                .gated = 1};
    const blk_ffn_opts ffn = {.shared_expert = 1};
    if (!m->cfg.layer_is_linear)
        return sl_fail(err, SL_ERR_FORMAT, "%s: qwen3_5_moe config has no linear_* keys",
                       m->ck.dir);
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        st = m->cfg.layer_is_linear[l] ? blk_bind_linear_attention(m, l, BLK_LINEAR_SEPARATE, err)
                                       : blk_bind_attention(m, l, &attn, err);
        if (!st) st = blk_bind_ffn(m, l, &ffn, err);
    }
    return st;
}

const sl_family sl_family_qwen3_5_moe = {
    .arch = "qwen3_5_moe",
    .norm_offset = 1.0f,
    .bind = qwen3_5_moe_bind,
    .forward = blk_prenorm_decoder,
};

const sl_family sl_family_qwen3_5_moe_text = {
    .arch = "qwen3_5_moe_text",
    .norm_offset = 1.0f,
    .bind = qwen3_5_moe_bind,
    .forward = blk_prenorm_decoder,
};
