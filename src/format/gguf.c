/* GGUF reader: mmap + validated parse (layout in gguf.h). */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* Sane bounds far above real files (~50 keys, a few thousand tensors), so that a corrupt count
 * is refused before any allocation; counts are also bounded by the bytes left. */
#define GGUF_MAX_KV        (1u << 20)
#define GGUF_MAX_TENSORS   (1u << 24)
#define GGUF_MAX_ALIGNMENT (1u << 30)

/* ============================ type tables ============================ */

sl_dtype sl_gguf_dtype(uint32_t t) {
    switch (t) {
    case SL_GGML_F32: return SL_DTYPE_F32;
    case SL_GGML_F16: return SL_DTYPE_F16;
    case SL_GGML_BF16: return SL_DTYPE_BF16;
    case SL_GGML_Q4_0: return SL_DTYPE_Q4_0;
    case SL_GGML_Q4_1: return SL_DTYPE_Q4_1;
    case SL_GGML_Q5_0: return SL_DTYPE_Q5_0;
    case SL_GGML_Q5_1: return SL_DTYPE_Q5_1;
    case SL_GGML_Q8_0: return SL_DTYPE_Q8_0;
    case SL_GGML_Q2_K: return SL_DTYPE_Q2_K;
    case SL_GGML_Q3_K: return SL_DTYPE_Q3_K;
    case SL_GGML_Q4_K: return SL_DTYPE_Q4_K;
    case SL_GGML_Q5_K: return SL_DTYPE_Q5_K;
    case SL_GGML_Q6_K: return SL_DTYPE_Q6_K;
    case SL_GGML_IQ4_XS: return SL_DTYPE_IQ4_XS;
    case SL_GGML_IQ4_NL: return SL_DTYPE_IQ4_NL;
    case SL_GGML_MXFP4: return SL_DTYPE_MXFP4;
    default: return SL_DTYPE_NONE;
    }
}

const char *sl_gguf_type_name(uint32_t type) {
    return sl_dtype_name(sl_gguf_dtype(type));
}

/* Bytes of one scalar value type; 0 for STRING, ARRAY and unknown types. */
static uint32_t vtype_size(uint32_t t) {
    switch (t) {
    case SL_GGUF_U8:
    case SL_GGUF_I8:
    case SL_GGUF_BOOL: return 1;
    case SL_GGUF_U16:
    case SL_GGUF_I16: return 2;
    case SL_GGUF_U32:
    case SL_GGUF_I32:
    case SL_GGUF_F32: return 4;
    case SL_GGUF_U64:
    case SL_GGUF_I64:
    case SL_GGUF_F64: return 8;
    default: return 0;
    }
}

/* ============================ reading ============================ */

/* A cursor over the image; every read checks the bytes left first. */
typedef struct rd {
    const uint8_t *p;
    uint64_t pos, size;
} rd;

static int rd_has(const rd *r, uint64_t n) {
    return n <= r->size - r->pos;
}
static int rd_u32(rd *r, uint32_t *v) {
    if (!rd_has(r, 4)) return 0;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return 1;
}
static int rd_u64(rd *r, uint64_t *v) {
    if (!rd_has(r, 8)) return 0;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return 1;
}
/* A string: its length must fit in what is left. */
static int rd_str(rd *r, sl_gguf_str *s) {
    uint64_t n;
    if (!rd_u64(r, &n) || !rd_has(r, n)) return 0;
    s->s = (const char *)r->p + r->pos;
    s->len = n;
    r->pos += n;
    return 1;
}

static char *str_dup(sl_gguf_str s) {
    char *c = malloc((size_t)s.len + 1);
    if (c) {
        memcpy(c, s.s, (size_t)s.len);
        c[s.len] = 0;
    }
    return c;
}

static sl_status parse_kv(sl_gguf_kv *kv, rd *r, const char *path, int64_t idx, sl_error *err) {
    sl_gguf_str key;
    if (!rd_str(r, &key))
        return sl_fail(err, SL_ERR_FORMAT, "%s: key/value #%lld: key runs past the end of the file",
                       path, (long long)idx);
    if (key.len == 0 || memchr(key.s, 0, (size_t)key.len))
        return sl_fail(err, SL_ERR_FORMAT, "%s: key/value #%lld: empty key or key with a NUL", path,
                       (long long)idx);
    if (!(kv->key = str_dup(key))) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    const char *k = kv->key;
    if (!rd_u32(r, &kv->type))
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s': value type past the end of the file",
                       path, k);
    kv->n = 1;
    uint32_t et = kv->type;
    if (kv->type == SL_GGUF_ARRAY) {
        if (!rd_u32(r, &kv->arr_type) || !rd_u64(r, &kv->n))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: key '%s': array header past the end of the file", path, k);
        et = kv->arr_type;
        if (et == SL_GGUF_ARRAY)
            return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s': nested arrays are not supported",
                           path, k);
    }
    if (et >= SL_GGUF_VTYPE_COUNT)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s': unknown value type %u", path, k, et);
    kv->val = r->p + r->pos;
    if (et == SL_GGUF_STRING) {
        /* Each string takes at least its 8-byte length: bound the count before allocating. */
        if (kv->n > (r->size - r->pos) / 8)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: key '%s': %llu strings cannot fit in the %llu bytes left", path, k,
                           (unsigned long long)kv->n, (unsigned long long)(r->size - r->pos));
        if (kv->type == SL_GGUF_ARRAY) {
            kv->strs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->strs);
            if (!kv->strs) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
        }
        for (uint64_t i = 0; i < kv->n; i++) {
            sl_gguf_str s;
            if (kv->strs) kv->strs[i] = r->p + r->pos;
            if (!rd_str(r, &s))
                return sl_fail(err, SL_ERR_FORMAT,
                               "%s: key '%s': string %llu runs past the end of the file", path, k,
                               (unsigned long long)i);
        }
        return SL_OK;
    }
    uint64_t es = vtype_size(et);
    if (kv->n > (r->size - r->pos) / es)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: key '%s': %llu values of %llu bytes run past the end of the file", path,
                       k, (unsigned long long)kv->n, (unsigned long long)es);
    if (et == SL_GGUF_BOOL)
        for (uint64_t i = 0; i < kv->n; i++)
            if (r->p[r->pos + i] > 1)
                return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s': bool value %u is not 0 or 1",
                               path, k, r->p[r->pos + i]);
    r->pos += kv->n * es;
    return SL_OK;
}

static sl_status parse_tensor(sl_gguf_tensor *t, rd *r, const char *path, int64_t idx,
                              sl_error *err) {
    sl_gguf_str name;
    if (!rd_str(r, &name))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor #%lld: name runs past the end of the file",
                       path, (long long)idx);
    if (memchr(name.s, 0, (size_t)name.len))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor #%lld: name holds a NUL", path,
                       (long long)idx);
    if (!(t->name = str_dup(name))) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    const char *nm = t->name;
    uint32_t nd;
    if (!rd_u32(r, &nd))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': info runs past the end of the file",
                       path, nm);
    if (nd < 1 || nd > SL_GGUF_MAX_DIMS)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': %u dimensions (1 to %d)", path, nm, nd,
                       SL_GGUF_MAX_DIMS);
    t->n_dims = (int32_t)nd;
    for (int d = 0; d < SL_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    uint64_t count = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        if (!rd_u64(r, &v))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': info runs past the end of the file", path, nm);
        /* The element count stays below 2^60, so byte sizes below cannot overflow either. */
        if (v > (UINT64_C(1) << 60) || (v != 0 && count > (UINT64_C(1) << 60) / v))
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': dimensions overflow", path, nm);
        count *= v;
        t->ne[d] = (int64_t)v;
    }
    if (!rd_u32(r, &t->type) || !rd_u64(r, &t->offset))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': info runs past the end of the file",
                       path, nm);
    t->dtype = sl_gguf_dtype(t->type);
    if (t->dtype == SL_DTYPE_NONE)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': unknown or unsupported ggml type %u",
                       path, nm, t->type);
    const uint64_t block = (uint64_t)sl_dtype_block_size(t->dtype);
    if ((uint64_t)t->ne[0] % block)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': row length %lld is not a multiple of %s's block of %u",
                       path, nm, (long long)t->ne[0], sl_dtype_name(t->dtype), (unsigned)block);
    /* count <= 2^60 and at most 4 bytes per element (F32): below 2^62. */
    t->nbytes = count / block * sl_dtype_block_bytes(t->dtype);
    return SL_OK;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name appearing twice among names[0..n) (sorted in place), or NULL. */
static const char *find_duplicate(const char **names, size_t n) {
    qsort(names, n, sizeof *names, cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) return names[i];
    return NULL;
}

static int cmp_tensor_idx(const void *a, const void *b, void *ctx) {
    const sl_gguf_tensor *t = ctx;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

sl_status sl_gguf_parse(sl_gguf_file *f, const char *path, const void *bytes, size_t size,
                        sl_error *err) {
    void *map = f->map && f->map == bytes ? f->map : NULL; /* set by open: kept to unmap */
    memset(f, 0, sizeof *f);
    f->map = map;
    f->size = size;
    if (!(f->path = strdup(path))) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    rd r = {bytes, 0, size};
    uint32_t magic;
    if (!rd_u32(&r, &magic) || memcmp(bytes, "GGUF", 4) != 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a GGUF file (bad magic)", path);
    (void)magic;
    if (!rd_u32(&r, &f->version)) return sl_fail(err, SL_ERR_FORMAT, "%s: truncated header", path);
    if (f->version != 2 && f->version != 3)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: GGUF version %u is not supported (2 and 3 are; a big-endian file?)",
                       path, f->version);
    uint64_t nt, nkv;
    if (!rd_u64(&r, &nt) || !rd_u64(&r, &nkv))
        return sl_fail(err, SL_ERR_FORMAT, "%s: truncated header", path);
    /* A key/value takes >= 13 bytes (key length, one key byte, type, one byte of value); a
     * tensor info >= 32 (name length, n_dims, one dim, type, offset). */
    if (nkv > GGUF_MAX_KV || nkv > (r.size - r.pos) / 13)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %llu key/values cannot fit in the file", path,
                       (unsigned long long)nkv);
    if (nt > GGUF_MAX_TENSORS || nt > (r.size - r.pos) / 32)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %llu tensors cannot fit in the file", path,
                       (unsigned long long)nt);
    f->kv = calloc((size_t)(nkv ? nkv : 1), sizeof *f->kv);
    f->tensors = calloc((size_t)(nt ? nt : 1), sizeof *f->tensors);
    f->by_name = malloc((size_t)(nt ? nt : 1) * sizeof *f->by_name);
    if (!f->kv || !f->tensors || !f->by_name)
        return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    sl_status st;
    for (uint64_t i = 0; i < nkv; i++) {
        f->n_kv++;
        if ((st = parse_kv(&f->kv[i], &r, path, (int64_t)i, err))) return st;
    }
    for (uint64_t i = 0; i < nt; i++) {
        f->n_tensors++;
        if ((st = parse_tensor(&f->tensors[i], &r, path, (int64_t)i, err))) return st;
    }

    /* Duplicate keys or tensor names make lookups ambiguous: refused, as llama.cpp does. */
    size_t nn = (size_t)SL_MAX(nkv, nt);
    const char **names = malloc((nn ? nn : 1) * sizeof *names);
    if (!names) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < nkv; i++)
        names[i] = f->kv[i].key;
    const char *dup = find_duplicate(names, (size_t)nkv);
    if (dup) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' appears twice", path, dup);
        free(names);
        return st;
    }
    for (uint64_t i = 0; i < nt; i++)
        names[i] = f->tensors[i].name;
    dup = find_duplicate(names, (size_t)nt);
    if (dup) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s' appears twice", path, dup);
        free(names);
        return st;
    }
    free(names);

    f->alignment = SL_GGUF_DEFAULT_ALIGNMENT;
    if (sl_gguf_find_kv(f, "general.alignment")) {
        if ((st = sl_gguf_get_u32(f, "general.alignment", &f->alignment, err))) return st;
        if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) ||
            f->alignment > GGUF_MAX_ALIGNMENT)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: key 'general.alignment': %u is not a power of two (up to 2^30)",
                           path, f->alignment);
    }
    const uint64_t a = f->alignment;
    f->data_start = (r.pos + a - 1) / a * a; /* r.pos < 2^64 - 2^30: no overflow */
    /* A file with no tensors may end before the padding; otherwise the data section must be
     * there (a tensor of 0 bytes at its very end included). */
    const uint64_t data_size = f->data_start <= size ? size - f->data_start : 0;
    if (nt && f->data_start > size)
        return sl_fail(err, SL_ERR_FORMAT, "%s: the data section starts past the end of the file",
                       path);
    for (uint64_t i = 0; i < nt; i++) {
        sl_gguf_tensor *t = &f->tensors[i];
        if (t->offset % a)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                           path, t->name, (unsigned long long)t->offset, f->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': %s bytes [%llu, +%llu) run past the end of the data "
                           "section (%llu bytes; file truncated?)",
                           path, t->name, sl_gguf_type_name(t->type), (unsigned long long)t->offset,
                           (unsigned long long)t->nbytes, (unsigned long long)data_size);
        t->data = (const uint8_t *)bytes + f->data_start + t->offset;
        f->by_name[i] = (int64_t)i;
    }
    qsort_r(f->by_name, (size_t)nt, sizeof *f->by_name, cmp_tensor_idx, f->tensors);
    return SL_OK;
}

int sl_gguf_is_file(const char *path) {
    size_t n = strlen(path);
    if (n >= 5 && strcasecmp(path + n - 5, ".gguf") == 0) return 1;
    char magic[4] = {0};
    int fd = sl_open_regular(path, O_RDONLY, NULL, NULL); /* a FIFO would block fopen */
    if (fd < 0) return 0;
    ssize_t got = read(fd, magic, 4);
    close(fd);
    return got == 4 && memcmp(magic, "GGUF", 4) == 0;
}

sl_status sl_gguf_open(sl_gguf_file *f, const char *path, sl_error *err) {
    memset(f, 0, sizeof *f);
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    if (size < 24) {
        close(fd);
        return sl_fail(err, SL_ERR_FORMAT, "%s: %llu bytes, too short for a GGUF file", path,
                       (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (map == MAP_FAILED) return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(e));
    f->map = map;
    return sl_gguf_parse(f, path, map, (size_t)size, err);
}

void sl_gguf_close(sl_gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; f->kv && i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].strs);
    }
    for (int64_t i = 0; f->tensors && i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    free(f->by_name);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ============================ metadata ============================ */

const sl_gguf_kv *sl_gguf_find_kv(const sl_gguf_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

static const char *vtype_name(uint32_t t) {
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < SL_GGUF_VTYPE_COUNT ? names[t] : "?";
}

/* The scalar entry for key, or an error naming what was wanted. */
static sl_status scalar(const sl_gguf_file *f, const char *key, const char *want,
                        const sl_gguf_kv **out, sl_error *err) {
    const sl_gguf_kv *kv = sl_gguf_find_kv(f, key);
    if (!kv) return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is missing", f->path, key);
    if (kv->type == SL_GGUF_ARRAY)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is an array (expected %s)", f->path, key,
                       want);
    *out = kv;
    return SL_OK;
}

/* Integer element i of p, of type t, as sign and magnitude: 0 if t is not an integer type. */
static int int_at(const uint8_t *p, uint32_t t, uint64_t i, int *neg, uint64_t *mag) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    uint32_t es = vtype_size(t);
    if (!es || t == SL_GGUF_F32 || t == SL_GGUF_F64 || t == SL_GGUF_BOOL) return 0;
    memcpy(&v, p + i * es, es);
    int64_t s = 0;
    *neg = 0;
    switch (t) {
    case SL_GGUF_U8: *mag = v.u8; return 1;
    case SL_GGUF_U16: *mag = v.u16; return 1;
    case SL_GGUF_U32: *mag = v.u32; return 1;
    case SL_GGUF_U64: *mag = v.u64; return 1;
    case SL_GGUF_I8: s = v.i8; break;
    case SL_GGUF_I16: s = v.i16; break;
    case SL_GGUF_I32: s = v.i32; break;
    default: s = v.i64; break;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 1;
}

/* An integer key whose value is in [-neg_max, pos_max]. */
static sl_status get_int(const sl_gguf_file *f, const char *key, const char *want, uint64_t pos_max,
                         uint64_t neg_max, int *neg, uint64_t *mag, sl_error *err) {
    const sl_gguf_kv *kv;
    sl_status st = scalar(f, key, want, &kv, err);
    if (st) return st;
    if (!int_at(kv->val, kv->type, 0, neg, mag))
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is %s (expected %s)", f->path, key,
                       vtype_name(kv->type), want);
    if ((*neg && *mag > neg_max) || (!*neg && *mag > pos_max))
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s': %s%llu does not fit %s", f->path, key,
                       *neg ? "-" : "", (unsigned long long)*mag, want);
    return SL_OK;
}

sl_status sl_gguf_get_u32(const sl_gguf_file *f, const char *key, uint32_t *out, sl_error *err) {
    int neg;
    uint64_t m;
    sl_status st = get_int(f, key, "u32", UINT32_MAX, 0, &neg, &m, err);
    if (!st) *out = (uint32_t)m;
    return st;
}

sl_status sl_gguf_get_u64(const sl_gguf_file *f, const char *key, uint64_t *out, sl_error *err) {
    int neg;
    uint64_t m;
    sl_status st = get_int(f, key, "u64", UINT64_MAX, 0, &neg, &m, err);
    if (!st) *out = m;
    return st;
}

sl_status sl_gguf_get_i64(const sl_gguf_file *f, const char *key, int64_t *out, sl_error *err) {
    int neg;
    uint64_t m;
    sl_status st = get_int(f, key, "i64", INT64_MAX, (uint64_t)INT64_MAX + 1, &neg, &m, err);
    if (!st) *out = neg ? (int64_t)(0 - m) : (int64_t)m;
    return st;
}

sl_status sl_gguf_get_f32(const sl_gguf_file *f, const char *key, float *out, sl_error *err) {
    const sl_gguf_kv *kv;
    sl_status st = scalar(f, key, "f32", &kv, err);
    if (st) return st;
    if (kv->type != SL_GGUF_F32 && kv->type != SL_GGUF_F64)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is %s (expected f32)", f->path, key,
                       vtype_name(kv->type));
    *out = (float)sl_gguf_arr_float(kv, 0);
    return SL_OK;
}

sl_status sl_gguf_get_bool(const sl_gguf_file *f, const char *key, int32_t *out, sl_error *err) {
    const sl_gguf_kv *kv;
    sl_status st = scalar(f, key, "bool", &kv, err);
    if (st) return st;
    if (kv->type != SL_GGUF_BOOL)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is %s (expected bool)", f->path, key,
                       vtype_name(kv->type));
    *out = kv->val[0];
    return SL_OK;
}

sl_status sl_gguf_get_str(const sl_gguf_file *f, const char *key, sl_gguf_str *out, sl_error *err) {
    const sl_gguf_kv *kv;
    sl_status st = scalar(f, key, "string", &kv, err);
    if (st) return st;
    if (kv->type != SL_GGUF_STRING)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is %s (expected string)", f->path, key,
                       vtype_name(kv->type));
    memcpy(&out->len, kv->val, 8);
    out->s = (const char *)kv->val + 8;
    return SL_OK;
}

sl_status sl_gguf_get_arr(const sl_gguf_file *f, const char *key, sl_gguf_vtype elem,
                          const sl_gguf_kv **out, sl_error *err) {
    const sl_gguf_kv *kv = sl_gguf_find_kv(f, key);
    if (!kv) return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is missing", f->path, key);
    if (kv->type != SL_GGUF_ARRAY || kv->arr_type != (uint32_t)elem)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is %s%s%s (expected an array of %s)",
                       f->path, key, vtype_name(kv->type), kv->type == SL_GGUF_ARRAY ? " of " : "",
                       kv->type == SL_GGUF_ARRAY ? vtype_name(kv->arr_type) : "", vtype_name(elem));
    *out = kv;
    return SL_OK;
}

sl_gguf_str sl_gguf_arr_str(const sl_gguf_kv *kv, uint64_t i) {
    SL_ASSERT(kv->strs && i < kv->n);
    sl_gguf_str s;
    memcpy(&s.len, kv->strs[i], 8);
    s.s = (const char *)kv->strs[i] + 8;
    return s;
}

int64_t sl_gguf_arr_int(const sl_gguf_kv *kv, uint64_t i) {
    SL_ASSERT(i < kv->n);
    int neg;
    uint64_t m;
    const uint32_t t = kv->type == SL_GGUF_ARRAY ? kv->arr_type : kv->type;
    SL_ASSERT(int_at(kv->val, t, i, &neg, &m));
    return neg ? (int64_t)(0 - m) : (int64_t)m;
}

double sl_gguf_arr_float(const sl_gguf_kv *kv, uint64_t i) {
    SL_ASSERT(i < kv->n);
    const uint32_t t = kv->type == SL_GGUF_ARRAY ? kv->arr_type : kv->type;
    if (t == SL_GGUF_F32) {
        float v;
        memcpy(&v, kv->val + 4 * i, 4);
        return v;
    }
    SL_ASSERT(t == SL_GGUF_F64);
    double v;
    memcpy(&v, kv->val + 8 * i, 8);
    return v;
}

/* ============================ tensors ============================ */

const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf_file *f, const char *name) {
    int64_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const sl_gguf_tensor *t = &f->tensors[f->by_name[mid]];
        const int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
