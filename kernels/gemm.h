/* gemm.h - dense matrix products of the forward pass: y = x . W^T with FP32 accumulation in a
 * fixed, batch-invariant order (MODEL.md 4, 5, 12.6).
 *
 * Owns the compute layout of weights (kern_mat_t): FP8 dense, MXFP4 expert and BF16 checkpoint
 * weights are dequantized exactly to BF16 once at load (MODEL.md 3: "Dequantizing to BF16 is
 * exact"); FP32 weights (mHC) stay FP32. The activation quantizer Q_act8 (R4) is a separate op
 * (kern_qdq_act8_fn) so one GEMM serves FP8, FP4 and BF16 weights alike.
 *
 * Batch invariance [tandem]: every output y[r, o] is computed the same way whatever n_rows, the
 * row's place in the batch, the thread split or the CPU's vector width: 16 partial sums, lane
 * j += w[k] * x[k] (one fused multiply-add) for k = j, j + 16, ... in ascending k, then a fixed
 * pairwise tree (lane j += lane j + 8, + 4, + 2, + 1). The plain C version and the AVX-512
 * version produce identical bits. This is what makes a batch of sequences bit-identical to each
 * sequence alone (MODEL.md 6(e)). Knows nothing of layers, checkpoints or quantization of
 * activations.
 */
#ifndef TANDEM_KERNELS_GEMM_H
#define TANDEM_KERNELS_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Inner dimensions must be a multiple of this (every model dimension is a multiple of 32). */
#define KERN_GEMM_K_MULTIPLE 16

/* Element type of a compute-layout weight matrix. */
typedef enum {
    KERN_MAT_BF16 = 0, /* uint16_t BF16 bits (FP8, FP4 and BF16 checkpoint weights) */
    KERN_MAT_F32 = 1,  /* float (mHC hc_*_fn) */
} kern_mat_dtype_t;

/*
 * kern_mat_t - a weight matrix [n_out, n_in] in compute layout, row-major, rows contiguous
 * (row o starts at data + o * n_in elements). Plain data; `data` is borrowed from whoever made
 * it (the model owns its weights). Host memory for the CPU backend.
 */
typedef struct {
    kern_mat_dtype_t dtype;
    int64_t n_out;
    int64_t n_in;
    const void *data;
} kern_mat_t;

/* kern_gemm flags. */
typedef enum {
    KERN_GEMM_OUT_F32 = 0,        /* y stays FP32 (mHC mixes, router, ratio-2 compressor, head) */
    KERN_GEMM_OUT_BF16 = 1u << 0, /* y rounded to BF16 (R3: every other linear) */
} kern_gemm_flags_t;

/*
 * kern_gemm_fn - y[r, o] = sum_k x[r, k] * W[o, k] for r < n_rows, o < w->n_out, accumulated in
 * FP32 in the batch-invariant order above, rounded to BF16 when flags has KERN_GEMM_OUT_BF16.
 *
 * w:     weight [n_out, n_in], n_in a multiple of KERN_GEMM_K_MULTIPLE.
 * x:     [n_rows, n_in] f32 with row stride ldx (>= n_in) elements.
 * y_out: [n_rows, n_out] f32 with row stride ldy (>= n_out), written; must not alias x.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (y untouched) for NULL pointers, n_rows < 0, bad
 * strides or n_in not a multiple of 16. Uses ctx->n_threads threads (split by output columns;
 * results do not depend on the split). Not thread-safe per ctx.
 */
typedef tdm_status_t kern_gemm_fn(kern_ctx_t *ctx, const kern_mat_t *w, const float *x,
                                  int64_t ldx, int64_t n_rows, uint32_t flags, float *y_out,
                                  int64_t ldy);
kern_gemm_fn kern_gemm_cpu;

/*
 * kern_gemm_ref_cpu - the plain-loop version of kern_gemm_cpu (same order, same bits; no vector
 * instructions, one thread). The test oracle and the fallback on CPUs without AVX-512.
 */
kern_gemm_fn kern_gemm_ref_cpu;

/*
 * kern_dot_cpu - sum_k a[k] b[k] for k < n (n a multiple of 16) in the order above (16 FMA lanes,
 * fixed tree): bit-identical to one output of kern_gemm_cpu. Host memory; thread-safe.
 */
float kern_dot_cpu(const float *a, const float *b, int64_t n);

/*
 * kern_qdq_act8_fn - Q_act8 quantize-dequantize of n_rows rows of dim elements (MODEL.md 4, R4):
 * the exact FP32 operand an FP8- or FP4-weight GEMM takes.
 *
 * x: [n_rows, dim] f32 contiguous.  y_out: [n_rows, dim] f32, written; may alias x.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (dim not a multiple of 32, NULL). Bit-identical to
 * kern_quant_act8 followed by kern_dequant_act8.
 */
typedef tdm_status_t kern_qdq_act8_fn(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                      int64_t dim, float *y_out);
kern_qdq_act8_fn kern_qdq_act8_rows_cpu;

/*
 * kern_mat_bf16_from_fp8 - dequantize an FP8 dense weight (E4M3 codes [n_out, n_in], UE8M0
 * scales [ceil(n_out/32), ceil(n_in/32)]) into BF16 bits bf16_out [n_out, n_in]. Exact. Host.
 */
tdm_status_t kern_mat_bf16_from_fp8(const uint8_t *codes, const uint8_t *scales, int64_t n_out,
                                    int64_t n_in, uint16_t *bf16_out);

/*
 * kern_mat_bf16_from_mxfp4 - dequantize a packed MXFP4 expert weight ([n_out, n_in/2] bytes,
 * UE8M0 scales [n_out, n_in/32]) into BF16 bits bf16_out [n_out, n_in]. Exact. Host.
 */
tdm_status_t kern_mat_bf16_from_mxfp4(const uint8_t *packed, const uint8_t *scales,
                                      int64_t n_out, int64_t n_in, uint16_t *bf16_out);

#ifdef __cplusplus
}
#endif

#endif
