/* Error reporting, allocation, half-precision conversion, file helpers. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

sl_status sl_fail(sl_error *err, sl_status code, const char *fmt, ...) {
    if (err && err->code == SL_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void sl_error_clear(sl_error *err) {
    if (!err) return;
    err->code = SL_OK;
    err->msg[0] = '\0';
}

void *sl_alloc(size_t nbytes, sl_error *err) {
    void *p = NULL;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    if (posix_memalign(&p, 64, rounded) != 0) {
        sl_fail(err, SL_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    return p;
}

void *sl_calloc(size_t n, size_t size, sl_error *err) {
    if (size && n > SIZE_MAX / size) {
        sl_fail(err, SL_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = sl_alloc(n * size, err);
    if (p) memset(p, 0, n * size);
    return p;
}

/* IEEE half: 1 sign, 5 exponent, 10 mantissa bits. Handles subnormals, inf, NaN. */
float sl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24, exact in float32 */
            float f = ldexpf((float)man, -24);
            memcpy(&u, &f, sizeof u);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t sl_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00; /* rounds to inf */
    if (a < 6.103515625e-05f) {              /* subnormal half: multiples of 2^-24 */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t exp = ((u >> 23) & 0xff) - 112;
    uint32_t man = u & 0x7fffff;
    uint32_t half = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return sign | (uint16_t)half;
}

double sl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int sl_open_regular(const char *path, int flags, uint64_t *size, sl_error *err) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        sl_fail(err, SL_ERR_IO, "%s: %s%s", path, strerror(e),
                e == EINVAL && (flags & O_DIRECT)
                    ? " (O_DIRECT unsupported on this filesystem? drop --direct-io)"
                    : "");
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(e));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        sl_fail(err, SL_ERR_IO, "%s: not a regular file (%s): a model file must be a plain file",
                path,
                S_ISFIFO(sb.st_mode)                         ? "a FIFO"
                : S_ISDIR(sb.st_mode)                        ? "a directory"
                : S_ISSOCK(sb.st_mode)                       ? "a socket"
                : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                                                             : "not a file");
        return -1;
    }
    /* Regular files ignore O_NONBLOCK today; cleared all the same so reads keep their plain
     * blocking meaning. */
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        const int e = errno;
        close(fd);
        sl_fail(err, SL_ERR_IO, "%s: fcntl: %s", path, strerror(e));
        return -1;
    }
    if (size) *size = (uint64_t)sb.st_size;
    return fd;
}

int sl_append(char **buf, size_t *len, size_t *cap, const void *s, size_t n) {
    if (*len + n + 1 > *cap) {
        const size_t c = (*len + n + 1) * 2;
        char *t = realloc(*buf, c);
        if (!t) return -1;
        *buf = t;
        *cap = c;
    }
    if (n) memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

sl_status sl_read_file(const char *path, char **out, size_t *len, sl_error *err) {
    uint64_t size = 0;
    int fd = sl_open_regular(path, O_RDONLY, &size, err);
    if (fd < 0) return SL_ERR_IO;
    /* The size is a hint (the file may grow meanwhile): read until end of file. */
    size_t cap = (size_t)SL_MIN(size, (uint64_t)1 << 30) + 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
        if (!buf) {
            close(fd);
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory reading file", path);
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            const int e = errno;
            free(buf);
            close(fd);
            return sl_fail(err, SL_ERR_IO, "%s: read error: %s", path, strerror(e));
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return SL_OK;
}

sl_status sl_json_load_file(const char *path, json_t **out, sl_error *err) {
    char *text = NULL;
    size_t len = 0;
    sl_status st = sl_read_file(path, &text, &len, err);
    if (st) return st;
    json_error_t je;
    *out = json_loadb(text, len, 0, &je);
    free(text);
    if (!*out)
        return sl_fail(err, SL_ERR_FORMAT, "%s: %s (line %d, column %d)", path, je.text, je.line,
                       je.column);
    return SL_OK;
}
