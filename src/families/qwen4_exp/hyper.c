/*
 * Hyper-connections (Qwen4-Exp): the residual stream is hc_count copies of the
 * hidden state, W [T, hc, H]. A sublayer reads a mix of the streams and its
 * output is injected back into each stream with its own weight:
 *
 *   n      = grouped_rmsnorm(W)                (one statistic per stream, 1 + w)
 *   w      = sigmoid(up(silu(down(n) / hc)))   [hc, H]
 *   mixed  = mean over c of w[c] * n[c]        [H]   -> the sublayer's input
 *   inj    = 2 * sigmoid(inject(n) / hc)       [hc]
 *   W[c]  += sublayer(mixed) * inj[c]          (onto the un-normalised streams)
 *
 * The final mixer has no inject; its mix feeds the LM head.
 */
#include "families/qwen4_exp/qwen4_exp.h"

/* Tensors of one gated residual under the printf prefix fmt (a layer index may follow). */
sl_status q4_bind_hyper(sl_model *m, sl_hyper *hy, int with_inject, sl_error *err, const char *fmt,
                        int32_t l) {
    const q4_config *qc = q4_cfg(m);
    const int64_t hcH = (int64_t)qc->hc_count * m->cfg.hidden_size, r = qc->hc_lowrank;
    char prefix[128], name[192];
    snprintf(prefix, sizeof prefix, fmt, l);
    sl_status st;
    snprintf(name, sizeof name, "%s.hc_norm.weight", prefix);
    if ((st = sl_ckpt_bind(&m->ck, &hy->norm, SL_BIND_REQUIRED, SL_DIMS(hcH), err, "%s", name)))
        return st;
    snprintf(name, sizeof name, "%s.input_mix_weight_down.weight", prefix);
    if ((st = sl_ckpt_bind(&m->ck, &hy->down, SL_BIND_REQUIRED, SL_DIMS(r, hcH), err, "%s", name)))
        return st;
    snprintf(name, sizeof name, "%s.input_mix_weight_up.weight", prefix);
    if ((st = sl_ckpt_bind(&m->ck, &hy->up, SL_BIND_REQUIRED, SL_DIMS(hcH, r), err, "%s", name)))
        return st;
    if (!with_inject) return SL_OK;
    snprintf(name, sizeof name, "%s.block_inject_weight.weight", prefix);
    return sl_ckpt_bind(&m->ck, &hy->inject, SL_BIND_REQUIRED, SL_DIMS(qc->hc_count, hcH), err,
                        "%s", name);
}

void q4_grouped_rmsnorm(sl_session *s, float *y, const float *x, const sl_tensor *w, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const int32_t hc = q4_cfg(m)->hc_count;
    const size_t H = (size_t)c->hidden_size, esz = sl_dtype_size(w->dtype);
    for (int32_t ch = 0; ch < hc; ch++) {
        sl_tensor wc = *w; /* the weights of stream ch */
        wc.data = (const uint8_t *)w->data + (size_t)ch * H * esz;
        wc.shape[0] = (int64_t)H;
        for (int32_t t = 0; t < T; t++) {
            const size_t off = ((size_t)t * (size_t)hc + (size_t)ch) * H;
            s->be->ops->rmsnorm(s->be, y + off, x + off, &wc, 1, (int32_t)H, c->rms_norm_eps,
                                m->norm_offset);
        }
    }
}

void q4_hyper_mix(sl_session *s, const sl_hyper *hy, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    const sl_backend *be = s->be;
    q4_session *b = q4_ses(s);
    const float hc = (float)qc->hc_count;
    const size_t hcH = (size_t)qc->hc_count * (size_t)c->hidden_size;
    q4_grouped_rmsnorm(s, b->hnorm, b->hres, &hy->norm, T);
    be->ops->matmul(be, b->hlow, b->hnorm, &hy->down, NULL, T);
    be->ops->activate(be, b->hlow, b->hlow, (size_t)T * (size_t)qc->hc_lowrank, hc, 1.0f,
                      SL_ACT_SILU);
    be->ops->matmul(be, b->hw, b->hlow, &hy->up, NULL, T);
    be->ops->activate(be, b->hw, b->hw, (size_t)T * hcH, 1.0f, 1.0f, SL_ACT_SIGMOID);
    be->ops->hc_mix(be, s->b.xn, b->hw, b->hnorm, T, qc->hc_count, c->hidden_size);
    if (!hy->inject.data) return;
    be->ops->matmul(be, b->hinj, b->hnorm, &hy->inject, NULL, T);
    be->ops->activate(be, b->hinj, b->hinj, (size_t)T * (size_t)qc->hc_count, hc, 2.0f,
                      SL_ACT_SIGMOID);
}

void q4_hyper_inject(sl_session *s, int32_t T) {
    const sl_model *m = s->model;
    const q4_session *b = q4_ses(s);
    s->be->ops->hc_inject(s->be, b->hres, s->b.out, b->hinj, T, q4_cfg(m)->hc_count,
                          m->cfg.hidden_size);
}
