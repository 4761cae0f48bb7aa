/* gemm_avx512.c - kern_gemm_cpu for AVX-512F (gemm_body.inc; built with -mavx512f -mfma
 * -ffp-contract=off, run only when kern_cpu_isa() is KERN_ISA_AVX512). 32 registers: a 6 x 4
 * tile (24 accumulators) for panels and for the few-row path (GEMVR), weight rows per GEMV
 * block: 2 BF16, 1 F32 (1.02-1.05x over 2 on the mHC matrices [24, 2048], Zen 4), 4 FP8/MXFP4.
 * The few-row FP8 path keeps the FP16 decode (GB_FP8_RAW_ROWS 0): the raw one in clean 4-row
 * groups measured 0.96-1.02x here, against 1.02-1.08x on the AVX2 set (docs/BENCHMARKS.md
 * 2026-12-06, fifth session). */
#if defined(__x86_64__)
#define CPU_SIMD16_AVX512 1
#define CPU_SIMD16_SUFFIX avx512
#define GEMV_OUT          4
#define GEMV_OUT_W        2
#define GEMV_OUT_F        1
#define GEMV_OUT_Q        4
#define TILE_O            4
#define FMA_CHAINS        10
#define GEMVR_OUT         4
#define GEMVR_ROWS        6
#define TILE_R            6
#define GB_FP8_RAW_ROWS   0
#include "kernels/cpu/simd16.h"

#include "kernels/cpu/gemm_body.inc"
#endif
