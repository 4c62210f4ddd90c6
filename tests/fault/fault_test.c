/*
 * The library side of the I/O fault tests, run under the fault-injection shim (shim.c) by
 * tests/fault/fault_test.sh. Each command loads a pack, runs one prompt and checks what the
 * injected fault must do, printing one line; exit 0 when it did, 1 when not, 77 to skip.
 *
 *   inflight PACK IDS REF       a blob corrupted in flight (SLUICE_FAULT=flip, COUNT=1): the
 *                               forward fails naming file, layer and expert; the next one reads
 *                               the expert again, clean, and gives REF's logits bitwise
 *   stall PACK IDS REF MS NAME STALL
 *                               a read stalled STALL ms, past the I/O timeout of MS: the
 *                               forward fails in time naming NAME; another fails at once while
 *                               the read is out; once it is back, the forward gives REF's logits
 *   stuck-free PACK IDS MS NAME every read stalled: after the timeout, freeing the session and
 *                               the model returns at once (the stuck thread is abandoned)
 *   readfull FILE               sl_read_full with O_DIRECT alignment under short reads
 *                               (SLUICE_FAULT=short): every byte as a plain read gives it
 *   downgrade PACK              rewrites PACK at format 1 (no checksums), as older sluice wrote
 *   prefetch-stall PACK ENGINE  (layer 1's second read stalled past a 300 ms timeout) a
 *                               prefetched read stalled: the fetch that needs it fails in time
 *                               naming the file; another fails at once while it is out; once it
 *                               is back, both read exactly
 *   prefetch-eio PACK ENGINE    (layer 1's second read fails) a prefetch that failed is dropped
 *                               silently; the fetch that needs it reads it again, exactly
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model/packer.h"
#include "moe/experts.h"
#include "../store_check.h"
#include "sluice.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *fmt, const char *a, const char *b) {
    printf("FAIL ");
    printf(fmt, a, b);
    printf("\n");
    return 1;
}

static int32_t parse_ids(const char *s, int32_t *ids, int32_t cap) {
    int32_t n = 0;
    for (char *end; *s && n < cap; s = *end ? end + 1 : end)
        ids[n++] = (int32_t)strtol(s, &end, 10);
    return n;
}

typedef struct run {
    sl_model *m;
    sl_session *s;
    int32_t ids[256], n, V;
    float *logits;
} run;

static int open_run(run *r, const char *pack, const char *ids, int32_t timeout_ms) {
    memset(r, 0, sizeof *r);
    sl_error err = {0};
    sl_model_params mp = {
        .n_threads = 1, .experts = SL_EXPERTS_STREAM, .io_timeout_ms = timeout_ms};
    if (sl_model_load(pack, &mp, &r->m, &err)) return fail("load: %s%s", err.msg, "");
    sl_model_info info;
    sl_model_get_info(r->m, &info);
    r->V = info.vocab_size;
    r->n = parse_ids(ids, r->ids, 256);
    sl_session_params sp = {.max_ctx = r->n};
    if (sl_session_create(r->m, &sp, &r->s, &err)) return fail("session: %s%s", err.msg, "");
    r->logits = malloc((size_t)r->n * (size_t)r->V * sizeof(float));
    return r->logits ? 0 : 1;
}

static void close_run(run *r) {
    sl_session_free(r->s);
    sl_model_free(r->m);
    free(r->logits);
}

static sl_status forward(run *r, sl_error *err) {
    *err = (sl_error){0};
    sl_session_reset(r->s);
    return sl_session_forward(r->s, r->ids, r->n, r->logits, 1, err);
}

/* The logits equal REF's, bit for bit. */
static int same_as(const run *r, const char *ref) {
    const size_t n = (size_t)r->n * (size_t)r->V;
    float *want = malloc(n * sizeof(float));
    FILE *f = fopen(ref, "rb");
    const int ok = want && f && fread(want, sizeof(float), n, f) == n &&
                   memcmp(want, r->logits, n * sizeof(float)) == 0;
    if (f) fclose(f);
    free(want);
    return ok;
}

static int cmd_inflight(const char *pack, const char *ids, const char *ref) {
    run r;
    if (open_run(&r, pack, ids, 0)) return 1;
    sl_error err;
    int bad = 0;
    if (forward(&r, &err) != SL_ERR_FORMAT || !strstr(err.msg, "experts-") ||
        !strstr(err.msg, ", expert ") || !strstr(err.msg, "layer ") ||
        !strstr(err.msg, "checksum mismatch"))
        bad = fail("corrupt read: '%s'%s", err.msg, "");
    else
        printf("corrupt read refused: %s\n", err.msg);
    if (!bad && forward(&r, &err) != SL_OK) bad = fail("clean read after it: %s%s", err.msg, "");
    if (!bad && !same_as(&r, ref))
        bad = fail("clean read after it: logits differ from %s%s", ref, "");
    if (!bad) printf("ok: the next read of the expert was clean and the logits exact\n");
    close_run(&r);
    return bad;
}

static int cmd_stall(const char *pack, const char *ids, const char *ref, int32_t ms,
                     const char *name, long stall_ms) {
    run r;
    if (open_run(&r, pack, ids, ms)) return 1;
    sl_error err;
    int bad = 0;
    double t0 = now();
    sl_status st = forward(&r, &err);
    double dt = now() - t0;
    if (st != SL_ERR_TIMEOUT || !strstr(err.msg, name) || !strstr(err.msg, "I/O timeout") ||
        dt > ms / 1000.0 + 1.0)
        bad = fail("stalled read: '%s'%s", err.msg, "");
    else
        printf("stalled read failed after %.2f s: %s\n", dt, err.msg);
    t0 = now();
    st = forward(&r, &err);
    dt = now() - t0;
    if (!bad && (st != SL_ERR_TIMEOUT || !strstr(err.msg, "still stalled") || dt > 0.5))
        bad = fail("while the read is out: '%s'%s", err.msg, "");
    else if (!bad)
        printf("while it is out, at once: %s\n", err.msg);
    struct timespec ts = {(stall_ms + 500) / 1000, ((stall_ms + 500) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    if (!bad && forward(&r, &err) != SL_OK) bad = fail("after the stall: %s%s", err.msg, "");
    if (!bad && !same_as(&r, ref)) bad = fail("after the stall: logits differ from %s%s", ref, "");
    if (!bad) printf("ok: once the read came back, the forward ran with the exact logits\n");
    close_run(&r);
    return bad;
}

static int cmd_stuck_free(const char *pack, const char *ids, int32_t ms, const char *name) {
    run r;
    if (open_run(&r, pack, ids, ms)) return 1;
    sl_error err;
    sl_status st = forward(&r, &err);
    if (st != SL_ERR_TIMEOUT || !strstr(err.msg, name) || !strstr(err.msg, "I/O timeout")) {
        close_run(&r);
        return fail("stalled read: '%s'%s", err.msg, "");
    }
    const double t0 = now();
    close_run(&r);
    const double dt = now() - t0;
    if (dt > 0.5) {
        char s[32];
        snprintf(s, sizeof s, "%.2f", dt);
        return fail("freeing the model with a read stuck took %s s%s", s, "");
    }
    printf("ok: model freed in %.3f s with a read still stuck (%s)\n", dt, err.msg);
    return 0;
}

static int cmd_readfull(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return fail("%s: %s", path, strerror(errno));
    const size_t n = (size_t)sb.st_size;
    uint8_t *want = malloc(n), *got = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    uint8_t *bounce = aligned_alloc(4096, 65536);
    int plain = open(path, O_RDONLY);
    if (!want || !got || !bounce || plain < 0 || sl_read_full(plain, want, n, 0, 0, NULL, 0))
        return fail("%s: plain read failed%s", path, "");
    close(plain);
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
        printf("skip: O_DIRECT unsupported here\n");
        return 77;
    }
    if (fd < 0) return fail("%s: %s", path, strerror(errno));
    int bad = 0;
    /* the whole file (aligned), then a range whose ends are not */
    int r = sl_read_full(fd, got, n / 4096 * 4096, 0, 4096, bounce, 65536);
    if (r || memcmp(got, want, n / 4096 * 4096))
        bad = fail("aligned read: %s%s", strerror(r > 0 ? r : EIO), "");
    memset(got, 0, n);
    r = sl_read_full(fd, got + 4096, n - 5000, 777, 4096, bounce, 65536);
    if (!bad && (r || memcmp(got + 4096, want + 777, n - 5000)))
        bad = fail("unaligned range: %s%s", strerror(r > 0 ? r : EIO), "");
    close(fd);
    if (!bad) printf("ok: O_DIRECT reads under short reads give every byte\n");
    free(want), free(got), free(bounce);
    return bad;
}

static int open_store(sl_expert_store *s, const char *pack, const char *engine) {
    uint8_t moe[4] = {1, 1, 1, 1};
    sl_error err = {0};
    sl_store_params p = {.mode = SL_EXPERTS_STREAM,
                         .cache_experts = 4,
                         .min_slots = 2,
                         .io_threads = 3,
                         .io_timeout_ms = 300,
                         .io_engine = !strcmp(engine, "uring") ? SL_IO_URING : SL_IO_THREADS};
    if (sl_experts_open_packed(s, pack, 4, moe, 8, 256, 192, &p, &err)) {
        printf("skip: %s\n", err.msg);
        return 77;
    }
    return 0;
}

static int cmd_prefetch(const char *pack, const char *engine, int stall) {
    sl_expert_store s;
    int r = open_store(&s, pack, engine);
    if (r) {
        sl_experts_free(&s);
        return r;
    }
    sl_error err = {0};
    const sl_expert *out[4];
    int bad = 0;
    if (sl_experts_prefetch(&s, 1, (int32_t[]){3}, 1) != 1)
        bad = fail("prefetch: none started%s%s", "", "");
    if (stall) {
        const double t0 = now();
        sl_status st = sl_experts_fetch(&s, 1, (int32_t[]){3}, 1, out, &err);
        const double dt = now() - t0;
        if (!bad && (st != SL_ERR_TIMEOUT || !strstr(err.msg, "experts-001.bin") ||
                     !strstr(err.msg, "expert 3") || dt > 1.0))
            bad = fail("stalled prefetch, fetched: '%s'%s", err.msg, "");
        err = (sl_error){0};
        st = sl_experts_fetch(&s, 1, (int32_t[]){5}, 1, out, &err);
        if (!bad && (st != SL_ERR_TIMEOUT || !strstr(err.msg, "still stalled")))
            bad = fail("while it is out: '%s'%s", err.msg, "");
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
    } else {
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
        if (!bad && sl_experts_fetch(&s, 1, (int32_t[]){5}, 1, out, &err) != SL_OK)
            bad = fail("a fetch after a failed prefetch: '%s'%s", err.msg, "");
        if (!bad && sl_slot_lookup(&s.layers[1].slots, 3) >= 0)
            bad = fail("the failed prefetch is still cached%s%s", "", "");
    }
    err = (sl_error){0};
    if (!bad && sl_experts_fetch(&s, 1, (int32_t[]){3, 5}, 2, out, &err) != SL_OK)
        bad = fail("after it: '%s'%s", err.msg, "");
    if (!bad && (!slot_matches_file(&s, 3) || !slot_matches_file(&s, 5)))
        bad = fail("bytes differ%s%s", "", "");
    if (!bad) printf("ok: prefetch %s (%s)\n", stall ? "stalled" : "failed", engine);
    sl_experts_free(&s);
    return bad;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "inflight") && argc == 5) return cmd_inflight(argv[2], argv[3], argv[4]);
    if (!strcmp(cmd, "stall") && argc == 8)
        return cmd_stall(argv[2], argv[3], argv[4], atoi(argv[5]), argv[6], atol(argv[7]));
    if (!strcmp(cmd, "stuck-free") && argc == 6)
        return cmd_stuck_free(argv[2], argv[3], atoi(argv[4]), argv[5]);
    if (!strcmp(cmd, "readfull") && argc == 3) return cmd_readfull(argv[2]);
    if (!strcmp(cmd, "prefetch-stall") && argc == 4) return cmd_prefetch(argv[2], argv[3], 1);
    if (!strcmp(cmd, "prefetch-eio") && argc == 4) return cmd_prefetch(argv[2], argv[3], 0);
    if (!strcmp(cmd, "downgrade") && argc == 3) {
        sl_error err = {0};
        if (sl_pack_convert(argv[2], 1, NULL, NULL, &err))
            return fail("downgrade: %s%s", err.msg, "");
        return 0;
    }
    fprintf(
        stderr,
        "usage: fault_test inflight|stall|stuck-free|readfull|downgrade ... (see the source)\n");
    return 2;
}
