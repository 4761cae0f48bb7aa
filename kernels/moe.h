/* moe.h - MoE routing, the SwiGLU expert hidden and the routed experts of a layer in one call
 * (MODEL.md 5.5, R8).
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
#include "kernels/gemm.h"

/* Most routed experts per token the kernels support. */
#define KERN_MOE_MAX_K 16

/*
 * kern_moe_route_fn - per row: s_e = sqrt(softplus(logit_e)) (FP32; softplus =
 * kern_log1p(kern_exp(-|z|)) + max(z, 0), kernels/attention.h: every backend's bits), selection =
 * top K of s_e + bias_e (tie order above), returned ascending by id; weights w = (rho s_e) /
 * (sum_sel s + 1e-20) with the sum in ascending id.
 *
 * logits: [n_rows, E] FP32 router logits.  bias: [E].
 * ids_out: [n_rows, K] int32 ascending.  weights_out: [n_rows, K] f32 (same order).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (K > E, K > 16), or TDM_ERR_INTERNAL when a NaN reaches
 * the top-k or fewer than K scores are above -inf (outputs then unspecified). With
 * ctx->status_word set (kernels/backend.h) such a row instead gets ids 0 .. K-1 with weight 0,
 * KERN_STATUS_ROUTE_NAN is ORed into the word and the call returns TDM_OK (CUDA: no wait).
 */
typedef tdm_status_t kern_moe_route_fn(kern_ctx_t *ctx, const float *logits, const float *bias,
                                       int64_t n_rows, int64_t E, int K, float rho,
                                       int32_t *ids_out, float *weights_out);
kern_moe_route_fn kern_moe_route_cpu;

/*
 * kern_swiglu_fn - h[r,i] = BF16(w[r] * (silu(min(g, lambda)) * clamp(u, -lambda, lambda)))
 * with silu(z) = z * sigmoid(z), sigmoid(z) = 1 / (1 + exp(-z)), FP32 (R8); exp = kern_exp
 * (kernels/attention.h).
 * gu: [n_rows, 2*I]: g in [:, 0:I], u in [:, I:2I] (BF16 values).  w: [n_rows] (NULL = 1).
 * h_out: [n_rows, I].
 */
typedef tdm_status_t kern_swiglu_fn(kern_ctx_t *ctx, const float *gu, const float *w,
                                    int64_t n_rows, int64_t I, float lambda, float *h_out);
kern_swiglu_fn kern_swiglu_cpu;

/*
 * kern_moe_experts_t - the routed experts of one MoE layer as kern_moe_ffn_fn reads them
 * (MODEL.md 5.5). w1, w3: [n_experts] gate and up matrices [I, H]; w2: [n_experts] down
 * matrices [H, I]; host arrays of descriptors whose data and scales are backend memory, every
 * expert of one dtype and shape. An expert this model does not hold (an expert-parallel shard)
 * has NULL data and may receive no rows. table: backend memory holding the
 * KERN_MOE_TABLE_LEN(n_experts) pointers kern_moe_table_fill writes (made once at load), for
 * backends that run every expert in one launch (CUDA reads only the table); may be NULL for a
 * table whose host_memory is 1. Plain data; everything borrowed from the model.
 */
typedef struct {
    int64_t n_experts;
    const kern_mat_t *w1;
    const kern_mat_t *w3;
    const kern_mat_t *w2;
    const void *const *table;
} kern_moe_experts_t;

/* Pointers in a kern_moe_experts_t table. */
#define KERN_MOE_TABLE_LEN(n_experts) (6 * (n_experts))

/*
 * kern_moe_table_fill - the experts' data and scale pointers in table order into the host array
 * table_out [KERN_MOE_TABLE_LEN(ex->n_experts)]: w1 data [0, E), w1 scales [E, 2E), w3 data,
 * w3 scales, w2 data, w2 scales (NULL where an expert has none). The caller copies it to
 * backend memory. Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, n_experts < 1).
 */
tdm_status_t kern_moe_table_fill(const kern_moe_experts_t *ex, const void **table_out);

/*
 * kern_moe_ffn_fn - the routed experts of one MoE layer over the pairs kern_expert_rows_fn
 * grouped by expert (MODEL.md 5.5, R8), with the group offsets read by the op in backend memory
 * (the host never needs them: no wait on a device). For each expert e ascending, its pairs
 * p in [offsets[e], offsets[e + 1]) (token t = rows[p], routing weight wts[p]):
 *   gu = [BF16(x_t W1_e^T), BF16(x_t W3_e^T)], h = Q_act8(swiglu(gu; wts[p], lambda)),
 *   y = BF16(h W2_e^T), acc[t] += y (FP32),
 * which is exactly what rows_gather, gemm (w1, w3), swiglu, qdq_act8, gemm (w2) and
 * rows_scatter_add called per expert give: the same bits, every token's additions in ascending
 * expert order.
 *
 * xq: [n_tokens, H] the Q_act8 operand.  offsets: [E + 1], rows: [n_pairs] int64, wts:
 * [n_pairs] f32 (kern_expert_rows_fn's outputs; n_pairs = N * K = offsets[E]).  acc:
 * [n_tokens, H] f32, added to.  scratch: [KERN_MOE_SCRATCH_FLOATS(scratch_rows, H, I)] f32
 * laid out as kern_moe_scratch_split says, scratch_rows >=
 * min(n_tokens, n_pairs) (CUDA works through the pairs scratch_rows at a time).
 * active_out: [E] int64 in backend memory; active_out[e] += 1 for each expert e with at least
 * one pair, on success only (the caller's count of expert weights read); NULL: not counted.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, shapes that disagree with the matrices,
 * scratch_rows too small, no table on a backend that needs one; on the CPU also an offset
 * outside [0, n_pairs] or out of order, a row outside [0, n_tokens), rows given to an expert
 * without data; acc may then hold some experts' sums), or the GEMMs' errors.
 */
typedef tdm_status_t kern_moe_ffn_fn(kern_ctx_t *ctx, const kern_moe_experts_t *ex, const float *xq,
                                     int64_t n_tokens, int64_t H, int64_t I, const int64_t *offsets,
                                     const int64_t *rows, const float *wts, int64_t n_pairs,
                                     float lambda, float *scratch, int64_t scratch_rows, float *acc,
                                     int64_t *active_out);
kern_moe_ffn_fn kern_moe_ffn_cpu;

/* Floats of a kern_moe_ffn_fn scratch of `rows` pairs. */
#define KERN_MOE_SCRATCH_FLOATS(rows, H, I) ((rows) * (2 * (H) + 3 * (I)))

/* kern_moe_scratch_split - the scratch layout every backend and the engine share: xe
 * [rows, H] (gathered token rows), gu [rows, 2I] (gate | up), h [rows, I] (hidden), ye
 * [rows, H] (expert outputs), one after the other from scratch. */
static inline void kern_moe_scratch_split(float *scratch, int64_t rows, int64_t H, int64_t I,
                                          float **xe, float **gu, float **h, float **ye)
{
    *xe = scratch;
    *gu = scratch + rows * H;
    *h = *gu + rows * 2 * I;
    *ye = *h + rows * I;
}

#ifdef __cplusplus
}
#endif

#endif
