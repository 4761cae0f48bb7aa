/* ops.c - the per-backend kernel tables of kernels/ops.h. */
#include "kernels/ops.h"

#include "kernels/backend.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

#include <stddef.h>

static const kern_ops_t ops_cpu = {
    .name = "cpu",
    .quant_act8 = kern_quant_act8_cpu,
    .quant_ckv = kern_quant_ckv_cpu,
    .quant_mx4 = kern_quant_mx4_cpu,
    .dequant_act8 = kern_dequant_act8_cpu,
    .dequant_ckv = kern_dequant_ckv_cpu,
    .dequant_mx4 = kern_dequant_mx4_cpu,
    .qdq_act8 = kern_qdq_act8_rows_cpu,
    .gemm = kern_gemm_cpu,
    .rmsnorm = kern_rmsnorm_cpu,
    .rope = kern_rope_cpu,
    .mhc_coeffs = kern_mhc_coeffs_cpu,
    .mhc_collapse = kern_mhc_collapse_cpu,
    .mhc_update = kern_mhc_update_cpu,
    .engram_gate = kern_engram_gate_cpu,
    .moe_route = kern_moe_route_cpu,
    .swiglu = kern_swiglu_cpu,
    .attention = kern_attention_cpu,
    .compress_pool = kern_compress_pool_cpu,
    .index_scores = kern_index_scores_cpu,
    .topk = kern_topk_cpu,
};

#ifdef TANDEM_HAVE_CUDA
static const kern_ops_t ops_cuda = {
    .name = "cuda",
    .quant_act8 = kern_quant_act8_cuda,
    .quant_ckv = kern_quant_ckv_cuda,
    .quant_mx4 = kern_quant_mx4_cuda,
    .dequant_act8 = kern_dequant_act8_cuda,
    .dequant_ckv = kern_dequant_ckv_cuda,
    .dequant_mx4 = kern_dequant_mx4_cuda,
    .qdq_act8 = kern_qdq_act8_rows_cuda,
    .gemm = kern_gemm_cuda,
    .rmsnorm = kern_rmsnorm_cuda,
    .rope = kern_rope_cuda,
    .mhc_coeffs = kern_mhc_coeffs_cuda,
    .mhc_collapse = kern_mhc_collapse_cuda,
    .mhc_update = kern_mhc_update_cuda,
    .engram_gate = kern_engram_gate_cuda,
    .moe_route = kern_moe_route_cuda,
    .swiglu = kern_swiglu_cuda,
    .attention = kern_attention_cuda,
    .compress_pool = kern_compress_pool_cuda,
    .index_scores = kern_index_scores_cuda,
    .topk = kern_topk_cuda,
};
#endif

const kern_ops_t *kern_ops_cpu(void)
{
    return &ops_cpu;
}

const kern_ops_t *kern_ops_cuda(void)
{
#ifdef TANDEM_HAVE_CUDA
    if (kern_cuda_available(NULL) != 0) {
        return &ops_cuda;
    }
#endif
    return NULL;
}
