/* gemm_neon.c - kern_gemm_cpu for aarch64 Advanced SIMD (gemm_body.inc; GB300's Grace hosts).
 * 32 registers and four per 16-lane vector: a 2 x 3 tile (24 registers of accumulators), 4
 * weight rows per GEMV block. Built with -ffp-contract=off. */
#if defined(__aarch64__)
#define CPU_SIMD16_NEON   1
#define CPU_SIMD16_SUFFIX neon
#define GEMV_OUT          4
#define TILE_O            3
#define FMA_CHAINS        6
#define GEMVR_OUT         2
#define GEMVR_ROWS        3
#define TILE_R            2
#include "kernels/cpu/simd16.h"

#include "kernels/cpu/gemm_body.inc"
#endif
