/* gemm_avx2.c - kern_gemm_cpu for AVX2 + FMA (x86-64-v3; gemm_body.inc; built with -mavx2 -mfma
 * -ffp-contract=off, run only when kern_cpu_isa() is KERN_ISA_AVX2). 16 registers and two per
 * 16-lane vector: a 3 x 2 tile (12 registers of accumulators), for FP8/MXFP4 weights in the
 * few-row path 6 x 1 (12: each weight row decoded once per up to 6 rows; over 4 x 1, FP8 at 12
 * and 16 rows 1.12-1.38x, 2-8 rows and MXFP4 unchanged, engine batch 16 1.02-1.03x, Zen 4 EPYC,
 * docs/BENCHMARKS.md 2026-12-05 evening); weight rows per GEMV block: 2 BF16, 1 F32 (1.15-1.27x
 * over 2 on the mHC matrices [24, 2048], Zen 4), 4 FP8/MXFP4; MXFP4 decoded through BF16 byte
 * lookups in a lane order of their own (gemm_mx4p.inc). The few-row FP8 path decodes clean 4-row
 * groups raw (GB_FP8_RAW_ROWS, gemm_body.inc gemv_rows_fp8s: 1.02-1.08x on the attention
 * projections at 4 and 16 rows, docs/BENCHMARKS.md 2026-12-06, fifth session). */
#if defined(__x86_64__)
#define CPU_SIMD16_AVX2   1
#define CPU_SIMD16_SUFFIX avx2
#define GEMV_OUT          4
#define GEMV_OUT_W        2
#define GEMV_OUT_F        1
#define GEMV_OUT_Q        4
#define TILE_O            2
#define FMA_CHAINS        6
#define GEMVR_OUT         2
#define GEMVR_ROWS        3
#define GEMVR_QOUT        1
#define GEMVR_QROWS       6
#define TILE_R            3
#include "kernels/cpu/simd16.h"

#include "kernels/cpu/gemm_body.inc"
#endif
