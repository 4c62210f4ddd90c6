/*
 * Data integrity (issue 24): CRC32C's three implementations against known vectors and each
 * other; safetensors data_offsets that overlap; pack format 2's checksums caught in every
 * experts mode, in core tensors and in n-gram rows; format 1 packs loading unchecked and
 * converting back and forth byte for byte; files shrinking under a mapping; packing in place
 * under a loaded model; sl_read_full's aligned retries. The I/O faults proper (EIO, short,
 * stalled and corrupted reads) are tests/fault/fault_test.sh's, under an LD_PRELOAD shim.
 */
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "format/pack.h"
#include "families/qwen4_exp/qwen4_exp.h"
#include "model/model.h"
#include "model/packer.h"
#include "test.h"

/* ---- CRC32C */

TEST(test_crc32c_vectors_and_paths) {
    /* RFC 3720 (iSCSI) B.4 and the usual check value */
    uint8_t zeros[32] = {0}, ones[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++)
        ones[i] = 0xff, inc[i] = (uint8_t)i, dec[i] = (uint8_t)(31 - i);
    const struct {
        const void *p;
        size_t n;
        uint32_t want;
    } v[] = {{"123456789", 9, 0xe3069283u}, {zeros, 32, 0x8a9136aau}, {ones, 32, 0x62a8ab43u},
             {inc, 32, 0x46dd794eu},        {dec, 32, 0x113fdb5cu},   {"", 0, 0}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        CHECKF(sl_crc32c_ref(0, v[i].p, v[i].n) == v[i].want, "ref vector %zu", i);
        CHECKF(sl_crc32c_sw(0, v[i].p, v[i].n) == v[i].want, "sw vector %zu", i);
        CHECKF(sl_crc32c_hw(0, v[i].p, v[i].n) == v[i].want, "hw vector %zu", i);
        CHECKF(sl_crc32c(0, v[i].p, v[i].n) == v[i].want, "dispatch vector %zu", i);
    }
    printf("  CRC32C: SSE4.2 path %s\n", sl_crc32c_hw_available() ? "used" : "unavailable");
    /* Every length across the three-stream block sizes (3 x 256, 3 x 8192), odd starts, and
     * a running value: the three agree, and chaining equals one call. */
    const size_t N = 3 * 8192 * 2 + 3 * 256 + 77;
    uint8_t *buf = malloc(N + 8);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < N + 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    int bad = 0;
    for (size_t n = 0; n <= N && bad < 5; n += n < 1100 ? 1 : 997) {
        const size_t o = n % 8;
        const uint32_t r = sl_crc32c_ref(0x12345678u, buf + o, n);
        if (sl_crc32c_sw(0x12345678u, buf + o, n) != r ||
            sl_crc32c_hw(0x12345678u, buf + o, n) != r)
            CHECKF(++bad == 0, "length %zu at offset %zu", n, o);
        const size_t cut = n / 3;
        if (sl_crc32c(sl_crc32c(0x12345678u, buf + o, cut), buf + o + cut, n - cut) != r)
            CHECKF(++bad == 0, "chained at %zu of %zu", cut, n);
    }
    /* Pieces summed apart and joined, at every kind of split point. */
    for (size_t n = 1; n < N && bad < 5; n += 4093) {
        const size_t cut = (n * 7) / 11;
        sl_crc32c_shift t;
        sl_crc32c_shift_init(&t, n - cut);
        const uint32_t joined =
            sl_crc32c_combine(&t, sl_crc32c(0, buf, cut), sl_crc32c(0, buf + cut, n - cut));
        if (joined != sl_crc32c_ref(0, buf, n)) CHECKF(++bad == 0, "joined at %zu of %zu", cut, n);
    }
    free(buf);
}

/* ---- safetensors */

static sl_status st_bytes(const char *header, size_t data, sl_error *err) {
    const size_t hl = strlen(header), n = 8 + hl + data;
    uint8_t *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    sl_st_file f = {0};
    *err = (sl_error){0};
    sl_status st = sl_st_parse(&f, "o.safetensors", b, n, err);
    sl_st_close(&f);
    free(b);
    return st;
}

TEST(test_safetensors_overlapping_offsets) {
    sl_error err;
    const char *bad[] = {
        /* b starts inside a */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
        /* two names, one region */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        /* c inside b, listed first */
        "{\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[10,12]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
        /* a zero-sized tensor inside another */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_status st = st_bytes(bad[i], 16, &err);
        CHECKF(st == SL_ERR_FORMAT && strstr(err.msg, "overlap") &&
                   strstr(err.msg, "o.safetensors"),
               "case %zu: %s", i, err.msg);
    }
    CHECK(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, &err) ==
              SL_ERR_FORMAT &&
          strstr(err.msg, "'a'") && strstr(err.msg, "swapped"));
    /* Adjacent tensors, a gap, zero-sized ones at the edges: fine. */
    const char *good = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                       "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},"
                       "\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[14,16]},"
                       "\"y\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[16,16]}}";
    CHECKF(st_bytes(good, 16, &err) == SL_OK, "%s", err.msg);
}

/* ---- packs */

static const char *fixture_pack(const char *name, sl_quant q, const char *tag) {
    static char dir[8][512];
    static int n;
    SL_ASSERT(n < 8);
    char src[512];
    snprintf(src, sizeof src, "%s/%s", test_fixtures, name);
    char *d = dir[n++];
    snprintf(d, 512, "%s/integrity-%s-%s", test_tmpdir(),
             strrchr(name, '/') ? strrchr(name, '/') + 1 : name, tag);
    sl_pack_params p = {.quant = q};
    sl_error err = {0};
    if (sl_pack(src, d, &p, &err)) {
        fprintf(stderr, "  pack %s: %s\n", name, err.msg);
        return NULL;
    }
    return d;
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

static void flip_at(const char *path, uint64_t off) {
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1);
    b ^= 0xff;
    CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
}

static uint64_t rd_u64(const char *path, uint64_t off) {
    uint8_t b[8] = {0};
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, b, 8, (off_t)off) == 8);
    close(fd);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* Sets the manifest's SHA-256 of dir/name to that of the file as it is now. */
static int rehash(const char *dir, const char *name) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *bytes = NULL;
    size_t n = 0;
    sl_error err = {0};
    if (sl_read_file(path, &bytes, &n, &err)) return -1;
    unsigned char d[32];
    char hex[65];
    EVP_Digest(bytes, n, d, NULL, EVP_sha256(), NULL);
    free(bytes);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je), *fe;
    size_t i;
    int found = 0;
    json_array_foreach(json_object_get(man, "files"), i, fe) {
        if (strcmp(json_string_value(json_object_get(fe, "name")), name)) continue;
        json_object_set_new(fe, "sha256", json_string(hex));
        found = 1;
    }
    int r = found && json_dump_file(man, path, JSON_INDENT(1)) == 0 ? 0 : -1;
    json_decref(man);
    return r;
}

static const int32_t ids[] = {3, 14, 15, 92, 65, 35, 89, 79};
#define N_IDS ((int32_t)(sizeof ids / sizeof ids[0]))

/* Runs ids through a fresh session of m: SL_OK or the error, logits (n x V) if wanted. */
static sl_status run(sl_model *m, float *logits, sl_error *err) {
    sl_session *s = NULL;
    sl_session_params sp = {.max_ctx = N_IDS};
    *err = (sl_error){0};
    sl_status st = sl_session_create(m, &sp, &s, err);
    if (!st) st = sl_session_forward(s, ids, N_IDS, logits, logits != NULL, err);
    sl_session_free(s);
    return st;
}

static int files_equal(const char *a, const char *b) {
    return sh("cmp -s '%s' '%s'", a, b) == 0;
}

TEST(test_pack_format_1_round_trip) {
    const char *dir = fixture_pack("qwen2_gqa_untied", SL_QUANT_INT8, "v");
    if (!dir) {
        CHECK(0);
        return;
    }
    CHECK(sl_pack_version(dir) == SL_PACK_VERSION);
    char old[600], path[700], a[700];
    snprintf(old, sizeof old, "%s-v1", dir);
    CHECK(sh("cp -r '%s' '%s'", dir, old) == 0);
    sl_error err = {0};
    CHECKF(sl_pack_convert(old, 1, NULL, NULL, &err) == SL_OK, "%s", err.msg);
    CHECK(sl_pack_version(old) == 1);
    CHECKF(sl_verify(old, NULL, NULL, &err) == SL_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/experts-000.bin", old);
    snprintf(a, sizeof a, "%s/experts-000.bin", dir);
    CHECK(!files_equal(path, a));
    /* The same logits from either version, in every mode; version 1 says it has no checks. */
    int32_t V = 0;
    for (int mode = SL_EXPERTS_MAPPED; mode <= SL_EXPERTS_STREAM; mode++) {
        sl_model_params mp = {.n_threads = 2, .experts = (sl_experts_mode)mode};
        float *x = test_logits(dir, &mp, ids, N_IDS, N_IDS, NULL, &V);
        float *y = test_logits(old, &mp, ids, N_IDS, N_IDS, NULL, &V);
        CHECKF(x && y && !memcmp(x, y, (size_t)N_IDS * (size_t)V * sizeof(float)),
               "mode %d: format 1 and 2 differ", mode);
        free(x), free(y);
    }
    sl_model *m = NULL;
    sl_model_params mp = {.n_threads = 1};
    CHECK(sl_model_load(old, &mp, &m, &err) == SL_OK);
    sl_model_info info;
    if (m) sl_model_get_info(m, &info);
    CHECK(m && info.pack_version == 1 && m->experts.layers[0].crc == NULL);
    sl_model_free(m);
    /* Upgraded: the files pack itself wrote, byte for byte; a second upgrade does nothing. */
    CHECKF(sl_pack_upgrade(old, NULL, NULL, &err) == SL_OK, "%s", err.msg);
    const char *names[] = {"core.bin", "experts-000.bin", "experts-001.bin", "manifest.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", old, names[i]);
        snprintf(a, sizeof a, "%s/%s", dir, names[i]);
        struct stat sb;
        if (stat(a, &sb) == 0)
            CHECKF(files_equal(path, a), "%s differs after the round trip", names[i]);
    }
    CHECK(sl_pack_upgrade(old, NULL, NULL, &err) == SL_OK &&
          sl_pack_version(old) == SL_PACK_VERSION);
    /* Packing a pack is refused, pointing at the upgrade. */
    CHECK(sl_pack(dir, old, &(sl_pack_params){.force = 1}, &err) == SL_ERR_ARG &&
          strstr(err.msg, "verify --upgrade"));
}

/* A GGUF's pack keeps its block types and a type per expert matrix (format 3): an older version
 * cannot hold them, so converting down is refused and leaves the pack as it was. */
TEST(test_gguf_pack_refuses_older_formats) {
    const char *dir = fixture_pack("gguf_mixed/qwen3_mixed.gguf", SL_QUANT_AUTO, "g");
    if (!dir) {
        CHECK(0);
        return;
    }
    sl_error err = {0};
    CHECK(sl_pack_version(dir) == SL_PACK_VERSION);
    CHECK(sl_pack_convert(dir, 2, NULL, NULL, &err) == SL_ERR_UNSUPPORTED &&
          strstr(err.msg, "format version 2 cannot hold"));
    CHECK(sl_pack_version(dir) == SL_PACK_VERSION);
    CHECKF(sl_verify(dir, NULL, NULL, &err) == SL_OK, "%s", err.msg);
}

/* A byte flipped in the blob of an expert the prompt routes to: resident refuses at load,
 * mapped and stream at the forward, naming file, layer and expert. */
TEST(test_flipped_expert_every_mode) {
    const char *dir = fixture_pack("qwen2_gqa_untied", SL_QUANT_INT8, "e");
    if (!dir) {
        CHECK(0);
        return;
    }
    /* which experts of layer 1 the prompt uses */
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1};
    CHECK(sl_model_load(dir, &mp, &m, &err) == SL_OK);
    if (!m) return;
    CHECK(run(m, NULL, &err) == SL_OK);
    int32_t e = -1;
    const sl_expert_layer *L = &m->experts.layers[1];
    for (int32_t i = 0; L->hist && i < L->n_experts && e < 0; i++)
        if (L->hist[i] > 0) e = i;
    const uint64_t at = L->hdr.data_offset + (uint64_t)e * L->hdr.blob_bytes + 777;
    sl_model_free(m);
    CHECK(e >= 0);
    char bad[600], path[700], want[160], which[64];
    snprintf(bad, sizeof bad, "%s-flip", dir);
    CHECK(sh("cp -r '%s' '%s'", dir, bad) == 0);
    snprintf(path, sizeof path, "%s/experts-001.bin", bad);
    flip_at(path, at);
    snprintf(want, sizeof want, "experts-001.bin: layer 1, expert %d", e);
    snprintf(which, sizeof which, "layer 1, expert %d: checksum mismatch", e);
    for (int mode = SL_EXPERTS_MAPPED; mode <= SL_EXPERTS_STREAM; mode++) {
        sl_model_params vp = {.n_threads = 1, .experts = (sl_experts_mode)mode};
        m = NULL;
        err = (sl_error){0};
        sl_status st = sl_model_load(bad, &vp, &m, &err);
        if (mode == SL_EXPERTS_RESIDENT) {
            CHECKF(st == SL_ERR_FORMAT && strstr(err.msg, want) && strstr(err.msg, "checksum"),
                   "resident: %s", err.msg);
        } else {
            CHECK(st == SL_OK);
            /* twice: a failed blob is never cached or marked good */
            for (int k = 0; m && k < 2; k++) {
                st = run(m, NULL, &err);
                CHECKF(st == SL_ERR_FORMAT && strstr(err.msg, want) &&
                           strstr(err.msg, "checksum mismatch"),
                       "mode %d, try %d: %s", mode, k, err.msg);
            }
            if (m && mode == SL_EXPERTS_STREAM)
                CHECK(sl_slot_lookup(&m->experts.layers[1].slots, e) < 0);
        }
        sl_model_free(m);
    }
    /* verify names it too, with the SHA-256 */
    err = (sl_error){0};
    CHECKF(sl_verify(bad, NULL, NULL, &err) == SL_ERR_FORMAT && strstr(err.msg, "SHA-256") &&
               strstr(err.msg, "experts-001.bin") && strstr(err.msg, which),
           "%s", err.msg);
    /* A manifest rewritten to match the corrupt bytes does not fool verify: the blob's own
     * checksum still fails. */
    CHECK(rehash(bad, "experts-001.bin") == 0);
    err = (sl_error){0};
    CHECKF(sl_verify(bad, NULL, NULL, &err) == SL_ERR_FORMAT && !strstr(err.msg, "SHA-256") &&
               strstr(err.msg, "experts-001.bin") && strstr(err.msg, which),
           "%s", err.msg);
}

TEST(test_flipped_core_tensor) {
    const char *dir = fixture_pack("qwen3_gqa_untied", SL_QUANT_INT4, "c");
    if (!dir) {
        CHECK(0);
        return;
    }
    char bad[600], path[700];
    snprintf(bad, sizeof bad, "%s-flip", dir);
    CHECK(sh("cp -r '%s' '%s'", dir, bad) == 0);
    snprintf(path, sizeof path, "%s/core.bin", bad);
    /* the last tensor of the index, 5 bytes into its data (or, quantised, its biases) */
    const uint32_t n = (uint32_t)rd_u64(path, 12);
    const uint64_t rec = 64 + 256 * (uint64_t)(n - 1);
    char name[161] = {0};
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, name, 160, (off_t)rec) == 160);
    close(fd);
    const uint64_t biases = rd_u64(path, rec + 224);
    flip_at(path, (biases ? biases : rd_u64(path, rec + 200)) + 5);
    for (int mode = SL_EXPERTS_MAPPED; mode <= SL_EXPERTS_STREAM; mode++) {
        sl_model *m = NULL;
        sl_error err = {0};
        sl_model_params mp = {.n_threads = 1, .experts = (sl_experts_mode)mode};
        CHECKF(sl_model_load(bad, &mp, &m, &err) == SL_ERR_FORMAT && strstr(err.msg, "core.bin") &&
                   strstr(err.msg, name) && strstr(err.msg, "checksum mismatch"),
               "'%s': %s", name, err.msg);
        sl_model_free(m);
    }
}

/* Mapped files cut short under a loaded model: the next forward fails naming the file, it
 * does not die of SIGBUS. */
TEST(test_mapped_files_shrinking) {
    const char *dir = fixture_pack("qwen2_gqa_untied", SL_QUANT_BF16, "s");
    if (!dir) {
        CHECK(0);
        return;
    }
    const char *files[] = {"experts-000.bin", "core.bin"};
    for (size_t i = 0; i < 2; i++) {
        char bad[600], path[700];
        snprintf(bad, sizeof bad, "%s-shrink%zu", dir, i);
        CHECK(sh("cp -r '%s' '%s'", dir, bad) == 0);
        snprintf(path, sizeof path, "%s/%s", bad, files[i]);
        sl_model *m = NULL;
        sl_error err = {0};
        sl_model_params mp = {.n_threads = 1};
        CHECK(sl_model_load(bad, &mp, &m, &err) == SL_OK);
        if (!m) continue;
        CHECK(run(m, NULL, &err) == SL_OK);
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && truncate(path, sb.st_size / 2) == 0);
        CHECKF(run(m, NULL, &err) == SL_ERR_IO && strstr(err.msg, files[i]) &&
                   strstr(err.msg, "shrank"),
               "%s", err.msg);
        sl_model_free(m);
    }
    /* The same for a Qwen4-Exp n-gram table, mapped. */
    const char *q = fixture_pack("qwen4_exp_b", SL_QUANT_INT8, "s");
    if (!q) {
        CHECK(0);
        return;
    }
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1};
    CHECK(sl_model_load(q, &mp, &m, &err) == SL_OK);
    char path[700];
    snprintf(path, sizeof path, "%s/ngram-%03d.bin", q, m ? q4_mod(m)->ples[0].table.hdr.layer : 0);
    CHECK(m && run(m, NULL, &err) == SL_OK);
    CHECK(truncate(path, 4096 + 100) == 0);
    CHECKF(m && run(m, NULL, &err) == SL_ERR_IO && strstr(err.msg, "ngram-") &&
               strstr(err.msg, "shrank"),
           "%s", err.msg);
    sl_model_free(m);
}

/* Packing over a pack that a model has mapped: the files are replaced by rename, never
 * truncated, so the loaded model keeps computing the same logits from the old files. */
TEST(test_repack_in_place_under_a_loaded_model) {
    const char *dir = fixture_pack("qwen3_gqa_untied", SL_QUANT_INT8, "r");
    if (!dir) {
        CHECK(0);
        return;
    }
    char path[700], src[600];
    snprintf(path, sizeof path, "%s/experts-000.bin", dir);
    snprintf(src, sizeof src, "%s/qwen3_gqa_untied", test_fixtures);
    struct stat before, after;
    CHECK(stat(path, &before) == 0);
    sl_model *m = NULL;
    sl_error err = {0};
    sl_model_params mp = {.n_threads = 1};
    CHECK(sl_model_load(dir, &mp, &m, &err) == SL_OK);
    if (!m) return;
    const int32_t V = m->cfg.vocab_size;
    float *a = malloc((size_t)N_IDS * (size_t)V * sizeof(float));
    float *b = malloc((size_t)N_IDS * (size_t)V * sizeof(float));
    CHECK(run(m, a, &err) == SL_OK);
    sl_pack_params p = {.quant = SL_QUANT_INT4, .force = 1}; /* other sizes, other bytes */
    CHECKF(sl_pack(src, dir, &p, &err) == SL_OK, "%s", err.msg);
    CHECK(stat(path, &after) == 0 && after.st_ino != before.st_ino);
    CHECKF(run(m, b, &err) == SL_OK, "%s", err.msg);
    CHECK(!memcmp(a, b, (size_t)N_IDS * (size_t)V * sizeof(float)));
    sl_model_free(m);
    CHECK(sl_verify(dir, NULL, NULL, &err) == SL_OK);
    snprintf(path, sizeof path, "%s/core.bin.tmp", dir);
    CHECK(access(path, F_OK) != 0); /* nothing left behind */
    free(a), free(b);
}

/* A streamed blob read in parts by several reader threads, each part summed apart and the
 * sums joined: every expert of the default model arrives whole and checked, with O_DIRECT
 * too (where the filesystem has it), and a part's error fails the blob. */
TEST(test_stream_reads_in_parts) {
    const char *dir = "models/kjv-moe"; /* 159744-byte blobs: 3 parts of 53248 */
    uint8_t moe[4] = {1, 1, 1, 1};
    for (int direct = 0; direct < 2; direct++) {
        sl_expert_store s;
        sl_error err = {0};
        sl_store_params p = {.mode = SL_EXPERTS_STREAM,
                             .cache_experts = 8,
                             .min_slots = 2,
                             .io_threads = 3,
                             .direct_io = direct,
                             .read_part = 40960};
        sl_status st = sl_experts_open_packed(&s, dir, 4, moe, 8, 256, 192, &p, &err);
        if (st && direct && strstr(err.msg, "O_DIRECT")) { /* not on this filesystem */
            sl_experts_free(&s);
            continue;
        }
        CHECKF(st == SL_OK, "%s", err.msg);
        const sl_expert_layer *L = &s.layers[1];
        CHECK(st || (L->n_parts == 3 && L->part_bytes == 53248 && L->crc));
        int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const sl_expert *out[8];
        CHECKF(st || sl_experts_fetch(&s, 1, ids, 8, out, &err) == SL_OK, "%s", err.msg);
        char path[600];
        snprintf(path, sizeof path, "%s/experts-001.bin", dir);
        int fd = open(path, O_RDONLY);
        uint8_t *want = malloc(L->hdr.blob_bytes ? L->hdr.blob_bytes : 1);
        for (int32_t e = 0; !st && e < 8; e++) {
            const uint8_t *got =
                L->slot_mem + (uint64_t)sl_slot_lookup(&L->slots, e) * L->hdr.blob_bytes;
            CHECK(pread(fd, want, L->hdr.blob_bytes,
                        (off_t)(L->hdr.data_offset + e * L->hdr.blob_bytes)) ==
                  (ssize_t)L->hdr.blob_bytes);
            CHECKF(!memcmp(got, want, L->hdr.blob_bytes), "expert %d (direct %d) differs", e,
                   direct);
        }
        close(fd);
        free(want);
        /* a wrong sum for one expert: its blob fails, named, and is not cached */
        if (!st) {
            sl_experts_free(&s);
            CHECK(sl_experts_open_packed(&s, dir, 4, moe, 8, 256, 192, &p, &err) == SL_OK);
            s.layers[1].crc[5] ^= 1;
            CHECK(sl_experts_fetch(&s, 1, (int32_t[]){4, 5}, 2, out, &err) == SL_ERR_FORMAT &&
                  strstr(err.msg, "layer 1, expert 5") &&
                  sl_slot_lookup(&s.layers[1].slots, 5) < 0 &&
                  sl_slot_lookup(&s.layers[1].slots, 4) >= 0);
        }
        sl_experts_free(&s);
    }
}

/* sl_read_full with an alignment on a plain descriptor: the bounce path serves unaligned
 * offsets, lengths and buffers exactly (O_DIRECT's short reads: tests/fault). */
TEST(test_read_full_aligned_bounce) {
    char path[600];
    snprintf(path, sizeof path, "%s/bytes.bin", test_tmpdir());
    const size_t n = 3 * 4096 + 1234;
    uint8_t *data = malloc(n), *got = aligned_alloc(4096, 4 * 4096 + 8192);
    uint8_t *bounce = aligned_alloc(4096, 8192);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 131 + 7);
    CHECK(test_write_file(path, data, n) == 0);
    int fd = open(path, O_RDONLY);
    const struct {
        uint64_t off, len;
        size_t dst;
    } c[] = {{0, 4096, 0}, {100, 5000, 0},      {4095, 2, 4096},
             {0, n, 1},    {4096, n - 4096, 0}, {7, 1, 3}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        memset(got, 0xcd, 4 * 4096 + 8192);
        int r = sl_read_full(fd, got + c[i].dst, c[i].len, c[i].off, 4096, bounce, 8192);
        CHECKF(r == 0 && !memcmp(got + c[i].dst, data + c[i].off, (size_t)c[i].len), "case %zu: %d",
               i, r);
        CHECKF(c[i].dst == 0 || got[c[i].dst - 1] == 0xcd, "case %zu wrote before dst", i);
        CHECKF(got[c[i].dst + c[i].len] == 0xcd, "case %zu wrote past the end", i);
    }
    CHECK(sl_read_full(fd, got, 100, n - 50, 4096, bounce, 8192) == SL_READ_SHORT);
    CHECK(sl_read_full(fd, got, 100, n - 50, 0, NULL, 0) == SL_READ_SHORT);
    close(fd);
    free(data), free(got), free(bounce);
}
