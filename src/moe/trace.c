/* Routing traces: reader and streaming writer (format in trace.h). */
#include <errno.h>

#include "moe/trace.h"

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}
static void wr16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

/* The header's three counts, checked. */
static sl_status parse_header(const char *name, const uint8_t *d, size_t len, int32_t *n_layers,
                              int32_t *n_experts, int32_t *k, sl_error *err) {
    if (len < SL_TRACE_HEADER)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %zu bytes, too short for a trace header (%d)", name,
                       len, SL_TRACE_HEADER);
    if (memcmp(d, SL_TRACE_MAGIC, 8))
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a routing trace (no %s magic)", name,
                       SL_TRACE_MAGIC);
    const uint32_t nl = rd32(d + 8), ne = rd32(d + 12), kk = rd32(d + 16), res = rd32(d + 20);
    if (nl < 1 || nl > 65536)
        return sl_fail(err, SL_ERR_FORMAT, "%s: n_layers %u (1 to 65536)", name, nl);
    if (ne < 1 || ne > 65535)
        return sl_fail(err, SL_ERR_FORMAT, "%s: n_experts %u (1 to 65535)", name, ne);
    if (kk < 1 || kk > SL_TRACE_MAX_K || kk > ne)
        return sl_fail(err, SL_ERR_FORMAT, "%s: k %u (1 to min(%d, n_experts %u))", name, kk,
                       SL_TRACE_MAX_K, ne);
    if (res) return sl_fail(err, SL_ERR_FORMAT, "%s: reserved header field %u, not 0", name, res);
    *n_layers = (int32_t)nl, *n_experts = (int32_t)ne, *k = (int32_t)kk;
    return SL_OK;
}

sl_status sl_trace_parse(sl_trace *t, const char *name, const uint8_t *d, size_t len,
                         sl_error *err) {
    memset(t, 0, sizeof *t);
    sl_status st = parse_header(name, d, len, &t->n_layers, &t->n_experts, &t->k, err);
    if (st) return st;
    /* First pass: every record checked, records and ids counted. */
    int64_t n_rec = 0, n_ids = 0;
    uint32_t prev_step = 0;
    int32_t prev_layer = -1;
    for (size_t at = SL_TRACE_HEADER; at < len;) {
        if (len - at < 8)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: truncated record at byte %zu (%zu bytes of an 8-byte header)", name,
                           at, len - at);
        const uint32_t step = rd32(d + at);
        const int32_t layer = rd16(d + at + 4), kind = d[at + 6], n = d[at + 7];
        if (layer >= t->n_layers)
            return sl_fail(err, SL_ERR_FORMAT, "%s: record at byte %zu: layer %d of %d layers",
                           name, at, layer, t->n_layers);
        if (kind > SL_TRACE_PREDICT)
            return sl_fail(err, SL_ERR_FORMAT, "%s: record at byte %zu: kind %d (0 or 1)", name, at,
                           kind);
        if (n < 1 || n > t->k)
            return sl_fail(err, SL_ERR_FORMAT, "%s: record at byte %zu: %d ids (1 to k = %d)", name,
                           at, n, t->k);
        if (n_rec && (step < prev_step || (step == prev_step && layer < prev_layer)))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: record at byte %zu: step %u layer %d after step %u layer %d "
                           "(records go by step, then layer)",
                           name, at, step, layer, prev_step, prev_layer);
        if (len - at - 8 < 2 * (size_t)n)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: truncated record at byte %zu (%d ids, %zu bytes left)", name, at, n,
                           len - at - 8);
        for (int32_t i = 0; i < n; i++) {
            const int32_t e = rd16(d + at + 8 + 2 * i);
            if (e >= t->n_experts)
                return sl_fail(err, SL_ERR_FORMAT,
                               "%s: record at byte %zu: expert id %d of %d experts", name, at, e,
                               t->n_experts);
        }
        prev_step = step, prev_layer = layer;
        n_rec++, n_ids += n;
        at += 8 + 2 * (size_t)n;
    }
    t->n_records = n_rec;
    t->step = sl_calloc((size_t)n_rec + 1, sizeof *t->step, err);
    t->layer = sl_calloc((size_t)n_rec + 1, sizeof *t->layer, err);
    t->kind = sl_calloc((size_t)n_rec + 1, 1, err);
    t->off = sl_calloc((size_t)n_rec + 1, sizeof *t->off, err);
    t->ids = sl_calloc((size_t)n_ids + 1, sizeof *t->ids, err);
    if (!t->step || !t->layer || !t->kind || !t->off || !t->ids) {
        sl_trace_free(t);
        return SL_ERR_NOMEM;
    }
    int64_t r = 0, o = 0;
    for (size_t at = SL_TRACE_HEADER; at < len; r++) {
        const int32_t n = d[at + 7];
        t->step[r] = rd32(d + at);
        t->layer[r] = rd16(d + at + 4);
        t->kind[r] = d[at + 6];
        t->off[r] = o;
        for (int32_t i = 0; i < n; i++)
            t->ids[o++] = rd16(d + at + 8 + 2 * i);
        at += 8 + 2 * (size_t)n;
    }
    t->off[r] = o;
    return SL_OK;
}

sl_status sl_trace_load(sl_trace *t, const char *path, sl_error *err) {
    memset(t, 0, sizeof *t);
    char *buf = NULL;
    size_t len = 0;
    sl_status st = sl_read_file(path, &buf, &len, err);
    if (st) return st;
    st = sl_trace_parse(t, path, (const uint8_t *)buf, len, err);
    free(buf);
    return st;
}

void sl_trace_free(sl_trace *t) {
    free(t->step), free(t->layer), free(t->kind), free(t->off), free(t->ids);
    memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------- writer */

/* Makes err the writer's sticky error (the first one stays). */
static sl_status stick(sl_trace_writer *w, sl_error *err) {
    if (!w->st) {
        w->st = err->code ? err->code : SL_ERR_IO;
        w->err = *err;
    }
    return w->st;
}

static sl_status put(sl_trace_writer *w, const uint8_t *b, size_t n, sl_error *err) {
    if (w->f && fwrite(b, 1, n, w->f) != n) {
        sl_error e = {0};
        sl_fail(&e, SL_ERR_IO, "%s: writing the routing trace: %s", w->path, strerror(errno));
        stick(w, &e);
    }
    if (!w->st && w->keep) {
        if (w->cap - w->len < n) {
            sl_error e = {0};
            sl_fail(&e, SL_ERR_IO, "routing trace in memory: %zu bytes more than reserved",
                    n - (w->cap - w->len));
            stick(w, &e);
        } else {
            memcpy(w->mem + w->len, b, n);
            w->len += n;
        }
    }
    if (w->st) {
        if (err && !err->code) *err = w->err;
        return w->st;
    }
    return SL_OK;
}

sl_status sl_trace_writer_open(sl_trace_writer *w, const char *path, int keep, int32_t n_layers,
                               int32_t n_experts, int32_t k, sl_error *err) {
    memset(w, 0, sizeof *w);
    if (n_layers < 1 || n_layers > 65536 || n_experts < 1 || n_experts > 65535 || k < 1 ||
        k > SL_TRACE_MAX_K || k > n_experts)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "a routing trace holds up to 65536 layers, 65535 experts and %d picks a "
                       "token (this model: %d, %d, %d)",
                       SL_TRACE_MAX_K, n_layers, n_experts, k);
    w->n_layers = n_layers, w->n_experts = n_experts, w->k = k;
    if (path) {
        snprintf(w->path, sizeof w->path, "%s", path);
        w->f = fopen(path, "wb");
        if (!w->f)
            return sl_fail(err, SL_ERR_IO, "%s: cannot create the routing trace: %s", path,
                           strerror(errno));
    }
    w->keep = keep != 0;
    if (keep) {
        sl_status st = sl_trace_writer_reserve(w, 1 << 16, err);
        if (st) {
            sl_trace_writer_free(w);
            return st;
        }
    }
    uint8_t h[SL_TRACE_HEADER] = {0};
    memcpy(h, SL_TRACE_MAGIC, 8);
    wr32(h + 8, (uint32_t)n_layers), wr32(h + 12, (uint32_t)n_experts), wr32(h + 16, (uint32_t)k);
    sl_status st = put(w, h, sizeof h, err);
    if (st) sl_trace_writer_free(w);
    return st;
}

sl_status sl_trace_writer_reserve(sl_trace_writer *w, size_t bytes, sl_error *err) {
    if (!w->keep || w->cap - w->len >= bytes) return w->st;
    size_t cap = w->cap ? w->cap : 1 << 16;
    while (cap - w->len < bytes)
        cap *= 2;
    if (cap > SL_TRACE_KEEP_MAX) { /* a long run (a server): stop keeping, rather than grow */
        free(w->mem);
        w->mem = NULL, w->keep = 0, w->len = w->cap = 0;
        w->dropped = 1;
        return w->st;
    }
    uint8_t *m = realloc(w->mem, cap);
    if (!m) return sl_fail(err, SL_ERR_NOMEM, "routing trace in memory: %zu bytes", cap);
    w->mem = m, w->cap = cap;
    return w->st;
}

sl_status sl_trace_writer_add(sl_trace_writer *w, int32_t layer, int32_t kind, const int32_t *ids,
                              int32_t n, sl_error *err) {
    if (w->st) {
        if (err && !err->code) *err = w->err;
        return w->st;
    }
    SL_ASSERT(layer >= 0 && layer < w->n_layers && n >= 1 && n <= w->k && kind >= 0 && kind <= 1);
    uint8_t b[8 + 2 * SL_TRACE_MAX_K];
    wr32(b, w->step), wr16(b + 4, (uint32_t)layer);
    b[6] = (uint8_t)kind, b[7] = (uint8_t)n;
    for (int32_t i = 0; i < n; i++) {
        SL_ASSERT(ids[i] >= 0 && ids[i] < w->n_experts);
        wr16(b + 8 + 2 * i, (uint32_t)ids[i]);
    }
    w->records++;
    return put(w, b, sl_trace_record_bytes(n), err);
}

sl_status sl_trace_writer_close(sl_trace_writer *w, sl_error *err) {
    if (w->f) {
        if (fclose(w->f) != 0 && !w->st) {
            sl_error e = {0};
            sl_fail(&e, SL_ERR_IO, "%s: writing the routing trace: %s", w->path, strerror(errno));
            stick(w, &e);
        }
        w->f = NULL;
    }
    if (w->st && err && !err->code) *err = w->err;
    return w->st;
}

void sl_trace_writer_free(sl_trace_writer *w) {
    if (w->f) fclose(w->f);
    free(w->mem);
    memset(w, 0, sizeof *w);
}
