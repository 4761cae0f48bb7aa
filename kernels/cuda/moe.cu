/* moe.cu - CUDA MoE routing and SwiGLU (kern_moe_route_cuda, kern_swiglu_cuda; kernels/moe.h,
 * MODEL.md 5.5, R8).
 *
 * Routing: one block per row. s_e = sqrt(softplus(logit_e)) with the device expf/log1pf
 * (within 2 ulp of the host's), so a selection can differ from the CPU's only where two
 * biased scores are within a few ulp (a near-tie, MODEL.md 6(e)). The top-K is K rounds of a
 * block arg-max in the [tandem] order (value descending, id ascending): a total order, so the
 * result does not depend on how the reduction is split. The ids are sorted ascending and the
 * weights summed in that order, as on the CPU. A NaN score, or fewer than K candidates above
 * -inf, makes the row's first id -1; the host copies the first id of each row back and returns
 * TDM_ERR_INTERNAL, so this op waits for its stream (the contract returns the NaN status).
 *
 * SwiGLU: elementwise, the CPU's arithmetic with the device expf.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define MOE_MAX_E        4096 /* as the CPU router's limit */
#define MOE_CHECK_ROWS   1024 /* rows whose first id is copied back per cudaMemcpy2D */
#define MOE_ROUTE_FAILED (-1) /* first id of a row with a NaN or too few candidates */

/* a is better than b in tie order (value descending, then index ascending); no NaN here. */
__device__ __forceinline__ int better_dev(float va, int ia, float vb, int ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Block arg-max in tie order of (v, i); i < 0 means "no candidate". All threads get it. */
__device__ __forceinline__ void block_argmax(float *v, int *i, float *red_v, int *red_i)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int warp = (int)(threadIdx.x / KC_WARP);

    for (int s = KC_WARP / 2; s >= 1; s /= 2) {
        const float ov = __shfl_down_sync(KC_FULL_MASK, *v, s);
        const int oi = __shfl_down_sync(KC_FULL_MASK, *i, s);
        if (oi >= 0 && (*i < 0 || better_dev(ov, oi, *v, *i))) {
            *v = ov;
            *i = oi;
        }
    }
    if (lane == 0) {
        red_v[warp] = *v;
        red_i[warp] = *i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < KC_BLOCK / KC_WARP; w++) {
            if (red_i[w] >= 0 &&
                (red_i[0] < 0 || better_dev(red_v[w], red_i[w], red_v[0], red_i[0]))) {
                red_v[0] = red_v[w];
                red_i[0] = red_i[w];
            }
        }
    }
    __syncthreads();
    *v = red_v[0];
    *i = red_i[0];
    __syncthreads();
}

__global__ void __launch_bounds__(KC_BLOCK)
    moe_route_kernel(const float *logits, const float *bias, int64_t n_rows, int E, int K,
                     float rho, int32_t *ids_out, float *weights_out)
{
    __shared__ float s[MOE_MAX_E];
    __shared__ float biased[MOE_MAX_E];
    __shared__ float red_v[KC_BLOCK / KC_WARP];
    __shared__ int red_i[KC_BLOCK / KC_WARP];
    __shared__ int32_t sel[KERN_MOE_MAX_K];
    __shared__ int bad;
    const int tid = (int)threadIdx.x;

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        if (tid == 0) {
            bad = 0;
        }
        __syncthreads();
        for (int e = tid; e < E; e += KC_BLOCK) {
            const float z = logits[r * E + e];
            const float sp = __fadd_rn(log1pf(expf(-fabsf(z))), z > 0.0f ? z : 0.0f);
            s[e] = __fsqrt_rn(sp);
            biased[e] = __fadd_rn(s[e], bias[e]);
            if (isnan(biased[e])) {
                bad = 1;
            }
        }
        __syncthreads();
        for (int k = 0; k < K && bad == 0; k++) {
            float bv = -INFINITY;
            int bi = -1;
            for (int e = tid; e < E; e += KC_BLOCK) {
                if (biased[e] != -INFINITY && (bi < 0 || better_dev(biased[e], e, bv, bi))) {
                    bv = biased[e];
                    bi = e;
                }
            }
            block_argmax(&bv, &bi, red_v, red_i);
            if (tid == 0) {
                if (bi < 0) {
                    bad = 1;
                } else {
                    sel[k] = bi;
                    biased[bi] = -INFINITY; /* taken */
                }
            }
            __syncthreads();
        }
        if (tid == 0) {
            if (bad != 0) {
                ids_out[r * K] = MOE_ROUTE_FAILED;
            } else {
                float sum = 0.0f;
                for (int a = 1; a < K; a++) { /* ascending ids */
                    const int32_t v = sel[a];
                    int b = a - 1;
                    while (b >= 0 && sel[b] > v) {
                        sel[b + 1] = sel[b];
                        b--;
                    }
                    sel[b + 1] = v;
                }
                for (int a = 0; a < K; a++) {
                    sum = __fadd_rn(sum, s[sel[a]]);
                }
                for (int a = 0; a < K; a++) {
                    ids_out[r * K + a] = sel[a];
                    weights_out[r * K + a] =
                        __fdiv_rn(__fmul_rn(rho, s[sel[a]]), __fadd_rn(sum, 1e-20f));
                }
            }
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_moe_route_cuda(kern_ctx_t *ctx, const float *logits, const float *bias,
                                            int64_t n_rows, int64_t E, int K, float rho,
                                            int32_t *ids_out, float *weights_out)
{
    cudaStream_t stream = kc_stream(ctx);
    int32_t first_ids[MOE_CHECK_ROWS];
    tdm_status_t status;

    if (logits == NULL || bias == NULL || ids_out == NULL || weights_out == NULL || K < 1 ||
        K > KERN_MOE_MAX_K || K > E || E > MOE_MAX_E) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    moe_route_kernel<<<kc_grid(n_rows, 1), KC_BLOCK, 0, stream>>>(logits, bias, n_rows, (int)E, K,
                                                                  rho, ids_out, weights_out);
    status = kc_launch_status("moe_route_cuda", n_rows, E);
    for (int64_t r0 = 0; status == TDM_OK && r0 < n_rows; r0 += MOE_CHECK_ROWS) {
        const int64_t n = n_rows - r0 < MOE_CHECK_ROWS ? n_rows - r0 : MOE_CHECK_ROWS;
        status = kc_call_status("moe_route_cuda", "cudaMemcpy2DAsync",
                                cudaMemcpy2DAsync(first_ids, sizeof(int32_t), ids_out + r0 * K,
                                                  sizeof(int32_t) * (size_t)K, sizeof(int32_t),
                                                  (size_t)n, cudaMemcpyDeviceToHost, stream));
        if (status == TDM_OK) {
            status = kc_call_status("moe_route_cuda", "cudaStreamSynchronize",
                                    cudaStreamSynchronize(stream));
        }
        for (int64_t i = 0; status == TDM_OK && i < n; i++) {
            if (first_ids[i] == MOE_ROUTE_FAILED) {
                tdm_log(TDM_LOG_ERROR, KC_LOG,
                        "moe_route_cuda: NaN or fewer than K finite scores: row=%lld E=%lld "
                        "K=%d",
                        (long long)(r0 + i), (long long)E, K);
                status = TDM_ERR_INTERNAL;
            }
        }
    }
    return status;
}

__global__ void __launch_bounds__(KC_BLOCK)
    swiglu_kernel(const float *gu, const float *w, int64_t n_rows, int64_t I, float lambda,
                  float *h)
{
    const int64_t n = n_rows * I;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / I;
        const int64_t i = e % I;
        const float wr = w != NULL ? w[r] : 1.0f;
        const float g = gu[r * 2 * I + i];
        const float u = gu[r * 2 * I + I + i];
        const float gm = g < lambda ? g : lambda;
        const float uc = u < -lambda ? -lambda : (u > lambda ? lambda : u);
        const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gm)));
        h[e] = kc_bf16_round(__fmul_rn(wr, __fmul_rn(__fmul_rn(gm, sig), uc)));
    }
}

extern "C" tdm_status_t kern_swiglu_cuda(kern_ctx_t *ctx, const float *gu, const float *w,
                                         int64_t n_rows, int64_t I, float lambda, float *h_out)
{
    if (gu == NULL || h_out == NULL || I <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    swiglu_kernel<<<kc_grid(n_rows * I, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(gu, w, n_rows, I,
                                                                                  lambda, h_out);
    return kc_launch_status("swiglu_cuda", n_rows, I);
}
