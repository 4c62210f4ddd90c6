/*
 * Model hyper-parameters, read from a Hugging Face config.json.
 * One struct serves every family; fields a family does not use stay zero. A family's own
 * keys are its read_config hook's (sl_family), called by the parser.
 */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include "core/common.h"

typedef struct sl_family sl_family;
typedef struct json_t json_t; /* jansson's */

/* How a Hugging Face checkpoint stores a layer's routed experts (blk_bind_experts). */
typedef enum sl_expert_layout {
    /* gate_up_proj [E, 2I, H] (gate rows, then up), or gate_proj/up_proj [E, I, H], or one set
     * per expert; down_proj [E, H, I] */
    SL_EXPERT_LAYOUT_DEFAULT = 0,
    /* gpt-oss: gate_up_proj [E, H, 2I] (in x out; gate and up columns interleaved, even and
     * odd) and down_proj [E, I, H], with linear biases gate_up_proj_bias [E, 2I] (interleaved
     * alike) and down_proj_bias [E, H]; or MXFP4 (gate_up_proj_blocks [E, 2I, H/32, 16] and
     * _scales [E, 2I, H/32], out x in, rows interleaved; down_proj_blocks [E, H, I/32, 16]) */
    SL_EXPERT_LAYOUT_GATE_UP_T = 1,
} sl_expert_layout;

typedef enum sl_rope_type {
    SL_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i/rot) */
    SL_ROPE_YARN = 1,    /* YaRN: interpolated below the correction range, extrapolated above,
                          * a linear ramp between; cos and sin scaled by attention_factor */
} sl_rope_type;

/* rope_parameters' scaling (transformers 5.17, modeling_rope_utils.py), resolved at parse:
 * model/rope.h turns it into inverse frequencies. Zero for the default type. */
typedef struct sl_rope_scaling {
    sl_rope_type type;
    double factor;               /* yarn: context extension (max_position / original when absent) */
    double beta_fast, beta_slow; /* yarn: rotations bounding the ramp (32 and 1 by default) */
    double original_max_position; /* yarn: the pre-training context */
    int32_t truncate;             /* yarn: floor/ceil the correction range (default on) */
    /* multiplies cos and sin (yarn: the key's value, else from factor, mscale and
     * mscale_all_dim); 1 for the default type */
    double attention_factor;
    double mscale, mscale_all_dim; /* yarn: as given, 0 when absent (DeepSeek-V3's softmax scale
                                    * uses them too) */
} sl_rope_scaling;

typedef struct sl_config {
    char arch[64]; /* model_type */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t rot_dim;                  /* rotated dims per head: head_dim * partial_rotary_factor */
    int32_t intermediate_size;        /* dense FFN layers */
    int32_t moe_intermediate_size;    /* each routed expert */
    int32_t shared_intermediate_size; /* shared expert, 0 when none */
    int32_t n_experts;
    int32_t n_experts_used; /* top-k */
    int32_t decoder_sparse_step;
    int32_t norm_topk_prob;
    /* The MoE router's rule beside norm_topk_prob (sl_route_cfg, kernels/ops.h), set by the
     * families' read_config; all zero is the softmax router. Checked after read_config. */
    int32_t route_score;      /* sl_route_score */
    int32_t n_group;          /* SL_ROUTE_SIGMOID's expert groups (0 or 1: none) */
    int32_t topk_group;       /* ... of which the picks come from the best topk_group */
    float routed_scale;       /* routed_scaling_factor: the weights' last factor (0: 1) */
    int32_t moe_weight_input; /* the router weights scale the experts' input (sl_moe_dims) */
    int32_t tie_word_embeddings;
    int32_t attention_bias; /* Qwen3: bias on q, k, v and o projections (default off) */
    int32_t qkv_bias;       /* Qwen2-MoE: bias on q, k, v projections (default on) */
    int32_t max_position;
    float rms_norm_eps;
    double rope_theta;
    sl_rope_scaling rope;
    uint8_t *layer_is_moe; /* [n_layers]: 1 = routed experts, 0 = dense FFN */
    /* Gated DeltaNet (linear attention) of the hybrid families; zero when absent. */
    uint8_t *layer_is_linear; /* [n_layers]: 1 = linear attention, 0 = full attention */
    int32_t n_linear_layers;
    int32_t lin_n_key_heads;   /* linear_num_key_heads (nk) */
    int32_t lin_n_value_heads; /* linear_num_value_heads (nv), a multiple of nk */
    int32_t lin_key_dim;       /* linear_key_head_dim (dk) */
    int32_t lin_value_dim;     /* linear_value_head_dim (dv) */
    int32_t lin_conv_kernel;   /* linear_conv_kernel_dim (K) */
    int32_t lin_gate_sigmoid;  /* Gated DeltaNet's output gate is sigmoid, not SiLU */
    int32_t eos_id;            /* the first of config.json's eos_token_id; -1 when absent */
    /* final_logit_softcapping: logits = c tanh(logits / c) (0: none) */
    float logit_softcap;
    /* The routed experts: their activation (an sl_glu, kernels/ops.h; 0 SwiGLU) with the
     * clamped SwiGLU's alpha and limit, and how a Hugging Face checkpoint stores them
     * (sl_expert_layout). The family's read_config sets them. */
    int32_t expert_glu;
    float expert_glu_alpha, expert_glu_limit;
    int32_t expert_layout;
    /* Sliding-window attention: layer_types' "sliding_attention" layers see the last
     * sliding_window positions (their own included); NULL when no layer is one. */
    uint8_t *layer_is_sliding; /* [n_layers] */
    int32_t sliding_window;
    /* The family of model_type (NULL: one sluice does not run; loading refuses it) and the
     * keys only it reads (its read_config hook's, one allocation), or NULL. */
    const sl_family *family;
    void *fam;
} sl_config;

/* Parses text (the contents of path) into cfg. Validates every size it reads. */
sl_status sl_config_parse(sl_config *cfg, const char *text, const char *path, sl_error *err);
sl_status sl_config_load(sl_config *cfg, const char *path, sl_error *err);
void sl_config_free(sl_config *cfg);

/* For the families' read_config hooks: an integer key in [lo, hi] (a missing key takes dflt,
 * unless dflt < lo: required; flags may be spelled true/false), and a number key in [lo, hi]
 * (lo excluded when lo_open; a missing key takes dflt, unless dflt is NaN: required). The
 * messages name path, the key, its value and the range. */
sl_status sl_config_int(const json_t *o, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                        int32_t *out, const char *path, sl_error *err);
sl_status sl_config_num(const json_t *o, const char *key, double dflt, double lo, int lo_open,
                        double hi, double *out, const char *path, sl_error *err);

#endif /* SL_CONFIG_H */
