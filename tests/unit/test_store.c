/*
 * The packed format and the expert store: bitwise identity across modes and
 * cache sizes, quantisation error against the float reference, the cache
 * policies (eviction order, pinning, exactly which reads happen), and
 * corrupt, truncated or tampered packs failing with a clear error.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/packer.h"
#include "test.h"

static const char *const cases[] = {"qwen3_gqa_untied",     "qwen3_mha_tied_fused",
                                    "qwen3_prefix_sharded", "qwen2_gqa_untied",
                                    "qwen2_mha_tied_fused", "qwen2_odd"};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Packs fixture `name` at quant q into the temp dir (once per process). */
static const char *packed(const char *name, sl_quant q) {
    static char dirs[N_CASES][3][512];
    size_t i = 0;
    while (i < N_CASES && strcmp(cases[i], name))
        i++;
    SL_ASSERT(i < N_CASES);
    char *dir = dirs[i][q];
    if (dir[0]) return dir;
    char src[512];
    snprintf(src, sizeof src, "%s/%s", test_fixtures, name);
    snprintf(dir, 512, "%s/pack-%s-%d", test_tmpdir(), name, (int)q);
    sl_pack_params p = {.quant = q};
    sl_error err = {0};
    if (sl_pack(src, dir, &p, &err)) {
        fprintf(stderr, "  pack %s: %s\n", name, err.msg);
        dir[0] = 0;
        return NULL;
    }
    return dir;
}

/* Prompt ids of a fixture (from ref.json, parsed crudely: the "ids" array). */
static int32_t fixture_ids(const char *name, int32_t *ids, int32_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/ref.json", test_fixtures, name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strstr(buf, "\"ids\"");
    if (!p || !(p = strchr(p, '['))) return 0;
    int32_t count = 0;
    for (p++; *p && *p != ']' && count < cap;) {
        ids[count++] = (int32_t)strtol(p, &p, 10);
        while (*p == ',' || *p == ' ' || *p == '\n')
            p++;
    }
    return count;
}

TEST(test_pack_modes_and_cache_sizes_bitwise) {
    for (size_t c = 0; c < N_CASES; c++) {
        int32_t ids[64], V = 0;
        int32_t n = fixture_ids(cases[c], ids, 64);
        char src[512];
        snprintf(src, sizeof src, "%s/%s", test_fixtures, cases[c]);
        sl_model_params mp = {.n_threads = 2};
        float *ref = test_logits(src, &mp, ids, n, n, NULL, &V);
        CHECK(ref != NULL);
        for (int q = SL_QUANT_BF16; ref && q <= SL_QUANT_INT4; q++) {
            const char *dir = packed(cases[c], (sl_quant)q);
            CHECK(dir != NULL);
            if (!dir) continue;
            mp.experts = SL_EXPERTS_RESIDENT;
            float *base = test_logits(dir, &mp, ids, n, n, NULL, &V);
            CHECK(base != NULL);
            if (!base) continue;
            const size_t count = (size_t)n * (size_t)V;
            double err = test_rel_l2(base, ref, count);
            if (q == SL_QUANT_BF16) /* fixtures hold BF16/F16-exact values: same as the source */
                CHECKF(memcmp(base, ref, count * sizeof(float)) == 0, "%s bf16 pack differs",
                       cases[c]);
            if (q == SL_QUANT_INT8) CHECKF(err <= 3e-2, "%s int8 rel L2 %g", cases[c], err);
            if (q == SL_QUANT_INT4) CHECKF(err <= 0.4, "%s int4 rel L2 %g", cases[c], err);
            printf("  %-22s %s: rel L2 vs float %.2e\n", cases[c],
                   q == 0   ? "bf16"
                   : q == 1 ? "int8"
                            : "int4",
                   err);
            /* Every mode, policy, cache size and chunking gives the same bits. */
            sl_model_info info;
            sl_model *m = NULL;
            sl_error e = {0};
            const sl_status lst = sl_model_load(dir, &mp, &m, &e);
            CHECKF(lst == SL_OK, "%s q%d: %s", cases[c], q, e.msg);
            if (lst) {
                free(base);
                continue;
            }
            sl_model_get_info(m, &info);
            sl_model_free(m);
            /* The device path (CPU_DEVICE: weights copied, experts through the device
             * cache, all slots (no-sync fused path) or a few) gives them too. */
            const int32_t k = info.n_experts_used;
            struct {
                sl_experts_mode mode;
                int32_t slots;
                sl_cache_policy pol;
                int32_t chunk;
                sl_backend_kind be;
                int32_t dev_slots;
            } v[] = {
                {SL_EXPERTS_MAPPED, 0, 0, n, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_STREAM, 0, SL_CACHE_LFU, n, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_STREAM, k, SL_CACHE_LFU, n, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_STREAM, k, SL_CACHE_LRU, 1, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_STREAM, k + 1, SL_CACHE_LRU, 5, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_STREAM, info.n_experts - 1, SL_CACHE_LFU, 3, SL_BACKEND_CPU, 0},
                {SL_EXPERTS_RESIDENT, 0, 0, 1, SL_BACKEND_CPU_DEVICE, 0},
                {SL_EXPERTS_RESIDENT, 0, 0, n, SL_BACKEND_CPU_DEVICE, 0},
                {SL_EXPERTS_STREAM, k, SL_CACHE_LFU, 1, SL_BACKEND_CPU_DEVICE, 1},
                {SL_EXPERTS_STREAM, k, SL_CACHE_LRU, 1, SL_BACKEND_CPU_DEVICE, k},
                {SL_EXPERTS_MAPPED, 0, SL_CACHE_LFU, 3, SL_BACKEND_CPU_DEVICE, k + 1},
                /* more device slots than host ones: the store reads only what the device lacks */
                {SL_EXPERTS_STREAM, k, SL_CACHE_DECAY, 1, SL_BACKEND_CPU_DEVICE, k + 2},
            };
            for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
                sl_model_params vp = {.n_threads = 2,
                                      .experts = v[i].mode,
                                      .cache_experts = v[i].slots,
                                      .cache_policy = v[i].pol,
                                      .backend = v[i].be,
                                      .gpu_experts = v[i].dev_slots};
                sl_stats st;
                float *got = test_logits(dir, &vp, ids, n, v[i].chunk, &st, &V);
                CHECKF(got && memcmp(got, base, count * sizeof(float)) == 0,
                       "%s q%d variant %zu differs", cases[c], q, i);
                if (v[i].mode == SL_EXPERTS_STREAM)
                    CHECK(st.bytes_read > 0 && st.expert_hits <= st.expert_requests);
                /* decode through a device cache short of all experts runs the fused experts
                 * ahead of the host; with fewer slots than picks they never stand */
                if (v[i].be == SL_BACKEND_CPU_DEVICE && v[i].dev_slots && v[i].chunk == 1)
                    CHECK(st.gpu_steps_ahead + st.gpu_steps_rerun > 0 &&
                          (v[i].dev_slots >= k || st.gpu_steps_ahead == 0));
                free(got);
            }
            free(base);
        }
        free(ref);
    }
}

/* The device path with a slot per expert: decode steps take the no-sync path, and the picks
 * they leave on the device are counted after each pass (sl_moe_settle): the same router
 * histogram as the CPU backend's, the same decode repeats (every step's picks after the first,
 * against the step before), and every GPU-cache request a hit. */
TEST(test_device_path_bookkeeping) {
    const char *name = "qwen3_gqa_untied";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixtures, name);
    int32_t ids[64];
    const int32_t n = fixture_ids(name, ids, 64), steps = 5;
    CHECK(n > 0);
    int64_t *hist[2] = {NULL, NULL}, repeats[2] = {-1, -2};
    size_t cells = 0;
    for (int dev = 0; dev < 2; dev++) {
        sl_model_params mp = {.n_threads = 2,
                              .backend = dev ? SL_BACKEND_CPU_DEVICE : SL_BACKEND_CPU};
        sl_model *m = NULL;
        sl_session *s = NULL;
        sl_error err = {0};
        CHECK(sl_model_load(dir, &mp, &m, &err) == SL_OK);
        if (!m) return;
        sl_session_params sp = {.max_ctx = n + steps};
        CHECK(sl_session_create(m, &sp, &s, &err) == SL_OK);
        CHECK(s && sl_session_forward(s, ids, n, NULL, 0, &err) == SL_OK);
        for (int32_t i = 0; s && i < steps; i++)
            CHECK(sl_session_forward(s, &ids[i], 1, NULL, 0, &err) == SL_OK);
        const int32_t L = m->cfg.n_layers, E = m->cfg.n_experts, k = m->cfg.n_experts_used;
        cells = (size_t)L * (size_t)E;
        hist[dev] = calloc(cells, sizeof(int64_t));
        int64_t total = 0;
        int32_t moe_layers = 0;
        for (int32_t l = 0; l < L; l++) {
            if (!m->experts.layers[l].hist) continue;
            moe_layers++;
            for (int32_t e = 0; e < E; e++) {
                hist[dev][(size_t)l * E + e] = m->experts.layers[l].hist[e];
                total += m->experts.layers[l].hist[e];
            }
        }
        CHECKF(total == (int64_t)(n + steps) * k * moe_layers, "%s: %lld picks counted",
               dev ? "device" : "cpu", (long long)total);
        sl_stats st;
        sl_model_get_stats(m, &st);
        CHECKF(st.decode_picks == (int64_t)(steps - 1) * k * moe_layers,
               "%s: %lld decode picks compared", dev ? "device" : "cpu",
               (long long)st.decode_picks);
        CHECK(st.decode_repeats >= 0 && st.decode_repeats <= st.decode_picks);
        repeats[dev] = st.decode_repeats;
        if (dev) {
            CHECK(m->dev.all);
            CHECK(st.gpu_expert_requests > 0 && st.gpu_expert_hits == st.gpu_expert_requests);
            CHECK(s && !memchr(s->moe.pending, 1, (size_t)L)); /* settled */
        }
        /* After a reset the first step has no previous step to compare with; the second has. */
        sl_session_reset(s);
        for (int32_t i = 0; s && i < 2; i++) {
            CHECK(sl_session_forward(s, &ids[i], 1, NULL, 0, &err) == SL_OK);
            sl_stats st2;
            sl_model_get_stats(m, &st2);
            CHECKF(st2.decode_picks == st.decode_picks + (int64_t)i * k * moe_layers,
                   "%s: %lld decode picks after a reset and %d steps", dev ? "device" : "cpu",
                   (long long)st2.decode_picks, i + 1);
        }
        sl_session_free(s);
        sl_model_free(m);
    }
    CHECK(hist[0] && hist[1] && memcmp(hist[0], hist[1], cells * sizeof(int64_t)) == 0);
    CHECK(repeats[0] == repeats[1]);
    free(hist[0]), free(hist[1]);
}

/* ---- cache policy, driven through the store API on one layer ---- */

static sl_expert_store *open_store(const char *dir, int32_t slots, sl_cache_policy pol) {
    static sl_expert_store s;
    sl_config cfg;
    sl_error err = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    /* qwen3_gqa_untied: 3 layers, MoE at 0 and 2, 8 experts, top-2 */
    uint8_t moe[3] = {1, 0, 1};
    (void)cfg;
    sl_store_params p = {.mode = SL_EXPERTS_STREAM,
                         .policy = pol,
                         .cache_experts = slots,
                         .min_slots = 2,
                         .io_threads = 3};
    if (sl_experts_open_packed(&s, dir, 3, moe, 8, 48, 32, &p, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        sl_experts_free(&s);
        return NULL;
    }
    return &s;
}

/* Fetches ids on layer 0; returns the bytes read by this call, in experts. */
static int64_t fetch(sl_expert_store *s, const int32_t *ids, int32_t n) {
    const sl_expert *out[8];
    sl_error err = {0};
    int64_t before = s->bytes_read;
    CHECK(sl_experts_fetch(s, 0, ids, n, out, &err) == SL_OK);
    for (int32_t i = 0; i < n; i++)
        CHECK(s->layers[0].slots.slot_key[(out[i] - s->layers[0].slot_views)] == ids[i]);
    return (s->bytes_read - before) / (int64_t)s->layers[0].hdr.blob_bytes;
}

static int cached(const sl_expert_store *s, int32_t e) {
    return sl_slot_lookup(&s->layers[0].slots, e) >= 0;
}

TEST(test_cache_lfu_lru_and_pinning) {
    const char *dir = packed("qwen3_gqa_untied", SL_QUANT_INT8);
    if (!dir) {
        CHECK(0);
        return;
    }
    /* LFU, 3 slots. */
    sl_expert_store *s = open_store(dir, 3, SL_CACHE_LFU);
    if (!s) {
        CHECK(0);
        return;
    }
    CHECK(fetch(s, (int32_t[]){0, 1}, 2) == 2); /* two misses into empty slots */
    CHECK(fetch(s, (int32_t[]){0, 2}, 2) == 1); /* 0 hits; 2 fills the last empty slot */
    CHECK(fetch(s, (int32_t[]){0, 1}, 2) == 0); /* uses: 0 -> 3, 1 -> 2, 2 -> 1 */
    CHECK(fetch(s, (int32_t[]){3}, 1) == 1);    /* evicts 2, the least used */
    CHECK(!cached(s, 2) && cached(s, 0) && cached(s, 1) && cached(s, 3));
    CHECK(fetch(s, (int32_t[]){4}, 1) == 1); /* 1 (uses 2) vs 3 (uses 1): evicts 3 */
    CHECK(!cached(s, 3) && cached(s, 1));
    /* Ties on uses go to the oldest use: 4 (uses 1, tick 6) vs a fresh 5 later. */
    CHECK(fetch(s, (int32_t[]){5}, 1) == 1); /* evicts 4 (uses 1) */
    CHECK(!cached(s, 4) && cached(s, 5));
    /* Pinning: a request's own experts are never evicted, even if least used. */
    CHECK(fetch(s, (int32_t[]){5, 6}, 2) == 1); /* 5 is pinned (uses 1); evicts 1 (uses 2) */
    CHECK(cached(s, 5) && cached(s, 6) && cached(s, 0) && !cached(s, 1));
    CHECK(s->requests == 11 && s->hits == 4);
    sl_experts_free(s);

    /* LRU, 3 slots. */
    s = open_store(dir, 3, SL_CACHE_LRU);
    if (!s) {
        CHECK(0);
        return;
    }
    CHECK(fetch(s, (int32_t[]){0, 1}, 2) == 2);
    CHECK(fetch(s, (int32_t[]){2}, 1) == 1);
    CHECK(fetch(s, (int32_t[]){0}, 1) == 0); /* recency: 1 < 2 < 0 */
    CHECK(fetch(s, (int32_t[]){3}, 1) == 1); /* evicts 1 */
    CHECK(!cached(s, 1) && cached(s, 0) && cached(s, 2) && cached(s, 3));
    CHECK(fetch(s, (int32_t[]){2, 4, 5}, 3) == 2); /* 2 pinned: evicts 0, then 3 */
    CHECK(cached(s, 2) && cached(s, 4) && cached(s, 5) && !cached(s, 0) && !cached(s, 3));
    sl_experts_free(s);

    /* Too small a cache for one token is an error at load. */
    sl_expert_store *t = open_store(dir, 1, SL_CACHE_LFU);
    CHECK(t == NULL);
}

/* ---- broken packs ---- */

static int copy_pack(const char *from, const char *to) {
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    return system(cmd);
}

static void expect_fail(const char *dir, sl_experts_mode mode, const char *needle) {
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1, .experts = mode};
    sl_status st = sl_model_load(dir, &mp, &m, &err);
    CHECKF(st != SL_OK && strstr(err.msg, needle), "%s: '%s'", dir, err.msg);
    sl_model_free(m);
}

TEST(test_corrupt_packs) {
    const char *dir = packed("qwen2_gqa_untied", SL_QUANT_INT8);
    if (!dir) {
        CHECK(0);
        return;
    }
    sl_error err = {0};
    CHECK(sl_verify(dir, NULL, NULL, &err) == SL_OK);
    char bad[600], path[700];
    snprintf(bad, sizeof bad, "%s/broken", test_tmpdir());

    /* Tampered expert byte: loads (headers fine) but verify names the file. */
    CHECK(copy_pack(dir, bad) == 0);
    snprintf(path, sizeof path, "%s/experts-001.bin", bad);
    FILE *f = fopen(path, "r+b");
    fseek(f, 5000, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    err = (sl_error){0};
    CHECK(sl_verify(bad, NULL, NULL, &err) == SL_ERR_FORMAT);
    CHECKF(strstr(err.msg, "experts-001.bin") && strstr(err.msg, "SHA-256"), "%s", err.msg);

    /* Truncated experts file: every mode refuses it, naming the file. */
    CHECK(copy_pack(dir, bad) == 0);
    CHECK(truncate(path, 4096 + 100) == 0);
    expect_fail(bad, SL_EXPERTS_MAPPED, "experts-001.bin");
    expect_fail(bad, SL_EXPERTS_STREAM, "truncated");
    err = (sl_error){0};
    CHECK(sl_verify(bad, NULL, NULL, &err) != SL_OK && strstr(err.msg, "experts-001.bin"));

    /* Truncated core. */
    CHECK(copy_pack(dir, bad) == 0);
    snprintf(path, sizeof path, "%s/core.bin", bad);
    CHECK(truncate(path, 3000) == 0);
    expect_fail(bad, SL_EXPERTS_MAPPED, "core.bin");

    /* Corrupt core index: a tensor offset pointing past the end. The header checksum names
     * it first (format 2); a format-1 pack gets as far as the offset check. */
    CHECK(copy_pack(dir, bad) == 0);
    f = fopen(path, "r+b");
    fseek(f, 64 + 200, SEEK_SET); /* record 0, data offset */
    const uint8_t far[8] = {0, 0, 0, 0, 0, 0, 0, 0x10};
    fwrite(far, 1, 8, f);
    fclose(f);
    expect_fail(bad, SL_EXPERTS_MAPPED, "core.bin: header checksum mismatch");
    CHECK(copy_pack(dir, bad) == 0);
    err = (sl_error){0};
    CHECKF(sl_pack_convert(bad, 1, NULL, NULL, &err) == SL_OK, "%s", err.msg);
    f = fopen(path, "r+b");
    fseek(f, 64 + 200, SEEK_SET);
    fwrite(far, 1, 8, f);
    fclose(f);
    expect_fail(bad, SL_EXPERTS_MAPPED, "outside the file");

    /* Corrupt experts header (blob layout). */
    CHECK(copy_pack(dir, bad) == 0);
    snprintf(path, sizeof path, "%s/experts-000.bin", bad);
    f = fopen(path, "r+b");
    fseek(f, 64, SEEK_SET);
    fputc(0x7, f);
    fclose(f);
    expect_fail(bad, SL_EXPERTS_RESIDENT, "blob layout");

    /* Missing experts file, broken manifest. */
    CHECK(copy_pack(dir, bad) == 0);
    CHECK(unlink(path) == 0);
    expect_fail(bad, SL_EXPERTS_STREAM, "experts-000.bin");
    snprintf(path, sizeof path, "%s/manifest.json", bad);
    test_write_file(path, "{\"format\": \"sluice\", \"version\": 99}", 35);
    expect_fail(bad, SL_EXPERTS_MAPPED, "version 99");

    /* A file truncated after load: the streamed read fails cleanly, never computes. */
    CHECK(copy_pack(dir, bad) == 0);
    sl_model *m = NULL;
    sl_model_params mp = {.n_threads = 1, .experts = SL_EXPERTS_STREAM, .cache_experts = 2};
    err = (sl_error){0};
    CHECK(sl_model_load(bad, &mp, &m, &err) == SL_OK);
    snprintf(path, sizeof path, "%s/experts-000.bin", bad);
    CHECK(truncate(path, 4096) == 0);
    sl_session *s = NULL;
    sl_session_params sp = {.max_ctx = 4};
    int32_t ids[2] = {1, 2};
    if (m && sl_session_create(m, &sp, &s, &err) == SL_OK) {
        sl_status st = sl_session_forward(s, ids, 2, NULL, 0, &err);
        CHECKF(st == SL_ERR_IO && strstr(err.msg, "short read"), "%s", err.msg);
    }
    sl_session_free(s);
    sl_model_free(m);
}
