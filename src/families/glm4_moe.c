/*
 * GLM-4.5 / 4.6 (model_type "glm4_moe"): pre-norm decoder, GQA with biases on q, k and v
 * (attention_bias; o_proj has none), per-head q/k RMSNorm when use_qk_norm, NeoX RoPE on the
 * first head_dim * partial_rotary_factor dims (0.5 when the config gives none). The first
 * first_k_dense_replace layers are dense (intermediate_size), the rest MoE:
 *   s = sigmoid(gate . x); the top-k of s + e_score_correction_bias from the topk_group best of
 *   n_group groups; weights s of the picks, renormalised (+1e-20) when norm_topk_prob (default
 *   on), times routed_scaling_factor; plus n_shared_experts ungated shared experts (one MLP of
 *   n_shared_experts * moe_intermediate_size), summed.
 * The multi-token-prediction layers (num_nextn_predict_layers) past num_hidden_layers are not
 * bound: transformers does not run them either.
 */
#include <jansson.h>

#include "model/blocks.h"

static sl_status glm4_moe_read_config(sl_config *c, const json_t *root, const char *path,
                                      sl_error *err) {
    int32_t dense = 1, n_shared = 1, qk = 0;
    double scale = 1.0;
    sl_status st;
    if ((st = sl_config_int(root, "n_routed_experts", c->n_experts > 0 ? c->n_experts : -1, 1,
                            1 << 16, &c->n_experts, path, err)) ||
        (st = sl_config_int(root, "norm_topk_prob", 1, 0, 1, &c->norm_topk_prob, path, err)) ||
        (st = sl_config_int(root, "first_k_dense_replace", 1, 0, c->n_layers, &dense, path, err)) ||
        (st = sl_config_int(root, "n_shared_experts", 1, 0, 1024, &n_shared, path, err)) ||
        (st = sl_config_int(root, "n_group", 1, 1, SL_ROUTE_MAX_GROUPS, &c->n_group, path, err)) ||
        (st = sl_config_int(root, "topk_group", 1, 1, SL_ROUTE_MAX_GROUPS, &c->topk_group, path,
                            err)) ||
        (st = sl_config_num(root, "routed_scaling_factor", 1.0, 0.0, 1, 1e6, &scale, path, err)) ||
        (st = sl_config_int(root, "use_qk_norm", 0, 0, 1, &qk, path, err)))
        return st;
    if (c->moe_intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT, "%s: missing 'moe_intermediate_size'", path);
    if (c->intermediate_size < 1 && dense > 0)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: first_k_dense_replace %d dense layers need intermediate_size", path,
                       dense);
    c->route_score = SL_ROUTE_SIGMOID;
    c->routed_scale = (float)scale;
    c->shared_intermediate_size = n_shared * c->moe_intermediate_size;
    c->decoder_sparse_step = 1;
    for (int32_t l = 0; l < c->n_layers; l++)
        c->layer_is_moe[l] = l >= dense;
    /* Glm4MoeConfig sets partial_rotary_factor to 0.5 when the config has none at all */
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (!json_object_get(root, "partial_rotary_factor") &&
        !json_object_get(json_object_get(root, "rope_scaling"), "partial_rotary_factor") &&
        !json_object_get(rp, "partial_rotary_factor")) {
        c->rot_dim = c->head_dim / 2;
        c->rot_dim -= c->rot_dim % 2;
    }
    /* the family's own keys for its bind hook: use_qk_norm */
    int32_t *fam = malloc(sizeof(int32_t));
    if (!fam) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    *fam = qk;
    c->fam = fam;
    return SL_OK;
}

static sl_status glm4_moe_bind(sl_model *m, sl_error *err) {
    const int qk = m->cfg.fam ? *(const int32_t *)m->cfg.fam : 0;
    const blk_attn_opts attn = {.qkv_bias = m->cfg.attention_bias, .o_bias = 0, .qk_norm = qk};
    const blk_ffn_opts ffn = {.shared_experts = m->cfg.shared_intermediate_size > 0,
                              .select_bias = 1};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_glm4_moe = {
    .arch = "glm4_moe",
    .norm_offset = 0.0f,
    .read_config = glm4_moe_read_config,
    .bind = glm4_moe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
