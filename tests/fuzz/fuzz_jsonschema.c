/* Fuzz target: JSON schemas compiled into a constraint (sl_json_constraint_create), then a
 * document fed to it. The input is a schema's text, a NUL, and the document's bytes (without
 * the NUL: the document is any JSON object). The invariants: a schema is compiled or refused
 * with a message, never a crash; a document the constraint takes whole and calls complete
 * parses with jansson; one it refuses leaves the state where it was. */
#include <jansson.h>

#include "sampler/json_constraint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    json_t *schema = NULL;
    const char *doc = (const char *)data;
    size_t n = size;
    if (nul) {
        schema = json_loadb((const char *)data, (size_t)(nul - data), 0, NULL);
        if (!schema) return 0;
        doc = (const char *)nul + 1;
        n = size - (size_t)(nul - data) - 1;
    }
    sl_json_constraint *c = NULL;
    sl_error err = {0};
    const int32_t eos = 1;
    if (sl_json_constraint_create(NULL, schema, &eos, 1, &c, &err)) {
        if (!err.msg[0]) __builtin_trap();
        json_decref(schema);
        return 0;
    }
    /* in pieces of 1 to 8 bytes (a token's), as far as they are taken */
    size_t at = 0;
    while (at < n) {
        const size_t k = SL_MIN(n - at, (size_t)(doc[at] & 7) + 1);
        const int done = sl_json_constraint_done(c);
        if (sl_json_constraint_feed(c, doc + at, k)) {
            if (sl_json_constraint_done(c) != done) __builtin_trap(); /* left as it was */
            break;
        }
        at += k;
    }
    if (at == n && sl_json_constraint_done(c)) {
        json_t *v = json_loadb(doc, n, JSON_DECODE_ANY, NULL);
        if (!v || (!schema && !json_is_object(v))) __builtin_trap();
        json_decref(v);
        if (sl_json_constraint_accept(c, eos) != 0) __builtin_trap();
    }
    sl_json_constraint_free(c);
    json_decref(schema);
    return 0;
}
