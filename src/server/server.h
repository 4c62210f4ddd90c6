/*
 * sluice serve: an OpenAI-compatible HTTP server over one loaded model.
 *
 *   HTTP threads (libmicrohttpd, one per connection)      model worker (one thread)
 *   parse + validate JSON, template, tokenize  --FIFO-->  owns the cli_gen: prefill
 *   stream SSE / wait for the reply            <--text--  (prefix reuse), sample, detok
 *
 * Requests are admitted up to `parallel` at a time (one generating, the rest
 * queued FIFO); more get 503. A client that disconnects cancels its request,
 * queued or running. See README.md, "Serving (OpenAI-compatible API)".
 */
#ifndef SL_SERVER_H
#define SL_SERVER_H

#include "cli/generate.h"

typedef struct srv_config {
    const char *host;       /* default 127.0.0.1 */
    int32_t port;           /* 0: any free port (srv_port tells which) */
    const char *api_key;    /* NULL: no authentication */
    const char *model_id;   /* the name /v1/models lists and responses carry */
    int32_t parallel;       /* requests admitted at once (running + queued) */
    int64_t max_body;       /* request body limit in bytes (413 above) */
    int32_t timeout_s;      /* whole request, queue wait included */
    int32_t idle_timeout_s; /* an idle connection is closed after this */
    int32_t think;          /* default of chat_template_kwargs.enable_thinking */
    sl_sampler_params sp;   /* defaults when a request does not say */
    int32_t log;            /* one line per request on stderr */
} srv_config;

typedef struct srv srv;

/* Listens and starts the model worker, which owns g from now until srv_free.
 * 0, or 1 with the error printed. */
int srv_start(srv **out, cli_gen *g, const srv_config *cfg);
/* The port listened on. */
int32_t srv_port(const srv *s);
/* Graceful stop: no new connections or requests (503), requests already admitted
 * finish (for at most timeout_s), then the threads end. */
void srv_shutdown(srv *s);
void srv_free(srv *s);

#endif /* SL_SERVER_H */
