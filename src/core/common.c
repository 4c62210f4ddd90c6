/* Error reporting, allocation, half-precision conversion, file helpers. */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <time.h>

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

sl_status sl_read_file(const char *path, char **out, size_t *len, sl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory reading file", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return sl_fail(err, SL_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return SL_OK;
}
