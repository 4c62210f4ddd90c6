/* Fuzz target: reading tool calls back from generated text in both forms (sl_tool_calls_read:
 * JSON, and XML with a tool whose parameters have every schema type), then the invariants a
 * caller relies on: content no longer than the text, every call named and its arguments a JSON
 * object's text (a string value may hold \u0000). */
#include <jansson.h>

#include "chat/toolcall.h"
#include "core/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(sl_tool_form form, const sl_chat_tools *tools, const uint8_t *data, size_t size) {
    sl_tool_calls c;
    sl_error err = {0};
    if (sl_tool_calls_read(form, tools, (const char *)data, size, &c, &err) != SL_OK) return;
    if (c.content_len > size || c.content[c.content_len] != '\0') __builtin_trap();
    for (int32_t i = 0; i < c.n; i++) {
        json_t *v = json_loads(c.calls[i].arguments, JSON_ALLOW_NUL, NULL); /* \u0000 in a value */
        if (!c.calls[i].name[0] || !json_is_object(v)) __builtin_trap();
        json_decref(v);
    }
    sl_tool_calls_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const defs[] = {
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
        "{\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": "
        "\"number\"}, \"b\": {\"type\": \"boolean\"}, \"o\": {\"type\": \"object\"}, \"a\": "
        "{\"type\": \"array\"}, \"z\": {\"type\": \"null\"}, \"m\": {\"type\": [\"integer\", "
        "\"null\", \"string\"]}, \"q\": {\"type\": 3}}}}}",
        "not json",
    };
    const sl_chat_tools tools = {defs, 2};
    check(SL_TOOL_FORM_JSON, NULL, data, size);
    check(SL_TOOL_FORM_XML, &tools, data, size);
    return 0;
}
