/*
 * Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) as a shared block: binding, the
 * session's buffers and latent KV cache, and the forward pass over the latent_attention op.
 *
 * Per token, with nh heads, key dims dn (no position) + dr (RoPE), value dim dv, latent rank kv:
 *
 *   q   = q_b(norm(q_a x))  or  q_proj x           [nh, dn + dr]
 *   kva = kv_a x                                   [kv + dr] -> cache row [norm(c) | rope(r)]
 *   kv_b: per head [W_UK (dn rows) | W_UV (dv rows)] x kv columns
 *   qabs[h] = [q_nope[h] . W_UK[h] | rope(q_rope[h])]   (the absorbed query)
 *   olat[h] = softmax_j(scale qabs[h] . row_j) . c_j    (latent_attention)
 *   out = o_proj [W_UV[h] olat[h]]_h
 *
 * The cache holds kv + dr floats per token and layer, whatever the heads; the scores are
 * transformers' q . k, since q_nope . (W_UK c) = (q_nope W_UK) . c. W_UK is needed transposed
 * (one kv-row matrix per head): bind makes that copy (mla.c says how), W_UV is a row view of
 * kv_b_proj as it is.
 */
#ifndef SL_MODEL_MLA_H
#define SL_MODEL_MLA_H

#include "model/model.h"

typedef struct blk_mla_dims {
    int32_t n_heads;
    int32_t q_lora_rank; /* 0: q_proj */
    int32_t kv_lora_rank, nope_dim, rope_dim, v_dim;
    int32_t interleaved; /* RoPE on (2i, 2i + 1) pairs (rope_interleave) */
    int32_t bias;        /* q_a_proj, kv_a_proj_with_mqa and o_proj carry a bias */
    float scale;         /* of the scores: 1/sqrt(dn + dr), times YaRN's mscale^2 */
} blk_mla_dims;

/* One layer's weights. Absent tensors have data == NULL. */
typedef struct blk_mla_layer {
    sl_tensor q_a;                /* [q_lora, H] */
    sl_tensor q_a_norm;           /* [q_lora] */
    sl_tensor q_b;                /* [nh * (dn + dr), q_lora] */
    sl_tensor q;                  /* [nh * (dn + dr), H] (no q_lora_rank) */
    sl_tensor kv_a;               /* [kv + dr, H] */
    sl_tensor kv_a_norm;          /* [kv] */
    sl_tensor kv_b;               /* [nh * (dn + dv), kv] */
    sl_tensor o;                  /* [H, nh * dv] */
    sl_tensor b_q_a, b_kv_a, b_o; /* [q_lora], [kv + dr], [H]: attention_bias */
    sl_tensor uk_t;               /* [nh * kv, dn]: per head W_UK^T, made at bind (owned: uk_mem) */
    void *uk_mem, *uk_scales;
} blk_mla_layer;

/* A session's MLA buffers (backend memory), carved by blk_mla_layout. B = max_batch. */
typedef struct blk_mla_buf {
    float *qa;    /* [B, q_lora] */
    float *qf;    /* [B, nh * (dn + dr)] */
    float *kva;   /* [B, kv + dr] */
    float *qabs;  /* [B, nh * (kv + dr)] */
    float *olat;  /* [B, nh * kv] */
    float *ov;    /* [B, nh * dv] */
    float *tin;   /* [nh, B, max(dn, kv)]: per head rows of a chunk (T > 1) */
    float *tout;  /* [nh, B, max(kv, dv)] */
    float *cache; /* [n_layers, max_ctx, kv + dr]: the latent KV cache */
    /* host: the per-head matmul_batch's items (nh of each) */
    float **ys;
    const float **xs;
    sl_tensor *ws;
    const sl_tensor **wp;
    int32_t *Ts;
} blk_mla_buf;

/* Layer l's self_attn tensors (and its input_layernorm into m->layers[l].attn_norm); makes
 * W_UK^T. */
sl_status blk_bind_mla(sl_model *m, int32_t l, const blk_mla_dims *d, blk_mla_layer *L,
                       sl_error *err);
/* L->uk_t, W_UK^T of every head, from L->kv_b (bind calls it; mla.c says how). */
sl_status blk_mla_make_uk_t(const blk_mla_dims *d, blk_mla_layer *L, sl_error *err);
/* Releases what bind made. */
void blk_mla_free(blk_mla_layer *L);
/* L's tensors into out[n...] (out may be NULL); returns the count (sl_family.weights). */
int32_t blk_mla_weights(blk_mla_layer *L, sl_tensor **out);
/* Carves b from dev (backend memory) and host (sizes only when their bases are NULL). */
void blk_mla_layout(const sl_session *s, const blk_mla_dims *d, blk_mla_buf *b, sl_carver *dev,
                    sl_carver *host);
/* s->b.xn -> s->b.out for T tokens at s->pos; appends the latent rows to layer l's cache. */
void blk_mla(sl_session *s, int32_t l, int32_t T, const blk_mla_dims *d, const blk_mla_layer *L,
             const blk_mla_buf *b);

#endif /* SL_MODEL_MLA_H */
