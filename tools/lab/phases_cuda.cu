// What a decode layer's chain of small GEMVs costs as one kernel launch per GEMV (sluice's way
// now, with programmatic dependent launch) against one persistent kernel whose blocks pass a
// grid-wide barrier between GEMVs: the measurement that decides whether a persistent decode-layer
// kernel is worth building (docs/BENCHMARKS.md section 6.4).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o /tmp/phases tools/lab/phases_cuda.cu
//   /tmp/phases [rows per phase, 5120] [phases, 480]
// Each phase is a GEMV of `rows` int4 rows of 2048 weights (1 KB a row; q/k/v of Qwen3-30B-A3B is
// 5120 rows) whose input is the previous phase's output, so phases are truly dependent; the
// weights cycle through buffers totalling well over the L2, as a model's layers do. The
// arithmetic is a stand-in (each nibble widened as sluice does, times x; no scales), the weight
// traffic is the real one.
// Prints, per phase: microseconds and the weight bytes over that time, for
//   launch        one kernel per phase, rows preloaded into registers before the wait
//   persistent    one cooperative kernel, the next phase's rows preloaded before each barrier
//   persistent-np the same without preloading
//   barrier       the persistent kernel with no rows (the barrier alone)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { K = 2048, ROWB = K / 2, CHUNKS = ROWB / 16, WARPS = 4, THREADS = WARPS * 32 };

// A warp's two rows, two 16-byte chunks a lane each (lane, lane + 32): a whole 1 KB row a pair.
struct pre2 {
    uint4 v[2][2];
    bool ok;
};

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void load_pair(pre2 &p, const uint8_t *W, int row, int N) {
    const int lane = threadIdx.x & 31;
    p.ok = row < N;
    if (!p.ok) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const uint4 *w = (const uint4 *)(W + (size_t)min(row + r, N - 1) * ROWB);
        p.v[r][0] = ld_stream(w + lane);
        p.v[r][1] = ld_stream(w + lane + 32);
    }
}

// x staged with 4 floats of padding per 32 (chunk c at c * XP), so the lanes' 16-byte reads of
// consecutive chunks fall on distinct banks (as sluice's stage_x does).
enum { XP = 36 };

__device__ __forceinline__ float dot_chunk(uint4 w, const float *x) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 a = *(const float4 *)(x + 8 * i), b = *(const float4 *)(x + 8 * i + 4);
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += (__uint_as_float(((u[i] >> (4 * j)) & 15u) | 0x4b000000u) - 8388608.0f) * xv[j];
    }
    return s;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rows of one phase, pairs gw, gw + nw, ... (the first from p with use), x staged in xs.
__device__ __forceinline__ void phase_rows(const uint8_t *W, int N, const float *xs, float *y,
                                           int gw, int nw, const pre2 &p, bool use) {
    const int lane = threadIdx.x & 31;
    for (int pair = gw; 2 * pair < N; pair += nw) {
        pre2 q;
        if (use && pair == gw && p.ok)
            q = p;
        else
            load_pair(q, W, 2 * pair, N);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s = dot_chunk(q.v[r][0], xs + lane * XP) + dot_chunk(q.v[r][1], xs + (lane + 32) * XP);
            s = warp_sum(s);
            if (lane == 0 && 2 * pair + r < N) y[2 * pair + r] = s * 1e-3f;
        }
    }
}

__device__ __forceinline__ void stage(float *xs, const float *x) {
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        xs[i / 32 * XP + i % 32] = __ldcg(x + i); // written by other blocks: through L2
    __syncthreads();
}

// --- one launch per phase, with programmatic dependent launch

__global__ void __launch_bounds__(THREADS) one_phase(const uint8_t *W, int N, const float *x, float *y) {
    __shared__ __align__(16) float xs[CHUNKS * XP];
    pre2 p;
    load_pair(p, W, 2 * (blockIdx.x * WARPS + threadIdx.x / 32), N);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    stage(xs, x);
    phase_rows(W, N, xs, y, blockIdx.x * WARPS + threadIdx.x / 32, gridDim.x * WARPS, p, true);
}

// --- one persistent kernel, a grid barrier between phases

__device__ unsigned bar_count, bar_gen;

__device__ __forceinline__ void grid_barrier(unsigned nblocks, unsigned &gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&bar_count, 1u) == nblocks - 1) {
            bar_count = 0;
            __threadfence();
            atomicExch(&bar_gen, gen + 1);
        } else {
            unsigned g;
            do
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(g) : "l"(&bar_gen));
            while (g == gen);
        }
    }
    gen++;
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS)
    persistent(const uint8_t *W0, size_t wstride, int nbuf, int N, int P, float *y0, float *y1,
               int preload) {
    __shared__ __align__(16) float xs[CHUNKS * XP];
    unsigned gen = *(volatile unsigned *)&bar_gen;
    const int gw = blockIdx.x * WARPS + threadIdx.x / 32, nw = gridDim.x * WARPS;
    pre2 p;
    p.ok = false;
    if (preload) load_pair(p, W0, 2 * gw, N);
    for (int ph = 0; ph < P; ph++) {
        const uint8_t *W = W0 + (size_t)(ph % nbuf) * wstride;
        const float *x = ph & 1 ? y1 : y0;
        float *y = ph & 1 ? y0 : y1;
        if (N) {
            stage(xs, x);
            phase_rows(W, N, xs, y, gw, nw, p, preload);
            if (preload) load_pair(p, W0 + (size_t)((ph + 1) % nbuf) * wstride, 2 * gw, N);
        }
        grid_barrier(gridDim.x, gen);
    }
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 5120, P = argc > 2 ? atoi(argv[2]) : 480;
    if (N < K || N % 2 || P < 2) {
        fprintf(stderr, "rows must be even and >= %d, phases >= 2\n", K);
        return 1;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t wstride = ((size_t)N * ROWB + 4095) & ~(size_t)4095;
    const int nbuf = (int)((((size_t)prop.l2CacheSize * 6) + wstride - 1) / wstride); // 6x the L2
    uint8_t *W;
    float *y0, *y1;
    CK(cudaMalloc(&W, wstride * nbuf));
    CK(cudaMemset(W, 0x35, wstride * nbuf));
    CK(cudaMalloc(&y0, (size_t)N * 4));
    CK(cudaMalloc(&y1, (size_t)N * 4));
    CK(cudaMemset(y0, 0, (size_t)N * 4));
    CK(cudaMemset(y1, 0, (size_t)N * 4));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const double bytes = (double)N * ROWB;
    printf("%s: %d SMs, L2 %d MB; %d phases of %d rows x %d int4 (%.2f MB), %d weight buffers\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, P, N, K, bytes / 1e6, nbuf);

    // launch: one kernel per phase
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((N / 2 + WARPS - 1) / WARPS);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaEventRecord(a, s));
        for (int ph = 0; ph < P; ph++)
            CK(cudaLaunchKernelEx(&cfg, one_phase, (const uint8_t *)(W + (size_t)(ph % nbuf) * wstride), N,
                                  (const float *)(ph & 1 ? y1 : y0), ph & 1 ? y0 : y1));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep) printf("  launch         %7.2f us a phase  %6.0f GB/s\n", ms * 1e3 / P, bytes / (ms * 1e-3 / P) / 1e9);
    }

    // persistent: as many blocks as fit at once
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent, THREADS, 0));
    const char *names[3] = {"persistent", "persistent-np", "barrier"};
    for (int v = 0; v < 3; v++)
        for (int bps = 1; bps <= per_sm; bps *= 2) {
            const int grid = bps * prop.multiProcessorCount;
            int n = v == 2 ? 0 : N, pre = v == 0, PP = P;
            void *args[] = {&W, (void *)&wstride, (void *)&nbuf, &n, &PP, &y0, &y1, &pre};
            float ms = 0;
            for (int rep = 0; rep < 2; rep++) {
                CK(cudaEventRecord(a, s));
                CK(cudaLaunchCooperativeKernel((void *)persistent, grid, THREADS, args, 0, s));
                CK(cudaEventRecord(b, s));
                CK(cudaEventSynchronize(b));
                CK(cudaEventElapsedTime(&ms, a, b));
            }
            printf("  %-14s %7.2f us a phase  %6.0f GB/s  (%d blocks of %d threads, %d a SM)\n",
                   names[v], ms * 1e3 / P, v == 2 ? 0.0 : bytes / (ms * 1e-3 / P) / 1e9, grid,
                   THREADS, bps);
        }
    CK(cudaGetLastError());
    return 0;
}
