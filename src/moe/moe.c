/* The MoE step (contracts in moe.h). */
#include "moe/moe.h"

#include <math.h>

/* ------------------------------------------------------------- scratch */

void sl_moe_layout(sl_moe_scratch *ms, const sl_moe_dims *d, const sl_moe_env *env, uint8_t *dev,
                   uint8_t *host, size_t *dev_bytes, size_t *host_bytes) {
    ms->d = *d;
    ms->env = *env;
    sl_carver cv = {.base = dev}, hv = {.base = host};
    const size_t B = (size_t)d->max_batch, H = (size_t)d->hidden;
    const size_t E = (size_t)SL_MAX(d->n_experts, 1), k = (size_t)SL_MAX(d->k, 1);
    const size_t nl = (size_t)d->n_layers, D = (size_t)SL_MAX(d->decode_rows, 1);
    const size_t R = (size_t)SL_MAX(d->max_rows, d->max_batch);
    ms->d.max_rows = (int32_t)R;
    ms->grp_idx = sl_carve(&cv, 3 * R, sizeof(int32_t));
    ms->h_grp = sl_carve(&hv, 3 * R, sizeof(int32_t));
    ms->bx = sl_carve(&hv, 2 * E, sizeof(float *));
    ms->bg = sl_carve(&hv, 2 * E, sizeof(float *));
    ms->bo = sl_carve(&hv, E, sizeof(float *));
    ms->wg = sl_carve(&hv, 2 * E, sizeof(sl_tensor *));
    ms->wd = sl_carve(&hv, E, sizeof(sl_tensor *));
    ms->bT = sl_carve(&hv, 2 * E, sizeof(int32_t));
    ms->topk_w = sl_carve(&cv, B * k, sizeof(float));
    ms->topk_ids_dev = sl_carve(&cv, B * k, sizeof(int32_t));
    ms->route_ids = sl_carve(&cv, nl * D * k, sizeof(int32_t));
    ms->h_route_ids = sl_carve(&hv, nl * D * k, sizeof(int32_t));
    ms->pending = sl_carve(&hv, nl, 1);
    ms->h_prev_ids = sl_carve(&hv, nl * k, sizeof(int32_t));
    ms->prev_set = sl_carve(&hv, nl, 1);
    ms->act = sl_carve(&cv, D * k * (size_t)SL_MAX(d->inter, 1), sizeof(float));
    ms->xg = sl_carve(&cv, R * H, sizeof(float));
    const size_t RI = R * (size_t)SL_MAX(d->inter, 1);
    ms->run_gate = R > B ? sl_carve(&cv, RI, sizeof(float)) : NULL;
    ms->run_up = R > B ? sl_carve(&cv, RI, sizeof(float)) : NULL;
    ms->run_out = R > B ? sl_carve(&cv, R * H, sizeof(float)) : NULL;
    ms->xw = sl_carve(&cv, d->weight_input ? B * k * H : 0, sizeof(float));
    ms->expert_out = sl_carve(&cv, B * k * H, sizeof(float));
    ms->router_logits = sl_carve(&cv, B * E, sizeof(float));
    ms->sh_logit = sl_carve(&cv, B, sizeof(float));
    ms->sh_out = sl_carve(&cv, d->shared ? B * H : 0, sizeof(float));
    ms->topk_ids = sl_carve(&hv, B * k, sizeof(int32_t));
    ms->expert_list = sl_carve(&hv, E, sizeof(int32_t));
    ms->expert_rows = sl_carve(&hv, B * k, sizeof(int32_t));
    ms->expert_count = sl_carve(&hv, E, sizeof(int32_t));
    ms->expert_start = sl_carve(&hv, E, sizeof(int32_t));
    ms->fetched = sl_carve(&hv, E, sizeof(sl_expert *));
    const size_t Ed = env->dev && env->dev->layers ? E : 0;
    ms->miss_ids = sl_carve(&hv, Ed, sizeof(int32_t));
    ms->miss_at = sl_carve(&hv, Ed, sizeof(int32_t));
    ms->miss_views = sl_carve(&hv, Ed, sizeof(sl_expert *));
    ms->miss_put = sl_carve(&hv, Ed, 1);
    const size_t P = (size_t)SL_MAX(d->prefetch, 0), npred = SL_MIN(D * P, E);
    ms->pred_logits = sl_carve(&cv, P ? D * E : 0, sizeof(float));
    ms->h_pred_logits = sl_carve(&hv, P ? D * E : 0, sizeof(float));
    ms->h_pred_ids = sl_carve(&hv, P ? nl * npred : 0, sizeof(int32_t));
    ms->h_pred_n = sl_carve(&hv, P ? nl : 0, sizeof(int32_t));
    ms->pred_mark = sl_carve(&hv, P ? E : 0, 1);
    ms->pf_ids = sl_carve(&hv, P && Ed ? E : 0, sizeof(int32_t));
    ms->replay_pos = sl_carve(&hv, env->replay ? nl : 0, sizeof(int64_t));
    ms->moe_ord = sl_carve(&hv, env->replay ? nl : 0, sizeof(int32_t));
    if (env->replay && host)
        for (int32_t l = 0, m = 0; l < d->n_layers; l++)
            ms->moe_ord[l] = env->store->layers[l].n_experts > 0 ? m++ : -1;
    *dev_bytes = cv.off;
    *host_bytes = hv.off;
}

void sl_moe_forget_steps(sl_moe_scratch *ms) {
    memset(ms->prev_set, 0, (size_t)ms->d.n_layers);
}

void sl_moe_drop_pending(sl_moe_scratch *ms) {
    memset(ms->pending, 0, (size_t)ms->d.n_layers);
}

/* ------------------------------------------------------------- compute */

void sl_moe_swiglu_mlp(const sl_backend *be, float *out, const float *x, const sl_tensor *g,
                       const sl_tensor *u, const sl_tensor *d, float *hg, float *hu, int32_t T) {
    const size_t I = (size_t)g->shape[0];
    be->ops->matmul(be, hg, x, g, NULL, T);
    be->ops->matmul(be, hu, x, u, NULL, T);
    be->ops->swiglu(be, hg, hg, hu, (size_t)T * I);
    be->ops->matmul(be, out, hg, d, NULL, T);
}

/* Where a run of experts leaves its output rows: the step's own buffer when its runs outgrow the
 * caller's (max_rows > max_batch). */
static float *run_rows(const sl_moe_scratch *ms, const sl_moe_io *io) {
    return ms->run_out ? ms->run_out : io->rows;
}

/*
 * The fetched experts list[0..n) (their views), whose rows total at most max_batch,
 * in one pass each: gather every row they read into xg (expert by expert), the gate and up
 * matmuls of all of them as one batch, one SwiGLU, the down matmuls as another batch, one
 * scatter of the results to their (token, rank) rows; or, when the run holds the chunk's every
 * row (rows == chunk_rows), no scatter: they stay in run_rows(), and grp_idx + 2 rows says
 * where each (token, rank) row's is; it returns 1 then. Per row it computes exactly what one
 * expert at a time does.
 */
static int experts_batched(sl_moe_scratch *ms, const sl_moe_io *io, const int32_t *list,
                           const sl_expert *const *views, int32_t n, int32_t rows,
                           int32_t chunk_rows) {
    const sl_backend *be = ms->env.be;
    const size_t H = (size_t)ms->d.hidden, I = (size_t)ms->d.inter;
    const int32_t k = ms->d.k;
    /* the step's own buffers when its runs outgrow the caller's (max_rows > max_batch) */
    float *gate = ms->run_gate ? ms->run_gate : io->gate, *up = ms->run_up ? ms->run_up : io->up;
    float *out = run_rows(ms, io);
    int32_t off = 0;
    for (int32_t j = 0; j < n; j++) {
        const int32_t e = list[j], cnt = ms->expert_count[e];
        const int32_t *r = ms->expert_rows + ms->expert_start[e] - cnt;
        for (int32_t i = 0; i < cnt; i++) {
            /* row read: the token's, or its (token, rank) row of scaled inputs */
            ms->h_grp[off + i] = ms->d.weight_input ? r[i] : r[i] / k;
            ms->h_grp[rows + off + i] = r[i]; /* (token, rank) row written */
        }
        const sl_expert *ex = views[j];
        /* items j (gate) and n + j (up) of one batch, then j of the down batch */
        ms->bx[j] = ms->bx[n + j] = ms->xg + (size_t)off * H;
        ms->bg[j] = gate + (size_t)off * I;
        ms->bg[n + j] = up + (size_t)off * I;
        ms->bo[j] = out + (size_t)off * H;
        ms->wg[j] = &ex->gate, ms->wg[n + j] = &ex->up, ms->wd[j] = &ex->down;
        ms->bT[j] = ms->bT[n + j] = cnt;
        off += cnt;
    }
    const int whole = rows == chunk_rows;
    if (whole)
        for (int32_t i = 0; i < rows; i++)
            ms->h_grp[2 * rows + ms->h_grp[rows + i]] = i;
    be->ops->to_dev(be, ms->grp_idx, ms->h_grp, (whole ? 3 : 2) * (size_t)rows * sizeof(int32_t));
    be->ops->copy_rows(be, ms->xg, NULL, ms->d.weight_input ? ms->xw : io->x, ms->grp_idx, rows,
                       (int32_t)H);
    be->ops->matmul_batch(be, ms->bg, (const float *const *)ms->bx, ms->wg, ms->bT, 2 * n);
    const int bias = n > 0 && views[0]->gate_bias.data; /* a layer's experts all have or not */
    for (int32_t j = 0; bias && j < n; j++) {
        be->ops->add_bias(be, ms->bg[j], &views[j]->gate_bias, ms->bT[j]);
        be->ops->add_bias(be, ms->bg[n + j], &views[j]->up_bias, ms->bT[j]);
    }
    if (ms->d.glu == SL_GLU_SWIGLU_CLAMPED)
        be->ops->swiglu_clamped(be, gate, gate, up, (size_t)rows * I, ms->d.glu_alpha,
                                ms->d.glu_limit);
    else if (ms->d.glu == SL_GLU_GELU_TANH)
        be->ops->act_mul(be, gate, gate, up, (size_t)rows * I, SL_ACT_GELU_TANH);
    else
        be->ops->swiglu(be, gate, gate, up, (size_t)rows * I);
    be->ops->matmul_batch(be, ms->bo, (const float *const *)ms->bg, ms->wd, ms->bT, n);
    for (int32_t j = 0; bias && j < n; j++)
        be->ops->add_bias(be, ms->bo[j], &views[j]->down_bias, ms->bT[j]);
    if (!whole)
        be->ops->copy_rows(be, ms->expert_out, ms->grp_idx + rows, out, NULL, rows, (int32_t)H);
    return whole;
}

/* Whether layer l's experts can go through the backend's fused kernels (moe_experts): SwiGLU
 * ones without linear biases, which those kernels do not compute. */
static int fusable(const sl_dev_cache *dev, int32_t l, int32_t glu) {
    return glu == SL_GLU_SWIGLU && !dev->layers[l].views[0].gate_bias.data;
}

/* The shapes and dtypes of layer l's expert slots in the device cache (all alike). */
static void dev_proto(const sl_dev_cache *dev, int32_t l, const sl_tensor *proto[3]) {
    const sl_expert *v = &dev->layers[l].views[0];
    proto[0] = &v->gate, proto[1] = &v->up, proto[2] = &v->down;
}

/* T tokens' k experts each (picks ids, weights in topk_w) through the backend's fused kernels,
 * on the device cache's table of layer l, combined into out; 0 when there is no such cache or
 * kernel. With weight_input the T k scaled input rows go through as T k one-pick tokens
 * (weights 1) into expert_out, then summed as the batched path sums them: the same bits. */
static int fused_experts(sl_moe_scratch *ms, const sl_moe_io *io, int32_t l, const int32_t *ids,
                         int32_t T) {
    const sl_backend *be = ms->env.be;
    const sl_dev_cache *dev = ms->env.dev;
    const int32_t k = ms->d.k;
    if (!dev->layers || !be->ops->moe_experts || !fusable(dev, l, ms->d.glu)) return 0;
    const sl_tensor *proto[3];
    dev_proto(dev, l, proto);
    const sl_expert_ptrs *table = dev->layers[l].table;
    if (!ms->d.weight_input)
        return be->ops->moe_experts(be, io->out, ms->act, io->x, ids, ms->topk_w, table, proto, T,
                                    k);
    if (!be->ops->moe_experts(be, ms->expert_out, ms->act, ms->xw, ids, ms->topk_w, table, proto,
                              T * k, 1))
        return 0;
    be->ops->weighted_sum(be, io->out, ms->expert_out, NULL, ms->topk_w, T, k, ms->d.hidden);
    return 1;
}

int sl_moe_no_host_step(const sl_backend *be, const sl_expert_store *store, const sl_dev_cache *dev,
                        int32_t k, int weight_input, int32_t glu) {
    for (int32_t l = 0; l < store->n_layers; l++) {
        if (!store->layers[l].n_experts) continue;
        if (!dev->all || !dev->layers[l].views || !be->ops->moe_experts || !fusable(dev, l, glu))
            return 0;
        const sl_tensor *proto[3];
        dev_proto(dev, l, proto);
        if (!be->ops->moe_experts(be, NULL, NULL, NULL, NULL, NULL, NULL, proto, 0,
                                  weight_input ? 1 : k))
            return 0;
    }
    return 1;
}

/* A decode step's picks at layer l against the last step's there (sl_stats.decode_repeats:
 * what a prefetch of the last step's experts would find), then kept for the next. */
static void count_repeats(sl_moe_scratch *ms, int32_t l, const int32_t *ids) {
    sl_stats *st = ms->env.stats;
    const int32_t k = ms->d.k;
    int32_t *prev = ms->h_prev_ids + (size_t)l * (size_t)k;
    if (ms->prev_set[l]) {
        st->decode_picks += k;
        for (int32_t r = 0; r < k; r++)
            for (int32_t q = 0; q < k; q++)
                if (ids[r] == prev[q]) {
                    st->decode_repeats++;
                    break;
                }
    }
    memcpy(prev, ids, (size_t)k * sizeof *prev);
    ms->prev_set[l] = 1;
}

/* Rows (tokens) of picks at layer l into the routing trace, one record each (--router-trace). A
 * write error sticks in the writer, which the forward pass reports. */
static sl_status trace_rows(sl_moe_scratch *ms, int32_t l, const int32_t *ids, int32_t rows,
                            sl_error *err) {
    const int32_t k = ms->d.k;
    for (int32_t t = 0; t < rows; t++) {
        sl_status st = sl_trace_writer_add(ms->env.trace, l, SL_TRACE_PICKS,
                                           ids + (size_t)t * (size_t)k, k, err);
        if (st) return st;
    }
    return SL_OK;
}

/* The shared expert (when the layer has one) into sh_out: sigmoid(sh_router . x) * shared(x),
 * or shared(x) alone when it has no gate. Queued where the routed experts leave the device idle
 * or copying: after the host has read the picks (their copies then overlap it), or after the
 * fused kernels. */
static void shared_expert(sl_moe_scratch *ms, const sl_moe_weights *w, const sl_moe_io *io,
                          int32_t T) {
    const sl_backend *be = ms->env.be;
    if (!w->sh_gate) return;
    const double t0 = sl_now();
    if (!w->sh_router) {
        sl_moe_swiglu_mlp(be, ms->sh_out, io->x, w->sh_gate, w->sh_up, w->sh_down, io->gate, io->up,
                          T);
        ms->env.stats->t_expert_compute += sl_now() - t0;
        return;
    }
    sl_moe_swiglu_mlp(be, io->rows, io->x, w->sh_gate, w->sh_up, w->sh_down, io->gate, io->up, T);
    be->ops->matmul(be, ms->sh_logit, io->x, w->sh_router, NULL, T);
    be->ops->activate(be, ms->sh_logit, ms->sh_logit, (size_t)T, 1.0f, 1.0f, SL_ACT_SIGMOID);
    be->ops->weighted_sum(be, ms->sh_out, io->rows, NULL, ms->sh_logit, T, 1, ms->d.hidden);
    ms->env.stats->t_expert_compute += sl_now() - t0;
}

/* Pre-gating: the next MoE layer's router applied to this layer's input predicts its picks (the
 * residual stream changes little from one layer to the next: 79-85% of the picks of a trained
 * model's routers, tests/fixtures/trace/README.md), and the predicted experts not cached start
 * reading into that layer's slots while this layer computes. Results never change: the next
 * layer fetches what its own router picks and only finds some of it read already. */
/* Layer l's row of predicted experts: room for every row's picks, at most all experts. */
static int32_t *pred_ids(const sl_moe_scratch *ms, int32_t l) {
    const size_t D = (size_t)SL_MAX(ms->d.decode_rows, 1), P = (size_t)ms->d.prefetch;
    return ms->h_pred_ids + (size_t)l * SL_MIN(D * P, (size_t)ms->d.n_experts);
}

/* Reads of the predicted experts ids[0..n) of layer l into the store, but for those the device
 * cache holds already (the store reads a device's experts only to copy them there). */
static void prefetch(sl_moe_scratch *ms, int32_t l, const int32_t *ids, int32_t n) {
    const sl_dev_cache *dev = ms->env.dev;
    if (dev->layers) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (sl_slot_lookup(&dev->layers[l].slots, ids[i]) < 0) ms->pf_ids[m++] = ids[i];
        ids = ms->pf_ids, n = m;
    }
    sl_experts_prefetch(ms->env.store, l, ids, n);
}

static void predict_next(sl_moe_scratch *ms, const sl_moe_weights *w, const sl_moe_io *io,
                         int32_t T) {
    const sl_backend *be = ms->env.be;
    const int32_t E = ms->d.n_experts, P = SL_MIN(ms->d.prefetch, E), nl = w->next_layer;
    int32_t *ids = pred_ids(ms, nl);
    int32_t n = 0;
    memset(ms->pred_mark, 0, (size_t)E);
    if (ms->env.replay) { /* the trace's predictions, made by the traced model's routers */
        for (int32_t t = 0; t < T; t++) {
            int32_t np;
            const uint16_t *p =
                sl_route_replay_pred(ms->env.replay, ms->moe_ord[nl], ms->replay_pos[nl] + t, &np);
            for (int32_t r = 0; r < SL_MIN(np, P); r++)
                if (!ms->pred_mark[p[r]]) ms->pred_mark[p[r]] = 1, ids[n++] = p[r];
        }
        ms->h_pred_n[nl] = n;
        prefetch(ms, nl, ids, n);
        return;
    }
    be->ops->matmul(be, ms->pred_logits, io->x, w->next_router, w->next_router_bias, T);
    be->ops->to_host(be, ms->h_pred_logits, ms->pred_logits, (size_t)T * (size_t)E * sizeof(float));
    /* DeepSeek's selection bias joins where it is host memory (a device predicts without it) */
    const sl_tensor *sbt = w->next_select_bias;
    const float *sb =
        sbt && !be->device && sbt->dtype == SL_DTYPE_F32 ? (const float *)sbt->data : NULL;
    for (int32_t t = 0; t < T; t++) {
        float *lg = ms->h_pred_logits + (size_t)t * (size_t)E;
        if (sb)
            for (int32_t e = 0; e < E; e++)
                lg[e] += sb[e];
        for (int32_t r = 0; r < P; r++) { /* the P largest, one pass each (P, E small) */
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++)
                if (lg[e] == lg[e] && (best < 0 || lg[e] > lg[best])) best = e;
            if (best < 0) break;
            lg[best] = -INFINITY;
            if (!ms->pred_mark[best]) {
                ms->pred_mark[best] = 1;
                ids[n++] = best;
            }
        }
    }
    ms->h_pred_n[nl] = n;
    /* the prediction into the routing trace (kind 1, records of up to k ids: trace-replay
     * --prefetch); a write error sticks in the writer */
    for (int32_t i = 0; ms->env.trace && i < n; i += ms->d.k)
        sl_trace_writer_add(ms->env.trace, nl, SL_TRACE_PREDICT, ids + i, SL_MIN(ms->d.k, n - i),
                            NULL);
    prefetch(ms, nl, ids, n);
}

/* How many of the experts predicted for layer l it picked (ms->expert_list[0..n_used)). */
static void score_prediction(sl_moe_scratch *ms, int32_t l, int32_t n_used) {
    const int32_t n = ms->h_pred_n[l];
    if (!n) return;
    const int32_t *ids = pred_ids(ms, l);
    int64_t hits = 0;
    for (int32_t i = 0; i < n; i++)
        hits += ms->expert_count[ids[i]] > 0;
    ms->env.stats->pred_experts += n;
    ms->env.stats->pred_hits += hits;
    ms->env.stats->pred_needed += n_used;
    ms->h_pred_n[l] = 0;
}

/* Miss m of dev_fetch, once its read is in (waited for, if still out), into a device slot. */
static sl_status copy_in(sl_moe_scratch *ms, int32_t l, int32_t m, sl_error *err) {
    sl_status st = ms->env.store->overlap ? sl_experts_fetch_wait(ms->env.store, l, m, err) : SL_OK;
    if (st) return st;
    ms->fetched[ms->miss_at[m]] =
        sl_dev_cache_put(ms->env.dev, ms->env.be, l, ms->miss_ids[m], ms->miss_views[m]);
    ms->miss_put[m] = 1;
    return SL_OK;
}

/* The device path's fetch of experts ids[0..n) of layer l into ms->fetched: those the device
 * cache holds are pinned there, the others read through the store (its cache, else the disk)
 * and each copied into a device slot as soon as its read lands, while the later ones still
 * read; the copies are queued (sl_dev_cache_map's contract). Pre-gating (predict) starts
 * behind the misses' reads. */
static sl_status dev_fetch(sl_moe_scratch *ms, int32_t l, const int32_t *ids, int32_t n,
                           int predict, const sl_moe_weights *w, const sl_moe_io *io, int32_t T,
                           sl_error *err) {
    sl_expert_store *store = ms->env.store;
    sl_dev_cache *dev = ms->env.dev;
    const sl_expert **views = ms->fetched;
    for (int32_t i = 0; i < n; i++)
        views[i] = NULL;
    const int32_t nm = sl_dev_cache_lookup(dev, l, ids, n, views);
    for (int32_t i = 0, m = 0; m < nm; i++)
        if (!views[i]) ms->miss_at[m] = i, ms->miss_ids[m++] = ids[i];
    const int overlap = store->overlap;
    sl_status st = SL_OK;
    if (nm)
        st = overlap ? sl_experts_fetch_start(store, l, ms->miss_ids, nm, ms->miss_views, err)
                     : sl_experts_fetch(store, l, ms->miss_ids, nm, ms->miss_views, err);
    if (!st && predict) predict_next(ms, w, io, T);
    if (st) return st;
    memset(ms->miss_put, 0, (size_t)nm);
    /* In the order the reads land: every read that is in copies in, and when none is, the
     * first still out is waited for. Without overlap every read is in already. */
    for (int32_t left = nm; left > 0;) {
        int32_t first = -1, put = 0;
        for (int32_t m = 0; m < nm; m++)
            if (!ms->miss_put[m]) {
                if (first < 0) first = m;
                if (overlap && !sl_experts_fetch_ready(store, l, m)) continue;
                if ((st = copy_in(ms, l, m, err))) return st;
                put++;
            }
        if (!put && (st = copy_in(ms, l, first, err))) return st;
        left -= SL_MAX(put, 1);
    }
    return SL_OK;
}

/*
 * Routed experts for a chunk of T tokens. Tokens are grouped by expert so
 * each expert's weights are fetched and streamed through once per chunk;
 * each (token, rank) result lands in its own row of expert_out, and the rows
 * are summed per token in router-rank order, so the sum never depends on the
 * chunk, the grouping or where the weights came from.
 */
sl_status sl_moe_forward(sl_moe_scratch *ms, int32_t l, const sl_moe_weights *w,
                         const sl_moe_io *io, int32_t T, sl_error *err) {
    const sl_backend *be = ms->env.be;
    sl_expert_store *store = ms->env.store;
    sl_dev_cache *dev = ms->env.dev;
    sl_stats *stats = ms->env.stats;
    const int32_t E = ms->d.n_experts, k = ms->d.k;
    const size_t H = (size_t)ms->d.hidden;

    double t0 = sl_now();
    /* Routing runs in backend memory; the picks and weights stay there for the experts. */
    /* One token, or the rows of a batched decode step: picks in the layer's own rows */
    const int32_t D = SL_MAX(ms->d.decode_rows, 1);
    const int decode_rows = T <= D;
    int32_t *ids_dev =
        decode_rows ? ms->route_ids + (size_t)l * (size_t)D * (size_t)k : ms->topk_ids_dev;
    const sl_route_args ra = {.ids = ids_dev,
                              .w = ms->topk_w,
                              .logits = ms->router_logits,
                              .x = io->router_x ? io->router_x : io->x,
                              .router = w->router,
                              .bias = w->router_bias,
                              .select_bias = w->select_bias,
                              .expert_scale = w->expert_scale,
                              .T = T,
                              .k = k,
                              .cfg = ms->d.route};
    be->ops->moe_route(be, &ra);
    if (ms->env.replay) { /* the trace's picks in place of the router's (weights stay its) */
        const sl_route_replay *rp = ms->env.replay;
        for (int32_t t = 0; t < T; t++) {
            const uint16_t *p = sl_route_replay_picks(rp, ms->moe_ord[l], ms->replay_pos[l] + t);
            for (int32_t r = 0; r < k; r++)
                ms->topk_ids[t * k + r] = p[r];
        }
        ms->replay_pos[l] += T;
        be->ops->to_dev(be, ids_dev, ms->topk_ids, (size_t)(T * k) * sizeof(int32_t));
    }
    if (ms->d.weight_input) { /* the weights go into the inputs; the sums then take 1 */
        be->ops->scale_rows(be, ms->xw, io->x, ms->topk_w, T * k, k, (int32_t)H);
        be->ops->fill(be, ms->topk_w, 1.0f, (size_t)T * (size_t)k);
    }
    /* Decode with a slot per expert in backend memory: nothing to fetch, so no host step at
     * all; the histogram and cache counts wait for the end of the pass (sl_moe_settle). */
    if (decode_rows && dev->all && fused_experts(ms, io, l, ids_dev, T)) {
        ms->pending[l] = 1;
        ms->pending_rows = T;
        double t1 = sl_now();
        stats->t_router += t1 - t0;
        shared_expert(ms, w, io, T);
        goto shared;
    }
    /* A decode step through an expert cache: the fused kernels start on the slots the cache
     * has while the host reads the picks (a pick without a slot makes them skip the token).
     * When every pick had a slot their result stands; else they run again below, once the
     * misses are copied in. */
    int spec = 0;
    if (T == 1 && dev->layers && be->ops->to_host_begin) {
        be->ops->to_host_begin(be, ms->topk_ids, ids_dev, (size_t)k * sizeof(int32_t));
        spec = fused_experts(ms, io, l, ids_dev, 1);
        be->ops->to_host_end(be);
    } else {
        be->ops->to_host(be, ms->topk_ids, ids_dev, (size_t)(T * k) * sizeof(int32_t));
    }
    memset(ms->expert_count, 0, (size_t)E * sizeof(int32_t));
    for (int32_t i = 0; i < T * k; i++) {
        SL_ASSERT(ms->topk_ids[i] >= 0 && ms->topk_ids[i] < E);
        ms->expert_count[ms->topk_ids[i]]++;
    }
    if (T == 1)
        count_repeats(ms, l, ms->topk_ids);
    else
        ms->prev_set[l] = 0; /* the next decode step's previous step is not a decode step */
    if (ms->env.trace) {
        sl_status st = trace_rows(ms, l, ms->topk_ids, T, err);
        if (st) return st;
    }
    /* Distinct experts in ascending order, and (counting sort) each one's
     * (token*k + rank) rows, contiguous and in token order. */
    int32_t n_used = 0, fill = 0;
    int64_t *hist = store->layers[l].hist;
    for (int32_t e = 0; e < E; e++) {
        ms->expert_start[e] = fill;
        fill += ms->expert_count[e];
        hist[e] += ms->expert_count[e];
        if (ms->expert_count[e]) ms->expert_list[n_used++] = e;
    }
    for (int32_t i = 0; i < T * k; i++)
        ms->expert_rows[ms->expert_start[ms->topk_ids[i]]++] = i;
    const int predict =
        ms->d.prefetch > 0 && decode_rows && w->next_router && store->mode == SL_EXPERTS_STREAM;
    if (ms->d.prefetch > 0) score_prediction(ms, l, n_used);
    const int ahead = spec && sl_dev_cache_has(dev, l, ms->topk_ids, k);
    stats->gpu_steps_ahead += ahead;
    stats->gpu_steps_rerun += spec && !ahead;
    int fused = 0;
    double t1 = sl_now();
    stats->t_router += t1 - t0;
    shared_expert(ms, w, io, T); /* a device runs it while the host fetches and copies experts */
    t1 = sl_now();

    /* Experts in groups the cache can hold at once, so each is read at most once
     * per chunk; those already cached go first, before any miss can evict them.
     * The order changes nothing in the result: every (token, rank) output has its
     * own row. expert_start[e] now marks the end of e's rows. */
    int32_t n_cached = 0;
    for (int pass = 0; pass < 2; pass++) /* those whose bytes are in, then those a prefetch reads */
        for (int32_t j = n_cached; j < n_used; j++) {
            const int32_t e = ms->expert_list[j];
            if (pass == 0 ? !sl_experts_cached_ready(store, l, e) : !sl_experts_cached(store, l, e))
                continue;
            memmove(ms->expert_list + n_cached + 1, ms->expert_list + n_cached,
                    (size_t)(j - n_cached) * sizeof(int32_t));
            ms->expert_list[n_cached++] = e;
        }
    int in_place = 0; /* the chunk's outputs left where its one run made them */
    int32_t cap = sl_experts_capacity(store, l);
    if (dev->layers) cap = SL_MIN(cap, dev->n_slots);
    for (int32_t j0 = 0; j0 < n_used; j0 += cap) {
        const int32_t nj = SL_MIN(cap, n_used - j0);
        /* The previous group's queued copies read host slots this fetch may refill (and the
         * router's to_host above already waited for those of earlier calls). */
        if (j0 && dev->layers) be->ops->sync(be);
        /* On the host, with overlap: the group's misses are read while its cached experts
         * compute, then each run of misses computes once its reads are in. The device path
         * copies each miss in as its read lands (dev_fetch), then computes the group. */
        const int overlap = !dev->layers && store->overlap;
        sl_status st;
        if (dev->layers) {
            st = dev_fetch(ms, l, ms->expert_list + j0, nj, !j0 && predict, w, io, T, err);
            if (!st && be->ops->copy_join) be->ops->copy_join(be); /* the experts read them */
        } else {
            st = overlap
                     ? sl_experts_fetch_start(store, l, ms->expert_list + j0, nj, ms->fetched, err)
                     : sl_experts_fetch(store, l, ms->expert_list + j0, nj, ms->fetched, err);
            if (!st && !j0 && predict) predict_next(ms, w, io, T); /* behind this layer's misses */
        }
        double t2 = sl_now();
        stats->t_expert_io += t2 - t1;
        if (st) return st;
        /* A token's experts all mapped at once: the fused kernels of the no-sync path (same
         * bits as the batches), on the table rows the mapping just wrote. */
        if (!overlap && T == 1 && nj == n_used && (ahead || fused_experts(ms, io, l, ids_dev, 1))) {
            fused = 1;
        } else { /* runs of experts whose rows fit the activation buffers (one expert's do: a
                  * token picks it at most once); with overlap a run is its first expert
                  * (waited for) and those after it already in */
            for (int32_t a = 0, z; a < nj; a = z) {
                if (overlap) {
                    const double tw = sl_now();
                    st = sl_experts_fetch_wait(store, l, a, err);
                    stats->t_expert_io += sl_now() - tw;
                    t2 += sl_now() - tw;
                    if (st) return st;
                }
                int32_t rows = 0;
                for (z = a;
                     z < nj && rows + ms->expert_count[ms->expert_list[j0 + z]] <= ms->d.max_rows &&
                     (z == a || !overlap || sl_experts_fetch_ready(store, l, z));
                     z++) {
                    if (overlap && z > a && (st = sl_experts_fetch_wait(store, l, z, err)))
                        return st; /* ready: failed or in, at once */
                    rows += ms->expert_count[ms->expert_list[j0 + z]];
                }
                in_place = experts_batched(ms, io, ms->expert_list + j0 + a, ms->fetched + a, z - a,
                                           rows, T * k);
            }
        }
        t1 = sl_now();
        stats->t_expert_compute += t1 - t2;
    }
    if (!fused)
        be->ops->weighted_sum(be, io->out, in_place ? run_rows(ms, io) : ms->expert_out,
                              in_place ? ms->grp_idx + 2 * T * k : NULL, ms->topk_w, T, k,
                              (int32_t)H);
shared:
    if (w->sh_gate) be->ops->axpy(be, io->out, 1.0f, ms->sh_out, (size_t)T * H);
    return SL_OK;
}

void sl_moe_settle(sl_moe_scratch *ms) {
    const int32_t n_layers = ms->d.n_layers, k = ms->d.k, E = ms->d.n_experts;
    if (!memchr(ms->pending, 1, (size_t)n_layers)) return;
    const sl_backend *be = ms->env.be;
    const size_t D = (size_t)SL_MAX(ms->d.decode_rows, 1);
    const int32_t n = ms->pending_rows * k;
    be->ops->to_host(be, ms->h_route_ids, ms->route_ids,
                     (size_t)n_layers * D * (size_t)k * sizeof(int32_t));
    for (int32_t l = 0; l < n_layers; l++) {
        if (!ms->pending[l]) continue;
        const int32_t *ids = ms->h_route_ids + (size_t)l * D * (size_t)k;
        for (int32_t r = 0; r < n; r++) {
            SL_ASSERT(ids[r] >= 0 && ids[r] < E);
            ms->env.store->layers[l].hist[ids[r]]++;
        }
        sl_dev_cache_count(ms->env.dev, l, ids, n);
        if (ms->env.trace) trace_rows(ms, l, ids, ms->pending_rows, NULL);
        if (ms->pending_rows == 1)
            count_repeats(ms, l, ids);
        else
            ms->prev_set[l] = 0; /* several sequences' picks: no previous step of one */
        ms->pending[l] = 0;
    }
}
