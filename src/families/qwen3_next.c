/*
 * Qwen3-Next (model_type "qwen3_next"): a hybrid pre-norm decoder. Layers listed
 * as "linear_attention" run Gated DeltaNet with the fused, group-interleaved
 * projections (in_proj_qkvz, in_proj_ba); the others run gated full attention
 * (q_proj yields [query | gate] per head, per-head q/k norm, partial RoPE).
 * Every RMSNorm but the DeltaNet's gated one scales by (1 + w). FFNs are routed
 * experts (norm_topk_prob) plus a sigmoid-gated shared expert, or dense
 * layers from mlp_only_layers / decoder_sparse_step.
 */
#include "model/blocks.h"

static sl_status qwen3_next_bind(sl_model *m, sl_error *err) {
    const blk_attn_opts attn = {.qkv_bias = m->cfg.attention_bias,
                                .o_bias = m->cfg.attention_bias,
                                .qk_norm = 1,
                                .gated = 1};
    const blk_ffn_opts ffn = {.shared_expert = 1};
    if (!m->cfg.layer_is_linear)
        return sl_fail(err, SL_ERR_FORMAT, "%s: qwen3_next config has no linear_* keys", m->ck.dir);
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        st = m->cfg.layer_is_linear[l] ? blk_bind_linear_attention(m, l, BLK_LINEAR_FUSED, err)
                                       : blk_bind_attention(m, l, &attn, err);
        if (!st) st = blk_bind_ffn(m, l, &ffn, err);
    }
    return st;
}

const sl_family sl_family_qwen3_next = {
    .arch = "qwen3_next",
    .norm_offset = 1.0f,
    .bind = qwen3_next_bind,
    .forward = blk_prenorm_decoder,
};
