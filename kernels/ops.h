/* ops.h - kern_ops_t: one function table per kernel backend (STYLE.md section 6).
 *
 * Engine code picks a table once (kern_ops_cpu() or kern_ops_cuda()) and calls ops->quant_act8
 * etc., never a backend by name. Owns no state: the tables are static constants. To add an op,
 * declare its kern_<op>_fn type with _cpu and _cuda in its module header, append a member here
 * and fill it in both tables in kernels/ops.c (a backend that lacks the op sets NULL and says
 * so in the member's comment).
 */
#ifndef TANDEM_KERNELS_OPS_H
#define TANDEM_KERNELS_OPS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/attention.h"
#include "kernels/codec.h"
#include "kernels/gemm.h"
#include "kernels/glue.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/mem.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "kernels/topk.h"

/*
 * kern_ops_t - the kernels of one backend. Pointers in argument lists are host memory for
 * "cpu" and device memory for "cuda"; every member follows its function type's contract
 * (kernels/codec.h). Returned by kern_ops_cpu() / kern_ops_cuda(); never freed.
 */
typedef struct {
    const char *name;                   /* "cpu", "cuda" or "guard" */
    /* 1: backend memory is ordinary host memory that host code may also read (CPU: weights are
     * used in place from the mapped checkpoint); 0: it is not (CUDA device memory, the test-only
     * guard backend): weights are uploaded with mem_alloc + mem_copy and host code reaches
     * backend memory only through mem_copy. */
    int host_memory;
    kern_quant_act8_fn *quant_act8;     /* Q_act8 = Q_swa (MODEL.md 4) */
    kern_quant_ckv_fn *quant_ckv;       /* Q_ckv */
    kern_quant_mx4_fn *quant_mx4;       /* Q_mx4 */
    kern_dequant_act8_fn *dequant_act8; /* codes * scale of Q_act8 */
    kern_dequant_ckv_fn *dequant_ckv;   /* codes * scale of Q_ckv */
    kern_dequant_mx4_fn *dequant_mx4;   /* codes * scale of Q_mx4 */
    /* Forward-pass ops (kernels/gemm.h ... topk.h); CUDA versions in kernels/cuda/. */
    kern_qdq_act8_fn *qdq_act8;           /* Q_act8 QDQ rows: the FP8/FP4 GEMM operand (R4) */
    kern_gemm_fn *gemm;                   /* y = x W^T, batch-invariant FP32, opt. BF16 out */
    kern_rmsnorm_fn *rmsnorm;             /* RMSNorm -> BF16 (R2) */
    kern_rope_fn *rope;                   /* partial RoPE / inverse -> BF16 (R5) */
    kern_mhc_coeffs_fn *mhc_coeffs;       /* mHC pre, post, Sinkhorn M (5.1) */
    kern_mhc_collapse_fn *mhc_collapse;   /* BF16(sum_i pre_i X_i) */
    kern_mhc_update_fn *mhc_update;       /* X' = BF16(post F + M^T X) (R1) */
    kern_engram_gate_fn *engram_gate;     /* Engram gated stream update (5.6, R9) */
    kern_moe_route_fn *moe_route;         /* sqrt-softplus router, biased top-K (5.5) */
    kern_swiglu_fn *swiglu;               /* clamped SwiGLU hidden, routing weight (R8) */
    kern_moe_ffn_fn *moe_ffn;             /* a layer's routed experts, offsets on the backend */
    kern_attention_fn *attention;         /* sink softmax attention of one query (5.2, R7) */
    kern_attention_sel_fn *attention_sel; /* the same, selected rows in place; NULL: not here */
    kern_attention_rows_fn *attention_rows; /* many query rows, one call; NULL: not here */
    kern_compress_pool_fn *compress_pool; /* ratio-2 gated pooling (5.3) */
    kern_index_scores_fn *index_scores;   /* indexer scores sigma (5.4) */
    kern_topk_fn *topk;                   /* top-k in the [tandem] tie order (5.4) */
    /* Memory (kernels/mem.h): where activations, rings and pages live; engine code moves its
     * buffers with these, never with memcpy or the CUDA runtime by name. */
    kern_mem_alloc_fn *mem_alloc; /* backend memory, 64-byte aligned */
    kern_mem_free_fn *mem_free;   /* releases mem_alloc's memory; NULL accepted */
    kern_mem_copy_fn *mem_copy;   /* host <-> backend, backend -> backend */
    kern_mem_set_fn *mem_set;     /* byte fill */
    kern_sync_fn *sync;           /* wait for the queued work (CPU: no-op) */
    /* host memory the kernels read in place (Engram tables): CPU identity, CUDA mapped pinned */
    kern_host_register_fn *host_register;
    kern_host_unregister_fn *host_unregister;
    /* Glue between the kernels (kernels/glue.h), once loops in engine code. */
    kern_embed_fn *embed;                       /* token rows -> m streams, pre = e0 (R1) */
    kern_stream_mean_fn *stream_mean;           /* FP32 stream mean of a DSpark tap (8) */
    kern_bf16_round_fn *bf16_round;             /* BF16 rounding of FP32 values */
    kern_add_bf16_fn *add_bf16;                 /* BF16(a + b): the MoE output (R8) */
    kern_add_fn *add;                           /* a + b in FP32: DSpark draft logits (8) */
    kern_scale2_fn *scale2;                     /* (x * s0) * s1: index weights (5.4) */
    kern_rows_gather_fn *rows_gather;           /* an expert's token rows (5.5) */
    kern_rows_scatter_add_fn *rows_scatter_add; /* an expert's outputs into the sum (5.5) */
    kern_cand_blocks_fn *cand_blocks;           /* candidate-pool block maxima (5.4) */
    kern_cand_mask_fn *cand_mask;               /* scores outside the pool -> -inf (5.4) */
    kern_argmax_fn *argmax;                     /* greedy token per logits row (8) */
    kern_expert_rows_fn *expert_rows;           /* routed rows grouped by expert (5.5) */
    kern_dequant_rows_fn *dequant_rows;         /* scattered quantized rows, one call (5.2) */
    kern_page_mark_fn *page_mark;               /* a KV page header's rows written, in place */
    /* dequant_rows started ahead on a side queue and waited for at first use (issue 14 item 4) */
    kern_rows_ahead_fn *rows_ahead;
    kern_ahead_wait_fn *ahead_wait;
    kern_ahead_free_fn *ahead_free;
} kern_ops_t;

/* kern_ops_cpu - the CPU reference table; never NULL. Thread-safe. */
const kern_ops_t *kern_ops_cpu(void);

/*
 * kern_ops_cuda - the CUDA table, or NULL when this build has no CUDA backend or no device is
 * usable (kern_cuda_available() says why). Thread-safe; probes the driver on each call, so
 * callers look it up once at startup.
 */
const kern_ops_t *kern_ops_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
