/*
 * The floor under a decode step (docs/BENCHMARKS.md, section 6.10): a step's chain of dependent
 * phases, first with no weights at all, then with each phase reading as many bytes as sluice's
 * kernel for it reads. 48 layers of the six phases sluice's decode runs at Qwen3-30B-A3B shapes
 * (q/k/v, attention, o-proj, router, gate/up, down), each a grid of the size sluice's kernel for
 * it uses. Every block of a phase reads the whole vector the previous phase wrote (as a GEMV
 * needs all of its input), reduces it and writes its part of the next one. No arithmetic on the
 * weights: what is measured is synchronisation and reading. Ways of running it:
 *   stream     separate kernels in plain stream order;
 *   pdl        separate kernels with programmatic dependent launch as sluice uses it (wait
 *              first, then let the next kernel launch); also with every phase a block a SM;
 *   graph      the chain captured once as a CUDA graph and replayed (with dependent launch,
 *              "graph pdl", its edges are programmatic);
 *   barrier    one persistent kernel (cooperative launch, B blocks a SM) with a grid barrier
 *              between phases.
 * With weights ("+ w"), a block reads its share of the phase's bytes (16-byte streaming loads,
 * each layer its own, so L2 holds none of them from one step to the next) after its wait.
 * "early": before the wait, as if every phase knew its weights in advance (gate/up does not: its
 * experts come from the router); "chained": also letting the next kernel launch first thing, so
 * that several phases' reads are in flight ("chained, gu": all but gate/up, which reads after its
 * wait and lets the next kernel go only then, as it must). For the barrier: "ahead" holds the next
 * phase's share in registers before arriving (gate/up's only after the router's barrier, as it
 * must), "ahead all" gate/up's too. No decode built in one of these ways runs faster on this GPU
 * than its line here.
 *
 *   nvcc -O3 -arch=sm_90 -o /tmp/floor_cuda tools/lab/floor_cuda.cu && /tmp/floor_cuda
 */
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

#define HID 2048 /* the vector every phase reads: the hidden size */
#define TH  256  /* threads a block, as sluice's GEMV blocks */
#define OUT 16   /* floats a block writes */
static_assert(HID == 8 * TH, "a thread reads 8 floats of the vector");
#define LAYERS  48
#define PHASES  6
#define GATE_UP 4 /* the phase whose weights the router picks */
#define MAXG    640
#define AHEAD   28 /* 16-byte words a thread holds for the barrier's next phase */
/* Blocks a phase, from the probe's table (section 6.9), and its bytes at int4 in sluice's pack
 * (section 6: attention projections 509 MB, routers 25 MB, 8 experts of 2.65 MB a layer, of which
 * gate and up are two thirds); attention's few cache rows count as none. */
__host__ __device__ constexpr int grid_of(int p) {
    return p == 0 ? 640 : p == 1 ? 48 : p == 2 ? 256 : p == 3 ? 128 : p == 4 ? 384 : 256;
}
__host__ __device__ constexpr size_t bytes_of(int p) {
    return 1000 * (size_t)(p == 0   ? 5900
                           : p == 1 ? 0
                           : p == 2 ? 4700
                           : p == 3 ? 520
                           : p == 4 ? 14100
                                    : 7070);
}
__host__ __device__ constexpr size_t layer_bytes(int upto = PHASES) {
    return upto == 0 ? 0 : bytes_of(upto - 1) + layer_bytes(upto - 1);
}

/* The vector phase p reads (phase p - 1 wrote it): two buffers of MAXG blocks' outputs in turn. */
__host__ __device__ inline float *vec(float *buf, int p) {
    return buf + (p & 1) * MAXG * OUT;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Share b of ns of step-phase p's weights: its 16-byte words [lo, hi) from the pointer returned. */
__device__ __forceinline__ const uint4 *share(const uint4 *w, int p, int b, int ns, size_t &lo,
                                              size_t &hi) {
    const size_t n = bytes_of(p % PHASES) / 16, per = (n + ns - 1) / ns;
    lo = (size_t)b * per;
    hi = lo + per < n ? lo + per : n;
    return w + ((size_t)(p / PHASES) * layer_bytes() + layer_bytes(p % PHASES)) / 16;
}

/* Block b's share of phase p's weights (none when w is null), folded into a word so that the
 * loads stay. */
__device__ __forceinline__ unsigned read_w(const uint4 *w, int p, int b) {
    if (!w) return 0;
    size_t lo, hi;
    const uint4 *q = share(w, p, b, grid_of(p % PHASES), lo, hi);
    unsigned acc = 0;
#pragma unroll 8
    for (size_t i = lo + threadIdx.x; i < hi; i += TH) {
        const uint4 v = __ldcs(q + i);
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    return acc;
}

/* Block b's share of a phase: all of x (8 floats a thread, through L2, where the previous phase's
 * writes are), a block sum, OUT floats of y. */
__device__ __forceinline__ void phase_body(const float *x, float *y, int b, unsigned acc) {
    __shared__ float part[TH / 32];
    const float4 *x4 = (const float4 *)x;
    const float4 a = __ldcg(x4 + threadIdx.x), c = __ldcg(x4 + threadIdx.x + TH);
    float s = a.x + a.y + a.z + a.w + c.x + c.y + c.z + c.w + (float)(acc & 1) * 1e-30f;
    for (int o = 16; o; o >>= 1)
        s += __shfl_xor_sync(~0u, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < OUT) {
        float t = 0.0f;
        for (int w = 0; w < TH / 32; w++)
            t += part[w];
        y[b * OUT + threadIdx.x] = t * 1e-4f + (float)threadIdx.x;
    }
    __syncthreads(); /* part is reused by the block's next share */
}

/* EARLY: 0 weights after the wait, 1 before it, 2 before it with the next kernel let go first. */
template <bool PDL, int EARLY>
__global__ void __launch_bounds__(TH) k_phase(const float *x, float *y, const uint4 *w, int p) {
    if (EARLY == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned acc = EARLY ? read_w(w, p, blockIdx.x) : 0;
    if (PDL) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        if (EARLY != 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    if (!EARLY) acc = read_w(w, p, blockIdx.x);
    phase_body(x, y, blockIdx.x, acc);
}

/* Arrive at barrier n (1, 2, ...) of a counter that only grows: done when every block of the grid
 * has arrived n times. */
__device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned nb, unsigned n) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned v;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        while (v < n * nb);
    }
    __syncthreads();
}

/* The barrier's read of a phase into registers: block b's 1/gridDim share, up to AHEAD words a
 * thread. */
struct held {
    uint4 v[AHEAD];
    __device__ __forceinline__ void load(const uint4 *w, int p) {
        size_t lo, hi;
        const uint4 *q = share(w, p, blockIdx.x, gridDim.x, lo, hi);
#pragma unroll
        for (int j = 0; j < AHEAD; j++) {
            const size_t i = lo + threadIdx.x + (size_t)j * TH;
            v[j] = i < hi ? __ldcs(q + i) : make_uint4(0, 0, 0, 0);
        }
    }
    __device__ __forceinline__ unsigned fold() const {
        unsigned acc = 0;
#pragma unroll
        for (int j = 0; j < AHEAD; j++)
            acc += v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
        return acc;
    }
};

/* AHEAD_MODE: 0 each phase's weights after its barrier (read_w); 1 the next phase's held before
 * arriving, except gate/up's; 2 all of them. */
template <int AHEAD_MODE>
__global__ void __launch_bounds__(TH)
    k_persist(float *buf, const uint4 *w, unsigned *bar, int steps) {
    unsigned n = 0;
    held h;
    if (AHEAD_MODE) h.load(w, 0);
    for (int st = 0; st < steps; st++)
        for (int p = 0; p < LAYERS * PHASES; p++) {
            const float *x = vec(buf, p);
            float *y = vec(buf, p + 1);
            const unsigned acc = AHEAD_MODE ? h.fold() : 0;
            for (int b = blockIdx.x; b < grid_of(p % PHASES); b += gridDim.x)
                phase_body(x, y, b, AHEAD_MODE ? acc : read_w(w, p, b));
            const int q = (p + 1) % (LAYERS * PHASES);
            const bool late = AHEAD_MODE == 1 && q % PHASES == GATE_UP;
            if (AHEAD_MODE && !late) h.load(w, q);
            grid_barrier(bar, gridDim.x, ++n);
            if (late) h.load(w, q);
        }
}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* One step's kernels (early: k_phase's EARLY, 3 as 2 but 0 for gate/up); flat > 0: every phase
 * that many blocks. */
static cudaError_t step(cudaStream_t s, float *buf, const uint4 *w, bool pdl, int early,
                        int flat = 0) {
    for (int p = 0; p < LAYERS * PHASES; p++) {
        const float *x = vec(buf, p);
        float *y = vec(buf, p + 1);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(flat ? flat : grid_of(p % PHASES));
        cfg.blockDim = dim3(TH);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = pdl ? 1 : 0;
        const int e_ = early == 3 ? (p % PHASES == GATE_UP ? 0 : 2) : early;
        void (*k)(const float *, float *, const uint4 *, int) = !pdl      ? k_phase<false, 0>
                                                                : e_ == 2 ? k_phase<true, 2>
                                                                : e_      ? k_phase<true, 1>
                                                                          : k_phase<true, 0>;
        cudaError_t e = cudaLaunchKernelEx(&cfg, k, x, y, w, p);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* sluice's figures for this model (section 6): the HBM limit, 1.73 GB a token at 4,281 GB/s. */
#define HBM_TOKS 2458.0
static void report(const char *what, double s_per_step, bool w) {
    const double us_layer = s_per_step / LAYERS * 1e6;
    printf("%-26s %6.3f ms/step %6.2f us/layer %5.2f us/phase  at most %5.0f tok/s (%4.1f%% of the "
           "HBM limit)",
           what, s_per_step * 1e3, us_layer, us_layer / PHASES, 1.0 / s_per_step,
           100.0 / s_per_step / HBM_TOKS);
    if (w) printf(", weights at %4.0f GB/s", LAYERS * layer_bytes() / s_per_step / 1e9);
    printf("\n");
}

int main() {
    const int N = 100; /* steps timed, after 10 to warm up */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int nsm = prop.multiProcessorCount;
    printf("%s, %d SMs; %d layers x %d phases of 48..%d blocks x %d threads, %.1f MB of weights a "
           "layer; a layer's budget at 60%% of %.0f tok/s: %.2f us\n",
           prop.name, nsm, LAYERS, PHASES, MAXG, TH, layer_bytes() / 1e6, HBM_TOKS,
           1e6 / (0.6 * HBM_TOKS * LAYERS));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf;
    unsigned *bar;
    uint4 *wts;
    CK(cudaMalloc(&buf, 2 * MAXG * OUT * sizeof(float)));
    CK(cudaMemset(buf, 0, 2 * MAXG * OUT * sizeof(float)));
    CK(cudaMalloc(&bar, sizeof(unsigned)));
    CK(cudaMalloc(&wts, LAYERS * layer_bytes()));
    CK(cudaMemset(wts, 1, LAYERS * layer_bytes()));

    struct {
        const char *what;
        bool w, pdl;
        int early, flat;
        bool graph;
    } runs[] = {
        {"stream", 0, 0, 0, 0, 0},
        {"pdl", 0, 1, 0, 0, 0},
        {"pdl, a block a SM", 0, 1, 0, nsm, 0},
        {"stream + w", 1, 0, 0, 0, 0},
        {"pdl + w", 1, 1, 0, 0, 0},
        {"pdl + w early", 1, 1, 1, 0, 0},
        {"graph", 0, 0, 0, 0, 1},
        {"graph + w", 1, 0, 0, 0, 1},
        {"graph pdl", 0, 1, 0, 0, 1},
        {"graph pdl + w", 1, 1, 0, 0, 1},
        {"graph pdl + w early", 1, 1, 1, 0, 1},
        {"graph pdl + w chained", 1, 1, 2, 0, 1},
        {"graph pdl + w chained, gu", 1, 1, 3, 0, 1},
    };
    for (auto &r : runs) {
        const uint4 *w = r.w ? wts : nullptr;
        cudaGraphExec_t ge = nullptr;
        if (r.graph) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
            const cudaError_t e = step(s, buf, w, r.pdl, r.early, r.flat);
            CK(cudaStreamEndCapture(s, &g));
            if (e != cudaSuccess) { /* recording dependent launches needs CUDA 12.3 */
                printf("%-26s not recorded: %s\n", r.what, cudaGetErrorString(e));
                continue;
            }
            CK(cudaGraphInstantiate(&ge, g, 0));
        }
        double t0 = 0;
        for (int i = 0; i < 10 + N; i++) {
            if (i == 10) {
                CK(cudaStreamSynchronize(s));
                t0 = now();
            }
            CK(ge ? cudaGraphLaunch(ge, s) : step(s, buf, w, r.pdl, r.early, r.flat));
        }
        CK(cudaStreamSynchronize(s));
        report(r.what, (now() - t0) / N, r.w);
    }

    struct {
        const char *what;
        void *k;
        int w;
    } persist[] = {{"barrier", (void *)k_persist<0>, 0},
                   {"barrier + w", (void *)k_persist<0>, 1},
                   {"barrier + w ahead", (void *)k_persist<1>, 1},
                   {"barrier + w ahead all", (void *)k_persist<2>, 1}};
    for (auto &r : persist)
        for (int b = 1; b <= 4; b *= 2) {
            int per_sm = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)r.k, TH, 0));
            const size_t most = bytes_of(GATE_UP) / 16 / TH / (b * nsm) + 1;
            if (b > per_sm || (r.k != (void *)k_persist<0> && most > AHEAD)) continue;
            const int nb = b * nsm;
            const uint4 *w = r.w ? wts : nullptr;
            int steps = 10;
            void *args[] = {&buf, &w, &bar, &steps};
            CK(cudaMemset(bar, 0, sizeof(unsigned)));
            CK(cudaLaunchCooperativeKernel(r.k, dim3(nb), dim3(TH), args, 0, s));
            CK(cudaStreamSynchronize(s));
            steps = N;
            CK(cudaMemset(bar, 0, sizeof(unsigned)));
            CK(cudaStreamSynchronize(s));
            const double t0 = now();
            CK(cudaLaunchCooperativeKernel(r.k, dim3(nb), dim3(TH), args, 0, s));
            CK(cudaStreamSynchronize(s));
            char what[64];
            snprintf(what, sizeof what, "%s, %d blocks/SM", r.what, b);
            report(what, (now() - t0) / N, r.w);
        }
    return 0;
}
