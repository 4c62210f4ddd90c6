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
    return blk_bind_hybrid(m, BLK_LINEAR_FUSED, err);
}

const sl_family sl_family_qwen3_next = {
    .arch = "qwen3_next",
    .norm_offset = 1.0f,
    .bind = qwen3_next_bind,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
