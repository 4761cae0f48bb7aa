/* gemm_scalar.c - kern_gemm_cpu in plain C (gemm_body.inc over simd16.h's 16-float lanes): the
 * path of CPUs with none of the vector sets, and of TANDEM_CPU_ISA=scalar. Built with
 * -ffp-contract=off; on x86-64 the file is compiled for the CPU it runs on through
 * target_clones on the entry points, so fmaf is the FMA instruction where the CPU has one (the
 * same bits as the libm call, without a call per multiply-add). */
#define CPU_SIMD16_SCALAR 1
#define CPU_SIMD16_SUFFIX scalar
#define GEMV_OUT          4
#define GEMV_OUT_W        2
#define GEMV_OUT_Q        4
#define TILE_O            2
#define FMA_CHAINS        2
#define GEMVR_OUT         2
#define GEMVR_ROWS        2
#define TILE_R            2
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GB_ENTRY_ATTR __attribute__((target_clones("fma", "default")))
#endif
#include "kernels/cpu/simd16.h"

#include "kernels/cpu/gemm_body.inc"
