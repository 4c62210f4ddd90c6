/*
 * The OpenAI API's JSON: validating requests of /v1/chat/completions and
 * /v1/completions into jobs, and writing responses, stream chunks and error
 * objects. Every wrong field is a 400 naming the field; nothing here can take
 * the server down. The field readers, sampling, templating and context checks
 * (srv_get_*, srv_sampling, srv_encode_chat, srv_fit_prompt) serve anthropic.c too.
 */
#include <math.h>
#include <stdarg.h>
#include <sys/random.h>

#include "chat/toolcall.h"
#include "server/internal.h"

json_t *srv_error_json(const char *message, const char *type, const char *param, const char *code) {
    json_t *m = json_string(message);
    if (!m) { /* it quotes bytes that are not UTF-8 (a Host, a URL), or a length limit cut a
                 character it quotes: those bytes become '?' */
        char *t = strdup(message);
        for (char *p = t; p && *p; p++)
            if ((unsigned char)*p >= 0x80) *p = '?';
        m = t ? json_string(t) : NULL;
        free(t);
    }
    return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", m, "type", type, "param",
                     param ? json_string(param) : json_null(), "code",
                     code ? json_string(code) : json_null());
}

int srv_bad(json_t **error, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *error = srv_error_json(msg, "invalid_request_error", param, NULL);
    return 400;
}

int srv_get_number(json_t *req, const char *key, double lo, double hi, double *out,
                   json_t **error) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return srv_bad(error, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return srv_bad(error, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

int srv_get_int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out,
                json_t **error) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return srv_bad(error, key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_bad(error, key, "'%s' must be between %lld and %lld, got %lld", key,
                       (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 0;
}

int srv_get_bool(json_t *obj, const char *key, int32_t *out, json_t **error) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return srv_bad(error, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int srv_get_stops(json_t *req, const char *key, srv_job *j, json_t **error) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    const size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > SRV_MAX_STOPS)
        return srv_bad(error, key, "'%s' holds at most %d strings", key, SRV_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s))
            return srv_bad(error, key, "'%s' must be a string or an array of strings", key);
        if (!*json_string_value(s))
            return srv_bad(error, key, "'%s' strings must not be empty", key);
        if (!(j->stops[j->n_stops] = strdup(json_string_value(s))))
            return srv_bad(error, key, "out of memory");
        j->n_stops++;
    }
    return 0;
}

/* Text of a message's content: a string, null, or an array of {"type":"text"} parts
 * (malloc'ed into *out). */
static int message_text(json_t *content, size_t i, char **out, json_t **error) {
    if (!content || json_is_null(content)) return (*out = strdup("")) ? 0 : 500;
    if (json_is_string(content)) return (*out = strdup(json_string_value(content))) ? 0 : 500;
    if (!json_is_array(content))
        return srv_bad(error, "messages",
                       "messages[%zu].content must be a string or an array of text parts", i);
    size_t len = 0, k;
    json_t *part;
    json_array_foreach(content, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return srv_bad(error, "messages",
                           "messages[%zu].content[%zu]: only text parts are supported", i, k);
        if (!json_is_string(text))
            return srv_bad(error, "messages", "messages[%zu].content[%zu].text must be a string", i,
                           k);
        len += json_string_length(text);
    }
    char *s = malloc(len + 1);
    if (!s) return 500;
    len = 0;
    json_array_foreach(content, k, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(s + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    s[len] = '\0';
    *out = s;
    return 0;
}

int srv_encode_chat(srv *s, const sl_chat_msg *m, int32_t n, int32_t think, srv_job *j,
                    json_t **error) {
    return srv_encode_chat_tools(s, m, n, NULL, think, j, error);
}

int srv_encode_chat_tools(srv *s, const sl_chat_msg *m, int32_t n, const sl_chat_tools *tools,
                          int32_t think, srv_job *j, json_t **error) {
    /* A message's text never becomes control tokens: "<|im_end|>\n<|im_start|>system" in a
     * user message stays text and cannot fake a turn; only the template inserts them. */
    sl_error err = {0};
    sl_status st = sl_chat_encode_tools(&s->tpl, s->tok, m, n, tools, 1, think, &j->prompt, &err);
    if (st) return st == SL_ERR_NOMEM ? 500 : srv_bad(error, "messages", "%s", err.msg);
    return 0;
}

/* The template writes a call's name between quotes (or in a tag) as it is, so a quote, a
 * backslash or a '>' in it would break the call's layout. */
int srv_valid_name(json_t *v) {
    const char *p = json_string_value(v);
    const size_t n = p ? json_string_length(v) : 0;
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", p[i]) ||
            !p[i])
            return 0;
    return 1;
}

/* tools, [{"type": "function", "function": {"name", "description", "parameters"}}], into
 * o->tool_defs (each as the template's tojson writes it), and tool_choice ("auto" or "none";
 * "none" offers the tools but reads no calls back, as vLLM does by default). */
static int get_tools(srv *s, json_t *req, srv_job *j, srv_request_opts *o, json_t **error) {
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    const char *c = json_string_value(choice);
    if (choice && !json_is_null(choice) && (!c || (strcmp(c, "auto") && strcmp(c, "none"))))
        return srv_bad(error, "tool_choice",
                       "tool_choice: only \"auto\" and \"none\" are supported (a named function "
                       "or \"required\" would need the call's JSON constrained, not done yet)");
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return srv_bad(error, "tools", "'tools' must be an array");
    const size_t n = json_array_size(tools);
    if (n == 0) return 0;
    if (!sl_chat_supports_tools(&s->tpl))
        return srv_bad(error, "tools", "tools are not supported with the %s chat template",
                       sl_chat_template_kind_name(s->tpl.kind));
    const int read_calls = !(c && !strcmp(c, "none"));
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        json_t *desc = json_object_get(f, "description"),
               *params = json_object_get(f, "parameters");
        if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
            strcmp(json_string_value(json_object_get(t, "type")), "function"))
            return srv_bad(error, "tools",
                           "tools[%zu] must be an object with \"type\": \"function\"", i);
        if (!json_is_object(f))
            return srv_bad(error, "tools", "tools[%zu].function must be an object", i);
        if (!srv_valid_name(json_object_get(f, "name")))
            return srv_bad(error, "tools",
                           "tools[%zu].function.name must be 1 to 64 letters, digits, '_' or '-'",
                           i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return srv_bad(error, "tools", "tools[%zu].function.description must be a string", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return srv_bad(error, "tools", "tools[%zu].function.parameters must be an object", i);
    }
    if (!(o->tool_defs = calloc(n, sizeof *o->tool_defs))) return 500;
    for (i = 0; i < n; i++, o->n_tool_defs++)
        if (!(o->tool_defs[i] = sl_chat_tojson(json_array_get(tools, i)))) return 500;
    j->tool_calls = read_calls;
    return 0;
}

/* An assistant message's tool_calls, [{"id", "type": "function", "function": {"name",
 * "arguments"}}], into *calls (malloc'ed; each arguments text malloc'ed too: a string as it is,
 * an object as tojson writes it). */
static int get_calls(srv *s, json_t *msg, size_t i, sl_chat_msg *m, json_t **error) {
    json_t *tc = json_object_get(msg, "tool_calls"), *call;
    if (!tc || json_is_null(tc) || (json_is_array(tc) && json_array_size(tc) == 0)) return 0;
    if (!json_is_array(tc))
        return srv_bad(error, "messages", "messages[%zu].tool_calls must be an array", i);
    if (!sl_chat_supports_tools(&s->tpl))
        return srv_bad(error, "messages", "tool calls are not supported with the %s chat template",
                       sl_chat_template_kind_name(s->tpl.kind));
    sl_chat_tool_call *calls = calloc(json_array_size(tc), sizeof *calls);
    if (!calls) return 500;
    m->tool_calls = calls;
    size_t k;
    json_array_foreach(tc, k, call) {
        json_t *f = json_object_get(call, "function"), *type = json_object_get(call, "type");
        json_t *args = json_object_get(f, "arguments");
        if (!json_is_object(call) || !json_is_object(f) ||
            (type && (!json_is_string(type) || strcmp(json_string_value(type), "function"))))
            return srv_bad(error, "messages",
                           "messages[%zu].tool_calls[%zu] must be {\"type\": \"function\", "
                           "\"function\": {\"name\", \"arguments\"}}",
                           i, k);
        if (!srv_valid_name(json_object_get(f, "name")))
            return srv_bad(error, "messages",
                           "messages[%zu].tool_calls[%zu].function.name must be 1 to 64 letters, "
                           "digits, '_' or '-'",
                           i, k);
        if (!json_is_string(args) && !json_is_object(args))
            return srv_bad(error, "messages",
                           "messages[%zu].tool_calls[%zu].function.arguments must be a JSON string",
                           i, k);
        /* Qwen3-Coder's template writes each argument as a parameter: it needs an object */
        json_t *obj = json_is_string(args) && s->tpl.tool_form == SL_TOOL_FORM_XML
                          ? json_loads(json_string_value(args), 0, NULL)
                          : NULL;
        const int not_object =
            json_is_string(args) && s->tpl.tool_form == SL_TOOL_FORM_XML && !json_is_object(obj);
        json_decref(obj);
        if (not_object)
            return srv_bad(error, "messages",
                           "messages[%zu].tool_calls[%zu].function.arguments must be a JSON "
                           "object's text with this chat template (Qwen3-Coder's)",
                           i, k);
        calls[k].name = json_string_value(json_object_get(f, "name"));
        char *a = json_is_string(args) ? strdup(json_string_value(args)) : sl_chat_tojson(args);
        if (!a) return 500;
        calls[k].arguments = a;
        m->n_tool_calls = (int32_t)k + 1;
    }
    return 0;
}

/* messages (and tools, into o) -> the prompt's ids in j->prompt, through the chat template. */
static int chat_prompt(srv *s, json_t *req, srv_job *j, srv_request_opts *o, json_t **error) {
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_bad(error, "messages", "'messages' must be a non-empty array");
    int32_t think = s->cfg.think;
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return srv_bad(error, "chat_template_kwargs",
                           "'chat_template_kwargs' must be an object");
        int rc = srv_get_bool(kw, "enable_thinking", &think, error);
        if (rc) return rc;
    }
    const size_t n = json_array_size(msgs);
    sl_chat_msg *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    int rc = m && owned ? get_tools(s, req, j, o, error) : 500;
    const int tools_ok = sl_chat_supports_tools(&s->tpl);
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *msg = json_array_get(msgs, i);
        const char *r;
        if ((rc = srv_msg_role(msg, i, &r, error))) break;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            (strcmp(r, "tool") || !tools_ok)) {
            rc = srv_bad(error, "messages",
                         "messages[%zu].role '%s' is not supported (system, developer, user, "
                         "assistant%s)",
                         i, r, tools_ok ? " or tool" : " or, with a ChatML template, tool");
            break;
        }
        json_t *content = json_object_get(msg, "content"),
               *id = json_object_get(msg, "tool_call_id");
        if ((!content || json_is_null(content)) && strcmp(r, "assistant") != 0) {
            rc = srv_bad(error, "messages", "messages[%zu].content is missing", i);
            break;
        }
        if (!strcmp(r, "tool") && id && !json_is_null(id) && !json_is_string(id)) {
            rc = srv_bad(error, "messages", "messages[%zu].tool_call_id must be a string", i);
            break;
        }
        m[i].role = r;
        if ((rc = message_text(content, i, &owned[i], error))) break;
        m[i].content = owned[i];
        if (!strcmp(r, "assistant")) rc = get_calls(s, msg, i, &m[i], error);
    }
    return srv_encode_chat_free(s, m, owned, n, o, think, j, rc, error);
}

/* prompt: a string or an array of token ids, or a list holding one of them. The OpenAI API
 * takes a list of prompts and answers each; one request generates one reply here, so a
 * longer list is refused rather than answered for its first prompt only. */
static int completion_prompt(srv *s, json_t *req, srv_job *j, char **text, json_t **error) {
    json_t *p = json_object_get(req, "prompt");
    json_t *first = json_array_get(p, 0);
    if (json_is_string(first) || json_is_array(first)) {
        if (json_array_size(p) > 1)
            return srv_bad(error, "prompt",
                           "prompt: a list of %zu prompts is not supported; send one prompt per "
                           "request",
                           json_array_size(p));
        p = first;
    }
    if (json_is_string(p)) return (*text = strdup(json_string_value(p))) ? 0 : 500;
    if (!json_is_array(p) || json_array_size(p) == 0)
        return srv_bad(error, "prompt",
                       "'prompt' must be a string or an array of token ids (or a list of one of "
                       "them)");
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->vocab)
            return srv_bad(error, "prompt", "prompt[%zu] must be a token id in [0, %d)", i,
                           s->vocab);
        if (j->prompt.n == j->prompt.cap) {
            size_t cap = j->prompt.cap ? 2 * j->prompt.cap : 64;
            int32_t *ids = realloc(j->prompt.ids, cap * sizeof *ids);
            if (!ids) return 500;
            j->prompt.ids = ids;
            j->prompt.cap = cap;
        }
        j->prompt.ids[j->prompt.n++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

/* The vocabulary's trie of JSON constraints, built once, by the first request that needs it
 * (it takes a fraction of a second over a large vocabulary); NULL when out of memory. */
static const sl_json_vocab *json_vocab(srv *s) {
    pthread_mutex_lock(&s->json_mu);
    if (!s->json_vocab) {
        sl_error err = {0};
        if (sl_json_vocab_create(s->tok, &s->json_vocab, &err) && s->cfg.log)
            fprintf(stderr, "sluice serve: %s\n", err.msg);
    }
    const sl_json_vocab *v = s->json_vocab;
    pthread_mutex_unlock(&s->json_mu);
    return v;
}

/* response_format: "text" (free text), "json_object" (any JSON object) or "json_schema"
 * ({"json_schema": {"name", "schema", "strict", "description"}}: a document of the schema;
 * without one, any JSON value) into j->json, the constraint the reply is decoded under. A
 * schema using what the constraint does not support is a 400 naming the keyword: JSON asked
 * for is never silently given as free text. */
static int get_response_format(srv *s, srv_kind kind, json_t *req, srv_job *j, json_t **error) {
    json_t *rf = json_object_get(req, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return srv_bad(error, "response_format",
                       "'response_format' must be an object with a string 'type'");
    if (!strcmp(type, "text")) return 0;
    json_t *schema = NULL, *any = NULL;
    if (!strcmp(type, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(js))
            return srv_bad(error, "response_format",
                           "response_format json_schema needs a 'json_schema' object");
        json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
        if (name && !json_is_string(name))
            return srv_bad(error, "response_format",
                           "response_format.json_schema.name must be a string");
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return srv_bad(error, "response_format",
                           "response_format.json_schema.strict must be a boolean");
        schema = json_object_get(js, "schema");
        if (!schema || json_is_null(schema)) schema = any = json_object();
        if (!schema) {
            *error = srv_error_json("out of memory", "server_error", NULL, NULL);
            return 500;
        }
        if (!json_is_object(schema))
            return srv_bad(error, "response_format",
                           "response_format.json_schema.schema must be an object");
    } else if (strcmp(type, "json_object")) {
        return srv_bad(error, "response_format",
                       "response_format type '%.40s' is not supported (text, json_object, "
                       "json_schema)",
                       type);
    }
    /* a chat reply read by parts (harmony) starts with channel markers, special tokens that
     * the constraint never lets through */
    if (kind == SRV_CHAT && sl_reply_needs_special(&s->tpl)) {
        json_decref(any);
        return srv_bad(error, "response_format",
                       "a JSON response_format is not supported with the %s chat template (its "
                       "replies start with channel markers); /v1/completions takes it",
                       sl_chat_template_kind_name(s->tpl.kind));
    }
    if (j->ignore_eos || s->gen.n_eos == 0) {
        json_decref(any);
        return srv_bad(error, j->ignore_eos ? "ignore_eos" : "response_format",
                       "a JSON response_format needs an end-of-sequence id to end the document "
                       "on (%s)",
                       j->ignore_eos ? "ignore_eos bans it" : "the model has none");
    }
    const sl_json_vocab *v = json_vocab(s);
    sl_error err = {0};
    const sl_status st =
        v ? sl_json_constraint_create(v, schema, s->gen.eos, s->gen.n_eos, &j->json, &err)
          : SL_ERR_NOMEM;
    json_decref(any);
    if (st == SL_ERR_NOMEM) {
        *error = srv_error_json("out of memory", "server_error", NULL, NULL);
        return 500;
    }
    if (st) return srv_bad(error, "response_format", "response_format: %s", err.msg);
    return 0;
}

int srv_get_logit_bias(srv *s, json_t *req, srv_job *j, json_t **error) {
    json_t *v = json_object_get(req, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return srv_bad(error, "logit_bias",
                       "'logit_bias' must be an object mapping token ids to biases");
    if (json_object_size(v) == 0) return 0;
    if (!(j->bias = calloc(json_object_size(v), sizeof *j->bias))) return 500;
    const char *key;
    json_t *b;
    int32_t n = 0;
    json_object_foreach(v, key, b) {
        const size_t digits = strspn(key, "0123456789");
        const long long id = digits && digits <= 10 && !key[digits] ? atoll(key) : -1;
        if (id < 0 || id >= s->vocab)
            return srv_bad(error, "logit_bias", "logit_bias: '%.40s' is not a token id in [0, %d)",
                           key, s->vocab);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return srv_bad(error, "logit_bias",
                           "logit_bias['%s'] must be a number between -100 and 100", key);
        j->bias[n++] = (sl_logit_bias){(int32_t)id, (float)json_number_value(b)};
    }
    j->sp.logit_bias = j->bias;
    j->sp.n_logit_bias = n;
    return 0;
}

static int parse(srv *s, srv_kind kind, json_t *req, srv_job *j, srv_request_opts *o,
                 json_t **error) {
    if (!json_is_object(req)) return srv_bad(error, NULL, "the request body must be a JSON object");
    o->kind = kind;
    json_t *model = json_object_get(req, "model");
    if (model && !json_is_string(model)) return srv_bad(error, "model", "'model' must be a string");
    int64_t n = 1, max_tokens = -1, seed = -1, top_k = -1, top_logprobs = -1;
    double temp = -1, top_p = -1, min_p = -1, rep = -1, pres = 0, freq = 0;
    int32_t echo = 0;
    int rc;
    if ((rc = srv_get_int(req, "n", 1, 128, &n, error)) ||
        (rc = srv_get_bool(req, "stream", &o->stream, error)) ||
        (rc = srv_get_int(req, "max_tokens", 1, INT32_MAX, &max_tokens, error)) ||
        (rc = srv_get_int(req, "max_completion_tokens", 1, INT32_MAX, &max_tokens, error)) ||
        (rc = srv_get_number(req, "temperature", 0, 2, &temp, error)) ||
        (rc = srv_get_number(req, "top_p", 0, 1, &top_p, error)) ||
        (rc = srv_get_int(req, "top_k", 0, INT32_MAX, &top_k, error)) ||
        (rc = srv_get_number(req, "min_p", 0, 1, &min_p, error)) ||
        (rc = srv_get_number(req, "repetition_penalty", 1e-3, 100, &rep, error)) ||
        (rc = srv_get_number(req, "presence_penalty", -2, 2, &pres, error)) ||
        (rc = srv_get_number(req, "frequency_penalty", -2, 2, &freq, error)) ||
        (rc = srv_get_int(req, "seed", INT64_MIN, INT64_MAX, &seed, error)) ||
        (rc = srv_get_bool(req, "echo", &echo, error)) ||
        (rc = srv_get_bool(req, "ignore_eos", &j->ignore_eos, error)) ||
        (rc = srv_get_stops(req, "stop", j, error)))
        return rc;
    if (n != 1) return srv_bad(error, "n", "only n=1 is supported");
    /* chat: "logprobs": true and "top_logprobs": N; completions: "logprobs": N */
    if (kind == SRV_CHAT) {
        if ((rc = srv_get_bool(req, "logprobs", &o->logprobs, error)) ||
            (rc = srv_get_int(req, "top_logprobs", 0, SL_GEN_MAX_TOP_LOGPROBS, &top_logprobs,
                              error)))
            return rc;
        if (top_logprobs >= 0 && !o->logprobs)
            return srv_bad(error, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        if ((rc = srv_get_int(req, "logprobs", 0, SL_GEN_MAX_TOP_LOGPROBS, &top_logprobs, error)))
            return rc;
        o->logprobs = top_logprobs >= 0;
    }
    j->logprobs = o->logprobs;
    j->top_logprobs = (int32_t)SL_MAX(top_logprobs, 0);
    if (echo && kind == SRV_CHAT)
        return srv_bad(error, "echo", "'echo' is only supported by /v1/completions");
    /* the generation loop gives the log-probabilities of sampled tokens only */
    if (echo && o->logprobs)
        return srv_bad(error, "echo",
                       "'echo' with 'logprobs' is not supported: the prompt's log-probabilities "
                       "are not computed");
    if (kind != SRV_CHAT && json_array_size(json_object_get(req, "tools")) > 0)
        return srv_bad(error, "tools", "tools are only supported by /v1/chat/completions");
    if ((rc = get_response_format(s, kind, req, j, error))) return rc;
    json_t *so = json_object_get(req, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return srv_bad(error, "stream_options", "'stream_options' must be an object");
        if ((rc = srv_get_bool(so, "include_usage", &o->include_usage, error))) return rc;
    }

    srv_sampling(s, j, temp, top_p, top_k);
    if (min_p >= 0) j->sp.min_p = (float)min_p;
    if (rep > 0) j->sp.repetition_penalty = (float)rep;
    j->sp.presence_penalty = (float)pres;
    j->sp.frequency_penalty = (float)freq;
    if (json_is_integer(json_object_get(req, "seed"))) j->sp.seed = (uint64_t)seed;
    if ((rc = srv_get_logit_bias(s, req, j, error))) return rc;

    /* The prompt's ids. */
    char *text = NULL;
    if (kind == SRV_CHAT && sl_reply_needs_special(&s->tpl)) { /* content and reasoning */
        j->parts = 1;
        sl_reply_init(&j->parser, &s->tpl);
    }
    rc = kind == SRV_CHAT ? chat_prompt(s, req, j, o, error)
                          : completion_prompt(s, req, j, &text, error);
    if (rc == 500) *error = srv_error_json("out of memory", "server_error", NULL, NULL);
    if (rc) {
        free(text);
        return rc;
    }
    if (text) {
        /* A completions prompt is raw text: special tokens' text in it is parsed, as
         * llama.cpp's server does, since no template is there to insert them; it starts with
         * the tokenizer's BOS, as tokenizer(prompt) does (vLLM's add_special_tokens). */
        sl_error err = {0};
        sl_status st = sl_tokenizer_encode_prompt(s->tok, text, strlen(text), &j->prompt, &err);
        if (!st && echo) { /* the prompt as it was given (not the BOS the encoding adds) */
            o->echo = text;
            o->echo_len = strlen(text);
            text = NULL;
        }
        free(text);
        if (st) return srv_bad(error, kind == SRV_CHAT ? "messages" : "prompt", "%s", err.msg);
    } else if (echo) { /* token ids: their text, special tokens' included */
        sl_error err = {0};
        sl_status st = sl_tokenizer_decode(s->tok, j->prompt.ids, j->prompt.n, 0, &o->echo,
                                           &o->echo_len, &err);
        if (st == SL_ERR_NOMEM) {
            *error = srv_error_json("out of memory", "server_error", NULL, NULL);
            return 500;
        }
        if (st) return srv_bad(error, "prompt", "%s", err.msg);
    }
    /* The legacy completions endpoint defaults to 16 tokens, chat to the context's end. */
    if (max_tokens < 0 && kind == SRV_COMPLETION) max_tokens = 16;
    return srv_fit_prompt(s, j, kind == SRV_CHAT ? "messages" : "prompt", max_tokens, error);
}

void srv_sampling(srv *s, srv_job *j, double temp, double top_p, int64_t top_k) {
    j->sp = s->cfg.sp; /* the server's defaults (generation_config.json) */
    if (temp >= 0) j->sp.temperature = (float)temp;
    if (top_p == 0) j->sp.temperature = 0; /* nothing but the most likely token */
    if (top_p > 0) j->sp.top_p = (float)top_p;
    if (top_k >= 0) j->sp.top_k = (int32_t)top_k;
    j->sp.seed = srv_next_number(s) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(sl_now() * 1e9);
}

int srv_fit_prompt(srv *s, srv_job *j, const char *what, int64_t max_tokens, json_t **error) {
    if (j->prompt.n == 0) return srv_bad(error, what, "the prompt is empty (0 tokens)");
    if ((int64_t)j->prompt.n + 1 > s->max_ctx) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "This model's maximum context length is %d tokens. However, your %s resulted "
                 "in %zu tokens (at least %zu are needed to reply).",
                 s->max_ctx, what, j->prompt.n, j->prompt.n + 1);
        *error = srv_error_json(msg, "invalid_request_error", what, "context_length_exceeded");
        return 400;
    }
    const int64_t room = s->max_ctx - (int64_t)j->prompt.n;
    j->max_tokens = (int32_t)(max_tokens < 0 ? room : SL_MIN(max_tokens, room));
    return 0;
}

int srv_encode_chat_free(srv *s, sl_chat_msg *m, char **owned, size_t n, const srv_request_opts *o,
                         int32_t think, srv_job *j, int rc, json_t **error) {
    const sl_chat_tools tools = {(const char *const *)o->tool_defs, o->n_tool_defs};
    if (!rc) rc = srv_encode_chat_tools(s, m, (int32_t)n, &tools, think, j, error);
    for (size_t i = 0; m && i < n; i++) {
        for (int32_t k = 0; k < m[i].n_tool_calls; k++)
            free((char *)m[i].tool_calls[k].arguments);
        free((void *)m[i].tool_calls);
    }
    for (size_t i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
    free(m);
    return rc;
}

int srv_msg_role(json_t *msg, size_t i, const char **role, json_t **error) {
    json_t *r = json_object_get(msg, "role");
    if (!json_is_object(msg) || !json_is_string(r))
        return srv_bad(error, "messages", "messages[%zu] must be an object with a string 'role'",
                       i);
    *role = json_string_value(r);
    return 0;
}

json_t *srv_load_body(const char *body, size_t len, json_t **error) {
    json_error_t je;
    json_t *req = json_loadb(body, len, 0, &je);
    if (!req)
        srv_bad(error, NULL, "invalid JSON in the request body: %s (line %d, column %d)", je.text,
                je.line, je.column);
    return req;
}

int srv_parse_request(srv *s, srv_kind kind, const char *body, size_t len, srv_job *j,
                      srv_request_opts *o, json_t **error) {
    json_t *req = srv_load_body(body, len, error);
    if (!req) return 400;
    int rc = parse(s, kind, req, j, o, error);
    json_decref(req);
    return rc;
}

/* ---------------------------------------------------------------- responses */

const char *srv_finish_reason(const srv_job *j) {
    return j->res.finish == SL_GEN_STOP ? "stop" : "length";
}

json_t *srv_usage_json(const srv_job *j) {
    const sl_gen_result *r = &j->res;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r->prompt_tokens,
                     "completion_tokens", r->completion_tokens, "total_tokens",
                     r->prompt_tokens + r->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", r->cached_tokens);
}

json_t *srv_text_json(const char *text, size_t len) {
    json_t *v = json_stringn(text ? text : "", text ? len : 0);
    return v ? v : json_string("");
}

static json_t *envelope(const srv *s, const char *id, int64_t created, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object", object, "created",
                     (json_int_t)created, "model", s->cfg.model_id, "system_fingerprint",
                     "sluice-" SL_VERSION);
}

/* ---------------------------------------------------------------- logprobs */

size_t srv_toks_end(const srv_job *j) {
    size_t n = j->n_toks;
    if (j->res.stop_hit && !j->parts) /* the tokens whose text the stop string cut off */
        while (n > 0 && (size_t)j->toks[n - 1].offset >= j->text_len)
            n--;
    return n;
}

/* A log-probability as JSON: -inf (an id ruled out) as OpenAI's floor, -9999. */
static json_t *logprob_json(float lp) {
    return json_real(isfinite(lp) ? lp : -9999.0);
}

/* The token's text (its bytes when they are UTF-8 on their own, else as decoded, with
 * U+FFFD) and, when bytes is not NULL, *bytes its bytes as an array of numbers. */
static json_t *token_json(const srv *s, int32_t id, json_t **bytes) {
    char buf[256], *p = buf;
    int32_t n = sl_tokenizer_token_bytes(s->tok, id, buf, (int32_t)sizeof buf);
    if (n > (int32_t)sizeof buf && (p = malloc((size_t)n)))
        sl_tokenizer_token_bytes(s->tok, id, p, n);
    n = p ? SL_MAX(n, 0) : 0;
    json_t *text = json_stringn(p ? p : "", (size_t)n);
    if (bytes) {
        *bytes = json_array();
        for (int32_t i = 0; *bytes && i < n; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)p[i]));
    }
    if (p != buf) free(p);
    if (!text) { /* part of a character */
        char *t = NULL;
        size_t len = 0;
        sl_error err = {0};
        sl_tokenizer_decode(s->tok, &id, 1, 0, &t, &len, &err);
        text = srv_text_json(t, len);
        free(t);
    }
    return text;
}

/* Chat's {"token", "logprob", "bytes"} of one id. */
static json_t *chat_logprob(const srv *s, int32_t id, float lp) {
    json_t *bytes = NULL, *tok = token_json(s, id, &bytes);
    return json_pack("{s:o, s:o, s:o}", "token", tok, "logprob", logprob_json(lp), "bytes",
                     bytes ? bytes : json_null());
}

json_t *srv_logprobs_json(const srv *s, srv_kind kind, const srv_job *j, size_t from, size_t to) {
    if (kind == SRV_CHAT) {
        json_t *content = json_array();
        for (size_t i = from; content && i < to; i++) {
            const srv_tok *t = &j->toks[i];
            json_t *e = chat_logprob(s, t->id, t->logprob), *top = json_array();
            for (int32_t k = 0; top && k < t->n_top; k++)
                json_array_append_new(top, chat_logprob(s, t->top[k].id, t->top[k].logprob));
            json_object_set_new(e, "top_logprobs", top);
            json_array_append_new(content, e);
        }
        return json_pack("{s:o, s:n}", "content", content, "refusal");
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (size_t i = from; i < to; i++) {
        const srv_tok *t = &j->toks[i];
        json_array_append_new(tokens, token_json(s, t->id, NULL));
        json_array_append_new(lps, logprob_json(t->logprob));
        json_t *top = json_object();
        for (int32_t k = 0; k < t->n_top; k++) {
            json_t *name = token_json(s, t->top[k].id, NULL);
            if (name)
                json_object_set_new(top, json_string_value(name), logprob_json(t->top[k].logprob));
            json_decref(name);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer(t->offset));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

/* ---------------------------------------------------------------- responses, chunks */

size_t srv_tool_hold(const char *text, size_t from, size_t len, int done) {
    static const char open[] = "<tool_call>";
    const size_t n = sizeof open - 1;
    size_t i = from;
    for (; i < len; i++) {
        if (text[i] != '<') continue;
        const size_t m = SL_MIN(n, len - i);
        if (!memcmp(text + i, open, m) && (m == n || !done)) break;
    }
    if (i == len && done) return len;
    /* the whitespace before it waits too: the template's line break before a call is not
     * content (the calls' reading trims it), so that a stream says what the whole answer does */
    while (i > from && (text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\r' ||
                        text[i - 1] == '\n'))
        i--;
    return i;
}

void srv_request_opts_free(srv_request_opts *o) {
    for (int32_t i = 0; i < o->n_tool_defs; i++)
        free(o->tool_defs[i]);
    free(o->tool_defs);
    free(o->echo);
    o->tool_defs = NULL;
    o->n_tool_defs = 0;
    o->echo = NULL;
}

int srv_read_calls(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                   sl_tool_calls *out) {
    const sl_chat_tools tools = {(const char *const *)o->tool_defs, o->n_tool_defs};
    sl_error err = {0};
    return sl_tool_calls_read(s->tpl.tool_form, &tools, text ? text : "", text ? len : 0, out, &err)
               ? -1
               : 0;
}

void srv_call_id(const char *prefix, char *out, size_t cap) {
    static atomic_uint_fast64_t fallback;
    uint64_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) /* unique, if not unguessable */
        rnd[0] = (uint64_t)(sl_now() * 1e9), rnd[1] = atomic_fetch_add(&fallback, 1);
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)rnd[0],
             (unsigned long long)(rnd[1] & 0xffffffffu));
}

json_t *srv_tool_calls_json(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                            int stream, json_t **content) {
    sl_tool_calls tc;
    if (srv_read_calls(s, o, text, len, &tc)) return NULL; /* out of memory: the reply as text */
    json_t *calls = tc.n > 0 ? json_array() : NULL;
    for (int32_t i = 0; calls && i < tc.n; i++) {
        char id[48];
        srv_call_id("call_", id, sizeof id);
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                              "name", tc.calls[i].name, "arguments", tc.calls[i].arguments);
        if (stream && c) json_object_set_new(c, "index", json_integer(i));
        json_array_append_new(calls, c);
    }
    if (calls) {
        json_decref(*content);
        *content = tc.content_len ? srv_text_json(tc.content, tc.content_len) : json_null();
    }
    sl_tool_calls_free(&tc);
    return calls;
}

json_t *srv_response_json(const srv *s, const srv_job *j, const srv_request_opts *o, const char *id,
                          int64_t created) {
    const int chat = o->kind == SRV_CHAT;
    json_t *r = envelope(s, id, created, chat ? "chat.completion" : "text_completion");
    json_t *choice =
        json_pack("{s:i, s:o, s:s}", "index", 0, "logprobs",
                  o->logprobs ? srv_logprobs_json(s, o->kind, j, 0, srv_toks_end(j)) : json_null(),
                  "finish_reason", srv_finish_reason(j));
    json_t *text = srv_text_json(j->text, j->text_len), *calls = NULL;
    if (o->echo) { /* completions: the prompt, then the reply */
        char *both = NULL;
        size_t len = 0, cap = 0;
        if (!sl_append(&both, &len, &cap, o->echo, o->echo_len) &&
            !sl_append(&both, &len, &cap, j->text ? j->text : "", j->text_len)) {
            json_decref(text);
            text = srv_text_json(both, len);
        }
        free(both);
    }
    if (chat && j->tool_calls) calls = srv_tool_calls_json(s, o, j->text, j->text_len, 0, &text);
    if (calls) json_object_set_new(choice, "finish_reason", json_string("tool_calls"));
    if (chat) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
        if (calls) json_object_set_new(msg, "tool_calls", calls);
        /* as vLLM's reasoning parsers give it */
        if (j->parts)
            json_object_set_new(msg, "reasoning_content",
                                srv_text_json(j->reasoning, j->reasoning_len));
        json_object_set_new(choice, "message", msg);
    } else
        json_object_set_new(choice, "text", text);
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    json_object_set_new(r, "usage", srv_usage_json(j));
    return r;
}

json_t *srv_chunk_json(const srv *s, const srv_request_opts *o, const char *id, int64_t created,
                       const char *text, size_t len, const char *reasoning, size_t rlen,
                       const char *finish, int role, json_t *logprobs) {
    const int chat = o->kind == SRV_CHAT;
    json_t *r = envelope(s, id, created, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice =
        json_pack("{s:i, s:o, s:o}", "index", 0, "logprobs", logprobs ? logprobs : json_null(),
                  "finish_reason", finish ? json_string(finish) : json_null());
    if (chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (reasoning)
            json_object_set_new(delta, "reasoning_content", srv_text_json(reasoning, rlen));
        if (text || role) json_object_set_new(delta, "content", srv_text_json(text, len));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", srv_text_json(text, len));
    }
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    if (o->include_usage) json_object_set_new(r, "usage", json_null());
    return r;
}
