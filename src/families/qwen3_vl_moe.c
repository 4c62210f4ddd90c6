/*
 * Qwen3-VL-MoE (model_type "qwen3_vl_moe"): the text model of the vision-language checkpoint
 * (config under text_config, weights under model.language_model.; the vision tower
 * model.visual.* is not bound), run on text alone. It is Qwen3-MoE's decoder: per-head q/k
 * RMSNorm, a softmax top-k router always renormalised, experts stored fused: gate_up_proj
 * [E, 2I, H] and down_proj [E, H, I] as transformers 5 saves them, or in x out, [E, H, 2I]
 * (gate columns, then up) and [E, I, H], as the published checkpoints hold them (transformers
 * transposes them at load; the store lays them out as it reads them, by the shapes). Its
 * interleaved M-RoPE gives each frequency the temporal, height or width position by
 * mrope_section; a text token has the same position on all three, so it is plain RoPE over the
 * whole head (and DeepStack adds nothing without an image).
 */
#include "model/blocks.h"
#include "model/expert_relayout.h"

static sl_status qwen3_vl_moe_read_config(sl_config *c, const json_t *root, const char *path,
                                          sl_error *err) {
    (void)root;
    if (c->n_experts < 1 || c->moe_intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: text_config needs num_experts and moe_intermediate_size", path);
    c->norm_topk_prob = 1; /* Qwen3VLMoeTextTopKRouter always renormalises */
    return SL_OK;
}

static sl_status qwen3_vl_moe_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {
        .qkv_bias = m->cfg.attention_bias, .o_bias = m->cfg.attention_bias, .qk_norm = 1};
    const blk_ffn_opts ffn = {0};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_qwen3_vl_moe = {
    .arch = "qwen3_vl_moe",
    .norm_offset = 0.0f,
    .read_config = qwen3_vl_moe_read_config,
    .bind = qwen3_vl_moe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
    .expert_layout = sl_fused_experts_layout,
};
