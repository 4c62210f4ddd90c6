/*
 * sl_pack: Hugging Face checkpoint -> packed directory; sl_verify: sizes and
 * SHA-256 of a packed directory against its manifest.
 *
 * Packing streams: the source stays memory-mapped, each tensor is converted
 * row by row and written out at once, so memory use is one tensor's scales
 * plus one expert blob, whatever the model's size.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/pack.h"
#include "kernels/quant.h"
#include "model/model.h"

/* ------------------------------------------------------- hashed writer */

typedef struct hwriter {
    FILE *f;
    EVP_MD_CTX *md;
    uint64_t off;
    const char *path;
    int failed;
} hwriter;

static sl_status hw_open(hwriter *w, const char *path, sl_error *err) {
    memset(w, 0, sizeof *w);
    w->path = path;
    w->f = fopen(path, "wb");
    if (!w->f) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    w->md = EVP_MD_CTX_new();
    if (!w->md || !EVP_DigestInit_ex(w->md, EVP_sha256(), NULL)) {
        fclose(w->f);
        return sl_fail(err, SL_ERR_NOMEM, "SHA-256 context");
    }
    return SL_OK;
}

static void hw_put(hwriter *w, const void *p, size_t n) {
    if (!n || w->failed) return;
    if (fwrite(p, 1, n, w->f) != n) w->failed = errno ? errno : EIO;
    EVP_DigestUpdate(w->md, p, n);
    w->off += n;
}

static void hw_pad_to(hwriter *w, uint64_t off) {
    static const uint8_t zeros[4096];
    while (w->off < off)
        hw_put(w, zeros, (size_t)SL_MIN(off - w->off, sizeof zeros));
}

/* Closes the file; writes the hex digest into hex[65]. */
static sl_status hw_close(hwriter *w, char hex[65], sl_error *err) {
    unsigned char d[32];
    unsigned int dn = 0;
    EVP_DigestFinal_ex(w->md, d, &dn);
    EVP_MD_CTX_free(w->md);
    if (fclose(w->f) != 0 && !w->failed) w->failed = errno ? errno : EIO;
    if (w->failed)
        return sl_fail(err, SL_ERR_IO, "%s: write failed: %s", w->path, strerror(w->failed));
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return SL_OK;
}

static sl_status sha256_file(const char *path, char hex[65], uint64_t *size, sl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    uint8_t *buf = malloc(1 << 20);
    if (!buf || !md) {
        free(buf);
        EVP_MD_CTX_free(md);
        fclose(f);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    size_t n;
    *size = 0;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        EVP_DigestUpdate(md, buf, n);
        *size += n;
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    unsigned char d[32];
    unsigned int dn;
    EVP_DigestFinal_ex(md, d, &dn);
    EVP_MD_CTX_free(md);
    if (bad) return sl_fail(err, SL_ERR_IO, "%s: read error", path);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return SL_OK;
}

/* ------------------------------------------------------ conversion */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* What a float tensor becomes in the pack. */
static sl_dtype target_dtype(const sl_tensor *t, const sl_pack_params *p) {
    if (t->dtype == SL_DTYPE_I64) return SL_DTYPE_I64;
    const int is_router =
        ends_with(t->name, "mlp.gate.weight") || ends_with(t->name, "shared_expert_gate.weight");
    if (t->ndim == 2 && p->quant != SL_QUANT_BF16 && (!is_router || p->quant_router))
        return p->quant == SL_QUANT_INT8 ? SL_DTYPE_Q8 : SL_DTYPE_Q4;
    if (t->ndim == 1) return t->dtype; /* norms and biases stay exact */
    return t->dtype == SL_DTYPE_F32 ? SL_DTYPE_BF16 : t->dtype;
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
        sl_to_f32(row, t->data, t->dtype, (size_t)(n * K), (size_t)K);
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
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *row = rows + (size_t)omp_get_thread_num() * (size_t)row_cap;
        sl_to_f32(row, t->data, t->dtype, (size_t)(n * K), (size_t)K);
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
} core_item;

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Resident tensors: everything of the text model except routed experts and PLE n-gram
 * tables (which get files of their own). */
static int is_resident(const sl_ckpt *ck, const char *name) {
    if (strstr(name, ".mlp.experts.") || strstr(name, ".ngram_embedding.")) return 0;
    return strncmp(name, ck->prefix, strlen(ck->prefix)) == 0 ||
           strcmp(name, "lm_head.weight") == 0;
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
        if (!is_resident(ck, t->name)) continue;
        if (strlen(t->name) >= SL_CORE_NAME || t->ndim < 1 || t->ndim > 4) {
            free(items);
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "tensor '%s': name too long or rank %d not "
                           "packable",
                           t->name, t->ndim);
        }
        if (t->dtype != SL_DTYPE_F32 && t->dtype != SL_DTYPE_F16 && t->dtype != SL_DTYPE_BF16 &&
            t->dtype != SL_DTYPE_I64) {
            free(items);
            return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s cannot be packed",
                           ck->files[ck->entries[i].file].path, t->name, sl_dtype_name(t->dtype));
        }
        core_item *it = &items[n++];
        it->src = t;
        it->dt = target_dtype(t, p);
        if (t->dtype == SL_DTYPE_I64) it->dt = SL_DTYPE_I64;
        const int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
        const int64_t cols =
            t->ndim == 2 ? t->shape[1] : (int64_t)(t->nbytes / sl_dtype_size(t->dtype));
        it->bytes = sl_dtype_is_quant(it->dt)
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
    if (st) {
        free(items);
        return st;
    }
    uint8_t hdr[SL_CORE_HEADER] = {'S', 'L', 'U', 'I', 'C', 'E', 0, 'C'};
    put_le(hdr + 8, SL_PACK_VERSION, 4);
    put_le(hdr + 12, (uint64_t)n, 4);
    put_le(hdr + 16, data_off, 8);
    put_le(hdr + 24, file_size, 8);
    hw_put(&w, hdr, sizeof hdr);
    for (int32_t i = 0; i < n; i++) {
        uint8_t r[SL_CORE_RECORD] = {0};
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
        hw_put(&w, r, sizeof r);
    }
    float *row = malloc((size_t)max_k * sizeof(float));
    uint8_t *qrow = malloc((size_t)max_k * 4 + 16);
    uint16_t *sc = malloc((size_t)max_sc), *bi = malloc((size_t)max_sc);
    if (!row || !qrow || !sc || !bi) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !st && i < n; i++) {
        const core_item *it = &items[i];
        hw_pad_to(&w, it->off);
        if (it->dt == SL_DTYPE_I64) {
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
        if (p->progress) p->progress(p->progress_user, "pack core", i + 1, n);
    }
    hw_pad_to(&w, file_size);
    free(row), free(qrow), free(sc), free(bi), free(items);
    sl_status cst = hw_close(&w, hex, err);
    *size = file_size;
    return st ? st : cst;
}

/* ------------------------------------------------------ experts-LLL.bin */

static sl_status write_experts(const sl_model *m, int32_t l, const char *path,
                               const sl_pack_params *p, char hex[65], uint64_t *size,
                               sl_error *err) {
    const sl_config *c = &m->cfg;
    const sl_expert *ex = m->experts.layers[l].views;
    sl_experts_header h = {.version = SL_PACK_VERSION,
                           .layer = (uint32_t)l,
                           .n_experts = (uint32_t)c->n_experts,
                           .hidden = (uint32_t)c->hidden_size,
                           .inter = (uint32_t)c->moe_intermediate_size};
    if (p->quant == SL_QUANT_INT8)
        h.dtype = SL_DTYPE_Q8;
    else if (p->quant == SL_QUANT_INT4)
        h.dtype = SL_DTYPE_Q4;
    else
        h.dtype = ex[0].gate.dtype == SL_DTYPE_F32 ? SL_DTYPE_BF16 : ex[0].gate.dtype;
    sl_experts_layout(&h);
    uint8_t *blob = malloc(SL_MAX(h.blob_bytes, SL_EXPERTS_HEADER));
    const int64_t row_cap = SL_MAX(h.hidden, h.inter);
    float *row = malloc((size_t)omp_get_max_threads() * (size_t)row_cap * sizeof(float));
    if (!blob || !row) {
        free(blob), free(row);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory for an expert blob");
    }
    hwriter w;
    sl_status st = hw_open(&w, path, err);
    if (!st) {
        sl_experts_header_write(&h, blob);
        hw_put(&w, blob, SL_EXPERTS_HEADER);
        for (int32_t e = 0; e < c->n_experts; e++) {
            memset(blob, 0, h.blob_bytes);
            const sl_tensor *src[3] = {&ex[e].gate, &ex[e].up, &ex[e].down};
            for (int which = 0; which < 3; which++) {
                if (src[which]->dtype != ex[0].gate.dtype) {
                    st = sl_fail(err, SL_ERR_UNSUPPORTED, "layer %d expert %d: mixed dtypes", l, e);
                    break;
                }
                sl_tensor v = sl_expert_matrix(&h, blob, which);
                convert_matrix_mem(src[which], h.dtype, (uint8_t *)v.data, (uint16_t *)v.scales,
                                   (uint16_t *)v.biases, row, row_cap);
            }
            hw_put(&w, blob, h.blob_bytes);
        }
        sl_status cst = hw_close(&w, hex, err);
        st = st ? st : cst;
    }
    free(blob), free(row);
    *size = h.file_size;
    return st;
}

/* ------------------------------------------------------- ngram-LLL.bin */

/* Layer l's n-gram table, rows back to back after a header page: quantised like the rest of
 * the pack (each row with its own scales and biases), or BF16 (F32 becomes BF16). */
static sl_status write_ngram(const sl_model *m, int32_t l, const char *path,
                             const sl_pack_params *p, char hex[65], uint64_t *size, sl_error *err) {
    const sl_ngram_table *tb = &m->layers[l].ple->table;
    const sl_dtype dt = p->quant == SL_QUANT_INT8   ? SL_DTYPE_Q8
                        : p->quant == SL_QUANT_INT4 ? SL_DTYPE_Q4
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
    uint16_t *half = malloc(SL_MAX((size_t)h.row_bytes, (size_t)tb->dim * sizeof(uint16_t)));
    hwriter w;
    sl_status st = !page || !row || !half ? sl_fail(err, SL_ERR_NOMEM, "out of memory")
                                          : hw_open(&w, path, err);
    if (!st) {
        sl_ngram_header_write(&h, page);
        hw_put(&w, page, SL_PACK_PAGE);
        for (int32_t i = 0; i < tb->n_parts; i++) {
            const sl_tensor *t = &tb->parts[i];
            if (t->dtype == h.dtype) {
                hw_put(&w, t->data, t->nbytes);
                continue;
            }
            const size_t cb = sl_ngram_codes_bytes(dt, h.dim);
            const int64_t G = sl_qgroups(tb->dim);
            for (int64_t r = 0; r < t->shape[0]; r++) {
                sl_to_f32(row, t->data, t->dtype, (size_t)(r * tb->dim), (size_t)tb->dim);
                if (sl_dtype_is_quant(dt)) { /* [codes | pad | scales | biases] */
                    uint8_t *q = (uint8_t *)half;
                    memset(q, 0, (size_t)h.row_bytes);
                    uint16_t *sc = (uint16_t *)(q + cb);
                    sl_quantize_row(dt, row, tb->dim, q, sc, sc + G);
                    hw_put(&w, q, (size_t)h.row_bytes);
                    continue;
                }
                for (int32_t k = 0; k < tb->dim; k++)
                    half[k] = sl_f32_to_bf16(row[k]);
                hw_put(&w, half, (size_t)tb->dim * 2);
            }
        }
        st = hw_close(&w, hex, err);
    }
    free(page), free(row), free(half);
    *size = h.file_size;
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
        st = hw_close(&w, hex, err);
    }
    free(buf);
    *size = n;
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

sl_status sl_pack(const char *src_dir, const char *out_dir, const sl_pack_params *params,
                  sl_error *err) {
    sl_pack_params p = params ? *params : (sl_pack_params){0};
    char path[4096], tmp[4200], hex[65];
    struct stat sb;
    int32_t src_packed = 0;
    int created = 0;
    sl_status st = sl_model_check_dir(src_dir, &src_packed, err);
    if (st) return st;
    if (src_packed)
        return sl_fail(err, SL_ERR_ARG,
                       "%s is already packed: pack reads Hugging Face checkpoints; give the "
                       "checkpoint it was made from",
                       src_dir);
    if ((st = prepare_out_dir(src_dir, out_dir, p.force, &created, err))) return st;
    sl_model_params mp = {.n_threads = 1};
    sl_model *m = NULL;
    if ((st = sl_model_load(src_dir, &mp, &m, err))) {
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
    /* Each file is written under a temporary name and renamed once complete. */
    snprintf(path, sizeof path, "%s/core.bin", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(st = write_core(m, tmp, &p, hex, &size, err)) && rename(tmp, path) != 0)
        st = sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    if (!st) json_array_append_new(files, file_entry("core.bin", size, hex));
    json_t *layers = json_array();
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        if (!m->cfg.layer_is_moe[l]) continue;
        char name[64];
        snprintf(name, sizeof name, "experts-%03d.bin", l);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (!(st = write_experts(m, l, tmp, &p, hex, &size, err)) && rename(tmp, path) != 0)
            st = sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
        if (!st) {
            json_t *fe = file_entry(name, size, hex);
            json_object_set_new(fe, "layer", json_integer(l));
            json_array_append_new(files, fe);
            json_array_append_new(layers, json_integer(l));
        }
        if (p.progress) p.progress(p.progress_user, "pack experts", l + 1, m->cfg.n_layers);
    }
    json_t *ple_layers = json_array();
    for (int32_t l = 0; !st && l < m->cfg.n_layers; l++) {
        if (!m->layers[l].ple) continue;
        char name[64];
        snprintf(name, sizeof name, "ngram-%03d.bin", l);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (!(st = write_ngram(m, l, tmp, &p, hex, &size, err)) && rename(tmp, path) != 0)
            st = sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
        if (!st) {
            json_t *fe = file_entry(name, size, hex);
            json_object_set_new(fe, "ngram_layer", json_integer(l));
            json_array_append_new(files, fe);
            json_array_append_new(ple_layers, json_integer(l));
        }
        if (p.progress) p.progress(p.progress_user, "pack n-gram tables", l + 1, m->cfg.n_layers);
    }
    for (size_t i = 0; !st && i < sizeof extra_files / sizeof extra_files[0]; i++) {
        snprintf(tmp, sizeof tmp, "%s/%s", src_dir, extra_files[i]);
        if (stat(tmp, &sb) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", out_dir, extra_files[i]);
        if (!(st = copy_file(tmp, path, hex, &size, err)))
            json_array_append_new(files, file_entry(extra_files[i], size, hex));
    }
    if (!st) {
        snprintf(path, sizeof path, "%s/config.json", src_dir);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        static const char *qnames[] = {"bf16", "int8", "int4"};
        json_t *man = json_pack("{s:s, s:i, s:s, s:s, s:b, s:i, s:o, s:o, s:o, s:o}", "format",
                                "sluice", "version", SL_PACK_VERSION, "arch", m->cfg.arch, "quant",
                                qnames[p.quant], "quant_router", p.quant_router, "group_size",
                                SL_QGROUP, "config", cfg ? cfg : json_object(), "moe_layers",
                                layers, "ple_layers", ple_layers, "files", files);
        layers = files = ple_layers = NULL;
        snprintf(path, sizeof path, "%s/manifest.json", out_dir);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (!man || json_dump_file(man, tmp, JSON_INDENT(1)) != 0 || rename(tmp, path) != 0)
            st = sl_fail(err, SL_ERR_IO, "%s: cannot write the manifest", path);
        json_decref(man);
    }
    json_decref(layers);
    json_decref(files);
    json_decref(ple_layers);
    sl_model_free(m);
    return st;
}

/* ------------------------------------------------------------ verify */

sl_status sl_verify(const char *dir, sl_progress_fn progress, void *user, sl_error *err) {
    char path[4096];
    int32_t packed = 0;
    sl_status st = sl_model_check_dir(dir, &packed, err);
    if (st) return st;
    if (!packed)
        return sl_fail(err, SL_ERR_ARG,
                       "%s is a Hugging Face checkpoint, not a sluice pack: verify checks packs "
                       "made by 'sluice pack'",
                       dir);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je);
    if (!man) return sl_fail(err, SL_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    json_t *files = json_object_get(man, "files");
    if (!json_is_array(files) || json_array_size(files) == 0)
        st = sl_fail(err, SL_ERR_FORMAT, "%s: no 'files' list", path);
    size_t i, n = json_array_size(files);
    json_t *fe;
    json_array_foreach(files, i, fe) {
        if (st) break;
        const char *name = json_string_value(json_object_get(fe, "name"));
        const char *want = json_string_value(json_object_get(fe, "sha256"));
        json_t *jb = json_object_get(fe, "bytes");
        if (!name || !want || !json_is_integer(jb) || strchr(name, '/')) {
            st = sl_fail(err, SL_ERR_FORMAT, "%s: files[%zu] is malformed", path, i);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", dir, name);
        char hex[65];
        uint64_t size = 0;
        if ((st = sha256_file(path, hex, &size, err))) break;
        if (size != (uint64_t)json_integer_value(jb))
            st = sl_fail(err, SL_ERR_FORMAT, "%s: %llu bytes, manifest says %lld (truncated?)",
                         path, (unsigned long long)size, (long long)json_integer_value(jb));
        else if (strcmp(hex, want) != 0)
            st = sl_fail(err, SL_ERR_FORMAT, "%s: SHA-256 mismatch (file corrupt or modified)",
                         path);
        if (progress) progress(user, "verify", (int64_t)i + 1, (int64_t)n);
    }
    json_decref(man);
    return st;
}
