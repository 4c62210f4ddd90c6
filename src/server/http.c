/*
 * The HTTP side, on libmicrohttpd with one thread per connection: routing,
 * authentication, body limits, waiting for a job (non-streaming) or streaming
 * its text as server-sent events, noticing clients that go away, and the
 * graceful stop.
 *
 * A request's life, through libmicrohttpd's access handler:
 *   call 1 (headers)      route, method, key, Content-Length: answer GETs and
 *                         early errors (404, 405, 401, 413) at once
 *   calls 2.. (body)      append to the body, up to max_body
 *   last call (no data)   parse -> job -> queue (503 when full), then either
 *                         wait and answer, or answer with an SSE stream read
 *                         from the job as the worker appends to it
 *   completed callback    cancel the job if still running, release it
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/random.h>
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
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
} route;

/* One HTTP request (libmicrohttpd's per-request pointer). */
typedef struct srv_req {
    srv *s;
    struct MHD_Connection *c;
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
    size_t sent, seen; /* bytes of job->text sent; job->text_len at the last look */
    int started, ended;
} srv_req;

/* ---------------------------------------------------------------- answers */

static void add_common_headers(struct MHD_Response *resp, const char *ctype) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, "*");
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
    add_common_headers(resp, ctype);
    if (extra_header) MHD_add_response_header(resp, extra_header, extra_value);
    enum MHD_Result ok = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    srv_count_status(r->s, status);
    return ok;
}

/* Queues a JSON answer, taking the reference to body. */
static enum MHD_Result answer_json(srv_req *r, int status, json_t *body, const char *extra_header,
                                   const char *extra_value) {
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

/* 1 when the client has closed its end (or the socket failed): poll without waiting. */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
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

/* Appends "data: <json>\n\n", taking the reference to v. */
static int out_event(srv_req *r, json_t *v) {
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!text) return -1;
    int rc = out_put(r, "data: ", 6) || out_put(r, text, strlen(text)) || out_put(r, "\n\n", 2);
    free(text);
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- streaming */

/* Formats the next events into r->out: waits for new text of the job, or its end.
 * -1 when the client went away (the job is cancelled) or memory ran out. */
static int sse_fill(srv_req *r) {
    srv *s = r->s;
    if (!r->started) { /* the role chunk first: the client sees the stream open at once */
        r->started = 1;
        return r->o.kind == SRV_CHAT
                   ? out_event(r, srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, NULL, 1))
                   : 0;
    }
    srv_job *j = r->job;
    pthread_mutex_lock(&j->mu);
    while (j->text_len == r->seen && j->state != SRV_JOB_DONE) {
        if (srv_cond_wait_ms(&j->cv, &j->mu, 100) == ETIMEDOUT && client_gone(r->c)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return -1;
        }
    }
    const int done = j->state == SRV_JOB_DONE;
    r->seen = j->text_len;
    const size_t end = done ? j->text_len : utf8_cut(j->text, r->sent, j->text_len);
    json_t *chunk = end > r->sent ? srv_chunk_json(s, &r->o, r->id, r->created, j->text + r->sent,
                                                   end - r->sent, NULL, 0)
                                  : NULL;
    r->sent = end;
    pthread_mutex_unlock(&j->mu);
    if (chunk && out_event(r, chunk)) return -1;
    if (!done) return 0;
    /* The end: finish_reason, usage if asked, [DONE]. The job is done: no lock needed. */
    int rc = 0;
    if (j->failed) {
        rc = out_event(r, srv_error_json(j->error, "server_error", NULL, NULL));
    } else {
        rc = out_event(
            r, srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, srv_finish_reason(j), 0));
        if (!rc && r->o.include_usage) {
            json_t *u = srv_chunk_json(s, &r->o, r->id, r->created, NULL, 0, NULL, 0);
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", srv_usage_json(j));
            rc = out_event(r, u);
        }
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
    size_t n = SL_CLI_MIN(max, r->out_len - r->out_off);
    memcpy(buf, r->out + r->out_off, n);
    r->out_off += n;
    return (ssize_t)n;
}

/* ---------------------------------------------------------------- routes */

static enum MHD_Result answer_models(srv_req *r, int one) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", r->s->cfg.model_id, "object", "model",
                          "created", (json_int_t)r->s->started_wall, "owned_by", "sluice");
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
    snprintf(out, size, "%s-%016llx%llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)rnd, (unsigned long long)srv_next_number(s));
}

/* The last call: the whole body is here. */
static enum MHD_Result answer_generation(srv_req *r) {
    srv *s = r->s;
    if (r->too_big)
        return answer_error(r, 413, "invalid_request_error", NULL, NULL,
                            "the request body is larger than %lld bytes (--max-body)",
                            (long long)s->cfg.max_body);
    srv_job *j = r->job = srv_job_new();
    if (!j) return answer_error(r, 500, "server_error", NULL, NULL, "out of memory");
    json_t *error = NULL;
    const srv_kind kind = r->route == ROUTE_CHAT ? SRV_CHAT : SRV_COMPLETION;
    int status = srv_parse_request(s, kind, r->body ? r->body : "", r->body_len, j, &r->o, &error);
    if (status) return answer_json(r, status, error, NULL, NULL);
    j->deadline = sl_now() + s->cfg.timeout_s;
    const int admitted = srv_submit(s, j);
    if (admitted == -2)
        return answer_error(r, 503, "server_error", NULL, "shutting_down",
                            "the server is shutting down");
    if (admitted)
        return answer_error(r, 503, "server_error", NULL, "overloaded",
                            "the server is busy: %d requests are already admitted (--parallel); "
                            "try again later",
                            s->cfg.parallel);
    r->submitted = 1;
    make_id(s, kind, r->id, sizeof r->id);
    r->created = (int64_t)time(NULL);

    if (r->o.stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, r, NULL);
        if (!resp) return MHD_NO;
        add_common_headers(resp, "text/event-stream");
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
    return answer_json(r, 200, srv_response_json(s, j, &r->o, r->id, r->created), NULL, NULL);
}

static route find_route(const char *url) {
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return ROUTE_MODEL;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    return ROUTE_NONE;
}

/* Constant-time comparison of the Authorization header with "Bearer KEY". */
static int key_ok(const char *header, const char *key) {
    static const char prefix[] = "Bearer ";
    if (!header || strncmp(header, prefix, sizeof prefix - 1)) return 0;
    header += sizeof prefix - 1;
    size_t n = strlen(header), m = strlen(key);
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < m; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < n ? header[i] : 0);
    return diff == 0;
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
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight of browser clients */
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, "*");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        enum MHD_Result ok = MHD_queue_response(r->c, 204, resp);
        MHD_destroy_response(resp);
        r->status = 204;
        return ok;
    }
    const int wants_post = r->route == ROUTE_CHAT || r->route == ROUTE_COMPLETIONS;
    if (wants_post ? !post : !get)
        return answer_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                            "%s %s: method not allowed (use %s)", method, url,
                            wants_post ? "POST" : "GET");
    if (s->cfg.api_key && r->route != ROUTE_HEALTH && r->route != ROUTE_METRICS &&
        !key_ok(MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                s->cfg.api_key))
        return answer_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                            "Incorrect API key provided (send 'Authorization: Bearer KEY').");
    switch (r->route) {
    case ROUTE_HEALTH: {
        pthread_mutex_lock(&s->mu);
        const int32_t stopping = s->stopping, queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        return answer_json(r, 200,
                           json_pack("{s:s, s:s, s:i}", "status", stopping ? "stopping" : "ok",
                                     "model", s->cfg.model_id, "queue", queued),
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
        r->t0 = sl_now();
        snprintf(r->what, sizeof r->what, "%s %s", method, url);
        *con_cls = r;
        pthread_mutex_lock(&s->mu);
        s->n_requests++;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping && find_route(url) != ROUTE_HEALTH)
            return answer_error(r, 503, "server_error", NULL, "shutting_down",
                                "the server is shutting down");
        return first_call(r, url, method);
    }
    if (*upload_size) { /* a piece of the body */
        if (!r->status && !r->too_big) {
            if (r->body_len + *upload_size > (size_t)s->cfg.max_body) {
                r->too_big = 1;
            } else {
                if (r->body_len + *upload_size + 1 > r->body_cap) {
                    size_t cap = SL_CLI_MIN((r->body_len + *upload_size + 1) * 2,
                                            (size_t)s->cfg.max_body + 1);
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
    if (r->status) return MHD_YES; /* answered early */
    return answer_generation(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv *s = cls;
    srv_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    const int gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->job) {
        if (gone) atomic_store(&r->job->cancel, 1); /* no effect once done */
        pthread_mutex_lock(&r->job->mu);
        const cli_gen_result res = r->job->res;
        const int done = r->job->state == SRV_JOB_DONE;
        pthread_mutex_unlock(&r->job->mu);
        if (s->cfg.log && r->submitted && done)
            fprintf(stderr, "sluice serve: %s %d%s, %d+%d tokens (%d cached), %.3f s\n", r->what,
                    r->status, gone ? " (client gone)" : "", res.prompt_tokens,
                    res.completion_tokens, res.cached_tokens, sl_now() - r->t0);
        else if (s->cfg.log && r->submitted)
            fprintf(stderr, "sluice serve: %s (client gone: cancelled), %.3f s\n", r->what,
                    sl_now() - r->t0);
        srv_job_release(r->job);
    }
    if (s->cfg.log && !r->submitted)
        fprintf(stderr, "sluice serve: %s %d%s\n", r->what, r->status,
                gone && !r->status ? " (client gone)" : "");
    free(r->body);
    free(r->out);
    free(r);
    pthread_mutex_lock(&s->mu);
    s->n_requests--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("sluice serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---------------------------------------------------------------- lifetime */

/* A listening socket of our own, so that errors name their cause (port in use ...). */
static int listen_on(const char *host, int32_t port, int *family, int32_t *bound) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e) return cli_error("cannot listen on %s:%d: %s", host, port, gai_strerror(e)), -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
        cli_error("cannot listen on %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    *family = ai->ai_family;
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                            : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

int srv_start(srv **out, cli_gen *g, const srv_config *cfg) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return cli_error("out of memory");
    s->cfg = *cfg;
    s->g = g;
    s->tok = g->tok;
    s->tpl = g->tpl;
    s->max_ctx = sl_session_max_ctx(g->s);
    s->vocab = g->info.vocab_size;
    s->started = sl_now();
    s->started_wall = (int64_t)time(NULL);
    s->listen_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    srv_cond_init(&s->cv);
    sl_model_get_stats(g->m, &s->metrics.stats);
    *out = s;
    int family = AF_INET;
    if ((s->listen_fd = listen_on(cfg->host, cfg->port, &family, &s->port)) < 0) return 1;
    if (pthread_create(&s->worker, NULL, srv_worker_main, s))
        return cli_error("cannot start the model worker thread");
    s->worker_started = 1;
    const unsigned limit = (unsigned)SL_CLI_MAX(64, 4 * cfg->parallel);
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        limit, MHD_OPTION_END);
    if (!s->daemon) return cli_error("cannot start the HTTP server (libmicrohttpd)");
    return 0;
}

int32_t srv_port(const srv *s) {
    return s->port;
}

void srv_shutdown(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_mutex_unlock(&s->mu);
    if (s->daemon) {
        /* No new connections; requests already received run to their end. */
        MHD_socket fd = MHD_quiesce_daemon(s->daemon);
        if (fd != MHD_INVALID_SOCKET) close(fd);
        s->listen_fd = -1;
        const double until = sl_now() + s->cfg.timeout_s;
        pthread_mutex_lock(&s->mu);
        while (s->n_requests > 0 && sl_now() < until)
            srv_cond_wait_ms(&s->cv, &s->mu, 100);
        pthread_mutex_unlock(&s->mu);
        MHD_stop_daemon(s->daemon);
        s->daemon = NULL;
    }
    if (s->worker_started) {
        pthread_mutex_lock(&s->mu);
        s->worker_exit = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->worker, NULL);
        s->worker_started = 0;
    }
}

void srv_free(srv *s) {
    if (!s) return;
    srv_shutdown(s);
    if (s->listen_fd >= 0) close(s->listen_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
