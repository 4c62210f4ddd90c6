/*
 * A cache of n_slots slots holding keys 0 .. n_keys-1 (a layer's experts), the
 * bookkeeping only: which key is in which slot, and which slot a miss refills.
 * Plain arrays, no I/O and no device: the host store's stream slots and the
 * GPU expert cache both decide with it, and move the bytes themselves.
 *
 * Time counts in requests (sl_slot_begin): a request pins the slots it uses
 * (sl_slot_pin, sl_slot_use, sl_slot_insert) and a miss never evicts a pinned
 * slot. The victim is an empty slot (the lowest), else by policy among the
 * unpinned ones:
 *   LFU  fewest uses since the key came in; ties to the oldest last use
 *   LRU  the oldest last use
 *   DECAY  the smallest decayed use count of the key: every request that used the key (while
 *        cached or before, since it was last evicted too) counts 2^(-age / halflife), age in
 *        requests; ties to the oldest last use. Plain LFU forgets a key's past at eviction and
 *        never ages what stays, so a once-popular expert squats its slot after routing drifts.
 * and among equals the lowest slot.
 */
#ifndef SL_SLOT_CACHE_H
#define SL_SLOT_CACHE_H

#include "core/common.h"

typedef struct sl_slot_cache {
    int32_t n_slots, n_keys;
    sl_cache_policy policy;
    int64_t tick;      /* the request in flight */
    int32_t *slot_key; /* [n_slots] key in the slot, -1 when empty */
    int64_t *uses;     /* [n_slots] requests since the key came in */
    int64_t *last;     /* [n_slots] tick of the last request that used it */
    int64_t *pin;      /* [n_slots] tick of the last request that pinned it */
    int32_t *key_slot; /* [n_keys] slot holding the key, -1 when none */
    /* DECAY: per key log2(decayed uses) + tick / halflife at its last use (-inf: never used);
     * the decayed count now is 2^(score - tick / halflife), so comparing scores compares
     * counts without touching every key each request */
    double *score;   /* [n_keys] */
    double halflife; /* in requests (sl_slot_begin), SL_SLOT_HALFLIFE unless set after init */
} sl_slot_cache;

/* The halflife that did best on a trained model's routing (tests/fixtures/trace, 128 and 512
 * experts: 16-64 within a point or two, 32 best; tools/lab/README.md) */
#define SL_SLOT_HALFLIFE 32.0

/* Every slot empty. n_slots >= 1. */
sl_status sl_slot_cache_init(sl_slot_cache *c, int32_t n_slots, int32_t n_keys,
                             sl_cache_policy policy, sl_error *err);
void sl_slot_cache_free(sl_slot_cache *c);

/* The slot holding key, or -1. */
static inline int32_t sl_slot_lookup(const sl_slot_cache *c, int32_t key) {
    return c->key_slot[key];
}
/* Starts a request: what it pins from here on is pinned until the next one. */
static inline void sl_slot_begin(sl_slot_cache *c) {
    c->tick++;
}
/* Keeps slot from being evicted during this request (the hits of a request, before its
 * misses are placed). */
static inline void sl_slot_pin(sl_slot_cache *c, int32_t slot) {
    c->pin[slot] = c->tick;
}
/* DECAY: one more use of key now. */
void sl_slot_count(sl_slot_cache *c, int32_t key);
/* A hit on slot by this request: one more use, used now, pinned. */
static inline void sl_slot_use(sl_slot_cache *c, int32_t slot) {
    if (c->score) sl_slot_count(c, c->slot_key[slot]);
    c->uses[slot]++;
    c->last[slot] = c->pin[slot] = c->tick;
}
/* The slot a miss refills (see above); -1 when every slot is pinned. */
int32_t sl_slot_victim(const sl_slot_cache *c);
/* key into slot (a victim) by this request: used once, now, pinned. Returns the key it held
 * (evicted), or -1. */
int32_t sl_slot_insert(sl_slot_cache *c, int32_t slot, int32_t key);
/* Empties slot (its fill failed): its key is no longer cached. */
void sl_slot_drop(sl_slot_cache *c, int32_t slot);

#endif /* SL_SLOT_CACHE_H */
