/*
 * RoPE's inverse frequencies and cos/sin tables for every scaling type config.json may give
 * (model/config.h sl_rope_scaling), in float32 as transformers 5.17 computes them
 * (modeling_rope_utils.py): the sessions' tables come from here, and a family with a table of
 * its own (another head size, another base) calls the same functions.
 */
#ifndef SL_ROPE_H
#define SL_ROPE_H

#include "model/config.h"

/* inv[i], i < dim / 2: the inverse frequency of dims (i, i + dim / 2) of a head rotating dim
 * dims with base theta, scaled as r says (NULL: the default type). */
void sl_rope_inv_freq(const sl_rope_scaling *r, double theta, int32_t dim, float *inv);

/* The tables of positions [0, n_pos): cos[p * half + i] = cos(p * inv[i]) * attention_factor,
 * sin likewise (half = dim / 2), host memory. */
void sl_rope_tables(const sl_rope_scaling *r, double theta, int32_t dim, int32_t n_pos, float *cos,
                    float *sin);

#endif /* SL_ROPE_H */
