/*
 * Llama-4 (model_type "llama4_text", and "llama4" for Llama4ForConditionalGeneration, whose
 * text model sits under language_model. and whose vision tower vision_model.* and
 * multi_modal_projector.* are not bound). A pre-norm decoder where:
 *
 *   attention   RoPE layers (no_rope_layers[l] = 1): RoPE on interleaved pairs (the complex
 *               form), then q and k L2-normed without a weight (use_qk_norm); NoPE layers: no
 *               RoPE, q scaled by log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1
 *               (attn_temperature_tuning). layer_types says which layers attend within their
 *               chunk of attention_chunk_size positions ("chunked_attention") and which see
 *               everything ("full_attention").
 *   FFN         on moe_layers (else every interleave_moe_layer_step-th layer): top-k of the
 *               router's logits, sigmoid of each, the weight scaling the expert's INPUT, plus a
 *               shared expert summed as it is; experts stored fused and [in, out]
 *               (gate_up_proj [E, H, 2I], gate the first half; down_proj [E, I, H]).
 *               Elsewhere a dense SwiGLU MLP of intermediate_size_mlp.
 *
 * The L2 norm is an RMSNorm with weight 1 (x * rsqrt(mean(x^2) + eps)), which qkv_prep does
 * before RoPE rather than after: a rotation keeps each pair's sum of squares, so the norm is
 * the same up to rounding.
 */
#include <float.h>
#include <jansson.h>

#include "model/blocks.h"

/* The keys only Llama-4 reads (sl_config.fam, one allocation with its per-layer arrays). */
typedef struct llama4_config {
    int32_t use_qk_norm, temp_tuning, floor_scale, chunk;
    double attn_scale;
    uint8_t *rope;    /* [n_layers] 1: RoPE layer, 0: NoPE layer */
    uint8_t *chunked; /* [n_layers] 1: chunked local attention */
} llama4_config;

/* What bind makes beside the checkpoint's tensors: the unit weight of the L2 norm; and what it
 * computes, in words (sl_model_info.features). */
typedef struct llama4_model {
    char features[256];
    sl_tensor ones; /* [head_dim] F32 */
    float data[];
} llama4_model;

/* A list of integers key (NULL when absent or null) of at least n entries; the message names
 * the key. */
static sl_status int_list(const json_t *root, const char *key, size_t n, const json_t **out,
                          const char *path, sl_error *err) {
    const json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return SL_OK;
    if (!json_is_array(v) || json_array_size(v) < n)
        return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is not a list of at least %zu entries", path,
                       key, n);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) && !json_is_boolean(x))
            return sl_fail(err, SL_ERR_FORMAT, "%s: %s[%zu] is not an integer", path, key, i);
    }
    *out = v;
    return SL_OK;
}

static int64_t list_int(const json_t *v, size_t i) {
    const json_t *x = json_array_get(v, i);
    return json_is_boolean(x) ? json_is_true(x) : json_integer_value(x);
}

/* Which layers are MoE: moe_layers (indices past the last layer name none, as in
 * transformers' `l in moe_layers`), else every step-th layer from step - 1. */
static sl_status read_moe_layers(sl_config *c, const json_t *root, const char *path,
                                 sl_error *err) {
    const int32_t n = c->n_layers;
    int32_t step;
    const json_t *ml;
    sl_status st;
    if ((st = sl_config_int(root, "interleave_moe_layer_step", 1, 1, 4096, &step, path, err)) ||
        (st = int_list(root, "moe_layers", 0, &ml, path, err)))
        return st;
    memset(c->layer_is_moe, 0, (size_t)n);
    if (ml) {
        for (size_t i = 0; i < json_array_size(ml); i++) {
            const int64_t l = list_int(ml, i);
            if (l >= 0 && l < n) c->layer_is_moe[l] = 1;
        }
    } else {
        for (int32_t l = step - 1; l < n; l += step)
            c->layer_is_moe[l] = 1;
    }
    return SL_OK;
}

/* RoPE / NoPE and chunked / full per layer: no_rope_layers (absent, null or empty: NoPE every
 * no_rope_layer_interval-th layer), layer_types (absent: chunked exactly on the RoPE layers). */
static sl_status read_layer_kinds(llama4_config *f, int32_t n, const json_t *root, const char *path,
                                  sl_error *err) {
    int32_t interval;
    const json_t *nr, *lt = json_object_get(root, "layer_types");
    sl_status st;
    if ((st = sl_config_int(root, "no_rope_layer_interval", 4, 1, 4096, &interval, path, err)))
        return st;
    nr = json_object_get(root, "no_rope_layers");
    if (json_is_array(nr) && json_array_size(nr) == 0) nr = NULL;
    if (nr && (st = int_list(root, "no_rope_layers", (size_t)n, &nr, path, err))) return st;
    for (int32_t l = 0; l < n; l++)
        f->rope[l] = nr ? list_int(nr, (size_t)l) != 0 : (l + 1) % interval != 0;
    if (!lt || json_is_null(lt)) {
        memcpy(f->chunked, f->rope, (size_t)n);
        return SL_OK;
    }
    if (!json_is_array(lt) || json_array_size(lt) < (size_t)n)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: 'layer_types' is not a list of num_hidden_layers entries", path);
    for (int32_t l = 0; l < n; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        if (t && strcmp(t, "chunked_attention") == 0)
            f->chunked[l] = 1;
        else if (!t || strcmp(t, "full_attention") != 0)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: layer_types[%d] '%s' is not supported (chunked_attention or "
                           "full_attention)",
                           path, l, t ? t : "?");
    }
    return SL_OK;
}

static sl_status llama4_read_config(sl_config *c, const json_t *root, const char *path,
                                    sl_error *err) {
    const int32_t n = c->n_layers;
    llama4_config *f = calloc(1, sizeof *f + 2 * (size_t)n);
    if (!f) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    c->fam = f;
    f->rope = (uint8_t *)(f + 1);
    f->chunked = f->rope + n;
    const int64_t big = INT32_MAX / 4;
    int32_t inter = 8192, inter_mlp, temp_floor;
    sl_status st;
    const json_t *chunk = json_object_get(root, "attention_chunk_size");
    if (chunk && json_is_null(chunk))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: attention_chunk_size is null (transformers' Llama-4 needs one)", path);
    if ((st = sl_config_int(root, "intermediate_size", 8192, 1, big, &inter, path, err)) ||
        (st = sl_config_int(root, "intermediate_size_mlp", 16384, 1, big, &inter_mlp, path, err)) ||
        (st = sl_config_int(root, "num_local_experts", 16, 1, 1 << 16, &c->n_experts, path, err)) ||
        (st = sl_config_int(root, "num_experts_per_tok", 1, 1, c->n_experts, &c->n_experts_used,
                            path, err)) ||
        (st = sl_config_int(root, "use_qk_norm", 1, 0, 1, &f->use_qk_norm, path, err)) ||
        (st =
             sl_config_int(root, "attn_temperature_tuning", 1, 0, 1, &f->temp_tuning, path, err)) ||
        (st = sl_config_int(root, "floor_scale", 8192, 1, INT32_MAX, &temp_floor, path, err)) ||
        (st = sl_config_num(root, "attn_scale", 0.1, -FLT_MAX, 0, FLT_MAX, &f->attn_scale, path,
                            err)) ||
        (st = sl_config_int(root, "attention_chunk_size", 8192, 1, INT32_MAX, &f->chunk, path,
                            err)) ||
        (st = read_moe_layers(c, root, path, err)) ||
        (st = read_layer_kinds(f, n, root, path, err)))
        return st;
    f->floor_scale = temp_floor;
    /* Routed and shared experts are intermediate_size wide, the dense MLPs
     * intermediate_size_mlp. */
    c->moe_intermediate_size = inter;
    c->shared_intermediate_size = inter;
    c->intermediate_size = inter_mlp;
    c->rope_interleaved = 1;
    c->expert_layout = SL_EXPERT_LAYOUT_IN_OUT;
    /* The k largest logits, sigmoid of each, weighing the experts' inputs (sl_route_cfg). */
    c->route_score = SL_ROUTE_TOPK_SIGMOID;
    c->moe_weight_input = 1;
    c->norm_topk_prob = 0;
    /* Llama-4's base frequency when config.json gives none. */
    const json_t *rs = json_object_get(root, "rope_scaling");
    const json_t *rp =
        json_is_object(rs) && json_object_size(rs) ? rs : json_object_get(root, "rope_parameters");
    if (!json_object_get(rp, "rope_theta") && !json_object_get(root, "rope_theta"))
        c->rope_theta = 500000.0;
    /* Its rotary embedding turns every dim of a head (the default type ignores
     * partial_rotary_factor; llama3's would not): refuse what would differ. */
    if (c->rot_dim != c->head_dim)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor other than 1 is not supported for Llama-4", path);
    return SL_OK;
}

static sl_status llama4_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const llama4_config *f = c->fam;
    const int32_t hd = c->head_dim;
    llama4_model *fm = sl_calloc(1, sizeof *fm + (size_t)hd * sizeof(float), err);
    if (!fm) return SL_ERR_NOMEM;
    m->fam = fm;
    for (int32_t i = 0; i < hd; i++)
        fm->data[i] = 1.0f;
    fm->ones = (sl_tensor){.name = "qk_norm (L2, unit weight)",
                           .dtype = SL_DTYPE_F32,
                           .ndim = 1,
                           .shape = {hd},
                           .data = fm->data,
                           .nbytes = (size_t)hd * sizeof(float)};
    const blk_attn_opts attn = {.qkv_bias = c->attention_bias, .o_bias = c->attention_bias};
    const blk_ffn_opts ffn = {.shared_expert = 1, .shared_ungated = 1};
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        if ((st = blk_bind_attention(m, l, &attn, err)) || (st = blk_bind_ffn(m, l, &ffn, err)))
            break;
        sl_layer *L = &m->layers[l];
        L->no_rope = !f->rope[l];
        L->attn_chunk = f->chunked[l] ? f->chunk : 0;
        if (f->rope[l] && f->use_qk_norm) L->q_norm = L->k_norm = fm->ones;
        if (!f->rope[l] && f->temp_tuning) {
            L->temp_floor = (float)f->floor_scale;
            L->temp_scale = (float)f->attn_scale;
        }
    }
    return st;
}

/* "chunked (16) RoPE on 3 layers, qk L2 norm; full NoPE on 1, temperature tuning (floor 16,
 * scale 0.1)": the kinds of layer there are, each with its count. */
static void llama4_info(const sl_model *m, sl_model_info *info) {
    const llama4_config *f = m->cfg.fam;
    llama4_model *fm = m->fam;
    char *buf = fm->features;
    size_t k = 0, cap = sizeof fm->features;
    for (int kind = 3; kind >= 0; kind--) { /* rope x chunked, RoPE and chunked first */
        const int rope = kind >> 1, chunked = kind & 1;
        int32_t n = 0;
        for (int32_t l = 0; l < m->cfg.n_layers; l++)
            n += f->rope[l] == rope && f->chunked[l] == chunked;
        if (!n || k >= cap) continue;
        if (chunked)
            k += (size_t)snprintf(buf + k, cap - k, "%schunked attention (%d)", k ? "; " : "",
                                  f->chunk);
        else
            k += (size_t)snprintf(buf + k, cap - k, "%sfull attention", k ? "; " : "");
        if (k < cap)
            k += (size_t)snprintf(buf + k, cap - k, " %s on %d layer%s", rope ? "RoPE" : "NoPE", n,
                                  n > 1 ? "s" : "");
        if (rope && f->use_qk_norm && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, ", qk L2 norm");
        if (!rope && f->temp_tuning && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, ", temperature tuning (floor %d, scale %g)",
                                  f->floor_scale, f->attn_scale);
    }
    if (m->cfg.rope.type == SL_ROPE_LLAMA3 && k < cap)
        snprintf(buf + k, cap - k, "; llama3 RoPE (factor %g)", m->cfg.rope.factor);
    info->features = buf;
}

static void llama4_free_model(sl_model *m) {
    free(m->fam);
    m->fam = NULL;
}

const sl_family sl_family_llama4 = {
    .arch = "llama4",
    .norm_offset = 0.0f,
    .read_config = llama4_read_config,
    .bind = llama4_bind,
    .free_model = llama4_free_model,
    .info = llama4_info,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
    .ffn_name = "feed_forward",
    .router_name = "router",
    .experts_module = "feed_forward.experts",
};
