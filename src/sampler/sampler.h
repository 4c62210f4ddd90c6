/*
 * Token sampling: turns a row of logits into the next token id.
 *
 * Order of the steps (each off at its neutral value):
 *   1. penalties over the last penalty_last_n tokens of the context:
 *      repetition (CTRL/HF: positive logits divided, negative multiplied),
 *      presence (minus once if seen), frequency (minus per occurrence);
 *      then logit_bias added to the logits of its ids (OpenAI's: +-100 forces or bans)
 *   2. temperature 0: greedy argmax (ties to the lower id), done
 *   3. top-k: keep the k largest logits
 *   4. softmax of logits / temperature
 *   5. top-p: keep the smallest set of most likely tokens whose mass >= p
 *   6. min-p: drop tokens whose probability < min_p x the largest
 *   7. draw from what is left with the seeded generator
 * All scratch is allocated at sl_sampler_create; sampling allocates nothing.
 */
#ifndef SL_SAMPLER_H
#define SL_SAMPLER_H

#include "core/common.h"

/* A bias added to one id's logit before sampling. */
typedef struct sl_logit_bias {
    int32_t id;
    float bias;
} sl_logit_bias;

typedef struct sl_sampler_params {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    int32_t penalty_last_n;   /* the penalties' window: the last N tokens (default 64); 0 = off */
    uint64_t seed;
    /* [n_logit_bias] biases (ids in [0, vocab), finite); sl_sampler_create copies them,
     * so the array need only live until then. An id given twice gets both. */
    const sl_logit_bias *logit_bias;
    int32_t n_logit_bias;
} sl_sampler_params;

/* Neutral parameters: greedy, no filters, no penalties. */
sl_sampler_params sl_sampler_defaults(void);

typedef struct sl_sampler sl_sampler;

sl_status sl_sampler_create(const sl_sampler_params *p, int32_t vocab, sl_sampler **out,
                            sl_error *err);
void sl_sampler_free(sl_sampler *s);
/* Restarts the random stream from the seed and forgets the history. */
void sl_sampler_reset(sl_sampler *s);
/* Adds a token of the context (prompt or generated) to the penalty history. */
void sl_sampler_accept(sl_sampler *s, int32_t id);
/* Picks the next id. logits is modified in place (penalties, logit bias): what is left in it
 * is what the draw was made from, before the temperature (see sl_sampler_logprobs). */
int32_t sl_sampler_sample(sl_sampler *s, float *logits);

/* The parameters s was made with. */
const sl_sampler_params *sl_sampler_get_params(const sl_sampler *s);

/* One id and its log-probability. */
typedef struct sl_token_logprob {
    int32_t id;
    float logprob;
} sl_token_logprob;

/*
 * Log-probabilities of logits[vocab] (as sl_sampler_sample leaves them: penalties and
 * logit bias applied) at the temperature (0, greedy, counts as 1: the distribution the
 * argmax was taken from): log softmax(logits / T), computed in double over the whole
 * vocabulary with the maximum shifted out. The top-k, top-p and min-p cuts are not applied:
 * the figures describe the model's (biased, tempered) distribution, not the truncated one a
 * draw is made from, as OpenAI's and vLLM's logprobs do. Returns id's log-probability and
 * fills top[0..n_top) with the n_top (<= vocab) most likely ids, descending (ties to the
 * lower id). -INFINITY for an id the logits rule out. Allocates nothing.
 */
float sl_sampler_logprobs(const float *logits, int32_t vocab, float temperature, int32_t id,
                          sl_token_logprob *top, int32_t n_top);

#endif /* SL_SAMPLER_H */
