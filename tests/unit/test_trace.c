/*
 * Routing traces (moe/trace.h): the writer and reader round trip, every check of the reader,
 * and the cache simulation over them (moe/cache_sim.h): Belady's optimum on sequences whose
 * answer is known (and against an exhaustive search), the policies' replays, prefetch counts.
 */
#include "moe/cache_sim.h"
#include "moe/replay.h"
#include "moe/slot_cache.h"
#include "test.h"

/* A trace in memory: header, then records appended with rec(). */
typedef struct tbuf {
    uint8_t b[4096];
    size_t n;
} tbuf;

static void put32(tbuf *t, uint32_t v) {
    for (int i = 0; i < 4; i++)
        t->b[t->n++] = (uint8_t)(v >> (8 * i));
}
static void put16(tbuf *t, uint32_t v) {
    t->b[t->n++] = (uint8_t)v, t->b[t->n++] = (uint8_t)(v >> 8);
}
static void hdr(tbuf *t, uint32_t nl, uint32_t ne, uint32_t k) {
    t->n = 0;
    memcpy(t->b, "SLTRACE1", 8);
    t->n = 8;
    put32(t, nl), put32(t, ne), put32(t, k), put32(t, 0);
}
static void rec(tbuf *t, uint32_t step, uint32_t layer, uint32_t kind, int n, const int *ids) {
    put32(t, step), put16(t, layer);
    t->b[t->n++] = (uint8_t)kind, t->b[t->n++] = (uint8_t)n;
    for (int i = 0; i < n; i++)
        put16(t, (uint32_t)ids[i]);
}

TEST(test_trace_round_trip) {
    const char *path = "/tmp/sluice-test-trace.sltrace";
    char full[512];
    snprintf(full, sizeof full, "%s/t.sltrace", test_tmpdir());
    path = full;
    sl_trace_writer w;
    sl_error err = {0};
    CHECK(sl_trace_writer_open(&w, path, 1, 3, 40, 4, &err) == SL_OK);
    const int32_t a[4] = {5, 39, 0, 7}, b[2] = {1, 2};
    for (uint32_t s = 0; s < 50; s++) {
        CHECK(sl_trace_writer_reserve(&w, 3 * sl_trace_record_bytes(4), &err) == SL_OK);
        w.step = s;
        CHECK(sl_trace_writer_add(&w, 0, SL_TRACE_PICKS, a, 4, &err) == SL_OK);
        CHECK(sl_trace_writer_add(&w, 2, SL_TRACE_PREDICT, b, 2, &err) == SL_OK);
        CHECK(sl_trace_writer_add(&w, 2, SL_TRACE_PICKS, b, 1 + (int32_t)(s % 2), &err) == SL_OK);
    }
    CHECK(sl_trace_writer_close(&w, &err) == SL_OK);
    sl_trace t, m;
    CHECK(sl_trace_load(&t, path, &err) == SL_OK);
    CHECK(sl_trace_parse(&m, "mem", w.mem, w.len, &err) == SL_OK);
    CHECK(t.n_layers == 3 && t.n_experts == 40 && t.k == 4 && t.n_records == 150);
    CHECK(m.n_records == t.n_records && m.off[m.n_records] == t.off[t.n_records]);
    CHECK(!memcmp(m.ids, t.ids, (size_t)t.off[t.n_records] * 2));
    CHECK(t.step[149] == 49 && t.layer[1] == 2 && t.kind[1] == 1 && t.kind[2] == 0);
    CHECK(t.off[1] == 4 && t.ids[1] == 39 && t.ids[3] == 7);
    sl_trace_free(&m);
    /* requests: layer 0 one per step of 4 distinct sorted ids; layer 2 its predictions */
    sl_requests r;
    CHECK(sl_requests_build(&r, &t, &err) == SL_OK);
    CHECK(r.n_used == 2 && r.tokens == 50);
    CHECK(r.layers[0].n_req == 50 && r.layers[1].n_req == 0 && r.layers[2].n_req == 50);
    const uint16_t *q = r.layers[0].ids;
    CHECK(q[0] == 0 && q[1] == 5 && q[2] == 7 && q[3] == 39);
    CHECK(r.layers[2].poff[1] == 2 && r.layers[2].off[1] == 1 && r.layers[2].off[2] == 3);
    sl_requests_free(&r);
    sl_trace_free(&t);
    sl_trace_writer_free(&w);
    /* a write that fails: the error sticks and close reports it */
    err = (sl_error){0};
    if (sl_trace_writer_open(&w, "/dev/full", 0, 3, 40, 4, &err) == SL_OK) {
        sl_status st = SL_OK;
        for (int i = 0; i < 5000 && !st; i++)
            st = sl_trace_writer_add(&w, 0, 0, a, 4, &err);
        if (!st) st = sl_trace_writer_close(&w, &err);
        CHECK(st == SL_ERR_IO && strstr(err.msg, "/dev/full"));
        sl_trace_writer_free(&w);
    }
}

/* Parses t and expects an error whose message has want in it. */
static void bad(const tbuf *t, size_t len, const char *want, const char *what) {
    sl_trace tr;
    sl_error err = {0};
    const sl_status st = sl_trace_parse(&tr, "bad.sltrace", t->b, len, &err);
    CHECKF(st == SL_ERR_FORMAT && strstr(err.msg, "bad.sltrace") && strstr(err.msg, want),
           "%s: status %d, '%s' (want '%s')", what, st, err.msg, want);
    if (!st) sl_trace_free(&tr);
}

TEST(test_trace_bad_files) {
    tbuf t;
    const int ids[3] = {1, 2, 3};
    hdr(&t, 4, 16, 2);
    bad(&t, 20, "too short", "short header");
    t.b[0] = 'X';
    bad(&t, t.n, "magic", "magic");
    hdr(&t, 0, 16, 2);
    bad(&t, t.n, "n_layers 0", "no layers");
    hdr(&t, 4, 0, 2);
    bad(&t, t.n, "n_experts 0", "no experts");
    hdr(&t, 4, 65536, 2);
    bad(&t, t.n, "n_experts 65536", "too many experts");
    hdr(&t, 4, 16, 0);
    bad(&t, t.n, "k 0", "k 0");
    hdr(&t, 4, 100, 65);
    bad(&t, t.n, "k 65", "k over 64");
    hdr(&t, 4, 16, 17);
    bad(&t, t.n, "k 17", "k over n_experts");
    hdr(&t, 4, 16, 2);
    t.b[20] = 1;
    bad(&t, t.n, "reserved", "reserved");
    hdr(&t, 4, 16, 2);
    rec(&t, 0, 4, 0, 2, ids);
    bad(&t, t.n, "layer 4 of 4", "layer");
    hdr(&t, 4, 16, 2);
    rec(&t, 0, 1, 2, 2, ids);
    bad(&t, t.n, "kind 2", "kind");
    hdr(&t, 4, 16, 2);
    rec(&t, 0, 1, 0, 0, ids);
    bad(&t, t.n, "0 ids", "no ids");
    hdr(&t, 4, 16, 2);
    rec(&t, 0, 1, 0, 3, ids);
    bad(&t, t.n, "3 ids", "n over k");
    hdr(&t, 4, 16, 2);
    const int big[2] = {3, 16};
    rec(&t, 0, 1, 0, 2, big);
    bad(&t, t.n, "expert id 16", "id");
    hdr(&t, 4, 16, 2);
    rec(&t, 0, 1, 0, 2, ids);
    bad(&t, t.n - 1, "truncated record at byte 24", "truncated ids");
    bad(&t, t.n - 5, "truncated record at byte 24", "truncated record header");
    hdr(&t, 4, 16, 2);
    rec(&t, 5, 1, 0, 2, ids);
    rec(&t, 4, 1, 0, 2, ids);
    bad(&t, t.n, "byte 36: step 4 layer 1 after step 5", "step order");
    hdr(&t, 4, 16, 2);
    rec(&t, 5, 2, 0, 2, ids);
    rec(&t, 5, 1, 0, 2, ids);
    bad(&t, t.n, "layer 1 after step 5 layer 2", "layer order");
    /* and the good ones: a header alone, and records */
    sl_trace tr;
    sl_error err = {0};
    hdr(&t, 4, 16, 2);
    CHECK(sl_trace_parse(&tr, "ok", t.b, t.n, &err) == SL_OK && tr.n_records == 0);
    sl_trace_free(&tr);
    rec(&t, 5, 1, 1, 1, ids);
    rec(&t, 5, 1, 0, 2, ids);
    rec(&t, 6, 0, 0, 2, ids);
    CHECK(sl_trace_parse(&tr, "ok", t.b, t.n, &err) == SL_OK && tr.n_records == 3);
    sl_trace_free(&tr);
}

/* Requests of one layer from a list: reqs[i] holds its ids, -1 ending each (up to 8). */
static void one_layer(sl_requests *r, sl_req_layer *L, int32_t n_keys, const int (*reqs)[8],
                      int64_t n) {
    static uint16_t ids[4096];
    static int64_t off[512], poff[512];
    memset(r, 0, sizeof *r);
    memset(L, 0, sizeof *L);
    r->n_layers = 1, r->n_experts = n_keys, r->k = 8, r->layers = L, r->n_used = 1;
    int64_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i] = o, poff[i] = 0;
        for (int j = 0; j < 8 && reqs[i][j] >= 0; j++)
            ids[o++] = (uint16_t)reqs[i][j];
        L->max_size = SL_MAX(L->max_size, o - off[i]);
    }
    off[n] = o, poff[n] = 0;
    L->n_req = n, L->off = off, L->ids = ids, L->poff = poff, L->pids = ids, L->tokens = n;
    r->tokens = n;
}

/* The best hits an exhaustive search finds (keys < 16, requests of at most S keys): after a
 * request the cache holds its keys and, of the others it held, any choice of as many as still
 * fit (a free slot is filled before anything is evicted). cache: a bit per key. */
static int64_t best_hits(const int (*reqs)[8], int64_t n, int64_t i, int32_t S, uint32_t cache) {
    if (i == n) return 0;
    uint32_t R = 0;
    for (int j = 0; j < 8 && reqs[i][j] >= 0; j++)
        R |= 1u << reqs[i][j];
    const int64_t hits = __builtin_popcount(cache & R);
    const uint32_t U = cache & ~R;
    const int keep = SL_MIN(S, __builtin_popcount(cache | R)) - __builtin_popcount(R);
    int64_t best = -1;
    for (uint32_t T = U;; T = (T - 1) & U) { /* every subset of U */
        if (__builtin_popcount(T) == keep) best = SL_MAX(best, best_hits(reqs, n, i + 1, S, R | T));
        if (!T) break;
    }
    return hits + best;
}

TEST(test_trace_belady) {
    sl_requests r;
    sl_req_layer L;
    sl_error err = {0};
    sl_sim_result res;
    /* The textbook reference string, 3 frames: OPT faults 9 times, LRU 12 (Silberschatz). */
    static const int ref[20] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
    int reqs[64][8];
    for (int i = 0; i < 20; i++)
        reqs[i][0] = ref[i], reqs[i][1] = -1;
    one_layer(&r, &L, 8, (const int(*)[8])reqs, 20);
    CHECK(sl_cache_belady(&r, 3, &res, &err) == SL_OK);
    CHECKF(res.requests == 20 && res.hits == 11, "belady hits %lld", (long long)res.hits);
    CHECK(sl_cache_sim(&r, 3, SL_CACHE_LRU, 0, 0, &res, &err) == SL_OK);
    CHECKF(res.hits == 8, "lru hits %lld", (long long)res.hits);
    /* several keys a request: {0,1} {2} {0} {1}, 2 slots: 2 evicts 1 (needed later than 0) */
    static const int multi[4][8] = {{0, 1, -1}, {2, -1}, {0, -1}, {1, -1}};
    one_layer(&r, &L, 4, multi, 4);
    CHECK(sl_cache_belady(&r, 2, &res, &err) == SL_OK && res.requests == 5 && res.hits == 1);
    /* a request larger than the cache: {0} {1,2,3} {0} {3}, 2 slots: keeps 0 and 3 after it */
    static const int over[4][8] = {{0, -1}, {1, 2, 3, -1}, {0, -1}, {3, -1}};
    one_layer(&r, &L, 4, over, 4);
    CHECK(sl_cache_belady(&r, 2, &res, &err) == SL_OK && res.requests == 6 && res.hits == 2);
    /* against an exhaustive search on random sequences, and never below a policy */
    uint32_t x = 12345;
    for (int trial = 0; trial < 40; trial++) {
        const int n = 10, keys = 6, S = 2 + trial % 3;
        for (int i = 0; i < n; i++) {
            const int m = 1 + (int)((x = x * 1103515245u + 12345u) >> 16) % 2;
            int j = 0;
            while (j < m) {
                const int e = (int)((x = x * 1103515245u + 12345u) >> 16) % keys;
                int dup = 0;
                for (int q = 0; q < j; q++)
                    dup |= reqs[i][q] == e;
                if (!dup) reqs[i][j++] = e;
            }
            reqs[i][j] = -1;
        }
        one_layer(&r, &L, keys, (const int(*)[8])reqs, n);
        CHECK(sl_cache_belady(&r, S, &res, &err) == SL_OK);
        const int64_t want = best_hits((const int(*)[8])reqs, n, 0, S, 0);
        CHECKF(res.hits == want, "trial %d: belady %lld, exhaustive %lld", trial,
               (long long)res.hits, (long long)want);
        for (int p = 0; p < 3; p++) {
            sl_sim_result pr;
            CHECK(sl_cache_sim(&r, S, (sl_cache_policy)p, 0, 0, &pr, &err) == SL_OK);
            CHECK(pr.requests == res.requests && pr.hits <= res.hits);
        }
    }
}

TEST(test_trace_prefetch) {
    sl_requests r;
    sl_req_layer L;
    sl_error err = {0};
    sl_sim_result res;
    /* {0,1} {2,3} {0,1}, 4 slots; the third predicted {0, 5}: 0 is cached already, 5 read in
     * (wasted) */
    static const int q[3][8] = {{0, 1, -1}, {2, 3, -1}, {0, 1, -1}};
    one_layer(&r, &L, 8, q, 3);
    static uint16_t pids[2] = {0, 5};
    static int64_t poff[4] = {0, 0, 0, 2};
    L.pids = pids, L.poff = poff;
    CHECK(sl_cache_sim(&r, 4, SL_CACHE_LRU, 0, 1, &res, &err) == SL_OK);
    CHECK(res.predicted == 2 && res.predicted_right == 1 && res.requested == 2);
    CHECK(res.inserts == 1 && res.wasted == 1);
    /* 5 took the oldest slot, 0's (0 and 1 tie; the lower slot): the third request hits 1 only */
    CHECKF(res.requests == 6 && res.hits == 1, "hits %lld", (long long)res.hits);
    CHECK(sl_cache_sim(&r, 4, SL_CACHE_LRU, 0, 1, &res, &err) == SL_OK && res.prefetch_used == 0);
    CHECK(sl_cache_sim(&r, 4, SL_CACHE_LRU, 0, 0, &res, &err) == SL_OK && res.hits == 2);
    /* {0,1} {2,3} {5,1}, the third predicted {5}: read ahead into 0's slot (the second
     * request's stay pinned), then found there: a prefetch used, neither hit nor miss */
    static const int q2[3][8] = {{0, 1, -1}, {2, 3, -1}, {5, 1, -1}};
    one_layer(&r, &L, 8, q2, 3);
    static uint16_t pids2[1] = {5};
    static int64_t poff2[4] = {0, 0, 0, 1};
    L.pids = pids2, L.poff = poff2;
    CHECK(sl_cache_sim(&r, 4, SL_CACHE_LRU, 0, 1, &res, &err) == SL_OK);
    CHECKF(res.hits == 1 && res.prefetch_used == 1 && res.inserts == 1 && res.wasted == 0,
           "hits %lld used %lld", (long long)res.hits, (long long)res.prefetch_used);
}

/* A request of one key: a hit uses its slot, a miss takes the policy's victim. */
static void request_one(sl_slot_cache *c, int32_t key) {
    sl_slot_begin(c);
    const int32_t slot = sl_slot_lookup(c, key);
    if (slot < 0)
        sl_slot_insert(c, sl_slot_victim(c), key);
    else
        sl_slot_use(c, slot);
}

TEST(test_slot_cache_decay_order) {
    sl_slot_cache c;
    sl_error err = {0};
    CHECK(sl_slot_cache_init(&c, 2, 8, SL_CACHE_DECAY, &err) == SL_OK);
    c.halflife = 2;
    /* key 0 used 4 times long ago, key 1 once recently: 0's weight has decayed below 1's */
    for (int i = 0; i < 4; i++)
        request_one(&c, 0);
    for (int i = 0; i < 12; i++)
        sl_slot_begin(&c);
    sl_slot_begin(&c);
    sl_slot_insert(&c, sl_slot_victim(&c), 1);
    sl_slot_begin(&c);
    CHECK(c.slot_key[sl_slot_victim(&c)] == 0);
    sl_slot_insert(&c, sl_slot_victim(&c), 2);
    CHECK(sl_slot_lookup(&c, 0) < 0 && sl_slot_lookup(&c, 1) >= 0);
    /* its history survives the eviction: a use of 0 now outweighs the first use of 3 */
    sl_slot_begin(&c);
    sl_slot_count(&c, 0);
    sl_slot_count(&c, 3);
    CHECK(c.score[0] > c.score[3]);
    /* plain LFU on the same requests evicts the key with fewer uses, 1 */
    sl_slot_cache_free(&c);
    CHECK(sl_slot_cache_init(&c, 2, 8, SL_CACHE_LFU, &err) == SL_OK);
    for (int i = 0; i < 4; i++)
        request_one(&c, 0);
    for (int i = 0; i < 13; i++)
        sl_slot_begin(&c);
    sl_slot_insert(&c, sl_slot_victim(&c), 1);
    sl_slot_begin(&c);
    CHECK(c.slot_key[sl_slot_victim(&c)] == 1);
    sl_slot_cache_free(&c);
}

/* --router-trace from the engine: the same records whether decode steps' picks reach the host in
 * the step (CPU) or at the end of the pass (the device path's fused experts, sl_moe_settle; CPU
 * run as a device), and one step a forward chunk. */
TEST(test_trace_engine_paths) {
    char dir[512], p_cpu[600], p_dev[600], p_chunk[600];
    snprintf(dir, sizeof dir, "%s/qwen3_gqa_untied", test_fixtures);
    snprintf(p_cpu, sizeof p_cpu, "%s/cpu.sltrace", test_tmpdir());
    snprintf(p_dev, sizeof p_dev, "%s/dev.sltrace", test_tmpdir());
    snprintf(p_chunk, sizeof p_chunk, "%s/chunk.sltrace", test_tmpdir());
    const int32_t ids[6] = {202, 110, 181, 26, 91, 229};
    int32_t vocab;
    sl_model_params mp = {.n_threads = 1, .backend = SL_BACKEND_CPU, .router_trace = p_cpu};
    free(test_logits(dir, &mp, ids, 6, 1, NULL, &vocab));
    mp.backend = SL_BACKEND_CPU_DEVICE, mp.router_trace = p_dev;
    free(test_logits(dir, &mp, ids, 6, 1, NULL, &vocab));
    mp.backend = SL_BACKEND_CPU, mp.router_trace = p_chunk;
    free(test_logits(dir, &mp, ids, 6, 4, NULL, &vocab));
    sl_trace a, b, c;
    sl_error err = {0};
    CHECK(sl_trace_load(&a, p_cpu, &err) == SL_OK);
    CHECK(sl_trace_load(&b, p_dev, &err) == SL_OK);
    CHECK(sl_trace_load(&c, p_chunk, &err) == SL_OK);
    CHECKF(a.n_records > 0 && a.n_records % 6 == 0, "%lld records", (long long)a.n_records);
    CHECK(b.n_records == a.n_records && c.n_records == a.n_records);
    CHECK(!memcmp(a.ids, b.ids, (size_t)a.off[a.n_records] * 2));
    CHECK(!memcmp(a.step, b.step, (size_t)a.n_records * 4) && a.step[a.n_records - 1] == 5);
    CHECK(c.step[c.n_records - 1] == 1); /* chunks of 4, then 2 */
    sl_trace_free(&a), sl_trace_free(&b), sl_trace_free(&c);
}

/* --route-replay's tables (moe/replay.h): the traced model's MoE layers packed (a dense layer
 * has no records), each layer's tokens in order, predictions where every token of every MoE
 * layer but the first has one, tokens around again at the end; a trace for other experts or
 * picks, or with a token short of its picks, refused. */
TEST(test_route_replay_load) {
    char path[512];
    snprintf(path, sizeof path, "%s/replay.sltrace", test_tmpdir());
    tbuf t;
    hdr(&t, 3, 10, 2);
    const int p0[3][2] = {{1, 2}, {3, 4}, {5, 6}}, p2[3][2] = {{7, 8}, {9, 0}, {2, 1}};
    const int q2[3][2] = {{8, 7}, {9, 1}, {4, 5}};
    for (int s = 0; s < 3; s++) {
        rec(&t, (uint32_t)s, 0, SL_TRACE_PICKS, 2, p0[s]);
        rec(&t, (uint32_t)s, 2, SL_TRACE_PREDICT, 2, q2[s]);
        rec(&t, (uint32_t)s, 2, SL_TRACE_PICKS, 2, p2[s]);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(t.b, 1, t.n, f) == t.n);
    fclose(f);
    sl_route_replay r;
    sl_error err = {0};
    CHECK(sl_route_replay_load(&r, path, 10, 2, &err) == SL_OK);
    CHECK(r.t_layers == 2 && r.n_tokens == 3 && r.pred);
    CHECK(sl_route_replay_picks(&r, 0, 1)[0] == 3 && sl_route_replay_picks(&r, 1, 2)[1] == 1);
    CHECK(sl_route_replay_picks(&r, 2, 4)[0] == 3); /* MoE layer 2 is trace layer 0, token 1 */
    int32_t n;
    const uint16_t *q = sl_route_replay_pred(&r, 1, 1, &n);
    CHECK(n == 2 && q[0] == 9 && q[1] == 1);
    sl_route_replay_pred(&r, 0, 0, &n);
    CHECK(n == 0); /* the first MoE layer has no prediction */
    sl_route_replay_free(&r);
    CHECK(sl_route_replay_load(&r, path, 12, 2, &err) == SL_ERR_ARG);
    CHECK(strstr(err.msg, "a trace of 10 experts, 2 a token") != NULL);
    hdr(&t, 1, 10, 2);
    rec(&t, 0, 0, SL_TRACE_PICKS, 1, p0[0]);
    f = fopen(path, "wb");
    CHECK(f && fwrite(t.b, 1, t.n, f) == t.n);
    fclose(f);
    err = (sl_error){0};
    CHECK(sl_route_replay_load(&r, path, 10, 2, &err) == SL_ERR_FORMAT);
    CHECK(strstr(err.msg, "a replay needs all 2") != NULL);
}
