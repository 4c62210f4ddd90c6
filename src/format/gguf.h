/*
 * GGUF reader (llama.cpp's format, versions 2 and 3; all numbers little-endian):
 *
 *   +-------+---------+-----------+--------+---------------------+--------------+-----+------+
 *   | magic | version | n_tensors | n_kv   | n_kv key/values     | n_tensors    | pad | data |
 *   | GGUF  | u32     | u64       | u64    | str key, u32 type,  | tensor infos | to  |      |
 *   |       |         |           |        | value               |              | al. |      |
 *   +-------+---------+-----------+--------+---------------------+--------------+-----+------+
 *
 *   str         = u64 length, then that many bytes (no NUL)
 *   value       = a scalar of the type, a str, or an array: u32 element type, u64 count,
 *                 count elements (nested arrays are refused here)
 *   tensor info = str name, u32 n_dims (<= 4), u64 ne[n_dims] (ne[0] = row length),
 *                 u32 ggml type, u64 offset from the start of the data section
 *   data        = starts at the first multiple of general.alignment (default 32) after the
 *                 tensor infos; every tensor's offset is a multiple of it too
 *
 * The file is mapped read-only; string values and tensor data are views into the mapping.
 * Every count, length and offset is checked against the bytes left and against overflow
 * before use; tensor byte sizes come from the dtype table (format/tensor.h: block size, bytes
 * per block) and each tensor's bytes must lie inside the file. Errors name the file and the key or
 * tensor.
 */
#ifndef SL_GGUF_H
#define SL_GGUF_H

#include "core/common.h"
#include "format/tensor.h"

/* Metadata value types, as numbered in the file. */
typedef enum sl_gguf_vtype {
    SL_GGUF_U8 = 0,
    SL_GGUF_I8 = 1,
    SL_GGUF_U16 = 2,
    SL_GGUF_I16 = 3,
    SL_GGUF_U32 = 4,
    SL_GGUF_I32 = 5,
    SL_GGUF_F32 = 6,
    SL_GGUF_BOOL = 7,
    SL_GGUF_STRING = 8,
    SL_GGUF_ARRAY = 9,
    SL_GGUF_U64 = 10,
    SL_GGUF_I64 = 11,
    SL_GGUF_F64 = 12,
    SL_GGUF_VTYPE_COUNT
} sl_gguf_vtype;

/* ggml tensor types sluice reads, with ggml's ids (other ids are refused). */
typedef enum sl_gguf_ttype {
    SL_GGML_F32 = 0,
    SL_GGML_F16 = 1,
    SL_GGML_Q4_0 = 2,
    SL_GGML_Q4_1 = 3,
    SL_GGML_Q5_0 = 6,
    SL_GGML_Q5_1 = 7,
    SL_GGML_Q8_0 = 8,
    SL_GGML_Q2_K = 10,
    SL_GGML_Q3_K = 11,
    SL_GGML_Q4_K = 12,
    SL_GGML_Q5_K = 13,
    SL_GGML_Q6_K = 14,
    SL_GGML_IQ4_NL = 20,
    SL_GGML_IQ4_XS = 23,
    SL_GGML_BF16 = 30,
    SL_GGML_MXFP4 = 39,
} sl_gguf_ttype;

#define SL_GGUF_MAX_DIMS          4
#define SL_GGUF_DEFAULT_ALIGNMENT 32

/* A string in the file: not NUL-terminated. */
typedef struct sl_gguf_str {
    const char *s;
    uint64_t len;
} sl_gguf_str;

typedef struct sl_gguf_kv {
    char *key;            /* heap copy, NUL-terminated */
    uint32_t type;        /* sl_gguf_vtype */
    uint32_t arr_type;    /* element type when type == SL_GGUF_ARRAY */
    uint64_t n;           /* array length; 1 for a scalar */
    const uint8_t *val;   /* the value's bytes in the image (for an array: its first element) */
    const uint8_t **strs; /* string arrays: where each element's u64 length is [n] */
} sl_gguf_kv;

typedef struct sl_gguf_tensor {
    char *name;                   /* heap copy, NUL-terminated */
    uint32_t type;                /* sl_gguf_ttype */
    sl_dtype dtype;               /* the same type as sluice names it */
    int32_t n_dims;               /* 1..4 */
    int64_t ne[SL_GGUF_MAX_DIMS]; /* ne[0] innermost (row length); unused dims are 1 */
    uint64_t offset;              /* from the start of the data section */
    const void *data;             /* inside the image */
    uint64_t nbytes;
} sl_gguf_tensor;

typedef struct sl_gguf_file {
    char *path;
    void *map; /* whole file (open) or NULL (parse of a caller's buffer) */
    size_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start; /* byte offset of the data section */
    int64_t n_kv;
    sl_gguf_kv *kv; /* file order */
    int64_t n_tensors;
    sl_gguf_tensor *tensors; /* file order */
    int64_t *by_name;        /* tensor indices sorted by name [n_tensors] */
} sl_gguf_file;

/* Parses an in-memory image (the fuzz target's entry; open uses it too). The image must outlive
 * *f. On failure *f is left safe to close. */
sl_status sl_gguf_parse(sl_gguf_file *f, const char *path, const void *bytes, size_t size,
                        sl_error *err);
/* Whether path names a GGUF file (by suffix, or by its magic: a renamed download). */
int sl_gguf_is_file(const char *path);
/* Maps and parses a file. On failure *f is left safe to close. */
sl_status sl_gguf_open(sl_gguf_file *f, const char *path, sl_error *err);
void sl_gguf_close(sl_gguf_file *f);

/* The sl_dtype of a ggml type id (SL_DTYPE_NONE for one this reader refuses; block sizes and
 * bytes come from format/tensor.h), and its name ("Q4_K"; "?" if refused). */
sl_dtype sl_gguf_dtype(uint32_t type);
const char *sl_gguf_type_name(uint32_t type);

/* Metadata. find returns NULL when absent. The getters fail with SL_ERR_FORMAT naming the file
 * and key when the key is absent or its type does not fit: integer getters take any integer
 * type whose value fits the result; f32 takes F32 or F64. */
const sl_gguf_kv *sl_gguf_find_kv(const sl_gguf_file *f, const char *key);
sl_status sl_gguf_get_u32(const sl_gguf_file *f, const char *key, uint32_t *out, sl_error *err);
sl_status sl_gguf_get_u64(const sl_gguf_file *f, const char *key, uint64_t *out, sl_error *err);
sl_status sl_gguf_get_i64(const sl_gguf_file *f, const char *key, int64_t *out, sl_error *err);
sl_status sl_gguf_get_f32(const sl_gguf_file *f, const char *key, float *out, sl_error *err);
sl_status sl_gguf_get_bool(const sl_gguf_file *f, const char *key, int32_t *out, sl_error *err);
sl_status sl_gguf_get_str(const sl_gguf_file *f, const char *key, sl_gguf_str *out, sl_error *err);
/* An array whose elements are of type elem (exactly); *out receives the entry, whose n is the
 * length. Elements are read with the accessors below (i < n, the type as checked here). */
sl_status sl_gguf_get_arr(const sl_gguf_file *f, const char *key, sl_gguf_vtype elem,
                          const sl_gguf_kv **out, sl_error *err);
sl_gguf_str sl_gguf_arr_str(const sl_gguf_kv *kv, uint64_t i);
/* Integer elements (U64 above INT64_MAX wrap: check arr_type for U64 arrays). */
int64_t sl_gguf_arr_int(const sl_gguf_kv *kv, uint64_t i);
/* F32 / F64 elements. */
double sl_gguf_arr_float(const sl_gguf_kv *kv, uint64_t i);

/* Tensors: by name (NULL when absent), or by index 0..n_tensors-1 in file order. */
const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf_file *f, const char *name);
static inline const sl_gguf_tensor *sl_gguf_tensor_at(const sl_gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

#endif /* SL_GGUF_H */
