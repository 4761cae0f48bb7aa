/* cpu_isa.h - which vector instruction set the CPU kernels use (chosen at run time).
 *
 * Every CPU kernel has a plain-C definition (the scalar reference) and vector versions for
 * AVX2+FMA (x86-64-v3), AVX-512F and NEON (aarch64, e.g. GB300's Grace hosts). All versions give
 * identical bits: each kernel's summation order is a definition over 16 lanes, not a register
 * width (kernels/gemm.h), so one AVX-512 register, two AVX2 registers or four NEON registers hold
 * the same 16 partial sums. The choice therefore changes speed only.
 *
 * The default is the widest set the CPU runs. TANDEM_CPU_ISA (scalar, avx2, avx512, neon) caps
 * it at start-up, and kern_cpu_isa_set() at run time (tests run every kernel under each set the
 * CPU has and compare the bits).
 */
#ifndef TANDEM_KERNELS_CPU_ISA_H
#define TANDEM_KERNELS_CPU_ISA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"

/* Instruction sets of the CPU kernels, narrowest first. */
typedef enum {
    KERN_ISA_SCALAR = 0, /* plain C (the reference; fmaf inlined where the CPU has FMA) */
    KERN_ISA_AVX2 = 1,   /* x86-64 AVX2 + FMA: a 16-lane vector is two 8-lane registers */
    KERN_ISA_AVX512 = 2, /* x86-64 AVX-512F: one 16-lane register */
    KERN_ISA_NEON = 3,   /* aarch64 Advanced SIMD: four 4-lane registers */
    KERN_ISA_COUNT = 4,
} kern_cpu_isa_t;

/* kern_cpu_isa_name - "scalar", "avx2", "avx512" or "neon"; "?" for other values. */
const char *kern_cpu_isa_name(kern_cpu_isa_t isa);

/* kern_cpu_isa_supported - 1 when this build and this CPU run `isa`, else 0. */
int kern_cpu_isa_supported(kern_cpu_isa_t isa);

/*
 * kern_cpu_isa - the set the kernels use now: kern_cpu_isa_set's choice, else TANDEM_CPU_ISA's
 * (read once; an unknown or unsupported name logs a warning and is ignored), else the widest
 * supported. Thread-safe (an atomic load).
 */
kern_cpu_isa_t kern_cpu_isa(void);

/*
 * kern_cpu_isa_set - use `isa` from now on (tests, benchmarks). Returns TDM_OK, or
 * TDM_ERR_UNSUPPORTED (nothing changed) when kern_cpu_isa_supported(isa) is 0. Calls running
 * on other threads finish with the set they started with.
 */
tdm_status_t kern_cpu_isa_set(kern_cpu_isa_t isa);

/* kern_cpu_isa_parse - name ("scalar", "avx2", "avx512", "neon") -> isa; TDM_ERR_INVALID_ARG
 * for anything else (isa_out untouched). */
tdm_status_t kern_cpu_isa_parse(const char *name, kern_cpu_isa_t *isa_out);

#ifdef __cplusplus
}
#endif

#endif
