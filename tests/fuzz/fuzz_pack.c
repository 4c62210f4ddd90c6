/* Fuzz target: the packed format's core.bin parser and the experts-file and n-gram-table
 * header parsers. */
#include "format/pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_st_file f = {0};
    sl_error err = {0};
    if (sl_core_parse(&f, "fuzz/core.bin", data, size, &err) == SL_OK) {
        volatile uint8_t sink = 0;
        for (int32_t i = 0; i < f.n_tensors; i++) {
            const sl_tensor *t = &f.tensors[i];
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            if (t->scales) sink ^= (uint8_t)(t->scales[0] ^ t->biases[0]);
        }
        (void)sink;
    }
    sl_st_close(&f);
    sl_experts_header h;
    err = (sl_error){0};
    if (sl_experts_header_parse(&h, "fuzz/experts.bin", data, size, (uint64_t)size, &err) == SL_OK)
        SL_ASSERT(h.data_offset + (uint64_t)h.n_experts * h.blob_bytes == size);
    sl_ngram_header g;
    err = (sl_error){0};
    if (sl_ngram_header_parse(&g, "fuzz/ngram.bin", data, size, (uint64_t)size, &err) == SL_OK)
        SL_ASSERT(g.data_offset + g.rows * g.row_bytes == size && g.row_bytes > 0);
    return 0;
}
