/*
 * Perplexity and the divergence of one model's predictions from another's (a quantised
 * model against its float original), over the same tokens, as llama.cpp's perplexity tool
 * measures them: the text is cut into chunks of n_ctx tokens, each run from an empty
 * context, and the second half of each chunk is scored (every scored token then has at least
 * n_ctx / 2 tokens of context).
 */
#ifndef SL_PERPLEXITY_H
#define SL_PERPLEXITY_H

#include "core/common.h"

typedef struct sl_ppl {
    int64_t n;        /* tokens scored */
    double nll, nll2; /* sums of -log p(next token) and of its square */
    int64_t n_kl;     /* tokens compared with a base run */
    double kl, kl2;   /* sums of KL(base || this) and of its square */
    int64_t same_top; /* tokens where both runs' most probable token agree */
    double base_nll;  /* the base run's sum of -log p over the compared tokens */
} sl_ppl;

/* Scores n rows of logits (row i predicts next[i]; V per row): adds to acc. logp (NULL: not
 * wanted) receives each row's log-softmax, [n, V]; base (NULL: none) holds a base run's
 * log-softmax rows for the same tokens, for KL and top-1 agreement. Sums in double. */
void sl_ppl_score(sl_ppl *acc, const float *logits, int32_t V, const int32_t *next, int32_t n,
                  float *logp, const float *base);

/* exp(mean NLL) and its standard error (delta method); the mean KL and its standard error. */
double sl_ppl_value(const sl_ppl *acc, double *err);
double sl_ppl_kl(const sl_ppl *acc, double *err);

#endif /* SL_PERPLEXITY_H */
