/* gemm_isa.h - the per-instruction-set halves of kern_gemm_cpu (private to kernels/cpu).
 *
 * cpu_gemm_range_<isa> (one per kernels/cpu/gemm_<isa>.c, all from gemm_body.inc): every row of
 * x [n_rows, n_in] (stride ldx) against outputs [o0, o1) of w, written to y (stride ldy), in the
 * order of kernels/gemm.h; arguments already checked by kern_gemm_cpu. fp8_fold: for up to 16
 * rows of an FP8 matrix, cpu_gemm_fp8_fold(w, x, ldx, n_rows) (computed once per call, not per
 * thread chunk); 0 otherwise. Returns 1, or 0 when a scratch panel could not be allocated (then
 * nothing was written). Thread-safe.
 *
 * cpu_gemm_fp8_fold: for an FP8 matrix w and rows x [n_rows, n_in] (stride ldx), 0 when
 * x * 2^(S - 119) is not exact for some element of x and scale byte S of w (overflow, a result
 * below FP32's normal range, x not finite): the plain order is used. Else fma(w_h, x * s, acc) =
 * fma(w_h * s, x, acc) bit for bit (both products are the same real number and fma rounds once), so
 * the scale can multiply x once per step for all weight rows of a scale block instead of every
 * weight vector (once per call for all 32 weight rows of a block: the few-row path, gemm_body.inc
 * GB_DT_FP8S, and the one-row path, gemm_gemv.inc gemv_fp8_xs): 1, or 2 when x * 2^(S - 7) is
 * exact too (then, in blocks the matrix's clean map marks, the raw decode e4m3 * 2^-120 may take
 * the FP16 decode's place: gemm_gemv.inc). Reads all of x and w's scales; never fails.
 *
 * cpu_dot_<isa>: sum_k a[k] b[k], n a multiple of 16, the same order (kern_dot_cpu).
 * cpu_fma_flops_<isa>: n_iters rounds of independent 16-lane FMA chains on registers; returns
 * the FLOPs done (2 per lane per FMA) - kern_fma_peak_cpu's loop.
 *
 * cpu_gemm_init_avx2, cpu_gemm_init_avx512: fill the set's tables (the MXFP4 scaled products,
 * gemm_mx4p.inc); must run, once, before cpu_gemm_range_<set> (gemm.c's set lookup runs it under
 * pthread_once when it hands the set out). Only on a CPU with that set.
 *
 * Only the sets this build compiles exist (x86-64: scalar, avx2, avx512; aarch64: scalar, neon);
 * kern_cpu_isa() (kernels/cpu_isa.h) says which one the CPU runs.
 */
#ifndef TANDEM_KERNELS_CPU_GEMM_ISA_H
#define TANDEM_KERNELS_CPU_GEMM_ISA_H

#include <stdint.h>

#include "kernels/gemm.h"

/* The most rows of a BF16 or FP8 matrix that take the few-row path (gemm_body.inc GEMVR_MAX_TOTAL;
 * more take panels, which decode each weight once for all rows), and so the most for which
 * kern_gemm_cpu asks cpu_gemm_fp8_fold (measured in gemm_body.inc). */
#define CPU_GEMM_FEW_ROWS_MAX 16

#define CPU_GEMM_ISA_DECLARE(isa)                                                                  \
    int cpu_gemm_range_##isa(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows,     \
                             uint32_t flags, float *y, int64_t ldy, int64_t o0, int64_t o1,        \
                             int fp8_fold);                                                        \
    float cpu_dot_##isa(const float *a, const float *b, int64_t n);                                \
    double cpu_fma_flops_##isa(int64_t n_iters);

int cpu_gemm_fp8_fold(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows);

CPU_GEMM_ISA_DECLARE(scalar)
#if defined(__x86_64__)
CPU_GEMM_ISA_DECLARE(avx2)
CPU_GEMM_ISA_DECLARE(avx512)
void cpu_gemm_init_avx2(void);
void cpu_gemm_init_avx512(void);
#endif
#if defined(__aarch64__)
CPU_GEMM_ISA_DECLARE(neon)
#endif

#endif
