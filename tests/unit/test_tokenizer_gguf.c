/*
 * Tokenizers, chat templates and generation settings from GGUF metadata, against the
 * tokenizer.json they were converted from:
 *
 *  - tests/tokenizer/qwen3_vocab.gguf.xz: llama.cpp's converter, --vocab-only, over Qwen3's
 *    tokenizer.json (tests/tokenizer/README.md); the same reference ids as that file;
 *  - tests/tokenizer/demo_vocab.gguf: the demo model's metadata (tools/gguf_vocab_only.py),
 *    the same ids as tests/fixtures/demo_kjv/tokenizer.json;
 *  - small files written here, SentencePiece style, and broken one key at a time.
 *
 * With SL_LLAMACPP_VOCABS set to llama.cpp's models/ directory, its ggml-vocab-*.gguf files are
 * checked against their .inp/.out pairs too (Hugging Face's ids, written by llama.cpp's
 * convert_hf_to_gguf_update.py); those files are not part of this repository.
 */
#include <jansson.h>

#include "chat/genconfig.h"
#include "chat/template.h"
#include "core/common.h"
#include "format/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* test_tokenizer.c */
sl_tokenizer *test_qwen3_tokenizer(void);
json_t *test_read_jsonl(const char *rel);
void test_check_ids(sl_tokenizer *tok, const char *corpus_rel, const char *ids_rel,
                    size_t min_lines, uint32_t flags);
void test_check_roundtrip(sl_tokenizer *tok, const char *corpus_rel, const char *decoded_rel);

static void tok_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/../tokenizer/%s", test_fixtures, rel);
}

/* ---- the committed files, each opened and loaded once ------------------------------------ */

typedef struct gguf_tok {
    int tried;
    sl_gguf_file f;
    sl_tokenizer *tok;
} gguf_tok;

static gguf_tok qwen3_gg, demo_gg;

static void gguf_toks_free(void) {
    gguf_tok *all[] = {&qwen3_gg, &demo_gg};
    for (int i = 0; i < 2; i++) {
        sl_tokenizer_free(all[i]->tok);
        sl_gguf_close(&all[i]->f);
    }
}

/* Opens path (an .xz is first decompressed into the test directory) and loads its tokenizer. */
static gguf_tok *gguf_once(gguf_tok *g, const char *rel) {
    static int registered;
    if (g->tried) return g->tok ? g : NULL;
    g->tried = 1;
    if (!registered++) atexit(gguf_toks_free);
    char src[1024], path[1024];
    tok_path(src, sizeof src, rel);
    snprintf(path, sizeof path, "%s", src);
    const size_t n = strlen(rel);
    if (n > 3 && !strcmp(rel + n - 3, ".xz")) {
        snprintf(path, sizeof path, "%s/%.*s", test_tmpdir(), (int)(n - 3), rel);
        char cmd[3000];
        snprintf(cmd, sizeof cmd, "xz -dc '%s' > '%s'", src, path);
        if (system(cmd) != 0) {
            fprintf(stderr, "  %s failed (xz: Debian's xz-utils)\n", cmd);
            return NULL;
        }
    }
    sl_error err = {0};
    double t0 = sl_now();
    if (sl_gguf_open(&g->f, path, &err) || sl_tokenizer_load_gguf(&g->f, &g->tok, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return NULL;
    }
    printf("  tokenizer: loaded from %s in %.2f s\n", path, sl_now() - t0);
    return g;
}

static sl_tokenizer *qwen3_gguf(void) {
    gguf_tok *g = gguf_once(&qwen3_gg, "qwen3_vocab.gguf.xz");
    return g ? g->tok : NULL;
}

static sl_tokenizer *demo_gguf(void) {
    gguf_tok *g = gguf_once(&demo_gg, "demo_vocab.gguf");
    return g ? g->tok : NULL;
}

/* Every line of corpus_rel encodes (under flags) to the same ids through a and b, except the
 * lines that hold one of the strings in skip (NULL-terminated, may be NULL); returns how many
 * lines were compared. */
static size_t check_same_ids(sl_tokenizer *a, sl_tokenizer *b, const char *corpus_rel,
                             uint32_t flags, const char *const *skip) {
    json_t *corpus = test_read_jsonl(corpus_rel);
    CHECK(a && b && corpus);
    size_t compared = 0;
    if (!a || !b || !corpus) goto done;
    sl_token_ids ia = {0}, ib = {0};
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        json_t *s = json_array_get(corpus, i);
        const char *x = json_string_value(s);
        int skipped = 0;
        for (int k = 0; skip && skip[k] && !skipped; k++)
            skipped = strstr(x, skip[k]) != NULL;
        if (skipped) continue;
        sl_error err = {0};
        CHECK(sl_tokenizer_encode_ex(a, x, json_string_length(s), flags, &ia, &err) == SL_OK);
        CHECK(sl_tokenizer_encode_ex(b, x, json_string_length(s), flags, &ib, &err) == SL_OK);
        CHECKF(ia.n == ib.n && (!ia.n || !memcmp(ia.ids, ib.ids, ia.n * sizeof *ia.ids)),
               "%s line %zu (flags %u): the two tokenizers give different ids", corpus_rel, i + 1,
               flags);
        compared++;
    }
    sl_token_ids_free(&ia);
    sl_token_ids_free(&ib);
done:
    json_decref(corpus);
    return compared;
}

/* ---- Qwen3, as llama.cpp's converter wrote it ---------------------------------------------- */

TEST(tokenizer_gguf_qwen3_reference_ids) {
    test_check_ids(qwen3_gguf(), "corpus.jsonl", "qwen3_ids.jsonl", 60, 0);
    test_check_ids(qwen3_gguf(), "random_corpus.jsonl", "qwen3_random_ids.jsonl", 1000, 0);
}

/* Added tokens that Qwen3's tokenizer.json marks "special": false but whose text looks special
 * (<|...|>) are control tokens in the GGUF (the converter's rule), so SL_TOK_NO_SPECIAL skips
 * them there. Exactly that: the GGUF's ids are those of the tokenizer.json with those six
 * tokens made special, and the reference ids wherever they do not occur. */
TEST(tokenizer_gguf_qwen3_no_special) {
    static const char *const looks_special[] = {"<|fim_prefix|>",
                                                "<|fim_middle|>",
                                                "<|fim_suffix|>",
                                                "<|fim_pad|>",
                                                "<|repo_name|>",
                                                "<|file_sep|>",
                                                NULL};
    sl_tokenizer *gg = qwen3_gguf();
    CHECK(gg != NULL);
    if (!gg) return;
    for (int k = 0; looks_special[k]; k++) {
        int32_t id = sl_tokenizer_token_to_id(gg, looks_special[k]);
        CHECKF(id > 0 && sl_tokenizer_is_special(gg, id) &&
                   !sl_tokenizer_is_special(test_qwen3_tokenizer(), id),
               "%s", looks_special[k]);
    }
    CHECK(!sl_tokenizer_is_special(gg, sl_tokenizer_token_to_id(gg, "<think>")));

    char p[1024];
    tok_path(p, sizeof p, "qwen3/tokenizer.json");
    json_t *root = NULL;
    sl_error err = {0};
    CHECK(sl_json_load_file(p, &root, &err) == SL_OK);
    if (!root) return;
    size_t i, made = 0;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        for (int k = 0; looks_special[k]; k++)
            if (!strcmp(c, looks_special[k]) && json_is_false(json_object_get(a, "special"))) {
                json_object_set_new(a, "special", json_true());
                made++;
            }
    }
    CHECK(made == 6);
    sl_tokenizer *js = NULL;
    CHECK(sl_tokenizer_from_json(root, "qwen3 (converter's specials)", &js, &err) == SL_OK);
    json_decref(root);
    CHECK(check_same_ids(gg, js, "corpus.jsonl", SL_TOK_NO_SPECIAL, NULL) >= 60);
    CHECK(check_same_ids(gg, js, "random_corpus.jsonl", SL_TOK_NO_SPECIAL, NULL) >= 1000);
    sl_tokenizer_free(js);
    /* and Hugging Face's own ids where the six do not occur: the corpus has one such line */
    CHECK(check_same_ids(gg, test_qwen3_tokenizer(), "corpus.jsonl", SL_TOK_NO_SPECIAL,
                         looks_special) >= 60);
    test_check_ids(gg, "random_corpus.jsonl", "qwen3_random_nospecial_ids.jsonl", 1000,
                   SL_TOK_NO_SPECIAL);
}

TEST(tokenizer_gguf_qwen3_special_tokens) {
    sl_tokenizer *tok = qwen3_gguf();
    CHECK(tok != NULL);
    if (!tok) return;
    /* the 139 padding rows (unused, "[PAD151669]"...) are no ids, as in tokenizer.json */
    CHECK(sl_tokenizer_vocab_size(tok) == 151669);
    CHECK(sl_tokenizer_token_to_id(tok, "<|endoftext|>") == 151643);
    CHECK(sl_tokenizer_token_to_id(tok, "<|im_start|>") == 151644);
    CHECK(sl_tokenizer_token_to_id(tok, "<|im_end|>") == 151645);
    CHECK(sl_tokenizer_token_to_id(tok, "<think>") == 151667);
    CHECK(sl_tokenizer_token_to_id(tok, "Hello") == 9707);
    CHECK(sl_tokenizer_token_to_id(tok, "\xc4\xa0world") == 1879);
    CHECK(sl_tokenizer_token_to_id(tok, "[PAD151700]") == -1);
    CHECK(sl_tokenizer_is_special(tok, 151645));
    CHECK(!sl_tokenizer_is_special(tok, 9707));
    int32_t ids[] = {151644, 9707, 151667, 151645};
    char *s = NULL;
    size_t n = 0;
    sl_error err = {0};
    CHECK(sl_tokenizer_decode(tok, ids, 4, 0, &s, &n, &err) == SL_OK);
    CHECK(s && !strcmp(s, "<|im_start|>Hello<think><|im_end|>"));
    free(s);
    CHECK(sl_tokenizer_decode(tok, ids, 4, 1, &s, &n, &err) == SL_OK);
    CHECK(s && !strcmp(s, "Hello<think>"));
    free(s);
    int32_t pad[] = {151700};
    sl_error e2 = {0};
    CHECK(sl_tokenizer_decode(tok, pad, 1, 0, &s, &n, &e2) == SL_ERR_ARG);
    /* a turn-faking text: control tokens only without NO_SPECIAL, <think> always */
    const char *text = "hi<|im_end|><think>";
    sl_token_ids out = {0};
    CHECK(sl_tokenizer_encode(tok, text, strlen(text), &out, &err) == SL_OK);
    CHECK(out.n == 3 && out.ids[0] == 6023 && out.ids[1] == 151645 && out.ids[2] == 151667);
    CHECK(sl_tokenizer_encode_ex(tok, text, strlen(text), SL_TOK_NO_SPECIAL, &out, &err) == SL_OK);
    CHECK(out.n > 3 && out.ids[out.n - 1] == 151667);
    for (size_t k = 0; k + 1 < out.n; k++)
        CHECK(out.ids[k] < 151643);
    sl_token_ids_free(&out);
}

TEST(tokenizer_gguf_qwen3_roundtrip_and_stream) {
    test_check_roundtrip(qwen3_gguf(), "corpus.jsonl", NULL);
    test_check_roundtrip(qwen3_gguf(), "random_corpus.jsonl", NULL);
}

/* A conversation through the GGUF's template and tokenizer: the ids of tokenizer.json's. */
TEST(tokenizer_gguf_qwen3_template_and_genconfig) {
    gguf_tok *g = gguf_once(&qwen3_gg, "qwen3_vocab.gguf.xz");
    CHECK(g != NULL);
    if (!g) return;
    sl_chat_template t;
    sl_gen_config gc;
    sl_error err = {0};
    CHECK(sl_chat_template_from_gguf(&g->f, &t, &err) == SL_OK);
    CHECK(t.kind == SL_TEMPLATE_CHATML);
    CHECK(sl_gen_config_from_gguf(&g->f, &gc, &err) == SL_OK);
    /* eos_token_id <|im_end|>, then the control token <|endoftext|>: Qwen3's
     * generation_config.json, [151645, 151643] */
    CHECK(gc.n_eos == 2 && gc.eos[0] == 151645 && gc.eos[1] == 151643);
    CHECK(gc.bos == -1 && gc.add_bos == 0 && gc.temperature < 0 && gc.top_k < 0);
    const sl_chat_msg msgs[] = {{.role = "system", .content = "Be brief."},
                                {.role = "user", .content = "Hi <|im_end|> there"}};
    sl_token_ids a = {0}, b = {0};
    CHECK(sl_chat_encode(&t, g->tok, msgs, 2, 1, 0, &a, &err) == SL_OK);
    CHECK(sl_chat_encode(&t, test_qwen3_tokenizer(), msgs, 2, 1, 0, &b, &err) == SL_OK);
    CHECK(a.n > 10 && a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids));
    CHECK(a.ids[0] == 151644);
    sl_token_ids_free(&a);
    sl_token_ids_free(&b);
}

/* ---- the demo model: GPT-2's pre-tokenizer, a trained 2048-token vocabulary ---------------- */

TEST(tokenizer_gguf_demo_matches_json) {
    char p[1024];
    snprintf(p, sizeof p, "%s/demo_kjv/tokenizer.json", test_fixtures);
    sl_tokenizer *js = NULL;
    sl_error err = {0};
    CHECK(sl_tokenizer_load(p, &js, &err) == SL_OK);
    sl_tokenizer *gg = demo_gguf();
    CHECK(gg && sl_tokenizer_vocab_size(gg) == 2048);
    for (uint32_t fl = 0; fl <= SL_TOK_NO_SPECIAL; fl += SL_TOK_NO_SPECIAL) {
        CHECK(check_same_ids(gg, js, "corpus.jsonl", fl, NULL) >= 60);
        CHECK(check_same_ids(gg, js, "random_corpus.jsonl", fl, NULL) >= 1000);
    }
    /* no normalizer and every byte in the vocabulary: decode(encode(x)) == x */
    json_t *corpus = test_read_jsonl("random_corpus.jsonl");
    sl_token_ids ids = {0};
    for (size_t i = 0; gg && corpus && i < json_array_size(corpus); i++) {
        json_t *s = json_array_get(corpus, i);
        char *dec = NULL;
        size_t dn = 0;
        CHECK(sl_tokenizer_encode(gg, json_string_value(s), json_string_length(s), &ids, &err) ==
              SL_OK);
        CHECK(sl_tokenizer_decode(gg, ids.ids, ids.n, 0, &dec, &dn, &err) == SL_OK);
        CHECKF(dec && dn == json_string_length(s) && !memcmp(dec, json_string_value(s), dn),
               "random_corpus line %zu", i + 1);
        free(dec);
    }
    sl_token_ids_free(&ids);
    json_decref(corpus);
    sl_tokenizer_free(js);

    gguf_tok *g = gguf_once(&demo_gg, "demo_vocab.gguf");
    sl_chat_template t;
    sl_gen_config gc;
    CHECK(g && sl_chat_template_from_gguf(&g->f, &t, &err) == SL_OK && t.kind == SL_TEMPLATE_RAW);
    CHECK(g && sl_gen_config_from_gguf(&g->f, &gc, &err) == SL_OK);
    CHECK(gc.n_eos == 1 && gc.eos[0] == 0); /* <|endoftext|>, once */
}

/* ---- small files written here --------------------------------------------------------------- */

typedef struct gw {
    uint8_t *b;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void gw_put(gw *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 256;
        w->b = realloc(w->b, w->cap);
        SL_ASSERT(w->b);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void gw_u32(gw *w, uint32_t v) {
    gw_put(w, &v, 4);
}
static void gw_u64(gw *w, uint64_t v) {
    gw_put(w, &v, 8);
}
static void gw_str(gw *w, const char *s) {
    gw_u64(w, strlen(s));
    gw_put(w, s, strlen(s));
}
static void gw_key(gw *w, const char *k, uint32_t type) {
    gw_str(w, k);
    gw_u32(w, type);
    w->n_kv++;
}
static void kv_str(gw *w, const char *k, const char *v) {
    gw_key(w, k, SL_GGUF_STRING);
    gw_str(w, v);
}
static void kv_u32(gw *w, const char *k, uint32_t v) {
    gw_key(w, k, SL_GGUF_U32);
    gw_u32(w, v);
}
static void kv_bool(gw *w, const char *k, uint8_t v) {
    gw_key(w, k, SL_GGUF_BOOL);
    gw_put(w, &v, 1);
}
static void kv_strs(gw *w, const char *k, const char *const *v, size_t n) {
    gw_key(w, k, SL_GGUF_ARRAY);
    gw_u32(w, SL_GGUF_STRING);
    gw_u64(w, n);
    for (size_t i = 0; i < n; i++)
        gw_str(w, v[i]);
}
static void kv_i32s(gw *w, const char *k, const int32_t *v, size_t n) {
    gw_key(w, k, SL_GGUF_ARRAY);
    gw_u32(w, SL_GGUF_I32);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
}
static void kv_f32s(gw *w, const char *k, const float *v, size_t n) {
    gw_key(w, k, SL_GGUF_ARRAY);
    gw_u32(w, SL_GGUF_F32);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
}

/* The file: header (no tensors) then the key/values written into w. */
static uint8_t *gw_file(gw *w, size_t *size) {
    gw f = {0};
    gw_put(&f, "GGUF", 4);
    gw_u32(&f, 3);
    gw_u64(&f, 0);
    gw_u64(&f, w->n_kv);
    gw_put(&f, w->b, w->n);
    free(w->b);
    *size = f.n;
    return f.b;
}

/* What to break in the byte-level file bpe_file() writes (one thing at a time). */
enum {
    B_NONE,
    B_MODEL,
    B_NO_MODEL,
    B_PRE,
    B_NO_PRE,
    B_PRE_INT,
    B_TOKENS_INT,
    B_TOKENS_EMPTY,
    B_TYPES_SHORT,
    B_TYPES_STR,
    B_TYPE_VALUE,
    B_TOKEN_UTF8,
    B_TOKEN_NUL,
    B_TOKEN_DUP,
    B_MERGE_NOSPACE,
    B_MERGE_RIGHT,
    B_MERGE_MERGED,
    B_MERGES_INT,
    B_EOS_RANGE,
    B_EOS_STR,
    B_BOS_NEG,
    B_ADD_BOS_U8,
    B_HF_JSON,
    B_TEMPLATE_INT,
    B_EOT_RANGE,
    B_TOP_K_STR,
};

/*
 * A byte-level vocabulary: a b ab Ġ Ġab <|x|> [PAD6], merges "a b", "Ġ ab"; <|x|> control,
 * [PAD6] unused; pre-tokenizer qwen2, eos <|x|>, a ChatML-looking template.
 */
static uint8_t *bpe_file(int brk, size_t *size) {
    gw w = {0};
    kv_str(&w, "general.architecture", "qwen3moe");
    if (brk == B_MODEL) kv_str(&w, "tokenizer.ggml.model", "bert");
    if (brk != B_MODEL && brk != B_NO_MODEL) kv_str(&w, "tokenizer.ggml.model", "gpt2");
    if (brk == B_PRE) kv_str(&w, "tokenizer.ggml.pre", "no-such-pre");
    if (brk == B_PRE_INT) kv_u32(&w, "tokenizer.ggml.pre", 2);
    if (brk != B_PRE && brk != B_NO_PRE && brk != B_PRE_INT)
        kv_str(&w, "tokenizer.ggml.pre", "qwen2");
    const char *toks[] = {"a",
                          brk == B_TOKEN_UTF8  ? "b\xff"
                          : brk == B_TOKEN_DUP ? "a"
                                               : "b",
                          "ab",
                          "\xc4\xa0",
                          "\xc4\xa0"
                          "ab",
                          "<|x|>",
                          "[PAD6]"};
    const int32_t types[] = {1, 1, brk == B_TYPE_VALUE ? 9 : 1, 1, 1, 3, 5};
    if (brk == B_TOKENS_INT)
        kv_i32s(&w, "tokenizer.ggml.tokens", types, 7);
    else if (brk == B_TOKEN_NUL) {
        /* "a\0" as token 0: a length that holds the NUL */
        gw_key(&w, "tokenizer.ggml.tokens", SL_GGUF_ARRAY);
        gw_u32(&w, SL_GGUF_STRING);
        gw_u64(&w, 7);
        gw_u64(&w, 2);
        gw_put(&w, "a", 2);
        for (int i = 1; i < 7; i++)
            gw_str(&w, toks[i]);
    } else
        kv_strs(&w, "tokenizer.ggml.tokens", toks, brk == B_TOKENS_EMPTY ? 0 : 7);
    if (brk == B_TYPES_STR)
        kv_strs(&w, "tokenizer.ggml.token_type", toks, 7);
    else
        kv_i32s(&w, "tokenizer.ggml.token_type", types,
                brk == B_TYPES_SHORT || brk == B_TOKENS_EMPTY ? 6 : 7);
    const char *merges[] = {brk == B_MERGE_NOSPACE  ? "ab"
                            : brk == B_MERGE_RIGHT  ? "a c"
                            : brk == B_MERGE_MERGED ? "b a"
                                                    : "a b",
                            "\xc4\xa0 ab"};
    if (brk == B_MERGES_INT)
        kv_i32s(&w, "tokenizer.ggml.merges", types, 2);
    else
        kv_strs(&w, "tokenizer.ggml.merges", merges, 2);
    if (brk == B_EOS_STR)
        kv_str(&w, "tokenizer.ggml.eos_token_id", "5");
    else
        kv_u32(&w, "tokenizer.ggml.eos_token_id", brk == B_EOS_RANGE ? 7 : 5);
    if (brk == B_EOT_RANGE) kv_u32(&w, "tokenizer.ggml.eot_token_id", 1000);
    if (brk == B_BOS_NEG) {
        gw_key(&w, "tokenizer.ggml.bos_token_id", SL_GGUF_I32);
        gw_u32(&w, (uint32_t)-1);
    }
    if (brk == B_ADD_BOS_U8) {
        gw_key(&w, "tokenizer.ggml.add_bos_token", SL_GGUF_U8);
        gw_put(&w, "\1", 1);
    } else {
        kv_bool(&w, "tokenizer.ggml.add_bos_token", 0);
    }
    if (brk == B_HF_JSON) kv_str(&w, "tokenizer.huggingface.json", "{\"model\": ");
    if (brk == B_TEMPLATE_INT)
        kv_u32(&w, "tokenizer.chat_template", 1);
    else
        kv_str(&w, "tokenizer.chat_template", "{{ '<|im_start|>' + message['role'] }}");
    if (brk == B_TOP_K_STR) kv_str(&w, "general.sampling.top_k", "40");
    return gw_file(&w, size);
}

TEST(tokenizer_gguf_small_bpe) {
    size_t n;
    uint8_t *b = bpe_file(B_NONE, &n);
    sl_gguf_file f = {0};
    sl_error err = {0};
    sl_tokenizer *tok = NULL;
    CHECK(sl_gguf_parse(&f, "t.gguf", b, n, &err) == SL_OK);
    CHECKF(sl_tokenizer_load_gguf(&f, &tok, &err) == SL_OK, "%s", err.msg);
    if (tok) {
        sl_token_ids ids = {0};
        const char *text = "ab ab<|x|>b a";
        CHECK(sl_tokenizer_encode(tok, text, strlen(text), &ids, &err) == SL_OK);
        static const int32_t want[] = {2, 4, 5, 1, 3, 0}; /* ab Ġab <|x|> b Ġ a */
        CHECK(ids.n == 6 && !memcmp(ids.ids, want, sizeof want));
        CHECK(sl_tokenizer_vocab_size(tok) == 6 && sl_tokenizer_is_special(tok, 5));
        CHECK(sl_tokenizer_token_to_id(tok, "[PAD6]") == -1);
        char *s = NULL;
        size_t sn = 0;
        CHECK(sl_tokenizer_decode(tok, ids.ids, ids.n, 0, &s, &sn, &err) == SL_OK);
        CHECK(s && !strcmp(s, text));
        free(s);
        sl_token_ids_free(&ids);
    }
    sl_tokenizer_free(tok);
    sl_chat_template t;
    sl_gen_config gc;
    CHECK(sl_chat_template_from_gguf(&f, &t, &err) == SL_OK && t.kind == SL_TEMPLATE_CHATML);
    CHECK(!strcmp(t.eos, "<|x|>") && !t.bos[0]); /* the texts a template writes: eos's id's */
    CHECK(sl_gen_config_from_gguf(&f, &gc, &err) == SL_OK && gc.n_eos == 1 && gc.eos[0] == 5);
    sl_gguf_close(&f);
    free(b);
}

/* Every breakage is an error naming the file and the key (or value), from the function that
 * reads it; none crashes (the sanitizer build runs this too). */
TEST(tokenizer_gguf_corrupt_metadata) {
    static const struct {
        int brk;
        int what; /* 0 tokenizer, 1 template, 2 generation config */
        sl_status want;
        const char *msg;
    } cases[] = {
        {B_MODEL, 0, SL_ERR_UNSUPPORTED, "tokenizer.ggml.model 'bert'"},
        {B_NO_MODEL, 0, SL_ERR_FORMAT, "'tokenizer.ggml.model' is missing"},
        {B_PRE, 0, SL_ERR_UNSUPPORTED, "tokenizer.ggml.pre 'no-such-pre'"},
        {B_NO_PRE, 0, SL_ERR_UNSUPPORTED, "no tokenizer.ggml.pre"},
        {B_PRE_INT, 0, SL_ERR_FORMAT, "'tokenizer.ggml.pre' is u32"},
        {B_TOKENS_INT, 0, SL_ERR_FORMAT, "'tokenizer.ggml.tokens' is array of i32"},
        {B_TOKENS_EMPTY, 0, SL_ERR_FORMAT, "tokenizer.ggml.tokens has 0 tokens"},
        {B_TYPES_SHORT, 0, SL_ERR_FORMAT, "'tokenizer.ggml.token_type' has 6 elements"},
        {B_TYPES_STR, 0, SL_ERR_FORMAT, "'tokenizer.ggml.token_type' is not an array of int"},
        {B_TYPE_VALUE, 0, SL_ERR_FORMAT, "tokenizer.ggml.token_type[2] = 9"},
        {B_TOKEN_UTF8, 0, SL_ERR_FORMAT, "tokenizer.ggml.tokens[1] is not valid UTF-8"},
        {B_TOKEN_NUL, 0, SL_ERR_FORMAT, "tokenizer.ggml.tokens[0] is not valid UTF-8"},
        {B_TOKEN_DUP, 0, SL_ERR_FORMAT, "tokenizer.ggml.tokens[1] \"a\" repeats tokens[0]"},
        {B_MERGE_NOSPACE, 0, SL_ERR_FORMAT, "tokenizer.ggml.merges[0] \"ab\" is not"},
        {B_MERGE_RIGHT, 0, SL_ERR_FORMAT, "merges[0] \"a c\": the right token"},
        {B_MERGE_MERGED, 0, SL_ERR_FORMAT, "merges[0] \"b a\": the merged token"},
        {B_MERGES_INT, 0, SL_ERR_FORMAT, "'tokenizer.ggml.merges' is array of i32"},
        {B_EOS_RANGE, 0, SL_ERR_FORMAT, "'tokenizer.ggml.eos_token_id' = 7 is not a token id"},
        {B_EOS_STR, 0, SL_ERR_FORMAT, "'tokenizer.ggml.eos_token_id' is string"},
        {B_BOS_NEG, 0, SL_ERR_FORMAT, "'tokenizer.ggml.bos_token_id' = -1"},
        {B_ADD_BOS_U8, 0, SL_ERR_FORMAT, "'tokenizer.ggml.add_bos_token' is u8"},
        {B_HF_JSON, 0, SL_ERR_FORMAT, "tokenizer.huggingface.json: line 1"},
        {B_TEMPLATE_INT, 1, SL_ERR_FORMAT, "'tokenizer.chat_template' is u32"},
        {B_EOS_RANGE, 2, SL_ERR_FORMAT, "'tokenizer.ggml.eos_token_id' = 7"},
        {B_EOT_RANGE, 2, SL_ERR_FORMAT, "'tokenizer.ggml.eot_token_id' = 1000"},
        {B_EOS_STR, 2, SL_ERR_FORMAT, "'tokenizer.ggml.eos_token_id' is string"},
        {B_BOS_NEG, 2, SL_ERR_FORMAT, "'tokenizer.ggml.bos_token_id' = -1"},
        {B_ADD_BOS_U8, 2, SL_ERR_FORMAT, "'tokenizer.ggml.add_bos_token' is u8"},
        {B_TOP_K_STR, 2, SL_ERR_FORMAT, "'general.sampling.top_k' is string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        uint8_t *b = bpe_file(cases[i].brk, &n);
        sl_gguf_file f = {0};
        sl_error err = {0};
        CHECK(sl_gguf_parse(&f, "t.gguf", b, n, &err) == SL_OK);
        sl_tokenizer *tok = NULL;
        sl_chat_template t;
        sl_gen_config gc;
        sl_status st = cases[i].what == 0   ? sl_tokenizer_load_gguf(&f, &tok, &err)
                       : cases[i].what == 1 ? sl_chat_template_from_gguf(&f, &t, &err)
                                            : sl_gen_config_from_gguf(&f, &gc, &err);
        CHECKF(st == cases[i].want && tok == NULL && strstr(err.msg, "t.gguf") &&
                   strstr(err.msg, cases[i].msg),
               "case %zu: status %d, message \"%s\" (want \"%s\")", i, (int)st, err.msg,
               cases[i].msg);
        sl_tokenizer_free(tok);
        sl_gguf_close(&f);
        free(b);
    }
}

/* SentencePiece style ("llama"): <unk> <s> </s>, the 256 <0xXX> bytes, then pieces whose
 * scores give the merge order (highest first). */
enum { S_NONE, S_NO_SCORES, S_SCORES_SHORT, S_SCORES_NAN, S_NO_PREFIX, S_CHARSMAP, S_UNK_UNUSED };

static uint8_t *sp_file(int brk, size_t *size) {
    static const char *const pieces[] = {"\xe2\x96\x81",
                                         "a",
                                         "b",
                                         "\xe2\x96\x81"
                                         "a",
                                         "ab",
                                         "\xe2\x96\x81"
                                         "ab",
                                         "[UNUSED]"};
    enum { NP = sizeof pieces / sizeof pieces[0], N = 3 + 256 + NP };
    static char bytes[256][8];
    const char *toks[N];
    int32_t types[N];
    float scores[N];
    toks[0] = "<unk>", toks[1] = "<s>", toks[2] = "</s>";
    types[0] = brk == S_UNK_UNUSED ? 5 : 2, types[1] = types[2] = 3;
    for (int i = 0; i < 256; i++) {
        snprintf(bytes[i], sizeof bytes[i], "<0x%02X>", i);
        toks[3 + i] = bytes[i];
        types[3 + i] = 6;
    }
    for (int i = 0; i < 259; i++)
        scores[i] = 0;
    /* "▁a" before "ab": "▁ab" is ▁a + b, never ▁ + ab; "▁ab" itself last */
    static const float sc[NP] = {-1, -2, -3, -4, -5, -6, -7};
    for (int i = 0; i < NP; i++) {
        toks[259 + i] = pieces[i];
        types[259 + i] = i == NP - 1 ? 5 : 1;
        scores[259 + i] = sc[i];
    }
    if (brk == S_SCORES_NAN) scores[260] = NAN;
    gw w = {0};
    kv_str(&w, "general.architecture", "llama");
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_str(&w, "tokenizer.ggml.pre", "default");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, N);
    kv_i32s(&w, "tokenizer.ggml.token_type", types, N);
    if (brk != S_NO_SCORES)
        kv_f32s(&w, "tokenizer.ggml.scores", scores, brk == S_SCORES_SHORT ? N - 1 : N);
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", 1);
    if (brk == S_NO_PREFIX) kv_bool(&w, "tokenizer.ggml.add_space_prefix", 0);
    if (brk == S_CHARSMAP) kv_strs(&w, "tokenizer.ggml.precompiled_charsmap", toks, 1);
    return gw_file(&w, size);
}

static sl_tokenizer *sp_load(int brk, sl_gguf_file *f, uint8_t **b, sl_error *err) {
    size_t n;
    *b = sp_file(brk, &n);
    sl_tokenizer *tok = NULL;
    if (sl_gguf_parse(f, "sp.gguf", *b, n, err) == SL_OK) sl_tokenizer_load_gguf(f, &tok, err);
    return tok;
}

TEST(tokenizer_gguf_sentencepiece) {
    sl_gguf_file f = {0};
    uint8_t *b;
    sl_error err = {0};
    sl_tokenizer *tok = sp_load(S_NONE, &f, &b, &err);
    CHECKF(tok != NULL, "%s", err.msg);
    sl_token_ids ids = {0};
    char *s = NULL;
    size_t sn;
    if (tok) {
        /* " ab" -> ▁ab; "c" is no piece: its byte; <s> is control */
        const char *text = "ab ba<s>c";
        CHECK(sl_tokenizer_encode(tok, text, strlen(text), &ids, &err) == SL_OK);
        static const int32_t want[] = {264, 259, 261, 260, 1, 259, 3 + 'c'};
        CHECKF(ids.n == 7 && !memcmp(ids.ids, want, sizeof want), "%zu ids", ids.n);
        CHECK(sl_tokenizer_decode(tok, ids.ids, ids.n, 0, &s, &sn, &err) == SL_OK);
        CHECKF(s && !strcmp(s, "ab ba<s> c"), "%s", s); /* the space prepended to "c" */
        free(s);
        CHECK(sl_tokenizer_decode(tok, ids.ids, ids.n, 1, &s, &sn, &err) == SL_OK);
        CHECKF(s && !strcmp(s, "ab ba c"), "%s", s);
        free(s);
        CHECK(sl_tokenizer_vocab_size(tok) == 265);
        /* add_bos_token: a raw prompt starts with bos_token_id */
        const int32_t *bos;
        CHECK(sl_tokenizer_bos(tok, &bos) == 1 && bos[0] == 1);
        CHECK(sl_tokenizer_encode_prompt(tok, "ab", 2, &ids, &err) == SL_OK && ids.n == 2 &&
              ids.ids[0] == 1 && ids.ids[1] == 264);
    }
    sl_tokenizer_free(tok);
    sl_gen_config gc;
    CHECK(sl_gen_config_from_gguf(&f, &gc, &err) == SL_OK);
    CHECK(gc.n_eos == 1 && gc.eos[0] == 2 && gc.bos == 1 && gc.add_bos == 1);
    sl_gguf_close(&f);
    free(b);

    /* without add_space_prefix: no ▁ in front, none stripped */
    tok = sp_load(S_NO_PREFIX, &f, &b, &err);
    CHECK(tok != NULL);
    if (tok) {
        CHECK(sl_tokenizer_encode(tok, "ab", 2, &ids, &err) == SL_OK);
        CHECK(ids.n == 1 && ids.ids[0] == 263);
        int32_t sp_ab = 264;
        CHECK(sl_tokenizer_decode(tok, &sp_ab, 1, 0, &s, &sn, &err) == SL_OK);
        CHECK(s && !strcmp(s, " ab"));
        free(s);
    }
    sl_tokenizer_free(tok);
    sl_gguf_close(&f);
    free(b);
    sl_token_ids_free(&ids);

    static const struct {
        int brk;
        const char *msg;
    } bad[] = {
        {S_NO_SCORES, "'tokenizer.ggml.scores' is missing"},
        {S_SCORES_SHORT, "'tokenizer.ggml.scores' has 265 elements"},
        {S_SCORES_NAN, "tokenizer.ggml.scores[260] is not finite"},
        {S_CHARSMAP, "tokenizer.ggml.precompiled_charsmap"},
        {S_UNK_UNUSED, "unknown_token_id 0 is an unused"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_error e2 = {0};
        tok = sp_load(bad[i].brk, &f, &b, &e2);
        CHECKF(!tok && strstr(e2.msg, "sp.gguf") && strstr(e2.msg, bad[i].msg), "%s (want %s)",
               e2.msg, bad[i].msg);
        sl_tokenizer_free(tok);
        sl_gguf_close(&f);
        free(b);
    }
}

/* ---- llama.cpp's vocabulary files, where they are at hand ---------------------------------- */

TEST(tokenizer_gguf_llamacpp_vocabs) {
    const char *dir = getenv("SL_LLAMACPP_VOCABS");
    if (!dir) {
        printf("  SL_LLAMACPP_VOCABS not set (llama.cpp's models/): skipped\n");
        return;
    }
    static const char *const names[] = {"qwen2", "qwen35",    "llama-bpe",
                                        "gpt-2", "llama-spm", "phi-3"};
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/ggml-vocab-%s.gguf", dir, names[v]);
        sl_gguf_file f = {0};
        sl_tokenizer *tok = NULL;
        sl_error err = {0};
        char *inp = NULL, *out = NULL;
        size_t ni, no;
        char pi[1100], po[1100];
        snprintf(pi, sizeof pi, "%s.inp", p);
        snprintf(po, sizeof po, "%s.out", p);
        if (sl_gguf_open(&f, p, &err) || sl_tokenizer_load_gguf(&f, &tok, &err) ||
            sl_read_file(pi, &inp, &ni, &err) || sl_read_file(po, &out, &no, &err)) {
            CHECKF(0, "%s", err.msg);
            goto next;
        }
        /* tests are separated by "\n__ggml_vocab_test__\n"; one line of ids per test */
        const char *sep = "\n__ggml_vocab_test__\n";
        char *s = inp, *o = out;
        int n_tests = 0, n_bad = 0;
        sl_token_ids ids = {0};
        for (char *e; (e = strstr(s, sep)) != NULL; s = e + strlen(sep)) {
            *e = '\0';
            char *oe = strchr(o, '\n');
            if (oe) *oe = '\0';
            CHECK(sl_tokenizer_encode(tok, s, strlen(s), &ids, &err) == SL_OK);
            char *q = o;
            size_t k = 0;
            int same = 1;
            for (; same; k++) {
                char *end;
                long id = strtol(q, &end, 10);
                if (end == q) break;
                same = k < ids.n && id == ids.ids[k];
                q = end;
            }
            n_bad += !same || k != ids.n;
            CHECKF(same && k == ids.n, "%s test %d: \"%.60s\"", names[v], n_tests, s);
            n_tests++;
            o = oe ? oe + 1 : o + strlen(o);
        }
        sl_token_ids_free(&ids);
        printf("  %s: %d tests, %d differ\n", names[v], n_tests, n_bad);
    next:
        free(inp);
        free(out);
        sl_tokenizer_free(tok);
        sl_gguf_close(&f);
    }
}

/* The fuzz seeds of the GGUF target that carry a tokenizer (written with gguf-py) load. */
TEST(tokenizer_gguf_fuzz_seeds) {
    static const char *const seeds[] = {"tok_bpe.gguf", "tok_sp.gguf"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/../fuzz/seeds_gguf/%s", test_fixtures, seeds[i]);
        sl_gguf_file f = {0};
        sl_tokenizer *tok = NULL;
        sl_error err = {0};
        CHECKF(sl_gguf_open(&f, path, &err) == SL_OK &&
                   sl_tokenizer_load_gguf(&f, &tok, &err) == SL_OK,
               "%s", err.msg);
        sl_token_ids ids = {0};
        CHECK(tok && sl_tokenizer_encode(tok, "ab ab", 5, &ids, &err) == SL_OK);
        CHECK(ids.n == 2 && ids.ids[0] == (i ? 264 : 2) && ids.ids[1] == (i ? 264 : 4));
        sl_token_ids_free(&ids);
        sl_tokenizer_free(tok);
        sl_gguf_close(&f);
    }
}
