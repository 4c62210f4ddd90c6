/*
 * Tokenizer encoding speed (make bench): 4 MB of tests/tokenizer/corpus.jsonl, its lines
 * repeated, through Qwen3's byte-level BPE and the SentencePiece-style BPE of
 * tests/tokenizer/lenml_llama2; prints tokens/s and MB/s. Correctness is the unit tests' (the
 * reference ids of test_tokenizer.c); this only measures.
 *
 *   bench_tokenizer [fixtures-dir]   (tests/tokenizer sits beside it)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "tokenizer/tokenizer.h"

#define SPEED_BYTES (4u << 20)

/* The corpus's strings, one a line, repeated up to SPEED_BYTES; NULL (error printed). */
static char *corpus_text(const char *dir, size_t *len) {
    char p[1024];
    snprintf(p, sizeof p, "%s/corpus.jsonl", dir);
    char *data = NULL;
    size_t n = 0;
    sl_error err = {0};
    if (sl_read_file(p, &data, &n, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return NULL;
    }
    char *text = malloc(SPEED_BYTES + 4096);
    size_t out = 0;
    while (out < SPEED_BYTES) {
        const size_t before = out;
        for (char *line = data; line < data + n && out < SPEED_BYTES;) {
            char *end = memchr(line, '\n', (size_t)(data + n - line));
            if (!end) end = data + n;
            json_error_t je;
            json_t *s = json_loadb(line, (size_t)(end - line), JSON_DECODE_ANY, &je);
            if (json_is_string(s) && json_string_length(s) < 4096) {
                memcpy(text + out, json_string_value(s), json_string_length(s));
                out += json_string_length(s);
                text[out++] = '\n';
            }
            json_decref(s);
            line = end + 1;
        }
        if (out == before) break; /* no strings in the corpus */
    }
    free(data);
    *len = out;
    return text;
}

static int measure(const char *dir, const char *rel, const char *name, const char *text, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    sl_tokenizer *tok = NULL;
    sl_error err = {0};
    double t0 = sl_now();
    if (sl_tokenizer_load(p, &tok, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    const double load = sl_now() - t0;
    sl_token_ids ids = {0};
    t0 = sl_now();
    const sl_status st = sl_tokenizer_encode(tok, text, n, &ids, &err);
    const double dt = sl_now() - t0;
    if (st == SL_OK)
        printf("tokenizer %s: loaded in %.2f s; %.1f MB -> %zu tokens in %.3f s: %.0f tokens/s, "
               "%.1f MB/s\n",
               name, load, n / 1e6, ids.n, dt, ids.n / dt, n / 1e6 / dt);
    else
        fprintf(stderr, "bench_tokenizer: %s: %s\n", name, err.msg);
    sl_token_ids_free(&ids);
    sl_tokenizer_free(tok);
    return st != SL_OK;
}

int main(int argc, char **argv) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../tokenizer", argc > 1 ? argv[1] : "tests/fixtures");
    size_t n = 0;
    char *text = corpus_text(dir, &n);
    if (!text) return 1;
    int bad = measure(dir, "qwen3", "qwen3", text, n);
    bad |= measure(dir, "lenml_llama2", "lenml_llama2 (sentencepiece bpe)", text, n);
    free(text);
    return bad;
}
