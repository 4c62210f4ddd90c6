/*
 * The slot cache both expert caches decide with (moe/slot_cache.h): eviction
 * order under LFU and LRU, pinning, emptied slots; and the GPU expert cache
 * (moe/dev_cache.c) driven on the CPU backend, whose bookkeeping it is: which
 * expert each request evicts, its counters, and that a slot holds the bytes of
 * the expert it says.
 */
#include "moe/dev_cache.h"
#include "moe/slot_cache.h"
#include "test.h"

/* One request the way the host store makes it (sl_experts_fetch): every hit pinned first, then
 * the misses placed. evicted[i] is the key key[i] displaced (-1: a hit, or an empty slot). */
static void store_request(sl_slot_cache *c, const int32_t *keys, int32_t n, int32_t *evicted) {
    sl_slot_begin(c);
    for (int32_t i = 0; i < n; i++)
        if (sl_slot_lookup(c, keys[i]) >= 0) sl_slot_pin(c, sl_slot_lookup(c, keys[i]));
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = sl_slot_lookup(c, keys[i]);
        evicted[i] = -1;
        if (s >= 0) {
            sl_slot_use(c, s);
            continue;
        }
        const int32_t v = sl_slot_victim(c);
        CHECK(v >= 0);
        if (v >= 0) evicted[i] = sl_slot_insert(c, v, keys[i]);
    }
}

/* A request of n keys and, per key, the key it evicted (-1: a hit, or an empty slot). */
typedef struct request {
    int32_t n, keys[3], evicted[3];
} request;

static void run(sl_cache_policy pol, int32_t n_slots, const request *reqs, int32_t n_reqs,
                const char *what) {
    sl_slot_cache c;
    sl_error err = {0};
    CHECK(sl_slot_cache_init(&c, n_slots, 16, pol, &err) == SL_OK);
    for (int32_t r = 0; r < n_reqs; r++) {
        int32_t ev[3];
        store_request(&c, reqs[r].keys, reqs[r].n, ev);
        for (int32_t i = 0; i < reqs[r].n; i++)
            CHECKF(ev[i] == reqs[r].evicted[i], "%s: request %d, key %d evicted %d, want %d", what,
                   r, reqs[r].keys[i], ev[i], reqs[r].evicted[i]);
    }
    sl_slot_cache_free(&c);
}

TEST(test_slot_cache_lfu_order) {
    static const request reqs[] = {
        {2, {0, 1}, {-1, -1}}, /* into empty slots */
        {2, {0, 2}, {-1, -1}}, /* 0 hits; 2 takes the last empty slot */
        {2, {0, 1}, {-1, -1}}, /* uses: 0 -> 3, 1 -> 2, 2 -> 1 */
        {1, {3}, {2}},         /* the least used */
        {1, {4}, {3}},         /* 1 (2 uses) vs 3 (1 use) */
        {1, {5}, {4}},         /* 4 (1 use) */
        {2, {5, 6}, {-1, 1}},  /* 5 pinned though it has 1 use: 1 (2 uses) goes */
        {1, {7}, {6}},         /* 5 (2 uses) vs 6 (1 use) */
        {1, {8}, {7}},         /* 7 (1 use) */
        {2, {9, 5}, {8, -1}},  /* 5 pinned; it now has 3 uses */
        {2, {10, 11}, {9, 0}}, /* 9 (1 use); then 0 and 5 tie on 3 uses: 0's last use is older */
    };
    run(SL_CACHE_LFU, 3, reqs, sizeof reqs / sizeof reqs[0], "lfu");
}

TEST(test_slot_cache_lru_order) {
    static const request reqs[] = {
        {2, {0, 1}, {-1, -1}},      /* into empty slots */
        {1, {2}, {-1}},             /* the last empty slot */
        {1, {0}, {-1}},             /* recency: 1 < 2 < 0 */
        {1, {3}, {1}},              /* the oldest */
        {3, {2, 4, 5}, {-1, 0, 3}}, /* 2 pinned: 0, then 3 */
        {1, {4}, {-1}},             /* a hit */
        {1, {6}, {5}}, /* 5 and 2 tie (last used by one request): the lower slot, 5's */
    };
    run(SL_CACHE_LRU, 3, reqs, sizeof reqs / sizeof reqs[0], "lru");
}

TEST(test_slot_cache_pins_and_drops) {
    sl_slot_cache c;
    sl_error err = {0};
    CHECK(sl_slot_cache_init(&c, 2, 4, SL_CACHE_LFU, &err) == SL_OK);
    sl_slot_begin(&c);
    CHECK(sl_slot_victim(&c) == 0); /* empty slots first, the lowest */
    CHECK(sl_slot_insert(&c, 0, 3) == -1 && sl_slot_lookup(&c, 3) == 0);
    CHECK(sl_slot_victim(&c) == 1);
    CHECK(sl_slot_insert(&c, 1, 2) == -1);
    CHECK(sl_slot_victim(&c) == -1); /* both pinned by this request */
    sl_slot_begin(&c);
    sl_slot_pin(&c, 0);
    CHECK(sl_slot_victim(&c) == 1); /* the only one not pinned */
    sl_slot_use(&c, 1);             /* 2 now has more uses than 3 */
    sl_slot_begin(&c);
    CHECK(sl_slot_victim(&c) == 0);
    sl_slot_drop(&c, 1); /* a failed fill: the key is gone, the slot empty and picked first */
    CHECK(sl_slot_lookup(&c, 2) == -1 && c.slot_key[1] == -1 && sl_slot_victim(&c) == 1);
    sl_slot_cache_free(&c);
}

/* ---- the GPU expert cache on the CPU backend ---- */

#define DC_E 6
#define DC_H 4
#define DC_I 2

typedef struct dc_fixture {
    float w[DC_E][3][DC_H * DC_I]; /* each expert's gate, up, down: all its values e + 1 */
    sl_expert ex[DC_E];
    sl_expert_store store;
    sl_backend be;
    sl_dev_cache dev;
} dc_fixture;

static sl_tensor dc_tensor(const float *data, int64_t rows, int64_t cols) {
    return (sl_tensor){.dtype = SL_DTYPE_F32,
                       .ndim = 2,
                       .shape = {rows, cols},
                       .data = data,
                       .nbytes = (size_t)(rows * cols) * sizeof(float)};
}

static int dc_open(dc_fixture *f, int32_t slots, sl_cache_policy pol) {
    sl_error err = {0};
    for (int32_t e = 0; e < DC_E; e++) {
        for (int32_t m = 0; m < 3; m++)
            for (int32_t i = 0; i < DC_H * DC_I; i++)
                f->w[e][m][i] = (float)(e + 1);
        f->ex[e].gate = dc_tensor(f->w[e][0], DC_I, DC_H);
        f->ex[e].up = dc_tensor(f->w[e][1], DC_I, DC_H);
        f->ex[e].down = dc_tensor(f->w[e][2], DC_H, DC_I);
    }
    const sl_expert *views[2] = {NULL, f->ex}; /* layer 0 dense, layer 1 MoE */
    sl_backend_cpu_init(&f->be, 1, SL_ISA_SCALAR);
    f->be.device = 1;
    if (sl_experts_open_views(&f->store, 2, DC_E, views, &err) ||
        sl_dev_cache_init(&f->dev, &f->be, &f->store, slots, pol, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return 0;
    }
    return 1;
}

static void dc_close(dc_fixture *f) {
    sl_dev_cache_free(&f->dev, &f->be);
    sl_experts_free(&f->store);
}

/* Maps ids through the cache as the MoE step does (store fetch, then map) and checks every
 * returned view holds its expert's bytes. */
static void dc_map(dc_fixture *f, const int32_t *ids, int32_t n) {
    const sl_expert *v[DC_E];
    sl_error err = {0};
    CHECK(sl_experts_fetch(&f->store, 1, ids, n, v, &err) == SL_OK);
    sl_dev_cache_map(&f->dev, &f->be, 1, ids, n, v);
    for (int32_t i = 0; i < n; i++) {
        const float *g = v[i]->gate.data, *d = v[i]->down.data;
        CHECK(g[0] == (float)(ids[i] + 1) && d[DC_H * DC_I - 1] == (float)(ids[i] + 1));
    }
}

static int dc_cached(const dc_fixture *f, int32_t e) {
    return sl_dev_cache_has(&f->dev, 1, &e, 1);
}

TEST(test_dev_cache_eviction_order) {
    dc_fixture *f = calloc(1, sizeof *f);
    /* LFU, 3 slots: the order the host store gives, hits counted as the store counts them */
    if (f && dc_open(f, 3, SL_CACHE_LFU)) {
        dc_map(f, (int32_t[]){0, 1}, 2);
        dc_map(f, (int32_t[]){0, 2}, 2);
        dc_map(f, (int32_t[]){0, 1}, 2); /* uses: 0 -> 3, 1 -> 2, 2 -> 1 */
        dc_map(f, (int32_t[]){3}, 1);    /* evicts 2 */
        CHECK(!dc_cached(f, 2) && dc_cached(f, 0) && dc_cached(f, 1) && dc_cached(f, 3));
        dc_map(f, (int32_t[]){4}, 1); /* evicts 3 (1 use) */
        CHECK(!dc_cached(f, 3) && dc_cached(f, 4));
        /* As the store, the device cache pins a request's hits before it places the misses:
         * 5, listed before the hit 4, takes the least used unpinned slot, 1's (2 uses against
         * 0's 3), not 4's (1 use). */
        dc_map(f, (int32_t[]){5, 4}, 2);
        CHECK(dc_cached(f, 5) && dc_cached(f, 4) && !dc_cached(f, 1) && dc_cached(f, 0));
        CHECK(f->dev.requests == 10 && f->dev.hits == 4);
        /* the no-sync path's counts: uses and recency as a hit's */
        sl_dev_cache_count(&f->dev, 1, (int32_t[]){5}, 1);
        CHECK(f->dev.requests == 11 && f->dev.hits == 5);
    } else {
        CHECK(0);
    }
    if (f) dc_close(f);
    /* LRU, 3 slots */
    if (f && dc_open(f, 3, SL_CACHE_LRU)) {
        dc_map(f, (int32_t[]){0, 1}, 2);
        dc_map(f, (int32_t[]){2}, 1);
        dc_map(f, (int32_t[]){0}, 1); /* recency: 1 < 2 < 0 */
        dc_map(f, (int32_t[]){3}, 1); /* evicts 1 */
        CHECK(!dc_cached(f, 1) && dc_cached(f, 0) && dc_cached(f, 2) && dc_cached(f, 3));
        dc_map(f, (int32_t[]){2, 4, 5}, 3); /* 2 used first: evicts 0, then 3 */
        CHECK(dc_cached(f, 2) && dc_cached(f, 4) && dc_cached(f, 5) && !dc_cached(f, 0) &&
              !dc_cached(f, 3));
    } else {
        CHECK(0);
    }
    if (f) dc_close(f);
    free(f);
}

/* The MoE step's two halves (dev_fetch): lookup pins the hits and leaves the misses' views, which
 * are put in any order, each copied in with its own expert's bytes, never over a hit. */
TEST(test_dev_cache_lookup_put) {
    dc_fixture *f = calloc(1, sizeof *f);
    if (f && dc_open(f, 3, SL_CACHE_LRU)) {
        dc_map(f, (int32_t[]){0, 1, 2}, 3); /* full, all used at once: ties go to the lowest slot */
        const int32_t ids[3] = {4, 0, 5};
        const sl_expert *v[3] = {NULL, NULL, NULL};
        CHECK(sl_dev_cache_lookup(&f->dev, 1, ids, 3, v) == 2);
        CHECK(v[0] == NULL && v[1] != NULL && v[2] == NULL);
        CHECK(((const float *)v[1]->gate.data)[0] == 1.0f);
        /* 5 lands first and takes the lowest unpinned slot, 1's; 4 then takes 2's; 0 stays */
        v[2] = sl_dev_cache_put(&f->dev, &f->be, 1, 5, &f->ex[5]);
        v[0] = sl_dev_cache_put(&f->dev, &f->be, 1, 4, &f->ex[4]);
        CHECK(((const float *)v[2]->down.data)[0] == 6.0f);
        CHECK(((const float *)v[0]->up.data)[DC_H * DC_I - 1] == 5.0f);
        CHECK(dc_cached(f, 0) && dc_cached(f, 4) && dc_cached(f, 5) && !dc_cached(f, 1) &&
              !dc_cached(f, 2));
        CHECK(f->dev.requests == 6 && f->dev.hits == 1);
    } else {
        CHECK(0);
    }
    if (f) dc_close(f);
    free(f);
}
