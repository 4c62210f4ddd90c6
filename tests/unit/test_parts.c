/*
 * The pipeline split (issue 31) on logical partitions: every fixture, split into 2 and 3
 * partitions (CPU backends of their own, or as devices with
 * their own weights and expert caches), gives the unsplit model's bits: prefill in chunks,
 * token-by-token decode, batched decode of sequences at different positions, and a rewind.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/ops.h"
#include "sluice.h"
#include "test.h"

/* The prompt ids of a fixture's ref.json into ids (at most cap), their count; 0 if none. */
static int32_t prompt_ids(const char *dir, int32_t *ids, int32_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return 0;
    json_t *a = json_object_get(root, "ids");
    int32_t n = 0;
    for (; n < cap && (size_t)n < json_array_size(a); n++)
        ids[n] = (int32_t)json_integer_value(json_array_get(a, (size_t)n));
    json_decref(root);
    return n;
}

/* Decode of every prompt token one at a time, then two sessions stepping through the prompt
 * together in one batch from positions 0 and 2, then a rewind by 2 and those tokens again:
 * each row the bits of ref's row of its position. */
static int same_steps(sl_model *m, const int32_t *ids, int32_t n, const float *ref, int32_t V) {
    sl_error err = {0};
    const size_t Vs = (size_t)V;
    sl_session_params sp = {.max_ctx = n};
    sl_session *s = NULL, *s2 = NULL;
    sl_batch *bt = NULL;
    float *row = malloc(2 * Vs * sizeof(float));
    int ok = row && !sl_session_create(m, &sp, &s, &err) && !sl_session_create(m, &sp, &s2, &err) &&
             !sl_batch_create(m, 2, &bt, &err);
    for (int32_t t = 0; ok && t < n; t++)
        ok = !sl_session_forward(s, &ids[t], 1, row, 0, &err) &&
             !memcmp(row, ref + (size_t)t * Vs, Vs * sizeof(float));
    /* rewound by two (unless recurrent state forbids it): the same rows again */
    if (ok && !sl_session_rewind(s, n - 2))
        for (int32_t t = n - 2; ok && t < n; t++)
            ok = !sl_session_forward(s, &ids[t], 1, row, 0, &err) &&
                 !memcmp(row, ref + (size_t)t * Vs, Vs * sizeof(float));
    sl_session_reset(s);
    if (ok) ok = !sl_session_forward(s2, ids, 2, NULL, 0, &err);
    while (ok && sl_session_pos(s) < n) {
        sl_session *rows[2] = {s, s2};
        const int32_t k = sl_session_pos(s2) < n ? 2 : 1;
        const int32_t p[2] = {sl_session_pos(s), sl_session_pos(s2)};
        const int32_t step[2] = {ids[p[0]], k > 1 ? ids[p[1]] : 0};
        ok = !sl_batch_decode(bt, rows, step, k, row, &err);
        for (int32_t i = 0; ok && i < k; i++)
            ok = !memcmp(row + (size_t)i * Vs, ref + (size_t)p[i] * Vs, Vs * sizeof(float));
    }
    if (err.code) fprintf(stderr, "  %s\n", err.msg);
    sl_batch_free(bt);
    sl_session_free(s);
    sl_session_free(s2);
    free(row);
    return ok;
}

static int n_split; /* fixtures checked split */

/* One fixture: P = 1's prefill logits against 2 and 3 partitions in each variant. */
static void check_split(const char *dir) {
    int32_t ids[64];
    const int32_t n = prompt_ids(dir, ids, 64);
    if (n < 4) return;
    sl_error err = {0};
    sl_model *m = NULL;
    sl_model_params mp = {.n_threads = 2};
    if (sl_model_load(dir, &mp, &m, &err)) {
        CHECKF(0, "%s: %s", dir, err.msg);
        return;
    }
    sl_model_info info;
    sl_model_get_info(m, &info);
    const int32_t L = info.n_layers, V = info.vocab_size, k = info.n_experts_used;
    sl_model_free(m);
    int32_t vocab;
    float *ref = test_logits(dir, &mp, ids, n, n, NULL, &vocab);
    CHECK(ref != NULL);
    n_split++;
    /* each variant: CPU, experts mapped; streamed through top-k slots; a device with a cache
     * of top-k expert slots a layer on each partition */
    const sl_model_params variants[3] = {
        {.n_threads = 2},
        {.n_threads = 2, .experts = SL_EXPERTS_STREAM, .cache_experts = k > 1 ? k : 1},
        {.n_threads = 1, .backend = SL_BACKEND_CPU_DEVICE, .gpu_experts = k > 1 ? k : 1},
    };
    for (int32_t P = 2; ref && P <= (L < 3 ? L : 3); P++)
        for (int v = 0; v < 3; v++) {
            sl_model_params p = variants[v];
            if (info.n_experts == 0 && v == 1) continue;
            p.n_parts = P;
            float *lg = test_logits(dir, &p, ids, n, 3, NULL, &vocab);
            CHECKF(lg && !memcmp(lg, ref, (size_t)n * (size_t)V * sizeof(float)),
                   "%s: %d partitions, variant %d: prefill logits differ", dir, P, v);
            free(lg);
            if (sl_model_load(dir, &p, &m, &err)) {
                CHECKF(0, "%s: %s", dir, err.msg);
                continue;
            }
            sl_model_get_info(m, &info);
            CHECK(info.n_parts == P && info.split && strstr(info.split, "layers 0-"));
            CHECKF(same_steps(m, ids, n, ref, V), "%s: %d partitions, variant %d: decode differs",
                   dir, P, v);
            sl_model_free(m);
        }
    free(ref);
}

/* Every case of fixtures directory root (tests/fixtures, tests/fixtures/fam). */
static void each_case(const char *root, void (*fn)(const char *dir)) {
    DIR *d = opendir(root);
    CHECKF(d != NULL, "no fixtures directory %s", root);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[600], r[700];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        snprintf(r, sizeof r, "%s/ref.json", p);
        FILE *f = fopen(r, "r");
        if (!f) continue;
        fclose(f);
        fn(p);
    }
    if (d) closedir(d);
}

/* The families whose own forward pass does not run split are refused, naming it. */
static void check_refusals(const char *dir) {
    sl_error err = {0};
    sl_model *m = NULL;
    sl_model_params p = {.n_threads = 1, .n_parts = 2};
    const sl_status st = sl_model_load(dir, &p, &m, &err);
    if (st == SL_OK) {
        sl_model_free(m);
        check_split(dir);
        return;
    }
    CHECKF(st == SL_ERR_UNSUPPORTED && strstr(err.msg, "its forward pass is its own"), "%s: %s",
           dir, err.msg);
}

TEST(test_parts_bits) {
    each_case(test_fixtures, check_refusals);
    char fam[600];
    snprintf(fam, sizeof fam, "%s/fam", test_fixtures);
    each_case(fam, check_refusals);
    /* every fixture: all families run split */
    CHECKF(n_split >= 32, "only %d fixtures split", n_split);
}

TEST(test_parts_errors) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/qwen3_gqa_untied", test_fixtures); /* 3 layers */
    sl_error err = {0};
    sl_model *m = NULL;
    sl_model_params p = {.n_threads = 1, .n_parts = 4};
    CHECK(sl_model_load(dir, &p, &m, &err) == SL_ERR_ARG && !m);
    CHECK(strstr(err.msg, "4 partitions of a model of 3 layers: give 1 to 3"));
    p.n_parts = -1;
    err = (sl_error){0};
    CHECK(sl_model_load(dir, &p, &m, &err) == SL_ERR_ARG && !m);
    /* one partition is the unsplit model */
    p.n_parts = 1;
    CHECK(sl_model_load(dir, &p, &m, &err) == SL_OK && m);
    sl_model_info info;
    if (m) sl_model_get_info(m, &info);
    CHECK(m && info.n_parts == 1 && !info.split);
    sl_model_free(m);
}

/* sl_backend_transfer between host-memory and device backends (CPU_DEVICE: memory of its own
 * as far as the callers know), through a stage smaller than the bytes: every byte arrives. */
TEST(test_parts_transfer) {
    sl_backend h, d1, d2;
    sl_backend_cpu_init(&h, 1, SL_ISA_SCALAR);
    sl_backend_cpu_init(&d1, 1, SL_ISA_SCALAR);
    sl_backend_cpu_init(&d2, 1, SL_ISA_SCALAR);
    d1.device = d2.device = 1;
    enum { N = 1000 };
    float src[N], mid[N], dst[N], back[N], stage[7];
    for (int i = 0; i < N; i++)
        src[i] = (float)i * 0.5f - 3.0f;
    float *a = d1.ops->alloc(&d1, sizeof src), *b = d2.ops->alloc(&d2, sizeof src);
    memset(dst, 0xff, sizeof dst), memset(back, 0xff, sizeof back);
    sl_backend_transfer(&h, mid, &h, src, sizeof src, stage, sizeof stage); /* host, host */
    sl_backend_transfer(&d1, a, &h, mid, sizeof src, stage, sizeof stage);  /* to a device */
    sl_backend_transfer(&d2, b, &d1, a, sizeof src, stage, sizeof stage);   /* device, device */
    sl_backend_transfer(&h, dst, &d2, b, sizeof src, stage, sizeof stage);  /* back */
    sl_backend_transfer(&h, back, &d2, b, 3 * sizeof(float), stage, sizeof stage); /* a part */
    CHECK(!memcmp(src, dst, sizeof src));
    CHECK(!memcmp(src, back, 3 * sizeof(float)) && isnan(back[3]));
    d1.ops->release(&d1, a);
    d2.ops->release(&d2, b);
}

/* Gemma 4 with its last two layers sharing earlier layers' K/V (num_kv_shared_layers = 2, on
 * gemma4_a's weights): each boundary relays the shared caches' new rows, through partitions
 * that only pass them on (4 partitions of 4 layers), on the CPU and as devices. */
TEST(test_parts_gemma4_kv_shared) {
    char src[600], dir[700], path[800], from[1400];
    snprintf(src, sizeof src, "%s/fam/gemma4_a", test_fixtures);
    snprintf(dir, sizeof dir, "%s/gemma4_kv_shared", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    static const char *const files[] = {"model.safetensors", "ref.json", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *abs = realpath(src, NULL);
        snprintf(from, sizeof from, "%s/%s", abs ? abs : src, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        free(abs);
        if (access(from, F_OK) == 0) CHECK(symlink(from, path) == 0);
    }
    snprintf(path, sizeof path, "%s/config.json", src);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    CHECK(c != NULL);
    if (!c) return;
    json_t *t = json_object_get(c, "text_config");
    json_object_set_new(t ? t : c, "num_kv_shared_layers", json_integer(2));
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(json_dump_file(c, path, 0) == 0);
    json_decref(c);

    int32_t ids[64];
    const int32_t n = prompt_ids(dir, ids, 64);
    int32_t V;
    const sl_model_params one = {.n_threads = 2};
    float *ref = test_logits(dir, &one, ids, n, n, NULL, &V);
    CHECK(ref != NULL && n >= 4);
    for (int32_t P = 2; ref && P <= 4; P++)
        for (int dev = 0; dev < 2; dev++) {
            const sl_model_params p = {.n_threads = 2,
                                       .n_parts = P,
                                       .backend = dev ? SL_BACKEND_CPU_DEVICE : SL_BACKEND_CPU};
            float *lg = test_logits(dir, &p, ids, n, 3, NULL, &V);
            CHECKF(lg && !memcmp(lg, ref, (size_t)n * (size_t)V * sizeof(float)),
                   "%d partitions%s: prefill logits differ", P, dev ? " (device)" : "");
            free(lg);
            sl_model *m = NULL;
            sl_error err = {0};
            CHECK(sl_model_load(dir, &p, &m, &err) == SL_OK);
            CHECKF(m && same_steps(m, ids, n, ref, V), "%d partitions%s: decode differs", P,
                   dev ? " (device)" : "");
            sl_model_free(m);
        }
    free(ref);
}
