/* Safetensors, config.json and checkpoint binding: valid files and every way to break them. */
#include <sys/stat.h>
#include <unistd.h>

#include "format/pack.h"
#include "format/safetensors.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "test.h"

/* A safetensors image: u64 header length, the header text, then data_len bytes of 0x11. */
static uint8_t *st_image(const char *header, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + data_len;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0x11, data_len);
    return b;
}

/* Parses an image; returns the status and leaves the message in err. */
static sl_status st_try(const char *header, size_t data_len, sl_error *err) {
    size_t n;
    uint8_t *img = st_image(header, data_len, &n);
    sl_st_file f = {0};
    sl_error_clear(err);
    sl_status st = sl_st_parse(&f, "x.safetensors", img, n, err);
    sl_st_close(&f);
    free(img);
    return st;
}

TEST(test_safetensors_valid) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                    "\"e\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[20,20]}}";
    size_t n;
    uint8_t *img = st_image(h, 20, &n);
    sl_st_file f = {0};
    sl_error err = {0};
    CHECK(sl_st_parse(&f, "x", img, n, &err) == SL_OK);
    CHECK(f.n_tensors == 3);
    const sl_tensor *a = sl_st_find(&f, "a"), *b = sl_st_find(&f, "b");
    CHECK(a && a->dtype == SL_DTYPE_BF16 && a->ndim == 2 && a->shape[1] == 3 && a->nbytes == 12);
    CHECK(b && b->dtype == SL_DTYPE_F32 &&
          (const uint8_t *)b->data - (const uint8_t *)a->data == 12);
    CHECK(sl_st_find(&f, "__metadata__") == NULL && sl_st_find(&f, "zz") == NULL);
    sl_st_close(&f);
    free(img);
}

TEST(test_safetensors_malformed) {
    sl_error err;
    struct {
        const char *header;
        size_t data;
        const char *needle;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "expected 12"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "not a size"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
         "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, "JSON"},
        {"{\"a\":[1,2]}", 0, "not an object"},
        {"[1]", 0, "not a JSON object"},
        {"{\"a\":", 0, "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         "dimensions"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_status st = st_try(cases[i].header, cases[i].data, &err);
        CHECKF(st == SL_ERR_FORMAT && strstr(err.msg, cases[i].needle) &&
                   strstr(err.msg, "x.safetensors"),
               "case %zu: %s", i, err.msg);
    }
    /* Header length beyond the file, and a file shorter than the length field. */
    uint8_t bad[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    sl_st_file f = {0};
    sl_error_clear(&err);
    CHECK(sl_st_parse(&f, "x", bad, sizeof bad, &err) == SL_ERR_FORMAT);
    CHECK(strstr(err.msg, "header length") != NULL);
    sl_st_close(&f);
    sl_error_clear(&err);
    CHECK(sl_st_parse(&f, "x", bad, 5, &err) == SL_ERR_FORMAT);
    sl_st_close(&f);
}

TEST(test_config_parse) {
    sl_config c;
    sl_error err = {0};
    const char *ok = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                     "\"head_dim\":16,\"num_experts\":8,\"num_experts_per_tok\":2,"
                     "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],\"norm_topk_prob\":true,"
                     "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000.0},"
                     "\"partial_rotary_factor\":0.5}";
    CHECK(sl_config_parse(&c, ok, "config.json", &err) == SL_OK);
    CHECK(c.n_kv_heads == 2 && c.head_dim == 16 && c.norm_topk_prob == 1);
    CHECK(c.rope_theta == 5000.0 && c.rot_dim == 8);
    CHECK(!c.layer_is_moe[0] && c.layer_is_moe[1] && !c.layer_is_moe[2] && !c.layer_is_moe[3]);
    sl_config_free(&c);

    struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"{\"vocab_size\":1}", "model_type"},
        {"{\"model_type\":\"qwen3_moe\"}", "vocab_size"},
        {"{\"model_type\":\"x\",\"vocab_size\":-1}", "out of range"},
        {"{\"model_type\":\"x\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":3,\"num_key_value_heads\":2}",
         "multiple"},
        {"{\"model_type\":\"x\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":2,\"rope_scaling\":{\"rope_type\":\"dynamic\"}}",
         "dynamic"},
        {"{\"model_type\":\"x\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":2,\"mlp_only_layers\":[5]}",
         "mlp_only_layers"},
        {"{\"model_type\":\"x\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":5}",
         "per_tok"},
        {"{\"model_type\":\"x\",\"hidden_act\":\"gelu\"}", "gelu"},
        {"not json", "invalid JSON"},
        /* found by the fuzzer: a boolean where a count belongs (division by zero) */
        {"{\"model_type\":\"x\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":2,\"num_key_value_heads\":false}",
         "out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_error_clear(&err);
        CHECKF(sl_config_parse(&c, bad[i].text, "config.json", &err) != SL_OK &&
                   strstr(err.msg, bad[i].needle),
               "case %zu: %s", i, err.msg);
    }

    /* Issue 24: numbers that make the math undefined (all-NaN logits from "rms_norm_eps": -1)
     * are refused at load, naming the key, the value and the valid range. Each is a key added
     * to an otherwise valid config (a qwen4_exp one, whose keys are read too). */
    static const char base[] =
        "{\"model_type\":\"qwen4_exp\",\"vocab_size\":10,\"hidden_size\":8,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"head_dim\":16,"
        "\"linear_num_value_heads\":2,\"linear_num_key_heads\":1,\"linear_key_head_dim\":4,"
        "\"linear_value_head_dim\":4,\"full_attention_interval\":2%s}";
    struct {
        const char *keys, *needle;
    } num[] = {
        {",\"rms_norm_eps\":-1", "'rms_norm_eps' = -1 is out of range [1.4013e-45, 3.40282e+38]"},
        {",\"rms_norm_eps\":0", "'rms_norm_eps' = 0 is out of range"},
        {",\"rms_norm_eps\":1e-50", "'rms_norm_eps' = 1e-50 is out of range"}, /* 0 in float */
        {",\"rms_norm_eps\":1e39", "'rms_norm_eps' = 1e+39 is out of range"},  /* Inf in float */
        {",\"rms_norm_eps\":\"1e-6\"", "'rms_norm_eps' is not a number"},
        {",\"rope_theta\":0", "'rope_theta' = 0 is out of range [1, 3.40282e+38]"},
        {",\"rope_theta\":-10000.0", "'rope_theta' = -10000 is out of range"},
        {",\"rope_theta\":0.5", "'rope_theta' = 0.5 is out of range"},
        {",\"rope_parameters\":{\"rope_theta\":1e39}", "'rope_theta' = 1e+39 is out of range"},
        {",\"partial_rotary_factor\":0", "'partial_rotary_factor' = 0 is out of range (0, 1]"},
        {",\"partial_rotary_factor\":1.5", "'partial_rotary_factor' = 1.5 is out of range"},
        {",\"rope_parameters\":{\"partial_rotary_factor\":-0.5}",
         "'partial_rotary_factor' = -0.5 is out of range"},
        {",\"partial_rotary_factor\":0.1", "head_dim 16 x partial_rotary_factor 0.1 rotates 0"},
        {",\"max_position_embeddings\":0", "'max_position_embeddings' = 0 is out of range [1,"},
        {",\"hc_count\":1", "'hc_count' = 1 is out of range [2, 64]"},
        {",\"ngram_size\":1", "'ngram_size' = 1 is out of range [2, 8]"},
        {",\"heads_per_ngram\":0", "'heads_per_ngram' = 0 is out of range"},
        {",\"ngram_vocab_size_base\":1", "'ngram_vocab_size_base' = 1 is out of range"},
        {",\"make_ngram_vocab_size_divisible_by\":0", "divisible_by' = 0 is out of range"},
        {",\"linear_conv_kernel_dim\":0", "'linear_conv_kernel_dim' = 0 is out of range"},
        {",\"ple_conv_kernel_size\":0", "'ple_conv_kernel_size' = 0 is out of range"},
        {",\"indexer_n_heads\":2,\"indexer_head_dim\":16,\"indexer_kv_heads\":1,"
         "\"indexer_budget\":8,\"indexer_compress_ratio\":0",
         "indexer_budget a multiple of indexer_compress_ratio"},
    };
    char text[1024];
    snprintf(text, sizeof text, base, "");
    CHECKF(sl_config_parse(&c, text, "config.json", &err) == SL_OK, "base: %s", err.msg);
    sl_config_free(&c);
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        snprintf(text, sizeof text, base, num[i].keys);
        sl_error_clear(&err);
        CHECKF(sl_config_parse(&c, text, "config.json", &err) == SL_ERR_FORMAT &&
                   strstr(err.msg, "config.json: ") && strstr(err.msg, num[i].needle),
               "%s: %s", num[i].keys, err.msg);
    }
}

/* RoPE keys that appear in two places take transformers 5.17's precedence: the dict's value
 * wins, top-level keys fill in what it lacks, and a non-empty rope_scaling replaces
 * rope_parameters whole (in text_config too). */
TEST(test_config_rope_precedence) {
    static const char head[] = "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"vocab_size\":10,"
                               "\"hidden_size\":8,\"num_hidden_layers\":1,"
                               "\"num_attention_heads\":2,\"head_dim\":32,";
    struct {
        const char *rope;
        double theta;
        int32_t rot;
    } cases[] = {
        {"\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"rope_type\":\"default\","
         "\"rope_theta\":1e6,\"partial_rotary_factor\":0.5}",
         1e6, 16},
        {"\"partial_rotary_factor\":0.25,\"rope_theta\":500.0,\"rope_parameters\":{}", 500.0, 8},
        {"\"rope_theta\":500.0,\"rope_parameters\":{\"partial_rotary_factor\":0.5}", 500.0, 16},
        {"\"rope_parameters\":{\"rope_theta\":7.0}", 7.0, 32},
        {"\"rope_theta\":3.0,\"rope_scaling\":{\"type\":\"default\",\"partial_rotary_factor\":0.5},"
         "\"rope_parameters\":{\"rope_theta\":9.0,\"partial_rotary_factor\":0.25}",
         3.0, 16},
        {"\"rope_scaling\":{},\"rope_parameters\":{\"rope_theta\":9.0}", 9.0, 32},
        {"\"partial_rotary_factor\":0.25", 10000.0, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s}}", head, cases[i].rope);
        sl_config c;
        sl_error err = {0};
        CHECKF(sl_config_parse(&c, text, "config.json", &err) == SL_OK, "case %zu: %s", i, err.msg);
        CHECKF(c.rope_theta == cases[i].theta && c.rot_dim == cases[i].rot,
               "case %zu: theta %g rot %d", i, c.rope_theta, c.rot_dim);
        sl_config_free(&c);
    }
    sl_config c;
    sl_error err = {0};
    char text[512];
    snprintf(text, sizeof text, "%s%s}}", head,
             "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1.0}}");
    CHECK(sl_config_parse(&c, text, "config.json", &err) == SL_ERR_UNSUPPORTED &&
          strstr(err.msg, "per layer type"));
    /* Tying follows the top level of a vision-language config, as its model class does. */
    static const char *const tie[][2] = {
        {"\"tie_word_embeddings\":true}}", "0"},
        {"\"tie_word_embeddings\":true},\"tie_word_embeddings\":false}", "0"},
        {"\"tie_word_embeddings\":false},\"tie_word_embeddings\":true}", "1"},
    };
    for (size_t i = 0; i < sizeof tie / sizeof tie[0]; i++) {
        snprintf(text, sizeof text, "%s%s", head, tie[i][0]);
        CHECKF(sl_config_parse(&c, text, "config.json", &err) == SL_OK, "tie %zu: %s", i, err.msg);
        CHECKF(c.tie_word_embeddings == atoi(tie[i][1]), "tie %zu", i);
        sl_config_free(&c);
    }
}

/* ---- checkpoint directories broken in one way each, made from a fixture ---- */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    b[*n] = 0;
    return b;
}

/* Makes dir/<name> holding the fixture's config (edited) and weights (edited). */
static const char *make_case(const char *name, const char *cfg_from, const char *cfg_to,
                             size_t truncate_to, const char *hdr_from, const char *hdr_to) {
    static char dir[512];
    char path[600], src[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    size_t n;
    snprintf(src, sizeof src, "%s/qwen3_gqa_untied/config.json", test_fixtures);
    char *cfg = slurp(src, &n);
    if (!cfg) return NULL;
    char *at = cfg_from ? strstr(cfg, cfg_from) : NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (at) {
        fwrite(cfg, 1, (size_t)(at - cfg), f);
        fputs(cfg_to, f);
        fputs(at + strlen(cfg_from), f);
    } else {
        fputs(cfg, f);
    }
    fclose(f);
    free(cfg);
    snprintf(src, sizeof src, "%s/qwen3_gqa_untied/model.safetensors", test_fixtures);
    char *w = slurp(src, &n);
    if (!w) return NULL;
    if (hdr_from) { /* same-length edit inside the JSON header */
        char *h = memmem(w, n, hdr_from, strlen(hdr_from));
        if (h) memcpy(h, hdr_to, strlen(hdr_to));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    test_write_file(path, w, truncate_to ? truncate_to : n);
    free(w);
    return dir;
}

static void expect_load_error(const char *dir, sl_status code, const char *needle1,
                              const char *needle2) {
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1};
    CHECKF(dir != NULL, "fixture missing");
    if (!dir) return;
    sl_status st = sl_model_load(dir, &mp, &m, &err);
    CHECKF(st == code && m == NULL, "%s: status %d: %s", dir, st, err.msg);
    CHECKF(strstr(err.msg, needle1) && (!needle2 || strstr(err.msg, needle2)), "%s: '%s'", dir,
           err.msg);
    sl_model_free(m);
}

TEST(test_checkpoint_errors) {
    char p[600];
    snprintf(p, sizeof p, "%s/qwen3_gqa_untied/model.safetensors", test_fixtures);
    struct stat sb;
    if (stat(p, &sb) != 0) {
        CHECKF(0, "fixture %s missing", p);
        return;
    }
    /* Truncated: the last tensor's data runs past the end. */
    expect_load_error(make_case("trunc", NULL, NULL, (size_t)sb.st_size - 100, NULL, NULL),
                      SL_ERR_FORMAT, "model.safetensors", "past the end");
    /* Truncated inside the header. */
    expect_load_error(make_case("trunc_hdr", NULL, NULL, 40, NULL, NULL), SL_ERR_FORMAT,
                      "model.safetensors", "header");
    /* A tensor renamed away: missing tensor, named. */
    expect_load_error(make_case("missing", NULL, NULL, 0, "model.norm.weight", "model.norm.wEight"),
                      SL_ERR_SHAPE, "missing tensor", "model.norm.weight");
    /* Wrong dtype: BF16 -> I16 keeps the byte count. */
    expect_load_error(make_case("dtype", NULL, NULL, 0, "\"BF16\"", "\"I16\" "), SL_ERR_UNSUPPORTED,
                      "dtype I16", "model.safetensors");
    /* Wrong shape: the config says a bigger vocabulary than the embedding holds. */
    expect_load_error(make_case("shape", "\"vocab_size\": ", "\"vocab_size\": 1", 0, NULL, NULL),
                      SL_ERR_SHAPE, "expected shape", "embed_tokens");
    /* Issue 24: an rms_norm_eps that made every logit NaN is refused at load. */
    expect_load_error(
        make_case("eps", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1", 0, NULL, NULL),
        SL_ERR_FORMAT, "config.json: 'rms_norm_eps' = -1 is out of range", NULL);
    /* Unknown architecture. */
    expect_load_error(make_case("arch", "\"qwen3_moe\"", "\"llama4_moe\"", 0, NULL, NULL),
                      SL_ERR_UNSUPPORTED, "llama4_moe", "not supported");
    /* No such directory. */
    expect_load_error("/nonexistent/model", SL_ERR_IO, "/nonexistent/model: No such file", NULL);
}

/* What a MODEL path is: every wrong kind of path fails in one line naming it and saying
 * what to give instead, for loading and for verify. */
TEST(test_model_dir_errors) {
    char fix[600], path[700], dir[700];
    snprintf(fix, sizeof fix, "%s/qwen3_gqa_untied", test_fixtures);
    const char *tmp = test_tmpdir();
    int32_t packed = -1;
    sl_error err = {0};
    CHECK(sl_model_check_dir(fix, &packed, &err) == SL_OK && packed == 0);
    /* A file of a model directory: the directory is named. */
    snprintf(path, sizeof path, "%s/config.json", fix);
    snprintf(dir, sizeof dir, "give %s", fix);
    expect_load_error(path, SL_ERR_ARG, "config.json is a file", dir);
    err = (sl_error){0};
    CHECK(sl_verify(path, NULL, NULL, &err) == SL_ERR_ARG && strstr(err.msg, "is a file"));
    /* A file anywhere else. */
    snprintf(path, sizeof path, "%s/notes.txt", tmp);
    test_write_file(path, "x", 1);
    expect_load_error(path, SL_ERR_ARG, "notes.txt is a file, not a model directory", NULL);
    /* GGUF: a file by name, one by magic (both GGUF models, these ones truncated), and a
     * directory of them. */
    snprintf(path, sizeof path, "%s/model-Q4_K_M.gguf", tmp);
    test_write_file(path, "GGUF\3\0\0\0", 8);
    CHECK(sl_model_check_dir(path, &packed, &err) == SL_OK && packed == SL_MODEL_GGUF);
    expect_load_error(path, SL_ERR_FORMAT, "model-Q4_K_M.gguf: 8 bytes, too short", NULL);
    snprintf(path, sizeof path, "%s/renamed.bin", tmp);
    test_write_file(path, "GGUF\3\0\0\0", 8);
    CHECK(sl_model_check_dir(path, &packed, &err) == SL_OK && packed == SL_MODEL_GGUF);
    expect_load_error(path, SL_ERR_FORMAT, "renamed.bin: 8 bytes, too short", NULL);
    snprintf(dir, sizeof dir, "%s/gguf-only", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    test_write_file(path, "GGUF", 4);
    expect_load_error(dir, SL_ERR_ARG, "holds only GGUF files: give the GGUF file itself",
                      "m.gguf");
    /* Neither kind of directory. */
    snprintf(dir, sizeof dir, "%s/empty-dir", tmp);
    mkdir(dir, 0755);
    expect_load_error(dir, SL_ERR_IO, "empty-dir is not a model directory", "manifest.json");
    /* verify on a Hugging Face checkpoint. */
    err = (sl_error){0};
    CHECK(sl_verify(fix, NULL, NULL, &err) == SL_ERR_ARG);
    CHECKF(strstr(err.msg, "is a Hugging Face checkpoint, not a sluice pack"), "%s", err.msg);
    /* A pack without core.bin: loading and verify say so. */
    snprintf(dir, sizeof dir, "%s/pack-nocore", tmp);
    sl_pack_params pp = {.quant = SL_QUANT_INT8};
    err = (sl_error){0};
    CHECKF(sl_pack(fix, dir, &pp, &err) == SL_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/core.bin", dir);
    CHECK(unlink(path) == 0);
    expect_load_error(dir, SL_ERR_IO, "core.bin is missing", "sluice pack");
    err = (sl_error){0};
    CHECK(sl_verify(dir, NULL, NULL, &err) == SL_ERR_IO && strstr(err.msg, "core.bin is missing"));
}

/* sl_pack's output directory: never the source or around it, not empty unless forced. */
TEST(test_pack_out_dir) {
    char src[700], out[800], path[900];
    const char *tmp = test_tmpdir();
    /* A copy of the fixture, so nothing can ever be written into tests/fixtures. */
    snprintf(src, sizeof src, "%s/ck", tmp);
    snprintf(path, sizeof path, "cp -r '%s/qwen3_gqa_untied' '%s'", test_fixtures, src);
    CHECK(system(path) == 0);
    sl_pack_params pp = {.quant = SL_QUANT_INT8};
    sl_error err = {0};
    struct stat sb;
    /* OUT == SRC, also spelled differently: refused, even forced; nothing written. */
    snprintf(out, sizeof out, "%s/./", src);
    for (int force = 0; force < 2; force++) {
        pp.force = force;
        err = (sl_error){0};
        CHECK(sl_pack(src, out, &pp, &err) == SL_ERR_ARG);
        CHECKF(strstr(err.msg, "is the checkpoint being packed"), "%s", err.msg);
    }
    snprintf(path, sizeof path, "%s/core.bin", src);
    CHECK(stat(path, &sb) != 0);
    /* Inside SRC (new or existing), or holding it. */
    snprintf(out, sizeof out, "%s/sub", src);
    err = (sl_error){0};
    CHECK(sl_pack(src, out, &pp, &err) == SL_ERR_ARG &&
          strstr(err.msg, "is inside the checkpoint"));
    CHECK(stat(out, &sb) != 0); /* the directory made for the check is gone */
    err = (sl_error){0};
    CHECK(sl_pack(src, tmp, &pp, &err) == SL_ERR_ARG && strstr(err.msg, "holds the checkpoint"));
    /* Not empty: refused without force, packed with it; an empty one is fine. */
    pp.force = 0;
    snprintf(out, sizeof out, "%s/full", tmp);
    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/old.txt", out);
    test_write_file(path, "x", 1);
    err = (sl_error){0};
    CHECK(sl_pack(src, out, &pp, &err) == SL_ERR_ARG);
    CHECKF(strstr(err.msg, "full is not empty") && strstr(err.msg, "--force"), "%s", err.msg);
    pp.force = 1;
    err = (sl_error){0};
    CHECKF(sl_pack(src, out, &pp, &err) == SL_OK, "%s", err.msg);
    CHECK(sl_verify(out, NULL, NULL, &err) == SL_OK);
    snprintf(out, sizeof out, "%s/empty-out", tmp);
    mkdir(out, 0755);
    pp.force = 0;
    err = (sl_error){0};
    CHECKF(sl_pack(src, out, &pp, &err) == SL_OK, "%s", err.msg);
    /* OUT a file. */
    snprintf(out, sizeof out, "%s/old.txt", tmp);
    test_write_file(out, "x", 1);
    err = (sl_error){0};
    CHECK(sl_pack(src, out, &pp, &err) == SL_ERR_ARG && strstr(err.msg, "not a directory"));
}

/* The fuzz seeds are valid files, so fuzzing starts from the parsers' success paths. */
TEST(test_pack_seed_files_parse) {
    char *b;
    size_t n;
    sl_error err = {0};
    sl_st_file f = {0};
    b = slurp("tests/fuzz/seeds_pack/core.bin", &n);
    CHECK(b && sl_core_parse(&f, "core.bin", b, n, &err) == SL_OK && f.n_tensors == 2);
    const sl_tensor *q = b ? sl_st_find(&f, "b") : NULL;
    CHECK(q && q->dtype == SL_DTYPE_Q8 && q->shape[1] == 70 && q->scales && q->biases);
    sl_st_close(&f);
    /* Cut one byte: the size in the header no longer matches. */
    err = (sl_error){0};
    CHECK(b && sl_core_parse(&f, "core.bin", b, n - 1, &err) == SL_ERR_FORMAT);
    sl_st_close(&f);
    free(b);
    b = slurp("tests/fuzz/seeds_pack/experts.bin", &n);
    sl_experts_header h;
    err = (sl_error){0};
    CHECK(b && sl_experts_header_parse(&h, "e", b, n, n, &err) == SL_OK && h.n_experts == 2);
    CHECK(b && sl_experts_header_parse(&h, "e", b, n, n + 4096, &err) == SL_ERR_FORMAT);
    free(b);
}
