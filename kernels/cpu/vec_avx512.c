/* vec_avx512.c - kernels/cpu/vec_isa.h for AVX-512F (vec_body.inc; built with -mavx512f -mfma
 * -ffp-contract=off, run only when kern_cpu_isa() is KERN_ISA_AVX512). */
#if defined(__x86_64__)
#define CPU_SIMD16_AVX512 1
#define CPU_SIMD16_SUFFIX avx512
#include "kernels/cpu/simd16.h"
#include "kernels/cpu/simd16_ext.h"

#include "kernels/cpu/vec_body.inc"
#endif
