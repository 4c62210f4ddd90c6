/*
 * llama.cpp's logits for a GGUF file, the reference of the quantised-GGUF tests
 * (tools/make_gguf_quant_refs.sh builds and runs it; never part of sluice's build).
 *
 *   llama_ref_logits MODEL.gguf IDS N LOGITS.f32 GREEDY.txt
 *
 * IDS: comma-separated prompt ids. Writes the logits of every prompt position (T x V float32,
 * little-endian) from one batch, then decodes N greedy tokens one at a time through the KV
 * cache and writes them comma-separated. CPU backend, 2 threads, F32 KV cache, no flash
 * attention: the plainest llama.cpp path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS N LOGITS.f32 GREEDY.txt\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    int32_t ids[4096], n = 0;
    for (char *p = argv[2]; *p && n < 4096;) {
        ids[n++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',') p++;
    }
    const int steps = atoi(argv[3]);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return fprintf(stderr, "cannot load %s\n", argv[1]), 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return fprintf(stderr, "cannot make a context\n"), 1;
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(512, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    if (llama_decode(ctx, b)) return fprintf(stderr, "decode failed\n"), 1;
    FILE *f = fopen(argv[4], "wb");
    for (int i = 0; i < n; i++)
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)V, f);
    fclose(f);
    FILE *g = fopen(argv[5], "w");
    int last = n - 1;
    for (int s = 0; s < steps; s++) {
        const float *l = llama_get_logits_ith(ctx, last);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (l[v] > l[best]) best = v;
        fprintf(g, "%s%d", s ? "," : "", best);
        b.n_tokens = 1;
        b.token[0] = best;
        b.pos[0] = n + s;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        if (llama_decode(ctx, b)) return fprintf(stderr, "decode failed\n"), 1;
        last = 0;
    }
    fprintf(g, "\n");
    fclose(g);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
