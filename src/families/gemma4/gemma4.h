/*
 * Gemma 4's own parts (gemma4.c composes them over the shared blocks): its config keys, the
 * tensors it adds to the model and its layers, and the buffers it adds to a session. The
 * family's hooks (sl_family) own all of them.
 */
#ifndef SL_GEMMA4_H
#define SL_GEMMA4_H

#include "model/blocks.h"

/* The two attention kinds of layer_types; each has its own head shape and RoPE. */
enum { G4_SLIDING = 0, G4_FULL = 1, G4_KINDS = 2 };

/* One attention kind: what transformers resolves per layer type (per_layer_config, or
 * global_head_dim / num_global_key_value_heads for the full layers; rope_parameters[type]). */
typedef struct g4_kind {
    int32_t head_dim, n_kv_heads;
    double theta;
    /* rope_type "proportional": the first rope_angles = int(partial * head_dim // 2) of the
     * head_dim / 2 frequencies are theta^(-2i / head_dim) / factor, the others 0 (those dims
     * pass unrotated; NeoX pairs dims i and i + head_dim / 2 over the whole head). "default":
     * all head_dim / 2, theta^(-2i / head_dim). */
    int32_t rope_angles;
    double factor;
    int32_t no_v; /* attention_k_eq_v on full layers: no v_proj, the values are k_proj's rows */
} g4_kind;

/* Per decoder layer. */
typedef struct g4_layer_cfg {
    uint8_t kind;        /* G4_SLIDING or G4_FULL */
    uint8_t double_wide; /* use_double_wide_mlp on a KV-shared layer: the MLP is 2I wide */
    int32_t kv_src;      /* the layer whose K/V it attends (itself, or for a KV-shared layer
                          * the last earlier non-shared one of its kind) */
} g4_layer_cfg;

/* The keys of config.json only this family reads (g4_read_config); one allocation. */
typedef struct g4_config {
    g4_kind kind[G4_KINDS];
    int32_t sliding_window; /* a sliding layer's query at p sees keys p - window + 1 .. p */
    int32_t moe;            /* enable_moe_block: a MoE block beside every layer's MLP */
    int32_t ple_dim;        /* hidden_size_per_layer_input (0: no per-layer inputs) */
    int32_t ple_vocab;      /* vocab_size_per_layer_input */
    int32_t n_kv_shared;    /* num_kv_shared_layers */
    int32_t max_head_dim, max_q, max_kv; /* the largest head_dim, nh * head_dim, nkv * head_dim */
    g4_layer_cfg layers[];               /* [n_layers] */
} g4_config;

/* What the family adds to decoder layer l (sl_model.layers[l] holds attn_norm =
 * input_layernorm, ffn_norm = pre_feedforward_layernorm, wq..wo, q_norm, k_norm, the MLP,
 * router = router.proj and expert_scale = router.per_expert_scale). */
typedef struct g4_layer {
    sl_tensor post_attn_norm; /* [H] post_attention_layernorm */
    sl_tensor post_ffn_norm;  /* [H] post_feedforward_layernorm */
    sl_tensor post_ffn_norm1; /* [H] post_feedforward_layernorm_1 (MLP side) */
    sl_tensor pre_ffn_norm2;  /* [H] pre_feedforward_layernorm_2 (experts' input) */
    sl_tensor post_ffn_norm2; /* [H] post_feedforward_layernorm_2 (experts' output) */
    sl_tensor router_scale;   /* [H] router.scale */
    sl_tensor ple_gate;       /* [P, H] per_layer_input_gate */
    sl_tensor ple_proj;       /* [H, P] per_layer_projection */
    sl_tensor ple_norm;       /* [H] post_per_layer_input_norm */
    float scalar;             /* layer_scalar */
    int32_t mlp_inter;        /* the MLP's width (2I when double wide) */
} g4_layer;

/* What the family adds to the model (sl_model.fam). */
typedef struct g4_model {
    g4_layer *layers;    /* [n_layers] */
    sl_tensor ple_embed; /* [ple_vocab, L * P] embed_tokens_per_layer */
    sl_tensor ple_model; /* [L * P, H] per_layer_model_projection */
    sl_tensor ple_pnorm; /* [P] per_layer_projection_norm */
    sl_tensor ones;      /* [max_head_dim] F32 ones: the weight of the scale-free norms */
    float *ones_data;    /* its host memory (each session's copy: g4_session.ones) */
    float embed_scale;   /* sqrt(H), the embedding's factor */
    float ple_scale;     /* sqrt(P), embed_tokens_per_layer's */
    char notes[256];     /* sl_model_info.features */
} g4_model;

/* What the family adds to a session (sl_session.fam). B = max_batch. */
typedef struct g4_session {
    float *q, *k, *v, *attn;   /* [B, max_q], [B, max_kv] x 2, [B, max_q] */
    float *kcache, *vcache;    /* [max_ctx, nkv * head_dim] of every non-shared layer the
                                * partition's layers attend (kv_floats) */
    size_t *kv_off;            /* host [n_layers] each layer's offset in them (floats) */
    float *rope_cos[G4_KINDS]; /* [max_ctx, head_dim / 2] per kind */
    float *rope_sin[G4_KINDS];
    float *mlp, *mlp_up;   /* [B, max MLP width] */
    float *h1, *h2;        /* [B, H] the MLP and MoE sides of the feed-forward */
    float *rx;             /* [B, H] the router's input */
    float *ple;            /* [B, L * P] per-layer inputs */
    float *ple_tok;        /* [B, L * P] their token-identity part */
    float *ple_in, *ple_g; /* [B, P] layer l's slice, and its gate */
    float *ones;           /* [max_head_dim] g4_model.ones in the session's backend memory */
} g4_session;

static inline const g4_config *g4_cfg(const sl_model *m) {
    return (const g4_config *)m->cfg.fam;
}
static inline g4_model *g4_mod(const sl_model *m) {
    return (g4_model *)m->fam;
}
static inline g4_session *g4_ses(const sl_session *s) {
    return (g4_session *)s->fam;
}

/* config.c: the family's read_config hook. */
sl_status g4_read_config(sl_config *c, const json_t *root, const char *path, sl_error *err);

#endif /* SL_GEMMA4_H */
