/*
 * The backend boundary. Families and blocks compute only through these
 * operations, so a second backend (CUDA) implements this table, not the
 * families. Activations are float32 row-major buffers owned by the session;
 * weights are sl_tensor views (F32/F16/BF16, widened to float32 on the fly,
 * or Q8/Q4).
 *
 * Memory. Every buffer an op reads or writes (activations, caches, index lists,
 * and the data/scales/biases of weights) lives in backend memory: host memory
 * for the CPU backend, GPU memory for CUDA. Blocks never touch it directly:
 * they move bytes with copy2d/copy_rows and cross to host memory only through
 * to_host/to_dev, for the few decisions taken on the host (router top-k, QSA
 * block choice, PLE table rows). Scalars passed by value (axpy's s) are host
 * values.
 *
 * Matrix convention is PyTorch's nn.Linear: W is [N, K] (out x in) and
 * y[t][n] = sum_k x[t][k] * W[n][k] (+ b[n]).
 */
#ifndef SL_OPS_H
#define SL_OPS_H

#include "core/common.h"
#include "format/tensor.h"

typedef enum sl_isa {
    SL_ISA_SCALAR = 0, /* plain C: the reference every SIMD path is tested against */
    SL_ISA_AVX2 = 1,
    SL_ISA_AVX512 = 2,
} sl_isa;

typedef struct sl_backend sl_backend;

/* The attention inputs of T tokens at positions pos0 ..: per-head RMSNorm of q and k with
 * q_norm / k_norm (NULL: none; eps and w_offset as rmsnorm's), RoPE of both on the first
 * rot_dim dims (cos/sin tables as rope's; rot_dim 0: none), then q's temperature (below), in
 * place; then the k and v rows stored at rows pos0 .. of kc and vc. */
typedef struct sl_qkv_args {
    float *q;                         /* [T, n_heads * head_dim] */
    float *k;                         /* [T, n_kv_heads * head_dim] */
    const float *v;                   /* [T, n_kv_heads * head_dim] */
    float *kc, *vc;                   /* [ctx, n_kv_heads * head_dim] the layer's cache */
    const sl_tensor *q_norm, *k_norm; /* [head_dim] */
    int32_t T, pos0, n_heads, n_kv_heads, head_dim, rot_dim;
    float eps, w_offset;
    const float *cos_tab, *sin_tab;
    /* RoPE's pairs: 0 NeoX (i, i + rot_dim / 2), as rope; 1 interleaved (2i, 2i + 1), the
     * GPT-J / complex-number form (Llama-4). Pair i turns by cos/sin entry i either way. */
    int32_t rope_interleaved;
    /* Attention temperature tuning (temp_floor 0: none): query row t, at p = pos0 + t, is
     * scaled by log1p(floor((p + 1) / temp_floor)) * temp_scale + 1, in float32. */
    float temp_floor, temp_scale;
} sl_qkv_args;

/* Attention over a KV cache of one layer. Cache rows are [n_kv_heads * head_dim]. */
typedef struct sl_attn_args {
    float *out;          /* [T, n_heads * head_dim] */
    const float *q;      /* [T, n_heads * head_dim], normed and roped (or by prep, below) */
    const float *kcache; /* [ctx, n_kv_heads * head_dim], rows 0 .. pos0+T-1 valid */
    const float *vcache;
    int32_t T, pos0;
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;    /* usually 1/sqrt(head_dim) */
    float *scratch; /* n_threads x (pos0 + T) floats */
    /* Optional sparse attention (QSA): query t sees only the n_sel[t] cache rows
     * sel[t * sel_stride ...], in ascending order. NULL: every row up to its position. */
    const int32_t *sel, *n_sel;
    int32_t sel_stride;
    /* Chunked local attention (0: none; not with sel): the query at position p sees only the
     * keys of its own chunk, rows p - p % chunk .. p. */
    int32_t chunk;
    /* Non-NULL: the qkv_prep of these inputs comes first (its q, kc and vc are the q, kcache
     * and vcache above); a backend may fuse the two. */
    const sl_qkv_args *prep;
    /* Sliding window: > 0, the query at position p sees only the keys p - window + 1 .. p
     * (0: every one up to p). Not combined with a selection (window 0 when sel is given). */
    int32_t window;
    /* Attention sinks: [n_heads] (F32/F16/BF16), a learned logit per head that joins the
     * softmax's denominator and weighs no value:
     *   out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink_h - m)),  m = max(s, sink_h)
     * NULL: none. */
    const sl_tensor *sinks;
} sl_attn_args;

/* The gated activation of an MLP's hidden rows, glu(gate, up): what the routed experts of a
 * model compute between their projections (sl_moe_dims.glu). */
typedef enum sl_glu {
    SL_GLU_SWIGLU = 0,         /* silu(gate) * up (the swiglu op) */
    SL_GLU_SWIGLU_CLAMPED = 1, /* gpt-oss: the swiglu_clamped op, with alpha and limit */
    SL_GLU_GELU_TANH = 2,      /* gelu_tanh(gate) * up (act_mul; Gemma 4), the batched path only */
} sl_glu;

typedef enum sl_act {
    SL_ACT_SILU = 0, /* x * sigmoid(x) */
    SL_ACT_SIGMOID = 1,
    SL_ACT_NONE = 2, /* x */
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): PyTorch's gelu(approximate="tanh"),
     * transformers' gelu_pytorch_tanh */
    SL_ACT_GELU_TANH = 3,
    SL_ACT_TANH = 4, /* tanh(x): with activate's div and mul, soft-capping c tanh(x / c) */
} sl_act;

/*
 * The gated delta rule (Gated DeltaNet) over T tokens, one token after another,
 * for all value heads h (key head h / (nv / nk); h % nk with v_tiled), with per-head state
 * S [dk, dv]:
 *   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
 *   S = exp(g) S;  d = beta (v - S^T k);  S += k d^T;  out = S^T (q * q_scale)
 * q and k are already L2-normalised. Every token runs the same code whatever T,
 * so a prompt in one call, in chunks or token by token gives identical bits.
 */
typedef struct sl_delta_args {
    float *out;               /* [T, nv * dv] */
    const float *q, *k;       /* [T, nk * dk] */
    const float *v;           /* [T, nv * dv] */
    const float *a, *b;       /* [T, nv]: decay and beta logits */
    const sl_tensor *A_log;   /* [nv] */
    const sl_tensor *dt_bias; /* [nv] */
    float *state;             /* [nv, dk, dv], updated in place */
    int32_t T, nk, nv, dk, dv;
    float q_scale; /* usually 1/sqrt(dk) */
    /* How a GGUF file stores them (llama.cpp's converter): A_log holding -exp(A_log) itself
     * (ssm_a), and value heads in tiled order, head h reading key head h % nk, where Hugging
     * Face groups them (h / (nv / nk)). Both 0 for a Hugging Face checkpoint. */
    int32_t A_neg_exp;
    int32_t v_tiled;
} sl_delta_args;

/*
 * Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) in its absorbed form. Every head
 * attends over one cache of latent rows, shared by all heads; row j is
 *     [ c_j (kv_dim): the normed latent | r_j (rope_dim): the roped positional key ]
 * and a query row holds per head [ qc (kv_dim) | qr (rope_dim) ]: qc is the head's query
 * without position already taken through its key up-projection (q_nope . W_UK), qr its
 * positional part. Then, for query t at position pos0 + t,
 *     score(t, h, j) = scale * (qc . c_j + qr . r_j),   j = 0 .. pos0 + t
 *     out[t, h] = sum_j softmax_j(score) c_j             (kv_dim: the value is still latent;
 *                                                          the caller applies W_UV)
 * First (the prep), for each new token t: cache row pos0 + t gets the RMS norm of kv[t]'s first
 * kv_dim values (with kv_norm, eps and w_offset as rmsnorm's) and its last rope_dim values
 * roped at position pos0 + t; every head's qr of q[t] is roped in place at that position.
 * RoPE turns the pairs (i, i + rope_dim / 2) (NeoX, as the rope op) or, when interleaved,
 * (2i, 2i + 1) (GPT-J; DeepSeek's rope_interleave), by the cos/sin of the rope tables.
 */
typedef struct sl_latent_attn_args {
    float *out;               /* [T, n_heads * kv_dim] */
    float *q;                 /* [T, n_heads * (kv_dim + rope_dim)]; qr roped in place */
    float *cache;             /* [ctx, kv_dim + rope_dim]: rows before pos0 valid; the prep
                               * writes rows pos0 .. pos0 + T - 1 */
    const float *kv;          /* [T, kv_dim + rope_dim]: the new tokens' rows, before norm/RoPE */
    const sl_tensor *kv_norm; /* [kv_dim] */
    int32_t T, pos0, n_heads, kv_dim, rope_dim;
    int32_t interleaved; /* RoPE pairs (2i, 2i + 1) instead of (i, i + rope_dim / 2) */
    float eps, w_offset;
    float scale;                    /* 1/sqrt(key head dim), times YaRN's mscale^2 */
    const float *cos_tab, *sin_tab; /* [positions, rope_dim / 2] */
    float *scratch;                 /* n_threads x (pos0 + T) floats (CPU) */
} sl_latent_attn_args;

/*
 * How a MoE router turns a token's E logits l = x . router^T (+ bias) into k picks (rank order)
 * and their weights w. Ties go to the lower expert id in every choice.
 *   SOFTMAX:       p = softmax(l) over all E; the k largest p; w = p
 *   TOPK_SOFTMAX:  the k largest l; w = softmax over those k
 *   SIGMOID:       s = sigmoid(l); the k largest s + select_bias, from the topk_group best
 *                  groups when n_group > 1 (E in n_group runs of E / n_group experts; a group
 *                  scores the sum of its two largest s + select_bias); w = s, unbiased
 *   TOPK_SIGMOID:  the k largest l; w = sigmoid(l)
 * then, in this order: w /= sum of the k when renormalize (SIGMOID: sum + 1e-20; sums in rank
 * order), w *= expert_scale[pick], w *= scale.
 */
typedef enum sl_route_score {
    SL_ROUTE_SOFTMAX = 0,
    SL_ROUTE_TOPK_SOFTMAX = 1,
    SL_ROUTE_SIGMOID = 2,
    SL_ROUTE_TOPK_SIGMOID = 3,
} sl_route_score;

#define SL_ROUTE_MAX_GROUPS 64 /* n_group (group scores live in registers / on the stack) */

/* A router's rules beside its tensors: one per model. All zero is Qwen's softmax router
 * without renormalisation. */
typedef struct sl_route_cfg {
    sl_route_score score;
    int32_t renormalize;
    int32_t n_group, topk_group; /* SIGMOID's group-limited choice; n_group 0 or 1: none */
    float scale;                 /* the weights' last factor; 0 means 1 */
} sl_route_cfg;

/* Whether cfg suits E experts and k picks: NULL, or what is wrong (for a config error). */
const char *sl_route_cfg_check(const sl_route_cfg *cfg, int32_t E, int32_t k);

/* One moe_route call: T tokens x, all buffers in backend memory. */
typedef struct sl_route_args {
    int32_t *ids;                  /* [T, k] picks, rank order */
    float *w;                      /* [T, k] their weights */
    float *logits;                 /* [T, E] then the scores the picks come from (below) */
    const float *x;                /* [T, H] */
    const sl_tensor *router;       /* [E, H] */
    const sl_tensor *bias;         /* [E] the router's linear bias, or NULL */
    const sl_tensor *select_bias;  /* [E] SIGMOID's selection bias, or NULL */
    const sl_tensor *expert_scale; /* [E] per-expert weight factor, or NULL */
    int32_t T, k;
    sl_route_cfg cfg;
} sl_route_args;

/* Where one expert's weights are in backend memory, a row of moe_experts' table: data,
 * scales and biases (the last two NULL unless quantised) of gate, up and down, in that order. */
typedef struct sl_expert_ptrs {
    const void *p[9];
} sl_expert_ptrs;

#define SL_PEEK_BYTES 4096 /* the most to_host_begin copies */

/* The largest work a session gives the ops, for a backend that sizes its scratch up front
 * (reserve). */
typedef struct sl_reserve_args {
    int32_t max_batch;         /* most tokens of one call (T) */
    int32_t max_ctx;           /* most positions (pos0 + T) */
    int32_t n_heads, head_dim; /* attention's, the largest of any layer */
    /* Most elements of x one product, or one batch of them, reads ([rows, K]: a prefill
     * chunk's routed experts take max_batch x experts-per-token rows of the hidden size);
     * 0: unknown (a backend that stages x then works in slices). */
    int64_t max_x;
} sl_reserve_args;

typedef struct sl_ops {
    const char *name;
    /* Backend memory, zero-filled; NULL when out of memory. */
    void *(*alloc)(const sl_backend *be, size_t bytes);
    void (*release)(const sl_backend *be, void *p);
    /* Optional (may be NULL): makes a host buffer fast to copy to backend memory (page-locked
     * for DMA); undone by unpin before the buffer is freed. */
    void (*pin)(const sl_backend *be, void *host, size_t bytes);
    void (*unpin)(const sl_backend *be, void *host);
    /* Synchronous copies between host and backend memory: when they return, the
     * bytes are there (to_host waits for all work queued before it). */
    void (*to_host)(const sl_backend *be, void *host, const void *src, size_t bytes);
    void (*to_dev)(const sl_backend *be, void *dst, const void *host, size_t bytes);
    /* Optional (both or neither): to_host in two halves, so the ops queued between them run
     * while the host waits for the copy alone. to_host_begin copies bytes (at most
     * SL_PEEK_BYTES) from src once every op queued before it is done; to_host_end waits for
     * that copy and lands the bytes in host. One pair at a time; nothing between may wait for
     * the device. */
    void (*to_host_begin)(const sl_backend *be, void *host, const void *src, size_t bytes);
    void (*to_host_end)(const sl_backend *be);
    /* Queues a copy from host memory that stays unchanged until the next sync or to_host
     * (expert blobs), on a copy queue of the backend's own where it has one (CUDA: a second
     * stream): it starts after every op queued before it, and ops queued after it see its bytes
     * once copy_join has been called (or a sync). sync waits for everything queued. */
    void (*to_dev_async)(const sl_backend *be, void *dst, const void *host, size_t bytes);
    /* Optional (NULL where to_dev_async is in queue order): ops queued from now on run after
     * every to_dev_async queued so far. */
    void (*copy_join)(const sl_backend *be);
    void (*sync)(const sl_backend *be);
    /* Optional: makes room for every op of a session of this shape, so that no op allocates
     * (CUDA: its device scratch); called at session creation, never in a forward pass. The
     * backend keeps the largest it was asked for; an op asking for more fails (status). */
    sl_status (*reserve)(const sl_backend *be, const sl_reserve_args *r, sl_error *err);
    /* Optional: runs the ops queued between graph_begin and graph_end (one decode step) as one
     * graph (CUDA graphs: a launch per step instead of per kernel). A step that asks for the
     * same launches as the last recording replays it as it is; one that differs is recorded,
     * updating the graph in place when only arguments changed. The ops in between must not
     * wait for the device (to_host, sync), nor copy from pageable memory. graph_end(launch = 0)
     * drops the step. It returns 2 when the step's work is queued as a replay, 1 as a new
     * recording, 0 op by op (the backend keeps off graphs), -1 when nothing ran (the step broke
     * one of those rules, or was dropped): the caller then runs the step again without one. */
    void (*graph_begin)(const sl_backend *be);
    int (*graph_end)(const sl_backend *be, int launch);
    /* Optional: the first failure of any op since the last call (ops return nothing), or
     * SL_OK. A backend that can fail mid-computation (CUDA) reports here. */
    sl_status (*status)(const sl_backend *be, sl_error *err);
    /* dst[r * dst_ld + c] = src[r * src_ld + c], r < rows, c < cols. */
    void (*copy2d)(const sl_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                   int32_t rows, int32_t cols);
    /* Row i of n: dst[dst_idx[i]] = src[src_idx[i]] (rows of cols floats); a NULL index
     * list means i. Index lists are in backend memory. */
    void (*copy_rows)(const sl_backend *be, float *dst, const int32_t *dst_idx, const float *src,
                      const int32_t *src_idx, int32_t n, int32_t cols);
    void (*fill)(const sl_backend *be, float *dst, float v, size_t n);
    void (*matmul)(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
    /* n independent matmuls (the experts of one MoE layer, or q, k and v): y[i] = x[i] . w[i]^T
     * with T[i] rows each; the w[i] share K (their rows and dtypes may differ: what a backend
     * cannot run as one batch it runs one by one). Pointer arrays and T are host memory, what
     * they point at backend memory. Each y[i] is exactly what matmul gives. */
    void (*matmul_batch)(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n);
    /* Copies rows ids[t] of a [V, n] table into y[t]. ids (backend memory) are already
     * validated. */
    void (*embed)(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T);
    /* y = x * rsqrt(mean(x^2) + eps) * (w_offset + w), per row of n; y may alias x. */
    void (*rmsnorm)(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                    int32_t rows, int32_t n, float eps, float w_offset);
    /* x += d, then y = rmsnorm(x) (as rmsnorm): a sublayer's residual add and the next
     * sublayer's norm in one pass; what axpy and rmsnorm give. */
    void (*add_rmsnorm)(const sl_backend *be, float *y, float *x, const float *d,
                        const sl_tensor *w, int32_t rows, int32_t n, float eps, float w_offset);
    /* Optional. add_rmsnorm out of place: x_out = x + d (x_out aliases neither x nor d), then
     * y = rmsnorm(x_out). The backend may leave it to the next op it is given when that op's
     * input is y (a decode token's GEMVs: each block then normalises while reading its input,
     * instead of a launch of its own); by the end of that op both outputs are there. */
    void (*add_rmsnorm_next)(const sl_backend *be, float *y, float *x_out, const float *x,
                             const float *d, const sl_tensor *w, int32_t rows, int32_t n, float eps,
                             float w_offset);
    /* sl_qkv_args in one pass; what rmsnorm, rope and copy2d in that order give. */
    void (*qkv_prep)(const sl_backend *be, const sl_qkv_args *a);
    /* NeoX RoPE on the first rot_dim dims of each head; row t is at position pos0 + t.
     * cos/sin tables are [positions, rot_dim / 2]. */
    void (*rope)(const sl_backend *be, float *x, int32_t T, int32_t n_heads, int32_t head_dim,
                 int32_t rot_dim, int32_t pos0, const float *cos_tab, const float *sin_tab);
    void (*attention)(const sl_backend *be, const sl_attn_args *a);
    /* sl_latent_attn_args: the prep, then the attention (MLA). */
    void (*latent_attention)(const sl_backend *be, const sl_latent_attn_args *a);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(const sl_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* out[i] = act(gate[i]) * up[i]: a gated MLP's hidden row with another activation than
     * SiLU (GELU-tanh); SL_ACT_SILU gives swiglu's bits. out may alias gate or up. */
    void (*act_mul)(const sl_backend *be, float *out, const float *gate, const float *up, size_t n,
                    sl_act act);
    /* The clamped SwiGLU (SL_GLU_SWIGLU_CLAMPED), in this order as transformers' gpt-oss:
     *   g = min(gate[i], limit), u = clamp(up[i], -limit, limit)
     *   out[i] = (u + 1) * (g * sigmoid(g * alpha))
     * out may alias gate. */
    void (*swiglu_clamped)(const sl_backend *be, float *out, const float *gate, const float *up,
                           size_t n, float alpha, float limit);
    /* y[r][i] += b[i], r < rows, i < n = b's length: a linear layer's bias (F32/F16/BF16, backend
     * memory) added to rows of products already made (what matmul's bias adds). */
    void (*add_bias)(const sl_backend *be, float *y, const sl_tensor *b, int32_t rows);
    /* y[i] += s * x[i] */
    void (*axpy)(const sl_backend *be, float *y, float s, const float *x, size_t n);
    /* MoE combine, per token t < T: y[t] = sum over r < k (in order) of w[t*k + r] *
     * x[rows[t*k + r]] (rows NULL: x[t*k + r]); w and rows in backend memory, rows of n. The
     * row list lets a prompt's experts leave their results where they made them (grouped by
     * expert) instead of copying them to (token, rank) order first. */
    void (*weighted_sum)(const sl_backend *be, float *y, const float *x, const int32_t *rows,
                         const float *w, int32_t T, int32_t k, int32_t n);
    /* x[i] = min(max(x[i], lo), hi), in place. */
    void (*clamp)(const sl_backend *be, float *x, size_t n, float lo, float hi);
    /* y[i] = s[i] * x[i / rep], rows of n, i < rows (one multiply an element): each row of x
     * repeated rep times, each copy scaled by its own factor (s in backend memory). */
    void (*scale_rows)(const sl_backend *be, float *y, const float *x, const float *s, int32_t rows,
                       int32_t rep, int32_t n);
    /* The router of T tokens (sl_route_args): logits = x . router^T + bias (what matmul
     * gives), then per row what sl_route_topk does; logits then hold the probabilities
     * (SOFTMAX), the sigmoid scores without select_bias (SIGMOID) or the logits (TOPK_*). */
    void (*moe_route)(const sl_backend *be, const sl_route_args *a);
    /* Optional (NULL, or returns 0 for weights it has no kernel for; blocks then go through
     * matmul_batch): the routed experts of T tokens with no host step. For each (token t,
     * rank r) row i = t k + r, with e = ids[i] and e's weights at table[e] (both in backend
     * memory; shapes and dtypes those of proto gate, up, down):
     *   act[i] = silu(gate_e x[t]) * up_e x[t]  [T k, I]
     *   y[t] = sum over r < k (in order) of w[i] * down_e act[i]  [T, H]
     * exactly what matmul_batch (T = 1 items), swiglu, matmul_batch and weighted_sum give.
     * A token one of whose picks has a NULL row (gate data) in table is skipped: its y row is
     * left as it is, its act rows are undefined (an expert cache runs the op before its misses
     * are in, and again after). T == 0 asks only whether it runs these weights (the pointers may be
     * NULL). */
    int (*moe_experts)(const sl_backend *be, float *y, float *act, const float *x,
                       const int32_t *ids, const float *w, const sl_expert_ptrs *table,
                       const sl_tensor *const proto[3], int32_t T, int32_t k);
    /* y[i] *= sigmoid(gate[i]) */
    void (*sigmoid_mul)(const sl_backend *be, float *y, const float *gate, size_t n);
    /* x = x * rsqrt(sum(x^2) + eps), per row of n, in place. */
    void (*l2norm)(const sl_backend *be, float *x, int32_t rows, int32_t n, float eps);
    /* Causal depthwise conv1d (no bias) with dilation d, then SiLU, token by token over T
     * rows of C channels:
     *   y[t][c] = silu(sum_j w[c, 0, j] * in[t - (K-1-j) d][c]), j = 0 .. K-1,
     * where in[<0] comes from state [C, (K-1) d] (the previous inputs, oldest first),
     * which is updated to the last (K-1) d inputs. w is [C, 1, K]. */
    void (*conv1d_silu)(const sl_backend *be, float *y, const float *x, int32_t T, int32_t C,
                        const sl_tensor *w, int32_t K, int32_t d, float *state);
    void (*delta_rule)(const sl_backend *be, const sl_delta_args *a);
    /* y = w * (x * rsqrt(mean(x^2) + eps)) * gate(z), per row of n; w is [n], plain weight;
     * gate is SiLU or sigmoid. */
    void (*gated_rmsnorm)(const sl_backend *be, float *y, const float *x, const float *z,
                          const sl_tensor *w, int32_t rows, int32_t n, float eps, sl_act gate);
    /* y[i] = mul * act(x[i] / div); y may alias x. */
    void (*activate)(const sl_backend *be, float *y, const float *x, size_t n, float div, float mul,
                     sl_act act);
    /* Hyper-connection injection: w[t][c][i] += inj[t][c] * out[t][i], c < hc, i < n. */
    void (*hc_inject)(const sl_backend *be, float *w, const float *out, const float *inj, int32_t T,
                      int32_t hc, int32_t n);
    /* Hyper-connection mix: y[t][i] = mean over c < hc of w[t][c][i] * x[t][c][i]. */
    void (*hc_mix)(const sl_backend *be, float *y, const float *w, const float *x, int32_t T,
                   int32_t hc, int32_t n);
    /* PLE gate, per token t and stream c: g = key[t][c] . query[t][c] / sqrt(n),
     * g = sign(g) sqrt(max(|g|, 1e-6)), y[t][c] = sigmoid(g) * value[t]. */
    void (*ple_gate)(const sl_backend *be, float *y, const float *key, const float *query,
                     const float *value, int32_t T, int32_t hc, int32_t n);
    /* QSA block scores of one query: scores[b] = sum over heads h of relu(q[h] . keys[b])
     * / sqrt(d); q is [n_heads, d], keys [n_blocks, d]. */
    void (*qsa_scores)(const sl_backend *be, float *scores, const float *q, const float *keys,
                       int32_t n_heads, int32_t n_blocks, int32_t d);
    /* Optional: bytes from src, in the memory of src_be (another backend of this kind: another
     * GPU of the host), to dst in this backend's, after the work queued on src_be and before
     * the work queued here from now on (CUDA: an event on src_be's stream, waited for on this
     * one, and cudaMemcpyPeerAsync; or NCCL send/recv). NULL: sl_backend_transfer goes through
     * host memory. */
    void (*copy_peer)(const sl_backend *be, void *dst, const sl_backend *src_be, const void *src,
                      size_t bytes);
} sl_ops;

struct sl_backend {
    const sl_ops *ops;
    int32_t n_threads;
    sl_isa isa;
    int32_t device;         /* backend memory is not host memory (CUDA) */
    int32_t int4_float_act; /* CPU: int4 and int8 matmuls on float activations (quant.h FLOAT) */
    void *ctx;              /* backend state (CUDA: streams, handles, scratch) */
};

/* The CPU backend; isa is clamped to what the processor supports. */
void sl_backend_cpu_init(sl_backend *be, int32_t n_threads, sl_isa isa);
/* The CUDA backend (built with make CUDA=1), on GPU `gpu`, with settings p (NULL: the defaults);
 * fails with a message when sluice was built without CUDA or no GPU is usable. */
sl_status sl_backend_cuda_init(sl_backend *be, int32_t gpu, const sl_cuda_params *p, sl_error *err);
void sl_backend_cuda_free(sl_backend *be);
/* GPU gpu's free and total memory in bytes (cudaMemGetInfo); fails as sl_backend_cuda_init does
 * where there is no such GPU. */
sl_status sl_backend_cuda_mem(int32_t gpu, int64_t *free_bytes, int64_t *total_bytes,
                              sl_error *err);
/* The one way bytes cross between two backends' memories: a split model's residual rows at a
 * partition boundary (model/model.h, sl_model_part). Host memory on either side (the CPU
 * backend) is read or written by the other side's to_host / to_dev; two device backends use
 * the receiver's copy_peer, or else go through host memory at stage, stage_bytes at a time. */
void sl_backend_transfer(const sl_backend *to, void *dst, const sl_backend *from, const void *src,
                         size_t bytes, void *stage, size_t stage_bytes);
/* Whether this build has the CUDA backend and a GPU is present. */
int sl_backend_cuda_available(void);
/* The best ISA this processor runs. */
sl_isa sl_cpu_best_isa(void);
const char *sl_isa_name(sl_isa isa);

/* Row-wise matmul kernels, also used directly by tests (cpu_matmul.c). */
void sl_matmul_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
void sl_matmul_batch_cpu(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n);
/* The CPU backend's latent_attention (cpu_mla.c). */
void sl_latent_attention_cpu(const sl_backend *be, const sl_latent_attn_args *a);
/* One RoPE rotation of rot / 2 pairs of v by the cos/sin rows c, s: pairs (i, i + rot / 2), or
 * (2i, 2i + 1) when interleaved (cpu_ops.c; the rope, qkv_prep and latent attention ops). */
void sl_rope_pairs(float *v, int32_t rot, int interleaved, const float *c, const float *s);
/* One element in float32 with the reference order, for tests. */
float sl_dot_ref(const sl_tensor *w, int64_t row, const float *x);
/* Widens n elements of a F32/F16/BF16 array starting at element i0. */
void sl_to_f32(float *dst, const void *src, sl_dtype dtype, size_t i0, size_t n);
/* Index of the first element of host array x[0..n) that is Inf or NaN, n when all are finite:
 * the check sl_session_forward makes of every row of logits it returns (one pass, SIMD up to
 * isa; the same answer on every ISA). */
size_t sl_first_nonfinite(sl_isa isa, const float *x, size_t n);

#endif /* SL_OPS_H */
