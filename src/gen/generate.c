/* The generation loop shared by run, chat and serve (see generate.h). */
#include "gen/generate.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

void sl_gen_free(sl_gen *g) {
    free(g->logits), free(g->ctx_ids), free(g->reply);
    sl_sampler_free(g->smp);
    sl_tokenizer_free(g->tok);
    sl_session_free(g->s);
    sl_model_free(g->m);
    memset(g, 0, sizeof *g);
}

void sl_gen_reset(sl_gen *g) {
    sl_session_reset(g->s);
    g->n_ctx = 0;
}

sl_status sl_gen_init(sl_gen *g, const sl_gen_setup *su, sl_error *err) {
    /* What MODEL is comes first (a file, a GGUF, a partial pack: the loader's one clear line),
     * since the tokenizer is read before the model. */
    int32_t kind;
    sl_status st = sl_model_check_dir(su->model, &kind, err);
    if (st) return st;
    /* A GGUF carries its tokenizer in its metadata (sl_tokenizer_load reads it, and says first
     * when the file does not parse). */
    /* A model directory without its tokenizer (a pack made without one, a bare checkpoint):
     * say where else it can come from. */
    struct stat sb;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", su->model);
    if (!su->tokenizer && kind != SL_MODEL_GGUF && stat(path, &sb))
        return sl_fail(err, SL_ERR_ARG,
                       "%s has no tokenizer.json: pass --tokenizer PATH (a tokenizer.json, or "
                       "a directory with one)",
                       su->model);
    st = sl_tokenizer_load(su->tokenizer ? su->tokenizer : su->model, &g->tok, err);
    if (!st)
        st = su->template_name ? sl_chat_template_from_name(su->template_name, &g->tpl, err)
                               : sl_chat_template_detect(su->model, &g->tpl, err);
    if (!st) st = sl_gen_config_load(su->model, &g->gen, err);
    if (st) return st;
    if (su->raw) g->tpl.kind = SL_TEMPLATE_RAW;
    /* End of turn: the template's <|im_end|> too. */
    int32_t im_end = sl_tokenizer_token_to_id(g->tok, "<|im_end|>");
    if (im_end >= 0 && !sl_gen_config_is_eos(&g->gen, im_end) && g->gen.n_eos < SL_MAX_EOS)
        g->gen.eos[g->gen.n_eos++] = im_end;
    if ((st = sl_model_load(su->model, &su->model_params, &g->m, err))) return st;
    sl_model_get_info(g->m, &g->info);
    if (sl_tokenizer_vocab_size(g->tok) > g->info.vocab_size)
        return sl_fail(err, SL_ERR_SHAPE, "%s: the tokenizer has %d ids but the model only %d",
                       su->tokenizer ? su->tokenizer : su->model, sl_tokenizer_vocab_size(g->tok),
                       g->info.vocab_size);
    const int32_t ctx = su->max_ctx ? su->max_ctx : SL_MIN(g->info.max_position, 8192);
    sl_session_params sp = {.max_ctx = ctx, .max_batch = su->max_batch};
    g->logits = malloc((size_t)g->info.vocab_size * sizeof(float));
    g->ctx_ids = malloc((size_t)ctx * sizeof(int32_t));
    if (!g->logits || !g->ctx_ids) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    return sl_session_create(g->m, &sp, &g->s, err);
}

static sl_status reply_append(sl_gen *g, const char *s, size_t n, sl_error *err) {
    if (g->reply_len + n + 1 > g->reply_cap) {
        size_t cap = (g->reply_len + n + 1) * 2;
        char *r = realloc(g->reply, cap);
        if (!r) return sl_fail(err, SL_ERR_NOMEM, "out of memory (reply of %zu bytes)", cap);
        g->reply = r;
        g->reply_cap = cap;
    }
    memcpy(g->reply + g->reply_len, s, n);
    g->reply_len += n;
    g->reply[g->reply_len] = '\0';
    return SL_OK;
}

/* Prefills ids after the cached prefix; the last position's logits end in g->logits. */
static sl_status prefill(sl_gen *g, const int32_t *ids, int32_t n, const sl_gen_params *p,
                         sl_gen_result *res, sl_error *err) {
    const int32_t room = sl_session_max_ctx(g->s);
    if ((int64_t)n + 1 > room)
        return sl_fail(err, SL_ERR_ARG,
                       "the prompt (%d tokens) does not fit the context of %d tokens (one more "
                       "is needed to reply)",
                       n, room);
    if (n < 1) return sl_fail(err, SL_ERR_ARG, "empty prompt");
    /* Reuse the longest prefix already in the KV cache. */
    int32_t keep = 0;
    while (keep < g->n_ctx && keep < n && g->ctx_ids[keep] == ids[keep])
        keep++;
    if (keep == n) keep--; /* need at least one token to get logits */
    for (int32_t i = p->accept_prompt ? 0 : keep; i < n; i++)
        sl_sampler_accept(g->smp, ids[i]);
    /* Models with recurrent (linear-attention) state cannot rewind: run it all again. */
    int32_t from = keep;
    if (sl_session_rewind(g->s, keep) != 0) {
        sl_session_reset(g->s);
        from = 0;
    }
    g->n_ctx = from; /* what the cache holds if the forward fails */
    sl_status st = sl_session_forward(g->s, ids + from, n - from, g->logits, 0, err);
    if (st) {
        sl_session_reset(g->s);
        g->n_ctx = 0;
        return st;
    }
    memcpy(g->ctx_ids + from, ids + from, (size_t)(n - from) * sizeof(int32_t));
    g->n_ctx = n;
    res->cached_tokens = from;
    return SL_OK;
}

sl_status sl_gen_reply(sl_gen *g, const int32_t *ids, int32_t n, const sl_gen_params *p,
                       sl_gen_result *res, sl_error *err) {
    *res = (sl_gen_result){.prompt_tokens = n, .finish = SL_GEN_LENGTH};
    g->reply_len = 0;
    if (g->reply) g->reply[0] = '\0';
    sl_status st = prefill(g, ids, n, p, res, err);
    if (st) return st;
    const int32_t room = sl_session_max_ctx(g->s);
    const int32_t n_text = sl_tokenizer_vocab_size(g->tok);

    sl_detok d;
    sl_detok_init(&d, g->tok, !p->keep_special);
    size_t printed = 0, hold = 0;
    for (int32_t i = 0; i < p->n_stops; i++)
        hold = SL_MAX(hold, strlen(p->stops[i]) - 1);
    int stopped = 0, cancelled = 0, emit_failed = 0;
    for (int32_t k = 0; k < p->max_tokens && !stopped; k++) {
        if (p->cancelled && p->cancelled(p->user)) {
            cancelled = 1;
            break;
        }
        /* Ids past the tokenizer's (padding rows of the head) have no text: never pick them. */
        for (int32_t i = n_text; i < g->info.vocab_size; i++)
            g->logits[i] = -INFINITY;
        for (int32_t i = 0; p->ignore_eos && i < g->gen.n_eos; i++)
            if (g->gen.eos[i] >= 0 && g->gen.eos[i] < g->info.vocab_size)
                g->logits[g->gen.eos[i]] = -INFINITY;
        if (p->mask) p->mask(p->constraint, g->logits, g->info.vocab_size);
        const int32_t id = sl_sampler_sample(g->smp, g->logits);
        if (p->accept) p->accept(p->constraint, id);
        if (sl_gen_config_is_eos(&g->gen, id)) {
            res->finish = SL_GEN_STOP;
            break;
        }
        res->completion_tokens++;
        if (p->token) {
            sl_token_logprob top[SL_GEN_MAX_TOP_LOGPROBS];
            const int32_t n_top = SL_MAX(
                0, SL_MIN(SL_MIN(p->top_logprobs, SL_GEN_MAX_TOP_LOGPROBS), g->info.vocab_size));
            const float lp =
                sl_sampler_logprobs(g->logits, g->info.vocab_size,
                                    sl_sampler_get_params(g->smp)->temperature, id, top, n_top);
            p->token(p->user, id, lp, top, n_top);
        }
        const char *piece;
        size_t len;
        if ((st = sl_detok_push(&d, id, &piece, &len, err)) ||
            (st = reply_append(g, piece, len, err)))
            break;
        /* Emit all but the last `hold` bytes, which may begin a stop string; a stop
         * string found in the unemitted text ends the reply just before it. */
        size_t upto = g->reply_len > hold ? g->reply_len - hold : 0;
        if (upto < printed) upto = printed;
        for (int32_t i = 0; i < p->n_stops; i++) {
            const char *hit = strstr(g->reply + printed, p->stops[i]);
            if (hit && (!stopped || (size_t)(hit - g->reply) < upto)) {
                upto = (size_t)(hit - g->reply);
                stopped = 1;
                res->stop_hit = i + 1;
            }
        }
        if (upto > printed) {
            if (p->emit && p->emit(p->user, g->reply + printed, upto - printed))
                cancelled = emit_failed = 1;
            printed = upto;
        }
        if (stopped) {
            res->finish = SL_GEN_STOP;
            g->reply_len = upto;
            g->reply[upto] = '\0';
            break;
        }
        if (cancelled) break;
        if (g->n_ctx >= room) { /* context full: the id stays out of the cache and the history */
            res->ctx_full = k + 1 < p->max_tokens;
            break;
        }
        sl_sampler_accept(g->smp, id);
        g->ctx_ids[g->n_ctx++] = id;
        if ((st = sl_session_forward(g->s, &id, 1, g->logits, 0, err))) {
            sl_session_reset(g->s);
            g->n_ctx = 0;
            break;
        }
    }
    const char *rest;
    size_t rest_len;
    if (!st && !stopped && !sl_detok_flush(&d, &rest, &rest_len, err))
        st = reply_append(g, rest, rest_len, err);
    if (!st && !stopped && !emit_failed && g->reply_len > printed && p->emit)
        p->emit(p->user, g->reply + printed, g->reply_len - printed);
    sl_detok_free(&d);
    if (cancelled) res->finish = SL_GEN_CANCELLED;
    return st;
}
