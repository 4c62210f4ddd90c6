/*
 * The generation loop shared by `run`, `chat` and `serve`: one model, its
 * tokenizer, chat template and generation_config, one session whose KV cache
 * is reused between replies, and the loop prompt -> prefill -> sample ->
 * detokenize, with stop strings held back until they can be ruled out.
 *
 * Library code: errors come back as an sl_status with the sl_error filled;
 * nothing is printed. What a caller may want to report comes back in the
 * sl_gen (info: the load details, pack version) and in sl_gen_result (a
 * reply cut by the end of the context).
 *
 * An sl_gen is used by one thread at a time (the server's model worker owns
 * it); the tokenizer alone may be shared with other threads (it is read-only).
 */
#ifndef SL_GEN_GENERATE_H
#define SL_GEN_GENERATE_H

#include "chat/genconfig.h"
#include "chat/template.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

/* The reply a sequence is forming (between sl_gen_begin and sl_gen_end); see below. */
typedef struct sl_gen_params sl_gen_params;
typedef struct sl_gen_result sl_gen_result;
typedef struct sl_gen_run {
    const sl_gen_params *p;
    sl_gen_result *res;
    const int32_t *ids; /* the prompt (the caller's, until its prefill is done) */
    int32_t n, done;    /* its length, and how much of it the cache holds */
    sl_detok d;
    size_t printed, hold; /* reply bytes emitted; bytes held back for the stop strings */
    int32_t k;            /* tokens sampled */
    int stopped, cancelled, emit_failed;
    int32_t next; /* the id to run next when sl_gen_sample returned 1 */
} sl_gen_run;

/* One sequence: its session (the KV cache, reused between replies), sampler, the ids its
 * cache holds, and its reply. A server keeps several, decoded together (sl_batch_decode). */
typedef struct sl_gen_seq {
    sl_session *s;
    sl_sampler *smp;  /* created by the caller once the sampling parameters are known */
    float *logits;    /* [vocab_size] the next token's */
    int32_t *ctx_ids; /* [max_ctx] ids in the KV cache, for prefix reuse */
    int32_t n_ctx;
    char *reply; /* the last reply's text, NUL-terminated (without a stop string) */
    size_t reply_len, reply_cap;
    sl_gen_run r;
} sl_gen_seq;

typedef struct sl_gen {
    sl_model *m;
    sl_model_info info;
    sl_tokenizer *tok;
    sl_chat_template tpl;
    sl_gen_config gen;    /* eos ids include the template's <|im_end|> */
    sl_gen_seq seq;       /* the first sequence (run and chat use it alone) */
    sl_session_params sp; /* what each sequence's session is made with */
} sl_gen;

/* What sl_gen_init loads. */
typedef struct sl_gen_setup {
    const char *model;
    const char *tokenizer;     /* NULL: the model directory's tokenizer.json */
    const char *template_name; /* NULL: detected from the model */
    int32_t raw;               /* no chat template */
    sl_model_params model_params;
    int32_t max_ctx;   /* KV cache length; 0 = the model's positions, at most 8192 */
    int32_t max_batch; /* 0 = the session's default */
} sl_gen_setup;

/* Loads tokenizer, template, generation_config, model and session (not the sampler).
 * On failure g->m is set when the model itself loaded (the caller may still report on
 * it); call sl_gen_free in both cases. */
sl_status sl_gen_init(sl_gen *g, const sl_gen_setup *setup, sl_error *err);
void sl_gen_free(sl_gen *g);
/* Forgets g->seq's KV cache (and what it held): the next reply runs its whole prompt. */
void sl_gen_reset(sl_gen *g);

typedef enum sl_gen_finish {
    SL_GEN_STOP = 0,      /* end-of-turn / EOS id, or a stop string */
    SL_GEN_LENGTH = 1,    /* max_tokens reached or the context is full */
    SL_GEN_CANCELLED = 2, /* cancelled() or emit() asked to stop */
} sl_gen_finish;

/* The most alternatives sl_gen_params.top_logprobs may ask for (OpenAI's limit). */
#define SL_GEN_MAX_TOP_LOGPROBS 20

struct sl_gen_params {
    int32_t max_tokens;
    const char *const *stops; /* end the reply just before any of these texts */
    int32_t n_stops;
    /* 1: the sampler's penalty history receives the whole prompt (a fresh sampler);
     * 0: only the part not already in the KV cache (a sampler kept across turns). */
    int32_t accept_prompt;
    int32_t ignore_eos; /* never sample the EOS / end-of-turn ids (benchmarks, tests) */
    /* the reply's text keeps special tokens' text (<|channel|>...): for a reply read by its
     * template's layout (chat/reply.h); else they are dropped */
    int32_t keep_special;
    /* Text ready to show (whole UTF-8 characters, never part of a stop string);
     * nonzero return cancels. May be NULL. */
    int (*emit)(void *user, const char *text, size_t len);
    /* Called with each id sampled into the reply (not an end-of-turn id), before its text
     * is emitted, with its log-probability and the top_logprobs (at most
     * SL_GEN_MAX_TOP_LOGPROBS) most likely ids of the distribution it was drawn from
     * (sl_sampler_logprobs at g->smp's temperature). May be NULL: nothing is computed. */
    void (*token)(void *user, int32_t id, float logprob, const sl_token_logprob *top,
                  int32_t n_top);
    int32_t top_logprobs;
    /* Polled once per token; nonzero cancels. May be NULL. */
    int (*cancelled)(void *user);
    void *user;
    /* Constrained decoding (sampler/json_constraint.h): mask sets -INFINITY on the logits of
     * the ids that may not come next, right before each draw (after the padding and
     * ignore_eos masks; n: the logits' length); accept is told each id drawn, the EOS /
     * end-of-turn one included. Both get constraint, and may be NULL. */
    void (*mask)(void *constraint, float *logits, int32_t n);
    void (*accept)(void *constraint, int32_t id);
    void *constraint;
};

struct sl_gen_result {
    int32_t prompt_tokens;     /* ids given */
    int32_t cached_tokens;     /* of which reused from the KV cache */
    int32_t completion_tokens; /* tokens sampled into the reply (EOS not counted) */
    sl_gen_finish finish;
    int32_t ctx_full; /* the reply stopped at the end of the context, before max_tokens */
    int32_t stop_hit; /* finish STOP at a stop string: 1 + its index in p->stops; 0: not */
};

/* Runs the prompt ids after the longest prefix of them already in the KV cache
 * (or from scratch for models that cannot rewind), then samples a reply with
 * g->seq.smp, emitting its text as it forms; the full reply ends in g->seq.reply.
 * SL_ERR_ARG when the prompt does not fit the context (message gives both numbers). */
sl_status sl_gen_reply(sl_gen *g, const int32_t *ids, int32_t n, const sl_gen_params *p,
                       sl_gen_result *res, sl_error *err);

/*
 * The same reply in steps, for a caller running several sequences at once:
 *
 *   sl_gen_begin      the prompt's cached prefix found, nothing run yet
 *   sl_gen_prefill    at most max_tokens more of the prompt, until *left is 0
 *   sl_gen_sample     a token sampled and emitted: 1 when q->r.next is to run next (the
 *                     caller runs it at q->s's position into q->logits: sl_session_forward, or
 *                     a row of sl_batch_decode), 0 when the reply is over
 *   sl_gen_end        always, once begun: the text held back, the result; returns the status
 *                     the reply ended with (st, or a failure of its own)
 *
 * A forward the caller ran for the sequence that failed: sl_gen_end(q, st) after
 * sl_gen_forget (its cache may hold positions computed from bad data).
 * p, res and ids stay the caller's until sl_gen_end (ids until the prefill is done).
 */
sl_status sl_gen_begin(sl_gen *g, sl_gen_seq *q, const int32_t *ids, int32_t n,
                       const sl_gen_params *p, sl_gen_result *res, sl_error *err);
sl_status sl_gen_prefill(sl_gen_seq *q, int32_t max_tokens, int32_t *left, sl_error *err);
int sl_gen_sample(sl_gen *g, sl_gen_seq *q, sl_status *st, sl_error *err);
sl_status sl_gen_end(sl_gen_seq *q, sl_status st, sl_error *err);

/* A second (third, ...) sequence of g, like g->seq; sl_gen_seq_free releases one (g->seq is
 * sl_gen_free's). */
sl_status sl_gen_seq_init(sl_gen *g, sl_gen_seq *q, sl_error *err);
void sl_gen_seq_free(sl_gen_seq *q);
/* Forgets q's KV cache (and what it held). */
void sl_gen_forget(sl_gen_seq *q);
/* How many of ids[0, n) q's cache holds already (the prefix a reply would reuse). */
int32_t sl_gen_cached(const sl_gen_seq *q, const int32_t *ids, int32_t n);

#endif /* SL_GEN_GENERATE_H */
