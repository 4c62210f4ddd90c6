/* Fuzz target: reading tool calls back from generated text (sl_tool_calls_parse), then the
 * invariants a caller relies on: content no longer than the text, every call named and its
 * arguments a JSON object's text. */
#include <jansson.h>

#include "chat/toolcall.h"
#include "core/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_tool_calls c;
    sl_error err = {0};
    if (sl_tool_calls_parse((const char *)data, size, &c, &err) != SL_OK) return 0;
    if (c.content_len > size || c.content[c.content_len] != '\0') __builtin_trap();
    for (int32_t i = 0; i < c.n; i++) {
        json_t *v = json_loads(c.calls[i].arguments, 0, NULL);
        if (!c.calls[i].name[0] || !json_is_object(v)) __builtin_trap();
        json_decref(v);
    }
    sl_tool_calls_free(&c);
    return 0;
}
