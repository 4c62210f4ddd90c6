/*
 * What a kernel launch costs on this GPU and host, for the decode-step graphs decision
 * (docs/BENCHMARKS.md, section 6.1): host time per launch of an empty kernel, per launch while
 * recording a graph, per node to replay and to update an instantiated graph.
 *   nvcc -O2 -o /tmp/launch_cuda tools/lab/launch_cuda.cu && /tmp/launch_cuda
 */
#include <cstdio>
#include <chrono>
#include <cuda_runtime.h>
__global__ void k_empty(float *p, int n) { if (p && threadIdx.x == 0 && blockIdx.x == 0 && n < 0) p[0] = 1; }
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
    cudaStream_t s; cudaStreamCreate(&s);
    float *d; cudaMalloc(&d, 4);
    for (int i = 0; i < 100; i++) k_empty<<<64, 128, 0, s>>>(d, i);
    cudaStreamSynchronize(s);
    const int N = 20000;
    double t0 = now();
    for (int i = 0; i < N; i++) { k_empty<<<64, 128, 0, s>>>(d, i); cudaGetLastError(); }
    double t1 = now();
    cudaStreamSynchronize(s);
    double t2 = now();
    printf("launch: host %.2f us/launch, wall %.2f us/kernel\n", (t1 - t0) / N * 1e6, (t2 - t0) / N * 1e6);
    cudaGraph_t g; cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    const int M = 1000;
    t0 = now();
    for (int i = 0; i < M; i++) k_empty<<<64, 128, 0, s>>>(d, i);
    t1 = now();
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    t2 = now();
    printf("capture: %.2f us/launch; instantiate %.1f us\n", (t1 - t0) / M * 1e6, (t2 - t1) * 1e6);
    cudaGraphLaunch(ge, s); cudaStreamSynchronize(s);
    t0 = now();
    for (int r = 0; r < 20; r++) cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    t1 = now();
    printf("graph: %.2f us/node\n", (t1 - t0) / (20.0 * M) * 1e6);
    // update cost
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    for (int i = 0; i < M; i++) k_empty<<<64, 128, 0, s>>>(d, i + 1);
    cudaGraph_t g2; cudaStreamEndCapture(s, &g2);
    t0 = now();
    cudaGraphExecUpdateResultInfo info;
    cudaGraphExecUpdate(ge, g2, &info);
    t1 = now();
    printf("exec update: %.2f us/node\n", (t1 - t0) / M * 1e6);
    return 0;
}
