/*
 * The packed streaming format (docs/FORMAT.md has the byte-level picture).
 * A packed model is a directory:
 *
 *   manifest.json       format version, architecture, config, quantisation,
 *                       every file with its size and SHA-256
 *   core.bin            the resident core: header, index of named tensors,
 *                       then their data (64-byte aligned)
 *   experts-LLL.bin     one per MoE layer: header page, then one 4 KiB-aligned
 *                       blob per expert (gate, up, down with scales and biases),
 *                       so a cache miss is one aligned read
 *   ngram-LLL.bin       one per PLE layer (Qwen4-Exp): header page, then the n-gram
 *                       embedding table's rows back to back, so a row is one small read
 *
 * Every number read from these files is validated before use. From version 2 on, every byte
 * a forward pass reads is covered by a CRC32C (core/crc32c.h): each core tensor (in its
 * index record), each expert blob (a table in the experts file's header), each n-gram row
 * (its last four bytes), and every header itself. Version 1 packs load without checks.
 * Version 3 adds ggml's block types (a GGUF's tensors, bytes as they were) to core.bin and the
 * experts files, and a type per matrix of an expert (gate, up, down), as GGUF files mix them.
 */
#ifndef SL_PACK_H
#define SL_PACK_H

#include "format/safetensors.h"

#define SL_PACK_VERSION       3 /* what pack writes: checksums, ggml block types, per-matrix types */
#define SL_PACK_VERSION_MIN   1 /* the oldest read: version 1, no checksums */
#define SL_PACK_PAGE          4096u
#define SL_PACK_ALIGN         64u
#define SL_CORE_HEADER        64u
#define SL_CORE_RECORD        256u
#define SL_CORE_NAME          160u
#define SL_EXPERTS_HEADER     SL_PACK_PAGE /* the header's first page (version 1: all of it) */
#define SL_EXPERTS_CRC        256u         /* version 2: the per-expert CRC32C table's offset */
#define SL_CORE_HEADER_CRC    32u /* version 2: offsets of the header checksums, which cover */
#define SL_EXPERTS_HEADER_CRC 56u /* [0, data_offset) with their own four bytes read as zero */
#define SL_NGRAM_HEADER_CRC   48u
#define SL_CORE_RECORD_CRC    232u /* version 2: in an index record, the tensor's CRC32C */

/* Where the arrays of an expert sit inside its blob (offsets from the blob start): each
 * matrix's codes, quantisation scales and biases (the last two of Q8/Q4 only), then the
 * linear biases its projections add (gpt-oss's experts; absent in most models). */
typedef enum {
    SL_EX_GATE,
    SL_EX_GATE_S,
    SL_EX_GATE_B,
    SL_EX_UP,
    SL_EX_UP_S,
    SL_EX_UP_B,
    SL_EX_DOWN,
    SL_EX_DOWN_S,
    SL_EX_DOWN_B,
    SL_EX_GATE_LB, /* [I] */
    SL_EX_UP_LB,   /* [I] */
    SL_EX_DOWN_LB, /* [H] */
    SL_EX_PARTS
} sl_expert_part;

typedef struct sl_experts_header {
    uint32_t version, layer, n_experts;
    /* of gate, up and down: BF16, F16, F32, Q8 or Q4, all three the same before version 3;
     * from version 3 each its own, block types too */
    sl_dtype dtype[3];
    uint32_t hidden, inter;
    uint64_t blob_bytes;  /* stride between experts, a multiple of SL_PACK_PAGE */
    uint64_t data_offset; /* first blob: 4096, or past a version-2 CRC table of > 960 experts */
    uint64_t file_size;
    uint64_t part[SL_EX_PARTS]; /* offsets inside a blob; scales/biases 0 when unquantised,
                                 * linear biases 0 when absent */
    /* the experts' linear biases (SL_EX_*_LB): F32, F16 or BF16; NONE when they have none.
     * Version 3 (byte 23 of the header; older readers refuse a file that has them). */
    sl_dtype bias_dtype;
} sl_experts_header;

/* An n-gram table file: rows [rows, dim] of dtype from data_offset. BF16, F16 or F32 rows are
 * plain; a Q8/Q4 row is its codes (padded to an even count of bytes), then its groups' BF16
 * scales, then their biases. */
typedef struct sl_ngram_header {
    uint32_t version, layer;
    sl_dtype dtype;
    uint32_t dim;
    uint64_t rows, row_bytes, data_offset, file_size; /* version 2: row_bytes counts the CRC */
} sl_ngram_header;

/* Bytes of a quantised row's codes, rounded up to even (its scales follow). */
size_t sl_ngram_codes_bytes(sl_dtype dt, uint32_t dim);
/* Fills row_bytes, data_offset and file_size from version, dtype, dim and rows. */
void sl_ngram_layout(sl_ngram_header *h);
/* Parses the header page (version 2: its checksum too). n: bytes available, >= 48. */
sl_status sl_ngram_header_parse(sl_ngram_header *h, const char *path, const void *bytes, size_t n,
                                uint64_t file_size, sl_error *err);
/* buf: SL_PACK_PAGE bytes, checksum included (version 2). */
void sl_ngram_header_write(const sl_ngram_header *h, uint8_t *buf);
/* Version 2: whether a row's last four bytes are the CRC32C of the rest. */
int sl_ngram_row_ok(const sl_ngram_header *h, const uint8_t *row);
/* Version 2: writes that CRC into the row's last four bytes. */
void sl_ngram_row_seal(const sl_ngram_header *h, uint8_t *row);

/* On-disk dtype codes (stable across versions, unlike sl_dtype): 1-6 F32, F16, BF16, Q8, Q4,
 * I64 in every version; from version 3, 7-18 ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4, and 19 IQ4_NL. */
uint8_t sl_pack_dtype_code(sl_dtype t);
sl_dtype sl_pack_dtype_from_code(uint8_t c);

/* Parses a core.bin image into f (tensors are views into bytes; f->version is the file's).
 * Version 2: the header checksum is checked first, the tensors' only by sl_core_verify. */
sl_status sl_core_parse(sl_st_file *f, const char *path, const void *bytes, size_t size,
                        sl_error *err);
/* Version 2: every tensor's CRC32C against its bytes (an image sl_core_parse accepted); the
 * first mismatch is an error naming the file and the tensor. Version 1: nothing to check. */
sl_status sl_core_verify(const char *path, const void *bytes, size_t size, sl_error *err);
/* CRC32C of the data, then scales and biases, of index record r of a parsed core image. */
uint32_t sl_core_record_crc(const uint8_t *image, const uint8_t *r);
/* Maps, parses and verifies core.bin. */
sl_status sl_core_open(sl_st_file *f, const char *path, sl_error *err);

/* The CRC32C of a header region with its own checksum field (at crc_at) read as zero. */
uint32_t sl_pack_header_crc(const uint8_t *bytes, size_t n, size_t crc_at);

/* Parses and validates an experts file header (its first n >= 136 bytes); file_size is the real
 * size on disk. The checksums are sl_experts_checksums'. */
sl_status sl_experts_header_parse(sl_experts_header *h, const char *path, const void *bytes,
                                  size_t n, uint64_t file_size, sl_error *err);
/* Version 2: checks the header checksum over the whole header (bytes: its first n >=
 * h->data_offset bytes) and copies the per-expert CRC32C table into crc[n_experts]. */
sl_status sl_experts_checksums(const sl_experts_header *h, const char *path, const void *bytes,
                               size_t n, uint32_t *crc, sl_error *err);
/* Sizes of one expert's arrays for a header's dtypes and shapes: the blob layout. */
void sl_experts_layout(sl_experts_header *h);
/* A view of one matrix of the expert whose blob starts at blob. */
sl_tensor sl_expert_matrix(const sl_experts_header *h, const uint8_t *blob,
                           int which /* 0 gate, 1 up, 2 down */);
/* A view of the linear bias of one matrix ([I], [I], [H]); data NULL when the file has none. */
sl_tensor sl_expert_bias(const sl_experts_header *h, const uint8_t *blob, int which);

/* Serialises a header (writer side) into buf[h->data_offset]; version 2 with crc[n_experts],
 * the blobs' checksums, and the header's own. */
void sl_experts_header_write(const sl_experts_header *h, const uint32_t *crc, uint8_t *buf);

#endif /* SL_PACK_H */
