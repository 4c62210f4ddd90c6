/* Qwen4-Exp's keys of config.json (the family's read_config hook). */
#include <jansson.h>

#include "families/qwen4_exp/qwen4_exp.h"

int32_t q4_ngram_heads(const q4_config *qc) {
    return (qc->ngram_size - 1) * qc->ngram_heads_per;
}

/*
 * Hyper-connections (hc_count streams), PLE on the one-indexed ple_layer_ids
 * (linear-attention layers only), the QSA indexer on full attention, and the
 * output gate of Gated DeltaNet (output_gate_type); norm_topk_prob defaults to
 * true in this family.
 */
sl_status q4_read_config(sl_config *c, const json_t *root, const char *path, sl_error *err) {
    sl_status st;
    q4_config *qc = malloc(sizeof *qc + (size_t)c->n_layers);
    if (!qc) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    memset(qc, 0, sizeof *qc);
    c->fam = qc; /* freed with the config, also on error */
    if (!json_object_get(root, "norm_topk_prob")) c->norm_topk_prob = 1;
    const int64_t big = INT32_MAX / 4;
    json_t *gt = json_object_get(root, "output_gate_type");
    if (gt && !json_is_null(gt)) {
        const char *g = json_string_value(gt);
        if (!g || (strcmp(g, "silu") != 0 && strcmp(g, "sigmoid") != 0))
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: output_gate_type '%s' is not supported (silu or sigmoid)", path,
                           g ? g : "?");
        c->lin_gate_sigmoid = strcmp(g, "sigmoid") == 0;
    }
    if ((st = sl_config_int(root, "hc_count", 4, 2, 64, &qc->hc_count, path, err)) ||
        (st = sl_config_int(root, "hc_lowrank", 320, 1, 1 << 16, &qc->hc_lowrank, path, err)) ||
        (st = sl_config_int(root, "ple_embed_dim", c->hidden_size, 1, 1 << 20, &qc->ple_embed_dim,
                            path, err)) ||
        (st = sl_config_int(root, "ple_conv_kernel_size", 4, 1, 64, &qc->ple_conv_kernel, path,
                            err)) ||
        (st = sl_config_int(root, "ngram_size", 3, 2, 8, &qc->ngram_size, path, err)) ||
        (st = sl_config_int(root, "heads_per_ngram", 8, 1, 256, &qc->ngram_heads_per, path, err)) ||
        (st = sl_config_int(root, "ngram_vocab_size_base", 20000000, 2, big, &qc->ngram_vocab_base,
                            path, err)) ||
        (st = sl_config_int(root, "make_ngram_vocab_size_divisible_by", 128, 1, 1 << 20,
                            &qc->ngram_vocab_divisor, path, err)) ||
        (st = sl_config_int(root, "indexer_n_heads", 0, 0, 4096, &qc->idx_heads, path, err)) ||
        (st = sl_config_int(root, "indexer_head_dim", 0, 0, 4096, &qc->idx_head_dim, path, err)) ||
        (st = sl_config_int(root, "indexer_budget", 0, 0, big, &qc->idx_budget, path, err)) ||
        (st = sl_config_int(root, "indexer_compress_ratio", 0, 0, big, &qc->idx_ratio, path, err)))
        return st;
    json_t *seed = json_object_get(root, "seed");
    qc->ngram_seed = 1234;
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: 'seed' is not a non-negative integer", path);
        qc->ngram_seed = json_integer_value(seed);
    }
    if (qc->idx_heads) {
        int32_t kv = 1;
        if ((st = sl_config_int(root, "indexer_kv_heads", -1, 1, 4096, &kv, path, err))) return st;
        if (kv != 1 || qc->idx_head_dim < c->rot_dim || qc->idx_ratio < 1 ||
            qc->idx_budget < qc->idx_ratio || qc->idx_budget % qc->idx_ratio)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: QSA indexer needs indexer_kv_heads = 1, indexer_head_dim >= the "
                           "rotary dims (%d), and indexer_budget a multiple of "
                           "indexer_compress_ratio",
                           path, c->rot_dim);
    }
    memset(qc->layer_ple, -1, (size_t)c->n_layers);
    json_t *ids = json_object_get(root, "ple_layer_ids");
    if (ids && !json_is_null(ids)) {
        if (!json_is_array(ids))
            return sl_fail(err, SL_ERR_FORMAT, "%s: 'ple_layer_ids' is not an array", path);
        /* Sorted and deduplicated, as transformers does; layer ids are one-indexed. */
        for (int32_t l = 0; l < c->n_layers; l++) {
            size_t i;
            json_t *v;
            json_array_foreach(ids, i, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                    json_integer_value(v) > c->n_layers)
                    return sl_fail(err, SL_ERR_FORMAT,
                                   "%s: ple_layer_ids[%zu] is not a layer id in [1, %d]", path, i,
                                   c->n_layers);
                if (json_integer_value(v) != l + 1 || qc->layer_ple[l] >= 0) continue;
                if (!c->layer_is_linear || !c->layer_is_linear[l])
                    return sl_fail(err, SL_ERR_UNSUPPORTED,
                                   "%s: PLE on layer %d, which is not a linear-attention layer",
                                   path, l + 1);
                if (qc->n_ple_layers >= 127)
                    return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: too many PLE layers", path);
                qc->layer_ple[l] = (int8_t)qc->n_ple_layers++;
            }
        }
    }
    if (qc->n_ple_layers) {
        if (qc->ple_embed_dim % q4_ngram_heads(qc) != 0)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: ple_embed_dim %d is not a multiple of the %d n-gram heads", path,
                           qc->ple_embed_dim, q4_ngram_heads(qc));
        if (c->eos_id < 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: PLE layers need eos_token_id (a token id)",
                           path);
    }
    return SL_OK;
}
