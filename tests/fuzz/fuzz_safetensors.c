/* Fuzz target: the safetensors header parser on arbitrary bytes. */
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_st_file f = {0};
    sl_error err = {0};
    if (sl_st_parse(&f, "fuzz.safetensors", data, size, &err) == SL_OK) {
        /* Touch every tensor's first and last byte: views must lie inside the input. */
        volatile uint8_t sink = 0;
        for (int32_t i = 0; i < f.n_tensors; i++)
            if (f.tensors[i].nbytes) {
                const uint8_t *p = f.tensors[i].data;
                sink ^= p[0] ^ p[f.tensors[i].nbytes - 1];
            }
        (void)sink;
        (void)sl_st_find(&f, "a");
    }
    sl_st_close(&f);
    return 0;
}
