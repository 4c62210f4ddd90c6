/* The generation loop shared by run, chat and serve (see generate.h). */
#include "gen/generate.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

void sl_gen_seq_free(sl_gen_seq *q) {
    free(q->logits), free(q->ctx_ids), free(q->reply);
    sl_sampler_free(q->smp);
    sl_session_free(q->s);
    memset(q, 0, sizeof *q);
}

void sl_gen_free(sl_gen *g) {
    sl_gen_seq_free(&g->seq);
    sl_tokenizer_free(g->tok);
    sl_model_free(g->m);
    memset(g, 0, sizeof *g);
}

void sl_gen_forget(sl_gen_seq *q) {
    sl_session_reset(q->s);
    q->n_ctx = 0;
}

void sl_gen_reset(sl_gen *g) {
    sl_gen_forget(&g->seq);
}

sl_status sl_gen_seq_init(sl_gen *g, sl_gen_seq *q, sl_error *err) {
    memset(q, 0, sizeof *q);
    q->logits = malloc((size_t)g->info.vocab_size * sizeof(float));
    q->ctx_ids = malloc((size_t)g->sp.max_ctx * sizeof(int32_t));
    if (!q->logits || !q->ctx_ids) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    return sl_session_create(g->m, &g->sp, &q->s, err);
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
    g->sp = (sl_session_params){.max_ctx = ctx, .max_batch = su->max_batch};
    return sl_gen_seq_init(g, &g->seq, err);
}

static sl_status reply_append(sl_gen_seq *q, const char *s, size_t n, sl_error *err) {
    if (sl_append(&q->reply, &q->reply_len, &q->reply_cap, s, n))
        return sl_fail(err, SL_ERR_NOMEM, "out of memory (a reply of %zu bytes)", q->reply_len + n);
    return SL_OK;
}

int32_t sl_gen_cached(const sl_gen_seq *q, const int32_t *ids, int32_t n) {
    int32_t keep = 0;
    while (keep < q->n_ctx && keep < n && q->ctx_ids[keep] == ids[keep])
        keep++;
    return keep;
}

sl_status sl_gen_begin(sl_gen *g, sl_gen_seq *q, const int32_t *ids, int32_t n,
                       const sl_gen_params *p, sl_gen_result *res, sl_error *err) {
    *res = (sl_gen_result){.prompt_tokens = n, .finish = SL_GEN_LENGTH};
    q->r = (sl_gen_run){.p = p, .res = res, .ids = ids, .n = n};
    sl_detok_init(&q->r.d, g->tok, !p->keep_special);
    q->reply_len = 0;
    if (q->reply) q->reply[0] = '\0';
    for (int32_t i = 0; i < p->n_stops; i++)
        q->r.hold = SL_MAX(q->r.hold, strlen(p->stops[i]) - 1);
    const int32_t room = sl_session_max_ctx(q->s);
    if ((int64_t)n + 1 > room)
        return sl_fail(err, SL_ERR_ARG,
                       "the prompt (%d tokens) does not fit the context of %d tokens (one more "
                       "is needed to reply)",
                       n, room);
    if (n < 1) return sl_fail(err, SL_ERR_ARG, "empty prompt");
    /* Reuse the longest prefix already in the KV cache. */
    int32_t keep = sl_gen_cached(q, ids, n);
    if (keep == n) keep--; /* need at least one token to get logits */
    for (int32_t i = p->accept_prompt ? 0 : keep; i < n; i++)
        sl_sampler_accept(q->smp, ids[i]);
    /* Models with recurrent (linear-attention) state cannot rewind: run it all again. */
    int32_t from = keep;
    if (sl_session_rewind(q->s, keep) != 0) {
        sl_session_reset(q->s);
        from = 0;
    }
    q->n_ctx = from; /* what the cache holds if the forward fails */
    q->r.done = from;
    res->cached_tokens = from;
    return SL_OK;
}

sl_status sl_gen_prefill(sl_gen_seq *q, int32_t max_tokens, int32_t *left, sl_error *err) {
    sl_gen_run *r = &q->r;
    const int32_t T = SL_MIN(SL_MAX(max_tokens, 1), r->n - r->done);
    const int last = r->done + T == r->n; /* the logits of the prompt's end only */
    sl_status st = sl_session_forward(q->s, r->ids + r->done, T, last ? q->logits : NULL, 0, err);
    if (st) {
        sl_gen_forget(q);
        return st;
    }
    memcpy(q->ctx_ids + r->done, r->ids + r->done, (size_t)T * sizeof(int32_t));
    r->done += T;
    q->n_ctx = r->done;
    *left = r->n - r->done;
    return SL_OK;
}

int sl_gen_sample(sl_gen *g, sl_gen_seq *q, sl_status *st, sl_error *err) {
    sl_gen_run *r = &q->r;
    const sl_gen_params *p = r->p;
    sl_gen_result *res = r->res;
    *st = SL_OK;
    if (r->k >= p->max_tokens) return 0;
    if (p->cancelled && p->cancelled(p->user)) {
        r->cancelled = 1;
        return 0;
    }
    const int32_t n_text = sl_tokenizer_vocab_size(g->tok), V = g->info.vocab_size;
    /* Ids past the tokenizer's (padding rows of the head) have no text: never pick them. */
    for (int32_t i = n_text; i < V; i++)
        q->logits[i] = -INFINITY;
    for (int32_t i = 0; p->ignore_eos && i < g->gen.n_eos; i++)
        if (g->gen.eos[i] >= 0 && g->gen.eos[i] < V) q->logits[g->gen.eos[i]] = -INFINITY;
    if (p->mask) p->mask(p->constraint, q->logits, V);
    const int32_t id = sl_sampler_sample(q->smp, q->logits);
    if (p->accept) p->accept(p->constraint, id);
    r->k++;
    if (sl_gen_config_is_eos(&g->gen, id)) {
        res->finish = SL_GEN_STOP;
        return 0;
    }
    res->completion_tokens++;
    if (p->token) {
        sl_token_logprob top[SL_GEN_MAX_TOP_LOGPROBS];
        const int32_t n_top =
            SL_MAX(0, SL_MIN(SL_MIN(p->top_logprobs, SL_GEN_MAX_TOP_LOGPROBS), V));
        const float lp = sl_sampler_logprobs(
            q->logits, V, sl_sampler_get_params(q->smp)->temperature, id, top, n_top);
        p->token(p->user, id, lp, top, n_top);
    }
    const char *piece;
    size_t len;
    if ((*st = sl_detok_push(&r->d, id, &piece, &len, err)) ||
        (*st = reply_append(q, piece, len, err)))
        return 0;
    /* Emit all but the last `hold` bytes, which may begin a stop string; a stop
     * string found in the unemitted text ends the reply just before it. */
    size_t upto = q->reply_len > r->hold ? q->reply_len - r->hold : 0;
    if (upto < r->printed) upto = r->printed;
    for (int32_t i = 0; i < p->n_stops; i++) {
        const char *hit = strstr(q->reply + r->printed, p->stops[i]);
        if (hit && (!r->stopped || (size_t)(hit - q->reply) < upto)) {
            upto = (size_t)(hit - q->reply);
            r->stopped = 1;
            res->stop_hit = i + 1;
        }
    }
    if (upto > r->printed) {
        if (p->emit && p->emit(p->user, q->reply + r->printed, upto - r->printed))
            r->cancelled = r->emit_failed = 1;
        r->printed = upto;
    }
    if (r->stopped) {
        res->finish = SL_GEN_STOP;
        q->reply_len = upto;
        q->reply[upto] = '\0';
        return 0;
    }
    if (r->cancelled) return 0;
    if (q->n_ctx >= sl_session_max_ctx(q->s)) {
        /* context full: the id stays out of the cache and the history */
        res->ctx_full = r->k < p->max_tokens;
        return 0;
    }
    sl_sampler_accept(q->smp, id);
    q->ctx_ids[q->n_ctx++] = id;
    r->next = id;
    return 1;
}

sl_status sl_gen_end(sl_gen_seq *q, sl_status st, sl_error *err) {
    sl_gen_run *r = &q->r;
    const sl_gen_params *p = r->p;
    const char *rest;
    size_t rest_len;
    if (!st && !r->stopped && !sl_detok_flush(&r->d, &rest, &rest_len, err))
        st = reply_append(q, rest, rest_len, err);
    if (!st && !r->stopped && !r->emit_failed && q->reply_len > r->printed && p->emit)
        p->emit(p->user, q->reply + r->printed, q->reply_len - r->printed);
    sl_detok_free(&r->d);
    if (r->cancelled) r->res->finish = SL_GEN_CANCELLED;
    r->ids = NULL;
    return st;
}

sl_status sl_gen_reply(sl_gen *g, const int32_t *ids, int32_t n, const sl_gen_params *p,
                       sl_gen_result *res, sl_error *err) {
    sl_gen_seq *q = &g->seq;
    sl_status st = sl_gen_begin(g, q, ids, n, p, res, err);
    for (int32_t left = 1; !st && left > 0;)
        st = sl_gen_prefill(q, INT32_MAX, &left, err);
    while (!st && sl_gen_sample(g, q, &st, err))
        if ((st = sl_session_forward(q->s, &q->r.next, 1, q->logits, 0, err))) sl_gen_forget(q);
    return sl_gen_end(q, st, err);
}
