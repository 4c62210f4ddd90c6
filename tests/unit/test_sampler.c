/* The sampler: reproducibility, greedy, and each filter and penalty on constructed logits. */
#include "sampler/sampler.h"
#include "test.h"

enum { V = 8 };

/* Draws n tokens from fresh copies of logits; counts[] receives how often each id came. */
static void draw(sl_sampler *s, const float *logits, int n, int *counts) {
    memset(counts, 0, V * sizeof(int));
    for (int i = 0; i < n; i++) {
        float l[V];
        memcpy(l, logits, sizeof l);
        int32_t id = sl_sampler_sample(s, l);
        if (id >= 0 && id < V) counts[id]++;
    }
}

static sl_sampler *make(sl_sampler_params p) {
    sl_sampler *s = NULL;
    sl_error err = {0};
    CHECKF(sl_sampler_create(&p, V, &s, &err) == SL_OK, "%s", err.msg);
    return s;
}

/* log-probabilities 0.4, 0.3, 0.15, 0.1, 0.05 and three near-impossible ids */
static const float base[V] = {-0.916f, -1.204f, -1.897f, -2.303f, -2.996f, -30, -30, -30};

TEST(test_sampler_seed_and_greedy) {
    sl_sampler_params p = sl_sampler_defaults();
    sl_sampler *g = make(p);
    float l[V];
    memcpy(l, base, sizeof l);
    CHECK(sl_sampler_sample(g, l) == 0);
    sl_sampler_free(g);
    p.temperature = 1;
    p.seed = 42;
    sl_sampler *a = make(p), *b = make(p);
    int32_t sa[64], sb[64];
    for (int i = 0; i < 64; i++) {
        float la[V], lb[V];
        memcpy(la, base, sizeof la);
        memcpy(lb, base, sizeof lb);
        sa[i] = sl_sampler_sample(a, la);
        sb[i] = sl_sampler_sample(b, lb);
    }
    CHECK(memcmp(sa, sb, sizeof sa) == 0); /* same seed, same draws */
    sl_sampler_reset(a);
    for (int i = 0; i < 64; i++) {
        float la[V];
        memcpy(la, base, sizeof la);
        CHECK(sl_sampler_sample(a, la) == sa[i]); /* reset restarts the stream */
    }
    /* Frequencies follow the distribution (2000 draws, generous bounds). */
    int c[V];
    draw(a, base, 2000, c);
    CHECK(c[0] > 700 && c[0] < 900 && c[1] > 500 && c[1] < 700 && c[4] > 50 && c[4] < 160);
    CHECK(c[5] + c[6] + c[7] == 0);
    sl_sampler_free(a), sl_sampler_free(b);
    /* A different seed gives a different stream. */
    p.seed = 43;
    sl_sampler *d = make(p);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        float l2[V];
        memcpy(l2, base, sizeof l2);
        differ |= sl_sampler_sample(d, l2) != sa[i];
    }
    CHECK(differ);
    sl_sampler_free(d);
}

TEST(test_sampler_filters) {
    sl_sampler_params p = sl_sampler_defaults();
    p.temperature = 1;
    int c[V];
    p.top_k = 2; /* only ids 0 and 1 */
    sl_sampler *s = make(p);
    draw(s, base, 500, c);
    CHECK(c[0] + c[1] == 500 && c[0] > 0 && c[1] > 0);
    sl_sampler_free(s);
    p.top_k = 0;
    p.top_p = 0.8f; /* 0.4 + 0.3 + 0.15 >= 0.8: ids 0..2 */
    s = make(p);
    draw(s, base, 500, c);
    CHECK(c[0] + c[1] + c[2] == 500 && c[2] > 0);
    sl_sampler_free(s);
    p.top_p = 1;
    p.min_p = 0.3f; /* keep p >= 0.12: ids 0..2 */
    s = make(p);
    draw(s, base, 500, c);
    CHECK(c[0] + c[1] + c[2] == 500 && c[2] > 0);
    sl_sampler_free(s);
    p.min_p = 0;
    p.temperature = 0.05f; /* a cold temperature is nearly greedy */
    s = make(p);
    draw(s, base, 300, c);
    CHECK(c[0] >= 298);
    sl_sampler_free(s);
    p.temperature = 1;
    p.top_k = 1; /* top-k 1 is greedy */
    s = make(p);
    draw(s, base, 100, c);
    CHECK(c[0] == 100);
    sl_sampler_free(s);
    /* Invalid parameters are refused. */
    sl_sampler_params bad = sl_sampler_defaults();
    bad.top_p = 0;
    sl_sampler *x = NULL;
    sl_error err = {0};
    CHECK(sl_sampler_create(&bad, V, &x, &err) == SL_ERR_ARG && x == NULL);
}

TEST(test_sampler_penalties) {
    sl_sampler_params p = sl_sampler_defaults();
    p.repetition_penalty = 2;
    sl_sampler *s = make(p);
    float l[V] = {2, 1.5f, -1, 0, 0, 0, 0, 0};
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 2);
    CHECK(sl_sampler_sample(s, l) == 1);            /* 2 -> 1 (divided), 1.5 wins */
    CHECK(l[0] == 1 && l[1] == 1.5f && l[2] == -2); /* negative logits are multiplied */
    sl_sampler_free(s);
    p = sl_sampler_defaults();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 3;
    s = make(p);
    float m[V] = {2, 1.5f, 0, 0, 0, 0, 0, 0};
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 1);
    sl_sampler_sample(s, m);
    CHECK(fabsf(m[0] - (2 - 0.5f - 0.5f)) < 1e-6f && fabsf(m[1] - (1.5f - 0.5f - 0.25f)) < 1e-6f);
    /* The window holds the last 3: after two more ids, the 0s have left it. */
    sl_sampler_accept(s, 3);
    sl_sampler_accept(s, 4);
    float n[V] = {2, 1.5f, 0, 0, 0, 0, 0, 0};
    sl_sampler_sample(s, n);
    CHECK(n[0] == 2 && fabsf(n[1] - 0.75f) < 1e-6f && n[3] < 0 && n[4] < 0);
    sl_sampler_free(s);
}

/* The penalties' window (--repeat-last-n): N = the last N accepted ids, however many that is
 * against the vocabulary; 0 = penalties off whatever was accepted. */
TEST(test_sampler_penalty_window) {
    sl_sampler_params p = sl_sampler_defaults();
    p.frequency_penalty = 0.01f;
    p.penalty_last_n = 100; /* a window longer than the vocabulary (the context's, with -1) */
    sl_sampler *s = make(p);
    for (int i = 0; i < 300; i++) /* 0 x 150 then 1 x 150: the window holds 100 of the 1s */
        sl_sampler_accept(s, i < 150 ? 0 : 1);
    float l[V] = {0};
    sl_sampler_sample(s, l);
    CHECK(l[0] == 0 && fabsf(l[1] + 1.0f) < 1e-5f && l[2] == 0);
    sl_sampler_reset(s); /* forgets the history */
    float m[V] = {0};
    sl_sampler_sample(s, m);
    CHECK(m[1] == 0);
    sl_sampler_free(s);
    p.repetition_penalty = 2;
    p.presence_penalty = 1;
    p.penalty_last_n = 0;
    s = make(p);
    sl_sampler_accept(s, 0);
    sl_sampler_accept(s, 0);
    float n[V] = {2, 1.5f, 0, 0, 0, 0, 0, 0};
    CHECK(sl_sampler_sample(s, n) == 0 && n[0] == 2);
    sl_sampler_free(s);
}

/* Without top-k the sampler draws from its best 256 candidates when it can; it must pick what
 * a pass over the whole sorted vocabulary picks (here: top-k of all but the least likely id,
 * whose probability is negligible), whether the draw stays among them or falls past them. */
TEST(test_sampler_partial_equals_full) {
    enum { VB = 2000, N = 300 };
    static float logits[VB], a[VB], b[VB];
    for (int i = 0; i < VB; i++) /* peaked, with a long tail; the last id the least likely */
        logits[i] =
            -1.2f * logf((float)(1 + (i * 7919) % (VB - 1))) + (i == VB - 1 ? -100.0f : 0.0f);
    const float top_ps[3] = {1.0f, 0.9f, 1.0f}, min_ps[3] = {0, 0, 0.01f};
    const float temps[3] = {0.8f, 1.3f, 2.5f};
    for (int c = 0; c < 3; c++) {
        sl_sampler_params p = sl_sampler_defaults();
        p.temperature = temps[c], p.top_p = top_ps[c], p.min_p = min_ps[c], p.seed = 11;
        sl_sampler_params q = p;
        q.top_k = VB - 1;
        sl_sampler *sa = NULL, *sb = NULL;
        sl_error err;
        CHECK(sl_sampler_create(&p, VB, &sa, &err) == SL_OK);
        CHECK(sl_sampler_create(&q, VB, &sb, &err) == SL_OK);
        int same = 1, far = 0;
        for (int k = 0; sa && sb && k < N; k++) {
            memcpy(a, logits, sizeof a), memcpy(b, logits, sizeof b);
            const int32_t x = sl_sampler_sample(sa, a), y = sl_sampler_sample(sb, b);
            same &= x == y;
            far += x >= 0 && logits[x] < logits[0] - 8; /* deep in the tail: past the candidates */
        }
        CHECKF(same, "config %d: partial and full sampling differ", c);
        if (c == 2) CHECKF(far > 0, "config 2 never drew past the candidates");
        sl_sampler_free(sa), sl_sampler_free(sb);
    }
}

/* sl_argmax against its definition (the first strict maximum; NaN never wins, a NaN first entry
 * wins): lengths around its 8-wide steps, ties, signed zeros, infinities and NaNs. */
TEST(test_argmax) {
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, 1.0f, -2.0f};
    uint32_t r = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        const int32_t n = 1 + trial % 37;
        float x[40];
        for (int32_t i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = (r >> 28) < 6 ? special[(r >> 8) % 8] : (float)((int32_t)(r >> 16) % 7);
        }
        int32_t want = 0;
        for (int32_t i = 1; i < n; i++)
            if (x[i] > x[want]) want = i;
        const int32_t got = sl_argmax(x, n);
        CHECKF(got == want, "trial %d, n %d: %d, want %d", trial, n, got, want);
    }
}

/* The top-k candidates (a scan that skips 16 ids at a time while none beats the k-th): near-
 * uniform draws at a huge temperature must hit exactly the k ids that come first by logit, ties
 * to the lower id, for lengths around the 16-wide steps and logits full of ties. */
TEST(test_sampler_top_k_set) {
    uint32_t r = 777;
    for (int trial = 0; trial < 240; trial++) {
        const int32_t n = 1 + trial % 60, k = SL_MIN(n, 1 + trial % 4);
        float x[64];
        for (int32_t i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = (float)((r >> 16) % 7);
        }
        int in_top[64] = {0}; /* the definition: k rounds of the first strict maximum left */
        for (int32_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t i = 0; i < n; i++)
                if (!in_top[i] && (best < 0 || x[i] > x[best])) best = i;
            in_top[best] = 1;
        }
        sl_sampler_params p = sl_sampler_defaults();
        p.temperature = 1e6f, p.top_k = k, p.seed = (uint64_t)trial;
        sl_sampler *s = NULL;
        sl_error err = {0};
        CHECKF(sl_sampler_create(&p, n, &s, &err) == SL_OK, "%s", err.msg);
        int hit[64] = {0}, ok = 1;
        for (int d = 0; d < 200; d++) {
            float l[64];
            memcpy(l, x, (size_t)n * sizeof(float));
            const int32_t id = sl_sampler_sample(s, l);
            ok &= id >= 0 && id < n && in_top[id];
            if (id >= 0 && id < n) hit[id] = 1;
        }
        for (int32_t i = 0; i < n; i++)
            ok &= hit[i] == in_top[i];
        CHECKF(ok, "trial %d (n %d, k %d): draws outside the top k, or one of it never drawn",
               trial, n, k);
        sl_sampler_free(s);
    }
}

/* logit_bias: +100 forces an id under greedy and sampling, -100 bans the favourite, the caller's
 * array may go once the sampler is made, and ids outside the vocabulary or non-finite biases
 * are refused. */
TEST(test_sampler_logit_bias) {
    sl_logit_bias b[2] = {{6, 100}, {0, -100}};
    sl_sampler_params p = sl_sampler_defaults();
    p.logit_bias = b, p.n_logit_bias = 1;
    sl_sampler *g = make(p);
    b[0].id = 3; /* the sampler holds its own copy */
    float l[V];
    memcpy(l, base, sizeof l);
    CHECK(sl_sampler_sample(g, l) == 6);
    CHECK(l[6] == -30.0f + 100.0f); /* left in the logits for sl_sampler_logprobs */
    sl_sampler_free(g);
    b[0].id = 6;
    p.logit_bias = b + 1; /* ban the most likely: greedy takes the next */
    g = make(p);
    memcpy(l, base, sizeof l);
    CHECK(sl_sampler_sample(g, l) == 1);
    sl_sampler_free(g);
    p.temperature = 1, p.top_p = 0.9f, p.seed = 5, p.logit_bias = b, p.n_logit_bias = 2;
    g = make(p);
    int c[V];
    draw(g, base, 200, c);
    CHECK(c[6] == 200);
    sl_sampler_free(g);
    sl_sampler *s = NULL;
    sl_error err = {0};
    const sl_logit_bias bad[3] = {{V, 1}, {-1, 1}, {2, NAN}};
    for (int i = 0; i < 3; i++) {
        p.logit_bias = bad + i, p.n_logit_bias = 1;
        CHECK(sl_sampler_create(&p, V, &s, &err) == SL_ERR_ARG && !s);
    }
    p.logit_bias = NULL;
    CHECK(sl_sampler_create(&p, V, &s, &err) == SL_ERR_ARG && !s);
}

/* sl_sampler_logprobs against a long-double log-softmax: the sampled id's figure, the top list
 * (descending, ties to the lower id, as many as asked), the temperature (0 counts as 1), ids
 * ruled out (-inf), and logits whose sum would overflow without the shift. */
TEST(test_sampler_logprobs) {
    enum { N = 300 };
    static float x[N];
    uint32_t r = 99;
    for (int trial = 0; trial < 40; trial++) {
        const float t = trial % 4 == 0 ? 0.0f : 0.25f * (float)(trial % 4) + 0.1f;
        const float shift = trial % 5 == 0 ? 3000.0f : 0.0f;
        for (int32_t i = 0; i < N; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = shift + (float)((r >> 16) % 2000) / 100.0f - 10.0f;
        }
        x[7] = -INFINITY;
        x[11] = x[12]; /* a tie */
        const long double it = t > 0 ? 1.0L / t : 1.0L;
        long double mx = -INFINITY, sum = 0;
        for (int32_t i = 0; i < N; i++)
            if (x[i] > mx) mx = x[i];
        for (int32_t i = 0; i < N; i++)
            sum += expl(((long double)x[i] - mx) * it);
        sl_token_logprob top[20];
        for (int32_t k = 0; k < 20; k++)
            top[k] = (sl_token_logprob){-5, 1.0f}; /* poison */
        const int32_t n_top = 1 + trial % 20, id = (int32_t)(r % N) == 7 ? 8 : (int32_t)(r % N);
        const float lp = sl_sampler_logprobs(x, N, t, id, top, n_top);
        const long double want = ((long double)x[id] - mx) * it - logl(sum);
        CHECKF(fabsl(lp - want) < 1e-4L, "trial %d: %g, want %Lg", trial, lp, want);
        CHECK(sl_sampler_logprobs(x, N, t, 7, top, n_top) == -INFINITY);
        double mass = 0;
        for (int32_t k = 0; k < n_top; k++) {
            CHECK(top[k].id >= 0 && top[k].id < N && top[k].logprob <= 0);
            if (k > 0)
                CHECK(x[top[k].id] < x[top[k - 1].id] ||
                      (x[top[k].id] == x[top[k - 1].id] && top[k].id > top[k - 1].id));
            const long double w = ((long double)x[top[k].id] - mx) * it - logl(sum);
            CHECK(fabsl(top[k].logprob - w) < 1e-4L);
            mass += exp(top[k].logprob);
        }
        CHECK(mass <= 1.0 + 1e-6);
        int32_t better = 0; /* ids strictly above the last one held: all held */
        for (int32_t i = 0; i < N; i++)
            better += x[i] > x[top[n_top - 1].id];
        CHECK(better <= n_top - 1);
        CHECK(n_top == 20 || top[n_top].id == -5); /* nothing written past n_top */
    }
}
