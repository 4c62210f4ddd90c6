/* Expert store: HF views, packed mapped/resident/stream, the slot cache and the reader pool. */
#include "moe/experts.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ binding */

/* One HF layer: fused tensors if the checkpoint has them, else one set per expert. */
static sl_status bind_hf_layer(sl_expert *ex, const sl_ckpt *ck, int32_t l, int32_t E, int64_t H,
                               int64_t I, sl_error *err) {
    sl_status st;
    char name[160];
    snprintf(name, sizeof name, "layers.%d.mlp.experts.gate_up_proj", l);
    if (sl_ckpt_find(ck, name)) {
        sl_tensor gu, down;
        if ((st = sl_ckpt_bind(ck, &gu, SL_BIND_REQUIRED, SL_DIMS(E, 2 * I, H), err, "%s", name)) ||
            (st = sl_ckpt_bind(ck, &down, SL_BIND_REQUIRED, SL_DIMS(E, H, I), err,
                               "layers.%d.mlp.experts.down_proj", l)))
            return st;
        for (int32_t e = 0; e < E; e++) {
            sl_tensor m = sl_tensor_slice(&gu, e);
            ex[e].gate = sl_tensor_rows(&m, 0, I);
            ex[e].up = sl_tensor_rows(&m, I, I);
            ex[e].down = sl_tensor_slice(&down, e);
        }
        return SL_OK;
    }
    for (int32_t e = 0; e < E; e++) {
        const char *fmt = "layers.%d.mlp.experts.%d.%s.weight";
        if ((st = sl_ckpt_bind(ck, &ex[e].gate, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, e,
                               "gate_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].up, SL_BIND_REQUIRED, SL_DIMS(I, H), err, fmt, l, e,
                               "up_proj")) ||
            (st = sl_ckpt_bind(ck, &ex[e].down, SL_BIND_REQUIRED, SL_DIMS(H, I), err, fmt, l, e,
                               "down_proj")))
            return st;
    }
    return SL_OK;
}

static sl_status store_init(sl_expert_store *s, int32_t n_layers, int32_t n_experts,
                            sl_error *err) {
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers;
    s->n_experts = n_experts;
    s->layers = sl_calloc((size_t)n_layers, sizeof(sl_expert_layer), err);
    s->jobs = sl_calloc((size_t)SL_MAX(n_experts, 1), sizeof(sl_read_job), err);
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

sl_status sl_experts_bind_hf(sl_expert_store *s, const sl_ckpt *ck, int32_t n_layers,
                             const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                             int64_t inter, sl_error *err) {
    sl_status st = store_init(s, n_layers, n_experts, err);
    s->mode = SL_EXPERTS_MAPPED;
    for (int32_t l = 0; !st && l < n_layers; l++) {
        if (!layer_is_moe[l] || n_experts == 0) continue;
        if (!(st = layer_init(&s->layers[l], n_experts, err)))
            st = bind_hf_layer(s->layers[l].views, ck, l, n_experts, hidden, inter, err);
    }
    return st;
}

/* ------------------------------------------------------------ reading */

/* Reads exactly len bytes at offset; 0, an errno, or -1 for a short read. */
static int read_full(int fd, uint8_t *dst, uint64_t len, uint64_t offset) {
    while (len > 0) {
        ssize_t r = pread(fd, dst, (size_t)SL_MIN(len, (uint64_t)1 << 30), (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno ? errno : EIO;
        if (r == 0) return -1;
        dst += r;
        len -= (uint64_t)r;
        offset += (uint64_t)r;
    }
    return 0;
}

static void *reader_main(void *arg) {
    sl_reader_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && (p->generation == seen || p->next >= p->n_jobs))
            pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        while (p->next < p->n_jobs) {
            sl_read_job *j = &p->jobs[p->next++];
            pthread_mutex_unlock(&p->mu);
            j->err = read_full(j->fd, j->dst, j->len, j->offset);
            pthread_mutex_lock(&p->mu);
            if (++p->finished == p->n_jobs) pthread_cond_signal(&p->done);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static sl_status pool_start(sl_reader_pool *p, int32_t n, sl_error *err) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = sl_calloc((size_t)n, sizeof(pthread_t), err);
    if (!p->threads) return SL_ERR_NOMEM;
    for (int32_t i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, reader_main, p) != 0)
            return sl_fail(err, SL_ERR_NOMEM, "cannot start reader threads");
        p->n_threads++;
    }
    return SL_OK;
}

static void pool_stop(sl_reader_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
}

/* Runs n reads in parallel and waits for all of them. */
static void pool_run(sl_reader_pool *p, sl_read_job *jobs, int32_t n) {
    if (n == 1 || p->n_threads == 0) {
        for (int32_t i = 0; i < n; i++)
            jobs[i].err = read_full(jobs[i].fd, jobs[i].dst, jobs[i].len, jobs[i].offset);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->jobs = jobs;
    p->n_jobs = n;
    p->next = 0;
    p->finished = 0;
    p->generation++;
    pthread_cond_broadcast(&p->work);
    while (p->finished < n)
        pthread_cond_wait(&p->done, &p->mu);
    p->n_jobs = 0;
    pthread_mutex_unlock(&p->mu);
}

void sl_experts_read(sl_expert_store *s, sl_read_job *jobs, int32_t n) {
    pool_run(&s->pool, jobs, n); /* serial when the pool is not started */
}

/* ------------------------------------------------------- packed layers */

static void set_views(sl_expert *v, const sl_experts_header *h, const uint8_t *blob) {
    v->gate = sl_expert_matrix(h, blob, 0);
    v->up = sl_expert_matrix(h, blob, 1);
    v->down = sl_expert_matrix(h, blob, 2);
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

static sl_status open_layer(sl_expert_store *s, int32_t l, const char *dir, int64_t H, int64_t I,
                            const sl_store_params *p, int32_t n_moe, sl_error *err) {
    sl_expert_layer *L = &s->layers[l];
    char path[4096];
    snprintf(path, sizeof path, "%s/experts-%03d.bin", dir, l);
    if (!(L->path = strdup(path))) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    int flags = O_RDONLY | O_CLOEXEC;
    if (p->mode == SL_EXPERTS_STREAM && p->direct_io) flags |= O_DIRECT;
    L->fd = open(path, flags);
    if (L->fd < 0)
        return sl_fail(err, SL_ERR_IO, "%s: %s%s", path, strerror(errno),
                       errno == EINVAL ? " (O_DIRECT unsupported on this filesystem?)" : "");
    struct stat sb;
    uint8_t *hb = aligned_alloc(SL_PACK_PAGE, SL_EXPERTS_HEADER);
    if (!hb) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    int rerr = fstat(L->fd, &sb) != 0 ? errno : read_full(L->fd, hb, SL_EXPERTS_HEADER, 0);
    sl_status st = SL_OK;
    if (rerr)
        st = sl_fail(err, rerr == -1 ? SL_ERR_FORMAT : SL_ERR_IO, "%s: cannot read the header%s",
                     path, rerr == -1 ? " (file truncated)" : "");
    else
        st = sl_experts_header_parse(&L->hdr, path, hb, SL_EXPERTS_HEADER, (uint64_t)sb.st_size,
                                     err);
    free(hb);
    if (st) return st;
    const sl_experts_header *h = &L->hdr;
    if ((int64_t)h->layer != l || (int32_t)h->n_experts != s->n_experts || h->hidden != H ||
        h->inter != I)
        return sl_fail(err, SL_ERR_SHAPE,
                       "%s: holds layer %u with %u experts of [%u, %u], "
                       "expected layer %d with %d of [%lld, %lld]",
                       path, h->layer, h->n_experts, h->inter, h->hidden, l, s->n_experts,
                       (long long)I, (long long)H);
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
    } else if (p->mode == SL_EXPERTS_RESIDENT) {
        L->resident = aligned_alloc(SL_PACK_PAGE, (size_t)E * h->blob_bytes);
        if (!L->resident)
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory for resident experts", path);
        for (int32_t e = 0; e < E; e++) {
            uint8_t *blob = L->resident + (uint64_t)e * h->blob_bytes;
            int r =
                read_full(L->fd, blob, h->blob_bytes, h->data_offset + (uint64_t)e * h->blob_bytes);
            if (r)
                return sl_fail(err, SL_ERR_IO, "%s: reading expert %d: %s", path, e,
                               r == -1 ? "short read" : strerror(r));
            set_views(&L->views[e], h, blob);
        }
    } else {
        int64_t n = p->cache_experts;
        if (n <= 0 && p->cache_mem > 0) n = p->cache_mem / ((int64_t)h->blob_bytes * n_moe);
        if (n <= 0 && p->cache_mem <= 0) n = E;
        if (n < p->min_slots && p->cache_experts > 0)
            return sl_fail(err, SL_ERR_ARG,
                           "expert cache of %lld slot%s per layer is smaller than the %d "
                           "experts one token uses: --cache-experts must be at least %d",
                           (long long)n, n == 1 ? "" : "s", p->min_slots, p->min_slots);
        if (n < p->min_slots) {
            char need[32], one[32];
            size_up((int64_t)h->blob_bytes * p->min_slots * n_moe, need, sizeof need);
            size_up((int64_t)h->blob_bytes, one, sizeof one);
            return sl_fail(err, SL_ERR_ARG,
                           "expert cache of %lld slot%s per layer is smaller than the %d "
                           "experts one token uses: --cache-mem must be at least %s (top-k %d "
                           "experts x %d layers x %s)",
                           (long long)n, n == 1 ? "" : "s", p->min_slots, need, p->min_slots, n_moe,
                           one);
        }
        L->n_slots = (int32_t)SL_MIN(n, E);
        L->slot_mem = aligned_alloc(SL_PACK_PAGE, (size_t)L->n_slots * h->blob_bytes);
        L->slot_views = sl_calloc((size_t)L->n_slots, sizeof(sl_expert), err);
        L->slot_expert = sl_calloc((size_t)L->n_slots, sizeof(int32_t), err);
        L->slot_uses = sl_calloc((size_t)L->n_slots, sizeof(int64_t), err);
        L->slot_last = sl_calloc((size_t)L->n_slots, sizeof(int64_t), err);
        L->slot_pin = sl_calloc((size_t)L->n_slots, sizeof(int64_t), err);
        L->expert_slot = sl_calloc((size_t)E, sizeof(int32_t), err);
        if (!L->slot_mem || !L->slot_views || !L->slot_expert || !L->slot_uses || !L->slot_last ||
            !L->slot_pin || !L->expert_slot)
            return sl_fail(err, SL_ERR_NOMEM, "out of memory for %d expert slots", L->n_slots);
        for (int32_t i = 0; i < L->n_slots; i++) {
            L->slot_expert[i] = -1;
            L->slot_pin[i] = -1;
            set_views(&L->slot_views[i], h, L->slot_mem + (uint64_t)i * h->blob_bytes);
        }
        for (int32_t e = 0; e < E; e++)
            L->expert_slot[e] = -1;
    }
    if (p->mode != SL_EXPERTS_STREAM) {
        close(L->fd);
        L->fd = -1;
    }
    return SL_OK;
}

sl_status sl_experts_open_packed(sl_expert_store *s, const char *dir, int32_t n_layers,
                                 const uint8_t *layer_is_moe, int32_t n_experts, int64_t hidden,
                                 int64_t inter, const sl_store_params *p, sl_error *err) {
    sl_status st = store_init(s, n_layers, n_experts, err);
    if (st) return st;
    s->mode = p->mode;
    s->policy = p->policy;
    int32_t n_moe = 0;
    for (int32_t l = 0; l < n_layers; l++)
        n_moe += layer_is_moe[l] && n_experts > 0;
    for (int32_t l = 0, done = 0; !st && l < n_layers; l++) {
        if (!layer_is_moe[l] || n_experts == 0) continue;
        st = open_layer(s, l, dir, hidden, inter, p, n_moe, err);
        if (p->progress) p->progress(p->progress_user, "experts", ++done, n_moe);
    }
    if (!st && p->mode == SL_EXPERTS_STREAM) {
        st = pool_start(&s->pool, p->io_threads > 0 ? p->io_threads : 8, err);
        s->pool_started = 1;
    }
    return st;
}

void sl_experts_free(sl_expert_store *s) {
    if (!s) return;
    if (s->pool_started) pool_stop(&s->pool);
    for (int32_t l = 0; s->layers && l < s->n_layers; l++) {
        sl_expert_layer *L = &s->layers[l];
        if (L->fd >= 0) close(L->fd);
        if (L->map) munmap(L->map, L->map_size);
        free(L->resident), free(L->views), free(L->hist), free(L->slot_mem);
        free(L->slot_views), free(L->slot_expert), free(L->slot_uses), free(L->slot_last);
        free(L->slot_pin), free(L->expert_slot), free(L->path);
    }
    free(s->layers), free(s->jobs), free(s->miss_slot);
    memset(s, 0, sizeof *s);
}

/* -------------------------------------------------------------- fetch */

int sl_experts_cached(const sl_expert_store *s, int32_t layer, int32_t e) {
    const sl_expert_layer *L = &s->layers[layer];
    return L->n_slots == 0 || L->expert_slot[e] >= 0;
}

int32_t sl_experts_capacity(const sl_expert_store *s, int32_t layer) {
    const sl_expert_layer *L = &s->layers[layer];
    return L->n_slots > 0 ? L->n_slots : L->n_experts;
}

/* The slot to refill: empty first; else among unpinned slots the policy's pick. */
static int32_t pick_victim(const sl_expert_layer *L, sl_cache_policy policy, int64_t tick) {
    int32_t best = -1;
    for (int32_t i = 0; i < L->n_slots; i++) {
        if (L->slot_pin[i] == tick) continue;
        if (L->slot_expert[i] < 0) return i;
        if (best < 0) {
            best = i;
            continue;
        }
        if (policy == SL_CACHE_LFU) {
            if (L->slot_uses[i] < L->slot_uses[best] ||
                (L->slot_uses[i] == L->slot_uses[best] && L->slot_last[i] < L->slot_last[best]))
                best = i;
        } else if (L->slot_last[i] < L->slot_last[best]) {
            best = i;
        }
    }
    return best;
}

sl_status sl_experts_fetch(sl_expert_store *s, int32_t layer, const int32_t *ids, int32_t n,
                           const sl_expert **out, sl_error *err) {
    SL_ASSERT(layer >= 0 && layer < s->n_layers);
    sl_expert_layer *L = &s->layers[layer];
    SL_ASSERT(L->n_experts > 0 && n <= sl_experts_capacity(s, layer));
    s->requests += n;
    if (!L->n_slots) {
        s->hits += n;
        for (int32_t i = 0; i < n; i++)
            out[i] = &L->views[ids[i]];
        return SL_OK;
    }
    const int64_t tick = ++s->tick;
    int32_t n_miss = 0;
    /* Pin every slot already holding a requested expert, then place the misses. */
    for (int32_t i = 0; i < n; i++) {
        int32_t slot = L->expert_slot[ids[i]];
        if (slot >= 0) L->slot_pin[slot] = tick;
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        int32_t slot = L->expert_slot[e];
        if (slot >= 0) {
            s->hits++;
            L->slot_uses[slot]++;
        } else {
            slot = pick_victim(L, s->policy, tick);
            SL_ASSERT(slot >= 0);
            if (L->slot_expert[slot] >= 0) L->expert_slot[L->slot_expert[slot]] = -1;
            L->slot_expert[slot] = e;
            L->expert_slot[e] = slot;
            L->slot_uses[slot] = 1;
            L->slot_pin[slot] = tick;
            s->miss_slot[n_miss] = slot;
            s->jobs[n_miss++] = (sl_read_job){
                .fd = L->fd,
                .offset = L->hdr.data_offset + (uint64_t)e * L->hdr.blob_bytes,
                .len = L->hdr.blob_bytes,
                .dst = L->slot_mem + (uint64_t)slot * L->hdr.blob_bytes,
            };
        }
        L->slot_last[slot] = tick;
        out[i] = &L->slot_views[slot];
    }
    if (!n_miss) return SL_OK;
    double t0 = sl_now();
    pool_run(&s->pool, s->jobs, n_miss);
    s->read_time += sl_now() - t0;
    sl_status st = SL_OK;
    for (int32_t j = 0; j < n_miss; j++) {
        if (!s->jobs[j].err) {
            s->bytes_read += (int64_t)s->jobs[j].len;
            continue;
        }
        /* A failed slot is emptied so nothing ever computes on its bytes. */
        const int32_t slot = s->miss_slot[j];
        const int32_t e = L->slot_expert[slot];
        L->expert_slot[e] = -1;
        L->slot_expert[slot] = -1;
        if (!st)
            st = sl_fail(
                err, SL_ERR_IO, "%s: reading expert %d (%llu bytes at %llu): %s", L->path, e,
                (unsigned long long)s->jobs[j].len, (unsigned long long)s->jobs[j].offset,
                s->jobs[j].err == -1 ? "short read (file truncated?)" : strerror(s->jobs[j].err));
    }
    return st;
}
