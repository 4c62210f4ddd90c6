/*
 * sluice serve: an OpenAI-compatible HTTP server over one loaded model, which also
 * answers Anthropic's Messages API (/v1/messages, text only).
 *
 *   HTTP threads (libmicrohttpd, one per connection)      model worker (one thread)
 *   parse + validate JSON, template, tokenize  --FIFO-->  owns the sl_gen and `parallel`
 *   stream SSE / wait for the reply            <--text--  sequences: prefill (prefix reuse),
 *                                                         batched decode, sample, detok
 *
 * Requests are admitted up to `parallel` at a time, all generating together
 * (continuous batching: each step, a chunk of one prompt and a token of every
 * reply past its prompt); up to `queue` more wait for a place, each at most
 * queue_timeout_s, and only then get 503. A client that goes away (a reset, or
 * a failed write) cancels its request, queued or running. See README.md,
 * "Serving (OpenAI-compatible API)".
 */
#ifndef SL_SERVER_H
#define SL_SERVER_H

#include "gen/generate.h"

/* The most sequences a server runs at once (--parallel). */
#define SRV_MAX_PARALLEL 256

/* What `sluice serve` sets (cmd_serve.c reads it from the command line). */
typedef struct srv_params {
    const char *host;           /* default 127.0.0.1 */
    int32_t port;               /* 0: any free port (srv_port tells which) */
    const char *api_key;        /* NULL: no authentication; never "" */
    const char *const *cors;    /* [n_cors] origins whose pages may read responses ("*": any) */
    int32_t n_cors;             /* 0: no CORS headers, OPTIONS is a 405 */
    const char *model_id;       /* the name /v1/models lists and responses carry */
    int32_t parallel;           /* requests generating at once, each its own KV cache */
    int32_t prefill_chunk;      /* prompt tokens a step runs while other replies decode */
    int32_t queue;              /* requests that may wait for one of those places */
    int32_t queue_timeout_s;    /* ... for this long, then 503 */
    int64_t max_body;           /* request body limit in bytes (413 above) */
    int32_t timeout_s;          /* whole request, queue wait included */
    int32_t idle_timeout_s;     /* an idle connection is closed after this */
    int32_t header_timeout_s;   /* a request (headers and body) must arrive within this */
    int32_t max_conns;          /* open connections at once (more wait in the backlog) */
    int32_t max_conns_per_ip;   /* open connections from one address (more are refused) */
    int32_t shutdown_timeout_s; /* srv_shutdown waits this long for requests in flight */
    int32_t think;              /* default of chat_template_kwargs.enable_thinking */
    sl_sampler_params sp;       /* defaults when a request does not say */
    int32_t log;                /* one line per request on stderr */
} srv_params;

typedef struct srv srv;

/* Listens and starts the model worker, which owns g from now until srv_free. On failure the
 * error is in err (warnings, such as a key-less public address, go to stderr) and *out is
 * NULL or to be given to srv_free. */
sl_status srv_start(srv **out, sl_gen *g, const srv_params *params, sl_error *err);
/* The port listened on. */
int32_t srv_port(const srv *s);
/* 1 when the address listened on is a loopback one (127.0.0.0/8, ::1). */
int srv_loopback(const srv *s);
/* Graceful stop: no new connections; requests in flight get shutdown_timeout_s to
 * finish, then are cancelled (a stream ends with an error event, a waiting request
 * gets 503). Returns 0, or 1 when the model worker did not come back from a forward
 * within a few more seconds (a hung read): then g and s must be left alone (not
 * freed) and the process should exit. */
int srv_shutdown(srv *s);
/* What the worker ran: decode steps, and the tokens they ran together (rows / steps: the mean
 * batch size). */
void srv_batch_stats(srv *s, int64_t *steps, int64_t *rows);
/* Frees s after srv_shutdown returned 0 (or when srv_start failed). */
void srv_free(srv *s);

#endif /* SL_SERVER_H */
