/*
 * Offline expert-cache simulation over a routing trace (trace.h): each layer's requests replayed
 * through the slot cache the engine decides with (slot_cache.h, the same code and the same
 * request protocol as the host store's sl_experts_fetch), and through the clairvoyant optimum
 * (Belady's MIN: on a miss, evict the cached key whose next request is furthest away, never one
 * of the request in flight) as the yardstick. sluice trace-replay and --stats use it.
 *
 * A request is the distinct experts of one (step, layer); its hits and misses count per expert,
 * as the store counts them (sl_stats.expert_requests). A request with more experts than slots
 * runs as the store runs it: those cached first, then groups of n_slots, each group a request
 * of the cache of its own. The optimum reads every miss too, but keeps afterwards whichever
 * n_slots of the cached and requested keys come back soonest.
 */
#ifndef SL_CACHE_SIM_H
#define SL_CACHE_SIM_H

#include "moe/trace.h"

/* One layer's requests: request i's experts are ids[off[i] .. off[i+1]), distinct and
 * ascending; the experts predicted for it (kind-1 records of its (step, layer): a prefetch made
 * before it), pids[poff[i] .. poff[i+1]), distinct, in the order first predicted. A (step,
 * layer) with predictions only is a request of no experts. */
typedef struct sl_req_layer {
    int64_t n_req;
    int64_t *off;     /* [n_req + 1] */
    uint16_t *ids;    /* [off[n_req]] */
    int64_t *poff;    /* [n_req + 1] */
    uint16_t *pids;   /* [poff[n_req]] */
    int64_t tokens;   /* kind-0 records of the layer */
    int64_t max_size; /* experts in its largest request */
} sl_req_layer;

typedef struct sl_requests {
    int32_t n_layers, n_experts, k;
    sl_req_layer *layers; /* [n_layers]; a layer no record names has no requests */
    int64_t tokens;       /* kind-0 records of the layer with the most */
    int32_t n_used;       /* layers with requests */
} sl_requests;

/* Groups a trace's records into each layer's requests. */
sl_status sl_requests_build(sl_requests *r, const sl_trace *t, sl_error *err);
void sl_requests_free(sl_requests *r);

/* What a replay counted, over all layers. */
typedef struct sl_sim_result {
    int64_t requests, hits;      /* (request, expert) pairs, and those found cached */
    double layer_min, layer_max; /* the lowest and highest hit rate of a layer with requests */
    /* prefetch: experts predicted, and of those requested by the request they were made for;
     * experts requested (of requests with a prediction); predicted experts read in (they were
     * not cached), and of those the ones their request did not ask for */
    int64_t predicted, predicted_right, requested, inserts, wasted;
    /* requested experts found where a prefetch had read them: neither hits nor misses (the
     * store's prefetch_used); the misses are requests - hits - prefetch_used */
    int64_t prefetch_used;
} sl_sim_result;

/* Replays every layer through a cache of n_slots slots (1 <= n_slots, at most n_experts are
 * used) under policy (halflife: SL_CACHE_DECAY's, in requests; <= 0: the default). prefetch:
 * before each request, its predicted experts not cached are read into the cache as the store's
 * sl_experts_prefetch places them: victims by policy among the slots the layer's last request
 * did not use; a request that finds one counts it as the store does, a prefetch used, neither
 * hit nor miss, and inserts it anew. */
sl_status sl_cache_sim(const sl_requests *r, int32_t n_slots, sl_cache_policy policy,
                       double halflife, int prefetch, sl_sim_result *out, sl_error *err);

/* The optimum's hits for the same requests and n_slots (no prefetch). O(log n_slots) a
 * requested expert. */
sl_status sl_cache_belady(const sl_requests *r, int32_t n_slots, sl_sim_result *out, sl_error *err);

#endif /* SL_CACHE_SIM_H */
