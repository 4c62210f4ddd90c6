/*
 * sluice: an inference engine for Mixture-of-Experts language models.
 *
 * Public library API. Everything here returns an sl_status (0 on success);
 * on failure the caller's sl_error holds one line saying what went wrong,
 * naming the file and tensor involved. The library never exits or prints.
 *
 * Lifetime: a model (weights, mapped read-only) can serve several sessions;
 * a session owns the KV cache and every activation buffer, all allocated at
 * sl_session_create, so sl_session_forward never allocates.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SL_VERSION "0.1.0"

typedef enum sl_status {
    SL_OK = 0,
    SL_ERR_IO = -1,          /* open/read/mmap failed */
    SL_ERR_FORMAT = -2,      /* malformed file: bad header, offsets, dtype */
    SL_ERR_UNSUPPORTED = -3, /* valid file, but an architecture or option we do not run */
    SL_ERR_SHAPE = -4,       /* a tensor is missing or has the wrong shape */
    SL_ERR_ARG = -5,         /* bad argument from the caller */
    SL_ERR_NOMEM = -6,
} sl_status;

/* One error message, filled by the first failing call. */
typedef struct sl_error {
    sl_status code;
    char msg[768];
} sl_error;

typedef struct sl_model sl_model;
typedef struct sl_session sl_session;

typedef struct sl_model_params {
    int32_t n_threads; /* compute threads; 0 = all online cores */
} sl_model_params;

typedef struct sl_session_params {
    int32_t max_ctx;   /* KV cache length in tokens; 0 = min(model max, 4096) */
    int32_t max_batch; /* most tokens per forward call; 0 = 512 */
} sl_session_params;

/* Basic facts about a loaded model, for the CLI and callers. */
typedef struct sl_model_info {
    const char *arch; /* config.json model_type, e.g. "qwen3_moe" */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layers;
    int32_t n_moe_layers;
    int32_t n_experts;
    int32_t n_experts_used;
    int32_t max_position;
} sl_model_info;

/* Loads a Hugging Face checkpoint directory (config.json + safetensors). */
sl_status sl_model_load(const char *dir, const sl_model_params *params, sl_model **out,
                        sl_error *err);
void sl_model_free(sl_model *model);
void sl_model_get_info(const sl_model *model, sl_model_info *info);

sl_status sl_session_create(sl_model *model, const sl_session_params *params, sl_session **out,
                            sl_error *err);
void sl_session_free(sl_session *session);
/* Forgets the KV cache: the next forward starts at position 0. */
void sl_session_reset(sl_session *session);
/* Number of positions already in the KV cache. */
int32_t sl_session_pos(const sl_session *session);

/*
 * Runs n_tokens ids through the model at the current position, appending to the
 * KV cache. logits (may be NULL) receives float32 rows of vocab_size: every
 * position's row when all_logits != 0 (n_tokens x vocab), else only the last.
 * n_tokens may exceed max_batch: the call then runs in chunks of max_batch.
 */
sl_status sl_session_forward(sl_session *session, const int32_t *ids, int32_t n_tokens,
                             float *logits, int all_logits, sl_error *err);

/* Greedy argmax of one row of logits; ties go to the lower id. */
int32_t sl_argmax(const float *logits, int32_t n);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
