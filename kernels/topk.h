/* topk.h - indexer scores and top-k selection (MODEL.md 5.4).
 *
 * Owns nothing. Tie order [tandem] for every top-k: value descending, then index ascending; a
 * NaN reaching a top-k is an engine error (TDM_ERR_INTERNAL).
 */
#ifndef TANDEM_KERNELS_TOPK_H
#define TANDEM_KERNELS_TOPK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/*
 * kern_index_scores_fn - sigma(j) = sum_h w_h max(0, q_h . k_j) for j < n_keys (FP32; dot in the
 * batch-invariant GEMM order, h ascending).
 * q: [n_heads, d_I] (Q_mx4 QDQ values).  w: [n_heads].  keys: [n_keys, d_I].
 * scores_out: [n_keys].
 */
typedef tdm_status_t kern_index_scores_fn(kern_ctx_t *ctx, const float *q, const float *w,
                                          int64_t n_heads, int64_t d_I, const float *keys,
                                          int64_t n_keys, float *scores_out);
kern_index_scores_fn kern_index_scores_cpu;

/*
 * kern_topk_fn - the indices of the k largest of vals [n] in tie order (value descending, index
 * ascending), skipping -inf values: writes *n_out = min(k, #finite-or-+inf) indices into
 * idx_out [k], best first. Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, k < 0), or
 * TDM_ERR_INTERNAL if any value is NaN (outputs unspecified); with ctx->status_word set
 * (kernels/backend.h) a NaN instead gives *n_out = 0, ORs KERN_STATUS_TOPK_NAN into the word
 * and returns TDM_OK (CUDA: without waiting for its stream).
 * scratch: [n] int32 work space. vals, scratch, idx_out and n_out are all backend memory (CUDA:
 * device memory; without a status word the CUDA version reads *n_out back itself, waiting for
 * its stream, to report a NaN): a caller that needs the count on the host copies it out
 * (KERN_COPY_D2H).
 */
typedef tdm_status_t kern_topk_fn(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                                  int32_t *scratch, int32_t *idx_out, int64_t *n_out);
kern_topk_fn kern_topk_cpu;

#ifdef __cplusplus
}
#endif

#endif
