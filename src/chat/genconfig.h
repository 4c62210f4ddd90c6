/*
 * generation_config.json: the ids that end a reply and the sampling defaults
 * the model ships with. Missing file or keys leave the defaults. A GGUF file
 * carries the same in its metadata (sl_gen_config_from_gguf).
 */
#ifndef SL_GENCONFIG_H
#define SL_GENCONFIG_H

#include "core/common.h"

#define SL_MAX_EOS 8

typedef struct sl_gen_config {
    int32_t n_eos;
    int32_t eos[SL_MAX_EOS]; /* eos_token_id: an id or a list of ids */
    int32_t bos;             /* -1 when none */
    int32_t add_bos;         /* a prompt starts with bos: GGUF tokenizer.ggml.add_bos_token
                              * (generation_config.json does not say: 0) */
    /* sampling defaults; negative = not given */
    float temperature, top_p, min_p;
    int32_t top_k;
} sl_gen_config;

sl_status sl_gen_config_load(const char *dir, sl_gen_config *out, sl_error *err);

/*
 * The same from a GGUF file's metadata: eos ids from tokenizer.ggml.eos_token_id,
 * eot_token_id and eom_token_id, plus a control token "<|endoftext|>" (Qwen's
 * generation_config.json lists it beside <|im_end|>, and GGUF has one eos key); bos from
 * bos_token_id, add_bos from add_bos_token; sampling defaults from general.sampling.temp,
 * top_p, min_p, top_k. Absent keys leave the defaults; an id outside tokenizer.ggml.tokens or
 * a key of the wrong type is SL_ERR_FORMAT naming the file and the key.
 */
struct sl_gguf_file;
sl_status sl_gen_config_from_gguf(const struct sl_gguf_file *f, sl_gen_config *out, sl_error *err);
int sl_gen_config_is_eos(const sl_gen_config *g, int32_t id);

#endif /* SL_GENCONFIG_H */
