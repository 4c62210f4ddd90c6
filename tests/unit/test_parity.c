/*
 * Parity against transformers on every fixture under tests/fixtures/<case>/
 * (made by tools/make_fixtures.py): logits of one prefill pass within a
 * relative L2 error of 1e-4, argmax equal wherever the reference is decisive,
 * and the greedy continuation through the KV-cache path identical. Also the
 * invariants the engine promises: prefill, chunked prefill, token-by-token
 * decode and any thread count give bitwise-identical logits.
 */
#include <dirent.h>
#include <jansson.h>

#include "sluice.h"
#include "test.h"

typedef struct ref_case {
    int32_t *ids, *greedy;
    int32_t n_ids, n_greedy, vocab;
    float *logits; /* [n_ids, vocab] */
} ref_case;

static int32_t *json_ids(json_t *a, int32_t *n) {
    *n = (int32_t)json_array_size(a);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof(int32_t));
    for (int32_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static int load_ref(const char *dir, ref_case *r) {
    char path[600];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return -1;
    r->ids = json_ids(json_object_get(root, "ids"), &r->n_ids);
    r->greedy = json_ids(json_object_get(root, "greedy"), &r->n_greedy);
    r->vocab = (int32_t)json_integer_value(json_object_get(root, "vocab_size"));
    json_decref(root);
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    size_t n = (size_t)r->n_ids * (size_t)r->vocab;
    r->logits = malloc(n * sizeof(float));
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(r->logits, sizeof(float), n, f) : 0;
    if (f) fclose(f);
    return got == n ? 0 : -1;
}

static void free_ref(ref_case *r) {
    free(r->ids), free(r->greedy), free(r->logits);
}

/* All-position logits in one pass (max_batch = chunk; 0 = all at once). */
static float *run_logits(sl_model *m, const ref_case *r, int32_t chunk) {
    sl_session *s = NULL;
    sl_error err = {0};
    sl_session_params sp = {.max_ctx = r->n_ids + r->n_greedy,
                            .max_batch = chunk ? chunk : r->n_ids};
    float *out = malloc((size_t)r->n_ids * (size_t)r->vocab * sizeof(float));
    if (sl_session_create(m, &sp, &s, &err) ||
        sl_session_forward(s, r->ids, r->n_ids, out, 1, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        free(out);
        out = NULL;
    }
    sl_session_free(s);
    return out;
}

/* Row logits of batched decode steps against the prefill's (see check_case). */
static void check_batch(sl_model *m, const ref_case *r, const float *lg, const char *dir) {
    enum { NS = 3 };
    const int32_t start[NS] = {0, r->n_ids > 3 ? 3 : 0, r->n_ids > 7 ? 7 : 0};
    const size_t V = (size_t)r->vocab;
    sl_session *ss[NS] = {0};
    sl_batch *bt = NULL;
    sl_error err = {0};
    sl_session_params sp = {.max_ctx = r->n_ids + r->n_greedy};
    CHECK(sl_batch_create(m, NS, &bt, &err) == SL_OK);
    float *rows = malloc(NS * V * sizeof(float));
    for (int i = 0; i < NS; i++) {
        CHECK(sl_session_create(m, &sp, &ss[i], &err) == SL_OK);
        if (start[i]) CHECK(sl_session_forward(ss[i], r->ids, start[i], NULL, 0, &err) == SL_OK);
    }
    int same = 1, steps = 0;
    for (int step = 0; bt && rows; step++) {
        sl_session *row_s[NS];
        int32_t ids[NS], n = 0;
        for (int k = 0; k < NS; k++) {
            const int i = step % 2 ? NS - 1 - k : k; /* the order changes every step */
            const int32_t pos = sl_session_pos(ss[i]);
            if (pos >= r->n_ids) continue;
            row_s[n] = ss[i];
            ids[n++] = r->ids[pos];
        }
        if (n == 0) break;
        int32_t pos[NS];
        for (int k = 0; k < n; k++)
            pos[k] = sl_session_pos(row_s[k]);
        if (sl_batch_decode(bt, row_s, ids, n, rows, &err) != SL_OK) {
            CHECKF(0, "%s: batch step %d: %s", dir, step, err.msg);
            break;
        }
        steps++;
        for (int k = 0; k < n; k++) {
            same &= sl_session_pos(row_s[k]) == pos[k] + 1;
            same &= memcmp(rows + (size_t)k * V, lg + (size_t)pos[k] * V, V * sizeof(float)) == 0;
        }
    }
    CHECKF(same && steps == r->n_ids, "%s: batched decode rows differ from prefill rows", dir);
    /* a session twice, an id outside the vocabulary: refused, nothing advanced */
    if (bt && ss[0] && sl_session_pos(ss[0]) < sp.max_ctx) {
        sl_session *twice[2] = {ss[0], ss[0]};
        const int32_t p0 = sl_session_pos(ss[0]), ids[2] = {0, r->vocab};
        CHECK(sl_batch_decode(bt, twice, ids, 2, rows, &err) == SL_ERR_ARG);
        CHECK(sl_batch_decode(bt, twice, ids + 1, 1, rows, &err) == SL_ERR_ARG);
        CHECK(strstr(err.msg, "vocabulary") != NULL);
        CHECK(sl_session_pos(ss[0]) == p0);
    }
    for (int i = 0; i < NS; i++)
        sl_session_free(ss[i]);
    sl_batch_free(bt);
    free(rows);
}

static void check_case(const char *dir) {
    ref_case r = {0};
    if (load_ref(dir, &r)) {
        CHECKF(0, "%s: cannot read ref.json / logits.f32", dir);
        free_ref(&r);
        return;
    }
    sl_model *m = NULL, *m1 = NULL;
    sl_error err = {0};
    /* m1: one thread, run as a device backend (weights copied, experts through the device
     * cache and its no-sync fused path): the same bits as m all the same. */
    sl_model_params mp = {.n_threads = 2}, mp1 = {.n_threads = 1, .backend = SL_BACKEND_CPU_DEVICE};
    if (sl_model_load(dir, &mp, &m, &err) || sl_model_load(dir, &mp1, &m1, &err)) {
        CHECKF(0, "%s: %s", dir, err.msg);
        free_ref(&r);
        sl_model_free(m);
        return;
    }
    sl_model_info info;
    sl_model_get_info(m, &info);
    CHECK(info.vocab_size == r.vocab);
    const size_t V = (size_t)r.vocab, n = (size_t)r.n_ids * V;

    /* 1. Prefill logits against transformers. */
    float *lg = run_logits(m, &r, 0);
    CHECK(lg != NULL);
    if (!lg) goto done;
    int bad_argmax = 0;
    for (int32_t t = 0; t < r.n_ids; t++) {
        const float *ref = r.logits + (size_t)t * V;
        int32_t a = sl_argmax(ref, r.vocab);
        float second = -INFINITY;
        for (int32_t v = 0; v < r.vocab; v++)
            if (v != a && ref[v] > second) second = ref[v];
        if (ref[a] - second > 1e-3f && sl_argmax(lg + (size_t)t * V, r.vocab) != a) bad_argmax++;
    }
    const double rel = test_rel_l2(lg, r.logits, n);
    printf("  %-28s rel L2 %.2e, argmax mismatches %d\n", strrchr(dir, '/') + 1, rel, bad_argmax);
    CHECKF(rel <= 1e-4, "%s: relative L2 error %g", dir, rel);
    CHECK(bad_argmax == 0);

    /* 2. Chunked prefill (3 tokens a chunk), and one thread as a device: the same bits. */
    float *lg3 = run_logits(m, &r, 3), *lg1 = run_logits(m1, &r, 0);
    CHECK(lg3 && memcmp(lg3, lg, n * sizeof(float)) == 0);
    CHECK(lg1 && memcmp(lg1, lg, n * sizeof(float)) == 0);
    free(lg3), free(lg1);

    /* 3. Token by token through the KV cache, as the CPU and as a device: the same bits as
     * the prefill rows. */
    sl_session *s = NULL, *s1 = NULL;
    sl_session_params sp = {.max_ctx = r.n_ids + r.n_greedy};
    CHECK(sl_session_create(m, &sp, &s, &err) == SL_OK);
    CHECK(sl_session_create(m1, &sp, &s1, &err) == SL_OK);
    float *row = malloc(V * sizeof(float));
    int same = 1, same1 = 1;
    for (int32_t t = 0; t < r.n_ids && s && s1; t++) {
        CHECK(sl_session_forward(s, &r.ids[t], 1, row, 0, &err) == SL_OK);
        same &= memcmp(row, lg + (size_t)t * V, V * sizeof(float)) == 0;
        CHECK(sl_session_forward(s1, &r.ids[t], 1, row, 0, &err) == SL_OK);
        same1 &= memcmp(row, lg + (size_t)t * V, V * sizeof(float)) == 0;
    }
    CHECKF(same, "%s: decode logits differ from prefill logits", dir);
    CHECKF(same1, "%s: device-path decode logits differ from prefill logits", dir);
    sl_session_free(s1);

    /* 3b. Batched decode: sequences at different positions (from 0, 3 and 7 prefilled tokens)
     * step together, the batch shrinking as each reaches the prompt's end and its rows in a
     * changing order; each row the bits of its position's prefill row, on the CPU and as a
     * device. */
    check_batch(m, &r, lg, dir);
    check_batch(m1, &r, lg, dir);

    /* 4. Greedy continuation, decoding from the KV cache after a prefill. */
    sl_session_reset(s);
    CHECK(sl_session_forward(s, r.ids, r.n_ids, row, 0, &err) == SL_OK);
    int32_t *gen = malloc((size_t)r.n_greedy * sizeof(int32_t));
    for (int32_t i = 0; i < r.n_greedy; i++) {
        gen[i] = sl_argmax(row, r.vocab);
        if (i + 1 < r.n_greedy) CHECK(sl_session_forward(s, &gen[i], 1, row, 0, &err) == SL_OK);
    }
    CHECKF(memcmp(gen, r.greedy, (size_t)r.n_greedy * sizeof(int32_t)) == 0,
           "%s: greedy continuation differs (first: ours %d, ref %d)", dir, gen[0], r.greedy[0]);
    /* 5. The context limit is an error, not an overflow. */
    int32_t extra[2] = {0, 0};
    err = (sl_error){0};
    CHECK(sl_session_forward(s, extra, 2, NULL, 0, &err) == SL_ERR_ARG);
    CHECK(strstr(err.msg, "context full") != NULL);
    free(gen);
    free(row);
    sl_session_free(s);
    free(lg);
done:
    sl_model_free(m);
    sl_model_free(m1);
    free_ref(&r);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

TEST(test_parity_with_transformers) {
    DIR *d = opendir(test_fixtures);
    CHECKF(d != NULL, "no fixtures directory %s", test_fixtures);
    if (!d) return;
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s/ref.json", test_fixtures, e->d_name);
        FILE *f = fopen(p, "r");
        if (f) {
            fclose(f);
            names[n++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), cmp_name);
    CHECKF(n >= 6, "expected at least 6 fixture cases, found %d", n);
    for (int i = 0; i < n; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", test_fixtures, names[i]);
        check_case(p);
        free(names[i]);
    }
}

/* Batched decode on the families of tests/fixtures/fam (their parity is fam_test.sh's): each
 * row the bits of its prefill row, MLA, chunked and sliding attention, sinks included, and
 * those families that run rows one by one. */
TEST(test_batch_families) {
    char fam[600];
    snprintf(fam, sizeof fam, "%s/fam", test_fixtures);
    DIR *d = opendir(fam);
    CHECKF(d != NULL, "no fixtures directory %s", fam);
    if (!d) return;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        char p[900];
        snprintf(p, sizeof p, "%s/%s", fam, e->d_name);
        ref_case r = {0};
        if (e->d_name[0] == '.' || load_ref(p, &r)) {
            free_ref(&r);
            continue;
        }
        sl_model *m = NULL;
        sl_error err = {0};
        sl_model_params mp = {.n_threads = 2};
        if (sl_model_load(p, &mp, &m, &err)) {
            CHECKF(0, "%s: %s", p, err.msg);
        } else {
            float *lg = run_logits(m, &r, 0);
            CHECK(lg != NULL);
            if (lg) check_batch(m, &r, lg, p);
            free(lg);
            n++;
        }
        sl_model_free(m);
        free_ref(&r);
    }
    closedir(d);
    CHECKF(n >= 8, "expected at least 8 family cases, found %d", n);
}

TEST(test_bad_token_ids) {
    char p[600];
    snprintf(p, sizeof p, "%s/qwen3_gqa_untied", test_fixtures);
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1};
    if (sl_model_load(p, &mp, &m, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    sl_session *s = NULL;
    sl_session_params sp = {.max_ctx = 8};
    CHECK(sl_session_create(m, &sp, &s, &err) == SL_OK);
    int32_t ids[2] = {1, 1 << 30};
    CHECK(sl_session_forward(s, ids, 2, NULL, 0, &err) == SL_ERR_ARG);
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    CHECK(sl_session_pos(s) == 0);
    sl_session_free(s);
    sl_model_free(m);
}
