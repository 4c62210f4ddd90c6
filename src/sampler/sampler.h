/*
 * Token sampling: turns a row of logits into the next token id.
 *
 * Order of the steps (each off at its neutral value):
 *   1. penalties over the last penalty_last_n tokens of the context:
 *      repetition (CTRL/HF: positive logits divided, negative multiplied),
 *      presence (minus once if seen), frequency (minus per occurrence)
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
/* Picks the next id. logits is modified in place (penalties, scaling). */
int32_t sl_sampler_sample(sl_sampler *s, float *logits);

#endif /* SL_SAMPLER_H */
