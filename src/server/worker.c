/*
 * The job queue and the model worker: one thread owns the model and its --parallel
 * sequences (srv_slot, each a KV cache), and runs the admitted requests together: each
 * step, one chunk of a prompt (the oldest still prefilling) and one decode step of every
 * request past its prompt, in one forward pass (sl_batch_decode). Each reply's text is
 * appended to its job as it forms.
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
    for (int32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) atomic_store(&s->slots[i].job->cancel, 1);
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

/* The client went away, or the request's time is up (then timed_out: the worker's field until
 * the job is done). */
static int job_gone(srv_job *j) {
    if (atomic_load(&j->cancel)) return 1;
    if (sl_now() > j->deadline) {
        j->timed_out = 1;
        return 1;
    }
    return 0;
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
    return job_gone(j);
}

/* Ends a slot's job: frees the slot and counts the job first, so that a client seeing its
 * reply end can send the next request at once without finding the server full. */
static void job_finish(srv *s, srv_slot *sl, const sl_gen_result *res, int status,
                       const char *error) {
    srv_job *j = sl->job;
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    sl->job = NULL;
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
    srv_job_release(j);
}

/* The HTTP status of a generation the library failed: 503 (with Retry-After: worth trying
 * again) for a read past the I/O timeout (the disk may recover) or running out of memory,
 * 500 for the rest (a failed, short or corrupt read, non-finite logits). */
static int error_status(sl_status st) {
    return st == SL_ERR_TIMEOUT || st == SL_ERR_NOMEM ? 503 : 500;
}

/* The end of a slot's reply (sl_gen_end), st the status it ended with. */
static void job_end(srv *s, srv_slot *sl, sl_status st, sl_error *err) {
    srv_job *j = sl->job;
    st = sl_gen_end(sl->seq, st, err);
    if (j->parts) { /* what the parser held: the reply's end */
        pthread_mutex_lock(&j->mu);
        sl_reply_finish(&j->parser, job_part, j);
        pthread_mutex_unlock(&j->mu);
    }
    sl_gen_result res = sl->res;
    if (st) {
        /* Whatever failed (a read, a checksum, non-finite logits), the KV cache may now hold
         * positions computed from bad data while ctx_ids still claims them: the next request
         * sharing the prefix would reuse them and answer nonsense (or ""). Start from empty. */
        sl_gen_forget(sl->seq);
        const char *msg = err->msg[0] ? err->msg : "the model failed to generate";
        if (s->cfg.log) fprintf(stderr, "sluice serve: generation failed: %s\n", msg);
        pthread_mutex_lock(&s->mu);
        s->metrics.errors++;
        pthread_mutex_unlock(&s->mu);
        job_finish(s, sl, &res, error_status(st), msg);
        return;
    }
    if (res.finish == SL_GEN_CANCELLED && !j->timed_out && !atomic_load(&j->cancel)) {
        job_finish(s, sl, &res, 500, "out of memory"); /* job_emit failed */
        return;
    }
    if (j->oom) { /* the parser's last part (job_emit's fail the generation above) */
        job_finish(s, sl, &res, 500, "out of memory");
        return;
    }
    if (j->timed_out) res.finish = SL_GEN_LENGTH; /* what was generated is returned */
    job_finish(s, sl, &res, 0, NULL);
}

/* A job just placed in slot sl: its sampler, and its prompt's cached prefix (sl_gen_begin). */
static void job_start(srv *s, srv_slot *sl) {
    srv_job *j = sl->job;
    sl_gen *g = s->g;
    pthread_mutex_lock(&j->mu);
    j->state = SRV_JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);
    sl->res = (sl_gen_result){.prompt_tokens = (int32_t)j->prompt.n, .finish = SL_GEN_CANCELLED};
    if (job_gone(j)) { /* gone, or timed out, while queued */
        job_finish(s, sl, &sl->res, 503,
                   j->timed_out ? "the request timed out waiting for the model" : NULL);
        return;
    }
    sl_error err = {0};
    j->tok = s->tok;
    sl_sampler_free(sl->seq->smp);
    sl->seq->smp = NULL;
    if (sl_sampler_create(&j->sp, g->info.vocab_size, &sl->seq->smp, &err)) {
        job_finish(s, sl, &sl->res, 500, err.msg);
        return;
    }
    sl->p = (sl_gen_params){.max_tokens = j->max_tokens,
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
    sl_status st =
        sl_gen_begin(g, sl->seq, j->prompt.ids, (int32_t)j->prompt.n, &sl->p, &sl->res, &err);
    if (st) {
        job_end(s, sl, st, &err);
        return;
    }
    sl->left = sl->seq->r.n - sl->seq->r.done;
    sl->order = ++s->n_started;
}

/* The free slot for job j: the one whose cache holds the longest prefix of its prompt, else
 * the one used longest ago (under s->mu). */
static srv_slot *pick_slot(srv *s, const srv_job *j) {
    srv_slot *best = NULL;
    int32_t best_keep = -1;
    for (int32_t i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (sl->job) continue;
        const int32_t keep = sl_gen_cached(sl->seq, j->prompt.ids, (int32_t)j->prompt.n);
        if (keep > best_keep || (keep == best_keep && sl->order < best->order)) {
            best = sl;
            best_keep = keep;
        }
    }
    return best;
}

/*
 * One step of the worker: a chunk of the oldest prompt still prefilling (the whole prompt when
 * nothing decodes, else at most prefill_chunk tokens, so that a long prompt delays the others'
 * next tokens by one chunk at most), then one token of every reply past its prompt, their
 * forwards in one batch.
 */
static void step(srv *s) {
    sl_gen *g = s->g;
    srv_slot *pf = NULL;
    int decoding = 0;
    for (int32_t i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (!sl->job) continue;
        if (sl->left == 0) decoding = 1;
        if (sl->left > 0 && (!pf || sl->order < pf->order)) pf = sl;
    }
    if (pf && job_gone(pf->job)) {
        pf->seq->r.cancelled = 1;
        job_end(s, pf, SL_OK, &(sl_error){0});
    } else if (pf) {
        sl_error err = {0};
        const int32_t chunk = decoding ? s->cfg.prefill_chunk : INT32_MAX;
        sl_status st = sl_gen_prefill(pf->seq, chunk, &pf->left, &err);
        if (st) job_end(s, pf, st, &err);
    }
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (!sl->job || sl->left > 0) continue;
        sl_error err = {0};
        sl_status st;
        if (sl_gen_sample(g, sl->seq, &st, &err)) {
            s->rows[n] = sl->seq->s;
            s->row_ids[n] = sl->seq->r.next;
            s->row_slots[n++] = sl;
        } else {
            job_end(s, sl, st, &err);
        }
    }
    if (n == 0) return;
    sl_error err = {0};
    /* One row alone runs as a decode step of its own (on a GPU, a graph where enabled). */
    const sl_status st =
        n == 1
            ? sl_session_forward(s->rows[0], s->row_ids, 1, s->row_slots[0]->seq->logits, 0, &err)
            : sl_batch_decode(s->batch, s->rows, s->row_ids, n, s->batch_logits, &err);
    const size_t V = (size_t)g->info.vocab_size;
    for (int32_t i = 0; i < n; i++) {
        srv_slot *sl = s->row_slots[i];
        if (st) /* job_end empties the sequence's cache */
            job_end(s, sl, st, &err);
        else if (n > 1)
            memcpy(sl->seq->logits, s->batch_logits + (size_t)i * V, V * sizeof(float));
    }
    pthread_mutex_lock(&s->mu);
    s->metrics.decode_steps++;
    s->metrics.decode_rows += n;
    s->metrics.batch_size = n;
    pthread_mutex_unlock(&s->mu);
}

static int busy(const srv *s) {
    for (int32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) return 1;
    return 0;
}

void *srv_worker_main(void *arg) {
    srv *s = arg;
    for (;;) {
        const int working = busy(s);
        srv_slot *placed[SRV_MAX_PARALLEL];
        int32_t n_placed = 0;
        pthread_mutex_lock(&s->mu);
        while (!working && !s->head && !s->worker_exit)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!working && !s->head) {
            s->worker_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        /* New requests join between steps, first come first served, while slots are free. */
        for (srv_slot *sl; s->head && (sl = pick_slot(s, s->head));) {
            srv_job *j = s->head;
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->n_queued--;
            s->n_running++;
            sl->job = j;
            placed[n_placed++] = sl;
        }
        pthread_mutex_unlock(&s->mu);
        for (int32_t i = 0; i < n_placed; i++)
            job_start(s, placed[i]);
        step(s);
    }
}

sl_status srv_slots_init(srv *s, sl_error *err) {
    sl_gen *g = s->g;
    const int32_t n = s->cfg.parallel;
    s->slots = sl_calloc((size_t)n, sizeof *s->slots, err);
    s->rows = sl_calloc((size_t)n, sizeof *s->rows, err);
    s->row_ids = sl_calloc((size_t)n, sizeof *s->row_ids, err);
    s->row_slots = sl_calloc((size_t)n, sizeof *s->row_slots, err);
    if (!s->slots || !s->rows || !s->row_ids || !s->row_slots) return SL_ERR_NOMEM;
    s->n_slots = n;
    s->slots[0].seq = &g->seq;
    for (int32_t i = 1; i < n; i++) {
        sl_gen_seq *q = sl_calloc(1, sizeof *q, err);
        if (!q) return SL_ERR_NOMEM;
        s->slots[i].seq = q;
        sl_status st = sl_gen_seq_init(g, q, err);
        if (st) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            return sl_fail(err, st,
                           "--parallel %d: sequence %d (a KV cache of %d tokens each): %s; lower "
                           "--parallel or --ctx",
                           n, i + 1, g->sp.max_ctx, why);
        }
    }
    if (n > 1) {
        s->batch_logits = sl_calloc((size_t)n * (size_t)g->info.vocab_size, sizeof(float), err);
        if (!s->batch_logits) return SL_ERR_NOMEM;
        return sl_batch_create(g->m, n, &s->batch, err);
    }
    return SL_OK;
}

void srv_slots_free(srv *s) {
    for (int32_t i = 1; s->slots && i < s->n_slots; i++)
        if (s->slots[i].seq) {
            sl_gen_seq_free(s->slots[i].seq);
            free(s->slots[i].seq);
        }
    free(s->slots), free(s->rows), free(s->row_ids), free(s->row_slots), free(s->batch_logits);
    sl_batch_free(s->batch);
    s->slots = NULL;
    s->n_slots = 0;
}
