/* Fuzz target: the routing-trace reader (moe/trace.h), then what replays a trace it accepts:
 * the grouping into requests, a policy's replay with prefetch, and Belady's optimum. */
#include "moe/cache_sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_trace t;
    sl_error err = {0};
    if (sl_trace_parse(&t, "fuzz.sltrace", data, size, &err) != SL_OK) return 0;
    SL_ASSERT(t.off[t.n_records] <= (int64_t)size);
    sl_requests r;
    if (sl_requests_build(&r, &t, &err) == SL_OK) {
        const int32_t slots = 1 + (int32_t)(size % 5);
        sl_sim_result a, b;
        if (sl_cache_sim(&r, slots, (sl_cache_policy)(size % 3), 0, 1, &a, &err) == SL_OK &&
            sl_cache_belady(&r, slots, &b, &err) == SL_OK) {
            SL_ASSERT(a.requests == b.requests && b.hits <= b.requests);
            SL_ASSERT(a.predicted_right <= a.predicted && a.wasted <= a.inserts);
        }
        sl_requests_free(&r);
    }
    sl_trace_free(&t);
    return 0;
}
