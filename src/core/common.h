/*
 * Shared basics: error reporting, assertions, number formats.
 *
 * Errors come in three tiers (see STYLE): library code returns an sl_status
 * and fills an sl_error; the CLI decides to exit; SL_ASSERT guards invariants
 * that only a bug can break and aborts with file:line.
 */
#ifndef SL_COMMON_H
#define SL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

#define SL_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "sluice: %s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define SL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SL_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Fills err (if not NULL and still clear) and returns code: `return sl_fail(err, ...)`. */
sl_status sl_fail(sl_error *err, sl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sl_error_clear(sl_error *err);

/* malloc/calloc that report failure through err. Memory is 64-byte aligned. */
void *sl_alloc(size_t nbytes, sl_error *err);
void *sl_calloc(size_t n, size_t size, sl_error *err);

/* bf16 is the top half of an IEEE float32: widening is exact. */
static inline float sl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t sl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float sl_f16_to_f32(uint16_t h);
uint16_t sl_f32_to_f16(float f);

/* Seconds on a monotonic clock. */
double sl_now(void);

/* Opens a model file for reading (flags: O_RDONLY, maybe O_DIRECT), refusing anything but a
 * regular file with one line naming it. Opening a FIFO for reading blocks until a writer
 * appears (forever, for a model file replaced by one), so the open is non-blocking, fstat
 * decides, and O_NONBLOCK is then cleared. O_CLOEXEC is added. Returns the descriptor, or -1
 * with err filled; *size (if not NULL) receives the file's size. Every model-file open goes
 * through here (config.json, safetensors, core.bin, experts and n-gram files, manifests). */
int sl_open_regular(const char *path, int flags, uint64_t *size, sl_error *err);

/* Appends n bytes to the NUL-terminated heap buffer *buf (*len bytes used, *cap allocated; start
 * all three zeroed), growing it as needed. 0, or -1 out of memory (the buffer as it was). */
int sl_append(char **buf, size_t *len, size_t *cap, const void *s, size_t n);

/* Reads a whole file (a regular one: sl_open_regular) into a NUL-terminated heap buffer. */
sl_status sl_read_file(const char *path, char **out, size_t *len, sl_error *err);

/* One allocation carved into 64-byte aligned pieces, in two passes: first with base == NULL,
 * which only totals the size in off, then with the allocation as base. */
typedef struct sl_carver {
    uint8_t *base;
    size_t off;
} sl_carver;

static inline void *sl_carve(sl_carver *cv, size_t n, size_t elem) {
    size_t at = cv->off;
    cv->off += (n * elem + 63) & ~(size_t)63;
    return cv->base ? cv->base + at : NULL;
}

/* Reads and parses a JSON file (through sl_read_file: a FIFO or device is refused rather than
 * waited on) into *out, a new reference for the caller to json_decref. A parse error is
 * SL_ERR_FORMAT naming the file, line and column. Declared on jansson's struct so that this
 * header does not pull jansson into every file. */
struct json_t;
sl_status sl_json_load_file(const char *path, struct json_t **out, sl_error *err);

#endif /* SL_COMMON_H */
