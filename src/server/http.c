/*
 * The HTTP side, on libmicrohttpd with one thread per connection: routing,
 * the Host check, CORS, authentication, body limits, waiting for a job
 * (non-streaming) or streaming its text as server-sent events, noticing
 * clients that go away, deadlines for slow clients, and the bounded stop.
 *
 * A connection's life:
 *   notify STARTED        tracked (srv_conn) with a deadline for its first request
 *   URI callback          a later request's first line: a new deadline for it
 *   access handler:
 *     call 1 (headers)    Host, route, method, key, Content-Length: answer GETs,
 *                         preflights and early errors (403, 404, 405, 401, 413) at once
 *     calls 2.. (body)    append to the body, up to max_body
 *     last call           no more deadline; parse -> job -> wait for a place (503 when
 *                         none comes) -> queue, then either wait and answer, or answer
 *                         with an SSE stream read from the job as the worker appends to it
 *   completed callback    cancel the job if still running, release it; the connection
 *                         gets idle_timeout for its next request
 *   notify CLOSED         untracked
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "server/internal.h"

typedef enum route {
    ROUTE_NONE = 0,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    /* POST, from here on */
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    /* Anthropic's, from here on: their errors are in Anthropic's shape */
    ROUTE_MESSAGES,
    ROUTE_COUNT_TOKENS, /* /v1/messages/count_tokens */
} route;

/* While a stream waits for text (queued, or a long prefill), a comment line this often:
 * clients ignore it, and a client that closed its socket answers the write with a reset,
 * which is how it is noticed (a half-closed one keeps reading). */
#define SRV_HEARTBEAT_S 2.0
/* After --shutdown-timeout, how long the HTTP threads get to answer their cancelled
 * requests, and then the worker to come back from its forward. */
#define SRV_GRACE_HTTP_S   1.0
#define SRV_GRACE_WORKER_S 2.0

/* One HTTP request (libmicrohttpd's per-request pointer). */
typedef struct srv_req {
    srv *s;
    struct MHD_Connection *c;
    srv_conn *conn;           /* NULL when untracked */
    const char *allow_origin; /* Access-Control-Allow-Origin to send, or NULL */
    char origin[256];         /* the request's Origin when it is allowed */
    double last_out;          /* sl_now() of the last bytes handed to a stream */
    route route;
    char what[80]; /* "POST /v1/chat/completions", for the log */
    double t0;
    int status; /* answered with this status (0: not yet) */
    char *body;
    size_t body_len, body_cap;
    int too_big;
    srv_job *job;
    int submitted; /* job queued to the model */
    srv_request_opts o;
    char id[64];
    int64_t created;
    /* streaming: events formatted but not yet handed to libmicrohttpd */
    char *out;
    size_t out_len, out_cap, out_off;
    size_t sent, seen;     /* bytes of job->text sent; job->text_len (+ reasoning_len) at the last
                              look */
    size_t sent_reasoning; /* bytes of job->reasoning sent */
    size_t sent_toks;      /* entries of job->toks sent (logprobs) */
    int started, ended;
    /* Anthropic's stream: the content block open (0 none, 1 text, 2 thinking), its index,
     * whether a text block was opened, whether tool_use blocks were sent */
    int block_kind, had_text, had_tools;
    int32_t block;
} srv_req;

/* ---------------------------------------------------------------- answers */

/* Content-Type, and the CORS header when --cors allows the request's Origin (none
 * otherwise: without it a web page the user opens could read the answers). */
static void add_common_headers(const srv_req *r, struct MHD_Response *resp, const char *ctype) {
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (r->allow_origin) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, r->allow_origin);
        if (strcmp(r->allow_origin, "*")) MHD_add_response_header(resp, "Vary", "Origin");
    }
}

/* Queues a text answer; returns libmicrohttpd's verdict. */
static enum MHD_Result answer_text(srv_req *r, int status, const char *ctype, char *text,
                                   const char *extra_header, const char *extra_value) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    add_common_headers(r, resp, ctype);
    if (extra_header) MHD_add_response_header(resp, extra_header, extra_value);
    enum MHD_Result ok = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    srv_count_status(r->s, status);
    return ok;
}

/* Queues a JSON answer, taking the reference to body (an error answer to the Anthropic route
 * is rewritten into its shape). */
static enum MHD_Result answer_json(srv_req *r, int status, json_t *body, const char *extra_header,
                                   const char *extra_value) {
    if (r->route >= ROUTE_MESSAGES && status >= 400) body = srv_anthropic_error(&status, body);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        text = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                      "\"param\":null,\"code\":null}}");
        status = 500;
    }
    return answer_text(r, status, "application/json", text, extra_header, extra_value);
}

static enum MHD_Result answer_error(srv_req *r, int status, const char *type, const char *param,
                                    const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result answer_error(srv_req *r, int status, const char *type, const char *param,
                                    const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return answer_json(r, status, srv_error_json(msg, type, param, code),
                       status == 503 ? MHD_HTTP_HEADER_RETRY_AFTER : NULL, "1");
}

/* ---------------------------------------------------------------- helpers */

/* 1 when the connection has failed: the client reset it, or answered a write after its
 * close with a reset. Poll without waiting. An end of input (POLLRDHUP, a read of 0) is
 * not a disconnect: scripts send their request and then shutdown(SHUT_WR) while still
 * reading the answer, and a half-close cannot be told from a close without writing. */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static int conn_gone(void *c) {
    return client_gone(c);
}

/* This connection's tracking record (NULL when untracked). */
static srv_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void conn_deadline(srv *s, srv_conn *k, double deadline) {
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->deadline = deadline;
    pthread_mutex_unlock(&s->conn_mu);
}

/* The end of the longest prefix of text[from, end) made of whole UTF-8 characters. */
static size_t utf8_cut(const char *text, size_t from, size_t end) {
    size_t i = end;
    while (i > from && ((unsigned char)text[i - 1] & 0xC0) == 0x80 && end - i < 3)
        i--;
    if (i == from) return end == from ? from : end; /* no lead byte in sight: leave as is */
    const unsigned char lead = (unsigned char)text[i - 1];
    if (lead < 0x80) return end;
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return end - (i - 1) >= need ? end : i - 1;
}

static int out_put(srv_req *r, const char *s, size_t n) {
    if (r->out_len + n > r->out_cap) {
        size_t cap = (r->out_len + n) * 2 + 256;
        char *p = realloc(r->out, cap);
        if (!p) return -1;
        r->out = p;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
    return 0;
}

/* Appends "data: <json>\n\n", taking the reference to v; on the Anthropic route preceded by
 * "event: <v's type>\n". */
static int out_event(srv_req *r, json_t *v) {
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    const char *type = json_string_value(json_object_get(v, "type"));
    int rc = !text;
    if (!rc && r->o.kind == SRV_MESSAGES)
        rc = !type || out_put(r, "event: ", 7) || out_put(r, type, strlen(type)) ||
             out_put(r, "\n", 1);
    json_decref(v);
    if (!rc)
        rc = out_put(r, "data: ", 6) || out_put(r, text, strlen(text)) || out_put(r, "\n\n", 2);
    free(text);
    return rc ? -1 : 0;
}

/* Anthropic's stream: len bytes of text (kind 1) or thinking (2) as a delta of the block of
 * that kind, opening one (and closing the one before) when the kind changes. */
static int msg_delta(srv_req *r, int kind, const char *text, size_t len) {
    if (r->block_kind != kind) {
        if (r->block_kind) {
            if (out_event(r, srv_block_json("content_block_stop", r->block, 0, NULL, 0))) return -1;
            r->block++;
        }
        r->block_kind = kind;
        r->had_text |= kind == 1;
        if (out_event(r, srv_block_json("content_block_start", r->block, kind == 2, NULL, 0)))
            return -1;
    }
    return len ? out_event(r, srv_block_json("content_block_delta", r->block, kind == 2, text, len))
               : 0;
}

/* Anthropic's stream: the calls in the held text (from r->sent on) as tool_use blocks, each
 * whole, after the text outside them; 1 when there were calls, -1 on failure. */
static int msg_tools(srv_req *r) {
    const srv_job *j = r->job;
    json_t *content = NULL, *calls = srv_tool_use_json(r->s, &r->o, j->text + r->sent,
                                                       j->text_len - r->sent, &content);
    const char *text = calls ? json_string_value(content) : j->text + r->sent;
    const size_t len = calls ? json_string_length(content) : j->text_len - r->sent;
    int rc = len && msg_delta(r, 1, text, len) ? -1 : 0;
    json_decref(content);
    size_t i;
    json_t *b;
    json_array_foreach(calls, i, b) {
        if (rc) break;
        if (r->block_kind) { /* the text before */
            if (out_event(r, srv_block_json("content_block_stop", r->block, 0, NULL, 0))) rc = -1;
            r->block++;
            r->block_kind = 0;
        }
        if (rc || out_event(r, srv_tool_block_start_json(r->block, b)) ||
            out_event(r, srv_tool_block_delta_json(r->block, b)) ||
            out_event(r, srv_block_json("content_block_stop", r->block, 0, NULL, 0)))
            rc = -1;
        r->block++;
        r->had_tools = 1;
    }
    json_decref(calls);
    r->sent = j->text_len;
    return rc ? rc : calls != NULL;
}

/* Anthropic's stream end: the last block closed (an empty text block first when there was
 * neither text nor calls), message_delta with the stop reason and usage, message_stop. */
static int msg_end(srv_req *r) {
    const srv_job *j = r->job;
    if (!r->had_text && !r->had_tools && msg_delta(r, 1, NULL, 0)) return -1;
    if ((r->block_kind &&
         out_event(r, srv_block_json("content_block_stop", r->block, 0, NULL, 0))) ||
        out_event(r, srv_message_delta_json(j, r->had_tools)) ||
        out_event(r, json_pack("{s:s}", "type", "message_stop")))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- streaming */

/* Ends a stream with an error event (of an answer with this status) and [DONE]; Anthropic's
 * has no [DONE]. */
static int sse_end_error(srv_req *r, int status, const char *message, const char *code) {
    r->ended = 1;
    json_t *e = srv_error_json(message, "server_error", NULL, code);
    if (r->o.kind == SRV_MESSAGES) return out_event(r, srv_anthropic_error(&status, e));
    return out_event(r, e) || out_put(r, "data: [DONE]\n\n", 14) ? -1 : 0;
}

/* Formats the next events into r->out: waits for new text of the job, or its end.
 * -1 when the client went away (the job is cancelled) or memory ran out. */
static int sse_fill(srv_req *r) {
    srv *s = r->s;
    r->last_out = sl_now();
    srv_job *j = r->job;
    if (!r->started) { /* the role chunk first: the client sees the stream open at once */
        r->started = 1;
        if (r->o.kind == SRV_MESSAGES) return out_event(r, srv_message_start_json(s, j, r->id));
        if (r->o.echo) /* completions with echo: the prompt's text first */
            return out_event(r, srv_chunk_json(s, &r->o, r->id, r->created, r->o.echo,
                                               r->o.echo_len, NULL, 0, NULL, 0, NULL));
        return r->o.kind == SRV_CHAT ? out_event(r, srv_chunk_json(s, &r->o, r->id, r->created,
                                                                   NULL, 0, NULL, 0, NULL, 1, NULL))
                                     : 0;
    }
    pthread_mutex_lock(&j->mu);
    while (j->text_len + j->reasoning_len == r->seen && j->state != SRV_JOB_DONE) {
        if (atomic_load(&s->abandon)) {
            pthread_mutex_unlock(&j->mu);
            return sse_end_error(r, 503, "the server is shutting down: the request was cancelled",
                                 "shutting_down");
        }
        if (srv_cond_wait_ms(&j->cv, &j->mu, 100) != ETIMEDOUT) continue;
        if (client_gone(r->c)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return -1;
        }
        if (sl_now() - r->last_out >= SRV_HEARTBEAT_S) {
            pthread_mutex_unlock(&j->mu);
            return out_put(r, ": keep-alive\n\n", 14);
        }
    }
    const int done = j->state == SRV_JOB_DONE;
    r->seen = j->text_len + j->reasoning_len;
    size_t end = done ? j->text_len : utf8_cut(j->text, r->sent, j->text_len);
    /* tools: the text from a "<tool_call>" on waits for the end, where it is read as calls */
    const int tools = r->o.kind != SRV_COMPLETION && j->tool_calls;
    if (tools) end = SL_MIN(end, srv_tool_hold(j->text, r->sent, j->text_len, done));
    const size_t rend =
        done ? j->reasoning_len : utf8_cut(j->reasoning, r->sent_reasoning, j->reasoning_len);
    /* Formatted under the lock: the worker may move the text. Anthropic's events go straight
     * to r->out (a block may open or close), the OpenAI chunk is one. */
    json_t *chunk = NULL;
    int rc = 0;
    /* The log-probabilities of the tokens sampled since the last chunk (a token's may come a
     * chunk before its text, which a possible stop string holds back) */
    const size_t tend = !r->o.logprobs ? 0 : done ? srv_toks_end(j) : j->n_toks;
    json_t *lp =
        tend > r->sent_toks ? srv_logprobs_json(s, r->o.kind, j, r->sent_toks, tend) : NULL;
    r->sent_toks = SL_MAX(r->sent_toks, tend);
    if (r->o.kind == SRV_MESSAGES)
        rc = (rend > r->sent_reasoning &&
              msg_delta(r, 2, j->reasoning + r->sent_reasoning, rend - r->sent_reasoning)) ||
             (end > r->sent && msg_delta(r, 1, j->text + r->sent, end - r->sent));
    else if (end > r->sent || rend > r->sent_reasoning || lp)
        chunk = srv_chunk_json(s, &r->o, r->id, r->created,
                               end > r->sent ? j->text + r->sent : NULL, end - r->sent,
                               rend > r->sent_reasoning ? j->reasoning + r->sent_reasoning : NULL,
                               rend - r->sent_reasoning, NULL, 0, lp);
    r->sent = end;
    r->sent_reasoning = rend;
    pthread_mutex_unlock(&j->mu);
    if (rc || (chunk && out_event(r, chunk))) return -1;
    if (!done) return 0;
    /* The end: finish_reason, usage if asked, [DONE]. The job is done: no lock needed. */
    if (j->failed) return sse_end_error(r, j->failed, j->error, NULL);
    if (j->res.finish == SL_GEN_CANCELLED) /* with the client still here: the shutdown */
        return sse_end_error(r, 503, "the server is shutting down: the request was cancelled",
                             "shutting_down");
    if (r->o.kind == SRV_MESSAGES) {
        r->ended = 1;
        return (tools && r->sent < j->text_len && msg_tools(r) < 0) ? -1 : msg_end(r);
    }
    const char *finish = srv_finish_reason(j);
    if (tools && r->sent < j->text_len) { /* the held text: calls, and what is not one */
        json_t *content = NULL, *calls = srv_tool_calls_json(s, &r->o, j->text + r->sent,
                                                             j->text_len - r->sent, 1, &content);
        const char *text = json_string_value(content);
        if (!calls) text = j->text + r->sent;
        const size_t len = !calls ? j->text_len - r->sent : text ? json_string_length(content) : 0;
        if (len && out_event(r, srv_chunk_json(s, &r->o, r->id, r->created, text, len, NULL, 0,
                                               NULL, 0, NULL)))
            rc = -1;
        json_decref(content);
        if (calls) {
            json_t *chunk =
                srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, NULL, 0, NULL, 0, NULL);
            json_t *delta =
                json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "delta");
            json_object_set_new(delta, "tool_calls", calls);
            if (rc)
                json_decref(chunk);
            else if (out_event(r, chunk))
                rc = -1;
            finish = "tool_calls";
        }
        r->sent = j->text_len;
        if (rc) return rc;
    }
    rc = out_event(r,
                   srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, NULL, 0, finish, 0, NULL));
    if (!rc && r->o.include_usage) {
        json_t *u = srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, NULL, 0, NULL, 0, NULL);
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", srv_usage_json(j));
        rc = out_event(r, u);
    }
    if (!rc) rc = out_put(r, "data: [DONE]\n\n", 14);
    r->ended = 1;
    return rc;
}

/* libmicrohttpd's content reader: blocks (one thread per connection) until events. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_req *r = cls;
    while (r->out_off == r->out_len) {
        if (r->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        r->out_off = r->out_len = 0;
        if (sse_fill(r)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = SL_MIN(max, r->out_len - r->out_off);
    memcpy(buf, r->out + r->out_off, n);
    r->out_off += n;
    return (ssize_t)n;
}

/* ---------------------------------------------------------------- routes */

/* The model, with the context it is served with: max_model_len as vLLM gives it, meta as
 * llama.cpp's server does (n_ctx_train: the positions the model was made for). */
static enum MHD_Result answer_models(srv_req *r, int one) {
    const srv *s = r->s;
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i, s:{s:i, s:i, s:i}}", "id", s->cfg.model_id,
                          "object", "model", "created", (json_int_t)s->started_wall, "owned_by",
                          "sluice", "max_model_len", s->max_ctx, "meta", "n_ctx", s->max_ctx,
                          "n_ctx_train", s->n_ctx_train, "n_vocab", s->vocab);
    if (one) return answer_json(r, 200, m, NULL, NULL);
    return answer_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m), NULL, NULL);
}

/* A response id: 64 random bits, so that ids never repeat across restarts (a counter alone
 * starts over, and the start time repeats within a second), then this server's request
 * number, so that they never repeat within one run either. */
static void make_id(srv *s, srv_kind kind, char *out, size_t size) {
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rnd = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ (uint64_t)getpid() << 40;
    }
    snprintf(out, size, "%s%016llx%llx",
             kind == SRV_CHAT         ? "chatcmpl-"
             : kind == SRV_COMPLETION ? "cmpl-"
                                      : "msg_",
             (unsigned long long)rnd, (unsigned long long)srv_next_number(s));
}

/* /tokenize and /detokenize, on this thread. */
static enum MHD_Result answer_tokens(srv_req *r) {
    json_t *out = NULL;
    const int status =
        srv_tokenize(r->s, r->route == ROUTE_DETOKENIZE, r->body ? r->body : "", r->body_len, &out);
    if (status == 500) {
        json_decref(out);
        return answer_error(r, 500, "server_error", NULL, NULL, "out of memory");
    }
    return answer_json(r, status, out, NULL, NULL);
}

/* The last call: the whole body is here. */
static enum MHD_Result answer_generation(srv_req *r) {
    srv *s = r->s;
    srv_job *j = r->job = srv_job_new();
    if (!j) return answer_error(r, 500, "server_error", NULL, NULL, "out of memory");
    json_t *error = NULL;
    const srv_kind kind = r->route == ROUTE_CHAT       ? SRV_CHAT
                          : r->route >= ROUTE_MESSAGES ? SRV_MESSAGES
                                                       : SRV_COMPLETION;
    const char *body = r->body ? r->body : "";
    const int count = r->route == ROUTE_COUNT_TOKENS;
    int status = kind == SRV_MESSAGES
                     ? srv_parse_messages(s, body, r->body_len, count, j, &r->o, &error)
                     : srv_parse_request(s, kind, body, r->body_len, j, &r->o, &error);
    if (status) return answer_json(r, status, error, NULL, NULL);
    if (count) /* the prompt as it would be generated from, without generating */
        return answer_json(r, 200, json_pack("{s:i}", "input_tokens", (int)j->prompt.n), NULL,
                           NULL);
    j->deadline = sl_now() + s->cfg.timeout_s;
    const double t_wait = sl_now();
    switch (srv_submit(s, j, conn_gone, r->c)) {
    case SRV_ADMITTED: break;
    case SRV_STOPPING:
        return answer_error(r, 503, "server_error", NULL, "shutting_down",
                            "the server is shutting down");
    case SRV_FULL:
        return answer_error(r, 503, "server_error", NULL, "overloaded",
                            "the server is busy: %d requests are admitted (--parallel) and %d "
                            "more are waiting (--queue); try again later",
                            s->cfg.parallel, s->cfg.queue);
    case SRV_WAIT_TIMEOUT:
        srv_count_queue_timeout(s);
        return answer_error(r, 503, "server_error", NULL, "overloaded",
                            "the server is busy: no place came free in %.0f s of waiting "
                            "(--queue-timeout %d); try again later",
                            sl_now() - t_wait, s->cfg.queue_timeout_s);
    case SRV_CLIENT_GONE: return MHD_NO; /* closes the connection */
    }
    r->submitted = 1;
    make_id(s, kind, r->id, sizeof r->id);
    r->created = (int64_t)time(NULL);

    if (r->o.stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, r, NULL);
        if (!resp) return MHD_NO;
        r->last_out = sl_now();
        add_common_headers(r, resp, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ok = MHD_queue_response(r->c, 200, resp);
        MHD_destroy_response(resp);
        r->status = 200;
        srv_count_status(s, 200);
        return ok;
    }
    /* Not streaming: wait here (this connection's thread) for the reply. */
    pthread_mutex_lock(&j->mu);
    double next_look = sl_now() + 0.1; /* the job wakes us at every token: look at most 10/s */
    while (j->state != SRV_JOB_DONE) {
        srv_cond_wait_ms(&j->cv, &j->mu, 100);
        if (atomic_load(&s->abandon)) {
            pthread_mutex_unlock(&j->mu);
            return answer_error(r, 503, "server_error", NULL, "shutting_down",
                                "the server is shutting down: the request was cancelled");
        }
        if (sl_now() < next_look) continue;
        next_look = sl_now() + 0.1;
        if (client_gone(r->c)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return MHD_NO; /* closes the connection */
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (j->failed) return answer_error(r, j->failed, "server_error", NULL, NULL, "%s", j->error);
    if (j->res.finish == SL_GEN_CANCELLED) /* with the client still here: the shutdown */
        return answer_error(r, 503, "server_error", NULL, "shutting_down",
                            "the server is shutting down: the request was cancelled");
    return answer_json(r, 200,
                       kind == SRV_MESSAGES ? srv_message_json(s, j, &r->o, r->id)
                                            : srv_response_json(s, j, &r->o, r->id, r->created),
                       NULL, NULL);
}

static route find_route(const char *url) {
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return ROUTE_MODEL;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/tokenize")) return ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return ROUTE_DETOKENIZE;
    if (!strcmp(url, "/v1/messages")) return ROUTE_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return ROUTE_COUNT_TOKENS;
    return ROUTE_NONE;
}

/* Constant-time comparison of a header's value with the key: the time taken depends on the
 * key's length only, never on how much of it a guess got right. */
static int key_equal(const char *header, const char *key) {
    if (!header) return 0;
    size_t n = strlen(header), m = strlen(key);
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < m; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < n ? header[i] : 0);
    return diff == 0;
}

/* The key as "Authorization: Bearer KEY" (OpenAI's clients) or "x-api-key: KEY"
 * (Anthropic's), on any route. */
static int key_ok(struct MHD_Connection *c, const char *key) {
    static const char prefix[] = "Bearer ";
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (auth && !strncmp(auth, prefix, sizeof prefix - 1) &&
        key_equal(auth + sizeof prefix - 1, key))
        return 1;
    return key_equal(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"), key);
}

/* The name of a Host header ("name", "name:port", "[v6]", "[v6]:port") into out, without
 * brackets or port; 0 when malformed (a port must be a number up to 65535). */
static int host_name(const char *host, char *out, size_t size) {
    const char *name = host, *end, *rest;
    if (host[0] == '[') {
        name = host + 1;
        if (!(end = strchr(name, ']'))) return 0;
        rest = end + 1;
    } else {
        end = host + strcspn(host, ":");
        rest = end;
    }
    if (*rest == ':') {
        rest++;
        const size_t digits = strspn(rest, "0123456789");
        if (digits == 0 || digits > 5 || rest[digits] || atoi(rest) > 65535) return 0;
    } else if (*rest) {
        return 0;
    }
    const size_t n = (size_t)(end - name);
    if (n == 0 || n >= size) return 0;
    memcpy(out, name, n);
    out[n] = '\0';
    return 1;
}

/*
 * DNS rebinding: a web page the user opens can point its own name at 127.0.0.1 and then
 * talk to this server as to its own origin, with the page's name in the Host header. A
 * server listening on a loopback address therefore answers only the names that mean this
 * machine. Listening on another address (--host) is a choice to be reached by any name.
 * No Host at all (HTTP/1.0) is not a browser, which always sends one.
 */
static int host_allowed(const srv *s, const char *host) {
    if (!s->loopback || !host) return 1;
    char name[256];
    if (!host_name(host, name, sizeof name)) return 0;
    return !strcasecmp(name, "localhost") || !strcmp(name, "127.0.0.1") || !strcmp(name, "::1") ||
           !strcasecmp(name, s->cfg.host);
}

/* Sets r->allow_origin when --cors lists the request's Origin (or is "*"). */
static void cors_match(srv_req *r) {
    const srv *s = r->s;
    const char *origin = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Origin");
    if (!origin || !s->cfg.n_cors || strlen(origin) >= sizeof r->origin) return;
    for (int32_t i = 0; i < s->cfg.n_cors; i++) {
        if (!strcmp(s->cfg.cors[i], "*")) {
            r->allow_origin = "*";
            return;
        }
        if (!strcasecmp(s->cfg.cors[i], origin)) {
            snprintf(r->origin, sizeof r->origin, "%s", origin);
            r->allow_origin = r->origin;
            return;
        }
    }
}

/* A CORS preflight (OPTIONS) from an allowed origin: 204 with what may follow. The headers
 * asked for are allowed as asked (the official clients send their own X-Stainless-* ones),
 * when they are a plain list of header names. */
static enum MHD_Result answer_preflight(srv_req *r) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_common_headers(r, resp, NULL);
    const char *want =
        MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    static const char name_chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789-_, ";
    const int plain = want && *want && strlen(want) < 1024 && !want[strspn(want, name_chars)];
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            plain ? want : "Authorization, Content-Type, X-Api-Key");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ok = MHD_queue_response(r->c, 204, resp);
    MHD_destroy_response(resp);
    r->status = 204;
    srv_count_status(r->s, 204);
    return ok;
}

/* The first call, with the headers: answers at once unless a body is to come. */
static enum MHD_Result first_call(srv_req *r, const char *url, const char *method) {
    srv *s = r->s;
    r->route = find_route(url);
    const int post = !strcmp(method, "POST"),
              get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (r->route == ROUTE_NONE)
        return answer_error(r, 404, "invalid_request_error", NULL, "unknown_url",
                            "Invalid URL (%s %s)", method, url);
    if (!strcmp(method, "OPTIONS") && s->cfg.n_cors) { /* preflight of a browser client */
        if (!r->allow_origin)
            return answer_error(r, 403, "invalid_request_error", NULL, "origin_not_allowed",
                                "this origin may not call the server (see --cors)");
        return answer_preflight(r);
    }
    const int wants_post = r->route >= ROUTE_CHAT;
    if (wants_post ? !post : !get)
        return answer_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                            "%s %s: method not allowed (use %s)", method, url,
                            wants_post ? "POST" : "GET");
    if (s->cfg.api_key && r->route != ROUTE_HEALTH && r->route != ROUTE_METRICS &&
        !key_ok(r->c, s->cfg.api_key))
        return answer_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                            "Incorrect API key provided (send 'Authorization: Bearer KEY' or "
                            "'x-api-key: KEY').");
    switch (r->route) {
    case ROUTE_HEALTH: {
        pthread_mutex_lock(&s->mu);
        const int32_t stopping = s->stopping, queued = s->n_queued, waiting = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        return answer_json(r, 200,
                           json_pack("{s:s, s:s, s:i, s:i}", "status", stopping ? "stopping" : "ok",
                                     "model", s->cfg.model_id, "queue", queued, "waiting", waiting),
                           NULL, NULL);
    }
    case ROUTE_METRICS:
        return answer_text(r, 200, "text/plain; version=0.0.4", srv_metrics_text(s), NULL, NULL);
    case ROUTE_MODELS: return answer_models(r, 0);
    case ROUTE_MODEL:
        if (strcmp(url + 11, s->cfg.model_id))
            return answer_error(r, 404, "invalid_request_error", "model", "model_not_found",
                                "The model '%s' does not exist (this server has '%s')", url + 11,
                                s->cfg.model_id);
        return answer_models(r, 1);
    default: break;
    }
    const char *cl =
        MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->cfg.max_body)
        return answer_error(r, 413, "invalid_request_error", NULL, NULL,
                            "the request body (%s bytes) is larger than %lld bytes (--max-body)",
                            cl, (long long)s->cfg.max_body);
    return MHD_YES; /* the body follows */
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    srv_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->s = s;
        r->c = c;
        r->conn = conn_of(c);
        r->t0 = sl_now();
        r->route = find_route(url); /* before any answer: it picks the errors' shape */
        snprintf(r->what, sizeof r->what, "%s %s", method, url);
        for (char *p = r->what; *p; p++) /* the log line: no terminal controls from a client */
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
        *con_cls = r;
        pthread_mutex_lock(&s->mu);
        s->n_requests++;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        enum MHD_Result ok;
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
        if (!host_allowed(s, host)) {
            const char *h = s->cfg.host;
            const int usual =
                !strcmp(h, "127.0.0.1") || !strcmp(h, "::1") || !strcasecmp(h, "localhost");
            ok = answer_error(r, 403, "invalid_request_error", NULL, "host_not_allowed",
                              "Host '%.100s' is not allowed: this server listens on %s and "
                              "answers requests to localhost, 127.0.0.1 or [::1]%s%s only "
                              "(start it with --host ADDR to be reached by other names)",
                              host, h, usual ? "" : " or ", usual ? "" : h);
        } else {
            cors_match(r);
            if (stopping && find_route(url) != ROUTE_HEALTH)
                ok = answer_error(r, 503, "server_error", NULL, "shutting_down",
                                  "the server is shutting down");
            else
                ok = first_call(r, url, method);
        }
        if (r->status) conn_deadline(s, r->conn, 0); /* answered: no body will be read */
        return ok;
    }
    if (*upload_size) { /* a piece of the body */
        if (!r->status && !r->too_big) {
            if (r->body_len + *upload_size > (size_t)s->cfg.max_body) {
                r->too_big = 1;
            } else {
                if (r->body_len + *upload_size + 1 > r->body_cap) {
                    size_t cap =
                        SL_MIN((r->body_len + *upload_size + 1) * 2, (size_t)s->cfg.max_body + 1);
                    char *b = realloc(r->body, cap);
                    if (!b) return MHD_NO;
                    r->body = b;
                    r->body_cap = cap;
                }
                memcpy(r->body + r->body_len, upload_data, *upload_size);
                r->body_len += *upload_size;
                r->body[r->body_len] = '\0';
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    conn_deadline(s, r->conn, 0);  /* the request has arrived whole */
    if (r->status) return MHD_YES; /* answered early */
    if (r->too_big)
        return answer_error(r, 413, "invalid_request_error", NULL, NULL,
                            "the request body is larger than %lld bytes (--max-body)",
                            (long long)s->cfg.max_body);
    if (r->route == ROUTE_TOKENIZE || r->route == ROUTE_DETOKENIZE) return answer_tokens(r);
    return answer_generation(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    srv_conn *k = conn_of(c);
    if (k) { /* keep-alive: the next request's first line must come within the idle timeout */
        pthread_mutex_lock(&s->conn_mu);
        k->n_done++;
        k->deadline = sl_now() + s->cfg.idle_timeout_s;
        pthread_mutex_unlock(&s->conn_mu);
    }
    srv_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    const int gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->job) {
        if (gone) atomic_store(&r->job->cancel, 1); /* no effect once done */
        pthread_mutex_lock(&r->job->mu);
        const sl_gen_result res = r->job->res;
        const int done = r->job->state == SRV_JOB_DONE;
        pthread_mutex_unlock(&r->job->mu);
        if (s->cfg.log && r->submitted && done)
            fprintf(stderr, "sluice serve: %s %d%s, %d+%d tokens (%d cached), %.3f s\n", r->what,
                    r->status, gone ? " (client gone)" : "", res.prompt_tokens,
                    res.completion_tokens, res.cached_tokens, sl_now() - r->t0);
        else if (s->cfg.log && r->submitted)
            fprintf(stderr, "sluice serve: %s (%scancelled), %.3f s\n", r->what,
                    gone ? "client gone: " : "", sl_now() - r->t0);
        srv_job_release(r->job);
    }
    if (s->cfg.log && !r->submitted)
        fprintf(stderr, "sluice serve: %s %d%s\n", r->what, r->status,
                gone && !r->status ? " (client gone)" : "");
    srv_request_opts_free(&r->o);
    free(r->body);
    free(r->out);
    free(r);
    pthread_mutex_lock(&s->mu);
    s->n_requests--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv *s = cls;
    /* Said each time the access handler returns MHD_NO, which it does on purpose to drop
     * the connection of a client that went away (already logged as such). */
    if (!strncmp(fmt, "Application reported internal error", 35)) return;
    /* Said for every connection refused at --max-connections-per-ip: a client hammering the
     * server would flood the log, so once per 10 s with the count. */
    if (!strncmp(fmt, "Server reached connection limit", 31)) {
        pthread_mutex_lock(&s->conn_mu);
        const double now = sl_now();
        const int64_t n = ++s->limit_refused;
        const int say = now - s->limit_said >= 10;
        if (say) s->limit_said = now;
        pthread_mutex_unlock(&s->conn_mu);
        if (say)
            fprintf(stderr,
                    "sluice serve: refusing connections: %d from one address already "
                    "(--max-connections-per-ip); %lld refused so far\n",
                    s->cfg.max_conns_per_ip, (long long)n);
        return;
    }
    fputs("sluice serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---------------------------------------------------------------- slow clients */

/* Connection start and close: the tracking records the watchdog walks. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    srv *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_conn *k = ci ? calloc(1, sizeof *k) : NULL;
        if (!k) return; /* untracked: only libmicrohttpd's idle timeout applies */
        if ((k->fd = fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
            free(k);
            return;
        }
        pthread_mutex_lock(&s->conn_mu);
        k->deadline = sl_now() + s->cfg.header_timeout_s;
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = k;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conn *k = *socket_context;
        if (!k) return;
        *socket_context = NULL;
        pthread_mutex_lock(&s->conn_mu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->conn_mu);
        close(k->fd);
        free(k);
    }
}

/* A request's first line has arrived. The first request of a connection keeps the deadline
 * counted from the connection's start; a later one (keep-alive) gets its own. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)uri;
    srv *s = cls;
    srv_conn *k = conn_of(c);
    if (k) {
        pthread_mutex_lock(&s->conn_mu);
        if (k->n_done > 0) k->deadline = sl_now() + s->cfg.header_timeout_s;
        pthread_mutex_unlock(&s->conn_mu);
    }
    return NULL; /* the access handler's first call still sees *con_cls == NULL */
}

/* Cuts the connections whose request has not arrived by its deadline. shutdown() on our dup
 * of the socket ends the connection for libmicrohttpd's thread too, which sees the end of
 * input and closes it. */
static void *watchdog_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->conn_mu);
    while (!s->watchdog_exit) {
        srv_cond_wait_ms(&s->conn_cv, &s->conn_mu, 250);
        const double now = sl_now();
        int32_t cut = 0;
        for (srv_conn *k = s->conns; k; k = k->next) {
            if (k->cut || k->deadline <= 0 || now <= k->deadline) continue;
            shutdown(k->fd, SHUT_RDWR);
            k->cut = 1;
            cut++;
        }
        s->conns_cut += cut;
        if (cut && s->cfg.log)
            fprintf(stderr,
                    "sluice serve: closed %d connection%s whose request did not arrive in time "
                    "(--header-timeout %d, --idle-timeout %d)\n",
                    cut, cut > 1 ? "s" : "", s->cfg.header_timeout_s, s->cfg.idle_timeout_s);
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* ---------------------------------------------------------------- lifetime */

/* 1 for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* "sluice: warning: <msg>" on stderr, as the command line's warnings read: something the
 * operator should know before the first request. */
static void srv_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void srv_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sluice: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* A listening socket of our own, so that errors name their cause (port in use ...). Warns
 * before binding to an address other machines reach when no key guards it. */
static int listen_on(srv *s, int *family, sl_error *err) {
    const char *host = s->cfg.host;
    const int32_t port = s->cfg.port;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e)
        return sl_fail(err, SL_ERR_IO, "cannot listen on %s:%d: %s", host, port, gai_strerror(e)),
               -1;
    s->loopback = is_loopback(ai->ai_addr);
    if (!s->loopback && !s->cfg.api_key)
        srv_warn("listening on %s without an API key: anyone who can reach this machine's port "
                 "%d can use the model (set one with --api-key-file FILE or $SLUICE_API_KEY)",
                 host, port);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
        sl_fail(err, SL_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    *family = ai->ai_family;
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

/* Each connection holds two descriptors (libmicrohttpd's socket and the watchdog's dup):
 * raise the soft limit toward what max_conns needs, or say how far it falls short. */
static void fd_limit(const srv_params *cfg) {
    const rlim_t need = 2 * (rlim_t)cfg->max_conns + 256; /* + model files, reader threads */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need)
        srv_warn("--max-connections %d needs about %llu file descriptors, the limit is %llu "
                 "(ulimit -n): connections past it will fail",
                 cfg->max_conns, (unsigned long long)need, (unsigned long long)rl.rlim_cur);
}

sl_status srv_start(srv **out, sl_gen *g, const srv_params *cfg, sl_error *err) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->g = g;
    s->tok = g->tok;
    s->tpl = g->tpl;
    s->max_ctx = sl_session_max_ctx(g->seq.s);
    s->vocab = g->info.vocab_size;
    s->n_ctx_train = g->info.max_position;
    s->gen = g->gen;
    pthread_mutex_init(&s->json_mu, NULL);
    s->started = sl_now();
    s->started_wall = (int64_t)time(NULL);
    s->listen_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    srv_cond_init(&s->cv);
    pthread_mutex_init(&s->conn_mu, NULL);
    srv_cond_init(&s->conn_cv);
    atomic_init(&s->abandon, 0);
    sl_model_get_stats(g->m, &s->metrics.stats);
    *out = s;
    int family = AF_INET;
    if ((s->listen_fd = listen_on(s, &family, err)) < 0) return SL_ERR_IO;
    fd_limit(cfg);
    sl_status st = srv_slots_init(s, err);
    if (st) return st;
    if (pthread_create(&s->worker, NULL, srv_worker_main, s))
        return sl_fail(err, SL_ERR_NOMEM, "cannot start the model worker thread");
    s->worker_started = 1;
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s))
        return sl_fail(err, SL_ERR_NOMEM, "cannot start the connection watchdog thread");
    s->watchdog_started = 1;
    /* At max_conns libmicrohttpd stops accepting (newcomers wait in the listen backlog); past
     * max_conns_per_ip it accepts and closes at once. */
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_conns_per_ip, MHD_OPTION_END);
    if (!s->daemon) return sl_fail(err, SL_ERR_IO, "cannot start the HTTP server (libmicrohttpd)");
    return SL_OK;
}

int32_t srv_port(const srv *s) {
    return s->port;
}

int srv_loopback(const srv *s) {
    return s->loopback;
}

/* Waits up to `seconds` for the HTTP requests in progress to end; the number left. */
static int32_t wait_requests(srv *s, double seconds) {
    const double until = sl_now() + seconds;
    pthread_mutex_lock(&s->mu);
    while (s->n_requests > 0 && sl_now() < until)
        srv_cond_wait_ms(&s->cv, &s->mu, 100);
    const int32_t left = s->n_requests;
    pthread_mutex_unlock(&s->mu);
    return left;
}

/*
 * The stop, bounded in time whatever the clients or the model do:
 *   1. no new connections; waiting requests get 503 at once
 *   2. requests in flight get shutdown_timeout_s to finish
 *   3. then they are cancelled: the worker stops at its next token, streams end with an
 *      error event, waiting clients get 503 (SRV_GRACE_HTTP_S for the HTTP threads)
 *   4. the worker gets SRV_GRACE_WORKER_S to come back from its forward; a worker stuck in
 *      one (a read that never returns) is left behind, and so are HTTP threads stuck
 *      beside it: the caller exits without freeing what they use.
 */
int srv_shutdown(srv *s) {
    if (s->stuck) return 1;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->daemon) {
        MHD_socket fd = MHD_quiesce_daemon(s->daemon);
        if (fd != MHD_INVALID_SOCKET) close(fd);
        s->listen_fd = -1;
        int32_t left = wait_requests(s, s->cfg.shutdown_timeout_s);
        if (left > 0) {
            fprintf(stderr,
                    "sluice serve: %d request%s still in flight after %d s "
                    "(--shutdown-timeout): cancelling\n",
                    left, left > 1 ? "s" : "", s->cfg.shutdown_timeout_s);
            atomic_store(&s->abandon, 1);
            srv_cancel_all(s);
            left = wait_requests(s, SRV_GRACE_HTTP_S);
        }
        if (left > 0) { /* MHD_stop_daemon would join their threads: do not wait on them */
            fprintf(stderr, "sluice serve: %d request%s did not end; exiting without them\n", left,
                    left > 1 ? "s" : "");
            s->stuck = 1;
            return 1;
        }
        MHD_stop_daemon(s->daemon);
        s->daemon = NULL;
    }
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->conn_mu);
        s->watchdog_exit = 1;
        pthread_cond_broadcast(&s->conn_cv);
        pthread_mutex_unlock(&s->conn_mu);
        pthread_join(s->watchdog, NULL);
        s->watchdog_started = 0;
    }
    if (s->worker_started) {
        const double until = sl_now() + SRV_GRACE_WORKER_S;
        pthread_mutex_lock(&s->mu);
        s->worker_exit = 1;
        pthread_cond_broadcast(&s->cv);
        while (!s->worker_done && sl_now() < until)
            srv_cond_wait_ms(&s->cv, &s->mu, 100);
        const int done = s->worker_done;
        pthread_mutex_unlock(&s->mu);
        if (!done) {
            fprintf(stderr, "sluice serve: the model worker did not come back from its forward "
                            "(a hung read?); exiting without it\n");
            s->stuck = 1;
            return 1;
        }
        pthread_join(s->worker, NULL);
        s->worker_started = 0;
    }
    return 0;
}

void srv_free(srv *s) {
    if (!s || srv_shutdown(s)) return; /* stuck threads may still use s: leave it */
    if (s->listen_fd >= 0) close(s->listen_fd);
    srv_slots_free(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->json_mu);
    sl_json_vocab_free(s->json_vocab);
    free(s);
}
