/* vec.c - cpu_vec_ops (kernels/cpu/vec_isa.h): the vector table of kern_cpu_isa(). */
#include "kernels/cpu/vec_isa.h"

#include "kernels/cpu_isa.h"

#include <stddef.h>

const cpu_vec_ops_t *cpu_vec_ops(void)
{
    switch (kern_cpu_isa()) {
#if defined(__x86_64__)
    case KERN_ISA_AVX512:
        return &cpu_vec_ops_avx512;
    case KERN_ISA_AVX2:
        return &cpu_vec_ops_avx2;
#endif
#if defined(__aarch64__)
    case KERN_ISA_NEON:
        return &cpu_vec_ops_neon;
#endif
    default:
        return NULL;
    }
}
