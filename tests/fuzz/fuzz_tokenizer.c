/* Fuzz target: encode arbitrary bytes with the Qwen3 tokenizer, then check that decode
 * and the streaming detokenizer agree on every byte. Run from the repository root. */
#include "tokenizer/tokenizer.h"

#include "core/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static sl_tokenizer *tok;
    sl_error err = {0};
    if (!tok) SL_ASSERT(sl_tokenizer_load("tests/tokenizer/qwen3", &tok, &err) == SL_OK);
    sl_token_ids ids = {0};
    if (sl_tokenizer_encode(tok, (const char *)data, size, &ids, &err) == SL_OK) {
        char *text;
        size_t len, done = 0;
        SL_ASSERT(sl_tokenizer_decode(tok, ids.ids, ids.n, 0, &text, &len, &err) == SL_OK);
        sl_detok d;
        sl_detok_init(&d, tok, 0);
        const char *piece;
        size_t n;
        for (size_t i = 0; i < ids.n; i++) {
            SL_ASSERT(sl_detok_push(&d, ids.ids[i], &piece, &n, &err) == SL_OK);
            SL_ASSERT(done + n <= len && memcmp(text + done, piece, n) == 0);
            done += n;
        }
        SL_ASSERT(sl_detok_flush(&d, &piece, &n, &err) == SL_OK);
        SL_ASSERT(done + n == len && memcmp(text + done, piece, n) == 0);
        sl_detok_free(&d);
        free(text);
    }
    sl_token_ids_free(&ids);
    return 0;
}
