/*
 * JSON constraint speed (make bench): the time of one mask (sl_json_constraint_mask) over
 * Qwen3's 151,936 ids, from states a reply goes through (the start, inside a string, in a key,
 * after a number), and over the tokens of documents drawn at random through the mask (as
 * test_json_constraint.c draws them). Prints medians; the correctness is the unit tests'.
 *
 *   bench_json [fixtures-dir]   (tests/tokenizer sits beside it)
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/json_constraint.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n ? v[n / 2] : 0;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : "tests/fixtures";
    char path[1024];
    snprintf(path, sizeof path, "%s/../tokenizer/qwen3", fixtures);
    sl_tokenizer *tok = NULL;
    sl_json_vocab *v = NULL;
    sl_error err = {0};
    if (sl_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "bench_json: %s\n", err.msg);
        return 1;
    }
    double t0 = sl_now();
    if (sl_json_vocab_create(tok, &v, &err)) {
        fprintf(stderr, "bench_json: %s\n", err.msg);
        return 1;
    }
    const int32_t n = sl_tokenizer_vocab_size(tok);
    printf("json vocab (trie over %d ids): %.1f ms\n", n, (sl_now() - t0) * 1e3);
    const int32_t eos[2] = {sl_tokenizer_token_to_id(tok, "<|im_end|>"),
                            sl_tokenizer_token_to_id(tok, "<|endoftext|>")};
    float *logits = malloc((size_t)n * sizeof *logits);
    enum { REPS = 101 };
    double times[REPS];

    /* fixed states of json_object */
    static const char *const prefixes[] = {"", "{\"", "{\"name\": \"Jo", "{\"n\": 12",
                                           "{\"a\": [1, "};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        sl_json_constraint *c = NULL;
        if (sl_json_constraint_create(v, NULL, eos, 2, &c, &err) ||
            (prefixes[p][0] && sl_json_constraint_feed(c, prefixes[p], strlen(prefixes[p])))) {
            fprintf(stderr, "bench_json: %s\n", err.msg[0] ? err.msg : "prefix refused");
            return 1;
        }
        int allowed = 0;
        for (int r = 0; r < REPS; r++) {
            for (int32_t i = 0; i < n; i++)
                logits[i] = 0;
            const double t = sl_now();
            sl_json_constraint_mask(c, logits, n);
            times[r] = sl_now() - t;
        }
        for (int32_t i = 0; i < n; i++)
            allowed += logits[i] == 0;
        printf("mask after '%s': median %.3f ms (%d ids allowed)\n", prefixes[p],
               median(times, REPS) * 1e3, allowed);
        sl_json_constraint_free(c);
    }

    /* random documents of json_object: every mask of every token */
    sl_json_constraint *c = NULL;
    if (sl_json_constraint_create(v, NULL, eos, 2, &c, &err)) return 1;
    uint8_t *closes = calloc((size_t)n, 1);
    char buf[1100];
    for (int32_t id = 0; id < n; id++) {
        const int32_t len = sl_tokenizer_token_bytes(tok, id, buf, (int32_t)sizeof buf);
        closes[id] = len > 0 && buf[0] && strchr("\"}]", buf[0]);
    }
    enum { MAX_T = 4000 };
    static double all[MAX_T];
    int n_all = 0;
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    for (int d = 0; d < 20 && n_all < MAX_T; d++) {
        sl_json_constraint_reset(c);
        for (int step = 0; step < 200 && n_all < MAX_T; step++) {
            for (int32_t i = 0; i < n; i++) {
                logits[i] = (float)(rng_next(&seed) >> 40) / (float)(1 << 24);
                if (step > 20 && (closes[i] || i == eos[0])) logits[i] += 2;
            }
            const double t = sl_now();
            sl_json_constraint_mask(c, logits, n);
            all[n_all++] = sl_now() - t;
            int32_t best = 0;
            for (int32_t i = 1; i < n; i++)
                if (logits[i] > logits[best]) best = i;
            if (best == eos[0] || best == eos[1]) break;
            sl_json_constraint_accept(c, best);
        }
    }
    double mean = 0;
    for (int i = 0; i < n_all; i++)
        mean += all[i];
    mean /= n_all;
    const double med = median(all, n_all);
    printf("mask per token over %d tokens of random json_object documents: median %.3f ms, "
           "mean %.3f ms, max %.3f ms\n",
           n_all, med * 1e3, mean * 1e3, all[n_all - 1] * 1e3);
    free(closes);
    free(logits);
    sl_json_constraint_free(c);
    sl_json_vocab_free(v);
    sl_tokenizer_free(tok);
    return 0;
}
