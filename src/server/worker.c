/*
 * The job queue and the model worker: one thread owns the model's session and
 * runs admitted requests one at a time, first come first served, appending each
 * reply's text to its job as it forms.
 */
#include <time.h>

#include "server/internal.h"

void srv_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

int srv_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int32_t ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(cv, mu, &t);
}

srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    srv_cond_init(&j->cv);
    atomic_init(&j->cancel, 0);
    j->refs = 1;
    j->t_arrived = sl_now();
    return j;
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    sl_token_ids_free(&j->prompt);
    for (int32_t i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    free(j->text);
    free(j->reasoning);
    free(j->bias);
    free(j->toks);
    sl_json_constraint_free(j->json);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Room for one more admitted request (under s->mu). */
static int has_place(const srv *s) {
    return s->n_queued + s->n_running < s->cfg.parallel;
}

/*
 * Admission in two steps, so that a burst of clients waits instead of failing:
 *
 *   [ waiting: up to `queue` ] --place free, first in line--> [ admitted: up to `parallel` ]
 *     HTTP threads blocked here,                                queued FIFO to the worker,
 *     each for queue_timeout_s at most                          one of them generating
 *
 * Waiters are a FIFO list of their own (each on its HTTP thread's stack), so that places go
 * in order of arrival and a waiter that gives up (timeout, client gone) simply unlinks.
 */
srv_admit srv_submit(srv *s, srv_job *j, int (*gone)(void *), void *user) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return SRV_STOPPING;
    }
    if (!has_place(s) || s->wait_head) {
        if (s->n_waiting >= s->cfg.queue) {
            pthread_mutex_unlock(&s->mu);
            return SRV_FULL;
        }
        srv_waiter w = {.prev = s->wait_tail};
        if (s->wait_tail)
            s->wait_tail->next = &w;
        else
            s->wait_head = &w;
        s->wait_tail = &w;
        s->n_waiting++;
        const double until = SL_MIN(sl_now() + s->cfg.queue_timeout_s, j->deadline);
        srv_admit rc = SRV_ADMITTED;
        for (;;) {
            if (s->stopping) {
                rc = SRV_STOPPING;
                break;
            }
            if (s->wait_head == &w && has_place(s)) break;
            if (sl_now() >= until) {
                rc = SRV_WAIT_TIMEOUT;
                break;
            }
            srv_cond_wait_ms(&s->cv, &s->mu, 100);
            if (gone && gone(user)) { /* a poll that does not wait: fine under the lock */
                rc = SRV_CLIENT_GONE;
                break;
            }
        }
        if (w.prev)
            w.prev->next = w.next;
        else
            s->wait_head = w.next;
        if (w.next)
            w.next->prev = w.prev;
        else
            s->wait_tail = w.prev;
        s->n_waiting--;
        pthread_cond_broadcast(&s->cv); /* the next in line may be first now */
        if (rc != SRV_ADMITTED) {
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return SRV_ADMITTED;
}

void srv_cancel_all(srv *s) {
    pthread_mutex_lock(&s->mu);
    for (srv_job *j = s->head; j; j = j->next)
        atomic_store(&j->cancel, 1);
    if (s->running) atomic_store(&s->running->cancel, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

uint64_t srv_next_number(srv *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->n_ids;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- callbacks of the generation loop ---- */

/* A part of a reply read by its template's layout (under j->mu). */
static void job_part(void *user, sl_reply_part part, const char *text, size_t len) {
    srv_job *j = user;
    if (part == SL_REPLY_REASONING)
        j->oom |= sl_append(&j->reasoning, &j->reasoning_len, &j->reasoning_cap, text, len) != 0;
    else
        j->oom |= sl_append(&j->text, &j->text_len, &j->text_cap, text, len) != 0;
}

/* A sampled token's log-probabilities (logprobs requests), before its text is emitted. */
static void job_token(void *user, int32_t id, float logprob, const sl_token_logprob *top,
                      int32_t n_top) {
    srv_job *j = user;
    /* special tokens' text stays out of the reply unless it is read by parts */
    const int32_t len = j->parts || !sl_tokenizer_is_special(j->tok, id)
                            ? sl_tokenizer_token_bytes(j->tok, id, NULL, 0)
                            : 0;
    pthread_mutex_lock(&j->mu);
    if (j->n_toks == j->toks_cap) {
        const size_t cap = j->toks_cap ? 2 * j->toks_cap : 64;
        srv_tok *t = realloc(j->toks, cap * sizeof *t);
        if (t) {
            j->toks = t;
            j->toks_cap = cap;
        }
    }
    if (j->n_toks < j->toks_cap) {
        srv_tok *t = &j->toks[j->n_toks++];
        *t = (srv_tok){.id = id, .logprob = logprob, .offset = j->toks_bytes, .n_top = n_top};
        memcpy(t->top, top, (size_t)n_top * sizeof *top);
        j->toks_bytes += SL_MAX(len, 0);
    } else {
        j->oom = 1; /* job_emit cancels */
    }
    pthread_mutex_unlock(&j->mu);
}

static int job_emit(void *user, const char *text, size_t len) {
    srv_job *j = user;
    pthread_mutex_lock(&j->mu);
    if (j->parts)
        sl_reply_feed(&j->parser, text, len, job_part, j);
    else
        j->oom |= sl_append(&j->text, &j->text_len, &j->text_cap, text, len) != 0;
    const int oom = j->oom;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return oom ? 1 : atomic_load(&j->cancel); /* out of memory cancels; reported below */
}

/* Adds one observation of v seconds to h, whose bounds are b. */
static void lat_add(srv_lat *h, const double *b, double v) {
    for (int i = 0; i < SRV_LAT_BOUNDS; i++)
        h->le[i] += v <= b[i];
    h->sum += v;
    h->n++;
}

static void lat_merge(srv_lat *to, const srv_lat *from) {
    for (int i = 0; i < SRV_LAT_BOUNDS; i++)
        to->le[i] += from->le[i];
    to->sum += from->sum;
    to->n += from->n;
}

/* Polled by the generation loop once per token, just before it is sampled: the clock of the
 * job's time to first token and of the gaps between its tokens. */
static int job_cancelled(void *user) {
    srv_job *j = user;
    const double now = sl_now();
    if (j->t_token > 0)
        lat_add(&j->itl, srv_itl_bounds, now - j->t_token);
    else
        lat_add(&j->ttft, srv_ttft_bounds, now - j->t_arrived);
    j->t_token = now;
    if (atomic_load(&j->cancel)) return 1;
    if (sl_now() > j->deadline) {
        j->timed_out = 1; /* the worker's field until the job is done */
        return 1;
    }
    return 0;
}

/* Ends a job: frees its slot and counts it first, so that a client seeing its reply
 * end can send the next request at once without finding the server full. */
static void job_finish(srv *s, srv_job *j, const sl_gen_result *res, int status,
                       const char *error) {
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    s->running = NULL;
    srv_metrics *m = &s->metrics;
    m->finish[res->finish]++;
    m->timeouts += j->timed_out;
    m->prompt_tokens += res->prompt_tokens;
    m->cached_tokens += res->cached_tokens;
    m->completion_tokens += res->completion_tokens;
    lat_merge(&m->ttft, &j->ttft);
    lat_merge(&m->itl, &j->itl);
    sl_model_get_stats(s->g->m, &m->stats);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&j->mu);
    j->res = *res;
    if (error) {
        j->failed = status;
        snprintf(j->error, sizeof j->error, "%s", error);
    }
    j->state = SRV_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The HTTP status of a generation the library failed: 503 (with Retry-After: worth trying
 * again) for a read past the I/O timeout (the disk may recover) or running out of memory,
 * 500 for the rest (a failed, short or corrupt read, non-finite logits). */
static int error_status(sl_status st) {
    return st == SL_ERR_TIMEOUT || st == SL_ERR_NOMEM ? 503 : 500;
}

static void run_job(srv *s, srv_job *j) {
    sl_gen *g = s->g;
    sl_gen_result res = {.prompt_tokens = (int32_t)j->prompt.n, .finish = SL_GEN_CANCELLED};
    if (job_cancelled(j)) { /* gone, or timed out, while queued */
        job_finish(s, j, &res, 503,
                   j->timed_out ? "the request timed out waiting for the model" : NULL);
        return;
    }
    sl_error err = {0};
    j->tok = s->tok;
    sl_sampler_free(g->smp);
    g->smp = NULL;
    if (sl_sampler_create(&j->sp, g->info.vocab_size, &g->smp, &err)) {
        job_finish(s, j, &res, 500, err.msg);
        return;
    }
    sl_gen_params p = {.max_tokens = j->max_tokens,
                       .stops = (const char *const *)j->stops,
                       .n_stops = j->n_stops,
                       .accept_prompt = 1,
                       .ignore_eos = j->ignore_eos,
                       .keep_special = j->parts,
                       .emit = job_emit,
                       .token = j->logprobs ? job_token : NULL,
                       .top_logprobs = j->top_logprobs,
                       .cancelled = job_cancelled,
                       .user = j,
                       .mask = j->json ? sl_json_constraint_mask_cb : NULL,
                       .accept = j->json ? sl_json_constraint_accept_cb : NULL,
                       .constraint = j->json};
    sl_status st = sl_gen_reply(g, j->prompt.ids, (int32_t)j->prompt.n, &p, &res, &err);
    if (j->parts) { /* what the parser held: the reply's end */
        pthread_mutex_lock(&j->mu);
        sl_reply_finish(&j->parser, job_part, j);
        pthread_mutex_unlock(&j->mu);
    }
    if (st) {
        /* Whatever failed (a read, a checksum, non-finite logits), the KV cache may now hold
         * positions computed from bad data while ctx_ids still claims them: the next request
         * sharing the prefix would reuse them and answer nonsense (or ""). Start from empty. */
        sl_gen_reset(g);
        const char *msg = err.msg[0] ? err.msg : "the model failed to generate";
        if (s->cfg.log) fprintf(stderr, "sluice serve: generation failed: %s\n", msg);
        pthread_mutex_lock(&s->mu);
        s->metrics.errors++;
        pthread_mutex_unlock(&s->mu);
        job_finish(s, j, &res, error_status(st), msg);
        return;
    }
    if (res.finish == SL_GEN_CANCELLED && !j->timed_out && !atomic_load(&j->cancel)) {
        job_finish(s, j, &res, 500, "out of memory"); /* job_emit failed */
        return;
    }
    if (j->oom) { /* the parser's last part (job_emit's fail the generation above) */
        job_finish(s, j, &res, 500, "out of memory");
        return;
    }
    if (j->timed_out) res.finish = SL_GEN_LENGTH; /* what was generated is returned */
    job_finish(s, j, &res, 0, NULL);
}

void *srv_worker_main(void *arg) {
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->worker_exit)
            pthread_cond_wait(&s->cv, &s->mu);
        srv_job *j = s->head;
        if (!j) {
            s->worker_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_queued--;
        s->n_running++;
        s->running = j;
        pthread_mutex_unlock(&s->mu);

        pthread_mutex_lock(&j->mu);
        j->state = SRV_JOB_RUNNING;
        pthread_mutex_unlock(&j->mu);
        run_job(s, j);
        srv_job_release(j);
    }
}
