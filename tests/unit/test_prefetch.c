/*
 * The expert store's asynchronous fetch and prefetch (sl_experts_fetch_start/_wait,
 * sl_experts_prefetch) on models/kjv-moe: prefetched experts serve later fetches byte for byte,
 * never evict what the current request pinned or what is in flight, fill only unpinned slots,
 * and a prefetched read that fails is dropped (read again, or reported, by the fetch that needs
 * it). Stalled and failing reads under the fault shim: tests/fault (prefetch-*).
 */
#include <fcntl.h>
#include <unistd.h>

#include "model/model.h"
#include "moe/experts.h"
#include "../store_check.h"
#include "test.h"

static const char *const kjv = "models/kjv-moe";

static sl_status open_kjv(sl_expert_store *s, int32_t slots, sl_io_engine engine) {
    uint8_t moe[4] = {1, 1, 1, 1};
    sl_error err = {0};
    sl_store_params p = {.mode = SL_EXPERTS_STREAM,
                         .cache_experts = slots,
                         .min_slots = 2,
                         .io_threads = 3,
                         .io_engine = engine};
    sl_status st = sl_experts_open_packed(s, kjv, 4, moe, 8, 256, 192, &p, &err);
    if (st) fprintf(stderr, "  open: %s\n", err.msg);
    return st;
}

/* Time for layer 1's prefetches to come back (settled by the next call on the layer). */
static void settle(sl_expert_store *s) {
    (void)s;
    usleep(200000);
}

static void run_engine(sl_io_engine engine) {
    sl_expert_store s;
    sl_error err = {0};
    const sl_expert *out[8];
    if (open_kjv(&s, 4, engine)) {
        CHECK(0);
        sl_experts_free(&s);
        return;
    }
    /* prefetch, then a fetch that needs them: no new read, the bytes the file's */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){0, 1}, 2) == 2);
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){0, 1}, 2) == 0); /* in flight already */
    CHECK(s.prefetch_reads == 2 && s.prefetch_bytes == 2 * (int64_t)s.layers[1].hdr.blob_bytes);
    CHECK(sl_experts_fetch_start(&s, 1, (int32_t[]){1, 0}, 2, out, &err) == SL_OK);
    CHECKF(sl_experts_fetch_wait(&s, 1, 0, &err) == SL_OK, "%s", err.msg);
    CHECKF(sl_experts_fetch_wait(&s, 1, 1, &err) == SL_OK, "%s", err.msg);
    CHECK(sl_experts_fetch_ready(&s, 1, 0) && sl_experts_fetch_ready(&s, 1, 1));
    CHECK(s.prefetch_used == 2 && s.hits == 0 && s.requests == 2);
    CHECK(slot_matches_file(&s, 0) && slot_matches_file(&s, 1));
    CHECK(out[0] == &s.layers[1].slot_views[sl_slot_lookup(&s.layers[1].slots, 1)]);
    /* an expert already cached is not prefetched */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){0}, 1) == 0);
    /* the current request (0, 1) is pinned: a prefetch fills only the two other slots */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){2, 3, 4, 5, 6}, 5) == 2);
    CHECK(sl_slot_lookup(&s.layers[1].slots, 0) >= 0 && sl_slot_lookup(&s.layers[1].slots, 1) >= 0);
    CHECK(sl_slot_lookup(&s.layers[1].slots, 2) >= 0 && sl_slot_lookup(&s.layers[1].slots, 3) >= 0);
    CHECK(sl_slot_lookup(&s.layers[1].slots, 4) < 0);
    /* a fetch of four others while 2 and 3 may still be in flight: it waits for slots, gets
     * every byte right */
    CHECK(sl_experts_fetch(&s, 1, (int32_t[]){4, 5, 6, 7}, 4, out, &err) == SL_OK);
    for (int32_t e = 4; e < 8; e++)
        CHECK(slot_matches_file(&s, e));
    CHECK(s.prefetch_used == 2);
    /* all four slots pinned by that request: no room for a prefetch until the next one */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){0}, 1) == 0);
    CHECK(sl_experts_fetch(&s, 1, (int32_t[]){4}, 1, out, &err) == SL_OK);
    /* a prefetch whose sum fails: dropped silently, the fetch that needs it reads it again and
     * reports the mismatch (the table is wrong, so the read again fails too) */
    s.layers[1].crc[2] ^= 1;
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){2}, 1) == 1);
    settle(&s);
    CHECK(sl_experts_fetch(&s, 1, (int32_t[]){4}, 1, out, &err) == SL_OK);
    CHECK(sl_slot_lookup(&s.layers[1].slots, 2) < 0); /* dropped, nothing said */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){2}, 1) == 1);
    CHECK(sl_experts_fetch(&s, 1, (int32_t[]){2, 4}, 2, out, &err) == SL_ERR_FORMAT &&
          strstr(err.msg, "layer 1, expert 2") && strstr(err.msg, "checksum mismatch"));
    CHECK(sl_slot_lookup(&s.layers[1].slots, 2) < 0 && sl_slot_lookup(&s.layers[1].slots, 4) >= 0);
    s.layers[1].crc[2] ^= 1;
    CHECK(sl_experts_fetch(&s, 1, (int32_t[]){2}, 1, out, &err) == SL_OK &&
          slot_matches_file(&s, 2));
    /* layers without slots, and prefetch outside stream mode: nothing to do */
    CHECK(sl_experts_prefetch(&s, 0, (int32_t[]){0}, 1) <= 1);
    sl_experts_free(&s);
}

TEST(test_prefetch_threads) {
    run_engine(SL_IO_THREADS);
}

TEST(test_prefetch_uring) {
    sl_expert_store s;
    if (open_kjv(&s, 4, SL_IO_URING)) { /* built without liburing */
        sl_experts_free(&s);
        printf("  (no io_uring in this build)\n");
        return;
    }
    sl_experts_free(&s);
    run_engine(SL_IO_URING);
}

/* Overlap and prefetch never change results: the MoE step's outputs with any I/O engine,
 * overlap on or off, are the same bits (the kjv model's logits). */
TEST(test_stream_overlap_bitwise) {
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *ref = NULL;
    for (int v = 0; v < 4; v++) {
        sl_model_params mp = {.n_threads = 1,
                              .experts = v ? SL_EXPERTS_STREAM : SL_EXPERTS_MAPPED,
                              .cache_experts = 2,
                              .no_overlap = v == 2,
                              .io_engine = v == 3 ? SL_IO_URING : SL_IO_THREADS};
        sl_model *m = NULL;
        sl_session *ses = NULL;
        sl_error err = {0};
        if (sl_model_load(kjv, &mp, &m, &err)) {
            CHECKF(v == 3, "%s", err.msg);
            continue;
        }
        sl_model_info in;
        sl_model_get_info(m, &in);
        sl_session_params sp = {.max_ctx = 8};
        CHECK(sl_session_create(m, &sp, &ses, &err) == SL_OK);
        float *got = malloc((size_t)8 * in.vocab_size * sizeof(float));
        CHECKF(sl_session_forward(ses, ids, 8, got, 1, &err) == SL_OK, "%s", err.msg);
        if (!ref)
            ref = got;
        else {
            CHECKF(!memcmp(ref, got, (size_t)8 * in.vocab_size * sizeof(float)), "variant %d", v);
            /* again after prefetches into every layer (read or still in flight): the same */
            int32_t started = 0;
            for (int32_t l = 0; l < m->experts.n_layers; l++)
                started += sl_experts_prefetch(&m->experts, l, (int32_t[]){7, 6, 5, 4}, 4);
            CHECK(started > 0 && m->experts.prefetch_reads == started);
            sl_session_reset(ses);
            CHECKF(sl_session_forward(ses, ids, 8, got, 1, &err) == SL_OK, "%s", err.msg);
            CHECKF(!memcmp(ref, got, (size_t)8 * in.vocab_size * sizeof(float)),
                   "variant %d after prefetch", v);
            free(got);
        }
        sl_session_free(ses);
        sl_model_free(m);
    }
    free(ref);
}

TEST(test_cache_mem_auto) {
    sl_model_params mp = {.n_threads = 1, .experts = SL_EXPERTS_STREAM, .cache_mem_auto = 1};
    sl_model *m = NULL;
    sl_error err = {0};
    CHECKF(sl_model_load(kjv, &mp, &m, &err) == SL_OK, "%s", err.msg);
    if (!m) return;
    sl_model_info in;
    sl_model_get_info(m, &in);
    /* a sane budget: slots between top-k and all, within what is available */
    CHECK(in.cache_slots >= in.n_experts_used && in.cache_slots <= in.n_experts);
    CHECKF(in.cache_auto_avail > 0 && in.cache_auto_bytes > 0 &&
               in.cache_auto_bytes <= in.cache_auto_avail && in.cache_auto_share > 0 &&
               in.cache_auto_share <= 1.0,
           "avail %lld bytes %lld share %f", (long long)in.cache_auto_avail,
           (long long)in.cache_auto_bytes, in.cache_auto_share);
    sl_model_free(m);
}

/* ---- a read that hangs: its destination pages fault into a userfaultfd nobody answers (until
 * the test unregisters it), so the read blocks in the kernel as on a stalled disk. io_uring with
 * O_DIRECT (a buffered io_uring read faulted its pages in without waiting on Linux 6.18).
 * Skipped where userfaultfd is not allowed, or the read does not wait for it. */

#include <errno.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

typedef struct uffd_hold {
    int fd;
    struct uffdio_range range;
    useconds_t release_us;
} uffd_hold;

/* Lets the faults go (unregistering wakes them: they then fault in plain zero pages). */
static void *uffd_release(void *arg) {
    uffd_hold *h = arg;
    usleep(h->release_us);
    ioctl(h->fd, UFFDIO_UNREGISTER, &h->range);
    return NULL;
}

static void stall_engine(sl_io_engine engine) {
    uint8_t moe[4] = {1, 1, 1, 1};
    sl_expert_store s;
    sl_error err = {0};
    sl_store_params p = {.mode = SL_EXPERTS_STREAM,
                         .cache_experts = 4,
                         .min_slots = 2,
                         .io_threads = 3,
                         .io_timeout_ms = 200,
                         .io_engine = engine,
                         .direct_io = engine == SL_IO_URING,
                         .uring_plain = 1};
    if (sl_experts_open_packed(&s, kjv, 4, moe, 8, 256, 192, &p, &err)) {
        CHECKF(engine == SL_IO_URING, "%s", err.msg);
        sl_experts_free(&s);
        return;
    }
    sl_expert_layer *L = &s.layers[1];
    uffd_hold h = {.fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK),
                   .release_us = 1200000};
    struct uffdio_api api = {.api = UFFD_API};
    const size_t bytes = (size_t)L->slots.n_slots * L->hdr.blob_bytes;
    h.range = (struct uffdio_range){(uintptr_t)L->slot_mem, bytes};
    struct uffdio_register reg = {.range = h.range, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (h.fd < 0 || ioctl(h.fd, UFFDIO_API, &api) || madvise(L->slot_mem, bytes, MADV_DONTNEED) ||
        ioctl(h.fd, UFFDIO_REGISTER, &reg)) {
        printf("  (no userfaultfd here: %s)\n", strerror(errno));
        if (h.fd >= 0) close(h.fd);
        sl_experts_free(&s);
        return;
    }
    pthread_t t;
    pthread_create(&t, NULL, uffd_release, &h);
    const sl_expert *out[4];
    /* a prefetch whose read hangs; the fetch that needs it gives up at the timeout */
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){3}, 1) == 1);
    double t0 = sl_now();
    sl_status st = sl_experts_fetch(&s, 1, (int32_t[]){3}, 1, out, &err);
    double dt = sl_now() - t0;
    if (st == SL_OK && engine == SL_IO_URING) {
        /* the read did not wait for the userfaultfd: nothing to test with it here */
        printf("  (io_uring's reads do not wait on a userfaultfd here: stall not tested)\n");
        pthread_join(t, NULL);
        close(h.fd);
        sl_experts_free(&s);
        return;
    }
    CHECKF(st == SL_ERR_TIMEOUT && strstr(err.msg, "experts-001.bin") &&
               strstr(err.msg, "expert 3") && dt < 1.0,
           "engine %d: %s (%.2f s)", (int)engine, err.msg, dt);
    CHECK(sl_slot_lookup(&L->slots, 3) < 0);
    /* while it is out, no read starts: at once, said so; and no prefetch */
    err = (sl_error){0};
    t0 = sl_now();
    st = sl_experts_fetch(&s, 1, (int32_t[]){5}, 1, out, &err);
    CHECKF(st == SL_ERR_TIMEOUT && strstr(err.msg, "still stalled") && sl_now() - t0 < 0.5,
           "engine %d: %s", (int)engine, err.msg);
    CHECK(sl_experts_prefetch(&s, 1, (int32_t[]){6}, 1) == 0);
    pthread_join(t, NULL);
    close(h.fd);
    usleep(200000); /* the read comes back: its slot leaves quarantine */
    err = (sl_error){0};
    CHECKF(sl_experts_fetch(&s, 1, (int32_t[]){3, 5}, 2, out, &err) == SL_OK, "engine %d: %s",
           (int)engine, err.msg);
    CHECK(slot_matches_file(&s, 3) && slot_matches_file(&s, 5));
    sl_experts_free(&s);
}

TEST(test_prefetch_stalled_read) {
    stall_engine(SL_IO_THREADS);
    stall_engine(SL_IO_URING);
}
