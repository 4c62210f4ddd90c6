/*
 * QSA (Qwen4-Exp): a token indexer in front of full attention picks which
 * positions each query attends to.
 *
 * index_qk_proj(x) gives idx_heads query heads and one raw key per token, of
 * idx_head_dim each. Queries are RMSNormed (1 + w) and roped at their position;
 * raw keys are cached. Every complete block of idx_ratio keys is mean-pooled,
 * normed (1 + w) and roped at the block's first position; those pooled keys
 * never change, so they are cached too. A query at position p scores the
 * complete blocks b < (p + 1) / ratio by
 *   score_b = sum over heads h of relu(q_h . k_b) / sqrt(idx_head_dim)
 * and attends to the idx_budget / ratio best blocks (chosen as torch.topk
 * does, ties included: see q4_qsa_pick) plus the incomplete tail of positions;
 * with no more complete blocks than that, it attends to everything, exactly as
 * dense attention.
 */
#include <math.h>

#include "families/qwen4_exp/qwen4_exp.h"

sl_status q4_bind_indexer(sl_model *m, int32_t l, sl_error *err) {
    const q4_config *qc = q4_cfg(m);
    q4_layer *L = &q4_mod(m)->layers[l];
    const int64_t ihd = qc->idx_head_dim;
    const char *p = "layers.%d.self_attn.indexer.%s";
    const int64_t H = m->cfg.hidden_size;
    char name[128];
    sl_status st;
    /* A GGUF file (llama.cpp's converter) has index_qk_proj split into q_proj and k_proj. */
    snprintf(name, sizeof name, "layers.%d.self_attn.indexer.q_proj.weight", l);
    if (sl_ckpt_find(&m->ck, name)) {
        if ((st = sl_ckpt_bind(&m->ck, &L->idx_qk, SL_BIND_REQUIRED,
                               SL_DIMS(qc->idx_heads * ihd, H), err, "%s", name)) ||
            (st = sl_ckpt_bind(&m->ck, &L->idx_k, SL_BIND_REQUIRED, SL_DIMS(ihd, H), err, p, l,
                               "k_proj.weight")))
            return st;
    } else if ((st = sl_ckpt_bind(&m->ck, &L->idx_qk, SL_BIND_REQUIRED,
                                  SL_DIMS((qc->idx_heads + 1) * ihd, H), err, p, l,
                                  "index_qk_proj.weight")))
        return st;
    if ((st = sl_ckpt_bind(&m->ck, &L->idx_q_norm, SL_BIND_REQUIRED, SL_DIMS(ihd), err, p, l,
                           "q_layernorm.weight")) ||
        (st = sl_ckpt_bind(&m->ck, &L->idx_k_norm, SL_BIND_REQUIRED, SL_DIMS(ihd), err, p, l,
                           "k_layernorm.weight")))
        return st;
    return SL_OK;
}

/*
 * The block choice must be torch's, ties included: relu makes zero scores common, and when
 * fewer than `top` blocks score above zero, which zero-score blocks are taken decides the
 * output. torch.topk on the CPU takes, of (score, index) pairs compared by score alone, the
 * first k after std::nth_element(pairs, k - 1) (or std::partial_sort when 64 k <= n), whose
 * result with ties follows libstdc++'s introselect: median-of-three partitions while more than
 * three elements remain, a heap selection past a depth of 2 floor(log2 n), then an insertion
 * sort. The functions below follow those steps on an array of block indices.
 */
typedef struct pick_ctx {
    const float *s; /* scores */
    int32_t *v;     /* the block indices being arranged */
} pick_ctx;

/* torch's order for `largest`: NaN first, then by descending score; equal scores unordered. */
static int pick_before(const pick_ctx *c, int32_t a, int32_t b) {
    const float x = c->s[a], y = c->s[b];
    return (isnan(x) && !isnan(y)) || x > y;
}

static void pick_swap(int32_t *v, int64_t i, int64_t j) {
    const int32_t t = v[i];
    v[i] = v[j];
    v[j] = t;
}

/* Heap steps (libstdc++'s __push_heap and __adjust_heap) on v[first, first + len). */
static void heap_push(pick_ctx *c, int64_t first, int64_t hole, int64_t top, int32_t val) {
    int32_t *v = c->v + first;
    for (int64_t parent = (hole - 1) / 2; hole > top && pick_before(c, v[parent], val);
         parent = (hole - 1) / 2) {
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = val;
}

static void heap_adjust(pick_ctx *c, int64_t first, int64_t hole, int64_t len, int32_t val) {
    int32_t *v = c->v + first;
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (pick_before(c, v[child], v[child - 1])) child--;
        v[hole] = v[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    heap_push(c, first, hole, top, val);
}

/* The best (mid - first) of [first, last) into [first, mid), as a heap (__heap_select). */
static void heap_select(pick_ctx *c, int64_t first, int64_t mid, int64_t last) {
    const int64_t len = mid - first;
    for (int64_t parent = (len - 2) / 2; len >= 2; parent--) {
        heap_adjust(c, first, parent, len, c->v[first + parent]);
        if (parent == 0) break;
    }
    for (int64_t i = mid; i < last; i++)
        if (pick_before(c, c->v[i], c->v[first])) {
            const int32_t val = c->v[i];
            c->v[i] = c->v[first];
            heap_adjust(c, first, 0, len, val);
        }
}

/* Moves the median of a, b and m to r (__move_median_to_first). */
static void median_to_first(pick_ctx *c, int64_t r, int64_t a, int64_t b, int64_t m) {
    const int32_t *v = c->v;
    int64_t pick;
    if (pick_before(c, v[a], v[b]))
        pick = pick_before(c, v[b], v[m]) ? b : pick_before(c, v[a], v[m]) ? m : a;
    else
        pick = pick_before(c, v[a], v[m]) ? a : pick_before(c, v[b], v[m]) ? m : b;
    pick_swap(c->v, r, pick);
}

/* Hoare partition of [first, last) around the pivot at p (__unguarded_partition). */
static int64_t partition_at(pick_ctx *c, int64_t first, int64_t last, int64_t p) {
    int32_t *v = c->v;
    for (;;) {
        while (pick_before(c, v[first], v[p]))
            first++;
        last--;
        while (pick_before(c, v[p], v[last]))
            last--;
        if (first >= last) return first;
        pick_swap(v, first, last);
        first++;
    }
}

static void insertion_sort(pick_ctx *c, int64_t first, int64_t last) {
    int32_t *v = c->v;
    for (int64_t i = first + 1; i < last; i++) {
        const int32_t val = v[i];
        int64_t j = i;
        if (pick_before(c, val, v[first])) {
            memmove(v + first + 1, v + first, (size_t)(i - first) * sizeof *v);
            j = first;
        } else {
            while (pick_before(c, val, v[j - 1])) {
                v[j] = v[j - 1];
                j--;
            }
        }
        v[j] = val;
    }
}

void q4_qsa_pick(const float *scores, int32_t n, int32_t top, int32_t *order, uint8_t *taken) {
    memset(taken, 0, (size_t)n);
    if (top > n) top = n;
    if (top <= 0) return;
    pick_ctx c = {scores, order};
    for (int32_t b = 0; b < n; b++)
        order[b] = b;
    if ((int64_t)top * 64 <= n) { /* partial_sort: its heap selection decides the set */
        heap_select(&c, 0, top, n);
    } else { /* nth_element(order, top - 1) */
        int64_t first = 0, last = n;
        const int64_t nth = top - 1;
        int depth = 0;
        for (int32_t x = n; x > 1; x >>= 1)
            depth += 2;
        while (last - first > 3) {
            if (depth-- == 0) {
                heap_select(&c, first, nth + 1, last);
                pick_swap(order, first, nth);
                first = last; /* done */
                break;
            }
            const int64_t mid = first + (last - first) / 2;
            median_to_first(&c, first, first + 1, mid, last - 1);
            const int64_t cut = partition_at(&c, first + 1, last, first);
            if (cut <= nth)
                first = cut;
            else
                last = cut;
        }
        if (first < last) insertion_sort(&c, first, last);
    }
    for (int32_t k = 0; k < top; k++)
        taken[order[k]] = 1;
}

/* Pooled, normed and roped keys of the blocks that complete within this chunk. */
static void pool_blocks(sl_session *s, int32_t l, int32_t T) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    const sl_backend *be = s->be;
    const q4_layer *L = &q4_mod(m)->layers[l];
    const q4_session *b = q4_ses(s);
    const int32_t ihd = qc->idx_head_dim, R = qc->idx_ratio;
    const size_t nblk = (size_t)(s->max_ctx / R) + 1;
    const float *keys = b->idx_kcache + (size_t)(l - s->layer0) * (size_t)s->max_ctx * (size_t)ihd;
    float *blocks = b->idx_blocks + (size_t)(l - s->layer0) * nblk * (size_t)ihd;
    for (int32_t bk = s->pos / R; (bk + 1) * R <= s->pos + T; bk++) {
        float *k = blocks + (size_t)bk * (size_t)ihd;
        /* the mean of the block's R raw keys: their sum, then / R */
        be->ops->weighted_sum(be, k, keys + (size_t)bk * (size_t)R * (size_t)ihd, NULL, b->ones, 1,
                              R, ihd);
        be->ops->activate(be, k, k, (size_t)ihd, (float)R, 1.0f, SL_ACT_NONE);
        be->ops->rmsnorm(be, k, k, &L->idx_k_norm, 1, ihd, c->rms_norm_eps, m->norm_offset);
        be->ops->rope(be, k, 1, 1, ihd, c->rot_dim, bk * R, s->rope_cos, s->rope_sin);
    }
}

void q4_qsa_select(sl_session *s, int32_t l, int32_t T, blk_attn_sel *out) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    const sl_backend *be = s->be;
    const q4_layer *L = &q4_mod(m)->layers[l];
    q4_session *b = q4_ses(s);
    const int32_t ih = qc->idx_heads, ihd = qc->idx_head_dim, R = qc->idx_ratio;
    const int32_t top = qc->idx_budget / R, stride = qc->idx_budget + R - 1;
    const size_t nq = (size_t)ih * (size_t)ihd, row = nq + (size_t)ihd;
    const size_t nblk = (size_t)(s->max_ctx / R) + 1;
    float *keys = b->idx_kcache + (size_t)(l - s->layer0) * (size_t)s->max_ctx * (size_t)ihd;
    const float *blocks = b->idx_blocks + (size_t)(l - s->layer0) * nblk * (size_t)ihd;

    if (L->idx_k.data) { /* q and k apart: q straight in place, k through idx_qk */
        be->ops->matmul(be, b->idx_q, s->b.xn, &L->idx_qk, NULL, T);
        be->ops->matmul(be, b->idx_qk, s->b.xn, &L->idx_k, NULL, T);
        be->ops->copy2d(be, keys + (size_t)s->pos * (size_t)ihd, (size_t)ihd, b->idx_qk,
                        (size_t)ihd, T, ihd);
    } else {
        be->ops->matmul(be, b->idx_qk, s->b.xn, &L->idx_qk, NULL, T);
        be->ops->copy2d(be, b->idx_q, nq, b->idx_qk, row, T, (int32_t)nq);
        be->ops->copy2d(be, keys + (size_t)s->pos * (size_t)ihd, (size_t)ihd, b->idx_qk + nq, row,
                        T, ihd);
    }
    be->ops->rmsnorm(be, b->idx_q, b->idx_q, &L->idx_q_norm, T * ih, ihd, c->rms_norm_eps,
                     m->norm_offset);
    be->ops->rope(be, b->idx_q, T, ih, ihd, c->rot_dim, s->pos, s->rope_cos, s->rope_sin);
    pool_blocks(s, l, T);

    /* The choice of blocks is made on the host from the scores; the lists go back. */
    for (int32_t t = 0; t < T; t++) {
        const int32_t p = s->pos + t, nb = (p + 1) / R;
        int32_t *sel = b->h_qsa_sel + (size_t)t * (size_t)stride, n = 0;
        if (nb <= top) { /* within the budget: dense */
            for (int32_t j = 0; j <= p; j++)
                sel[n++] = j;
            b->h_qsa_nsel[t] = n;
            continue;
        }
        const float *sc = b->h_qsa_scores;
        be->ops->qsa_scores(be, b->qsa_scores, b->idx_q + (size_t)t * nq, blocks, ih, nb, ihd);
        be->ops->to_host(be, b->h_qsa_scores, b->qsa_scores, (size_t)nb * sizeof(float));
        q4_qsa_pick(sc, nb, top, b->qsa_order, b->qsa_taken);
        for (int32_t bk = 0; bk < nb; bk++)
            for (int32_t j = 0; b->qsa_taken[bk] && j < R; j++)
                sel[n++] = bk * R + j;
        for (int32_t j = nb * R; j <= p; j++)
            sel[n++] = j;
        b->h_qsa_nsel[t] = n;
    }
    be->ops->to_dev(be, b->qsa_sel, b->h_qsa_sel, (size_t)T * (size_t)stride * sizeof(int32_t));
    be->ops->to_dev(be, b->qsa_nsel, b->h_qsa_nsel, (size_t)T * sizeof(int32_t));
    *out = (blk_attn_sel){.sel = b->qsa_sel, .n_sel = b->qsa_nsel, .stride = stride};
}
