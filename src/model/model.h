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

/* One decoder layer. Absent tensors (no bias, no qk-norm, dense vs MoE) have data == NULL. */
typedef struct sl_layer {
    sl_tensor attn_norm;      /* [H] */
    sl_tensor wq, wk, wv, wo; /* [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd] */
    sl_tensor bq, bk, bv, bo; /* [nh*hd], [nkv*hd], [nkv*hd], [H]: optional biases */
    sl_tensor q_norm, k_norm; /* [hd]: per-head RMSNorm before RoPE (Qwen3) */
    int32_t qk_norm_full;     /* ... over the whole projection: [nh*hd], [nkv*hd] (OLMoE) */
    float qkv_clip;           /* blk_attn_opts.qkv_clip */
    int32_t attn_gated;       /* wq is [nh*2*hd, H]: per head [query | sigmoid gate] */
    sl_tensor sinks;          /* [nh]: attention sinks (sl_attn_args.sinks) */
    int32_t window;           /* sliding window of the layer's attention (0: none) */
    /* Attention variants of the layer (0: none). NoPE: no RoPE on q and k; chunked local
     * attention (sl_attn_args.chunk); q's temperature tuning (sl_qkv_args). */
    int32_t no_rope;
    int32_t attn_chunk;
    float temp_floor, temp_scale;
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
    sl_tensor router_bias;                /* [E]: the router's linear bias (optional) */
    sl_tensor select_bias;                /* [E]: e_score_correction_bias (sigmoid routing) */
    sl_tensor expert_scale;               /* [E]: per-expert router weight factor */
    sl_tensor sh_gate, sh_up, sh_down;    /* shared expert: [Is, H], [Is, H], [H, Is] */
    sl_tensor sh_router; /* [1, H]: sigmoid gate of the shared expert (absent: ungated) */
} sl_layer;

typedef struct sl_family sl_family;

/*
 * A partition of the pipeline split (issue 31, model/split.h): layers [layer0, layer1) on a
 * backend of its own, with its own expert cache in that backend's memory. The embedding runs on
 * partition 0, the final norm and the head on the last; each token's residual rows cross each
 * boundary once (blk_part_cross). One partition (the default) is the model's own backend and
 * cache, and the forward pass is the unsplit one. On the CPU, partitions are separate CPU
 * backends (logical partitions, to test the split on one machine); on CUDA they are to be the
 * GPUs of one host.
 */
typedef struct sl_model_part {
    int32_t layer0, layer1;
    const sl_backend *be; /* partition 0: &sl_model.be; else &own_be */
    sl_dev_cache *dev;    /* partition 0: &sl_model.dev; else &own_dev (its layers' slots) */
    sl_backend own_be;
    sl_dev_cache own_dev;
    int64_t bytes; /* what the plan put here (sl_split_bytes) */
} sl_model_part;

struct sl_model {
    sl_config cfg;
    sl_ckpt ck;
    const sl_family *family;
    sl_backend be;
    sl_tensor embed;   /* [V, H] */
    sl_tensor norm;    /* [H] final norm */
    sl_tensor lm_head; /* [V, H]; the embedding when tied */
    sl_layer *layers;  /* [n_layers] */
    void *fam;         /* what the family adds (its bind hook's, freed by its free_model) */
    sl_expert_store experts;
    sl_dev_cache dev;     /* experts in backend memory (CUDA); unused on the CPU backend */
    void **uploads;       /* backend copies of the weights (CUDA), released with the model */
    int32_t *upload_part; /* [n_uploads] the partition whose backend holds each */
    int32_t n_uploads;
    float norm_offset;                          /* RMSNorm weight offset: 0 (w) or 1 (1 + w) */
    int32_t kind;                               /* sl_model_kind: where it was loaded from */
    char types[768];                            /* sl_model_info.types */
    char io_engine[96];                         /* sl_model_info.io_engine */
    int64_t cache_auto_avail, cache_auto_bytes; /* sl_model_info.cache_auto_* */
    char router[160];                           /* sl_model_info.router */
    int32_t graphs;   /* decode steps recorded as backend graphs (sl_session_forward) */
    int32_t prefetch; /* sl_model_params.prefetch, clamped to the experts a token picks */
    sl_stats stats;   /* phase times and token counts; expert counters live in the store */
    /* the routing trace (params.router_trace, keep_routes); trace_on: open */
    sl_trace_writer trace;
    int32_t trace_on;
    sl_route_replay replay; /* params.route_replay, loaded (replay_on) */
    int32_t replay_on;
    /* the pack's format version (1: no checksums) */
    int32_t pack_version;
    int32_t n_parts;      /* partitions of the pipeline split (1: none) */
    sl_model_part *parts; /* [n_parts] */
    char split[256];      /* sl_model_info.split */
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
    /* The final hidden state as the LM head takes it (blk_head, each chunk; NULL before), and
     * a host row of it: what sl_session_forward checks when a chunk returns no logits. */
    const float *head_x; /* [head_rows, H], backend memory */
    int32_t head_rows;
    float *h_hidden; /* host [H] */
    float *h_stage;  /* host [B, H] when split: what crosses a boundary on its way between two
                      * device partitions without a peer copy (sl_backend_transfer), in pieces */
} sl_session_buf;

/*
 * What a session keeps per partition of a split model (sl_model_part): the buffers below are
 * carved per partition from that partition's backend, and the session's fields of the same names
 * are the current partition's (sl_session_enter swaps them). With one partition there is none
 * of this: the session's fields are all.
 */
typedef struct sl_session_part {
    const sl_backend *be;
    int32_t layer0, layer1;
    float *kcache, *vcache, *rope_cos, *rope_sin, *delta_state, *conv_state;
    size_t delta_state_n, conv_state_n;
    sl_session_buf b;
    sl_moe_scratch moe;
    void *fam;
    void *arena, *host_arena;
} sl_session_part;

struct sl_session {
    sl_model *model;
    int32_t max_ctx, max_batch, pos;
    /* The current partition (sl_session_part): its backend, which every block computes on, and
     * its layers, whose rows of the caches and states below are the partition's own (layer l
     * at l - layer0). One partition: the model's backend, all layers. */
    const sl_backend *be;
    int32_t layer0, layer1;
    int32_t part, n_parts;
    sl_session_part *parts;     /* [n_parts] when n_parts > 1, else NULL */
    float *kcache, *vcache;     /* [layer1 - layer0, max_ctx, nkv*hd] */
    float *rope_cos, *rope_sin; /* [max_ctx, rot_dim / 2] */
    /* Recurrent state of the linear-attention layers (layer l at l - layer0; empty when none);
     * it cannot be rewound, only reset. */
    float *delta_state;                 /* [layer1 - layer0, nv, dk, dv] */
    float *conv_state;                  /* [layer1 - layer0, conv_dim, K - 1] */
    size_t delta_state_n, conv_state_n; /* element counts */
    sl_session_buf b;
    sl_moe_scratch moe; /* the MoE step's buffers, carved with b */
    void *fam; /* what the family adds (sl_family.session_size bytes, carved by its layout) */
    int32_t defer_logits; /* blk_head leaves the logits in b.logits (a graph is recording) */
    /* A batched decode step (sl_batch_decode) runs on a session of its own, whose rows are the
     * next tokens of other sessions: row i's attention reads and appends to rows[i]'s cache (or
     * recurrent state) at rows[i]->pos, with its RoPE tables and scratch. NULL otherwise. */
    sl_session *const *rows;
    int32_t batch;    /* made for sl_batch_decode (its MoE step sized for rows of sequences) */
    void *arena;      /* backend memory */
    void *host_arena; /* host memory */
};

/*
 * A model family: how it reads its own config keys, what it binds
 * (into the shared sl_layer and into its own state, sl_model.fam), its forward pass over the
 * blocks, and what its sessions need beyond the shared buffers (sl_session.fam). Every hook
 * but bind and forward is optional. The registry (families/families.c) maps config.json's
 * model_type to a family.
 */
struct sl_family {
    const char *arch; /* its name (the registry maps each model_type it runs to it) */
    float norm_offset;
    /* Its keys of config.json (root: the text model's object), once the shared ones are read;
     * fills the shared fields it decides and c->fam (one allocation, freed with the config).
     * Messages name path and the key, as the shared parser's do. */
    sl_status (*read_config)(sl_config *c, const json_t *root, const char *path, sl_error *err);
    /* Names config.json's layer_types may give a full-attention layer beside "full_attention"
     * (NULL-terminated), or NULL. */
    const char *const *attn_layer_types;
    sl_status (*bind)(sl_model *m, sl_error *err);
    /* After binding and the expert store: what the family reads beside the checkpoint's
     * tensors (from dir; streamed: experts are read per token, so should its tables be). */
    sl_status (*open)(sl_model *m, const char *dir, int streamed, sl_error *err);
    /* Its weights (the tensors it bound into m->fam) into out[n...] when out is not NULL, and
     * (layer not NULL) the layer each serves into layer[n...] (-1: the embedding's side, n_layers:
     * the head's);
     * returns the count. They go to backend memory with the shared ones, each to its layer's
     * partition. */
    int32_t (*weights)(sl_model *m, sl_tensor **out, int32_t *layer);
    void (*free_model)(sl_model *m); /* releases m->fam and what open opened */
    /* The figures sl_model_get_info reports for the family's own parts. */
    void (*info)(const sl_model *m, sl_model_info *info);
    /* Sessions: s->fam is session_size zeroed bytes; layout carves its buffers from the
     * backend arena (dev) and the host arena (host), called twice like the shared layout;
     * init fills constants once the arenas exist; reset clears its state for a new sequence;
     * rewind returns nonzero when its state cannot go back to pos. */
    size_t session_size;
    void (*session_layout)(sl_session *s, sl_carver *dev, sl_carver *host);
    sl_status (*session_init)(sl_session *s, sl_error *err);
    void (*session_reset)(sl_session *s);
    int (*session_rewind)(sl_session *s, int32_t pos);
    /* T <= max_batch ids at position s->pos; writes T rows (or the last) of logits. */
    sl_status (*forward)(sl_session *s, const int32_t *ids, int32_t T, float *logits,
                         int all_logits, sl_error *err);
    /* The family's own forward runs split over partitions (sl_model_part): it crosses each
     * boundary (blk_part_cross) and its session state is per partition. blk_prenorm_decoder
     * does. */
    int splits;
    /* Optional: layer l's attention sublayer (b->xn -> b->out) when it is the family's own
     * (MLA), so that blk_prenorm_decoder runs the rest of the decoder as for every family.
     * It must honour sl_session.rows (blk_row_session): sl_batch_decode runs every family
     * whose forward is blk_prenorm_decoder in batches. */
    void (*attention)(sl_session *s, int32_t l, int32_t T);
    /* A decode step takes no decision on the host when the experts need none (no QSA
     * choice, no PLE rows): a backend may record it as one graph. */
    int graph_steps;
    /* The sublayer and final norms are the family's own (bound optional; blk_norm_flags). */
    int own_norms;
    /* Its checkpoint's FFN names: layers.N.<ffn_name>.{gate_proj, up_proj, down_proj,
     * <router_name>, shared_expert, experts} ("mlp" and "gate" when NULL). */
    const char *ffn_name, *router_name;
    /* config.json's attention keys are the family's (its read_config sets rope_theta and
     * rot_dim): RoPE parameters per layer type (Gemma 4), which the shared parser refuses, and
     * layer_types / sliding_window with the family's own defaults. */
    int own_attention_config;
    /* The family keeps its own KV cache (layers of different shapes): the shared one
     * (sl_session.kcache, vcache) is not carved. */
    int own_kv_cache;
    /* Where a layer's routed experts sit in the checkpoint, "layers.N.<this>.gate_up_proj"
     * and so on (blk_bind_experts); NULL: "mlp.experts". */
    const char *experts_module;
    /* Optional: the routed experts' layout (sl_expert_layout) where the checkpoint tells it
     * and config.json does not (the same names in other shapes). Asked of a Hugging Face
     * checkpoint once it is open, before bind, and by the packer, which streams experts that
     * need a relayout. */
    int32_t (*expert_layout)(const sl_config *c, const sl_ckpt *ck);
};

/* Makes partition p the session's current one (a split model's forward pass, at its start and at
 * each boundary): the current partition's fields go back to it, p's come in. */
void sl_session_enter(sl_session *s, int32_t p);

/* The router rule of config c (its route_* keys and norm_topk_prob; config.c). */
sl_route_cfg sl_config_route(const sl_config *c);

/* The family running model_type arch, or NULL (families/families.c); the names of those
 * sluice runs, for messages. */
const sl_family *sl_family_find(const char *arch);
const char *sl_family_names(void);

#endif /* SL_MODEL_H */
