/*
 * Shared building blocks of the decoder families: tensor binding for the
 * common sublayers and their forward computations, written only against the
 * backend's sl_ops. A family composes these; nothing family-specific lives here
 * beyond the options a block takes.
 */
#ifndef SL_BLOCKS_H
#define SL_BLOCKS_H

#include "model/model.h"

typedef struct blk_attn_opts {
    int32_t qkv_bias; /* q/k/v projections carry a bias (Qwen2) */
    int32_t o_bias;   /* o_proj carries a bias */
    int32_t qk_norm;  /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int32_t gated;    /* q_proj yields per head [query | gate]; sigmoid(gate) before o_proj
                       * (Qwen3-Next, Qwen3.5) */
} blk_attn_opts;

typedef enum blk_linear_proj {
    BLK_LINEAR_FUSED = 0,    /* Qwen3-Next: in_proj_qkvz + in_proj_ba, interleaved per key head */
    BLK_LINEAR_SEPARATE = 1, /* Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a */
} blk_linear_proj;

typedef struct blk_ffn_opts {
    int32_t shared_expert; /* MoE layers add a sigmoid-gated shared expert (Qwen2-MoE) */
} blk_ffn_opts;

/* How the sublayer and final norms bind: required, or absent with hyper-connections, whose
 * own grouped norms replace them (Qwen4-Exp). */
int blk_norm_flags(const sl_model *m);
/* Embedding, final norm and LM head (tied or not). */
sl_status blk_bind_globals(sl_model *m, sl_error *err);
/* Norms and projections of layer l's self-attention. */
sl_status blk_bind_attention(sl_model *m, int32_t l, const blk_attn_opts *o, sl_error *err);
/* Norm and Gated DeltaNet tensors (linear_attn.*) of layer l (linear_attn.c). */
sl_status blk_bind_linear_attention(sl_model *m, int32_t l, blk_linear_proj proj, sl_error *err);
/* A whole hybrid decoder (Qwen3-Next, Qwen3.5): Gated DeltaNet on the layers config marks
 * linear (projections laid out as proj), gated full attention with q/k norms elsewhere,
 * FFNs with a sigmoid-gated shared expert. */
sl_status blk_bind_hybrid(sl_model *m, blk_linear_proj proj, sl_error *err);
/* Layer l's FFN: dense MLP, or router (+ shared expert); routed experts bind in the store. */
sl_status blk_bind_ffn(sl_model *m, int32_t l, const blk_ffn_opts *o, sl_error *err);
/* The routed experts of a Hugging Face checkpoint, by name, handed to the store as views
 * into the checkpoint's mapping (a pack's experts are opened by the store itself). */
sl_status blk_bind_experts(sl_model *m, sl_error *err);

/* s->b.xn -> s->b.out for T tokens at position s->pos; appends K/V to layer l's cache. */
void blk_attention(sl_session *s, int32_t l, int32_t T);
/* s->b.xn -> s->b.out for T tokens through Gated DeltaNet, token by token, carrying the
 * layer's conv and recurrent state in the session (linear_attn.c). */
void blk_linear_attention(sl_session *s, int32_t l, int32_t T);
/* s->b.xn -> s->b.out: dense SwiGLU MLP, or the MoE step (moe/moe.h) on the layer's router,
 * routed experts (+ shared expert). */
sl_status blk_ffn(sl_session *s, int32_t l, int32_t T, sl_error *err);

/* Hyper-connections (hyper.c): the tensors of one gated residual under the prefix fmt % l
 * (without inject for the final mixer); its grouped norm over the hc streams; the mix of
 * s->b.hres into s->b.xn (and injection weights into s->b.hinj); and the injection of
 * s->b.out back into the streams. */
sl_status blk_bind_hyper(sl_model *m, sl_hyper *hy, int with_inject, sl_error *err, const char *fmt,
                         int32_t l);
void blk_grouped_rmsnorm(sl_session *s, float *y, const float *x, const sl_tensor *w, int32_t T);
void blk_hyper_mix(sl_session *s, const sl_hyper *hy, int32_t T);
void blk_hyper_inject(sl_session *s, int32_t T);

/* PLE (ple.c). bind: layer l's PLE tensors and hash constants (no-op without PLE);
 * open_tables: the n-gram tables, mapped or (use_pread) read row by row from a pack;
 * history: the n-gram token history of a chunk (once per forward, before the layers);
 * blk_ple: s->b.hres += PLE(s->b.hres) of layer l. */
sl_status blk_bind_ple(sl_model *m, int32_t l, sl_error *err);
sl_status sl_ple_open_tables(sl_model *m, const char *dir, int use_pread, sl_error *err);
void sl_ple_free(sl_model *m);
void blk_ple_history(sl_session *s, const int32_t *ids, int32_t T);
sl_status blk_ple(sl_session *s, int32_t l, int32_t T, sl_error *err);
/* The hash constants derived from the config (what checkpoints also ship as buffers), and
 * one token's table rows for its history hist[ngram_size]; exposed for tests. */
void sl_ple_derive(const sl_config *c, int32_t ple_index, uint64_t *mult, int64_t *vocab,
                   int64_t *offset);
void sl_ple_rows(const sl_config *c, const sl_ple *P, const int32_t *hist, int64_t *rows);

/* QSA (qsa.c): layer l's indexer tensors; the positions each of T queries attends to,
 * into s->b.qsa_sel / qsa_nsel (called by blk_attention on layers with an indexer). */
sl_status blk_bind_indexer(sl_model *m, int32_t l, sl_error *err);
void blk_qsa_select(sl_session *s, int32_t l, int32_t T);
/* Marks in taken[n] the `top` best of n block scores, the blocks torch.topk takes on the CPU
 * (ties included); order[n] is scratch. Exposed for tests. */
void sl_qsa_pick(const float *scores, int32_t n, int32_t top, int32_t *order, uint8_t *taken);

/* The token embedding of T host ids into y; the LM head over rows x [rows, H] into the
 * caller's host logits (NULL: none wanted). */
void blk_embed(sl_session *s, float *y, const int32_t *ids, int32_t T);
void blk_head(sl_session *s, const float *x, int32_t rows, float *logits);

/* The pre-norm decoder of Qwen2/Qwen3(-MoE), Qwen3-Next and Qwen3.5:
 *   x = embed(ids)
 *   per layer: x += attn(norm(x)); x += ffn(norm(x))
 *   (attn is Gated DeltaNet on the hybrid models' linear-attention layers)
 *   logits = lm_head(norm(x)) */
sl_status blk_prenorm_decoder(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                              int all_logits, sl_error *err);

#endif /* SL_BLOCKS_H */
