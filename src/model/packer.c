/*
 * sl_pack: Hugging Face checkpoint or GGUF file -> packed directory (a GGUF's block types kept,
 * bytes copied, never quantised twice); sl_verify: a packed directory against
 * its manifest and its own checksums; sl_pack_convert: a pack rewritten at another format
 * version (sluice verify --upgrade adds checksums to a version-1 pack).
 *
 * Packing streams: the source stays memory-mapped, each tensor is converted
 * row by row and written out at once, so memory use is one tensor's scales
 * plus one expert blob, whatever the model's size.
 *
 * Every file is written under NAME.tmp, synced, and renamed over NAME: a file that a running
 * model has mapped is never truncated or rewritten (it keeps the old inode), and a crash
 * leaves either the old file or the new one. The manifest goes last.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat/genconfig.h"
#include "core/crc32c.h"
#include "format/gguf.h"
#include "format/pack.h"
#include "kernels/blocks.h"
#include "kernels/fp8.h"
#include "kernels/quant.h"
#include "families/qwen4_exp/qwen4_exp.h"
#include "model/model.h"
#include "model/gguf_ckpt.h"
#include "model/packer.h"
#include "tokenizer/tokenizer.h"

/* ------------------------------------------------------------- writer */

/* A pack file being written: NAME.tmp, at explicit offsets (a header holding its contents'
 * checksums is written last), renamed over NAME by hw_commit. crc runs over what hw_put
 * writes (never padding), for callers that checksum a region. */
typedef struct hwriter {
    int fd;
    uint64_t off;
    uint32_t crc;
    int failed; /* errno of the first failed write */
    int keep;   /* hw_commit leaves NAME.tmp for the caller to rename */
    char path[4096], tmp[4200];
} hwriter;

static sl_status hw_open(hwriter *w, const char *path, sl_error *err) {
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    unlink(w->tmp); /* left by an interrupted run */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) return sl_fail(err, SL_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    return SL_OK;
}

static void hw_pwrite(hwriter *w, const void *p, size_t n, uint64_t off) {
    const uint8_t *b = p;
    while (n && !w->failed) {
        ssize_t r = pwrite(w->fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            w->failed = r < 0 ? errno : EIO;
            break;
        }
        b += r, n -= (size_t)r, off += (uint64_t)r;
    }
}

static void hw_put(hwriter *w, const void *p, size_t n) {
    if (!n) return;
    hw_pwrite(w, p, n, w->off);
    w->crc = sl_crc32c(w->crc, p, n);
    w->off += n;
}

static void hw_pad_to(hwriter *w, uint64_t off) {
    static const uint8_t zeros[4096];
    while (w->off < off) {
        const size_t n = (size_t)SL_MIN(off - w->off, sizeof zeros);
        hw_pwrite(w, zeros, n, w->off);
        w->off += n;
    }
}

static void hw_abort(hwriter *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    unlink(w->tmp);
}

static sl_status sha256_file(const char *path, char hex[65], uint64_t *size, sl_error *err);

/* Syncs and closes NAME.tmp, hashes it (hex, size) and renames it over NAME (unless keep). */
static sl_status hw_commit(hwriter *w, char hex[65], uint64_t *size, sl_error *err) {
    if (!w->failed && fsync(w->fd) != 0) w->failed = errno;
    if (close(w->fd) != 0 && !w->failed) w->failed = errno ? errno : EIO;
    w->fd = -1;
    sl_status st = SL_OK;
    if (w->failed)
        st = sl_fail(err, SL_ERR_IO, "%s: write failed: %s", w->tmp, strerror(w->failed));
    if (!st) st = sha256_file(w->tmp, hex, size, err);
    if (!st && !w->keep && rename(w->tmp, w->path) != 0)
        st = sl_fail(err, SL_ERR_IO, "%s: %s", w->path, strerror(errno));
    if (st) unlink(w->tmp);
    return st;
}

/* The renames themselves are durable once the directory is synced. */
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* ----------------------------------------------------------- hashing */

typedef struct sha_ctx {
    EVP_MD_CTX *md;
} sha_ctx;

static int sha_init(sha_ctx *c) {
    c->md = EVP_MD_CTX_new();
    return c->md && EVP_DigestInit_ex(c->md, EVP_sha256(), NULL);
}

static void sha_hex(sha_ctx *c, char hex[65]) {
    unsigned char d[32];
    unsigned int dn = 0;
    EVP_DigestFinal_ex(c->md, d, &dn);
    EVP_MD_CTX_free(c->md);
    c->md = NULL;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* Reads [off, off + n) of fd into buf, hashing it into sha (if not NULL). */
static sl_status read_hashed(int fd, const char *path, uint8_t *buf, size_t n, uint64_t off,
                             sha_ctx *sha, sl_error *err) {
    const int r = sl_read_full(fd, buf, n, off, 0, NULL, 0);
    if (r)
        return sl_fail(err, r == SL_READ_SHORT ? SL_ERR_FORMAT : SL_ERR_IO, "%s: %s", path,
                       r == SL_READ_SHORT ? "short read (file truncated?)" : strerror(r));
    if (sha) EVP_DigestUpdate(sha->md, buf, n);
    return SL_OK;
}

static sl_status sha256_file(const char *path, char hex[65], uint64_t *size, sl_error *err) {
    int fd = sl_open_regular(path, O_RDONLY, size, err);
    if (fd < 0) return SL_ERR_IO;
    sha_ctx sha = {0};
    const size_t chunk = (size_t)1 << 20;
    uint8_t *buf = malloc(chunk);
    sl_status st = buf && sha_init(&sha) ? SL_OK : sl_fail(err, SL_ERR_NOMEM, "out of memory");
    for (uint64_t off = 0; !st && off < *size; off += chunk)
        st = read_hashed(fd, path, buf, (size_t)SL_MIN(chunk, *size - off), off, &sha, err);
    if (sha.md) sha_hex(&sha, hex);
    free(buf);
    close(fd);
    return st;
}

/* ------------------------------------------------------ conversion */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* What a float tensor becomes in the pack. */
static sl_dtype target_dtype(const sl_tensor *t, const sl_pack_params *p) {
    if (t->dtype == SL_DTYPE_I64 || p->quant == SL_QUANT_KEEP) return t->dtype;
    const int is_router = ends_with(t->name, "mlp.gate.weight") ||
                          ends_with(t->name, ".router.weight") ||
                          ends_with(t->name, "shared_expert_gate.weight") ||
                          ends_with(t->name, ".router.proj.weight"); /* Gemma 4 */
    if (t->ndim == 2 && p->quant != SL_QUANT_BF16 && (!is_router || p->quant_router))
        return p->quant == SL_QUANT_INT8 ? SL_DTYPE_Q8 : SL_DTYPE_Q4;
    if (t->ndim == 1) return t->dtype; /* norms and biases stay exact */
    return t->dtype == SL_DTYPE_F32 ? SL_DTYPE_BF16 : t->dtype;
}

/* Row n of K elements of t as floats: widened, or dequantised (FP8 block scales, ggml blocks:
 * MXFP4 experts quantised again). */
static void widen_row(const sl_tensor *t, int64_t n, int64_t K, float *row) {
    if (sl_tensor_is_fp8(t))
        sl_dequant_fp8_row(t, n, row);
    else if (sl_dtype_is_block(t->dtype))
        sl_dequant_row(t->dtype, (const uint8_t *)t->data + (size_t)n * sl_row_bytes(t->dtype, K),
                       row, K);
    else
        sl_to_f32(row, t->data, t->dtype, (size_t)(n * K), (size_t)K);
}

/* Converts rows [0, N) of a 2-D float tensor (or any other one, flat) into dt, writing data
 * and collecting scales/biases into sc/bi. row: scratch of K floats, qrow: row_bytes. */
static void convert_rows(hwriter *w, const sl_tensor *t, sl_dtype dt, float *row, uint8_t *qrow,
                         uint16_t *sc, uint16_t *bi) {
    const int64_t N = t->ndim == 2 ? t->shape[0] : 1;
    /* 1-D and 3-D tensors (a conv weight [C, 1, K]) are written flat, all elements. */
    const int64_t K = t->ndim == 2 ? t->shape[1] : (int64_t)(t->nbytes / sl_dtype_size(t->dtype));
    const int64_t G = sl_qgroups(K);
    for (int64_t n = 0; n < N; n++) {
        widen_row(t, n, K, row);
        if (sl_dtype_is_quant(dt)) {
            sl_quantize_row(dt, row, K, qrow, sc + n * G, bi + n * G);
            hw_put(w, qrow, sl_row_bytes(dt, K));
        } else if (dt == t->dtype) {
            hw_put(w, (const uint8_t *)t->data + (size_t)(n * K) * sl_dtype_size(dt),
                   (size_t)K * sl_dtype_size(dt));
        } else { /* F32 -> BF16 */
            uint16_t *h = (uint16_t *)qrow;
            for (int64_t k = 0; k < K; k++)
                h[k] = sl_f32_to_bf16(row[k]);
            hw_put(w, h, (size_t)K * 2);
        }
    }
}

/* Same conversion into a memory buffer (expert blobs), rows split across threads.
 * rows: omp_get_max_threads() scratch rows of at least K floats each. */
static void convert_matrix_mem(const sl_tensor *t, sl_dtype dt, uint8_t *data, uint16_t *sc,
                               uint16_t *bi, float *rows, int64_t row_cap) {
    const int64_t N = t->shape[0], K = t->shape[1], G = sl_qgroups(K);
    const size_t rb = sl_row_bytes(dt, K);
    if (dt == t->dtype) { /* kept: the bytes as they are (a GGUF's block types too) */
        SL_ASSERT(t->nbytes == (size_t)N * rb);
        memcpy(data, t->data, t->nbytes);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *row = rows + (size_t)omp_get_thread_num() * (size_t)row_cap;
        widen_row(t, n, K, row);
        uint8_t *dst = data + (size_t)n * rb;
        if (sl_dtype_is_quant(dt)) {
            sl_quantize_row(dt, row, K, dst, sc + n * G, bi + n * G);
        } else if (dt == t->dtype) {
            memcpy(dst, (const uint8_t *)t->data + (size_t)n * rb, rb);
        } else {
            for (int64_t k = 0; k < K; k++)
                ((uint16_t *)dst)[k] = sl_f32_to_bf16(row[k]);
        }
    }
}

/* ------------------------------------------------------------ core.bin */

typedef struct core_item {
    const sl_tensor *src;
    sl_dtype dt;
    uint64_t off, bytes, s_off, b_off, s_bytes;
    uint32_t crc;
} core_item;

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Resident tensors: everything of the text model except routed experts and PLE n-gram
 * tables (which get files of their own). */
static int is_resident(const sl_ckpt *ck, const char *name, int32_t n_layers) {
    if (sl_ckpt_is_expert_name(name) || strstr(name, ".ngram_embedding.")) return 0;
    if (sl_ckpt_past_layers(ck, name, n_layers)) return 0; /* multi-token prediction */
    if (ends_with(name, "_scale_inv")) return 0; /* FP8 block scales: in their weight's values */
    return strncmp(name, ck->prefix, strlen(ck->prefix)) == 0 || strcmp(name, ck->head) == 0;
}

/* Version 2: the header checksum of a core image's [0, data_offset), written into it. */
static void seal_core_header(uint8_t *hdr, size_t n) {
    put_le(hdr + SL_CORE_HEADER_CRC, sl_pack_header_crc(hdr, n, SL_CORE_HEADER_CRC), 4);
}

static sl_status write_core(const sl_model *m, const char *path, const sl_pack_params *p,
                            char hex[65], uint64_t *size, sl_error *err) {
    const sl_ckpt *ck = &m->ck;
    core_item *items = calloc((size_t)ck->n_entries + 1, sizeof *items);
    if (!items) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    int32_t n = 0;
    int64_t max_k = 1, max_sc = 1;
    for (int32_t i = 0; i < ck->n_entries; i++) {
        const sl_tensor *t = ck->entries[i].t;
        if (!is_resident(ck, t->name, m->cfg.n_layers)) continue;
        if (strlen(t->name) >= SL_CORE_NAME || t->ndim < 1 || t->ndim > 4) {
            free(items);
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "tensor '%s': name too long or rank %d not "
                           "packable",
                           t->name, t->ndim);
        }
        /* block types (a GGUF's) only as they are, and as matrices */
        const int block_ok =
            sl_dtype_is_block(t->dtype) && p->quant == SL_QUANT_KEEP && t->ndim == 2;
        if (t->dtype != SL_DTYPE_F32 && t->dtype != SL_DTYPE_F16 && t->dtype != SL_DTYPE_BF16 &&
            t->dtype != SL_DTYPE_I64 && !block_ok && !(sl_tensor_is_fp8(t) && t->ndim == 2)) {
            free(items);
            return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s cannot be packed",
                           sl_ckpt_path(ck, &ck->entries[i]), t->name, sl_dtype_name(t->dtype));
        }
        core_item *it = &items[n++];
        it->src = t;
        it->dt = target_dtype(t, p);
        if (t->dtype == SL_DTYPE_I64) it->dt = SL_DTYPE_I64;
        const int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
        const int64_t cols =
            t->ndim == 2 ? t->shape[1] : (int64_t)(t->nbytes / sl_dtype_size(t->dtype));
        it->bytes = sl_dtype_is_quant(it->dt) || sl_dtype_is_block(it->dt)
                        ? (uint64_t)rows * sl_row_bytes(it->dt, cols)
                        : (uint64_t)rows * (uint64_t)cols * sl_dtype_size(it->dt);
        it->s_bytes =
            sl_dtype_is_quant(it->dt) ? (uint64_t)rows * (uint64_t)sl_qgroups(cols) * 2 : 0;
        max_k = SL_MAX(max_k, cols);
        max_sc = SL_MAX(max_sc, (int64_t)it->s_bytes);
    }
    uint64_t off = align_up(SL_CORE_HEADER + (uint64_t)n * SL_CORE_RECORD, SL_PACK_PAGE);
    const uint64_t data_off = off;
    for (int32_t i = 0; i < n; i++) {
        items[i].off = off;
        off = align_up(off + items[i].bytes, SL_PACK_ALIGN);
        if (items[i].s_bytes) {
            items[i].s_off = off;
            off = align_up(off + items[i].s_bytes, SL_PACK_ALIGN);
            items[i].b_off = off;
            off = align_up(off + items[i].s_bytes, SL_PACK_ALIGN);
        }
    }
    const uint64_t file_size = off;
    hwriter w;
    sl_status st = hw_open(&w, path, err);
    uint8_t *index = calloc(1, (size_t)data_off);
    float *row = malloc((size_t)max_k * sizeof(float));
    uint8_t *qrow = malloc((size_t)max_k * 4 + 16);
    uint16_t *sc = malloc((size_t)max_sc), *bi = malloc((size_t)max_sc);
    if (!st && (!index || !row || !qrow || !sc || !bi))
        st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    /* The tensors first, their checksums collected; the header and index last, at 0. */
    for (int32_t i = 0; !st && i < n; i++) {
        core_item *it = &items[i];
        hw_pad_to(&w, it->off);
        w.crc = 0;
        if (it->dt == it->src->dtype) { /* I64, or kept as it is */
            SL_ASSERT(it->src->nbytes == it->bytes);
            hw_put(&w, it->src->data, it->src->nbytes);
        } else {
            convert_rows(&w, it->src, it->dt, row, qrow, sc, bi);
        }
        if (it->s_bytes) {
            hw_pad_to(&w, it->s_off);
            hw_put(&w, sc, it->s_bytes);
            hw_pad_to(&w, it->b_off);
            hw_put(&w, bi, it->s_bytes);
        }
        it->crc = w.crc;
        if (p->progress) p->progress(p->progress_user, "pack core", i + 1, n);
    }
    if (!st) {
        hw_pad_to(&w, file_size);
        uint8_t *hdr = index;
        memcpy(hdr, "SLUICE\0C", 8);
        put_le(hdr + 8, SL_PACK_VERSION, 4);
        put_le(hdr + 12, (uint64_t)n, 4);
        put_le(hdr + 16, data_off, 8);
        put_le(hdr + 24, file_size, 8);
        for (int32_t i = 0; i < n; i++) {
            uint8_t *r = index + SL_CORE_HEADER + (size_t)i * SL_CORE_RECORD;
            const sl_tensor *t = items[i].src;
            memcpy(r, t->name, strlen(t->name));
            r[160] = sl_pack_dtype_code(items[i].dt);
            r[161] = (uint8_t)t->ndim;
            for (int d = 0; d < t->ndim; d++)
                put_le(r + 168 + 8 * d, (uint64_t)t->shape[d], 8);
            put_le(r + 200, items[i].off, 8);
            put_le(r + 208, items[i].bytes, 8);
            put_le(r + 216, items[i].s_off, 8);
            put_le(r + 224, items[i].b_off, 8);
            put_le(r + SL_CORE_RECORD_CRC, items[i].crc, 4);
        }
        seal_core_header(index, (size_t)data_off);
        hw_pwrite(&w, index, (size_t)data_off, 0);
        st = hw_commit(&w, hex, size, err);
    } else if (w.fd >= 0) {
        hw_abort(&w);
    }
    free(index), free(row), free(qrow), free(sc), free(bi), free(items);
    return st;
}

/* ------------------------------------------------------ experts-LLL.bin */

/* Layer l's experts, each fetched from the store on its own (a store that lays its experts
 * out as it reads them streams: memory holds a few blobs, not the layer). */
static sl_status write_experts(sl_model *m, int32_t l, const char *path, const sl_pack_params *p,
                               char hex[65], uint64_t *size, sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_expert *ex0;
    const int32_t zero = 0;
    sl_status st = sl_experts_fetch(&m->experts, l, &zero, 1, &ex0, err);
    if (st) return st;
    sl_experts_header h = {.version = SL_PACK_VERSION,
                           .layer = (uint32_t)l,
                           .n_experts = (uint32_t)c->n_experts,
                           .hidden = (uint32_t)c->hidden_size,
                           .inter = (uint32_t)c->moe_intermediate_size,
                           .bias_dtype =
                               ex0->gate_bias.data ? ex0->gate_bias.dtype : SL_DTYPE_NONE};
    /* Each matrix its own type (a GGUF's down_proj is often of another type than gate and
     * up), the same for every expert of the layer. */
    const sl_tensor first_t[3] = {ex0->gate, ex0->up, ex0->down};
    const sl_tensor *first[3] = {&first_t[0], &first_t[1], &first_t[2]};
    for (int k = 0; k < 3; k++)
        h.dtype[k] = p->quant == SL_QUANT_INT8         ? SL_DTYPE_Q8
                     : p->quant == SL_QUANT_INT4       ? SL_DTYPE_Q4
                     : p->quant == SL_QUANT_KEEP       ? first[k]->dtype
                     : first[k]->dtype == SL_DTYPE_F32 ? SL_DTYPE_BF16
                                                       : first[k]->dtype;
    sl_experts_layout(&h);
    uint8_t *blob = malloc(SL_MAX(h.blob_bytes, h.data_offset));
    uint32_t *crc = calloc(h.n_experts, sizeof(uint32_t));
    const int64_t row_cap = SL_MAX(h.hidden, h.inter);
    float *row = malloc((size_t)omp_get_max_threads() * (size_t)row_cap * sizeof(float));
    if (!blob || !row || !crc) {
        free(blob), free(row), free(crc);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory for an expert blob");
    }
    hwriter w;
    st = hw_open(&w, path, err);
    if (!st) {
        /* The blobs first, at their places; the header with their checksums last. */
        hw_pad_to(&w, h.data_offset);
        for (int32_t e = 0; !st && e < c->n_experts; e++) {
            memset(blob, 0, h.blob_bytes);
            const sl_expert *ex;
            if ((st = sl_experts_fetch(&m->experts, l, &e, 1, &ex, err))) break;
            const sl_tensor *src[3] = {&ex->gate, &ex->up, &ex->down};
            const sl_tensor *bsrc[3] = {&ex->gate_bias, &ex->up_bias, &ex->down_bias};
            for (int which = 0; which < 3 && h.bias_dtype != SL_DTYPE_NONE; which++) {
                /* linear biases as they are: a few floats an expert */
                const sl_tensor v = sl_expert_bias(&h, blob, which);
                SL_ASSERT(bsrc[which]->dtype == h.bias_dtype && bsrc[which]->nbytes == v.nbytes);
                memcpy((void *)v.data, bsrc[which]->data, v.nbytes);
            }
            for (int which = 0; which < 3; which++) {
                if (src[which]->dtype != first[which]->dtype) {
                    st = sl_fail(err, SL_ERR_UNSUPPORTED,
                                 "layer %d expert %d: %s is %s, expert 0's is %s (a layer's "
                                 "experts share their types)",
                                 l, e, src[which]->name, sl_dtype_name(src[which]->dtype),
                                 sl_dtype_name(first[which]->dtype));
                    break;
                }
                sl_tensor v = sl_expert_matrix(&h, blob, which);
                convert_matrix_mem(src[which], h.dtype[which], (uint8_t *)v.data,
                                   (uint16_t *)v.scales, (uint16_t *)v.biases, row, row_cap);
            }
            crc[e] = sl_crc32c(0, blob, h.blob_bytes);
            hw_put(&w, blob, h.blob_bytes);
        }
        sl_experts_header_write(&h, crc, blob);
        hw_pwrite(&w, blob, (size_t)h.data_offset, 0);
        if (!st)
            st = hw_commit(&w, hex, size, err);
        else
            hw_abort(&w);
    }
    free(blob), free(row), free(crc);
    return st;
}

/* ------------------------------------------------------- ngram-LLL.bin */

/* Layer l's n-gram table, rows back to back after a header page: quantised like the rest of
 * the pack (each row with its own scales and biases), or BF16 (F32 becomes BF16); each row
 * ends in its CRC32C. */
static sl_status write_ngram(const sl_model *m, int32_t l, const char *path,
                             const sl_pack_params *p, char hex[65], uint64_t *size, sl_error *err) {
    const sl_ngram_table *tb = q4_ngram_table(m, l);
    const sl_dtype dt = p->quant == SL_QUANT_INT8   ? SL_DTYPE_Q8
                        : p->quant == SL_QUANT_INT4 ? SL_DTYPE_Q4
                        : p->quant == SL_QUANT_KEEP ? tb->dtype
                        : tb->dtype == SL_DTYPE_F32 ? SL_DTYPE_BF16
                                                    : tb->dtype;
    sl_ngram_header h = {.version = SL_PACK_VERSION,
                         .layer = (uint32_t)l,
                         .dtype = dt,
                         .dim = (uint32_t)tb->dim,
                         .rows = (uint64_t)tb->rows};
    sl_ngram_layout(&h);
    uint8_t *page = calloc(1, SL_PACK_PAGE);
    float *row = malloc((size_t)tb->dim * sizeof(float));
    uint8_t *out = calloc(1, (size_t)h.row_bytes + (size_t)tb->dim * 4);
    hwriter w;
    sl_status st = !page || !row || !out ? sl_fail(err, SL_ERR_NOMEM, "out of memory")
                                         : hw_open(&w, path, err);
    if (!st) {
        sl_ngram_header_write(&h, page);
        hw_put(&w, page, SL_PACK_PAGE);
        const size_t cb = sl_ngram_codes_bytes(dt, h.dim);
        const int64_t G = sl_qgroups(tb->dim);
        for (int32_t i = 0; i < tb->n_parts; i++) {
            const sl_tensor *t = &tb->parts[i];
            const size_t src_row = (size_t)tb->dim * sl_dtype_size(t->dtype);
            for (int64_t r = 0; r < t->shape[0]; r++) {
                memset(out, 0, (size_t)h.row_bytes);
                if (t->dtype == dt) { /* kept as it is */
                    memcpy(out, (const uint8_t *)t->data + (size_t)r * src_row, src_row);
                } else {
                    sl_to_f32(row, t->data, t->dtype, (size_t)(r * tb->dim), (size_t)tb->dim);
                    if (sl_dtype_is_quant(dt)) { /* [codes | pad | scales | biases] */
                        uint16_t *sc = (uint16_t *)(out + cb);
                        sl_quantize_row(dt, row, tb->dim, out, sc, sc + G);
                    } else {
                        for (int32_t k = 0; k < tb->dim; k++)
                            ((uint16_t *)out)[k] = sl_f32_to_bf16(row[k]);
                    }
                }
                sl_ngram_row_seal(&h, out);
                hw_put(&w, out, (size_t)h.row_bytes);
            }
        }
        st = hw_commit(&w, hex, size, err);
    }
    free(page), free(row), free(out);
    return st;
}

/* -------------------------------------------------------------- pack */

static const char *const extra_files[] = {"tokenizer.json", "tokenizer_config.json",
                                          "generation_config.json", "chat_template.jinja",
                                          "special_tokens_map.json"};

static sl_status copy_file(const char *from, const char *to, char hex[65], uint64_t *size,
                           sl_error *err) {
    char *buf = NULL;
    size_t n = 0;
    sl_status st = sl_read_file(from, &buf, &n, err);
    if (st) return st;
    hwriter w;
    if (!(st = hw_open(&w, to, err))) {
        hw_put(&w, buf, n);
        st = hw_commit(&w, hex, size, err);
    }
    free(buf);
    return st;
}

static json_t *file_entry(const char *name, uint64_t size, const char *hex) {
    return json_pack("{s:s, s:I, s:s}", "name", name, "bytes", (json_int_t)size, "sha256", hex);
}

/* 1 if the directory holds nothing but "." and "..". */
static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* 1 if the canonical path a lies strictly inside the canonical directory b. */
static int path_inside(const char *a, const char *b) {
    size_t n = strlen(b);
    if (n == 1) return a[1] != '\0'; /* b is "/" */
    return strncmp(a, b, n) == 0 && a[n] == '/';
}

/* Makes out_dir ready for a pack of src_dir (which exists): created if absent (*created),
 * else refused when it is not empty and force is off. Never the source, inside it or around
 * it, even with force: the pack would overwrite or mix with the checkpoint. Paths are
 * compared after realpath, so "m/", "./m" and a symbolic link to m are all m. */
static sl_status prepare_out_dir(const char *src_dir, const char *out_dir, int32_t force,
                                 int *created, sl_error *err) {
    char src[PATH_MAX], out[PATH_MAX];
    struct stat sb;
    *created = 0;
    if (stat(out_dir, &sb) != 0) {
        if (mkdir(out_dir, 0755) != 0)
            return sl_fail(err, SL_ERR_IO, "%s: %s", out_dir, strerror(errno));
        *created = 1;
    } else if (!S_ISDIR(sb.st_mode)) {
        return sl_fail(err, SL_ERR_ARG, "%s exists and is not a directory: give OUT a new name",
                       out_dir);
    }
    sl_status st = SL_OK;
    if (!realpath(src_dir, src) || !realpath(out_dir, out))
        st = sl_fail(err, SL_ERR_IO, "%s: %s", realpath(src_dir, src) ? out_dir : src_dir,
                     strerror(errno));
    else if (!strcmp(src, out))
        st = sl_fail(err, SL_ERR_ARG,
                     "%s is the checkpoint being packed: give OUT a directory of its own, e.g. "
                     "%s-pack",
                     out_dir, src);
    else if (path_inside(out, src))
        st = sl_fail(err, SL_ERR_ARG,
                     "%s is inside the checkpoint %s: give OUT a directory outside it", out_dir,
                     src_dir);
    else if (path_inside(src, out))
        st = sl_fail(err, SL_ERR_ARG,
                     "%s holds the checkpoint %s: give OUT a directory that does not contain it",
                     out_dir, src_dir);
    else if (!*created && !force && !dir_is_empty(out_dir))
        st = sl_fail(err, SL_ERR_ARG,
                     "%s is not empty: give OUT a new or empty directory, or --force to write "
                     "the pack over what is there",
                     out_dir);
    if (st && *created) rmdir(out_dir);
    return st;
}

/* --quant on a GGUF whose weights are ggml block types: refused, naming one (quantising
 * again would compound two roundings; F32/F16/BF16 GGUFs quantise as a checkpoint does). */
static sl_status refuse_requant(const sl_model *m, const char *src, sl_quant q, sl_error *err) {
    static const char *qnames[] = {"bf16", "int8", "int4"};
    for (int32_t i = 0; i < m->ck.n_entries; i++) {
        const sl_ckpt_entry *e = &m->ck.entries[i];
        if (!sl_dtype_is_block(e->t->dtype)) continue;
        return sl_fail(err, SL_ERR_ARG,
                       "%s: the weights are already quantised (tensor '%s' is %s): a GGUF is "
                       "packed with its types kept, bytes as they are; drop --quant %s (a GGUF "
                       "is never quantised twice)",
                       src, e->label, sl_dtype_name(e->t->dtype), qnames[q]);
    }
    return SL_OK;
}

/* A file of the pack written from memory, listed in files. */
static sl_status put_text_file(const char *dir, const char *name, const char *text, size_t n,
                               json_t *files, sl_error *err) {
    char path[4096], hex[65];
    uint64_t size = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hwriter w;
    sl_status st = hw_open(&w, path, err);
    if (!st) {
        hw_put(&w, text, n);
        st = hw_commit(&w, hex, &size, err);
    }
    if (!st) json_array_append_new(files, file_entry(name, size, hex));
    return st;
}

/* A JSON document as a pack file (json_dumps; doc is the caller's). */
static sl_status put_json_file(const char *dir, const char *name, const json_t *doc, json_t *files,
                               sl_error *err) {
    char *text = json_dumps(doc, JSON_INDENT(1));
    sl_status st = text ? put_text_file(dir, name, text, strlen(text), files, err)
                        : sl_fail(err, SL_ERR_NOMEM, "%s/%s: out of memory", dir, name);
    free(text);
    return st;
}

/* What a GGUF's metadata holds besides the weights, as the files a pack of a Hugging Face
 * checkpoint has: tokenizer.json (the document tokenizer_gguf.c builds from tokenizer.ggml.*,
 * so the pack tokenizes as the GGUF does), chat_template.jinja (tokenizer.chat_template) and
 * generation_config.json (eos and bos ids, sampling defaults: sl_gen_config_from_gguf). What
 * the metadata lacks is left out, as a checkpoint's missing file is. */
static sl_status write_gguf_extras(const char *src, const char *dir, json_t *files, sl_error *err) {
    sl_gguf_file f = {0};
    sl_status st = sl_gguf_open(&f, src, err);
    if (!st && (sl_gguf_find_kv(&f, "tokenizer.ggml.tokens") ||
                sl_gguf_find_kv(&f, "tokenizer.huggingface.json"))) {
        json_t *doc = NULL;
        if (!(st = sl_tokenizer_json_from_gguf(&f, &doc, err)))
            st = put_json_file(dir, "tokenizer.json", doc, files, err);
        json_decref(doc);
    }
    if (!st && sl_gguf_find_kv(&f, "tokenizer.chat_template")) {
        sl_gguf_str t;
        if (!(st = sl_gguf_get_str(&f, "tokenizer.chat_template", &t, err)))
            st = put_text_file(dir, "chat_template.jinja", t.s, (size_t)t.len, files, err);
    }
    sl_gen_config g;
    if (!st) st = sl_gen_config_from_gguf(&f, &g, err);
    if (!st && (g.n_eos || g.bos >= 0 || g.temperature >= 0 || g.top_p >= 0 || g.min_p >= 0 ||
                g.top_k >= 0)) {
        json_t *o = json_object(), *eos = json_array();
        for (int32_t i = 0; o && eos && i < g.n_eos; i++)
            json_array_append_new(eos, json_integer(g.eos[i]));
        if (o && eos && g.n_eos) json_object_set(o, "eos_token_id", eos);
        if (o && g.bos >= 0) json_object_set_new(o, "bos_token_id", json_integer(g.bos));
        const struct {
            const char *key;
            float v;
        } fl[] = {{"temperature", g.temperature}, {"top_p", g.top_p}, {"min_p", g.min_p}};
        for (size_t k = 0; o && k < sizeof fl / sizeof fl[0]; k++)
            if (fl[k].v >= 0) json_object_set_new(o, fl[k].key, json_real(fl[k].v));
        if (o && g.top_k >= 0) json_object_set_new(o, "top_k", json_integer(g.top_k));
        st = o && eos ? put_json_file(dir, "generation_config.json", o, files, err)
                      : sl_fail(err, SL_ERR_NOMEM, "out of memory");
        json_decref(o);
        json_decref(eos);
    }
    sl_gguf_close(&f);
    return st;
}

/* A JSON file, read as a regular file (sl_read_file). */
static json_t *load_json(const char *path, sl_error *err) {
    char *text = NULL;
    size_t n = 0;
    if (sl_read_file(path, &text, &n, err)) return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    free(text);
    if (!root) sl_fail(err, SL_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    return root;
}

/* The manifest, last: every file it lists is renamed into place and the directory synced
 * before it lands (its own tmp, fsync and rename), so a manifest never names a file that a
 * crash could still lose. */
static sl_status write_manifest(json_t *man, const char *dir, sl_error *err) {
    char path[4096], hex[65];
    uint64_t size = 0;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text = man ? json_dumps(man, JSON_INDENT(1)) : NULL;
    if (!text) return sl_fail(err, SL_ERR_NOMEM, "%s: cannot write the manifest", path);
    sync_dir(dir);
    hwriter w;
    sl_status st = hw_open(&w, path, err);
    if (!st) {
        hw_put(&w, text, strlen(text));
        st = hw_commit(&w, hex, &size, err);
    }
    free(text);
    sync_dir(dir);
    return st;
}

sl_status sl_pack(const char *src_dir, const char *out_dir, const sl_pack_params *params,
                  sl_error *err) {
    sl_pack_params p = params ? *params : (sl_pack_params){0};
    char path[4096], src[4200], hex[65];
    struct stat sb;
    int32_t src_kind = 0;
    int created = 0;
    sl_status st = sl_model_check_dir(src_dir, &src_kind, err);
    if (st) return st;
    const int gguf = src_kind == SL_MODEL_GGUF;
    if (p.quant == SL_QUANT_AUTO) p.quant = gguf ? SL_QUANT_KEEP : SL_QUANT_INT8;
    if (src_kind == SL_MODEL_PACK)
        return sl_fail(err, SL_ERR_ARG,
                       "%s is already packed: pack reads Hugging Face checkpoints; give the "
                       "checkpoint it was made from ('sluice verify --upgrade' brings an older "
                       "pack to the current format)",
                       src_dir);
    if ((st = prepare_out_dir(src_dir, out_dir, p.force, &created, err))) return st;
    sl_model_params mp = {.n_threads = 1};
    /* Experts a checkpoint stores in another layout are laid out as they are read: streamed
     * through a few slots, as write_experts fetches them one at a time, rather than all of
     * them laid out in memory at load. */
    sl_config cfg;
    sl_error cerr = {0};
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    if (src_kind == SL_MODEL_HF && sl_config_load(&cfg, path, &cerr) == SL_OK) {
        if (cfg.family && cfg.family->expert_layout) { /* the checkpoint tells (model.h) */
            sl_ckpt ck;
            if (sl_ckpt_open(&ck, src_dir, &cerr) == SL_OK)
                cfg.expert_layout = cfg.family->expert_layout(&cfg, &ck);
            sl_ckpt_close(&ck); /* what it opened, after a failure too */
        }
        if (cfg.expert_layout != SL_EXPERT_LAYOUT_DEFAULT) {
            mp.experts = SL_EXPERTS_STREAM;
            mp.cache_experts = SL_MAX(cfg.n_experts_used, 1);
        }
        sl_config_free(&cfg);
    }
    sl_model *m = NULL;
    if ((st = sl_model_load(src_dir, &mp, &m, err)) ||
        (gguf && p.quant != SL_QUANT_KEEP && (st = refuse_requant(m, src_dir, p.quant, err)))) {
        sl_model_free(m);
        if (created) rmdir(out_dir);
        return st;
    }
    /* The pack format has no FP8 type: an FP8 checkpoint is dequantised, then quantised. */
    for (int32_t i = 0; p.quant == SL_QUANT_BF16 && i < m->ck.n_entries; i++)
        if (sl_tensor_is_fp8(m->ck.entries[i].t)) {
            st = sl_fail(err, SL_ERR_UNSUPPORTED,
                         "%s: an FP8 checkpoint (tensor '%s' is F8_E4M3 with block scales) packs "
                         "with --quant int8 or --quant int4 (dequantised, then quantised); the "
                         "pack format has no FP8 type, and it runs as it is (sluice run %s)",
                         src_dir, m->ck.entries[i].label, src_dir);
            sl_model_free(m);
            if (created) rmdir(out_dir);
            return st;
        }
    /* An old manifest goes first: until the new one is written, OUT is no pack at all
     * rather than one whose manifest lists files that are being replaced. */
    snprintf(path, sizeof path, "%s/manifest.json", out_dir);
    if (unlink(path) != 0 && errno != ENOENT) {
        sl_model_free(m);
        return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    }
    json_t *files = json_array();
    uint64_t size = 0;
    snprintf(path, sizeof path, "%s/core.bin", out_dir);
    if (!(st = write_core(m, path, &p, hex, &size, err)))
        json_array_append_new(files, file_entry("core.bin", size, hex));
    json_t *layers = json_array();
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        if (!m->cfg.layer_is_moe[l]) continue;
        char name[64];
        snprintf(name, sizeof name, "experts-%03d.bin", l);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        if (!(st = write_experts(m, l, path, &p, hex, &size, err))) {
            json_t *fe = file_entry(name, size, hex);
            json_object_set_new(fe, "layer", json_integer(l));
            json_array_append_new(files, fe);
            json_array_append_new(layers, json_integer(l));
        }
        if (p.progress) p.progress(p.progress_user, "pack experts", l + 1, m->cfg.n_layers);
    }
    json_t *ple_layers = json_array();
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        if (!q4_ngram_table(m, l)) continue;
        char name[64];
        snprintf(name, sizeof name, "ngram-%03d.bin", l);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        if (!(st = write_ngram(m, l, path, &p, hex, &size, err))) {
            json_t *fe = file_entry(name, size, hex);
            json_object_set_new(fe, "ngram_layer", json_integer(l));
            json_array_append_new(files, fe);
            json_array_append_new(ple_layers, json_integer(l));
        }
        if (p.progress) p.progress(p.progress_user, "pack n-gram tables", l + 1, m->cfg.n_layers);
    }
    if (!st && gguf) st = write_gguf_extras(src_dir, out_dir, files, err);
    for (size_t i = 0; !st && !gguf && i < sizeof extra_files / sizeof extra_files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", src_dir, extra_files[i]);
        if (stat(src, &sb) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", out_dir, extra_files[i]);
        if (!(st = copy_file(src, path, hex, &size, err)))
            json_array_append_new(files, file_entry(extra_files[i], size, hex));
    }
    if (!st) {
        json_t *cfg = NULL;
        if (gguf) { /* the config.json sluice reads from the GGUF's metadata */
            char *text = NULL;
            json_error_t je;
            if (!sl_gguf_config_text(src_dir, &text, err) && !(cfg = json_loads(text, 0, &je)))
                sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", src_dir);
            free(text);
        } else {
            snprintf(path, sizeof path, "%s/config.json", src_dir);
            cfg = load_json(path, err);
        }
        static const char *qnames[] = {"bf16", "int8", "int4", "keep"};
        json_t *man =
            cfg ? json_pack("{s:s, s:i, s:s, s:s, s:b, s:i, s:o, s:o, s:o, s:o}", "format",
                            "sluice", "version", SL_PACK_VERSION, "arch", m->cfg.arch, "quant",
                            qnames[p.quant], "quant_router", p.quant_router, "group_size",
                            SL_QGROUP, "config", cfg, "moe_layers", layers, "ple_layers",
                            ple_layers, "files", files)
                : NULL;
        if (cfg) layers = files = ple_layers = NULL;
        /* Values a GGUF holds as llama.cpp's converter changed them, copied as they are: the
         * loader must read them as it reads that GGUF (model.c, pack_gguf_values). */
        if (man && (m->ck.norm_folded || m->ck.A_neg_exp || m->ck.v_tiled))
            json_object_set_new(man, "gguf_values",
                                json_pack("{s:b, s:b, s:b}", "norm_folded", m->ck.norm_folded,
                                          "A_neg_exp", m->ck.A_neg_exp, "v_tiled", m->ck.v_tiled));
        st = cfg ? write_manifest(man, out_dir, err) : SL_ERR_FORMAT;
        json_decref(man);
    }
    json_decref(layers);
    json_decref(files);
    json_decref(ple_layers);
    sl_model_free(m);
    return st;
}

/* ----------------------------------------------------- a pack's files */

typedef enum { PF_CORE, PF_EXPERTS, PF_NGRAM, PF_OTHER } pf_kind;

typedef struct pack_file {
    char name[64];
    pf_kind kind;
    int32_t layer;
    json_t *entry; /* its manifest entry (borrowed) */
} pack_file;

/* A pack as verify and convert see it: the manifest, its config, and the files the index
 * needs, derived from the config (core.bin, an experts file per MoE layer, an n-gram table
 * per PLE layer), not from the manifest's list, which may have lost one; then whatever else
 * that list holds (tokenizer files). */
typedef struct pack_desc {
    json_t *man;
    uint32_t version;
    sl_config cfg;
    pack_file *files;
    int32_t n_files;
} pack_desc;

static void pack_desc_free(pack_desc *d) {
    json_decref(d->man);
    sl_config_free(&d->cfg);
    free(d->files);
    memset(d, 0, sizeof *d);
}

static json_t *manifest_entry(json_t *list, const char *name) {
    size_t i;
    json_t *fe;
    json_array_foreach(list, i, fe) {
        const char *n = json_string_value(json_object_get(fe, "name"));
        if (n && !strcmp(n, name)) return fe;
    }
    return NULL;
}

static int is_hex64(const char *s) {
    if (!s || strlen(s) != 64) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

static sl_status pack_describe(const char *dir, pack_desc *d, sl_error *err) {
    memset(d, 0, sizeof *d);
    char path[4096];
    int32_t kind = 0;
    sl_status st = sl_model_check_dir(dir, &kind, err);
    if (st) return st;
    if (kind != SL_MODEL_PACK)
        return sl_fail(err, SL_ERR_ARG,
                       "%s is a %s, not a sluice pack: verify checks packs made by 'sluice pack'",
                       dir, kind == SL_MODEL_GGUF ? "GGUF file" : "Hugging Face checkpoint");
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (!(d->man = load_json(path, err))) return SL_ERR_FORMAT;
    json_t *ver = json_object_get(d->man, "version"), *cj = json_object_get(d->man, "config");
    json_t *list = json_object_get(d->man, "files");
    const json_int_t v = json_integer_value(ver);
    if (!json_is_integer(ver) || v < SL_PACK_VERSION_MIN || v > SL_PACK_VERSION)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: format version %lld (this sluice reads %d to %d)", path, (long long)v,
                       SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    d->version = (uint32_t)v;
    if (!json_is_array(list) || json_array_size(list) == 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: no 'files' list", path);
    size_t i;
    json_t *fe;
    json_array_foreach(list, i, fe) {
        const char *name = json_string_value(json_object_get(fe, "name"));
        json_t *jb = json_object_get(fe, "bytes");
        if (!name || !*name || strlen(name) >= sizeof d->files[0].name || strchr(name, '/') ||
            !strcmp(name, "..") || !is_hex64(json_string_value(json_object_get(fe, "sha256"))) ||
            !json_is_integer(jb) || json_integer_value(jb) < 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: files[%zu] is malformed", path, i);
        if (manifest_entry(list, name) != fe)
            return sl_fail(err, SL_ERR_FORMAT, "%s: '%s' is listed twice", path, name);
    }
    char *text = json_is_object(cj) ? json_dumps(cj, 0) : NULL;
    st = text ? sl_config_parse(&d->cfg, text, path, err)
              : sl_fail(err, SL_ERR_FORMAT, "%s: missing 'config' object", path);
    free(text);
    if (st) return st;
    const sl_config *c = &d->cfg;
    d->files = calloc((size_t)c->n_layers * 2 + json_array_size(list) + 1, sizeof(pack_file));
    if (!d->files) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    pack_file *f = &d->files[d->n_files++];
    *f = (pack_file){.name = "core.bin", .kind = PF_CORE, .layer = -1};
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (c->layer_is_moe[l] && c->n_experts > 0) {
            f = &d->files[d->n_files++];
            *f = (pack_file){.kind = PF_EXPERTS, .layer = l};
            snprintf(f->name, sizeof f->name, "experts-%03d.bin", l);
        }
        if (q4_config_of(c) && q4_config_of(c)->layer_ple[l] >= 0) {
            f = &d->files[d->n_files++];
            *f = (pack_file){.kind = PF_NGRAM, .layer = l};
            snprintf(f->name, sizeof f->name, "ngram-%03d.bin", l);
        }
    }
    const int32_t n_needed = d->n_files;
    for (int32_t k = 0; k < n_needed; k++) {
        f = &d->files[k];
        char who[32] = "the model";
        if (f->layer >= 0) snprintf(who, sizeof who, "layer %d", f->layer);
        if (!(f->entry = manifest_entry(list, f->name)))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: the files list has no entry for %s, which %s needs (the manifest "
                           "was edited or is incomplete)",
                           path, f->name, who);
    }
    json_array_foreach(list, i, fe) {
        const char *name = json_string_value(json_object_get(fe, "name"));
        int32_t k = 0;
        while (k < n_needed && strcmp(d->files[k].name, name))
            k++;
        if (k < n_needed) continue;
        f = &d->files[d->n_files++];
        *f = (pack_file){.kind = PF_OTHER, .layer = -1, .entry = fe};
        snprintf(f->name, sizeof f->name, "%s", name);
    }
    return SL_OK;
}

/* ------------------------------------------------------------ verify */

/* What verify found wrong inside a file besides its hash: the first problem, no path. */
typedef struct finding {
    char msg[600];
} finding;

static void found(finding *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void found(finding *w, const char *fmt, ...) {
    if (w->msg[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
}

/* An sl_error's message without the "path: " it starts with. */
static void found_err(finding *w, const sl_error *e, const char *path) {
    size_t n = strlen(path);
    const char *m = e->msg;
    if (!strncmp(m, path, n) && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
    found(w, "%s", m);
}

static sl_status hash_range(int fd, const char *path, uint64_t from, uint64_t to, sha_ctx *sha,
                            uint8_t *buf, size_t cap, sl_error *err) {
    sl_status st = SL_OK;
    for (uint64_t off = from; !st && off < to; off += cap)
        st = read_hashed(fd, path, buf, (size_t)SL_MIN(cap, to - off), off, sha, err);
    return st;
}

#define VERIFY_CHUNK ((size_t)4 << 20)

static sl_status check_core(int fd, const char *path, uint64_t size, uint32_t version, sha_ctx *sha,
                            finding *why, sl_error *err) {
    void *map = size ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    if (map == MAP_FAILED) return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    EVP_DigestUpdate(sha->md, map, (size_t)size);
    sl_st_file f = {0};
    sl_error e = {0};
    if (sl_core_parse(&f, path, map, (size_t)size, &e) || sl_core_verify(path, map, size, &e))
        found_err(why, &e, path);
    else if (f.version != version)
        found(why, "format version %u, but the manifest says %u", f.version, version);
    sl_st_close(&f);
    if (map) munmap(map, (size_t)size);
    return SL_OK;
}

static sl_status check_experts(int fd, const char *path, uint64_t size, const pack_file *pf,
                               uint32_t version, const sl_config *c, sha_ctx *sha, finding *why,
                               sl_error *err) {
    uint8_t *buf = malloc(VERIFY_CHUNK), *hdr = NULL, *blob = NULL;
    uint32_t *crc = NULL;
    if (!buf) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    uint64_t off = SL_MIN(size, (uint64_t)SL_EXPERTS_HEADER);
    sl_status st = read_hashed(fd, path, buf, (size_t)off, 0, sha, err);
    sl_experts_header h;
    sl_error e = {0};
    if (!st && sl_experts_header_parse(&h, path, buf, (size_t)off, size, &e)) {
        found_err(why, &e, path);
    } else if (!st) {
        if (h.version != version)
            found(why, "format version %u, but the manifest says %u", h.version, version);
        if ((int32_t)h.layer != pf->layer || (int32_t)h.n_experts != c->n_experts ||
            h.hidden != (uint32_t)c->hidden_size || h.inter != (uint32_t)c->moe_intermediate_size)
            found(why,
                  "holds layer %u with %u experts of [%u, %u], the config wants layer %d "
                  "with %d of [%d, %d]",
                  h.layer, h.n_experts, h.inter, h.hidden, pf->layer, c->n_experts,
                  c->moe_intermediate_size, c->hidden_size);
        hdr = malloc((size_t)h.data_offset);
        blob = malloc((size_t)h.blob_bytes);
        crc = calloc(h.n_experts, sizeof(uint32_t));
        if (!hdr || !blob || !crc) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
        if (!st) {
            memcpy(hdr, buf, (size_t)off);
            st = read_hashed(fd, path, hdr + off, (size_t)(h.data_offset - off), off, sha, err);
            off = h.data_offset;
        }
        const int checked = !st && !why->msg[0] && h.version >= 2 &&
                            !sl_experts_checksums(&h, path, hdr, (size_t)h.data_offset, crc, &e);
        if (!st && h.version >= 2 && !checked) found_err(why, &e, path);
        for (uint32_t x = 0; !st && x < h.n_experts; x++, off += h.blob_bytes) {
            st = read_hashed(fd, path, blob, (size_t)h.blob_bytes, off, sha, err);
            if (!st && checked && sl_crc32c(0, blob, (size_t)h.blob_bytes) != crc[x])
                found(why, "layer %u, expert %u: checksum mismatch (CRC32C is not %08x)", h.layer,
                      x, crc[x]);
        }
    }
    if (!st) st = hash_range(fd, path, off, size, sha, buf, VERIFY_CHUNK, err);
    free(buf), free(hdr), free(blob), free(crc);
    return st;
}

static sl_status check_ngram(int fd, const char *path, uint64_t size, const pack_file *pf,
                             uint32_t version, const sl_config *c, sha_ctx *sha, finding *why,
                             sl_error *err) {
    const q4_config *q4c = q4_config_of(c);
    uint8_t *buf = malloc(VERIFY_CHUNK);
    if (!buf) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    uint64_t off = SL_MIN(size, (uint64_t)SL_PACK_PAGE);
    sl_status st = read_hashed(fd, path, buf, (size_t)off, 0, sha, err);
    sl_ngram_header h;
    sl_error e = {0};
    if (!st && sl_ngram_header_parse(&h, path, buf, (size_t)off, size, &e)) {
        found_err(why, &e, path);
    } else if (!st) {
        if (h.version != version)
            found(why, "format version %u, but the manifest says %u", h.version, version);
        if ((int32_t)h.layer != pf->layer ||
            (int32_t)h.dim != (q4c ? q4c->ple_embed_dim / SL_MAX(q4_ngram_heads(q4c), 1) : 0))
            found(why, "holds layer %u with rows of %u, the config wants layer %d", h.layer, h.dim,
                  pf->layer);
        const uint64_t per = SL_MAX(VERIFY_CHUNK / h.row_bytes, (uint64_t)1);
        for (uint64_t r = 0; !st && r < h.rows; r += per) {
            const uint64_t k = SL_MIN(per, h.rows - r);
            st = read_hashed(fd, path, buf, (size_t)(k * h.row_bytes), off, sha, err);
            for (uint64_t j = 0; !st && j < k; j++)
                if (!sl_ngram_row_ok(&h, buf + j * h.row_bytes))
                    found(why, "row %llu: checksum mismatch", (unsigned long long)(r + j));
            off += k * h.row_bytes;
        }
    }
    if (!st) st = hash_range(fd, path, off, size, sha, buf, VERIFY_CHUNK, err);
    free(buf);
    return st;
}

/* One file: its size and SHA-256 against the manifest and, read in the same pass, what it says
 * about itself (headers, version, layer, and from version 2 every checksum). */
static sl_status verify_file(const char *dir, const pack_desc *d, const pack_file *pf,
                             sl_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, pf->name);
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    const json_int_t want = json_integer_value(json_object_get(pf->entry, "bytes"));
    sl_status st = SL_OK;
    sha_ctx sha = {0};
    finding why = {{0}};
    if (size != (uint64_t)want)
        st = sl_fail(err, SL_ERR_FORMAT, "%s: %llu bytes, manifest says %lld (truncated?)", path,
                     (unsigned long long)size, (long long)want);
    else if (!sha_init(&sha))
        st = sl_fail(err, SL_ERR_NOMEM, "SHA-256 context");
    else if (pf->kind == PF_CORE)
        st = check_core(fd, path, size, d->version, &sha, &why, err);
    else if (pf->kind == PF_EXPERTS)
        st = check_experts(fd, path, size, pf, d->version, &d->cfg, &sha, &why, err);
    else if (pf->kind == PF_NGRAM)
        st = check_ngram(fd, path, size, pf, d->version, &d->cfg, &sha, &why, err);
    else {
        uint8_t *buf = malloc(VERIFY_CHUNK);
        st = buf ? hash_range(fd, path, 0, size, &sha, buf, VERIFY_CHUNK, err)
                 : sl_fail(err, SL_ERR_NOMEM, "out of memory");
        free(buf);
    }
    close(fd);
    char hex[65] = {0};
    if (sha.md) sha_hex(&sha, hex);
    if (st) return st;
    if (strcmp(hex, json_string_value(json_object_get(pf->entry, "sha256"))) != 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: SHA-256 mismatch (file corrupt or modified)%s%s",
                       path, why.msg[0] ? ": " : "", why.msg);
    if (why.msg[0]) return sl_fail(err, SL_ERR_FORMAT, "%s: %s", path, why.msg);
    return SL_OK;
}

sl_status sl_verify(const char *dir, sl_progress_fn progress, void *user, sl_error *err) {
    pack_desc d;
    sl_status st = pack_describe(dir, &d, err);
    for (int32_t i = 0; !st && i < d.n_files; i++) {
        st = verify_file(dir, &d, &d.files[i], err);
        if (progress) progress(user, "verify", i + 1, d.n_files);
    }
    pack_desc_free(&d);
    return st;
}

int32_t sl_pack_version(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    sl_error e = {0};
    json_t *man = load_json(path, &e);
    const json_int_t v = json_integer_value(json_object_get(man, "version"));
    json_decref(man);
    return v > 0 && v < INT32_MAX ? (int32_t)v : 0;
}

/* ----------------------------------------------------------- convert */

/* core.bin at another version: the same tensors at the same offsets, the index records'
 * checksums computed (version 2) or cleared (version 1), the header sealed. */
static sl_status convert_core(const char *path, uint32_t to, hwriter *w, sl_error *err) {
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    uint8_t *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    sl_st_file f = {0};
    sl_status st = sl_core_parse(&f, path, map, (size_t)size, err);
    sl_st_close(&f);
    const uint32_t n = (uint32_t)get_le(map + 12, 4);
    const uint64_t data_off = get_le(map + 16, 8);
    for (uint32_t i = 0; !st && to < 3 && i < n; i++) {
        const uint8_t *r = map + SL_CORE_HEADER + (size_t)i * SL_CORE_RECORD;
        if (sl_dtype_is_block(sl_pack_dtype_from_code(r[160])))
            st = sl_fail(err, SL_ERR_UNSUPPORTED,
                         "%s: tensor '%s' is %s, a type format version %u cannot hold", path,
                         (const char *)r, sl_dtype_name(sl_pack_dtype_from_code(r[160])), to);
    }
    uint8_t *index = st ? NULL : malloc((size_t)data_off);
    if (!st && !index) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    if (!st) st = hw_open(w, path, err);
    if (!st) {
        memcpy(index, map, (size_t)data_off);
        put_le(index + 8, to, 4);
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *r = index + SL_CORE_HEADER + (size_t)i * SL_CORE_RECORD;
            put_le(r + SL_CORE_RECORD_CRC, to >= 2 ? sl_core_record_crc(map, r) : 0, 4);
        }
        put_le(index + SL_CORE_HEADER_CRC, 0, 4);
        if (to >= 2) seal_core_header(index, (size_t)data_off);
        hw_put(w, index, (size_t)data_off);
        for (uint64_t off = data_off; off < size; off += VERIFY_CHUNK)
            hw_put(w, map + off, (size_t)SL_MIN((uint64_t)VERIFY_CHUNK, size - off));
    }
    free(index);
    munmap(map, (size_t)size);
    return st;
}

/* An experts file at another version: the blobs as they are, the header (and from version 2
 * its table of the blobs' checksums) written for the new version. */
static sl_status convert_experts(const char *path, uint32_t to, hwriter *w, sl_error *err) {
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    sl_experts_header h, h2;
    uint8_t *page = malloc(SL_EXPERTS_HEADER), *blob = NULL, *hdr = NULL;
    uint32_t *crc = NULL;
    sl_status st =
        page ? read_hashed(fd, path, page, (size_t)SL_MIN(size, SL_EXPERTS_HEADER), 0, NULL, err)
             : sl_fail(err, SL_ERR_NOMEM, "out of memory");
    if (!st) st = sl_experts_header_parse(&h, path, page, SL_EXPERTS_HEADER, size, err);
    if (!st && to < 3 &&
        (sl_dtype_is_block(h.dtype[0]) || h.dtype[1] != h.dtype[0] || h.dtype[2] != h.dtype[0]))
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: experts of types %s, %s, %s, which format version %u cannot hold", path,
                     sl_dtype_name(h.dtype[0]), sl_dtype_name(h.dtype[1]),
                     sl_dtype_name(h.dtype[2]), to);
    if (!st && to < 3 && h.bias_dtype != SL_DTYPE_NONE)
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: experts with linear biases, which format version %u cannot hold", path,
                     to);
    if (!st) {
        h2 = h;
        h2.version = to;
        sl_experts_layout(&h2);
        blob = malloc((size_t)h.blob_bytes);
        hdr = calloc(1, (size_t)h2.data_offset);
        crc = calloc(h.n_experts, sizeof(uint32_t));
        if (!blob || !hdr || !crc) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    if (!st) st = hw_open(w, path, err);
    if (!st) {
        hw_pad_to(w, h2.data_offset);
        for (uint32_t e = 0; !st && e < h.n_experts; e++) {
            st = read_hashed(fd, path, blob, (size_t)h.blob_bytes,
                             h.data_offset + (uint64_t)e * h.blob_bytes, NULL, err);
            crc[e] = sl_crc32c(0, blob, (size_t)h.blob_bytes);
            hw_put(w, blob, (size_t)h.blob_bytes);
        }
        sl_experts_header_write(&h2, crc, hdr);
        hw_pwrite(w, hdr, (size_t)h2.data_offset, 0);
    }
    free(page), free(blob), free(hdr), free(crc);
    close(fd);
    return st;
}

/* An n-gram table at another version: each row's payload as it is, with its checksum
 * appended (version 2) or dropped (version 1). */
static sl_status convert_ngram(const char *path, uint32_t to, hwriter *w, sl_error *err) {
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    sl_ngram_header h, h2;
    uint8_t *buf = malloc(VERIFY_CHUNK), *out = NULL;
    sl_status st =
        buf ? read_hashed(fd, path, buf, (size_t)SL_MIN(size, SL_PACK_PAGE), 0, NULL, err)
            : sl_fail(err, SL_ERR_NOMEM, "out of memory");
    if (!st) st = sl_ngram_header_parse(&h, path, buf, SL_PACK_PAGE, size, err);
    if (!st) {
        h2 = h;
        h2.version = to;
        sl_ngram_layout(&h2);
        out = calloc(1, (size_t)h2.row_bytes + 4);
        if (!out) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    if (!st) st = hw_open(w, path, err);
    if (!st) {
        uint8_t page[SL_PACK_PAGE];
        sl_ngram_header_write(&h2, page);
        hw_put(w, page, SL_PACK_PAGE);
        const size_t payload = (size_t)SL_MIN(h.row_bytes - (h.version >= 2 ? 4 : 0),
                                              h2.row_bytes - (to >= 2 ? 4 : 0));
        const uint64_t per = SL_MAX(VERIFY_CHUNK / h.row_bytes, (uint64_t)1);
        for (uint64_t r = 0; !st && r < h.rows; r += per) {
            const uint64_t k = SL_MIN(per, h.rows - r);
            st = read_hashed(fd, path, buf, (size_t)(k * h.row_bytes),
                             h.data_offset + r * h.row_bytes, NULL, err);
            for (uint64_t j = 0; !st && j < k; j++) {
                memset(out, 0, (size_t)h2.row_bytes);
                memcpy(out, buf + j * h.row_bytes, payload);
                sl_ngram_row_seal(&h2, out);
                hw_put(w, out, (size_t)h2.row_bytes);
            }
        }
    }
    free(buf), free(out);
    close(fd);
    return st;
}

sl_status sl_pack_convert(const char *dir, uint32_t to, sl_progress_fn progress, void *user,
                          sl_error *err) {
    if (to < SL_PACK_VERSION_MIN || to > SL_PACK_VERSION)
        return sl_fail(err, SL_ERR_ARG, "no pack format version %u (this sluice writes %d to %d)",
                       to, SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    /* Only bytes that match the manifest's SHA-256 get checksums of their own: a pack that
     * fails verify is left as it is. */
    sl_error e = {0};
    if (sl_verify(dir, progress, user, &e))
        return sl_fail(err, e.code,
                       "%s (the pack was left as it is: only a pack that passes "
                       "verify is rewritten)",
                       e.msg);
    pack_desc d;
    sl_status st = pack_describe(dir, &d, err);
    if (st || d.version == to) {
        pack_desc_free(&d);
        return st;
    }
    /* Every file to NAME.tmp first, then all renamed, then the manifest: an interrupted run
     * leaves the old pack whole, or (between renames) one that verify refuses. */
    hwriter *w = calloc((size_t)d.n_files, sizeof *w);
    char(*hex)[65] = calloc((size_t)d.n_files, sizeof *hex);
    uint64_t *bytes = calloc((size_t)d.n_files, sizeof *bytes);
    if (!w || !hex || !bytes) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; w && i < d.n_files; i++)
        w[i].fd = -1;
    char path[4096];
    for (int32_t i = 0; !st && i < d.n_files; i++) {
        const pack_file *pf = &d.files[i];
        if (pf->kind == PF_OTHER) continue;
        snprintf(path, sizeof path, "%s/%s", dir, pf->name);
        hwriter *wi = &w[i];
        st = pf->kind == PF_CORE      ? convert_core(path, to, wi, err)
             : pf->kind == PF_EXPERTS ? convert_experts(path, to, wi, err)
                                      : convert_ngram(path, to, wi, err);
        if (!st) {
            wi->keep = 1; /* renamed below, all together */
            st = hw_commit(wi, hex[i], &bytes[i], err);
        }
        if (progress) progress(user, "convert", i + 1, d.n_files);
    }
    for (int32_t i = 0; w && i < d.n_files; i++) {
        if (!w[i].keep) continue;
        if (!st && rename(w[i].tmp, w[i].path) != 0)
            st = sl_fail(err, SL_ERR_IO, "%s: %s", w[i].path, strerror(errno));
        else if (st)
            unlink(w[i].tmp);
        if (!st) {
            json_object_set_new(d.files[i].entry, "bytes", json_integer((json_int_t)bytes[i]));
            json_object_set_new(d.files[i].entry, "sha256", json_string(hex[i]));
        }
    }
    for (int32_t i = 0; w && i < d.n_files; i++)
        if (w[i].fd >= 0) hw_abort(&w[i]);
    if (!st) {
        json_object_set_new(d.man, "version", json_integer(to));
        st = write_manifest(d.man, dir, err);
    }
    free(w), free(hex), free(bytes);
    pack_desc_free(&d);
    return st;
}

sl_status sl_pack_upgrade(const char *dir, sl_progress_fn progress, void *user, sl_error *err) {
    return sl_pack_convert(dir, SL_PACK_VERSION, progress, user, err);
}
