/* Packed format: reading and validating core.bin and experts-LLL.bin headers (see pack.h). */
#include "format/pack.h"

#include "core/crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char core_magic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 0, 'C'};
static const char experts_magic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 0, 'E'};

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Codes 7 on (ggml's block types) appear from version 3 on (pack.h). */
static const sl_dtype code_table[] = {
    SL_DTYPE_NONE, SL_DTYPE_F32,  SL_DTYPE_F16,    SL_DTYPE_BF16,  SL_DTYPE_Q8,
    SL_DTYPE_Q4,   SL_DTYPE_I64,  SL_DTYPE_Q8_0,   SL_DTYPE_Q4_0,  SL_DTYPE_Q4_1,
    SL_DTYPE_Q5_0, SL_DTYPE_Q5_1, SL_DTYPE_Q2_K,   SL_DTYPE_Q3_K,  SL_DTYPE_Q4_K,
    SL_DTYPE_Q5_K, SL_DTYPE_Q6_K, SL_DTYPE_IQ4_XS, SL_DTYPE_MXFP4, SL_DTYPE_IQ4_NL};
#define N_CODES (sizeof code_table / sizeof code_table[0])

uint8_t sl_pack_dtype_code(sl_dtype t) {
    for (size_t i = 1; i < N_CODES; i++)
        if (code_table[i] == t) return (uint8_t)i;
    return 0;
}

sl_dtype sl_pack_dtype_from_code(uint8_t c) {
    return c < N_CODES ? code_table[c] : SL_DTYPE_NONE;
}

uint32_t sl_pack_header_crc(const uint8_t *bytes, size_t n, size_t crc_at) {
    static const uint8_t zero[4];
    uint32_t c = sl_crc32c(0, bytes, crc_at);
    c = sl_crc32c(c, zero, 4);
    return sl_crc32c(c, bytes + crc_at + 4, n - crc_at - 4);
}

static int version_ok(uint32_t v) {
    return v >= SL_PACK_VERSION_MIN && v <= SL_PACK_VERSION;
}

/* A matrix of type t with rows of cols elements in a file of this version: block types only
 * from version 3, and only rows of whole blocks. */
static int matrix_type_ok(sl_dtype t, int64_t cols, uint32_t version) {
    if (!sl_dtype_is_block(t)) return 1;
    return version >= 3 && cols > 0 && cols % sl_dtype_block_size(t) == 0;
}

/* [off, off + len) lies inside [lo, size): overflow-safe. */
static int in_file(uint64_t off, uint64_t len, uint64_t lo, uint64_t size) {
    return off >= lo && off <= size && len <= size - off;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const sl_tensor *)a)->name, ((const sl_tensor *)b)->name);
}

/* One index record -> tensor view, every field checked. */
static sl_status parse_record(sl_tensor *t, const char *path, int32_t i, const uint8_t *r,
                              const uint8_t *base, uint64_t data_off, uint64_t size,
                              uint32_t version, sl_error *err) {
    if (!memchr(r, 0, SL_CORE_NAME) || r[0] == 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: index record %d: bad tensor name", path, i);
    const char *name = (const char *)r;
    t->dtype = sl_pack_dtype_from_code(r[160]);
    t->ndim = r[161];
    if (t->dtype == SL_DTYPE_NONE || t->ndim < 1 || t->ndim > 4)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': bad dtype code %u or rank %u", path,
                       name, r[160], r[161]);
    uint64_t count = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim = rd64(r + 168 + 8 * d);
        if (dim > (UINT64_C(1) << 40) || (dim && count > (UINT64_C(1) << 50) / dim))
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        t->shape[d] = (int64_t)dim;
        count *= dim;
    }
    uint64_t off = rd64(r + 200), bytes = rd64(r + 208);
    uint64_t want, rows = count, cols = 1;
    if (sl_dtype_is_quant(t->dtype) || sl_dtype_is_block(t->dtype)) {
        if (t->ndim != 2)
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': quantised tensors are 2-D", path,
                           name);
        rows = (uint64_t)t->shape[0];
        cols = (uint64_t)t->shape[1];
        if (!matrix_type_ok(t->dtype, (int64_t)cols, version))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': type %s in a version-%u file, or rows of %llu "
                           "elements that are not whole blocks",
                           path, name, sl_dtype_name(t->dtype), version, (unsigned long long)cols);
        want = rows * sl_row_bytes(t->dtype, (int64_t)cols);
    } else {
        want = count * sl_dtype_size(t->dtype);
    }
    if (bytes != want)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': %llu data bytes, expected %llu", path,
                       name, (unsigned long long)bytes, (unsigned long long)want);
    if (!in_file(off, bytes, data_off, size) || off % SL_PACK_ALIGN)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': data at %llu (+%llu) is outside the "
                       "file or misaligned (file truncated?)",
                       path, name, (unsigned long long)off, (unsigned long long)bytes);
    t->data = base + off;
    t->nbytes = (size_t)bytes;
    if (sl_dtype_is_quant(t->dtype)) {
        uint64_t sb = rows * (uint64_t)sl_qgroups((int64_t)cols) * 2;
        uint64_t so = rd64(r + 216), bo = rd64(r + 224);
        if (!in_file(so, sb, data_off, size) || !in_file(bo, sb, data_off, size) || so % 2 ||
            bo % 2)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': scales/biases outside the file "
                           "(truncated?)",
                           path, name);
        t->scales = (const uint16_t *)(base + so);
        t->biases = (const uint16_t *)(base + bo);
    }
    return SL_OK;
}

sl_status sl_core_parse(sl_st_file *f, const char *path, const void *bytes, size_t size,
                        sl_error *err) {
    const uint8_t *p = bytes;
    if (size < SL_CORE_HEADER || memcmp(p, core_magic, 8) != 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a sluice core file (bad magic)", path);
    uint32_t version = rd32(p + 8), n = rd32(p + 12);
    uint64_t data_off = rd64(p + 16), fsize = rd64(p + 24);
    if (!version_ok(version))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: format version %u (this sluice reads %d to %d)", path, version,
                       SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    if (fsize != size)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %zu bytes, header says %llu (truncated?)", path,
                       size, (unsigned long long)fsize);
    if (n > (1u << 24) || data_off > size ||
        data_off < SL_CORE_HEADER + (uint64_t)n * SL_CORE_RECORD)
        return sl_fail(err, SL_ERR_FORMAT, "%s: index of %u tensors does not fit", path, n);
    /* Before any record is believed: a flipped byte in the index is named as such. */
    if (version >= 2 &&
        sl_pack_header_crc(p, (size_t)data_off, SL_CORE_HEADER_CRC) != rd32(p + SL_CORE_HEADER_CRC))
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: header checksum mismatch (the index is corrupt): verify the pack",
                       path);
    f->version = version;
    f->tensors = calloc(n ? n : 1, sizeof(sl_tensor));
    if (!f->tensors) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *r = p + SL_CORE_HEADER + (size_t)i * SL_CORE_RECORD;
        sl_tensor *t = &f->tensors[i];
        sl_status st = parse_record(t, path, (int32_t)i, r, p, data_off, size, version, err);
        if (st) return st;
        if (!(t->name = strdup((const char *)r)))
            return sl_fail(err, SL_ERR_NOMEM, "out of memory");
        f->n_tensors++;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(sl_tensor), cmp_tensor_name);
    for (int32_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, f->tensors[i - 1].name) == 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s' appears twice", path,
                           f->tensors[i].name);
    return SL_OK;
}

uint32_t sl_core_record_crc(const uint8_t *image, const uint8_t *r) {
    uint32_t c = sl_crc32c(0, image + rd64(r + 200), (size_t)rd64(r + 208));
    if (sl_dtype_is_quant(sl_pack_dtype_from_code(r[160]))) {
        const size_t sb =
            (size_t)((uint64_t)rd64(r + 168) * (uint64_t)sl_qgroups((int64_t)rd64(r + 176)) * 2);
        c = sl_crc32c(c, image + rd64(r + 216), sb);
        c = sl_crc32c(c, image + rd64(r + 224), sb);
    }
    return c;
}

/* Version 2 records carry CRC32C(data || scales || biases). Offsets were checked by parse. */
sl_status sl_core_verify(const char *path, const void *bytes, size_t size, sl_error *err) {
    const uint8_t *p = bytes;
    (void)size;
    if (rd32(p + 8) < 2) return SL_OK;
    const uint32_t n = rd32(p + 12);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *r = p + SL_CORE_HEADER + (size_t)i * SL_CORE_RECORD;
        const uint32_t c = sl_core_record_crc(p, r);
        if (c != rd32(r + SL_CORE_RECORD_CRC))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': checksum mismatch (CRC32C %08x, expected %08x): the "
                           "file is corrupt",
                           path, (const char *)r, c, rd32(r + SL_CORE_RECORD_CRC));
    }
    return SL_OK;
}

sl_status sl_core_open(sl_st_file *f, const char *path, sl_error *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = strdup(path))) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    if (size < SL_CORE_HEADER) {
        close(fd);
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a sluice core file (too short)", path);
    }
    f->size = (size_t)size;
    f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
    if (f->map == MAP_FAILED) {
        const int e = errno;
        close(fd);
        f->map = NULL;
        return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(e));
    }
    f->fd = fd;
    sl_status st = sl_core_parse(f, path, f->map, f->size, err);
    /* Once, at load: the core is read from the mapping at every step after. */
#ifdef SL_NO_VERIFY /* a build for measuring what the checks cost (docs/BENCHMARKS.md section 10)  \
                     */
    return st;
#else
    return st ? st : sl_core_verify(path, f->map, f->size, err);
#endif
}

/* ------------------------------------------------------------ experts */

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

void sl_experts_layout(sl_experts_header *h) {
    const int64_t H = h->hidden, I = h->inter;
    /* gate [I, H], up [I, H], down [H, I] */
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    uint64_t off = 0;
    for (int m = 0; m < 3; m++) {
        const int q = sl_dtype_is_quant(h->dtype[m]);
        uint64_t sb = (uint64_t)rows[m] * (uint64_t)sl_qgroups(cols[m]) * 2;
        h->part[3 * m] = off;
        off = align_up(off + (uint64_t)rows[m] * sl_row_bytes(h->dtype[m], cols[m]), SL_PACK_ALIGN);
        h->part[3 * m + 1] = q ? off : 0;
        off = q ? align_up(off + sb, SL_PACK_ALIGN) : off;
        h->part[3 * m + 2] = q ? off : 0;
        off = q ? align_up(off + sb, SL_PACK_ALIGN) : off;
    }
    for (int m = 0; m < 3; m++) { /* linear biases, [I], [I], [H] */
        const int has = h->bias_dtype != SL_DTYPE_NONE;
        h->part[SL_EX_GATE_LB + m] = has ? off : 0;
        if (has)
            off = align_up(off + (uint64_t)rows[m] * sl_dtype_size(h->bias_dtype), SL_PACK_ALIGN);
    }
    h->blob_bytes = align_up(off, SL_PACK_PAGE);
    /* Version 2's CRC table fills the first page up to 960 experts; more push the blobs on. */
    h->data_offset = h->version >= 2
                         ? align_up(SL_EXPERTS_CRC + 4 * (uint64_t)h->n_experts, SL_PACK_PAGE)
                         : SL_EXPERTS_HEADER;
    h->file_size = h->data_offset + (uint64_t)h->n_experts * h->blob_bytes;
}

sl_status sl_experts_header_parse(sl_experts_header *h, const char *path, const void *bytes,
                                  size_t n, uint64_t file_size, sl_error *err) {
    const uint8_t *p = bytes;
    if (n < 160 || memcmp(p, experts_magic, 8) != 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a sluice experts file (bad magic)", path);
    memset(h, 0, sizeof *h);
    h->version = rd32(p + 8);
    h->layer = rd32(p + 12);
    h->n_experts = rd32(p + 16);
    /* Version 3: a code per matrix in bytes 20-22 (23 zero); before, one u32 code for all. */
    const uint32_t codes = rd32(p + 20);
    for (int m = 0; m < 3; m++)
        h->dtype[m] = sl_pack_dtype_from_code(h->version >= 3 ? (uint8_t)(codes >> (8 * m))
                                              : codes > 255   ? 0
                                                              : (uint8_t)codes);
    h->hidden = rd32(p + 24);
    h->inter = rd32(p + 28);
    if (!version_ok(h->version))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: format version %u (this sluice reads %d to %d)", path, h->version,
                       SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    /* Version 3's byte 23: the experts' linear biases (0: none). */
    h->bias_dtype =
        h->version >= 3 ? sl_pack_dtype_from_code((uint8_t)(codes >> 24)) : SL_DTYPE_NONE;
    int types_ok = h->version < 3 || codes >> 24 == 0 || h->bias_dtype == SL_DTYPE_F32 ||
                   h->bias_dtype == SL_DTYPE_F16 || h->bias_dtype == SL_DTYPE_BF16;
    for (int m = 0; m < 3; m++) {
        const sl_dtype t = h->dtype[m];
        types_ok &= (t == SL_DTYPE_BF16 || t == SL_DTYPE_F16 || t == SL_DTYPE_F32 ||
                     sl_dtype_is_quant(t) || sl_dtype_is_block(t)) &&
                    matrix_type_ok(t, m == 2 ? h->inter : h->hidden, h->version);
    }
    if (h->n_experts == 0 || h->n_experts > (1u << 16) || h->hidden == 0 || h->inter == 0 ||
        h->hidden > (1u << 20) || h->inter > (1u << 20) || !types_ok)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: bad header (experts %u, hidden %u, inter %u, "
                       "dtype codes %08x)",
                       path, h->n_experts, h->hidden, h->inter, codes);
    /* The layout is a function of dtype and shapes: recompute it and demand a match. */
    sl_experts_header want = *h;
    sl_experts_layout(&want);
    int ok = rd64(p + 32) == want.blob_bytes && rd64(p + 40) == want.data_offset &&
             rd64(p + 48) == want.file_size;
    for (int i = 0; i < SL_EX_PARTS; i++)
        ok &= rd64(p + 64 + 8 * i) == want.part[i];
    if (!ok)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: blob layout in the header does not match its "
                       "shapes",
                       path);
    if (file_size != want.file_size)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %llu bytes, expected %llu (truncated?)", path,
                       (unsigned long long)file_size, (unsigned long long)want.file_size);
    *h = want;
    return SL_OK;
}

sl_status sl_experts_checksums(const sl_experts_header *h, const char *path, const void *bytes,
                               size_t n, uint32_t *crc, sl_error *err) {
    const uint8_t *p = bytes;
    if (h->version < 2) return SL_OK;
    SL_ASSERT(n >= h->data_offset);
    const uint32_t want = rd32(p + SL_EXPERTS_HEADER_CRC);
    if (sl_pack_header_crc(p, (size_t)h->data_offset, SL_EXPERTS_HEADER_CRC) != want)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: layer %u: header checksum mismatch (the header or its table of "
                       "expert checksums is corrupt): verify the pack",
                       path, h->layer);
    for (uint32_t e = 0; e < h->n_experts; e++)
        crc[e] = rd32(p + SL_EXPERTS_CRC + 4 * (size_t)e);
    return SL_OK;
}

void sl_experts_header_write(const sl_experts_header *h, const uint32_t *crc, uint8_t *buf) {
    memset(buf, 0, (size_t)h->data_offset);
    memcpy(buf, experts_magic, 8);
    wr32(buf + 8, h->version);
    wr32(buf + 12, h->layer);
    wr32(buf + 16, h->n_experts);
    if (h->version >= 3) {
        for (int m = 0; m < 3; m++)
            buf[20 + m] = sl_pack_dtype_code(h->dtype[m]);
        if (h->bias_dtype != SL_DTYPE_NONE) buf[23] = sl_pack_dtype_code(h->bias_dtype);
    } else
        wr32(buf + 20, sl_pack_dtype_code(h->dtype[0]));
    wr32(buf + 24, h->hidden);
    wr32(buf + 28, h->inter);
    wr64(buf + 32, h->blob_bytes);
    wr64(buf + 40, h->data_offset);
    wr64(buf + 48, h->file_size);
    for (int i = 0; i < SL_EX_PARTS; i++)
        wr64(buf + 64 + 8 * i, h->part[i]);
    if (h->version < 2) return;
    for (uint32_t e = 0; e < h->n_experts; e++)
        wr32(buf + SL_EXPERTS_CRC + 4 * (size_t)e, crc[e]);
    wr32(buf + SL_EXPERTS_HEADER_CRC,
         sl_pack_header_crc(buf, (size_t)h->data_offset, SL_EXPERTS_HEADER_CRC));
}

sl_tensor sl_expert_matrix(const sl_experts_header *h, const uint8_t *blob, int which) {
    const int64_t H = h->hidden, I = h->inter;
    sl_tensor t = {.dtype = h->dtype[which], .ndim = 2};
    t.shape[0] = which == 2 ? H : I;
    t.shape[1] = which == 2 ? I : H;
    t.data = blob + h->part[3 * which];
    t.nbytes = (size_t)t.shape[0] * sl_row_bytes(t.dtype, t.shape[1]);
    if (sl_dtype_is_quant(t.dtype)) {
        t.scales = (const uint16_t *)(blob + h->part[3 * which + 1]);
        t.biases = (const uint16_t *)(blob + h->part[3 * which + 2]);
    }
    static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
    t.name = names[which];
    return t;
}

sl_tensor sl_expert_bias(const sl_experts_header *h, const uint8_t *blob, int which) {
    sl_tensor t = {0};
    if (h->bias_dtype == SL_DTYPE_NONE) return t;
    static const char *names[3] = {"gate_proj.bias", "up_proj.bias", "down_proj.bias"};
    t.name = names[which];
    t.dtype = h->bias_dtype;
    t.ndim = 1;
    t.shape[0] = which == 2 ? h->hidden : h->inter;
    t.data = blob + h->part[SL_EX_GATE_LB + which];
    t.nbytes = (size_t)t.shape[0] * sl_dtype_size(t.dtype);
    return t;
}

/* ------------------------------------------------------------ n-gram tables */

static const uint8_t ngram_magic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 0, 'N'};

size_t sl_ngram_codes_bytes(sl_dtype dt, uint32_t dim) {
    return (sl_row_bytes(dt, dim) + 1) & ~(size_t)1; /* even: the scales after stay aligned */
}

void sl_ngram_layout(sl_ngram_header *h) {
    /* quantised rows carry their own groups' scales and biases, and from version 2 on every
     * row its CRC32C: one row is one read, checked on its own */
    h->row_bytes = sl_dtype_is_quant(h->dtype)
                       ? sl_ngram_codes_bytes(h->dtype, h->dim) + 4 * (uint64_t)sl_qgroups(h->dim)
                       : (uint64_t)h->dim * sl_dtype_size(h->dtype);
    if (h->version >= 2) h->row_bytes += 4;
    h->data_offset = SL_PACK_PAGE;
    h->file_size = h->data_offset + h->rows * h->row_bytes;
}

sl_status sl_ngram_header_parse(sl_ngram_header *h, const char *path, const void *bytes, size_t n,
                                uint64_t file_size, sl_error *err) {
    const uint8_t *p = bytes;
    if (n < 48 || memcmp(p, ngram_magic, 8) != 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: not a sluice n-gram table (bad magic)", path);
    memset(h, 0, sizeof *h);
    h->version = rd32(p + 8);
    h->layer = rd32(p + 12);
    h->dtype = sl_pack_dtype_from_code(p[16]);
    h->dim = rd32(p + 20);
    h->rows = rd64(p + 24);
    if (!version_ok(h->version))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: format version %u (this sluice reads %d to %d)", path, h->version,
                       SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    if (h->version >= 2 &&
        (n < SL_PACK_PAGE ||
         sl_pack_header_crc(p, SL_PACK_PAGE, SL_NGRAM_HEADER_CRC) != rd32(p + SL_NGRAM_HEADER_CRC)))
        return sl_fail(err, SL_ERR_FORMAT, "%s: header checksum mismatch: verify the pack", path);
    if (!(h->dtype == SL_DTYPE_BF16 || h->dtype == SL_DTYPE_F16 || h->dtype == SL_DTYPE_F32 ||
          sl_dtype_is_quant(h->dtype)) ||
        h->dim == 0 || h->dim > (1u << 16) || h->rows == 0 || h->rows > (1ull << 40))
        return sl_fail(err, SL_ERR_FORMAT, "%s: bad header (rows %llu, dim %u, dtype code %u)",
                       path, (unsigned long long)h->rows, h->dim, p[16]);
    sl_ngram_header want = *h;
    sl_ngram_layout(&want);
    if (rd64(p + 32) != want.data_offset || rd64(p + 40) != want.file_size)
        return sl_fail(err, SL_ERR_FORMAT, "%s: layout in the header does not match its shape",
                       path);
    if (file_size != want.file_size)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %llu bytes, expected %llu (truncated?)", path,
                       (unsigned long long)file_size, (unsigned long long)want.file_size);
    *h = want;
    return SL_OK;
}

void sl_ngram_header_write(const sl_ngram_header *h, uint8_t *buf) {
    memset(buf, 0, SL_PACK_PAGE);
    memcpy(buf, ngram_magic, 8);
    wr32(buf + 8, h->version);
    wr32(buf + 12, h->layer);
    buf[16] = sl_pack_dtype_code(h->dtype);
    wr32(buf + 20, h->dim);
    wr64(buf + 24, h->rows);
    wr64(buf + 32, h->data_offset);
    wr64(buf + 40, h->file_size);
    if (h->version >= 2)
        wr32(buf + SL_NGRAM_HEADER_CRC, sl_pack_header_crc(buf, SL_PACK_PAGE, SL_NGRAM_HEADER_CRC));
}

int sl_ngram_row_ok(const sl_ngram_header *h, const uint8_t *row) {
    const size_t n = (size_t)h->row_bytes - 4;
    return h->version < 2 || sl_crc32c(0, row, n) == rd32(row + n);
}

void sl_ngram_row_seal(const sl_ngram_header *h, uint8_t *row) {
    const size_t n = (size_t)h->row_bytes - 4;
    if (h->version >= 2) wr32(row + n, sl_crc32c(0, row, n));
}
