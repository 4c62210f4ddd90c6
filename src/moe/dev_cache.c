/* The expert cache in backend memory (contracts in dev_cache.h). */
#include "moe/dev_cache.h"

static size_t align64(size_t x) {
    return (x + 63) & ~(size_t)63;
}

/* Bytes at scales (and as many at biases where there are any). */
static size_t scale_bytes(const sl_tensor *t) {
    return sl_tensor_scale_bytes(t);
}

/* Any host view of one of the layer's experts (they all share dtypes and shapes): a stream
 * slot's, else the mapped or resident view of expert 0. */
static const sl_expert *sample_view(const sl_expert_layer *L) {
    return L->slots.n_slots ? &L->slot_views[0] : L->views ? &L->views[0] : NULL;
}

sl_status sl_dev_cache_init(sl_dev_cache *d, const sl_backend *be, const sl_expert_store *store,
                            int32_t n_slots, sl_cache_policy policy, sl_error *err) {
    return sl_dev_cache_init_range(d, be, store, 0, store->n_layers, n_slots, policy, err);
}

sl_status sl_dev_cache_init_range(sl_dev_cache *d, const sl_backend *be,
                                  const sl_expert_store *store, int32_t layer0, int32_t layer1,
                                  int32_t n_slots, sl_cache_policy policy, sl_error *err) {
    memset(d, 0, sizeof *d);
    d->n_layers = store->n_layers;
    d->n_experts = store->n_experts;
    d->n_slots = SL_MAX(1, SL_MIN(n_slots > 0 ? n_slots : store->n_experts, store->n_experts));
    d->policy = policy;
    d->layers = sl_calloc((size_t)d->n_layers, sizeof(sl_dev_layer), err);
    if (!d->layers) return SL_ERR_NOMEM;
    /* One slot layout for all layers: gate, up and down with their scales/biases, each part as
     * large as any layer's (a GGUF's layers may mix types: Q4_K_M's down is Q6_K in some). */
    size_t part[SL_EX_PARTS] = {0};
    for (int32_t l = 0; l < d->n_layers; l++) {
        const sl_expert_layer *HL = &store->layers[l];
        const sl_expert *ex = HL->n_experts ? sample_view(HL) : NULL;
        if (!ex) continue;
        const sl_tensor *m[3] = {&ex->gate, &ex->up, &ex->down};
        const sl_tensor *b[3] = {&ex->gate_bias, &ex->up_bias, &ex->down_bias};
        for (int i = 0; i < 3; i++) {
            part[3 * i] = SL_MAX(part[3 * i], m[i]->nbytes);
            part[3 * i + 1] = part[3 * i + 2] = SL_MAX(part[3 * i + 1], scale_bytes(m[i]));
            if (b[i]->data) part[SL_EX_GATE_LB + i] = SL_MAX(part[SL_EX_GATE_LB + i], b[i]->nbytes);
        }
    }
    size_t off = 0;
    for (int i = 0; i < SL_EX_PARTS; i++) {
        d->off[i] = off;
        off = align64(off + part[i]);
    }
    d->slot_bytes = off;
    for (int32_t l = SL_MAX(layer0, 0); l < SL_MIN(layer1, d->n_layers); l++) {
        const sl_expert_layer *HL = &store->layers[l];
        const sl_expert *ex = HL->n_experts ? sample_view(HL) : NULL;
        if (!ex) continue;
        sl_dev_layer *L = &d->layers[l];
        const size_t n = (size_t)d->n_slots;
        L->mem = be->ops->alloc(be, n * d->slot_bytes);
        if (!L->mem)
            return sl_fail(err, SL_ERR_NOMEM,
                           "out of GPU memory for %d expert slots per layer (%.1f MB each); "
                           "use fewer (--gpu-experts)",
                           d->n_slots, (double)d->slot_bytes / 1e6);
        L->views = sl_calloc(n, sizeof(sl_expert), err);
        L->table = be->ops->alloc(be, (size_t)d->n_experts * sizeof(sl_expert_ptrs));
        if (sl_slot_cache_init(&L->slots, d->n_slots, d->n_experts, policy, err) || !L->views ||
            !L->table)
            return sl_fail(err, SL_ERR_NOMEM, "out of memory for the GPU expert cache");
        for (size_t i = 0; i < n; i++) {
            uint8_t *base = L->mem + i * d->slot_bytes;
            sl_expert *v = &L->views[i];
            *v = *ex;
            sl_tensor *m[3] = {&v->gate, &v->up, &v->down};
            sl_tensor *b[3] = {&v->gate_bias, &v->up_bias, &v->down_bias};
            for (int j = 0; j < 3; j++) {
                m[j]->data = base + d->off[3 * j];
                m[j]->scales = m[j]->scales ? base + d->off[3 * j + 1] : NULL;
                m[j]->biases = m[j]->biases ? base + d->off[3 * j + 2] : NULL;
                b[j]->data = b[j]->data ? base + d->off[SL_EX_GATE_LB + j] : NULL;
            }
        }
    }
    return SL_OK;
}

void sl_dev_cache_free(sl_dev_cache *d, const sl_backend *be) {
    for (int32_t l = 0; d->layers && l < d->n_layers; l++) {
        sl_dev_layer *L = &d->layers[l];
        if (L->mem) be->ops->release(be, L->mem);
        if (L->table) be->ops->release(be, L->table);
        free(L->views);
        sl_slot_cache_free(&L->slots);
    }
    free(d->layers);
    memset(d, 0, sizeof *d);
}

int32_t sl_dev_cache_lookup(sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n,
                            const sl_expert **views) {
    sl_dev_layer *L = &d->layers[layer];
    sl_slot_cache *C = &L->slots;
    int32_t missing = 0;
    sl_slot_begin(C);
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = sl_slot_lookup(C, ids[i]);
        d->requests++;
        if (s >= 0) {
            d->hits++;
            sl_slot_use(C, s);
            views[i] = &L->views[s];
        } else {
            missing++;
        }
    }
    return missing;
}

const sl_expert *sl_dev_cache_put(sl_dev_cache *d, const sl_backend *be, int32_t layer, int32_t e,
                                  const sl_expert *view) {
    sl_dev_layer *L = &d->layers[layer];
    sl_slot_cache *C = &L->slots;
    const double t0 = sl_now();
    const int32_t s = sl_slot_victim(C);
    SL_ASSERT(s >= 0);
    const int32_t old = sl_slot_insert(C, s, e);
    if (old >= 0) { /* the evicted expert's row: zero, so no longer used */
        static const sl_expert_ptrs none;
        be->ops->to_dev(be, &L->table[old], &none, sizeof none);
    }
    const sl_tensor *src[3] = {&view->gate, &view->up, &view->down};
    const sl_tensor *bsrc[3] = {&view->gate_bias, &view->up_bias, &view->down_bias};
    uint8_t *base = L->mem + (size_t)s * d->slot_bytes;
    const sl_expert *v = &L->views[s];
    const sl_expert_ptrs row = {{v->gate.data, v->gate.scales, v->gate.biases, v->up.data,
                                 v->up.scales, v->up.biases, v->down.data, v->down.scales,
                                 v->down.biases}};
    be->ops->to_dev(be, &L->table[e], &row, sizeof row);
    /* The store's host copy stays put until its next fetch of this layer, and the MoE block
     * syncs before that (the contract in dev_cache.h): no wait here. */
    for (int j = 0; j < 3; j++) {
        be->ops->to_dev_async(be, base + d->off[3 * j], src[j]->data, src[j]->nbytes);
        if (src[j]->scales) {
            be->ops->to_dev_async(be, base + d->off[3 * j + 1], src[j]->scales,
                                  scale_bytes(src[j]));
            if (src[j]->biases)
                be->ops->to_dev_async(be, base + d->off[3 * j + 2], src[j]->biases,
                                      scale_bytes(src[j]));
        }
        d->bytes += (int64_t)(src[j]->nbytes + (src[j]->biases ? 2 : 1) * scale_bytes(src[j]));
        if (bsrc[j]->data) {
            be->ops->to_dev_async(be, base + d->off[SL_EX_GATE_LB + j], bsrc[j]->data,
                                  bsrc[j]->nbytes);
            d->bytes += (int64_t)bsrc[j]->nbytes;
        }
    }
    d->time += sl_now() - t0;
    return v;
}

void sl_dev_cache_map(sl_dev_cache *d, const sl_backend *be, int32_t layer, const int32_t *ids,
                      int32_t n, const sl_expert **views) {
    const sl_slot_cache *C = &d->layers[layer].slots;
    if (!sl_dev_cache_lookup(d, layer, ids, n, views)) return;
    for (int32_t i = 0; i < n; i++) /* ids are distinct: a put evicts none of the others */
        if (sl_slot_lookup(C, ids[i]) < 0)
            views[i] = sl_dev_cache_put(d, be, layer, ids[i], views[i]);
}

sl_status sl_dev_cache_fill(sl_dev_cache *d, const sl_backend *be, sl_expert_store *store,
                            sl_error *err) {
    if (d->n_slots < d->n_experts) return SL_OK;
    int32_t *ids = sl_calloc((size_t)d->n_experts, sizeof(int32_t), err);
    const sl_expert **views = sl_calloc((size_t)d->n_experts, sizeof(sl_expert *), err);
    sl_status st = ids && views ? SL_OK : SL_ERR_NOMEM;
    for (int32_t l = 0; !st && l < d->n_layers; l++) {
        if (!d->layers[l].mem) continue;
        /* in groups the store can hold at once, waiting for each group's copies before
         * the next fetch may reuse the store's host slots */
        const int32_t cap = sl_experts_capacity(store, l);
        for (int32_t e0 = 0; !st && e0 < d->n_experts; e0 += cap) {
            const int32_t n = SL_MIN(cap, d->n_experts - e0);
            for (int32_t i = 0; i < n; i++)
                ids[i] = e0 + i;
            st = sl_experts_fetch(store, l, ids, n, views, err);
            if (!st) sl_dev_cache_map(d, be, l, ids, n, views);
            be->ops->sync(be);
        }
    }
    free(ids), free(views);
    d->all = !st;
    return st;
}

int sl_dev_cache_has(const sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (sl_slot_lookup(&d->layers[layer].slots, ids[i]) < 0) return 0;
    return 1;
}

void sl_dev_cache_count(sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n) {
    sl_slot_cache *C = &d->layers[layer].slots;
    sl_slot_begin(C);
    d->requests += n, d->hits += n;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = sl_slot_lookup(C, ids[i]);
        SL_ASSERT(s >= 0);
        sl_slot_use(C, s);
    }
}
