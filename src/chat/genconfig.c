/* generation_config.json reading (see genconfig.h). */
#include "chat/genconfig.h"

#include <jansson.h>
#include <sys/stat.h>

#include "format/gguf.h"

static float num_or(json_t *o, const char *key, float dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? (float)json_number_value(v) : dflt;
}

sl_status sl_gen_config_load(const char *dir, sl_gen_config *g, sl_error *err) {
    *g = (sl_gen_config){.bos = -1, .temperature = -1, .top_p = -1, .min_p = -1, .top_k = -1};
    if (sl_gguf_is_file(dir)) {
        sl_gguf_file f = {0};
        sl_status st = sl_gguf_open(&f, dir, err);
        if (!st) st = sl_gen_config_from_gguf(&f, g, err);
        sl_gguf_close(&f);
        return st;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return SL_OK;
    json_t *root;
    sl_status st = sl_json_load_file(path, &root, err);
    if (st) return st;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        g->eos[g->n_eos++] = (int32_t)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *v;
        json_array_foreach(eos, i, v) {
            if (json_is_integer(v) && g->n_eos < SL_MAX_EOS)
                g->eos[g->n_eos++] = (int32_t)json_integer_value(v);
        }
    }
    json_t *bos = json_object_get(root, "bos_token_id");
    if (json_is_integer(bos)) g->bos = (int32_t)json_integer_value(bos);
    if (json_is_true(json_object_get(root, "do_sample")) || !json_object_get(root, "do_sample")) {
        g->temperature = num_or(root, "temperature", -1);
        g->top_p = num_or(root, "top_p", -1);
        g->min_p = num_or(root, "min_p", -1);
        json_t *k = json_object_get(root, "top_k");
        if (json_is_integer(k)) g->top_k = (int32_t)json_integer_value(k);
    }
    json_decref(root);
    return SL_OK;
}

/* ---- from GGUF metadata ---------------------------------------------------------------- */

/* An optional token id key: *id = -1 when absent, else an integer below n. */
static sl_status gguf_id(const sl_gguf_file *f, const char *key, uint64_t n, int32_t *id,
                         sl_error *err) {
    *id = -1;
    if (!sl_gguf_find_kv(f, key)) return SL_OK;
    int64_t v;
    sl_status st = sl_gguf_get_i64(f, key, &v, err);
    if (st) return st;
    if (v < 0 || (uint64_t)v >= n)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' = %lld is not a token id (%llu tokens)",
                       f->path, key, (long long)v, (unsigned long long)n);
    *id = (int32_t)v;
    return SL_OK;
}

static void add_eos(sl_gen_config *g, int32_t id) {
    if (id >= 0 && !sl_gen_config_is_eos(g, id) && g->n_eos < SL_MAX_EOS) g->eos[g->n_eos++] = id;
}

sl_status sl_gen_config_from_gguf(const sl_gguf_file *f, sl_gen_config *g, sl_error *err) {
    *g = (sl_gen_config){.bos = -1, .temperature = -1, .top_p = -1, .min_p = -1, .top_k = -1};
    /* ids index tokenizer.ggml.tokens; without it, any id an int32 holds */
    const sl_gguf_kv *toks = NULL, *types = sl_gguf_find_kv(f, "tokenizer.ggml.token_type");
    uint64_t n = INT32_MAX;
    sl_status st = SL_OK;
    if (sl_gguf_find_kv(f, "tokenizer.ggml.tokens")) {
        st = sl_gguf_get_arr(f, "tokenizer.ggml.tokens", SL_GGUF_STRING, &toks, err);
        if (st) return st;
        n = toks->n;
    }
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t k = 0; k < sizeof eos_keys / sizeof eos_keys[0]; k++) {
        int32_t id;
        if ((st = gguf_id(f, eos_keys[k], n, &id, err))) return st;
        add_eos(g, id);
    }
    /* the control token <|endoftext|>, found by its text (tokenizer_gguf.c checks the arrays;
     * here an ill-typed token_type only means no such token) */
    if (toks && types && types->type == SL_GGUF_ARRAY && types->n == n &&
        types->arr_type != SL_GGUF_STRING && types->arr_type != SL_GGUF_F32 &&
        types->arr_type != SL_GGUF_F64 && types->arr_type != SL_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++) {
            const sl_gguf_str s = sl_gguf_arr_str(toks, i);
            if (s.len == 13 && !memcmp(s.s, "<|endoftext|>", 13) &&
                sl_gguf_arr_int(types, i) == 3 /* control */)
                add_eos(g, (int32_t)i);
        }
    if ((st = gguf_id(f, "tokenizer.ggml.bos_token_id", n, &g->bos, err))) return st;
    if (sl_gguf_find_kv(f, "tokenizer.ggml.add_bos_token") &&
        (st = sl_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &g->add_bos, err)))
        return st;
    struct {
        const char *key;
        float *out;
    } fl[] = {{"general.sampling.temp", &g->temperature},
              {"general.sampling.top_p", &g->top_p},
              {"general.sampling.min_p", &g->min_p}};
    for (size_t k = 0; k < sizeof fl / sizeof fl[0]; k++)
        if (sl_gguf_find_kv(f, fl[k].key) && (st = sl_gguf_get_f32(f, fl[k].key, fl[k].out, err)))
            return st;
    if (sl_gguf_find_kv(f, "general.sampling.top_k")) {
        uint32_t k;
        if ((st = sl_gguf_get_u32(f, "general.sampling.top_k", &k, err))) return st;
        g->top_k = (int32_t)SL_MIN(k, (uint32_t)INT32_MAX);
    }
    return SL_OK;
}

int sl_gen_config_is_eos(const sl_gen_config *g, int32_t id) {
    for (int32_t i = 0; i < g->n_eos; i++)
        if (g->eos[i] == id) return 1;
    return 0;
}
