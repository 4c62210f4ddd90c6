/* Shared decoder blocks (contracts in blocks.h). */
#include "model/blocks.h"

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
    return sl_ckpt_bind(&m->ck, &m->lm_head, SL_BIND_REQUIRED, SL_DIMS(V, H), err,
                        "/lm_head.weight");
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

sl_status blk_bind_ffn(sl_model *m, int32_t l, const blk_ffn_opts *o, sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_ckpt *ck = &m->ck;
    sl_layer *L = &m->layers[l];
    const int64_t H = c->hidden_size;
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
        return bind_mlp(ck, &L->mlp_gate, &L->mlp_up, &L->mlp_down, H, c->intermediate_size, "mlp",
                        l, err);
    }
    if ((st = sl_ckpt_bind(ck, &L->router, SL_BIND_REQUIRED, SL_DIMS(c->n_experts, H), err,
                           "layers.%d.mlp.gate.weight", l)))
        return st;
    if (!o->shared_expert) return SL_OK;
    if (c->shared_intermediate_size <= 0)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s/config.json: shared_expert_intermediate_size "
                       "is not set",
                       m->ck.dir);
    if ((st = bind_mlp(ck, &L->sh_gate, &L->sh_up, &L->sh_down, H, c->shared_intermediate_size,
                       "mlp.shared_expert", l, err)))
        return st;
    return sl_ckpt_bind(ck, &L->sh_router, SL_BIND_REQUIRED, SL_DIMS(1, H), err,
                        "layers.%d.mlp.shared_expert_gate.weight", l);
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
    const sl_backend *be = &m->be;
    const sl_ops *op = be->ops;
    const sl_layer *L = &m->layers[l];
    sl_session_buf *b = &s->b;
    const int32_t hd = c->head_dim, pos0 = s->pos;
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
    float *kc = s->kcache + (size_t)l * (size_t)s->max_ctx * kv_row;
    float *vc = s->vcache + (size_t)l * (size_t)s->max_ctx * kv_row;
    const sl_qkv_args qa = {
        .q = b->q,
        .k = b->k,
        .v = b->v,
        .kc = kc,
        .vc = vc,
        .q_norm = L->q_norm.data ? &L->q_norm : NULL,
        .k_norm = L->q_norm.data ? &L->k_norm : NULL,
        .T = T,
        .pos0 = pos0,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = hd,
        .rot_dim = c->rot_dim,
        .eps = c->rms_norm_eps,
        .w_offset = m->norm_offset,
        .cos_tab = s->rope_cos,
        .sin_tab = s->rope_sin,
    };
    sl_attn_args a = {
        .out = b->attn,
        .q = b->q,
        .kcache = kc,
        .vcache = vc,
        .T = T,
        .pos0 = pos0,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
        .scratch = b->attn_scratch,
        .sel = sel ? sel->sel : NULL,
        .n_sel = sel ? sel->n_sel : NULL,
        .sel_stride = sel ? sel->stride : 0,
        .prep = &qa, /* qkv_prep, fused with the attention where the backend can */
    };
    op->attention(be, &a);
    if (L->attn_gated)
        op->sigmoid_mul(be, b->attn, b->qgate, (size_t)T * (size_t)c->n_heads * (size_t)hd);
    op->matmul(be, b->out, b->attn, &L->wo, &L->bo, T);
}

/* out[T, H] = down(silu(gate x) * up x) for rows x[T, H]. */
static void swiglu_mlp(sl_session *s, float *out, const float *x, const sl_tensor *g,
                       const sl_tensor *u, const sl_tensor *d, int32_t T) {
    const sl_backend *be = &s->model->be;
    const size_t I = (size_t)g->shape[0];
    be->ops->matmul(be, s->b.gate, x, g, NULL, T);
    be->ops->matmul(be, s->b.up, x, u, NULL, T);
    be->ops->swiglu(be, s->b.gate, s->b.gate, s->b.up, (size_t)T * I);
    be->ops->matmul(be, out, s->b.gate, d, NULL, T);
}

/*
 * The fetched experts list[0..n) (their views), whose rows total at most max_batch,
 * in one pass each: gather every row they read into xg (expert by expert), the gate and up
 * matmuls of all of them as one batch, one SwiGLU, the down matmuls as another batch, one
 * scatter of the results
 * to their (token, rank) rows. Per row it computes exactly what one expert at a time does.
 */
static void experts_batched(sl_session *s, const int32_t *list, const sl_expert *const *views,
                            int32_t n, int32_t rows) {
    const sl_model *m = s->model;
    const sl_backend *be = &m->be;
    sl_session_buf *b = &s->b;
    const size_t H = (size_t)m->cfg.hidden_size, I = (size_t)m->cfg.moe_intermediate_size;
    const int32_t k = m->cfg.n_experts_used;
    int32_t off = 0;
    for (int32_t j = 0; j < n; j++) {
        const int32_t e = list[j], cnt = b->expert_count[e];
        const int32_t *r = b->expert_rows + b->expert_start[e] - cnt;
        for (int32_t i = 0; i < cnt; i++) {
            b->h_grp[off + i] = r[i] / k;    /* token row read */
            b->h_grp[rows + off + i] = r[i]; /* (token, rank) row written */
        }
        const sl_expert *ex = views[j];
        /* items j (gate) and n + j (up) of one batch, then j of the down batch */
        b->bx[j] = b->bx[n + j] = b->xg + (size_t)off * H;
        b->bg[j] = b->gate + (size_t)off * I;
        b->bg[n + j] = b->up + (size_t)off * I;
        b->bo[j] = b->ffn_out + (size_t)off * H;
        b->wg[j] = &ex->gate, b->wg[n + j] = &ex->up, b->wd[j] = &ex->down;
        b->bT[j] = b->bT[n + j] = cnt;
        off += cnt;
    }
    be->ops->to_dev(be, b->grp_idx, b->h_grp, 2 * (size_t)rows * sizeof(int32_t));
    be->ops->copy_rows(be, b->xg, NULL, b->xn, b->grp_idx, rows, (int32_t)H);
    be->ops->matmul_batch(be, b->bg, (const float *const *)b->bx, b->wg, b->bT, 2 * n);
    be->ops->swiglu(be, b->gate, b->gate, b->up, (size_t)rows * I);
    be->ops->matmul_batch(be, b->bo, (const float *const *)b->bg, b->wd, b->bT, n);
    be->ops->copy_rows(be, b->expert_out, b->grp_idx + rows, b->ffn_out, NULL, rows, (int32_t)H);
}

/* The shapes and dtypes of layer l's expert slots in the device cache (all alike). */
static void dev_proto(const sl_model *m, int32_t l, const sl_tensor *proto[3]) {
    const sl_expert *v = &m->dev.layers[l].views[0];
    proto[0] = &v->gate, proto[1] = &v->up, proto[2] = &v->down;
}

/* One token's k experts (picks ids, weights in topk_w_dev) through the backend's fused
 * kernels, on the device cache's table of layer l, combined into out; 0 when there is no such
 * cache or kernel. */
static int fused_experts(sl_session *s, int32_t l, const int32_t *ids) {
    const sl_model *m = s->model;
    const sl_backend *be = &m->be;
    if (!m->dev.layers || !be->ops->moe_experts) return 0;
    const sl_tensor *proto[3];
    dev_proto(m, l, proto);
    return be->ops->moe_experts(be, s->b.out, s->b.moe_act, s->b.xn, ids, s->b.topk_w_dev,
                                m->dev.layers[l].table, proto, 1, m->cfg.n_experts_used);
}

int blk_experts_need_no_host(const sl_model *m) {
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        if (!m->layers[l].is_moe) continue;
        if (!m->dev.all || !m->dev.layers[l].views || !m->be.ops->moe_experts) return 0;
        const sl_tensor *proto[3];
        dev_proto(m, l, proto);
        if (!m->be.ops->moe_experts(&m->be, NULL, NULL, NULL, NULL, NULL, NULL, proto, 0,
                                    m->cfg.n_experts_used))
            return 0;
    }
    return 1;
}

/* A decode step's picks at layer l against the last step's there (sl_stats.decode_repeats:
 * what a prefetch of the last step's experts would find), then kept for the next. */
static void count_repeats(sl_session *s, int32_t l, const int32_t *ids) {
    sl_session_buf *b = &s->b;
    sl_stats *st = &s->model->stats;
    const int32_t k = s->model->cfg.n_experts_used;
    int32_t *prev = b->h_prev_ids + (size_t)l * (size_t)k;
    if (b->prev_set[l]) {
        st->decode_picks += k;
        for (int32_t r = 0; r < k; r++)
            for (int32_t q = 0; q < k; q++)
                if (ids[r] == prev[q]) {
                    st->decode_repeats++;
                    break;
                }
    }
    memcpy(prev, ids, (size_t)k * sizeof *prev);
    b->prev_set[l] = 1;
}

/* The shared expert of layer l (when it has one) into sh_out: sigmoid(gate . x) * shared(x).
 * Queued where the routed experts leave the device idle or copying: after the host has read
 * the picks (their copies then overlap it), or after the fused kernels. */
static void shared_expert(sl_session *s, const sl_layer *L, int32_t T) {
    const sl_backend *be = &s->model->be;
    sl_session_buf *b = &s->b;
    if (!L->sh_router.data) return;
    const double t0 = sl_now();
    swiglu_mlp(s, b->ffn_out, b->xn, &L->sh_gate, &L->sh_up, &L->sh_down, T);
    be->ops->matmul(be, b->sh_logit, b->xn, &L->sh_router, NULL, T);
    be->ops->activate(be, b->sh_logit, b->sh_logit, (size_t)T, 1.0f, 1.0f, SL_ACT_SIGMOID);
    be->ops->weighted_sum(be, b->sh_out, b->ffn_out, b->sh_logit, T, 1,
                          (int32_t)s->model->cfg.hidden_size);
    s->model->stats.t_expert_compute += sl_now() - t0;
}

/*
 * Routed experts for a chunk of T tokens. Tokens are grouped by expert so
 * each expert's weights are fetched and streamed through once per chunk;
 * each (token, rank) result lands in its own row of expert_out, and the rows
 * are summed per token in router-rank order, so the sum never depends on the
 * chunk, the grouping or where the weights came from.
 */
static sl_status moe(sl_session *s, int32_t l, int32_t T, sl_error *err) {
    sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = &m->be;
    const sl_layer *L = &m->layers[l];
    sl_session_buf *b = &s->b;
    sl_expert_store *store = &m->experts;
    const int32_t E = c->n_experts, k = c->n_experts_used;
    const size_t H = (size_t)c->hidden_size;

    double t0 = sl_now();
    /* Routing runs in backend memory; the picks and weights stay there for the experts. */
    int32_t *ids_dev = T == 1 ? b->route_ids + (size_t)l * (size_t)k : b->topk_ids_dev;
    be->ops->moe_route(be, ids_dev, b->topk_w_dev, b->router_logits, b->xn, &L->router, T, k,
                       c->norm_topk_prob);
    /* Decode with a slot per expert in backend memory: nothing to fetch, so no host step at
     * all; the histogram and cache counts wait for the end of the pass (blk_moe_settle). */
    if (T == 1 && m->dev.all && fused_experts(s, l, ids_dev)) {
        b->moe_pending[l] = 1;
        double t1 = sl_now();
        m->stats.t_router += t1 - t0;
        shared_expert(s, L, T);
        goto shared;
    }
    /* A decode step through an expert cache: the fused kernels start on the slots the cache
     * has while the host reads the picks (a pick without a slot makes them skip the token).
     * When every pick had a slot their result stands; else they run again below, once the
     * misses are copied in. */
    int spec = 0;
    if (T == 1 && m->dev.layers && be->ops->to_host_begin) {
        be->ops->to_host_begin(be, b->topk_ids, ids_dev, (size_t)k * sizeof(int32_t));
        spec = fused_experts(s, l, ids_dev);
        be->ops->to_host_end(be);
    } else {
        be->ops->to_host(be, b->topk_ids, ids_dev, (size_t)(T * k) * sizeof(int32_t));
    }
    memset(b->expert_count, 0, (size_t)E * sizeof(int32_t));
    for (int32_t i = 0; i < T * k; i++) {
        SL_ASSERT(b->topk_ids[i] >= 0 && b->topk_ids[i] < E);
        b->expert_count[b->topk_ids[i]]++;
    }
    if (T == 1)
        count_repeats(s, l, b->topk_ids);
    else
        b->prev_set[l] = 0; /* the next decode step's previous step is not a decode step */
    /* Distinct experts in ascending order, and (counting sort) each one's
     * (token*k + rank) rows, contiguous and in token order. */
    int32_t n_used = 0, fill = 0;
    int64_t *hist = store->layers[l].hist;
    for (int32_t e = 0; e < E; e++) {
        b->expert_start[e] = fill;
        fill += b->expert_count[e];
        hist[e] += b->expert_count[e];
        if (b->expert_count[e]) b->expert_list[n_used++] = e;
    }
    for (int32_t i = 0; i < T * k; i++)
        b->expert_rows[b->expert_start[b->topk_ids[i]]++] = i;
    const int ahead = spec && sl_dev_cache_has(&m->dev, l, b->topk_ids, k);
    m->stats.gpu_steps_ahead += ahead;
    m->stats.gpu_steps_rerun += spec && !ahead;
    int fused = 0;
    double t1 = sl_now();
    m->stats.t_router += t1 - t0;
    shared_expert(s, L, T); /* a device runs it while the host fetches and copies experts */
    t1 = sl_now();

    /* Experts in groups the cache can hold at once, so each is read at most once
     * per chunk; those already cached go first, before any miss can evict them.
     * The order changes nothing in the result: every (token, rank) output has its
     * own row. expert_start[e] now marks the end of e's rows. */
    int32_t n_cached = 0;
    for (int32_t j = 0; j < n_used; j++) {
        const int32_t e = b->expert_list[j];
        if (!sl_experts_cached(store, l, e)) continue;
        memmove(b->expert_list + n_cached + 1, b->expert_list + n_cached,
                (size_t)(j - n_cached) * sizeof(int32_t));
        b->expert_list[n_cached++] = e;
    }
    int32_t cap = sl_experts_capacity(store, l);
    if (m->dev.layers) cap = SL_MIN(cap, m->dev.n_slots);
    for (int32_t j0 = 0; j0 < n_used; j0 += cap) {
        const int32_t nj = SL_MIN(cap, n_used - j0);
        /* The previous group's queued copies read host slots this fetch may refill (and the
         * router's to_host above already waited for those of earlier calls). */
        if (j0 && m->dev.layers) be->ops->sync(be);
        sl_status st = sl_experts_fetch(store, l, b->expert_list + j0, nj, b->fetched, err);
        if (!st && m->dev.layers) {
            sl_dev_cache_map(&m->dev, be, l, b->expert_list + j0, nj, b->fetched);
            if (be->ops->copy_join) be->ops->copy_join(be); /* the experts read the copies */
        }
        double t2 = sl_now();
        m->stats.t_expert_io += t2 - t1;
        if (st) return st;
        /* A token's experts all mapped at once: the fused kernels of the no-sync path (same
         * bits as the batches), on the table rows the mapping just wrote. */
        if (T == 1 && nj == n_used && (ahead || fused_experts(s, l, ids_dev))) {
            fused = 1;
        } else { /* runs of experts whose rows fit the activation buffers (one expert's do: a
                  * token picks it at most once) */
            for (int32_t a = 0, z; a < nj; a = z) {
                int32_t rows = 0;
                for (z = a;
                     z < nj && rows + b->expert_count[b->expert_list[j0 + z]] <= s->max_batch; z++)
                    rows += b->expert_count[b->expert_list[j0 + z]];
                experts_batched(s, b->expert_list + j0 + a, b->fetched + a, z - a, rows);
            }
        }
        t1 = sl_now();
        m->stats.t_expert_compute += t1 - t2;
    }
    if (!fused) be->ops->weighted_sum(be, b->out, b->expert_out, b->topk_w_dev, T, k, (int32_t)H);
shared:
    if (L->sh_router.data) be->ops->axpy(be, b->out, 1.0f, b->sh_out, (size_t)T * H);
    return SL_OK;
}

void blk_moe_settle(sl_session *s) {
    sl_session_buf *b = &s->b;
    sl_model *m = s->model;
    if (!memchr(b->moe_pending, 1, (size_t)m->cfg.n_layers)) return;
    const int32_t k = m->cfg.n_experts_used, E = m->cfg.n_experts;
    m->be.ops->to_host(&m->be, b->h_route_ids, b->route_ids,
                       (size_t)m->cfg.n_layers * (size_t)k * sizeof(int32_t));
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        if (!b->moe_pending[l]) continue;
        const int32_t *ids = b->h_route_ids + (size_t)l * (size_t)k;
        for (int32_t r = 0; r < k; r++) {
            SL_ASSERT(ids[r] >= 0 && ids[r] < E);
            m->experts.layers[l].hist[ids[r]]++;
        }
        sl_dev_cache_count(&m->dev, l, ids, k);
        count_repeats(s, l, ids);
        b->moe_pending[l] = 0;
    }
}

sl_status blk_ffn(sl_session *s, int32_t l, int32_t T, sl_error *err) {
    const sl_layer *L = &s->model->layers[l];
    if (L->is_moe) return moe(s, l, T, err);
    swiglu_mlp(s, s->b.out, s->b.xn, &L->mlp_gate, &L->mlp_up, &L->mlp_down, T);
    return SL_OK;
}

void blk_embed(sl_session *s, float *y, const int32_t *ids, int32_t T) {
    const sl_backend *be = &s->model->be;
    be->ops->to_dev(be, s->b.ids, ids, (size_t)T * sizeof(int32_t));
    be->ops->embed(be, y, &s->model->embed, s->b.ids, T);
}

void blk_head(sl_session *s, const float *x, int32_t rows, float *logits) {
    const sl_model *m = s->model;
    const sl_backend *be = &m->be;
    s->b.head_x = x; /* for the finite check of sl_session_forward, logits or not */
    s->b.head_rows = rows;
    if (!logits) return;
    /* Straight into the caller's buffer when backend memory is host memory. */
    float *dst = be->device ? s->b.logits : logits;
    be->ops->matmul(be, dst, x, &m->lm_head, NULL, rows);
    if (s->defer_logits) return; /* sl_session_forward copies them after the graph */
    be->ops->to_host(be, logits, dst, (size_t)rows * (size_t)m->cfg.vocab_size * sizeof(float));
}

/* x += out, xn = its norm with w (add_rmsnorm), out of place into x_alt where the backend can
 * leave it to the next op (add_rmsnorm_next; the two buffers swap). */
static void residual_norm(sl_session *s, const sl_tensor *w, int32_t T) {
    const sl_model *m = s->model;
    const sl_backend *be = &m->be;
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

sl_status blk_prenorm_decoder(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                              int all_logits, sl_error *err) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = &m->be;
    const sl_ops *op = be->ops;
    sl_session_buf *b = &s->b;
    const int32_t H = c->hidden_size;
    const float eps = c->rms_norm_eps, off = m->norm_offset;

    /* Each residual add is fused with the norm that follows it (the next sublayer's, or the
     * final one). A backend with add_rmsnorm_next may fold it into the sublayer's first GEMV;
     * the residual then goes to the other buffer, and the two swap (an even number of times a
     * pass, so b->x ends where it began). */
    blk_embed(s, b->x, ids, T);
    op->rmsnorm(be, b->xn, b->x, &m->layers[0].attn_norm, T, H, eps, off);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        const double t0 = sl_now();
        if (L->is_linear)
            blk_linear_attention(s, l, T);
        else
            blk_attention(s, l, T, NULL);
        s->model->stats.t_attention += sl_now() - t0;
        residual_norm(s, &L->ffn_norm, T);
        sl_status st = blk_ffn(s, l, T, err);
        if (st) return st;
        residual_norm(s, l + 1 < c->n_layers ? &m->layers[l + 1].attn_norm : &m->norm, T);
    }
    /* Only the rows whose logits are wanted go through the head. */
    const int32_t first = all_logits ? 0 : T - 1;
    blk_head(s, b->xn + (size_t)first * (size_t)H, T - first, logits);
    return SL_OK;
}
