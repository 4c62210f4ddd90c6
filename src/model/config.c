/*
 * config.json parsing with jansson. Keys follow transformers 5.17: RoPE's base
 * may sit at the top level ("rope_theta") or inside "rope_parameters" (the
 * 5.x spelling) or "rope_scaling", with transformers' precedence (parse_rope);
 * the default RoPE type and YaRN are supported.
 */
#include "model/config.h"

#include <float.h>
#include <jansson.h>
#include <math.h>

#include "model/model.h"

/* An integer key in [lo, hi]. A missing key takes dflt, unless dflt < lo (required). */
sl_status sl_config_int(const json_t *o, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                        int32_t *out, const char *path, sl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (dflt < lo) return sl_fail(err, SL_ERR_FORMAT, "%s: missing '%s'", path, key);
        *out = (int32_t)dflt;
        return SL_OK;
    }
    /* Flags may be spelled true/false; as numbers they pass the same range check. */
    if (!json_is_integer(v) && !json_is_boolean(v))
        return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not an integer", path, key);
    int64_t x = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
    if (x < lo || x > hi)
        return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' = %lld is out of range [%lld, %lld]", path,
                       key, (long long)x, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return SL_OK;
}

/* A number key in [lo, hi] (lo excluded when lo_open). A missing key takes dflt, unless
 * dflt is NaN (required). The message names the key, its value and the range, so a typo such
 * as "rms_norm_eps": -1 is refused at load rather than turning every logit into NaN. */
sl_status sl_config_num(const json_t *o, const char *key, double dflt, double lo, int lo_open,
                        double hi, double *out, const char *path, sl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (isnan(dflt)) return sl_fail(err, SL_ERR_FORMAT, "%s: missing '%s'", path, key);
        *out = dflt;
        return SL_OK;
    }
    if (!json_is_number(v))
        return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not a number", path, key);
    const double x = json_number_value(v);
    if (!isfinite(x)) return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not finite", path, key);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' = %g is out of range %c%g, %g]", path, key, x,
                       lo_open ? '(' : '[', lo, hi);
    *out = x;
    return SL_OK;
}

/* YaRN's keys of rope dict rp (named name), resolved as _compute_yarn_parameters does: factor
 * (max_position / original when absent), beta_fast and beta_slow (32 and 1 when absent or 0),
 * truncate (default on), and attention_factor (the key's, else 0.1 ln(factor) + 1, or with both
 * mscale and mscale_all_dim the ratio of their two such terms). original_max_position_embeddings
 * at the top level wins over the dict's (RotaryEmbeddingConfigMixin), and max_position stands
 * in for both. */
static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static sl_status parse_yarn(sl_config *c, const json_t *root, const json_t *rp, const char *path,
                            sl_error *err) {
    sl_rope_scaling *r = &c->rope;
    const char *ok = "original_max_position_embeddings";
    double orig = c->max_position;
    int32_t trunc = 1;
    sl_status st;
    if ((st = sl_config_num(json_object_get(root, ok) ? root : rp, ok, orig, 1, 0, 1e12, &orig,
                            path, err)))
        return st;
    r->original_max_position = orig;
    r->attention_factor = NAN;
    if ((st = sl_config_num(rp, "factor", c->max_position / orig, 0, 1, 1e9, &r->factor, path,
                            err)) ||
        (st = sl_config_num(rp, "beta_fast", 0, -1e9, 0, 1e9, &r->beta_fast, path, err)) ||
        (st = sl_config_num(rp, "beta_slow", 0, -1e9, 0, 1e9, &r->beta_slow, path, err)) ||
        (st = sl_config_num(rp, "mscale", 0, -1e9, 0, 1e9, &r->mscale, path, err)) ||
        (st =
             sl_config_num(rp, "mscale_all_dim", 0, -1e9, 0, 1e9, &r->mscale_all_dim, path, err)) ||
        (json_object_get(rp, "attention_factor") &&
         (st = sl_config_num(rp, "attention_factor", 1, 0, 1, 1e9, &r->attention_factor, path,
                             err))) ||
        (st = sl_config_int(rp, "truncate", 1, 0, 1, &trunc, path, err)))
        return st;
    if (r->beta_fast == 0) r->beta_fast = 32; /* Python's `or`: 0 takes the default too */
    if (r->beta_slow == 0) r->beta_slow = 1;
    r->truncate = trunc;
    if (!isnan(r->attention_factor)) return SL_OK;
    if (r->mscale != 0 && r->mscale_all_dim != 0)
        r->attention_factor =
            yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
    else
        r->attention_factor = yarn_mscale(r->factor, 1);
    return SL_OK;
}

/*
 * RoPE parameters: base frequency, partial rotation and the scaling type (default or YaRN). The
 * precedence is transformers 5.17's (RotaryEmbeddingConfigMixin): "rope_scaling", when present
 * and not empty, stands in for "rope_parameters" as a whole; the keys of that one dict win, and
 * the top-level "rope_theta" and "partial_rotary_factor" only fill what it lacks (a config with
 * both a top-level partial_rotary_factor of 0.25 and 0.5 in rope_parameters rotates half).
 */
static sl_status parse_rope(sl_config *c, const json_t *root, const char *path, sl_error *err) {
    double theta = 10000.0, partial = 1.0;
    sl_status st;
    const char *name = "rope_scaling";
    json_t *rp = json_object_get(root, name);
    if (!json_is_object(rp) || json_object_size(rp) == 0) {
        if (rp && !json_is_null(rp) && !json_is_object(rp))
            return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not an object", path, name);
        name = "rope_parameters";
        rp = json_object_get(root, name);
        if (rp && !json_is_null(rp) && !json_is_object(rp))
            return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not an object", path, name);
    }
    if (json_is_object(rp)) {
        const char *key;
        json_t *v;
        json_object_foreach(rp, key, v) {
            if (json_is_object(v))
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: %s.%s: RoPE parameters per layer type are not supported", path,
                               name, key);
        }
        json_t *type = json_object_get(rp, "rope_type");
        if (!type) type = json_object_get(rp, "type");
        const char *tn = json_is_string(type) ? json_string_value(type) : NULL;
        if (tn && strcmp(tn, "yarn") == 0)
            c->rope.type = SL_ROPE_YARN;
        else if (type && !(tn && strcmp(tn, "default") == 0))
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: %s.rope_type '%s' is not supported ('default' or 'yarn')", path,
                           name, tn ? tn : "?");
    }
    c->rope.attention_factor = 1.0;
    if (c->rope.type == SL_ROPE_YARN && (st = parse_yarn(c, root, rp, path, err))) return st;
    const json_t *theta_from = json_object_get(rp, "rope_theta") ? rp : root;
    const json_t *partial_from = json_object_get(rp, "partial_rotary_factor") ? rp : root;
    /* The inverse frequencies are theta^(-2i/rot) in float32: a base below 1 makes them grow
     * past FLT_MAX (Inf, then 0 * Inf = NaN angles at position 0), and no RoPE model has
     * one. */
    if ((st = sl_config_num(theta_from, "rope_theta", theta, 1.0, 0, FLT_MAX, &theta, path, err)) ||
        (st = sl_config_num(partial_from, "partial_rotary_factor", partial, 0.0, 1, 1.0, &partial,
                            path, err)))
        return st;
    c->rope_theta = theta;
    c->rot_dim = (int32_t)(c->head_dim * partial);
    c->rot_dim -= c->rot_dim % 2;
    if (c->rot_dim < 2)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: head_dim %d x partial_rotary_factor %g rotates %d dims (at least 2 "
                       "are needed)",
                       path, c->head_dim, partial, c->rot_dim);
    return SL_OK;
}

/* Which layers route to experts: not in mlp_only_layers, and (l+1) % decoder_sparse_step == 0. */
static sl_status parse_layer_kinds(sl_config *c, const json_t *root, const char *path,
                                   sl_error *err) {
    c->layer_is_moe = calloc((size_t)c->n_layers, 1);
    if (!c->layer_is_moe) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < c->n_layers; l++)
        c->layer_is_moe[l] = c->n_experts > 0 && (l + 1) % c->decoder_sparse_step == 0;
    json_t *only = json_object_get(root, "mlp_only_layers");
    if (only && !json_is_null(only)) {
        if (!json_is_array(only))
            return sl_fail(err, SL_ERR_FORMAT, "%s: 'mlp_only_layers' is not an array", path);
        size_t i;
        json_t *v;
        json_array_foreach(only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= c->n_layers)
                return sl_fail(err, SL_ERR_FORMAT, "%s: mlp_only_layers[%zu] is not a layer index",
                               path, i);
            c->layer_is_moe[json_integer_value(v)] = 0;
        }
    }
    return SL_OK;
}

/* Whether t names a full-attention layer of the config's family (sl_family.attn_layer_types). */
static int family_attn_type(const sl_config *c, const char *t) {
    for (const char *const *n = c->family ? c->family->attn_layer_types : NULL; n && *n; n++)
        if (strcmp(*n, t) == 0) return 1;
    return 0;
}

/*
 * Hybrid layouts (Qwen3-Next, Qwen3.5): "layer_types" lists "linear_attention" /
 * "full_attention"; without it, layer l is full iff (l+1) % full_attention_interval == 0.
 * Only read when the config declares linear attention heads.
 */
static sl_status parse_linear(sl_config *c, const json_t *root, const char *path, sl_error *err) {
    sl_status st;
    if ((st = sl_config_int(root, "linear_num_value_heads", 0, 0, 4096, &c->lin_n_value_heads, path,
                            err)))
        return st;
    if (c->lin_n_value_heads == 0) return SL_OK;
    int32_t interval = 4;
    if ((st = sl_config_int(root, "linear_num_key_heads", -1, 1, 4096, &c->lin_n_key_heads, path,
                            err)) ||
        (st =
             sl_config_int(root, "linear_key_head_dim", -1, 1, 4096, &c->lin_key_dim, path, err)) ||
        (st = sl_config_int(root, "linear_value_head_dim", -1, 1, 1024, &c->lin_value_dim, path,
                            err)) ||
        (st = sl_config_int(root, "linear_conv_kernel_dim", 4, 1, 64, &c->lin_conv_kernel, path,
                            err)) ||
        (st = sl_config_int(root, "full_attention_interval", 4, 1, 4096, &interval, path, err)))
        return st;
    if (c->lin_n_value_heads % c->lin_n_key_heads != 0)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: linear_num_value_heads %d is not a multiple of "
                       "linear_num_key_heads %d",
                       path, c->lin_n_value_heads, c->lin_n_key_heads);
    c->layer_is_linear = calloc((size_t)c->n_layers, 1);
    if (!c->layer_is_linear) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    json_t *types = json_object_get(root, "layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || json_array_size(types) != (size_t)c->n_layers)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: 'layer_types' is not an array of num_hidden_layers entries", path);
        for (int32_t l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (t && strcmp(t, "linear_attention") == 0)
                c->layer_is_linear[l] = 1;
            else if (!t || (strcmp(t, "full_attention") != 0 && !family_attn_type(c, t)))
                return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: layer_types[%d] '%s' is not supported",
                               path, l, t ? t : "?");
        }
    } else {
        for (int32_t l = 0; l < c->n_layers; l++)
            c->layer_is_linear[l] = (l + 1) % interval != 0;
    }
    for (int32_t l = 0; l < c->n_layers; l++)
        c->n_linear_layers += c->layer_is_linear[l];
    return SL_OK;
}

/* Sliding-window layers: layer_types' "sliding_attention" entries, whose queries see the last
 * sliding_window positions, their own included (transformers' sliding_window_overlay keeps
 * kv_idx > q_idx - sliding_window). Nothing when no layer is one. */
static sl_status parse_sliding(sl_config *c, const json_t *root, const char *path, sl_error *err) {
    json_t *types = json_object_get(root, "layer_types");
    size_t i;
    json_t *v;
    int any = 0;
    json_array_foreach(types, i, v) any |=
        json_is_string(v) && strcmp(json_string_value(v), "sliding_attention") == 0;
    if (!any) return SL_OK;
    if (json_array_size(types) != (size_t)c->n_layers)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: 'layer_types' is not an array of num_hidden_layers entries", path);
    sl_status st =
        sl_config_int(root, "sliding_window", -1, 1, INT32_MAX, &c->sliding_window, path, err);
    if (st) return st;
    if (!(c->layer_is_sliding = calloc((size_t)c->n_layers, 1)))
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    json_array_foreach(types, i, v) c->layer_is_sliding[i] =
        json_is_string(v) && strcmp(json_string_value(v), "sliding_attention") == 0;
    return SL_OK;
}

/* eos_token_id of the text config (else the top level): an integer or a list, whose first
 * entry counts. A family that computes with it requires it in its read_config; elsewhere a
 * value that is not a token id is ignored. */
static void parse_eos(sl_config *c, const json_t *root, const json_t *top) {
    json_t *v = json_object_get(root, "eos_token_id");
    if (!v || json_is_null(v)) v = json_object_get(top, "eos_token_id");
    if (json_is_array(v)) v = json_array_get(v, 0);
    c->eos_id =
        json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < c->vocab_size
            ? (int32_t)json_integer_value(v)
            : -1;
}

sl_status sl_config_parse(sl_config *c, const char *text, const char *path, sl_error *err) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        return sl_fail(err, SL_ERR_FORMAT, "%s: invalid JSON (%s, line %d)", path, jerr.text,
                       jerr.line);
    json_t *const top = root; /* root moves to "text_config" when there is one */
    sl_status st = SL_OK;
    const int64_t big = INT32_MAX / 4;
    if (!json_is_object(root)) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: missing 'model_type'", path);
        goto done;
    }
    snprintf(c->arch, sizeof c->arch, "%s", json_string_value(mt));
    /* An architecture sluice does not run still parses (inspecting a config needs no family);
     * loading refuses it. */
    c->family = sl_family_find(c->arch);
    /* A vision-language checkpoint (Qwen3.5-MoE) nests the text model's config. */
    json_t *tc = json_object_get(root, "text_config");
    if (json_is_object(tc)) root = tc;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0)) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)",
                     path, json_is_string(act) ? json_string_value(act) : "?");
        goto done;
    }
    json_t *sw = json_object_get(root, "use_sliding_window");
    if (json_is_true(sw)) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED, "%s: use_sliding_window is not supported", path);
        goto done;
    }
    double eps = 0;
    if ((st = sl_config_int(root, "vocab_size", -1, 1, big, &c->vocab_size, path, err)) ||
        (st = sl_config_int(root, "hidden_size", -1, 1, 1 << 20, &c->hidden_size, path, err)) ||
        (st = sl_config_int(root, "num_hidden_layers", -1, 1, 4096, &c->n_layers, path, err)) ||
        (st = sl_config_int(root, "num_attention_heads", -1, 1, 4096, &c->n_heads, path, err)) ||
        (st = sl_config_int(root, "num_key_value_heads", c->n_heads, 1, 4096, &c->n_kv_heads, path,
                            err)) ||
        (st = sl_config_int(root, "head_dim", c->hidden_size / c->n_heads, 2, 4096, &c->head_dim,
                            path, err)) ||
        (st = sl_config_int(root, "intermediate_size", 0, 0, big, &c->intermediate_size, path,
                            err)) ||
        (st = sl_config_int(root, "moe_intermediate_size", 0, 0, big, &c->moe_intermediate_size,
                            path, err)) ||
        (st = sl_config_int(root, "shared_expert_intermediate_size", 0, 0, big,
                            &c->shared_intermediate_size, path, err)) ||
        /* transformers 5.x saves some families' expert count as num_local_experts */
        (st = sl_config_int(root, "num_experts", 0, 0, 1 << 16, &c->n_experts, path, err)) ||
        (st = sl_config_int(root, "num_local_experts", c->n_experts, 0, 1 << 16, &c->n_experts,
                            path, err)) ||
        (st = sl_config_int(root, "num_experts_per_tok", 0, 0, 1 << 16, &c->n_experts_used, path,
                            err)) ||
        /* Gemma 4's name for it */
        (st = sl_config_int(root, "top_k_experts", c->n_experts_used, 0, 1 << 16,
                            &c->n_experts_used, path, err)) ||
        (st = sl_config_int(root, "decoder_sparse_step", 1, 1, 4096, &c->decoder_sparse_step, path,
                            err)) ||
        (st = sl_config_int(root, "norm_topk_prob", 0, 0, 1, &c->norm_topk_prob, path, err)) ||
        /* The top level's, also when text_config has its own: transformers' vision-language
         * model ties by its own config's key (default false), which text_config's does not
         * change. */
        (st = sl_config_int(top, "tie_word_embeddings", 0, 0, 1, &c->tie_word_embeddings, path,
                            err)) ||
        (st = sl_config_int(root, "attention_bias", 0, 0, 1, &c->attention_bias, path, err)) ||
        (st = sl_config_int(root, "qkv_bias", 1, 0, 1, &c->qkv_bias, path, err)) ||
        (st = sl_config_int(root, "max_position_embeddings", 32768, 1, INT32_MAX, &c->max_position,
                            path, err)) ||
        /* eps keeps a zero row's norm finite (0 * rsqrt(eps)): it must stay a positive
         * float32, neither 0 nor Inf once rounded. */
        (st = sl_config_num(root, "rms_norm_eps", 1e-6, FLT_TRUE_MIN, 0, FLT_MAX, &eps, path, err)))
        goto done;
    c->rms_norm_eps = (float)eps;
    double cap = 0;
    if ((st = sl_config_num(root, "final_logit_softcapping", 0, 0, 0, FLT_MAX, &cap, path, err)))
        goto done;
    c->logit_softcap = (float)cap;
    if (c->n_heads % c->n_kv_heads != 0) {
        st = sl_fail(err, SL_ERR_FORMAT,
                     "%s: num_attention_heads %d is not a multiple of "
                     "num_key_value_heads %d",
                     path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    if (c->n_experts > 0 && (c->n_experts_used < 1 || c->n_experts_used > c->n_experts)) {
        st = sl_fail(err, SL_ERR_FORMAT,
                     "%s: num_experts_per_tok %d must be in [1, num_experts "
                     "%d]",
                     path, c->n_experts_used, c->n_experts);
        goto done;
    }
    const int own_attn = c->family && c->family->own_attention_config;
    if ((!own_attn && (st = parse_rope(c, root, path, err))) ||
        (st = parse_layer_kinds(c, root, path, err)) || (st = parse_linear(c, root, path, err)) ||
        (!own_attn && (st = parse_sliding(c, root, path, err))))
        goto done;
    parse_eos(c, root, top);
    if (c->family && c->family->read_config && (st = c->family->read_config(c, root, path, err)))
        goto done;
    if (c->n_experts > 0) {
        const sl_route_cfg rc = sl_config_route(c);
        const char *why = sl_route_cfg_check(&rc, c->n_experts, c->n_experts_used);
        if (why) {
            st = sl_fail(err, SL_ERR_UNSUPPORTED,
                         "%s: the router (n_group %d, topk_group %d, num_experts %d, "
                         "num_experts_per_tok %d): %s",
                         path, c->n_group, c->topk_group, c->n_experts, c->n_experts_used, why);
            goto done;
        }
    }
done:
    json_decref(top);
    if (st) sl_config_free(c);
    return st;
}

sl_route_cfg sl_config_route(const sl_config *c) {
    return (sl_route_cfg){.score = (sl_route_score)c->route_score,
                          .renormalize = c->norm_topk_prob,
                          .n_group = c->n_group,
                          .topk_group = c->topk_group,
                          .scale = c->routed_scale};
}

sl_status sl_config_load(sl_config *c, const char *path, sl_error *err) {
    char *text = NULL;
    sl_status st = sl_read_file(path, &text, NULL, err);
    if (st) return st;
    st = sl_config_parse(c, text, path, err);
    free(text);
    return st;
}

void sl_config_free(sl_config *c) {
    free(c->layer_is_moe);
    free(c->layer_is_linear);
    free(c->layer_is_sliding);
    free(c->fam);
    c->layer_is_moe = NULL;
    c->layer_is_linear = NULL;
    c->layer_is_sliding = NULL;
    c->fam = NULL;
}
