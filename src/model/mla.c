/* Multi-head latent attention (contracts and the picture in mla.h). */
#include "model/mla.h"

#include "kernels/blocks.h"
#include "kernels/fp8.h"
#include "kernels/quant.h"
#include "model/blocks.h"

/* ------------------------------------------------------------- binding */

/* Row n of a 2-D weight of any type, widened to float (dequantised where quantised). */
static void widen_row(const sl_tensor *t, int64_t n, float *dst) {
    const int64_t K = t->shape[1];
    if (sl_tensor_is_fp8(t))
        sl_dequant_fp8_row(t, n, dst);
    else if (sl_dtype_is_quant(t->dtype))
        sl_dequantize_row(t, n, dst);
    else if (sl_dtype_is_block(t->dtype))
        sl_dequant_row(t->dtype, (const uint8_t *)t->data + (size_t)n * sl_row_bytes(t->dtype, K),
                       dst, K);
    else
        sl_to_f32(dst, t->data, t->dtype, (size_t)(n * K), (size_t)K);
}

/*
 * W_UK^T of every head, [nh * kv, dn]: row h kv + c is column c of head h's W_UK (kv_b_proj's
 * rows h (dn + dv) .. + dn). The absorbed query needs W_UK transposed, which no row-wise matmul
 * gives, so it is copied once at load (one nh kv dn matrix per layer, the size of W_UK itself):
 *   - F32/F16/BF16: the same values, transposed;
 *   - block-wise FP8 whose scale blocks tile every head's W_UK (kv a multiple of the block's
 *     columns, dn + dv of its rows: the official checkpoints' 128 x 128): the same codes,
 *     transposed, with the scales transposed block for block (so the same dequantised values,
 *     at a byte a weight);
 *   - any other type (a pack's Q8/Q4, a GGUF's blocks, other FP8 tilings): dequantised to F32
 *     (4 bytes a weight: DeepSeek-V3's 128 heads make it 32 MiB a layer).
 * W_UV needs no copy: its rows are a view of kv_b_proj.
 */
sl_status blk_mla_make_uk_t(const blk_mla_dims *d, blk_mla_layer *L, sl_error *err) {
    const sl_tensor *kb = &L->kv_b;
    const int64_t nh = d->n_heads, dn = d->nope_dim, dv = d->v_dim, kv = d->kv_lora_rank;
    const int64_t rows = nh * kv;
    sl_tensor *u = &L->uk_t;
    *u = (sl_tensor){.name = "kv_b_proj (W_UK transposed)", .ndim = 2, .shape = {rows, dn}};
    const int fp8 = sl_tensor_is_fp8(kb) && kb->rphase == 0 && kv % kb->group == 0 &&
                    (dn + dv) % kb->brows == 0;
    const int plain =
        kb->dtype == SL_DTYPE_F32 || kb->dtype == SL_DTYPE_F16 || kb->dtype == SL_DTYPE_BF16;
    u->dtype = fp8 ? SL_DTYPE_F8_E4M3 : plain ? kb->dtype : SL_DTYPE_F32;
    const size_t es = sl_dtype_size(u->dtype);
    u->nbytes = (size_t)rows * (size_t)dn * es;
    if (!(L->uk_mem = sl_calloc(1, u->nbytes, err))) return SL_ERR_NOMEM;
    u->data = L->uk_mem;
    uint8_t *dst = L->uk_mem;
    if (fp8 || plain) {
        const uint8_t *src = kb->data;
        for (int64_t h = 0; h < nh; h++)
            for (int64_t e = 0; e < dn; e++) {
                const uint8_t *srow = src + (size_t)((h * (dn + dv) + e) * kv) * es;
                for (int64_t c = 0; c < kv; c++)
                    memcpy(dst + (size_t)((h * kv + c) * dn + e) * es, srow + (size_t)c * es, es);
            }
    } else {
        float *row = sl_calloc((size_t)kv, sizeof(float), err);
        if (!row) return SL_ERR_NOMEM;
        float *out = L->uk_mem;
        for (int64_t h = 0; h < nh; h++)
            for (int64_t e = 0; e < dn; e++) {
                widen_row(kb, h * (dn + dv) + e, row);
                for (int64_t c = 0; c < kv; c++)
                    out[(h * kv + c) * dn + e] = row[c];
            }
        free(row);
    }
    if (!fp8) return SL_OK;
    /* The scale of block (row block r, column block q) of the copy is that of the source's
     * block (column block r, row block q) of the same head. */
    const int32_t br = kb->brows, bc = kb->group;
    const int64_t src_ncb = (kv + bc - 1) / bc, dst_ncb = (dn + br - 1) / br;
    const int64_t dst_nrb = rows / bc;
    float *s = sl_calloc((size_t)(dst_nrb * dst_ncb), sizeof(float), err);
    if (!s) return SL_ERR_NOMEM;
    const float *ss = kb->scales;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t cb = 0; cb < kv / bc; cb++)
            for (int64_t db = 0; db < dst_ncb; db++)
                s[(h * kv / bc + cb) * dst_ncb + db] = ss[(h * (dn + dv) / br + db) * src_ncb + cb];
    L->uk_scales = s;
    u->scales = s;
    u->brows = bc;
    u->group = br;
    u->sdtype = SL_DTYPE_F32;
    return SL_OK;
}

sl_status blk_bind_mla(sl_model *m, int32_t l, const blk_mla_dims *d, blk_mla_layer *L,
                       sl_error *err) {
    const sl_ckpt *ck = &m->ck;
    const int64_t H = m->cfg.hidden_size, nh = d->n_heads, dn = d->nope_dim, dr = d->rope_dim;
    const int64_t dv = d->v_dim, kv = d->kv_lora_rank, ql = d->q_lora_rank;
    const int64_t nq = nh * (dn + dr);
    const int bias = d->bias ? SL_BIND_REQUIRED : SL_BIND_OPTIONAL;
    const char *p = "layers.%d.self_attn.%s";
    sl_status st;
    memset(L, 0, sizeof *L);
    if ((st = sl_ckpt_bind(ck, &m->layers[l].attn_norm, blk_norm_flags(m), SL_DIMS(H), err,
                           "layers.%d.input_layernorm.weight", l)))
        return st;
    if (ql > 0) {
        if ((st = sl_ckpt_bind(ck, &L->q_a, SL_BIND_REQUIRED, SL_DIMS(ql, H), err, p, l,
                               "q_a_proj.weight")) ||
            (st = sl_ckpt_bind(ck, &L->q_a_norm, SL_BIND_REQUIRED, SL_DIMS(ql), err, p, l,
                               "q_a_layernorm.weight")) ||
            (st = sl_ckpt_bind(ck, &L->q_b, SL_BIND_REQUIRED, SL_DIMS(nq, ql), err, p, l,
                               "q_b_proj.weight")) ||
            (d->bias &&
             (st = sl_ckpt_bind(ck, &L->b_q_a, bias, SL_DIMS(ql), err, p, l, "q_a_proj.bias"))))
            return st;
    } else if ((st = sl_ckpt_bind(ck, &L->q, SL_BIND_REQUIRED, SL_DIMS(nq, H), err, p, l,
                                  "q_proj.weight"))) {
        return st;
    }
    if ((st = sl_ckpt_bind(ck, &L->kv_a, SL_BIND_REQUIRED, SL_DIMS(kv + dr, H), err, p, l,
                           "kv_a_proj_with_mqa.weight")) ||
        (st = sl_ckpt_bind(ck, &L->kv_a_norm, SL_BIND_REQUIRED, SL_DIMS(kv), err, p, l,
                           "kv_a_layernorm.weight")) ||
        (st = sl_ckpt_bind(ck, &L->kv_b, SL_BIND_REQUIRED, SL_DIMS(nh * (dn + dv), kv), err, p, l,
                           "kv_b_proj.weight")) ||
        (st = sl_ckpt_bind(ck, &L->o, SL_BIND_REQUIRED, SL_DIMS(H, nh * dv), err, p, l,
                           "o_proj.weight")))
        return st;
    if (d->bias && ((st = sl_ckpt_bind(ck, &L->b_kv_a, bias, SL_DIMS(kv + dr), err, p, l,
                                       "kv_a_proj_with_mqa.bias")) ||
                    (st = sl_ckpt_bind(ck, &L->b_o, bias, SL_DIMS(H), err, p, l, "o_proj.bias"))))
        return st;
    return blk_mla_make_uk_t(d, L, err);
}

void blk_mla_free(blk_mla_layer *L) {
    free(L->uk_mem);
    free(L->uk_scales);
    L->uk_mem = L->uk_scales = NULL;
}

int32_t blk_mla_weights(blk_mla_layer *L, sl_tensor **out) {
    sl_tensor *w[] = {&L->q_a,  &L->q_a_norm, &L->q_b,   &L->q,      &L->kv_a, &L->kv_a_norm,
                      &L->kv_b, &L->o,        &L->b_q_a, &L->b_kv_a, &L->b_o,  &L->uk_t};
    const int32_t n = (int32_t)(sizeof w / sizeof w[0]);
    for (int32_t i = 0; out && i < n; i++)
        out[i] = w[i];
    return n;
}

/* ------------------------------------------------------------- session */

void blk_mla_layout(const sl_session *s, const blk_mla_dims *d, blk_mla_buf *b, sl_carver *dev,
                    sl_carver *host) {
    const size_t B = (size_t)s->max_batch, nh = (size_t)d->n_heads, dn = (size_t)d->nope_dim;
    const size_t dr = (size_t)d->rope_dim, dv = (size_t)d->v_dim, kv = (size_t)d->kv_lora_rank;
    const size_t row = kv + dr;
    b->qa = sl_carve(dev, B * (size_t)d->q_lora_rank, sizeof(float));
    b->qf = sl_carve(dev, B * nh * (dn + dr), sizeof(float));
    b->kva = sl_carve(dev, B * row, sizeof(float));
    b->qabs = sl_carve(dev, B * nh * row, sizeof(float));
    b->olat = sl_carve(dev, B * nh * kv, sizeof(float));
    b->ov = sl_carve(dev, B * nh * dv, sizeof(float));
    /* a decode token needs no regrouping (T = 1 rows are their own head-major layout) */
    const size_t Bt = B > 1 ? B : 0;
    b->tin = sl_carve(dev, nh * Bt * SL_MAX(dn, kv), sizeof(float));
    b->tout = sl_carve(dev, nh * Bt * SL_MAX(kv, dv), sizeof(float));
    /* the session's current partition's layers (all of them, unsplit) */
    b->cache =
        sl_carve(dev, (size_t)(s->layer1 - s->layer0) * (size_t)s->max_ctx * row, sizeof(float));
    b->ys = sl_carve(host, nh, sizeof(float *));
    b->xs = sl_carve(host, nh, sizeof(float *));
    b->ws = sl_carve(host, nh, sizeof(sl_tensor));
    b->wp = sl_carve(host, nh, sizeof(sl_tensor *));
    b->Ts = sl_carve(host, nh, sizeof(int32_t));
}

/* ------------------------------------------------------------- compute */

/*
 * Per head h: y[h] = x[h] . W[h]^T, x[h] the rows of head h (k wide, at x + h * x_ld within each
 * token's row of x_stride), y[h] n wide likewise into y. One matmul_batch over the heads. A
 * decode token's rows are where they lie; a chunk's are first gathered head-major into tin
 * (T rows each) and the products scattered back from tout.
 */
static void per_head_matmul(const sl_session *s, float *y, size_t y_stride, size_t y_ld, int64_t n,
                            const float *x, size_t x_stride, size_t x_ld, int64_t k,
                            const sl_tensor *w, int64_t w_rows_per_head, int64_t w_row0,
                            int64_t w_head_stride, int32_t nh, int32_t T, const blk_mla_buf *b) {
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    float **ys = b->ys;
    const float **xs = b->xs;
    sl_tensor *ws = b->ws;
    const sl_tensor **wp = b->wp;
    int32_t *Ts = b->Ts;
    for (int32_t h = 0; h < nh; h++) {
        ws[h] = sl_tensor_rows(w, w_row0 + h * w_head_stride, w_rows_per_head);
        wp[h] = &ws[h];
        Ts[h] = T;
        if (T == 1) {
            xs[h] = x + (size_t)h * x_ld;
            ys[h] = y + (size_t)h * y_ld;
        } else {
            float *xin = b->tin + (size_t)h * (size_t)T * (size_t)k;
            op->copy2d(be, xin, (size_t)k, x + (size_t)h * x_ld, x_stride, T, (int32_t)k);
            xs[h] = xin;
            ys[h] = b->tout + (size_t)h * (size_t)T * (size_t)n;
        }
    }
    op->matmul_batch(be, ys, (const float *const *)xs, (const sl_tensor *const *)wp, Ts, nh);
    if (T == 1) return;
    for (int32_t h = 0; h < nh; h++)
        op->copy2d(be, y + (size_t)h * y_ld, y_stride, ys[h], (size_t)n, T, (int32_t)n);
}

void blk_mla(sl_session *s, int32_t l, int32_t T, const blk_mla_dims *d, const blk_mla_layer *L,
             const blk_mla_buf *b) {
    const sl_model *m = s->model;
    const sl_config *c = &m->cfg;
    const sl_backend *be = s->be;
    const sl_ops *op = be->ops;
    sl_session_buf *sb = &s->b;
    const int32_t nh = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim;
    const int32_t kv = d->kv_lora_rank, ql = d->q_lora_rank, row = kv + dr;
    const size_t qrow = (size_t)nh * (size_t)(dn + dr);

    /* the two projections of x: q's first (q_a_proj, or q_proj) and kv_a_proj_with_mqa */
    float *q1 = ql > 0 ? b->qa : b->qf;
    const sl_tensor *wq1 = ql > 0 ? &L->q_a : &L->q;
    if (!L->b_q_a.data && !L->b_kv_a.data) {
        float *y[2] = {q1, b->kva};
        const float *x[2] = {sb->xn, sb->xn};
        const sl_tensor *w[2] = {wq1, &L->kv_a};
        const int32_t Ts[2] = {T, T};
        op->matmul_batch(be, y, x, w, Ts, 2);
    } else {
        op->matmul(be, q1, sb->xn, wq1, L->b_q_a.data ? &L->b_q_a : NULL, T);
        op->matmul(be, b->kva, sb->xn, &L->kv_a, L->b_kv_a.data ? &L->b_kv_a : NULL, T);
    }
    if (ql > 0) {
        op->rmsnorm(be, b->qa, b->qa, &L->q_a_norm, T, ql, c->rms_norm_eps, m->norm_offset);
        op->matmul(be, b->qf, b->qa, &L->q_b, NULL, T);
    }
    /* the absorbed query: q_nope . W_UK per head, then the rope part beside it */
    per_head_matmul(s, b->qabs, (size_t)nh * (size_t)row, (size_t)row, kv, b->qf, qrow,
                    (size_t)(dn + dr), dn, &L->uk_t, kv, 0, kv, nh, T, b);
    op->copy2d(be, b->qabs + kv, (size_t)row, b->qf + dn, (size_t)(dn + dr), T * nh, dr);
    /* the latent cache is each sequence's (sl_session.fam): a call per row of a batch */
    const int32_t calls = blk_row_calls(s, T), Tc = T / calls;
    for (int32_t i = 0; i < calls; i++) {
        const sl_session *r = blk_row_session(s, i);
        const blk_mla_buf *rb = r->fam;
        const sl_latent_attn_args a = {
            .out = b->olat + (size_t)i * (size_t)nh * (size_t)kv,
            .q = b->qabs + (size_t)i * (size_t)nh * (size_t)row,
            .cache = rb->cache + (size_t)(l - r->layer0) * (size_t)r->max_ctx * (size_t)row,
            .kv = b->kva + (size_t)i * (size_t)row,
            .kv_norm = &L->kv_a_norm,
            .T = Tc,
            .pos0 = r->pos,
            .n_heads = nh,
            .kv_dim = kv,
            .rope_dim = dr,
            .interleaved = d->interleaved,
            .eps = c->rms_norm_eps,
            .w_offset = m->norm_offset,
            .scale = d->scale,
            .cos_tab = r->rope_cos,
            .sin_tab = r->rope_sin,
            .scratch = r->b.attn_scratch,
        };
        op->latent_attention(be, &a);
    }
    /* the values: W_UV per head on the latent outputs, then o_proj */
    per_head_matmul(s, b->ov, (size_t)nh * (size_t)dv, (size_t)dv, dv, b->olat,
                    (size_t)nh * (size_t)kv, (size_t)kv, kv, &L->kv_b, dv, dn, dn + dv, nh, T, b);
    op->matmul(be, sb->out, b->ov, &L->o, L->b_o.data ? &L->b_o : NULL, T);
}
