/* Fuzz target: the tokenizer.json loader (through a temporary file), then one encode. */
#include <unistd.h>

#include "tokenizer/tokenizer.h"

#include "core/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/sluice-fuzz-tok-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    sl_tokenizer *tok = NULL;
    sl_error err = {0};
    if (sl_tokenizer_load(path, &tok, &err) == SL_OK) {
        sl_token_ids ids = {0};
        sl_tokenizer_encode(tok, "ab c<s>abc \xff x\n\n", 17, &ids, &err);
        sl_token_ids_free(&ids);
        sl_tokenizer_free(tok);
    }
    unlink(path);
    return 0;
}
