/* Routing replayed from a trace (contracts in replay.h). */
#include "moe/replay.h"

sl_status sl_route_replay_load(sl_route_replay *r, const char *path, int32_t n_experts, int32_t k,
                               sl_error *err) {
    memset(r, 0, sizeof *r);
    sl_trace t;
    sl_status st = sl_trace_load(&t, path, err);
    if (st) return st;
    if (t.n_experts != n_experts || t.k != k) {
        st = sl_fail(err, SL_ERR_ARG,
                     "%s: a trace of %d experts, %d a token, for a model of %d experts, %d a token",
                     path, t.n_experts, t.k, n_experts, k);
        goto out;
    }
    /* Tokens per trace layer: its kind-0 records with all k picks; predictions likewise. */
    const int32_t L = t.n_layers;
    int64_t *np = sl_calloc((size_t)L * 2, sizeof(int64_t), err);
    if (!np) {
        st = SL_ERR_NOMEM;
        goto out;
    }
    int64_t *nq = np + L;
    for (int64_t i = 0; i < t.n_records; i++) {
        const int64_t n = t.off[i + 1] - t.off[i];
        if (t.kind[i] == SL_TRACE_PICKS && n != k) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: record %lld has %lld picks; a replay needs all %d of each token",
                         path, (long long)i, (long long)n, k);
            break;
        }
        (t.kind[i] == SL_TRACE_PICKS ? np : nq)[t.layer[i]]++;
    }
    int64_t tokens = INT32_MAX, preds = 1;
    int32_t used = 0;
    for (int32_t l = 0; !st && l < L; l++) {
        if (!np[l]) continue; /* a dense layer of the traced model */
        used++;
        tokens = SL_MIN(tokens, np[l]);
        preds &= used == 1 || nq[l] == np[l]; /* every token of every MoE layer but the first */
    }
    if (!st && !used) st = sl_fail(err, SL_ERR_FORMAT, "%s: no picks to replay", path);
    if (st) {
        free(np);
        goto out;
    }
    /* The traced model's MoE layers, packed: trace layer m is its m-th MoE layer. */
    r->t_layers = used, r->n_tokens = (int32_t)tokens, r->n_experts = n_experts, r->k = k;
    const size_t cells = (size_t)used * (size_t)tokens;
    r->picks = sl_calloc(cells * (size_t)k, sizeof(uint16_t), err);
    if (preds) {
        r->pred = sl_calloc(cells * (size_t)k, sizeof(uint16_t), err);
        r->pred_n = sl_calloc(cells, 1, err);
    }
    int32_t *m_of = sl_calloc((size_t)L, sizeof(int32_t), err);
    if (!r->picks || (preds && (!r->pred || !r->pred_n)) || !m_of) {
        free(np), free(m_of);
        sl_route_replay_free(r);
        st = SL_ERR_NOMEM;
        goto out;
    }
    for (int32_t l = 0, m = 0; l < L; l++)
        m_of[l] = np[l] ? m++ : -1;
    memset(np, 0, (size_t)L * 2 * sizeof(int64_t));
    for (int64_t i = 0; i < t.n_records; i++) {
        const int32_t l = t.layer[i], m = m_of[l];
        if (m < 0) continue;
        const int pick = t.kind[i] == SL_TRACE_PICKS;
        if (!pick && !r->pred) continue;
        const int64_t j = (pick ? np : nq)[l]++;
        if (j >= tokens) continue;
        const size_t cell = (size_t)m * (size_t)tokens + (size_t)j;
        const int64_t n = t.off[i + 1] - t.off[i];
        memcpy((pick ? r->picks : r->pred) + cell * (size_t)k, t.ids + t.off[i],
               (size_t)n * sizeof(uint16_t));
        if (!pick) r->pred_n[cell] = (uint8_t)n;
    }
    free(np), free(m_of);
out:
    sl_trace_free(&t);
    return st;
}

void sl_route_replay_free(sl_route_replay *r) {
    free(r->picks), free(r->pred), free(r->pred_n);
    memset(r, 0, sizeof *r);
}
