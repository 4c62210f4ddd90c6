/* GET /metrics: the server's counters in the Prometheus text format (version 0.0.4). */
#include <stdarg.h>

#include "server/internal.h"

void srv_count_status(srv *s, int status) {
    static const int codes[] = SRV_CODES;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i] == status) s->metrics.http[i]++;
    pthread_mutex_unlock(&s->mu);
}

void srv_batch_stats(srv *s, int64_t *steps, int64_t *rows) {
    pthread_mutex_lock(&s->mu);
    *steps = s->metrics.decode_steps;
    *rows = s->metrics.decode_rows;
    pthread_mutex_unlock(&s->mu);
}

void srv_count_queue_timeout(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->metrics.queue_timeouts++;
    pthread_mutex_unlock(&s->mu);
}

/* A growable text buffer; on allocation failure it stays NULL. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    for (int tries = 0; tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
}

const double srv_ttft_bounds[SRV_LAT_BOUNDS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
const double srv_itl_bounds[SRV_LAT_BOUNDS] = {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5};

/* A histogram: its buckets (cumulative, then +Inf), sum and count. */
static void histogram(buf *b, const char *name, const char *help, const srv_lat *h,
                      const double *bounds) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_LAT_BOUNDS; i++)
        put(b, "%s_bucket{le=\"%g\"} %lld\n", name, bounds[i], (long long)h->le[i]);
    put(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.17g\n%s_count %lld\n", name, (long long)h->n,
        name, h->sum, name, (long long)h->n);
}

/* One metric: HELP and TYPE lines, then the sample. */
static void metric(buf *b, const char *name, const char *type, const char *help, double v) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_text(srv *s) {
    static const int codes[] = SRV_CODES;
    static const char *const finish[] = {"stop", "length", "cancelled"}; /* sl_gen_finish */
    pthread_mutex_lock(&s->mu);
    const srv_metrics m = s->metrics;
    const int32_t queued = s->n_queued, running = s->n_running, waiting = s->n_waiting;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->conn_mu);
    const int64_t cut = s->conns_cut;
    int32_t open = 0;
    for (const srv_conn *k = s->conns; k; k = k->next)
        open++;
    pthread_mutex_unlock(&s->conn_mu);
    const sl_stats *st = &m.stats;

    buf b = {0};
    put(&b, "# HELP sluice_http_requests_total HTTP responses by status code.\n"
            "# TYPE sluice_http_requests_total counter\n");
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        put(&b, "sluice_http_requests_total{code=\"%d\"} %lld\n", codes[i], (long long)m.http[i]);
    put(&b, "# HELP sluice_completions_total Generations run by the model, by how they ended.\n"
            "# TYPE sluice_completions_total counter\n");
    for (int i = 0; i < 3; i++)
        put(&b, "sluice_completions_total{finish_reason=\"%s\"} %lld\n", finish[i],
            (long long)m.finish[i]);
    metric(&b, "sluice_request_timeouts_total", "counter",
           "Generations stopped by the request timeout.", (double)m.timeouts);
    metric(&b, "sluice_queue_timeouts_total", "counter",
           "Requests refused (503) after waiting --queue-timeout for a place.",
           (double)m.queue_timeouts);
    metric(&b, "sluice_generation_errors_total", "counter",
           "Generations the model failed (a read, a checksum, a numeric fault): answered 500.",
           (double)m.errors);
    metric(&b, "sluice_connections_cut_total", "counter",
           "Connections closed because their request did not arrive in time (--header-timeout).",
           (double)cut);
    metric(&b, "sluice_connections_open", "gauge", "Open HTTP connections.", open);
    metric(&b, "sluice_prompt_tokens_total", "counter", "Prompt tokens of the requests run.",
           (double)m.prompt_tokens);
    metric(&b, "sluice_prompt_tokens_cached_total", "counter",
           "Prompt tokens reused from the KV cache instead of computed.", (double)m.cached_tokens);
    metric(&b, "sluice_completion_tokens_total", "counter", "Tokens generated.",
           (double)m.completion_tokens);
    metric(&b, "sluice_prompt_tokens_per_second", "gauge",
           "Prefill throughput since start (computed prompt tokens / prefill time).",
           st->prefill_time > 0 ? (double)st->prompt_tokens / st->prefill_time : 0);
    metric(&b, "sluice_decode_tokens_per_second", "gauge",
           "Decode throughput since start (decode steps / decode time).",
           st->decode_time > 0 ? (double)st->gen_tokens / st->decode_time : 0);
    metric(&b, "sluice_expert_requests_total", "counter",
           "Routed-expert requests (one per layer, expert and forward chunk).",
           (double)st->expert_requests);
    metric(&b, "sluice_expert_hits_total", "counter", "Expert requests served from the cache.",
           (double)st->expert_hits);
    metric(&b, "sluice_expert_hit_ratio", "gauge", "expert_hits / expert_requests since start.",
           st->expert_requests ? (double)st->expert_hits / (double)st->expert_requests : 1.0);
    metric(&b, "sluice_expert_bytes_read_total", "counter", "Expert bytes read from disk.",
           (double)st->bytes_read);
    histogram(&b, "sluice_time_to_first_token_seconds",
              "From a request's arrival (queueing included) to its first token.", &m.ttft,
              srv_ttft_bounds);
    histogram(&b, "sluice_inter_token_latency_seconds", "Between consecutive tokens of a reply.",
              &m.itl, srv_itl_bounds);
    metric(&b, "sluice_queue_length", "gauge", "Requests admitted and waiting for the model.",
           queued);
    metric(&b, "sluice_queue_waiting", "gauge",
           "Requests waiting for a place among the --parallel admitted ones.", waiting);
    metric(&b, "sluice_requests_running", "gauge",
           "Requests generating now (at most --parallel, each a sequence of its own).", running);
    metric(&b, "sluice_decode_steps_total", "counter",
           "Decode steps run (each a token of every reply past its prompt, in one batch).",
           (double)m.decode_steps);
    metric(&b, "sluice_decode_rows_total", "counter",
           "Tokens the decode steps ran (/ decode_steps: the mean batch size).",
           (double)m.decode_rows);
    metric(&b, "sluice_batch_size", "gauge", "Replies in the last decode step.", m.batch_size);
    metric(&b, "sluice_decode_expert_bytes_read_total", "counter",
           "Expert bytes read from disk by decode steps (prompts excluded).",
           (double)(st->bytes_read - st->prefill_bytes_read));
    metric(&b, "sluice_uptime_seconds", "gauge", "Seconds since the server started.",
           sl_now() - s->started);
    return b.p;
}
