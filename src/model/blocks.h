/*
 * Shared building blocks of the decoder families: tensor binding for the
 * common sublayers and their forward computations, written only against the
 * backend's sl_ops. A family composes these; nothing family-specific lives here
 * beyond the options a block takes.
 */
#ifndef SL_MODEL_BLOCKS_H
#define SL_MODEL_BLOCKS_H

#include "model/model.h"

typedef struct blk_attn_opts {
    int32_t qkv_bias; /* q/k/v projections carry a bias (Qwen2) */
    int32_t o_bias;   /* o_proj carries a bias */
    int32_t qk_norm;  /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    /* RMSNorm of q and k over their whole projections (nh * hd, nkv * hd) before RoPE, weights
     * q_norm [nh * hd] and k_norm [nkv * hd] (OLMoE) */
    int32_t qk_norm_full;
    float qkv_clip; /* q, k and v clamped to [-qkv_clip, qkv_clip] after the projections and the
                     * full-width norms, before RoPE (OLMoE's clip_qkv); 0: none */
    int32_t gated;  /* q_proj yields per head [query | gate]; sigmoid(gate) before o_proj
                     * (Qwen3-Next, Qwen3.5) */
    int32_t sinks;  /* a learned sink logit per head, self_attn.sinks (gpt-oss) */
} blk_attn_opts;

typedef enum blk_linear_proj {
    BLK_LINEAR_FUSED = 0,    /* Qwen3-Next: in_proj_qkvz + in_proj_ba, interleaved per key head
                              * (from GGUF: in_proj_qkv + in_proj_z, and that in_proj_ba) */
    BLK_LINEAR_SEPARATE = 1, /* Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a */
} blk_linear_proj;

typedef struct blk_ffn_opts {
    int32_t shared_expert;  /* MoE layers add a sigmoid-gated shared expert (Qwen2-MoE) */
    int32_t shared_ungated; /* ... summed as it is, with no shared_expert_gate (Llama-4) */
    int32_t shared_experts; /* MoE layers add an ungated shared expert, mlp.shared_experts.*
                             * (DeepSeek-V3, GLM-4.5), of shared_intermediate_size */
    int32_t select_bias;    /* the router has mlp.gate.e_score_correction_bias [E] */
} blk_ffn_opts;

/* How the sublayer and final norms bind: required, or optional when the family's own blocks
 * replace them (sl_family.own_norms). */
int blk_norm_flags(const sl_model *m);
/* Embedding, final norm and LM head (tied or not). */
sl_status blk_bind_globals(sl_model *m, sl_error *err);
/* Norms and projections of layer l's self-attention; its sliding window from the config. */
sl_status blk_bind_attention(sl_model *m, int32_t l, const blk_attn_opts *o, sl_error *err);
/* Norm and Gated DeltaNet tensors (linear_attn.*) of layer l (linear_attn.c). */
sl_status blk_bind_linear_attention(sl_model *m, int32_t l, blk_linear_proj proj, sl_error *err);
/* A whole hybrid decoder (Qwen3-Next, Qwen3.5): Gated DeltaNet on the layers config marks
 * linear (projections laid out as proj), gated full attention with q/k norms elsewhere,
 * FFNs with a sigmoid-gated shared expert. */
sl_status blk_bind_hybrid(sl_model *m, blk_linear_proj proj, sl_error *err);
/* Layer l's FFN: dense MLP, or router (+ shared expert); routed experts bind in the store. */
sl_status blk_bind_ffn(sl_model *m, int32_t l, const blk_ffn_opts *o, sl_error *err);
/* A whole pre-norm decoder: the globals, then every layer's attention (attn) and FFN (ffn). */
sl_status blk_bind_decoder(sl_model *m, const blk_attn_opts *attn, const blk_ffn_opts *ffn,
                           sl_error *err);
/* The routed experts of a checkpoint (Hugging Face or GGUF), by name, handed to the store as
 * views into the checkpoint's mapping (mode mapped), or as where they lie in its files for the
 * store to read itself (resident, stream). A pack's experts are opened by the store alone. */
sl_status blk_bind_experts(sl_model *m, const sl_store_params *sp, sl_error *err);

/* Sparse attention: query t sees only the n_sel[t] cache rows sel[t * stride ...], in
 * ascending order (backend memory, like sl_attn_args' own). */
typedef struct blk_attn_sel {
    const int32_t *sel, *n_sel;
    int32_t stride;
} blk_attn_sel;

/*
 * The sequence whose cache, state and position row i's attention uses, and how many rows a call
 * of the attention kernels takes: s itself, all T rows at once; or, in a batched decode step
 * (s->rows), rows[i], one row a call. The products around the attention run on all T rows.
 */
static inline sl_session *blk_row_session(sl_session *s, int32_t i) {
    return s->rows ? s->rows[i] : s;
}
static inline int32_t blk_row_calls(const sl_session *s, int32_t T) {
    return s->rows ? T : 1;
}

/* The hand-off at a boundary of a split model (sl_model_part), after layer s->layer1 - 1: the
 * session, with the sessions of a batched step's rows, enters the next partition, and the rows
 * of what crosses ([T, row] floats at buf(s), the residual stream: blk_residual_of, s->b.x)
 * go from the buffer of the partition left to the same buffer of the one entered, through
 * sl_backend_transfer. The caller goes on there (the shared decoder norms x first). */
typedef float *(*blk_part_buf)(sl_session *s);
float *blk_residual_of(sl_session *s);
void blk_part_cross(sl_session *s, int32_t T, blk_part_buf buf, size_t row);
/* Once entered: more bytes across, from src in the memory of the partition left (from) to dst
 * in the current one's. */
void blk_part_move(const sl_session *s, const sl_backend *from, void *dst, const void *src,
                   size_t bytes);

/* s->b.xn -> s->b.out for T tokens at position s->pos (or one each of s->rows); appends K/V to
 * layer l's cache. Every query sees every position up to its own, or only those of sel (when
 * not NULL, never with rows). */
void blk_attention(sl_session *s, int32_t l, int32_t T, const blk_attn_sel *sel);
/* s->b.xn -> s->b.out for T tokens through Gated DeltaNet, token by token, carrying the
 * layer's conv and recurrent state in the session (linear_attn.c). */
void blk_linear_attention(sl_session *s, int32_t l, int32_t T);
/* s->b.xn -> s->b.out: dense SwiGLU MLP, or the MoE step (moe/moe.h) on the layer's router,
 * routed experts (+ shared expert). */
sl_status blk_ffn(sl_session *s, int32_t l, int32_t T, sl_error *err);

/* The token embedding of T host ids into y; the LM head over rows x [rows, H] into the
 * caller's host logits (NULL: none wanted). */
void blk_embed(sl_session *s, float *y, const int32_t *ids, int32_t T);
void blk_head(sl_session *s, const float *x, int32_t rows, float *logits);

/* x += out, xn = its norm with w (add_rmsnorm), out of place into x_alt where the backend can
 * leave it to the next op (add_rmsnorm_next; the two buffers swap): a sublayer's residual add
 * and the next sublayer's norm. */
void blk_residual_norm(sl_session *s, const sl_tensor *w, int32_t T);

/* The pre-norm decoder of Qwen2/Qwen3(-MoE), Qwen3-Next and Qwen3.5:
 *   x = embed(ids)
 *   per layer: x += attn(norm(x)); x += ffn(norm(x))
 *   (attn is Gated DeltaNet on the hybrid models' linear-attention layers)
 *   logits = lm_head(norm(x)) */
sl_status blk_prenorm_decoder(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                              int all_logits, sl_error *err);

#endif /* SL_MODEL_BLOCKS_H */
