/* ops.c - the per-backend kernel tables of kernels/ops.h. */
#include "kernels/ops.h"

#include "kernels/backend.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

#include <stddef.h>

static const kern_ops_t ops_cpu = {
    .name = "cpu",
    .host_memory = 1,
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
    .moe_ffn = kern_moe_ffn_cpu,
    .attention = kern_attention_cpu,
    .attention_sel = kern_attention_sel_cpu,
    .attention_rows = kern_attention_rows_cpu,
    .compress_pool = kern_compress_pool_cpu,
    .index_scores = kern_index_scores_cpu,
    .topk = kern_topk_cpu,
    .mem_alloc = kern_mem_alloc_cpu,
    .mem_free = kern_mem_free_cpu,
    .mem_copy = kern_mem_copy_cpu,
    .mem_set = kern_mem_set_cpu,
    .sync = kern_sync_cpu,
    .host_register = kern_host_register_cpu,
    .host_unregister = kern_host_unregister_cpu,
    .embed = kern_embed_cpu,
    .stream_mean = kern_stream_mean_cpu,
    .bf16_round = kern_bf16_round_cpu,
    .add_bf16 = kern_add_bf16_cpu,
    .add = kern_add_cpu,
    .scale2 = kern_scale2_cpu,
    .rows_gather = kern_rows_gather_cpu,
    .rows_scatter_add = kern_rows_scatter_add_cpu,
    .cand_blocks = kern_cand_blocks_cpu,
    .cand_mask = kern_cand_mask_cpu,
    .argmax = kern_argmax_cpu,
    .expert_rows = kern_expert_rows_cpu,
    .dequant_rows = kern_dequant_rows_cpu,
    .page_mark = kern_page_mark_cpu,
    .rows_ahead = kern_rows_ahead_cpu,
    .ahead_wait = kern_ahead_wait_cpu,
    .ahead_free = kern_ahead_free_cpu,
};

#ifdef TANDEM_HAVE_CUDA
static const kern_ops_t ops_cuda = {
    .name = "cuda",
    .host_memory = 0,
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
    .moe_ffn = kern_moe_ffn_cuda,
    .attention = kern_attention_cuda,
    .attention_rows = kern_attention_rows_cuda,
    .compress_pool = kern_compress_pool_cuda,
    .index_scores = kern_index_scores_cuda,
    .topk = kern_topk_cuda,
    .mem_alloc = kern_mem_alloc_cuda,
    .mem_free = kern_mem_free_cuda,
    .mem_copy = kern_mem_copy_cuda,
    .mem_set = kern_mem_set_cuda,
    .sync = kern_sync_cuda,
    .host_register = kern_host_register_cuda,
    .host_unregister = kern_host_unregister_cuda,
    .embed = kern_embed_cuda,
    .stream_mean = kern_stream_mean_cuda,
    .bf16_round = kern_bf16_round_cuda,
    .add_bf16 = kern_add_bf16_cuda,
    .add = kern_add_cuda,
    .scale2 = kern_scale2_cuda,
    .rows_gather = kern_rows_gather_cuda,
    .rows_scatter_add = kern_rows_scatter_add_cuda,
    .cand_blocks = kern_cand_blocks_cuda,
    .cand_mask = kern_cand_mask_cuda,
    .argmax = kern_argmax_cuda,
    .expert_rows = kern_expert_rows_cuda,
    .dequant_rows = kern_dequant_rows_cuda,
    .page_mark = kern_page_mark_cuda,
    .rows_ahead = kern_rows_ahead_cuda,
    .ahead_wait = kern_ahead_wait_cuda,
    .ahead_free = kern_ahead_free_cuda,
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
