/*
 * The MoE step of one layer, for every backend: route the tokens of a chunk
 * (the backend's moe_route), group their (token, rank) rows by expert, decide
 * where each expert's weights are (host store, backend cache), fetch them and
 * compute, then sum each token's rows in router-rank order (so the result never
 * depends on the chunk, the grouping or where the weights came from), plus the
 * shared expert (sigmoid-gated or not) when the layer has one.
 *
 *   x -> moe_route -> ids, w        (backend memory)
 *     weight_input: x_r = w[r] * x, and w = 1 from here on
 *     decode, a slot per expert:    fused kernels, no host step (settled later; SwiGLU experts
 *                                   without linear biases)
 *     else: ids to the host, counting sort by expert, then per group of experts
 *           the store can hold:     fetch, map into the device cache, compute
 *           (fused kernels for one token, else gate/up batch, SwiGLU, down batch)
 *   out = sum_r w[r] * expert_r(x_r) (+ [sigmoid(sh_router . x) *] shared(x))
 *
 * Streamed experts: a group's misses read while its cached experts compute (the store's
 * asynchronous fetch), and at decode the next MoE layer's router, applied to x, predicts that
 * layer's picks so their reads start a layer early (sl_moe_dims.prefetch). A routing trace can
 * stand in for the routers (env.replay, benchmarks).
 *
 * A session owns one sl_moe_scratch, carved at its creation (sl_moe_layout):
 * nothing is allocated while a forward pass runs.
 */
#ifndef SL_MOE_H
#define SL_MOE_H

#include "moe/dev_cache.h"
#include "moe/experts.h"
#include "moe/replay.h"
#include "moe/trace.h"

/* What the scratch is sized for. */
typedef struct sl_moe_dims {
    int32_t n_layers;  /* all layers: the decode bookkeeping has a row per layer */
    int32_t n_experts; /* E */
    int32_t k;         /* experts per token */
    int32_t hidden;    /* H */
    int32_t inter;     /* I, a routed expert's intermediate size */
    int32_t max_batch; /* B, tokens per chunk */
    /* rows (token, pick) of one batched run of experts, B..k B: at k B a chunk's experts run
     * as one batch, each expert's weights read once a chunk (a device backend's prefill); at
     * B in runs of up to B rows, in the buffers the caller passes (sl_moe_io) */
    int32_t max_rows;
    int32_t shared;     /* some layer has a shared expert (sh_out is sized) */
    sl_route_cfg route; /* how the router picks and weighs (kernels/ops.h) */
    /* The router weight of each pick scales that expert's input (x_r = w[r] * x, one multiply)
     * and the outputs are summed with weight 1, instead of weighing the outputs (Llama 4). */
    int32_t weight_input;
    int32_t glu; /* sl_glu: the experts' activation (SwiGLU, GELU-tanh, or clamped with these) */
    float glu_alpha, glu_limit;
    /* A batch session's (sl_batch_decode, whose chunks are decode steps of as many sequences):
     * chunks of up to this many rows take the fused path as one token does, with no host step
     * (0: one) */
    int32_t decode_rows;
    /* Pre-gating (decode, streamed experts): each token's this many most likely picks of the
     * next MoE layer, predicted from this layer's input, start reading while this layer
     * computes (0: none) */
    int32_t prefetch;
} sl_moe_dims;

/* The model's side of the step, set once (sl_moe_layout's caller): the backend, the expert
 * store, the device cache (layers NULL: none) and the counters the step adds to. */
typedef struct sl_moe_env {
    const sl_backend *be;
    sl_expert_store *store;
    sl_dev_cache *dev;
    sl_stats *stats;
    sl_trace_writer *trace; /* every token's picks go here (NULL: none) */
    /* benchmarks: routing from a trace instead of the routers (NULL: the routers') */
    const sl_route_replay *replay;
} sl_moe_env;

/* A MoE layer's tensors besides its routed experts (those are in the store). */
typedef struct sl_moe_weights {
    const sl_tensor *router;                    /* [E, H] */
    const sl_tensor *router_bias;               /* [E] or NULL (sl_route_args.bias) */
    const sl_tensor *select_bias;               /* [E] or NULL (sl_route_args.select_bias) */
    const sl_tensor *expert_scale;              /* [E] or NULL (sl_route_args.expert_scale) */
    const sl_tensor *sh_gate, *sh_up, *sh_down; /* [Is, H], [Is, H], [H, Is]; NULL: none */
    const sl_tensor *sh_router; /* [1, H] the shared expert's sigmoid gate; NULL: ungated */
    /* The next MoE layer (next_layer) and its router, for pre-gating (sl_moe_dims.prefetch):
     * NULL when there is none or its router reads another input */
    const sl_tensor *next_router, *next_router_bias, *next_select_bias;
    int32_t next_layer;
} sl_moe_weights;

/* The step's input and output, and the FFN scratch it shares with the dense MLP. */
typedef struct sl_moe_io {
    const float *x;        /* [T, H] normed input */
    const float *router_x; /* [T, H] the router's own input (Gemma 4), or NULL: x */
    float *out;            /* [T, H] */
    float *gate, *up;      /* [B, max(I, Is)] SwiGLU hidden */
    float *rows;           /* [B, H] a batch of experts' (or the shared expert's) output rows */
} sl_moe_io;

/*
 * Backend memory (what ops compute on) and host memory (marked "host"), carved by
 * sl_moe_layout. B = max_batch, E = n_experts, k = experts per token.
 */
typedef struct sl_moe_scratch {
    sl_moe_dims d;
    sl_moe_env env;
    /* [3 * B] a batch of experts' rows: read, written, then (a run of the whole chunk) the
     * inverse of the written: where each (token, rank) row's result is */
    int32_t *grp_idx;
    int32_t *h_grp; /* host [3 * B] */
    /* host, per expert j of a batch of n: items j and n + j of the gate/up batch, item j of
     * the down batch */
    float **bx, **bg, **bo;     /* [2E] rows read (xg) and written (gate, then up); [E] rows */
    const sl_tensor **wg, **wd; /* [2E] gate, then up; [E] down */
    int32_t *bT;                /* [2E] row counts */
    float *topk_w;              /* [B * k] router weights */
    int32_t *topk_ids_dev;      /* [B * k] router picks of a chunk */
    /* Decode (T = 1, or D = decode_rows rows of a batch): each layer's picks in rows of their
     * own, so the no-sync path can leave their bookkeeping to the end of the forward pass
     * (sl_moe_settle). */
    int32_t *route_ids;        /* [n_layers, D, k] */
    int32_t *h_route_ids;      /* host [n_layers, D, k] */
    uint8_t *pending;          /* host [n_layers] picks not yet counted */
    int32_t pending_rows;      /* ... of this many rows each (one forward pass's T) */
    int32_t *h_prev_ids;       /* host [n_layers, k]: each layer's picks at the last decode */
    uint8_t *prev_set;         /* host [n_layers]: step counted (sl_stats.decode_repeats) */
    float *act;                /* [D k, I] SwiGLU rows of the fused expert path */
    float *xg;                 /* [R, H] rows gathered for a batch of experts (R: max_rows) */
    float *run_gate, *run_up;  /* [R, I] a run's gate and up outputs, when R > B (else NULL) */
    float *run_out;            /* [R, H] its expert outputs, likewise */
    float *xw;                 /* [B * k, H] weight_input: each (token, rank)'s scaled input */
    float *expert_out;         /* [B * k, H] routed outputs, summed in rank order */
    float *router_logits;      /* [B, E] */
    float *sh_logit;           /* [B] */
    float *sh_out;             /* [B, H] the shared expert's gated output (when there is one) */
    int32_t *topk_ids;         /* host [B, k] */
    int32_t *expert_list;      /* host [E] distinct experts of the chunk, ascending */
    int32_t *expert_rows;      /* host [B * k] (token * k + rank) grouped by expert */
    int32_t *expert_count;     /* host [E] rows per expert */
    int32_t *expert_start;     /* host [E] scratch for the counting sort */
    const sl_expert **fetched; /* host [E] */
    /* The device path (env.dev has layers): the experts of a group its cache lacks, their
     * places in the group, their host views and whether each is copied in yet */
    int32_t *miss_ids, *miss_at;  /* host [E] */
    const sl_expert **miss_views; /* host [E] */
    uint8_t *miss_put;            /* host [E] */
    /* Pre-gating (d.prefetch > 0): the next layer's router logits of a decode step's rows, and
     * per layer the experts predicted for its coming step (scored when it runs) */
    float *pred_logits;   /* [D, E] */
    float *h_pred_logits; /* host [D, E] */
    int32_t *h_pred_ids;  /* host [n_layers, min(D P, E)] */
    int32_t *h_pred_n;    /* host [n_layers] */
    uint8_t *pred_mark;   /* host [E] */
    int32_t *pf_ids;      /* host [E]: those of a prediction the device cache lacks */
    /* Replayed routing (env.replay): each layer's tokens so far, and its MoE layer ordinal */
    int64_t *replay_pos; /* host [n_layers] */
    int32_t *moe_ord;    /* host [n_layers] */
} sl_moe_scratch;

/* Sets the dims and env and carves the buffers from dev (backend memory) and host (host
 * memory, zeroed), both 64-byte aligned; with NULL bases only sizes them. *dev_bytes and
 * *host_bytes receive what the carving takes. */
void sl_moe_layout(sl_moe_scratch *ms, const sl_moe_dims *d, const sl_moe_env *env, uint8_t *dev,
                   uint8_t *host, size_t *dev_bytes, size_t *host_bytes);

/* Layer l's routed experts (+ shared expert) of T <= B tokens: io->x -> io->out. Expert read
 * failures are returned (sl_experts_fetch), never computed on. */
sl_status sl_moe_forward(sl_moe_scratch *ms, int32_t l, const sl_moe_weights *w,
                         const sl_moe_io *io, int32_t T, sl_error *err);

/* The bookkeeping the no-sync path left for later (router histogram, device cache counts,
 * decode repeats): after each forward pass, once its work is done. */
void sl_moe_settle(sl_moe_scratch *ms);
/* No previous decode step (a new or rewound sequence): the next one counts no repeats. */
void sl_moe_forget_steps(sl_moe_scratch *ms);
/* Drops what the no-sync path left to settle (a pass recorded as a graph that never ran). */
void sl_moe_drop_pending(sl_moe_scratch *ms);

/* Whether a decode step's experts run with no host step: no MoE layer, or every expert in a
 * device slot and the backend's fused kernels taking their weights (the no-sync path: SwiGLU
 * experts without linear biases), for k picks a token (weight_input: as sl_moe_dims'; glu, the
 * experts' activation: sl_moe_dims.glu). */
int sl_moe_no_host_step(const sl_backend *be, const sl_expert_store *store, const sl_dev_cache *dev,
                        int32_t k, int weight_input, int32_t glu);

/* out[T, H] = down(silu(gate x) * up x) for rows x[T, H], with the hidden rows in hg and hu
 * ([T, I]): the shared expert's MLP, and the dense FFN's. */
void sl_moe_swiglu_mlp(const sl_backend *be, float *out, const float *x, const sl_tensor *g,
                       const sl_tensor *u, const sl_tensor *d, float *hg, float *hu, int32_t T);

#endif /* SL_MOE_H */
