/* Fuzz target: config.json parsing on arbitrary text. */
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    sl_config c;
    sl_error err = {0};
    if (sl_config_parse(&c, text, "fuzz/config.json", &err) == SL_OK) sl_config_free(&c);
    free(text);
    return 0;
}
