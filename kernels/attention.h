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
 * kern_exp - Tandem's single-precision e^x, the exp of the attention softmax below. Defined by
 * its steps, each one IEEE-754 single-precision operation (fma: fused), so every CPU
 * instruction set, every libm and the CUDA kernels give the same bits:
 *   x NaN: x itself. xc = KERN_EXP_LO if KERN_EXP_LO > x, else x; then KERN_EXP_HI if
 *   xc > KERN_EXP_HI (the result is 0 below -103.98 and +inf above 88.73 anyway);
 *   k = (xc * KERN_EXP_LOG2E + KERN_EXP_ROUND) - KERN_EXP_ROUND (an integer: round to nearest
 *   even); r = fma(k, -KERN_EXP_LN2_HI, xc), r = fma(k, -KERN_EXP_LN2_LO, r) (Cody and Waite's
 *   reduction: LN2_HI is ln 2 in FP32, LN2_LO the rest); p = fma(C7, r, C6), then
 *   p = fma(p, r, c) for c = C5, C4, C3, C2, 1, 1 (Horner on e^r's Taylor coefficients
 *   1/n!); k1 = (k * 0.5 + KERN_EXP_ROUND) - KERN_EXP_ROUND, k2 = k - k1; the result is
 *   (p * 2^k1) * 2^k2 (both powers exact FP32 normals: only the last product rounds, so the
 *   subnormal range and the overflow to +inf come out right).
 * Error: at most 0.94 ulp from e^x over every float in [-110, 90] (checked exhaustively once;
 * tests/unit/test_kernels_simd.c checks every 61st float of that range and the edges); libm's
 * expf gives other bits for about 0.5 % of inputs. Pure; any thread.
 */
#define KERN_EXP_LO     (-104.0f)
#define KERN_EXP_HI     89.0f
#define KERN_EXP_ROUND  0x1.8p23f
#define KERN_EXP_LOG2E  0x1.715476p+0f
#define KERN_EXP_LN2_HI 0x1.62e43p-1f
#define KERN_EXP_LN2_LO (-0x1.05c61p-29f)
#define KERN_EXP_C7     0x1.a01a02p-13f
#define KERN_EXP_C6     0x1.6c16c2p-10f
#define KERN_EXP_C5     0x1.111112p-7f
#define KERN_EXP_C4     0x1.555556p-5f
#define KERN_EXP_C3     0x1.555556p-3f
#define KERN_EXP_C2     0.5f
float kern_exp(float x);

/*
 * kern_log1p - Tandem's single-precision log(1 + t) for t in [0, 1] (the router's softplus,
 * log1p(e^-|z|) + max(z, 0), kernels/moe.h), defined by its steps like kern_exp so that every
 * CPU instruction set, libm and the CUDA kernels give the same bits (libm's and CUDA's log1pf
 * differ in the last place on some inputs):
 *   s = t / (2 + t); u = s * s; p = fma(C15, u, C13), then p = fma(p, u, c) for c = C11, C9,
 *   C7, C5, C3, 1; the result is (2 * s) * p.
 * The series 2 atanh(s) = log((1 + s) / (1 - s)) = log(1 + t) truncated after s^15 (s <= 1/3:
 * the truncation is below 2e-9 relative); Cn = 1/n in FP32. Error: under 2 ulp over [0, 1]
 * (1.95 at worst on 2^20 + 1 evenly spaced inputs against log1p in double, test_kernels_simd);
 * t = 0 gives 0, a NaN gives a NaN. Outside [0, 1] the series is not accurate (callers pass
 * e^-|z|). Pure; any thread.
 */
#define KERN_LOG1P_C15 0x1.111112p-4f
#define KERN_LOG1P_C13 0x1.3b13b2p-4f
#define KERN_LOG1P_C11 0x1.745d18p-4f
#define KERN_LOG1P_C9  0x1.c71c72p-4f
#define KERN_LOG1P_C7  0x1.24924ap-3f
#define KERN_LOG1P_C5  0x1.99999ap-3f
#define KERN_LOG1P_C3  0x1.555556p-2f
float kern_log1p(float t);

/*
 * kern_attention_fn - for one query position and each head h < n_heads:
 * z_e = (q_h . k_e) * scale (dot in the batch-invariant GEMM order), mu = max_e z_e,
 * p_e = exp(z_e - mu) / (sum_e' exp(z_e' - mu) + exp(sink_h - mu)) (exp = kern_exp; the sum
 * in the 16-lane order of kernels/gemm.h: lane j adds e = j, j + 16, ... ascending, then the
 * fixed lane tree, so a GPU's half-warp computes it in the same order),
 * o_h = BF16(sum_e p_e k_e) (ascending e). With no keys, o_h = 0.
 *
 * The key set is keys_a [n_a, d] followed by keys_b [n_b, d] (window entries, then selected
 * compressed rows), e = 0 .. n_a + n_b - 1 in that order; key = value (MQA latent).
 * q: [n_heads, d].  sink: [n_heads].  scale: 1/sqrt(d) (FP32).
 * o_out: [n_heads, d] f32 (BF16 values).  scratch: [n_heads * (n_a + n_b)] f32 work space (the
 * CPU's vector paths keep every head's logits).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, d not a multiple of 16, n_a or n_b < 0).
 * The CPU splits the heads over ctx's worker pool when ctx allows several threads and the call
 * has 64 K multiply-adds or more (each chunk on its own heads' rows of scratch; a head's
 * operations are the same whichever thread runs it, so the same bits); ctx may be NULL (one
 * thread).
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
 * kern_attn_row_t - one query row of a kern_attention_rows_fn call: its query q [n_heads, d], its
 * key set (keys_a [n_a, d] then keys_b [n_b, d], as kern_attention_fn; a NULL pointer where the
 * count is 0) and its output o [n_heads, d]. Every pointer is backend memory.
 */
typedef struct {
    const float *q;
    const float *keys_a;
    const float *keys_b;
    float *o;
    int64_t n_a;
    int64_t n_b;
} kern_attn_row_t;

/* The most keys (n_a + n_b) a row of kern_attention_rows_fn may have: the CUDA kernel keeps a
 * head's logits in 16 KB of shared memory. Longer key sets go through kern_attention_fn. */
#define KERN_ATTENTION_ROWS_MAX_KEYS 4096

/*
 * kern_attention_rows_fn - kern_attention_fn for n_rows query rows of one layer in one call (one
 * launch on a GPU instead of one per row): row i's output is kern_attention_fn(rows[i].q,
 * rows[i].keys_a, rows[i].n_a, rows[i].keys_b, rows[i].n_b, sink, n_heads, d, scale, scratch,
 * rows[i].o), bit for bit (each row's own operations in the same order). Rows may share keys and
 * queries; outputs must not overlap each other or any input.
 *
 * rows:    [n_rows] descriptors in backend memory (a GPU reads them on the device), each row's
 *          n_a, n_b >= 0 with n_a + n_b <= KERN_ATTENTION_ROWS_MAX_KEYS.
 * scratch: [n_heads * max_i (rows[i].n_a + rows[i].n_b)] f32 backend memory (the CPU reuses it
 *          row after row; CUDA does not touch it). With ctx's worker pool (kernels/backend.h)
 *          the CPU splits the rows into chunks over its threads, the first chunk on this scratch
 *          and the others on scratch it allocates for the call (without that memory: every row
 *          on the caller, the same results).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (rows, sink or scratch NULL with n_rows > 0, n_rows < 0,
 * n_heads <= 0, d not a multiple of 16; where the host can read the descriptors (a host-memory
 * backend), also a bad row, every output then untouched). A backend that cannot read the
 * descriptors on the host does not refuse them: CUDA writes NaN to the output of a row whose
 * counts are negative or too many (never past its shared logits); other bad pointers are the
 * caller's bug.
 * Optional in kern_ops_t (NULL: call attention row by row).
 */
typedef tdm_status_t kern_attention_rows_fn(kern_ctx_t *ctx, const kern_attn_row_t *rows,
                                            int64_t n_rows, const float *sink, int64_t n_heads,
                                            int64_t d, float scale, float *scratch);
kern_attention_rows_fn kern_attention_rows_cpu;

/*
 * kern_compress_pool_fn - ratio-r gated pooling of one group (MODEL.md 5.3): per channel c,
 * w_p = exp(b_p,c - max) / sum_p' exp(b_p',c - max), v_c = BF16(sum_p w_p a_p,c), p ascending;
 * exp = kern_exp.
 * a, b: [r, d] FP32 projections of the group's tokens.  v_out: [d].
 */
typedef tdm_status_t kern_compress_pool_fn(kern_ctx_t *ctx, const float *a, const float *b, int r,
                                           int64_t d, float *v_out);
kern_compress_pool_fn kern_compress_pool_cpu;

#ifdef __cplusplus
}
#endif

#endif
