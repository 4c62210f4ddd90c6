/*
 * The MoE router's selection step on the CPU (moe_route of the CPU backend; the CUDA
 * backend has its own warp version of the same math):
 * p = softmax(logits) over all experts in float32, the k largest p in
 * descending order (ties to the lower expert index), then optionally
 * renormalised so the k weights sum to one.
 */
#ifndef SL_TOPK_H
#define SL_TOPK_H

#include <stdint.h>

/* probs: scratch of n_experts floats, which may be logits itself (overwritten with the
 * probabilities). ids/weights: k entries, rank order. */
void sl_router_topk(const float *logits, int32_t n_experts, int32_t k, int renormalize,
                    float *probs, int32_t *ids, float *weights);

#endif /* SL_TOPK_H */
