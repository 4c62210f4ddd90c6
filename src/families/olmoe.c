/*
 * OLMoE (model_type "olmoe"): pre-norm decoder whose q and k projections are RMS-normed over
 * their whole width (q_norm [nh * hd], k_norm [nkv * hd], before RoPE, not per head), biases
 * on q, k, v and o with attention_bias, every layer MoE with a softmax top-k router
 * (renormalised when norm_topk_prob, default off) and experts of intermediate_size.
 */
#include <jansson.h>

#include "model/blocks.h"

static sl_status olmoe_read_config(sl_config *c, const json_t *root, const char *path,
                                   sl_error *err) {
    json_t *clip = json_object_get(root, "clip_qkv");
    if (clip && !json_is_null(clip))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: clip_qkv %g: clamping q, k and v is not supported (null is)", path,
                       json_number_value(clip));
    if (c->n_experts < 1 || c->intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: olmoe needs num_experts and intermediate_size (the experts')", path);
    c->moe_intermediate_size = c->intermediate_size;
    return SL_OK;
}

static sl_status olmoe_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {
        .qkv_bias = m->cfg.attention_bias, .o_bias = m->cfg.attention_bias, .qk_norm_full = 1};
    const blk_ffn_opts ffn = {0};
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++)
        if (!(st = blk_bind_attention(m, l, &attn, err))) st = blk_bind_ffn(m, l, &ffn, err);
    return st;
}

const sl_family sl_family_olmoe = {
    .arch = "olmoe",
    .norm_offset = 0.0f,
    .read_config = olmoe_read_config,
    .bind = olmoe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
