/*
 * The expert store: where a layer's routed experts live and how the MoE
 * block gets at them. Each expert is three matrices in nn.Linear layout:
 *   gate [I, H], up [I, H], down [H, I]   (I = moe_intermediate_size)
 * Checkpoints store them per expert or fused ([E, 2I, H] gate rows first,
 * [E, H, I]); both bind to the same views here.
 *
 * The MoE block asks for all experts a layer needs at once (sl_experts_fetch),
 * so a streaming store can read every miss of the layer in parallel.
 */
#ifndef SL_EXPERTS_H
#define SL_EXPERTS_H

#include "model/checkpoint.h"

typedef struct sl_expert {
    sl_tensor gate; /* [I, H] */
    sl_tensor up;   /* [I, H] */
    sl_tensor down; /* [H, I] */
} sl_expert;

typedef struct sl_expert_store {
    int32_t n_layers, n_experts;
    sl_expert *experts; /* [n_layers * n_experts]; empty for dense layers */
} sl_expert_store;

/* Binds the routed experts of every MoE layer (layer_is_moe[l]) from the checkpoint. */
sl_status sl_experts_bind(sl_expert_store *s, const sl_ckpt *ck, int32_t n_layers,
                          const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                          int64_t inter, sl_error *err);
void sl_experts_free(sl_expert_store *s);

/* Makes experts ids[0..n) of a layer available; out[i] points at expert ids[i]. */
sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err);

#endif /* SL_EXPERTS_H */
