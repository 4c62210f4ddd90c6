/*
 * The MoE router's selection step on the CPU (moe_route of the CPU backend; the CUDA
 * backend has its own versions of the same math): the scores of one token's E logits,
 * the k best (ties to the lower expert index) and their weights, all in float32, as
 * sl_route_score describes (kernels/ops.h).
 */
#ifndef SL_TOPK_H
#define SL_TOPK_H

#include "kernels/ops.h"

/* SL_ROUTE_SOFTMAX alone: p = softmax(logits), the k largest p in descending order, optionally
 * renormalised so the k weights sum to one. probs: scratch of n_experts floats, which may be
 * logits itself (overwritten with the probabilities). ids/weights: k entries, rank order. */
void sl_router_topk(const float *logits, int32_t n_experts, int32_t k, int renormalize,
                    float *probs, int32_t *ids, float *weights);

/* One token's route under cfg: l (E logits, bias included) becomes the scores moe_route
 * leaves in its logits; select_bias and expert_scale are [E] tensors in host memory (F32, F16
 * or BF16), or NULL. Any E; n_group at most SL_ROUTE_MAX_GROUPS. */
void sl_route_topk(float *l, int32_t E, int32_t k, const sl_route_cfg *cfg,
                   const sl_tensor *select_bias, const sl_tensor *expert_scale, int32_t *ids,
                   float *w);

#endif /* SL_TOPK_H */
