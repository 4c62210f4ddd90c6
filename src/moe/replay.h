/*
 * Routing replayed from a trace (trace.h) instead of the router's: a benchmark tool, so that a
 * synthetic model with a real model's layer shapes streams its experts the way a trained
 * model's routers ask for them. Results are not the model's; bytes, hits and timings are what
 * that routing costs. The model's MoE layers take the trace's layers in turn (MoE layer m reads
 * trace layer m mod the trace's layers), and each layer its own run of tokens: layer l's t-th
 * token (counting every chunk's rows) takes the t-th kind-0 record of its trace layer, around
 * again at the end. Kind-1 records, where the trace has one per token of a layer, stand in for
 * the pre-gating prediction of that layer.
 */
#ifndef SL_REPLAY_H
#define SL_REPLAY_H

#include "moe/trace.h"

typedef struct sl_route_replay {
    int32_t n_tokens; /* tokens of every trace layer (the fewest a layer has) */
    int32_t t_layers, n_experts, k;
    uint16_t *picks; /* [t_layers, n_tokens, k] in rank order */
    uint16_t *pred;  /* [t_layers, n_tokens, k] predictions, or NULL (pred_n 0) */
    uint8_t *pred_n; /* [t_layers, n_tokens] ids of each prediction (0: none) */
} sl_route_replay;

/* Loads the trace at path for a model of n_experts experts, k a token: the trace must have
 * both the same (an error naming the file otherwise). */
sl_status sl_route_replay_load(sl_route_replay *r, const char *path, int32_t n_experts, int32_t k,
                               sl_error *err);
void sl_route_replay_free(sl_route_replay *r);

/* Trace layer m's picks of its token t (any t >= 0: around again at the end). */
static inline const uint16_t *sl_route_replay_picks(const sl_route_replay *r, int32_t m,
                                                    int64_t t) {
    const int32_t tl = m % r->t_layers;
    return r->picks + ((size_t)tl * (size_t)r->n_tokens + (size_t)(t % r->n_tokens)) * (size_t)r->k;
}
/* Its prediction, *n ids (0: none). */
static inline const uint16_t *sl_route_replay_pred(const sl_route_replay *r, int32_t m, int64_t t,
                                                   int32_t *n) {
    const int32_t tl = m % r->t_layers;
    const size_t i = (size_t)tl * (size_t)r->n_tokens + (size_t)(t % r->n_tokens);
    *n = r->pred ? r->pred_n[i] : 0;
    return r->pred ? r->pred + i * (size_t)r->k : NULL;
}

#endif /* SL_REPLAY_H */
