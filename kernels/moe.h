/* moe.h - MoE routing and the SwiGLU expert hidden (MODEL.md 5.5, R8).
 *
 * Owns nothing; the expert GEMMs are kern_gemm_fn. Tie order of the expert top-k: value
 * descending, then expert id ascending (MODEL.md 5.4 [tandem]).
 */
#ifndef TANDEM_KERNELS_MOE_H
#define TANDEM_KERNELS_MOE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Most routed experts per token the kernels support. */
#define KERN_MOE_MAX_K 16

/*
 * kern_moe_route_fn - per row: s_e = sqrt(softplus(logit_e)) (FP32; softplus = log1p(exp(-|z|))
 * + max(z, 0)), selection = top K of s_e + bias_e (tie order above), returned ascending by id;
 * weights w = (rho s_e) / (sum_sel s + 1e-20) with the sum in ascending id.
 *
 * logits: [n_rows, E] FP32 router logits.  bias: [E].
 * ids_out: [n_rows, K] int32 ascending.  weights_out: [n_rows, K] f32 (same order).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (K > E, K > 16), or TDM_ERR_INTERNAL when a NaN reaches
 * the top-k (outputs then unspecified).
 */
typedef tdm_status_t kern_moe_route_fn(kern_ctx_t *ctx, const float *logits, const float *bias,
                                       int64_t n_rows, int64_t E, int K, float rho,
                                       int32_t *ids_out, float *weights_out);
kern_moe_route_fn kern_moe_route_cpu;

/*
 * kern_swiglu_fn - h[r,i] = BF16(w[r] * (silu(min(g, lambda)) * clamp(u, -lambda, lambda)))
 * with silu(z) = z * sigmoid(z), sigmoid(z) = 1 / (1 + exp(-z)), FP32 (R8).
 * gu: [n_rows, 2*I]: g in [:, 0:I], u in [:, I:2I] (BF16 values).  w: [n_rows] (NULL = 1).
 * h_out: [n_rows, I].
 */
typedef tdm_status_t kern_swiglu_fn(kern_ctx_t *ctx, const float *gu, const float *w,
                                    int64_t n_rows, int64_t I, float lambda, float *h_out);
kern_swiglu_fn kern_swiglu_cpu;

#ifdef __cplusplus
}
#endif

#endif
