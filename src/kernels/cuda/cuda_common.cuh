/*
 * What the CUDA backend's translation units share: the backend context, the
 * error check, weight views and loaders, and the launchers each .cu exports.
 */
#ifndef SL_CUDA_COMMON_CUH
#define SL_CUDA_COMMON_CUH

#include <float.h>
#include <math.h>

#include <tuple>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* The project's headers are C; common.h declares sl_fail etc. outside extern "C". */
extern "C" {
#include "core/common.h"
#include "kernels/ops.h"
}

typedef struct cu_ctx cu_ctx;

/* Every CUDA call is checked. Ops return void, so the first failure is kept in the context (with
 * file:line) and reported by the status op, which the session checks after every forward call. */
void cu_record_error(cu_ctx *c, cudaError_t e, const char *file, int line, const char *call);
#define CUDA_CHECK(c, call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) cu_record_error((c), e_, __FILE__, __LINE__, #call);                \
    } while (0)

#define CUDA_LAUNCHED(c) CUDA_CHECK(c, cudaGetLastError())

/* A decode token's add_rmsnorm left to the next GEMV (add_rmsnorm_next): x_out = x + d and
 * y = rmsnorm(x_out) with w, n wide. The GEMV whose input is y does it while staging that input
 * (stage_x_prenorm in cuda_matmul.cu); before any other op it runs as the add_rmsnorm kernel
 * (cu_norm_flush). x == NULL: none. */
typedef struct cu_prenorm {
    const float *x, *d;
    float *x_out, *y;
    const void *w;
    int wdt, n;
    float eps, w_offset;
} cu_prenorm;
static_assert(sizeof(cu_prenorm) == 5 * 8 + 4 * 4, "cu_prenorm without padding");

struct cu_ctx {
    int gpu;
    int n_sm;
    int q4x;          /* Q4 decode GEMVs on int8-quantised x (cuda_matmul.cu); off: on float x */
    int pdl;          /* programmatic dependent launch (cu_launch), unless sl_cuda_params.no_pdl */
    int tensor_cores; /* prefill products on tensor cores (cuda_mma.cu), unless no_tensor_cores */
    char first_error[512]; /* the first CUDA failure since the last status call ("": none) */
    cu_prenorm pend;       /* the add_rmsnorm_next waiting for it */
    cudaStream_t stream;
    /* Expert copies (to_dev_async) go on a stream of their own: a batch of them waits for the
     * compute stream's work queued before its first copy (ev_compute), and the compute stream
     * waits for the batch at copy_join (ev_copy). copies_open: a batch not yet joined. */
    cudaStream_t copy;
    cudaEvent_t ev_compute, ev_copy;
    int copies_open;
    /* to_host_begin/end: a pinned landing buffer (SL_PEEK_BYTES) filled on the copy stream after
     * the compute stream's work queued so far (ev_compute again), done at ev_peek; where its
     * bytes go, and how many. */
    uint8_t *peek;
    cudaEvent_t ev_peek;
    void *peek_host;
    size_t peek_bytes;
    char name[320];
    /* Device scratch (attention partials, overlapping copies): CU_SCRATCH_MIN at init, then
     * what the largest session needs (cu_reserve, at session creation); never grown by an op. */
    void *scratch;
    size_t scratch_bytes;
    /* Pinned staging ring for small host-to-device copies: to_dev copies the bytes here and
     * queues the transfer without waiting; the ring restarts after a wait for the stream. */
    uint8_t *stage;
    size_t stage_bytes, stage_off;
    /* Device ring of small parameter blocks (matmul_batch's items), reused after a wait, and
     * the host block they are built in (items_bytes each). */
    uint8_t *items, *items_host;
    size_t items_bytes, items_off;
    /* Decode-step graphs (graph_begin/end): in a step (recording it, or replaying the last
     * one), a rule broken in it (the step is then dropped), and the executable graph updated
     * from each recording (dependent launch recorded as programmatic edges). */
    int capturing, broken;
    cudaGraphExec_t exec;
    /* What the last recording queued, in order (cu_rec, cu_replay.cu): while replaying, each
     * launch or copy a step asks for is compared with the next entry (rec_i) and queued only
     * once one differs; a step that matches all of them launches exec as it is. rec_ok: the
     * record holds the whole recording (it fits); rec_valid: it describes exec. */
    int replaying, rec_ok, rec_valid, rec_i, rec_n;
    struct cu_rec *rec;
    uint8_t *rec_args; /* the entries' kernel arguments, CU_REC_ARGS bytes */
    /* Per-step scalars (the position) that kernels read from device memory in a graph step
     * (cu_dyn), so that a step's launches stay the same from token to token: set by the host
     * in dyn_host while the step is queued, copied to dyn by the graph's first node. */
    int32_t *dyn, *dyn_host;
    int dyn_n;
    /* recent steps, those of them that had to record (graphs stop paying when most do:
     * graphs_off, steps then run op by op), and a graph queued since the last wait */
    int graph_diverged, graph_steps_seen, graphs_off, graph_queued;
    /* SL_CUDA_GRAPH_TRACE set: says on stderr where each replayed step stopped matching (a
     * diagnostic for a family whose steps keep recording) */
    int graph_trace;
    unsigned *done;       /* device counter of the router kernel's finished blocks (zero between) */
    unsigned *att_counts; /* [CU_ATT_COUNTS] attention splits finished per item (zero between) */
    int att_path;         /* sl_cuda_att_path (cuda_backend.h): prompt attention's kernel */
    int imma_tile;        /* sl_cuda_set_imma_tile: the int8 GEMM's forced tile height, or 0 */
    unsigned att_smem; /* tiled attention kernels whose shared memory limit is raised, a bit each */
    /* A split model's partitions (copy_peer): recorded on this backend's stream when a later
     * partition takes bytes from it; peers_tried: GPUs whose peer access this one has asked
     * for, a bit each (granted or not: the copy works either way, only slower) */
    cudaEvent_t ev_xfer;
    unsigned long long peers_tried;
};

/* Several GPUs in one process (a split model): every op makes its backend's GPU current first
 * (cu_bind). Set when a backend starts on a GPU other than the first one's. */
extern int cu_multi_gpu;
static inline void cu_bind(const cu_ctx *c) {
    if (cu_multi_gpu) cudaSetDevice(c->gpu);
}

#define CU_ATT_COUNTS 4096
/* The scratch a backend starts with: ops called without a session (the op tests) and overlapping
 * copy2d calls of up to 1 M floats. */
#define CU_SCRATCH_MIN ((size_t)4 << 20)

static inline cu_ctx *cu_of(const sl_backend *be) {
    return (cu_ctx *)be->ctx;
}

/* In a graph step, an operation that would wait for the device (or copy from pageable memory)
 * marks the step broken and is skipped: returns 1 then. */
static inline int cu_refuse_in_graph(cu_ctx *c) {
    if (c->capturing) c->broken = 1;
    return c->capturing;
}

/* The device scratch when it holds `bytes`; else NULL, with the failure recorded for the status
 * op (the caller then launches nothing): an op never allocates. */
void *cu_scratch(const sl_backend *be, size_t bytes);
/* Splits of a decode attention of n_items (token, head) items over max_keys keys (cuda_ops.cu);
 * its scratch is n_items * splits * (head_dim + 2) floats when splits > 1. */
int32_t cu_att_splits(const cu_ctx *c, int32_t n_items, int32_t max_keys);
/* Copies `bytes` of host parameters into the device items ring (queued, no wait) and
 * returns their device address, valid for the kernels queued next. */
void *cu_items(const sl_backend *be, const void *host, size_t bytes);

/* ----------------------------------------------------------- weights */

/* A weight as kernels see it: device pointers plus the row layout. */
typedef struct cu_w {
    const uint8_t *data;
    const uint16_t *scales, *biases; /* Q8/Q4: [N, G] of sdt (BF16, F16, or F32 read as pairs) */
    size_t ws;                       /* bytes per row */
    int64_t K, G;
    int dt;
    int sdt;    /* Q8/Q4: dtype of the scales and biases */
    int gshift; /* Q8/Q4: log2 of the group size (32, 64 or 128: a chunk never spans two) */
    int spare;  /* 0 */
} cu_w;
/* Kernel parameters hold no padding: a graph step compares a launch's arguments with the
 * recording's byte for byte (cu_launch_raw), and padding would hold whatever the stack did. */
static_assert(sizeof(cu_w) == 6 * 8 + 4 * 4, "cu_w without padding");

static inline cu_w cu_w_of(const sl_tensor *t) {
    cu_w w;
    w.data = (const uint8_t *)t->data;
    w.scales = (const uint16_t *)t->scales;
    w.biases = (const uint16_t *)t->biases;
    w.K = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->shape[0];
    w.ws = sl_row_bytes(t->dtype, w.K);
    w.G = sl_tensor_qgroups(t, w.K);
    w.dt = (int)t->dtype;
    w.sdt = (int)sl_tensor_sdtype(t);
    w.gshift = 0;
    while ((1 << w.gshift) < sl_tensor_group(t))
        w.gshift++;
    w.spare = 0;
    return w;
}

/* One product of a batch run as one launch of tiles (gemm_tiled_batch, mma_gemm_batch): its
 * tiles are tile0 .. tile0 + tiles_n * tiles_t - 1 of the launch, row tiles fastest. */
typedef struct cu_gemm_item {
    float *y;
    const float *x;
    cu_w w;
    int N, T, tile0, tiles_n;
} cu_gemm_item;

/* The items and tile map of a batch of products sel[0..n) in tiles of bn rows x bm tokens, copied
 * into the parameter ring: the items' device address (the map's in *map, the tile count in
 * *tiles), or NULL when they do not fit (nothing copied). */
const cu_gemm_item *cu_gemm_items(const sl_backend *be, float *const *y, const float *const *x,
                                  const sl_tensor *const *w, const int32_t *T, const int32_t *sel,
                                  int32_t n, int bn, int bm, unsigned *tiles, const int32_t **map);

/* Tensor-core prefill products (cuda_mma.cu), for T > 4: whether w and x suit them (BF16, Q8 or
 * Q4 weights with groups of 32-128, K % 32 == 0, 16-byte aligned rows); one product; a batch of
 * them (sel[0..n) of the arrays, all suited, one dtype and K) as one launch, 0 when its
 * parameters do not fit the ring (nothing launched). */
bool cu_mma_ok(const cu_ctx *c, const cu_w &w, const float *x, int64_t K);
void cu_mma_matmul(cu_ctx *c, float *y, const float *x, const cu_w &w, const void *b, int bdt,
                   int N, int K, int T);
int cu_mma_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                        const sl_tensor *const *w, const int32_t *T, const int32_t *sel, int32_t n,
                        int K);

/* Q4 prefill products on int8 tensor cores (cuda_imma.cu), for T > 4 while x is quantised to
 * int8 (c->q4x): whether w and x suit them (Q4 with groups of 32-128, K % 64 == 0, 16-byte
 * aligned rows, a scratch that holds one token's quantised x); whether the backend takes them
 * (tensor cores and int8 activations on, and they suit); one product; a batch (sel[0..n) of
 * the arrays, sel NULL: all of them; each suited, one K) as few launches as the scratch allows,
 * 0 when its items differ in group size or their parameters do not fit the ring (nothing
 * launched); the kernels' shared-memory limit, raised once on each device (backend init). */
bool cu_imma_fits(const cu_ctx *c, const cu_w &w, const float *x, int64_t K);
bool cu_imma_ok(const cu_ctx *c, const cu_w &w, const float *x, int64_t K);
void cu_imma_matmul(const sl_backend *be, float *y, const float *x, const cu_w &w, const void *b,
                    int bdt, int N, int K, int T);
int cu_imma_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, const int32_t *sel, int32_t n,
                         int K);
cudaError_t cu_imma_init(void);

__device__ __forceinline__ float cu_bf16(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ float cu_f16(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

/* Element i of a flat F32/F16/BF16 array. */
__device__ __forceinline__ float cu_load_f(const void *p, int dt, size_t i) {
    if (dt == SL_DTYPE_BF16) return cu_bf16(((const uint16_t *)p)[i]);
    if (dt == SL_DTYPE_F16) return cu_f16(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Scale or bias i of a Q8/Q4 weight (p: its scales or biases) in two steps: its raw bits (a
 * load whose result nothing waits for yet), then widened (cu_qparam: both at once). */
__device__ __forceinline__ uint32_t cu_qparam_bits(const uint16_t *p, int sdt, size_t i) {
    if (sdt == SL_DTYPE_BF16 || sdt == SL_DTYPE_F16) return __ldg(p + i);
    return __ldg((const unsigned *)p + i);
}
__device__ __forceinline__ float cu_qparam_widen(uint32_t b, int sdt) {
    if (sdt == SL_DTYPE_BF16) return cu_bf16((uint16_t)b);
    if (sdt == SL_DTYPE_F16) return cu_f16((uint16_t)b);
    return __uint_as_float(b);
}

__device__ __forceinline__ float cu_qparam(const uint16_t *p, int sdt, size_t i) {
    return cu_qparam_widen(cu_qparam_bits(p, sdt, i), sdt);
}

/* w[n][k] of any weight dtype, widened (quantised: q * scale + bias). */
__device__ __forceinline__ float cu_load_w(const cu_w &w, int64_t n, int64_t k) {
    const uint8_t *row = w.data + (size_t)n * w.ws;
    if (w.dt == SL_DTYPE_Q8 || w.dt == SL_DTYPE_Q4) {
        unsigned q = w.dt == SL_DTYPE_Q8 ? row[k] : (row[k >> 1] >> ((k & 1) * 4)) & 15u;
        const size_t g = (size_t)n * (size_t)w.G + (size_t)(k >> w.gshift);
        return (float)q * cu_qparam(w.scales, w.sdt, g) + cu_qparam(w.biases, w.sdt, g);
    }
    return cu_load_f(row, w.dt, (size_t)k);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/*
 * quant.h's int8 quantisation of x as 8 lanes take a 64-column group, lane s holding columns
 * 8 s .. 8 s + 7 in v: m = max |x| over the group (three shuffle steps), xq = rint(x inv),
 * inv = min(127 / m, FLT_MAX) (1.5 2^23 added and taken off: the FADD rounds to nearest even, as
 * rint does; |x inv| <= 127), packed as the nibbles come out of a weight word (lo: xq of the
 * lane's columns 0, 2, 4, 6, a byte each; hi: 1, 3, 5, 7), and the sums over the lane's
 * 32-column chunk (its 4 lanes) of xq (S) and of x (X: each lane's 8 in order, then two butterfly
 * steps: (X_0 + X_2) + (X_1 + X_3)). Every lane of the warp calls it. Decode's (quant_staged) and
 * prefill's (imma_quant) quantisations both run it: the same xq, d = m / 127 and sums.
 */
__device__ __forceinline__ void cu_q8_lane(const float (&v)[8], float &m, uint32_t &lo,
                                           uint32_t &hi, int &S, float &X) {
    m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        m = fmaxf(m, fabsf(v[i]));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float inv = fminf(__fdiv_rn(127.0f, m), FLT_MAX);
    uint32_t q[8];
    S = 0;
    X = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        q[i] = __float_as_uint(__fadd_rn(__fmul_rn(v[i], inv), 12582912.0f)) - 0x4b400000u;
        S += (int)q[i];
        X = __fadd_rn(X, v[i]);
    }
#pragma unroll
    for (int o = 2; o > 0; o >>= 1) {
        X = __fadd_rn(X, __shfl_xor_sync(0xffffffffu, X, o));
        S += __shfl_xor_sync(0xffffffffu, S, o);
    }
    lo = __byte_perm(__byte_perm(q[0], q[2], 0x0040), __byte_perm(q[4], q[6], 0x0040), 0x5410);
    hi = __byte_perm(__byte_perm(q[1], q[3], 0x0040), __byte_perm(q[5], q[7], 0x0040), 0x5410);
}

/* Sums (or maxima) over the block of N values a thread at once, each as block_reduce gives it
 * alone, with one pass of barriers for all; sh holds N x 32 floats; every thread gets the results.
 */
template <bool MAX, int N>
__device__ __forceinline__ void block_reduce_n(float (&v)[N], float (*sh)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int i = 0; i < N; i++) {
        v[i] = MAX ? warp_max(v[i]) : warp_sum(v[i]);
        if (lane == 0) sh[i][warp] = v[i];
    }
    __syncthreads();
    if (warp == 0)
#pragma unroll
        for (int i = 0; i < N; i++) {
            float u = lane < nw ? sh[i][lane] : (MAX ? -INFINITY : 0.0f);
            u = MAX ? warp_max(u) : warp_sum(u);
            if (lane == 0) sh[i][0] = u;
        }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] = sh[i][0];
    __syncthreads();
}

/* Sum (or max) over the block; sh holds 32 floats; every thread gets the result. */
template <bool MAX> __device__ float block_reduce(float v, float *sh) {
    float a[1] = {v};
    block_reduce_n<MAX, 1>(a, (float(*)[32])sh);
    return a[0];
}

/* SwiGLU of one element: what the swiglu op and the fused expert kernel both compute. */
__device__ __forceinline__ float cu_silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

/*
 * Router top-k of one token's E logits p, by one warp, as sl_router_topk: softmax, then k
 * rounds, each taking the best entry ranked after the previous pick (higher probability, ties
 * to the lower id); the weights are renormalised in rank order, and p gets the probabilities.
 * Lane l holds entries l, l + 32, ... in V registers when E <= 32 V (every loop over them
 * unrolled, so they never go to local memory; V is the smallest of 4, 8, 16, 32 that holds
 * them, since each round scans all V: one warp does this alone, so its instruction count is
 * the kernel's tail), else (V = 0) reads them from p; lane r keeps pick r (r < 32), so nothing
 * written is read back. The logits are read through L2 (__ldcg): other blocks may have just
 * written them.
 */
__device__ __forceinline__ bool cu_ranks_before(float p, int i, float q, int j) {
    return p > q || (p == q && i < j);
}

template <int NV>
__device__ __forceinline__ void cu_route_row(int32_t *ids, float *w, float *p, int E, int k,
                                             int renorm) {
    const int lane = threadIdx.x & 31, nv = (E + 31) / 32;
    constexpr bool REG = NV > 0;
    constexpr int V = REG ? NV : 1;
    float v[V];
    float mx = -INFINITY;
    if (REG) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int e = lane + 32 * j;
            v[j] = j < nv && e < E ? __ldcg(p + e) : -INFINITY;
            mx = fmaxf(mx, v[j]);
        }
    } else {
        for (int e = lane; e < E; e += 32)
            mx = fmaxf(mx, __ldcg(p + e));
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    if (REG) {
#pragma unroll
        for (int j = 0; j < V; j++)
            if (j < nv && lane + 32 * j < E) sum += v[j] = expf(v[j] - mx);
    } else {
        for (int e = lane; e < E; e += 32) {
            const float x = expf(__ldcg(p + e) - mx);
            p[e] = x;
            sum += x;
        }
    }
    sum = warp_sum(sum);
    if (REG) {
#pragma unroll
        for (int j = 0; j < V; j++)
            if (j < nv && lane + 32 * j < E) p[lane + 32 * j] = v[j] /= sum;
    } else {
        for (int e = lane; e < E; e += 32)
            p[e] /= sum;
    }
    __syncwarp();
    float prev_p = 0.0f, my_p = 0.0f;
    int prev_i = -1, my_i = 0;
    for (int r = 0; r < k; r++) {
        float bp = 0.0f;
        int bi = -1;
        auto consider = [&](float x, int e) {
            if (prev_i >= 0 && !cu_ranks_before(prev_p, prev_i, x, e)) return;
            if (bi < 0 || cu_ranks_before(x, e, bp, bi)) bp = x, bi = e;
        };
        if (REG) {
#pragma unroll
            for (int j = 0; j < V; j++)
                if (j < nv && lane + 32 * j < E) consider(v[j], lane + 32 * j);
        } else {
            for (int e = lane; e < E; e += 32)
                consider(p[e], e);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || cu_ranks_before(op, oi, bp, bi))) bp = op, bi = oi;
        }
        if (bi < 0) bi = r, bp = __shfl_sync(0xffffffffu, REG ? v[0] : p[lane], r); /* NaN only */
        if (lane == r) my_i = bi, my_p = bp;
        if (r >= 32 && lane == 0) ids[r] = bi, w[r] = bp; /* k > 32: renormalised below */
        prev_p = bp, prev_i = bi;
    }
    float s = 0.0f;
    __syncwarp();
    if (renorm)
        for (int r = 0; r < k; r++) /* rank order, as the CPU sums */
            s += r < 32 ? __shfl_sync(0xffffffffu, my_p, r) : w[r];
    if (lane < k) ids[lane] = my_i, w[lane] = renorm ? my_p / s : my_p;
    if (renorm && k > 32) {
        __syncwarp();
        if (lane == 0)
            for (int r = 32; r < k; r++)
                w[r] /= s;
    }
}

/* The route of one token by the calling warp, in registers when E allows. */
__device__ __forceinline__ void cu_route(int32_t *ids, float *w, float *p, int E, int k,
                                         int renorm) {
    if (E <= 128)
        cu_route_row<4>(ids, w, p, E, k, renorm);
    else if (E <= 256)
        cu_route_row<8>(ids, w, p, E, k, renorm);
    else if (E <= 512)
        cu_route_row<16>(ids, w, p, E, k, renorm);
    else if (E <= 1024)
        cu_route_row<32>(ids, w, p, E, k, renorm);
    else
        cu_route_row<0>(ids, w, p, E, k, renorm);
}

/*
 * Whether the calling block is the last of n blocks to get here, counted on *count (reset to 0
 * for the next launch by that block); all threads of the block call it. The last block sees
 * every block's global writes made before the call (read them through L2: __ldcg). The idiom of
 * cooperative groups' grid sync: a barrier, then one thread's fences around the atomic.
 */
__device__ __forceinline__ bool cu_last_block(unsigned *count, unsigned n) {
    __shared__ unsigned last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(count, 1u) == n - 1;
        if (last) {
            __threadfence();
            *count = 0;
        }
    }
    __syncthreads();
    return last;
}

/* cp.async (sm_80 on): 16 bytes from global src to shared memory at dst (a shared-space address,
 * cu_saddr) through L2, L1 bypassed; cu_cp16_or_zero writes 16 zero bytes instead when !ok
 * (src-size 0: nothing read; src must still be a valid address). A thread's copies since its
 * last cu_cp_commit form a group; cu_cp_wait<N> returns when no more than its N latest groups
 * are in flight (the others have landed). */
__device__ __forceinline__ uint32_t cu_saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cu_cp16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cu_cp16_or_zero(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cu_cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/*
 * Programmatic dependent launch (Hopper): cu_launch lets a kernel start launching before the
 * previous kernel of the stream has finished, and every kernel begins with cu_pdl_wait, which
 * waits for that kernel (its writes are then visible, as with plain stream order) and then lets
 * the next kernel start launching. A decode layer is nine dependent kernels of 3-13 us, so each
 * one's launch and block scheduling overlap the previous one's tail. Without the launch
 * attribute both instructions do nothing. sl_cuda_params.no_pdl (--cuda-no-pdl) turns it off.
 * Each kernel's bits are the same either way.
 */
__device__ __forceinline__ void cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Queues kernel fn with its n arguments (args[i]: size[i] bytes) on c's compute stream, with the
 * dependent-launch attribute when c->pdl; in a graph step also recorded (cu_rec), or while
 * replaying compared with the recording instead (cuda_backend.cu). */
void cu_launch_raw(cu_ctx *c, const void *fn, dim3 grid, dim3 block, size_t smem, void **args,
                   const size_t *size, int n);
/* cudaMemcpyAsync on c's compute stream, recorded (or compared) in a graph step as a launch is. */
void cu_copy(cu_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);

template <typename... KArgs, size_t... I>
static void cu_launch_held(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cu_ctx *c,
                           std::tuple<KArgs...> &held, std::index_sequence<I...>) {
    void *args[] = {(void *)&std::get<I>(held)..., nullptr};
    const size_t size[] = {sizeof(KArgs)..., 0};
    cu_launch_raw(c, (const void *)kernel, grid, block, smem, args, size, (int)sizeof...(KArgs));
}

/* Launches kernel on c's compute stream (cu_launch_raw), its arguments converted to the kernel's
 * parameter types first, as the typed cudaLaunchKernelEx does. */
template <typename... KArgs, typename... Args>
static void cu_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cu_ctx *c,
                      Args &&...args) {
    static_assert(sizeof...(KArgs) == sizeof...(Args), "one argument a kernel parameter");
    std::tuple<KArgs...> held(static_cast<Args &&>(args)...);
    cu_launch_held(kernel, grid, block, smem, c, held, std::index_sequence_for<KArgs...>{});
}

/* In a graph step, moves the per-step scalar *v (a decode step's position, a kernel argument)
 * to device memory: returns its address there for the kernel to read instead, and sets *v to 0,
 * so that the launch's arguments stay the same from step to step. Outside one: NULL, *v as it
 * was (the kernel takes it). Equal values share a slot. */
#define CU_DYN_N 32
static inline const int32_t *cu_dyn(cu_ctx *c, int32_t *v) {
    if (!c->capturing) return NULL;
    int i = 0;
    while (i < c->dyn_n && c->dyn_host[i] != *v)
        i++;
    if (i == CU_DYN_N) { /* more than a step has ever needed: run it op by op */
        c->broken = 1;
        return NULL;
    }
    if (i == c->dyn_n) c->dyn_host[c->dyn_n++] = *v;
    *v = 0;
    return c->dyn + i;
}

static inline unsigned cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 0x7fffffffu ? 0x7fffffffu : b);
}

/* Launchers, one per op, defined in cuda_matmul.cu and cuda_ops.cu. */
void cu_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                     const sl_tensor *const *w, const int32_t *T, int32_t n);
void cu_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
               const sl_tensor *bias, int32_t T);
int cu_moe_experts(const sl_backend *be, float *y, float *act, const float *x, const int32_t *ids,
                   const float *w, const sl_expert_ptrs *table, const sl_tensor *const proto[3],
                   int32_t T, int32_t k);
void cu_moe_route(const sl_backend *be, const sl_route_args *a);
void cu_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
              int32_t T);
/* The same ops for ggml's block types (cuda_blocks.cu), which the four above hand them to. */
/* Hugging Face's block-wise FP8 (cuda_fp8.cu). */
void cu_fp8_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
void cu_fp8_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n);
int cu_fp8_moe_experts(const sl_backend *be, float *y, float *act, const float *x,
                       const int32_t *ids, const float *w, const sl_expert_ptrs *table,
                       const sl_tensor *const proto[3], int32_t T, int32_t k);
void cu_fp8_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T);
void cu_blk_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
void cu_blk_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n);
int cu_blk_moe_experts(const sl_backend *be, float *y, float *act, const float *x,
                       const int32_t *ids, const float *w, const sl_expert_ptrs *table,
                       const sl_tensor *const proto[3], int32_t T, int32_t k);
void cu_blk_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T);

void cu_copy2d(const sl_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
               int32_t rows, int32_t cols);
void cu_copy_rows(const sl_backend *be, float *dst, const int32_t *dst_idx, const float *src,
                  const int32_t *src_idx, int32_t n, int32_t cols);
void cu_fill(const sl_backend *be, float *dst, float v, size_t n);
void cu_rmsnorm(const sl_backend *be, float *y, const float *x, const sl_tensor *w, int32_t rows,
                int32_t n, float eps, float w_offset);
void cu_add_rmsnorm(const sl_backend *be, float *y, float *x, const float *d, const sl_tensor *w,
                    int32_t rows, int32_t n, float eps, float w_offset);
void cu_add_rmsnorm_next(const sl_backend *be, float *y, float *x_out, const float *x,
                         const float *d, const sl_tensor *w, int32_t rows, int32_t n, float eps,
                         float w_offset);
/* Launches the pending add_rmsnorm_next, if any (every op but its consumers calls it first). */
void cu_norm_flush(const sl_backend *be);
/* The pending add_rmsnorm_next for a GEMV of T tokens reading x, K wide that can stage its input
 * normalised (ok): taken (returned, no longer pending), else launched; {} when none. */
cu_prenorm cu_norm_take(const sl_backend *be, const float *x, int32_t T, int64_t K, int ok);
void cu_qkv_prep(const sl_backend *be, const sl_qkv_args *a);
void cu_rope(const sl_backend *be, float *x, int32_t T, int32_t n_heads, int32_t head_dim,
             int32_t rot_dim, int32_t pos0, const float *cos_tab, const float *sin_tab);
void cu_attention(const sl_backend *be, const sl_attn_args *a);
void cu_latent_attention(const sl_backend *be, const sl_latent_attn_args *a); /* cuda_mla.cu */
void cu_swiglu(const sl_backend *be, float *out, const float *gate, const float *up, size_t n);
void cu_act_mul(const sl_backend *be, float *out, const float *gate, const float *up, size_t n,
                sl_act act);
void cu_swiglu_clamped(const sl_backend *be, float *out, const float *gate, const float *up,
                       size_t n, float alpha, float limit);
void cu_add_bias(const sl_backend *be, float *y, const sl_tensor *b, int32_t rows);
void cu_axpy(const sl_backend *be, float *y, float s, const float *x, size_t n);
void cu_clamp(const sl_backend *be, float *x, size_t n, float lo, float hi);
void cu_scale_rows(const sl_backend *be, float *y, const float *x, const float *s, int32_t rows,
                   int32_t rep, int32_t n);
void cu_weighted_sum(const sl_backend *be, float *y, const float *x, const int32_t *rows,
                     const float *w, int32_t T, int32_t k, int32_t n);
void cu_sigmoid_mul(const sl_backend *be, float *y, const float *gate, size_t n);
void cu_l2norm(const sl_backend *be, float *x, int32_t rows, int32_t n, float eps);
void cu_conv1d_silu(const sl_backend *be, float *y, const float *x, int32_t T, int32_t C,
                    const sl_tensor *w, int32_t K, int32_t d, float *state);
void cu_delta_rule(const sl_backend *be, const sl_delta_args *a);
void cu_gated_rmsnorm(const sl_backend *be, float *y, const float *x, const float *z,
                      const sl_tensor *w, int32_t rows, int32_t n, float eps, sl_act gate);
void cu_activate(const sl_backend *be, float *y, const float *x, size_t n, float div, float mul,
                 sl_act act);
void cu_hc_inject(const sl_backend *be, float *w, const float *out, const float *inj, int32_t T,
                  int32_t hc, int32_t n);
void cu_hc_mix(const sl_backend *be, float *y, const float *w, const float *x, int32_t T,
               int32_t hc, int32_t n);
void cu_ple_gate(const sl_backend *be, float *y, const float *key, const float *query,
                 const float *value, int32_t T, int32_t hc, int32_t n);
void cu_qsa_scores(const sl_backend *be, float *scores, const float *q, const float *keys,
                   int32_t n_heads, int32_t n_blocks, int32_t d);

#endif /* SL_CUDA_COMMON_CUH */
