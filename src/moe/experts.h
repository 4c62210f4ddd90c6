/*
 * The expert store: where a layer's routed experts live and how the MoE
 * block gets at them. Each expert is three matrices in nn.Linear layout:
 *   gate [I, H], up [I, H], down [H, I]   (I = moe_intermediate_size)
 *
 * Sources and modes:
 *   Hugging Face directory  views into the safetensors mapping (per-expert or
 *                           fused tensors); always "mapped"
 *   packed, mapped          views into mmaps of the experts-LLL.bin files
 *   packed, resident        every blob read into memory at load
 *   packed, stream          per-layer cache of slots, one aligned read per miss
 *
 * The MoE block asks for all experts a layer needs at once
 * (sl_experts_fetch, at most sl_experts_capacity of them), so every miss of
 * the layer is read in parallel by the reader pool. Slots holding experts of
 * the request in flight are pinned: a miss never evicts them. Which slot an
 * expert lands in never affects results: callers sum in router-rank order.
 */
#ifndef SL_EXPERTS_H
#define SL_EXPERTS_H

#include <pthread.h>

#include "format/pack.h"
#include "model/checkpoint.h"

typedef struct sl_expert {
    sl_tensor gate; /* [I, H] */
    sl_tensor up;   /* [I, H] */
    sl_tensor down; /* [H, I] */
} sl_expert;

/* One MoE layer's experts. Dense layers have n_experts == 0. */
typedef struct sl_expert_layer {
    int32_t n_experts;
    char *path;            /* packed models: the experts file, for messages */
    sl_experts_header hdr; /* packed models */
    int fd;                /* stream: the experts file (-1 when closed) */
    void *map;             /* mapped: the whole file */
    size_t map_size;
    uint8_t *resident; /* resident: n_experts blobs */
    sl_expert *views;  /* [n_experts] (HF, mapped, resident) */
    int64_t *hist;     /* [n_experts] router selections */
    /* stream cache */
    int32_t n_slots;
    uint8_t *slot_mem;     /* n_slots x blob_bytes, page-aligned */
    sl_expert *slot_views; /* [n_slots] */
    int32_t *slot_expert;  /* [n_slots] expert in the slot, -1 when empty */
    int64_t *slot_uses;    /* [n_slots] requests since the expert was loaded */
    int64_t *slot_last;    /* [n_slots] tick of the last request */
    int64_t *slot_pin;     /* [n_slots] tick of the request that pinned it */
    int32_t *expert_slot;  /* [n_experts] slot holding the expert, -1 when none */
} sl_expert_layer;

/* One read of the pool. */
typedef struct sl_read_job {
    int fd;
    uint64_t offset, len;
    uint8_t *dst;
    int err; /* errno, or -1 for a short read */
} sl_read_job;

typedef struct sl_reader_pool {
    int32_t n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    sl_read_job *jobs;
    int32_t n_jobs, next, finished;
    uint64_t generation;
    int quit;
} sl_reader_pool;

typedef struct sl_expert_store {
    int32_t n_layers, n_experts;
    sl_experts_mode mode;
    sl_cache_policy policy;
    sl_expert_layer *layers; /* [n_layers] */
    sl_reader_pool pool;
    int pool_started;
    int64_t tick;
    sl_read_job *jobs;  /* [n_experts] scratch for one fetch */
    int32_t *miss_slot; /* [n_experts] */
    /* counters (read by sl_model_get_stats) */
    int64_t requests, hits, bytes_read;
    double read_time;
} sl_expert_store;

/* Binds experts of a Hugging Face checkpoint (views into its mapping). */
sl_status sl_experts_bind_hf(sl_expert_store *s, const sl_ckpt *ck, int32_t n_layers,
                             const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                             int64_t inter, sl_error *err);

typedef struct sl_store_params {
    sl_experts_mode mode;
    sl_cache_policy policy;
    int32_t cache_experts;
    int64_t cache_mem;
    int32_t direct_io;
    int32_t io_threads;
    int32_t min_slots; /* top-k: fewer slots cannot serve one token */
    sl_progress_fn progress;
    void *progress_user;
} sl_store_params;

/* Opens the experts-LLL.bin files of a packed directory in the given mode. */
sl_status sl_experts_open_packed(sl_expert_store *s, const char *dir, int32_t n_layers,
                                 const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                                 int64_t inter, const sl_store_params *p, sl_error *err);
void sl_experts_free(sl_expert_store *s);

/* Whether a fetch of expert e of this layer would hit (always, outside stream mode). */
int sl_experts_cached(const sl_expert_store *s, int32_t layer, int32_t e);

/* Most experts one fetch of this layer may ask for. */
int32_t sl_experts_capacity(const sl_expert_store *s, int32_t layer);

/*
 * Makes experts ids[0..n) (distinct, n <= capacity) of a layer available;
 * out[i] points at expert ids[i] and stays valid until the next fetch of the
 * same layer. Read errors and short reads are returned, never computed on.
 */
sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err);

/* Runs n reads (other files than experts too: PLE n-gram rows) with the store's reader pool,
 * in parallel in stream mode, one after another otherwise; waits for all. Errors land in
 * each job's err. */
void sl_experts_read(sl_expert_store *s, sl_read_job *jobs, int32_t n);

#endif /* SL_EXPERTS_H */
