/*
 * Routed experts a Hugging Face checkpoint stores in a layout the expert store does not hold
 * (config's sl_expert_layout other than the default): bound by name, and handed to the store
 * with a relayout (moe/experts.h sl_expert_relayout) that moves their bytes into the blob
 * layout as each expert is read, value for value.
 */
#ifndef SL_EXPERT_RELAYOUT_H
#define SL_EXPERT_RELAYOUT_H

#include "model/model.h"

/* gpt-oss's experts (SL_EXPERT_LAYOUT_GATE_UP_T), in floats or MXFP4, and Llama-4's
 * (SL_EXPERT_LAYOUT_IN_OUT, under the family's ffn_name) into the store: modes resident and
 * stream read and lay them out (mapped, which would need views of the bytes as they lie, is
 * resident). */
sl_status sl_open_experts_gate_up_t(sl_model *m, const sl_store_params *sp, sl_error *err);

/* Fused experts by their shapes: SL_EXPERT_LAYOUT_IN_OUT when the first MoE layer's
 * gate_up_proj is [E, H, 2I] and down_proj [E, I, H] (under the family's experts_module), else
 * c->expert_layout. A family whose published checkpoints store them so while transformers 5
 * saves [E, 2I, H] and [E, H, I] under the same names takes this as its expert_layout hook. */
int32_t sl_fused_experts_layout(const sl_config *c, const sl_ckpt *ck);

/* MXFP4 as Hugging Face stores it (codes [rows, cols/32, 16] with element 2j in the low nibble
 * of byte j, e8m0 scales [rows, cols/32] apart) -> ggml's blocks (block_mxfp4: e, then qs[16]
 * with element j in the low nibble and j + 16 in the high one of qs[j]): one row of cols. */
void sl_mxfp4_hf_to_ggml_row(uint8_t *dst, const uint8_t *codes, const uint8_t *scales,
                             int64_t cols);

#endif /* SL_EXPERT_RELAYOUT_H */
