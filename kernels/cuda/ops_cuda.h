/* ops_cuda.h - declarations of the CUDA forward-pass kernels (kernels/cuda/<op>.cu) that fill the
 * "cuda" kern_ops_t in kernels/ops.c, plus kern_gemm_q_cuda, the quantized-weight GEMM on a
 * kern_qmat_t (the table's gemm takes the same FP8 / MXFP4 weights as kern_mat_t).
 *
 * Each kern_<op>_cuda has the function type of its module header (kernels/gemm.h ... topk.h)
 * and that header's contract; what differs is only where memory lives. Array arguments are
 * device memory; descriptor structs passed by pointer (kern_mat_t, kern_qmat_t,
 * kern_mhc_params_t) are host memory whose data pointers are device memory. Kernels run
 * asynchronously on ctx->cuda_stream (NULL ctx or stream: the default stream), except where a
 * contract returns a data-dependent status (moe_route and topk report a NaN as
 * TDM_ERR_INTERNAL, so they wait for their stream). A launch failure is logged once and
 * returned as TDM_ERR_INTERNAL. Built only with the CUDA backend (TANDEM_HAVE_CUDA); engine
 * code reaches these through kern_ops_t, never by name.
 */
#ifndef TANDEM_KERNELS_CUDA_OPS_CUDA_H
#define TANDEM_KERNELS_CUDA_OPS_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "kernels/glue.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/mem.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "kernels/topk.h"

kern_qdq_act8_fn kern_qdq_act8_rows_cuda;
kern_gemm_fn kern_gemm_cuda;
kern_rmsnorm_fn kern_rmsnorm_cuda;
kern_rope_fn kern_rope_cuda;
kern_mhc_coeffs_fn kern_mhc_coeffs_cuda;
kern_mhc_collapse_fn kern_mhc_collapse_cuda;
kern_mhc_update_fn kern_mhc_update_cuda;
kern_engram_gate_fn kern_engram_gate_cuda;
kern_moe_route_fn kern_moe_route_cuda;
kern_swiglu_fn kern_swiglu_cuda;
kern_moe_ffn_fn kern_moe_ffn_cuda;
kern_page_mark_fn kern_page_mark_cuda;
kern_attention_fn kern_attention_cuda;
kern_attention_rows_fn kern_attention_rows_cuda;
kern_compress_pool_fn kern_compress_pool_cuda;
kern_index_scores_fn kern_index_scores_cuda;
kern_topk_fn kern_topk_cuda;
kern_mem_alloc_fn kern_mem_alloc_cuda;
kern_mem_free_fn kern_mem_free_cuda;
kern_mem_copy_fn kern_mem_copy_cuda;
kern_mem_set_fn kern_mem_set_cuda;
kern_sync_fn kern_sync_cuda;
kern_host_register_fn kern_host_register_cuda;
kern_host_unregister_fn kern_host_unregister_cuda;
kern_embed_fn kern_embed_cuda;
kern_stream_mean_fn kern_stream_mean_cuda;
kern_bf16_round_fn kern_bf16_round_cuda;
kern_add_bf16_fn kern_add_bf16_cuda;
kern_add_fn kern_add_cuda;
kern_scale2_fn kern_scale2_cuda;
kern_rows_gather_fn kern_rows_gather_cuda;
kern_rows_scatter_add_fn kern_rows_scatter_add_cuda;
kern_cand_blocks_fn kern_cand_blocks_cuda;
kern_cand_mask_fn kern_cand_mask_cuda;
kern_argmax_fn kern_argmax_cuda;
kern_expert_rows_fn kern_expert_rows_cuda;
kern_dequant_rows_fn kern_dequant_rows_cuda;
kern_rows_ahead_fn kern_rows_ahead_cuda;
kern_ahead_wait_fn kern_ahead_wait_cuda;
kern_ahead_free_fn kern_ahead_free_cuda;

/* Storage format of a quantized weight (MODEL.md 3). */
typedef enum {
    KERN_QMAT_FP8 = 0,   /* E4M3 codes [n_out, n_in], UE8M0 [ceil(n_out/32), ceil(n_in/32)] */
    KERN_QMAT_MXFP4 = 1, /* packed E2M1 [n_out, n_in/2] (low nibble = even k), UE8M0
                            [n_out, n_in/32] */
} kern_qmat_format_t;

/*
 * kern_qmat_t - a weight [n_out, n_in] in its checkpoint format, row-major (MODEL.md 3:
 * FP8 W[o,i] = e4m3(code) 2^(S[o/32, i/32] - 127); MXFP4 W[o,i] = e2m1(nibble)
 * 2^(S[o, i/32] - 127)). Plain data; codes and scales are borrowed device memory.
 */
typedef struct {
    kern_qmat_format_t format;
    int64_t n_out;
    int64_t n_in;
    const uint8_t *codes;
    const uint8_t *scales;
} kern_qmat_t;

/*
 * kern_gemm_q_fn - kern_gemm_fn for a quantized weight, dequantized on the fly: every weight
 * element is BF16(e4m3 or e2m1 value * scale) (exact for every stored code, so equal to
 * kern_mat_bf16_from_fp8 / _mxfp4), and each output is accumulated in the batch-invariant
 * order of kernels/gemm.h. Bit-identical to dequantizing with kern_mat_bf16_from_* and calling
 * kern_gemm_cpu / kern_gemm_cuda on the BF16 matrix.
 *
 * x must already be the Q_act8 operand (kern_qdq_act8_fn, R4). n_in must be a multiple of 32.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (y untouched) for NULL pointers, bad shapes or strides,
 * or TDM_ERR_INTERNAL when the launch fails (logged).
 *
 * Not in kern_ops_t: the table's gemm (kern_gemm_cuda) takes the same weights as kern_mat_t
 * KERN_MAT_FP8 / KERN_MAT_MXFP4 (the engine's resident dtypes) and runs the same kernels.
 */
typedef tdm_status_t kern_gemm_q_fn(kern_ctx_t *ctx, const kern_qmat_t *w, const float *x,
                                    int64_t ldx, int64_t n_rows, uint32_t flags, float *y_out,
                                    int64_t ldy);
kern_gemm_q_fn kern_gemm_q_cuda;

/*
 * kc_gemm_grouped - the GEMM of many matrices of one shape and dtype in one launch (internal to
 * the CUDA backend: kern_moe_ffn_cuda's experts). Group g (0 <= g < n_groups) is the matrix
 * with proto's dtype and shape at data[g] / scales[g] (device arrays of device pointers; NULL
 * data: the group is skipped), applied to the rows [offsets[g], offsets[g + 1]) (a device
 * array) clipped to the window [p0, p1), which are rows (row - p0) of x [*, ldx] and y [*, ldy].
 * max_group_rows bounds every group's rows in the window (the launch's grid). Each output has
 * kern_gemm_cuda's bits (the same kernel and order). Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL,
 * shapes, n_groups outside 1..65535, quantized without scales), or TDM_ERR_INTERNAL (launch).
 */
tdm_status_t kc_gemm_grouped(kern_ctx_t *ctx, const kern_mat_t *proto, const void *const *data,
                             const void *const *scales, const int64_t *offsets, int64_t n_groups,
                             int64_t max_group_rows, int64_t p0, int64_t p1, const float *x,
                             int64_t ldx, uint32_t flags, float *y, int64_t ldy);

#ifdef __cplusplus
}
#endif

#endif
