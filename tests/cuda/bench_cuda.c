/*
 * Decode benchmark through the library (the GPU machine has no libedit or
 * libmicrohttpd for the full command-line tool): tools/bench_cuda.sh runs it.
 *   bench_cuda pack SRC DST                    int4 pack of a checkpoint
 *   bench_cuda run PACK cpu|cuda resident|stream|mapped GPU_EXPERTS PROMPT DECODE [THREADS]
 * prints prefill and decode tokens/s with the expert and GPU-cache counters. Decode feeds
 * pseudo-random tokens rather than the argmax: the synthetic models' experts are zero, so
 * greedy output would repeat one token and route every step to the same experts.
 * SL_GRAPHS=1 in the environment runs each decode step as a CUDA graph, SL_NO_PDL=1 launches
 * without programmatic dependent launch (for comparison). SL_BATCH=B decodes B sequences
 * together (sl_batch_decode; each prefilled with its own PROMPT tokens): DECODE steps of B
 * tokens, the rate all of them together; SL_BATCH_CHECK=1 also runs each sequence alone beside
 * (not timed apart: for the bits) and counts the rows whose logits differ.
 */
#include <math.h>
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
    const int32_t B = getenv("SL_BATCH") ? atoi(getenv("SL_BATCH")) : 1;
    if (B < 1 || B > 1024) return fprintf(stderr, "SL_BATCH: 1 to 1024\n"), 2;
    sl_session_params sp = {.max_ctx = P + N + 8};
    const int check = getenv("SL_BATCH_CHECK") != NULL;
    sl_session **ss = calloc((size_t)B, sizeof *ss), **alone = calloc((size_t)B, sizeof *alone);
    float *lone = malloc((size_t)info.vocab_size * sizeof(float));
    int64_t differ = 0, argmax_differ = 0;
    double worst = 0; /* the largest relative L2 distance of a row from the sequence alone */
    sl_batch *bt = NULL;
    int32_t *ids = malloc((size_t)(P + N) * sizeof(int32_t)), *step = malloc(B * sizeof(int32_t));
    float *lg = malloc((size_t)B * (size_t)info.vocab_size * sizeof(float));
    if (B > 1 && sl_batch_create(m, B, &bt, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    for (int32_t b = 0; b < B; b++) {
        if (sl_session_create(m, &sp, &ss[b], &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        for (int32_t i = 0; i < P; i++)
            ids[i] = (101 + i + 7 * b) % info.vocab_size;
        if (sl_session_forward(ss[b], ids, P, lg + (size_t)b * (size_t)info.vocab_size, 0, &err))
            return fprintf(stderr, "%s\n", err.msg), 1;
        if (check && (sl_session_create(m, &sp, &alone[b], &err) ||
                      sl_session_forward(alone[b], ids, P, lone, 0, &err)))
            return fprintf(stderr, "%s\n", err.msg), 1;
    }
    s = ss[0];
    sl_stats pre; /* the prompts' counters, then the decode's alone */
    sl_model_get_stats(m, &pre);
    sl_model_reset_stats(m);
    for (int32_t i = 0; i < N; i++) {
        for (int32_t b = 0; b < B; b++)
            step[b] = (int32_t)((7919u * (uint32_t)(i + 1 + 31 * b) +
                                 (uint32_t)sl_argmax(lg + (size_t)b * (size_t)info.vocab_size,
                                                     info.vocab_size)) %
                                (uint32_t)info.vocab_size);
        const sl_status st = B > 1 ? sl_batch_decode(bt, ss, step, B, lg, &err)
                                   : sl_session_forward(s, step, 1, lg, 0, &err);
        if (st) return fprintf(stderr, "%s\n", err.msg), 1;
        for (int32_t b = 0; check && b < B; b++) {
            if (sl_session_forward(alone[b], &step[b], 1, lone, 0, &err))
                return fprintf(stderr, "%s\n", err.msg), 1;
            const float *row = lg + (size_t)b * (size_t)info.vocab_size;
            differ += memcmp(lone, row, (size_t)info.vocab_size * sizeof(float)) != 0;
            double num = 0, den = 0;
            for (int32_t v = 0; v < info.vocab_size; v++)
                num += ((double)row[v] - lone[v]) * ((double)row[v] - lone[v]),
                    den += (double)lone[v] * lone[v];
            worst = fmax(worst, sqrt(num / (den > 0 ? den : 1)));
            argmax_differ += sl_argmax(row, info.vocab_size) != sl_argmax(lone, info.vocab_size);
        }
    }
    if (check)
        printf("batch check: %lld of %d rows differ from the sequence alone (largest relative L2 "
               "%.2e, argmax %lld)\n",
               (long long)differ, B * N, worst, (long long)argmax_differ);
    sl_stats st;
    sl_model_get_stats(m, &st);
    if (B > 1)
        printf("batch %d: decode %d steps of %d, %.2f tok/s together, %.3f MB of experts read and "
               "%.3f MB copied to the GPU a token\n",
               B, N, B, (double)B * N / st.decode_time, st.bytes_read / 1e6 / ((double)B * N),
               st.gpu_bytes_copied / 1e6 / ((double)B * N));
    printf("a step: %.2f ms, attention %.2f, router %.2f, experts %.2f (host clock)\n",
           1e3 * st.decode_time / N, 1e3 * st.t_attention / N, 1e3 * st.t_router / N,
           1e3 * st.t_expert_compute / N);
    printf("%s %s gpu_slots=%d: prefill %d tok %.1f tok/s | decode %d tok %.2f tok/s "
           "(%.3f ms/tok) | experts hit %.1f%% read %.1f MB, repeats %.1f%% | GPU cache %lld/%lld "
           "hits, "
           "%.1f MB copied in %.3f s (layer steps ahead %lld, again %lld) | graphs %lld steps "
           "(%lld replayed), %lld dropped\n",
           argv[3], argv[4], info.gpu_expert_slots, P, P * B / pre.prefill_time, N * B,
           N * B / st.decode_time, 1e3 * st.decode_time / (N * B),
           st.expert_requests ? 100.0 * st.expert_hits / st.expert_requests : 100.0,
           st.bytes_read / 1e6, st.decode_picks ? 100.0 * st.decode_repeats / st.decode_picks : 0.0,
           (long long)st.gpu_expert_hits, (long long)st.gpu_expert_requests,
           st.gpu_bytes_copied / 1e6, st.gpu_copy_time, (long long)st.gpu_steps_ahead,
           (long long)st.gpu_steps_rerun, (long long)st.graph_steps, (long long)st.graph_replays,
           (long long)st.graph_fallbacks);
    free(ids), free(lg), free(step);
    for (int32_t b = 0; b < B; b++)
        sl_session_free(ss[b]), sl_session_free(alone[b]);
    free(ss), free(alone), free(lone);
    sl_batch_free(bt);
    sl_model_free(m);
    return 0;
}
