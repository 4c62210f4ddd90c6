/*
 * The CPU backend: the reference every other backend is checked against.
 * Element-wise ops are plain loops the compiler vectorises; the heavy one,
 * matmul, lives in cpu_matmul.c with SIMD paths chosen at run time.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blocks.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/topk.h"

static void *cpu_alloc(const sl_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cpu_release(const sl_backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_copy(const sl_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static void cpu_to_host_end(const sl_backend *be) {
    (void)be; /* to_host_begin (cpu_copy) already copied */
}

static void cpu_sync(const sl_backend *be) {
    (void)be;
}

static void cpu_copy2d(const sl_backend *be, float *dst, size_t dst_ld, const float *src,
                       size_t src_ld, int32_t rows, int32_t cols) {
    (void)be;
    for (int32_t r = 0; r < rows; r++)
        memmove(dst + (size_t)r * dst_ld, src + (size_t)r * src_ld, (size_t)cols * sizeof(float));
}

static void cpu_copy_rows(const sl_backend *be, float *dst, const int32_t *dst_idx,
                          const float *src, const int32_t *src_idx, int32_t n, int32_t cols) {
    (void)be;
    for (int32_t i = 0; i < n; i++)
        memcpy(dst + (size_t)(dst_idx ? dst_idx[i] : i) * (size_t)cols,
               src + (size_t)(src_idx ? src_idx[i] : i) * (size_t)cols,
               (size_t)cols * sizeof(float));
}

static void cpu_fill(const sl_backend *be, float *dst, float v, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        dst[i] = v;
}

static void cpu_weighted_sum(const sl_backend *be, float *y, const float *x, const int32_t *rows,
                             const float *w, int32_t T, int32_t k, int32_t n) {
    (void)be;
    for (int32_t t = 0; t < T; t++) {
        float *yt = y + (size_t)t * (size_t)n;
        for (int32_t i = 0; i < n; i++)
            yt[i] = 0;
        for (int32_t r = 0; r < k; r++) {
            const size_t row = rows ? (size_t)rows[t * k + r] : (size_t)t * (size_t)k + (size_t)r;
            const float wr = w[t * k + r], *xr = x + row * (size_t)n;
            for (int32_t i = 0; i < n; i++)
                yt[i] += wr * xr[i];
        }
    }
}

static void cpu_clamp(const sl_backend *be, float *x, size_t n, float lo, float hi) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        x[i] = fminf(fmaxf(x[i], lo), hi);
}

static void cpu_scale_rows(const sl_backend *be, float *y, const float *x, const float *s,
                           int32_t rows, int32_t rep, int32_t n) {
    (void)be;
    for (int32_t i = 0; i < rows; i++) {
        const float *xr = x + (size_t)(i / rep) * (size_t)n;
        float *yr = y + (size_t)i * (size_t)n;
        for (int32_t c = 0; c < n; c++)
            yr[c] = s[i] * xr[c];
    }
}

static void cpu_moe_route(const sl_backend *be, const sl_route_args *a) {
    const int32_t E = (int32_t)a->router->shape[0], k = a->k;
    sl_matmul_cpu(be, a->logits, a->x, a->router, a->bias, a->T);
    for (int32_t t = 0; t < a->T; t++)
        sl_route_topk(a->logits + (size_t)t * (size_t)E, E, k, &a->cfg, a->select_bias,
                      a->expert_scale, a->ids + (size_t)t * (size_t)k,
                      a->w + (size_t)t * (size_t)k);
}

static void cpu_hc_inject(const sl_backend *be, float *w, const float *out, const float *inj,
                          int32_t T, int32_t hc, int32_t n) {
    (void)be;
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = 0; c < hc; c++) {
            float *wr = w + ((size_t)t * (size_t)hc + (size_t)c) * (size_t)n;
            const float s = inj[t * hc + c], *o = out + (size_t)t * (size_t)n;
            for (int32_t i = 0; i < n; i++)
                wr[i] += s * o[i];
        }
}

static void cpu_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                      int32_t T) {
    const int64_t n = table->shape[1];
    if (sl_tensor_is_fp8(table)) {
        for (int32_t t = 0; t < T; t++)
            sl_dequant_fp8_row(table, ids[t], y + (size_t)t * (size_t)n);
        return;
    }
    if (sl_dtype_is_block(table->dtype)) {
        const size_t rb = sl_row_bytes(table->dtype, n);
        for (int32_t t = 0; t < T; t++)
            sl_dequant_row_isa(be->isa, table->dtype,
                               (const uint8_t *)table->data + (size_t)ids[t] * rb,
                               y + (size_t)t * (size_t)n, n);
        return;
    }
    if (sl_dtype_is_quant(table->dtype)) {
        for (int32_t t = 0; t < T; t++)
            sl_dequantize_row(table, ids[t], y + (size_t)t * (size_t)n);
        return;
    }
    for (int32_t t = 0; t < T; t++)
        sl_to_f32(y + (size_t)t * (size_t)n, table->data, table->dtype, (size_t)ids[t] * (size_t)n,
                  (size_t)n);
}

/* 1 / sqrt(mean(x^2) + eps) of one row, in float32 as torch computes it. */
static float rms_inv(const float *x, int32_t n, float eps) {
    float ss = 0;
    for (int32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* Matches torch: variance in float32, x * rsqrt(var + eps), then times the weight. */
static void cpu_rmsnorm(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                        int32_t rows, int32_t n, float eps, float w_offset) {
    (void)be;
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        float *yr = y + (size_t)r * (size_t)n;
        const float inv = rms_inv(xr, n, eps);
        for (int32_t i = 0; i < n; i++) {
            float wi;
            sl_to_f32(&wi, w->data, w->dtype, (size_t)i, 1);
            yr[i] = (xr[i] * inv) * (w_offset + wi);
        }
    }
}

/* One RoPE rotation of n = rot / 2 pairs of v by the cos/sin rows c, s: pairs (i, i + n), or
 * (2i, 2i + 1) when interleaved. The products are those of transformers' rotate_half and
 * de-interleaved forms, term for term. */
void sl_rope_pairs(float *v, int32_t rot, int interleaved, const float *c, const float *s) {
    const int32_t n = rot / 2;
    for (int32_t i = 0; i < n; i++) {
        float *pa = interleaved ? v + 2 * i : v + i;
        float *pb = interleaved ? v + 2 * i + 1 : v + i + n;
        const float a = *pa, b = *pb;
        *pa = a * c[i] - b * s[i];
        *pb = b * c[i] + a * s[i];
    }
}

/* RoPE of T rows of n_heads heads at positions pos0 ..; NeoX or interleaved pairs. */
static void rope_rows(float *x, int32_t T, int32_t n_heads, int32_t head_dim, int32_t rot_dim,
                      int interleaved, int32_t pos0, const float *cos_tab, const float *sin_tab) {
    const int32_t half = rot_dim / 2;
    for (int32_t t = 0; t < T; t++) {
        const float *c = cos_tab + (size_t)(pos0 + t) * (size_t)half;
        const float *s = sin_tab + (size_t)(pos0 + t) * (size_t)half;
        for (int32_t h = 0; h < n_heads; h++)
            sl_rope_pairs(x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim, rot_dim,
                          interleaved, c, s);
    }
}

static void cpu_rope(const sl_backend *be, float *x, int32_t T, int32_t n_heads, int32_t head_dim,
                     int32_t rot_dim, int32_t pos0, const float *cos_tab, const float *sin_tab) {
    (void)be;
    rope_rows(x, T, n_heads, head_dim, rot_dim, 0, pos0, cos_tab, sin_tab);
}

/* The temperature of a query at position p (sl_qkv_args), in float32 as transformers has it. */
static float attn_temp(int32_t p, float floor_scale, float scale) {
    return log1pf(floorf(((float)p + 1.0f) / floor_scale)) * scale + 1.0f;
}

static void cpu_qkv_prep(const sl_backend *be, const sl_qkv_args *a) {
    const int32_t hd = a->head_dim;
    const size_t kv_row = (size_t)a->n_kv_heads * (size_t)hd;
    if (a->q_norm)
        cpu_rmsnorm(be, a->q, a->q, a->q_norm, a->T * a->n_heads, hd, a->eps, a->w_offset);
    if (a->k_norm)
        cpu_rmsnorm(be, a->k, a->k, a->k_norm, a->T * a->n_kv_heads, hd, a->eps, a->w_offset);
    rope_rows(a->q, a->T, a->n_heads, hd, a->rot_dim, a->rope_interleaved, a->pos0, a->cos_tab,
              a->sin_tab);
    rope_rows(a->k, a->T, a->n_kv_heads, hd, a->rot_dim, a->rope_interleaved, a->pos0, a->cos_tab,
              a->sin_tab);
    if (a->temp_floor > 0)
        for (int32_t t = 0; t < a->T; t++) {
            const float f = attn_temp(a->pos0 + t, a->temp_floor, a->temp_scale);
            float *q = a->q + (size_t)t * (size_t)a->n_heads * (size_t)hd;
            for (size_t i = 0; i < (size_t)a->n_heads * (size_t)hd; i++)
                q[i] *= f;
        }
    for (int32_t t = 0; t < a->T; t++) {
        memcpy(a->kc + (size_t)(a->pos0 + t) * kv_row, a->k + (size_t)t * kv_row,
               kv_row * sizeof(float));
        memcpy(a->vc + (size_t)(a->pos0 + t) * kv_row, a->v + (size_t)t * kv_row,
               kv_row * sizeof(float));
    }
}

/* Attention's inner loops in 16 independent lanes (GCC's vector extension: 16 floats, which
 * the compiler lowers to whatever the ISA has: four SSE, two AVX2 or one AVX-512 vector; no
 * contraction into FMAs under -std=c11), so every ISA computes the same bits. The compiler
 * left both loops scalar (a reduction it may not reorder, a store it feared aliased): attention
 * was 23% of a decode step's compute at Qwen3-30B-A3B shapes. */
typedef float lanes16 __attribute__((vector_size(64)));

/* q . k over n dims: element d into lane d % 16, the lanes then summed pairwise. */
static inline __attribute__((always_inline)) float dot_lanes(const float *q, const float *k,
                                                             int32_t n) {
    lanes16 v = {0};
    int32_t d = 0;
    for (; d + 16 <= n; d += 16) {
        lanes16 x, y;
        memcpy(&x, q + d, sizeof x), memcpy(&y, k + d, sizeof y);
        v += x * y;
    }
    float acc[16];
    memcpy(acc, &v, sizeof acc);
    for (int l = 0; d < n; d++, l++)
        acc[l] += q[d] * k[d];
    for (int w = 8; w > 0; w >>= 1)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* o[d] += p v[d] for d < n (o and v do not overlap): each element's product and sum as the
 * plain loop has them. */
static inline __attribute__((always_inline)) void axpy_lanes(float *restrict o, float p,
                                                             const float *restrict v, int32_t n) {
    int32_t d = 0;
    for (; d + 16 <= n; d += 16) {
        lanes16 x, y;
        memcpy(&x, o + d, sizeof x), memcpy(&y, v + d, sizeof y);
        x += p * y;
        memcpy(o + d, &x, sizeof x);
    }
    for (; d < n; d++)
        o[d] += p * v[d];
}

/* Item it = (t, h) of cpu_attention, its scores in sc. */
static inline __attribute__((always_inline)) void attn_item(const sl_attn_args *a, int32_t it,
                                                            float *sc) {
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const size_t q_stride = (size_t)a->n_heads * (size_t)hd;
    const size_t kv_stride = (size_t)a->n_kv_heads * (size_t)hd;
    const int32_t t = it / a->n_heads, h = it % a->n_heads, kvh = h / group;
    const int32_t *sel = a->sel ? a->sel + (size_t)t * (size_t)a->sel_stride : NULL;
    const int32_t p = a->pos0 + t;
    int32_t first = a->window > 0 ? SL_MAX(0, p - a->window + 1) : 0;
    if (a->chunk > 0) first = SL_MAX(first, p - p % a->chunk);
    const int32_t n_keys = sel ? a->n_sel[t] : p + 1 - first;
    const float *q = a->q + (size_t)t * q_stride + (size_t)h * (size_t)hd;
    float mx = -INFINITY;
    for (int32_t j = 0; j < n_keys; j++) {
        const size_t row = (size_t)(sel ? sel[j] : first + j);
        const float *k = a->kcache + row * kv_stride + (size_t)kvh * (size_t)hd;
        sc[j] = dot_lanes(q, k, hd) * a->scale;
        mx = fmaxf(mx, sc[j]);
    }
    float sink = -INFINITY;
    if (a->sinks) {
        sl_to_f32(&sink, a->sinks->data, a->sinks->dtype, (size_t)h, 1);
        mx = fmaxf(mx, sink);
    }
    float sum = 0;
    for (int32_t j = 0; j < n_keys; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    if (a->sinks) sum += expf(sink - mx);
    const float inv = 1.0f / sum;
    float *o = a->out + (size_t)t * q_stride + (size_t)h * (size_t)hd;
    for (int32_t d = 0; d < hd; d++)
        o[d] = 0;
    for (int32_t j = 0; j < n_keys; j++) {
        const size_t row = (size_t)(sel ? sel[j] : first + j);
        const float *v = a->vcache + row * kv_stride + (size_t)kvh * (size_t)hd;
        axpy_lanes(o, sc[j] * inv, v, hd);
    }
}

/* The item compiled for each ISA (the lanes become its widest vectors). */
SL_AVX512_ATTR static void attn_item_avx512(const sl_attn_args *a, int32_t it, float *sc) {
    attn_item(a, it, sc);
}
SL_AVX2_ATTR static void attn_item_avx2(const sl_attn_args *a, int32_t it, float *sc) {
    attn_item(a, it, sc);
}
static void attn_item_plain(const sl_attn_args *a, int32_t it, float *sc) {
    attn_item(a, it, sc);
}

/* Causal attention: query t (position p = pos0 + t) sees cache rows 0 .. p (the last window of
 * them with a sliding window, those of its own chunk, p - p % chunk .., with chunked attention),
 * or only the rows listed in sel[t] (ascending) when a selection is given; a head's sink logit
 * joins the softmax's denominator. */
static void cpu_attention(const sl_backend *be, const sl_attn_args *a) {
    if (a->prep) cpu_qkv_prep(be, a->prep);
    SL_ASSERT(!a->sel || a->window == 0);
    const int32_t n_items = a->T * a->n_heads;
    const size_t ctx = (size_t)(a->pos0 + a->T);
    void (*item)(const sl_attn_args *, int32_t, float *) =
        be->isa == SL_ISA_AVX512 ? attn_item_avx512
        : be->isa == SL_ISA_AVX2 ? attn_item_avx2
                                 : attn_item_plain;
    int nth = n_items > 1 ? be->n_threads : 1;
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1)
    for (int32_t it = 0; it < n_items; it++)
        item(a, it, a->scratch + (size_t)omp_get_thread_num() * ctx);
}

static void cpu_swiglu(const sl_backend *be, float *out, const float *gate, const float *up,
                       size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* act(v) of activate and act_mul, in float32 as PyTorch's CPU kernels spell it (GELU-tanh:
 * 0.5 x (1 + tanh(kBeta (x + kKappa x^3))), x^3 as x * x * x). */
static float act_of(float v, sl_act act) {
    switch (act) {
    case SL_ACT_NONE: return v;
    case SL_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case SL_ACT_GELU_TANH: {
        const float beta = 0.7978845608028654f, kappa = 0.044715f;
        return 0.5f * v * (1.0f + tanhf(beta * (v + kappa * (v * v * v))));
    }
    case SL_ACT_TANH: return tanhf(v);
    default: return v / (1.0f + expf(-v)); /* SL_ACT_SILU */
    }
}

static void cpu_act_mul(const sl_backend *be, float *out, const float *gate, const float *up,
                        size_t n, sl_act act) {
    if (act == SL_ACT_SILU) { /* swiglu's own expression, so the same bits */
        cpu_swiglu(be, out, gate, up, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = act_of(gate[i], act) * up[i];
}

static void cpu_swiglu_clamped(const sl_backend *be, float *out, const float *gate, const float *up,
                               size_t n, float alpha, float limit) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
        const float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
        out[i] = (u + 1.0f) * glu;
    }
}

static void cpu_add_bias(const sl_backend *be, float *y, const sl_tensor *b, int32_t rows) {
    (void)be;
    const size_t n = (size_t)b->shape[0];
    for (size_t i = 0; i < n; i++) {
        float bi;
        sl_to_f32(&bi, b->data, b->dtype, i, 1);
        for (int32_t r = 0; r < rows; r++)
            y[(size_t)r * n + i] += bi;
    }
}

/* The row slice [r0, r0 + n) of a matrix: the same rows, so the same dot products. */
static sl_tensor row_slice(const sl_tensor *w, int64_t r0, int64_t n) {
    if (sl_tensor_is_fp8(w)) return sl_fp8_rows(w, r0, n);
    const size_t rb = sl_row_bytes(w->dtype, w->shape[1]);
    sl_tensor v = *w;
    v.shape[0] = n;
    v.nbytes = (size_t)n * rb;
    v.data = (const uint8_t *)w->data + (size_t)r0 * rb;
    if (v.scales) {
        const size_t sb = sl_tensor_qscale_bytes(w, r0);
        v.scales = (const uint8_t *)w->scales + sb;
        v.biases = (const uint8_t *)w->biases + sb;
    }
    return v;
}

/* The reference of the fused expert path (SL_BACKEND_CPU_DEVICE runs it on its expert cache):
 * per row the T = 1 matmuls matmul_batch runs, swiglu's formula and weighted_sum's order. The
 * up and down projections go through a stack buffer a slice of rows at a time. */
static int cpu_moe_experts(const sl_backend *be, float *y, float *act, const float *x,
                           const int32_t *ids, const float *wt, const sl_expert_ptrs *table,
                           const sl_tensor *const proto[3], int32_t T, int32_t k) {
    enum { SLICE = 256 };
    const int64_t I = proto[0]->shape[0], H = proto[0]->shape[1];
    float buf[SLICE];
    for (int32_t t = 0; t < T; t++) {
        int32_t have = 1; /* every pick in the table, else the token is skipped */
        for (int32_t r = 0; r < k; r++)
            have &= table[ids[t * k + r]].p[0] != NULL;
        if (!have) continue;
        float *yt = y + (size_t)t * (size_t)H;
        for (int64_t h = 0; h < H; h++)
            yt[h] = 0;
        for (int32_t r = 0; r < k; r++) {
            const int32_t i = t * k + r;
            sl_tensor w[3];
            for (int j = 0; j < 3; j++) {
                w[j] = *proto[j];
                w[j].data = table[ids[i]].p[3 * j];
                w[j].scales = table[ids[i]].p[3 * j + 1];
                w[j].biases = table[ids[i]].p[3 * j + 2];
            }
            float *g = act + (size_t)i * (size_t)I;
            const float *xt = x + (size_t)t * (size_t)H;
            sl_matmul_cpu(be, g, xt, &w[0], NULL, 1);
            for (int64_t r0 = 0; r0 < I; r0 += SLICE) {
                const sl_tensor up = row_slice(&w[1], r0, SL_MIN(SLICE, I - r0));
                sl_matmul_cpu(be, buf, xt, &up, NULL, 1);
                for (int64_t j = 0; j < up.shape[0]; j++)
                    g[r0 + j] = g[r0 + j] / (1.0f + expf(-g[r0 + j])) * buf[j];
            }
            for (int64_t r0 = 0; r0 < H; r0 += SLICE) {
                const sl_tensor down = row_slice(&w[2], r0, SL_MIN(SLICE, H - r0));
                sl_matmul_cpu(be, buf, g, &down, NULL, 1);
                for (int64_t j = 0; j < down.shape[0]; j++)
                    yt[r0 + j] += wt[i] * buf[j];
            }
        }
    }
    return 1;
}

static void cpu_axpy(const sl_backend *be, float *y, float s, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] += s * x[i];
}

static void cpu_add_rmsnorm(const sl_backend *be, float *y, float *x, const float *d,
                            const sl_tensor *w, int32_t rows, int32_t n, float eps,
                            float w_offset) {
    cpu_axpy(be, x, 1.0f, d, (size_t)rows * (size_t)n);
    cpu_rmsnorm(be, y, x, w, rows, n, eps, w_offset);
}

static void cpu_sigmoid_mul(const sl_backend *be, float *y, const float *gate, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

static void cpu_l2norm(const sl_backend *be, float *x, int32_t rows, int32_t n, float eps) {
    (void)be;
    for (int32_t r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * (size_t)n;
        float ss = 0;
        for (int32_t i = 0; i < n; i++)
            ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss + eps);
        for (int32_t i = 0; i < n; i++)
            xr[i] *= inv;
    }
}

static void cpu_conv1d_silu(const sl_backend *be, float *y, const float *x, int32_t T, int32_t C,
                            const sl_tensor *w, int32_t K, int32_t dil, float *state) {
    (void)be;
    float wk[64];
    const int32_t S = (K - 1) * dil; /* state: the last S inputs, oldest first */
    for (int32_t c = 0; c < C; c++) {
        sl_to_f32(wk, w->data, w->dtype, (size_t)c * (size_t)K, (size_t)K);
        float *st = state + (size_t)c * (size_t)S;
        for (int32_t t = 0; t < T; t++) {
            const float xt = x[(size_t)t * (size_t)C + (size_t)c];
            float acc = 0;
            for (int32_t j = 0; j < K - 1; j++)
                acc += wk[j] * st[S - (K - 1 - j) * dil];
            acc += wk[K - 1] * xt;
            y[(size_t)t * (size_t)C + (size_t)c] = acc / (1.0f + expf(-acc));
            for (int32_t j = 0; j + 1 < S; j++)
                st[j] = st[j + 1];
            if (S > 0) st[S - 1] = xt;
        }
    }
}

/* Heads are independent, so they split across threads without changing any sum. */
static void cpu_delta_rule(const sl_backend *be, const sl_delta_args *a) {
    const int32_t r = a->nv / a->nk, dk = a->dk, dv = a->dv;
    const size_t qk_row = (size_t)a->nk * (size_t)dk, v_row = (size_t)a->nv * (size_t)dv;
    const int nth = a->nv > 1 ? be->n_threads : 1;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int32_t h = 0; h < a->nv; h++) {
        float A_log, dt_bias, kv[1024];
        sl_to_f32(&A_log, a->A_log->data, a->A_log->dtype, (size_t)h, 1);
        sl_to_f32(&dt_bias, a->dt_bias->data, a->dt_bias->dtype, (size_t)h, 1);
        float *S = a->state + (size_t)h * (size_t)dk * (size_t)dv;
        const int32_t kh = a->v_tiled ? h % a->nk : h / r;
        const float A = a->A_neg_exp ? A_log : -expf(A_log);
        for (int32_t t = 0; t < a->T; t++) {
            const float *q = a->q + (size_t)t * qk_row + (size_t)kh * (size_t)dk;
            const float *k = a->k + (size_t)t * qk_row + (size_t)kh * (size_t)dk;
            const float *v = a->v + (size_t)t * v_row + (size_t)h * (size_t)dv;
            float *o = a->out + (size_t)t * v_row + (size_t)h * (size_t)dv;
            const float x = a->a[(size_t)t * (size_t)a->nv + (size_t)h] + dt_bias;
            const float softplus = x > 20.0f ? x : log1pf(expf(x));
            const float decay = expf(A * softplus);
            const float beta = 1.0f / (1.0f + expf(-a->b[(size_t)t * (size_t)a->nv + (size_t)h]));
            for (int32_t j = 0; j < dv; j++)
                kv[j] = 0;
            for (int32_t i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * (size_t)dv;
                for (int32_t j = 0; j < dv; j++) {
                    Si[j] *= decay;
                    kv[j] += Si[j] * k[i];
                }
            }
            for (int32_t j = 0; j < dv; j++)
                kv[j] = (v[j] - kv[j]) * beta;
            for (int32_t j = 0; j < dv; j++)
                o[j] = 0;
            for (int32_t i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * (size_t)dv;
                const float qi = q[i] * a->q_scale;
                for (int32_t j = 0; j < dv; j++) {
                    Si[j] += k[i] * kv[j];
                    o[j] += Si[j] * qi;
                }
            }
        }
    }
}

static void cpu_gated_rmsnorm(const sl_backend *be, float *y, const float *x, const float *z,
                              const sl_tensor *w, int32_t rows, int32_t n, float eps, sl_act gate) {
    (void)be;
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)n, *zr = z + (size_t)r * (size_t)n;
        float *yr = y + (size_t)r * (size_t)n;
        const float inv = rms_inv(xr, n, eps);
        for (int32_t i = 0; i < n; i++) {
            float wi;
            sl_to_f32(&wi, w->data, w->dtype, (size_t)i, 1);
            const float sg = 1.0f / (1.0f + expf(-zr[i]));
            yr[i] = wi * (xr[i] * inv) * (gate == SL_ACT_SIGMOID ? sg : zr[i] * sg);
        }
    }
}

static void cpu_activate(const sl_backend *be, float *y, const float *x, size_t n, float div,
                         float mul, sl_act act) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        const float v = x[i] / div;
        if (act == SL_ACT_NONE) {
            y[i] = mul * v;
            continue;
        }
        if (act == SL_ACT_GELU_TANH || act == SL_ACT_TANH) {
            y[i] = mul * act_of(v, act);
            continue;
        }
        const float sg = 1.0f / (1.0f + expf(-v));
        y[i] = mul * (act == SL_ACT_SIGMOID ? sg : v * sg);
    }
}

static void cpu_hc_mix(const sl_backend *be, float *y, const float *w, const float *x, int32_t T,
                       int32_t hc, int32_t n) {
    (void)be;
    for (int32_t t = 0; t < T; t++) {
        const float *wt = w + (size_t)t * (size_t)hc * (size_t)n;
        const float *xt = x + (size_t)t * (size_t)hc * (size_t)n;
        for (int32_t i = 0; i < n; i++) {
            float acc = 0;
            for (int32_t c = 0; c < hc; c++)
                acc +=
                    wt[(size_t)c * (size_t)n + (size_t)i] * xt[(size_t)c * (size_t)n + (size_t)i];
            y[(size_t)t * (size_t)n + (size_t)i] = acc / (float)hc;
        }
    }
}

static void cpu_ple_gate(const sl_backend *be, float *y, const float *key, const float *query,
                         const float *value, int32_t T, int32_t hc, int32_t n) {
    (void)be;
    const float sq = (float)sqrt((double)n);
    for (int32_t r = 0; r < T * hc; r++) {
        const float *k = key + (size_t)r * (size_t)n, *q = query + (size_t)r * (size_t)n;
        float g = 0;
        for (int32_t i = 0; i < n; i++)
            g += k[i] * q[i];
        g /= sq;
        g = sqrtf(fmaxf(fabsf(g), 1e-6f)) * (float)((g > 0) - (g < 0));
        const float sg = 1.0f / (1.0f + expf(-g));
        const float *v = value + (size_t)(r / hc) * (size_t)n;
        float *yr = y + (size_t)r * (size_t)n;
        for (int32_t i = 0; i < n; i++)
            yr[i] = sg * v[i];
    }
}

static void cpu_qsa_scores(const sl_backend *be, float *scores, const float *q, const float *keys,
                           int32_t n_heads, int32_t n_blocks, int32_t d) {
    (void)be;
    const float sq = (float)sqrt((double)d);
    for (int32_t b = 0; b < n_blocks; b++) {
        const float *k = keys + (size_t)b * (size_t)d;
        float acc = 0;
        for (int32_t h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)h * (size_t)d;
            float s = 0;
            for (int32_t i = 0; i < d; i++)
                s += qh[i] * k[i];
            acc += fmaxf(s, 0.0f);
        }
        scores[b] = acc / sq;
    }
}

static const sl_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_host = cpu_copy,
    .to_dev = cpu_copy,
    .to_host_begin = cpu_copy,
    .to_host_end = cpu_to_host_end,
    .to_dev_async = cpu_copy,
    .sync = cpu_sync,
    .copy2d = cpu_copy2d,
    .copy_rows = cpu_copy_rows,
    .fill = cpu_fill,
    .weighted_sum = cpu_weighted_sum,
    .moe_route = cpu_moe_route,
    .add_rmsnorm = cpu_add_rmsnorm,
    .qkv_prep = cpu_qkv_prep,
    .moe_experts = cpu_moe_experts,
    .scale_rows = cpu_scale_rows,
    .clamp = cpu_clamp,
    .hc_inject = cpu_hc_inject,
    .matmul = sl_matmul_cpu,
    .matmul_batch = sl_matmul_batch_cpu,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .latent_attention = sl_latent_attention_cpu,
    .swiglu = cpu_swiglu,
    .act_mul = cpu_act_mul,
    .swiglu_clamped = cpu_swiglu_clamped,
    .add_bias = cpu_add_bias,
    .axpy = cpu_axpy,
    .sigmoid_mul = cpu_sigmoid_mul,
    .l2norm = cpu_l2norm,
    .conv1d_silu = cpu_conv1d_silu,
    .delta_rule = cpu_delta_rule,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .activate = cpu_activate,
    .hc_mix = cpu_hc_mix,
    .ple_gate = cpu_ple_gate,
    .qsa_scores = cpu_qsa_scores,
};

sl_isa sl_cpu_best_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
        return SL_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return SL_ISA_AVX2;
    return SL_ISA_SCALAR;
}

const char *sl_isa_name(sl_isa isa) {
    static const char *names[] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa <= SL_ISA_AVX512 ? names[isa] : "?";
}

void sl_backend_cpu_init(sl_backend *be, int32_t n_threads, sl_isa isa) {
    be->ops = &cpu_ops;
    be->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    be->int4_float_act = 0;
    sl_isa best = sl_cpu_best_isa();
    be->isa = isa > best ? best : isa;
}

/* ------------------------------------------------------- finite check */

/*
 * A float is Inf or NaN exactly when its 8 exponent bits are all set, so the test works on the
 * bits (integer ops: no float compare for -ffast-math to fold away, no denormal stalls). The
 * SIMD paths only find the first block of 64 that holds one; the scalar loop, the reference,
 * finds the element from there. Whatever the ISA, the answer is the same.
 */
#define NF_EXP   0x7f800000u
#define NF_BLOCK 64

SL_AVX2_ATTR static size_t nonfinite_block_avx2(const float *x, size_t n) {
    const __m256i e = _mm256_set1_epi32((int)NF_EXP);
    size_t i = 0;
    for (; i + NF_BLOCK <= n; i += NF_BLOCK) {
        __m256i a[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) { /* 4 chains, so the loads are not waiting on one OR */
            const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * j));
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x + i + 8 * j + 32));
            a[j] = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, e), e),
                                   _mm256_cmpeq_epi32(_mm256_and_si256(v, e), e));
        }
        const __m256i any =
            _mm256_or_si256(_mm256_or_si256(a[0], a[1]), _mm256_or_si256(a[2], a[3]));
        if (!_mm256_testz_si256(any, any)) break;
    }
    return i;
}

SL_AVX512_ATTR static size_t nonfinite_block_avx512(const float *x, size_t n) {
    const __m512i e = _mm512_set1_epi32((int)NF_EXP);
    size_t i = 0;
    for (; i + NF_BLOCK <= n; i += NF_BLOCK) {
        __mmask16 k = 0;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            k |= _mm512_cmpeq_epi32_mask(
                _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i + 16 * j)), e), e);
        if (k) break;
    }
    return i;
}

size_t sl_first_nonfinite(sl_isa isa, const float *x, size_t n) {
    size_t i = isa >= SL_ISA_AVX512 ? nonfinite_block_avx512(x, n)
               : isa == SL_ISA_AVX2 ? nonfinite_block_avx2(x, n)
                                    : 0;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        if ((u & NF_EXP) == NF_EXP) return i;
    }
    return n;
}
