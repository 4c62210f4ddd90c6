/* Gemma 4's keys of config.json (the family's read_config hook). */
#include <float.h>
#include <jansson.h>
#include <math.h>

#include "families/gemma4/gemma4.h"

static const char *const kind_names[G4_KINDS] = {"sliding_attention", "full_attention"};

/* layer_types as Gemma4TextConfig resolves it: given, or every sixth layer full; the last layer
 * is always full (transformers forces it, with a warning). */
static sl_status parse_layer_types(const sl_config *c, g4_config *g, const json_t *root,
                                   const char *path, sl_error *err) {
    json_t *types = json_object_get(root, "layer_types");
    if (!types || json_is_null(types)) {
        for (int32_t l = 0; l < c->n_layers; l++)
            g->layers[l].kind = (l + 1) % 6 ? G4_SLIDING : G4_FULL;
    } else {
        if (!json_is_array(types) || json_array_size(types) != (size_t)c->n_layers)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: 'layer_types' is not an array of num_hidden_layers entries", path);
        for (int32_t l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (t && strcmp(t, kind_names[G4_SLIDING]) == 0)
                g->layers[l].kind = G4_SLIDING;
            else if (t && strcmp(t, kind_names[G4_FULL]) == 0)
                g->layers[l].kind = G4_FULL;
            else
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: layer_types[%d] '%s' is not supported (sliding_attention or "
                               "full_attention)",
                               path, l, t ? t : "?");
        }
    }
    g->layers[c->n_layers - 1].kind = G4_FULL;
    return SL_OK;
}

/*
 * Head shapes per layer: per_layer_config when the config has it (transformers 5.17 saves it:
 * {"05": {"head_dim": 512, "num_key_value_heads": 2}, ...}, layers it does not name taking the
 * top-level values), else what Gemma4TextConfig derives from global_head_dim (default 512) and,
 * with attention_k_eq_v, num_global_key_value_heads for every full layer. hd and nkv: [n_layers].
 */
static sl_status parse_head_shapes(const sl_config *c, const g4_config *g, int32_t k_eq_v,
                                   const json_t *root, const char *path, int32_t *hd, int32_t *nkv,
                                   sl_error *err) {
    sl_status st;
    for (int32_t l = 0; l < c->n_layers; l++)
        hd[l] = c->head_dim, nkv[l] = c->n_kv_heads;
    json_t *plc = json_object_get(root, "per_layer_config");
    if (!plc || json_is_null(plc)) {
        int32_t ghd, gkv = 0;
        if ((st = sl_config_int(root, "global_head_dim", 512, 2, 4096, &ghd, path, err)) ||
            (st = sl_config_int(root, "num_global_key_value_heads", 0, 0, 4096, &gkv, path, err)))
            return st;
        for (int32_t l = 0; l < c->n_layers; l++) {
            if (g->layers[l].kind != G4_FULL) continue;
            hd[l] = ghd;
            if (k_eq_v && gkv) nkv[l] = gkv;
        }
        return SL_OK;
    }
    if (!json_is_object(plc))
        return sl_fail(err, SL_ERR_FORMAT, "%s: 'per_layer_config' is not an object", path);
    const char *key;
    json_t *v;
    json_object_foreach(plc, key, v) {
        char *end = NULL;
        const long l = strtol(key, &end, 10);
        if (!*key || *end || l < 0 || l >= c->n_layers || !json_is_object(v))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: per_layer_config['%s'] is not an object under a layer index", path,
                           key);
        const char *k2;
        json_t *v2;
        json_object_foreach(v, k2, v2) {
            if (strcmp(k2, "head_dim") != 0 && strcmp(k2, "num_key_value_heads") != 0)
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: per_layer_config['%s'].%s is not supported (head_dim and "
                               "num_key_value_heads are)",
                               path, key, k2);
        }
        if ((st = sl_config_int(v, "head_dim", hd[l], 2, 4096, &hd[l], path, err)) ||
            (st = sl_config_int(v, "num_key_value_heads", nkv[l], 1, 4096, &nkv[l], path, err)))
            return st;
    }
    return SL_OK;
}

/* rope_parameters[kind] into k (head_dim already set): rope_type "default" or "proportional". */
static sl_status parse_kind_rope(g4_kind *k, const json_t *rp, const char *kname, const char *path,
                                 sl_error *err) {
    sl_status st;
    if (!json_is_object(rp))
        return sl_fail(err, SL_ERR_FORMAT, "%s: rope_parameters.%s is not an object", path, kname);
    json_t *type = json_object_get(rp, "rope_type");
    const char *tn = json_is_string(type) ? json_string_value(type) : type ? NULL : "default";
    double partial = 1.0;
    k->factor = 1.0;
    if ((st = sl_config_num(rp, "rope_theta", 10000.0, 1.0, 0, FLT_MAX, &k->theta, path, err)))
        return st;
    if (tn && strcmp(tn, "default") == 0) {
        k->rope_angles = k->head_dim / 2;
        return SL_OK;
    }
    if (!tn || strcmp(tn, "proportional") != 0)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: rope_parameters.%s.rope_type '%s' is not supported ('default' or "
                       "'proportional')",
                       path, kname, tn ? tn : "?");
    if ((st = sl_config_num(rp, "partial_rotary_factor", 1.0, 0.0, 0, 1.0, &partial, path, err)) ||
        (st = sl_config_num(rp, "factor", 1.0, 0.0, 1, 1e9, &k->factor, path, err)))
        return st;
    /* Python's int(partial * head_dim // 2): floor of the float product's half */
    k->rope_angles = (int32_t)floor(partial * k->head_dim / 2.0);
    return SL_OK;
}

sl_status g4_read_config(sl_config *c, const json_t *root, const char *path, sl_error *err) {
    sl_status st;
    const size_t nl = (size_t)c->n_layers;
    g4_config *g = calloc(1, sizeof *g + nl * sizeof(g4_layer_cfg));
    int32_t *hd = calloc(2 * nl, sizeof(int32_t)), *nkv = hd ? hd + nl : NULL;
    if (!g || !hd) {
        free(g), free(hd);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    c->fam = g; /* freed with the config, also on error */
    const int64_t big = INT32_MAX / 4;
    int32_t k_eq_v = 0, double_wide = 0;
    json_t *act = json_object_get(root, "hidden_activation");
    json_t *bidi = json_object_get(root, "use_bidirectional_attention");
    const char *bidi_s = json_string_value(bidi);
    if (act && !json_is_null(act) &&
        !(json_is_string(act) && strcmp(json_string_value(act), "gelu_pytorch_tanh") == 0))
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: hidden_activation '%s' is not supported (only gelu_pytorch_tanh)", path,
                     json_is_string(act) ? json_string_value(act) : "?");
    else if (c->attention_bias)
        st = sl_fail(err, SL_ERR_UNSUPPORTED, "%s: attention_bias is not supported", path);
    else if (bidi && !json_is_null(bidi) && !(bidi_s && strcmp(bidi_s, "vision") == 0))
        /* "vision" only changes the attention of image tokens; text stays causal */
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: use_bidirectional_attention '%s' is not supported (null or 'vision')",
                     path, bidi_s ? bidi_s : "?");
    else if (!(st = sl_config_int(root, "sliding_window", 512, 1, INT32_MAX, &g->sliding_window,
                                  path, err)) &&
             !(st = sl_config_int(root, "enable_moe_block", 0, 0, 1, &g->moe, path, err)) &&
             !(st = sl_config_int(root, "attention_k_eq_v", 0, 0, 1, &k_eq_v, path, err)) &&
             !(st = sl_config_int(root, "hidden_size_per_layer_input", 256, 0, 1 << 16, &g->ple_dim,
                                  path, err)) &&
             !(st = sl_config_int(root, "vocab_size_per_layer_input", 262144, 1, big, &g->ple_vocab,
                                  path, err)) &&
             !(st = sl_config_int(root, "num_kv_shared_layers", 0, 0, c->n_layers - 1,
                                  &g->n_kv_shared, path, err)) &&
             !(st = sl_config_int(root, "use_double_wide_mlp", 0, 0, 1, &double_wide, path, err)))
        st = parse_layer_types(c, g, root, path, err);
    if (!st) st = parse_head_shapes(c, g, k_eq_v, root, path, hd, nkv, err);
    /* One head shape per attention kind (transformers builds one RoPE table per kind) */
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        g4_kind *k = &g->kind[g->layers[l].kind];
        if (!k->head_dim) k->head_dim = hd[l], k->n_kv_heads = nkv[l];
        if (hd[l] % 2 || hd[l] != k->head_dim || nkv[l] != k->n_kv_heads ||
            c->n_heads % nkv[l] != 0)
            st = sl_fail(err, SL_ERR_UNSUPPORTED,
                         "%s: layer %d: head_dim %d with %d KV heads (its type's layers have %d "
                         "and %d; num_attention_heads %d must be a multiple, head_dim even)",
                         path, l, hd[l], nkv[l], k->head_dim, k->n_kv_heads, c->n_heads);
    }
    free(hd);
    if (st) return st;
    g->kind[G4_FULL].no_v = k_eq_v;
    /* RoPE per kind: rope_parameters.{sliding_attention, full_attention}, or Gemma 4's defaults */
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && !json_is_null(rp) && !json_is_object(rp))
        return sl_fail(err, SL_ERR_FORMAT, "%s: 'rope_parameters' is not an object", path);
    for (int k = 0; k < G4_KINDS; k++) {
        g4_kind *K = &g->kind[k];
        if (!K->head_dim) continue; /* no layer of this kind */
        json_t *kr = json_object_get(rp, kind_names[k]);
        if (!rp || json_is_null(rp)) {
            K->theta = k == G4_FULL ? 1e6 : 1e4;
            K->factor = 1.0;
            K->rope_angles = k == G4_FULL ? (int32_t)(0.25 * K->head_dim / 2) : K->head_dim / 2;
        } else if ((st = parse_kind_rope(K, kr, kind_names[k], path, err))) {
            return st;
        }
        g->max_head_dim = SL_MAX(g->max_head_dim, K->head_dim);
        g->max_q = SL_MAX(g->max_q, c->n_heads * K->head_dim);
        g->max_kv = SL_MAX(g->max_kv, K->n_kv_heads * K->head_dim);
    }
    /* The shared RoPE table (unused here) gets the first kind's shape */
    const g4_kind *k0 = g->kind[G4_SLIDING].head_dim ? &g->kind[G4_SLIDING] : &g->kind[G4_FULL];
    c->rot_dim = k0->head_dim;
    c->rope_theta = k0->theta;
    /* KV sharing: the last num_kv_shared_layers layers attend the K/V of the last earlier layer
     * of their kind (Gemma4TextAttention.store_full_length_kv) and have no K/V weights */
    const int32_t first_shared = c->n_layers - g->n_kv_shared;
    for (int32_t l = 0; l < c->n_layers; l++) {
        g4_layer_cfg *L = &g->layers[l];
        L->kv_src = l;
        if (l < first_shared) continue;
        L->double_wide = (uint8_t)double_wide;
        L->kv_src = -1;
        for (int32_t j = first_shared - 1; j >= 0 && L->kv_src < 0; j--)
            if (g->layers[j].kind == L->kind) L->kv_src = j;
        if (L->kv_src < 0)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: layer %d shares the K/V of an earlier %s layer, but none comes "
                           "before layer %d (num_kv_shared_layers %d)",
                           path, l, kind_names[L->kind], first_shared, g->n_kv_shared);
    }
    if (c->intermediate_size <= 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: missing 'intermediate_size'", path);
    if (g->ple_dim && g->ple_vocab < c->vocab_size)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: vocab_size_per_layer_input %d is below vocab_size %d (the per-layer "
                       "embedding has no row for the last ids)",
                       path, g->ple_vocab, c->vocab_size);
    /* The MoE block: routed experts (GELU-tanh, like the MLP) beside every layer's MLP, their
     * router's top-k weights renormalised. Without it the model is dense. */
    c->expert_glu = SL_GLU_GELU_TANH;
    if (!g->moe) {
        c->n_experts = c->n_experts_used = 0;
        memset(c->layer_is_moe, 0, nl);
        return SL_OK;
    }
    if (c->n_experts < 1 || c->n_experts_used < 1 || c->moe_intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: enable_moe_block needs num_experts, top_k_experts and "
                       "moe_intermediate_size",
                       path);
    c->norm_topk_prob = 1;
    memset(c->layer_is_moe, 1, nl);
    return SL_OK;
}
