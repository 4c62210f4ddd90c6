/*
 * Gemma 4 (model_type "gemma4_text", Gemma4ForCausalLM, and "gemma4", the text model of
 * Gemma4ForConditionalGeneration under model.language_model.; its vision and audio towers are
 * not bound), with or without its MoE block (enable_moe_block), as transformers 5.17 computes
 * it (modeling_gemma4.py). Norms are RMSNorm with a plain weight.
 *
 *   x = embed(ids) * sqrt(H)
 *   ple = ((rmsnorm_P(W_ple x / sqrt(H)) + embed_ple(ids) * sqrt(P)) / sqrt(2))  [T, L, P]
 *   per layer l (sliding or full attention, each kind with its own head shape and RoPE):
 *     x += post_attn_norm(attn(input_norm(x)))
 *       attn: q = rope(q_norm(Wq .)), k = rope(k_norm(Wk .)), v = rmsnorm(Wv .) (no weight;
 *             Wk's rows on full layers with attention_k_eq_v), scale 1, sliding layers seeing
 *             the last sliding_window positions; KV-shared layers attend an earlier layer's
 *     h = mlp(pre_ffn_norm(x))                            GELU-tanh gated MLP
 *     MoE block: h = post_ffn_norm1(h)
 *                  + post_ffn_norm2(experts(pre_ffn_norm2(x); router(x)))
 *       router: softmax(W_r (rmsnorm(x) * scale / sqrt(H))), top-k, renormalised,
 *               times per_expert_scale; experts gate_up [E, 2I, H] gate-first, GELU-tanh
 *     x += post_ffn_norm(h)
 *     per-layer input: x += ple_norm(W_proj (gelu(W_gate x) * ple[:, l]))
 *     x *= layer_scalar
 *   logits = softcap(lm_head(norm(x)))                    c tanh(logits / c) when configured
 */
#include <math.h>

#include "families/gemma4/gemma4.h"

/* ------------------------------------------------------------- model */

static sl_status bind_layer(sl_model *m, int32_t l, sl_error *err) {
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    const g4_layer_cfg *lc = &g->layers[l];
    const g4_kind *K = &g->kind[lc->kind];
    const sl_ckpt *ck = &m->ck;
    sl_layer *L = &m->layers[l];
    g4_layer *G = &g4_mod(m)->layers[l];
    const int64_t H = c->hidden_size, hd = K->head_dim, nq = c->n_heads * hd;
    const int64_t nkv = K->n_kv_heads * hd, E = c->n_experts, P = g->ple_dim;
    const int R = SL_BIND_REQUIRED;
    const char *a = "layers.%d.self_attn.%s.weight";
    G->mlp_inter = c->intermediate_size * (lc->double_wide ? 2 : 1);
    const int64_t I = G->mlp_inter;
    sl_status st;
    if ((st = sl_ckpt_bind(ck, &L->attn_norm, R, SL_DIMS(H), err,
                           "layers.%d.input_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &G->post_attn_norm, R, SL_DIMS(H), err,
                           "layers.%d.post_attention_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &L->ffn_norm, R, SL_DIMS(H), err,
                           "layers.%d.pre_feedforward_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &G->post_ffn_norm, R, SL_DIMS(H), err,
                           "layers.%d.post_feedforward_layernorm.weight", l)) ||
        (st = sl_ckpt_bind(ck, &L->wq, R, SL_DIMS(nq, H), err, a, l, "q_proj")) ||
        (st = sl_ckpt_bind(ck, &L->q_norm, R, SL_DIMS(hd), err, a, l, "q_norm")) ||
        (st = sl_ckpt_bind(ck, &L->wo, R, SL_DIMS(H, nq), err, a, l, "o_proj")) ||
        (st = sl_ckpt_bind(ck, &L->mlp_gate, R, SL_DIMS(I, H), err,
                           "layers.%d.mlp.gate_proj.weight", l)) ||
        (st = sl_ckpt_bind(ck, &L->mlp_up, R, SL_DIMS(I, H), err, "layers.%d.mlp.up_proj.weight",
                           l)) ||
        (st = sl_ckpt_bind(ck, &L->mlp_down, R, SL_DIMS(H, I), err,
                           "layers.%d.mlp.down_proj.weight", l)))
        return st;
    /* A KV-shared layer has no K/V weights (transformers ignores them if a checkpoint has any) */
    if (lc->kv_src == l &&
        ((st = sl_ckpt_bind(ck, &L->wk, R, SL_DIMS(nkv, H), err, a, l, "k_proj")) ||
         (st = sl_ckpt_bind(ck, &L->k_norm, R, SL_DIMS(hd), err, a, l, "k_norm")) ||
         (!K->no_v && (st = sl_ckpt_bind(ck, &L->wv, R, SL_DIMS(nkv, H), err, a, l, "v_proj")))))
        return st;
    L->is_moe = c->layer_is_moe[l];
    if (L->is_moe && ((st = sl_ckpt_bind(ck, &L->router, R, SL_DIMS(E, H), err,
                                         "layers.%d.router.proj.weight", l)) ||
                      (st = sl_ckpt_bind(ck, &G->router_scale, R, SL_DIMS(H), err,
                                         "layers.%d.router.scale", l)) ||
                      (st = sl_ckpt_bind(ck, &L->expert_scale, R, SL_DIMS(E), err,
                                         "layers.%d.router.per_expert_scale", l)) ||
                      (st = sl_ckpt_bind(ck, &G->post_ffn_norm1, R, SL_DIMS(H), err,
                                         "layers.%d.post_feedforward_layernorm_1.weight", l)) ||
                      (st = sl_ckpt_bind(ck, &G->pre_ffn_norm2, R, SL_DIMS(H), err,
                                         "layers.%d.pre_feedforward_layernorm_2.weight", l)) ||
                      (st = sl_ckpt_bind(ck, &G->post_ffn_norm2, R, SL_DIMS(H), err,
                                         "layers.%d.post_feedforward_layernorm_2.weight", l))))
        return st;
    if (P && ((st = sl_ckpt_bind(ck, &G->ple_gate, R, SL_DIMS(P, H), err,
                                 "layers.%d.per_layer_input_gate.weight", l)) ||
              (st = sl_ckpt_bind(ck, &G->ple_proj, R, SL_DIMS(H, P), err,
                                 "layers.%d.per_layer_projection.weight", l)) ||
              (st = sl_ckpt_bind(ck, &G->ple_norm, R, SL_DIMS(H), err,
                                 "layers.%d.post_per_layer_input_norm.weight", l))))
        return st;
    /* layer_scalar: a persistent buffer, read once (the weights are still host memory here) */
    sl_tensor ls = {0};
    G->scalar = 1.0f;
    if ((st =
             sl_ckpt_bind(ck, &ls, SL_BIND_OPTIONAL, SL_DIMS(1), err, "layers.%d.layer_scalar", l)))
        return st;
    if (ls.data) sl_to_f32(&G->scalar, ls.data, ls.dtype, 0, 1);
    return SL_OK;
}

static sl_status gemma4_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    g4_model *gm = sl_calloc(1, sizeof *gm, err);
    if (!gm) return SL_ERR_NOMEM;
    m->fam = gm;
    gm->layers = sl_calloc((size_t)c->n_layers, sizeof(g4_layer), err);
    gm->ones_data = sl_calloc((size_t)g->max_head_dim, sizeof(float), err);
    if (!gm->layers || !gm->ones_data) return SL_ERR_NOMEM;
    for (int32_t i = 0; i < g->max_head_dim; i++)
        gm->ones_data[i] = 1.0f;
    gm->ones = (sl_tensor){.name = "ones",
                           .dtype = SL_DTYPE_F32,
                           .ndim = 1,
                           .shape = {g->max_head_dim},
                           .data = gm->ones_data,
                           .nbytes = (size_t)g->max_head_dim * sizeof(float)};
    sl_status st = blk_bind_globals(m, err);
    if (st) return st;
    const int64_t H = c->hidden_size, LP = (int64_t)c->n_layers * g->ple_dim;
    if (g->ple_dim &&
        ((st = sl_ckpt_bind(&m->ck, &gm->ple_embed, SL_BIND_REQUIRED, SL_DIMS(g->ple_vocab, LP),
                            err, "embed_tokens_per_layer.weight")) ||
         (st = sl_ckpt_bind(&m->ck, &gm->ple_model, SL_BIND_REQUIRED, SL_DIMS(LP, H), err,
                            "per_layer_model_projection.weight")) ||
         (st = sl_ckpt_bind(&m->ck, &gm->ple_pnorm, SL_BIND_REQUIRED, SL_DIMS(g->ple_dim), err,
                            "per_layer_projection_norm.weight"))))
        return st;
    /* sqrt(H) and sqrt(P) as float32 tensors: transformers casts them to the table's dtype,
     * which is float32 when it computes in float32 (as sluice does, whatever the storage) */
    gm->embed_scale = (float)sqrt((double)H);
    gm->ple_scale = (float)sqrt((double)g->ple_dim);
    for (int32_t l = 0; !st && l < c->n_layers; l++)
        st = bind_layer(m, l, err);
    return st;
}

static int32_t gemma4_weights(sl_model *m, sl_tensor **out, int32_t *layer) {
    g4_model *gm = g4_mod(m);
    int32_t n = 0, l = -1;
#define W(t) (out ? (void)(out[n] = &(t)) : (void)0, layer ? (void)(layer[n] = l) : (void)0, n++)
    W(gm->ple_embed), W(gm->ple_model), W(gm->ple_pnorm); /* ones: the sessions' (ones_of) */
    for (l = 0; l < m->cfg.n_layers; l++) {
        g4_layer *G = &gm->layers[l];
        W(G->post_attn_norm), W(G->post_ffn_norm), W(G->post_ffn_norm1), W(G->pre_ffn_norm2);
        W(G->post_ffn_norm2), W(G->router_scale), W(G->ple_gate);
        W(G->ple_proj), W(G->ple_norm);
    }
#undef W
    return n;
}

static void gemma4_free(sl_model *m) {
    g4_model *gm = g4_mod(m);
    if (!gm) return;
    free(gm->layers);
    free(gm->ones_data);
    free(gm);
    m->fam = NULL;
}

/* ------------------------------------------------------------- session */

/* Whether some layer in [l0, l1) attends layer src's K/V (src itself, or a KV-shared one). */
static int kv_used(const g4_config *g, int32_t src, int32_t l0, int32_t l1) {
    for (int32_t j = l0; j < l1; j++)
        if (g->layers[j].kv_src == src) return 1;
    return 0;
}

/* Floats of layer l's K (or V) cache in the session's current partition: 0 for a KV-shared
 * layer, and for one no layer of the partition or after it attends (a split model's partition
 * keeps the caches its layers read, their own and earlier layers' they share, and relays
 * those that later partitions share). */
static size_t kv_floats(const sl_session *s, int32_t l) {
    const g4_config *g = g4_cfg(s->model);
    const g4_kind *K = &g->kind[g->layers[l].kind];
    return g->layers[l].kv_src == l && l < s->layer1 &&
                   kv_used(g, l, s->layer0, s->model->cfg.n_layers)
               ? (size_t)s->max_ctx * (size_t)K->n_kv_heads * (size_t)K->head_dim
               : 0;
}

static void gemma4_layout(sl_session *s, sl_carver *cv, sl_carver *hv) {
    const sl_config *c = &s->model->cfg;
    const g4_config *g = g4_cfg(s->model);
    g4_session *b = g4_ses(s);
    const size_t B = (size_t)s->max_batch, H = (size_t)c->hidden_size;
    const size_t LP = (size_t)c->n_layers * (size_t)g->ple_dim;
    size_t kv = 0, I = 0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        kv += kv_floats(s, l);
        I = SL_MAX(I, (size_t)c->intermediate_size * (g->layers[l].double_wide ? 2 : 1));
    }
    b->q = sl_carve(cv, B * (size_t)g->max_q, sizeof(float));
    b->k = sl_carve(cv, B * (size_t)g->max_kv, sizeof(float));
    b->v = sl_carve(cv, B * (size_t)g->max_kv, sizeof(float));
    b->attn = sl_carve(cv, B * (size_t)g->max_q, sizeof(float));
    b->kcache = sl_carve(cv, kv, sizeof(float));
    b->vcache = sl_carve(cv, kv, sizeof(float));
    b->kv_off = sl_carve(hv, (size_t)c->n_layers, sizeof(size_t));
    for (int k = 0; k < G4_KINDS; k++) {
        const size_t n = (size_t)s->max_ctx * (size_t)(g->kind[k].head_dim / 2);
        b->rope_cos[k] = sl_carve(cv, n, sizeof(float));
        b->rope_sin[k] = sl_carve(cv, n, sizeof(float));
    }
    b->mlp = sl_carve(cv, B * I, sizeof(float));
    b->mlp_up = sl_carve(cv, B * I, sizeof(float));
    b->h1 = sl_carve(cv, B * H, sizeof(float));
    b->h2 = sl_carve(cv, g->moe ? B * H : 0, sizeof(float));
    b->rx = sl_carve(cv, g->moe ? B * H : 0, sizeof(float));
    b->ple = sl_carve(cv, B * LP, sizeof(float));
    b->ple_tok = sl_carve(cv, B * LP, sizeof(float));
    b->ple_in = sl_carve(cv, B * (size_t)g->ple_dim, sizeof(float));
    b->ple_g = sl_carve(cv, B * (size_t)g->ple_dim, sizeof(float));
    b->ones = sl_carve(cv, (size_t)g->max_head_dim, sizeof(float));
}

/* cos/sin of pos * inv_freq per attention kind, in float32 as Gemma4TextRotaryEmbedding
 * computes them (the default and proportional inverse frequencies of modeling_rope_utils.py:
 * 1 / theta^(2i / head_dim) for i < rope_angles, divided by factor, then zeros). */
static sl_status fill_rope(sl_session *s, sl_error *err) {
    const g4_config *g = g4_cfg(s->model);
    const sl_backend *be = s->be;
    g4_session *b = g4_ses(s);
    for (int k = 0; k < G4_KINDS; k++) {
        const g4_kind *K = &g->kind[k];
        const int32_t half = K->head_dim / 2;
        const size_t n = (size_t)s->max_ctx * (size_t)half;
        if (!n) continue;
        float *cs = malloc(2 * n * sizeof(float));
        if (!cs) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
        for (int32_t i = 0; i < half; i++) {
            float inv = 0.0f;
            if (i < K->rope_angles)
                inv = 1.0f / powf((float)K->theta, (float)(2 * i) / (float)K->head_dim);
            inv /= (float)K->factor;
            for (int32_t p = 0; p < s->max_ctx; p++) {
                const float ang = (float)p * inv;
                cs[(size_t)p * (size_t)half + (size_t)i] = cosf(ang);
                cs[n + (size_t)p * (size_t)half + (size_t)i] = sinf(ang);
            }
        }
        be->ops->to_dev(be, b->rope_cos[k], cs, n * sizeof(float));
        be->ops->to_dev(be, b->rope_sin[k], cs + n, n * sizeof(float));
        free(cs);
    }
    return SL_OK;
}

static sl_status gemma4_session_init(sl_session *s, sl_error *err) {
    const sl_model *m = s->model;
    const g4_config *g = g4_cfg(m);
    g4_session *b = g4_ses(s);
    size_t off = 0;
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        b->kv_off[l] = off;
        off += kv_floats(s, l);
    }
    for (int32_t l = 0; l < m->cfg.n_layers; l++) /* a shared layer reads its source's rows */
        b->kv_off[l] = b->kv_off[g->layers[l].kv_src];
    /* The attention's scratch for the widest heads (the shared reserve knew the top-level
     * head_dim only) */
    const sl_reserve_args ra = {.max_batch = s->max_batch,
                                .max_ctx = s->max_ctx,
                                .n_heads = m->cfg.n_heads,
                                .head_dim = g->max_head_dim};
    sl_status st;
    if (s->be->ops->reserve && (st = s->be->ops->reserve(s->be, &ra, err))) return st;
    s->be->ops->to_dev(s->be, b->ones, g4_mod(m)->ones_data,
                       (size_t)g->max_head_dim * sizeof(float));
    return fill_rope(s, err);
}

/* ------------------------------------------------------------- forward */

/* The scale-free norms' weight in the session's backend memory (each partition's own). */
static sl_tensor ones_of(const sl_session *s) {
    sl_tensor t = g4_mod(s->model)->ones;
    t.data = g4_ses(s)->ones;
    return t;
}

/* Layer l's self-attention: s->b.xn -> s->b.out. */
static void attention(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    const g4_layer_cfg *lc = &g->layers[l];
    const g4_kind *K = &g->kind[lc->kind];
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    const sl_layer *L = &m->layers[l];
    g4_session *b = g4_ses(s);
    const int32_t hd = K->head_dim, nh = c->n_heads, nkv = K->n_kv_heads;
    const float eps = c->rms_norm_eps;
    float *kc = b->kcache + b->kv_off[l], *vc = b->vcache + b->kv_off[l];
    sl_qkv_args qa = {
        .q = b->q,
        .k = b->k,
        .v = b->v,
        .kc = kc,
        .vc = vc,
        .q_norm = &L->q_norm,
        .k_norm = &L->k_norm,
        .T = T,
        .pos0 = s->pos,
        .n_heads = nh,
        .n_kv_heads = nkv,
        .head_dim = hd,
        .rot_dim = hd, /* the proportional table's zero frequencies leave the other dims */
        .eps = eps,
        .w_offset = 0.0f,
        .cos_tab = b->rope_cos[lc->kind],
        .sin_tab = b->rope_sin[lc->kind],
    };
    if (lc->kv_src == l) {
        /* q, k and v (k's raw rows are the values under attention_k_eq_v); the values get
         * the scale-free v_norm before qkv_prep stores them */
        float *y[3] = {b->q, b->k, b->v};
        const float *x[3] = {s->b.xn, s->b.xn, s->b.xn};
        const sl_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
        const int32_t Ts[3] = {T, T, T};
        op->matmul_batch(be, y, x, w, Ts, K->no_v ? 2 : 3);
        if (K->no_v) op->copy2d(be, b->v, (size_t)nkv * hd, b->k, (size_t)nkv * hd, T, nkv * hd);
        const sl_tensor ones = ones_of(s);
        op->rmsnorm(be, b->v, b->v, &ones, T * nkv, hd, eps, 0.0f);
    } else {
        /* KV-shared: only the queries; keys and values are the source layer's */
        op->matmul(be, b->q, s->b.xn, &L->wq, NULL, T);
        op->rmsnorm(be, b->q, b->q, &L->q_norm, T * nh, hd, eps, 0.0f);
        op->rope(be, b->q, T, nh, hd, hd, s->pos, qa.cos_tab, qa.sin_tab);
    }
    sl_attn_args aa = {
        .out = b->attn,
        .q = b->q,
        .kcache = kc,
        .vcache = vc,
        .T = T,
        .pos0 = s->pos,
        .n_heads = nh,
        .n_kv_heads = nkv,
        .head_dim = hd,
        .scale = 1.0f, /* q_norm stands in for 1/sqrt(head_dim) */
        .scratch = s->b.attn_scratch,
        .prep = lc->kv_src == l ? &qa : NULL,
        .window = lc->kind == G4_SLIDING ? g->sliding_window : 0,
    };
    op->attention(be, &aa);
    op->matmul(be, s->b.out, b->attn, &L->wo, NULL, T);
}

/* down(gelu_tanh(gate x) * up x) of layer l's MLP, x [T, H] -> y [T, H]. */
static void mlp(sl_session *s, int32_t l, const float *x, float *y, int32_t T) {
    const sl_backend *be = s->be;
    const sl_layer *L = &s->model->layers[l];
    g4_session *b = g4_ses(s);
    const size_t I = (size_t)g4_mod(s->model)->layers[l].mlp_inter;
    float *hy[2] = {b->mlp, b->mlp_up};
    const float *hx[2] = {x, x};
    const sl_tensor *w[2] = {&L->mlp_gate, &L->mlp_up};
    const int32_t Ts[2] = {T, T};
    be->ops->matmul_batch(be, hy, hx, w, Ts, 2);
    be->ops->act_mul(be, b->mlp, b->mlp, b->mlp_up, (size_t)T * I, SL_ACT_GELU_TANH);
    be->ops->matmul(be, y, b->mlp, &L->mlp_down, NULL, T);
}

/* The per-layer inputs of the chunk ([T, L, P] into ple): the token's row of
 * embed_tokens_per_layer times sqrt(P), plus the RMSNormed projection of the (scaled)
 * embedding x, over sqrt(2). The ids are in s->b.ids already (blk_embed). */
static void per_layer_inputs(sl_session *s, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    const g4_model *gm = g4_mod(m);
    const sl_backend *be = s->be;
    g4_session *b = g4_ses(s);
    const size_t n = (size_t)T * (size_t)c->n_layers * (size_t)g->ple_dim;
    be->ops->embed(be, b->ple_tok, &gm->ple_embed, s->b.ids, T);
    be->ops->activate(be, b->ple_tok, b->ple_tok, n, 1.0f, gm->ple_scale, SL_ACT_NONE);
    be->ops->matmul(be, b->ple, s->b.x, &gm->ple_model, NULL, T);
    be->ops->activate(be, b->ple, b->ple, n, 1.0f, (float)pow(c->hidden_size, -0.5), SL_ACT_NONE);
    be->ops->rmsnorm(be, b->ple, b->ple, &gm->ple_pnorm, T * c->n_layers, g->ple_dim,
                     c->rms_norm_eps, 0.0f);
    be->ops->axpy(be, b->ple, 1.0f, b->ple_tok, n);
    be->ops->activate(be, b->ple, b->ple, n, 1.0f, (float)pow(2.0, -0.5), SL_ACT_NONE);
}

/* x += post_ffn_norm(h), h the MLP (and with the MoE block, the experts beside it). */
static sl_status feed_forward(sl_session *s, int32_t l, int32_t T, sl_error *err) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    const sl_layer *L = &m->layers[l];
    const g4_layer *G = &g4_mod(m)->layers[l];
    g4_session *b = g4_ses(s);
    sl_session_buf *sb = &s->b;
    const int32_t H = c->hidden_size;
    const size_t n = (size_t)T * (size_t)H;
    const float eps = c->rms_norm_eps;
    mlp(s, l, sb->xn, b->h1, T);
    if (L->is_moe) {
        op->rmsnorm(be, b->h1, b->h1, &G->post_ffn_norm1, T, H, eps, 0.0f);
        /* the router reads the residual through its own norm, times scale / sqrt(H); the
         * experts read it through pre_feedforward_layernorm_2 */
        op->rmsnorm(be, b->rx, sb->x, &G->router_scale, T, H, eps, 0.0f);
        op->activate(be, b->rx, b->rx, n, 1.0f, (float)pow(H, -0.5), SL_ACT_NONE);
        op->rmsnorm(be, sb->xn, sb->x, &G->pre_ffn_norm2, T, H, eps, 0.0f);
        const sl_moe_weights w = {.router = &L->router, .expert_scale = &L->expert_scale};
        const sl_moe_io io = {.x = sb->xn,
                              .router_x = b->rx,
                              .out = b->h2,
                              .gate = sb->gate,
                              .up = sb->up,
                              .rows = sb->ffn_out};
        sl_status st = sl_moe_forward(&s->moe, l, &w, &io, T, err);
        if (st) return st;
        op->rmsnorm(be, b->h2, b->h2, &G->post_ffn_norm2, T, H, eps, 0.0f);
        op->axpy(be, b->h1, 1.0f, b->h2, n);
    }
    op->rmsnorm(be, b->h1, b->h1, &G->post_ffn_norm, T, H, eps, 0.0f);
    op->axpy(be, sb->x, 1.0f, b->h1, n);
    return SL_OK;
}

/* x += post_per_layer_input_norm(W_proj (gelu_tanh(W_gate x) * ple[:, l])). */
static void per_layer_input(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    const g4_layer *G = &g4_mod(m)->layers[l];
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    g4_session *b = g4_ses(s);
    const size_t P = (size_t)g->ple_dim, LP = (size_t)c->n_layers * P;
    op->copy2d(be, b->ple_in, P, b->ple + (size_t)l * P, LP, T, (int32_t)P);
    op->matmul(be, b->ple_g, s->b.x, &G->ple_gate, NULL, T);
    op->act_mul(be, b->ple_g, b->ple_g, b->ple_in, (size_t)T * P, SL_ACT_GELU_TANH);
    op->matmul(be, s->b.out, b->ple_g, &G->ple_proj, NULL, T);
    op->rmsnorm(be, s->b.out, s->b.out, &G->ple_norm, T, c->hidden_size, c->rms_norm_eps, 0.0f);
    op->axpy(be, s->b.x, 1.0f, s->b.out, (size_t)T * (size_t)c->hidden_size);
}

/* A partition boundary after layer l (sl_model_part): the residual and the per-layer inputs
 * cross, and the chunk's new K/V rows of the layers whose caches later layers share. */
static void cross(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const g4_config *g = g4_cfg(m);
    const size_t P = (size_t)g->ple_dim, LP = (size_t)m->cfg.n_layers * P;
    const sl_backend *from = s->be;
    const g4_session *a = g4_ses(s); /* the partition left's; its memory stays */
    blk_part_cross(s, T, blk_residual_of, (size_t)m->cfg.hidden_size);
    g4_session *b = g4_ses(s);
    if (P) blk_part_move(s, from, b->ple, a->ple, (size_t)T * LP * sizeof(float));
    for (int32_t src = 0; src <= l; src++) {
        if (g->layers[src].kv_src != src || !kv_used(g, src, s->layer0, m->cfg.n_layers)) continue;
        const g4_kind *K = &g->kind[g->layers[src].kind];
        const size_t row = (size_t)K->n_kv_heads * (size_t)K->head_dim;
        const size_t at = (size_t)s->pos * row, n = (size_t)T * row * sizeof(float);
        blk_part_move(s, from, b->kcache + b->kv_off[src] + at, a->kcache + a->kv_off[src] + at, n);
        blk_part_move(s, from, b->vcache + b->kv_off[src] + at, a->vcache + a->kv_off[src] + at, n);
    }
}

static sl_status gemma4_forward(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                                int all_logits, sl_error *err) {
    sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const g4_config *g = g4_cfg(m);
    const g4_model *gm = g4_mod(m);
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    sl_session_buf *sb = &s->b;
    const int32_t H = c->hidden_size;
    const size_t n = (size_t)T * (size_t)H;
    const float eps = c->rms_norm_eps;

    blk_embed(s, sb->x, ids, T);
    op->activate(be, sb->x, sb->x, n, 1.0f, gm->embed_scale, SL_ACT_NONE);
    if (g->ple_dim) per_layer_inputs(s, T);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        const g4_layer *G = &gm->layers[l];
        const double t0 = sl_now();
        op->rmsnorm(be, sb->xn, sb->x, &L->attn_norm, T, H, eps, 0.0f);
        attention(s, l, T);
        op->rmsnorm(be, sb->out, sb->out, &G->post_attn_norm, T, H, eps, 0.0f);
        /* x += attention; xn = pre_feedforward_layernorm(x) */
        op->add_rmsnorm(be, sb->xn, sb->x, sb->out, &L->ffn_norm, T, H, eps, 0.0f);
        m->stats.t_attention += sl_now() - t0;
        sl_status st = feed_forward(s, l, T, err);
        if (st) return st;
        if (g->ple_dim) per_layer_input(s, l, T);
        if (G->scalar != 1.0f) op->activate(be, sb->x, sb->x, n, 1.0f, G->scalar, SL_ACT_NONE);
        if (l + 1 == s->layer1 && l + 1 < c->n_layers) {
            cross(s, l, T);
            be = s->be, op = be->ops;
        }
    }
    /* Only the rows whose logits are wanted go through the final norm and the head. */
    const int32_t first = all_logits ? 0 : T - 1;
    const size_t at = (size_t)first * (size_t)H;
    op->rmsnorm(be, sb->xn + at, sb->x + at, &m->norm, T - first, H, eps, 0.0f);
    blk_head(s, sb->xn + at, T - first, logits);
    return SL_OK;
}

/* ------------------------------------------------------------- family */

/* "sliding window 16 on 2 layers (heads of 16, 2 KV), full on 2 (heads of 32, 2 KV,
 * 8 of 16 frequencies rotating, keys as values); per-layer inputs of 16; KV of the last 2
 * layers shared; logits soft-capped at 30" */
static void gemma4_info(const sl_model *m, sl_model_info *info) {
    const g4_config *g = g4_cfg(m);
    char *p = g4_mod(m)->notes;
    const size_t cap = sizeof g4_mod(m)->notes;
    size_t k = 0;
    int32_t count[G4_KINDS] = {0};
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        count[g->layers[l].kind]++;
    for (int i = 0; i < G4_KINDS && k < cap; i++) {
        const g4_kind *K = &g->kind[i];
        if (!count[i]) continue;
        if (i == G4_SLIDING)
            k += (size_t)snprintf(p + k, cap - k, "sliding window %d on", g->sliding_window);
        else
            k += (size_t)snprintf(p + k, cap - k, "%sfull on", k ? ", " : "");
        if (k < cap)
            k += (size_t)snprintf(p + k, cap - k, " %d layers (heads of %d, %d KV", count[i],
                                  K->head_dim, K->n_kv_heads);
        if (k < cap && K->rope_angles < K->head_dim / 2)
            k += (size_t)snprintf(p + k, cap - k, ", %d of %d frequencies rotating", K->rope_angles,
                                  K->head_dim / 2);
        if (k < cap)
            k += (size_t)snprintf(p + k, cap - k, "%s)", K->no_v ? ", keys as values" : "");
    }
    if (k < cap && g->ple_dim)
        k += (size_t)snprintf(p + k, cap - k, "; per-layer inputs of %d", g->ple_dim);
    if (k < cap && g->n_kv_shared)
        k += (size_t)snprintf(p + k, cap - k, "; KV of the last %d layers shared", g->n_kv_shared);
    if (k < cap && m->cfg.logit_softcap > 0)
        k += (size_t)snprintf(p + k, cap - k, "; logits soft-capped at %g",
                              (double)m->cfg.logit_softcap);
    if (k < cap && !g->moe) snprintf(p + k, cap - k, "; dense (no MoE block)");
    info->features = p;
}

const sl_family sl_family_gemma4 = {
    .arch = "gemma4",
    .norm_offset = 0.0f,
    .read_config = g4_read_config,
    .bind = gemma4_bind,
    .weights = gemma4_weights,
    .free_model = gemma4_free,
    .info = gemma4_info,
    .session_size = sizeof(g4_session),
    .session_layout = gemma4_layout,
    .session_init = gemma4_session_init,
    .forward = gemma4_forward,
    .splits = 1,
    .own_attention_config = 1,
    .own_kv_cache = 1,
    .experts_module = "experts",
};
