/*
 * Qwen4-Exp beyond parity (test_parity covers logits, greedy decode and
 * prefill/chunk/token-by-token identity on every fixture):
 *   - the PLE hash: constants derived from the config equal the buffers the
 *     checkpoint ships, and the table rows of every prompt token equal the ones
 *     transformers looked up (ref.json "ple_ngram_ids"), EOS resets included;
 *   - packs: bf16 gives the checkpoint's bits whether n-gram rows come from the
 *     mapping or from pread (streamed), with the expert cache at any size;
 *     int8 stays close; PLE rows are counted in the statistics;
 *   - a truncated n-gram table file is refused with its name.
 */
#include <jansson.h>
#include <unistd.h>

#include "families/qwen4_exp/qwen4_exp.h"
#include "test.h"

static const char *const cases[] = {"qwen4_exp_a", "qwen4_exp_b", "qwen4_exp_vlm"};
#define N_CASES (sizeof cases / sizeof cases[0])

static json_t *load_ref(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    json_error_t je;
    return json_load_file(path, 0, &je);
}

TEST(test_qwen4_ple_hash) {
    for (size_t ci = 0; ci < N_CASES; ci++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures, cases[ci]);
        json_t *ref = load_ref(dir);
        CHECKF(ref != NULL, "%s: no ref.json", cases[ci]);
        sl_model_params mp = {.n_threads = 1};
        sl_model *m = NULL;
        sl_session *s = NULL;
        sl_error err = {0};
        CHECKF(sl_model_load(dir, &mp, &m, &err) == SL_OK, "%s: %s", cases[ci], err.msg);
        if (!ref || !m) {
            json_decref(ref);
            sl_model_free(m);
            continue;
        }
        const sl_config *c = &m->cfg;
        const q4_config *qc = q4_cfg(m);
        json_t *ids = json_object_get(ref, "ids");
        const int32_t T = (int32_t)json_array_size(ids), G = q4_ngram_heads(qc);
        sl_session_params sp = {.max_ctx = T + 4};
        CHECK(sl_session_create(m, &sp, &s, &err) == SL_OK);
        int32_t *tok = malloc((size_t)T * sizeof(int32_t));
        for (int32_t t = 0; t < T; t++)
            tok[t] = (int32_t)json_integer_value(json_array_get(ids, (size_t)t));
        /* history in two calls, as a chunked prefill would build it */
        q4_ple_history(s, tok, 5);
        int32_t *hist = malloc((size_t)T * (size_t)qc->ngram_size * sizeof(int32_t));
        memcpy(hist, q4_ses(s)->ple_hist, 5 * (size_t)qc->ngram_size * sizeof(int32_t));
        q4_ple_history(s, tok + 5, T - 5);
        memcpy(hist + 5 * qc->ngram_size, q4_ses(s)->ple_hist,
               (size_t)(T - 5) * (size_t)qc->ngram_size * sizeof(int32_t));
        int checked = 0;
        for (int32_t l = 0; l < c->n_layers; l++) {
            const sl_ple *P = q4_mod(m)->layers[l].ple;
            if (!P) continue;
            char key[16];
            snprintf(key, sizeof key, "%d", l);
            /* derived constants = the shipped buffers */
            uint64_t mult[SL_NGRAM_MAX];
            int64_t vocab[64], offset[64];
            q4_ple_derive(c, P->index, mult, vocab, offset);
            json_t *buf = json_object_get(json_object_get(ref, "ple_buffers"), key);
            json_t *jm = json_object_get(buf, "layer_multipliers");
            json_t *jv = json_object_get(buf, "ngram_heads_vocab_sizes");
            json_t *jo = json_object_get(buf, "ngram_heads_offsets");
            CHECKF(json_array_size(jm) == (size_t)qc->ngram_size &&
                       json_array_size(jv) == (size_t)G,
                   "%s layer %d: no ple_buffers in ref.json", cases[ci], l);
            for (int32_t i = 0; i < qc->ngram_size && jm; i++)
                CHECKF(mult[i] == (uint64_t)json_integer_value(json_array_get(jm, (size_t)i)),
                       "%s layer %d: multiplier %d", cases[ci], l, i);
            for (int32_t g = 0; g < G && jv && jo; g++)
                CHECKF(vocab[g] == json_integer_value(json_array_get(jv, (size_t)g)) &&
                           offset[g] == json_integer_value(json_array_get(jo, (size_t)g)),
                       "%s layer %d: head %d vocabulary/offset", cases[ci], l, g);
            /* table rows of every prompt token */
            json_t *rows = json_object_get(json_object_get(ref, "ple_ngram_ids"), key);
            CHECKF(json_array_size(rows) == (size_t)T, "%s layer %d: no ple_ngram_ids", cases[ci],
                   l);
            for (int32_t t = 0; t < T && rows; t++) {
                int64_t got[64];
                q4_ple_rows(qc, P, hist + (size_t)t * (size_t)qc->ngram_size, got);
                json_t *want = json_array_get(rows, (size_t)t);
                for (int32_t g = 0; g < G; g++)
                    CHECKF(got[g] == json_integer_value(json_array_get(want, (size_t)g)),
                           "%s layer %d token %d head %d: row %lld, transformers %lld", cases[ci],
                           l, t, g, (long long)got[g],
                           (long long)json_integer_value(json_array_get(want, (size_t)g)));
            }
            checked++;
        }
        CHECKF(checked == qc->n_ple_layers && checked > 0, "%s: PLE layers checked %d", cases[ci],
               checked);
        free(tok);
        free(hist);
        sl_session_free(s);
        sl_model_free(m);
        json_decref(ref);
    }
}

static const int32_t ids[] = {5, 84, 95, 75, 5, 172, 45, 117, 8, 87, 7, 7, 33, 120, 14, 91, 5, 60};
#define N_IDS ((int32_t)(sizeof ids / sizeof ids[0]))

TEST(test_qwen4_pack_bitwise) {
    for (size_t ci = 0; ci < N_CASES; ci++) {
        char src[512], dst[600];
        snprintf(src, sizeof src, "%s/%s", test_fixtures, cases[ci]);
        int32_t V = 0;
        sl_model_params mp = {.n_threads = 2};
        float *ref = test_logits(src, &mp, ids, N_IDS, N_IDS, NULL, &V);
        CHECK(ref != NULL);
        for (int q = SL_QUANT_BF16; ref && q <= SL_QUANT_INT8; q++) {
            snprintf(dst, sizeof dst, "%s/q4-%s-%d", test_tmpdir(), cases[ci], q);
            sl_pack_params pp = {.quant = (sl_quant)q};
            sl_error err = {0};
            CHECKF(sl_pack(src, dst, &pp, &err) == SL_OK, "%s: %s", cases[ci], err.msg);
            for (int mode = 0; mode < 3; mode++) {
                const sl_experts_mode modes[3] = {SL_EXPERTS_MAPPED, SL_EXPERTS_RESIDENT,
                                                  SL_EXPERTS_STREAM};
                mp.experts = modes[mode];
                mp.cache_experts = mode == 2 ? 3 : 0;
                sl_stats st;
                float *got = test_logits(dst, &mp, ids, N_IDS, 4, &st, &V);
                CHECKF(got != NULL, "%s quant %d mode %d", cases[ci], q, mode);
                CHECKF(!got || st.ple_rows > 0, "%s: no PLE rows counted", cases[ci]);
                if (got && q == SL_QUANT_BF16)
                    CHECKF(memcmp(got, ref, (size_t)N_IDS * (size_t)V * sizeof(float)) == 0,
                           "%s: bf16 pack (mode %d) differs from the checkpoint", cases[ci], mode);
                if (got && q == SL_QUANT_INT8) {
                    const double e = test_rel_l2(got, ref, (size_t)N_IDS * (size_t)V);
                    CHECKF(e <= 0.15, "%s: int8 rel L2 %g", cases[ci], e);
                }
                free(got);
            }
            mp = (sl_model_params){.n_threads = 2};
        }
        free(ref);
    }
}

TEST(test_qwen4_truncated_ngram_table) {
    char src[512], dst[600], path[700];
    snprintf(src, sizeof src, "%s/qwen4_exp_a", test_fixtures);
    snprintf(dst, sizeof dst, "%s/q4-trunc", test_tmpdir());
    sl_pack_params pp = {.quant = SL_QUANT_BF16};
    sl_error err = {0};
    CHECK(sl_pack(src, dst, &pp, &err) == SL_OK);
    snprintf(path, sizeof path, "%s/ngram-001.bin", dst);
    CHECK(truncate(path, 4096 + 100) == 0);
    sl_model *m = NULL;
    sl_model_params mp = {.n_threads = 1};
    CHECK(sl_model_load(dst, &mp, &m, &err) != SL_OK);
    CHECKF(strstr(err.msg, "ngram-001.bin") && strstr(err.msg, "truncated"), "message: %s",
           err.msg);
    sl_model_free(m);
}

/* QSA block choice: the blocks torch.topk takes, ties included, on the 1,600 cases of
 * tests/fixtures/qsa_topk.json (tools/make_topk_ties.py: scores with many equal values, on
 * both of torch's paths, nth_element and partial_sort). */
TEST(test_qwen4_qsa_pick_ties) {
    char path[600];
    snprintf(path, sizeof path, "%s/qsa_topk.json", test_fixtures);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECKF(root != NULL, "%s: %s", path, je.text);
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) >= 1000);
    size_t i, bad = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        const int32_t k = (int32_t)json_integer_value(json_array_get(cs, 0));
        json_t *jv = json_array_get(cs, 1), *jsel = json_array_get(cs, 2);
        const int32_t n = (int32_t)json_array_size(jv);
        float *sc = malloc((size_t)n * sizeof *sc);
        int32_t *order = malloc((size_t)n * sizeof *order);
        uint8_t *taken = malloc((size_t)n);
        for (int32_t j = 0; j < n; j++)
            sc[j] = (float)json_integer_value(json_array_get(jv, (size_t)j));
        q4_qsa_pick(sc, n, k, order, taken);
        int same = 1, count = 0;
        for (int32_t j = 0; j < n; j++)
            count += taken[j];
        for (size_t j = 0; j < json_array_size(jsel); j++)
            same &= taken[json_integer_value(json_array_get(jsel, j))];
        if (!same || count != k) bad++;
        free(sc), free(order), free(taken);
    }
    CHECKF(bad == 0, "%zu of %zu block choices differ from torch.topk's", bad,
           json_array_size(cases));
    json_decref(root);
}
