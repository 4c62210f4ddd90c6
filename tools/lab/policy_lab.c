/*
 * Issue 30: expert-cache policies against Belady on routing traces (tests/fixtures/trace).
 * A lab harness, not the product: it reads a trace with sluice's own parser (trace.h, cache_sim.h)
 * and replays each layer's requests through policies written here, the store's protocol (a
 * request's hits pinned, then its misses placed; every expert requested is loaded, no bypass).
 *
 *   make -j2 && cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tools/lab/policy_lab.c \
 *       build/libsluice.a -lm -fopenmp -ljansson -lcrypto -lpcre2-8 -lutf8proc -luring \
 *       -o /tmp/policy_lab
 *   [MARKOV_LAG=L] /tmp/policy_lab TRACE sweep|table|oracle|rate|budget|prefetch [HALFLIFE]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/cache_sim.h"
#include "moe/slot_cache.h"

/* ------------------------------------------------------------- policies */

enum {
    P_LRU,
    P_LFU,
    P_DECAY,     /* a = halflife */
    P_DECAY_NX,  /* decay, but never evict a key of the next b requests (an oracle) */
    P_DECAY_REC, /* decay + b (log2 units) if used by the last request */
    P_GAP,       /* -(expected next use) = -(last + ewma gap), a = ewma weight */
    P_DECAY_INS, /* decay, a key's first use after an eviction counts b */
    P_ARC,
    P_DECAY_MAX, /* max of two decayed counts, halflives a and b */
    P_FUTRATE,   /* an oracle of rates: uses in the next b requests (ties: decay, halflife a) */
    P_MARKOV,    /* decay + b x P(key in the next request | this request), from transitions */
};

/* MARKOV: transitions counted from each of the last markov_lag requests (1: the next only) */
static int markov_lag = 1;

typedef struct pol {
    int kind;
    double a, b;
    const char *name;
} pol;

typedef struct cache {
    int S, K;
    int64_t tick;
    int *slot_key, *key_slot;
    int64_t *pin, *last_k, *uses_k;
    double *score, *score2, *gap;
    const sl_req_layer *L;
    int64_t i;          /* the request index */
    int *nextmark;      /* [K] a request index <= nextmark: key requested within the horizon */
    int32_t *cum;       /* FUTRATE: [n_req + 1][K] uses of each key before request i */
    float *trans, *row; /* MARKOV: [K][K] key a in a request, key b in the next; [K] */
    float *pnext;       /* MARKOV: [K] this request's estimate of the next */
    /* ARC */
    int *arc_where; /* 0 none, 1 T1, 2 T2, 3 B1, 4 B2 */
    int64_t *arc_t; /* recency stamp */
    double arc_p;
} cache;

static double dscore(double *score, int64_t tick, double h, int key, double w) {
    const double now = (double)tick / h;
    return score[key] = log2(exp2(score[key] - now) + w) + now;
}

static void on_use(cache *c, const pol *p, int key, int inserted) {
    const int64_t t = c->tick;
    if (c->last_k[key] >= 0) {
        const double g = (double)(t - c->last_k[key]);
        c->gap[key] = c->gap[key] < 0 ? g : (1 - p->a) * c->gap[key] + p->a * g;
    }
    if (p->kind == P_DECAY || p->kind == P_DECAY_NX || p->kind == P_DECAY_REC ||
        p->kind == P_FUTRATE || p->kind == P_MARKOV)
        dscore(c->score, t, p->a, key, 1.0);
    if (p->kind == P_DECAY_INS) dscore(c->score, t, p->a, key, inserted ? p->b : 1.0);
    if (p->kind == P_DECAY_MAX) {
        dscore(c->score, t, p->a, key, 1.0);
        dscore(c->score2, t, p->b, key, 1.0);
    }
    c->uses_k[key] = inserted ? 1 : c->uses_k[key] + 1;
    c->last_k[key] = t;
}

/* Larger: keep. */
static double keep_value(const cache *c, const pol *p, int key) {
    switch (p->kind) {
    case P_LRU: return (double)c->last_k[key];
    case P_LFU: return (double)c->uses_k[key] + 1e-9 * (double)c->last_k[key];
    case P_DECAY:
    case P_DECAY_INS: return c->score[key] + 1e-12 * (double)c->last_k[key];
    case P_DECAY_NX:
        return c->score[key] +
               (c->nextmark[key] > c->i && c->nextmark[key] <= c->i + p->b ? 1e6 : 0) +
               1e-12 * (double)c->last_k[key];
    case P_DECAY_REC:
        return c->score[key] + (c->last_k[key] == c->tick - 1 ? p->b : 0) +
               1e-12 * (double)c->last_k[key];
    case P_DECAY_MAX: {
        const double now1 = (double)c->tick / p->a, now2 = (double)c->tick / p->b;
        const double a = c->score[key] - now1, b = c->score2[key] - now2;
        return (a > b ? a : b) + 1e-12 * (double)c->last_k[key];
    }
    case P_FUTRATE: {
        const int64_t hz = SL_MIN(c->i + 1 + (int64_t)p->b, c->L->n_req);
        const int32_t f = c->cum[hz * c->K + key] - c->cum[(c->i + 1) * c->K + key];
        return f + 1e-3 * (c->score[key] - (double)c->tick / p->a);
    }
    case P_MARKOV: return log2(exp2(c->score[key] - (double)c->tick / p->a) + p->b * c->pnext[key]);
    case P_GAP: {
        const double g = c->gap[key] < 0 ? 1e9 : c->gap[key];
        return -((double)c->last_k[key] + g);
    }
    }
    return 0;
}

static int victim(const cache *c, const pol *p) {
    int best = -1;
    double bv = 0;
    for (int s = 0; s < c->S; s++) {
        if (c->pin[s] == c->tick) continue;
        if (c->slot_key[s] < 0) return s;
        const double v = keep_value(c, p, c->slot_key[s]);
        if (best < 0 || v < bv) best = s, bv = v;
    }
    return best;
}

static void cache_init(cache *c, int S, int K) {
    memset(c, 0, sizeof *c);
    c->S = S, c->K = K;
    c->slot_key = malloc(S * sizeof(int));
    c->pin = malloc(S * sizeof(int64_t));
    c->key_slot = malloc(K * sizeof(int));
    c->last_k = malloc(K * sizeof(int64_t));
    c->uses_k = malloc(K * sizeof(int64_t));
    c->score = malloc(K * sizeof(double));
    c->score2 = malloc(K * sizeof(double));
    c->gap = malloc(K * sizeof(double));
    c->nextmark = malloc(K * sizeof(int));
    c->arc_where = calloc(K, sizeof(int));
    c->arc_t = calloc(K, sizeof(int64_t));
    for (int s = 0; s < S; s++)
        c->slot_key[s] = -1, c->pin[s] = -1;
    for (int k = 0; k < K; k++) {
        c->key_slot[k] = -1, c->last_k[k] = -1, c->uses_k[k] = 0;
        c->score[k] = c->score2[k] = -INFINITY, c->gap[k] = -1, c->nextmark[k] = -1;
    }
}

static void cache_free(cache *c) {
    free(c->slot_key), free(c->pin), free(c->key_slot), free(c->last_k), free(c->uses_k);
    free(c->score), free(c->score2), free(c->gap), free(c->nextmark), free(c->arc_where);
    free(c->arc_t);
}

static void put(cache *c, int s, int key) {
    const int old = c->slot_key[s];
    if (old >= 0) c->key_slot[old] = -1;
    c->slot_key[s] = key, c->key_slot[key] = s;
}

/* ---- ARC (Megiddo & Modha) over slots: T1/T2 cached, B1/B2 ghosts of up to S each; the
 * victim is T1's LRU when |T1| > p, else T2's LRU, never a pinned one. */
static int arc_count(const cache *c, int where) {
    int n = 0;
    for (int k = 0; k < c->K; k++)
        n += c->arc_where[k] == where;
    return n;
}

static int arc_lru(const cache *c, int where, int pinned_ok) {
    int best = -1;
    for (int k = 0; k < c->K; k++) {
        if (c->arc_where[k] != where) continue;
        if (!pinned_ok && c->key_slot[k] >= 0 && c->pin[c->key_slot[k]] == c->tick) continue;
        if (best < 0 || c->arc_t[k] < c->arc_t[best]) best = k;
    }
    return best;
}

static int64_t arc_request(cache *c, const uint16_t *ids, int n) {
    int64_t hits = 0;
    for (int j = 0; j < n; j++)
        if (c->key_slot[ids[j]] >= 0) c->pin[c->key_slot[ids[j]]] = c->tick;
    for (int j = 0; j < n; j++) {
        const int e = ids[j];
        if (c->key_slot[e] >= 0) {
            hits++;
            c->arc_where[e] = 2, c->arc_t[e] = c->tick;
            continue;
        }
        const int w = c->arc_where[e];
        const int b1 = arc_count(c, 3), b2 = arc_count(c, 4);
        if (w == 3) c->arc_p = fmin(c->S, c->arc_p + fmax(1.0, (double)b2 / (b1 ? b1 : 1)));
        if (w == 4) c->arc_p = fmax(0, c->arc_p - fmax(1.0, (double)b1 / (b2 ? b2 : 1)));
        int s = -1;
        for (int q = 0; q < c->S && s < 0; q++)
            if (c->slot_key[q] < 0) s = q;
        if (s < 0) {
            const int t1 = arc_count(c, 1);
            int v = -1;
            if (t1 > 0 && (t1 > c->arc_p || (w == 4 && t1 >= c->arc_p))) v = arc_lru(c, 1, 0);
            if (v < 0) v = arc_lru(c, 2, 0);
            if (v < 0) v = arc_lru(c, 1, 0);
            s = c->key_slot[v];
            c->arc_where[v] = c->arc_where[v] == 1 ? 3 : 4;
            /* trim ghosts: |B1| + |T1| <= S, total <= 2S */
            if (arc_count(c, 3) + arc_count(c, 1) > c->S) c->arc_where[arc_lru(c, 3, 1)] = 0;
            while (arc_count(c, 3) + arc_count(c, 4) > c->S) {
                const int g = arc_lru(c, 4, 1) >= 0 ? arc_lru(c, 4, 1) : arc_lru(c, 3, 1);
                c->arc_where[g] = 0;
            }
        }
        put(c, s, e);
        c->pin[s] = c->tick;
        c->arc_where[e] = (w == 3 || w == 4) ? 2 : 1;
        c->arc_t[e] = c->tick;
    }
    return hits;
}

/* ------------------------------------------------------------- replay */

typedef struct pf_opt {
    int n_pred;       /* predictions used a request (0: no prefetch) */
    double bonus;     /* admission: a prediction's score + bonus must exceed the victim's */
    int admit_always; /* the store's way: a prediction always evicts */
    int spare;        /* prefetch into this many slots of its own (0: into the cache) */
} pf_opt;

typedef struct res {
    int64_t req, hits, used, inserts, wasted, tokens;
} res;

/* One layer through policy p at S slots. */
static res run_layer(const sl_req_layer *L, int S, int K, const pol *p, const pf_opt *pf) {
    res r = {0};
    cache c;
    cache_init(&c, S, K);
    c.L = L;
    c.arc_p = 0;
    int *want = calloc(K, sizeof(int));
    int *pfk = calloc(K, sizeof(int)); /* key read in by a prefetch, not used since */
    /* spare slots: a FIFO of keys */
    int *spare = malloc(64 * sizeof(int));
    int64_t spare_t[64];
    for (int z = 0; z < 64; z++)
        spare[z] = -1, spare_t[z] = -1;
    int *in_spare = calloc(K, sizeof(int));
    /* the oracle's horizon: index of the next request of each key, kept by a scan ahead */
    int64_t *nextreq = NULL;
    if (p->kind == P_DECAY_NX) {
        nextreq = malloc(L->off[L->n_req] * sizeof(int64_t));
        int64_t *lastseen = malloc(K * sizeof(int64_t));
        for (int k = 0; k < K; k++)
            lastseen[k] = INT64_MAX;
        for (int64_t i = L->n_req - 1; i >= 0; i--)
            for (int64_t q = L->off[i]; q < L->off[i + 1]; q++)
                nextreq[q] = lastseen[L->ids[q]], lastseen[L->ids[q]] = i;
        free(lastseen);
    }
    if (p->kind == P_FUTRATE) {
        c.cum = calloc((size_t)(L->n_req + 1) * K, sizeof(int32_t));
        for (int64_t i = 0; i < L->n_req; i++) {
            memcpy(c.cum + (i + 1) * K, c.cum + i * K, K * sizeof(int32_t));
            for (int64_t q = L->off[i]; q < L->off[i + 1]; q++)
                c.cum[(i + 1) * K + L->ids[q]]++;
        }
    }
    if (p->kind == P_MARKOV) {
        c.trans = calloc((size_t)K * K, sizeof(float));
        c.row = calloc(K, sizeof(float));
        c.pnext = calloc(K, sizeof(float));
    }
    for (int64_t i = 0; i < L->n_req; i++) {
        const uint16_t *ids = L->ids + L->off[i];
        const int n = (int)(L->off[i + 1] - L->off[i]);
        c.i = i;
        if (c.trans) { /* learn the transitions from the last request to this one, then
                        * estimate the next from this one (known now, before misses) */
            for (int d = 1; d <= markov_lag && d <= i; d++)
                for (int64_t qa = L->off[i - d]; qa < L->off[i - d + 1]; qa++) {
                    const int a = L->ids[qa];
                    c.row[a] += 1;
                    for (int j = 0; j < n; j++)
                        c.trans[(size_t)a * K + ids[j]] += 1;
                }
            memset(c.pnext, 0, K * sizeof(float));
            for (int j = 0; j < n; j++) {
                const int a = ids[j];
                if (c.row[a] <= 0) continue;
                for (int b2 = 0; b2 < K; b2++)
                    c.pnext[b2] += c.trans[(size_t)a * K + b2] / c.row[a] / n;
            }
        }
        r.tokens += n > 0;
        /* prefetch within the last request's time: its keys pinned */
        if (pf && pf->n_pred && L->poff[i + 1] > L->poff[i]) {
            for (int j = 0; j < n; j++)
                want[ids[j]] = 1;
            const int np = (int)SL_MIN(pf->n_pred, L->poff[i + 1] - L->poff[i]);
            for (int q = 0; q < np; q++) {
                const int e = L->pids[L->poff[i] + q];
                if (c.key_slot[e] >= 0 || in_spare[e]) continue;
                if (pf->spare) { /* the oldest spare slot, or an empty one */
                    int q2 = 0;
                    for (int z = 0; z < pf->spare; z++) {
                        if (spare[z] < 0) {
                            q2 = z;
                            break;
                        }
                        if (spare_t[z] < spare_t[q2]) q2 = z;
                    }
                    if (spare[q2] >= 0) in_spare[spare[q2]] = 0;
                    spare[q2] = e, spare_t[q2] = c.tick, in_spare[e] = q2 + 1;
                    r.inserts++, r.wasted += !want[e];
                    continue;
                }
                const int v = victim(&c, p);
                if (v < 0) continue;
                if (!pf->admit_always && c.slot_key[v] >= 0) {
                    /* the prediction's decayed count + bonus against the victim's, now */
                    const double now = (double)c.tick / p->a;
                    if (exp2(c.score[e] - now) + pf->bonus <= exp2(c.score[c.slot_key[v]] - now))
                        continue;
                }
                if (c.slot_key[v] >= 0) pfk[c.slot_key[v]] = 0;
                put(&c, v, e);
                c.pin[v] = c.tick; /* as sl_slot_insert: pinned and counted */
                on_use(&c, p, e, 1);
                pfk[e] = 1;
                r.inserts++, r.wasted += !want[e];
            }
            for (int j = 0; j < n; j++)
                want[ids[j]] = 0;
        }
        c.tick++;
        r.req += n;
        if (p->kind == P_ARC) {
            r.hits += arc_request(&c, ids, n);
            continue;
        }
        if (nextreq)
            for (int64_t q = L->off[i]; q < L->off[i + 1]; q++)
                c.nextmark[L->ids[q]] = nextreq[q] == INT64_MAX ? -1 : (int)nextreq[q];
        for (int j = 0; j < n; j++)
            if (c.key_slot[ids[j]] >= 0) c.pin[c.key_slot[ids[j]]] = c.tick;
        for (int j = 0; j < n; j++) {
            const int e = ids[j];
            const int s = c.key_slot[e];
            if (s >= 0) {
                if (pfk[e]) {
                    pfk[e] = 0;
                    r.used++;
                    on_use(&c, p, e, 1);
                } else {
                    r.hits++;
                    on_use(&c, p, e, 0);
                }
                continue;
            }
            if (in_spare[e]) { /* read ahead into a spare slot: moves in, no read now */
                r.used++;
                spare[in_spare[e] - 1] = -1;
                in_spare[e] = 0;
            }
            const int v = victim(&c, p);
            if (c.slot_key[v] >= 0) pfk[c.slot_key[v]] = 0;
            put(&c, v, e);
            c.pin[v] = c.tick;
            on_use(&c, p, e, 1);
        }
    }
    free(nextreq), free(want), free(pfk), free(spare), free(in_spare);
    free(c.cum), free(c.trans), free(c.row), free(c.pnext);
    cache_free(&c);
    return r;
}

static res run_all(const sl_requests *R, int S, const pol *p, const pf_opt *pf) {
    res t = {0};
    for (int l = 0; l < R->n_layers; l++) {
        if (!R->layers[l].n_req) continue;
        const res r = run_layer(&R->layers[l], S, R->n_experts, p, pf);
        t.req += r.req, t.hits += r.hits, t.used += r.used, t.inserts += r.inserts;
        t.wasted += r.wasted;
        t.tokens = SL_MAX(t.tokens, r.tokens);
    }
    return t;
}

static double belady(const sl_requests *R, int S) {
    sl_sim_result o;
    sl_error err;
    if (sl_cache_belady(R, S, &o, &err)) exit(1);
    return 100.0 * (double)o.hits / (double)o.requests;
}

/* Belady of one layer: a copy of the requests with only that layer. */
static double belady_layer(const sl_requests *R, int l, int S, int64_t *hits) {
    sl_requests one = *R;
    sl_req_layer *ls = calloc(R->n_layers, sizeof *ls);
    ls[l] = R->layers[l];
    one.layers = ls;
    sl_sim_result o;
    sl_error err;
    if (sl_cache_belady(&one, S, &o, &err)) exit(1);
    free(ls);
    *hits = o.hits;
    return 100.0 * (double)o.hits / (double)o.requests;
}

static double pct(res r) {
    return 100.0 * (double)r.hits / (double)r.req;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: policy_lab TRACE sweep|table|oracle|budget|prefetch\n");
        return 2;
    }
    sl_trace t;
    sl_requests R;
    sl_error err;
    if (sl_trace_load(&t, argv[1], &err) || sl_requests_build(&R, &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int K = R.n_experts, k = R.k;
    const int sizes[3] = {(int)(0.1 * K + 0.5), K / 4, K / 2};
    const char *mode = argv[2];
    if (getenv("MARKOV_LAG")) markov_lag = atoi(getenv("MARKOV_LAG"));
    if (!strcmp(mode, "sweep")) { /* decay's halflife per size */
        const double hl[] = {2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
        for (int z = 0; z < 3; z++) {
            printf("S=%d belady %.1f:", sizes[z], belady(&R, sizes[z]));
            for (size_t h = 0; h < sizeof hl / sizeof *hl; h++) {
                pol p = {P_DECAY, hl[h], 0, ""};
                printf(" h%g=%.1f", hl[h], pct(run_all(&R, sizes[z], &p, NULL)));
                fflush(stdout);
            }
            printf("\n");
        }
    } else if (!strcmp(mode, "table")) {
        const double h = argc > 3 ? atof(argv[3]) : 32;
        pol ps[] = {
            {P_LRU, 0, 0, "lru"},
            {P_LFU, 0, 0, "lfu"},
            {P_DECAY, 32, 0, "decay32"},
            {P_DECAY, h, 0, "decay-h"},
            {P_DECAY_REC, h, 0.5, "decay+rec.5"},
            {P_DECAY_REC, h, 1, "decay+rec1"},
            {P_DECAY_INS, h, 0.5, "decay-ins.5"},
            {P_DECAY_INS, h, 2, "decay-ins2"},
            {P_DECAY_MAX, h, 4 * h, "decay-max4h"},
            {P_DECAY_MAX, h, h / 4, "decay-maxh/4"},
            {P_GAP, 0.3, 0, "gap.3"},
            {P_GAP, 0.1, 0, "gap.1"},
            {P_ARC, 0, 0, "arc"},
        };
        for (int z = 0; z < 3; z++) {
            printf("S=%d belady %.1f:", sizes[z], belady(&R, sizes[z]));
            for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
                printf(" %s=%.1f", ps[i].name, pct(run_all(&R, sizes[z], &ps[i], NULL)));
                fflush(stdout);
            }
            printf("\n");
        }
    } else if (!strcmp(mode, "oracle")) { /* decay told the next b requests */
        const double h = argc > 3 ? atof(argv[3]) : 32;
        for (int z = 0; z < 3; z++) {
            printf("S=%d belady %.1f:", sizes[z], belady(&R, sizes[z]));
            const int hz[] = {1, 2, 4, 8, 16};
            for (int j = 0; j < 5; j++) {
                pol p = {P_DECAY_NX, h, hz[j], ""};
                printf(" next%d=%.1f", hz[j], pct(run_all(&R, sizes[z], &p, NULL)));
                fflush(stdout);
            }
            printf("\n");
        }
    } else if (!strcmp(mode, "rate")) { /* oracles of the future rate, and a Markov estimate */
        const double h = argc > 3 ? atof(argv[3]) : 32;
        for (int z = 0; z < 3; z++) {
            printf("S=%d belady %.1f:", sizes[z], belady(&R, sizes[z]));
            const int w[] = {8, 16, 32, 64, 128, 256};
            for (int j = 0; j < 6; j++) {
                pol p = {P_FUTRATE, h, w[j], ""};
                printf(" fut%d=%.1f", w[j], pct(run_all(&R, sizes[z], &p, NULL)));
                fflush(stdout);
            }
            const double bm[] = {8, 32, 128};
            for (int j = 0; j < 3; j++) {
                pol p = {P_MARKOV, h, bm[j], ""};
                printf(" markov%g=%.1f", bm[j], pct(run_all(&R, sizes[z], &p, NULL)));
                fflush(stdout);
            }
            printf("\n");
        }
    } else if (!strcmp(mode, "budget")) {
        /* per-layer hit curves (decay, a step of slots), then the best split of the same total
         * (a DP over layers), against equal slots and per-layer Belady with equal slots */
        const double h = argc > 3 ? atof(argv[3]) : 32;
        const int step = K / 64 > 1 ? K / 64 : 1, ng = K / step;
        const int NL = R.n_layers;
        int64_t *hc = calloc((size_t)NL * (ng + 1), sizeof(int64_t));
        pol p = {P_DECAY, h, 0, ""};
        for (int l = 0; l < NL; l++)
            for (int g = 1; g <= ng; g++) {
                const int S = g * step;
                if (S < k) continue;
                hc[l * (ng + 1) + g] = run_layer(&R.layers[l], S, K, &p, NULL).hits;
            }
        int64_t req = 0;
        for (int l = 0; l < NL; l++)
            req += R.layers[l].off[R.layers[l].n_req];
        for (int z = 0; z < 3; z++) {
            const int G = sizes[z] * NL / step; /* total budget in steps */
            /* dp[l][b]: best hits of layers < l with b steps */
            int64_t *dp = malloc((size_t)(NL + 1) * (G + 1) * sizeof(int64_t));
            int *ch = malloc((size_t)NL * (G + 1) * sizeof(int));
            for (int b = 0; b <= G; b++)
                dp[b] = b == 0 ? 0 : -1;
            for (int l = 0; l < NL; l++)
                for (int b = 0; b <= G; b++) {
                    int64_t best = -1;
                    int bc = 0;
                    for (int g = 0; g <= ng && g <= b; g++) {
                        if (g * step < k) continue;
                        const int64_t prev = dp[l * (G + 1) + b - g];
                        if (prev < 0) continue;
                        const int64_t v = prev + hc[l * (ng + 1) + g];
                        if (v > best) best = v, bc = g;
                    }
                    dp[(l + 1) * (G + 1) + b] = best, ch[l * (G + 1) + b] = bc;
                }
            int64_t bestv = -1;
            int bb = 0;
            for (int b = 0; b <= G; b++)
                if (dp[NL * (G + 1) + b] > bestv) bestv = dp[NL * (G + 1) + b], bb = b;
            printf("S=%d (total %d): decay equal %.1f, decay budgeted %.1f; split:", sizes[z],
                   sizes[z] * NL, pct(run_all(&R, sizes[z], &p, NULL)),
                   100.0 * (double)bestv / (double)req);
            int alloc[256];
            for (int l = NL - 1, b = bb; l >= 0; l--) {
                alloc[l] = ch[l * (G + 1) + b] * step;
                b -= ch[l * (G + 1) + b];
            }
            int64_t bh = 0;
            for (int l = 0; l < NL; l++) {
                int64_t hh;
                printf(" %d", alloc[l]);
                belady_layer(&R, l, alloc[l], &hh);
                bh += hh;
            }
            printf("; belady equal %.1f, belady on the split %.1f\n", belady(&R, sizes[z]),
                   100.0 * (double)bh / (double)req);
            free(dp), free(ch);
        }
        free(hc);
    } else if (!strcmp(mode, "prefetch")) {
        const double h = argc > 3 ? atof(argv[3]) : 32;
        pol p = {P_DECAY, h, 0, ""};
        for (int z = 0; z < 3; z++) {
            const int S = sizes[z];
            const res base = run_all(&R, S, &p, NULL);
            const double rb = (double)(base.req - base.hits) / (double)base.tokens;
            printf("S=%d no prefetch: hits %.1f reads/tok %.2f\n", S, pct(base), rb);
            const int np[2] = {k / 2, k};
            for (int j = 0; j < 2; j++) {
                const double bonus[] = {-99, 0, 0.5, 1, 2};
                for (int b = 0; b < 5; b++) {
                    pf_opt o = {np[j], bonus[b], bonus[b] == -99, 0};
                    const res r = run_all(&R, S, &p, &o);
                    const double miss = (double)(r.req - r.hits - r.used);
                    printf("  pred %2d %s%-4g hits %.1f +ahead %.1f misses/tok %.2f "
                           "reads/tok %.2f (x%.3f) wasted/tok %.2f\n",
                           np[j], bonus[b] == -99 ? "always" : "bonus ",
                           bonus[b] == -99 ? 0 : bonus[b], pct(r),
                           100.0 * (double)(r.hits + r.used) / (double)r.req,
                           miss / (double)r.tokens, (miss + (double)r.inserts) / (double)r.tokens,
                           (miss + (double)r.inserts) / (double)r.tokens / rb,
                           (double)r.wasted / (double)r.tokens);
                    fflush(stdout);
                }
                const int spares[] = {k / 2, k, 2 * k};
                for (int q = 0; q < 3; q++) {
                    pf_opt o = {np[j], 0, 0, spares[q]};
                    const res r = run_all(&R, S, &p, &o);
                    const res same = run_all(&R, S + spares[q], &p, NULL);
                    const double miss = (double)(r.req - r.hits - r.used);
                    printf("  pred %2d spare %-3d hits %.1f +ahead %.1f misses/tok %.2f reads/tok "
                           "%.2f (x%.3f) wasted/tok %.2f; no prefetch at %d slots: hits %.1f "
                           "reads/tok %.2f\n",
                           np[j], spares[q], pct(r),
                           100.0 * (double)(r.hits + r.used) / (double)r.req,
                           miss / (double)r.tokens, (miss + (double)r.inserts) / (double)r.tokens,
                           (miss + (double)r.inserts) / (double)r.tokens / rb,
                           (double)r.wasted / (double)r.tokens, S + spares[q], pct(same),
                           (double)(same.req - same.hits) / (double)same.tokens);
                    fflush(stdout);
                }
            }
        }
    }
    sl_requests_free(&R);
    sl_trace_free(&t);
    return 0;
}
