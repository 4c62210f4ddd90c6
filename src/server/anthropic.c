/*
 * The Anthropic Messages API's JSON (POST /v1/messages): requests into jobs through
 * the same template, sampling and stop strings as the OpenAI routes (openai.c), and the
 * message, stream events and error objects in Anthropic's shape. Text only for now:
 * image, document, tool_use and tool_result blocks, and tools, are a 400 naming them.
 *
 * A stream is this sequence of events, each "event: TYPE\ndata: JSON\n\n" (http.c):
 *   message_start                       the message with empty content, usage.input_tokens
 *   content_block_start    index 0      {"type":"text","text":""}  (or "thinking")
 *   content_block_delta    index 0 ...  text_delta (thinking_delta)
 *   content_block_stop     index 0      ... then index 1 when the kind of text changes
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

/* system + messages -> the prompt's ids in j->prompt, through the chat template. */
static int messages_prompt(srv *s, json_t *req, srv_job *j, int32_t think, json_t **error) {
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_bad(error, "messages", "messages: must be a non-empty array");
    json_t *sys = json_object_get(req, "system");
    const size_t n = json_array_size(msgs) + (sys && !json_is_null(sys));
    sl_chat_msg *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    int rc = m && owned ? 0 : 500;
    size_t k = 0;
    if (!rc && sys && !json_is_null(sys)) {
        rc = blocks_text(sys, "system", "system", &owned[0], error);
        m[k++] = (sl_chat_msg){.role = "system", .content = owned[0]};
    }
    for (size_t i = 0; k < n && !rc; i++, k++) {
        json_t *msg = json_array_get(msgs, i);
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
        if (k == n - 1 && !strcmp(r, "assistant")) {
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
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].content", i);
        rc = blocks_text(content, "messages", where, &owned[k], error);
        m[k] = (sl_chat_msg){.role = r, .content = owned[k]};
    }
    return srv_encode_chat_free(s, m, owned, n, think, j, rc, error);
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
    if (json_array_size(json_object_get(req, "tools")) > 0)
        return srv_bad(error, "tools", "tools: tool use is not supported yet");
    json_t *tc = json_object_get(req, "tool_choice");
    if (tc && !json_is_null(tc))
        return srv_bad(error, "tool_choice", "tool_choice: tool use is not supported yet");
    srv_sampling(s, j, temp, top_p, top_k);
    if (sl_reply_needs_special(&s->tpl)) { /* text and thinking */
        j->parts = 1;
        sl_reply_init(&j->parser, &s->tpl);
    }
    if ((rc = messages_prompt(s, req, j, think, error))) {
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

const char *srv_stop_reason(const srv_job *j) {
    if (j->res.finish != SL_GEN_STOP) return "max_tokens";
    return j->res.stop_hit ? "stop_sequence" : "end_turn";
}

json_t *srv_stop_sequence_json(const srv_job *j) {
    const int32_t k = j->res.stop_hit;
    return j->res.finish == SL_GEN_STOP && k > 0 && k <= j->n_stops ? json_string(j->stops[k - 1])
                                                                    : json_null();
}

json_t *srv_message_json(const srv *s, const srv_job *j, const char *id) {
    json_t *content = json_array();
    if (j->reasoning_len) /* the reply's reasoning, when its template tells it apart */
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 srv_text_json(j->reasoning, j->reasoning_len),
                                                 "signature", ""));
    json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                             srv_text_json(j->text, j->text_len)));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:{s:i, s:i}}", "id", id, "type",
                     "message", "role", "assistant", "model", s->cfg.model_id, "content", content,
                     "stop_reason", srv_stop_reason(j), "stop_sequence", srv_stop_sequence_json(j),
                     "usage", "input_tokens", j->res.prompt_tokens, "output_tokens",
                     j->res.completion_tokens);
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

json_t *srv_message_delta_json(const srv_job *j) {
    return json_pack("{s:s, s:{s:s, s:o}, s:{s:i}}", "type", "message_delta", "delta",
                     "stop_reason", srv_stop_reason(j), "stop_sequence", srv_stop_sequence_json(j),
                     "usage", "output_tokens", j->res.completion_tokens);
}
