/*
 * QSA (Qwen4-Exp): a token indexer in front of full attention picks which
 * positions each query attends to.
 *
 * index_qk_proj(x) gives idx_heads query heads and one raw key per token, of
 * idx_head_dim each. Queries are RMSNormed (1 + w) and roped at their position;
 * raw keys are cached. Every complete block of idx_ratio keys is mean-pooled,
 * normed (1 + w) and roped at the block's first position; those pooled keys
 * never change, so they are cached too. A query at position p scores the
 * complete blocks b < (p + 1) / ratio by
 *   score_b = sum over heads h of relu(q_h . k_b) / sqrt(idx_head_dim)
 * and attends to the idx_budget / ratio best blocks (ties to the lower block)
 * plus the incomplete tail of positions; with no more complete blocks than
 * that, it attends to everything, exactly as dense attention.
 */
#include <math.h>

#include "model/blocks.h"

sl_status blk_bind_indexer(sl_model *m, int32_t l, sl_error *err) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    const int64_t ihd = c->idx_head_dim;
    const char *p = "layers.%d.self_attn.indexer.%s";
    sl_status st;
    if ((st = sl_ckpt_bind(&m->ck, &L->idx_qk, SL_BIND_REQUIRED,
                           SL_DIMS((c->idx_heads + 1) * ihd, c->hidden_size), err, p, l,
                           "index_qk_proj.weight")) ||
        (st = sl_ckpt_bind(&m->ck, &L->idx_q_norm, SL_BIND_REQUIRED, SL_DIMS(ihd), err, p, l,
                           "q_layernorm.weight")) ||
        (st = sl_ckpt_bind(&m->ck, &L->idx_k_norm, SL_BIND_REQUIRED, SL_DIMS(ihd), err, p, l,
                           "k_layernorm.weight")))
        return st;
    return SL_OK;
}

void sl_qsa_pick(const float *scores, int32_t n, int32_t top, uint8_t *taken) {
    memset(taken, 0, (size_t)n);
    for (int32_t k = 0; k < top && k < n; k++) {
        int32_t best = -1;
        for (int32_t b = 0; b < n; b++) /* strictly greater: ties go to the lower block */
            if (!taken[b] && (best < 0 || scores[b] > scores[best])) best = b;
        taken[best] = 1;
    }
}

/* Pooled, normed and roped keys of the blocks that complete within this chunk. */
static void pool_blocks(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = &m->be;
    const sl_layer *L = &m->layers[l];
    const int32_t ihd = c->idx_head_dim, R = c->idx_ratio;
    const size_t nblk = (size_t)(s->max_ctx / R) + 1;
    const float *keys = s->idx_kcache + (size_t)l * (size_t)s->max_ctx * (size_t)ihd;
    float *blocks = s->idx_blocks + (size_t)l * nblk * (size_t)ihd;
    for (int32_t bk = s->pos / R; (bk + 1) * R <= s->pos + T; bk++) {
        float *k = blocks + (size_t)bk * (size_t)ihd;
        /* the mean of the block's R raw keys: their sum, then / R */
        be->ops->weighted_sum(be, k, keys + (size_t)bk * (size_t)R * (size_t)ihd, s->b.ones, 1, R,
                              ihd);
        be->ops->activate(be, k, k, (size_t)ihd, (float)R, 1.0f, SL_ACT_NONE);
        be->ops->rmsnorm(be, k, k, &L->idx_k_norm, 1, ihd, c->rms_norm_eps, m->norm_offset);
        be->ops->rope(be, k, 1, 1, ihd, c->rot_dim, bk * R, s->rope_cos, s->rope_sin);
    }
}

void blk_qsa_select(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = &m->be;
    const sl_layer *L = &m->layers[l];
    sl_session_buf *b = &s->b;
    const int32_t ih = c->idx_heads, ihd = c->idx_head_dim, R = c->idx_ratio;
    const int32_t top = c->idx_budget / R, stride = c->idx_budget + R - 1;
    const size_t nq = (size_t)ih * (size_t)ihd, row = nq + (size_t)ihd;
    const size_t nblk = (size_t)(s->max_ctx / R) + 1;
    float *keys = s->idx_kcache + (size_t)l * (size_t)s->max_ctx * (size_t)ihd;
    const float *blocks = s->idx_blocks + (size_t)l * nblk * (size_t)ihd;

    be->ops->matmul(be, b->idx_qk, b->xn, &L->idx_qk, NULL, T);
    be->ops->copy2d(be, b->idx_q, nq, b->idx_qk, row, T, (int32_t)nq);
    be->ops->copy2d(be, keys + (size_t)s->pos * (size_t)ihd, (size_t)ihd, b->idx_qk + nq, row, T,
                    ihd);
    be->ops->rmsnorm(be, b->idx_q, b->idx_q, &L->idx_q_norm, T * ih, ihd, c->rms_norm_eps,
                     m->norm_offset);
    be->ops->rope(be, b->idx_q, T, ih, ihd, c->rot_dim, s->pos, s->rope_cos, s->rope_sin);
    pool_blocks(s, l, T);

    /* The choice of blocks is made on the host from the scores; the lists go back. */
    for (int32_t t = 0; t < T; t++) {
        const int32_t p = s->pos + t, nb = (p + 1) / R;
        int32_t *sel = b->h_qsa_sel + (size_t)t * (size_t)stride, n = 0;
        if (nb <= top) { /* within the budget: dense */
            for (int32_t j = 0; j <= p; j++)
                sel[n++] = j;
            b->h_qsa_nsel[t] = n;
            continue;
        }
        const float *sc = b->h_qsa_scores;
        be->ops->qsa_scores(be, b->qsa_scores, b->idx_q + (size_t)t * nq, blocks, ih, nb, ihd);
        be->ops->to_host(be, b->h_qsa_scores, b->qsa_scores, (size_t)nb * sizeof(float));
        sl_qsa_pick(sc, nb, top, b->qsa_taken);
        for (int32_t bk = 0; bk < nb; bk++)
            for (int32_t j = 0; b->qsa_taken[bk] && j < R; j++)
                sel[n++] = bk * R + j;
        for (int32_t j = nb * R; j <= p; j++)
            sel[n++] = j;
        b->h_qsa_nsel[t] = n;
    }
    be->ops->to_dev(be, b->qsa_sel, b->h_qsa_sel, (size_t)T * (size_t)stride * sizeof(int32_t));
    be->ops->to_dev(be, b->qsa_nsel, b->h_qsa_nsel, (size_t)T * sizeof(int32_t));
}
