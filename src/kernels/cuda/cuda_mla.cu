/*
 * Multi-head latent attention on CUDA (sl_latent_attn_args, ops.h), after the CPU reference
 * (cpu_mla.c): the same formulas in float32, with tree reductions and an online softmax, so the
 * results differ from the CPU's in the last bits.
 *
 *   mla_prep_kernel   a block per new token: its cache row (RMS-normed latent, roped key)
 *                     and the RoPE of every head's positional query part
 *   mla_attn_kernel   a block per (token, head): the keys in chunks of MLA_CHUNK, a warp
 *                     scoring one key at a time; per chunk the running max and sum are
 *                     updated (online softmax) and the latents summed into the output
 *                     accumulator, a dimension per thread
 *
 * Plain by design: every block reads the whole cache (the heads share it through L2).
 */
#include "kernels/cuda/cuda_common.cuh"

#define MLA_THREADS 256
#define MLA_CHUNK   256 /* keys scored per pass; their scores live in shared memory */

typedef struct mla_params {
    float *out, *q, *cache;
    const float *kv;
    const void *nw;  /* the latent norm's weight */
    const int *dpos; /* pos0 in device memory in a graph step (cu_dyn), else NULL */
    const float *cos_tab, *sin_tab;
    int nwdt;
    int T, pos0, nh, kvd, rd, inter;
    float eps, w_offset, scale;
} mla_params;
/* no padding: a graph step compares kernel arguments byte for byte */
static_assert(sizeof(mla_params) == 8 * 8 + 10 * 4, "mla_params without padding");

/* The rotation of pair i of v (pairs (i, i + half), or (2i, 2i + 1) when interleaved). */
__device__ __forceinline__ void mla_rope_pair(float *dst, const float *src, int i, int half,
                                              int inter, float c, float s) {
    const int ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : i + half;
    const float a = src[ia], b = src[ib];
    dst[ia] = a * c - b * s;
    dst[ib] = b * c + a * s;
}

__global__ void mla_prep_kernel(mla_params a) {
    const int pos0 = a.dpos ? *a.dpos : a.pos0; /* set before the step's first kernel */
    cu_pdl_wait();
    __shared__ float sh[32];
    const int t = blockIdx.x, half = a.rd / 2;
    const size_t row = (size_t)a.kvd + (size_t)a.rd;
    const float *in = a.kv + (size_t)t * row;
    float *out = a.cache + (size_t)(pos0 + t) * row;
    const float *c = a.cos_tab + (size_t)(pos0 + t) * (size_t)half;
    const float *s = a.sin_tab + (size_t)(pos0 + t) * (size_t)half;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < a.kvd; i += blockDim.x)
        ss += in[i] * in[i];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)a.kvd + a.eps);
    for (int i = threadIdx.x; i < a.kvd; i += blockDim.x)
        out[i] = (in[i] * inv) * (a.w_offset + cu_load_f(a.nw, a.nwdt, (size_t)i));
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        mla_rope_pair(out + a.kvd, in + a.kvd, i, half, a.inter, c[i], s[i]);
    for (int p = threadIdx.x; p < a.nh * half; p += blockDim.x) {
        float *qr = a.q + ((size_t)t * (size_t)a.nh + (size_t)(p / half)) * row + a.kvd;
        mla_rope_pair(qr, qr, p % half, half, a.inter, c[p % half], s[p % half]);
    }
}

__global__ void __launch_bounds__(MLA_THREADS) mla_attn_kernel(mla_params a) {
    const int pos0 = a.dpos ? *a.dpos : a.pos0;
    cu_pdl_wait();
    extern __shared__ float smem[];
    const int row = a.kvd + a.rd;
    float *sq = smem;           /* [row] the query */
    float *acc = sq + row;      /* [kvd] the output, unnormalised */
    float *sc = acc + a.kvd;    /* [MLA_CHUNK] scores, then weights */
    float *sh = sc + MLA_CHUNK; /* [32] reductions */
    const int t = blockIdx.x / a.nh, h = blockIdx.x % a.nh, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int n_keys = pos0 + t + 1;
    const float *q = a.q + ((size_t)t * (size_t)a.nh + (size_t)h) * (size_t)row;
    for (int d = tid; d < row; d += blockDim.x)
        sq[d] = q[d];
    for (int d = tid; d < a.kvd; d += blockDim.x)
        acc[d] = 0.0f;
    __syncthreads();
    float m = -INFINITY, l = 0.0f; /* running max and sum, the same in every thread */
    for (int j0 = 0; j0 < n_keys; j0 += MLA_CHUNK) {
        const int nj = min(MLA_CHUNK, n_keys - j0);
        for (int j = warp; j < nj; j += nw) {
            const float *k = a.cache + (size_t)(j0 + j) * (size_t)row;
            float s = 0.0f;
            for (int d = lane; d < row; d += 32)
                s += sq[d] * k[d];
            s = warp_sum(s);
            if (lane == 0) sc[j] = s * a.scale;
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int j = tid; j < nj; j += blockDim.x)
            cm = fmaxf(cm, sc[j]);
        cm = block_reduce<true>(cm, sh);
        const float mn = fmaxf(m, cm), corr = expf(m - mn); /* 0 on the first chunk */
        float ps = 0.0f;
        for (int j = tid; j < nj; j += blockDim.x) {
            const float p = expf(sc[j] - mn);
            sc[j] = p;
            ps += p;
        }
        ps = block_reduce<false>(ps, sh); /* also orders the weights' writes before the reads */
        l = l * corr + ps;
        m = mn;
        for (int d = tid; d < a.kvd; d += blockDim.x) {
            float o = acc[d] * corr;
            for (int j = 0; j < nj; j++)
                o += sc[j] * a.cache[(size_t)(j0 + j) * (size_t)row + d];
            acc[d] = o;
        }
        __syncthreads(); /* the next chunk's scores overwrite sc */
    }
    float *out = a.out + ((size_t)t * (size_t)a.nh + (size_t)h) * (size_t)a.kvd;
    const float inv = 1.0f / l;
    for (int d = tid; d < a.kvd; d += blockDim.x)
        out[d] = acc[d] * inv;
}

void cu_latent_attention(const sl_backend *be, const sl_latent_attn_args *args) {
    if (args->T <= 0 || args->n_heads <= 0) return;
    cu_ctx *c = cu_of(be);
    mla_params a;
    memset(&a, 0, sizeof a); /* padding too: a graph step compares the bytes */
    a.out = args->out, a.q = args->q, a.cache = args->cache, a.kv = args->kv;
    a.nw = args->kv_norm->data, a.nwdt = (int)args->kv_norm->dtype;
    a.T = args->T, a.pos0 = args->pos0, a.nh = args->n_heads, a.kvd = args->kv_dim;
    a.dpos = cu_dyn(c, &a.pos0);
    a.rd = args->rope_dim, a.inter = args->interleaved;
    a.eps = args->eps, a.w_offset = args->w_offset, a.scale = args->scale;
    a.cos_tab = args->cos_tab, a.sin_tab = args->sin_tab;
    cu_launch(mla_prep_kernel, (unsigned)a.T, MLA_THREADS, 0, c, a);
    const size_t smem = (size_t)(2 * a.kvd + a.rd + MLA_CHUNK + 32) * sizeof(float);
    cu_launch(mla_attn_kernel, (unsigned)(a.T * a.nh), MLA_THREADS, smem, c, a);
    CUDA_LAUNCHED(c);
}
