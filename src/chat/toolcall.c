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

/* A block's body in the JSON form as a call, or 0 when it is not one (bad JSON, wrong shape). */
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

/* ---------------------------------------------------------------- the XML form */

/* s[0..n) starts with the string lit. */
static int starts(const char *s, size_t n, const char *lit) {
    const size_t m = strlen(lit);
    return n >= m && !memcmp(s, lit, m);
}

static const char *skip_space(const char *p, const char *end) {
    while (p < end && is_space(*p))
        p++;
    return p;
}

/* "<TAG=NAME>" at *p: NAME (no '<', '>', NUL or line break, not empty) into [*nb, *ne), *p past it;
 * 0 when it is not there. */
static int read_tag(const char **p, const char *end, const char *tag, const char **nb,
                    const char **ne) {
    const size_t m = strlen(tag);
    if (!starts(*p, (size_t)(end - *p), tag)) return 0;
    const char *b = *p + m, *e = b;
    while (e < end && *e != '>' && *e != '<' && *e != '\n' && *e != '\r' && *e != '\0')
        e++;
    if (e == end || *e != '>' || e == b) return 0;
    *nb = b, *ne = e, *p = e + 1;
    return 1;
}

/* The JSON type a tool's schema gives parameter p of function name (the tools' definitions
 * read into defs): the "type" value (a string or a list of them), or NULL. */
static json_t *param_type(json_t *defs, const char *name, const char *p) {
    size_t i;
    json_t *d;
    json_array_foreach(defs, i, d) {
        json_t *f = json_object_get(d, "function") ? json_object_get(d, "function") : d;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (!n || strcmp(n, name)) continue;
        json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
        return json_object_get(json_object_get(props, p), "type");
    }
    return NULL;
}

/* v[0..n) as the JSON value of type t ("integer", "number", "boolean", "null", "object",
 * "array"), or NULL when it does not read as one. Booleans and null also in Python's spelling
 * (True, None), which the template writes for them in earlier turns. */
static json_t *as_type(const char *v, size_t n, const char *t) {
    const char *b = skip_space(v, v + n), *e = v + n;
    while (e > b && is_space(e[-1]))
        e--;
    const size_t m = (size_t)(e - b);
    if (!strcmp(t, "boolean")) {
        if ((m == 4 && !strncasecmp(b, "true", 4))) return json_true();
        if ((m == 5 && !strncasecmp(b, "false", 5))) return json_false();
        return NULL;
    }
    if (!strcmp(t, "null"))
        return (m == 4 && !memcmp(b, "null", 4)) || (m == 4 && !memcmp(b, "None", 4)) ? json_null()
                                                                                      : NULL;
    json_t *x = m ? json_loadb(b, m, JSON_DECODE_ANY, NULL) : NULL;
    const int ok = !strcmp(t, "integer")  ? json_is_integer(x)
                   : !strcmp(t, "number") ? json_is_number(x)
                   : !strcmp(t, "object") ? json_is_object(x)
                   : !strcmp(t, "array")  ? json_is_array(x)
                                          : 0;
    if (!ok) json_decref(x);
    return ok ? x : NULL;
}

/* A parameter's value v[0..n) as JSON: converted by its schema type (a string, or the first of
 * a list's types it reads as), else a string; "null" is null for any type but string. NULL
 * when the text cannot be a JSON string (not UTF-8) or out of memory. */
static json_t *param_value(const char *v, size_t n, json_t *type) {
    const size_t nt = json_is_array(type) ? json_array_size(type) : 1;
    int string = 0;
    for (size_t i = 0; i < nt; i++) {
        const char *t = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
        if (!t) continue;
        if (!strcmp(t, "string")) {
            string = 1;
            break;
        }
        json_t *x = as_type(v, n, t);
        if (x) return x;
    }
    if (!string && type && n == 4 && !memcmp(v, "null", 4)) return json_null();
    return json_stringn(v, n);
}

/*
 * A block's body in the XML form as a call, or 0 when it is not one:
 *
 *   \n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n
 *
 * whitespace between the tags free; a value is the text up to the first "</parameter>" with
 * one line break dropped from each end (the template writes them around it).
 */
static int read_call_xml(const char *body, size_t n, json_t *defs, sl_tool_call *c, int *oom) {
    const char *p = skip_space(body, body + n), *end = body + n, *nb, *ne;
    if (!read_tag(&p, end, "<function=", &nb, &ne)) return 0;
    char *name = strndup(nb, (size_t)(ne - nb));
    json_t *args = json_object();
    int ok = name && args;
    if (!ok) *oom = 1;
    while (ok) {
        const char *pb, *pe;
        p = skip_space(p, end);
        if (!read_tag(&p, end, "<parameter=", &pb, &pe)) break;
        const char *vb = p, *ve = find(p, end, "</parameter>");
        if (!ve) {
            ok = 0;
            break;
        }
        p = ve + strlen("</parameter>");
        if (vb < ve && *vb == '\n') vb++;
        if (ve > vb && ve[-1] == '\n') ve--;
        if (ve > vb && ve[-1] == '\r') ve--;
        char *key = strndup(pb, (size_t)(pe - pb));
        json_t *v = key ? param_value(vb, (size_t)(ve - vb), param_type(defs, name, key)) : NULL;
        ok = v && !json_object_set_new(args, key, v);
        if (!key) *oom = 1;
        free(key);
    }
    p = skip_space(p, end);
    ok = ok && starts(p, (size_t)(end - p), "</function>");
    if (ok) ok = skip_space(p + strlen("</function>"), end) == end;
    if (ok && !(c->arguments = sl_chat_tojson(args))) ok = 0, *oom = 1;
    json_decref(args);
    if (ok)
        c->name = name;
    else
        free(name);
    return ok;
}

/* ---------------------------------------------------------------- blocks */

sl_status sl_tool_calls_parse(const char *text, size_t len, sl_tool_calls *out, sl_error *err) {
    return sl_tool_calls_read(SL_TOOL_FORM_JSON, NULL, text, len, out, err);
}

sl_status sl_tool_calls_read(sl_tool_form form, const sl_chat_tools *tools, const char *text,
                             size_t len, sl_tool_calls *out, sl_error *err) {
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + len;
    json_t *defs = NULL; /* the XML form: the tools' definitions, for their parameters' types */
    if (form == SL_TOOL_FORM_XML) {
        defs = json_array();
        for (int32_t i = 0; defs && tools && i < tools->n; i++)
            json_array_append_new(defs, json_loads(tools->defs[i], 0, NULL));
    }
    int oom = !(out->content = malloc(len + 1)) || (form == SL_TOOL_FORM_XML && !defs);
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
        const int ok = form == SL_TOOL_FORM_XML
                           ? read_call_xml(body, (size_t)(close - body), defs, &c, &oom)
                           : read_call(body, (size_t)(close - body), &c, &oom);
        const char *keep = ok ? open : next; /* a block that is not a call stays text */
        memcpy(out->content + out->content_len, p, (size_t)(keep - p));
        out->content_len += (size_t)(keep - p);
        if (ok) out->calls[out->n++] = c;
        p = next;
    }
    json_decref(defs);
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
