// GPU memory and PCIe bandwidth, the physical limits the CUDA benchmarks are set against.
//   nvcc -O2 -o /tmp/membw_cuda tools/membw_cuda.cu && /tmp/membw_cuda
// Device: a device-to-device cudaMemcpy of 2 GiB counts read + write bytes.
// PCIe: host-to-device copies of 1 GiB from pinned and from pageable memory.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

static double time_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemcpy(dst, src, n, kind); // warm-up
    cudaEventRecord(a);
    for (int i = 0; i < reps; i++) cudaMemcpy(dst, src, n, kind);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / 1e3 / reps;
}

int main() {
    const size_t big = (size_t)2 << 30, pci = (size_t)1 << 30;
    void *d0, *d1, *hp, *hq;
    if (cudaMalloc(&d0, big) || cudaMalloc(&d1, big) || cudaMallocHost(&hp, pci)) {
        fprintf(stderr, "allocation failed\n");
        return 1;
    }
    hq = malloc(pci);
    memset(hq, 1, pci);
    memset(hp, 1, pci);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    double t = time_copy(d1, d0, big, cudaMemcpyDeviceToDevice, 20);
    printf("%s: device copy %.0f GB/s (read + write)\n", p.name, 2.0 * big / t / 1e9);
    t = time_copy(d0, hp, pci, cudaMemcpyHostToDevice, 10);
    printf("host to device, pinned:   %.1f GB/s\n", pci / t / 1e9);
    t = time_copy(d0, hq, pci, cudaMemcpyHostToDevice, 5);
    printf("host to device, pageable: %.1f GB/s\n", pci / t / 1e9);
    return 0;
}
