/*
 * gpt-oss (model_type "gpt_oss", GptOssForCausalLM): a pre-norm decoder whose layers alternate
 * sliding-window (layer_types "sliding_attention", sliding_window keys) and full attention,
 * with a learned sink logit per head in the softmax's denominator, YaRN RoPE, biases on q, k,
 * v and o; every layer routes to experts: a linear router with a bias, the top-k logits
 * softmaxed, and experts computing the clamped SwiGLU
 *   g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(1.702 g)
 * with a bias on each projection. The checkpoints store the experts fused and transposed
 * (gate_up_proj [E, H, 2I], gate and up interleaved), the official ones in MXFP4: both are
 * laid out for the store as they are read (model/expert_relayout.c).
 */
#include <jansson.h>

#include "model/blocks.h"

/* transformers' GptOssExperts: alpha and limit are constants of the class, whatever the
 * config says (the official config's swiglu_limit is this limit). */
#define GPT_OSS_ALPHA 1.702f
#define GPT_OSS_LIMIT 7.0

typedef struct gpt_oss_model {
    char features[256]; /* sl_model_info.features */
} gpt_oss_model;

static sl_status gpt_oss_read_config(sl_config *c, const json_t *root, const char *path,
                                     sl_error *err) {
    double limit = GPT_OSS_LIMIT;
    sl_status st;
    /* attention_bias defaults to true here (GptOssConfig); the experts' size is
     * intermediate_size, and every layer routes (no dense layer) */
    if ((st = sl_config_int(root, "attention_bias", 1, 0, 1, &c->attention_bias, path, err)) ||
        (st = sl_config_num(root, "swiglu_limit", GPT_OSS_LIMIT, 0, 1, 1e9, &limit, path, err)))
        return st;
    if (limit != GPT_OSS_LIMIT)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: 'swiglu_limit' = %g is not supported: transformers' gpt-oss clamps at "
                       "%g whatever the config says",
                       path, limit, GPT_OSS_LIMIT);
    if (c->n_experts < 1 || c->intermediate_size < 1)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: gpt_oss needs 'num_local_experts' and 'intermediate_size'", path);
    json_t *q = json_object_get(root, "quantization_config");
    if (json_is_object(q)) {
        const char *qm = json_string_value(json_object_get(q, "quant_method"));
        if (!qm || strcmp(qm, "mxfp4") != 0)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: quantization_config.quant_method '%s' is not supported (gpt_oss: "
                           "'mxfp4', or none)",
                           path, qm ? qm : "?");
    }
    for (int32_t l = 0; l < c->n_layers; l++)
        if (!c->layer_is_moe[l])
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: layer %d has no experts (gpt_oss routes every layer: "
                           "decoder_sparse_step and mlp_only_layers are not its keys)",
                           path, l);
    c->moe_intermediate_size = c->intermediate_size;
    c->intermediate_size = 0;
    /* GptOssTopKRouter: the top k of the logits (with the router's bias), then their softmax */
    c->route_score = SL_ROUTE_TOPK_SOFTMAX;
    c->norm_topk_prob = 0;
    c->expert_glu = SL_GLU_SWIGLU_CLAMPED;
    c->expert_glu_alpha = GPT_OSS_ALPHA;
    c->expert_glu_limit = (float)GPT_OSS_LIMIT;
    c->expert_layout = SL_EXPERT_LAYOUT_GATE_UP_T;
    return SL_OK;
}

static sl_status gpt_oss_bind(sl_model *m, sl_error *err) {
    const sl_config *c = &m->cfg;
    const blk_attn_opts attn = {
        .qkv_bias = c->attention_bias, .o_bias = c->attention_bias, .sinks = 1};
    gpt_oss_model *g = sl_calloc(1, sizeof *g, err);
    if (!g) return SL_ERR_NOMEM;
    m->fam = g;
    const int64_t H = c->hidden_size, E = c->n_experts;
    sl_status st = blk_bind_globals(m, err);
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        sl_layer *L = &m->layers[l];
        L->is_moe = 1;
        if ((st = blk_bind_attention(m, l, &attn, err)) ||
            (st = sl_ckpt_bind(&m->ck, &L->ffn_norm, SL_BIND_REQUIRED, SL_DIMS(H), err,
                               "layers.%d.post_attention_layernorm.weight", l)) ||
            (st = sl_ckpt_bind(&m->ck, &L->router, SL_BIND_REQUIRED, SL_DIMS(E, H), err,
                               "layers.%d.mlp.router.weight", l)) ||
            (st = sl_ckpt_bind(&m->ck, &L->router_bias, SL_BIND_REQUIRED, SL_DIMS(E), err,
                               "layers.%d.mlp.router.bias", l)))
            break;
    }
    if (st) return st;
    int32_t n_sliding = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        n_sliding += m->layers[l].window > 0;
    int n = snprintf(g->features, sizeof g->features, "attention sinks");
    if (n_sliding)
        n += snprintf(g->features + n, sizeof g->features - (size_t)n,
                      ", sliding window %d on %d of %d layers", c->sliding_window, n_sliding,
                      c->n_layers);
    if (c->rope.type == SL_ROPE_YARN)
        n += snprintf(g->features + n, sizeof g->features - (size_t)n,
                      ", YaRN RoPE x%g (attention factor %.4g)", c->rope.factor,
                      c->rope.attention_factor);
    snprintf(g->features + n, sizeof g->features - (size_t)n,
             ", clamped SwiGLU experts (limit %g) with biases", (double)c->expert_glu_limit);
    return SL_OK;
}

static void gpt_oss_free(sl_model *m) {
    free(m->fam);
    m->fam = NULL;
}

static void gpt_oss_info(const sl_model *m, sl_model_info *info) {
    const gpt_oss_model *g = m->fam;
    info->features = g->features;
}

const sl_family sl_family_gpt_oss = {
    .arch = "gpt_oss",
    .norm_offset = 0.0f,
    .read_config = gpt_oss_read_config,
    .attn_layer_types = (const char *const[]){"sliding_attention", NULL},
    .bind = gpt_oss_bind,
    .free_model = gpt_oss_free,
    .info = gpt_oss_info,
    .forward = blk_prenorm_decoder,
    .graph_steps = 1,
};
