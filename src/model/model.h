/*
 * The loaded model and a running session: internal layout shared by the
 * blocks and the families. Weights are views into the checkpoint mapping.
 */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "moe/moe.h"

/*
 * Qwen4-Exp hyper-connection: reads the hc residual streams W [hc, H] through a
 * grouped RMSNorm n, mixes them with w = sigmoid(up(silu(down(n) / hc))) into
 * mean_c(w[c] * n[c]), and (when inject is present) weights the sublayer's output
 * back onto the un-normalised streams by 2 * sigmoid(inject(n) / hc).
 */
typedef struct sl_hyper {
    sl_tensor norm;   /* [hc*H]: RMSNorm (1 + w), one statistic per stream */
    sl_tensor down;   /* [r, hc*H] */
    sl_tensor up;     /* [hc*H, r] */
    sl_tensor inject; /* [hc, hc*H]; absent in the final mixer */
} sl_hyper;

/*
 * One PLE layer's n-gram embedding table [rows, dim]. In the real model it holds
 * about 51 billion parameters, so it is never loaded: each token's rows are read
 * where they lie, from the checkpoint or pack mapping (parts, concatenated on rows),
 * or with one pread per row (fd >= 0: a packed model whose experts are streamed).
 */
typedef struct sl_ngram_table {
    int64_t rows;
    int32_t dim;
    sl_dtype dtype;
    int32_t n_parts;
    sl_tensor *parts; /* shards in row order (views into a mapping) */
    int fd;           /* pread access, or -1 */
    uint64_t data_off;
    size_t row_bytes;
    void *map; /* the pack file's mapping (owned), or NULL */
    size_t map_len;
    /* packed tables */
    char *path;          /* ngram-LLL.bin, for messages */
    sl_ngram_header hdr; /* from version 2, each row ends in its CRC32C (sl_ngram_row_ok) */
    int map_fd;          /* mapped: kept open to notice the file shrinking (fstat), or -1 */
} sl_ngram_table;

#define SL_NGRAM_MAX 8

/* Qwen4-Exp PLE of one layer: hashed n-gram embeddings gated into every stream. */
typedef struct sl_ple {
    int32_t index;               /* position in ple_layer_ids */
    uint64_t mult[SL_NGRAM_MAX]; /* hash multiplier per n-gram position */
    int64_t *vocab, *offset;     /* [n-gram heads]: prime vocabulary and table row offset */
    sl_ngram_table table;
    sl_tensor key_proj;                        /* [hc*H, D] */
    sl_tensor value_proj;                      /* [H, D] */
    sl_tensor norm_key, norm_query, norm_conv; /* [hc*H], grouped like sl_hyper.norm */
    sl_tensor conv;                            /* [hc*H, 1, K], dilation ngram_size */
} sl_ple;

/* One decoder layer. Absent tensors (no bias, no qk-norm, dense vs MoE) have data == NULL. */
typedef struct sl_layer {
    sl_tensor attn_norm;      /* [H] */
    sl_tensor wq, wk, wv, wo; /* [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd] */
    sl_tensor bq, bk, bv, bo; /* [nh*hd], [nkv*hd], [nkv*hd], [H]: optional biases */
    sl_tensor q_norm, k_norm; /* [hd]: per-head RMSNorm before RoPE (Qwen3) */
    int32_t attn_gated;       /* wq is [nh*2*hd, H]: per head [query | sigmoid gate] */
    /* Gated DeltaNet (is_linear); key_dim = nk*dk, value_dim = nv*dv,
     * conv_dim = 2*key_dim + value_dim. Either the fused Qwen3-Next projections
     * (in_qkvz, in_ba, interleaved per key-head group) or the separate Qwen3.5 ones. */
    int32_t is_linear;
    sl_tensor in_qkvz;        /* [2*key_dim + 2*value_dim, H] */
    sl_tensor in_ba;          /* [2*nv, H] */
    sl_tensor in_qkv;         /* [conv_dim, H] */
    sl_tensor in_z;           /* [value_dim, H] */
    sl_tensor in_b, in_a;     /* [nv, H] */
    sl_tensor conv_w;         /* [conv_dim, 1, K] */
    sl_tensor A_log, dt_bias; /* [nv] */
    sl_tensor lin_norm;       /* [dv]: gated RMSNorm weight (plain w) */
    sl_tensor out_proj;       /* [H, value_dim] */
    sl_tensor ffn_norm;       /* [H] */
    int32_t is_moe;
    sl_tensor mlp_gate, mlp_up, mlp_down; /* dense FFN: [I, H], [I, H], [H, I] */
    sl_tensor router;                     /* [E, H] */
    sl_tensor sh_gate, sh_up, sh_down;    /* shared expert: [Is, H], [Is, H], [H, Is] */
    sl_tensor sh_router;                  /* [1, H]: sigmoid gate of the shared expert */
    /* Qwen4-Exp: hyper-connections replace attn_norm and ffn_norm */
    sl_hyper hc_attn, hc_ffn;
    sl_ple *ple; /* PLE before the mixer, or NULL */
    /* QSA indexer in front of full attention (Qwen4-Exp) */
    sl_tensor idx_qk;                 /* [(idx_heads + 1) * idx_head_dim, H] */
    sl_tensor idx_q_norm, idx_k_norm; /* [idx_head_dim], (1 + w) */
} sl_layer;

typedef struct sl_family sl_family;

struct sl_model {
    sl_config cfg;
    sl_ckpt ck;
    const sl_family *family;
    sl_backend be;
    sl_tensor embed;   /* [V, H] */
    sl_tensor norm;    /* [H] final norm */
    sl_tensor lm_head; /* [V, H]; the embedding when tied */
    sl_layer *layers;  /* [n_layers] */
    sl_hyper hc_final; /* Qwen4-Exp: the final mixer, in place of the final norm */
    sl_ple *ples;      /* [n_ple_layers] */
    sl_expert_store experts;
    sl_dev_cache dev; /* experts in backend memory (CUDA); unused on the CPU backend */
    void **uploads;   /* backend copies of the weights (CUDA), released with the model */
    int32_t n_uploads;
    float norm_offset; /* RMSNorm weight offset: 0 (w) or 1 (1 + w) */
    int32_t packed;    /* loaded from a sluice pack (else a Hugging Face directory) */
    int32_t graphs;    /* decode steps recorded as backend graphs (sl_session_forward) */
    sl_stats stats;    /* phase times and token counts; expert counters live in the store */
    /* the pack's format version (1: no checksums) */
    int32_t pack_version;
};

/*
 * Activations, carved at session creation from two allocations: backend memory
 * (what ops compute on; host memory for the CPU backend, GPU memory for CUDA)
 * and host memory (fields marked "host": the mirrors of the few values the host
 * reads or writes); the MoE step's own scratch is sl_session.moe (moe/moe.h).
 * B = max_batch (tokens per forward chunk), H = hidden.
 */
typedef struct sl_session_buf {
    int32_t *ids;         /* [B] token ids of the chunk */
    float *logits;        /* [B, V] when the backend is not host memory, else NULL */
    float *ones;          /* [max(ratio, 1)] all 1: sums of rows through weighted_sum */
    float *h_qsa_scores;  /* host [max_ctx / ratio] */
    int32_t *h_qsa_sel;   /* host [B, budget + ratio - 1] */
    int32_t *h_qsa_nsel;  /* host [B] */
    float *h_ple_emb;     /* host [B, D] */
    float *x;             /* [B, H] residual stream */
    float *x_alt;         /* [B, H] its other buffer (blk_prenorm_decoder swaps them) */
    float *xn;            /* [B, H] normed input of a sublayer */
    float *out;           /* [B, H] sublayer output */
    float *q;             /* [B, nh*hd] */
    float *k, *v;         /* [B, nkv*hd] */
    float *attn;          /* [B, nh*hd] */
    float *gate, *up;     /* [B, Imax] FFN hidden (dense, shared and routed experts) */
    float *ffn_out;       /* [B, H] a batch of experts' (or the shared expert's) output */
    float *attn_scratch;  /* [n_threads, max_ctx] */
    float *qg;            /* [B, nh*2*hd] gated q_proj output */
    float *qgate;         /* [B, nh*hd] */
    float *lin_proj;      /* [B, 2*key_dim + 2*value_dim] fused qkvz projection */
    float *lin_ba;        /* [B, 2*nv] fused ba projection */
    float *lin_mixed;     /* [B, conv_dim] conv input [q | k | v] */
    float *lin_conv;      /* [B, conv_dim] conv output */
    float *lin_q, *lin_k; /* [B, key_dim] */
    float *lin_v, *lin_z; /* [B, value_dim] */
    float *lin_a, *lin_b; /* [B, nv] */
    float *lin_o;         /* [B, value_dim] */
    /* Qwen4-Exp (hc = hc_count, D = ple_embed_dim, G = n-gram heads) */
    float *hres;                /* [B, hc*H] the residual streams */
    float *hnorm;               /* [B, hc*H] grouped-normed streams */
    float *hlow;                /* [B, r] low-rank mix */
    float *hw;                  /* [B, hc*H] mix weights */
    float *hinj;                /* [B, hc] injection weights */
    int32_t *ple_hist;          /* host [B, ngram_size] token at shift s (EOS past a reset) */
    int64_t *ple_rows;          /* host [B, G] table rows */
    uint8_t *ple_rowbuf;        /* host [B, G] table rows as read (pread) */
    sl_read_job *ple_jobs;      /* host [B, G] their reads */
    float *ple_emb;             /* [B, D] */
    float *ple_key, *ple_gate;  /* [B, hc*H] */
    float *ple_val;             /* [B, H] */
    float *ple_norm, *ple_conv; /* [B, hc*H] */
    float *idx_qk;              /* [B, (idx_heads + 1) * idx_head_dim] */
    float *idx_q;               /* [B, idx_heads * idx_head_dim] */
    float *qsa_scores;          /* [max_ctx / ratio] */
    uint8_t *qsa_taken;         /* host [max_ctx / ratio] */
    int32_t *qsa_order;         /* host [max_ctx / ratio] the block choice's scratch */
    int32_t *qsa_sel;           /* [B, budget + ratio - 1] attended positions per query */
    int32_t *qsa_nsel;          /* [B] */
    /* The final hidden state as the LM head takes it (blk_head, each chunk; NULL before), and
     * a host row of it: what sl_session_forward checks when a chunk returns no logits. */
    const float *head_x; /* [head_rows, H], backend memory */
    int32_t head_rows;
    float *h_hidden; /* host [H] */
} sl_session_buf;

struct sl_session {
    sl_model *model;
    int32_t max_ctx, max_batch, pos;
    float *kcache, *vcache;     /* [n_layers, max_ctx, nkv*hd] */
    float *rope_cos, *rope_sin; /* [max_ctx, rot_dim / 2] */
    /* Recurrent state of the linear-attention layers (indexed by layer; empty when none);
     * it cannot be rewound, only reset. */
    float *delta_state;                 /* [n_layers, nv, dk, dv] */
    float *conv_state;                  /* [n_layers, conv_dim, K - 1] */
    size_t delta_state_n, conv_state_n; /* element counts */
    /* Qwen4-Exp: the QSA indexer's caches (indexed by layer, like the KV cache) and PLE's
     * recurrent state (token history and the dilated conv's inputs). */
    float *idx_kcache;     /* [n_layers, max_ctx, idx_head_dim] raw indexer keys */
    float *idx_blocks;     /* [n_layers, max_ctx / ratio, idx_head_dim] pooled block keys */
    int32_t *ple_ctx;      /* host [ngram_size - 1] the last tokens, oldest first */
    float *ple_conv_state; /* [n_ple_layers, hc*H, (K-1) * ngram_size] */
    size_t ple_conv_state_n;
    sl_session_buf b;
    sl_moe_scratch moe;   /* the MoE step's buffers, carved with b */
    int32_t defer_logits; /* blk_head leaves the logits in b.logits (a graph is recording) */
    void *arena;          /* backend memory */
    void *host_arena;     /* host memory */
};

/* A model family: binds its tensors and runs its forward pass over blocks. */
struct sl_family {
    const char *arch;
    float norm_offset;
    sl_status (*bind)(sl_model *m, sl_error *err);
    /* T <= max_batch ids at position s->pos; writes T rows (or the last) of logits. */
    sl_status (*forward)(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                         int all_logits, sl_error *err);
    /* A decode step takes no decision on the host when the experts need none (no QSA
     * choice, no PLE rows): a backend may record it as one graph. */
    int graph_steps;
};

extern const sl_family sl_family_qwen3_moe;
extern const sl_family sl_family_qwen2_moe;
extern const sl_family sl_family_qwen3_next;
extern const sl_family sl_family_qwen3_5_moe;
extern const sl_family sl_family_qwen3_5_moe_text;
extern const sl_family sl_family_qwen4_exp;
extern const sl_family sl_family_qwen4_exp_text;

#endif /* SL_MODEL_H */
