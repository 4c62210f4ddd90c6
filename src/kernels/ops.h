/*
 * The backend boundary. Families and blocks compute only through these
 * operations, so a second backend (CUDA) implements this table, not the
 * families. Activations are float32 row-major buffers owned by the session;
 * weights are sl_tensor views (F32/F16/BF16, widened to float32 on the fly).
 *
 * Matrix convention is PyTorch's nn.Linear: W is [N, K] (out x in) and
 * y[t][n] = sum_k x[t][k] * W[n][k] (+ b[n]).
 */
#ifndef SL_OPS_H
#define SL_OPS_H

#include "core/common.h"
#include "format/tensor.h"

typedef enum sl_isa {
    SL_ISA_SCALAR = 0, /* plain C: the reference every SIMD path is tested against */
    SL_ISA_AVX2 = 1,
    SL_ISA_AVX512 = 2,
} sl_isa;

typedef struct sl_backend sl_backend;

/* Attention over a KV cache of one layer. Cache rows are [n_kv_heads * head_dim]. */
typedef struct sl_attn_args {
    float *out;          /* [T, n_heads * head_dim] */
    const float *q;      /* [T, n_heads * head_dim], already normed and roped */
    const float *kcache; /* [ctx, n_kv_heads * head_dim], rows 0 .. pos0+T-1 valid */
    const float *vcache;
    int32_t T, pos0;
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;    /* usually 1/sqrt(head_dim) */
    float *scratch; /* n_threads x (pos0 + T) floats */
} sl_attn_args;

typedef struct sl_ops {
    const char *name;
    void (*matmul)(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
    /* Copies rows ids[t] of a [V, n] table into y[t]. ids are already validated. */
    void (*embed)(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T);
    /* y = x * rsqrt(mean(x^2) + eps) * (w_offset + w), per row of n; y may alias x. */
    void (*rmsnorm)(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                    int32_t rows, int32_t n, float eps, float w_offset);
    /* NeoX RoPE on the first rot_dim dims of each head; row t is at position pos0 + t.
     * cos/sin tables are [positions, rot_dim / 2]. */
    void (*rope)(const sl_backend *be, float *x, int32_t T, int32_t n_heads, int32_t head_dim,
                 int32_t rot_dim, int32_t pos0, const float *cos_tab, const float *sin_tab);
    void (*attention)(const sl_backend *be, const sl_attn_args *a);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(const sl_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* y[i] += s * x[i] */
    void (*axpy)(const sl_backend *be, float *y, float s, const float *x, size_t n);
} sl_ops;

struct sl_backend {
    const sl_ops *ops;
    int32_t n_threads;
    sl_isa isa;
};

/* The CPU backend; isa is clamped to what the processor supports. */
void sl_backend_cpu_init(sl_backend *be, int32_t n_threads, sl_isa isa);
/* The best ISA this processor runs. */
sl_isa sl_cpu_best_isa(void);
const char *sl_isa_name(sl_isa isa);

/* Row-wise matmul kernels, also used directly by tests (cpu_matmul.c). */
void sl_matmul_cpu(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T);
/* One element in float32 with the reference order, for tests. */
float sl_dot_ref(const sl_tensor *w, int64_t row, const float *x);
/* Widens n elements of a F32/F16/BF16 array starting at element i0. */
void sl_to_f32(float *dst, const void *src, sl_dtype dtype, size_t i0, size_t n);

#endif /* SL_OPS_H */
