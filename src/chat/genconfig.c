/* generation_config.json reading (see genconfig.h). */
#include "chat/genconfig.h"

#include <jansson.h>
#include <sys/stat.h>

static float num_or(json_t *o, const char *key, float dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? (float)json_number_value(v) : dflt;
}

sl_status sl_gen_config_load(const char *dir, sl_gen_config *g, sl_error *err) {
    *g = (sl_gen_config){.bos = -1, .temperature = -1, .top_p = -1, .min_p = -1, .top_k = -1};
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return SL_OK;
    json_t *root;
    sl_status st = sl_json_load_file(path, &root, err);
    if (st) return st;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        g->eos[g->n_eos++] = (int32_t)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *v;
        json_array_foreach(eos, i, v) {
            if (json_is_integer(v) && g->n_eos < SL_MAX_EOS)
                g->eos[g->n_eos++] = (int32_t)json_integer_value(v);
        }
    }
    json_t *bos = json_object_get(root, "bos_token_id");
    if (json_is_integer(bos)) g->bos = (int32_t)json_integer_value(bos);
    if (json_is_true(json_object_get(root, "do_sample")) || !json_object_get(root, "do_sample")) {
        g->temperature = num_or(root, "temperature", -1);
        g->top_p = num_or(root, "top_p", -1);
        g->min_p = num_or(root, "min_p", -1);
        json_t *k = json_object_get(root, "top_k");
        if (json_is_integer(k)) g->top_k = (int32_t)json_integer_value(k);
    }
    json_decref(root);
    return SL_OK;
}

int sl_gen_config_is_eos(const sl_gen_config *g, int32_t id) {
    for (int32_t i = 0; i < g->n_eos; i++)
        if (g->eos[i] == id) return 1;
    return 0;
}
