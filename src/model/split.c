/* The pipeline split's planner (contracts in split.h). */
#include "model/split.h"

#include <math.h>

int64_t sl_split_bytes(const sl_split_params *p, const int32_t *first, int32_t part) {
    int64_t n = part == 0 ? p->first_bytes : 0;
    if (part == p->n_parts - 1) n += p->last_bytes;
    for (int32_t l = first[part]; l < first[part + 1]; l++)
        n += p->layer_bytes[l];
    return n;
}

/* The share of partition q's budget that bytes take (the bytes themselves with no budget). */
static double share(const sl_split_params *p, int32_t q, int64_t bytes) {
    return p->budget ? (double)bytes / (double)p->budget[q] : (double)bytes;
}

static double mib(int64_t b) {
    return (double)b / (1024.0 * 1024.0);
}

/*
 * Dynamic programming over (partitions so far, layers so far): best[q][j] is the least largest
 * share with layers [0, j) on partitions [0, q), each of them holding one layer at least;
 * from[q][j] the j' < j where partition q - 1 then began. O(N L^2): a few thousand steps for real
 * models.
 */
sl_status sl_split_plan(const sl_split_params *p, int32_t *first, sl_error *err) {
    const int32_t L = p->n_layers, N = p->n_parts;
    if (L < 1) return sl_fail(err, SL_ERR_ARG, "a model of %d layers cannot be split", L);
    if (N < 1 || N > L)
        return sl_fail(err, SL_ERR_ARG,
                       "%d partitions of a model of %d layers: give 1 to %d (each partition runs "
                       "one layer at least)",
                       N, L, L);
    for (int32_t q = 0; p->budget && q < N; q++)
        if (p->budget[q] <= 0)
            return sl_fail(err, SL_ERR_ARG, "partition %d has no memory (budget %lld bytes)", q,
                           (long long)p->budget[q]);
    const size_t W = (size_t)L + 1;
    int64_t *pre = sl_calloc(W, sizeof *pre, err);
    double *best = sl_calloc((size_t)(N + 1) * W, sizeof *best, err);
    int32_t *from = sl_calloc((size_t)(N + 1) * W, sizeof *from, err);
    if (!pre || !best || !from) {
        free(pre), free(best), free(from);
        return SL_ERR_NOMEM;
    }
    for (int32_t l = 0; l < L; l++)
        pre[l + 1] = pre[l] + p->layer_bytes[l];
    for (size_t i = 0; i < (size_t)(N + 1) * W; i++)
        best[i] = INFINITY;
    best[0] = 0.0;
    for (int32_t q = 0; q < N; q++) {
        const int64_t extra = (q == 0 ? p->first_bytes : 0) + (q == N - 1 ? p->last_bytes : 0);
        /* partition q starts at j0 >= q and ends at j1, leaving a layer to each later one */
        for (int32_t j1 = q + 1; j1 <= L - (N - 1 - q); j1++)
            for (int32_t j0 = q; j0 < j1; j0++) {
                const double prev = best[(size_t)q * W + (size_t)j0];
                if (prev == INFINITY) continue;
                const double s = share(p, q, pre[j1] - pre[j0] + extra);
                const double m = s > prev ? s : prev;
                double *b = &best[(size_t)(q + 1) * W + (size_t)j1];
                if (m < *b) *b = m, from[(size_t)(q + 1) * W + (size_t)j1] = j0;
            }
    }
    first[N] = L;
    for (int32_t q = N; q > 0; q--)
        first[q - 1] = from[(size_t)q * W + (size_t)first[q]];
    const double worst = best[(size_t)N * W + (size_t)L];
    free(pre), free(best), free(from);
    if (!p->budget || worst <= 1.0) return SL_OK;
    /* Over budget: say where, and whether any split could do (the total, the largest layer). */
    int32_t q = 0;
    for (int32_t i = 1; i < N; i++)
        if (share(p, i, sl_split_bytes(p, first, i)) > share(p, q, sl_split_bytes(p, first, q)))
            q = i;
    int64_t total = p->first_bytes + p->last_bytes, room = 0;
    for (int32_t l = 0; l < L; l++)
        total += p->layer_bytes[l];
    for (int32_t i = 0; i < N; i++)
        room += p->budget[i];
    return sl_fail(err, SL_ERR_NOMEM,
                   "the model does not fit in %d partitions: %.1f MiB in all against %.1f MiB of "
                   "memory; the best split puts %.1f MiB (layers %d to %d) on partition %d, whose "
                   "budget is %.1f MiB",
                   N, mib(total), mib(room), mib(sl_split_bytes(p, first, q)), first[q],
                   first[q + 1] - 1, q, mib(p->budget[q]));
}
