/*
 * Routed experts a Hugging Face checkpoint stores in a layout the expert store does not hold
 * (config's sl_expert_layout other than the default): bound by name, and handed to the store
 * with a relayout (moe/experts.h sl_expert_relayout) that moves their bytes into the blob
 * layout as each expert is read, value for value.
 */
#ifndef SL_EXPERT_RELAYOUT_H
#define SL_EXPERT_RELAYOUT_H

#include "model/model.h"

/* gpt-oss's experts (SL_EXPERT_LAYOUT_GATE_UP_T), in floats or MXFP4, into the store: modes
 * resident and stream read and lay them out (mapped, which would need views of the bytes as
 * they lie, is resident). */
sl_status sl_open_experts_gate_up_t(sl_model *m, const sl_store_params *sp, sl_error *err);

/* MXFP4 as Hugging Face stores it (codes [rows, cols/32, 16] with element 2j in the low nibble
 * of byte j, e8m0 scales [rows, cols/32] apart) -> ggml's blocks (block_mxfp4: e, then qs[16]
 * with element j in the low nibble and j + 16 in the high one of qs[j]): one row of cols. */
void sl_mxfp4_hf_to_ggml_row(uint8_t *dst, const uint8_t *codes, const uint8_t *scales,
                             int64_t cols);

#endif /* SL_EXPERT_RELAYOUT_H */
