/* topk.cu - CUDA indexer scores and tie-ordered top-k (kern_index_scores_cuda, kern_topk_cuda;
 * kernels/topk.h, MODEL.md 5.4).
 *
 * Scores: one half-warp per key; each q_h . k_j is the 16-lane dot of kernels/gemm.h
 * (kc_lane_tree16) and lane 0 sums w_h * max(0, dot) over h ascending with separate multiply
 * and add: bit-identical to kern_index_scores_cpu.
 *
 * Top-k: one block. Values map to order-preserving 32-bit keys (-0 as +0, so equal values have
 * equal keys); a 4-pass radix select (8 bits per pass, histograms in shared memory) finds the
 * k-th largest key T; the selected indices (key > T, then key == T in ascending index until k)
 * are compacted into the caller's scratch in index order (warp ballots), then sorted by (value
 * descending, index ascending) with a bitonic network, in shared memory up to
 * TOPK_SHARED_SORT elements, else in scratch. The result is unique (a total order), so it
 * equals the CPU heap's for identical values. n_out is device memory; a NaN makes it -1, which
 * the host reads back (the op waits for its stream) to return TDM_ERR_INTERNAL; with a status
 * word on the context (kernels/backend.h) a NaN makes it 0 and sets the word's bit instead,
 * and the op returns without waiting.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define TOPK_SHARED_SORT 4096 /* selections sorted in shared memory up to this size */
#define TOPK_RADIX_BITS  8
#define TOPK_RADIX_BINS  (1 << TOPK_RADIX_BITS)
#define TOPK_NAN         (-1) /* *n_out when a value is NaN */

/* ---- index scores ----------------------------------------------------------------------- */

__global__ void __launch_bounds__(KC_BLOCK)
    index_scores_kernel(const float *q, const float *w, int64_t n_heads, int64_t d_I,
                        const float *keys, int64_t n_keys, float *scores)
{
    const int tid = (int)threadIdx.x;
    const int lane = tid % KC_DOT_LANES;
    const int hw = tid / KC_DOT_LANES;
    const int64_t per_grid = (int64_t)gridDim.x * (KC_BLOCK / KC_DOT_LANES);

    /* j0 is the same for the two half-warps of a warp, so the shuffles stay warp-uniform */
    for (int64_t j0 = (int64_t)blockIdx.x * (KC_BLOCK / KC_DOT_LANES) + (hw & ~1); j0 < n_keys;
         j0 += per_grid) {
        const int64_t j = j0 + (hw & 1);
        const int valid = j < n_keys;
        const float *k = keys + (valid ? j : 0) * d_I;
        float s = 0.0f;

        for (int64_t h = 0; h < n_heads; h++) {
            const float *qh = q + h * d_I;
            float acc = 0.0f;
            if (valid) {
                for (int64_t c = lane; c < d_I; c += KC_DOT_LANES) {
                    acc = __fmaf_rn(__ldg(qh + c), __ldg(k + c), acc);
                }
            }
            const float dot = kc_lane_tree16(acc);
            s = __fadd_rn(s, __fmul_rn(w[h], dot > 0.0f ? dot : 0.0f));
        }
        if (lane == 0 && valid) {
            scores[j] = s;
        }
    }
}

extern "C" tdm_status_t kern_index_scores_cuda(kern_ctx_t *ctx, const float *q, const float *w,
                                               int64_t n_heads, int64_t d_I, const float *keys,
                                               int64_t n_keys, float *scores_out)
{
    if (q == NULL || w == NULL || (keys == NULL && n_keys > 0) || scores_out == NULL ||
        d_I % KERN_GEMM_K_MULTIPLE != 0 || n_heads <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_keys <= 0) {
        return TDM_OK;
    }
    index_scores_kernel<<<kc_grid(n_keys, KC_BLOCK / KC_DOT_LANES), KC_BLOCK, 0, kc_stream(ctx)>>>(
        q, w, n_heads, d_I, keys, n_keys, scores_out);
    return kc_launch_status("index_scores_cuda", n_keys, n_heads * d_I);
}

/* ---- top-k ------------------------------------------------------------------------------ */

/* Order-preserving key of a non-NaN value: larger value, larger key; -0 and +0 equal. */
__device__ __forceinline__ uint32_t order_key(float v)
{
    uint32_t u = __float_as_uint(v);

    if ((u & KC_F32_ABS_MASK) == 0u) {
        u = 0u;
    }
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

/* Key of -inf: such values are never selected. */
#define TOPK_NEG_INF_KEY 0x007FFFFFu

/* (ka, ia) before (kb, ib): larger key first, then smaller index. */
__device__ __forceinline__ int key_better(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

/* Exclusive prefix count of `flag` over the block in thread order; *total_out = block total.
 * Uses warp ballots and warp_counts [KC_BLOCK / KC_WARP] of shared memory; ends with a
 * barrier. */
__device__ __forceinline__ int block_rank(int flag, int *warp_counts, int *total_out)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int warp = (int)(threadIdx.x / KC_WARP);
    const uint32_t ballot = __ballot_sync(KC_FULL_MASK, flag);
    const uint32_t below = lane == 0 ? 0u : (ballot & (KC_FULL_MASK >> (KC_WARP - lane)));
    int rank = __popc(below);
    int total = 0;

    if (lane == 0) {
        warp_counts[warp] = __popc(ballot);
    }
    __syncthreads();
    for (int w = 0; w < KC_BLOCK / KC_WARP; w++) {
        rank += w < warp ? warp_counts[w] : 0;
        total += warp_counts[w];
    }
    __syncthreads();
    *total_out = total;
    return rank;
}

/*
 * Bitonic sort of n entries, best first, of an array addressed through get(i) -> (key, index)
 * and swap(i, j). Comparisons always move the better entry to the lower position, so virtual
 * entries beyond n (worst of all) never move and any n works. All threads of the block call it.
 */
template <typename GetFn, typename SwapFn>
__device__ void bitonic_sort(int64_t n, GetFn get, SwapFn swap)
{
    int64_t n_pow2 = 1;

    while (n_pow2 < n) {
        n_pow2 *= 2;
    }
    for (int64_t size = 2; size <= n_pow2; size *= 2) {
        const int64_t half = size / 2;
        for (int64_t i = threadIdx.x; i < n_pow2 / 2; i += KC_BLOCK) {
            const int64_t a = (i / half) * size + i % half;
            const int64_t b = (i / half) * size + size - 1 - i % half;
            if (b < n) {
                uint32_t ka, kb;
                int32_t ia, ib;
                get(a, &ka, &ia);
                get(b, &kb, &ib);
                if (key_better(kb, ib, ka, ia)) {
                    swap(a, b);
                }
            }
        }
        __syncthreads();
        for (int64_t stride = half / 2; stride > 0; stride /= 2) {
            for (int64_t i = threadIdx.x; i < n_pow2 / 2; i += KC_BLOCK) {
                const int64_t a = (i / stride) * 2 * stride + i % stride;
                const int64_t b = a + stride;
                if (b < n) {
                    uint32_t ka, kb;
                    int32_t ia, ib;
                    get(a, &ka, &ia);
                    get(b, &kb, &ib);
                    if (key_better(kb, ib, ka, ia)) {
                        swap(a, b);
                    }
                }
            }
            __syncthreads();
        }
    }
}

__global__ void __launch_bounds__(KC_BLOCK)
    topk_kernel(const float *vals, int64_t n, int64_t k, int32_t *scratch, int32_t *idx_out,
                int64_t *n_out, int32_t *status_word)
{
    __shared__ uint32_t sort_key[TOPK_SHARED_SORT];
    __shared__ int32_t sort_idx[TOPK_SHARED_SORT];
    __shared__ int hist[TOPK_RADIX_BINS];
    __shared__ int warp_counts[KC_BLOCK / KC_WARP];
    __shared__ int n_nan;
    __shared__ unsigned long long n_valid;
    __shared__ uint32_t prefix;
    __shared__ int64_t remaining;
    const int tid = (int)threadIdx.x;

    if (tid == 0) {
        n_nan = 0;
        n_valid = 0;
    }
    __syncthreads();
    {
        int my_nan = 0;
        unsigned long long my_valid = 0;
        for (int64_t i = tid; i < n; i += KC_BLOCK) {
            const float v = vals[i];
            my_nan |= isnan(v) ? 1 : 0;
            my_valid += (!isnan(v) && v != -INFINITY) ? 1u : 0u;
        }
        if (my_nan != 0) {
            atomicOr(&n_nan, 1);
        }
        atomicAdd(&n_valid, my_valid);
    }
    __syncthreads();
    if (n_nan != 0) {
        if (tid == 0 && status_word != NULL) {
            *n_out = 0; /* deferred status: an empty selection, the word's bit */
            atomicOr(status_word, KERN_STATUS_TOPK_NAN);
        } else if (tid == 0) {
            *n_out = TOPK_NAN;
        }
        return;
    }
    const int64_t kk = k < (int64_t)n_valid ? k : (int64_t)n_valid;
    if (kk == 0) {
        if (tid == 0) {
            *n_out = 0;
        }
        return;
    }

    /* radix select of the kk-th largest key (skipped when every valid value is taken) */
    const int take_all = kk == (int64_t)n_valid;
    uint32_t mask = 0u;
    if (tid == 0) {
        prefix = 0u;
        remaining = kk;
    }
    __syncthreads();
    for (int shift = 32 - TOPK_RADIX_BITS; !take_all && shift >= 0; shift -= TOPK_RADIX_BITS) {
        for (int b = tid; b < TOPK_RADIX_BINS; b += KC_BLOCK) {
            hist[b] = 0;
        }
        __syncthreads();
        const uint32_t want = prefix;
        for (int64_t i = tid; i < n; i += KC_BLOCK) {
            const float v = vals[i];
            const uint32_t key = order_key(v);
            if (v != -INFINITY && (key & mask) == want) {
                atomicAdd(&hist[(key >> shift) & (TOPK_RADIX_BINS - 1)], 1);
            }
        }
        __syncthreads();
        if (tid == 0) {
            int64_t above = 0;
            int b = TOPK_RADIX_BINS - 1;
            while (b > 0 && above + hist[b] < remaining) {
                above += hist[b];
                b--;
            }
            remaining -= above;
            prefix = want | ((uint32_t)b << shift);
        }
        mask |= (uint32_t)(TOPK_RADIX_BINS - 1) << shift;
        __syncthreads();
    }
    /* take_all: threshold below every valid key, nothing taken at equality */
    const uint32_t thresh = take_all ? TOPK_NEG_INF_KEY : prefix;
    const int64_t need_eq = take_all ? 0 : remaining;

    /* compact the selection into scratch in index order */
    int64_t n_sel = 0;
    int64_t n_eq = 0;
    for (int64_t base = 0; base < n; base += KC_BLOCK) {
        const int64_t i = base + tid;
        int is_gt = 0;
        int is_eq = 0;
        if (i < n) {
            const float v = vals[i];
            const uint32_t key = order_key(v);
            is_gt = v != -INFINITY && key > thresh;
            is_eq = v != -INFINITY && key == thresh;
        }
        int eq_total;
        const int eq_rank = block_rank(is_eq, warp_counts, &eq_total);
        const int take = is_gt || (is_eq && n_eq + eq_rank < need_eq);
        int sel_total;
        const int sel_rank = block_rank(take, warp_counts, &sel_total);
        if (take) {
            scratch[n_sel + sel_rank] = (int32_t)i;
        }
        n_eq += eq_total;
        n_sel += sel_total;
    }
    __syncthreads();

    /* sort best first */
    if (n_sel <= TOPK_SHARED_SORT) {
        for (int64_t i = tid; i < n_sel; i += KC_BLOCK) {
            sort_idx[i] = scratch[i];
            sort_key[i] = order_key(vals[scratch[i]]);
        }
        __syncthreads();
        bitonic_sort(
            n_sel,
            [&](int64_t i, uint32_t *key, int32_t *idx) {
                *key = sort_key[i];
                *idx = sort_idx[i];
            },
            [&](int64_t a, int64_t b) {
                const uint32_t tk = sort_key[a];
                const int32_t ti = sort_idx[a];
                sort_key[a] = sort_key[b];
                sort_idx[a] = sort_idx[b];
                sort_key[b] = tk;
                sort_idx[b] = ti;
            });
        for (int64_t i = tid; i < n_sel; i += KC_BLOCK) {
            idx_out[i] = sort_idx[i];
        }
    } else {
        bitonic_sort(
            n_sel,
            [&](int64_t i, uint32_t *key, int32_t *idx) {
                *idx = scratch[i];
                *key = order_key(vals[*idx]);
            },
            [&](int64_t a, int64_t b) {
                const int32_t t = scratch[a];
                scratch[a] = scratch[b];
                scratch[b] = t;
            });
        for (int64_t i = tid; i < n_sel; i += KC_BLOCK) {
            idx_out[i] = scratch[i];
        }
    }
    if (tid == 0) {
        *n_out = n_sel;
    }
}

extern "C" tdm_status_t kern_topk_cuda(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                                       int32_t *scratch, int32_t *idx_out, int64_t *n_out)
{
    cudaStream_t stream = kc_stream(ctx);
    int64_t n_host = 0;
    tdm_status_t status;

    if (vals == NULL || n_out == NULL || k < 0 || n < 0 || (k > 0 && idx_out == NULL) ||
        (n > 0 && scratch == NULL) || n > INT32_MAX) {
        return TDM_ERR_INVALID_ARG;
    }
    topk_kernel<<<1, KC_BLOCK, 0, stream>>>(vals, n, k, scratch, idx_out, n_out,
                                            ctx != NULL ? ctx->status_word : NULL);
    status = kc_launch_status("topk_cuda", n, k);
    if (status == TDM_OK && ctx != NULL && ctx->status_word != NULL) {
        return TDM_OK; /* a NaN is reported through the status word: no wait */
    }
    if (status == TDM_OK) {
        status = kc_call_status(
            "topk_cuda", "cudaMemcpyAsync",
            cudaMemcpyAsync(&n_host, n_out, sizeof(n_host), cudaMemcpyDeviceToHost, stream));
    }
    if (status == TDM_OK) {
        status =
            kc_call_status("topk_cuda", "cudaStreamSynchronize", cudaStreamSynchronize(stream));
    }
    if (status == TDM_OK && n_host == TOPK_NAN) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "topk_cuda: NaN among the values: n=%lld k=%lld",
                (long long)n, (long long)k);
        status = TDM_ERR_INTERNAL;
    }
    return status;
}
