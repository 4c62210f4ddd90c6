/* Expert store: resident views into the checkpoint mapping. */
#include "moe/experts.h"

/* One layer: fused tensors if the checkpoint has them, else one set per expert. */
static sl_status bind_layer(sl_expert *ex, const sl_ckpt *ck, int32_t l, int32_t E, int64_t H,
                            int64_t I, sl_error *err) {
    sl_status st;
    char name[160];
    snprintf(name, sizeof name, "layers.%d.mlp.experts.gate_up_proj", l);
    if (sl_ckpt_find(ck, name)) {
        sl_tensor gu, down;
        if ((st = sl_ckpt_bind(ck, &gu, SL_BIND_REQUIRED, SL_DIMS(E, 2 * I, H), err, "%s", name)) ||
            (st = sl_ckpt_bind(ck, &down, SL_BIND_REQUIRED, SL_DIMS(E, H, I), err,
                               "layers.%d.mlp.experts.down_proj", l)))
            return st;
        for (int32_t e = 0; e < E; e++) {
            sl_tensor m = sl_tensor_slice(&gu, e);
            ex[e].gate = sl_tensor_rows(&m, 0, I);
            ex[e].up = sl_tensor_rows(&m, I, I);
            ex[e].down = sl_tensor_slice(&down, e);
        }
        return SL_OK;
    }
    for (int32_t e = 0; e < E; e++) {
        const char *fmt = "layers.%d.mlp.experts.%d.%s.weight";
        if ((st = sl_ckpt_bind(ck, &ex[e].gate, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, e,
                               "gate_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].up, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, e,
                               "up_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].down, SL_BIND_REQUIRED, SL_DIMS(H, I), err, fmt, l, e,
                               "down_proj")))
            return st;
    }
    return SL_OK;
}

sl_status sl_experts_bind(sl_expert_store *s, const sl_ckpt *ck, int32_t n_layers,
                          const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                          int64_t inter, sl_error *err) {
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers;
    s->n_experts = n_experts;
    if (n_experts == 0) return SL_OK;
    s->experts = sl_calloc((size_t)n_layers * (size_t)n_experts, sizeof(sl_expert), err);
    if (!s->experts) return SL_ERR_NOMEM;
    for (int32_t l = 0; l < n_layers; l++) {
        if (!layer_is_moe[l]) continue;
        sl_status st = bind_layer(s->experts + (size_t)l * (size_t)n_experts, ck, l, n_experts,
                                  hidden, inter, err);
        if (st) return st;
    }
    return SL_OK;
}

void sl_experts_free(sl_expert_store *s) {
    free(s->experts);
    memset(s, 0, sizeof *s);
}

sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err) {
    (void)err;
    SL_ASSERT(layer >= 0 && layer < s->n_layers);
    for (int32_t i = 0; i < n; i++) {
        SL_ASSERT(ids[i] >= 0 && ids[i] < s->n_experts);
        out[i] = &s->experts[(size_t)layer * (size_t)s->n_experts + (size_t)ids[i]];
    }
    return SL_OK;
}
