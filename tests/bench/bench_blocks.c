/*
 * CPU matmul speed over ggml's block types (make bench): a decode-like GEMV, y[T, N] = x[T, K] .
 * W^T, per weight type and ISA, against sluice's own BF16, Q8 and Q4 paths. Prints the time of
 * one call and the weight bytes it streams per second. "cold" cycles through copies of W that
 * together exceed the last-level cache (the weights come from DRAM, as in decode); "hot" repeats
 * one W (the kernel's own throughput). Each figure is the fastest call of a quarter second (the
 * machine may be shared). Block types run their float path and, where the backend has one, their
 * int8 path (blocks.h). Correctness is the unit tests'; this only measures.
 *
 *   bench_blocks [N K T threads [types]]   (default 1536 2048 1 2; types: a comma list,
 * "Q4_K,BF16")
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/blocks.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

#define COLD_BYTES ((size_t)256 << 20) /* copies of W up to this many bytes */
#define BUDGET_S   0.25                /* seconds per measurement (at least 3 calls) */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct mat {
    sl_tensor t;
    uint8_t *data;
    uint16_t *sc, *bi;
} mat;

static void mat_make(mat *m, sl_dtype dt, int64_t N, int64_t K) {
    const size_t rb = sl_row_bytes(dt, K), G = (size_t)sl_qgroups(K);
    m->data = malloc(rb * (size_t)N);
    m->sc = m->bi = NULL;
    if (sl_dtype_is_quant(dt)) {
        m->sc = malloc(G * (size_t)N * 2);
        m->bi = malloc(G * (size_t)N * 2);
    }
    float *row = malloc((size_t)K * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++)
            row[k] = frand() * 0.05f;
        uint8_t *d = m->data + (size_t)n * rb;
        if (sl_dtype_is_block(dt))
            sl_quant_row_simple(dt, row, d, K);
        else if (sl_dtype_is_quant(dt))
            sl_quantize_row(dt, row, K, d, m->sc + (size_t)n * G, m->bi + (size_t)n * G);
        else
            for (int64_t k = 0; k < K; k++)
                ((uint16_t *)d)[k] = sl_f32_to_bf16(row[k]);
    }
    free(row);
    m->t = (sl_tensor){.name = "w",
                       .dtype = dt,
                       .ndim = 2,
                       .shape = {N, K},
                       .data = m->data,
                       .nbytes = rb * (size_t)N,
                       .scales = m->sc,
                       .biases = m->bi};
}

static void mat_copy(mat *dst, const mat *src) {
    const size_t G = (size_t)sl_qgroups(src->t.shape[1]) * (size_t)src->t.shape[0] * 2;
    *dst = *src;
    dst->data = malloc(src->t.nbytes);
    memcpy(dst->data, src->data, src->t.nbytes);
    dst->t.data = dst->data;
    if (src->sc) {
        dst->sc = malloc(G), dst->bi = malloc(G);
        memcpy(dst->sc, src->sc, G), memcpy(dst->bi, src->bi, G);
        dst->t.scales = dst->sc, dst->t.biases = dst->bi;
    }
}

static void mat_free(mat *m) {
    free(m->data), free(m->sc), free(m->bi);
}

/* The fastest call (seconds) over the budget, cycling through n copies (path -1: sl_matmul_cpu,
 * else that sl_qpath of a block type): the machine may be shared, and the fastest call is the one
 * nothing else slowed. */
static double time_calls(const sl_backend *be, float *y, const float *x, mat *m, int n, int32_t T,
                         int path) {
    double best = 1e30, spent = 0;
    for (int rep = -1; rep < 3 || spent < BUDGET_S; rep++) { /* rep -1 warms up */
        for (int i = 0; i < n; i++) {
            const double t0 = sl_now();
            if (path < 0)
                sl_matmul_cpu(be, y, x, &m[i].t, NULL, T);
            else if (sl_dtype_is_quant(m[i].t.dtype))
                sl_matmul_quant_cpu_path(be, y, x, &m[i].t, T, (sl_qpath)path);
            else
                sl_matmul_blocks_cpu_path(be, y, x, &m[i].t, T, (sl_qpath)path);
            const double dt = sl_now() - t0;
            if (rep >= 0) best = SL_MIN(best, dt), spent += dt;
        }
    }
    return best;
}

static size_t weight_bytes(const sl_tensor *t) {
    const size_t G = (size_t)sl_qgroups(t->shape[1]) * (size_t)t->shape[0];
    return t->nbytes + (t->scales ? 4 * G : 0);
}

int main(int argc, char **argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 1536, K = argc > 2 ? atoll(argv[2]) : 2048;
    const int32_t T = argc > 3 ? atoi(argv[3]) : 1, nth = argc > 4 ? atoi(argv[4]) : 2;
    static const sl_dtype types[] = {
        SL_DTYPE_BF16,  SL_DTYPE_Q8,   SL_DTYPE_Q4,     SL_DTYPE_Q8_0,
        SL_DTYPE_Q4_0,  SL_DTYPE_Q4_1, SL_DTYPE_Q5_0,   SL_DTYPE_Q5_1,
        SL_DTYPE_MXFP4, SL_DTYPE_Q2_K, SL_DTYPE_Q3_K,   SL_DTYPE_Q4_K,
        SL_DTYPE_Q5_K,  SL_DTYPE_Q6_K, SL_DTYPE_IQ4_XS, SL_DTYPE_IQ4_NL,
    };
    float *x = malloc(sizeof(float) * (size_t)(T * K)),
          *y = malloc(sizeof(float) * (size_t)(T * N));
    for (int64_t i = 0; i < T * K; i++)
        x[i] = frand();
    printf("matmul N=%lld K=%lld T=%d, %d threads; GB/s = weight bytes (scales included) / time\n",
           (long long)N, (long long)K, T, nth);
    printf("%-7s %-7s %-5s %6s %9s %9s %9s %9s\n", "type", "isa", "path", "bits", "cold us",
           "cold GB/s", "hot us", "hot GB/s");
    const char *only = argc > 5 ? argv[5] : NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (only) { /* whole names of a comma list */
            const char *nm = sl_dtype_name(types[i]), *p = strstr(only, nm);
            const size_t l = strlen(nm);
            while (p && !((p == only || p[-1] == ',') && (p[l] == ',' || !p[l])))
                p = strstr(p + 1, nm);
            if (!p) continue;
        }
        mat one;
        mat_make(&one, types[i], N, K);
        const size_t bytes = weight_bytes(&one.t);
        const int n = (int)SL_MAX(1, (COLD_BYTES + bytes - 1) / bytes);
        mat *m = malloc(sizeof(mat) * (size_t)n);
        m[0] = one;
        for (int j = 1; j < n; j++)
            mat_copy(&m[j], &one);
        for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
            sl_backend be;
            sl_backend_cpu_init(&be, nth, (sl_isa)isa);
            /* block types and Q8/Q4: the float path, then the int8 one where it runs */
            const int blk = sl_dtype_is_block(types[i]) || sl_dtype_is_quant(types[i]);
            for (int path = blk ? SL_QPATH_FLOAT : -1; path <= (blk ? SL_QPATH_INT8 : -1); path++) {
                if (path == SL_QPATH_INT8 &&
                    !(sl_dtype_is_quant(types[i]) ? sl_quant_int8_available(&be)
                                                  : sl_blocks_int8_available(&be, &one.t)))
                    continue;
                const int nc = isa == SL_ISA_SCALAR ? SL_MIN(n, 4) : n;
                const double cold = time_calls(&be, y, x, m, nc, T, path);
                const double hot = time_calls(&be, y, x, m, 1, T, path);
                printf("%-7s %-7s %-5s %6.2f %9.1f %9.2f %9.1f %9.2f\n", sl_dtype_name(types[i]),
                       sl_isa_name(be.isa),
                       path == SL_QPATH_INT8    ? "int8"
                       : path == SL_QPATH_FLOAT ? "float"
                                                : "-",
                       sl_dtype_bits(types[i]), cold * 1e6, bytes / cold * 1e-9, hot * 1e6,
                       bytes / hot * 1e-9);
                fflush(stdout);
            }
        }
        for (int j = 0; j < n; j++)
            mat_free(&m[j]);
        free(m);
    }
    free(x), free(y);
    return 0;
}
