/* Slot bookkeeping of the expert caches (contracts in slot_cache.h). */
#include <math.h>

#include "moe/slot_cache.h"

sl_status sl_slot_cache_init(sl_slot_cache *c, int32_t n_slots, int32_t n_keys,
                             sl_cache_policy policy, sl_error *err) {
    memset(c, 0, sizeof *c);
    SL_ASSERT(n_slots >= 1 && n_keys >= 1);
    c->n_slots = n_slots;
    c->n_keys = n_keys;
    c->policy = policy;
    const size_t n = (size_t)n_slots;
    c->slot_key = sl_calloc(n, sizeof(int32_t), err);
    c->uses = sl_calloc(n, sizeof(int64_t), err);
    c->last = sl_calloc(n, sizeof(int64_t), err);
    c->pin = sl_calloc(n, sizeof(int64_t), err);
    c->key_slot = sl_calloc((size_t)n_keys, sizeof(int32_t), err);
    if (policy == SL_CACHE_DECAY) c->score = sl_calloc((size_t)n_keys, sizeof(double), err);
    if (!c->slot_key || !c->uses || !c->last || !c->pin || !c->key_slot ||
        (policy == SL_CACHE_DECAY && !c->score)) {
        sl_slot_cache_free(c);
        return SL_ERR_NOMEM;
    }
    c->halflife = SL_SLOT_HALFLIFE;
    for (int32_t e = 0; c->score && e < n_keys; e++)
        c->score[e] = -INFINITY;
    for (int32_t i = 0; i < n_slots; i++)
        c->slot_key[i] = -1, c->pin[i] = -1;
    for (int32_t e = 0; e < n_keys; e++)
        c->key_slot[e] = -1;
    return SL_OK;
}

void sl_slot_cache_free(sl_slot_cache *c) {
    free(c->slot_key), free(c->uses), free(c->last), free(c->pin), free(c->key_slot);
    free(c->score);
    memset(c, 0, sizeof *c);
}

int32_t sl_slot_victim(const sl_slot_cache *c) {
    int32_t best = -1;
    for (int32_t i = 0; i < c->n_slots; i++) {
        if (c->pin[i] == c->tick) continue;
        if (c->slot_key[i] < 0) return i;
        if (best < 0) {
            best = i;
            continue;
        }
        const int older = c->last[i] < c->last[best];
        int better;
        if (c->policy == SL_CACHE_LRU) {
            better = older;
        } else if (c->policy == SL_CACHE_DECAY) {
            const double si = c->score[c->slot_key[i]], sb = c->score[c->slot_key[best]];
            better = si < sb || (si == sb && older);
        } else {
            better = c->uses[i] < c->uses[best] || (c->uses[i] == c->uses[best] && older);
        }
        if (better) best = i;
    }
    return best;
}

void sl_slot_count(sl_slot_cache *c, int32_t key) {
    const double now = (double)c->tick / c->halflife;
    c->score[key] = log2(exp2(c->score[key] - now) + 1.0) + now;
}

int32_t sl_slot_insert(sl_slot_cache *c, int32_t slot, int32_t key) {
    if (c->score) sl_slot_count(c, key);
    const int32_t old = c->slot_key[slot];
    if (old >= 0) c->key_slot[old] = -1;
    c->slot_key[slot] = key;
    c->key_slot[key] = slot;
    c->uses[slot] = 1;
    c->last[slot] = c->pin[slot] = c->tick;
    return old;
}

void sl_slot_drop(sl_slot_cache *c, int32_t slot) {
    const int32_t key = c->slot_key[slot];
    if (key >= 0) c->key_slot[key] = -1;
    c->slot_key[slot] = -1;
}
