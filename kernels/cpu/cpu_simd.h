/* cpu_simd.h - private helpers of the CPU kernels (the kernels/cpu sources): BF16 rounding
 * (kern_bf16_round, kernels/codec.h) inline: round to nearest even on the upper 16 bits, NaN
 * quieted with its sign and top payload kept. The vector paths are kernels/cpu/vec_isa.h (its
 * 16-lane version is v16_bf16_round in simd16_ext.h). Not a public header.
 */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention.h"

/* cpu_bf16_round - kern_bf16_round(x), inlined (FP32 in, the BF16 value as FP32 out). */
static inline float cpu_bf16_round(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        bits |= 0x00400000u; /* quiet NaN */
    } else {
        bits += 0x7FFFu + ((bits >> 16) & 1u);
    }
    bits &= 0xFFFF0000u;
    memcpy(&x, &bits, sizeof(x));
    return x;
}

/* CPU_FMA_CLONES: on x86-64 GCC, a function that calls cpu_exp is compiled twice
 * (target_clones): with FMA where the CPU has it, so fmaf is one instruction instead of a libm
 * call (the bits are the same either way). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define CPU_FMA_CLONES
#endif

/* 2^k for an integer k in [-126, 127], exact. */
static inline float cpu_exp_pow2(int32_t k)
{
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* cpu_exp - kern_exp(x) inlined: the steps kernels/attention.h defines, in that order, each one
 * IEEE-754 single-precision operation (fmaf fused; the kernels are built with -ffp-contract=off).
 * kernels/cpu/vec_body.inc's vb_exp runs the same steps on 16 lanes (the same bits). */
static inline float cpu_exp(float x)
{
    if (x != x) {
        return x;
    }
    float xc = KERN_EXP_LO > x ? KERN_EXP_LO : x;
    xc = xc > KERN_EXP_HI ? KERN_EXP_HI : xc;
    float k = (xc * KERN_EXP_LOG2E + KERN_EXP_ROUND) - KERN_EXP_ROUND;
    float r = fmaf(k, -KERN_EXP_LN2_HI, xc);
    r = fmaf(k, -KERN_EXP_LN2_LO, r);
    float p = fmaf(KERN_EXP_C7, r, KERN_EXP_C6);
    p = fmaf(p, r, KERN_EXP_C5);
    p = fmaf(p, r, KERN_EXP_C4);
    p = fmaf(p, r, KERN_EXP_C3);
    p = fmaf(p, r, KERN_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    float k1 = (k * 0.5f + KERN_EXP_ROUND) - KERN_EXP_ROUND;
    float k2 = k - k1;
    return (p * cpu_exp_pow2((int32_t)k1)) * cpu_exp_pow2((int32_t)k2);
}

/* cpu_lane_tree16 - the fixed reduction tree of the 16-lane order (kernels/gemm.h) over 16 lane
 * sums: lane j += lane j + s for s = 8, 4, 2, 1; returns lane 0 (the lanes are overwritten). The
 * one scalar copy of the tree: the GEMM reference, the softmax denominator and the Engram gate's
 * dot use it (kernels/cpu/simd16.h's v16_reduce is its vector form). */
static inline float cpu_lane_tree16(float lane[16])
{
    for (int s = 8; s >= 1; s /= 2) {
        for (int j = 0; j < s; j++) {
            lane[j] = lane[j] + lane[j + s];
        }
    }
    return lane[0];
}

/* cpu_log1p - kern_log1p(t) inlined: the steps kernels/attention.h defines, in that order. */
static inline float cpu_log1p(float t)
{
    float s = t / (2.0f + t);
    float u = s * s;
    float p = fmaf(KERN_LOG1P_C15, u, KERN_LOG1P_C13);
    p = fmaf(p, u, KERN_LOG1P_C11);
    p = fmaf(p, u, KERN_LOG1P_C9);
    p = fmaf(p, u, KERN_LOG1P_C7);
    p = fmaf(p, u, KERN_LOG1P_C5);
    p = fmaf(p, u, KERN_LOG1P_C3);
    p = fmaf(p, u, 1.0f);
    return (2.0f * s) * p;
}

/* cpu_sigmoid - 1 / (1 + kern_exp(-z)): the sigmoid of the mHC coefficients and the Engram gate
 * (kernels/mhc.h), the same bits on every backend. */
static inline float cpu_sigmoid(float z)
{
    return 1.0f / (1.0f + cpu_exp(-z));
}

#endif
