/* CRC32C: byte-table reference, slicing-by-8 fallback, SSE4.2 fast path (see crc32c.h). */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define SL_CRC_X86 1
#endif

#define POLY 0x82f63b78u /* Castagnoli polynomial, bit-reversed */

/* The hardware path runs three streams of LONG (then SHORT) bytes side by side: the crc32
 * instruction has a latency of 3 cycles and a throughput of 1, so one stream would use a
 * third of it. Joining two streams shifts the first by the second's length, which is
 * multiplying the 32-bit register by a fixed GF(2) matrix: done as four 256-entry tables. */
#define LONG_BLOCK  8192
#define SHORT_BLOCK 256

static uint32_t slice[8][256]; /* slice[0] is the plain byte table */
static uint32_t long_shift[4][256], short_shift[4][256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* ---- GF(2) 32x32 matrices (as in zlib's crc32_combine): column n is mat[n] */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
    for (int n = 0; n < 32; n++)
        sq[n] = gf2_times(mat, mat[n]);
}

/* The operator that feeds len zero bytes (a power of two) through a raw CRC register. */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++)
        odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    /* Each square doubles: even gets one byte, odd two bytes, ... until len runs out. */
    for (;;) {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
        if (len == 0) break;
    }
    memcpy(even, odd, sizeof odd);
}

static void op_tables(uint32_t t[4][256], const uint32_t op[32]) {
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++)
            t[k][n] = gf2_times(op, n << (8 * k));
}

static void shift_tables(uint32_t t[4][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    op_tables(t, op);
}

static void init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        slice[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            slice[k][n] = (slice[k - 1][n] >> 8) ^ slice[0][slice[k - 1][n] & 0xff];
    shift_tables(long_shift, LONG_BLOCK);
    shift_tables(short_shift, SHORT_BLOCK);
}

static void tables(void) {
    pthread_once(&tables_once, init_tables);
}

static uint32_t shift(const uint32_t t[4][256], uint32_t crc) {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

static uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v; /* little-endian, as the slicing tables and the instruction expect */
}

/* ------------------------------------------------------------ reference */

uint32_t sl_crc32c_ref(uint32_t crc, const void *buf, size_t n) {
    tables();
    const uint8_t *p = buf;
    crc = ~crc;
    while (n--)
        crc = (crc >> 8) ^ slice[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ------------------------------------------------------------ slicing-by-8 */

uint32_t sl_crc32c_sw(uint32_t crc, const void *buf, size_t n) {
    tables();
    const uint8_t *p = buf;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        c ^= load64(p);
        c = slice[7][c & 0xff] ^ slice[6][(c >> 8) & 0xff] ^ slice[5][(c >> 16) & 0xff] ^
            slice[4][(c >> 24) & 0xff] ^ slice[3][(c >> 32) & 0xff] ^ slice[2][(c >> 40) & 0xff] ^
            slice[1][(c >> 48) & 0xff] ^ slice[0][c >> 56];
    }
    while (n--)
        c = (c >> 8) ^ slice[0][(c ^ *p++) & 0xff];
    return ~(uint32_t)c;
}

/* ------------------------------------------------------------ SSE4.2 */

#ifdef SL_CRC_X86
int sl_crc32c_hw_available(void) {
    return __builtin_cpu_supports("sse4.2");
}

__attribute__((target("sse4.2"))) static uint32_t hw_crc(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c0 = ~crc;
    for (; n && ((uintptr_t)p & 7); n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        /* Three streams of `block` bytes; then the first is shifted over the second and
         * joined, and that over the third. */
#define STREAMS(block, table)                                                                      \
    for (; n >= 3 * (size_t)(block); n -= 3 * (size_t)(block), p += 2 * (block)) {                 \
        uint64_t c1 = 0, c2 = 0;                                                                   \
        for (const uint8_t *end = p + (block); p < end; p += 8) {                                  \
            c0 = _mm_crc32_u64(c0, load64(p));                                                     \
            c1 = _mm_crc32_u64(c1, load64(p + (block)));                                           \
            c2 = _mm_crc32_u64(c2, load64(p + 2 * (block)));                                       \
        }                                                                                          \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c1;                                            \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c2;                                            \
    }
    STREAMS(LONG_BLOCK, long_shift)
    STREAMS(SHORT_BLOCK, short_shift)
#undef STREAMS
    for (; n >= 8; n -= 8, p += 8)
        c0 = _mm_crc32_u64(c0, load64(p));
    for (; n; n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

uint32_t sl_crc32c_hw(uint32_t crc, const void *buf, size_t n) {
    if (!sl_crc32c_hw_available()) return sl_crc32c_sw(crc, buf, n);
    tables();
    return hw_crc(crc, buf, n);
}
#else
int sl_crc32c_hw_available(void) {
    return 0;
}

uint32_t sl_crc32c_hw(uint32_t crc, const void *buf, size_t n) {
    return sl_crc32c_sw(crc, buf, n);
}
#endif

uint32_t sl_crc32c(uint32_t crc, const void *buf, size_t n) {
    return sl_crc32c_hw(crc, buf, n);
}

/* ------------------------------------------------------------ combining */

/* The operator for any length: the product of the power-of-two operators of its set bits
 * (matrices commute here: they are all powers of one). */
void sl_crc32c_shift_init(sl_crc32c_shift *t, uint64_t len) {
    uint32_t acc[32], pw[32], tmp[32];
    for (int n = 0; n < 32; n++)
        acc[n] = 1u << n; /* identity */
    for (uint64_t bit = 1; bit && bit <= len; bit <<= 1) {
        if (!(len & bit)) continue;
        zeros_op(pw, (size_t)bit);
        for (int n = 0; n < 32; n++)
            tmp[n] = gf2_times(pw, acc[n]);
        memcpy(acc, tmp, sizeof acc);
    }
    op_tables(t->t, acc);
}

/* crc(A || B) = Z(crc(A)) ^ crc(B), Z feeding |B| zero bytes: the pre- and post-inversions
 * cancel (as in zlib's crc32_combine). */
uint32_t sl_crc32c_combine(const sl_crc32c_shift *t, uint32_t crc_a, uint32_t crc_b) {
    return shift((const uint32_t(*)[256])t->t, crc_a) ^ crc_b;
}
