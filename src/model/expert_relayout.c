/* Experts stored in other layouts (contracts in expert_relayout.h). */
#include "model/expert_relayout.h"

#include "model/blocks.h"

/* ------------------------------------------------------------- MXFP4 */

void sl_mxfp4_hf_to_ggml_row(uint8_t *dst, const uint8_t *codes, const uint8_t *scales,
                             int64_t cols) {
    /* Both give element k of a block of 32 the same 4-bit e2m1 code and the block the same
     * E8M0 exponent e (value code * 2^(e - 127); ggml doubles the codes and halves the scale):
     * only where the codes sit differs. */
    for (int64_t b = 0; b < cols / 32; b++) {
        const uint8_t *q = codes + 16 * b;
        uint8_t *o = dst + 17 * b;
        o[0] = scales[b];
        for (int j = 0; j < 16; j++) {
            const int k0 = j, k1 = j + 16; /* ggml's low and high nibble of qs[j] */
            const uint8_t lo = (uint8_t)((q[k0 / 2] >> (4 * (k0 & 1))) & 15);
            const uint8_t hi = (uint8_t)((q[k1 / 2] >> (4 * (k1 & 1))) & 15);
            o[1 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* ------------------------------------------------------ gpt-oss, Llama-4 */

/*
 * The raw pieces of one expert, in this order:
 *   floats: gate_up [H, 2I], gate_up bias [2I], down [I, H], down bias [H]
 *   MXFP4:  gate_up codes [2I, H/32, 16], scales [2I, H/32], gate_up bias [2I],
 *           down codes [H, I/32, 16], scales [H, I/32], down bias [H]
 *   halves: gate_up [H, 2I], down [I, H] (Llama-4: no biases)
 * gate is column (row, for MXFP4) 2i of gate_up and up 2i + 1, or with halves gate the columns
 * [0, I) and up [I, 2I); the float matrices are in x out and so transposed here, element by
 * element.
 */
enum { GU_FLOAT = 0, GU_MXFP4 = 1, GU_HALVES = 2 };

static void copy_el(uint8_t *dst, const uint8_t *src, size_t es) {
    memcpy(dst, src, es);
}

static void relayout_gate_up_t(const sl_expert_relayout *r, const uint8_t *const *raw,
                               const sl_expert *dst) {
    const int64_t H = r->hidden, I = r->inter;
    uint8_t *g = (uint8_t *)dst->gate.data, *u = (uint8_t *)dst->up.data;
    uint8_t *d = (uint8_t *)dst->down.data;
    uint8_t *gb = (uint8_t *)dst->gate_bias.data, *ub = (uint8_t *)dst->up_bias.data;
    uint8_t *db = (uint8_t *)dst->down_bias.data;
    const size_t bs = sl_dtype_size(dst->gate_bias.dtype);
    const uint8_t *gub = raw[r->kind == GU_MXFP4 ? 2 : 1], *dnb = raw[r->kind == GU_MXFP4 ? 5 : 3];
    for (int64_t i = 0; r->kind != GU_HALVES && i < I; i++) {
        copy_el(gb + (size_t)i * bs, gub + (size_t)(2 * i) * bs, bs);
        copy_el(ub + (size_t)i * bs, gub + (size_t)(2 * i + 1) * bs, bs);
    }
    if (r->kind != GU_HALVES) memcpy(db, dnb, (size_t)H * bs);
    if (r->kind == GU_MXFP4) {
        /* rows in parallel: a stream miss of gpt-oss-120b is 13 MB to lay out */
        const size_t grb = sl_row_bytes(SL_DTYPE_MXFP4, H), drb = sl_row_bytes(SL_DTYPE_MXFP4, I);
#pragma omp parallel for schedule(static)
        for (int64_t row = 0; row < 2 * I; row++)
            sl_mxfp4_hf_to_ggml_row((row & 1 ? u : g) + (size_t)(row / 2) * grb,
                                    raw[0] + (size_t)row * (size_t)(H / 2),
                                    raw[1] + (size_t)row * (size_t)(H / 32), H);
#pragma omp parallel for schedule(static)
        for (int64_t row = 0; row < H; row++)
            sl_mxfp4_hf_to_ggml_row(d + (size_t)row * drb, raw[3] + (size_t)row * (size_t)(I / 2),
                                    raw[4] + (size_t)row * (size_t)(I / 32), I);
        return;
    }
    const size_t es = sl_dtype_size(dst->gate.dtype);
    const uint8_t *gu = raw[0], *dn = raw[r->kind == GU_HALVES ? 1 : 2];
    if (r->kind == GU_HALVES) {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < 2 * I; c++) /* gate_up[h][c] -> gate[c][h] or up[c - I][h] */
            for (int64_t h = 0; h < H; h++)
                copy_el((c < I ? g + (size_t)(c * H + h) * es : u + (size_t)((c - I) * H + h) * es),
                        gu + (size_t)(h * 2 * I + c) * es, es);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < 2 * I; c++) /* gate_up[h][c] -> gate[c / 2][h] or up[c / 2][h] */
            for (int64_t h = 0; h < H; h++)
                copy_el((c & 1 ? u : g) + (size_t)((c / 2) * H + h) * es,
                        gu + (size_t)(h * 2 * I + c) * es, es);
    }
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; h++) /* down[i][h] -> down[h][i] */
        for (int64_t i = 0; i < I; i++)
            copy_el(d + (size_t)(h * I + i) * es, dn + (size_t)(i * H + h) * es, es);
}

/* A checkpoint tensor of exactly dtype dt (NONE: F32, F16 or BF16) and shape, by name. */
static sl_status bind_exact(const sl_ckpt *ck, sl_tensor *out, sl_dtype dt, int32_t ndim,
                            const int64_t *shape, sl_error *err, const char *fmt, int32_t l) {
    char name[160];
    snprintf(name, sizeof name, fmt, l);
    if (dt == SL_DTYPE_NONE)
        return sl_ckpt_bind(ck, out, SL_BIND_REQUIRED, ndim, shape, err, "%s", name);
    const sl_ckpt_entry *e = sl_ckpt_find(ck, name);
    if (!e)
        return sl_fail(err, SL_ERR_SHAPE, "%s: missing tensor '%s%s'", ck->dir, ck->prefix, name);
    int ok = e->t->dtype == dt && e->t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++)
        ok = e->t->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        sl_tensor w = {.ndim = ndim};
        memcpy(w.shape, shape, sizeof(int64_t) * (size_t)ndim);
        return sl_fail(err, SL_ERR_SHAPE, "%s: tensor '%s': expected %s %s, got %s %s",
                       sl_ckpt_path(ck, e), e->label, sl_dtype_name(dt),
                       sl_shape_str(&w, want, sizeof want), sl_dtype_name(e->t->dtype),
                       sl_shape_str(e->t, got, sizeof got));
    }
    *out = *e->t;
    return SL_OK;
}

/* Layer l's tensors into src (its relayout r, whose extents ext[E x n_raw] it fills). */
static sl_status bind_layer(const sl_model *m, int32_t l, sl_expert_src *src, sl_expert_relayout *r,
                            sl_expert_extent *ext, sl_error *err) {
    const sl_ckpt *ck = &m->ck;
    const int32_t E = m->cfg.n_experts;
    const int64_t H = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    const int halves = m->cfg.expert_layout == SL_EXPERT_LAYOUT_IN_OUT;
    char pre[96], name[160];
    snprintf(pre, sizeof pre, "layers.%%d.%s.",
             m->family->experts_module ? m->family->experts_module : "mlp.experts");
    snprintf(name, sizeof name, "layers.%d.mlp.experts.gate_up_proj_blocks", l);
    const int mx = !halves && sl_ckpt_find(ck, name) != NULL;
    sl_tensor t[6];
    char f[6][128];
    static const char *const names[3][6] = {
        {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"},
        {"gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks",
         "down_proj_scales", "down_proj_bias"},
        {"gate_up_proj", "down_proj"}};
    const int kind = halves ? GU_HALVES : mx ? GU_MXFP4 : GU_FLOAT;
    const int n = halves ? 2 : mx ? 6 : 4;
    for (int i = 0; i < n; i++)
        snprintf(f[i], sizeof f[i], "%s%s", pre, names[kind][i]);
    sl_status st;
    if (halves) {
        if ((st = bind_exact(ck, &t[0], SL_DTYPE_NONE, SL_DIMS(E, H, 2 * I), err, f[0], l)) ||
            (st = bind_exact(ck, &t[1], SL_DTYPE_NONE, SL_DIMS(E, I, H), err, f[1], l)))
            return st;
        if (t[0].dtype != t[1].dtype)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: layer %d: the experts' tensors differ in dtype (%s, %s)", ck->dir,
                           l, sl_dtype_name(t[0].dtype), sl_dtype_name(t[1].dtype));
    } else if (mx) {
        if (H % 32 || I % 32)
            return sl_fail(err, SL_ERR_SHAPE,
                           "%s: MXFP4 experts need hidden_size (%lld) and intermediate_size "
                           "(%lld) to be multiples of 32",
                           ck->dir, (long long)H, (long long)I);
        if ((st =
                 bind_exact(ck, &t[0], SL_DTYPE_U8, SL_DIMS(E, 2 * I, H / 32, 16), err, f[0], l)) ||
            (st = bind_exact(ck, &t[1], SL_DTYPE_U8, SL_DIMS(E, 2 * I, H / 32), err, f[1], l)) ||
            (st = bind_exact(ck, &t[2], SL_DTYPE_NONE, SL_DIMS(E, 2 * I), err, f[2], l)) ||
            (st = bind_exact(ck, &t[3], SL_DTYPE_U8, SL_DIMS(E, H, I / 32, 16), err, f[3], l)) ||
            (st = bind_exact(ck, &t[4], SL_DTYPE_U8, SL_DIMS(E, H, I / 32), err, f[4], l)) ||
            (st = bind_exact(ck, &t[5], SL_DTYPE_NONE, SL_DIMS(E, H), err, f[5], l)))
            return st;
    } else if ((st = bind_exact(ck, &t[0], SL_DTYPE_NONE, SL_DIMS(E, H, 2 * I), err, f[0], l)) ||
               (st = bind_exact(ck, &t[1], SL_DTYPE_NONE, SL_DIMS(E, 2 * I), err, f[1], l)) ||
               (st = bind_exact(ck, &t[2], SL_DTYPE_NONE, SL_DIMS(E, I, H), err, f[2], l)) ||
               (st = bind_exact(ck, &t[3], SL_DTYPE_NONE, SL_DIMS(E, H), err, f[3], l))) {
        return st;
    }
    const sl_tensor *gub = &t[mx ? 2 : 1], *db = &t[mx ? 5 : 3];
    const sl_tensor *w0 = &t[0], *w1 = &t[mx ? 3 : 2];
    if (!halves && (gub->dtype != db->dtype || (!mx && w0->dtype != w1->dtype)))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: layer %d: the experts' tensors differ in dtype (%s, %s, %s, %s)",
                       ck->dir, l, sl_dtype_name(w0->dtype), sl_dtype_name(gub->dtype),
                       sl_dtype_name(w1->dtype), sl_dtype_name(db->dtype));
    *r = (sl_expert_relayout){
        .fn = relayout_gate_up_t, .n_raw = n, .ext = ext, .kind = kind, .hidden = H, .inter = I};
    for (int i = 0; i < n; i++) {
        r->raw_len[i] = t[i].nbytes / (size_t)E;
        for (int32_t e = 0; e < E; e++) {
            sl_expert_extent *x = &ext[(size_t)n * e + i];
            x->file =
                sl_ckpt_locate(ck, (const uint8_t *)t[i].data + (size_t)e * r->raw_len[i], &x->off);
            if (x->file < 0)
                return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: layer %d: %s is not in the files",
                               ck->dir, l, t[i].name);
        }
    }
    /* the blob's matrices: nn.Linear layout, the codes' dtype (MXFP4: ggml's blocks) */
    const sl_dtype wd = mx ? SL_DTYPE_MXFP4 : w0->dtype;
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    static const char *const mnames[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int k = 0; k < 3; k++) {
        src->proto[k] = (sl_tensor){.name = mnames[k], .dtype = wd, .ndim = 2};
        src->proto[k].shape[0] = rows[k], src->proto[k].shape[1] = cols[k];
        src->proto[k].nbytes = (size_t)rows[k] * sl_row_bytes(wd, cols[k]);
        if (halves) continue; /* no biases */
        src->bias_proto[k] = (sl_tensor){.name = mnames[k], .dtype = gub->dtype, .ndim = 1};
        src->bias_proto[k].shape[0] = rows[k];
    }
    src->relayout = r;
    return SL_OK;
}

int32_t sl_fused_experts_layout(const sl_config *c, const sl_ckpt *ck) {
    int32_t l = 0;
    while (l < c->n_layers && !c->layer_is_moe[l])
        l++;
    if (l == c->n_layers || c->n_experts < 1) return c->expert_layout;
    const char *mod =
        c->family && c->family->experts_module ? c->family->experts_module : "mlp.experts";
    char name[160];
    snprintf(name, sizeof name, "layers.%d.%s.gate_up_proj", l, mod);
    const sl_ckpt_entry *gu = sl_ckpt_find(ck, name);
    snprintf(name, sizeof name, "layers.%d.%s.down_proj", l, mod);
    const sl_ckpt_entry *dn = sl_ckpt_find(ck, name);
    if (!gu || !dn || gu->t->ndim != 3 || dn->t->ndim != 3) return c->expert_layout;
    /* Together the two shapes always tell: H = 2I leaves gate_up_proj's alike in both
     * layouts, but then not down_proj's, and H = I the other way round. */
    const int64_t E = c->n_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    const int64_t *g = gu->t->shape, *d = dn->t->shape;
    const int in_out =
        g[0] == E && g[1] == H && g[2] == 2 * I && d[0] == E && d[1] == I && d[2] == H;
    return in_out ? SL_EXPERT_LAYOUT_IN_OUT : c->expert_layout;
}

sl_status sl_open_experts_gate_up_t(sl_model *m, const sl_store_params *sp, sl_error *err) {
    const sl_config *c = &m->cfg;
    const int32_t E = c->n_experts, nl = c->n_layers, nf = sl_ckpt_n_files(&m->ck);
    sl_expert_src *src = sl_calloc((size_t)nl, sizeof *src, err);
    sl_expert_relayout *rl = sl_calloc((size_t)nl, sizeof *rl, err);
    sl_expert_extent **ext = sl_calloc((size_t)nl, sizeof *ext, err);
    const char **paths = sl_calloc((size_t)SL_MAX(nf, 1), sizeof(char *), err);
    sl_status st = src && rl && ext && paths ? SL_OK : SL_ERR_NOMEM;
    for (int32_t i = 0; !st && i < nf; i++)
        paths[i] = sl_ckpt_file(&m->ck, i);
    for (int32_t l = 0; !st && l < nl; l++) {
        if (!c->layer_is_moe[l] || E == 0) continue;
        if (!(ext[l] = sl_calloc((size_t)E * SL_RAW_MAX, sizeof(sl_expert_extent), err)))
            st = SL_ERR_NOMEM;
        else
            st = bind_layer(m, l, &src[l], &rl[l], ext[l], err);
    }
    sl_store_params p = *sp;
    if (p.mode == SL_EXPERTS_MAPPED) p.mode = SL_EXPERTS_RESIDENT;
    if (!st) st = sl_experts_open_files(&m->experts, nl, E, nf, paths, src, &p, err);
    for (int32_t l = 0; ext && l < nl; l++)
        free(ext[l]);
    free(src), free(rl), free(ext), free(paths);
    return st;
}
