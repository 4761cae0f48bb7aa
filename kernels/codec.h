/* codec.h - Tandem's number formats: BF16, E4M3, E2M1 and UE8M0 conversions, the four QDQ
 * row quantizers of MODEL.md section 4 (Q_act8 = Q_swa, Q_ckv, Q_mx4) with their dequantizers,
 * and the storage quantizers for FP8 and MXFP4 weights (MODEL.md 3 and 12.7).
 *
 * Owns the bit-exact definition of every rounding point that produces a code: the CPU versions
 * (kernels/cpu/codec.c) are the reference and the CUDA versions (kernels/cuda/codec.cu) produce
 * the same bytes for the same input, NaN and infinities included (docs/NUMERICS.md). Knows
 * nothing of GEMMs, KV pages (kernels/kv_page.h) or checkpoint files. All functions are
 * stateless and thread-safe; the CUDA kernels are asynchronous on ctx->cuda_stream. The _cuda
 * symbols exist only in builds with the CUDA backend (TANDEM_HAVE_CUDA): engine code reaches
 * both backends through kern_ops_t (kernels/ops.h), never by name.
 */
#ifndef TANDEM_KERNELS_CODEC_H
#define TANDEM_KERNELS_CODEC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

#define KERN_ACT8_GROUP       32          /* Q_act8 / Q_swa: elements per UE8M0 scale */
#define KERN_CKV_GROUP        16          /* Q_ckv: elements per E4M3 scale */
#define KERN_MX4_GROUP        32          /* Q_mx4: elements per UE8M0 scale */
#define KERN_WEIGHT_FP8_BLOCK 32          /* FP8 weights: one UE8M0 scale per 32x32 block */
#define KERN_WEIGHT_MX4_GROUP 32          /* MXFP4 weights: one UE8M0 per (row, 32 along K) */
#define KERN_E4M3_MAX         448.0f      /* largest finite E4M3FN value, code 0x7E */
#define KERN_E2M1_MAX         6.0f        /* largest E2M1 value, code 0x7 */
#define KERN_ACT8_AMAX_FLOOR  1e-4f       /* Q_act8 floor: amax >= 1e-4 (the FP32 nearest) */
#define KERN_MX4_AMAX_FLOOR   0x1.8p-124f /* Q_mx4 floor: amax >= 6 * 2^-126 */
#define KERN_CKV_SCALE_MIN    0x1p-9f     /* Q_ckv scale clamp, low end (E4M3 code 0x01) */
#define KERN_UE8M0_BIAS       127

/* ---- scalar conversions (MODEL.md section 4) ------------------------------------------- */

/*
 * kern_bf16_from_f32 - FP32 -> BF16 bits, round to nearest even. NaN stays NaN (quieted, sign
 * kept); infinities stay infinite; finite values beyond the BF16 range round to infinity as
 * RNE does.
 */
uint16_t kern_bf16_from_f32(float x);

/* kern_bf16_to_f32 - BF16 bits -> FP32, exact (the bits shifted into the high half). */
float kern_bf16_to_f32(uint16_t b);

/* kern_bf16_round - BF16(x) as FP32: kern_bf16_to_f32(kern_bf16_from_f32(x)). */
float kern_bf16_round(float x);

/*
 * kern_e4m3_from_f32 - FP32 -> OCP E4M3FN code (bias 7, 3 mantissa bits, subnormals
 * m * 2^-9, max 448 = 0x7E): clamp to +-448, then round to nearest even. The sign bit is the
 * input's (-0.0 and tiny negatives give 0x80). Never returns 0x7F or 0xFF: infinities and NaN
 * saturate to 0x7E / 0xFE by their sign bit (docs/NUMERICS.md; a NaN is an engine error that
 * the engine detects upstream, not something a code can carry). Mirrors PTX
 * cvt.rn.satfinite.e4m3x2.f32 except for NaN.
 */
uint8_t kern_e4m3_from_f32(float x);

/* kern_e4m3_to_f32 - E4M3FN code -> FP32, exact; 0x7F / 0xFF (never written) give NaN. */
float kern_e4m3_to_f32(uint8_t c);

/*
 * kern_e2m1_from_f32 - FP32 -> E2M1 code in the low nibble (0..7 = 0, 0.5, 1, 1.5, 2, 3, 4,
 * 6; bit 3 = sign): round to nearest, ties to even mantissa (0.25->0, 0.75->1, 1.25->1,
 * 1.75->2, 2.5->2, 3.5->4, 5->4), saturating at +-6. The sign bit is the input's (-0.1 gives
 * 0x8). Infinities and NaN saturate to 0x7 / 0xF by their sign bit (docs/NUMERICS.md).
 */
uint8_t kern_e2m1_from_f32(float x);

/* kern_e2m1_to_f32 - E2M1 code (low nibble; the high nibble is ignored) -> FP32, exact. */
float kern_e2m1_to_f32(uint8_t code);

/*
 * kern_ceil2 - for FP32 r > 0, the exponent of the smallest power of two >= r, read from r's
 * bits (exact, subnormal r included), clamped to [-127, 127]. Outside the contract: the sign
 * is ignored, 0 gives -127, infinities and NaN give 127. MODEL.md section 4 [tandem].
 */
int kern_ceil2(float r);

/* kern_ue8m0_from_exp - UE8M0 byte e + 127 of the scale 2^e; e is clamped to [-127, 127], so
 * 255 (NaN) is never produced. */
uint8_t kern_ue8m0_from_exp(int e);

/* kern_ue8m0_to_f32 - 2^(u - 127), exact; u = 0 gives the FP32 subnormal 2^-127, u = 255
 * (never written) gives NaN. */
float kern_ue8m0_to_f32(uint8_t u);

/* ---- row quantizers (QDQ; MODEL.md section 4 table) ------------------------------------ */

/*
 * kern_quant_act8_fn - Q_act8 (= Q_swa): for each group of 32 contiguous elements of a row,
 * amax = max |x| (NaN elements ignored), s = 2^ceil2(fl(max(amax, 1e-4) / 448)) stored as
 * UE8M0, codes E4M3(x / s) (division by a power of two: exact). An all-zero group gets the
 * floor scale (byte 105 = 2^-22) and zero codes (0x80 for -0.0).
 *
 * x:          [n_rows, dim] f32, row-major, contiguous.
 * codes_out:  [n_rows, dim] E4M3 bytes, written.
 * scales_out: [n_rows, dim / 32] UE8M0 bytes, written.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (outputs untouched) if a pointer is NULL, n_rows or
 * dim <= 0, or dim is not a multiple of 32. ctx may be NULL (CPU; CUDA default stream).
 * Pointers are host memory for the CPU backend, device memory for CUDA; the CUDA version is
 * asynchronous on ctx->cuda_stream of the current device and returns TDM_ERR_INTERNAL (logged)
 * if the launch fails. Bit-identical across backends. Not thread-safe per ctx.
 */
typedef tdm_status_t kern_quant_act8_fn(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                        int64_t dim, uint8_t *codes_out, uint8_t *scales_out);
kern_quant_act8_fn kern_quant_act8_cpu;
kern_quant_act8_fn kern_quant_act8_cuda;

/*
 * kern_quant_ckv_fn - Q_ckv: for each group of 16 contiguous elements of a row,
 * amax = max |x| (NaN ignored), scale byte E4M3(clamp(fl(amax / 6), 2^-9, 448)); with s the
 * dequantized scale value, codes E2M1(fl(x / s)). No global scale. An all-zero group gets
 * scale byte 0x01 (2^-9) and zero codes.
 *
 * x:          [n_rows, dim] f32, row-major.
 * codes_out:  [n_rows, dim / 2] packed E2M1, written; byte b holds element 2b in the low
 *             nibble and 2b + 1 in the high nibble.
 * scales_out: [n_rows, dim / 16] E4M3 bytes, written.
 *
 * Errors, memory, ctx and threading as kern_quant_act8_fn, with groups of 16.
 */
typedef tdm_status_t kern_quant_ckv_fn(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                       uint8_t *codes_out, uint8_t *scales_out);
kern_quant_ckv_fn kern_quant_ckv_cpu;
kern_quant_ckv_fn kern_quant_ckv_cuda;

/*
 * kern_quant_mx4_fn - Q_mx4: for each group of 32 contiguous elements of a row, amax = max |x|
 * (NaN ignored), s = 2^ceil2(fl(max(amax, 6 * 2^-126) / 6)) stored as UE8M0, codes
 * E2M1(x / s). An all-zero group gets scale byte 1 (2^-126) and zero codes.
 *
 * x:          [n_rows, dim] f32, row-major.
 * codes_out:  [n_rows, dim / 2] packed E2M1 (low nibble = even element), written.
 * scales_out: [n_rows, dim / 32] UE8M0 bytes, written.
 *
 * Errors, memory, ctx and threading as kern_quant_act8_fn.
 */
typedef tdm_status_t kern_quant_mx4_fn(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                       uint8_t *codes_out, uint8_t *scales_out);
kern_quant_mx4_fn kern_quant_mx4_cpu;
kern_quant_mx4_fn kern_quant_mx4_cuda;

/*
 * kern_dequant_act8_fn - y = e4m3(code) * 2^(scale - 127) per element (one FP32 multiply,
 * exact for codes from kern_quant_act8_fn).
 *
 * codes:  [n_rows, dim] E4M3.   scales: [n_rows, dim / 32] UE8M0.
 * y_out:  [n_rows, dim] f32, written.
 *
 * Errors, memory, ctx and threading as kern_quant_act8_fn.
 */
typedef tdm_status_t kern_dequant_act8_fn(kern_ctx_t *ctx, const uint8_t *codes,
                                          const uint8_t *scales, int64_t n_rows, int64_t dim,
                                          float *y_out);
kern_dequant_act8_fn kern_dequant_act8_cpu;
kern_dequant_act8_fn kern_dequant_act8_cuda;

/*
 * kern_dequant_ckv_fn - y = e2m1(nibble) * e4m3(scale) per element.
 *
 * codes:  [n_rows, dim / 2] packed E2M1.   scales: [n_rows, dim / 16] E4M3.
 * y_out:  [n_rows, dim] f32, written.
 *
 * Errors, memory, ctx and threading as kern_quant_ckv_fn.
 */
typedef tdm_status_t kern_dequant_ckv_fn(kern_ctx_t *ctx, const uint8_t *codes,
                                         const uint8_t *scales, int64_t n_rows, int64_t dim,
                                         float *y_out);
kern_dequant_ckv_fn kern_dequant_ckv_cpu;
kern_dequant_ckv_fn kern_dequant_ckv_cuda;

/*
 * kern_dequant_mx4_fn - y = e2m1(nibble) * 2^(scale - 127) per element.
 *
 * codes:  [n_rows, dim / 2] packed E2M1.   scales: [n_rows, dim / 32] UE8M0.
 * y_out:  [n_rows, dim] f32, written.
 *
 * Errors, memory, ctx and threading as kern_quant_mx4_fn.
 */
typedef tdm_status_t kern_dequant_mx4_fn(kern_ctx_t *ctx, const uint8_t *codes,
                                         const uint8_t *scales, int64_t n_rows, int64_t dim,
                                         float *y_out);
kern_dequant_mx4_fn kern_dequant_mx4_cpu;
kern_dequant_mx4_fn kern_dequant_mx4_cuda;

/*
 * kern_qdq_act8_cpu - y = Q_act8 quantize-then-dequantize of one row of n host floats, the
 * exact GEMM operand the CPU reference feeds an FP8/FP4-weight GEMM (MODEL.md R4).
 *
 * x:     [n] f32, host.   y_out: [n] f32, written; may alias x.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (y untouched) if a pointer is NULL, n <= 0 or n is
 * not a multiple of 32. Thread-safe; allocates nothing.
 */
tdm_status_t kern_qdq_act8_cpu(const float *x, int64_t n, float *y_out);

/* ---- weight storage quantizers (host only; MODEL.md 3 and 12.7) ------------------------ */

/*
 * kern_weight_fp8_quantize - FP8 dense weight storage: one UE8M0 scale per 32x32 block
 * (partial edge blocks allowed; amax over the elements present),
 * s = 2^ceil2(fl(max(amax, 1e-4) / 448)), codes E4M3(w / s). The 1e-4 floor is Q_act8's
 * (docs/NUMERICS.md): an all-zero block gets scale byte 105 (2^-22) and zero codes.
 * Dequantizes as W[o,i] = e4m3(code) * 2^(S[o/32, i/32] - 127).
 *
 * w:          [n_out, n_in] f32, row-major, host.
 * codes_out:  [n_out, n_in] E4M3, written.
 * scales_out: [ceil(n_out / 32), ceil(n_in / 32)] UE8M0, written.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (outputs untouched) for a NULL pointer or
 * n_out / n_in <= 0. Thread-safe; allocates nothing. Engram tables ([R, d_e] E4M3 plus one
 * UE8M0 per (row, 32)) are Q_act8 rows: use kern_quant_act8_cpu.
 */
tdm_status_t kern_weight_fp8_quantize(const float *w, int64_t n_out, int64_t n_in,
                                      uint8_t *codes_out, uint8_t *scales_out);

/*
 * kern_weight_fp8_dequantize - w_out[o,i] = e4m3(codes[o,i]) * 2^(scales[o/32, i/32] - 127),
 * exact (also exactly representable in BF16 for codes from kern_weight_fp8_quantize).
 *
 * codes: [n_out, n_in] E4M3.   scales: [ceil(n_out / 32), ceil(n_in / 32)] UE8M0.
 * w_out: [n_out, n_in] f32, written. All host memory.
 *
 * Errors as kern_weight_fp8_quantize.
 */
tdm_status_t kern_weight_fp8_dequantize(const uint8_t *codes, const uint8_t *scales, int64_t n_out,
                                        int64_t n_in, float *w_out);

/*
 * kern_weight_mxfp4_quantize - MXFP4 expert weight storage: one UE8M0 scale per (row, 32
 * along K), s = 2^ceil2(fl(max(amax, 6 * 2^-126) / 6)), codes E2M1(w / s), packed two per
 * byte (element 2b in the low nibble of byte b). Byte-for-byte the same as Q_mx4 on the rows
 * of w (the floor is Q_mx4's; docs/NUMERICS.md).
 *
 * w:          [n_out, n_in] f32, row-major, host.
 * packed_out: [n_out, n_in / 2] bytes, written.
 * scales_out: [n_out, n_in / 32] UE8M0, written.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (outputs untouched) for a NULL pointer,
 * n_out / n_in <= 0, or n_in not a multiple of 32. Thread-safe; allocates nothing.
 */
tdm_status_t kern_weight_mxfp4_quantize(const float *w, int64_t n_out, int64_t n_in,
                                        uint8_t *packed_out, uint8_t *scales_out);

/*
 * kern_weight_mxfp4_dequantize - w_out[o,i] = e2m1(nibble i of row o) * 2^(scales[o, i/32]
 * - 127), exact.
 *
 * packed: [n_out, n_in / 2].   scales: [n_out, n_in / 32] UE8M0.
 * w_out:  [n_out, n_in] f32, written. All host memory.
 *
 * Errors as kern_weight_mxfp4_quantize.
 */
tdm_status_t kern_weight_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
                                          int64_t n_out, int64_t n_in, float *w_out);

#ifdef __cplusplus
}
#endif

#endif
