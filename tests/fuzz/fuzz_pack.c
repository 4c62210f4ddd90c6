/* Fuzz target: the packed format's core.bin parser and the experts-file and n-gram-table
 * header parsers, and (format 2) the checksum checks that follow them. */
#include "core/crc32c.h"
#include "format/pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_st_file f = {0};
    sl_error err = {0};
    if (sl_core_parse(&f, "fuzz/core.bin", data, size, &err) == SL_OK) {
        sl_core_verify("fuzz/core.bin", data, size, &err);
        volatile uint8_t sink = 0;
        for (int32_t i = 0; i < f.n_tensors; i++) {
            const sl_tensor *t = &f.tensors[i];
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            if (t->scales)
                sink ^=
                    (uint8_t)(((const uint8_t *)t->scales)[0] ^ ((const uint8_t *)t->biases)[0]);
        }
        (void)sink;
    }
    sl_st_close(&f);
    sl_experts_header h;
    err = (sl_error){0};
    if (sl_experts_header_parse(&h, "fuzz/experts.bin", data, size, (uint64_t)size, &err) ==
        SL_OK) {
        SL_ASSERT(h.data_offset + (uint64_t)h.n_experts * h.blob_bytes == size);
        uint32_t *crc = calloc(h.n_experts, sizeof(uint32_t));
        if (crc && sl_experts_checksums(&h, "fuzz/experts.bin", data, size, crc, &err) == SL_OK)
            (void)sl_crc32c(0, data + h.data_offset, (size_t)h.blob_bytes);
        free(crc);
    }
    sl_ngram_header g;
    err = (sl_error){0};
    if (sl_ngram_header_parse(&g, "fuzz/ngram.bin", data, size, (uint64_t)size, &err) == SL_OK) {
        SL_ASSERT(g.data_offset + g.rows * g.row_bytes == size && g.row_bytes > 0);
        SL_ASSERT(g.version < 2 || g.row_bytes > 4);
        (void)sl_ngram_row_ok(&g, data + g.data_offset);
    }
    return 0;
}
