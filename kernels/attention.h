/* attention.h - attention with sinks over an explicit key set (MODEL.md 5.2, R7) and the
 * ratio-2 compressor's gated pooling (5.3).
 *
 * Owns nothing; the engine gathers each query's key set (window entries oldest to newest, then
 * selected compressed rows ascending) as dequantized FP32 rows. MQA: one latent is both key and
 * value for every head.
 */
#ifndef TANDEM_KERNELS_ATTENTION_H
#define TANDEM_KERNELS_ATTENTION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/*
 * kern_attention_fn - for one query position and each head h < n_heads:
 * z_e = (q_h . k_e) * scale (dot in the batch-invariant GEMM order), mu = max_e z_e,
 * p_e = exp(z_e - mu) / (sum_e' exp(z_e' - mu) + exp(sink_h - mu)) (sum ascending e),
 * o_h = BF16(sum_e p_e k_e) (ascending e). With no keys, o_h = 0.
 *
 * The key set is keys_a [n_a, d] followed by keys_b [n_b, d] (window entries, then selected
 * compressed rows), e = 0 .. n_a + n_b - 1 in that order; key = value (MQA latent).
 * q: [n_heads, d].  sink: [n_heads].  scale: 1/sqrt(d) (FP32).
 * o_out: [n_heads, d] f32 (BF16 values).  scratch: [n_heads * (n_a + n_b)] f32 work space (the
 * CPU's vector paths keep every head's logits).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, d not a multiple of 16, n_a or n_b < 0).
 */
typedef tdm_status_t kern_attention_fn(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                       int64_t n_a, const float *keys_b, int64_t n_b,
                                       const float *sink, int64_t n_heads, int64_t d, float scale,
                                       float *scratch, float *o_out);
kern_attention_fn kern_attention_cpu;

/*
 * kern_attention_sel_fn - kern_attention_fn with the selected part given in place: key n_a + i
 * is row sel[i] of rows [*, d] (i < n_b; every sel[i] >= 0 and below the caller's row count),
 * so the caller gathers nothing. Same operations in the same order: the bits of
 * kern_attention_fn over keys_b = those rows gathered.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (as kern_attention_fn; rows or sel NULL with n_b > 0,
 * a negative sel entry). Optional in kern_ops_t (NULL where a backend lacks it).
 */
typedef tdm_status_t kern_attention_sel_fn(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                           int64_t n_a, const float *rows, const int32_t *sel,
                                           int64_t n_b, const float *sink, int64_t n_heads,
                                           int64_t d, float scale, float *scratch, float *o_out);
kern_attention_sel_fn kern_attention_sel_cpu;

/*
 * kern_compress_pool_fn - ratio-r gated pooling of one group (MODEL.md 5.3): per channel c,
 * w_p = exp(b_p,c - max) / sum_p' exp(b_p',c - max), v_c = BF16(sum_p w_p a_p,c), p ascending.
 * a, b: [r, d] FP32 projections of the group's tokens.  v_out: [d].
 */
typedef tdm_status_t kern_compress_pool_fn(kern_ctx_t *ctx, const float *a, const float *b, int r,
                                           int64_t d, float *v_out);
kern_compress_pool_fn kern_compress_pool_cpu;

#ifdef __cplusplus
}
#endif

#endif
