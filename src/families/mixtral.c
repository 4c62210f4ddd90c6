/*
 * Mixtral (model_type "mixtral"): pre-norm decoder, GQA without biases or q/k norms, every
 * layer MoE with a softmax top-k router whose weights are always renormalised, experts of
 * intermediate_size (Mixtral's config has no moe_intermediate_size). The original layout
 * (block_sparse_moe, experts.N.w1/w2/w3) is read under transformers 5's names (checkpoint.c).
 */
#include <jansson.h>

#include "model/blocks.h"

static sl_status mixtral_read_config(sl_config *c, const json_t *root, const char *path,
                                     sl_error *err) {
    json_t *sw = json_object_get(root, "sliding_window");
    if (sw && !json_is_null(sw))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: sliding_window %lld: sliding-window attention is not supported for "
                       "mixtral (null is)",
                       path, (long long)json_integer_value(sw));
    if (c->n_experts < 1 || c->intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: mixtral needs num_local_experts and intermediate_size (the experts')",
                       path);
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = 1; /* MixtralTopKRouter always renormalises */
    return SL_OK;
}

static sl_status mixtral_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {0};
    const blk_ffn_opts ffn = {0};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_mixtral = {
    .arch = "mixtral",
    .norm_offset = 0.0f,
    .read_config = mixtral_read_config,
    .bind = mixtral_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
