/*
 * POST /tokenize and /detokenize, in llama.cpp's server's shapes:
 *
 *   /tokenize    {"content": "...", "add_special": false, "parse_special": true}
 *                -> {"tokens": [ids]}
 *   /detokenize  {"tokens": [ids]} -> {"content": "..."}
 *
 * "prompt" and "text" are taken for "content" too (the names OpenAI-style clients use).
 * Both run on the HTTP thread (the tokenizer is read-only): no job, no model.
 */
#include "server/internal.h"

/* content (or prompt, text) -> its ids. add_special: the ids tokenizer(text) puts first
 * (BOS), as a completions prompt gets them; parse_special: special tokens' text becomes
 * those tokens, as in a completions prompt (false: text, as in a chat message). */
static int tokenize(srv *s, json_t *req, json_t **out) {
    const char *key = json_object_get(req, "content")  ? "content"
                      : json_object_get(req, "prompt") ? "prompt"
                                                       : "text";
    json_t *v = json_object_get(req, key);
    if (!json_is_string(v)) return srv_bad(out, "content", "'content' must be a string");
    int32_t add_special = 0, parse_special = 1;
    int rc;
    if ((rc = srv_get_bool(req, "add_special", &add_special, out)) ||
        (rc = srv_get_bool(req, "parse_special", &parse_special, out)))
        return rc;
    sl_token_ids ids = {0};
    sl_error err = {0};
    const char *text = json_string_value(v);
    const size_t len = json_string_length(v);
    sl_status st = add_special && parse_special
                       ? sl_tokenizer_encode_prompt(s->tok, text, len, &ids, &err)
                       : sl_tokenizer_encode_ex(s->tok, text, len,
                                                parse_special ? 0 : SL_TOK_NO_SPECIAL, &ids, &err);
    if (st) {
        sl_token_ids_free(&ids);
        return st == SL_ERR_NOMEM ? 500 : srv_bad(out, "content", "%s", err.msg);
    }
    /* Without parse_special the text cannot hold the BOS ids already: they go first. */
    const int32_t *bos = NULL;
    const int32_t n_bos = add_special && !parse_special ? sl_tokenizer_bos(s->tok, &bos) : 0;
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n_bos; i++)
        json_array_append_new(a, json_integer(bos[i]));
    for (size_t i = 0; a && i < ids.n; i++)
        json_array_append_new(a, json_integer(ids.ids[i]));
    sl_token_ids_free(&ids);
    *out = a ? json_pack("{s:o}", "tokens", a) : NULL;
    return *out ? 200 : 500;
}

/* tokens -> the text they decode to, special tokens' text included. */
static int detokenize(srv *s, json_t *req, json_t **out) {
    json_t *v = json_object_get(req, "tokens");
    if (!json_is_array(v)) return srv_bad(out, "tokens", "'tokens' must be an array of token ids");
    const int32_t n_ids = sl_tokenizer_vocab_size(s->tok);
    const size_t n = json_array_size(v);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return 500;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= n_ids) {
            free(ids);
            return srv_bad(out, "tokens", "tokens[%zu] must be a token id in [0, %d)", i, n_ids);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    char *text = NULL;
    size_t len = 0;
    sl_error err = {0};
    sl_status st = sl_tokenizer_decode(s->tok, ids, n, 0, &text, &len, &err);
    free(ids);
    if (st) return st == SL_ERR_NOMEM ? 500 : srv_bad(out, "tokens", "%s", err.msg);
    *out = json_pack("{s:o}", "content", srv_text_json(text, len));
    free(text);
    return *out ? 200 : 500;
}

int srv_tokenize(srv *s, int detok, const char *body, size_t len, json_t **out) {
    json_t *req = srv_load_body(body, len, out);
    if (!req) return 400;
    int rc = !json_is_object(req) ? srv_bad(out, NULL, "the request body must be a JSON object")
             : detok              ? detokenize(s, req, out)
                                  : tokenize(s, req, out);
    json_decref(req);
    return rc;
}
