/* Finding tool calls in a reply (see toolcall.h). */
#include "chat/toolcall.h"

#include <jansson.h>

#include "chat/template.h"

#define OPEN  "<tool_call>"
#define CLOSE "</tool_call>"

static const char *find(const char *p, const char *end, const char *s) {
    const size_t n = strlen(s);
    for (; (size_t)(end - p) >= n; p++)
        if (*p == *s && !memcmp(p, s, n)) return p;
    return NULL;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* A block's body as a call, or 0 when it is not one (bad JSON, wrong shape). */
static int read_call(const char *body, size_t n, sl_tool_call *c, int *oom) {
    json_t *v = json_loadb(body, n, 0, NULL);
    json_t *name = json_object_get(v, "name"), *args = json_object_get(v, "arguments");
    int ok = json_is_object(v) && json_is_string(name) && json_string_length(name) > 0 &&
             json_is_object(args);
    if (ok) {
        c->name = strdup(json_string_value(name));
        c->arguments = sl_chat_tojson(args);
        if (!c->name || !c->arguments) {
            free(c->name), free(c->arguments);
            *oom = 1;
            ok = 0;
        }
    }
    json_decref(v);
    return ok;
}

sl_status sl_tool_calls_parse(const char *text, size_t len, sl_tool_calls *out, sl_error *err) {
    return sl_tool_calls_read(SL_TOOL_FORM_JSON, NULL, text, len, out, err);
}

sl_status sl_tool_calls_read(sl_tool_form form, const sl_chat_tools *tools, const char *text,
                             size_t len, sl_tool_calls *out, sl_error *err) {
    (void)form, (void)tools;
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + len;
    int oom = !(out->content = malloc(len + 1));
    int32_t cap = 0;
    while (!oom) {
        const char *open = find(p, end, OPEN);
        const char *close = open ? find(open + strlen(OPEN), end, CLOSE) : NULL;
        if (!close) break; /* no block, or one that never ends: the rest is text */
        /* "<tool_call> junk <tool_call>{...}</tool_call>": the block is the innermost */
        for (const char *o; (o = find(open + 1, close, OPEN));)
            open = o;
        const char *body = open + strlen(OPEN), *next = close + strlen(CLOSE);
        sl_tool_call c;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 4;
            sl_tool_call *calls = realloc(out->calls, (size_t)cap * sizeof *calls);
            if (!calls) {
                oom = 1;
                break;
            }
            out->calls = calls;
        }
        const int ok = read_call(body, (size_t)(close - body), &c, &oom);
        const char *keep = ok ? open : next; /* a block that is not a call stays text */
        memcpy(out->content + out->content_len, p, (size_t)(keep - p));
        out->content_len += (size_t)(keep - p);
        if (ok) out->calls[out->n++] = c;
        p = next;
    }
    if (oom) {
        sl_tool_calls_free(out);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory reading tool calls");
    }
    memcpy(out->content + out->content_len, p, (size_t)(end - p));
    out->content_len += (size_t)(end - p);
    if (out->n > 0) { /* the template's newlines around the blocks are not content */
        size_t a = 0, b = out->content_len;
        while (a < b && is_space(out->content[a]))
            a++;
        while (b > a && is_space(out->content[b - 1]))
            b--;
        memmove(out->content, out->content + a, b - a);
        out->content_len = b - a;
    }
    out->content[out->content_len] = '\0';
    return SL_OK;
}

void sl_tool_calls_free(sl_tool_calls *c) {
    for (int32_t i = 0; i < c->n; i++) {
        free(c->calls[i].name);
        free(c->calls[i].arguments);
    }
    free(c->calls);
    free(c->content);
    memset(c, 0, sizeof *c);
}
