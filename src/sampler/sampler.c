/* Token sampling (pipeline in sampler.h). */
#include "sampler/sampler.h"

#include <emmintrin.h>
#include <math.h>

struct sl_sampler {
    sl_sampler_params p;
    int32_t vocab;
    uint64_t rng;
    int32_t *history; /* ring of the last penalty_last_n ids */
    int32_t n_history, head;
    int32_t *count;      /* [vocab] occurrences in the history */
    int32_t *cand;       /* [vocab] candidate ids */
    float *prob;         /* [vocab] candidate probabilities */
    sl_logit_bias *bias; /* [p.n_logit_bias] the caller's, copied */
};

sl_sampler_params sl_sampler_defaults(void) {
    return (sl_sampler_params){.temperature = 0,
                               .top_k = 0,
                               .top_p = 1,
                               .min_p = 0,
                               .repetition_penalty = 1,
                               .presence_penalty = 0,
                               .frequency_penalty = 0,
                               .penalty_last_n = 64,
                               .seed = 0};
}

sl_status sl_sampler_create(const sl_sampler_params *p, int32_t vocab, sl_sampler **out,
                            sl_error *err) {
    *out = NULL;
    if (vocab <= 0) return sl_fail(err, SL_ERR_ARG, "sampler: vocabulary size %d", vocab);
    if (!(p->temperature >= 0) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || p->penalty_last_n < 0)
        return sl_fail(err, SL_ERR_ARG,
                       "sampler: invalid parameters (temperature >= 0, "
                       "top-k >= 0, 0 < top-p <= 1, 0 <= min-p <= 1, repetition penalty > 0)");
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return sl_fail(err, SL_ERR_ARG, "sampler: %d logit biases", p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= vocab ||
            !isfinite(p->logit_bias[i].bias))
            return sl_fail(err, SL_ERR_ARG,
                           "sampler: logit bias %g for id %d (ids in [0, %d), finite biases)",
                           p->logit_bias[i].bias, p->logit_bias[i].id, vocab);
    sl_sampler *s = sl_calloc(1, sizeof *s, err);
    if (!s) return SL_ERR_NOMEM;
    s->p = *p;
    s->vocab = vocab;
    if (p->n_logit_bias > 0) {
        s->bias = sl_calloc((size_t)p->n_logit_bias, sizeof *s->bias, err);
        if (!s->bias) {
            free(s);
            return SL_ERR_NOMEM;
        }
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    s->history = sl_calloc((size_t)SL_MAX(s->p.penalty_last_n, 1), sizeof(int32_t), err);
    s->count = sl_calloc((size_t)vocab, sizeof(int32_t), err);
    s->cand = sl_calloc((size_t)vocab, sizeof(int32_t), err);
    s->prob = sl_calloc((size_t)vocab, sizeof(float), err);
    if (!s->history || !s->count || !s->cand || !s->prob) {
        sl_sampler_free(s);
        return SL_ERR_NOMEM;
    }
    sl_sampler_reset(s);
    *out = s;
    return SL_OK;
}

void sl_sampler_free(sl_sampler *s) {
    if (!s) return;
    free(s->history), free(s->count), free(s->cand), free(s->prob), free(s->bias);
    free(s);
}

const sl_sampler_params *sl_sampler_get_params(const sl_sampler *s) {
    return &s->p;
}

void sl_sampler_reset(sl_sampler *s) {
    s->rng = s->p.seed;
    s->n_history = s->head = 0;
    memset(s->count, 0, (size_t)s->vocab * sizeof(int32_t));
}

void sl_sampler_accept(sl_sampler *s, int32_t id) {
    const int32_t n = s->p.penalty_last_n;
    if (id < 0 || id >= s->vocab || n == 0) return; /* a window of 0: the penalties see nothing */
    if (s->n_history == n)
        s->count[s->history[s->head]]--; /* the oldest leaves the window */
    else
        s->n_history++;
    s->history[s->head] = id;
    s->head = (s->head + 1) % n;
    s->count[id]++;
}

/* splitmix64: a small, well-mixed generator; the same seed gives the same stream. */
static double next_uniform(sl_sampler *s) {
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Sorts candidates by descending logit, ties to the lower id (ctx: the logits). */
static int cmp_cand(const void *a, const void *b, void *ctx) {
    const float *logits = ctx;
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (logits[i] != logits[j]) return logits[i] > logits[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void apply_penalties(sl_sampler *s, float *logits) {
    const sl_sampler_params *p = &s->p;
    if (p->repetition_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    /* Each distinct id of the window once: its count is negated once handled. */
    int32_t *count = s->count;
    for (int32_t i = 0; i < s->n_history; i++) {
        const int32_t id = s->history[i];
        if (count[id] <= 0) continue;
        float l = logits[id];
        if (p->repetition_penalty != 1)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)count[id];
        logits[id] = l;
        count[id] = -count[id];
    }
    for (int32_t i = 0; i < s->n_history; i++)
        if (count[s->history[i]] < 0) count[s->history[i]] = -count[s->history[i]];
}

/*
 * Top-p, min-p, then a draw over the first n candidates (descending; prob[] normalised over
 * every id). partial: they are only the best of the vocabulary, the rest holds probability
 * too. Then -1 (nothing drawn) when a cut would reach past them, or when, with no cut at
 * all, the draw does (the generator is wound back so the full pass draws the same number).
 */
static int32_t pick(sl_sampler *s, int32_t n, int partial) {
    const sl_sampler_params *p = &s->p;
    int cut = 0;
    if (p->top_p < 1) {
        double mass = 0;
        int32_t keep = 0;
        while (keep < n && mass < p->top_p)
            mass += s->prob[keep++];
        if (partial && mass < p->top_p) return -1;
        n = SL_MAX(keep, 1);
        cut = 1;
    }
    if (p->min_p > 0) {
        int32_t keep = 1;
        while (keep < n && s->prob[keep] >= p->min_p * s->prob[0])
            keep++;
        if (partial && !cut && keep == n) return -1;
        cut |= keep < n;
        n = keep;
    }
    double total = 0;
    for (int32_t i = 0; i < n; i++)
        total += s->prob[i];
    /* Uncut, the draw spans the whole vocabulary, whose probabilities sum to 1. */
    double r = next_uniform(s) * (partial && !cut ? 1.0 : total);
    for (int32_t i = 0; i < n; i++) {
        r -= s->prob[i];
        if (r < 0) return s->cand[i];
    }
    if (partial && !cut) {
        s->rng -= 0x9e3779b97f4a7c15ull;
        return -1;
    }
    return s->cand[n - 1];
}

/* id into cand[0..j] (sorted, descending, ties to the lower id), the entries below it moving
 * down one. */
static void insert_candidate(int32_t *cand, const float *logits, int32_t j, int32_t id) {
    while (j > 0 && logits[id] > logits[cand[j - 1]]) {
        cand[j] = cand[j - 1];
        j--;
    }
    cand[j] = id;
}

/* The n best candidates in descending order (ties to the lower id), in one pass keeping them
 * sorted by insertion: n is small. Once n are held, an id enters only above the last one's
 * logit, kept in a local: the scan is then a compare per id (it reloaded the last candidate
 * and its logit per id: ~100 us for 151,936 ids, now ~15). */
static void top_candidates(sl_sampler *s, const float *logits, int32_t n) {
    SL_ASSERT(n >= 1 && n <= s->vocab);
    int32_t *cand = s->cand;
    int32_t id = 0;
    for (; id < n; id++) /* the first n, in order */
        insert_candidate(cand, logits, id, id);
    float last = logits[cand[n - 1]];
    for (; id < s->vocab; id++) {
        /* 16 ids at a time while none is above the last (SSE2, x86-64's baseline; NaN
         * compares false, as below) */
        const __m128 t = _mm_set1_ps(last);
        for (; id + 16 <= s->vocab; id += 16) {
            const __m128 a = _mm_cmpgt_ps(_mm_loadu_ps(logits + id), t);
            const __m128 b = _mm_cmpgt_ps(_mm_loadu_ps(logits + id + 4), t);
            const __m128 c = _mm_cmpgt_ps(_mm_loadu_ps(logits + id + 8), t);
            const __m128 d = _mm_cmpgt_ps(_mm_loadu_ps(logits + id + 12), t);
            if (_mm_movemask_ps(_mm_or_ps(_mm_or_ps(a, b), _mm_or_ps(c, d)))) break;
        }
        if (id >= s->vocab) break;
        if (!(logits[id] > last)) continue;
        insert_candidate(cand, logits, n - 1, id);
        last = logits[cand[n - 1]];
    }
}

int32_t sl_sampler_sample(sl_sampler *s, float *logits) {
    const sl_sampler_params *p = &s->p;
    apply_penalties(s, logits);
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        logits[s->bias[i].id] += s->bias[i].bias;
    if (p->temperature == 0) return sl_argmax(logits, s->vocab);
    /* Candidates in descending order: the top k, or (no top-k) the best few hundred first,
     * which is where nearly all of the probability is; the whole vocabulary is sorted only
     * when the draw runs past them (pick). */
    const int32_t few = SL_MIN(256, s->vocab);
    int32_t n = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : few;
    top_candidates(s, logits, n);
    if (n == few && few < s->vocab && !(p->top_k > 0)) {
        /* softmax over every id (their sum), probabilities for the candidates */
        const float mx = logits[s->cand[0]];
        double sum = 0;
        for (int32_t id = 0; id < s->vocab; id++)
            sum += expf((logits[id] - mx) / p->temperature);
        for (int32_t i = 0; i < n; i++)
            s->prob[i] = (float)(expf((logits[s->cand[i]] - mx) / p->temperature) / sum);
        int32_t id = pick(s, n, 1);
        if (id >= 0) return id;
        n = s->vocab; /* the draw fell past the candidates: all of them, sorted */
        for (int32_t i = 0; i < n; i++)
            s->cand[i] = i;
        qsort_r(s->cand, (size_t)n, sizeof(int32_t), cmp_cand, logits);
    }
    /* Softmax at the temperature, over the candidates (the first is the largest). */
    const float mx = logits[s->cand[0]];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        s->prob[i] = expf((logits[s->cand[i]] - mx) / p->temperature);
        sum += s->prob[i];
    }
    for (int32_t i = 0; i < n; i++)
        s->prob[i] = (float)(s->prob[i] / sum);
    return pick(s, n, 0);
}

float sl_sampler_logprobs(const float *logits, int32_t vocab, float temperature, int32_t id,
                          sl_token_logprob *top, int32_t n_top) {
    SL_ASSERT(n_top >= 0 && n_top <= vocab && id >= 0 && id < vocab);
    const double inv_t = temperature > 0 ? 1.0 / temperature : 1.0;
    float mx = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    if (mx == -INFINITY) { /* nothing possible: every figure is -inf */
        for (int32_t k = 0; k < n_top; k++)
            top[k] = (sl_token_logprob){k, -INFINITY};
        return -INFINITY;
    }
    double sum = 0;
    for (int32_t i = 0; i < vocab; i++)
        sum += exp(((double)logits[i] - mx) * inv_t);
    const double lse = log(sum);
    /* The n_top best by insertion (n_top is small, at most OpenAI's 20): an id enters only
     * above the last one held. */
    int32_t held = 0;
    for (int32_t i = 0; i < vocab && n_top > 0; i++) {
        if (held == n_top && !(logits[i] > logits[top[held - 1].id])) continue;
        int32_t k = held < n_top ? held++ : n_top - 1;
        while (k > 0 && logits[i] > logits[top[k - 1].id]) {
            top[k] = top[k - 1];
            k--;
        }
        top[k].id = i;
    }
    for (int32_t k = 0; k < n_top; k++)
        top[k].logprob = (float)(((double)logits[top[k].id] - mx) * inv_t - lse);
    return (float)(((double)logits[id] - mx) * inv_t - lse);
}
