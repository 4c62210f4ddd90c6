/*
 * PLE (Qwen4-Exp): hashed n-gram embeddings added to the residual streams of
 * the layers in ple_layer_ids, before their mixer.
 *
 * Hash. For token t the history h[s] is the token s places back, except that
 * an EOS at or after that place (and before t) resets it: h[s] = EOS. For each
 * n-gram order n = 2 .. ngram_size and each of its heads_per_ngram heads j,
 *   mixed = h[0]*mult[0] ^ h[1]*mult[1] ^ ... ^ h[n-1]*mult[n-1]   (64-bit)
 *   row_j = mixed % vocab[j] + offset[j]
 * where vocab[j] are distinct primes >= ngram_vocab_size_base (one per head,
 * numbered across all PLE layers) and offset[j] their running sum. Products
 * stay below 2^63 because every multiplier is < 2^63 / vocab_size, so unsigned
 * arithmetic gives the reference's int64 results.
 *
 * Block. e = concat_j table[row_j] [D]; key = grouped_norm(key_proj e) [hc, H];
 * value = value_proj e [H]; q = grouped_norm(W); g_c = signed_sqrt(key_c . q_c
 * / sqrt(H)); v_c = sigmoid(g_c) value; W += v + silu(dilated_conv(grouped_norm(v))),
 * the conv being depthwise with kernel ple_conv_kernel_size and dilation ngram_size.
 *
 * The table has ~51 billion parameters in the real model: its rows are read per
 * token from the mapping or with pread, never loaded (sl_ngram_table).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/pack.h"
#include "kernels/quant.h"
#include "families/qwen4_exp/qwen4_exp.h"

/* ------------------------------------------------------- hash constants */

static uint64_t splitmix64(uint64_t v) {
    v += 0x9E3779B97F4A7C15ull;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

static int is_prime(int64_t v) {
    if (v < 2) return 0;
    if (v % 2 == 0) return v == 2;
    for (int64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return 0;
    return 1;
}

void q4_ple_derive(const sl_config *c, int32_t ple_index, uint64_t *mult, int64_t *vocab,
                   int64_t *offset) {
    const q4_config *qc = c->fam;
    const uint64_t max_long = (UINT64_C(1) << 63) - 1;
    const uint64_t mult_max = max_long / (uint64_t)SL_MAX(c->vocab_size, 1);
    const uint64_t half = SL_MAX(mult_max / 2, 1);
    const uint64_t base_seed = (uint64_t)qc->ngram_seed + UINT64_C(10007) * (uint64_t)ple_index;
    for (int32_t i = 0; i < qc->ngram_size; i++)
        mult[i] =
            2 * (splitmix64(base_seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) % half) + 1;
    /* Head g of this layer takes the (ple_index * G + g + 1)-th prime >= base. */
    const int32_t G = q4_ngram_heads(qc);
    int64_t p = (int64_t)qc->ngram_vocab_base - 1, total = 0;
    for (int32_t n = 0; n < ple_index * G; n++)
        for (p++; !is_prime(p); p++) {
        }
    for (int32_t g = 0; g < G; g++) {
        for (p++; !is_prime(p); p++) {
        }
        vocab[g] = p;
        offset[g] = total;
        total += p;
    }
}

/* ------------------------------------------------------------- binding */

/* An int64 buffer of n entries shipped with the checkpoint (layer_multipliers, ...), if any. */
static sl_status read_i64(const sl_ckpt *ck, const char *name, int64_t n, int64_t *out, int *found,
                          sl_error *err) {
    const sl_ckpt_entry *e = sl_ckpt_find(ck, name);
    *found = e != NULL;
    if (!e) return SL_OK;
    const sl_tensor *t = e->t;
    if (t->dtype != SL_DTYPE_I64 || t->ndim != 1 || t->shape[0] != n)
        return sl_fail(
            err, SL_ERR_FORMAT, "%s: tensor '%s': expected I64 [%lld], got %s of %d dims",
            sl_ckpt_path(ck, e), e->label, (long long)n, sl_dtype_name(t->dtype), t->ndim);
    memcpy(out, t->data, (size_t)n * sizeof(int64_t));
    return SL_OK;
}

static sl_status bind_hash(sl_model *m, int32_t l, sl_ple *P, sl_error *err) {
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    const int32_t G = q4_ngram_heads(qc);
    q4_ple_derive(c, P->index, P->mult, P->vocab, P->offset);
    char name[160];
    int found;
    int64_t buf[SL_NGRAM_MAX];
    sl_status st;
    /* The checkpoint's buffers win over the derivation: they are what it was trained with. */
    snprintf(name, sizeof name, "layers.%d.ple.ple_embedding.layer_multipliers", l);
    if ((st = read_i64(&m->ck, name, qc->ngram_size, buf, &found, err))) return st;
    for (int32_t i = 0; found && i < qc->ngram_size; i++)
        P->mult[i] = (uint64_t)buf[i];
    snprintf(name, sizeof name, "layers.%d.ple.ple_embedding.ngram_heads_vocab_sizes", l);
    if ((st = read_i64(&m->ck, name, G, P->vocab, &found, err))) return st;
    snprintf(name, sizeof name, "layers.%d.ple.ple_embedding.ngram_heads_offsets", l);
    if ((st = read_i64(&m->ck, name, G, P->offset, &found, err))) return st;
    for (int32_t i = 0; i < qc->ngram_size; i++)
        if (P->mult[i] == 0 || P->mult[i] > (UINT64_C(1) << 63) / (uint64_t)c->vocab_size)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: layer %d: n-gram hash multiplier %d is out of range", m->ck.dir, l,
                           i);
    return SL_OK;
}

sl_status q4_bind_ple(sl_model *m, int32_t l, sl_error *err) {
    const sl_config *c = &m->cfg;
    const q4_config *qc = q4_cfg(m);
    q4_model *qm = q4_mod(m);
    if (qc->layer_ple[l] < 0) return SL_OK;
    sl_ple *P = &qm->ples[qc->layer_ple[l]];
    qm->layers[l].ple = P;
    P->index = qc->layer_ple[l];
    P->table.fd = -1;
    P->table.map_fd = -1;
    const int32_t G = q4_ngram_heads(qc);
    P->vocab = sl_calloc((size_t)G, sizeof(int64_t), err);
    P->offset = sl_calloc((size_t)G, sizeof(int64_t), err);
    if (!P->vocab || !P->offset) return SL_ERR_NOMEM;
    const int64_t hcH = (int64_t)qc->hc_count * c->hidden_size, H = c->hidden_size;
    const int64_t D = qc->ple_embed_dim;
    const sl_ckpt *ck = &m->ck;
    const char *p = "layers.%d.ple.%s";
    sl_status st;
    if ((st = sl_ckpt_bind(ck, &P->key_proj, SL_BIND_REQUIRED, SL_DIMS(hcH, D), err, p, l,
                           "key_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &P->value_proj, SL_BIND_REQUIRED, SL_DIMS(H, D), err, p, l,
                           "value_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &P->norm_key, SL_BIND_REQUIRED, SL_DIMS(hcH), err, p, l,
                           "norm_key.weight")) ||
        (st = sl_ckpt_bind(ck, &P->norm_query, SL_BIND_REQUIRED, SL_DIMS(hcH), err, p, l,
                           "norm_query.weight")) ||
        (st = sl_ckpt_bind(ck, &P->norm_conv, SL_BIND_REQUIRED, SL_DIMS(hcH), err, p, l,
                           "norm_conv.weight")) ||
        (st = sl_ckpt_bind(ck, &P->conv, SL_BIND_REQUIRED, SL_DIMS(hcH, 1, qc->ple_conv_kernel),
                           err, p, l, "conv1d.weight")))
        return st;
    if (qc->ple_conv_kernel > 64)
        return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: ple_conv_kernel_size > 64", ck->dir);
    return bind_hash(m, l, P, err);
}

/* ------------------------------------------------------------- tables */

/* Rows the table must have: the heads' vocabularies, padded to the divisor. */
static int64_t table_rows(const q4_config *c, const sl_ple *P) {
    const int32_t G = q4_ngram_heads(c);
    int64_t total = 0;
    for (int32_t g = 0; g < G; g++)
        total = SL_MAX(total, P->offset[g] + P->vocab[g]);
    return (total + c->ngram_vocab_divisor - 1) / c->ngram_vocab_divisor * c->ngram_vocab_divisor;
}

/* A Hugging Face checkpoint: one table tensor, or shards shard_0, shard_1, ... in row order. */
static sl_status open_table_hf(sl_model *m, int32_t l, sl_ple *P, sl_error *err) {
    const q4_config *c = q4_cfg(m);
    sl_ngram_table *tb = &P->table;
    char name[192];
    const sl_ckpt_entry *one = NULL;
    snprintf(name, sizeof name, "layers.%d.ple.ple_embedding.ngram_embedding.weight", l);
    one = sl_ckpt_find(&m->ck, name);
    int32_t n = 0;
    if (!one)
        for (;; n++) {
            snprintf(name, sizeof name,
                     "layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", l, n);
            if (!sl_ckpt_find(&m->ck, name)) break;
        }
    if (!one && n == 0)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: missing tensor 'layers.%d.ple.ple_embedding.ngram_embedding.weight' "
                       "(nor its shards)",
                       m->ck.dir, l);
    tb->n_parts = one ? 1 : n;
    tb->parts = sl_calloc((size_t)tb->n_parts, sizeof(sl_tensor), err);
    if (!tb->parts) return SL_ERR_NOMEM;
    for (int32_t i = 0; i < tb->n_parts; i++) {
        const sl_ckpt_entry *e = one;
        if (!e) {
            snprintf(name, sizeof name,
                     "layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", l, i);
            e = sl_ckpt_find(&m->ck, name);
        }
        const sl_tensor *t = e->t;
        if (t->ndim != 2 || t->shape[1] != c->ple_embed_dim / q4_ngram_heads(c) ||
            !(t->dtype == SL_DTYPE_BF16 || t->dtype == SL_DTYPE_F16 || t->dtype == SL_DTYPE_F32) ||
            (i > 0 && t->dtype != tb->parts[0].dtype))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': expected a float [rows, %d] n-gram table",
                           sl_ckpt_path(&m->ck, e), e->label, c->ple_embed_dim / q4_ngram_heads(c));
        tb->parts[i] = *t;
        tb->rows += t->shape[0];
    }
    tb->dim = (int32_t)tb->parts[0].shape[1];
    tb->dtype = tb->parts[0].dtype;
    tb->row_bytes = (size_t)tb->dim * sl_dtype_size(tb->dtype);
    return SL_OK;
}

/* A pack: ngram-LLL.bin, mapped, or read row by row with pread (streamed models). */
static sl_status open_table_pack(sl_model *m, const char *dir, int32_t l, sl_ple *P, int use_pread,
                                 sl_error *err) {
    sl_ngram_table *tb = &P->table;
    char path[4096];
    snprintf(path, sizeof path, "%s/ngram-%03d.bin", dir, l);
    if (!(tb->path = strdup(path))) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    uint8_t hdr[SL_PACK_PAGE];
    sl_ngram_header h;
    sl_status st = SL_OK;
    const int r = sl_read_full(fd, hdr, SL_MIN(size, (uint64_t)sizeof hdr), 0, 0, NULL, 0);
    if (r)
        st = sl_fail(err, SL_ERR_IO, "%s: %s", path,
                     r == SL_READ_SHORT ? "short read" : strerror(r));
    else
        st = sl_ngram_header_parse(&h, path, hdr, (size_t)SL_MIN(size, (uint64_t)sizeof hdr), size,
                                   err);
    if (!st && h.version != (uint32_t)m->pack_version)
        st = sl_fail(err, SL_ERR_FORMAT,
                     "%s: format version %u, but the manifest says %d (a file of another pack?)",
                     path, h.version, m->pack_version);
    if (!st && (h.layer != (uint32_t)l ||
                h.dim != (uint32_t)(q4_cfg(m)->ple_embed_dim / q4_ngram_heads(q4_cfg(m)))))
        st = sl_fail(err, SL_ERR_FORMAT, "%s: layer %u / row size %u do not match the model", path,
                     h.layer, h.dim);
    /* A session's row buffer holds dim x 4 bytes a row (sl_session_create): F32 rows with a
     * checksum would not fit, and pack never writes F32 rows. */
    if (!st && h.row_bytes > (uint64_t)h.dim * 4)
        st = sl_fail(err, SL_ERR_UNSUPPORTED, "%s: rows of %llu bytes (F32 rows are not read)",
                     path, (unsigned long long)h.row_bytes);
    if (st) {
        close(fd);
        return st;
    }
    tb->hdr = h;
    tb->rows = (int64_t)h.rows;
    tb->dim = (int32_t)h.dim;
    tb->dtype = h.dtype;
    tb->row_bytes = (size_t)h.row_bytes;
    tb->data_off = h.data_offset;
    if (use_pread) {
        /* rows are scattered: no readahead, a row costs about one page from disk */
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
        tb->fd = fd;
        return SL_OK;
    }
    tb->map_len = (size_t)h.file_size;
    tb->map = mmap(NULL, tb->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (tb->map == MAP_FAILED) {
        const int e = errno;
        close(fd);
        tb->map = NULL;
        return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(e));
    }
    tb->map_fd = fd; /* kept: q4_ple checks the size before reading the mapping */
    madvise(tb->map, tb->map_len, MADV_RANDOM);
    tb->parts = sl_calloc(1, sizeof(sl_tensor), err);
    if (!tb->parts) return SL_ERR_NOMEM;
    tb->n_parts = 1;
    tb->parts[0] = (sl_tensor){.name = "ngram_embedding",
                               .dtype = tb->dtype,
                               .ndim = 2,
                               .shape = {tb->rows, tb->dim},
                               .data = (const uint8_t *)tb->map + tb->data_off,
                               .nbytes = (size_t)tb->rows * tb->row_bytes};
    return SL_OK;
}

sl_status q4_ple_open_tables(sl_model *m, const char *dir, int use_pread, sl_error *err) {
    const q4_config *c = q4_cfg(m);
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        sl_ple *P = q4_mod(m)->layers[l].ple;
        if (!P) continue;
        sl_status st = m->kind == SL_MODEL_PACK ? open_table_pack(m, dir, l, P, use_pread, err)
                                                : open_table_hf(m, l, P, err);
        if (st) return st;
        const int64_t want = table_rows(c, P);
        if (P->table.rows != want)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: layer %d: the n-gram table has %lld rows, its heads need %lld", dir,
                           l, (long long)P->table.rows, (long long)want);
    }
    return SL_OK;
}

void q4_ple_free(sl_model *m) {
    q4_model *qm = q4_mod(m);
    for (int32_t i = 0; qm->ples && i < q4_cfg(m)->n_ple_layers; i++) {
        sl_ple *P = &qm->ples[i];
        free(P->vocab);
        free(P->offset);
        free(P->table.parts);
        if (P->table.fd >= 0) close(P->table.fd);
        if (P->table.map_fd >= 0) close(P->table.map_fd);
        if (P->table.map) munmap(P->table.map, P->table.map_len);
        free(P->table.path);
    }
    free(qm->ples);
    qm->ples = NULL;
}

/* One packed row (plain floats, or codes, scales, biases) into out[dim]. */
static void decode_row(const sl_ngram_table *tb, const uint8_t *p, float *out) {
    if (!sl_dtype_is_quant(tb->dtype)) {
        sl_to_f32(out, p, tb->dtype, 0, (size_t)tb->dim);
        return;
    }
    const size_t cb = sl_ngram_codes_bytes(tb->dtype, (uint32_t)tb->dim);
    const sl_tensor t = {.dtype = tb->dtype,
                         .ndim = 2,
                         .shape = {1, tb->dim},
                         .data = p,
                         .nbytes = cb,
                         .scales = (const uint16_t *)(p + cb),
                         .biases = (const uint16_t *)(p + cb) + sl_qgroups(tb->dim)};
    sl_dequantize_row(&t, 0, out);
}

/* A packed row that does not match its checksum, named with its file and layer. */
static sl_status row_mismatch(const sl_ngram_table *tb, int32_t l, int64_t r, sl_error *err) {
    return sl_fail(err, SL_ERR_FORMAT,
                   "%s: layer %d, n-gram row %lld: checksum mismatch: the file is corrupt or the "
                   "read returned bad data; 'sluice verify' checks the whole pack",
                   tb->path, l, (long long)r);
}

/* Row r of a mapped table (a pack's file or a checkpoint's shards) into out[dim]. A packed row
 * is checked on every use: it is a few hundred bytes, next to the work of decoding it, and the
 * table is too large for a bit per row to pay. */
static sl_status table_row(const sl_ngram_table *tb, int32_t l, int64_t r, float *out,
                           sl_error *err) {
    if (tb->map) {
        const uint8_t *p = (const uint8_t *)tb->map + tb->data_off + (uint64_t)r * tb->row_bytes;
        if (!sl_ngram_row_ok(&tb->hdr, p)) return row_mismatch(tb, l, r, err);
        decode_row(tb, p, out);
        return SL_OK;
    }
    int32_t i = 0;
    while (r >= tb->parts[i].shape[0])
        r -= tb->parts[i++].shape[0];
    sl_to_f32(out, tb->parts[i].data, tb->dtype, (size_t)r * (size_t)tb->dim, (size_t)tb->dim);
    return SL_OK;
}

/* ------------------------------------------------------------- compute */

void q4_ple_history(sl_session *s, const int32_t *ids, int32_t T) {
    const q4_config *c = q4_cfg(s->model);
    q4_session *b = q4_ses(s);
    const int32_t C = c->ngram_size - 1, eos = s->model->cfg.eos_id;
    int32_t *ctx = b->ple_ctx;
    for (int32_t t = 0; t < T; t++) {
        int32_t *h = b->ple_hist + (size_t)t * (size_t)c->ngram_size;
        int reset = 0;
        h[0] = ids[t];
        for (int32_t sh = 1; sh <= C; sh++) {
            const int32_t i = t - sh; /* < 0: from the context of earlier calls */
            const int32_t tok = i >= 0 ? ids[i] : ctx[C + i];
            reset |= tok == eos;
            h[sh] = reset ? eos : tok;
        }
    }
    /* The context keeps the last C raw tokens. */
    for (int32_t j = 0; j < C; j++) {
        const int32_t i = T - C + j;
        ctx[j] = i >= 0 ? ids[i] : ctx[j + T];
    }
}

void q4_ple_rows(const q4_config *c, const sl_ple *P, const int32_t *hist, int64_t *rows) {
    int32_t g = 0;
    for (int32_t n = 2; n <= c->ngram_size; n++) {
        uint64_t mixed = (uint64_t)hist[0] * P->mult[0];
        for (int32_t i = 1; i < n; i++)
            mixed ^= (uint64_t)hist[i] * P->mult[i];
        for (int32_t j = 0; j < c->ngram_heads_per; j++, g++)
            rows[g] = (int64_t)(mixed % (uint64_t)P->vocab[g]) + P->offset[g];
    }
}

sl_status q4_ple(sl_session *s, int32_t l, int32_t T, sl_error *err) {
    sl_model *m = s->model;
    const q4_config *c = q4_cfg(m);
    const sl_backend *be = s->be;
    const sl_ple *P = q4_mod(m)->layers[l].ple;
    q4_session *b = q4_ses(s);
    const int32_t G = q4_ngram_heads(c), dim = P->table.dim, D = c->ple_embed_dim;
    const size_t hcH = (size_t)c->hc_count * (size_t)m->cfg.hidden_size;
    const size_t S = (size_t)(c->ple_conv_kernel - 1) * (size_t)c->ngram_size;

    const double t0 = sl_now();
    for (int32_t t = 0; t < T; t++)
        q4_ple_rows(c, P, b->ple_hist + (size_t)t * (size_t)c->ngram_size,
                    b->ple_rows + (size_t)t * (size_t)G);
    const sl_ngram_table *tb = &P->table;
    const int32_t n = T * G;
    if (tb->fd >= 0) { /* streamed: every row of the chunk read at once by the reader pool */
        for (int32_t i = 0; i < n; i++)
            b->ple_jobs[i] =
                (sl_read_job){.fd = tb->fd,
                              .offset = tb->data_off + (uint64_t)b->ple_rows[i] * tb->row_bytes,
                              .len = tb->row_bytes,
                              .dst = b->ple_rowbuf + (size_t)i * tb->row_bytes,
                              .bounce = 1, /* the session's buffer: see sl_read_job */
                              .path = tb->path};
        sl_experts_read(&m->experts, b->ple_jobs, n);
        for (int32_t i = 0; i < n; i++) {
            const sl_read_job *j = &b->ple_jobs[i];
            char why[256];
            if (j->err)
                return sl_fail(err, sl_experts_read_status(j->err),
                               "%s: layer %d, n-gram row %lld: %s", tb->path, l,
                               (long long)b->ple_rows[i],
                               sl_experts_read_error(&m->experts, j, why, sizeof why));
            if (!sl_ngram_row_ok(&tb->hdr, j->dst)) return row_mismatch(tb, l, b->ple_rows[i], err);
        }
    } else if (tb->map_fd >= 0) { /* mapped: a file cut short would raise SIGBUS */
        struct stat sb;
        if (fstat(tb->map_fd, &sb) != 0 || (uint64_t)sb.st_size < tb->map_len)
            return sl_fail(err, SL_ERR_IO,
                           "%s: layer %d: the file shrank below %zu bytes while mapped "
                           "(truncated, or rewritten in place): load the model again",
                           tb->path, l, tb->map_len);
    }
    for (int32_t i = 0; i < n; i++) { /* row i = (token i / G, head i % G) */
        float *out = b->h_ple_emb + (size_t)i * (size_t)dim;
        if (tb->fd >= 0) {
            decode_row(tb, b->ple_rowbuf + (size_t)i * tb->row_bytes, out);
        } else {
            sl_status st = table_row(tb, l, b->ple_rows[i], out, err);
            if (st) return st;
        }
    }
    be->ops->to_dev(be, b->ple_emb, b->h_ple_emb, (size_t)T * (size_t)D * sizeof(float));
    m->stats.ple_rows += (int64_t)T * G;
    m->stats.ple_bytes += (int64_t)T * G * (int64_t)P->table.row_bytes;
    m->stats.t_ple_io += sl_now() - t0;

    be->ops->matmul(be, b->ple_key, b->ple_emb, &P->key_proj, NULL, T);
    q4_grouped_rmsnorm(s, b->ple_key, b->ple_key, &P->norm_key, T);
    be->ops->matmul(be, b->ple_val, b->ple_emb, &P->value_proj, NULL, T);
    q4_grouped_rmsnorm(s, b->ple_norm, b->hres, &P->norm_query, T);
    be->ops->ple_gate(be, b->ple_gate, b->ple_key, b->ple_norm, b->ple_val, T, c->hc_count,
                      m->cfg.hidden_size);
    q4_grouped_rmsnorm(s, b->ple_norm, b->ple_gate, &P->norm_conv, T);
    be->ops->conv1d_silu(be, b->ple_conv, b->ple_norm, T, (int32_t)hcH, &P->conv,
                         c->ple_conv_kernel, c->ngram_size,
                         b->ple_conv_state + (size_t)P->index * hcH * S);
    be->ops->axpy(be, b->ple_gate, 1.0f, b->ple_conv, (size_t)T * hcH);
    be->ops->axpy(be, b->hres, 1.0f, b->ple_gate, (size_t)T * hcH);
    return SL_OK;
}
