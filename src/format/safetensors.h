/*
 * Safetensors reader. A file is:
 *
 *   +--------+----------------------------+----------------------------------+
 *   | u64 LE | JSON header (N bytes)      | data section (tensors, raw LE)   |
 *   |   N    | {"name": {"dtype","shape", |                                  |
 *   |        |  "data_offsets":[b,e]},..} | byte b..e relative to its start  |
 *   +--------+----------------------------+----------------------------------+
 *
 * The file is mapped read-only; tensors are views into the mapping. Every
 * number read from the header is checked against the file before use: header
 * length, dtype, shape (non-negative, product fits), offsets inside the data
 * section (begin <= end), byte length equal to elements x dtype size, and no
 * two tensors sharing a byte.
 */
#ifndef SL_SAFETENSORS_H
#define SL_SAFETENSORS_H

#include "core/common.h"
#include "format/tensor.h"

typedef struct sl_st_file {
    char *path;
    void *map; /* whole file, PROT_READ */
    size_t size;
    int fd;           /* kept open to notice the file shrinking under the mapping, or -1 */
    uint32_t version; /* core.bin: the pack format version; 0 for safetensors */
    int32_t n_tensors;
    sl_tensor *tensors; /* names are heap strings owned here */
} sl_st_file;

/* Parses an in-memory image of a file (used by the fuzz target and by open). */
sl_status sl_st_parse(sl_st_file *f, const char *path, const void *bytes, size_t size,
                      sl_error *err);
/* Maps and parses a file. On failure *f is left empty (safe to close). */
sl_status sl_st_open(sl_st_file *f, const char *path, sl_error *err);
void sl_st_close(sl_st_file *f);
/* An error naming the file if it is now shorter than its mapping: touching the lost pages would
 * raise SIGBUS. A file replaced by rename (as pack does) keeps the old one mapped and fine. */
sl_status sl_st_check_size(const sl_st_file *f, sl_error *err);

const sl_tensor *sl_st_find(const sl_st_file *f, const char *name);

#endif /* SL_SAFETENSORS_H */
