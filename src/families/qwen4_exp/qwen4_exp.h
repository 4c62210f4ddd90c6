/*
 * Qwen4-Exp's own parts (qwen4_exp.c composes them over the shared blocks): its
 * config keys, the tensors it adds to the model and its layers, and the buffers
 * it adds to a session. The family's hooks (sl_family) own all of them; code
 * outside the family reaches them only through the accessors at the end.
 */
#ifndef SL_QWEN4_EXP_H
#define SL_QWEN4_EXP_H

#include "model/blocks.h"

/* The keys of config.json only this family reads (q4_read_config); one allocation. */
typedef struct q4_config {
    /* hyper-connections: the residual is hc_count streams of hidden_size */
    int32_t hc_count;
    int32_t hc_lowrank;
    /* PLE: hashed n-gram embeddings on the layers of ple_layer_ids */
    int32_t n_ple_layers;
    int32_t ple_embed_dim;       /* concatenated n-gram head embeddings (D) */
    int32_t ple_conv_kernel;     /* dilated depthwise conv kernel; dilation = ngram_size */
    int32_t ngram_size;          /* largest n-gram; n-gram heads = (ngram_size-1) * heads_per */
    int32_t ngram_heads_per;     /* heads_per_ngram */
    int32_t ngram_vocab_base;    /* ngram_vocab_size_base: head vocabularies are primes >= it */
    int32_t ngram_vocab_divisor; /* make_ngram_vocab_size_divisible_by (table rows padded) */
    int64_t ngram_seed;          /* seed of the hash multipliers */
    /* QSA: a block indexer in front of full attention; idx_heads 0 = dense */
    int32_t idx_heads, idx_head_dim, idx_budget, idx_ratio;
    int8_t layer_ple[]; /* [n_layers]: index of layer l in ple_layer_ids, -1 when none */
} q4_config;

/*
 * Hyper-connection: reads the hc residual streams W [hc, H] through a grouped RMSNorm n, mixes
 * them with w = sigmoid(up(silu(down(n) / hc))) into mean_c(w[c] * n[c]), and (when inject is
 * present) weights the sublayer's output back onto the un-normalised streams by
 * 2 * sigmoid(inject(n) / hc).
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

/* PLE of one layer: hashed n-gram embeddings gated into every stream. */
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

/* What the family adds to decoder layer l (sl_model.layers[l] holds the shared blocks). */
typedef struct q4_layer {
    sl_hyper hc_attn, hc_ffn; /* replace attn_norm and ffn_norm */
    sl_ple *ple;              /* PLE before the mixer, or NULL */
    /* QSA indexer in front of full attention */
    sl_tensor idx_qk;                 /* [(idx_heads + 1) * idx_head_dim, H], or its q rows alone */
    sl_tensor idx_k;                  /* [idx_head_dim, H] where apart from q (GGUF), else empty */
    sl_tensor idx_q_norm, idx_k_norm; /* [idx_head_dim], (1 + w) */
} q4_layer;

/* What the family adds to the model (sl_model.fam). */
typedef struct q4_model {
    sl_hyper hc_final; /* the final mixer, in place of the final norm */
    q4_layer *layers;  /* [n_layers] */
    sl_ple *ples;      /* [n_ple_layers] */
} q4_model;

/*
 * What the family adds to a session (sl_session.fam), carved from the session's arenas
 * (q4_session_layout). B = max_batch, hc = hc_count, D = ple_embed_dim, G = n-gram heads.
 */
typedef struct q4_session {
    float *hres;                /* [B, hc*H] the residual streams */
    float *hnorm;               /* [B, hc*H] grouped-normed streams */
    float *hlow;                /* [B, r] low-rank mix */
    float *hw;                  /* [B, hc*H] mix weights */
    float *hinj;                /* [B, hc] injection weights */
    int32_t *ple_hist;          /* host [B, ngram_size] token at shift s (EOS past a reset) */
    int64_t *ple_rows;          /* host [B, G] table rows */
    uint8_t *ple_rowbuf;        /* host [B, G] table rows as read (pread) */
    sl_read_job *ple_jobs;      /* host [B, G] their reads */
    float *h_ple_emb;           /* host [B, D] */
    float *ple_emb;             /* [B, D] */
    float *ple_key, *ple_gate;  /* [B, hc*H] */
    float *ple_val;             /* [B, H] */
    float *ple_norm, *ple_conv; /* [B, hc*H] */
    float *ones;                /* [max(ratio, 1)] all 1: sums of rows through weighted_sum */
    float *idx_qk;              /* [B, (idx_heads + 1) * idx_head_dim] */
    float *idx_q;               /* [B, idx_heads * idx_head_dim] */
    float *qsa_scores;          /* [max_ctx / ratio] */
    float *h_qsa_scores;        /* host [max_ctx / ratio] */
    uint8_t *qsa_taken;         /* host [max_ctx / ratio] */
    int32_t *qsa_order;         /* host [max_ctx / ratio] the block choice's scratch */
    int32_t *qsa_sel;           /* [B, budget + ratio - 1] attended positions per query */
    int32_t *qsa_nsel;          /* [B] */
    int32_t *h_qsa_sel;         /* host [B, budget + ratio - 1] */
    int32_t *h_qsa_nsel;        /* host [B] */
    /* the QSA indexer's caches (indexed by layer, like the KV cache) and PLE's recurrent
     * state (token history and the dilated conv's inputs) */
    float *idx_kcache;     /* [n_layers, max_ctx, idx_head_dim] raw indexer keys */
    float *idx_blocks;     /* [n_layers, max_ctx / ratio, idx_head_dim] pooled block keys */
    int32_t *ple_ctx;      /* host [ngram_size - 1] the last tokens, oldest first */
    float *ple_conv_state; /* [n_ple_layers, hc*H, (K-1) * ngram_size] */
    size_t ple_conv_state_n;
} q4_session;

static inline const q4_config *q4_cfg(const sl_model *m) {
    return (const q4_config *)m->cfg.fam;
}
static inline q4_model *q4_mod(const sl_model *m) {
    return (q4_model *)m->fam;
}
static inline q4_session *q4_ses(const sl_session *s) {
    return (q4_session *)s->fam;
}

/* n-gram heads of one PLE layer. */
int32_t q4_ngram_heads(const q4_config *qc);

/* The family's hooks (qwen4_exp.c, config.c). */
sl_status q4_read_config(sl_config *c, const json_t *root, const char *path, sl_error *err);

/* Hyper-connections (hyper.c): the tensors of one gated residual under the prefix fmt % l
 * (without inject for the final mixer); its grouped norm over the hc streams; the mix of
 * hres into s->b.xn (and injection weights into hinj); and the injection of s->b.out back
 * into the streams. */
sl_status q4_bind_hyper(sl_model *m, sl_hyper *hy, int with_inject, sl_error *err, const char *fmt,
                        int32_t l);
void q4_grouped_rmsnorm(sl_session *s, float *y, const float *x, const sl_tensor *w, int32_t T);
void q4_hyper_mix(sl_session *s, const sl_hyper *hy, int32_t T);
void q4_hyper_inject(sl_session *s, int32_t T);

/* PLE (ple.c). bind: layer l's PLE tensors and hash constants (no-op without PLE);
 * open_tables: the n-gram tables, mapped or (use_pread) read row by row from a pack;
 * history: the n-gram token history of a chunk (once per forward, before the layers);
 * q4_ple: hres += PLE(hres) of layer l. */
sl_status q4_bind_ple(sl_model *m, int32_t l, sl_error *err);
sl_status q4_ple_open_tables(sl_model *m, const char *dir, int use_pread, sl_error *err);
void q4_ple_free(sl_model *m);
void q4_ple_history(sl_session *s, const int32_t *ids, int32_t T);
sl_status q4_ple(sl_session *s, int32_t l, int32_t T, sl_error *err);
/* The hash constants derived from the config (what checkpoints also ship as buffers), and
 * one token's table rows for its history hist[ngram_size]; exposed for tests. */
void q4_ple_derive(const sl_config *c, int32_t ple_index, uint64_t *mult, int64_t *vocab,
                   int64_t *offset);
void q4_ple_rows(const q4_config *qc, const sl_ple *P, const int32_t *hist, int64_t *rows);

/* QSA (qsa.c): layer l's indexer tensors; the positions each of T queries attends to, into
 * sel (for blk_attention). */
sl_status q4_bind_indexer(sl_model *m, int32_t l, sl_error *err);
void q4_qsa_select(sl_session *s, int32_t l, int32_t T, blk_attn_sel *sel);
/* Marks in taken[n] the `top` best of n block scores, the blocks torch.topk takes on the CPU
 * (ties included); order[n] is scratch. Exposed for tests. */
void q4_qsa_pick(const float *scores, int32_t n, int32_t top, int32_t *order, uint8_t *taken);

/* For code outside the family that handles its files (the packer): the family's keys of a
 * config, or NULL when the config is another family's; layer l's n-gram table, or NULL. */
const q4_config *q4_config_of(const sl_config *c);
const sl_ngram_table *q4_ngram_table(const sl_model *m, int32_t l);

#endif /* SL_QWEN4_EXP_H */
