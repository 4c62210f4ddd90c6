/* Expert store: mapped views, packed mapped/resident/stream, the stream slots and the reader pool.
 */
#include "moe/experts.h"

#include <errno.h>
#include <time.h>

#include "core/crc32c.h"
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A stream slot's read (sl_expert_layer.sio). */
typedef enum { SLOT_IDLE = 0, SLOT_FLIGHT, SLOT_QUARANTINE } sl_slot_state;
typedef struct sl_slot_io {
    int32_t pending;   /* its jobs still out (the engine's lock) */
    int8_t state;      /* sl_slot_state: FLIGHT until settled; QUARANTINE: abandoned, its slot
                        * emptied but not reusable until the reads are back */
    int8_t prefetched; /* filled by a prefetch and no fetch has used it yet */
    int32_t item;      /* the item of the layer's last start it serves, or -1 */
    double deadline;   /* sl_now() when its reads time out (< 0: never) */
} sl_slot_io;

/* The io_uring engine (below; stubs without liburing). */
static sl_status uring_start(sl_expert_store *s, const sl_store_params *p, sl_error *err);
static void uring_free(sl_expert_store *s);

/* ------------------------------------------------------------ binding */

static sl_status store_init(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                            sl_error *err) {
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers;
    s->n_experts = n_experts;
    s->layers = sl_calloc((size_t)n_layers, sizeof(sl_expert_layer), err);
    /* a fetch's reads: up to SL_READ_MAX_PARTS per blob, or per piece of a files layer */
    s->jobs = sl_calloc((size_t)SL_MAX(n_experts, 1) * SL_EX_PARTS * SL_READ_MAX_PARTS,
                        sizeof(sl_read_job), err);
    s->miss_slot = sl_calloc((size_t)SL_MAX(n_experts, 1), sizeof(int32_t), err);
    if (!s->layers || !s->jobs || !s->miss_slot) return SL_ERR_NOMEM;
    for (int32_t l = 0; l < n_layers; l++)
        s->layers[l].fd = -1;
    return SL_OK;
}

/* Per-layer arrays every MoE layer has. */
static sl_status layer_init(sl_expert_layer *L, int32_t E, sl_error *err) {
    L->n_experts = E;
    L->views = sl_calloc((size_t)E, sizeof(sl_expert), err);
    L->hist = sl_calloc((size_t)E, sizeof(int64_t), err);
    return L->views && L->hist ? SL_OK : SL_ERR_NOMEM;
}

sl_status sl_experts_open_views(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                                const sl_expert *const *views, sl_error *err) {
    sl_status st = store_init(s, n_layers, n_experts, err);
    s->mode = SL_EXPERTS_MAPPED;
    for (int32_t l = 0; !st && l < n_layers; l++) {
        if (!views[l] || n_experts == 0) continue;
        if (!(st = layer_init(&s->layers[l], n_experts, err)))
            memcpy(s->layers[l].views, views[l], (size_t)n_experts * sizeof(sl_expert));
    }
    return st;
}

/* ------------------------------------------------------------ reading */

/* Each reader thread's aligned buffer: O_DIRECT retries and bounced jobs go through it. */
#define SL_BOUNCE ((size_t)64 << 10)
/* Reads that return no new byte this many times in a row give up rather than spin. */
#define SL_READ_MAX_STUCK 8

/* Expert memory (resident experts, stream slots), page-aligned and on huge pages where the
 * kernel grants them on request (THP "madvise", a common default): the products stream
 * gigabytes of it, and on 4 KiB pages every page costs a TLB miss, a nested page walk on a VM.
 * Measured on an EPYC VM: int8 prefill 4.5x faster, load 2.4x (docs/BENCHMARKS.md 5.1). The
 * advice is a hint: refused, nothing changes. NULL when out of memory. */
static uint8_t *expert_alloc(size_t len) {
    uint8_t *p = aligned_alloc(SL_PACK_PAGE, len);
    if (p && len) (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

/* sl_read_full with a flag that stops it between reads (a pool being torn down). */
static int read_full(int fd, uint8_t *dst, uint64_t len, uint64_t offset, uint32_t align,
                     uint8_t *bounce, size_t bounce_cap, const int *quit) {
    int stuck = 0;
    while (len > 0) {
        if (quit && __atomic_load_n(quit, __ATOMIC_RELAXED)) return ECANCELED;
        ssize_t r;
        uint64_t got;
        if (!align || ((uintptr_t)dst % align == 0 && offset % align == 0 && len % align == 0)) {
            r = pread(fd, dst, (size_t)SL_MIN(len, (uint64_t)1 << 30), (off_t)offset);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return errno ? errno : EIO;
            if (r == 0) return SL_READ_SHORT;
            got = (uint64_t)r;
        } else {
            /* O_DIRECT after a short read (or given unaligned work): the aligned block around
             * the missing bytes into the bounce buffer, then the part wanted. Its end is
             * aligned, so the read after it can go straight to dst again. */
            SL_ASSERT(bounce && bounce_cap >= align && (uintptr_t)bounce % align == 0);
            const uint64_t base = offset / align * align, skip = offset - base;
            const size_t want =
                (size_t)SL_MIN((uint64_t)bounce_cap / align * align, align_up(skip + len, align));
            r = pread(fd, bounce, want, (off_t)base);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return errno ? errno : EIO;
            if (r == 0) return SL_READ_SHORT;
            got = (uint64_t)r > skip ? SL_MIN((uint64_t)r - skip, len) : 0;
            memcpy(dst, bounce + skip, (size_t)got);
        }
        if (got == 0) { /* only bytes before offset came back: the end of the file, or a stall */
            struct stat sb;
            if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size <= offset) return SL_READ_SHORT;
            if (++stuck >= SL_READ_MAX_STUCK) return EIO;
            continue;
        }
        stuck = 0;
        dst += got;
        len -= got;
        offset += got;
    }
    return 0;
}

int sl_read_full(int fd, uint8_t *dst, uint64_t len, uint64_t offset, uint32_t align,
                 uint8_t *bounce, size_t bounce_cap) {
    return read_full(fd, dst, len, offset, align, bounce, bounce_cap, NULL);
}

/*
 * The reader pool: a few threads blocked in pread keep several reads in flight (NVMe wants
 * that). The caller hands over a batch and waits for it, at most the I/O timeout. A read still
 * out at the deadline cannot be taken back (a pread stuck in the kernel ignores signals and
 * cancellation), so it is abandoned: its job reports SL_READ_TIMEOUT, its thread's result is
 * dropped when it comes, and the pool refuses new batches (SL_READ_STALLED) until it has come:
 * the read may still write into the slot it was given, so that slot must not be refilled
 * meanwhile. Reads into the caller's memory (bounce jobs) go through the thread's own buffer,
 * copied out under the lock only while their batch is still waited on.
 *
 * Freeing a pool whose read is stuck cannot join that thread: every thread is detached, and
 * the last one out frees the pool and the memory handed over with it (the slots reads may
 * still land in). Freeing thus never waits for the disk; a read that never returns keeps a
 * thread and that memory until the process exits.
 */
struct sl_reader_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int32_t n_threads, started, alive;
    pthread_t *threads;
    uint8_t *bounce; /* n_threads x SL_BOUNCE, page-aligned */
    sl_read_job *jobs;
    int32_t n_jobs, next, finished;
    int32_t in_flight;   /* reads taken and not back: the batch's, or abandoned ones */
    uint64_t batch;      /* the batch being waited on; a result of another one is stale */
    const char *stalled; /* the file of an abandoned read still out, for messages */
    int32_t abandoned;   /* reads given up on (timed out) and not back yet */
    /* asynchronous reads (slots'): a ring of q_cap, taken after the batch's */
    sl_read_job **queue;
    int64_t q_head, q_tail;
    int32_t q_cap;
    int quit, orphaned;
    void **orphans; /* freed by the last thread out */
    int32_t n_orphans, cap_orphans;
};

static void pool_destroy(sl_reader_pool *p) {
    for (int32_t i = 0; i < p->n_orphans; i++)
        free(p->orphans[i]);
    free(p->orphans), free(p->threads), free(p->bounce), free(p->queue);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p);
}

/* One job on a reader thread (the pool unlocked). */
static int run_job(sl_reader_pool *p, sl_read_job *j, uint8_t *bounce, uint64_t batch) {
    if (!j->bounce) {
        int r = read_full(j->fd, j->dst, j->len, j->offset, j->align, bounce, SL_BOUNCE, &p->quit);
        if (!r && j->sum) j->crc = sl_crc32c(0, j->dst, (size_t)j->len);
        return r;
    }
    SL_ASSERT(!j->align); /* the bounce buffer is the destination here */
    uint32_t crc = 0;
    for (uint64_t done = 0; done < j->len;) {
        const size_t n = (size_t)SL_MIN(j->len - done, (uint64_t)SL_BOUNCE);
        int r = read_full(j->fd, bounce, n, j->offset + done, 0, NULL, 0, &p->quit);
        if (r) return r;
        if (j->sum) crc = sl_crc32c(crc, bounce, n);
        pthread_mutex_lock(&p->mu);
        const int live = batch == p->batch;
        if (live) memcpy(j->dst + done, bounce, n);
        pthread_mutex_unlock(&p->mu);
        if (!live) return ECANCELED;
        done += n;
    }
    j->crc = crc;
    return 0;
}

static void *reader_main(void *arg) {
    sl_reader_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    uint8_t *bounce = p->bounce + (size_t)p->started++ * SL_BOUNCE;
    for (;;) {
        while (!p->quit && p->next >= p->n_jobs && p->q_head == p->q_tail)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        if (p->next >= p->n_jobs) { /* a slot's read: its job lives as long as the slot */
            sl_read_job *jp = p->queue[p->q_head++ % p->q_cap];
            if (jp->cancel) { /* given up before it started */
                jp->err = SL_READ_TIMEOUT;
                (*jp->pending)--;
                pthread_cond_broadcast(&p->done);
                continue;
            }
            jp->running = 1;
            sl_read_job j = *jp;
            p->in_flight++;
            pthread_mutex_unlock(&p->mu);
            const int r = run_job(p, &j, bounce, 0);
            pthread_mutex_lock(&p->mu);
            p->in_flight--;
            jp->running = 0;
            jp->err = jp->abandoned ? SL_READ_TIMEOUT : r;
            jp->crc = j.crc;
            if (jp->abandoned && --p->abandoned == 0) p->stalled = NULL;
            (*jp->pending)--;
            pthread_cond_broadcast(&p->done);
            continue;
        }
        const int32_t i = p->next++;
        sl_read_job j = p->jobs[i];
        const uint64_t batch = p->batch;
        p->in_flight++;
        pthread_mutex_unlock(&p->mu);
        const int r = run_job(p, &j, bounce, batch);
        pthread_mutex_lock(&p->mu);
        p->in_flight--;
        if (batch == p->batch) {
            p->jobs[i].err = r;
            p->jobs[i].crc = j.crc;
            if (++p->finished == p->n_jobs) pthread_cond_broadcast(&p->done);
        } else if (--p->abandoned == 0) {
            p->stalled = NULL; /* the last abandoned read is back: batches may run again */
        }
    }
    const int last = --p->alive == 0 && p->orphaned;
    pthread_mutex_unlock(&p->mu);
    if (last) pool_destroy(p);
    return NULL;
}

static void pool_free(sl_reader_pool *p);

static sl_status pool_start(sl_reader_pool **out, int32_t n, int32_t max_orphans, int32_t q_cap,
                            sl_error *err) {
    sl_reader_pool *p = sl_calloc(1, sizeof *p, err);
    if (!p) return SL_ERR_NOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the timeout ignores wall-clock jumps */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, &ca);
    pthread_condattr_destroy(&ca);
    p->threads = sl_calloc((size_t)n, sizeof(pthread_t), err);
    p->bounce = aligned_alloc(SL_PACK_PAGE, (size_t)n * SL_BOUNCE);
    p->orphans = sl_calloc((size_t)SL_MAX(max_orphans, 1), sizeof(void *), err);
    p->cap_orphans = max_orphans;
    p->q_cap = SL_MAX(q_cap, 1);
    p->queue = sl_calloc((size_t)p->q_cap, sizeof(sl_read_job *), err);
    *out = p;
    if (!p->threads || !p->bounce || !p->orphans || !p->queue)
        return sl_fail(err, SL_ERR_NOMEM, "out of memory for the reader pool");
    for (int32_t i = 0; i < n; i++) {
        pthread_mutex_lock(&p->mu);
        const int rc = pthread_create(&p->threads[i], NULL, reader_main, p);
        if (rc == 0) p->n_threads++, p->alive++;
        pthread_mutex_unlock(&p->mu);
        if (rc != 0)
            return sl_fail(err, SL_ERR_NOMEM, "cannot start reader threads: %s", strerror(rc));
    }
    return SL_OK;
}

/* Stops the threads, or (a read stuck) leaves the pool and its orphans to them. */
static void pool_free(sl_reader_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->quit, 1, __ATOMIC_RELAXED); /* read_full polls it unlocked */
    pthread_cond_broadcast(&p->work);
    if (p->in_flight > 0 && p->alive > 0) {
        p->orphaned = 1;
        for (int32_t i = 0; i < p->n_threads; i++)
            pthread_detach(p->threads[i]); /* under the lock: no thread can finish first */
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pool_destroy(p);
}

/* Memory a stuck read may still write into: freed with the pool, whenever that is. */
static void pool_adopt(sl_reader_pool *p, void *mem) {
    if (!mem) return;
    SL_ASSERT(p->n_orphans < p->cap_orphans);
    p->orphans[p->n_orphans++] = mem;
}

static int pool_stalled(sl_reader_pool *p) {
    pthread_mutex_lock(&p->mu);
    const int stalled = p->abandoned > 0;
    pthread_mutex_unlock(&p->mu);
    return stalled;
}

/* The file of the abandoned read still out, or NULL. */
static const char *pool_stalled_file(sl_reader_pool *p) {
    pthread_mutex_lock(&p->mu);
    const char *path = p->abandoned > 0 ? p->stalled : NULL;
    pthread_mutex_unlock(&p->mu);
    return path;
}

/* Runs n reads and waits for them, at most timeout_ms (< 0: no limit). See sl_reader_pool. */
static void pool_run(sl_reader_pool *p, sl_read_job *jobs, int32_t n, int32_t timeout_ms) {
    for (int32_t i = 0; i < n; i++)
        jobs[i].err = SL_READ_PENDING;
    pthread_mutex_lock(&p->mu);
    if (p->abandoned > 0) {
        for (int32_t i = 0; i < n; i++)
            jobs[i].err = SL_READ_STALLED;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->jobs = jobs;
    p->n_jobs = n;
    p->next = 0;
    p->finished = 0;
    p->batch++;
    pthread_cond_broadcast(&p->work);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    while (p->finished < n) {
        if (timeout_ms < 0)
            pthread_cond_wait(&p->done, &p->mu);
        else if (pthread_cond_timedwait(&p->done, &p->mu, &deadline) == ETIMEDOUT)
            break;
    }
    if (p->finished < n) { /* abandon what is out; what never started fails with it */
        for (int32_t i = 0; i < n; i++) {
            if (jobs[i].err != SL_READ_PENDING) continue;
            if (i < p->next) {
                p->abandoned++;
                if (!p->stalled) p->stalled = jobs[i].path;
            }
            jobs[i].err = SL_READ_TIMEOUT;
        }
        p->batch++;
    }
    p->jobs = NULL;
    p->n_jobs = p->next = 0;
    pthread_mutex_unlock(&p->mu);
}

/* Queues n slot reads (jobs that live as long as their slot), each counted in its pending. */
static void pool_submit(sl_reader_pool *p, sl_read_job *const *jobs, int32_t n) {
    pthread_mutex_lock(&p->mu);
    for (int32_t i = 0; i < n; i++) {
        sl_read_job *j = jobs[i];
        j->cancel = j->abandoned = j->running = 0;
        j->err = SL_READ_PENDING;
        (*j->pending)++;
        SL_ASSERT(p->q_tail - p->q_head < p->q_cap);
        p->queue[p->q_tail++ % p->q_cap] = j;
    }
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

/* Waits until pending (the count of a slot's n jobs) is 0, at most until deadline (seconds of
 * sl_now; < 0: none). At the deadline the jobs still out are given up on: those not started
 * never will be, those running are abandoned (the pool stalls until they are back). Returns 1
 * then, else 0. */
/* Reads of jobs[0..n) still pending past their deadline, for either engine: one in progress is
 * abandoned (counted, its file named as the stall, its result dropped when it comes back), one
 * not started yet is cancelled (its engine counts it back without reading). */
static void give_up(sl_read_job *jobs, int32_t n, int32_t *abandoned, const char **stalled) {
    for (int32_t i = 0; i < n; i++) {
        sl_read_job *j = &jobs[i];
        if (j->err != SL_READ_PENDING || j->cancel || j->abandoned) continue;
        if (j->running) {
            j->abandoned = 1;
            (*abandoned)++;
            if (!*stalled) *stalled = j->path;
        } else {
            j->cancel = 1;
        }
    }
}

static int pool_wait(sl_reader_pool *p, int32_t *pending, sl_read_job *jobs, int32_t n,
                     double deadline) {
    pthread_mutex_lock(&p->mu);
    struct timespec ts;
    if (deadline >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double left = deadline - sl_now();
        const double when = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + SL_MAX(left, 0.0);
        ts.tv_sec = (time_t)when;
        ts.tv_nsec = (long)((when - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    }
    int late = 0;
    while (*pending > 0 && !late) {
        if (deadline < 0)
            pthread_cond_wait(&p->done, &p->mu);
        else
            late = pthread_cond_timedwait(&p->done, &p->mu, &ts) == ETIMEDOUT && *pending > 0;
    }
    if (late) give_up(jobs, n, &p->abandoned, &p->stalled);
    pthread_mutex_unlock(&p->mu);
    return late;
}

/* The reads of a slot still out (pending), read under the pool's lock. */
static int32_t pool_pending(sl_reader_pool *p, const int32_t *pending) {
    pthread_mutex_lock(&p->mu);
    const int32_t n = *pending;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Stops the threads taking more work; whether a read is still running. */
static int pool_quit(sl_reader_pool *p) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->quit, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&p->work);
    const int busy = p->in_flight > 0;
    pthread_mutex_unlock(&p->mu);
    return busy;
}

void sl_experts_read(sl_expert_store *s, sl_read_job *jobs, int32_t n) {
    if (s->pool && (n > 1 || s->io_timeout_ms >= 0)) {
        pool_run(s->pool, jobs, n, s->io_timeout_ms);
        return;
    }
    /* No pool (nothing is streamed), or one read with no time limit: on this thread. */
    for (int32_t i = 0; i < n; i++) {
        sl_read_job *j = &jobs[i];
        j->err = read_full(j->fd, j->dst, j->len, j->offset, j->align, s->bounce, SL_BOUNCE, NULL);
        if (!j->err && j->sum) j->crc = sl_crc32c(0, j->dst, (size_t)j->len);
    }
}

sl_status sl_experts_read_status(int err) {
    return err == SL_READ_CRC                                 ? SL_ERR_FORMAT
           : err == SL_READ_TIMEOUT || err == SL_READ_STALLED ? SL_ERR_TIMEOUT
                                                              : SL_ERR_IO;
}

const char *sl_experts_read_error(const sl_expert_store *s, const sl_read_job *j, char *buf,
                                  size_t cap) {
    switch (j->err) {
    case 0: snprintf(buf, cap, "no error"); break;
    case SL_READ_SHORT: snprintf(buf, cap, "short read (file truncated?)"); break;
    case SL_READ_CRC:
        snprintf(
            buf, cap,
            "checksum mismatch (CRC32C %08x of the bytes read): the file is corrupt or the read "
            "returned bad data; the expert was not cached",
            j->crc);
        break;
    case SL_READ_TIMEOUT:
        snprintf(buf, cap,
                 "no answer within the I/O timeout of %d ms (a stalled disk or network "
                 "filesystem?)",
                 s->io_timeout_ms);
        break;
    case SL_READ_STALLED: {
        const char *file = s->pool ? pool_stalled_file(s->pool) : NULL;
        snprintf(buf, cap,
                 "not read: an earlier read of %s is still stalled past the I/O timeout of %d ms "
                 "(no new reads until it returns)",
                 file ? file : "this model", s->io_timeout_ms);
        break;
    }
    default: snprintf(buf, cap, "%s", strerror(j->err)); break;
    }
    return buf;
}

/* ------------------------------------------------------- packed layers */

static void set_views(sl_expert *v, const sl_experts_header *h, const uint8_t *blob) {
    v->gate = sl_expert_matrix(h, blob, 0);
    v->up = sl_expert_matrix(h, blob, 1);
    v->down = sl_expert_matrix(h, blob, 2);
    v->gate_bias = sl_expert_bias(h, blob, 0);
    v->up_bias = sl_expert_bias(h, blob, 1);
    v->down_bias = sl_expert_bias(h, blob, 2);
}

/* bytes as the CLI's sizes are written (powers of 1024: "1.2M"), rounded up so that the value
 * shown is always enough. */
static void size_up(int64_t bytes, char *out, size_t cap) {
    static const char units[] = "KMGT";
    double v = (double)bytes;
    int u = -1;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0) {
        snprintf(out, cap, "%lld", (long long)bytes);
        return;
    }
    snprintf(out, cap, "%.1f%c", ceil(v * 10) / 10, units[u]);
}

/* The header (the first page, then the rest when a version-2 CRC table runs past it): parsed,
 * checked against the model and the manifest's version, its checksum table kept in L->crc. */
static sl_status read_header(sl_expert_store *s, sl_expert_layer *L, int32_t l, uint64_t size,
                             int64_t H, int64_t I, const sl_store_params *p, sl_error *err) {
    const char *path = L->path;
    uint8_t *hb = aligned_alloc(SL_PACK_PAGE, SL_EXPERTS_HEADER);
    if (!hb) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    int r = read_full(L->fd, hb, SL_EXPERTS_HEADER, 0, L->align, s->bounce, SL_BOUNCE, NULL);
    sl_status st = SL_OK;
    if (r)
        st = sl_fail(err, r == SL_READ_SHORT ? SL_ERR_FORMAT : SL_ERR_IO,
                     "%s: cannot read the header%s%s", path,
                     r == SL_READ_SHORT ? " (file truncated)" : ": ",
                     r == SL_READ_SHORT ? "" : strerror(r));
    else
        st = sl_experts_header_parse(&L->hdr, path, hb, SL_EXPERTS_HEADER, size, err);
    const sl_experts_header *h = &L->hdr;
    if (!st && p->pack_version && h->version != p->pack_version)
        st = sl_fail(err, SL_ERR_FORMAT,
                     "%s: format version %u, but the manifest says %u (a file of another pack?)",
                     path, h->version, p->pack_version);
    if (!st && ((int64_t)h->layer != l || (int32_t)h->n_experts != s->n_experts || h->hidden != H ||
                h->inter != I))
        st = sl_fail(err, SL_ERR_SHAPE,
                     "%s: holds layer %u with %u experts of [%u, %u], "
                     "expected layer %d with %d of [%lld, %lld]",
                     path, h->layer, h->n_experts, h->inter, h->hidden, l, s->n_experts,
                     (long long)I, (long long)H);
    if (!st && h->version >= 2) {
        if (h->data_offset > SL_EXPERTS_HEADER) { /* more than 960 experts */
            uint8_t *all = aligned_alloc(SL_PACK_PAGE, (size_t)h->data_offset);
            if (!all) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
            r = all ? read_full(L->fd, all, h->data_offset, 0, L->align, s->bounce, SL_BOUNCE, NULL)
                    : 0;
            if (!st && r)
                st = sl_fail(err, SL_ERR_IO, "%s: cannot read the header: %s", path,
                             r == SL_READ_SHORT ? "short read" : strerror(r));
            free(hb);
            hb = all;
        }
        L->crc = st ? NULL : sl_calloc((size_t)h->n_experts, sizeof(uint32_t), err);
        if (!st && !L->crc) st = SL_ERR_NOMEM;
        if (!st) st = sl_experts_checksums(h, path, hb, (size_t)h->data_offset, L->crc, err);
#ifdef SL_NO_VERIFY /* a build for measuring what the checks cost (docs/BENCHMARKS.md section 10)  \
                     */
        free(L->crc);
        L->crc = NULL;
#endif
    }
    free(hb);
    return st;
}

/* A blob that does not match its checksum, as the error every mode gives. */
static sl_status blob_mismatch(const sl_expert_layer *L, int32_t l, int32_t e, const char *when,
                               sl_error *err) {
    return sl_fail(err, SL_ERR_FORMAT,
                   "%s: layer %d, expert %d: checksum mismatch %s (CRC32C is not %08x): the file "
                   "is corrupt; 'sluice verify' checks the whole pack",
                   L->path, l, e, when, L->crc[e]);
}

/* A blob's matrices: a pack's from its header, a files layer's from the protos. */
static void blob_views(const sl_expert_layer *L, sl_expert *v, const uint8_t *blob) {
    if (!L->ext) {
        set_views(v, &L->hdr, blob);
        return;
    }
    sl_tensor *m[3] = {&v->gate, &v->up, &v->down};
    sl_tensor *b[3] = {&v->gate_bias, &v->up_bias, &v->down_bias};
    for (int i = 0; i < 3; i++) {
        const uint64_t *off = &L->piece_off[3 * i], *len = &L->piece_len[3 * i];
        *m[i] = L->proto[i];
        m[i]->data = blob + off[0];
        m[i]->scales = len[1] ? (const void *)(blob + off[1]) : NULL;
        m[i]->biases = len[2] ? (const void *)(blob + off[2]) : NULL;
        *b[i] = L->bias_proto[i];
        b[i]->data =
            L->piece_len[SL_EX_GATE_LB + i] ? blob + L->piece_off[SL_EX_GATE_LB + i] : NULL;
    }
}

/* The raw image of expert e of a relayout layer (its n_raw pieces at raw_off) laid out into
 * blob, whose views are v. */
static void relayout_blob(const sl_expert_layer *L, const uint8_t *image, const sl_expert *v) {
    const uint8_t *raw[SL_RAW_MAX];
    for (int32_t i = 0; i < L->relayout->n_raw; i++)
        raw[i] = image + L->raw_off[i];
    L->relayout->fn(L->relayout, raw, v);
}

/* Stream mode's slots of blob bytes each: as many as --cache-experts, or as --cache-mem buys
 * over the n_moe layers, at least min_slots (what one token needs), at most every expert. */
static sl_status make_slots(sl_expert_layer *L, uint64_t blob, const sl_store_params *p,
                            int32_t n_moe, sl_error *err) {
    const int32_t E = L->n_experts;
    int64_t n = p->cache_experts;
    if (n <= 0 && p->cache_mem > 0) n = p->cache_mem / ((int64_t)blob * n_moe);
    if (n <= 0 && p->cache_mem <= 0) n = E;
    if (p->cache_clamp) n = SL_MAX(n, p->min_slots);
    if (n < p->min_slots && p->cache_experts > 0)
        return sl_fail(err, SL_ERR_ARG,
                       "expert cache of %lld slot%s per layer is smaller than the %d "
                       "experts one token uses: --cache-experts must be at least %d",
                       (long long)n, n == 1 ? "" : "s", p->min_slots, p->min_slots);
    if (n < p->min_slots) {
        char need[32], one[32];
        size_up((int64_t)blob * p->min_slots * n_moe, need, sizeof need);
        size_up((int64_t)blob, one, sizeof one);
        return sl_fail(err, SL_ERR_ARG,
                       "expert cache of %lld slot%s per layer is smaller than the %d "
                       "experts one token uses: --cache-mem must be at least %s (top-k %d "
                       "experts x %d layers x %s)",
                       (long long)n, n == 1 ? "" : "s", p->min_slots, need, p->min_slots, n_moe,
                       one);
    }
    const int32_t n_slots = (int32_t)SL_MIN(n, E);
    L->slot_mem = expert_alloc((size_t)n_slots * blob);
    L->slot_views = sl_calloc((size_t)n_slots, sizeof(sl_expert), err);
    if (sl_slot_cache_init(&L->slots, n_slots, E, p->policy, err) || !L->slot_mem || !L->slot_views)
        return sl_fail(err, SL_ERR_NOMEM, "out of memory for %d expert slots", n_slots);
    for (int32_t i = 0; i < n_slots; i++)
        blob_views(L, &L->slot_views[i], L->slot_mem + (uint64_t)i * blob);
    return SL_OK;
}

/* A stream layer's per-slot reads and the last start's items (not for relayout layers, whose
 * fetches read synchronously through the staging buffer). */
static sl_status slot_io_init(sl_expert_layer *L, sl_error *err) {
    const int32_t n = L->slots.n_slots;
    L->per = L->ext ? L->n_pieces * L->n_parts : L->n_parts;
    L->slot_jobs = sl_calloc((size_t)n * (size_t)L->per, sizeof(sl_read_job), err);
    L->sio = sl_calloc((size_t)n, sizeof(sl_slot_io), err);
    L->req_slot = sl_calloc((size_t)n, sizeof(int32_t), err);
    L->req_key = sl_calloc((size_t)n, sizeof(int32_t), err);
    L->req_state = sl_calloc((size_t)n, 1, err);
    L->req_bad = sl_calloc((size_t)n, sizeof(sl_read_job), err);
    if (!L->slot_jobs || !L->sio || !L->req_slot || !L->req_key || !L->req_state || !L->req_bad)
        return SL_ERR_NOMEM;
    for (int32_t i = 0; i < n; i++)
        L->sio[i].item = -1;
    for (int32_t i = 0; i < n * L->per; i++)
        L->slot_jobs[i].pending = &L->sio[i / L->per].pending;
    return SL_OK;
}

static sl_status open_layer(sl_expert_store *s, int32_t l, const char *dir, int64_t H, int64_t I,
                            const sl_store_params *p, int32_t n_moe, sl_error *err) {
    sl_expert_layer *L = &s->layers[l];
    char path[4096];
    snprintf(path, sizeof path, "%s/experts-%03d.bin", dir, l);
    if (!(L->path = strdup(path))) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    const int direct = p->mode == SL_EXPERTS_STREAM && p->direct_io;
    L->align = direct ? SL_PACK_PAGE : 0;
    uint64_t size = 0;
    L->fd = sl_open_regular(path, O_RDONLY | (direct ? O_DIRECT : 0), &size, err);
    if (L->fd < 0) return SL_ERR_IO;
    sl_status st = read_header(s, L, l, size, H, I, p, err);
    if (st) return st;
    const sl_experts_header *h = &L->hdr;
    if ((st = layer_init(L, s->n_experts, err))) return st;
    const int32_t E = s->n_experts;
    if (p->mode == SL_EXPERTS_MAPPED) {
        L->map = mmap(NULL, (size_t)h->file_size, PROT_READ, MAP_SHARED, L->fd, 0);
        if (L->map == MAP_FAILED) {
            L->map = NULL;
            return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        }
        L->map_size = (size_t)h->file_size;
        for (int32_t e = 0; e < E; e++)
            set_views(&L->views[e], h,
                      (uint8_t *)L->map + h->data_offset + (uint64_t)e * h->blob_bytes);
        /* checked on first fetch: loading stays instant, and unused experts are never read */
        if (L->crc && !(L->verified = sl_calloc((size_t)E, 1, err))) return SL_ERR_NOMEM;
        return SL_OK; /* the descriptor stays open: fetch checks the size with fstat */
    } else if (p->mode == SL_EXPERTS_RESIDENT) {
        L->resident = expert_alloc((size_t)E * h->blob_bytes);
        if (!L->resident)
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory for resident experts", path);
        for (int32_t e = 0; e < E; e++) {
            uint8_t *blob = L->resident + (uint64_t)e * h->blob_bytes;
            int r = read_full(L->fd, blob, h->blob_bytes,
                              h->data_offset + (uint64_t)e * h->blob_bytes, 0, NULL, 0, NULL);
            if (r)
                return sl_fail(err, SL_ERR_IO, "%s: layer %d, reading expert %d: %s", path, l, e,
                               r == SL_READ_SHORT ? "short read (file truncated?)" : strerror(r));
            if (L->crc && sl_crc32c(0, blob, (size_t)h->blob_bytes) != L->crc[e])
                return blob_mismatch(L, l, e, "at load", err);
            set_views(&L->views[e], h, blob);
        }
    } else {
        if ((st = make_slots(L, h->blob_bytes, p, n_moe, err))) return st;
        /* Parts of a blob: page multiples (O_DIRECT), the last one the rest. */
        const uint64_t B = h->blob_bytes, want = p->read_part ? p->read_part : SL_READ_PART;
        int32_t np = (int32_t)SL_MIN(SL_MAX(B / want, (uint64_t)1), SL_READ_MAX_PARTS);
        uint64_t part = align_up((B + (uint64_t)np - 1) / (uint64_t)np, SL_PACK_PAGE);
        if ((uint64_t)(np - 1) * part >= B) np = 1, part = B;
        L->n_parts = np;
        L->part_bytes = part;
        if (!(L->shift = sl_calloc((size_t)np, sizeof(sl_crc32c_shift), err))) return SL_ERR_NOMEM;
        for (int32_t k = 1; L->crc && k < np; k++)
            sl_crc32c_shift_init(&L->shift[k], k < np - 1 ? part : B - (uint64_t)(np - 1) * part);
        return slot_io_init(L, err);
    }
    close(L->fd);
    L->fd = -1;
    return SL_OK;
}

/* What a store that reads files starts with: mode, policy, timeout, the bounce buffer. */
static sl_status store_open(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                            const sl_store_params *p, sl_error *err) {
    sl_status st = store_init(s, n_layers, n_experts, err);
    if (st) return st;
    s->mode = p->mode;
    s->policy = p->policy;
    s->io_timeout_ms = p->io_timeout_ms ? p->io_timeout_ms : SL_IO_TIMEOUT_MS;
    if (s->io_timeout_ms < 0) s->io_timeout_ms = -1;
    if (!(s->bounce = aligned_alloc(SL_PACK_PAGE, SL_BOUNCE)))
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    return SL_OK;
}

/* The staging buffer of relayout layers: images of raw_bytes, as many as a fetch reads in one
 * round (the top-k a token needs; one at load in resident mode), the largest any layer needs. */
static sl_status stage_reserve(sl_expert_store *s, uint64_t raw_bytes, const sl_store_params *p,
                               sl_error *err) {
    const int32_t n = p->mode == SL_EXPERTS_STREAM ? SL_MAX(p->min_slots, 1) : 1;
    raw_bytes = align_up(raw_bytes, SL_PACK_PAGE);
    if (raw_bytes <= s->stage_bytes && n <= s->n_stage) return SL_OK;
    s->stage_bytes = SL_MAX(s->stage_bytes, raw_bytes);
    s->n_stage = SL_MAX(s->n_stage, n);
    free(s->stage);
    s->stage = aligned_alloc(SL_PACK_PAGE, (size_t)s->n_stage * s->stage_bytes);
    return s->stage ? SL_OK : sl_fail(err, SL_ERR_NOMEM, "out of memory for expert staging");
}

/* A files layer: extents copied, blob layout from the protos (each piece 64-byte aligned), then
 * every expert read (resident) or the slots made (stream). A relayout layer reads raw images
 * into the store's staging buffer and lays each out into its blob. */
static sl_status open_files_layer(sl_expert_store *s, int32_t l, const sl_expert_src *src,
                                  const sl_store_params *p, int32_t n_moe, sl_error *err) {
    sl_expert_layer *L = &s->layers[l];
    const int32_t E = s->n_experts;
    sl_status st = layer_init(L, E, err);
    if (st) return st;
    const size_t n_ext = (size_t)E * SL_EX_PARTS;
    if (!(L->ext = sl_calloc(n_ext, sizeof(sl_expert_extent), err))) return SL_ERR_NOMEM;
    if (src->ext) memcpy(L->ext, src->ext, n_ext * sizeof(sl_expert_extent));
    uint64_t blob = 0, big = 0;
    for (int m = 0; m < 3; m++) {
        const sl_tensor *t = &src->proto[m];
        const uint64_t sb = sl_tensor_scale_bytes(t);
        const uint64_t len[3] = {t->nbytes, t->scales ? sb : 0, t->biases ? sb : 0};
        L->proto[m] = *t;
        L->proto[m].data = L->proto[m].scales = L->proto[m].biases = NULL;
        for (int k = 0; k < 3; k++) {
            L->piece_off[3 * m + k] = blob;
            L->piece_len[3 * m + k] = len[k];
            if (len[k]) L->piece[L->n_pieces++] = 3 * m + k;
            blob = align_up(blob + len[k], 64);
            big = SL_MAX(big, len[k]);
        }
    }
    for (int m = 0; m < 3; m++) { /* the linear biases */
        const sl_tensor *t = &src->bias_proto[m];
        const uint64_t len =
            t->dtype != SL_DTYPE_NONE ? (uint64_t)t->shape[0] * sl_dtype_size(t->dtype) : 0;
        L->bias_proto[m] = *t;
        L->bias_proto[m].data = NULL;
        L->bias_proto[m].nbytes = (size_t)len;
        L->piece_off[SL_EX_GATE_LB + m] = blob;
        L->piece_len[SL_EX_GATE_LB + m] = len;
        if (len) L->piece[L->n_pieces++] = SL_EX_GATE_LB + m;
        blob = align_up(blob + len, 64);
    }
    const sl_expert_relayout *rl = src->relayout;
    if (rl) {
        /* the raw pieces replace the blob's as what is read */
        if (!(L->relayout = sl_alloc(sizeof *L->relayout, err)) ||
            !(L->raw_ext = sl_calloc((size_t)E * (size_t)rl->n_raw, sizeof(sl_expert_extent), err)))
            return SL_ERR_NOMEM;
        SL_ASSERT(rl->n_raw > 0 && rl->n_raw <= SL_RAW_MAX);
        *L->relayout = *rl;
        memcpy(L->raw_ext, rl->ext, (size_t)E * (size_t)rl->n_raw * sizeof(sl_expert_extent));
        L->relayout->ext = L->raw_ext;
        uint64_t off = 0;
        big = 0;
        for (int32_t i = 0; i < rl->n_raw; i++) {
            L->raw_off[i] = off;
            off = align_up(off + rl->raw_len[i], 64);
            big = SL_MAX(big, rl->raw_len[i]);
        }
        L->raw_bytes = off;
        for (size_t i = 0; i < (size_t)E * (size_t)rl->n_raw; i++)
            if (L->raw_ext[i].file < 0 || L->raw_ext[i].file >= s->n_files)
                return sl_fail(err, SL_ERR_ARG, "layer %d: expert %d: no such file", l,
                               (int)(i / (size_t)rl->n_raw));
    } else {
        for (size_t i = 0; i < n_ext; i++)
            if (L->piece_len[i % SL_EX_PARTS] &&
                (L->ext[i].file < 0 || L->ext[i].file >= s->n_files))
                return sl_fail(err, SL_ERR_ARG, "layer %d: expert %d: no such file", l,
                               (int)(i / SL_EX_PARTS));
    }
    blob = align_up(blob, SL_PACK_PAGE);
    L->hdr.blob_bytes = blob;
    L->path = strdup(s->paths[rl ? L->raw_ext[0].file : L->ext[0].file]);
    if (!L->path) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    const uint64_t want = p->read_part ? p->read_part : SL_READ_PART;
    L->n_parts = (int32_t)SL_MIN(SL_MAX((big + want - 1) / want, (uint64_t)1), SL_READ_MAX_PARTS);
    if (rl && (st = stage_reserve(s, L->raw_bytes, p, err))) return st;
    if (p->mode == SL_EXPERTS_STREAM) {
        if ((st = make_slots(L, blob, p, n_moe, err))) return st;
        return rl ? SL_OK : slot_io_init(L, err);
    }
    if (!(L->resident = expert_alloc((size_t)E * blob)))
        return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory for resident experts", L->path);
    for (int32_t e = 0; e < E; e++) {
        uint8_t *b = L->resident + (uint64_t)e * blob;
        blob_views(L, &L->views[e], b);
        const int32_t n = rl ? rl->n_raw : L->n_pieces;
        for (int32_t i = 0; i < n; i++) {
            const int k = rl ? i : L->piece[i];
            const sl_expert_extent *x =
                rl ? &L->raw_ext[(size_t)rl->n_raw * e + i] : &L->ext[SL_EX_PARTS * e + k];
            uint8_t *dst = rl ? s->stage + L->raw_off[i] : b + L->piece_off[k];
            const uint64_t len = rl ? rl->raw_len[i] : L->piece_len[k];
            int r = read_full(s->fds[x->file], dst, len, x->off, s->layers[l].align, s->bounce,
                              SL_BOUNCE, NULL);
            if (r)
                return sl_fail(err, SL_ERR_IO, "%s: layer %d, reading expert %d: %s",
                               s->paths[x->file], l, e,
                               r == SL_READ_SHORT ? "short read (file truncated?)" : strerror(r));
        }
        if (rl) relayout_blob(L, s->stage, &L->views[e]);
    }
    return SL_OK;
}

/* Stream mode's readers: the engine, and the pool (every engine's: n-gram rows, and the
 * threads engine's slot reads) with room for every slot's reads in its queue. */
static sl_status store_start_io(sl_expert_store *s, const sl_store_params *p, sl_error *err) {
    int64_t q = 0;
    for (int32_t l = 0; l < s->n_layers; l++)
        q += (int64_t)s->layers[l].slots.n_slots * s->layers[l].per;
    s->overlap = !p->no_overlap;
    s->engine = SL_IO_THREADS;
    sl_status st = pool_start(&s->pool, p->io_threads > 0 ? p->io_threads : 8, 3 * s->n_layers,
                              (int32_t)SL_MIN(q, INT32_MAX), err);
    if (st) return st;
    return uring_start(s, p, err);
}

sl_status sl_experts_open_files(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                                int32_t n_files, const char *const *paths, const sl_expert_src *src,
                                const sl_store_params *p, sl_error *err) {
    SL_ASSERT(p->mode == SL_EXPERTS_RESIDENT || p->mode == SL_EXPERTS_STREAM);
    sl_status st = store_open(s, n_layers, n_experts, p, err);
    if (st) return st;
    s->fds = sl_calloc((size_t)SL_MAX(n_files, 1), sizeof(int), err);
    s->paths = sl_calloc((size_t)SL_MAX(n_files, 1), sizeof(char *), err);
    if (!s->fds || !s->paths) return SL_ERR_NOMEM;
    const int direct = p->mode == SL_EXPERTS_STREAM && p->direct_io;
    for (int32_t i = 0; i < n_files; i++) {
        s->fds[s->n_files] = -1;
        if (!(s->paths[s->n_files] = strdup(paths[i])))
            return sl_fail(err, SL_ERR_NOMEM, "out of memory");
        s->n_files++;
        s->fds[i] = sl_open_regular(paths[i], O_RDONLY | (direct ? O_DIRECT : 0), NULL, err);
        if (s->fds[i] < 0) return SL_ERR_IO;
    }
    int32_t n_moe = 0;
    for (int32_t l = 0; l < n_layers; l++)
        n_moe += (src[l].ext || src[l].relayout) && n_experts > 0;
    for (int32_t l = 0, done = 0; !st && l < n_layers; l++) {
        if ((!src[l].ext && !src[l].relayout) || n_experts == 0) continue;
        s->layers[l].align = direct ? SL_PACK_PAGE : 0;
        st = open_files_layer(s, l, &src[l], p, n_moe, err);
        if (p->progress) p->progress(p->progress_user, "experts", ++done, n_moe);
    }
    if (!st && p->mode == SL_EXPERTS_STREAM) st = store_start_io(s, p, err);
    return st;
}

sl_status sl_experts_open_packed(sl_expert_store *s, const char *dir, int32_t n_layers,
                                 const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                                 int64_t inter, const sl_store_params *p, sl_error *err) {
    sl_status st = store_open(s, n_layers, n_experts, p, err);
    if (st) return st;
    int32_t n_moe = 0;
    for (int32_t l = 0; l < n_layers; l++)
        n_moe += layer_is_moe[l] && n_experts > 0;
    for (int32_t l = 0, done = 0; !st && l < n_layers; l++) {
        if (!layer_is_moe[l] || n_experts == 0) continue;
        st = open_layer(s, l, dir, hidden, inter, p, n_moe, err);
        if (p->progress) p->progress(p->progress_user, "experts", ++done, n_moe);
    }
    if (!st && p->mode == SL_EXPERTS_STREAM) st = store_start_io(s, p, err);
    return st;
}

void sl_experts_free(sl_expert_store *s) {
    if (!s) return;
    /* A read stuck past its timeout may still land in a layer's slots: they go with the pool,
     * freed when that read comes back (sl_reader_pool). */
    uring_free(s);
    const int stuck = s->pool && pool_quit(s->pool);
    for (int32_t l = 0; s->layers && l < s->n_layers; l++) {
        sl_expert_layer *L = &s->layers[l];
        if (stuck) { /* and the jobs and counts its thread writes when it is back */
            pool_adopt(s->pool, L->slot_mem);
            pool_adopt(s->pool, L->slot_jobs);
            pool_adopt(s->pool, L->sio);
            L->slot_mem = NULL;
            L->slot_jobs = NULL;
            L->sio = NULL;
        }
    }
    pool_free(s->pool);
    for (int32_t l = 0; s->layers && l < s->n_layers; l++) {
        sl_expert_layer *L = &s->layers[l];
        if (L->fd >= 0) close(L->fd);
        if (L->map) munmap(L->map, L->map_size);
        free(L->resident), free(L->views), free(L->hist), free(L->slot_mem), free(L->crc);
        free(L->verified), free(L->slot_views), free(L->path), free(L->shift), free(L->ext);
        free(L->relayout), free(L->raw_ext), free(L->slot_jobs), free(L->sio), free(L->req_slot);
        free(L->req_key), free(L->req_state), free(L->req_bad);
        sl_slot_cache_free(&L->slots);
    }
    for (int32_t i = 0; i < s->n_files; i++) {
        if (s->fds[i] >= 0) close(s->fds[i]);
        free(s->paths[i]);
    }
    free(s->fds), free(s->paths);
    free(s->layers), free(s->jobs), free(s->miss_slot), free(s->bounce), free(s->stage);
    memset(s, 0, sizeof *s);
}

/* -------------------------------------------------------------- fetch */

int sl_experts_cached(const sl_expert_store *s, int32_t layer, int32_t e) {
    const sl_expert_layer *L = &s->layers[layer];
    return L->slots.n_slots == 0 || sl_slot_lookup(&L->slots, e) >= 0;
}

int sl_experts_cached_ready(const sl_expert_store *s, int32_t layer, int32_t e) {
    const sl_expert_layer *L = &s->layers[layer];
    if (L->slots.n_slots == 0) return 1;
    const int32_t slot = sl_slot_lookup(&L->slots, e);
    return slot >= 0 && (!L->sio || L->sio[slot].state == SLOT_IDLE);
}

int32_t sl_experts_capacity(const sl_expert_store *s, int32_t layer) {
    const sl_expert_layer *L = &s->layers[layer];
    return L->slots.n_slots > 0 ? L->slots.n_slots : L->n_experts;
}

/* Mapped: the file must still cover the mapping (a page past a shrunk end raises SIGBUS: a
 * truncation between this fstat and the reads can still, a window of one step), and each blob
 * must match its checksum the first time it is fetched. */
static sl_status check_mapped(sl_expert_layer *L, int32_t layer, const int32_t *ids, int32_t n,
                              sl_error *err) {
    struct stat sb;
    if (fstat(L->fd, &sb) != 0)
        return sl_fail(err, SL_ERR_IO, "%s: fstat: %s", L->path, strerror(errno));
    if ((uint64_t)sb.st_size < L->map_size)
        return sl_fail(err, SL_ERR_IO,
                       "%s: layer %d: the file shrank from %zu to %lld bytes while mapped "
                       "(truncated, or rewritten in place rather than renamed): load the model "
                       "again",
                       L->path, layer, L->map_size, (long long)sb.st_size);
    for (int32_t i = 0; L->crc && i < n; i++) {
        const int32_t e = ids[i];
        if (__atomic_load_n(&L->verified[e], __ATOMIC_ACQUIRE)) continue;
        const uint8_t *blob =
            (const uint8_t *)L->map + L->hdr.data_offset + (uint64_t)e * L->hdr.blob_bytes;
        if (sl_crc32c(0, blob, (size_t)L->hdr.blob_bytes) != L->crc[e])
            return blob_mismatch(L, layer, e, "on first use", err);
        __atomic_store_n(&L->verified[e], 1, __ATOMIC_RELEASE);
    }
    return SL_OK;
}

/* The reads of expert e of a files layer into blob dst: each piece present in n_parts parts (the
 * last ones may be empty), n_pieces n_parts jobs at jobs. */
static void add_piece_jobs(const sl_expert_store *s, const sl_expert_layer *L, int32_t e,
                           uint8_t *dst, sl_read_job *jobs) {
    for (int32_t i = 0; i < L->n_pieces; i++) {
        const int p = L->piece[i];
        const sl_expert_extent *x = &L->ext[SL_EX_PARTS * e + p];
        const uint64_t len = L->piece_len[p];
        const uint64_t part = (len + (uint64_t)L->n_parts - 1) / (uint64_t)L->n_parts;
        for (int32_t k = 0; k < L->n_parts; k++) {
            const uint64_t off = SL_MIN((uint64_t)k * part, len);
            jobs[i * L->n_parts + k] = (sl_read_job){
                .fd = s->fds[x->file],
                .offset = x->off + off,
                .len = SL_MIN(part, len - off),
                .dst = dst + L->piece_off[p] + off,
                .align = L->align,
                .path = s->paths[x->file],
            };
        }
    }
}

/* The n_miss misses (slots miss_slot) of a relayout layer: their raw images read in rounds of
 * n_stage into the staging buffer, each piece in n_parts parts, then laid out into the slots. A
 * slot whose read failed is emptied, as in sl_experts_fetch. */
static sl_status fetch_relayout(sl_expert_store *s, sl_expert_layer *L, int32_t layer,
                                int32_t n_miss, sl_error *err) {
    const sl_expert_relayout *rl = L->relayout;
    sl_slot_cache *C = &L->slots;
    const int32_t per = rl->n_raw * L->n_parts;
    sl_status st = SL_OK;
    for (int32_t j0 = 0; j0 < n_miss; j0 += s->n_stage) {
        const int32_t nr = SL_MIN(s->n_stage, n_miss - j0);
        for (int32_t j = 0; j < nr; j++) {
            const int32_t e = C->slot_key[s->miss_slot[j0 + j]];
            uint8_t *img = s->stage + (uint64_t)j * s->stage_bytes;
            for (int32_t i = 0; i < rl->n_raw; i++) {
                const sl_expert_extent *x = &L->raw_ext[(size_t)rl->n_raw * e + i];
                const uint64_t len = rl->raw_len[i];
                const uint64_t part = (len + (uint64_t)L->n_parts - 1) / (uint64_t)L->n_parts;
                for (int32_t k = 0; k < L->n_parts; k++) {
                    const uint64_t off = SL_MIN((uint64_t)k * part, len);
                    s->jobs[j * per + i * L->n_parts + k] = (sl_read_job){
                        .fd = s->fds[x->file],
                        .offset = x->off + off,
                        .len = SL_MIN(part, len - off),
                        .dst = img + L->raw_off[i] + off,
                        .align = L->align,
                        .path = s->paths[x->file],
                    };
                }
            }
        }
        const double t0 = sl_now();
        sl_experts_read(s, s->jobs, nr * per);
        s->read_time += sl_now() - t0;
        for (int32_t j = 0; j < nr; j++) {
            const int32_t slot = s->miss_slot[j0 + j], e = C->slot_key[slot];
            const sl_read_job *bad = NULL;
            for (int32_t k = 0; k < per && !bad; k++)
                if (s->jobs[j * per + k].err) bad = &s->jobs[j * per + k];
            if (!bad) {
                relayout_blob(L, s->stage + (uint64_t)j * s->stage_bytes, &L->slot_views[slot]);
                for (int32_t i = 0; i < rl->n_raw; i++)
                    s->bytes_read += (int64_t)rl->raw_len[i];
                continue;
            }
            sl_slot_drop(C, slot);
            if (!st) {
                char why[256];
                st = sl_fail(err, sl_experts_read_status(bad->err),
                             "%s: layer %d, expert %d (%llu bytes at %llu): %s", bad->path, layer,
                             e, (unsigned long long)bad->len, (unsigned long long)bad->offset,
                             sl_experts_read_error(s, bad, why, sizeof why));
            }
        }
    }
    return st;
}

/* ------------------------------------------------------------ io_uring */

#ifdef SL_HAVE_URING
#include <liburing.h>

/* Most reads in the kernel at once, the ring's depth: every part of every miss and prefetch of
 * a step fits (top-8 x 4 parts x 2 layers is 64). */
#define SL_URING_DEPTH 256
/* A registered buffer's limit (the kernel's): layers' slots go in as chunks of this. */
#define SL_URING_BUF ((uint64_t)1 << 30)

/*
 * The io_uring engine: a slot's parts go into one ring, all of a step's reads in flight at once,
 * and come back in the calls that look at them (fetch_start, prefetch, ready, wait: this thread,
 * no reader threads), which check each part's CRC32C as it completes. The descriptors are
 * registered, and the slots as fixed buffers where the memory lock limit allows. Reads beyond
 * the ring's depth wait in a backlog; a short read goes on from where it stopped; a read past
 * its timeout is abandoned (its slot quarantined) and the engine stalls, as the threads do,
 * until its completion comes.
 */
struct sl_uring {
    struct io_uring ring;
    int32_t in_kernel; /* reads submitted, completion not yet seen */
    int32_t abandoned; /* of them, given up on */
    const char *stalled;
    int files; /* descriptors registered: fixed[fd] is the index */
    int32_t *fixed, n_fixed_fd;
    int bufs;          /* slots registered as fixed buffers */
    int buf_errno;     /* why not (0: not tried or done) */
    int32_t *buf_base; /* [n_layers] the index of a layer's first chunk, -1: none */
    sl_read_job **backlog;
    int64_t b_head, b_tail;
    int32_t b_cap;
};

static int unaligned(const sl_read_job *j) {
    const uint64_t off = j->offset + j->done, len = j->len - j->done;
    return j->align &&
           ((uintptr_t)(j->dst + j->done) % j->align || off % j->align || len % j->align);
}

/* Finishes job on this thread (what io_uring cannot read: O_DIRECT from an unaligned point),
 * with the store's bounce buffer. */
static void uring_finish_sync(sl_expert_store *s, sl_read_job *j) {
    j->err = read_full(j->fd, j->dst + j->done, j->len - j->done, j->offset + j->done, j->align,
                       s->bounce, SL_BOUNCE, NULL);
    if (!j->err && j->sum) j->crc = sl_crc32c(0, j->dst, (size_t)j->len);
    (*j->pending)--;
}

/* The backlog into the ring, as far as it has room, then one submit. */
static void uring_flush(sl_expert_store *s) {
    struct sl_uring *u = s->uring;
    int queued = 0;
    while (u->b_head < u->b_tail && u->in_kernel < SL_URING_DEPTH) {
        sl_read_job *j = u->backlog[u->b_head % u->b_cap];
        if (j->cancel) { /* given up on before it was submitted */
            u->b_head++;
            j->err = SL_READ_TIMEOUT;
            (*j->pending)--;
            continue;
        }
        if (unaligned(j)) {
            u->b_head++;
            uring_finish_sync(s, j);
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) break;
        u->b_head++;
        uint8_t *dst = j->dst + j->done;
        const unsigned len = (unsigned)SL_MIN(j->len - j->done, (uint64_t)1 << 30);
        const uint64_t off = j->offset + j->done;
        int buf = -1;
        for (int32_t l = 0; u->bufs && l < s->n_layers && buf < 0; l++) {
            const sl_expert_layer *L = &s->layers[l];
            if (u->buf_base[l] < 0 || dst < L->slot_mem) continue;
            const uint64_t at = (uint64_t)(dst - L->slot_mem);
            if (at >= (uint64_t)L->slots.n_slots * L->hdr.blob_bytes) continue;
            if (at / SL_URING_BUF == (at + len - 1) / SL_URING_BUF)
                buf = u->buf_base[l] + (int)(at / SL_URING_BUF);
            else
                break; /* straddles two chunks: a plain read */
        }
        const int fixed_fd = u->files && j->fd < u->n_fixed_fd ? u->fixed[j->fd] : -1;
        const int fd = fixed_fd >= 0 ? fixed_fd : j->fd;
        if (buf >= 0)
            io_uring_prep_read_fixed(sqe, fd, dst, len, off, buf);
        else
            io_uring_prep_read(sqe, fd, dst, len, off);
        if (fixed_fd >= 0) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data(sqe, j);
        j->running = 1;
        u->in_kernel++;
        queued++;
    }
    if (queued) io_uring_submit(&u->ring);
}

static void uring_push(struct sl_uring *u, sl_read_job *j) {
    SL_ASSERT(u->b_tail - u->b_head < u->b_cap);
    u->backlog[u->b_tail++ % u->b_cap] = j;
}

/* One completion: an abandoned read's end, a short read going on, or the part's result (its
 * sum computed here, while the bytes are fresh). */
static void uring_complete(sl_expert_store *s, sl_read_job *j, int res) {
    struct sl_uring *u = s->uring;
    u->in_kernel--;
    j->running = 0;
    if (j->abandoned) {
        if (--u->abandoned == 0) u->stalled = NULL;
        j->err = SL_READ_TIMEOUT;
        (*j->pending)--;
        return;
    }
    if (res == -EINTR || res == -EAGAIN) {
        uring_push(u, j);
        return;
    }
    if (res <= 0) {
        j->err = res < 0 ? -res : SL_READ_SHORT;
        (*j->pending)--;
        return;
    }
    j->done += (uint64_t)res;
    if (j->done < j->len) { /* short: the rest (sl_read_full's retries) */
        uring_push(u, j);
        return;
    }
    j->err = 0;
    if (j->sum) j->crc = sl_crc32c(0, j->dst, (size_t)j->len);
    (*j->pending)--;
}

/* Every completion there is; block: wait for one first. Then the backlog goes in. */
static void uring_reap(sl_expert_store *s, int block) {
    struct sl_uring *u = s->uring;
    if (!u) return;
    struct io_uring_cqe *cqe;
    if (block && u->in_kernel > 0) (void)io_uring_wait_cqe(&u->ring, &cqe);
    unsigned head, n = 0;
    io_uring_for_each_cqe(&u->ring, head, cqe) {
        n++;
        /* the timeout liburing submits for a wait on kernels without IORING_FEAT_EXT_ARG */
        if (cqe->user_data == LIBURING_UDATA_TIMEOUT) continue;
        uring_complete(s, (sl_read_job *)io_uring_cqe_get_data(cqe), cqe->res);
    }
    io_uring_cq_advance(&u->ring, n);
    uring_flush(s);
}

static void uring_submit(sl_expert_store *s, sl_read_job *const *jobs, int32_t n) {
    struct sl_uring *u = s->uring;
    for (int32_t i = 0; i < n; i++) {
        sl_read_job *j = jobs[i];
        j->cancel = j->abandoned = j->running = 0;
        j->done = 0;
        j->err = SL_READ_PENDING;
        (*j->pending)++;
        uring_push(u, j);
    }
    uring_flush(s);
}

static int uring_wait(sl_expert_store *s, int32_t *pending, sl_read_job *jobs, int32_t n,
                      double deadline) {
    struct sl_uring *u = s->uring;
    uring_reap(s, 0);
    while (*pending > 0) {
        const double left = deadline < 0 ? 1.0 : deadline - sl_now();
        if (left <= 0) break;
        struct __kernel_timespec ts = {.tv_sec = (long long)left,
                                       .tv_nsec =
                                           (long long)((left - (double)(long long)left) * 1e9)};
        struct io_uring_cqe *cqe;
        (void)io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
        uring_reap(s, 0);
    }
    if (*pending == 0) return 0;
    give_up(jobs, n, &u->abandoned, &u->stalled); /* past the deadline */
    uring_flush(s);
    return 1;
}

static int uring_stalled(sl_expert_store *s) {
    uring_reap(s, 0);
    return s->uring->abandoned > 0;
}

static void uring_desc(const sl_expert_store *s, char *buf, size_t cap) {
    const struct sl_uring *u = s->uring;
    if (u->bufs)
        snprintf(buf, cap, "io_uring (depth %d, %sregistered buffers)", SL_URING_DEPTH,
                 u->files ? "registered files, " : "");
    else
        snprintf(buf, cap, "io_uring (depth %d, %sbuffers not registered: %s%s)", SL_URING_DEPTH,
                 u->files ? "registered files, " : "",
                 u->buf_errno ? strerror(u->buf_errno) : "none",
                 u->buf_errno == ENOMEM || u->buf_errno == EPERM ? ", RLIMIT_MEMLOCK?" : "");
}

static sl_status uring_start(sl_expert_store *s, const sl_store_params *p, sl_error *err) {
    const int want = p->io_engine == SL_IO_URING || (p->io_engine == SL_IO_AUTO && p->direct_io);
    if (!want) return SL_OK;
    struct sl_uring *u = sl_calloc(1, sizeof *u, err);
    if (!u) return SL_ERR_NOMEM;
    int r = io_uring_queue_init(SL_URING_DEPTH, &u->ring, 0);
    if (r < 0) {
        free(u);
        if (p->io_engine == SL_IO_AUTO) return SL_OK; /* the threads, then */
        return sl_fail(err, SL_ERR_IO, "--io-engine uring: io_uring_queue_init: %s", strerror(-r));
    }
    s->uring = u;
    s->engine = SL_IO_URING;
    int64_t q = 0;
    for (int32_t l = 0; l < s->n_layers; l++)
        q += (int64_t)s->layers[l].slots.n_slots * s->layers[l].per;
    u->b_cap = (int32_t)SL_MAX(SL_MIN(q, INT32_MAX), 1);
    u->backlog = sl_calloc((size_t)u->b_cap, sizeof(sl_read_job *), err);
    u->buf_base = sl_calloc((size_t)SL_MAX(s->n_layers, 1), sizeof(int32_t), err);
    if (!u->backlog || !u->buf_base) return SL_ERR_NOMEM;
    /* the descriptors: the layers' and the files' */
    int fds[4096], n_fds = 0, max_fd = -1;
    for (int32_t l = 0; l < s->n_layers && n_fds < 4096; l++)
        if (s->layers[l].fd >= 0 && s->layers[l].sio) fds[n_fds++] = s->layers[l].fd;
    for (int32_t i = 0; i < s->n_files && n_fds < 4096; i++)
        if (s->fds[i] >= 0) fds[n_fds++] = s->fds[i];
    for (int i = 0; i < n_fds; i++)
        max_fd = SL_MAX(max_fd, fds[i]);
    if (n_fds && (u->fixed = sl_calloc((size_t)max_fd + 1, sizeof(int32_t), err))) {
        for (int i = 0; i <= max_fd; i++)
            u->fixed[i] = -1;
        for (int i = 0; i < n_fds; i++)
            u->fixed[fds[i]] = i;
        u->n_fixed_fd = max_fd + 1;
        u->files = io_uring_register_files(&u->ring, fds, (unsigned)n_fds) == 0;
    }
    /* the slots, in chunks of at most SL_URING_BUF */
    int32_t n_iov = 0;
    for (int32_t l = 0; l < s->n_layers; l++) {
        const sl_expert_layer *L = &s->layers[l];
        const uint64_t bytes = L->sio ? (uint64_t)L->slots.n_slots * L->hdr.blob_bytes : 0;
        n_iov += (int32_t)((bytes + SL_URING_BUF - 1) / SL_URING_BUF);
    }
    struct iovec *iov = n_iov ? sl_calloc((size_t)n_iov, sizeof *iov, err) : NULL;
    n_iov = 0;
    for (int32_t l = 0; iov && l < s->n_layers; l++) {
        const sl_expert_layer *L = &s->layers[l];
        const uint64_t bytes = L->sio ? (uint64_t)L->slots.n_slots * L->hdr.blob_bytes : 0;
        u->buf_base[l] = bytes ? n_iov : -1;
        for (uint64_t at = 0; at < bytes; at += SL_URING_BUF)
            iov[n_iov++] =
                (struct iovec){L->slot_mem + at, (size_t)SL_MIN(SL_URING_BUF, bytes - at)};
    }
    if (iov && !p->uring_plain) {
        r = io_uring_register_buffers(&u->ring, iov, (unsigned)n_iov);
        u->bufs = r == 0;
        u->buf_errno = r < 0 ? -r : 0;
    }
    free(iov);
    return SL_OK;
}

/* Reads still in the kernel when the store goes: a short wait, then their memory is left to
 * them (never freed) rather than written after being reused. */
static void uring_free(sl_expert_store *s) {
    struct sl_uring *u = s->uring;
    if (!u) return;
    const double until = sl_now() + 0.05;
    while (u->in_kernel > u->abandoned && sl_now() < until) {
        struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 5000000};
        struct io_uring_cqe *cqe;
        (void)io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
        uring_reap(s, 0);
    }
    if (u->in_kernel > 0)
        for (int32_t l = 0; l < s->n_layers; l++) { /* leaked on purpose */
            s->layers[l].slot_mem = NULL;
            s->layers[l].slot_jobs = NULL;
            s->layers[l].sio = NULL;
        }
    io_uring_queue_exit(&u->ring);
    free(u->backlog), free(u->buf_base), free(u->fixed), free(u);
    s->uring = NULL;
}
#else
struct sl_uring {
    int unused;
};
static sl_status uring_start(sl_expert_store *s, const sl_store_params *p, sl_error *err) {
    if (p->io_engine == SL_IO_URING)
        return sl_fail(err, SL_ERR_ARG,
                       "--io-engine uring: this build has no io_uring "
                       "(liburing was missing when it was built)");
    (void)s;
    return SL_OK;
}
static void uring_free(sl_expert_store *s) {
    (void)s;
}
static void uring_desc(const sl_expert_store *s, char *buf, size_t cap) {
    (void)s;
    snprintf(buf, cap, "io_uring");
}
static void uring_submit(sl_expert_store *s, sl_read_job *const *jobs, int32_t n) {
    (void)s, (void)jobs, (void)n;
}
static int uring_wait(sl_expert_store *s, int32_t *pending, sl_read_job *jobs, int32_t n,
                      double deadline) {
    (void)s, (void)pending, (void)jobs, (void)n, (void)deadline;
    return 0;
}
static void uring_reap(sl_expert_store *s, int block) {
    (void)s, (void)block;
}
static int uring_stalled(sl_expert_store *s) {
    (void)s;
    return 0;
}
#endif

const char *sl_experts_engine_desc(const sl_expert_store *s, char *buf, size_t cap) {
    if (!s->pool)
        snprintf(buf, cap, "none");
    else if (s->engine == SL_IO_URING)
        uring_desc(s, buf, cap);
    else
        snprintf(buf, cap, "threads (%d readers)", s->pool->n_threads);
    return buf;
}

/* ------------------------------------------------------ asynchronous */

/* The engine under the slots' reads: the pool's threads, or io_uring (uring_*). */
static void io_submit(sl_expert_store *s, sl_read_job *const *jobs, int32_t n) {
    if (n <= 0) return;
    if (s->engine == SL_IO_URING)
        uring_submit(s, jobs, n);
    else
        pool_submit(s->pool, jobs, n);
}

static int io_wait(sl_expert_store *s, sl_expert_layer *L, int32_t slot, double deadline) {
    sl_read_job *jobs = &L->slot_jobs[(size_t)slot * (size_t)L->per];
    if (s->engine == SL_IO_URING)
        return uring_wait(s, &L->sio[slot].pending, jobs, L->per, deadline);
    return pool_wait(s->pool, &L->sio[slot].pending, jobs, L->per, deadline);
}

/* Reads of slot still out; io_uring first reaps what has come back, without waiting. */
static int32_t io_pending(sl_expert_store *s, sl_expert_layer *L, int32_t slot) {
    if (s->engine == SL_IO_URING) {
        uring_reap(s, 0);
        return L->sio[slot].pending;
    }
    return pool_pending(s->pool, &L->sio[slot].pending);
}

static int io_stalled(sl_expert_store *s) {
    return pool_stalled(s->pool) || (s->engine == SL_IO_URING && uring_stalled(s));
}

/* A blob's reads into slot (its jobs, L->per of them): a pack's parts, or each piece's parts. */
static void slot_jobs_fill(sl_expert_store *s, sl_expert_layer *L, int32_t slot, int32_t e) {
    sl_read_job *jobs = &L->slot_jobs[(size_t)slot * (size_t)L->per];
    uint8_t *dst = L->slot_mem + (uint64_t)slot * L->hdr.blob_bytes;
    int32_t *pending = &L->sio[slot].pending;
    if (L->ext) {
        add_piece_jobs(s, L, e, dst, jobs);
    } else {
        const uint64_t at = L->hdr.data_offset + (uint64_t)e * L->hdr.blob_bytes;
        for (int32_t k = 0; k < L->n_parts; k++) {
            const uint64_t off = (uint64_t)k * L->part_bytes;
            jobs[k] = (sl_read_job){
                .fd = L->fd,
                .offset = at + off,
                .len = k < L->n_parts - 1 ? L->part_bytes : L->hdr.blob_bytes - off,
                .dst = dst + off,
                .align = L->align,
                .sum = L->crc != NULL,
                .path = L->path,
            };
        }
    }
    for (int32_t k = 0; k < L->per; k++)
        jobs[k].pending = pending;
}

/* Starts slot's read of expert e (its key already inserted): the jobs go to *batch. */
static void slot_issue(sl_expert_store *s, sl_expert_layer *L, int32_t slot, int32_t e,
                       int prefetched, int32_t item, sl_read_job **batch, int32_t *n_batch) {
    slot_jobs_fill(s, L, slot, e);
    sl_slot_io *io = &L->sio[slot];
    io->state = SLOT_FLIGHT;
    io->prefetched = (int8_t)prefetched;
    io->item = item;
    io->deadline = s->io_timeout_ms < 0 ? -1.0 : sl_now() + 1e-3 * s->io_timeout_ms;
    for (int32_t k = 0; k < L->per; k++)
        batch[(*n_batch)++] = &L->slot_jobs[(size_t)slot * (size_t)L->per + k];
}

/* A slot whose reads are all back: its parts' errors and sums judged. Ready, it counts its
 * bytes; failed, it is emptied (nothing ever computes on its bytes; the next fetch of the
 * expert reads it again) and, serving an item, the item fails with what failed. */
static void slot_settle(sl_expert_store *s, sl_expert_layer *L, int32_t slot) {
    sl_slot_io *io = &L->sio[slot];
    if (io->state == SLOT_QUARANTINE) { /* abandoned: already emptied and reported */
        io->state = SLOT_IDLE;
        return;
    }
    io->state = SLOT_IDLE;
    const int32_t e = L->slots.slot_key[slot];
    const sl_read_job *part = &L->slot_jobs[(size_t)slot * (size_t)L->per];
    sl_read_job blob = {.offset = part->offset, .len = L->hdr.blob_bytes, .crc = part->crc};
    for (int32_t k = 0; k < L->per && !blob.err; k++)
        if ((blob.err = part[k].err)) blob.offset = part[k].offset, blob.path = part[k].path;
    if (L->ext)
        for (int p = blob.len = 0; p < SL_EX_PARTS; p++)
            blob.len += L->piece_len[p];
    for (int32_t k = 1; k < L->n_parts && !blob.err && L->crc; k++)
        blob.crc = sl_crc32c_combine(&L->shift[k], blob.crc, part[k].crc);
    if (!blob.err && L->crc && e >= 0 && blob.crc != L->crc[e]) blob.err = SL_READ_CRC;
    if (!blob.err) {
        s->bytes_read += (int64_t)blob.len;
        if (io->item >= 0) L->req_state[io->item] = 1;
        return;
    }
    sl_slot_drop(&L->slots, slot);
    io->prefetched = 0;
    if (io->item >= 0) {
        L->req_state[io->item] = 2;
        L->req_bad[io->item] = blob;
        if (!blob.path) L->req_bad[io->item].path = L->path;
    }
}

/* Settles every slot of the layer whose reads are back (none waited for). */
static void layer_sweep(sl_expert_store *s, sl_expert_layer *L) {
    if (s->engine == SL_IO_URING) uring_reap(s, 0);
    for (int32_t i = 0; i < L->slots.n_slots; i++)
        if (L->sio[i].state != SLOT_IDLE && io_pending(s, L, i) == 0) slot_settle(s, L, i);
}

/* The error of item i (failed) of the layer's last start. */
static sl_status item_error(sl_expert_store *s, sl_expert_layer *L, int32_t layer, int32_t i,
                            sl_error *err) {
    const sl_read_job *b = &L->req_bad[i];
    char why[256];
    return sl_fail(err, sl_experts_read_status(b->err),
                   "%s: layer %d, expert %d (%llu bytes at %llu): %s", b->path ? b->path : L->path,
                   layer, L->req_key[i], (unsigned long long)b->len, (unsigned long long)b->offset,
                   sl_experts_read_error(s, b, why, sizeof why));
}

static sl_status stalled_error(sl_expert_store *s, const sl_expert_layer *L, int32_t layer,
                               sl_error *err) {
    char why[256];
    const sl_read_job j = {.err = SL_READ_STALLED};
    return sl_fail(err, SL_ERR_TIMEOUT, "%s: layer %d: %s", L->path, layer,
                   sl_experts_read_error(s, &j, why, sizeof why));
}

/* Waits for slot's reads, at most until its deadline; late, its reads are given up on: the slot
 * is emptied and kept out of use (quarantined) until they are back. Returns 1 then. */
static int slot_wait(sl_expert_store *s, sl_expert_layer *L, int32_t slot) {
    sl_slot_io *io = &L->sio[slot];
    if (io->state == SLOT_IDLE) return 0;
    const double t0 = sl_now();
    const int late = io_wait(s, L, slot, io->deadline);
    s->read_time += sl_now() - t0;
    if (!late) {
        slot_settle(s, L, slot);
        return 0;
    }
    if (io->item >= 0) {
        L->req_state[io->item] = 2;
        L->req_bad[io->item] = (sl_read_job){
            .err = SL_READ_TIMEOUT,
            .path = L->slot_jobs[(size_t)slot * (size_t)L->per].path,
            .offset = L->slot_jobs[(size_t)slot * (size_t)L->per].offset,
            .len = L->hdr.blob_bytes,
        };
    }
    sl_slot_drop(&L->slots, slot);
    io->prefetched = 0;
    io->state = io_pending(s, L, slot) ? SLOT_QUARANTINE : SLOT_IDLE;
    return 1;
}

sl_status sl_experts_fetch_start(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                                 const sl_expert **out, sl_error *err) {
    SL_ASSERT(layer >= 0 && layer < s->n_layers);
    sl_expert_layer *L = &s->layers[layer];
    SL_ASSERT(L->n_experts > 0 && n <= sl_experts_capacity(s, layer));
    sl_slot_cache *C = &L->slots;
    if (!C->n_slots) {
        sl_status st = L->map ? check_mapped(L, layer, ids, n, err) : SL_OK;
        if (st) return st;
        s->requests += n;
        s->hits += n;
        for (int32_t i = 0; i < n; i++)
            out[i] = &L->views[ids[i]];
        return SL_OK;
    }
    if (L->sio) {
        /* the previous request's items are done with; what has come back is settled */
        for (int32_t i = 0; i < L->req_n; i++)
            if (L->sio[L->req_slot[i]].item == i) L->sio[L->req_slot[i]].item = -1;
        L->req_n = 0;
        layer_sweep(s, L);
    }
    /* Reads stalled past the timeout: fail before touching the cache, naming the file. */
    int32_t n_miss = 0;
    for (int32_t i = 0; i < n; i++)
        n_miss += sl_slot_lookup(C, ids[i]) < 0;
    if (n_miss && io_stalled(s)) return stalled_error(s, L, layer, err);
    s->requests += n;
    sl_slot_begin(C);
    /* Pin every slot already holding a requested expert, then place the misses. */
    for (int32_t i = 0; i < n; i++) {
        const int32_t slot = sl_slot_lookup(C, ids[i]);
        if (slot >= 0) sl_slot_pin(C, slot);
    }
    if (!L->sio) { /* relayout: read here, through the staging buffer */
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            int32_t slot = sl_slot_lookup(C, ids[i]);
            if (slot >= 0) {
                s->hits++;
                sl_slot_use(C, slot);
            } else {
                slot = sl_slot_victim(C);
                SL_ASSERT(slot >= 0);
                sl_slot_insert(C, slot, ids[i]);
                s->miss_slot[m++] = slot;
            }
            out[i] = &L->slot_views[slot];
        }
        return m ? fetch_relayout(s, L, layer, m, err) : SL_OK;
    }
    /* Slots whose reads are out (prefetches of experts not asked for) cannot take a miss: when
     * too few others are free, wait for some of those to come back. */
    int32_t free_slots = 0;
    for (int32_t i = 0; i < C->n_slots; i++)
        free_slots += C->pin[i] != C->tick && L->sio[i].state == SLOT_IDLE;
    for (int32_t i = 0; i < C->n_slots && free_slots < n_miss; i++) {
        if (C->pin[i] == C->tick || L->sio[i].state == SLOT_IDLE) continue;
        if (slot_wait(s, L, i)) return stalled_error(s, L, layer, err);
        free_slots++;
    }
    for (int32_t i = 0; i < C->n_slots; i++)
        if (L->sio[i].state != SLOT_IDLE) sl_slot_pin(C, i);
    sl_read_job **batch = (sl_read_job **)s->jobs; /* scratch: a fetch's job pointers */
    int32_t n_batch = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        int32_t slot = sl_slot_lookup(C, e);
        sl_slot_io *io = NULL;
        L->req_key[i] = e;
        if (slot >= 0) {
            io = &L->sio[slot];
            if (io->prefetched) {
                /* a prefetch's: from now on as if this fetch had inserted it */
                io->prefetched = 0;
                s->prefetch_used++;
                s->prefetch_used_bytes += (int64_t)L->hdr.blob_bytes;
                sl_slot_insert(C, slot, e);
            } else {
                s->hits++;
                sl_slot_use(C, slot);
            }
        } else {
            slot = sl_slot_victim(C);
            SL_ASSERT(slot >= 0);
            sl_slot_insert(C, slot, e);
            slot_issue(s, L, slot, e, 0, i, batch, &n_batch);
            io = &L->sio[slot];
        }
        io->item = i;
        L->req_slot[i] = slot;
        L->req_state[i] = io->state == SLOT_IDLE ? 1 : 0;
        out[i] = &L->slot_views[slot];
    }
    L->req_n = n;
    io_submit(s, batch, n_batch);
    return SL_OK;
}

int sl_experts_fetch_ready(sl_expert_store *s, int32_t layer, int32_t i) {
    sl_expert_layer *L = &s->layers[layer];
    if (!L->sio || L->req_state[i]) return 1;
    const int32_t slot = L->req_slot[i];
    if (io_pending(s, L, slot)) return 0;
    slot_settle(s, L, slot);
    return 1;
}

sl_status sl_experts_fetch_wait(sl_expert_store *s, int32_t layer, int32_t i, sl_error *err) {
    sl_expert_layer *L = &s->layers[layer];
    if (!L->sio) return SL_OK; /* nothing streamed, or read at start (relayout) */
    SL_ASSERT(i >= 0 && i < L->req_n);
    if (L->req_state[i] == 0) slot_wait(s, L, L->req_slot[i]);
    SL_ASSERT(L->req_state[i] != 0);
    return L->req_state[i] == 1 ? SL_OK : item_error(s, L, layer, i, err);
}

sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err) {
    sl_status st = sl_experts_fetch_start(s, layer, ids, n, out, err);
    sl_expert_layer *L = &s->layers[layer];
    if (st || !L->sio) return st;
    /* every item waited for, even after a failure (each failed slot is emptied now); the
     * first failure in request order reported */
    for (int32_t i = 0; i < n; i++) {
        if (L->req_state[i] == 0) slot_wait(s, L, L->req_slot[i]);
        if (!st && L->req_state[i] == 2) st = item_error(s, L, layer, i, err);
    }
    return st;
}

int32_t sl_experts_prefetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n) {
    SL_ASSERT(layer >= 0 && layer < s->n_layers);
    sl_expert_layer *L = &s->layers[layer];
    sl_slot_cache *C = &L->slots;
    if (!C->n_slots || !L->sio || io_stalled(s)) return 0;
    layer_sweep(s, L);
    /* slots in flight keep their reads: pinned for the rest of this request's time */
    for (int32_t i = 0; i < C->n_slots; i++)
        if (L->sio[i].state != SLOT_IDLE) sl_slot_pin(C, i);
    sl_read_job **batch = (sl_read_job **)s->jobs;
    int32_t n_batch = 0, started = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        SL_ASSERT(e >= 0 && e < L->n_experts);
        if (sl_slot_lookup(C, e) >= 0) continue;
        const int32_t slot = sl_slot_victim(C);
        if (slot < 0) break;
        sl_slot_insert(C, slot, e);
        slot_issue(s, L, slot, e, 1, -1, batch, &n_batch);
        s->prefetch_reads++;
        s->prefetch_bytes += (int64_t)L->hdr.blob_bytes;
        started++;
    }
    io_submit(s, batch, n_batch);
    return started;
}
