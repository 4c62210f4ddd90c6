/*
 * The expert cache in backend memory (the CUDA backend's GPU tier). The
 * expert store decides where an expert's bytes come from on the host (the
 * checkpoint mapping, resident memory, or a slot filled from disk); when the
 * backend computes in memory of its own, this cache keeps a number of expert
 * slots there per MoE layer and copies an expert in on a miss. The slots are
 * decided as the store's are (moe/slot_cache.h, same policy); a request's slots
 * are pinned as it goes, so a miss never evicts an expert it already placed.
 */
#ifndef SL_DEV_CACHE_H
#define SL_DEV_CACHE_H

#include "kernels/ops.h"
#include "moe/experts.h"

typedef struct sl_dev_layer {
    uint8_t *mem;        /* backend memory: n_slots x slot_bytes */
    sl_expert *views;    /* [n_slots] views into mem */
    sl_slot_cache slots; /* which expert is in which slot */
    /* backend memory [n_experts]: where each cached expert's weights are (moe_experts'
     * table); rows of experts not cached are zero */
    sl_expert_ptrs *table;
} sl_dev_layer;

typedef struct sl_dev_cache {
    int32_t n_layers, n_experts, n_slots;
    sl_cache_policy policy;
    size_t slot_bytes;
    size_t off[SL_EX_PARTS]; /* gate, gate scales, gate biases, up ..., down ..., then the
                              * linear biases of the three, inside a slot (sl_expert_part) */
    sl_dev_layer *layers;    /* [n_layers]; mem NULL for dense layers */
    int32_t all;             /* every expert of every MoE layer has a slot (sl_dev_cache_fill) */
    int64_t requests, hits, bytes;
    double time;
} sl_dev_cache;

/* Slots for every MoE layer of the store, n_slots each (clamped to [1, n_experts]). */
sl_status sl_dev_cache_init(sl_dev_cache *d, const sl_backend *be, const sl_expert_store *store,
                            int32_t n_slots, sl_cache_policy policy, sl_error *err);
/* ... for the MoE layers in [layer0, layer1) alone (a partition of a split model, whose backend
 * runs those): the others have none, as dense layers. */
sl_status sl_dev_cache_init_range(sl_dev_cache *d, const sl_backend *be,
                                  const sl_expert_store *store, int32_t layer0, int32_t layer1,
                                  int32_t n_slots, sl_cache_policy policy, sl_error *err);
void sl_dev_cache_free(sl_dev_cache *d, const sl_backend *be);
/* Replaces the host views in[0..n) of experts ids[] (as the store's fetch gave them) by views
 * into backend memory, copying the misses in; n <= n_slots. The copies are queued: the
 * caller syncs the backend before the store's next fetch of this layer may overwrite them.
 * The same as sl_dev_cache_lookup, then sl_dev_cache_put for each expert it lacks. */
void sl_dev_cache_map(sl_dev_cache *d, const sl_backend *be, int32_t layer, const int32_t *ids,
                      int32_t n, const sl_expert **views);

/* A request of the layer for experts ids[0..n) (distinct, n <= n_slots) in two halves, so that
 * each miss copies in as soon as its host bytes are there. Lookup starts the request: each
 * expert the cache holds is pinned and views[i] set to its backend view; the others' views are
 * left as they were. Returns how many it lacks. */
int32_t sl_dev_cache_lookup(sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n,
                            const sl_expert **views);
/* Copies expert e of the request (host view `view`, as the store's fetch gave it) into a slot
 * the policy gives up, never one the request pinned, and returns its backend view. The copies
 * are queued, as sl_dev_cache_map's. */
const sl_expert *sl_dev_cache_put(sl_dev_cache *d, const sl_backend *be, int32_t layer, int32_t e,
                                  const sl_expert *view);

/* Whether experts ids[0..n) of the layer all have slots now. */
int sl_dev_cache_has(const sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n);

/* With a slot per expert: copies every expert in through the store (at load, so decode never
 * waits for a first use) and sets d->all; else does nothing. Resets no statistics. */
sl_status sl_dev_cache_fill(sl_dev_cache *d, const sl_backend *be, sl_expert_store *store,
                            sl_error *err);
/* The bookkeeping of a request of n cached experts that ran without sl_dev_cache_map (the
 * MoE block's no-sync path when d->all): counts, uses and recency. */
void sl_dev_cache_count(sl_dev_cache *d, int32_t layer, const int32_t *ids, int32_t n);

#endif /* SL_DEV_CACHE_H */
