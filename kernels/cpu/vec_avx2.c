/* vec_avx2.c - kernels/cpu/vec_isa.h for AVX2 + FMA (vec_body.inc; built with -mavx2 -mfma
 * -ffp-contract=off, run only when kern_cpu_isa() is KERN_ISA_AVX2). */
#if defined(__x86_64__)
#define CPU_SIMD16_AVX2   1
#define CPU_SIMD16_SUFFIX avx2
#include "kernels/cpu/simd16.h"
#include "kernels/cpu/simd16_ext.h"

#include "kernels/cpu/vec_body.inc"
#endif
