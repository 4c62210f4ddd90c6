/* Safetensors reader: mmap + validated header parse (layout in safetensors.h). */
#include "format/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is not a checkpoint we should trust (real ones are < 10 MB). */
#define ST_MAX_HEADER (100u << 20)

static sl_status parse_entry(sl_tensor *t, const char *path, const char *name, json_t *v,
                             const uint8_t *data, uint64_t data_size, sl_error *err) {
    if (!json_is_object(v))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", path,
                       name);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': needs string dtype, array shape, 2 data_offsets", path,
                       name);
    t->dtype = sl_dtype_from_name(json_string_value(jd));
    if (t->dtype == SL_DTYPE_NONE)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name,
                       json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > SL_MAX_DIMS)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", path,
                       name, nd, SL_MAX_DIMS);
    t->ndim = (int32_t)nd;
    /* Element count with overflow checks: every dim >= 0 and the product < 2^62. */
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a size", path,
                           name, i);
        uint64_t dim = (uint64_t)json_integer_value(d);
        if (dim != 0 && count > (UINT64_C(1) << 62) / dim)
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        count *= dim;
        t->shape[i] = (int64_t)dim;
    }
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    if (json_integer_value(je) < json_integer_value(jb))
        return sl_fail(
            err, SL_ERR_FORMAT,
            "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin (swapped?)", path,
            name, (long long)json_integer_value(jb), (long long)json_integer_value(je));
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    if (e > data_size)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                       "(%llu bytes; file truncated?)",
                       path, name, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)data_size);
    uint64_t want = count * sl_dtype_size(t->dtype);
    if (e - b != want)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': %llu bytes for %llu elements of %s (expected %llu)", path,
                       name, (unsigned long long)(e - b), (unsigned long long)count,
                       sl_dtype_name(t->dtype), (unsigned long long)want);
    t->data = data + b;
    t->nbytes = (size_t)(e - b);
    return SL_OK;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const sl_tensor *)a)->name, ((const sl_tensor *)b)->name);
}

/* Where a tensor's bytes begin and end, from the start of the data section. */
static uint64_t data_begin(const sl_tensor *t, const uint8_t *data) {
    return (uint64_t)((const uint8_t *)t->data - data);
}

/* Data order: by begin, then by end (a tensor of 0 bytes may sit where another begins). */
static int cmp_tensor_data(const void *a, const void *b) {
    const sl_tensor *x = *(const sl_tensor *const *)a, *y = *(const sl_tensor *const *)b;
    const uint8_t *xb = x->data, *yb = y->data;
    if (xb != yb) return xb < yb ? -1 : 1;
    return x->nbytes != y->nbytes ? (x->nbytes < y->nbytes ? -1 : 1) : 0;
}

/* Two tensors sharing bytes mean a corrupt index, and a change to one would change the
 * other: safetensors itself refuses overlaps, and so do we. Sorted by begin, each tensor must
 * begin at or after the end of the one before. */
static sl_status check_overlaps(const sl_st_file *f, const char *path, const uint8_t *data,
                                sl_error *err) {
    if (f->n_tensors < 2) return SL_OK;
    const sl_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    for (int32_t i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_tensor_data);
    sl_status st = SL_OK;
    for (int32_t i = 1; i < f->n_tensors && !st; i++) {
        const sl_tensor *a = order[i - 1], *b = order[i];
        const uint64_t ab = data_begin(a, data), bb = data_begin(b, data);
        if (bb < ab + a->nbytes)
            st =
                sl_fail(err, SL_ERR_FORMAT,
                        "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data "
                        "section: the header is corrupt",
                        path, a->name, (unsigned long long)ab, (unsigned long long)(ab + a->nbytes),
                        b->name, (unsigned long long)bb, (unsigned long long)(bb + b->nbytes));
    }
    free(order);
    return st;
}

sl_status sl_st_parse(sl_st_file *f, const char *path, const void *bytes, size_t size,
                      sl_error *err) {
    const uint8_t *p = bytes;
    if (size < 8)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors file", path,
                       size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > size - 8 || hlen > ST_MAX_HEADER)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: header length %llu does not fit in the file (%zu bytes; truncated or "
                       "not safetensors?)",
                       path, (unsigned long long)hlen, size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return sl_fail(err, SL_ERR_FORMAT, "%s: header is not valid JSON (%s at byte %d)", path,
                       jerr.text, jerr.position);
    sl_status st = SL_OK;
    if (!json_is_object(root)) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof(sl_tensor));
    if (!f->tensors) {
        st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        sl_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        f->n_tensors++;
        st = parse_entry(t, path, key, val, data, data_size, err);
        if (st) goto done;
    }
    if ((st = check_overlaps(f, path, data, err))) goto done;
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(sl_tensor), cmp_tensor_name);
done:
    json_decref(root);
    return st;
}

sl_status sl_st_open(sl_st_file *f, const char *path, sl_error *err) {
    memset(f, 0, sizeof *f);
    f->map = MAP_FAILED;
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    f->size = (size_t)size;
    if (f->size < 8) {
        close(fd);
        return sl_fail(err, SL_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors file", path,
                       f->size);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
    if (f->map == MAP_FAILED) {
        const int e = errno;
        close(fd);
        return sl_fail(err, SL_ERR_IO, "%s: mmap: %s", path, strerror(e));
    }
    f->fd = fd;
    return sl_st_parse(f, path, f->map, f->size, err);
}

sl_status sl_st_check_size(const sl_st_file *f, sl_error *err) {
    struct stat sb;
    if (!f->map || f->map == MAP_FAILED || f->fd < 0) return SL_OK;
    if (fstat(f->fd, &sb) != 0)
        return sl_fail(err, SL_ERR_IO, "%s: fstat: %s", f->path, strerror(errno));
    if ((uint64_t)sb.st_size < (uint64_t)f->size)
        return sl_fail(err, SL_ERR_IO,
                       "%s: the file shrank from %zu to %lld bytes while in use (truncated or "
                       "rewritten in place): load the model again",
                       f->path, f->size, (long long)sb.st_size);
    return SL_OK;
}

void sl_st_close(sl_st_file *f) {
    if (!f) return;
    for (int32_t i = 0; i < f->n_tensors; i++)
        free((void *)f->tensors[i].name);
    free(f->tensors);
    if (f->map && f->map != MAP_FAILED) {
        munmap(f->map, f->size);
        if (f->fd >= 0) close(f->fd);
    }
    free(f->path);
    memset(f, 0, sizeof *f);
}

const sl_tensor *sl_st_find(const sl_st_file *f, const char *name) {
    sl_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof(sl_tensor), cmp_tensor_name);
}
