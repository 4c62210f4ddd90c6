/* Shared decoder blocks (contracts in blocks.h). */
#include "model/blocks.h"

#include "model/expert_relayout.h"

#include <math.h>

/* ------------------------------------------------------------- binding */

/* A family with norms of its own (Qwen4-Exp's hyper-connections) has none of
 * input_layernorm, post_attention_layernorm and norm in its checkpoint. */
int blk_norm_flags(const sl_model *m) {
    return m->family->own_norms ? SL_BIND_OPTIONAL : SL_BIND_REQUIRED;
}

sl_status blk_bind_globals(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const int64_t V = c->vocab_size, H = c->hidden_size;
    sl_status st;
    if ((st = sl_ckpt_bind(&m->ck, &m->embed, SL_BIND_REQUIRED, SL_DIMS(V, H), err,
                           "embed_tokens.weight")) ||
        (st = sl_ckpt_bind(&m->ck, &m->norm, blk_norm_flags(m), SL_DIMS(H), err, "norm.weight")))
        return st;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        return SL_OK;
    }
    return sl_ckpt_bind(&m->ck, &m->lm_head, SL_BIND_REQUIRED, SL_DIMS(V, H), err, "/%s",
                        m->ck.head);
}

sl_status blk_bind_attention(sl_model *m, int32_t l, const blk_attn_opts *o, sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_ckpt *ck = &m->ck;
    sl_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size, hd = c->head_dim;
    const int64_t nq = c->n_heads * hd, nkv = c->n_kv_heads * hd;
    const int64_t nq_proj = o->gated ? 2 * nq : nq;
    const int bias = o->qkv_bias ? SL_BIND_REQUIRED : SL_BIND_OPTIONAL;
    L->attn_gated = o->gated;
    const char *p = "layers.%d.self_attn.%s";
    sl_status st;
    if ((st = sl_ckpt_bind(ck, &L->attn_norm, blk_norm_flags(m), SL_DIMS(H), err,
                           "layers.%d.input_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &L->wq, SL_BIND_REQUIRED, SL_DIMS(nq_proj, H), err, p, l,
                           "q_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &L->wk, SL_BIND_REQUIRED, SL_DIMS(nkv, H), err, p, l,
                           "k_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &L->wv, SL_BIND_REQUIRED, SL_DIMS(nkv, H), err, p, l,
                           "v_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &L->wo, SL_BIND_REQUIRED, SL_DIMS(H, nq), err, p, l,
                           "o_proj.weight")))
        return st;
    if (o->qkv_bias &&
        ((st = sl_ckpt_bind(ck, &L->bq, bias, SL_DIMS(nq), err, p, l, "q_proj.bias")) ||
         (st = sl_ckpt_bind(ck, &L->bk, bias, SL_DIMS(nkv), err, p, l, "k_proj.bias")) ||
         (st = sl_ckpt_bind(ck, &L->bv, bias, SL_DIMS(nkv), err, p, l, "v_proj.bias"))))
        return st;
    if (o->o_bias &&
        (st = sl_ckpt_bind(ck, &L->bo, SL_BIND_REQUIRED, SL_DIMS(H), err, p, l, "o_proj.bias")))
        return st;
    if (o->qk_norm && ((st = sl_ckpt_bind(ck, &L->q_norm, SL_BIND_REQUIRED, SL_DIMS(hd), err, p, l,
                                          "q_norm.weight")) ||
                       (st = sl_ckpt_bind(ck, &L->k_norm, SL_BIND_REQUIRED, SL_DIMS(hd), err, p, l,
                                          "k_norm.weight"))))
        return st;
    L->qk_norm_full = o->qk_norm_full;
    L->qkv_clip = o->qkv_clip;
    if (o->qk_norm_full && ((st = sl_ckpt_bind(ck, &L->q_norm, SL_BIND_REQUIRED, SL_DIMS(nq), err,
                                               p, l, "q_norm.weight")) ||
                            (st = sl_ckpt_bind(ck, &L->k_norm, SL_BIND_REQUIRED, SL_DIMS(nkv), err,
                                               p, l, "k_norm.weight"))))
        return st;
    if (o->sinks && (st = sl_ckpt_bind(ck, &L->sinks, SL_BIND_REQUIRED, SL_DIMS(c->n_heads), err, p,
                                       l, "sinks")))
        return st;
    L->window = c->layer_is_sliding && c->layer_is_sliding[l] ? c->sliding_window : 0;
    return SL_OK;
}

/* gate/up [I, H] and down [H, I] of an MLP under `prefix`. */
static sl_status bind_mlp(const sl_ckpt *ck, sl_tensor *g, sl_tensor *u, sl_tensor *d, int64_t H,
                          int64_t I, const char *prefix, int32_t l, sl_error *err) {
    sl_status st;
    char fmt[160];
    snprintf(fmt, sizeof fmt, "layers.%%d.%s.%%s.weight", prefix);
    if ((st = sl_ckpt_bind(ck, g, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, "gate_proj")) ||
        (st = sl_ckpt_bind(ck, u, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, "up_proj")) ||
        (st = sl_ckpt_bind(ck, d, SL_BIND_REQUIRED, SL_DIMS(H, I), err, fmt, l, "down_proj")))
        return st;
    return SL_OK;
}

/* The family's FFN names (sl_family.ffn_name, router_name). */
static const char *ffn_name(const sl_model *m) {
    return m->family->ffn_name ? m->family->ffn_name : "mlp";
}

sl_status blk_bind_decoder(sl_model *m, const blk_attn_opts *attn, const blk_ffn_opts *ffn,
                           sl_error *err) {
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++)
        if (!(st = blk_bind_attention(m, l, attn, err))) st = blk_bind_ffn(m, l, ffn, err);
    return st;
}

sl_status blk_bind_ffn(sl_model *m, int32_t l, const blk_ffn_opts *o, sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_ckpt *ck = &m->ck;
    sl_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size;
    const char *ffn = ffn_name(m);
    const char *router = m->family->router_name ? m->family->router_name : "gate";
    char shared[96], shared_experts[96];
    snprintf(shared, sizeof shared, "%s.shared_expert", ffn);
    snprintf(shared_experts, sizeof shared_experts, "%s.shared_experts", ffn);
    sl_status st;
    if ((st = sl_ckpt_bind(ck, &L->ffn_norm, blk_norm_flags(m), SL_DIMS(H), err,
                           "layers.%d.post_attention_layernorm.weight", l)))
        return st;
    L->is_moe = c->layer_is_moe[l];
    if (!L->is_moe) {
        if (c->intermediate_size <= 0)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s/config.json: layer %d is dense but "
                           "intermediate_size is not set",
                           m->ck.dir, l);
        return bind_mlp(ck, &L->mlp_gate, &L->mlp_up, &L->mlp_down, H, c->intermediate_size, ffn, l,
                        err);
    }
    if ((st = sl_ckpt_bind(ck, &L->router, SL_BIND_REQUIRED, SL_DIMS(c->n_experts, H), err,
                           "layers.%d.%s.%s.weight", l, ffn, router)))
        return st;
    if (o->select_bias &&
        (st = sl_ckpt_bind(ck, &L->select_bias, SL_BIND_REQUIRED, SL_DIMS(c->n_experts), err,
                           "layers.%d.%s.%s.e_score_correction_bias", l, ffn, router)))
        return st;
    if (!o->shared_expert && !o->shared_experts) return SL_OK;
    if (c->shared_intermediate_size <= 0)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s/config.json: the shared expert's intermediate size "
                       "is not set",
                       m->ck.dir);
    if ((st = bind_mlp(ck, &L->sh_gate, &L->sh_up, &L->sh_down, H, c->shared_intermediate_size,
                       o->shared_experts ? shared_experts : shared, l, err)) ||
        o->shared_experts || o->shared_ungated)
        return st;
    return sl_ckpt_bind(ck, &L->sh_router, SL_BIND_REQUIRED, SL_DIMS(1, H), err,
                        "layers.%d.%s_gate.weight", l, shared);
}

/* Layer l's routed experts of a checkpoint into ex[E]: fused tensors (gate_up_proj [E, 2I, H],
 * down_proj [E, H, I]) if it has them, else stacked ones (gate_proj and up_proj [E, I, H],
 * down_proj: GGUF's ffn_*_exps), else one set per expert. */
static sl_status bind_hf_experts(const sl_ckpt *ck, sl_expert *ex, int32_t l, int32_t E, int64_t H,
                                 int64_t I, const char *mod, sl_error *err) {
    sl_status st;
    char name[160];
    snprintf(name, sizeof name, "layers.%d.%s.gate_up_proj", l, mod);
    const sl_ckpt_entry *fe = sl_ckpt_find(ck, name);
    const sl_tensor *fused = fe ? fe->t : NULL;
    /* Experts stored in x out ([E, H, 2I], [E, I, H]) are not views of the file in this layout:
     * a family whose checkpoints hold them so lays them out (sl_family.expert_layout, as
     * Qwen3-VL-MoE does); any other refuses them by name. */
    if (fused && fused->ndim == 3 && fused->shape[1] == H && fused->shape[2] == 2 * I && H != 2 * I)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: %s is [%d, %lld, %lld] (experts stored in x out, [E, hidden, 2 x "
                       "intermediate]): not a layout of this architecture's checkpoints; sluice "
                       "reads [E, 2 x intermediate, hidden] here, the layout transformers 5 saves",
                       ck->dir, name, E, (long long)H, (long long)(2 * I));
    if (fused) {
        sl_tensor gu, down;
        if ((st = sl_ckpt_bind(ck, &gu, SL_BIND_REQUIRED, SL_DIMS(E, 2 * I, H), err, "%s", name)) ||
            (st = sl_ckpt_bind(ck, &down, SL_BIND_REQUIRED, SL_DIMS(E, H, I), err,
                               "layers.%d.%s.down_proj", l, mod)))
            return st;
        for (int32_t e = 0; e < E; e++) {
            sl_tensor m = sl_tensor_slice(&gu, e);
            ex[e].gate = sl_tensor_rows(&m, 0, I);
            ex[e].up = sl_tensor_rows(&m, I, I);
            ex[e].down = sl_tensor_slice(&down, e);
        }
        return SL_OK;
    }
    snprintf(name, sizeof name, "layers.%d.%s.gate_proj", l, mod);
    if (sl_ckpt_find(ck, name)) {
        sl_tensor g, u, d;
        if ((st = sl_ckpt_bind(ck, &g, SL_BIND_REQUIRED, SL_DIMS(E, I, H), err, "%s", name)) ||
            (st = sl_ckpt_bind(ck, &u, SL_BIND_REQUIRED, SL_DIMS(E, I, H), err,
                               "layers.%d.%s.up_proj", l, mod)) ||
            (st = sl_ckpt_bind(ck, &d, SL_BIND_REQUIRED, SL_DIMS(E, H, I), err,
                               "layers.%d.%s.down_proj", l, mod)))
            return st;
        for (int32_t e = 0; e < E; e++) {
            ex[e].gate = sl_tensor_slice(&g, e);
            ex[e].up = sl_tensor_slice(&u, e);
            ex[e].down = sl_tensor_slice(&d, e);
        }
        return SL_OK;
    }
    const char *fmt = "layers.%d.%s.%d.%s.weight";
    for (int32_t e = 0; e < E; e++)
        if ((st = sl_ckpt_bind(ck, &ex[e].gate, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, mod,
                               e, "gate_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].up, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, mod, e,
                               "up_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].down, SL_BIND_REQUIRED, SL_DIMS(H, I), err, fmt, l, mod,
                               e, "down_proj")))
            return st;
    return SL_OK;
}

/* Where piece bytes p of a bound expert matrix lie in the checkpoint's files, into x; whether
 * they do. */
static int locate_piece(const sl_ckpt *ck, const void *p, sl_expert_extent *x) {
    x->file = p ? sl_ckpt_locate(ck, p, &x->off) : -1;
    return x->file >= 0;
}

/* The store reads the bound experts from the checkpoint's files itself (modes resident and
 * stream): each matrix's data, scales and biases from where its view's lie in the mappings. */
static sl_status open_from_files(sl_model *m, sl_expert **views, const sl_store_params *sp,
                                 sl_error *err) {
    const sl_config *c = &m->cfg;
    const int32_t E = c->n_experts, nl = c->n_layers, nf = sl_ckpt_n_files(&m->ck);
    sl_expert_src *src = sl_calloc((size_t)nl, sizeof *src, err);
    const char **paths = sl_calloc((size_t)SL_MAX(nf, 1), sizeof(char *), err);
    sl_status st = src && paths ? SL_OK : SL_ERR_NOMEM;
    for (int32_t i = 0; !st && i < nf; i++)
        paths[i] = sl_ckpt_file(&m->ck, i);
    for (int32_t l = 0; !st && l < nl; l++) {
        if (!views[l]) continue;
        sl_expert_extent *ext = sl_calloc((size_t)E * SL_EX_PARTS, sizeof *ext, err);
        if (!ext) {
            st = SL_ERR_NOMEM;
            break;
        }
        src[l].ext = ext;
        for (int32_t e = 0; !st && e < E; e++) {
            const sl_tensor *mat[3] = {&views[l][e].gate, &views[l][e].up, &views[l][e].down};
            for (int k = 0; !st && k < 3; k++) {
                const sl_tensor *t = mat[k], *p0 = &src[l].proto[k];
                sl_expert_extent *x = &ext[SL_EX_PARTS * e + 3 * k];
                if (e == 0) src[l].proto[k] = *t;
                const int ok = locate_piece(&m->ck, t->data, &x[0]) &&
                               (!t->scales || locate_piece(&m->ck, t->scales, &x[1])) &&
                               (!t->biases || locate_piece(&m->ck, t->biases, &x[2]));
                if (!ok || t->dtype != p0->dtype || !t->scales != !p0->scales ||
                    !t->biases != !p0->biases || sl_tensor_group(t) != sl_tensor_group(p0) ||
                    sl_tensor_sdtype(t) != sl_tensor_sdtype(p0))
                    st = sl_fail(err, SL_ERR_UNSUPPORTED,
                                 "%s: layer %d, expert %d: %s is not a tensor of the files, or its "
                                 "type differs from expert 0's",
                                 m->ck.dir, l, e, t->name);
            }
        }
    }
    if (!st) st = sl_experts_open_files(&m->experts, nl, E, nf, paths, src, sp, err);
    for (int32_t l = 0; src && l < nl; l++)
        free((void *)src[l].ext);
    free(src);
    free(paths);
    return st;
}

sl_status blk_bind_experts(sl_model *m, const sl_store_params *sp, sl_error *err) {
    if (m->cfg.expert_layout == SL_EXPERT_LAYOUT_GATE_UP_T ||
        m->cfg.expert_layout == SL_EXPERT_LAYOUT_IN_OUT)
        return sl_open_experts_gate_up_t(m, sp, err);
    const sl_config *c = &m->cfg;
    const int32_t E = c->n_experts, nl = c->n_layers;
    sl_expert **views = sl_calloc((size_t)nl, sizeof(sl_expert *), err);
    sl_status st = views ? SL_OK : SL_ERR_NOMEM;
    for (int32_t l = 0; !st && l < nl; l++) {
        if (!c->layer_is_moe[l] || E == 0) continue;
        if (!(views[l] = sl_calloc((size_t)E, sizeof(sl_expert), err)))
            st = SL_ERR_NOMEM;
        else
            st = bind_hf_experts(
                &m->ck, views[l], l, E, c->hidden_size, c->moe_intermediate_size,
                m->family->experts_module ? m->family->experts_module : "mlp.experts", err);
    }
    if (!st && sp->mode != SL_EXPERTS_MAPPED)
        st = open_from_files(m, views, sp, err);
    else if (!st)
        st = sl_experts_open_views(&m->experts, nl, E, (const sl_expert *const *)views, err);
    for (int32_t l = 0; views && l < nl; l++)
        free(views[l]);
    free(views);
    return st;
}

sl_status blk_bind_hybrid(sl_model *m, blk_linear_proj proj, sl_error *err) {
    const blk_attn_opts attn = {.qkv_bias = m->cfg.attention_bias,
                                .o_bias = m->cfg.attention_bias,
                                .qk_norm = 1,
                                .gated = 1};
    const blk_ffn_opts ffn = {.shared_expert = 1};
    if (!m->cfg.layer_is_linear)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %s config has no linear_* keys", m->ck.dir,
                       m->cfg.arch);
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        st = m->cfg.layer_is_linear[l] ? blk_bind_linear_attention(m, l, proj, err)
                                       : blk_bind_attention(m, l, &attn, err);
        if (!st) st = blk_bind_ffn(m, l, &ffn, err);
    }
    return st;
}

/* ------------------------------------------------------------- compute */

void blk_attention(sl_session *s, int32_t l, int32_t T, const blk_attn_sel *sel) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    const sl_layer *L = &m->layers[l];
    sl_session_buf *b = &s->b;
    const int32_t hd = c->head_dim;
    const size_t kv_row = (size_t)c->n_kv_heads * (size_t)hd;

    /* q (or [query | gate] per head), k and v: one batch when they carry no bias */
    float *qout = L->attn_gated ? b->qg : b->q;
    if (!L->bq.data && !L->bk.data && !L->bv.data) {
        float *y[3] = {qout, b->k, b->v};
        const float *x[3] = {b->xn, b->xn, b->xn};
        const sl_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
        const int32_t Ts[3] = {T, T, T};
        op->matmul_batch(be, y, x, w, Ts, 3);
    } else {
        op->matmul(be, qout, b->xn, &L->wq, &L->bq, T);
        op->matmul(be, b->k, b->xn, &L->wk, &L->bk, T);
        op->matmul(be, b->v, b->xn, &L->wv, &L->bv, T);
    }
    if (L->attn_gated) {
        /* [T, nh, 2*hd] per head [query | gate] -> q [T, nh*hd] and gate [T, nh*hd] */
        const size_t nh = (size_t)c->n_heads, h = (size_t)hd;
        op->copy2d(be, b->q, h, b->qg, 2 * h, T * (int32_t)nh, (int32_t)h);
        op->copy2d(be, b->qgate, h, b->qg + h, 2 * h, T * (int32_t)nh, (int32_t)h);
    }
    if (L->qk_norm_full) { /* over the whole projections, before RoPE (the prep's are per head) */
        op->rmsnorm(be, b->q, b->q, &L->q_norm, T, c->n_heads * hd, c->rms_norm_eps,
                    m->norm_offset);
        op->rmsnorm(be, b->k, b->k, &L->k_norm, T, (int32_t)kv_row, c->rms_norm_eps,
                    m->norm_offset);
    }
    if (L->qkv_clip > 0) {
        const float lim = L->qkv_clip;
        op->clamp(be, b->q, (size_t)T * (size_t)c->n_heads * (size_t)hd, -lim, lim);
        op->clamp(be, b->k, (size_t)T * kv_row, -lim, lim);
        op->clamp(be, b->v, (size_t)T * kv_row, -lim, lim);
    }
    const int head_norms = L->q_norm.data && !L->qk_norm_full;
    const int32_t calls = blk_row_calls(s, T), Tc = T / calls;
    const size_t q_row = (size_t)c->n_heads * (size_t)hd;
    for (int32_t i = 0; i < calls; i++) {
        const sl_session *r = blk_row_session(s, i);
        const size_t qo = (size_t)i * q_row, ko = (size_t)i * kv_row;
        float *kc = r->kcache + (size_t)(l - r->layer0) * (size_t)r->max_ctx * kv_row;
        float *vc = r->vcache + (size_t)(l - r->layer0) * (size_t)r->max_ctx * kv_row;
        const sl_qkv_args qa = {
            .q = b->q + qo,
            .k = b->k + ko,
            .v = b->v + ko,
            .kc = kc,
            .vc = vc,
            .q_norm = head_norms ? &L->q_norm : NULL,
            .k_norm = head_norms ? &L->k_norm : NULL,
            .T = Tc,
            .pos0 = r->pos,
            .n_heads = c->n_heads,
            .n_kv_heads = c->n_kv_heads,
            .head_dim = hd,
            .rot_dim = L->no_rope ? 0 : c->rot_dim,
            .eps = c->rms_norm_eps,
            .w_offset = m->norm_offset,
            .cos_tab = r->rope_cos,
            .sin_tab = r->rope_sin,
            .rope_interleaved = c->rope_interleaved,
            .temp_floor = L->temp_floor,
            .temp_scale = L->temp_scale,
        };
        sl_attn_args a = {
            .out = b->attn + qo,
            .q = b->q + qo,
            .kcache = kc,
            .vcache = vc,
            .T = Tc,
            .pos0 = r->pos,
            .n_heads = c->n_heads,
            .n_kv_heads = c->n_kv_heads,
            .head_dim = hd,
            .scale = 1.0f / sqrtf((float)hd),
            .scratch = r->b.attn_scratch,
            .sel = sel ? sel->sel : NULL,
            .n_sel = sel ? sel->n_sel : NULL,
            .sel_stride = sel ? sel->stride : 0,
            .chunk = L->attn_chunk,
            .prep = &qa, /* qkv_prep, fused with the attention where the backend can */
            .window = sel ? 0 : L->window,
            .sinks = L->sinks.data ? &L->sinks : NULL,
        };
        op->attention(be, &a);
    }
    if (L->attn_gated)
        op->sigmoid_mul(be, b->attn, b->qgate, (size_t)T * (size_t)c->n_heads * (size_t)hd);
    op->matmul(be, b->out, b->attn, &L->wo, &L->bo, T);
}

sl_status blk_ffn(sl_session *s, int32_t l, int32_t T, sl_error *err) {
    const sl_layer *L = &s->model->layers[l];
    sl_session_buf *b = &s->b;
    if (!L->is_moe) {
        sl_moe_swiglu_mlp(s->be, b->out, b->xn, &L->mlp_gate, &L->mlp_up, &L->mlp_down, b->gate,
                          b->up, T);
        return SL_OK;
    }
    const int shared = L->sh_gate.data != NULL;
    /* the next MoE layer, whose picks this layer's input predicts: of this partition (the
     * predictions are kept in its MoE scratch) */
    int32_t nl = l + 1;
    while (nl < s->layer1 && !s->model->layers[nl].is_moe)
        nl++;
    const sl_layer *N = nl < s->layer1 ? &s->model->layers[nl] : NULL;
    const sl_moe_weights w = {.router = &L->router,
                              .router_bias = L->router_bias.data ? &L->router_bias : NULL,
                              .select_bias = L->select_bias.data ? &L->select_bias : NULL,
                              .expert_scale = L->expert_scale.data ? &L->expert_scale : NULL,
                              .sh_gate = shared ? &L->sh_gate : NULL,
                              .sh_up = &L->sh_up,
                              .sh_down = &L->sh_down,
                              .sh_router = L->sh_router.data ? &L->sh_router : NULL,
                              .next_router = N ? &N->router : NULL,
                              .next_router_bias = N && N->router_bias.data ? &N->router_bias : NULL,
                              .next_select_bias = N && N->select_bias.data ? &N->select_bias : NULL,
                              .next_layer = nl};
    const sl_moe_io io = {
        .x = b->xn, .out = b->out, .gate = b->gate, .up = b->up, .rows = b->ffn_out};
    return sl_moe_forward(&s->moe, l, &w, &io, T, err);
}

void blk_embed(sl_session *s, float *y, const int32_t *ids, int32_t T) {
    const sl_backend *be = s->be;
    be->ops->to_dev(be, s->b.ids, ids, (size_t)T * sizeof(int32_t));
    be->ops->embed(be, y, &s->model->embed, s->b.ids, T);
}

void blk_head(sl_session *s, const float *x, int32_t rows, float *logits) {
    const sl_model *m = s->model;
    const sl_backend *be = s->be;
    s->b.head_x = x; /* for the finite check of sl_session_forward, logits or not */
    s->b.head_rows = rows;
    if (!logits) return;
    /* Straight into the caller's buffer when backend memory is host memory. */
    float *dst = be->device ? s->b.logits : logits;
    be->ops->matmul(be, dst, x, &m->lm_head, NULL, rows);
    if (m->cfg.logit_softcap > 0) /* c tanh(logits / c), as transformers divides, then scales */
        be->ops->activate(be, dst, dst, (size_t)rows * (size_t)m->cfg.vocab_size,
                          m->cfg.logit_softcap, m->cfg.logit_softcap, SL_ACT_TANH);
    if (s->defer_logits) return; /* sl_session_forward copies them after the graph */
    be->ops->to_host(be, logits, dst, (size_t)rows * (size_t)m->cfg.vocab_size * sizeof(float));
}

void blk_residual_norm(sl_session *s, const sl_tensor *w, int32_t T) {
    const sl_model *m = s->model;
    const sl_backend *be = s->be;
    sl_session_buf *b = &s->b;
    const int32_t H = m->cfg.hidden_size;
    if (!be->ops->add_rmsnorm_next) {
        be->ops->add_rmsnorm(be, b->xn, b->x, b->out, w, T, H, m->cfg.rms_norm_eps, m->norm_offset);
        return;
    }
    be->ops->add_rmsnorm_next(be, b->xn, b->x_alt, b->x, b->out, w, T, H, m->cfg.rms_norm_eps,
                              m->norm_offset);
    float *t = b->x;
    b->x = b->x_alt, b->x_alt = t;
}

float *blk_residual_of(sl_session *s) {
    return s->b.x;
}

void blk_part_move(const sl_session *s, const sl_backend *from, void *dst, const void *src,
                   size_t bytes) {
    const size_t stage = (size_t)s->max_batch * (size_t)s->model->cfg.hidden_size * sizeof(float);
    sl_backend_transfer(s->be, dst, from, src, bytes, s->b.h_stage, stage);
    s->model->stats.part_moves++;
    s->model->stats.part_bytes += (int64_t)bytes;
}

void blk_part_cross(sl_session *s, int32_t T, blk_part_buf buf, size_t row) {
    const sl_backend *from = s->be;
    const float *src = buf(s);
    const int32_t p = s->part + 1;
    for (int32_t i = 0; s->rows && i < T; i++)
        sl_session_enter(s->rows[i], p);
    sl_session_enter(s, p);
    blk_part_move(s, from, buf(s), src, (size_t)T * row * sizeof(float));
}

sl_status blk_prenorm_decoder(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                              int all_logits, sl_error *err) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    sl_session_buf *b = &s->b;
    const int32_t H = c->hidden_size;
    const float eps = c->rms_norm_eps, off = m->norm_offset;

    /* Each residual add is fused with the norm that follows it (the next sublayer's, or the
     * final one). A backend with add_rmsnorm_next may fold it into the sublayer's first GEMV;
     * the residual then goes to the other buffer, and the two swap (an even number of times a
     * pass, so b->x ends where it began; a split model's partitions each have theirs). At a
     * partition boundary the residual and the FFN's output cross before their add, so that the
     * next partition runs the add and norm the unsplit pass runs, fused as the backend fuses
     * them: the same bits on any backend. */
    blk_embed(s, b->x, ids, T);
    s->be->ops->rmsnorm(s->be, b->xn, b->x, &m->layers[0].attn_norm, T, H, eps, off);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        const double t0 = sl_now();
        if (m->family->attention)
            m->family->attention(s, l, T);
        else if (L->is_linear)
            blk_linear_attention(s, l, T);
        else
            blk_attention(s, l, T, NULL);
        s->model->stats.t_attention += sl_now() - t0;
        blk_residual_norm(s, &L->ffn_norm, T);
        sl_status st = blk_ffn(s, l, T, err);
        if (st) return st;
        if (l + 1 == s->layer1 && l + 1 < c->n_layers) { /* a partition boundary */
            const sl_backend *from = s->be;
            const float *out = b->out;
            blk_part_cross(s, T, blk_residual_of, (size_t)H);
            blk_part_move(s, from, b->out, out, (size_t)T * (size_t)H * sizeof(float));
        }
        blk_residual_norm(s, l + 1 < c->n_layers ? &m->layers[l + 1].attn_norm : &m->norm, T);
    }
    /* Only the rows whose logits are wanted go through the head. */
    const int32_t first = all_logits ? 0 : T - 1;
    blk_head(s, b->xn + (size_t)first * (size_t)H, T - first, logits);
    return SL_OK;
}
