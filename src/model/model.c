/*
 * Model loading (config -> family -> checkpoint binding) and sessions (KV
 * cache, RoPE tables and every activation buffer carved from one arena, so
 * the forward pass never allocates).
 */
#include "model/model.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/pack.h"
#include "moe/cache_sim.h"
#include "model/blocks.h"
#include "model/gguf_ckpt.h"
#include "model/rope.h"
#include "model/split.h"

/* A packed model's config is the "config" object of its manifest; *version its format. */
/* A pack's manifest: its config into cfg, its format version, and (gv, may be NULL) the values
 * a pack of a GGUF keeps as llama.cpp's converter changed them (gguf_ckpt.c; packer.c writes
 * "gguf_values"): gv[0] norms hold 1 + w, gv[1] A_log holds -exp(A_log), gv[2] value heads
 * tiled, read into the checkpoint's flags as from the GGUF. */
static sl_status load_manifest_config(sl_config *cfg, const char *path, int32_t *version,
                                      int32_t gv[3], sl_error *err) {
    json_error_t je;
    char *file = NULL;
    size_t len = 0;
    if (sl_read_file(path, &file, &len, err)) return SL_ERR_IO;
    json_t *man = json_loadb(file, len, 0, &je);
    free(file);
    if (!man) return sl_fail(err, SL_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    sl_status st;
    json_t *vals = json_object_get(man, "gguf_values");
    static const char *const keys[3] = {"norm_folded", "A_neg_exp", "v_tiled"};
    for (int i = 0; gv && i < 3; i++)
        gv[i] = json_is_object(vals) && json_is_true(json_object_get(vals, keys[i]));
    json_t *fmt = json_object_get(man, "format"), *ver = json_object_get(man, "version");
    json_t *cj = json_object_get(man, "config");
    char *text = NULL;
    const json_int_t v = json_integer_value(ver);
    *version = (int32_t)v;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "sluice") != 0)
        st = sl_fail(err, SL_ERR_FORMAT, "%s: not a sluice manifest", path);
    else if (v < SL_PACK_VERSION_MIN || v > SL_PACK_VERSION)
        st =
            sl_fail(err, SL_ERR_UNSUPPORTED, "%s: format version %lld (this sluice reads %d to %d)",
                    path, (long long)v, SL_PACK_VERSION_MIN, SL_PACK_VERSION);
    else if (!json_is_object(cj) || !(text = json_dumps(cj, 0)))
        st = sl_fail(err, SL_ERR_FORMAT, "%s: missing 'config' object", path);
    else
        st = sl_config_parse(cfg, text, path, err);
    free(text);
    json_decref(man);
    return st;
}

/* Every weight the families bind (absent ones have data == NULL), for upload_weights: the
 * shared layers', then the family's own; with layer, the layer each serves (-1: the embedding,
 * n_layers: the final norm and the head). */
static int32_t model_weights(sl_model *m, sl_tensor **out, int32_t *layer) {
    int32_t n = 0, l = -1;
#define W(t) (out ? (void)(out[n] = &(t)) : (void)0, layer ? (void)(layer[n] = l) : (void)0, n++)
    W(m->embed);
    l = m->cfg.n_layers;
    W(m->norm), W(m->lm_head);
    for (l = 0; l < m->cfg.n_layers; l++) {
        sl_layer *L = &m->layers[l];
        W(L->attn_norm), W(L->wq), W(L->wk), W(L->wv), W(L->wo), W(L->bq), W(L->bk), W(L->bv);
        W(L->bo), W(L->q_norm), W(L->k_norm), W(L->sinks), W(L->in_qkvz), W(L->in_ba), W(L->in_qkv);
        W(L->in_z), W(L->in_b), W(L->in_a), W(L->conv_w), W(L->A_log), W(L->dt_bias);
        W(L->lin_norm), W(L->out_proj), W(L->ffn_norm), W(L->mlp_gate), W(L->mlp_up);
        W(L->mlp_down), W(L->router), W(L->router_bias);
        W(L->select_bias), W(L->expert_scale), W(L->sh_gate), W(L->sh_up), W(L->sh_down),
            W(L->sh_router);
    }
#undef W
    if (m->family->weights)
        n += m->family->weights(m, out ? out + n : NULL, layer ? layer + n : NULL);
    return n;
}

/* The partition that runs layer l (-1: the embedding's, 0; n_layers: the head's, the last). */
static int32_t part_of(const sl_model *m, int32_t l) {
    int32_t q = 0;
    while (q + 1 < m->n_parts && l >= m->parts[q].layer1)
        q++;
    return q;
}

/* Copies every bound weight (data, and scales/biases of quantised ones) into the backend memory
 * of its layer's partition and points the model's tensors there. A tensor bound twice (a tied
 * head) is copied once a partition. */
static sl_status upload_weights(sl_model *m, sl_error *err) {
    const int32_t n = model_weights(m, NULL, NULL);
    sl_tensor **ts = calloc((size_t)n, sizeof *ts);
    const void **src = calloc((size_t)n, sizeof *src);
    int32_t *layer = calloc((size_t)n, sizeof *layer);
    m->uploads = calloc((size_t)n, sizeof *m->uploads);
    m->upload_part = calloc((size_t)n, sizeof *m->upload_part);
    if (!ts || !src || !layer || !m->uploads || !m->upload_part) {
        free(ts), free(src), free(layer);
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    model_weights(m, ts, layer);
    sl_status st = SL_OK;
    for (int32_t i = 0; !st && i < n; i++) {
        sl_tensor *t = ts[i];
        if (!t->data) continue;
        const int32_t q = part_of(m, layer[i]);
        const sl_backend *be = m->parts[q].be;
        int32_t j = 0;
        while (j < m->n_uploads && (src[j] != t->data || m->upload_part[j] != q))
            j++;
        /* scales and biases (Q8/Q4; FP8 has scales alone) of sb bytes each after the data */
        const size_t sb = sl_tensor_scale_bytes(t);
        const size_t sb_s = t->scales ? sb : 0, sb_b = t->biases ? sb : 0;
        const size_t data_bytes = (t->nbytes + 63) & ~(size_t)63;
        if (j == m->n_uploads) {
            uint8_t *d = be->ops->alloc(be, data_bytes + sb_s + sb_b);
            if (!d) {
                st = sl_fail(err, SL_ERR_NOMEM, "out of GPU memory for weight '%s' (%.1f MB)",
                             t->name ? t->name : "?", (double)(t->nbytes + sb_s + sb_b) / 1e6);
                break;
            }
            be->ops->to_dev(be, d, t->data, t->nbytes);
            if (sb_s) be->ops->to_dev(be, d + data_bytes, t->scales, sb_s);
            if (sb_b) be->ops->to_dev(be, d + data_bytes + sb_s, t->biases, sb_b);
            src[j] = t->data;
            m->upload_part[m->n_uploads] = q;
            m->uploads[m->n_uploads++] = d;
        }
        uint8_t *d = m->uploads[j];
        t->data = d;
        if (sb_s) t->scales = d + data_bytes;
        if (sb_b) t->biases = d + data_bytes + sb_s;
    }
    free(ts);
    free(src);
    free(layer);
    return st;
}

/* Pins (or unpins) the expert store's own host buffers: resident blobs or stream slots. */
static void pin_store(sl_model *m, int pin) {
    for (int32_t l = 0; l < m->experts.n_layers; l++) {
        sl_expert_layer *L = &m->experts.layers[l];
        uint8_t *p = L->resident ? L->resident : L->slot_mem;
        const size_t n =
            (size_t)(L->resident ? L->n_experts : L->slots.n_slots) * L->hdr.blob_bytes;
        if (!p || !n) continue;
        if (pin)
            m->be.ops->pin(&m->be, p, n);
        else
            m->be.ops->unpin(&m->be, p);
    }
}

/* ---- what a MODEL path is (sl_model_check_dir) ---- */

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

static int is_file_in(const char *dir, const char *name) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* name is in dir but no regular file (a FIFO, which would block whoever opens it): err says
 * so, naming it. */
static int is_other_in(const char *dir, const char *name, sl_error *err) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return 0;
    const int fd = sl_open_regular(path, O_RDONLY, NULL, err); /* fails, with the message */
    if (fd >= 0) close(fd);
    return fd < 0;
}

sl_status sl_model_check_dir(const char *path, int32_t *kind, sl_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        if (S_ISREG(sb.st_mode) && sl_gguf_is_file(path)) {
            *kind = SL_MODEL_GGUF;
            return SL_OK;
        }
        /* A file of a model directory (config.json, a shard, core.bin): name the directory. */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        const char *parent = !slash ? "." : dir[0] ? dir : "/";
        if (is_file_in(parent, "config.json") || is_file_in(parent, "manifest.json"))
            return sl_fail(err, SL_ERR_ARG,
                           "%s is a file: MODEL is the directory that holds the model, give %s",
                           path, parent);
        return sl_fail(err, SL_ERR_ARG,
                       "%s is a file, not a model directory: give a Hugging Face checkpoint "
                       "directory (config.json, *.safetensors) or a directory made by 'sluice "
                       "pack'",
                       path);
    }
    if (is_other_in(path, "manifest.json", err) || is_other_in(path, "core.bin", err) ||
        is_other_in(path, "config.json", err))
        return SL_ERR_IO;
    if (is_file_in(path, "manifest.json")) {
        /* sl_pack writes the manifest last, so a pack without core.bin was copied in part. */
        if (!is_file_in(path, "core.bin"))
            return sl_fail(err, SL_ERR_IO,
                           "%s: core.bin is missing from this sluice pack (copied in part?): "
                           "copy the whole pack again, or pack the checkpoint again with "
                           "'sluice pack'",
                           path);
        *kind = SL_MODEL_PACK;
        return SL_OK;
    }
    int32_t n_safetensors = 0, n_gguf = 0;
    char first_gguf[256] = "";
    DIR *d = opendir(path);
    if (!d) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        n_safetensors += has_suffix(e->d_name, ".safetensors");
        if (has_suffix(e->d_name, ".gguf") && n_gguf++ == 0)
            snprintf(first_gguf, sizeof first_gguf, "%s", e->d_name);
    }
    closedir(d);
    if (n_gguf && !n_safetensors)
        return sl_fail(err, SL_ERR_ARG,
                       "%s holds only GGUF files: give the GGUF file itself (the first part of a "
                       "split set), e.g. %s/%s",
                       path, path, first_gguf);
    if (!is_file_in(path, "config.json"))
        return sl_fail(err, SL_ERR_IO,
                       "%s is not a model directory: it has neither config.json (a Hugging Face "
                       "checkpoint) nor manifest.json (a directory made by 'sluice pack')",
                       path);
    *kind = SL_MODEL_HF;
    return SL_OK;
}

/* The config of the model in dir (config.json, a pack's manifest, or a GGUF file's metadata),
 * its path into path. */
static sl_status read_config(const char *dir, sl_config *cfg, int32_t *kind, int32_t *pack_version,
                             int32_t gv[3], char *path, size_t path_size, sl_error *err) {
    sl_status st = sl_model_check_dir(dir, kind, err);
    if (st) return st;
    if (*kind == SL_MODEL_GGUF) {
        snprintf(path, path_size, "%s", dir);
        char *text = NULL;
        if (!(st = sl_gguf_config_text(dir, &text, err))) st = sl_config_parse(cfg, text, dir, err);
        free(text);
        return st;
    }
    snprintf(path, path_size, "%s/%s", dir,
             *kind == SL_MODEL_PACK ? "manifest.json" : "config.json");
    return *kind == SL_MODEL_PACK ? load_manifest_config(cfg, path, pack_version, gv, err)
                                  : sl_config_load(cfg, path, err);
}

sl_status sl_model_peek(const char *dir, int32_t *max_position, int32_t *vocab_size,
                        sl_error *err) {
    sl_config cfg = {0};
    int32_t kind, version;
    char path[4096];
    sl_status st = read_config(dir, &cfg, &kind, &version, NULL, path, sizeof path, err);
    if (!st) {
        *max_position = cfg.max_position;
        *vocab_size = cfg.vocab_size;
    }
    sl_config_free(&cfg);
    return st;
}

/* Which group of weights a checkpoint tensor belongs to, by its (Hugging Face) name. */
static int weight_group(const sl_tensor *t) {
    const char *n = t->name;
    if (sl_ckpt_is_expert_name(n)) return 0;
    if (strstr(n, "shared_expert")) return 1;
    if (t->ndim < 2) return 7;
    if (strstr(n, ".self_attn.")) return 2;
    if (strstr(n, ".linear_attn.")) return 3;
    if (strstr(n, "mlp.gate.weight") || strstr(n, ".router.proj.") || strstr(n, ".router.weight"))
        return 4;
    if (strstr(n, "embed_tokens")) return 5;
    if (strstr(n, "lm_head")) return 6;
    return 8;
}

/* "sigmoid + selection bias, top-8 of the best 4 of 8 groups, renormalised, x2.5; weights on
 * the experts' inputs": the router rule (sl_route_cfg) in words. */
static void describe_router(const sl_model *m, char *buf, size_t cap) {
    const sl_config *c = &m->cfg;
    const sl_route_cfg r = sl_config_route(c);
    int has_bias = 0, has_sb = 0, has_es = 0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        has_bias |= m->layers[l].router_bias.data != NULL;
        has_sb |= m->layers[l].select_bias.data != NULL;
        has_es |= m->layers[l].expert_scale.data != NULL;
    }
    static const char *const score[] = {"softmax, then top-%d", "top-%d, then softmax",
                                        "sigmoid, top-%d", "top-%d, then sigmoid"};
    if (c->n_experts <= 0) {
        snprintf(buf, cap, "-");
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, score[r.score], c->n_experts_used);
#define ADD(...) (n += n < cap ? (size_t)snprintf(buf + n, cap - n, __VA_ARGS__) : 0)
    if (has_bias) ADD(", linear bias");
    if (has_sb) ADD(" by score + correction bias");
    if (r.n_group > 1) ADD(" from the best %d of %d groups", r.topk_group, r.n_group);
    if (r.renormalize) ADD(", renormalised");
    if (has_es) ADD(", per-expert scales");
    if (r.scale != 0.0f && r.scale != 1.0f) ADD(", x%g", (double)r.scale);
    if (c->moe_weight_input) ADD("; weights on the experts' inputs");
#undef ADD
}

/* "experts Q4_K 4.50 bpw (67%), Q6_K 6.56 (33%); attention ..." : per group of weights, each
 * storage type with its bits per weight and its share of the group's weights. */
static void describe_types(const sl_model *m, char *buf, size_t cap) {
    static const char *const names[] = {"experts", "shared expert", "attention", "linear attention",
                                        "router",  "embedding",     "head",      "vectors",
                                        "other"};
    enum { G = 9 };
    double count[G][SL_DTYPE_COUNT] = {{0}};
    int32_t fp8_rows = 0, fp8_cols = 0; /* block of the FP8 scales, which count in its bits */
    /* Q8/Q4 bits depend on the group and scale dtype (an MLX checkpoint mixes them): summed */
    double qbits[G][SL_DTYPE_COUNT] = {{0}};
    /* Experts the store lays out as it reads them (MXFP4 codes and scales apart in the
     * checkpoint) count as the store holds them, below. */
    const int relaid = m->kind != SL_MODEL_PACK && m->cfg.expert_layout != SL_EXPERT_LAYOUT_DEFAULT;
    for (int32_t i = 0; i < m->ck.n_entries; i++) {
        const sl_tensor *t = m->ck.entries[i].t;
        const size_t len = strlen(t->name);
        if (len > 10 && strcmp(t->name + len - 10, "_scale_inv") == 0) continue;
        if (sl_ckpt_past_layers(&m->ck, t->name, m->cfg.n_layers)) continue;
        if (relaid && sl_ckpt_is_expert_name(t->name) && !strstr(t->name, "_bias")) continue;
        if (sl_tensor_is_fp8(t)) fp8_rows = t->brows, fp8_cols = t->group;
        double n = 1;
        for (int32_t d = 0; d < t->ndim; d++)
            n *= (double)t->shape[d];
        count[weight_group(t)][t->dtype] += n;
        if (sl_dtype_is_quant(t->dtype))
            qbits[weight_group(t)][t->dtype] +=
                n * ((t->dtype == SL_DTYPE_Q4 ? 4.0 : 8.0) +
                     (sl_tensor_sdtype(t) == SL_DTYPE_F32 ? 64.0 : 32.0) / sl_tensor_group(t));
    }
    /* A pack's experts are in the store, not the checkpoint. */
    for (int32_t l = 0; (m->kind == SL_MODEL_PACK || relaid) && l < m->cfg.n_layers; l++) {
        const sl_expert_layer *L = &m->experts.layers[l];
        for (int k = 0; L->n_experts && k < 3; k++) {
            const sl_dtype dt = relaid ? L->proto[k].dtype : L->hdr.dtype[k];
            const double n = (double)L->n_experts * (double)m->cfg.hidden_size *
                             (double)m->cfg.moe_intermediate_size;
            count[0][dt] += n;
            if (sl_dtype_is_quant(dt)) qbits[0][dt] += n * sl_dtype_bits(dt);
        }
    }
    size_t k = 0;
    buf[0] = '\0';
    for (int g = 0; g < G && k < cap; g++) {
        double total = 0;
        for (int d = 0; d < SL_DTYPE_COUNT; d++)
            total += count[g][d];
        if (total == 0) continue;
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? "; " : "", names[g]);
        for (int d = 0, first = 1; d < SL_DTYPE_COUNT && k < cap; d++) {
            if (count[g][d] == 0) continue;
            const double bpw =
                qbits[g][d] > 0 ? qbits[g][d] / count[g][d] : sl_dtype_bits((sl_dtype)d);
            if (d == SL_DTYPE_F8_E4M3 && fp8_rows)
                k += (size_t)snprintf(buf + k, cap - k,
                                      "%s F8_E4M3 with %dx%d block scales %.3f bpw",
                                      first ? "" : ",", fp8_rows, fp8_cols,
                                      8.0 + 32.0 / ((double)fp8_rows * fp8_cols));
            else
                k += (size_t)snprintf(buf + k, cap - k, "%s %s %.2f bpw", first ? "" : ",",
                                      sl_dtype_name((sl_dtype)d), bpw);
            if (count[g][d] < total && k < cap)
                k += (size_t)snprintf(buf + k, cap - k, " (%.0f%%)", 100.0 * count[g][d] / total);
            first = 0;
        }
    }
}

/* A (name: value kB) line of /proc/meminfo in bytes, or -1. */
static int64_t meminfo(const char *name) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    const size_t n = strlen(name);
    while (v < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':')
            v = (int64_t)strtoll(line + n + 1, NULL, 10) * 1024;
    fclose(f);
    return v;
}

/* The resident core: every tensor but the routed experts (and n-gram tables). */
static int64_t resident_bytes(const sl_model *m) {
    int64_t resident = 0;
    for (int32_t i = 0; i < m->ck.n_entries; i++) {
        const sl_tensor *t = m->ck.entries[i].t;
        if (sl_ckpt_is_expert_name(t->name) || strstr(t->name, ".ngram_embedding.")) continue;
        if (sl_ckpt_past_layers(&m->ck, t->name, m->cfg.n_layers)) continue;
        const size_t len = strlen(t->name); /* FP8 block scales: counted with their weights */
        if (len > 10 && strcmp(t->name + len - 10, "_scale_inv") == 0) continue;
        resident += (int64_t)t->nbytes;
        resident += (int64_t)(sl_tensor_scale_bytes(t) * (size_t)(!!t->scales + !!t->biases));
    }
    return resident;
}

/* --cache-mem auto: what /proc/meminfo calls available, less the resident core, a session's KV
 * cache at the default context (min(positions, 4096)) with 64 MiB of scratch, and a reserve for
 * the page cache (10% of the memory, at least 1 GiB): the expert reads and everything else the
 * machine runs need it. The store clamps it to [top-k, all experts] a layer. 0 when unknown. */
static int64_t auto_cache_mem(const sl_model *m, int64_t *avail) {
    const int64_t total = meminfo("MemTotal"), av = meminfo("MemAvailable");
    *avail = av;
    if (total <= 0 || av <= 0) return 0;
    const sl_config *c = &m->cfg;
    const int64_t ctx = SL_MIN(c->max_position > 0 ? c->max_position : 4096, 4096);
    const int64_t kv = 2 * (int64_t)c->n_layers * ctx * c->n_kv_heads * c->head_dim * 4;
    const int64_t reserve = SL_MAX(total / 10, (int64_t)1 << 30);
    const int64_t b = av - resident_bytes(m) - kv - ((int64_t)64 << 20) - reserve;
    return SL_MAX(b, (int64_t)1); /* too little: the store gives the top-k minimum */
}

/* ---- the pipeline split (model/split.h) ---- */

/* The layer a checkpoint tensor belongs to ("<prefix>layers.N. ..."), or -1. */
static int32_t layer_of(const sl_ckpt *ck, const char *name) {
    const size_t pl = strlen(ck->prefix);
    if (strncmp(name, ck->prefix, pl) != 0 || strncmp(name + pl, "layers.", 7) != 0) return -1;
    char *end;
    const long l = strtol(name + pl + 7, &end, 10);
    return end != name + pl + 7 && *end == '.' && l >= 0 && l < INT32_MAX ? (int32_t)l : -1;
}

/* What each layer puts on its partition, for the planner: its resident tensors (every tensor of
 * the checkpoint named after the layer but the routed experts, the family's own included), its
 * rows of the KV cache at the default context (as auto_cache_mem counts it) or its recurrent
 * state, and on a device backend its expert slots. The embedding goes to partition 0, the rest
 * (final norm, head) to the last. */
static void split_bytes(const sl_model *m, int32_t gpu_experts, int64_t *layer, int64_t *first,
                        int64_t *last) {
    const sl_config *c = &m->cfg;
    int64_t embed = 0;
    *first = *last = 0;
    for (int32_t i = 0; i < m->ck.n_entries; i++) {
        const sl_tensor *t = m->ck.entries[i].t;
        if (sl_ckpt_is_expert_name(t->name) || strstr(t->name, ".ngram_embedding.")) continue;
        const int32_t l = layer_of(&m->ck, t->name);
        if (l >= c->n_layers) continue;
        const int64_t n = (int64_t)t->nbytes +
                          (int64_t)(sl_tensor_scale_bytes(t) * (size_t)(!!t->scales + !!t->biases));
        if (l >= 0)
            layer[l] += n;
        else if (strstr(t->name, "embed_tokens"))
            *first += n, embed += strstr(t->name, "embed_tokens.") ? n : 0;
        else
            *last += n;
    }
    if (c->tie_word_embeddings) *last += embed; /* the head's copy on the last partition */
    const int64_t ctx = SL_MIN(c->max_position > 0 ? c->max_position : 4096, 4096);
    const int64_t kv = 2 * ctx * c->n_kv_heads * c->head_dim * 4;
    const int64_t lin = ((int64_t)c->lin_n_value_heads * c->lin_key_dim * c->lin_value_dim +
                         (2 * (int64_t)c->lin_n_key_heads * c->lin_key_dim +
                          (int64_t)c->lin_n_value_heads * c->lin_value_dim) *
                             SL_MAX(c->lin_conv_kernel - 1, 0)) *
                        4;
    for (int32_t l = 0; l < c->n_layers; l++) {
        layer[l] += c->layer_is_linear && c->layer_is_linear[l] ? lin : kv;
        const sl_expert_layer *E = l < m->experts.n_layers ? &m->experts.layers[l] : NULL;
        if (m->be.device && E && E->n_experts) {
            const int32_t slots =
                gpu_experts > 0 ? SL_MIN(gpu_experts, E->n_experts) : E->n_experts;
            layer[l] += (int64_t)slots * (int64_t)E->hdr.blob_bytes;
        }
    }
}

/* The model's partitions: one (the model's backend, every layer), or n planned by memory, each
 * on a backend of its own. */
static sl_status split_model(sl_model *m, const sl_model_params *p, sl_error *err) {
    const sl_config *c = &m->cfg;
    const int32_t n = p->n_parts ? p->n_parts : 1;
    if (n < 1 || n > c->n_layers)
        return sl_fail(err, SL_ERR_ARG,
                       "%d partitions of a model of %d layers: give 1 to %d (each partition runs "
                       "one layer at least)",
                       n, c->n_layers, c->n_layers);
    if (n > 1 && m->family->forward != blk_prenorm_decoder && !m->family->splits)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: its forward pass is its own, and does not run split over partitions "
                       "yet: run it on one",
                       c->arch);
    const int cuda = !strcmp(m->be.ops->name, "cuda");
    if (p->part_gpus && !cuda)
        return sl_fail(err, SL_ERR_ARG,
                       "partitions on GPUs of their own need the CUDA backend (--backend cuda)");
    if (p->part_mem < 0)
        return sl_fail(err, SL_ERR_ARG, "a partition's memory of %lld bytes",
                       (long long)p->part_mem);
    /* One GPU a partition: each budget at most its GPU's free memory, less what the sessions,
     * scratch and the CUDA context take besides the planned bytes (a tenth, 2 GiB at least). */
    int64_t gpu_free[64];
    if (p->part_gpus && n > 64) return sl_fail(err, SL_ERR_ARG, "%d GPUs: at most 64", n);
    for (int32_t q = 0; p->part_gpus && n > 1 && q < n; q++) {
        int64_t total;
        sl_status st = sl_backend_cuda_mem(q, &gpu_free[q], &total, err);
        if (st) return st;
        gpu_free[q] -= SL_MAX(gpu_free[q] / 10, (int64_t)2 << 30);
        if (gpu_free[q] <= 0)
            return sl_fail(err, SL_ERR_NOMEM, "GPU %d: no memory free for a partition", q);
    }
    const int budgets = p->part_mem || (p->part_gpus && n > 1);
    m->parts = sl_calloc((size_t)n, sizeof *m->parts, err);
    int64_t *bytes = sl_calloc((size_t)c->n_layers, sizeof *bytes, err);
    int32_t *first = sl_calloc((size_t)n + 1, sizeof *first, err);
    int64_t *budget = budgets ? sl_calloc((size_t)n, sizeof *budget, err) : NULL;
    sl_status st = m->parts && bytes && first && (budget || !budgets) ? SL_OK : SL_ERR_NOMEM;
    sl_split_params sp = {
        .n_layers = c->n_layers, .layer_bytes = bytes, .n_parts = n, .budget = budget};
    for (int32_t q = 0; budget && q < n; q++) {
        budget[q] = p->part_mem ? p->part_mem : INT64_MAX;
        if (p->part_gpus && n > 1) budget[q] = SL_MIN(budget[q], gpu_free[q]);
    }
    if (!st) {
        m->n_parts = n;
        split_bytes(m, p->gpu_experts, bytes, &sp.first_bytes, &sp.last_bytes);
        st = sl_split_plan(&sp, first, err);
    }
    for (int32_t q = 0; !st && q < n; q++) {
        sl_model_part *P = &m->parts[q];
        P->layer0 = first[q], P->layer1 = first[q + 1];
        P->bytes = sl_split_bytes(&sp, first, q);
        if (q == 0) {
            P->be = &m->be, P->dev = &m->dev;
            continue;
        }
        P->be = &P->own_be, P->dev = &P->own_dev;
        if (cuda) { /* a CUDA backend of its own: on GPU q, or beside the model's on its GPU */
            sl_cuda_params cp = p->cuda;
            cp.int4_float_act |= p->int4_float_act;
            st = sl_backend_cuda_init(&P->own_be, p->part_gpus ? q : 0, &cp, err);
            continue;
        }
        /* a CPU backend like the model's: the same threads, ISA, product path, and memory of
         * its own or not (SL_BACKEND_CPU_DEVICE: the device path's weights and expert cache) */
        sl_backend_cpu_init(&P->own_be, m->be.n_threads, m->be.isa);
        P->own_be.int4_float_act = m->be.int4_float_act;
        P->own_be.device = m->be.device;
    }
    size_t k = 0;
    for (int32_t q = 0; !st && n > 1 && q < n && k < sizeof m->split; q++)
        k += (size_t)snprintf(m->split + k, sizeof m->split - k, "%slayers %d-%d (%.1f MB)",
                              q ? " | " : "", m->parts[q].layer0, m->parts[q].layer1 - 1,
                              (double)m->parts[q].bytes / 1e6);
    free(bytes);
    free(first);
    free(budget);
    return st;
}

sl_status sl_model_load(const char *dir, const sl_model_params *params, sl_model **out,
                        sl_error *err) {
    *out = NULL;
    sl_model *m = sl_calloc(1, sizeof *m, err);
    if (!m) return SL_ERR_NOMEM;
    const sl_model_params p = params ? *params : (sl_model_params){0};
    char path[4096];
    int32_t gv[3] = {0};
    sl_status st =
        read_config(dir, &m->cfg, &m->kind, &m->pack_version, gv, path, sizeof path, err);
    if (st) goto fail;
    m->family = m->cfg.family;
    if (!m->family) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: architecture '%s' is not supported (sluice runs: %s)", path, m->cfg.arch,
                     sl_family_names());
        goto fail;
    }
    m->norm_offset = m->family->norm_offset;
    if (p.backend == SL_BACKEND_CUDA ||
        (p.backend == SL_BACKEND_AUTO && sl_backend_cuda_available())) {
        sl_cuda_params cp = p.cuda;
        cp.int4_float_act |= p.int4_float_act;
        if ((st = sl_backend_cuda_init(&m->be, 0, &cp, err))) goto fail;
    } else {
        sl_backend_cpu_init(&m->be, p.n_threads, SL_ISA_AVX512);
        m->be.device = p.backend == SL_BACKEND_CPU_DEVICE;
        m->be.int4_float_act = p.int4_float_act;
    }
    if ((st = sl_ckpt_open(&m->ck, dir, err))) goto fail;
    if (m->kind == SL_MODEL_PACK)
        m->ck.norm_folded = gv[0], m->ck.A_neg_exp = gv[1], m->ck.v_tiled = gv[2];
    /* A GGUF file of a (1 + w) family holds 1 + w itself (llama.cpp's converter added the 1). */
    if (m->ck.norm_folded) m->norm_offset = 0.0f;
    if (m->kind == SL_MODEL_PACK && m->ck.files[0].version != (uint32_t)m->pack_version) {
        st = sl_fail(err, SL_ERR_FORMAT,
                     "%s: format version %u, but the manifest says %d (a file of another pack?)",
                     m->ck.files[0].path, m->ck.files[0].version, m->pack_version);
        goto fail;
    }
    m->layers = sl_calloc((size_t)m->cfg.n_layers, sizeof(sl_layer), err);
    if (!m->layers) {
        st = SL_ERR_NOMEM;
        goto fail;
    }
    if (m->kind == SL_MODEL_HF && m->family->expert_layout)
        m->cfg.expert_layout = m->family->expert_layout(&m->cfg, &m->ck);
    if ((st = m->family->bind(m, err))) goto fail;
    const sl_config *c = &m->cfg;
    int64_t cache_mem = p.cache_mem;
    const int auto_mem = p.experts == SL_EXPERTS_STREAM && p.cache_mem_auto && !p.cache_experts;
    if (auto_mem) cache_mem = m->cache_auto_bytes = auto_cache_mem(m, &m->cache_auto_avail);
    const sl_store_params sp = {.mode = p.experts,
                                .policy = p.cache_policy,
                                .cache_experts = p.cache_experts,
                                .cache_mem = cache_mem,
                                .cache_clamp = auto_mem,
                                .io_engine = p.io_engine,
                                .no_overlap = p.no_overlap,
                                .direct_io = p.direct_io,
                                .io_threads = p.io_threads,
                                .io_timeout_ms = p.io_timeout_ms,
                                .min_slots = c->n_experts_used,
                                .pack_version = (uint32_t)m->pack_version,
                                .progress = p.progress,
                                .progress_user = p.progress_user};
    if (m->kind == SL_MODEL_PACK)
        st = sl_experts_open_packed(&m->experts, dir, c->n_layers, c->layer_is_moe, c->n_experts,
                                    c->hidden_size, c->moe_intermediate_size, &sp, err);
    else
        st = blk_bind_experts(m, &sp, err);
    if (!st && m->family->open) st = m->family->open(m, dir, p.experts == SL_EXPERTS_STREAM, err);
    if (!st) st = split_model(m, &p, err);
    /* A backend with memory of its own gets the weights and a cache of expert slots there,
     * filled from the store's host memory, which is pinned for fast copies. */
    if (!st && m->be.device) st = upload_weights(m, err);
    for (int32_t q = 0; !st && m->be.device && q < m->n_parts; q++) {
        const sl_model_part *P = &m->parts[q];
        st = sl_dev_cache_init_range(P->dev, P->be, &m->experts, P->layer0, P->layer1,
                                     p.gpu_experts, p.cache_policy, err);
    }
    if (!st && m->be.device && m->be.ops->pin) pin_store(m, 1);
    /* A slot per expert: all of them in GPU memory now, so decode needs no host step. */
    for (int32_t q = 0; !st && m->be.device && q < m->n_parts; q++)
        st = sl_dev_cache_fill(m->parts[q].dev, m->parts[q].be, &m->experts, err);
    if (!st) sl_model_reset_stats(m);
    if (!st) describe_types(m, m->types, sizeof m->types);
    if (!st) sl_experts_engine_desc(&m->experts, m->io_engine, sizeof m->io_engine);
    if (!st) describe_router(m, m->router, sizeof m->router);
    m->prefetch = SL_MIN(SL_MAX(p.prefetch, 0), c->n_experts_used);
    if (!st)
        m->graphs = p.graphs && m->be.ops->graph_begin && m->family->graph_steps &&
                    m->n_parts == 1 && /* a graph records one backend's step */
                    sl_moe_no_host_step(&m->be, &m->experts, &m->dev, c->n_experts_used,
                                        c->moe_weight_input, c->expert_glu);
    for (int32_t q = 0; !st && q < m->n_parts; q++) /* every partition's backend, as loaded */
        if (m->parts[q].be->ops->status) st = m->parts[q].be->ops->status(m->parts[q].be, err);
    if (!st && p.router_trace && c->n_experts < 1)
        st = sl_fail(err, SL_ERR_ARG, "%s: the model has no routed experts to trace",
                     p.router_trace);
    /* The requests are kept for the oracle only where a slot cache makes them (stream). */
    const int keep = p.keep_routes && p.experts == SL_EXPERTS_STREAM;
    if (!st && (p.router_trace || keep) && c->n_experts > 0) {
        st = sl_trace_writer_open(&m->trace, p.router_trace, keep, c->n_layers, c->n_experts,
                                  c->n_experts_used, err);
        m->trace_on = !st;
    }
    if (!st && p.route_replay) {
        st = c->n_experts > 0
                 ? sl_route_replay_load(&m->replay, p.route_replay, c->n_experts, c->n_experts_used,
                                        err)
                 : sl_fail(err, SL_ERR_ARG, "%s: the model has no routed experts", p.route_replay);
        m->replay_on = !st;
    }
    if (st) goto fail;
    *out = m;
    return SL_OK;
fail:
    sl_model_free(m);
    return st;
}

void sl_model_free(sl_model *m) {
    if (!m) return;
    sl_trace_writer_free(&m->trace);
    sl_route_replay_free(&m->replay);
    if (m->be.device) {
        if (m->be.ops->unpin) pin_store(m, 0);
        sl_dev_cache_free(&m->dev, &m->be);
        for (int32_t q = 1; q < m->n_parts; q++)
            sl_dev_cache_free(&m->parts[q].own_dev, &m->parts[q].own_be);
        for (int32_t i = 0; i < m->n_uploads; i++) {
            const sl_backend *be = m->parts ? m->parts[m->upload_part[i]].be : &m->be;
            be->ops->release(be, m->uploads[i]);
        }
        free(m->uploads);
        free(m->upload_part);
        for (int32_t q = 1; q < m->n_parts; q++)
            if (m->parts[q].own_be.ops && !strcmp(m->parts[q].own_be.ops->name, "cuda"))
                sl_backend_cuda_free(&m->parts[q].own_be);
        sl_backend_cuda_free(&m->be);
    }
    sl_experts_free(&m->experts);
    if (m->family && m->family->free_model) m->family->free_model(m);
    free(m->layers);
    free(m->parts);
    sl_ckpt_close(&m->ck);
    sl_config_free(&m->cfg);
    free(m);
}

void sl_model_get_info(const sl_model *m, sl_model_info *info) {
    const sl_config *c = &m->cfg;
    int32_t n_moe = 0, first_moe = -1, shared = 0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        n_moe += c->layer_is_moe[l];
        if (c->layer_is_moe[l] && first_moe < 0) first_moe = l;
        shared |= m->layers[l].sh_gate.data != NULL;
    }
    const int64_t resident = resident_bytes(m);
    const char *weights = "-";
    int64_t expert_bytes = 0;
    int32_t slots = 0;
    if (first_moe >= 0) {
        const sl_expert_layer *L = &m->experts.layers[first_moe];
        const sl_expert *e = L->slots.n_slots ? &L->slot_views[0] : &L->views[0];
        const sl_dtype dt = e->gate.dtype;
        weights = dt == SL_DTYPE_Q8 ? "int8" : dt == SL_DTYPE_Q4 ? "int4" : sl_dtype_name(dt);
        if (m->kind == SL_MODEL_PACK)
            expert_bytes = (int64_t)L->hdr.blob_bytes;
        else
            for (int k = 0; k < 3; k++) {
                const sl_tensor *t = k == 0 ? &e->gate : k == 1 ? &e->up : &e->down;
                const sl_tensor *b = k == 0 ? &e->gate_bias : k == 1 ? &e->up_bias : &e->down_bias;
                expert_bytes +=
                    (int64_t)(t->nbytes + sl_tensor_scale_bytes(t) * (!!t->scales + !!t->biases));
                if (b->data) expert_bytes += (int64_t)b->nbytes;
            }
        slots = L->slots.n_slots;
    }
    static const char *const modes[] = {"mapped", "resident", "stream"};
    *info = (sl_model_info){
        .arch = c->arch,
        .vocab_size = c->vocab_size,
        .hidden_size = c->hidden_size,
        .n_layers = c->n_layers,
        .n_moe_layers = n_moe,
        .n_experts = c->n_experts,
        .n_experts_used = c->n_experts_used,
        .max_position = c->max_position,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .moe_intermediate_size = c->moe_intermediate_size,
        .shared_expert = shared,
        .packed = m->kind == SL_MODEL_PACK,
        .types = m->types,
        .router = m->router,
        .source = m->kind == SL_MODEL_PACK   ? "sluice pack"
                  : m->kind == SL_MODEL_GGUF ? "GGUF"
                  : m->ck.mlx_bits           ? "MLX"
                                             : "Hugging Face checkpoint",
        .pack_version = m->kind == SL_MODEL_PACK ? m->pack_version : 0,
        .weights = weights,
        .resident_bytes = resident,
        .expert_bytes = expert_bytes,
        .experts_mode = modes[m->experts.mode],
        .cache_slots = slots,
        .backend = m->be.ops->name,
        .gpu_expert_slots = m->be.device ? m->dev.n_slots : 0,
        .graphs = m->graphs,
        .io_engine = m->experts.pool ? m->io_engine : NULL,
        .n_parts = m->n_parts,
        .split = m->n_parts > 1 ? m->split : NULL,
    };
    if (m->cache_auto_bytes && n_moe && c->n_experts) {
        info->cache_auto_avail = m->cache_auto_avail;
        info->cache_auto_bytes = (int64_t)slots * n_moe * expert_bytes;
        info->cache_auto_share = (double)slots / c->n_experts;
    }
    if (m->family->info) m->family->info(m, info);
}

/* ------------------------------------------------------------- session */

/* Arena carving in two passes (sl_carver): first with base == NULL to total the size. */
typedef sl_carver carver;

static void *carve(carver *cv, size_t n, size_t elem) {
    return sl_carve(cv, n, elem);
}

/* The MoE step's scratch (moe/moe.h): one block of each arena. */
static void layout_moe(sl_session *s, carver *cv, carver *hv) {
    sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_moe_dims md = {.n_layers = c->n_layers,
                            .n_experts = c->n_experts,
                            .k = c->n_experts_used,
                            .hidden = c->hidden_size,
                            .inter = c->moe_intermediate_size,
                            .max_batch = s->max_batch,
                            /* a device's prefill: each expert once a chunk (memory is cheap
                             * there against reading an expert's weights k times) */
                            .max_rows = s->be->device ? s->max_batch * SL_MAX(c->n_experts_used, 1)
                                                      : s->max_batch,
                            .shared = c->shared_intermediate_size > 0,
                            .route = sl_config_route(c),
                            .weight_input = c->moe_weight_input,
                            .glu = c->expert_glu,
                            .glu_alpha = c->expert_glu_alpha,
                            .glu_limit = c->expert_glu_limit,
                            /* up to 32 rows (H200, Qwen3-30B-A3B shapes: 4 rows 539 tok/s
                             * fused against 401 grouped, 16 623 against 540, 64 763 against
                             * 889: past a few dozen rows, reading each expert once for all of
                             * them pays) */
                            .decode_rows = s->batch ? SL_MIN(s->max_batch, 32) : 0,
                            .prefetch = m->experts.mode == SL_EXPERTS_STREAM ? m->prefetch : 0};
    const sl_moe_env env = {.be = s->be,
                            .store = &m->experts,
                            .dev = m->parts[s->part].dev,
                            .stats = &m->stats,
                            .trace = m->trace_on ? &m->trace : NULL,
                            .replay = m->replay_on ? &m->replay : NULL};
    size_t moe_dev, moe_host;
    sl_moe_layout(&s->moe, &md, &env, NULL, NULL, &moe_dev, &moe_host);
    uint8_t *dev = carve(cv, moe_dev, 1), *host = carve(hv, moe_host, 1);
    if (cv->base) sl_moe_layout(&s->moe, &md, &env, dev, host, &moe_dev, &moe_host);
}

static void layout(sl_session *s, carver *cv, carver *hv) {
    const sl_config *c = &s->model->cfg;
    const size_t B = (size_t)s->max_batch, H = (size_t)c->hidden_size;
    const size_t nq = (size_t)c->n_heads * (size_t)c->head_dim;
    const size_t nkv = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    const size_t I = (size_t)SL_MAX(c->intermediate_size,
                                    SL_MAX(c->moe_intermediate_size, c->shared_intermediate_size));
    const size_t nl = (size_t)(s->layer1 - s->layer0); /* the current partition's layers */
    const size_t kv = s->model->family->own_kv_cache ? 0 : nl * (size_t)s->max_ctx * nkv;
    const size_t rope = (size_t)s->max_ctx * (size_t)(c->rot_dim / 2);
    const size_t nlin = c->n_linear_layers ? nl : 0;
    const size_t nv = (size_t)c->lin_n_value_heads;
    const size_t kd = (size_t)c->lin_n_key_heads * (size_t)c->lin_key_dim;
    const size_t vd = nv * (size_t)c->lin_value_dim, cd = 2 * kd + vd;
    const size_t Km1 = c->lin_conv_kernel > 0 ? (size_t)c->lin_conv_kernel - 1 : 0;
    const size_t lb = nlin ? B : 0; /* linear-attention scratch only when used */
    sl_session_buf *b = &s->b;
    const size_t V = (size_t)c->vocab_size;
    b->ids = carve(cv, B, sizeof(int32_t));
    b->logits = s->be->device ? carve(cv, B * V, sizeof(float)) : NULL;
    if (s->model->family->session_layout) s->model->family->session_layout(s, cv, hv);
    s->delta_state_n = nlin * nv * (size_t)c->lin_key_dim * (size_t)c->lin_value_dim;
    s->conv_state_n = nlin * cd * Km1;
    s->delta_state = carve(cv, s->delta_state_n, sizeof(float));
    s->conv_state = carve(cv, s->conv_state_n, sizeof(float));
    b->qg = carve(cv, B * 2 * nq, sizeof(float));
    b->qgate = carve(cv, B * nq, sizeof(float));
    b->lin_proj = carve(cv, lb * (2 * kd + 2 * vd), sizeof(float));
    b->lin_ba = carve(cv, lb * 2 * nv, sizeof(float));
    b->lin_mixed = carve(cv, lb * cd, sizeof(float));
    b->lin_conv = carve(cv, lb * cd, sizeof(float));
    b->lin_q = carve(cv, lb * kd, sizeof(float));
    b->lin_k = carve(cv, lb * kd, sizeof(float));
    b->lin_v = carve(cv, lb * vd, sizeof(float));
    b->lin_z = carve(cv, lb * vd, sizeof(float));
    b->lin_a = carve(cv, lb * nv, sizeof(float));
    b->lin_b = carve(cv, lb * nv, sizeof(float));
    b->lin_o = carve(cv, lb * vd, sizeof(float));
    s->kcache = carve(cv, kv, sizeof(float));
    s->vcache = carve(cv, kv, sizeof(float));
    s->rope_cos = carve(cv, rope, sizeof(float));
    s->rope_sin = carve(cv, rope, sizeof(float));
    b->x = carve(cv, B * H, sizeof(float));
    b->x_alt = carve(cv, B * H, sizeof(float));
    b->xn = carve(cv, B * H, sizeof(float));
    b->out = carve(cv, B * H, sizeof(float));
    b->q = carve(cv, B * nq, sizeof(float));
    b->k = carve(cv, B * nkv, sizeof(float));
    b->v = carve(cv, B * nkv, sizeof(float));
    b->attn = carve(cv, B * nq, sizeof(float));
    b->gate = carve(cv, B * I, sizeof(float));
    b->up = carve(cv, B * I, sizeof(float));
    b->ffn_out = carve(cv, B * H, sizeof(float));
    layout_moe(s, cv, hv);
    b->attn_scratch = carve(cv, (size_t)s->be->n_threads * (size_t)s->max_ctx, sizeof(float));
    b->h_hidden = carve(hv, H, sizeof(float));
    b->h_stage = carve(hv, s->n_parts > 1 ? B * H : 0, sizeof(float));
}

/* cos/sin of pos * inv_freq (model/rope.h: the config's scaling type, in float32 as
 * transformers computes them); built on the host, then copied to backend memory. */
static sl_status fill_rope(sl_session *s, sl_error *err) {
    const sl_config *c = &s->model->cfg;
    const sl_backend *be = s->be;
    const size_t n = (size_t)s->max_ctx * (size_t)(c->rot_dim / 2);
    float *cs = malloc(2 * n * sizeof(float));
    if (!cs) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    sl_rope_tables(&c->rope, c->rope_theta, c->rot_dim, s->max_ctx, cs, cs + n);
    be->ops->to_dev(be, s->rope_cos, cs, n * sizeof(float));
    be->ops->to_dev(be, s->rope_sin, cs + n, n * sizeof(float));
    free(cs);
    return SL_OK;
}

/* ---- a split model's partitions in a session (sl_session_part) ---- */

/* What a session holds of its current partition, swapped in and out field by field. */
#define PART_FIELDS(X)                                                                             \
    X(be)                                                                                          \
    X(layer0)                                                                                      \
    X(layer1)                                                                                      \
    X(kcache) X(vcache) X(rope_cos) X(rope_sin) X(delta_state) X(conv_state) X(delta_state_n)      \
        X(conv_state_n) X(b) X(moe) X(fam) X(arena) X(host_arena)

static void part_save(sl_session *s) {
    sl_session_part *P = &s->parts[s->part];
#define SAVE(f) P->f = s->f;
    PART_FIELDS(SAVE)
#undef SAVE
}

static void part_load(sl_session *s, int32_t p) {
    const sl_session_part *P = &s->parts[p];
    s->part = p;
#define LOAD(f) s->f = P->f;
    PART_FIELDS(LOAD)
#undef LOAD
}

void sl_session_enter(sl_session *s, int32_t p) {
    if (p == s->part) return;
    part_save(s);
    part_load(s, p);
}

/* The current partition's buffers (the whole session's with one): carved from an arena of its
 * backend and one of host memory, then what is filled once (RoPE tables, the family's). */
static sl_status part_new(sl_session *s, sl_error *err) {
    sl_model *m = s->model;
    const sl_backend *be = s->be;
    carver cv = {0}, hv = {0};
    layout(s, &cv, &hv);
    s->arena = be->ops->alloc(be, cv.off);
    s->host_arena = sl_calloc(1, hv.off, err); /* zeroed: the MoE step's flags start clear */
    if (!s->arena || !s->host_arena)
        return sl_fail(err, SL_ERR_NOMEM, "out of %s memory for a session of %d tokens",
                       s->arena     ? "host"
                       : be->device ? "GPU"
                                    : "host",
                       s->max_ctx);
    cv = (carver){.base = s->arena};
    hv = (carver){.base = s->host_arena};
    layout(s, &cv, &hv);
    /* x of the widest product a chunk runs: a dense one (hidden, attention output or
     * intermediate wide), or the routed experts' batch (each token's rows k times) */
    const sl_config *c = &m->cfg;
    const int64_t wide = SL_MAX(SL_MAX(c->hidden_size, (int64_t)c->n_heads * c->head_dim),
                                SL_MAX(c->intermediate_size, c->shared_intermediate_size));
    const int64_t routed =
        (int64_t)SL_MAX(c->n_experts_used, 1) * SL_MAX(c->hidden_size, c->moe_intermediate_size);
    const sl_reserve_args ra = {.max_batch = s->max_batch,
                                .max_ctx = s->max_ctx,
                                .n_heads = c->n_heads,
                                .head_dim = c->head_dim,
                                .max_x = (int64_t)s->max_batch * SL_MAX(wide, routed)};
    sl_status st;
    if ((be->ops->reserve && (st = be->ops->reserve(be, &ra, err))) || (st = fill_rope(s, err)))
        return st;
    if (m->family->session_init && (st = m->family->session_init(s, err))) return st;
    return SL_OK;
}

/* A session, or (batch) the rows of sl_batch_decode's steps: its buffers on each partition of
 * the model, the session's own fields the first partition's. */
static sl_status session_new(sl_model *m, const sl_session_params *params, int batch,
                             sl_session **out, sl_error *err) {
    *out = NULL;
    sl_status st = SL_OK;
    sl_session_params p = params ? *params : (sl_session_params){0};
    if (p.max_ctx < 0 || p.max_batch < 0)
        return sl_fail(err, SL_ERR_ARG, "context and batch sizes must be positive");
    if (p.max_ctx == 0) p.max_ctx = SL_MIN(m->cfg.max_position, 4096);
    if (p.max_batch == 0) p.max_batch = 512;
    p.max_batch = SL_MIN(p.max_batch, p.max_ctx);
    sl_session *s = sl_calloc(1, sizeof *s, err);
    if (!s) return SL_ERR_NOMEM;
    s->model = m;
    s->max_ctx = p.max_ctx;
    s->max_batch = p.max_batch;
    s->batch = batch;
    s->n_parts = m->n_parts;
    if (s->n_parts > 1 && !(s->parts = sl_calloc((size_t)s->n_parts, sizeof *s->parts, err))) {
        free(s);
        return SL_ERR_NOMEM;
    }
    /* the family's session state, one a partition */
    const size_t fs = m->family->session_size;
    uint8_t *fam = fs ? sl_calloc((size_t)s->n_parts, fs, err) : NULL;
    if (fs && !fam) {
        free(s->parts);
        free(s);
        return SL_ERR_NOMEM;
    }
    for (int32_t q = 0; q < s->n_parts; q++) {
        const sl_model_part *P = &m->parts[q];
        s->part = q;
        s->be = P->be, s->layer0 = P->layer0, s->layer1 = P->layer1;
        s->fam = fam ? fam + (size_t)q * fs : NULL;
        s->b = (sl_session_buf){0}, s->moe = (sl_moe_scratch){0};
        s->arena = s->host_arena = NULL;
        st = part_new(s, err);
        if (s->parts) part_save(s);
        if (st) break;
    }
    if (s->parts) part_load(s, 0);
    if (st) {
        sl_session_free(s);
        return st;
    }
    sl_session_reset(s);
    *out = s;
    return SL_OK;
}

sl_status sl_session_create(sl_model *m, const sl_session_params *params, sl_session **out,
                            sl_error *err) {
    return session_new(m, params, 0, out, err);
}

void sl_session_free(sl_session *s) {
    if (!s) return;
    if (s->parts) part_save(s);
    void *fam = s->parts ? s->parts[0].fam : s->fam; /* one allocation for all partitions */
    for (int32_t q = 0; q < s->n_parts; q++) {
        const sl_session_part *P = s->parts ? &s->parts[q] : NULL;
        const sl_backend *be = P ? P->be : s->be;
        void *arena = P ? P->arena : s->arena, *host_arena = P ? P->host_arena : s->host_arena;
        if (arena) be->ops->release(be, arena);
        free(host_arena);
    }
    free(fam);
    free(s->parts);
    free(s);
}

/* Each partition's MoE scratch in turn (the current one's is the session's own field). */
static void each_moe(sl_session *s, void (*fn)(sl_moe_scratch *)) {
    fn(&s->moe);
    for (int32_t q = 0; s->parts && q < s->n_parts; q++)
        if (q != s->part) fn(&s->parts[q].moe);
}

void sl_session_reset(sl_session *s) {
    s->pos = 0;
    for (int32_t q = s->n_parts - 1; q >= 0; q--) { /* ends on partition 0 */
        sl_session_enter(s, q);
        const sl_backend *be = s->be;
        sl_moe_forget_steps(&s->moe);
        if (s->delta_state_n) be->ops->fill(be, s->delta_state, 0.0f, s->delta_state_n);
        if (s->conv_state_n) be->ops->fill(be, s->conv_state, 0.0f, s->conv_state_n);
        if (s->model->family->session_reset) s->model->family->session_reset(s);
    }
}

int32_t sl_session_pos(const sl_session *s) {
    return s->pos;
}

int32_t sl_session_max_ctx(const sl_session *s) {
    return s->max_ctx;
}

int sl_session_rewind(sl_session *s, int32_t pos) {
    if (pos < 0 || pos >= s->pos) return 0;
    /* Recurrent (linear-attention) state summarises every token: it cannot go back. */
    if (s->model->cfg.n_linear_layers > 0) return 1;
    if (s->model->family->session_rewind && s->model->family->session_rewind(s, pos)) return 1;
    s->pos = pos;
    each_moe(s, sl_moe_forget_steps);
    return 0;
}

/* One decode step as a backend graph, launched as one: the host work per kernel is a comparison
 * with the last recording (or a recording), not a launch. A step that broke the graph rules ran
 * nothing; it then runs again as usual (the forward pass leaves no host state behind but the MoE
 * bookkeeping flags, cleared here). */
static sl_status graph_step(sl_session *s, const int32_t *id, float *logits, sl_error *err) {
    const sl_backend *be = &s->model->be;
    be->ops->graph_begin(be);
    s->defer_logits = 1;
    sl_status st = s->model->family->forward(s, id, 1, logits, 0, err);
    s->defer_logits = 0;
    const int ran = be->ops->graph_end(be, !st);
    if (st) return st;
    if (ran >= 0) {
        if (logits)
            be->ops->to_host(be, logits, s->b.logits,
                             (size_t)s->model->cfg.vocab_size * sizeof(float));
        s->model->stats.graph_steps += ran > 0;
        s->model->stats.graph_replays += ran == 2;
        return SL_OK;
    }
    sl_moe_drop_pending(&s->moe);
    s->model->stats.graph_fallbacks++;
    return s->model->family->forward(s, id, 1, logits, 0, err);
}

/*
 * Non-finite values are an error, never output. Nothing downstream can tell a NaN logit from a
 * score (argmax takes the first id, a sampler some id, a logits file keeps it), so the check
 * sits where logits leave the library, in the code both backends share: one pass over the rows
 * returned (they are host memory by now), or, for a chunk that returns none, over the final
 * hidden state of its last position (a NaN in an earlier position reaches it through
 * attention). Only the error path looks further, to say which side of the head it came from.
 */
static const char *const overflow_hint =
    "the layers' outputs overflowed, so the weights or config.json may be corrupt";

static const char *nonfinite_name(float x) {
    return isnan(x) ? "NaN" : x > 0 ? "Inf" : "-Inf";
}

/* Row r of the chunk's final hidden state, copied to the host. */
static const float *hidden_row(sl_session *s, int32_t r) {
    const sl_backend *be = s->be; /* the head's partition's */
    const size_t H = (size_t)s->model->cfg.hidden_size;
    be->ops->to_host(be, s->b.h_hidden, s->b.head_x + (size_t)r * H, H * sizeof(float));
    return s->b.h_hidden;
}

/* Logit i (of value x) of the row at position pos is not finite; its hidden state is row r of
 * the chunk's head input. */
static sl_status logits_fail(sl_session *s, float x, size_t i, int32_t r, int32_t pos,
                             sl_error *err) {
    const size_t H = (size_t)s->model->cfg.hidden_size;
    if (s->b.head_x && sl_first_nonfinite(sl_cpu_best_isa(), hidden_row(s, r), H) == H)
        return sl_fail(err, SL_ERR_NUMERIC,
                       "non-finite logits at position %d (logit %zu is %s) from a finite "
                       "hidden state: the LM head's weights may be corrupt",
                       pos, i, nonfinite_name(x));
    return sl_fail(err, SL_ERR_NUMERIC,
                   "non-finite logits at position %d (logit %zu is %s, and the hidden state "
                   "too): %s",
                   pos, i, nonfinite_name(x), overflow_hint);
}

/* Row r of the chunk's final hidden state, of the token at position pos, is finite, or an
 * error. */
static sl_status hidden_check(sl_session *s, int32_t r, int32_t pos, sl_error *err) {
    const size_t H = (size_t)s->model->cfg.hidden_size;
    const float *h = hidden_row(s, r);
    const size_t i = sl_first_nonfinite(sl_cpu_best_isa(), h, H);
    if (i == H) return SL_OK;
    return sl_fail(err, SL_ERR_NUMERIC,
                   "non-finite hidden state at position %d (element %zu is %s): %s", pos, i,
                   nonfinite_name(h[i]), overflow_hint);
}

/* The check of one chunk of T tokens at s->pos whose logits (when not NULL) went to logits. */
static sl_status check_finite(sl_session *s, const float *logits, int32_t T, int all_logits,
                              sl_error *err) {
    const size_t V = (size_t)s->model->cfg.vocab_size;
    const sl_isa isa = sl_cpu_best_isa();
    if (logits) {
        const size_t n = (all_logits ? (size_t)T : 1) * V, i = sl_first_nonfinite(isa, logits, n);
        if (i == n) return SL_OK;
        const int32_t r = (int32_t)(i / V), pos = s->pos + (all_logits ? r : T - 1);
        return logits_fail(s, logits[i], i % V, all_logits ? r : 0, pos, err);
    }
    if (!s->b.head_x) return SL_OK; /* a forward without the shared head: nothing to check */
    return hidden_check(s, s->b.head_rows - 1, s->pos + T - 1, err);
}

/* The routing trace around a forward pass of `rows` tokens: before, room for their picks in
 * memory (the pass itself never allocates); after, the next step, and a write error the pass
 * met (sl_moe_settle's have nowhere else to go). */
static sl_status trace_before(sl_model *m, int32_t rows, sl_error *err) {
    if (!m->trace_on) return SL_OK;
    /* a record a row and layer, and with pre-gating at most as many again for the predictions */
    const size_t per = (size_t)m->cfg.n_layers * sl_trace_record_bytes(m->cfg.n_experts_used);
    return sl_trace_writer_reserve(&m->trace, (size_t)rows * per * (m->prefetch > 0 ? 2 : 1), err);
}

static sl_status trace_after(sl_model *m, sl_error *err) {
    if (!m->trace_on) return SL_OK;
    m->trace.step++;
    if (m->trace.st && err && !err->code) *err = m->trace.err;
    return m->trace.st;
}

/* The first failure any partition's backend met, or SL_OK. */
static sl_status parts_status(const sl_model *m, sl_error *err) {
    sl_status st = SL_OK;
    for (int32_t q = 0; !st && q < m->n_parts; q++) {
        const sl_backend *be = m->parts[q].be;
        if (be->ops->status) st = be->ops->status(be, err);
    }
    return st;
}

sl_status sl_session_forward(sl_session *s, const int32_t *ids, int32_t n, float *logits,
                             int all_logits, sl_error *err) {
    const sl_config *c = &s->model->cfg;
    if (n <= 0) return sl_fail(err, SL_ERR_ARG, "no tokens to run");
    if (n > s->max_ctx - s->pos)
        return sl_fail(err, SL_ERR_ARG,
                       "context full: %d tokens at position %d exceed the "
                       "context of %d",
                       n, s->pos, s->max_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return sl_fail(err, SL_ERR_ARG,
                           "token id %d at index %d is outside the vocabulary "
                           "[0, %d)",
                           ids[i], i, c->vocab_size);
    /* A mapped file cut short under the model fails this call instead of raising SIGBUS. */
    sl_status cst = sl_ckpt_check(&s->model->ck, err);
    if (cst) return cst;
    const size_t V = (size_t)c->vocab_size;
    const double t0 = sl_now();
    const int64_t bytes0 = s->model->experts.bytes_read;
    for (int32_t done = 0; done < n;) {
        const int32_t T = SL_MIN(s->max_batch, n - done);
        const int last_chunk = done + T == n;
        float *dst = NULL;
        if (logits && all_logits)
            dst = logits + (size_t)done * V;
        else if (logits && last_chunk)
            dst = logits;
        sl_session_enter(s, 0);
        s->b.head_x = NULL;
        sl_status st = trace_before(s->model, T, err);
        if (!st)
            st = T == 1 && s->model->graphs
                     ? graph_step(s, ids + done, dst, err)
                     : s->model->family->forward(s, ids + done, T, dst, all_logits, err);
        if (!st) st = parts_status(s->model, err);
        if (!st) each_moe(s, sl_moe_settle);
        if (!st) st = trace_after(s->model, err);
        if (!st) st = check_finite(s, dst, T, all_logits, err);
        if (st) return st;
        s->pos += T;
        done += T;
    }
    /* A call of one token at a non-empty cache is a decode step; anything else a prefill. */
    sl_stats *S = &s->model->stats;
    const double dt = sl_now() - t0;
    if (n == 1 && s->pos > 1) {
        S->gen_tokens++;
        S->decode_time += dt;
    } else {
        S->prompt_tokens += n;
        S->prefill_time += dt;
        S->prefill_bytes_read += s->model->experts.bytes_read - bytes0;
    }
    return SL_OK;
}

/* ------------------------------------------------------------- batch */

/* A batched decode step runs on a session of its own (sl_session.rows): its buffers hold the
 * rows' activations, its own cache and position stay unused. */
struct sl_batch {
    sl_session *s;
};

sl_status sl_batch_create(sl_model *m, int32_t max_rows, sl_batch **out, sl_error *err) {
    *out = NULL;
    if (max_rows < 1) return sl_fail(err, SL_ERR_ARG, "a batch needs room for at least one row");
    sl_batch *bt = sl_calloc(1, sizeof *bt, err);
    if (!bt) return SL_ERR_NOMEM;
    const sl_session_params sp = {.max_ctx = max_rows, .max_batch = max_rows};
    sl_status st = session_new(m, &sp, 1, &bt->s, err);
    if (st) {
        free(bt);
        return st;
    }
    *out = bt;
    return SL_OK;
}

void sl_batch_free(sl_batch *bt) {
    if (!bt) return;
    sl_session_free(bt->s);
    free(bt);
}

/* The shared decoder's attention sublayers (blk_attention, blk_linear_attention and the MLA
 * hook) take rows of different sequences; a family's own forward may not. */
int sl_batch_shares(const sl_batch *bt) {
    return bt->s->model->family->forward == blk_prenorm_decoder;
}

sl_status sl_batch_decode(sl_batch *bt, sl_session *const *rows, const int32_t *ids, int32_t n,
                          float *logits, sl_error *err) {
    sl_session *s = bt->s;
    sl_model *m = s->model;
    const int32_t V = m->cfg.vocab_size;
    if (n < 1 || n > s->max_batch)
        return sl_fail(err, SL_ERR_ARG, "a batch of %d rows (this one takes 1 to %d)", n,
                       s->max_batch);
    for (int32_t i = 0; i < n; i++) {
        const sl_session *r = rows[i];
        if (!r || r->model != m)
            return sl_fail(err, SL_ERR_ARG, "batch row %d: not a session of the batch's model", i);
        if (r->pos >= r->max_ctx)
            return sl_fail(err, SL_ERR_ARG,
                           "batch row %d: context full: 1 token at position %d exceeds the "
                           "context of %d",
                           i, r->pos, r->max_ctx);
        if (ids[i] < 0 || ids[i] >= V)
            return sl_fail(err, SL_ERR_ARG,
                           "batch row %d: token id %d is outside the vocabulary [0, %d)", i, ids[i],
                           V);
        for (int32_t j = 0; j < i; j++)
            if (rows[j] == r)
                return sl_fail(err, SL_ERR_ARG, "batch rows %d and %d are the same session", j, i);
    }
    if (!sl_batch_shares(bt)) {
        for (int32_t i = 0; i < n; i++) {
            sl_status st = sl_session_forward(
                rows[i], &ids[i], 1, logits ? logits + (size_t)i * (size_t)V : NULL, 0, err);
            if (st) return st;
        }
        return SL_OK;
    }
    sl_status st = sl_ckpt_check(&m->ck, err);
    if (st) return st;
    const double t0 = sl_now();
    /* the rows' sessions follow the batch's through the partitions (blk_part_cross) */
    sl_session_enter(s, 0);
    for (int32_t i = 0; i < n; i++)
        sl_session_enter(rows[i], 0);
    s->b.head_x = NULL;
    if ((st = trace_before(m, n, err))) return st;
    s->rows = rows;
    st = m->family->forward(s, ids, n, logits, 1, err);
    s->rows = NULL;
    if (!st) st = parts_status(m, err);
    if (!st) each_moe(s, sl_moe_settle);
    if (!st) st = trace_after(m, err);
    const sl_isa isa = sl_cpu_best_isa();
    for (int32_t i = 0; !st && logits && i < n; i++) {
        const float *row = logits + (size_t)i * (size_t)V;
        const size_t k = sl_first_nonfinite(isa, row, (size_t)V);
        if (k < (size_t)V) st = logits_fail(s, row[k], k, i, rows[i]->pos, err);
    }
    for (int32_t i = 0; !st && !logits && s->b.head_x && i < n; i++)
        st = hidden_check(s, i, rows[i]->pos, err);
    if (st) return st;
    for (int32_t i = 0; i < n; i++) {
        rows[i]->pos++;
        /* its next step alone has no previous step of its own to compare picks with */
        each_moe(rows[i], sl_moe_forget_steps);
    }
    m->stats.gen_tokens += n;
    m->stats.decode_time += sl_now() - t0;
    return SL_OK;
}

void sl_model_get_stats(const sl_model *m, sl_stats *out) {
    *out = m->stats;
    out->expert_requests = m->experts.requests;
    out->expert_hits = m->experts.hits;
    out->bytes_read = m->experts.bytes_read;
    out->read_time = m->experts.read_time;
    out->prefetch_reads = m->experts.prefetch_reads;
    out->prefetch_used = m->experts.prefetch_used;
    out->prefetch_bytes = m->experts.prefetch_bytes;
    out->prefetch_used_bytes = m->experts.prefetch_used_bytes;
    for (int32_t q = 0; q < m->n_parts; q++) { /* each partition's expert cache */
        const sl_dev_cache *d = m->parts[q].dev;
        out->gpu_expert_requests += d->requests;
        out->gpu_expert_hits += d->hits;
        out->gpu_bytes_copied += d->bytes;
        out->gpu_copy_time += d->time;
    }
}

void sl_model_reset_stats(sl_model *m) {
    memset(&m->stats, 0, sizeof m->stats);
    m->experts.requests = m->experts.hits = m->experts.bytes_read = 0;
    m->experts.read_time = 0;
    m->experts.prefetch_reads = m->experts.prefetch_used = 0;
    m->experts.prefetch_bytes = m->experts.prefetch_used_bytes = 0;
    for (int32_t q = 0; q < m->n_parts; q++) {
        sl_dev_cache *d = m->parts[q].dev;
        d->requests = d->hits = d->bytes = 0;
        d->time = 0;
    }
}

sl_status sl_model_write_router_hist(const sl_model *m, const char *path, sl_error *err) {
    json_t *layers = json_array();
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const sl_expert_layer *L = &m->experts.layers[l];
        if (!L->hist) continue;
        json_t *counts = json_array();
        for (int32_t e = 0; e < L->n_experts; e++)
            json_array_append_new(counts, json_integer(L->hist[e]));
        json_array_append_new(layers, json_pack("{s:i, s:o}", "layer", l, "counts", counts));
    }
    json_t *root = json_pack("{s:s, s:i, s:o}", "arch", m->cfg.arch, "n_experts", m->cfg.n_experts,
                             "layers", layers);
    int rc = root ? json_dump_file(root, path, JSON_INDENT(1)) : -1;
    json_decref(root);
    return rc ? sl_fail(err, SL_ERR_IO, "%s: cannot write the router histogram", path) : SL_OK;
}

sl_status sl_model_trace_close(sl_model *m, sl_error *err) {
    return m->trace_on ? sl_trace_writer_close(&m->trace, err) : SL_OK;
}

sl_status sl_model_cache_oracle(const sl_model *m, int64_t *requests, int64_t *hits, int32_t *slots,
                                sl_error *err) {
    *requests = *hits = 0, *slots = 0;
    for (int32_t l = 0; l < m->experts.n_layers && !*slots; l++)
        *slots = m->experts.layers[l].slots.n_slots;
    if (!m->trace_on || !m->trace.keep || !*slots)
        return sl_fail(err, SL_ERR_ARG,
                       "no expert requests kept (the oracle needs --experts stream and "
                       "keep_routes)");
    sl_trace t;
    sl_status st = sl_trace_parse(&t, "the run's routing trace", m->trace.mem, m->trace.len, err);
    if (st) return st;
    sl_requests r;
    st = sl_requests_build(&r, &t, err);
    sl_trace_free(&t);
    if (st) return st;
    sl_sim_result res;
    st = sl_cache_belady(&r, *slots, &res, err);
    sl_requests_free(&r);
    if (st) return st;
    *requests = res.requests, *hits = res.hits;
    return SL_OK;
}

/* The first i with x[i] > x[j] for no j (NaN never wins; a NaN x[0] gives 0): the largest value
 * through 8 independent maxima, then its first position. The plain loop, which compares each x[i]
 * with x[best], waits on the previous comparison every step: 560 us for 151,936 logits here,
 * against 27 us, about a sixth of a GPU decode step. */
int32_t sl_argmax(const float *x, int32_t n) {
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = x[0];
    int32_t i = 1;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++)
        m[0] = x[i] > m[0] ? x[i] : m[0];
    float best = m[0];
    for (int j = 1; j < 8; j++)
        best = m[j] > best ? m[j] : best;
    for (i = 0; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* best is NaN: x[0] was */
}
