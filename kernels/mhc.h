/* mhc.h - manifold-constrained hyper-connections (MODEL.md 5.1) and the Engram gate (5.6): the
 * per-site coefficients (pre, post, Sinkhorn-normalised M), the collapse of the m residual
 * streams and the stream update, plus the Engram stream update.
 *
 * Owns nothing; knows nothing of layers or weights' storage. FP32 math, BF16 outputs where
 * MODEL.md R1/R2/R9 say so. Sums over a few elements (the m streams, a row or column of M, the
 * softmax) run in ascending index order; the sums of squares of the RMS scales and the Engram
 * gate's dot over H run in the 16-lane order of kern_sum_sq_cpu (kernels/norm.h). exp is kern_exp
 * and sigmoid(z) = 1 / (1 + kern_exp(-z)) (kernels/attention.h). With those fixed orders and
 * functions the CUDA kernels give the CPU's bits (since 2026-12-04; before, libm's expf and the
 * ascending sums made CUDA differ by a few ulp).
 */
#ifndef TANDEM_KERNELS_MHC_H
#define TANDEM_KERNELS_MHC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Largest m (hc_mult) the kernels support. */
#define KERN_MHC_MAX_STREAMS 16

/*
 * kern_mhc_params_t - one site's constants: base [(2+m)m], scale [3] (sigma_0 pre, sigma_1
 * post, sigma_2 comb), m, Sinkhorn iterations, eps = rms_norm_eps, eps_hc = hc_eps (FP32).
 */
typedef struct {
    const float *base;
    const float *scale;
    int m;
    int iters;
    float eps;
    float eps_hc;
} kern_mhc_params_t;

/*
 * kern_mhc_coeffs_fn - for each row r with flattened streams x [m*H] and raw mix F.x [(2+m)m]
 * (an FP32 GEMM output): mix = raw * kern_rms_scale_cpu(x, m*H, eps);
 * pre_i = sigmoid(mix_i s0 + b_i) + eps_hc; post_i = 2 sigmoid(mix_{m+i} s1 + b_{m+i});
 * C_ij = mix_{2m+mi+j} s2 + b_{2m+mi+j}; M = softmax_j(C) + eps_hc (max subtracted first);
 * column normalise; then iters-1 times row then column normalise (each divides by sum + eps_hc).
 *
 * x: [n_rows, m*H].  mix_raw: [n_rows, (2+m)m].  pre_out, post_out: [n_rows, m].
 * M_out: [n_rows, m, m] (M[i][j], i = source stream, j = destination). All f32.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, m out of 1..16).
 */
typedef tdm_status_t kern_mhc_coeffs_fn(kern_ctx_t *ctx, const kern_mhc_params_t *params,
                                        const float *x, int64_t n_rows, int64_t H,
                                        const float *mix_raw, float *pre_out, float *post_out,
                                        float *M_out);
kern_mhc_coeffs_fn kern_mhc_coeffs_cpu;

/*
 * kern_mhc_collapse_fn - y[r,:] = BF16(sum_i pre[r,i] X[r,i,:]) (R2), i ascending.
 * pre: [n_rows, m].  X: [n_rows, m, H].  y_out: [n_rows, H] (must not alias pre or X).
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (y untouched) for NULL pointers, m outside
 * [1, KERN_MHC_MAX_STREAMS] or H <= 0.
 */
typedef tdm_status_t kern_mhc_collapse_fn(kern_ctx_t *ctx, const float *pre, const float *X,
                                          int64_t n_rows, int m, int64_t H, float *y_out);
kern_mhc_collapse_fn kern_mhc_collapse_cpu;

/*
 * kern_mhc_update_fn - X'[r,j,:] = BF16(post[r,j] F[r,:] + sum_i M[r,i,j] X[r,i,:]) (R1), in
 * place on X; the i-sum is FP32 in ascending i, then post_j F added.
 * post: [n_rows, m].  F: [n_rows, H] (the sublayer output).  M: [n_rows, m, m]. post, F and M
 * must not alias X (the CPU kernels read them once per call, before X is written).
 */
typedef tdm_status_t kern_mhc_update_fn(kern_ctx_t *ctx, const float *post, const float *F,
                                        const float *M, int64_t n_rows, int m, int64_t H, float *X);
kern_mhc_update_fn kern_mhc_update_cpu;

/*
 * kern_engram_gate_fn - the Engram stream update (MODEL.md 5.6, R9), in place on X: per row r
 * and stream i, gamma = (((dot * rho(X_i)) * rho(key_i)) / sqrtf(H), dot = sum_c ((X_ic qw_ic)
 * kw_ic) key_ic in the 16-lane order (lane j: fma of c = j, j + 16, ..., the tree, then the tail
 * past H - H % 16, as kern_sum_sq_cpu), rho = kern_rms_scale_cpu (kernels/norm.h);
 * g = sigmoid(sign(gamma) sqrt(max(|gamma|, 1e-6))), sign(0) = +; X_i = BF16(X_i + g value).
 * X: [n_rows, m, H].  kv: [n_rows, (m+1) H] = [key_0 .. key_{m-1}, value] (BF16 values).
 * qw, kw: [m, H] f32.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, m out of 1..16, H <= 0; X untouched).
 */
typedef tdm_status_t kern_engram_gate_fn(kern_ctx_t *ctx, float *X, const float *kv,
                                         const float *qw, const float *kw, int64_t n_rows, int m,
                                         int64_t H, float eps);
kern_engram_gate_fn kern_engram_gate_cpu;

#ifdef __cplusplus
}
#endif

#endif
