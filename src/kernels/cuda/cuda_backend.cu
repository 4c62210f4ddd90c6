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
    if (cudaHostRegister(host, bytes, cudaHostRegisterDefault) == cudaSuccess) return;
    (void)cudaGetLastError();
    if (cudaHostRegister(host, bytes, cudaHostRegisterReadOnly) != cudaSuccess)
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
        /* from the pinned ring: allowed in a graph recording */
        CUDA_CHECK(c, cudaMemcpyAsync(dst, c->stage + c->stage_off, bytes, cudaMemcpyHostToDevice,
                                      c->stream));
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

/* Thread-local mode: nothing a step queues allocates or waits for the device (the scratch is
 * reserved with the session; to_host and sync refuse while recording), and a call that would
 * invalidates the recording, which graph_end then drops (the step runs again without a graph). */
static void cu_graph_begin(const sl_backend *be) {
    cu_ctx *c = cu_of(be);
    cu_copy_join(be); /* before recording: the wait on the copy stream stays outside the graph */
    c->broken = 0;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError(); /* not recording: the ops run one by one */
        return;
    }
    c->capturing = 1;
}

static int cu_graph_end(const sl_backend *be, int launch) {
    cu_ctx *c = cu_of(be);
    if (!c->capturing) return launch ? 0 : -1; /* graph_begin failed: the ops already ran */
    c->capturing = 0;
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(c->stream, &g) != cudaSuccess || !g || c->broken || !launch) {
        (void)cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return -1;
    }
    /* Same kernels in the same order as the last step: only their arguments are updated
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
    return 0;
}

/* ------------------------------------------------------------- table */

/* An op that first launches a pending add_rmsnorm_next (cu_norm_flush): every op but the GEMVs
 * that may take it over (matmul, matmul_batch, moe_route) and add_rmsnorm_next itself. */
template <typename F, F f> struct flushed;
template <typename R, typename... A, R (*f)(const sl_backend *, A...)>
struct flushed<R (*)(const sl_backend *, A...), f> {
    static R call(const sl_backend *be, A... a) {
        cu_norm_flush(be);
        return f(be, a...);
    }
};
#define FLUSHED(fn) flushed<decltype(&fn), &fn>::call

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
    o.matmul = cu_matmul;
    o.matmul_batch = cu_matmul_batch;
    o.embed = FLUSHED(cu_embed);
    o.rmsnorm = FLUSHED(cu_rmsnorm);
    o.rope = FLUSHED(cu_rope);
    o.add_rmsnorm = FLUSHED(cu_add_rmsnorm);
    o.add_rmsnorm_next = cu_add_rmsnorm_next; /* flushes, then may wait */
    o.qkv_prep = FLUSHED(cu_qkv_prep);
    o.attention = FLUSHED(cu_attention);
    o.latent_attention = FLUSHED(cu_latent_attention);
    o.swiglu = FLUSHED(cu_swiglu);
    o.act_mul = FLUSHED(cu_act_mul);
    o.swiglu_clamped = FLUSHED(cu_swiglu_clamped);
    o.add_bias = FLUSHED(cu_add_bias);
    o.axpy = FLUSHED(cu_axpy);
    o.weighted_sum = FLUSHED(cu_weighted_sum);
    o.moe_route = cu_moe_route;
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
    if (c->done) cudaFree(c->done);
    if (c->ev_compute) cudaEventDestroy(c->ev_compute);
    if (c->ev_copy) cudaEventDestroy(c->ev_copy);
    if (c->ev_peek) cudaEventDestroy(c->ev_peek);
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
    snprintf(c->name, sizeof c->name, "%.200s (%d SMs, %.0f GiB)", prop.name, c->n_sm,
             (double)prop.totalGlobalMem / (1 << 30));
    const char *what = "streams";
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_peek, cudaEventDisableTiming)) != cudaSuccess)
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
    what = "tensor-core kernels"; /* their shared memory (also for the paths' tests) */
    if (prop.major >= 8 && (e = cu_imma_init()) != cudaSuccess) goto fail;
    what = "scratch";
    c->scratch_bytes = CU_SCRATCH_MIN;
    if ((e = cudaMalloc(&c->scratch, c->scratch_bytes)) != cudaSuccess) goto fail;
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
    cu_wait_all(c);
    cu_ctx_destroy(c);
    be->ctx = NULL;
    be->ops = NULL;
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
