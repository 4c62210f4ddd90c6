/*
 * Gated DeltaNet, the linear attention of Qwen3-Next and Qwen3.5 (contracts in
 * blocks.h). Per token:
 *
 *   x --in_proj--> mixed [q | k | v] (conv_dim), z [nv, dv], b [nv], a [nv]
 *   mixed --causal depthwise conv (kernel K) + SiLU--> q [nk, dk], k [nk, dk], v [nv, dv]
 *   q, k L2-normalised per head; value head h reads key head h / (nv / nk)
 *   S_h = exp(g) S_h + k (beta (v - S_h^T k))^T;  o_h = S_h^T q / sqrt(dk)
 *   y_h = w * rmsnorm(o_h) * silu(z_h);  out = out_proj(y)
 *
 * The conv keeps the last K-1 inputs and the recurrence its [dk, dv] state per
 * value head, both in the session. Every token takes the same path, so prefill,
 * chunked prefill and decode give the same bits.
 *
 * Qwen3-Next fuses the projections and interleaves them per key-head group g
 * (r = nv / nk value heads per group):
 *
 *   in_proj_qkvz row block g: | q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv) |
 *   in_proj_ba   row block g: | b_g (r)  | a_g (r)  |
 *
 * Qwen3.5 keeps them apart, in_proj_qkv already in conv order [q_all | k_all | v_all]. A GGUF
 * file of Qwen3-Next (llama.cpp's converter) has in_proj_qkvz split that way into in_proj_qkv
 * and in_proj_z, and in_proj_ba as it was.
 */
#include <math.h>

#include "model/blocks.h"

sl_status blk_bind_linear_attention(sl_model *m, int32_t l, blk_linear_proj proj, sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_ckpt *ck = &m->ck;
    sl_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size, nv = c->lin_n_value_heads, dv = c->lin_value_dim;
    const int64_t kd = (int64_t)c->lin_n_key_heads * c->lin_key_dim, vd = nv * dv;
    const int64_t cd = 2 * kd + vd;
    const char *p = "layers.%d.linear_attn.%s";
    sl_status st;
    L->is_linear = 1;
    if ((st = sl_ckpt_bind(ck, &L->attn_norm, blk_norm_flags(m), SL_DIMS(H), err,
                           "layers.%d.input_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &L->conv_w, SL_BIND_REQUIRED, SL_DIMS(cd, 1, c->lin_conv_kernel),
                           err, p, l, "conv1d.weight")) ||
        (st = sl_ckpt_bind(ck, &L->A_log, SL_BIND_REQUIRED, SL_DIMS(nv), err, p, l, "A_log")) ||
        (st = sl_ckpt_bind(ck, &L->dt_bias, SL_BIND_REQUIRED, SL_DIMS(nv), err, p, l, "dt_bias")) ||
        (st = sl_ckpt_bind(ck, &L->lin_norm, SL_BIND_REQUIRED, SL_DIMS(dv), err, p, l,
                           "norm.weight")) ||
        (st = sl_ckpt_bind(ck, &L->out_proj, SL_BIND_REQUIRED, SL_DIMS(H, vd), err, p, l,
                           "out_proj.weight")))
        return st;
    char qkvz[96];
    snprintf(qkvz, sizeof qkvz, "layers.%d.linear_attn.in_proj_qkvz.weight", l);
    if (proj == BLK_LINEAR_FUSED && sl_ckpt_find(ck, qkvz))
        return (st = sl_ckpt_bind(ck, &L->in_qkvz, SL_BIND_REQUIRED, SL_DIMS(cd + vd, H), err, p, l,
                                  "in_proj_qkvz.weight"))
                   ? st
                   : sl_ckpt_bind(ck, &L->in_ba, SL_BIND_REQUIRED, SL_DIMS(2 * nv, H), err, p, l,
                                  "in_proj_ba.weight");
    if ((st = sl_ckpt_bind(ck, &L->in_qkv, SL_BIND_REQUIRED, SL_DIMS(cd, H), err, p, l,
                           "in_proj_qkv.weight")) ||
        (st = sl_ckpt_bind(ck, &L->in_z, SL_BIND_REQUIRED, SL_DIMS(vd, H), err, p, l,
                           "in_proj_z.weight")))
        return st;
    if (proj == BLK_LINEAR_FUSED)
        return sl_ckpt_bind(ck, &L->in_ba, SL_BIND_REQUIRED, SL_DIMS(2 * nv, H), err, p, l,
                            "in_proj_ba.weight");
    if ((st = sl_ckpt_bind(ck, &L->in_b, SL_BIND_REQUIRED, SL_DIMS(nv, H), err, p, l,
                           "in_proj_b.weight")))
        return st;
    return sl_ckpt_bind(ck, &L->in_a, SL_BIND_REQUIRED, SL_DIMS(nv, H), err, p, l,
                        "in_proj_a.weight");
}

/* Qwen3-Next's group-interleaved ba rows -> b, a: per key-head group, strided copies over all T
 * tokens at once. */
static void split_ba(const sl_backend *be, sl_session_buf *b, const sl_config *c, int32_t T) {
    const size_t nk = (size_t)c->lin_n_key_heads, nv = (size_t)c->lin_n_value_heads, r = nv / nk;
    for (size_t g = 0; g < nk; g++) {
        const float *ba = b->lin_ba + g * 2 * r;
        be->ops->copy2d(be, b->lin_b + g * r, nv, ba, 2 * nv, T, (int32_t)r);
        be->ops->copy2d(be, b->lin_a + g * r, nv, ba + r, 2 * nv, T, (int32_t)r);
    }
}

/* Qwen3-Next's group-interleaved qkvz rows -> mixed [q_all | k_all | v_all], z, likewise. */
static void split_fused(const sl_backend *be, sl_session_buf *b, const sl_config *c, int32_t T) {
    const size_t nk = (size_t)c->lin_n_key_heads, dk = (size_t)c->lin_key_dim;
    const size_t r = (size_t)(c->lin_n_value_heads / c->lin_n_key_heads);
    const size_t rdv = r * (size_t)c->lin_value_dim, kd = nk * dk, vd = nk * rdv;
    const size_t cd = 2 * kd + vd, grp = 2 * dk + 2 * rdv;
    const sl_ops *op = be->ops;
    for (size_t g = 0; g < nk; g++) {
        const float *sg = b->lin_proj + g * grp;
        op->copy2d(be, b->lin_mixed + g * dk, cd, sg, nk * grp, T, (int32_t)dk);
        op->copy2d(be, b->lin_mixed + kd + g * dk, cd, sg + dk, nk * grp, T, (int32_t)dk);
        op->copy2d(be, b->lin_mixed + 2 * kd + g * rdv, cd, sg + 2 * dk, nk * grp, T, (int32_t)rdv);
        op->copy2d(be, b->lin_z + g * rdv, vd, sg + 2 * dk + rdv, nk * grp, T, (int32_t)rdv);
    }
    split_ba(be, b, c, T);
}

void blk_linear_attention(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    const sl_layer *L = &m->layers[l];
    sl_session_buf *b = &s->b;
    const int32_t nk = c->lin_n_key_heads, nv = c->lin_n_value_heads;
    const int32_t dk = c->lin_key_dim, dv = c->lin_value_dim, K = c->lin_conv_kernel;
    const size_t kd = (size_t)nk * (size_t)dk, vd = (size_t)nv * (size_t)dv, cd = 2 * kd + vd;

    if (L->in_qkvz.data) {
        op->matmul(be, b->lin_proj, b->xn, &L->in_qkvz, NULL, T);
        op->matmul(be, b->lin_ba, b->xn, &L->in_ba, NULL, T);
        split_fused(be, b, c, T);
    } else {
        op->matmul(be, b->lin_mixed, b->xn, &L->in_qkv, NULL, T);
        op->matmul(be, b->lin_z, b->xn, &L->in_z, NULL, T);
        if (L->in_ba.data) {
            op->matmul(be, b->lin_ba, b->xn, &L->in_ba, NULL, T);
            split_ba(be, b, c, T);
        } else {
            op->matmul(be, b->lin_b, b->xn, &L->in_b, NULL, T);
            op->matmul(be, b->lin_a, b->xn, &L->in_a, NULL, T);
        }
    }

    /* the conv and the delta rule carry each sequence's state: a call per row of a batch */
    const int32_t calls = blk_row_calls(s, T), Tc = T / calls;
    for (int32_t i = 0; i < calls; i++) {
        const sl_session *r = blk_row_session(s, i);
        float *conv_state = r->conv_state + (size_t)(l - r->layer0) * cd * (size_t)(K - 1);
        op->conv1d_silu(be, b->lin_conv + (size_t)i * cd, b->lin_mixed + (size_t)i * cd, Tc,
                        (int32_t)cd, &L->conv_w, K, 1, conv_state);
    }
    op->copy2d(be, b->lin_q, kd, b->lin_conv, cd, T, (int32_t)kd);
    op->copy2d(be, b->lin_k, kd, b->lin_conv + kd, cd, T, (int32_t)kd);
    op->copy2d(be, b->lin_v, vd, b->lin_conv + 2 * kd, cd, T, (int32_t)vd);
    op->l2norm(be, b->lin_q, T * nk, dk, 1e-6f);
    op->l2norm(be, b->lin_k, T * nk, dk, 1e-6f);

    for (int32_t i = 0; i < calls; i++) {
        const sl_session *r = blk_row_session(s, i);
        const size_t ko = (size_t)i * kd, vo = (size_t)i * vd, ho = (size_t)i * (size_t)nv;
        const sl_delta_args a = {
            .out = b->lin_o + vo,
            .q = b->lin_q + ko,
            .k = b->lin_k + ko,
            .v = b->lin_v + vo,
            .a = b->lin_a + ho,
            .b = b->lin_b + ho,
            .A_log = &L->A_log,
            .dt_bias = &L->dt_bias,
            .state =
                r->delta_state + (size_t)(l - r->layer0) * (size_t)nv * (size_t)dk * (size_t)dv,
            .T = Tc,
            .nk = nk,
            .nv = nv,
            .dk = dk,
            .dv = dv,
            .q_scale = 1.0f / sqrtf((float)dk),
            .A_neg_exp = m->ck.A_neg_exp,
            .v_tiled = m->ck.v_tiled,
        };
        op->delta_rule(be, &a);
    }
    op->gated_rmsnorm(be, b->lin_o, b->lin_o, b->lin_z, &L->lin_norm, T * nv, dv, c->rms_norm_eps,
                      c->lin_gate_sigmoid ? SL_ACT_SIGMOID : SL_ACT_SILU);
    op->matmul(be, b->out, b->lin_o, &L->out_proj, NULL, T);
}
