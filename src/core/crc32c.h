/*
 * CRC32C (Castagnoli, the iSCSI/ext4 checksum): the per-blob, per-tensor and
 * per-row checksums of the pack format (docs/FORMAT.md).
 *
 * Three implementations of one function, chosen at run time:
 *   sl_crc32c_ref    one table lookup per byte: the plain reference
 *   sl_crc32c_sw     slicing-by-8 (eight tables): the portable fallback
 *   sl_crc32c_hw     SSE4.2's crc32 instruction on three interleaved streams,
 *                    joined with precomputed "append N zero bytes" operators
 * All take and return the finished value (pre- and post-inverted), so calls
 * chain: sl_crc32c(sl_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 */
#ifndef SL_CRC32C_H
#define SL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t sl_crc32c(uint32_t crc, const void *buf, size_t n);

/* Joining the CRCs of two pieces computed apart (on two threads): the CRC of A followed by
 * B is sl_crc32c_combine(t, crc(A), crc(B)) where t was made for B's length. Making t costs
 * a few thousand matrix-vector steps: once per length, at load. */
typedef struct sl_crc32c_shift {
    uint32_t t[4][256];
} sl_crc32c_shift;
void sl_crc32c_shift_init(sl_crc32c_shift *t, uint64_t len);
uint32_t sl_crc32c_combine(const sl_crc32c_shift *t, uint32_t crc_a, uint32_t crc_b);

uint32_t sl_crc32c_ref(uint32_t crc, const void *buf, size_t n);
uint32_t sl_crc32c_sw(uint32_t crc, const void *buf, size_t n);
/* Only where sl_crc32c_hw_available() (x86-64 with SSE4.2); else the same as _sw. */
uint32_t sl_crc32c_hw(uint32_t crc, const void *buf, size_t n);
int sl_crc32c_hw_available(void);

#endif /* SL_CRC32C_H */
