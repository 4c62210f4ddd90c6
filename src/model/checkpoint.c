/* Checkpoint directory: shard discovery, name index, binding by name. */
#include "model/checkpoint.h"

#include "format/pack.h"
#include "model/gguf_ckpt.h"
#include "model/mlx_ckpt.h"

#include <dirent.h>
#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const sl_ckpt_entry *)a)->t->name, ((const sl_ckpt_entry *)b)->t->name);
}

/* Shard names from model.safetensors.index.json's weight_map values, deduplicated, sorted. */
static sl_status shards_from_index(const char *index_path, char ***names, int32_t *n,
                                   sl_error *err) {
    json_error_t jerr;
    char *text = NULL;
    size_t len = 0;
    if (sl_read_file(index_path, &text, &len, err)) return SL_ERR_IO;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root)
        return sl_fail(err, SL_ERR_FORMAT, "%s: invalid JSON (%s, line %d)", index_path, jerr.text,
                       jerr.line);
    sl_status st = SL_OK;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
        goto done;
    }
    size_t cap = json_object_size(wm);
    *names = calloc(cap ? cap : 1, sizeof(char *));
    if (!*names) {
        st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *file = json_string_value(v);
        if (!file || !*file || strchr(file, '/') || strcmp(file, "..") == 0) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: weight_map['%s'] is not a file name in the "
                         "checkpoint directory",
                         index_path, key);
            goto done;
        }
        int seen = 0;
        for (int32_t i = 0; i < *n && !seen; i++)
            seen = strcmp((*names)[i], file) == 0;
        if (!seen && !((*names)[(*n)++] = strdup(file))) {
            st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    qsort(*names, (size_t)*n, sizeof(char *), cmp_str);
done:
    json_decref(root);
    return st;
}

/* Fallback without an index: every *.safetensors file in the directory. */
static sl_status shards_from_dir(const char *dir, char ***names, int32_t *n, sl_error *err) {
    DIR *d = opendir(dir);
    if (!d) return sl_fail(err, SL_ERR_IO, "%s: cannot open directory", dir);
    int32_t cap = 0;
    struct dirent *e;
    sl_status st = SL_OK;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(*names, (size_t)cap * sizeof(char *));
            if (!nn) {
                st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
                break;
            }
            *names = nn;
        }
        if (!((*names)[(*n)++] = strdup(e->d_name))) {
            st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
            break;
        }
    }
    closedir(d);
    if (!st && *n == 0)
        st = sl_fail(err, SL_ERR_IO,
                     "%s: no .safetensors files (is this a Hugging Face "
                     "checkpoint directory?)",
                     dir);
    if (!st) qsort(*names, (size_t)*n, sizeof(char *), cmp_str);
    return st;
}

const char *sl_ckpt_path(const sl_ckpt *ck, const sl_ckpt_entry *e) {
    return ck->gguf ? ck->gguf[e->file].path : ck->files[e->file].path;
}

int32_t sl_ckpt_n_files(const sl_ckpt *ck) {
    return ck->gguf ? ck->n_gguf : ck->n_files;
}

const char *sl_ckpt_file(const sl_ckpt *ck, int32_t i) {
    return ck->gguf ? ck->gguf[i].path : ck->files[i].path;
}

int32_t sl_ckpt_locate(const sl_ckpt *ck, const void *p, uint64_t *off) {
    for (int32_t i = 0; i < sl_ckpt_n_files(ck); i++) {
        const uint8_t *base = ck->gguf ? ck->gguf[i].map : ck->files[i].map;
        const size_t size = ck->gguf ? ck->gguf[i].size : ck->files[i].size;
        if (base && (const uint8_t *)p >= base && (const uint8_t *)p < base + size) {
            *off = (uint64_t)((const uint8_t *)p - base);
            return i;
        }
    }
    return -1;
}

/* Sorts the entries by name, refuses a name twice and picks the name prefix. */
static sl_status index_entries(sl_ckpt *ck, sl_error *err) {
    qsort(ck->entries, (size_t)ck->n_entries, sizeof(sl_ckpt_entry), cmp_entry);
    for (int32_t i = 1; i < ck->n_entries; i++)
        if (strcmp(ck->entries[i].t->name, ck->entries[i - 1].t->name) == 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: tensor '%s' appears twice (%s, %s)", ck->dir,
                           ck->entries[i].label, sl_ckpt_path(ck, &ck->entries[i - 1]),
                           sl_ckpt_path(ck, &ck->entries[i]));
    /* The multimodal layouts nest the text model one level deeper: model.language_model.
     * (Qwen3.5), or a whole ...ForCausalLM under language_model. with its head (Llama-4). */
    for (int32_t i = 0; i < ck->n_entries; i++)
        if (strncmp(ck->entries[i].t->name, "model.language_model.", 21) == 0) {
            ck->prefix = "model.language_model.";
            break;
        } else if (strncmp(ck->entries[i].t->name, "language_model.model.", 21) == 0) {
            ck->prefix = "language_model.model.";
            ck->head = "language_model.lm_head.weight";
            break;
        }
    return SL_OK;
}

/* ------------------------------------------------------ block-wise FP8 */

static const sl_ckpt_entry *find_full(const sl_ckpt *ck, const char *full) {
    sl_tensor kt = {.name = full};
    sl_ckpt_entry key = {.t = &kt};
    return bsearch(&key, ck->entries, (size_t)ck->n_entries, sizeof(sl_ckpt_entry), cmp_entry);
}

/* config.json's quantization_config of a Hugging Face FP8 checkpoint:
 *   {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
 *    "weight_block_size": [128, 128]}
 * Only its block size matters here (activations stay float32, whatever the scheme). *brows and
 * *bcols are left as they are (128 x 128, what transformers assumes) when there is none. */
static sl_status fp8_block_size(const sl_ckpt *ck, int32_t *brows, int32_t *bcols, sl_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", ck->dir);
    if (!file_exists(path)) return SL_OK;
    json_t *root = NULL;
    sl_status st = sl_json_load_file(path, &root, err);
    if (st) return st;
    json_t *q = json_object_get(root, "quantization_config");
    if (!q) goto done;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!json_is_object(q) || !method || strcmp(method, "fp8") != 0) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: quantization_config.quant_method '%s' with F8_E4M3 tensors: sluice reads "
                     "block-wise FP8 ('fp8') checkpoints",
                     path, method ? method : "?");
        goto done;
    }
    const char *fmt = json_string_value(json_object_get(q, "fmt"));
    if (fmt && strcmp(fmt, "e4m3") != 0) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: quantization_config.fmt '%s' is not supported (sluice reads FP8 e4m3 "
                     "checkpoints)",
                     path, fmt);
        goto done;
    }
    json_t *bs = json_object_get(q, "weight_block_size");
    if (bs && !json_is_null(bs)) {
        json_t *b0 = json_array_get(bs, 0), *b1 = json_array_get(bs, 1);
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(b0) ||
            !json_is_integer(b1) || json_integer_value(b0) < 1 || json_integer_value(b1) < 1 ||
            json_integer_value(b0) > (1 << 20) || json_integer_value(b1) > (1 << 20)) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: quantization_config.weight_block_size must be two positive integers "
                         "[rows, columns]",
                         path);
            goto done;
        }
        *brows = (int32_t)json_integer_value(b0);
        *bcols = (int32_t)json_integer_value(b1);
    }
done:
    json_decref(root);
    return st;
}

/* Gives every F8_E4M3 tensor X its block scales X_scale_inv (F32 [ceil(rows / brows),
 * ceil(cols / bcols)], with a leading experts dimension for a 3-D X), checked, so that binding
 * and every later copy of the tensor carry them. Done once at open: the tensors are the
 * checkpoint's own. */
static sl_status attach_fp8_scales(sl_ckpt *ck, sl_error *err) {
    int any = 0;
    for (int32_t i = 0; i < ck->n_entries && !any; i++)
        any = ck->entries[i].t->dtype == SL_DTYPE_F8_E4M3;
    if (!any) return SL_OK;
    int32_t brows = 128, bcols = 128;
    sl_status st = fp8_block_size(ck, &brows, &bcols, err);
    if (st) return st;
    for (int32_t i = 0; i < ck->n_entries; i++) {
        const sl_ckpt_entry *e = &ck->entries[i];
        sl_tensor *t = (sl_tensor *)e->t; /* the file's own tensor table: ck owns it */
        if (t->dtype != SL_DTYPE_F8_E4M3) continue;
        const char *file = sl_ckpt_path(ck, e);
        char name[512];
        snprintf(name, sizeof name, "%s_scale_inv", t->name);
        const sl_ckpt_entry *se = find_full(ck, name);
        if (t->ndim != 2 && t->ndim != 3)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s': F8_E4M3 with %d dimensions (block-wise FP8 holds "
                           "matrices)",
                           file, e->label, t->ndim);
        if (!se)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tensor '%s' is F8_E4M3 but '%s' is missing (block-wise FP8 needs "
                           "its block scales)",
                           file, e->label, name);
        const sl_tensor *s = se->t;
        const int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
        sl_tensor want = {.ndim = t->ndim};
        if (t->ndim == 3) want.shape[0] = t->shape[0];
        want.shape[t->ndim - 2] = (rows + brows - 1) / brows;
        want.shape[t->ndim - 1] = (cols + bcols - 1) / bcols;
        int ok = s->dtype == SL_DTYPE_F32 && s->ndim == want.ndim;
        for (int32_t d = 0; ok && d < want.ndim; d++)
            ok = s->shape[d] == want.shape[d];
        if (!ok) {
            char ws[128], gs[128];
            return sl_fail(err, SL_ERR_SHAPE,
                           "%s: tensor '%s': expected F32 %s (blocks of %d x %d over %s), got %s "
                           "%s",
                           sl_ckpt_path(ck, se), se->label, sl_shape_str(&want, ws, sizeof ws),
                           brows, bcols, t->name, sl_dtype_name(s->dtype),
                           sl_shape_str(s, gs, sizeof gs));
        }
        t->scales = s->data;
        t->biases = NULL;
        t->group = bcols;
        t->brows = brows;
        t->sdtype = SL_DTYPE_F32;
        t->rphase = 0;
    }
    return SL_OK;
}

/*
 * Mixtral's original layout under the names transformers 5 gives it (its conversion_mapping):
 *   layers.N.block_sparse_moe.gate.weight          -> layers.N.mlp.gate.weight
 *   layers.N.block_sparse_moe.experts.E.w1.weight  -> layers.N.mlp.experts.E.gate_proj.weight
 *   ... w3 -> up_proj, w2 -> down_proj
 * so the binders, the packer and the counts know one layout. Each new name is shorter than the
 * old, so the name is rewritten in place (the file's tensor owns it).
 */
static void rename_legacy(char *name) {
    static const char from[] = ".block_sparse_moe.";
    char *p = strstr(name, from), out[512];
    if (!p || strlen(name) >= sizeof out) return;
    int n = snprintf(out, sizeof out, "%.*s.mlp.%s", (int)(p - name), name, p + strlen(from));
    static const char *const w[3][2] = {{".w1.weight", ".gate_proj.weight"},
                                        {".w3.weight", ".up_proj.weight"},
                                        {".w2.weight", ".down_proj.weight"}};
    for (int i = 0; i < 3; i++) {
        const size_t lw = strlen(w[i][0]);
        if ((size_t)n > lw && strcmp(out + n - lw, w[i][0]) == 0 && strstr(out, ".experts.")) {
            snprintf(out + n - lw, sizeof out - (size_t)n + lw, "%s", w[i][1]);
            break;
        }
    }
    SL_ASSERT(strlen(out) <= strlen(name));
    memcpy(name, out, strlen(out) + 1);
}

sl_status sl_ckpt_open(sl_ckpt *ck, const char *dir, sl_error *err) {
    memset(ck, 0, sizeof *ck);
    ck->prefix = "model.";
    ck->head = "lm_head.weight";
    if (!(ck->dir = strdup(dir))) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    sl_status st;
    if (file_exists(dir) && sl_gguf_is_file(dir))
        return (st = sl_gguf_ckpt_open(ck, dir, err)) ? st : index_entries(ck, err);
    char path[4096];
    char **names = NULL;
    int32_t n = 0;
    /* A packed directory has one core.bin; a Hugging Face one has safetensors. */
    snprintf(path, sizeof path, "%s/core.bin", dir);
    const int packed = file_exists(path);
    if (packed) {
        names = calloc(1, sizeof(char *));
        if (!names || !(names[0] = strdup("core.bin")))
            return sl_fail(err, SL_ERR_NOMEM, "out of memory");
        n = 1;
        st = SL_OK;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (file_exists(path))
            st = shards_from_index(path, &names, &n, err);
        else
            st = shards_from_dir(dir, &names, &n, err);
    }
    if (!st && !(ck->files = calloc((size_t)SL_MAX(n, 1), sizeof(sl_st_file))))
        st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    int32_t total = 0;
    for (int32_t i = 0; !st && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = packed ? sl_core_open(&ck->files[i], path, err) : sl_st_open(&ck->files[i], path, err);
        ck->n_files = i + 1;
        if (!st) total += ck->files[i].n_tensors;
    }
    for (int32_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (st) return st;

    if (!(ck->entries = calloc((size_t)(total ? total : 1), sizeof(sl_ckpt_entry))))
        return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    for (int32_t f = 0; f < ck->n_files; f++)
        for (int32_t i = 0; i < ck->files[f].n_tensors; i++) {
            if (!packed) rename_legacy((char *)ck->files[f].tensors[i].name);
            ck->entries[ck->n_entries++] =
                (sl_ckpt_entry){&ck->files[f].tensors[i], f, ck->files[f].tensors[i].name};
        }
    if ((st = index_entries(ck, err)) || packed) return st;
    /* An MLX checkpoint's quantised modules become Q4/Q8 views, under names sorted again. */
    if ((st = sl_mlx_ckpt_bind(ck, err))) return st;
    if (ck->mlx_bits && (st = index_entries(ck, err))) return st;
    return attach_fp8_scales(ck, err);
}

void sl_ckpt_close(sl_ckpt *ck) {
    if (!ck) return;
    for (int32_t i = 0; i < ck->n_files; i++)
        sl_st_close(&ck->files[i]);
    free(ck->files);
    for (int32_t i = 0; i < ck->n_gguf; i++)
        sl_gguf_close(&ck->gguf[i]);
    free(ck->gguf);
    free(ck->views);
    free(ck->names);
    free(ck->entries);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

sl_status sl_ckpt_check(const sl_ckpt *ck, sl_error *err) {
    for (int32_t i = 0; i < ck->n_files; i++) {
        sl_status st = sl_st_check_size(&ck->files[i], err);
        if (st) return st;
    }
    for (int32_t i = 0; i < ck->n_gguf; i++) {
        struct stat sb;
        if (stat(ck->gguf[i].path, &sb) != 0 || (uint64_t)sb.st_size < ck->gguf[i].size)
            return sl_fail(err, SL_ERR_IO, "%s: the file shrank or went away under the model",
                           ck->gguf[i].path);
    }
    return SL_OK;
}

int sl_ckpt_past_layers(const sl_ckpt *ck, const char *name, int32_t n_layers) {
    const size_t pl = strlen(ck->prefix);
    if (strncmp(name, ck->prefix, pl) != 0 || strncmp(name + pl, "layers.", 7) != 0) return 0;
    char *end;
    const long l = strtol(name + pl + 7, &end, 10);
    return end != name + pl + 7 && *end == '.' && l >= n_layers;
}

const sl_ckpt_entry *sl_ckpt_find(const sl_ckpt *ck, const char *name) {
    char full[512];
    if (name[0] == '/')
        snprintf(full, sizeof full, "%s", name + 1);
    else
        snprintf(full, sizeof full, "%s%s", ck->prefix, name);
    return find_full(ck, full);
}

sl_status sl_ckpt_bind(const sl_ckpt *ck, sl_tensor *out, int flags, int32_t ndim,
                       const int64_t *shape, sl_error *err, const char *fmt, ...) {
    char name[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    memset(out, 0, sizeof *out);
    const sl_ckpt_entry *e = sl_ckpt_find(ck, name);
    if (!e) {
        if (flags & SL_BIND_OPTIONAL) return SL_OK;
        return sl_fail(err, SL_ERR_SHAPE, "%s: missing tensor '%s%s'", ck->dir,
                       name[0] == '/' ? "" : ck->prefix, name[0] == '/' ? name + 1 : name);
    }
    const sl_tensor *t = e->t;
    const char *file = sl_ckpt_path(ck, e);
    /* Block types hold matrices (rows of whole blocks): never a vector. */
    if (t->dtype != SL_DTYPE_F32 && t->dtype != SL_DTYPE_F16 && t->dtype != SL_DTYPE_BF16 &&
        !(sl_dtype_is_quant(t->dtype) && ndim >= 2) &&
        !(sl_dtype_is_block(t->dtype) && ndim >= 2) && !(sl_tensor_is_fp8(t) && ndim >= 2))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tensor '%s': dtype %s (expected BF16, F16 "
                       "or F32)",
                       file, e->label, sl_dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        sl_tensor w = {.ndim = ndim};
        memcpy(w.shape, shape, sizeof(int64_t) * (size_t)ndim);
        return sl_fail(err, SL_ERR_SHAPE, "%s: tensor '%s': expected shape %s, got %s", file,
                       e->label, sl_shape_str(&w, want, sizeof want),
                       sl_shape_str(t, got, sizeof got));
    }
    *out = *t;
    return SL_OK;
}

sl_tensor sl_tensor_rows(const sl_tensor *t, int64_t row0, int64_t rows) {
    SL_ASSERT(t->ndim == 2 && row0 >= 0 && row0 + rows <= t->shape[0]);
    sl_tensor v = *t;
    size_t row_bytes = sl_row_bytes(t->dtype, t->shape[1]);
    v.data = (const uint8_t *)t->data + (size_t)row0 * row_bytes;
    v.shape[0] = rows;
    v.nbytes = (size_t)rows * row_bytes;
    if (sl_tensor_is_fp8(t)) return sl_fp8_rows(t, row0, rows);
    if (sl_dtype_is_quant(t->dtype)) {
        const size_t sb = sl_tensor_qscale_bytes(t, row0);
        v.scales = (const uint8_t *)t->scales + sb;
        v.biases = (const uint8_t *)t->biases + sb;
    }
    return v;
}

sl_tensor sl_tensor_slice(const sl_tensor *t, int64_t i) {
    SL_ASSERT(t->ndim == 3 && i >= 0 && i < t->shape[0]);
    sl_tensor v = *t;
    size_t mat_bytes = (size_t)t->shape[1] * sl_row_bytes(t->dtype, t->shape[2]);
    v.data = (const uint8_t *)t->data + (size_t)i * mat_bytes;
    v.ndim = 2;
    v.shape[0] = t->shape[1];
    v.shape[1] = t->shape[2];
    v.nbytes = mat_bytes;
    if (sl_tensor_is_fp8(t)) { /* [E, ceil(rows / brows), ceil(cols / group)] scales */
        const size_t per = (size_t)((t->shape[1] + t->brows - 1) / t->brows) *
                           (size_t)((t->shape[2] + t->group - 1) / t->group);
        v.scales = (const float *)t->scales + (size_t)i * per;
    } else if (sl_dtype_is_quant(t->dtype)) { /* MLX's stacked experts: [E, rows, groups] */
        const size_t sb = sl_tensor_qscale_bytes(t, i * t->shape[1]);
        v.scales = (const uint8_t *)t->scales + sb;
        v.biases = (const uint8_t *)t->biases + sb;
    }
    return v;
}
