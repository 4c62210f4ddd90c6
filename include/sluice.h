/*
 * sluice: an inference engine for Mixture-of-Experts language models.
 *
 * Public library API. Everything here returns an sl_status (0 on success);
 * on failure the caller's sl_error holds one line saying what went wrong,
 * naming the file and tensor involved. The library never exits or prints.
 *
 * Lifetime: a model (weights, mapped read-only) can serve several sessions;
 * a session owns the KV cache and every activation buffer, all allocated at
 * sl_session_create, so sl_session_forward never allocates.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SL_VERSION "0.1.0"

typedef enum sl_status {
    SL_OK = 0,
    SL_ERR_IO = -1,          /* open/read/mmap failed */
    SL_ERR_FORMAT = -2,      /* malformed file: bad header, offsets, dtype */
    SL_ERR_UNSUPPORTED = -3, /* valid file, but an architecture or option we do not run */
    SL_ERR_SHAPE = -4,       /* a tensor is missing or has the wrong shape */
    SL_ERR_ARG = -5,         /* bad argument from the caller */
    SL_ERR_NOMEM = -6,
    SL_ERR_NUMERIC = -7, /* the model computed Inf or NaN (corrupt weights or config): no output */
    SL_ERR_TIMEOUT = -8, /* a read did not finish within the I/O timeout (the disk may recover:
                          * a server answers 503) */
} sl_status;

/* One error message, filled by the first failing call. */
typedef struct sl_error {
    sl_status code;
    char msg[768];
} sl_error;

typedef struct sl_model sl_model;
typedef struct sl_session sl_session;

/* Progress of long work (loading, packing, verifying): done of total units. */
typedef void (*sl_progress_fn)(void *user, const char *stage, int64_t done, int64_t total);

/* Where routed experts live while the model runs (packed models only; a Hugging
 * Face directory is always read through its memory mapping). */
typedef enum sl_experts_mode {
    SL_EXPERTS_MAPPED = 0,   /* mmap the expert files, the page cache decides */
    SL_EXPERTS_RESIDENT = 1, /* read every expert into memory at load */
    SL_EXPERTS_STREAM = 2,   /* per-layer cache of expert slots filled by reads */
} sl_experts_mode;

/* Which cached expert a miss evicts (empty slots first; never one the request in flight uses).
 * The default, DECAY, came out best on the routing of trained models (tests/fixtures/trace:
 * 9-23 points of hits above LFU, 0-9 above LRU at 10-50% of the experts cached). */
typedef enum sl_cache_policy {
    /* the fewest uses over the expert's whole history (cached or not), each use worth half as
     * much every 32 requests (SL_SLOT_HALFLIFE): frequency that follows drifting routing */
    SL_CACHE_DECAY = 0,
    SL_CACHE_LFU = 1, /* fewest uses since it came in, ties to the oldest use */
    SL_CACHE_LRU = 2,
} sl_cache_policy;

typedef enum sl_backend_kind {
    SL_BACKEND_AUTO = 0, /* CUDA when built in and a GPU is present, else CPU */
    SL_BACKEND_CPU = 1,
    SL_BACKEND_CUDA = 2,
    /* The CPU backend run the way a GPU backend is: weights copied into memory of its own,
     * routed experts through the device expert cache (gpu_experts slots) and its fused
     * kernels. For tests of that path on machines without a GPU; same results as CPU. */
    SL_BACKEND_CPU_DEVICE = 3,
} sl_backend_kind;

/* How stream mode reads experts. */
typedef enum sl_io_engine {
    SL_IO_AUTO = 0,    /* io_uring with direct_io when built with liburing, else threads */
    SL_IO_THREADS = 1, /* reader threads in pread */
    SL_IO_URING = 2,   /* one io_uring, every read of a step in flight at once */
} sl_io_engine;

/* CUDA backend settings; all zero gives the defaults. Results are bitwise the same either way
 * for no_pdl; int4_float_act changes int4 products within the activations' int8 rounding. */
typedef struct sl_cuda_params {
    /* launch kernels in plain stream order, without programmatic dependent launch (each kernel
     * then starts only when the previous one has ended: 355 against 451 tok/s on an H200) */
    int32_t no_pdl;
    /* int4 GEMVs on float activations, the scalar CPU's formula, instead of activations
     * quantised to int8 (quant.h's formula, the CPU's with AVX-512 VNNI: 373 against 314 tok/s) */
    int32_t int4_float_act;
    /* prefill products (more than 4 tokens) and prompt attention on the CUDA cores in float32
     * instead of the tensor cores (BF16 with x split in three parts, TF32 in three MMAs:
     * float32 products, summed in another order) */
    int32_t no_tensor_cores;
} sl_cuda_params;

typedef struct sl_model_params {
    int32_t n_threads; /* compute threads; 0 = all online cores */
    sl_backend_kind backend;
    int32_t gpu_experts; /* CUDA: expert slots per MoE layer in GPU memory (0 = all experts) */
    sl_experts_mode experts;
    int32_t cache_experts; /* stream: slots per MoE layer (0 = from cache_mem) */
    int64_t cache_mem;     /* stream: byte budget for all layers' slots */
    sl_cache_policy cache_policy;
    int32_t direct_io;  /* stream: read with O_DIRECT, bypassing the page cache */
    int32_t io_threads; /* stream: parallel readers (0 = 8) */
    /* stream, decode: each token's this many likeliest picks of the next MoE layer, predicted by
     * that layer's router from this layer's input, start reading while this layer computes
     * (pre-gating; 0: none). Never changes results. */
    int32_t prefetch;
    int32_t graphs; /* CUDA: record each decode step as one CUDA graph (measured slower on an
                     * H200, where the GPU, not the launches, bounds decode) */
    sl_cuda_params cuda;
    sl_progress_fn progress; /* optional */
    void *progress_user;
    /* stream: reads (experts, n-gram rows) not done after this long fail the forward, naming
     * the file (0 = 30000 ms; < 0 = wait forever). A read stuck in the kernel is abandoned,
     * never waited for, even by sl_model_free. */
    int32_t io_timeout_ms;
    /* int4 products on float activations on every backend (CPU: SL_QPATH_FLOAT, for int8 packs
     * too; CUDA: as cuda.int4_float_act), the exact product of the dequantised weights: for
     * parity tests */
    int32_t int4_float_act;
    /* Writes every MoE layer's picks of every token to this file as a routing trace (the format
     * of src/moe/trace.h: one step per forward chunk; sluice trace-replay reads it), or NULL */
    const char *router_trace;
    /* Benchmarks: every MoE layer's picks from this routing trace instead of its router (a trace
     * of as many experts and picks a token; the output is not the model's), or NULL */
    const char *route_replay;
    /* Keeps this run's expert requests in memory too, for sl_model_cache_oracle */
    int32_t keep_routes;
    sl_io_engine io_engine; /* stream: see sl_io_engine */
    /* stream: the MoE step waits for all of a group's reads before computing any expert,
     * instead of computing the cached ones while the misses read (for measurements) */
    int32_t no_overlap;
    /* stream: cache_mem from the memory available (cache_experts and cache_mem unset): what
     * /proc/meminfo says is available, less the resident weights, a KV cache estimate and a
     * reserve for the page cache; sl_model_info.cache_auto says what it came to */
    int32_t cache_mem_auto;
    /* The pipeline split (issue 31): the layers in this many contiguous partitions balanced by
     * memory, each on a backend of its own, the residual rows crossing each boundary once
     * (0 or 1: none). On the CPU backend, CPU backends of their own (logical partitions, for
     * tests); on CUDA, backends of their own on the model's GPU, or one GPU each (part_gpus).
     * Results are the unsplit model's bits. */
    int32_t n_parts;
    /* With n_parts: the memory of each partition in bytes, which the plan must fit (an error
     * says where it does not); 0: no limit, or with part_gpus each GPU's free memory */
    int64_t part_mem;
    /* CUDA: partition q on GPU q (the GPUs of one host, --gpus N), each budget at most that
     * GPU's free memory less a reserve for the sessions; 0: every partition on GPU 0 */
    int32_t part_gpus;
} sl_model_params;

/* Counters since load (or the last sl_model_reset_stats). Times in seconds. */
typedef struct sl_stats {
    int64_t prompt_tokens, gen_tokens;
    double prefill_time, decode_time;
    int64_t expert_requests, expert_hits; /* one request per (layer, expert, chunk) */
    /* Decode picks (layer, rank) after a first step, and those the previous decode step had
     * also picked at that layer (what a prefetch of the last step's experts would find) */
    int64_t decode_picks, decode_repeats;
    int64_t bytes_read;         /* expert bytes read from disk (stream/resident) */
    int64_t prefill_bytes_read; /* the part read during prefill */
    double read_time;           /* waiting for expert reads */
    double t_attention, t_router, t_expert_io, t_expert_compute, t_other;
    int64_t ple_rows, ple_bytes; /* Qwen4-Exp: n-gram embedding rows read per token (PLE) */
    double t_ple_io;             /* time reading them */
    /* GPU expert cache (CUDA backend): requests, hits, bytes copied from host memory */
    int64_t gpu_expert_requests, gpu_expert_hits, gpu_bytes_copied;
    double gpu_copy_time;
    /* Decode through a GPU cache smaller than the experts: MoE layer steps whose fused experts
     * ran ahead of the host and stood (every pick cached), and those that ran again */
    int64_t gpu_steps_ahead, gpu_steps_rerun;
    /* CUDA graphs: decode steps run as one graph, those of them replayed as recorded (nothing
     * recorded or updated: the step asked for the same launches as the last recording), and
     * steps dropped (the step then ran kernel by kernel) */
    int64_t graph_steps, graph_replays, graph_fallbacks;
    /* Pre-gating (sl_model_params.prefetch): experts predicted for a layer's decode step, those
     * of them it picked, and the distinct experts those steps picked (recall: hits / needed,
     * precision: hits / experts) */
    int64_t pred_experts, pred_hits, pred_needed;
    /* stream: experts read ahead by sl_experts_prefetch, those a fetch then needed, and their
     * bytes (all read, and the used ones'): prefetch_bytes - prefetch_used_bytes is waste */
    int64_t prefetch_reads, prefetch_used, prefetch_bytes, prefetch_used_bytes;
    /* A split model (n_parts > 1): buffers moved from one partition to the next, and their
     * bytes (each token's residual rows and what its family adds, at every boundary) */
    int64_t part_moves, part_bytes;
} sl_stats;

typedef struct sl_session_params {
    int32_t max_ctx;   /* KV cache length in tokens; 0 = min(model max, 4096) */
    int32_t max_batch; /* most tokens per forward call; 0 = 512 */
} sl_session_params;

/* Basic facts about a loaded model, for the CLI and callers. */
typedef struct sl_model_info {
    const char *arch; /* config.json model_type, e.g. "qwen3_moe" */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layers;
    int32_t n_moe_layers;
    int32_t n_experts;
    int32_t n_experts_used;
    int32_t max_position;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t moe_intermediate_size;
    int32_t shared_expert;      /* has a shared expert */
    int32_t packed;             /* a sluice pack */
    const char *source;         /* "Hugging Face checkpoint", "sluice pack" or "GGUF" */
    const char *weights;        /* storage of the routed experts: "int8", "int4", "BF16", ... */
    const char *types;          /* per group of weights, each storage type and its bits per
                                 * weight: "experts Q4_K 4.50 bpw (67%), Q6_K 6.56 bpw (33%);
                                 * attention ..." */
    int64_t resident_bytes;     /* every tensor except routed experts */
    int64_t expert_bytes;       /* one routed expert (gate, up, down, scales) */
    const char *experts_mode;   /* "mapped", "resident" or "stream" */
    int32_t cache_slots;        /* stream: slots per MoE layer */
    int32_t n_ple_layers;       /* Qwen4-Exp: layers with a PLE n-gram table */
    int64_t ple_table_bytes;    /* their tables, all together (kept on disk) */
    int32_t ple_rows_per_token; /* rows one token reads per PLE layer */
    const char *attention;      /* the family's attention layout in words, or NULL (Llama-4:
                                 * "chunked (8192) RoPE on 36 layers, full NoPE on 12, ...") */
    const char *backend;        /* "cpu" or "cuda" */
    int32_t gpu_expert_slots;   /* CUDA: expert slots per MoE layer in GPU memory */
    int32_t graphs;             /* CUDA: decode steps run as CUDA graphs */
    int32_t pack_version;       /* packed: the format version (1: no checksums, nothing read is
                                 * verified; 'sluice verify --upgrade' adds them) */
    const char *router;         /* how the router picks and weighs: "softmax, top-2 renormalised",
                                 * "sigmoid + correction bias, 2 of 8 groups, x2.5", ... ("-": no
                                 * experts) */
    const char *features;       /* what the family computes beyond the plain decoder, in words
                                 * (attention sinks, sliding windows, RoPE scaling, ...), or
                                 * NULL */
    const char *io_engine;      /* stream: "threads", "io_uring (registered buffers)", ... */
    /* stream with cache_mem_auto: what it came to (bytes; all 0 otherwise): the memory
     * available, the budget given to the slots, and that budget's share of all the experts */
    int64_t cache_auto_avail, cache_auto_bytes;
    double cache_auto_share;
    int32_t n_parts;   /* partitions of the pipeline split (sl_model_params.n_parts; 1: none) */
    const char *split; /* n_parts > 1: "layers 0-1 (1.2 MB) | layers 2-3 (1.1 MB)", or NULL */
} sl_model_info;

/* What a MODEL path can be. */
typedef enum sl_model_kind {
    SL_MODEL_HF = 0,   /* a Hugging Face checkpoint directory (config.json, *.safetensors) */
    SL_MODEL_PACK = 1, /* a directory made by 'sluice pack' (manifest.json, core.bin) */
    SL_MODEL_GGUF = 2, /* a GGUF file, or the first of a split set (-00001-of-0000N.gguf) */
} sl_model_kind;

/* Says whether path is a model sluice reads, and which kind (*kind, an sl_model_kind).
 * Anything else (no such path, another file, a directory of GGUF files, a pack without
 * core.bin) is an error of one line naming path and saying what to give instead.
 * sl_model_load starts with it. */
sl_status sl_model_check_dir(const char *path, int32_t *kind, sl_error *err);
/* The model's positions (max_position_embeddings) and vocabulary size from its config alone,
 * without reading a weight: a caller can refuse a prompt that cannot run before a load. */
sl_status sl_model_peek(const char *dir, int32_t *max_position, int32_t *vocab_size, sl_error *err);
/* Loads a Hugging Face checkpoint directory (config.json + safetensors), a sluice pack or a
 * GGUF file. */
sl_status sl_model_load(const char *dir, const sl_model_params *params, sl_model **out,
                        sl_error *err);
void sl_model_free(sl_model *model);
void sl_model_get_info(const sl_model *model, sl_model_info *info);

sl_status sl_session_create(sl_model *model, const sl_session_params *params, sl_session **out,
                            sl_error *err);
void sl_session_free(sl_session *session);
/* Forgets the KV cache: the next forward starts at position 0. */
void sl_session_reset(sl_session *session);
/* Number of positions already in the KV cache. */
int32_t sl_session_pos(const sl_session *session);
/* The KV cache's length in tokens. */
int32_t sl_session_max_ctx(const sl_session *session);
/* Drops every position from pos on (pos <= sl_session_pos): the next forward
 * continues from there, reusing the cache before it. Returns 0 on success, and
 * nonzero (changing nothing) when pos < sl_session_pos and the model has
 * linear-attention layers, whose recurrent state cannot go back: reset and
 * run the whole prompt again instead. */
int sl_session_rewind(sl_session *session, int32_t pos);

/*
 * Runs n_tokens ids through the model at the current position, appending to the
 * KV cache. logits (may be NULL) receives float32 rows of vocab_size: every
 * position's row when all_logits != 0 (n_tokens x vocab), else only the last.
 * n_tokens may exceed max_batch: the call then runs in chunks of max_batch.
 * Non-finite values are never returned as scores: a row of logits holding Inf or NaN (or, in a
 * chunk that returns none, the final hidden state of its last position) fails the call with
 * SL_ERR_NUMERIC, naming the position. On any error, sl_session_pos counts only the chunks
 * that completed; a model with linear-attention layers has advanced its recurrent state
 * through the failed chunk too, so reset such a session before using it again.
 */
sl_status sl_session_forward(sl_session *session, const int32_t *ids, int32_t n_tokens,
                             float *logits, int all_logits, sl_error *err);

/*
 * Batched decoding (continuous batching): one forward pass for the next token of each of n
 * sessions of one model. The rows share every weight read, the routed experts' included (one
 * read per expert for the union of the rows' picks), while each row's attention runs on its own
 * session's cache (or recurrent state) at its own position. Row i's logits are bitwise those
 * of sl_session_forward(sessions[i], &ids[i], 1, ...), whatever the other rows. Families
 * whose layers cannot take rows of different sequences together (Gemma 4, Qwen4-Exp) run the
 * rows one after the other: the same results, nothing shared (sl_batch_shares says which).
 */
typedef struct sl_batch sl_batch;
/* The activations of up to max_rows rows (memory like a session's chunk of max_rows tokens). */
sl_status sl_batch_create(sl_model *model, int32_t max_rows, sl_batch **out, sl_error *err);
void sl_batch_free(sl_batch *batch);
/* Whether the rows of a step share their weight reads (one forward pass), or run one by one. */
int sl_batch_shares(const sl_batch *batch);
/* ids[i] into sessions[i] (distinct sessions of the batch's model, each with room for one more
 * position); logits (may be NULL) receives n rows of vocab_size. On error no session's
 * position advances, as with sl_session_forward; a model with linear-attention layers has
 * advanced their recurrent state, so reset those sessions before using them again. */
sl_status sl_batch_decode(sl_batch *batch, sl_session *const *sessions, const int32_t *ids,
                          int32_t n, float *logits, sl_error *err);

void sl_model_get_stats(const sl_model *model, sl_stats *stats);
void sl_model_reset_stats(sl_model *model);
/* JSON {"layers": [{"layer": L, "counts": [..per expert..]}, ...]} of router selections. */
sl_status sl_model_write_router_hist(const sl_model *model, const char *path, sl_error *err);
/* Finishes the routing trace (params.router_trace): the first write error, if any, comes back
 * here (and from the forward pass that met it). Nothing to do without one. */
sl_status sl_model_trace_close(sl_model *model, sl_error *err);
/* The optimal (Belady, clairvoyant) expert-cache hits of the requests made since load, with the
 * store's slots per layer (stream mode and params.keep_routes): *requests and *hits over all
 * MoE layers, *slots per layer. SL_ERR_ARG when there is nothing to compute it from. */
sl_status sl_model_cache_oracle(const sl_model *model, int64_t *requests, int64_t *hits,
                                int32_t *slots, sl_error *err);

typedef enum sl_quant {
    SL_QUANT_BF16 = 0, /* no quantisation: BF16/F16 kept, F32 rounded to BF16 */
    SL_QUANT_INT8 = 1,
    SL_QUANT_INT4 = 2,
    SL_QUANT_KEEP = 3, /* every tensor keeps its type, its bytes copied (a GGUF's block types) */
    SL_QUANT_AUTO = 4, /* KEEP for a GGUF file, INT8 for a Hugging Face checkpoint */
} sl_quant;

typedef struct sl_pack_params {
    sl_quant quant;
    int32_t quant_router; /* quantise the router too (default: keep it BF16) */
    int32_t force;        /* write into a non-empty out_dir (never SRC, inside it, or around it) */
    sl_progress_fn progress;
    void *progress_user;
} sl_pack_params;

/* Converts a Hugging Face checkpoint or a GGUF file into a packed directory (docs/FORMAT.md),
 * tensor by tensor, so models larger than memory pack fine. out_dir is created, or
 * must be empty unless params->force; it may never be src_dir, lie inside it or hold it.
 * A GGUF whose weights are ggml block types packs only with SL_QUANT_KEEP (or AUTO): they are
 * never quantised twice. */
sl_status sl_pack(const char *src_dir, const char *out_dir, const sl_pack_params *params,
                  sl_error *err);
/* Checks every file a packed directory needs (derived from its config: core.bin, an experts
 * file per MoE layer, an n-gram table per PLE layer; then the others its manifest lists)
 * against the manifest's sizes and SHA-256, and, from format version 2, every header,
 * tensor, expert and row against its own CRC32C; the first problem is an error naming the
 * file (and layer and expert). A directory that is not a pack (a Hugging Face checkpoint, a
 * file) is an error saying so. */
sl_status sl_verify(const char *dir, sl_progress_fn progress, void *user, sl_error *err);
/* The format version of the pack in dir (its manifest's), or 0 when there is none. */
int32_t sl_pack_version(const char *dir);
/* Brings a pack of an older format version to the current one in place (version 1 -> 2: the
 * checksums added). The pack must pass sl_verify first, so that no corrupt byte gets a
 * checksum of its own; each file is written to NAME.tmp and renamed, the manifest last.
 * Nothing to do for a pack of the current version. */
sl_status sl_pack_upgrade(const char *dir, sl_progress_fn progress, void *user, sl_error *err);

/* Greedy argmax of one row of logits; ties go to the lower id. */
int32_t sl_argmax(const float *logits, int32_t n);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
