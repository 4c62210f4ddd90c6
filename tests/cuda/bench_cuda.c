/*
 * Decode benchmark through the library (the GPU machine has no libedit or
 * libmicrohttpd for the full command-line tool): tools/bench_cuda.sh runs it.
 *   bench_cuda pack SRC DST                    int4 pack of a checkpoint
 *   bench_cuda run PACK cpu|cuda resident|stream|mapped GPU_EXPERTS PROMPT DECODE [THREADS]
 * prints prefill and decode tokens/s with the expert and GPU-cache counters. Decode feeds
 * pseudo-random tokens rather than the argmax: the synthetic models' experts are zero, so
 * greedy output would repeat one token and route every step to the same experts.
 * SL_GRAPHS=1 in the environment runs each decode step as a CUDA graph, SL_NO_PDL=1 launches
 * without programmatic dependent launch (for comparison).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

int main(int argc, char **argv) {
    sl_error err = {0};
    if (argc == 4 && !strcmp(argv[1], "pack")) {
        sl_pack_params pp = {.quant = SL_QUANT_INT4};
        if (sl_pack(argv[2], argv[3], &pp, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        return 0;
    }
    if (argc < 8 || strcmp(argv[1], "run")) {
        fprintf(stderr, "usage: bench_cuda pack SRC DST | run PACK cpu|cuda MODE GPU_EXPERTS "
                        "PROMPT DECODE [THREADS]\n");
        return 2;
    }
    sl_model_params mp = {.backend = strcmp(argv[3], "cuda") ? SL_BACKEND_CPU : SL_BACKEND_CUDA,
                          .experts = !strcmp(argv[4], "resident") ? SL_EXPERTS_RESIDENT
                                     : !strcmp(argv[4], "stream") ? SL_EXPERTS_STREAM
                                                                  : SL_EXPERTS_MAPPED,
                          .gpu_experts = atoi(argv[5]),
                          .n_threads = argc > 8 ? atoi(argv[8]) : 0,
                          .graphs = getenv("SL_GRAPHS") != NULL,
                          .cuda = {.no_pdl = getenv("SL_NO_PDL") != NULL}};
    const int32_t P = atoi(argv[6]), N = atoi(argv[7]);
    sl_model *m = NULL;
    sl_session *s = NULL;
    if (sl_model_load(argv[2], &mp, &m, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    sl_session_params sp = {.max_ctx = P + N + 8};
    if (sl_session_create(m, &sp, &s, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    int32_t *ids = malloc((size_t)(P + N) * sizeof(int32_t));
    float *lg = malloc((size_t)info.vocab_size * sizeof(float));
    for (int32_t i = 0; i < P; i++)
        ids[i] = 101 + i;
    if (sl_session_forward(s, ids, P, lg, 0, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    for (int32_t i = 0; i < N; i++) {
        ids[P + i] =
            (int32_t)((7919u * (uint32_t)(i + 1) + (uint32_t)sl_argmax(lg, info.vocab_size)) %
                      (uint32_t)info.vocab_size);
        if (sl_session_forward(s, ids + P + i, 1, lg, 0, &err))
            return fprintf(stderr, "%s\n", err.msg), 1;
    }
    sl_stats st;
    sl_model_get_stats(m, &st);
    printf("%s %s gpu_slots=%d: prefill %d tok %.1f tok/s | decode %d tok %.2f tok/s "
           "(%.3f ms/tok) | experts hit %.1f%% read %.1f MB, repeats %.1f%% | GPU cache %lld/%lld "
           "hits, "
           "%.1f MB copied in %.3f s (layer steps ahead %lld, again %lld) | graphs %lld steps "
           "(%lld replayed), %lld dropped\n",
           argv[3], argv[4], info.gpu_expert_slots, P, P / st.prefill_time, N, N / st.decode_time,
           1e3 * st.decode_time / N,
           st.expert_requests ? 100.0 * st.expert_hits / st.expert_requests : 100.0,
           st.bytes_read / 1e6, st.decode_picks ? 100.0 * st.decode_repeats / st.decode_picks : 0.0,
           (long long)st.gpu_expert_hits, (long long)st.gpu_expert_requests,
           st.gpu_bytes_copied / 1e6, st.gpu_copy_time, (long long)st.gpu_steps_ahead,
           (long long)st.gpu_steps_rerun, (long long)st.graph_steps, (long long)st.graph_replays,
           (long long)st.graph_fallbacks);
    free(ids), free(lg);
    sl_session_free(s);
    sl_model_free(m);
    return 0;
}
