/*
 * Qwen3.5-MoE (model_type "qwen3_5_moe_text", and "qwen3_5_moe" for the
 * vision-language checkpoint, whose text model sits under model.language_model.
 * and whose vision tower model.visual.* is not bound). As Qwen3-Next, except:
 * Gated DeltaNet's projections are separate (in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a), every layer is MoE with a gated shared expert, and the top-k
 * router weights are always renormalised (read_config sets norm_topk_prob).
 * M-RoPE reduces to plain partial RoPE for text-only input.
 */
#include "model/blocks.h"

/* Qwen3.5-MoE has no norm_topk_prob: its top-k weights are always renormalised. */
static sl_status qwen3_5_moe_read_config(sl_config *c, const json_t *root, const char *path,
                                         sl_error *err) {
    (void)root, (void)path, (void)err;
    c->norm_topk_prob = 1;
    return SL_OK;
}

static sl_status qwen3_5_moe_bind(sl_model *m, sl_error *err) {
    return blk_bind_hybrid(m, BLK_LINEAR_SEPARATE, err);
}

const sl_family sl_family_qwen3_5_moe = {
    .arch = "qwen3_5_moe",
    .norm_offset = 1.0f,
    .read_config = qwen3_5_moe_read_config,
    .bind = qwen3_5_moe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
