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
 * section, and byte length equal to elements x dtype size.
 */
#ifndef SL_SAFETENSORS_H
#define SL_SAFETENSORS_H

#include "core/common.h"
#include "format/tensor.h"

typedef struct sl_st_file {
    char *path;
    void *map; /* whole file, PROT_READ */
    size_t size;
    int32_t n_tensors;
    sl_tensor *tensors; /* names are heap strings owned here */
} sl_st_file;

/* Parses an in-memory image of a file (used by the fuzz target and by open). */
sl_status sl_st_parse(sl_st_file *f, const char *path, const void *bytes, size_t size,
                      sl_error *err);
/* Maps and parses a file. On failure *f is left empty (safe to close). */
sl_status sl_st_open(sl_st_file *f, const char *path, sl_error *err);
void sl_st_close(sl_st_file *f);

const sl_tensor *sl_st_find(const sl_st_file *f, const char *name);

#endif /* SL_SAFETENSORS_H */
