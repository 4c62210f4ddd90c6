/* MLX checkpoints: quantised modules bound in place as Q4/Q8 views (mlx_ckpt.h). */
#include "model/mlx_ckpt.h"

#include <jansson.h>
#include <sys/stat.h>

/* The quantization object of an MLX config (NULL: not an MLX checkpoint). "quantization_config"
 * counts only without a "quant_method": with one it is another tool's (FP8, GPTQ, AWQ). */
static json_t *mlx_quant(json_t *root) {
    json_t *q = json_object_get(root, "quantization");
    if (json_is_object(q)) return q;
    q = json_object_get(root, "quantization_config");
    if (json_is_object(q) && !json_object_get(q, "quant_method") &&
        json_is_integer(json_object_get(q, "bits")))
        return q;
    return NULL;
}

/* bits and group_size of one object (defaults where a key is absent); 0 when they are there
 * but not integers. */
static int read_params(json_t *o, int32_t *bits, int32_t *group) {
    json_t *b = json_object_get(o, "bits"), *g = json_object_get(o, "group_size");
    if ((b && !json_is_integer(b)) || (g && !json_is_integer(g))) return 0;
    if (b) *bits = (int32_t)json_integer_value(b);
    if (g) *group = (int32_t)json_integer_value(g);
    return 1;
}

static const sl_ckpt_entry *find_entry(const sl_ckpt *ck, const char *full) {
    for (int32_t lo = 0, hi = ck->n_entries; lo < hi;) {
        const int32_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(ck->entries[mid].t->name, full);
        if (c == 0) return &ck->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The name a tensor is bound under: switch_mlp.P.weight -> experts.P (the stacked layout). */
static void bound_name(const char *name, char *out, size_t cap) {
    const char *sw = strstr(name, ".switch_mlp.");
    if (!sw || !ends_with(name, ".weight")) {
        snprintf(out, cap, "%s", name);
        return;
    }
    const char *proj = sw + strlen(".switch_mlp.");
    snprintf(out, cap, "%.*s.experts.%.*s", (int)(sw - name), name,
             (int)(strlen(proj) - strlen(".weight")), proj);
}

static int same_shape(const sl_tensor *a, const sl_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* The Q4/Q8 view of module X's weight w with its scales s and biases b. */
static sl_status quant_view(const sl_ckpt *ck, const sl_ckpt_entry *we, const sl_tensor *s,
                            const sl_tensor *b, int32_t bits, int32_t group, sl_tensor *v,
                            sl_error *err) {
    const sl_tensor *w = we->t;
    const char *file = sl_ckpt_path(ck, we);
    char got[128];
    if (bits != 4 && bits != 8)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tensor '%s': MLX %d-bit quantisation (sluice runs 4 and 8 bits)", file,
                       we->label, bits);
    if (group != 32 && group != 64 && group != 128)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tensor '%s': MLX group size %d (sluice runs 32, 64 and 128)", file,
                       we->label, group);
    if (w->dtype != SL_DTYPE_U32 || (w->ndim != 2 && w->ndim != 3))
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': an MLX quantised weight is U32 [out, in * bits / 32] or "
                       "[E, out, in * bits / 32], got %s %s",
                       file, we->label, sl_dtype_name(w->dtype), sl_shape_str(w, got, sizeof got));
    if ((s->dtype != SL_DTYPE_BF16 && s->dtype != SL_DTYPE_F16 && s->dtype != SL_DTYPE_F32) ||
        b->dtype != s->dtype || !same_shape(s, b) || s->ndim != w->ndim)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: tensor '%s': its scales (%s %s) and biases (%s) must be BF16, F16 or "
                       "F32 of one shape, with the weight's rank",
                       file, we->label, sl_dtype_name(s->dtype), sl_shape_str(s, got, sizeof got),
                       sl_dtype_name(b->dtype));
    const int32_t nd = w->ndim;
    const int64_t in = w->shape[nd - 1] * 32 / bits;
    for (int32_t i = 0; i + 1 < nd; i++)
        if (s->shape[i] != w->shape[i])
            return sl_fail(err, SL_ERR_SHAPE, "%s: tensor '%s': scales %s do not match the rows",
                           file, we->label, sl_shape_str(s, got, sizeof got));
    if (in % group != 0 || s->shape[nd - 1] != in / group)
        return sl_fail(err, SL_ERR_SHAPE,
                       "%s: tensor '%s': %lld columns in groups of %d (%d bits) need %lld scales "
                       "per row, the file has %lld",
                       file, we->label, (long long)in, group, bits, (long long)(in / group),
                       (long long)s->shape[nd - 1]);
    *v = *w;
    v->dtype = bits == 4 ? SL_DTYPE_Q4 : SL_DTYPE_Q8;
    v->shape[nd - 1] = in;
    v->scales = s->data;
    v->biases = b->data;
    v->group = group;
    v->sdtype = s->dtype;
    return SL_OK;
}

sl_status sl_mlx_ckpt_bind(sl_ckpt *ck, sl_error *err) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/config.json", ck->dir);
    if (stat(path, &sb) != 0) return SL_OK; /* the config loader says what is missing */
    json_t *root = NULL;
    sl_status st = sl_json_load_file(path, &root, err);
    if (st) return st;
    json_t *q = mlx_quant(root);
    if (!q) {
        json_decref(root);
        return SL_OK;
    }
    int32_t bits = 0, group = 64;
    json_t *mode = json_object_get(q, "mode");
    if (!read_params(q, &bits, &group) || bits <= 0) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: 'quantization' needs integer 'bits' and 'group_size'",
                     path);
        goto done;
    }
    if (mode && (!json_is_string(mode) || strcmp(json_string_value(mode), "affine") != 0)) {
        st = sl_fail(err, SL_ERR_UNSUPPORTED,
                     "%s: MLX quantization mode '%s' is not supported (sluice runs 'affine')", path,
                     json_is_string(mode) ? json_string_value(mode) : "?");
        goto done;
    }
    ck->mlx_bits = bits;
    ck->mlx_group = group;

    /* One view per quantised module and per other switch_mlp tensor, names in one block. */
    int32_t n_views = 0;
    size_t name_bytes = 0;
    for (int32_t i = 0; i < ck->n_entries; i++) {
        const char *n = ck->entries[i].t->name;
        if (ends_with(n, ".scales") || (strstr(n, ".switch_mlp.") && ends_with(n, ".weight"))) {
            n_views++;
            name_bytes += strlen(n) + 16;
        }
    }
    if (!(ck->views = sl_calloc((size_t)n_views + 1, sizeof(sl_tensor), err)) ||
        !(ck->names = sl_calloc(name_bytes + 1, 1, err))) {
        st = SL_ERR_NOMEM;
        goto done;
    }
    /* Lookups need the entries as they are (sorted): what changes is noted first, applied after
     * (set[i]: entry i's new tensor; scales and biases entries get the drop marker). */
    const sl_tensor **set = sl_calloc((size_t)ck->n_entries + 1, sizeof *set, err);
    if (!set) {
        st = SL_ERR_NOMEM;
        goto done;
    }
    static const sl_tensor drop = {0};
    char *np = ck->names;
    int32_t nv = 0;
    for (int32_t i = 0; !st && i < ck->n_entries; i++) {
        sl_ckpt_entry *e = &ck->entries[i];
        if (!ends_with(e->t->name, ".scales")) continue;
        const sl_tensor *s = e->t;
        char mod[400], full[420];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(s->name) - strlen(".scales")), s->name);
        snprintf(full, sizeof full, "%s.weight", mod);
        const sl_ckpt_entry *we = find_entry(ck, full);
        snprintf(full, sizeof full, "%s.biases", mod);
        const sl_ckpt_entry *be = find_entry(ck, full);
        if (!we || !be) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: tensor '%s': an MLX quantised module needs '%s.weight', '.scales' "
                         "and '.biases' (affine mode)",
                         sl_ckpt_path(ck, e), e->label, mod);
            break;
        }
        int32_t mb = bits, mg = group;
        json_t *o = json_object_get(q, mod);
        if (json_is_false(o) || (o && !json_is_object(o)) || (o && !read_params(o, &mb, &mg))) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: quantization['%s'] says the module is not quantised (or is not an "
                         "object), but %s has its scales",
                         path, mod, sl_ckpt_path(ck, e));
            break;
        }
        sl_tensor *v = &ck->views[nv++];
        if ((st = quant_view(ck, we, s, be->t, mb, mg, v, err))) break;
        bound_name(we->t->name, np, strlen(we->t->name) + 16);
        v->name = np;
        np += strlen(np) + 1;
        set[we - ck->entries] = v;
        set[i] = set[be - ck->entries] = &drop;
    }
    /* Float tensors of switch_mlp (mlx-lm leaves a projection whose rows do not divide into
     * groups unquantised) take the stacked names as well. */
    for (int32_t i = 0; !st && i < ck->n_entries; i++) {
        const sl_ckpt_entry *e = &ck->entries[i];
        if (set[i] || !strstr(e->t->name, ".switch_mlp.") || !ends_with(e->t->name, ".weight"))
            continue;
        sl_tensor *v = &ck->views[nv++];
        *v = *e->t;
        bound_name(e->t->name, np, strlen(e->t->name) + 16);
        v->name = np;
        np += strlen(np) + 1;
        set[i] = v;
    }
    int32_t n = 0;
    for (int32_t i = 0; !st && i < ck->n_entries; i++) {
        if (set[i] == &drop) continue;
        ck->entries[n] = ck->entries[i];
        if (set[i]) ck->entries[n].t = set[i];
        n++;
    }
    if (!st) ck->n_entries = n;
    free(set);
done:
    json_decref(root);
    return st;
}
