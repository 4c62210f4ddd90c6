/*
 * A kernel timeline without Nsight Systems (the GPU machine has none): a preloaded library that
 * records, through CUPTI's activity API, every kernel (GPU start and end) and every runtime
 * call (host start and end), and writes them at exit as CSV lines
 *     kind,start_ns,end_ns,correlation,name       (kind: K kernel, A runtime call)
 * to $TRACE_OUT; a kernel and the call that launched it share the correlation id.
 * tools/lab/trace_summary.py reads it; tools/lab/timeline_cuda.sh builds and runs both.
 *   cc -O2 -shared -fPIC -I$CUDA/include -o trace_cuda.so tools/lab/trace_cuda.c -L$CUDA/lib64 -lcupti
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI want_buffer(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 16u << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                 size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K,%llu,%llu,%u,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->correlationId, k->name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            fprintf(out, "A,%llu,%llu,%u,%u\n", (unsigned long long)a->start,
                    (unsigned long long)a->end, a->correlationId, a->cbid);
        }
    }
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("TRACE_OUT");
    if (!path || !(out = fopen(path, "w"))) return;
    if (cuptiActivityRegisterCallbacks(want_buffer, buffer_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
        fprintf(stderr, "trace_cuda: CUPTI activity API unavailable\n");
        fclose(out), out = NULL;
        return;
    }
    atexit(finish);
}
