/* Perplexity and KL divergence sums (see perplexity.h). */
#include "gen/perplexity.h"

#include <math.h>

void sl_ppl_score(sl_ppl *acc, const float *logits, int32_t V, const int32_t *next, int32_t n,
                  float *logp, const float *base) {
    for (int32_t i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * V;
        int32_t top = 0;
        for (int32_t v = 1; v < V; v++)
            if (l[v] > l[top]) top = v;
        double sum = 0;
        for (int32_t v = 0; v < V; v++)
            sum += exp((double)l[v] - l[top]);
        const double lse = l[top] + log(sum);
        const double nll = lse - l[next[i]];
        acc->nll += nll;
        acc->nll2 += nll * nll;
        acc->n++;
        if (logp)
            for (int32_t v = 0; v < V; v++)
                logp[(size_t)i * V + v] = (float)(l[v] - lse);
        if (!base) continue;
        const float *b = base + (size_t)i * V;
        double kl = 0;
        int32_t btop = 0;
        for (int32_t v = 0; v < V; v++) {
            const double pb = exp((double)b[v]);
            kl += pb * ((double)b[v] - ((double)l[v] - lse));
            if (b[v] > b[btop]) btop = v;
        }
        kl = kl > 0 ? kl : 0; /* rounding can make an exact match slightly negative */
        acc->kl += kl;
        acc->kl2 += kl * kl;
        acc->n_kl++;
        acc->same_top += btop == top;
        acc->base_nll -= b[next[i]];
    }
}

static double mean_err(double sum, double sum2, int64_t n, double *err) {
    const double m = n ? sum / (double)n : 0;
    const double var = n > 1 ? (sum2 / (double)n - m * m) * (double)n / (double)(n - 1) : 0;
    *err = n > 1 && var > 0 ? sqrt(var / (double)n) : 0;
    return m;
}

double sl_ppl_value(const sl_ppl *acc, double *err) {
    double e;
    const double p = exp(mean_err(acc->nll, acc->nll2, acc->n, &e));
    *err = p * e;
    return p;
}

double sl_ppl_kl(const sl_ppl *acc, double *err) {
    return mean_err(acc->kl, acc->kl2, acc->n_kl, err);
}
