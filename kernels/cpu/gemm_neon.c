/* gemm_neon.c - kern_gemm_cpu for aarch64 Advanced SIMD (gemm_body.inc; GB300's Grace hosts).
 * 32 registers and four per 16-lane vector: a 2 x 3 tile (24 registers of accumulators);
 * weight rows per GEMV block: 2 BF16/F32, 4 FP8/MXFP4. Built with -ffp-contract=off. */
#if defined(__aarch64__)
#define CPU_SIMD16_NEON   1
#define CPU_SIMD16_SUFFIX neon
#define GEMV_OUT          4
#define GEMV_OUT_W        2
#define GEMV_OUT_Q        4
#define TILE_O            3
#define FMA_CHAINS        6
#define GEMVR_OUT         2
#define GEMVR_ROWS        3
#define TILE_R            2
#include "kernels/cpu/simd16.h"

#include "kernels/cpu/gemm_body.inc"
#endif
