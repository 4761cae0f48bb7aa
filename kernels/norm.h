/* norm.h - RMSNorm (MODEL.md 4 R2, 5): y = BF16((x * (mean(x^2) + eps)^-1/2) * gamma).
 *
 * Owns nothing; knows nothing of layers. The mean is an FP32 sum in ascending index order
 * divided by dim; the scale is 1 / sqrtf(mean + eps) (the reference's choice 9).
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

/* kern_rms_scale_cpu - (mean(x^2) + eps)^-1/2 of one row x [n], FP32 (as kern_rmsnorm_fn). */
float kern_rms_scale_cpu(const float *x, int64_t n, float eps);

/*
 * kern_rms_scales_cpu - scales_out[r] = kern_rms_scale_cpu(x + r * ldx, n, eps) for r < n_rows,
 * to the bit: each row's sum still runs alone in ascending index order, but KERN_RMS_ROWS rows'
 * sums advance side by side (independent chains instead of one add-latency-bound chain).
 *
 * x: [n_rows, n] f32, row stride ldx (>= n).  scales_out: [n_rows] f32, written.
 * n_rows >= 0, n >= 1; arguments are the caller's to check (a helper of the CPU kernels).
 */
void kern_rms_scales_cpu(const float *x, int64_t ldx, int64_t n_rows, int64_t n, float eps,
                         float *scales_out);

/* Rows whose sums kern_rms_scales_cpu runs side by side: KERN_RMS_VEC_ROWS (one per lane) on a
 * CPU with a vector set when more than half of them are left, else KERN_RMS_ROWS (scalar
 * registers). */
#define KERN_RMS_ROWS     8
#define KERN_RMS_VEC_ROWS 16

#ifdef __cplusplus
}
#endif

#endif
