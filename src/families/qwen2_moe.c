/*
 * Qwen2-MoE (model_type "qwen2_moe"): pre-norm decoder, GQA with q/k/v
 * biases (config qkv_bias, default on) and no qk-norm, routed experts (norm_topk_prob defaults to
 * false) plus a shared expert gated by sigmoid(shared_expert_gate . x), and dense layers from
 * mlp_only_layers / decoder_sparse_step.
 */
#include "model/blocks.h"

static sl_status qwen2_moe_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {.qkv_bias = m->cfg.qkv_bias, .o_bias = 0, .qk_norm = 0};
    const blk_ffn_opts ffn = {.shared_expert = 1};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_qwen2_moe = {
    .arch = "qwen2_moe",
    .norm_offset = 0.0f,
    .bind = qwen2_moe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
