/* RoPE tables (contracts in rope.h). Every step is the float32 operation torch performs, in
 * its order, so that the tables are transformers' to the bit where libm agrees. */
#include "model/rope.h"

#include <math.h>

/* The dim of a head (of `dim` rotated) that turns n times over `len` positions: YaRN's
 * find_correction_dim. */
static double yarn_dim(double n, int32_t dim, double theta, double len) {
    return (double)dim * log(len / (n * 2 * M_PI)) / (2 * log(theta));
}

void sl_rope_inv_freq(const sl_rope_scaling *r, double theta, int32_t dim, float *inv) {
    const int32_t half = dim / 2;
    const int yarn = r && r->type == SL_ROPE_YARN;
    /* YaRN's ramp between the dims that turn beta_fast and beta_slow times over the original
     * context: below low the frequencies are kept (extrapolation), above high divided by
     * factor (interpolation), linear in between */
    double low = 0, high = 1;
    if (yarn) {
        low = yarn_dim(r->beta_fast, dim, theta, r->original_max_position);
        high = yarn_dim(r->beta_slow, dim, theta, r->original_max_position);
        if (r->truncate) low = floor(low), high = ceil(high);
        low = fmax(low, 0), high = fmin(high, dim - 1);
        if (low == high) high += 0.001; /* linear_ramp_factor's guard */
    }
    for (int32_t i = 0; i < half; i++) {
        /* base ** (arange(0, dim, 2).float() / dim): a float32 power */
        const float pos_freq = powf((float)theta, (float)(2 * i) / (float)dim);
        if (!yarn) {
            inv[i] = 1.0f / pos_freq;
            continue;
        }
        const float extra = 1.0f / pos_freq, inter = 1.0f / ((float)r->factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        const float keep = 1.0f - ramp; /* inv_freq_extrapolation_factor */
        inv[i] = inter * (1.0f - keep) + extra * keep;
    }
}

void sl_rope_tables(const sl_rope_scaling *r, double theta, int32_t dim, int32_t n_pos, float *cos,
                    float *sin) {
    const int32_t half = dim / 2;
    const float af = r && r->type != SL_ROPE_DEFAULT ? (float)r->attention_factor : 1.0f;
    float inv[half > 0 ? half : 1];
    sl_rope_inv_freq(r, theta, dim, inv);
    for (int32_t i = 0; i < half; i++)
        for (int32_t p = 0; p < n_pos; p++) {
            const float ang = (float)p * inv[i];
            cos[(size_t)p * (size_t)half + (size_t)i] = cosf(ang) * af;
            sin[(size_t)p * (size_t)half + (size_t)i] = sinf(ang) * af;
        }
}
