/* Router top-k (contract in router.h). */
#include "kernels/topk.h"

#include <math.h>

/* (p, i) ranks before (q, j) when p > q, or p == q and i < j. */
static int ranks_before(float p, int32_t i, float q, int32_t j) {
    return p > q || (p == q && i < j);
}

void sl_router_topk(const float *logits, int32_t n_experts, int32_t k, int renormalize,
                    float *probs, int32_t *ids, float *weights) {
    float mx = -INFINITY;
    for (int32_t e = 0; e < n_experts; e++)
        mx = fmaxf(mx, logits[e]);
    float sum = 0;
    for (int32_t e = 0; e < n_experts; e++) {
        probs[e] = expf(logits[e] - mx);
        sum += probs[e];
    }
    for (int32_t e = 0; e < n_experts; e++)
        probs[e] /= sum;
    /* k passes of selection, each taking the best entry ranked after the previous pick.
     * O(k * E) with no per-expert flags, so any expert count works. */
    for (int32_t r = 0; r < k; r++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_experts; e++) {
            if (r > 0 && !ranks_before(probs[ids[r - 1]], ids[r - 1], probs[e], e)) continue;
            if (best < 0 || ranks_before(probs[e], e, probs[best], best)) best = e;
        }
        if (best < 0) best = r; /* only NaN logits get here: keep ids valid and distinct */
        ids[r] = best;
        weights[r] = probs[best];
    }
    if (renormalize) {
        float s = 0;
        for (int32_t r = 0; r < k; r++)
            s += weights[r];
        for (int32_t r = 0; r < k; r++)
            weights[r] /= s;
    }
}
