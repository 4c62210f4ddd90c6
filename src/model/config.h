/*
 * Model hyper-parameters, read from a Hugging Face config.json.
 * One struct serves every family; fields a family does not use stay zero.
 */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include "core/common.h"

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
    int32_t tie_word_embeddings;
    int32_t attention_bias; /* Qwen3: bias on q, k, v and o projections (default off) */
    int32_t qkv_bias;       /* Qwen2-MoE: bias on q, k, v projections (default on) */
    int32_t max_position;
    float rms_norm_eps;
    double rope_theta;
    uint8_t *layer_is_moe; /* [n_layers]: 1 = routed experts, 0 = dense FFN */
    /* Gated DeltaNet (linear attention) of the hybrid families; zero when absent. */
    uint8_t *layer_is_linear; /* [n_layers]: 1 = linear attention, 0 = full attention */
    int32_t n_linear_layers;
    int32_t lin_n_key_heads;   /* linear_num_key_heads (nk) */
    int32_t lin_n_value_heads; /* linear_num_value_heads (nv), a multiple of nk */
    int32_t lin_key_dim;       /* linear_key_head_dim (dk) */
    int32_t lin_value_dim;     /* linear_value_head_dim (dv) */
    int32_t lin_conv_kernel;   /* linear_conv_kernel_dim (K) */
    int32_t lin_gate_sigmoid;  /* Gated DeltaNet's output gate is sigmoid, not SiLU (Qwen4-Exp) */
    int32_t eos_id;            /* the first of config.json's eos_token_id; -1 when absent */
    /* Qwen4-Exp hyper-connections: the residual is hc_count streams of hidden_size. */
    int32_t hc_count; /* 0: a plain residual */
    int32_t hc_lowrank;
    /* Qwen4-Exp PLE: hashed n-gram embeddings on the layers of ple_layer_ids. */
    int8_t *layer_ple; /* [n_layers]: index of layer l in ple_layer_ids, -1 when none */
    int32_t n_ple_layers;
    int32_t ple_embed_dim;       /* concatenated n-gram head embeddings (D) */
    int32_t ple_conv_kernel;     /* dilated depthwise conv kernel; dilation = ngram_size */
    int32_t ngram_size;          /* largest n-gram; n-gram heads = (ngram_size-1) * heads_per */
    int32_t ngram_heads_per;     /* heads_per_ngram */
    int32_t ngram_vocab_base;    /* ngram_vocab_size_base: head vocabularies are primes >= it */
    int32_t ngram_vocab_divisor; /* make_ngram_vocab_size_divisible_by (table rows padded) */
    int64_t ngram_seed;          /* seed of the hash multipliers */
    /* Qwen4-Exp QSA: a block indexer in front of full attention; idx_heads 0 = dense. */
    int32_t idx_heads, idx_head_dim, idx_budget, idx_ratio;
} sl_config;

/* Parses text (the contents of path) into cfg. Validates every size it reads. */
sl_status sl_config_parse(sl_config *cfg, const char *text, const char *path, sl_error *err);
sl_status sl_config_load(sl_config *cfg, const char *path, sl_error *err);
void sl_config_free(sl_config *cfg);

/* n-gram heads of one PLE layer, and the rows of its padded table. */
int32_t sl_ngram_heads(const sl_config *cfg);

#endif /* SL_CONFIG_H */
