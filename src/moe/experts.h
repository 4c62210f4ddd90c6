/*
 * The expert store: where a layer's routed experts live and how the MoE
 * step (moe.h) gets at them. Each expert is three matrices in nn.Linear layout:
 *   gate [I, H], up [I, H], down [H, I]   (I = moe_intermediate_size)
 *
 * Sources and modes:
 *   views                   tensor views the model bound by name in a checkpoint's
 *                           mapping (sl_experts_open_views); always "mapped"
 *   packed, mapped          views into mmaps of the experts-LLL.bin files
 *   packed, resident        every blob read into memory at load
 *   packed, stream          per-layer cache of slots, a miss read as one aligned range
 *                           (in parts of about 1 MiB, by several reader threads)
 *   files, resident/stream  the same over experts whose three matrices lie anywhere in files
 *                           the store opens itself (a GGUF's stacked ffn_*_exps, a
 *                           safetensors checkpoint): a miss is three reads (sl_experts_open_files)
 *
 * The MoE block asks for all experts a layer needs at once
 * (sl_experts_fetch, at most sl_experts_capacity of them), so every miss of
 * the layer is read in parallel by the reader pool. Which expert is in which
 * slot is decided by a slot cache (slot_cache.h): slots holding experts of the
 * request in flight are pinned, so a miss never evicts them. Which slot an
 * expert lands in never affects results: callers sum in router-rank order.
 */
#ifndef SL_EXPERTS_H
#define SL_EXPERTS_H

#include <pthread.h>

#include "core/crc32c.h"
#include "format/pack.h"
#include "format/tensor.h"
#include "moe/slot_cache.h"

typedef struct sl_expert {
    sl_tensor gate; /* [I, H] */
    sl_tensor up;   /* [I, H] */
    sl_tensor down; /* [H, I] */
    /* linear biases the projections add (gpt-oss): [I], [I], [H] of F32/F16/BF16, data NULL
     * when the experts have none (all of a layer's alike) */
    sl_tensor gate_bias, up_bias, down_bias;
} sl_expert;

struct sl_expert_relayout;

/* One MoE layer's experts. Dense layers have n_experts == 0. */
typedef struct sl_expert_layer {
    int32_t n_experts;
    char *path;            /* packed models: the experts file, for messages */
    sl_experts_header hdr; /* packed models */
    int fd;                /* stream: reads; mapped: fstat, to notice the file shrinking; else -1 */
    uint32_t align;        /* stream with O_DIRECT: what offsets, lengths and buffers align to */
    void *map;             /* mapped: the whole file */
    size_t map_size;
    uint8_t *resident; /* resident: n_experts blobs */
    sl_expert *views;  /* [n_experts] (HF, mapped, resident) */
    int64_t *hist;     /* [n_experts] router selections */
    uint32_t *crc;     /* [n_experts] each blob's CRC32C (pack format 2), or NULL: no checks */
    /* stream: a blob is read in n_parts parts of part_bytes (the last one shorter), by as many
     * reader threads, each summing its own part while it is in cache; shift[k] joins part k's
     * sum to those before it (core/crc32c.h) */
    int32_t n_parts;
    uint64_t part_bytes;
    sl_crc32c_shift *shift; /* [n_parts] (entry 0 unused) */
    uint8_t *verified; /* mapped: [n_experts] 1 once the blob matched its CRC (atomic access) */
    /* stream cache: which expert is in which slot (slots.n_slots == 0 outside stream mode) */
    sl_slot_cache slots;
    uint8_t *slot_mem;     /* n_slots x blob_bytes, page-aligned */
    sl_expert *slot_views; /* [n_slots] */
    /* files: where each piece of each expert is, [n_experts x SL_EX_PARTS]; each blob (a slot,
     * a resident expert) holds piece p at piece_off[p], piece_len[p] bytes (0: absent), matrix m
     * typed as proto[m]; hdr.blob_bytes is the blob's size. A piece is read in n_parts parts. */
    struct sl_expert_extent *ext;
    sl_tensor proto[3], bias_proto[3];
    /* files whose experts lie in another layout (sl_expert_relayout): its copy, and the raw
     * pieces' extents [n_experts x n_raw]; NULL: the pieces lie as the blob holds them */
    struct sl_expert_relayout *relayout;
    struct sl_expert_extent *raw_ext;
    uint64_t raw_off[8]; /* piece i of the raw image (the staging buffer) at raw_off[i] */
    uint64_t raw_bytes;  /* a raw image, 64-byte aligned */
    uint64_t piece_off[SL_EX_PARTS], piece_len[SL_EX_PARTS];
    int32_t n_pieces, piece[SL_EX_PARTS]; /* the pieces present (non-empty), in order */
    /* stream (not relayout): each slot's reads, per of them a blob ([n_slots x per]), and their
     * state (struct sl_slot_io, experts.c); the last fetch_start's items: their slots, experts,
     * state (0 in flight, 1 ready, 2 failed) and, failed, what failed */
    int32_t per;
    struct sl_read_job *slot_jobs;
    struct sl_slot_io *sio;
    int32_t req_n;
    int32_t *req_slot, *req_key;
    int8_t *req_state;
    struct sl_read_job *req_bad;
} sl_expert_layer;

/* What a read came to, besides 0 (done) and an errno. */
enum {
    SL_READ_SHORT = -1,   /* end of file before len bytes: truncated */
    SL_READ_CRC = -2,     /* read, but the bytes do not match their checksum */
    SL_READ_TIMEOUT = -3, /* not done within the I/O timeout (abandoned: its result is dropped) */
    SL_READ_STALLED = -4, /* not started: a read abandoned earlier has not come back yet */
    SL_READ_PENDING = -5, /* (in flight) */
};

/* One read of the pool. */
typedef struct sl_read_job {
    int fd;
    uint64_t offset, len;
    uint8_t *dst;
    uint32_t align;   /* O_DIRECT: offsets, lengths and dst must be multiples of this (0: none) */
    uint8_t sum;      /* compute the CRC32C of the bytes read into crc, on the reader thread right
                       * after its read (the bytes still in its cache); the caller compares */
    uint8_t bounce;   /* dst is the caller's (a session's), not the store's: read into the pool's
                       * buffer and copy out only while the caller still waits, so that a read
                       * outliving its timeout never writes there */
    uint32_t crc;     /* out, with sum */
    const char *path; /* the file, for messages */
    int err;          /* 0, an errno, or an SL_READ_ code */
    /* asynchronous reads (a slot's, sl_experts_fetch_start / sl_experts_prefetch): the slot's
     * count of reads out, decremented when this one is back; the rest is the engine's, under
     * its lock: cancel (given up before it started), abandoned (given up while running) */
    int32_t *pending;
    uint8_t cancel, abandoned, running;
    uint64_t done; /* io_uring: bytes already read (a short read goes on from there) */
} sl_read_job;

/* The reader threads (experts.c). Heap-allocated: when a read hangs in the kernel past its
 * timeout, freeing the store leaves the pool to its threads, the last of which frees it. */
typedef struct sl_reader_pool sl_reader_pool;

/* Blobs are read in parts of about SL_READ_PART bytes, at most SL_READ_MAX_PARTS of them: a
 * single miss then keeps several reader threads (and cores) busy, and each part is summed
 * while it is still in that core's cache. */
#define SL_READ_PART      ((uint64_t)1 << 20)
#define SL_READ_MAX_PARTS 4

/* The default I/O timeout: a batch of reads not done after this long fails the forward. */
#define SL_IO_TIMEOUT_MS 30000

/* Where one piece of one expert lies: bytes [off, off + its size) of the store's file `file`. */
typedef struct sl_expert_extent {
    int32_t file;
    uint64_t off;
} sl_expert_extent;

typedef struct sl_expert_store {
    int32_t n_layers, n_experts;
    int32_t n_files; /* files: the files opened, their descriptors and paths */
    int *fds;
    char **paths;
    sl_experts_mode mode;
    sl_cache_policy policy;
    sl_expert_layer *layers; /* [n_layers] */
    sl_reader_pool *pool;    /* stream mode */
    int32_t io_timeout_ms;   /* the longest wait for a batch of reads; < 0: no limit */
    uint8_t *bounce;         /* the loading thread's aligned buffer (O_DIRECT retries) */
    sl_read_job *jobs;       /* [n_experts x SL_READ_MAX_PARTS] scratch for one fetch */
    int32_t *miss_slot;      /* [n_experts] */
    /* relayout layers: raw images read from the files before they are laid out into blobs,
     * n_stage of stage_bytes each (a fetch's misses go through them in rounds) */
    uint8_t *stage;
    int32_t n_stage;
    uint64_t stage_bytes;
    sl_io_engine engine;    /* stream: the engine reads go through (never AUTO once open) */
    int32_t overlap;        /* the MoE step computes cached experts while misses read */
    struct sl_uring *uring; /* engine URING */
    /* counters (read by sl_model_get_stats). hits: requested experts already cached, not
     * counting those a prefetch brought (prefetch_used); bytes_read counts every blob read,
     * prefetched ones too (prefetch_bytes of them) */
    int64_t requests, hits, bytes_read;
    int64_t prefetch_reads, prefetch_used, prefetch_bytes, prefetch_used_bytes;
    double read_time;
} sl_expert_store;

/* Experts that lie in memory the caller keeps mapped (a checkpoint's): views[l] holds layer
 * l's n_experts views, or is NULL for a dense layer; the store copies the views, not the
 * bytes. Mode "mapped", with no checks on fetch. */
sl_status sl_experts_open_views(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                                const sl_expert *const *views, sl_error *err);

typedef struct sl_store_params {
    sl_experts_mode mode;
    sl_cache_policy policy;
    int32_t cache_experts;
    int64_t cache_mem;
    int32_t direct_io;
    int32_t io_threads;
    int32_t io_timeout_ms;  /* 0: SL_IO_TIMEOUT_MS; < 0: no limit */
    int32_t min_slots;      /* top-k: fewer slots cannot serve one token */
    uint32_t pack_version;  /* the manifest's: every experts file must say the same (0: any) */
    uint64_t read_part;     /* stream: bytes per part of a blob's read (0: SL_READ_PART; tests) */
    sl_io_engine io_engine; /* stream: AUTO (io_uring with direct_io where built), THREADS, URING */
    int32_t no_overlap;     /* the MoE step waits for all of a group's reads before computing */
    int32_t cache_clamp; /* cache_mem below top-k slots a layer gives top-k (auto), not an error */
    sl_progress_fn progress;
    void *progress_user;
} sl_store_params;

/*
 * Experts whose bytes in the files are not laid out as a blob holds them: a checkpoint storing
 * gate and up fused, their rows interleaved, transposed (in x out), or MXFP4 codes apart from
 * their scales. Each expert is n_raw pieces of raw_len[i] bytes (piece i of expert e at
 * ext[n_raw e + i]); the store reads them into a staging buffer, then fn writes the blob's
 * matrices and linear biases (dst: views into the blob, whose data it fills; raw[i]: piece i)
 * exactly, no value changed: a re-layout. ctx and the sizes are fn's.
 */
#define SL_RAW_MAX 8
typedef struct sl_expert_relayout {
    void (*fn)(const struct sl_expert_relayout *r, const uint8_t *const *raw, const sl_expert *dst);
    int32_t n_raw;
    uint64_t raw_len[SL_RAW_MAX];
    const sl_expert_extent *ext; /* [n_experts x n_raw] */
    int32_t kind;                /* fn's: which layout */
    int64_t hidden, inter;
} sl_expert_relayout;

/* One MoE layer's experts in files (sl_experts_open_files). An expert is SL_EX_PARTS pieces, in
 * a pack blob's order (sl_expert_part): each matrix's data, scales and biases, the last two for
 * types that keep them apart from the codes (Q8/Q4 from MLX checkpoints, FP8's block scales),
 * then the linear biases. ext[SL_EX_PARTS e + p] is where piece p of expert e lies; matrix m is
 * typed and shaped like proto[m], whose pointers are unused but say which pieces exist
 * (non-NULL): data proto.nbytes bytes, scales and biases sl_tensor_scale_bytes(proto) each; its
 * linear bias like bias_proto[m] (dtype NONE: none). ext NULL: a dense layer, unless relayout is
 * given: then the pieces are read through it (ext unused). */
typedef struct sl_expert_src {
    const sl_expert_extent *ext;
    sl_tensor proto[3];
    sl_tensor bias_proto[3];
    const sl_expert_relayout *relayout;
} sl_expert_src;

/* Modes resident and stream over experts in files (paths[n_files]), src[n_layers]: slots,
 * budget, reads and statistics as for a pack. These files carry no checksums: a read is checked
 * for its length only. */
sl_status sl_experts_open_files(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                                int32_t n_files, const char *const *paths, const sl_expert_src *src,
                                const sl_store_params *p, sl_error *err);
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
 * same layer. Read errors, short reads, timeouts and checksum mismatches are
 * returned (naming file, layer and expert), never computed on: a slot whose
 * read failed is left empty, so the next fetch of that expert reads again.
 * Mapped: the file's size is checked first (a file that shrank would raise
 * SIGBUS) and each blob's checksum on its first fetch.
 */
sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err);

/*
 * sl_experts_fetch in two halves, so that the caller computes on what is cached while the
 * misses read. Start places the hits (pinned), picks the misses' slots and issues all their
 * reads at once, then returns: out[i] is expert ids[i]'s view from now on (valid as
 * sl_experts_fetch says), its bytes only once item i is ready. An expert a prefetch is reading
 * counts as a hit whose bytes are in flight; one whose prefetch failed before is read again. Errors
 * here: a stalled read still out (nothing touched), a timeout while waiting for a slot to free.
 */
sl_status sl_experts_fetch_start(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                                 const sl_expert **out, sl_error *err);
/* Waits until item i of the layer's last start is ready (read, checksum matched) or failed: the
 * errors of sl_experts_fetch for that expert, its slot emptied. At most the I/O timeout from
 * when its read was issued; a read abandoned then keeps its slot out of use until it is back. */
sl_status sl_experts_fetch_wait(sl_expert_store *s, int32_t layer, int32_t i, sl_error *err);
/* Whether item i of the layer's last start is ready or failed (its wait returns at once). */
int sl_experts_fetch_ready(sl_expert_store *s, int32_t layer, int32_t i);

/*
 * Starts reads of those of ids[0..n) of layer not cached and not in flight into slots of that
 * layer the policy gives up (each placed as sl_slot_insert places a miss), without waiting;
 * never into a slot the layer's current request pinned or one whose read is in flight. Returns
 * how many it started: 0 outside stream mode, for layers laid out on read (relayout), while a
 * stalled read is out, or when no slot is free. A prefetched read that fails is dropped
 * silently (its slot emptied); a fetch that needs it then reads it again, or, when the read
 * was still in flight as the fetch claimed it, reports its error as for a miss.
 */
int32_t sl_experts_prefetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n);

/* The I/O engine's name ("threads", "io_uring"), and for io_uring whether the slots are
 * registered buffers: a line for a run's first lines, into buf. */
const char *sl_experts_engine_desc(const sl_expert_store *s, char *buf, size_t cap);

/* Runs n reads (other files than experts too: PLE n-gram rows) with the store's reader pool,
 * in parallel in stream mode, one after another otherwise; waits for all of them, at most the
 * I/O timeout. Errors land in each job's err. */
void sl_experts_read(sl_expert_store *s, sl_read_job *jobs, int32_t n);
/* The status a failed job's err makes: SL_ERR_FORMAT (checksum), SL_ERR_TIMEOUT, or SL_ERR_IO. */
sl_status sl_experts_read_status(int err);
/* What a failed job's err means, in words, into buf (returned). */
const char *sl_experts_read_error(const sl_expert_store *s, const sl_read_job *j, char *buf,
                                  size_t cap);

/* Reads exactly len bytes at offset (0, an errno, or SL_READ_SHORT), retrying short reads.
 * align > 0 (O_DIRECT): a retry whose offset, length or buffer is no longer aligned reads the
 * aligned block around the missing bytes into bounce (bounce_cap bytes, a multiple of align,
 * aligned) and copies out what is needed. Exposed for tests. */
int sl_read_full(int fd, uint8_t *dst, uint64_t len, uint64_t offset, uint32_t align,
                 uint8_t *bounce, size_t bounce_cap);

#endif /* SL_EXPERTS_H */
