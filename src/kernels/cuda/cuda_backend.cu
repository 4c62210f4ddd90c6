/*
 * The CUDA backend: context (one GPU, a compute stream and a copy stream), memory,
 * and the sl_ops table.
 *
 * Every op is queued on the context's non-blocking compute stream and returns at
 * once, except the expert copies (to_dev_async), which go on the copy stream and
 * join the compute stream at copy_join or a sync; only alloc's zero-fill, to_host,
 * to_dev, release and reserve order themselves with the host. Device memory is taken at init
 * and by alloc and reserve (at load and session creation), never by an op. Kernels live in
 * cuda_matmul.cu (matmul, embed, routers, fused experts), cuda_mma.cu and cuda_imma.cu (its
 * prompt-sized products on BF16 and int8 tensor cores), cuda_blocks.cu and cuda_fp8.cu (GGUF block
 * and FP8 weights), cuda_mla.cu (latent attention) and cuda_ops.cu (the rest); each one is tested
 * against the reference in tests/ops/ops_table.c (build-cuda/test_cuda).
 */
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "kernels/cuda/cuda_backend.h"
}

void cu_record_error(cu_ctx *c, cudaError_t e, const char *file, int line, const char *call) {
    if (!c->first_error[0])
        snprintf(c->first_error, sizeof c->first_error, "CUDA error at %s:%d: %s (%s)", file, line,
                 cudaGetErrorString(e), call);
    (void)cudaGetLastError(); /* clear what can be cleared; sticky faults stay */
}

static sl_status cu_status(const sl_backend *be, sl_error *err) {
    cu_ctx *c = cu_of(be);
    if (!c->first_error[0]) return SL_OK;
    sl_status st = sl_fail(err, SL_ERR_IO, "%s", c->first_error);
    c->first_error[0] = 0;
    return st;
}

void *cu_scratch(const sl_backend *be, size_t bytes) {
    cu_ctx *c = cu_of(be);
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (!c->first_error[0])
        snprintf(c->first_error, sizeof c->first_error,
                 "CUDA: an op needs %zu bytes of scratch, the sessions reserved %zu", bytes,
                 c->scratch_bytes);
    return NULL;
}

/* Replaces the scratch by one of `bytes`, freeing the old one once the work queued before may no
 * longer use it; on failure the old one stays (the sessions made so far go on). */
static sl_status scratch_resize(cu_ctx *c, size_t bytes, sl_error *err) {
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return sl_fail(err, SL_ERR_NOMEM, "CUDA: %zu bytes of scratch for the session: %s", bytes,
                       cudaGetErrorString(e));
    }
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    if (c->scratch) CUDA_CHECK(c, cudaFree(c->scratch));
    c->scratch = p, c->scratch_bytes = bytes;
    return SL_OK;
}

/* The largest scratch any op needs in a session of this shape: the decode attention's partials
 * (cu_attention; the most over every batch size, at the longest context, since the splits grow
 * with the keys), and the int8 copy of the widest x a Q4 prefill product reads (cuda_imma.cu: a
 * byte an element and a 16-byte record per 32, at most; with less, it runs in slices).
 * Overlapping copy2d calls (none in a forward) use what there is. */
static sl_status cu_reserve(const sl_backend *be, const sl_reserve_args *r, sl_error *err) {
    cu_ctx *c = cu_of(be);
    size_t need = 0;
    for (int32_t T = 1; T <= r->max_batch; T++) {
        const int64_t items = (int64_t)T * r->n_heads;
        if (items <= 0 || items > INT32_MAX) break;
        const int32_t splits = cu_att_splits(c, (int32_t)items, r->max_ctx);
        if (splits > 1)
            need = SL_MAX(need, (size_t)items * (size_t)splits * (size_t)(r->head_dim + 2) *
                                    sizeof(float));
    }
    if (c->q4x && c->tensor_cores && r->max_x > 0)
        need = SL_MAX(need, (size_t)r->max_x + (size_t)r->max_x / 32 * sizeof(float4));
    return need > c->scratch_bytes ? scratch_resize(c, need, err) : SL_OK;
}

/* ------------------------------------------------------------- memory */

static void *cu_alloc(const sl_backend *be, size_t bytes) {
    cu_ctx *c = cu_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free allocation error */
        return NULL;
    }
    CUDA_CHECK(c, cudaMemsetAsync(p, 0, bytes ? bytes : 256, c->stream));
    return p;
}

/* Waits for both streams (memory a queued copy may still write or read). */
static void cu_wait_all(cu_ctx *c) {
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    CUDA_CHECK(c, cudaStreamSynchronize(c->copy));
}

static void cu_release(const sl_backend *be, void *p) {
    if (!p) return;
    cu_ctx *c = cu_of(be);
    cu_wait_all(c);
    CUDA_CHECK(c, cudaFree(p));
}

/* Page-locks a host buffer so copies from it run at full DMA speed. Only an optimisation:
 * memory CUDA cannot register (some read-only mappings) stays pageable. */
static void cu_pin(const sl_backend *be, void *host, size_t bytes) {
    (void)be;
    if (!host || !bytes) return;
    /* portable: pinned for every GPU of the process (a split model's copy from the same store) */
    if (cudaHostRegister(host, bytes, cudaHostRegisterPortable) == cudaSuccess) return;
    (void)cudaGetLastError();
    if (cudaHostRegister(host, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly) !=
        cudaSuccess)
        (void)cudaGetLastError();
}

static void cu_unpin(const sl_backend *be, void *host) {
    if (!host) return;
    cu_wait_all(cu_of(be)); /* no copy may still read it */
    if (cudaHostUnregister(host) != cudaSuccess) (void)cudaGetLastError(); /* was never pinned */
}

/* The compute stream waits for the expert copies queued so far. */
static void cu_copy_join(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    if (!c->copies_open) return;
    CUDA_CHECK(c, cudaEventRecord(c->ev_copy, c->copy));
    CUDA_CHECK(c, cudaStreamWaitEvent(c->stream, c->ev_copy, 0));
    c->copies_open = 0;
}

static void cu_sync(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    if (cu_refuse_in_graph(c)) return;
    cu_copy_join(be);
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    c->stage_off = 0; /* every staged copy has landed, every queued kernel has run */
    c->items_off = 0;
    c->graph_queued = 0;
}

/* Through the pinned staging ring when it fits, past the staged copies still queued (they read
 * below stage_off), then one memcpy: into pageable memory the driver stages the copy itself,
 * which took ~70 us for a token's 600 KB of logits and ~15 us for a layer's expert picks on an
 * H200 host. */
static void cu_to_host(const sl_backend *be, void *host, const void *src, size_t bytes) {
    if (!bytes) return;
    cu_ctx *c = cu_of(be);
    if (cu_refuse_in_graph(c)) {
        memset(host, 0, bytes); /* defined bytes for a step that will run again */
        return;
    }
    if (bytes <= c->stage_bytes && c->stage_off + bytes > c->stage_bytes) cu_sync(be);
    if (c->stage_off + bytes <= c->stage_bytes) {
        uint8_t *tmp = c->stage + c->stage_off;
        CUDA_CHECK(c, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        cu_sync(be);
        memcpy(host, tmp, bytes);
        return;
    }
    CUDA_CHECK(c, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    cu_sync(be);
}

/* On the copy stream, so the kernels queued after it start at once (the cached decode's fused
 * experts run while the host reads the picks); to_host_end waits for this copy alone. */
static void cu_to_host_begin(const sl_backend *be, void *host, const void *src, size_t bytes) {
    cu_ctx *c = cu_of(be);
    SL_ASSERT(bytes <= SL_PEEK_BYTES && !c->peek_bytes);
    if (!bytes) return;
    if (cu_refuse_in_graph(c)) {
        memset(host, 0, bytes); /* defined bytes for a step that will run again */
        return;
    }
    CUDA_CHECK(c, cudaEventRecord(c->ev_compute, c->stream)); /* a wait takes the record of now */
    CUDA_CHECK(c, cudaStreamWaitEvent(c->copy, c->ev_compute, 0));
    CUDA_CHECK(c, cudaMemcpyAsync(c->peek, src, bytes, cudaMemcpyDeviceToHost, c->copy));
    CUDA_CHECK(c, cudaEventRecord(c->ev_peek, c->copy));
    c->peek_host = host, c->peek_bytes = bytes;
}

static void cu_to_host_end(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    if (!c->peek_bytes) return;
    CUDA_CHECK(c, cudaEventSynchronize(c->ev_peek));
    memcpy(c->peek_host, c->peek, c->peek_bytes);
    c->peek_bytes = 0;
}

/* On the copy stream, after the compute work queued before the batch's first copy (which may
 * still read a slot being refilled). */
static void cu_to_dev_async(const sl_backend *be, void *dst, const void *host, size_t bytes) {
    cu_ctx *c = cu_of(be);
    if (!bytes || cu_refuse_in_graph(c)) return; /* the host memory may be pageable */
    if (!c->copies_open) {
        CUDA_CHECK(c, cudaEventRecord(c->ev_compute, c->stream));
        CUDA_CHECK(c, cudaStreamWaitEvent(c->copy, c->ev_compute, 0));
        c->copies_open = 1;
    }
    CUDA_CHECK(c, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->copy));
}

/* Small copies go through the staging ring and do not wait; large ones wait, since the host
 * buffer may be reused as soon as we return. */
static void cu_to_dev(const sl_backend *be, void *dst, const void *host, size_t bytes) {
    if (!bytes) return;
    cu_ctx *c = cu_of(be);
    if (bytes <= c->stage_bytes / 8) {
        if (c->stage_off + bytes > c->stage_bytes) {
            if (cu_refuse_in_graph(c)) return;
            cu_sync(be);
        }
        memcpy(c->stage + c->stage_off, host, bytes);
        /* from the pinned ring: allowed in a graph step (a replayed one copies what the host
         * has just written there) */
        cu_copy(c, dst, c->stage + c->stage_off, bytes, cudaMemcpyHostToDevice);
        c->stage_off = (c->stage_off + bytes + 255) & ~(size_t)255;
        return;
    }
    if (cu_refuse_in_graph(c)) return;
    CUDA_CHECK(c, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->stream));
    cu_sync(be);
}

void *cu_items(const sl_backend *be, const void *host, size_t bytes) {
    cu_ctx *c = cu_of(be);
    SL_ASSERT(bytes <= c->items_bytes && bytes <= c->stage_bytes / 8);
    /* Room in both rings first, so the staged copy below cannot wait and reset them. */
    if (c->items_off + bytes > c->items_bytes || c->stage_off + bytes > c->stage_bytes) {
        if (cu_refuse_in_graph(c)) return c->items;
        cu_sync(be);
    }
    uint8_t *dst = c->items + c->items_off;
    c->items_off = (c->items_off + bytes + 255) & ~(size_t)255;
    cu_to_dev(be, dst, host, bytes); /* staged: no wait */
    return dst;
}

/* ------------------------------------------------------------- graphs */

/*
 * Decode steps as CUDA graphs. A step's first recording is instantiated; every later step is
 * queued by the model as usual, but each launch and copy it asks for is compared with the
 * record of the last recording instead of queued: when all of them match, the graph runs as it
 * is, with no recording and no update, the host's work a step being the model's walk and one
 * graph launch. What changes from token to token is read by the kernels from device memory:
 * the position (cu_dyn), the token's id and the staged parameters (the same addresses of the
 * pinned staging ring, rewritten by the host before the launch). Where an entry differs (the
 * attention's splits grow with the keys), the step records from there: the entries before it
 * are queued again from the record into the new recording, which updates the graph.
 */
#define CU_REC_MAX   8192
#define CU_REC_ARGS  ((size_t)1 << 20)
#define CU_REC_NARGS 40

struct cu_rec {
    const void *fn; /* the kernel; NULL: a copy */
    dim3 grid, block;
    size_t smem;
    int pdl, nargs;
    size_t off, end;             /* its arguments from rec_args + off, the next entry's at end */
    uint32_t at[CU_REC_NARGS];   /* argument i at off + at[i] ... */
    uint32_t size[CU_REC_NARGS]; /* ... of size[i] bytes */
    void *dst;                   /* a copy */
    const void *src;
    size_t bytes;
    cudaMemcpyKind kind;
};

/* Whether a launch differs from entry r (then where, in why, for the trace). */
static int rec_diff(const cu_ctx *c, const cu_rec *r, const void *fn, dim3 grid, dim3 block,
                    size_t smem, int pdl, void **args, const size_t *size, int n, char (&why)[64]) {
    if (r->fn != fn) return snprintf(why, sizeof why, "kernel"), 1;
    if (r->smem != smem || r->pdl != pdl || r->grid.x != grid.x || r->grid.y != grid.y ||
        r->grid.z != grid.z || r->block.x != block.x || r->block.y != block.y ||
        r->block.z != block.z)
        return snprintf(why, sizeof why, "launch shape"), 1;
    if (r->nargs != n) return snprintf(why, sizeof why, "arguments"), 1;
    for (int i = 0; i < n; i++) {
        const uint8_t *was = c->rec_args + r->off + r->at[i], *now = (const uint8_t *)args[i];
        if (r->size[i] == size[i] && !memcmp(was, now, size[i])) continue;
        size_t b = 0;
        while (b < size[i] && b < r->size[i] && was[b] == now[b])
            b++;
        return snprintf(why, sizeof why, "argument %d at byte %zu", i, b), 1;
    }
    return 0;
}

/* Where the next entry's arguments go: past the last entry's. */
static size_t rec_args_end(const cu_ctx *c) {
    return c->rec_n ? c->rec[c->rec_n - 1].end : 0;
}

/* The next entry, or NULL when the record is full or an argument list does not fit: the
 * recording then stands for this step only. */
static cu_rec *rec_next(cu_ctx *c) {
    if (!c->rec_ok || c->rec_n == CU_REC_MAX) {
        c->rec_ok = 0;
        return NULL;
    }
    return &c->rec[c->rec_n];
}

static void rec_kernel(cu_ctx *c, const void *fn, dim3 grid, dim3 block, size_t smem, int pdl,
                       void **args, const size_t *size, int n) {
    cu_rec *r = rec_next(c);
    if (!r) return;
    size_t o = rec_args_end(c), need = 0;
    for (int i = 0; i < n; i++)
        need += (size[i] + 15) & ~(size_t)15;
    if (n > CU_REC_NARGS || o + need > CU_REC_ARGS) {
        c->rec_ok = 0;
        return;
    }
    r->fn = fn, r->grid = grid, r->block = block, r->smem = smem, r->pdl = pdl, r->nargs = n;
    r->off = o;
    for (int i = 0, at = 0; i < n; i++) {
        r->at[i] = (uint32_t)at, r->size[i] = (uint32_t)size[i];
        memcpy(c->rec_args + o + at, args[i], size[i]);
        at += (int)((size[i] + 15) & ~(size_t)15);
    }
    r->end = o + need;
    c->rec_n++;
}

static void launch_now(cu_ctx *c, const void *fn, dim3 grid, dim3 block, size_t smem, int pdl,
                       void **args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(c, cudaLaunchKernelExC(&cfg, fn, args));
}

/* Queues entry r of the record again (a recording that starts past the entries a step
 * matched). */
static void rec_issue(cu_ctx *c, const cu_rec *r) {
    if (!r->fn) {
        CUDA_CHECK(c, cudaMemcpyAsync(r->dst, r->src, r->bytes, r->kind, c->stream));
        return;
    }
    void *args[CU_REC_NARGS];
    for (int i = 0; i < r->nargs; i++)
        args[i] = c->rec_args + r->off + r->at[i];
    launch_now(c, r->fn, r->grid, r->block, r->smem, r->pdl, args);
}

/* A replayed step asked for something other than the record's entry rec_i: from here it is
 * recorded, the rec_i entries it matched queued first (op by op when no recording starts). */
static void rec_diverge(cu_ctx *c) {
    c->replaying = 0;
    c->rec_valid = 0;
    c->rec_n = c->rec_i;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        c->capturing = 0;
    }
    for (int i = 0; i < c->rec_n; i++)
        rec_issue(c, &c->rec[i]);
}

void cu_launch_raw(cu_ctx *c, const void *fn, dim3 grid, dim3 block, size_t smem, void **args,
                   const size_t *size, int n) {
    const int pdl = c->pdl; /* in a graph: programmatic edges */
    if (c->replaying) {
        char d[64] = "length";
        if (c->rec_i < c->rec_n &&
            !rec_diff(c, &c->rec[c->rec_i], fn, grid, block, smem, pdl, args, size, n, d)) {
            c->rec_i++;
            return;
        }
        if (c->graph_trace) {
            const char *name = "?";
            if (cudaFuncGetName(&name, fn) != cudaSuccess) (void)cudaGetLastError();
            fprintf(stderr, "sluice: graph step records from launch %d of %d (%s, its %s)\n",
                    c->rec_i, c->rec_n, name, d);
        }
        rec_diverge(c);
    }
    launch_now(c, fn, grid, block, smem, pdl, args);
    if (c->capturing) rec_kernel(c, fn, grid, block, smem, pdl, args, size, n);
}

void cu_copy(cu_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (c->replaying) {
        const cu_rec *r = c->rec_i < c->rec_n ? &c->rec[c->rec_i] : NULL;
        if (r && !r->fn && r->dst == dst && r->src == src && r->bytes == bytes && r->kind == kind) {
            c->rec_i++;
            return;
        }
        if (c->graph_trace)
            fprintf(stderr,
                    "sluice: graph step records from entry %d of %d (a copy of %zu bytes)\n",
                    c->rec_i, c->rec_n, bytes);
        rec_diverge(c);
    }
    CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
    if (!c->capturing) return;
    cu_rec *r = rec_next(c);
    if (!r) return;
    *r = cu_rec{};
    r->dst = dst, r->src = src, r->bytes = bytes, r->kind = kind;
    r->off = r->end = rec_args_end(c);
    c->rec_n++;
}

/* Thread-local mode: nothing a step queues allocates or waits for the device (the scratch is
 * reserved with the session; to_host and sync refuse in a step), and a call that would breaks
 * the step, which graph_end then drops (the step runs again without a graph). */
static void cu_graph_begin(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    cu_copy_join(be); /* before the step: the wait on the copy stream stays outside the graph */
    /* the staging rings from their start, so that a step's copies come from the same addresses
     * as the last one's, which has finished reading them (and dyn_host) */
    if (c->stage_off || c->items_off || c->graph_queued) cu_sync(be);
    c->broken = 0;
    c->dyn_n = 0;
    if (c->graphs_off) return;
    c->capturing = 1;
    if (c->rec_valid && c->exec) { /* entry 0 is the copy of dyn_host, below */
        c->replaying = 1;
        c->rec_i = 1;
        return;
    }
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError(); /* not recording: the ops run one by one */
        c->capturing = 0;
        return;
    }
    c->rec_n = 0, c->rec_ok = 1;
    cu_copy(c, c->dyn, c->dyn_host, CU_DYN_N * sizeof(int32_t), cudaMemcpyHostToDevice);
}

/* Graphs stop paying when most steps record (a family whose steps differ in more than cu_dyn
 * covers): after 16 steps of 32 that recorded, steps run op by op. */
static void graph_note(cu_ctx *c, int recorded) {
    c->graph_diverged += recorded;
    if (++c->graph_steps_seen < 32) return;
    if (c->graph_diverged >= 16) c->graphs_off = 1;
    c->graph_steps_seen = c->graph_diverged = 0;
}

static int cu_graph_end(const sl_backend *be, int launch) {
    cu_ctx *c = cu_of(be);
    if (!c->capturing) return launch ? 0 : -1; /* graph_begin failed: the ops already ran */
    if (c->replaying) {
        if (c->broken || !launch) { /* nothing was queued */
            c->replaying = c->capturing = 0;
            return -1;
        }
        if (c->rec_i == c->rec_n) {
            c->replaying = c->capturing = 0;
            CUDA_CHECK(c, cudaGraphLaunch(c->exec, c->stream));
            c->graph_queued = 1;
            graph_note(c, 0);
            return 2;
        }
        if (c->graph_trace)
            fprintf(stderr, "sluice: graph step records: %d entries of %d\n", c->rec_i, c->rec_n);
        rec_diverge(c); /* fewer entries than recorded */
        if (!c->capturing) return 0;
    }
    c->capturing = 0;
    c->rec_valid = 0;
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(c->stream, &g) != cudaSuccess || !g || c->broken || !launch) {
        (void)cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return -1;
    }
    /* Same kernels in the same order as the last recording: only their arguments are updated
     * (about 0.3 us a node on an H200, against 2.6 ms for a new instantiation). */
    if (c->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(c->exec, g, &info) != cudaSuccess) {
            (void)cudaGetLastError();
            cudaGraphExecDestroy(c->exec);
            c->exec = NULL;
        }
    }
    if (!c->exec && cudaGraphInstantiate(&c->exec, g, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        c->exec = NULL;
    }
    cudaGraphDestroy(g);
    if (!c->exec) return -1;
    CUDA_CHECK(c, cudaGraphLaunch(c->exec, c->stream));
    c->graph_queued = 1;
    c->rec_valid = c->rec_ok;
    graph_note(c, 1);
    return 1;
}

/* ------------------------------------------------------------- split models */

int cu_multi_gpu;

/* This backend's stream takes bytes from another CUDA backend's memory (the residual rows at a
 * split model's partition boundary), after all the work queued there: the sender's pending
 * add_rmsnorm_next is launched (src may be its output), an event recorded on its stream is
 * waited for on this one, then one copy on this stream: device to device on one GPU (logical
 * partitions), a peer copy between two (direct where the GPUs allow peer access, else the
 * driver stages it through the host). */
static void cu_copy_peer(const sl_backend *be, void *dst, const sl_backend *src_be, const void *src,
                         size_t bytes) {
    cu_ctx *c = cu_of(be), *f = cu_of(src_be);
    if (!bytes || cu_refuse_in_graph(c) || cu_refuse_in_graph(f)) return;
    cu_bind(f);
    cu_norm_flush(src_be);
    CUDA_CHECK(f, cudaEventRecord(f->ev_xfer, f->stream));
    cu_bind(c);
    cu_norm_flush(be);
    CUDA_CHECK(c, cudaStreamWaitEvent(c->stream, f->ev_xfer, 0));
    if (c->gpu == f->gpu) {
        CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        return;
    }
    const unsigned long long bit = 1ull << (f->gpu & 63);
    if (!(c->peers_tried & bit)) { /* once per pair: direct reads of f's memory if possible */
        int ok = 0;
        c->peers_tried |= bit;
        if (cudaDeviceCanAccessPeer(&ok, c->gpu, f->gpu) == cudaSuccess && ok)
            (void)cudaDeviceEnablePeerAccess(f->gpu, 0); /* already enabled: fine too */
        (void)cudaGetLastError();
    }
    CUDA_CHECK(c, cudaMemcpyPeerAsync(dst, c->gpu, src, f->gpu, bytes, c->stream));
}

/* ------------------------------------------------------------- table */

/* An op that first launches a pending add_rmsnorm_next (cu_norm_flush): every op but the GEMVs
 * that may take it over (matmul, matmul_batch, moe_route) and add_rmsnorm_next itself. */
template <typename F, F f> struct flushed;
template <typename R, typename... A, R (*f)(const sl_backend *, A...)>
struct flushed<R (*)(const sl_backend *, A...), f> {
    static R call(const sl_backend *be, A... a) {
        cu_bind(cu_of(be));
        cu_norm_flush(be);
        return f(be, a...);
    }
};
#define FLUSHED(fn) flushed<decltype(&fn), &fn>::call
/* The GEMVs that may take a pending add_rmsnorm_next over: bound to their GPU, not flushed. */
template <typename F, F f> struct bound;
template <typename R, typename... A, R (*f)(const sl_backend *, A...)>
struct bound<R (*)(const sl_backend *, A...), f> {
    static R call(const sl_backend *be, A... a) {
        cu_bind(cu_of(be));
        return f(be, a...);
    }
};
#define BOUND(fn) bound<decltype(&fn), &fn>::call

static sl_ops make_ops(void) {
    sl_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.alloc = FLUSHED(cu_alloc);
    o.release = FLUSHED(cu_release);
    o.pin = FLUSHED(cu_pin);
    o.unpin = FLUSHED(cu_unpin);
    o.to_host = FLUSHED(cu_to_host);
    o.to_dev = FLUSHED(cu_to_dev);
    o.to_host_begin = FLUSHED(cu_to_host_begin);
    o.to_host_end = FLUSHED(cu_to_host_end);
    o.to_dev_async = FLUSHED(cu_to_dev_async);
    o.copy_join = FLUSHED(cu_copy_join);
    o.status = FLUSHED(cu_status);
    o.sync = FLUSHED(cu_sync);
    o.reserve = FLUSHED(cu_reserve);
    o.graph_begin = FLUSHED(cu_graph_begin);
    o.graph_end = FLUSHED(cu_graph_end);
    o.copy2d = FLUSHED(cu_copy2d);
    o.copy_rows = FLUSHED(cu_copy_rows);
    o.fill = FLUSHED(cu_fill);
    o.matmul = BOUND(cu_matmul);
    o.matmul_batch = BOUND(cu_matmul_batch);
    o.embed = FLUSHED(cu_embed);
    o.rmsnorm = FLUSHED(cu_rmsnorm);
    o.rope = FLUSHED(cu_rope);
    o.add_rmsnorm = FLUSHED(cu_add_rmsnorm);
    o.add_rmsnorm_next = BOUND(cu_add_rmsnorm_next); /* flushes, then may wait */
    o.qkv_prep = FLUSHED(cu_qkv_prep);
    o.attention = FLUSHED(cu_attention);
    o.latent_attention = FLUSHED(cu_latent_attention);
    o.swiglu = FLUSHED(cu_swiglu);
    o.act_mul = FLUSHED(cu_act_mul);
    o.swiglu_clamped = FLUSHED(cu_swiglu_clamped);
    o.add_bias = FLUSHED(cu_add_bias);
    o.axpy = FLUSHED(cu_axpy);
    o.weighted_sum = FLUSHED(cu_weighted_sum);
    o.moe_route = BOUND(cu_moe_route);
    o.copy_peer = cu_copy_peer; /* binds each side itself */
    o.scale_rows = FLUSHED(cu_scale_rows);
    o.clamp = FLUSHED(cu_clamp);
    o.moe_experts = FLUSHED(cu_moe_experts);
    o.sigmoid_mul = FLUSHED(cu_sigmoid_mul);
    o.l2norm = FLUSHED(cu_l2norm);
    o.conv1d_silu = FLUSHED(cu_conv1d_silu);
    o.delta_rule = FLUSHED(cu_delta_rule);
    o.gated_rmsnorm = FLUSHED(cu_gated_rmsnorm);
    o.activate = FLUSHED(cu_activate);
    o.hc_inject = FLUSHED(cu_hc_inject);
    o.hc_mix = FLUSHED(cu_hc_mix);
    o.ple_gate = FLUSHED(cu_ple_gate);
    o.qsa_scores = FLUSHED(cu_qsa_scores);
    return o;
}

static const sl_ops cuda_ops = make_ops();

/* Frees whatever of a context exists (its streams idle). */
static void cu_ctx_destroy(cu_ctx *c) {
    if (c->scratch) cudaFree(c->scratch);
    if (c->stage) cudaFreeHost(c->stage);
    if (c->peek) cudaFreeHost(c->peek);
    if (c->items) cudaFree(c->items);
    if (c->exec) cudaGraphExecDestroy(c->exec);
    if (c->dyn) cudaFree(c->dyn);
    if (c->dyn_host) cudaFreeHost(c->dyn_host);
    free(c->rec);
    free(c->rec_args);
    if (c->done) cudaFree(c->done);
    if (c->ev_compute) cudaEventDestroy(c->ev_compute);
    if (c->ev_copy) cudaEventDestroy(c->ev_copy);
    if (c->ev_peek) cudaEventDestroy(c->ev_peek);
    if (c->ev_xfer) cudaEventDestroy(c->ev_xfer);
    if (c->copy) cudaStreamDestroy(c->copy);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->items_host);
    free(c);
}

/*
 * Before the process's first CUDA call: load every kernel when the context is made, not at its
 * first launch (CUDA's default since 12.2 is lazy). Lazily, the first prompt paid for loading
 * each of its kernels: on an H200 a 512-token prefill at Qwen3-30B-A3B shapes (8 layers) ran at
 * 9.7-10.5k tok/s, against 25.1k with eager loading; the cost moves to model load. The
 * variable is read once, at the driver's initialisation: a value the user set stays, and a
 * process that initialised CUDA before sluice keeps its mode.
 */
static void cu_module_loading(void) {
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

extern "C" sl_status sl_backend_cuda_init(sl_backend *be, int32_t gpu, const sl_cuda_params *p,
                                          sl_error *err) {
    int n = 0;
    cu_module_loading();
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: no usable GPU (%s)", cudaGetErrorString(e));
    }
    if (n <= 0) return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: no GPU found");
    if (gpu < 0 || gpu >= n)
        return sl_fail(err, SL_ERR_ARG, "CUDA: GPU %d requested, %d present", (int)gpu, n);
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(gpu)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, gpu)) != cudaSuccess)
        return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: GPU %d: %s", (int)gpu,
                       cudaGetErrorString(e));
    if (prop.major < 7)
        return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: GPU %d (%s) has compute capability %d.%d",
                       (int)gpu, prop.name, prop.major, prop.minor);
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!c) return sl_fail(err, SL_ERR_NOMEM, "CUDA: out of host memory");
    c->gpu = gpu;
    c->n_sm = prop.multiProcessorCount;
    c->pdl = !(p && p->no_pdl);
    c->q4x = !(p && p->int4_float_act);
    c->tensor_cores = prop.major >= 8 && !(p && p->no_tensor_cores);
    c->graph_trace = getenv("SL_CUDA_GRAPH_TRACE") != NULL;
    snprintf(c->name, sizeof c->name, "%.200s (%d SMs, %.0f GiB)", prop.name, c->n_sm,
             (double)prop.totalGlobalMem / (1 << 30));
    const char *what = "streams";
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_peek, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_xfer, cudaEventDisableTiming)) != cudaSuccess)
        goto fail;
    what = "matmul_batch items";
    c->items_bytes = (size_t)4 << 20;
    c->items_host = (uint8_t *)malloc(c->items_bytes);
    if (!c->items_host) e = cudaErrorMemoryAllocation;
    if (!c->items_host || (e = cudaMalloc((void **)&c->items, c->items_bytes)) != cudaSuccess)
        goto fail;
    /* the router's counter, then the attention items' */
    what = "counters";
    if ((e = cudaMalloc((void **)&c->done, (1 + CU_ATT_COUNTS) * sizeof *c->done)) != cudaSuccess ||
        (e = cudaMemset(c->done, 0, (1 + CU_ATT_COUNTS) * sizeof *c->done)) != cudaSuccess)
        goto fail;
    c->att_counts = c->done + 1;
    what = "pinned staging";
    c->stage_bytes = (size_t)16 << 20;
    if ((e = cudaMallocHost((void **)&c->stage, c->stage_bytes)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->peek, SL_PEEK_BYTES)) != cudaSuccess)
        goto fail;
    what = "graph steps";
    c->rec = (cu_rec *)malloc(CU_REC_MAX * sizeof *c->rec);
    c->rec_args = (uint8_t *)malloc(CU_REC_ARGS);
    if (!c->rec || !c->rec_args) e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess ||
        (e = cudaMalloc((void **)&c->dyn, CU_DYN_N * sizeof(int32_t))) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->dyn_host, CU_DYN_N * sizeof(int32_t))) != cudaSuccess)
        goto fail;
    what = "tensor-core kernels"; /* their shared memory (also for the paths' tests) */
    if (prop.major >= 8 && (e = cu_imma_init()) != cudaSuccess) goto fail;
    what = "scratch";
    c->scratch_bytes = CU_SCRATCH_MIN;
    if ((e = cudaMalloc(&c->scratch, c->scratch_bytes)) != cudaSuccess) goto fail;
    /* a second GPU in the process: from now on every op makes its own GPU current */
    static int first_gpu = -1;
    if (first_gpu < 0) first_gpu = gpu;
    if (gpu != first_gpu) cu_multi_gpu = 1;
    be->ops = &cuda_ops;
    be->n_threads = 1;
    be->isa = SL_ISA_SCALAR;
    be->device = 1;
    be->ctx = c;
    return SL_OK;
fail:
    cu_ctx_destroy(c);
    return sl_fail(err, e == cudaErrorMemoryAllocation ? SL_ERR_NOMEM : SL_ERR_UNSUPPORTED,
                   "CUDA: %s: %s", what, cudaGetErrorString(e));
}

extern "C" void sl_backend_cuda_free(sl_backend *be) {
    cu_ctx *c = be && be->device ? cu_of(be) : NULL;
    if (!c) return;
    cu_bind(c);
    cu_wait_all(c);
    cu_ctx_destroy(c);
    be->ctx = NULL;
    be->ops = NULL;
}

extern "C" sl_status sl_backend_cuda_mem(int32_t gpu, int64_t *free_bytes, int64_t *total_bytes,
                                         sl_error *err) {
    int n = 0, cur = 0;
    size_t f = 0, t = 0;
    *free_bytes = *total_bytes = 0;
    cu_module_loading();
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: no usable GPU (%s)", cudaGetErrorString(e));
    }
    if (gpu < 0 || gpu >= n)
        return sl_fail(err, SL_ERR_ARG, "CUDA: GPU %d requested, %d present", (int)gpu, n);
    /* cudaMemGetInfo reads the current GPU's: switch for the call, then back */
    if ((e = cudaGetDevice(&cur)) != cudaSuccess || (e = cudaSetDevice(gpu)) != cudaSuccess ||
        (e = cudaMemGetInfo(&f, &t)) != cudaSuccess || (e = cudaSetDevice(cur)) != cudaSuccess) {
        (void)cudaGetLastError();
        return sl_fail(err, SL_ERR_UNSUPPORTED, "CUDA: GPU %d: %s", (int)gpu,
                       cudaGetErrorString(e));
    }
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
    return SL_OK;
}

extern "C" int sl_backend_cuda_available(void) {
    int n = 0;
    cu_module_loading();
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" void sl_cuda_sync(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

extern "C" const char *sl_cuda_device_name(const sl_backend *be) {
    return cu_of(be)->name;
}

extern "C" void sl_cuda_set_attention_path(const sl_backend *be, sl_cuda_att_path path) {
    cu_of(be)->att_path = (int)path;
}

extern "C" void sl_cuda_set_imma_tile(const sl_backend *be, int tokens) {
    cu_of(be)->imma_tile = tokens;
}
