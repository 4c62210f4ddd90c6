/*
 * Issue 24: non-finite logits or activations are an error, never ids or text. Checkpoints
 * made from the fixtures with one tensor overwritten by Inf or a huge value (the config stays
 * valid: config.json's own bad numbers are refused at load, test_config_parse) must make
 * sl_session_forward fail with SL_ERR_NUMERIC naming the first bad position, on every family,
 * on the backend run the way a GPU backend is (logits through backend memory), and through
 * packs whose int8/int4 kernels then see Inf activations (under the sanitizer build too: no
 * undefined behaviour on the way). Also: the SIMD finite check agrees with its reference.
 */
#include <float.h>
#include <jansson.h>

#include "core/common.h"
#include "kernels/ops.h"
#include "sluice.h"
#include "test.h"

/* ---- the finite check itself ------------------------------------------------------------ */

static size_t first_nonfinite_ref(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Every ISA on odd lengths (arrays of exactly n, so ASan sees any read past the end), each
 * kind of non-finite value at the edges of the SIMD blocks, two at once (the first wins), and
 * the finite extremes (never reported). */
TEST(test_first_nonfinite) {
    const size_t ns[] = {0, 1, 5, 63, 64, 65, 127, 128, 129, 200, 2048 + 13};
    const float bad[] = {
        INFINITY, -INFINITY, NAN, -NAN, from_bits(0x7f800001u), from_bits(0xffc00001u)};
    const float good[] = {FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, -0.0f, 1.0f};
    for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++)
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const size_t n = ns[in];
            float *x = malloc(sizeof(float) * (n ? n : 1));
            for (size_t i = 0; i < n; i++)
                x[i] = good[i % 6] * (float)(i % 3 ? 1 : -1);
            CHECKF(sl_first_nonfinite((sl_isa)isa, x, n) == n, "%s n=%zu all finite",
                   sl_isa_name((sl_isa)isa), n);
            const size_t at[] = {0, 1, 31, 63, 64, 65, 127, 128, n / 2, n - 1};
            for (size_t ia = 0; ia < sizeof at / sizeof at[0]; ia++)
                for (size_t ib = 0; ib < sizeof bad / sizeof bad[0]; ib++) {
                    const size_t p = at[ia];
                    if (p >= n) continue;
                    const float keep = x[p];
                    x[p] = bad[ib];
                    size_t q = p + 7 < n ? p + 7 : n; /* a second one after it */
                    float keep2 = 0;
                    if (q < n) keep2 = x[q], x[q] = bad[(ib + 1) % 6];
                    const size_t got = sl_first_nonfinite((sl_isa)isa, x, n);
                    CHECKF(got == p && got == first_nonfinite_ref(x, n),
                           "%s n=%zu at %zu (%g): got %zu", sl_isa_name((sl_isa)isa), n, p, bad[ib],
                           got);
                    x[p] = keep;
                    if (q < n) x[q] = keep2;
                }
            free(x);
        }
}

/* ---- broken checkpoints ----------------------------------------------------------------- */

/* A copy of fixture `name` in the temporary directory, as `as`; its path. */
static const char *copy_fixture(const char *name, const char *as, char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", test_tmpdir(), as);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/%s' '%s'", dir, test_fixtures, name, dir);
    return system(cmd) == 0 ? dir : NULL;
}

/* Sets elements [e0, e1) of tensor `tensor` (BF16 or F32) of dir/model.safetensors to v, in
 * place: the header stays as it is. Returns 0 on success. */
static int poke_tensor(const char *dir, const char *tensor, int64_t e0, int64_t e1, float v) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    uint64_t hlen = 0;
    int rc = -1;
    char *hdr = NULL;
    json_t *root = NULL;
    if (fread(&hlen, 8, 1, f) != 1 || hlen > (1u << 24) || !(hdr = calloc(1, hlen + 1)) ||
        fread(hdr, 1, hlen, f) != hlen || !(root = json_loads(hdr, 0, NULL)))
        goto done;
    json_t *t = json_object_get(root, tensor);
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    const int64_t off = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    if (!dt) goto done;
    const int bf16 = strcmp(dt, "BF16") == 0;
    if (!bf16 && strcmp(dt, "F32") != 0) goto done;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint16_t h = (uint16_t)(u >> 16); /* v is chosen exact in bf16 */
    const size_t es = bf16 ? 2 : 4;
    if (fseek(f, (long)(8 + hlen + (uint64_t)off + (uint64_t)e0 * es), SEEK_SET)) goto done;
    for (int64_t e = e0; e < e1; e++)
        if (fwrite(bf16 ? (const void *)&h : (const void *)&v, es, 1, f) != 1) goto done;
    rc = 0;
done:
    json_decref(root);
    free(hdr);
    if (fclose(f)) rc = -1;
    return rc;
}

/* Forward of ids through a fresh session; the status, err filled. */
static sl_status run_ids(const char *dir, sl_backend_kind be, const int32_t *ids, int32_t n,
                         int32_t batch, int all, int with_logits, sl_error *err) {
    sl_error_clear(err);
    sl_model_params mp = {.n_threads = 2, .backend = be};
    sl_model *m = NULL;
    sl_session *s = NULL;
    sl_status st = sl_model_load(dir, &mp, &m, err);
    sl_session_params sp = {.max_ctx = 64, .max_batch = batch};
    if (!st) st = sl_session_create(m, &sp, &s, err);
    float *lg = NULL;
    if (!st) {
        sl_model_info info;
        sl_model_get_info(m, &info);
        lg = malloc(sizeof(float) * (size_t)n * (size_t)info.vocab_size);
        st = sl_session_forward(s, ids, n, with_logits ? lg : NULL, all, err);
        CHECKF(sl_session_pos(s) <= n, "pos %d", sl_session_pos(s));
    }
    free(lg);
    sl_session_free(s);
    sl_model_free(m);
    return st;
}

#define CHECK_NUMERIC(st, err, needle)                                                             \
    CHECKF((st) == SL_ERR_NUMERIC && strstr((err).msg, needle), "status %d: '%s' (want '%s')",     \
           (int)(st), (err).msg, needle)

/* Token 5's embedding row is Inf: positions before it are fine, it and every later one
 * (which attend to it) are NaN. The error names position 2, whichever way the call asks for
 * logits, and the session keeps what came before: an attention-only model goes on. */
TEST(test_numeric_embedding_inf) {
    char dir[600];
    CHECK(copy_fixture("qwen3_gqa_untied", "inf-embed", dir, sizeof dir) != NULL);
    CHECK(poke_tensor(dir, "model.embed_tokens.weight", 5 * 48, 6 * 48, INFINITY) == 0);
    const int32_t ids[] = {1, 2, 5, 3};
    const sl_backend_kind bes[] = {SL_BACKEND_CPU, SL_BACKEND_CPU_DEVICE};
    for (int b = 0; b < 2; b++) {
        sl_error err = {0};
        /* every row, the last row, none (the hidden state), and in chunks of 2 and 3 */
        CHECK_NUMERIC(run_ids(dir, bes[b], ids, 4, 0, 1, 1, &err), err,
                      "non-finite logits at position 2 (logit 0 is NaN, and the hidden state too)");
        CHECKF(strstr(err.msg, "the weights or config.json may be corrupt"), "%s", err.msg);
        CHECK_NUMERIC(run_ids(dir, bes[b], ids, 4, 0, 0, 1, &err), err,
                      "non-finite logits at position 3");
        CHECK_NUMERIC(run_ids(dir, bes[b], ids, 4, 0, 0, 0, &err), err,
                      "non-finite hidden state at position 3 (element 0 is NaN)");
        CHECK_NUMERIC(run_ids(dir, bes[b], ids, 4, 3, 0, 1, &err), err,
                      "non-finite hidden state at position 2"); /* chunk 1 of 2: no logits */
        CHECK_NUMERIC(run_ids(dir, bes[b], ids, 4, 3, 1, 1, &err), err,
                      "non-finite logits at position 2");
        CHECK(run_ids(dir, bes[b], ids, 2, 0, 1, 1, &err) == SL_OK);
    }
    /* Decode: the failing step leaves the position where it was; the next token goes on. */
    sl_model_params mp = {.n_threads = 2};
    sl_model *m = NULL;
    sl_session *s = NULL;
    sl_error err = {0};
    CHECKF(sl_model_load(dir, &mp, &m, &err) == SL_OK, "%s", err.msg);
    CHECK(m && sl_session_create(m, NULL, &s, &err) == SL_OK);
    float lg[256];
    if (!s) {
        sl_model_free(m);
        return;
    }
    CHECK(sl_session_forward(s, ids, 2, lg, 0, &err) == SL_OK);
    CHECK_NUMERIC(sl_session_forward(s, &ids[2], 1, lg, 0, &err), err,
                  "non-finite logits at position 2");
    sl_error_clear(&err);
    CHECK(sl_session_pos(s) == 2);
    CHECK(sl_session_forward(s, &ids[3], 1, lg, 0, &err) == SL_OK);
    CHECK(sl_first_nonfinite(SL_ISA_SCALAR, lg, 256) == 256);
    sl_session_free(s);
    sl_model_free(m);
}

/* An Inf row of the LM head: the hidden state is finite, the error says so. */
TEST(test_numeric_head_inf) {
    char dir[600];
    CHECK(copy_fixture("qwen3_gqa_untied", "inf-head", dir, sizeof dir) != NULL);
    CHECK(poke_tensor(dir, "lm_head.weight", 7 * 48, 8 * 48, INFINITY) == 0);
    const int32_t ids[] = {1, 2, 3};
    sl_error err = {0};
    CHECK_NUMERIC(run_ids(dir, SL_BACKEND_CPU, ids, 3, 0, 1, 1, &err), err,
                  "non-finite logits at position 0 (logit 7 is");
    CHECKF(strstr(err.msg, "from a finite hidden state: the LM head's weights may be corrupt"),
           "%s", err.msg);
    /* No logits asked: the hidden state is fine, so is the call. */
    CHECK(run_ids(dir, SL_BACKEND_CPU, ids, 3, 0, 0, 0, &err) == SL_OK);
}

/* A norm weight at the largest bf16 (a valid config, weights that overflow): the dense layer's
 * input is Inf at every position, in the checkpoint and in int8 and int4 packs, whose Q4
 * matmuls quantise those Inf activations to int8 (AVX-512 VNNI). */
TEST(test_numeric_overflow_packs) {
    char dir[600], pack[700];
    CHECK(copy_fixture("qwen3_gqa_untied", "huge-norm", dir, sizeof dir) != NULL);
    CHECK(poke_tensor(dir, "model.layers.1.post_attention_layernorm.weight", 0, 48,
                      from_bits(0x7f7f0000u)) == 0);
    const int32_t ids[] = {1, 2, 3, 4, 5};
    const sl_quant qs[] = {SL_QUANT_INT8, SL_QUANT_INT4};
    sl_error err = {0};
    CHECK_NUMERIC(run_ids(dir, SL_BACKEND_CPU, ids, 5, 0, 1, 1, &err), err,
                  "non-finite logits at position 0");
    for (int q = 0; q < 2; q++) {
        snprintf(pack, sizeof pack, "%s-%s", dir, q ? "int4" : "int8");
        sl_pack_params pp = {.quant = qs[q], .force = 1};
        CHECKF(sl_pack(dir, pack, &pp, &err) == SL_OK, "%s", err.msg);
        CHECK_NUMERIC(run_ids(pack, SL_BACKEND_CPU, ids, 5, 0, 1, 1, &err), err,
                      "non-finite logits at position 0");
        CHECK_NUMERIC(run_ids(pack, SL_BACKEND_CPU, ids, 5, 2, 0, 0, &err), err,
                      "non-finite hidden state at position 1");
    }
}

/* Every family, its embedding row 5 Inf: attention, Gated DeltaNet, routers, shared experts,
 * hyper-connections, PLE and QSA all carry the NaN to the logits (without undefined
 * behaviour on the way, under the sanitizer build) and the error names position 2. */
TEST(test_numeric_families) {
    static const char *const fx[] = {"qwen2_gqa_untied", "qwen3_next_a", "qwen3_5_moe_text",
                                     "qwen4_exp_a"};
    static const int64_t H[] = {64, 64, 64, 64};
    const int32_t ids[] = {1, 2, 5, 3};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        char dir[600], as[64];
        snprintf(as, sizeof as, "inf-%s", fx[i]);
        CHECK(copy_fixture(fx[i], as, dir, sizeof dir) != NULL);
        CHECK(poke_tensor(dir, "model.embed_tokens.weight", 5 * H[i], 6 * H[i], INFINITY) == 0);
        sl_error err = {0};
        const sl_status st = run_ids(dir, SL_BACKEND_CPU, ids, 4, 0, 1, 1, &err);
        CHECKF(st == SL_ERR_NUMERIC && strstr(err.msg, "non-finite logits at position 2"),
               "%s: status %d: %s", fx[i], st, err.msg);
    }
}
