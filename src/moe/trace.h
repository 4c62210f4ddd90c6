/*
 * Routing traces (--router-trace, sluice trace-replay): what each MoE layer's router picked for
 * every token, in a binary file a training script writes too. Little-endian:
 *
 *   header, 24 bytes    "SLTRACE1"  u32 n_layers  u32 n_experts  u32 k  u32 reserved (0)
 *   records, to EOF     u32 step  u16 layer  u8 kind  u8 n  |  n x u16 expert id
 *
 *   kind 0  the router's picks of `layer` for one token, in rank order (1 <= n <= k). The
 *           records of one (step, layer) are one request of the layer's expert cache (a prefill
 *           chunk's tokens are fetched at once; a decode step is one token): the union of
 *           their ids.
 *   kind 1  a prediction of `layer`'s picks made before the layer ran (next-layer pre-gating),
 *           n <= k ids in predicted rank order; only a prefetch simulation reads them.
 *
 * Steps never decrease, and within a step layers never decrease, so the records of one
 * (step, layer) are contiguous. Every id < n_experts, layer < n_layers, k <= 64,
 * n_experts <= 65535; a short record is an error naming the file and its byte offset.
 */
#ifndef SL_TRACE_H
#define SL_TRACE_H

#include "core/common.h"

#define SL_TRACE_MAGIC  "SLTRACE1"
#define SL_TRACE_HEADER 24
#define SL_TRACE_MAX_K  64
/* The most a writer keeps in memory (sl_trace_writer_reserve): past it, nothing (a server's
 * --stats would otherwise grow without end; 256 MiB is ~10^7 token-layers of top-8) */
#define SL_TRACE_KEEP_MAX ((size_t)256 << 20)

enum { SL_TRACE_PICKS = 0, SL_TRACE_PREDICT = 1 };

/* A trace in memory, its records as parallel arrays (record i's ids: ids[off[i] .. off[i+1])). */
typedef struct sl_trace {
    int32_t n_layers, n_experts, k;
    int64_t n_records;
    uint32_t *step;  /* [n_records] */
    uint16_t *layer; /* [n_records] */
    uint8_t *kind;   /* [n_records] */
    int64_t *off;    /* [n_records + 1] */
    uint16_t *ids;   /* [off[n_records]] */
} sl_trace;

/* Parses a whole trace held in memory; name is the file named in errors. */
sl_status sl_trace_parse(sl_trace *t, const char *name, const uint8_t *data, size_t len,
                         sl_error *err);
/* Reads and parses the trace file at path. */
sl_status sl_trace_load(sl_trace *t, const char *path, sl_error *err);
void sl_trace_free(sl_trace *t);

/*
 * A streaming writer: to a file (path), into memory (keep), or both. Its memory grows only in
 * sl_trace_writer_reserve, which a caller runs between forward passes, so that adding records
 * during one never allocates. An error (a failed write, a full buffer) sticks: every later call
 * returns it, and close reports it.
 */
typedef struct sl_trace_writer {
    FILE *f;
    char path[512];
    int32_t n_layers, n_experts, k;
    uint32_t step; /* the step the next records carry (the caller advances it) */
    int keep;      /* records kept in memory too */
    int dropped;   /* they were, until they outgrew SL_TRACE_KEEP_MAX */
    uint8_t *mem;  /* keep: the whole trace so far, header included */
    size_t len, cap;
    int64_t records;
    sl_status st;
    sl_error err; /* the sticky error's message */
} sl_trace_writer;

/* Opens a writer (path NULL: memory only; keep 0: file only) and writes the header. */
sl_status sl_trace_writer_open(sl_trace_writer *w, const char *path, int keep, int32_t n_layers,
                               int32_t n_experts, int32_t k, sl_error *err);
/* Room for `bytes` more of records in memory (nothing without keep); past SL_TRACE_KEEP_MAX
 * the memory is dropped instead (keep 0, dropped 1), not an error. */
sl_status sl_trace_writer_reserve(sl_trace_writer *w, size_t bytes, sl_error *err);
/* Bytes one record of n ids takes. */
static inline size_t sl_trace_record_bytes(int32_t n) {
    return 8 + 2 * (size_t)n;
}
/* Appends one record at the writer's step (ids as int32, each < n_experts, 1 <= n <= k). */
sl_status sl_trace_writer_add(sl_trace_writer *w, int32_t layer, int32_t kind, const int32_t *ids,
                              int32_t n, sl_error *err);
/* Flushes and closes the file (the memory stays until sl_trace_writer_free); its sticky error
 * or a failed flush. */
sl_status sl_trace_writer_close(sl_trace_writer *w, sl_error *err);
void sl_trace_writer_free(sl_trace_writer *w);

#endif /* SL_TRACE_H */
