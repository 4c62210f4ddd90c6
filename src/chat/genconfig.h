/*
 * generation_config.json: the ids that end a reply and the sampling defaults
 * the model ships with. Missing file or keys leave the defaults.
 */
#ifndef SL_GENCONFIG_H
#define SL_GENCONFIG_H

#include "core/common.h"

#define SL_MAX_EOS 8

typedef struct sl_gen_config {
    int32_t n_eos;
    int32_t eos[SL_MAX_EOS]; /* eos_token_id: an id or a list of ids */
    int32_t bos;             /* -1 when none */
    /* sampling defaults; negative = not given */
    float temperature, top_p, min_p;
    int32_t top_k;
} sl_gen_config;

sl_status sl_gen_config_load(const char *dir, sl_gen_config *out, sl_error *err);
int sl_gen_config_is_eos(const sl_gen_config *g, int32_t id);

#endif /* SL_GENCONFIG_H */
