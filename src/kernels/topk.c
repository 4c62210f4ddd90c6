/* Router top-k (contracts in topk.h and ops.h). */
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

const char *sl_route_cfg_check(const sl_route_cfg *cfg, int32_t E, int32_t k) {
    if (cfg->score < SL_ROUTE_SOFTMAX || cfg->score > SL_ROUTE_TOPK_SIGMOID)
        return "unknown router scoring";
    if (k < 1 || k > E) return "experts per token must be 1 .. the expert count";
    if (cfg->n_group > 1) {
        if (cfg->score != SL_ROUTE_SIGMOID) return "expert groups need sigmoid routing";
        if (cfg->n_group > SL_ROUTE_MAX_GROUPS) return "n_group is above 64";
        if (E % cfg->n_group) return "n_group does not divide the expert count";
        if (E / cfg->n_group < 2) return "expert groups need at least 2 experts each";
        if (cfg->topk_group < 1 || cfg->topk_group > cfg->n_group)
            return "topk_group must be 1 .. n_group";
        if ((int64_t)k > (int64_t)cfg->topk_group * (E / cfg->n_group))
            return "topk_group groups hold fewer experts than a token picks";
    }
    if (!(cfg->scale >= 0.0f) || isinf(cfg->scale)) return "routed scale is not a finite >= 0";
    return NULL;
}

/* Element e of a [E] F32/F16/BF16 host tensor, widened. */
static float elem(const sl_tensor *t, int32_t e) {
    float v;
    sl_to_f32(&v, t->data, t->dtype, (size_t)e, 1);
    return v;
}

static float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* The key SIGMOID picks by: the score plus its selection bias. */
static float biased(const float *s, const sl_tensor *sb, int32_t e) {
    return sb ? s[e] + elem(sb, e) : s[e];
}

/* k passes of selection over key(e) (l, or s + select_bias), each taking the best entry ranked
 * after the previous pick, among experts whose group is allowed (allowed NULL: all; ng experts
 * a group). O(k * E) with no per-expert flags, so any expert count works. */
static void select_k(const float *l, const sl_tensor *sb, int32_t E, int32_t k,
                     const uint8_t *allowed, int32_t ng, int32_t *ids) {
    float prev = 0;
    for (int32_t r = 0; r < k; r++) {
        int32_t best = -1;
        float bk = 0;
        for (int32_t e = 0; e < E; e++) {
            if (allowed && !allowed[e / ng]) continue;
            const float v = biased(l, sb, e);
            if (r > 0 && !ranks_before(prev, ids[r - 1], v, e)) continue;
            if (best < 0 || ranks_before(v, e, bk, best)) best = e, bk = v;
        }
        if (best < 0) best = r, bk = biased(l, sb, r); /* only NaN gets here: keep ids valid */
        ids[r] = best;
        prev = bk;
    }
}

/* The groups SIGMOID picks from: a group scores the sum of its two largest keys; the
 * topk_group best (ties to the lower group) are allowed. */
static void select_groups(const float *s, const sl_tensor *sb, int32_t n_group, int32_t ng,
                          int32_t topk_group, uint8_t *allowed) {
    float gs[SL_ROUTE_MAX_GROUPS];
    for (int32_t g = 0; g < n_group; g++) {
        int32_t i1 = -1, i2 = -1;
        for (int32_t e = g * ng; e < (g + 1) * ng; e++) {
            const float v = biased(s, sb, e);
            if (i1 < 0 || ranks_before(v, e, biased(s, sb, i1), i1))
                i2 = i1, i1 = e;
            else if (i2 < 0 || ranks_before(v, e, biased(s, sb, i2), i2))
                i2 = e;
        }
        gs[g] = biased(s, sb, i1) + biased(s, sb, i2);
    }
    for (int32_t g = 0; g < n_group; g++) {
        int32_t rank = 0;
        for (int32_t h = 0; h < n_group; h++)
            rank += ranks_before(gs[h], h, gs[g], g);
        allowed[g] = rank < topk_group;
    }
}

void sl_route_topk(float *l, int32_t E, int32_t k, const sl_route_cfg *cfg,
                   const sl_tensor *select_bias, const sl_tensor *expert_scale, int32_t *ids,
                   float *w) {
    switch (cfg->score) {
    case SL_ROUTE_SOFTMAX: sl_router_topk(l, E, k, cfg->renormalize, l, ids, w); break;
    case SL_ROUTE_TOPK_SOFTMAX:
    case SL_ROUTE_TOPK_SIGMOID: {
        select_k(l, NULL, E, k, NULL, 1, ids);
        if (cfg->score == SL_ROUTE_TOPK_SIGMOID) {
            for (int32_t r = 0; r < k; r++)
                w[r] = sigmoidf(l[ids[r]]);
        } else {
            const float mx = l[ids[0]]; /* the largest (NaN aside) */
            float sum = 0;
            for (int32_t r = 0; r < k; r++)
                sum += w[r] = expf(l[ids[r]] - mx);
            for (int32_t r = 0; r < k; r++)
                w[r] /= sum;
        }
        if (cfg->renormalize) {
            float s = 0;
            for (int32_t r = 0; r < k; r++)
                s += w[r];
            for (int32_t r = 0; r < k; r++)
                w[r] /= s;
        }
        break;
    }
    case SL_ROUTE_SIGMOID: {
        for (int32_t e = 0; e < E; e++)
            l[e] = sigmoidf(l[e]);
        uint8_t allowed[SL_ROUTE_MAX_GROUPS];
        const int grouped = cfg->n_group > 1;
        const int32_t ng = grouped ? E / cfg->n_group : 1;
        if (grouped) select_groups(l, select_bias, cfg->n_group, ng, cfg->topk_group, allowed);
        select_k(l, select_bias, E, k, grouped ? allowed : NULL, ng, ids);
        for (int32_t r = 0; r < k; r++)
            w[r] = l[ids[r]];
        if (cfg->renormalize) {
            float s = 0;
            for (int32_t r = 0; r < k; r++)
                s += w[r];
            s += 1e-20f;
            for (int32_t r = 0; r < k; r++)
                w[r] /= s;
        }
        break;
    }
    }
    if (expert_scale)
        for (int32_t r = 0; r < k; r++)
            w[r] *= elem(expert_scale, ids[r]);
    if (cfg->scale != 0.0f && cfg->scale != 1.0f)
        for (int32_t r = 0; r < k; r++)
            w[r] *= cfg->scale;
}
