/* gemm.h - dense matrix products of the forward pass: y = x . W^T with FP32 accumulation in a
 * fixed, batch-invariant order (MODEL.md 4, 5, 12.6).
 *
 * Owns the compute layout of weights (kern_mat_t). Weights stay in their checkpoint formats:
 * FP8 E4M3 dense weights with their 32x32 UE8M0 block scales and MXFP4 experts with their
 * (row, 32) UE8M0 scales are read as stored (in place from the mapped safetensors) and
 * dequantized in registers, exactly (MODEL.md 3: "Dequantizing to BF16 is exact"), so a product
 * gives the bits it gives on the BF16-expanded matrix; BF16 and FP32 (mHC) weights are read as
 * they are. The activation quantizer Q_act8 (R4) is a separate op (kern_qdq_act8_fn) so one GEMM
 * serves every weight format.
 *
 * Batch invariance [tandem]: every output y[r, o] is computed the same way whatever n_rows, the
 * row's place in the batch, the thread split or the CPU's instruction set (kernels/cpu_isa.h):
 * 16 partial sums, lane j += w[k] * x[k] (one fused multiply-add) for k = j, j + 16, ... in
 * ascending k, then a fixed pairwise tree (lane j += lane j + 8, + 4, + 2, + 1). The plain C,
 * AVX2, AVX-512 and NEON versions produce identical bits. This is what makes a batch of
 * sequences bit-identical to each sequence alone (MODEL.md 6(e)). Knows nothing of layers,
 * checkpoints or quantization of activations.
 */
#ifndef TANDEM_KERNELS_GEMM_H
#define TANDEM_KERNELS_GEMM_H

#include <stddef.h>
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
    KERN_MAT_BF16 = 0,  /* uint16_t BF16 bits [n_out, n_in] (BF16 checkpoint weights) */
    KERN_MAT_F32 = 1,   /* float [n_out, n_in] (mHC hc_*_fn) */
    KERN_MAT_FP8 = 2,   /* E4M3 codes [n_out, n_in] + UE8M0 scales [ceil(n_out/32), n_in/32]:
                         * W[o,i] = e4m3(code) * 2^(S[o/32, i/32] - 127) (MODEL.md 3) */
    KERN_MAT_MXFP4 = 3, /* packed E2M1 [n_out, n_in/2] (element 2b low nibble of byte b, 2b+1
                         * high) + UE8M0 scales [n_out, n_in/32]:
                         * W[o,i] = e2m1(nibble) * 2^(S[o, i/32] - 127) (MODEL.md 3, OCP MX) */
} kern_mat_dtype_t;

/*
 * kern_mat_t - a weight matrix [n_out, n_in] in compute layout, row-major, rows contiguous
 * (row o starts at element o * n_in of `data`; for MXFP4 at byte o * n_in / 2). `scales` is the
 * UE8M0 scale array of FP8 and MXFP4 matrices (NULL for BF16 and F32). Plain data; both arrays
 * are borrowed from whoever made it (the model owns or maps its weights). Host memory for the
 * CPU backend. FP8 and MXFP4 need n_in % 32 == 0; FP8 scale bytes in [3, 134] and MXFP4 scale
 * bytes <= 254 (kern_mat_check_scales: then the in-register dequantization is exact), no E4M3
 * NaN code (0x7F, 0xFF).
 */
typedef struct {
    kern_mat_dtype_t dtype;
    int64_t n_out;
    int64_t n_in;
    const void *data;
    const uint8_t *scales;
    /* FP8 only, optional (NULL: not known), host memory, borrowed like data: the map of
     * kern_mat_fp8_clean_fill. A speed hint of the CPU kernels, never a change of bits: where a
     * block is clean they decode E4M3 codes with integer operations (no FP16 conversion), which
     * would hand a denormal operand to a multiply for a subnormal code (x86 cores slow those
     * down, some by a microcode assist). Other backends ignore it. */
    const uint8_t *fp8_clean;
} kern_mat_t;

/* Weight rows per bit of kern_mat_t.fp8_clean (a bit covers these rows x 32 columns). */
#define KERN_MAT_FP8_CLEAN_ROWS 4

/*
 * kern_mat_fp8_clean_bytes - bytes of the clean map of an FP8 matrix w: one bit per block of
 * KERN_MAT_FP8_CLEAN_ROWS weight rows x 32 columns, ceil(n_out / 4) * (n_in / 32) bits, rounded
 * up to whole bytes. 0 for other types, NULL, or n_in not a multiple of 32.
 */
int64_t kern_mat_fp8_clean_bytes(const kern_mat_t *w);

/*
 * kern_mat_fp8_clean_fill - map_out[kern_mat_fp8_clean_bytes(w)] = the clean map of FP8 matrix
 * w: bit b = g * (n_in / 32) + c (byte b / 8, bit b % 8, least significant first) is 1 when
 * rows [4g, 4g + 4) (those below n_out) x columns [32c, 32c + 32) hold no subnormal E4M3 code
 * (exponent bits 0, mantissa bits not 0: 0x01-0x07, 0x81-0x87; MODEL.md 3, the OCP 8-bit
 * floating point specification's E4M3); zero codes are clean. Reads
 * every code of w (host memory). The caller owns map_out and sets w->fp8_clean to it.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (map_out untouched) when w is not an FP8 matrix with
 * data and n_in a multiple of 32, or map_out is NULL.
 */
tdm_status_t kern_mat_fp8_clean_fill(const kern_mat_t *w, uint8_t *map_out);

/*
 * kern_mat_rows - *out = rows [row0, row0 + n_rows) of w as a matrix of its own (a view: the
 * same storage, nothing copied; an FP8 clean map moves with it). Returns TDM_OK, or
 * TDM_ERR_INVALID_ARG (out untouched) when the range is outside w or, for FP8, row0 is not a
 * multiple of 32 (a scale block row).
 */
tdm_status_t kern_mat_rows(const kern_mat_t *w, int64_t row0, int64_t n_rows, kern_mat_t *out);

/* kern_mat_bytes - bytes of w's data plus its scales (its resident size); 0 for NULL. */
int64_t kern_mat_bytes(const kern_mat_t *w);

/*
 * kern_mat_check_quantized - 1 when an FP8 or MXFP4 matrix can be used as stored: shapes as
 * above, every scale byte in range (FP8: 3..134, where 2^(s-127) times any E4M3 value is an
 * exact BF16 and FP32 number; MXFP4: <= 254) and, for FP8, no NaN code. Reads every byte. 0
 * otherwise (the loader then expands the matrix to BF16 with kern_mat_bf16_from_*, which gives
 * the same products). BF16 and F32 matrices give 1.
 */
int kern_mat_check_quantized(const kern_mat_t *w);

/* kern_gemm flags. */
typedef enum {
    KERN_GEMM_OUT_F32 = 0,        /* y stays FP32 (mHC mixes, router, ratio-2 compressor, head) */
    KERN_GEMM_OUT_BF16 = 1u << 0, /* y rounded to BF16 (R3: every other linear) */
} kern_gemm_flags_t;

/*
 * kern_gemm_fn - y[r, o] = sum_k x[r, k] * W[o, k] for r < n_rows, o < w->n_out, accumulated in
 * FP32 in the batch-invariant order above, rounded to BF16 when flags has KERN_GEMM_OUT_BF16.
 *
 * w:     weight [n_out, n_in], n_in a multiple of KERN_GEMM_K_MULTIPLE (32 for FP8 / MXFP4).
 * x:     [n_rows, n_in] f32 with row stride ldx (>= n_in) elements. Any alignment gives the same
 *        bits; the CPU kernels are fastest with x 64-byte aligned and ldx a multiple of 16 (the
 *        engine's activations are): off a 32-byte boundary the AVX2 few-row tiles split every
 *        other load across cache lines (the LM head at 16 rows 1.5x slower).
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
 * instructions, one thread; weights dequantized one element at a time with kernels/codec.h's
 * scalar decoders). The test oracle. kern_gemm_cpu uses the instruction set of kern_cpu_isa().
 */
kern_gemm_fn kern_gemm_ref_cpu;

/*
 * kern_dot_cpu - sum_k a[k] b[k] for k < n (n a multiple of 16) in the order above (16 FMA lanes,
 * fixed tree): bit-identical to one output of kern_gemm_cpu. Host memory; thread-safe.
 */
float kern_dot_cpu(const float *a, const float *b, int64_t n);

/*
 * kern_fma_peak_cpu - the FP32 FMA peak of one thread under kern_cpu_isa(), in FLOP/s: the best
 * of a few runs of independent 16-lane FMA chains on registers (no memory), each about
 * min_ms milliseconds. The compute roofline of the benchmarks. Thread-safe.
 */
double kern_fma_peak_cpu(double min_ms);

/*
 * kern_read_bandwidth_cpu - bytes/s that n_threads threads together read streaming `n_bytes`
 * (>= 64 MiB for a figure of DRAM, not cache) with kern_dot_cpu, each its own contiguous slice,
 * timed from a common start until the last one finishes; best of `reps` passes. The
 * memory-read roofline of the benchmarks: with n_threads the threads a run's kernels use (one
 * thread's stream does not saturate a server's memory: on a 2-core Zen 4 EPYC two threads read
 * 1.2-2.0x what one does, docs/BENCHMARKS.md). Returns 0 when n_threads is outside
 * 1..KERN_POOL_MAX_THREADS, reps < 1, the buffer cannot be allocated or a reader thread cannot
 * start. Thread-safe.
 */
double kern_read_bandwidth_cpu(size_t n_bytes, int reps, int n_threads);

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
