/*
 * Multi-head latent attention on the CPU (sl_latent_attn_args, ops.h): the plain reference the
 * CUDA kernels are checked against. The prep writes the new tokens' latent rows and ropes the
 * queries; then each (token, head) item scores every cache row up to its position, takes the
 * softmax and sums the latents, in one thread, in key order.
 */
#include <math.h>
#include <omp.h>

#include "kernels/ops.h"

/* The prep: cache rows pos0 .. pos0 + T - 1 and the queries' positional parts. */
static void latent_prep(const sl_latent_attn_args *a) {
    const int32_t kvd = a->kv_dim, rd = a->rope_dim, half = rd / 2;
    const size_t row = (size_t)kvd + (size_t)rd;
    for (int32_t t = 0; t < a->T; t++) {
        const float *in = a->kv + (size_t)t * row;
        float *out = a->cache + (size_t)(a->pos0 + t) * row;
        const float *c = a->cos_tab + (size_t)(a->pos0 + t) * (size_t)half;
        const float *s = a->sin_tab + (size_t)(a->pos0 + t) * (size_t)half;
        /* RMS norm as the rmsnorm op computes it (torch's order) */
        float ss = 0;
        for (int32_t i = 0; i < kvd; i++)
            ss += in[i] * in[i];
        const float inv = 1.0f / sqrtf(ss / (float)kvd + a->eps);
        for (int32_t i = 0; i < kvd; i++) {
            float wi;
            sl_to_f32(&wi, a->kv_norm->data, a->kv_norm->dtype, (size_t)i, 1);
            out[i] = (in[i] * inv) * (a->w_offset + wi);
        }
        for (int32_t i = 0; i < rd; i++)
            out[kvd + i] = in[kvd + i];
        sl_rope_pairs(out + kvd, rd, a->interleaved, c, s);
        for (int32_t h = 0; h < a->n_heads; h++)
            sl_rope_pairs(a->q + ((size_t)t * (size_t)a->n_heads + (size_t)h) * row + kvd, rd,
                          a->interleaved, c, s);
    }
}

void sl_latent_attention_cpu(const sl_backend *be, const sl_latent_attn_args *a) {
    latent_prep(a);
    const int32_t kvd = a->kv_dim, rd = a->rope_dim, nh = a->n_heads;
    const size_t row = (size_t)kvd + (size_t)rd;
    const int32_t n_items = a->T * nh;
    const size_t ctx = (size_t)(a->pos0 + a->T);
    const int nth = n_items > 1 ? be->n_threads : 1;
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1)
    for (int32_t it = 0; it < n_items; it++) {
        const int32_t t = it / nh, h = it % nh, n_keys = a->pos0 + t + 1;
        float *sc = a->scratch + (size_t)omp_get_thread_num() * ctx;
        const float *q = a->q + ((size_t)t * (size_t)nh + (size_t)h) * row;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n_keys; j++) {
            const float *k = a->cache + (size_t)j * row;
            float s = 0;
            for (size_t d = 0; d < row; d++)
                s += q[d] * k[d];
            sc[j] = s * a->scale;
            mx = fmaxf(mx, sc[j]);
        }
        float sum = 0;
        for (int32_t j = 0; j < n_keys; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        const float inv = 1.0f / sum;
        float *o = a->out + ((size_t)t * (size_t)nh + (size_t)h) * (size_t)kvd;
        for (int32_t d = 0; d < kvd; d++)
            o[d] = 0;
        for (int32_t j = 0; j < n_keys; j++) {
            const float *v = a->cache + (size_t)j * row;
            const float p = sc[j] * inv;
            for (int32_t d = 0; d < kvd; d++)
                o[d] += p * v[d];
        }
    }
}
