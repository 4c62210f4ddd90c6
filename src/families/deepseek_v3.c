/*
 * DeepSeek-V3 (model_type "deepseek_v3"; Kimi-K2's "kimi_k2" is the same architecture): a
 * pre-norm decoder with multi-head latent attention (model/mla.h: q through a low-rank
 * q_a/q_b pair or a plain q_proj, keys and values from one latent row per token, RoPE on a
 * part of each head, interleaved pairs by default, YaRN's mscale^2 in the softmax scale) and,
 * from layer first_k_dense_replace on, routed experts picked by sigmoid scores with a
 * correction bias, group-limited (n_group groups, topk_group kept), renormalised
 * (norm_topk_prob) and scaled (routed_scaling_factor): moe_route's SL_ROUTE_SIGMOID; plus
 * n_shared_experts shared experts summed in ungated (one MLP n_shared_experts times as wide).
 * As transformers 5.17's modeling_deepseek_v3.py computes it.
 */
#include <jansson.h>
#include <math.h>

#include "model/blocks.h"
#include "model/mla.h"

/* config.json's keys of the family (sl_config.fam). */
typedef struct ds3_config {
    blk_mla_dims mla;
    int32_t first_k_dense; /* first_k_dense_replace: layers before it are dense */
    int32_t n_shared;      /* n_shared_experts */
    char attn_info[192];   /* the inspect line */
} ds3_config;

/* What the model adds (sl_model.fam): per layer its MLA weights. */
typedef struct ds3_layer {
    blk_mla_layer mla;
} ds3_layer;

/* transformers' yarn_get_mscale. */
static double ds3_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* An integer key that may be null (transformers' None): *is_null then, else in [lo, hi]
 * (missing: dflt). */
static sl_status int_or_null(const json_t *root, const char *key, int64_t dflt, int64_t lo,
                             int64_t hi, int32_t *out, int *is_null, const char *path,
                             sl_error *err) {
    json_t *v = json_object_get(root, key);
    *is_null = v && json_is_null(v);
    if (*is_null) return SL_OK;
    return sl_config_int(root, key, dflt, lo, hi, out, path, err);
}

static sl_status ds3_read_config(sl_config *c, const json_t *root, const char *path,
                                 sl_error *err) {
    ds3_config *dc = calloc(1, sizeof *dc);
    if (!dc) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    c->fam = dc; /* freed with the config, also on error */
    blk_mla_dims *d = &dc->mla;
    const int64_t big = INT32_MAX / 4;
    int q_null = 0, nul = 0;
    int32_t head_dim = -1, interleave = 1;
    double scaling = 2.5;
    sl_status st;
    /* DeepseekV3Config's defaults where a key is missing (the shared parser's differ) */
    if (!json_object_get(root, "norm_topk_prob")) c->norm_topk_prob = 1;
    if (!json_object_get(root, "max_position_embeddings")) c->max_position = 4096;
    if ((st = int_or_null(root, "q_lora_rank", 1536, 1, 1 << 20, &d->q_lora_rank, &q_null, path,
                          err)) ||
        (st = sl_config_int(root, "kv_lora_rank", 512, 1, 4096, &d->kv_lora_rank, path, err)) ||
        (st = sl_config_int(root, "qk_nope_head_dim", 128, 1, 4096, &d->nope_dim, path, err)) ||
        (st = sl_config_int(root, "qk_rope_head_dim", 64, 2, 1024, &d->rope_dim, path, err)) ||
        (st = sl_config_int(root, "v_head_dim", 128, 1, 4096, &d->v_dim, path, err)) ||
        (st = sl_config_int(root, "rope_interleave", 1, 0, 1, &interleave, path, err)) ||
        (st = sl_config_int(root, "first_k_dense_replace", 3, 0, INT32_MAX, &dc->first_k_dense,
                            path, err)) ||
        (st = sl_config_int(root, "n_routed_experts", 256, 0, 1 << 16, &c->n_experts, path, err)) ||
        (st = sl_config_int(root, "num_experts_per_tok", 8, 1, 1 << 16, &c->n_experts_used, path,
                            err)) ||
        (st = sl_config_int(root, "n_group", 8, 1, SL_ROUTE_MAX_GROUPS, &c->n_group, path, err)) ||
        (st = sl_config_int(root, "topk_group", 4, 1, SL_ROUTE_MAX_GROUPS, &c->topk_group, path,
                            err)) ||
        (st = sl_config_int(root, "n_shared_experts", 1, 0, 1024, &dc->n_shared, path, err)) ||
        (st =
             sl_config_num(root, "routed_scaling_factor", 2.5, 0.0, 1, 1e6, &scaling, path, err)) ||
        (st = sl_config_int(root, "intermediate_size", 18432, 1, big, &c->intermediate_size, path,
                            err)) ||
        (st = sl_config_int(root, "moe_intermediate_size", 2048, 1, big, &c->moe_intermediate_size,
                            path, err)) ||
        (st = int_or_null(root, "head_dim", d->rope_dim, 1, 4096, &head_dim, &nul, path, err)))
        return st;
    if (q_null) d->q_lora_rank = 0;
    if (nul) head_dim = d->rope_dim;
    /* the router: sigmoid scores, picked by score + e_score_correction_bias among the best
     * topk_group groups, renormalised (norm_topk_prob; + 1e-20), times routed_scaling_factor */
    c->route_score = SL_ROUTE_SIGMOID;
    c->routed_scale = (float)scaling;
    /* Values transformers' own code cannot run: refused with what it would do. */
    if (head_dim != d->rope_dim)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: head_dim %d differs from qk_rope_head_dim %d (transformers sizes the "
                       "RoPE tables by head_dim and rotates qk_rope_head_dim dims: they must "
                       "agree)",
                       path, head_dim, d->rope_dim);
    if (d->rope_dim % 2)
        return sl_fail(err, SL_ERR_FORMAT, "%s: qk_rope_head_dim %d is odd", path, d->rope_dim);
    if (c->n_kv_heads != c->n_heads)
        return sl_fail(
            err, SL_ERR_UNSUPPORTED,
            "%s: num_key_value_heads %d differs from num_attention_heads %d (MLA expands "
            "its keys to every head, which transformers then repeats by their ratio: "
            "only equal counts run)",
            path, c->n_kv_heads, c->n_heads);
    const json_t *rp = json_object_get(root, "rope_scaling");
    if (!json_is_object(rp) || !json_object_size(rp)) rp = json_object_get(root, "rope_parameters");
    const json_t *prf = json_is_object(rp) && json_object_get(rp, "partial_rotary_factor")
                            ? json_object_get(rp, "partial_rotary_factor")
                            : json_object_get(root, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && json_number_value(prf) != 1.0)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor %g is not supported (DeepSeek-V3 rotates all "
                       "qk_rope_head_dim dims)",
                       path, json_number_value(prf));
    if (c->n_experts > 0) {
        const int32_t E = c->n_experts, k = c->n_experts_used, g = c->n_group;
        if (E % g != 0 || E / g < 2)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: n_routed_experts %d in n_group %d groups: groups must be equal "
                           "and of at least 2 experts (each group scores by its top 2)",
                           path, E, g);
        if (c->topk_group > g || k > c->topk_group * (E / g))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: topk_group %d of n_group %d groups cannot hold "
                           "num_experts_per_tok %d experts",
                           path, c->topk_group, g, k);
    }
    /* The attention geometry the shared code sees: RoPE over qk_rope_head_dim (head_dim), the
     * latent cache the family's own (sl_family.own_kv_cache). */
    c->head_dim = d->rope_dim;
    c->rot_dim = d->rope_dim;
    d->n_heads = c->n_heads;
    d->interleaved = interleave;
    d->bias = c->attention_bias;
    double scale = 1.0 / sqrt((double)(d->nope_dim + d->rope_dim));
    if (c->rope.type != SL_ROPE_DEFAULT && c->rope.mscale_all_dim != 0) {
        const double m = ds3_mscale(c->rope.factor, c->rope.mscale_all_dim);
        scale = scale * m * m;
    }
    d->scale = (float)scale;
    c->shared_intermediate_size = dc->n_shared * c->moe_intermediate_size;
    for (int32_t l = 0; l < c->n_layers; l++)
        c->layer_is_moe[l] = c->n_experts > 0 && l >= dc->first_k_dense;
    snprintf(dc->attn_info, sizeof dc->attn_info,
             "multi-head latent: latent KV cache of %d + %d floats a token, q %s%d, key %d + %d "
             "(RoPE%s%s), value %d",
             d->kv_lora_rank, d->rope_dim, d->q_lora_rank ? "LoRA " : "", d->q_lora_rank,
             d->nope_dim, d->rope_dim, d->interleaved ? ", interleaved" : "",
             c->rope.type == SL_ROPE_YARN ? ", YaRN" : "", d->v_dim);
    return SL_OK;
}

/* ------------------------------------------------------------- binding */

static sl_status ds3_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const ds3_config *dc = c->fam;
    ds3_layer *fl = sl_calloc((size_t)c->n_layers, sizeof *fl, err);
    if (!fl) return SL_ERR_NOMEM;
    m->fam = fl;
    sl_status st = blk_bind_globals(m, err);
    /* the router's e_score_correction_bias; the shared experts (mlp.shared_experts, ungated) */
    const blk_ffn_opts ffn = {.shared_experts = dc->n_shared > 0, .select_bias = 1};
    for (int32_t l = 0; !st && l < c->n_layers; l++)
        if (!(st = blk_bind_mla(m, l, &dc->mla, &fl[l].mla, err)))
            st = blk_bind_ffn(m, l, &ffn, err);
    return st;
}

static int32_t ds3_weights(sl_model *m, sl_tensor **out, int32_t *layer) {
    ds3_layer *fl = m->fam;
    int32_t n = 0;
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const int32_t k = blk_mla_weights(&fl[l].mla, out ? out + n : NULL);
        for (int32_t i = 0; layer && i < k; i++)
            layer[n + i] = l;
        n += k;
    }
    return n;
}

static void ds3_free_model(sl_model *m) {
    ds3_layer *fl = m->fam;
    for (int32_t l = 0; fl && l < m->cfg.n_layers; l++)
        blk_mla_free(&fl[l].mla);
    free(fl);
    m->fam = NULL;
}

static void ds3_info(const sl_model *m, sl_model_info *info) {
    const ds3_config *dc = m->cfg.fam;
    info->head_dim = dc->mla.nope_dim + dc->mla.rope_dim;
    info->attention = dc->attn_info;
}

/* ------------------------------------------------------------- session */

static void ds3_session_layout(sl_session *s, sl_carver *dev, sl_carver *host) {
    const ds3_config *dc = s->model->cfg.fam;
    blk_mla_layout(s, &dc->mla, s->fam, dev, host);
}

/* The attention sublayer of blk_prenorm_decoder: MLA over the latent cache. */
static void ds3_attention(sl_session *s, int32_t l, int32_t T) {
    const ds3_config *dc = s->model->cfg.fam;
    const ds3_layer *fl = s->model->fam;
    blk_mla(s, l, T, &dc->mla, &fl[l].mla, s->fam);
}

const sl_family sl_family_deepseek_v3 = {
    .arch = "deepseek_v3",
    .norm_offset = 0.0f,
    .read_config = ds3_read_config,
    .bind = ds3_bind,
    .weights = ds3_weights,
    .free_model = ds3_free_model,
    .info = ds3_info,
    .session_size = sizeof(blk_mla_buf),
    .session_layout = ds3_session_layout,
    .forward = blk_prenorm_decoder,
    .attention = ds3_attention,
    .graph_steps = 1,
    .own_kv_cache = 1,
};
