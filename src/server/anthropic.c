/*
 * The Anthropic Messages API's JSON (POST /v1/messages): requests into jobs through
 * the same template, sampling and stop strings as the OpenAI routes (openai.c), and the
 * message, stream events and error objects in Anthropic's shape. Text and tools: image and
 * document blocks are a 400 naming them.
 *
 * Tools go through the OpenAI route's rendering, their shapes converted: a tool {name,
 * description, input_schema} is offered as {"type": "function", "function": {name,
 * description, "parameters": input_schema}}; an assistant message's tool_use blocks {id, name,
 * input} are its tool calls (name, input as the arguments), and a user message's tool_result
 * blocks {tool_use_id, content} are "tool" messages, in order, a run of text blocks between
 * them a user message. The reply's calls come back as tool_use blocks (stop_reason tool_use).
 * A stream is this sequence of events, each "event: TYPE\ndata: JSON\n\n" (http.c):
 *   message_start                       the message with empty content, usage.input_tokens
 *   content_block_start    index 0      {"type":"text","text":""}  (or "thinking")
 *   content_block_delta    index 0 ...  text_delta (thinking_delta)
 *   content_block_stop     index 0      ... then index 1 when the kind of text changes
 *   content_block_start    index N      {"type":"tool_use","id","name","input":{}}  (each call,
 *   content_block_delta    index N      input_json_delta: the whole input     read at the end)
 *   content_block_stop     index N
 *   message_delta                       stop_reason, stop_sequence, usage.output_tokens
 *   message_stop
 * or, when the generation fails, an "error" event in place of the end.
 */
#include "server/internal.h"

/* ---------------------------------------------------------------- requests */

/* Text of a system prompt or a message's content (where names it): a string, or an array of
 * text blocks joined with "\n" (malloc'ed into *out). Thinking blocks of earlier assistant
 * turns are skipped: Anthropic's API leaves them out of the context too. */
static int blocks_text(json_t *content, const char *param, const char *where, char **out,
                       json_t **error) {
    if (json_is_string(content)) return (*out = strdup(json_string_value(content))) ? 0 : 500;
    if (!json_is_array(content))
        return srv_bad(error, param, "%s must be a string or an array of content blocks", where);
    size_t len = 0, k;
    json_t *b;
    json_array_foreach(content, k, b) {
        json_t *type = json_object_get(b, "type"), *text = json_object_get(b, "text");
        if (!json_is_object(b) || !json_is_string(type))
            return srv_bad(error, param, "%s[%zu] must be an object with a string 'type'", where,
                           k);
        const char *t = json_string_value(type);
        if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) continue;
        if (strcmp(t, "text"))
            return srv_bad(error, param,
                           "%s[%zu]: content blocks of type '%s' are not supported yet (only "
                           "text)",
                           where, k, t);
        if (!json_is_string(text))
            return srv_bad(error, param, "%s[%zu].text must be a string", where, k);
        len += json_string_length(text) + 1;
    }
    char *s = malloc(len + 1);
    if (!s) return 500;
    len = 0;
    json_array_foreach(content, k, b) {
        if (strcmp(json_string_value(json_object_get(b, "type")), "text")) continue;
        json_t *text = json_object_get(b, "text");
        if (len) s[len++] = '\n';
        memcpy(s + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    s[len] = '\0';
    *out = s;
    return 0;
}

/* A conversation being built from Anthropic's messages: its messages and their texts (owned),
 * in room counted beforehand (a message per block at most). */
typedef struct conv {
    sl_chat_msg *m;
    char **owned; /* [i]: m[i]'s text */
    size_t n, cap;
} conv;

/* Appends a message of text (taken: freed on failure); NULL when there is no room. */
static sl_chat_msg *conv_add(conv *c, const char *role, char *text) {
    if (c->n == c->cap) {
        free(text);
        return NULL;
    }
    c->owned[c->n] = text;
    c->m[c->n] = (sl_chat_msg){.role = role, .content = text};
    return &c->m[c->n++];
}

/* A content that is not an array of blocks (a string): one message of role. */
static int string_msg(json_t *content, const char *where, const char *role, conv *c,
                      json_t **error) {
    char *text = NULL;
    int rc = blocks_text(content, "messages", where, &text, error);
    return rc ? rc : conv_add(c, role, text) ? 0 : 500;
}

/* A user message's content: a string, or blocks, of which each tool_result becomes a "tool"
 * message and each run of text blocks between them a user message ("\n" between its texts). */
static int user_msgs(srv *s, json_t *content, size_t i, conv *c, json_t **error) {
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (!json_is_array(content)) return string_msg(content, where, "user", c, error);
    char *run = NULL;
    size_t len = 0, cap = 0, k;
    const size_t n0 = c->n;
    int in_run = 0, rc = 0;
    json_t *b;
    json_array_foreach(content, k, b) {
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !t) {
            rc = srv_bad(error, "messages", "%s[%zu] must be an object with a string 'type'", where,
                         k);
            break;
        }
        if (!strcmp(t, "text")) {
            json_t *text = json_object_get(b, "text");
            if (!json_is_string(text)) {
                rc = srv_bad(error, "messages", "%s[%zu].text must be a string", where, k);
                break;
            }
            if ((in_run && sl_append(&run, &len, &cap, "\n", 1)) ||
                sl_append(&run, &len, &cap, json_string_value(text), json_string_length(text))) {
                rc = 500;
                break;
            }
            in_run = 1;
            continue;
        }
        if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) continue;
        if (strcmp(t, "tool_result")) {
            rc = srv_bad(error, "messages",
                         "%s[%zu]: content blocks of type '%s' are not supported yet in a user "
                         "message (text, tool_result)",
                         where, k, t);
            break;
        }
        if (!sl_chat_supports_tools(&s->tpl)) {
            rc = srv_bad(error, "messages",
                         "%s[%zu]: tool results are not supported with the %s "
                         "chat template",
                         where, k, sl_chat_template_kind_name(s->tpl.kind));
            break;
        }
        json_t *id = json_object_get(b, "tool_use_id"), *res = json_object_get(b, "content");
        int32_t is_error = 0;
        char w[96], *text = NULL;
        snprintf(w, sizeof w, "%s[%zu].content", where, k);
        if (!json_is_string(id)) {
            rc = srv_bad(error, "messages", "%s[%zu].tool_use_id must be a string", where, k);
            break;
        }
        /* is_error has no place in the template: a failure's text is the result the model
         * reads, as the OpenAI route gives it (clients write it as an error message) */
        if (srv_get_bool(b, "is_error", &is_error, error)) {
            json_decref(*error);
            rc = srv_bad(error, "messages", "%s[%zu].is_error must be a boolean", where, k);
            break;
        }
        (void)is_error;
        if (in_run && !conv_add(c, "user", run)) {
            run = NULL;
            rc = 500;
            break;
        }
        run = NULL, len = cap = 0, in_run = 0;
        if ((rc = res && !json_is_null(res) ? blocks_text(res, "messages", w, &text, error)
                  : (text = strdup(""))     ? 0
                                            : 500))
            break;
        if (!conv_add(c, "tool", text)) {
            rc = 500;
            break;
        }
    }
    if (!rc && (in_run || c->n == n0)) { /* trailing text, or no block that renders */
        if (!run && !(run = strdup(""))) return 500;
        if (!conv_add(c, "user", run)) return 500;
        run = NULL;
    }
    free(run);
    return rc;
}

/* An assistant message's content: its text blocks joined with "\n" and its tool_use blocks as
 * its calls (arguments: the input as tojson writes it, owned by the message's tool_calls). */
static int assistant_msg(srv *s, json_t *content, size_t i, conv *c, json_t **error) {
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (!json_is_array(content)) return string_msg(content, where, "assistant", c, error);
    size_t k, n_calls = 0, len = 0, cap = 0;
    json_t *b;
    json_array_foreach(content, k, b) {
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !t)
            return srv_bad(error, "messages", "%s[%zu] must be an object with a string 'type'",
                           where, k);
        if (!strcmp(t, "text")) {
            if (!json_is_string(json_object_get(b, "text")))
                return srv_bad(error, "messages", "%s[%zu].text must be a string", where, k);
        } else if (!strcmp(t, "tool_use")) {
            if (!sl_chat_supports_tools(&s->tpl))
                return srv_bad(error, "messages",
                               "%s[%zu]: tool calls are not supported with the %s chat template",
                               where, k, sl_chat_template_kind_name(s->tpl.kind));
            if (!json_is_string(json_object_get(b, "id")))
                return srv_bad(error, "messages", "%s[%zu].id must be a string", where, k);
            if (!srv_valid_name(json_object_get(b, "name")))
                return srv_bad(error, "messages",
                               "%s[%zu].name must be 1 to 64 letters, digits, '_' or '-'", where,
                               k);
            if (!json_is_object(json_object_get(b, "input")))
                return srv_bad(error, "messages", "%s[%zu].input must be an object", where, k);
            n_calls++;
        } else if (strcmp(t, "thinking") && strcmp(t, "redacted_thinking")) {
            return srv_bad(error, "messages",
                           "%s[%zu]: content blocks of type '%s' are not supported yet in an "
                           "assistant message (text, tool_use)",
                           where, k, t);
        }
    }
    char *text = NULL;
    sl_chat_tool_call *calls = n_calls ? calloc(n_calls, sizeof *calls) : NULL;
    int oom = (n_calls && !calls) || sl_append(&text, &len, &cap, "", 0);
    sl_chat_msg *m = oom ? NULL : conv_add(c, "assistant", text);
    if (!m) {
        if (!oom) text = NULL; /* conv_add freed it */
        free(text);
        free(calls);
        return 500;
    }
    m->tool_calls = calls;
    int first = 1;
    json_array_foreach(content, k, b) {
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!strcmp(t, "text")) {
            json_t *v = json_object_get(b, "text");
            if ((!first && sl_append(&text, &len, &cap, "\n", 1)) ||
                sl_append(&text, &len, &cap, json_string_value(v), json_string_length(v)))
                return 500;
            first = 0;
            m->content = c->owned[c->n - 1] = text;
        } else if (!strcmp(t, "tool_use")) {
            sl_chat_tool_call *call = &calls[m->n_tool_calls];
            call->name = json_string_value(json_object_get(b, "name"));
            if (!(call->arguments = sl_chat_tojson(json_object_get(b, "input")))) return 500;
            m->n_tool_calls++;
        }
    }
    return 0;
}

/* system + messages -> the prompt's ids in j->prompt, through the chat template (with the
 * tools in o). */
static int messages_prompt(srv *s, json_t *req, srv_job *j, srv_request_opts *o, int32_t think,
                           json_t **error) {
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_bad(error, "messages", "messages: must be a non-empty array");
    json_t *sys = json_object_get(req, "system");
    size_t n = sys && !json_is_null(sys), i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) { /* a message per block at most */
        const size_t blocks = json_array_size(json_object_get(msg, "content"));
        n += blocks ? blocks : 1;
    }
    conv c = {calloc(n, sizeof *c.m), calloc(n, sizeof *c.owned), 0, n};
    int rc = c.m && c.owned ? 0 : 500;
    if (!rc && sys && !json_is_null(sys)) {
        char *text = NULL;
        if (!(rc = blocks_text(sys, "system", "system", &text, error)))
            rc = conv_add(&c, "system", text) ? 0 : 500;
    }
    const size_t last = json_array_size(msgs) - 1;
    for (i = 0; i <= last && !rc; i++) {
        msg = json_array_get(msgs, i);
        const char *r;
        if ((rc = srv_msg_role(msg, i, &r, error))) break;
        if (!strcmp(r, "system")) {
            rc = srv_bad(error, "messages",
                         "messages[%zu].role 'system' is not supported: the system prompt goes "
                         "in the top-level 'system' field",
                         i);
            break;
        }
        if (strcmp(r, "user") && strcmp(r, "assistant")) {
            rc = srv_bad(error, "messages",
                         "messages[%zu].role '%s' is not supported (user or assistant)", i, r);
            break;
        }
        /* Anthropic continues a final assistant message (a prefill); the template here would
         * close it and open a new turn, which is not what the client asked for. */
        if (i == last && !strcmp(r, "assistant")) {
            rc = srv_bad(error, "messages",
                         "messages[%zu]: a final assistant message (a prefill to continue) is "
                         "not supported yet; end with a user message",
                         i);
            break;
        }
        json_t *content = json_object_get(msg, "content");
        if (!content || json_is_null(content)) {
            rc = srv_bad(error, "messages", "messages[%zu].content: Field required", i);
            break;
        }
        rc = !strcmp(r, "user") ? user_msgs(s, content, i, &c, error)
                                : assistant_msg(s, content, i, &c, error);
    }
    return srv_encode_chat_free(s, c.m, c.owned, rc ? n : c.n, o, think, j, rc, error);
}

/* tools [{name, description, input_schema}] into o->tool_defs in the OpenAI route's shape, and
 * tool_choice {"type": "auto"} or {"type": "none"} (offered, no calls read back, as there). */
static int get_tools(srv *s, json_t *req, srv_job *j, srv_request_opts *o, json_t **error) {
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    const char *c = json_string_value(json_object_get(choice, "type"));
    int32_t no_parallel = 0;
    if (choice && !json_is_null(choice)) {
        if (!json_is_object(choice) || !c)
            return srv_bad(error, "tool_choice",
                           "tool_choice: must be an object with a string 'type'");
        if (!strcmp(c, "any") || !strcmp(c, "tool"))
            return srv_bad(error, "tool_choice",
                           "tool_choice: only {\"type\": \"auto\"} and {\"type\": \"none\"} are "
                           "supported (\"%s\" needs constrained decoding, which sluice does not "
                           "have)",
                           c);
        if (strcmp(c, "auto") && strcmp(c, "none"))
            return srv_bad(error, "tool_choice",
                           "tool_choice: unknown type '%.40s' (auto, any, tool or none)", c);
        int rc = srv_get_bool(choice, "disable_parallel_tool_use", &no_parallel, error);
        if (rc) return rc;
    }
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return srv_bad(error, "tools", "tools: must be an array");
    const size_t n = json_array_size(tools);
    if (n == 0) return 0;
    if (!sl_chat_supports_tools(&s->tpl))
        return srv_bad(error, "tools", "tools: not supported with the %s chat template",
                       sl_chat_template_kind_name(s->tpl.kind));
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *type = json_object_get(t, "type"), *desc = json_object_get(t, "description");
        if (!json_is_object(t)) return srv_bad(error, "tools", "tools[%zu] must be an object", i);
        if (type && !json_is_null(type) &&
            (!json_is_string(type) || strcmp(json_string_value(type), "custom")))
            return srv_bad(error, "tools",
                           "tools[%zu]: only client tools (no type, or \"custom\") are supported; "
                           "server tools are not run here",
                           i);
        if (!srv_valid_name(json_object_get(t, "name")))
            return srv_bad(error, "tools",
                           "tools[%zu].name must be 1 to 64 letters, digits, '_' or "
                           "'-'",
                           i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return srv_bad(error, "tools", "tools[%zu].description must be a string", i);
        if (!json_is_object(json_object_get(t, "input_schema")))
            return srv_bad(error, "tools", "tools[%zu].input_schema must be an object", i);
    }
    if (!(o->tool_defs = calloc(n, sizeof *o->tool_defs))) return 500;
    json_array_foreach(tools, i, t) {
        json_t *desc = json_object_get(t, "description");
        json_t *f = json_pack("{s:O}", "name", json_object_get(t, "name"));
        if (f && json_is_string(desc)) json_object_set(f, "description", desc);
        if (f) json_object_set(f, "parameters", json_object_get(t, "input_schema"));
        json_t *def = f ? json_pack("{s:s, s:o}", "type", "function", "function", f) : NULL;
        o->tool_defs[i] = def ? sl_chat_tojson(def) : NULL;
        json_decref(def);
        if (!o->tool_defs[i]) return 500;
        o->n_tool_defs++;
    }
    j->tool_calls = strcmp(c ? c : "auto", "none") != 0;
    return 0;
}

/* thinking: {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}: the template's
 * enable_thinking (the budget is not enforced). */
static int get_thinking(json_t *req, int32_t *think, json_t **error) {
    json_t *v = json_object_get(req, "thinking");
    if (!v || json_is_null(v)) return 0;
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled")))
        return srv_bad(
            error, "thinking",
            "thinking: must be {\"type\": \"enabled\", ...} or {\"type\": \"disabled\"}");
    *think = !strcmp(type, "enabled");
    return 0;
}

static int parse(srv *s, json_t *req, int count, srv_job *j, srv_request_opts *o, json_t **error) {
    if (!json_is_object(req)) return srv_bad(error, NULL, "the request body must be a JSON object");
    o->kind = SRV_MESSAGES;
    json_t *model = json_object_get(req, "model");
    if (model && !json_is_string(model)) return srv_bad(error, "model", "model: must be a string");
    json_t *mt = json_object_get(req, "max_tokens");
    if (!count && (!mt || json_is_null(mt)))
        return srv_bad(error, "max_tokens", "max_tokens: Field required");
    json_t *stops = json_object_get(req, "stop_sequences");
    if (stops && !json_is_null(stops) && !json_is_array(stops))
        return srv_bad(error, "stop_sequences", "stop_sequences: must be an array of strings");
    int64_t max_tokens = -1, top_k = -1;
    double temp = -1, top_p = -1;
    int32_t think = s->cfg.think;
    int rc;
    if ((rc = srv_get_int(req, "max_tokens", 1, INT32_MAX, &max_tokens, error)) ||
        (rc = srv_get_bool(req, "stream", &o->stream, error)) ||
        (rc = srv_get_number(req, "temperature", 0, 1, &temp, error)) ||
        (rc = srv_get_number(req, "top_p", 0, 1, &top_p, error)) ||
        (rc = srv_get_int(req, "top_k", 0, INT32_MAX, &top_k, error)) ||
        (rc = srv_get_stops(req, "stop_sequences", j, error)) ||
        (rc = get_thinking(req, &think, error)))
        return rc;
    srv_sampling(s, j, temp, top_p, top_k);
    /* logit_bias: a sluice extension (Anthropic's API has none), as on the OpenAI routes */
    if ((rc = srv_get_logit_bias(s, req, j, error)) || (rc = get_tools(s, req, j, o, error))) {
        if (rc == 500) *error = srv_error_json("out of memory", "server_error", NULL, NULL);
        return rc;
    }
    if (sl_reply_needs_special(&s->tpl)) { /* text and thinking */
        j->parts = 1;
        sl_reply_init(&j->parser, &s->tpl);
    }
    if ((rc = messages_prompt(s, req, j, o, think, error))) {
        if (rc == 500) *error = srv_error_json("out of memory", "server_error", NULL, NULL);
        return rc;
    }
    if (count) /* counted whatever the context holds, as Anthropic's count does */
        return j->prompt.n ? 0 : srv_bad(error, "messages", "the prompt is empty (0 tokens)");
    return srv_fit_prompt(s, j, "messages", max_tokens, error);
}

int srv_parse_messages(srv *s, const char *body, size_t len, int count, srv_job *j,
                       srv_request_opts *o, json_t **error) {
    json_t *req = srv_load_body(body, len, error);
    if (!req) return 400;
    int rc = parse(s, req, count, j, o, error);
    json_decref(req);
    return rc;
}

/* ---------------------------------------------------------------- answers */

json_t *srv_anthropic_error(int *status, json_t *openai) {
    const char *msg =
        json_string_value(json_object_get(json_object_get(openai, "error"), "message"));
    if (*status == 503) *status = 529; /* busy, stopping: Anthropic's "try again later" */
    const int st = *status;
    const char *type = st == 400   ? "invalid_request_error"
                       : st == 401 ? "authentication_error"
                       : st == 403 ? "permission_error"
                       : st == 404 ? "not_found_error"
                       : st == 413 ? "request_too_large"
                       : st == 429 ? "rate_limit_error"
                       : st == 529 ? "overloaded_error"
                       : st < 500  ? "invalid_request_error"
                                   : "api_error";
    json_t *r = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                          msg ? msg : "internal error");
    json_decref(openai);
    return r;
}

const char *srv_stop_reason(const srv_job *j, int tool_use) {
    if (tool_use) return "tool_use";
    if (j->res.finish != SL_GEN_STOP) return "max_tokens";
    return j->res.stop_hit ? "stop_sequence" : "end_turn";
}

json_t *srv_stop_sequence_json(const srv_job *j) {
    const int32_t k = j->res.stop_hit;
    return j->res.finish == SL_GEN_STOP && k > 0 && k <= j->n_stops ? json_string(j->stops[k - 1])
                                                                    : json_null();
}

json_t *srv_tool_use_json(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                          json_t **content) {
    sl_tool_calls tc;
    if (srv_read_calls(s, o, text, len, &tc)) return NULL; /* out of memory: the reply as text */
    json_t *blocks = tc.n > 0 ? json_array() : NULL;
    for (int32_t i = 0; blocks && i < tc.n; i++) {
        char id[48];
        srv_call_id("toolu_", id, sizeof id);
        json_t *input = json_loads(tc.calls[i].arguments, JSON_ALLOW_NUL, NULL); /* an object */
        json_array_append_new(blocks, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                                                id, "name", tc.calls[i].name, "input",
                                                input ? input : json_object()));
    }
    if (blocks) {
        json_decref(*content);
        *content = srv_text_json(tc.content, tc.content_len);
    }
    sl_tool_calls_free(&tc);
    return blocks;
}

json_t *srv_message_json(const srv *s, const srv_job *j, const srv_request_opts *o,
                         const char *id) {
    json_t *content = json_array(), *text = srv_text_json(j->text, j->text_len);
    json_t *calls = j->tool_calls ? srv_tool_use_json(s, o, j->text, j->text_len, &text) : NULL;
    if (j->reasoning_len) /* the reply's reasoning, when its template tells it apart */
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 srv_text_json(j->reasoning, j->reasoning_len),
                                                 "signature", ""));
    if (!calls || json_string_length(text)) /* calls alone: no empty text block before them */
        json_array_append_new(content, json_pack("{s:s, s:O}", "type", "text", "text", text));
    json_decref(text);
    json_array_extend(content, calls);
    json_decref(calls);
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:{s:i, s:i}}", "id", id, "type",
                     "message", "role", "assistant", "model", s->cfg.model_id, "content", content,
                     "stop_reason", srv_stop_reason(j, calls != NULL), "stop_sequence",
                     srv_stop_sequence_json(j), "usage", "input_tokens", j->res.prompt_tokens,
                     "output_tokens", j->res.completion_tokens);
}

json_t *srv_message_start_json(const srv *s, const srv_job *j, const char *id) {
    return json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}}", "type",
                     "message_start", "message", "id", id, "type", "message", "role", "assistant",
                     "model", s->cfg.model_id, "content", "stop_reason", "stop_sequence", "usage",
                     "input_tokens", (int)j->prompt.n, "output_tokens", 0);
}

json_t *srv_block_json(const char *type, int32_t index, int thinking, const char *text,
                       size_t len) {
    json_t *r = json_pack("{s:s, s:i}", "type", type, "index", index);
    if (!strcmp(type, "content_block_start"))
        json_object_set_new(r, "content_block",
                            thinking ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking",
                                                 "", "signature", "")
                                     : json_pack("{s:s, s:s}", "type", "text", "text", ""));
    else if (!strcmp(type, "content_block_delta"))
        json_object_set_new(r, "delta",
                            json_pack("{s:s, s:o}", "type",
                                      thinking ? "thinking_delta" : "text_delta",
                                      thinking ? "thinking" : "text", srv_text_json(text, len)));
    return r;
}

json_t *srv_tool_block_start_json(int32_t index, const json_t *block) {
    return json_pack("{s:s, s:i, s:{s:s, s:O, s:O, s:{}}}", "type", "content_block_start", "index",
                     index, "content_block", "type", "tool_use", "id", json_object_get(block, "id"),
                     "name", json_object_get(block, "name"), "input");
}

json_t *srv_tool_block_delta_json(int32_t index, const json_t *block) {
    char *args = sl_chat_tojson(json_object_get(block, "input"));
    json_t *r = args ? json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                 index, "delta", "type", "input_json_delta", "partial_json", args)
                     : NULL;
    free(args);
    return r;
}

json_t *srv_message_delta_json(const srv_job *j, int tool_use) {
    return json_pack("{s:s, s:{s:s, s:o}, s:{s:i}}", "type", "message_delta", "delta",
                     "stop_reason", srv_stop_reason(j, tool_use), "stop_sequence",
                     srv_stop_sequence_json(j), "usage", "output_tokens", j->res.completion_tokens);
}
