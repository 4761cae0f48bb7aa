/* attention.cu - CUDA sink attention of one query and ratio-r gated pooling
 * (kern_attention_cuda, kern_compress_pool_cuda; kernels/attention.h, MODEL.md 5.2, 5.3, R7).
 *
 * Attention: one block per head. The logits are the CPU's bits: one half-warp per key computes
 * q_h . k_e in the 16-lane order of kernels/gemm.h (kc_lane_tree16), times scale; the maximum
 * is exact; exp is kern_exp's steps (kc_exp); the softmax denominator is the 16-lane sum of
 * kernels/attention.h (one half-warp, kc_lane_tree16); P.V runs one thread per channel over
 * the keys in ascending order: every step the CPU's, so the CPU's bits.
 * Logits live in shared memory up to ATT_MAX_SHARED_KEYS keys; beyond that the caller's scratch
 * [n_a + n_b] holds them and one block walks the heads in turn. The key set is keys_a then
 * keys_b (window entries, then selected compressed rows). kern_attention_rows_cuda runs many
 * query rows in one launch (a grid of heads x rows, each block the same per-head steps,
 * attend_head), every row's key set within the shared logits.
 *
 * Pooling: one thread per channel, the CPU's loops and exp (kc_exp): the CPU's bits.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define ATT_MAX_SHARED_KEYS 4096 /* 16 KB of logits per block */

/* Key e of the set keys_a [n_a] followed by keys_b. */
__device__ __forceinline__ const float *key_at(const float *keys_a, int64_t n_a,
                                               const float *keys_b, int64_t e, int64_t d)
{
    return e < n_a ? keys_a + e * d : keys_b + (e - n_a) * d;
}

/* One head of one query (kern_attention_fn's steps, module comment): logits in sc [n_a + n_b]
 * (shared memory or the caller's scratch), red [KC_BLOCK / KC_WARP + 1] shared. All threads of
 * the block call it; it ends with a barrier, so sc and red may be reused right after. */
__device__ void attend_head(const float *qh, const float *keys_a, int64_t n_a,
                            const float *keys_b, int64_t n_b, float sink_h, int64_t d, float scale,
                            float *sc, float *red, float *oh)
{
    const int64_t n_keys = n_a + n_b;
    const int tid = (int)threadIdx.x;
    const int lane = tid % KC_DOT_LANES;
    const int hw = tid / KC_DOT_LANES; /* half-warp: one key at a time */
    const int n_hw = KC_BLOCK / KC_DOT_LANES;

    if (n_keys == 0) {
        for (int64_t c = tid; c < d; c += KC_BLOCK) {
            oh[c] = 0.0f;
        }
        __syncthreads();
        return;
    }
    for (int64_t base = 0; base < n_keys; base += n_hw) {
        const int64_t e = base + hw;
        float acc = 0.0f;
        if (e < n_keys) {
            const float *k = key_at(keys_a, n_a, keys_b, e, d);
            for (int64_t c = lane; c < d; c += KC_DOT_LANES) {
                acc = __fmaf_rn(__ldg(qh + c), __ldg(k + c), acc);
            }
        }
        acc = kc_lane_tree16(acc);
        if (lane == 0 && e < n_keys) {
            sc[e] = __fmul_rn(acc, scale);
        }
    }
    __syncthreads();
    float mu = -INFINITY;
    for (int64_t e = tid; e < n_keys; e += KC_BLOCK) {
        mu = sc[e] > mu ? sc[e] : mu;
    }
    mu = kc_block_max(mu, red);
    for (int64_t e = tid; e < n_keys; e += KC_BLOCK) {
        sc[e] = kc_exp(__fsub_rn(sc[e], mu));
    }
    __syncthreads();
    if (tid < KC_WARP) { /* the 16-lane order: both half-warps of warp 0 compute it */
        float part = 0.0f;
        for (int64_t e = lane; e < n_keys; e += KC_DOT_LANES) {
            part = __fadd_rn(part, sc[e]);
        }
        part = kc_lane_tree16(part);
        if (tid == 0) {
            red[0] = part;
        }
    }
    __syncthreads();
    const float den = __fadd_rn(red[0], kc_exp(__fsub_rn(sink_h, mu)));
    __syncthreads(); /* every thread has read red[0] before the next head's max reuses it */
    for (int64_t e = tid; e < n_keys; e += KC_BLOCK) {
        sc[e] = __fdiv_rn(sc[e], den);
    }
    __syncthreads();
    for (int64_t c = tid; c < d; c += KC_BLOCK) {
        float acc = 0.0f;
        for (int64_t e = 0; e < n_a; e++) {
            acc = __fadd_rn(acc, __fmul_rn(sc[e], __ldg(keys_a + e * d + c)));
        }
        for (int64_t e = 0; e < n_b; e++) {
            acc = __fadd_rn(acc, __fmul_rn(sc[n_a + e], __ldg(keys_b + e * d + c)));
        }
        oh[c] = kc_bf16_round(acc);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(KC_BLOCK)
    attention_kernel(const float *q, const float *keys_a, int64_t n_a, const float *keys_b,
                     int64_t n_b, const float *sink, int64_t n_heads, int64_t d, float scale,
                     float *scratch, float *o)
{
    __shared__ float sc_shared[ATT_MAX_SHARED_KEYS];
    __shared__ float red[KC_BLOCK / KC_WARP + 1];
    float *sc = n_a + n_b > ATT_MAX_SHARED_KEYS ? scratch : sc_shared;

    for (int64_t h = blockIdx.x; h < n_heads; h += gridDim.x) {
        attend_head(q + h * d, keys_a, n_a, keys_b, n_b, sink[h], d, scale, sc, red, o + h * d);
    }
}

/* kern_attention_rows_fn: block (x, y) takes heads x, x + gridDim.x, ... of rows y, y +
 * gridDim.y, ...; every row's key set fits the shared logits (KERN_ATTENTION_ROWS_MAX_KEYS). */
__global__ void __launch_bounds__(KC_BLOCK)
    attention_rows_kernel(const kern_attn_row_t *rows, int64_t n_rows, const float *sink,
                          int64_t n_heads, int64_t d, float scale)
{
    __shared__ float sc[ATT_MAX_SHARED_KEYS];
    __shared__ float red[KC_BLOCK / KC_WARP + 1];

    for (int64_t i = blockIdx.y; i < n_rows; i += gridDim.y) {
        const kern_attn_row_t r = rows[i];
        if (r.n_a < 0 || r.n_b < 0 || r.n_a + r.n_b > ATT_MAX_SHARED_KEYS) {
            /* a descriptor the host could not check (kernels/attention.h): NaN, never a write
             * past the shared logits */
            for (int64_t h = blockIdx.x; h < n_heads; h += gridDim.x) {
                for (int64_t c = threadIdx.x; c < d; c += KC_BLOCK) {
                    r.o[h * d + c] = __int_as_float(0x7fc00000);
                }
            }
            continue;
        }
        for (int64_t h = blockIdx.x; h < n_heads; h += gridDim.x) {
            attend_head(r.q + h * d, r.keys_a, r.n_a, r.keys_b, r.n_b, sink[h], d, scale, sc, red,
                        r.o + h * d);
        }
    }
}

extern "C" tdm_status_t kern_attention_cuda(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                            int64_t n_a, const float *keys_b, int64_t n_b,
                                            const float *sink, int64_t n_heads, int64_t d,
                                            float scale, float *scratch, float *o_out)
{
    const int64_t n_keys = n_a + n_b;
    unsigned int grid;

    if (q == NULL || sink == NULL || o_out == NULL || n_a < 0 || n_b < 0 || n_heads <= 0 ||
        d % KERN_GEMM_K_MULTIPLE != 0 || (n_a > 0 && keys_a == NULL) ||
        (n_b > 0 && keys_b == NULL) || (n_keys > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (d <= 0) {
        return TDM_OK;
    }
    /* logits in the caller's scratch [n_a + n_b] hold one head at a time: one block */
    grid = n_keys > ATT_MAX_SHARED_KEYS ? 1u : kc_grid(n_heads, 1);
    attention_kernel<<<grid, KC_BLOCK, 0, kc_stream(ctx)>>>(q, keys_a, n_a, keys_b, n_b, sink,
                                                            n_heads, d, scale, scratch, o_out);
    return kc_launch_status("attention_cuda", n_keys, n_heads * d);
}

extern "C" tdm_status_t kern_attention_rows_cuda(kern_ctx_t *ctx, const kern_attn_row_t *rows,
                                                 int64_t n_rows, const float *sink,
                                                 int64_t n_heads, int64_t d, float scale,
                                                 float *scratch)
{
    static_assert(ATT_MAX_SHARED_KEYS == KERN_ATTENTION_ROWS_MAX_KEYS,
                  "a row's logits must fit the shared array");
    if (n_rows < 0 || (n_rows > 0 && (rows == NULL || sink == NULL || scratch == NULL)) ||
        n_heads <= 0 || d % KERN_GEMM_K_MULTIPLE != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0 || d <= 0) {
        return TDM_OK;
    }
    const dim3 grid((unsigned int)kc_grid(n_heads, 1),
                    (unsigned int)(n_rows < KC_MAX_BLOCKS ? n_rows : KC_MAX_BLOCKS));
    attention_rows_kernel<<<grid, KC_BLOCK, 0, kc_stream(ctx)>>>(rows, n_rows, sink, n_heads, d,
                                                                  scale);
    return kc_launch_status("attention_rows_cuda", n_rows, n_heads * d);
}

__global__ void __launch_bounds__(KC_BLOCK)
    compress_pool_kernel(const float *a, const float *b, int r, int64_t d, float *v)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < d; c += stride) {
        float mx = -INFINITY;
        float den = 0.0f;
        float acc = 0.0f;

        for (int p = 0; p < r; p++) {
            mx = b[p * d + c] > mx ? b[p * d + c] : mx;
        }
        for (int p = 0; p < r; p++) {
            den = __fadd_rn(den, kc_exp(__fsub_rn(b[p * d + c], mx)));
        }
        for (int p = 0; p < r; p++) {
            const float w = __fdiv_rn(kc_exp(__fsub_rn(b[p * d + c], mx)), den);
            acc = __fadd_rn(acc, __fmul_rn(w, a[p * d + c]));
        }
        v[c] = kc_bf16_round(acc);
    }
}

extern "C" tdm_status_t kern_compress_pool_cuda(kern_ctx_t *ctx, const float *a, const float *b,
                                                int r, int64_t d, float *v_out)
{
    if (a == NULL || b == NULL || v_out == NULL || r < 1 || d <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    compress_pool_kernel<<<kc_grid(d, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(a, b, r, d, v_out);
    return kc_launch_status("compress_pool_cuda", r, d);
}
