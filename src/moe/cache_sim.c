/* Expert-cache simulation and the Belady optimum (contracts in cache_sim.h). */
#include "moe/cache_sim.h"

#include "moe/slot_cache.h"

/* ------------------------------------------------------------- requests */

static int cmp_u16(const void *a, const void *b) {
    return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b;
}

sl_status sl_requests_build(sl_requests *r, const sl_trace *t, sl_error *err) {
    memset(r, 0, sizeof *r);
    r->n_layers = t->n_layers, r->n_experts = t->n_experts, r->k = t->k;
    const size_t nl = (size_t)t->n_layers;
    r->layers = sl_calloc(nl, sizeof *r->layers, err);
    int64_t *n_ids = sl_calloc(nl, sizeof(int64_t), err),
            *n_pids = sl_calloc(nl, sizeof(int64_t), err);
    int64_t *seen = sl_calloc((size_t)t->n_experts, sizeof(int64_t), err);
    int64_t *pseen = sl_calloc((size_t)t->n_experts, sizeof(int64_t), err);
    sl_status st = SL_OK;
    if (!r->layers || !n_ids || !n_pids || !seen || !pseen) {
        st = SL_ERR_NOMEM;
        goto done;
    }
    /* Sizes first (ids counted with repeats: a bound), then the arrays. */
    for (int64_t i = 0; i < t->n_records; i++) {
        const int32_t l = t->layer[i];
        if (i == 0 || t->step[i] != t->step[i - 1] || t->layer[i] != t->layer[i - 1])
            r->layers[l].n_req++;
        (t->kind[i] == SL_TRACE_PICKS ? n_ids : n_pids)[l] += t->off[i + 1] - t->off[i];
    }
    for (size_t l = 0; l < nl; l++) {
        sl_req_layer *L = &r->layers[l];
        L->off = sl_calloc((size_t)L->n_req + 1, sizeof(int64_t), err);
        L->poff = sl_calloc((size_t)L->n_req + 1, sizeof(int64_t), err);
        L->ids = sl_calloc((size_t)n_ids[l] + 1, sizeof(uint16_t), err);
        L->pids = sl_calloc((size_t)n_pids[l] + 1, sizeof(uint16_t), err);
        if (!L->off || !L->poff || !L->ids || !L->pids) {
            st = SL_ERR_NOMEM;
            goto done;
        }
        L->n_req = 0;
        r->n_used += n_ids[l] + n_pids[l] > 0;
    }
    /* Each run of records of one (step, layer) is a request: the union of its picks (ascending)
     * and of its predictions (in the order first predicted). stamp marks what the run has. */
    for (int64_t i = 0, g = 0; i < t->n_records; g++) {
        const int32_t l = t->layer[i];
        sl_req_layer *L = &r->layers[l];
        const int64_t stamp = g + 1, start = L->off[L->n_req];
        int64_t n = start, pn = L->poff[L->n_req];
        int64_t j = i;
        for (; j < t->n_records && t->step[j] == t->step[i] && t->layer[j] == l; j++) {
            const int pick = t->kind[j] == SL_TRACE_PICKS;
            L->tokens += pick;
            for (int64_t q = t->off[j]; q < t->off[j + 1]; q++) {
                const uint16_t e = t->ids[q];
                if (pick && seen[e] != stamp) seen[e] = stamp, L->ids[n++] = e;
                if (!pick && pseen[e] != stamp) pseen[e] = stamp, L->pids[pn++] = e;
            }
        }
        qsort(L->ids + start, (size_t)(n - start), sizeof(uint16_t), cmp_u16);
        L->max_size = SL_MAX(L->max_size, n - start);
        L->n_req++;
        L->off[L->n_req] = n;
        L->poff[L->n_req] = pn;
        i = j;
    }
    for (size_t l = 0; l < nl; l++)
        r->tokens = SL_MAX(r->tokens, r->layers[l].tokens);
done:
    free(n_ids), free(n_pids), free(seen), free(pseen);
    if (st) sl_requests_free(r);
    return st;
}

void sl_requests_free(sl_requests *r) {
    for (int32_t l = 0; r->layers && l < r->n_layers; l++) {
        sl_req_layer *L = &r->layers[l];
        free(L->off), free(L->poff), free(L->ids), free(L->pids);
    }
    free(r->layers);
    memset(r, 0, sizeof *r);
}

/* Per-layer hit rates folded into out's min and max. */
static void fold_layer(sl_sim_result *out, int64_t req, int64_t hits) {
    if (!req) return;
    const double h = (double)hits / (double)req;
    if (out->layer_min > out->layer_max) /* the first layer */
        out->layer_min = out->layer_max = h;
    out->layer_min = SL_MIN(out->layer_min, h);
    out->layer_max = SL_MAX(out->layer_max, h);
}

/* ------------------------------------------------------------- policies */

/* One group of at most n_slots experts, the store's way (sl_experts_fetch): every hit pinned,
 * then the hits used and the misses placed. A slot a prefetch filled (pf[slot]) and not used
 * since is no hit: the store counts it as the prefetch's read used (*used), inserted anew by
 * this request. Returns the hits. */
static int64_t store_group(sl_slot_cache *c, uint8_t *pf, const int32_t *ids, int32_t n,
                           int64_t *used) {
    int64_t hits = 0;
    sl_slot_begin(c);
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = sl_slot_lookup(c, ids[i]);
        if (s >= 0) sl_slot_pin(c, s);
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = sl_slot_lookup(c, ids[i]);
        if (s >= 0 && pf[s]) {
            pf[s] = 0;
            (*used)++;
            sl_slot_insert(c, s, ids[i]);
        } else if (s >= 0) {
            hits++;
            sl_slot_use(c, s);
        } else {
            const int32_t v = sl_slot_victim(c);
            SL_ASSERT(v >= 0);
            sl_slot_insert(c, v, ids[i]);
            pf[v] = 0;
        }
    }
    return hits;
}

sl_status sl_cache_sim(const sl_requests *r, int32_t n_slots, sl_cache_policy policy,
                       double halflife, int prefetch, sl_sim_result *out, sl_error *err) {
    memset(out, 0, sizeof *out);
    out->layer_min = 1, out->layer_max = 0;
    if (n_slots < 1) return sl_fail(err, SL_ERR_ARG, "a cache of %d slots", n_slots);
    const int32_t S = SL_MIN(n_slots, r->n_experts);
    int32_t *list = sl_calloc((size_t)r->n_experts, sizeof(int32_t), err);
    uint8_t *want = sl_calloc((size_t)r->n_experts, 1, err);
    uint8_t *pf = sl_calloc((size_t)S, 1, err);
    if (!list || !want || !pf) {
        free(list), free(want), free(pf);
        return SL_ERR_NOMEM;
    }
    sl_status st = SL_OK;
    for (int32_t l = 0; l < r->n_layers && !st; l++) {
        const sl_req_layer *L = &r->layers[l];
        if (!L->n_req) continue;
        sl_slot_cache c;
        if ((st = sl_slot_cache_init(&c, S, r->n_experts, policy, err))) break;
        if (halflife > 0) c.halflife = halflife;
        memset(pf, 0, (size_t)S);
        int64_t req = 0, hits = 0;
        for (int64_t i = 0; i < L->n_req; i++) {
            const uint16_t *ids = L->ids + L->off[i];
            const int32_t n = (int32_t)(L->off[i + 1] - L->off[i]);
            if (prefetch && L->poff[i + 1] > L->poff[i]) {
                for (int32_t j = 0; j < n; j++)
                    want[ids[j]] = 1;
                /* as sl_experts_prefetch places them: within the time of the layer's last
                 * request (no sl_slot_begin), so what that request used stays pinned */
                for (int64_t q = L->poff[i]; q < L->poff[i + 1]; q++) {
                    const int32_t e = L->pids[q];
                    out->predicted++;
                    out->predicted_right += want[e];
                    if (sl_slot_lookup(&c, e) >= 0) continue;
                    const int32_t v = sl_slot_victim(&c);
                    if (v < 0) continue; /* every slot holds a prediction already */
                    sl_slot_insert(&c, v, e);
                    pf[v] = 1;
                    out->inserts++;
                    out->wasted += !want[e];
                }
                out->requested += n;
                for (int32_t j = 0; j < n; j++)
                    want[ids[j]] = 0;
            }
            /* those cached first, then groups the cache holds at once (the store's order) */
            int32_t nc = 0, nm = 0;
            for (int32_t j = 0; j < n; j++)
                if (sl_slot_lookup(&c, ids[j]) >= 0) list[nc++] = ids[j];
            for (int32_t j = 0; j < n; j++)
                if (sl_slot_lookup(&c, ids[j]) < 0) list[nc + nm++] = ids[j];
            for (int32_t j0 = 0; j0 < n; j0 += S)
                hits += store_group(&c, pf, list + j0, SL_MIN(S, n - j0), &out->prefetch_used);
            req += n;
        }
        sl_slot_cache_free(&c);
        out->requests += req, out->hits += hits;
        fold_layer(out, req, hits);
    }
    free(list), free(want), free(pf);
    return st;
}

/* ------------------------------------------------------------- Belady */

/* A max-heap of the cached keys by the index of their next request (pri), with each key's
 * place (pos, -1: not cached) so that a key's priority can change in place. */
typedef struct heap {
    int32_t n;
    int32_t *key; /* [n_slots] */
    int64_t *pri; /* [n_slots] */
    int32_t *pos; /* [n_keys] */
} heap;

static void heap_swap(heap *h, int32_t a, int32_t b) {
    const int32_t ka = h->key[a];
    const int64_t pa = h->pri[a];
    h->key[a] = h->key[b], h->pri[a] = h->pri[b];
    h->key[b] = ka, h->pri[b] = pa;
    h->pos[h->key[a]] = a, h->pos[h->key[b]] = b;
}

static void heap_fix(heap *h, int32_t i) {
    while (i > 0 && h->pri[(i - 1) / 2] < h->pri[i]) {
        heap_swap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        int32_t m = i;
        const int32_t a = 2 * i + 1, b = 2 * i + 2;
        if (a < h->n && h->pri[a] > h->pri[m]) m = a;
        if (b < h->n && h->pri[b] > h->pri[m]) m = b;
        if (m == i) return;
        heap_swap(h, i, m);
        i = m;
    }
}

static void heap_set(heap *h, int32_t key, int64_t pri) {
    int32_t i = h->pos[key];
    if (i < 0) {
        i = h->n++;
        h->key[i] = key;
        h->pos[key] = i;
    }
    h->pri[i] = pri;
    heap_fix(h, i);
}

/* Removes the key of the largest priority. */
static void heap_pop(heap *h) {
    h->pos[h->key[0]] = -1;
    if (--h->n == 0) return;
    h->key[0] = h->key[h->n], h->pri[0] = h->pri[h->n];
    h->pos[h->key[0]] = 0;
    heap_fix(h, 0);
}

#define NEVER INT64_MAX

sl_status sl_cache_belady(const sl_requests *r, int32_t n_slots, sl_sim_result *out,
                          sl_error *err) {
    memset(out, 0, sizeof *out);
    out->layer_min = 1, out->layer_max = 0;
    if (n_slots < 1) return sl_fail(err, SL_ERR_ARG, "a cache of %d slots", n_slots);
    const int32_t S = SL_MIN(n_slots, r->n_experts);
    int64_t max_ids = 0;
    for (int32_t l = 0; l < r->n_layers; l++)
        max_ids = SL_MAX(max_ids, r->layers[l].off ? r->layers[l].off[r->layers[l].n_req] : 0);
    heap h = {0};
    h.key = sl_calloc((size_t)S, sizeof(int32_t), err);
    h.pri = sl_calloc((size_t)S, sizeof(int64_t), err);
    h.pos = sl_calloc((size_t)r->n_experts, sizeof(int32_t), err);
    int64_t *last = sl_calloc((size_t)r->n_experts, sizeof(int64_t), err);
    int64_t *next = sl_calloc((size_t)max_ids + 1, sizeof(int64_t), err); /* per requested id */
    sl_status st = SL_OK;
    if (!h.key || !h.pri || !h.pos || !last || !next) {
        st = SL_ERR_NOMEM;
        goto done;
    }
    /* Pinned keys (the request in flight) sit at priority -1, below every other. */
    for (int32_t l = 0; l < r->n_layers; l++) {
        const sl_req_layer *L = &r->layers[l];
        if (!L->n_req) continue;
        for (int32_t e = 0; e < r->n_experts; e++)
            last[e] = NEVER, h.pos[e] = -1;
        h.n = 0;
        for (int64_t i = L->n_req - 1; i >= 0; i--)
            for (int64_t q = L->off[i]; q < L->off[i + 1]; q++) {
                next[q] = last[L->ids[q]];
                last[L->ids[q]] = i;
            }
        int64_t req = 0, hits = 0;
        for (int64_t i = 0; i < L->n_req; i++) {
            const int64_t a = L->off[i], b = L->off[i + 1];
            req += b - a;
            if (b - a <= S) {
                for (int64_t q = a; q < b; q++)
                    if (h.pos[L->ids[q]] >= 0) hits++, heap_set(&h, L->ids[q], -1);
                for (int64_t q = a; q < b; q++) {
                    const int32_t e = L->ids[q];
                    if (h.pos[e] >= 0) continue;
                    if (h.n == S) {
                        SL_ASSERT(h.pri[0] >= 0);
                        heap_pop(&h);
                    }
                    heap_set(&h, e, -1);
                }
                for (int64_t q = a; q < b; q++)
                    heap_set(&h, L->ids[q], next[q]);
            } else { /* more than the cache: keep the S that come back soonest */
                for (int64_t q = a; q < b; q++)
                    if (h.pos[L->ids[q]] >= 0) hits++, heap_set(&h, L->ids[q], next[q]);
                for (int64_t q = a; q < b; q++) {
                    const int32_t e = L->ids[q];
                    if (h.pos[e] >= 0) continue;
                    if (h.n == S) {
                        if (h.pri[0] <= next[q]) continue;
                        heap_pop(&h);
                    }
                    heap_set(&h, e, next[q]);
                }
            }
        }
        out->requests += req, out->hits += hits;
        fold_layer(out, req, hits);
    }
done:
    free(h.key), free(h.pri), free(h.pos), free(last), free(next);
    return st;
}
