/* glue.h - the small data ops between the forward-pass kernels: the embedding gather (MODEL.md
 * 5.1, R1), the stream mean of a DSpark tap (8), BF16 rounding, the MoE row gather, scatter-add
 * and residual sum (5.5, R8), the index-weight scaling (5.4) and the candidate pool's block
 * maxima and mask (5.4). Each was a loop in engine code; as ops they run where the activations
 * live (issue 14 item 2), with the engine loop's arithmetic in the same order, so the CPU
 * versions give the engine's former bits exactly.
 *
 * Owns nothing; knows nothing of layers, sequences or pages. Pointers are host memory for the
 * CPU backend and device memory for CUDA (kernels/ops.h). Every op is exact given its inputs (no
 * reduction whose order a backend may choose), so CUDA and CPU agree to the bit.
 */
#ifndef TANDEM_KERNELS_GLUE_H
#define TANDEM_KERNELS_GLUE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/*
 * kern_embed_fn - the hyper-connection streams of token rows (R1): for each row r and stream
 * k < m, x_out[r, k, :] = FP32(table[ids[r], :]) (BF16 widened, exact) and pre_out[r, k] = 1 for
 * k = 0, else 0 (e0, the pre of "no previous FFN site").
 *
 * table:   [n_vocab, H] BF16 bits, row-major (the embedding; borrowed).
 * ids:     [n] token ids, each in [0, n_vocab).
 * x_out:   [n, m, H] f32, written.   pre_out: [n, m] f32, written; may be NULL (not written:
 *          a plain row gather with m = 1, e.g. the DSpark Markov embedding, MODEL.md 8).
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (NULL pointer other than pre_out, n < 0, m < 1, H < 1,
 * n_vocab < 1, or on the CPU an id out of range; nothing written). The CUDA version does not read
 * ids on the host: a row whose id is out of range is written as NaN instead (callers check ids
 * first).
 */
typedef tdm_status_t kern_embed_fn(kern_ctx_t *ctx, const uint16_t *table, int64_t n_vocab,
                                   const int32_t *ids, int64_t n, int64_t H, int m, float *x_out,
                                   float *pre_out);
kern_embed_fn kern_embed_cpu;

/*
 * kern_stream_mean_fn - y_out[r, :] = (sum_{i < m} x[r, i, :]) / m in FP32, the sum from 0.0f in
 * ascending i (the FP32 stream mean a DSpark tap keeps, MODEL.md 8).
 *
 * x: [n_rows, m, H] f32.   y_out: [n_rows, H] f32 with row stride ldy (>= H).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, n_rows < 0, m < 1, H < 1, ldy < H).
 */
typedef tdm_status_t kern_stream_mean_fn(kern_ctx_t *ctx, const float *x, int64_t n_rows, int m,
                                         int64_t H, float *y_out, int64_t ldy);
kern_stream_mean_fn kern_stream_mean_cpu;

/*
 * kern_bf16_round_fn - y_out[i] = BF16(x[i]) as FP32 (round to nearest even, NaN stays NaN:
 * kern_bf16_round) for i < n. y_out may alias x. Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL
 * with n > 0, n < 0).
 */
typedef tdm_status_t kern_bf16_round_fn(kern_ctx_t *ctx, const float *x, int64_t n, float *y_out);
kern_bf16_round_fn kern_bf16_round_cpu;

/*
 * kern_add_bf16_fn - y_out[i] = BF16(a[i] + b[i]) (one FP32 addition, then BF16 rounding: the
 * MoE output, routed sum plus shared expert, R8). y_out may alias a or b. Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (NULL with n > 0, n < 0).
 */
typedef tdm_status_t kern_add_bf16_fn(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                                      float *y_out);
kern_add_bf16_fn kern_add_bf16_cpu;

/*
 * kern_add_fn - y_out[i] = a[i] + b[i] in FP32 (one rounding; the DSpark draft logits
 * l_i = U_i + markov_head(e_i), MODEL.md 8). y_out may alias a or b. Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (NULL with n > 0, n < 0).
 */
typedef tdm_status_t kern_add_fn(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                                 float *y_out);
kern_add_fn kern_add_cpu;

/*
 * kern_scale2_fn - x[i] = (x[i] * s0) * s1 in FP32, two roundings in that order (the index
 * weights w * d_I^-1/2 * H_I^-1/2, MODEL.md 5.4), in place for i < n. Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (NULL with n > 0, n < 0).
 */
typedef tdm_status_t kern_scale2_fn(kern_ctx_t *ctx, float *x, int64_t n, float s0, float s1);
kern_scale2_fn kern_scale2_cpu;

/*
 * kern_rows_gather_fn - y_out[k, :] = x[idx[k], :] for k < n_idx (the token rows one expert
 * takes, 5.5). x: [*, n_cols] f32, row stride ldx; idx: [n_idx] row numbers (>= 0);
 * y_out: [n_idx, n_cols] f32, row stride ldy; must not overlap x.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL with n_idx > 0, n_idx < 0, n_cols < 1, a stride
 * below n_cols, or on the CPU a negative idx; nothing written).
 */
typedef tdm_status_t kern_rows_gather_fn(kern_ctx_t *ctx, const float *x, int64_t ldx,
                                         const int64_t *idx, int64_t n_idx, int64_t n_cols,
                                         float *y_out, int64_t ldy);
kern_rows_gather_fn kern_rows_gather_cpu;

/*
 * kern_rows_scatter_add_fn - acc[idx[k], :] += y[k, :] for k = 0, 1, ..., n_idx - 1 in that order
 * (one FP32 addition per element and k; a row named twice gets its additions in k order): one
 * expert's outputs added into the routed sum, 5.5. y: [n_idx, n_cols] f32, row stride ldy;
 * acc: [*, n_cols] f32, row stride ld_acc; must not overlap y.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (as kern_rows_gather_fn; nothing written).
 */
typedef tdm_status_t kern_rows_scatter_add_fn(kern_ctx_t *ctx, const float *y, int64_t ldy,
                                              const int64_t *idx, int64_t n_idx, int64_t n_cols,
                                              float *acc, int64_t ld_acc);
kern_rows_scatter_add_fn kern_rows_scatter_add_cpu;

/*
 * kern_cand_blocks_fn - the candidate-pool block scores of one query (MODEL.md 5.4): for each
 * block b of `block` consecutive keys, beta_out[b] = the largest of scores[b * block ...] (a
 * running max from -inf that ignores NaN: "s > max ? s : max"), except the query's own, last,
 * block, which gets +inf so that it is always kept.
 *
 * scores: [n] f32 (n >= 1).   beta_out: [ceil(n / block)] f32; must not overlap scores.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, n < 1, block < 1).
 */
typedef tdm_status_t kern_cand_blocks_fn(kern_ctx_t *ctx, const float *scores, int64_t n,
                                         int64_t block, float *beta_out);
kern_cand_blocks_fn kern_cand_blocks_cpu;

/*
 * kern_cand_mask_fn - restrict one query's scores to its candidate pool (5.4): scores[j] = -inf
 * for every j < n whose block j / block is not among pool[0 .. n_pool); the rest unchanged.
 *
 * scores: [n] f32, in place.  pool: [n_pool] block numbers (any order; values outside
 * [0, ceil(n / block)) match nothing).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL scores with n > 0, NULL pool with n_pool > 0,
 * n < 0, n_pool < 0, block < 1; nothing written).
 */
typedef tdm_status_t kern_cand_mask_fn(kern_ctx_t *ctx, float *scores, int64_t n, int64_t block,
                                       const int32_t *pool, int64_t n_pool);
kern_cand_mask_fn kern_cand_mask_cpu;

/*
 * kern_expert_rows_fn - group a batch's routed (row, slot) pairs by expert (MODEL.md 5.5): for
 * each expert e in ascending order, the rows r with experts[r, k] == e for some k, in ascending
 * (r, k) order, and the routing weight of each. Expert e's entries are
 * rows_out[offsets_out[e] .. offsets_out[e + 1]) and wts_out at the same places;
 * offsets_out[0] = 0 and offsets_out[E] = the number of pairs with an id in [0, E).
 *
 * experts: [N, K] int32 expert ids (kern_moe_route_fn's output).  wts: [N, K] f32.
 * offsets_out: [E + 1] int64.  rows_out: [N * K] int64.  wts_out: [N * K] f32.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (NULL with N > 0, N < 0, K < 1, E < 1, or on the CPU an
 * id outside [0, E); nothing written). The CUDA version skips such an id instead.
 */
typedef tdm_status_t kern_expert_rows_fn(kern_ctx_t *ctx, const int32_t *experts, const float *wts,
                                         int64_t N, int K, int64_t E, int64_t *offsets_out,
                                         int64_t *rows_out, float *wts_out);
kern_expert_rows_fn kern_expert_rows_cpu;

/* Row formats kern_dequant_rows_fn reads (kernels/codec.h). */
typedef enum {
    KERN_ROWS_ACT8 = 0, /* Q_act8: E4M3 codes [dim], UE8M0 scales [dim / 32] */
    KERN_ROWS_CKV = 1,  /* Q_ckv: packed E2M1 [dim / 2], E4M3 scales [dim / 16] */
    KERN_ROWS_MX4 = 2,  /* Q_mx4: packed E2M1 [dim / 2], UE8M0 scales [dim / 32] */
} kern_rows_format_t;

/*
 * kern_dequant_rows_fn - gather and dequantize n_rows rows that lie anywhere (ring slots, KV
 * page slots, Engram table rows): y_out[r, :] = the dequantized row at codes[r] / scales[r], with
 * the bits of kern_dequant_act8_fn / _ckv_fn / _mx4_fn on that row. One call instead of one per
 * row (MODEL.md 5.2 selected rows, 5.6 Engram rows).
 *
 * codes, scales: [n_rows] pointers to each row's codes and scales; the arrays and the rows they
 *                point to are backend memory (CUDA: both device memory).
 * y_out:         [n_rows, dim] f32, written.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (NULL arrays with n_rows > 0, n_rows < 0, unknown format,
 * dim <= 0 or not a multiple of the format's group, or on the CPU a NULL row pointer; nothing
 * written). The CPU splits 32 K elements or more over ctx's worker pool (the same bytes).
 */
typedef tdm_status_t kern_dequant_rows_fn(kern_ctx_t *ctx, kern_rows_format_t format,
                                          const uint8_t *const *codes, const uint8_t *const *scales,
                                          int64_t n_rows, int64_t dim, float *y_out);
kern_dequant_rows_fn kern_dequant_rows_cpu;

/*
 * kern_ahead_t - a ticket for a gather started ahead of its use on a side queue of the backend
 * (kern_rows_ahead_fn), so that it overlaps the work queued after it, and waited for where its
 * output is first needed (kern_ahead_wait_fn). Issue 14 item 4: the Engram rows of a decode step
 * are known from the token ids before layer 0 runs, and on a GPU their reads from pinned host
 * memory then overlap the layers before the Engram layer instead of stalling it.
 *
 * Zero-initialised = idle and holding nothing. Caller-owned host memory, one per gather in flight;
 * released with kern_ahead_free_fn. CPU and guard: the gather is done when the start returns and
 * the ticket holds nothing but the flag. CUDA: a side stream and two events (made at the first
 * start, kept for the next ones).
 */
typedef struct {
    void *queue; /* CUDA: cudaStream_t of the side queue; NULL until the first start */
    void *ready; /* CUDA: cudaEvent_t on the context's stream, recorded at each start */
    void *done;  /* CUDA: cudaEvent_t on the side queue, recorded after each gather */
    int pending; /* 1 from a start until its wait */
} kern_ahead_t;

/*
 * kern_rows_ahead_fn - start kern_dequant_rows_fn's gather (same arguments, same bits) on the
 * ticket's side queue. The gather sees everything queued on ctx before the call (the pointer
 * arrays copied in, earlier readers of y_out done) and may still run when the call returns: until
 * kern_ahead_wait_fn on the same ticket, nothing may read y_out or write y_out, the pointer
 * arrays or the rows they point to. A caller that gave up on a gather (a batch that failed before
 * its use) still waits for it before it writes those again; a start on a ticket still pending is
 * refused, so that such a wait cannot be forgotten.
 * Returns TDM_OK; TDM_ERR_INVALID_ARG for ticket NULL or pending, or kern_dequant_rows_fn's
 * refusals (nothing started, ticket unchanged); TDM_ERR_NO_MEMORY / TDM_ERR_INTERNAL when the
 * backend could not make its queue or launch (ticket not pending: on CUDA, a gather that launched
 * but could not be recorded is waited for on the host first).
 */
typedef tdm_status_t kern_rows_ahead_fn(kern_ctx_t *ctx, kern_rows_format_t format,
                                        const uint8_t *const *codes, const uint8_t *const *scales,
                                        int64_t n_rows, int64_t dim, float *y_out,
                                        kern_ahead_t *ticket);
kern_rows_ahead_fn kern_rows_ahead_cpu;

/*
 * kern_ahead_wait_fn - make the work queued on ctx after this call see the ticket's gather
 * (CUDA: the context's stream waits for the side queue's event; the host does not wait). The
 * ticket is idle again. Returns TDM_OK, or TDM_ERR_INVALID_ARG (ticket NULL or not pending: a
 * wait without a start is an orchestration error; nothing changed), TDM_ERR_INTERNAL (CUDA
 * error).
 */
typedef tdm_status_t kern_ahead_wait_fn(kern_ctx_t *ctx, kern_ahead_t *ticket);
kern_ahead_wait_fn kern_ahead_wait_cpu;

/*
 * kern_ahead_free_fn - release what the ticket holds (CUDA: waits for its side queue, then
 * destroys the queue and events) and zero it. Accepts NULL and an idle or pending ticket.
 */
typedef void kern_ahead_free_fn(kern_ctx_t *ctx, kern_ahead_t *ticket);
kern_ahead_free_fn kern_ahead_free_cpu;

/*
 * kern_page_mark_fn - kern_kv_page_mark_rows (kernels/kv_page.h) on a page in backend memory,
 * in place: row_count = max(row_count, slot_end) and the stale flag set, the header change of
 * writing slots below slot_end, so a writer that copied a run of rows into the page's regions
 * needs no copy of the header to the host and back (no wait on a device).
 * page: a page made by kern_kv_page_init (backend memory).  slot_end: 1 .. KERN_KV_PAGE_ROWS.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, slot_end out of range; on the CPU also a header
 * without the magic, version or valid dims: page untouched). CUDA cannot return that last one
 * without waiting: it leaves such a page untouched and ORs KERN_STATUS_PAGE_HEADER into
 * ctx->status_word, and refuses a call without a status word (TDM_ERR_INVALID_ARG;
 * kernels/backend.h).
 */
typedef tdm_status_t kern_page_mark_fn(kern_ctx_t *ctx, void *page, uint32_t slot_end);
kern_page_mark_fn kern_page_mark_cpu;

#ifdef __cplusplus
}
#endif

#endif
