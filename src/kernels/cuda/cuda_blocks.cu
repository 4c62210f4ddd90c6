/*
 * CUDA matmul, matmul_batch, the fused routed experts and embed for ggml's block types
 * (cuda_blocks.cuh decodes them). cuda_matmul.cu's entry points hand these dtypes over here.
 *
 * One order of summation for every kernel, so that an output's bits depend only on the row,
 * x's row and K (never on T, the tile, the batch or the kernel):
 *   lane l of 32 takes the units (32 weights, cuda_blocks.cuh) u = l, l + 32, ... in turn;
 *   for each, groups g = 0..7 of 4 weights: acc = acc + fma(w3, x3, fma(w2, x2, fma(w1, x1,
 *   w0 x0))) (blk_dot4); then the 32 lanes' sums by warp_sum's butterfly.
 * Decode (T <= 4) and prefill run the same kernel, blk_mm: a warp owns R rows and NT tokens,
 * so each decoded weight serves NT tokens and each x value (read from shared memory) R rows.
 *   decode   NT = T (1, 2 or 4; T = 3 runs as 4 with a zero token), R = 1, 2, 4 by the rows;
 *   prefill  NT = 8 tokens a block, R = 4 (32 rows a block); the weights are decoded once
 *            per 8 tokens, straight from global memory into registers (L2 serves the other
 *            token tiles), and x staged in shared memory 32 units (1024 columns) at a time.
 * Weights are decoded with ggml's own roundings; the arithmetic is float32 throughout.
 */
#include "kernels/cuda/cuda_blocks.cuh"

#define BLK_WARPS 8 /* warps of a blk_mm block */
/* Shared memory for staged x: under the 48 KB a block gets without opting in, leaving room for
 * the kernels' few static bytes. */
#define BLK_SMEM (46u << 10)
extern __shared__ __align__(16) float blk_xs[]; /* a block's staged x (dynamic) */

/* Units a stage of nrows staged rows takes: all of a row's U (rounded up to 32: a unit a lane)
 * when they fit BLK_SMEM, else the most multiples of 32 that do; 0 when not even 32 fit. */
static int blk_stage_units(int64_t U, int nrows) {
    const int64_t per32 = (int64_t)nrows * 32 * BLK_UNIT_FLOATS * (int64_t)sizeof(float);
    const int64_t fit = (int64_t)BLK_SMEM / per32 * 32;
    const int64_t all = (U + 31) / 32 * 32;
    return (int)(all < fit ? all : fit);
}

static size_t blk_stage_bytes(int su, int nrows) {
    return (size_t)su * BLK_UNIT_FLOATS * sizeof(float) * (size_t)nrows;
}

/* ------------------------------------------------------------ matmul */

/* One product y[T, N] = x[T, K] . w^T (+ bias) of a launch: its blocks are b0 .. b0 + rb * tiles
 * - 1 of the grid, row blocks fastest. */
typedef struct blk_item {
    float *y;
    const float *x;
    const uint8_t *w;
    const void *bias; /* NULL: none */
    int bias_dt, N, T, rb, b0;
} blk_item;

/* Up to BLK_SMALL items travel as a kernel parameter (no upload: a decode step's products); more
 * are copied to device memory (cu_items). */
#define BLK_SMALL 4
typedef struct blk_small {
    blk_item it[BLK_SMALL];
} blk_small;

/* The item of block bx: the last whose b0 <= bx. */
__device__ __forceinline__ blk_item blk_find(const blk_item *items, const blk_small &small, int n,
                                             int bx) {
    if (!items) {
        int j = 0;
#pragma unroll
        for (int i = 1; i < BLK_SMALL; i++)
            j += i < n && bx >= small.it[i].b0;
        return small.it[j];
    }
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (items[mid].b0 <= bx)
            lo = mid;
        else
            hi = mid - 1;
    }
    return items[lo];
}

/* A block of a launch: rows (rb-th block of BLK_WARPS R) x tokens (tile of NT) of one item. */
/* Asks L2 for rows row0 .. row0 + R - 1 (those below N) of w, a 128-byte line a lane at a time. */
__device__ __forceinline__ void blk_prefetch_rows(const uint8_t *w, size_t ws, int64_t row0, int R,
                                                  int N) {
    const int64_t rows = min((int64_t)R, (int64_t)N - row0);
    if (rows <= 0) return;
    const uint8_t *p = w + (size_t)row0 * ws;
    for (size_t off = (size_t)(threadIdx.x & 31) * 128; off < (size_t)rows * ws; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

template <int DT, int R, int NT>
__global__ void __launch_bounds__(BLK_WARPS * 32, 2)
    blk_mm(const blk_item *__restrict__ items, blk_small small, int n, int K, int su) {
    const size_t ws = (size_t)(K / bu<DT>::BS) * bu<DT>::BB;
    const int warp = (int)threadIdx.x / 32;
    if (!items) { /* items in device memory come from a copy: read them after the wait */
        /* the weights do not depend on earlier kernels: with dependent launch their first token
         * tile's rows stream into L2 while the previous kernel ends */
        const blk_item it = blk_find(nullptr, small, n, (int)blockIdx.x);
        const int lb = (int)blockIdx.x - it.b0;
        if (lb < it.rb) blk_prefetch_rows(it.w, ws, ((int64_t)lb * BLK_WARPS + warp) * R, R, it.N);
    }
    cu_pdl_wait();
    const blk_item it = blk_find(items, small, n, (int)blockIdx.x);
    const int lb = (int)blockIdx.x - it.b0, rbk = lb % it.rb, t0 = lb / it.rb * NT;
    const int64_t row0 = ((int64_t)rbk * BLK_WARPS + warp) * R;
    const uint8_t *row[R];
#pragma unroll
    for (int r = 0; r < R; r++) /* rows past N repeat the last; their sums are dropped */
        row[r] = it.w + (size_t)min(row0 + r, (int64_t)it.N - 1) * ws;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    const int U = K / 32, xts = su * BLK_UNIT_FLOATS;
    for (int s0 = 0; s0 < U; s0 += su) {
        const int s1 = min(s0 + su, U);
        if (s0) __syncthreads(); /* the previous stage is read */
        blk_stage(blk_xs, xts, it.x + (size_t)t0 * K, (size_t)K, NT, it.T - t0, s0 * 32,
                  (s1 - s0) * 32);
        if (row0 < it.N) blk_units<DT, R, NT>(acc, row, blk_xs, xts, s0, s1);
    }
    if (row0 >= it.N) return;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = warp_sum(acc[r][t]);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row0 + r >= it.N) break;
            const float bv = it.bias ? cu_load_f(it.bias, it.bias_dt, (size_t)(row0 + r)) : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t0 + t < it.T) it.y[(size_t)(t0 + t) * it.N + row0 + r] = acc[r][t] + bv;
        }
}

/* Rows a warp: as cuda_matmul.cu's rows_per_warp, the most that still gives every SM a few
 * blocks. */
static int blk_rows_per_warp(const cu_ctx *c, int64_t rows) {
    const int64_t want = (int64_t)c->n_sm * 4;
    return rows / (BLK_WARPS * 4) >= want ? 4 : rows / (BLK_WARPS * 2) >= want ? 2 : 1;
}

/* The tokens a block takes for T tokens (NT). */
static int blk_nt(int32_t T) {
    return T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8;
}

template <int DT, int R, int NT>
static void blk_launch_rn(cu_ctx *c, const blk_item *dev, const blk_small &small, int n,
                          unsigned blocks, int K, int su) {
    cu_launch(blk_mm<DT, R, NT>, blocks, BLK_WARPS * 32, blk_stage_bytes(su, NT), c, dev, small, n,
              K, su);
}

template <int DT, int NT>
static void blk_launch_n(cu_ctx *c, int R, const blk_item *dev, const blk_small &small, int n,
                         unsigned blocks, int K, int su) {
    switch (R) {
    case 4: blk_launch_rn<DT, 4, NT>(c, dev, small, n, blocks, K, su); break;
    case 2: blk_launch_rn<DT, 2, NT>(c, dev, small, n, blocks, K, su); break;
    default: blk_launch_rn<DT, 1, NT>(c, dev, small, n, blocks, K, su); break;
    }
}

/*
 * One launch for items[0..n) (all of dtype dt and K, tokens taken NT at a time): numbers their
 * blocks, uploads them when more than BLK_SMALL, and launches blk_mm.
 */
static void blk_launch(const sl_backend *be, int dt, blk_item *items, int n, int K, int NT) {
    cu_ctx *c = cu_of(be);
    int64_t rows = 0;
    for (int i = 0; i < n; i++)
        rows += items[i].N;
    const int R = NT == 8 ? 4 : blk_rows_per_warp(c, rows);
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) {
        items[i].rb = (int)cu_blocks((size_t)items[i].N, BLK_WARPS * R);
        items[i].b0 = (int)blocks;
        blocks += (int64_t)items[i].rb * ((items[i].T + NT - 1) / NT);
    }
    SL_ASSERT(blocks <= 0x7fffffff);
    if (!blocks) return;
    blk_small small = {};
    const blk_item *dev = NULL;
    if (n <= BLK_SMALL)
        for (int i = 0; i < n; i++)
            small.it[i] = items[i];
    else
        dev = (const blk_item *)cu_items(be, items, (size_t)n * sizeof *items);
    const int su = blk_stage_units(K / 32, NT);
    SL_ASSERT(su > 0);
    blk_switch(dt, [&](auto tag) {
        constexpr int DT = decltype(tag)::dt;
        switch (NT) {
        case 1: blk_launch_n<DT, 1>(c, R, dev, small, n, (unsigned)blocks, K, su); break;
        case 2: blk_launch_n<DT, 2>(c, R, dev, small, n, (unsigned)blocks, K, su); break;
        case 4: blk_launch_n<DT, 4>(c, R, dev, small, n, (unsigned)blocks, K, su); break;
        default: blk_launch_rn<DT, 4, 8>(c, dev, small, n, (unsigned)blocks, K, su); break;
        }
    });
    CUDA_LAUNCHED(c);
}

static void blk_check_shape(const sl_tensor *w) {
    SL_ASSERT(w->ndim == 2 && w->shape[0] < INT32_MAX && w->shape[1] < INT32_MAX);
    SL_ASSERT(w->shape[1] % sl_dtype_block_size(w->dtype) == 0);
}

void cu_blk_matmul(const sl_backend *be, float *y, const float *x, const sl_tensor *w,
                   const sl_tensor *bias, int32_t T) {
    blk_check_shape(w);
    cu_norm_flush(be); /* x may be a pending add_rmsnorm_next's y */
    if (T <= 0 || w->shape[0] <= 0) return;
    const void *b = bias && bias->data ? bias->data : NULL;
    blk_item it = {y, x, (const uint8_t *)w->data, b, b ? (int)bias->dtype : 0, (int)w->shape[0], T,
                   0, 0};
    blk_launch(be, (int)w->dtype, &it, 1, (int)w->shape[1], blk_nt(T));
}

/* Products a launch takes at most (its items go through the parameter ring). */
#define BLK_MAX_ITEMS 4096

/*
 * A batch as one launch per class of T (1, 2, 3-4, more: the NT of blk_nt) of the products of
 * w[0]'s dtype and K; each product is computed as cu_blk_matmul computes it alone (the order
 * does not depend on the launch). Products of another dtype or K go one by one through cu_matmul.
 */
void cu_blk_matmul_batch(const sl_backend *be, float *const *y, const float *const *x,
                         const sl_tensor *const *w, const int32_t *T, int32_t n) {
    cu_ctx *c = cu_of(be);
    cu_norm_flush(be);
    const int dt = (int)w[0]->dtype;
    const int64_t K = w[0]->shape[1];
    blk_item *items = (blk_item *)c->items_host;
    const int32_t cap = (int32_t)SL_MIN((size_t)BLK_MAX_ITEMS, c->items_bytes / sizeof *items);
    static const int nts[] = {1, 2, 4, 8};
    for (int ci = 0; ci < 4; ci++) {
        int m = 0;
        for (int32_t i = 0; i < n; i++) {
            if (T[i] <= 0 || w[i]->shape[0] <= 0 || (int)w[i]->dtype != dt || w[i]->shape[1] != K ||
                blk_nt(T[i]) != nts[ci])
                continue;
            blk_check_shape(w[i]);
            items[m++] = blk_item{
                y[i], x[i], (const uint8_t *)w[i]->data, NULL, 0, (int)w[i]->shape[0], T[i], 0, 0};
            if (m == cap) {
                blk_launch(be, dt, items, m, (int)K, nts[ci]);
                m = 0;
            }
        }
        if (m) blk_launch(be, dt, items, m, (int)K, nts[ci]);
    }
    for (int32_t i = 0; i < n; i++)
        if (T[i] > 0 && ((int)w[i]->dtype != dt || w[i]->shape[1] != K))
            cu_matmul(be, y[i], x[i], w[i], NULL, T[i]);
}

/* ------------------------------------------------------ routed experts */

/* act[i] = silu(gate_e x[i / k]) * up_e x[i / k] for pick i = blockIdx.y (e = ids[i]): the gate
 * and up products of blk_mm (same order, + 0.0f as matmul_batch's bias-less store adds) and the
 * swiglu op's formula, in one launch. x staged as one token's row. */
template <int DT, int R>
__global__ void __launch_bounds__(BLK_WARPS * 32, 2)
    blk_moe_gate_up(float *__restrict__ act, const float *__restrict__ x,
                    const int32_t *__restrict__ ids, const sl_expert_ptrs *__restrict__ table,
                    int k, int I, int H, int su) {
    cu_pdl_wait();
    const int i = blockIdx.y;
    const sl_expert_ptrs p = table[ids[i]];
    if (!p.p[0]) return; /* not in the expert cache (the whole block returns) */
    const int64_t row0 = ((int64_t)blockIdx.x * BLK_WARPS + threadIdx.x / 32) * R;
    const size_t ws = (size_t)(H / bu<DT>::BS) * bu<DT>::BB;
    const uint8_t *rg[R], *ru[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const size_t off = (size_t)min(row0 + r, (int64_t)I - 1) * ws;
        rg[r] = (const uint8_t *)p.p[0] + off, ru[r] = (const uint8_t *)p.p[3] + off;
    }
    float g[R][1], u[R][1];
#pragma unroll
    for (int r = 0; r < R; r++)
        g[r][0] = u[r][0] = 0.0f;
    const int U = H / 32, xts = su * BLK_UNIT_FLOATS;
    const float *xt = x + (size_t)(i / k) * H;
    for (int s0 = 0; s0 < U; s0 += su) {
        const int s1 = min(s0 + su, U);
        if (s0) __syncthreads();
        blk_stage(blk_xs, xts, xt, (size_t)H, 1, 1, s0 * 32, (s1 - s0) * 32);
        if (row0 < I) {
            blk_units<DT, R, 1>(g, rg, blk_xs, xts, s0, s1);
            blk_units<DT, R, 1>(u, ru, blk_xs, xts, s0, s1);
        }
    }
    if (row0 >= I) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        g[r][0] = warp_sum(g[r][0]);
        u[r][0] = warp_sum(u[r][0]);
    }
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (row0 + r < I)
                act[(size_t)i * I + row0 + r] = cu_silu_mul(g[r][0] + 0.0f, u[r][0] + 0.0f);
}

/* Picks a token the fused down kernel takes: a warp each, all k act rows staged at once (32
 * units each at the least: 10 x 4.6 KB fit BLK_SMEM). */
#define BLK_MOE_MAX_K 10

/* y[t] rows row0 .. row0+R-1 (t = blockIdx.y, row0 = blockIdx.x R): warp r computes them for
 * rank r (down_e act[t k + r], e = ids[t k + r], in blk_mm's order, plus the 0.0f of the
 * bias-less store) into shared memory, then R threads sum the ranks in order, as the
 * weighted_sum kernel does. A token with a pick not in the expert cache is left as it is. */
template <int DT, int R>
__global__ void __launch_bounds__(32 * BLK_MOE_MAX_K)
    blk_moe_down(float *__restrict__ y, const float *__restrict__ act,
                 const int32_t *__restrict__ ids, const float *__restrict__ w,
                 const sl_expert_ptrs *__restrict__ table, int I, int H, int k, int su) {
    __shared__ float part[BLK_MOE_MAX_K * R]; /* [rank][row] */
    cu_pdl_wait();
    const int t = blockIdx.y, r = threadIdx.x / 32;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    const sl_expert_ptrs p = table[ids[t * k + r]];
    if (!__syncthreads_and(p.p[0] != nullptr)) return;
    const size_t ws = (size_t)(I / bu<DT>::BS) * bu<DT>::BB;
    const uint8_t *rd[R];
#pragma unroll
    for (int j = 0; j < R; j++)
        rd[j] = (const uint8_t *)p.p[6] + (size_t)min(row0 + j, (int64_t)H - 1) * ws;
    float v[R][1];
#pragma unroll
    for (int j = 0; j < R; j++)
        v[j][0] = 0.0f;
    const int U = I / 32, xts = su * BLK_UNIT_FLOATS;
    for (int s0 = 0; s0 < U; s0 += su) {
        const int s1 = min(s0 + su, U);
        if (s0) __syncthreads();
        blk_stage(blk_xs, xts, act + (size_t)t * k * I, (size_t)I, k, k, s0 * 32, (s1 - s0) * 32);
        blk_units<DT, R, 1>(v, rd, blk_xs + (size_t)r * xts, xts, s0, s1);
    }
#pragma unroll
    for (int j = 0; j < R; j++)
        v[j][0] = warp_sum(v[j][0]);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int j = 0; j < R; j++)
            part[r * R + j] = v[j][0] + 0.0f;
    __syncthreads();
    if (threadIdx.x < R && row0 + threadIdx.x < H) {
        float acc = 0.0f;
        for (int q = 0; q < k; q++)
            acc += w[(size_t)t * k + q] * part[q * R + threadIdx.x];
        y[(size_t)t * H + row0 + threadIdx.x] = acc;
    }
}

template <int DT>
static void blk_launch_gate_up(cu_ctx *c, float *act, const float *x, const int32_t *ids,
                               const sl_expert_ptrs *table, int k, int I, int H, int n) {
    /* rows a warp: two when one already fills every SM with blocks */
    const int R = (int64_t)cu_blocks((size_t)I, BLK_WARPS * 2) * n >= (int64_t)c->n_sm * 4 ? 2 : 1;
    const int su = blk_stage_units(H / 32, 1);
    const dim3 grid(cu_blocks((size_t)I, BLK_WARPS * R), (unsigned)n);
    const size_t sm = blk_stage_bytes(su, 1);
    if (R == 2)
        cu_launch(blk_moe_gate_up<DT, 2>, grid, BLK_WARPS * 32, sm, c, act, x, ids, table, k, I, H,
                  su);
    else
        cu_launch(blk_moe_gate_up<DT, 1>, grid, BLK_WARPS * 32, sm, c, act, x, ids, table, k, I, H,
                  su);
}

template <int DT>
static void blk_launch_down(cu_ctx *c, float *y, const float *act, const int32_t *ids,
                            const float *w, const sl_expert_ptrs *table, int I, int H, int k,
                            int T) {
    /* the most rows (up to 4: a row's decode state takes up to 13 registers) that still give
     * every SM a block */
    const int64_t hb = (int64_t)H * T, sm_n = c->n_sm;
    const int R = hb / 4 >= sm_n ? 4 : hb / 2 >= sm_n ? 2 : 1;
    const int su = blk_stage_units(I / 32, k);
    const dim3 grid(cu_blocks((size_t)H, R), (unsigned)T);
    const unsigned th = 32 * k;
    const size_t sm = blk_stage_bytes(su, k);
    switch (R) {
    case 4:
        cu_launch(blk_moe_down<DT, 4>, grid, th, sm, c, y, act, ids, w, table, I, H, k, su);
        break;
    case 2:
        cu_launch(blk_moe_down<DT, 2>, grid, th, sm, c, y, act, ids, w, table, I, H, k, su);
        break;
    default:
        cu_launch(blk_moe_down<DT, 1>, grid, th, sm, c, y, act, ids, w, table, I, H, k, su);
        break;
    }
}

/*
 * The fused routed experts (sl_ops.moe_experts) for block-type experts: gate and up of one block
 * dtype, down of one block dtype (a GGUF's down often has more bits than its gate and up), whole
 * blocks along H and I, k <= BLK_MOE_MAX_K picks. Declines (0) anything else; the caller's
 * fallback (matmul_batch, swiglu, matmul_batch, weighted_sum) gives the same bits.
 */
int cu_blk_moe_experts(const sl_backend *be, float *y, float *act, const float *x,
                       const int32_t *ids, const float *w, const sl_expert_ptrs *table,
                       const sl_tensor *const proto[3], int32_t T, int32_t k) {
    const int gdt = (int)proto[0]->dtype, ddt = (int)proto[2]->dtype;
    const int64_t I = proto[0]->shape[0], H = proto[0]->shape[1];
    const int64_t n = (int64_t)T * k;
    int ok = sl_dtype_is_block((sl_dtype)gdt) && sl_dtype_is_block((sl_dtype)ddt) &&
             (int)proto[1]->dtype == gdt && proto[0]->ndim == 2 && proto[1]->ndim == 2 &&
             proto[2]->ndim == 2 && proto[1]->shape[0] == I && proto[1]->shape[1] == H &&
             proto[2]->shape[0] == H && proto[2]->shape[1] == I && I > 0 && H > 0 &&
             I < INT32_MAX && H < INT32_MAX && H % sl_dtype_block_size((sl_dtype)gdt) == 0 &&
             I % sl_dtype_block_size((sl_dtype)ddt) == 0 && k >= 1 && k <= BLK_MOE_MAX_K &&
             n >= 0 && n <= 65535;
    if (!ok || !n) return ok;
    cu_ctx *c = cu_of(be);
    blk_switch(gdt, [&](auto tag) {
        blk_launch_gate_up<decltype(tag)::dt>(c, act, x, ids, table, k, (int)I, (int)H, (int)n);
    });
    blk_switch(ddt, [&](auto tag) {
        blk_launch_down<decltype(tag)::dt>(c, y, act, ids, w, table, (int)I, (int)H, k, T);
    });
    CUDA_LAUNCHED(c);
    return 1;
}

/* -------------------------------------------------------------- embed */

/* Rows ids[t] of a [V, n] table, decoded: a thread a unit. */
template <int DT>
__global__ void blk_embed(float *__restrict__ y, const uint8_t *__restrict__ w,
                          const int32_t *__restrict__ ids, int n) {
    using B = bu<DT>;
    cu_pdl_wait();
    const int t = blockIdx.y;
    const uint8_t *row = w + (size_t)ids[t] * (size_t)(n / B::BS) * B::BB;
    float *yt = y + (size_t)t * n;
    for (int u = blockIdx.x * blockDim.x + threadIdx.x; u < n / 32; u += gridDim.x * blockDim.x) {
        const int b = u / B::UPB, j = u % B::UPB;
        typename B::U st;
        B::load(st, row + (size_t)b * B::BB, j);
#pragma unroll
        for (int g = 0; g < 8; g++) {
            const float4 v = B::deq(st, g);
            float *o = yt + (size_t)b * B::BS + B::xoff(j, g);
            o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
        }
    }
}

void cu_blk_embed(const sl_backend *be, float *y, const sl_tensor *table, const int32_t *ids,
                  int32_t T) {
    const int64_t n = table->shape[table->ndim - 1];
    SL_ASSERT(n < INT32_MAX && n % sl_dtype_block_size(table->dtype) == 0);
    if (T <= 0 || n <= 0) return;
    cu_ctx *c = cu_of(be);
    const unsigned units = (unsigned)(n / 32);
    const dim3 grid(cu_blocks(units, 128) < 64 ? cu_blocks(units, 128) : 64, (unsigned)T);
    blk_switch((int)table->dtype, [&](auto tag) {
        cu_launch(blk_embed<decltype(tag)::dt>, grid, 128, 0, c, y, (const uint8_t *)table->data,
                  ids, (int)n);
    });
    CUDA_LAUNCHED(c);
}
