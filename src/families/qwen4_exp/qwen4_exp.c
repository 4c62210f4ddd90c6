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
 * Its config keys are read in config.c, and what it adds to the model, its
 * layers and its sessions is declared in qwen4_exp.h; the hooks below own it.
 *
 *   W = [embed(ids)] * hc
 *   per layer: W += ple(W) (PLE layers)
 *              W += inject(mixer(mix(W)))     mixer: Gated DeltaNet or (QSA) attention
 *              W += inject(moe(mix(W)))
 *   logits = lm_head(final_mix(W))
 */
#include "families/qwen4_exp/qwen4_exp.h"

/* ------------------------------------------------------------- model */

static sl_status qwen4_exp_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    if (!qc || !qc->hc_count)
        return sl_fail(err, SL_ERR_FORMAT, "%s: qwen4_exp config without hc_count", m->ck.dir);
    q4_model *qm = sl_calloc(1, sizeof *qm, err);
    if (!qm) return SL_ERR_NOMEM;
    m->fam = qm;
    if (!(qm->layers = sl_calloc((size_t)c->n_layers, sizeof(q4_layer), err))) return SL_ERR_NOMEM;
    sl_status st = blk_bind_hybrid(m, BLK_LINEAR_SEPARATE, err);
    if (st) return st;
    if (qc->n_ple_layers && !(qm->ples = sl_calloc((size_t)qc->n_ple_layers, sizeof(sl_ple), err)))
        return SL_ERR_NOMEM;
    if ((st = q4_bind_hyper(m, &qm->hc_final, 0, err, "hyper_connection_mixer", 0))) return st;
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        if ((st = q4_bind_hyper(m, &qm->layers[l].hc_attn, 1, err,
                                "layers.%d.attn_hyper_connection", l)) ||
            (st = q4_bind_hyper(m, &qm->layers[l].hc_ffn, 1, err, "layers.%d.mlp_hyper_connection",
                                l)) ||
            (st = q4_bind_ple(m, l, err)))
            return st;
        if (!c->layer_is_linear[l] && qc->idx_heads) st = q4_bind_indexer(m, l, err);
    }
    return st;
}

/* PLE n-gram tables are read per token like experts: pread when streaming. */
static sl_status qwen4_exp_open(sl_model *m, const char *dir, int streamed, sl_error *err) {
    return q4_cfg(m)->n_ple_layers ? q4_ple_open_tables(m, dir, streamed, err) : SL_OK;
}

static int32_t qwen4_exp_weights(sl_model *m, sl_tensor **out, int32_t *layer) {
    q4_model *qm = q4_mod(m);
    int32_t n = 0, l = -1;
#define W(t)     (out ? (void)(out[n] = &(t)) : (void)0, layer ? (void)(layer[n] = l) : (void)0, n++)
#define HYPER(h) (W((h).norm), W((h).down), W((h).up), W((h).inject))
    l = m->cfg.n_layers; /* the final mixer: the head's side */
    HYPER(qm->hc_final);
    for (l = 0; l < m->cfg.n_layers; l++) {
        q4_layer *L = &qm->layers[l];
        HYPER(L->hc_attn);
        HYPER(L->hc_ffn);
        W(L->idx_qk), W(L->idx_k), W(L->idx_q_norm), W(L->idx_k_norm);
    }
    for (int32_t i = 0; i < q4_cfg(m)->n_ple_layers; i++) {
        sl_ple *P = &qm->ples[i];
        for (l = 0; l < m->cfg.n_layers && qm->layers[l].ple != P; l++) /* the layer it serves */
            ;
        W(P->key_proj), W(P->value_proj), W(P->norm_key), W(P->norm_query), W(P->norm_conv);
        W(P->conv);
    }
#undef HYPER
#undef W
    return n;
}

static void qwen4_exp_free(sl_model *m) {
    q4_model *qm = q4_mod(m);
    if (!qm) return;
    q4_ple_free(m);
    free(qm->layers);
    free(qm);
    m->fam = NULL;
}

static void qwen4_exp_info(const sl_model *m, sl_model_info *info) {
    const q4_config *qc = q4_cfg(m);
    int64_t ple_bytes = 0;
    for (int32_t i = 0; i < qc->n_ple_layers; i++)
        ple_bytes += q4_mod(m)->ples[i].table.rows * (int64_t)q4_mod(m)->ples[i].table.row_bytes;
    info->n_ple_layers = qc->n_ple_layers;
    info->ple_table_bytes = ple_bytes;
    info->ple_rows_per_token = qc->n_ple_layers ? q4_ngram_heads(qc) : 0;
}

/* ------------------------------------------------------------- session */

/* Hyper-connections, PLE and QSA buffers (each zero-sized when the config has none). */
static void qwen4_exp_layout(sl_session *s, sl_carver *cv, sl_carver *hv) {
    const sl_config *c = &s->model->cfg;
    const q4_config *qc = q4_cfg(s->model);
    q4_session *b = q4_ses(s);
    const size_t B = (size_t)s->max_batch, H = (size_t)c->hidden_size;
    const size_t hcH = (size_t)qc->hc_count * H, hb = qc->hc_count ? B : 0;
    const size_t pb = qc->n_ple_layers ? B : 0, G = pb ? (size_t)q4_ngram_heads(qc) : 0;
    const size_t D = pb ? (size_t)qc->ple_embed_dim : 0, NG = (size_t)qc->ngram_size;
    const size_t ple_conv = pb ? (size_t)(qc->ple_conv_kernel - 1) * NG : 0;
    const size_t ib = qc->idx_heads ? B : 0, ihd = (size_t)qc->idx_head_dim;
    const size_t nblk = qc->idx_heads ? (size_t)(s->max_ctx / qc->idx_ratio) + 1 : 0;
    /* the indexer's caches: the partition's layers' (all of them unsplit), layer l at l - layer0 */
    const size_t nidx = qc->idx_heads ? (size_t)(s->layer1 - s->layer0) : 0;
    const size_t stride = qc->idx_heads ? (size_t)(qc->idx_budget + qc->idx_ratio - 1) : 0;
    b->ones = sl_carve(cv, (size_t)SL_MAX(qc->idx_ratio, 1), sizeof(float));
    b->h_qsa_scores = sl_carve(hv, nblk, sizeof(float));
    b->h_qsa_sel = sl_carve(hv, ib * stride, sizeof(int32_t));
    b->h_qsa_nsel = sl_carve(hv, ib, sizeof(int32_t));
    b->h_ple_emb = sl_carve(hv, pb ? B * (size_t)qc->ple_embed_dim : 0, sizeof(float));
    b->hres = sl_carve(cv, hb * hcH, sizeof(float));
    b->hnorm = sl_carve(cv, hb * hcH, sizeof(float));
    b->hlow = sl_carve(cv, hb * (size_t)qc->hc_lowrank, sizeof(float));
    b->hw = sl_carve(cv, hb * hcH, sizeof(float));
    b->hinj = sl_carve(cv, hb * (size_t)qc->hc_count, sizeof(float));
    b->ple_hist = sl_carve(hv, pb * NG, sizeof(int32_t));
    b->ple_rows = sl_carve(hv, pb * G, sizeof(int64_t));
    b->ple_rowbuf = sl_carve(hv, pb * D * 4, 1); /* a row is at most dim x 4 bytes */
    b->ple_jobs = sl_carve(hv, pb * G, sizeof(sl_read_job));
    b->ple_emb = sl_carve(cv, pb * D, sizeof(float));
    b->ple_key = sl_carve(cv, pb * hcH, sizeof(float));
    b->ple_gate = sl_carve(cv, pb * hcH, sizeof(float));
    b->ple_val = sl_carve(cv, pb * H, sizeof(float));
    b->ple_norm = sl_carve(cv, pb * hcH, sizeof(float));
    b->ple_conv = sl_carve(cv, pb * hcH, sizeof(float));
    b->idx_qk = sl_carve(cv, ib * (size_t)(qc->idx_heads + 1) * ihd, sizeof(float));
    b->idx_q = sl_carve(cv, ib * (size_t)qc->idx_heads * ihd, sizeof(float));
    b->qsa_scores = sl_carve(cv, nblk, sizeof(float));
    b->qsa_taken = sl_carve(hv, nblk, 1);
    b->qsa_order = sl_carve(hv, nblk, sizeof(int32_t));
    b->qsa_sel = sl_carve(cv, ib * stride, sizeof(int32_t));
    b->qsa_nsel = sl_carve(cv, ib, sizeof(int32_t));
    b->idx_kcache = sl_carve(cv, nidx * (size_t)s->max_ctx * ihd, sizeof(float));
    b->idx_blocks = sl_carve(cv, nidx * nblk * ihd, sizeof(float));
    b->ple_ctx = sl_carve(hv, pb ? NG - 1 : 0, sizeof(int32_t));
    b->ple_conv_state_n = (size_t)qc->n_ple_layers * hcH * ple_conv;
    b->ple_conv_state = sl_carve(cv, b->ple_conv_state_n, sizeof(float));
}

static sl_status qwen4_exp_session_init(sl_session *s, sl_error *err) {
    const sl_backend *be = s->be;
    const float one = 1.0f;
    (void)err;
    for (int32_t i = 0; i < SL_MAX(q4_cfg(s->model)->idx_ratio, 1); i++)
        be->ops->to_dev(be, q4_ses(s)->ones + i, &one, sizeof one);
    return SL_OK;
}

static void qwen4_exp_reset(sl_session *s) {
    const sl_backend *be = s->be;
    const q4_config *qc = q4_cfg(s->model);
    q4_session *b = q4_ses(s);
    if (!qc->n_ple_layers) return;
    /* PLE's token history starts as EOS, as after the end of a previous document */
    for (int32_t i = 0; i < qc->ngram_size - 1; i++)
        b->ple_ctx[i] = s->model->cfg.eos_id;
    be->ops->fill(be, b->ple_conv_state, 0.0f, b->ple_conv_state_n);
}

/* PLE's token history and conv inputs summarise the tokens before: they cannot go back. The
 * indexer's caches are by position, like the KV cache. */
static int qwen4_exp_rewind(sl_session *s, int32_t pos) {
    (void)pos;
    return q4_cfg(s->model)->n_ple_layers > 0;
}

/* ------------------------------------------------------------- forward */

/* What crosses a partition boundary (blk_part_cross): the hc residual streams. */
static float *hres_of(sl_session *s) {
    return q4_ses(s)->hres;
}

static sl_status qwen4_exp_forward(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                                   int all_logits, sl_error *err) {
    sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    const q4_model *qm = q4_mod(m);
    const sl_backend *be = s->be;
    q4_session *b = q4_ses(s);
    const size_t H = (size_t)c->hidden_size, hc = (size_t)qc->hc_count;

    blk_embed(s, s->b.x, ids, T);
    for (size_t ch = 0; ch < hc; ch++) /* every stream starts as the embedding */
        be->ops->copy2d(be, b->hres + ch * H, hc * H, s->b.x, H, T, (int32_t)H);
    if (qc->n_ple_layers) q4_ple_history(s, ids, T);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const q4_layer *L = &qm->layers[l];
        sl_status st;
        if (L->ple && (st = q4_ple(s, l, T, err))) return st;
        q4_hyper_mix(s, &L->hc_attn, T);
        const double t0 = sl_now();
        if (m->layers[l].is_linear) {
            blk_linear_attention(s, l, T);
        } else {
            blk_attn_sel sel = {0};
            if (L->idx_qk.data) q4_qsa_select(s, l, T, &sel); /* which positions each query sees */
            blk_attention(s, l, T, L->idx_qk.data ? &sel : NULL);
        }
        m->stats.t_attention += sl_now() - t0;
        q4_hyper_inject(s, T);
        q4_hyper_mix(s, &L->hc_ffn, T);
        if ((st = blk_ffn(s, l, T, err))) return st;
        q4_hyper_inject(s, T);
        if (l + 1 == s->layer1 && l + 1 < c->n_layers) {
            /* a partition boundary: the residual streams cross; the next partition's PLE
             * history (its own) takes this chunk's tokens too */
            blk_part_cross(s, T, hres_of, hc * H);
            be = s->be, b = q4_ses(s);
            if (qc->n_ple_layers) q4_ple_history(s, ids, T);
        }
    }
    /* Only the rows whose logits are wanted go through the final mixer and head. */
    const int32_t first = all_logits ? 0 : T - 1, rows = T - first;
    if (first)
        be->ops->copy2d(be, b->hres, hc * H, b->hres + (size_t)first * hc * H, hc * H, 1,
                        (int32_t)(hc * H)); /* one row when first > 0 */
    q4_hyper_mix(s, &qm->hc_final, rows);
    blk_head(s, s->b.xn, rows, logits);
    return SL_OK;
}

/* ------------------------------------------------------------- access */

extern const sl_family sl_family_qwen4_exp;

const q4_config *q4_config_of(const sl_config *c) {
    return c->family == &sl_family_qwen4_exp ? c->fam : NULL;
}

const sl_ngram_table *q4_ngram_table(const sl_model *m, int32_t l) {
    const q4_model *qm = q4_config_of(&m->cfg) ? q4_mod(m) : NULL;
    return qm && qm->layers[l].ple ? &qm->layers[l].ple->table : NULL;
}

/* "qwen_sparse_attention" marks the full-attention layers the QSA indexer serves. */
static const char *const qwen4_exp_attn_types[] = {"qwen_sparse_attention", NULL};

const sl_family sl_family_qwen4_exp = {
    .arch = "qwen4_exp",
    .norm_offset = 1.0f,
    .read_config = q4_read_config,
    .attn_layer_types = qwen4_exp_attn_types,
    .bind = qwen4_exp_bind,
    .open = qwen4_exp_open,
    .weights = qwen4_exp_weights,
    .free_model = qwen4_exp_free,
    .info = qwen4_exp_info,
    .session_size = sizeof(q4_session),
    .session_layout = qwen4_exp_layout,
    .session_init = qwen4_exp_session_init,
    .session_reset = qwen4_exp_reset,
    .session_rewind = qwen4_exp_rewind,
    .forward = qwen4_exp_forward,
    .splits = 1,
    .own_norms = 1,
};
