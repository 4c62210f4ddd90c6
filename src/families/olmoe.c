/*
 * OLMoE (model_type "olmoe"): pre-norm decoder whose q and k projections are RMS-normed over
 * their whole width (q_norm [nh * hd], k_norm [nkv * hd], before RoPE, not per head), biases
 * on q, k, v and o with attention_bias, q, k and v clamped to [-clip_qkv, clip_qkv] after the
 * norms when clip_qkv is set, every layer MoE with a softmax top-k router
 * (renormalised when norm_topk_prob, default off) and experts of intermediate_size.
 */
#include <float.h>
#include <jansson.h>

#include "model/blocks.h"

/* The family's own key: clip_qkv (0: none). */
typedef struct olmoe_cfg {
    float clip_qkv;
} olmoe_cfg;

static sl_status olmoe_read_config(sl_config *c, const json_t *root, const char *path,
                                   sl_error *err) {
    double clip = 0;
    sl_status st = sl_config_num(root, "clip_qkv", 0.0, 0.0, 1, FLT_MAX, &clip, path, err);
    if (st) return st;
    if (c->n_experts < 1 || c->intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: olmoe needs num_experts and intermediate_size (the experts')", path);
    c->moe_intermediate_size = c->intermediate_size;
    olmoe_cfg *f = calloc(1, sizeof *f);
    if (!f) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    f->clip_qkv = (float)clip;
    c->fam = f;
    return SL_OK;
}

static sl_status olmoe_bind(sl_model *m, sl_error *err) {
    const olmoe_cfg *f = m->cfg.fam;
    const blk_attn_opts attn = {.qkv_bias = m->cfg.attention_bias,
                                .o_bias = m->cfg.attention_bias,
                                .qk_norm_full = 1,
                                .qkv_clip = f ? f->clip_qkv : 0};
    const blk_ffn_opts ffn = {0};
    return blk_bind_decoder(m, &attn, &ffn, err);
}

const sl_family sl_family_olmoe = {
    .arch = "olmoe",
    .norm_offset = 0.0f,
    .read_config = olmoe_read_config,
    .bind = olmoe_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
