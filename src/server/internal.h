/* The server's shared structures: jobs, the queue, counters (see server.h). */
#ifndef SL_SERVER_INTERNAL_H
#define SL_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <jansson.h>

#include "chat/reply.h"
#include "chat/toolcall.h"
#include "sampler/json_constraint.h"
#include "server/server.h"

#define SRV_MAX_STOPS 8

typedef enum srv_job_state {
    SRV_JOB_QUEUED = 0,
    SRV_JOB_RUNNING = 1,
    SRV_JOB_DONE = 2,
} srv_job_state;

/* A sampled token's log-probabilities (logprobs requests): every token sampled into the
 * reply, those of a harmony reply's reasoning and channel markers too. */
typedef struct srv_tok {
    int32_t id;
    float logprob;
    int32_t offset; /* where its bytes start in the reply (special tokens dropped from the
                       text add none) */
    int32_t n_top;
    sl_token_logprob top[SL_GEN_MAX_TOP_LOGPROBS];
} srv_tok;

/* A latency histogram for /metrics (Prometheus): counts of the observations at or under each
 * bound (cumulated when written), their sum and number. */
#define SRV_LAT_BOUNDS 10
typedef struct srv_lat {
    int64_t le[SRV_LAT_BOUNDS];
    double sum;
    int64_t n;
} srv_lat;

/*
 * One generation request. Shared by its HTTP thread and the model worker, each
 * holding a reference (refs); the last release frees it. The request part is
 * fixed before queueing; the progress part is guarded by mu and announced on cv.
 */
typedef struct srv_job {
    /* request */
    sl_token_ids prompt;
    sl_sampler_params sp;
    int32_t max_tokens;
    int32_t ignore_eos;
    char *stops[SRV_MAX_STOPS];
    int32_t n_stops;
    double deadline;     /* sl_now() seconds: the request's timeout */
    sl_logit_bias *bias; /* [sp.n_logit_bias], owned; sp.logit_bias points here */
    int32_t logprobs;    /* 1: record toks */
    int32_t top_logprobs;
    int32_t tool_calls; /* chat with tools offered: the reply's <tool_call> blocks are calls */
    sl_json_constraint *json; /* response_format json_object / json_schema: owned, the worker's
                                 once queued; NULL: free text */
    /* progress */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job_state state;
    char *text; /* the reply so far (bytes; may end inside a UTF-8 character until done) */
    size_t text_len, text_cap;
    /* parts: a chat reply read by its template's layout (harmony): text is its content,
     * reasoning its reasoning (reasoning_content), the parser the worker's */
    int32_t parts;
    sl_reply_parser parser;
    char *reasoning;
    size_t reasoning_len, reasoning_cap;
    int32_t oom;             /* the worker's: a part could not be stored */
    const sl_tokenizer *tok; /* the worker's: the server's, for job_token */
    srv_tok *toks;           /* logprobs: one per sampled token */
    size_t n_toks, toks_cap;
    int32_t toks_bytes; /* the reply's bytes so far, as srv_tok.offset counts them */
    sl_gen_result res;
    int32_t timed_out;
    int32_t failed; /* the HTTP status to answer (500, 503); error holds the message */
    char error[256];
    /* the worker's: when the request arrived (srv_job_new) and its last token was sampled
     * (0: none yet), and its latencies until job_finish adds them to the metrics */
    double t_arrived, t_token;
    srv_lat ttft, itl;
    atomic_int cancel; /* set by the HTTP side: the client went away */
    int32_t refs;      /* under mu */
    struct srv_job *next;
} srv_job;

/* The status codes counted, in srv_metrics.http order. */
#define SRV_CODES                                                                                  \
    { 200, 204, 400, 401, 403, 404, 405, 413, 500, 503, 529 }
#define SRV_N_CODES 11

/* Counters for /metrics, under srv.mu. */
typedef struct srv_metrics {
    int64_t http[SRV_N_CODES]; /* responses by status, SRV_CODES order */
    int64_t finish[3], timeouts;
    int64_t queue_timeouts; /* 503s after waiting --queue-timeout for a place */
    int64_t errors;         /* generations that failed (the library returned an error) */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    srv_lat ttft, itl; /* time to first token (from the request's arrival), between tokens */
    int64_t decode_steps, decode_rows; /* the worker's decode steps, and the tokens they ran */
    int32_t batch_size;                /* the last step's */
    sl_stats stats;                    /* the model's counters after the last job */
} srv_metrics;

/* One of the worker's sequences: a KV cache of its own (kept between requests, for prefix
 * reuse), and the job generating on it. */
typedef struct srv_slot {
    sl_gen_seq *seq;
    srv_job *job; /* NULL: free (set and cleared under srv.mu, read by srv_cancel_all) */
    sl_gen_params p;
    sl_gen_result res;
    int32_t left;   /* prompt tokens still to run (0: decoding) */
    uint64_t order; /* when it last took a job: prompts prefill in this order, and a free slot
                       used longest ago goes first */
} srv_slot;

/* A request waiting for one of the `parallel` places (on its HTTP thread's stack). */
typedef struct srv_waiter {
    struct srv_waiter *prev, *next;
} srv_waiter;

/*
 * One TCP connection, from libmicrohttpd's connection-start notice to its close.
 * Its deadline is the time by which the request being read must have arrived
 * whole; the watchdog thread shuts down connections past theirs, since
 * libmicrohttpd's own timeout is an idle one that a client trickling a byte at
 * a time never reaches.
 */
typedef struct srv_conn {
    int fd;          /* a dup of the socket: shutdown() on it cuts the connection, and the
                        number cannot be reused by another connection while we hold it */
    double deadline; /* sl_now() seconds; 0: none (the request is being answered) */
    int32_t n_done;  /* requests completed on this connection */
    int32_t cut;     /* shut down by the watchdog */
    struct srv_conn *prev, *next;
} srv_conn;

struct srv {
    srv_params cfg;
    int loopback;            /* listening on a loopback address: the Host header is checked */
    sl_gen *g;               /* the worker's alone once started */
    const sl_tokenizer *tok; /* read-only: HTTP threads tokenize */
    sl_chat_template tpl;
    int32_t max_ctx, vocab;
    int32_t n_ctx_train; /* the model's positions (config) */
    sl_gen_config gen;   /* a copy of g's (read-only): the eos ids a JSON constraint ends on */
    pthread_mutex_t json_mu;
    sl_json_vocab *json_vocab; /* under json_mu: built at the first response_format request */
    int32_t port;
    double started;       /* sl_now() at start */
    int64_t started_wall; /* time() at start */
    struct MHD_Daemon *daemon;
    int listen_fd;
    pthread_t worker;
    int worker_started;
    int stuck; /* srv_shutdown gave up on the worker: nothing may be freed */

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;  /* queue changes, job done, requests finished */
    srv_job *head, *tail;
    srv_waiter *wait_head, *wait_tail;
    int32_t n_queued, n_running, n_waiting;
    int32_t n_requests; /* HTTP requests in progress (shutdown waits for 0) */
    int32_t stopping;   /* refuse new requests */
    int32_t worker_exit, worker_done;
    atomic_int abandon; /* the shutdown timeout passed: HTTP threads stop waiting for jobs */
    uint64_t n_ids;     /* response ids and default seeds */
    srv_metrics metrics;
    srv_slot *slots; /* [n_slots]: --parallel sequences (the worker's but for their job) */
    int32_t n_slots;
    /* the worker's: a decode step's rows (sessions, ids, slots), batch and logits */
    sl_batch *batch;
    sl_session **rows;
    int32_t *row_ids;
    srv_slot **row_slots;
    float *batch_logits; /* [n_slots, vocab] */
    uint64_t n_started;  /* jobs started */

    pthread_mutex_t conn_mu; /* the connections and the watchdog */
    pthread_cond_t conn_cv;
    srv_conn *conns;
    int64_t conns_cut;     /* connections cut by the watchdog, for /metrics */
    int64_t limit_refused; /* connections refused at --max-connections-per-ip */
    double limit_said;     /* sl_now() when that was last logged */
    pthread_t watchdog;
    int watchdog_started, watchdog_exit;
};

/* ---- worker.c ---- */
/* A condition variable on CLOCK_MONOTONIC, and a wait on it of at most ms. */
void srv_cond_init(pthread_cond_t *cv);
int srv_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int32_t ms);
/* A new job (one reference, the caller's); NULL when out of memory. */
srv_job *srv_job_new(void);
void srv_job_release(srv_job *j);
/* How srv_submit ended. */
typedef enum srv_admit {
    SRV_ADMITTED = 0,
    SRV_FULL = -1,         /* `parallel` admitted and `queue` waiting already */
    SRV_STOPPING = -2,     /* the server is shutting down */
    SRV_WAIT_TIMEOUT = -3, /* no place within queue_timeout_s (or the request's deadline) */
    SRV_CLIENT_GONE = -4,  /* gone(user) said so while waiting */
} srv_admit;
/* Queues j for the worker (taking a second reference for it). When the `parallel` places
 * are taken, waits for one in FIFO order, polling gone(user) (may be NULL) ten times a
 * second. */
srv_admit srv_submit(srv *s, srv_job *j, int (*gone)(void *), void *user);
/* Sets the cancel flag of every job queued or running (the shutdown timeout). */
void srv_cancel_all(srv *s);
void *srv_worker_main(void *arg);
/* The worker's --parallel sequences (the first is s->g's own) and its batch; freed by
 * srv_slots_free. */
sl_status srv_slots_init(srv *s, sl_error *err);
void srv_slots_free(srv *s);
/* 1, 2, 3, ...: response ids and default seeds. */
uint64_t srv_next_number(srv *s);

/* ---- openai.c ---- */
typedef enum srv_kind {
    SRV_CHAT = 0,       /* /v1/chat/completions */
    SRV_COMPLETION = 1, /* /v1/completions */
    SRV_MESSAGES = 2,   /* /v1/messages (Anthropic; anthropic.c) */
} srv_kind;

/* What the HTTP side keeps of a parsed request besides the job. */
typedef struct srv_request_opts {
    srv_kind kind;
    int32_t stream, include_usage;
    int32_t logprobs; /* answer with j->toks */
    /* the tools offered (chat, messages), each as OpenAI's {"type": "function", "function":
     * {...}} in tojson's text (owned): the template's prompt, and the schemas the reply's calls
     * are read by */
    char **tool_defs;
    int32_t n_tool_defs;
    /* completions with echo: the prompt's text (owned), which the reply's text starts with */
    char *echo;
    size_t echo_len;
} srv_request_opts;

/* Frees what o owns (tool_defs, echo). */
void srv_request_opts_free(srv_request_opts *o);

/* Parses and validates a request body into j (prompt tokenized, sampling, stops,
 * max_tokens). 0, or the HTTP status with *error set to an OpenAI error object. */
int srv_parse_request(srv *s, srv_kind kind, const char *body, size_t len, srv_job *j,
                      srv_request_opts *o, json_t **error);
/* Request fields, shared by both APIs. 400 with *error set to an OpenAI error object naming
 * param (the Anthropic route rewrites it into its own shape, see srv_anthropic_error). */
int srv_bad(json_t **error, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The request body as JSON, or NULL with *error a 400's (srv_bad) naming where it broke. */
json_t *srv_load_body(const char *body, size_t len, json_t **error);
/* The prompt of messages m[0..n) with o's tools (srv_encode_chat_tools) unless rc already holds
 * an error; then frees owned[0..n) (their texts), every m[i].tool_calls with its arguments
 * texts, owned and m. Returns rc or the encoding's status. */
int srv_encode_chat_free(srv *s, sl_chat_msg *m, char **owned, size_t n, const srv_request_opts *o,
                         int32_t think, srv_job *j, int rc, json_t **error);
/* A function name as OpenAI and Anthropic allow it: ^[a-zA-Z0-9_-]{1,64}$. */
int srv_valid_name(json_t *v);
/* logit_bias: {"<token id>": bias in [-100, 100], ...} into j->bias and j->sp (after
 * srv_sampling). 0, 400 with *error set, or 500. */
int srv_get_logit_bias(srv *s, json_t *req, srv_job *j, json_t **error);
/* The calls of a reply (j->tool_calls) in text[0..len), read in the template's form with o's
 * tools: sl_tool_calls_read. 0, or -1 when out of memory (out is then empty). */
int srv_read_calls(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                   sl_tool_calls *out);
/* A tool call's id: prefix ("call_", "toolu_") and 24 random hex digits. */
void srv_call_id(const char *prefix, char *out, size_t cap);
/* messages[i]'s role (msg must be an object with a string "role"): 0, or 400 with *error set. */
int srv_msg_role(json_t *msg, size_t i, const char **role, json_t **error);
/* Optional fields: absent or null leaves *out. 0, or 400 with *error set. */
int srv_get_number(json_t *req, const char *key, double lo, double hi, double *out, json_t **error);
int srv_get_int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out, json_t **error);
int srv_get_bool(json_t *obj, const char *key, int32_t *out, json_t **error);
/* req[key]: a string or an array of strings, into j->stops. */
int srv_get_stops(json_t *req, const char *key, srv_job *j, json_t **error);
/* j->sp: the server's defaults with the request's temperature, top_p, top_k where given
 * (negative: not given), and a fresh seed. */
void srv_sampling(srv *s, srv_job *j, double temp, double top_p, int64_t top_k);
/* m[n] through the chat template (with the generation prompt) into j->prompt; 0, 400 or 500. */
int srv_encode_chat(srv *s, const sl_chat_msg *m, int32_t n, int32_t think, srv_job *j,
                    json_t **error);
/* The same with tools offered (NULL: none). */
int srv_encode_chat_tools(srv *s, const sl_chat_msg *m, int32_t n, const sl_chat_tools *tools,
                          int32_t think, srv_job *j, json_t **error);
/* Checks that j->prompt (what: the field it came from) leaves room to reply; sets
 * j->max_tokens to max_tokens (negative: to the context's end) within that room. */
int srv_fit_prompt(srv *s, srv_job *j, const char *what, int64_t max_tokens, json_t **error);
/* {"error": {...}} with the given message (bytes of it that are not UTF-8 read '?'), type,
 * param (may be NULL), code (may be NULL). */
json_t *srv_error_json(const char *message, const char *type, const char *param, const char *code);
/* The finish_reason string of a finished job. */
const char *srv_finish_reason(const srv_job *j);
/* The whole response of a finished job. */
json_t *srv_response_json(const srv *s, const srv_job *j, const srv_request_opts *o, const char *id,
                          int64_t created);
/* One streamed chunk: text (len bytes, may be NULL), reasoning (rlen bytes, NULL: none; a
 * chat delta's reasoning_content), finish (NULL while going on), role (the first chat chunk),
 * logprobs (taken; NULL: null). */
json_t *srv_chunk_json(const srv *s, const srv_request_opts *o, const char *id, int64_t created,
                       const char *text, size_t len, const char *reasoning, size_t rlen,
                       const char *finish, int role, json_t *logprobs);
/* How many of j->toks belong to the reply: all, but those past a stop string that cut it. */
size_t srv_toks_end(const srv_job *j);
/* The logprobs object of j->toks[from, to) in the kind's shape: chat {"content": [...]},
 * completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
json_t *srv_logprobs_json(const srv *s, srv_kind kind, const srv_job *j, size_t from, size_t to);
/* A JSON string of text that should be valid UTF-8 (the detokenizer's output, cut at
 * character boundaries); "" if it is not, rather than invalid JSON. */
json_t *srv_text_json(const char *text, size_t len);
/* Tool calls (requests with tools offered, j->tool_calls): the calls in text[0..len) as
 * OpenAI's tool_calls ([{"id": "call_...", "type": "function", "function": {"name",
 * "arguments": JSON text}}], with "index" in a stream's delta), *content replaced by the text
 * outside them (null when there is none); NULL, *content untouched, when there is no call. */
json_t *srv_tool_calls_json(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                            int stream, json_t **content);
/* Where a stream holds text back (it may be a call): the first "<tool_call>" in
 * text[from, len), or, until done, a tail that may begin one or is whitespace, with the
 * whitespace before it; len when neither is there. */
size_t srv_tool_hold(const char *text, size_t from, size_t len, int done);
/* The usage object. */
json_t *srv_usage_json(const srv_job *j);

/* ---- tokens.c ---- */
/* POST /tokenize (detok 0) and /detokenize (1): 200 with *out the answer, or 400 with *out an
 * OpenAI error object; 500 when out of memory (*out NULL). */
int srv_tokenize(srv *s, int detok, const char *body, size_t len, json_t **out);

/* ---- anthropic.c ---- */
/* Parses and validates a /v1/messages body into j, as srv_parse_request does; count: one of
 * /v1/messages/count_tokens (no max_tokens, and the prompt may exceed the context). */
int srv_parse_messages(srv *s, const char *body, size_t len, int count, srv_job *j,
                       srv_request_opts *o, json_t **error);
/* The Anthropic form of an error answer: status (503 becomes 529, overloaded) and
 * {"type":"error","error":{"type":...,"message":...}} from an OpenAI error object's message
 * (taking the reference to openai, which may be NULL). */
json_t *srv_anthropic_error(int *status, json_t *openai);
/* The whole response of a finished job: the reply's calls (j->tool_calls) as tool_use blocks. */
json_t *srv_message_json(const srv *s, const srv_job *j, const srv_request_opts *o, const char *id);
/* Tool calls as Anthropic's content blocks: the calls in text[0..len) as [{"type": "tool_use",
 * "id": "toolu_...", "name", "input": {...}}], *content set to the text outside them (a new
 * string, "" when there is none); NULL, *content untouched, when there is no call. */
json_t *srv_tool_use_json(const srv *s, const srv_request_opts *o, const char *text, size_t len,
                          json_t **content);
/* Anthropic's stop_reason (tool_use: the reply made calls) and stop_sequence of a finished job. */
const char *srv_stop_reason(const srv_job *j, int tool_use);
json_t *srv_stop_sequence_json(const srv_job *j);
/* Stream events (the "type" field is the event's name): message_start; a content block's
 * content_block_start, content_block_delta (text, len bytes) or content_block_stop, of text or
 * thinking; message_delta (the end: stop_reason, output_tokens). */
json_t *srv_message_start_json(const srv *s, const srv_job *j, const char *id);
json_t *srv_block_json(const char *type, int32_t index, int thinking, const char *text, size_t len);
/* A tool_use block of srv_tool_use_json streamed: its content_block_start (the id and name, an
 * empty input) and its one content_block_delta (input_json_delta: the input's JSON text). */
json_t *srv_tool_block_start_json(int32_t index, const json_t *block);
json_t *srv_tool_block_delta_json(int32_t index, const json_t *block);
json_t *srv_message_delta_json(const srv_job *j, int tool_use);

/* ---- metrics.c ---- */
/* The bounds of the latency histograms, seconds (SRV_LAT_BOUNDS each). */
extern const double srv_ttft_bounds[SRV_LAT_BOUNDS], srv_itl_bounds[SRV_LAT_BOUNDS];
/* The Prometheus text exposition of s's counters (malloc'ed). */
char *srv_metrics_text(srv *s);
/* Counts a response of the given status. */
void srv_count_status(srv *s, int status);
/* Counts a 503 after waiting --queue-timeout. */
void srv_count_queue_timeout(srv *s);

#endif /* SL_SERVER_INTERNAL_H */
