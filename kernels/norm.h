/* norm.h - RMSNorm (MODEL.md 4 R2, 5): y = BF16((x * (mean(x^2) + eps)^-1/2) * gamma).
 *
 * Owns nothing; knows nothing of layers. The mean is the FP32 sum of squares in the 16-lane order
 * of kernels/gemm.h (kern_sum_sq_cpu below) divided by dim; the scale is 1 / sqrtf(mean + eps)
 * (the reference's choice 9). MODEL.md leaves the summation order open (12.6); Tandem fixes this
 * one on every backend so that a CUDA RMSNorm is the CPU's bits (until 2026-12-04 the CPU summed
 * in ascending index order, which a GPU cannot do fast, and CUDA differed by one BF16 ulp).
 */
#ifndef TANDEM_KERNELS_NORM_H
#define TANDEM_KERNELS_NORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/*
 * kern_rmsnorm_fn - for each row r: y[r,:] = BF16((x[r,:] * rsqrt(mean(x[r,:]^2) + eps)) * gamma).
 *
 * x:     [n_rows, dim] f32, row stride ldx.   gamma: [dim] f32 (BF16 weights widened).
 * y_out: [n_rows, dim] f32 (BF16 values), row stride ldy; may alias x (same stride).
 * eps:   config rms_norm_eps rounded to FP32.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, dim <= 0). Source: Zhang & Sennrich 2019.
 */
typedef tdm_status_t kern_rmsnorm_fn(kern_ctx_t *ctx, const float *x, int64_t ldx, int64_t n_rows,
                                     int64_t dim, const float *gamma, float eps, float *y_out,
                                     int64_t ldy);
kern_rmsnorm_fn kern_rmsnorm_cpu;

/*
 * kern_sum_sq_cpu - sum_i x[i]^2 for i < n (n >= 0) in the 16-lane order of kernels/gemm.h: lane j
 * (j < 16) starts at 0.0f and accumulates fma(x[i], x[i], lane) for i = j, j + 16, ... below
 * n16 = n - n % 16, ascending; the fixed tree (lane j += lane j + s for s = 8, 4, 2, 1) leaves
 * the sum in lane 0; then the tail i = n16 .. n - 1 ascending: sum = fma(x[i], x[i], sum).
 * For n a multiple of 16 this is kern_dot_cpu(x, x, n) (the vector paths of every instruction
 * set); the CUDA kernels compute it on a half-warp (kc_dot16 in kernels/cuda/cuda_common.cuh),
 * the same bits. Host memory; pure; thread-safe.
 */
float kern_sum_sq_cpu(const float *x, int64_t n);

/* kern_rms_scale_cpu - 1 / sqrtf(kern_sum_sq_cpu(x, n) / n + eps) of one row x [n], FP32 (as
 * kern_rmsnorm_fn), n >= 1. */
float kern_rms_scale_cpu(const float *x, int64_t n, float eps);

/*
 * kern_rms_scales_cpu - scales_out[r] = kern_rms_scale_cpu(x + r * ldx, n, eps) for r < n_rows.
 *
 * x: [n_rows, n] f32, row stride ldx (>= n).  scales_out: [n_rows] f32, written.
 * n_rows >= 0, n >= 1; arguments are the caller's to check (a helper of the CPU kernels).
 */
void kern_rms_scales_cpu(const float *x, int64_t ldx, int64_t n_rows, int64_t n, float eps,
                         float *scales_out);

#ifdef __cplusplus
}
#endif

#endif
