/* vec_neon.c - kernels/cpu/vec_isa.h for aarch64 Advanced SIMD (vec_body.inc; built with
 * -ffp-contract=off; FPCR as Linux leaves it: round to nearest, no flush to zero, NaNs
 * propagated). */
#if defined(__aarch64__)
#define CPU_SIMD16_NEON   1
#define CPU_SIMD16_SUFFIX neon
#include "kernels/cpu/simd16.h"
#include "kernels/cpu/simd16_ext.h"

#include "kernels/cpu/vec_body.inc"
#endif
