/*
 * Qwen4-Exp (model_type "qwen4_exp_text", and "qwen4_exp" for the
 * vision-language checkpoint, whose text model sits under model.language_model.
 * and whose vision tower is not bound). The Qwen3.5 hybrid (Gated DeltaNet with
 * separate projections, gated attention, MoE with a gated shared expert) with:
 *
 *   - hyper-connections: the residual is hc_count streams; each sublayer reads
 *     their mix and injects its output back (hyper.c); no layer norms, and the
 *     final mixer replaces the final norm;
 *   - PLE on the layers of ple_layer_ids: hashed n-gram embeddings added to the
 *     streams before the mixer (ple.c), their tables read row by row from disk;
 *   - QSA on the full-attention layers when the config has an indexer (qsa.c);
 *   - Gated DeltaNet's output gate may be sigmoid (output_gate_type).
 *
 *   W = [embed(ids)] * hc
 *   per layer: W += ple(W) (PLE layers)
 *              W += inject(mixer(mix(W)))     mixer: Gated DeltaNet or (QSA) attention
 *              W += inject(moe(mix(W)))
 *   logits = lm_head(final_mix(W))
 */
#include "model/blocks.h"

static sl_status qwen4_exp_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    if (!c->hc_count)
        return sl_fail(err, SL_ERR_FORMAT, "%s: qwen4_exp config without hc_count", m->ck.dir);
    sl_status st = blk_bind_hybrid(m, BLK_LINEAR_SEPARATE, err);
    if (st) return st;
    if (c->n_ple_layers && !(m->ples = sl_calloc((size_t)c->n_ple_layers, sizeof(sl_ple), err)))
        return SL_ERR_NOMEM;
    if ((st = blk_bind_hyper(m, &m->hc_final, 0, err, "hyper_connection_mixer", 0))) return st;
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        if ((st = blk_bind_hyper(m, &m->layers[l].hc_attn, 1, err,
                                 "layers.%d.attn_hyper_connection", l)) ||
            (st = blk_bind_hyper(m, &m->layers[l].hc_ffn, 1, err, "layers.%d.mlp_hyper_connection",
                                 l)) ||
            (st = blk_bind_ple(m, l, err)))
            return st;
        if (!c->layer_is_linear[l] && c->idx_heads) st = blk_bind_indexer(m, l, err);
    }
    return st;
}

static sl_status qwen4_exp_forward(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                                   int all_logits, sl_error *err) {
    sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = &m->be;
    sl_session_buf *b = &s->b;
    const size_t H = (size_t)c->hidden_size, hc = (size_t)c->hc_count;

    blk_embed(s, b->x, ids, T);
    for (size_t ch = 0; ch < hc; ch++) /* every stream starts as the embedding */
        be->ops->copy2d(be, b->hres + ch * H, hc * H, b->x, H, T, (int32_t)H);
    if (c->n_ple_layers) blk_ple_history(s, ids, T);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        sl_status st;
        if (L->ple && (st = blk_ple(s, l, T, err))) return st;
        blk_hyper_mix(s, &L->hc_attn, T);
        const double t0 = sl_now();
        if (L->is_linear)
            blk_linear_attention(s, l, T);
        else
            blk_attention(s, l, T);
        m->stats.t_attention += sl_now() - t0;
        blk_hyper_inject(s, T);
        blk_hyper_mix(s, &L->hc_ffn, T);
        if ((st = blk_ffn(s, l, T, err))) return st;
        blk_hyper_inject(s, T);
    }
    /* Only the rows whose logits are wanted go through the final mixer and head. */
    const int32_t first = all_logits ? 0 : T - 1, rows = T - first;
    if (first)
        be->ops->copy2d(be, b->hres, hc * H, b->hres + (size_t)first * hc * H, hc * H, 1,
                        (int32_t)(hc * H)); /* one row when first > 0 */
    blk_hyper_mix(s, &m->hc_final, rows);
    blk_head(s, b->xn, rows, logits);
    return SL_OK;
}

const sl_family sl_family_qwen4_exp = {
    .arch = "qwen4_exp",
    .norm_offset = 1.0f,
    .bind = qwen4_exp_bind,
    .forward = qwen4_exp_forward,
};

const sl_family sl_family_qwen4_exp_text = {
    .arch = "qwen4_exp_text",
    .norm_offset = 1.0f,
    .bind = qwen4_exp_bind,
    .forward = qwen4_exp_forward,
};
