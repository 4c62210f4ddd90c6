/*
 * Qwen3-MoE (model_type "qwen3_moe"): pre-norm decoder, GQA with a per-head
 * RMSNorm on q and k before RoPE, no biases (unless attention_bias), routed
 * experts with optional top-k renormalisation (norm_topk_prob), and dense
 * layers from mlp_only_layers / decoder_sparse_step. No shared expert.
 */
#include "model/blocks.h"

static sl_status qwen3_moe_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {
        .qkv_bias = m->cfg.attention_bias, .o_bias = m->cfg.attention_bias, .qk_norm = 1};
    const blk_ffn_opts ffn = {.shared_expert = 0};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_qwen3_moe = {
    .arch = "qwen3_moe",
    .norm_offset = 0.0f,
    .bind = qwen3_moe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
