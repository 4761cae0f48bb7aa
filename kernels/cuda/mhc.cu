/* mhc.cu - CUDA mHC coefficients, collapse and update, and the Engram gate (kernels/mhc.h;
 * MODEL.md 5.1, 5.6, R1, R2, R9).
 *
 * Every op is the CPU's arithmetic in the CPU's order, so its bits: collapse and update are
 * elementwise (i ascending, separate multiply and add); coeffs and engram_gate take their sums of
 * squares and the gate's dot over H in the 16-lane order on a half-warp (kc_dot16, as
 * kern_sum_sq_cpu), exp and sigmoid as kern_exp's steps (kc_exp, kc_sigmoid), the softmax and
 * Sinkhorn sums over m ascending on one thread per row or column of M. Every row's result
 * depends only on that row.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define MHC_MAX_MIX ((2 + KERN_MHC_MAX_STREAMS) * KERN_MHC_MAX_STREAMS)

__global__ void __launch_bounds__(KC_BLOCK)
    mhc_coeffs_kernel(const float *base, const float *scale, int m, int iters, float eps, float eh,
                      const float *x, int64_t n_rows, int64_t H, const float *mix_raw, float *pre,
                      float *post, float *M_out)
{
    __shared__ float rs_shared;
    __shared__ float mix[MHC_MAX_MIX];
    __shared__ float M[KERN_MHC_MAX_STREAMS * KERN_MHC_MAX_STREAMS];
    const int tid = (int)threadIdx.x;
    const int n_mix = (2 + m) * m;

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        if (tid < KC_WARP) { /* kern_rms_scale_cpu of the row's m*H values on warp 0 */
            const float *xr = x + r * m * H;
            const float sum = kc_dot16(xr, xr, m * H);
            if (tid == 0) {
                rs_shared = kc_rms_scale(sum, m * H, eps);
            }
        }
        __syncthreads();
        const float rs = rs_shared;

        for (int k = tid; k < n_mix; k += KC_BLOCK) {
            mix[k] = __fmul_rn(mix_raw[r * n_mix + k], rs);
        }
        __syncthreads();
        if (tid < m) {
            const int i = tid;
            float mx = -INFINITY;
            float sum = 0.0f;

            pre[r * m + i] =
                __fadd_rn(kc_sigmoid(__fadd_rn(__fmul_rn(mix[i], scale[0]), base[i])), eh);
            post[r * m + i] = __fmul_rn(
                2.0f, kc_sigmoid(__fadd_rn(__fmul_rn(mix[m + i], scale[1]), base[m + i])));
            for (int j = 0; j < m; j++) {
                const int k = 2 * m + m * i + j;
                const float c = __fadd_rn(__fmul_rn(mix[k], scale[2]), base[k]);
                M[i * m + j] = c;
                mx = c > mx ? c : mx;
            }
            for (int j = 0; j < m; j++) {
                M[i * m + j] = kc_exp(__fsub_rn(M[i * m + j], mx));
                sum = __fadd_rn(sum, M[i * m + j]);
            }
            for (int j = 0; j < m; j++) {
                M[i * m + j] = __fadd_rn(__fdiv_rn(M[i * m + j], sum), eh);
            }
        }
        __syncthreads();
        for (int it = 0; it < iters; it++) {
            if (it > 0) {
                if (tid < m) { /* row normalise: thread = row */
                    float sum = 0.0f;
                    for (int j = 0; j < m; j++) {
                        sum = __fadd_rn(sum, M[tid * m + j]);
                    }
                    for (int j = 0; j < m; j++) {
                        M[tid * m + j] = __fdiv_rn(M[tid * m + j], __fadd_rn(sum, eh));
                    }
                }
                __syncthreads();
            }
            if (tid < m) { /* column normalise: thread = column */
                float sum = 0.0f;
                for (int i = 0; i < m; i++) {
                    sum = __fadd_rn(sum, M[i * m + tid]);
                }
                for (int i = 0; i < m; i++) {
                    M[i * m + tid] = __fdiv_rn(M[i * m + tid], __fadd_rn(sum, eh));
                }
            }
            __syncthreads();
        }
        for (int k = tid; k < m * m; k += KC_BLOCK) {
            M_out[r * m * m + k] = M[k];
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_mhc_coeffs_cuda(kern_ctx_t *ctx, const kern_mhc_params_t *params,
                                             const float *x, int64_t n_rows, int64_t H,
                                             const float *mix_raw, float *pre_out, float *post_out,
                                             float *M_out)
{
    if (params == NULL || params->base == NULL || params->scale == NULL || x == NULL ||
        mix_raw == NULL || pre_out == NULL || post_out == NULL || M_out == NULL || params->m < 1 ||
        params->m > KERN_MHC_MAX_STREAMS || H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    mhc_coeffs_kernel<<<kc_grid(n_rows, 1), KC_BLOCK, 0, kc_stream(ctx)>>>(
        params->base, params->scale, params->m, params->iters, params->eps, params->eps_hc, x,
        n_rows, H, mix_raw, pre_out, post_out, M_out);
    return kc_launch_status("mhc_coeffs_cuda", n_rows, params->m * H);
}

__global__ void __launch_bounds__(KC_BLOCK)
    mhc_collapse_kernel(const float *pre, const float *X, int64_t n_rows, int m, int64_t H,
                        float *y)
{
    const int64_t n = n_rows * H;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / H;
        const int64_t c = e % H;
        float acc = 0.0f;

        for (int i = 0; i < m; i++) {
            acc = __fadd_rn(acc, __fmul_rn(pre[r * m + i], X[(r * m + i) * H + c]));
        }
        y[e] = kc_bf16_round(acc);
    }
}

extern "C" tdm_status_t kern_mhc_collapse_cuda(kern_ctx_t *ctx, const float *pre, const float *X,
                                               int64_t n_rows, int m, int64_t H, float *y_out)
{
    if (pre == NULL || X == NULL || y_out == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS || H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    mhc_collapse_kernel<<<kc_grid(n_rows * H, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(
        pre, X, n_rows, m, H, y_out);
    return kc_launch_status("mhc_collapse_cuda", n_rows, H);
}

/* One thread per (row, column c): reads the m old streams at c, writes the m new ones. */
__global__ void __launch_bounds__(KC_BLOCK)
    mhc_update_kernel(const float *post, const float *F, const float *M, int64_t n_rows, int m,
                      int64_t H, float *X)
{
    const int64_t n = n_rows * H;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / H;
        const int64_t c = e % H;
        const float *Mr = M + r * m * m;
        float *Xr = X + r * m * H;
        float old[KERN_MHC_MAX_STREAMS];

        for (int i = 0; i < m; i++) {
            old[i] = Xr[i * H + c];
        }
        for (int j = 0; j < m; j++) {
            float acc = 0.0f;
            for (int i = 0; i < m; i++) {
                acc = __fadd_rn(acc, __fmul_rn(Mr[i * m + j], old[i]));
            }
            Xr[j * H + c] = kc_bf16_round(__fadd_rn(__fmul_rn(post[r * m + j], F[e]), acc));
        }
    }
}

extern "C" tdm_status_t kern_mhc_update_cuda(kern_ctx_t *ctx, const float *post, const float *F,
                                             const float *M, int64_t n_rows, int m, int64_t H,
                                             float *X)
{
    if (post == NULL || F == NULL || M == NULL || X == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS ||
        H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    mhc_update_kernel<<<kc_grid(n_rows * H, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(
        post, F, M, n_rows, m, H, X);
    return kc_launch_status("mhc_update_cuda", n_rows, H);
}

/* One block per (row, stream): warp 0 the gate's dot, warp 1 the sum of squares of X_i, warp 2
 * that of key_i (each in the 16-lane order on its first half-warp, as the CPU), thread 0 the
 * gate, then the gated update of X_i. */
__global__ void __launch_bounds__(KC_BLOCK)
    engram_gate_kernel(float *X, const float *kv, const float *qw, const float *kw, int64_t n_rows,
                       int m, int64_t H, float eps, float sqrt_h)
{
    __shared__ float part[3];
    __shared__ float g_shared;
    const int64_t n_pairs = n_rows * m;
    const int tid = (int)threadIdx.x;
    const int warp = tid / KC_WARP;

    for (int64_t p = blockIdx.x; p < n_pairs; p += gridDim.x) {
        const int64_t r = p / m;
        const int i = (int)(p % m);
        float *xi = X + p * H;
        const float *kvr = kv + r * (m + 1) * H;
        const float *key = kvr + i * H;
        const float *value = kvr + m * H;

        if (warp == 0) { /* kern_engram_gate_cpu's gate_dot */
            const int lane = tid % KC_DOT_LANES;
            const int64_t n16 = H - H % KC_DOT_LANES;
            const float *q = qw + i * H;
            const float *k = kw + i * H;
            float acc = 0.0f;
            for (int64_t c = lane; c < n16; c += KC_DOT_LANES) {
                acc = __fmaf_rn(__fmul_rn(__fmul_rn(xi[c], q[c]), k[c]), key[c], acc);
            }
            acc = kc_lane_tree16(acc);
            if (tid == 0) {
                for (int64_t c = n16; c < H; c++) {
                    acc = __fmaf_rn(__fmul_rn(__fmul_rn(xi[c], q[c]), k[c]), key[c], acc);
                }
                part[0] = acc;
            }
        } else if (warp == 1) {
            const float sum = kc_dot16(xi, xi, H);
            if (tid == KC_WARP) {
                part[1] = sum;
            }
        } else if (warp == 2) {
            const float sum = kc_dot16(key, key, H);
            if (tid == 2 * KC_WARP) {
                part[2] = sum;
            }
        }
        __syncthreads();
        if (tid == 0) {
            const float rs_x = kc_rms_scale(part[1], H, eps);
            const float rs_k = kc_rms_scale(part[2], H, eps);
            const float gam = __fdiv_rn(__fmul_rn(__fmul_rn(part[0], rs_x), rs_k), sqrt_h);
            const float mag = fabsf(gam) > 1e-6f ? fabsf(gam) : 1e-6f;
            const float z = __fmul_rn(gam >= 0.0f ? 1.0f : -1.0f, __fsqrt_rn(mag));
            g_shared = kc_sigmoid(z);
        }
        __syncthreads();
        const float g = g_shared;

        for (int64_t c = tid; c < H; c += KC_BLOCK) {
            xi[c] = kc_bf16_round(__fadd_rn(xi[c], __fmul_rn(g, value[c])));
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_engram_gate_cuda(kern_ctx_t *ctx, float *X, const float *kv,
                                              const float *qw, const float *kw, int64_t n_rows,
                                              int m, int64_t H, float eps)
{
    if (X == NULL || kv == NULL || qw == NULL || kw == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS ||
        H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    engram_gate_kernel<<<kc_grid(n_rows * m, 1), KC_BLOCK, 0, kc_stream(ctx)>>>(
        X, kv, qw, kw, n_rows, m, H, eps, (float)sqrt((double)H));
    return kc_launch_status("engram_gate_cuda", n_rows, H);
}
